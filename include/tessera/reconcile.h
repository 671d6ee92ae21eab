// Reconciliation: explain the difference between a ledger's prediction and what an engine
// really allocated, term by term.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/geometry.h"
#include "tessera/ledger.h"
#include "tessera/status.h"

namespace tessera {

struct Attribution {
  std::string term;
  int64_t bytes = 0;  // > 0: the observation holds this and the prediction does not; < 0: the reverse
  // Set when an allocation trace labels allocations with this term's name (the sign dropped and,
  // for tp_mismatch(tp=N), the parenthesis): the trace's bytes under that label. Such a term is
  // always among the attributed.
  std::optional<uint64_t> trace_bytes;
};

// An allocation trace: its total and the bytes under each label ("" for unlabelled lines), in
// the order labels first appear.
struct TraceLabel {
  std::string label;
  uint64_t bytes = 0;
};
struct AllocationTrace {
  uint64_t total = 0;
  std::vector<TraceLabel> labels;
};

struct Reconciliation {
  std::string scope;  // "per rank" or "all ranks"
  uint64_t predicted_bytes = 0;
  uint64_t observed_bytes = 0;
  int64_t difference_bytes = 0;  // observed - predicted
  std::vector<Attribution> attributed;
  int64_t unexplained_bytes = 0;  // difference - sum(attributed)
};

// Attributes observed - predicted to the smallest set of named terms that explains it exactly;
// otherwise to the closest set, the rest reported as unexplained. `all_ranks` compares against
// committed_bytes_all_ranks. The terms, each with its size for this ledger:
// - "-<ledger term>": a term the prediction holds that the engine may lack (block_metadata, ...);
// - "+/-mtp_layers": the MTP layer(s) held or not;
// - "+/-other_ranks": tensor-parallel replication (an observation summed over ranks, or of one);
// and the ledger guide's failure probes:
// - "+/-expanded_kv": the engine cached the expanded per-head K and V (bf16) instead of the latent;
// - "-quantization_scales": the engine's records lack the scale regions of the record format;
// - "+/-tp_mismatch(tp=N)": the engine ran at another tensor-parallel size (MHA/GQA heads shard;
//   an MLA latent is replicated, so it shows only over all ranks);
// - "+/-generic_kernel_fallback": pages of a generic kernel (vLLM and SGLang: Triton MLA's
//   16-token blocks; Tessera: --kernel generic) instead of the chosen kernel's.
// `labels` (from an allocation trace) force the terms they name into the attribution.
Result<Reconciliation> Reconcile(const Geometry& g, const Ledger& ledger, uint64_t observed_bytes, bool all_ranks,
                                 const std::vector<TraceLabel>& labels = {});

// Reads an allocation trace: one allocation per line, "<bytes> [label...]"; blank lines and
// lines starting with '#' are skipped. Returns the total. Errors name "trace" and the line.
Result<uint64_t> ReadAllocationTrace(const std::string& path);
// The same, with the bytes under each label (the rest of the line, trimmed).
Result<AllocationTrace> ReadLabelledAllocationTrace(const std::string& path);

}  // namespace tessera

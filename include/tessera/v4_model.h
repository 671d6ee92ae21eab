// tiny-v4: the tiny DeepSeek-V4-architecture model of ADR 0018 — its config, seeded weights, the
// safetensors weight file, and a runner whose KV cache is a RequestManager (window rings and
// compressor rows in its state component, compressed entries in its pages).
//
// The forward is ADR 0018's, in fp32; attention is v4_attention.h's reference decode. A token is
// computed layer by layer before it is appended: each layer attends to the window rows and
// entries in the manager plus the token's own, pending, rows (V4Pending); then Append writes
// exactly those bytes (the entries rebuilt by the Compressor callback from the manager's rows,
// which are the rows the pending entry was built from). A token's logits therefore depend on
// earlier tokens only through the manager's bytes.
//
// Thread-safety: a TinyV4Runner has a single owner.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/attention.h"
#include "tessera/geometry.h"
#include "tessera/model.h"
#include "tessera/request_manager.h"
#include "tessera/status.h"
#include "tessera/v4_attention.h"

namespace tessera {

struct TinyV4Config {
  std::string name;
  Geometry geometry;
  V4Dims dims;
  uint32_t layers = 0, hidden = 0, q_lora = 0, o_groups = 0, o_lora = 0, vocab = 0, ffn = 0;
  std::vector<uint32_t> ratios;  // per layer: 0 SWA, 4 CSA, else HCA
  float rms_eps = 1e-6f;
  double rope_theta = 0, compress_rope_theta = 0;
  double theta(uint32_t layer) const { return ratios[layer] == 0 ? rope_theta : compress_rope_theta; }
};

// Reads the preset `model` ("tiny-v4"). Errors: kNotFound on "model" for another name;
// kInvalidArgument naming the field the forward cannot run with ("rope_scaling", "o_groups" not
// dividing the heads, "index_head_dim" not 128, "num_nextn_predict_layers" not 0, ...).
Result<TinyV4Config> LoadTinyV4Config(std::string_view model);

// tiny-v4's tensors and weights are the tiny models' (model.h: one weight-file format, one reader).
using V4TensorSpec = TensorSpec;
// Every tensor, in generation and file order (ADR 0018).
std::vector<V4TensorSpec> TinyV4WeightSpecs(const TinyV4Config& c);

using TinyV4Weights = Weights;

// SplitMix64 from `seed`, one stream over TinyV4WeightSpecs order (ADR 0017's draws, ADR 0018's
// scales).
TinyV4Weights GenerateTinyV4Weights(const TinyV4Config& c, uint64_t seed);
Result<std::string> SerializeTinyV4Weights(const TinyV4Config& c, const TinyV4Weights& w);
// Validates everything: header length and JSON, __metadata__ (model, seed, format), each tensor
// of the specs present as F32 with its shape and no other, offsets tiling the data, the file
// exactly that long, finite values. Errors: kInvalidArgument on "weights" naming the tensor/field.
Result<TinyV4Weights> ParseTinyV4Weights(std::string_view bytes, const TinyV4Config& c);
Status WriteTinyV4WeightsFile(const std::string& path, const TinyV4Config& c, const TinyV4Weights& w);
Result<TinyV4Weights> ReadTinyV4WeightsFile(const std::string& path, const TinyV4Config& c);

struct TinyV4Options {
  SwaStrategy window_strategy = SwaStrategy::kSnapshot;
  uint32_t capacity_blocks = 16;
  std::string indexer_format = "indexer-mxfp4";  // or indexer-fp8
};

struct TinyV4Generation {
  std::vector<uint32_t> tokens;  // prompt, then generated
  uint64_t prompt_len = 0;
  std::vector<std::vector<float>> logits;  // logits[i]: at position prompt_len - 1 + i
  uint64_t cached_tokens = 0;
  bool state_restored = false;
  AttentionCounters counters;    // every attention call
  AttentionCounters last_token;  // the last computed token's
  // The compressed entries each computed position attended, per layer: selected[p][l] for fed
  // positions p (prompt positions served from the cache are empty); empty for SWA layers, every
  // complete entry for HCA, the indexer's top-k (ascending) for CSA.
  std::vector<std::vector<std::vector<uint64_t>>> selected;
};

class TinyV4Runner {
 public:
  // Errors: the manager's ("kv-format", "indexer-format", "swa-strategy", ...); "weights" when a
  // tensor is missing or mis-sized.
  static Result<std::unique_ptr<TinyV4Runner>> Create(TinyV4Config config, TinyV4Weights weights,
                                                      const TinyV4Options& options);
  ~TinyV4Runner();
  RequestManager& manager() { return *manager_; }
  const TinyV4Config& config() const { return config_; }

  // Admits `prompt` (a prefix hit resumes from the restored window state, or, under recompute,
  // rebuilds the rings from the forward over the last W + (L-1)(W-1) cached tokens: ADR 0018),
  // computes the uncached prompt tokens and `steps` greedy decode tokens (the last not fed). The
  // request is kept until the next Generate or Release.
  // `after_prefill` (may be empty) runs once the prompt is in pages and rings, before decoding.
  Result<TinyV4Generation> Generate(std::span<const uint32_t> prompt, uint32_t steps,
                                    const std::function<Status(RequestId)>& after_prefill = {});
  Status Release();
  std::optional<RequestId> request() const { return request_; }

  // The forward of `token` at the request's next position (slots already allocated): logits
  // (vocab floats), then Append.
  Status Step(RequestId r, uint32_t token, std::span<float> logits, AttentionCounters* counters);

 private:
  TinyV4Runner() = default;
  struct Scratch;
  // The forward of `token` at position p; with `scratch`, rebuilding rings (rows kept in it, no
  // pending entries, no logits).
  Status Forward(RequestId r, uint64_t p, uint32_t token, Scratch* scratch, std::span<float> logits,
                 AttentionCounters* counters);
  // Forward's layer l: the token's window row, compressor rows and entries (pending in the pages,
  // or kept in `scratch`), attention, the grouped output projection and the FFN, added into h.
  Status Layer(RequestId r, uint64_t p, uint32_t l, Scratch* scratch, std::span<float> h, AttentionCounters* counters);
  // Layer l's pages as of position p: the manager's, or (scratch) the scratch's local window rows.
  Result<V4PagedLayer> Bind(RequestId r, uint64_t p, uint32_t l, Scratch* scratch);
  // The token's compressor row (main or the indexer's) and, when it completes a group, the
  // entry's record bytes (nothing with `scratch`).
  Status Compress(uint64_t p, uint32_t l, bool indexer, std::span<const float> x, const V4PagedLayer& pages,
                  Scratch* scratch, std::vector<float>& row, std::vector<std::byte>& bytes);
  // The entries layer l attends: none (SWA), every complete one (HCA), the indexer's top-k (CSA).
  Status Select(uint64_t p, uint32_t l, std::span<const float> x, std::span<const float> qr, const V4PagedLayer& pages,
                std::vector<uint64_t>* selected, AttentionCounters* counters);
  // Appends the token: writers copy the pending rows; entries are rebuilt from the manager's rows.
  Status AppendToken(RequestId r, uint32_t token);
  Status RebuildRings(const Admission& a, std::span<const uint32_t> prompt);
  TinyV4Config config_;
  TinyV4Weights weights_;
  TinyV4Options options_;
  std::unique_ptr<RequestManager> manager_;
  std::optional<RequestId> request_;
  // The token being appended: per layer its window row and compressor rows.
  std::vector<std::vector<std::byte>> pending_rows_;
  std::vector<std::vector<float>> pending_state_, pending_istate_;
  // Per layer, the entries the last Step attended (what Generate reports as `selected`).
  std::vector<std::vector<uint64_t>> last_selected_;
};

// What `tessera generate --model tiny-v4` runs (the CLI parses its options into this): the weights
// are read from `weights_path`, or, with `init_weights`, generated from `seed` and written there
// first; the pool holds the whole run (nothing is evicted). Errors name the field: "weights",
// "prompt", "steps", the manager's.
struct TinyV4Run {
  std::string weights_path;
  bool init_weights = false;
  uint64_t seed = 0;
  std::vector<uint32_t> prompt;
  uint32_t steps = 0;
  TinyV4Options options;
  // Runs once the prompt is in pages and rings, before decoding (e.g. to perturb a page byte).
  std::function<Status(TinyV4Runner&, RequestId)> after_prefill;
};
Result<TinyV4Generation> RunTinyV4(const TinyV4Run& run);

}  // namespace tessera

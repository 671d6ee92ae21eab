#include "tessera/ledger.h"

#include <algorithm>
#include <memory>
#include <string>

#include "engine_profile.h"
#include "tessera/checked.h"

namespace tessera {

std::string_view EngineName(Engine engine) {
  switch (engine) {
    case Engine::kTessera:
      return "tessera";
    case Engine::kVllm:
      return "vllm";
    case Engine::kSglang:
      return "sglang";
  }
  return "?";
}

Result<Engine> ParseEngine(std::string_view name) {
  if (name == "tessera") return Engine::kTessera;
  if (name == "vllm") return Engine::kVllm;
  if (name == "sglang") return Engine::kSglang;
  return InvalidArgument("engine", "unknown engine \"" + std::string(name) + "\" (known: tessera, vllm, sglang)");
}

const CacheLine* Ledger::FindLine(std::string_view name) const {
  for (const CacheLine& l : lines) {
    if (l.name == name) return &l;
  }
  return nullptr;
}

const LayerKindSummary* Ledger::FindKind(LayerKind kind) const {
  for (const LayerKindSummary& k : kinds) {
    if (k.kind == kind) return &k;
  }
  return nullptr;
}

uint64_t Ledger::TermBytes(LedgerTerm term) const {
  for (const Term& t : terms) {
    if (t.term == term) return t.bytes;
  }
  return 0;
}

std::string_view LedgerTermName(LedgerTerm term) {
  switch (term) {
    case LedgerTerm::kRecords:
      return "records";
    case LedgerTerm::kPageRounding:
      return "page_rounding";
    case LedgerTerm::kAlignmentPadding:
      return "alignment_padding";
    case LedgerTerm::kRingCapacity:
      return "ring_capacity";
    case LedgerTerm::kSpeculativeSlots:
      return "speculative_slots";
    case LedgerTerm::kBlockMetadata:
      return "block_metadata";
    case LedgerTerm::kBoundaryState:
      return "boundary_state";
    case LedgerTerm::kUniformBlockPadding:
      return "uniform_block_padding";
  }
  return "?";
}

std::string_view LedgerPhaseName(LedgerPhase phase) {
  switch (phase) {
    case LedgerPhase::kAdmission:
      return "admission";
    case LedgerPhase::kPrefillPeak:
      return "prefill_peak";
    case LedgerPhase::kDecode:
      return "decode";
  }
  return "?";
}

namespace {

using detail::Entries;
using detail::LayoutOptionsOf;

std::string Grouped(uint64_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

Status ValidateOptions(const LedgerOptions& o) {
  if (o.context_tokens == 0) return InvalidArgument("context", "must be a positive token count");
  if (o.batch == 0) return InvalidArgument("batch", "must be positive");
  if (o.tp == 0) return InvalidArgument("tp", "must be positive");
  if (o.dcp == 0) return InvalidArgument("dcp", "must be positive");
  if (o.tp % o.dcp != 0) {
    return InvalidArgument("dcp", std::to_string(o.dcp) + " must divide tp " + std::to_string(o.tp) +
                                      " (decode-context-parallel ranks are carved out of the tensor-parallel ranks)");
  }
  if (o.spec_tokens > 1024) return InvalidArgument("spec-tokens", "at most 1024 draft tokens per step");
  // Engines count the context plus the draft tokens of a step, and round it up to whole blocks.
  if (o.context_tokens > (uint64_t{1} << 62)) {
    return OutOfRange("context", std::to_string(o.context_tokens) + " tokens is beyond 2^62");
  }
  if (o.max_model_len) {
    if (o.engine == Engine::kTessera) {
      return InvalidArgument("max-model-len", "engine tessera has no maximum model length (vllm and sglang do)");
    }
    if (*o.max_model_len == 0) return InvalidArgument("max-model-len", "must be a positive token count");
    if (o.context_tokens > *o.max_model_len) {
      return OutOfRange("max-model-len", "context " + Grouped(o.context_tokens) + " tokens exceeds --max-model-len " +
                                             Grouped(*o.max_model_len) + "; " + std::string(EngineName(o.engine)) +
                                             " refuses such a request");
    }
  }
  // The KV heads a rank holds: MapCaches checks them next (CheckTensorParallel).
  return Status::Ok();
}

// The note a context past the model's trained positions carries (ADR 0034); empty within them.
std::string LimitNote(const Geometry& g, const LedgerOptions& o) {
  const uint64_t max_pos = g.max_position_embeddings;
  if (max_pos == 0 || o.context_tokens <= max_pos) return {};
  std::string note = "context " + Grouped(o.context_tokens) + " tokens exceeds the model's max_position_embeddings " +
                     Grouped(max_pos) + ": priced as asked, but positions past it were not trained";
  if (o.engine == Engine::kVllm) {
    note += o.max_model_len ? "; vLLM starts with --max-model-len " + Grouped(*o.max_model_len) +
                                  " past the config only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
                            : "; vLLM refuses it unless --max-model-len is raised (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1), "
                              "priced here as max-model-len = context";
  } else if (o.engine == Engine::kSglang) {
    note += "; SGLang refuses it unless --context-length is raised (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1)";
  }
  return note;
}

// The formula of a line's requested bytes per request (ADR 0033).
std::string FormulaOf(const CacheLine& line, const CacheLineSpec& spec, const Geometry& g) {
  const std::string per =
      Grouped(line.record_bytes) + " B x " + std::to_string(line.layers) + (line.layers == 1 ? " layer" : " layers");
  switch (line.role) {
    case CacheRole::kKv:
    case CacheRole::kLatent:
    case CacheRole::kIndexer:
    case CacheRole::kCompressed:
      return line.compress_ratio > 1 ? "floor(tokens / " + std::to_string(line.compress_ratio) + ") x " + per
                                     : "tokens x " + per;
    case CacheRole::kWindow:
      return "min(tokens, " + std::to_string(line.slots) + ") x " + per + " (a " + std::to_string(line.slots) +
             "-token window)";
    case CacheRole::kCompressorState:
    case CacheRole::kIndexerCompressorState:
      return "min(tokens, " + std::to_string(line.slots) + ") x " + per + " (a " + std::to_string(line.slots) +
             "-slot compressor ring)";
    case CacheRole::kLinearState:
      break;
  }
  std::string rule;
  for (const LayerSpec& l : g.layers) {
    if (!spec.model_layers.empty() && l.index == spec.model_layers.front()) rule = l.linear.rule;
  }
  return per + ", constant per request (linear-attention state: " + rule + ")";
}

// A ledger line from the layout's: the structure, and the per-token figures of the whole model
// (not per rank).
CacheLine LineOf(const CacheLineSpec& spec, const Geometry& g) {
  CacheLine line;
  line.name = spec.name;
  line.layer_kind = spec.layer_kind;
  line.role = spec.role;
  line.mtp = spec.mtp;
  line.layers = static_cast<uint32_t>(spec.model_layers.size());
  line.format = spec.format;
  line.record_bytes = spec.record_bytes;
  line.grows = IsPaged(spec.role);
  line.compress_ratio = spec.compress_ratio;
  line.slots = spec.slots;
  line.kv = spec.kv;
  line.bytes_per_token_per_layer =
      line.grows ? Fraction(line.record_bytes, line.compress_ratio) : Fraction::Integer(line.record_bytes);
  line.formula = FormulaOf(line, spec, g);
  return line;
}

// Shape of one cache line's tensor for the whole batch.
void FillShape(CacheLine& line, const Geometry& g, uint64_t batch, uint64_t tokens) {
  uint64_t entries = line.grows ? Entries(tokens, line.compress_ratio).value() : std::min<uint64_t>(tokens, line.slots);
  const KvDims kv = line.kv.kv_heads > 0 ? line.kv : KvDims{g.mha_heads(), g.mha_head_dim(), g.mha_head_dim()};
  if ((line.role == CacheRole::kKv || (line.role == CacheRole::kWindow && line.kv.kv_heads > 0)) &&
      line.format.single_element_type() && line.format.regions.size() == 2 && kv.k_head_dim == kv.v_head_dim) {
    line.shape = {line.layers, batch, entries, 2, kv.kv_heads, kv.k_head_dim};
    line.shape_unit = "elements";
    return;
  }
  if (line.format.single_element_type()) {
    line.shape = {line.layers, batch, entries, line.format.element_count()};
    line.shape_unit = "elements";
  } else {
    line.shape = {line.layers, batch, entries, line.format.record_bytes()};
    line.shape_unit = "bytes";
  }
}

// Entries one generated token reads from a line (one sequence, one rank): dense MLA/MHA every
// cached token; DSA (V3.2) the top-k records and an indexer scan of every token; CSA the top-k
// compressed entries, HCA every compressed entry; the window ring; a linear-attention state
// whole; compressor state is not read.
uint64_t ReadEntries(const CacheLine& line, const Geometry& g, uint64_t n) {
  switch (line.role) {
    case CacheRole::kKv:
      return n;
    case CacheRole::kLatent:
      return line.layer_kind == LayerKind::kMlaSparse ? std::min<uint64_t>(n, g.index_topk) : n;
    case CacheRole::kCompressed: {
      uint64_t e = Entries(n, line.compress_ratio).value();
      return line.layer_kind == LayerKind::kCsa ? std::min<uint64_t>(e, g.index_topk) : e;
    }
    case CacheRole::kIndexer:
      return Entries(n, line.compress_ratio).value();
    case CacheRole::kWindow:
      return std::min<uint64_t>(n, line.slots);
    case CacheRole::kCompressorState:
    case CacheRole::kIndexerCompressorState:
      return 0;
    case CacheRole::kLinearState:
      return line.slots;  // the state is read (and rewritten) whole for every token
  }
  return 0;
}

// A per-request figure for the whole batch; errors name the input that drove it past 64 bits.
Result<uint64_t> ForBatch(Checked per_request, uint64_t batch, std::string_view what) {
  if (per_request.overflowed()) return OutOfRange("context", std::string(what) + " overflows 64 bits");
  Checked total = per_request * batch;
  if (total.overflowed()) return OutOfRange("batch", std::string(what) + " overflows 64 bits at this batch");
  return total.value();
}

// What each window-persistence strategy costs per cached block boundary (models with windows),
// whatever the engine.
Status ReportWindowStrategies(Ledger& ledger) {
  TESSERA_ASSIGN_OR_RETURN(detail::BoundaryBytes b, detail::WindowBoundaryBytes(ledger.lines));
  if (b.window_tokens == 0) return Status::Ok();
  ledger.swa_strategies = {
      {SwaStrategy::kRecompute, 0, 0, b.window_tokens},
      {SwaStrategy::kSnapshot, b.window + b.compressor, b.window + b.compressor, 0},
      {SwaStrategy::kRetain, b.window + b.compressor, b.compressor, 0},
  };
  return Status::Ok();
}

// The engine's per-rank figures as the ledger's totals, phases and terms. Returns the busiest
// rank's cost (its lines' figures go to the ledger's lines).
Result<detail::RankCost> PriceRanks(const detail::EngineProfile& profile, const LedgerOptions& o, Ledger& ledger) {
  // Decode context parallelism interleaves tokens over dcp ranks: the busiest holds the rounding.
  ledger.tokens_per_rank = o.context_tokens / o.dcp + (o.context_tokens % o.dcp > 0 ? 1 : 0);
  const uint64_t n = ledger.tokens_per_rank;
  detail::RankCost busiest = profile.CostPerRank(ledger, n);
  TESSERA_ASSIGN_OR_RETURN(ledger.committed_bytes, ForBatch(busiest.committed, o.batch, "committed bytes"));
  TESSERA_ASSIGN_OR_RETURN(uint64_t admission, ForBatch(profile.Admission(ledger, n), o.batch, "reserved bytes"));
  ledger.reserved_at_admission_bytes = admission;
  Checked all_ranks = profile.AllRanks(ledger, busiest);
  if (all_ranks.overflowed()) return OutOfRange("tp", "committed bytes over all ranks overflow 64 bits");
  TESSERA_ASSIGN_OR_RETURN(ledger.committed_bytes_all_ranks,
                           ForBatch(all_ranks, o.batch, "committed bytes over all ranks"));
  TESSERA_ASSIGN_OR_RETURN(uint64_t prefill, ForBatch(profile.PrefillPeak(ledger, n), o.batch, "prefill bytes"));
  ledger.phases = {{LedgerPhase::kAdmission, admission},
                   {LedgerPhase::kPrefillPeak, prefill},
                   {LedgerPhase::kDecode, ledger.committed_bytes}};
  if (!ledger.swa_strategies.empty()) ledger.cached_boundaries = n / ledger.block_tokens;
  for (const auto& [term, bytes] : busiest.terms) {
    TESSERA_ASSIGN_OR_RETURN(uint64_t b, ForBatch(bytes, o.batch, LedgerTermName(term)));
    ledger.terms.push_back({term, b});
  }
  return busiest;
}

// Per line: committed bytes and their terms (the busiest rank's), and bytes read per token.
Status PriceLines(const Geometry& g, const LedgerOptions& o, const detail::RankCost& busiest, Ledger& ledger) {
  Checked read(0);
  for (size_t i = 0; i < ledger.lines.size(); ++i) {
    CacheLine& line = ledger.lines[i];
    TESSERA_ASSIGN_OR_RETURN(line.committed_bytes, ForBatch(busiest.lines[i].committed, o.batch, "committed bytes"));
    for (const auto& [term, bytes] : busiest.lines[i].terms) {
      TESSERA_ASSIGN_OR_RETURN(uint64_t b, ForBatch(bytes, o.batch, LedgerTermName(term)));
      if (b > 0 || term == LedgerTerm::kRecords) line.terms.push_back({term, b});
    }
    Checked r = Checked(ReadEntries(line, g, ledger.tokens_per_rank)) * line.format.record_bytes() * line.layers;
    line.read_bytes_per_token = r.value();
    read += r;
  }
  if (read.overflowed()) return OutOfRange("context", "read bytes overflow 64 bits");
  ledger.read_bytes_per_token = read.value();
  Checked read_all = read * o.tp;
  if (read_all.overflowed()) return OutOfRange("tp", "read bytes over all ranks overflow 64 bits");
  ledger.read_bytes_per_token_all_ranks = read_all.value();
  return Status::Ok();
}

// Requested bytes (logical, whole request, every rank's share together) and tensor shapes.
Status PriceRequested(const Geometry& g, const LedgerOptions& o, Ledger& ledger) {
  Checked requested(0);
  for (CacheLine& line : ledger.lines) {
    Checked entries = line.grows ? Entries(o.context_tokens, line.compress_ratio)
                                 : Checked(std::min<uint64_t>(o.context_tokens, line.slots));
    Checked line_requested = entries * line.record_bytes * line.layers * o.batch;
    if (line_requested.overflowed()) {
      Checked one = entries * line.record_bytes * line.layers;
      return OutOfRange(one.overflowed() ? "context" : "batch",
                        "requested bytes of " + line.name + " overflow 64 bits at this size");
    }
    line.requested_bytes = line_requested.value();
    requested += line_requested;
    FillShape(line, g, o.batch, o.context_tokens);
  }
  if (requested.overflowed()) return OutOfRange("batch", "requested bytes overflow 64 bits");
  ledger.requested_bytes = requested.value();
  return Status::Ok();
}

// The MHA-equivalent baseline: K and V, bf16: heads x (K + V widths) x 2 B (MLA: 2 x query
// heads x v_head_dim x 2 B), each factor from the config, for every token of every counted layer.
Status PriceMhaBaseline(const Geometry& g, const LedgerOptions& o, Ledger& ledger) {
  const uint32_t k_dim = g.is_mla ? g.mha_head_dim() : g.head_dim;
  Checked mha_record = Checked(g.mha_heads()) * (Checked(k_dim) + g.mha_head_dim()) * 2;
  if (mha_record.overflowed()) {
    return OutOfRange("head_dim", "the MHA-equivalent record (2 x heads x head_dim x 2 B) overflows 64 bits");
  }
  ledger.mha_bytes_per_token_per_layer = mha_record.value();
  Checked mha = Checked(ledger.mha_bytes_per_token_per_layer) * o.context_tokens * ledger.layers_counted;
  if (mha.overflowed()) return OutOfRange("context", "MHA-equivalent bytes overflow 64 bits");
  mha = mha * o.batch;
  if (mha.overflowed()) return OutOfRange("batch", "MHA-equivalent bytes overflow 64 bits");
  ledger.mha_equivalent_bytes = mha.value();
  if (ledger.requested_bytes > 0) ledger.mha_ratio = Fraction(ledger.mha_equivalent_bytes, ledger.requested_bytes);
  return Status::Ok();
}

// Per-layer-kind summaries.
Status SummarizeKinds(const Geometry& g, const LedgerOptions& o, Ledger& ledger) {
  for (const CacheLine& line : ledger.lines) {
    LayerKindSummary* s = nullptr;
    for (LayerKindSummary& k : ledger.kinds) {
      if (k.kind == line.layer_kind) s = &k;
    }
    if (s == nullptr) {
      ledger.kinds.push_back({line.layer_kind, g.CountLayers(line.layer_kind, o.include_mtp), Fraction(), 0, 0});
      s = &ledger.kinds.back();
    }
    // Lines of one kind hold the same layers (MTP lines are a kind's extra layers): sum per
    // layer over the main (non-MTP) lines so that the figure is per layer.
    if (line.mtp && g.CountLayers(line.layer_kind, false) > 0) continue;
    if (line.grows) {
      s->paged_bytes_per_token = s->paged_bytes_per_token + line.bytes_per_token_per_layer;
    } else {
      // Per layer, so at most what the whole line's requested bytes were (checked above).
      Checked state = Checked(s->state_bytes) + Checked(line.format.record_bytes()) * line.slots;
      if (state.overflowed()) return OutOfRange("sliding_window", "per-layer state bytes overflow 64 bits");
      s->state_bytes = state.value();
      if (line.role == CacheRole::kWindow) s->window_bytes_per_token = line.bytes_per_token_per_layer.num();
    }
  }
  return Status::Ok();
}

}  // namespace

// What a sweep plans once. The profile keeps references to `options` and `caches`: a State is
// never moved (the sweep holds it by pointer).
struct LedgerSweep::State {
  State(const Geometry& geometry, const LedgerOptions& o) : g(geometry), options(o) {}
  const Geometry& g;
  LedgerOptions options;  // context_tokens: the context being priced
  CacheMap caches;
  Ledger ledger;  // planned; Price overwrites every figure that depends on the context
  std::unique_ptr<detail::EngineProfile> profile;
  Status planned;            // validating the options (but the context), mapping the caches, planning
  Status kinds;              // SummarizeKinds (context-independent, but ComputeLedger reports it last)
  size_t planned_notes = 0;  // the notes that do not depend on the context
};

LedgerSweep::LedgerSweep(const Geometry& g, const LedgerOptions& options) : s_(std::make_unique<State>(g, options)) {
  State& s = *s_;
  // Every check but the context's: ComputeLedger makes them all before any other step. The
  // profile is planned with the options as given (a profile that read the context in Plan would
  // then differ from ComputeLedger in tests/ledger_sweep_test.cc, whose sweeps start at 0).
  LedgerOptions checked = s.options;
  checked.context_tokens = 1;
  s.planned = ValidateOptions(checked);
  if (!s.planned.ok()) return;
  Ledger& ledger = s.ledger;
  ledger.model = g.name;
  ledger.model_type = g.model_type;
  ledger.config_sha256 = g.config_sha256;
  ledger.options = s.options;
  ledger.notes = g.notes;
  Result<CacheMap> caches = MapCaches(g, LayoutOptionsOf(s.options));
  if (!caches.ok()) {
    s.planned = caches.status();
    return;
  }
  s.caches = std::move(*caches);
  ledger.kv_format = s.caches.kv_format;
  ledger.indexer_format = s.caches.indexer_format;
  ledger.layers_counted = s.caches.layers_counted;
  for (const CacheLineSpec& spec : s.caches.lines) ledger.lines.push_back(LineOf(spec, g));

  // The engine: block span, page layouts (a profile's Plan does not read the context).
  s.profile = detail::MakeEngineProfile(s.options.engine, {g, s.options, s.caches});
  s.planned = s.profile->Plan(ledger);
  if (s.planned.ok()) s.planned = ReportWindowStrategies(ledger);
  if (s.planned.ok()) s.kinds = SummarizeKinds(g, s.options, ledger);
  s.planned_notes = ledger.notes.size();
}

LedgerSweep::~LedgerSweep() = default;
LedgerSweep::LedgerSweep(LedgerSweep&&) noexcept = default;
LedgerSweep& LedgerSweep::operator=(LedgerSweep&&) noexcept = default;

const std::string& LedgerSweep::kv_format() const { return s_->ledger.kv_format; }

// ComputeLedger's steps that depend on the context, on the planned ledger: every figure they
// set is reset first, so that nothing of an earlier context remains.
Status LedgerSweep::Price(uint64_t context) {
  State& s = *s_;
  LedgerOptions checked = s.options;
  checked.context_tokens = context;
  TESSERA_RETURN_IF_ERROR(ValidateOptions(checked));
  TESSERA_RETURN_IF_ERROR(s.planned);
  s.options.context_tokens = context;
  Ledger& ledger = s.ledger;
  ledger.options.context_tokens = context;
  ledger.tokens_per_rank = 0;
  ledger.terms.clear();
  ledger.requested_bytes = 0;
  ledger.committed_bytes = 0;
  ledger.committed_bytes_all_ranks = 0;
  ledger.reserved_at_admission_bytes = 0;
  ledger.phases.clear();
  ledger.cached_boundaries = 0;
  ledger.read_bytes_per_token = 0;
  ledger.read_bytes_per_token_all_ranks = 0;
  ledger.mha_equivalent_bytes = 0;
  ledger.mha_bytes_per_token_per_layer = 0;
  ledger.mha_ratio = Fraction();
  ledger.notes.resize(s.planned_notes);
  if (std::string note = LimitNote(s.g, s.options); !note.empty()) ledger.notes.push_back(std::move(note));
  for (CacheLine& line : ledger.lines) {
    line.shape.clear();
    line.shape_unit.clear();
    line.requested_bytes = 0;
    line.committed_bytes = 0;
    line.terms.clear();
    line.read_bytes_per_token = 0;
  }
  TESSERA_ASSIGN_OR_RETURN(detail::RankCost busiest, PriceRanks(*s.profile, s.options, ledger));
  TESSERA_RETURN_IF_ERROR(PriceLines(s.g, s.options, busiest, ledger));
  TESSERA_RETURN_IF_ERROR(PriceRequested(s.g, s.options, ledger));
  TESSERA_RETURN_IF_ERROR(PriceMhaBaseline(s.g, s.options, ledger));
  return s.kinds;
}

Result<Ledger> LedgerSweep::LedgerAt(uint64_t context) {
  TESSERA_RETURN_IF_ERROR(Price(context));
  return s_->ledger;
}

Result<PhaseTotals> LedgerSweep::PhasesAt(uint64_t context) {
  TESSERA_RETURN_IF_ERROR(Price(context));
  PhaseTotals totals{};
  for (const PhaseBytes& p : s_->ledger.phases) totals[static_cast<size_t>(p.phase)] = p.bytes;
  return totals;
}

Result<Ledger> ComputeLedger(const Geometry& g, const LedgerOptions& options) {
  return LedgerSweep(g, options).LedgerAt(options.context_tokens);
}

}  // namespace tessera

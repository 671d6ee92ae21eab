#include "tessera/ledger.h"

#include <algorithm>
#include <map>

#include "engine.h"
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

uint64_t Ledger::TermBytes(std::string_view name) const {
  for (const Term& t : terms) {
    if (t.name == name) return t.bytes;
  }
  return 0;
}

namespace detail {

CacheLayoutOptions LayoutOptionsOf(const LedgerOptions& o) {
  CacheLayoutOptions lo;
  lo.kv_format = o.kv_format;
  lo.indexer_format = o.indexer_format;
  lo.block_tokens = o.block_tokens;
  lo.kernel = o.kernel;
  lo.include_mtp = o.include_mtp;
  lo.tp = o.tp;
  return lo;
}

Checked Entries(uint64_t tokens, uint32_t ratio) { return Checked(ratio <= 1 ? tokens : tokens / ratio); }

uint64_t WindowBlocksHeld(uint64_t tokens, uint64_t window, uint64_t block_tokens) {
  if (tokens == 0) return 0;
  uint64_t first = tokens > window ? tokens - window : 0;
  return CeilDiv(tokens, block_tokens) - first / block_tokens;
}

}  // namespace detail

namespace {

using detail::Entries;
using detail::LayoutOptionsOf;

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
  // The KV heads a rank holds: MapCaches checks them next (CheckTensorParallel).
  return Status::Ok();
}

// A ledger line from the layout's: the structure, and the per-token figures of the whole model
// (not per rank).
CacheLine LineOf(const CacheLineSpec& spec) {
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
  line.bytes_per_token_per_layer =
      line.grows ? Fraction(line.record_bytes, line.compress_ratio) : Fraction::Integer(line.record_bytes);
  return line;
}

// Shape of one cache line's tensor for the whole batch.
void FillShape(CacheLine& line, const Geometry& g, uint64_t batch, uint64_t tokens) {
  uint64_t entries = line.grows ? Entries(tokens, line.compress_ratio).value() : std::min<uint64_t>(tokens, line.slots);
  if (line.role == CacheRole::kKv && line.format.single_element_type() && line.format.regions.size() == 2) {
    line.shape = {line.layers, batch, entries, 2, g.mha_heads(), g.mha_head_dim()};
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

}  // namespace

Result<Ledger> ComputeLedger(const Geometry& g, const LedgerOptions& options) {
  TESSERA_RETURN_IF_ERROR(ValidateOptions(options));
  Ledger ledger;
  ledger.model = g.name;
  ledger.model_type = g.model_type;
  ledger.config_sha256 = g.config_sha256;
  ledger.options = options;
  ledger.notes = g.notes;
  TESSERA_ASSIGN_OR_RETURN(CacheMap caches, MapCaches(g, LayoutOptionsOf(options)));
  ledger.kv_format = caches.kv_format;
  ledger.indexer_format = caches.indexer_format;
  ledger.layers_counted = caches.layers_counted;
  for (const CacheLineSpec& spec : caches.lines) ledger.lines.push_back(LineOf(spec));

  // Engine: block spans, page layouts, committed bytes and terms.
  TESSERA_RETURN_IF_ERROR(detail::ApplyEngine(g, options, caches, ledger));

  // Requested (logical, whole request, every rank's share together) and the MHA baseline.
  Checked requested(0);
  for (CacheLine& line : ledger.lines) {
    Checked entries = line.grows ? Entries(options.context_tokens, line.compress_ratio)
                                 : Checked(std::min<uint64_t>(options.context_tokens, line.slots));
    Checked line_requested = entries * line.record_bytes * line.layers * options.batch;
    if (line_requested.overflowed()) {
      Checked one = entries * line.record_bytes * line.layers;
      return OutOfRange(one.overflowed() ? "context" : "batch",
                        "requested bytes of " + line.name + " overflow 64 bits at this size");
    }
    line.requested_bytes = line_requested.value();
    requested += line_requested;
    FillShape(line, g, options.batch, options.context_tokens);
  }
  if (requested.overflowed()) return OutOfRange("batch", "requested bytes overflow 64 bits");
  ledger.requested_bytes = requested.value();

  // K and V, bf16: 2 x heads x head_dim x 2 B, each factor from the config.
  Checked mha_record = Checked(2) * g.mha_heads() * g.mha_head_dim() * 2;
  if (mha_record.overflowed()) {
    return OutOfRange("head_dim", "the MHA-equivalent record (2 x heads x head_dim x 2 B) overflows 64 bits");
  }
  ledger.mha_bytes_per_token_per_layer = mha_record.value();
  Checked mha = Checked(ledger.mha_bytes_per_token_per_layer) * options.context_tokens * ledger.layers_counted;
  if (mha.overflowed()) return OutOfRange("context", "MHA-equivalent bytes overflow 64 bits");
  mha = mha * options.batch;
  if (mha.overflowed()) return OutOfRange("batch", "MHA-equivalent bytes overflow 64 bits");
  ledger.mha_equivalent_bytes = mha.value();
  if (ledger.requested_bytes > 0) ledger.mha_ratio = Fraction(ledger.mha_equivalent_bytes, ledger.requested_bytes);

  // Per-layer-kind summaries.
  for (const CacheLine& line : ledger.lines) {
    LayerKindSummary* s = nullptr;
    for (LayerKindSummary& k : ledger.kinds) {
      if (k.kind == line.layer_kind) s = &k;
    }
    if (s == nullptr) {
      ledger.kinds.push_back({line.layer_kind, g.CountLayers(line.layer_kind, options.include_mtp), Fraction(), 0, 0});
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
  return ledger;
}

}  // namespace tessera

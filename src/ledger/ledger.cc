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

std::vector<CacheGroup> BuildCacheMap(const Ledger& ledger) {
  std::vector<CacheGroup> groups;
  for (const CacheLine& line : ledger.lines) {
    std::string name = std::string(CacheRoleName(line.role));
    if (line.in_pages) {
      name += "/" + std::to_string(line.compress_ratio);
    } else if (line.role != CacheRole::kWindow) {
      name += "/" + std::to_string(line.slots);
    }
    CacheGroup* g = nullptr;
    for (CacheGroup& existing : groups) {
      bool same = existing.name == name && existing.format.name == line.format.name &&
                  existing.format.record_bytes() == line.format.record_bytes() && existing.in_pages == line.in_pages &&
                  existing.slots == line.slots;
      if (same) g = &existing;
    }
    if (g == nullptr) {
      CacheGroup fresh;
      fresh.name = name;
      fresh.role = line.role;
      fresh.format = line.format;
      fresh.in_pages = line.in_pages;
      fresh.compress_ratio = line.compress_ratio;
      fresh.page = line.page;
      fresh.slots = line.slots;
      groups.push_back(std::move(fresh));
      g = &groups.back();
    }
    g->layers += line.layers;
    g->lines.push_back(line.name);
    if (!line.in_pages) g->bytes_per_request = uint64_t{g->layers} * g->slots * g->format.record_bytes();
  }
  return groups;
}

std::string DefaultKvFormat(const Geometry& g) {
  if (g.is_hybrid) return "v4-fp8";
  if (!g.is_mla) return "mha-bf16";
  for (const LayerSpec& l : g.layers) {
    if (l.kind == LayerKind::kMlaSparse) return "fp8_ds_mla";
  }
  return "mla-bf16";
}

std::string DefaultIndexerFormat(const Geometry& g, std::string_view kv_format) {
  if (g.index_head_dim == 0) return "";
  if (kv_format == "v4-seed") return "indexer-fp4-seed";
  return "indexer-fp8";
}

namespace detail {

Checked Entries(uint64_t tokens, uint32_t ratio) { return Checked(ratio <= 1 ? tokens : tokens / ratio); }

uint64_t WindowBlocksHeld(uint64_t tokens, uint64_t window, uint64_t block_tokens) {
  if (tokens == 0) return 0;
  uint64_t first = tokens > window ? tokens - window : 0;
  return CeilDiv(tokens, block_tokens) - first / block_tokens;
}

}  // namespace detail

namespace {

using detail::Entries;

struct LineKey {
  LayerKind kind;
  CacheRole role;
  bool mtp;
  uint32_t ratio;
  uint32_t slots;
  uint32_t floats;
  auto operator<=>(const LineKey&) const = default;
};

Status ValidateOptions(const Geometry& g, const LedgerOptions& o) {
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
  if (!g.is_mla && o.tp > g.num_kv_heads && o.tp % g.num_kv_heads != 0) {
    return InvalidArgument(
        "tp", std::to_string(o.tp) + " ranks cannot share " + std::to_string(g.num_kv_heads) + " KV heads evenly");
  }
  if (!g.is_mla && o.tp <= g.num_kv_heads && g.num_kv_heads % o.tp != 0) {
    return InvalidArgument(
        "tp", std::to_string(g.num_kv_heads) + " KV heads cannot be split over " + std::to_string(o.tp) + " ranks");
  }
  return Status::Ok();
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
  TESSERA_RETURN_IF_ERROR(ValidateOptions(g, options));
  Ledger ledger;
  ledger.model = g.name;
  ledger.model_type = g.model_type;
  ledger.config_sha256 = g.config_sha256;
  ledger.options = options;
  ledger.notes = g.notes;
  ledger.kv_format = options.kv_format.empty() ? DefaultKvFormat(g) : options.kv_format;
  ledger.indexer_format =
      options.indexer_format.empty() ? DefaultIndexerFormat(g, ledger.kv_format) : options.indexer_format;

  // Formats, for the whole model and for one rank (MHA heads shard over tensor-parallel ranks;
  // an MLA latent is one KV head, so every rank keeps all of it).
  TESSERA_ASSIGN_OR_RETURN(RecordFormat main_format, BuildFormat(ledger.kv_format, g, "kv-format"));
  Geometry rank_geometry = g;
  rank_geometry.num_kv_heads = std::max<uint32_t>(1, g.num_kv_heads / options.tp);
  rank_geometry.num_attention_heads = std::max<uint32_t>(1, g.num_attention_heads / options.tp);
  TESSERA_ASSIGN_OR_RETURN(RecordFormat rank_main_format, BuildFormat(ledger.kv_format, rank_geometry, "kv-format"));
  bool needs_kv = !g.is_mla;
  if (needs_kv != (main_format.use == FormatUse::kKv)) {
    if (!(g.is_mla && main_format.use == FormatUse::kKv)) {
      return InvalidArgument("kv-format", ledger.kv_format + " is a " + std::string(FormatUseName(main_format.use)) +
                                              " format; " + g.name + " needs a " + (needs_kv ? "kv" : "latent") +
                                              " format");
    }
  }
  if (main_format.use == FormatUse::kIndexer) {
    return InvalidArgument("kv-format", ledger.kv_format + " is an indexer format; pass it as --indexer-format");
  }
  std::optional<RecordFormat> indexer_format;
  bool has_indexer = false;
  for (const LayerSpec& l : g.layers) {
    for (const CacheSpec& c : l.caches) has_indexer = has_indexer || c.role == CacheRole::kIndexer;
  }
  if (has_indexer) {
    TESSERA_ASSIGN_OR_RETURN(RecordFormat f, BuildFormat(ledger.indexer_format, g, "indexer-format"));
    if (f.use != FormatUse::kIndexer) {
      return InvalidArgument("indexer-format", ledger.indexer_format + " is not an indexer format");
    }
    indexer_format = f;
  } else if (!options.indexer_format.empty()) {
    return InvalidArgument("indexer-format", g.name + " has no indexer");
  }
  // A per-head expanded format on an MLA model replaces the latent: the whole model is then
  // cached the way an expanding stack caches it.
  bool expanded = g.is_mla && main_format.use == FormatUse::kKv;
  if (expanded && g.is_hybrid) {
    return InvalidArgument("kv-format", ledger.kv_format + " cannot describe " + g.name + "'s compressed layers");
  }

  // Group layers into cache lines.
  std::map<LineKey, size_t> index;
  for (const LayerSpec& layer : g.layers) {
    if (layer.is_mtp && !options.include_mtp) continue;
    ++ledger.layers_counted;
    for (const CacheSpec& spec : layer.caches) {
      if (expanded && spec.role == CacheRole::kIndexer) continue;
      LineKey key{layer.kind,   expanded ? CacheRole::kKv : spec.role,
                  layer.is_mtp, spec.compress_ratio,
                  spec.slots,   spec.state_floats};
      auto [it, inserted] = index.try_emplace(key, ledger.lines.size());
      if (inserted) {
        CacheLine line;
        line.layer_kind = layer.kind;
        line.role = key.role;
        line.mtp = layer.is_mtp;
        line.grows = IsPaged(key.role);
        line.compress_ratio = spec.compress_ratio;
        line.slots = spec.slots;
        line.name = std::string(layer.is_mtp ? "mtp." : "") + std::string(LayerKindName(layer.kind)) + "." +
                    std::string(CacheRoleName(key.role));
        switch (key.role) {
          case CacheRole::kKv:
          case CacheRole::kLatent:
          case CacheRole::kCompressed:
          case CacheRole::kWindow:
            line.format = rank_main_format;
            break;
          case CacheRole::kIndexer:
            line.format = *indexer_format;
            break;
          case CacheRole::kCompressorState:
          case CacheRole::kIndexerCompressorState:
            line.format = CompressorStateFormat(spec.state_floats);
            break;
        }
        ledger.lines.push_back(std::move(line));
      }
      ++ledger.lines[it->second].layers;
    }
  }

  // Per-token figures (whole model, not per rank).
  for (CacheLine& line : ledger.lines) {
    line.record_bytes = line.format.record_bytes();
    if (line.role == CacheRole::kKv || line.role == CacheRole::kLatent || line.role == CacheRole::kCompressed ||
        line.role == CacheRole::kWindow) {
      line.record_bytes = main_format.record_bytes();
    }
    line.bytes_per_token_per_layer =
        line.grows ? Fraction(line.record_bytes, line.compress_ratio) : Fraction::Integer(line.record_bytes);
  }

  // Engine: block spans, page layouts, committed bytes and terms.
  TESSERA_RETURN_IF_ERROR(detail::ApplyEngine(g, options, main_format, ledger));

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

#include "tessera/layout.h"

#include <algorithm>
#include <map>

#include "tessera/checked.h"

namespace tessera {

std::string_view KernelName(Kernel kernel) {
  switch (kernel) {
    case Kernel::kFlashMla:
      return "flashmla";
    case Kernel::kCutlassMla:
      return "cutlass-mla";
    case Kernel::kFlashInferMla:
      return "flashinfer-mla";
    case Kernel::kGeneric:
      break;
  }
  return "generic";
}

uint32_t KernelPageEntries(Kernel kernel) {
  switch (kernel) {
    case Kernel::kFlashMla:
      return 64;
    case Kernel::kCutlassMla:
      return 128;
    case Kernel::kFlashInferMla:
      return 32;
    case Kernel::kGeneric:
      break;
  }
  return 0;
}

Result<Kernel> ParseKernel(std::string_view name) {
  for (Kernel k : {Kernel::kFlashMla, Kernel::kCutlassMla, Kernel::kFlashInferMla, Kernel::kGeneric}) {
    if (name == KernelName(k)) return k;
  }
  return InvalidArgument(
      "kernel", "unknown kernel \"" + std::string(name) + "\" (known: flashmla, cutlass-mla, flashinfer-mla, generic)");
}

namespace {
constexpr uint32_t kGenericMhaBlockTokens = 16;

std::string_view KernelDisplayName(Kernel kernel) {
  switch (kernel) {
    case Kernel::kFlashMla:
      return "FlashMLA";
    case Kernel::kCutlassMla:
      return "CUTLASS MLA";
    case Kernel::kFlashInferMla:
      return "FlashInfer MLA";
    case Kernel::kGeneric:
      break;
  }
  return "a generic kernel";
}
constexpr uint64_t kMaxBlockTokens = 1u << 20;
}  // namespace

Result<BlockTokensChoice> ChooseBlockTokens(const std::vector<uint32_t>& ratios, bool mla, Kernel kernel,
                                            std::optional<uint64_t> requested) {
  BlockTokensChoice choice;
  Checked lcm(1);
  uint32_t finest = 0;
  for (uint32_t r : ratios) {
    if (r == 0) continue;
    lcm = Lcm(lcm.value(), r);
    finest = finest == 0 ? r : std::min(finest, r);
  }
  if (lcm.overflowed() || lcm.value() > kMaxBlockTokens) {
    return OutOfRange("compress_ratios",
                      "their least common multiple exceeds " + std::to_string(kMaxBlockTokens) + " tokens");
  }
  if (finest == 0) finest = 1;
  uint64_t hard = lcm.value();

  uint64_t preferred = 0;
  std::string preference;
  const uint32_t entries = KernelPageEntries(kernel);
  if (mla && entries > 0) {
    preferred = static_cast<uint64_t>(entries) * finest;
    preference = std::string(KernelDisplayName(kernel)) + " reads pages of " + std::to_string(entries) +
                 " entries; at " + std::to_string(finest) + " token(s) per entry that is " + std::to_string(preferred) +
                 " tokens";
  } else if (!mla) {
    preferred = kGenericMhaBlockTokens;
    preference = "MHA pages of 16 tokens (the PagedAttention default)";
  } else {
    preferred = hard;
    preference = "no kernel preference beyond the compress ratios";
  }

  if (requested.has_value()) {
    uint64_t bt = *requested;
    if (bt == 0) return InvalidArgument("block-tokens", "must be positive");
    if (bt > kMaxBlockTokens)
      return OutOfRange("block-tokens", std::to_string(bt) + " exceeds " + std::to_string(kMaxBlockTokens));
    for (uint32_t r : ratios) {
      if (r != 0 && bt % r != 0) {
        return InvalidArgument(
            "block-tokens",
            std::to_string(bt) + " is not a multiple of compress ratio " + std::to_string(r) +
                " (a block must hold whole compression groups; lcm of ratios in use = " + std::to_string(hard) + ")");
      }
    }
    choice.block_tokens = static_cast<uint32_t>(bt);
    choice.reasons.push_back("set explicitly (--block-tokens " + std::to_string(bt) + ")");
    if (bt % preferred != 0) {
      choice.notes.push_back("misses a preference: " + preference);
    }
    return choice;
  }

  Checked bt = Lcm(hard, preferred);
  if (bt.overflowed() || bt.value() > kMaxBlockTokens)
    return OutOfRange("block-tokens", "derived block span is too large");
  choice.block_tokens = static_cast<uint32_t>(bt.value());
  if (hard > 1)
    choice.reasons.push_back("multiple of every compress ratio in use (lcm = " + std::to_string(hard) + ")");
  choice.reasons.push_back(preference);
  return choice;
}

Result<PageLayout> ComputePageLayout(const RecordFormat& format, uint32_t compress_ratio, uint32_t block_tokens,
                                     uint64_t alignment, uint32_t layers_per_page) {
  if (layers_per_page == 0) return InvalidArgument("layers", "a page holds at least one layer");
  if (compress_ratio == 0) return InvalidArgument("compress_ratios", "a paged cache needs a positive compress ratio");
  if (block_tokens == 0 || block_tokens % compress_ratio != 0) {
    return InvalidArgument("block-tokens", std::to_string(block_tokens) + " is not a multiple of compress ratio " +
                                               std::to_string(compress_ratio));
  }
  PageLayout p;
  p.block_tokens = block_tokens;
  p.compress_ratio = compress_ratio;
  p.entries_per_block = block_tokens / compress_ratio;
  p.record_bytes = format.record_bytes();
  p.alignment = alignment == 0 ? std::max<uint64_t>(format.page_alignment, 1) : alignment;
  p.layers_per_page = layers_per_page;
  Checked data = Checked(p.entries_per_block) * p.record_bytes;
  if (data.overflowed()) return OutOfRange("block-tokens", "page bytes overflow 64 bits");
  // Packed slices start on kPackedSliceAlignment so a kernel's vector loads stay aligned.
  Checked stride = layers_per_page > 1 ? RoundUp(data.value(), kPackedSliceAlignment) : data;
  Checked slices = stride * layers_per_page;
  if (slices.overflowed()) return OutOfRange("block-tokens", "page bytes overflow 64 bits");
  Checked page = RoundUp(slices.value(), p.alignment);
  if (page.overflowed()) return OutOfRange("block-tokens", "page bytes overflow 64 bits");
  p.data_bytes = data.value();
  p.page_bytes = page.value();
  p.padding_bytes = p.page_bytes - p.data_bytes * layers_per_page;
  p.layer_stride = p.packed() ? stride.value() : p.page_bytes;
  return p;
}

Checked GroupBlockBytes(const PageLayout& page, uint32_t layers) {
  const uint32_t per_page = std::max<uint32_t>(page.layers_per_page, 1);
  return Checked(CeilDiv(layers, per_page)) * page.page_bytes;
}

uint64_t PackedPaddingPerBlock(const PageLayout& page, uint32_t layers) {
  if (!page.packed()) return 0;
  return CeilDiv(layers, page.layers_per_page) * page.padding_bytes;
}

std::string_view SwaStrategyName(SwaStrategy s) {
  switch (s) {
    case SwaStrategy::kRecompute:
      return "recompute";
    case SwaStrategy::kSnapshot:
      return "snapshot";
    case SwaStrategy::kRetain:
      return "retain";
  }
  return "?";
}

Result<SwaStrategy> ParseSwaStrategy(std::string_view name) {
  if (name == "recompute") return SwaStrategy::kRecompute;
  if (name == "snapshot") return SwaStrategy::kSnapshot;
  if (name == "retain") return SwaStrategy::kRetain;
  return InvalidArgument("swa-strategy",
                         "unknown strategy \"" + std::string(name) + "\" (known: recompute, snapshot, retain)");
}

}  // namespace tessera

namespace tessera {

std::string DefaultKvFormat(const Geometry& g) {
  if (g.is_hybrid) return "v4-fp8";
  if (!g.is_mla) return "mha-bf16";
  for (const LayerSpec& l : g.layers) {
    if (l.kind == LayerKind::kMlaSparse) return "fp8_ds_mla";
  }
  return "mla-bf16";
}

std::string DefaultIndexerFormat(const Geometry& g, const RecordFormat& main_format) {
  if (g.index_head_dim == 0) return "";
  // The seed note's figures pair its structural record with its structural indexer.
  if (main_format.family == FormatFamily::kSeed) return "indexer-fp4-seed";
  return "indexer-fp8";
}

namespace {

Status CheckKvHeadsSplit(uint32_t kv_heads, uint32_t tp) {
  if (tp > kv_heads && tp % kv_heads != 0) {
    return InvalidArgument("tp",
                           std::to_string(tp) + " ranks cannot share " + std::to_string(kv_heads) + " KV heads evenly");
  }
  if (tp <= kv_heads && kv_heads % tp != 0) {
    return InvalidArgument(
        "tp", std::to_string(kv_heads) + " KV heads cannot be split over " + std::to_string(tp) + " ranks");
  }
  return Status::Ok();
}

}  // namespace

Status CheckTensorParallel(const Geometry& g, uint32_t tp) {
  if (tp == 0) return InvalidArgument("tp", "must be positive");
  if (!g.is_mla) TESSERA_RETURN_IF_ERROR(CheckKvHeadsSplit(g.num_kv_heads, tp));
  for (const LayerSpec& l : g.layers) {
    if (l.kv.kv_heads > 0) TESSERA_RETURN_IF_ERROR(CheckKvHeadsSplit(l.kv.kv_heads, tp));
    if (l.kind == LayerKind::kLinear && l.linear.shard_heads % tp != 0) {
      return InvalidArgument("tp", "a linear-attention state of " + std::to_string(l.linear.shard_heads) +
                                       " head groups cannot be split over " + std::to_string(tp) + " ranks");
    }
  }
  return Status::Ok();
}

namespace {

// The formats one rank stores: the main record (MHA heads shard over tensor-parallel ranks; an
// MLA latent is one KV head, so every rank keeps all of it) and the indexer's.
struct RankFormats {
  RecordFormat main;
  std::optional<RecordFormat> indexer;
  bool expanded = false;  // a per-head format replaces the latent of an MLA model
  FormatDims dims;        // the model's (unsharded)
  uint32_t tp = 1;
};

// A rank's share of `d`: heads over tensor-parallel ranks (at least one: heads replicate beyond
// their count).
FormatDims RankDims(FormatDims d, uint32_t tp) {
  d.kv.kv_heads = std::max<uint32_t>(1, d.kv.kv_heads / tp);
  d.attention_heads = std::max<uint32_t>(1, d.attention_heads / tp);
  return d;
}

ElementType StateElementType(StateDtype t) {
  switch (t) {
    case StateDtype::kFp16:
      return ElementType::kFp16;
    case StateDtype::kFp32:
      return ElementType::kFp32;
    case StateDtype::kBf16:
      break;
  }
  return ElementType::kBf16;
}

Status CheckMainUse(const Geometry& g, const CacheMap& map) {
  const RecordFormat& f = map.main_format;
  bool needs_kv = !g.is_mla;
  if (needs_kv != (f.use == FormatUse::kKv) && !(g.is_mla && f.use == FormatUse::kKv)) {
    return InvalidArgument("kv-format", map.kv_format + " is a " + std::string(FormatUseName(f.use)) + " format; " +
                                            g.name + " needs a " + (needs_kv ? "kv" : "latent") + " format");
  }
  if (f.use == FormatUse::kIndexer) {
    return InvalidArgument("kv-format", map.kv_format + " is an indexer format; pass it as --indexer-format");
  }
  return Status::Ok();
}

bool HasIndexer(const Geometry& g) {
  for (const LayerSpec& l : g.layers) {
    for (const CacheSpec& c : l.caches) {
      if (c.role == CacheRole::kIndexer) return true;
    }
  }
  return false;
}

// An explicit scale format, on a record that has fp32 scales.
Status ApplyScaleFormat(std::optional<ScaleFormat> want, const char* field, RecordFormat& whole, RecordFormat& rank) {
  if (!want.has_value()) return Status::Ok();
  if (!whole.scale_format.has_value()) {
    return InvalidArgument(field, whole.name + " has no fp32 scales to pick a format for (fp8_ds_mla, indexer-fp8 do)");
  }
  whole.scale_format = want;
  rank.scale_format = want;
  return Status::Ok();
}

Result<RankFormats> ResolveFormats(const Geometry& g, const CacheLayoutOptions& o, CacheMap& map) {
  RankFormats rank;
  map.kv_format = o.kv_format.empty() ? DefaultKvFormat(g) : o.kv_format;
  rank.dims = FormatDimsOf(g);
  rank.tp = o.tp;
  TESSERA_ASSIGN_OR_RETURN(map.main_format, BuildFormat(map.kv_format, rank.dims, "kv-format"));
  TESSERA_ASSIGN_OR_RETURN(rank.main, BuildFormat(map.kv_format, RankDims(rank.dims, o.tp), "kv-format"));
  TESSERA_RETURN_IF_ERROR(CheckMainUse(g, map));
  map.indexer_format = o.indexer_format.empty() ? DefaultIndexerFormat(g, map.main_format) : o.indexer_format;
  if (HasIndexer(g)) {
    TESSERA_ASSIGN_OR_RETURN(RecordFormat f, BuildFormat(map.indexer_format, g, "indexer-format"));
    if (f.use != FormatUse::kIndexer) {
      return InvalidArgument("indexer-format", map.indexer_format + " is not an indexer format");
    }
    RecordFormat whole = f;
    TESSERA_RETURN_IF_ERROR(ApplyScaleFormat(o.indexer_scale_format, "indexer-scale-format", whole, f));
    if (o.indexer_packing.has_value()) TESSERA_RETURN_IF_ERROR(SetIndexerPacking(f, *o.indexer_packing));
    rank.indexer = std::move(f);
  } else if (!o.indexer_format.empty()) {
    return InvalidArgument("indexer-format", g.name + " has no indexer");
  } else if (o.indexer_scale_format.has_value()) {
    return InvalidArgument("indexer-scale-format", g.name + " has no indexer");
  } else if (o.indexer_packing.has_value()) {
    return InvalidArgument("indexer-layout", g.name + " has no indexer");
  }
  TESSERA_RETURN_IF_ERROR(ApplyScaleFormat(o.kv_scale_format, "kv-scale-format", map.main_format, rank.main));
  // A per-head expanded format on an MLA model replaces the latent: the whole model is then
  // cached the way an expanding stack caches it.
  rank.expanded = g.is_mla && map.main_format.use == FormatUse::kKv;
  if (rank.expanded && g.is_hybrid) {
    return InvalidArgument("kv-format", map.kv_format + " cannot describe " + g.name + "'s compressed layers");
  }
  return rank;
}

// Layers whose cache of one role shares a line.
struct LineKey {
  LayerKind kind;
  CacheRole role;
  bool mtp;
  uint32_t ratio;
  uint32_t slots;
  uint32_t floats;
  KvDims kv;               // MHA/GQA and sliding-window layers
  LinearStateDims linear;  // linear-attention layers
  // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 misreads a defaulted operator<=>.
  auto operator<=>(const LineKey&) const = default;
};

// A K/V line whose layers' heads or widths differ from the model's: its own record, whole and
// one rank's share.
Status LayerKvFormat(const LineKey& key, const CacheMap& map, const RankFormats& rank, CacheLineSpec& line) {
  FormatDims d = rank.dims;
  d.kv = key.kv;
  TESSERA_ASSIGN_OR_RETURN(RecordFormat whole, BuildFormat(map.kv_format, d, "kv-format"));
  TESSERA_ASSIGN_OR_RETURN(line.format, BuildFormat(map.kv_format, RankDims(d, rank.tp), "kv-format"));
  line.record_bytes = whole.record_bytes();
  return Status::Ok();
}

RecordFormat LinearFormat(const LinearStateDims& s, uint32_t tp) {
  return LinearStateFormat(s.conv_elements / tp, StateElementType(s.conv_dtype), s.recurrent_elements / tp,
                           StateElementType(s.recurrent_dtype));
}

Result<CacheLineSpec> NewLine(const LineKey& key, const CacheMap& map, const RankFormats& rank) {
  CacheLineSpec line;
  line.name = std::string(key.mtp ? "mtp." : "") + std::string(LayerKindName(key.kind)) + "." +
              std::string(CacheRoleName(key.role));
  line.layer_kind = key.kind;
  line.role = key.role;
  line.mtp = key.mtp;
  line.compress_ratio = key.ratio;
  line.slots = key.slots;
  line.state_floats = key.floats;
  line.kv = key.kv;
  switch (key.role) {
    case CacheRole::kKv:
    case CacheRole::kWindow:
      if (key.kv.kv_heads > 0 && !rank.expanded && key.kv != rank.dims.kv) {
        TESSERA_RETURN_IF_ERROR(LayerKvFormat(key, map, rank, line));
        return line;
      }
      [[fallthrough]];
    case CacheRole::kLatent:
    case CacheRole::kCompressed:
      line.format = rank.main;
      line.record_bytes = map.main_format.record_bytes();
      return line;
    case CacheRole::kIndexer:
      line.format = *rank.indexer;
      break;
    case CacheRole::kCompressorState:
    case CacheRole::kIndexerCompressorState:
      line.format = CompressorStateFormat(key.floats);
      break;
    case CacheRole::kLinearState:
      line.format = LinearFormat(key.linear, 1);
      line.record_bytes = line.format.record_bytes();
      line.format = LinearFormat(key.linear, rank.tp);
      return line;
  }
  line.record_bytes = line.format.record_bytes();
  return line;
}

}  // namespace

Result<CacheMap> MapCaches(const Geometry& g, const CacheLayoutOptions& options) {
  TESSERA_RETURN_IF_ERROR(CheckTensorParallel(g, options.tp));
  CacheMap map;
  TESSERA_ASSIGN_OR_RETURN(RankFormats rank, ResolveFormats(g, options, map));
  std::map<LineKey, size_t> index;
  for (const LayerSpec& layer : g.layers) {
    if (layer.is_mtp && !options.include_mtp) continue;
    ++map.layers_counted;
    for (const CacheSpec& spec : layer.caches) {
      if (rank.expanded && spec.role == CacheRole::kIndexer) continue;
      LineKey key{layer.kind,   rank.expanded && spec.role == CacheRole::kLatent ? CacheRole::kKv : spec.role,
                  layer.is_mtp, spec.compress_ratio,
                  spec.slots,   spec.state_floats,
                  layer.kv,     layer.linear};
      auto [it, inserted] = index.try_emplace(key, map.lines.size());
      if (inserted) {
        TESSERA_ASSIGN_OR_RETURN(CacheLineSpec line, NewLine(key, map, rank));
        map.lines.push_back(std::move(line));
      }
      map.lines[it->second].model_layers.push_back(layer.index);
    }
  }
  return map;
}

namespace {

std::string GroupName(const CacheLineSpec& line) {
  std::string name(CacheRoleName(line.role));
  if (IsPaged(line.role)) return name + "/" + std::to_string(line.compress_ratio);
  if (line.role != CacheRole::kWindow) return name + "/" + std::to_string(line.slots);
  return name;
}

// The group that holds `line`, created (with its page layout) when it is the first of its kind.
Result<uint32_t> GroupFor(const CacheLineSpec& line, uint32_t block_tokens, std::vector<CacheGroup>& groups) {
  const std::string name = GroupName(line);
  for (uint32_t i = 0; i < groups.size(); ++i) {
    if (groups[i].name == name && groups[i].format == line.format && groups[i].slots == line.slots) return i;
  }
  CacheGroup fresh;
  fresh.name = name;
  fresh.role = line.role;
  fresh.format = line.format;
  fresh.in_pages = IsPaged(line.role);
  fresh.compress_ratio = line.compress_ratio;
  fresh.slots = line.slots;
  fresh.state_floats = line.state_floats;
  if (fresh.in_pages) {
    TESSERA_ASSIGN_OR_RETURN(fresh.page, ComputePageLayout(line.format, line.compress_ratio, block_tokens));
  }
  groups.push_back(std::move(fresh));
  return static_cast<uint32_t>(groups.size() - 1);
}

}  // namespace

Result<CacheLayout> LayoutCaches(const Geometry& g, CacheMap caches, const CacheLayoutOptions& options) {
  CacheLayout layout;
  static_cast<CacheMap&>(layout) = std::move(caches);
  std::vector<uint32_t> ratios;
  for (const CacheLineSpec& l : layout.lines) {
    if (IsPaged(l.role)) ratios.push_back(l.compress_ratio);
  }
  TESSERA_ASSIGN_OR_RETURN(layout.block, ChooseBlockTokens(ratios, g.is_mla, options.kernel, options.block_tokens));
  for (const CacheLineSpec& line : layout.lines) {
    TESSERA_ASSIGN_OR_RETURN(uint32_t gi, GroupFor(line, layout.block.block_tokens, layout.groups));
    CacheGroup& group = layout.groups[gi];
    layout.group_of_line.push_back(gi);
    group.lines.push_back(line.name);
    group.model_layers.insert(group.model_layers.end(), line.model_layers.begin(), line.model_layers.end());
    group.layers = static_cast<uint32_t>(group.model_layers.size());
  }
  for (CacheGroup& group : layout.groups) {
    // Layer indices ascend in model order (main layers, then MTP layers).
    std::sort(group.model_layers.begin(), group.model_layers.end());
    if (group.in_pages) {
      // A padded one-layer page (v4-fp8's 576-B alignment: 2 HCA entries of 584 B in 1,728 B)
      // pays its padding once per layer; all the group's layers in one page pay it once.
      if (options.pack_layers && group.page.padding_bytes > 0 && group.layers > 1) {
        TESSERA_ASSIGN_OR_RETURN(group.page, ComputePageLayout(group.format, group.compress_ratio,
                                                               group.page.block_tokens, 0, group.layers));
      }
      continue;
    }
    Checked ring = Checked(group.layers) * group.slots * group.format.record_bytes();
    if (ring.overflowed()) return OutOfRange("sliding_window", "the " + group.name + " rings overflow 64 bits");
    group.bytes_per_request = ring.value();
  }
  return layout;
}

Result<CacheLayout> ComputeCacheLayout(const Geometry& g, const CacheLayoutOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(CacheMap caches, MapCaches(g, options));
  return LayoutCaches(g, std::move(caches), options);
}

Status CheckWindowStrategy(const CacheLayout& layout, SwaStrategy strategy) {
  if (strategy != SwaStrategy::kRetain) return Status::Ok();
  uint64_t window = 0;
  for (const CacheGroup& group : layout.groups) {
    if (group.role == CacheRole::kWindow) window = std::max<uint64_t>(window, group.slots);
  }
  if (window == 0 || layout.block.block_tokens % window == 0) return Status::Ok();
  return InvalidArgument("swa-strategy", "retain keeps window chunks of " + std::to_string(window) +
                                             " tokens; the block span " + std::to_string(layout.block.block_tokens) +
                                             " is not a multiple of it");
}

}  // namespace tessera

#include "tessera/format.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "tessera/checked.h"
#include "tessera/codec.h"

namespace tessera {

uint32_t ElementBits(ElementType type) {
  switch (type) {
    case ElementType::kBf16:
      return 16;
    case ElementType::kFp16:
      return 16;
    case ElementType::kFp32:
      return 32;
    case ElementType::kFp8E4M3:
      return 8;
    case ElementType::kUe8m0:
      return 8;
    case ElementType::kFp4E2M1:
      return 4;
    case ElementType::kPad8:
      return 8;
  }
  return 0;
}

std::string_view ElementTypeName(ElementType type) {
  switch (type) {
    case ElementType::kBf16:
      return "bf16";
    case ElementType::kFp16:
      return "fp16";
    case ElementType::kFp32:
      return "fp32";
    case ElementType::kFp8E4M3:
      return "e4m3";
    case ElementType::kUe8m0:
      return "ue8m0";
    case ElementType::kFp4E2M1:
      return "e2m1";
    case ElementType::kPad8:
      return "pad";
  }
  return "?";
}

std::string_view PackingName(Packing packing) { return packing == Packing::kPerToken ? "per-token" : "region-major"; }

Result<Packing> ParsePacking(std::string_view name, std::string_view field) {
  if (name == "per-token") return Packing::kPerToken;
  if (name == "region-major") return Packing::kRegionMajor;
  return InvalidArgument(std::string(field), "unknown layout \"" + std::string(name) + "\" (per-token, region-major)");
}

std::string_view FormatUseName(FormatUse use) {
  switch (use) {
    case FormatUse::kKv:
      return "kv";
    case FormatUse::kLatent:
      return "latent";
    case FormatUse::kIndexer:
      return "indexer";
    case FormatUse::kState:
      return "state";
  }
  return "?";
}

uint64_t RecordFormat::record_bytes() const {
  uint64_t bits = 0;
  for (const Region& r : regions) bits += r.bits();
  return bits / 8;
}

uint64_t RecordFormat::plane_bytes(uint32_t plane) const {
  uint64_t bits = 0;
  for (const Region& r : regions) {
    if (r.plane == plane) bits += r.bits();
  }
  return bits / 8;
}

uint32_t RecordFormat::plane_count() const {
  uint32_t n = 0;
  for (const Region& r : regions) n = std::max(n, r.plane + 1);
  return n;
}

bool RecordFormat::single_element_type() const {
  std::set<ElementType> types;
  for (const Region& r : regions) types.insert(r.type);
  return types.size() == 1;
}

uint64_t RecordFormat::element_count() const {
  uint64_t n = 0;
  for (const Region& r : regions) n += r.count;
  return n;
}

std::string RecordFormat::RegionSummary() const {
  std::string out;
  for (const Region& r : regions) {
    if (!out.empty()) out += " + ";
    out += r.name + " " + std::string(ElementTypeName(r.type)) + " x" + std::to_string(r.count);
  }
  return out;
}

namespace {

// The catalog's formats. BuildFormat looks a name up once and then dispatches on this id.
enum class FormatId {
  kMhaBf16,
  kMhaFp8,
  kExpandedBf16,
  kMlaBf16,
  kMlaFp16,
  kMlaFp8,
  kFp8DsMla,
  kV4Fp8,
  kV41Fp8,
  kV4Seed,
  kIndexerFp8,
  kIndexerMxfp4,
  kIndexerFp4Seed,
};

struct FormatDef {
  const char* name;
  FormatId id;
  FormatUse use;
  FormatFamily family;
  const char* description;
};

constexpr FormatDef kFormats[] = {
    {"mha-bf16", FormatId::kMhaBf16, FormatUse::kKv, FormatFamily::kMha,
     "MHA/GQA K and V, bf16: kv_heads x (head_dim + v_head_dim) x 2 B"},
    {"mha-fp8", FormatId::kMhaFp8, FormatUse::kKv, FormatFamily::kMha,
     "MHA/GQA K and V, fp8 e4m3 (per-tensor scale kept outside the cache)"},
    {"expanded-bf16", FormatId::kExpandedBf16, FormatUse::kKv, FormatFamily::kExpanded,
     "MLA expanded to per-head K (nope+rope) and V, bf16, as the Hugging Face transformers cache stores it"},
    {"mla-bf16", FormatId::kMlaBf16, FormatUse::kLatent, FormatFamily::kMlaLatent,
     "MLA latent + RoPE, bf16 (FlashMLA dense); V is the first latent dims of K"},
    {"mla-fp16", FormatId::kMlaFp16, FormatUse::kLatent, FormatFamily::kMlaLatent, "MLA latent + RoPE, fp16"},
    {"mla-fp8", FormatId::kMlaFp8, FormatUse::kLatent, FormatFamily::kMlaLatent,
     "MLA latent + RoPE, fp8 e4m3, per-tensor scale kept outside the cache (vLLM --kv-cache-dtype fp8 with dense "
     "MLA backends; SGLang fp8_e4m3)"},
    {"fp8_ds_mla", FormatId::kFp8DsMla, FormatUse::kLatent, FormatFamily::kFp8DsMla,
     "MLA latent e4m3 with one fp32 scale per 128 values, bf16 RoPE, per token contiguous (FlashMLA sparse); "
     "scales amax/448 as vLLM writes them (scale format amax; ue8m0: FlashMLA's reference)"},
    {"v4-fp8", FormatId::kV4Fp8, FormatUse::kLatent, FormatFamily::kV4Fp8,
     "DeepSeek-V4 e4m3 content + bf16 RoPE rows, then ue8m0 scale rows (one per 64) padded to 8 B; region-major, "
     "pages padded to a multiple of the data row"},
    {"v41-fp8", FormatId::kV41Fp8, FormatUse::kLatent, FormatFamily::kV41Fp8,
     "DeepSeek-V4.1 e4m3 content incl. RoPE with one ue8m0 scale per 32"},
    {"v4-seed", FormatId::kV4Seed, FormatUse::kLatent, FormatFamily::kSeed,
     "the seed note's structural V4 record: bf16 RoPE + fp8 content, no scales (pair with indexer-fp4-seed)"},
    {"indexer-fp8", FormatId::kIndexerFp8, FormatUse::kIndexer, FormatFamily::kIndexer,
     "lightning-indexer key, e4m3 with one fp32 scale (V3.2, V4); scale a power of two as vLLM writes it for "
     "V3.2 (scale format ue8m0; amax: the raw quotient); region-major pages, a block's keys then its scales, as "
     "vLLM and SGLang write them (layout per-token: each key beside its scale)"},
    {"indexer-mxfp4", FormatId::kIndexerMxfp4, FormatUse::kIndexer, FormatFamily::kIndexer,
     "lightning-indexer key, e2m1 with one ue8m0 scale per 32"},
    {"indexer-fp4-seed", FormatId::kIndexerFp4Seed, FormatUse::kIndexer, FormatFamily::kSeed,
     "the seed note's structural indexer: e2m1 values, no scales"},
};

Status NeedMla(const FormatDims& g, std::string_view name, std::string_view field) {
  if (!g.mla) {
    return InvalidArgument(std::string(field), std::string(name) + " stores an MLA latent, but " + g.model +
                                                   " has no latent (no kv_lora_rank or compress_ratios)");
  }
  return Status::Ok();
}

Status NeedDivisible(uint64_t value, uint64_t group, std::string_view name, std::string_view what,
                     std::string_view field) {
  if (value % group != 0) {
    return InvalidArgument(std::string(field), std::string(name) + " needs " + std::string(what) + " (" +
                                                   std::to_string(value) + ") divisible by its scale group " +
                                                   std::to_string(group));
  }
  return Status::Ok();
}

// Per-head K and V: of the MHA/GQA heads, or of an MLA model's query heads (expanded).
Status FillHeadRegions(FormatId id, const FormatDims& g, std::string_view field, RecordFormat& f) {
  if (id == FormatId::kExpandedBf16) {
    TESSERA_RETURN_IF_ERROR(NeedMla(g, f.name, field));
    Checked heads(g.attention_heads);
    Checked k = heads * (Checked(g.qk_nope_head_dim) + g.qk_rope_head_dim), v = heads * g.v_head_dim;
    if (k.overflowed() || v.overflowed()) {
      return OutOfRange("head_dim", f.name + " records of " + g.model + " (heads x head dims) do not fit in 64 bits");
    }
    f.regions = {{"k", ElementType::kBf16, k.value(), 0}, {"v", ElementType::kBf16, v.value(), 0}};
    return Status::Ok();
  }
  ElementType t = id == FormatId::kMhaBf16 ? ElementType::kBf16 : ElementType::kFp8E4M3;
  // 32-bit heads times a 32-bit head dim: up to 64 bits, then bits and bytes on top. Checked
  // with the record's total; a wrapped width would price a record at 0 B.
  const uint64_t k = static_cast<uint64_t>(g.kv.kv_heads) * g.kv.k_head_dim;
  const uint64_t v = static_cast<uint64_t>(g.kv.kv_heads) * g.kv.v_head_dim;
  f.regions = {{"k", t, k, 0}, {"v", t, v, 0}};
  return Status::Ok();
}

// One record per token (or compressed group) of an MLA latent and its RoPE slice.
Status FillLatentRegions(FormatId id, const FormatDims& g, std::string_view field, RecordFormat& f) {
  TESSERA_RETURN_IF_ERROR(NeedMla(g, f.name, field));
  const uint64_t latent = g.latent_dim;
  const uint64_t rope = g.qk_rope_head_dim;
  switch (id) {
    case FormatId::kMlaBf16:
    case FormatId::kMlaFp16:
    case FormatId::kMlaFp8: {
      ElementType t = id == FormatId::kMlaBf16   ? ElementType::kBf16
                      : id == FormatId::kMlaFp16 ? ElementType::kFp16
                                                 : ElementType::kFp8E4M3;
      f.regions = {{"latent", t, latent, 0}, {"rope", t, rope, 0}};
      break;
    }
    case FormatId::kFp8DsMla:
      TESSERA_RETURN_IF_ERROR(NeedDivisible(latent, 128, f.name, "the latent", field));
      f.scale_format = ScaleFormat::kAmax;
      f.regions = {{"latent", ElementType::kFp8E4M3, latent, 0},
                   {"scales", ElementType::kFp32, latent / 128, 0},
                   {"rope", ElementType::kBf16, rope, 0}};
      break;
    case FormatId::kV4Fp8: {
      TESSERA_RETURN_IF_ERROR(NeedDivisible(latent, 64, f.name, "the content dims", field));
      uint64_t scales = latent / 64;
      uint64_t pad = (8 - scales % 8) % 8;  // the scale row is padded to 8 B
      f.regions = {{"nope", ElementType::kFp8E4M3, latent, 0},
                   {"rope", ElementType::kBf16, rope, 0},
                   {"scales", ElementType::kUe8m0, scales, 1}};
      if (pad > 0) f.regions.push_back({"pad", ElementType::kPad8, pad, 1});
      f.packing = Packing::kRegionMajor;
      f.page_alignment = f.plane_bytes(0);  // 576 B for DeepSeek-V4
      break;
    }
    case FormatId::kV41Fp8:
      TESSERA_RETURN_IF_ERROR(NeedDivisible(latent + rope, 32, f.name, "content + rope dims", field));
      f.regions = {{"data", ElementType::kFp8E4M3, latent + rope, 0},
                   {"scales", ElementType::kUe8m0, (latent + rope) / 32, 0}};
      break;
    case FormatId::kV4Seed:
      f.regions = {{"rope", ElementType::kBf16, rope, 0}, {"nope", ElementType::kFp8E4M3, latent, 0}};
      break;
    default:
      return Internal(std::string(field), f.name + " is not a latent format");
  }
  return Status::Ok();
}

Status FillIndexerRegions(FormatId id, const FormatDims& g, std::string_view field, RecordFormat& f) {
  if (g.index_head_dim == 0) {
    return InvalidArgument(std::string(field), f.name + " needs index_head_dim, which " + g.model + " lacks");
  }
  uint64_t d = g.index_head_dim;
  if (id == FormatId::kIndexerFp8) {
    f.regions = {{"key", ElementType::kFp8E4M3, d, 0}, {"scale", ElementType::kFp32, 1, 1}};
    f.packing = Packing::kRegionMajor;
    f.scale_format = ScaleFormat::kUe8m0;
  } else if (id == FormatId::kIndexerMxfp4) {
    TESSERA_RETURN_IF_ERROR(NeedDivisible(d, 32, f.name, "index_head_dim", field));
    f.regions = {{"key", ElementType::kFp4E2M1, d, 0}, {"scales", ElementType::kUe8m0, d / 32, 0}};
  } else {
    TESSERA_RETURN_IF_ERROR(NeedDivisible(d, 2, f.name, "index_head_dim", field));
    f.regions = {{"key", ElementType::kFp4E2M1, d, 0}};
  }
  return Status::Ok();
}

// Region::bits() and record_bytes() multiply and add unchecked: every record built here is
// checked once, so that a format that exists has a record size that fits in 64 bits.
Status CheckRegions(const RecordFormat& f, const FormatDims& g, std::string_view field) {
  for (const Region& r : f.regions) {
    if (r.count == 0) {
      return InvalidArgument(std::string(field), f.name + " region \"" + r.name + "\" would be empty for " + g.model);
    }
  }
  Checked bits(0);
  for (const Region& r : f.regions) bits += Checked(r.count) * ElementBits(r.type);
  if (bits.overflowed()) {
    const bool mha = f.use == FormatUse::kKv;
    return OutOfRange(mha ? "head_dim" : std::string(field),
                      f.name + " records of " + g.model + " do not fit in 64 bits" +
                          (mha ? " (heads x head_dim is " + std::to_string(f.regions[0].count) + ")" : ""));
  }
  return Status::Ok();
}

}  // namespace

std::vector<FormatInfo> FormatCatalog() {
  std::vector<FormatInfo> out;
  for (const FormatDef& d : kFormats) out.push_back({d.name, d.use, d.description});
  out.push_back({"v4-compressor-state", FormatUse::kState,
                 "DeepSeek-V4 compressor state: fp32 x (2 x coff x dim) per slot; built per layer, not selectable"});
  out.push_back({"linear-state", FormatUse::kState,
                 "linear-attention state (Gated DeltaNet, KDA): convolution rows + recurrent state, per request; "
                 "built per layer, not selectable"});
  return out;
}

RecordFormat CompressorStateFormat(uint32_t floats) {
  RecordFormat f;
  f.name = "v4-compressor-state";
  f.description = "fp32 compressor state slot";
  f.use = FormatUse::kState;
  f.family = FormatFamily::kCompressorState;
  f.regions = {{"state", ElementType::kFp32, floats, 0}};
  return f;
}

RecordFormat LinearStateFormat(uint64_t conv, ElementType conv_type, uint64_t recurrent, ElementType recurrent_type) {
  RecordFormat f;
  f.name = "linear-state";
  f.description = "linear-attention state: convolution rows, then the recurrent state";
  f.use = FormatUse::kState;
  f.family = FormatFamily::kLinearState;
  f.regions = {{"conv", conv_type, conv, 0}, {"recurrent", recurrent_type, recurrent, 0}};
  return f;
}

FormatDims FormatDimsOf(const Geometry& g) {
  FormatDims d;
  d.model = g.name;
  d.mla = g.is_mla;
  d.attention_heads = g.num_attention_heads;
  d.kv = g.is_mla ? KvDims{g.num_attention_heads, g.v_head_dim, g.v_head_dim}
                  : KvDims{g.num_kv_heads, g.head_dim, g.v_head_dim};
  d.qk_nope_head_dim = g.qk_nope_head_dim;
  d.qk_rope_head_dim = g.qk_rope_head_dim;
  d.v_head_dim = g.v_head_dim;
  d.latent_dim = g.latent_dim;
  d.index_head_dim = g.index_head_dim;
  return d;
}

Result<RecordFormat> BuildFormat(std::string_view name, const Geometry& g, std::string_view field) {
  return BuildFormat(name, FormatDimsOf(g), field);
}

Result<RecordFormat> BuildFormat(std::string_view name, const FormatDims& g, std::string_view field) {
  const FormatDef* def = nullptr;
  for (const FormatDef& d : kFormats) {
    if (name == d.name) def = &d;
  }
  if (def == nullptr) {
    std::string known;
    for (const FormatDef& d : kFormats) known += (known.empty() ? "" : ", ") + std::string(d.name);
    return NotFound(std::string(field), "unknown format \"" + std::string(name) + "\" (known: " + known + ")");
  }
  RecordFormat f;
  f.name = def->name;
  f.description = def->description;
  f.use = def->use;
  f.family = def->family;
  switch (def->use) {
    case FormatUse::kKv:
      TESSERA_RETURN_IF_ERROR(FillHeadRegions(def->id, g, field, f));
      break;
    case FormatUse::kIndexer:
      TESSERA_RETURN_IF_ERROR(FillIndexerRegions(def->id, g, field, f));
      break;
    default:
      TESSERA_RETURN_IF_ERROR(FillLatentRegions(def->id, g, field, f));
      break;
  }
  TESSERA_RETURN_IF_ERROR(CheckRegions(f, g, field));
  return f;
}

namespace {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

}  // namespace

float RegionView::Get(uint64_t i) const {
  const std::byte* b = bytes.data();
  switch (region->type) {
    case ElementType::kBf16: {
      uint16_t v;
      std::memcpy(&v, b + 2 * i, 2);
      return Bf16ToFloat(v);
    }
    case ElementType::kFp16: {
      uint16_t v;
      std::memcpy(&v, b + 2 * i, 2);
      return HalfToFloat(v);
    }
    case ElementType::kFp32: {
      float v;
      std::memcpy(&v, b + 4 * i, 4);
      return v;
    }
    case ElementType::kFp8E4M3:
      return DecodeE4M3(static_cast<uint8_t>(b[i]));
    case ElementType::kUe8m0:
      return DecodeUE8M0(static_cast<uint8_t>(b[i]));
    case ElementType::kFp4E2M1: {
      uint8_t byte = static_cast<uint8_t>(b[i / 2]);
      return DecodeE2M1(i % 2 == 0 ? byte & 0x0f : byte >> 4);
    }
    case ElementType::kPad8:
      return 0.0f;
  }
  return 0.0f;
}

Result<RegionView> RegionOf(const RecordFormat& format, const ConstRecordView& record, std::string_view name) {
  std::array<uint64_t, 4> bits_in_plane{};
  for (const Region& r : format.regions) {
    const uint32_t plane = format.packing == Packing::kPerToken ? 0 : r.plane;
    if (plane >= record.plane_count) return InvalidArgument("record", "the view has fewer planes than " + format.name);
    const uint64_t offset_bits = bits_in_plane[plane];
    bits_in_plane[plane] += r.bits();
    if (r.name != name) continue;
    if (offset_bits % 8 != 0) return InvalidArgument("region", "region " + r.name + " does not start on a byte");
    const uint64_t offset = offset_bits / 8, len = (r.bits() + 7) / 8;
    std::span<const std::byte> plane_bytes = record.planes[plane];
    if (offset + len > plane_bytes.size()) return InvalidArgument("record", "the view is smaller than " + format.name);
    return RegionView{&r, plane_bytes.subspan(offset, len)};
  }
  return NotFound("region", format.name + " has no region \"" + std::string(name) + "\"");
}

Status SetIndexerPacking(RecordFormat& format, Packing packing, std::string_view field) {
  const bool fp8 = format.family == FormatFamily::kIndexer && format.regions.size() == 2 &&
                   format.regions[0].type == ElementType::kFp8E4M3 && format.regions[1].type == ElementType::kFp32;
  if (!fp8) {
    return InvalidArgument(std::string(field), format.name + " has one page layout (indexer-fp8 has two)");
  }
  format.packing = packing;
  format.regions[1].plane = packing == Packing::kRegionMajor ? 1 : 0;
  return Status::Ok();
}

namespace {

// Calls f(plane bytes of the view, offset in the per-token bytes, length) for each plane.
template <typename View, typename F>
Status ForEachPlane(const RecordFormat& format, const View& record, uint64_t size, F f) {
  if (size != format.record_bytes()) {
    return InvalidArgument("bytes", "a " + format.name + " record is " + std::to_string(format.record_bytes()) + " B");
  }
  const uint32_t planes = format.packing == Packing::kPerToken ? 1 : format.plane_count();
  if (planes > record.plane_count || planes > record.planes.size()) {
    return InvalidArgument("record", "the view has fewer planes than " + format.name);
  }
  uint64_t offset = 0;
  for (uint32_t p = 0; p < planes; ++p) {
    const uint64_t len = planes == 1 ? format.record_bytes() : format.plane_bytes(p);
    if (record.planes[p].size() < len) return InvalidArgument("record", "the view is smaller than " + format.name);
    f(record.planes[p].first(len), offset, len);
    offset += len;
  }
  return Status::Ok();
}

bool IsIndexerFp8(const RecordFormat& f) {
  return f.family == FormatFamily::kIndexer && f.regions.size() == 2 && f.regions[1].type == ElementType::kFp32;
}

}  // namespace

Status CopyRecordOut(const RecordFormat& format, const ConstRecordView& record, std::span<std::byte> bytes) {
  return ForEachPlane(format, record, bytes.size(), [&](std::span<const std::byte> plane, uint64_t off, uint64_t len) {
    std::memcpy(bytes.data() + off, plane.data(), len);
  });
}

Status CopyRecordIn(const RecordFormat& format, std::span<const std::byte> bytes, const RecordView& record) {
  return ForEachPlane(format, record, bytes.size(), [&](std::span<std::byte> plane, uint64_t off, uint64_t len) {
    std::memcpy(plane.data(), bytes.data() + off, len);
  });
}

Status WriteIndexerFp8(const RecordFormat& format, std::span<const float> key, const RecordView& record) {
  if (!IsIndexerFp8(format)) return InvalidArgument("indexer-format", format.name + " is not indexer-fp8");
  std::vector<std::byte> bytes(format.record_bytes());
  TESSERA_RETURN_IF_ERROR(QuantizeIndexerFp8(key, bytes, format.scale_format.value_or(ScaleFormat::kUe8m0)));
  return CopyRecordIn(format, bytes, record);
}

Status ReadIndexerFp8(const RecordFormat& format, const ConstRecordView& record, std::span<float> key) {
  if (!IsIndexerFp8(format)) return InvalidArgument("indexer-format", format.name + " is not indexer-fp8");
  std::vector<std::byte> bytes(format.record_bytes());
  TESSERA_RETURN_IF_ERROR(CopyRecordOut(format, record, bytes));
  return DequantizeIndexerFp8(bytes, key);
}

}  // namespace tessera

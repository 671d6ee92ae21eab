// GeometryFromConfigJson: a config.json, read by concept — the model object (unwrapping
// multimodal wrappers), the layer counts, the attention family's dims (DeepSeek-V4, MLA,
// MHA/GQA), the per-layer attention kinds (layer_kinds.h), then the layers and their caches.

#include <algorithm>
#include <array>
#include <numeric>
#include <optional>

#include "config_json.h"
#include "layer_kinds.h"
#include "tessera/checked.h"
#include "tessera/geometry.h"

namespace tessera {
namespace {

using config_json::CountRule;
using config_json::Describe;
using config_json::Has;
using config_json::json;
using layer_kinds::Attention;

// Main plus MTP layers, as the LayerSpec list is that long.
constexpr uint64_t kMaxLayers = 100000;
// A linear-attention state of more elements than this is refused (its bytes must fit 64 bits).
constexpr uint64_t kMaxStateElements = uint64_t{1} << 56;
// DeepSeek-V4 reference model: a layer with compress_ratio r > 0 has a compressor; the
// compressor overlaps consecutive groups (coff = 2) and the layer has a lightning indexer
// exactly when r == 4 (CSA); otherwise it is HCA (coff = 1, no indexer).
constexpr uint32_t kSparseRatio = 4;

// The object of the model's config and how its fields are named in errors (a wrapper's key
// prefixes them: "text_config.num_hidden_layers").
struct Config {
  const json& cfg;
  std::string prefix;

  std::string Name(std::string_view field) const { return prefix + std::string(field); }
  bool Has(std::string_view field) const { return config_json::Has(cfg, field); }
  Result<uint32_t> Count(std::string_view field, CountRule rule = {}) const {
    return config_json::ReadCount(cfg, field, rule, Name(field));
  }
  Result<uint32_t> Required(std::string_view field) const { return Count(field, {.required = true}); }
  // An error on a field, named with the prefix.
  Status Invalid(std::string_view field, std::string message) const {
    return InvalidArgument(Name(field), std::move(message));
  }
  Status Relabel(Status s) const {
    if (s.ok() || prefix.empty() || s.field().rfind(prefix, 0) == 0) return s;
    return Status(s.code(), prefix + s.field(), s.message());
  }
};

// Multimodal checkpoints wrap the language model: the wrapper holds the vision/audio parts and
// the text model's config under one of these paths.
constexpr std::array<std::array<const char*, 2>, 4> kWrappers = {{
    {"text_config", nullptr},           // Kimi-K2.5/K3, Qwen3.5, Gemma-3/4, Llama-4, Step-3.7
    {"language_config", nullptr},       // DeepSeek-VL2
    {"llm_config", nullptr},            // InternVL
    {"thinker_config", "text_config"},  // Qwen2.5-Omni / Qwen3-Omni
}};

// The model's own object: the config itself, or the text model inside a wrapper when the config
// has no num_hidden_layers of its own.
Config ModelObject(const json& root, Geometry& g) {
  if (Has(root, "num_hidden_layers")) return {root, ""};
  for (const auto& path : kWrappers) {
    const json* obj = &root;
    std::string prefix;
    for (const char* key : path) {
      if (key == nullptr) break;
      auto it = obj->find(key);
      obj = it != obj->end() && it->is_object() ? &*it : nullptr;
      if (obj == nullptr) break;
      prefix += std::string(key) + ".";
    }
    if (obj == nullptr || !Has(*obj, "num_hidden_layers")) continue;
    g.notes.push_back("read " + prefix.substr(0, prefix.size() - 1) + " as the model (a multimodal wrapper" +
                      (root.contains("model_type") && root["model_type"].is_string()
                           ? " of model_type " + root["model_type"].get<std::string>()
                           : "") +
                      ")");
    return {*obj, prefix};
  }
  return {root, ""};
}

Status ReadModelType(const Config& c, const json& root, Geometry& g) {
  for (const auto& [obj, name] : {std::pair<const json*, std::string>{&c.cfg, c.Name("model_type")},
                                  std::pair<const json*, std::string>{&root, "model_type"}}) {
    if (!Has(*obj, "model_type")) continue;
    if (!(*obj)["model_type"].is_string()) return InvalidArgument(name, "must be a string");
    g.model_type = (*obj)["model_type"].get<std::string>();
    return Status::Ok();
  }
  return Status::Ok();
}

Status ReadLayerCounts(const Config& c, const json& root, Geometry& g) {
  TESSERA_ASSIGN_OR_RETURN(g.num_layers, c.Required("num_hidden_layers"));
  TESSERA_ASSIGN_OR_RETURN(g.num_attention_heads, c.Required("num_attention_heads"));
  // Step-3.5 calls its KV heads attention groups.
  TESSERA_ASSIGN_OR_RETURN(uint32_t groups, c.Count("num_attention_groups", {.fallback = g.num_attention_heads}));
  TESSERA_ASSIGN_OR_RETURN(g.num_kv_heads, c.Count("num_key_value_heads", {.fallback = groups}));
  TESSERA_ASSIGN_OR_RETURN(g.num_mtp_layers, c.Count("num_nextn_predict_layers", {.allow_zero = true}));
  const Config& pos = c.Has("max_position_embeddings") ? c : Config{root, ""};
  TESSERA_ASSIGN_OR_RETURN(uint32_t max_pos, pos.Count("max_position_embeddings", {.allow_zero = true}));
  g.max_position_embeddings = max_pos;
  if (g.num_layers > kMaxLayers) {
    return OutOfRange(c.Name("num_hidden_layers"), "value " + std::to_string(g.num_layers) + " is implausibly large");
  }
  if (uint64_t{g.num_layers} + g.num_mtp_layers > kMaxLayers) {
    return OutOfRange(c.Name("num_nextn_predict_layers"), "value " + std::to_string(g.num_mtp_layers) +
                                                              " is implausibly large (main plus MTP layers above " +
                                                              std::to_string(kMaxLayers) + ")");
  }
  return Status::Ok();
}

// Fields whose layers the ledger cannot price; refused rather than priced as something else.
struct Unsupported {
  const char* field;
  bool (*applies)(const json& v);
  const char* why;
};
constexpr Unsupported kUnsupported[] = {
    {"num_kv_shared_layers", [](const json& v) { return !v.is_number() || v.get<double>() != 0; },
     "layers that reuse another layer's K and V (Gemma-3n/4) are not modelled"},
    {"attention_k_eq_v", [](const json& v) { return !v.is_boolean() || v.get<bool>(); },
     "full-attention layers whose V is their K (Gemma-4) are not modelled"},
    {"no_rope_layers", [](const json&) { return true; }, "chunked local attention (Llama-4) is not modelled"},
};

Status RefuseUnsupported(const Config& c) {
  for (const Unsupported& u : kUnsupported) {
    if (c.Has(u.field) && u.applies(c.cfg[u.field])) {
      return c.Invalid(u.field, Describe(c.cfg[u.field]) + ": " + u.why);
    }
  }
  return Status::Ok();
}

// ---- DeepSeek-V4 ---------------------------------------------------------------------------

Status CheckCompressorSlot(const Config& c, const char* field, uint32_t coff, uint32_t dim, uint32_t& floats) {
  Checked f = Checked(2) * coff * dim;
  if (f.overflowed() || f.value() > UINT32_MAX) {
    return OutOfRange(c.Name(field), "value " + std::to_string(dim) + " is too large: a compressor slot of 2 x " +
                                         std::to_string(coff) + " x " + field + " floats does not fit in 32 bits");
  }
  floats = static_cast<uint32_t>(f.value());
  return Status::Ok();
}

Result<LayerSpec> V4Layer(const Config& c, const Geometry& g, size_t i, uint32_t r) {
  LayerSpec layer;
  layer.index = static_cast<uint32_t>(i);
  layer.is_mtp = i >= g.num_layers;
  layer.compress_ratio = r;
  layer.caches.push_back({CacheRole::kWindow, 0, g.sliding_window, 0});
  if (r == 0) {
    layer.kind = LayerKind::kSwa;
    return layer;
  }
  const bool sparse = r == kSparseRatio;
  const uint32_t coff = sparse ? 2 : 1;
  const uint32_t slots = coff * r;  // r <= 2^20
  uint32_t floats = 0;
  TESSERA_RETURN_IF_ERROR(CheckCompressorSlot(c, "head_dim", coff, g.head_dim, floats));
  layer.kind = sparse ? LayerKind::kCsa : LayerKind::kHca;
  layer.caches.push_back({CacheRole::kCompressed, r, 0, 0});
  layer.caches.push_back({CacheRole::kCompressorState, 0, slots, floats});
  if (sparse) {
    TESSERA_RETURN_IF_ERROR(CheckCompressorSlot(c, "index_head_dim", coff, g.index_head_dim, floats));
    layer.caches.push_back({CacheRole::kIndexer, r, 0, 0});
    layer.caches.push_back({CacheRole::kIndexerCompressorState, 0, slots, floats});
  }
  return layer;
}

Status BuildV4Layers(const Config& c, Geometry& g) {
  const json& ratios = c.cfg["compress_ratios"];
  const size_t total = static_cast<size_t>(g.num_layers) + g.num_mtp_layers;
  if (ratios.size() != g.num_layers && ratios.size() != total) {
    return c.Invalid("compress_ratios", "has " + std::to_string(ratios.size()) + " entries; expected " +
                                            std::to_string(g.num_layers) + " (num_hidden_layers) or " +
                                            std::to_string(total) + " (plus num_nextn_predict_layers)");
  }
  if (ratios.size() == g.num_layers && g.num_mtp_layers > 0) {
    g.notes.push_back("compress_ratios has no entry for the MTP layer(s); they are taken as sliding-window only");
  }
  for (size_t i = 0; i < total; ++i) {
    uint32_t r = 0;
    if (i < ratios.size()) {
      const json& v = ratios[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 20)) {
        return c.Invalid("compress_ratios",
                         "entry " + std::to_string(i) + " must be a non-negative integer (got " + Describe(v) + ")");
      }
      r = static_cast<uint32_t>(v.get<int64_t>());
    }
    if (r == 1) {
      return c.Invalid("compress_ratios", "entry " + std::to_string(i) + " is 1; use 0 for sliding-window-only layers");
    }
    TESSERA_ASSIGN_OR_RETURN(LayerSpec layer, V4Layer(c, g, i, r));
    g.layers.push_back(std::move(layer));
  }
  // Resuming a cached prefix under the recompute strategy re-runs the last `sliding_window`
  // tokens, and those rows are all that rebuilds the compressor state too. At a block boundary an
  // overlapping (CSA) compressor still needs the rows of the previous group of `ratio` tokens,
  // so a window shorter than that group would resume with rows it never rewrote.
  uint64_t rebuilt = 0;
  for (const LayerSpec& l : g.layers) {
    for (const CacheSpec& cs : l.caches) {
      if (cs.role == CacheRole::kCompressorState && cs.slots > l.compress_ratio) {
        rebuilt = std::max<uint64_t>(rebuilt, cs.slots - l.compress_ratio);
      }
    }
  }
  if (g.sliding_window < rebuilt) {
    return c.Invalid("sliding_window", std::to_string(g.sliding_window) + " is shorter than the " +
                                           std::to_string(rebuilt) +
                                           "-token compressor group a resumed prefix must rebuild");
  }
  return Status::Ok();
}

Status ReadV4(const Config& c, Geometry& g) {
  if (!c.cfg["compress_ratios"].is_array()) {
    return c.Invalid("compress_ratios", "must be a list of integers (got " + Describe(c.cfg["compress_ratios"]) + ")");
  }
  // One latent of head_dim (content + RoPE) shared by all heads.
  TESSERA_ASSIGN_OR_RETURN(g.head_dim, c.Required("head_dim"));
  TESSERA_ASSIGN_OR_RETURN(g.qk_rope_head_dim, c.Required("qk_rope_head_dim"));
  if (g.qk_rope_head_dim >= g.head_dim) {
    return c.Invalid("qk_rope_head_dim", std::to_string(g.qk_rope_head_dim) + " must be smaller than head_dim " +
                                             std::to_string(g.head_dim));
  }
  g.latent_dim = g.head_dim - g.qk_rope_head_dim;
  TESSERA_ASSIGN_OR_RETURN(g.qk_nope_head_dim, c.Count("qk_nope_head_dim", {.fallback = g.latent_dim}));
  TESSERA_ASSIGN_OR_RETURN(g.v_head_dim, c.Count("v_head_dim", {.fallback = g.head_dim}));
  TESSERA_ASSIGN_OR_RETURN(g.sliding_window, c.Required("sliding_window"));
  bool any_sparse = false;
  for (const json& v : c.cfg["compress_ratios"])
    any_sparse = any_sparse || (v.is_number_integer() && v.get<int64_t>() == kSparseRatio);
  const CountRule indexer{.required = any_sparse};
  TESSERA_ASSIGN_OR_RETURN(g.index_head_dim, c.Count("index_head_dim", indexer));
  TESSERA_ASSIGN_OR_RETURN(g.index_n_heads, c.Count("index_n_heads", indexer));
  TESSERA_ASSIGN_OR_RETURN(g.index_topk, c.Count("index_topk", indexer));
  return BuildV4Layers(c, g);
}

// ---- MLA and MHA/GQA dims ------------------------------------------------------------------

Status ReadMlaDims(const Config& c, Geometry& g) {
  TESSERA_ASSIGN_OR_RETURN(g.kv_lora_rank, c.Required("kv_lora_rank"));
  TESSERA_ASSIGN_OR_RETURN(g.qk_rope_head_dim, c.Required("qk_rope_head_dim"));
  TESSERA_ASSIGN_OR_RETURN(g.qk_nope_head_dim, c.Required("qk_nope_head_dim"));
  TESSERA_ASSIGN_OR_RETURN(g.v_head_dim, c.Required("v_head_dim"));
  g.latent_dim = g.kv_lora_rank;
  if (uint64_t{g.qk_nope_head_dim} + g.qk_rope_head_dim > UINT32_MAX) {
    return OutOfRange(c.Name("qk_nope_head_dim"), "qk_nope_head_dim + qk_rope_head_dim does not fit in 32 bits");
  }
  g.head_dim = g.qk_nope_head_dim + g.qk_rope_head_dim;
  if (c.Has("head_dim")) {
    TESSERA_ASSIGN_OR_RETURN(uint32_t hd, c.Count("head_dim"));
    if (g.qk_rope_head_dim > hd) {
      return c.Invalid("qk_rope_head_dim",
                       std::to_string(g.qk_rope_head_dim) + " exceeds head_dim " + std::to_string(hd));
    }
  }
  if (c.Has("index_topk")) {
    TESSERA_ASSIGN_OR_RETURN(g.index_head_dim, c.Required("index_head_dim"));
    TESSERA_ASSIGN_OR_RETURN(g.index_n_heads, c.Required("index_n_heads"));
    TESSERA_ASSIGN_OR_RETURN(g.index_topk, c.Required("index_topk"));
  }
  return Status::Ok();
}

Status ReadMhaDims(const Config& c, Geometry& g) {
  uint32_t default_head_dim = 0;
  if (c.Has("hidden_size")) {
    TESSERA_ASSIGN_OR_RETURN(uint32_t hidden, c.Count("hidden_size"));
    if (hidden % g.num_attention_heads != 0) {
      return c.Invalid("hidden_size", std::to_string(hidden) + " is not a multiple of num_attention_heads " +
                                          std::to_string(g.num_attention_heads));
    }
    default_head_dim = hidden / g.num_attention_heads;
  }
  TESSERA_ASSIGN_OR_RETURN(g.head_dim,
                           c.Count("head_dim", {.fallback = default_head_dim, .required = default_head_dim == 0}));
  if (g.num_kv_heads > g.num_attention_heads || g.num_attention_heads % g.num_kv_heads != 0) {
    return c.Invalid("num_key_value_heads", std::to_string(g.num_kv_heads) + " must divide num_attention_heads " +
                                                std::to_string(g.num_attention_heads));
  }
  if (c.Has("qk_rope_head_dim")) {
    TESSERA_ASSIGN_OR_RETURN(g.qk_rope_head_dim, c.Count("qk_rope_head_dim"));
    if (g.qk_rope_head_dim > g.head_dim) {
      return c.Invalid("qk_rope_head_dim",
                       std::to_string(g.qk_rope_head_dim) + " exceeds head_dim " + std::to_string(g.head_dim));
    }
  }
  // MiMo-V2 sizes V apart from K (head_dim 192, v_head_dim 128).
  TESSERA_ASSIGN_OR_RETURN(g.v_head_dim, c.Count("v_head_dim", {.fallback = g.head_dim}));
  return Status::Ok();
}

// Per-kind K/V dims that differ from the model's: each field overrides heads, K or V width of
// the layers of one kind.
enum DimPart : uint8_t { kHeads = 1, kK = 2, kV = 4 };
struct DimField {
  const char* object;  // nullptr: a top-level field
  const char* field;
  Attention kind;
  uint8_t parts;
};
constexpr DimField kDimFields[] = {
    {nullptr, "swa_num_key_value_heads", Attention::kSliding, kHeads},  // MiMo-V2
    {nullptr, "swa_head_dim", Attention::kSliding, kK},
    {nullptr, "swa_v_head_dim", Attention::kSliding, kV},
    {"attention_other_setting", "num_attention_groups", Attention::kSliding, kHeads},  // Step-3.5
    {"attention_other_setting", "head_dim", Attention::kSliding, kK | kV},
    {nullptr, "num_global_key_value_heads", Attention::kFull, kHeads},  // Gemma-4
    {nullptr, "global_head_dim", Attention::kFull, kK | kV},
};

Result<KvDims> KvDimsOf(const Config& c, const Geometry& g, Attention kind) {
  KvDims d{g.num_kv_heads, g.head_dim, g.v_head_dim};
  for (const DimField& f : kDimFields) {
    if (f.kind != kind) continue;
    const json* obj = &c.cfg;
    std::string name = c.Name(f.field);
    if (f.object != nullptr) {
      if (!c.Has(f.object)) continue;
      obj = &c.cfg[f.object];
      name = c.Name(std::string(f.object) + "." + f.field);
      if (!obj->is_object()) return InvalidArgument(c.Name(f.object), "must be an object (got " + Describe(*obj) + ")");
    }
    if (!Has(*obj, f.field)) continue;
    TESSERA_ASSIGN_OR_RETURN(uint32_t v, config_json::ReadCount(*obj, f.field, {}, name));
    if ((f.parts & kHeads) != 0) d.kv_heads = v;
    if ((f.parts & kK) != 0) d.k_head_dim = v;
    if ((f.parts & kV) != 0) d.v_head_dim = v;
  }
  return d;
}

// ---- Linear attention state ----------------------------------------------------------------

Result<StateDtype> ModelDtype(const Config& c, Geometry& g) {
  for (const char* field : {"dtype", "torch_dtype"}) {
    if (!c.Has(field)) continue;
    const json& v = c.cfg[field];
    if (v.is_string()) {
      const std::string& s = v.get_ref<const std::string&>();
      if (s == "bfloat16") return StateDtype::kBf16;
      if (s == "float16") return StateDtype::kFp16;
      if (s == "float32") return StateDtype::kFp32;
    }
    return c.Invalid(field, "is " + Describe(v) + "; known: bfloat16, float16, float32");
  }
  g.notes.push_back("the config names no dtype; linear-attention state priced in bfloat16");
  return StateDtype::kBf16;
}

Result<uint64_t> StateElements(const Config& c, const char* field, std::initializer_list<uint64_t> factors) {
  Checked n(1);
  for (uint64_t f : factors) n = n * f;
  if (n.overflowed() || n.value() > kMaxStateElements) {
    return OutOfRange(c.Name(field), "the linear-attention state it sizes exceeds 2^56 elements");
  }
  return n.value();
}

Result<uint32_t> ConvKernel(const json& obj, const char* field, const std::string& name) {
  TESSERA_ASSIGN_OR_RETURN(uint32_t k, config_json::ReadCount(obj, field, {.required = true}, name));
  if (k < 2) return InvalidArgument(name, "must be at least 2 (a convolution keeps kernel - 1 rows)");
  return k;
}

// Kimi Delta Attention: linear_attn_config {num_heads, head_dim, short_conv_kernel_size}.
Result<LinearStateDims> KdaState(const Config& c, StateDtype dtype) {
  const json& lac = c.cfg["linear_attn_config"];
  const std::string p = c.Name("linear_attn_config.");
  TESSERA_ASSIGN_OR_RETURN(uint32_t heads,
                           config_json::ReadCount(lac, "num_heads", {.required = true}, p + "num_heads"));
  TESSERA_ASSIGN_OR_RETURN(uint32_t dim, config_json::ReadCount(lac, "head_dim", {.required = true}, p + "head_dim"));
  TESSERA_ASSIGN_OR_RETURN(uint32_t kernel, ConvKernel(lac, "short_conv_kernel_size", p + "short_conv_kernel_size"));
  LinearStateDims s;
  s.rule = "kda";
  // Three short convolutions (q, k, v), each heads x head_dim wide.
  TESSERA_ASSIGN_OR_RETURN(s.conv_elements, StateElements(c, "linear_attn_config", {3, heads, dim, kernel - 1u}));
  TESSERA_ASSIGN_OR_RETURN(s.recurrent_elements, StateElements(c, "linear_attn_config", {heads, dim, dim}));
  s.conv_dtype = dtype;
  s.recurrent_dtype = StateDtype::kFp32;
  s.shard_heads = heads;
  return s;
}

// Gated DeltaNet: linear_num_key_heads / linear_num_value_heads / linear_key_head_dim /
// linear_value_head_dim / linear_conv_kernel_dim.
Result<LinearStateDims> GatedDeltaNetState(const Config& c, StateDtype dtype) {
  TESSERA_ASSIGN_OR_RETURN(uint32_t nk, c.Required("linear_num_key_heads"));
  TESSERA_ASSIGN_OR_RETURN(uint32_t nv, c.Required("linear_num_value_heads"));
  TESSERA_ASSIGN_OR_RETURN(uint32_t dk, c.Required("linear_key_head_dim"));
  TESSERA_ASSIGN_OR_RETURN(uint32_t dv, c.Required("linear_value_head_dim"));
  TESSERA_ASSIGN_OR_RETURN(uint32_t kernel,
                           ConvKernel(c.cfg, "linear_conv_kernel_dim", c.Name("linear_conv_kernel_dim")));
  Checked width = Checked(2) * nk * dk + Checked(nv) * dv;
  if (width.overflowed()) return OutOfRange(c.Name("linear_num_key_heads"), "the convolution width overflows 64 bits");
  LinearStateDims s;
  s.rule = "gated-deltanet";
  TESSERA_ASSIGN_OR_RETURN(s.conv_elements, StateElements(c, "linear_conv_kernel_dim", {width.value(), kernel - 1u}));
  TESSERA_ASSIGN_OR_RETURN(s.recurrent_elements, StateElements(c, "linear_num_value_heads", {nv, dv, dk}));
  s.conv_dtype = dtype;
  s.recurrent_dtype = dtype;
  s.shard_heads = std::gcd(nk, nv);
  return s;
}

Result<LinearStateDims> LinearState(const Config& c, Geometry& g) {
  TESSERA_ASSIGN_OR_RETURN(StateDtype dtype, ModelDtype(c, g));
  if (c.Has("linear_attn_config") && c.cfg["linear_attn_config"].is_object() &&
      Has(c.cfg["linear_attn_config"], "num_heads")) {
    return KdaState(c, dtype);
  }
  if (c.Has("linear_num_value_heads")) return GatedDeltaNetState(c, dtype);
  return c.Invalid("linear_attn_config",
                   "linear-attention layers need their state dims (linear_attn_config.num_heads / head_dim / "
                   "short_conv_kernel_size, or linear_num_key_heads / linear_num_value_heads / ...); none given");
}

// ---- The layers ----------------------------------------------------------------------------

struct KindDims {
  KvDims full, sliding;
  LinearStateDims linear;
  uint32_t window = 0;
};

Result<KindDims> DimsOfKinds(const Config& c, Geometry& g, const layer_kinds::Kinds& kinds) {
  KindDims d;
  const auto has = [&](Attention a) {
    return std::find(kinds.per_layer.begin(), kinds.per_layer.end(), a) != kinds.per_layer.end();
  };
  if (!g.is_mla) {
    TESSERA_ASSIGN_OR_RETURN(d.full, KvDimsOf(c, g, Attention::kFull));
  }
  if (has(Attention::kSliding)) {
    if (g.is_mla) {
      return c.Invalid(kinds.field, "sliding-window layers of an MLA model (kv_lora_rank) are not modelled");
    }
    TESSERA_ASSIGN_OR_RETURN(d.sliding, KvDimsOf(c, g, Attention::kSliding));
    const char* field =
        c.Has("sliding_window") || !c.Has("sliding_window_size") ? "sliding_window" : "sliding_window_size";
    TESSERA_ASSIGN_OR_RETURN(d.window, c.Required(field));
    g.sliding_window = d.window;
  }
  if (has(Attention::kLinear)) {
    TESSERA_ASSIGN_OR_RETURN(d.linear, LinearState(c, g));
  }
  return d;
}

Status CheckKvDims(const Config& c, const KvDims& d) {
  if (d.kv_heads == 0 || d.k_head_dim == 0 || d.v_head_dim == 0) {
    return c.Invalid("num_key_value_heads", "a layer's K/V dims must be positive");
  }
  return Status::Ok();
}

LayerSpec FullLayer(const Geometry& g, const KindDims& d) {
  LayerSpec layer;
  const bool sparse = g.index_topk > 0;
  if (!g.is_mla) {
    layer.kind = LayerKind::kMha;
    layer.kv = d.full;
    layer.caches.push_back({CacheRole::kKv, 1, 0, 0});
    return layer;
  }
  layer.kind = sparse ? LayerKind::kMlaSparse : LayerKind::kMla;
  layer.caches.push_back({CacheRole::kLatent, 1, 0, 0});
  if (sparse) layer.caches.push_back({CacheRole::kIndexer, 1, 0, 0});
  return layer;
}

std::string KindSummary(const Geometry& g) {
  std::string out;
  for (LayerKind k :
       {LayerKind::kMha, LayerKind::kMla, LayerKind::kMlaSparse, LayerKind::kSliding, LayerKind::kLinear}) {
    const uint32_t n = g.CountLayers(k, false);
    if (n == 0) continue;
    out += (out.empty() ? "" : ", ") + std::to_string(n) + " " + std::string(LayerKindName(k));
  }
  return out;
}

Status BuildLayers(const Config& c, Geometry& g, const layer_kinds::Kinds& kinds) {
  TESSERA_ASSIGN_OR_RETURN(KindDims d, DimsOfKinds(c, g, kinds));
  const uint32_t total = g.num_layers + g.num_mtp_layers;
  if (!kinds.field.empty() && kinds.per_layer.size() < total) {
    g.notes.push_back(kinds.field + " has no entry for the MTP layer(s); they are taken as full attention");
  }
  for (uint32_t i = 0; i < total; ++i) {
    const Attention kind = i < kinds.per_layer.size() ? kinds.per_layer[i] : Attention::kFull;
    LayerSpec layer;
    if (kind == Attention::kSliding) {
      layer.kind = LayerKind::kSliding;
      layer.kv = d.sliding;
      layer.window = d.window;
      layer.caches.push_back({CacheRole::kWindow, 0, d.window, 0});
    } else if (kind == Attention::kLinear) {
      layer.kind = LayerKind::kLinear;
      layer.linear = d.linear;
      layer.caches.push_back({CacheRole::kLinearState, 0, 1, 0});
    } else {
      layer = FullLayer(g, d);
    }
    if (layer.kind == LayerKind::kMha || layer.kind == LayerKind::kSliding)
      TESSERA_RETURN_IF_ERROR(CheckKvDims(c, layer.kv));
    layer.index = i;
    layer.is_mtp = i >= g.num_layers;
    g.layers.push_back(std::move(layer));
  }
  g.layer_kinds_field = kinds.field;
  if (!kinds.field.empty()) g.notes.push_back("layer kinds from " + c.Name(kinds.field) + ": " + KindSummary(g));
  return Status::Ok();
}

Result<Geometry> ReadGeometry(const json& root, std::string_view text, std::string_view source) {
  Geometry g;
  g.name = std::string(source);
  g.config_sha256 = Sha256Hex(text);
  const Config c = ModelObject(root, g);
  TESSERA_RETURN_IF_ERROR(ReadModelType(c, root, g));
  TESSERA_RETURN_IF_ERROR(ReadLayerCounts(c, root, g));
  TESSERA_RETURN_IF_ERROR(RefuseUnsupported(c));
  g.is_hybrid = c.Has("compress_ratios");
  g.is_mla = c.Has("kv_lora_rank") || g.is_hybrid;
  if (g.is_hybrid) {
    TESSERA_RETURN_IF_ERROR(ReadV4(c, g));
    return g;
  }
  Result<layer_kinds::Kinds> kinds = layer_kinds::Read(c.cfg, g.num_layers, g.num_layers + g.num_mtp_layers);
  if (!kinds.ok()) return c.Relabel(kinds.status());
  TESSERA_RETURN_IF_ERROR(g.is_mla ? ReadMlaDims(c, g) : ReadMhaDims(c, g));
  TESSERA_RETURN_IF_ERROR(BuildLayers(c, g, *kinds));
  return g;
}

}  // namespace

Result<Geometry> GeometryFromConfigJson(std::string_view json_text, std::string_view source) {
  TESSERA_ASSIGN_OR_RETURN(json root, config_json::Parse(json_text, source));
  return ReadGeometry(root, json_text, source);
}

}  // namespace tessera

#include "tessera/geometry.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "embedded.h"
#include "tessera/checked.h"
#include "tessera/file_io.h"

namespace tessera {

using nlohmann::json;

std::string_view LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kMha:
      return "mha";
    case LayerKind::kMla:
      return "mla";
    case LayerKind::kMlaSparse:
      return "dsa";
    case LayerKind::kSwa:
      return "swa";
    case LayerKind::kCsa:
      return "csa";
    case LayerKind::kHca:
      return "hca";
  }
  return "?";
}

std::string_view CacheRoleName(CacheRole role) {
  switch (role) {
    case CacheRole::kKv:
      return "kv";
    case CacheRole::kLatent:
      return "latent";
    case CacheRole::kCompressed:
      return "compressed";
    case CacheRole::kIndexer:
      return "indexer";
    case CacheRole::kWindow:
      return "window";
    case CacheRole::kCompressorState:
      return "compressor_state";
    case CacheRole::kIndexerCompressorState:
      return "indexer_compressor_state";
  }
  return "?";
}

bool IsPaged(CacheRole role) {
  return role == CacheRole::kKv || role == CacheRole::kLatent || role == CacheRole::kCompressed ||
         role == CacheRole::kIndexer;
}

uint32_t Geometry::CountLayers(LayerKind kind, bool include_mtp) const {
  uint32_t n = 0;
  for (const LayerSpec& l : layers) {
    if (l.kind == kind && (include_mtp || !l.is_mtp)) ++n;
  }
  return n;
}

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(static_cast<size_t>(len) * 2);
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

namespace {

// Bounds on the text itself, checked before it is parsed: a config.json is a few KiB with objects
// nested a handful of levels (quantization_config). Deeper nesting is refused up front because
// nlohmann's dump and copy recurse once per level.
constexpr size_t kMaxConfigBytes = kMaxInputFileBytes;
constexpr int kMaxConfigDepth = 64;
// Main plus MTP layers, as the LayerSpec list is that long.
constexpr uint64_t kMaxLayers = 100000;

// A value quoted in an error: scalars as JSON (cut to 40 characters), containers by kind only,
// so that a message never walks (or recurses into) a large or deep value.
std::string Describe(const json& v) {
  if (v.is_array()) return "a list of " + std::to_string(v.size()) + " entries";
  if (v.is_object()) return "an object";
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

// The byte offset where the nesting of [ and { (outside strings) first goes past `limit`, or
// npos. Malformed text is left for the parser to reject.
size_t DepthExceededAt(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return i;
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
    }
  }
  return std::string_view::npos;
}

// Reads an optional non-negative integer field. Absent or null -> `fallback`.
// Present but not an integer (string, fraction, bool, negative, > 2^32) -> error naming it.
Result<uint32_t> ReadCount(const json& cfg, const char* field, uint32_t fallback, bool required, bool allow_zero) {
  auto it = cfg.find(field);
  if (it == cfg.end() || it->is_null()) {
    if (required) return InvalidArgument(field, "missing from config.json");
    return fallback;
  }
  const json& v = *it;
  int64_t n = 0;
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > UINT32_MAX) return OutOfRange(field, "value " + Describe(v) + " is too large");
    n = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    n = v.get<int64_t>();
  } else if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::floor(d) != d || d < 0 || d > UINT32_MAX) {
      return InvalidArgument(field, "must be a " + std::string(allow_zero ? "non-negative" : "positive") +
                                        " integer (got " + Describe(v) + ")");
    }
    n = static_cast<int64_t>(d);
  } else {
    return InvalidArgument(field, "must be a " + std::string(allow_zero ? "non-negative" : "positive") +
                                      " integer (got " + Describe(v) + ")");
  }
  if (n < 0 || (!allow_zero && n == 0)) {
    return InvalidArgument(field, "must be a " + std::string(allow_zero ? "non-negative" : "positive") +
                                      " integer (got " + Describe(v) + ")");
  }
  if (n > UINT32_MAX) return OutOfRange(field, "value " + Describe(v) + " is too large");
  return static_cast<uint32_t>(n);
}

bool Has(const json& cfg, const char* field) {
  auto it = cfg.find(field);
  return it != cfg.end() && !it->is_null();
}

// DeepSeek-V4 reference model: a layer with compress_ratio r > 0 has a compressor; the
// compressor overlaps consecutive groups (coff = 2) and the layer has a lightning indexer
// exactly when r == 4 (CSA); otherwise it is HCA (coff = 1, no indexer).
constexpr uint32_t kSparseRatio = 4;

Status BuildHybridLayers(const json& cfg, Geometry& g) {
  const json& ratios = cfg["compress_ratios"];
  if (!ratios.is_array())
    return InvalidArgument("compress_ratios", "must be a list of integers (got " + Describe(ratios) + ")");
  size_t total = static_cast<size_t>(g.num_layers) + g.num_mtp_layers;
  if (ratios.size() != g.num_layers && ratios.size() != total) {
    return InvalidArgument("compress_ratios", "has " + std::to_string(ratios.size()) + " entries; expected " +
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
        return InvalidArgument("compress_ratios", "entry " + std::to_string(i) +
                                                      " must be a non-negative integer (got " + Describe(v) + ")");
      }
      r = static_cast<uint32_t>(v.get<int64_t>());
    }
    if (r == 1) {
      return InvalidArgument("compress_ratios",
                             "entry " + std::to_string(i) + " is 1; use 0 for sliding-window-only layers");
    }
    LayerSpec layer;
    layer.index = static_cast<uint32_t>(i);
    layer.is_mtp = i >= g.num_layers;
    layer.compress_ratio = r;
    layer.caches.push_back({CacheRole::kWindow, 0, g.sliding_window, 0});
    if (r == 0) {
      layer.kind = LayerKind::kSwa;
    } else {
      bool sparse = r == kSparseRatio;
      uint32_t coff = sparse ? 2 : 1;
      uint32_t slots = coff * r;  // r <= 2^20
      // A compressor slot holds 2 x coff x dim float32 values, counted in 32 bits.
      Checked floats = Checked(2) * coff * g.head_dim;
      if (floats.overflowed() || floats.value() > UINT32_MAX) {
        return OutOfRange("head_dim", "value " + std::to_string(g.head_dim) +
                                          " is too large: a compressor slot of 2 x " + std::to_string(coff) +
                                          " x head_dim floats does not fit in 32 bits");
      }
      layer.kind = sparse ? LayerKind::kCsa : LayerKind::kHca;
      layer.caches.push_back({CacheRole::kCompressed, r, 0, 0});
      layer.caches.push_back({CacheRole::kCompressorState, 0, slots, static_cast<uint32_t>(floats.value())});
      if (sparse) {
        Checked ifloats = Checked(2) * coff * g.index_head_dim;
        if (ifloats.overflowed() || ifloats.value() > UINT32_MAX) {
          return OutOfRange("index_head_dim", "value " + std::to_string(g.index_head_dim) +
                                                  " is too large: an indexer compressor slot of 2 x " +
                                                  std::to_string(coff) +
                                                  " x index_head_dim floats does not fit in 32 bits");
        }
        layer.caches.push_back({CacheRole::kIndexer, r, 0, 0});
        layer.caches.push_back({CacheRole::kIndexerCompressorState, 0, slots, static_cast<uint32_t>(ifloats.value())});
      }
    }
    g.layers.push_back(std::move(layer));
  }
  // Resuming a cached prefix under the recompute strategy re-runs the last `sliding_window`
  // tokens, and those rows are all that rebuilds the compressor state too. At a block boundary an
  // overlapping (CSA) compressor still needs the rows of the previous group of `ratio` tokens,
  // so a window shorter than that group would resume with rows it never rewrote.
  uint64_t rebuilt = 0;
  for (const LayerSpec& l : g.layers) {
    for (const CacheSpec& c : l.caches) {
      if (c.role == CacheRole::kCompressorState && c.slots > l.compress_ratio) {
        rebuilt = std::max<uint64_t>(rebuilt, c.slots - l.compress_ratio);
      }
    }
  }
  if (g.sliding_window < rebuilt) {
    return InvalidArgument("sliding_window", std::to_string(g.sliding_window) + " is shorter than the " +
                                                 std::to_string(rebuilt) +
                                                 "-token compressor group a resumed prefix must rebuild");
  }
  return Status::Ok();
}

}  // namespace

Result<Geometry> GeometryFromConfigJson(std::string_view json_text, std::string_view source) {
  if (json_text.size() > kMaxConfigBytes) {
    return OutOfRange("config", std::string(source) + " is " + std::to_string(json_text.size()) + " B, more than the " +
                                    std::to_string(kMaxConfigBytes) + " B a config.json may hold");
  }
  if (size_t at = DepthExceededAt(json_text, kMaxConfigDepth); at != std::string_view::npos) {
    return InvalidArgument("config", std::string(source) + " nests deeper than " + std::to_string(kMaxConfigDepth) +
                                         " levels (byte " + std::to_string(at) + ")");
  }
  json cfg;
  try {
    cfg = json::parse(json_text.begin(), json_text.end());
  } catch (const json::parse_error& e) {
    return InvalidArgument("config", std::string(source) + " is not valid JSON (byte " + std::to_string(e.byte) + ")");
  } catch (const json::exception& e) {
    // A number beyond double's range (out_of_range 406) and the like.
    return InvalidArgument("config",
                           std::string(source) + " is not usable JSON (nlohmann error " + std::to_string(e.id) + ")");
  }
  if (!cfg.is_object()) return InvalidArgument("config", std::string(source) + " must hold a JSON object");

  Geometry g;
  g.name = std::string(source);
  g.config_sha256 = Sha256Hex(json_text);
  if (Has(cfg, "model_type")) {
    if (!cfg["model_type"].is_string()) return InvalidArgument("model_type", "must be a string");
    g.model_type = cfg["model_type"].get<std::string>();
  }

  TESSERA_ASSIGN_OR_RETURN(g.num_layers, ReadCount(cfg, "num_hidden_layers", 0, true, false));
  TESSERA_ASSIGN_OR_RETURN(g.num_attention_heads, ReadCount(cfg, "num_attention_heads", 0, true, false));
  TESSERA_ASSIGN_OR_RETURN(g.num_kv_heads, ReadCount(cfg, "num_key_value_heads", g.num_attention_heads, false, false));
  TESSERA_ASSIGN_OR_RETURN(g.num_mtp_layers, ReadCount(cfg, "num_nextn_predict_layers", 0, false, true));
  TESSERA_ASSIGN_OR_RETURN(uint32_t max_pos, ReadCount(cfg, "max_position_embeddings", 0, false, true));
  g.max_position_embeddings = max_pos;
  if (g.num_layers > kMaxLayers)
    return OutOfRange("num_hidden_layers", "value " + std::to_string(g.num_layers) + " is implausibly large");
  // Main plus MTP layers are counted in 32 bits and listed one by one.
  if (uint64_t{g.num_layers} + g.num_mtp_layers > kMaxLayers) {
    return OutOfRange("num_nextn_predict_layers", "value " + std::to_string(g.num_mtp_layers) +
                                                      " is implausibly large (main plus MTP layers above " +
                                                      std::to_string(kMaxLayers) + ")");
  }

  g.is_hybrid = Has(cfg, "compress_ratios");
  g.is_mla = Has(cfg, "kv_lora_rank") || g.is_hybrid;

  if (g.is_hybrid) {
    if (!cfg["compress_ratios"].is_array()) {
      return InvalidArgument("compress_ratios",
                             "must be a list of integers (got " + Describe(cfg["compress_ratios"]) + ")");
    }
    // DeepSeek-V4: one latent of head_dim (content + RoPE) shared by all heads.
    TESSERA_ASSIGN_OR_RETURN(g.head_dim, ReadCount(cfg, "head_dim", 0, true, false));
    TESSERA_ASSIGN_OR_RETURN(g.qk_rope_head_dim, ReadCount(cfg, "qk_rope_head_dim", 0, true, false));
    if (g.qk_rope_head_dim >= g.head_dim) {
      return InvalidArgument("qk_rope_head_dim", std::to_string(g.qk_rope_head_dim) +
                                                     " must be smaller than head_dim " + std::to_string(g.head_dim));
    }
    g.latent_dim = g.head_dim - g.qk_rope_head_dim;
    TESSERA_ASSIGN_OR_RETURN(g.qk_nope_head_dim, ReadCount(cfg, "qk_nope_head_dim", g.latent_dim, false, false));
    TESSERA_ASSIGN_OR_RETURN(g.v_head_dim, ReadCount(cfg, "v_head_dim", g.head_dim, false, false));
    TESSERA_ASSIGN_OR_RETURN(g.sliding_window, ReadCount(cfg, "sliding_window", 0, true, false));
    bool any_sparse = false;
    for (const json& v : cfg["compress_ratios"])
      any_sparse = any_sparse || (v.is_number_integer() && v.get<int64_t>() == kSparseRatio);
    TESSERA_ASSIGN_OR_RETURN(g.index_head_dim, ReadCount(cfg, "index_head_dim", 0, any_sparse, false));
    TESSERA_ASSIGN_OR_RETURN(g.index_n_heads, ReadCount(cfg, "index_n_heads", 0, any_sparse, false));
    TESSERA_ASSIGN_OR_RETURN(g.index_topk, ReadCount(cfg, "index_topk", 0, any_sparse, false));
    TESSERA_RETURN_IF_ERROR(BuildHybridLayers(cfg, g));
    return g;
  }

  if (g.is_mla) {
    TESSERA_ASSIGN_OR_RETURN(g.kv_lora_rank, ReadCount(cfg, "kv_lora_rank", 0, true, false));
    TESSERA_ASSIGN_OR_RETURN(g.qk_rope_head_dim, ReadCount(cfg, "qk_rope_head_dim", 0, true, false));
    TESSERA_ASSIGN_OR_RETURN(g.qk_nope_head_dim, ReadCount(cfg, "qk_nope_head_dim", 0, true, false));
    TESSERA_ASSIGN_OR_RETURN(g.v_head_dim, ReadCount(cfg, "v_head_dim", 0, true, false));
    g.latent_dim = g.kv_lora_rank;
    if (uint64_t{g.qk_nope_head_dim} + g.qk_rope_head_dim > UINT32_MAX) {
      return OutOfRange("qk_nope_head_dim", "qk_nope_head_dim + qk_rope_head_dim does not fit in 32 bits");
    }
    g.head_dim = g.qk_nope_head_dim + g.qk_rope_head_dim;
    if (Has(cfg, "head_dim")) {
      TESSERA_ASSIGN_OR_RETURN(uint32_t hd, ReadCount(cfg, "head_dim", 0, false, false));
      if (g.qk_rope_head_dim > hd) {
        return InvalidArgument("qk_rope_head_dim",
                               std::to_string(g.qk_rope_head_dim) + " exceeds head_dim " + std::to_string(hd));
      }
    }
    bool sparse = Has(cfg, "index_topk");
    if (sparse) {
      TESSERA_ASSIGN_OR_RETURN(g.index_head_dim, ReadCount(cfg, "index_head_dim", 0, true, false));
      TESSERA_ASSIGN_OR_RETURN(g.index_n_heads, ReadCount(cfg, "index_n_heads", 0, true, false));
      TESSERA_ASSIGN_OR_RETURN(g.index_topk, ReadCount(cfg, "index_topk", 0, true, false));
    }
    uint32_t total = g.num_layers + g.num_mtp_layers;
    for (uint32_t i = 0; i < total; ++i) {
      LayerSpec layer;
      layer.index = i;
      layer.is_mtp = i >= g.num_layers;
      layer.kind = sparse ? LayerKind::kMlaSparse : LayerKind::kMla;
      layer.caches.push_back({CacheRole::kLatent, 1, 0, 0});
      if (sparse) layer.caches.push_back({CacheRole::kIndexer, 1, 0, 0});
      g.layers.push_back(std::move(layer));
    }
    return g;
  }

  // MHA / GQA.
  uint32_t default_head_dim = 0;
  if (Has(cfg, "hidden_size")) {
    TESSERA_ASSIGN_OR_RETURN(uint32_t hidden, ReadCount(cfg, "hidden_size", 0, false, false));
    if (hidden % g.num_attention_heads != 0) {
      return InvalidArgument("hidden_size", std::to_string(hidden) + " is not a multiple of num_attention_heads " +
                                                std::to_string(g.num_attention_heads));
    }
    default_head_dim = hidden / g.num_attention_heads;
  }
  TESSERA_ASSIGN_OR_RETURN(g.head_dim, ReadCount(cfg, "head_dim", default_head_dim, default_head_dim == 0, false));
  if (g.num_kv_heads > g.num_attention_heads || g.num_attention_heads % g.num_kv_heads != 0) {
    return InvalidArgument("num_key_value_heads", std::to_string(g.num_kv_heads) + " must divide num_attention_heads " +
                                                      std::to_string(g.num_attention_heads));
  }
  if (Has(cfg, "qk_rope_head_dim")) {
    TESSERA_ASSIGN_OR_RETURN(g.qk_rope_head_dim, ReadCount(cfg, "qk_rope_head_dim", 0, false, false));
    if (g.qk_rope_head_dim > g.head_dim) {
      return InvalidArgument("qk_rope_head_dim",
                             std::to_string(g.qk_rope_head_dim) + " exceeds head_dim " + std::to_string(g.head_dim));
    }
  }
  g.v_head_dim = g.head_dim;
  uint32_t total = g.num_layers + g.num_mtp_layers;
  for (uint32_t i = 0; i < total; ++i) {
    LayerSpec layer;
    layer.index = i;
    layer.is_mtp = i >= g.num_layers;
    layer.kind = LayerKind::kMha;
    layer.caches.push_back({CacheRole::kKv, 1, 0, 0});
    g.layers.push_back(std::move(layer));
  }
  return g;
}

Result<Geometry> LoadConfigFile(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, "config", kMaxConfigBytes));
  return GeometryFromConfigJson(text, path);
}

std::vector<std::string> PresetNames() {
  size_t n = 0;
  const data::EmbeddedFile* files = data::ModelFiles(&n);
  std::vector<std::string> names;
  for (size_t i = 0; i < n; ++i) names.emplace_back(files[i].name);
  return names;
}

Result<std::string> PresetConfigText(std::string_view name) {
  size_t n = 0;
  const data::EmbeddedFile* files = data::ModelFiles(&n);
  for (size_t i = 0; i < n; ++i) {
    if (files[i].name == name) return std::string(files[i].text);
  }
  std::string known;
  for (size_t i = 0; i < n; ++i) known += (i ? ", " : "") + std::string(files[i].name);
  return NotFound("model", "unknown preset \"" + std::string(name) + "\" (known: " + known + ")");
}

Result<Geometry> LoadPreset(std::string_view name) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, PresetConfigText(name));
  return GeometryFromConfigJson(text, name);
}

}  // namespace tessera

#include "layer_kinds.h"

#include <optional>
#include <string_view>

#include "config_json.h"

namespace tessera::layer_kinds {
namespace {

using config_json::Describe;
using config_json::Has;
using config_json::ReadCount;
using nlohmann::json;

// What one reader returns: nullopt when its field does not decide the kinds (absent, or an
// object carrying only dimensions).
using Found = Result<std::optional<Kinds>>;

Status CheckLength(std::string_view field, size_t got, uint32_t main_layers, uint32_t total_layers) {
  if (got == main_layers || got == total_layers) return Status::Ok();
  return InvalidArgument(
      std::string(field),
      "has " + std::to_string(got) + " entries; expected " + std::to_string(main_layers) + " (num_hidden_layers)" +
          (total_layers != main_layers ? " or " + std::to_string(total_layers) + " (plus num_nextn_predict_layers)"
                                       : ""));
}

struct TypeName {
  std::string_view name;
  Attention kind;
};
constexpr TypeName kLayerTypes[] = {
    {"full_attention", Attention::kFull},
    {"sliding_attention", Attention::kSliding},
    {"linear_attention", Attention::kLinear},
};

Found FromLayerTypes(const json& cfg, uint32_t main_layers, uint32_t total_layers) {
  const json& v = cfg["layer_types"];
  if (!v.is_array()) return InvalidArgument("layer_types", "must be a list of strings (got " + Describe(v) + ")");
  TESSERA_RETURN_IF_ERROR(CheckLength("layer_types", v.size(), main_layers, total_layers));
  Kinds k{{}, "layer_types"};
  for (size_t i = 0; i < v.size(); ++i) {
    const TypeName* found = nullptr;
    if (v[i].is_string()) {
      for (const TypeName& t : kLayerTypes) {
        if (v[i].get_ref<const std::string&>() == t.name) found = &t;
      }
    }
    if (found == nullptr) {
      return InvalidArgument("layer_types", "entry " + std::to_string(i) + " is " + Describe(v[i]) +
                                                "; known: full_attention, sliding_attention, linear_attention");
    }
    k.per_layer.push_back(found->kind);
  }
  return std::optional<Kinds>(std::move(k));
}

Found FromHybridPattern(const json& cfg, uint32_t main_layers, uint32_t total_layers) {
  const json& v = cfg["hybrid_layer_pattern"];
  if (!v.is_array())
    return InvalidArgument("hybrid_layer_pattern", "must be a list of 0 and 1 (got " + Describe(v) + ")");
  TESSERA_RETURN_IF_ERROR(CheckLength("hybrid_layer_pattern", v.size(), main_layers, total_layers));
  Kinds k{{}, "hybrid_layer_pattern"};
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number_integer() || (v[i].get<int64_t>() != 0 && v[i].get<int64_t>() != 1)) {
      return InvalidArgument("hybrid_layer_pattern", "entry " + std::to_string(i) + " is " + Describe(v[i]) +
                                                         "; 1 is a sliding-window layer, 0 a full-attention layer");
    }
    k.per_layer.push_back(v[i].get<int64_t>() == 1 ? Attention::kSliding : Attention::kFull);
  }
  return std::optional<Kinds>(std::move(k));
}

// Kimi's lists number layers from 1 (vLLM's kimi_linear.py, is_kda_layer: layer_idx + 1 in
// kda_layers). Either list may be given alone: the other is its complement.
Found FromLinearAttnConfig(const json& cfg, uint32_t main_layers, uint32_t) {
  const json& lac = cfg["linear_attn_config"];
  if (!lac.is_object()) return InvalidArgument("linear_attn_config", "must be an object (got " + Describe(lac) + ")");
  const bool has_kda = Has(lac, "kda_layers"), has_full = Has(lac, "full_attn_layers");
  if (!has_kda && !has_full) return std::optional<Kinds>();
  std::vector<int> kind(main_layers, -1);  // -1 unset, 0 full, 1 linear
  for (auto [list, value] : {std::pair{"kda_layers", 1}, std::pair{"full_attn_layers", 0}}) {
    if (!Has(lac, list)) continue;
    const std::string name = std::string("linear_attn_config.") + list;
    const json& v = lac[list];
    if (!v.is_array()) return InvalidArgument(name, "must be a list of layer numbers (got " + Describe(v) + ")");
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number_integer() || v[i].get<int64_t>() < 1 || v[i].get<int64_t>() > main_layers) {
        return InvalidArgument(name, "entry " + std::to_string(i) + " is " + Describe(v[i]) +
                                         "; layer numbers run from 1 to num_hidden_layers " +
                                         std::to_string(main_layers));
      }
      int& slot = kind[static_cast<size_t>(v[i].get<int64_t>() - 1)];
      if (slot != -1) {
        return InvalidArgument(name,
                               "layer " + Describe(v[i]) + " is listed twice (in kda_layers or full_attn_layers)");
      }
      slot = value;
    }
  }
  Kinds k{{}, "linear_attn_config"};
  for (size_t i = 0; i < kind.size(); ++i) {
    if (kind[i] == -1 && has_kda && has_full) {
      return InvalidArgument("linear_attn_config.full_attn_layers",
                             "layer " + std::to_string(i + 1) + " is in neither kda_layers nor full_attn_layers");
    }
    const bool linear = kind[i] == 1 || (kind[i] == -1 && !has_kda);
    k.per_layer.push_back(linear ? Attention::kLinear : Attention::kFull);
  }
  return std::optional<Kinds>(std::move(k));
}

// Every n-th layer (1-based) is `every`, the others `rest`.
Found FromInterval(const json& cfg, const char* field, Attention every, Attention rest, uint32_t main_layers) {
  TESSERA_ASSIGN_OR_RETURN(uint32_t n, ReadCount(cfg, field, {.required = true}));
  Kinds k{{}, field};
  for (uint32_t i = 0; i < main_layers; ++i) k.per_layer.push_back((i + 1) % n == 0 ? every : rest);
  return std::optional<Kinds>(std::move(k));
}

Found FromFullAttentionInterval(const json& cfg, uint32_t main_layers, uint32_t) {
  return FromInterval(cfg, "full_attention_interval", Attention::kFull, Attention::kLinear, main_layers);
}

Found FromSlidingWindowPattern(const json& cfg, uint32_t main_layers, uint32_t) {
  return FromInterval(cfg, "sliding_window_pattern", Attention::kFull, Attention::kSliding, main_layers);
}

// transformers' Qwen2: a layer slides when use_sliding_window and its index >= max_window_layers.
Found FromUseSlidingWindow(const json& cfg, uint32_t main_layers, uint32_t) {
  TESSERA_ASSIGN_OR_RETURN(bool use, config_json::ReadBool(cfg, "use_sliding_window", false));
  Kinds k{std::vector<Attention>(main_layers, Attention::kFull), "use_sliding_window"};
  if (!use) return std::optional<Kinds>(std::move(k));
  TESSERA_ASSIGN_OR_RETURN(uint32_t first, ReadCount(cfg, "max_window_layers", {.required = true, .allow_zero = true}));
  for (uint32_t i = first; i < main_layers; ++i) k.per_layer[i] = Attention::kSliding;
  return std::optional<Kinds>(std::move(k));
}

struct Source {
  const char* field;
  Found (*read)(const json& cfg, uint32_t main_layers, uint32_t total_layers);
};
// In order of precedence: an explicit per-layer list over a rule that generates one.
constexpr Source kSources[] = {
    {"layer_types", FromLayerTypes},
    {"hybrid_layer_pattern", FromHybridPattern},
    {"linear_attn_config", FromLinearAttnConfig},
    {"full_attention_interval", FromFullAttentionInterval},
    {"sliding_window_pattern", FromSlidingWindowPattern},
    {"use_sliding_window", FromUseSlidingWindow},
};

}  // namespace

Result<Kinds> Read(const json& cfg, uint32_t main_layers, uint32_t total_layers) {
  for (const Source& s : kSources) {
    if (!Has(cfg, s.field)) continue;
    TESSERA_ASSIGN_OR_RETURN(std::optional<Kinds> k, s.read(cfg, main_layers, total_layers));
    if (k.has_value()) return std::move(*k);
  }
  if (Has(cfg, "sliding_window")) {
    return InvalidArgument("sliding_window",
                           "is set, but which layers slide is not given (no layer_types, hybrid_layer_pattern, "
                           "sliding_window_pattern or use_sliding_window); refusing to price every layer as one kind");
  }
  return Kinds{std::vector<Attention>(main_layers, Attention::kFull), ""};
}

}  // namespace tessera::layer_kinds

// Which attention each layer of a (non-DeepSeek-V4) config runs, from the fields real configs
// use. Private to geometry.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/status.h"

namespace tessera::layer_kinds {

enum class Attention { kFull, kSliding, kLinear };

struct Kinds {
  // One entry per layer: the main layers, then the MTP layers when the field lists them too.
  std::vector<Attention> per_layer;
  std::string field;  // the field they came from; empty: no field, every layer full attention
};

// The kinds from the first of these fields the config carries (ADR 0033):
//   layer_types              "full_attention" | "sliding_attention" | "linear_attention" per layer
//                            (gpt-oss, Step-3.5, Gemma-3/4, Qwen3-Next/3.5);
//   hybrid_layer_pattern     1 = sliding window, 0 = full, per layer (MiMo-V2);
//   linear_attn_config       kda_layers / full_attn_layers, 1-based layer numbers (Kimi-Linear, K3);
//   full_attention_interval  every n-th layer full, the others linear (Qwen3-Next/3.5 without layer_types);
//   sliding_window_pattern   every n-th layer full, the others sliding (Gemma-3);
//   use_sliding_window       false: every layer full; true: layers >= max_window_layers slide (Qwen2).
// With none of them, a sliding_window is refused: which layers slide cannot be determined.
// A list must have `main_layers` or `total_layers` (main plus MTP) entries. Errors name the field.
Result<Kinds> Read(const nlohmann::json& cfg, uint32_t main_layers, uint32_t total_layers);

}  // namespace tessera::layer_kinds

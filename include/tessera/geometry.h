// Model geometry: per layer, the caches it keeps.
//
// A Geometry is built from a Hugging Face config.json (read for real; presets ship as such
// files inside the binary and go through the same reader). It is not one global attention
// enum: DeepSeek-V4 mixes sliding-window-only, CSA (ratio 4, with an indexer) and HCA
// (ratio 128) layers; gpt-oss, MiMo and Step interleave sliding-window and full-attention
// layers with their own head counts; Qwen3-Next/3.5 and Kimi-Linear/K3 interleave linear
// attention (a constant recurrent state) with full attention. So each LayerSpec lists its own
// caches, and the field the per-layer kinds were read from is kept (ADR 0033).
//
// Thread-safety: Geometry is a value; const access is safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/status.h"

namespace tessera {

enum class LayerKind {
  kMha,        // MHA / GQA: per-head K and V.
  kMla,        // dense MLA: one latent + RoPE record per token (DeepSeek-V2/V3, Kimi-K2).
  kMlaSparse,  // MLA with a lightning indexer and top-k selection (DeepSeek-V3.2 DSA).
  kSwa,        // DeepSeek-V4 compress ratio 0: sliding window only.
  kCsa,        // DeepSeek-V4 compressed sparse attention (overlapping compressor + indexer).
  kHca,        // DeepSeek-V4 heavily compressed attention (dense over compressed entries).
  kSliding,    // MHA / GQA attending a sliding window of `window` tokens: a ring of K and V.
  kLinear,     // linear attention (Gated DeltaNet, Kimi Delta Attention): a constant state.
};
std::string_view LayerKindName(LayerKind kind);

enum class CacheRole {
  kKv,                      // MHA K and V, one entry per token.
  kLatent,                  // MLA latent + RoPE, one entry per token.
  kCompressed,              // V4 compressed latent, one entry per `compress_ratio` tokens.
  kIndexer,                 // indexer keys, one entry per `compress_ratio` tokens.
  kWindow,                  // V4 sliding-window ring of raw records (per request, constant).
  kCompressorState,         // V4 compressor partial groups, float32 (per request, constant).
  kIndexerCompressorState,  // the indexer's own compressor state (per request, constant).
  kLinearState,             // linear attention's convolution rows and recurrent state (per request, constant).
};
std::string_view CacheRoleName(CacheRole role);
// True for caches that grow with the context and live in pages; false for per-request state.
bool IsPaged(CacheRole role);

struct CacheSpec {
  CacheRole role = CacheRole::kLatent;
  // Paged caches: tokens per entry (1 = one entry per token). 0 for per-request state.
  uint32_t compress_ratio = 1;
  // Per-request state: ring slots (window tokens, or compressor slots). 0 for paged caches.
  uint32_t slots = 0;
  // Compressor state: float32 values per slot (2 x coff x dim). 0 otherwise.
  uint32_t state_floats = 0;
};

// K and V of one MHA / GQA layer per token: kv_heads x (k_head_dim + v_head_dim) values.
struct KvDims {
  uint32_t kv_heads = 0;
  uint32_t k_head_dim = 0;
  uint32_t v_head_dim = 0;
  // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 misreads a defaulted operator<=>.
  auto operator<=>(const KvDims&) const = default;
};

// Element types of a linear-attention state.
enum class StateDtype { kBf16, kFp16, kFp32 };
std::string_view StateDtypeName(StateDtype dtype);

// The constant state one linear-attention layer keeps per request, as vLLM sizes it
// (vllm/model_executor/layers/mamba/mamba_utils.py, MambaStateShapeCalculator and
// MambaStateDtypeCalculator; docs/adr/0033): the short-convolution rows and the recurrent matrix.
//   Gated DeltaNet (Qwen3-Next, Qwen3.5): conv (2 x nk x dk + nv x dv) x (kernel - 1) in the
//     model dtype, recurrent nv x dv x dk in the model dtype;
//   Kimi Delta Attention (Kimi-Linear, Kimi-K3): conv 3 x heads x head_dim x (kernel - 1) in the
//     model dtype, recurrent heads x head_dim x head_dim in float32.
struct LinearStateDims {
  uint64_t conv_elements = 0;
  StateDtype conv_dtype = StateDtype::kBf16;
  uint64_t recurrent_elements = 0;
  StateDtype recurrent_dtype = StateDtype::kBf16;
  // Tensor parallelism shards the state by heads: ranks must divide this (0: none).
  uint32_t shard_heads = 0;
  std::string rule;  // "gated-deltanet" or "kda"
  // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 misreads a defaulted operator<=>.
  auto operator<=>(const LinearStateDims&) const = default;
};

struct LayerSpec {
  uint32_t index = 0;
  bool is_mtp = false;  // a multi-token-prediction layer (holds cache only when asked)
  LayerKind kind = LayerKind::kMla;
  uint32_t compress_ratio = 1;  // as in config compress_ratios; 1 for non-V4 layers
  KvDims kv;                    // kMha and kSliding layers: this layer's K and V
  uint32_t window = 0;          // kSliding layers: tokens attended (the ring's slots)
  LinearStateDims linear;       // kLinear layers: the state
  std::vector<CacheSpec> caches;
};

struct Geometry {
  std::string name;           // preset name, or the config path
  std::string model_type;     // as the config spells it
  std::string config_sha256;  // of the exact config text read
  uint32_t num_layers = 0;    // main layers (num_hidden_layers)
  uint32_t num_mtp_layers = 0;
  uint32_t num_attention_heads = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;  // MHA head dim; DeepSeek-V4 head_dim (latent + rope)
  uint32_t kv_lora_rank = 0;
  uint32_t qk_rope_head_dim = 0;
  uint32_t qk_nope_head_dim = 0;
  uint32_t v_head_dim = 0;
  // Content (non-RoPE) part of the MLA record: kv_lora_rank, or head_dim - rope for V4.
  uint32_t latent_dim = 0;
  uint32_t index_n_heads = 0;
  uint32_t index_head_dim = 0;
  uint32_t index_topk = 0;
  uint32_t sliding_window = 0;
  uint64_t max_position_embeddings = 0;
  bool is_mla = false;
  bool is_hybrid = false;  // has compress_ratios (DeepSeek-V4 family)
  // Where the layers' attention kinds came from ("layer_types", "hybrid_layer_pattern",
  // "linear_attn_config", ...); empty when every layer has the one kind the model family implies.
  std::string layer_kinds_field;
  std::vector<LayerSpec> layers;   // main layers, then MTP layers
  std::vector<std::string> notes;  // assumptions the reader made, shown in outputs

  // MHA-equivalent baseline: what conventional MHA with the same heads would cache per token
  // per layer, bf16 K and V: 2 x heads x head_dim x 2 B. For MLA models heads = query heads
  // and head_dim = v_head_dim (DeepSeek-V3: 2 x 128 x 128 x 2 = 65,536 B).
  uint32_t mha_heads() const { return is_mla ? num_attention_heads : num_kv_heads; }
  uint32_t mha_head_dim() const { return is_mla ? v_head_dim : head_dim; }
  // Layers of one kind among main layers (and MTP layers when include_mtp).
  uint32_t CountLayers(LayerKind kind, bool include_mtp) const;
};

// Parses config.json text. `source` names the file (or preset) in errors and outputs.
// A multimodal wrapper (text_config, language_config, llm_config, thinker_config.text_config)
// is read as the model inside it. Errors name the offending field: "qk_rope_head_dim: must be a
// positive integer (got 0)"; a config whose per-layer attention kinds cannot be determined is
// refused naming the field (e.g. a sliding_window with no layer pattern), never read as dense.
Result<Geometry> GeometryFromConfigJson(std::string_view json_text, std::string_view source);
// Reads and parses a config.json file. Missing or unreadable files are kIoError on "config".
Result<Geometry> LoadConfigFile(const std::string& path);
// A shipped preset by name (see PresetNames()); unknown names are kNotFound on "model".
Result<Geometry> LoadPreset(std::string_view name);
std::vector<std::string> PresetNames();
// The shipped config.json text of a preset (the bytes whose SHA-256 receipts record).
Result<std::string> PresetConfigText(std::string_view name);

// SHA-256 of `data`, lowercase hex.
std::string Sha256Hex(std::string_view data);

}  // namespace tessera

#include "tessera/weights.h"

#include <map>
#include <nlohmann/json.hpp>

#include "tessera/checked.h"
#include "tessera/file_io.h"

namespace tessera {

std::string_view WeightDtypeName(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::kBf16:
      return "bf16";
    case WeightDtype::kFp8:
      return "fp8";
    case WeightDtype::kFp4:
      return "fp4";
  }
  return "?";
}

Result<WeightDtype> ParseWeightDtype(std::string_view name) {
  if (name == "bf16") return WeightDtype::kBf16;
  if (name == "fp8") return WeightDtype::kFp8;
  if (name == "fp4") return WeightDtype::kFp4;
  return InvalidArgument("weights-dtype",
                         "unknown weight dtype \"" + std::string(name.substr(0, 40)) + "\" (known: bf16, fp8, fp4)");
}

namespace {

using nlohmann::json;

// Dimensions are bounded so that a product of two stays far inside 64 bits; products of three
// and more (experts x rows x cols) are checked (WeightShapesFromConfigJson refuses a model whose
// parameter count leaves 64 bits).
constexpr uint64_t kMaxDim = uint64_t{1} << 24;
// Layers are listed one by one (a tensor per layer): as many as a Geometry allows (geometry.cc).
constexpr uint64_t kMaxLayers = 100000;

Result<uint64_t> Dim(const json& cfg, const char* field, bool required, uint64_t fallback = 0) {
  auto it = cfg.find(field);
  if (it == cfg.end() || it->is_null()) {
    if (required) return InvalidArgument(field, "missing from config.json (needed for the weight bytes)");
    return fallback;
  }
  if (!it->is_number_unsigned()) return InvalidArgument(field, "must be a non-negative integer");
  uint64_t v = it->get<uint64_t>();
  if (v > kMaxDim) return OutOfRange(field, "value " + std::to_string(v) + " is implausibly large");
  return v;
}

struct Builder {
  std::vector<WeightTensor>* out;
  bool mtp = false;
  void Add(std::string group, std::string name, uint64_t rows, uint64_t cols, uint64_t copies, WeightClass cls,
           Split split) const {
    if (rows == 0 || cols == 0 || copies == 0) return;
    out->push_back({std::move(group), std::move(name), rows, cols, copies, cls, split, mtp});
  }
};

struct Config {
  uint64_t hidden = 0, layers = 0, mtp_layers = 0, vocab = 0, heads = 0, kv_heads = 0;
  uint64_t intermediate = 0, moe_intermediate = 0, routed = 0, shared = 0, first_dense = 0, topk = 0;
  uint64_t q_lora = 0, kv_lora = 0, nope = 0, rope = 0, v_dim = 0, head_dim = 0;
  uint64_t index_heads = 0, index_dim = 0, o_groups = 0, o_lora = 0, hc_mult = 0, hash_layers = 0;
  bool tied = false, noaux = false, sparse = false, v4 = false, mla = false;
  std::vector<uint64_t> ratios;
};

// One MLA attention block (DeepSeek-V2/V3/V3.2, Kimi-K2).
void AddMlaAttention(const Builder& b, const Config& c, uint64_t n) {
  const uint64_t qk = c.nope + c.rope;
  if (c.q_lora > 0) {
    b.Add("attention", "q_a_proj", c.q_lora, c.hidden, n, WeightClass::kLinear, Split::kReplicated);
    b.Add("norms", "q_a_layernorm", c.q_lora, 1, n, WeightClass::kBf16, Split::kReplicated);
    b.Add("attention", "q_b_proj", c.heads * qk, c.q_lora, n, WeightClass::kLinear, Split::kRows);
  } else {
    b.Add("attention", "q_proj", c.heads * qk, c.hidden, n, WeightClass::kLinear, Split::kRows);
  }
  b.Add("attention", "kv_a_proj_with_mqa", c.kv_lora + c.rope, c.hidden, n, WeightClass::kLinear, Split::kReplicated);
  b.Add("norms", "kv_a_layernorm", c.kv_lora, 1, n, WeightClass::kBf16, Split::kReplicated);
  b.Add("attention", "kv_b_proj", c.heads * (c.nope + c.v_dim), c.kv_lora, n, WeightClass::kLinear, Split::kRows);
  b.Add("attention", "o_proj", c.hidden, c.heads * c.v_dim, n, WeightClass::kLinear, Split::kCols);
  if (c.sparse) {  // DeepSeek-V3.2 lightning indexer
    b.Add("indexer", "wq_b", c.index_heads * c.index_dim, c.q_lora, n, WeightClass::kLinear, Split::kReplicated);
    b.Add("indexer", "wk", c.index_dim, c.hidden, n, WeightClass::kLinear, Split::kReplicated);
    b.Add("indexer", "k_norm", 2 * c.index_dim, 1, n, WeightClass::kBf16, Split::kReplicated);  // LayerNorm w+b
    b.Add("indexer", "weights_proj", c.index_heads, c.hidden, n, WeightClass::kBf16, Split::kReplicated);
  }
}

// One MHA/GQA attention block (Llama).
void AddMhaAttention(const Builder& b, const Config& c, uint64_t n) {
  b.Add("attention", "q_proj", c.heads * c.head_dim, c.hidden, n, WeightClass::kLinear, Split::kRows);
  b.Add("attention", "k_proj", c.kv_heads * c.head_dim, c.hidden, n, WeightClass::kLinear, Split::kRows);
  b.Add("attention", "v_proj", c.kv_heads * c.head_dim, c.hidden, n, WeightClass::kLinear, Split::kRows);
  b.Add("attention", "o_proj", c.hidden, c.heads * c.head_dim, n, WeightClass::kLinear, Split::kCols);
}

// A V4 compressor over `dim`-wide entries (DeepSeek-V4 inference/model.py, class Compressor):
// wkv and wgate [coff*dim, hidden] (bf16 in the checkpoint), ape [ratio, coff*dim] float32, norm.
void AddCompressor(const Builder& b, const std::string& group, const Config& c, uint64_t ratio, uint64_t dim,
                   uint64_t n) {
  const uint64_t coff = ratio == 4 ? 2 : 1;
  b.Add(group, "compressor.wkv", coff * dim, c.hidden, n, WeightClass::kBf16, Split::kReplicated);
  b.Add(group, "compressor.wgate", coff * dim, c.hidden, n, WeightClass::kBf16, Split::kReplicated);
  b.Add(group, "compressor.ape", ratio, coff * dim, n, WeightClass::kF32, Split::kReplicated);
  b.Add("norms", "compressor.norm", dim, 1, n, WeightClass::kBf16, Split::kReplicated);
}

// One DeepSeek-V4 attention block (inference/model.py, class Attention) at compress ratio `r`.
void AddV4Attention(const Builder& b, const Config& c, uint64_t r) {
  const uint64_t hd = c.head_dim;
  b.Add("attention", "attn_sink", c.heads, 1, 1, WeightClass::kF32, Split::kRows);
  b.Add("attention", "wq_a", c.q_lora, c.hidden, 1, WeightClass::kLinear, Split::kReplicated);
  b.Add("norms", "q_norm", c.q_lora, 1, 1, WeightClass::kBf16, Split::kReplicated);
  b.Add("attention", "wq_b", c.heads * hd, c.q_lora, 1, WeightClass::kLinear, Split::kRows);
  b.Add("attention", "wkv", hd, c.hidden, 1, WeightClass::kLinear, Split::kReplicated);
  b.Add("norms", "kv_norm", hd, 1, 1, WeightClass::kBf16, Split::kReplicated);
  b.Add("attention", "wo_a", c.o_groups * c.o_lora, c.heads * hd / c.o_groups, 1, WeightClass::kLinear, Split::kRows);
  b.Add("attention", "wo_b", c.hidden, c.o_groups * c.o_lora, 1, WeightClass::kLinear, Split::kCols);
  if (r == 0) return;
  AddCompressor(b, "compressor", c, r, hd, 1);
  if (r == 4) {
    b.Add("indexer", "wq_b", c.index_heads * c.index_dim, c.q_lora, 1, WeightClass::kLinear, Split::kReplicated);
    b.Add("indexer", "weights_proj", c.index_heads, c.hidden, 1, WeightClass::kBf16, Split::kReplicated);
    AddCompressor(b, "indexer", c, r, c.index_dim, 1);
  }
}

// The FFN of layer `layer`: dense below first_k_dense_replace, else routed + shared experts.
void AddFfn(const Builder& b, const Config& c, uint64_t layer) {
  if (c.routed == 0 || layer < c.first_dense) {
    b.Add("dense_ffn", "gate_up_proj", 2 * c.intermediate, c.hidden, 1, WeightClass::kLinear, Split::kRows);
    b.Add("dense_ffn", "down_proj", c.hidden, c.intermediate, 1, WeightClass::kLinear, Split::kCols);
    return;
  }
  b.Add("experts", "gate_up_proj", 2 * c.moe_intermediate, c.hidden, c.routed, WeightClass::kExpert, Split::kRows);
  b.Add("experts", "down_proj", c.hidden, c.moe_intermediate, c.routed, WeightClass::kExpert, Split::kCols);
  const uint64_t shared = c.shared * c.moe_intermediate;
  b.Add("shared_experts", "gate_up_proj", 2 * shared, c.hidden, 1, WeightClass::kLinear, Split::kRows);
  b.Add("shared_experts", "down_proj", c.hidden, shared, 1, WeightClass::kLinear, Split::kCols);
  b.Add("router", "gate", c.routed, c.hidden, 1, WeightClass::kBf16, Split::kReplicated);
  if (c.v4 && layer < c.hash_layers) {
    b.Add("router", "tid2eid", c.vocab, c.topk, 1, WeightClass::kF32, Split::kReplicated);  // int32
  } else if (c.v4 || c.noaux) {
    b.Add("router", "e_score_correction_bias", c.routed, 1, 1, WeightClass::kF32, Split::kReplicated);
  }
}

void AddLayer(const Builder& b, const Config& c, uint64_t layer) {
  if (c.v4) {
    AddV4Attention(b, c, layer < c.ratios.size() ? c.ratios[layer] : 0);
    const uint64_t mix = (2 + c.hc_mult) * c.hc_mult;
    b.Add("hyper_connections", "hc_fn", mix, c.hc_mult * c.hidden, 2, WeightClass::kF32, Split::kReplicated);
    b.Add("hyper_connections", "hc_base_scale", mix + 3, 1, 2, WeightClass::kF32, Split::kReplicated);
  } else if (c.mla) {
    AddMlaAttention(b, c, 1);
  } else {
    AddMhaAttention(b, c, 1);
  }
  b.Add("norms", "input_post_layernorm", c.hidden, 1, 2, WeightClass::kBf16, Split::kReplicated);
  AddFfn(b, c, layer);
}

// Long (~90 lines) on purpose: a flat list of the config fields read, one line each, with the
// checks between them that depend on the ones read before.
Status ReadConfig(const json& cfg, Config& c, WeightShapes& s) {
  TESSERA_ASSIGN_OR_RETURN(c.hidden, Dim(cfg, "hidden_size", true));
  TESSERA_ASSIGN_OR_RETURN(c.layers, Dim(cfg, "num_hidden_layers", true));
  TESSERA_ASSIGN_OR_RETURN(c.mtp_layers, Dim(cfg, "num_nextn_predict_layers", false));
  TESSERA_ASSIGN_OR_RETURN(c.vocab, Dim(cfg, "vocab_size", true));
  TESSERA_ASSIGN_OR_RETURN(c.heads, Dim(cfg, "num_attention_heads", true));
  TESSERA_ASSIGN_OR_RETURN(c.kv_heads, Dim(cfg, "num_key_value_heads", false, c.heads));
  if (c.layers > kMaxLayers) {
    return OutOfRange("num_hidden_layers", "value " + std::to_string(c.layers) + " is implausibly large");
  }
  if (c.layers + c.mtp_layers > kMaxLayers) {
    return OutOfRange("num_nextn_predict_layers", "value " + std::to_string(c.mtp_layers) +
                                                      " is implausibly large (main plus MTP layers above " +
                                                      std::to_string(kMaxLayers) + ")");
  }
  if (c.hidden == 0 || c.layers == 0 || c.vocab == 0 || c.heads == 0) {
    return InvalidArgument("hidden_size",
                           "hidden_size, num_hidden_layers, vocab_size and num_attention_heads must be positive");
  }
  TESSERA_ASSIGN_OR_RETURN(c.routed, Dim(cfg, "n_routed_experts", false));
  TESSERA_ASSIGN_OR_RETURN(c.intermediate,
                           Dim(cfg, "intermediate_size", c.routed == 0 || cfg.contains("first_k_dense_replace")));
  TESSERA_ASSIGN_OR_RETURN(c.moe_intermediate, Dim(cfg, "moe_intermediate_size", c.routed > 0));
  TESSERA_ASSIGN_OR_RETURN(c.shared, Dim(cfg, "n_shared_experts", false));
  TESSERA_ASSIGN_OR_RETURN(c.first_dense, Dim(cfg, "first_k_dense_replace", false));
  TESSERA_ASSIGN_OR_RETURN(c.topk, Dim(cfg, "num_experts_per_tok", false));
  TESSERA_ASSIGN_OR_RETURN(c.q_lora, Dim(cfg, "q_lora_rank", false));
  auto tie = cfg.find("tie_word_embeddings");
  c.tied = tie != cfg.end() && tie->is_boolean() && tie->get<bool>();
  auto method = cfg.find("topk_method");
  c.noaux = method != cfg.end() && method->is_string() && method->get<std::string>() == "noaux_tc";
  c.v4 = cfg.contains("compress_ratios");
  c.mla = c.v4 || (cfg.contains("kv_lora_rank") && !cfg["kv_lora_rank"].is_null());
  if (c.v4) {
    TESSERA_ASSIGN_OR_RETURN(c.head_dim, Dim(cfg, "head_dim", true));
    TESSERA_ASSIGN_OR_RETURN(c.o_groups, Dim(cfg, "o_groups", true));
    TESSERA_ASSIGN_OR_RETURN(c.o_lora, Dim(cfg, "o_lora_rank", true));
    TESSERA_ASSIGN_OR_RETURN(c.hc_mult, Dim(cfg, "hc_mult", true));
    TESSERA_ASSIGN_OR_RETURN(c.hash_layers, Dim(cfg, "num_hash_layers", false));
    TESSERA_ASSIGN_OR_RETURN(c.index_heads, Dim(cfg, "index_n_heads", false));
    TESSERA_ASSIGN_OR_RETURN(c.index_dim, Dim(cfg, "index_head_dim", false));
    if (c.q_lora == 0) return InvalidArgument("q_lora_rank", "DeepSeek-V4 needs a positive q_lora_rank");
    if (c.o_groups == 0 || c.heads % c.o_groups != 0) {
      return InvalidArgument("o_groups", "must be positive and divide num_attention_heads");
    }
    const json& r = cfg["compress_ratios"];
    if (!r.is_array() || r.size() > c.layers + c.mtp_layers) {
      return InvalidArgument("compress_ratios", "must be a list of at most num_hidden_layers + MTP entries");
    }
    for (const json& v : r) {
      if (!v.is_number_unsigned() || v.get<uint64_t>() > (1u << 20)) {
        return InvalidArgument("compress_ratios", "entries must be non-negative integers");
      }
      c.ratios.push_back(v.get<uint64_t>());
    }
  } else if (c.mla) {
    TESSERA_ASSIGN_OR_RETURN(c.kv_lora, Dim(cfg, "kv_lora_rank", true));
    TESSERA_ASSIGN_OR_RETURN(c.nope, Dim(cfg, "qk_nope_head_dim", true));
    TESSERA_ASSIGN_OR_RETURN(c.rope, Dim(cfg, "qk_rope_head_dim", true));
    TESSERA_ASSIGN_OR_RETURN(c.v_dim, Dim(cfg, "v_head_dim", true));
    c.sparse = cfg.contains("index_topk");
    if (c.sparse) {
      TESSERA_ASSIGN_OR_RETURN(c.index_heads, Dim(cfg, "index_n_heads", true));
      TESSERA_ASSIGN_OR_RETURN(c.index_dim, Dim(cfg, "index_head_dim", true));
    }
  } else {
    if (c.hidden % c.heads != 0 && !cfg.contains("head_dim")) {
      return InvalidArgument("hidden_size", "is not a multiple of num_attention_heads");
    }
    TESSERA_ASSIGN_OR_RETURN(c.head_dim, Dim(cfg, "head_dim", false, c.hidden / c.heads));
  }
  // Quantization as the checkpoint ships it.
  auto q = cfg.find("quantization_config");
  if (q != cfg.end() && q->is_object()) {
    auto m = q->find("quant_method");
    auto bs = q->find("weight_block_size");
    if (m != q->end() && m->is_string() && m->get<std::string>() == "fp8" && bs != q->end() && bs->is_array() &&
        bs->size() == 2 && (*bs)[0].is_number_unsigned() && (*bs)[0] == (*bs)[1] && (*bs)[0].get<uint64_t>() > 0 &&
        (*bs)[0].get<uint64_t>() <= 4096) {
      s.has_fp8 = true;
      s.fp8_block = static_cast<uint32_t>((*bs)[0].get<uint64_t>());
    }
  }
  // DeepSeek-V4's reference Linear stores block scales as float8_e8m0fnu; V3/V3.2 checkpoints
  // carry float32 weight_scale_inv.
  s.fp8_scale_bytes = c.v4 ? 1 : 4;
  auto e = cfg.find("expert_dtype");
  s.has_fp4_experts = e != cfg.end() && e->is_string() && e->get<std::string>() == "fp4" && s.has_fp8;
  s.checkpoint_dtype = s.has_fp4_experts ? WeightDtype::kFp4 : s.has_fp8 ? WeightDtype::kFp8 : WeightDtype::kBf16;
  s.num_attention_heads = static_cast<uint32_t>(c.heads);
  return Status::Ok();
}

}  // namespace

Result<WeightShapes> WeightShapesFromConfigJson(std::string_view json_text, std::string_view source) {
  if (json_text.size() > kMaxInputFileBytes) return OutOfRange("config", std::string(source) + " is too large");
  json cfg = json::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object()) {
    return InvalidArgument("config", std::string(source) + " is not a JSON object");
  }
  WeightShapes s;
  s.model = std::string(source);
  Config c;
  TESSERA_RETURN_IF_ERROR(ReadConfig(cfg, c, s));
  Builder main{&s.tensors, false};
  main.Add("embedding", "embed_tokens", c.vocab, c.hidden, 1, WeightClass::kBf16, Split::kRows);
  for (uint64_t i = 0; i < c.layers; ++i) AddLayer(main, c, i);
  main.Add("norms", "norm", c.hidden, 1, 1, WeightClass::kBf16, Split::kReplicated);
  if (!c.tied) main.Add("lm_head", "lm_head", c.vocab, c.hidden, 1, WeightClass::kBf16, Split::kRows);
  if (c.v4) {
    main.Add("hyper_connections", "hc_head", c.hc_mult, c.hc_mult * c.hidden, 1, WeightClass::kF32, Split::kReplicated);
    main.Add("hyper_connections", "hc_head_base_scale", c.hc_mult + 1, 1, 1, WeightClass::kF32, Split::kReplicated);
  }
  Builder mtp{&s.tensors, true};
  for (uint64_t j = 0; j < c.mtp_layers; ++j) {
    AddLayer(mtp, c, c.layers + j);
    mtp.Add("norms", "enorm_hnorm_norm", c.hidden, 1, 3, WeightClass::kBf16, Split::kReplicated);
    if (c.v4) {
      // MTPBlock: e_proj and h_proj; embedding and head are the main model's.
      mtp.Add("mtp", "e_proj_h_proj", c.hidden, c.hidden, 2, WeightClass::kLinear, Split::kReplicated);
      mtp.Add("hyper_connections", "hc_head", c.hc_mult, c.hc_mult * c.hidden, 1, WeightClass::kF32,
              Split::kReplicated);
      mtp.Add("hyper_connections", "hc_head_base_scale", c.hc_mult + 1, 1, 1, WeightClass::kF32, Split::kReplicated);
    } else {
      // DeepSeek-V3 checkpoints carry the MTP layer's own embedding and shared head.
      mtp.Add("mtp", "eh_proj", c.hidden, 2 * c.hidden, 1, WeightClass::kBf16, Split::kReplicated);
      mtp.Add("mtp", "embed_tokens", c.vocab, c.hidden, 1, WeightClass::kBf16, Split::kRows);
      mtp.Add("mtp", "shared_head", c.vocab, c.hidden, 1, WeightClass::kBf16, Split::kRows);
    }
  }
  Checked all(0);
  for (const WeightTensor& t : s.tensors) all += Checked(t.rows) * t.cols * t.copies;
  if (all.overflowed()) return OutOfRange("config", std::string(source) + ": the parameter count overflows 64 bits");
  return s;
}

uint64_t ParameterCount(const WeightShapes& shapes, bool mtp) {
  Checked n(0);
  for (const WeightTensor& t : shapes.tensors) {
    if (t.mtp == mtp) n += Checked(t.rows) * t.cols * t.copies;
  }
  // WeightShapesFromConfigJson refuses shapes whose count overflows; shapes built by hand that
  // overflow count as the largest value rather than wrapping.
  return n.overflowed() ? UINT64_MAX : n.value();
}

namespace {

struct TensorBytes {
  Checked bytes;
  Checked scales;
};

TensorBytes BytesOf(const WeightShapes& s, const WeightTensor& t, WeightDtype dtype, uint32_t tp) {
  uint64_t rows = t.split == Split::kRows ? CeilDiv(t.rows, tp) : t.rows;
  uint64_t cols = t.split == Split::kCols ? CeilDiv(t.cols, tp) : t.cols;
  Checked elems = Checked(rows) * cols;
  TensorBytes b;
  switch (t.cls) {
    case WeightClass::kBf16:
      b.bytes = elems * 2;
      break;
    case WeightClass::kF32:
      b.bytes = elems * 4;
      break;
    case WeightClass::kLinear:
    case WeightClass::kExpert:
      if (dtype == WeightDtype::kBf16) {
        b.bytes = elems * 2;
      } else if (dtype == WeightDtype::kFp4 && t.cls == WeightClass::kExpert) {
        // e2m1 packed two per byte, one e8m0 scale per 32 inputs of a row.
        b.scales = Checked(rows) * CeilDiv(cols, 32);
        b.bytes = Checked(CeilDiv(elems.value(), 2)) + b.scales;
      } else {
        b.scales = Checked(CeilDiv(rows, s.fp8_block)) * CeilDiv(cols, s.fp8_block) * s.fp8_scale_bytes;
        b.bytes = elems + b.scales;
      }
      break;
  }
  b.bytes = b.bytes * t.copies;
  b.scales = b.scales * t.copies;
  return b;
}

}  // namespace

Result<WeightBytes> ComputeWeightBytes(const WeightShapes& shapes, WeightDtype dtype, uint32_t tp, bool include_mtp) {
  if (tp == 0) return InvalidArgument("tp", "must be positive");
  if (shapes.num_attention_heads % tp != 0) {
    return InvalidArgument("tp", std::to_string(tp) + " does not divide num_attention_heads " +
                                     std::to_string(shapes.num_attention_heads) +
                                     " (attention heads are split across ranks)");
  }
  if (dtype == WeightDtype::kFp8 && !shapes.has_fp8) {
    return InvalidArgument("weights-dtype", "fp8: " + shapes.model +
                                                " has no fp8 quantization_config with a weight_block_size "
                                                "(its checkpoint dtype is " +
                                                std::string(WeightDtypeName(shapes.checkpoint_dtype)) + ")");
  }
  if (dtype != WeightDtype::kBf16 && shapes.fp8_block == 0) {
    return InvalidArgument("weight_block_size", "must be positive (the fp8 scale blocks' side)");
  }
  if (dtype == WeightDtype::kFp4 && !shapes.has_fp4_experts) {
    return InvalidArgument("weights-dtype", "fp4: " + shapes.model +
                                                " has no expert_dtype \"fp4\" (its checkpoint dtype is " +
                                                std::string(WeightDtypeName(shapes.checkpoint_dtype)) + ")");
  }
  WeightBytes w;
  w.dtype = dtype;
  w.tp = tp;
  w.include_mtp = include_mtp;
  Checked total(0), scales(0), params(0);
  std::map<std::string, size_t> index;
  for (const WeightTensor& t : shapes.tensors) {
    if (t.mtp && !include_mtp) continue;
    const std::string group = t.mtp ? "mtp" : t.group;
    TensorBytes b = BytesOf(shapes, t, dtype, tp);
    Checked p = Checked(t.rows) * t.cols * t.copies;
    auto [it, fresh] = index.try_emplace(group, w.groups.size());
    if (fresh) w.groups.push_back({group, 0, 0});
    WeightGroupBytes& g = w.groups[it->second];
    Checked gp = Checked(g.params) + p;
    Checked gb = Checked(g.bytes_per_rank) + b.bytes;
    if (gp.overflowed() || gb.overflowed()) return OutOfRange("config", "weight bytes overflow 64 bits");
    g.params = gp.value();
    g.bytes_per_rank = gb.value();
    total += b.bytes;
    scales += b.scales;
    params += p;
  }
  if (total.overflowed() || scales.overflowed() || params.overflowed()) {
    return OutOfRange("config", "weight bytes overflow 64 bits");
  }
  w.bytes_per_rank = total.value();
  w.scale_bytes_per_rank = scales.value();
  w.params = params.value();
  return w;
}

}  // namespace tessera

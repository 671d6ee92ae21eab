// Weight bytes per tensor-parallel rank, from a config.json's parameter shapes.
//
// Every parameter tensor the model's checkpoint carries is listed with its shape, how tensor
// parallelism splits it and which storage class it belongs to; the storage class and the chosen
// weight dtype give its bytes (quantization scales included). The sharding rule and the dtype
// rules are ADR 0019's:
//   - attention heads split across ranks (q up-projection, kv up-projection, V4 wq_b / wo_a by
//     rows, the output projection by columns); the low-rank down-projections (q_a, kv_a, V4
//     wq_a/wkv), the V3.2/V4 indexer and the V4 compressors replicated;
//   - every FFN (dense layers, shared experts, each routed expert) split by its intermediate
//     dimension (expert parallelism gives a rank n_routed/tp whole experts: the same bytes);
//   - embedding and LM head vocab-parallel (ceil(vocab / tp) rows on the busiest rank);
//   - norms, the router, its bias, V4 hyper-connection mixers replicated.
// A split dimension that tp does not divide leaves the busiest rank the ceiling.
//
// Thread-safety: values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/status.h"

namespace tessera {

// The dtype the linear weights are stored in.
enum class WeightDtype {
  kBf16,  // every tensor in bf16 (the config's torch_dtype); float32 tensors stay float32
  kFp8,   // linear layers e4m3 with one scale per 128x128 block (quantization_config), experts too
  kFp4,   // DeepSeek-V4 expert_dtype "fp4": routed experts e2m1 with one e8m0 scale per 32 inputs,
          // the other linear layers as kFp8
};
std::string_view WeightDtypeName(WeightDtype dtype);          // "bf16", "fp8", "fp4"
Result<WeightDtype> ParseWeightDtype(std::string_view name);  // errors on "weights-dtype"

// How a tensor's bytes follow from the dtype.
enum class WeightClass {
  kLinear,  // a projection: quantized under fp8/fp4
  kExpert,  // a routed expert's projection: fp4 under fp4, fp8 under fp8
  kBf16,    // kept in bf16 whatever the dtype (embedding, head, norms, router, compressors)
  kF32,     // kept 4 B per element (router bias, V4 hyper-connections, attention sinks, tid2eid)
};

// How tensor parallelism splits a [rows, cols] tensor (rows = output features).
enum class Split { kReplicated, kRows, kCols };

struct WeightTensor {
  std::string group;  // "embedding", "attention", "indexer", "compressor", "dense_ffn", "experts", ...
  std::string name;   // "q_b_proj"
  uint64_t rows = 0;
  uint64_t cols = 1;
  uint64_t copies = 1;  // layers x experts holding one such tensor
  WeightClass cls = WeightClass::kLinear;
  Split split = Split::kReplicated;
  bool mtp = false;  // belongs to the multi-token-prediction layer(s)
};

struct WeightShapes {
  std::string model;
  uint32_t num_attention_heads = 0;
  bool has_fp8 = false;                               // quantization_config: quant_method fp8 with weight_block_size
  uint32_t fp8_block = 128;                           // weight_block_size (square blocks)
  uint32_t fp8_scale_bytes = 4;                       // float32 weight_scale_inv; 1 (e8m0) for DeepSeek-V4
  bool has_fp4_experts = false;                       // expert_dtype "fp4"
  WeightDtype checkpoint_dtype = WeightDtype::kBf16;  // what the checkpoint ships
  std::vector<WeightTensor> tensors;
  std::vector<std::string> notes;
};

// Reads the shapes from config.json text; errors name the config field ("config" when the
// parameter count would leave 64 bits).
Result<WeightShapes> WeightShapesFromConfigJson(std::string_view json_text, std::string_view source);

// Element count of the whole model (unsharded), main and MTP layers apart. UINT64_MAX when it
// leaves 64 bits (only shapes built by hand can: the reader refuses such a config).
uint64_t ParameterCount(const WeightShapes& shapes, bool mtp);

struct WeightGroupBytes {
  std::string group;
  uint64_t params = 0;          // whole model
  uint64_t bytes_per_rank = 0;  // busiest rank, scales included
};

struct WeightBytes {
  WeightDtype dtype = WeightDtype::kBf16;
  uint32_t tp = 1;
  bool include_mtp = false;
  uint64_t params = 0;  // counted tensors, whole model
  uint64_t bytes_per_rank = 0;
  uint64_t scale_bytes_per_rank = 0;  // of bytes_per_rank
  std::vector<WeightGroupBytes> groups;
};

// Bytes per rank. Errors: "tp" (zero, or not dividing the attention heads), "weights-dtype" (a
// dtype the config cannot have: fp8 without an fp8 quantization_config, fp4 without
// expert_dtype fp4), "weight_block_size" (fp8/fp4 with an fp8_block of 0), "config" (bytes
// leaving 64 bits).
Result<WeightBytes> ComputeWeightBytes(const WeightShapes& shapes, WeightDtype dtype, uint32_t tp, bool include_mtp);

}  // namespace tessera

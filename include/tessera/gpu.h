// Accelerator specs: device memory, HBM bandwidth and dense tensor-core FLOP/s, shipped as data
// (data/gpus/*.json, each figure with its datasheet in data/gpus/README.md) and read through the
// same checked reader as a user's --gpu-spec file.
//
// Thread-safety: values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/status.h"

namespace tessera {

struct GpuSpec {
  std::string name;  // "H200-141G"
  std::string description;
  uint64_t memory_bytes = 0;
  uint64_t hbm_bytes_per_s = 0;
  uint64_t dense_bf16_flops = 0;  // FLOP/s, a multiply-add = 2 FLOPs
  uint64_t dense_fp8_flops = 0;
};

// Parses a spec. Errors name the field ("memory_bytes: must be a positive integer").
Result<GpuSpec> GpuSpecFromJson(std::string_view json_text, std::string_view source);
// A shipped spec by name, case-insensitive ("h200-141g" or "H200-141G"); unknown names are
// kNotFound on "gpu", listing the known ones.
Result<GpuSpec> LoadGpu(std::string_view name);
// Reads a spec file; errors on "gpu-spec".
Result<GpuSpec> LoadGpuSpecFile(const std::string& path);
std::vector<std::string> GpuNames();  // the shipped specs' names

}  // namespace tessera

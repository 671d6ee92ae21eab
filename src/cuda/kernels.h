// The CUDA kernels' launch interface (ADR 0025): plain structs and host functions that enqueue
// on a stream, so that the .cc side (cuda_device.cc) never includes device code and nvcc
// compiles only kernels.cu. Every pointer here is a device pointer.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "phases.h"

namespace tessera::cuda::kernels {

// The split-K pass: one CTA per (work item, head group).
cudaError_t LaunchSplit(const SplitArgs& a, cudaStream_t stream);
// Merges each request's splits: o_lat[b][h] = sum_s w_s partial_s / sum_s w_s, w_s = exp(lse_s - max).
cudaError_t LaunchCombine(const float* partial, const float* lse, const int32_t* split_offset, uint32_t batch,
                          uint32_t heads, uint32_t latent, float* o_lat, cudaStream_t stream);
// q_lat[b][h] = W_UK_h^T q_nope[b][h] (wkv_b: [heads * (nope + v)][latent]).
cudaError_t LaunchAbsorb(const float* q_nope, const float* wkv_b, uint32_t batch, uint32_t heads, uint32_t nope,
                         uint32_t v, uint32_t latent, float* q_lat, cudaStream_t stream);
// out[b][h] = W_UV_h o_lat[b][h].
cudaError_t LaunchProjectV(const float* o_lat, const float* wkv_b, uint32_t batch, uint32_t heads, uint32_t nope,
                           uint32_t v, uint32_t latent, float* out, cudaStream_t stream);

}  // namespace tessera::cuda::kernels

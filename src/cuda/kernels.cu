// Paged MLA decode (absorbed form) over Tessera's pages, read in place (ADR 0025). fp32 math as
// the CPU reference (src/attention/attention.cc, ADR 0017): records decoded exactly (bf16, and
// e4m3 x the tile's fp32 scale for fp8_ds_mla), scores scale * (q_lat . c + q_pe . k_pe), softmax
// over every token of a request, o_lat = sum softmax * c. The softmax runs online, split-K over
// the plan's work items (flash-decoding), and a combine pass merges the splits by their
// log-sum-exp: the same values as the reference in another summation order. The split kernel's
// phases live in phases.h, where the host tests run them too.
#include <cstdint>

#include "kernels.h"

namespace tessera::cuda::kernels {
namespace {

__global__ void __launch_bounds__(kThreads) SplitKernel(SplitArgs a) {
  extern __shared__ float smem[];
  const Smem sm = Carve(smem, a);
  const Cta c = CtaOf(a, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y));
  const int tid = static_cast<int>(threadIdx.x);
  float acc[kAccPerThread];
#pragma unroll
  for (int k = 0; k < kAccPerThread; ++k) acc[k] = 0.0f;
  LoadQuery(a, c, sm, tid);
  __syncthreads();
  for (int t0 = c.it.begin; t0 < c.it.end; t0 += kTile) {
    const int nt = min(kTile, c.it.end - t0);
    LoadTile(a, c, t0, nt, sm, tid);
    __syncthreads();
    Scores(a, c, nt, sm, tid);
    __syncthreads();
    Softmax(c, nt, sm, tid);
    __syncthreads();
    Accumulate(a, c, nt, sm, tid, acc);
    __syncthreads();
  }
  WritePartial(a, c, static_cast<int>(blockIdx.x), sm, tid, acc);
}

__global__ void CombineKernel(const float* partial, const float* lse, const int32_t* split_offset, int heads,
                              int latent, float* o_lat) {
  const int b = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  for (int j = static_cast<int>(threadIdx.x); j < latent; j += static_cast<int>(blockDim.x)) {
    o_lat[(static_cast<int64_t>(b) * heads + h) * latent + j] =
        CombineOne(partial, lse, split_offset, heads, latent, b, h, j);
  }
}

__global__ void AbsorbKernel(const float* q_nope, const float* wkv_b, int heads, int nope, int v, int latent,
                             float* q_lat) {
  const int b = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  for (int j = static_cast<int>(threadIdx.x); j < latent; j += static_cast<int>(blockDim.x)) {
    q_lat[(static_cast<int64_t>(b) * heads + h) * latent + j] =
        AbsorbOne(q_nope, wkv_b, heads, nope, v, latent, b, h, j);
  }
}

// out[b][h][i] = W_UV_h[i] . o_lat[b][h]: a warp per output, lanes over the latent.
__global__ void ProjectKernel(const float* o_lat, const float* wkv_b, int heads, int nope, int v, int latent,
                              float* out) {
  const int b = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int warps = static_cast<int>(blockDim.x) / 32;
  const float* o = o_lat + (static_cast<int64_t>(b) * heads + h) * latent;
  for (int i = warp; i < v; i += warps) {
    const float* w = wkv_b + (static_cast<int64_t>(h) * (nope + v) + nope + i) * latent;
    float x = 0.0f;
    for (int j = lane; j < latent; j += 32) x += w[j] * o[j];
    for (int off = 16; off > 0; off /= 2) x += __shfl_down_sync(0xFFFFFFFFu, x, off);
    if (lane == 0) out[(static_cast<int64_t>(b) * heads + h) * v + i] = x;
  }
}

}  // namespace

cudaError_t LaunchSplit(const SplitArgs& a, cudaStream_t stream) {
  if (a.latent > static_cast<uint32_t>(kMaxLatentDim) || a.heads_per_cta * kLanesPerHead > kThreads) {
    return cudaErrorInvalidValue;
  }
  const cudaError_t e =
      cudaFuncSetAttribute(SplitKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(a.shared_bytes));
  if (e != cudaSuccess) return e;
  SplitKernel<<<dim3(a.item_count, a.head_groups), kThreads, a.shared_bytes, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchCombine(const float* partial, const float* lse, const int32_t* split_offset, uint32_t batch,
                          uint32_t heads, uint32_t latent, float* o_lat, cudaStream_t stream) {
  CombineKernel<<<dim3(batch, heads), 256, 0, stream>>>(partial, lse, split_offset, static_cast<int>(heads),
                                                        static_cast<int>(latent), o_lat);
  return cudaGetLastError();
}

cudaError_t LaunchAbsorb(const float* q_nope, const float* wkv_b, uint32_t batch, uint32_t heads, uint32_t nope,
                         uint32_t v, uint32_t latent, float* q_lat, cudaStream_t stream) {
  AbsorbKernel<<<dim3(batch, heads), 256, 0, stream>>>(q_nope, wkv_b, static_cast<int>(heads), static_cast<int>(nope),
                                                       static_cast<int>(v), static_cast<int>(latent), q_lat);
  return cudaGetLastError();
}

cudaError_t LaunchProjectV(const float* o_lat, const float* wkv_b, uint32_t batch, uint32_t heads, uint32_t nope,
                           uint32_t v, uint32_t latent, float* out, cudaStream_t stream) {
  ProjectKernel<<<dim3(batch, heads), 256, 0, stream>>>(o_lat, wkv_b, static_cast<int>(heads), static_cast<int>(nope),
                                                        static_cast<int>(v), static_cast<int>(latent), out);
  return cudaGetLastError();
}

}  // namespace tessera::cuda::kernels

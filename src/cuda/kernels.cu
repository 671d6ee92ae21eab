// Paged MLA decode (absorbed form) over Tessera's pages, read in place (ADR 0025). fp32 math as
// the CPU reference (src/attention/attention.cc, ADR 0017): records decoded exactly (bf16, and
// e4m3 x the tile's fp32 scale for fp8_ds_mla), scores scale * (q_lat . c + q_pe . k_pe), softmax
// over every token of a request, o_lat = sum softmax * c. The softmax runs online, split-K over
// the plan's work items (flash-decoding), and a combine pass merges the splits by their
// log-sum-exp: the same values as the reference in another summation order.
#include <cstdint>

#include "kernels.h"

namespace tessera::cuda::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 16;          // tokens staged per step (cuda_plan.h kTileTokens)
constexpr int kLanesPerHead = 16;  // threads that share one head's accumulators
constexpr int kMaxLatent = 512;
constexpr int kAccPerThread = kMaxLatent / kLanesPerHead;  // 32

__device__ __forceinline__ float Bf16(uint32_t bits) { return __uint_as_float(bits << 16); }

// Exact E4M3FN (codec.h DecodeE4M3): ±2^(e-7)(1+m/8), subnormals m 2^-9, S.1111.111 NaN.
__device__ __forceinline__ float E4M3(uint32_t c) {
  const uint32_t e = (c >> 3) & 0xFu, m = c & 0x7u;
  float mag;
  if (e == 0xFu && m == 0x7u) {
    mag = __uint_as_float(0x7FC00000u);
  } else if (e == 0) {
    mag = static_cast<float>(m) * 0.001953125f;  // m 2^-9, exact
  } else {
    mag = __uint_as_float(((e + 120u) << 23) | (m << 20));
  }
  return (c & 0x80u) != 0 ? -mag : mag;
}

// Decodes 16 record bytes (vector v of a record) into the token's row (latent then rope).
__device__ __forceinline__ void DecodeVector(const uint8_t* rec, uint32_t v, uint4 w, uint32_t format, float* row) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  if (format == 0) {  // mla-bf16: 8 values, latent then rope contiguous like the row
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      row[8 * v + 2 * i] = Bf16(words[i] & 0xFFFFu);
      row[8 * v + 2 * i + 1] = Bf16(words[i] >> 16);
    }
    return;
  }
  // fp8_ds_mla: vectors 0..31 latent (16 e4m3, tile v / 8), 32 the four scales, 33..40 rope.
  if (v < 32) {
    const float scale = *reinterpret_cast<const float*>(rec + 512 + 4 * (v / 8));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int k = 0; k < 4; ++k) row[16 * v + 4 * i + k] = E4M3((words[i] >> (8 * k)) & 0xFFu) * scale;
    }
  } else if (v > 32) {
    float* rope = row + 512 + 8 * (v - 33);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      rope[2 * i] = Bf16(words[i] & 0xFFFFu);
      rope[2 * i + 1] = Bf16(words[i] >> 16);
    }
  }
}

__global__ void __launch_bounds__(kThreads) SplitKernel(SplitArgs a) {
  extern __shared__ float smem[];
  const int L = static_cast<int>(a.latent), R = static_cast<int>(a.rope), H = static_cast<int>(a.heads);
  const int row = L + R + 1;  // +1: rows of different tokens start in different banks
  const int hpc = static_cast<int>(a.heads_per_cta);
  float* q = smem;              // hpc x row
  float* kv = q + hpc * row;    // kTile x row
  float* s = kv + kTile * row;  // hpc x kTile: scores, then probabilities
  float* m_state = s + hpc * kTile;
  float* l_state = m_state + hpc;
  float* alpha = l_state + hpc;

  const Item it = a.items[blockIdx.x];
  const int h0 = static_cast<int>(blockIdx.y) * hpc;
  const int nh = min(hpc, H - h0);
  const int b = it.request;
  const int tid = static_cast<int>(threadIdx.x);

  for (int i = tid; i < nh * (L + R); i += kThreads) {
    const int h = i / (L + R), k = i % (L + R);
    const int64_t qh = static_cast<int64_t>(b) * H + h0 + h;
    q[h * row + k] = k < L ? a.q_lat[qh * L + k] : a.q_pe[qh * R + (k - L)];
  }
  if (tid < nh) {
    m_state[tid] = -__int_as_float(0x7F800000);
    l_state[tid] = 0.0f;
  }
  const int ah = tid / kLanesPerHead, lane = tid % kLanesPerHead;
  float acc[kAccPerThread];
#pragma unroll
  for (int k = 0; k < kAccPerThread; ++k) acc[k] = 0.0f;
  __syncthreads();

  const int vecs = static_cast<int>(a.record_bytes / 16);
  const int32_t* table = a.table + static_cast<int64_t>(b) * a.table_stride;
  for (int t0 = it.begin; t0 < it.end; t0 += kTile) {
    const int nt = min(kTile, it.end - t0);
    for (int i = tid; i < nt * vecs; i += kThreads) {
      const int tt = i / vecs, v = i % vecs, pos = t0 + tt;
      const int32_t block = table[pos / static_cast<int>(a.block_tokens)];
      const uint8_t* rec = a.pages + static_cast<uint64_t>(block) * a.block_stride +
                           static_cast<uint64_t>(pos % static_cast<int>(a.block_tokens)) * a.record_bytes;
      const uint4 w = __ldg(reinterpret_cast<const uint4*>(rec) + v);
      DecodeVector(rec, static_cast<uint32_t>(v), w, a.format, kv + tt * row);
    }
    __syncthreads();
    for (int i = tid; i < nh * kTile; i += kThreads) {
      const int h = i / kTile, tt = i % kTile;
      float score = -__int_as_float(0x7F800000);
      if (tt < nt) {
        const float* qr = q + h * row;
        const float* cr = kv + tt * row;
        float dl = 0.0f, dr = 0.0f;
        for (int k = 0; k < L; ++k) dl += qr[k] * cr[k];
        for (int k = L; k < L + R; ++k) dr += qr[k] * cr[k];
        score = a.scale * (dl + dr);
      }
      s[h * kTile + tt] = score;
    }
    __syncthreads();
    if (tid < nh) {
      const float m_old = m_state[tid];
      float mx = m_old;
      for (int tt = 0; tt < nt; ++tt) mx = fmaxf(mx, s[tid * kTile + tt]);
      const float scale_old = m_old == -__int_as_float(0x7F800000) ? 0.0f : expf(m_old - mx);
      float sum = 0.0f;
      for (int tt = 0; tt < kTile; ++tt) {
        const float p = tt < nt ? expf(s[tid * kTile + tt] - mx) : 0.0f;
        s[tid * kTile + tt] = p;
        sum += p;
      }
      l_state[tid] = l_state[tid] * scale_old + sum;
      m_state[tid] = mx;
      alpha[tid] = scale_old;
    }
    __syncthreads();
    if (ah < nh) {
      const float al = alpha[ah];
      const float* p = s + ah * kTile;
#pragma unroll
      for (int k = 0; k < kAccPerThread; ++k) {
        const int j = lane + kLanesPerHead * k;
        if (j < L) {
          float x = acc[k] * al;
          for (int tt = 0; tt < nt; ++tt) x += p[tt] * kv[tt * row + j];
          acc[k] = x;
        }
      }
    }
    __syncthreads();
  }
  if (ah < nh) {
    const float inv = 1.0f / l_state[ah];
    float* out = a.partial + (static_cast<int64_t>(blockIdx.x) * H + h0 + ah) * L;
#pragma unroll
    for (int k = 0; k < kAccPerThread; ++k) {
      const int j = lane + kLanesPerHead * k;
      if (j < L) out[j] = acc[k] * inv;
    }
  }
  if (tid < nh) a.lse[static_cast<int64_t>(blockIdx.x) * H + h0 + tid] = m_state[tid] + logf(l_state[tid]);
}

__global__ void CombineKernel(const float* partial, const float* lse, const int32_t* split_offset, int heads,
                              int latent, float* o_lat) {
  const int b = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  const int first = split_offset[b], last = split_offset[b + 1];
  float mx = -__int_as_float(0x7F800000);
  for (int i = first; i < last; ++i) mx = fmaxf(mx, lse[static_cast<int64_t>(i) * heads + h]);
  for (int j = static_cast<int>(threadIdx.x); j < latent; j += static_cast<int>(blockDim.x)) {
    float sum = 0.0f, wsum = 0.0f;
    for (int i = first; i < last; ++i) {
      const float w = expf(lse[static_cast<int64_t>(i) * heads + h] - mx);
      sum += w * partial[(static_cast<int64_t>(i) * heads + h) * latent + j];
      wsum += w;
    }
    o_lat[(static_cast<int64_t>(b) * heads + h) * latent + j] = sum / wsum;
  }
}

__global__ void AbsorbKernel(const float* q_nope, const float* wkv_b, int heads, int nope, int v, int latent,
                             float* q_lat) {
  const int b = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  const float* qn = q_nope + (static_cast<int64_t>(b) * heads + h) * nope;
  const float* w = wkv_b + static_cast<int64_t>(h) * (nope + v) * latent;
  for (int j = static_cast<int>(threadIdx.x); j < latent; j += static_cast<int>(blockDim.x)) {
    float x = 0.0f;
    for (int i = 0; i < nope; ++i) x += qn[i] * w[static_cast<int64_t>(i) * latent + j];
    q_lat[(static_cast<int64_t>(b) * heads + h) * latent + j] = x;
  }
}

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
  if (a.latent > static_cast<uint32_t>(kMaxLatent) || a.heads_per_cta * kLanesPerHead > kThreads) {
    return cudaErrorInvalidValue;
  }
  cudaError_t e =
      cudaFuncSetAttribute(SplitKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(a.shared_bytes));
  if (e != cudaSuccess) return e;
  const dim3 grid(a.item_count, a.head_groups);
  SplitKernel<<<grid, kThreads, a.shared_bytes, stream>>>(a);
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

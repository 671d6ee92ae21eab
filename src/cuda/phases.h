// The split-K decode kernel's phases as functions of (arguments, shared memory, thread index),
// compiled both for the device (kernels.cu calls them between __syncthreads) and for the host,
// where tests run every phase over every thread of every CTA in order — an emulation of the
// kernel over the pool's host pages that checks its indexing and math against the CPU reference
// on machines without a GPU (ADR 0025). No CUDA header: plain C++ on the host.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TESSERA_HD __host__ __device__ __forceinline__
#else
#define TESSERA_HD inline
#endif
#if defined(__CUDA_ARCH__)
#define TESSERA_UNROLL _Pragma("unroll")
#else
#define TESSERA_UNROLL
#endif

namespace tessera::cuda::kernels {

constexpr int kThreads = 256;
constexpr int kTile = 16;          // tokens staged per step (cuda_plan.h kTileTokens)
constexpr int kLanesPerHead = 16;  // threads that share one head's accumulators
constexpr int kMaxLatentDim = 512;
constexpr int kAccPerThread = kMaxLatentDim / kLanesPerHead;  // 32

struct Item {  // tessera::cuda::WorkItem, field for field
  int32_t request;
  int32_t split;
  int32_t begin;
  int32_t end;
};

struct SplitArgs {
  const uint8_t* pages = nullptr;  // region base + the layer's offset
  uint64_t block_stride = 0;
  uint32_t record_bytes = 0;
  uint32_t block_tokens = 0;
  uint32_t format = 0;  // PageFormat: 0 mla-bf16, 1 fp8_ds_mla
  const int32_t* table = nullptr;
  uint32_t table_stride = 0;
  const float* q_lat = nullptr;  // [batch][heads][latent]
  const float* q_pe = nullptr;   // [batch][heads][rope]
  const Item* items = nullptr;
  uint32_t item_count = 0;
  float* partial = nullptr;  // [item][heads][latent], normalized by the item's softmax sum
  float* lse = nullptr;      // [item][heads]: max + log(sum)
  uint32_t heads = 0, latent = 0, rope = 0, heads_per_cta = 0, head_groups = 0;
  float scale = 0.0f;
  uint64_t shared_bytes = 0;
};

TESSERA_HD float BitsToFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}
TESSERA_HD float NegInf() { return BitsToFloat(0xFF800000u); }
TESSERA_HD float Bf16(uint32_t bits) { return BitsToFloat(bits << 16); }

// Exact E4M3FN (codec.h DecodeE4M3): ±2^(e-7)(1+m/8), subnormals m 2^-9, S.1111.111 NaN.
TESSERA_HD float E4M3(uint32_t c) {
  const uint32_t e = (c >> 3) & 0xFu, m = c & 0x7u;
  float mag;
  if (e == 0xFu && m == 0x7u) {
    mag = BitsToFloat(0x7FC00000u);
  } else if (e == 0) {
    mag = static_cast<float>(m) * 0.001953125f;  // m 2^-9, exact
  } else {
    mag = BitsToFloat(((e + 120u) << 23) | (m << 20));
  }
  return (c & 0x80u) != 0 ? -mag : mag;
}

// 16 record bytes as four little-endian words.
TESSERA_HD void Load16(const uint8_t* p, uint32_t words[4]) {
#if defined(__CUDA_ARCH__)
  const uint4 w = __ldg(reinterpret_cast<const uint4*>(p));
  words[0] = w.x, words[1] = w.y, words[2] = w.z, words[3] = w.w;
#else
  std::memcpy(words, p, 16);
#endif
}

// Decodes vector v (16 bytes) of the record at `rec` into the token's row (latent then rope).
TESSERA_HD void DecodeVector(const uint8_t* rec, uint32_t v, uint32_t format, float* row) {
  uint32_t words[4];
  Load16(rec + 16 * v, words);
  if (format == 0) {  // mla-bf16: 8 values, latent then rope contiguous like the row
    for (int i = 0; i < 4; ++i) {
      row[8 * v + 2 * i] = Bf16(words[i] & 0xFFFFu);
      row[8 * v + 2 * i + 1] = Bf16(words[i] >> 16);
    }
    return;
  }
  // fp8_ds_mla: vectors 0..31 latent (16 e4m3, tile v / 8), 32 the four scales, 33..40 rope.
  if (v < 32) {
    uint32_t scale_bits;
#if defined(__CUDA_ARCH__)
    scale_bits = __ldg(reinterpret_cast<const uint32_t*>(rec + 512 + 4 * (v / 8)));
#else
    std::memcpy(&scale_bits, rec + 512 + 4 * (v / 8), 4);
#endif
    const float scale = BitsToFloat(scale_bits);
    TESSERA_UNROLL
    for (int i = 0; i < 4; ++i) {
      TESSERA_UNROLL
      for (int k = 0; k < 4; ++k) row[16 * v + 4 * i + k] = E4M3((words[i] >> (8 * k)) & 0xFFu) * scale;
    }
  } else if (v > 32) {
    float* rope = row + 512 + 8 * (v - 33);
    for (int i = 0; i < 4; ++i) {
      rope[2 * i] = Bf16(words[i] & 0xFFFFu);
      rope[2 * i + 1] = Bf16(words[i] >> 16);
    }
  }
}

// Shared memory of one CTA (PlanDecode's shared_bytes).
struct Smem {
  float* q;      // hpc x row: the heads' q_lat then q_pe
  float* kv;     // kTile x row: the staged tokens' latent then rope
  float* s;      // hpc x kTile: scores, then probabilities
  float* m;      // hpc: running max
  float* l;      // hpc: running sum
  float* alpha;  // hpc: this tile's rescale of the accumulators
  int row;       // latent + rope + 1 (the +1 puts rows of different tokens in different banks)
};
TESSERA_HD Smem Carve(float* smem, const SplitArgs& a) {
  Smem s;
  const int hpc = static_cast<int>(a.heads_per_cta);
  s.row = static_cast<int>(a.latent + a.rope) + 1;
  s.q = smem;
  s.kv = s.q + hpc * s.row;
  s.s = s.kv + kTile * s.row;
  s.m = s.s + hpc * kTile;
  s.l = s.m + hpc;
  s.alpha = s.l + hpc;
  return s;
}

// The CTA's place: item `x`, head group `y`.
struct Cta {
  Item it;
  int h0;  // first head
  int nh;  // heads in this group
};
TESSERA_HD Cta CtaOf(const SplitArgs& a, int x, int y) {
  Cta c;
  c.it = a.items[x];
  c.h0 = y * static_cast<int>(a.heads_per_cta);
  const int rest = static_cast<int>(a.heads) - c.h0;
  c.nh = rest < static_cast<int>(a.heads_per_cta) ? rest : static_cast<int>(a.heads_per_cta);
  return c;
}

// Phase 1: the query rows into shared memory, the softmax state reset.
TESSERA_HD void LoadQuery(const SplitArgs& a, const Cta& c, const Smem& sm, int tid) {
  const int L = static_cast<int>(a.latent), R = static_cast<int>(a.rope), H = static_cast<int>(a.heads);
  for (int i = tid; i < c.nh * (L + R); i += kThreads) {
    const int h = i / (L + R), k = i % (L + R);
    const int64_t qh = static_cast<int64_t>(c.it.request) * H + c.h0 + h;
    sm.q[h * sm.row + k] = k < L ? a.q_lat[qh * L + k] : a.q_pe[qh * R + (k - L)];
  }
  if (tid < c.nh) {
    sm.m[tid] = NegInf();
    sm.l[tid] = 0.0f;
  }
}

// Phase 2: tokens [t0, t0 + nt) of the request decoded into shared memory, read in place through
// the block table.
TESSERA_HD void LoadTile(const SplitArgs& a, const Cta& c, int t0, int nt, const Smem& sm, int tid) {
  const int vecs = static_cast<int>(a.record_bytes / 16);
  const int32_t* table = a.table + static_cast<int64_t>(c.it.request) * a.table_stride;
  const int bt = static_cast<int>(a.block_tokens);
  for (int i = tid; i < nt * vecs; i += kThreads) {
    const int tt = i / vecs, v = i % vecs, pos = t0 + tt;
    const int32_t block = table[pos / bt];
    const uint8_t* rec =
        a.pages + static_cast<uint64_t>(block) * a.block_stride + static_cast<uint64_t>(pos % bt) * a.record_bytes;
    DecodeVector(rec, static_cast<uint32_t>(v), a.format, sm.kv + tt * sm.row);
  }
}

// Phase 3: scores of every (head, token) pair of the tile; -inf past the tile's tokens.
TESSERA_HD void Scores(const SplitArgs& a, const Cta& c, int nt, const Smem& sm, int tid) {
  const int L = static_cast<int>(a.latent), R = static_cast<int>(a.rope);
  for (int i = tid; i < c.nh * kTile; i += kThreads) {
    const int h = i / kTile, tt = i % kTile;
    float score = NegInf();
    if (tt < nt) {
      const float* qr = sm.q + h * sm.row;
      const float* cr = sm.kv + tt * sm.row;
      float dl = 0.0f, dr = 0.0f;
      for (int k = 0; k < L; ++k) dl += qr[k] * cr[k];
      for (int k = L; k < L + R; ++k) dr += qr[k] * cr[k];
      score = a.scale * (dl + dr);
    }
    sm.s[h * kTile + tt] = score;
  }
}

// Phase 4: one thread per head updates the running max and sum and turns scores into weights.
TESSERA_HD void Softmax(const Cta& c, int nt, const Smem& sm, int tid) {
  if (tid >= c.nh) return;
  float* s = sm.s + tid * kTile;
  const float m_old = sm.m[tid];
  float mx = m_old;
  for (int tt = 0; tt < nt; ++tt) mx = s[tt] > mx ? s[tt] : mx;
  const float rescale = m_old == NegInf() ? 0.0f : expf(m_old - mx);
  float sum = 0.0f;
  for (int tt = 0; tt < kTile; ++tt) {
    const float p = tt < nt ? expf(s[tt] - mx) : 0.0f;
    s[tt] = p;
    sum += p;
  }
  sm.l[tid] = sm.l[tid] * rescale + sum;
  sm.m[tid] = mx;
  sm.alpha[tid] = rescale;
}

// Phase 5: thread tid holds columns lane, lane + 16, ... of head tid / 16.
TESSERA_HD void Accumulate(const SplitArgs& a, const Cta& c, int nt, const Smem& sm, int tid, float* acc) {
  const int ah = tid / kLanesPerHead, lane = tid % kLanesPerHead, L = static_cast<int>(a.latent);
  if (ah >= c.nh) return;
  const float al = sm.alpha[ah];
  const float* p = sm.s + ah * kTile;
  TESSERA_UNROLL
  for (int k = 0; k < kAccPerThread; ++k) {
    const int j = lane + kLanesPerHead * k;
    if (j < L) {
      float x = acc[k] * al;
      for (int tt = 0; tt < nt; ++tt) x += p[tt] * sm.kv[tt * sm.row + j];
      acc[k] = x;
    }
  }
}

// Phase 6: the CTA's normalized partial output and log-sum-exp.
TESSERA_HD void WritePartial(const SplitArgs& a, const Cta& c, int x, const Smem& sm, int tid, const float* acc) {
  const int ah = tid / kLanesPerHead, lane = tid % kLanesPerHead;
  const int L = static_cast<int>(a.latent), H = static_cast<int>(a.heads);
  if (ah < c.nh) {
    const float inv = 1.0f / sm.l[ah];
    float* out = a.partial + (static_cast<int64_t>(x) * H + c.h0 + ah) * L;
    TESSERA_UNROLL
    for (int k = 0; k < kAccPerThread; ++k) {
      const int j = lane + kLanesPerHead * k;
      if (j < L) out[j] = acc[k] * inv;
    }
  }
  if (tid < c.nh) a.lse[static_cast<int64_t>(x) * H + c.h0 + tid] = sm.m[tid] + logf(sm.l[tid]);
}

// Combine: column j of head h of request b from its splits' partials.
TESSERA_HD float CombineOne(const float* partial, const float* lse, const int32_t* split_offset, int heads, int latent,
                            int b, int h, int j) {
  const int first = split_offset[b], last = split_offset[b + 1];
  float mx = NegInf();
  for (int i = first; i < last; ++i) {
    const float v = lse[static_cast<int64_t>(i) * heads + h];
    mx = v > mx ? v : mx;
  }
  float sum = 0.0f, wsum = 0.0f;
  for (int i = first; i < last; ++i) {
    const float w = expf(lse[static_cast<int64_t>(i) * heads + h] - mx);
    sum += w * partial[(static_cast<int64_t>(i) * heads + h) * latent + j];
    wsum += w;
  }
  return sum / wsum;
}

// q_lat[b][h][j] = sum_i q_nope[b][h][i] W_UK_h[i][j], in the reference's order.
TESSERA_HD float AbsorbOne(const float* q_nope, const float* wkv_b, int heads, int nope, int v, int latent, int b,
                           int h, int j) {
  const float* qn = q_nope + (static_cast<int64_t>(b) * heads + h) * nope;
  const float* w = wkv_b + static_cast<int64_t>(h) * (nope + v) * latent;
  float x = 0.0f;
  for (int i = 0; i < nope; ++i) x += qn[i] * w[static_cast<int64_t>(i) * latent + j];
  return x;
}

}  // namespace tessera::cuda::kernels

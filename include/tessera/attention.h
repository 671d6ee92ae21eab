// Reference MLA attention over Tessera's pages (ADR 0017).
//
// CPU, fp32, scalar: the ground truth a kernel or an engine port is checked against, not a fast
// path. Every key and value comes straight from a request manager's page records, decoded
// through the codecs (mla-bf16 / mla-fp16 by element, fp8_ds_mla by DequantizeFp8DsMla, the
// indexer's fp8 keys by e4m3 x scale); there is no expanded K/V cache anywhere. Each record a
// call reads is decoded once, whatever the form.
//
// Forms (DeepSeek-V2/V3 MLA decode of one query token in one layer; W_UK_h, W_UV_h are head h's
// nope and v rows of wkv_b, laid out [heads*(nope+v), latent], per head nope rows then v rows):
//   absorbed: q_lat_h = W_UK_h^T q_nope_h;  s_h[t] = scale (q_lat_h . c[t] + q_pe_h . k_pe[t]);
//             o_h = W_UV_h (sum_t softmax(s_h)[t] c[t])
//   naive:    k_h[t] = [W_UK_h c[t], k_pe[t]], v_h[t] = W_UV_h c[t] (rebuilt per record read);
//             s_h[t] = scale (q_nope_h . k_nope_h[t] + q_pe_h . k_pe[t]);  o_h = sum_t softmax(s_h)[t] v_h[t]
// with scale = 1/sqrt(nope + rope) and softmax subtracting the max. DeepSeek-V3.2 sparse decode
// is IndexerSelect (lightning-indexer scores over the fp8 indexer keys, top-k) followed by
// MlaDecode over the selected positions only.
//
// Counters. page_bytes: the record bytes of every record read (format.record_bytes() each;
// page padding and block metadata are not read). flops: a multiply-add counts 2 FLOPs, and only
// the multiply-adds of the contractions are counted (the products of a matrix-vector or dot
// product); softmax, the 1/sqrt scale, max subtraction, the relu, dequantization and the
// division by the softmax sum are not. The closed forms below are what the calls count, exactly
// (tests), and what the ledger's pricing uses. With H heads, L latent, R rope, N nope, V v dims
// and n records read:
//   absorbed: 2H (N L  +  n (L + R)  +  n L  +  V L)     = 2H (L (N + V) + n (2L + R))
//   naive:    2H n (N L  +  V L  +  N + R  +  V)        = 2H n (L (N + V) + N + R + V)
//   indexer:  2 n I (D + 1)   (I indexer heads of D dims: I·D for the dot products, I for the
//             weighted sum of the relu'd head scores)
// Bytes per generated token per layer: dense, n = context records of the latent format; sparse,
// min(context, topk) latent records + context indexer records — the ledger's read_bytes_per_token
// (ReadEntries in src/ledger/ledger.cc) summed over layers.
//
// Thread-safety: pure functions over a manager that the caller does not mutate meanwhile.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "tessera/format.h"
#include "tessera/geometry.h"
#include "tessera/request_manager.h"
#include "tessera/status.h"

namespace tessera {

enum class AttentionForm { kAbsorbed, kNaive };
std::string_view AttentionFormName(AttentionForm form);
// "absorbed" | "naive"; else kInvalidArgument on "attention".
Result<AttentionForm> ParseAttentionForm(std::string_view name);

// The MLA dims a decode needs. Of(): an MLA model without windows (DeepSeek-V2/V3/V3.2, Kimi-K2);
// kInvalidArgument on "model" for MHA/GQA or hybrid (V4) models.
struct MlaDims {
  uint32_t heads = 0;
  uint32_t latent = 0;  // kv_lora_rank
  uint32_t rope = 0;
  uint32_t nope = 0;
  uint32_t v = 0;
  static Result<MlaDims> Of(const Geometry& g);
  float scale() const;  // 1/sqrt(nope + rope), in float
};

// The lightning indexer's dims (DeepSeek-V3.2). Of(): kInvalidArgument on "index_n_heads" when
// the model has no indexer.
struct IndexerDims {
  uint32_t heads = 0;
  uint32_t head_dim = 0;
  uint32_t topk = 0;
  static Result<IndexerDims> Of(const Geometry& g);
};

struct AttentionCounters {
  uint64_t page_bytes = 0;  // bytes of page records read
  uint64_t records = 0;     // records read
  uint64_t flops = 0;       // see the convention above
  AttentionCounters& operator+=(const AttentionCounters& o) {
    page_bytes += o.page_bytes;
    records += o.records;
    flops += o.flops;
    return *this;
  }
};

// Closed forms of the FLOP counts above (n = records read). Wrap only past 2^64, far beyond any
// context a decode can hold.
uint64_t MlaDecodeFlops(const MlaDims& d, AttentionForm form, uint64_t records);
uint64_t IndexerFlops(const IndexerDims& d, uint64_t records);

// One layer of one request's pages: the latent group (the pool group whose format is used for
// the latent) and, for a model with an indexer, the indexer group. Pool group layer i is model
// layer i (MLA models hold every main layer, then MTP layers, in one group per cache).
class PagedLayer {
 public:
  // Errors: "request" / "layer" when the manager has no such request or layer; "kv-format" when
  // the latent format is not one the decode reads (kMlaLatent or kFp8DsMla, with `latent` and
  // `rope` regions of the model's dims); "indexer-format" when the indexer format is not
  // indexer-fp8 of head_dim keys.
  static Result<PagedLayer> Of(const RequestManager& manager, RequestId request, uint32_t layer);

  // The records of the token being computed, encoded in the layer's formats but not yet in a
  // page: the manager appends a token to every layer at once, while a forward pass needs the
  // token's own record in layer l before it can compute layer l + 1. While set, position
  // manager tokens (the next one) reads these bytes, which the caller then appends verbatim, so
  // what attention reads is exactly what the page will hold. Spans must outlive the reads; the
  // indexer span is ignored for a model without an indexer. Sizes are checked on read.
  void SetPending(std::span<const std::byte> latent_record, std::span<const std::byte> indexer_record) {
    pending_latent_ = latent_record;
    pending_indexer_ = indexer_record;
    pending_ = true;
  }

  // Tokens readable: those the request has written, plus the pending one when set.
  uint64_t tokens() const;
  const RecordFormat& latent_format() const { return *latent_format_; }
  // nullptr for a model without an indexer.
  const RecordFormat* indexer_format() const { return indexer_format_; }
  uint32_t latent_dim() const { return latent_dim_; }
  uint32_t rope_dim() const { return rope_dim_; }

  // Decodes the record of `position`: latent (latent_dim floats) and rope (rope_dim floats); adds
  // its record bytes to counters->page_bytes (counters may be null).
  Status ReadLatent(uint64_t position, std::span<float> latent, std::span<float> rope,
                    AttentionCounters* counters) const;
  // Decodes the indexer key of `position` (head_dim floats: e4m3 x the record's fp32 scale).
  Status ReadIndexerKey(uint64_t position, std::span<float> key, AttentionCounters* counters) const;

 private:
  const RequestManager* manager_ = nullptr;
  RequestId request_;
  uint32_t layer_ = 0;
  uint32_t latent_group_ = 0;
  int32_t indexer_group_ = -1;
  const RecordFormat* latent_format_ = nullptr;
  const RecordFormat* indexer_format_ = nullptr;
  uint32_t latent_dim_ = 0;
  uint32_t rope_dim_ = 0;
  uint32_t indexer_dim_ = 0;
  bool pending_ = false;
  std::span<const std::byte> pending_latent_;
  std::span<const std::byte> pending_indexer_;
};

// One query token in one layer.
struct MlaQuery {
  std::span<const float> q_nope;  // heads x nope
  std::span<const float> q_pe;    // heads x rope, RoPE already applied
};

// Attention of `query` over the records at `positions` (each < pages.tokens(), any order; the
// sums run in the order given). wkv_b: [heads*(nope+v), latent] row-major. out: heads x v (o_0,
// o_1, ...). Errors: kInvalidArgument naming the span ("q_nope", "q_pe", "wkv_b", "out",
// "positions" when empty or out of range). counters (may be null) are added to.
Status MlaDecode(const PagedLayer& pages, std::span<const uint64_t> positions, const MlaQuery& query,
                 std::span<const float> wkv_b, const MlaDims& dims, AttentionForm form, std::span<float> out,
                 AttentionCounters* counters);

// The decode in the terms an attention kernel takes it (FlashMLA, FlashInfer's MLA: the absorbed
// query, the latent as the value). Per head h, with c[t] and k_pe[t] the latent and rope of
// record t:
//   s_h[t] = softmax_scale (q_lat_h . c[t] + q_pe_h . k_pe[t]);  out_h = sum_t softmax(s_h)[t] c[t];
//   lse_h = log sum_t exp(s_h[t])   (natural log; FlashInfer returns it in base 2 by default).
// MlaDecode(kAbsorbed) is W_UV_h applied to out_h with q_lat_h = W_UK_h^T q_nope_h and
// softmax_scale = MlaDims::scale(), bit for bit: both run the same code.
struct LatentQuery {
  std::span<const float> q_lat;  // heads x latent
  std::span<const float> q_pe;   // heads x rope, RoPE already applied
  uint32_t heads = 0;
  float softmax_scale = 0.0f;
};

// Closed form of MlaLatentDecode's FLOP count: 2 H n (2 L + R).
uint64_t MlaLatentDecodeFlops(uint32_t heads, uint32_t latent, uint32_t rope, uint64_t records);

// Attention of `query` over the records at `positions` (as MlaDecode). out: heads x latent; lse:
// heads. Errors: kInvalidArgument naming "heads", "softmax_scale" (not positive and finite), the
// spans ("q_lat", "q_pe", "out", "lse") or "positions".
Status MlaLatentDecode(const PagedLayer& pages, std::span<const uint64_t> positions, const LatentQuery& query,
                       std::span<float> out, std::span<float> lse, AttentionCounters* counters);

// The lightning indexer's query for one token in one layer (after its Hadamard transform).
struct IndexerQuery {
  std::span<const float> q;        // heads x head_dim
  std::span<const float> weights;  // heads: w_j, already scaled (ADR 0017)
};

// score[t] = sum_j weights[j] relu(q_j . key[t]) over t in 0..context-1 (keys read from the
// indexer pages); selected = the min(topk, context) highest scores, ties to the lower position,
// returned in ascending position order. Errors: "context" when 0 or beyond pages.tokens(),
// "indexer-format" when the layer has no indexer, spans as MlaDecode.
Status IndexerSelect(const PagedLayer& pages, uint64_t context, const IndexerQuery& query, const IndexerDims& dims,
                     std::vector<uint64_t>* selected, AttentionCounters* counters);

}  // namespace tessera

#include "tessera/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "tessera/codec.h"

namespace tessera {

std::string_view AttentionFormName(AttentionForm form) {
  return form == AttentionForm::kAbsorbed ? "absorbed" : "naive";
}

Result<AttentionForm> ParseAttentionForm(std::string_view name) {
  if (name == "absorbed") return AttentionForm::kAbsorbed;
  if (name == "naive") return AttentionForm::kNaive;
  return InvalidArgument("attention", "unknown form '" + std::string(name) + "' (absorbed, naive)");
}

Result<MlaDims> MlaDims::Of(const Geometry& g) {
  if (!g.is_mla) return InvalidArgument("model", g.name + " is not an MLA model");
  if (g.is_hybrid) return InvalidArgument("model", g.name + " is a hybrid (DeepSeek-V4) model; not supported");
  if (g.kv_lora_rank == 0 || g.qk_rope_head_dim == 0 || g.qk_nope_head_dim == 0 || g.v_head_dim == 0 ||
      g.num_attention_heads == 0) {
    return InvalidArgument("model", g.name + " lacks MLA dims");
  }
  return MlaDims{g.num_attention_heads, g.kv_lora_rank, g.qk_rope_head_dim, g.qk_nope_head_dim, g.v_head_dim};
}

float MlaDims::scale() const { return 1.0f / std::sqrt(static_cast<float>(nope + rope)); }

Result<IndexerDims> IndexerDims::Of(const Geometry& g) {
  if (g.index_n_heads == 0 || g.index_head_dim == 0 || g.index_topk == 0) {
    return InvalidArgument("index_n_heads", g.name + " has no lightning indexer");
  }
  return IndexerDims{g.index_n_heads, g.index_head_dim, g.index_topk};
}

uint64_t MlaDecodeFlops(const MlaDims& d, AttentionForm form, uint64_t records) {
  const uint64_t h = d.heads, l = d.latent, r = d.rope, n = d.nope, v = d.v;
  if (form == AttentionForm::kAbsorbed) return 2 * h * (l * (n + v) + records * (2 * l + r));
  return 2 * h * records * (l * (n + v) + n + r + v);
}

uint64_t IndexerFlops(const IndexerDims& d, uint64_t records) {
  return 2 * records * uint64_t{d.heads} * (uint64_t{d.head_dim} + 1);
}

namespace {

// Byte offset and element type of a region of a per-token record.
struct RegionAt {
  uint64_t offset = 0;
  const Region* region = nullptr;
};

Result<RegionAt> FindRegion(const RecordFormat& f, std::string_view name, std::string_view field) {
  uint64_t bits = 0;
  for (const Region& r : f.regions) {
    if (r.name == name) {
      if (bits % 8 != 0) return InvalidArgument(std::string(field), f.name + ": region not byte aligned");
      return RegionAt{bits / 8, &r};
    }
    bits += r.bits();
  }
  return InvalidArgument(std::string(field), f.name + " has no '" + std::string(name) + "' region");
}

Status CheckSpan(std::string_view field, size_t got, uint64_t want) {
  if (got != want) {
    return InvalidArgument(std::string(field),
                           "holds " + std::to_string(got) + " floats, expected " + std::to_string(want));
  }
  return Status::Ok();
}

float Dot(const float* a, const float* b, size_t n) {
  float s = 0.0f;
  for (size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// In place: exp(s - max) / sum. Returns the log-sum-exp, max + log(sum) (natural log).
float Softmax(std::span<float> s) {
  float m = -INFINITY;
  for (float x : s) m = std::max(m, x);
  float sum = 0.0f;
  for (float& x : s) {
    x = std::exp(x - m);
    sum += x;
  }
  for (float& x : s) x /= sum;
  return m + std::log(sum);
}

}  // namespace

Result<PagedLayer> PagedLayer::Of(const RequestManager& manager, RequestId request, uint32_t layer) {
  PagedLayer p;
  p.manager_ = &manager;
  p.request_ = request;
  p.layer_ = layer;
  // A request id past the table is refused by Record; check it exists through Tokens+BlockTable.
  const auto& groups = manager.pool().groups();
  bool have_latent = false;
  for (size_t i = 0; i < groups.size(); ++i) {
    const PoolGroup& g = groups[i];
    if (g.page.compress_ratio != 1) continue;
    if (g.format.use == FormatUse::kLatent && !have_latent) {
      p.latent_group_ = static_cast<uint32_t>(i);
      p.latent_format_ = &g.format;
      have_latent = true;
    } else if (g.format.use == FormatUse::kIndexer && p.indexer_group_ < 0) {
      p.indexer_group_ = static_cast<int32_t>(i);
      p.indexer_format_ = &g.format;
    }
  }
  if (!have_latent) return InvalidArgument("kv-format", "the manager holds no per-token latent pages");
  if (layer >= groups[p.latent_group_].layers) {
    return InvalidArgument("layer", "no layer " + std::to_string(layer));
  }
  const RecordFormat& f = *p.latent_format_;
  if (f.packing != Packing::kPerToken ||
      (f.family != FormatFamily::kMlaLatent && f.family != FormatFamily::kFp8DsMla)) {
    return InvalidArgument("kv-format", f.name + " is not a format the reference decode reads (mla-*, fp8_ds_mla)");
  }
  TESSERA_ASSIGN_OR_RETURN(RegionAt lat, FindRegion(f, "latent", "kv-format"));
  TESSERA_ASSIGN_OR_RETURN(RegionAt rope, FindRegion(f, "rope", "kv-format"));
  p.latent_dim_ = static_cast<uint32_t>(lat.region->count);
  p.rope_dim_ = static_cast<uint32_t>(rope.region->count);
  if (f.family == FormatFamily::kFp8DsMla && (p.latent_dim_ != kFp8DsMlaLatentDim || p.rope_dim_ != kFp8DsMlaRopeDim ||
                                              f.record_bytes() != kFp8DsMlaRecordBytes)) {
    return InvalidArgument("kv-format", "fp8_ds_mla needs a 512 + 64 latent");
  }
  if (p.indexer_format_ != nullptr) {
    const RecordFormat& fi = *p.indexer_format_;
    if (fi.regions.size() != 2 || fi.regions[0].name != "key" || fi.regions[0].type != ElementType::kFp8E4M3 ||
        fi.regions[1].type != ElementType::kFp32 || fi.regions[1].count != 1) {
      return InvalidArgument("indexer-format", fi.name + " is not a format the reference indexer reads (indexer-fp8)");
    }
    p.indexer_dim_ = static_cast<uint32_t>(fi.regions[0].count);
    if (layer >= groups[static_cast<size_t>(p.indexer_group_)].layers) {
      return InvalidArgument("layer", "no indexer layer " + std::to_string(layer));
    }
  }
  // The request must exist (Record names "request" otherwise).
  if (manager.Tokens(request) > 0) {
    TESSERA_RETURN_IF_ERROR(manager.Record(request, p.latent_group_, layer, 0).status());
  }
  return p;
}

uint64_t PagedLayer::tokens() const { return manager_->Tokens(request_) + (pending_ ? 1 : 0); }

namespace {

// Pending bytes as the read-only record the region helpers take.
ConstRecordView PendingView(std::span<const std::byte> bytes) {
  ConstRecordView v;
  v.planes[0] = bytes;
  return v;
}

}  // namespace

Status PagedLayer::ReadLatent(uint64_t position, std::span<float> latent, std::span<float> rope,
                              AttentionCounters* counters) const {
  TESSERA_RETURN_IF_ERROR(CheckSpan("latent", latent.size(), latent_dim_));
  TESSERA_RETURN_IF_ERROR(CheckSpan("rope", rope.size(), rope_dim_));
  const RecordFormat& f = *latent_format_;
  ConstRecordView view;
  if (pending_ && position == manager_->Tokens(request_)) {
    if (pending_latent_.size() != f.record_bytes()) return InvalidArgument("record", "pending record size differs");
    view = PendingView(pending_latent_);
  } else {
    TESSERA_ASSIGN_OR_RETURN(view, manager_->Record(request_, latent_group_, layer_, position));
  }
  const std::span<const std::byte> rec = view.planes[0].first(f.record_bytes());
  if (f.family == FormatFamily::kFp8DsMla) {
    TESSERA_RETURN_IF_ERROR(DequantizeFp8DsMla(rec, latent, rope));
  } else if (f.single_element_type() && f.regions[0].type == ElementType::kBf16 && f.regions[0].name == "latent") {
    // Fast path for mla-bf16: latent then rope, little-endian bf16.
    const std::byte* b = rec.data();
    for (uint32_t i = 0; i < latent_dim_; ++i, b += 2) {
      latent[i] =
          Bf16ToFloat(static_cast<uint16_t>(std::to_integer<uint16_t>(b[0]) | (std::to_integer<uint16_t>(b[1]) << 8)));
    }
    for (uint32_t i = 0; i < rope_dim_; ++i, b += 2) {
      rope[i] =
          Bf16ToFloat(static_cast<uint16_t>(std::to_integer<uint16_t>(b[0]) | (std::to_integer<uint16_t>(b[1]) << 8)));
    }
  } else {
    TESSERA_ASSIGN_OR_RETURN(RegionView lv, RegionOf(f, view, "latent"));
    TESSERA_ASSIGN_OR_RETURN(RegionView rv, RegionOf(f, view, "rope"));
    for (uint32_t i = 0; i < latent_dim_; ++i) latent[i] = lv.Get(i);
    for (uint32_t i = 0; i < rope_dim_; ++i) rope[i] = rv.Get(i);
  }
  if (counters != nullptr) {
    counters->page_bytes += f.record_bytes();
    counters->records += 1;
  }
  return Status::Ok();
}

Status PagedLayer::ReadIndexerKey(uint64_t position, std::span<float> key, AttentionCounters* counters) const {
  if (indexer_format_ == nullptr) return InvalidArgument("indexer-format", "the model has no indexer pages");
  TESSERA_RETURN_IF_ERROR(CheckSpan("key", key.size(), indexer_dim_));
  const uint64_t bytes = indexer_format_->record_bytes();
  if (!pending_ || position != manager_->Tokens(request_)) {
    // The pages' layout (region-major by default: the key in plane 0, its scale in plane 1).
    TESSERA_ASSIGN_OR_RETURN(ConstRecordView view,
                             manager_->Record(request_, static_cast<uint32_t>(indexer_group_), layer_, position));
    TESSERA_RETURN_IF_ERROR(ReadIndexerFp8(*indexer_format_, view, key));
  } else {
    TESSERA_RETURN_IF_ERROR(DequantizeIndexerFp8(pending_indexer_, key));  // a per-token record
  }
  if (counters != nullptr) {
    counters->page_bytes += bytes;
    counters->records += 1;
  }
  return Status::Ok();
}

namespace {

// Every position below the pages' tokens, and at least one.
Status CheckPositions(const PagedLayer& pages, std::span<const uint64_t> positions) {
  if (positions.empty()) return InvalidArgument("positions", "no positions to attend to");
  const uint64_t tokens = pages.tokens();
  for (uint64_t p : positions) {
    if (p >= tokens) return InvalidArgument("positions", "position " + std::to_string(p) + " not written");
  }
  return Status::Ok();
}

// The latent attention both the absorbed form and the kernels' form compute: per head h,
// softmax over scale (q_lat_h . c[t] + q_pe_h . k_pe[t]) and out_h = sum_t p[t] c[t] (heads x
// latent); lse (heads, or empty) the log-sum-exp of the scaled scores. Each record is read once.
Status LatentAttention(const PagedLayer& pages, std::span<const uint64_t> positions, std::span<const float> q_lat,
                       std::span<const float> q_pe, size_t heads, float scale, std::span<float> out,
                       std::span<float> lse, AttentionCounters* counters) {
  const size_t H = heads, L = pages.latent_dim(), R = pages.rope_dim(), n = positions.size();
  std::vector<float> kpe(R);
  std::vector<float> scores(H * n);  // [h][t]
  std::vector<float> cs(n * L);      // the latent rows, kept for the weighted sum
  for (size_t t = 0; t < n; ++t) {
    TESSERA_RETURN_IF_ERROR(pages.ReadLatent(positions[t], std::span(cs).subspan(t * L, L), kpe, counters));
    for (size_t h = 0; h < H; ++h) {
      scores[h * n + t] =
          scale * (Dot(q_lat.data() + h * L, cs.data() + t * L, L) + Dot(q_pe.data() + h * R, kpe.data(), R));
    }
  }
  for (size_t h = 0; h < H; ++h) {
    std::span<float> s(scores.data() + h * n, n);
    const float h_lse = Softmax(s);
    if (!lse.empty()) lse[h] = h_lse;
    float* acc = out.data() + h * L;
    std::fill(acc, acc + L, 0.0f);
    for (size_t t = 0; t < n; ++t) {
      const float* ct = cs.data() + t * L;
      for (size_t j = 0; j < L; ++j) acc[j] += s[t] * ct[j];
    }
  }
  return Status::Ok();
}

// Absorbed: q_lat_h = W_UK_h^T q_nope_h, the latent attention, then o_h = W_UV_h acc_h.
Status AbsorbedDecode(const PagedLayer& pages, std::span<const uint64_t> positions, const MlaQuery& query,
                      std::span<const float> wkv_b, const MlaDims& d, std::span<float> out,
                      AttentionCounters* counters) {
  const size_t H = d.heads, L = d.latent, N = d.nope, V = d.v;
  std::vector<float> q_lat(H * L, 0.0f);
  for (size_t h = 0; h < H; ++h) {
    float* ql = q_lat.data() + h * L;
    const float* qn = query.q_nope.data() + h * N;
    const float* w = wkv_b.data() + h * (N + V) * L;
    for (size_t i = 0; i < N; ++i) {
      const float qi = qn[i];
      const float* row = w + i * L;
      for (size_t j = 0; j < L; ++j) ql[j] += qi * row[j];
    }
  }
  std::vector<float> acc(H * L);
  TESSERA_RETURN_IF_ERROR(LatentAttention(pages, positions, q_lat, query.q_pe, H, d.scale(), acc, {}, counters));
  for (size_t h = 0; h < H; ++h) {
    const float* w = wkv_b.data() + (h * (N + V) + N) * L;
    for (size_t i = 0; i < V; ++i) out[h * V + i] = Dot(w + i * L, acc.data() + h * L, L);
  }
  return Status::Ok();
}

// Naive: per record, K and V of every head rebuilt from the latent.
Status NaiveDecode(const PagedLayer& pages, std::span<const uint64_t> positions, const MlaQuery& query,
                   std::span<const float> wkv_b, const MlaDims& d, std::span<float> out, AttentionCounters* counters) {
  const size_t H = d.heads, L = d.latent, R = d.rope, N = d.nope, V = d.v, n = positions.size();
  const float scale = d.scale();
  std::vector<float> c(L), kpe(R);
  std::vector<float> scores(H * n);  // [h][t]
  std::vector<float> vs(H * n * V);  // [h][t][v]
  std::vector<float> k(N);
  for (size_t t = 0; t < n; ++t) {
    TESSERA_RETURN_IF_ERROR(pages.ReadLatent(positions[t], c, kpe, counters));
    for (size_t h = 0; h < H; ++h) {
      const float* wk = wkv_b.data() + h * (N + V) * L;
      for (size_t i = 0; i < N; ++i) k[i] = Dot(wk + i * L, c.data(), L);
      const float* wv = wk + N * L;
      float* vt = vs.data() + (h * n + t) * V;
      for (size_t i = 0; i < V; ++i) vt[i] = Dot(wv + i * L, c.data(), L);
      scores[h * n + t] =
          scale * (Dot(query.q_nope.data() + h * N, k.data(), N) + Dot(query.q_pe.data() + h * R, kpe.data(), R));
    }
  }
  for (size_t h = 0; h < H; ++h) {
    std::span<float> s(scores.data() + h * n, n);
    Softmax(s);
    float* o = out.data() + h * V;
    std::fill(o, o + V, 0.0f);
    for (size_t t = 0; t < n; ++t) {
      const float* vt = vs.data() + (h * n + t) * V;
      for (size_t i = 0; i < V; ++i) o[i] += s[t] * vt[i];
    }
  }
  return Status::Ok();
}

}  // namespace

Status MlaDecode(const PagedLayer& pages, std::span<const uint64_t> positions, const MlaQuery& query,
                 std::span<const float> wkv_b, const MlaDims& d, AttentionForm form, std::span<float> out,
                 AttentionCounters* counters) {
  const size_t H = d.heads, L = d.latent, R = d.rope, N = d.nope, V = d.v;
  if (pages.latent_dim() != L || pages.rope_dim() != R) {
    return InvalidArgument("kv-format", "page records are " + std::to_string(pages.latent_dim()) + " + " +
                                            std::to_string(pages.rope_dim()) + ", the model's " + std::to_string(L) +
                                            " + " + std::to_string(R));
  }
  TESSERA_RETURN_IF_ERROR(CheckSpan("q_nope", query.q_nope.size(), H * N));
  TESSERA_RETURN_IF_ERROR(CheckSpan("q_pe", query.q_pe.size(), H * R));
  TESSERA_RETURN_IF_ERROR(CheckSpan("wkv_b", wkv_b.size(), H * (N + V) * L));
  TESSERA_RETURN_IF_ERROR(CheckSpan("out", out.size(), H * V));
  TESSERA_RETURN_IF_ERROR(CheckPositions(pages, positions));
  AttentionCounters local;
  TESSERA_RETURN_IF_ERROR(form == AttentionForm::kAbsorbed
                              ? AbsorbedDecode(pages, positions, query, wkv_b, d, out, &local)
                              : NaiveDecode(pages, positions, query, wkv_b, d, out, &local));
  local.flops = MlaDecodeFlops(d, form, positions.size());
  if (counters != nullptr) *counters += local;
  return Status::Ok();
}

uint64_t MlaLatentDecodeFlops(uint32_t heads, uint32_t latent, uint32_t rope, uint64_t records) {
  return 2 * uint64_t{heads} * records * (2 * uint64_t{latent} + rope);
}

Status MlaLatentDecode(const PagedLayer& pages, std::span<const uint64_t> positions, const LatentQuery& query,
                       std::span<float> out, std::span<float> lse, AttentionCounters* counters) {
  const size_t H = query.heads, L = pages.latent_dim(), R = pages.rope_dim();
  if (H == 0) return InvalidArgument("heads", "0 heads");
  if (!(query.softmax_scale > 0.0f) || !std::isfinite(query.softmax_scale)) {
    return InvalidArgument("softmax_scale", "must be a positive finite number");
  }
  TESSERA_RETURN_IF_ERROR(CheckSpan("q_lat", query.q_lat.size(), H * L));
  TESSERA_RETURN_IF_ERROR(CheckSpan("q_pe", query.q_pe.size(), H * R));
  TESSERA_RETURN_IF_ERROR(CheckSpan("out", out.size(), H * L));
  TESSERA_RETURN_IF_ERROR(CheckSpan("lse", lse.size(), H));
  TESSERA_RETURN_IF_ERROR(CheckPositions(pages, positions));
  AttentionCounters local;
  TESSERA_RETURN_IF_ERROR(
      LatentAttention(pages, positions, query.q_lat, query.q_pe, H, query.softmax_scale, out, lse, &local));
  local.flops = MlaLatentDecodeFlops(static_cast<uint32_t>(H), static_cast<uint32_t>(L), static_cast<uint32_t>(R),
                                     positions.size());
  if (counters != nullptr) *counters += local;
  return Status::Ok();
}

Status IndexerSelect(const PagedLayer& pages, uint64_t context, const IndexerQuery& query, const IndexerDims& d,
                     std::vector<uint64_t>* selected, AttentionCounters* counters) {
  if (pages.indexer_format() == nullptr) return InvalidArgument("indexer-format", "the model has no indexer pages");
  if (context == 0 || context > pages.tokens()) {
    return InvalidArgument("context",
                           std::to_string(context) + " tokens; the request holds " + std::to_string(pages.tokens()));
  }
  const size_t I = d.heads, D = d.head_dim;
  TESSERA_RETURN_IF_ERROR(CheckSpan("q", query.q.size(), I * D));
  TESSERA_RETURN_IF_ERROR(CheckSpan("weights", query.weights.size(), I));
  AttentionCounters local;
  std::vector<float> key(D);
  std::vector<float> score(context);
  for (uint64_t t = 0; t < context; ++t) {
    TESSERA_RETURN_IF_ERROR(pages.ReadIndexerKey(t, key, &local));
    float s = 0.0f;
    for (size_t j = 0; j < I; ++j) s += query.weights[j] * std::max(0.0f, Dot(query.q.data() + j * D, key.data(), D));
    score[t] = std::isnan(s) ? -INFINITY : s;  // a NaN (a corrupt key) ranks last: keeps the order strict
  }
  std::vector<uint64_t> order(context);
  for (uint64_t t = 0; t < context; ++t) order[t] = t;
  const uint64_t k = std::min<uint64_t>(d.topk, context);
  // Highest score first, ties to the lower position.
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](uint64_t a, uint64_t b) { return score[a] > score[b] || (score[a] == score[b] && a < b); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  *selected = std::move(order);
  local.flops = IndexerFlops(d, context);
  if (counters != nullptr) *counters += local;
  return Status::Ok();
}

}  // namespace tessera

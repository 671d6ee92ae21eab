// The tiny models' forward (ADR 0017) over a RequestManager's pages.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "tessera/codec.h"
#include "tessera/model.h"
#include "tessera/v4_attention.h"

namespace tessera {

namespace {

void RmsNorm(std::span<const float> v, const std::vector<float>& w, float eps, std::span<float> out) {
  float ss = 0.0f;
  for (float x : v) ss += x * x;
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(v.size()) + eps);
  for (size_t i = 0; i < v.size(); ++i) out[i] = v[i] * r * w[i];
}

void LayerNorm(std::span<float> v, const std::vector<float>& w, const std::vector<float>& b, float eps) {
  float mean = 0.0f;
  for (float x : v) mean += x;
  mean /= static_cast<float>(v.size());
  float var = 0.0f;
  for (float x : v) var += (x - mean) * (x - mean);
  var /= static_cast<float>(v.size());
  const float r = 1.0f / std::sqrt(var + eps);
  for (size_t i = 0; i < v.size(); ++i) v[i] = (v[i] - mean) * r * w[i] + b[i];
}

// Angle of pair i at position p: p * theta^(-2i/dim), in double; cos/sin rounded to float.
void Angle(double theta, uint64_t p, size_t i, size_t dim, float* c, float* s) {
  const double a = static_cast<double>(p) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(dim));
  *c = static_cast<float>(std::cos(a));
  *s = static_cast<float>(std::sin(a));
}

// Half split (the V3.2 indexer): pairs (x[i], x[i + d/2]).
void RopeHalf(std::span<float> x, uint64_t p, double theta) {
  const size_t half = x.size() / 2;
  for (size_t i = 0; i < half; ++i) {
    float c, s;
    Angle(theta, p, i, x.size(), &c, &s);
    const float a = x[i], b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = a * s + b * c;
  }
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

void MatVec(std::span<const float> w, std::span<const float> x, std::span<float> y) {
  const size_t in = x.size();
  for (size_t o = 0; o < y.size(); ++o) {
    const float* row = w.data() + o * in;
    float s = 0.0f;
    for (size_t i = 0; i < in; ++i) s += row[i] * x[i];
    y[o] = s;
  }
}

struct TinyRunner::Cache {
  struct Layer {
    const std::vector<float>*attn_norm, *wq_a, *q_norm, *wq_b, *wkv_a, *kv_norm, *wkv_b, *wo;
    const std::vector<float>*ffn_norm, *w1, *w3, *w2;
    const std::vector<float>*iwq_b = nullptr, *iwk = nullptr, *ik_norm_w = nullptr, *ik_norm_b = nullptr,
          *iweights = nullptr;
  };
  std::vector<Layer> layers;
  const std::vector<float>*embed, *norm, *head;
  uint32_t latent_group = 0;
  int32_t indexer_group = -1;
  uint64_t latent_bytes = 0, indexer_bytes = 0;
  // The token being computed: its records per layer, appended verbatim after the forward.
  std::vector<std::vector<std::byte>> latent_records, indexer_records;
};

TinyRunner::~TinyRunner() = default;

Result<std::unique_ptr<TinyRunner>> TinyRunner::Create(TinyConfig config, Weights weights, const RunOptions& options) {
  TESSERA_RETURN_IF_ERROR(CheckTinyKvFormat(options.kv_format));
  if (weights.model != config.name)
    return InvalidArgument("weights", "weights of " + weights.model + ", not " + config.name);
  for (const TensorSpec& t : WeightSpecs(config)) {
    auto it = weights.tensors.find(t.name);
    if (it == weights.tensors.end() || it->second.size() != t.elements())
      return InvalidArgument("weights", t.name + ": missing");
  }
  ManagerOptions mo;
  mo.kv_format = options.kv_format;
  mo.block_tokens = options.block_tokens;
  mo.capacity_blocks = options.capacity_blocks;
  mo.max_requests = 16;
  mo.region_kind = RegionKind::kHost;
  mo.hash_key_seed = 0x7e55e7a;  // fixed: tier tests reopen blocks by key across managers
  mo.weights_revision = config.name + "/seed=" + std::to_string(weights.seed);
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<RequestManager> m, RequestManager::Create(config.geometry, mo));
  std::unique_ptr<TinyRunner> r(new TinyRunner());
  r->cache_ = std::make_unique<Cache>();
  Cache& c = *r->cache_;
  const auto& groups = m->pool().groups();
  bool have_latent = false;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i].format.use == FormatUse::kLatent && !have_latent) {
      c.latent_group = static_cast<uint32_t>(i);
      c.latent_bytes = groups[i].format.record_bytes();
      have_latent = true;
    } else if (groups[i].format.use == FormatUse::kIndexer) {
      c.indexer_group = static_cast<int32_t>(i);
      c.indexer_bytes = groups[i].format.record_bytes();
      if (groups[i].format.name != "indexer-fp8") {
        return InvalidArgument("indexer-format", groups[i].format.name + " (the tiny models write indexer-fp8)");
      }
    }
  }
  if (!have_latent) return InvalidArgument("kv-format", "no latent pages");
  if (config.has_indexer() != (c.indexer_group >= 0))
    return InvalidArgument("indexer-format", "indexer pages mismatch");
  r->config_ = std::move(config);
  r->weights_ = std::move(weights);
  r->options_ = options;
  r->manager_ = std::move(m);
  const Weights& w = r->weights_;
  c.embed = &w.at("embed.weight");
  c.norm = &w.at("norm.weight");
  c.head = &w.at("head.weight");
  for (uint32_t l = 0; l < r->config_.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    Cache::Layer L{};
    L.attn_norm = &w.at(p + "attn_norm.weight");
    L.wq_a = &w.at(p + "attn.wq_a.weight");
    L.q_norm = &w.at(p + "attn.q_norm.weight");
    L.wq_b = &w.at(p + "attn.wq_b.weight");
    L.wkv_a = &w.at(p + "attn.wkv_a.weight");
    L.kv_norm = &w.at(p + "attn.kv_norm.weight");
    L.wkv_b = &w.at(p + "attn.wkv_b.weight");
    L.wo = &w.at(p + "attn.wo.weight");
    L.ffn_norm = &w.at(p + "ffn_norm.weight");
    L.w1 = &w.at(p + "ffn.w1.weight");
    L.w3 = &w.at(p + "ffn.w3.weight");
    L.w2 = &w.at(p + "ffn.w2.weight");
    if (r->config_.has_indexer()) {
      L.iwq_b = &w.at(p + "attn.indexer.wq_b.weight");
      L.iwk = &w.at(p + "attn.indexer.wk.weight");
      L.ik_norm_w = &w.at(p + "attn.indexer.k_norm.weight");
      L.ik_norm_b = &w.at(p + "attn.indexer.k_norm.bias");
      L.iweights = &w.at(p + "attn.indexer.weights_proj.weight");
    }
    c.layers.push_back(L);
  }
  c.latent_records.assign(r->config_.layers, std::vector<std::byte>(c.latent_bytes));
  c.indexer_records.assign(r->config_.layers, std::vector<std::byte>(c.indexer_bytes));
  return r;
}

namespace {

// The token's latent record of one layer, as the page will hold it.
Status EncodeLatent(std::string_view kv_format, std::span<const float> latent, std::span<const float> k_pe,
                    std::span<std::byte> rec) {
  if (kv_format == "fp8_ds_mla") return QuantizeFp8DsMla(latent, k_pe, rec);
  size_t at = 0;  // mla-bf16: latent then rope, little-endian bf16
  auto put = [&](float f) {
    const uint16_t b = FloatToBf16(f);
    rec[at++] = static_cast<std::byte>(b & 0xff);
    rec[at++] = static_cast<std::byte>(b >> 8);
  };
  for (float f : latent) put(f);
  for (float f : k_pe) put(f);
  return Status::Ok();
}

}  // namespace

Status TinyRunner::Step(RequestId rid, uint32_t token, std::span<float> logits, AttentionCounters* counters) {
  const TinyConfig& cf = config_;
  Cache& c = *cache_;
  if (token >= cf.vocab)
    return InvalidArgument("token", std::to_string(token) + " is not below vocab " + std::to_string(cf.vocab));
  if (logits.size() != cf.vocab) return InvalidArgument("logits", "must hold vocab floats");
  const uint64_t p = manager_->Tokens(rid);
  const size_t D = cf.hidden;
  std::vector<float> h(c.embed->begin() + static_cast<std::ptrdiff_t>(token * D),
                       c.embed->begin() + static_cast<std::ptrdiff_t>((token + 1) * D));
  std::vector<float> x(D);
  for (uint32_t l = 0; l < cf.layers; ++l) TESSERA_RETURN_IF_ERROR(Layer(rid, l, p, h, counters));
  RmsNorm(h, *c.norm, cf.rms_eps, x);
  MatVec(*c.head, x, logits);
  // Append: the writer copies the records attention just read.
  const uint32_t lg = c.latent_group;
  const int32_t ig = c.indexer_group;
  const std::vector<PoolGroup>& groups = manager_->pool().groups();
  auto writer = [&c, &groups, lg, ig](uint32_t group, uint32_t layer, uint64_t, const RecordView& view) {
    if (group != lg && static_cast<int32_t>(group) != ig) return;  // the tiny models have no other group
    const std::vector<std::byte>& src = group == lg ? c.latent_records[layer] : c.indexer_records[layer];
    // Per-token records into the group's page layout (indexer-fp8 pages are region-major).
    if (!CopyRecordIn(groups[group].format, src, view).ok())
      std::memset(view.planes[0].data(), 0, view.planes[0].size());
  };
  const uint32_t tok[1] = {token};
  return manager_->Append(rid, tok, KvWriters(writer));
}

Status TinyRunner::Layer(RequestId rid, uint32_t l, uint64_t p, std::span<float> h, AttentionCounters* counters) {
  const TinyConfig& cf = config_;
  Cache& c = *cache_;
  const Cache::Layer& W = c.layers[l];
  const size_t D = cf.hidden, H = cf.heads, N = cf.nope, R = cf.rope, L = cf.kv_lora, V = cf.v;
  TESSERA_ASSIGN_OR_RETURN(const MlaDims dims, MlaDims::Of(cf.geometry));
  std::vector<float> x(D), qa(cf.q_lora), qr(cf.q_lora), q(H * (N + R)), kv(L + R), cn(L);
  std::vector<float> q_nope(H * N), q_pe(H * R), o(H * V), attn(D), y(D), f1(cf.ffn), f3(cf.ffn), f2(D);
  RmsNorm(h, *W.attn_norm, cf.rms_eps, x);
  MatVec(*W.wq_a, x, qa);
  RmsNorm(qa, *W.q_norm, cf.rms_eps, qr);
  MatVec(*W.wq_b, qr, q);
  for (size_t hd = 0; hd < H; ++hd) {
    std::copy_n(q.begin() + static_cast<std::ptrdiff_t>(hd * (N + R)), N,
                q_nope.begin() + static_cast<std::ptrdiff_t>(hd * N));
    std::copy_n(q.begin() + static_cast<std::ptrdiff_t>(hd * (N + R) + N), R,
                q_pe.begin() + static_cast<std::ptrdiff_t>(hd * R));
    RopeInterleaved(std::span(q_pe).subspan(hd * R, R), p, cf.rope_theta, false);
  }
  MatVec(*W.wkv_a, x, kv);
  RmsNorm(std::span(kv).first(L), *W.kv_norm, cf.rms_eps, cn);
  std::span<float> k_pe = std::span(kv).subspan(L, R);
  RopeInterleaved(k_pe, p, cf.rope_theta, false);
  TESSERA_RETURN_IF_ERROR(EncodeLatent(options_.kv_format, cn, k_pe, c.latent_records[l]));
  TESSERA_ASSIGN_OR_RETURN(PagedLayer pages, PagedLayer::Of(*manager_, rid, l));
  std::vector<uint64_t> positions;
  TESSERA_RETURN_IF_ERROR(Positions(l, p, x, qr, pages, &positions, counters));
  TESSERA_RETURN_IF_ERROR(
      MlaDecode(pages, positions, MlaQuery{q_nope, q_pe}, *W.wkv_b, dims, options_.form, o, counters));
  MatVec(*W.wo, o, attn);
  for (size_t i = 0; i < D; ++i) h[i] += attn[i];
  RmsNorm(h, *W.ffn_norm, cf.rms_eps, y);
  MatVec(*W.w1, y, f1);
  MatVec(*W.w3, y, f3);
  for (size_t i = 0; i < f1.size(); ++i) f1[i] = Silu(f1[i]) * f3[i];
  MatVec(*W.w2, f1, f2);
  for (size_t i = 0; i < D; ++i) h[i] += f2[i];
  return Status::Ok();
}

Status TinyRunner::Positions(uint32_t l, uint64_t p, std::span<const float> x, std::span<const float> qr,
                             PagedLayer& pages, std::vector<uint64_t>* positions, AttentionCounters* counters) {
  const TinyConfig& cf = config_;
  Cache& c = *cache_;
  const std::vector<std::byte>& rec = c.latent_records[l];
  if (!cf.has_indexer()) {
    pages.SetPending(rec, {});
    positions->resize(p + 1);
    for (uint64_t t = 0; t <= p; ++t) (*positions)[t] = t;
    return Status::Ok();
  }
  const Cache::Layer& W = c.layers[l];
  const size_t I = cf.index_heads, ID = cf.index_head_dim, R = cf.rope;
  std::vector<float> iq(I * ID), ik(ID), iw(I);
  MatVec(*W.iwq_b, qr, iq);
  for (size_t j = 0; j < I; ++j) {
    std::span<float> qj = std::span(iq).subspan(j * ID, ID);
    RopeHalf(qj.first(R), p, cf.rope_theta);
    TESSERA_RETURN_IF_ERROR(HadamardTransform(qj));
  }
  MatVec(*W.iwk, x, ik);
  LayerNorm(ik, *W.ik_norm_w, *W.ik_norm_b, 1e-6f);
  RopeHalf(std::span(ik).first(R), p, cf.rope_theta);
  TESSERA_RETURN_IF_ERROR(HadamardTransform(ik));
  TESSERA_RETURN_IF_ERROR(QuantizeIndexerFp8(ik, c.indexer_records[l]));
  MatVec(*W.iweights, x, iw);
  const float wscale = 1.0f / std::sqrt(static_cast<float>(I)) / std::sqrt(static_cast<float>(ID));
  for (float& v : iw) v *= wscale;
  pages.SetPending(rec, c.indexer_records[l]);
  TESSERA_ASSIGN_OR_RETURN(const IndexerDims idims, IndexerDims::Of(cf.geometry));
  TESSERA_RETURN_IF_ERROR(IndexerSelect(pages, p + 1, IndexerQuery{iq, iw}, idims, positions, counters));
  last_selected_.resize(cf.layers);
  last_selected_[l] = *positions;
  return Status::Ok();
}

Result<Generation> TinyRunner::Generate(std::span<const uint32_t> prompt, uint32_t steps,
                                        const std::function<Status(RequestId)>& after_prefill,
                                        std::span<const uint32_t> force) {
  if (!force.empty() && force.size() != steps) return InvalidArgument("force", "must hold `steps` tokens");
  for (uint32_t t : force) {
    if (t >= config_.vocab) return InvalidArgument("force", "token " + std::to_string(t) + " is not below vocab");
  }
  if (prompt.empty()) return InvalidArgument("prompt-tokens", "empty prompt");
  if (steps == 0) return InvalidArgument("steps", "must be at least 1");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] >= config_.vocab) {
      return InvalidArgument("prompt-tokens", "token " + std::to_string(i) + " is " + std::to_string(prompt[i]) +
                                                  ", not below vocab " + std::to_string(config_.vocab));
    }
  }
  TESSERA_RETURN_IF_ERROR(Release());
  RequestSpec spec;
  TESSERA_ASSIGN_OR_RETURN(Admission a, manager_->Admit(prompt, spec));
  request_ = a.id;
  Generation g;
  g.prompt_len = prompt.size();
  g.tokens.assign(prompt.begin(), prompt.end());
  g.cached_tokens = a.cached_tokens;
  g.tier_blocks = a.tier_blocks;
  std::vector<float> logits(config_.vocab);
  if (config_.has_indexer()) g.selected.resize(a.cached_tokens);
  for (uint64_t pos = a.cached_tokens; pos < prompt.size(); ++pos) {
    g.last_token = {};
    TESSERA_RETURN_IF_ERROR(Step(a.id, prompt[pos], logits, &g.last_token));
    g.counters += g.last_token;
    if (config_.has_indexer()) g.selected.push_back(last_selected_);
  }
  if (after_prefill) TESSERA_RETURN_IF_ERROR(after_prefill(a.id));
  for (uint32_t i = 0; i < steps; ++i) {
    const uint32_t next = !force.empty()
                              ? force[i]
                              : static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    g.logits.push_back(logits);
    g.tokens.push_back(next);
    if (i + 1 == steps) break;
    TESSERA_RETURN_IF_ERROR(manager_->AllocateSlots(a.id, 1));
    g.last_token = {};
    TESSERA_RETURN_IF_ERROR(Step(a.id, next, logits, &g.last_token));
    g.counters += g.last_token;
    if (config_.has_indexer()) g.selected.push_back(last_selected_);
  }
  return g;
}

Status TinyRunner::Release() {
  if (!request_) return Status::Ok();
  const RequestId r = *request_;
  request_.reset();
  return manager_->Free(r);
}

}  // namespace tessera

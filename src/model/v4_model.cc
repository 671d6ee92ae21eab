// tiny-v4 (ADR 0018): config, seeded weights, weight file and the runner.
#include "tessera/v4_model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

#include "tessera/checked.h"
#include "tessera/codec.h"
#include "tessera/file_io.h"

namespace tessera {

namespace {

constexpr uint32_t kIndexHeadDim = 128;  // the Hadamard size

Status Bad(const std::string& what) { return InvalidArgument("weights", what); }

// v / sqrt(mean(v^2) + eps) * w (w empty: no weight).
void RmsNorm(std::span<float> v, std::span<const float> w, float eps) {
  float ms = 0.0f;
  for (float x : v) ms += x * x;
  const float inv = 1.0f / std::sqrt(ms / static_cast<float>(v.size()) + eps);
  for (size_t i = 0; i < v.size(); ++i) v[i] = w.empty() ? v[i] * inv : v[i] * inv * w[i];
}

}  // namespace

Result<TinyV4Config> LoadTinyV4Config(std::string_view model) {
  if (model != "tiny-v4")
    return NotFound("model", "unknown tiny V4 model \"" + std::string(model) + "\" (known: tiny-v4)");
  TinyV4Config c;
  c.name = std::string(model);
  TESSERA_ASSIGN_OR_RETURN(c.geometry, LoadPreset(model));
  TESSERA_ASSIGN_OR_RETURN(std::string text, PresetConfigText(model));
  TESSERA_ASSIGN_OR_RETURN(const TinyConfigFields cfg, TinyConfigFields::Parse(c.name, text));
  const Geometry& g = c.geometry;
  if (g.model_type != "deepseek_v4") return InvalidArgument("model_type", g.model_type + " (tiny-v4 runs deepseek_v4)");
  if (cfg.Has("rope_scaling")) return InvalidArgument("rope_scaling", "the tiny forward has no YaRN");
  if (g.num_mtp_layers != 0) return InvalidArgument("num_nextn_predict_layers", "tiny-v4 has no MTP layers");
  TESSERA_ASSIGN_OR_RETURN(c.dims, V4Dims::Of(g));
  c.layers = g.num_layers;
  for (const LayerSpec& l : g.layers) c.ratios.push_back(l.compress_ratio);
  TESSERA_ASSIGN_OR_RETURN(c.hidden, cfg.Count("hidden_size"));
  TESSERA_ASSIGN_OR_RETURN(c.q_lora, cfg.Count("q_lora_rank"));
  TESSERA_ASSIGN_OR_RETURN(c.o_groups, cfg.Count("o_groups"));
  TESSERA_ASSIGN_OR_RETURN(c.o_lora, cfg.Count("o_lora_rank"));
  TESSERA_ASSIGN_OR_RETURN(c.vocab, cfg.Count("vocab_size"));
  TESSERA_ASSIGN_OR_RETURN(c.ffn, cfg.Count("intermediate_size"));
  TESSERA_ASSIGN_OR_RETURN(double eps, cfg.Number("rms_norm_eps"));
  c.rms_eps = static_cast<float>(eps);
  TESSERA_ASSIGN_OR_RETURN(c.rope_theta, cfg.Number("rope_theta"));
  TESSERA_ASSIGN_OR_RETURN(c.compress_rope_theta, cfg.Number("compress_rope_theta"));
  if (c.dims.heads % c.o_groups != 0) return InvalidArgument("o_groups", "must divide num_attention_heads");
  if (c.dims.window == 0) return InvalidArgument("sliding_window", "must be positive");
  for (uint32_t r : c.ratios) {
    if (r == 4 && (c.dims.indexer.head_dim != kIndexHeadDim || c.dims.indexer.heads == 0)) {
      return InvalidArgument("index_head_dim", "must be 128 (the Hadamard size)");
    }
  }
  return c;
}

std::vector<V4TensorSpec> TinyV4WeightSpecs(const TinyV4Config& c) {
  const uint64_t hidden = c.hidden, H = c.dims.heads, D = c.dims.head_dim, I = c.dims.indexer.heads;
  std::vector<V4TensorSpec> s;
  s.push_back({"embed.weight", {c.vocab, hidden}});
  for (uint32_t l = 0; l < c.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const uint64_t r = c.ratios[l], coff = r == 4 ? 2 : 1;
    s.push_back({p + "attn_norm.weight", {hidden}});
    s.push_back({p + "attn.attn_sink", {H}});
    s.push_back({p + "attn.wq_a.weight", {c.q_lora, hidden}});
    s.push_back({p + "attn.q_norm.weight", {c.q_lora}});
    s.push_back({p + "attn.wq_b.weight", {H * D, c.q_lora}});
    s.push_back({p + "attn.wkv.weight", {D, hidden}});
    s.push_back({p + "attn.kv_norm.weight", {D}});
    s.push_back({p + "attn.wo_a.weight", {uint64_t{c.o_groups} * c.o_lora, H * D / c.o_groups}});
    s.push_back({p + "attn.wo_b.weight", {hidden, uint64_t{c.o_groups} * c.o_lora}});
    if (r > 0) {
      s.push_back({p + "attn.compressor.ape", {r, coff * D}});
      s.push_back({p + "attn.compressor.wkv.weight", {coff * D, hidden}});
      s.push_back({p + "attn.compressor.wgate.weight", {coff * D, hidden}});
      s.push_back({p + "attn.compressor.norm.weight", {D}});
    }
    if (r == 4) {
      const uint64_t ID = c.dims.indexer.head_dim;
      s.push_back({p + "attn.indexer.wq_b.weight", {I * ID, c.q_lora}});
      s.push_back({p + "attn.indexer.weights_proj.weight", {I, hidden}});
      s.push_back({p + "attn.indexer.compressor.ape", {4, 2 * ID}});
      s.push_back({p + "attn.indexer.compressor.wkv.weight", {2 * ID, hidden}});
      s.push_back({p + "attn.indexer.compressor.wgate.weight", {2 * ID, hidden}});
      s.push_back({p + "attn.indexer.compressor.norm.weight", {ID}});
    }
    s.push_back({p + "ffn_norm.weight", {hidden}});
    s.push_back({p + "ffn.w1.weight", {c.ffn, hidden}});
    s.push_back({p + "ffn.w3.weight", {c.ffn, hidden}});
    s.push_back({p + "ffn.w2.weight", {hidden, c.ffn}});
  }
  s.push_back({"norm.weight", {hidden}});
  s.push_back({"head.weight", {c.vocab, hidden}});
  return s;
}

TinyV4Weights GenerateTinyV4Weights(const TinyV4Config& c, uint64_t seed) {
  TinyV4Weights w;
  w.model = c.name;
  w.seed = seed;
  uint64_t state = seed;
  for (const V4TensorSpec& t : TinyV4WeightSpecs(c)) {
    std::vector<float> v(t.elements());
    // ADR 0018: norm weights 1 + 0.1u, ape 0.1u, attn_sink u, linear weights and the embedding
    // u / sqrt(in).
    const bool ape = t.name.ends_with(".ape");
    const bool sink = t.name.ends_with(".attn_sink");
    const bool norm = !sink && t.shape.size() == 1;
    const double gain = (t.shape.size() == 2 && !ape) ? 1.0 / std::sqrt(static_cast<double>(t.shape[1])) : 1.0;
    for (float& x : v) {
      const double u = NextWeightDraw(state);
      x = static_cast<float>(norm ? 1.0 + 0.1 * u : ape ? 0.1 * u : sink ? u : u * gain);
    }
    w.tensors.emplace(t.name, std::move(v));
  }
  return w;
}

Result<std::string> SerializeTinyV4Weights(const TinyV4Config& c, const TinyV4Weights& w) {
  return SerializeWeightFile(c.name, TinyV4WeightSpecs(c), w);
}

Result<TinyV4Weights> ParseTinyV4Weights(std::string_view bytes, const TinyV4Config& c) {
  return ParseWeightFile(bytes, c.name, TinyV4WeightSpecs(c));
}

Status WriteTinyV4WeightsFile(const std::string& path, const TinyV4Config& c, const TinyV4Weights& w) {
  return WriteWeightFile(path, c.name, TinyV4WeightSpecs(c), w);
}

Result<TinyV4Weights> ReadTinyV4WeightsFile(const std::string& path, const TinyV4Config& c) {
  return ReadWeightFile(path, c.name, TinyV4WeightSpecs(c));
}

// ---- runner ---------------------------------------------------------------------------------

TinyV4Runner::~TinyV4Runner() = default;

Result<std::unique_ptr<TinyV4Runner>> TinyV4Runner::Create(TinyV4Config config, TinyV4Weights weights,
                                                           const TinyV4Options& options) {
  for (const V4TensorSpec& t : TinyV4WeightSpecs(config)) {
    auto it = weights.tensors.find(t.name);
    if (it == weights.tensors.end() || it->second.size() != t.elements()) return Bad(t.name + ": missing or mis-sized");
  }
  if (options.indexer_format != "indexer-mxfp4" && options.indexer_format != "indexer-fp8") {
    return InvalidArgument("indexer-format", options.indexer_format + " (tiny-v4 runs indexer-mxfp4 or indexer-fp8)");
  }
  std::unique_ptr<TinyV4Runner> r(new TinyV4Runner());
  ManagerOptions mo;
  mo.kv_format = "v4-fp8";
  mo.indexer_format = options.indexer_format;
  mo.window_strategy = options.window_strategy;
  mo.capacity_blocks = options.capacity_blocks;
  mo.max_requests = 4;
  TESSERA_ASSIGN_OR_RETURN(r->manager_, RequestManager::Create(config.geometry, mo));
  r->config_ = std::move(config);
  r->weights_ = std::move(weights);
  r->options_ = options;
  r->pending_rows_.resize(r->config_.layers);
  r->pending_state_.resize(r->config_.layers);
  r->pending_istate_.resize(r->config_.layers);
  return r;
}

// Rebuilding the rings of a prefix hit under recompute: every layer's rows of positions
// [begin, cached), computed in order from local window rows (ADR 0018: W + (L-1)(W-1) tokens).
struct TinyV4Runner::Scratch {
  uint64_t begin = 0;
  std::vector<std::map<uint64_t, std::vector<std::byte>>> rows;  // per layer, by position
  std::vector<std::map<uint64_t, std::vector<float>>> state, istate;
};

Status TinyV4Runner::Step(RequestId rid, uint32_t token, std::span<float> logits, AttentionCounters* counters) {
  return Forward(rid, manager_->Tokens(rid), token, nullptr, logits, counters);
}

Status TinyV4Runner::Forward(RequestId rid, uint64_t p, uint32_t token, Scratch* scratch, std::span<float> logits,
                             AttentionCounters* counters) {
  const TinyV4Config& c = config_;
  if (token >= c.vocab) return InvalidArgument("token", std::to_string(token) + " is past the vocabulary");
  if (logits.size() != c.vocab) return InvalidArgument("logits", "must hold vocab_size floats");
  const size_t hidden = c.hidden;
  const std::span<const float> embed = weights_.at("embed.weight");
  std::vector<float> h(embed.subspan(size_t{token} * hidden, hidden).begin(),
                       embed.subspan(size_t{token} * hidden, hidden).end());
  for (uint32_t l = 0; l < c.layers; ++l) TESSERA_RETURN_IF_ERROR(Layer(rid, p, l, scratch, h, counters));
  if (scratch != nullptr) return Status::Ok();  // rows only
  RmsNorm(h, weights_.at("norm.weight"), c.rms_eps);
  MatVec(weights_.at("head.weight"), h, logits);
  return AppendToken(rid, token);
}

Status TinyV4Runner::Layer(RequestId rid, uint64_t p, uint32_t l, Scratch* scratch, std::span<float> h,
                           AttentionCounters* counters) {
  const TinyV4Config& c = config_;
  const V4Dims& d = c.dims;
  const size_t hidden = c.hidden, H = d.heads, D = d.head_dim, N = d.nope();
  const auto W = [&](const std::string& name) -> std::span<const float> { return weights_.at(name); };
  const std::string pre = "layers." + std::to_string(l) + ".";
  const uint32_t ratio = c.ratios[l];
  const double theta = c.theta(l);
  std::vector<float> x(h.begin(), h.end()), qr(c.q_lora), q(H * D), kv(D), o(H * D);
  std::vector<float> y(size_t{c.o_groups} * c.o_lora), out(hidden);
  RmsNorm(x, W(pre + "attn_norm.weight"), c.rms_eps);
  MatVec(W(pre + "attn.wq_a.weight"), x, qr);
  RmsNorm(qr, W(pre + "attn.q_norm.weight"), c.rms_eps);
  MatVec(W(pre + "attn.wq_b.weight"), qr, q);
  for (size_t hh = 0; hh < H; ++hh) {
    std::span<float> qh(q.data() + hh * D, D);
    RmsNorm(qh, {}, c.rms_eps);
    RopeInterleaved(qh.subspan(N), p, theta, false);
  }
  MatVec(W(pre + "attn.wkv.weight"), x, kv);
  RmsNorm(kv, W(pre + "attn.kv_norm.weight"), c.rms_eps);
  RopeInterleaved(std::span(kv).subspan(N), p, theta, false);
  pending_rows_[l].assign(kV4DataRowBytes + kV4ScaleRowBytes, std::byte{0});
  TESSERA_RETURN_IF_ERROR(EncodeV4WindowRow(kv, pending_rows_[l]));
  TESSERA_ASSIGN_OR_RETURN(V4PagedLayer pages, Bind(rid, p, l, scratch));
  std::vector<std::byte> entry, ientry;
  if (ratio > 0) TESSERA_RETURN_IF_ERROR(Compress(p, l, false, x, pages, scratch, pending_state_[l], entry));
  if (ratio == 4) TESSERA_RETURN_IF_ERROR(Compress(p, l, true, x, pages, scratch, pending_istate_[l], ientry));
  if (scratch == nullptr) TESSERA_RETURN_IF_ERROR(pages.SetPending(V4Pending{pending_rows_[l], entry, ientry}));
  std::vector<uint64_t> selected;
  TESSERA_RETURN_IF_ERROR(Select(p, l, x, qr, pages, &selected, counters));
  TESSERA_RETURN_IF_ERROR(V4Attend(pages, selected, q, W(pre + "attn.attn_sink"), d, theta, o, counters));
  if (scratch == nullptr) {
    last_selected_.resize(c.layers);
    last_selected_[l] = selected;
  }
  // Grouped output projection: group g's heads through wo_a's rows g*o_lora.., then wo_b.
  const size_t gin = H * D / c.o_groups;
  for (size_t g = 0; g < c.o_groups; ++g) {
    MatVec(W(pre + "attn.wo_a.weight").subspan(g * c.o_lora * gin, size_t{c.o_lora} * gin),
           std::span<const float>(o).subspan(g * gin, gin), std::span(y).subspan(g * c.o_lora, c.o_lora));
  }
  MatVec(W(pre + "attn.wo_b.weight"), y, out);
  for (size_t i = 0; i < hidden; ++i) h[i] += out[i];
  // Dense SwiGLU.
  std::vector<float> yn(h.begin(), h.end()), a(c.ffn), b(c.ffn);
  RmsNorm(yn, W(pre + "ffn_norm.weight"), c.rms_eps);
  MatVec(W(pre + "ffn.w1.weight"), yn, a);
  MatVec(W(pre + "ffn.w3.weight"), yn, b);
  for (size_t i = 0; i < c.ffn; ++i) a[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
  MatVec(W(pre + "ffn.w2.weight"), a, out);
  for (size_t i = 0; i < hidden; ++i) h[i] += out[i];
  return Status::Ok();
}

Result<V4PagedLayer> TinyV4Runner::Bind(RequestId rid, uint64_t p, uint32_t l, Scratch* scratch) {
  if (scratch == nullptr) return V4PagedLayer::Of(*manager_, rid, l);
  // The local rows of the window ending at p (fewer near the scratch's start).
  scratch->rows[l][p] = pending_rows_[l];
  std::vector<std::byte> rows;
  const uint64_t window = config_.dims.window;
  const uint64_t first = std::max<uint64_t>(scratch->begin, p + 1 > window ? p + 1 - window : 0);
  for (uint64_t t = first; t <= p; ++t) rows.insert(rows.end(), scratch->rows[l][t].begin(), scratch->rows[l][t].end());
  return V4PagedLayer::AsOf(*manager_, rid, l, p + 1, rows);
}

Status TinyV4Runner::Compress(uint64_t p, uint32_t l, bool indexer, std::span<const float> x, const V4PagedLayer& pages,
                              Scratch* scratch, std::vector<float>& row, std::vector<std::byte>& bytes) {
  const TinyV4Config& c = config_;
  const uint32_t ratio = c.ratios[l];
  const std::string cp =
      "layers." + std::to_string(l) + "." + (indexer ? "attn.indexer.compressor." : "attn.compressor.");
  const size_t dim = indexer ? c.dims.indexer.head_dim : c.dims.head_dim, coff = ratio == 4 ? 2 : 1;
  row.assign(2 * coff * dim, 0.0f);
  MatVec(weights_.at(cp + "wkv.weight"), x, std::span(row).first(coff * dim));
  MatVec(weights_.at(cp + "wgate.weight"), x, std::span(row).subspan(coff * dim));
  const std::span<const float> ape =
      std::span<const float>(weights_.at(cp + "ape")).subspan((p % ratio) * coff * dim, coff * dim);
  for (size_t i = 0; i < coff * dim; ++i) row[coff * dim + i] += ape[i];
  if (scratch != nullptr) (indexer ? scratch->istate : scratch->state)[l][p] = row;
  if (scratch != nullptr || (p + 1) % ratio != 0) return Status::Ok();
  std::vector<float> rows(pages.state_rows(indexer).begin(), pages.state_rows(indexer).end());
  rows.insert(rows.end(), row.begin(), row.end());
  V4Compressor comp{ratio,     static_cast<uint32_t>(dim),      c.dims.rope, c.theta(l),
                    c.rms_eps, weights_.at(cp + "norm.weight"), indexer};
  std::vector<float> e(dim);
  TESSERA_RETURN_IF_ERROR(V4CompressEntry(comp, (p + 1) / ratio - 1, rows, static_cast<uint32_t>(row.size()), e));
  const auto& groups = manager_->pool().groups();
  for (const StateLayer& sl : manager_->states()->layers()) {
    if (sl.layer != l) continue;
    const RecordFormat& f = groups[static_cast<size_t>(indexer ? sl.igroup : sl.group)].format;
    bytes.assign(f.record_bytes(), std::byte{0});
    RecordView v;
    v.plane_count = f.plane_count();
    v.planes[0] = std::span(bytes).first(f.plane_bytes(0));
    if (v.plane_count == 2) v.planes[1] = std::span(bytes).subspan(f.plane_bytes(0));
    TESSERA_RETURN_IF_ERROR(EncodeV4Entry(e, f, v));
  }
  return Status::Ok();
}

Status TinyV4Runner::Select(uint64_t p, uint32_t l, std::span<const float> x, std::span<const float> qr,
                            const V4PagedLayer& pages, std::vector<uint64_t>* selected, AttentionCounters* counters) {
  const TinyV4Config& c = config_;
  const uint32_t ratio = c.ratios[l];
  if (ratio == 0) return Status::Ok();
  if (ratio != 4) {
    for (uint64_t e = 0; e < pages.entries(); ++e) selected->push_back(e);
    return Status::Ok();
  }
  const std::string pre = "layers." + std::to_string(l) + ".";
  const size_t I = c.dims.indexer.heads, ID = c.dims.indexer.head_dim, R = c.dims.rope;
  std::vector<float> iq(I * ID), iw(I);
  MatVec(weights_.at(pre + "attn.indexer.wq_b.weight"), qr, iq);
  for (size_t j = 0; j < I; ++j) {
    std::span<float> qj(iq.data() + j * ID, ID);
    RopeInterleaved(qj.subspan(ID - R), p, c.theta(l), false);
    TESSERA_RETURN_IF_ERROR(HadamardTransform(qj));
    TESSERA_RETURN_IF_ERROR(RoundFp4Blocks(qj));
  }
  MatVec(weights_.at(pre + "attn.indexer.weights_proj.weight"), x, iw);
  const float ws = 1.0f / std::sqrt(static_cast<float>(ID)) / std::sqrt(static_cast<float>(I));
  for (float& v : iw) v *= ws;
  return V4IndexerSelect(pages, IndexerQuery{iq, iw}, c.dims.indexer, selected, counters);
}

Status TinyV4Runner::AppendToken(RequestId rid, uint32_t token) {
  const TinyV4Config& c = config_;
  const V4Dims& d = c.dims;
  // The writers copy the rows just attended to; entries are rebuilt from the manager's rows (the
  // same rows, so the same bytes as the pending ones).
  KvWriters w;
  w.window = [this](uint32_t layer, uint64_t, std::span<std::byte> row) {
    std::copy(pending_rows_[layer].begin(), pending_rows_[layer].end(), row.begin());
  };
  w.state = [this](uint32_t layer, bool indexer, uint64_t, std::span<float> row) {
    const std::vector<float>& src = indexer ? pending_istate_[layer] : pending_state_[layer];
    std::copy(src.begin(), src.end(), row.begin());
  };
  Status compress_status = Status::Ok();
  w.compress = [&](uint32_t layer, bool indexer, uint64_t group, std::span<const float> rows, uint32_t row_floats,
                   const RecordView& rec) {
    const std::string cp =
        "layers." + std::to_string(layer) + "." + (indexer ? "attn.indexer.compressor." : "attn.compressor.");
    V4Compressor comp{c.ratios[layer], indexer ? d.indexer.head_dim : d.head_dim, d.rope, c.theta(layer),
                      c.rms_eps,       weights_.at(cp + "norm.weight"),           indexer};
    std::vector<float> e(comp.dim);
    Status st = V4CompressEntry(comp, group, rows, row_floats, e);
    for (const StateLayer& sl : manager_->states()->layers()) {
      if (st.ok() && sl.layer == layer) {
        st = EncodeV4Entry(e, manager_->pool().groups()[static_cast<size_t>(indexer ? sl.igroup : sl.group)].format,
                           rec);
      }
    }
    if (!st.ok() && compress_status.ok()) compress_status = st;
  };
  const uint32_t tok[1] = {token};
  TESSERA_RETURN_IF_ERROR(manager_->Append(rid, tok, w));
  return compress_status;
}

Result<TinyV4Generation> TinyV4Runner::Generate(std::span<const uint32_t> prompt, uint32_t steps,
                                                const std::function<Status(RequestId)>& after_prefill) {
  if (prompt.empty()) return InvalidArgument("prompt", "needs at least one token");
  for (uint32_t t : prompt) {
    if (t >= config_.vocab) return InvalidArgument("prompt", "token " + std::to_string(t) + " is past the vocabulary");
  }
  TESSERA_RETURN_IF_ERROR(Release());
  TESSERA_ASSIGN_OR_RETURN(Admission a, manager_->Admit(prompt, RequestSpec{}));
  request_ = a.id;
  TinyV4Generation g;
  g.prompt_len = prompt.size();
  g.tokens.assign(prompt.begin(), prompt.end());
  g.cached_tokens = a.cached_tokens;
  g.state_restored = a.state_restored;
  if (a.cached_tokens > 0 && !a.state_restored) TESSERA_RETURN_IF_ERROR(RebuildRings(a, prompt));
  std::vector<float> logits(config_.vocab);
  g.selected.resize(a.cached_tokens);
  for (uint64_t pos = a.cached_tokens; pos < prompt.size(); ++pos) {
    g.last_token = AttentionCounters{};
    TESSERA_RETURN_IF_ERROR(Step(a.id, prompt[pos], logits, &g.last_token));
    g.counters += g.last_token;
    g.selected.push_back(last_selected_);
  }
  if (after_prefill) TESSERA_RETURN_IF_ERROR(after_prefill(a.id));
  g.logits.push_back(logits);
  for (uint32_t s = 0; s < steps; ++s) {
    const uint32_t next = static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    g.tokens.push_back(next);
    if (s + 1 == steps) break;
    TESSERA_RETURN_IF_ERROR(manager_->AllocateSlots(a.id, 1));
    g.last_token = AttentionCounters{};
    TESSERA_RETURN_IF_ERROR(Step(a.id, next, logits, &g.last_token));
    g.counters += g.last_token;
    g.selected.push_back(last_selected_);
    g.logits.push_back(logits);
  }
  return g;
}

Status TinyV4Runner::RebuildRings(const Admission& a, std::span<const uint32_t> prompt) {
  const uint64_t c = a.cached_tokens, w = config_.dims.window, layers = config_.layers;
  // Exact rows of every layer at [c - W, c) need the forward over the last W + (L-1)(W-1) tokens.
  const uint64_t span = w + (layers - 1) * (w - 1);
  Scratch scratch;
  scratch.begin = c > span ? c - span : 0;
  scratch.rows.resize(layers);
  scratch.state.resize(layers);
  scratch.istate.resize(layers);
  std::vector<float> unused(config_.vocab);
  for (uint64_t t = scratch.begin; t < c; ++t) {
    TESSERA_RETURN_IF_ERROR(Forward(a.id, t, prompt[t], &scratch, unused, nullptr));
  }
  KvWriters wr;
  wr.window = [&](uint32_t layer, uint64_t pos, std::span<std::byte> row) {
    const std::vector<std::byte>& src = scratch.rows[layer][pos];
    std::copy(src.begin(), src.end(), row.begin());
  };
  wr.state = [&](uint32_t layer, bool indexer, uint64_t pos, std::span<float> row) {
    const std::vector<float>& src = (indexer ? scratch.istate : scratch.state)[layer][pos];
    std::copy(src.begin(), src.end(), row.begin());
  };
  return manager_->Recompute(a.id, prompt.subspan(a.recompute_from, a.recompute_tokens), wr);
}

Status TinyV4Runner::Release() {
  if (!request_.has_value()) return Status::Ok();
  const RequestId r = *request_;
  request_.reset();
  return manager_->Free(r);
}

Result<TinyV4Generation> RunTinyV4(const TinyV4Run& run) {
  if (run.steps == 0) return InvalidArgument("steps", "must be at least 1");
  if (run.weights_path.empty()) return InvalidArgument("weights", "missing: give a weight file");
  TESSERA_ASSIGN_OR_RETURN(TinyV4Config cfg, LoadTinyV4Config("tiny-v4"));
  TinyV4Weights w;
  if (run.init_weights) {
    w = GenerateTinyV4Weights(cfg, run.seed);
    TESSERA_RETURN_IF_ERROR(WriteTinyV4WeightsFile(run.weights_path, cfg, w));
  } else {
    TESSERA_ASSIGN_OR_RETURN(w, ReadTinyV4WeightsFile(run.weights_path, cfg));
  }
  TinyV4Options o = run.options;
  // Blocks of the layout's span (256 tokens for tiny-v4), two spare.
  const uint64_t total = run.prompt.size() + uint64_t{run.steps};
  o.capacity_blocks = static_cast<uint32_t>(std::min<uint64_t>(total / 256 + 2, 1u << 20));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<TinyV4Runner> r, TinyV4Runner::Create(cfg, std::move(w), o));
  std::function<Status(RequestId)> hook;
  if (run.after_prefill) hook = [&run, &r](RequestId id) { return run.after_prefill(*r, id); };
  return r->Generate(run.prompt, run.steps, hook);
}

}  // namespace tessera

#include "tessera/price.h"

#include <algorithm>
#include <tuple>

#include "tessera/checked.h"
#include "tessera/ledger.h"

namespace tessera {

namespace {

__extension__ typedef unsigned __int128 U128;

constexpr uint64_t kMaxContext = uint64_t{1} << 32;
constexpr uint64_t kMaxBatch = uint64_t{1} << 20;

// Main layers of one kind at one compress ratio.
struct LayerGroup {
  LayerKind kind;
  uint32_t ratio;
  uint32_t layers;
};

std::vector<LayerGroup> Groups(const Geometry& g) {
  std::vector<LayerGroup> out;
  for (const LayerSpec& l : g.layers) {
    if (l.is_mtp) continue;
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const LayerGroup& x) { return x.kind == l.kind && x.ratio == l.compress_ratio; });
    if (it == out.end()) {
      out.push_back({l.kind, l.compress_ratio, 1});
    } else {
      ++it->layers;
    }
  }
  return out;
}

// Entries one head attends and keys the indexer scans, per layer, at context n (ADR 0004's
// read view, the same as the ledger's ReadEntries).
std::pair<uint64_t, uint64_t> Attended(const Geometry& g, const LayerGroup& l, uint64_t n) {
  const uint64_t window = std::min<uint64_t>(n, g.sliding_window);
  switch (l.kind) {
    case LayerKind::kMha:
    case LayerKind::kMla:
      return {n, 0};
    case LayerKind::kSliding:
      return {window, 0};
    case LayerKind::kLinear:
      return {0, 0};
    case LayerKind::kMlaSparse:
      return {std::min<uint64_t>(n, g.index_topk), n};
    case LayerKind::kSwa:
      return {window, 0};
    case LayerKind::kCsa:
      return {window + std::min<uint64_t>(n / l.ratio, g.index_topk), n / l.ratio};
    case LayerKind::kHca:
      return {window + n / l.ratio, 0};
  }
  return {0, 0};
}

struct Evaluation {
  std::vector<LayerPrice> layers;
  PathPrice absorbed, naive;
  uint64_t read_bytes_per_token = 0;
  std::string kv_format;
};

Status Fill(PathPrice& p, Checked attention, Checked indexer, Checked cache, Checked weights, Checked materialized) {
  Checked flops = attention + indexer;
  Checked bytes = cache + weights + materialized;
  if (flops.overflowed() || bytes.overflowed())
    return OutOfRange("batch", "FLOPs or bytes of the step overflow 64 bits");
  p.attention_flops = attention.value();
  p.indexer_flops = indexer.value();
  p.flops = flops.value();
  p.cache_bytes = cache.value();
  p.weight_bytes = weights.value();
  p.materialized_bytes = materialized.value();
  p.bytes = bytes.value();
  return Status::Ok();
}

Result<Evaluation> Evaluate(const Geometry& g, const PriceOptions& o, const PriceDims& d, bool reconstructs,
                            uint64_t context, uint64_t batch) {
  LedgerOptions lo;
  lo.context_tokens = context;
  lo.tp = o.tp;
  lo.kv_format = o.kv_format;
  TESSERA_ASSIGN_OR_RETURN(Ledger ledger, ComputeLedger(g, lo));
  Evaluation ev;
  ev.read_bytes_per_token = ledger.read_bytes_per_token;
  ev.kv_format = ledger.kv_format;
  const uint64_t heads = g.num_attention_heads / o.tp;
  Checked a_attn(0), n_attn(0), idx(0), weights(0), mat(0);
  for (const LayerGroup& grp : Groups(g)) {
    LayerPrice lp;
    lp.kind = grp.kind;
    lp.layers = grp.layers;
    std::tie(lp.entries, lp.indexer_keys) = Attended(g, grp, context);
    const uint64_t e = lp.entries;
    if (reconstructs) {
      lp.absorbed = {AbsorbQFlops(d), 0, AbsorbVUpFlops(d), AbsorbedScoreFlops(d, e), AbsorbedValueFlops(d, e), 0};
      lp.naive = {0,
                  NaiveKUpFlops(d, e),
                  NaiveVUpFlops(d, e),
                  NaiveScoreFlops(d, e),
                  NaiveValueFlops(d, e),
                  NaiveMaterializedBytes(d, e)};
      weights += Checked(UpProjectionWeightBytes(d)) * heads * grp.layers;
    } else {
      // Keys and values are the stored head_dim-wide entries themselves.
      lp.absorbed = {0, 0, 0, 2 * e * g.head_dim, 2 * e * g.head_dim, 0};
      lp.naive = lp.absorbed;
    }
    if (lp.indexer_keys > 0) lp.indexer_flops = IndexerFlops(lp.indexer_keys, g.index_n_heads, g.index_head_dim);
    const Checked per_layer_heads = Checked(heads) * grp.layers * batch;
    a_attn += Checked(lp.absorbed.flops()) * per_layer_heads;
    n_attn += Checked(lp.naive.flops()) * per_layer_heads;
    mat += Checked(lp.naive.materialized_bytes) * per_layer_heads;
    idx += Checked(lp.indexer_flops) * grp.layers * batch;
    ev.layers.push_back(lp);
  }
  const Checked cache = Checked(ledger.read_bytes_per_token) * batch;
  ev.absorbed.path = "absorbed";
  ev.naive.path = "naive";
  TESSERA_RETURN_IF_ERROR(Fill(ev.absorbed, a_attn, idx, cache, weights, 0));
  TESSERA_RETURN_IF_ERROR(Fill(ev.naive, n_attn, idx, cache, weights, mat));
  return ev;
}

// flops / peak >= bytes / bw, exactly (figures are at most 10^18: 128-bit products).
bool ComputeBound(const GpuSpec& gpu, uint64_t flops, uint64_t bytes) {
  return static_cast<U128>(flops) * gpu.hbm_bytes_per_s >= static_cast<U128>(bytes) * gpu.dense_bf16_flops;
}

void Roofline(const GpuSpec& gpu, PathPrice& p) {
  p.intensity = p.bytes == 0 ? 0 : static_cast<double>(p.flops) / static_cast<double>(p.bytes);
  p.compute_s = static_cast<double>(p.flops) / static_cast<double>(gpu.dense_bf16_flops);
  p.memory_s = static_cast<double>(p.bytes) / static_cast<double>(gpu.hbm_bytes_per_s);
  p.time_s = std::max(p.compute_s, p.memory_s);
  p.compute_bound = ComputeBound(gpu, p.flops, p.bytes);
}

// B* = ceil(peak·W / (f·bw - peak·c)) from the batch-1 figures (f, c per sequence; W shared).
std::optional<uint64_t> CrossoverBatch(const GpuSpec& gpu, const PathPrice& one) {
  using I = Int128;
  const uint64_t c = one.cache_bytes + one.materialized_bytes;  // batch 1: no overflow (checked)
  const I gain = static_cast<I>(one.flops) * static_cast<I>(gpu.hbm_bytes_per_s) -
                 static_cast<I>(c) * static_cast<I>(gpu.dense_bf16_flops);
  if (gain <= 0 || one.weight_bytes == 0) return std::nullopt;  // never, or at every batch
  const I need = static_cast<I>(one.weight_bytes) * static_cast<I>(gpu.dense_bf16_flops);
  const I b = std::max<I>(1, need / gain + (need % gain != 0 ? 1 : 0));
  if (b > static_cast<I>(UINT64_MAX)) return std::nullopt;
  return static_cast<uint64_t>(b);
}

}  // namespace

Result<Price> ComputePrice(const Geometry& g, const PriceOptions& o) {
  if (!g.is_mla) return InvalidArgument("model", g.name + " is not an MLA model (no kv_lora_rank or compress_ratios)");
  if (o.batch == 0 || o.batch > kMaxBatch) return InvalidArgument("batch", "must be in [1, 2^20]");
  if (o.context_tokens == 0 || o.context_tokens > kMaxContext) {
    return InvalidArgument("context", "must be in [1, 2^32] tokens");
  }
  if (o.tp == 0 || g.num_attention_heads % o.tp != 0) {
    return InvalidArgument(
        "tp", std::to_string(o.tp) + " does not divide num_attention_heads " + std::to_string(g.num_attention_heads));
  }
  Price p;
  p.model = g.name;
  p.gpu = o.gpu;
  p.batch = o.batch;
  p.context_tokens = o.context_tokens;
  p.tp = o.tp;
  p.heads_per_rank = g.num_attention_heads / o.tp;
  p.reconstructs = !g.is_hybrid;
  if (p.reconstructs) {
    p.dims = {g.kv_lora_rank, g.qk_rope_head_dim, g.qk_nope_head_dim, g.v_head_dim};
  } else {
    p.dims = {g.latent_dim, g.qk_rope_head_dim, 0, 0};
    p.notes.push_back("DeepSeek-V4 attends its stored entries directly (keys = values, MQA): naive = absorbed");
  }
  p.ridge = static_cast<double>(o.gpu.dense_bf16_flops) / static_cast<double>(o.gpu.hbm_bytes_per_s);
  TESSERA_ASSIGN_OR_RETURN(Evaluation ev, Evaluate(g, o, p.dims, p.reconstructs, o.context_tokens, o.batch));
  p.layers = ev.layers;
  p.read_bytes_per_token = ev.read_bytes_per_token;
  p.kv_format = ev.kv_format;
  p.absorbed = ev.absorbed;
  p.naive = ev.naive;
  Roofline(o.gpu, p.absorbed);
  Roofline(o.gpu, p.naive);

  // Crossover batch at this context, from the batch-1 figures.
  TESSERA_ASSIGN_OR_RETURN(Evaluation one, Evaluate(g, o, p.dims, p.reconstructs, o.context_tokens, 1));
  p.absorbed.crossover_batch = CrossoverBatch(o.gpu, one.absorbed);
  p.naive.crossover_batch = CrossoverBatch(o.gpu, one.naive);

  // Crossover context at this batch: bisection between context 1 and max_position_embeddings.
  const uint64_t top =
      std::min<uint64_t>(g.max_position_embeddings > 0 ? g.max_position_embeddings : 1 << 20, kMaxContext);
  for (int path = 0; path < 2; ++path) {
    auto bound_at = [&](uint64_t n) -> Result<bool> {
      TESSERA_ASSIGN_OR_RETURN(Evaluation e, Evaluate(g, o, p.dims, p.reconstructs, n, o.batch));
      const PathPrice& pp = path == 0 ? e.absorbed : e.naive;
      return ComputeBound(o.gpu, pp.flops, pp.bytes);
    };
    TESSERA_ASSIGN_OR_RETURN(bool first, bound_at(1));
    TESSERA_ASSIGN_OR_RETURN(bool last, bound_at(top));
    if (first == last) continue;
    uint64_t lo = 1, hi = top;  // bound(lo) == first, bound(hi) != first
    while (hi - lo > 1) {
      uint64_t mid = lo + (hi - lo) / 2;
      TESSERA_ASSIGN_OR_RETURN(bool b, bound_at(mid));
      if (b == first) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    (path == 0 ? p.absorbed : p.naive).crossover_context = hi;
  }
  return p;
}

}  // namespace tessera

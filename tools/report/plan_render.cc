#include "tessera_tools/plan_render.h"

#include <cstdio>

#include "render_json.h"
#include "tessera/units.h"

namespace tessera {

namespace {

using nlohmann::ordered_json;

std::string Count(uint64_t v) { return v == UINT64_MAX ? "unbounded" : WithThousands(v); }

ordered_json CountJson(uint64_t v) { return v == UINT64_MAX ? ordered_json(nullptr) : ordered_json(v); }

std::string Fixed(double v, const char* fmt) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

ordered_json GpuJson(const GpuSpec& g) {
  ordered_json j;
  j["name"] = g.name;
  j["description"] = g.description;
  j["memory_bytes"] = g.memory_bytes;
  j["hbm_bytes_per_s"] = g.hbm_bytes_per_s;
  j["dense_bf16_flops"] = g.dense_bf16_flops;
  j["dense_fp8_flops"] = g.dense_fp8_flops;
  return j;
}

ordered_json PlanJson(const Plan& p) {
  ordered_json j;
  j["model"] = p.model;
  j["config_sha256"] = p.config_sha256;
  j["gpu"] = GpuJson(p.gpu);
  j["tp"] = p.tp;
  j["gpu_memory_utilization"] = detail::ExactJson(p.utilization);
  j["kv_format"] = p.kv_format;
  j["include_mtp"] = p.include_mtp;
  ordered_json w;
  w["dtype"] = std::string(WeightDtypeName(p.weights.dtype));
  w["params"] = p.weights.params;
  w["bytes_per_rank"] = p.weights.bytes_per_rank;
  w["scale_bytes_per_rank"] = p.weights.scale_bytes_per_rank;
  ordered_json groups = ordered_json::array();
  for (const WeightGroupBytes& g : p.weights.groups) {
    groups.push_back({{"group", g.group}, {"params", g.params}, {"bytes_per_rank", g.bytes_per_rank}});
  }
  w["groups"] = groups;
  j["weights"] = w;
  j["usable_bytes"] = p.usable_bytes;
  j["reserve_bytes"] = p.reserve_bytes;
  j["weights_fit"] = p.weights_fit;
  j["kv_budget_bytes"] = p.kv_budget_bytes;
  j["context_tokens"] = p.context_tokens;
  j["concurrency"] = p.concurrency ? ordered_json(*p.concurrency) : ordered_json(nullptr);
  j["max_position_embeddings"] = p.max_position_embeddings;
  ordered_json gates;
  gates["max_committed_bytes"] = p.max_committed_bytes ? ordered_json(*p.max_committed_bytes) : ordered_json(nullptr);
  gates["min_concurrency"] = p.min_concurrency ? ordered_json(*p.min_concurrency) : ordered_json(nullptr);
  j["gates"] = gates;
  ordered_json engines = ordered_json::array();
  ordered_json rejected = ordered_json::array();
  for (const EnginePlan& e : p.engines) {
    ordered_json ej;
    ej["engine"] = std::string(EngineName(e.engine));
    ordered_json phases = ordered_json::array();
    for (const PhasePlan& ph : e.phases) {
      ordered_json pj;
      pj["phase"] = std::string(LedgerPhaseName(ph.phase));
      pj["bytes_per_request"] = ph.bytes_per_request;
      pj["max_concurrency"] = CountJson(ph.max_concurrency);
      if (ph.max_context) pj["max_context"] = *ph.max_context;
      phases.push_back(pj);
    }
    ej["phases"] = phases;
    ej["sustained_concurrency"] = CountJson(e.sustained_concurrency);
    ej["committed_bytes"] = e.committed_bytes;
    if (e.max_context) ej["max_context"] = *e.max_context;
    ej["rejected"] = e.rejected;
    ej["reasons"] = e.reasons;
    if (e.rejected) rejected.push_back({{"engine", std::string(EngineName(e.engine))}, {"reasons", e.reasons}});
    engines.push_back(ej);
  }
  j["engines"] = engines;
  j["rejected"] = rejected;
  j["notes"] = p.notes;
  return j;
}

std::string PlanText(const Plan& p, bool markdown) {
  std::string s;
  auto line = [&](const std::string& t) { s += t + "\n"; };
  const std::string gpus = std::to_string(p.tp) + " x " + p.gpu.name;
  line(std::string(markdown ? "## " : "") + "plan: " + p.model + " on " + gpus + " (tp " + std::to_string(p.tp) +
       "), context " + WithThousands(p.context_tokens) +
       (p.concurrency ? ", concurrency " + WithThousands(*p.concurrency) : ""));
  if (markdown) line("");
  const std::string b = markdown ? "- " : "  ";
  line(b + "gpu: " + p.gpu.name + " (" + p.gpu.description + "), memory " + FormatBytes(p.gpu.memory_bytes));
  line(b + "gpu-memory-utilization " + p.utilization.ToDecimal() + ": usable " + FormatBytes(p.usable_bytes) +
       " per rank");
  line(b + "weights (" + std::string(WeightDtypeName(p.weights.dtype)) + ", " + WithThousands(p.weights.params) +
       " params" + (p.include_mtp ? " incl. MTP" : ", MTP excluded") + "): " + FormatBytes(p.weights.bytes_per_rank) +
       " per rank (scales " + FormatBytes(p.weights.scale_bytes_per_rank) + ")");
  line(b + "reserve (activations, CUDA graphs, workspaces; --reserve-bytes): " + FormatBytes(p.reserve_bytes));
  line(b + "KV budget: " + FormatBytes(p.kv_budget_bytes) + " per rank" +
       (p.weights_fit ? "" : " (the weights do not fit)"));
  line(b + "kv-format " + p.kv_format + "; max_position_embeddings " + WithThousands(p.max_position_embeddings));
  line("");
  if (markdown) {
    line("| engine | phase | bytes per request (per rank) | max concurrency | max context" +
         std::string(p.concurrency ? " at " + WithThousands(*p.concurrency) : "") + " |");
    line("|---|---|---:|---:|---:|");
  } else {
    char head[200];
    std::snprintf(head, sizeof head, "  %-8s %-13s %28s %16s %14s", "engine", "phase", "bytes/request (per rank)",
                  "max concurrency", "max context");
    line(head);
  }
  for (const EnginePlan& e : p.engines) {
    for (const PhasePlan& ph : e.phases) {
      std::string ctx = ph.max_context ? WithThousands(*ph.max_context) : "-";
      if (markdown) {
        line("| " + std::string(EngineName(e.engine)) + " | " + std::string(LedgerPhaseName(ph.phase)) + " | " +
             WithThousands(ph.bytes_per_request) + " | " + Count(ph.max_concurrency) + " | " + ctx + " |");
      } else {
        char row[240];
        std::snprintf(row, sizeof row, "  %-8s %-13s %28s %16s %14s", std::string(EngineName(e.engine)).c_str(),
                      std::string(LedgerPhaseName(ph.phase)).c_str(), WithThousands(ph.bytes_per_request).c_str(),
                      Count(ph.max_concurrency).c_str(), ctx.c_str());
        line(row);
      }
    }
  }
  line("");
  for (const EnginePlan& e : p.engines) {
    line(b + std::string(EngineName(e.engine)) + ": sustained concurrency " + Count(e.sustained_concurrency) +
         (e.max_context ? ", max context " + WithThousands(*e.max_context) : "") + ", committed " +
         FormatBytes(e.committed_bytes) + " per rank" + (e.rejected ? " — REJECTED" : ""));
  }
  if (p.max_committed_bytes || p.min_concurrency) {
    line(b +
         "gates:" + (p.max_committed_bytes ? " --max-committed-bytes " + WithThousands(*p.max_committed_bytes) : "") +
         (p.min_concurrency ? " --min-concurrency " + WithThousands(*p.min_concurrency) : ""));
  }
  bool any = false;
  for (const EnginePlan& e : p.engines) {
    for (const std::string& r : e.reasons) {
      if (!any) line(std::string(markdown ? "\n" : "") + "rejected configurations:");
      any = true;
      line(b + std::string(EngineName(e.engine)) + " on " + gpus + ": " + r);
    }
  }
  for (const std::string& n : p.notes) line(b + "note: " + n);
  return s;
}

ordered_json TermsJson(const HeadTerms& t) {
  ordered_json j;
  j["q_absorb"] = t.q_absorb;
  j["k_up"] = t.k_up;
  j["v_up"] = t.v_up;
  j["scores"] = t.scores;
  j["values"] = t.values;
  j["flops"] = t.flops();
  j["materialized_bytes"] = t.materialized_bytes;
  return j;
}

ordered_json PathJson(const PathPrice& p) {
  ordered_json j;
  j["flops"] = p.flops;
  j["attention_flops"] = p.attention_flops;
  j["indexer_flops"] = p.indexer_flops;
  j["bytes"] = p.bytes;
  j["cache_bytes"] = p.cache_bytes;
  j["weight_bytes"] = p.weight_bytes;
  j["materialized_bytes"] = p.materialized_bytes;
  j["intensity"] = p.intensity;
  j["compute_s"] = p.compute_s;
  j["memory_s"] = p.memory_s;
  j["time_s"] = p.time_s;
  j["bound"] = p.compute_bound ? "compute" : "memory";
  j["crossover_batch"] = p.crossover_batch ? ordered_json(*p.crossover_batch) : ordered_json(nullptr);
  j["crossover_context"] = p.crossover_context ? ordered_json(*p.crossover_context) : ordered_json(nullptr);
  return j;
}

ordered_json PriceJson(const Price& p) {
  ordered_json j;
  j["model"] = p.model;
  j["gpu"] = GpuJson(p.gpu);
  j["batch"] = p.batch;
  j["context_tokens"] = p.context_tokens;
  j["tp"] = p.tp;
  j["heads_per_rank"] = p.heads_per_rank;
  j["kv_format"] = p.kv_format;
  j["dims"] = {{"latent", p.dims.latent}, {"rope", p.dims.rope}, {"nope", p.dims.nope}, {"v", p.dims.v}};
  j["reconstructs"] = p.reconstructs;
  j["read_bytes_per_token"] = p.read_bytes_per_token;
  j["ridge_flops_per_byte"] = p.ridge;
  ordered_json layers = ordered_json::array();
  for (const LayerPrice& l : p.layers) {
    ordered_json lj;
    lj["kind"] = std::string(LayerKindName(l.kind));
    lj["layers"] = l.layers;
    lj["entries"] = l.entries;
    lj["indexer_keys"] = l.indexer_keys;
    lj["absorbed_per_head"] = TermsJson(l.absorbed);
    lj["naive_per_head"] = TermsJson(l.naive);
    lj["indexer_flops"] = l.indexer_flops;
    layers.push_back(lj);
  }
  j["layers"] = layers;
  j["absorbed"] = PathJson(p.absorbed);
  j["naive"] = PathJson(p.naive);
  j["notes"] = p.notes;
  return j;
}

std::string Opt(const std::optional<uint64_t>& v) { return v ? WithThousands(*v) : "none"; }

// A time for people, three significant digits in s, ms or µs ("2.17 s", "123 ms", "8.4 µs").
std::string Duration(double seconds) {
  if (seconds >= 1) return Fixed(seconds, "%.3g") + " s";
  if (seconds >= 1e-3) return Fixed(seconds * 1e3, "%.3g") + " ms";
  return Fixed(seconds * 1e6, "%.3g") + " µs";
}

// Where the roofline bound changes, in words: the batch from which the path is compute-bound (at
// this context; W_UK and W_UV are read once per step, so batching raises the intensity), and
// the context at which the bound flips (at this batch; the bound at context 1 holds below it).
std::string BatchCrossover(const PathPrice& pp) {
  if (!pp.crossover_batch) return "no batch makes it compute-bound at this context";
  return "compute-bound from batch " + WithThousands(*pp.crossover_batch) + " on at this context";
}
std::string ContextCrossover(const PathPrice& pp, const Price& p) {
  if (!pp.crossover_context) return "the same bound at every context up to max_position_embeddings";
  const std::string here = pp.compute_bound ? "compute" : "memory";
  const std::string other = pp.compute_bound ? "memory" : "compute";
  const uint64_t c = *pp.crossover_context;
  return p.context_tokens >= c
             ? here + "-bound from context " + WithThousands(c) + " tokens on at this batch (" + other + "-bound below)"
             : "turns " + other + "-bound from context " + WithThousands(c) + " tokens on at this batch";
}

std::string PriceText(const Price& p, bool markdown) {
  std::string s;
  auto line = [&](const std::string& t) { s += t + "\n"; };
  const std::string b = markdown ? "- " : "  ";
  line(std::string(markdown ? "## " : "") + "price: " + p.model + " MLA attention for one decoded token per sequence" +
       ", batch " + WithThousands(p.batch) + ", context " + WithThousands(p.context_tokens) + ", tp " +
       std::to_string(p.tp) + " on " + p.gpu.name);
  if (markdown) line("");
  line(b +
       "attention only: the cache reads, W_UK and W_UV and the attention math; not the MLP or experts, not the "
       "other projections, not a whole decode step");
  line(b + "heads per rank " + std::to_string(p.heads_per_rank) + "; d_c " + std::to_string(p.dims.latent) + ", d_r " +
       std::to_string(p.dims.rope) + ", d_n " + std::to_string(p.dims.nope) + ", d_v " + std::to_string(p.dims.v) +
       "; kv-format " + p.kv_format + " (" + WithThousands(p.read_bytes_per_token) + " B read per token per rank)");
  line(b + "ridge " + Fixed(p.ridge, "%.1f") + " FLOP/B (dense bf16 " + WithThousands(p.gpu.dense_bf16_flops) +
       " FLOP/s over " + WithThousands(p.gpu.hbm_bytes_per_s) + " B/s)");
  for (const LayerPrice& l : p.layers) {
    line(b + std::string(LayerKindName(l.kind)) + " x" + std::to_string(l.layers) + ": " + WithThousands(l.entries) +
         " entries per head" + (l.indexer_keys ? ", indexer over " + WithThousands(l.indexer_keys) + " keys" : "") +
         "; per head absorbed " + WithThousands(l.absorbed.flops()) + " FLOPs, naive " +
         WithThousands(l.naive.flops()) + " FLOPs + " + WithThousands(l.naive.materialized_bytes) + " B materialized");
  }
  line("");
  if (markdown) {
    line("| path | FLOPs | HBM bytes | FLOP/B | time | bound | crossover batch | crossover context |");
    line("|---|---:|---:|---:|---:|---|---:|---:|");
  }
  for (const PathPrice* pp : {&p.absorbed, &p.naive}) {
    const std::string us = Duration(pp->time_s);
    const std::string bound = pp->compute_bound ? "compute" : "memory";
    if (markdown) {
      line("| " + pp->path + " | " + WithThousands(pp->flops) + " | " + WithThousands(pp->bytes) + " | " +
           Fixed(pp->intensity, "%.2f") + " | " + us + " | " + bound + " | " + Opt(pp->crossover_batch) + " | " +
           Opt(pp->crossover_context) + " |");
    } else {
      line("  " + pp->path + ": " + WithThousands(pp->flops) + " FLOPs, " + WithThousands(pp->bytes) + " B (cache " +
           WithThousands(pp->cache_bytes) + ", weights " + WithThousands(pp->weight_bytes) + ", materialized " +
           WithThousands(pp->materialized_bytes) + "), " + Fixed(pp->intensity, "%.2f") + " FLOP/B, " + us +
           " at the " + "roofline, " + bound + "-bound; " + BatchCrossover(*pp) + "; " + ContextCrossover(*pp, p));
    }
  }
  if (markdown) {
    line("");
    for (const PathPrice* pp : {&p.absorbed, &p.naive}) {
      line(b + pp->path + ": " + BatchCrossover(*pp) + "; " + ContextCrossover(*pp, p));
    }
  }
  for (const std::string& n : p.notes) line(b + "note: " + n);
  return s;
}

}  // namespace

std::string RenderPlan(const Plan& plan, OutputFormat format) {
  if (format == OutputFormat::kJson) return detail::DumpJson(PlanJson(plan)) + "\n";
  return PlanText(plan, format == OutputFormat::kMarkdown);
}

std::string RenderPrice(const Price& price, OutputFormat format) {
  if (format == OutputFormat::kJson) return detail::DumpJson(PriceJson(price)) + "\n";
  return PriceText(price, format == OutputFormat::kMarkdown);
}

}  // namespace tessera

// Rendering `tessera plan` and `tessera price` as a table, JSON or Markdown.
#pragma once

#include <string>

#include "tessera/plan.h"
#include "tessera/price.h"
#include "tessera_tools/render.h"

namespace tessera {

// JSON names: weights.bytes_per_rank, kv_budget_bytes, engines[].phases[].{bytes_per_request,
// max_concurrency, max_context}, engines[].rejected and reasons — exact integers.
std::string RenderPlan(const Plan& plan, OutputFormat format);
// JSON names: absorbed / naive {flops, bytes, cache_bytes, weight_bytes, materialized_bytes,
// intensity, time_s, bound, crossover_batch, crossover_context} and layers[] with per-head terms.
std::string RenderPrice(const Price& price, OutputFormat format);

}  // namespace tessera

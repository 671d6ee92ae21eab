// Prometheus text of the server: latency histograms and the serve counters beside the manager's.
#include "tessera_tools/serve.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve_internal.h"
#include "serve_publisher.h"

namespace tessera {

void LatencyHistogram::Observe(uint64_t nanos) {
  const double s = static_cast<double>(nanos) * 1e-9;
  size_t i = 0;
  while (i < kBounds.size() && s > kBounds[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_nanos_.fetch_add(nanos, std::memory_order_relaxed);
}

void LatencyHistogram::Render(const std::string& name, const std::string& help, std::string* out) const {
  char line[256];
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= kBounds.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    if (i < kBounds.size()) {
      std::snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name.c_str(), kBounds[i], cumulative);
    } else {
      std::snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name.c_str(), cumulative);
    }
    *out += line;
  }
  std::snprintf(line, sizeof line, "%s_sum %.9f\n%s_count %" PRIu64 "\n", name.c_str(),
                static_cast<double>(sum_nanos_.load(std::memory_order_relaxed)) * 1e-9, name.c_str(),
                count_.load(std::memory_order_relaxed));
  *out += line;
}

std::string ServeCore::MetricsText() const {
  std::vector<MetricFamily> f = manager_->CollectMetrics();
  if (store_) {
    for (MetricFamily& m : store_->CollectMetrics()) f.push_back(std::move(m));
  }
  f.push_back({"tessera_serve_kv_events_published_total",
               "KV-cache events published over ZeroMQ.",
               "counter",
               {{"", publisher_ ? publisher_->published() : 0}}});
  f.push_back({"tessera_serve_kv_event_batches_total",
               "KVEventBatch messages published.",
               "counter",
               {{"", publisher_ ? publisher_->batches() : 0}}});
  f.push_back({"tessera_serve_kv_event_batches_dropped_total",
               "KVEventBatch messages not published (ZeroMQ refused them).",
               "counter",
               {{"", publisher_ ? publisher_->dropped() : 0}}});
  f.push_back({"tessera_serve_http_errors_total",
               "API calls refused (bad input, no room, no such request).",
               "counter",
               {{"", http_errors_.load(std::memory_order_relaxed)}}});
  f.push_back({"tessera_serve_kv_bytes_written_total",
               "Engine KV record bytes written into the pool (kv_source: engine).",
               "counter",
               {{"", kv_bytes_written_.load(std::memory_order_relaxed)}}});
  f.push_back({"tessera_serve_kv_bytes_read_total",
               "KV record bytes served by block reads.",
               "counter",
               {{"", kv_bytes_read_.load(std::memory_order_relaxed)}}});
  std::string out = PrometheusText(f);
  admit_latency_.Render("tessera_serve_admit_seconds", "Admission latency (lookup, promotion, prefill write).", &out);
  step_latency_.Render("tessera_serve_step_seconds", "Step latency (all requests of one step call).", &out);
  promote_latency_->Render("tessera_serve_promote_seconds", "Tier fetch latency of one promotion.", &out);
  return out;
}

}  // namespace tessera

// The server's metrics (serve_metrics.cc): the latency histogram's buckets and lines, and the
// serve counters beside the manager's in /metrics' text.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "serve_test_support.h"
#include "tessera_tools/serve.h"

namespace tessera {
namespace {

// Cumulative buckets (le) in seconds, the sum and the count: 3 µs lands in le=5e-06 and above,
// 2 ms in le=0.0025 and above, 2 s only in +Inf.
TEST(ServeMetrics, HistogramBucketsAreCumulativeWithSumAndCount) {
  LatencyHistogram h;
  h.Observe(3'000);
  h.Observe(2'000'000);
  h.Observe(2'000'000'000);
  std::string out;
  h.Render("t_seconds", "help text", &out);
  EXPECT_NE(out.find("# HELP t_seconds help text\n"), std::string::npos) << out;
  EXPECT_NE(out.find("# TYPE t_seconds histogram\n"), std::string::npos) << out;
  EXPECT_NE(out.find("t_seconds_bucket{le=\"1e-06\"} 0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("t_seconds_bucket{le=\"5e-06\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("t_seconds_bucket{le=\"0.001\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("t_seconds_bucket{le=\"0.0025\"} 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("t_seconds_bucket{le=\"1\"} 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("t_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("t_seconds_count 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("t_seconds_sum 2.002003"), std::string::npos) << out;
}

// The serve families are there beside the manager's, and the admit histogram counts an admission.
TEST(ServeMetrics, TextHasTheServeCountersAndCountsAnAdmission) {
  ServeConfig c;
  c.model = "tiny-mla";
  c.capacity_blocks = 16;
  c.max_requests = 4;
  c.events_enabled = false;
  std::unique_ptr<ServeCore> core = serve_test::MakeCore(c);
  ASSERT_NE(core, nullptr);
  const std::vector<uint32_t> prompt = {1, 2, 3};
  ASSERT_TRUE(core->Admit(prompt, {}).ok());
  const std::string text = core->MetricsText();
  for (const char* family : {"tessera_serve_kv_events_published_total 0", "tessera_serve_kv_event_batches_total 0",
                             "tessera_serve_kv_event_batches_dropped_total 0", "tessera_serve_http_errors_total 0",
                             "tessera_serve_kv_bytes_written_total 0", "tessera_serve_kv_bytes_read_total 0",
                             "tessera_serve_admit_seconds_count 1", "tessera_serve_step_seconds_count 0",
                             "tessera_serve_promote_seconds_count 0"}) {
    EXPECT_NE(text.find(family), std::string::npos) << family;
  }
}

}  // namespace
}  // namespace tessera

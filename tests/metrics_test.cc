#include "tessera/metrics.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(Metrics, RendersPrometheusText) {
  std::vector<MetricFamily> f = {
      {"tessera_block_allocations_total", "Blocks handed out.", "counter", {{"", 42}}},
      {"tessera_blocks", "Blocks per state.", "gauge", {{"state=\"free\"", 7}, {"state=\"cached\"", 3}}},
  };
  EXPECT_EQ(PrometheusText(f),
            "# HELP tessera_block_allocations_total Blocks handed out.\n"
            "# TYPE tessera_block_allocations_total counter\n"
            "tessera_block_allocations_total 42\n"
            "# HELP tessera_blocks Blocks per state.\n"
            "# TYPE tessera_blocks gauge\n"
            "tessera_blocks{state=\"free\"} 7\n"
            "tessera_blocks{state=\"cached\"} 3\n");
}

TEST(Metrics, EscapesHelp) {
  std::string t = PrometheusText({{"x", "a\\b\nc", "gauge", {{"", 1}}}});
  EXPECT_NE(t.find("# HELP x a\\\\b\\nc\n"), std::string::npos) << t;
}

TEST(Metrics, ValidNames) {
  EXPECT_TRUE(ValidMetricName("tessera_dedup_hits_total"));
  EXPECT_TRUE(ValidMetricName("a:b_c9"));
  EXPECT_FALSE(ValidMetricName(""));
  EXPECT_FALSE(ValidMetricName("9abc"));
  EXPECT_FALSE(ValidMetricName("a-b"));
}

}  // namespace
}  // namespace tessera

// Counters and gauges, rendered in the Prometheus text exposition format (version 0.0.4).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

struct MetricFamily {
  std::string name;  // [a-zA-Z_:][a-zA-Z0-9_:]*
  std::string help;
  std::string type;  // "counter" or "gauge"
  // label set ("state=\"free\"" or "") and value
  std::vector<std::pair<std::string, uint64_t>> samples;
};

// "# HELP ...\n# TYPE ...\nname{labels} value\n" per family. Help text is escaped
// (backslash and newline) as the format requires.
std::string PrometheusText(const std::vector<MetricFamily>& families);

// Whether `name` is a valid Prometheus metric name.
bool ValidMetricName(const std::string& name);

}  // namespace tessera

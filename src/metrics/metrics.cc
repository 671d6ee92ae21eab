#include "tessera/metrics.h"

#include <cctype>

namespace tessera {

bool ValidMetricName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(name[i]);
    bool ok = std::isalpha(c) || c == '_' || c == ':' || (i > 0 && std::isdigit(c));
    if (!ok) return false;
  }
  return true;
}

std::string PrometheusText(const std::vector<MetricFamily>& families) {
  std::string out;
  for (const MetricFamily& f : families) {
    std::string help;
    for (char c : f.help) {
      if (c == '\\') {
        help += "\\\\";
      } else if (c == '\n') {
        help += "\\n";
      } else {
        help += c;
      }
    }
    out += "# HELP " + f.name + " " + help + "\n";
    out += "# TYPE " + f.name + " " + f.type + "\n";
    for (const auto& [labels, value] : f.samples) {
      out += f.name;
      if (!labels.empty()) out += "{" + labels + "}";
      out += " " + std::to_string(value) + "\n";
    }
  }
  return out;
}

}  // namespace tessera

// `tessera receipt --format html`: one self-contained HTML file (no scripts, no external
// resources) with inline SVG charts written here — requested, committed and read-per-token bytes
// against context per engine, the committed terms per engine as stacked bars — and, given a GPU,
// the capacity plan (plan.h). The SVG writer is exposed for its tests.
//
// Every text that reaches the page goes through Escape(): model names and paths come from
// config files and the command line.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/geometry.h"
#include "tessera/ledger.h"
#include "tessera/plan.h"
#include "tessera/status.h"
#include "tessera/weights.h"
#include "tessera_tools/receipt.h"

namespace tessera {
namespace html {

// Text for HTML content or a quoted attribute: & < > " ' escaped; control characters other than
// tab and newline, and bytes that are not UTF-8, become U+FFFD.
std::string Escape(std::string_view text);

// A base-2 logarithmic axis from [lo, hi] (widened to powers of two) onto pixels [px0, px1]
// (px1 < px0 for a vertical axis). Values outside the range are clamped to it.
struct LogAxis {
  int lo_exp = 0;  // lo = 2^lo_exp
  int hi_exp = 1;  // hi = 2^hi_exp > lo
  double px0 = 0;
  double px1 = 1;
  double Map(double value) const;
  // Tick exponents from lo_exp to hi_exp, at most about `max_ticks`, strictly increasing.
  std::vector<int> TickExponents(int max_ticks) const;
};
// Requires 0 < lo <= hi, both finite.
LogAxis MakeLogAxis(double lo, double hi, double px0, double px1);

// Linear byte ticks for people: a 1-2-5 step in a binary unit (100 MiB, 200 MiB, 500 MiB, 1 GiB,
// 2 GiB, ...) giving about `target` steps up to `max_bytes`; the last tick is >= max_bytes.
struct ByteTicks {
  uint64_t step = 1;                  // bytes between ticks
  uint64_t multiple = 1;              // step = multiple x unit_bytes (1, 2, 5, 10, 20, 50, 100, 200 or 500)
  uint64_t unit_bytes = 1;            // 1, 1024, 1024^2, ...
  std::string unit = "B";             // "B", "KiB", "MiB", ...
  std::vector<uint64_t> ticks;        // 0, step, 2 step, ...
  std::string Label(size_t i) const;  // "0 B", "500 MiB", "1,000 MiB"
};
ByteTicks MakeByteTicks(uint64_t max_bytes, int target = 4);

struct Series {
  std::string name;
  std::string color;  // "#rrggbb"
  // (x, y) with x and y > 0; points that are not (a ledger that failed) are left out of the line.
  std::vector<std::pair<double, double>> points;
};

struct LineChart {
  std::string title;
  std::string y_label;
  std::string x_label = "context (tokens)";
  std::vector<Series> series;
};
// Log-log: one <path> per series with at least one point, one <circle> per point, a legend.
std::string LineChartSvg(const LineChart& chart);

struct BarSegment {
  std::string name;
  std::string color;
  uint64_t bytes = 0;
};
struct Bar {
  std::string label;
  std::vector<BarSegment> segments;
};
// Horizontal stacked bars on a linear axis: one <rect class="seg"> per nonzero segment, a legend
// with one swatch per segment name.
std::string StackedBarsSvg(const std::string& title, const std::vector<Bar>& bars);

}  // namespace html

struct HtmlReceiptRequest {
  ReceiptRequest receipt;  // the model, the ledger options and any observation
  std::vector<Engine> engines = {Engine::kTessera, Engine::kVllm, Engine::kSglang};
  // Given: the capacity plan on this GPU configuration (its context, tp and ledger options are
  // the receipt's).
  std::optional<PlanOptions> plan;
  std::optional<WeightShapes> shapes;  // required with plan
};

struct HtmlReceipt {
  std::string html;
  Receipt receipt;  // the checks (and the Markdown and JSON receipts)
  std::optional<Plan> plan;
  // The contexts the charts were drawn at: powers of two from 1,024 up to the model's
  // max_position_embeddings, and that maximum.
  std::vector<uint64_t> contexts;
};

// Errors as BuildReceipt's and ComputePlan's. An engine whose ledger fails at some context is
// left out of that point, with a note on the page.
Result<HtmlReceipt> BuildHtmlReceipt(const Geometry& g, const HtmlReceiptRequest& request);

}  // namespace tessera

// The HTML receipt's writer: escaping of hostile text, the SVG charts' elements and coordinates,
// and the page `tessera receipt --format html` writes (tests/browser_test.cc renders it).
#include "tessera_tools/html.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "tessera_tools/version.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::Context;
using testing::Preset;

size_t Occurrences(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The numbers of every path's d attribute, path by path, as (x, y) pairs.
std::vector<std::vector<std::pair<double, double>>> PathPoints(const std::string& svg) {
  std::vector<std::vector<std::pair<double, double>>> paths;
  std::regex path_re("<path class=\"series\" d=\"([^\"]*)\"");
  std::regex pt_re("[ML]([^ ]+) ([^ ]+)");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), path_re); it != std::sregex_iterator(); ++it) {
    std::string d = (*it)[1];
    std::vector<std::pair<double, double>> pts;
    for (auto p = std::sregex_iterator(d.begin(), d.end(), pt_re); p != std::sregex_iterator(); ++p) {
      pts.emplace_back(std::stod((*p)[1]), std::stod((*p)[2]));
    }
    paths.push_back(pts);
  }
  return paths;
}

TEST(HtmlEscape, MarkupQuotesAndBadBytes) {
  EXPECT_EQ(html::Escape("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;");
  EXPECT_EQ(html::Escape("caf\xC3\xA9 \xE6\x97\xA5"), "caf\xC3\xA9 \xE6\x97\xA5");  // valid UTF-8 kept
  EXPECT_EQ(html::Escape("a\xFF"
                         "b"),
            "a\xEF\xBF\xBD"
            "b");                                                                   // not UTF-8
  EXPECT_EQ(html::Escape("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong '/'
  EXPECT_EQ(html::Escape("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(html::Escape("\xE6\x97"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // truncated
  EXPECT_EQ(html::Escape(std::string("x\x01y\0z", 5)), "x\xEF\xBF\xBDy\xEF\xBF\xBDz");
  EXPECT_EQ(html::Escape("tab\tnl\n"), "tab\tnl\n");
}

TEST(HtmlAxis, MonotoneAndClamped) {
  html::LogAxis x = html::MakeLogAxis(1000, 1048576, 90, 610);
  EXPECT_EQ(x.lo_exp, 9);  // widened to powers of two
  EXPECT_EQ(x.hi_exp, 20);
  double prev = -1;
  for (double v = 512; v <= 1048576; v *= 1.5) {
    double px = x.Map(v);
    EXPECT_GT(px, prev) << v;
    EXPECT_GE(px, 90);
    EXPECT_LE(px, 610);
    prev = px;
  }
  EXPECT_DOUBLE_EQ(x.Map(512), 90);
  EXPECT_DOUBLE_EQ(x.Map(1048576), 610);
  html::LogAxis y = html::MakeLogAxis(3e7, 6e9, 290, 34);  // vertical: larger values higher up
  EXPECT_GT(y.Map(1e8), y.Map(1e9));
  EXPECT_DOUBLE_EQ(y.Map(0), 290);  // no log of 0 reaches a coordinate
  EXPECT_DOUBLE_EQ(y.Map(std::nan("")), 290);
  EXPECT_DOUBLE_EQ(y.Map(1e30), 34);
  std::vector<int> ticks = y.TickExponents(7);
  ASSERT_GE(ticks.size(), 2u);
  for (size_t i = 1; i < ticks.size(); ++i) EXPECT_GT(ticks[i], ticks[i - 1]);
  EXPECT_LE(ticks.size(), 8u);
  html::LogAxis one = html::MakeLogAxis(64, 64, 0, 100);  // a single value still spans
  EXPECT_LT(one.lo_exp, one.hi_exp);
}

// Bar-chart ticks fall on 1-2-5 steps of a binary unit, never on quarters of the largest bar
// (361 MiB, 722 MiB, 1.06 GiB before; issue 22 point 4).
TEST(HtmlAxis, ByteTicksAreRound) {
  const uint64_t MiB = uint64_t{1} << 20, GiB = uint64_t{1} << 30;
  html::ByteTicks t = html::MakeByteTicks(1444 * MiB);  // 4 x 361 MiB
  EXPECT_EQ(t.unit, "MiB");
  EXPECT_EQ(t.multiple, 500u);
  EXPECT_EQ(t.ticks, (std::vector<uint64_t>{0, 500 * MiB, 1000 * MiB, 1500 * MiB}));
  EXPECT_EQ(t.Label(0), "0 B");
  EXPECT_EQ(t.Label(1), "500 MiB");
  EXPECT_EQ(t.Label(2), "1,000 MiB");
  html::ByteTicks g = html::MakeByteTicks(9 * GiB);
  EXPECT_EQ(g.unit, "GiB");
  EXPECT_EQ(g.multiple, 5u);
  EXPECT_EQ(g.ticks.back(), 10 * GiB);
  for (uint64_t max : {uint64_t{1}, uint64_t{1000}, 3 * MiB + 7, 700 * GiB, uint64_t{1} << 62}) {
    html::ByteTicks k = html::MakeByteTicks(max);
    ASSERT_GE(k.ticks.size(), 2u) << max;
    EXPECT_GE(k.ticks.back(), max);
    EXPECT_LE(k.ticks.size(), 11u) << max;
    const std::vector<uint64_t> ok = {1, 2, 5, 10, 20, 50, 100, 200, 500};
    EXPECT_NE(std::find(ok.begin(), ok.end(), k.multiple), ok.end()) << max;
    EXPECT_EQ(k.step, k.multiple * k.unit_bytes);
  }
}

// The legend column is as wide as its longest entry: the SVG widens rather than clip it.
TEST(HtmlStackedBars, LongLegendWidensTheSvg) {
  std::vector<html::Bar> bars = {{"vllm", {{"uniform_block_padding_and_then_some_more", "#123456", 10}}}};
  std::string svg = html::StackedBarsSvg("t", bars);
  EXPECT_EQ(svg.find("width=\"760.0\""), std::string::npos) << svg.substr(0, 200);
  std::vector<html::Bar> short_bars = {{"vllm", {{"records", "#123456", 10}}}};
  EXPECT_NE(html::StackedBarsSvg("t", short_bars).find("width=\"760.0\""), std::string::npos);
}

TEST(HtmlLineChart, ElementsAndCoordinates) {
  html::LineChart c{"T <1>", "bytes", "context", {}};
  c.series.push_back({"up", "#1f77b4", {{1024, 1e6}, {2048, 2e6}, {4096, 4e6}, {8192, 8e6}}});
  c.series.push_back({"with a zero", "#d62728", {{1024, 0}, {2048, 3e6}, {4096, 5e6}}});
  c.series.push_back({"empty", "#2ca02c", {{1024, 0}, {0, 5}, {std::nan(""), 1}}});
  std::string svg = html::LineChartSvg(c);
  EXPECT_EQ(Occurrences(svg, "<svg"), 1u);
  EXPECT_EQ(Occurrences(svg, "<path class=\"series\""), 2u);  // the empty series draws nothing
  EXPECT_EQ(Occurrences(svg, "<circle"), 6u);
  EXPECT_EQ(Occurrences(svg, "<rect class=\"swatch\""), 2u);
  EXPECT_NE(svg.find("T &lt;1&gt;"), std::string::npos);
  EXPECT_EQ(Lower(svg).find("nan"), std::string::npos);
  EXPECT_EQ(Lower(svg).find("inf"), std::string::npos);
  auto paths = PathPoints(svg);
  ASSERT_EQ(paths.size(), 2u);
  ASSERT_EQ(paths[0].size(), 4u);
  ASSERT_EQ(paths[1].size(), 2u);
  for (const auto& pts : paths) {
    for (size_t i = 0; i < pts.size(); ++i) {
      EXPECT_TRUE(std::isfinite(pts[i].first) && std::isfinite(pts[i].second));
      EXPECT_GE(pts[i].first, 0);
      EXPECT_LE(pts[i].first, 760);
      EXPECT_GE(pts[i].second, 0);
      EXPECT_LE(pts[i].second, 340);
      if (i > 0) {
        EXPECT_GT(pts[i].first, pts[i - 1].first);    // context grows rightwards
        EXPECT_LT(pts[i].second, pts[i - 1].second);  // bytes grow upwards
      }
    }
  }
  // Doubling context and bytes moves a point by the same step each time (log-log).
  EXPECT_NEAR(paths[0][1].first - paths[0][0].first, paths[0][3].first - paths[0][2].first, 0.11);
  EXPECT_NEAR(paths[0][1].second - paths[0][0].second, paths[0][3].second - paths[0][2].second, 0.11);
}

TEST(HtmlLineChart, NoPointsStillValid) {
  std::string svg = html::LineChartSvg(html::LineChart{"empty", "bytes", "context", {}});
  EXPECT_EQ(Occurrences(svg, "<path"), 0u);
  EXPECT_EQ(Occurrences(svg, "</svg>"), 1u);
  EXPECT_EQ(Lower(svg).find("nan"), std::string::npos);
}

TEST(HtmlStackedBars, OneRectPerNonzeroSegment) {
  std::vector<html::Bar> bars = {
      {"a", {{"records", "#4c78a8", 900}, {"page_rounding", "#f58518", 100}, {"metadata", "#eeca3b", 0}}},
      {"b<", {{"records", "#4c78a8", 300}, {"metadata", "#eeca3b", 200}}},
  };
  std::string svg = html::StackedBarsSvg("terms", bars);
  EXPECT_EQ(Occurrences(svg, "<rect class=\"seg\""), 4u);
  EXPECT_EQ(Occurrences(svg, "<rect class=\"swatch\""), 3u);  // each term once
  EXPECT_NE(svg.find(">b&lt;<"), std::string::npos);
  EXPECT_EQ(Lower(svg).find("nan"), std::string::npos);
  // The largest bar spans the plot; the other is half as long.
  std::regex w_re("<rect class=\"seg\" x=\"[^\"]+\" y=\"([^\"]+)\" width=\"([^\"]+)\"");
  std::map<std::string, double> width_by_row;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), w_re); it != std::sregex_iterator(); ++it) {
    width_by_row[(*it)[1]] += std::stod((*it)[2]);
  }
  ASSERT_EQ(width_by_row.size(), 2u);
  std::vector<double> widths;
  for (const auto& [row, w] : width_by_row) widths.push_back(w);
  EXPECT_NEAR(widths[0], 520, 0.2);
  EXPECT_NEAR(widths[1], 260, 0.2);
}

HtmlReceiptRequest V4ProOnH200() {
  HtmlReceiptRequest req;
  LedgerOptions o = Context(131072);
  o.tp = 8;
  req.receipt = ReceiptRequest{"preset deepseek-v4-pro", o, std::nullopt, false};
  PlanOptions p;
  p.gpu = *LoadGpu("H200-141G");
  req.plan = p;
  req.shapes = *WeightShapesFromConfigJson(*PresetConfigText("deepseek-v4-pro"), "deepseek-v4-pro");
  return req;
}

TEST(HtmlReceipt, ChartsPlanVersionAndNothingExternal) {
  Result<HtmlReceipt> r = BuildHtmlReceipt(Preset("deepseek-v4-pro"), V4ProOnH200());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::string& h = r->html;
  // Three line charts and the stacked bars; three engines per line chart.
  EXPECT_EQ(Occurrences(h, "<svg"), 4u);
  EXPECT_EQ(Occurrences(h, "<path class=\"series\""), 9u);
  // 1K..1M: 11 contexts, a point each, per engine per chart.
  ASSERT_EQ(r->contexts.size(), 11u);
  EXPECT_EQ(r->contexts.front(), 1024u);
  EXPECT_EQ(r->contexts.back(), 1048576u);
  EXPECT_EQ(Occurrences(h, "<circle"), 3u * 3u * 11u);
  EXPECT_GE(Occurrences(h, "<rect class=\"seg\""), 3u);
  for (const auto& pts : PathPoints(h)) {
    ASSERT_EQ(pts.size(), 11u);
    for (size_t i = 1; i < pts.size(); ++i) EXPECT_GT(pts[i].first, pts[i - 1].first);
  }
  EXPECT_NE(h.find("tessera " + std::string(TesseraVersion())), std::string::npos);
  EXPECT_NE(h.find("H200-141G"), std::string::npos);
  EXPECT_NE(h.find("<table class=\"plan\">"), std::string::npos);
  EXPECT_EQ(Occurrences(h, "<tr><td>vllm</td><td>prefill_peak</td>"), 1u);
  ASSERT_TRUE(r->plan.has_value());
  EXPECT_FALSE(r->plan->any_rejected());
  // Self-contained: nothing fetched, nothing run.
  EXPECT_EQ(Lower(h).find("<script"), std::string::npos);
  EXPECT_EQ(Lower(h).find("http:"), std::string::npos);
  EXPECT_EQ(Lower(h).find("https:"), std::string::npos);
  EXPECT_EQ(Lower(h).find("src="), std::string::npos);
  EXPECT_EQ(Lower(h).find("href="), std::string::npos);
  EXPECT_EQ(Lower(h).find("nan"), std::string::npos);
  EXPECT_TRUE(r->receipt.all_passed());
}

TEST(HtmlReceipt, GatesListRejectedConfigurations) {
  HtmlReceiptRequest req = V4ProOnH200();
  req.plan->min_concurrency = 1000000;
  Result<HtmlReceipt> r = BuildHtmlReceipt(Preset("deepseek-v4-pro"), req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->plan->any_rejected());
  EXPECT_EQ(Occurrences(r->html, "<li class=\"fail\">"), 3u);
  EXPECT_NE(r->html.find("1,000,000"), std::string::npos);
}

TEST(HtmlReceipt, HostileModelNameIsEscaped) {
  std::string name = "<img src=x onerror=alert(1)>\"'&.json";
  Result<Geometry> g = GeometryFromConfigJson(*PresetConfigText("deepseek-v3"), name);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  HtmlReceiptRequest req;
  req.receipt = ReceiptRequest{name, Context(4096), std::nullopt, false};
  Result<HtmlReceipt> r = BuildHtmlReceipt(*g, req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->html.find("<img"), std::string::npos);
  EXPECT_NE(r->html.find("&lt;img src=x onerror=alert(1)&gt;&quot;&#39;&amp;.json"), std::string::npos);
  EXPECT_FALSE(r->plan.has_value());
  EXPECT_EQ(r->html.find("<table class=\"plan\">"), std::string::npos);
  // DeepSeek-V3: max_position_embeddings 163,840, not a power of two: the last context.
  EXPECT_EQ(r->contexts.back(), 163840u);
  EXPECT_EQ(r->contexts[r->contexts.size() - 2], 131072u);
}

TEST(HtmlReceipt, Deterministic) {
  HtmlReceiptRequest req = V4ProOnH200();
  EXPECT_EQ(BuildHtmlReceipt(Preset("deepseek-v4-pro"), req)->html,
            BuildHtmlReceipt(Preset("deepseek-v4-pro"), req)->html);
}

// In a git checkout the baked-in version names a commit of this repository (`git describe`
// output is revision syntax; "-dirty" marks uncommitted changes at build time).
TEST(Version, NamesACommitOfThisCheckout) {
  std::string v(TesseraVersion());
  ASSERT_TRUE(std::regex_match(v, std::regex("[A-Za-z0-9._+-]+"))) << v;
  if (::access((std::string(TESSERA_SOURCE_DIR) + "/.git").c_str(), F_OK) != 0 ||
      std::system("git --version >/dev/null 2>&1") != 0) {
    EXPECT_EQ(v, "0.1.0-unknown");
    return;
  }
  std::string rev = v.size() > 6 && v.compare(v.size() - 6, 6, "-dirty") == 0 ? v.substr(0, v.size() - 6) : v;
  std::string cmd = "git -C " + std::string(TESSERA_SOURCE_DIR) + " rev-parse --verify --quiet '" + rev +
                    "^{commit}' >/dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << v;
}

// cmake/version.cmake outside a git checkout (a source tarball): the project version + "-unknown".
TEST(Version, WithoutGitIsProjectVersionUnknown) {
  testing::TempDir dir;
  std::string out = dir.path() + "/v.h";
  std::string cmd = std::string(TESSERA_CMAKE_COMMAND) + " -DSOURCE_DIR=" + dir.path() +
                    " -DPROJECT_VERSION=0.1.0 -DOUTPUT=" + out + " -P " + TESSERA_SOURCE_DIR +
                    "/cmake/version.cmake >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find("#define TESSERA_VERSION_STRING \"0.1.0-unknown\""), std::string::npos) << ss.str();
}

}  // namespace
}  // namespace tessera

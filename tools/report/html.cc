#include "tessera_tools/html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tessera/units.h"
#include "tessera_tools/plan_render.h"
#include "tessera_tools/version.h"

namespace tessera {
namespace html {

namespace {

// Length of the UTF-8 sequence starting at s[i] (0: not a valid sequence).
size_t Utf8Length(std::string_view s, size_t i) {
  auto cont = [&](size_t k) { return k < s.size() && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80; };
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(i + 1) || !cont(i + 2)) return 0;
    unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
    if (c == 0xE0 && c1 < 0xA0) return 0;   // overlong
    if (c == 0xED && c1 >= 0xA0) return 0;  // surrogates
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return 0;
    unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
    if (c == 0xF0 && c1 < 0x90) return 0;   // overlong
    if (c == 0xF4 && c1 >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

// A coordinate: fixed, one decimal. Callers pass finite values only (Map clamps).
std::string Px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", std::isfinite(v) ? v : 0.0);
  return buf;
}

std::string TokensLabel(uint64_t t) {
  if (t >= (uint64_t{1} << 20) && t % (uint64_t{1} << 20) == 0) return std::to_string(t >> 20) + "M";
  if (t >= 1024 && t % 1024 == 0) return std::to_string(t >> 10) + "K";
  return WithThousands(t);
}

// Axis labels: three significant digits in binary units ("190 MiB", "1.5 GiB").
std::string ShortBytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  size_t u = 0;
  while (bytes >= 1024 && u + 1 < std::size(kUnits)) {
    bytes /= 1024;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3g %s", std::isfinite(bytes) ? bytes : 0.0, kUnits[u]);
  return buf;
}

constexpr double kWidth = 760;
constexpr double kLeft = 90, kRight = 150, kTop = 34, kBottom = 50;

// A generous estimate of a label's width in the page's sans-serif (DejaVu Sans, Chromium's
// default on Debian, is wide: 0.65 em covers its lowercase, digits and '_'), so that the legend
// column is made wide enough for its longest entry and nothing is clipped at the SVG's edge.
double TextWidth(std::string_view text, int size) { return 0.65 * size * static_cast<double>(text.size()); }

// The SVG's width: the plot, then a legend column from kWidth - kRight + 32 as wide as its
// longest name (tests/browser_test.cc checks every text box lies inside).
double ChartWidth(const std::vector<std::string>& legend, int size) {
  double widest = 0;
  for (const std::string& n : legend) widest = std::max(widest, TextWidth(n, size));
  return std::max(kWidth, kWidth - kRight + 32 + widest + 10);
}

std::string SvgOpen(double width, double height, const std::string& title) {
  return "<svg class=\"chart\" width=\"" + Px(width) + "\" height=\"" + Px(height) + "\" viewBox=\"0 0 " + Px(width) +
         " " + Px(height) + "\" role=\"img\" aria-label=\"" + Escape(title) + "\"><title>" + Escape(title) +
         "</title><rect x=\"0\" y=\"0\" width=\"" + Px(width) + "\" height=\"" + Px(height) +
         "\" fill=\"#ffffff\"/><text x=\"" + Px(width / 2) +
         "\" y=\"20\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">" + Escape(title) + "</text>";
}

std::string Text(double x, double y, const std::string& text, const char* anchor, int size = 11) {
  return "<text x=\"" + Px(x) + "\" y=\"" + Px(y) + "\" text-anchor=\"" + anchor + "\" font-size=\"" +
         std::to_string(size) + "\">" + Escape(text) + "</text>";
}

std::string Line(double x1, double y1, double x2, double y2, const char* stroke, double width = 1) {
  return "<line x1=\"" + Px(x1) + "\" y1=\"" + Px(y1) + "\" x2=\"" + Px(x2) + "\" y2=\"" + Px(y2) + "\" stroke=\"" +
         stroke + "\" stroke-width=\"" + Px(width) + "\"/>";
}

bool Positive(double v) { return std::isfinite(v) && v > 0; }

}  // namespace

std::string Escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    size_t n = Utf8Length(text, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    if (n == 1) {
      char c = text[i];
      switch (c) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&quot;";
          break;
        case '\'':
          out += "&#39;";
          break;
        default:
          if ((static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') || c == 0x7F) {
            out += "\xEF\xBF\xBD";
          } else {
            out += c;
          }
      }
    } else {
      out.append(text.substr(i, n));
    }
    i += n;
  }
  return out;
}

double LogAxis::Map(double value) const {
  double e = std::log2(value);
  if (!std::isfinite(e)) e = lo_exp;  // 0 or not a number: the axis floor
  e = std::clamp(e, static_cast<double>(lo_exp), static_cast<double>(hi_exp));
  return px0 + (px1 - px0) * (e - lo_exp) / (hi_exp - lo_exp);
}

std::vector<int> LogAxis::TickExponents(int max_ticks) const {
  int span = hi_exp - lo_exp;
  int step = std::max(1, (span + std::max(1, max_ticks) - 1) / std::max(1, max_ticks));
  std::vector<int> ticks;
  // Aligned to multiples of the step, so byte ticks land on KiB, MiB, GiB where they can.
  int first = lo_exp;
  while (first % step != 0) ++first;
  for (int e = first; e <= hi_exp; e += step) ticks.push_back(e);
  return ticks;
}

LogAxis MakeLogAxis(double lo, double hi, double px0, double px1) {
  LogAxis a;
  a.lo_exp = static_cast<int>(std::floor(std::log2(lo)));
  a.hi_exp = static_cast<int>(std::ceil(std::log2(hi)));
  if (a.hi_exp <= a.lo_exp) a.hi_exp = a.lo_exp + 1;
  a.px0 = px0;
  a.px1 = px1;
  return a;
}

std::string ByteTicks::Label(size_t i) const {
  if (i >= ticks.size()) return "";
  return ticks[i] == 0 ? "0 B" : WithThousands(ticks[i] / unit_bytes) + " " + unit;
}

ByteTicks MakeByteTicks(uint64_t max_bytes, int target) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  static constexpr uint64_t kMultiples[] = {1, 2, 5, 10, 20, 50, 100, 200, 500};
  ByteTicks t;
  const uint64_t raw = std::max<uint64_t>(1, max_bytes / static_cast<uint64_t>(std::max(1, target)));
  size_t u = 0;
  while (u + 1 < std::size(kUnits) && raw / t.unit_bytes >= 1024) {
    t.unit_bytes *= 1024;
    ++u;
  }
  // The smallest 1-2-5 multiple of the unit at least the raw step; past 500 units, 1 of the next.
  const double m = static_cast<double>(raw) / static_cast<double>(t.unit_bytes);
  t.multiple = 0;
  for (uint64_t c : kMultiples) {
    if (static_cast<double>(c) >= m) {
      t.multiple = c;
      break;
    }
  }
  if (t.multiple == 0) {
    t.multiple = 1;
    if (u + 1 < std::size(kUnits)) {
      t.unit_bytes *= 1024;
      ++u;
    }
  }
  t.unit = kUnits[u];
  t.step = t.multiple * t.unit_bytes;
  for (uint64_t v = 0;; v += t.step) {
    t.ticks.push_back(v);
    if (v >= max_bytes || v > UINT64_MAX - t.step) break;
  }
  return t;
}

std::string LineChartSvg(const LineChart& chart) {
  const double height = 340;
  double xmin = 0, xmax = 0, ymin = 0, ymax = 0;
  bool any = false;
  for (const Series& s : chart.series) {
    for (const auto& [x, y] : s.points) {
      if (!Positive(x) || !Positive(y)) continue;
      xmin = any ? std::min(xmin, x) : x;
      xmax = any ? std::max(xmax, x) : x;
      ymin = any ? std::min(ymin, y) : y;
      ymax = any ? std::max(ymax, y) : y;
      any = true;
    }
  }
  if (!any) xmin = xmax = ymin = ymax = 1;
  LogAxis xa = MakeLogAxis(xmin, xmax, kLeft, kWidth - kRight);
  LogAxis ya = MakeLogAxis(ymin, ymax, height - kBottom, kTop);
  std::vector<std::string> names;
  names.reserve(chart.series.size());
  for (const Series& ser : chart.series) names.push_back(ser.name);
  std::string s = SvgOpen(ChartWidth(names, 12), height, chart.title);
  // Grid, ticks and labels.
  for (int e : xa.TickExponents(11)) {
    double x = xa.Map(std::ldexp(1.0, e));
    s += Line(x, kTop, x, height - kBottom, "#e4e4e4");
    s += Text(x, height - kBottom + 16, e >= 0 && e < 64 ? TokensLabel(uint64_t{1} << e) : "", "middle");
  }
  for (int e : ya.TickExponents(7)) {
    double y = ya.Map(std::ldexp(1.0, e));
    s += Line(kLeft, y, kWidth - kRight, y, "#e4e4e4");
    s += Text(kLeft - 6, y + 4, ShortBytes(std::ldexp(1.0, e)), "end");
  }
  s += Line(kLeft, height - kBottom, kWidth - kRight, height - kBottom, "#333333");
  s += Line(kLeft, kTop, kLeft, height - kBottom, "#333333");
  s += Text((kLeft + kWidth - kRight) / 2, height - 12, chart.x_label, "middle", 12);
  s += "<text x=\"14\" y=\"" + Px((kTop + height - kBottom) / 2) + "\" text-anchor=\"middle\" font-size=\"12\" " +
       "transform=\"rotate(-90 14 " + Px((kTop + height - kBottom) / 2) + ")\">" + Escape(chart.y_label) + "</text>";
  // Series, then the legend.
  double legend_y = kTop + 10;
  // Engines often agree (requested bytes are the model's): earlier series are drawn wider and
  // lighter, so a line under another stays visible around it.
  double stroke = 2 + 2.5 * static_cast<double>(chart.series.size() > 0 ? chart.series.size() - 1 : 0);
  for (const Series& ser : chart.series) {
    std::string d;
    std::string dots;
    for (const auto& [x, y] : ser.points) {
      if (!Positive(x) || !Positive(y)) continue;
      std::string px = Px(xa.Map(x)), py = Px(ya.Map(y));
      d += (d.empty() ? "M" : " L") + px + " " + py;
      dots += "<circle cx=\"" + px + "\" cy=\"" + py + "\" r=\"" + Px(stroke / 2 + 1) + "\" fill=\"" +
              Escape(ser.color) + "\"/>";
    }
    if (d.empty()) continue;
    s += "<path class=\"series\" d=\"" + d + "\" fill=\"none\" stroke=\"" + Escape(ser.color) + "\" stroke-width=\"" +
         Px(stroke) + "\"><title>" + Escape(ser.name) + "</title></path>" + dots;
    stroke = std::max(2.0, stroke - 2.5);
    s += "<rect class=\"swatch\" x=\"" + Px(kWidth - kRight + 14) + "\" y=\"" + Px(legend_y - 9) +
         "\" width=\"12\" height=\"12\" fill=\"" + Escape(ser.color) + "\"/>";
    s += Text(kWidth - kRight + 32, legend_y + 1, ser.name, "start", 12);
    legend_y += 20;
  }
  s += "</svg>";
  return s;
}

std::string StackedBarsSvg(const std::string& title, const std::vector<Bar>& bars) {
  const double bar_h = 26, gap = 16;
  // Legend: each segment name once, in first-seen order.
  std::vector<const BarSegment*> legend;
  uint64_t max_total = 0;
  for (const Bar& b : bars) {
    uint64_t total = 0;
    for (const BarSegment& seg : b.segments) {
      total = seg.bytes > UINT64_MAX - total ? UINT64_MAX : total + seg.bytes;
      if (seg.bytes == 0) continue;
      bool seen = false;
      for (const BarSegment* l : legend) seen = seen || l->name == seg.name;
      if (!seen) legend.push_back(&seg);
    }
    max_total = std::max(max_total, total);
  }
  double plot_h = static_cast<double>(bars.size()) * (bar_h + gap);
  double height = kTop + 10 + std::max(plot_h, 20.0 * static_cast<double>(legend.size())) + kBottom;
  std::vector<std::string> names;
  names.reserve(legend.size());
  for (const BarSegment* l : legend) names.push_back(l->name);
  std::string s = SvgOpen(ChartWidth(names, 11), height, title);
  double x0 = kLeft, x1 = kWidth - kRight;
  double axis_y = kTop + 10 + plot_h;
  // Linear ticks on round values (1-2-5 steps in a binary unit), the axis ending on the last.
  const ByteTicks ticks = MakeByteTicks(max_total);
  const double axis_max = static_cast<double>(ticks.ticks.back());
  double scale = axis_max == 0 ? 0 : (x1 - x0) / axis_max;
  for (size_t i = 0; i < ticks.ticks.size(); ++i) {
    double x = x0 + static_cast<double>(ticks.ticks[i]) * scale;
    s += Line(x, kTop + 6, x, axis_y, "#e4e4e4");
    s += Text(x, axis_y + 16, ticks.Label(i), "middle", 10);
  }
  s += Line(x0, axis_y, x1, axis_y, "#333333");
  s += Text((x0 + x1) / 2, height - 12, "committed bytes per rank", "middle", 12);
  double y = kTop + 10 + gap / 2;
  for (const Bar& b : bars) {
    s += Text(x0 - 6, y + bar_h / 2 + 4, b.label, "end", 12);
    double x = x0;
    for (const BarSegment& seg : b.segments) {
      if (seg.bytes == 0) continue;
      double w = static_cast<double>(seg.bytes) * scale;
      s += "<rect class=\"seg\" x=\"" + Px(x) + "\" y=\"" + Px(y) + "\" width=\"" + Px(std::max(w, 0.5)) +
           "\" height=\"" + Px(bar_h) + "\" fill=\"" + Escape(seg.color) + "\"><title>" + Escape(b.label) + " " +
           Escape(seg.name) + ": " + WithThousands(seg.bytes) + " B</title></rect>";
      x += w;
    }
    y += bar_h + gap;
  }
  double ly = kTop + 14;
  for (const BarSegment* l : legend) {
    s += "<rect class=\"swatch\" x=\"" + Px(x1 + 14) + "\" y=\"" + Px(ly - 9) +
         "\" width=\"12\" height=\"12\" fill=\"" + Escape(l->color) + "\"/>";
    s += Text(x1 + 32, ly + 1, l->name, "start", 11);
    ly += 20;
  }
  s += "</svg>";
  return s;
}

}  // namespace html

namespace {

using html::Escape;

const char* EngineColor(Engine e) {
  switch (e) {
    case Engine::kTessera:
      return "#1f77b4";
    case Engine::kVllm:
      return "#d62728";
    case Engine::kSglang:
      return "#2ca02c";
  }
  return "#777777";
}

const char* TermColor(LedgerTerm t) {
  switch (t) {
    case LedgerTerm::kRecords:
      return "#4c78a8";
    case LedgerTerm::kPageRounding:
      return "#f58518";
    case LedgerTerm::kAlignmentPadding:
      return "#e45756";
    case LedgerTerm::kRingCapacity:
      return "#72b7b2";
    case LedgerTerm::kSpeculativeSlots:
      return "#54a24b";
    case LedgerTerm::kBlockMetadata:
      return "#eeca3b";
    case LedgerTerm::kBoundaryState:
      return "#b279a2";
    case LedgerTerm::kUniformBlockPadding:
      return "#9d755d";
  }
  return "#777777";
}

std::string TermLabel(LedgerTerm t) {
  std::string name(LedgerTermName(t));
  return t == LedgerTerm::kRecords ? name + " (structural)" : name;
}

std::string Cell(const std::string& text, bool num = false) {
  return std::string(num ? "<td class=\"n\">" : "<td>") + Escape(text) + "</td>";
}

std::string Head(std::initializer_list<const char*> names) {
  std::string s = "<tr>";
  for (const char* n : names) s += "<th>" + Escape(n) + "</th>";
  return s + "</tr>";
}

std::string Count(uint64_t v) { return v == UINT64_MAX ? "unbounded" : WithThousands(v); }

uint64_t PhaseOf(const Ledger& l, LedgerPhase p) {
  for (const PhaseBytes& b : l.phases) {
    if (b.phase == p) return b.bytes;
  }
  return 0;
}

constexpr const char* kStyle =
    "body{font-family:sans-serif;margin:24px;color:#222;max-width:1100px}"
    "table{border-collapse:collapse;margin:8px 0 18px}td,th{border:1px solid #ccc;padding:3px 8px;"
    "font-size:13px}th{background:#f0f0f0;text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}"
    ".pass{color:#1a7f37}.fail{color:#c62828;font-weight:bold}svg.chart{display:block;margin:10px 0;"
    "border:1px solid #ddd}code{font-size:12px}";

// The charted contexts: powers of two from 1K (or the maximum, if smaller) to the maximum.
std::vector<uint64_t> ChartedContexts(const Geometry& g, const LedgerOptions& base) {
  std::vector<uint64_t> contexts;
  uint64_t max_ctx = g.max_position_embeddings != 0 ? g.max_position_embeddings : base.context_tokens;
  for (uint64_t c = std::min<uint64_t>(1024, max_ctx); c != 0 && c <= max_ctx; c *= 2) {
    contexts.push_back(c);
    if (c > max_ctx / 2) break;
  }
  if (contexts.empty() || contexts.back() != max_ctx) contexts.push_back(max_ctx);
  return contexts;
}

// What the page charts per engine: the three curves, the committed terms as bars, the ledger at
// the receipt's context.
struct EngineFigures {
  html::LineChart requested, committed, read;
  std::vector<html::Bar> bars;
  std::vector<std::pair<Engine, Ledger>> at_context;
};

// One ledger per engine at the receipt's context (terms), and per engine per charted context
// (curves); batch 1, the receipt's other options. An engine or a context without a ledger is a
// note. Requested bytes are the request's logical cache, one copy (the latent is replicated on
// every tensor-parallel rank; all ranks together hold tp copies, which this chart does not plot).
EngineFigures ComputeEngineFigures(const Geometry& g, const HtmlReceiptRequest& req,
                                   const std::vector<uint64_t>& contexts, std::vector<std::string>* notes) {
  const LedgerOptions& base = req.receipt.options;
  EngineFigures f{{"Requested bytes per request (one copy of its cache)", "bytes (one copy)", "context (tokens)", {}},
                  {"Committed bytes per request (one rank)", "bytes per rank", "context (tokens)", {}},
                  {"Cache bytes read per generated token (one rank)", "bytes per token", "context (tokens)", {}},
                  {},
                  {}};
  for (Engine e : req.engines) {
    std::string name(EngineName(e));
    LedgerOptions o = base;
    o.engine = e;
    Result<Ledger> here = ComputeLedger(g, o);
    if (!here.ok()) {
      notes->push_back(name + ": no ledger at the receipt's options: " + here.status().ToString());
      continue;
    }
    html::Bar bar{name, {}};
    for (const Term& t : here->terms) bar.segments.push_back({TermLabel(t.term), TermColor(t.term), t.bytes});
    f.bars.push_back(std::move(bar));
    f.at_context.emplace_back(e, std::move(*here));
    html::Series rq{name, EngineColor(e), {}}, cm{name, EngineColor(e), {}}, rd{name, EngineColor(e), {}};
    for (uint64_t c : contexts) {
      o.context_tokens = c;
      o.batch = 1;
      Result<Ledger> l = ComputeLedger(g, o);
      if (!l.ok()) {
        notes->push_back(name + " at " + WithThousands(c) + " tokens: " + l.status().ToString());
        continue;
      }
      double x = static_cast<double>(c);
      rq.points.emplace_back(x, static_cast<double>(l->requested_bytes));
      cm.points.emplace_back(x, static_cast<double>(l->committed_bytes));
      rd.points.emplace_back(x, static_cast<double>(l->read_bytes_per_token));
    }
    f.requested.series.push_back(std::move(rq));
    f.committed.series.push_back(std::move(cm));
    f.read.series.push_back(std::move(rd));
  }

  return f;
}

// The page, section by section: `h` the HTML so far.
struct HtmlPage {
  std::string h;
  void Row(const std::string& k, const std::string& v) { h += "<tr><th>" + Escape(k) + "</th>" + Cell(v) + "</tr>"; }
};

void InputsSection(const Geometry& g, const HtmlReceiptRequest& req, const Ledger& main, HtmlPage* page) {
  const LedgerOptions& base = req.receipt.options;
  std::string& h = page->h;
  auto row = [&](const std::string& k, const std::string& v) { page->Row(k, v); };
  h += "<table class=\"inputs\">";
  row("software", "tessera " + std::string(TesseraVersion()));
  row("model source", req.receipt.model_source);
  row("model type", g.model_type);
  row("config sha256", g.config_sha256);
  row("geometry", std::to_string(g.num_layers) + " layers (+" + std::to_string(g.num_mtp_layers) + " MTP), " +
                      std::to_string(g.num_attention_heads) + " heads, latent " + std::to_string(g.latent_dim) +
                      " + rope " + std::to_string(g.qk_rope_head_dim));
  row("kv format", main.kv_format + (main.indexer_format.empty() ? "" : ", indexer " + main.indexer_format));
  row("context, batch", WithThousands(base.context_tokens) + " tokens, batch " + WithThousands(base.batch));
  row("tp, dcp", std::to_string(base.tp) + ", " + std::to_string(base.dcp));
  row("speculative tokens, MTP counted", std::to_string(base.spec_tokens) + ", " + (base.include_mtp ? "yes" : "no"));
  row("kernel, prefill chunk", std::string(KernelName(base.kernel)) + ", " + WithThousands(base.prefill_chunk_tokens));
  if (req.receipt.observed_bytes) {
    row("observed", WithThousands(*req.receipt.observed_bytes) + " B (" +
                        (req.receipt.observed_all_ranks ? "all ranks" : "per rank") + ")");
  }
  h += "</table>\n";
}

void AcceleratorSection(const Plan& plan, HtmlPage* page) {
  std::string& h = page->h;
  auto row = [&](const std::string& k, const std::string& v) { page->Row(k, v); };
  const GpuSpec& gpu = plan.gpu;
  h += "<h2>Accelerator</h2>\n<table class=\"gpu\">";
  row("gpu", gpu.name + " (" + gpu.description + ")");
  row("memory", FormatBytes(gpu.memory_bytes));
  row("HBM bandwidth", WithThousands(gpu.hbm_bytes_per_s) + " B/s");
  row("dense bf16 / fp8", WithThousands(gpu.dense_bf16_flops) + " / " + WithThousands(gpu.dense_fp8_flops) + " FLOP/s");
  row("tp, gpu-memory-utilization", std::to_string(plan.tp) + ", " + plan.utilization.ToDecimal());
  h += "</table>\n";
}

void ContextSection(const std::vector<uint64_t>& contexts, const EngineFigures& f, const LedgerOptions& base,
                    HtmlPage* page) {
  std::string& h = page->h;
  h += "<h2>Bytes against context</h2>\n<p>Batch 1, every engine with the receipt's other options; log scales. "
       "Contexts: ";
  for (size_t i = 0; i < contexts.size(); ++i) h += (i ? ", " : "") + WithThousands(contexts[i]);
  h += ".</p>\n";
  h += html::LineChartSvg(f.requested) + "\n" + html::LineChartSvg(f.committed) + "\n" + html::LineChartSvg(f.read) +
       "\n";

  h += "<h2>Committed bytes by term at " + WithThousands(base.context_tokens) + " tokens</h2>\n";
  h += html::StackedBarsSvg("Committed bytes per rank, by term", f.bars) + "\n";
  h += "<table class=\"ledger\">" +
       Head({"engine", "requested", "committed (one rank)", "read per token", "admission", "prefill peak", "decode"});
  for (const auto& [e, l] : f.at_context) {
    h += "<tr>" + Cell(std::string(EngineName(e))) + Cell(WithThousands(l.requested_bytes), true) +
         Cell(WithThousands(l.committed_bytes), true) + Cell(WithThousands(l.read_bytes_per_token), true) +
         Cell(WithThousands(PhaseOf(l, LedgerPhase::kAdmission)), true) +
         Cell(WithThousands(PhaseOf(l, LedgerPhase::kPrefillPeak)), true) +
         Cell(WithThousands(PhaseOf(l, LedgerPhase::kDecode)), true) + "</tr>";
  }
  h += "</table>\n<table class=\"terms\">" + Head({"engine", "term", "bytes (one rank)"});
  for (const auto& [e, l] : f.at_context) {
    for (const Term& t : l.terms) {
      h += "<tr>" + Cell(std::string(EngineName(e))) + Cell(TermLabel(t.term)) + Cell(WithThousands(t.bytes), true) +
           "</tr>";
    }
  }
  h += "</table>\n";
}

void PlanSection(const Plan& p, HtmlPage* page, std::vector<std::string>* notes) {
  std::string& h = page->h;
  auto row = [&](const std::string& k, const std::string& v) { page->Row(k, v); };
  h += "<h2>Capacity plan: " + Escape(std::to_string(p.tp) + " x " + p.gpu.name) + "</h2>\n<table class=\"budget\">";
  row("usable per rank", FormatBytes(p.usable_bytes));
  row("weights per rank (" + std::string(WeightDtypeName(p.weights.dtype)) + ")",
      FormatBytes(p.weights.bytes_per_rank));
  row("reserve per rank", FormatBytes(p.reserve_bytes));
  row("KV budget per rank", FormatBytes(p.kv_budget_bytes) + (p.weights_fit ? "" : " (the weights do not fit)"));
  h += "</table>\n<table class=\"plan\">" + Head({"engine", "phase", "bytes per request (one rank)", "max concurrency",
                                                  p.concurrency ? "max context at the concurrency" : "max context"});
  for (const EnginePlan& e : p.engines) {
    for (const PhasePlan& ph : e.phases) {
      h += "<tr>" + Cell(std::string(EngineName(e.engine))) + Cell(std::string(LedgerPhaseName(ph.phase))) +
           Cell(WithThousands(ph.bytes_per_request), true) + Cell(Count(ph.max_concurrency), true) +
           Cell(ph.max_context ? WithThousands(*ph.max_context) : "-", true) + "</tr>";
    }
  }
  h += "</table>\n<h2>Gates</h2>\n<table class=\"gates\">";
  row("max committed bytes per rank", p.max_committed_bytes ? WithThousands(*p.max_committed_bytes) : "none");
  row("min concurrency", p.min_concurrency ? WithThousands(*p.min_concurrency) : "none");
  h += "</table>\n<h2>Rejected configurations</h2>\n";
  bool any = false;
  h += "<ul class=\"rejected\">";
  for (const EnginePlan& e : p.engines) {
    if (!e.rejected) continue;
    any = true;
    std::string why;
    for (const std::string& r : e.reasons) why += (why.empty() ? "" : "; ") + r;
    h += "<li class=\"fail\">" + Escape(std::string(EngineName(e.engine)) + ": " + why) + "</li>";
  }
  h += any ? "</ul>\n" : "<li>none</li></ul>\n";
  for (const std::string& n : p.notes) notes->push_back("plan: " + n);
}

void ChecksAndNotesSection(const Receipt& receipt, const Ledger& main, std::vector<std::string> notes, HtmlPage* page) {
  std::string& h = page->h;
  h += "<h2>Checks</h2>\n<ul class=\"checks\">";
  for (const ReceiptCheck& c : receipt.checks) {
    h += std::string("<li class=\"") + (c.passed ? "pass\">passed" : "fail\">FAILED") + ": " + Escape(c.name) + " — " +
         Escape(c.detail) + "</li>";
  }
  h += "</ul>\n";
  for (const std::string& n : main.notes) notes.push_back(n);
  if (!notes.empty()) {
    h += "<h2>Notes</h2>\n<ul class=\"notes\">";
    for (const std::string& n : notes) h += "<li>" + Escape(n) + "</li>";
    h += "</ul>\n";
  }
}

}  // namespace

Result<HtmlReceipt> BuildHtmlReceipt(const Geometry& g, const HtmlReceiptRequest& req) {
  if (req.engines.empty()) return InvalidArgument("engine", "no engine to chart");
  if (req.plan && !req.shapes) return InvalidArgument("gpu", "a plan needs the model's weight shapes");
  HtmlReceipt out;
  TESSERA_ASSIGN_OR_RETURN(out.receipt, BuildReceipt(g, req.receipt));
  const LedgerOptions& base = req.receipt.options;
  TESSERA_ASSIGN_OR_RETURN(Ledger main, ComputeLedger(g, base));
  std::vector<std::string> notes;
  out.contexts = ChartedContexts(g, base);
  const EngineFigures figures = ComputeEngineFigures(g, req, out.contexts, &notes);
  if (req.plan) {
    PlanOptions po = *req.plan;
    po.ledger = base;
    po.context_tokens = base.context_tokens;
    po.tp = base.tp;
    po.engines = req.engines;
    TESSERA_ASSIGN_OR_RETURN(Plan p, ComputePlan(g, *req.shapes, po));
    out.plan = std::move(p);
  }

  HtmlPage page;
  const std::string title = "Cache receipt: " + main.model + " at " + WithThousands(base.context_tokens) + " tokens";
  page.h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">";
  // Nothing on this page loads or runs anything.
  page.h += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">";
  page.h += "<title>" + Escape(title) + "</title><style>" + kStyle + "</style></head>\n<body>\n";
  page.h += "<h1>" + Escape(title) + "</h1>\n";
  InputsSection(g, req, main, &page);
  if (out.plan) AcceleratorSection(*out.plan, &page);
  ContextSection(out.contexts, figures, base, &page);
  if (out.plan) PlanSection(*out.plan, &page, &notes);
  ChecksAndNotesSection(out.receipt, main, std::move(notes), &page);
  page.h += "</body></html>\n";
  out.html = std::move(page.h);
  return out;
}

}  // namespace tessera

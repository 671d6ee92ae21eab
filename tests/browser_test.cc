// The HTML receipt checked the way a person would: rendered by headless Chromium (Debian's
// `chromium`), its DOM counted and its screenshot decoded to find the charts' colours on screen.
// Skips when /usr/bin/chromium is absent (scripts/install-deps.sh installs it). Label `browser`
// (tests/CMakeLists.txt): the sanitizer test presets leave it out.
//
// Not flaky by construction: each browser run is bounded by coreutils `timeout`, which kills the
// browser's whole process group (-k: SIGKILL 10 s after SIGTERM), with a generous limit, and
// the assertions are counts, never timings.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.h"

namespace tessera {
namespace {

using testing::CommandResult;
using testing::RunTessera;
using testing::TempDir;

constexpr char kChromium[] = "/usr/bin/chromium";

#define REQUIRE_CHROMIUM()                                                                          \
  if (::access(kChromium, X_OK) != 0) {                                                             \
    GTEST_SKIP() << kChromium << " is absent: install Debian's chromium (scripts/install-deps.sh)"; \
  }

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

size_t Occurrences(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

// Runs headless Chromium on `html_path` with `mode` ("--dump-dom" or "--screenshot=PATH"); the
// exit status, stdout in `out`.
int Chromium(const TempDir& dir, const std::string& mode, const std::string& html_path, std::string* out) {
  std::string stdout_path = dir.path() + "/chromium.out";
  std::string cmd = "timeout -k 10 180 " + std::string(kChromium) +
                    " --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run"
                    " --force-device-scale-factor=1 --window-size=1200,2000 --user-data-dir=" +
                    dir.path() + "/profile " + mode + " file://" + html_path + " >" + stdout_path + " 2>" + dir.path() +
                    "/chromium.err </dev/null";
  int status = std::system(cmd.c_str());
  if (out != nullptr) *out = ReadAll(stdout_path);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A decoded PNG: 8-bit RGB or RGBA, not interlaced (what Chromium writes).
struct Image {
  uint32_t width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;  // rows of width x channels
};

uint32_t Be32(const std::string& s, size_t at) {
  return (uint32_t{static_cast<uint8_t>(s[at])} << 24) | (uint32_t{static_cast<uint8_t>(s[at + 1])} << 16) |
         (uint32_t{static_cast<uint8_t>(s[at + 2])} << 8) | uint32_t{static_cast<uint8_t>(s[at + 3])};
}

// False (with a message) for anything else.
bool DecodePng(const std::string& png, Image* img, std::string* why) {
  if (png.size() < 8 || png.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) return *why = "not a PNG", false;
  std::string idat;
  for (size_t at = 8; at + 12 <= png.size();) {
    uint32_t len = Be32(png, at);
    std::string type = png.substr(at + 4, 4);
    if (at + 12 + len > png.size()) return *why = "truncated chunk", false;
    if (type == "IHDR") {
      img->width = Be32(png, at + 8);
      img->height = Be32(png, at + 12);
      uint8_t depth = static_cast<uint8_t>(png[at + 16]), color = static_cast<uint8_t>(png[at + 17]);
      uint8_t interlace = static_cast<uint8_t>(png[at + 20]);
      if (depth != 8 || (color != 2 && color != 6) || interlace != 0) return *why = "unsupported PNG format", false;
      img->channels = color == 6 ? 4 : 3;
    } else if (type == "IDAT") {
      idat += png.substr(at + 8, len);
    } else if (type == "IEND") {
      break;
    }
    at += 12 + len;
  }
  if (img->width == 0 || img->height == 0 || img->width > 10000 || img->height > 10000) {
    return *why = "bad dimensions", false;
  }
  size_t stride = size_t{img->width} * img->channels;
  std::vector<uint8_t> raw((stride + 1) * img->height);
  uLongf raw_len = raw.size();
  if (uncompress(raw.data(), &raw_len, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) != Z_OK ||
      raw_len != raw.size()) {
    return *why = "inflate failed", false;
  }
  img->pixels.assign(stride * img->height, 0);
  const size_t bpp = img->channels;
  for (size_t y = 0; y < img->height; ++y) {
    uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    uint8_t* row = &img->pixels[y * stride];
    const uint8_t* up = y > 0 ? &img->pixels[(y - 1) * stride] : nullptr;
    for (size_t x = 0; x < stride; ++x) {
      int a = x >= bpp ? row[x - bpp] : 0, b = up ? up[x] : 0, c = (up && x >= bpp) ? up[x - bpp] : 0;
      int pred = 0;
      switch (filter) {
        case 0:
          pred = 0;
          break;
        case 1:
          pred = a;
          break;
        case 2:
          pred = b;
          break;
        case 3:
          pred = (a + b) / 2;
          break;
        case 4: {
          int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
          pred = (pa <= pb && pa <= pc) ? a : (pb <= pc ? b : c);
          break;
        }
        default:
          return *why = "bad filter", false;
      }
      row[x] = static_cast<uint8_t>(in[x] + pred);
    }
  }
  return true;
}

// Pixels of exactly this colour ("#rrggbb").
size_t CountColour(const Image& img, const std::string& hex) {
  uint32_t v = static_cast<uint32_t>(std::stoul(hex.substr(1), nullptr, 16));
  uint8_t r = static_cast<uint8_t>(v >> 16), g = static_cast<uint8_t>(v >> 8), b = static_cast<uint8_t>(v);
  size_t n = 0;
  for (size_t i = 0; i + 2 < img.pixels.size(); i += img.channels) {
    n += img.pixels[i] == r && img.pixels[i + 1] == g && img.pixels[i + 2] == b;
  }
  return n;
}

size_t NonWhite(const Image& img) {
  size_t n = 0;
  for (size_t i = 0; i + 2 < img.pixels.size(); i += img.channels) {
    n += img.pixels[i] != 255 || img.pixels[i + 1] != 255 || img.pixels[i + 2] != 255;
  }
  return n;
}

Image Screenshot(const TempDir& dir, const std::string& html_path, const std::string& name) {
  std::string png = dir.path() + "/" + name + ".png";
  int rc = Chromium(dir, "--screenshot=" + png, html_path, nullptr);
  EXPECT_EQ(rc, 0) << ReadAll(dir.path() + "/chromium.err");
  Image img;
  std::string why;
  EXPECT_TRUE(DecodePng(ReadAll(png), &img, &why)) << name << ": " << why;
  EXPECT_EQ(img.width, 1200u);
  EXPECT_EQ(img.height, 2000u);
  return img;
}

// The receipt of the README's example, written by the binary.
std::string WriteReceipt(const TempDir& dir) {
  CommandResult r = RunTessera(
      "receipt --model deepseek-v4-pro --context 128k --tp 8 --format html --gpu H200-141G "
      "--out " +
      dir.path() + "/receipt");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return dir.path() + "/receipt.html";
}

// Engine colours (tools/report/html.cc) and the structural term's.
const std::map<std::string, std::string> kColours = {
    {"tessera", "#1f77b4"}, {"vllm", "#d62728"}, {"sglang", "#2ca02c"}, {"records", "#4c78a8"}};

TEST(Browser, DomHoldsTheCharts) {
  REQUIRE_CHROMIUM();
  TempDir dir;
  std::string page = WriteReceipt(dir);
  std::string dom;
  ASSERT_EQ(Chromium(dir, "--dump-dom", page, &dom), 0) << ReadAll(dir.path() + "/chromium.err");
  // What the browser parsed: three line charts and the stacked bars, a line per engine in each,
  // a point per engine per context (11 contexts, 1K..1M), the term segments, the plan table.
  EXPECT_EQ(Occurrences(dom, "<svg"), 4u) << dom.substr(0, 2000);
  EXPECT_EQ(Occurrences(dom, "<path class=\"series\""), 9u);
  EXPECT_EQ(Occurrences(dom, "<circle"), 99u);
  EXPECT_EQ(Occurrences(dom, "<rect class=\"seg\""), 11u);  // README.md counts them too
  EXPECT_NE(dom.find("<table class=\"plan\">"), std::string::npos);
  EXPECT_NE(dom.find("Cache receipt: deepseek-v4-pro"), std::string::npos);
}

TEST(Browser, ChartsAreOnScreen) {
  REQUIRE_CHROMIUM();
  TempDir dir;
  std::string page = WriteReceipt(dir);
  Image receipt = Screenshot(dir, page, "receipt");
  // Controls: a blank page, and the same receipt with its <svg> elements cut out — the colours
  // counted below must come from the charts.
  std::string blank = dir.Write("blank.html", "<!DOCTYPE html><html><body></body></html>");
  Image empty = Screenshot(dir, blank, "blank");
  std::string text = ReadAll(page), cut;
  for (size_t at = 0;;) {
    size_t open = text.find("<svg", at);
    if (open == std::string::npos) {
      cut += text.substr(at);
      break;
    }
    size_t close = text.find("</svg>", open);
    ASSERT_NE(close, std::string::npos);
    cut += text.substr(at, open - at);
    at = close + 6;
  }
  Image no_charts = Screenshot(dir, dir.Write("no-charts.html", cut), "no-charts");
  EXPECT_EQ(NonWhite(empty), 0u);
  EXPECT_GT(NonWhite(receipt), 100000u);
  for (const auto& [what, colour] : kColours) {
    EXPECT_EQ(CountColour(no_charts, colour), 0u) << what;
    // A line across a chart, its points, its legend swatch: well over a swatch's 144 pixels.
    EXPECT_GT(CountColour(receipt, colour), 1000u) << what << " " << colour;
  }
}

std::string Thousands(uint64_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// The page's figures are the receipt's: the Markdown+JSON receipt of the same options gives the
// numbers and checks the page must show (issue 22 point 4).
TEST(Browser, PageTextAgreesWithTheReceiptJson) {
  REQUIRE_CHROMIUM();
  TempDir dir;
  std::string page = WriteReceipt(dir);
  CommandResult r = RunTessera("receipt --model deepseek-v4-pro --context 128k --tp 8 --out " + dir.path() + "/r");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(ReadAll(dir.path() + "/r.json"));
  std::string dom;
  ASSERT_EQ(Chromium(dir, "--dump-dom", page, &dom), 0) << ReadAll(dir.path() + "/chromium.err");
  const nlohmann::json& l = j["ledger"];
  EXPECT_NE(dom.find("Cache receipt: " + l["model"].get<std::string>() + " at 131,072 tokens"), std::string::npos);
  // The tessera row of the ledger table: requested, committed, read per token, as the JSON has them.
  const std::string row = "<td>tessera</td><td class=\"n\">" + Thousands(l["requested_bytes"].get<uint64_t>()) +
                          "</td><td class=\"n\">" + Thousands(l["committed_bytes"].get<uint64_t>()) +
                          "</td><td class=\"n\">" + Thousands(l["read_bytes_per_token"].get<uint64_t>()) + "</td>";
  EXPECT_NE(dom.find(row), std::string::npos) << row;
  for (const auto& t : l["committed_terms"]) {
    EXPECT_NE(dom.find("<td class=\"n\">" + Thousands(t["bytes"].get<uint64_t>()) + "</td>"), std::string::npos)
        << t.dump();
  }
  size_t passed = 0;
  for (const auto& c : j["checks"]) {
    EXPECT_NE(dom.find(c["check"].get<std::string>()), std::string::npos) << c.dump();
    passed += c["passed"].get<bool>() ? 1 : 0;
  }
  EXPECT_EQ(Occurrences(dom, "<li class=\"pass\">passed: "), passed);
  // The first chart says what it plots: one copy of the request's cache (the JSON's requested
  // bytes), not all ranks.
  EXPECT_NE(dom.find("Requested bytes per request (one copy of its cache)"), std::string::npos);
  EXPECT_EQ(dom.find("bytes (all ranks)"), std::string::npos);
}

// No text is clipped: every <text> box of every chart, as Chromium lays it out, lies inside its
// SVG. The page forbids scripts (its Content-Security-Policy); a copy without that header gets
// a script that measures the boxes and writes the result into the DOM.
TEST(Browser, EveryChartTextLiesInsideItsSvg) {
  REQUIRE_CHROMIUM();
  TempDir dir;
  std::string text = ReadAll(WriteReceipt(dir));
  size_t csp = text.find("<meta http-equiv=\"Content-Security-Policy\"");
  ASSERT_NE(csp, std::string::npos);
  text.erase(csp, text.find('>', csp) + 1 - csp);
  const std::string script =
      "<script>(function(){let n=0;const bad=[];"
      "for(const svg of document.querySelectorAll('svg.chart')){const s=svg.getBoundingClientRect();"
      "for(const t of svg.querySelectorAll('text')){const b=t.getBoundingClientRect();++n;"
      "if(b.width<=0||b.left<s.left-0.5||b.right>s.right+0.5||b.top<s.top-0.5||b.bottom>s.bottom+0.5)"
      "bad.push(t.textContent+'@'+Math.round(b.left)+'..'+Math.round(b.right)+' in '+Math.round(s.left)+'..'"
      "+Math.round(s.right));}}"
      "const p=document.createElement('pre');p.id='bounds';p.textContent='texts '+n+' outside '+bad.length+"
      "': '+bad.join(' | ');document.body.appendChild(p);})();</script>";
  size_t end = text.rfind("</body>");
  ASSERT_NE(end, std::string::npos);
  text.insert(end, script);
  std::string probe = dir.Write("probe.html", text);
  std::string dom;
  ASSERT_EQ(Chromium(dir, "--dump-dom", probe, &dom), 0) << ReadAll(dir.path() + "/chromium.err");
  size_t at = dom.find("<pre id=\"bounds\">");
  ASSERT_NE(at, std::string::npos) << "the probe did not run";
  std::string result = dom.substr(at, dom.find("</pre>", at) - at);
  EXPECT_NE(result.find(" outside 0: "), std::string::npos) << result;
  // Titles, ticks, axis labels, legends and bar labels of four charts: many texts were measured.
  size_t texts = std::stoul(result.substr(result.find("texts ") + 6));
  EXPECT_GT(texts, 40u) << result;
}

}  // namespace
}  // namespace tessera

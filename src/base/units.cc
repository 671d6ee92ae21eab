#include "tessera/units.h"

#include <cctype>
#include <cstdio>
#include <string>

#include "tessera/checked.h"
#include "tessera/fraction.h"

namespace tessera {

std::string WithThousands(uint64_t v) {
  std::string digits = std::to_string(v);
  std::string out;
  int n = static_cast<int>(digits.size());
  for (int i = 0; i < n; ++i) {
    out += digits[static_cast<size_t>(i)];
    int left = n - 1 - i;
    if (left > 0 && left % 3 == 0) out += ',';
  }
  return out;
}

namespace {

struct Unit {
  const char* name;
  uint64_t size;
};

constexpr Unit kBinary[] = {{"TiB", 1ULL << 40}, {"GiB", 1ULL << 30}, {"MiB", 1ULL << 20}, {"KiB", 1ULL << 10}};
constexpr Unit kDecimal[] = {{"TB", 1000000000000ULL}, {"GB", 1000000000ULL}, {"MB", 1000000ULL}, {"kB", 1000ULL}};

}  // namespace

std::string FormatBinary(uint64_t bytes) {
  for (const Unit& u : kBinary) {
    if (bytes >= u.size) {
      // Binary units divide by powers of two, so the quotient always terminates; print it
      // exactly if it fits in 9 places, else rounded and marked.
      Fraction f(bytes, u.size);
      std::string exact = f.ToDecimal(9);
      if (!exact.empty() && exact[0] == '~') {
        char buf[64];
        std::snprintf(buf, sizeof buf, "~%.6f %s", f.ToDouble(), u.name);
        return buf;
      }
      return exact + " " + u.name;
    }
  }
  return std::to_string(bytes) + " B";
}

std::string FormatDecimal(uint64_t bytes) {
  for (const Unit& u : kDecimal) {
    if (bytes >= u.size) {
      Fraction f(bytes, u.size);
      std::string exact = f.ToDecimal(4);
      if (!exact.empty() && exact[0] != '~') return exact + " " + u.name;
      char buf[64];
      std::snprintf(buf, sizeof buf, "~%.4g %s", f.ToDouble(), u.name);
      return buf;
    }
  }
  return std::to_string(bytes) + " B";
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes < 1000) return std::to_string(bytes) + " B";
  return WithThousands(bytes) + " B (" + FormatBinary(bytes) + ", " + FormatDecimal(bytes) + ")";
}

Result<uint64_t> ParseUnsigned(std::string_view text, std::string_view field) {
  std::string f(field);
  // Quoted in errors: bound what is echoed back, and keep it one line.
  auto shown = [&text] {
    std::string s(text.substr(0, 40));
    for (char& c : s) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    return "\"" + s + (text.size() > 40 ? "...\"" : "\"");
  };
  if (text.empty()) return InvalidArgument(f, "expected a non-negative integer, got an empty value");
  if (text[0] == '-') return InvalidArgument(f, "must not be negative (got " + shown() + ")");
  // Digits only, optionally grouped in thousands with one kind of separator ("9,210,691,584",
  // "9_210_691_584"), the way the ledger prints byte counts. Any other separator placement
  // ("1,2", "12,34") is refused: dropping the separator would silently read another number.
  char sep = 0;
  size_t group = 0;  // digits since the last separator
  bool grouped = false;
  Checked v(0);
  for (char c : text) {
    if (c == '_' || c == ',') {
      bool first_group_ok = !grouped && group >= 1 && group <= 3;
      bool later_group_ok = grouped && group == 3;
      if ((sep != 0 && c != sep) || !(first_group_ok || later_group_ok)) {
        return InvalidArgument(f, "expected digits, optionally grouped in threes (9,210,691,584), got " + shown());
      }
      sep = c;
      grouped = true;
      group = 0;
      continue;
    }
    if (c < '0' || c > '9') {
      return InvalidArgument(f, "expected a non-negative integer, got " + shown());
    }
    ++group;
    v = v * 10 + Checked(static_cast<uint64_t>(c - '0'));
  }
  if (grouped && group != 3) {
    return InvalidArgument(f, "expected digits, optionally grouped in threes (9,210,691,584), got " + shown());
  }
  if (v.overflowed()) return OutOfRange(f, shown() + " does not fit in 64 bits");
  return v.value();
}

Result<uint64_t> ParseByteSize(std::string_view text, std::string_view field) {
  std::string f(field);
  static constexpr std::pair<std::string_view, uint64_t> kUnits[] = {
      {"KiB", 1ULL << 10}, {"MiB", 1ULL << 20},   {"GiB", 1ULL << 30},      {"TiB", 1ULL << 40}, {"kB", 1000ULL},
      {"MB", 1000000ULL},  {"GB", 1000000000ULL}, {"TB", 1000000000000ULL}, {"B", 1ULL}};
  uint64_t multiplier = 1;
  for (const auto& [unit, m] : kUnits) {
    if (text.size() > unit.size() && text.ends_with(unit)) {
      multiplier = m;
      text.remove_suffix(unit.size());
      break;
    }
  }
  Result<uint64_t> base = ParseUnsigned(text, field);
  if (!base.ok()) {
    if (base.status().code() == StatusCode::kOutOfRange) return base.status();
    return InvalidArgument(
        f, "expected a byte size like 4096, 64MiB or 2GB, got \"" + std::string(text.substr(0, 40)) + "\"");
  }
  Checked v = Checked(*base) * multiplier;
  if (v.overflowed()) return OutOfRange(f, "byte size does not fit in 64 bits");
  return v.value();
}

Result<uint64_t> ParseTokenCount(std::string_view text, std::string_view field) {
  std::string f(field);
  if (text.empty()) return InvalidArgument(f, "expected a token count like 8192, 128k or 1m, got an empty value");
  uint64_t multiplier = 1;
  char last = static_cast<char>(std::tolower(static_cast<unsigned char>(text.back())));
  if (last == 'k' || last == 'm' || last == 'g') {
    // Model cards use binary multiples for context lengths: 128K = 131072, 1M = 1048576.
    multiplier = last == 'k' ? (1ULL << 10) : last == 'm' ? (1ULL << 20) : (1ULL << 30);
    text.remove_suffix(1);
    if (text.empty()) return InvalidArgument(f, "a suffix needs a number before it");
  }
  Result<uint64_t> base = ParseUnsigned(text, field);
  if (!base.ok()) {
    if (base.status().code() == StatusCode::kOutOfRange) return base.status();
    return InvalidArgument(f, "expected a token count like 8192, 128k or 1m, got \"" + std::string(text.substr(0, 40)) +
                                  (multiplier == 1 ? "" : "<suffix>") + "\"");
  }
  Checked v = Checked(*base) * multiplier;
  if (v.overflowed()) return OutOfRange(f, "token count does not fit in 64 bits");
  return v.value();
}

}  // namespace tessera

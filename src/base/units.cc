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
  if (text.empty()) return InvalidArgument(f, "expected a non-negative integer, got an empty value");
  if (text[0] == '-') return InvalidArgument(f, "must not be negative (got \"" + std::string(text) + "\")");
  Checked v(0);
  for (char c : text) {
    if (c == '_' || c == ',') continue;
    if (!std::isdigit(static_cast<unsigned char>(c))) {
      return InvalidArgument(f, "expected a non-negative integer, got \"" + std::string(text) + "\"");
    }
    v = v * 10 + Checked(static_cast<uint64_t>(c - '0'));
  }
  if (v.overflowed()) return OutOfRange(f, "\"" + std::string(text) + "\" does not fit in 64 bits");
  return v.value();
}

Result<uint64_t> ParseByteSize(std::string_view text, std::string_view field) {
  std::string f(field);
  static constexpr std::pair<std::string_view, uint64_t> kUnits[] = {
      {"KiB", 1ULL << 10}, {"MiB", 1ULL << 20}, {"GiB", 1ULL << 30}, {"TiB", 1ULL << 40}, {"kB", 1000ULL},
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
    return InvalidArgument(f, "expected a byte size like 4096, 64MiB or 2GB, got \"" + std::string(text) + "\"");
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
    return InvalidArgument(f, "expected a token count like 8192, 128k or 1m, got \"" + std::string(text) +
                                  (multiplier == 1 ? "" : "<suffix>") + "\"");
  }
  Checked v = Checked(*base) * multiplier;
  if (v.overflowed()) return OutOfRange(f, "token count does not fit in 64 bits");
  return v.value();
}

}  // namespace tessera

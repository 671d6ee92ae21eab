#include "config_json.h"

#include <cmath>

#include "tessera/file_io.h"

namespace tessera::config_json {
namespace {

// The byte offset where the nesting of [ and { (outside strings) first goes past `limit`, or
// npos. Malformed text is left for the parser to reject.
size_t DepthExceededAt(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return i;
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
    }
  }
  return std::string_view::npos;
}

Status NotACount(std::string_view name, const json& v, bool allow_zero) {
  return InvalidArgument(std::string(name), "must be a " + std::string(allow_zero ? "non-negative" : "positive") +
                                                " integer (got " + Describe(v) + ")");
}

}  // namespace

Result<json> Parse(std::string_view text, std::string_view source) {
  if (text.size() > kMaxInputFileBytes) {
    return OutOfRange("config", std::string(source) + " is " + std::to_string(text.size()) + " B, more than the " +
                                    std::to_string(kMaxInputFileBytes) + " B a config.json may hold");
  }
  if (size_t at = DepthExceededAt(text, kMaxDepth); at != std::string_view::npos) {
    return InvalidArgument("config", std::string(source) + " nests deeper than " + std::to_string(kMaxDepth) +
                                         " levels (byte " + std::to_string(at) + ")");
  }
  json cfg;
  try {
    cfg = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    return InvalidArgument("config", std::string(source) + " is not valid JSON (byte " + std::to_string(e.byte) + ")");
  } catch (const json::exception& e) {
    // A number beyond double's range (out_of_range 406) and the like.
    return InvalidArgument("config",
                           std::string(source) + " is not usable JSON (nlohmann error " + std::to_string(e.id) + ")");
  }
  if (!cfg.is_object()) return InvalidArgument("config", std::string(source) + " must hold a JSON object");
  return cfg;
}

std::string Describe(const json& v) {
  if (v.is_array()) return "a list of " + std::to_string(v.size()) + " entries";
  if (v.is_object()) return "an object";
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

bool Has(const json& cfg, std::string_view field) {
  auto it = cfg.find(field);
  return it != cfg.end() && !it->is_null();
}

Result<uint32_t> ReadCount(const json& cfg, std::string_view field, CountRule rule, std::string_view name) {
  if (name.empty()) name = field;
  auto it = cfg.find(field);
  if (it == cfg.end() || it->is_null()) {
    if (rule.required) return InvalidArgument(std::string(name), "missing from config.json");
    return rule.fallback;
  }
  const json& v = *it;
  int64_t n = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > UINT32_MAX) return OutOfRange(std::string(name), "value " + Describe(v) + " is too large");
    n = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    n = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::floor(d) != d || d < 0 || d > UINT32_MAX) return NotACount(name, v, rule.allow_zero);
    n = static_cast<int64_t>(d);
  } else {
    return NotACount(name, v, rule.allow_zero);
  }
  if (n < 0 || (!rule.allow_zero && n == 0)) return NotACount(name, v, rule.allow_zero);
  if (n > UINT32_MAX) return OutOfRange(std::string(name), "value " + Describe(v) + " is too large");
  return static_cast<uint32_t>(n);
}

Result<bool> ReadBool(const json& cfg, std::string_view field, bool fallback) {
  auto it = cfg.find(field);
  if (it == cfg.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    return InvalidArgument(std::string(field), "must be true or false (got " + Describe(*it) + ")");
  return it->get<bool>();
}

}  // namespace tessera::config_json

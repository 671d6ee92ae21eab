// Reading config.json values: bounded parsing and checked integer fields. Private to geometry.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "tessera/status.h"

namespace tessera::config_json {

using nlohmann::json;

// Bounds on the text itself, checked before it is parsed: a config.json is a few KiB with
// objects nested a handful of levels (quantization_config). Deeper nesting is refused up front
// because nlohmann's dump and copy recurse once per level.
constexpr int kMaxDepth = 64;

// The parsed object. Errors on "config": too large, nested too deep, not JSON, not an object.
Result<json> Parse(std::string_view text, std::string_view source);

// A value quoted in an error: scalars as JSON (cut to 40 characters), containers by kind only,
// so that a message never walks (or recurses into) a large or deep value.
std::string Describe(const json& v);

// Present and not null.
bool Has(const json& cfg, std::string_view field);

// An optional integer field that must fit in 32 bits. Absent or null -> `fallback` (or an error
// when `required`). Present but not an integer (string, fraction, bool, negative, > 2^32, or 0
// when !allow_zero) -> an error naming `name` (the field, or "object.field" for nested ones).
struct CountRule {
  uint32_t fallback = 0;
  bool required = false;
  bool allow_zero = false;
};
Result<uint32_t> ReadCount(const json& cfg, std::string_view field, CountRule rule, std::string_view name = {});

// An optional boolean field: absent or null -> `fallback`; not a bool -> an error naming it.
Result<bool> ReadBool(const json& cfg, std::string_view field, bool fallback);

}  // namespace tessera::config_json

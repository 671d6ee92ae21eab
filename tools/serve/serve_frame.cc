// The API's bodies: the framed body (engine KV) and strict JSON with named fields.
#include "tessera_tools/serve.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve_internal.h"

namespace tessera {

namespace serve_detail {

Result<Frame> ParseFrame(std::string_view body) {
  if (body.size() < 8) return InvalidArgument("body", "a framed body starts with 8 bytes: \"TKV1\" and a u32 length");
  if (!IsFramed(body)) return InvalidArgument("magic", "a framed body starts with \"TKV1\"");
  uint32_t h = 0;
  for (int i = 3; i >= 0; --i) h = (h << 8) | static_cast<uint8_t>(body[4 + static_cast<size_t>(i)]);
  if (h == 0 || h > kMaxFrameHeader) {
    return OutOfRange("header_length",
                      "must be 1.." + std::to_string(kMaxFrameHeader) + " (got " + std::to_string(h) + ")");
  }
  if (h > body.size() - 8) {
    return InvalidArgument("header_length", std::to_string(h) + " bytes, past the end of the body (" +
                                                std::to_string(body.size() - 8) + " bytes follow)");
  }
  return Frame{body.substr(8, h), body.substr(8 + h)};
}

Result<nlohmann::json> ParseJson(std::string_view text, const char* field) {
  if (text.starts_with("\xEF\xBB\xBF")) return InvalidArgument(field, "malformed JSON: a byte order mark");
  if (text.find('\0') != std::string_view::npos) return InvalidArgument(field, "malformed JSON: a NUL byte");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return InvalidArgument(field, "malformed JSON");
  return j;
}

nlohmann::json Error(const Status& st) { return {{"error", st.ToString()}, {"field", st.field()}}; }

int HttpStatusOf(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return 400;
    case StatusCode::kOutOfBlocks:
      return 503;
    case StatusCode::kFailedPrecondition:
      return 409;
    default:
      return 500;
  }
}

Result<uint64_t> UintField(const nlohmann::json& j, const char* name, uint64_t max, std::optional<uint64_t> def) {
  auto it = j.find(name);
  if (it == j.end()) {
    if (def) return *def;
    return InvalidArgument(name, "missing");
  }
  if (!it->is_number_unsigned()) return InvalidArgument(name, "must be a non-negative integer");
  const uint64_t v = it->get<uint64_t>();
  if (v > max) return OutOfRange(name, "at most " + std::to_string(max));
  return v;
}

Result<std::vector<uint64_t>> U64Array(const nlohmann::json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return InvalidArgument(name, "missing");
  if (!it->is_array()) return InvalidArgument(name, "must be an array of unsigned 64-bit integers");
  std::vector<uint64_t> out;
  out.reserve(it->size());
  for (const auto& e : *it) {
    if (!e.is_number_unsigned()) return InvalidArgument(name, "must be an array of unsigned 64-bit integers");
    out.push_back(e.get<uint64_t>());
  }
  return out;
}

Result<std::vector<uint32_t>> U32Array(const nlohmann::json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return InvalidArgument(name, "missing");
  if (!it->is_array()) return InvalidArgument(name, "must be an array of unsigned 32-bit integers");
  std::vector<uint32_t> out;
  out.reserve(it->size());
  for (const auto& e : *it) {
    if (!e.is_number_unsigned() || e.get<uint64_t>() > UINT32_MAX) {
      return InvalidArgument(name, "must be an array of unsigned 32-bit integers");
    }
    out.push_back(static_cast<uint32_t>(e.get<uint64_t>()));
  }
  return out;
}

Status OnlyKeys(const nlohmann::json& j, std::initializer_list<std::string_view> keys) {
  if (!j.is_object()) return InvalidArgument("body", "must be a JSON object");
  for (const auto& [k, v] : j.items()) {
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) {
      // Named by at most 64 bytes of it, control bytes shown as '?' (the name is the client's,
      // whatever its length and bytes): the error line and its field stay short.
      std::string shown;
      for (char ch : std::string_view(k).substr(0, 64)) {
        const auto u = static_cast<unsigned char>(ch);
        shown += (u < 0x20 || u == 0x7f || u == '"' || u == '\\') ? '?' : ch;
      }
      if (k.size() > 64) shown += "...";
      return InvalidArgument(shown, "unknown field");
    }
  }
  return Status::Ok();
}

}  // namespace serve_detail

}  // namespace tessera

// `tessera serve` configuration: the YAML keys, their environment overrides, Redis addresses.
#include "tessera_tools/serve.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tessera/checked.h"
#include "tessera/file_io.h"
#include "tessera/geometry.h"
#include "tessera/units.h"

namespace tessera {

namespace {

// A scalar value from YAML or the environment, with the key it came from.
struct Setting {
  std::string key;
  std::string text;
  std::vector<std::string> list;  // a YAML sequence of scalars (redis_cluster)
  bool is_list = false;
  std::string origin;  // the environment variable it came from, if any
};

Result<uint64_t> U64(const Setting& s, uint64_t max) {
  TESSERA_ASSIGN_OR_RETURN(uint64_t v, ParseUnsigned(s.text, s.key));
  if (v > max) return OutOfRange(s.key, "at most " + std::to_string(max));
  return v;
}

Result<bool> Bool(const Setting& s) {
  if (s.text == "true" || s.text == "1" || s.text == "yes") return true;
  if (s.text == "false" || s.text == "0" || s.text == "no") return false;
  return InvalidArgument(s.key, "must be true or false (got \"" + s.text + "\")");
}

std::vector<std::string> SplitCommas(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    if (end > start) out.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// "host:port" with an explicit host (an IPv4 address, a name, or [IPv6]) and a port 0..65535
// (`any_port`: or "*", ZeroMQ's any free port). A bare port ("0", "8080") is refused: civetweb
// would bind every interface, which must be asked for by name ("0.0.0.0:8080").
Status CheckHostPort(std::string_view text, const std::string& key, bool any_port = false) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return InvalidArgument(key,
                           "must be host:port with an explicit host (e.g. 127.0.0.1:8080; 0.0.0.0:8080 for "
                           "every interface)");
  }
  const std::string_view port = text.substr(colon + 1);
  if (any_port && port == "*") return Status::Ok();
  uint64_t v = 0;
  if (port.empty() || port.size() > 5) return OutOfRange(key, "the port must be 0..65535");
  for (char ch : port) {
    if (ch < '0' || ch > '9') return InvalidArgument(key, "the port must be a number 0..65535");
    v = v * 10 + static_cast<uint64_t>(ch - '0');
  }
  if (v > 65535) return OutOfRange(key, "the port must be 0..65535 (got " + std::string(port) + ")");
  return Status::Ok();
}

// Applies one setting to the config. Unknown keys are errors naming them.
// Long (~115 lines) on purpose: one branch per key of docs/SERVE.md's table, in its order, each
// with its own bound and message; the keys differ in type and check, so a table of parsers
// would only move each branch into a lambda.
Status Apply(const Setting& s, ServeConfig* c) {
  const std::string& k = s.key;
  if (s.is_list && k != "tiers.redis_cluster") return InvalidArgument(k, "must be a scalar, not a list");
  if (k == "model") {
    c->model = s.text;
  } else if (k == "kv_format") {
    c->kv_format = s.text;
  } else if (k == "block_tokens") {
    TESSERA_ASSIGN_OR_RETURN(uint64_t v, U64(s, 1u << 20));
    c->block_tokens = v;
  } else if (k == "capacity_blocks") {
    TESSERA_ASSIGN_OR_RETURN(uint64_t v, U64(s, UINT32_MAX));
    c->capacity_blocks = static_cast<uint32_t>(v);
  } else if (k == "max_requests") {
    TESSERA_ASSIGN_OR_RETURN(uint64_t v, U64(s, 1u << 20));
    c->max_requests = static_cast<uint32_t>(v);
  } else if (k == "pool") {
    if (s.text != "host" && s.text != "unbacked") {
      return InvalidArgument(k, "must be host or unbacked (got \"" + s.text + "\")");
    }
    c->pool_unbacked = s.text == "unbacked";
  } else if (k == "kv_source") {
    if (s.text != "synthetic" && s.text != "engine") {
      return InvalidArgument(k, "must be synthetic or engine (got \"" + s.text + "\")");
    }
    c->kv_engine = s.text == "engine";
  } else if (k == "window_strategy") {
    Result<SwaStrategy> w = ParseSwaStrategy(s.text);
    if (!w.ok()) return InvalidArgument(k, "must be recompute, snapshot or retain (got \"" + s.text + "\")");
    c->window_strategy = *w;
  } else if (k == "http.token_file") {
    c->http_token_file = s.text;
  } else if (k == "http.listen") {
    TESSERA_RETURN_IF_ERROR(CheckHostPort(s.text, k));
    c->http_listen = s.text;
  } else if (k == "http.max_body_bytes") {
    TESSERA_ASSIGN_OR_RETURN(c->http_max_body_bytes, ParseByteSize(s.text, k));
    if (c->http_max_body_bytes == 0 || c->http_max_body_bytes > (uint64_t{64} << 20)) {
      return OutOfRange(k, "must be 1 byte .. 64 MiB");
    }
  } else if (k == "http.threads") {
    TESSERA_ASSIGN_OR_RETURN(uint64_t v, U64(s, 256));
    if (v == 0) return OutOfRange(k, "must be positive");
    c->http_threads = static_cast<uint32_t>(v);
  } else if (k == "http.header_timeout_ms") {
    TESSERA_ASSIGN_OR_RETURN(uint64_t v, U64(s, 600000));
    if (v < 10) return OutOfRange(k, "must be 10 .. 600000");
    c->http_header_timeout_ms = static_cast<uint32_t>(v);
  } else if (k == "http.body_timeout_ms") {
    TESSERA_ASSIGN_OR_RETURN(uint64_t v, U64(s, 600000));
    if (v < 10) return OutOfRange(k, "must be 10 .. 600000");
    c->http_body_timeout_ms = static_cast<uint32_t>(v);
  } else if (k == "http.max_connections_per_client") {
    TESSERA_ASSIGN_OR_RETURN(uint64_t v, U64(s, 65536));
    if (v == 0) return OutOfRange(k, "must be positive");
    c->http_max_connections_per_client = static_cast<uint32_t>(v);
  } else if (k == "events.enabled") {
    TESSERA_ASSIGN_OR_RETURN(c->events_enabled, Bool(s));
  } else if (k == "events.endpoint") {
    if (s.text.starts_with("tcp://")) TESSERA_RETURN_IF_ERROR(CheckHostPort(s.text.substr(6), k, /*any_port=*/true));
    c->events_endpoint = s.text;
  } else if (k == "events.topic") {
    if (s.text.size() > 256) return OutOfRange(k, "at most 256 bytes");
    c->events_topic = s.text;
  } else if (k == "events.data_parallel_rank") {
    TESSERA_ASSIGN_OR_RETURN(uint64_t v, U64(s, 65535));
    c->events_data_parallel_rank = static_cast<uint32_t>(v);
  } else if (k == "events.hwm") {
    TESSERA_ASSIGN_OR_RETURN(uint64_t v, U64(s, 100000000));
    c->events_hwm = static_cast<uint32_t>(v);
  } else if (k == "events.buffer") {
    TESSERA_ASSIGN_OR_RETURN(uint64_t v, U64(s, 100000000));
    if (v == 0) return OutOfRange(k, "must be positive");
    c->events_buffer = static_cast<uint32_t>(v);
  } else if (k == "events.interval_ms") {
    TESSERA_ASSIGN_OR_RETURN(uint64_t v, U64(s, 1000));
    if (v == 0) return OutOfRange(k, "must be 1 .. 1000");
    c->events_interval_ms = static_cast<uint32_t>(v);
  } else if (k == "tiers.host_bytes") {
    TESSERA_ASSIGN_OR_RETURN(c->host_tier_bytes, ParseByteSize(s.text, k));
  } else if (k == "tiers.disk_dir") {
    c->disk_dir = s.text;
  } else if (k == "tiers.disk_bytes") {
    TESSERA_ASSIGN_OR_RETURN(c->disk_bytes, ParseByteSize(s.text, k));
  } else if (k == "tiers.write") {
    Result<WritePolicy> p = ParseWritePolicy(s.text);
    if (!p.ok()) return InvalidArgument(k, "must be write-through or write-back (got \"" + s.text + "\")");
    c->tier_write = *p;
  } else if (k == "tiers.redis") {
    c->redis = s.text;
  } else if (k == "tiers.redis_cluster") {
    c->redis_cluster = s.is_list ? s.list : SplitCommas(s.text);
  } else if (k == "tiers.redis_secret_file") {
    c->redis_secret_file = s.text;
  } else if (k == "tiers.redis_namespace") {
    // It replaces "tessera" at the head of RedisNamespace's "tessera:<model>:<format>:<domain>":
    // without ':' (the separator) and '{' '}' (Redis Cluster's hash tags) the result stays
    // injective and one cluster slot per key.
    const bool plain = std::all_of(s.text.begin(), s.text.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) != 0 || ch == '.' || ch == '_' || ch == '-';
    });
    if (s.text.empty() || s.text.size() > 64 || !plain) {
      return InvalidArgument(k, "must be 1..64 bytes of A-Z a-z 0-9 . _ - (got \"" + s.text.substr(0, 64) + "\")");
    }
    c->redis_namespace = s.text;
  } else if (k == "tiers.redis_timeout_ms") {
    TESSERA_ASSIGN_OR_RETURN(uint64_t v, U64(s, 60000));
    if (v == 0) return OutOfRange(k, "must be positive");
    c->redis_timeout_ms = static_cast<uint32_t>(v);
  } else {
    return InvalidArgument(k, "unknown key");
  }
  return Status::Ok();
}

// Walks a YAML mapping into dotted keys.
Status Collect(const YAML::Node& node, const std::string& prefix, std::vector<Setting>* out) {
  if (!node.IsMap()) return InvalidArgument(prefix.empty() ? "config" : prefix, "must be a mapping");
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) return InvalidArgument(prefix.empty() ? "config" : prefix, "keys must be scalars");
    const std::string key = prefix.empty() ? kv.first.Scalar() : prefix + "." + kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (v.IsMap()) {
      if (prefix.empty() && (key == "http" || key == "events" || key == "tiers")) {
        TESSERA_RETURN_IF_ERROR(Collect(v, key, out));
        continue;
      }
      return InvalidArgument(key, "unknown key (or not a section)");
    }
    Setting s;
    s.key = key;
    if (v.IsSequence()) {
      s.is_list = true;
      for (const auto& e : v) {
        if (!e.IsScalar()) return InvalidArgument(key, "list items must be scalars");
        s.list.push_back(e.Scalar());
      }
    } else if (v.IsScalar()) {
      s.text = v.Scalar();
    } else if (!v.IsNull()) {
      return InvalidArgument(key, "unsupported value");
    }
    out->push_back(std::move(s));
  }
  return Status::Ok();
}

constexpr std::string_view kEnvPrefix = "TESSERA_SERVE_";

// TESSERA_SERVE_HTTP_LISTEN -> http.listen (the sections' names contain no '_').
std::string EnvKey(std::string_view name) {
  std::string rest(name.substr(kEnvPrefix.size()));
  for (char& ch : rest) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (std::string_view section : {"http_", "events_", "tiers_"}) {
    if (rest.starts_with(section)) {
      rest[section.size() - 1] = '.';
      break;
    }
  }
  return rest;
}

}  // namespace

Result<ServeConfig> ParseServeConfig(std::string_view yaml, const std::map<std::string, std::string>& env) {
  std::vector<Setting> settings;
  YAML::Node root;
  try {
    // Every document is parsed: a second one (after "---") is refused, never dropped unread
    // (it could hold http.token_file; issue 27.6).
    std::vector<YAML::Node> docs = YAML::LoadAll(std::string(yaml));
    if (docs.size() > 1) {
      const int line = docs[1].Mark().line;
      return InvalidArgument("config", "a second YAML document" +
                                           (line >= 0 ? " at line " + std::to_string(line + 1) : std::string()) +
                                           ": the configuration is one document (no \"---\" after the first)");
    }
    if (!docs.empty()) root = docs[0];
  } catch (const YAML::Exception& e) {
    return InvalidArgument("config", "malformed YAML at line " + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  if (!root.IsNull()) TESSERA_RETURN_IF_ERROR(Collect(root, "", &settings));
  std::set<std::string> seen;
  for (const Setting& s : settings) {
    if (!seen.insert(s.key).second) return InvalidArgument(s.key, "given twice");
  }
  for (const auto& [name, value] : env) {
    if (!name.starts_with(kEnvPrefix)) continue;
    Setting s;
    s.key = EnvKey(name);
    s.text = value;
    s.origin = name;
    settings.push_back(std::move(s));
  }
  ServeConfig c;
  for (const Setting& s : settings) {
    Status st = Apply(s, &c);
    if (!st.ok()) {
      if (s.origin.empty()) return st;
      return Status(st.code(), st.field(), st.message() + " (from " + s.origin + ")");  // names the variable
    }
  }
  if (c.pool_unbacked &&
      (!c.disk_dir.empty() || !c.redis.empty() || !c.redis_cluster.empty() || c.host_tier_bytes > 0)) {
    return InvalidArgument("pool", "an unbacked pool holds no bytes for tiers to store");
  }
  if (c.pool_unbacked && c.kv_engine) {
    return InvalidArgument("kv_source", "engine KV needs pool: host (an unbacked pool holds no bytes)");
  }
  if (!c.redis.empty() && !c.redis_cluster.empty()) {
    return InvalidArgument("tiers.redis", "give tiers.redis or tiers.redis_cluster, not both");
  }
  if ((!c.redis.empty() || !c.redis_cluster.empty()) && c.redis_secret_file.empty()) {
    return InvalidArgument("tiers.redis_secret_file", "a Redis tier needs the fleet's secret file");
  }
  if (c.tier_write == WritePolicy::kWriteThrough && c.disk_dir.empty() && c.redis.empty() && c.redis_cluster.empty() &&
      c.host_tier_bytes > 0) {
    return InvalidArgument("tiers.host_bytes", "needs a persistent tier below it (disk_dir or redis)");
  }
  return c;
}

Result<ServeConfig> LoadServeConfig(const std::string& path, const std::map<std::string, std::string>& env) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, "config", 1u << 20));
  return ParseServeConfig(text, env);
}

Result<std::pair<std::string, int>> ParseRedisAddress(std::string_view url, std::string_view field) {
  std::string_view rest = url;
  if (rest.starts_with("redis://")) rest.remove_prefix(8);
  const size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == rest.size()) {
    return InvalidArgument(std::string(field), "expected redis://host:port (got \"" + std::string(url) + "\")");
  }
  std::string host(rest.substr(0, colon));
  for (char ch : host) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-' || ch == '_' || ch == '[' ||
          ch == ']' || ch == ':')) {
      return InvalidArgument(std::string(field), "host has a character outside [A-Za-z0-9.-_]");
    }
  }
  TESSERA_ASSIGN_OR_RETURN(uint64_t port, ParseUnsigned(rest.substr(colon + 1), field));
  if (port == 0 || port > 65535) return OutOfRange(std::string(field), "port must be 1..65535");
  return std::make_pair(host, static_cast<int>(port));
}

}  // namespace tessera

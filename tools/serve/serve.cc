#include "tessera/serve.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <zmq.hpp>

#include "tessera/checked.h"
#include "tessera/disk_tier.h"
#include "tessera/file_io.h"
#include "tessera/geometry.h"
#include "tessera/mutex.h"
#include "tessera/redis_cluster.h"
#include "tessera/redis_tier.h"
#include "tessera/tier_adapters.h"
#include "tessera/units.h"

namespace tessera {

// ---- Configuration ---------------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

uint64_t NanosSince(Clock::time_point t0) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

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

// ---- Histograms --------------------------------------------------------------------------------

void LatencyHistogram::Observe(uint64_t nanos) {
  const double s = static_cast<double>(nanos) * 1e-9;
  size_t i = 0;
  while (i < kBounds.size() && s > kBounds[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_nanos_.fetch_add(nanos, std::memory_order_relaxed);
}

void LatencyHistogram::Render(const std::string& name, const std::string& help, std::string* out) const {
  char line[256];
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= kBounds.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    if (i < kBounds.size()) {
      std::snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name.c_str(), kBounds[i], cumulative);
    } else {
      std::snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name.c_str(), cumulative);
    }
    *out += line;
  }
  std::snprintf(line, sizeof line, "%s_sum %.9f\n%s_count %" PRIu64 "\n", name.c_str(),
                static_cast<double>(sum_nanos_.load(std::memory_order_relaxed)) * 1e-9, name.c_str(),
                count_.load(std::memory_order_relaxed));
  *out += line;
}

// ---- Events on the wire -------------------------------------------------------------------------

namespace {

// A minimal msgpack writer for the types vLLM's events use (nil, uint, float64, str, bin,
// array), big-endian as the format requires. It writes through a raw pointer into storage the
// caller sized for the worst case (EncodeKvEventBatch bounds every item), so a token costs a
// compare and one 5-byte store rather than a push_back per byte.
class Packer {
 public:
  explicit Packer(char* p) : p_(p) {}
  char* end() const { return p_; }
  void Nil() { Byte(0xc0); }
  void Uint(uint64_t v) {  // at most 9 bytes; at most 5 when v fits in 32 bits
    if (v < 128) {
      Byte(static_cast<uint8_t>(v));
    } else if (v <= 0xff) {
      Byte(0xcc);
      Byte(static_cast<uint8_t>(v));
    } else if (v <= 0xffff) {
      Byte(0xcd);
      Be(v, 2);
    } else if (v <= 0xffffffffu) {
      Byte(0xce);
      Be(v, 4);
    } else {
      Byte(0xcf);
      Be(v, 8);
    }
  }
  void Double(double d) {  // 9 bytes
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    Byte(0xcb);
    Be(bits, 8);
  }
  void Str(std::string_view s) {  // s.size() + 1 bytes: only short strings (the tags) are sent
    Byte(static_cast<uint8_t>(0xa0 | s.size()));
    std::memcpy(p_, s.data(), s.size());
    p_ += s.size();
  }
  void Bin16(const Hash128& h) {  // 18 bytes
    Byte(0xc4);
    Byte(16);
    Be(h.hi, 8);
    Be(h.lo, 8);
  }
  void Array(size_t n) {  // at most 5 bytes
    if (n < 16) {
      Byte(static_cast<uint8_t>(0x90 | n));
    } else if (n <= 0xffff) {
      Byte(0xdc);
      Be(n, 2);
    } else {
      Byte(0xdd);
      Be(n, 4);
    }
  }

 private:
  void Byte(uint8_t b) { *p_++ = static_cast<char>(b); }
  // The low `bytes` (2, 4 or 8) bytes of v, big-endian.
  void Be(uint64_t v, int bytes) {
    switch (bytes) {
      case 2:
        Store(static_cast<uint16_t>(v));
        break;
      case 4:
        Store(static_cast<uint32_t>(v));
        break;
      default:
        Store(v);
    }
  }
  template <class U>
  void Store(U v) {
    if constexpr (std::endian::native == std::endian::little) v = Swap(v);
    std::memcpy(p_, &v, sizeof v);
    p_ += sizeof v;
  }
  static uint16_t Swap(uint16_t v) { return __builtin_bswap16(v); }
  static uint32_t Swap(uint32_t v) { return __builtin_bswap32(v); }
  static uint64_t Swap(uint64_t v) { return __builtin_bswap64(v); }
  char* p_;
};

// One event, from a KvEvent or a KvEventLog::View (the same field names).
template <class Event>
void PackEvent(Packer& p, const Event& e) {
  switch (e.kind) {
    case KvEventKind::kBlockStored: {
      const bool extra = e.domain != 0;
      p.Array(extra ? 9 : 8);
      p.Str(KvEventKindName(e.kind));
      p.Array(e.block_hashes.size());
      for (const Hash128& h : e.block_hashes) p.Bin16(h);
      if (e.parent_block_hash) {
        p.Bin16(*e.parent_block_hash);
      } else {
        p.Nil();
      }
      p.Array(e.token_ids.size());
      for (uint32_t t : e.token_ids) p.Uint(t);
      p.Uint(e.block_size);
      p.Nil();  // lora_id
      p.Str(KvMediumName(e.medium));
      p.Nil();  // lora_name
      if (extra) {
        p.Array(e.block_hashes.size());
        for (size_t i = 0; i < e.block_hashes.size(); ++i) {
          p.Array(2);
          p.Str("tenant_domain");
          p.Uint(e.domain);
        }
      }
      break;
    }
    case KvEventKind::kBlockRemoved:
      p.Array(3);
      p.Str(KvEventKindName(e.kind));
      p.Array(e.block_hashes.size());
      for (const Hash128& h : e.block_hashes) p.Bin16(h);
      p.Str(KvMediumName(e.medium));
      break;
    case KvEventKind::kAllBlocksCleared:
      p.Array(1);
      p.Str(KvEventKindName(e.kind));
      break;
  }
}

// The batch of events(i), i < n, appended to *out.
template <class Events>
void PackBatch(const Events& events, size_t n, double ts, uint32_t data_parallel_rank, std::string* out) {
  // The most bytes the batch can take: 20 for the batch's own headers (array, ts, array, rank);
  // per event 57 (BlockStored: array 1, tag 12, hash array 5, parent 18, token array 5, block
  // size 5, nil 1, medium 4, nil 1, extra-keys array 5), 38 per hash (18, and 20 for the tenant
  // domain: array 1, "tenant_domain" 14, the domain 5) and 5 per token id (a u32).
  size_t bound = 20;
  for (size_t i = 0; i < n; ++i) {
    const auto& e = events[i];
    bound += 57 + 38 * e.block_hashes.size() + 5 * e.token_ids.size();
  }
  const size_t start = out->size();
  out->resize(start + bound);
  Packer p(out->data() + start);
  p.Array(3);
  p.Double(ts);
  p.Array(n);
  for (size_t i = 0; i < n; ++i) PackEvent(p, events[i]);
  p.Uint(data_parallel_rank);
  const size_t used = static_cast<size_t>(p.end() - (out->data() + start));
  if (used > bound) std::abort();  // the bound above is wrong: memory past it was written
  out->resize(start + used);
}

}  // namespace

std::string EncodeKvEventBatch(std::span<const KvEvent> events, double ts, uint32_t data_parallel_rank) {
  std::string out;
  PackBatch(events, events.size(), ts, data_parallel_rank, &out);
  return out;
}

void EncodeKvEventBatch(const KvEventLog& events, double ts, uint32_t data_parallel_rank, std::string* out) {
  PackBatch(events, events.size(), ts, data_parallel_rank, out);
}

// Publishes KV events from a thread of its own. A call on the core pays for recording its events
// in the manager's log (kv_events.h) and, once per interval, for a hand-off: no encoding, no
// I/O, no system call, and no wait for the publisher.
//
// Every events.interval_ms (default 5) the thread sends what was handed off and asks for the
// next log (want_). The first call on the core after that swaps the manager's log into the
// hand-off slot (an uncontended mutex and an O(1) swap) under the core's mutex, so the thread
// never takes the core's mutex while calls arrive: a call's unlock never has a waiter to wake.
// (The first version took the core's mutex every interval; on this VM the wake-up that a step's
// unlock then owed the waiting thread cost the host-pool decode step 8 µs, ~8%.) When no call
// took the log during a whole interval (the server is idle, or one call is long), the thread
// drains the manager itself under the core's mutex. Idle for about 100 ms, it sleeps until a
// call wakes it; the race between "about to sleep" and a call that saw it awake is closed by a
// last drain after announcing the sleep (the core's mutex orders that drain after any such
// call). A subscriber sees an event within about two intervals of the call that made it, in one
// message per interval however many steps ran in it (vLLM sends one per step, whose model run
// takes milliseconds; the batch is the same shape, longer).
class EventPublisher {
 public:
  // `core_mu` guards `manager` (the core's mutex); the thread takes it only to drain an idle
  // core and at Stop.
  static Result<std::unique_ptr<EventPublisher>> Create(const ServeConfig& c, Mutex* core_mu, RequestManager* manager) {
    auto p = std::unique_ptr<EventPublisher>(new EventPublisher());
    p->topic_ = c.events_topic;
    p->rank_ = c.events_data_parallel_rank;
    p->core_mu_ = core_mu;
    p->manager_ = manager;
    p->interval_ = std::chrono::milliseconds(c.events_interval_ms);
    p->idle_polls_ = std::max<int>(1, 100 / static_cast<int>(c.events_interval_ms));
    try {
      p->socket_ = zmq::socket_t(p->context_, zmq::socket_type::pub);
      p->socket_.set(zmq::sockopt::sndhwm, static_cast<int>(c.events_hwm));
      p->socket_.set(zmq::sockopt::linger, 1000);
      p->socket_.bind(c.events_endpoint);
      p->endpoint_ = p->socket_.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      return InvalidArgument("events.endpoint", "cannot bind \"" + c.events_endpoint + "\": " + e.what());
    }
    EventPublisher* raw = p.get();
    p->thread_ = std::thread([raw] { raw->Loop(); });
    return p;
  }
  ~EventPublisher() { Stop(); }

  // At the end of every call on the core, the core's mutex held: two relaxed loads, unless the
  // thread asked for the log (once per interval) or sleeps.
  void AfterCall() {
    if (want_.load(std::memory_order_relaxed)) {
      std::lock_guard<std::mutex> lock(hand_mu_);
      if (handoff_.empty()) {
        manager_->TakeKvEventLog(&handoff_);
        want_.store(false, std::memory_order_relaxed);
      }
    }
    if (!sleeping_.load(std::memory_order_seq_cst)) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      poked_ = true;
    }
    cv_.notify_one();
  }
  // Drains and sends what is left, then stops the thread. Call without the core's mutex held.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }
  const std::string& endpoint() const { return endpoint_; }
  uint64_t published() const { return published_.load(std::memory_order_relaxed); }
  uint64_t batches() const { return batches_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  EventPublisher() = default;

  // What a call handed off; sends it. False when there was nothing.
  bool SendHandedOff() {
    events_.clear();
    {
      std::lock_guard<std::mutex> lock(hand_mu_);
      std::swap(events_, handoff_);  // the slot gets cleared storage back
    }
    return SendIfAny(events_);
  }
  // Everything not yet sent, oldest first (the hand-off slot, then the manager's log), under the
  // core's mutex; sends it. False when there was nothing.
  bool DrainCore() {
    events_.clear();
    {
      MutexLock core(*core_mu_);
      {
        std::lock_guard<std::mutex> lock(hand_mu_);
        std::swap(events_, handoff_);
      }
      manager_->TakeKvEventLog(&later_);
    }
    const bool a = SendIfAny(events_);
    const bool b = SendIfAny(later_);
    return a || b;
  }
  bool SendIfAny(const KvEventLog& log) {
    if (log.empty()) return false;
    Send(log, std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
    return true;
  }
  void Loop() {
    int idle = 0;
    while (true) {
      bool stopping = false;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (!stop_) cv_.wait_for(lock, interval_, [this] { return stop_; });
        stopping = stop_;
      }
      bool sent = SendHandedOff();
      // No call took the log during the interval (idle, or one long call), or stopping.
      if (want_.load(std::memory_order_relaxed) || stopping) sent = DrainCore() || sent;
      if (stopping) return;
      want_.store(true, std::memory_order_relaxed);
      idle = sent ? 0 : idle + 1;
      if (idle < idle_polls_) continue;
      // Announce the sleep, look once more, and only then wait to be woken.
      sleeping_.store(true, std::memory_order_seq_cst);
      if (!DrainCore()) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || poked_; });
        poked_ = false;
      }
      sleeping_.store(false, std::memory_order_seq_cst);
      idle = 0;
    }
  }
  void Send(const KvEventLog& log, double ts) {
    payload_.clear();
    EncodeKvEventBatch(log, ts, rank_, &payload_);
    char seq[8];
    for (int i = 0; i < 8; ++i) seq[i] = static_cast<char>(seq_ >> (8 * (7 - i)));
    ++seq_;
    try {
      socket_.send(zmq::buffer(topic_), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      socket_.send(zmq::buffer(seq, 8), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      socket_.send(zmq::buffer(payload_), zmq::send_flags::dontwait);
      published_.fetch_add(log.size(), std::memory_order_relaxed);
      batches_.fetch_add(1, std::memory_order_relaxed);
    } catch (const zmq::error_t&) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  zmq::context_t context_{1};
  zmq::socket_t socket_;  // used by the thread only, once started
  std::string topic_;
  std::string endpoint_;
  uint32_t rank_ = 0;
  Mutex* core_mu_ = nullptr;
  RequestManager* manager_ = nullptr;
  std::chrono::milliseconds interval_{5};
  int idle_polls_ = 20;  // idle intervals (about 100 ms) before it sleeps until woken
  // The hand-off slot (hand_mu_): a log a call swapped out of the manager, not yet sent.
  std::mutex hand_mu_;
  KvEventLog handoff_;
  std::atomic<bool> want_{true};  // the thread asks the next call for the manager's log
  // The thread's own: the logs it sends (their storage recycled), the encoding.
  KvEventLog events_, later_;
  std::string payload_;
  uint64_t seq_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool poked_ = false;
  std::atomic<bool> sleeping_{false};
  std::atomic<uint64_t> published_{0}, batches_{0}, dropped_{0};
  std::thread thread_;
};

// Times the store's fetches (the promote latency) and forwards everything else.
class TimedSource final : public BlockSource {
 public:
  TimedSource(BlockSource* inner, std::shared_ptr<LatencyHistogram> h) : inner_(inner), h_(std::move(h)) {}
  void OnSealed(const BlockPool& pool, BlockId b, const SealedIdentity& id) override { inner_->OnSealed(pool, b, id); }
  void OnEvicted(const BlockPool& pool, BlockId b, const SealedIdentity& id) override {
    inner_->OnEvicted(pool, b, id);
  }
  void OnCheckpoint(const BlockPool& pool, BlockId b, const SealedIdentity& id) override {
    inner_->OnCheckpoint(pool, b, id);
  }
  void BeginCheckpoint() override { inner_->BeginCheckpoint(); }
  Status FinishCheckpoint() override { return inner_->FinishCheckpoint(); }
  size_t Probe(std::span<const ChainLink> links) override { return inner_->Probe(links); }
  size_t Fetch(BlockPool& pool, std::span<const ChainLink> links, std::span<const BlockId> blocks,
               std::vector<std::vector<std::byte>>* states) override {
    const Clock::time_point t0 = Clock::now();
    const size_t n = inner_->Fetch(pool, links, blocks, states);
    h_->Observe(NanosSince(t0));
    return n;
  }

 private:
  BlockSource* inner_;
  std::shared_ptr<LatencyHistogram> h_;
};

// ---- The core --------------------------------------------------------------------------------

namespace {

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

void ExtendPrefixHash(std::vector<uint64_t>* h, std::span<const uint32_t> tokens) {
  h->reserve(h->size() + tokens.size());
  for (uint32_t t : tokens) {
    const uint64_t prev = h->empty() ? 0x5eedULL : h->back();
    h->push_back(Mix(prev ^ (uint64_t{t} * 0x100000001b3ULL)));
  }
}

void FillSynthetic(uint64_t prefix_hash, uint32_t group, uint32_t layer, const RecordView& view) {
  for (uint32_t p = 0; p < view.plane_count; ++p) {
    const uint64_t seed = Mix(prefix_hash ^ (uint64_t{group} << 56) ^ (uint64_t{layer} << 40) ^ (uint64_t{p} << 32));
    std::span<std::byte> out = view.planes[p];
    for (size_t off = 0; off < out.size(); off += 8) {
      const uint64_t v = Mix(seed + off);
      std::memcpy(out.data() + off, &v, std::min<size_t>(8, out.size() - off));
    }
  }
}

// Every byte the manager asks for, as a function of the token's prefix hash: page records and,
// for models with windows, window rows, compressor rows (small integers, exact in float) and the
// reference compressor's entries.
KvWriters SyntheticWriters(const std::vector<uint64_t>* h) {
  KvWriters w;
  w.page = [h](uint32_t group, uint32_t layer, uint64_t position, const RecordView& view) {
    FillSynthetic((*h)[position], group, layer, view);
  };
  w.window = [h](uint32_t layer, uint64_t position, std::span<std::byte> row) {
    RecordView v;
    v.planes[0] = row;
    FillSynthetic((*h)[position], 0xff, layer, v);
  };
  w.state = [h](uint32_t layer, bool indexer, uint64_t position, std::span<float> row) {
    const uint64_t seed = Mix((*h)[position] ^ (uint64_t{layer} << 20) ^ (indexer ? 1ULL << 40 : 0));
    for (size_t c = 0; c < row.size(); ++c) row[c] = static_cast<float>(((seed + c * 0x9e3779b1ULL) >> 24) & 0xff);
  };
  w.compress = ReferenceCompress;
  return w;
}

// The engine's records: token `position` of the request at `base + (position - first) x
// record_bytes`, (group, layer) at `offsets[group][layer]` in it, planes back to back.
KvWriters EngineWriters(const std::vector<std::vector<int64_t>>* offsets, uint64_t record_bytes, const std::byte* base,
                        uint64_t first) {
  return KvWriter([=](uint32_t group, uint32_t layer, uint64_t position, const RecordView& view) {
    const std::byte* src = base + (position - first) * record_bytes + static_cast<uint64_t>((*offsets)[group][layer]);
    for (uint32_t p = 0; p < view.plane_count; ++p) {
      std::memcpy(view.planes[p].data(), src, view.planes[p].size());
      src += view.planes[p].size();
    }
  });
}

// A framed body: "TKV1", u32 little-endian header length, the JSON header, the records.
constexpr std::string_view kFrameMagic = "TKV1";
constexpr uint32_t kMaxFrameHeader = 65536;

bool IsFramed(std::string_view body) { return body.starts_with(kFrameMagic); }

struct Frame {
  std::string_view header;  // JSON text
  std::string_view records;
};

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

// JSON text of the API: one value, UTF-8 without a byte order mark, no NUL byte anywhere
// (nlohmann's parser skips a BOM; a NUL is no JSON). Errors name `field`.
Result<nlohmann::json> ParseJson(std::string_view text, const char* field) {
  if (text.starts_with("\xEF\xBB\xBF")) return InvalidArgument(field, "malformed JSON: a byte order mark");
  if (text.find('\0') != std::string_view::npos) return InvalidArgument(field, "malformed JSON: a NUL byte");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return InvalidArgument(field, "malformed JSON");
  return j;
}

Result<nlohmann::json> ParseHeader(std::string_view text) { return ParseJson(text, "header"); }

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

// The JSON helpers: strict types, named fields.
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

}  // namespace

Result<std::vector<std::byte>> ReadSecretFile(const std::string& path, std::string_view field_name) {
  const std::string field(field_name);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return IoError(field, "cannot open " + path + ": " + std::strerror(errno));
  std::vector<std::byte> secret(4097);
  size_t n = 0;
  while (n < secret.size()) {
    const ssize_t r = ::read(fd, secret.data() + n, secret.size() - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += static_cast<size_t>(r);
  }
  ::close(fd);
  if (n > 4096) return OutOfRange(field, "larger than 4096 bytes");
  while (n > 0 && (secret[n - 1] == std::byte{'\n'} || secret[n - 1] == std::byte{'\r'})) --n;
  if (n < 16) return InvalidArgument(field, "the secret must be at least 16 bytes");
  secret.resize(n);
  return secret;
}

Result<std::unique_ptr<Tier>> OpenReachableRedisTier(const std::string& url, const std::vector<std::string>& cluster,
                                                     const std::vector<std::byte>& secret,
                                                     const std::string& key_namespace, std::string_view model,
                                                     std::string_view format, uint32_t timeout_ms) {
#if !TESSERA_HAVE_REDIS
  (void)url, (void)cluster, (void)secret, (void)key_namespace, (void)model, (void)format, (void)timeout_ms;
  return FailedPrecondition(url.empty() ? "redis-cluster" : "redis",
                            "this build has no Redis tier (TESSERA_WITH_REDIS=OFF)");
#else
  std::string ns = RedisNamespace(model, format, 0);
  if (key_namespace != "tessera") ns = key_namespace + ns.substr(std::string_view("tessera").size());
  if (!url.empty()) {
    TESSERA_ASSIGN_OR_RETURN(auto addr, ParseRedisAddress(url, "redis"));
    RedisTierOptions ro;
    ro.host = addr.first;
    ro.port = addr.second;
    ro.secret = secret;
    ro.timeout_ms = timeout_ms;
    ro.key_namespace = ns;
    {
      TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<RedisTier> probe, RedisTier::Open(ro));
      const Hash128 nothing{};
      (void)probe->GetBatch(std::span(&nothing, 1));
      if (!probe->stats().connected) return IoError("redis", "cannot reach " + url);
    }
    return MakeRedisTier(ro);
  }
  RedisClusterOptions ro;
  ro.seeds = cluster;
  ro.secret = secret;
  ro.timeout_ms = timeout_ms;
  ro.key_namespace = ns;
  {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<RedisClusterTier> probe, RedisClusterTier::Open(ro));
    if (probe->stats().slots_covered == 0) {
      std::string seeds;
      for (const std::string& seed : cluster) seeds += (seeds.empty() ? "" : ",") + seed;
      return IoError("redis-cluster", "no node of " + seeds + " answered");
    }
  }
  return MakeRedisClusterTier(ro);
#endif  // TESSERA_HAVE_REDIS
}

Result<std::unique_ptr<ServeCore>> ServeCore::Create(const ServeConfig& config, std::vector<std::string>* warnings) {
  std::unique_ptr<ServeCore> core(new ServeCore());
  core->config_ = config;
  TESSERA_ASSIGN_OR_RETURN(Geometry g, LoadPreset(config.model));
  if (config.kv_engine && g.is_hybrid && g.sliding_window > 0) {
    return InvalidArgument("kv_source", g.name +
                                            " has sliding windows: engine KV carries no window rows or compressor "
                                            "state yet (use kv_source: synthetic)");
  }
  if (!config.http_token_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(core->http_token_, ReadSecretFile(config.http_token_file, "http.token_file"));
    // Writable by group or others: anyone there could set the token (refused). Readable by them:
    // they could read it (a warning, as for the tier key: docs/adr/0031-serve-hardening.md).
    struct stat st {};
    if (::stat(config.http_token_file.c_str(), &st) == 0) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
      if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        return InvalidArgument("http.token_file", config.http_token_file + " has mode " + mode +
                                                      ": writable by group or others (chmod 600)");
      }
      if ((st.st_mode & (S_IRGRP | S_IROTH)) != 0 && warnings != nullptr) {
        warnings->push_back(config.http_token_file + " has mode " + mode +
                            ": the bearer token is readable by group or others (chmod 600)");
      }
    }
  }
  ManagerOptions mo;
  mo.window_strategy = config.window_strategy;
  mo.kv_format = config.kv_format;
  mo.block_tokens = config.block_tokens;
  mo.capacity_blocks = config.capacity_blocks;
  mo.max_requests = config.max_requests;
  mo.kv_events = config.events_enabled;
  mo.kv_events_capacity = config.events_buffer;
  if (config.pool_unbacked) {
    mo.region_kind = RegionKind::kUnbacked;
    mo.content_dedup = false;  // no bytes to compare
  }
  // The prefix keys: the fleet's secret with Redis (every host computes the same keys), the
  // disk directory's key otherwise, a random per-process key without a persistent tier.
  std::vector<std::byte> secret;
  const bool redis = !config.redis.empty() || !config.redis_cluster.empty();
  if (redis) {
    TESSERA_ASSIGN_OR_RETURN(secret, ReadSecretFile(config.redis_secret_file, "tiers.redis_secret_file"));
    mo.hash_key = secret;
  }
  if (!config.disk_dir.empty() && !redis) {
    TESSERA_ASSIGN_OR_RETURN(TierKey key, DiskTier::LoadOrCreateKey(config.disk_dir));
    mo.hash_key = std::move(key.secret);
    for (std::string& w : key.warnings) warnings->push_back(std::move(w));
  }
  TESSERA_ASSIGN_OR_RETURN(core->manager_, RequestManager::Create(g, mo));
  // The frame's token record: per-token groups in pool order, their layers in order.
  const std::vector<PoolGroup>& groups = core->manager_->pool().groups();
  core->record_offset_.resize(groups.size());
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    core->record_offset_[gi].assign(groups[gi].layers, -1);
    if (groups[gi].page.compress_ratio != 1) continue;
    // The writer and the reads copy the planes back to back: they must tile the record.
    uint64_t planes = 0;
    for (uint32_t p = 0; p < groups[gi].format.plane_count(); ++p) planes += groups[gi].format.plane_bytes(p);
    if (planes != groups[gi].format.record_bytes()) {
      return Internal("kv_format", groups[gi].format.name + ": planes do not tile the record");
    }
    for (uint32_t l = 0; l < groups[gi].layers; ++l) {
      core->record_offset_[gi][l] = static_cast<int64_t>(core->record_bytes_);
      core->record_bytes_ += groups[gi].format.record_bytes();
    }
  }
  if (config.kv_engine && core->record_bytes_ == 0) {
    return InvalidArgument("kv_source", g.name + " has no per-token records for an engine to push");
  }

  std::vector<std::unique_ptr<Tier>> tiers;
  if (config.host_tier_bytes > 0) tiers.push_back(MakeHostTier(config.host_tier_bytes));
  if (!config.disk_dir.empty()) {
    DiskTierOptions d;
    d.dir = config.disk_dir;
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Tier> t, MakeDiskTier(d, config.disk_bytes));
    tiers.push_back(std::move(t));
  }
  if (redis) {
    TESSERA_ASSIGN_OR_RETURN(
        std::unique_ptr<Tier> t,
        OpenReachableRedisTier(config.redis, config.redis_cluster, secret, config.redis_namespace, g.name,
                               core->manager_->pool().groups()[0].format.name, config.redis_timeout_ms));
    tiers.push_back(std::move(t));
  }
  core->promote_latency_ = std::make_shared<LatencyHistogram>();
  if (!tiers.empty()) {
    TieredStoreOptions so;
    so.write = config.tier_write;
    TESSERA_ASSIGN_OR_RETURN(core->store_, TieredStore::Create(core->manager_->pool(), so, std::move(tiers)));
    core->timed_ = std::make_unique<TimedSource>(core->store_.get(), core->promote_latency_);
    core->manager_->SetBlockSource(core->timed_.get());
  }
  if (config.events_enabled) {
    TESSERA_ASSIGN_OR_RETURN(core->publisher_, EventPublisher::Create(config, &core->mu_, core->manager_.get()));
  }
  return core;
}

ServeCore::~ServeCore() {
  if (manager_) manager_->SetBlockSource(nullptr);
}

std::string ServeCore::events_endpoint() const { return publisher_ ? publisher_->endpoint() : std::string(); }

void ServeCore::PublishLocked() {
  if (publisher_) publisher_->AfterCall();
}

KvWriters ServeCore::WritersFor(const std::vector<uint64_t>* h, const std::byte* records, uint64_t first) const {
  if (!manager_->pool().backed()) return KvWriters();
  if (!config_.kv_engine) return SyntheticWriters(h);
  if (records == nullptr) return KvWriters();
  return EngineWriters(&record_offset_, record_bytes_, records, first);
}

Result<Admission> ServeCore::Admit(std::span<const uint32_t> prompt, const RequestSpec& spec) {
  MutexLock lock(mu_);
  return AdmitLocked(prompt, spec, nullptr);
}

// `records`: engine KV, the records of every prompt token (nullptr: write nothing, the engine
// pushes the uncached tokens with a step). Synthetic KV: the uncached tokens are written here.
Result<Admission> ServeCore::AdmitLocked(std::span<const uint32_t> prompt, const RequestSpec& spec,
                                         const std::byte* records) {
  const Clock::time_point t0 = Clock::now();
  const bool synthetic = manager_->pool().backed() && !config_.kv_engine;
  std::vector<uint64_t> h;
  if (synthetic) ExtendPrefixHash(&h, prompt);
  Result<Admission> a = manager_->Admit(prompt, spec);
  if (a.ok()) {
    Status st = Status::Ok();
    // Windows, recompute: the rings are rebuilt from the tokens before the cached boundary.
    if (a->recompute_tokens > 0) {
      st = manager_->Recompute(a->id, prompt.subspan(a->recompute_from, a->recompute_tokens),
                               WritersFor(&h, nullptr, 0));
    }
    const uint64_t have = manager_->Tokens(a->id);
    if (st.ok() && (!config_.kv_engine || records != nullptr)) {
      st = manager_->Append(a->id, prompt.subspan(have), WritersFor(&h, records, 0));
      if (st.ok() && records != nullptr) {
        kv_bytes_written_.fetch_add((prompt.size() - have) * record_bytes_, std::memory_order_relaxed);
      }
    }
    if (!st.ok()) {
      manager_->Free(a->id).IgnoreError();  // the admission failed: st is the error to report
      PublishLocked();
      return st;
    }
    if (!synthetic) h.clear();  // no bytes to derive
    prefix_hash_[a->id.value] = std::move(h);
  }
  admit_latency_.Observe(NanosSince(t0));
  PublishLocked();
  return a;
}

namespace {

Status CheckStepShape(std::span<const RequestId> requests, std::span<const uint32_t> counts,
                      std::span<const uint32_t> tokens) {
  if (requests.size() != counts.size()) return InvalidArgument("counts", "one count per request");
  uint64_t total = 0;
  for (uint32_t c : counts) total += c;
  if (total != tokens.size()) {
    return InvalidArgument(
        "tokens", "counts add up to " + std::to_string(total) + ", " + std::to_string(tokens.size()) + " tokens given");
  }
  return Status::Ok();
}

}  // namespace

Status ServeCore::Step(std::span<const RequestId> requests, std::span<const uint32_t> counts,
                       std::span<const uint32_t> tokens, std::vector<StatusCode>* codes) {
  return StepAs(std::nullopt, requests, counts, tokens, codes);
}

Status ServeCore::StepAs(std::optional<uint32_t> tenant, std::span<const RequestId> requests,
                         std::span<const uint32_t> counts, std::span<const uint32_t> tokens,
                         std::vector<StatusCode>* codes) {
  TESSERA_RETURN_IF_ERROR(CheckStepShape(requests, counts, tokens));
  if (config_.kv_engine && !tokens.empty()) {
    return InvalidArgument("records", "kv_source: engine: a step carries its tokens' records (a framed body)");
  }
  MutexLock lock(mu_);
  StepLocked(requests, counts, tokens, nullptr, tenant, codes);
  return Status::Ok();
}

// `records`: engine KV, record_bytes_ per token of `tokens` (checked by the caller).
void ServeCore::StepLocked(std::span<const RequestId> requests, std::span<const uint32_t> counts,
                           std::span<const uint32_t> tokens, const std::byte* records, std::optional<uint32_t> tenant,
                           std::vector<StatusCode>* codes) {
  const Clock::time_point t0 = Clock::now();
  const bool synthetic = manager_->pool().backed() && !config_.kv_engine;
  codes->assign(requests.size(), StatusCode::kOk);
  size_t next = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::span<const uint32_t> mine = tokens.subspan(next, counts[i]);
    const std::byte* my_records = records == nullptr ? nullptr : records + next * record_bytes_;
    next += counts[i];
    // A stale id (its slot freed, maybe reused: another generation) or another tenant's request
    // is refused before anything of the slot is touched.
    const std::optional<uint32_t> owner = manager_->TenantOf(requests[i]);
    auto it = prefix_hash_.find(requests[i].value);
    if (!owner || (tenant && *owner != *tenant) || it == prefix_hash_.end()) {
      (*codes)[i] = StatusCode::kInvalidArgument;
      continue;
    }
    std::vector<uint64_t>& h = it->second;
    Status st = manager_->AllocateSlots(requests[i], mine.size());
    if (st.ok()) {
      if (synthetic) ExtendPrefixHash(&h, mine);
      const uint64_t first = manager_->Tokens(requests[i]);
      st = manager_->Append(requests[i], mine, WritersFor(&h, my_records, first));
    }
    if (synthetic) h.resize(manager_->Tokens(requests[i]));  // what was written (all, or none on a refusal)
    if (st.ok() && my_records != nullptr) {
      kv_bytes_written_.fetch_add(mine.size() * record_bytes_, std::memory_order_relaxed);
    }
    (*codes)[i] = st.code();
  }
  step_latency_.Observe(NanosSince(t0));
  PublishLocked();
}

Status ServeCore::Free(RequestId r) { return FreeAs(std::nullopt, r); }

Status ServeCore::FreeAs(std::optional<uint32_t> tenant, RequestId r) {
  MutexLock lock(mu_);
  const std::optional<uint32_t> owner = manager_->TenantOf(r);
  if (owner && tenant && *owner != *tenant) {  // the same answer as for an id never issued
    return InvalidArgument(
        "request", "no live request " + std::to_string(RequestHandle(r)) + " of tenant " + std::to_string(*tenant));
  }
  Status st = manager_->Free(r);
  if (st.ok()) prefix_hash_.erase(r.value);
  PublishLocked();
  return st;
}

Status ServeCore::Shutdown() {
  Status result = Status::Ok();
  {
    MutexLock lock(mu_);
    if (store_) {
      Result<uint64_t> n = manager_->Checkpoint();
      if (!n.ok()) result = n.status();
      Status f = store_->Flush();
      if (result.ok() && !f.ok()) result = f;
    }
  }
  if (publisher_) publisher_->Stop();  // drains the manager and sends what is left
  return result;
}

std::string ServeCore::MetricsText() const {
  std::vector<MetricFamily> f = manager_->CollectMetrics();
  if (store_) {
    for (MetricFamily& m : store_->CollectMetrics()) f.push_back(std::move(m));
  }
  f.push_back({"tessera_serve_kv_events_published_total",
               "KV-cache events published over ZeroMQ.",
               "counter",
               {{"", publisher_ ? publisher_->published() : 0}}});
  f.push_back({"tessera_serve_kv_event_batches_total",
               "KVEventBatch messages published.",
               "counter",
               {{"", publisher_ ? publisher_->batches() : 0}}});
  f.push_back({"tessera_serve_kv_event_batches_dropped_total",
               "KVEventBatch messages not published (ZeroMQ refused them).",
               "counter",
               {{"", publisher_ ? publisher_->dropped() : 0}}});
  f.push_back({"tessera_serve_http_errors_total",
               "API calls refused (bad input, no room, no such request).",
               "counter",
               {{"", http_errors_.load(std::memory_order_relaxed)}}});
  f.push_back({"tessera_serve_kv_bytes_written_total",
               "Engine KV record bytes written into the pool (kv_source: engine).",
               "counter",
               {{"", kv_bytes_written_.load(std::memory_order_relaxed)}}});
  f.push_back({"tessera_serve_kv_bytes_read_total",
               "KV record bytes served by block reads.",
               "counter",
               {{"", kv_bytes_read_.load(std::memory_order_relaxed)}}});
  std::string out = PrometheusText(f);
  admit_latency_.Render("tessera_serve_admit_seconds", "Admission latency (lookup, promotion, prefill write).", &out);
  step_latency_.Render("tessera_serve_step_seconds", "Step latency (all requests of one step call).", &out);
  promote_latency_->Render("tessera_serve_promote_seconds", "Tier fetch latency of one promotion.", &out);
  return out;
}

std::pair<int, std::string> ServeCore::Handle(std::string_view path, std::string_view body) {
  std::pair<int, std::string> r;
  if (path == "/v1/admit") {
    r = HandleAdmit(body);
  } else if (path == "/v1/step") {
    r = HandleStep(body);
  } else if (path == "/v1/free") {
    r = HandleFree(body);
  } else if (path == "/v1/reset") {
    r = HandleReset();
  } else {
    r = {404, Error(InvalidArgument("path", "no such endpoint")).dump()};
  }
  return r;
}

// `lhs` names the variable declared: it cannot be parenthesised.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define TESSERA_HTTP_ASSIGN(lhs, expr)                                       \
  auto lhs##_result = (expr);                                                \
  if (!lhs##_result.ok()) return {400, Error(lhs##_result.status()).dump()}; \
  auto lhs = std::move(*lhs##_result)
// NOLINTEND(bugprone-macro-parentheses)

namespace {

struct AdmitCall {
  std::vector<uint32_t> tokens;
  RequestSpec spec;
};

Result<AdmitCall> ParseAdmitCall(const nlohmann::json& j) {
  TESSERA_RETURN_IF_ERROR(OnlyKeys(j, {"tokens", "tenant", "cache_salt", "priority"}));
  AdmitCall c;
  TESSERA_ASSIGN_OR_RETURN(c.tokens, U32Array(j, "tokens"));
  if (c.tokens.empty()) return InvalidArgument("tokens", "empty prompt");
  TESSERA_ASSIGN_OR_RETURN(uint64_t tenant, UintField(j, "tenant", UINT32_MAX, 0));
  TESSERA_ASSIGN_OR_RETURN(uint64_t salt, UintField(j, "cache_salt", UINT64_MAX, 0));
  TESSERA_ASSIGN_OR_RETURN(uint64_t priority,
                           UintField(j, "priority", kMaxRetentionPriority, kDefaultRetentionPriority));
  c.spec.tenant = static_cast<uint32_t>(tenant);
  c.spec.cache_salt = salt;
  c.spec.priority = static_cast<uint8_t>(priority);
  return c;
}

struct StepCall {
  std::vector<RequestId> requests;
  std::vector<uint32_t> counts;
  std::vector<uint32_t> tokens;
  uint32_t tenant = 0;
};

// "tenant": the caller's tenant (default 0): a call acts only on the requests it admitted.
Result<uint32_t> TenantField(const nlohmann::json& j) {
  TESSERA_ASSIGN_OR_RETURN(uint64_t tenant, UintField(j, "tenant", UINT32_MAX, 0));
  return static_cast<uint32_t>(tenant);
}

Result<StepCall> ParseStepCall(const nlohmann::json& j) {
  TESSERA_RETURN_IF_ERROR(OnlyKeys(j, {"requests", "counts", "tokens", "tenant"}));
  StepCall c;
  TESSERA_ASSIGN_OR_RETURN(std::vector<uint64_t> ids, U64Array(j, "requests"));
  TESSERA_ASSIGN_OR_RETURN(c.counts, U32Array(j, "counts"));
  TESSERA_ASSIGN_OR_RETURN(c.tokens, U32Array(j, "tokens"));
  TESSERA_ASSIGN_OR_RETURN(c.tenant, TenantField(j));
  c.requests.reserve(ids.size());
  std::set<uint32_t> unique;  // table slots: one request per slot is live
  for (uint64_t id : ids) {
    const RequestId r = RequestOfHandle(id);
    if (!unique.insert(r.value).second) return InvalidArgument("requests", "a request given twice");
    c.requests.push_back(r);
  }
  TESSERA_RETURN_IF_ERROR(CheckStepShape(c.requests, c.counts, c.tokens));
  return c;
}

// The records of `tokens` tokens, `record_bytes` each: exactly that many bytes.
Status CheckRecords(std::string_view records, uint64_t tokens, uint64_t record_bytes) {
  const Checked want = Checked(tokens) * record_bytes;
  if (want.overflowed() || want.value() != records.size()) {
    return InvalidArgument("records", std::to_string(records.size()) + " bytes given, " + std::to_string(tokens) +
                                          " tokens x " + std::to_string(record_bytes) + " record bytes expected");
  }
  return Status::Ok();
}

std::pair<int, std::string> BadRequest(const Status& st) { return {400, Error(st).dump()}; }

}  // namespace

std::pair<int, std::string> ServeCore::AdmitReply(const Admission& a) {
  nlohmann::json out = {{"request", RequestHandle(a.id)},        {"cached_tokens", a.cached_tokens},
                        {"cached_blocks", a.cached_blocks},      {"tier_blocks", a.tier_blocks},
                        {"state_restored", a.state_restored},    {"recompute_from", a.recompute_from},
                        {"recompute_tokens", a.recompute_tokens}};
  MutexLock lock(mu_);
  nlohmann::json table = nlohmann::json::array();
  for (BlockId b : manager_->BlockTable(a.id)) table.push_back(b.value);
  out["block_table"] = std::move(table);
  return {200, out.dump()};
}

std::pair<int, std::string> ServeCore::HandleAdmit(std::string_view body) {
  if (IsFramed(body)) return HandleAdmitFramed(body);
  TESSERA_HTTP_ASSIGN(j, ParseJson(body, "body"));
  TESSERA_HTTP_ASSIGN(call, ParseAdmitCall(j));
  Result<Admission> a = Admit(call.tokens, call.spec);
  if (!a.ok()) return {HttpStatusOf(a.status().code()), Error(a.status()).dump()};
  return AdmitReply(*a);
}

std::pair<int, std::string> ServeCore::HandleAdmitFramed(std::string_view body) {
  if (!config_.kv_engine) return BadRequest(InvalidArgument("body", "framed KV records need kv_source: engine"));
  TESSERA_HTTP_ASSIGN(frame, ParseFrame(body));
  TESSERA_HTTP_ASSIGN(header, ParseHeader(frame.header));
  TESSERA_HTTP_ASSIGN(call, ParseAdmitCall(header));
  if (Status st = CheckRecords(frame.records, call.tokens.size(), record_bytes_); !st.ok()) return BadRequest(st);
  Result<Admission> a = [&] {
    MutexLock lock(mu_);
    return AdmitLocked(call.tokens, call.spec, reinterpret_cast<const std::byte*>(frame.records.data()));
  }();
  if (!a.ok()) return {HttpStatusOf(a.status().code()), Error(a.status()).dump()};
  return AdmitReply(*a);
}

std::pair<int, std::string> ServeCore::StepReply(std::span<const RequestId> requests, std::span<const StatusCode> codes,
                                                 uint32_t tenant) {
  nlohmann::json out = {{"codes", nlohmann::json::array()}, {"block_tables", nlohmann::json::array()}};
  MutexLock lock(mu_);
  for (size_t i = 0; i < requests.size(); ++i) {
    out["codes"].push_back(std::string(StatusCodeName(codes[i])));
    nlohmann::json table = nlohmann::json::array();
    if (manager_->TenantOf(requests[i]) == tenant) {  // another tenant's table is not shown
      for (BlockId b : manager_->BlockTable(requests[i])) table.push_back(b.value);
    }
    out["block_tables"].push_back(std::move(table));
  }
  return {200, out.dump()};
}

std::pair<int, std::string> ServeCore::HandleStep(std::string_view body) {
  if (IsFramed(body)) return HandleStepFramed(body);
  TESSERA_HTTP_ASSIGN(j, ParseJson(body, "body"));
  TESSERA_HTTP_ASSIGN(call, ParseStepCall(j));
  std::vector<StatusCode> codes;
  Status st = StepAs(call.tenant, call.requests, call.counts, call.tokens, &codes);
  if (!st.ok()) return BadRequest(st);
  return StepReply(call.requests, codes, call.tenant);
}

std::pair<int, std::string> ServeCore::HandleStepFramed(std::string_view body) {
  if (!config_.kv_engine) return BadRequest(InvalidArgument("body", "framed KV records need kv_source: engine"));
  TESSERA_HTTP_ASSIGN(frame, ParseFrame(body));
  TESSERA_HTTP_ASSIGN(header, ParseHeader(frame.header));
  TESSERA_HTTP_ASSIGN(call, ParseStepCall(header));
  if (Status st = CheckRecords(frame.records, call.tokens.size(), record_bytes_); !st.ok()) return BadRequest(st);
  std::vector<StatusCode> codes;
  {
    MutexLock lock(mu_);
    StepLocked(call.requests, call.counts, call.tokens, reinterpret_cast<const std::byte*>(frame.records.data()),
               call.tenant, &codes);
  }
  return StepReply(call.requests, codes, call.tenant);
}

std::pair<int, std::string> ServeCore::HandleGet(std::string_view path, bool* binary) {
  *binary = false;
  if (path == "/v1/layout") {
    nlohmann::json groups = nlohmann::json::array();
    const std::vector<PoolGroup>& pg = manager_->pool().groups();
    for (size_t g = 0; g < pg.size(); ++g) {
      nlohmann::json planes = nlohmann::json::array();
      for (uint32_t p = 0; p < pg[g].format.plane_count(); ++p) planes.push_back(pg[g].format.plane_bytes(p));
      groups.push_back({{"name", pg[g].name},
                        {"format", pg[g].format.name},
                        {"layers", pg[g].layers},
                        {"compress_ratio", pg[g].page.compress_ratio},
                        {"record_bytes", pg[g].format.record_bytes()},
                        {"plane_bytes", std::move(planes)},
                        {"in_frame", pg[g].page.compress_ratio == 1}});
    }
    const nlohmann::json out = {{"kv_source", config_.kv_engine ? "engine" : "synthetic"},
                                {"block_tokens", manager_->block_tokens()},
                                {"record_bytes", record_bytes_},
                                {"groups", std::move(groups)}};
    return {200, out.dump()};
  }
  // /v1/requests/{id}/blocks/{i}
  constexpr std::string_view kPrefix = "/v1/requests/";
  if (!path.starts_with(kPrefix)) return {404, Error(InvalidArgument("path", "no such endpoint")).dump()};
  std::string_view rest = path.substr(kPrefix.size());
  const size_t slash = rest.find("/blocks/");
  if (slash == std::string_view::npos) return {404, Error(InvalidArgument("path", "no such endpoint")).dump()};
  Result<uint64_t> id = ParseUnsigned(rest.substr(0, slash), "request");
  if (!id.ok()) return BadRequest(InvalidArgument("request", "must be a request id"));
  std::string_view block_text = rest.substr(slash + 8);
  uint64_t count = 1;   // ?count=N: N consecutive block slots in one reply
  uint32_t tenant = 0;  // ?tenant=T: the caller's tenant (a request of another is not read)
  if (const size_t q = block_text.find('?'); q != std::string_view::npos) {
    std::string_view query = block_text.substr(q + 1);
    block_text = block_text.substr(0, q);
    bool seen_count = false;
    bool seen_tenant = false;
    while (!query.empty()) {
      const size_t amp = query.find('&');
      const std::string_view item = query.substr(0, amp);
      query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
      if (item.starts_with("count=") && !seen_count) {
        seen_count = true;
        Result<uint64_t> c = ParseUnsigned(item.substr(6), "count");
        if (!c.ok() || *c == 0 || *c > (1u << 20)) return BadRequest(InvalidArgument("count", "must be 1..1048576"));
        count = *c;
      } else if (item.starts_with("tenant=") && !seen_tenant) {
        seen_tenant = true;
        Result<uint64_t> t = ParseUnsigned(item.substr(7), "tenant");
        if (!t.ok() || *t > UINT32_MAX) return BadRequest(InvalidArgument("tenant", "must be a u32"));
        tenant = static_cast<uint32_t>(*t);
      } else {
        return BadRequest(InvalidArgument("query", "only count=N and tenant=T are known, each once"));
      }
    }
  }
  Result<uint64_t> slot = ParseUnsigned(block_text, "block");
  if (!slot.ok() || *slot > UINT32_MAX) return BadRequest(InvalidArgument("block", "must be a block index"));
  MutexLock lock(mu_);
  if (!manager_->pool().backed()) {
    return {409, Error(FailedPrecondition("pool", "an unbacked pool holds no bytes")).dump()};
  }
  if (record_bytes_ == 0) {
    return {409, Error(FailedPrecondition("model", "the model has no per-token records")).dump()};
  }
  const RequestId r = RequestOfHandle(*id);
  if (manager_->TenantOf(r) != tenant || prefix_hash_.find(r.value) == prefix_hash_.end()) {
    return BadRequest(InvalidArgument("request", "no live request " + std::to_string(*id)));
  }
  const uint64_t bt = manager_->block_tokens();
  const uint64_t tokens = manager_->Tokens(r);
  const uint64_t written_slots = std::min<uint64_t>(manager_->BlockTable(r).size(), (tokens + bt - 1) / bt);
  if (*slot >= written_slots) {
    return BadRequest(InvalidArgument("block", "the request holds no written token in block " + std::to_string(*slot)));
  }
  if (count > written_slots - *slot) {
    return BadRequest(InvalidArgument("count", "blocks " + std::to_string(*slot) + ".." +
                                                   std::to_string(*slot + count - 1) + " go past the " +
                                                   std::to_string(written_slots) + " written"));
  }
  const uint64_t first = *slot * bt;
  const uint64_t n = std::min(count * bt, tokens - first);
  // One block is always served (its size is the model's); a batch stays within the body bound.
  if (count > 1 && n * record_bytes_ > config_.http_max_body_bytes) {
    return BadRequest(OutOfRange(
        "count", "the reply would be " + std::to_string(n * record_bytes_) + " bytes, over http.max_body_bytes"));
  }
  std::string out(n * record_bytes_, '\0');
  const std::vector<PoolGroup>& pg = manager_->pool().groups();
  for (uint64_t p = first; p < first + n; ++p) {
    for (uint32_t g = 0; g < pg.size(); ++g) {
      if (pg[g].page.compress_ratio != 1) continue;
      for (uint32_t l = 0; l < pg[g].layers; ++l) {
        Result<ConstRecordView> v = manager_->Record(r, g, l, p);
        if (!v.ok()) return {500, Error(v.status()).dump()};
        char* dst = out.data() + (p - first) * record_bytes_ + static_cast<uint64_t>(record_offset_[g][l]);
        for (uint32_t k = 0; k < v->plane_count; ++k) {
          std::memcpy(dst, v->planes[k].data(), v->planes[k].size());
          dst += v->planes[k].size();
        }
      }
    }
  }
  *binary = true;
  kv_bytes_read_.fetch_add(out.size(), std::memory_order_relaxed);
  return {200, std::move(out)};
}

bool ServeCore::Authorized(const char* authorization) const {
  if (http_token_.empty()) return true;
  if (authorization == nullptr) return false;
  std::string_view given(authorization);
  constexpr std::string_view kBearer = "Bearer ";
  if (!given.starts_with(kBearer)) return false;
  given.remove_prefix(kBearer.size());
  // Every byte of the token is compared whatever differs first: the time depends on the token's
  // length only, not on how much of it a guess got right.
  uint8_t diff = given.size() == http_token_.size() ? 0 : 1;
  for (size_t i = 0; i < http_token_.size(); ++i) {
    const uint8_t g = i < given.size() ? static_cast<uint8_t>(given[i]) : 0;
    diff |= static_cast<uint8_t>(g ^ static_cast<uint8_t>(http_token_[i]));
  }
  return diff == 0;
}

std::pair<int, std::string> ServeCore::HandleFree(std::string_view body) {
  TESSERA_HTTP_ASSIGN(j, ParseJson(body, "body"));
  if (Status st = OnlyKeys(j, {"request", "tenant"}); !st.ok()) return {400, Error(st).dump()};
  TESSERA_HTTP_ASSIGN(id, UintField(j, "request", UINT64_MAX, std::nullopt));
  TESSERA_HTTP_ASSIGN(tenant, TenantField(j));
  Status st = FreeAs(tenant, RequestOfHandle(id));
  if (!st.ok()) return {HttpStatusOf(st.code()), Error(st).dump()};
  return {200, "{}"};
}

std::pair<int, std::string> ServeCore::HandleReset() {
  MutexLock lock(mu_);
  Status st = manager_->ResetPrefixCache();
  PublishLocked();
  if (!st.ok()) return {HttpStatusOf(st.code()), Error(st).dump()};
  return {200, "{}"};
}

// ---- HTTP ------------------------------------------------------------------------------------

namespace {

void Reply(mg_connection* conn, int status, const char* type, const std::string& body) {
  const char* reason = status == 200   ? "OK"
                       : status == 400 ? "Bad Request"
                       : status == 401 ? "Unauthorized"
                       : status == 404 ? "Not Found"
                       : status == 405 ? "Method Not Allowed"
                       : status == 408 ? "Request Timeout"
                       : status == 409 ? "Conflict"
                       : status == 411 ? "Length Required"
                       : status == 413 ? "Payload Too Large"
                       : status == 503 ? "Service Unavailable"
                                       : "Internal Server Error";
  mg_printf(conn, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", status,
            reason, type, body.size());
  mg_write(conn, body.data(), body.size());
}

// Runs the API calls on one thread of its own: the manager has one owner at a time, and
// civetweb's workers have small stacks (the Redis client's buffers live on the caller's stack).
class OwnerThread {
 public:
  OwnerThread() : thread_([this] { Loop(); }) {}
  ~OwnerThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Run(const std::function<void()>& f) {
    std::promise<void> done;
    std::future<void> finished = done.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back([&] {
        f();
        done.set_value();
      });
    }
    cv_.notify_one();
    finished.wait();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::function<void()> job = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// Connections per client address (http.max_connections_per_client), counted from the moment
// their headers are in (civetweb's begin_request) to civetweb's connection_close. Civetweb 1.15
// gives its init_connection callback no address (mg_get_request_info is NULL there), so the
// limit cannot act before the headers: the header phase is bounded by http.header_timeout_ms
// instead (docs/adr/0031-serve-hardening.md).
class ClientLimit {
 public:
  explicit ClientLimit(uint32_t max) : max_(max) {}
  // True when the connection from `address` is admitted (and counted).
  bool Enter(const std::string& address) {
    MutexLock lock(mu_);
    auto it = open_.find(address);
    if (it != open_.end() && it->second >= max_) return false;
    ++open_[address];
    return true;
  }
  void Leave(const std::string& address) {
    MutexLock lock(mu_);
    auto it = open_.find(address);
    if (it != open_.end() && --it->second == 0) open_.erase(it);
  }

 private:
  const uint32_t max_;
  Mutex mu_;
  std::unordered_map<std::string, uint32_t> open_ GUARDED_BY(mu_);
};

struct HttpContext {
  ServeCore* core;
  OwnerThread* owner;
  ClientLimit* limit;
};

void ConnectionClosed(const mg_connection* conn) {
  // The user data of a counted connection: its address (owned).
  auto* address = static_cast<std::string*>(mg_get_user_connection_data(conn));
  if (address == nullptr) return;
  const auto* http = static_cast<const HttpContext*>(mg_get_user_data(mg_get_context(conn)));
  http->limit->Leave(*address);
  delete address;
}

// Before any handler, once the headers are in: a client address over its connection limit, and
// requests whose framing is ambiguous (two Content-Length headers, or one beside
// Transfer-Encoding), are answered here, their body unread (the reply closes the connection).
int BeginRequest(mg_connection* conn) {
  const mg_request_info* ri = mg_get_request_info(conn);
  const auto* http = static_cast<const HttpContext*>(mg_get_user_data(mg_get_context(conn)));
  if (mg_get_user_connection_data(conn) == nullptr) {
    if (!http->limit->Enter(ri->remote_addr)) {
      Reply(conn, 503, "application/json",
            Error(Status(StatusCode::kOutOfBlocks, "connections",
                         "over http.max_connections_per_client from this client address"))
                .dump());
      return 503;
    }
    mg_set_user_connection_data(conn, new std::string(ri->remote_addr));
  }
  int lengths = 0;
  bool chunked = false;
  for (int i = 0; i < ri->num_headers; ++i) {
    if (ri->http_headers[i].name == nullptr) continue;
    if (::strcasecmp(ri->http_headers[i].name, "Content-Length") == 0) ++lengths;
    if (::strcasecmp(ri->http_headers[i].name, "Transfer-Encoding") == 0) chunked = true;
  }
  if (lengths > 1 || (lengths == 1 && chunked)) {
    Reply(conn, 400, "application/json",
          Error(InvalidArgument("Content-Length", lengths > 1 ? "given twice" : "given beside Transfer-Encoding"))
              .dump());
    return 400;
  }
  return 0;
}

}  // namespace

class ServeHttp {
 public:
  static int Metrics(mg_connection* conn, void* data) {
    ServeCore* core = static_cast<HttpContext*>(data)->core;
    if (std::strcmp(mg_get_request_info(conn)->request_method, "GET") != 0) {
      Reply(conn, 405, "text/plain", "GET only\n");
      return 405;
    }
    Reply(conn, 200, "text/plain; version=0.0.4; charset=utf-8", core->MetricsText());
    return 200;
  }
  static int Health(mg_connection* conn, void*) {
    Reply(conn, 200, "text/plain", "ok\n");
    return 200;
  }
  static int Api(mg_connection* conn, void* data) {
    const int status = ApiCall(conn, static_cast<HttpContext*>(data));
    if (status != 200) static_cast<HttpContext*>(data)->core->http_errors_.fetch_add(1, std::memory_order_relaxed);
    return status;
  }
  static int ApiCall(mg_connection* conn, HttpContext* http) {
    ServeCore* core = http->core;
    const mg_request_info* ri = mg_get_request_info(conn);
    if (!core->Authorized(mg_get_header(conn, "Authorization"))) {
      const std::string body =
          Error(InvalidArgument("authorization", "a bearer token is required (http.token_file)")).dump();
      mg_printf(conn,
                "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer\r\nContent-Type: application/json\r\n"
                "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                body.size());
      mg_write(conn, body.data(), body.size());
      return 401;
    }
    const std::string_view uri = ri->local_uri;
    if (std::strcmp(ri->request_method, "GET") == 0 && (uri == "/v1/layout" || uri.starts_with("/v1/requests/"))) {
      std::string path(uri);
      if (ri->query_string != nullptr) path += "?" + std::string(ri->query_string);
      std::pair<int, std::string> r;
      bool binary = false;
      http->owner->Run([&] { r = core->HandleGet(path, &binary); });
      Reply(conn, r.first, binary ? "application/octet-stream" : "application/json", r.second);
      return r.first;
    }
    if (std::strcmp(ri->request_method, "POST") != 0) {
      Reply(conn, 405, "application/json", Error(InvalidArgument("method", "POST only")).dump());
      return 405;
    }
    if (ri->content_length < 0) {
      Reply(conn, 411, "application/json", Error(InvalidArgument("body", "Content-Length required")).dump());
      return 411;
    }
    if (static_cast<uint64_t>(ri->content_length) > core->config_.http_max_body_bytes) {
      Reply(conn, 413, "application/json",
            Error(OutOfRange("body", "larger than http.max_body_bytes (" +
                                         std::to_string(core->config_.http_max_body_bytes) + ")"))
                .dump());
      return 413;
    }
    // The body is read only now, after the token and the length were checked, and within
    // http.body_timeout_ms in all (each read waits at most http.header_timeout_ms).
    std::string body(static_cast<size_t>(ri->content_length), '\0');
    size_t got = 0;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(core->config_.http_body_timeout_ms);
    while (got < body.size()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        Reply(conn, 408, "application/json",
              Error(InvalidArgument("body", "not received within http.body_timeout_ms")).dump());
        return 408;
      }
      const int n = mg_read(conn, body.data() + got, body.size() - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (got != body.size()) {
      Reply(conn, 400, "application/json", Error(InvalidArgument("body", "shorter than its Content-Length")).dump());
      return 400;
    }
    const std::string path = ri->local_uri;
    std::pair<int, std::string> r;
    http->owner->Run([&] { r = core->Handle(path, body); });
    Reply(conn, r.first, "application/json", r.second);
    return r.first;
  }
};

class ServeCore::Http {
 public:
  ~Http() {
    if (ctx != nullptr) mg_stop(ctx);  // no request runs past this point
    mg_exit_library();
  }
  OwnerThread owner;
  std::unique_ptr<ClientLimit> limit;
  HttpContext context{nullptr, nullptr, nullptr};
  mg_context* ctx = nullptr;
  int port = 0;
};

void ServeCore::HttpStop::operator()(Http* http) const { delete http; }

Result<ServeCore::HttpHandle> ServeCore::StartHttp(ServeCore* core) {
  HttpHandle http(new Http());
  http->limit = std::make_unique<ClientLimit>(core->config_.http_max_connections_per_client);
  http->context = HttpContext{core, &http->owner, http->limit.get()};
  mg_init_library(0);
  const std::string threads = std::to_string(core->config_.http_threads);
  const std::string read_timeout = std::to_string(core->config_.http_header_timeout_ms);
  const std::string& listen = core->config_.http_listen;
  // request_timeout_ms bounds the request line and headers in all (civetweb's read_message
  // counts from the connection's start) and each later read; keep-alive stays off (each reply
  // closes), so a connection holds its worker for one request.
  const char* options[] = {
      "listening_ports",    listen.c_str(),      "num_threads", threads.c_str(), "request_timeout_ms",
      read_timeout.c_str(), "enable_keep_alive", "no",          nullptr};
  mg_callbacks callbacks{};
  callbacks.begin_request = &BeginRequest;
  callbacks.connection_close = &ConnectionClosed;  // the user data is still set (not in connection_closed)
  http->ctx = mg_start(&callbacks, &http->context, options);
  if (http->ctx == nullptr) return InvalidArgument("http.listen", "cannot listen on " + listen);
  mg_set_request_handler(http->ctx, "/metrics$", &ServeHttp::Metrics, &http->context);
  mg_set_request_handler(http->ctx, "/health$", &ServeHttp::Health, &http->context);
  mg_set_request_handler(http->ctx, "/v1/", &ServeHttp::Api, &http->context);
  mg_server_port ports[1];
  if (mg_get_server_ports(http->ctx, 1, ports) > 0) http->port = ports[0].port;
  return http;
}

int ServeCore::HttpPort(const Http& http) { return http.port; }

int RunServe(const ServeConfig& config) {
  // SIGTERM and SIGINT are taken by sigwait below: blocked before any thread starts, so every
  // thread (civetweb's, ZeroMQ's, the store's) inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::vector<std::string> warnings;
  Result<std::unique_ptr<ServeCore>> core = ServeCore::Create(config, &warnings);
  for (const std::string& w : warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (!core.ok()) {
    std::fprintf(stderr, "tessera: error: %s\n", core.status().ToString().c_str());
    // As the CLI's other commands: a bad configuration, or a tier that is not there, is input.
    return core.status().code() == StatusCode::kInternal ? 1 : 2;
  }
  ServeCore* c = core->get();
  Result<ServeCore::HttpHandle> http = ServeCore::StartHttp(c);
  if (!http.ok()) {
    std::fprintf(stderr, "tessera: error: %s\n", http.status().ToString().c_str());
    return 2;
  }
  const std::string& listen = config.http_listen;
  const size_t colon = listen.rfind(':');
  const std::string host = colon == std::string::npos ? "0.0.0.0" : listen.substr(0, colon);
  std::printf("tessera serve: ready http=%s:%d events=%s\n", host.c_str(), ServeCore::HttpPort(**http),
              c->events_endpoint().empty() ? "off" : c->events_endpoint().c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "tessera serve: %s: checkpointing\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  http->reset();  // stops serving: no request runs past this point
  Status st = c->Shutdown();
  if (!st.ok()) {
    std::fprintf(stderr, "tessera: error: checkpoint: %s\n", st.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "tessera serve: stopped\n");
  return 0;
}

}  // namespace tessera

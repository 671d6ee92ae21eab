// RedisTier: sealed blocks in a Redis server shared by a fleet (hiredis).
//
// Admission: every Put is stored (SET, pipelined per batch). Promotion: none inside the tier —
// GetBatch returns verified copies; the caller promotes.
//
// Keys are namespaced: "<namespace>:<key hex>". RedisNamespace builds one, injectively, from the
// model, the record format and a tenant domain, so stores of different models, formats or
// domains never read each other's blocks. The domain is the caller's to give: Python's
// TieredStore takes it as `redis_tenant_domain` (default 0); `tessera serve` passes 0 (one
// tenant per server) — tenants sharing a server and a domain share its blocks.
//
// The server is hostile until its bytes are checked (docs/adr/0014-redis-hardening.md):
// - Values are authenticated: a 64-byte header (magic, version 2, record-format id, the key, the
//   payload length, a random nonce and a RecordMac tag under the fleet's `secret`, binding the
//   namespace too) precedes the payload. A value that fails — forged, edited, truncated, moved
//   under another key, copied from another namespace — is counted (`verify_failures`) and served
//   as a miss, never returned.
// - Each call has one deadline, `timeout_ms` after its commands are encoded: connecting, writing
//   the whole pipeline and reading every reply must be done by then, however slowly the server
//   sends. On expiry the connection is dropped and the call degrades as for a lost server
//   (`timeouts`).
// - Replies are bounded before anything is allocated for them: a bulk string by the largest
//   value (`max_value_bytes` plus the header), no array with elements, a status or error line by
//   4 KiB.
//   A reply over a bound or malformed, and bytes nobody asked for, drop the connection; a reply
//   of the wrong type fails its command. All are counted (`bad_replies`).
// - Every reply is checked: a SET the server refuses (e.g. -OOM under maxmemory noeviction) fails
//   PutBatch with kIoError naming "redis" and the server's message; so does a refused DEL.
//
// An unreachable or restarted server degrades to a miss-only tier: GetBatch returns misses (not
// errors), PutBatch returns kIoError (counted) and the tier retries the connection at most once
// per `reconnect_interval_ms`; each successful reconnection is counted as a recovery. Writes use
// send(MSG_NOSIGNAL): a server gone mid-batch is an error, never SIGPIPE.
//
// Thread-safety: not thread-safe; one owner (one connection).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/hash128.h"
#include "tessera/status.h"
#include "tessera/tier.h"

namespace tessera {

namespace redis_io {
class Connection;
struct Reply;
}  // namespace redis_io
namespace redis_value {
class Codec;
}

struct RedisTierOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string key_namespace = "tessera";
  // The fleet's shared secret (at least 16 bytes; required): every value is authenticated with a
  // key derived from it, so only holders of the secret can produce values this tier accepts.
  std::vector<std::byte> secret;
  // The largest record payload stored or accepted back (1 .. 512 MiB - 64); bounds every reply.
  uint64_t max_value_bytes = 64ull << 20;
  uint32_t timeout_ms = 200;  // the budget of one call: connect, write the pipeline, read every reply
  uint32_t reconnect_interval_ms = 100;
  // The time the reconnection backoff reads (tests advance it instead of sleeping); empty: the
  // steady clock. Deadlines on the wire always use the steady clock.
  std::function<std::chrono::steady_clock::time_point()> backoff_clock;
};

struct RedisTierStats {
  uint64_t puts = 0, gets = 0, hits = 0, misses = 0;  // puts: records stored
  uint64_t verify_failures = 0;                       // values that failed verification (served as misses)
  uint64_t errors = 0;                                // failed connections and calls, refused commands
  uint64_t timeouts = 0;                              // calls whose deadline passed (of errors)
  uint64_t bad_replies = 0;                           // replies malformed, over a bound, wrong-typed or not asked for
  uint64_t recoveries = 0;                            // reconnections after the server was lost
  bool connected = false;
};

// "tessera:<model>:<format>:<tenant domain>", with every byte of model and format outside
// [A-Za-z0-9._-] written as %XX: injective (no two triples give one namespace; ':' only
// separates), and free of '{' and '}', so it also serves RedisClusterTier.
std::string RedisNamespace(std::string_view model, std::string_view format, uint32_t tenant_domain);

class RedisTier {
 public:
  // Validates the options (fields "host", "port", "timeout_ms", "secret", "max_value_bytes");
  // connects lazily, so an unreachable server is not an error here.
  static Result<std::unique_ptr<RedisTier>> Open(RedisTierOptions options);
  ~RedisTier();
  RedisTier(const RedisTier&) = delete;
  RedisTier& operator=(const RedisTier&) = delete;

  // Stores every record; kIoError on "redis" (naming the server's message) when any was not:
  // unreachable, refused, over max_value_bytes, or the deadline passed.
  Status PutBatch(std::span<const TierRecord> records);
  // One entry per key: the verified record, or nullopt (a miss, an unreachable server, or a
  // value that failed verification).
  std::vector<std::optional<TierRecord>> GetBatch(std::span<const Hash128> keys);
  // Deletes the keys (pipelined). kIoError on "redis" when the server is unreachable or refuses.
  Status EraseBatch(std::span<const Hash128> keys);
  RedisTierStats stats() const;

 private:
  std::chrono::steady_clock::time_point BackoffNow() const {
    return options_.backoff_clock ? options_.backoff_clock() : std::chrono::steady_clock::now();
  }
  RedisTier(RedisTierOptions options, std::unique_ptr<const redis_value::Codec> codec);
  bool EnsureConnected(std::chrono::steady_clock::time_point deadline);
  void Drop();
  std::string KeyOf(const Hash128& key) const;
  std::string Address() const;
  // Sends `request`, reads `expected` replies by `deadline` into *replies. On failure: counts it,
  // drops the connection, keeps the replies that did arrive and returns false with *why.
  bool Run(std::string request, size_t expected, std::chrono::steady_clock::time_point deadline,
           std::vector<redis_io::Reply>* replies, std::string* why);

  RedisTierOptions options_;
  std::unique_ptr<const redis_value::Codec> codec_;
  std::unique_ptr<redis_io::Connection> conn_;
  bool ever_connected_ = false;
  std::chrono::steady_clock::time_point last_attempt_{};
  RedisTierStats stats_;
};

}  // namespace tessera

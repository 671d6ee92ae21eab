// RedisTier: sealed blocks in a Redis server shared by a fleet (hiredis).
//
// Admission: every Put is stored (SET, pipelined per batch). Promotion: none inside the tier —
// GetBatch returns verified copies; the caller promotes.
//
// Keys are namespaced: "<namespace>:<key hex>", with the namespace built from the model, the
// record format and the tenant domain (RedisNamespace), so fleets and tenants never read each
// other's blocks. Values carry a 48-byte header (magic, version, record-format id, the key, the
// payload length and an xxh3-64 checksum) that is verified on every read: a value that fails is
// counted and treated as a miss, never returned.
//
// An unreachable or restarted server degrades to a miss-only tier: GetBatch returns misses (not
// errors), PutBatch returns kIoError (counted) and the tier retries the connection at most once
// per `reconnect_interval_ms`; each successful reconnection is counted as a recovery.
//
// Thread-safety: not thread-safe; one owner (one connection).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessera/disk_tier.h"
#include "tessera/hash.h"
#include "tessera/status.h"

struct redisContext;

namespace tessera {

struct RedisTierOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string key_namespace = "tessera";
  uint32_t timeout_ms = 200;
  uint32_t reconnect_interval_ms = 100;
};

struct RedisTierStats {
  uint64_t puts = 0, gets = 0, hits = 0, misses = 0;
  uint64_t verify_failures = 0;  // values that failed verification (served as misses)
  uint64_t errors = 0;           // failed commands / connections
  uint64_t recoveries = 0;       // reconnections after the server was lost
  bool connected = false;
};

// "tessera:<model>:<format>:<tenant domain>"
std::string RedisNamespace(std::string_view model, std::string_view format, uint32_t tenant_domain);

class RedisTier {
 public:
  explicit RedisTier(RedisTierOptions options);
  ~RedisTier();
  RedisTier(const RedisTier&) = delete;
  RedisTier& operator=(const RedisTier&) = delete;

  Status PutBatch(std::span<const DiskRecord> records);
  // One entry per key: the verified record, or nullopt (a miss, an unreachable server, or a
  // value that failed verification).
  std::vector<std::optional<DiskRecord>> GetBatch(std::span<const Hash128> keys);
  // Deletes the keys (pipelined). kIoError on "redis" when the server is unreachable.
  Status EraseBatch(std::span<const Hash128> keys);
  RedisTierStats stats() const;

 private:
  bool EnsureConnected();
  void Drop();
  std::string KeyOf(const Hash128& key) const;

  RedisTierOptions options_;
  redisContext* ctx_ = nullptr;
  bool ever_connected_ = false;
  std::chrono::steady_clock::time_point last_attempt_{};
  RedisTierStats stats_;
};

}  // namespace tessera

// RedisClusterTier: sealed blocks in a Redis Cluster shared by a fleet — a small slot router
// written over hiredis, which has no cluster support (docs/adr/0011-redis-tier.md, "Redis
// Cluster").
//
// Admission: every Put is stored (the tiered store above decides what to demote; capacity and
// LRU are the cluster's maxmemory policy). Promotion: none inside the tier — GetBatch returns
// verified copies; the caller promotes.
//
// Keys: "<namespace>:{<key hex>}". The hash tag makes the slot CRC16(<key hex>) mod 16384, so
// keys of one namespace spread over every slot while the namespace still isolates fleets and
// tenants. Values use RedisTier's format: a 48-byte header verified on every read; a value that
// fails is counted and served as a miss, never returned.
//
// Routing: the slot map comes from CLUSTER SLOTS (asked of any reachable known node, seeds
// first). Each node has one connection, opened lazily. A batch is grouped by node and each group
// is pipelined; the groups are written to all nodes before any reply is read. A MOVED reply
// updates the slot, schedules one slot-map refresh for the batch, and the command is retried once
// at the new owner; an ASK reply retries once at the named node behind ASKING. A command
// redirected a second time is not followed (a miss for gets, an error for puts and erases).
//
// Degradation: a node that is unreachable or goes away mid-batch turns its keys into misses for
// GetBatch (never errors, never wrong data); PutBatch and EraseBatch return kIoError on "redis"
// (counted, per node). A lost node is retried at most once per `reconnect_interval_ms`; each
// successful reconnection after a loss counts as a recovery. A connection failure also schedules
// a slot-map refresh (rate-limited by the same interval), so a failover is picked up.
//
// Nodes are identified by the "host:port" they are reached at (a seed given by name and the same
// node announced by IP are two entries, two connections); the endpoint CLUSTER SLOTS announces is
// used as is, and an unknown endpoint ("?") leaves its slots unowned (misses) until a refresh.
//
// Not handled: reads from replicas, resharding that redirects a key more than once per batch,
// forgetting nodes that left the cluster (they stay known, idle), AUTH and TLS.
//
// Signals: hiredis writes with write(2), so writing the rest of a pipeline to a node that died
// raises SIGPIPE. The tier blocks SIGPIPE in the calling thread while it talks to the nodes and
// consumes one raised meanwhile; the process's disposition is never changed.
//
// Thread-safety: not thread-safe; one owner.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/disk_tier.h"
#include "tessera/hash.h"
#include "tessera/status.h"

namespace tessera {

inline constexpr uint32_t kRedisClusterSlots = 16384;

// CRC16-CCITT (XModem: polynomial 0x1021, initial value 0, no reflection), as the Redis Cluster
// specification defines it. RedisClusterCrc16("123456789") == 0x31C3.
uint16_t RedisClusterCrc16(std::string_view data);
// The slot of `key`: CRC16 of the hash tag (the bytes between the first '{' and the first '}'
// after it, when that is non-empty) or else of the whole key, mod 16384.
uint16_t RedisClusterKeySlot(std::string_view key);

struct RedisClusterOptions {
  std::vector<std::string> seeds;  // "host:port" of one or more cluster nodes
  std::string key_namespace = "tessera";  // no '{' or '}': the hash tag is the key hex
  uint32_t connect_timeout_ms = 200;
  uint32_t timeout_ms = 200;  // per command (read and write)
  uint32_t reconnect_interval_ms = 100;
};

struct RedisClusterNodeStats {
  std::string address;  // "host:port"
  bool connected = false;
  uint64_t errors = 0;      // failed connections, commands and error replies at this node
  uint64_t recoveries = 0;  // reconnections after this node was lost
};

struct RedisClusterStats {
  uint64_t puts = 0, gets = 0, hits = 0, misses = 0, erases = 0;  // puts, erases: done
  uint64_t put_failures = 0, erase_failures = 0;  // records not stored, keys not erased
  uint64_t verify_failures = 0;      // values that failed verification (served as misses)
  uint64_t errors = 0;               // all failures: node errors plus slot-map failures
  uint64_t recoveries = 0;           // sum over nodes
  uint64_t redirections = 0;         // MOVED and ASK replies followed
  uint64_t moved = 0, asks = 0;      // of which MOVED, ASK
  uint64_t slot_map_refreshes = 0;   // successful CLUSTER SLOTS loads
  uint64_t slot_map_failures = 0;    // attempts where no node answered CLUSTER SLOTS
  uint32_t slots_covered = 0;        // slots with a known owner in the current map
  std::vector<RedisClusterNodeStats> nodes;
};

class RedisClusterTier {
 public:
  // Validates the options (field "seeds" or "key_namespace") and loads the slot map if a seed
  // answers; an unreachable cluster is not an error (the tier is miss-only until one answers).
  static Result<std::unique_ptr<RedisClusterTier>> Open(RedisClusterOptions options);
  ~RedisClusterTier();
  RedisClusterTier(const RedisClusterTier&) = delete;
  RedisClusterTier& operator=(const RedisClusterTier&) = delete;

  // Stores every record; kIoError on "redis" naming the nodes when any record was not stored.
  Status PutBatch(std::span<const DiskRecord> records);
  // One entry per key: the verified record, or nullopt (a miss, an unreachable node, a redirect
  // not followed, or a value that failed verification).
  std::vector<std::optional<DiskRecord>> GetBatch(std::span<const Hash128> keys);
  // Deletes the keys (absent keys are fine); kIoError on "redis" when a node could not be asked.
  Status EraseBatch(std::span<const Hash128> keys);
  RedisClusterStats stats() const;

  // "<namespace>:{<key hex>}"
  std::string KeyOf(const Hash128& key) const;

 private:
  struct Node;
  struct Op;
  explicit RedisClusterTier(RedisClusterOptions options);

  size_t NodeFor(const std::string& host, int port);
  bool EnsureConnected(Node& node);
  void DropNode(Node& node);
  void NodeError(Node& node);
  bool RefreshSlotMap(bool rate_limited);
  // Runs `ops` (at most two rounds: the first and one redirected retry) and fills their results.
  void Execute(std::vector<Op>& ops);

  RedisClusterOptions options_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::array<int32_t, kRedisClusterSlots> slots_{};  // node index, or -1
  std::chrono::steady_clock::time_point last_refresh_attempt_{};
  RedisClusterStats stats_;
};

}  // namespace tessera

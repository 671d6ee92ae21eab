// RedisClusterTier: sealed blocks in a Redis Cluster shared by a fleet — a small slot router
// written over hiredis, which has no cluster support (docs/adr/0011-redis-tier.md, "Redis
// Cluster"; hardening: docs/adr/0014-redis-hardening.md).
//
// Admission: every Put is stored (the tiered store above decides what to demote; capacity and
// LRU are the cluster's maxmemory policy). Promotion: none inside the tier — GetBatch returns
// verified copies; the caller promotes.
//
// Keys: "<namespace>:{<key hex>}". The hash tag makes the slot CRC16(<key hex>) mod 16384, so
// keys of one namespace spread over every slot while the namespace still isolates fleets and
// tenants. Values use RedisTier's authenticated format: a 64-byte header with a RecordMac tag
// under the fleet's `secret` (binding namespace, key, format id and length) verified on every
// read; a value that fails is counted and served as a miss, never returned.
//
// Routing: the slot map comes from CLUSTER SLOTS (asked of any reachable known node, seeds
// first). Each node has one connection, opened lazily. A batch is grouped by node and each group
// is pipelined; the groups are written to all nodes and their replies read at once (poll). A
// MOVED reply updates the slot, schedules one slot-map refresh for the batch, and the command is
// retried once at the new owner; an ASK reply retries once at the named node behind ASKING. A
// command redirected a second time is not followed (a miss for gets, an error for puts and
// erases).
//
// The cluster is hostile until its bytes are checked:
// - Deadlines: each batch call (PutBatch, GetBatch, EraseBatch) has one deadline, `timeout_ms`
//   after its commands are encoded, for all its network work: connecting (each connection also
//   within `connect_timeout_ms`), slot-map reloads, the pipelines and the redirected retries. A
//   node still owing bytes then is dropped (`timeouts`). Open gives each seed it asks
//   `connect_timeout_ms` to connect and `timeout_ms` to answer CLUSTER SLOTS.
// - Bounds: a reply to GET/SET/DEL/ASKING is at most one bulk string of the largest value
//   (`max_value_bytes` plus the header) and never an array with elements; CLUSTER SLOTS is at most 8 MiB and
//   2^18 array elements, 4 levels deep. A reply over a bound or malformed drops the node's
//   connection (`bad_replies`); so do bytes nobody asked for.
// - Endpoints the cluster announces (CLUSTER SLOTS, MOVED, ASK) must be IP literals: a host name
//   there would make the client resolve it, which no deadline bounds. At most
//   kRedisClusterMaxNodes nodes are known; a map or redirect naming more is not followed.
//
// Degradation: a node that is unreachable, too slow or goes away mid-batch turns its keys into
// misses for GetBatch (never errors, never wrong data); PutBatch and EraseBatch return kIoError on
// "redis" (counted, per node). A lost node is retried at most once per `reconnect_interval_ms`;
// each successful reconnection after a loss counts as a recovery. A connection failure also
// schedules a slot-map refresh (rate-limited by the same interval), so a failover is picked up.
//
// Nodes are identified by the "host:port" they are reached at (a seed given by name and the same
// node announced by IP are two entries, two connections); the endpoint CLUSTER SLOTS announces is
// used as is, and an unknown endpoint ("?") leaves its slots unowned (misses) until a refresh.
//
// Not handled: reads from replicas, resharding that redirects a key more than once per batch,
// forgetting nodes that left the cluster (they stay known, idle), host names announced by the
// cluster (cluster-preferred-endpoint-type hostname), AUTH and TLS.
//
// Signals: writes use send(MSG_NOSIGNAL): a node that died mid-pipeline is an error, never
// SIGPIPE; the process's signal disposition and mask are never touched.
//
// Thread-safety: not thread-safe; one owner.
#pragma once

#include <array>
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
struct Conversation;
struct Reply;
}  // namespace redis_io
namespace redis_value {
class Codec;
}

inline constexpr uint32_t kRedisClusterSlots = 16384;
// The most nodes a tier knows (Redis Cluster's own suggested limit): a hostile map or redirect
// cannot make it allocate a connection table without end.
inline constexpr size_t kRedisClusterMaxNodes = 1000;

// CRC16-CCITT (XModem: polynomial 0x1021, initial value 0, no reflection), as the Redis Cluster
// specification defines it. RedisClusterCrc16("123456789") == 0x31C3.
uint16_t RedisClusterCrc16(std::string_view data);
// The slot of `key`: CRC16 of the hash tag (the bytes between the first '{' and the first '}'
// after it, when that is non-empty) or else of the whole key, mod 16384.
uint16_t RedisClusterKeySlot(std::string_view key);

struct RedisClusterOptions {
  std::vector<std::string> seeds;         // "host:port" of one or more cluster nodes
  std::string key_namespace = "tessera";  // no '{' or '}': the hash tag is the key hex
  // The fleet's shared secret (at least 16 bytes; required): values are authenticated with it.
  std::vector<std::byte> secret;
  // The largest record payload stored or accepted back (1 .. 512 MiB - 64); bounds every reply.
  uint64_t max_value_bytes = 64ull << 20;
  uint32_t connect_timeout_ms = 200;
  uint32_t timeout_ms = 200;  // the budget of one batch call (all nodes, rounds and reloads)
  uint32_t reconnect_interval_ms = 100;
  // The time the reconnection backoff reads (tests advance it instead of sleeping); empty: the
  // steady clock. Deadlines on the wire always use the steady clock.
  std::function<std::chrono::steady_clock::time_point()> backoff_clock;
};

struct RedisClusterNodeStats {
  std::string address;  // "host:port"
  bool connected = false;
  uint64_t errors = 0;      // failed connections, commands and error replies at this node
  uint64_t recoveries = 0;  // reconnections after this node was lost
};

struct RedisClusterStats {
  uint64_t puts = 0, gets = 0, hits = 0, misses = 0, erases = 0;  // puts, erases: done
  uint64_t put_failures = 0, erase_failures = 0;                  // records not stored, keys not erased
  uint64_t verify_failures = 0;                                   // values that failed verification (served as misses)
  uint64_t errors = 0;                                            // all failures: node errors plus slot-map failures
  uint64_t timeouts = 0;            // node conversations cut off by a deadline (of errors)
  uint64_t bad_replies = 0;         // replies malformed, over a bound, wrong-typed or not asked for
  uint64_t recoveries = 0;          // sum over nodes
  uint64_t redirections = 0;        // MOVED and ASK replies followed
  uint64_t moved = 0, asks = 0;     // of which MOVED, ASK
  uint64_t slot_map_refreshes = 0;  // successful CLUSTER SLOTS loads
  uint64_t slot_map_failures = 0;   // attempts where no node answered CLUSTER SLOTS
  uint32_t slots_covered = 0;       // slots with a known owner in the current map
  std::vector<RedisClusterNodeStats> nodes;
};

class RedisClusterTier {
 public:
  // Validates the options (fields "seeds", "key_namespace", "timeout_ms", "connect_timeout_ms",
  // "secret", "max_value_bytes") and loads the slot map if a seed answers; an unreachable or
  // misbehaving cluster is not an error (the tier is miss-only until one answers).
  static Result<std::unique_ptr<RedisClusterTier>> Open(RedisClusterOptions options);
  ~RedisClusterTier();
  RedisClusterTier(const RedisClusterTier&) = delete;
  RedisClusterTier& operator=(const RedisClusterTier&) = delete;

  // Stores every record; kIoError on "redis" naming the nodes when any record was not stored.
  Status PutBatch(std::span<const TierRecord> records);
  // One entry per key: the verified record, or nullopt (a miss, an unreachable node, a redirect
  // not followed, or a value that failed verification).
  std::vector<std::optional<TierRecord>> GetBatch(std::span<const Hash128> keys);
  // Deletes the keys (absent keys are fine); kIoError on "redis" when a node could not be asked.
  Status EraseBatch(std::span<const Hash128> keys);
  RedisClusterStats stats() const;

  // "<namespace>:{<key hex>}"
  std::string KeyOf(const Hash128& key) const;

 private:
  std::chrono::steady_clock::time_point BackoffNow() const {
    return options_.backoff_clock ? options_.backoff_clock() : std::chrono::steady_clock::now();
  }
  struct Node;
  struct Op;
  using Clock = std::chrono::steady_clock;
  RedisClusterTier(RedisClusterOptions options, std::unique_ptr<const redis_value::Codec> codec);

  // The node reached at host:port, added if new; -1 when kRedisClusterMaxNodes are known.
  int32_t NodeFor(const std::string& host, int port);
  bool EnsureConnected(Node& node, Clock::time_point deadline);
  void DropNode(Node& node);
  void NodeError(Node& node);
  // Counts a conversation with `node` that failed (timeout, bad reply, lost) and drops it.
  void ConversationFailed(Node& node, const redis_io::Conversation& c);
  // Asks known nodes for CLUSTER SLOTS until one answers with a valid map. With a batch
  // deadline, everything is done by it; without (Open), each node gets its own timeouts.
  bool RefreshSlotMap(bool rate_limited, std::optional<Clock::time_point> batch_deadline);
  // Runs `ops` (at most two rounds: the first and one redirected retry) by `deadline` and fills
  // their results.
  void Execute(std::vector<Op>& ops, Clock::time_point deadline);
  // Execute's steps. One round's pipelines, one per node of `groups` (indices into ops), written
  // and exchanged at once; a node that cannot be reached fails its ops and sets *connection_lost.
  void SendRound(std::vector<Op>& ops, const std::vector<std::vector<size_t>>& groups, int round,
                 Clock::time_point deadline, std::vector<redis_io::Conversation>& convs, bool* connection_lost);
  // The replies of one node's pipeline read into its ops (`group`), in order.
  void ReadReplies(std::vector<Op>& ops, Node& node, const std::vector<size_t>& group, redis_io::Conversation& c,
                   int round, bool* moved_seen);
  // A MOVED or ASK reply: the op is retried at its new node in the second round, or fails.
  void FollowRedirect(Op& op, Node& node, const redis_io::Reply& reply, bool moved, int round, bool* moved_seen);

  RedisClusterOptions options_;
  std::unique_ptr<const redis_value::Codec> codec_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::array<int32_t, kRedisClusterSlots> slots_{};  // node index, or -1
  std::chrono::steady_clock::time_point last_refresh_attempt_{};
  RedisClusterStats stats_;
};

}  // namespace tessera

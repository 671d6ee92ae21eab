// The Tier (tier.h) of each kind of store: host DRAM, a disk directory, a Redis server or a Redis
// Cluster, each wrapped so that the tiered store sees one interface.
//
// Capacity and LRU: the host tier's own (HostTier); for a disk directory, an LRU the adapter
// keeps over the directory's records within `capacity_bytes` of payload, seeded from their write
// order on open; for Redis, the server's (maxmemory, allkeys-lru). A record larger than the whole
// capacity: the host tier refuses it (PutBatch fails), the disk adapter passes it on to the
// eviction listener at once, as if evicted.
//
// Thread-safety: as Tier: not thread-safe; one owner at a time.
#pragma once

#include <cstdint>
#include <memory>

#include "tessera/disk_tier.h"
#include "tessera/redis_cluster.h"
#include "tessera/redis_tier.h"
#include "tessera/status.h"
#include "tessera/tier.h"

namespace tessera {

// Host DRAM (HostTier), LRU within `capacity_bytes`.
std::unique_ptr<Tier> MakeHostTier(uint64_t capacity_bytes);
// A disk directory (DiskTier); LRU within `capacity_bytes` of payload (0: unlimited) on top of
// the segment files, seeded from the records found on open (oldest first). Errors: as
// DiskTier::Open (field "dir").
Result<std::unique_ptr<Tier>> MakeDiskTier(const DiskTierOptions& options, uint64_t capacity_bytes);
// A Redis server (RedisTier). Capacity and LRU are the server's (maxmemory, allkeys-lru).
// Errors: as RedisTier::Open (options naming the field, e.g. a missing "secret").
Result<std::unique_ptr<Tier>> MakeRedisTier(const RedisTierOptions& options);
// A Redis Cluster (RedisClusterTier): keys spread over the nodes' slots. Errors: as
// RedisClusterTier::Open (options naming the field).
Result<std::unique_ptr<Tier>> MakeRedisClusterTier(const RedisClusterOptions& options);

}  // namespace tessera

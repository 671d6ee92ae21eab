#include "tessera/tier_adapters.h"

#include <list>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessera/host_tier.h"

namespace tessera {

namespace {

// ---- Host ------------------------------------------------------------------------------------

class HostTierAdapter final : public Tier {
 public:
  explicit HostTierAdapter(uint64_t capacity) : host_(capacity), capacity_(capacity) {
    host_.SetEvictionListener([this](const Hash128& key, uint16_t format_id, std::span<const std::byte> payload) {
      if (!on_evict_) return;
      TierRecord r{key, format_id, {payload.begin(), payload.end()}};
      on_evict_(r);
    });
  }
  std::string_view name() const override { return "host"; }
  bool in_memory() const override { return true; }
  bool persistent() const override { return false; }
  Status PutBatch(std::span<const TierRecord* const> records) override {
    for (const TierRecord* r : records) TESSERA_RETURN_IF_ERROR(host_.Put(r->key, r->format_id, r->payload));
    return Status::Ok();
  }
  std::vector<std::optional<TierRecord>> GetBatch(std::span<const Hash128> keys) override {
    std::vector<std::optional<TierRecord>> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!host_.Contains(keys[i])) continue;
      uint16_t format_id = 0;
      Result<std::vector<std::byte>> got = host_.Get(keys[i], &format_id);
      if (got.ok()) out[i] = TierRecord{keys[i], format_id, std::move(got).value()};
    }
    return out;
  }
  std::vector<bool> ContainsBatch(std::span<const Hash128> keys) override {
    std::vector<bool> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) out[i] = host_.Contains(keys[i]);
    return out;
  }
  std::optional<uint64_t> PayloadSize(const Hash128& key) const override { return host_.PayloadSize(key); }
  Status ReadInto(const Hash128& key, std::span<const std::span<std::byte>> out, uint16_t* format_id) override {
    return host_.GetScattered(key, out, format_id);
  }
  Status EraseBatch(std::span<const Hash128> keys) override {
    for (const Hash128& k : keys) host_.Erase(k);
    return Status::Ok();
  }
  std::vector<Hash128> Keys() const override { return host_.Keys(); }
  Status Quarantine(const Hash128& key, const std::string&) override {
    host_.Erase(key);
    return Status::Ok();
  }
  TierCounters counters() const override {
    HostTierStats s = host_.stats();
    return {s.records, s.bytes, capacity_, s.evictions, s.quarantined};
  }

 private:
  HostTier host_;
  uint64_t capacity_;
};

// ---- Disk ------------------------------------------------------------------------------------

// An LRU over a DiskTier, which has none: `lru_` and `map_` hold the same keys, the directory's
// live records as far as this process knows (every one found on open, every one written since),
// most recent first; `bytes_` is the sum of their payload lengths and stays within `capacity_`
// (when not 0) after every PutBatch. The directory is compacted when its dead bytes (evicted,
// erased, superseded records) exceed both the live payload and one segment, so it stays within
// about twice what it holds plus a segment, and each compaction's copy is paid for by as many
// bytes written since the last.
class DiskTierAdapter final : public Tier {
 public:
  DiskTierAdapter(std::unique_ptr<DiskTier> disk, uint64_t capacity, uint64_t segment_bytes)
      : disk_(std::move(disk)), capacity_(capacity), compact_floor_(segment_bytes) {
    for (const auto& [key, len] : disk_->Keys()) Touch(key, len);  // oldest first: ends least recent
  }
  std::string_view name() const override { return "disk"; }
  bool in_memory() const override { return false; }
  bool persistent() const override { return true; }

  Status PutBatch(std::span<const TierRecord* const> records) override {
    std::vector<const TierRecord*> admit;
    uint64_t incoming = 0;
    for (const TierRecord* r : records) {
      if (capacity_ > 0 && r->payload.size() > capacity_) {  // larger than the whole tier: passed on down
        if (on_evict_) on_evict_(*r);
        continue;
      }
      admit.push_back(r);
      incoming += r->payload.size();
    }
    if (capacity_ > 0) {
      while (!lru_.empty() && bytes_ + incoming > capacity_) TESSERA_RETURN_IF_ERROR(EvictOne());
    }
    TESSERA_RETURN_IF_ERROR(disk_->PutBatch(std::span<const TierRecord* const>(admit)));
    for (const TierRecord* r : admit) Touch(r->key, r->payload.size());
    // A batch larger than the room left: its oldest records go on down at once.
    if (capacity_ > 0) {
      while (!lru_.empty() && bytes_ > capacity_) TESSERA_RETURN_IF_ERROR(EvictOne());
    }
    return MaybeCompact();
  }
  std::vector<std::optional<TierRecord>> GetBatch(std::span<const Hash128> keys) override {
    std::vector<std::optional<TierRecord>> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!disk_->Contains(keys[i])) continue;
      Result<TierRecord> r = disk_->Get(keys[i]);
      if (r.ok()) {
        Touch(keys[i], r.value().payload.size());
        out[i] = std::move(r).value();
      } else {
        Forget(keys[i]);  // quarantined by the disk tier (kDataLoss)
      }
    }
    return out;
  }
  std::optional<uint64_t> PayloadSize(const Hash128& key) const override { return disk_->PayloadSize(key); }
  Status ReadInto(const Hash128& key, std::span<const std::span<std::byte>> out, uint16_t* format_id) override {
    Status st = disk_->ReadInto(key, out, format_id);
    if (st.ok()) {
      Touch(key, *disk_->PayloadSize(key));
    } else if (st.code() == StatusCode::kDataLoss) {
      Forget(key);  // quarantined by the disk tier
    }
    return st;
  }
  std::vector<bool> ContainsBatch(std::span<const Hash128> keys) override {
    std::vector<bool> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) out[i] = disk_->Contains(keys[i]);
    return out;
  }
  Status EraseBatch(std::span<const Hash128> keys) override {
    for (const Hash128& k : keys) {
      TESSERA_RETURN_IF_ERROR(disk_->Erase(k));
      Forget(k);
    }
    return MaybeCompact();
  }
  std::vector<Hash128> Keys() const override {
    std::vector<Hash128> keys;
    keys.reserve(lru_.size());
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) keys.push_back(*it);
    return keys;
  }
  Status Quarantine(const Hash128& key, const std::string& why) override {
    Status st = disk_->QuarantineKey(key, why);
    Forget(key);
    return st;
  }
  TierCounters counters() const override {
    return {map_.size(), bytes_, capacity_, evictions_, disk_->stats().quarantined};
  }

 private:
  void Touch(const Hash128& key, uint64_t len) {
    auto it = map_.find(key);
    if (it != map_.end()) {
      bytes_ -= it->second.second;
      lru_.erase(it->second.first);
    }
    lru_.push_front(key);
    map_[key] = {lru_.begin(), len};
    bytes_ += len;
  }
  void Forget(const Hash128& key) {
    auto it = map_.find(key);
    if (it == map_.end()) return;
    bytes_ -= it->second.second;
    lru_.erase(it->second.first);
    map_.erase(it);
  }
  // The least recent record goes to the listener, then out of the directory. A failed erase
  // (a full disk cannot take the tombstone) keeps it in the LRU and fails the put that needed
  // the room: the directory holds what the LRU says.
  Status EvictOne() {
    Hash128 victim = lru_.back();
    if (on_evict_) {
      Result<TierRecord> r = disk_->Get(victim);
      if (r.ok()) on_evict_(r.value());
    }
    TESSERA_RETURN_IF_ERROR(disk_->Erase(victim));
    Forget(victim);
    ++evictions_;
    return Status::Ok();
  }
  // The put or erase that called this is durable either way; a failed compaction (the disk is
  // full or failing) keeps the old segments and is reported so the caller learns of it.
  Status MaybeCompact() {
    if (disk_->dead_bytes() <= std::max(bytes_, compact_floor_)) return Status::Ok();
    return disk_->Compact();
  }

  std::unique_ptr<DiskTier> disk_;
  uint64_t capacity_;
  uint64_t compact_floor_;
  uint64_t bytes_ = 0;
  uint64_t evictions_ = 0;
  std::list<Hash128> lru_;  // front: most recent
  std::unordered_map<Hash128, std::pair<std::list<Hash128>::iterator, uint64_t>, Hash128Hasher> map_;
};

#if TESSERA_HAVE_REDIS
// ---- Redis -----------------------------------------------------------------------------------

// A Redis server (RedisTier) or a Redis Cluster (RedisClusterTier): the same verified values.
template <typename Client>
class RedisAdapter final : public Tier {
 public:
  RedisAdapter(std::unique_ptr<Client> client, std::string_view name) : redis_(std::move(client)), name_(name) {}
  std::string_view name() const override { return name_; }
  bool in_memory() const override { return false; }
  bool persistent() const override { return true; }
  bool shared() const override { return true; }  // a fleet's server: one writer per block
  Status PutBatch(std::span<const TierRecord* const> records) override {
    std::vector<TierRecord> copy;
    copy.reserve(records.size());
    uint64_t bytes = 0;
    for (const TierRecord* r : records) {
      copy.push_back(*r);
      bytes += r->payload.size();
    }
    TESSERA_RETURN_IF_ERROR(redis_->PutBatch(copy));
    written_ += records.size();
    written_bytes_ += bytes;
    return Status::Ok();
  }
  std::vector<std::optional<TierRecord>> GetBatch(std::span<const Hash128> keys) override {
    std::vector<std::optional<TierRecord>> out(keys.size());
    std::vector<Hash128> ask;
    std::vector<size_t> where;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = prefetched_.find(keys[i]);
      if (it != prefetched_.end()) {
        out[i] = std::move(it->second);
        prefetched_.erase(it);
      } else {
        ask.push_back(keys[i]);
        where.push_back(i);
      }
    }
    if (!ask.empty()) {
      std::vector<std::optional<TierRecord>> got = redis_->GetBatch(ask);
      for (size_t j = 0; j < got.size(); ++j) out[where[j]] = std::move(got[j]);
    }
    return out;
  }
  // One pipelined round trip that keeps the values for the GetBatch that follows a hit.
  std::vector<bool> ContainsBatch(std::span<const Hash128> keys) override {
    prefetched_.clear();
    std::vector<std::optional<TierRecord>> got = redis_->GetBatch(keys);
    std::vector<bool> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      out[i] = got[i].has_value();
      if (got[i]) prefetched_[keys[i]] = std::move(*got[i]);
    }
    return out;
  }
  Status EraseBatch(std::span<const Hash128> keys) override { return redis_->EraseBatch(keys); }
  std::vector<Hash128> Keys() const override { return {}; }
  Status Quarantine(const Hash128& key, const std::string&) override {
    prefetched_.erase(key);
    return redis_->EraseBatch(std::span<const Hash128>(&key, 1));
  }
  // records, bytes: what this process wrote (the server's LRU may have dropped some since).
  TierCounters counters() const override { return {written_, written_bytes_, 0, 0, redis_->stats().verify_failures}; }

 private:
  std::unique_ptr<Client> redis_;
  std::string_view name_;
  uint64_t written_ = 0;
  uint64_t written_bytes_ = 0;  // payload bytes of the records written
  std::unordered_map<Hash128, TierRecord, Hash128Hasher> prefetched_;
};

#endif  // TESSERA_HAVE_REDIS

}  // namespace

std::unique_ptr<Tier> MakeHostTier(uint64_t capacity_bytes) {
  return std::make_unique<HostTierAdapter>(capacity_bytes);
}

Result<std::unique_ptr<Tier>> MakeDiskTier(const DiskTierOptions& options, uint64_t capacity_bytes) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<DiskTier> disk, DiskTier::Open(options));
  return std::unique_ptr<Tier>(
      std::make_unique<DiskTierAdapter>(std::move(disk), capacity_bytes, options.segment_bytes));
}

#if TESSERA_HAVE_REDIS
Result<std::unique_ptr<Tier>> MakeRedisTier(const RedisTierOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<RedisTier> redis, RedisTier::Open(options));
  return std::unique_ptr<Tier>(std::make_unique<RedisAdapter<RedisTier>>(std::move(redis), "redis"));
}

Result<std::unique_ptr<Tier>> MakeRedisClusterTier(const RedisClusterOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<RedisClusterTier> cluster, RedisClusterTier::Open(options));
  return std::unique_ptr<Tier>(std::make_unique<RedisAdapter<RedisClusterTier>>(std::move(cluster), "redis-cluster"));
}
#else
// Configured without Redis (TESSERA_WITH_REDIS=OFF): the tiers are declared, not built.
Result<std::unique_ptr<Tier>> MakeRedisTier(const RedisTierOptions&) {
  return FailedPrecondition("redis", "this build has no Redis tier (TESSERA_WITH_REDIS=OFF)");
}

Result<std::unique_ptr<Tier>> MakeRedisClusterTier(const RedisClusterOptions&) {
  return FailedPrecondition("redis", "this build has no Redis tier (TESSERA_WITH_REDIS=OFF)");
}
#endif

}  // namespace tessera

#include "tessera/tiered_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <list>
#include <random>

#include <xxhash.h>

namespace tessera {

namespace {

constexpr uint32_t kRecordMagic = 0x52425354;  // "TSBR"
constexpr uint16_t kRecordVersion = 2;
constexpr size_t kFixedHeader = 104;
constexpr size_t kDataAlign = 64;

size_t DataOffset(uint32_t block_tokens) {
  size_t end = kFixedHeader + size_t{block_tokens} * sizeof(uint32_t);
  return (end + kDataAlign - 1) / kDataAlign * kDataAlign;
}

template <typename T>
void Put(std::vector<std::byte>& out, size_t off, T v) {
  std::memcpy(out.data() + off, &v, sizeof v);
}
template <typename T>
T Read(std::span<const std::byte> in, size_t off) {
  T v;
  std::memcpy(&v, in.data() + off, sizeof v);
  return v;
}

// ---- Host ------------------------------------------------------------------------------------

class HostTierAdapter final : public Tier {
 public:
  explicit HostTierAdapter(uint64_t capacity) : host_(capacity), capacity_(capacity) {
    host_.SetEvictionListener([this](const Hash128& key, uint16_t format_id, std::span<const std::byte> payload) {
      if (!on_evict_) return;
      DiskRecord r{key, format_id, {payload.begin(), payload.end()}};
      on_evict_(r);
    });
  }
  std::string_view name() const override { return "host"; }
  bool in_memory() const override { return true; }
  bool persistent() const override { return false; }
  Status PutBatch(std::span<const DiskRecord* const> records) override {
    for (const DiskRecord* r : records) TESSERA_RETURN_IF_ERROR(host_.Put(r->key, r->format_id, r->payload));
    return Status::Ok();
  }
  std::vector<std::optional<DiskRecord>> GetBatch(std::span<const Hash128> keys) override {
    std::vector<std::optional<DiskRecord>> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!host_.Contains(keys[i])) continue;
      uint16_t format_id = 0;
      Result<std::vector<std::byte>> got = host_.Get(keys[i], &format_id);
      if (got.ok()) out[i] = DiskRecord{keys[i], format_id, std::move(got).value()};
    }
    return out;
  }
  std::vector<bool> ContainsBatch(std::span<const Hash128> keys) override {
    std::vector<bool> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) out[i] = host_.Contains(keys[i]);
    return out;
  }
  Status EraseBatch(std::span<const Hash128> keys) override {
    for (const Hash128& k : keys) host_.Erase(k);
    return Status::Ok();
  }
  std::vector<Hash128> Keys() const override { return host_.Keys(); }
  void Quarantine(const Hash128& key, const std::string&) override { host_.Erase(key); }
  TierCounters counters() const override {
    HostTierStats s = host_.stats();
    return {s.records, s.bytes, capacity_, s.evictions, s.quarantined};
  }

 private:
  HostTier host_;
  uint64_t capacity_;
};

// ---- Disk ------------------------------------------------------------------------------------

class DiskTierAdapter final : public Tier {
 public:
  DiskTierAdapter(std::unique_ptr<DiskTier> disk, uint64_t capacity) : disk_(std::move(disk)), capacity_(capacity) {
    for (const auto& [key, len] : disk_->Keys()) Touch(key, len);  // oldest first: ends least recent
  }
  std::string_view name() const override { return "disk"; }
  bool in_memory() const override { return false; }
  bool persistent() const override { return true; }

  Status PutBatch(std::span<const DiskRecord* const> records) override {
    std::vector<const DiskRecord*> admit;
    uint64_t incoming = 0;
    for (const DiskRecord* r : records) {
      if (capacity_ > 0 && r->payload.size() > capacity_) {  // larger than the whole tier: passed on down
        if (on_evict_) on_evict_(*r);
        continue;
      }
      admit.push_back(r);
      incoming += r->payload.size();
    }
    if (capacity_ > 0) {
      while (!lru_.empty() && bytes_ + incoming > capacity_) EvictOne();
    }
    TESSERA_RETURN_IF_ERROR(disk_->PutBatch(std::span<const DiskRecord* const>(admit)));
    for (const DiskRecord* r : admit) Touch(r->key, r->payload.size());
    // A batch larger than the room left: its oldest records go on down at once.
    if (capacity_ > 0) {
      while (!lru_.empty() && bytes_ > capacity_) EvictOne();
    }
    return Status::Ok();
  }
  std::vector<std::optional<DiskRecord>> GetBatch(std::span<const Hash128> keys) override {
    std::vector<std::optional<DiskRecord>> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!disk_->Contains(keys[i])) continue;
      Result<DiskRecord> r = disk_->Get(keys[i]);
      if (r.ok()) {
        Touch(keys[i], r.value().payload.size());
        out[i] = std::move(r).value();
      } else {
        Forget(keys[i]);  // quarantined by the disk tier (kDataLoss)
      }
    }
    return out;
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
    return Status::Ok();
  }
  std::vector<Hash128> Keys() const override {
    std::vector<Hash128> keys;
    keys.reserve(lru_.size());
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) keys.push_back(*it);
    return keys;
  }
  void Quarantine(const Hash128& key, const std::string& why) override {
    (void)disk_->QuarantineKey(key, why);
    Forget(key);
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
  void EvictOne() {
    Hash128 victim = lru_.back();
    if (on_evict_) {
      Result<DiskRecord> r = disk_->Get(victim);
      if (r.ok()) on_evict_(r.value());
    }
    (void)disk_->Erase(victim);
    Forget(victim);
    ++evictions_;
  }

  std::unique_ptr<DiskTier> disk_;
  uint64_t capacity_;
  uint64_t bytes_ = 0;
  uint64_t evictions_ = 0;
  std::list<Hash128> lru_;  // front: most recent
  std::unordered_map<Hash128, std::pair<std::list<Hash128>::iterator, uint64_t>, Hash128Hasher> map_;
};

// ---- Redis -----------------------------------------------------------------------------------

// A Redis server (RedisTier) or a Redis Cluster (RedisClusterTier): the same verified values.
template <typename Client>
class RedisAdapter final : public Tier {
 public:
  RedisAdapter(std::unique_ptr<Client> client, std::string_view name) : redis_(std::move(client)), name_(name) {}
  std::string_view name() const override { return name_; }
  bool in_memory() const override { return false; }
  bool persistent() const override { return true; }
  Status PutBatch(std::span<const DiskRecord* const> records) override {
    std::vector<DiskRecord> copy;
    copy.reserve(records.size());
    for (const DiskRecord* r : records) copy.push_back(*r);
    TESSERA_RETURN_IF_ERROR(redis_->PutBatch(copy));
    written_ += records.size();
    return Status::Ok();
  }
  std::vector<std::optional<DiskRecord>> GetBatch(std::span<const Hash128> keys) override {
    std::vector<std::optional<DiskRecord>> out(keys.size());
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
      std::vector<std::optional<DiskRecord>> got = redis_->GetBatch(ask);
      for (size_t j = 0; j < got.size(); ++j) out[where[j]] = std::move(got[j]);
    }
    return out;
  }
  // One pipelined round trip that keeps the values for the GetBatch that follows a hit.
  std::vector<bool> ContainsBatch(std::span<const Hash128> keys) override {
    prefetched_.clear();
    std::vector<std::optional<DiskRecord>> got = redis_->GetBatch(keys);
    std::vector<bool> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      out[i] = got[i].has_value();
      if (got[i]) prefetched_[keys[i]] = std::move(*got[i]);
    }
    return out;
  }
  Status EraseBatch(std::span<const Hash128> keys) override { return redis_->EraseBatch(keys); }
  std::vector<Hash128> Keys() const override { return {}; }
  void Quarantine(const Hash128& key, const std::string&) override {
    prefetched_.erase(key);
    (void)redis_->EraseBatch(std::span<const Hash128>(&key, 1));
  }
  TierCounters counters() const override { return {written_, 0, 0, 0, redis_->stats().verify_failures}; }

 private:
  std::unique_ptr<Client> redis_;
  std::string_view name_;
  uint64_t written_ = 0;
  std::unordered_map<Hash128, DiskRecord, Hash128Hasher> prefetched_;
};

}  // namespace

std::unique_ptr<Tier> MakeHostTier(uint64_t capacity_bytes) {
  return std::make_unique<HostTierAdapter>(capacity_bytes);
}

Result<std::unique_ptr<Tier>> MakeDiskTier(const DiskTierOptions& options, uint64_t capacity_bytes) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<DiskTier> disk, DiskTier::Open(options));
  return std::unique_ptr<Tier>(std::make_unique<DiskTierAdapter>(std::move(disk), capacity_bytes));
}

Result<std::unique_ptr<Tier>> MakeRedisTier(const RedisTierOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<RedisTier> redis, RedisTier::Open(options));
  return std::unique_ptr<Tier>(std::make_unique<RedisAdapter<RedisTier>>(std::move(redis), "redis"));
}

Result<std::unique_ptr<Tier>> MakeRedisClusterTier(const RedisClusterOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<RedisClusterTier> cluster, RedisClusterTier::Open(options));
  return std::unique_ptr<Tier>(std::make_unique<RedisAdapter<RedisClusterTier>>(std::move(cluster), "redis-cluster"));
}

Result<WritePolicy> ParseWritePolicy(std::string_view name) {
  if (name == "write-back") return WritePolicy::kWriteBack;
  if (name == "write-through") return WritePolicy::kWriteThrough;
  return InvalidArgument("write-policy",
                         "unknown policy \"" + std::string(name) + "\" (known: write-back, write-through)");
}

// ---- Block records ---------------------------------------------------------------------------

BlockRecordInfo BlockRecordInfoOf(const BlockPool& pool) {
  BlockRecordInfo info;
  info.block_tokens = pool.block_tokens();
  info.groups = static_cast<uint32_t>(pool.groups().size());
  info.page_bytes = pool.block_bytes();
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  auto add = [&](const void* p, size_t n) { XXH3_64bits_update(st, p, n); };
  add(&info.block_tokens, sizeof info.block_tokens);
  for (const PoolGroup& g : pool.groups()) {
    add(g.name.data(), g.name.size() + 1);
    add(g.format.name.data(), g.format.name.size() + 1);
    add(&g.layers, sizeof g.layers);
    add(&g.page.page_bytes, sizeof g.page.page_bytes);
    add(&g.page.record_bytes, sizeof g.page.record_bytes);
    add(&g.page.entries_per_block, sizeof g.page.entries_per_block);
  }
  info.fingerprint = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return info;
}

std::vector<std::byte> EncodeBlockRecord(const BlockRecordInfo& info, const BlockPool& pool, BlockId b,
                                         const SealedIdentity& id) {
  const size_t data = DataOffset(info.block_tokens);
  std::vector<std::byte> out(data + info.page_bytes + id.state.size());
  Put(out, 0, kRecordMagic);
  Put(out, 4, kRecordVersion);
  Put(out, 8, info.block_tokens);
  Put(out, 12, info.groups);
  Put(out, 16, info.fingerprint);
  Put(out, 24, id.domain);
  Put(out, 32, id.salt);
  Put(out, 40, id.key);
  Put(out, 56, id.parent_key);
  Put(out, 72, id.cache_identity);
  Put(out, 88, info.page_bytes);
  Put(out, 96, static_cast<uint64_t>(id.state.size()));
  std::memcpy(out.data() + kFixedHeader, id.tokens.data(), id.tokens.size_bytes());
  size_t off = data;
  for (uint32_t g = 0; g < info.groups; ++g) {
    std::span<const std::byte> bytes = pool.Bytes(pool.BlockHandleOf(b, g));
    std::memcpy(out.data() + off, bytes.data(), bytes.size());
    off += bytes.size();
  }
  if (!id.state.empty()) std::memcpy(out.data() + off, id.state.data(), id.state.size());
  return out;
}

Result<BlockRecordView> CheckBlockRecord(const BlockRecordInfo& info, std::span<const std::byte> payload,
                                         const ChainLink& link) {
  const size_t data = DataOffset(info.block_tokens);
  if (payload.size() < data + info.page_bytes) {
    return Status(
        StatusCode::kDataLoss, "record",
        "length " + std::to_string(payload.size()) + ", expected at least " + std::to_string(data + info.page_bytes));
  }
  const uint64_t state_bytes = Read<uint64_t>(payload, 96);
  if (state_bytes != payload.size() - data - info.page_bytes) {
    return Status(
        StatusCode::kDataLoss, "record",
        "length " + std::to_string(payload.size()) + " does not match its state length " + std::to_string(state_bytes));
  }
  if (Read<uint32_t>(payload, 0) != kRecordMagic || Read<uint16_t>(payload, 4) != kRecordVersion) {
    return Status(StatusCode::kDataLoss, "record", "not a block record of version 2");
  }
  if (Read<uint32_t>(payload, 8) != info.block_tokens || Read<uint32_t>(payload, 12) != info.groups ||
      Read<uint64_t>(payload, 16) != info.fingerprint || Read<uint64_t>(payload, 88) != info.page_bytes) {
    return Status(StatusCode::kDataLoss, "record", "another block layout (model, format or block size)");
  }
  if (Read<Hash128>(payload, 72) != link.cache_identity) {
    return Status(StatusCode::kDataLoss, "record", "another cache identity (model config, weights or layout)");
  }
  if (Read<Hash128>(payload, 40) != link.key) return Status(StatusCode::kDataLoss, "record", "prefix key differs");
  if (Read<Hash128>(payload, 56) != link.parent_key) {
    return Status(StatusCode::kDataLoss, "record", "parent key differs");
  }
  if (Read<uint32_t>(payload, 24) != link.domain || Read<uint64_t>(payload, 32) != link.salt) {
    return Status(StatusCode::kDataLoss, "record", "tenant domain or salt differs");
  }
  if (link.tokens.size() != info.block_tokens ||
      std::memcmp(payload.data() + kFixedHeader, link.tokens.data(), link.tokens.size_bytes()) != 0) {
    return Status(StatusCode::kDataLoss, "record", "stored tokens differ from the prompt's");
  }
  return BlockRecordView{payload.subspan(data, info.page_bytes), payload.subspan(data + info.page_bytes)};
}

// ---- The store -------------------------------------------------------------------------------

Result<std::unique_ptr<TieredStore>> TieredStore::Create(const BlockPool& pool, TieredStoreOptions options,
                                                         std::vector<std::unique_ptr<Tier>> tiers) {
  if (tiers.empty()) return InvalidArgument("tiers", "a tiered store needs at least one tier");
  if (options.batch_records == 0) return InvalidArgument("batch-records", "must be at least 1");
  std::unique_ptr<TieredStore> s(new TieredStore());
  s->options_ = options;
  s->info_ = BlockRecordInfoOf(pool);
  s->format_id_ = static_cast<uint16_t>(s->info_.fingerprint & 0xffff);
  TieredStore* self = s.get();
  for (size_t t = 0; t < tiers.size(); ++t) {
    auto slot = std::make_unique<Slot>();
    slot->tier = std::move(tiers[t]);
    slot->tier->SetEvictionListener(
        [self, t](const DiskRecord& r) { self->Demote(t + 1, std::make_shared<const DiskRecord>(r)); });
    s->tiers_.push_back(std::move(slot));
  }
  s->open_batch_.resize(s->tiers_.size());
  s->open_through_.resize(s->tiers_.size());
  s->stats_.hits_per_tier.assign(s->tiers_.size(), 0);
  if (options.asynchronous) s->worker_ = std::thread([self] { self->Worker(); });
  return s;
}

TieredStore::~TieredStore() {
  Flush();
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stop_ = true;
  }
  queue_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::optional<size_t> TieredStore::WriteThroughTier() const {
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (tiers_[t]->tier->persistent()) return t;
  }
  return std::nullopt;
}

void TieredStore::OnSealed(const BlockPool& pool, BlockId b, const SealedIdentity& id) {
  if (options_.write == WritePolicy::kWriteThrough) OnCheckpoint(pool, b, id);
}

void TieredStore::OnCheckpoint(const BlockPool& pool, BlockId b, const SealedIdentity& id) {
  std::optional<size_t> t = WriteThroughTier();
  if (t) Demote(*t, RecordOf(pool, b, id), /*through=*/true);
}

std::shared_ptr<const DiskRecord> TieredStore::RecordOf(const BlockPool& pool, BlockId b,
                                                        const SealedIdentity& id) const {
  return std::make_shared<const DiskRecord>(DiskRecord{id.key, format_id_, EncodeBlockRecord(info_, pool, b, id)});
}

void TieredStore::BeginCheckpoint() {
  std::lock_guard<std::mutex> lock(stats_mu_);
  refused_at_checkpoint_ = stats_.through_refused;
}

Status TieredStore::FinishCheckpoint() {
  std::optional<size_t> persistent = WriteThroughTier();
  if (!persistent) return IoError("tier", "no persistent tier to checkpoint into");
  for (size_t t = 0; t < *persistent; ++t) {
    if (!tiers_[t]->tier->in_memory()) continue;
    std::vector<std::optional<DiskRecord>> records;
    {
      std::lock_guard<std::mutex> lock(tiers_[t]->mu);
      const std::vector<Hash128> keys = tiers_[t]->tier->Keys();
      records = tiers_[t]->tier->GetBatch(keys);
    }
    for (std::optional<DiskRecord>& r : records) {
      if (r) Demote(*persistent, std::make_shared<const DiskRecord>(std::move(*r)), /*through=*/true);
    }
  }
  Flush();
  std::lock_guard<std::mutex> lock(stats_mu_);
  if (stats_.through_refused > refused_at_checkpoint_) {
    return IoError("tier", std::to_string(stats_.through_refused - refused_at_checkpoint_) +
                               " records of the checkpoint were refused by the persistent tier (" + stats_.last_error +
                               ")");
  }
  return Status::Ok();
}

void TieredStore::OnEvicted(const BlockPool& pool, BlockId b, const SealedIdentity& id) {
  // Under write-through the persistent tier has the block already; only a memory tier above it
  // admits it.
  if (options_.write == WritePolicy::kWriteThrough && !tiers_[0]->tier->in_memory()) return;
  Demote(0, RecordOf(pool, b, id));
}

void TieredStore::Demote(size_t t, std::shared_ptr<const DiskRecord> r, bool through) {
  if (t >= tiers_.size()) return;  // below the last tier: dropped
  if (tiers_[t]->tier->in_memory() || !options_.asynchronous) {
    Job job{t, {std::move(r)}, through};
    WriteJob(job);
    return;
  }
  std::lock_guard<std::mutex> lock(queue_mu_);
  pending_[r->key] = Pending{r, t};
  auto& batch = through ? open_through_[t] : open_batch_[t];
  batch.push_back(std::move(r));
  if (batch.size() >= options_.batch_records) SubmitLocked(t);
}

void TieredStore::SubmitLocked(size_t t) {
  for (bool through : {false, true}) {
    auto& batch = through ? open_through_[t] : open_batch_[t];
    if (batch.empty()) continue;
    jobs_.push_back(Job{t, std::move(batch), through});
    batch.clear();
    queue_cv_.notify_one();
  }
}

void TieredStore::WriteJob(Job& job) {
  Slot& slot = *tiers_[job.tier];
  std::vector<std::shared_ptr<const DiskRecord>> failed;
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    std::vector<Hash128> keys;
    keys.reserve(job.records.size());
    for (const auto& r : job.records) keys.push_back(r->key);
    // A tier never admits a key it holds (a block promoted from it and evicted again).
    std::vector<bool> held = slot.tier->ContainsBatch(keys);
    std::vector<const DiskRecord*> admit;
    for (size_t i = 0; i < job.records.size(); ++i) {
      if (!held[i]) admit.push_back(job.records[i].get());
    }
    Status st = admit.empty() ? Status::Ok() : slot.tier->PutBatch(admit);
    if (st.ok()) {
      std::lock_guard<std::mutex> s(stats_mu_);
      (job.through ? stats_.written_through : stats_.demoted) += admit.size();
    } else {
      std::lock_guard<std::mutex> s(stats_mu_);
      ++stats_.write_errors;
      stats_.last_error = std::string(slot.tier->name()) + ": " + st.ToString();
      for (size_t i = 0; i < job.records.size(); ++i) {
        if (!held[i]) failed.push_back(job.records[i]);
      }
      if (job.through) stats_.through_refused += failed.size();
    }
  }
  // What a tier could not take goes one level lower (a full disk still has Redis below).
  for (auto& r : failed) Demote(job.tier + 1, std::move(r));
}

void TieredStore::Worker() {
  std::unique_lock<std::mutex> lock(queue_mu_);
  for (;;) {
    queue_cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stop_ and nothing left
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    busy_ = true;
    lock.unlock();
    WriteJob(job);
    lock.lock();
    for (const auto& r : job.records) {
      auto it = pending_.find(r->key);
      // Not when the record was passed on to a lower tier (a refused write) and waits there.
      if (it != pending_.end() && it->second.record == r && it->second.tier == job.tier) pending_.erase(it);
    }
    busy_ = false;
    {
      std::lock_guard<std::mutex> s(stats_mu_);
      ++stats_.batches;
    }
    idle_cv_.notify_all();
  }
}

void TieredStore::Flush() {
  std::unique_lock<std::mutex> lock(queue_mu_);
  for (;;) {
    for (size_t t = 0; t < open_batch_.size(); ++t) SubmitLocked(t);
    if (!worker_.joinable()) {
      // Synchronous mode never queues; nothing to wait for.
      return;
    }
    idle_cv_.wait(lock, [this] { return jobs_.empty() && !busy_; });
    bool more = false;
    for (const auto& b : open_batch_) more = more || !b.empty();
    for (const auto& b : open_through_) more = more || !b.empty();
    if (!more) return;  // a batch written may have demoted records into a lower open batch
  }
}

void TieredStore::SearchTopDown(
    std::span<const ChainLink> links, const std::function<bool(size_t)>& resolved,
    const std::function<void(Tier&, size_t, std::span<const Hash128>, std::span<const size_t>)>& ask) const {
  for (size_t t = 0; t < tiers_.size(); ++t) {
    std::vector<Hash128> keys;
    std::vector<size_t> where;
    for (size_t i = 0; i < links.size(); ++i) {
      if (!resolved(i)) {
        keys.push_back(links[i].key);
        where.push_back(i);
      }
    }
    if (keys.empty()) return;
    std::lock_guard<std::mutex> lock(tiers_[t]->mu);
    ask(*tiers_[t]->tier, t, keys, where);
  }
}

size_t TieredStore::Probe(std::span<const ChainLink> links) {
  const size_t n = links.size();
  std::vector<bool> found(n, false);
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    for (size_t i = 0; i < n; ++i) found[i] = pending_.count(links[i].key) > 0;
  }
  SearchTopDown(
      links, [&](size_t i) { return found[i]; },
      [&](Tier& tier, size_t, std::span<const Hash128> keys, std::span<const size_t> where) {
        std::vector<bool> held = tier.ContainsBatch(keys);
        for (size_t j = 0; j < held.size(); ++j) found[where[j]] = found[where[j]] || held[j];
      });
  size_t run = 0;
  while (run < n && found[run]) ++run;
  return run;
}

size_t TieredStore::Fetch(const BlockPool& pool, std::span<const ChainLink> links, std::span<const BlockId> blocks,
                          std::vector<std::vector<std::byte>>* states) {
  if (states != nullptr) states->clear();
  const size_t n = std::min(links.size(), blocks.size());
  std::vector<std::shared_ptr<const DiskRecord>> found(n);
  std::vector<size_t> from(n, SIZE_MAX);
  std::vector<bool> queued(n, false);
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    for (size_t i = 0; i < n; ++i) {
      auto it = pending_.find(links[i].key);
      if (it != pending_.end()) {
        found[i] = it->second.record;
        from[i] = it->second.tier;
        queued[i] = true;
      }
    }
  }
  SearchTopDown(
      links.first(n), [&](size_t i) { return found[i] != nullptr; },
      [&](Tier& tier, size_t t, std::span<const Hash128> keys, std::span<const size_t> where) {
        std::vector<std::optional<DiskRecord>> got = tier.GetBatch(keys);
        for (size_t j = 0; j < got.size(); ++j) {
          if (got[j]) {
            found[where[j]] = std::make_shared<const DiskRecord>(std::move(*got[j]));
            from[where[j]] = t;
          }
        }
      });
  size_t done = 0;
  for (; done < n; ++done) {
    if (!found[done]) break;
    const DiskRecord& r = *found[done];
    Result<BlockRecordView> page =
        r.format_id == format_id_
            ? CheckBlockRecord(info_, r.payload, links[done])
            : Result<BlockRecordView>(Status(StatusCode::kDataLoss, "record", "record-format id differs"));
    if (!page.ok()) {
      {
        std::lock_guard<std::mutex> lock(stats_mu_);
        ++stats_.verify_failures;
        stats_.last_error = "verify: " + page.status().ToString();
      }
      if (!queued[done]) {  // a queued record is this process's own copy: nothing to take out
        std::lock_guard<std::mutex> lock(tiers_[from[done]]->mu);
        tiers_[from[done]]->tier->Quarantine(r.key, page.status().message());
      }
      break;
    }
    size_t off = 0;
    for (uint32_t g = 0; g < pool.groups().size(); ++g) {
      std::span<std::byte> to = pool.Bytes(pool.BlockHandleOf(blocks[done], g));
      std::memcpy(to.data(), page.value().pages.data() + off, to.size());
      off += to.size();
    }
    if (states != nullptr) states->emplace_back(page.value().state.begin(), page.value().state.end());
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.tier_hits;
    ++stats_.hits_per_tier[from[done]];
    if (queued[done]) ++stats_.queued_hits;
  }
  return done;
}

TieredStoreStats TieredStore::stats() const {
  TieredStoreStats s;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    s = stats_;
  }
  std::lock_guard<std::mutex> lock(queue_mu_);
  s.pending = pending_.size();
  return s;
}

std::vector<MetricFamily> TieredStore::CollectMetrics() const {
  const TieredStoreStats st = stats();
  std::vector<MetricFamily> f = {
      {"tessera_tier_demotions_total", "Records a tier admitted from the level above.", "counter", {{"", st.demoted}}},
      {"tessera_tier_written_through_total",
       "Sealed blocks written to the persistent tier at seal or at a checkpoint.",
       "counter",
       {{"", st.written_through}}},
      {"tessera_tier_queued_promotions_total",
       "Blocks promoted while their record still waited for its write.",
       "counter",
       {{"", st.queued_hits}}},
      {"tessera_tier_verify_failures_total",
       "Records refused by the store's identity checks (quarantined, never served).",
       "counter",
       {{"", st.verify_failures}}},
      {"tessera_tier_write_errors_total",
       "Batch writes a tier refused (e.g. a full disk).",
       "counter",
       {{"", st.write_errors}}},
      {"tessera_tier_batches_total", "Asynchronous write batches completed.", "counter", {{"", st.batches}}},
      {"tessera_tier_pending_records", "Records queued for a write.", "gauge", {{"", st.pending}}},
  };
  MetricFamily hits{"tessera_tier_promotions_total",
                    "Blocks promoted into the pool after verification, by the tier that held them.",
                    "counter",
                    {}};
  MetricFamily records{"tessera_tier_records", "Records held per tier (Redis: written by this process).", "gauge", {}};
  MetricFamily bytes{"tessera_tier_bytes", "Payload bytes held per tier.", "gauge", {}};
  MetricFamily evictions{"tessera_tier_evictions_total", "Records a tier evicted for space.", "counter", {}};
  MetricFamily quarantined{
      "tessera_tier_quarantined_total", "Records that failed a tier's own checksum (never served).", "counter", {}};
  for (size_t i = 0; i < tiers_.size(); ++i) {
    const std::string label = "tier=\"" + std::string(tiers_[i]->tier->name()) + "\"";
    const TierCounters c = tier_counters(i);
    hits.samples.emplace_back(label, st.hits_per_tier[i]);
    records.samples.emplace_back(label, c.records);
    bytes.samples.emplace_back(label, c.bytes);
    evictions.samples.emplace_back(label, c.evictions);
    quarantined.samples.emplace_back(label, c.quarantined);
  }
  for (MetricFamily* m : {&hits, &records, &bytes, &evictions, &quarantined}) f.push_back(std::move(*m));
  return f;
}

TierCounters TieredStore::tier_counters(size_t i) const {
  std::lock_guard<std::mutex> lock(tiers_[i]->mu);
  return tiers_[i]->tier->counters();
}

}  // namespace tessera

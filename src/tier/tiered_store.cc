#include "tessera/tiered_store.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace tessera {

Result<WritePolicy> ParseWritePolicy(std::string_view name) {
  if (name == "write-back") return WritePolicy::kWriteBack;
  if (name == "write-through") return WritePolicy::kWriteThrough;
  return InvalidArgument("write-policy",
                         "unknown policy \"" + std::string(name) + "\" (known: write-back, write-through)");
}

uint32_t SingleWriterRank(const Hash128& key, uint32_t world) {
  if (world <= 1) return 0;
  // splitmix64's finalizer over both halves: prefix keys are keyed hashes already, but a mixed
  // value keeps the spread even for any key function (ADR 0023).
  uint64_t z = key.lo ^ (key.hi * 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<uint32_t>(z % world);
}

Result<std::unique_ptr<TieredStore>> TieredStore::Create(const BlockPool& pool, TieredStoreOptions options,
                                                         std::vector<std::unique_ptr<Tier>> tiers) {
  if (tiers.empty()) return InvalidArgument("tiers", "a tiered store needs at least one tier");
  if (options.batch_records == 0) return InvalidArgument("batch-records", "must be at least 1");
  if (options.tp_world == 0 || options.tp_world > kMaxTpWorld) {
    return InvalidArgument(
        "tp-world", "must be in [1, " + std::to_string(kMaxTpWorld) + "], got " + std::to_string(options.tp_world));
  }
  if (options.tp_rank >= options.tp_world) {
    return InvalidArgument("tp-rank", "must be below tp-world (" + std::to_string(options.tp_world) + "), got " +
                                          std::to_string(options.tp_rank));
  }
  return std::unique_ptr<TieredStore>(new TieredStore(pool, options, std::move(tiers)));
}

TieredStore::TieredStore(const BlockPool& pool, TieredStoreOptions options, std::vector<std::unique_ptr<Tier>> tiers)
    : options_(options), info_(BlockRecordInfoOf(pool)), format_id_(static_cast<uint16_t>(info_.fingerprint & 0xffff)) {
  for (size_t t = 0; t < tiers.size(); ++t) {
    // Runs inside tier t's PutBatch, under its mutex (the lock order's Slot t -> Slot t+1 / queue).
    tiers[t]->SetEvictionListener(
        [this, t](const TierRecord& r) { Demote(t + 1, std::make_shared<const TierRecord>(r)); });
    tiers_.push_back(std::make_unique<Slot>(std::move(tiers[t])));
  }
  // No lock: no other thread sees the store before the worker starts, below.
  open_batch_.resize(tiers_.size());
  open_through_.resize(tiers_.size());
  stats_.hits_per_tier.assign(tiers_.size(), 0);
  if (options_.asynchronous) worker_ = std::thread([this] { Worker(); });
}

TieredStore::~TieredStore() {
  Flush().IgnoreError();  // no one to tell here; a caller who must know has called Flush
  {
    MutexLock lock(queue_mu_);
    stop_ = true;
  }
  queue_cv_.NotifyAll();
  if (worker_.joinable()) worker_.join();
}

std::optional<size_t> TieredStore::WriteThroughTier() const {
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (tiers_[t]->persistent) return t;
  }
  return std::nullopt;
}

void TieredStore::OnSealed(const BlockPool& pool, BlockId b, const SealedIdentity& id) {
  if (options_.write == WritePolicy::kWriteThrough) OnCheckpoint(pool, b, id);
}

void TieredStore::OnCheckpoint(const BlockPool& pool, BlockId b, const SealedIdentity& id) {
  std::optional<size_t> t = WriteThroughTier();
  if (!t) return;
  // A rank that is not the block's writer at the shared tiers here skips them before it copies
  // the block into a record (as Demote would, without the copy when no tier below takes it).
  size_t first = *t;
  while (first < tiers_.size() && !WritesTo(first, id.key)) ++first;
  if (first != *t) {
    {
      MutexLock lock(stats_mu_);
      stats_.left_to_writer += first - *t;
    }
    if (first < tiers_.size()) Demote(first, RecordOf(pool, b, id));
    return;
  }
  Demote(*t, RecordOf(pool, b, id), /*through=*/true);
}

std::shared_ptr<const TierRecord> TieredStore::RecordOf(const BlockPool& pool, BlockId b,
                                                        const SealedIdentity& id) const {
  return std::make_shared<const TierRecord>(TierRecord{id.key, format_id_, EncodeBlockRecord(info_, pool, b, id)});
}

void TieredStore::BeginCheckpoint() {
  MutexLock lock(stats_mu_);
  refused_at_checkpoint_ = stats_.through_refused;
}

Status TieredStore::FinishCheckpoint() {
  std::optional<size_t> persistent = WriteThroughTier();
  if (!persistent) return IoError("tier", "no persistent tier to checkpoint into");
  for (size_t t = 0; t < *persistent; ++t) {
    Slot& slot = *tiers_[t];
    if (!slot.in_memory) continue;
    std::vector<std::optional<TierRecord>> records;
    {
      MutexLock lock(slot.mu);
      const std::vector<Hash128> keys = slot.tier->Keys();
      records = slot.tier->GetBatch(keys);
    }
    for (std::optional<TierRecord>& r : records) {
      if (r) Demote(*persistent, std::make_shared<const TierRecord>(std::move(*r)), /*through=*/true);
    }
  }
  Status flushed = Flush();
  {
    MutexLock lock(stats_mu_);
    if (stats_.through_refused > refused_at_checkpoint_) {
      return IoError("tier", std::to_string(stats_.through_refused - refused_at_checkpoint_) +
                                 " records of the checkpoint were refused by the persistent tier (" +
                                 stats_.last_error + ")");
    }
  }
  return flushed;
}

void TieredStore::OnEvicted(const BlockPool& pool, BlockId b, const SealedIdentity& id) {
  // Under write-through the persistent tier has the block already; only a memory tier above it
  // admits it.
  if (options_.write == WritePolicy::kWriteThrough && !tiers_[0]->in_memory) return;
  Demote(0, RecordOf(pool, b, id));
}

bool TieredStore::WritesTo(size_t t, const Hash128& key) const {
  return !tiers_[t]->shared || options_.tp_world == 1 || SingleWriterRank(key, options_.tp_world) == options_.tp_rank;
}

void TieredStore::Demote(size_t t, std::shared_ptr<const TierRecord> r, bool through) {
  if (t >= tiers_.size()) return;  // below the last tier: dropped
  if (!WritesTo(t, r->key)) {
    // Another rank writes this block here; this rank's identical record goes on as one the tier
    // could not take would (a demotion): nowhere, unless a tier below is private.
    {
      MutexLock lock(stats_mu_);
      ++stats_.left_to_writer;
    }
    Demote(t + 1, std::move(r));
    return;
  }
  if (tiers_[t]->in_memory || !options_.asynchronous) {
    Job job{t, {std::move(r)}, through};
    WriteJob(job);
    return;
  }
  MutexLock lock(queue_mu_);
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
    queue_cv_.NotifyOne();
  }
}

void TieredStore::WriteJob(Job& job) {
  Slot& slot = *tiers_[job.tier];
  const bool last = job.tier + 1 == tiers_.size();
  std::vector<std::shared_ptr<const TierRecord>> failed;
  {
    MutexLock lock(slot.mu);
    std::vector<Hash128> keys;
    keys.reserve(job.records.size());
    for (const auto& r : job.records) keys.push_back(r->key);
    // A tier never admits a key it holds (a block promoted from it and evicted again).
    std::vector<bool> held = slot.tier->ContainsBatch(keys);
    std::vector<const TierRecord*> admit;
    for (size_t i = 0; i < job.records.size(); ++i) {
      if (!held[i]) admit.push_back(job.records[i].get());
    }
    // May evict: the listener demotes into tier t+1 with this mu held (the documented order).
    Status st = admit.empty() ? Status::Ok() : slot.tier->PutBatch(admit);
    MutexLock s(stats_mu_);
    if (st.ok()) {
      (job.through ? stats_.written_through : stats_.demoted) += admit.size();
    } else {
      ++stats_.write_errors;
      stats_.last_error = std::string(slot.name) + ": " + st.ToString();
      for (size_t i = 0; i < job.records.size(); ++i) {
        if (!held[i]) failed.push_back(job.records[i]);
      }
      if (job.through) stats_.through_refused += failed.size();
      if (last) {  // nowhere lower to go: lost, and Flush says so
        stats_.dropped += failed.size();
        drop_error_ = stats_.last_error;
      }
    }
  }
  // What a tier could not take goes one level lower (a full disk still has Redis below).
  for (auto& r : failed) Demote(job.tier + 1, std::move(r));
}

void TieredStore::Worker() {
  for (;;) {
    Job job;
    {
      MutexLock lock(queue_mu_);
      while (!stop_ && jobs_.empty()) queue_cv_.Wait(queue_mu_);
      if (jobs_.empty()) return;  // stop_ and nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
      busy_ = true;
    }
    WriteJob(job);
    {
      MutexLock lock(queue_mu_);
      for (const auto& r : job.records) {
        auto it = pending_.find(r->key);
        // Not when the record was passed on to a lower tier (a refused write) and waits there.
        if (it != pending_.end() && it->second.record == r && it->second.tier == job.tier) pending_.erase(it);
      }
      busy_ = false;
      {
        MutexLock s(stats_mu_);
        ++stats_.batches;
      }
      idle_cv_.NotifyAll();
    }
  }
}

Status TieredStore::Flush() {
  if (options_.asynchronous) {
    MutexLock lock(queue_mu_);
    for (;;) {
      for (size_t t = 0; t < open_batch_.size(); ++t) SubmitLocked(t);
      while (!jobs_.empty() || busy_) idle_cv_.Wait(queue_mu_);
      bool more = false;
      for (const auto& b : open_batch_) more = more || !b.empty();
      for (const auto& b : open_through_) more = more || !b.empty();
      if (!more) break;  // a batch written may have demoted records into a lower open batch
    }
  }
  // Synchronous mode never queues: every write is done, its drops counted.
  MutexLock lock(stats_mu_);
  const uint64_t dropped = stats_.dropped - dropped_at_flush_;
  dropped_at_flush_ = stats_.dropped;
  if (dropped == 0) return Status::Ok();
  return IoError("tier", std::to_string(dropped) +
                             " records were dropped: a tier refused them and no tier below could take them (" +
                             drop_error_ + ")");
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
    Slot& slot = *tiers_[t];
    MutexLock lock(slot.mu);
    ask(*slot.tier, t, keys, where);
  }
}

size_t TieredStore::Probe(std::span<const ChainLink> links) {
  const size_t n = links.size();
  std::vector<bool> found(n, false);
  {
    MutexLock lock(queue_mu_);
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

Status TieredStore::ReadIntoBlock(size_t t, BlockPool& pool, const ChainLink& link, BlockId b,
                                  std::vector<std::byte>* state) {
  Slot& slot = *tiers_[t];
  Status check = Status::Ok();
  {
    MutexLock lock(slot.mu);
    const std::optional<uint64_t> len = slot.tier->PayloadSize(link.key);
    const size_t head_bytes = BlockRecordDataOffset(info_);
    if (!len || *len < head_bytes + info_.page_bytes) return NotFound("key", "not readable in place");
    std::vector<std::byte> head(head_bytes);
    state->resize(static_cast<size_t>(*len - head_bytes - info_.page_bytes));
    std::vector<std::span<std::byte>> out{head};
    for (uint32_t g = 0; g < pool.groups().size(); ++g) out.push_back(pool.MutableBytes(pool.BlockHandleOf(b, g)));
    out.emplace_back(*state);
    uint16_t format_id = 0;
    // A record that fails the tier's own check is a miss there (the tier dropped and counted it),
    // as through GetBatch: the tiers below are asked next.
    Status read = slot.tier->ReadInto(link.key, out, &format_id);
    if (!read.ok()) return NotFound("key", read.message());
    check = format_id != format_id_ ? DataLoss("record", "record-format id differs")
                                    : CheckBlockRecordHead(info_, head, *len, link);
    if (check.ok()) return check;
    Status q = slot.tier->Quarantine(link.key, check.message());
    if (!q.ok()) {
      MutexLock stats_lock(stats_mu_);  // stats_mu_ is acquired after Slot::mu
      ++stats_.quarantine_failures;
      stats_.last_error = "quarantine: " + q.ToString();
    }
  }
  MutexLock lock(stats_mu_);
  ++stats_.verify_failures;
  stats_.last_error = "verify: " + check.ToString();
  return DataLoss("record", check.message());
}

size_t TieredStore::FetchInPlace(BlockPool& pool, std::span<const ChainLink> links, std::span<const BlockId> blocks,
                                 std::span<const std::shared_ptr<const TierRecord>> queued, std::vector<size_t>& from,
                                 std::vector<bool>& direct, std::vector<std::vector<std::byte>>& states) {
  size_t stop = links.size();
  for (size_t i = 0; i < links.size() && stop == links.size(); ++i) {
    if (queued[i]) continue;
    for (size_t t = 0; t < tiers_.size() && !direct[i] && stop == links.size(); ++t) {
      Status st = ReadIntoBlock(t, pool, links[i], blocks[i], &states[i]);
      direct[i] = st.ok();
      if (st.ok()) from[i] = t;
      if (st.code() == StatusCode::kDataLoss) stop = i;
    }
    if (!direct[i]) break;
  }
  return stop;
}

size_t TieredStore::Fetch(BlockPool& pool, std::span<const ChainLink> links, std::span<const BlockId> blocks,
                          std::vector<std::vector<std::byte>>* states) {
  if (states != nullptr) states->clear();
  const size_t n = std::min(links.size(), blocks.size());
  std::vector<std::shared_ptr<const TierRecord>> found(n);
  std::vector<size_t> from(n, SIZE_MAX);
  std::vector<bool> queued(n, false);
  {
    MutexLock lock(queue_mu_);
    for (size_t i = 0; i < n; ++i) {
      auto it = pending_.find(links[i].key);
      if (it != pending_.end()) {
        found[i] = it->second.record;
        from[i] = it->second.tier;
        queued[i] = true;
      }
    }
  }
  std::vector<bool> direct(n, false);
  std::vector<std::vector<std::byte>> direct_states(n);
  const size_t stop = FetchInPlace(pool, links.first(n), blocks, found, from, direct, direct_states);
  SearchTopDown(
      links.first(n), [&](size_t i) { return found[i] != nullptr || direct[i] || i >= stop; },
      [&](Tier& tier, size_t t, std::span<const Hash128> keys, std::span<const size_t> where) {
        std::vector<std::optional<TierRecord>> got = tier.GetBatch(keys);
        for (size_t j = 0; j < got.size(); ++j) {
          if (got[j]) {
            found[where[j]] = std::make_shared<const TierRecord>(std::move(*got[j]));
            from[where[j]] = t;
          }
        }
      });
  size_t done = 0;
  for (; done < n; ++done) {
    if (direct[done]) {
      if (states != nullptr) states->push_back(std::move(direct_states[done]));
      MutexLock lock(stats_mu_);
      ++stats_.tier_hits;
      ++stats_.hits_per_tier[from[done]];
      continue;
    }
    if (!found[done]) break;
    const TierRecord& r = *found[done];
    Result<BlockRecordView> page = r.format_id == format_id_
                                       ? CheckBlockRecord(info_, r.payload, links[done])
                                       : Result<BlockRecordView>(DataLoss("record", "record-format id differs"));
    if (!page.ok()) {
      {
        MutexLock lock(stats_mu_);
        ++stats_.verify_failures;
        stats_.last_error = "verify: " + page.status().ToString();
      }
      if (!queued[done]) {  // a queued record is this process's own copy: nothing to take out
        Slot& slot = *tiers_[from[done]];
        MutexLock lock(slot.mu);
        Status q = slot.tier->Quarantine(r.key, page.status().message());
        if (!q.ok()) {
          MutexLock stats_lock(stats_mu_);  // stats_mu_ is acquired after Slot::mu
          ++stats_.quarantine_failures;
          stats_.last_error = "quarantine: " + q.ToString();
        }
      }
      break;
    }
    size_t off = 0;
    for (uint32_t g = 0; g < pool.groups().size(); ++g) {
      std::span<std::byte> to = pool.MutableBytes(pool.BlockHandleOf(blocks[done], g));
      std::memcpy(to.data(), page.value().pages.data() + off, to.size());
      off += to.size();
    }
    if (states != nullptr) states->emplace_back(page.value().state.begin(), page.value().state.end());
    MutexLock lock(stats_mu_);
    ++stats_.tier_hits;
    ++stats_.hits_per_tier[from[done]];
    if (queued[done]) ++stats_.queued_hits;
  }
  return done;
}

TieredStoreStats TieredStore::stats() const {
  TieredStoreStats s;
  {
    MutexLock lock(stats_mu_);
    s = stats_;
  }
  MutexLock lock(queue_mu_);
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
      {"tessera_tier_left_to_writer_total",
       "Shared-tier writes skipped because another tensor-parallel rank writes the block.",
       "counter",
       {{"", st.left_to_writer}}},
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
    const std::string label = "tier=\"" + std::string(tiers_[i]->name) + "\"";
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
  Slot& slot = *tiers_[i];
  MutexLock lock(slot.mu);
  return slot.tier->counters();
}

}  // namespace tessera

// The server's core: the manager, its KV writers (synthetic or the engine's), admit, step, free.
#include "tessera_tools/serve.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve_internal.h"
#include "serve_publisher.h"
#include "tessera/disk_tier.h"
#include "tessera/geometry.h"
#include "tessera/tier_adapters.h"

namespace tessera {

using namespace serve_detail;  // NOLINT(google-build-using-namespace): the files of one server

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

// The manager's options from the configuration (the prefix key is set by the caller).
ManagerOptions ManagerOptionsOf(const ServeConfig& config) {
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
  return mo;
}

}  // namespace

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
    TESSERA_ASSIGN_OR_RETURN(core->http_token_, LoadBearerToken(config.http_token_file, warnings));
  }
  ManagerOptions mo = ManagerOptionsOf(config);
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
  TESSERA_RETURN_IF_ERROR(core->PlanRecords());
  if (config.kv_engine && core->record_bytes_ == 0) {
    return InvalidArgument("kv_source", g.name + " has no per-token records for an engine to push");
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Tier>> tiers,
                           OpenTiers(config, secret, g.name, core->manager_->pool().groups()[0].format.name));
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

// The frame's token record: per-token groups in pool order, their layers in order.
Status ServeCore::PlanRecords() {
  const std::vector<PoolGroup>& groups = manager_->pool().groups();
  record_offset_.resize(groups.size());
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    record_offset_[gi].assign(groups[gi].layers, -1);
    if (groups[gi].page.compress_ratio != 1) continue;
    // The writer and the reads copy the planes back to back: they must tile the record.
    uint64_t planes = 0;
    for (uint32_t p = 0; p < groups[gi].format.plane_count(); ++p) planes += groups[gi].format.plane_bytes(p);
    if (planes != groups[gi].format.record_bytes()) {
      return Internal("kv_format", groups[gi].format.name + ": planes do not tile the record");
    }
    for (uint32_t l = 0; l < groups[gi].layers; ++l) {
      record_offset_[gi][l] = static_cast<int64_t>(record_bytes_);
      record_bytes_ += groups[gi].format.record_bytes();
    }
  }
  return Status::Ok();
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
  if (!a.ok() && a.status().code() == StatusCode::kOutOfBlocks && a.status().field() == "requests" &&
      config_.max_requests != kNoRequestLimit) {
    // The manager names its option (max-requests); the server's key is max_requests.
    a = OutOfBlocks("requests",
                    "all " + std::to_string(config_.max_requests) + " requests allowed by max_requests are live");
  }
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

namespace serve_detail {

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

}  // namespace serve_detail

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

}  // namespace tessera

#include "tessera_tools/simulate.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <unordered_map>

#include "tessera/checked.h"
#include "tessera/disk_tier.h"
#include "tessera/request_manager.h"
#include "tessera/tier_adapters.h"
#include "tessera/tier_key.h"
#include "tessera/units.h"
#include "tessera_tools/serve.h"

namespace tessera {

namespace {

constexpr uint32_t kVocab = 129280;  // DeepSeek-V3's vocabulary size
constexpr size_t kMaxSecurityEvents = 8;
// The pages the simulation may map: capacity x block bytes. The pool's memory is mapped up
// front and touched as blocks are written (and copied whole on copy-on-write), so an option that
// multiplies it (agents, capacity, block span) is bounded here rather than by the machine.
constexpr uint64_t kMaxPoolBytes = uint64_t{64} << 30;
// Tokens of every request of the workload together (each costs 12 B of host memory).
constexpr uint64_t kMaxWorkloadTokens = uint64_t{1} << 26;

// Bytes of one block over every paged cache, from a ledger of the same options (the pools take
// their page layouts from it).
Checked BlockBytes(const Ledger& probe) {
  Checked bytes(0);
  for (const CacheGroup& group : probe.groups) {
    if (group.in_pages) bytes += GroupBlockBytes(group.page, group.layers);
  }
  return bytes;
}

// Names the option that drove the pool past the bound: an explicit capacity, else an explicit
// block span, else the agent count the default capacity follows.
Status CheckPoolBytes(const Ledger& probe, uint64_t capacity_blocks, const AgentScenario& s) {
  Checked pool = BlockBytes(probe) * capacity_blocks;
  if (pool.overflowed() || pool.value() > kMaxPoolBytes) {
    const char* field = s.capacity_blocks > 0 ? "capacity-blocks" : s.block_tokens ? "block-tokens" : "agents";
    return OutOfRange(
        field, std::to_string(capacity_blocks) + " blocks of " + std::to_string(BlockBytes(probe).value()) +
                   " B exceed the " + std::to_string(kMaxPoolBytes) +
                   " B of pages a simulation maps (fewer agents, a smaller --capacity-blocks or --block-tokens)");
  }
  return Status::Ok();
}

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The synthetic KV of one record: a splitmix64 stream seeded by the prefix hash of the token,
// the group and the layer.
void FillRecord(uint64_t prefix_hash, uint32_t group, uint32_t layer, const RecordView& view) {
  uint64_t state = prefix_hash ^ (uint64_t{group} << 56) ^ (uint64_t{layer} * 0x100000001b3ULL);
  for (uint32_t p = 0; p < view.plane_count; ++p) {
    std::span<std::byte> out = view.planes[p];
    size_t i = 0;
    for (; i + 8 <= out.size(); i += 8) {
      uint64_t r = Mix(state++);
      std::memcpy(out.data() + i, &r, 8);
    }
    if (i < out.size()) {
      uint64_t r = Mix(state++);
      std::memcpy(out.data() + i, &r, out.size() - i);
    }
  }
}

bool CheckRecord(uint64_t prefix_hash, uint32_t group, uint32_t layer, const ConstRecordView& view,
                 std::vector<std::byte>& scratch) {
  RecordView expect;
  expect.plane_count = view.plane_count;
  size_t total = 0;
  for (uint32_t p = 0; p < view.plane_count; ++p) total += view.planes[p].size();
  scratch.resize(total);
  size_t off = 0;
  for (uint32_t p = 0; p < view.plane_count; ++p) {
    expect.planes[p] = std::span<std::byte>(scratch.data() + off, view.planes[p].size());
    off += view.planes[p].size();
  }
  FillRecord(prefix_hash, group, layer, expect);
  for (uint32_t p = 0; p < view.plane_count; ++p) {
    if (std::memcmp(expect.planes[p].data(), view.planes[p].data(), view.planes[p].size()) != 0) return false;
  }
  return true;
}

struct Agent {
  RequestId id;
  uint32_t tenant = 0;
  std::vector<uint32_t> tokens;       // every token the request holds, in order
  std::vector<uint64_t> prefix_hash;  // rolling hash of tokens[0..i]
  bool forked = false;
  bool live = false;
};

// One run of the scenario through one manager (a model with windows: under one strategy).
// DeepSeek-V4: synthetic rows that depend on the layer, the position and every token up to it.
uint64_t RowSeed(uint64_t prefix_hash, uint32_t layer, bool indexer) {
  return Mix(prefix_hash ^ (uint64_t{layer} << 20) ^ (indexer ? 1ULL << 40 : 0));
}
// Small integers, exact in float, so that column means are reproducible bit for bit.
float StateValue(uint64_t row_seed, size_t col) {
  return static_cast<float>(((row_seed + col * 0x9e3779b1ULL) >> 24) & 0xff);
}

// Checks the request's live window rows and a sample of its compressed entries (every entry of
// its last block span, every 8th before) against the functions that wrote them.
// A host tier (when asked) above a disk tier in `dir` (when given) above a Redis or Redis
// Cluster tier (when given).
Result<std::unique_ptr<TieredStore>> OpenSimulationStore(const Geometry& g, const BlockPool& pool,
                                                         const AgentScenario& s, const std::string& dir) {
  std::vector<std::unique_ptr<Tier>> tiers;
  if (s.host_tier_bytes > 0) tiers.push_back(MakeHostTier(s.host_tier_bytes));
  if (!dir.empty()) {
    DiskTierOptions disk;
    disk.dir = dir;
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Tier> d, MakeDiskTier(disk, 0));
    tiers.push_back(std::move(d));
  }
  if (!s.redis.empty() || !s.redis_cluster.empty()) {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Tier> r,
                             OpenReachableRedisTier(s.redis, s.redis_cluster, s.redis_secret, "tessera", g.name,
                                                    pool.groups()[0].format.name, 200));
    tiers.push_back(std::move(r));
  }
  TieredStoreOptions so;
  so.write = s.tier_write;
  return TieredStore::Create(pool, so, std::move(tiers));
}

TierRun CollectTierRun(TieredStore& store, uint64_t hit_tokens) {
  const Status flushed = store.Flush();  // not OK when records were dropped: say so first
  TieredStoreStats ts = store.stats();
  TierRun t;
  t.tier_hits = ts.tier_hits;
  t.tier_hit_tokens = hit_tokens;
  t.tier_verify_failures = ts.verify_failures;
  t.written = ts.written_through + ts.demoted;
  t.write_errors = ts.write_errors;
  t.last_error = flushed.ok() ? ts.last_error : flushed.ToString();
  for (size_t i = 0; i < store.tiers(); ++i) {
    if (store.tier_name(i) != "disk") continue;
    TierCounters disk = store.tier_counters(i);
    t.disk_records = disk.records;
    t.disk_quarantined = disk.quarantined;
  }
  return t;
}

class Simulation {
 public:
  Simulation(const Geometry& g, const AgentScenario& s, RequestManager* m, StrategyRun* run)
      : g_(g), m_(m), run_(run), rng_(s.seed) {}

  std::vector<uint32_t> Tokens(uint64_t n) {
    std::uniform_int_distribution<uint32_t> d(0, kVocab - 1);
    std::vector<uint32_t> t(n);
    for (uint32_t& x : t) x = d(rng_);
    return t;
  }

  static void Extend(Agent& a, std::span<const uint32_t> more) {
    for (uint32_t t : more) {
      uint64_t prev = a.prefix_hash.empty() ? 0x5e55e7aULL : a.prefix_hash.back();
      a.tokens.push_back(t);
      a.prefix_hash.push_back(Mix(prev ^ (uint64_t{t} * 0x9e3779b97f4a7c15ULL)));
    }
  }

  // Every byte the manager asks for, as a function of the token's prefix: page records, window
  // rows, compressor rows, and (from those rows) compressed entries.
  static KvWriters WritersFor(const Agent& a) {
    KvWriters w;
    w.page = [&a](uint32_t group, uint32_t layer, uint64_t position, const RecordView& view) {
      FillRecord(a.prefix_hash[position], group, layer, view);
    };
    w.window = [&a](uint32_t layer, uint64_t pos, std::span<std::byte> rec) {
      RecordView v;
      v.planes[0] = rec;
      FillRecord(a.prefix_hash[pos], 0, layer, v);
    };
    w.state = [&a](uint32_t layer, bool indexer, uint64_t pos, std::span<float> row) {
      const uint64_t seed = RowSeed(a.prefix_hash[pos], layer, indexer);
      for (size_t c = 0; c < row.size(); ++c) row[c] = StateValue(seed, c);
    };
    w.compress = ReferenceCompress;
    return w;
  }

  // Admits `prompt` (the cached prefix, resumed per window strategy, and slots for the rest).
  // False when the pool or the request table ran out: the request is then dropped whole (an
  // engine would not run a prompt it could not place).
  bool Admit(Agent& a, std::span<const uint32_t> prompt, uint64_t* hit_tokens) {
    Extend(a, prompt);
    Result<Admission> r = m_->Admit(prompt, RequestSpec{a.tenant, 0, kDefaultRetentionPriority, std::nullopt});
    if (!r.ok()) return false;
    a.id = r->id;
    a.live = true;
    run_->tier_blocks += r->tier_blocks;
    if (hit_tokens != nullptr) *hit_tokens += r->cached_tokens;
    if (r->cached_tokens > 0) {
      ++run_->prefix_hits;
      run_->prefix_hit_tokens += r->cached_tokens;
      if (r->state_restored) ++run_->states_restored;
      if (r->recompute_tokens > 0) {
        run_->tokens_recomputed += r->recompute_tokens;
        if (!m_->Recompute(a.id, prompt.subspan(r->recompute_from, r->recompute_tokens), WritersFor(a)).ok()) {
          Drop(a);
          return false;
        }
      }
    }
    return true;
  }

  bool AdmitAndWrite(Agent& a, std::span<const uint32_t> prompt, uint64_t* hit_tokens) {
    if (!Admit(a, prompt, hit_tokens)) return false;
    if (Write(a, m_->Tokens(a.id))) return true;
    Drop(a);
    return false;
  }

  // Writes tokens[from..] into the request.
  bool Write(Agent& a, uint64_t from) {
    const uint64_t n = a.tokens.size() - from;
    if (!m_->AllocateSlots(a.id, n).ok()) return false;
    return m_->Append(a.id, std::span<const uint32_t>(a.tokens).subspan(from), WritersFor(a)).ok();
  }

  void Drop(Agent& a) {
    m_->Free(a.id).IgnoreError();
    a.live = false;
  }

  // Reads back every page record (per-token caches) and, with windows, the live window and
  // compressor rows and a sample of the compressed entries.
  void Verify(const Agent& a, SimulationResult& out) {
    std::vector<std::byte> scratch;
    const BlockPool& pool = m_->pool();
    for (uint64_t pos = 0; pos < m_->Tokens(a.id); ++pos) {
      for (uint32_t g = 0; g < pool.groups().size(); ++g) {
        if (pool.groups()[g].page.compress_ratio != 1) continue;
        for (uint32_t l = 0; l < pool.groups()[g].layers; ++l) {
          Result<ConstRecordView> view = m_->Record(a.id, g, l, pos);
          ++run_->records_verified;
          if (!view.ok() || !CheckRecord(a.prefix_hash[pos], g, l, *view, scratch)) {
            ++run_->verify_failures;
            continue;
          }
          for (uint32_t p = 0; p < view->plane_count; ++p) out.bytes_verified += view->planes[p].size();
        }
      }
    }
    if (m_->states() != nullptr) VerifyWindows(a, out);
  }

  void Release(Agent& a, SimulationResult& out) {
    if (!a.live) return;
    Verify(a, out);
    Drop(a);
  }

 private:
  void VerifyWindows(const Agent& a, SimulationResult& out);

  const Geometry& g_;
  RequestManager* m_;
  StrategyRun* run_;
  std::mt19937_64 rng_;
};

// The live window rows against the writer's function, then the compressed entries (every entry
// of the last block span, every 8th before) against the reference compressor over the rows.
// The bytes of what matched count in out.bytes_verified (a model paged only in compressed
// groups verifies its bytes here: issue 27, V4 runs printed 0 B beside the records).
void Simulation::VerifyWindows(const Agent& a, SimulationResult& out) {
  const RequestManager& m = *m_;
  const uint64_t n = m.Tokens(a.id);
  std::vector<std::byte> live = m.LiveState(a.id);
  std::vector<std::byte> expect;
  std::vector<std::byte> row(m.states()->options().window_record_bytes);
  for (const LayerSpec& spec : g_.layers) {
    if (spec.is_mtp) continue;
    for (uint64_t t = n > g_.sliding_window ? n - g_.sliding_window : 0; t < n; ++t) {
      RecordView v;
      v.planes[0] = row;
      FillRecord(a.prefix_hash[t], 0, spec.index, v);
      expect.insert(expect.end(), row.begin(), row.end());
      ++run_->records_verified;
    }
  }
  // (memcmp must not see the null data of empty vectors.)
  if (live.size() < expect.size() || (!expect.empty() && std::memcmp(live.data(), expect.data(), expect.size()) != 0)) {
    ++run_->verify_failures;
  } else {
    out.bytes_verified += expect.size();
  }
  if (!m.pool().backed()) return;
  const uint64_t last_span = n / m.block_tokens() * m.block_tokens();
  for (const LayerSpec& spec : g_.layers) {
    if (spec.is_mtp || spec.compress_ratio == 0) continue;
    const uint32_t r = spec.compress_ratio;
    const uint32_t coff = spec.kind == LayerKind::kCsa ? 2 : 1;
    for (bool indexer : {false, true}) {
      if (indexer && spec.kind != LayerKind::kCsa) continue;
      uint32_t floats = 0;
      for (const CacheSpec& c : spec.caches) {
        if (c.role == (indexer ? CacheRole::kIndexerCompressorState : CacheRole::kCompressorState)) {
          floats = c.state_floats;
        }
      }
      for (uint64_t e = 0; e < n / r; ++e) {
        if (e % 8 != 0 && (e + 1) * r <= last_span) continue;
        Result<ConstRecordView> got = m.Entry(a.id, spec.index, indexer, e);
        ++run_->records_verified;
        if (!got.ok()) {
          ++run_->verify_failures;
          continue;
        }
        std::vector<float> rows;
        const uint64_t span = uint64_t{coff - 1} * r;
        for (uint64_t t = e * r >= span ? e * r - span : 0; t < (e + 1) * r; ++t) {
          const uint64_t seed = RowSeed(a.prefix_hash[t], spec.index, indexer);
          for (uint32_t c = 0; c < floats; ++c) rows.push_back(StateValue(seed, c));
        }
        size_t total = 0;
        for (uint32_t p = 0; p < got->plane_count; ++p) total += got->planes[p].size();
        std::vector<std::byte> want(total);
        RecordView wv;
        wv.plane_count = got->plane_count;
        size_t off = 0;
        for (uint32_t p = 0; p < got->plane_count; ++p) {
          wv.planes[p] = std::span<std::byte>(want.data() + off, got->planes[p].size());
          off += got->planes[p].size();
        }
        ReferenceCompress(spec.index, indexer, e, rows, floats, wv);
        off = 0;
        bool ok = true;
        for (uint32_t p = 0; p < got->plane_count; ++p) {
          ok = ok && std::memcmp(got->planes[p].data(), want.data() + off, got->planes[p].size()) == 0;
          off += got->planes[p].size();
        }
        if (!ok) {
          ++run_->verify_failures;
        } else {
          out.bytes_verified += total;
        }
      }
    }
  }
}

// The peak of a run, every request live: bytes held and window boundaries kept (`run`), and
// sharing, copies of the shared context's first `shared_full_blocks` among the forked agents and
// tenant isolation (`out`).
void MeasurePeak(const RequestManager& m, const std::vector<Agent>& agents, const std::vector<size_t>& forked,
                 uint64_t shared_full_blocks, StrategyRun& run, SimulationResult& out) {
  run.bytes_held_peak = m.bytes_held();
  if (m.states() != nullptr) {
    run.boundaries_kept = m.states()->boundaries_kept();
    run.bytes_kept_per_boundary = run.boundaries_kept > 0 ? m.states()->boundary_bytes_kept() / run.boundaries_kept : 0;
  }
  std::unordered_map<uint32_t, std::set<uint32_t>> block_domains;
  std::set<uint32_t> physical;
  out.requests = 0;
  out.logical_blocks = 0;
  for (const Agent& a : agents) {
    if (!a.live) continue;
    ++out.requests;
    std::span<const BlockId> table = m.BlockTable(a.id);
    out.logical_blocks += table.size();
    for (BlockId b : table) {
      physical.insert(b.value);
      block_domains[b.value].insert(m.domain_of(a.tenant));
    }
  }
  out.physical_blocks = physical.size();
  out.bytes_saved = (out.logical_blocks - out.physical_blocks) * out.block_bytes;
  for (const auto& [block, domains] : block_domains) out.cross_tenant_shares += domains.size() > 1 ? 1 : 0;
  out.shared_context_copies = 0;
  for (uint64_t i = 0; i < shared_full_blocks; ++i) {
    std::set<uint32_t> copies;
    for (size_t k : forked) {
      // A table shorter than the shared context is possible when the pool is tiny.
      std::span<const BlockId> table = agents[k].live ? m.BlockTable(agents[k].id) : std::span<const BlockId>();
      if (i < table.size()) copies.insert(table[i].value);
    }
    out.shared_context_copies = std::max<uint64_t>(out.shared_context_copies, copies.size());
  }
}

// The manager options of a run: the scenario's format and hashing, and a pool sized for the
// first wave at its peak (every request live, nothing shared, plus slack for copy-on-write)
// unless the scenario gives one; checked against what a simulation maps. `probe` receives the
// ledger of one token (block span, format, the lines the state arena holds).
Result<ManagerOptions> RunOptions(const Geometry& g, const AgentScenario& s, std::optional<SwaStrategy> strategy,
                                  Ledger* probe) {
  ManagerOptions mo;
  mo.kv_format = s.kv_format;
  mo.block_tokens = s.block_tokens;
  mo.hash = s.hash;
  mo.hash_bits = s.hash_bits;
  mo.hash_key_seed = s.seed;
  if (strategy) mo.window_strategy = *strategy;
  const uint32_t pairs = std::min<uint32_t>(s.tenants, 2);
  mo.max_requests = 1 + s.agents + s.independent + 2 * pairs + 2;
  LedgerOptions probe_options;
  probe_options.context_tokens = 1;
  probe_options.kv_format = s.kv_format;
  probe_options.block_tokens = s.block_tokens;
  if (strategy) probe_options.swa_strategy = *strategy;
  TESSERA_ASSIGN_OR_RETURN(*probe, ComputeLedger(g, probe_options));
  const uint64_t bt = probe->block_tokens;
  if (s.capacity_blocks > 0) {
    mo.capacity_blocks = s.capacity_blocks;
  } else {
    Checked need =
        Checked(CeilDiv(s.shared_tokens, bt)) + Checked(s.agents) * CeilDiv(s.shared_tokens + s.unique_tokens, bt) +
        Checked(s.independent + 2 * pairs) * CeilDiv(s.preamble_tokens + s.shared_tokens + s.unique_tokens, bt) +
        Checked(s.agents) + 8;
    if (need.overflowed() || need.value() > (1u << 24)) {
      return OutOfRange("agents", "the workload needs too many blocks");
    }
    mo.capacity_blocks = static_cast<uint32_t>(need.value());
  }
  TESSERA_RETURN_IF_ERROR(CheckPoolBytes(*probe, mo.capacity_blocks, s));
  // The per-request arena (window rings, compressor state) is mapped for every request too.
  Checked arena(0);
  for (const CacheLine& line : probe->lines) {
    if (!line.in_pages) arena += Checked(line.layers) * line.slots * line.format.record_bytes();
  }
  arena = arena * mo.max_requests;
  if (arena.overflowed() || arena.value() > kMaxPoolBytes) {
    return OutOfRange("sliding_window", "the window state of " + std::to_string(mo.max_requests) +
                                            " requests exceeds the " + std::to_string(kMaxPoolBytes) +
                                            " B a simulation maps");
  }
  return mo;
}

// The manager one run drives, built for `strategy`, and its store when the scenario has tiers
// (declared in this order: the store goes first). Fills the layout figures of `out`.
struct RunSetup {
  ManagerOptions options;
  std::unique_ptr<RequestManager> m;
  std::unique_ptr<TieredStore> store;
  uint64_t block_tokens = 0;
};

Result<RunSetup> OpenRun(const Geometry& g, const AgentScenario& s, std::optional<SwaStrategy> strategy,
                         SimulationResult& out) {
  RunSetup r;
  Ledger probe;
  TESSERA_ASSIGN_OR_RETURN(r.options, RunOptions(g, s, strategy, &probe));
  r.block_tokens = probe.block_tokens;
  // With a disk directory (a model with windows: one per strategy — their records carry
  // different state).
  const std::string dir =
      s.disk_dir.empty() || !strategy ? s.disk_dir : s.disk_dir + "/" + std::string(SwaStrategyName(*strategy));
  const bool redis = !s.redis.empty() || !s.redis_cluster.empty();
  if (redis) {
    r.options.hash_key = s.redis_secret;  // the fleet's: every process computes the same prefix keys
  } else if (!dir.empty()) {
    TESSERA_ASSIGN_OR_RETURN(TierKey key, DiskTier::LoadOrCreateKey(dir));
    r.options.hash_key = std::move(key.secret);
    for (std::string& w : key.warnings) out.warnings.push_back(std::move(w));
  }
  TESSERA_ASSIGN_OR_RETURN(r.m, RequestManager::Create(g, r.options));
  if (!dir.empty() || redis) {
    TESSERA_ASSIGN_OR_RETURN(r.store, OpenSimulationStore(g, r.m->pool(), s, dir));
    r.m->SetBlockSource(r.store.get());
  }
  out.model = g.name;
  out.kv_format = probe.kv_format;
  out.block_tokens = static_cast<uint32_t>(r.block_tokens);
  out.block_bytes = r.m->pool().block_bytes();
  out.capacity_blocks = r.options.capacity_blocks;
  r.m->SetSecurityListener([&out](const SecurityEvent& e) {
    if (out.security_events.size() < kMaxSecurityEvents) {
      out.security_events.push_back("dedup collision: content key " + e.content_key.Hex() + " names block " +
                                    std::to_string(e.existing.value) + ", candidate block " +
                                    std::to_string(e.candidate.value) + " has other bytes (domain " +
                                    std::to_string(e.domain) + "); installed separately");
    }
  });
  return r;
}

std::vector<uint32_t> Concat(std::initializer_list<const std::vector<uint32_t>*> parts) {
  std::vector<uint32_t> all;
  for (const auto* p : parts) all.insert(all.end(), p->begin(), p->end());
  return all;
}

// A progress note from one run ("3/8 independent agents"), for AgentScenario::progress.
using StepNote = std::function<void(std::string_view)>;

// The agents of one run, as the first wave leaves them, and the prompts the later waves repeat.
struct Wave {
  std::vector<Agent> agents;
  std::vector<size_t> forked;  // indices into agents
  std::vector<std::vector<uint32_t>> independent_prompts;
  std::vector<uint32_t> independent_tenants;
  uint64_t hit_tokens = 0;
};

// Step 2: forked agents, each sharing the orchestrator's context (window state included) and
// appending its own task.
void ForkAgents(Simulation& sim, RequestManager& m, const AgentScenario& s, Wave& w, SimulationResult& out) {
  // Without the orchestrator's context there is nothing to fork: each agent counts as not placed.
  if (!w.agents[0].live) out.out_of_blocks += s.agents;
  for (uint32_t i = 0; i < s.agents && w.agents[0].live; ++i) {
    Result<RequestId> child = m.Fork(w.agents[0].id);
    if (!child.ok()) {
      ++out.out_of_blocks;
      continue;
    }
    w.agents.push_back(w.agents[0]);
    Agent& a = w.agents.back();
    a.id = *child;
    a.forked = true;
    std::vector<uint32_t> task = sim.Tokens(s.unique_tokens);
    const uint64_t from = a.tokens.size();
    Simulation::Extend(a, task);
    if (!sim.Write(a, from)) ++out.out_of_blocks;
    w.forked.push_back(w.agents.size() - 1);
  }
}

// Step 4: identical prompts in the same step, before either is sealed (per tenant, up to two),
// written in lockstep one block at a time: each seal of the second finds the first's equal block.
void RunLockstepPairs(Simulation& sim, RequestManager& m, const std::vector<uint32_t>& pair_prompt, uint32_t pairs,
                      uint64_t bt, Wave& w, SimulationResult& out) {
  for (uint32_t t = 0; t < pairs; ++t) {
    const size_t first = w.agents.size();
    for (int k = 0; k < 2; ++k) {
      w.agents.emplace_back();
      w.agents.back().tenant = t;
      if (!sim.Admit(w.agents.back(), pair_prompt, &w.hit_tokens)) ++out.out_of_blocks;
    }
    for (uint64_t pos = 0; pos < pair_prompt.size();) {
      const uint64_t end = std::min<uint64_t>(pair_prompt.size(), (pos / bt + 1) * bt);
      for (size_t k = first; k < first + 2; ++k) {
        Agent& a = w.agents[k];
        // Only a request exactly at `pos` takes the chunk (a cached prefix starts it further on;
        // a failed append leaves it behind, and the chunk must not land at another position).
        if (!a.live || m.Tokens(a.id) != pos) continue;
        std::span<const uint32_t> chunk = std::span<const uint32_t>(a.tokens).subspan(pos, end - pos);
        if (!m.Append(a.id, chunk, Simulation::WritersFor(a)).ok()) ++out.out_of_blocks;
      }
      pos = end;
    }
  }
}

// Steps 1-4, the first wave: the orchestrator's shared context, the forked agents, the
// independent agents (their own preamble, one of two, then the same documents and tools), and
// the lockstep pairs. The tokens are drawn in this order.
Wave RunFirstWave(Simulation& sim, RequestManager& m, const AgentScenario& s, uint64_t bt, const StepNote& step,
                  SimulationResult& out) {
  const uint64_t system = std::max<uint64_t>(1, s.shared_tokens / 8);
  const uint64_t tools = std::max<uint64_t>(1, s.shared_tokens / 8);
  const uint64_t docs = s.shared_tokens - system - tools;
  const uint32_t pairs = std::min<uint32_t>(s.tenants, 2);
  std::vector<uint32_t> system_tokens = sim.Tokens(system), doc_tokens = sim.Tokens(docs),
                        tool_tokens = sim.Tokens(tools);
  std::vector<std::vector<uint32_t>> preambles = {sim.Tokens(s.preamble_tokens), sim.Tokens(s.preamble_tokens),
                                                  sim.Tokens(s.preamble_tokens)};
  Wave w;
  w.agents.reserve(1 + s.agents + s.independent + 2 * pairs);
  step("1/8 orchestrator context");
  // 1. The orchestrator builds the shared context.
  std::vector<uint32_t> shared = Concat({&system_tokens, &doc_tokens, &tool_tokens});
  w.agents.emplace_back();
  if (!sim.AdmitAndWrite(w.agents[0], shared, &w.hit_tokens)) ++out.out_of_blocks;
  step("2/8 forked agents");
  ForkAgents(sim, m, s, w, out);
  step("3/8 independent agents");
  for (uint32_t i = 0; i < s.independent; ++i) {
    std::vector<uint32_t> task = sim.Tokens(s.unique_tokens);
    std::vector<uint32_t> prompt = Concat({&preambles[i % 2], &doc_tokens, &tool_tokens, &task});
    w.agents.emplace_back();
    Agent& a = w.agents.back();
    a.tenant = i % s.tenants;
    if (!sim.AdmitAndWrite(a, prompt, &w.hit_tokens)) ++out.out_of_blocks;
    w.independent_prompts.push_back(std::move(prompt));
    w.independent_tenants.push_back(a.tenant);
  }
  step("4/8 identical prompts");
  std::vector<uint32_t> pair_task = sim.Tokens(s.unique_tokens);
  RunLockstepPairs(sim, m, Concat({&preambles[2], &doc_tokens, &pair_task}), pairs, bt, w, out);
  return w;
}

// Steps 7 and 8: the independent prompts again, from the cache; then cold agents, new prompts
// of the same length (with a tight pool they evict cached blocks).
void RunLaterWaves(Simulation& sim, const Wave& w, const StepNote& step, SimulationResult& out) {
  step("7/8 second wave");
  for (size_t i = 0; i < w.independent_prompts.size(); ++i) {
    Agent a;
    a.tenant = w.independent_tenants[i];
    uint64_t hits = 0;
    if (!sim.AdmitAndWrite(a, w.independent_prompts[i], &hits)) ++out.out_of_blocks;
    out.second_wave_hit_tokens += hits;
    sim.Release(a, out);
  }
  step("8/8 cold agents");
  for (size_t i = 0; i < w.independent_prompts.size(); ++i) {
    Agent a;
    a.tenant = w.independent_tenants[i];
    if (!sim.AdmitAndWrite(a, sim.Tokens(w.independent_prompts[i].size()), nullptr)) ++out.out_of_blocks;
    sim.Release(a, out);
  }
}

// The run's counters into `run` and `out`; with tiers, the store's figures (write-back writes
// the pool's sealed blocks first: the end of the run is a graceful shutdown).
Status Tally(RunSetup& r, const AgentScenario& s, StrategyRun& run, SimulationResult& out) {
  RequestManager& m = *r.m;
  const IndexStats& is = m.index().stats();
  run.dedup_hits = is.dedup_hits.load();
  out.dedup_hits += run.dedup_hits;
  out.dedup_collisions += is.dedup_collisions.load();
  out.evictions += m.pool().stats().evictions.load();
  out.cow_copies += m.metrics().cow_copies.load();
  out.prefix_hit_tokens += run.prefix_hit_tokens;
  out.records_verified += run.records_verified;
  out.verify_failures += run.verify_failures;
  out.metrics = m.CollectMetrics();
  if (r.store) {
    if (s.tier_write == WritePolicy::kWriteBack) TESSERA_RETURN_IF_ERROR(m.Checkpoint().status());
    m.SetBlockSource(nullptr);
    run.tiers = CollectTierRun(*r.store, run.tier_blocks * r.block_tokens);
    for (MetricFamily& f : r.store->CollectMetrics()) out.metrics.push_back(std::move(f));
    out.tiers = run.tiers;
  }
  return Status::Ok();
}

// The scenario, once, through one manager built for `strategy` (models with windows) — the one
// driver for every model. Fills the peak figures of `out` and adds its counters; returns the
// run's own figures.
Result<StrategyRun> RunOnce(const Geometry& g, const AgentScenario& s, std::optional<SwaStrategy> strategy,
                            SimulationResult& out) {
  StrategyRun run;
  if (strategy) run.strategy = *strategy;
  TESSERA_ASSIGN_OR_RETURN(RunSetup r, OpenRun(g, s, strategy, out));
  const uint64_t bt = r.block_tokens;
  Simulation sim(g, s, r.m.get(), &run);
  // Progress for a person at a terminal (AgentScenario::progress; the CLI prints it on a TTY).
  const std::string run_name = strategy ? std::string(SwaStrategyName(*strategy)) + ": " : "";
  const StepNote step = [&](std::string_view what) {
    if (s.progress) s.progress(run_name + std::string(what));
  };
  Wave w = RunFirstWave(sim, *r.m, s, bt, step, out);
  step("5/8 peak");
  // 5. The peak: sharing, copies of the shared context, tenant isolation, bytes held.
  MeasurePeak(*r.m, w.agents, w.forked, s.shared_tokens / bt, run, out);
  step("6/8 verifying every byte");
  // 6. Verify every byte of every request, then free it (sealed blocks stay cached).
  for (Agent& a : w.agents) sim.Release(a, out);
  RunLaterWaves(sim, w, step, out);
  TESSERA_RETURN_IF_ERROR(Tally(r, s, run, out));
  return run;
}

}  // namespace

Result<SimulationResult> RunAgentScenario(const Geometry& g, const AgentScenario& s) {
  if (s.agents == 0 && s.independent == 0) return InvalidArgument("agents", "needs at least one agent");
  if (s.agents > 4096 || s.independent > 4096) return InvalidArgument("agents", "at most 4096 agents of each kind");
  if (s.tenants == 0) return InvalidArgument("tenants", "must be positive");
  if (s.shared_tokens < 8) return InvalidArgument("shared-tokens", "must be at least 8");
  if (s.shared_tokens > (1u << 20)) return InvalidArgument("shared-tokens", "token counts above 1m are not simulated");
  if (s.unique_tokens > (1u << 20)) return InvalidArgument("unique-tokens", "token counts above 1m are not simulated");
  if (s.preamble_tokens > (1u << 20)) {
    return InvalidArgument("preamble-tokens", "token counts above 1m are not simulated");
  }
  // Every request keeps its tokens and a prefix hash per token on the host (12 B a token), and
  // each forked agent copies the shared context's: bound the workload, not each count alone
  // (4,096 agents of a 1m-token context were 48 GB before the pool saw a block).
  Checked workload = (Checked(1) + s.agents) * (Checked(s.shared_tokens) + s.unique_tokens) +
                     (Checked(s.independent) + 4) * (Checked(s.preamble_tokens) + s.shared_tokens + s.unique_tokens);
  if (workload.overflowed() || workload.value() > kMaxWorkloadTokens) {
    return OutOfRange("agents", "the workload holds " + std::to_string(workload.value()) + " tokens, above the " +
                                    std::to_string(kMaxWorkloadTokens) + " a simulation keeps");
  }
  if (s.hash_bits == 0 || s.hash_bits > 128) return InvalidArgument("hash-bits", "must be in 1..128");
  if (!s.redis.empty() && !s.redis_cluster.empty()) {
    return InvalidArgument("redis", "give --redis or --redis-cluster, not both");
  }
  if ((!s.redis.empty() || !s.redis_cluster.empty()) && s.redis_secret.size() < 16) {
    return InvalidArgument("redis-secret-file", "a Redis tier needs the fleet's secret (at least 16 bytes)");
  }
  if (s.host_tier_bytes > 0 && s.disk_dir.empty()) {
    return InvalidArgument("host-tier-bytes", "needs a disk directory (the host tier sits above it)");
  }
  SimulationResult out;
  if (!(g.is_hybrid && g.sliding_window > 0)) {
    TESSERA_ASSIGN_OR_RETURN(StrategyRun run, RunOnce(g, s, std::nullopt, out));
    (void)run;
    return out;
  }
  std::vector<SwaStrategy> strategies = {SwaStrategy::kRecompute, SwaStrategy::kSnapshot, SwaStrategy::kRetain};
  if (s.swa_strategy) strategies = {*s.swa_strategy};
  for (SwaStrategy st : strategies) {
    TESSERA_ASSIGN_OR_RETURN(StrategyRun run, RunOnce(g, s, st, out));
    out.strategies.push_back(run);
  }
  return out;
}

// Long (~95 lines): a flat list, one line per figure of the run, in each output form.
std::string RenderSimulation(const SimulationResult& r, OutputFormat format) {
  nlohmann::ordered_json j;
  j["scenario"] = "agents";
  j["model"] = r.model;
  j["kv_format"] = r.kv_format;
  j["block_tokens"] = r.block_tokens;
  j["block_bytes"] = r.block_bytes;
  j["capacity_blocks"] = r.capacity_blocks;
  j["requests"] = r.requests;
  j["logical_blocks"] = r.logical_blocks;
  j["physical_blocks"] = r.physical_blocks;
  j["shared_context_copies"] = r.shared_context_copies;
  j["prefix_hit_tokens"] = r.prefix_hit_tokens;
  j["second_wave_hit_tokens"] = r.second_wave_hit_tokens;
  j["dedup_hits"] = r.dedup_hits;
  j["dedup_collisions"] = r.dedup_collisions;
  j["cow_copies"] = r.cow_copies;
  j["evictions"] = r.evictions;
  j["out_of_blocks"] = r.out_of_blocks;
  j["records_verified"] = r.records_verified;
  j["bytes_verified"] = r.bytes_verified;
  j["verify_failures"] = r.verify_failures;
  j["cross_tenant_shares"] = r.cross_tenant_shares;
  j["bytes_saved"] = r.bytes_saved;
  if (r.tiers) {
    j["tier_hits"] = r.tiers->tier_hits;
    j["tier_hit_tokens"] = r.tiers->tier_hit_tokens;
    j["tier_verify_failures"] = r.tiers->tier_verify_failures;
    j["disk_quarantined"] = r.tiers->disk_quarantined;
    j["tier_written"] = r.tiers->written;
    j["tier_write_errors"] = r.tiers->write_errors;
    j["disk_records"] = r.tiers->disk_records;
    if (!r.tiers->last_error.empty()) j["tier_last_error"] = r.tiers->last_error;
  }
  j["security_events"] = r.security_events;
  if (!r.strategies.empty()) {
    nlohmann::ordered_json st = nlohmann::ordered_json::array();
    for (const StrategyRun& run : r.strategies) {
      st.push_back({{"strategy", std::string(SwaStrategyName(run.strategy))},
                    {"prefix_hits", run.prefix_hits},
                    {"prefix_hit_tokens", run.prefix_hit_tokens},
                    {"tokens_recomputed", run.tokens_recomputed},
                    {"tokens_recomputed_per_hit", run.prefix_hits ? run.tokens_recomputed / run.prefix_hits : 0},
                    {"states_restored", run.states_restored},
                    {"boundaries_kept", run.boundaries_kept},
                    {"bytes_kept_per_boundary", run.bytes_kept_per_boundary},
                    {"bytes_held_peak", run.bytes_held_peak},
                    {"dedup_hits", run.dedup_hits},
                    {"records_verified", run.records_verified},
                    {"verify_failures", run.verify_failures}});
      if (run.tiers) {
        st.back()["tier_hits"] = run.tiers->tier_hits;
        st.back()["tier_hit_tokens"] = run.tiers->tier_hit_tokens;
        st.back()["tier_verify_failures"] = run.tiers->tier_verify_failures;
        st.back()["disk_quarantined"] = run.tiers->disk_quarantined;
        st.back()["tier_written"] = run.tiers->written;
        st.back()["disk_records"] = run.tiers->disk_records;
      }
    }
    j["swa_strategies"] = st;
  }
  if (format == OutputFormat::kJson)
    return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  std::ostringstream out;
  out << "simulate agents: " << r.model << " (" << r.kv_format << "), " << r.block_tokens << "-token blocks of "
      << FormatBytes(r.block_bytes) << ", capacity " << r.capacity_blocks << " blocks\n";
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "security_events" || it.key() == "scenario" || it.key() == "model" || it.key() == "kv_format" ||
        it.key() == "swa_strategies") {
      continue;
    }
    std::string value = it.value().dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    if (it.key() == "bytes_saved" || it.key() == "bytes_verified" || it.key() == "block_bytes") {
      value = FormatBytes(it.value().get<uint64_t>());
    }
    out << (format == OutputFormat::kMarkdown ? "- " : "  ") << it.key() << ": " << value << "\n";
  }
  for (const std::string& e : r.security_events) out << "  security: " << e << "\n";
  for (const StrategyRun& run : r.strategies) {
    out << "  window strategy " << SwaStrategyName(run.strategy) << ": " << run.prefix_hits << " hits ("
        << WithThousands(run.prefix_hit_tokens) << " tokens), "
        << (run.prefix_hits ? run.tokens_recomputed / run.prefix_hits : 0) << " tokens recomputed per hit, "
        << run.states_restored << " states restored, " << run.boundaries_kept << " boundaries kept at "
        << FormatBytes(run.bytes_kept_per_boundary) << " each, peak held " << FormatBytes(run.bytes_held_peak) << ", "
        << run.verify_failures << " verify failures";
    if (run.tiers) {
      out << "; tiers: " << run.tiers->tier_hits << " hits from disk, " << run.tiers->tier_verify_failures
          << " refused, " << run.tiers->disk_quarantined << " quarantined, " << run.tiers->written << " written";
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace tessera

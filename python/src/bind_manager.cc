// tessera.RequestManager: the request manager for any preset model (or config.json), its batched
// step, zero-copy views of its pages, and its metrics.
#include <pybind11/numpy.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "manager.h"
#include "tessera/hash.h"
#include "tessera/kv_writers.h"
#include "tessera/layout.h"
#include "tessera/metrics.h"
#include "tessera/request_manager.h"

namespace tessera::py_bind {

// ---- PyManager ---------------------------------------------------------------------------------

RequestId PyManager::Live(py::handle r, const char* arg) const {
  const uint64_t v = ToU64(r, arg);
  const std::optional<RequestId> id = Find(v);
  if (!id) ThrowValue(arg, "no live request " + std::to_string(v) + " (freed, or never admitted)");
  return *id;
}

void PyManager::RevokeViews() {
  if (writable.empty()) return;
  size_t kept = 0;
  for (WritableExport& e : writable) {
    py::object a = e.array();
    if (a.is_none()) continue;
    if (!m->pool().CheckWritable(e.block, e.generation).ok()) {
      a.attr("setflags")(py::arg("write") = false);
      continue;
    }
    writable[kept++] = std::move(e);
  }
  writable.resize(kept);
}

ManagerLock::ManagerLock(PyManager& pm) : pm_(pm) {
  if (!pm.mu.try_lock()) {
    if (pm.owner.load() == std::this_thread::get_id()) {
      PyErr_SetString(g_tessera_error, "manager: called again from inside one of its own calls");
      throw py::error_already_set();
    }
    py::gil_scoped_release nogil;
    pm.mu.lock();
  }
  pm.owner.store(std::this_thread::get_id());
}

ManagerLock::~ManagerLock() {
  pm_.owner.store(std::thread::id());
  pm_.mu.unlock();
}

namespace {

// ---- Views -------------------------------------------------------------------------------------

// Bytes of a manager's pool, exported through the buffer protocol (numpy views of them are
// zero-copy); holds the manager alive.
struct PageBuffer {
  std::shared_ptr<PyManager> owner;
  std::byte* data = nullptr;
  size_t size = 0;
  bool readonly = true;
};

// A numpy view of `bytes`, bytes of block `b` (invalid: of no block, read-only). Writable only
// while b is filling by one table; then tracked, and made read-only by RevokeViews once b is
// sealed, freed or shared (issue 27.7). REQUIRES: pm's lock.
py::array View(const std::shared_ptr<PyManager>& pm, std::span<const std::byte> bytes, BlockId b) {
  const BlockPool& pool = pm->m->pool();
  const bool writable = b.valid() && pool.CheckWritable(b, pool.generation(b)).ok();
  // The pool's bytes; the buffer is exported read-only unless the block may be written.
  auto* data = const_cast<std::byte*>(bytes.data());  // NOLINT(cppcoreguidelines-pro-type-const-cast)
  py::object buf = py::cast(PageBuffer{pm, data, bytes.size(), !writable});
  py::array a = py::module_::import("numpy").attr("asarray")(buf);
  if (writable) {
    // Many views between two mutating calls: drop the dead ones now, not only at the next call.
    if (pm->writable.size() >= 4096 && (pm->writable.size() & (pm->writable.size() - 1)) == 0) pm->RevokeViews();
    pm->writable.push_back({py::weakref(a), b, pool.generation(b)});
  }
  return a;
}

py::list Planes(const std::shared_ptr<PyManager>& pm, const ConstRecordView& v, BlockId b) {
  py::list out;
  for (uint32_t k = 0; k < v.plane_count; ++k) out.append(View(pm, v.planes[k], b));
  return out;
}

// ---- Writers -----------------------------------------------------------------------------------

// How Append and Step fill the KV bytes of a pool that holds them.
//   None          no writers (an unbacked pool; a backed one refuses: ValueError on "writers")
//   "prewritten"  the caller has already written the bytes through writable page views
//   "pattern"     a deterministic pattern (docs/PYTHON.md), for tests and demos
enum class WriterMode { kNone, kPrewritten, kPattern };

WriterMode ParseWriter(py::handle w) {
  if (w.is_none()) return WriterMode::kNone;
  const std::string s = ToStr(w, "writer");
  if (s == "prewritten") return WriterMode::kPrewritten;
  if (s == "pattern") return WriterMode::kPattern;
  ThrowValue("writer", "must be None, \"prewritten\" or \"pattern\" (got \"" + s + "\")");
}

uint8_t PatternByte(uint64_t a, uint64_t i) { return static_cast<uint8_t>((a + i) % 251); }

const KvWriters& Writers(WriterMode mode) {
  static const KvWriters none;
  static const KvWriters prewritten = [] {
    KvWriters w;
    w.page = [](uint32_t, uint32_t, uint64_t, const RecordView&) {};
    return w;
  }();
  static const KvWriters pattern = [] {
    KvWriters w;
    w.page = [](uint32_t g, uint32_t l, uint64_t p, const RecordView& r) {
      for (uint32_t k = 0; k < r.plane_count; ++k) {
        const uint64_t a = p * 131 + uint64_t{l} * 31 + uint64_t{g} * 7 + uint64_t{k} * 3;
        for (size_t i = 0; i < r.planes[k].size(); ++i) r.planes[k][i] = std::byte{PatternByte(a, i)};
      }
    };
    w.window = [](uint32_t l, uint64_t p, std::span<std::byte> row) {
      const uint64_t a = p * 131 + uint64_t{l} * 31 + 101;
      for (size_t i = 0; i < row.size(); ++i) row[i] = std::byte{PatternByte(a, i)};
    };
    w.state = [](uint32_t l, bool indexer, uint64_t p, std::span<float> row) {
      for (size_t i = 0; i < row.size(); ++i) {
        row[i] = static_cast<float>((p * 7 + uint64_t{l} * 3 + (indexer ? 1 : 0) + i) % 97);
      }
    };
    w.compress = ReferenceCompress;
    return w;
  }();
  switch (mode) {
    case WriterMode::kPrewritten:
      return prewritten;
    case WriterMode::kPattern:
      return pattern;
    default:
      return none;
  }
}

// ---- Results -----------------------------------------------------------------------------------

struct PyAdmission {
  uint64_t request_id = 0;  // PyManager::Handle
  uint64_t cached_tokens = 0;
  uint32_t cached_blocks = 0;
  uint32_t tier_blocks = 0;
  bool state_restored = false;
  uint64_t recompute_from = 0;
  uint64_t recompute_tokens = 0;
};

struct PyStepResult {
  py::array codes;  // uint8 StatusCode per request (0: ok)
  uint32_t failed = 0;
  py::array offsets;     // uint32, n + 1
  py::array new_blocks;  // uint32
  py::array replaced;    // uint32 (k, 4): request index, slot, from block, to block
};

template <typename T>
py::array_t<T> NewArray(size_t n) {
  return py::array_t<T>(static_cast<ssize_t>(n));
}

// ---- Arguments ---------------------------------------------------------------------------------

std::optional<std::string> OptStr(const py::object& v, const char* arg) {
  if (v.is_none()) return std::nullopt;
  return ToStr(v, arg);
}

std::shared_ptr<PyManager> Create(
    const py::object& model, const py::object& config, const py::object& kv_format, const py::object& indexer_format,
    const py::object& block_tokens, const py::object& kernel, const py::object& include_mtp,
    const py::object& spec_tokens, const py::object& capacity_blocks, const py::object& max_requests,
    const py::object& backed, const py::object& window_strategy, const py::object& hash, const py::object& hash_bits,
    const py::object& hash_key_seed, const py::object& hash_key, const py::object& weights_revision,
    const py::object& content_dedup, const py::object& tenant_domain, const py::object& kv_events,
    const py::object& kv_events_capacity, const py::object& caller_keys, const py::object& defer_seals) {
  auto pm = std::make_shared<PyManager>();
  pm->geometry = LoadModelArg(model, config);
  ManagerOptions o;
  if (auto s = OptStr(kv_format, "kv_format")) o.kv_format = *s;
  if (auto s = OptStr(indexer_format, "indexer_format")) o.indexer_format = *s;
  if (!block_tokens.is_none()) o.block_tokens = ToU64(block_tokens, "block_tokens");
  o.kernel = TakeAs(ParseKernel(ToStr(kernel, "kernel")), "kernel");
  o.include_mtp = ToBool(include_mtp, "include_mtp");
  o.spec_tokens = static_cast<uint32_t>(ToU64(spec_tokens, "spec_tokens", 1024));
  o.capacity_blocks = ToU32(capacity_blocks, "capacity_blocks");
  o.max_requests = max_requests.is_none() ? kNoRequestLimit : ToU32(max_requests, "max_requests");
  pm->backed = ToBool(backed, "backed");
  o.region_kind = pm->backed ? RegionKind::kHost : RegionKind::kUnbacked;
  o.window_strategy = TakeAs(ParseSwaStrategy(ToStr(window_strategy, "window_strategy")), "window_strategy");
  o.hash = TakeAs(ParseHashAlgorithm(ToStr(hash, "hash")), "hash");
  o.hash_bits = ToU32(hash_bits, "hash_bits");
  o.hash_key_seed = ToU64(hash_key_seed, "hash_key_seed");
  if (!hash_key.is_none()) {
    if (!PyBytes_Check(hash_key.ptr()) && !PyByteArray_Check(hash_key.ptr())) {
      ThrowType("hash_key", "must be bytes");
    }
    const std::string k = py::bytes(hash_key).cast<std::string>();
    o.hash_key.resize(k.size());
    std::memcpy(o.hash_key.data(), k.data(), k.size());
  }
  if (auto s = OptStr(weights_revision, "weights_revision")) o.weights_revision = *s;
  o.content_dedup = ToBool(content_dedup, "content_dedup");
  if (!tenant_domain.is_none()) {
    if (!PyDict_Check(tenant_domain.ptr())) ThrowType("tenant_domain", "must be a dict of int to int");
    for (auto [k, v] : py::reinterpret_borrow<py::dict>(tenant_domain)) {
      o.tenant_domain[ToU32(k, "tenant_domain")] = ToU32(v, "tenant_domain");
    }
  }
  o.kv_events = ToBool(kv_events, "kv_events");
  o.kv_events_capacity = ToU32(kv_events_capacity, "kv_events_capacity");
  o.caller_keys = ToBool(caller_keys, "caller_keys");
  // None: deferred where allowed (an unbacked pool, no windows); True: deferred or refused.
  if (!defer_seals.is_none()) {
    o.seal_timing = ToBool(defer_seals, "defer_seals") ? SealTiming::kDeferred : SealTiming::kImmediate;
  }
  Result<std::unique_ptr<RequestManager>> m = [&] {
    py::gil_scoped_release nogil;
    return RequestManager::Create(pm->geometry, o);
  }();
  pm->m = Take(std::move(m));
  pm->kv_format = o.kv_format.empty() ? std::string(pm->m->pool().groups().front().format.name) : o.kv_format;
  return pm;
}

PyAdmission Admit(PyManager& pm, const py::object& prompt, const py::object& tenant, const py::object& cache_salt,
                  const py::object& priority, const py::object& reserve_tokens, const py::object& read_cache) {
  U32Array p;
  ToU32Array(prompt, "prompt", &p);
  // As tessera serve: a request holds at least the token whose logits start generation.
  if (p.size == 0) ThrowValue("prompt", "must hold at least one token (got an empty prompt)");
  RequestSpec spec;
  spec.read_cache = ToBool(read_cache, "read_cache");
  spec.tenant = ToU32(tenant, "tenant");
  spec.cache_salt = ToU64(cache_salt, "cache_salt");
  spec.priority = static_cast<uint8_t>(ToU64(priority, "priority", kMaxRetentionPriority));
  if (!reserve_tokens.is_none()) spec.reserve_tokens = ToU64(reserve_tokens, "reserve_tokens");
  ManagerLock lk(pm);
  std::optional<Result<Admission>> a;
  {
    py::gil_scoped_release nogil;
    a.emplace(pm.m->Admit(std::span<const uint32_t>(p.data, p.size), spec));
  }
  const Admission ad = Take(std::move(*a));
  return PyAdmission{PyManager::Handle(ad.id), ad.cached_tokens,  ad.cached_blocks,   ad.tier_blocks,
                     ad.state_restored,        ad.recompute_from, ad.recompute_tokens};
}

// Checks a step batch (pm.handles) and fills pm.ids (REQUIRES: pm's lock). ValueError naming
// the argument.
void CheckBatch(PyManager& pm, const U32Array& counts, const U32Array& tokens) {
  const std::vector<uint64_t>& ids = pm.handles;
  if (counts.size != ids.size()) {
    ThrowValue("counts",
               "has " + std::to_string(counts.size) + " entries for " + std::to_string(ids.size()) + " request_ids");
  }
  uint64_t total = 0;
  for (size_t i = 0; i < counts.size; ++i) total += counts.data[i];
  if (total != tokens.size) {
    ThrowValue("tokens", "has " + std::to_string(tokens.size) + " tokens; counts add up to " + std::to_string(total));
  }
  if (++pm.seen_epoch == 0) {  // wrapped: forget every old mark
    std::fill(pm.seen.begin(), pm.seen.end(), 0);
    pm.seen_epoch = 1;
  }
  pm.ids.resize(ids.size());
  RequestId* out = pm.ids.data();
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint64_t h = ids[i];
    const auto slot = static_cast<uint32_t>(h);
    const std::optional<RequestId> id = pm.m->LiveAt(slot);
    if (!id || id->generation != static_cast<uint32_t>(h >> 32)) {
      ThrowValue("request_ids", "element " + std::to_string(i) + " (" + std::to_string(h) + ") is not a live request");
    }
    if (slot >= pm.seen.size()) pm.seen.resize(size_t{slot} + 1, 0);
    if (pm.seen[slot] == pm.seen_epoch) {
      ThrowValue("request_ids", "element " + std::to_string(i) + " (" + std::to_string(h) + ") appears twice");
    }
    pm.seen[slot] = pm.seen_epoch;
    out[i] = *id;
  }
}

PyStepResult Step(PyManager& pm, const py::object& request_ids, const py::object& counts, const py::object& tokens,
                  const py::object& writer) {
  U32Array cnt, tok;
  ToU32Array(counts, "counts", &cnt);
  ToU32Array(tokens, "tokens", &tok);
  const KvWriters& w = Writers(ParseWriter(writer));
  ManagerLock lk(pm);
  ToU64Array(request_ids, "request_ids", &pm.handles);
  CheckBatch(pm, cnt, tok);
  const StepBatch batch{pm.ids, std::span<const uint32_t>(cnt.data, cnt.size),
                        std::span<const uint32_t>(tok.data, tok.size)};
  Status st;
  {
    py::gil_scoped_release nogil;
    st = pm.m->Step(batch, w, &pm.result);
  }
  pm.RevokeViews();
  Check(st);
  const StepResult& r = pm.result;
  PyStepResult out;
  out.failed = r.failed;
  auto codes = NewArray<uint8_t>(r.codes.size());
  uint8_t* c = codes.mutable_data();
  for (size_t i = 0; i < r.codes.size(); ++i) c[i] = static_cast<uint8_t>(r.codes[i]);
  auto offsets = NewArray<uint32_t>(r.offsets.size());
  std::memcpy(offsets.mutable_data(), r.offsets.data(), r.offsets.size() * sizeof(uint32_t));
  auto blocks = NewArray<uint32_t>(r.new_blocks.size());
  uint32_t* b = blocks.mutable_data();
  for (size_t i = 0; i < r.new_blocks.size(); ++i) b[i] = r.new_blocks[i].value;
  py::array_t<uint32_t> replaced({static_cast<ssize_t>(r.replaced.size()), ssize_t{4}});
  uint32_t* p = replaced.mutable_data();
  for (size_t i = 0; i < r.replaced.size(); ++i) {
    p[4 * i] = r.replaced[i].request;
    p[4 * i + 1] = r.replaced[i].slot;
    p[4 * i + 2] = r.replaced[i].from.value;
    p[4 * i + 3] = r.replaced[i].to.value;
  }
  out.codes = std::move(codes);
  out.offsets = std::move(offsets);
  out.new_blocks = std::move(blocks);
  out.replaced = std::move(replaced);
  return out;
}

// The benchmark's baseline (bench/python_step_bench.py): `steps` C++ Step calls on the same
// batch, each timed with the steady clock; returns their durations in nanoseconds.
py::array StepLoopNs(PyManager& pm, const py::object& request_ids, const py::object& counts, const py::object& tokens,
                     const py::object& steps, const py::object& writer) {
  U32Array cnt, tok;
  ToU32Array(counts, "counts", &cnt);
  ToU32Array(tokens, "tokens", &tok);
  const uint64_t n = ToU64(steps, "steps", 1 << 24);
  const KvWriters& w = Writers(ParseWriter(writer));
  ManagerLock lk(pm);
  ToU64Array(request_ids, "request_ids", &pm.handles);
  CheckBatch(pm, cnt, tok);
  const StepBatch batch{pm.ids, std::span<const uint32_t>(cnt.data, cnt.size),
                        std::span<const uint32_t>(tok.data, tok.size)};
  auto out = NewArray<double>(n);
  double* d = out.mutable_data();
  Status st;
  {
    py::gil_scoped_release nogil;
    for (uint64_t i = 0; i < n && st.ok(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      st = pm.m->Step(batch, w, &pm.result);
      d[i] = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  pm.RevokeViews();
  Check(st);
  return out;
}

std::vector<MetricFamily> AllMetrics(PyManager& pm) {
  std::vector<MetricFamily> f = pm.m->CollectMetrics();
  if (pm.store) {
    std::vector<MetricFamily> s = pm.store->CollectMetrics();
    f.insert(f.end(), std::make_move_iterator(s.begin()), std::make_move_iterator(s.end()));
  }
  return f;
}

BlockId CheckBlock(const PyManager& pm, const py::object& block_id) {
  const uint32_t b = ToU32(block_id, "block_id");
  if (b >= pm.m->pool().capacity()) {
    ThrowValue("block_id", std::to_string(b) + " is not below the capacity " + std::to_string(pm.m->pool().capacity()));
  }
  return BlockId{b};
}

uint32_t CheckGroup(const PyManager& pm, const py::object& group) {
  const uint32_t g = ToU32(group, "group");
  if (g >= pm.m->pool().groups().size()) {
    ThrowValue("group", std::to_string(g) + " is not below " + std::to_string(pm.m->pool().groups().size()));
  }
  return g;
}

void RequireBacked(const PyManager& pm) {
  if (!pm.backed) ThrowValue("backed", "an unbacked manager holds no KV bytes to view");
}

// append and recompute: the tokens checked, then the manager call without the GIL.
void WriteTokens(PyManager& pm, Status (RequestManager::*call)(RequestId, std::span<const uint32_t>, const KvWriters&),
                 const py::object& request_id, const py::object& tokens, const py::object& writer) {
  U32Array t;
  ToU32Array(tokens, "tokens", &t);
  const KvWriters& w = Writers(ParseWriter(writer));
  ManagerLock lk(pm);
  const RequestId r = pm.Live(request_id);
  Status st;
  {
    py::gil_scoped_release nogil;
    st = (pm.m.get()->*call)(r, std::span<const uint32_t>(t.data, t.size), w);
  }
  pm.RevokeViews();
  Check(st);
}

// ---- tessera.vllm's one-group manager (docs/adr/0037-vllm-adapter-speed.md) -------------------
// One core call where vLLM's scheduler makes one: the block table comes back as a list of pool
// ids with the call that changed it, instead of a separate block_table call and a tolist().

// The block table in vLLM's ids: pool id + 1 (vLLM's block 0 is its null block, never handed
// out), so that the adapter hands the list on as it comes. REQUIRES: pm's lock.
// Entries [first, end) of it, as vLLM's ids, each a cached int (PyManager::vllm_ids).
py::list VllmTable(PyManager& pm, RequestId r, size_t first = 0) {
  const std::span<const BlockId> t = pm.m->BlockTable(r);
  first = std::min(first, t.size());
  if (pm.vllm_ids.empty()) pm.vllm_ids.resize(size_t{pm.m->pool().capacity()});
  py::list out(t.size() - first);
  for (size_t i = first; i < t.size(); ++i) {
    py::object& id = pm.vllm_ids[t[i].value];  // a pool id is below the capacity
    if (!id) id = py::reinterpret_steal<py::object>(PyLong_FromUnsignedLong(uint64_t{t[i].value} + 1));
    if (!id) throw py::error_already_set();
    PyList_SET_ITEM(out.ptr(), static_cast<ssize_t>(i - first), id.inc_ref().ptr());
  }
  return out;
}

// admit(prompt, reserve_tokens=0) -> (request id, cached tokens, cached blocks, block table in
// vLLM's ids).
py::tuple VllmAdmit(PyManager& pm, const py::object& prompt, const py::object& cache_salt,
                    const py::object& read_cache) {
  U32Array p;
  ToU32Array(prompt, "prompt", &p);  // empty allowed: vLLM allocates slots for an empty prompt
  RequestSpec spec;
  spec.read_cache = ToBool(read_cache, "read_cache");
  spec.cache_salt = ToU64(cache_salt, "cache_salt");
  spec.reserve_tokens = 0;
  ManagerLock lk(pm);
  std::optional<Result<Admission>> a;
  {
    py::gil_scoped_release nogil;
    a.emplace(pm.m->Admit(std::span<const uint32_t>(p.data, p.size), spec));
  }
  const Admission ad = Take(std::move(*a));
  return py::make_tuple(PyManager::Handle(ad.id), ad.cached_tokens, ad.cached_blocks, VllmTable(pm, ad.id));
}

// allocate(n) when n > 0, then append(tokens) when there are any -> the blocks the call added to
// the table (vLLM's ids; the adapter's manager renames no slot: no content dedup, no fork). A
// refused allocation (OutOfBlocksError) changes nothing; tokens are checked before anything
// changes.
py::list VllmAdvance(PyManager& pm, const py::object& request_id, const py::object& n, const py::object& tokens) {
  const uint64_t count = ToU64(n, "n");
  U32Array t;
  if (!tokens.is_none()) ToU32Array(tokens, "tokens", &t);
  ManagerLock lk(pm);
  const RequestId r = pm.Live(request_id);
  const size_t held = pm.m->BlockTable(r).size();
  if (count > 0) Check(pm.m->AllocateSlots(r, count));
  if (t.size > 0) {
    const Status st = pm.m->Append(r, std::span<const uint32_t>(t.data, t.size), Writers(WriterMode::kNone));
    pm.RevokeViews();  // a block the append filled is sealed (ADR 0039)
    Check(st);
  }
  return VllmTable(pm, r, held);
}

// The request's block table (vLLM's ids).
py::list VllmTableOf(PyManager& pm, const py::object& request_id) {
  ManagerLock lk(pm);
  return VllmTable(pm, pm.Live(request_id));
}

// vLLM's get_num_common_prefix_blocks for one group: how many leading blocks of request
// `request_id`'s table every request of `request_ids` holds in the same slots.
uint64_t VllmCommonPrefixBlocks(PyManager& pm, const py::object& request_id, const py::object& request_ids) {
  ManagerLock lk(pm);
  const std::span<const BlockId> mine = pm.m->BlockTable(pm.Live(request_id));
  ToU64Array(request_ids, "request_ids", &pm.handles);
  size_t common = mine.size();
  for (size_t i = 0; i < pm.handles.size() && common > 0; ++i) {
    const std::optional<RequestId> id = pm.Find(pm.handles[i]);
    if (!id) ThrowValue("request_ids", "element " + std::to_string(i) + " is not a live request");
    const std::span<const BlockId> t = pm.m->BlockTable(*id);
    size_t k = 0;
    while (k < common && k < t.size() && t[k] == mine[k]) ++k;
    common = k;
  }
  return common;
}

// ---- Caller keys (docs/adr/0045-caller-keyed-vllm-admission.md) --------------------------------

// Whether `h` is a hash the caller-keyed path takes: bytes of exactly 32 (vLLM's sha256 and
// sha256_cbor block hashes; its 16-byte xxhash ones are not collision resistant).
bool IsCallerHash(PyObject* h) { return PyBytes_Check(h) && PyBytes_GET_SIZE(h) == 32; }

// Copies items [first, first + n) of the list or tuple `seq` into pm.caller_hashes, each checked
// before it is read: TypeError / ValueError naming `block_hashes[i]`. REQUIRES: the GIL (no
// Python code runs while the items are read) and first + n <= len(seq).
void ReadCallerHashes(PyManager& pm, PyObject* seq, size_t first, size_t n) {
  pm.caller_hashes.resize(n);
  PyObject** items = PySequence_Fast_ITEMS(seq) + first;
  // A request's hashes were made when its tokens arrived: usually out of cache by now. Their
  // loads are independent; fetching ahead keeps several in flight.
  // (An object's header and its 32 bytes may straddle two lines.)
  constexpr size_t kAhead = 8;
  auto fetch = [](const PyObject* o) {
    __builtin_prefetch(o);
    __builtin_prefetch(reinterpret_cast<const char*>(o) + 63);
  };
  for (size_t i = 0; i < std::min(n, kAhead); ++i) fetch(items[i]);
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) fetch(items[i + kAhead]);
    PyObject* h = items[i];
    if (!IsCallerHash(h)) {
      const std::string arg = "block_hashes[" + std::to_string(first + i) + "]";
      if (!PyBytes_Check(h)) ThrowType(arg, std::string("must be bytes (got ") + Py_TYPE(h)->tp_name + ")");
      ThrowValue(arg, "must be a 32-byte hash like the blocks before it (got " + std::to_string(PyBytes_GET_SIZE(h)) +
                          " bytes)");
    }
    std::memcpy(pm.caller_hashes[i].data(), PyBytes_AS_STRING(h), 32);
  }
}

// admit_keyed: the vLLM adapter's get_computed_blocks for a request whose block_hashes it keys
// by (RequestManager::AdmitKeyed, no slots reserved) -> (request id, cached tokens, cached blocks,
// block table in vLLM's ids), or None when the request's hashes are not the keyed path's:
// `block_hashes` is not a list or tuple, holds fewer than the prompt's whole blocks, or its first
// is not a 32-byte bytes (the caller then admits by tokens). A prompt without a whole block is
// keyed when `short_keyed` (the adapter has seen 32-byte hashes). A later hash that is not 32
// bytes is an error naming it; nothing changes.
py::object VllmAdmitKeyed(PyManager& pm, const py::object& block_hashes, const py::object& num_tokens,
                          const py::object& cache_salt, const py::object& read_cache, const py::object& short_keyed) {
  const uint64_t n_tokens = ToU64(num_tokens, "num_tokens");
  RequestSpec spec;
  spec.read_cache = ToBool(read_cache, "read_cache");
  spec.cache_salt = ToU64(cache_salt, "cache_salt");
  spec.reserve_tokens = 0;
  const bool short_ok = ToBool(short_keyed, "short_keyed");
  PyObject* seq = block_hashes.ptr();
  if (!PyList_Check(seq) && !PyTuple_Check(seq)) return py::none();
  const uint64_t need = n_tokens / pm.m->block_tokens();
  if (static_cast<uint64_t>(PySequence_Fast_GET_SIZE(seq)) < need) return py::none();
  if (need == 0 ? !short_ok : !IsCallerHash(PySequence_Fast_ITEMS(seq)[0])) return py::none();
  ManagerLock lk(pm);
  // The lock may have let another thread run (it waits without the GIL): a list may have shrunk.
  if (static_cast<uint64_t>(PySequence_Fast_GET_SIZE(seq)) < need) {
    ThrowValue("block_hashes", "changed while the call waited for the manager");
  }
  ReadCallerHashes(pm, seq, 0, need);
  const Admission ad = Take(pm.m->AdmitKeyed(pm.caller_hashes, n_tokens, spec));
  return py::make_tuple(PyManager::Handle(ad.id), ad.cached_tokens, ad.cached_blocks, VllmTable(pm, ad.id));
}

// As _vllm_advance, for a caller-keyed request: allocate(n) when n > 0, then the tokens appended,
// each block they complete sealed under its hash in `block_hashes` (RequestManager::AppendKeyed)
// -> the blocks the call added to the table (vLLM's ids; a caller-keyed table only grows: no
// content dedup renames a slot). The tokens, the hashes and the slots are checked before
// anything changes; a refused allocation (OutOfBlocksError) changes nothing.
py::list VllmAdvanceKeyed(PyManager& pm, const py::object& request_id, const py::object& n, const py::object& tokens,
                          const py::object& block_hashes) {
  const uint64_t count = ToU64(n, "n");
  U32Array t;
  if (!tokens.is_none()) ToU32Array(tokens, "tokens", &t);
  ManagerLock lk(pm);
  const RequestId r = pm.Live(request_id);
  const uint64_t bs = pm.m->block_tokens();
  const uint64_t have = pm.m->Tokens(r);
  const uint64_t first = have / bs;
  const uint64_t completes = (have + t.size) / bs - first;
  const size_t held = pm.m->BlockTable(r).size();
  if (have + t.size > std::max<uint64_t>(held * bs, have + count)) {
    ThrowValue("tokens", "no slots for " + std::to_string(t.size) + " more tokens (allocate them first)");
  }
  if (completes > 0) {
    PyObject* seq = block_hashes.ptr();
    if (!PyList_Check(seq) && !PyTuple_Check(seq)) ThrowType("block_hashes", "must be a list or tuple of bytes");
    const auto len = static_cast<uint64_t>(PySequence_Fast_GET_SIZE(seq));
    if (len < first + completes) {
      ThrowValue("block_hashes", "holds " + std::to_string(len) + " hashes; the tokens complete blocks up to " +
                                     std::to_string(first + completes - 1));
    }
    ReadCallerHashes(pm, seq, first, completes);
  } else {
    pm.caller_hashes.clear();
  }
  if (count > 0) Check(pm.m->AllocateSlots(r, count));
  if (t.size > 0) {
    const Status st = pm.m->AppendKeyed(r, std::span<const uint32_t>(t.data, t.size), pm.caller_hashes);
    pm.RevokeViews();
    Check(st);
  }
  return VllmTable(pm, r, held);
}

}  // namespace

// Declared in manager.h: the store's metrics use it too.
py::dict MetricsDict(const std::vector<MetricFamily>& families) {
  py::dict out;
  for (const MetricFamily& f : families) {
    py::dict samples;
    for (const auto& [labels, value] : f.samples) samples[py::str(labels)] = py::int_(value);
    py::dict fam;
    fam["type"] = f.type;
    fam["help"] = f.help;
    fam["samples"] = samples;
    out[py::str(f.name)] = fam;
  }
  return out;
}

void BindManager(py::module_& m) {
  py::class_<PageBuffer>(m, "PageBuffer", py::buffer_protocol(),
                         "Bytes of a manager's pool (buffer protocol); keeps the manager alive.")
      .def_buffer([](PageBuffer& b) {
        return py::buffer_info(b.data, 1, py::format_descriptor<uint8_t>::format(), 1, {static_cast<ssize_t>(b.size)},
                               {ssize_t{1}}, b.readonly);
      });

  py::class_<PyAdmission>(m, "Admission")
      .def_readonly("request_id", &PyAdmission::request_id)
      .def_readonly("cached_tokens", &PyAdmission::cached_tokens)
      .def_readonly("cached_blocks", &PyAdmission::cached_blocks)
      .def_readonly("tier_blocks", &PyAdmission::tier_blocks)
      .def_readonly("state_restored", &PyAdmission::state_restored)
      .def_readonly("recompute_from", &PyAdmission::recompute_from)
      .def_readonly("recompute_tokens", &PyAdmission::recompute_tokens)
      .def("__repr__", [](const PyAdmission& a) {
        return "Admission(request_id=" + std::to_string(a.request_id) +
               ", cached_tokens=" + std::to_string(a.cached_tokens) +
               ", cached_blocks=" + std::to_string(a.cached_blocks) + ", tier_blocks=" + std::to_string(a.tier_blocks) +
               ", state_restored=" + (a.state_restored ? "True" : "False") +
               ", recompute_from=" + std::to_string(a.recompute_from) +
               ", recompute_tokens=" + std::to_string(a.recompute_tokens) + ")";
      });

  py::class_<PyStepResult>(m, "StepResult")
      .def_readonly("codes", &PyStepResult::codes)
      .def_readonly("failed", &PyStepResult::failed)
      .def_readonly("offsets", &PyStepResult::offsets)
      .def_readonly("new_blocks", &PyStepResult::new_blocks)
      .def_readonly("replaced", &PyStepResult::replaced)
      .def(
          "blocks_of",
          [](const PyStepResult& r, const py::object& index) {
            const uint32_t i = ToU32(index, "index");
            const auto n = static_cast<uint32_t>(r.offsets.shape(0));
            if (i + 1 >= n) ThrowValue("index", std::to_string(i) + " is not below " + std::to_string(n - 1));
            const auto* o = static_cast<const uint32_t*>(r.offsets.data());
            return py::object(r.new_blocks[py::slice(o[i], o[i + 1], 1)]);
          },
          py::arg("index"), "The blocks request `index` of the batch took: new_blocks[offsets[i]:offsets[i+1]].");

  py::dict codes;
  for (StatusCode c : {StatusCode::kOk, StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kOutOfRange,
                       StatusCode::kIoError, StatusCode::kOutOfBlocks, StatusCode::kFailedPrecondition,
                       StatusCode::kDataLoss, StatusCode::kInternal}) {
    std::string name(StatusCodeName(c));  // "out of blocks" -> "out_of_blocks", "i/o error" -> "io_error"
    std::erase(name, '/');
    for (char& ch : name) ch = ch == ' ' ? '_' : ch;
    codes[py::int_(static_cast<int>(c))] = name;
  }
  m.attr("STATUS_NAMES") = codes;

  py::class_<PyManager, std::shared_ptr<PyManager>>(m, "RequestManager")
      .def(py::init(&Create), py::arg("model") = py::none(), py::kw_only(), py::arg("config") = py::none(),
           py::arg("kv_format") = py::none(), py::arg("indexer_format") = py::none(),
           py::arg("block_tokens") = py::none(), py::arg("kernel") = "flashmla", py::arg("include_mtp") = false,
           py::arg("spec_tokens") = 0, py::arg("capacity_blocks") = 1024, py::arg("max_requests") = py::none(),
           py::arg("backed") = true, py::arg("window_strategy") = "recompute", py::arg("hash") = "xxh3",
           py::arg("hash_bits") = 128, py::arg("hash_key_seed") = 0, py::arg("hash_key") = py::none(),
           py::arg("weights_revision") = py::none(), py::arg("content_dedup") = true,
           py::arg("tenant_domain") = py::none(), py::arg("kv_events") = false,
           py::arg("kv_events_capacity") = 1u << 16, py::arg("caller_keys") = false,
           py::arg("defer_seals") = py::none())
      // Positional (the adapter's calls: pybind11 matches keywords by name, a few hundred ns).
      .def("_vllm_admit", &VllmAdmit, py::arg("prompt"), py::arg("cache_salt") = 0, py::arg("read_cache") = true)
      .def("_vllm_advance", &VllmAdvance, py::arg("request_id"), py::arg("n"), py::arg("tokens") = py::none())
      .def("_vllm_table", &VllmTableOf, py::arg("request_id"))
      .def("_vllm_common_prefix_blocks", &VllmCommonPrefixBlocks, py::arg("request_id"), py::arg("request_ids"))
      .def("_vllm_admit_keyed", &VllmAdmitKeyed, py::arg("block_hashes"), py::arg("num_tokens"),
           py::arg("cache_salt") = 0, py::arg("read_cache") = true, py::arg("short_keyed") = false)
      .def("_vllm_advance_keyed", &VllmAdvanceKeyed, py::arg("request_id"), py::arg("n"),
           py::arg("tokens") = py::none(), py::arg("block_hashes") = py::none())
      .def("admit", &Admit, py::arg("prompt"), py::kw_only(), py::arg("tenant") = 0, py::arg("cache_salt") = 0,
           py::arg("priority") = kDefaultRetentionPriority, py::arg("reserve_tokens") = py::none(),
           py::arg("read_cache") = true)
      .def(
          "allocate",
          [](PyManager& pm, const py::object& request_id, const py::object& n) {
            const uint64_t count = ToU64(n, "n");
            ManagerLock lk(pm);
            const Status st = pm.m->AllocateSlots(pm.Live(request_id), count);
            pm.RevokeViews();
            Check(st);
          },
          py::arg("request_id"), py::arg("n"))
      .def(
          "append",
          [](PyManager& pm, const py::object& request_id, const py::object& tokens, const py::object& writer) {
            WriteTokens(pm, &RequestManager::Append, request_id, tokens, writer);
          },
          py::arg("request_id"), py::arg("tokens"), py::kw_only(), py::arg("writer") = py::none())
      .def(
          "recompute",
          [](PyManager& pm, const py::object& request_id, const py::object& tokens, const py::object& writer) {
            WriteTokens(pm, &RequestManager::Recompute, request_id, tokens, writer);
          },
          py::arg("request_id"), py::arg("tokens"), py::kw_only(), py::arg("writer") = py::none())
      .def("step", &Step, py::arg("request_ids"), py::arg("counts"), py::arg("tokens"), py::kw_only(),
           py::arg("writer") = py::none())
      .def("_step_loop_ns", &StepLoopNs, py::arg("request_ids"), py::arg("counts"), py::arg("tokens"), py::arg("steps"),
           py::kw_only(), py::arg("writer") = py::none())
      .def(
          "fork",
          [](PyManager& pm, const py::object& request_id) {
            ManagerLock lk(pm);
            Result<RequestId> child = pm.m->Fork(pm.Live(request_id));
            pm.RevokeViews();  // the parent's filling block is shared now
            return PyManager::Handle(Take(std::move(child)));
          },
          py::arg("request_id"))
      .def(
          "free",
          [](PyManager& pm, const py::object& request_id) {
            ManagerLock lk(pm);
            const Status st = pm.m->Free(pm.Live(request_id));
            pm.RevokeViews();
            Check(st);
          },
          py::arg("request_id"))
      .def(
          "block_table",
          [](PyManager& pm, const py::object& request_id) {
            ManagerLock lk(pm);
            const std::span<const BlockId> t = pm.m->BlockTable(pm.Live(request_id));
            auto out = NewArray<uint32_t>(t.size());
            uint32_t* d = out.mutable_data();
            for (size_t i = 0; i < t.size(); ++i) d[i] = t[i].value;
            return out;
          },
          py::arg("request_id"), "A copy of the request's block ids (uint32).")
      .def(
          "tokens",
          [](PyManager& pm, const py::object& request_id) {
            ManagerLock lk(pm);
            return pm.m->Tokens(pm.Live(request_id));
          },
          py::arg("request_id"))
      .def(
          "is_live",
          [](PyManager& pm, const py::object& request_id) {
            const uint64_t h = ToU64(request_id, "request_id");
            ManagerLock lk(pm);
            return pm.Find(h).has_value();
          },
          py::arg("request_id"))
      .def(
          "record",
          [](const std::shared_ptr<PyManager>& pm, const py::object& request_id, const py::object& group,
             const py::object& layer, const py::object& position) {
            ManagerLock lk(*pm);
            RequireBacked(*pm);
            const RequestId r = pm->Live(request_id);
            const uint32_t g = CheckGroup(*pm, group);
            const uint32_t l = ToU32(layer, "layer");
            const uint64_t p = ToU64(position, "position");
            const ConstRecordView v = Take(pm->m->Record(r, g, l, p));
            return Planes(pm, v, pm->m->BlockTable(r)[p / pm->m->block_tokens()]);
          },
          py::arg("request_id"), py::arg("group"), py::arg("layer"), py::arg("position"),
          "Zero-copy uint8 views of the record of token `position` (one per plane of the format).")
      .def(
          "entry",
          [](const std::shared_ptr<PyManager>& pm, const py::object& request_id, const py::object& layer,
             const py::object& indexer, const py::object& entry) {
            ManagerLock lk(*pm);
            RequireBacked(*pm);
            const RequestId r = pm->Live(request_id);
            const uint32_t l = ToU32(layer, "layer");
            const bool ix = ToBool(indexer, "indexer");
            const uint64_t e = ToU64(entry, "entry");
            const ConstRecordView v = Take(pm->m->Entry(r, l, ix, e));
            BlockId block;  // invalid: read-only
            for (const StateLayer& s : pm->m->states()->layers()) {
              if (s.layer != l) continue;
              const int32_t grp = ix ? s.igroup : s.group;
              const uint64_t epb = pm->m->pool().groups()[static_cast<size_t>(grp)].page.entries_per_block;
              const std::span<const BlockId> t = pm->m->BlockTable(r);
              if (e / epb < t.size()) block = t[e / epb];
            }
            return Planes(pm, v, block);
          },
          py::arg("request_id"), py::arg("layer"), py::arg("indexer"), py::arg("entry"),
          "Models with windows: zero-copy views of a compressed entry (main or indexer).")
      .def(
          "page",
          [](const std::shared_ptr<PyManager>& pm, const py::object& block_id, const py::object& group,
             const py::object& layer) {
            ManagerLock lk(*pm);
            RequireBacked(*pm);
            const BlockId b = CheckBlock(*pm, block_id);
            const uint32_t g = CheckGroup(*pm, group);
            const uint32_t l = ToU32(layer, "layer");
            if (l >= pm->m->pool().groups()[g].layers) {
              ThrowValue("layer",
                         std::to_string(l) + " is not below " + std::to_string(pm->m->pool().groups()[g].layers));
            }
            const BlockPool& pool = pm->m->pool();
            return View(pm, pool.Bytes(pool.PageHandle(b, g, l)), b);
          },
          py::arg("block_id"), py::arg("group"), py::arg("layer"),
          "A zero-copy uint8 view of one layer's page of a block (read-only unless the block is being filled).")
      .def(
          "block",
          [](const std::shared_ptr<PyManager>& pm, const py::object& block_id, const py::object& group) {
            ManagerLock lk(*pm);
            RequireBacked(*pm);
            const BlockId b = CheckBlock(*pm, block_id);
            const uint32_t g = CheckGroup(*pm, group);
            const BlockPool& pool = pm->m->pool();
            return View(pm, pool.Bytes(pool.BlockHandleOf(b, g)), b);
          },
          py::arg("block_id"), py::arg("group"),
          "A zero-copy uint8 view of a block's bytes in one group (every layer).")
      .def(
          "block_state",
          [](PyManager& pm, const py::object& block_id) {
            ManagerLock lk(pm);
            return std::string(BlockStateName(pm.m->pool().state(CheckBlock(pm, block_id))));
          },
          py::arg("block_id"))
      .def(
          "live_state",
          [](PyManager& pm, const py::object& request_id) {
            ManagerLock lk(pm);
            const std::vector<std::byte> s = pm.m->LiveState(pm.Live(request_id));
            return py::bytes(reinterpret_cast<const char*>(s.data()), s.size());
          },
          py::arg("request_id"))
      .def("checkpoint",
           [](PyManager& pm) {
             ManagerLock lk(pm);
             std::optional<Result<uint64_t>> r;
             {
               py::gil_scoped_release nogil;
               r.emplace(pm.m->Checkpoint());
             }
             return Take(std::move(*r));
           })
      .def("reset_prefix_cache",
           [](PyManager& pm) {
             ManagerLock lk(pm);
             Check(pm.m->ResetPrefixCache());
           })
      .def("metrics", [](PyManager& pm) { return MetricsDict(AllMetrics(pm)); })
      .def("prometheus_text", [](PyManager& pm) { return PrometheusText(AllMetrics(pm)); })
      .def_property_readonly("groups",
                             [](PyManager& pm) {
                               py::list out;
                               for (const PoolGroup& g : pm.m->pool().groups()) {
                                 py::dict d;
                                 d["name"] = g.name;
                                 d["format"] = g.format.name;
                                 d["layers"] = g.layers;
                                 d["record_bytes"] = g.page.record_bytes;
                                 d["entries_per_block"] = g.page.entries_per_block;
                                 d["compress_ratio"] = g.page.compress_ratio;
                                 d["planes"] = g.format.packing == Packing::kRegionMajor ? 2 : 1;
                                 d["page_bytes"] = g.page.page_bytes;
                                 d["layers_per_page"] = g.page.layers_per_page;
                                 out.append(d);
                               }
                               return out;
                             })
      .def_property_readonly("model", [](PyManager& pm) { return pm.geometry.name; })
      .def_property_readonly("kv_format", [](PyManager& pm) { return pm.kv_format; })
      .def_property_readonly("backed", [](PyManager& pm) { return pm.backed; })
      .def_property_readonly("has_windows", [](PyManager& pm) { return pm.m->states() != nullptr; })
      .def_property_readonly("block_tokens", [](PyManager& pm) { return pm.m->block_tokens(); })
      .def_property_readonly("capacity_blocks", [](PyManager& pm) { return pm.m->pool().capacity(); })
      .def_property_readonly("block_bytes", [](PyManager& pm) { return pm.m->pool().block_bytes(); })
      .def_property_readonly("free_blocks",
                             [](PyManager& pm) {
                               ManagerLock lk(pm);
                               return pm.m->pool().free_count();
                             })
      .def_property_readonly("cached_blocks",
                             [](PyManager& pm) {
                               ManagerLock lk(pm);
                               return pm.m->pool().cached_count();
                             })
      .def_property_readonly("available_blocks",
                             [](PyManager& pm) {
                               ManagerLock lk(pm);
                               return pm.m->pool().Available();
                             })
      // Fixed at creation: no lock (callable from inside the manager's own calls).
      .def_property_readonly("defers_seals", [](const PyManager& pm) { return pm.m->defers_seals(); })
      .def_property_readonly("pending_seals",
                             [](PyManager& pm) {
                               ManagerLock lk(pm);
                               return pm.m->pending_seals();
                             })
      .def_property_readonly("live_requests",
                             [](PyManager& pm) {
                               ManagerLock lk(pm);
                               return pm.m->live_requests();
                             })
      .def_property_readonly("bytes_held", [](PyManager& pm) {
        ManagerLock lk(pm);
        return pm.m->bytes_held();
      });
}

}  // namespace tessera::py_bind

// tessera._core.RecordTiers: Tessera's tiers (host DRAM, a disk directory, a Redis server) as a
// keyed record store for the engine adapters (python/tessera/vllm.py Connector,
// python/tessera/sglang.py HiCacheStorage; docs/adr/0024-engine-adapters.md).
//
// The tiers are the library's own (tier_adapters.h): each verifies what it returns (a checksum in
// host memory, a keyed MAC on disk and in Redis) and reports a damaged record as a miss. Records
// are put into the first tier; what a tier evicts for space is demoted to the next (dropped below
// the last), as the tiered store does (ADR 0013). Promotion is inclusive: a record read from a
// lower tier stays there. With `write_through`, every put also goes at once to the first
// persistent tier.
//
// Keys are 16 bytes (the adapters derive them with a keyed hash); payloads are opaque bytes of at
// most `max_record_bytes`. Every argument is checked here: a wrong type is a TypeError, a wrong
// length or value a ValueError, each naming the argument; nothing is written when any argument of
// a batch is wrong. The GIL is released during tier I/O; calls are serialised by one mutex.
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "manager.h"
#include "tessera/tier.h"
#include "tessera/tier_adapters.h"

namespace tessera::py_bind {
namespace {

constexpr uint64_t kDefaultMaxRecordBytes = 64ull << 20;

// A Python buffer held for as long as its bytes are read.
class HeldBuffer {
 public:
  HeldBuffer() = default;
  ~HeldBuffer() {
    if (held_) PyBuffer_Release(&view_);
  }
  HeldBuffer(const HeldBuffer&) = delete;
  HeldBuffer& operator=(const HeldBuffer&) = delete;

  // The bytes of a bytes-like object (bytes, bytearray, memoryview, a C-contiguous array).
  std::span<const std::byte> Take(py::handle obj, std::string_view arg) {
    if (PyUnicode_Check(obj.ptr())) ThrowType(arg, "must be bytes-like (got str)");
    if (!PyObject_CheckBuffer(obj.ptr())) {
      ThrowType(arg, std::string("must be bytes-like (got ") + Py_TYPE(obj.ptr())->tp_name + ")");
    }
    if (held_) {
      PyBuffer_Release(&view_);
      held_ = false;
    }
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      ThrowValue(arg, "must be a C-contiguous buffer");
    }
    held_ = true;
    return {static_cast<const std::byte*>(view_.buf), static_cast<size_t>(view_.len)};
  }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

Hash128 KeyOf(py::handle obj, std::string_view arg) {
  if (!PyBytes_Check(obj.ptr())) ThrowType(arg, std::string("must be bytes (got ") + Py_TYPE(obj.ptr())->tp_name + ")");
  if (PyBytes_GET_SIZE(obj.ptr()) != 16) {
    ThrowValue(arg, "must be 16 bytes (got " + std::to_string(PyBytes_GET_SIZE(obj.ptr())) + ")");
  }
  Hash128 h;
  std::memcpy(&h.lo, PyBytes_AS_STRING(obj.ptr()), 8);
  std::memcpy(&h.hi, PyBytes_AS_STRING(obj.ptr()) + 8, 8);
  return h;
}

std::vector<Hash128> KeysOf(py::handle obj, std::string_view arg) {
  if (!PyList_Check(obj.ptr()) && !PyTuple_Check(obj.ptr())) {
    ThrowType(arg, std::string("must be a list of 16-byte keys (got ") + Py_TYPE(obj.ptr())->tp_name + ")");
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  std::vector<Hash128> keys;
  keys.reserve(seq.size());
  for (size_t i = 0; i < seq.size(); ++i)
    keys.push_back(KeyOf(seq[i], std::string(arg) + "[" + std::to_string(i) + "]"));
  return keys;
}

std::vector<std::byte> SecretOf(const py::dict& spec, std::string_view arg) {
  if (!spec.contains("secret")) ThrowValue(arg, "a redis tier needs \"secret\" (bytes, at least 16)");
  HeldBuffer keep;
  std::span<const std::byte> s = keep.Take(spec["secret"], std::string(arg) + ".secret");
  if (s.size() < 16) ThrowValue(std::string(arg) + ".secret", "must be at least 16 bytes");
  return {s.begin(), s.end()};
}

std::unique_ptr<Tier> MakeTier(py::handle item, std::string_view arg) {
  if (!PyDict_Check(item.ptr())) ThrowType(arg, "each tier is a dict with \"kind\"");
  py::dict spec = py::reinterpret_borrow<py::dict>(item);
  const std::string kind = spec.contains("kind") ? ToStr(spec["kind"], std::string(arg) + ".kind") : "";
  static const char* const kKnown[] = {"kind",  "capacity_bytes",  "dir",        "host", "port", "secret", "namespace",
                                       "fsync", "max_value_bytes", "timeout_ms", "seeds"};
  for (auto kv : spec) {
    const std::string name = ToStr(kv.first, std::string(arg) + " key");
    bool known = false;
    for (const char* k : kKnown) known = known || name == k;
    if (!known) ThrowValue(std::string(arg) + "." + name, "unknown tier option");
  }
  auto u64 = [&](const char* name, uint64_t dflt, uint64_t max = UINT64_MAX) {
    return spec.contains(name) ? ToU64(spec[name], std::string(arg) + "." + name, max) : dflt;
  };
  if (kind == "host") {
    const uint64_t cap = u64("capacity_bytes", 0);
    if (cap == 0) ThrowValue(std::string(arg) + ".capacity_bytes", "a host tier needs a positive capacity");
    return MakeHostTier(cap);
  }
  if (kind == "disk") {
    DiskTierOptions o;
    if (!spec.contains("dir")) ThrowValue(std::string(arg) + ".dir", "a disk tier needs a directory");
    o.dir = ToStr(spec["dir"], std::string(arg) + ".dir");
    if (spec.contains("fsync") && !ToBool(spec["fsync"], std::string(arg) + ".fsync")) o.fsync = FsyncPolicy::kNone;
    return Take(MakeDiskTier(o, u64("capacity_bytes", 0)));
  }
  if (kind == "redis") {
    RedisTierOptions o;
    if (spec.contains("host")) o.host = ToStr(spec["host"], std::string(arg) + ".host");
    o.port = static_cast<int>(u64("port", 6379, 65535));
    if (o.port == 0) ThrowValue(std::string(arg) + ".port", "must be 1..65535");
    if (spec.contains("namespace")) o.key_namespace = ToStr(spec["namespace"], std::string(arg) + ".namespace");
    o.secret = SecretOf(spec, arg);
    o.max_value_bytes = u64("max_value_bytes", o.max_value_bytes);
    o.timeout_ms = static_cast<uint32_t>(u64("timeout_ms", o.timeout_ms, 600000));
    return Take(MakeRedisTier(o));
  }
  if (kind == "redis_cluster") {
    RedisClusterOptions o;
    if (!spec.contains("seeds")) ThrowValue(std::string(arg) + ".seeds", "a Redis Cluster tier needs seeds");
    const std::string seeds = ToStr(spec["seeds"], std::string(arg) + ".seeds");
    for (size_t start = 0; start <= seeds.size();) {
      const size_t comma = seeds.find(',', start);
      const size_t end = comma == std::string::npos ? seeds.size() : comma;
      if (end == start) ThrowValue(std::string(arg) + ".seeds", "an empty seed (give \"host:port,...\")");
      o.seeds.push_back(seeds.substr(start, end - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (spec.contains("namespace")) o.key_namespace = ToStr(spec["namespace"], std::string(arg) + ".namespace");
    o.secret = SecretOf(spec, arg);
    o.max_value_bytes = u64("max_value_bytes", o.max_value_bytes);
    o.timeout_ms = static_cast<uint32_t>(u64("timeout_ms", o.timeout_ms, 600000));
    return Take(MakeRedisClusterTier(o));
  }
  ThrowValue(std::string(arg) + ".kind",
             "must be \"host\", \"disk\", \"redis\" or \"redis_cluster\" (got \"" + kind + "\")");
}

class RecordTiers {
 public:
  RecordTiers(py::handle tiers, bool write_through, uint64_t max_record_bytes)
      : max_record_bytes_(max_record_bytes), write_through_(write_through) {
    if (!PyList_Check(tiers.ptr()) && !PyTuple_Check(tiers.ptr())) ThrowType("tiers", "must be a list of dicts");
    py::sequence seq = py::reinterpret_borrow<py::sequence>(tiers);
    if (seq.size() == 0) ThrowValue("tiers", "give at least one tier");
    if (max_record_bytes == 0) ThrowValue("max_record_bytes", "must be positive");
    for (size_t i = 0; i < seq.size(); ++i) tiers_.push_back(MakeTier(seq[i], "tiers[" + std::to_string(i) + "]"));
    for (size_t i = 0; i < tiers_.size(); ++i) {
      if (through_ < 0 && tiers_[i]->persistent()) through_ = static_cast<int>(i);
      tiers_[i]->SetEvictionListener([this, i](const TierRecord& r) { Demote(i + 1, r); });
    }
    hits_.assign(tiers_.size(), 0);
    if (write_through_ && through_ < 0) ThrowValue("write_through", "no tier is persistent (disk or redis)");
  }

  // Stores payloads[i] under keys[i] in the first tier (and the persistent one, write-through).
  // Returns per key whether a tier took it (a refused batch goes one tier lower, record by record).
  std::vector<bool> Put(py::handle keys_obj, py::handle payloads_obj, uint32_t format_id) {
    std::vector<Hash128> keys = KeysOf(keys_obj, "keys");
    if (!PyList_Check(payloads_obj.ptr()) && !PyTuple_Check(payloads_obj.ptr())) {
      ThrowType("payloads", "must be a list of bytes-like objects");
    }
    py::sequence payloads = py::reinterpret_borrow<py::sequence>(payloads_obj);
    if (payloads.size() != keys.size()) {
      ThrowValue("payloads",
                 "has " + std::to_string(payloads.size()) + " entries for " + std::to_string(keys.size()) + " keys");
    }
    if (format_id > UINT16_MAX) ThrowValue("format_id", "must be below 65536");
    std::vector<TierRecord> records(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      HeldBuffer keep;
      std::span<const std::byte> b = keep.Take(payloads[i], "payloads[" + std::to_string(i) + "]");
      if (b.size() > max_record_bytes_) {
        ThrowValue("payloads[" + std::to_string(i) + "]",
                   std::to_string(b.size()) + " bytes exceed max_record_bytes " + std::to_string(max_record_bytes_));
      }
      records[i] = TierRecord{keys[i], static_cast<uint16_t>(format_id), {b.begin(), b.end()}};
    }
    std::vector<bool> stored(keys.size(), false);
    {
      py::gil_scoped_release release;
      std::lock_guard lock(mu_);
      std::vector<const TierRecord*> ptrs;
      ptrs.reserve(records.size());
      for (const TierRecord& r : records) ptrs.push_back(&r);
      Status st = tiers_[0]->PutBatch(ptrs);
      if (st.ok()) {
        stored.assign(keys.size(), true);
      } else {
        last_error_ = st.ToString();
        ++put_errors_;
        for (size_t i = 0; i < records.size(); ++i) stored[i] = Demote(1, records[i]);  // one tier lower
      }
      if (write_through_ && through_ > 0) {
        Status t = tiers_[static_cast<size_t>(through_)]->PutBatch(ptrs);
        if (!t.ok()) {
          last_error_ = t.ToString();
          ++put_errors_;
        }
      }
    }
    return stored;
  }

  // One entry per key: (format_id, payload bytes) from the first tier that holds a verified copy,
  // or None.
  py::list Get(py::handle keys_obj) {
    std::vector<Hash128> keys = KeysOf(keys_obj, "keys");
    std::vector<std::optional<TierRecord>> found(keys.size());
    {
      py::gil_scoped_release release;
      std::lock_guard lock(mu_);
      for (size_t t = 0; t < tiers_.size(); ++t) {
        std::vector<Hash128> want;
        std::vector<size_t> where;
        for (size_t i = 0; i < keys.size(); ++i) {
          if (!found[i]) {
            want.push_back(keys[i]);
            where.push_back(i);
          }
        }
        if (want.empty()) break;
        std::vector<std::optional<TierRecord>> got = tiers_[t]->GetBatch(want);
        for (size_t j = 0; j < got.size() && j < where.size(); ++j) {
          if (got[j] && got[j]->key == want[j]) {
            found[where[j]] = std::move(got[j]);
            ++hits_[t];
          }
        }
      }
    }
    py::list out;
    for (auto& r : found) {
      if (!r) {
        out.append(py::none());
        continue;
      }
      py::bytes b(reinterpret_cast<const char*>(r->payload.data()), r->payload.size());
      out.append(py::make_tuple(r->format_id, b));
    }
    return out;
  }

  std::vector<bool> Contains(py::handle keys_obj) {
    std::vector<Hash128> keys = KeysOf(keys_obj, "keys");
    py::gil_scoped_release release;
    std::lock_guard lock(mu_);
    std::vector<bool> out(keys.size(), false);
    for (size_t i = 0; i < keys.size(); ++i) out[i] = ContainsLocked(keys[i]);
    return out;
  }

  void Erase(py::handle keys_obj) {
    std::vector<Hash128> keys = KeysOf(keys_obj, "keys");
    py::gil_scoped_release release;
    std::lock_guard lock(mu_);
    for (auto& t : tiers_) {
      Status st = t->EraseBatch(keys);
      if (!st.ok()) last_error_ = st.ToString();
    }
  }

  py::list Counters() {
    std::lock_guard lock(mu_);
    py::list out;
    for (size_t i = 0; i < tiers_.size(); ++i) {
      TierCounters c = tiers_[i]->counters();
      py::dict d;
      d["tier"] = std::string(tiers_[i]->name());
      d["records"] = c.records;
      d["bytes"] = c.bytes;
      d["capacity_bytes"] = c.capacity_bytes;
      d["evictions"] = c.evictions;
      d["quarantined"] = c.quarantined;
      d["hits"] = hits_[i];
      out.append(d);
    }
    return out;
  }

  py::dict Stats() {
    std::lock_guard lock(mu_);
    py::dict d;
    d["demoted"] = demoted_;
    d["dropped"] = dropped_;
    d["put_errors"] = put_errors_;
    d["last_error"] = last_error_;
    return d;
  }

  std::vector<std::string> Names() const {
    std::vector<std::string> out;
    for (auto& t : tiers_) out.emplace_back(t->name());
    return out;
  }

 private:
  // REQUIRES: mu_ held (called from Put or from a tier's eviction listener inside PutBatch).
  // Whether a tier at or below `to` holds the record afterwards.
  bool Demote(size_t to, const TierRecord& r) {
    if (to >= tiers_.size()) {
      ++dropped_;
      return false;
    }
    const TierRecord* p = &r;
    Status st = tiers_[to]->PutBatch(std::span<const TierRecord* const>(&p, 1));
    if (!st.ok()) {
      last_error_ = st.ToString();
      ++put_errors_;
      return Demote(to + 1, r);
    }
    ++demoted_;
    return true;
  }

  bool ContainsLocked(const Hash128& k) {
    const std::vector<Hash128> key{k};
    for (auto& t : tiers_) {
      if (t->ContainsBatch(key)[0]) return true;
    }
    return false;
  }

  std::mutex mu_;
  std::vector<std::unique_ptr<Tier>> tiers_;
  std::vector<uint64_t> hits_;
  uint64_t max_record_bytes_;
  bool write_through_;
  int through_ = -1;
  uint64_t demoted_ = 0, dropped_ = 0, put_errors_ = 0;
  std::string last_error_;
};

// The RequestManager an engine-shaped KV-cache manager adapter drives (tessera.vllm.KVCacheManager):
// no bytes (the KV lives in the engine), no content dedup (vLLM keeps duplicate blocks apart), and
// the block reuse order asked for ("release-order": vLLM's free block queue), and caller-keyed
// admissions when asked (ADR 0045).
std::shared_ptr<PyManager> EngineManager(const py::object& model, const py::object& block_tokens,
                                         const py::object& capacity_blocks, const py::object& max_requests,
                                         const py::object& block_reuse, const py::object& caller_keys) {
  auto pm = std::make_shared<PyManager>();
  pm->geometry = Take(LoadPreset(ToStr(model, "model")));
  ManagerOptions o;
  o.block_tokens = ToU64(block_tokens, "block_tokens");
  o.capacity_blocks = ToU32(capacity_blocks, "capacity_blocks");
  o.max_requests = ToU32(max_requests, "max_requests");
  o.region_kind = RegionKind::kUnbacked;
  o.content_dedup = false;
  o.caller_keys = ToBool(caller_keys, "caller_keys");
  const std::string reuse = ToStr(block_reuse, "block_reuse");
  if (reuse == "release-order") {
    o.block_reuse = BlockReuse::kReleaseOrder;
  } else if (reuse != "free-first") {
    ThrowValue("block_reuse", "must be \"free-first\" or \"release-order\" (got \"" + reuse + "\")");
  }
  pm->backed = false;
  pm->m = Take(RequestManager::Create(pm->geometry, o));
  pm->kv_format = std::string(pm->m->pool().groups().front().format.name);
  return pm;
}

}  // namespace

void BindTierRecords(py::module_& m) {
  py::class_<RecordTiers>(m, "RecordTiers",
                          "Tessera's tiers (host, disk, redis) as a verified keyed record store; records put into "
                          "the first tier, demoted to the next on eviction (docs/PYTHON.md).")
      .def(py::init([](py::handle tiers, py::handle write_through, py::handle max_record_bytes) {
             const bool wt = ToBool(write_through, "write_through");
             const uint64_t max = max_record_bytes.is_none()
                                      ? kDefaultMaxRecordBytes
                                      : ToU64(max_record_bytes, "max_record_bytes", 512ull << 20);
             return std::make_unique<RecordTiers>(tiers, wt, max);
           }),
           py::arg("tiers"), py::kw_only(), py::arg("write_through") = false, py::arg("max_record_bytes") = py::none())
      .def(
          "put",
          [](RecordTiers& t, py::handle keys, py::handle payloads, py::handle format_id) {
            return t.Put(keys, payloads, static_cast<uint32_t>(ToU64(format_id, "format_id", UINT16_MAX)));
          },
          py::arg("keys"), py::arg("payloads"), py::arg("format_id") = 0,
          "Stores payloads under 16-byte keys; per key whether a tier holds it afterwards.")
      .def("get", &RecordTiers::Get, py::arg("keys"),
           "Per key (format_id, bytes) from the first tier holding a verified copy, or None.")
      .def("contains", &RecordTiers::Contains, py::arg("keys"))
      .def("erase", &RecordTiers::Erase, py::arg("keys"))
      .def("counters", &RecordTiers::Counters, "Per tier: records, bytes, capacity, evictions, quarantined, hits.")
      .def("stats", &RecordTiers::Stats, "demoted, dropped, put_errors, last_error.")
      .def_property_readonly("tier_names", &RecordTiers::Names);

  m.def("_engine_request_manager", &EngineManager, py::arg("model"), py::kw_only(), py::arg("block_tokens"),
        py::arg("capacity_blocks"), py::arg("max_requests"), py::arg("block_reuse") = "release-order",
        py::arg("caller_keys") = false,
        "An unbacked RequestManager for an engine adapter (tessera.vllm.KVCacheManager), without content "
        "dedup, with the given block reuse order (\"release-order\" or \"free-first\") and, when "
        "caller_keys, caller-keyed admissions (ADR 0045).");
}

}  // namespace tessera::py_bind

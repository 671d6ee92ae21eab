// tessera._core._EngineBlockPool: Tessera's BlockPool as the one block pool that every KV-cache
// group of an engine takes its blocks from — vLLM's hybrid models (DeepSeek-V4: a compressed
// group, sliding-window groups and compressor-state groups, each with its own tokens per block,
// all drawing from one pool of pages). tessera.vllm.KVCacheManager uses it for models with
// several groups (docs/adr/0028-vllm-hybrid-groups.md); the per-group policy (which blocks a
// group holds, hits, what leaves a window) is the adapter's.
//
// The pool is unbacked (the KV lives in the engine's buffer) and reuses blocks in release order
// (BlockReuse::kReleaseOrder: vLLM's free block queue) unless asked for "free-first". Each block
// carries a count of references held through this object:
//   allocate(n)   n fresh blocks, one reference each; None (nothing changed) when the pool cannot
//                 hand out n (free + cached blocks, the cached ones evicted oldest first).
//   pin(ids)      one more reference to each (a sealed block in use, or a cached one: a hit).
//   release(ids)  one reference less for each, in the order given; a block whose last reference
//                 goes is cached when sealed (kept for hits, evictable) and free otherwise, and
//                 joins the reuse order there.
//   seal(ids)     the block's contents are final (it may be hit): filling -> sealed.
//   take_evicted() the ids of the cached blocks evicted since the last call (in order).
// Every id is checked (range, state, references) before anything changes: a ValueError names the
// argument and the pool is untouched.
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common.h"
#include "tessera/block_pool.h"
#include "tessera/format.h"
#include "tessera/geometry.h"
#include "tessera/layout.h"

namespace tessera::py_bind {
namespace {

class EngineBlockPool {
 public:
  EngineBlockPool(uint32_t capacity, BlockReuse reuse) {
    // Bookkeeping only (unbacked): one group of one-byte records, one token per block.
    PoolGroup g;
    g.name = "engine";
    g.format.name = "engine";
    g.format.regions = {{"x", ElementType::kFp8E4M3, 1, 0}};
    g.page = TakeAs(ComputePageLayout(g.format, 1, 1), "capacity");
    g.layers = 1;
    BlockPoolOptions o;
    o.groups = {std::move(g)};
    o.capacity_blocks = capacity;
    o.region_kind = RegionKind::kUnbacked;
    o.reuse = reuse;
    pool_ = TakeAs(BlockPool::Create(std::move(o)), "capacity");
    refs_.reserve(capacity);
    for (uint32_t i = 0; i < capacity; ++i) refs_.emplace_back(pool_.get());
    pool_->AddEvictionListener([this](BlockId b) { evicted_.push_back(b.value); });
  }
  EngineBlockPool(const EngineBlockPool&) = delete;
  EngineBlockPool& operator=(const EngineBlockPool&) = delete;
  ~EngineBlockPool() {
    refs_.clear();  // references go back before the pool
  }

  py::object Allocate(py::handle n_obj) {
    const uint32_t n = ToU32(n_obj, "n");
    PinnedBlocks fresh(pool_.get());
    const Status st = fresh.Allocate(n);
    if (st.code() == StatusCode::kOutOfBlocks) return py::none();
    Check(st);
    std::vector<uint32_t> ids;
    ids.reserve(n);
    for (BlockId b : fresh.ids()) {
      refs_[b.value].Pin(b);
      ids.push_back(b.value);
    }
    fresh.Clear();  // each block keeps the one reference pinned above
    return py::cast(ids);
  }

  void Pin(py::handle ids_obj) {
    const std::vector<uint32_t> ids = Ids(ids_obj);
    for (uint32_t b : ids) {
      const BlockState s = pool_->state(BlockId{b});
      if (s != BlockState::kSealed && s != BlockState::kCached) {
        ThrowValue("ids", "block " + std::to_string(b) + " is " + std::string(BlockStateName(s)) +
                              " (pin takes sealed or cached blocks)");
      }
    }
    for (uint32_t b : ids) refs_[b].Pin(BlockId{b});
  }

  void Release(py::handle ids_obj) {
    const std::vector<uint32_t> ids = Ids(ids_obj);
    {  // every id must hold as many references as it is released (repeats included)
      std::unordered_map<uint32_t, size_t> count;
      for (uint32_t b : ids) {
        if (++count[b] > refs_[b].size()) {
          ThrowValue("ids", "block " + std::to_string(b) + " is released more often than it is held");
        }
      }
    }
    for (uint32_t b : ids) refs_[b].Truncate(refs_[b].size() - 1);
  }

  void Seal(py::handle ids_obj) {
    const std::vector<uint32_t> ids = Ids(ids_obj);
    std::unordered_set<uint32_t> seen;
    for (uint32_t b : ids) {
      if (pool_->state(BlockId{b}) != BlockState::kFilling) {
        ThrowValue("ids", "block " + std::to_string(b) + " is " +
                              std::string(BlockStateName(pool_->state(BlockId{b}))) + " (seal takes filling blocks)");
      }
      if (!seen.insert(b).second) ThrowValue("ids", "block " + std::to_string(b) + " is named twice");
    }
    for (uint32_t b : ids) pool_->MarkSealed(BlockId{b});
  }

  std::vector<uint32_t> TakeEvicted() { return std::exchange(evicted_, {}); }

  uint32_t available() const { return pool_->Available(); }
  uint32_t capacity() const { return pool_->capacity(); }
  uint32_t cached() const { return pool_->cached_count(); }
  uint32_t refcount(py::handle id) const { return static_cast<uint32_t>(refs_[Id(id)].size()); }
  std::string state(py::handle id) const { return std::string(BlockStateName(pool_->state(BlockId{Id(id)}))); }
  void CheckInvariants() const { Check(pool_->CheckInvariants()); }

 private:
  uint32_t Id(py::handle obj) const {
    const uint32_t b = ToU32(obj, "id");
    if (b >= refs_.size()) {
      ThrowValue("id",
                 "block " + std::to_string(b) + " is out of range (capacity " + std::to_string(refs_.size()) + ")");
    }
    return b;
  }
  std::vector<uint32_t> Ids(py::handle obj) const {
    U32Array a;
    ToU32Array(obj, "ids", &a);
    std::vector<uint32_t> ids(a.data, a.data + a.size);
    for (uint32_t b : ids) {
      if (b >= refs_.size()) {
        ThrowValue("ids",
                   "block " + std::to_string(b) + " is out of range (capacity " + std::to_string(refs_.size()) + ")");
      }
    }
    return ids;
  }

  std::unique_ptr<BlockPool> pool_;
  std::vector<PinnedBlocks> refs_;  // per block: the references held through this object
  std::vector<uint32_t> evicted_;
};

// The main layers of a preset as an adapter needs them to lay out an engine's KV-cache groups:
// per layer its kind and compress ratio, with the model's sliding window (0 without windows).
py::dict ModelLayers(py::handle model) {
  const Geometry g = Take(LoadPreset(ToStr(model, "model")));
  py::list layers;
  for (const LayerSpec& l : g.layers) {
    if (l.is_mtp) continue;
    layers.append(py::make_tuple(std::string(LayerKindName(l.kind)), l.compress_ratio));
  }
  py::dict d;
  d["name"] = g.name;
  d["sliding_window"] = g.sliding_window;
  d["hybrid"] = g.is_hybrid;
  d["layers"] = layers;
  return d;
}

}  // namespace

void BindEnginePool(py::module_& m) {
  m.def("_model_layers", &ModelLayers, py::arg("model"),
        "A preset's main layers as (kind, compress_ratio), its sliding window and whether it is hybrid "
        "(DeepSeek-V4 family).");
  py::class_<EngineBlockPool>(m, "_EngineBlockPool",
                              "Tessera's BlockPool as the shared pool of an engine adapter's KV-cache groups "
                              "(tessera.vllm.KVCacheManager for models with several groups).")
      .def(py::init([](py::handle capacity, py::handle reuse) {
             const uint32_t cap = ToU32(capacity, "capacity");
             if (cap == 0) ThrowValue("capacity", "must be at least 1");
             const std::string r = ToStr(reuse, "block_reuse");
             BlockReuse br = BlockReuse::kReleaseOrder;
             if (r == "free-first") {
               br = BlockReuse::kFreeFirst;
             } else if (r != "release-order") {
               ThrowValue("block_reuse", "must be \"release-order\" or \"free-first\" (got \"" + r + "\")");
             }
             return std::make_unique<EngineBlockPool>(cap, br);
           }),
           py::arg("capacity"), py::kw_only(), py::arg("block_reuse") = "release-order")
      .def("allocate", &EngineBlockPool::Allocate, py::arg("n"))
      .def("pin", &EngineBlockPool::Pin, py::arg("ids"))
      .def("release", &EngineBlockPool::Release, py::arg("ids"))
      .def("seal", &EngineBlockPool::Seal, py::arg("ids"))
      .def("take_evicted", &EngineBlockPool::TakeEvicted)
      .def_property_readonly("available", &EngineBlockPool::available)
      .def_property_readonly("capacity", &EngineBlockPool::capacity)
      .def_property_readonly("cached", &EngineBlockPool::cached)
      .def("refcount", &EngineBlockPool::refcount, py::arg("id"))
      .def("state", &EngineBlockPool::state, py::arg("id"))
      .def("check_invariants", &EngineBlockPool::CheckInvariants);
}

}  // namespace tessera::py_bind

// The Python-side owner of a RequestManager (bind_manager.cc) and what other binding files need
// of it (bind_store.cc attaches a tiered store; a binding that reads records takes its lock).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "tessera/geometry.h"
#include "tessera/request_manager.h"
#include "tessera/tiered_store.h"

namespace tessera::py_bind {

// One tessera.RequestManager. Held by a std::shared_ptr: numpy views of its pages and the
// TieredStore handles keep it alive.
//
// Thread-safety: the manager is single-owner; every call takes `mu` (ManagerLock). Calls that
// release the GIL (admit, step, checkpoint, flush) hold `mu` meanwhile, so a second Python thread
// waits for it instead of racing.
struct PyManager {
  // Declared before `m`, so destroyed after it: the manager may still hand blocks to its source
  // while it is destroyed.
  std::shared_ptr<TieredStore> store;
  std::unique_ptr<RequestManager> m;
  Geometry geometry;
  std::string kv_format;
  bool backed = true;

  // Step scratch: the batch's handles and ids, duplicate marks (by slot), and the result.
  std::vector<uint64_t> handles;
  std::vector<RequestId> ids;
  std::vector<uint32_t> seen;
  uint32_t seen_epoch = 0;
  StepResult result;
  // The vLLM adapter's caller-keyed calls: the hashes read from a request's block_hashes.
  std::vector<CallerHash> caller_hashes;
  // vLLM's block ids (pool id + 1) as Python ints, made once each on first use: the adapter's
  // block lists reference them instead of allocating an int per entry per call (ints are
  // immutable). Released with the manager, under the GIL (the Python object's deallocation).
  std::vector<py::object> vllm_ids;
  // Writable numpy views handed out (weak: the arrays' lives are the caller's), with the block
  // and the life of it they were taken in; RevokeViews makes them read-only once that block is
  // no longer filling by one table (issue 27.7, ADR 0039).
  struct WritableExport {
    py::weakref array;
    BlockId block;
    uint32_t generation = 0;
  };
  std::vector<WritableExport> writable;

  std::mutex mu;
  std::atomic<std::thread::id> owner{};

  // Python's request ids are handles: generation << 32 | slot (as tessera serve's), so an id kept
  // past its free names nothing once the slot is reused (issue 27.2).
  static uint64_t Handle(RequestId id) { return uint64_t{id.generation} << 32 | id.value; }
  // The live request `handle` names, or nullopt (freed, stale or never issued).
  std::optional<RequestId> Find(uint64_t handle) const {
    const std::optional<RequestId> id = m->LiveAt(static_cast<uint32_t>(handle));
    if (!id || Handle(*id) != handle) return std::nullopt;
    return id;
  }
  // REQUIRES: the lock and the GIL. Every writable view whose block was sealed, freed or shared
  // since it was taken becomes read-only; dead entries are dropped. Called after each call that
  // can seal, free or share a block (append, recompute, step, fork, free).
  void RevokeViews();
  // ValueError naming `arg` unless `r` is a live request.
  RequestId Live(py::handle r, const char* arg = "request_id") const;
};

// Holds a PyManager's lock for a call; waits (without the GIL) while another thread's call is
// in progress. A call from inside one of the manager's own calls is a TesseraError.
class ManagerLock {
 public:
  explicit ManagerLock(PyManager& pm);
  ~ManagerLock();
  ManagerLock(const ManagerLock&) = delete;
  ManagerLock& operator=(const ManagerLock&) = delete;

 private:
  PyManager& pm_;
};

// Metric families as {name: {type, help, samples: {labels: value}}} (the manager's and the store's).
py::dict MetricsDict(const std::vector<MetricFamily>& families);

}  // namespace tessera::py_bind

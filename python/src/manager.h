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

  // Which request ids are live (the manager's Get is private): admit, fork and free keep it.
  std::vector<uint8_t> live;
  // Step scratch: the batch's ids, duplicate marks, and the result.
  std::vector<RequestId> ids;
  std::vector<uint32_t> seen;
  uint32_t seen_epoch = 0;
  StepResult result;

  std::mutex mu;
  std::atomic<std::thread::id> owner{};

  bool IsLive(uint32_t r) const { return r < live.size() && live[r] != 0; }
  void SetLive(uint32_t r, bool on) {
    if (r >= live.size()) live.resize(size_t{r} + 1, 0);
    live[r] = on ? 1 : 0;
  }
  // The manager's id of live slot r, with the slot's generation (Python holds slot numbers: one
  // in-process owner; docs/adr/0031-serve-hardening.md). REQUIRES: IsLive(r).
  RequestId At(uint32_t r) const {
    const std::optional<RequestId> id = m->LiveAt(r);
    return id ? *id : RequestId{r, UINT32_MAX};
  }
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

// KV-cache events (include/tessera/kv_events.h): RequestManager.take_events() drains what the
// manager recorded (constructor option kv_events=True) as tessera.KvEvent objects.
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "manager.h"
#include "tessera/kv_events.h"

namespace tessera::py_bind {

namespace {

// One event with Python values: block hashes as 16-byte bytes (the high word first, big-endian:
// the bytes `tessera serve` publishes and Hash128::Hex prints).
struct PyKvEvent {
  std::string kind;  // "BlockStored", "BlockRemoved", "AllBlocksCleared"
  py::list block_hashes;
  py::object parent_block_hash = py::none();
  py::array token_ids;
  uint32_t block_size = 0;
  uint32_t domain = 0;
  std::string medium;  // "GPU" or "CPU"
};

py::bytes HashBytes(const Hash128& h) {
  char b[16];
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<char>((h.hi >> (56 - 8 * i)) & 0xff);
    b[8 + i] = static_cast<char>((h.lo >> (56 - 8 * i)) & 0xff);
  }
  return py::bytes(b, 16);
}

PyKvEvent Convert(const KvEvent& e) {
  PyKvEvent out;
  out.kind = std::string(KvEventKindName(e.kind));
  for (const Hash128& h : e.block_hashes) out.block_hashes.append(HashBytes(h));
  if (e.parent_block_hash) out.parent_block_hash = HashBytes(*e.parent_block_hash);
  py::array_t<uint32_t> tokens(static_cast<ssize_t>(e.token_ids.size()));
  if (!e.token_ids.empty()) {
    std::copy(e.token_ids.begin(), e.token_ids.end(), tokens.mutable_data());
  }
  out.token_ids = std::move(tokens);
  out.block_size = e.block_size;
  out.domain = e.domain;
  out.medium = std::string(KvMediumName(e.medium));
  return out;
}

}  // namespace

void BindEvents(py::module_& m) {
  py::class_<PyKvEvent>(m, "KvEvent")
      .def_readonly("kind", &PyKvEvent::kind)
      .def_readonly("block_hashes", &PyKvEvent::block_hashes)
      .def_readonly("parent_block_hash", &PyKvEvent::parent_block_hash)
      .def_readonly("token_ids", &PyKvEvent::token_ids)
      .def_readonly("block_size", &PyKvEvent::block_size)
      .def_readonly("domain", &PyKvEvent::domain)
      .def_readonly("medium", &PyKvEvent::medium)
      .def("__repr__", [](const PyKvEvent& e) {
        return "KvEvent(kind=" + e.kind + ", blocks=" + std::to_string(e.block_hashes.size()) +
               ", tokens=" + std::to_string(e.token_ids.size()) + ", medium=" + e.medium + ")";
      });

  auto cls = py::reinterpret_borrow<py::class_<PyManager, std::shared_ptr<PyManager>>>(m.attr("RequestManager"));
  cls.def(
      "take_events",
      [](PyManager& pm) {
        std::vector<KvEvent> events;
        {
          ManagerLock lk(pm);
          events = pm.m->TakeKvEvents();
        }
        py::list out;
        for (const KvEvent& e : events) out.append(py::cast(Convert(e)));
        return out;
      },
      "The KV-cache events recorded since the last call, oldest first (kv_events=True; else none).");
}

}  // namespace tessera::py_bind

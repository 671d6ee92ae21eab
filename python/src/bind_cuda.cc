// tessera._core.CudaStaging: device <-> pinned host staging of pages in memory the caller owns (a
// torch CUDA tensor's paged KV cache), through the CUDA module's DeviceTransfer (ADR 0030).
//
// Built with the CUDA module only (TESSERA_PY_CUDA, set by python/CMakeLists.txt when
// tessera_cudart is built). Without it the module has CUDA_BUILT = False, cuda_device_count()
// answers 0 and there is no CudaStaging class.
//
// A caller's device memory becomes a kDevice region of the object's own RegionTable through a
// borrowing DeviceAllocator (memory.h): its allocate hands out the address being added and its
// release frees nothing, so Tessera never frees a tensor's memory. The allocator is installed for
// the one AddRegion call, under a lock, and the previous one put back.
//
// Thread-safety: one CudaStaging is used from several Python threads (vLLM's forward, the
// connector's load and save threads); every call takes the object's mutex, with the GIL released.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common.h"

#ifdef TESSERA_PY_CUDA
#include <xxhash.h>

#include "tessera/cuda_device.h"
#include "tessera/memory.h"
#endif

namespace tessera::py_bind {

#ifdef TESSERA_PY_CUDA
namespace {

std::mutex g_borrow_mu;
uint64_t g_borrow_address = 0;  // the address AddRegion is adding; guarded by g_borrow_mu

Result<uint64_t> BorrowAllocate(uint64_t /*bytes*/) { return g_borrow_address; }
void BorrowRelease(uint64_t /*address*/) {}
const DeviceAllocator kBorrowing{&BorrowAllocate, &BorrowRelease};

class CudaStaging {
 public:
  CudaStaging(int device, uint64_t staging_bytes) : xfer_(Take(cuda::DeviceTransfer::Create(staging_bytes, device))) {}

  // Adds [address, address + bytes) of device memory the caller keeps alive; its region id.
  uint32_t Add(uint64_t address, uint64_t bytes, const std::string& name) {
    if (address == 0) ThrowValue("address", "a null device address");
    if (bytes == 0) ThrowValue("bytes", "must be positive");
    std::scoped_lock lock(mu_);
    std::scoped_lock borrow(g_borrow_mu);
    g_borrow_address = address;
    const DeviceAllocator* previous = InstallDeviceAllocator(&kBorrowing);
    Result<uint32_t> r = regions_.AddRegion(RegionKind::kDevice, bytes, name);
    InstallDeviceAllocator(previous);
    return Take(std::move(r));
  }

  // The bytes of [offset, offset + len) of `region`, staged through the pinned buffer.
  py::bytes Read(uint32_t region, uint64_t offset, uint64_t len) {
    const BlockHandle h = Handle(region, offset, len);
    std::string out(len, '\0');
    Status st;
    {
      py::gil_scoped_release nogil;
      std::scoped_lock lock(mu_);
      std::span<std::byte> dst(reinterpret_cast<std::byte*>(out.data()), out.size());
      uint64_t xxh3 = 0;
      st = xfer_->Demote(regions_, std::span(&h, 1), std::span(&dst, 1), std::span(&xxh3, 1), {}, &stats_);
    }
    Check(st);
    return py::bytes(out);
  }

  // Writes `data` (a contiguous buffer of bytes) at [offset, offset + len(data)) of `region`.
  void Write(uint32_t region, uint64_t offset, const py::buffer& data) {
    const py::buffer_info info = data.request();
    if (info.ndim != 1 || info.itemsize != 1 || (info.ndim == 1 && info.strides[0] != 1)) {
      ThrowType("data", "must be a contiguous one-dimensional buffer of bytes");
    }
    const BlockHandle h = Handle(region, offset, static_cast<uint64_t>(info.size));
    Status st;
    {
      py::gil_scoped_release nogil;
      std::scoped_lock lock(mu_);
      std::span<const std::byte> src(static_cast<const std::byte*>(info.ptr), static_cast<size_t>(info.size));
      const uint64_t xxh3 = XXH3_64bits(src.data(), src.size());
      st = xfer_->Promote(std::span(&src, 1), std::span(&xxh3, 1), regions_, std::span(&h, 1), &stats_);
    }
    Check(st);
  }

  py::dict Stats() {
    std::scoped_lock lock(mu_);
    py::dict d;
    d["blocks"] = stats_.blocks;
    d["bytes"] = stats_.bytes;
    d["copies"] = stats_.copies;
    return d;
  }

 private:
  BlockHandle Handle(uint32_t region, uint64_t offset, uint64_t len) {
    std::scoped_lock lock(mu_);
    if (region >= regions_.size()) ThrowValue("region", "no region " + std::to_string(region));
    if (len == 0) ThrowValue("len", "must be positive");
    if (offset > regions_.region_bytes(region) || len > regions_.region_bytes(region) - offset) {
      ThrowValue("offset", "runs past the " + std::to_string(regions_.region_bytes(region)) + "-byte region");
    }
    return BlockHandle{region, offset, len};
  }

  std::mutex mu_;
  RegionTable regions_;                         // guarded by mu_
  std::unique_ptr<cuda::DeviceTransfer> xfer_;  // guarded by mu_
  cuda::TransferStats stats_;                   // guarded by mu_
};

}  // namespace
#endif

void BindCuda(py::module_& m) {
#ifdef TESSERA_PY_CUDA
  m.attr("CUDA_BUILT") = true;
  m.def(
      "cuda_device_count", [] { return cuda::DeviceCount(); },
      "CUDA devices the runtime sees (0 without a device or driver).");
  py::class_<CudaStaging>(m, "CudaStaging",
                          "Device <-> pinned host staging of pages in caller-owned device memory (the CUDA "
                          "module's DeviceTransfer). ValueError on 'device' without a CUDA device.")
      .def(py::init([](py::handle device, py::handle staging_bytes) {
             const uint32_t d = ToU32(device, "device");
             const uint64_t s = ToU64(staging_bytes, "staging_bytes");
             return std::make_unique<CudaStaging>(static_cast<int>(d), s);
           }),
           py::arg("device"), py::arg("staging_bytes"))
      .def(
          "add",
          [](CudaStaging& c, py::handle address, py::handle bytes, py::handle name) {
            return c.Add(ToU64(address, "address"), ToU64(bytes, "bytes"), ToStr(name, "name"));
          },
          py::arg("address"), py::arg("bytes"), py::arg("name"))
      .def(
          "read",
          [](CudaStaging& c, py::handle region, py::handle offset, py::handle len) {
            return c.Read(ToU32(region, "region"), ToU64(offset, "offset"), ToU64(len, "len"));
          },
          py::arg("region"), py::arg("offset"), py::arg("len"))
      .def(
          "write",
          [](CudaStaging& c, py::handle region, py::handle offset, const py::buffer& data) {
            c.Write(ToU32(region, "region"), ToU64(offset, "offset"), data);
          },
          py::arg("region"), py::arg("offset"), py::arg("data"))
      .def_property_readonly("stats", &CudaStaging::Stats);
#else
  m.attr("CUDA_BUILT") = false;
  m.def(
      "cuda_device_count", [] { return 0; }, "0: this build has no CUDA module.");
#endif
}

}  // namespace tessera::py_bind

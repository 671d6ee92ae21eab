#include "tessera/memory.h"

#include <sys/mman.h>

#include <atomic>
#include <cassert>

namespace tessera {

namespace {
std::atomic<const DeviceAllocator*> g_device_allocator{nullptr};
}  // namespace

std::string_view RegionKindName(RegionKind kind) {
  switch (kind) {
    case RegionKind::kHost:
      return "host";
    case RegionKind::kUnbacked:
      return "unbacked";
    case RegionKind::kDevice:
      return "device";
  }
  return "unknown";
}

const DeviceAllocator* InstallDeviceAllocator(const DeviceAllocator* allocator) {
  return g_device_allocator.exchange(allocator);
}
const DeviceAllocator* InstalledDeviceAllocator() { return g_device_allocator.load(); }

RegionTable::~RegionTable() {
  for (const Region& r : regions_) {
    if (r.base != nullptr) ::munmap(r.base, r.bytes);
    if (r.allocator != nullptr) r.allocator->release(r.device);
  }
}

Result<uint32_t> RegionTable::AddRegion(RegionKind kind, uint64_t bytes, std::string name) {
  if (bytes == 0) return InvalidArgument("region", "a region needs at least one byte");
  std::byte* base = nullptr;
  if (kind == RegionKind::kHost) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return OutOfBlocks("region", "cannot map " + std::to_string(bytes) + " bytes of host memory for " + name);
    }
    base = static_cast<std::byte*>(p);
  }
  uint64_t device = 0;
  const DeviceAllocator* allocator = nullptr;
  if (kind == RegionKind::kDevice) {
    allocator = g_device_allocator.load();
    if (allocator == nullptr || allocator->allocate == nullptr || allocator->release == nullptr) {
      return FailedPrecondition("device",
                                "no device allocator installed for " + name + " (this binary links no device library)");
    }
    Result<uint64_t> a = allocator->allocate(bytes);
    if (!a.ok()) return a.status();
    device = *a;
  }
  regions_.push_back({kind, base, bytes, std::move(name), device, allocator});
  return static_cast<uint32_t>(regions_.size() - 1);
}

std::span<std::byte> RegionTable::Resolve(const BlockHandle& h) const {
  assert(h.region < regions_.size() && "handle names an unknown region");
  const Region& r = regions_[h.region];
  assert(r.base != nullptr && "handle names an unbacked or device region");
  assert(h.offset <= r.bytes && h.len <= r.bytes - h.offset && "handle runs past its region");
  return {r.base + h.offset, h.len};
}

Result<std::span<std::byte>> RegionTable::ResolveChecked(const BlockHandle& h) const {
  if (h.region >= regions_.size()) return InvalidArgument("handle", "unknown region " + std::to_string(h.region));
  const Region& r = regions_[h.region];
  if (r.base == nullptr) {
    return InvalidArgument("handle",
                           "region " + r.name + " (" + std::string(RegionKindName(r.kind)) + ") has no host bytes");
  }
  if (h.offset > r.bytes || h.len > r.bytes - h.offset) {
    return InvalidArgument("handle", "range [" + std::to_string(h.offset) + ", +" + std::to_string(h.len) +
                                         ") runs past region " + r.name);
  }
  return std::span<std::byte>(r.base + h.offset, h.len);
}

Result<uint64_t> RegionTable::DeviceAddress(const BlockHandle& h) const {
  if (h.region >= regions_.size()) return InvalidArgument("handle", "unknown region " + std::to_string(h.region));
  const Region& r = regions_[h.region];
  if (r.kind != RegionKind::kDevice) {
    return InvalidArgument(
        "handle", "region " + r.name + " is " + std::string(RegionKindName(r.kind)) + " memory, not device memory");
  }
  if (h.offset > r.bytes || h.len > r.bytes - h.offset) {
    return InvalidArgument("handle", "range [" + std::to_string(h.offset) + ", +" + std::to_string(h.len) +
                                         ") runs past region " + r.name);
  }
  return r.device + h.offset;
}

uint64_t RegionTable::bytes_of(RegionKind kind) const {
  uint64_t total = 0;
  for (const Region& r : regions_) {
    if (r.kind == kind) total += r.bytes;
  }
  return total;
}

}  // namespace tessera

#include "tessera/memory.h"

#include <sys/mman.h>

#include <cassert>

namespace tessera {

RegionTable::~RegionTable() {
  for (const Region& r : regions_) {
    if (r.base != nullptr) ::munmap(r.base, r.bytes);
  }
}

Result<uint32_t> RegionTable::AddRegion(RegionKind kind, uint64_t bytes, std::string name) {
  if (bytes == 0) return InvalidArgument("region", "a region needs at least one byte");
  std::byte* base = nullptr;
  if (kind == RegionKind::kHost) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return Status(StatusCode::kOutOfBlocks, "region",
                    "cannot map " + std::to_string(bytes) + " bytes of host memory for " + name);
    }
    base = static_cast<std::byte*>(p);
  }
  regions_.push_back({kind, base, bytes, std::move(name)});
  return static_cast<uint32_t>(regions_.size() - 1);
}

std::span<std::byte> RegionTable::Resolve(const BlockHandle& h) const {
  assert(h.region < regions_.size() && "handle names an unknown region");
  const Region& r = regions_[h.region];
  assert(r.base != nullptr && "handle names an unbacked region");
  assert(h.offset <= r.bytes && h.len <= r.bytes - h.offset && "handle runs past its region");
  return {r.base + h.offset, h.len};
}

Result<std::span<std::byte>> RegionTable::ResolveChecked(const BlockHandle& h) const {
  if (h.region >= regions_.size()) return InvalidArgument("handle", "unknown region " + std::to_string(h.region));
  const Region& r = regions_[h.region];
  if (r.base == nullptr) return InvalidArgument("handle", "region " + r.name + " has no host bytes");
  if (h.offset > r.bytes || h.len > r.bytes - h.offset) {
    return InvalidArgument("handle", "range [" + std::to_string(h.offset) + ", +" + std::to_string(h.len) +
                                         ") runs past region " + r.name);
  }
  return std::span<std::byte>(r.base + h.offset, h.len);
}

}  // namespace tessera

// Memory regions and typed block handles.
//
// A region is a range of bytes owned by a backend: host memory, device memory (allocated by the
// device library a binary links, src/cuda: cudaMalloc, never managed memory), or address space
// only. Block metadata never stores a raw pointer: a block's bytes are
// named by BlockHandle {region, offset, len} and resolved through the RegionTable in O(1)
// (an index into a vector plus an add). Two live handles never overlap — the pools hand out
// disjoint page ranges, and tests check every pair after random operation sequences.
//
// Thread-safety: a RegionTable is built once and then read; Resolve() is safe from any thread
// while no region is added or removed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/status.h"

namespace tessera {

enum class RegionKind {
  kHost,      // host DRAM (anonymous mmap, zero-filled on first touch)
  kUnbacked,  // address space only: bookkeeping for memory that lives elsewhere (a device)
  kDevice,    // device memory from the installed DeviceAllocator (not host-addressable)
};
std::string_view RegionKindName(RegionKind kind);

// Who allocates kDevice regions. The memory module knows no device API: a device library installs
// one (tessera::cuda::InstallDeviceAllocator, src/cuda), and without one AddRegion(kDevice) is
// refused (kFailedPrecondition on "device"). allocate returns the region's device address or an
// error naming "device" (no device present, out of device memory); release frees what allocate
// returned. The allocator must outlive every table that used it.
struct DeviceAllocator {
  Result<uint64_t> (*allocate)(uint64_t bytes) = nullptr;
  void (*release)(uint64_t address) = nullptr;
};
// Installs `allocator` for every RegionTable in the process (nullptr uninstalls); returns the
// previous one. Safe from any thread; tables keep the allocator their regions came from.
const DeviceAllocator* InstallDeviceAllocator(const DeviceAllocator* allocator);
const DeviceAllocator* InstalledDeviceAllocator();

struct BlockHandle {
  uint32_t region = 0;
  uint64_t offset = 0;
  uint64_t len = 0;
  friend bool operator==(const BlockHandle&, const BlockHandle&) = default;
  // True when the two ranges share at least one byte of the same region.
  bool Overlaps(const BlockHandle& o) const {
    return region == o.region && len > 0 && o.len > 0 && offset < o.offset + o.len && o.offset < offset + len;
  }
};

class RegionTable {
 public:
  RegionTable() = default;
  ~RegionTable();
  RegionTable(const RegionTable&) = delete;
  RegionTable& operator=(const RegionTable&) = delete;

  // Adds a region of `bytes` bytes. Host regions are mmap'ed (MAP_NORESERVE) and zero-filled on
  // first touch; device regions come from the installed DeviceAllocator (contents undefined).
  // Errors: kInvalidArgument for 0 bytes, kOutOfBlocks when the mapping fails, kFailedPrecondition
  // on "device" when no allocator is installed, the allocator's error otherwise (nothing added).
  Result<uint32_t> AddRegion(RegionKind kind, uint64_t bytes, std::string name);

  // The bytes of `h`. REQUIRES: h lies inside a host region (asserted); O(1). Device regions have
  // no host bytes: DeviceAddress.
  std::span<std::byte> Resolve(const BlockHandle& h) const;
  // Like Resolve, but returns kInvalidArgument for a handle outside its region.
  Result<std::span<std::byte>> ResolveChecked(const BlockHandle& h) const;
  // The device address of `h`'s first byte. kInvalidArgument on "handle" for an unknown region, a
  // region that is not kDevice, or a range past its region.
  Result<uint64_t> DeviceAddress(const BlockHandle& h) const;

  // Bytes of the regions of one kind (region accounting).
  uint64_t bytes_of(RegionKind kind) const;

  size_t size() const { return regions_.size(); }
  RegionKind kind(uint32_t region) const { return regions_[region].kind; }
  uint64_t region_bytes(uint32_t region) const { return regions_[region].bytes; }
  const std::string& name(uint32_t region) const { return regions_[region].name; }

 private:
  struct Region {
    RegionKind kind;
    std::byte* base;  // host regions
    uint64_t bytes;
    std::string name;
    uint64_t device = 0;                         // device regions: the address
    const DeviceAllocator* allocator = nullptr;  // device regions: who frees it
  };
  std::vector<Region> regions_;
};

}  // namespace tessera

// Memory regions and typed block handles.
//
// A region is a range of bytes owned by a backend (host memory now; device memory and
// file-backed regions later). Block metadata never stores a raw pointer: a block's bytes are
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
#include <vector>

#include "tessera/status.h"

namespace tessera {

enum class RegionKind {
  kHost,      // host DRAM (anonymous mmap, zero-filled on first touch)
  kUnbacked,  // address space only: bookkeeping for memory that lives elsewhere (a device)
};

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
  // first touch. Errors: kInvalidArgument for 0 bytes, kOutOfBlocks when the mapping fails.
  Result<uint32_t> AddRegion(RegionKind kind, uint64_t bytes, std::string name);

  // The bytes of `h`. REQUIRES: h lies inside a host region (asserted); O(1).
  std::span<std::byte> Resolve(const BlockHandle& h) const;
  // Like Resolve, but returns kInvalidArgument for a handle outside its region.
  Result<std::span<std::byte>> ResolveChecked(const BlockHandle& h) const;

  size_t size() const { return regions_.size(); }
  RegionKind kind(uint32_t region) const { return regions_[region].kind; }
  uint64_t region_bytes(uint32_t region) const { return regions_[region].bytes; }
  const std::string& name(uint32_t region) const { return regions_[region].name; }

 private:
  struct Region {
    RegionKind kind;
    std::byte* base;
    uint64_t bytes;
    std::string name;
  };
  std::vector<Region> regions_;
};

}  // namespace tessera

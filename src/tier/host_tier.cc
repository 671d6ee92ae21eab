#include "tessera/host_tier.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <string>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(__x86_64__)
// Debian's libxxhash is built for baseline x86-64 (SSE2: 13-20 GB/s for xxh3-64 on the CI VM);
// its *_dispatch entry points pick AVX2/AVX-512 at run time (about 35-46 GB/s there), and this
// header maps XXH3_64bits and XXH3_64bits_update onto them. Same hash values.
#include <xxh_x86dispatch.h>
#endif

namespace tessera {

namespace {

// Copy and checksum in chunks that stay in the L2 cache, so that each byte is read from memory
// once: the checksum of a chunk is taken right after (Put) or right before (Get) the chunk is
// copied. The streaming xxh3-64 equals the one-shot xxh3-64 of the whole payload.
constexpr size_t kChunk = size_t{64} * 1024;

uint64_t CopyAndChecksum(std::byte* dst, const std::byte* src, size_t len) {
  if (len == 0) return XXH3_64bits(nullptr, 0);
  if (len <= kChunk) {
    std::memcpy(dst, src, len);
    return XXH3_64bits(dst, len);
  }
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  for (size_t off = 0; off < len; off += kChunk) {
    const size_t n = std::min(kChunk, len - off);
    std::memcpy(dst + off, src + off, n);
    XXH3_64bits_update(&state, dst + off, n);
  }
  return XXH3_64bits_digest(&state);
}

uint64_t ChecksumAndCopy(std::byte* dst, const std::byte* src, size_t len) {
  if (len == 0) return XXH3_64bits(nullptr, 0);
  if (len <= kChunk) {
    const uint64_t h = XXH3_64bits(src, len);
    std::memcpy(dst, src, len);
    return h;
  }
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  for (size_t off = 0; off < len; off += kChunk) {
    const size_t n = std::min(kChunk, len - off);
    XXH3_64bits_update(&state, src + off, n);
    std::memcpy(dst + off, src + off, n);
  }
  return XXH3_64bits_digest(&state);
}

}  // namespace

void HostTier::ArenaDeleter::operator()(std::byte* p) const {
  if (p != nullptr) ::munmap(p, bytes);
}

HostTier::HostTier(uint64_t capacity_bytes) : capacity_(capacity_bytes) {
  if (capacity_ > 0) InsertFree(0, capacity_);
}
HostTier::~HostTier() = default;
HostTier::HostTier(HostTier&&) noexcept = default;
HostTier& HostTier::operator=(HostTier&&) noexcept = default;

Status HostTier::ReserveArena() {
  if (arena_ != nullptr) return Status::Ok();
  // Reserved, not committed: pages are touched (and so backed) only as records are written.
  void* p = ::mmap(nullptr, capacity_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return OutOfBlocks("capacity", "cannot reserve the host tier's arena of " + std::to_string(capacity_) +
                                       " bytes: " + std::strerror(errno));
  }
  (void)::madvise(p, capacity_, MADV_HUGEPAGE);  // best effort: fewer page faults and TLB misses
  arena_ = std::unique_ptr<std::byte, ArenaDeleter>(static_cast<std::byte*>(p), ArenaDeleter{capacity_});
  return Status::Ok();
}

void HostTier::InsertFree(uint64_t offset, uint64_t len) {
  free_by_offset_.emplace(offset, len);
  free_by_size_.emplace(len, offset);
}

void HostTier::RemoveFree(uint64_t offset, uint64_t len) {
  free_by_offset_.erase(offset);
  free_by_size_.erase({len, offset});
}

std::optional<uint64_t> HostTier::Allocate(uint64_t len) {
  auto it = free_by_size_.lower_bound({len, 0});  // the smallest free range that fits
  if (it == free_by_size_.end()) return std::nullopt;
  const auto [range_len, offset] = *it;
  RemoveFree(offset, range_len);
  if (range_len > len) InsertFree(offset + len, range_len - len);
  return offset;
}

void HostTier::Free(uint64_t offset, uint64_t len) {
  // Coalesce with the free ranges just before and just after.
  auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      const uint64_t prev_offset = prev->first, prev_len = prev->second;
      RemoveFree(prev_offset, prev_len);
      offset = prev_offset;
      len += prev_len;
    }
  }
  next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.end() && next->first == offset + len) {
    const uint64_t next_offset = next->first, next_len = next->second;
    RemoveFree(next_offset, next_len);
    len += next_len;
  }
  InsertFree(offset, len);
}

void HostTier::Drop(std::list<Entry>::iterator it) {
  if (it->len > 0) Free(it->offset, it->len);
  bytes_ -= it->len;
  map_.erase(it->key);
  lru_.erase(it);
}

Status HostTier::Put(const Hash128& key, uint16_t format_id, std::span<const std::byte> payload) {
  const uint64_t len = payload.size();
  if (len > capacity_) {
    ++refused_;
    return OutOfBlocks("capacity", "a " + std::to_string(len) + "-byte record exceeds the host tier's " +
                                       std::to_string(capacity_) + " bytes");
  }
  if (len > 0) TESSERA_RETURN_IF_ERROR(ReserveArena());
  Erase(key);
  while (bytes_ + len > capacity_) EvictOne();
  uint64_t offset = 0;
  if (len > 0) {
    std::optional<uint64_t> got = Allocate(len);
    while (!got.has_value()) {
      // Enough free bytes, but not in one range (mixed sizes). An empty arena is one range of
      // `capacity_` bytes, so this ends before the tier is empty.
      if (lru_.empty()) return Internal("capacity", "the host tier's arena lost free bytes");
      EvictOne();
      ++fragmentation_evictions_;
      got = Allocate(len);
    }
    offset = *got;
  }
  const uint64_t checksum = CopyAndChecksum(arena_.get() + offset, payload.data(), len);
  lru_.push_front(Entry{key, format_id, checksum, offset, len});
  map_[key] = lru_.begin();
  bytes_ += len;
  return Status::Ok();
}

void HostTier::EvictOne() {
  auto victim = std::prev(lru_.end());
  if (on_evict_) {
    on_evict_(victim->key, victim->format_id, std::span<const std::byte>(arena_.get() + victim->offset, victim->len));
  }
  Drop(victim);
  ++evictions_;
}

Status HostTier::GetInto(const Hash128& key, std::span<std::byte> out, uint16_t* format_id) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    ++misses_;
    return NotFound("key", "not in the host tier");
  }
  const Entry& e = *it->second;
  if (out.size() < e.len) {
    return InvalidArgument("out", "a " + std::to_string(out.size()) + "-byte buffer cannot hold the " +
                                      std::to_string(e.len) + "-byte record");
  }
  const std::span<std::byte> whole = out.first(e.len);
  return CopyOut(it->second, std::span<const std::span<std::byte>>(&whole, 1), format_id);
}

Status HostTier::GetScattered(const Hash128& key, std::span<const std::span<std::byte>> out, uint16_t* format_id) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    ++misses_;
    return NotFound("key", "not in the host tier");
  }
  uint64_t total = 0;
  for (std::span<std::byte> o : out) total += o.size();
  if (total != it->second->len) {
    return InvalidArgument("out", std::to_string(total) + " bytes of buffers do not match the " +
                                      std::to_string(it->second->len) + "-byte record");
  }
  return CopyOut(it->second, out, format_id);
}

Status HostTier::CopyOut(std::list<Entry>::iterator entry, std::span<const std::span<std::byte>> out,
                         uint16_t* format_id) {
  const Entry& e = *entry;
  const std::byte* src = arena_.get() + e.offset;
  uint64_t checksum = 0;
  if (out.size() == 1) {
    checksum = ChecksumAndCopy(out[0].data(), src, out[0].size());
  } else {
    XXH3_state_t state;
    XXH3_INITSTATE(&state);
    XXH3_64bits_reset(&state);
    for (std::span<std::byte> o : out) {
      for (size_t off = 0; off < o.size(); off += kChunk) {
        const size_t n = std::min(kChunk, o.size() - off);
        XXH3_64bits_update(&state, src, n);
        std::memcpy(o.data() + off, src, n);
        src += n;
      }
    }
    checksum = XXH3_64bits_digest(&state);
  }
  if (checksum != e.checksum) {
    for (std::span<std::byte> o : out) {
      if (!o.empty()) std::memset(o.data(), 0, o.size());
    }
    ++quarantined_;
    Drop(entry);
    return DataLoss("key", "host record failed verification and was dropped");
  }
  lru_.splice(lru_.begin(), lru_, entry);
  ++hits_;
  if (format_id != nullptr) *format_id = e.format_id;
  return Status::Ok();
}

Result<std::vector<std::byte>> HostTier::Get(const Hash128& key, uint16_t* format_id) {
  std::optional<uint64_t> len = PayloadSize(key);
  if (!len.has_value()) {
    ++misses_;
    return NotFound("key", "not in the host tier");
  }
  std::vector<std::byte> out(*len);
  TESSERA_RETURN_IF_ERROR(GetInto(key, out, format_id));
  return out;
}

std::optional<uint64_t> HostTier::PayloadSize(const Hash128& key) const {
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  return it->second->len;
}

void HostTier::Erase(const Hash128& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return;
  Drop(it->second);
}

std::span<std::byte> HostTier::MutableBytesForTest(const Hash128& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return {};
  return std::span<std::byte>(arena_.get() + it->second->offset, it->second->len);
}

HostTierStats HostTier::stats() const {
  HostTierStats s;
  s.records = map_.size();
  s.bytes = bytes_;
  s.capacity_bytes = capacity_;
  s.hits = hits_;
  s.misses = misses_;
  s.evictions = evictions_;
  s.quarantined = quarantined_;
  s.refused = refused_;
  for (const auto& [offset, len] : free_by_offset_) {
    s.free_bytes += len;
    s.largest_free_range = std::max(s.largest_free_range, len);
  }
  s.free_ranges = free_by_offset_.size();
  s.arena_reserved = arena_ != nullptr;
  s.fragmentation_evictions = fragmentation_evictions_;
  return s;
}

std::vector<Hash128> HostTier::Keys() const {
  std::vector<Hash128> keys;
  keys.reserve(lru_.size());
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) keys.push_back(it->key);
  return keys;
}

}  // namespace tessera

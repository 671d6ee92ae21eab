#include "tessera/host_tier.h"

#include <xxhash.h>

namespace tessera {

Status HostTier::Put(const Hash128& key, uint16_t format_id, std::span<const std::byte> payload) {
  if (payload.size() > capacity_) {
    ++refused_;
    return Status(StatusCode::kOutOfBlocks, "capacity",
                  "a " + std::to_string(payload.size()) + "-byte record exceeds the host tier's " +
                      std::to_string(capacity_) + " bytes");
  }
  Erase(key);
  while (bytes_ + payload.size() > capacity_) EvictOne();
  lru_.push_front(Entry{key, format_id, XXH3_64bits(payload.data(), payload.size()),
                        std::vector<std::byte>(payload.begin(), payload.end())});
  map_[key] = lru_.begin();
  bytes_ += payload.size();
  return Status::Ok();
}

void HostTier::EvictOne() {
  Entry& victim = lru_.back();
  if (on_evict_) on_evict_(victim.key, victim.format_id, victim.payload);
  bytes_ -= victim.payload.size();
  map_.erase(victim.key);
  lru_.pop_back();
  ++evictions_;
}

Result<std::vector<std::byte>> HostTier::Get(const Hash128& key, uint16_t* format_id) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    ++misses_;
    return NotFound("key", "not in the host tier");
  }
  Entry& e = *it->second;
  if (XXH3_64bits(e.payload.data(), e.payload.size()) != e.checksum) {
    ++quarantined_;
    bytes_ -= e.payload.size();
    lru_.erase(it->second);
    map_.erase(it);
    return Status(StatusCode::kDataLoss, "key", "host record failed verification and was dropped");
  }
  lru_.splice(lru_.begin(), lru_, it->second);
  ++hits_;
  if (format_id != nullptr) *format_id = e.format_id;
  return e.payload;
}

void HostTier::Erase(const Hash128& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return;
  bytes_ -= it->second->payload.size();
  lru_.erase(it->second);
  map_.erase(it);
}

std::span<std::byte> HostTier::MutableBytesForTest(const Hash128& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return {};
  return it->second->payload;
}

HostTierStats HostTier::stats() const {
  return HostTierStats{map_.size(), bytes_, capacity_, hits_, misses_, evictions_, quarantined_, refused_};
}

}  // namespace tessera

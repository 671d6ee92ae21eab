// PrefixMap: prefix key -> block, the prefix index's table.
//
// Open addressing with linear probing in one array sized once for the pool (at most one entry
// per block; load factor at most 1/2), and backward-shift deletion, so there are no tombstones
// and no rebuilds: an insert or an erase never allocates and never rehashes, and a scheduler step
// that seals or evicts a thousand blocks costs a thousand probes, not a thousand mallocs and, now
// and then, a rehash of the whole index. Keys are keyed hashes (uniform), so the low bits of a key
// are its home slot.
//
// Thread-safety: none; the index's owner's.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/block_pool.h"
#include "tessera/hash128.h"

namespace tessera {

class PrefixMap {
 public:
  // Room for `max_entries` entries (REQUIRES: never more are inserted).
  explicit PrefixMap(size_t max_entries)
      : slots_(std::bit_ceil(std::max<size_t>(2 * max_entries, 16))), mask_(slots_.size() - 1) {}

  // The block under `key`, or nullptr.
  BlockId* Find(const Hash128& key) {
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (!s.block.valid()) return nullptr;
      if (s.key == key) return &s.block;
    }
  }
  // Inserts (key, block) unless the key is there; returns the entry and whether it was inserted.
  std::pair<BlockId*, bool> TryEmplace(const Hash128& key, BlockId block) {
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (!s.block.valid()) {
        s = Slot{key, block};
        ++size_;
        return {&s.block, true};
      }
      if (s.key == key) return {&s.block, false};
    }
  }
  // Removes `key` if present. Later entries of the probe run shift back over the gap so every
  // lookup still reaches its entry without passing an empty slot.
  void Erase(const Hash128& key) {
    size_t i = Home(key);
    for (;; i = (i + 1) & mask_) {
      if (!slots_[i].block.valid()) return;
      if (slots_[i].key == key) break;
    }
    --size_;
    for (size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      if (!slots_[j].block.valid()) break;
      // Entry j may fill the gap at i when its home is not cyclically in (i, j].
      const size_t home = Home(slots_[j].key);
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
  }
  size_t size() const { return size_; }
  size_t slot_count() const { return slots_.size(); }

 private:
  struct Slot {
    Hash128 key;
    BlockId block;  // invalid: empty
  };
  size_t Home(const Hash128& key) const { return static_cast<size_t>(key.lo) & mask_; }

  std::vector<Slot> slots_;
  size_t mask_;
  size_t size_ = 0;
};

}  // namespace tessera

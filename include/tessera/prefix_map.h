// PrefixMap: prefix key -> block, the prefix index's table.
//
// Open addressing with linear probing in one array sized once for the pool (at most one entry
// per block; load factor at most 1/2), and backward-shift deletion, so there are no tombstones
// and no rebuilds: an insert or an erase never allocates and never rehashes, and a scheduler step
// that seals or evicts a thousand blocks costs a thousand probes, not a thousand mallocs and, now
// and then, a rehash of the whole index.
//
// A slot is 8 bytes: a 32-bit fingerprint of the key (its low bits are also the home slot; keys
// are keyed hashes, uniform) and the block. The full key is the block's own (the caller's
// `key_of(block)`), compared only when fingerprints match, so the table stays small enough for a
// core's cache — a seal step's probes are its main cost.
//
// Thread-safety: none; the index's owner's.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "tessera/block_pool.h"
#include "tessera/hash128.h"

namespace tessera {

class PrefixMap {
 public:
  // Room for `max_entries` entries (REQUIRES: never more are inserted).
  explicit PrefixMap(size_t max_entries)
      : slots_(std::bit_ceil(std::max<size_t>(2 * max_entries, 16))), mask_(slots_.size() - 1) {}

  // The block under `key`, or nullptr. `key_of(block)` is the full key a mapped block carries.
  template <typename KeyOf>
  BlockId* Find(const Hash128& key, const KeyOf& key_of) {
    const uint32_t fp = Fingerprint(key);
    for (size_t i = fp & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (!s.block.valid()) return nullptr;
      if (s.fingerprint == fp && key_of(s.block) == key) return &s.block;
    }
  }
  // Inserts (key, block) unless the key is there; returns the entry and whether it was inserted.
  // REQUIRES: key_of(block) == key.
  template <typename KeyOf>
  std::pair<BlockId*, bool> TryEmplace(const Hash128& key, BlockId block, const KeyOf& key_of) {
    const uint32_t fp = Fingerprint(key);
    for (size_t i = fp & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (!s.block.valid()) {
        s = Slot{fp, block};
        ++size_;
        return {&s.block, true};
      }
      if (s.fingerprint == fp && key_of(s.block) == key) return {&s.block, false};
    }
  }
  // Removes the entry of `block` under `key`, if there is one. Later entries of the probe run
  // shift back over the gap so every lookup still reaches its entry without passing an empty slot.
  void Erase(const Hash128& key, BlockId block) {
    const uint32_t fp = Fingerprint(key);
    size_t i = fp & mask_;
    for (;; i = (i + 1) & mask_) {
      if (!slots_[i].block.valid()) return;
      if (slots_[i].block == block) break;
    }
    --size_;
    for (size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      if (!slots_[j].block.valid()) break;
      // Entry j may fill the gap at i when its home is not cyclically in (i, j].
      const size_t home = slots_[j].fingerprint & mask_;
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
  }
  // Fetches the home slot of `key` into the cache (a hint; nothing changes).
  void Prefetch(const Hash128& key) const { __builtin_prefetch(&slots_[Fingerprint(key) & mask_], 1); }
  size_t size() const { return size_; }
  size_t slot_count() const { return slots_.size(); }

 private:
  struct Slot {
    uint32_t fingerprint = 0;
    BlockId block;  // invalid: empty
  };
  static_assert(sizeof(Slot) == 8);
  static uint32_t Fingerprint(const Hash128& key) { return static_cast<uint32_t>(key.lo); }

  std::vector<Slot> slots_;
  size_t mask_;
  size_t size_ = 0;
};

}  // namespace tessera

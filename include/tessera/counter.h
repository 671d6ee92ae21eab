// Counters with one writer and readers on any thread (metrics of single-owner structures).
//
// The owner bumps with a relaxed load and store — plain moves, not a locked read-modify-write,
// which a block seal or allocation would otherwise pay several times — and a reader on another
// thread sees some recent value, never a torn one. REQUIRES: one writing thread per counter.
#pragma once

#include <atomic>
#include <cstdint>

namespace tessera {

inline void Bump(std::atomic<uint64_t>& counter, uint64_t by = 1) {
  counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}
inline void Drop(std::atomic<uint64_t>& counter, uint64_t by = 1) {
  counter.store(counter.load(std::memory_order_relaxed) - by, std::memory_order_relaxed);
}

}  // namespace tessera

// Index reuse for tables of records addressed by position (requests, window chunks).
#pragma once

#include <cstdint>
#include <vector>

namespace tessera::detail {

// An index from `free_ids` if one is there, else a new default element at the end of `store`.
template <typename T>
uint32_t TakeSlot(std::vector<uint32_t>& free_ids, std::vector<T>& store) {
  if (!free_ids.empty()) {
    uint32_t id = free_ids.back();
    free_ids.pop_back();
    return id;
  }
  store.emplace_back();
  return static_cast<uint32_t>(store.size() - 1);
}

}  // namespace tessera::detail

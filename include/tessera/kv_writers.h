// KvWriters: how an engine (or a test, or the simulator) puts KV bytes into Tessera's caches.
//
// A request manager calls these while it appends tokens, so the bytes land where they belong
// without a copy: `page` fills a per-token record in a page (dense MLA, MLA with an indexer, MHA);
// for models with sliding windows (DeepSeek-V4) `window` fills a token's window-ring row,
// `state` a token's compressor row, and `compress` turns a completed group of compressor rows
// into a compressed entry in its page.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <type_traits>
#include <utility>

#include "tessera/format.h"

namespace tessera {

// Fills the record of token `position` (absolute) in layer `layer` of pool group `group`.
using KvWriter = std::function<void(uint32_t group, uint32_t layer, uint64_t position, const RecordView& record)>;
// Fills the window record of token `position` in model layer `layer`.
using WindowWriter = std::function<void(uint32_t layer, uint64_t position, std::span<std::byte> record)>;
// Fills the compressor row (main, or the indexer's when `indexer`) of token `position`.
using StateWriter = std::function<void(uint32_t layer, bool indexer, uint64_t position, std::span<float> row)>;
// Writes the compressed entry of group `group` from its rows (oldest first: the previous group's
// rows for an overlapping compressor, then the group's own).
using Compressor = std::function<void(uint32_t layer, bool indexer, uint64_t group, std::span<const float> rows,
                                      uint32_t row_floats, const RecordView& entry)>;

struct KvWriters {
  KvWriters() = default;
  // No writers: for a pool that holds no bytes (bookkeeping for KV kept elsewhere).
  KvWriters(std::nullptr_t) {}  // NOLINT(google-explicit-constructor)
  // A per-token page writer alone (models without windows).
  KvWriters(KvWriter page_writer) : page(std::move(page_writer)) {}  // NOLINT(google-explicit-constructor)
  template <typename F>
  requires std::is_invocable_v<F&, uint32_t, uint32_t, uint64_t, const RecordView&> KvWriters(F page_writer)
      : page(std::move(page_writer)) {}  // NOLINT(google-explicit-constructor)
  KvWriters(WindowWriter w, StateWriter s, Compressor c)
      : window(std::move(w)), state(std::move(s)), compress(std::move(c)) {}

  KvWriter page;
  WindowWriter window;
  StateWriter state;
  Compressor compress;

  bool empty() const { return !page && !window && !state && !compress; }
};

// A reference compressor for tests and simulation: the column means of the rows, as float
// bytes, repeated to fill each plane of the entry. No model math.
void ReferenceCompress(uint32_t layer, bool indexer, uint64_t group, std::span<const float> rows, uint32_t row_floats,
                       const RecordView& entry);

}  // namespace tessera

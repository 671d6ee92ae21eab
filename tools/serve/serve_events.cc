// KV events on the wire: vLLM's KVEventBatch in msgpack (the publisher: serve_publisher.h).
#include "tessera_tools/serve.h"

#include <bit>
#include <cstring>
#include <string>

#include "serve_internal.h"

namespace tessera {

namespace {

// A minimal msgpack writer for the types vLLM's events use (nil, uint, float64, str, bin,
// array), big-endian as the format requires. It writes through a raw pointer into storage the
// caller sized for the worst case (EncodeKvEventBatch bounds every item), so a token costs a
// compare and one 5-byte store rather than a push_back per byte.
class Packer {
 public:
  explicit Packer(char* p) : p_(p) {}
  char* end() const { return p_; }
  void Nil() { Byte(0xc0); }
  void Uint(uint64_t v) {  // at most 9 bytes; at most 5 when v fits in 32 bits
    if (v < 128) {
      Byte(static_cast<uint8_t>(v));
    } else if (v <= 0xff) {
      Byte(0xcc);
      Byte(static_cast<uint8_t>(v));
    } else if (v <= 0xffff) {
      Byte(0xcd);
      Be(v, 2);
    } else if (v <= 0xffffffffu) {
      Byte(0xce);
      Be(v, 4);
    } else {
      Byte(0xcf);
      Be(v, 8);
    }
  }
  void Double(double d) {  // 9 bytes
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    Byte(0xcb);
    Be(bits, 8);
  }
  void Str(std::string_view s) {  // s.size() + 1 bytes: only short strings (the tags) are sent
    Byte(static_cast<uint8_t>(0xa0 | s.size()));
    std::memcpy(p_, s.data(), s.size());
    p_ += s.size();
  }
  void Bin16(const Hash128& h) {  // 18 bytes
    Byte(0xc4);
    Byte(16);
    Be(h.hi, 8);
    Be(h.lo, 8);
  }
  void Array(size_t n) {  // at most 5 bytes
    if (n < 16) {
      Byte(static_cast<uint8_t>(0x90 | n));
    } else if (n <= 0xffff) {
      Byte(0xdc);
      Be(n, 2);
    } else {
      Byte(0xdd);
      Be(n, 4);
    }
  }

 private:
  void Byte(uint8_t b) { *p_++ = static_cast<char>(b); }
  // The low `bytes` (2, 4 or 8) bytes of v, big-endian.
  void Be(uint64_t v, int bytes) {
    switch (bytes) {
      case 2:
        Store(static_cast<uint16_t>(v));
        break;
      case 4:
        Store(static_cast<uint32_t>(v));
        break;
      default:
        Store(v);
    }
  }
  template <class U>
  void Store(U v) {
    if constexpr (std::endian::native == std::endian::little) v = Swap(v);
    std::memcpy(p_, &v, sizeof v);
    p_ += sizeof v;
  }
  static uint16_t Swap(uint16_t v) { return __builtin_bswap16(v); }
  static uint32_t Swap(uint32_t v) { return __builtin_bswap32(v); }
  static uint64_t Swap(uint64_t v) { return __builtin_bswap64(v); }
  char* p_;
};

// One event, from a KvEvent or a KvEventLog::View (the same field names).
template <class Event>
void PackEvent(Packer& p, const Event& e) {
  switch (e.kind) {
    case KvEventKind::kBlockStored: {
      const bool extra = e.domain != 0;
      p.Array(extra ? 9 : 8);
      p.Str(KvEventKindName(e.kind));
      p.Array(e.block_hashes.size());
      for (const Hash128& h : e.block_hashes) p.Bin16(h);
      if (e.parent_block_hash) {
        p.Bin16(*e.parent_block_hash);
      } else {
        p.Nil();
      }
      p.Array(e.token_ids.size());
      for (uint32_t t : e.token_ids) p.Uint(t);
      p.Uint(e.block_size);
      p.Nil();  // lora_id
      p.Str(KvMediumName(e.medium));
      p.Nil();  // lora_name
      if (extra) {
        p.Array(e.block_hashes.size());
        for (size_t i = 0; i < e.block_hashes.size(); ++i) {
          p.Array(2);
          p.Str("tenant_domain");
          p.Uint(e.domain);
        }
      }
      break;
    }
    case KvEventKind::kBlockRemoved:
      p.Array(3);
      p.Str(KvEventKindName(e.kind));
      p.Array(e.block_hashes.size());
      for (const Hash128& h : e.block_hashes) p.Bin16(h);
      p.Str(KvMediumName(e.medium));
      break;
    case KvEventKind::kAllBlocksCleared:
      p.Array(1);
      p.Str(KvEventKindName(e.kind));
      break;
  }
}

// The batch of events(i), i < n, appended to *out.
template <class Events>
void PackBatch(const Events& events, size_t n, double ts, uint32_t data_parallel_rank, std::string* out) {
  // The most bytes the batch can take: 20 for the batch's own headers (array, ts, array, rank);
  // per event 57 (BlockStored: array 1, tag 12, hash array 5, parent 18, token array 5, block
  // size 5, nil 1, medium 4, nil 1, extra-keys array 5), 38 per hash (18, and 20 for the tenant
  // domain: array 1, "tenant_domain" 14, the domain 5) and 5 per token id (a u32).
  size_t bound = 20;
  for (size_t i = 0; i < n; ++i) {
    const auto& e = events[i];
    bound += 57 + 38 * e.block_hashes.size() + 5 * e.token_ids.size();
  }
  const size_t start = out->size();
  out->resize(start + bound);
  Packer p(out->data() + start);
  p.Array(3);
  p.Double(ts);
  p.Array(n);
  for (size_t i = 0; i < n; ++i) PackEvent(p, events[i]);
  p.Uint(data_parallel_rank);
  const size_t used = static_cast<size_t>(p.end() - (out->data() + start));
  if (used > bound) std::abort();  // the bound above is wrong: memory past it was written
  out->resize(start + used);
}

}  // namespace

std::string EncodeKvEventBatch(std::span<const KvEvent> events, double ts, uint32_t data_parallel_rank) {
  std::string out;
  PackBatch(events, events.size(), ts, data_parallel_rank, &out);
  return out;
}

void EncodeKvEventBatch(const KvEventLog& events, double ts, uint32_t data_parallel_rank, std::string* out) {
  PackBatch(events, events.size(), ts, data_parallel_rank, out);
}

}  // namespace tessera

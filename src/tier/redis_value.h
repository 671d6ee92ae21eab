// The value format shared by RedisTier and RedisClusterTier (docs/adr/0011-redis-tier.md):
// a 48-byte header (magic, version, record-format id, the key, payload length, xxh3-64 of the
// payload seeded with the key) followed by the payload. Internal to src/tier.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "tessera/disk_tier.h"
#include "tessera/hash.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

namespace tessera::redis_value {

constexpr uint32_t kMagic = 0x44525354;  // "TSRD"
constexpr uint16_t kVersion = 1;

struct Header {
  uint32_t magic;
  uint16_t version;
  uint16_t format_id;
  uint64_t key_lo;
  uint64_t key_hi;
  uint64_t payload_len;
  uint64_t checksum;
  uint64_t reserved;
};
static_assert(sizeof(Header) == 48);

inline uint64_t Checksum(const Hash128& key, const std::byte* data, size_t len) {
  return XXH3_64bits_withSeed(data, len, key.lo ^ key.hi);
}

// The stored value of `r`: header then payload.
inline std::string Encode(const DiskRecord& r) {
  Header h{kMagic, kVersion, r.format_id, r.key.lo, r.key.hi, r.payload.size(),
           Checksum(r.key, r.payload.data(), r.payload.size()), 0};
  std::string v(sizeof h + r.payload.size(), '\0');
  std::memcpy(v.data(), &h, sizeof h);
  if (!r.payload.empty()) std::memcpy(v.data() + sizeof h, r.payload.data(), r.payload.size());
  return v;
}

// The record stored under `key` if `data[0, len)` verifies (magic, version, key, length and
// checksum); nullopt otherwise. Never returns bytes that did not verify.
inline std::optional<DiskRecord> Decode(const Hash128& key, const char* data, size_t len) {
  if (data == nullptr || len < sizeof(Header)) return std::nullopt;
  Header h;
  std::memcpy(&h, data, sizeof h);
  const std::byte* payload = reinterpret_cast<const std::byte*>(data) + sizeof h;
  size_t payload_len = len - sizeof h;
  bool ok = h.magic == kMagic && h.version == kVersion && h.key_lo == key.lo && h.key_hi == key.hi &&
            h.payload_len == payload_len && h.checksum == Checksum(key, payload, payload_len);
  if (!ok) return std::nullopt;
  return DiskRecord{key, h.format_id, std::vector<std::byte>(payload, payload + payload_len)};
}


// Blocks SIGPIPE in this thread while it talks to Redis and swallows one raised meanwhile:
// hiredis writes with write(2), and a second write to a server that died mid-batch would raise
// SIGPIPE, whose default action ends the process. The process-wide disposition is not touched.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    already_pending_ = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
    blocked_ = pthread_sigmask(SIG_BLOCK, &pipe, &old_) == 0;
  }
  ~SigpipeGuard() {
    if (!blocked_) return;
    sigset_t pending;
    sigemptyset(&pending);
    if (!already_pending_ && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      timespec zero{0, 0};
      while (sigtimedwait(&pipe, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t old_{};
  bool blocked_ = false;
  bool already_pending_ = false;
};

}  // namespace tessera::redis_value

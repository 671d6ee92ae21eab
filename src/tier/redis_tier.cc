#include "tessera/redis_tier.h"

#include <hiredis/hiredis.h>

#include <cstring>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

namespace tessera {

namespace {

constexpr uint32_t kValueMagic = 0x44525354;  // "TSRD"
constexpr uint16_t kValueVersion = 1;

struct ValueHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t format_id;
  uint64_t key_lo;
  uint64_t key_hi;
  uint64_t payload_len;
  uint64_t checksum;
  uint64_t reserved;
};
static_assert(sizeof(ValueHeader) == 48);

uint64_t Checksum(const Hash128& key, const std::byte* data, size_t len) {
  return XXH3_64bits_withSeed(data, len, key.lo ^ key.hi);
}

}  // namespace

std::string RedisNamespace(std::string_view model, std::string_view format, uint32_t tenant_domain) {
  return "tessera:" + std::string(model) + ":" + std::string(format) + ":" + std::to_string(tenant_domain);
}

RedisTier::RedisTier(RedisTierOptions options) : options_(std::move(options)) {}

RedisTier::~RedisTier() { Drop(); }

void RedisTier::Drop() {
  if (ctx_ != nullptr) redisFree(ctx_);
  ctx_ = nullptr;
  stats_.connected = false;
}

bool RedisTier::EnsureConnected() {
  if (ctx_ != nullptr) return true;
  auto now = std::chrono::steady_clock::now();
  if (ever_connected_ || last_attempt_.time_since_epoch().count() != 0) {
    if (now - last_attempt_ < std::chrono::milliseconds(options_.reconnect_interval_ms)) return false;
  }
  last_attempt_ = now;
  timeval tv{static_cast<time_t>(options_.timeout_ms / 1000),
             static_cast<suseconds_t>((options_.timeout_ms % 1000) * 1000)};
  redisContext* c = redisConnectWithTimeout(options_.host.c_str(), options_.port, tv);
  if (c == nullptr || c->err != 0) {
    if (c != nullptr) redisFree(c);
    ++stats_.errors;
    return false;
  }
  redisSetTimeout(c, tv);
  ctx_ = c;
  if (ever_connected_) ++stats_.recoveries;
  ever_connected_ = true;
  stats_.connected = true;
  return true;
}

std::string RedisTier::KeyOf(const Hash128& key) const { return options_.key_namespace + ":" + key.Hex(); }

Status RedisTier::PutBatch(std::span<const DiskRecord> records) {
  if (!EnsureConnected())
    return IoError("redis", "server " + options_.host + ":" + std::to_string(options_.port) + " unreachable");
  std::vector<std::string> keys;
  std::vector<std::string> values;
  for (const DiskRecord& r : records) {
    ValueHeader h{kValueMagic,
                  kValueVersion,
                  r.format_id,
                  r.key.lo,
                  r.key.hi,
                  r.payload.size(),
                  Checksum(r.key, r.payload.data(), r.payload.size()),
                  0};
    std::string v(sizeof h + r.payload.size(), '\0');
    std::memcpy(v.data(), &h, sizeof h);
    if (!r.payload.empty()) std::memcpy(v.data() + sizeof h, r.payload.data(), r.payload.size());
    keys.push_back(KeyOf(r.key));
    values.push_back(std::move(v));
  }
  for (size_t i = 0; i < records.size(); ++i) {
    redisAppendCommand(ctx_, "SET %b %b", keys[i].data(), keys[i].size(), values[i].data(), values[i].size());
  }
  for (size_t i = 0; i < records.size(); ++i) {
    void* reply = nullptr;
    if (redisGetReply(ctx_, &reply) != REDIS_OK || reply == nullptr) {
      ++stats_.errors;
      Drop();
      return IoError("redis", "the server went away during a batch");
    }
    bool ok = static_cast<redisReply*>(reply)->type == REDIS_REPLY_STATUS;
    freeReplyObject(reply);
    if (!ok) ++stats_.errors;
  }
  stats_.puts += records.size();
  return Status::Ok();
}

std::vector<std::optional<DiskRecord>> RedisTier::GetBatch(std::span<const Hash128> keys) {
  std::vector<std::optional<DiskRecord>> out(keys.size());
  stats_.gets += keys.size();
  if (!EnsureConnected()) {
    stats_.misses += keys.size();
    return out;
  }
  std::vector<std::string> names;
  for (const Hash128& k : keys) names.push_back(KeyOf(k));
  for (const std::string& n : names) redisAppendCommand(ctx_, "GET %b", n.data(), n.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
      ++stats_.errors;
      Drop();
      for (size_t j = i; j < keys.size(); ++j) out[j].reset();
      stats_.misses += keys.size() - i;
      return out;
    }
    redisReply* reply = static_cast<redisReply*>(raw);
    if (reply->type == REDIS_REPLY_STRING && reply->len >= static_cast<long long>(sizeof(ValueHeader))) {
      ValueHeader h;
      std::memcpy(&h, reply->str, sizeof h);
      const std::byte* payload = reinterpret_cast<const std::byte*>(reply->str) + sizeof h;
      size_t len = static_cast<size_t>(reply->len) - sizeof h;
      bool ok = h.magic == kValueMagic && h.version == kValueVersion && h.key_lo == keys[i].lo &&
                h.key_hi == keys[i].hi && h.payload_len == len && h.checksum == Checksum(keys[i], payload, len);
      if (ok) {
        out[i] = DiskRecord{keys[i], h.format_id, std::vector<std::byte>(payload, payload + len)};
        ++stats_.hits;
      } else {
        ++stats_.verify_failures;
        ++stats_.misses;
      }
    } else if (reply->type == REDIS_REPLY_STRING) {
      ++stats_.verify_failures;
      ++stats_.misses;
    } else {
      ++stats_.misses;
    }
    freeReplyObject(reply);
  }
  return out;
}

RedisTierStats RedisTier::stats() const { return stats_; }

}  // namespace tessera

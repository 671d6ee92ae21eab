#include "tessera/redis_tier.h"

#include <hiredis/hiredis.h>

#include "tier/redis_value.h"

namespace tessera {

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
  redis_value::SigpipeGuard sigpipe;  // a server gone mid-batch must not end the process
  if (!EnsureConnected())
    return IoError("redis", "server " + options_.host + ":" + std::to_string(options_.port) + " unreachable");
  std::vector<std::string> keys;
  std::vector<std::string> values;
  for (const DiskRecord& r : records) {
    keys.push_back(KeyOf(r.key));
    values.push_back(redis_value::Encode(r));
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
  redis_value::SigpipeGuard sigpipe;  // a server gone mid-batch must not end the process
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
    if (reply->type == REDIS_REPLY_STRING) {
      std::optional<DiskRecord> r = redis_value::Decode(keys[i], reply->str, reply->len);
      if (r.has_value()) {
        out[i] = std::move(r);
        ++stats_.hits;
      } else {
        ++stats_.verify_failures;
        ++stats_.misses;
      }
    } else {
      ++stats_.misses;
    }
    freeReplyObject(reply);
  }
  return out;
}

Status RedisTier::EraseBatch(std::span<const Hash128> keys) {
  redis_value::SigpipeGuard sigpipe;  // a server gone mid-batch must not end the process
  if (keys.empty()) return Status::Ok();
  if (!EnsureConnected()) {
    ++stats_.errors;
    return IoError("redis", "not connected to " + options_.host + ":" + std::to_string(options_.port));
  }
  for (const Hash128& k : keys) {
    std::string n = KeyOf(k);
    redisAppendCommand(ctx_, "DEL %b", n.data(), n.size());
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
      ++stats_.errors;
      Drop();
      return IoError("redis", "DEL failed: connection lost");
    }
    freeReplyObject(raw);
  }
  return Status::Ok();
}

RedisTierStats RedisTier::stats() const { return stats_; }

}  // namespace tessera

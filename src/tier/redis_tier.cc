#include "tessera/redis_tier.h"

#include <algorithm>

#include "redis_io.h"
#include "redis_value.h"

namespace tessera {

using redis_io::Clock;
using redis_io::Reply;

namespace {

// Percent-encodes every byte outside [A-Za-z0-9._-]: the result never holds ':', so the parts of
// a namespace can be told apart, and '%' itself is encoded, so decoding is unique.
std::string EscapePart(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    bool plain =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (plain) {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  return out;
}

}  // namespace

std::string RedisNamespace(std::string_view model, std::string_view format, uint32_t tenant_domain) {
  return "tessera:" + EscapePart(model) + ":" + EscapePart(format) + ":" + std::to_string(tenant_domain);
}

Result<std::unique_ptr<RedisTier>> RedisTier::Open(RedisTierOptions options) {
  if (options.host.empty()) return InvalidArgument("host", "must not be empty");
  if (options.port < 1 || options.port > 65535) {
    return InvalidArgument("port", "must be in [1, 65535], got " + std::to_string(options.port));
  }
  if (options.timeout_ms == 0) return InvalidArgument("timeout_ms", "must be positive");
  TESSERA_ASSIGN_OR_RETURN(redis_value::Codec codec,
                           redis_value::Codec::Create(options.secret, options.key_namespace, options.max_value_bytes));
  auto owned = std::make_unique<const redis_value::Codec>(std::move(codec));
  return std::unique_ptr<RedisTier>(new RedisTier(std::move(options), std::move(owned)));
}

RedisTier::RedisTier(RedisTierOptions options, std::unique_ptr<const redis_value::Codec> codec)
    : options_(std::move(options)), codec_(std::move(codec)), conn_(std::make_unique<redis_io::Connection>()) {
  // The codec holds what it needs of the secret; do not keep a second copy around.
  std::fill(options_.secret.begin(), options_.secret.end(), std::byte{0});
  options_.secret.clear();
}

RedisTier::~RedisTier() { Drop(); }

void RedisTier::Drop() {
  conn_->Close();
  stats_.connected = false;
}

std::string RedisTier::Address() const { return options_.host + ":" + std::to_string(options_.port); }

bool RedisTier::EnsureConnected(Clock::time_point deadline) {
  if (conn_->is_open()) {
    switch (conn_->Check()) {
      case redis_io::Connection::Idle::kReady:
        return true;
      case redis_io::Connection::Idle::kUnsolicited:  // out of step: what follows cannot be trusted
        ++stats_.bad_replies;
        ++stats_.errors;
        break;
      case redis_io::Connection::Idle::kClosed:  // e.g. the server's idle timeout: reconnect now
        break;
    }
    Drop();
  } else {
    auto now = BackoffNow();
    if (ever_connected_ || last_attempt_.time_since_epoch().count() != 0) {
      if (now - last_attempt_ < std::chrono::milliseconds(options_.reconnect_interval_ms)) return false;
    }
  }
  last_attempt_ = BackoffNow();
  std::chrono::milliseconds left = redis_io::Remaining(deadline);
  std::string why;
  if (left.count() <= 0 || !conn_->Open(options_.host, options_.port, left, &why)) {
    ++stats_.errors;
    return false;
  }
  if (ever_connected_) ++stats_.recoveries;
  ever_connected_ = true;
  stats_.connected = true;
  return true;
}

std::string RedisTier::KeyOf(const Hash128& key) const { return options_.key_namespace + ":" + key.Hex(); }

bool RedisTier::Run(std::string request, size_t expected, Clock::time_point deadline, std::vector<Reply>* replies,
                    std::string* why) {
  redis_io::Conversation c;
  c.fd = conn_->fd();
  c.request = std::move(request);
  c.expected = expected;
  c.limits = redis_io::DataLimits(codec_->max_value_bytes());
  redis_io::Exchange(c, deadline);
  *replies = std::move(c.replies);
  if (c.ok()) return true;
  ++stats_.errors;
  if (c.failure == redis_io::Conversation::Failure::kTimeout) ++stats_.timeouts;
  if (c.failure == redis_io::Conversation::Failure::kBadReply) ++stats_.bad_replies;
  Drop();
  *why = Address() + ": " + c.error;
  return false;
}

Status RedisTier::PutBatch(std::span<const TierRecord> records) {
  if (records.empty()) return Status::Ok();
  std::string request;
  size_t sent = 0, too_large = 0;
  for (const TierRecord& r : records) {
    std::optional<std::string> value = codec_->Encode(r);
    if (!value) {
      ++too_large;
      continue;
    }
    redis_io::AppendCommand(&request, {"SET", KeyOf(r.key), *value});
    ++sent;
  }
  // The deadline covers the network (connecting, the pipeline, the replies), not the encoding.
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  if (!EnsureConnected(deadline)) return IoError("redis", "server " + Address() + " unreachable");
  std::vector<Reply> replies;
  std::string why;
  bool delivered = Run(std::move(request), sent, deadline, &replies, &why);
  size_t stored = 0, refused = 0;
  std::string first_refusal;
  for (const Reply& reply : replies) {
    if (reply.IsStatus("OK")) {
      ++stored;
      continue;
    }
    ++refused;
    if (reply.type != Reply::Type::kError) ++stats_.bad_replies;
    if (first_refusal.empty()) first_refusal = redis_io::Describe(reply);
  }
  stats_.puts += stored;
  stats_.errors += refused + too_large;
  if (!delivered) {
    return IoError("redis", std::to_string(records.size() - stored) + " of " + std::to_string(records.size()) +
                                " records not stored (" + why + ")");
  }
  if (refused > 0) {
    return IoError("redis", std::to_string(refused) + " of " + std::to_string(records.size()) + " SETs refused by " +
                                Address() + ": " + first_refusal);
  }
  if (too_large > 0) {
    return IoError("redis", std::to_string(too_large) + " of " + std::to_string(records.size()) +
                                " records not stored: payload over max_value_bytes (" +
                                std::to_string(codec_->max_payload_bytes()) + ")");
  }
  return Status::Ok();
}

std::vector<std::optional<TierRecord>> RedisTier::GetBatch(std::span<const Hash128> keys) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  std::vector<std::optional<TierRecord>> out(keys.size());
  stats_.gets += keys.size();
  if (keys.empty()) return out;
  if (!EnsureConnected(deadline)) {
    stats_.misses += keys.size();
    return out;
  }
  std::string request;
  for (const Hash128& k : keys) redis_io::AppendCommand(&request, {"GET", KeyOf(k)});
  std::vector<Reply> replies;
  std::string why;
  // On failure the replies that did arrive are still used: each is verified on its own.
  (void)Run(std::move(request), keys.size(), deadline, &replies, &why);
  for (size_t i = 0; i < replies.size(); ++i) {
    const Reply& reply = replies[i];
    if (reply.type == Reply::Type::kString) {
      out[i] = codec_->Decode(keys[i], reply.str);
      if (!out[i].has_value()) ++stats_.verify_failures;
    } else if (reply.type != Reply::Type::kNil) {
      // An error (-LOADING, -WRONGTYPE...) or a reply GET never gives: a miss, counted.
      ++stats_.errors;
      if (reply.type != Reply::Type::kError) ++stats_.bad_replies;
    }
  }
  for (const auto& r : out) {
    if (r.has_value()) {
      ++stats_.hits;
    } else {
      ++stats_.misses;
    }
  }
  return out;
}

Status RedisTier::EraseBatch(std::span<const Hash128> keys) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  if (keys.empty()) return Status::Ok();
  if (!EnsureConnected(deadline)) return IoError("redis", "not connected to " + Address());
  std::string request;
  for (const Hash128& k : keys) redis_io::AppendCommand(&request, {"DEL", KeyOf(k)});
  std::vector<Reply> replies;
  std::string why;
  if (!Run(std::move(request), keys.size(), deadline, &replies, &why)) return IoError("redis", "DEL failed: " + why);
  size_t refused = 0;
  std::string first_refusal;
  for (const Reply& reply : replies) {
    if (reply.type == Reply::Type::kInteger) continue;
    ++refused;
    if (reply.type != Reply::Type::kError) ++stats_.bad_replies;
    if (first_refusal.empty()) first_refusal = redis_io::Describe(reply);
  }
  if (refused == 0) return Status::Ok();
  stats_.errors += refused;
  return IoError("redis", std::to_string(refused) + " of " + std::to_string(keys.size()) + " DELs refused by " +
                              Address() + ": " + first_refusal);
}

RedisTierStats RedisTier::stats() const { return stats_; }

}  // namespace tessera

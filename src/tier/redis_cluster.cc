#include "tessera/redis_cluster.h"

#include <hiredis/hiredis.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <ctime>

#include "tier/redis_value.h"

namespace tessera {

uint16_t RedisClusterCrc16(std::string_view data) {
  // Bitwise CRC16-CCITT (XModem): polynomial 0x1021, initial value 0, MSB first, no final xor.
  uint16_t crc = 0;
  for (char ch : data) {
    crc = static_cast<uint16_t>(crc ^ (static_cast<uint16_t>(static_cast<unsigned char>(ch)) << 8));
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) != 0 ? static_cast<uint16_t>((crc << 1) ^ 0x1021) : static_cast<uint16_t>(crc << 1);
    }
  }
  return crc;
}

uint16_t RedisClusterKeySlot(std::string_view key) {
  size_t open = key.find('{');
  if (open != std::string_view::npos) {
    size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return static_cast<uint16_t>(RedisClusterCrc16(key) % kRedisClusterSlots);
}

namespace {

struct HostPort {
  std::string host;
  int port = 0;
};

// "host:port", "[v6]:port". nullopt when malformed.
std::optional<HostPort> ParseHostPort(std::string_view s) {
  size_t colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == s.size()) return std::nullopt;
  std::string_view host = s.substr(0, colon), port = s.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) return std::nullopt;
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc() || end != port.data() + port.size() || p < 1 || p > 65535) return std::nullopt;
  return HostPort{std::string(host), p};
}

timeval Timeval(uint32_t ms) {
  return timeval{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
}

bool StartsWith(const redisReply* r, std::string_view prefix) {
  return r->type == REDIS_REPLY_ERROR && r->str != nullptr && std::string_view(r->str, r->len).starts_with(prefix);
}

// "MOVED <slot> <host:port>" / "ASK <slot> <host:port>": the target.
std::optional<HostPort> RedirectTarget(const redisReply* r) {
  std::string_view text(r->str, r->len);
  size_t last = text.rfind(' ');
  if (last == std::string_view::npos) return std::nullopt;
  return ParseHostPort(text.substr(last + 1));
}

using redis_value::SigpipeGuard;

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r != nullptr) freeReplyObject(r);
  }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

}  // namespace

struct RedisClusterTier::Node {
  std::string host;
  int port = 0;
  redisContext* ctx = nullptr;
  bool ever_connected = false;
  std::chrono::steady_clock::time_point last_attempt{};
  uint64_t errors = 0;
  uint64_t recoveries = 0;
  std::string Address() const { return host + ":" + std::to_string(port); }
};

enum class OpKind { kGet, kSet, kDel };

struct RedisClusterTier::Op {
  OpKind kind = OpKind::kGet;
  std::string key;
  std::string value;  // kSet only
  uint16_t slot = 0;
  int32_t target = -1;
  bool asking = false;
  bool retry = false;  // redirected in the first round
  bool done = false;   // a reply that is not an error; `reply` holds it
  ReplyPtr reply;
  std::string failure;  // why not done
};

Result<std::unique_ptr<RedisClusterTier>> RedisClusterTier::Open(RedisClusterOptions options) {
  if (options.seeds.empty()) return InvalidArgument("seeds", "at least one host:port is needed");
  for (const std::string& s : options.seeds) {
    if (!ParseHostPort(s)) return InvalidArgument("seeds", "'" + s + "' is not host:port");
  }
  if (options.key_namespace.find_first_of("{}") != std::string::npos)
    return InvalidArgument("key_namespace", "must not contain '{' or '}' (the key hex is the hash tag)");
  if (options.timeout_ms == 0) return InvalidArgument("timeout_ms", "must be positive");
  if (options.connect_timeout_ms == 0) return InvalidArgument("connect_timeout_ms", "must be positive");
  std::unique_ptr<RedisClusterTier> tier(new RedisClusterTier(std::move(options)));
  for (const std::string& s : tier->options_.seeds) {
    std::optional<HostPort> hp = ParseHostPort(s);
    tier->NodeFor(hp->host, hp->port);
  }
  tier->RefreshSlotMap(false);  // an unreachable cluster leaves the tier miss-only, not an error
  return tier;
}

RedisClusterTier::RedisClusterTier(RedisClusterOptions options) : options_(std::move(options)) { slots_.fill(-1); }

RedisClusterTier::~RedisClusterTier() {
  for (auto& n : nodes_) DropNode(*n);
}

std::string RedisClusterTier::KeyOf(const Hash128& key) const { return options_.key_namespace + ":{" + key.Hex() + "}"; }

size_t RedisClusterTier::NodeFor(const std::string& host, int port) {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i]->host == host && nodes_[i]->port == port) return i;
  }
  auto n = std::make_unique<Node>();
  n->host = host;
  n->port = port;
  nodes_.push_back(std::move(n));
  return nodes_.size() - 1;
}

void RedisClusterTier::DropNode(Node& node) {
  if (node.ctx != nullptr) redisFree(node.ctx);
  node.ctx = nullptr;
}

void RedisClusterTier::NodeError(Node& node) {
  ++node.errors;
  ++stats_.errors;
}

bool RedisClusterTier::EnsureConnected(Node& node) {
  if (node.ctx != nullptr) return true;
  auto now = std::chrono::steady_clock::now();
  if (node.last_attempt.time_since_epoch().count() != 0 &&
      now - node.last_attempt < std::chrono::milliseconds(options_.reconnect_interval_ms)) {
    return false;
  }
  node.last_attempt = now;
  redisContext* c = redisConnectWithTimeout(node.host.c_str(), node.port, Timeval(options_.connect_timeout_ms));
  if (c == nullptr || c->err != 0) {
    if (c != nullptr) redisFree(c);
    NodeError(node);
    return false;
  }
  if (redisSetTimeout(c, Timeval(options_.timeout_ms)) != REDIS_OK) {
    redisFree(c);
    NodeError(node);
    return false;
  }
  node.ctx = c;
  if (node.ever_connected) {
    ++node.recoveries;
    ++stats_.recoveries;
  }
  node.ever_connected = true;
  return true;
}

bool RedisClusterTier::RefreshSlotMap(bool rate_limited) {
  auto now = std::chrono::steady_clock::now();
  if (rate_limited && last_refresh_attempt_.time_since_epoch().count() != 0 &&
      now - last_refresh_attempt_ < std::chrono::milliseconds(options_.reconnect_interval_ms)) {
    return false;
  }
  last_refresh_attempt_ = now;
  SigpipeGuard sigpipe;
  // Ask nodes with a live connection first, then the others (seeds first: they were added first).
  std::vector<size_t> order(nodes_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_partition(order.begin(), order.end(), [&](size_t i) { return nodes_[i]->ctx != nullptr; });
  for (size_t i : order) {
    Node& node = *nodes_[i];
    if (!EnsureConnected(node)) continue;
    ReplyPtr reply(static_cast<redisReply*>(redisCommand(node.ctx, "CLUSTER SLOTS")));
    if (reply == nullptr) {
      NodeError(node);
      DropNode(node);
      continue;
    }
    if (reply->type != REDIS_REPLY_ARRAY) {
      NodeError(node);
      continue;
    }
    // [[start, end, [ip, port, id, ...], replicas...], ...]
    struct Range {
      uint32_t start, end;
      HostPort owner;
    };
    std::vector<Range> ranges;
    bool valid = true;
    for (size_t e = 0; e < reply->elements && valid; ++e) {
      const redisReply* entry = reply->element[e];
      if (entry->type != REDIS_REPLY_ARRAY || entry->elements < 3 || entry->element[0]->type != REDIS_REPLY_INTEGER ||
          entry->element[1]->type != REDIS_REPLY_INTEGER || entry->element[2]->type != REDIS_REPLY_ARRAY ||
          entry->element[2]->elements < 2) {
        valid = false;
        break;
      }
      long long start = entry->element[0]->integer, end = entry->element[1]->integer;
      const redisReply* master = entry->element[2];
      if (start < 0 || end < start || end >= kRedisClusterSlots || master->element[0]->type != REDIS_REPLY_STRING ||
          master->element[1]->type != REDIS_REPLY_INTEGER || master->element[1]->integer < 1 ||
          master->element[1]->integer > 65535) {
        valid = false;
        break;
      }
      std::string host(master->element[0]->str, master->element[0]->len);
      if (host == "?") continue;        // the owner's endpoint is unknown: leave the range unowned
      if (host.empty()) host = node.host;  // "the node that answered"
      ranges.push_back(Range{static_cast<uint32_t>(start), static_cast<uint32_t>(end),
                             HostPort{std::move(host), static_cast<int>(master->element[1]->integer)}});
    }
    if (!valid) {
      NodeError(node);
      continue;
    }
    slots_.fill(-1);
    uint32_t covered = 0;
    for (const Range& r : ranges) {
      auto owner = static_cast<int32_t>(NodeFor(r.owner.host, r.owner.port));
      for (uint32_t s = r.start; s <= r.end; ++s) {
        if (slots_[s] < 0) ++covered;
        slots_[s] = owner;
      }
    }
    stats_.slots_covered = covered;
    ++stats_.slot_map_refreshes;
    return true;
  }
  ++stats_.slot_map_failures;
  ++stats_.errors;
  return false;
}

void RedisClusterTier::Execute(std::vector<Op>& ops) {
  SigpipeGuard sigpipe;
  bool unowned = std::any_of(ops.begin(), ops.end(), [&](const Op& op) { return slots_[op.slot] < 0; });
  if (unowned) RefreshSlotMap(true);
  for (Op& op : ops) {
    op.target = slots_[op.slot];
    if (op.target < 0) op.failure = "slot " + std::to_string(op.slot) + " has no known owner";
  }
  bool connection_lost = false;
  bool moved_seen = false;
  for (int round = 0; round < 2; ++round) {
    // Group this round's ops by node.
    std::vector<std::vector<size_t>> groups(nodes_.size());
    bool any = false;
    for (size_t i = 0; i < ops.size(); ++i) {
      Op& op = ops[i];
      bool pending = round == 0 ? op.target >= 0 : op.retry;
      if (!pending) continue;
      groups[static_cast<size_t>(op.target)].push_back(i);
      any = true;
    }
    if (!any) break;
    auto fail_group = [&](const std::vector<size_t>& group, size_t from, const std::string& why) {
      for (size_t k = from; k < group.size(); ++k) {
        Op& op = ops[group[k]];
        op.retry = false;
        op.failure = why;
      }
    };
    // Append every group's commands, then write them all, then read the replies: the nodes work
    // on their pipelines at the same time.
    std::vector<bool> active(groups.size(), false);
    for (size_t n = 0; n < groups.size(); ++n) {
      if (groups[n].empty()) continue;
      Node& node = *nodes_[n];
      if (!EnsureConnected(node)) {
        fail_group(groups[n], 0, node.Address() + " unreachable");
        connection_lost = true;
        continue;
      }
      bool ok = true;
      for (size_t i : groups[n]) {
        Op& op = ops[i];
        if (round == 1 && op.asking) ok = ok && redisAppendCommand(node.ctx, "ASKING") == REDIS_OK;
        switch (op.kind) {
          case OpKind::kGet:
            ok = ok && redisAppendCommand(node.ctx, "GET %b", op.key.data(), op.key.size()) == REDIS_OK;
            break;
          case OpKind::kSet:
            ok = ok && redisAppendCommand(node.ctx, "SET %b %b", op.key.data(), op.key.size(), op.value.data(),
                                          op.value.size()) == REDIS_OK;
            break;
          case OpKind::kDel:
            ok = ok && redisAppendCommand(node.ctx, "DEL %b", op.key.data(), op.key.size()) == REDIS_OK;
            break;
        }
      }
      if (!ok) {
        NodeError(node);
        DropNode(node);
        fail_group(groups[n], 0, node.Address() + ": could not queue commands");
        continue;
      }
      active[n] = true;
    }
    for (size_t n = 0; n < groups.size(); ++n) {
      if (!active[n]) continue;
      Node& node = *nodes_[n];
      int done = 0;
      while (done == 0) {
        if (redisBufferWrite(node.ctx, &done) != REDIS_OK) {
          std::string why = node.Address() + ": " + node.ctx->errstr;
          NodeError(node);
          DropNode(node);
          fail_group(groups[n], 0, why);
          connection_lost = true;
          active[n] = false;
          break;
        }
      }
    }
    for (size_t n = 0; n < groups.size(); ++n) {
      if (!active[n]) continue;
      Node& node = *nodes_[n];
      const std::vector<size_t>& group = groups[n];
      for (size_t k = 0; k < group.size(); ++k) {
        Op& op = ops[group[k]];
        op.retry = false;
        void* raw = nullptr;
        bool got = true;
        if (round == 1 && op.asking) {
          got = redisGetReply(node.ctx, &raw) == REDIS_OK && raw != nullptr;
          if (raw != nullptr) freeReplyObject(raw);  // +OK (an error here shows in the next reply)
          raw = nullptr;
        }
        got = got && redisGetReply(node.ctx, &raw) == REDIS_OK && raw != nullptr;
        if (!got) {
          if (raw != nullptr) freeReplyObject(raw);
          std::string why = node.Address() + ": " + node.ctx->errstr;
          NodeError(node);
          DropNode(node);
          fail_group(group, k, why);
          connection_lost = true;
          break;
        }
        ReplyPtr reply(static_cast<redisReply*>(raw));
        bool moved = StartsWith(reply.get(), "MOVED ");
        bool ask = StartsWith(reply.get(), "ASK ");
        if (moved || ask) {
          std::optional<HostPort> to = RedirectTarget(reply.get());
          if (!to) {
            NodeError(node);
            op.failure = node.Address() + ": malformed redirect '" + std::string(reply->str, reply->len) + "'";
          } else if (round == 1) {
            NodeError(node);
            op.failure = node.Address() + ": redirected twice in one batch ('" + std::string(reply->str, reply->len) + "')";
          } else {
            auto target = static_cast<int32_t>(NodeFor(to->host, to->port));
            ++stats_.redirections;
            if (moved) {
              ++stats_.moved;
              slots_[op.slot] = target;
              moved_seen = true;
            } else {
              ++stats_.asks;
            }
            op.target = target;
            op.asking = ask;
            op.retry = true;
          }
          continue;
        }
        if (reply->type == REDIS_REPLY_ERROR) {
          NodeError(node);
          op.failure = node.Address() + ": " + std::string(reply->str, reply->len);
          continue;
        }
        op.done = true;
        op.failure.clear();
        op.reply = std::move(reply);
      }
    }
    if (round == 0 && (moved_seen || connection_lost)) {
      // A MOVED means the map is stale: reload it now, once per batch (the retries already know
      // their node). A lost node may have failed over: reload, at most once per reconnect
      // interval.
      RefreshSlotMap(!moved_seen);
    }
  }
}

namespace {

// "n of m <what> (reason; reason)": up to three distinct reasons.
std::string Summary(size_t failed, size_t total, const char* what, const std::vector<std::string>& reasons) {
  std::vector<std::string> distinct;
  for (const std::string& r : reasons) {
    if (std::find(distinct.begin(), distinct.end(), r) == distinct.end()) distinct.push_back(r);
  }
  std::string s = std::to_string(failed) + " of " + std::to_string(total) + " " + what + " (";
  for (size_t i = 0; i < distinct.size() && i < 3; ++i) s += (i == 0 ? "" : "; ") + distinct[i];
  if (distinct.size() > 3) s += "; ...";
  return s + ")";
}

}  // namespace

Status RedisClusterTier::PutBatch(std::span<const DiskRecord> records) {
  std::vector<Op> ops(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    ops[i].kind = OpKind::kSet;
    ops[i].key = KeyOf(records[i].key);
    ops[i].slot = RedisClusterKeySlot(ops[i].key);
    ops[i].value = redis_value::Encode(records[i]);
  }
  Execute(ops);
  std::vector<std::string> reasons;
  for (const Op& op : ops) {
    bool stored = op.done && op.reply->type == REDIS_REPLY_STATUS;
    if (stored) {
      ++stats_.puts;
    } else {
      ++stats_.put_failures;
      reasons.push_back(op.done ? "unexpected reply to SET" : op.failure);
    }
  }
  if (reasons.empty()) return Status::Ok();
  return IoError("redis", Summary(reasons.size(), records.size(), "records not stored", reasons));
}

std::vector<std::optional<DiskRecord>> RedisClusterTier::GetBatch(std::span<const Hash128> keys) {
  std::vector<Op> ops(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ops[i].kind = OpKind::kGet;
    ops[i].key = KeyOf(keys[i]);
    ops[i].slot = RedisClusterKeySlot(ops[i].key);
  }
  Execute(ops);
  std::vector<std::optional<DiskRecord>> out(keys.size());
  stats_.gets += keys.size();
  for (size_t i = 0; i < keys.size(); ++i) {
    const Op& op = ops[i];
    if (op.done && op.reply->type == REDIS_REPLY_STRING) {
      out[i] = redis_value::Decode(keys[i], op.reply->str, op.reply->len);
      if (!out[i].has_value()) ++stats_.verify_failures;
    }
    if (out[i].has_value()) {
      ++stats_.hits;
    } else {
      ++stats_.misses;
    }
  }
  return out;
}

Status RedisClusterTier::EraseBatch(std::span<const Hash128> keys) {
  std::vector<Op> ops(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ops[i].kind = OpKind::kDel;
    ops[i].key = KeyOf(keys[i]);
    ops[i].slot = RedisClusterKeySlot(ops[i].key);
  }
  Execute(ops);
  std::vector<std::string> reasons;
  for (const Op& op : ops) {
    if (op.done && op.reply->type == REDIS_REPLY_INTEGER) {
      ++stats_.erases;
    } else {
      ++stats_.erase_failures;
      reasons.push_back(op.done ? "unexpected reply to DEL" : op.failure);
    }
  }
  if (reasons.empty()) return Status::Ok();
  return IoError("redis", Summary(reasons.size(), keys.size(), "keys not erased", reasons));
}

RedisClusterStats RedisClusterTier::stats() const {
  RedisClusterStats s = stats_;
  s.nodes.clear();
  for (const auto& n : nodes_) {
    s.nodes.push_back(RedisClusterNodeStats{n->Address(), n->ctx != nullptr, n->errors, n->recoveries});
  }
  return s;
}

}  // namespace tessera

#include "tessera/redis_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <charconv>

#include "redis_io.h"
#include "redis_value.h"

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

using redis_io::Reply;

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

// An IPv4 or IPv6 literal: connecting to it needs no name resolution (which no deadline bounds).
bool IsIpLiteral(const std::string& host) {
  in6_addr buf{};
  return ::inet_pton(AF_INET, host.c_str(), &buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), &buf) == 1;
}

bool StartsWith(const Reply& r, std::string_view prefix) {
  return r.type == Reply::Type::kError && std::string_view(r.str).starts_with(prefix);
}

// "MOVED <slot> <host:port>" / "ASK <slot> <host:port>": the target, when it is an IP literal.
std::optional<HostPort> RedirectTarget(const Reply& r) {
  std::string_view text(r.str);
  size_t last = text.rfind(' ');
  if (last == std::string_view::npos) return std::nullopt;
  std::optional<HostPort> hp = ParseHostPort(text.substr(last + 1));
  if (!hp || !IsIpLiteral(hp->host)) return std::nullopt;
  return hp;
}

}  // namespace

struct RedisClusterTier::Node {
  std::string host;
  int port = 0;
  redis_io::Connection conn;
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
  bool done = false;   // a reply of the type the command gives; `reply` holds it
  Reply reply;
  std::string failure;  // why not done

  // Appends the command (and ASKING first, on a retry after ASK) to a pipeline; the replies to
  // expect from it.
  size_t AppendTo(std::string* request, int round) const {
    size_t replies = 1;
    if (round == 1 && asking) {
      redis_io::AppendCommand(request, {"ASKING"});
      ++replies;
    }
    switch (kind) {
      case OpKind::kGet:
        redis_io::AppendCommand(request, {"GET", key});
        break;
      case OpKind::kSet:
        redis_io::AppendCommand(request, {"SET", key, value});
        break;
      case OpKind::kDel:
        redis_io::AppendCommand(request, {"DEL", key});
        break;
    }
    return replies;
  }
  // Whether `r` is a reply of the type the command gives.
  bool Expects(const Reply& r) const {
    switch (kind) {
      case OpKind::kGet:
        return r.type == Reply::Type::kString || r.type == Reply::Type::kNil;
      case OpKind::kSet:
        return r.IsStatus("OK");
      case OpKind::kDel:
        return r.type == Reply::Type::kInteger;
    }
    return false;
  }
  // The ops of a round by node: the first round takes every op with a known owner, the second
  // the redirected ones.
  static std::vector<std::vector<size_t>> ByNode(const std::vector<Op>& ops, size_t nodes, int round) {
    std::vector<std::vector<size_t>> groups(nodes);
    for (size_t i = 0; i < ops.size(); ++i) {
      const bool pending = round == 0 ? ops[i].target >= 0 : ops[i].retry;
      if (pending) groups[static_cast<size_t>(ops[i].target)].push_back(i);
    }
    return groups;
  }
  // Fails the ops group[from..] with `why` (no retry).
  static void FailFrom(std::vector<Op>& ops, const std::vector<size_t>& group, size_t from, const std::string& why) {
    for (size_t k = from; k < group.size(); ++k) {
      Op& op = ops[group[k]];
      op.retry = false;
      op.failure = why;
    }
  }
};

Result<std::unique_ptr<RedisClusterTier>> RedisClusterTier::Open(RedisClusterOptions options) {
  if (options.seeds.empty()) return InvalidArgument("seeds", "at least one host:port is needed");
  for (const std::string& s : options.seeds) {
    if (!ParseHostPort(s)) return InvalidArgument("seeds", "'" + s + "' is not host:port");
  }
  if (options.seeds.size() > kRedisClusterMaxNodes) {
    return InvalidArgument("seeds", "at most " + std::to_string(kRedisClusterMaxNodes) + " seeds");
  }
  if (options.key_namespace.find_first_of("{}") != std::string::npos)
    return InvalidArgument("key_namespace", "must not contain '{' or '}' (the key hex is the hash tag)");
  if (options.timeout_ms == 0) return InvalidArgument("timeout_ms", "must be positive");
  if (options.connect_timeout_ms == 0) return InvalidArgument("connect_timeout_ms", "must be positive");
  TESSERA_ASSIGN_OR_RETURN(redis_value::Codec codec,
                           redis_value::Codec::Create(options.secret, options.key_namespace, options.max_value_bytes));
  auto owned = std::make_unique<const redis_value::Codec>(std::move(codec));
  std::unique_ptr<RedisClusterTier> tier(new RedisClusterTier(std::move(options), std::move(owned)));
  for (const std::string& s : tier->options_.seeds) {
    std::optional<HostPort> hp = ParseHostPort(s);
    tier->NodeFor(hp->host, hp->port);
  }
  // An unreachable or misbehaving cluster leaves the tier miss-only, not an error.
  tier->RefreshSlotMap(false, std::nullopt);
  return tier;
}

RedisClusterTier::RedisClusterTier(RedisClusterOptions options, std::unique_ptr<const redis_value::Codec> codec)
    : options_(std::move(options)), codec_(std::move(codec)) {
  // The codec holds what it needs of the secret; do not keep a second copy around.
  std::fill(options_.secret.begin(), options_.secret.end(), std::byte{0});
  options_.secret.clear();
  slots_.fill(-1);
}

RedisClusterTier::~RedisClusterTier() {
  for (auto& n : nodes_) DropNode(*n);
}

std::string RedisClusterTier::KeyOf(const Hash128& key) const {
  return options_.key_namespace + ":{" + key.Hex() + "}";
}

int32_t RedisClusterTier::NodeFor(const std::string& host, int port) {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i]->host == host && nodes_[i]->port == port) return static_cast<int32_t>(i);
  }
  if (nodes_.size() >= kRedisClusterMaxNodes) return -1;
  auto n = std::make_unique<Node>();
  n->host = host;
  n->port = port;
  nodes_.push_back(std::move(n));
  return static_cast<int32_t>(nodes_.size() - 1);
}

void RedisClusterTier::DropNode(Node& node) { node.conn.Close(); }

void RedisClusterTier::NodeError(Node& node) {
  ++node.errors;
  ++stats_.errors;
}

void RedisClusterTier::ConversationFailed(Node& node, const redis_io::Conversation& c) {
  NodeError(node);
  if (c.failure == redis_io::Conversation::Failure::kTimeout) ++stats_.timeouts;
  if (c.failure == redis_io::Conversation::Failure::kBadReply) ++stats_.bad_replies;
  DropNode(node);
}

bool RedisClusterTier::EnsureConnected(Node& node, Clock::time_point deadline) {
  if (node.conn.is_open()) {
    switch (node.conn.Check()) {
      case redis_io::Connection::Idle::kReady:
        return true;
      case redis_io::Connection::Idle::kUnsolicited:  // out of step: what follows cannot be trusted
        ++stats_.bad_replies;
        NodeError(node);
        break;
      case redis_io::Connection::Idle::kClosed:  // e.g. the node's idle timeout: reconnect now
        break;
    }
    DropNode(node);
  } else if (node.last_attempt.time_since_epoch().count() != 0 &&
             BackoffNow() - node.last_attempt < std::chrono::milliseconds(options_.reconnect_interval_ms)) {
    return false;
  }
  std::chrono::milliseconds left =
      std::min(redis_io::Remaining(deadline), std::chrono::milliseconds(options_.connect_timeout_ms));
  if (left.count() <= 0) return false;  // no time left: not an attempt
  node.last_attempt = BackoffNow();
  std::string why;
  if (!node.conn.Open(node.host, node.port, left, &why)) {
    NodeError(node);
    return false;
  }
  if (node.ever_connected) {
    ++node.recoveries;
    ++stats_.recoveries;
  }
  node.ever_connected = true;
  return true;
}

namespace {

struct Range {
  uint32_t start, end;
  HostPort owner;
};

// The ranges of a CLUSTER SLOTS reply, [[start, end, [ip, port, id, ...], replicas...], ...];
// nullopt when it is not one. `answered_by` stands in for an empty host ("the node that
// answered"). Ranges whose owner is unknown ("?") or not an IP literal are left out (unowned).
std::optional<std::vector<Range>> ParseSlotMap(const Reply& reply, const std::string& answered_by) {
  if (reply.type != Reply::Type::kArray) return std::nullopt;
  std::vector<Range> ranges;
  for (const Reply& entry : reply.elements) {
    if (entry.type != Reply::Type::kArray || entry.elements.size() < 3 ||
        entry.elements[0].type != Reply::Type::kInteger || entry.elements[1].type != Reply::Type::kInteger ||
        entry.elements[2].type != Reply::Type::kArray || entry.elements[2].elements.size() < 2) {
      return std::nullopt;
    }
    int64_t start = entry.elements[0].integer, end = entry.elements[1].integer;
    const Reply& master = entry.elements[2];
    if (start < 0 || end < start || end >= kRedisClusterSlots || master.elements[0].type != Reply::Type::kString ||
        master.elements[1].type != Reply::Type::kInteger || master.elements[1].integer < 1 ||
        master.elements[1].integer > 65535) {
      return std::nullopt;
    }
    std::string host = master.elements[0].str;
    if (host.empty()) host = answered_by;
    if (host == "?" || (host != answered_by && !IsIpLiteral(host))) continue;
    ranges.push_back(Range{static_cast<uint32_t>(start), static_cast<uint32_t>(end),
                           HostPort{std::move(host), static_cast<int>(master.elements[1].integer)}});
  }
  return ranges;
}

}  // namespace

bool RedisClusterTier::RefreshSlotMap(bool rate_limited, std::optional<Clock::time_point> batch_deadline) {
  const auto backoff_now = BackoffNow();
  if (rate_limited && last_refresh_attempt_.time_since_epoch().count() != 0 &&
      backoff_now - last_refresh_attempt_ < std::chrono::milliseconds(options_.reconnect_interval_ms)) {
    return false;
  }
  if (batch_deadline && Clock::now() >= *batch_deadline) return false;  // no time left: not an attempt
  last_refresh_attempt_ = backoff_now;
  // Ask nodes with a live connection first, then the others (seeds first: they were added first).
  std::vector<size_t> order(nodes_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_partition(order.begin(), order.end(), [&](size_t i) { return nodes_[i]->conn.is_open(); });
  for (size_t i : order) {
    if (batch_deadline && Clock::now() >= *batch_deadline) break;
    Node& node = *nodes_[i];
    if (!EnsureConnected(
            node, batch_deadline.value_or(Clock::now() + std::chrono::milliseconds(options_.connect_timeout_ms)))) {
      continue;
    }
    redis_io::Conversation c;
    c.fd = node.conn.fd();
    redis_io::AppendCommand(&c.request, {"CLUSTER", "SLOTS"});
    c.expected = 1;
    c.limits = redis_io::SlotMapLimits();
    redis_io::Exchange(c, batch_deadline.value_or(Clock::now() + std::chrono::milliseconds(options_.timeout_ms)));
    if (!c.ok()) {
      ConversationFailed(node, c);
      continue;
    }
    std::optional<std::vector<Range>> ranges = ParseSlotMap(c.replies[0], node.host);
    if (!ranges) {
      NodeError(node);
      ++stats_.bad_replies;
      continue;
    }
    // Every owner must fit in the node table before the map changes.
    size_t unknown = 0;
    std::vector<std::pair<std::string, int>> seen;
    for (const Range& r : *ranges) {
      std::pair<std::string, int> hp{r.owner.host, r.owner.port};
      if (std::find(seen.begin(), seen.end(), hp) != seen.end()) continue;
      seen.push_back(hp);
      bool known = std::any_of(nodes_.begin(), nodes_.end(),
                               [&](const auto& n) { return n->host == hp.first && n->port == hp.second; });
      if (!known) ++unknown;
      if (nodes_.size() + unknown > kRedisClusterMaxNodes) break;
    }
    if (nodes_.size() + unknown > kRedisClusterMaxNodes) {
      NodeError(node);
      ++stats_.bad_replies;
      continue;
    }
    slots_.fill(-1);
    uint32_t covered = 0;
    for (const Range& r : *ranges) {
      int32_t owner = NodeFor(r.owner.host, r.owner.port);
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

void RedisClusterTier::Execute(std::vector<Op>& ops, Clock::time_point deadline) {
  bool unowned = std::any_of(ops.begin(), ops.end(), [&](const Op& op) { return slots_[op.slot] < 0; });
  if (unowned) RefreshSlotMap(true, deadline);
  for (Op& op : ops) {
    op.target = slots_[op.slot];
    if (op.target < 0) op.failure = "slot " + std::to_string(op.slot) + " has no known owner";
  }
  bool connection_lost = false;
  bool moved_seen = false;
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<size_t>> groups = Op::ByNode(ops, nodes_.size(), round);
    if (std::all_of(groups.begin(), groups.end(), [](const std::vector<size_t>& g) { return g.empty(); })) break;
    std::vector<redis_io::Conversation> convs(groups.size());
    SendRound(ops, groups, round, deadline, convs, &connection_lost);
    for (size_t n = 0; n < groups.size(); ++n) {
      redis_io::Conversation& c = convs[n];
      if (c.fd < 0) continue;  // not asked this round
      Node& node = *nodes_[n];
      ReadReplies(ops, node, groups[n], c, round, &moved_seen);
      if (!c.ok()) {
        ConversationFailed(node, c);
        connection_lost = true;
      }
    }
    if (round == 0 && (moved_seen || connection_lost)) {
      // A MOVED means the map is stale: reload it now, once per batch (the retries already know
      // their node). A lost node may have failed over: reload, at most once per reconnect
      // interval. Either way within the batch's deadline.
      RefreshSlotMap(!moved_seen, deadline);
    }
  }
}

void RedisClusterTier::SendRound(std::vector<Op>& ops, const std::vector<std::vector<size_t>>& groups, int round,
                                 Clock::time_point deadline, std::vector<redis_io::Conversation>& convs,
                                 bool* connection_lost) {
  const redis_io::ReplyLimits limits = redis_io::DataLimits(codec_->max_value_bytes());
  // One pipeline per node; all of them are written and read at once, under the batch deadline.
  std::vector<redis_io::Conversation*> active;
  for (size_t n = 0; n < groups.size(); ++n) {
    if (groups[n].empty()) continue;
    Node& node = *nodes_[n];
    if (!EnsureConnected(node, deadline)) {
      Op::FailFrom(ops, groups[n], 0, node.Address() + " unreachable");
      *connection_lost = true;
      continue;
    }
    redis_io::Conversation& c = convs[n];
    c.fd = node.conn.fd();
    c.limits = limits;
    for (size_t i : groups[n]) c.expected += ops[i].AppendTo(&c.request, round);
    active.push_back(&c);
  }
  redis_io::Exchange(active, deadline);
}

void RedisClusterTier::ReadReplies(std::vector<Op>& ops, Node& node, const std::vector<size_t>& group,
                                   redis_io::Conversation& c, int round, bool* moved_seen) {
  const std::string lost_why = c.ok() ? std::string() : node.Address() + ": " + c.error;
  size_t next = 0;  // the next reply of this pipeline
  for (size_t k = 0; k < group.size(); ++k) {
    Op& op = ops[group[k]];
    op.retry = false;
    // ASKING's own reply is not looked at: an error there shows in the command's reply.
    const size_t at = next + (round == 1 && op.asking ? 1 : 0);
    if (at >= c.replies.size()) {
      Op::FailFrom(ops, group, k, lost_why);
      break;
    }
    next = at + 1;
    Reply& reply = c.replies[at];
    bool moved = StartsWith(reply, "MOVED ");
    if (moved || StartsWith(reply, "ASK ")) {
      FollowRedirect(op, node, reply, moved, round, moved_seen);
      continue;
    }
    if (reply.type == Reply::Type::kError) {
      NodeError(node);
      op.failure = node.Address() + ": " + redis_io::Printable(reply.str);
      continue;
    }
    if (!op.Expects(reply)) {
      NodeError(node);
      ++stats_.bad_replies;
      op.failure = node.Address() + ": unexpected reply " + redis_io::Describe(reply);
      continue;
    }
    op.done = true;
    op.failure.clear();
    op.reply = std::move(reply);
  }
}

void RedisClusterTier::FollowRedirect(Op& op, Node& node, const Reply& reply, bool moved, int round, bool* moved_seen) {
  std::optional<HostPort> to = RedirectTarget(reply);
  int32_t target = to ? NodeFor(to->host, to->port) : -1;
  if (!to || target < 0) {
    NodeError(node);
    op.failure = node.Address() + ": redirect not followed '" + redis_io::Printable(reply.str) + "'";
    return;
  }
  if (round == 1) {
    NodeError(node);
    op.failure = node.Address() + ": redirected twice in one batch ('" + redis_io::Printable(reply.str) + "')";
    return;
  }
  ++stats_.redirections;
  if (moved) {
    ++stats_.moved;
    slots_[op.slot] = target;
    *moved_seen = true;
  } else {
    ++stats_.asks;
  }
  op.target = target;
  op.asking = !moved;
  op.retry = true;
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

Status RedisClusterTier::PutBatch(std::span<const TierRecord> records) {
  std::vector<Op> ops;
  ops.reserve(records.size());
  std::vector<std::string> reasons;
  for (const TierRecord& r : records) {
    std::optional<std::string> value = codec_->Encode(r);
    if (!value) {
      ++stats_.put_failures;
      reasons.push_back("payload over max_value_bytes (" + std::to_string(codec_->max_payload_bytes()) + ")");
      continue;
    }
    Op& op = ops.emplace_back();
    op.kind = OpKind::kSet;
    op.key = KeyOf(r.key);
    op.slot = RedisClusterKeySlot(op.key);
    op.value = std::move(*value);
  }
  // The deadline covers the network, not the encoding.
  Execute(ops, Clock::now() + std::chrono::milliseconds(options_.timeout_ms));
  for (const Op& op : ops) {
    if (op.done) {
      ++stats_.puts;
    } else {
      ++stats_.put_failures;
      reasons.push_back(op.failure);
    }
  }
  if (reasons.empty()) return Status::Ok();
  return IoError("redis", Summary(reasons.size(), records.size(), "records not stored", reasons));
}

std::vector<std::optional<TierRecord>> RedisClusterTier::GetBatch(std::span<const Hash128> keys) {
  std::vector<Op> ops(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ops[i].kind = OpKind::kGet;
    ops[i].key = KeyOf(keys[i]);
    ops[i].slot = RedisClusterKeySlot(ops[i].key);
  }
  Execute(ops, Clock::now() + std::chrono::milliseconds(options_.timeout_ms));
  std::vector<std::optional<TierRecord>> out(keys.size());
  stats_.gets += keys.size();
  for (size_t i = 0; i < keys.size(); ++i) {
    const Op& op = ops[i];
    if (op.done && op.reply.type == Reply::Type::kString) {
      out[i] = codec_->Decode(keys[i], op.reply.str);
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
  Execute(ops, Clock::now() + std::chrono::milliseconds(options_.timeout_ms));
  std::vector<std::string> reasons;
  for (const Op& op : ops) {
    if (op.done) {
      ++stats_.erases;
    } else {
      ++stats_.erase_failures;
      reasons.push_back(op.failure);
    }
  }
  if (reasons.empty()) return Status::Ok();
  return IoError("redis", Summary(reasons.size(), keys.size(), "keys not erased", reasons));
}

RedisClusterStats RedisClusterTier::stats() const {
  RedisClusterStats s = stats_;
  s.nodes.clear();
  for (const auto& n : nodes_) {
    s.nodes.push_back(RedisClusterNodeStats{n->Address(), n->conn.is_open(), n->errors, n->recoveries});
  }
  return s;
}

}  // namespace tessera

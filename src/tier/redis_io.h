// Bounded, deadline-driven Redis I/O shared by RedisTier and RedisClusterTier
// (docs/adr/0014-redis-hardening.md). Internal to src/tier.
//
// A Redis server is hostile until its bytes are checked. hiredis 0.14 connects for us (name
// resolution, a non-blocking connect with a timeout, TCP_NODELAY); everything after that is
// here, because hiredis's blocking calls bound each read(2), not a command (a server that sends
// one byte per timeout keeps a pipeline going for ever), and its reader trusts the lengths a
// server announces (`*2147483647` makes it allocate 16 GiB of pointers before any element
// arrives; a bulk length near 2^63 overflows its bounds arithmetic).
//
// - Commands are encoded here (RESP arrays of bulk strings) and written with send(MSG_NOSIGNAL |
//   MSG_DONTWAIT), so a peer that went away is an error, never SIGPIPE.
// - Replies are parsed here by ReplyParser, which checks every length against ReplyLimits as soon
//   as the header line is complete and allocates only as bytes arrive.
// - Exchange runs the pipelines of several connections at once under one deadline (poll(2)):
//   writing every request and reading every reply must finish by then, however slowly a server
//   drip-feeds its bytes.
//
// Thread-safety: none of these types is shared; each belongs to one tier (one owner).
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

struct redisContext;

namespace tessera::redis_io {

using Clock = std::chrono::steady_clock;

// One RESP2 reply, owned.
struct Reply {
  enum class Type : uint8_t { kString, kStatus, kError, kInteger, kNil, kArray };
  Type type = Type::kNil;
  int64_t integer = 0;          // kInteger
  std::string str;              // kString, kStatus, kError
  std::vector<Reply> elements;  // kArray

  bool IsStatus(std::string_view s) const { return type == Type::kStatus && str == s; }
};

// What one reply may cost. A header that announces more than these is rejected when its line is
// complete, before anything is allocated for it.
struct ReplyLimits {
  uint64_t max_bulk_bytes = 0;   // the longest bulk string
  uint64_t max_elements = 0;     // array elements in one reply, every level counted
  uint32_t max_depth = 0;        // arrays open at once (0: no array may have elements)
  uint64_t max_reply_bytes = 0;  // wire bytes of one reply
};

// The longest status, error or integer line (header lines are far shorter).
inline constexpr size_t kMaxLineBytes = 4096;

// Replies to GET, SET, DEL and ASKING: one bulk string of at most `max_value_bytes`, no array
// with elements (an empty or nil array is a wrong-typed reply, not a protocol error).
ReplyLimits DataLimits(uint64_t max_value_bytes);
// Replies to CLUSTER SLOTS: 8 MiB, 2^18 array elements (16384 single-slot ranges with a master
// and a replica fit), 4 levels (map > range > node > node metadata), strings of at most 1 KiB.
// What a hostile node can make the client hold is then bounded by the elements (2^18 Replies,
// at most twice over while vectors grow) plus the strings: about 50 MiB.
ReplyLimits SlotMapLimits();

// An incremental RESP2 parser. Feed it bytes as they arrive; it emits complete replies.
class ReplyParser {
 public:
  explicit ReplyParser(const ReplyLimits& limits) : limits_(limits) {}

  // Consumes `data`, appending complete replies to *out. Returns false (and sets error()) on a
  // protocol error, a reply over the limits, or bytes past the `want`-th reply in *out (a
  // server that sends what was not asked for is out of step). After false, the parser is spent.
  bool Feed(std::string_view data, size_t want, std::vector<Reply>* out);
  const std::string& error() const { return error_; }

 private:
  struct Frame {
    Reply array;
    uint64_t left = 0;  // elements still to come
  };
  bool Fail(std::string why);
  bool Count(size_t n);  // adds wire bytes to the reply in progress; false past the limit
  bool Line(std::vector<Reply>* out);
  bool Complete(Reply r, std::vector<Reply>* out);

  ReplyLimits limits_;
  std::string line_;          // the header line being read, without its CRLF
  bool in_bulk_ = false;      // reading a bulk string's payload and CRLF
  uint64_t bulk_left_ = 0;    // payload bytes still to come
  int crlf_left_ = 0;         // 2 or 1: the CRLF after the payload
  Reply bulk_;                // the bulk string being filled
  std::vector<Frame> stack_;  // open arrays, outermost first
  uint64_t reply_bytes_ = 0;  // wire bytes of the reply in progress
  uint64_t elements_ = 0;     // array elements announced in the reply in progress
  std::string error_;
};

// Appends one command (a RESP array of bulk strings) to *out.
void AppendCommand(std::string* out, std::initializer_list<std::string_view> args);

// One pipeline on one connection: what to send, how many replies to read and their limits.
struct Conversation {
  enum class Failure : uint8_t { kNone, kTimeout, kClosed, kBadReply, kIo };
  int fd = -1;
  std::string request;
  size_t expected = 0;
  ReplyLimits limits;
  // Out: the replies read, in order (fewer than `expected` on failure, each complete and within
  // the limits), and why the conversation stopped early. A failed conversation leaves its
  // connection out of step: the owner must close it.
  std::vector<Reply> replies;
  Failure failure = Failure::kNone;
  std::string error;  // one line, when failure != kNone
  bool ok() const { return failure == Failure::kNone; }
};

// Writes every conversation's request and reads its replies, all connections at once, until each
// has its `expected` replies or `deadline` passes (then the unfinished ones fail with kTimeout).
void Exchange(std::span<Conversation* const> conversations, Clock::time_point deadline);
void Exchange(Conversation& conversation, Clock::time_point deadline);

// A hiredis connection used only for its socket.
class Connection {
 public:
  Connection() = default;
  ~Connection() { Close(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Connects within `timeout` (at least 1 ms). false and *why on failure.
  bool Open(const std::string& host, int port, std::chrono::milliseconds timeout, std::string* why);
  void Close();
  bool is_open() const { return ctx_ != nullptr; }
  int fd() const;

  enum class Idle : uint8_t { kReady, kClosed, kUnsolicited };
  // Whether an idle connection can carry the next command: the server may have closed it (its
  // `timeout` setting, a restart) or sent bytes nobody asked for, which would be read as the
  // next command's replies.
  Idle Check() const;

 private:
  redisContext* ctx_ = nullptr;
};

// What `r` is, for a one-line message about a reply that was not the expected one: an error or
// status with its (printable) text, else its type.
std::string Describe(const Reply& r);
// `s` fit for a one-line message: bytes outside printable ASCII become '?', at most `max` bytes.
std::string Printable(std::string_view s, size_t max = 160);
// The milliseconds left until `deadline` (0 when passed).
std::chrono::milliseconds Remaining(Clock::time_point deadline);

}  // namespace tessera::redis_io

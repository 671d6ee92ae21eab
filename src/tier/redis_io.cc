#include "redis_io.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace tessera::redis_io {

ReplyLimits DataLimits(uint64_t max_value_bytes) {
  ReplyLimits l;
  l.max_bulk_bytes = max_value_bytes;
  l.max_elements = 0;
  l.max_depth = 0;
  // "$<20 digits>\r\n" + payload + "\r\n"; an error line is shorter than kMaxLineBytes + 2.
  l.max_reply_bytes = std::max<uint64_t>(max_value_bytes + 32, kMaxLineBytes + 2);
  return l;
}

ReplyLimits SlotMapLimits() {
  ReplyLimits l;
  l.max_bulk_bytes = 1024;       // an IP, a node id (40 hex digits), a hostname (at most 255)
  l.max_elements = 1u << 18;     // 16384 ranges x (start, end, master, replica) x 4 fields fit
  l.max_depth = 4;               // map > range > node > node metadata
  l.max_reply_bytes = 8u << 20;  // a fully fragmented map with replicas is about 3 MiB
  return l;
}

bool ReplyParser::Fail(std::string why) {
  if (error_.empty()) error_ = std::move(why);
  return false;
}

bool ReplyParser::Count(size_t n) {
  reply_bytes_ += n;
  if (reply_bytes_ <= limits_.max_reply_bytes) return true;
  return Fail("reply longer than " + std::to_string(limits_.max_reply_bytes) + " bytes");
}

namespace {

// A RESP integer: an optional '-' and decimal digits, nothing else, within int64.
bool ParseInteger(std::string_view s, int64_t* v) {
  if (s.empty() || s.front() == '+') return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

bool ReplyParser::Feed(std::string_view data, size_t want, std::vector<Reply>* out) {
  if (!error_.empty()) return false;
  size_t i = 0;
  while (i < data.size()) {
    if (out->size() >= want) return Fail("the server sent bytes after the last reply asked for");
    if (in_bulk_) {
      if (bulk_left_ > 0) {
        size_t take = static_cast<size_t>(std::min<uint64_t>(bulk_left_, data.size() - i));
        if (!Count(take)) return false;
        bulk_.str.append(data.data() + i, take);
        bulk_left_ -= take;
        i += take;
        continue;
      }
      char want_char = crlf_left_ == 2 ? '\r' : '\n';
      if (data[i] != want_char) return Fail("bulk string not followed by CRLF");
      ++i;
      if (!Count(1)) return false;
      if (--crlf_left_ == 0) {
        in_bulk_ = false;
        if (!Complete(std::move(bulk_), out)) return false;
        bulk_ = Reply{};
      }
      continue;
    }
    const char* nl = static_cast<const char*>(std::memchr(data.data() + i, '\n', data.size() - i));
    size_t end = nl == nullptr ? data.size() : static_cast<size_t>(nl - data.data());
    if (line_.size() + (end - i) > kMaxLineBytes + 1) {
      return Fail("reply line longer than " + std::to_string(kMaxLineBytes) + " bytes");
    }
    line_.append(data.data() + i, end - i);
    if (!Count(end - i)) return false;
    i = end;
    if (nl == nullptr) break;
    ++i;
    if (!Count(1)) return false;
    if (line_.empty() || line_.back() != '\r') return Fail("reply line not terminated by CRLF");
    line_.pop_back();
    if (!Line(out)) return false;
    line_.clear();
  }
  return true;
}

bool ReplyParser::Line(std::vector<Reply>* out) {
  if (line_.empty()) return Fail("empty reply line");
  const char kind = line_[0];
  std::string_view rest = std::string_view(line_).substr(1);
  Reply r;
  int64_t n = 0;
  switch (kind) {
    case '+':
    case '-':
      r.type = kind == '+' ? Reply::Type::kStatus : Reply::Type::kError;
      r.str.assign(rest);
      return Complete(std::move(r), out);
    case ':':
      if (!ParseInteger(rest, &n)) return Fail("malformed integer reply");
      r.type = Reply::Type::kInteger;
      r.integer = n;
      return Complete(std::move(r), out);
    case '$':
      if (!ParseInteger(rest, &n) || n < -1) return Fail("malformed bulk string length");
      if (n == -1) return Complete(Reply{}, out);  // nil
      if (static_cast<uint64_t>(n) > limits_.max_bulk_bytes) {
        return Fail("bulk string of " + std::to_string(n) + " bytes exceeds the bound of " +
                    std::to_string(limits_.max_bulk_bytes));
      }
      in_bulk_ = true;
      bulk_left_ = static_cast<uint64_t>(n);
      crlf_left_ = 2;
      bulk_ = Reply{};
      bulk_.type = Reply::Type::kString;
      // Grow with the bytes that really arrive: a header alone costs at most 1 MiB.
      bulk_.str.reserve(static_cast<size_t>(std::min<uint64_t>(bulk_left_, 1u << 20)));
      return true;
    case '*':
      if (!ParseInteger(rest, &n) || n < -1) return Fail("malformed array length");
      if (n == -1) return Complete(Reply{}, out);  // nil array
      r.type = Reply::Type::kArray;
      if (n == 0) return Complete(std::move(r), out);
      if (stack_.size() >= limits_.max_depth) {
        return Fail(limits_.max_depth == 0 ? "unexpected array reply of " + std::to_string(n) + " elements"
                                           : "arrays nested deeper than " + std::to_string(limits_.max_depth));
      }
      if (static_cast<uint64_t>(n) > limits_.max_elements - elements_) {
        return Fail("array of " + std::to_string(n) + " elements exceeds the bound of " +
                    std::to_string(limits_.max_elements));
      }
      elements_ += static_cast<uint64_t>(n);
      r.elements.reserve(static_cast<size_t>(std::min<int64_t>(n, 1024)));
      stack_.push_back(Frame{std::move(r), static_cast<uint64_t>(n)});
      return true;
    default:
      return Fail("unknown reply type byte " + std::to_string(static_cast<unsigned char>(kind)));
  }
}

bool ReplyParser::Complete(Reply r, std::vector<Reply>* out) {
  while (!stack_.empty()) {
    Frame& f = stack_.back();
    f.array.elements.push_back(std::move(r));
    if (--f.left > 0) return true;
    r = std::move(f.array);
    stack_.pop_back();
  }
  out->push_back(std::move(r));
  reply_bytes_ = 0;
  elements_ = 0;
  return true;
}

void AppendCommand(std::string* out, std::initializer_list<std::string_view> args) {
  *out += '*';
  *out += std::to_string(args.size());
  *out += "\r\n";
  for (std::string_view a : args) {
    *out += '$';
    *out += std::to_string(a.size());
    *out += "\r\n";
    out->append(a.data(), a.size());
    *out += "\r\n";
  }
}

namespace {

using Failure = Conversation::Failure;

void FailConversation(Conversation& c, Failure f, std::string why) {
  if (c.failure != Failure::kNone) return;
  c.failure = f;
  c.error = std::move(why);
}

bool Finished(const Conversation& c, size_t sent) {
  return c.failure != Failure::kNone || (sent == c.request.size() && c.replies.size() >= c.expected);
}

std::string Errno(const char* what, int err) { return std::string(what) + ": " + std::strerror(err); }

// Writes what the socket takes now. false when the conversation failed.
bool SendSome(Conversation& c, size_t* sent) {
  while (*sent < c.request.size()) {
    ssize_t n = ::send(c.fd, c.request.data() + *sent, c.request.size() - *sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      *sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    FailConversation(c, Failure::kIo, Errno("write", n < 0 ? errno : EPIPE));
    return false;
  }
  return true;
}

// Reads what the socket holds now (at most 4 MiB, so that one fast server does not starve the
// others) into `buf` and parses it. false when the conversation failed. The buffer is the
// caller's heap: callers run on small stacks (civetweb's workers have 100 KiB, ADR 0027).
bool ReceiveSome(Conversation& c, ReplyParser& parser, std::vector<char>& buf) {
  size_t budget = 4u << 20;
  while (budget > 0) {
    ssize_t n = ::recv(c.fd, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n > 0) {
      budget -= std::min(budget, static_cast<size_t>(n));
      if (!parser.Feed(std::string_view(buf.data(), static_cast<size_t>(n)), c.expected, &c.replies)) {
        FailConversation(c, Failure::kBadReply, "bad reply: " + parser.error());
        return false;
      }
      continue;
    }
    if (n == 0) {
      FailConversation(c, Failure::kClosed, "the server closed the connection");
      return false;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    FailConversation(c, Failure::kIo, Errno("read", errno));
    return false;
  }
  return true;
}

}  // namespace

void Exchange(std::span<Conversation* const> conversations, Clock::time_point deadline) {
  struct Live {
    Conversation* c;
    size_t sent = 0;
    ReplyParser parser;
  };
  std::vector<Live> live;
  live.reserve(conversations.size());
  for (Conversation* c : conversations) {
    c->replies.clear();
    c->failure = Failure::kNone;
    c->error.clear();
    if (c->fd < 0) {
      FailConversation(*c, Failure::kIo, "not connected");
      continue;
    }
    live.push_back(Live{c, 0, ReplyParser(c->limits)});
  }
  std::vector<pollfd> fds;
  std::vector<Live*> polled;
  std::vector<char> buf;  // the receive buffer, allocated on the first read
  const auto start = Clock::now();
  while (true) {
    fds.clear();
    polled.clear();
    for (Live& l : live) {
      if (Finished(*l.c, l.sent)) continue;
      short events = POLLIN;
      if (l.sent < l.c->request.size()) events = static_cast<short>(events | POLLOUT);
      fds.push_back(pollfd{l.c->fd, events, 0});
      polled.push_back(&l);
    }
    if (fds.empty()) return;
    std::chrono::milliseconds left = Remaining(deadline);
    if (left.count() <= 0) {
      auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      for (Live* l : polled) {
        FailConversation(*l->c, Failure::kTimeout,
                         "timed out after " + std::to_string(took) + " ms with " +
                             std::to_string(l->c->replies.size()) + " of " + std::to_string(l->c->expected) +
                             " replies");
      }
      return;
    }
    int ready = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (ready < 0) {
      if (errno == EINTR) continue;
      std::string why = Errno("poll", errno);
      for (Live* l : polled) FailConversation(*l->c, Failure::kIo, why);
      return;
    }
    for (size_t k = 0; k < fds.size(); ++k) {
      Live& l = *polled[k];
      const short ev = fds[k].revents;
      if (ev == 0) continue;
      if ((ev & POLLNVAL) != 0) {
        FailConversation(*l.c, Failure::kIo, "invalid socket");
        continue;
      }
      // Read first: an error or hang-up may come with the last replies still buffered.
      if ((ev & (POLLIN | POLLHUP | POLLERR)) != 0) {
        if (buf.empty()) buf.resize(size_t{64} << 10);
        if (!ReceiveSome(*l.c, l.parser, buf)) continue;
      }
      if ((ev & (POLLOUT | POLLERR)) != 0 && l.sent < l.c->request.size()) SendSome(*l.c, &l.sent);
    }
  }
}

void Exchange(Conversation& conversation, Clock::time_point deadline) {
  Conversation* one[] = {&conversation};
  Exchange(std::span<Conversation* const>(one), deadline);
}

bool Connection::Open(const std::string& host, int port, std::chrono::milliseconds timeout, std::string* why) {
  Close();
  const int64_t ms = std::max<int64_t>(timeout.count(), 1);
  timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
  redisContext* c = redisConnectWithTimeout(host.c_str(), port, tv);
  if (c == nullptr || c->err != 0) {
    *why = c == nullptr ? std::string("out of memory") : Printable(c->errstr);
    if (c != nullptr) redisFree(c);
    return false;
  }
  ctx_ = c;
  return true;
}

void Connection::Close() {
  if (ctx_ != nullptr) redisFree(ctx_);
  ctx_ = nullptr;
}

int Connection::fd() const { return ctx_ != nullptr ? ctx_->fd : -1; }

Connection::Idle Connection::Check() const {
  if (ctx_ == nullptr) return Idle::kClosed;
  char byte;
  while (true) {
    ssize_t n = ::recv(ctx_->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return Idle::kUnsolicited;
    if (n == 0) return Idle::kClosed;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? Idle::kReady : Idle::kClosed;
  }
}

std::string Describe(const Reply& r) {
  switch (r.type) {
    case Reply::Type::kError:
      return "'" + Printable(r.str) + "'";
    case Reply::Type::kStatus:
      return "status '" + Printable(r.str) + "'";
    case Reply::Type::kString:
      return "a bulk string";
    case Reply::Type::kInteger:
      return "an integer";
    case Reply::Type::kNil:
      return "nil";
    case Reply::Type::kArray:
      return "an array";
  }
  return "an unknown reply";
}

std::string Printable(std::string_view s, size_t max) {
  std::string out;
  out.reserve(std::min(s.size(), max));
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char ch = static_cast<unsigned char>(s[i]);
    out += ch >= 0x20 && ch < 0x7f ? static_cast<char>(ch) : '?';
  }
  if (s.size() > max) out += "...";
  return out;
}

std::chrono::milliseconds Remaining(Clock::time_point deadline) {
  auto now = Clock::now();
  if (now >= deadline) return std::chrono::milliseconds(0);
  // Round up: 0.4 ms left is still time to wait.
  return std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
}

}  // namespace tessera::redis_io

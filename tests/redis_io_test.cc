// ReplyParser and Exchange (src/tier/redis_io.h): what both Redis tiers rely on to read a hostile
// server's bytes within bounds and a deadline.
#include "tier/redis_io.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

namespace tessera::redis_io {
namespace {

ReplyLimits Loose() {
  ReplyLimits l;
  l.max_bulk_bytes = 1 << 20;
  l.max_elements = 1000;
  l.max_depth = 4;
  l.max_reply_bytes = 2 << 20;
  return l;
}

// Parses `bytes` fed `step` bytes at a time; false and *error on failure.
bool Parse(const std::string& bytes, size_t step, const ReplyLimits& limits, size_t want, std::vector<Reply>* out,
           std::string* error = nullptr) {
  ReplyParser p(limits);
  for (size_t i = 0; i < bytes.size(); i += step) {
    if (!p.Feed(std::string_view(bytes).substr(i, step), want, out)) {
      if (error != nullptr) *error = p.error();
      return false;
    }
  }
  return true;
}

TEST(RedisIo, ParsesEveryReplyTypeWhateverTheChunking) {
  const std::string wire =
      "+OK\r\n-ERR no\r\n:-42\r\n$5\r\nab\r\nc\r\n$0\r\n\r\n$-1\r\n*-1\r\n*0\r\n"
      "*3\r\n:1\r\n*2\r\n$1\r\nx\r\n*1\r\n+deep\r\n$2\r\nyz\r\n";
  for (size_t step : {1u, 2u, 3u, 7u, 1000u}) {
    std::vector<Reply> r;
    ASSERT_TRUE(Parse(wire, step, Loose(), 9, &r)) << step;
    ASSERT_EQ(r.size(), 9u) << step;
    EXPECT_TRUE(r[0].IsStatus("OK"));
    EXPECT_EQ(r[1].type, Reply::Type::kError);
    EXPECT_EQ(r[1].str, "ERR no");
    EXPECT_EQ(r[2].integer, -42);
    EXPECT_EQ(r[3].str, std::string("ab\r\nc"));  // a bulk string holds any bytes
    EXPECT_EQ(r[4].type, Reply::Type::kString);
    EXPECT_TRUE(r[4].str.empty());
    EXPECT_EQ(r[5].type, Reply::Type::kNil);
    EXPECT_EQ(r[6].type, Reply::Type::kNil);
    EXPECT_EQ(r[7].type, Reply::Type::kArray);
    EXPECT_TRUE(r[7].elements.empty());
    ASSERT_EQ(r[8].elements.size(), 3u);
    EXPECT_EQ(r[8].elements[1].elements[1].elements[0].str, "deep");
    EXPECT_EQ(r[8].elements[2].str, "yz");
  }
}

TEST(RedisIo, RefusesWhatExceedsTheLimitsOnTheHeaderLine) {
  ReplyLimits l = Loose();
  l.max_bulk_bytes = 10;
  l.max_elements = 5;
  l.max_depth = 2;
  l.max_reply_bytes = 100;
  struct Case {
    std::string wire;
    std::string why;
  };
  for (const Case& c : std::vector<Case>{
           {"$11\r\n", "bulk string of 11 bytes"},
           {"*6\r\n", "array of 6 elements"},
           {"*3\r\n*3\r\n", "array of 3 elements"},  // 6 elements in one reply
           {"*1\r\n*1\r\n*1\r\n", "nested deeper than 2"},
           {"*5\r\n+" + std::string(60, 'a') + "\r\n+" + std::string(60, 'b') + "\r\n", "reply longer than 100"},
           {"+" + std::string(5000, 'a'), "longer than"},
           {"$9223372036854775807\r\n", "exceeds the bound"},
           {"$99999999999999999999\r\n", "malformed bulk string length"},
           {":12x\r\n", "malformed integer"},
           {":+1\r\n", "malformed integer"},
           {"$-2\r\n", "malformed bulk"},
           {"*-5\r\n", "malformed array"},
           {"$3\r\nabcX\r\n", "not followed by CRLF"},
           {"+OK\n", "not terminated by CRLF"},
           {"!3\r\n", "unknown reply type"},
           {"\r\n", "empty reply line"},
       }) {
    std::vector<Reply> r;
    std::string error;
    const std::string shown = Printable(c.wire, 40);
    EXPECT_FALSE(Parse(c.wire, 1, l, 1, &r, &error)) << shown;
    EXPECT_NE(error.find(c.why), std::string::npos) << shown << " -> " << error;
    EXPECT_TRUE(r.empty()) << shown;
  }
  // A status line is bounded on its own, whatever the reply's byte budget.
  std::vector<Reply> r;
  std::string error;
  EXPECT_FALSE(Parse("+" + std::string(5000, 'a'), 1000, Loose(), 1, &r, &error));
  EXPECT_NE(error.find("line longer than 4096"), std::string::npos) << error;
  // Data limits: no array with elements, whatever its announced size.
  EXPECT_FALSE(Parse("*2147483647\r\n", 1000, DataLimits(1 << 20), 1, &r, &error));
  EXPECT_NE(error.find("unexpected array"), std::string::npos) << error;
  EXPECT_TRUE(Parse("*0\r\n", 1000, DataLimits(1 << 20), 1, &r));  // wrong-typed, not malformed
}

TEST(RedisIo, BytesPastTheRepliesAskedForAreAnError) {
  std::vector<Reply> r;
  std::string error;
  EXPECT_FALSE(Parse("+OK\r\n+OK\r\n", 1000, Loose(), 1, &r, &error));
  EXPECT_EQ(r.size(), 1u);
  EXPECT_NE(error.find("after the last reply"), std::string::npos) << error;
}

TEST(RedisIo, ExchangeMeetsItsDeadlineAgainstASilentPeer) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  Conversation c;
  c.fd = sv[0];
  AppendCommand(&c.request, {"GET", "k"});
  c.expected = 1;
  c.limits = DataLimits(100);
  Exchange(c, Clock::now() + std::chrono::milliseconds(50));
  EXPECT_EQ(c.failure, Conversation::Failure::kTimeout);
  char buf[64];
  ssize_t n = ::recv(sv[1], buf, sizeof buf, MSG_DONTWAIT);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(std::max<ssize_t>(n, 0))), "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
  // The peer answers, then closes: the reply is kept and the next exchange sees the close.
  ASSERT_EQ(::send(sv[1], "$2\r\nhi\r\n", 8, 0), 8);
  Conversation d;
  d.fd = sv[0];
  d.expected = 1;
  d.limits = DataLimits(100);
  Exchange(d, Clock::now() + std::chrono::milliseconds(50));
  EXPECT_TRUE(d.ok()) << d.error;
  ASSERT_EQ(d.replies.size(), 1u);
  EXPECT_EQ(d.replies[0].str, "hi");
  ::close(sv[1]);
  Conversation e = d;
  Exchange(e, Clock::now() + std::chrono::milliseconds(50));
  EXPECT_EQ(e.failure, Conversation::Failure::kClosed);
  ::close(sv[0]);
}

TEST(RedisIo, PrintableKeepsMessagesOnOneLine) {
  EXPECT_EQ(Printable("OOM \r\n\x01\xff ok"), "OOM ???? ok");
  EXPECT_EQ(Printable(std::string(200, 'a'), 10), std::string(10, 'a') + "...");
}

}  // namespace
}  // namespace tessera::redis_io

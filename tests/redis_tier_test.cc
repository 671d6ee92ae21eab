#include "tessera/redis_tier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "test_support.h"

namespace tessera {
namespace {

using testing::FakeRedis;
using testing::RedisServer;
using Clock = std::chrono::steady_clock;

std::vector<std::byte> Secret(uint8_t fill = 0x42) { return std::vector<std::byte>(32, std::byte{fill}); }

TierRecord Rec(uint64_t i, size_t n = 3000) {
  std::vector<std::byte> p(n);
  for (size_t k = 0; k < n; ++k) p[k] = std::byte{static_cast<uint8_t>((i * 31 + k) & 0xff)};
  return TierRecord{Hash128{i + 1, i * 7}, static_cast<uint16_t>(i % 5), p};
}

RedisTierOptions Opts(int port, const std::string& ns = "tessera:test:fmt:0") {
  RedisTierOptions o;
  o.port = port;
  o.key_namespace = ns;
  o.reconnect_interval_ms = 20;
  o.secret = Secret();
  return o;
}

std::unique_ptr<RedisTier> MustOpen(const RedisTierOptions& o) {
  auto t = RedisTier::Open(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

// One command on a fresh connection; the reply's string ("" if none).
std::string Command(int port, const std::vector<std::string>& args) { return testing::RedisCommand(port, args).text; }

int64_t MillisSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

TEST(RedisTier, PipelinedBatchRoundTripAgainstARealServer) {
  TESSERA_REQUIRE_REDIS_SERVER();
  RedisServer server;
  ASSERT_TRUE(server.Start());
  auto t = MustOpen(Opts(server.port()));
  std::vector<TierRecord> batch;
  for (uint64_t i = 0; i < 50; ++i) batch.push_back(Rec(i));
  ASSERT_TRUE(t->PutBatch(batch).ok());
  std::vector<Hash128> keys;
  for (uint64_t i = 0; i < 60; ++i) keys.push_back(Rec(i).key);
  auto got = t->GetBatch(keys);
  for (uint64_t i = 0; i < 60; ++i) {
    if (i < 50) {
      ASSERT_TRUE(got[i].has_value()) << i;
      EXPECT_EQ(got[i]->payload, Rec(i).payload);
      EXPECT_EQ(got[i]->format_id, i % 5);
    } else {
      EXPECT_FALSE(got[i].has_value());
    }
  }
  EXPECT_EQ(t->stats().hits, 50u);
  EXPECT_EQ(t->stats().misses, 10u);
  EXPECT_EQ(t->stats().puts, 50u);
  EXPECT_EQ(t->stats().errors, 0u);
  // The stored value is the 64-byte authenticated header and the payload.
  EXPECT_EQ(Command(server.port(), {"GET", "tessera:test:fmt:0:" + Rec(0).key.Hex()}).size(), 64u + 3000u);
}

TEST(RedisTier, OpenRejectsBadOptionsNamingTheField) {
  auto field = [](const RedisTierOptions& o) {
    auto t = RedisTier::Open(o);
    EXPECT_FALSE(t.ok());
    return t.ok() ? std::string("(ok)") : t.status().field();
  };
  RedisTierOptions o = Opts(6379);
  o.secret.clear();
  EXPECT_EQ(field(o), "secret");  // required
  o.secret = std::vector<std::byte>(15, std::byte{1});
  EXPECT_EQ(field(o), "secret");
  o.secret = Secret();
  o.max_value_bytes = 0;
  EXPECT_EQ(field(o), "max_value_bytes");
  o.max_value_bytes = 512ull << 20;  // with the header, more than a Redis string holds
  EXPECT_EQ(field(o), "max_value_bytes");
  o.max_value_bytes = 1 << 20;
  o.timeout_ms = 0;
  EXPECT_EQ(field(o), "timeout_ms");
  o.timeout_ms = 100;
  o.port = 0;
  EXPECT_EQ(field(o), "port");
  o.port = 65536;
  EXPECT_EQ(field(o), "port");
  o.port = 6379;
  o.host.clear();
  EXPECT_EQ(field(o), "host");
  o.host = "127.0.0.1";
  EXPECT_TRUE(RedisTier::Open(o).ok());
}

TEST(RedisTier, NamespacesIsolateTenants) {
  TESSERA_REQUIRE_REDIS_SERVER();
  RedisServer server;
  ASSERT_TRUE(server.Start());
  auto a = MustOpen(Opts(server.port(), RedisNamespace("deepseek-v3", "fp8_ds_mla", 1)));
  auto b = MustOpen(Opts(server.port(), RedisNamespace("deepseek-v3", "fp8_ds_mla", 2)));
  ASSERT_TRUE(a->PutBatch(std::vector<TierRecord>{Rec(1)}).ok());
  std::vector<Hash128> k{Rec(1).key};
  EXPECT_TRUE(a->GetBatch(k)[0].has_value());
  EXPECT_FALSE(b->GetBatch(k)[0].has_value());
}

// Regression: the parts were joined with ':' unescaped, so model "a:b" + format "c" and model
// "a" + format "b:c" shared one namespace (and so one another's blocks).
TEST(RedisTier, NamespaceIsInjective) {
  EXPECT_NE(RedisNamespace("a:b", "c", 0), RedisNamespace("a", "b:c", 0));
  EXPECT_NE(RedisNamespace("a", "b:1", 2), RedisNamespace("a", "b", 1));      // format "b:1" vs domain
  EXPECT_NE(RedisNamespace("a%3Ab", "c", 0), RedisNamespace("a:b", "c", 0));  // the escape is escaped
  // Names that need no escape keep the readable form.
  EXPECT_EQ(RedisNamespace("deepseek-v3", "fp8_ds_mla", 7), "tessera:deepseek-v3:fp8_ds_mla:7");
  EXPECT_EQ(RedisNamespace("a{b}", "c", 0).find_first_of("{}"), std::string::npos);  // cluster-safe
  // Every (model, format, domain) over a small alphabet that includes the separator and the
  // escape character gives a distinct namespace.
  const std::string alphabet = "a:%1{";
  std::vector<std::string> parts{""};
  for (size_t len = 1; len <= 3; ++len) {
    std::vector<std::string> grown;
    for (const std::string& p : parts) {
      if (p.size() != len - 1) continue;
      for (char c : alphabet) grown.push_back(p + c);
    }
    parts.insert(parts.end(), grown.begin(), grown.end());
  }
  std::set<std::string> seen;
  size_t n = 0;
  for (const std::string& model : parts) {
    for (const std::string& format : parts) {
      for (uint32_t domain : {0u, 1u, 11u}) {
        seen.insert(RedisNamespace(model, format, domain));
        ++n;
      }
    }
  }
  EXPECT_EQ(seen.size(), n);
}

TEST(RedisTier, ACorruptedValueIsAMissNeverWrongBytes) {
  TESSERA_REQUIRE_REDIS_SERVER();
  RedisServer server;
  ASSERT_TRUE(server.Start());
  RedisTierOptions o = Opts(server.port());
  auto t = MustOpen(o);
  ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{Rec(1), Rec(2)}).ok());
  // Overwrite byte 100 of record 1's value behind the tier's back.
  ASSERT_TRUE(
      testing::RedisCommand(server.port(), {"SETRANGE", o.key_namespace + ":" + Rec(1).key.Hex(), "100", "Z"}).ok());
  ASSERT_TRUE(testing::RedisCommand(server.port(), {"SET", o.key_namespace + ":" + Rec(2).key.Hex(), "short"}).ok());
  std::vector<Hash128> keys{Rec(1).key, Rec(2).key};
  auto got = t->GetBatch(keys);
  EXPECT_FALSE(got[0].has_value());
  EXPECT_FALSE(got[1].has_value());
  EXPECT_EQ(t->stats().verify_failures, 2u);
}

// Regression: values were checked with an unkeyed checksum, so whoever could write to the server
// could plant a block (header and checksum recomputed) that the tier returned as verified, and a
// value copied from another namespace (another tenant domain) verified too. Now every value
// carries a RecordMac tag under the fleet's secret that binds the namespace, the key, the format
// id and the length.
TEST(RedisTier, ForgedEditedOrCopiedValuesAreVerifyFailures) {
  TESSERA_REQUIRE_REDIS_SERVER();
  RedisServer server;
  ASSERT_TRUE(server.Start());
  const std::string ns = RedisNamespace("m", "f", 1), other_ns = RedisNamespace("m", "f", 2);
  auto t = MustOpen(Opts(server.port(), ns));
  auto other_tenant = MustOpen(Opts(server.port(), other_ns));
  RedisTierOptions wrong = Opts(server.port(), ns);
  wrong.secret = Secret(0x17);  // another fleet: same namespace, another secret
  auto other_fleet = MustOpen(wrong);
  std::vector<TierRecord> recs;
  for (uint64_t i = 0; i < 8; ++i) recs.push_back(Rec(i));
  ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>(recs.begin(), recs.begin() + 4)).ok());
  ASSERT_TRUE(other_tenant->PutBatch(std::vector<TierRecord>{recs[4]}).ok());
  ASSERT_TRUE(other_fleet->PutBatch(std::vector<TierRecord>{recs[5]}).ok());
  auto name = [&](const std::string& n, size_t i) { return n + ":" + recs[i].key.Hex(); };
  const int port = server.port();
  // 0: a forged block (attacker's bytes, version-1 header and checksum).
  std::vector<std::byte> evil(3000, std::byte{0x66});
  ASSERT_EQ(Command(port, {"SET", name(ns, 0), testing::ForgeRedisValueV1(recs[0].key, recs[0].format_id, evil)}),
            "OK");
  // 1: an edited payload byte.
  Command(port, {"SETRANGE", name(ns, 1), "1000", "Z"});
  // 2: record 3's value copied under record 2's key.
  ASSERT_EQ(Command(port, {"SET", name(ns, 2), Command(port, {"GET", name(ns, 3)})}), "OK");
  // 3: truncated by one byte.
  std::string v3 = Command(port, {"GET", name(ns, 3)});
  ASSERT_EQ(Command(port, {"SET", name(ns, 3), v3.substr(0, v3.size() - 1)}), "OK");
  // 4: another tenant's value for the same key, copied into this namespace.
  ASSERT_EQ(Command(port, {"SET", name(ns, 4), Command(port, {"GET", name(other_ns, 4)})}), "OK");
  // 5: written by another fleet (another secret) under this namespace — already there.
  // 6: the header's payload length edited to match a truncated payload.
  ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{recs[6]}).ok());
  std::string v6 = Command(port, {"GET", name(ns, 6)});
  v6.resize(v6.size() - 100);
  uint64_t len6 = v6.size() - 64;
  std::memcpy(v6.data() + 24, &len6, sizeof len6);
  ASSERT_EQ(Command(port, {"SET", name(ns, 6), v6}), "OK");
  // 7: untouched.
  ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{recs[7]}).ok());
  std::vector<Hash128> keys;
  for (const TierRecord& r : recs) keys.push_back(r.key);
  uint64_t failures_before = t->stats().verify_failures;
  auto got = t->GetBatch(keys);
  for (size_t i = 0; i < 7; ++i) EXPECT_FALSE(got[i].has_value()) << i;
  ASSERT_TRUE(got[7].has_value());
  EXPECT_EQ(got[7]->payload, recs[7].payload);
  EXPECT_EQ(t->stats().verify_failures - failures_before, 7u);
  // The other tenant still reads its own value; the other fleet reads nothing of this one.
  std::vector<Hash128> k4{recs[4].key}, k7{recs[7].key};
  EXPECT_TRUE(other_tenant->GetBatch(k4)[0].has_value());
  EXPECT_FALSE(other_fleet->GetBatch(k7)[0].has_value());
  EXPECT_EQ(other_fleet->stats().verify_failures, 1u);
}

// Regression: a SET the server refused (-OOM under maxmemory noeviction) was counted but
// PutBatch returned OK, so the store above believed the blocks were in Redis.
TEST(RedisTier, PutBatchFailsWhenTheServerRefusesSets) {
  TESSERA_REQUIRE_REDIS_SERVER();
  RedisServer server;
  server.AddArgs({"--maxmemory", "1mb", "--maxmemory-policy", "noeviction"});
  ASSERT_TRUE(server.Start());
  auto t = MustOpen(Opts(server.port()));
  std::vector<TierRecord> batch;
  for (uint64_t i = 0; i < 100; ++i) batch.push_back(Rec(i, 20000));  // 2 MB: more than 1 MB
  Status st = t->PutBatch(batch);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.field(), "redis");
  EXPECT_NE(st.message().find("OOM"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("refused"), std::string::npos) << st.message();
  RedisTierStats s = t->stats();
  EXPECT_LT(s.puts, 100u);
  EXPECT_EQ(s.errors, 100u - s.puts);  // one per refused SET
  EXPECT_TRUE(s.connected);            // a refusal is an answer: the connection stays
}

TEST(RedisTier, KilledAndRestartedServerDegradesToMissesAndRecovers) {
  TESSERA_REQUIRE_REDIS_SERVER();
  RedisServer server;
  ASSERT_TRUE(server.Start());
  // The reconnection backoff reads a clock the test moves (no sleeping against the real one).
  auto skew = std::make_shared<std::atomic<int64_t>>(0);
  RedisTierOptions o = Opts(server.port());
  o.backoff_clock = [skew] { return std::chrono::steady_clock::now() + std::chrono::milliseconds(skew->load()); };
  auto t = MustOpen(o);
  ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{Rec(1)}).ok());
  std::vector<Hash128> k{Rec(1).key};
  ASSERT_TRUE(t->GetBatch(k)[0].has_value());
  server.Stop();
  // Down: misses, not errors, for reads; puts report the outage.
  EXPECT_FALSE(t->GetBatch(k)[0].has_value());
  EXPECT_FALSE(t->PutBatch(std::vector<TierRecord>{Rec(2)}).ok());
  EXPECT_FALSE(t->stats().connected);
  EXPECT_GT(t->stats().errors, 0u);
  ASSERT_TRUE(server.Start());                  // same port, empty (no persistence)
  *skew += 30;                                  // past reconnect_interval_ms
  EXPECT_FALSE(t->GetBatch(k)[0].has_value());  // the data died with the server: a miss, not wrong data
  EXPECT_EQ(t->stats().recoveries, 1u);
  ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{Rec(3)}).ok());
  std::vector<Hash128> k3{Rec(3).key};
  EXPECT_TRUE(t->GetBatch(k3)[0].has_value());
}

// A large batch to a server killed while the tier still holds its connection: writing into the
// dead connection must not raise SIGPIPE (which would end the process). An error instead.
TEST(RedisTier, LargeBatchToAKilledServerIsAnErrorNotSigpipe) {
  TESSERA_REQUIRE_REDIS_SERVER();
  RedisServer server;
  ASSERT_TRUE(server.Start());
  auto t = MustOpen(Opts(server.port()));
  std::vector<TierRecord> batch;
  for (uint64_t i = 0; i < 200; ++i) batch.push_back(Rec(i, 20000));
  ASSERT_TRUE(t->PutBatch(batch).ok());
  server.Stop();
  EXPECT_FALSE(t->PutBatch(batch).ok());  // reaching this line at all is the test
  EXPECT_GT(t->stats().errors, 0u);
}

TEST(RedisTier, UnreachableFromTheStartIsMissOnly) {
  auto t = MustOpen(Opts(RedisServer::FreePort()));
  std::vector<Hash128> k{Rec(1).key};
  EXPECT_FALSE(t->GetBatch(k)[0].has_value());
  Status st = t->PutBatch(std::vector<TierRecord>{Rec(1)});
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.field(), "redis");
  EXPECT_EQ(t->stats().recoveries, 0u);
}

TEST(RedisTier, RecordsOverMaxValueBytesAreNotStored) {
  TESSERA_REQUIRE_REDIS_SERVER();
  RedisServer server;
  ASSERT_TRUE(server.Start());
  RedisTierOptions o = Opts(server.port());
  o.max_value_bytes = 4000;
  auto t = MustOpen(o);
  Status st = t->PutBatch(std::vector<TierRecord>{Rec(1, 3000), Rec(2, 5000)});
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("max_value_bytes"), std::string::npos) << st.message();
  std::vector<Hash128> keys{Rec(1).key, Rec(2).key};
  auto got = t->GetBatch(keys);
  EXPECT_TRUE(got[0].has_value());
  EXPECT_FALSE(got[1].has_value());
  // A tier with a smaller bound refuses the stored value as a reply over its bound: a miss, and
  // the connection is dropped before the payload is read.
  o.max_value_bytes = 1000;
  auto small = MustOpen(o);
  std::vector<Hash128> k1{Rec(1).key};
  EXPECT_FALSE(small->GetBatch(k1)[0].has_value());
  EXPECT_EQ(small->stats().bad_replies, 1u);
  EXPECT_FALSE(small->stats().connected);
}

// ---- A hostile server ------------------------------------------------------------------------
//
// The deadline in these tests is 200 ms; each call must return within twice that with bounded
// memory, and degrade as for a lost server (GetBatch: misses; PutBatch: kIoError, counted).

constexpr uint32_t kDeadlineMs = 200;

RedisTierOptions HostileOpts(const FakeRedis& fake) {
  RedisTierOptions o = Opts(fake.port());
  o.timeout_ms = kDeadlineMs;
  o.reconnect_interval_ms = 0;
  return o;
}

// Regression: timeouts were per read(2), so a server sending one byte every 10 ms kept GetBatch
// waiting for the whole reply (here 1 s; 15 s and more with a longer value).
TEST(RedisTierHostile, DripFedGetReplyIsCutOffAtTheDeadline) {
  FakeRedis fake([](FakeRedis::Conn& c) {
    if (!c.ReadCommands(1)) return;
    c.Drip("$100\r\n" + std::string(100, 'x') + "\r\n", std::chrono::milliseconds(10));
    c.WaitClosed();
  });
  auto t = MustOpen(HostileOpts(fake));
  std::vector<Hash128> k{Rec(1).key};
  auto t0 = Clock::now();
  auto got = t->GetBatch(k);
  int64_t took = MillisSince(t0);
  EXPECT_FALSE(got[0].has_value());
  RedisTierStats s = t->stats();
  EXPECT_EQ(s.timeouts, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_GE(s.errors, 1u);
  EXPECT_FALSE(s.connected);
  std::printf("[ timing ] drip-fed GET reply: returned after %lld ms (deadline %u ms)\n", static_cast<long long>(took),
              kDeadlineMs);
}

// Regression: the same for PutBatch — a reply to SET drip-fed (a long error line).
TEST(RedisTierHostile, DripFedSetReplyIsCutOffAtTheDeadline) {
  FakeRedis fake([](FakeRedis::Conn& c) {
    if (!c.ReadCommands(3)) return;
    c.Drip("-ERR " + std::string(100, 'x') + "\r\n", std::chrono::milliseconds(10));
    c.WaitClosed();
  });
  auto t = MustOpen(HostileOpts(fake));
  auto t0 = Clock::now();
  Status st = t->PutBatch(std::vector<TierRecord>{Rec(1), Rec(2), Rec(3)});
  int64_t took = MillisSince(t0);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.field(), "redis");
  EXPECT_NE(st.message().find("timed out"), std::string::npos) << st.message();
  EXPECT_EQ(t->stats().timeouts, 1u);
  EXPECT_EQ(t->stats().puts, 0u);
  std::printf("[ timing ] drip-fed SET reply: returned after %lld ms (deadline %u ms)\n", static_cast<long long>(took),
              kDeadlineMs);
}

// Regression: a 14-byte reply announcing 2^31-1 elements made hiredis allocate 16 GiB of element
// pointers and walk them (over 30 s and gigabytes resident). Now an array is refused as soon as
// its header line is complete.
TEST(RedisTierHostile, HugeArrayHeaderFailsFastWithBoundedMemory) {
  FakeRedis fake([](FakeRedis::Conn& c) {
    if (!c.ReadCommands(1)) return;
    c.Send("*2147483647\r\n");
    c.WaitClosed();
  });
  auto t = MustOpen(HostileOpts(fake));
  std::vector<Hash128> k{Rec(1).key};
  uint64_t rss0 = testing::PeakRssBytes();
  auto t0 = Clock::now();
  auto got = t->GetBatch(k);
  int64_t took = MillisSince(t0);
  EXPECT_FALSE(got[0].has_value());  // fails on the header, not at the deadline
  EXPECT_LT(testing::PeakRssBytes() - rss0, 64u << 20);
  EXPECT_EQ(t->stats().bad_replies, 1u);
  EXPECT_EQ(t->stats().timeouts, 0u);
  EXPECT_FALSE(t->stats().connected);
  std::printf("[ timing ] *2147483647 reply: returned after %lld ms\n", static_cast<long long>(took));
}

// Regression: a bulk length far above any value the tier stores, followed by a flood of bytes:
// hiredis buffered all of them (here up to 512 MiB) waiting for the end of the string. Now the
// header is refused against max_value_bytes before a byte of it is kept.
TEST(RedisTierHostile, HugeBulkHeaderFailsFastWithBoundedMemory) {
  FakeRedis fake([](FakeRedis::Conn& c) {
    if (!c.ReadCommands(1)) return;
    c.Send("$99999999999\r\n");
    c.Flood('x', 512u << 20);
  });
  RedisTierOptions o = HostileOpts(fake);
  o.max_value_bytes = 1 << 20;
  auto t = MustOpen(o);
  std::vector<Hash128> k{Rec(1).key};
  uint64_t rss0 = testing::PeakRssBytes();
  auto t0 = Clock::now();
  auto got = t->GetBatch(k);
  int64_t took = MillisSince(t0);
  EXPECT_FALSE(got[0].has_value());
  EXPECT_LT(testing::PeakRssBytes() - rss0, 64u << 20);
  EXPECT_EQ(t->stats().bad_replies, 1u);
  EXPECT_FALSE(t->stats().connected);
  std::printf("[ timing ] $99999999999 reply: returned after %lld ms\n", static_cast<long long>(took));
}

// A bulk length that overflows 64-bit arithmetic, and malformed headers: refused, never read.
TEST(RedisTierHostile, MalformedLengthsAreRefused) {
  for (const char* bad : {"$9223372036854775807\r\n", "$18446744073709551617\r\n", "$-2\r\n", "$12abc\r\n", "$+5\r\n",
                          "$\r\n", "?what\r\n", "$5\nabcde\r\n"}) {
    const std::string reply = bad;
    FakeRedis fake([&](FakeRedis::Conn& c) {
      if (!c.ReadCommands(1)) return;
      c.Send(reply);
      c.WaitClosed();
    });
    auto t = MustOpen(HostileOpts(fake));
    std::vector<Hash128> k{Rec(1).key};
    EXPECT_FALSE(t->GetBatch(k)[0].has_value()) << bad;
    EXPECT_EQ(t->stats().bad_replies, 1u) << bad;  // refused on the header,
    EXPECT_EQ(t->stats().timeouts, 0u) << bad;     // not waited on
  }
}

// Half a reply, then silence: cut off at the deadline; the next call reconnects and works.
TEST(RedisTierHostile, HalfAReplyThenSilenceIsAMissAndTheTierRecovers) {
  std::atomic<int> connection{0};
  FakeRedis fake([&](FakeRedis::Conn& c) {
    if (connection.fetch_add(1) == 0) {
      if (!c.ReadCommands(2)) return;
      c.Send("$-1\r\n$100\r\nabc");  // the first reply whole, half of the second
      c.WaitClosed();
      return;
    }
    std::vector<std::string> cmd;
    while (c.ReadCommand(&cmd)) c.Send("$-1\r\n");
  });
  auto t = MustOpen(HostileOpts(fake));
  std::vector<Hash128> keys{Rec(1).key, Rec(2).key};
  auto got = t->GetBatch(keys);
  EXPECT_FALSE(got[0].has_value());
  EXPECT_FALSE(got[1].has_value());
  EXPECT_EQ(t->stats().timeouts, 1u);
  got = t->GetBatch(keys);  // a new connection, a server that answers
  EXPECT_EQ(t->stats().recoveries, 1u);
  EXPECT_EQ(t->stats().timeouts, 1u);
  EXPECT_EQ(t->stats().misses, 4u);
  EXPECT_TRUE(t->stats().connected);
}

// Regression: a SET answered with something that is not +OK (an integer, a bulk "OK") was
// counted and PutBatch still returned OK. Wrong-typed replies to GET are misses, counted.
TEST(RedisTierHostile, WrongTypedRepliesAreFailures) {
  FakeRedis fake([](FakeRedis::Conn& c) {
    std::vector<std::string> cmd;
    int sets = 0, gets = 0;
    while (c.ReadCommand(&cmd)) {
      if (cmd[0] == "SET") c.Send(sets++ == 0 ? ":1\r\n" : "$2\r\nOK\r\n");
      if (cmd[0] == "GET") c.Send(gets++ == 0 ? ":42\r\n" : "*0\r\n");
      if (cmd[0] == "DEL") c.Send("+OK\r\n");
    }
  });
  auto t = MustOpen(HostileOpts(fake));
  std::vector<TierRecord> recs{Rec(0), Rec(1)};
  Status st = t->PutBatch(recs);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(t->stats().puts, 0u);
  std::vector<Hash128> keys{Rec(0).key, Rec(1).key};
  auto got = t->GetBatch(keys);
  EXPECT_FALSE(got[0].has_value());
  EXPECT_FALSE(got[1].has_value());
  EXPECT_EQ(t->stats().bad_replies, 4u);
  EXPECT_EQ(t->EraseBatch(keys).code(), StatusCode::kIoError);
  EXPECT_EQ(t->stats().bad_replies, 6u);
  EXPECT_TRUE(t->stats().connected);  // well-formed replies: the connection is still in step
}

// Bytes nobody asked for (a second reply to one GET) would be read as the next batch's replies:
// the connection is dropped instead, and the next call starts on a fresh one.
TEST(RedisTierHostile, UnsolicitedBytesDropTheConnection) {
  FakeRedis fake([](FakeRedis::Conn& c) {
    std::vector<std::string> cmd;
    while (c.ReadCommand(&cmd)) c.Send("$-1\r\n:7\r\n");
  });
  auto t = MustOpen(HostileOpts(fake));
  std::vector<Hash128> k{Rec(1).key};
  EXPECT_FALSE(t->GetBatch(k)[0].has_value());
  // The extra bytes arrived with the reply or after it; either way the connection is not reused.
  EXPECT_FALSE(t->GetBatch(k)[0].has_value());
  EXPECT_GE(t->stats().bad_replies, 1u);
  EXPECT_GE(fake.connections(), 2);
}

}  // namespace
}  // namespace tessera

#include "tessera/redis_cluster.h"

#include "tessera/request_manager.h"
#include "tessera/tier_adapters.h"
#include "tessera/tiered_store.h"

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <unordered_map>
#include <utility>

#include "kv_stream.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::RedisServer;

using Reply = testing::RedisReply;
Reply Command(int port, const std::vector<std::string>& args) { return testing::RedisCommand(port, args); }

TierRecord Rec(uint64_t i, size_t n = 2000) {
  std::vector<std::byte> p(n);
  for (size_t k = 0; k < n; ++k) p[k] = std::byte{static_cast<uint8_t>((i * 131 + k * 7) & 0xff)};
  return TierRecord{Hash128{i * 0x9e3779b97f4a7c15ULL + 1, i}, static_cast<uint16_t>(i % 7), p};
}

std::vector<TierRecord> Recs(uint64_t from, uint64_t to) {
  std::vector<TierRecord> v;
  for (uint64_t i = from; i < to; ++i) v.push_back(Rec(i));
  return v;
}

std::vector<Hash128> Keys(const std::vector<TierRecord>& recs) {
  std::vector<Hash128> k;
  for (const TierRecord& r : recs) k.push_back(r.key);
  return k;
}

constexpr std::array<std::array<int, 2>, 3> kRanges{{{0, 5460}, {5461, 10922}, {10923, 16383}}};

int OwnerOfSlot(uint16_t slot) {
  for (int i = 0; i < 3; ++i) {
    if (slot >= kRanges[i][0] && slot <= kRanges[i][1]) return i;
  }
  return -1;
}

const std::string kNs = "tessera:test:fmt:0";

std::vector<std::byte> Secret(uint8_t fill = 0x42) { return std::vector<std::byte>(32, std::byte{fill}); }

uint16_t SlotOf(const Hash128& key) { return RedisClusterKeySlot(kNs + ":{" + key.Hex() + "}"); }

// Three redis-server processes in cluster mode, one master per third of the slots.
class Cluster {
 public:
  Cluster() {
    for (int i = 0; i < 3; ++i) {
      nodes_[i] = std::make_unique<RedisServer>();  // client and bus ports chosen at Start
      nodes_[i]->EnableCluster();
      nodes_[i]->AddArgs({"--cluster-require-full-coverage", "no"});
    }
  }

  // Starts the nodes, assigns the slots, introduces the nodes and waits (up to 10 s) until every
  // node reports cluster_state:ok with all slots assigned.
  ::testing::AssertionResult Form() {
    for (int i = 0; i < 3; ++i) {
      if (!nodes_[i]->Start()) return ::testing::AssertionFailure() << "node " << i << " did not start";
      Reply e = Command(port(i), {"CLUSTER", "SET-CONFIG-EPOCH", std::to_string(i + 1)});
      Reply a =
          Command(port(i), {"CLUSTER", "ADDSLOTSRANGE", std::to_string(kRanges[i][0]), std::to_string(kRanges[i][1])});
      if (!e.ok() || !a.ok()) return ::testing::AssertionFailure() << "node " << i << ": " << e.text << a.text;
      Reply id = Command(port(i), {"CLUSTER", "MYID"});
      if (!id.ok() || id.text.empty()) return ::testing::AssertionFailure() << "no id for node " << i;
      ids_[i] = id.text;
    }
    for (int i = 1; i < 3; ++i) {
      Reply m = Command(
          port(0), {"CLUSTER", "MEET", "127.0.0.1", std::to_string(port(i)), std::to_string(nodes_[i]->bus_port())});
      if (!m.ok()) return ::testing::AssertionFailure() << "MEET: " << m.text;
    }
    for (int i = 0; i < 3; ++i) {
      if (!WaitOk(i)) return ::testing::AssertionFailure() << "node " << i << " never reported cluster_state:ok";
    }
    return ::testing::AssertionSuccess();
  }

  // Polls CLUSTER INFO on node i for up to 10 s.
  bool WaitOk(int i) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      Reply r = Command(port(i), {"CLUSTER", "INFO"});
      if (r.text.find("cluster_state:ok") != std::string::npos &&
          r.text.find("cluster_slots_assigned:16384") != std::string::npos &&
          r.text.find("cluster_known_nodes:3") != std::string::npos) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  RedisClusterOptions Options(const std::string& ns = kNs) const {
    RedisClusterOptions o;
    o.seeds = {"127.0.0.1:" + std::to_string(port(0)), "127.0.0.1:" + std::to_string(port(1))};
    o.key_namespace = ns;
    o.reconnect_interval_ms = 20;
    o.timeout_ms = 1000;
    o.secret = Secret();
    return o;
  }

  int port(int i) const { return nodes_[i]->port(); }
  std::string address(int i) const { return "127.0.0.1:" + std::to_string(port(i)); }
  const std::string& id(int i) const { return ids_[i]; }
  RedisServer& node(int i) { return *nodes_[i]; }
  long long DbSize(int i) const { return Command(port(i), {"DBSIZE"}).integer; }

 private:
  std::array<std::unique_ptr<RedisServer>, 3> nodes_;
  std::array<std::string, 3> ids_;
};

std::unique_ptr<RedisClusterTier> MustOpen(const RedisClusterOptions& o) {
  auto t = RedisClusterTier::Open(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

const RedisClusterNodeStats* NodeStats(const RedisClusterStats& s, const std::string& address) {
  for (const RedisClusterNodeStats& n : s.nodes) {
    if (n.address == address) return &n;
  }
  return nullptr;
}

TEST(RedisClusterSlots, Crc16IsTheSpecsXmodemVariant) {
  EXPECT_EQ(RedisClusterCrc16("123456789"), 0x31C3);  // the specification's check value
  EXPECT_EQ(RedisClusterCrc16(""), 0);
  EXPECT_EQ(RedisClusterCrc16("A"), 0x58E5);  // XModem check value for one byte
  EXPECT_EQ(RedisClusterKeySlot("123456789"), 0x31C3 % 16384);
}

TEST(RedisClusterSlots, HashTagsFollowTheSpec) {
  EXPECT_EQ(RedisClusterKeySlot("{user1000}.following"), RedisClusterKeySlot("{user1000}.followers"));
  EXPECT_EQ(RedisClusterKeySlot("{user1000}.following"), RedisClusterKeySlot("user1000"));
  EXPECT_NE(RedisClusterKeySlot("user1000.following"), RedisClusterKeySlot("user1000.followers"));
  EXPECT_EQ(RedisClusterKeySlot("foo{}{bar}"), RedisClusterKeySlot("foo{}{bar}"));
  EXPECT_EQ(RedisClusterKeySlot("foo{}{bar}"), RedisClusterCrc16("foo{}{bar}") % 16384);  // empty tag: whole key
  EXPECT_EQ(RedisClusterKeySlot("foo{{bar}}zap"), RedisClusterKeySlot("{bar"));           // tag is "{bar"
  EXPECT_EQ(RedisClusterKeySlot("foo{bar}{zap}"), RedisClusterKeySlot("bar"));            // the first tag only
  EXPECT_EQ(RedisClusterKeySlot("foo{bar"), RedisClusterCrc16("foo{bar") % 16384);        // unclosed: whole key
  // The namespace does not change the slot; the key hex does.
  Hash128 k{1, 2};
  EXPECT_EQ(RedisClusterKeySlot("a:{" + k.Hex() + "}"), RedisClusterKeySlot("b:c:{" + k.Hex() + "}"));
}

TEST(RedisClusterSlots, AgreesWithTheServersKeyslot) {
  TESSERA_REQUIRE_REDIS_SERVER();
  RedisServer server;
  server.EnableCluster();  // an explicit bus port: a port above 55535 has no +10000 one
  ASSERT_TRUE(server.Start());
  std::vector<std::string> keys{
      "",  "a", "123456789", "{user1000}.following",        "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "}{x}",
      "{", "}", "{}",        std::string("\xff\x00\x80", 3)};
  for (uint64_t i = 0; i < 200; ++i) keys.push_back(kNs + ":{" + Rec(i, 0).key.Hex() + "}");
  for (const std::string& k : keys) {
    Reply r = Command(server.port(), {"CLUSTER", "KEYSLOT", k});
    ASSERT_EQ(r.type, REDIS_REPLY_INTEGER) << r.text;
    EXPECT_EQ(RedisClusterKeySlot(k), r.integer) << k;
  }
}

TEST(RedisClusterTier, OpenRejectsBadOptionsNamingTheField) {
  RedisClusterOptions o;
  auto field = [](const RedisClusterOptions& opts) {
    auto t = RedisClusterTier::Open(opts);
    EXPECT_FALSE(t.ok());
    return t.ok() ? std::string("(ok)") : t.status().field();
  };
  EXPECT_EQ(field(o), "seeds");
  for (const char* bad : {"localhost", "localhost:", ":6379", "h:0", "h:65536", "h:12x", "[]:1"}) {
    o.seeds = {bad};
    EXPECT_EQ(field(o), "seeds") << bad;
  }
  o.seeds = {"127.0.0.1:1"};
  o.key_namespace = "ns{x}";
  EXPECT_EQ(field(o), "key_namespace");
  o.key_namespace = "ns";
  o.timeout_ms = 0;
  EXPECT_EQ(field(o), "timeout_ms");
  o.timeout_ms = 100;
  o.connect_timeout_ms = 0;
  EXPECT_EQ(field(o), "connect_timeout_ms");
  o.connect_timeout_ms = 100;
  EXPECT_EQ(field(o), "secret");  // required
  o.secret = std::vector<std::byte>(15, std::byte{1});
  EXPECT_EQ(field(o), "secret");
  o.secret = Secret();
  o.max_value_bytes = 0;
  EXPECT_EQ(field(o), "max_value_bytes");
  o.max_value_bytes = 512ull << 20;
  EXPECT_EQ(field(o), "max_value_bytes");
}

TEST(RedisClusterTier, UnreachableClusterIsMissOnly) {
  RedisClusterOptions o;
  o.secret = Secret();
  o.seeds = {"127.0.0.1:" + std::to_string(RedisServer::FreePort())};
  auto t = MustOpen(o);
  ASSERT_NE(t, nullptr);
  std::vector<TierRecord> recs = Recs(0, 3);
  auto got = t->GetBatch(Keys(recs));
  for (const auto& g : got) EXPECT_FALSE(g.has_value());
  Status st = t->PutBatch(recs);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.field(), "redis");
  EXPECT_EQ(t->EraseBatch(Keys(recs)).code(), StatusCode::kIoError);
  RedisClusterStats s = t->stats();
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.put_failures, 3u);
  EXPECT_GE(s.slot_map_failures, 1u);
  EXPECT_EQ(s.slot_map_refreshes, 0u);
  EXPECT_EQ(s.recoveries, 0u);
  EXPECT_GT(s.errors, 0u);
}

TEST(RedisClusterTier, BatchRoundTripSpreadsOverEveryNode) {
  TESSERA_REQUIRE_REDIS_SERVER();
  Cluster cluster;
  ASSERT_TRUE(cluster.Form());
  auto t = MustOpen(cluster.Options());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->stats().slots_covered, 16384u);
  std::vector<TierRecord> recs = Recs(0, 300);
  ASSERT_TRUE(t->PutBatch(recs).ok());
  long long total = 0;
  for (int i = 0; i < 3; ++i) {
    long long n = cluster.DbSize(i);
    EXPECT_GT(n, 50) << "node " << i << " holds too few of the 300 keys";
    total += n;
  }
  EXPECT_EQ(total, 300);

  std::vector<Hash128> keys = Keys(recs);
  for (uint64_t i = 300; i < 320; ++i) keys.push_back(Rec(i).key);  // never stored
  auto got = t->GetBatch(keys);
  ASSERT_EQ(got.size(), 320u);
  for (size_t i = 0; i < 320; ++i) {
    if (i < 300) {
      ASSERT_TRUE(got[i].has_value()) << i;
      EXPECT_EQ(got[i]->key, recs[i].key);
      EXPECT_EQ(got[i]->format_id, recs[i].format_id);
      EXPECT_EQ(got[i]->payload, recs[i].payload);
    } else {
      EXPECT_FALSE(got[i].has_value()) << i;
    }
  }
  RedisClusterStats s = t->stats();
  EXPECT_EQ(s.hits, 300u);
  EXPECT_EQ(s.misses, 20u);
  EXPECT_EQ(s.puts, 300u);
  EXPECT_EQ(s.redirections, 0u);
  EXPECT_EQ(s.slot_map_refreshes, 1u);
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(s.verify_failures, 0u);
  for (int i = 0; i < 3; ++i) {
    const RedisClusterNodeStats* n = NodeStats(s, cluster.address(i));
    ASSERT_NE(n, nullptr) << cluster.address(i);
    EXPECT_TRUE(n->connected);
  }

  // The stored key is "<namespace>:{<key hex>}" on the node that owns its slot.
  const Hash128& k0 = recs[0].key;
  Reply raw = Command(cluster.port(OwnerOfSlot(SlotOf(k0))), {"STRLEN", kNs + ":{" + k0.Hex() + "}"});
  EXPECT_EQ(raw.integer, static_cast<long long>(64 + recs[0].payload.size()));

  // Another namespace reads nothing of this one.
  auto other = MustOpen(cluster.Options("tessera:test:fmt:1"));
  ASSERT_NE(other, nullptr);
  for (const auto& g : other->GetBatch(Keys(recs))) EXPECT_FALSE(g.has_value());

  // Erase half: those miss, the rest still hit.
  std::vector<Hash128> half(keys.begin(), keys.begin() + 150);
  ASSERT_TRUE(t->EraseBatch(half).ok());
  EXPECT_EQ(t->stats().erases, 150u);
  EXPECT_EQ(cluster.DbSize(0) + cluster.DbSize(1) + cluster.DbSize(2), 150);
  got = t->GetBatch(Keys(recs));
  for (size_t i = 0; i < 300; ++i) EXPECT_EQ(got[i].has_value(), i >= 150) << i;
}

TEST(RedisClusterTier, ACorruptedValueIsAMissNeverWrongBytes) {
  TESSERA_REQUIRE_REDIS_SERVER();
  Cluster cluster;
  ASSERT_TRUE(cluster.Form());
  auto t = MustOpen(cluster.Options());
  ASSERT_NE(t, nullptr);
  std::vector<TierRecord> recs = Recs(0, 3);
  ASSERT_TRUE(t->PutBatch(recs).ok());
  // Behind the tier's back: flip payload byte 100 of record 0, replace record 1 with a short value.
  std::string k0 = kNs + ":{" + recs[0].key.Hex() + "}";
  std::string k1 = kNs + ":{" + recs[1].key.Hex() + "}";
  ASSERT_TRUE(Command(cluster.port(OwnerOfSlot(SlotOf(recs[0].key))), {"SETRANGE", k0, "164", "Z"}).ok());
  ASSERT_TRUE(Command(cluster.port(OwnerOfSlot(SlotOf(recs[1].key))), {"SET", k1, "short"}).ok());
  auto got = t->GetBatch(Keys(recs));
  EXPECT_FALSE(got[0].has_value());
  EXPECT_FALSE(got[1].has_value());
  ASSERT_TRUE(got[2].has_value());
  EXPECT_EQ(got[2]->payload, recs[2].payload);
  EXPECT_EQ(t->stats().verify_failures, 2u);
  EXPECT_EQ(t->stats().misses, 2u);
  EXPECT_EQ(t->stats().hits, 1u);
}

// Regression: values were checked with an unkeyed checksum, so a node's writer could plant a
// block (a version-1 value with its checksum recomputed) that the tier returned as verified, and
// a value copied from another namespace verified too. Now each value carries a RecordMac tag.
TEST(RedisClusterTier, ForgedOrCopiedValuesAreVerifyFailures) {
  TESSERA_REQUIRE_REDIS_SERVER();
  Cluster cluster;
  ASSERT_TRUE(cluster.Form());
  const std::string other_ns = "tessera:test:fmt:9";
  auto t = MustOpen(cluster.Options());
  auto other_tenant = MustOpen(cluster.Options(other_ns));
  RedisClusterOptions wrong = cluster.Options();
  wrong.secret = Secret(0x17);
  auto other_fleet = MustOpen(wrong);
  ASSERT_NE(t, nullptr);
  ASSERT_NE(other_tenant, nullptr);
  ASSERT_NE(other_fleet, nullptr);
  std::vector<TierRecord> recs = Recs(0, 4);
  ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{recs[3]}).ok());
  ASSERT_TRUE(other_tenant->PutBatch(std::vector<TierRecord>{recs[1]}).ok());
  ASSERT_TRUE(other_fleet->PutBatch(std::vector<TierRecord>{recs[2]}).ok());
  auto name = [](const std::string& ns, const TierRecord& r) { return ns + ":{" + r.key.Hex() + "}"; };
  auto port_of = [&](const TierRecord& r) { return cluster.port(OwnerOfSlot(SlotOf(r.key))); };
  // 0: a forged version-1 value with a valid checksum.
  std::vector<std::byte> evil(2000, std::byte{0x66});
  ASSERT_TRUE(
      Command(port_of(recs[0]), {"SET", name(kNs, recs[0]), testing::ForgeRedisValueV1(recs[0].key, 1, evil)}).ok());
  // 1: the other tenant's value for the same key (same slot: the hash tag is the key hex).
  Reply v1 = Command(port_of(recs[1]), {"GET", name(other_ns, recs[1])});
  ASSERT_EQ(v1.type, REDIS_REPLY_STRING);
  ASSERT_TRUE(Command(port_of(recs[1]), {"SET", name(kNs, recs[1]), v1.text}).ok());
  // 2: written by another fleet under this namespace. 3: untouched.
  auto got = t->GetBatch(Keys(recs));
  EXPECT_FALSE(got[0].has_value());
  EXPECT_FALSE(got[1].has_value());
  EXPECT_FALSE(got[2].has_value());
  ASSERT_TRUE(got[3].has_value());
  EXPECT_EQ(got[3]->payload, recs[3].payload);
  EXPECT_EQ(t->stats().verify_failures, 3u);
  EXPECT_EQ(t->stats().hits, 1u);
}

// Four records whose keys share one slot owned by node 0.
std::vector<TierRecord> SameSlotOnNode0(uint16_t* slot) {
  std::map<uint16_t, std::vector<uint64_t>> by_slot;
  for (uint64_t i = 0; i < 200000; ++i) {
    uint16_t s = SlotOf(Rec(i, 0).key);
    if (OwnerOfSlot(s) != 0) continue;
    std::vector<uint64_t>& v = by_slot[s];
    v.push_back(i);
    if (v.size() == 4) {
      *slot = s;
      std::vector<TierRecord> out;
      for (uint64_t j : v) out.push_back(Rec(j));
      return out;
    }
  }
  return {};
}

TEST(RedisClusterTier, FollowsAskDuringAMigrationAndMovedAfterIt) {
  TESSERA_REQUIRE_REDIS_SERVER();
  Cluster cluster;
  ASSERT_TRUE(cluster.Form());
  uint16_t slot = 0;
  std::vector<TierRecord> recs = SameSlotOnNode0(&slot);
  ASSERT_EQ(recs.size(), 4u);
  auto t = MustOpen(cluster.Options());
  auto stale = MustOpen(cluster.Options());  // loads its map now and is not used until the end
  ASSERT_NE(t, nullptr);
  ASSERT_NE(stale, nullptr);
  std::vector<TierRecord> first{recs[0], recs[1]};
  ASSERT_TRUE(t->PutBatch(first).ok());
  auto key = [&](const TierRecord& r) { return kNs + ":{" + r.key.Hex() + "}"; };
  auto migrate = [&](const TierRecord& r) {
    return Command(cluster.port(0), {"MIGRATE", "127.0.0.1", std::to_string(cluster.port(1)), key(r), "0", "5000"});
  };

  // Start moving the slot from node 0 to node 1 and move record 0 only.
  const std::string s = std::to_string(slot);
  ASSERT_TRUE(Command(cluster.port(1), {"CLUSTER", "SETSLOT", s, "IMPORTING", cluster.id(0)}).ok());
  ASSERT_TRUE(Command(cluster.port(0), {"CLUSTER", "SETSLOT", s, "MIGRATING", cluster.id(1)}).ok());
  Reply m = migrate(recs[0]);
  ASSERT_TRUE(m.ok()) << m.text;
  // Record 0 now answers ASK at node 0; record 1 is still served there.
  auto got = t->GetBatch(Keys(first));
  ASSERT_TRUE(got[0].has_value());
  ASSERT_TRUE(got[1].has_value());
  EXPECT_EQ(got[0]->payload, recs[0].payload);
  EXPECT_EQ(got[1]->payload, recs[1].payload);
  EXPECT_EQ(t->stats().asks, 1u);
  EXPECT_EQ(t->stats().moved, 0u);
  // A new key in a migrating slot is stored at the importing node (ASK then ASKING SET).
  ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{recs[2]}).ok());
  EXPECT_EQ(t->stats().asks, 2u);

  // Finish: move record 1 and hand the slot to node 1 everywhere.
  m = migrate(recs[1]);
  ASSERT_TRUE(m.ok()) << m.text;
  for (int i : {1, 0, 2}) {
    Reply r = Command(cluster.port(i), {"CLUSTER", "SETSLOT", s, "NODE", cluster.id(1)});
    ASSERT_TRUE(r.ok()) << i << ": " << r.text;
  }
  EXPECT_EQ(Command(cluster.port(1), {"EXISTS", key(recs[0]), key(recs[1]), key(recs[2])}).integer, 3);
  std::vector<TierRecord> three{recs[0], recs[1], recs[2]};
  // The map still says node 0: every key answers MOVED once, the map is reloaded.
  got = t->GetBatch(Keys(three));
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(got[i].has_value()) << i;
    EXPECT_EQ(got[i]->payload, three[i].payload);
  }
  RedisClusterStats st = t->stats();
  EXPECT_EQ(st.moved, 3u);
  EXPECT_EQ(st.redirections, 5u);
  EXPECT_EQ(st.slot_map_refreshes, 2u);
  EXPECT_EQ(st.errors, 0u);
  // The reloaded map routes straight to node 1.
  got = t->GetBatch(Keys(three));
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(got[i].has_value()) << i;
  EXPECT_EQ(t->stats().redirections, 5u);

  // A client with a stale map writes: MOVED, retried at node 1, stored there.
  ASSERT_TRUE(stale->PutBatch(std::vector<TierRecord>{recs[3]}).ok());
  EXPECT_EQ(stale->stats().moved, 1u);
  EXPECT_EQ(Command(cluster.port(1), {"EXISTS", key(recs[3])}).integer, 1);
  EXPECT_EQ(Command(cluster.port(0), {"EXISTS", key(recs[3])}).integer, 0);
  std::vector<Hash128> k3{recs[3].key};
  ASSERT_TRUE(t->GetBatch(k3)[0].has_value());
}

TEST(RedisClusterTier, AKilledNodeIsMissesForItsKeysAndRecovers) {
  TESSERA_REQUIRE_REDIS_SERVER();
  Cluster cluster;
  ASSERT_TRUE(cluster.Form());
  // The reconnection backoff reads a clock the test moves (no sleeping against the real one).
  auto skew = std::make_shared<std::atomic<int64_t>>(0);
  RedisClusterOptions o = cluster.Options();
  o.backoff_clock = [skew] { return std::chrono::steady_clock::now() + std::chrono::milliseconds(skew->load()); };
  auto t = MustOpen(o);
  ASSERT_NE(t, nullptr);
  // 400 records of 20 KB: each node's pipeline is megabytes, more than one write(2) can take.
  std::vector<TierRecord> recs;
  for (uint64_t i = 0; i < 400; ++i) recs.push_back(Rec(i, 20000));
  ASSERT_TRUE(t->PutBatch(recs).ok());
  std::vector<Hash128> keys = Keys(recs);
  ASSERT_EQ(t->GetBatch(keys).size(), 400u);
  EXPECT_EQ(t->stats().hits, 400u);

  cluster.node(2).Stop();  // SIGKILL
  // Puts first, while the tier still holds its connection to the dead node: the live nodes
  // store theirs, the call reports the dead node, and writing megabytes into the dead
  // connection must not raise SIGPIPE in this process.
  std::vector<TierRecord> more;
  for (uint64_t i = 1000; i < 1400; ++i) more.push_back(Rec(i, 20000));
  Status st = t->PutBatch(more);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.field(), "redis");
  EXPECT_NE(st.message().find(cluster.address(2)), std::string::npos) << st.message();
  size_t more_on_dead = 0;
  for (const TierRecord& r : more) more_on_dead += OwnerOfSlot(SlotOf(r.key)) == 2 ? 1 : 0;
  ASSERT_GT(more_on_dead, 0u);
  EXPECT_EQ(t->stats().put_failures, more_on_dead);
  EXPECT_EQ(t->stats().puts, 400u + 400u - more_on_dead);

  // Gets: the dead node's keys miss, every other key hits with its own bytes.
  auto got = t->GetBatch(keys);
  size_t on_dead = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    bool dead = OwnerOfSlot(SlotOf(recs[i].key)) == 2;
    on_dead += dead ? 1 : 0;
    EXPECT_EQ(got[i].has_value(), !dead) << i;
    if (got[i].has_value()) {
      EXPECT_EQ(got[i]->payload, recs[i].payload) << i;
    }
  }
  ASSERT_GT(on_dead, 0u);
  RedisClusterStats s = t->stats();
  EXPECT_EQ(s.hits, 400u + 400u - on_dead);
  const RedisClusterNodeStats* dead = NodeStats(s, cluster.address(2));
  ASSERT_NE(dead, nullptr);
  EXPECT_FALSE(dead->connected);
  EXPECT_GE(dead->errors, 1u);
  EXPECT_EQ(NodeStats(s, cluster.address(0))->errors, 0u);
  EXPECT_EQ(NodeStats(s, cluster.address(1))->errors, 0u);
  got = t->GetBatch(Keys(more));
  for (size_t i = 0; i < more.size(); ++i) {
    EXPECT_EQ(got[i].has_value(), OwnerOfSlot(SlotOf(more[i].key)) != 2) << i;
    if (got[i].has_value()) {
      EXPECT_EQ(got[i]->payload, more[i].payload) << i;
    }
  }
  EXPECT_EQ(t->stats().recoveries, 0u);

  // Restart it (same port, same nodes.conf, no data): a reconnection is a recovery; its keys
  // are gone, so they miss — never wrong data.
  ASSERT_TRUE(cluster.node(2).Start());
  *skew += 30;  // past reconnect_interval_ms
  got = t->GetBatch(keys);
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(got[i].has_value(), OwnerOfSlot(SlotOf(recs[i].key)) != 2) << i;
  }
  EXPECT_EQ(t->stats().recoveries, 1u);
  EXPECT_EQ(NodeStats(t->stats(), cluster.address(2))->recoveries, 1u);
  ASSERT_TRUE(cluster.WaitOk(2));
  ASSERT_TRUE(t->PutBatch(recs).ok());
  got = t->GetBatch(keys);
  for (size_t i = 0; i < recs.size(); ++i) {
    ASSERT_TRUE(got[i].has_value()) << i;
    EXPECT_EQ(got[i]->payload, recs[i].payload);
  }
}

// A fleet: one host writes through to the cluster, another host (a cold manager with the same
// prefix key) admits the same prompt and gets every block from the cluster, verified; the
// blocks were spread over the three nodes.
TEST(RedisClusterTier, TieredStoreSharesBlocksAcrossHostsThroughTheCluster) {
  TESSERA_REQUIRE_REDIS_SERVER();
  Cluster cluster;
  ASSERT_TRUE(cluster.Form());
  std::vector<std::byte> key(32, std::byte{0x5c});  // the fleet's shared prefix.key
  ManagerOptions mo;
  mo.capacity_blocks = 64;
  mo.hash_key = key;
  std::vector<uint32_t> prompt(40 * 64 + 5);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<uint32_t>(i * 7 + 3);
  auto writer = [](uint32_t g, uint32_t l, uint64_t pos, const RecordView& r) {
    for (uint32_t p = 0; p < r.plane_count; ++p) {
      for (size_t i = 0; i < r.planes[p].size(); ++i) {
        r.planes[p][i] = std::byte{static_cast<uint8_t>((pos * 31 + l * 7 + g + p + i) & 0xff)};
      }
    }
  };
  auto host = [&](WritePolicy write) {
    auto m = std::move(*RequestManager::Create(testing::SeedFixture(), mo));
    std::vector<std::unique_ptr<Tier>> tiers;
    auto t = MakeRedisClusterTier(cluster.Options());
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (t.ok()) tiers.push_back(std::move(*t));
    TieredStoreOptions so;
    so.write = write;
    auto store = std::move(*TieredStore::Create(m->pool(), so, std::move(tiers)));
    m->SetBlockSource(store.get());
    return std::make_pair(std::move(m), std::move(store));
  };
  {
    auto [m, store] = host(WritePolicy::kWriteThrough);
    Admission a = *m->Admit(prompt, {});
    ASSERT_TRUE(m->AllocateSlots(a.id, prompt.size()).ok());
    ASSERT_TRUE(m->Append(a.id, prompt, writer).ok());
    ASSERT_TRUE(store->Flush().ok());
    EXPECT_EQ(store->stats().written_through, 40u);
    m->SetBlockSource(nullptr);
  }
  for (int i = 0; i < 3; ++i) EXPECT_GT(cluster.DbSize(i), 0) << "node " << i;
  auto [m, store] = host(WritePolicy::kWriteBack);
  Admission b = *m->Admit(prompt, {});
  EXPECT_EQ(b.cached_blocks, 40u);
  EXPECT_EQ(store->stats().tier_hits, 40u);
  EXPECT_EQ(store->stats().verify_failures, 0u);
  for (uint64_t pos = 0; pos < b.cached_tokens; ++pos) {
    Result<ConstRecordView> v = m->Record(b.id, 0, 1, pos);
    ASSERT_TRUE(v.ok());
    for (uint32_t p = 0; p < v->plane_count; ++p) {
      for (size_t i = 0; i < v->planes[p].size(); i += 97) {
        ASSERT_EQ(v->planes[p][i], std::byte{static_cast<uint8_t>((pos * 31 + 7 + p + i) & 0xff)}) << pos;
      }
    }
  }
  m->SetBlockSource(nullptr);
}

// ---- One copy of replicated MLA KV in a tensor-parallel group (ADR 0023) ---------------------
//
// N ranks (N = 2, 4, 8) hold the same latents: each rank is its own RequestManager and
// TieredStore (pools of different sizes), on its own thread, writing through to one 3-node
// cluster. Today every rank writes every block; with the single-writer rule one rank writes each
// block. Bytes written to the cluster are measured twice, exactly: by the ranks' tiers (payload
// bytes of the SETs they made, summed) and by the servers (SET calls from INFO commandstats times
// the length of the stored values, STRLEN of every key). Then every rank, cold, promotes every
// block from the cluster and checks every byte.

// The cluster tier of one rank, counting what it writes. `before_put` (when set) runs before each
// PutBatch: the baseline's barrier, which makes every rank's existence check of a batch precede
// any rank's write of it, as when ranks run in step (so today's code writes N copies, always).
class RankTier final : public testing::ForwardingTier {
 public:
  RankTier(std::unique_ptr<Tier> under, std::function<void()> before_put)
      : ForwardingTier(std::move(under)), before_put_(std::move(before_put)) {}
  Status PutBatch(std::span<const TierRecord* const> records) override {
    if (before_put_) before_put_();
    for (const TierRecord* r : records) payloads[r->key] = r->payload;
    return ForwardingTier::PutBatch(records);
  }
  // Every record this rank handed the cluster (written under the store's tier mutex; read after
  // the store is flushed).
  std::map<std::pair<uint64_t, uint64_t>, std::vector<std::byte>> payloads_by_key() const {
    std::map<std::pair<uint64_t, uint64_t>, std::vector<std::byte>> m;
    for (const auto& [k, p] : payloads) m[{k.lo, k.hi}] = p;
    return m;
  }
  std::unordered_map<Hash128, std::vector<std::byte>, Hash128Hasher> payloads;

 private:
  std::function<void()> before_put_;
};

// The bytes of a command as a client sends it: a RESP array of bulk strings.
long long RespBytes(const std::vector<std::string>& args) {
  long long n = static_cast<long long>(std::to_string(args.size()).size()) + 3;
  for (const std::string& a : args) {
    n += static_cast<long long>(std::to_string(a.size()).size() + 3 + a.size() + 2);
  }
  return n;
}

// "name:value" from INFO text; -1 when absent.
long long InfoValue(const std::string& info, const std::string& name) {
  const size_t at = info.find("\n" + name + ":");
  if (at == std::string::npos) return -1;
  return std::atoll(info.c_str() + at + name.size() + 2);
}

// Calls per command a node executed since its last CONFIG RESETSTAT ("set", "cluster|slots", ...).
std::map<std::string, long long> CommandCalls(int port) {
  const std::string info = Command(port, {"INFO", "commandstats"}).text;
  std::map<std::string, long long> calls;
  for (size_t at = info.find("cmdstat_"); at != std::string::npos; at = info.find("cmdstat_", at + 1)) {
    const size_t colon = info.find(":calls=", at);
    if (colon == std::string::npos) break;
    calls[info.substr(at + 8, colon - at - 8)] = std::atoll(info.c_str() + colon + 7);
  }
  return calls;
}

struct RankResult {
  Admission admission;
  TieredStoreStats stats;
  TierCounters cluster;
  std::map<std::pair<uint64_t, uint64_t>, std::vector<std::byte>> payloads;
  bool bytes_match = false;
};

class SingleWriterCluster : public ::testing::TestWithParam<uint32_t> {
 protected:
  static constexpr uint32_t kBlocks = 16;
  static constexpr uint32_t kBlockTokens = 64;

  // Runs `world` ranks at once, each serving the stream (write-through when `write`, else
  // write-back: a cold rank that only reads). `single_writer`: tp_world = world (else 1, today's
  // behaviour); `in_step`: the baseline's barrier before every PutBatch.
  std::vector<RankResult> Run(Cluster& cluster, uint32_t world, bool single_writer, bool in_step, bool write) {
    std::vector<RankResult> out(world);
    std::barrier step(static_cast<std::ptrdiff_t>(world));
    // Every rank admits before any rank appends: a rank that admitted after another had written
    // would hit those blocks in the cluster instead of computing them (and count them otherwise).
    std::barrier admitted(static_cast<std::ptrdiff_t>(world));
    std::vector<std::thread> threads;
    for (uint32_t rank = 0; rank < world; ++rank) {
      threads.emplace_back([&, rank] {
        // A rank that leaves (done, or stopped by a failed ASSERT) stops counting for the
        // barrier, so the others never wait for it. Done, it has passed every phase already.
        struct LeaveBarrier {
          std::barrier<>* b;
          ~LeaveBarrier() {
            if (b != nullptr) b->arrive_and_drop();
          }
        } leave{in_step ? &step : nullptr};
        struct LeaveAdmitted {  // a rank stopped before the admission barrier stops counting for it
          std::barrier<>* b;
          bool arrived = false;
          ~LeaveAdmitted() {
            if (!arrived) b->arrive_and_drop();
          }
        } leave_admitted{&admitted};
        ManagerOptions mo;
        mo.capacity_blocks = 32 + 4 * rank;                         // ranks' pools differ; their records must not
        mo.hash_key = std::vector<std::byte>(32, std::byte{0x5c});  // the fleet's prefix key
        mo.content_dedup = false;
        auto m = RequestManager::Create(testing::SeedFixture(), mo);
        ASSERT_TRUE(m.ok()) << m.status().ToString();
        auto t = MakeRedisClusterTier(cluster.Options());
        ASSERT_TRUE(t.ok()) << t.status().ToString();
        std::function<void()> before_put;
        if (in_step) before_put = [&step] { step.arrive_and_wait(); };
        auto tier = std::make_unique<RankTier>(std::move(*t), before_put);
        RankTier* seen = tier.get();
        std::vector<std::unique_ptr<Tier>> tiers;
        tiers.push_back(std::move(tier));
        TieredStoreOptions so;
        so.write = write ? WritePolicy::kWriteThrough : WritePolicy::kWriteBack;
        so.tp_rank = single_writer ? rank : 0;
        so.tp_world = single_writer ? world : 1;
        auto store = TieredStore::Create((*m)->pool(), so, std::move(tiers));
        ASSERT_TRUE(store.ok()) << store.status().ToString();
        RequestManager& rm = **m;
        rm.SetBlockSource(store->get());
        Result<Admission> a = rm.Admit(stream_.tokens(), {});
        ASSERT_TRUE(a.ok()) << a.status().ToString();
        admitted.arrive_and_wait();
        leave_admitted.arrived = true;
        const size_t rest = stream_.tokens().size() - a->cached_tokens;
        ASSERT_TRUE(rm.AllocateSlots(a->id, rest).ok());
        ASSERT_TRUE(rm.Append(a->id, std::span(stream_.tokens()).subspan(a->cached_tokens), stream_.Writer()).ok());
        RankResult& r = out[rank];
        r.admission = *a;
        if (!write) r.bytes_match = Matches(rm, a->id);  // the cold ranks: what they promoted
        ASSERT_TRUE((*store)->Flush().ok());
        r.stats = (*store)->stats();
        r.cluster = (*store)->tier_counters(0);
        r.payloads = seen->payloads_by_key();
        rm.SetBlockSource(nullptr);
      });
    }
    for (std::thread& t : threads) t.join();
    return out;
  }

  // Every byte of every layer of every position of request `r` equals the stream's KV.
  bool Matches(const RequestManager& m, RequestId r) const {
    std::vector<std::byte> want;
    for (uint64_t pos = 0; pos < m.Tokens(r); ++pos) {
      for (uint32_t g = 0; g < m.pool().groups().size(); ++g) {
        for (uint32_t l = 0; l < m.pool().groups()[g].layers; ++l) {
          Result<ConstRecordView> v = m.Record(r, g, l, pos);
          if (!v.ok()) return false;
          for (uint32_t p = 0; p < v->plane_count; ++p) {
            want.resize(v->planes[p].size());
            stream_.Expected(g, l, pos, p, want);
            if (std::memcmp(v->planes[p].data(), want.data(), want.size()) != 0) return false;
          }
        }
      }
    }
    return true;
  }

  // Empties every node and zeroes its statistics.
  static void Reset(Cluster& cluster) {
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(Command(cluster.port(i), {"FLUSHALL"}).ok());
      ASSERT_TRUE(Command(cluster.port(i), {"CONFIG", "RESETSTAT"}).ok());
    }
  }
  // What the three nodes were sent since Reset: the calls per command and every byte the clients
  // sent (total_net_input_bytes, less the INFO requests asking for them).
  struct ServerTraffic {
    std::map<std::string, long long> calls;
    long long input_bytes = 0;
    long long Calls(const std::string& command) const {
      auto it = calls.find(command);
      return it == calls.end() ? 0 : it->second;
    }
  };
  static ServerTraffic Measure(Cluster& cluster) {
    ServerTraffic w;
    for (int i = 0; i < 3; ++i) {
      for (const auto& [command, n] : CommandCalls(cluster.port(i))) w.calls[command] += n;
      // INFO counts the bytes of its own request, and of the commandstats request before it.
      w.input_bytes += InfoValue(Command(cluster.port(i), {"INFO", "stats"}).text, "total_net_input_bytes") -
                       RespBytes({"INFO", "commandstats"}) - RespBytes({"INFO", "stats"});
    }
    return w;
  }
  // The bytes of the SET commands the nodes were sent: every input byte less those of the reads
  // (GET: the ranks' probes and existence checks) and of the tiers' slot-map requests, which are
  // the only other commands the ranks send (checked).
  static long long SetBytes(const ServerTraffic& w, const std::string& key) {
    for (const auto& [command, n] : w.calls) {
      // CONFIG RESETSTAT counts itself once per node; its bytes were read before the reset.
      if (command == "config|resetstat") {
        EXPECT_EQ(n, 3);
        continue;
      }
      EXPECT_TRUE(command == "set" || command == "get" || command == "cluster|slots") << command << " " << n;
    }
    return w.input_bytes - w.Calls("get") * RespBytes({"GET", key}) -
           w.Calls("cluster|slots") * RespBytes({"CLUSTER", "SLOTS"});
  }

  testing::KvStream stream_{1, kBlocks* kBlockTokens + 5};
};

TEST_P(SingleWriterCluster, OneCopyPerBlockAndEveryRankVerifiesEveryByte) {
  TESSERA_REQUIRE_REDIS_SERVER();
  const uint32_t world = GetParam();
  Cluster cluster;
  ASSERT_TRUE(cluster.Form());

  // Today: every rank writes every block (the barrier keeps them in step).
  Reset(cluster);
  std::vector<RankResult> today = Run(cluster, world, /*single_writer=*/false, /*in_step=*/true, /*write=*/true);
  const ServerTraffic today_server = Measure(cluster);
  uint64_t today_bytes = 0, today_records = 0;
  for (uint32_t r = 0; r < world; ++r) {
    EXPECT_EQ(today[r].stats.written_through, kBlocks) << r;
    today_bytes += today[r].cluster.bytes;
    today_records += today[r].cluster.records;
    // The ranks' records are byte-identical: nothing in a record (or its key) is rank-specific.
    EXPECT_TRUE(today[r].payloads == today[0].payloads) << "rank " << r << "'s records differ from rank 0's";
  }
  ASSERT_EQ(today[0].payloads.size(), kBlocks);
  const uint64_t record_bytes = today[0].payloads.begin()->second.size();
  EXPECT_EQ(today_records, uint64_t{world} * kBlocks);
  EXPECT_EQ(today_bytes, uint64_t{world} * kBlocks * record_bytes);

  // The rule: each block written once, by its writer rank.
  Reset(cluster);
  std::vector<RankResult> one = Run(cluster, world, /*single_writer=*/true, /*in_step=*/false, /*write=*/true);
  const ServerTraffic one_server = Measure(cluster);
  uint64_t one_bytes = 0, one_records = 0;
  for (uint32_t r = 0; r < world; ++r) {
    uint64_t mine = 0;
    for (const auto& [k, p] : today[0].payloads) mine += SingleWriterRank(Hash128{k.first, k.second}, world) == r;
    EXPECT_EQ(one[r].stats.written_through, mine) << r;
    EXPECT_EQ(one[r].stats.left_to_writer, kBlocks - mine) << r;
    EXPECT_EQ(one[r].cluster.records, mine) << r;
    for (const auto& [k, p] : one[r].payloads) {
      EXPECT_EQ(SingleWriterRank(Hash128{k.first, k.second}, world), r);
      EXPECT_TRUE(p == today[0].payloads.at(k));  // the same record as every rank's
    }
    one_bytes += one[r].cluster.bytes;
    one_records += one[r].cluster.records;
  }
  EXPECT_EQ(one_records, kBlocks);
  // Measured on both sides: exactly 1/N of today's bytes.
  EXPECT_EQ(one_bytes * world, today_bytes);
  EXPECT_EQ(today_server.Calls("set"), static_cast<long long>(world * kBlocks));
  EXPECT_EQ(one_server.Calls("set"), static_cast<long long>(kBlocks));
  long long stored = 0;
  for (int i = 0; i < 3; ++i) stored += cluster.DbSize(i);
  EXPECT_EQ(stored, static_cast<long long>(kBlocks));
  auto tier = MustOpen(cluster.Options());
  ASSERT_NE(tier, nullptr);
  std::string name;  // every key's name has the same length
  for (const auto& [k, p] : today[0].payloads) {
    name = tier->KeyOf(Hash128{k.first, k.second});
    const int node = OwnerOfSlot(RedisClusterKeySlot(name));
    EXPECT_EQ(Command(cluster.port(node), {"STRLEN", name}).integer, static_cast<long long>(64 + record_bytes));
  }
  const long long set_command = RespBytes({"SET", name, std::string(64 + record_bytes, 'v')});
  const long long today_set_bytes = SetBytes(today_server, name);
  const long long one_set_bytes = SetBytes(one_server, name);
  // Every SET byte the servers received is accounted for: SET calls x one SET's bytes.
  EXPECT_EQ(today_set_bytes, today_server.Calls("set") * set_command);
  EXPECT_EQ(one_set_bytes, one_server.Calls("set") * set_command);
  EXPECT_EQ(one_set_bytes * world, today_set_bytes);
  std::printf(
      "[ single-writer ] N=%u: bytes written to the cluster, today: %llu of records by the ranks' tiers,"
      " %lld in %lld SETs received by the servers; single writer: %llu, %lld in %lld SETs (all bytes"
      " sent, reads included: %lld today, %lld single writer)\n",
      world, static_cast<unsigned long long>(today_bytes), today_set_bytes, today_server.Calls("set"),
      static_cast<unsigned long long>(one_bytes), one_set_bytes, one_server.Calls("set"), today_server.input_bytes,
      one_server.input_bytes);

  // Every rank, cold, promotes every block from the cluster and verifies every byte; none writes.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Command(cluster.port(i), {"CONFIG", "RESETSTAT"}).ok());
  std::vector<RankResult> cold = Run(cluster, world, /*single_writer=*/true, /*in_step=*/false, /*write=*/false);
  for (uint32_t r = 0; r < world; ++r) {
    EXPECT_EQ(cold[r].admission.cached_blocks, kBlocks) << r;
    EXPECT_EQ(cold[r].stats.tier_hits, kBlocks) << r;
    EXPECT_EQ(cold[r].stats.verify_failures, 0u) << r;
    EXPECT_TRUE(cold[r].bytes_match) << r;
    EXPECT_EQ(cold[r].cluster.records, 0u) << r;
  }
  const ServerTraffic cold_server = Measure(cluster);
  EXPECT_EQ(cold_server.Calls("set"), 0);
  EXPECT_GT(cold_server.Calls("get"), 0);
}

INSTANTIATE_TEST_SUITE_P(Ranks, SingleWriterCluster, ::testing::Values(2u, 4u, 8u),
                         [](const ::testing::TestParamInfo<uint32_t>& i) { return "N" + std::to_string(i.param); });

// ---- A hostile cluster node -----------------------------------------------------------------
//
// A fake node (a thread on 127.0.0.1) plays the cluster. The batch budget is 200 ms; each call
// must return within twice that with bounded memory, its keys misses (gets) or failures (puts).

constexpr uint32_t kDeadlineMs = 200;
using Clock = std::chrono::steady_clock;
using testing::FakeRedis;

// `s` with CR and LF written as \r and \n.
std::string Shown(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '\r' ? std::string("\\r") : c == '\n' ? std::string("\\n") : std::string(1, c);
  return out;
}

int64_t MillisSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

RedisClusterOptions HostileOptions(const FakeRedis& seed) {
  RedisClusterOptions o;
  o.seeds = {seed.address()};
  o.key_namespace = kNs;
  o.secret = Secret();
  o.timeout_ms = kDeadlineMs;
  o.connect_timeout_ms = kDeadlineMs;
  o.reconnect_interval_ms = 0;
  return o;
}

// A node that gives itself every slot and answers data commands with `answer(command)` ("" for
// no answer, then it waits for the client to go).
FakeRedis::Script OwnAllSlots(const std::atomic<int>* port,
                              std::function<std::string(const std::vector<std::string>&)> answer) {
  return [port, answer](FakeRedis::Conn& c) {
    std::vector<std::string> cmd;
    while (c.ReadCommand(&cmd)) {
      if (cmd[0] == "CLUSTER") {
        c.Send(FakeRedis::SlotMapTo(port->load()));
        continue;
      }
      std::string reply = answer(cmd);
      if (reply.empty()) {
        c.WaitClosed();
        return;
      }
      if (!c.Send(reply)) return;
    }
  };
}

// Regression: Open asked CLUSTER SLOTS with hiredis's per-read timeout, so a seed that drip-fed
// its answer (one byte per 10 ms, here about 1 s) held Open for as long as it liked.
TEST(RedisClusterHostile, OpenAgainstADripFeedingSeedReturnsWithinTheDeadline) {
  std::atomic<int> port{0};
  FakeRedis fake([&](FakeRedis::Conn& c) {
    if (!c.ReadCommands(1)) return;
    c.Drip(FakeRedis::SlotMapTo(port.load()), std::chrono::milliseconds(10));
    c.WaitClosed();
  });
  port = fake.port();
  auto t0 = Clock::now();
  auto t = MustOpen(HostileOptions(fake));
  int64_t took = MillisSince(t0);
  ASSERT_NE(t, nullptr);
  RedisClusterStats s = t->stats();
  EXPECT_EQ(s.slot_map_failures, 1u);
  EXPECT_EQ(s.slots_covered, 0u);
  EXPECT_EQ(s.timeouts, 1u);
  std::printf("[ timing ] drip-fed CLUSTER SLOTS: Open returned after %lld ms (deadline %u ms)\n",
              static_cast<long long>(took), kDeadlineMs);
}

// Regression: a 14-byte CLUSTER SLOTS reply announcing 2^31-1 ranges made hiredis allocate
// 16 GiB of pointers. Now it is refused on its header line.
TEST(RedisClusterHostile, OpenAgainstAHugeSlotMapHeaderFailsFast) {
  for (const char* bad : {"*2147483647\r\n", "*300000\r\n", "*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n"}) {
    const std::string reply = bad;
    FakeRedis fake([&](FakeRedis::Conn& c) {
      if (!c.ReadCommands(1)) return;
      c.Send(reply);
      c.WaitClosed();
    });
    uint64_t rss0 = testing::PeakRssBytes();
    auto t0 = Clock::now();
    auto t = MustOpen(HostileOptions(fake));
    int64_t took = MillisSince(t0);
    ASSERT_NE(t, nullptr);
    EXPECT_LT(testing::PeakRssBytes() - rss0, 64u << 20) << bad;
    EXPECT_EQ(t->stats().bad_replies, 1u) << bad;
    EXPECT_EQ(t->stats().slots_covered, 0u) << bad;
    std::printf("[ timing ] CLUSTER SLOTS reply %s: Open returned after %lld ms\n", Shown(bad).c_str(),
                static_cast<long long>(took));
  }
}

// Regression: GET replies drip-fed by a node held GetBatch past any timeout.
TEST(RedisClusterHostile, GetBatchAgainstADripFeedingNodeReturnsWithinTheDeadline) {
  std::atomic<int> port{0};
  FakeRedis fake([&](FakeRedis::Conn& c) {
    std::vector<std::string> cmd;
    while (c.ReadCommand(&cmd)) {
      if (cmd[0] == "CLUSTER") {
        c.Send(FakeRedis::SlotMapTo(port.load()));
        continue;
      }
      c.Drip("$100\r\n" + std::string(100, 'x') + "\r\n", std::chrono::milliseconds(10));
      c.WaitClosed();
      return;
    }
  });
  port = fake.port();
  auto t = MustOpen(HostileOptions(fake));
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->stats().slots_covered, 16384u);
  std::vector<TierRecord> recs = Recs(0, 3);
  auto t0 = Clock::now();
  auto got = t->GetBatch(Keys(recs));
  int64_t took = MillisSince(t0);
  for (const auto& g : got) EXPECT_FALSE(g.has_value());
  RedisClusterStats s = t->stats();
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.timeouts, 1u);
  EXPECT_FALSE(s.nodes[0].connected);
  std::printf("[ timing ] drip-fed GET reply from a cluster node: returned after %lld ms (deadline %u ms)\n",
              static_cast<long long>(took), kDeadlineMs);
}

// Regression: a bulk header far over any value, then a flood: buffered without bound.
TEST(RedisClusterHostile, GetBatchAgainstAHugeBulkHeaderFailsFast) {
  std::atomic<int> port{0};
  FakeRedis fake([&](FakeRedis::Conn& c) {
    std::vector<std::string> cmd;
    while (c.ReadCommand(&cmd)) {
      if (cmd[0] == "CLUSTER") {
        c.Send(FakeRedis::SlotMapTo(port.load()));
        continue;
      }
      c.Send("$99999999999\r\n");
      c.Flood('x', 512u << 20);
      return;
    }
  });
  port = fake.port();
  RedisClusterOptions o = HostileOptions(fake);
  o.max_value_bytes = 1 << 20;
  auto t = MustOpen(o);
  ASSERT_NE(t, nullptr);
  std::vector<TierRecord> recs = Recs(0, 1);
  uint64_t rss0 = testing::PeakRssBytes();
  auto t0 = Clock::now();
  auto got = t->GetBatch(Keys(recs));
  int64_t took = MillisSince(t0);
  EXPECT_FALSE(got[0].has_value());
  EXPECT_LT(testing::PeakRssBytes() - rss0, 64u << 20);
  EXPECT_EQ(t->stats().bad_replies, 1u);
  std::printf("[ timing ] $99999999999 reply from a cluster node: returned after %lld ms\n",
              static_cast<long long>(took));
}

// Regression: a MOVED to a node that drip-feeds: the redirected retry is inside the same budget.
TEST(RedisClusterHostile, MovedToADripFeedingNodeStaysWithinTheDeadline) {
  std::atomic<int> slow_port{0}, port{0};
  FakeRedis slow([&](FakeRedis::Conn& c) {
    std::vector<std::string> cmd;
    while (c.ReadCommand(&cmd)) {
      if (cmd[0] == "CLUSTER") {
        c.Send(FakeRedis::SlotMapTo(port.load()));
        continue;
      }
      c.Drip("$100\r\n" + std::string(100, 'x') + "\r\n", std::chrono::milliseconds(10));
      c.WaitClosed();
      return;
    }
  });
  slow_port = slow.port();
  FakeRedis fake(OwnAllSlots(&port, [&](const std::vector<std::string>& cmd) {
    return "-MOVED " + std::to_string(RedisClusterKeySlot(cmd[1])) + " 127.0.0.1:" + std::to_string(slow_port.load()) +
           "\r\n";
  }));
  port = fake.port();
  auto t = MustOpen(HostileOptions(fake));
  ASSERT_NE(t, nullptr);
  std::vector<TierRecord> recs = Recs(0, 1);
  auto t0 = Clock::now();
  auto got = t->GetBatch(Keys(recs));
  int64_t took = MillisSince(t0);
  EXPECT_FALSE(got[0].has_value());
  RedisClusterStats s = t->stats();
  EXPECT_EQ(s.moved, 1u);
  EXPECT_EQ(s.timeouts, 1u);
  std::printf("[ timing ] MOVED to a drip-feeding node: returned after %lld ms (deadline %u ms)\n",
              static_cast<long long>(took), kDeadlineMs);
}

// A refused SET (-OOM) is a failed put naming the node and the server's message; wrong-typed
// replies to SET and GET are failures and misses, counted.
TEST(RedisClusterHostile, RefusedAndWrongTypedRepliesAreFailures) {
  std::atomic<int> port{0};
  std::atomic<int> sets{0};
  FakeRedis fake(OwnAllSlots(&port, [&](const std::vector<std::string>& cmd) -> std::string {
    if (cmd[0] == "SET") return sets++ == 0 ? "-OOM command not allowed when used memory > 'maxmemory'.\r\n" : ":1\r\n";
    if (cmd[0] == "GET") return "*0\r\n";
    return ":1\r\n";
  }));
  port = fake.port();
  auto t = MustOpen(HostileOptions(fake));
  ASSERT_NE(t, nullptr);
  std::vector<TierRecord> recs = Recs(0, 2);
  Status st = t->PutBatch(recs);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.field(), "redis");
  EXPECT_NE(st.message().find("OOM"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(fake.address()), std::string::npos) << st.message();
  EXPECT_EQ(t->stats().put_failures, 2u);
  auto got = t->GetBatch(Keys(recs));
  EXPECT_FALSE(got[0].has_value());
  EXPECT_FALSE(got[1].has_value());
  EXPECT_EQ(t->stats().bad_replies, 3u);  // one SET, two GETs
  EXPECT_TRUE(t->stats().nodes[0].connected);
}

// Endpoints the cluster announces must be IP literals: resolving a name is not bounded by any
// deadline. A map naming a host leaves those slots unowned (misses), resolving nothing.
TEST(RedisClusterHostile, AnnouncedHostNamesAreNotResolved) {
  FakeRedis fake([](FakeRedis::Conn& c) {
    std::vector<std::string> cmd;
    while (c.ReadCommand(&cmd)) {
      c.Send("*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n" + FakeRedis::Bulk("redis.example.invalid") + ":6379\r\n" +
             FakeRedis::Bulk(std::string(40, 'f')));
    }
  });
  auto t = MustOpen(HostileOptions(fake));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->stats().slot_map_refreshes, 1u);
  EXPECT_EQ(t->stats().slots_covered, 0u);
  ASSERT_EQ(t->stats().nodes.size(), 1u);  // the seed only
  EXPECT_FALSE(t->GetBatch(Keys(Recs(0, 1)))[0].has_value());
  EXPECT_EQ(t->stats().nodes.size(), 1u);  // the named host was never resolved nor dialled
}

}  // namespace
}  // namespace tessera

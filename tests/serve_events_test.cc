// KV events (serve_events.cc, serve_publisher.h): vLLM's wire shape, the interval, the publisher's order.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "serve_test_support.h"
#include "tessera_tools/serve.h"

namespace tessera {
namespace {

using namespace serve_test;  // NOLINT(google-build-using-namespace): the serve tests' helpers

// The shape of vLLM's KVEventBatch as msgspec encodes it (vllm/distributed/kv_events.py at
// local-inference-lab/vllm 28be48fa: EventBatch and KVCacheEvent are array_like, omit_defaults,
// events tag=True so each is ["<ClassName>", fields...]; trailing defaults are omitted).
TEST(ServeEvents, BatchIsVllmsArrayLikeTaggedShape) {
  KvEvent stored;
  stored.kind = KvEventKind::kBlockStored;
  stored.block_hashes = {Hash128{1, 2}, Hash128{3, 4}};
  stored.parent_block_hash = Hash128{5, 6};
  stored.token_ids = {1, 2, 300, 70000};
  stored.block_size = 2;
  stored.medium = KvMedium::kCpu;
  KvEvent first = stored;
  first.parent_block_hash.reset();
  first.domain = 7;
  KvEvent removed;
  removed.kind = KvEventKind::kBlockRemoved;
  removed.block_hashes = {Hash128{9, 10}};
  removed.medium = KvMedium::kGpu;
  KvEvent cleared;
  cleared.kind = KvEventKind::kAllBlocksCleared;
  const std::vector<KvEvent> events = {stored, first, removed, cleared};
  const std::string wire = EncodeKvEventBatch(events, 1234.5, 3);

  msgpack::object_handle h = msgpack::unpack(wire.data(), wire.size());
  const msgpack::object& batch = h.get();
  ASSERT_EQ(batch.type, msgpack::type::ARRAY);
  ASSERT_EQ(batch.via.array.size, 3u);
  EXPECT_EQ(batch.via.array.ptr[0].as<double>(), 1234.5);
  EXPECT_EQ(batch.via.array.ptr[2].as<uint32_t>(), 3u);
  const msgpack::object_array& ev = batch.via.array.ptr[1].via.array;
  ASSERT_EQ(ev.size, 4u);

  const msgpack::object_array& s = ev.ptr[0].via.array;
  ASSERT_EQ(s.size, 8u);  // tag + 7 fields; extra_keys and later defaults omitted
  EXPECT_EQ(Str(s.ptr[0]), "BlockStored");
  ASSERT_EQ(s.ptr[1].via.array.size, 2u);
  EXPECT_EQ(Bin(s.ptr[1].via.array.ptr[0]), HashBytes(Hash128{1, 2}));
  EXPECT_EQ(Bin(s.ptr[1].via.array.ptr[1]), HashBytes(Hash128{3, 4}));
  EXPECT_EQ(Bin(s.ptr[2]), HashBytes(Hash128{5, 6}));
  EXPECT_EQ(s.ptr[3].as<std::vector<uint32_t>>(), stored.token_ids);
  EXPECT_EQ(s.ptr[4].as<uint32_t>(), 2u);
  EXPECT_TRUE(s.ptr[5].is_nil());  // lora_id
  EXPECT_EQ(Str(s.ptr[6]), "CPU");
  EXPECT_TRUE(s.ptr[7].is_nil());  // lora_name

  const msgpack::object_array& f = ev.ptr[1].via.array;
  ASSERT_EQ(f.size, 9u);  // extra_keys: the tenant domain, one entry per block
  EXPECT_TRUE(f.ptr[2].is_nil());
  ASSERT_EQ(f.ptr[8].via.array.size, 2u);
  EXPECT_EQ(Str(f.ptr[8].via.array.ptr[0].via.array.ptr[0]), "tenant_domain");
  EXPECT_EQ(f.ptr[8].via.array.ptr[0].via.array.ptr[1].as<uint32_t>(), 7u);

  const msgpack::object_array& r = ev.ptr[2].via.array;
  ASSERT_EQ(r.size, 3u);
  EXPECT_EQ(Str(r.ptr[0]), "BlockRemoved");
  EXPECT_EQ(Bin(r.ptr[1].via.array.ptr[0]), HashBytes(Hash128{9, 10}));
  EXPECT_EQ(Str(r.ptr[2]), "GPU");

  const msgpack::object_array& c = ev.ptr[3].via.array;
  ASSERT_EQ(c.size, 1u);
  EXPECT_EQ(Str(c.ptr[0]), "AllBlocksCleared");
}

TEST(ServeEvents, IntervalIsAKeyWithAnOverrideAndABound) {
  Result<ServeConfig> c = ParseServeConfig("events:\n  interval_ms: 20\n", {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->events_interval_ms, 20u);
  c = ParseServeConfig("events:\n  interval_ms: 20\n", {{"TESSERA_SERVE_EVENTS_INTERVAL_MS", "1"}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->events_interval_ms, 1u);
  EXPECT_EQ(ServeConfig().events_interval_ms, 5u);
  for (const char* bad :
       {"events:\n  interval_ms: 0\n", "events:\n  interval_ms: 1001\n", "events:\n  interval_ms: x\n"}) {
    c = ParseServeConfig(bad, {});
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().field(), "events.interval_ms") << bad;
  }
}

// The publisher drains the manager's events on its own thread (a step only records them): every
// event a call records arrives once, in order, under consecutive sequence numbers; a call made
// while the thread sleeps (idle > 100 ms) wakes it; Shutdown sends what the last call recorded.
TEST(ServeEvents, PublisherSendsEveryEventInOrderAfterASleepAndAtShutdown) {
  ServeConfig c;
  c.model = "deepseek-v3";
  c.kv_format = "fp8_ds_mla";
  c.pool_unbacked = true;
  c.capacity_blocks = 4096;
  c.max_requests = 64;
  c.events_endpoint = "tcp://127.0.0.1:*";
  std::vector<std::string> warnings;
  Result<std::unique_ptr<ServeCore>> made = ServeCore::Create(c, &warnings);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  ServeCore& core = **made;
  const uint32_t block = static_cast<uint32_t>(core.manager().block_tokens());

  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.set(zmq::sockopt::rcvtimeo, 5000);
  sub.connect(core.events_endpoint());

  uint64_t next_seq = 0;
  std::vector<uint32_t> received;  // the token ids of every BlockStored, in arrival order
  uint32_t next_token = 1;
  // PUB drops what it sends before the subscription arrives: a handshake instead of a sleep.
  // Throwaway prompts (tokens from 1'000'000'000) are admitted until one's events come through;
  // then a marker prompt's, whose arrival means every earlier message is in, so counting starts
  // on the next sequence number.
  {
    sub.set(zmq::sockopt::rcvtimeo, 100);
    bool joined = false;
    uint32_t throwaway = 1'000'000'000;
    // One block and a token: the block is sealed, its last token is throwaway - 2 after.
    auto admit_throwaway = [&] {
      std::vector<uint32_t> p(block + 1);
      std::iota(p.begin(), p.end(), throwaway);
      throwaway += block + 1;
      Result<Admission> t = core.Admit(p, {});
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      ASSERT_TRUE(core.Free(t->id).ok());
    };
    // The sequence number of the next message and whether it carries `last` (a BlockStored token).
    auto next_message = [&](uint32_t last, bool* saw) {
      std::vector<zmq::message_t> parts;
      for (bool more = true; more;) {
        zmq::message_t m;
        if (!sub.recv(m)) return false;
        more = m.more();
        parts.push_back(std::move(m));
      }
      if (parts.size() != 3 || parts[1].size() != 8) return false;
      uint64_t seq = 0;
      for (size_t i = 0; i < 8; ++i) seq = seq << 8 | static_cast<const uint8_t*>(parts[1].data())[i];
      next_seq = seq + 1;
      msgpack::object_handle h = msgpack::unpack(static_cast<const char*>(parts[2].data()), parts[2].size());
      const msgpack::object_array& events = h.get().via.array.ptr[1].via.array;
      for (uint32_t i = 0; i < events.size; ++i) {
        const msgpack::object_array& e = events.ptr[i].via.array;
        if (Str(e.ptr[0]) != "BlockStored") continue;
        for (uint32_t t : e.ptr[3].as<std::vector<uint32_t>>()) *saw = *saw || t == last;
      }
      return true;
    };
    for (int i = 0; i < 100 && !joined; ++i) {
      admit_throwaway();
      bool unused = false;
      joined = next_message(0, &unused);
    }
    ASSERT_TRUE(joined) << "no event reached the subscriber";
    sub.set(zmq::sockopt::rcvtimeo, 5000);
    admit_throwaway();  // the marker: its sealed block ends with token throwaway - 2
    bool marker = false;
    while (!marker) ASSERT_TRUE(next_message(throwaway - 2, &marker)) << "the marker's events did not arrive";
  }
  // Receives messages until `want` stored tokens have arrived (or a receive times out).
  auto receive = [&](size_t want) {
    while (received.size() < want) {
      std::vector<zmq::message_t> parts;
      for (bool more = true; more;) {
        zmq::message_t m;
        if (!sub.recv(m)) return;
        more = m.more();
        parts.push_back(std::move(m));
      }
      ASSERT_EQ(parts.size(), 3u);
      ASSERT_EQ(parts[1].size(), 8u);
      uint64_t seq = 0;
      for (size_t i = 0; i < 8; ++i) seq = seq << 8 | static_cast<const uint8_t*>(parts[1].data())[i];
      EXPECT_EQ(seq, next_seq++);
      msgpack::object_handle h = msgpack::unpack(static_cast<const char*>(parts[2].data()), parts[2].size());
      const msgpack::object_array& events = h.get().via.array.ptr[1].via.array;
      for (uint32_t i = 0; i < events.size; ++i) {
        const msgpack::object_array& e = events.ptr[i].via.array;
        ASSERT_EQ(Str(e.ptr[0]), "BlockStored");
        const std::vector<uint32_t> t = e.ptr[3].as<std::vector<uint32_t>>();
        EXPECT_EQ(t.size(), uint64_t{block} * e.ptr[1].via.array.size);
        received.insert(received.end(), t.begin(), t.end());
      }
    }
  };

  // One request: a prompt of 3 blocks + 5 tokens, then 300 one-token steps.
  std::vector<uint32_t> stream(uint64_t{3} * block + 5);
  std::iota(stream.begin(), stream.end(), next_token);
  next_token += static_cast<uint32_t>(stream.size());
  Result<Admission> a = core.Admit(stream, {});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::vector<StatusCode> codes;
  for (int step = 0; step < 300; ++step) {
    const RequestId id = a->id;
    const uint32_t one = 1, token = next_token++;
    ASSERT_TRUE(core.Step({&id, 1}, {&one, 1}, {&token, 1}, &codes).ok());
    ASSERT_EQ(codes[0], StatusCode::kOk);
    stream.push_back(token);
  }
  const size_t sealed = stream.size() / block * block;
  receive(sealed);
  ASSERT_EQ(received.size(), sealed);
  EXPECT_TRUE(std::equal(received.begin(), received.end(), stream.begin()));  // each once, in order

  // Idle past the publisher's 100 ms: it sleeps; the next call's events must still arrive.
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  std::vector<uint32_t> second(uint64_t{2} * block + 1);
  std::iota(second.begin(), second.end(), next_token);
  next_token += static_cast<uint32_t>(second.size());
  ASSERT_TRUE(core.Admit(second, {}).ok());
  receive(sealed + 2 * block);
  ASSERT_EQ(received.size(), sealed + 2 * block);
  EXPECT_TRUE(std::equal(second.begin(), second.end() - 1, received.begin() + static_cast<ptrdiff_t>(sealed)));

  // Recorded by the last call, sent by Shutdown.
  std::vector<uint32_t> third(uint64_t{block} + 1);
  std::iota(third.begin(), third.end(), next_token);
  ASSERT_TRUE(core.Admit(third, {}).ok());
  ASSERT_TRUE(core.Shutdown().ok());
  receive(sealed + 3 * block);
  ASSERT_EQ(received.size(), sealed + 3 * block);
  EXPECT_TRUE(std::equal(third.begin(), third.end() - 1, received.end() - block));
}

}  // namespace
}  // namespace tessera

// `tessera serve` benchmarks (issue 13), each with its baseline measured in the same run:
//
//   BM_ScrapeMetrics/1      GET /metrics over real HTTP (civetweb, loopback) with 10^5 cached
//                           blocks in the pool. Target < 1 ms.
//   BM_ScrapeHealth         GET /health on the same kind of server: the HTTP round trip alone.
//   BM_ScrapeMetrics/0      GET /metrics with an empty cache (the scrape must not grow with blocks).
//   BM_DecodeStep/1         one decode step of 256 requests (one token each) through ServeCore,
//                           KV events recorded, encoded (msgpack) and published (ZeroMQ PUB, a
//                           subscriber draining them).
//   BM_DecodeStep/0         the same steps with events off. Target: /1 <= 1.05 x /0.
//   BM_DecodeStep/2         events on, nobody subscribed: the publisher's side without the
//                           subscriber's threads, which share this machine's cores in /1.
//   BM_DecodeStepHostPool/1, /0   the same pair with a pool that holds (synthetic) KV bytes, as
//                           `serve` runs by default (64 requests of tiny-mla).
//   BM_RecordEvents/1, /0   the library alone, one thread: the same 256-request decode step on a
//                           RequestManager with events recorded and taken every step
//                           (TakeKvEventLog) against events off: what recording costs a step.
//
// The pools are unbacked (bookkeeping only: 10^5 blocks of real pages would be ~30 GB), which is
// the conservative case for the event ratio: no KV bytes are written, so a step is as cheap as it
// gets and the events' share of it as large as it gets.
#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "tessera/geometry.h"
#include "tessera/request_manager.h"
#include "tessera_tools/serve.h"

namespace tessera {
namespace {

constexpr uint32_t kBlock = 64;

ServeConfig Config(uint32_t capacity, bool events) {
  ServeConfig c;
  c.model = "deepseek-v3";
  c.kv_format = "fp8_ds_mla";
  c.pool_unbacked = true;
  c.capacity_blocks = capacity;
  c.max_requests = 512;
  c.http_listen = "127.0.0.1:0";
  c.http_threads = 2;
  c.events_enabled = events;
  c.events_endpoint = "tcp://127.0.0.1:*";
  return c;
}

std::unique_ptr<ServeCore> MustCore(const ServeConfig& c) {
  std::vector<std::string> warnings;
  Result<std::unique_ptr<ServeCore>> core = ServeCore::Create(c, &warnings);
  if (!core.ok()) {
    std::fprintf(stderr, "%s\n", core.status().ToString().c_str());
    std::abort();
  }
  return std::move(*core);
}

// GET path on a fresh loopback connection; returns the body size (0 on failure).
size_t Get(int port, const char* path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return 0;
  }
  const std::string req = std::string("GET ") + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  (void)::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  static thread_local std::vector<char> buf(1 << 20);
  size_t total = 0;
  for (ssize_t n; (n = ::recv(fd, buf.data(), buf.size(), 0)) > 0;) total += static_cast<size_t>(n);
  ::close(fd);
  return total;
}

// Fills the pool with `blocks` cached blocks: prompts of 1,000 blocks admitted and freed.
void Fill(ServeCore& core, uint32_t blocks) {
  uint32_t next = 1;
  for (uint32_t done = 0; done < blocks;) {
    const uint32_t n = std::min<uint32_t>(1000, blocks - done);
    std::vector<uint32_t> prompt(uint64_t{n} * kBlock + 1);
    std::iota(prompt.begin(), prompt.end(), next);
    next += static_cast<uint32_t>(prompt.size());
    Result<Admission> a = core.Admit(prompt, {});
    if (!a.ok() || !core.Free(a->id).ok()) std::abort();
    done += n;
  }
}

void BM_ScrapeMetrics(benchmark::State& state) {
  const uint32_t blocks = state.range(0) ? 100000 : 0;
  std::unique_ptr<ServeCore> core = MustCore(Config(101000, false));
  Fill(*core, blocks);
  if (core->manager().pool().cached_count() != blocks) std::abort();
  Result<ServeCore::HttpHandle> http = ServeCore::StartHttp(core.get());
  if (!http.ok()) std::abort();
  const int port = ServeCore::HttpPort(**http);
  size_t bytes = 0;
  for (auto _ : state) bytes = Get(port, "/metrics");
  if (bytes < 1000) state.SkipWithError("no metrics");
  state.counters["cached_blocks"] = static_cast<double>(core->manager().pool().cached_count());
  state.counters["reply_bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_ScrapeMetrics)->Arg(1)->Arg(0)->Unit(benchmark::kMicrosecond);

void BM_ScrapeHealth(benchmark::State& state) {
  std::unique_ptr<ServeCore> core = MustCore(Config(1024, false));
  Result<ServeCore::HttpHandle> http = ServeCore::StartHttp(core.get());
  if (!http.ok()) std::abort();
  const int port = ServeCore::HttpPort(**http);
  size_t bytes = 0;
  for (auto _ : state) bytes = Get(port, "/health");
  if (bytes == 0) state.SkipWithError("no reply");
}
BENCHMARK(BM_ScrapeHealth)->Unit(benchmark::kMicrosecond);

// 256 requests with prompts of 1,024..1,087 tokens, staggered (so that seals spread over the
// steps, as in a real batch), then decode steps of one token each.
// events: 0 off; 1 on, a subscriber in this process draining them; 2 on, nobody subscribed
// (recorded, encoded and handed to ZeroMQ, which drops them: the publisher's side alone).
void DecodeSteps(benchmark::State& state, int events_mode, bool host) {
  const bool events = events_mode != 0;
  const bool subscribe = events_mode == 1;
  // Unbacked: 256 requests, 1,024-token prompts, restarted every 2,048 steps. Host (the pool holds
  // synthetic KV, as `serve` does by default; tiny-mla keeps the pool at ~250 MB): 64 requests,
  // 256-token prompts, restarted every 512 steps.
  const uint32_t kRequests = host ? 64 : 256;
  const uint64_t prompt_tokens = host ? 256 : 1024;
  const uint64_t period = host ? 512 : 2048;
  ServeConfig config =
      Config(kRequests * static_cast<uint32_t>((prompt_tokens + kBlock + period) / kBlock + 2), events);
  if (host) {
    config.model = "tiny-mla";
    config.kv_format = "";
    config.pool_unbacked = false;
  }
  std::unique_ptr<ServeCore> core = MustCore(config);
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> received{0};
  std::thread drain;
  if (subscribe) {
    sub.set(zmq::sockopt::subscribe, "");
    sub.set(zmq::sockopt::rcvtimeo, 50);
    sub.connect(core->events_endpoint());
    drain = std::thread([&] {
      while (!stop.load()) {
        zmq::message_t m;
        if (sub.recv(m)) received.fetch_add(1);
      }
    });
  }
  std::vector<RequestId> ids;
  uint32_t next = 1;
  for (uint32_t i = 0; i < kRequests; ++i) {
    std::vector<uint32_t> prompt(prompt_tokens + (i * 37) % kBlock);
    std::iota(prompt.begin(), prompt.end(), next);
    next += static_cast<uint32_t>(prompt.size());
    Result<Admission> a = core->Admit(prompt, {});
    if (!a.ok()) std::abort();
    ids.push_back(a->id);
  }
  std::vector<uint32_t> counts(kRequests, 1), tokens(kRequests);
  std::vector<StatusCode> codes;
  uint64_t steps = 0;
  for (auto _ : state) {
    for (uint32_t i = 0; i < kRequests; ++i) tokens[i] = next++;
    if (!core->Step(ids, counts, tokens, &codes).ok()) std::abort();
    // Every `period` steps the requests start over from new prompts of their first lengths.
    if (++steps % period == 0) {
      state.PauseTiming();
      for (RequestId& r : ids) {
        const uint64_t t = core->manager().Tokens(r);
        if (!core->Free(r).ok()) std::abort();
        std::vector<uint32_t> prompt(t - period);
        std::iota(prompt.begin(), prompt.end(), next);
        next += static_cast<uint32_t>(prompt.size());
        Result<Admission> a = core->Admit(prompt, {});
        if (!a.ok()) std::abort();
        r = a->id;
      }
      state.ResumeTiming();
    }
  }
  for (StatusCode c : codes) {
    if (c != StatusCode::kOk) state.SkipWithError("a step was refused");
  }
  state.counters["seals_per_step"] =
      static_cast<double>(core->manager().pool().stats().seals.load()) / static_cast<double>(steps + 1);
  if (subscribe) {
    stop = true;
    drain.join();
    state.counters["zmq_frames_received"] = static_cast<double>(received.load());
  }
  state.SetItemsProcessed(static_cast<int64_t>(steps) * kRequests);
}
void BM_DecodeStep(benchmark::State& state) { DecodeSteps(state, static_cast<int>(state.range(0)), false); }
BENCHMARK(BM_DecodeStep)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond)->MinTime(1.0);
void BM_DecodeStepHostPool(benchmark::State& state) { DecodeSteps(state, static_cast<int>(state.range(0)), true); }
BENCHMARK(BM_DecodeStepHostPool)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->MinTime(1.0);

void BM_RecordEvents(benchmark::State& state) {
  const bool events = state.range(0) != 0;
  constexpr uint32_t kRequests = 256;
  constexpr uint64_t kPeriod = 2048;
  Result<Geometry> g = LoadPreset("deepseek-v3");
  if (!g.ok()) std::abort();
  ManagerOptions mo;
  mo.kv_format = "fp8_ds_mla";
  mo.region_kind = RegionKind::kUnbacked;
  mo.content_dedup = false;
  mo.capacity_blocks = kRequests * static_cast<uint32_t>((1024 + kBlock + kPeriod) / kBlock + 2);
  mo.max_requests = 512;
  mo.kv_events = events;
  Result<std::unique_ptr<RequestManager>> made = RequestManager::Create(*g, mo);
  if (!made.ok()) std::abort();
  RequestManager& m = **made;
  uint32_t next = 1;
  auto admit = [&](uint64_t tokens) {
    std::vector<uint32_t> prompt(tokens);
    std::iota(prompt.begin(), prompt.end(), next);
    next += static_cast<uint32_t>(prompt.size());
    Result<Admission> a = m.Admit(prompt, {});
    if (!a.ok()) std::abort();
    const uint64_t have = m.Tokens(a->id);
    if (!m.Append(a->id, std::span<const uint32_t>(prompt).subspan(have), KvWriters()).ok()) std::abort();
    return a->id;
  };
  std::vector<RequestId> ids;
  for (uint32_t i = 0; i < kRequests; ++i) ids.push_back(admit(1024 + (i * 37) % kBlock));
  KvEventLog log;
  uint64_t steps = 0, taken = 0;
  for (auto _ : state) {
    for (RequestId r : ids) {
      const uint32_t t = next++;
      if (!m.AllocateSlots(r, 1).ok() || !m.Append(r, {&t, 1}, KvWriters()).ok()) std::abort();
    }
    if (events) {
      m.TakeKvEventLog(&log);
      taken += log.size();
    }
    if (++steps % kPeriod == 0) {
      state.PauseTiming();
      for (RequestId& r : ids) {
        const uint64_t t = m.Tokens(r);
        if (!m.Free(r).ok()) std::abort();
        r = admit(t - kPeriod);
      }
      m.TakeKvEventLog(&log);
      state.ResumeTiming();
    }
  }
  state.counters["seals_per_step"] =
      static_cast<double>(m.pool().stats().seals.load()) / static_cast<double>(steps + 1);
  state.counters["events_per_step"] = static_cast<double>(taken) / static_cast<double>(steps + 1);
  state.SetItemsProcessed(static_cast<int64_t>(steps) * kRequests);
}
BENCHMARK(BM_RecordEvents)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->MinTime(1.0);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();

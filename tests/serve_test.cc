// `tessera serve`: configuration, the event wire format, and the server end to end (started by
// the test on free ports, scraped over HTTP, events received by a ZeroMQ SUB socket, SIGTERM and
// a restart that finds its blocks on disk).
#include "tessera/serve.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <msgpack.hpp>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "test_support.h"

namespace tessera {
namespace {

using testing::TempDir;

// ---- Configuration -------------------------------------------------------------------------

TEST(ServeConfig, KeysAndEnvironmentOverrides) {
  Result<ServeConfig> c = ParseServeConfig(
      "model: deepseek-v3\ncapacity_blocks: 64\nhttp:\n  listen: 127.0.0.1:0\n  threads: 2\n"
      "events:\n  enabled: false\ntiers:\n  disk_dir: /tmp/x\n  write: write-back\n"
      "  redis_cluster: [a:1, b:2]\n  redis_secret_file: /s\n",
      {{"TESSERA_SERVE_CAPACITY_BLOCKS", "128"}, {"TESSERA_SERVE_HTTP_THREADS", "3"}, {"PATH", "/bin"}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->capacity_blocks, 128u);  // the environment wins
  EXPECT_EQ(c->http_threads, 3u);
  EXPECT_EQ(c->http_listen, "127.0.0.1:0");
  EXPECT_FALSE(c->events_enabled);
  EXPECT_EQ(c->tier_write, WritePolicy::kWriteBack);
  EXPECT_EQ(c->redis_cluster, (std::vector<std::string>{"a:1", "b:2"}));
}

TEST(ServeConfig, BadInputNamesTheKey) {
  auto field = [](std::string_view yaml, std::map<std::string, std::string> env = {}) {
    Result<ServeConfig> c = ParseServeConfig(yaml, env);
    return c.ok() ? std::string("ok") : c.status().field();
  };
  EXPECT_EQ(field("modle: deepseek-v3\n"), "modle");
  EXPECT_EQ(field("http:\n  lisen: 1\n"), "http.lisen");
  EXPECT_EQ(field("bogus:\n  a: 1\n"), "bogus");
  EXPECT_EQ(field("model: [unclosed\n"), "config");
  EXPECT_EQ(field("- a\n- b\n"), "config");
  EXPECT_EQ(field("capacity_blocks: -3\n"), "capacity_blocks");
  EXPECT_EQ(field("capacity_blocks: 99999999999\n"), "capacity_blocks");
  EXPECT_EQ(field("events:\n  enabled: maybe\n"), "events.enabled");
  EXPECT_EQ(field("http:\n  max_body_bytes: 0\n"), "http.max_body_bytes");
  EXPECT_EQ(field("tiers:\n  redis: redis://h:1\n"), "tiers.redis_secret_file");
  EXPECT_EQ(field("model: a\nmodel: b\n"), "model");  // given twice
  EXPECT_EQ(field("", {{"TESSERA_SERVE_HTTP_LISEN", "1"}}), "http.lisen");
  Result<ServeConfig> c = ParseServeConfig("", {{"TESSERA_SERVE_MAX_REQUESTS", "x"}});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("TESSERA_SERVE_MAX_REQUESTS"), std::string::npos);
}

TEST(ServeConfig, RedisAddresses) {
  Result<std::pair<std::string, int>> a = ParseRedisAddress("redis://10.0.0.1:6380", "redis");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first, "10.0.0.1");
  EXPECT_EQ(a->second, 6380);
  EXPECT_FALSE(ParseRedisAddress("redis://h", "redis").ok());
  EXPECT_FALSE(ParseRedisAddress("h:0", "redis").ok());
  EXPECT_FALSE(ParseRedisAddress("h:70000", "redis").ok());
  EXPECT_FALSE(ParseRedisAddress("h;rm -rf:1", "redis").ok());
}

// ---- The wire format ----------------------------------------------------------------------

std::string Bin(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::BIN);
  return std::string(o.via.bin.ptr, o.via.bin.size);
}
std::string Str(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::STR);
  return std::string(o.via.str.ptr, o.via.str.size);
}
std::string HashBytes(const Hash128& h) {
  std::string s(16, '\0');
  for (int i = 0; i < 8; ++i) {
    s[static_cast<size_t>(i)] = static_cast<char>(h.hi >> (8 * (7 - i)));
    s[static_cast<size_t>(8 + i)] = static_cast<char>(h.lo >> (8 * (7 - i)));
  }
  return s;
}

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
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // joined; the publisher now sleeps

  uint64_t next_seq = 0;
  std::vector<uint32_t> received;  // the token ids of every BlockStored, in arrival order
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

  // One request: a prompt of 3 blocks + 5 tokens (woken from sleep), then 300 one-token steps.
  uint32_t next_token = 1;
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

// ---- The server, end to end ---------------------------------------------------------------

// `tessera serve --config FILE` as a child process, its stdout read for the ready line.
class Server {
 public:
  Server(const std::string& config, std::vector<std::string> extra = {}) {
    int out[2], err[2];
    EXPECT_EQ(::pipe(out), 0);
    EXPECT_EQ(::pipe(err), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::close(out[0]);
      ::close(err[0]);
      std::vector<std::string> args = {TESSERA_BINARY, "serve", "--config", config};
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    out_ = out[0];
    err_ = err[0];
  }
  ~Server() {
    if (pid_ > 0 && !waited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(out_);
    ::close(err_);
  }
  // Waits (10 s at most) for "ready http=H:P events=E"; false if the process exits first.
  bool Ready() {
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[256];
      const ssize_t n = ::read(out_, buf, sizeof buf);
      if (n <= 0) return false;
      line.append(buf, static_cast<size_t>(n));
      if (line.find('\n') == std::string::npos) continue;
      const size_t h = line.find("http=127.0.0.1:");
      const size_t e = line.find("events=");
      if (h == std::string::npos || e == std::string::npos) return false;
      port_ = std::stoi(line.substr(h + 15));
      events_ = line.substr(e + 7, line.find('\n', e) - e - 7);
      return true;
    }
    return false;
  }
  // SIGTERM (or nothing), then the exit code (-1 if it had not exited within 20 s).
  int Stop(bool term = true) {
    if (term) ::kill(pid_, SIGTERM);
    for (int i = 0; i < 200; ++i) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        waited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
  }
  std::string Stderr() {
    std::string s;
    char buf[4096];
    ::fcntl(err_, F_SETFL, O_NONBLOCK);
    for (ssize_t n; (n = ::read(err_, buf, sizeof buf)) > 0;) s.append(buf, static_cast<size_t>(n));
    return s;
  }
  int port() const { return port_; }
  const std::string& events() const { return events_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1, err_ = -1;
  bool waited_ = false;
  int port_ = 0;
  std::string events_;
};

struct HttpReply {
  int status = 0;
  std::string body;
};

// One HTTP/1.1 request on a fresh connection (the server closes it after the reply).
HttpReply Http(int port, const std::string& method, const std::string& path, const std::string& body = "",
               const std::string& extra_headers = "") {
  HttpReply r;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return r;
  }
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + extra_headers;
  if (method == "POST" && extra_headers.find("Content-Length") == std::string::npos) {
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += "\r\n" + body;
  for (size_t sent = 0; sent < req.size();) {
    const ssize_t n = ::send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string all;
  char buf[65536];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) all.append(buf, static_cast<size_t>(n));
  ::close(fd);
  if (all.size() > 12 && all.starts_with("HTTP/1.1 ")) r.status = std::stoi(all.substr(9, 3));
  const size_t split = all.find("\r\n\r\n");
  if (split != std::string::npos) r.body = all.substr(split + 4);
  return r;
}

std::string WriteConfig(const TempDir& dir, const std::string& text) {
  const std::string path = dir.path() + "/serve.yaml";
  std::ofstream(path) << text;
  return path;
}

std::string Tokens(uint32_t first, uint32_t n) {
  std::string s = "[";
  for (uint32_t i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(first + i);
  return s + "]";
}

std::string BaseConfig(const TempDir& dir, const std::string& write = "write-back") {
  return "model: deepseek-v3\nkv_format: fp8_ds_mla\ncapacity_blocks: 64\nmax_requests: 16\n"
         "http:\n  listen: 127.0.0.1:0\n  max_body_bytes: 65536\n"
         "events:\n  endpoint: tcp://127.0.0.1:*\n  topic: kv\n  data_parallel_rank: 2\n"
         "tiers:\n  disk_dir: " +
         dir.path() + "/disk\n  write: " + write + "\n";
}

// The events of every batch received within `ms`, as (tag, block hash count) pairs.
struct Received {
  std::vector<std::string> tags;
  std::vector<std::string> stored_hashes;  // the 16-byte hashes of every BlockStored
  uint64_t last_seq = 0;
  uint32_t rank = 0;
};

void Drain(zmq::socket_t& sub, int ms, Received* got) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < deadline) {
    std::vector<zmq::message_t> parts;
    zmq::message_t m;
    if (!sub.recv(m, zmq::recv_flags::dontwait)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    parts.push_back(std::move(m));
    while (parts.back().more()) {
      zmq::message_t next;
      ASSERT_TRUE(sub.recv(next, zmq::recv_flags::none));
      parts.push_back(std::move(next));
    }
    ASSERT_EQ(parts.size(), 3u);  // topic, sequence, payload
    EXPECT_EQ(parts[0].to_string(), "kv");
    ASSERT_EQ(parts[1].size(), 8u);
    uint64_t seq = 0;
    for (size_t i = 0; i < 8; ++i) seq = (seq << 8) | static_cast<const uint8_t*>(parts[1].data())[i];
    got->last_seq = seq;
    msgpack::object_handle h = msgpack::unpack(static_cast<const char*>(parts[2].data()), parts[2].size());
    const msgpack::object_array& batch = h.get().via.array;
    got->rank = batch.ptr[2].as<uint32_t>();
    const msgpack::object_array& events = batch.ptr[1].via.array;
    for (uint32_t i = 0; i < events.size; ++i) {
      const msgpack::object_array& e = events.ptr[i].via.array;
      got->tags.push_back(Str(e.ptr[0]));
      if (got->tags.back() == "BlockStored") {
        for (uint32_t k = 0; k < e.ptr[1].via.array.size; ++k)
          got->stored_hashes.push_back(Bin(e.ptr[1].via.array.ptr[k]));
      }
    }
  }
}

TEST(ServeEndToEnd, MetricsEventsApiAndRestartFromDisk) {
  TempDir dir;
  const std::string config = WriteConfig(dir, BaseConfig(dir));
  uint64_t first_request = 0;
  {
    Server s(config);
    ASSERT_TRUE(s.Ready()) << s.Stderr();
    EXPECT_EQ(Http(s.port(), "GET", "/health").body, "ok\n");

    zmq::context_t ctx;
    zmq::socket_t sub(ctx, zmq::socket_type::sub);
    sub.set(zmq::sockopt::subscribe, "");
    sub.connect(s.events());
    // PUB drops what it sends before the subscription arrives: admit throwaway prompts until
    // one's events come through, then start counting.
    Received warm;
    for (uint32_t i = 0; i < 50 && warm.tags.empty(); ++i) {
      HttpReply r = Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1000000 + 1000 * i, 65) + "}");
      ASSERT_EQ(r.status, 200) << r.body;
      const uint64_t id = nlohmann::json::parse(r.body)["request"].get<uint64_t>();
      ASSERT_EQ(Http(s.port(), "POST", "/v1/free", "{\"request\":" + std::to_string(id) + "}").status, 200);
      Drain(sub, 100, &warm);
    }
    ASSERT_FALSE(warm.tags.empty()) << "no event reached the subscriber";
    EXPECT_EQ(warm.rank, 2u);

    // A prompt of three whole blocks and 10 tokens: one BlockStored of three hashes.
    HttpReply a = Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1, 202) + ",\"tenant\":0}");
    ASSERT_EQ(a.status, 200) << a.body;
    nlohmann::json aj = nlohmann::json::parse(a.body);
    EXPECT_EQ(aj["cached_tokens"], 0);
    EXPECT_EQ(aj["block_table"].size(), 4u);
    first_request = aj["request"].get<uint64_t>();
    // Decode: 54 more tokens fill the fourth block.
    HttpReply st = Http(
        s.port(), "POST", "/v1/step",
        "{\"requests\":[" + std::to_string(first_request) + "],\"counts\":[54],\"tokens\":" + Tokens(5000, 54) + "}");
    ASSERT_EQ(st.status, 200) << st.body;
    EXPECT_EQ(nlohmann::json::parse(st.body)["codes"][0], "ok");
    Received got;
    Drain(sub, 500, &got);
    ASSERT_EQ(got.tags, (std::vector<std::string>{"BlockStored", "BlockStored"}));
    EXPECT_EQ(got.stored_hashes.size(), 4u);
    EXPECT_GT(got.last_seq, warm.last_seq);

    // Bad input is refused, naming the field; nothing changes.
    HttpReply bad = Http(s.port(), "POST", "/v1/admit", "{\"tokens\":[1,-2]}");
    EXPECT_EQ(bad.status, 400);
    EXPECT_EQ(nlohmann::json::parse(bad.body)["field"], "tokens");
    EXPECT_EQ(Http(s.port(), "POST", "/v1/admit", "{\"tokens\":[1],\"tenatn\":1}").status, 400);
    EXPECT_EQ(Http(s.port(), "POST", "/v1/admit", "not json").status, 400);
    EXPECT_EQ(Http(s.port(), "POST", "/v1/admit", std::string(70000, ' ')).status, 413);
    EXPECT_EQ(Http(s.port(), "POST", "/v1/free", "{\"request\":999}").status, 400);
    EXPECT_EQ(Http(s.port(), "POST", "/v1/step", "{\"requests\":[0],\"counts\":[2],\"tokens\":[1]}").status, 400);
    EXPECT_EQ(Http(s.port(), "GET", "/v1/admit").status, 405);
    EXPECT_EQ(Http(s.port(), "POST", "/v1/reset", "{}").status, 409);  // a request is live

    const std::string metrics = Http(s.port(), "GET", "/metrics").body;
    EXPECT_NE(metrics.find("tessera_block_seals_total "), std::string::npos);
    EXPECT_NE(metrics.find("# TYPE tessera_serve_step_seconds histogram"), std::string::npos);
    EXPECT_NE(metrics.find("tessera_serve_admit_seconds_bucket{le=\"+Inf\"}"), std::string::npos);
    EXPECT_NE(metrics.find("tessera_serve_step_seconds_count 1\n"), std::string::npos);
    EXPECT_NE(metrics.find("tessera_serve_promote_seconds_count"), std::string::npos);
    EXPECT_NE(metrics.find("tessera_serve_http_errors_total 8\n"), std::string::npos) << metrics;
    EXPECT_EQ(s.Stop(), 0) << s.Stderr();  // SIGTERM: checkpoint (write-back: nothing on disk before)
  }
  {
    Server s(config);
    ASSERT_TRUE(s.Ready()) << s.Stderr();
    // A cold pool: the four blocks come back from the disk tier, verified.
    HttpReply a = Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1, 202) + "}");
    ASSERT_EQ(a.status, 200) << a.body;
    nlohmann::json aj = nlohmann::json::parse(a.body);
    EXPECT_EQ(aj["tier_blocks"], 3);
    EXPECT_EQ(aj["cached_tokens"], 192);
    const std::string metrics = Http(s.port(), "GET", "/metrics").body;
    EXPECT_NE(metrics.find("tessera_serve_promote_seconds_count 1\n"), std::string::npos) << metrics;
    ASSERT_EQ(Http(s.port(), "POST", "/v1/free", "{\"request\":" + aj["request"].dump() + "}").status, 200);
    EXPECT_EQ(Http(s.port(), "POST", "/v1/reset", "{}").status, 200);
    EXPECT_EQ(s.Stop(), 0) << s.Stderr();
  }
}

TEST(ServeEndToEnd, WithoutACheckpointWriteBackLosesTheBlocks) {
  // The control for the restart above: killed without SIGTERM, a write-back server had written
  // nothing to disk, so a restart finds nothing.
  TempDir dir;
  const std::string config = WriteConfig(dir, BaseConfig(dir));
  {
    Server s(config);
    ASSERT_TRUE(s.Ready()) << s.Stderr();
    ASSERT_EQ(Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1, 202) + "}").status, 200);
  }  // the destructor: SIGKILL
  Server s(config);
  ASSERT_TRUE(s.Ready()) << s.Stderr();
  HttpReply a = Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1, 202) + "}");
  ASSERT_EQ(a.status, 200);
  EXPECT_EQ(nlohmann::json::parse(a.body)["tier_blocks"], 0);
  EXPECT_EQ(s.Stop(), 0);
}

TEST(ServeEndToEnd, BadConfigurationExitsTwoNamingIt) {
  TempDir dir;
  {
    Server s(WriteConfig(dir, "model: deepseek-v3\nhttp:\n  listen: [1\n"));
    EXPECT_FALSE(s.Ready());
    EXPECT_EQ(s.Stop(false), 2);
    EXPECT_NE(s.Stderr().find("config: malformed YAML"), std::string::npos);
  }
  {
    Server s(WriteConfig(dir, "model: deepseek-v3\ncapacity_blockz: 3\n"));
    EXPECT_FALSE(s.Ready());
    EXPECT_EQ(s.Stop(false), 2);
    EXPECT_NE(s.Stderr().find("capacity_blockz: unknown key"), std::string::npos);
  }
  {
    Server s(WriteConfig(dir, "model: no-such-model\n"));
    EXPECT_FALSE(s.Ready());
    EXPECT_EQ(s.Stop(false), 2);
  }
}

TEST(ServeEndToEnd, UnreachableRedisIsAnErrorAtStart) {
  TempDir dir;
  const std::string secret = dir.path() + "/secret";
  std::ofstream(secret) << "0123456789abcdef0123456789abcdef\n";
  const int port = testing::FreePorts(1)[0];  // nothing listens there
  Server s(WriteConfig(dir,
                       "model: deepseek-v3\nhttp:\n  listen: 127.0.0.1:0\nevents:\n  enabled: false\n"
                       "tiers:\n  redis_secret_file: " +
                           secret + "\n"),
           {"--redis", "redis://127.0.0.1:" + std::to_string(port)});
  EXPECT_FALSE(s.Ready());
  EXPECT_EQ(s.Stop(false), 2);
  EXPECT_NE(s.Stderr().find("redis: cannot reach redis://127.0.0.1:"), std::string::npos);
}

TEST(ServeEndToEnd, RedisTierServesARestartedServer) {
  TESSERA_REQUIRE_REDIS_SERVER();
  testing::RedisServer redis;
  ASSERT_TRUE(redis.Start());
  TempDir dir;
  const std::string secret = dir.path() + "/secret";
  std::ofstream(secret) << "0123456789abcdef0123456789abcdef\n";
  const std::string config = WriteConfig(dir,
                                         "model: deepseek-v3\nkv_format: fp8_ds_mla\ncapacity_blocks: 64\n"
                                         "http:\n  listen: 127.0.0.1:0\nevents:\n  enabled: false\n"
                                         "tiers:\n  redis_secret_file: " +
                                             secret + "\n");
  const std::vector<std::string> flag = {"--redis", "redis://127.0.0.1:" + std::to_string(redis.port())};
  {
    Server s(config, flag);
    ASSERT_TRUE(s.Ready()) << s.Stderr();
    ASSERT_EQ(Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1, 130) + "}").status, 200);
    EXPECT_EQ(s.Stop(), 0) << s.Stderr();
  }
  Server s(config, flag);
  ASSERT_TRUE(s.Ready()) << s.Stderr();
  HttpReply a = Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1, 130) + "}");
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(nlohmann::json::parse(a.body)["tier_blocks"], 2);
  EXPECT_EQ(s.Stop(), 0);
}

// `tessera simulate --redis`: a second run with a cold pool hits the first run's blocks in Redis;
// an unreachable server is an error at start.
TEST(SimulateRedis, SecondRunHitsFromRedis) {
  TESSERA_REQUIRE_REDIS_SERVER();
  testing::RedisServer redis;
  ASSERT_TRUE(redis.Start());
  TempDir dir;
  const std::string secret = dir.path() + "/secret";
  std::ofstream(secret) << "0123456789abcdef0123456789abcdef\n";
  const std::string args =
      "simulate --model tiny-mla --agents 2 --independent 2 --shared-tokens 256 --unique-tokens 64 "
      "--redis redis://127.0.0.1:" +
      std::to_string(redis.port()) + " --redis-secret-file " + secret + " --format json";
  testing::CommandResult first = testing::RunTessera(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(nlohmann::json::parse(first.out)["tier_hits"], 0);
  EXPECT_GT(nlohmann::json::parse(first.out)["tier_written"].get<uint64_t>(), 0u);
  testing::CommandResult second = testing::RunTessera(args);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  const nlohmann::json j = nlohmann::json::parse(second.out);
  EXPECT_GT(j["tier_hits"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["tier_verify_failures"], 0);

  const int nobody = testing::FreePorts(1)[0];
  testing::CommandResult down = testing::RunTessera("simulate --redis redis://127.0.0.1:" + std::to_string(nobody) +
                                                    " --redis-secret-file " + secret);
  EXPECT_EQ(down.exit_code, 2);
  EXPECT_NE(down.err.find("redis: cannot reach"), std::string::npos);
  testing::CommandResult no_secret = testing::RunTessera("simulate --redis redis://127.0.0.1:1");
  EXPECT_EQ(no_secret.exit_code, 2);
  EXPECT_NE(no_secret.err.find("redis-secret-file"), std::string::npos);
}

}  // namespace
}  // namespace tessera

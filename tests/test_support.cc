#include "test_support.h"

#include "redis_launcher.h"

#include "tessera/codec.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#if TESSERA_HAVE_REDIS
#include <hiredis/hiredis.h>
#endif
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace tessera::testing {

Geometry Preset(const std::string& name) {
  Result<Geometry> g = LoadPreset(name);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : Geometry{};
}

Geometry FromJson(const std::string& json) {
  Result<Geometry> g = GeometryFromConfigJson(json, "test-config");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : Geometry{};
}

Geometry SeedFixture() {
  Result<Geometry> g = LoadConfigFile(std::string(TESSERA_TEST_DATA) + "/seed-fixture.json");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : Geometry{};
}

Ledger MustLedger(const Geometry& g, const LedgerOptions& options) {
  Result<Ledger> l = ComputeLedger(g, options);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return l.ok() ? *l : Ledger{};
}

LedgerOptions Context(uint64_t tokens, const std::string& kv_format, Engine engine) {
  LedgerOptions o;
  o.context_tokens = tokens;
  o.kv_format = kv_format;
  o.engine = engine;
  return o;
}

LedgerOptions LedgerOptionsFor(const ManagerOptions& options, uint64_t context, uint64_t batch) {
  LedgerOptions o;
  o.context_tokens = context;
  o.batch = batch;
  o.kv_format = options.kv_format;
  o.indexer_format = options.indexer_format;
  o.block_tokens = options.block_tokens;
  o.kernel = options.kernel;
  o.spec_tokens = options.spec_tokens;
  o.include_mtp = options.include_mtp;
  o.swa_strategy = options.window_strategy;
  o.engine = Engine::kTessera;
  return o;
}

WeightShapes PresetShapes(const std::string& name) {
  Result<std::string> text = PresetConfigText(name);
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  if (!text.ok()) return WeightShapes{};
  Result<WeightShapes> s = WeightShapesFromConfigJson(*text, name);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : WeightShapes{};
}

std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

void WriteRandomRecord(const RecordFormat& f, std::span<std::byte> rec, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  if (f.family == FormatFamily::kFp8DsMla) {
    std::vector<float> lat(512), rope(64);
    for (float& x : lat) x = u(rng);
    for (float& x : rope) x = u(rng);
    ASSERT_TRUE(QuantizeFp8DsMla(lat, rope, rec.first(656)).ok());
  } else if (f.use == FormatUse::kIndexer) {
    std::vector<float> key(f.regions[0].count);
    for (float& x : key) x = u(rng);
    ASSERT_TRUE(QuantizeIndexerFp8(key, rec.first(key.size() + 4)).ok());
  } else {  // bf16 latent + rope
    ASSERT_GE(rec.size(), f.record_bytes());
    for (uint64_t i = 0; i + 1 < f.record_bytes(); i += 2) {
      const uint16_t b = FloatToBf16(u(rng));
      rec[i] = static_cast<std::byte>(b & 0xff);
      rec[i + 1] = static_cast<std::byte>(b >> 8);
    }
  }
}

void WriteRandomRecord(const RecordFormat& f, const RecordView& rec, std::mt19937& rng) {
  if (f.use != FormatUse::kIndexer) return WriteRandomRecord(f, rec.planes[0], rng);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> key(f.regions[0].count);
  for (float& x : key) x = u(rng);
  ASSERT_TRUE(WriteIndexerFp8(f, key, rec).ok());
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "tessera-test-XXXXXX").string();
  char* made = ::mkdtemp(tmpl.data());
  EXPECT_NE(made, nullptr);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::Write(const std::string& name, const std::string& contents) const {
  std::string p = path_ + "/" + name;
  std::ofstream(p, std::ios::binary) << contents;
  return p;
}

CommandResult RunTessera(const std::string& args) {
  TempDir dir;
  std::string out = dir.path() + "/stdout", err = dir.path() + "/stderr";
  std::string cmd = std::string(TESSERA_BINARY) + " " + args + " >" + out + " 2>" + err + " </dev/null";
  int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream o(out), e(err);
  std::stringstream so, se;
  so << o.rdbuf();
  se << e.rdbuf();
  r.out = so.str();
  r.err = se.str();
  return r;
}

bool HaveRedisServer() { return std::system("command -v redis-server >/dev/null 2>&1") == 0; }

std::vector<int> FreePorts(size_t n) {
  // Keep every socket bound until all are chosen, so the ports are distinct.
  std::vector<int> fds, ports;
  for (size_t i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
              ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
    EXPECT_TRUE(ok) << "no free port";
    if (fd >= 0) fds.push_back(fd);
    ports.push_back(ok ? ntohs(a.sin_port) : 0);
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

RedisServer::RedisServer(int port) : port_(port), port_fixed_(port != 0) {}

RedisServer::~RedisServer() { Stop(); }

void RedisServer::AddArgs(const std::vector<std::string>& args) { args_.insert(args_.end(), args.begin(), args.end()); }

void RedisServer::EnableCluster() { cluster_ = true; }

RedisServer::Outcome RedisServer::Launch() {
  std::vector<std::string> extra;
  if (cluster_) {
    extra = {"--cluster-enabled",      "yes", "--cluster-config-file", dir_.path() + "/nodes.conf", "--cluster-port",
             std::to_string(bus_port_)};
  }
  extra.insert(extra.end(), args_.begin(), args_.end());
  switch (LaunchRedisServer(port_, dir_.path(), extra, &pid_)) {
    case RedisLaunch::kUp:
      return Outcome::kUp;
    case RedisLaunch::kTimeout:
      return Outcome::kTimeout;
    case RedisLaunch::kExited:
      break;
  }
  return Outcome::kExited;
}

bool RedisServer::Start() {
  if (!HaveRedisServer()) {
    ADD_FAILURE() << "redis-server is not on PATH: run scripts/install-deps.sh";
    return false;
  }
  Stop();
  const int attempts = port_fixed_ ? 1 : 8;
  Outcome last = Outcome::kExited;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    if (!port_fixed_) {
      std::vector<int> ports = FreePorts(cluster_ ? 2 : 1);
      port_ = ports[0];
      if (cluster_) bus_port_ = ports[1];
      std::error_code ec;
      std::filesystem::remove(dir_.path() + "/nodes.conf", ec);  // a config from a failed start
    } else if (cluster_ && bus_port_ == 0) {
      bus_port_ = FreePort();
    }
    last = Launch();
    if (last == Outcome::kUp) {
      port_fixed_ = true;
      return true;
    }
    Stop();
    if (last != Outcome::kExited) break;  // a server that hangs will not do better on another port
  }
  ADD_FAILURE() << "redis-server on port " << port_ << (last == Outcome::kExited ? " exited" : " never answered")
                << (port_fixed_ ? "" : " (after retrying on fresh ports)");
  return false;
}

void RedisServer::Stop() { StopRedisServer(&pid_); }

bool RedisReply::ok() const {
#if TESSERA_HAVE_REDIS
  return type != 0 && type != REDIS_REPLY_ERROR;
#else
  return false;
#endif
}

RedisReply RedisCommand(int port, const std::vector<std::string>& args) {
  RedisReply out;
#if TESSERA_HAVE_REDIS
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, timeval{1, 0});
  if (c == nullptr || c->err != 0) {
    if (c != nullptr) redisFree(c);
    return out;
  }
  redisSetTimeout(c, timeval{5, 0});
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
  if (r != nullptr) {
    out.type = r->type;
    out.integer = r->integer;
    if (r->str != nullptr) out.text.assign(r->str, r->len);
    freeReplyObject(r);
  }
  redisFree(c);
#else
  (void)port;
  (void)args;
#endif
  return out;
}

std::string ForgeRedisValueV1(const Hash128& key, uint16_t format_id, const std::vector<std::byte>& payload) {
  struct {
    uint32_t magic;
    uint16_t version;
    uint16_t format_id;
    uint64_t key_lo, key_hi, payload_len, checksum, reserved;
  } h{0x44525354,
      1,
      format_id,
      key.lo,
      key.hi,
      payload.size(),
      XXH3_64bits_withSeed(payload.data(), payload.size(), key.lo ^ key.hi),
      0};
  static_assert(sizeof h == 48);
  std::string v(sizeof h + payload.size(), '\0');
  std::memcpy(v.data(), &h, sizeof h);
  if (!payload.empty()) std::memcpy(v.data() + sizeof h, payload.data(), payload.size());
  return v;
}

uint64_t PeakRssBytes() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;
}

// ---- FakeRedis ---------------------------------------------------------------------------------

namespace {
constexpr int kPollSliceMs = 5;  // how often a waiting script looks at the stop flag
}

FakeRedis::FakeRedis(Script script) : script_(std::move(script)) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  bool ok = listen_fd_ >= 0 && ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
            ::listen(listen_fd_, 16) == 0 && ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  EXPECT_TRUE(ok) << "fake redis: cannot listen on 127.0.0.1";
  port_ = ok ? ntohs(a.sin_port) : 0;
  if (ok) thread_ = std::thread([this] { Serve(); });
}

FakeRedis::~FakeRedis() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void FakeRedis::Serve() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, kPollSliceMs) <= 0) continue;
    int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) continue;
    connections_.fetch_add(1);
    Conn conn(fd, &stop_);
    script_(conn);
    ::close(fd);
  }
}

std::string FakeRedis::Bulk(std::string_view s) {
  return "$" + std::to_string(s.size()) + "\r\n" + std::string(s) + "\r\n";
}

std::string FakeRedis::SlotMapTo(int port) {
  return "*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n" + Bulk("127.0.0.1") + ":" + std::to_string(port) + "\r\n" +
         Bulk(std::string(40, 'f'));
}

bool FakeRedis::Conn::Fill() {
  while (!stop_->load()) {
    pollfd p{fd_, POLLIN, 0};
    int r = ::poll(&p, 1, kPollSliceMs);
    if (r <= 0) continue;
    char buf[65536];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return false;
    buf_.append(buf, static_cast<size_t>(n));
    return true;
  }
  return false;
}

bool FakeRedis::Conn::ReadCommand(std::vector<std::string>* args) {
  // *<n>\r\n then n times $<len>\r\n<bytes>\r\n; only the tiers under test talk to this server.
  auto line = [&](std::string* out) {
    size_t pos;
    while ((pos = buf_.find("\r\n")) == std::string::npos) {
      if (!Fill()) return false;
    }
    *out = buf_.substr(0, pos);
    buf_.erase(0, pos + 2);
    return true;
  };
  std::string header;
  if (!line(&header) || header.empty() || header[0] != '*') return false;
  size_t n = std::stoul(header.substr(1));
  args->clear();
  for (size_t i = 0; i < n; ++i) {
    std::string len_line;
    if (!line(&len_line) || len_line.empty() || len_line[0] != '$') return false;
    size_t len = std::stoul(len_line.substr(1));
    while (buf_.size() < len + 2) {
      if (!Fill()) return false;
    }
    args->push_back(buf_.substr(0, len));
    buf_.erase(0, len + 2);
  }
  return true;
}

bool FakeRedis::Conn::ReadCommands(size_t n) {
  std::vector<std::string> args;
  for (size_t i = 0; i < n; ++i) {
    if (!ReadCommand(&args)) return false;
  }
  return true;
}

bool FakeRedis::Conn::WaitWritable() {
  while (!stop_->load()) {
    pollfd p{fd_, POLLOUT, 0};
    int r = ::poll(&p, 1, kPollSliceMs);
    if (r > 0) return (p.revents & (POLLERR | POLLHUP)) == 0;
  }
  return false;
}

bool FakeRedis::Conn::Send(std::string_view bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    if (!WaitWritable()) return false;
    ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

bool FakeRedis::Conn::Drip(std::string_view bytes, std::chrono::milliseconds gap) {
  for (char b : bytes) {
    if (!Send(std::string_view(&b, 1))) return false;
    // The drip is this server's behaviour, not the test's synchronisation: sleep in slices so
    // that a stopping test is not held up.
    auto until = std::chrono::steady_clock::now() + gap;
    while (std::chrono::steady_clock::now() < until) {
      if (stop_->load()) return false;
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
          until - std::chrono::steady_clock::now(), std::chrono::milliseconds(kPollSliceMs)));
    }
  }
  return true;
}

uint64_t FakeRedis::Conn::Flood(char byte, uint64_t max_bytes) {
  const std::string chunk(64 * 1024, byte);
  uint64_t sent = 0;
  while (sent < max_bytes) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), max_bytes - sent));
    if (!Send(std::string_view(chunk.data(), n))) break;
    sent += n;
  }
  return sent;
}

void FakeRedis::Conn::WaitClosed() {
  while (Fill()) buf_.clear();
}

std::vector<RequestId> AdmitPrompts(RequestManager& m, const std::vector<uint64_t>& lengths, const KvWriters& writers) {
  std::vector<RequestId> ids;
  uint32_t next = 1;
  for (uint64_t n : lengths) {
    std::vector<uint32_t> prompt(n);
    for (uint32_t& t : prompt) t = next++;
    Result<Admission> a = m.Admit(prompt, RequestSpec{});
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    if (!a.ok()) break;
    EXPECT_TRUE(m.Append(a->id, prompt, writers).ok());
    ids.push_back(a->id);
  }
  return ids;
}

}  // namespace tessera::testing

#include "test_support.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

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

RedisServer::RedisServer(int port) : port_(port != 0 ? port : FreePort()) {}

RedisServer::~RedisServer() { Stop(); }

void RedisServer::AddArgs(const std::vector<std::string>& args) { args_.insert(args_.end(), args.begin(), args.end()); }

bool RedisServer::Start() {
  std::vector<std::string> args{"redis-server", "--port",     std::to_string(port_), "--bind",   "127.0.0.1",
                                "--save",       "",           "--appendonly",        "no",       "--dir",
                                dir_.path(),    "--loglevel", "warning"};
  args.insert(args.end(), args_.begin(), args_.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a test that dies does not leave servers behind
    ::execvp("redis-server", argv.data());
    ::_exit(127);
  }
  if (pid_ < 0) return false;
  for (int i = 0; i < 200; ++i) {  // up to 2 s
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {  // exited: bad arguments, port taken
      pid_ = -1;
      return false;
    }
    redisContext* c = redisConnect("127.0.0.1", port_);
    if (c != nullptr && c->err == 0) {
      redisReply* r = static_cast<redisReply*>(redisCommand(c, "PING"));
      bool up = r != nullptr && r->type == REDIS_REPLY_STATUS;
      if (r != nullptr) freeReplyObject(r);
      redisFree(c);
      if (up) return true;
    } else if (c != nullptr) {
      redisFree(c);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

void RedisServer::Stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

}  // namespace tessera::testing

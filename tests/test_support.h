// Shared helpers for the test suite.
#pragma once

#include <string>
#include <sys/types.h>
#include <vector>

#include "tessera/geometry.h"
#include "tessera/ledger.h"

namespace tessera::testing {

// Loads a preset or fails the test.
Geometry Preset(const std::string& name);
// Parses config text or fails the test.
Geometry FromJson(const std::string& json);
// The seed guide's fixture: 2 layers, 8 heads x 128, latent 512, rope 64.
Geometry SeedFixture();
// Computes a ledger or fails the test.
Ledger MustLedger(const Geometry& g, const LedgerOptions& options);
LedgerOptions Context(uint64_t tokens, const std::string& kv_format = "", Engine engine = Engine::kTessera);

// A fresh directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& contents) const;

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
// Runs the tessera binary with `args` (a shell-quoted string).
CommandResult RunTessera(const std::string& args);

// Whether redis-server is on PATH.
bool HaveRedisServer();
// `n` distinct TCP ports on 127.0.0.1 that were free when asked.
std::vector<int> FreePorts(size_t n);

// A real redis-server on 127.0.0.1 and a free port (or `port`), with no persistence and its
// --dir in a fresh temporary directory; started and stopped (SIGKILL) by the test.
class RedisServer {
 public:
  explicit RedisServer(int port = 0);
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  static int FreePort() { return FreePorts(1)[0]; }

  // Extra command-line arguments for the next Start().
  void AddArgs(const std::vector<std::string>& args);
  // Starts the server and waits (up to 2 s) until it answers PING.
  bool Start();
  void Stop();
  int port() const { return port_; }
  const std::string& dir() const { return dir_.path(); }

 private:
  int port_;
  pid_t pid_ = -1;
  TempDir dir_;
  std::vector<std::string> args_;
};

}  // namespace tessera::testing

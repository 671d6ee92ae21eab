// Shared helpers for the test suite.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tessera/block_pool.h"
#include "tessera/geometry.h"
#include "tessera/hash.h"
#include "tessera/ledger.h"
#include "tessera/request_manager.h"
#include "tessera/tier.h"
#include "tessera/weights.h"

namespace tessera {

// The pool's own reference counting, for the pool's and the index's unit tests (everything else
// holds references through PinnedBlocks).
struct BlockPoolTestPeer {
  static Status Allocate(BlockPool& p, uint32_t n, std::vector<BlockId>* out) { return p.Allocate(n, out); }
  static void Ref(BlockPool& p, BlockId b) { p.Ref(b); }
  static void Unref(BlockPool& p, BlockId b) { p.Unref(b); }
};

}  // namespace tessera

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
// The ledger options (engine tessera) that describe the same state as a manager built with
// `options` holding `batch` requests of `context` tokens each.
LedgerOptions LedgerOptionsFor(const ManagerOptions& options, uint64_t context, uint64_t batch);

// A preset's weight shapes (its config.json through WeightShapesFromConfigJson) or fails the test.
WeightShapes PresetShapes(const std::string& name);

// `n` floats uniform in [-scale, scale), drawn from std::mt19937(seed).
std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale = 1.0f);
// Random KV into one record `rec` of format `f`, drawing from `rng` (uniform in [-1, 1)): an
// fp8_ds_mla record quantized from 512 latent then 64 rope values; an indexer record quantized
// (fp8) from its key; any other record filled with random bf16 values (little-endian pairs).
void WriteRandomRecord(const RecordFormat& f, std::span<std::byte> rec, std::mt19937& rng);
// The same through a record view of the pool (either indexer-fp8 page layout).
void WriteRandomRecord(const RecordFormat& f, const RecordView& rec, std::mt19937& rng);
// Admits and prefills one request per length, the prompts consecutive tokens from 1 (so that no
// two share a prefix), through `writers`; the requests' ids, in order. Failures are test failures.
std::vector<RequestId> AdmitPrompts(RequestManager& m, const std::vector<uint64_t>& lengths, const KvWriters& writers);

// A tier that forwards every call to another (owned or borrowed): tests derive from it and
// override the calls they watch or change.
class ForwardingTier : public Tier {
 public:
  explicit ForwardingTier(Tier* under) : under_(under) {}
  explicit ForwardingTier(std::unique_ptr<Tier> under) : owned_(std::move(under)), under_(owned_.get()) {}
  std::string_view name() const override { return under_->name(); }
  bool in_memory() const override { return under_->in_memory(); }
  bool persistent() const override { return under_->persistent(); }
  bool shared() const override { return under_->shared(); }
  Status PutBatch(std::span<const TierRecord* const> records) override { return under_->PutBatch(records); }
  std::vector<std::optional<TierRecord>> GetBatch(std::span<const Hash128> keys) override {
    return under_->GetBatch(keys);
  }
  std::vector<bool> ContainsBatch(std::span<const Hash128> keys) override { return under_->ContainsBatch(keys); }
  std::vector<Hash128> Keys() const override { return under_->Keys(); }
  Status EraseBatch(std::span<const Hash128> keys) override { return under_->EraseBatch(keys); }
  Status Quarantine(const Hash128& key, const std::string& why) override { return under_->Quarantine(key, why); }
  TierCounters counters() const override { return under_->counters(); }

 private:
  std::unique_ptr<Tier> owned_;
  Tier* under_;
};

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

// Whether redis-server is on PATH. Redis tests fail, never skip, without it (a CI image that
// lacks it must not pass them silently): start them with TESSERA_REQUIRE_REDIS_SERVER().
bool HaveRedisServer();
#define TESSERA_REQUIRE_REDIS_SERVER()               \
  ASSERT_TRUE(::tessera::testing::HaveRedisServer()) \
      << "redis-server is not on PATH: run scripts/install-deps.sh (Redis tests fail rather than skip without it)"

// `n` distinct TCP ports on 127.0.0.1 that were free when asked. Nothing reserves them: another
// process may take one before it is bound (RedisServer retries on a fresh port when that happens).
std::vector<int> FreePorts(size_t n);

// A real redis-server on 127.0.0.1, with no persistence and its --dir in a fresh temporary
// directory; started and stopped (SIGKILL) by the test.
class RedisServer {
 public:
  // port 0: Start() picks a free port and, when another process takes it before the server binds
  // it (FreePorts cannot reserve it; a race under `ctest -j`), picks another and retries. Once a
  // start succeeded the port is kept, so a restart comes back at the same address.
  explicit RedisServer(int port = 0);
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  static int FreePort() { return FreePorts(1)[0]; }

  // Extra command-line arguments for the next Start().
  void AddArgs(const std::vector<std::string>& args);
  // Cluster mode: a cluster config file in dir() and the cluster bus on its own free port
  // (bus_port()), chosen together with the client port.
  void EnableCluster();
  // Starts the server and waits (up to 5 s) until it answers PING as this process. false when it
  // could not start (the reason is reported as a test failure).
  bool Start();
  void Stop();
  int port() const { return port_; }
  int bus_port() const { return bus_port_; }
  const std::string& dir() const { return dir_.path(); }

 private:
  enum class Outcome { kUp, kExited, kTimeout };
  Outcome Launch();

  int port_;
  int bus_port_ = 0;
  bool port_fixed_;
  bool cluster_ = false;
  pid_t pid_ = -1;
  TempDir dir_;
  std::vector<std::string> args_;
};

// One command on a fresh connection to the server on 127.0.0.1:port (1 s to connect, 5 s for the
// reply); the reply's type (0: none), its string and its integer. A build without Redis answers
// nothing.
struct RedisReply {
  int type = 0;
  std::string text;
  long long integer = 0;
  bool ok() const;  // a reply that is not an error
};
RedisReply RedisCommand(int port, const std::vector<std::string>& args);

// A Redis value in the version-1 format (a 48-byte header — magic, version 1, format id, key,
// payload length, xxh3-64 of the payload seeded with the key — then the payload): unkeyed, so
// anyone with write access to a server could compute it. Tests plant such forgeries.
std::string ForgeRedisValueV1(const Hash128& key, uint16_t format_id, const std::vector<std::byte>& payload);

// Peak resident memory of this process so far, in bytes (getrusage).
uint64_t PeakRssBytes();

// A scripted — typically hostile — "Redis server" on 127.0.0.1 and a free port: a thread accepts
// connections one at a time and runs `script` on each, then closes it. Scripts read the
// client's commands and answer with whatever bytes the test needs, as slowly as it likes; every
// wait inside watches for the client closing and for the server stopping, so a script never
// outlives its test.
class FakeRedis {
 public:
  class Conn {
   public:
    // The next command (a RESP array of bulk strings); false when the client closed.
    bool ReadCommand(std::vector<std::string>* args);
    // Reads `n` commands, discarding them; false when the client closed first.
    bool ReadCommands(size_t n);
    // Sends `bytes`; false when the client has gone.
    bool Send(std::string_view bytes);
    // Sends `bytes` one byte every `gap` (a drip-feed); false when the client has gone.
    bool Drip(std::string_view bytes, std::chrono::milliseconds gap);
    // Sends `byte` as fast as the client reads, up to `max_bytes`; the bytes sent.
    uint64_t Flood(char byte, uint64_t max_bytes);
    // Waits until the client closes the connection.
    void WaitClosed();

   private:
    friend class FakeRedis;
    Conn(int fd, const std::atomic<bool>* stop) : fd_(fd), stop_(stop) {}
    bool Fill();
    bool WaitWritable();
    int fd_;
    const std::atomic<bool>* stop_;
    std::string buf_;
  };
  using Script = std::function<void(Conn&)>;

  explicit FakeRedis(Script script);
  ~FakeRedis();
  FakeRedis(const FakeRedis&) = delete;
  FakeRedis& operator=(const FakeRedis&) = delete;
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int connections() const { return connections_.load(); }

  // "$<n>\r\n<s>\r\n"
  static std::string Bulk(std::string_view s);
  // A CLUSTER SLOTS reply giving every slot to 127.0.0.1:`port`.
  static std::string SlotMapTo(int port);

 private:
  void Serve();
  int listen_fd_ = -1;
  int port_ = 0;
  Script script_;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

}  // namespace tessera::testing

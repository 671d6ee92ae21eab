// `tessera serve`: one long-running process per host holding a request manager and its tiered
// store (docs/adr/0022-serve-and-kv-events.md; engine KV bytes, V4, auth: docs/adr/0027-serve-engine-kv.md).
//
//   GET  /metrics     Prometheus text: the manager's, the store's and each tier's counters, and
//                     latency histograms of admit, step and promote (tier fetch).
//   GET  /health      200 "ok" while serving.
//   GET  /v1/layout   the token record layout of KV bytes (groups, layers, record bytes).
//   POST /v1/admit    {"tokens":[u32...], "tenant":u32, "cache_salt":u64, "priority":0..100}
//                     -> {"request", "cached_tokens", "cached_blocks", "tier_blocks", "block_table",
//                     "state_restored", "recompute_from", "recompute_tokens"}. Synthetic KV: the
//                     uncached prompt tokens are written at once (the prefill). Engine KV: a JSON
//                     body only reserves (the engine pushes prompt[cached_tokens:] with /v1/step);
//                     a framed body (below) carries the records of every prompt token and the
//                     uncached ones are written.
//   POST /v1/step     {"requests":[id...], "counts":[n...], "tokens":[u32...], "tenant":u32}: request i appends
//                     counts[i] tokens -> {"codes":[...], "block_tables":[[...]...]}. Engine KV:
//                     a framed body carrying the tokens' records (in the order of "tokens").
//   POST /v1/free     {"request": id, "tenant": u32}
//   Request ids are handles (u64: the table slot's generation << 32 | the slot): an id kept past
//   its free names no request even once its slot is reused. Step, free and block reads carry the
//   caller's tenant (default 0) and act only on requests that tenant admitted; another tenant's
//   request is answered as one that does not exist (docs/adr/0031-serve-hardening.md).
//   POST /v1/reset    drops the prefix cache (refused while requests are live): AllBlocksCleared.
//   GET  /v1/requests/{id}/blocks/{i}[?count=N][&tenant=T]   the records of the tokens block slots i..i+N-1
//                     of a live request hold (application/octet-stream, tokens x record bytes;
//                     a batch of N > 1 at most http.max_body_bytes).
//   KV events         ZeroMQ PUB, multipart (topic, 8-byte big-endian sequence, msgpack payload),
//                     the payload a KVEventBatch as vLLM encodes it (array-like, tagged events).
//
// Framed body (engine KV): "TKV1", a u32 little-endian header length H (1..65536), H bytes of the
// JSON header (the call's JSON body), then the records: for each token in order, for each
// per-token pool group in order, for each of its layers, the record's planes back to back
// (`ServeCore::record_bytes()` bytes a token, GET /v1/layout). Every length is checked before
// anything is written; a wrong byte count is a 400 naming "records".
//
// KV bytes: `kv_source: synthetic` (the default) fills the pool with a deterministic function of
// the token prefix, the layer and the group, as in `tessera simulate`: the server runs the block
// and tier plane of a fleet — admission, prefix hits, tiers, checkpoints, events — not a model.
// `kv_source: engine` takes the bytes an engine pushes, and gives them back from a prefix hit
// (also one promoted from a tier). Models with sliding windows (DeepSeek-V4) run with synthetic
// KV only (their window rows and compressor state are not part of the frame).
//
// Authentication: with `http.token_file`, every /v1/ call needs "Authorization: Bearer <token>"
// (compared in constant time) or gets 401; /health and /metrics stay open.
//
// Thread-safety: ServeCore serialises every manager call under one mutex (the manager has a single
// owner at a time); MetricsText reads atomics and the store's snapshot and may run concurrently.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tessera/kv_events.h"
#include "tessera/layout.h"
#include "tessera/mutex.h"
#include "tessera/request_manager.h"
#include "tessera/status.h"
#include "tessera/tiered_store.h"

namespace tessera {

// Every key of the YAML file, with its environment override TESSERA_SERVE_<KEY> (dots and the
// key upper-cased, '.' -> '_': http.listen -> TESSERA_SERVE_HTTP_LISTEN). Documented in
// docs/adr/0022-serve.md.
struct ServeConfig {
  std::string model = "deepseek-v3";  // preset name
  std::string kv_format;              // empty: the model's default
  std::optional<uint64_t> block_tokens;
  uint32_t capacity_blocks = 4096;
  // Live requests at once: no ceiling by default (the manager's tables grow on demand); a set
  // ceiling (1 .. 2^20) refuses the admission past it (503 on "requests", naming max_requests).
  uint32_t max_requests = kNoRequestLimit;
  // "host": the pool holds (synthetic) KV bytes, which the tiers store; "unbacked": bookkeeping
  // only, for blocks an engine keeps on its device (events say medium GPU; no tiers).
  bool pool_unbacked = false;
  // kv_source: "synthetic" (false) or "engine" (true): where the pool's KV bytes come from.
  bool kv_engine = false;
  // window_strategy (models with sliding windows): recompute | snapshot | retain.
  SwaStrategy window_strategy = SwaStrategy::kRecompute;
  // http.*
  std::string http_listen = "127.0.0.1:8080";  // host:port (port 0: any free port)
  uint64_t http_max_body_bytes = 1u << 20;
  // Workers: each connection holds one while its request is read and answered (a slow client
  // holds it at most header_timeout_ms + body_timeout_ms).
  uint32_t http_threads = 32;
  // The request line and headers must arrive within this (from the connection's start), and
  // every read of the body must make progress within it.
  uint32_t http_header_timeout_ms = 5000;
  // The whole body must arrive within this after the headers (else 408, connection closed).
  uint32_t http_body_timeout_ms = 10000;
  // Connections at once from one client address (IPv4/IPv6 address, any port); more are closed
  // before their request is read.
  uint32_t http_max_connections_per_client = 8;
  std::string http_token_file;  // non-empty: /v1/ calls need "Authorization: Bearer <its text>"
  // events.*
  bool events_enabled = true;
  std::string events_endpoint = "tcp://127.0.0.1:5557";  // bound (port * or 0: any free port)
  std::string events_topic = "kv-events";
  uint32_t events_data_parallel_rank = 0;
  uint32_t events_hwm = 100000;
  uint32_t events_buffer = 1u << 16;  // events kept between two publications (then dropped, counted)
  uint32_t events_interval_ms = 5;    // how often the publisher drains and sends (1 .. 1000)
  // tiers.*
  uint64_t host_tier_bytes = 0;  // > 0: a host tier above the others
  std::string disk_dir;
  uint64_t disk_bytes = 0;  // 0: unlimited
  WritePolicy tier_write = WritePolicy::kWriteThrough;
  std::string redis;                       // redis://host:port
  std::vector<std::string> redis_cluster;  // host:port seeds
  std::string redis_secret_file;           // the fleet's secret (>= 16 bytes)
  std::string redis_namespace = "tessera";
  uint32_t redis_timeout_ms = 200;
};

// Reads the YAML file and applies the overrides in `env` (name -> value; names not starting with
// TESSERA_SERVE_ are ignored). Errors name the key: kInvalidArgument on "config" for malformed
// YAML (with its line), on the key for an unknown key, a value of the wrong type or out of range.
Result<ServeConfig> LoadServeConfig(const std::string& path, const std::map<std::string, std::string>& env);
// As LoadServeConfig, from YAML text (tests).
Result<ServeConfig> ParseServeConfig(std::string_view yaml, const std::map<std::string, std::string>& env);

// "redis://host:port" (or host:port) -> host, port. Errors name `field`.
Result<std::pair<std::string, int>> ParseRedisAddress(std::string_view url, std::string_view field);

// The fleet's secret from a file: at least 16 bytes, at most 4 KiB, a trailing newline dropped;
// a symbolic link is refused. Errors name `field`.
Result<std::vector<std::byte>> ReadSecretFile(const std::string& path, std::string_view field);

// A Redis tier (`url`: redis://host:port) or a Redis Cluster tier (`cluster`: host:port seeds;
// exactly one of the two), checked to answer now: kIoError on "redis" / "redis-cluster" when it
// does not (a server lost later degrades to misses, as the tiers do). Keys live in
// RedisNamespace(model, format, 0) with `key_namespace` (tiers.redis_namespace: 1..64 bytes of
// [A-Za-z0-9._-]) in place of its leading "tessera". Domain 0 on purpose: one namespace per
// server configuration; tenants are kept apart by the keys themselves (both a block's keys hash
// its tenant domain), not by the namespace.
Result<std::unique_ptr<Tier>> OpenReachableRedisTier(const std::string& url, const std::vector<std::string>& cluster,
                                                     const std::vector<std::byte>& secret,
                                                     const std::string& key_namespace, std::string_view model,
                                                     std::string_view format, uint32_t timeout_ms);

// Latency histogram (seconds) with fixed buckets; Observe is lock-free.
class LatencyHistogram {
 public:
  static constexpr std::array<double, 14> kBounds = {1e-6, 5e-6,   1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
                                                     1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2, 1e-1,   1.0};
  void Observe(uint64_t nanos);
  // "# HELP/# TYPE histogram" and the _bucket/_sum/_count lines.
  void Render(const std::string& name, const std::string& help, std::string* out) const;

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_nanos_{0};
};

// Encodes KV events as vLLM's KVEventBatch: [ts, [event...], data_parallel_rank], each event a
// tagged array ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
// medium, lora_name(, extra_keys)], ["BlockRemoved", block_hashes, medium], ["AllBlocksCleared"].
// Hashes are 16-byte big-endian binaries (Hash128 hi, then lo). A non-zero tenant domain is
// sent as extra_keys, one ["tenant_domain", d] per block.
std::string EncodeKvEventBatch(std::span<const KvEvent> events, double ts, uint32_t data_parallel_rank);
// As above, from a log, appended to *out.
void EncodeKvEventBatch(const KvEventLog& events, double ts, uint32_t data_parallel_rank, std::string* out);

// A request id as the HTTP API shows it, and back (generation << 32 | slot).
inline uint64_t RequestHandle(RequestId r) { return (uint64_t{r.generation} << 32) | r.value; }
inline RequestId RequestOfHandle(uint64_t h) {
  return RequestId{static_cast<uint32_t>(h & UINT32_MAX), static_cast<uint32_t>(h >> 32)};
}

class EventPublisher;
class TimedSource;

// The server without its HTTP front: what the handlers and the benchmarks call.
class ServeCore {
 public:
  // Opens the tiers (a Redis that does not answer is kIoError on "redis"), the manager and,
  // when enabled, the event publisher. `warnings` receives e.g. a key file readable by others.
  static Result<std::unique_ptr<ServeCore>> Create(const ServeConfig& config, std::vector<std::string>* warnings);
  ~ServeCore();

  // One HTTP API call: (status, JSON body). `path` is "/v1/admit", "/v1/step", "/v1/free" or
  // "/v1/reset"; `body` JSON, or for admit and step a framed body (engine KV, above).
  std::pair<int, std::string> Handle(std::string_view path, std::string_view body);
  // A GET of the API: "/v1/layout" (JSON) or "/v1/requests/{id}/blocks/{i}[?count=N]" (the
  // records, bytes; `*binary` set). (status, body).
  std::pair<int, std::string> HandleGet(std::string_view path, bool* binary);
  // Bytes of one token's records over every per-token group and layer (the frame's unit).
  uint64_t record_bytes() const { return record_bytes_; }
  // True when `authorization` (the header's value, or nullptr) carries the configured token, or
  // no token is configured. Constant time in the token's length.
  bool Authorized(const char* authorization) const;
  std::string MetricsText() const;
  // Where events are published (the bound endpoint), empty when disabled.
  std::string events_endpoint() const;

  // The calls behind the API (benchmarks and tests use them directly).
  Result<Admission> Admit(std::span<const uint32_t> prompt, const RequestSpec& spec);
  // Appends counts[i] tokens to requests[i]; codes[i] says how request i fared.
  Status Step(std::span<const RequestId> requests, std::span<const uint32_t> counts, std::span<const uint32_t> tokens,
              std::vector<StatusCode>* codes);
  Status Free(RequestId r);
  // As Step and Free on behalf of `tenant` (nullopt: any): a request of another tenant is
  // refused (kInvalidArgument, as one that does not exist) and left unchanged.
  Status StepAs(std::optional<uint32_t> tenant, std::span<const RequestId> requests, std::span<const uint32_t> counts,
                std::span<const uint32_t> tokens, std::vector<StatusCode>* codes);
  Status FreeAs(std::optional<uint32_t> tenant, RequestId r);
  // Graceful shutdown: every sealed block checkpointed to the persistent tier, the store
  // flushed, the last events published. Returns the checkpoint's error, if any.
  Status Shutdown();
  // Test and benchmark access (hold no other call concurrently).
  RequestManager& manager() { return *manager_; }
  // Serves HTTP on `config.http_listen` in this process until destroyed (RunServe and the
  // benchmarks); the bound port.
  class Http;
  struct HttpStop {
    void operator()(Http* http) const;
  };
  using HttpHandle = std::unique_ptr<Http, HttpStop>;
  static Result<HttpHandle> StartHttp(ServeCore* core);
  static int HttpPort(const Http& http);

 private:
  ServeCore() = default;
  // record_offset_ and record_bytes_ from the manager's pool groups (engine KV's frame).
  Status PlanRecords();
  void PublishLocked() REQUIRES(mu_);
  std::pair<int, std::string> HandleAdmit(std::string_view body);
  std::pair<int, std::string> HandleStep(std::string_view body);
  std::pair<int, std::string> HandleFree(std::string_view body);
  std::pair<int, std::string> HandleReset();
  std::pair<int, std::string> LayoutReply() const;
  std::pair<int, std::string> HandleAdmitFramed(std::string_view body);
  std::pair<int, std::string> HandleStepFramed(std::string_view body);
  std::pair<int, std::string> AdmitReply(const Admission& a);
  std::pair<int, std::string> StepReply(std::span<const RequestId> requests, std::span<const StatusCode> codes,
                                        uint32_t tenant);
  // Admit and Step with the engine's records (`records`: tokens x record_bytes_, checked).
  Result<Admission> AdmitLocked(std::span<const uint32_t> prompt, const RequestSpec& spec, const std::byte* records)
      REQUIRES(mu_);
  void StepLocked(std::span<const RequestId> requests, std::span<const uint32_t> counts,
                  std::span<const uint32_t> tokens, const std::byte* records, std::optional<uint32_t> tenant,
                  std::vector<StatusCode>* codes) REQUIRES(mu_);
  KvWriters WritersFor(const std::vector<uint64_t>* h, const std::byte* records, uint64_t first) const;

  ServeConfig config_;
  mutable Mutex mu_;  // serialises every manager call (the manager has one owner at a time)
  std::unique_ptr<TieredStore> store_;
  std::unique_ptr<TimedSource> timed_;
  std::unique_ptr<RequestManager> manager_;
  std::unique_ptr<EventPublisher> publisher_;
  // Per live request: the rolling hash of its token prefix at every position (the synthetic KV).
  std::unordered_map<uint32_t, std::vector<uint64_t>> prefix_hash_ GUARDED_BY(mu_);
  LatencyHistogram admit_latency_, step_latency_;
  std::shared_ptr<LatencyHistogram> promote_latency_;
  std::atomic<uint64_t> http_errors_{0};
  std::atomic<uint64_t> kv_bytes_written_{0};  // engine records written into the pool
  std::atomic<uint64_t> kv_bytes_read_{0};     // records served by block reads
  // Engine KV: where (group, layer)'s record starts in a token's records (per-token groups; -1
  // for the others), and the bytes of one token's records.
  std::vector<std::vector<int64_t>> record_offset_;
  uint64_t record_bytes_ = 0;
  std::vector<std::byte> http_token_;  // empty: no authentication
  friend class ServeHttp;
};

// Runs the server until SIGTERM or SIGINT, then shuts down gracefully. Prints
// "tessera serve: ready http=HOST:PORT events=ENDPOINT" on stdout once serving. Exit codes: 0
// after a clean shutdown, 2 for a configuration error, 1 for any other failure.
int RunServe(const ServeConfig& config);

}  // namespace tessera

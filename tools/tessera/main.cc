// tessera: the command-line front end.
//
//   tessera report                      the main job: ledgers for DeepSeek-V3 and V4-Pro and the claim check
//   tessera ledger --model NAME --context 128k [...]
//   tessera receipt --model NAME --context 128k --out PREFIX [--format html [--gpu H200-141G ...]]
//   tessera --version
//   tessera layout --model NAME          block span and page bytes per cache group
//   tessera simulate | stats [...]       the agents workload through the request manager (stats:
//                                        its counters as Prometheus text); --disk DIR adds tiers
//   tessera tier fsck | stats DIR        verify or count a disk tier
//   tessera serve --config FILE [--redis URL | --redis-cluster H:P,...]   the long-running server
//                                        (/metrics, /health, the /v1 API, KV events over ZeroMQ)
//   tessera plan --model NAME --gpu H200-141G --tp 8 --context 128k [...]   capacity per engine
//   tessera price --model NAME --gpu H200-141G --batch 64 --context 128k      absorbed vs naive MLA
//   tessera models | formats
//   tessera generate --model tiny-mla --prompt-tokens 1,2,3 --steps N --weights FILE [...]
//                                        greedy decode of a tiny model over the manager's pages
//
// Exit codes: 0 success; 2 usage or input error (one line on stderr naming the field, nothing
// written); 1 any other failure.
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

extern char** environ;

#include "tessera/codec.h"
#include "tessera/disk_tier.h"
#include "tessera/file_io.h"
#include "tessera/geometry.h"
#include "tessera/gpu.h"
#include "tessera/layout.h"
#include "tessera/ledger.h"
#include "tessera/model.h"
#include "tessera/plan.h"
#include "tessera/price.h"
#include "tessera/reconcile.h"
#include "tessera/units.h"
#include "tessera/v4_model.h"
#include "tessera/weights.h"
#include "tessera_tools/claims.h"
#include "tessera_tools/html.h"
#include "tessera_tools/plan_render.h"
#include "tessera_tools/receipt.h"
#include "tessera_tools/render.h"
#include "tessera_tools/report.h"
#include "tessera_tools/serve.h"
#include "tessera_tools/simulate.h"
#include "tessera_tools/version.h"

namespace {

using namespace tessera;

int Fail(const Status& st) {
  std::fprintf(stderr, "tessera: error: %s\n", st.ToString().c_str());
  if (st.code() == StatusCode::kInternal) return 1;
  if (st.code() == StatusCode::kIoError && st.field() == "out") return 1;
  if (st.code() == StatusCode::kFailedPrecondition && st.field() == "dir") return 1;  // in use: try again
  return 2;
}

// --model NAME (a preset) or --config PATH (a config.json), exactly one.
Result<Geometry> LoadModelOrConfig(const std::string& model, const std::string& config) {
  if (!model.empty() && !config.empty()) return InvalidArgument("model", "give --model or --config, not both");
  if (!config.empty()) return LoadConfigFile(config);
  if (model.empty()) return InvalidArgument("model", "missing: give --model NAME or --config PATH");
  return LoadPreset(model);
}

// The layout flags (--kv-format, --indexer-format, --block-tokens, --kernel): each registered
// here once, for every subcommand that takes them; a null target leaves the flag out, and a
// subcommand whose flag means something narrower (run's tiny models) passes its own help.
struct LayoutFlags {
  std::string* kv_format = nullptr;
  std::string* indexer_format = nullptr;
  std::string* block_tokens = nullptr;
  std::string* kernel = nullptr;
  const char* kv_format_help = "main record format (see `tessera formats`)";
  const char* indexer_format_help = "indexer record format";
  const char* block_tokens_help = "tokens per block (default: derived)";
  const char* kernel_help =
      "flashmla | cutlass-mla | flashinfer-mla | generic (tessera and vllm engines; default flashmla)";
};

void AddLayoutOptions(CLI::App* app, const LayoutFlags& f) {
  if (f.kv_format != nullptr) app->add_option("--kv-format", *f.kv_format, f.kv_format_help);
  if (f.indexer_format != nullptr) app->add_option("--indexer-format", *f.indexer_format, f.indexer_format_help);
  if (f.block_tokens != nullptr) app->add_option("--block-tokens", *f.block_tokens, f.block_tokens_help);
  if (f.kernel != nullptr) app->add_option("--kernel", *f.kernel, f.kernel_help);
}

// --block-tokens' text: unset (empty) or a count (errors name block-tokens).
Result<std::optional<uint64_t>> ParseBlockTokens(const std::string& text) {
  if (text.empty()) return std::optional<uint64_t>();
  TESSERA_ASSIGN_OR_RETURN(uint64_t bt, ParseUnsigned(text, "block-tokens"));
  return std::optional<uint64_t>(bt);
}

// Options shared by ledger and receipt, kept as text so that errors name the option.
struct ModelArgs {
  std::string model;
  std::string config;
  std::string context;
  std::string batch = "1";
  std::string kv_format;
  std::string indexer_format;
  std::string block_tokens;
  std::string tp = "1";
  std::string dcp = "1";
  std::string spec_tokens = "0";
  bool include_mtp = false;
  std::string engine = "tessera";
  std::string kernel = "flashmla";
  std::string observed;
  std::string observed_trace;
  std::string observed_scope = "rank";
  std::string swa_strategy = "recompute";
  std::string prefill_chunk = "8192";
  std::string max_model_len;
  std::string kv_scale_format;
  std::string indexer_scale_format;
  std::string indexer_layout;

  void Register(CLI::App* app) {
    app->add_option("--model", model, "preset name (see `tessera models`)");
    app->add_option("--config", config, "path to a Hugging Face config.json");
    app->add_option("--context", context, "tokens per request: 8192, 128k (=131072), 1m (=1048576)");
    app->add_option("--batch", batch, "requests (default 1)");
    AddLayoutOptions(
        app,
        {.kv_format = &kv_format, .indexer_format = &indexer_format, .block_tokens = &block_tokens, .kernel = &kernel});
    app->add_option("--tp", tp, "tensor-parallel ranks (default 1)");
    app->add_option("--dcp", dcp, "decode-context-parallel ranks (default 1)");
    app->add_option("--spec-tokens", spec_tokens, "speculative draft tokens per step (default 0)");
    app->add_flag("--include-mtp", include_mtp, "count the MTP layer(s) as holding cache");
    app->add_option("--engine", engine, "tessera | vllm | sglang (default tessera)");
    app->add_option("--observed", observed, "bytes an engine really allocated, to reconcile");
    app->add_option("--observed-trace", observed_trace, "allocation trace file: one \"<bytes> [label]\" per line");
    app->add_option("--observed-scope", observed_scope, "rank | all (default rank)");
    app->add_option("--swa-strategy", swa_strategy, "recompute | snapshot | retain (models with windows)");
    app->add_option("--prefill-chunk", prefill_chunk, "tokens per prefill step (default 8192)");
    app->add_option("--max-model-len", max_model_len,
                    "vllm and sglang engines: the longest context the engine admits, vLLM's --max-model-len "
                    "(default: max(max_position_embeddings, context))");
    app->add_option("--kv-scale-format", kv_scale_format,
                    "scales of the fp32-scaled main record: amax | ue8m0 (default: what the engine writes)");
    app->add_option("--indexer-scale-format", indexer_scale_format,
                    "scales of the indexer record: amax | ue8m0 (default: what the engine writes)");
    app->add_option(
        "--indexer-layout", indexer_layout,
        "indexer-fp8 pages: region-major | per-token (default region-major, as vLLM and SGLang write them)");
  }

  Result<Geometry> LoadGeometry() const { return LoadModelOrConfig(model, config); }

  Result<LedgerOptions> Options() const {
    LedgerOptions o;
    if (context.empty()) return InvalidArgument("context", "missing: give --context TOKENS (e.g. 128k)");
    TESSERA_ASSIGN_OR_RETURN(o.context_tokens, ParseTokenCount(context, "context"));
    TESSERA_ASSIGN_OR_RETURN(o.batch, ParseUnsigned(batch, "batch"));
    o.kv_format = kv_format;
    o.indexer_format = indexer_format;
    TESSERA_ASSIGN_OR_RETURN(o.block_tokens, ParseBlockTokens(block_tokens));
    auto small = [](const std::string& text, const char* field) -> Result<uint32_t> {
      TESSERA_ASSIGN_OR_RETURN(uint64_t v, ParseUnsigned(text, field));
      if (v > 65536) return OutOfRange(field, std::to_string(v) + " is above 65536");
      return static_cast<uint32_t>(v);
    };
    TESSERA_ASSIGN_OR_RETURN(o.tp, small(tp, "tp"));
    TESSERA_ASSIGN_OR_RETURN(o.dcp, small(dcp, "dcp"));
    TESSERA_ASSIGN_OR_RETURN(o.spec_tokens, small(spec_tokens, "spec-tokens"));
    o.include_mtp = include_mtp;
    TESSERA_ASSIGN_OR_RETURN(o.engine, ParseEngine(engine));
    TESSERA_ASSIGN_OR_RETURN(o.kernel, ParseKernel(kernel));
    TESSERA_ASSIGN_OR_RETURN(o.swa_strategy, ParseSwaStrategy(swa_strategy));
    TESSERA_ASSIGN_OR_RETURN(o.prefill_chunk_tokens, ParseTokenCount(prefill_chunk, "prefill-chunk"));
    if (o.prefill_chunk_tokens == 0) return InvalidArgument("prefill-chunk", "must be positive");
    if (!max_model_len.empty()) {
      TESSERA_ASSIGN_OR_RETURN(uint64_t m, ParseTokenCount(max_model_len, "max-model-len"));
      o.max_model_len = m;
    }
    if (!kv_scale_format.empty()) {
      TESSERA_ASSIGN_OR_RETURN(ScaleFormat f, ParseScaleFormat(kv_scale_format, "kv-scale-format"));
      o.kv_scale_format = f;
    }
    if (!indexer_scale_format.empty()) {
      TESSERA_ASSIGN_OR_RETURN(ScaleFormat f, ParseScaleFormat(indexer_scale_format, "indexer-scale-format"));
      o.indexer_scale_format = f;
    }
    if (!indexer_layout.empty()) {
      TESSERA_ASSIGN_OR_RETURN(Packing p, ParsePacking(indexer_layout, "indexer-layout"));
      o.indexer_packing = p;
    }
    return o;
  }

  // The observation: a byte count, or an allocation trace's total and labels.
  Result<std::optional<AllocationTrace>> Observed() const {
    if (!observed.empty() && !observed_trace.empty()) {
      return InvalidArgument("observed", "give --observed or --observed-trace, not both");
    }
    if (observed_scope != "rank" && observed_scope != "all") {
      return InvalidArgument("observed-scope", "must be rank or all (got \"" + observed_scope + "\")");
    }
    if (!observed.empty()) {
      TESSERA_ASSIGN_OR_RETURN(uint64_t v, ParseUnsigned(observed, "observed"));
      return std::optional<AllocationTrace>(AllocationTrace{v, {}});
    }
    if (!observed_trace.empty()) {
      TESSERA_ASSIGN_OR_RETURN(AllocationTrace t, ReadLabelledAllocationTrace(observed_trace));
      return std::optional<AllocationTrace>(std::move(t));
    }
    return std::optional<AllocationTrace>();
  }

  std::string Source() const { return config.empty() ? "preset " + model : config; }
};

// Standard output is an output too: a short write (a full disk, a closed pipe) is a failure,
// not a silent truncation.
Status WriteStdout(const std::string& text) {
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
    return IoError("out", "cannot write to standard output");
  }
  return Status::Ok();
}

Status Emit(const std::string& text, const std::string& out) {
  if (out.empty()) return WriteStdout(text);
  return WriteFilesAtomically({{out, text}});
}

int RunLedger(const ModelArgs& args, const std::string& format_name, bool check_claims, const std::string& out) {
  Result<OutputFormat> format = ParseOutputFormat(format_name);
  if (!format.ok()) return Fail(format.status());
  bool has_model = !args.model.empty() || !args.config.empty() || !args.context.empty();
  std::string text;
  if (has_model || !check_claims) {
    Result<Geometry> g = args.LoadGeometry();
    if (!g.ok()) return Fail(g.status());
    Result<LedgerOptions> o = args.Options();
    if (!o.ok()) return Fail(o.status());
    Result<std::optional<AllocationTrace>> observed = args.Observed();
    if (!observed.ok()) return Fail(observed.status());
    Result<Ledger> l = ComputeLedger(*g, *o);
    if (!l.ok()) return Fail(l.status());
    std::optional<Reconciliation> rec;
    if (observed->has_value()) {
      Result<Reconciliation> r =
          Reconcile(*g, *l, (*observed)->total, args.observed_scope == "all", (*observed)->labels);
      if (!r.ok()) return Fail(r.status());
      rec = *r;
    }
    text = RenderLedger(*l, *format, rec ? &*rec : nullptr);
  }
  if (check_claims) {
    Result<ClaimCheck> c = CheckSeedClaims();
    if (!c.ok()) return Fail(c.status());
    std::string claims = RenderClaims(*c, *format);
    if (*format == OutputFormat::kJson && !text.empty()) {
      text = "{\"ledger\": " + text + ", \"claim_check\": " + claims + "}\n";
    } else {
      text += (text.empty() ? "" : "\n") + claims;
    }
  }
  Status st = Emit(text, out);
  return st.ok() ? 0 : Fail(st);
}

int RunReceipt(const ModelArgs& args, const std::string& out) {
  if (out.empty()) {
    return Fail(
        InvalidArgument("out", "missing: give --out PREFIX (writes PREFIX.md and PREFIX.json, or PREFIX.html)"));
  }
  Result<Geometry> g = args.LoadGeometry();
  if (!g.ok()) return Fail(g.status());
  Result<LedgerOptions> o = args.Options();
  if (!o.ok()) return Fail(o.status());
  Result<std::optional<AllocationTrace>> observed = args.Observed();
  if (!observed.ok()) return Fail(observed.status());
  std::optional<uint64_t> observed_bytes;
  if (observed->has_value()) observed_bytes = (*observed)->total;
  ReceiptRequest req{args.Source(), *o, observed_bytes, args.observed_scope == "all"};
  Result<Receipt> r = BuildReceipt(*g, req);
  if (!r.ok()) return Fail(r.status());
  Status st = WriteFilesAtomically({{out + ".md", r->markdown}, {out + ".json", r->json}});
  if (!st.ok()) return Fail(st);
  int passed = 0;
  for (const ReceiptCheck& c : r->checks) passed += c.passed ? 1 : 0;
  std::printf("wrote %s.md and %s.json (%d of %zu checks passed)\n", out.c_str(), out.c_str(), passed,
              r->checks.size());
  return 0;
}

int RunReport(const std::string& format_name) {
  Result<OutputFormat> format = ParseOutputFormat(format_name);
  if (!format.ok()) return Fail(format.status());
  Result<std::string> text = RenderReport(*format);
  if (!text.ok()) return Fail(text.status());
  Status st = WriteStdout(*text);
  return st.ok() ? 0 : Fail(st);
}

// Options of `simulate` and `stats`, kept as text so that errors name the option.
struct SimulateArgs {
  std::string scenario = "agents";
  std::string model = "deepseek-v3";
  std::string config;
  std::string kv_format;
  std::string agents = "16";
  std::string independent;
  std::string shared_tokens = "1024";
  std::string unique_tokens = "128";
  std::string block_tokens;
  std::string capacity_blocks = "0";
  std::string tenants = "1";
  std::string hash = "xxh3";
  std::string hash_bits = "128";
  std::string seed = "1";
  std::string swa_strategy;
  std::string disk;
  std::string tier_write = "write-through";
  std::string host_tier_bytes = "0";
  std::string redis;
  std::string redis_cluster;
  std::string redis_secret_file;

  void Register(CLI::App* app) {
    app->add_option("--scenario", scenario, "agents (the only scenario so far)");
    app->add_option("--model", model, "preset name (default deepseek-v3)");
    app->add_option("--config", config, "path to a Hugging Face config.json");
    AddLayoutOptions(app, {.kv_format = &kv_format, .block_tokens = &block_tokens});
    app->add_option("--agents", agents, "agents forked from the orchestrator (default 16)");
    app->add_option("--independent", independent, "agents arriving on their own (default agents/2)");
    app->add_option("--shared-tokens", shared_tokens, "system prompt + documents + tools (default 1024)");
    app->add_option("--unique-tokens", unique_tokens, "each agent's own tokens (default 128)");
    app->add_option("--capacity-blocks", capacity_blocks, "pool capacity (default: enough for the first wave)");
    app->add_option("--tenants", tenants, "tenant domains (default 1)");
    app->add_option("--hash", hash, "xxh3 | sha256 (content key)");
    app->add_option("--hash-bits", hash_bits, "truncate content keys to B bits (adversarial self-test)");
    app->add_option("--seed", seed, "workload and key seed (default 1)");
    app->add_option("--swa-strategy", swa_strategy,
                    "recompute | snapshot | retain (models with windows; default: all three)");
    app->add_option("--disk", disk,
                    "a disk tier in DIR behind the pool; a second run over DIR starts cold and hits from disk");
    app->add_option(
        "--tier-write", tier_write,
        "write-through (default: every sealed block at seal) | write-back (what the pool evicts, the rest at exit)");
    app->add_option("--host-tier-bytes", host_tier_bytes, "a host tier of this size above the disk (e.g. 64MiB)");
    app->add_option("--redis", redis, "a Redis tier below the others: redis://host:port (checked at start)");
    app->add_option("--redis-cluster", redis_cluster, "a Redis Cluster tier below the others: host:port,... seeds");
    app->add_option("--redis-secret-file", redis_secret_file,
                    "the fleet's secret for --redis/--redis-cluster (>= 16 bytes; also keys the prefix hashes)");
  }

  Result<std::pair<Geometry, AgentScenario>> Parse() const {
    if (scenario != "agents")
      return InvalidArgument("scenario", "unknown scenario \"" + scenario + "\" (known: agents)");
    Result<Geometry> g = config.empty() ? LoadPreset(model) : LoadConfigFile(config);
    if (!g.ok()) return g.status();
    AgentScenario s;
    auto u32 = [](const std::string& text, const char* field) -> Result<uint32_t> {
      TESSERA_ASSIGN_OR_RETURN(uint64_t v, ParseUnsigned(text, field));
      if (v > UINT32_MAX) return OutOfRange(field, "too large");
      return static_cast<uint32_t>(v);
    };
    s.kv_format = kv_format;
    TESSERA_ASSIGN_OR_RETURN(s.agents, u32(agents, "agents"));
    s.independent = s.agents / 2;
    if (!independent.empty()) {
      TESSERA_ASSIGN_OR_RETURN(s.independent, u32(independent, "independent"));
    }
    TESSERA_ASSIGN_OR_RETURN(s.shared_tokens, ParseTokenCount(shared_tokens, "shared-tokens"));
    TESSERA_ASSIGN_OR_RETURN(s.unique_tokens, ParseTokenCount(unique_tokens, "unique-tokens"));
    TESSERA_ASSIGN_OR_RETURN(s.block_tokens, ParseBlockTokens(block_tokens));
    TESSERA_ASSIGN_OR_RETURN(s.capacity_blocks, u32(capacity_blocks, "capacity-blocks"));
    TESSERA_ASSIGN_OR_RETURN(s.tenants, u32(tenants, "tenants"));
    TESSERA_ASSIGN_OR_RETURN(s.hash, ParseHashAlgorithm(hash));
    TESSERA_ASSIGN_OR_RETURN(s.hash_bits, u32(hash_bits, "hash-bits"));
    TESSERA_ASSIGN_OR_RETURN(s.seed, ParseUnsigned(seed, "seed"));
    if (!swa_strategy.empty()) {
      TESSERA_ASSIGN_OR_RETURN(SwaStrategy st, ParseSwaStrategy(swa_strategy));
      s.swa_strategy = st;
    }
    s.disk_dir = disk;
    TESSERA_ASSIGN_OR_RETURN(s.tier_write, ParseWritePolicy(tier_write));
    TESSERA_ASSIGN_OR_RETURN(s.host_tier_bytes, ParseByteSize(host_tier_bytes, "host-tier-bytes"));
    if (s.host_tier_bytes > 0 && disk.empty()) {
      return InvalidArgument("host-tier-bytes", "needs --disk (the host tier sits above a disk tier)");
    }
    s.redis = redis;
    for (size_t start = 0; start < redis_cluster.size();) {
      size_t end = redis_cluster.find(',', start);
      if (end == std::string::npos) end = redis_cluster.size();
      if (end > start) s.redis_cluster.push_back(redis_cluster.substr(start, end - start));
      start = end + 1;
    }
    if (!redis.empty() || !redis_cluster.empty()) {
      if (redis_secret_file.empty())
        return InvalidArgument("redis-secret-file", "missing: --redis needs the fleet's secret");
      TESSERA_ASSIGN_OR_RETURN(s.redis_secret, ReadSecretFile(redis_secret_file, "redis-secret-file"));
    }
    return std::make_pair(*g, s);
  }
};

// What a long run is doing, on standard error when it is a terminal and the run has taken more
// than 2 s (TESSERA_PROGRESS_DELAY_MS overrides the delay, for tests); nothing otherwise, so
// pipes, files and CI logs stay clean (ADR 0034). The line is rewritten in place and cleared at
// the end.
class TtyProgress {
 public:
  explicit TtyProgress(std::string command) : command_(std::move(command)), tty_(::isatty(STDERR_FILENO) == 1) {
    if (const char* d = std::getenv("TESSERA_PROGRESS_DELAY_MS"); d != nullptr) {
      delay_ = std::chrono::milliseconds(std::strtoll(d, nullptr, 10));
    }
  }
  ~TtyProgress() {
    if (shown_) std::fputs("\r\033[K", stderr);
  }
  TtyProgress(const TtyProgress&) = delete;
  TtyProgress& operator=(const TtyProgress&) = delete;
  void operator()(const std::string& stage) {
    if (!tty_) return;
    const auto elapsed = std::chrono::steady_clock::now() - start_;
    if (elapsed < delay_) return;
    const long long secs = std::chrono::duration_cast<std::chrono::seconds>(elapsed).count();
    std::fprintf(stderr, "\r\033[Ktessera %s: %s (%lld s)", command_.c_str(), stage.c_str(), secs);
    std::fflush(stderr);
    shown_ = true;
  }

 private:
  std::string command_;
  bool tty_;
  bool shown_ = false;
  std::chrono::steady_clock::duration delay_ = std::chrono::seconds(2);
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

int RunSimulate(const SimulateArgs& args, const std::string& format_name, bool prometheus) {
  Result<OutputFormat> format = ParseOutputFormat(format_name);
  if (!format.ok()) return Fail(format.status());
  auto parsed = args.Parse();
  if (!parsed.ok()) return Fail(parsed.status());
  auto progress = std::make_shared<TtyProgress>(prometheus ? "stats" : "simulate");
  parsed->second.progress = [progress](const std::string& stage) { (*progress)(stage); };
  Result<SimulationResult> r = RunAgentScenario(parsed->first, parsed->second);
  progress.reset();
  if (!r.ok()) return Fail(r.status());
  for (const std::string& w : r->warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  std::string text = prometheus ? PrometheusText(r->metrics) : RenderSimulation(*r, *format);
  if (Status st = WriteStdout(text); !st.ok()) return Fail(st);
  // A wrong byte served or a share across tenants is a failure of the run, not of the input.
  return r->verify_failures == 0 && r->cross_tenant_shares == 0 ? 0 : 1;
}

int RunLayout(const ModelArgs& args, const std::string& format_name) {
  Result<OutputFormat> format = ParseOutputFormat(format_name);
  if (!format.ok()) return Fail(format.status());
  Result<Geometry> g = args.LoadGeometry();
  if (!g.ok()) return Fail(g.status());
  ModelArgs one_block = args;
  one_block.context = "1";
  Result<LedgerOptions> o = one_block.Options();
  if (!o.ok()) return Fail(o.status());
  Result<Ledger> l = ComputeLedger(*g, *o);
  if (!l.ok()) return Fail(l.status());
  std::string text = RenderLayout(*l, *format);
  Status st = WriteStdout(text);
  return st.ok() ? 0 : Fail(st);
}

// `tessera tier fsck DIR`: verify every record, quarantine what fails and cut a torn tail (under
// the directory's exclusive lock; a missing directory is an error, nothing is created); exit 0
// when all verified, 1 when anything was quarantined. `tessera tier stats DIR`: counts, under a
// shared lock, writing nothing.
int RunTier(const std::string& action, const std::string& dir, const std::string& format_name) {
  Result<OutputFormat> format = ParseOutputFormat(format_name);
  if (!format.ok()) return Fail(format.status());
  if (*format == OutputFormat::kMarkdown) return Fail(InvalidArgument("format", "tier writes table | json"));
  DiskTierOptions o;
  o.dir = dir;
  o.read_only = action == "stats";
  o.create = false;
  Result<std::unique_ptr<DiskTier>> t = DiskTier::Open(o);
  if (!t.ok()) return Fail(t.status());
  for (const std::string& w : (*t)->warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
  const DiskTierStats s = (*t)->stats();
  std::string text;
  if (*format == OutputFormat::kJson) {
    nlohmann::ordered_json j;
    j["dir"] = dir;
    j["segments"] = s.segments;
    j["records"] = s.records;
    j["verified"] = s.verified;
    j["bytes"] = s.bytes;
    j["live_bytes"] = s.live_bytes;
    j["dead_bytes"] = s.dead_bytes;
    j["torn_tail_bytes"] = s.torn_tail_bytes;
    j["quarantined"] = s.quarantined;
    j["quarantine_log"] = (*t)->quarantine_log();
    // A path need not be UTF-8: invalid bytes become U+FFFD rather than an exception.
    text = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  } else {
    auto count = [](uint64_t v) { return std::to_string(v); };
    text = action + ": " + dir + "\n  segments     " + count(s.segments) + "\n  records      " + count(s.records) +
           " (verified " + count(s.verified) + ")\n  bytes        " + FormatBytes(s.bytes) + "\n  live bytes   " +
           FormatBytes(s.live_bytes) + "\n  dead bytes   " + FormatBytes(s.dead_bytes) + "\n  torn tail    " +
           FormatBytes(s.torn_tail_bytes) + "\n  quarantined  " + count(s.quarantined) + "\n";
    for (const std::string& q : (*t)->quarantine_log()) text += "  quarantined: " + q + "\n";
  }
  if (Status st = WriteStdout(text); !st.ok()) return Fail(st);
  if (action == "fsck") return s.quarantined == 0 ? 0 : 1;
  return 0;
}

// `table`, `text` (the same) | `json` | `markdown`.
Result<OutputFormat> ParsePlanFormat(const std::string& name) {
  if (name == "text") return OutputFormat::kTable;
  return ParseOutputFormat(name);
}

// Options of `plan` and `price`, kept as text so that errors name the option.
struct PlanArgs {
  std::string model;
  std::string config;
  std::string gpu;
  std::string gpu_spec;
  std::string tp = "1";
  std::string utilization = "0.9";
  std::string weights_dtype;
  std::string context;
  std::string concurrency;
  std::string batch = "1";
  std::string engines = "tessera,vllm,sglang";
  std::string reserve = "0";
  std::string max_committed;
  std::string min_concurrency;
  std::string kv_format;
  std::string indexer_format;
  std::string block_tokens;
  std::string spec_tokens = "0";
  std::string prefill_chunk = "8192";
  bool include_mtp = false;
  std::string format = "text";
  std::string max_model_len;

  void RegisterCommon(CLI::App* app) {
    app->add_option("--model", model, "preset name (see `tessera models`)");
    app->add_option("--config", config, "path to a Hugging Face config.json");
    app->add_option("--gpu", gpu, "H100-80G | H200-141G | B200 | MI300X");
    app->add_option("--gpu-spec", gpu_spec, "a GPU spec JSON file (fields as data/gpus/*.json)");
    app->add_option("--tp", tp, "tensor-parallel ranks (default 1)");
    app->add_option("--context", context, "tokens per request: 8192, 128k, 1m");
    AddLayoutOptions(app, {.kv_format = &kv_format});
    app->add_option("--format", format, "text | json | markdown");
  }
  void RegisterPlan(CLI::App* app) {
    RegisterCommon(app);
    app->add_option("--gpu-memory-utilization", utilization,
                    "fraction of device memory the engine may use (default 0.9)");
    app->add_option("--weights-dtype", weights_dtype, "bf16 | fp8 | fp4 (default: the checkpoint's)");
    app->add_option("--concurrency", concurrency, "also find the longest context at this many requests");
    app->add_option("--engine", engines, "comma-separated engines (default tessera,vllm,sglang)");
    app->add_option("--reserve-bytes", reserve,
                    "per rank, kept out of the KV budget: activations, CUDA graphs (default 0)");
    app->add_option("--max-committed-bytes", max_committed, "gate: reject a configuration committing more per rank");
    app->add_option("--min-concurrency", min_concurrency, "gate: reject a configuration sustaining fewer requests");
    AddLayoutOptions(app, {.indexer_format = &indexer_format, .block_tokens = &block_tokens});
    app->add_option("--spec-tokens", spec_tokens, "speculative draft tokens per step (default 0)");
    app->add_option("--prefill-chunk", prefill_chunk, "tokens per prefill step (default 8192)");
    app->add_flag("--include-mtp", include_mtp, "load the MTP layer(s) and count their cache");
    app->add_option("--max-model-len", max_model_len,
                    "vllm and sglang: the longest context the engine admits, vLLM's --max-model-len");
  }
  void RegisterPrice(CLI::App* app) {
    RegisterCommon(app);
    app->add_option("--batch", batch, "sequences decoded together (default 1)");
  }

  Result<Geometry> LoadGeometry() const { return LoadModelOrConfig(model, config); }
  Result<WeightShapes> LoadShapes(const Geometry& g) const {
    std::string text;
    if (!config.empty()) {
      TESSERA_ASSIGN_OR_RETURN(text, ReadRegularFile(config, "config"));
    } else {
      TESSERA_ASSIGN_OR_RETURN(text, PresetConfigText(model));
    }
    return WeightShapesFromConfigJson(text, g.name);
  }
  Result<GpuSpec> LoadGpuSpec() const {
    if (!gpu.empty() && !gpu_spec.empty()) return InvalidArgument("gpu", "give --gpu or --gpu-spec, not both");
    if (!gpu_spec.empty()) return LoadGpuSpecFile(gpu_spec);
    if (gpu.empty()) return InvalidArgument("gpu", "missing: give --gpu NAME (e.g. H200-141G) or --gpu-spec FILE");
    return LoadGpu(gpu);
  }
  static Result<uint32_t> Small(const std::string& text, const char* field) {
    TESSERA_ASSIGN_OR_RETURN(uint64_t v, ParseUnsigned(text, field));
    if (v == 0) return InvalidArgument(field, "must be positive");
    if (v > 65536) return OutOfRange(field, std::to_string(v) + " is above 65536");
    return static_cast<uint32_t>(v);
  }
  Result<uint64_t> Context() const {
    if (context.empty()) return InvalidArgument("context", "missing: give --context TOKENS (e.g. 128k)");
    TESSERA_ASSIGN_OR_RETURN(uint64_t c, ParseTokenCount(context, "context"));
    if (c == 0) return InvalidArgument("context", "must be positive");
    return c;
  }

  Result<PlanOptions> Plan() const {
    PlanOptions o;
    TESSERA_ASSIGN_OR_RETURN(o.gpu, LoadGpuSpec());
    TESSERA_ASSIGN_OR_RETURN(o.tp, Small(tp, "tp"));
    TESSERA_ASSIGN_OR_RETURN(o.utilization, ParseUtilization(utilization));
    if (!weights_dtype.empty()) {
      TESSERA_ASSIGN_OR_RETURN(WeightDtype d, ParseWeightDtype(weights_dtype));
      o.weights_dtype = d;
    }
    TESSERA_ASSIGN_OR_RETURN(o.reserve_bytes, ParseByteSize(reserve, "reserve-bytes"));
    TESSERA_ASSIGN_OR_RETURN(o.context_tokens, Context());
    if (!concurrency.empty()) {
      TESSERA_ASSIGN_OR_RETURN(uint64_t n, ParseUnsigned(concurrency, "concurrency"));
      if (n == 0) return InvalidArgument("concurrency", "must be positive");
      o.concurrency = n;
    }
    o.engines.clear();
    size_t start = 0;
    while (start <= engines.size()) {
      size_t comma = engines.find(',', start);
      std::string name = engines.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      TESSERA_ASSIGN_OR_RETURN(Engine e, ParseEngine(name));
      for (Engine seen : o.engines) {
        if (seen == e) return InvalidArgument("engine", "\"" + name + "\" given twice");
      }
      o.engines.push_back(e);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (!max_committed.empty()) {
      TESSERA_ASSIGN_OR_RETURN(uint64_t b, ParseByteSize(max_committed, "max-committed-bytes"));
      o.max_committed_bytes = b;
    }
    if (!min_concurrency.empty()) {
      TESSERA_ASSIGN_OR_RETURN(uint64_t n, ParseUnsigned(min_concurrency, "min-concurrency"));
      o.min_concurrency = n;
    }
    o.ledger.kv_format = kv_format;
    o.ledger.indexer_format = indexer_format;
    TESSERA_ASSIGN_OR_RETURN(o.ledger.block_tokens, ParseBlockTokens(block_tokens));
    TESSERA_ASSIGN_OR_RETURN(uint64_t spec, ParseUnsigned(spec_tokens, "spec-tokens"));
    if (spec > 1024) return InvalidArgument("spec-tokens", "at most 1024 draft tokens per step");
    o.ledger.spec_tokens = static_cast<uint32_t>(spec);
    TESSERA_ASSIGN_OR_RETURN(o.ledger.prefill_chunk_tokens, ParseTokenCount(prefill_chunk, "prefill-chunk"));
    if (o.ledger.prefill_chunk_tokens == 0) return InvalidArgument("prefill-chunk", "must be positive");
    o.ledger.include_mtp = include_mtp;
    if (!max_model_len.empty()) {
      TESSERA_ASSIGN_OR_RETURN(uint64_t m, ParseTokenCount(max_model_len, "max-model-len"));
      o.ledger.max_model_len = m;
    }
    return o;
  }

  Result<PriceOptions> Price() const {
    PriceOptions o;
    TESSERA_ASSIGN_OR_RETURN(o.gpu, LoadGpuSpec());
    TESSERA_ASSIGN_OR_RETURN(o.tp, Small(tp, "tp"));
    TESSERA_ASSIGN_OR_RETURN(o.batch, ParseUnsigned(batch, "batch"));
    TESSERA_ASSIGN_OR_RETURN(o.context_tokens, Context());
    o.kv_format = kv_format;
    return o;
  }
};

// Exit 0, or 1 when a configuration is rejected (a gate failed or the weights do not fit); the
// output lists what was rejected and why.
int RunPlan(const PlanArgs& args) {
  Result<OutputFormat> format = ParsePlanFormat(args.format);
  if (!format.ok()) return Fail(format.status());
  Result<Geometry> g = args.LoadGeometry();
  if (!g.ok()) return Fail(g.status());
  Result<WeightShapes> shapes = args.LoadShapes(*g);
  if (!shapes.ok()) return Fail(shapes.status());
  Result<PlanOptions> o = args.Plan();
  if (!o.ok()) return Fail(o.status());
  Result<Plan> p = ComputePlan(*g, *shapes, *o);
  if (!p.ok()) return Fail(p.status());
  Status st = WriteStdout(RenderPlan(*p, *format));
  if (!st.ok()) return Fail(st);
  return p->any_rejected() ? 1 : 0;
}

int RunPrice(const PlanArgs& args) {
  Result<OutputFormat> format = ParsePlanFormat(args.format);
  if (!format.ok()) return Fail(format.status());
  Result<Geometry> g = args.LoadGeometry();
  if (!g.ok()) return Fail(g.status());
  Result<PriceOptions> o = args.Price();
  if (!o.ok()) return Fail(o.status());
  Result<Price> p = ComputePrice(*g, *o);
  if (!p.ok()) return Fail(p.status());
  Status st = WriteStdout(RenderPrice(*p, *format));
  return st.ok() ? 0 : Fail(st);
}

// The plan inputs `receipt --format html` takes: a GPU configuration whose capacity table the
// receipt shows. Context, tp and the ledger options are the receipt's own.
struct ReceiptPlanArgs {
  PlanArgs plan;
  void Register(CLI::App* app) {
    app->add_option("--gpu", plan.gpu,
                    "with --format html: the capacity plan on this GPU (H100-80G | H200-141G | ...)");
    app->add_option("--gpu-spec", plan.gpu_spec, "with --format html: a GPU spec JSON file");
    app->add_option("--gpu-memory-utilization", plan.utilization, "plan: fraction of device memory (default 0.9)");
    app->add_option("--weights-dtype", plan.weights_dtype, "plan: bf16 | fp8 | fp4 (default: the checkpoint's)");
    app->add_option("--reserve-bytes", plan.reserve, "plan: per rank, kept out of the KV budget (default 0)");
    app->add_option("--concurrency", plan.concurrency, "plan: also find the longest context at this many requests");
    app->add_option("--max-committed-bytes", plan.max_committed, "plan gate: reject a configuration committing more");
    app->add_option("--min-concurrency", plan.min_concurrency, "plan gate: reject a configuration sustaining fewer");
  }
  bool given() const {
    return !plan.gpu.empty() || !plan.gpu_spec.empty() || plan.utilization != "0.9" || !plan.weights_dtype.empty() ||
           plan.reserve != "0" || !plan.concurrency.empty() || !plan.max_committed.empty() ||
           !plan.min_concurrency.empty();
  }
};

// Writes PREFIX.html; exit 1 (after writing it) when the plan rejects a configuration.
int RunHtmlReceipt(const ModelArgs& args, ReceiptPlanArgs plan_args, const std::string& out) {
  Result<Geometry> g = args.LoadGeometry();
  if (!g.ok()) return Fail(g.status());
  Result<LedgerOptions> o = args.Options();
  if (!o.ok()) return Fail(o.status());
  Result<std::optional<AllocationTrace>> observed = args.Observed();
  if (!observed.ok()) return Fail(observed.status());
  std::optional<uint64_t> observed_bytes;
  if (observed->has_value()) observed_bytes = (*observed)->total;
  HtmlReceiptRequest req;
  req.receipt = ReceiptRequest{args.Source(), *o, observed_bytes, args.observed_scope == "all"};
  if (plan_args.given()) {
    if (plan_args.plan.gpu.empty() && plan_args.plan.gpu_spec.empty()) {
      return Fail(InvalidArgument("gpu", "missing: the plan options need --gpu NAME or --gpu-spec FILE"));
    }
    PlanArgs& p = plan_args.plan;
    p.model = args.model;
    p.config = args.config;
    p.context = args.context;
    p.tp = args.tp;
    Result<WeightShapes> shapes = p.LoadShapes(*g);
    if (!shapes.ok()) return Fail(shapes.status());
    Result<PlanOptions> po = p.Plan();
    if (!po.ok()) return Fail(po.status());
    req.plan = *po;
    req.shapes = *shapes;
  }
  Result<HtmlReceipt> r = BuildHtmlReceipt(*g, req);
  if (!r.ok()) return Fail(r.status());
  Status st = WriteFilesAtomically({{out + ".html", r->html}});
  if (!st.ok()) return Fail(st);
  int passed = 0;
  for (const ReceiptCheck& c : r->receipt.checks) passed += c.passed ? 1 : 0;
  bool rejected = r->plan && r->plan->any_rejected();
  std::printf("wrote %s.html (%d of %zu checks passed%s)\n", out.c_str(), passed, r->receipt.checks.size(),
              rejected ? "; the plan rejected a configuration" : "");
  return rejected ? 1 : 0;
}

int RunModels() {
  for (const std::string& name : PresetNames()) {
    Result<Geometry> g = LoadPreset(name);
    if (!g.ok()) return Fail(g.status());
    std::printf("%-18s %-14s %3u layers (+%u MTP)  default kv-format %s\n", name.c_str(), g->model_type.c_str(),
                g->num_layers, g->num_mtp_layers, DefaultKvFormat(*g).c_str());
  }
  return 0;
}

int RunFormats() {
  for (const FormatInfo& f : FormatCatalog()) {
    std::printf("%-20s %-8s %s\n", f.name.c_str(), std::string(FormatUseName(f.use)).c_str(), f.description.c_str());
  }
  return 0;
}

// `tessera generate`: kept as text so that errors name the option.
struct GenerateArgs {
  std::string model;
  std::string prompt_tokens;
  std::string steps;
  std::string kv_format = "mla-bf16";
  std::string attention = "absorbed";
  std::string weights;
  bool init_weights = false;
  std::string seed = "0";
  std::string dump;
  std::string flip;
  std::string block_tokens;
  std::string window_strategy;  // tiny-v4
  std::string indexer_format;   // tiny-v4

  void Register(CLI::App* app) {
    app->add_option("--model", model, "tiny-mla | tiny-dsa | tiny-v4");
    app->add_option("--prompt-tokens", prompt_tokens, "comma-separated token ids");
    app->add_option("--steps", steps, "tokens to generate");

    app->add_option("--attention", attention, "absorbed (default) | naive");
    app->add_option("--weights", weights, "safetensors weight file (ADR 0017)");
    app->add_flag("--init-weights", init_weights, "generate the weights from --seed and write them to --weights");
    app->add_option("--seed", seed, "weight seed for --init-weights (default 0)");
    app->add_option("--dump", dump, "write tokens and logits as JSON to this file");
    app->add_option("--flip-page-byte", flip, "LAYER,POSITION,BYTE: after prefill, XOR 0x01 into that record byte");
    AddLayoutOptions(app, {.kv_format = &kv_format,
                           .indexer_format = &indexer_format,
                           .block_tokens = &block_tokens,
                           .kv_format_help = "mla-bf16 (default) | fp8_ds_mla",
                           .indexer_format_help = "tiny-v4: indexer-mxfp4 (default) | indexer-fp8",
                           .block_tokens_help = "tokens per block (default: derived, 64)"});
    app->add_option("--swa-strategy", window_strategy, "tiny-v4: recompute | snapshot (default) | retain");
  }
};

Result<uint64_t> ParseUint(std::string_view text, std::string_view field, uint64_t max) {
  if (text.empty() || text.size() > 20 || text.find_first_not_of("0123456789") != std::string_view::npos) {
    return InvalidArgument(std::string(field), "\"" + std::string(text) + "\" is not a non-negative integer");
  }
  uint64_t v = 0;
  for (char c : text) {
    if (v > (max - static_cast<uint64_t>(c - '0')) / 10) {
      return OutOfRange(std::string(field), std::string(text) + " exceeds " + std::to_string(max));
    }
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

Result<std::vector<uint64_t>> ParseList(std::string_view text, std::string_view field, uint64_t max) {
  std::vector<uint64_t> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string_view item = text.substr(start, comma == std::string_view::npos ? text.npos : comma - start);
    TESSERA_ASSIGN_OR_RETURN(uint64_t v, ParseUint(item, field, max));
    out.push_back(v);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string FloatText(float f) {
  if (!std::isfinite(f)) return "null";  // JSON has no NaN/inf; a corrupt page can produce them
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(f));
  return buf;
}

// The dump the oracle reads (python/oracle/compare.py) and the one-line summary, for any tiny model.
// `extra`: more fields for the dump, as JSON text starting with ", " (tiny-v4's).
int WriteGeneration(const GenerateArgs& a, const std::string& kv_format, std::span<const uint32_t> tokens,
                    uint64_t prompt_len, const std::vector<std::vector<float>>& logits, uint64_t steps,
                    const AttentionCounters& counters, const std::string& extra = "") {
  std::string tokens_text;
  for (size_t i = 0; i < tokens.size(); ++i) tokens_text += (i ? "," : "") + std::to_string(tokens[i]);
  if (!a.dump.empty()) {
    std::string j =
        "{\"model\": " + nlohmann::json(a.model).dump() + ", \"kv_format\": " + nlohmann::json(kv_format).dump() +
        ", \"attention\": " + nlohmann::json(a.attention).dump() +
        ", \"weights\": " + nlohmann::json(a.weights).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
        ", \"prompt_len\": " + std::to_string(prompt_len) + extra + ", \"tokens\": [" + tokens_text +
        "], \"logits\": [";
    for (size_t i = 0; i < logits.size(); ++i) {
      j += i ? ",\n  [" : "\n  [";
      for (size_t k = 0; k < logits[i].size(); ++k) j += (k ? ", " : "") + FloatText(logits[i][k]);
      j += "]";
    }
    j += "]}\n";
    if (Status st = WriteFilesAtomically({{a.dump, j}}); !st.ok()) return Fail(st);
  }
  const std::string text = "tokens " + tokens_text + "\nprompt " + std::to_string(prompt_len) + " generated " +
                           std::to_string(steps) + " page_bytes_read " + std::to_string(counters.page_bytes) +
                           " flops " + std::to_string(counters.flops) + "\n";
  Status st = WriteStdout(text);
  return st.ok() ? 0 : Fail(st);
}

// tiny-v4 (ADR 0018): v4-fp8 pages, the V4 decode (no absorbed/naive choice: its key is its value).
int RunGenerateV4(const GenerateArgs& a) {
  std::string kv_format = a.kv_format == "mla-bf16" ? "v4-fp8" : a.kv_format;  // mla-bf16: the option's default
  if (kv_format != "v4-fp8") {
    return Fail(InvalidArgument("kv-format", "tiny-v4 runs on v4-fp8 pages, not " + a.kv_format));
  }
  if (a.attention != "absorbed") {
    return Fail(InvalidArgument("attention", "tiny-v4 has one form (its latent is both key and value)"));
  }
  if (!a.block_tokens.empty()) return Fail(InvalidArgument("block-tokens", "tiny-v4's blocks follow its layout"));
  Result<TinyV4Config> cfg = LoadTinyV4Config("tiny-v4");
  if (!cfg.ok()) return Fail(cfg.status());
  TinyV4Run run;
  if (a.prompt_tokens.empty()) return Fail(InvalidArgument("prompt-tokens", "missing: give --prompt-tokens 1,2,3"));
  Result<std::vector<uint64_t>> prompt64 = ParseList(a.prompt_tokens, "prompt-tokens", cfg->vocab - 1);
  if (!prompt64.ok()) return Fail(prompt64.status());
  run.prompt.assign(prompt64->begin(), prompt64->end());
  if (a.steps.empty()) return Fail(InvalidArgument("steps", "missing: give --steps N"));
  Result<uint64_t> steps = ParseUint(a.steps, "steps", 1u << 16);
  if (!steps.ok()) return Fail(steps.status());
  if (*steps == 0) return Fail(InvalidArgument("steps", "must be at least 1"));
  run.steps = static_cast<uint32_t>(*steps);
  if (a.weights.empty()) return Fail(InvalidArgument("weights", "missing: give --weights FILE"));
  run.weights_path = a.weights;
  run.init_weights = a.init_weights;
  Result<uint64_t> seed = ParseUint(a.seed, "seed", UINT64_MAX);
  if (!seed.ok()) return Fail(seed.status());
  run.seed = *seed;
  if (!a.window_strategy.empty()) {
    Result<SwaStrategy> ws = ParseSwaStrategy(a.window_strategy);
    if (!ws.ok()) return Fail(ws.status());
    run.options.window_strategy = *ws;
  }
  if (!a.indexer_format.empty()) run.options.indexer_format = a.indexer_format;
  if (!a.flip.empty()) {
    // LAYER,ENTRY,BYTE: a byte of compressed entry ENTRY (main cache) of model layer LAYER; bytes
    // 0..575 are the data row, 576..583 the scale row.
    Result<std::vector<uint64_t>> f = ParseList(a.flip, "flip-page-byte", UINT32_MAX);
    if (!f.ok()) return Fail(f.status());
    if (f->size() != 3) return Fail(InvalidArgument("flip-page-byte", "give LAYER,ENTRY,BYTE"));
    const std::array<uint64_t, 3> at{(*f)[0], (*f)[1], (*f)[2]};
    run.after_prefill = [at](TinyV4Runner& r, RequestId id) -> Status {
      if (at[0] >= r.config().layers) return InvalidArgument("flip-page-byte", "no such layer");
      Result<RecordView> v = r.manager().FaultInjectionEntry(id, static_cast<uint32_t>(at[0]), false, at[1]);
      if (!v.ok()) {
        return InvalidArgument("flip-page-byte", "layer " + std::to_string(at[0]) + " has no compressed entry " +
                                                     std::to_string(at[1]) + " after the prompt");
      }
      uint64_t byte = at[2];
      for (uint32_t p = 0; p < v->plane_count; ++p) {
        if (byte < v->planes[p].size()) {
          v->planes[p][byte] ^= std::byte{0x01};
          return Status::Ok();
        }
        byte -= v->planes[p].size();
      }
      return InvalidArgument("flip-page-byte", "byte past the entry's record");
    };
  }
  Result<TinyV4Generation> g = RunTinyV4(run);
  if (!g.ok()) return Fail(g.status());
  // What each computed position attended (docs/ORACLE.md: the oracle attends the same entries and
  // checks each is admissible, so that an fp4 top-k tie does not fail a correct run).
  nlohmann::json selected = nlohmann::json::array();
  for (const auto& per_layer : g->selected) {
    nlohmann::json layers = nlohmann::json::array();
    for (uint32_t l = 0; l < cfg->layers; ++l) {
      const bool csa = l < per_layer.size() && cfg->ratios[l] == 4;
      layers.push_back(csa ? nlohmann::json(per_layer[l]) : nlohmann::json(nullptr));
    }
    selected.push_back(std::move(layers));
  }
  const std::string extra =
      ", \"indexer_format\": " + nlohmann::json(run.options.indexer_format).dump() +
      ", \"window_strategy\": " + nlohmann::json(std::string(SwaStrategyName(run.options.window_strategy))).dump() +
      ", \"selected\": " + selected.dump();
  return WriteGeneration(a, kv_format, g->tokens, g->prompt_len, g->logits, *steps, g->counters, extra);
}

int RunGenerate(const GenerateArgs& a) {
  if (a.model == "tiny-v4") return RunGenerateV4(a);
  if (!a.window_strategy.empty()) return Fail(InvalidArgument("swa-strategy", "only tiny-v4 has windows"));
  if (!a.indexer_format.empty()) return Fail(InvalidArgument("indexer-format", "only tiny-v4 takes one"));
  if (a.model.empty()) return Fail(InvalidArgument("model", "missing: give --model tiny-mla | tiny-dsa | tiny-v4"));
  Result<TinyConfig> cfg = LoadTinyConfig(a.model);
  if (!cfg.ok()) return Fail(cfg.status());
  if (Status st = CheckTinyKvFormat(a.kv_format); !st.ok()) return Fail(st);
  Result<AttentionForm> form = ParseAttentionForm(a.attention);
  if (!form.ok()) return Fail(form.status());
  if (a.prompt_tokens.empty()) return Fail(InvalidArgument("prompt-tokens", "missing: give --prompt-tokens 1,2,3"));
  Result<std::vector<uint64_t>> prompt64 = ParseList(a.prompt_tokens, "prompt-tokens", cfg->vocab - 1);
  if (!prompt64.ok()) return Fail(prompt64.status());
  std::vector<uint32_t> prompt(prompt64->begin(), prompt64->end());
  if (a.steps.empty()) return Fail(InvalidArgument("steps", "missing: give --steps N"));
  Result<uint64_t> steps = ParseUint(a.steps, "steps", 1u << 16);
  if (!steps.ok()) return Fail(steps.status());
  if (*steps == 0) return Fail(InvalidArgument("steps", "must be at least 1"));
  if (a.weights.empty()) return Fail(InvalidArgument("weights", "missing: give --weights FILE"));
  Result<uint64_t> seed = ParseUint(a.seed, "seed", UINT64_MAX);
  if (!seed.ok()) return Fail(seed.status());
  RunOptions ro;
  ro.kv_format = a.kv_format;
  ro.form = *form;
  if (!a.block_tokens.empty()) {
    Result<uint64_t> bt = ParseUint(a.block_tokens, "block-tokens", 1u << 20);
    if (!bt.ok()) return Fail(bt.status());
    ro.block_tokens = *bt;
  }
  // Room for the whole run in pages: nothing is evicted mid-run.
  const uint64_t total = prompt.size() + *steps;
  const uint64_t bt = ro.block_tokens.value_or(64);
  if (bt == 0) return Fail(InvalidArgument("block-tokens", "must be positive"));
  ro.capacity_blocks = static_cast<uint32_t>(total / bt + 2);
  std::optional<std::array<uint64_t, 3>> flip;
  if (!a.flip.empty()) {
    Result<std::vector<uint64_t>> f = ParseList(a.flip, "flip-page-byte", UINT32_MAX);
    if (!f.ok()) return Fail(f.status());
    if (f->size() != 3) return Fail(InvalidArgument("flip-page-byte", "give LAYER,POSITION,BYTE"));
    Result<RecordFormat> rf = BuildFormat(a.kv_format, cfg->geometry);
    if (!rf.ok()) return Fail(rf.status());
    if ((*f)[0] >= cfg->layers || (*f)[1] >= prompt.size() || (*f)[2] >= rf->record_bytes()) {
      return Fail(InvalidArgument("flip-page-byte", "layer < " + std::to_string(cfg->layers) + ", position < " +
                                                        std::to_string(prompt.size()) + " (the prompt), byte < " +
                                                        std::to_string(rf->record_bytes())));
    }
    flip = std::array<uint64_t, 3>{(*f)[0], (*f)[1], (*f)[2]};
  }
  Result<Weights> w = Weights{};
  if (a.init_weights) {
    w = GenerateWeights(*cfg, *seed);
    if (Status st = WriteWeightsFile(a.weights, *cfg, *w); !st.ok()) return Fail(st);
  } else {
    w = ReadWeightsFile(a.weights, *cfg);
    if (!w.ok()) return Fail(w.status());
  }
  Result<std::unique_ptr<TinyRunner>> runner = TinyRunner::Create(*cfg, std::move(*w), ro);
  if (!runner.ok()) return Fail(runner.status());
  TinyRunner& r = **runner;
  auto after_prefill = [&](RequestId id) -> Status {
    if (!flip) return Status::Ok();
    const auto& groups = r.manager().pool().groups();
    for (uint32_t gi = 0; gi < groups.size(); ++gi) {
      if (groups[gi].format.use != FormatUse::kLatent) continue;
      TESSERA_ASSIGN_OR_RETURN(RecordView v,
                               r.manager().FaultInjectionRecord(id, gi, static_cast<uint32_t>((*flip)[0]), (*flip)[1]));
      v.planes[0][(*flip)[2]] ^= std::byte{0x01};
      return Status::Ok();
    }
    return InvalidArgument("flip-page-byte", "no latent pages");
  };
  Result<Generation> g = r.Generate(prompt, static_cast<uint32_t>(*steps), after_prefill);
  if (!g.ok()) return Fail(g.status());
  // tiny-dsa: what each position's top-k attended (the oracle attends the same after checking each
  // is admissible: a top-k tie must not fail a correct run; docs/ORACLE.md).
  std::string extra;
  if (cfg->has_indexer()) extra = ", \"selected\": " + nlohmann::json(g->selected).dump();
  return WriteGeneration(a, a.kv_format, g->tokens, g->prompt_len, g->logits, *steps, g->counters, extra);
}

// `tessera serve`: the YAML file, then TESSERA_SERVE_* variables, then the flags.
struct ServeArgs {
  std::string config;
  std::string redis;
  std::string redis_cluster;
  void Register(CLI::App* app) {
    app->add_option("--config", config, "YAML configuration file (keys: docs/SERVE.md)")->required();
    app->add_option("--redis", redis, "a Redis tier: redis://host:port (overrides tiers.redis)");
    app->add_option("--redis-cluster", redis_cluster, "a Redis Cluster tier: host:port,... seeds");
  }
};

int RunServeCommand(const ServeArgs& args) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv(*e);
    const size_t eq = kv.find('=');
    if (eq != std::string_view::npos && kv.starts_with("TESSERA_SERVE_")) {
      env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
    }
  }
  if (!args.redis.empty()) env["TESSERA_SERVE_TIERS_REDIS"] = args.redis;
  if (!args.redis_cluster.empty()) env["TESSERA_SERVE_TIERS_REDIS_CLUSTER"] = args.redis_cluster;
  Result<ServeConfig> c = LoadServeConfig(args.config, env);
  if (!c.ok()) return Fail(c.status());
  return RunServe(*c);
}

}  // namespace

// Long (~110 lines): the subcommand table (one registration and one dispatch per subcommand).
int Main(int argc, char** argv) {
  CLI::App app{"tessera: KV-cache ledger for MLA models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tessera " + std::string(TesseraVersion()));

  std::string format = "table";
  std::string out;
  bool check_claims = false;
  ModelArgs ledger_args;
  CLI::App* ledger = app.add_subcommand("ledger", "bytes requested, committed and read per token");
  ledger_args.Register(ledger);
  ledger->add_option("--format", format, "table | json | markdown");
  ledger->add_flag("--check-claims", check_claims, "evaluate the seed note's published table claim by claim");
  ledger->add_option("--out", out, "write to this file instead of stdout (all or nothing)");

  ModelArgs receipt_args;
  CLI::App* receipt = app.add_subcommand("receipt", "write a qualification record (Markdown and JSON)");
  receipt_args.Register(receipt);
  receipt->add_option("--out", out, "output prefix: writes PREFIX.md and PREFIX.json, or PREFIX.html");
  std::string receipt_format = "markdown+json";
  receipt->add_option("--format", receipt_format,
                      "markdown+json (default) | html (one self-contained page with charts)");
  ReceiptPlanArgs receipt_plan;
  receipt_plan.Register(receipt);

  CLI::App* report = app.add_subcommand("report", "the main job: DeepSeek-V3 and V4-Pro ledgers and the claim check");
  report->add_option("--format", format, "table | json | markdown");
  SimulateArgs sim_args;
  CLI::App* simulate = app.add_subcommand("simulate", "replay a multi-agent workload through the block manager");
  sim_args.Register(simulate);
  simulate->add_option("--format", format, "table | json | markdown");
  SimulateArgs stats_args;
  CLI::App* stats = app.add_subcommand("stats", "run a simulation and print the manager's counters as Prometheus text");
  stats_args.Register(stats);
  ModelArgs layout_args;
  CLI::App* layout = app.add_subcommand("layout", "block span and page bytes per cache group, with the reasons");
  layout->add_option("--model", layout_args.model, "preset name");
  layout->add_option("--config", layout_args.config, "path to a Hugging Face config.json");
  AddLayoutOptions(layout, {.kv_format = &layout_args.kv_format,
                            .indexer_format = &layout_args.indexer_format,
                            .block_tokens = &layout_args.block_tokens,
                            .kernel = &layout_args.kernel,
                            .kernel_help = "flashmla | cutlass-mla | flashinfer-mla | generic (default flashmla)"});
  layout->add_option("--format", format, "table | json | markdown");
  std::string tier_dir;
  CLI::App* tier = app.add_subcommand("tier", "the disk tier: fsck DIR | stats DIR");
  CLI::App* fsck = tier->add_subcommand("fsck", "verify every record; exit 1 if anything was quarantined");
  fsck->add_option("dir", tier_dir, "disk tier directory")->required();
  fsck->add_option("--format", format, "table | json");
  CLI::App* tier_stats = tier->add_subcommand("stats", "records, bytes, dead bytes, quarantined (read-only)");
  tier_stats->add_option("dir", tier_dir, "disk tier directory")->required();
  tier_stats->add_option("--format", format, "table | json");
  tier->require_subcommand(1);
  PlanArgs plan_args;
  CLI::App* plan = app.add_subcommand("plan", "capacity: weights per rank, KV budget, requests and context per engine");
  plan_args.RegisterPlan(plan);
  PlanArgs price_args;
  CLI::App* price =
      app.add_subcommand("price", "MLA attention for one decoded token: FLOPs and HBM bytes, absorbed vs naive");
  price_args.RegisterPrice(price);
  CLI::App* models = app.add_subcommand("models", "list the shipped model presets");
  CLI::App* formats = app.add_subcommand("formats", "list the record formats");
  GenerateArgs gen_args;
  CLI::App* generate = app.add_subcommand("generate", "greedy decode of a tiny model (ADR 0017) over Tessera's pages");
  gen_args.Register(generate);

  ServeArgs serve_args;
  CLI::App* serve = app.add_subcommand("serve", "run the server: /metrics, /health, the /v1 API, KV events");
  serve_args.Register(serve);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    for (char& c : msg) {
      if (c == '\n') c = ' ';
    }
    std::fprintf(stderr, "tessera: error: usage: %s (see tessera --help)\n", msg.c_str());
    return 2;
  }
  if (ledger->parsed()) return RunLedger(ledger_args, format, check_claims, out);
  if (receipt->parsed()) {
    if (receipt_format == "html") {
      if (out.empty()) return Fail(InvalidArgument("out", "missing: give --out PREFIX (writes PREFIX.html)"));
      return RunHtmlReceipt(receipt_args, receipt_plan, out);
    }
    if (receipt_format != "markdown+json") {
      return Fail(
          InvalidArgument("format", "unknown receipt format \"" + receipt_format + "\" (markdown+json | html)"));
    }
    if (receipt_plan.given()) {
      return Fail(InvalidArgument("gpu", "the plan options (--gpu, ...) need --format html"));
    }
    return RunReceipt(receipt_args, out);
  }
  if (report->parsed()) return RunReport(format);
  if (simulate->parsed()) return RunSimulate(sim_args, format, false);
  if (stats->parsed()) return RunSimulate(stats_args, format, true);
  if (layout->parsed()) return RunLayout(layout_args, format);
  if (fsck->parsed()) return RunTier("fsck", tier_dir, format);
  if (tier_stats->parsed()) return RunTier("stats", tier_dir, format);
  if (plan->parsed()) return RunPlan(plan_args);
  if (price->parsed()) return RunPrice(price_args);
  if (models->parsed()) return RunModels();
  if (formats->parsed()) return RunFormats();
  if (generate->parsed()) return RunGenerate(gen_args);
  if (serve->parsed()) return RunServeCommand(serve_args);
  return 2;
}

int main(int argc, char** argv) {
  // The library reports through Status; only the CLI parser or the allocator can throw here.
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    return 1;
  }
}

// End to end through the tessera binary: exit codes, one-line errors naming the field, and
// no partial output files.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tessera/disk_tier.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::CommandResult;
using testing::RunTessera;
using testing::TempDir;

int Lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

void ExpectInputError(const CommandResult& r, const std::string& field) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(Lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(field), std::string::npos) << "expected field " << field << " in: " << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(Cli, ReportIsTheMainJob) {
  CommandResult r = RunTessera("report");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("deepseek-v3"), std::string::npos);
  EXPECT_NE(r.out.find("deepseek-v4-pro"), std::string::npos);
  EXPECT_NE(r.out.find("claim check"), std::string::npos);
  EXPECT_NE(r.out.find("GiB"), std::string::npos);
}

TEST(Cli, LedgerJsonForThePresetAndTheSameConfigFile) {
  CommandResult preset = RunTessera("ledger --model deepseek-v3 --context 128k --format json");
  ASSERT_EQ(preset.exit_code, 0) << preset.err;
  nlohmann::json j = nlohmann::json::parse(preset.out);
  EXPECT_EQ(j["requested_bytes"].get<uint64_t>(), 9210691584ULL);

  TempDir dir;
  std::string cfg = dir.Write("config.json", *PresetConfigText("deepseek-v3"));
  CommandResult file = RunTessera("ledger --config " + cfg + " --context 131072 --format json");
  ASSERT_EQ(file.exit_code, 0) << file.err;
  nlohmann::json k = nlohmann::json::parse(file.out);
  EXPECT_EQ(k["requested_bytes"], j["requested_bytes"]);
  EXPECT_EQ(k["committed_bytes"], j["committed_bytes"]);
  EXPECT_EQ(k["config_sha256"], j["config_sha256"]);
}

TEST(Cli, SeedFixtureThroughTheCli) {
  std::string cfg = std::string(TESSERA_TEST_DATA) + "/seed-fixture.json";
  CommandResult r = RunTessera("ledger --config " + cfg + " --context 4 --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["requested_bytes"], 9216);
  EXPECT_EQ(j["mha_equivalent_bytes"], 32768);
  EXPECT_EQ(j["caches"][0]["shape"], nlohmann::json::array({2, 1, 4, 576}));
  CommandResult again = RunTessera("ledger --config " + cfg + " --context 4 --format json");
  EXPECT_EQ(again.out, r.out);
}

TEST(Cli, CheckClaims) {
  CommandResult r = RunTessera("ledger --check-claims --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["claims"].size(), 23u);
}

TEST(Cli, ObservedIsReconciled) {
  CommandResult r =
      RunTessera("ledger --model deepseek-v3 --context 100 --engine vllm --observed 7027200 --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["committed_bytes"], 61 * 128 * 1152);
  EXPECT_EQ(j["reconciliation"]["unexplained_bytes"], 0);
  EXPECT_EQ(j["reconciliation"]["attributed"][0]["term"], "-page_rounding");
}

TEST(Cli, ReceiptWritesBothFiles) {
  TempDir dir;
  std::string prefix = dir.path() + "/v3";
  CommandResult r = RunTessera("receipt --model deepseek-v3 --context 128k --out " + prefix);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(prefix + ".md"));
  EXPECT_TRUE(std::filesystem::exists(prefix + ".json"));
}

TEST(Cli, ReceiptHtmlWritesOneSelfContainedFile) {
  TempDir dir;
  std::string prefix = dir.path() + "/v32";
  CommandResult r = RunTessera(
      "receipt --model deepseek-v3.2 --context 128k --tp 8 --format html --gpu H200-141G "
      "--out " +
      prefix);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("wrote " + prefix + ".html"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(prefix + ".md"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".json"));
  std::ifstream in(prefix + ".html");
  std::stringstream s;
  s << in.rdbuf();
  std::string page = s.str();
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(page.find("<table class=\"plan\">"), std::string::npos);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find("http:"), std::string::npos);  // nothing fetched: no URL, no src, no href
  EXPECT_EQ(page.find("https:"), std::string::npos);
  EXPECT_EQ(page.find("src="), std::string::npos);
  EXPECT_EQ(page.find("href="), std::string::npos);
}

TEST(Cli, ReceiptHtmlGateFailureExitsOneAndListsTheRejected) {
  TempDir dir;
  std::string prefix = dir.path() + "/gated";
  CommandResult r = RunTessera(
      "receipt --model deepseek-v3.2 --context 128k --tp 8 --format html --gpu H200-141G "
      "--min-concurrency 100000 --out " +
      prefix);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  std::ifstream in(prefix + ".html");
  std::stringstream s;
  s << in.rdbuf();
  EXPECT_NE(s.str().find("<li class=\"fail\">vllm: sustained concurrency"), std::string::npos);
  EXPECT_NE(s.str().find("min concurrency</th><td>100,000</td>"), std::string::npos);
}

// --- Limits stated (issue 22 point 2; ADR 0034) ---------------------------------------------

TEST(CliLimits, ContextPastMaxPositionEmbeddingsIsNotedInLedgerAndReceipt) {
  const std::string note = "exceeds the model's max_position_embeddings 163,840";
  CommandResult text = RunTessera("ledger --model deepseek-v3 --context 1m");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("notes:\n  - context 1,048,576 tokens " + note), std::string::npos) << text.out;
  CommandResult json = RunTessera("ledger --model deepseek-v3 --context 1m --format json");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_NE(nlohmann::json::parse(json.out)["notes"].dump().find(note), std::string::npos);
  CommandResult within = RunTessera("ledger --model deepseek-v3 --context 128k --format json");
  EXPECT_EQ(within.out.find("max_position_embeddings"), std::string::npos);

  TempDir dir;
  CommandResult r = RunTessera("receipt --model deepseek-v3 --context 1m --out " + dir.path() + "/long");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream js(dir.path() + "/long.json"), md(dir.path() + "/long.md");
  std::stringstream j, m;
  j << js.rdbuf();
  m << md.rdbuf();
  EXPECT_NE(nlohmann::json::parse(j.str())["ledger"]["notes"].dump().find(note), std::string::npos);
  EXPECT_NE(m.str().find(note), std::string::npos);
  CommandResult html = RunTessera("receipt --model deepseek-v3 --context 1m --format html --out " + dir.path() + "/h");
  ASSERT_EQ(html.exit_code, 0) << html.err;
  std::ifstream hs(dir.path() + "/h.html");
  std::stringstream h;
  h << hs.rdbuf();
  EXPECT_NE(h.str().find("exceeds the model&#39;s max_position_embeddings 163,840"), std::string::npos);
}

TEST(CliLimits, MaxModelLenForTheVllmAndSglangProfiles) {
  CommandResult ok =
      RunTessera("ledger --model deepseek-v3 --context 128k --engine vllm --max-model-len 128k --format json");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(nlohmann::json::parse(ok.out)["inputs"]["max_model_len"].get<uint64_t>(), 131072u);
  ExpectInputError(RunTessera("ledger --model deepseek-v3 --context 1m --engine vllm --max-model-len 128k"),
                   "max-model-len");
  ExpectInputError(RunTessera("ledger --model deepseek-v3 --context 1m --engine sglang --max-model-len 128k"),
                   "max-model-len");
  ExpectInputError(RunTessera("ledger --model deepseek-v3 --context 8k --max-model-len 128k"), "max-model-len");
  ExpectInputError(RunTessera("ledger --model deepseek-v3 --context 8k --engine vllm --max-model-len lots"),
                   "max-model-len");
  TempDir dir;
  ExpectInputError(RunTessera("receipt --model deepseek-v3 --context 1m --engine vllm --max-model-len 128k --out " +
                              dir.path() + "/r"),
                   "max-model-len");
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/r.json"));
}

// --- Small gaps of ADR 0033: scale-format flags, per-line formulas ----------------------------

TEST(Cli, ScaleFormatFlagsReachTheLedger) {
  CommandResult amax = RunTessera(
      "ledger --model deepseek-v3.2 --context 8k --engine vllm --kv-scale-format amax "
      "--indexer-scale-format ue8m0 --format json");
  ASSERT_EQ(amax.exit_code, 0) << amax.err;
  nlohmann::json in = nlohmann::json::parse(amax.out)["inputs"];
  EXPECT_EQ(in["kv_scale_format"], "amax");
  EXPECT_EQ(in["indexer_scale_format"], "ue8m0");
  ExpectInputError(RunTessera("ledger --model deepseek-v3.2 --context 8k --kv-scale-format e8"), "kv-scale-format");
  ExpectInputError(RunTessera("ledger --model deepseek-v3.2 --context 8k --indexer-scale-format e8"),
                   "indexer-scale-format");
}

// The indexer page layout is a named option (ADR 0043); the bytes priced do not depend on it.
TEST(Cli, IndexerLayoutFlagReachesTheLayout) {
  auto indexer_line = [](const std::string& out) {
    const nlohmann::json parsed = nlohmann::json::parse(out);
    for (const nlohmann::json& c : parsed["caches"]) {
      if (c["role"] == "indexer") return c;
    }
    return nlohmann::json();
  };
  CommandResult d = RunTessera("ledger --model deepseek-v3.2 --context 8k --format json");
  ASSERT_EQ(d.exit_code, 0) << d.err;
  CommandResult p = RunTessera("ledger --model deepseek-v3.2 --context 8k --indexer-layout per-token --format json");
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(indexer_line(d.out)["packing"], "region-major");
  EXPECT_EQ(indexer_line(p.out)["packing"], "per-token");
  for (const char* k : {"requested_bytes", "committed_bytes", "read_bytes_per_token"}) {
    EXPECT_EQ(nlohmann::json::parse(d.out)[k], nlohmann::json::parse(p.out)[k]) << k;
  }
  ExpectInputError(RunTessera("ledger --model deepseek-v3.2 --context 8k --indexer-layout planar"), "indexer-layout");
  ExpectInputError(RunTessera("ledger --model deepseek-v3 --context 8k --indexer-layout per-token"), "indexer-layout");
}

TEST(Cli, EachCacheLinesFormulaIsPrinted) {
  CommandResult j = RunTessera("ledger --model deepseek-v3 --context 8k --format json");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  EXPECT_EQ(nlohmann::json::parse(j.out)["caches"][0]["formula"], "tokens x 1,152 B x 61 layers");
  CommandResult t = RunTessera("ledger --model deepseek-v3 --context 8k");
  EXPECT_NE(t.out.find("how each cache is priced"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("tokens x 1,152 B x 61 layers"), std::string::npos) << t.out;
  // The storage column states the page's tokens, not a count of pages.
  EXPECT_NE(t.out.find("pages of 64 tokens (64 entries, "), std::string::npos) << t.out;
  EXPECT_EQ(t.out.find("64 x 64-token pages"), std::string::npos) << t.out;
}

// --- Outputs a person trusts (issue 22 point 4) ---------------------------------------------

TEST(CliOutputs, OutCreatesMissingParentFolders) {
  TempDir dir;
  const std::string prefix = dir.path() + "/receipts/deep/v3";
  CommandResult r = RunTessera("receipt --model deepseek-v3 --context 8k --out " + prefix);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(prefix + ".md"));
  EXPECT_TRUE(std::filesystem::exists(prefix + ".json"));
  CommandResult h = RunTessera("receipt --model deepseek-v3 --context 8k --format html --out " + dir.path() + "/h/v3");
  ASSERT_EQ(h.exit_code, 0) << h.err;
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/h/v3.html"));
  CommandResult l = RunTessera("ledger --model deepseek-v3 --context 8k --out " + dir.path() + "/l/x.txt");
  ASSERT_EQ(l.exit_code, 0) << l.err;
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/l/x.txt"));
}

TEST(CliOutputs, OutThatCannotBeCreatedNamesOutNotATempFile) {
  TempDir dir;
  const std::string file = dir.Write("plain", "x");
  CommandResult r = RunTessera("receipt --model deepseek-v3 --context 8k --out " + file + "/v3");
  EXPECT_EQ(r.exit_code, 1) << r.err;  // an output failure (exit 1), not an input error
  EXPECT_EQ(Lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("out:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(file + "/v3.md"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(".tmp"), std::string::npos) << r.err;
}

// serve's keys are documented in docs/SERVE.md (written by the serve work); the help points there.
TEST(CliOutputs, ServeHelpPointsAtServeMd) {
  CommandResult r = RunTessera("serve --help");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("docs/SERVE.md"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("docs/adr/0022"), std::string::npos) << r.out;
}

// Progress (issue 22 point 4; ADR 0034): standard error stays quiet when it is not a terminal,
// even past the delay; on a terminal (a pseudo-terminal here) the run says what it is doing.
const char kSmallRun[] = "simulate --agents 2 --independent 1 --shared-tokens 256 --unique-tokens 16";

TEST(CliProgress, QuietWhenStderrIsNotATerminal) {
  ASSERT_EQ(::setenv("TESSERA_PROGRESS_DELAY_MS", "0", 1), 0);
  CommandResult sim = RunTessera(kSmallRun);
  CommandResult stats = RunTessera(std::string(kSmallRun).replace(0, 8, "stats"));
  ::unsetenv("TESSERA_PROGRESS_DELAY_MS");
  EXPECT_EQ(sim.exit_code, 0) << sim.err;
  EXPECT_EQ(sim.err, "");
  EXPECT_EQ(stats.exit_code, 0) << stats.err;
  EXPECT_EQ(stats.err, "");
}

// Runs the binary with standard error on a pseudo-terminal; returns what the terminal received.
std::string RunOnPty(const std::string& args, const char* delay_ms, int* exit_code) {
  int master = -1, slave = -1;
  if (::openpty(&master, &slave, nullptr, nullptr, nullptr) != 0) return "openpty failed";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(master);
    ::dup2(slave, STDERR_FILENO);
    int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, STDOUT_FILENO);
    ::setenv("TESSERA_PROGRESS_DELAY_MS", delay_ms, 1);
    ::execl("/bin/sh", "sh", "-c", (std::string(TESSERA_BINARY) + " " + args).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(slave);
  std::string got;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) break;  // EIO once the child's side is closed
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(master);
  int status = 0;
  ::waitpid(pid, &status, 0);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return got;
}

TEST(CliProgress, ShownOnATerminalAfterTheDelayAndClearedAtTheEnd) {
  int rc = -1;
  std::string tty = RunOnPty(kSmallRun, "0", &rc);
  EXPECT_EQ(rc, 0) << tty;
  EXPECT_NE(tty.find("tessera simulate: 1/8 orchestrator context"), std::string::npos) << tty;
  EXPECT_NE(tty.find("8/8 cold agents"), std::string::npos) << tty;
  EXPECT_GE(tty.size(), 4u);
  EXPECT_EQ(tty.substr(tty.size() - 4), "\r\033[K") << tty;  // the line is cleared
  // A run shorter than the delay (an hour) prints nothing, terminal or not.
  EXPECT_EQ(RunOnPty(kSmallRun, "3600000", &rc), "");
  EXPECT_EQ(rc, 0);
}

TEST(Cli, VersionPrintsTheBuildsVersion) {
  CommandResult r = RunTessera("--version");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(r.out.rfind("tessera ", 0), 0u) << r.out;
  EXPECT_EQ(r.out.back(), '\n');
  // The receipts record the same version.
  TempDir dir;
  ASSERT_EQ(RunTessera("receipt --model deepseek-v3 --context 8k --out " + dir.path() + "/r").exit_code, 0);
  std::ifstream in(dir.path() + "/r.json");
  nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["tool"].get<std::string>() + "\n", r.out);
}

TEST(Cli, LedgerOutFile) {
  TempDir dir;
  std::string out = dir.path() + "/ledger.json";
  CommandResult r = RunTessera("ledger --model deepseek-v4-pro --context 1m --format json --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(out);
  std::stringstream s;
  s << in.rdbuf();
  EXPECT_EQ(nlohmann::json::parse(s.str())["inputs"]["context_tokens"], 1048576);
}

struct BadCall {
  const char* name;
  std::string args;
  const char* field;
};

class CliBadInput : public ::testing::TestWithParam<BadCall> {};

TEST_P(CliBadInput, ExitTwoOneLineNamingTheFieldNothingWritten) {
  TempDir dir;
  std::string out = dir.path() + "/out.json";
  std::string prefix = dir.path() + "/receipt";
  std::string args = GetParam().args;
  for (std::string* tag : {&args}) {
    size_t p;
    while ((p = tag->find("@DIR")) != std::string::npos) tag->replace(p, 4, dir.path());
  }
  bool receipt = args.rfind("receipt", 0) == 0;
  CommandResult r = RunTessera(args + (receipt ? " --out " + prefix : " --format json --out " + out));
  ExpectInputError(r, GetParam().field);
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".md"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".json"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".html"));
}

const std::string kFixtureDir = TESSERA_TEST_DATA;

INSTANTIATE_TEST_SUITE_P(
    All, CliBadInput,
    ::testing::Values(
        BadCall{"unknown_preset", "ledger --model deepseek-v9 --context 8k", "model"},
        BadCall{"unknown_format", "ledger --model deepseek-v3 --context 8k --kv-format fp3", "kv-format"},
        BadCall{"missing_config", "ledger --config @DIR/nope.json --context 8k", "config"},
        BadCall{"unreadable_config", "ledger --config @DIR --context 8k", "config"},
        BadCall{"zero_context", "ledger --model deepseek-v3 --context 0", "context"},
        BadCall{"negative_context", "ledger --model deepseek-v3 --context -5", "context"},
        BadCall{"non_numeric_context", "ledger --model deepseek-v3 --context lots", "context"},
        BadCall{"missing_context", "ledger --model deepseek-v3", "context"},
        BadCall{"zero_batch", "ledger --model deepseek-v3 --context 8k --batch 0", "batch"},
        BadCall{"non_numeric_batch", "ledger --model deepseek-v3 --context 8k --batch many", "batch"},
        BadCall{"overflow", "ledger --model deepseek-v3 --context 1m --batch 1000000000000", "batch"},
        BadCall{"v4_block_100", "ledger --model deepseek-v4-pro --context 8k --block-tokens 100", "block-tokens"},
        BadCall{"dcp_not_dividing", "ledger --model deepseek-v3 --context 8k --tp 4 --dcp 3", "dcp"},
        BadCall{"unknown_engine", "ledger --model deepseek-v3 --context 8k --engine trt", "engine"},
        BadCall{"bad_observed", "ledger --model deepseek-v3 --context 8k --observed 12GB", "observed"},
        BadCall{"model_and_config", "ledger --model deepseek-v3 --config x.json --context 8k", "model"},
        BadCall{"unknown_option", "ledger --model deepseek-v3 --context 8k --frobnicate", "usage"},
        BadCall{"receipt_bad_tp", "receipt --model deepseek-v3 --context 8k --tp zero", "tp"},
        BadCall{"receipt_unknown_preset", "receipt --model nope --context 8k", "model"},
        BadCall{"receipt_bad_format", "receipt --model deepseek-v3 --context 8k --format pdf", "format"},
        BadCall{"receipt_gpu_without_html", "receipt --model deepseek-v3 --context 8k --gpu B200", "gpu"},
        BadCall{"html_unknown_gpu", "receipt --model deepseek-v3 --context 8k --format html --gpu A100", "gpu"},
        BadCall{"html_plan_option_without_gpu",
                "receipt --model deepseek-v3 --context 8k --format html --min-concurrency 4", "gpu"},
        BadCall{"html_utilization_above_one",
                "receipt --model deepseek-v3 --context 8k --format html --gpu B200 "
                "--gpu-memory-utilization 1.5",
                "gpu-memory-utilization"},
        BadCall{"html_bad_weights_dtype",
                "receipt --model deepseek-v3 --context 8k --format html --gpu B200 --weights-dtype int3",
                "weights-dtype"},
        BadCall{"html_bad_context", "receipt --model deepseek-v3 --context lots --format html", "context"}),
    [](const ::testing::TestParamInfo<BadCall>& param_info) { return std::string(param_info.param.name); });

INSTANTIATE_TEST_SUITE_P(
    Inputs, CliBadInput,
    ::testing::Values(
        // Numbers are digits (or digits grouped in threes), nothing else: "1,2" read as 12.
        BadCall{"observed_1_comma_2", "ledger --model deepseek-v3 --context 100 --observed 1,2", "observed"},
        BadCall{"batch_plus", "ledger --model deepseek-v3 --context 8k --batch +3", "batch"},
        BadCall{"context_space", "ledger --model deepseek-v3 --context ' 4'", "context"},
        BadCall{"tp_hex", "ledger --model deepseek-v3 --context 8k --tp 0x10", "tp"},
        BadCall{"context_exponent", "ledger --model deepseek-v3 --context 1e3", "context"},
        BadCall{"observed_overflow", "ledger --model deepseek-v3 --context 8k --observed 99999999999999999999",
                "observed"},
        BadCall{"prefill_chunk_comma", "ledger --model deepseek-v3 --context 8k --prefill-chunk 1,2k", "prefill-chunk"},
        BadCall{"block_tokens_underscore", "ledger --model deepseek-v3 --context 8k --block-tokens 6_4",
                "block-tokens"},
        BadCall{"receipt_spec_comma", "receipt --model deepseek-v3 --context 8k --spec-tokens 1,0", "spec-tokens"},
        // Input files are regular files of bounded size.
        BadCall{"config_dev_zero", "ledger --config /dev/zero --context 8k", "config"},
        BadCall{"config_dev_null", "ledger --config /dev/null --context 8k", "config"},
        BadCall{"trace_dev_zero", "ledger --model deepseek-v3 --context 8k --observed-trace /dev/zero", "trace"},
        BadCall{"receipt_trace_dir", "receipt --model deepseek-v3 --context 8k --observed-trace @DIR", "trace"}),
    [](const ::testing::TestParamInfo<BadCall>& param_info) { return std::string(param_info.param.name); });

TEST(Cli, BadConfigFilesNameTheirField) {
  TempDir dir;
  struct Case {
    const char* json;
    const char* field;
  };
  const Case cases[] = {
      {R"({"num_hidden_layers": 2, "num_attention_heads": 8, "kv_lora_rank": 512, "qk_rope_head_dim": 0,
           "qk_nope_head_dim": 128, "v_head_dim": 128})",
       "qk_rope_head_dim"},
      {R"({"num_hidden_layers": -2, "num_attention_heads": 8, "hidden_size": 1024})", "num_hidden_layers"},
      {R"({"num_hidden_layers": "two", "num_attention_heads": 8, "hidden_size": 1024})", "num_hidden_layers"},
      {R"({"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 1024)", "config"},
      {R"({"num_hidden_layers": 2, "num_attention_heads": 64, "head_dim": 512, "qk_rope_head_dim": 640,
           "sliding_window": 128, "compress_ratios": [0, 0]})",
       "qk_rope_head_dim"},
  };
  for (const Case& c : cases) {
    std::string cfg = dir.Write("config.json", c.json);
    CommandResult r = RunTessera("ledger --config " + cfg + " --context 8k");
    ExpectInputError(r, c.field);
  }
  // A compress ratio that does not divide an explicit block.
  std::string cfg = dir.Write("v4.json", R"({"num_hidden_layers": 2, "num_attention_heads": 64, "head_dim": 512,
      "qk_rope_head_dim": 64, "sliding_window": 128, "compress_ratios": [0, 128]})");
  ExpectInputError(RunTessera("ledger --config " + cfg + " --context 8k --block-tokens 192"), "block-tokens");
}

// A FIFO as --config (or --observed-trace) blocked forever waiting for a writer.
TEST(Cli, FifoInputsAreRefusedWithoutBlocking) {
  TempDir dir;
  std::string fifo = dir.path() + "/config.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // (A command that blocks is caught by the test's timeout.)
  ExpectInputError(RunTessera("ledger --config " + fifo + " --context 8k"), "config");
  ExpectInputError(RunTessera("simulate --config " + fifo), "config");
  ExpectInputError(RunTessera("ledger --model deepseek-v3 --context 8k --observed-trace " + fifo), "trace");
}

// Hostile config numbers and shapes through the binary: one line naming the field, exit 2.
TEST(Cli, HostileConfigsNameTheirField) {
  TempDir dir;
  const std::string v4 = R"("num_hidden_layers": 2, "num_attention_heads": 64, "head_dim": 512, "qk_rope_head_dim": 64,
      "compress_ratios": [4, 128], "index_head_dim": 128, "index_n_heads": 64, "index_topk": 512)";
  struct Case {
    std::string json;
    const char* field;
  };
  const Case cases[] = {
      {"{\"num_hidden_layers\": " + std::string(100000, '[') + std::string(100000, ']') + "}", "config"},
      {"{" + v4 + R"(, "sliding_window": 2})", "sliding_window"},
      {"{" + v4 + R"(, "sliding_window": 128, "num_nextn_predict_layers": 4294967295})", "num_nextn_predict_layers"},
      {R"({"num_hidden_layers": 2, "num_attention_heads": 1073741824, "num_key_value_heads": 1073741824,
           "head_dim": 1073741824})",
       "head_dim"},
  };
  for (const Case& c : cases) {
    std::string cfg = dir.Write("config.json", c.json);
    ExpectInputError(RunTessera("ledger --config " + cfg + " --context 8k"), c.field);
  }
  // The V4 window case ran, and counted verify failures under recompute.
  std::string cfg = dir.Write("v4.json", "{" + v4 + R"(, "sliding_window": 2})");
  ExpectInputError(RunTessera("simulate --config " + cfg + " --agents 2 --shared-tokens 512"), "sliding_window");
}

// A config path that is not UTF-8: the JSON renderer threw (exit 1, nothing printed). Invalid
// bytes come out as U+FFFD.
TEST(Cli, NonUtf8ConfigPathRendersAsJson) {
  TempDir dir;
  std::string cfg = dir.Write("cfg-\xff\xfe.json", *PresetConfigText("deepseek-v3"));
  CommandResult r = RunTessera("ledger --config '" + cfg + "' --context 8k --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["model"].get<std::string>().find("cfg-\xef\xbf\xbd\xef\xbf\xbd.json"), std::string::npos);
  std::string prefix = dir.path() + "/receipt";
  CommandResult rc = RunTessera("receipt --config '" + cfg + "' --context 8k --out " + prefix);
  ASSERT_EQ(rc.exit_code, 0) << rc.err;
  std::ifstream in(prefix + ".json");
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NO_THROW(nlohmann::json::parse(text.str()));
}

// --out replaced whatever was at the path with a regular file: a symbolic link (to /dev/stdout,
// or anywhere), a directory's entry. Now: exit 2 naming "out", and the path is left as it was.
TEST(Cli, OutNeverReplacesALinkOrADevice) {
  TempDir dir;
  std::string target = dir.Write("target.txt", "keep");
  std::string link = dir.path() + "/out.json";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  ExpectInputError(RunTessera("ledger --model deepseek-v3 --context 8k --out " + link), "out");
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  std::string to_stdout = dir.path() + "/stdout.json";
  ASSERT_EQ(::symlink("/dev/stdout", to_stdout.c_str()), 0);
  ExpectInputError(RunTessera("ledger --model deepseek-v3 --context 8k --out " + to_stdout), "out");
  EXPECT_TRUE(std::filesystem::is_symlink(to_stdout));
  ExpectInputError(RunTessera("ledger --model deepseek-v3 --context 8k --out " + dir.path()), "out");
  // Receipts: a link at PREFIX.json stops both files.
  std::string prefix = dir.path() + "/r";
  ASSERT_EQ(::symlink(target.c_str(), (prefix + ".json").c_str()), 0);
  ExpectInputError(RunTessera("receipt --model deepseek-v3 --context 8k --out " + prefix), "out");
  EXPECT_FALSE(std::filesystem::exists(prefix + ".md"));
  std::ifstream in(target);
  std::string kept;
  std::getline(in, kept);
  EXPECT_EQ(kept, "keep");
  // Replacing a regular file is what --out is for.
  std::string plain = dir.Write("plain.json", "old");
  EXPECT_EQ(RunTessera("ledger --model deepseek-v3 --context 8k --out " + plain).exit_code, 0);
}

// A failed write to standard output (a full disk) exited 0 with the output cut short.
TEST(Cli, FailedWriteToStdoutExitsOne) {
  for (const std::string args : {"ledger --model deepseek-v3 --context 8k", "report", "layout --model deepseek-v3",
                                 "stats --model deepseek-v2-lite --agents 1 --shared-tokens 64 --unique-tokens 8"}) {
    TempDir dir;
    std::string err = dir.path() + "/stderr";
    std::string cmd = std::string(TESSERA_BINARY) + " " + args + " >/dev/full 2>" + err;
    int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << args;
    EXPECT_EQ(WEXITSTATUS(status), 1) << args;
    std::ifstream e(err);
    std::stringstream text;
    text << e.rdbuf();
    EXPECT_NE(text.str().find("standard output"), std::string::npos) << args << ": " << text.str();
  }
}

// A vLLM prefill peak walked every chunk: 2^40 tokens in 1-token chunks ran for hours (the
// closed form answers at once; a hang is caught by the test's timeout). 2^50 tokens overflow the
// MHA-equivalent bytes and are refused naming the context.
TEST(Cli, VllmPrefillPeakOfAHugeContextIsImmediate) {
  CommandResult r = RunTessera(
      "ledger --model deepseek-v4-pro --context 1099511627776 --engine vllm --prefill-chunk 1 --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["inputs"]["context_tokens"], 1099511627776ULL);
  EXPECT_EQ(j["inputs"]["prefill_chunk_tokens"], 1);
  ExpectInputError(RunTessera("ledger --model deepseek-v4-pro --context 1125899906842624 --engine vllm "
                              "--prefill-chunk 1 --format json"),
                   "context");
}

// A pool smaller than the shared context (16 blocks of 64 tokens by default) crashed: SIGSEGV in
// the block-table access of forked agents.
TEST(Cli, SimulateAndStatsWithATinyPool) {
  for (int capacity : {1, 2, 7, 15, 16}) {
    CommandResult r =
        RunTessera("simulate --agents 4 --capacity-blocks " + std::to_string(capacity) + " --format json");
    ASSERT_EQ(r.exit_code, 0) << capacity << ": " << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["verify_failures"], 0);
    EXPECT_EQ(RunTessera("stats --agents 4 --capacity-blocks " + std::to_string(capacity)).exit_code, 0) << capacity;
  }
  ExpectInputError(RunTessera("simulate --capacity-blocks 4000000000"), "capacity-blocks");
  ExpectInputError(RunTessera("simulate --block-tokens 1048576"), "block-tokens");
}

TEST(Cli, SimulateAgents) {
  CommandResult r = RunTessera(
      "simulate --scenario agents --model deepseek-v2-lite --agents 16 --shared-tokens 300 --unique-tokens 40 "
      "--block-tokens 16 --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["shared_context_copies"], 1);
  EXPECT_EQ(j["verify_failures"], 0);
  EXPECT_EQ(j["cross_tenant_shares"], 0);
  EXPECT_GT(j["dedup_hits"].get<uint64_t>(), 0u);
  EXPECT_GT(j["bytes_saved"].get<uint64_t>(), 0u);
}

TEST(Cli, SimulateForcedCollisions) {
  CommandResult r = RunTessera(
      "simulate --model deepseek-v2-lite --agents 4 --shared-tokens 300 --unique-tokens 40 --block-tokens 16 "
      "--tenants 3 --hash-bits 2 --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["dedup_collisions"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["verify_failures"], 0);
  EXPECT_EQ(j["cross_tenant_shares"], 0);
}

TEST(Cli, StatsIsPrometheusText) {
  CommandResult r =
      RunTessera("stats --model deepseek-v2-lite --agents 2 --shared-tokens 100 --unique-tokens 20 --block-tokens 16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("# TYPE tessera_dedup_collisions_total counter"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tessera_blocks{state=\"cached\"}"), std::string::npos);
  EXPECT_NE(r.out.find("tessera_prefix_hits_total{unit=\"tokens\"}"), std::string::npos);
}

TEST(Cli, SimulateBadInput) {
  ExpectInputError(RunTessera("simulate --scenario chat"), "scenario");
  ExpectInputError(RunTessera("simulate --hash-bits 0"), "hash-bits");
  ExpectInputError(RunTessera("simulate --hash md5"), "hash");
  ExpectInputError(RunTessera("simulate --tenants 0"), "tenants");
  ExpectInputError(RunTessera("simulate --agents lots"), "agents");
  ExpectInputError(RunTessera("simulate --swa-strategy keep"), "swa-strategy");
  ExpectInputError(RunTessera("simulate --tier-write sometimes --disk /tmp/x"), "write-policy");
  ExpectInputError(RunTessera("simulate --host-tier-bytes 64MiB"), "host-tier-bytes");
  ExpectInputError(RunTessera("simulate --host-tier-bytes lots --disk /tmp/x"), "host-tier-bytes");
}

// A first run writes through a disk tier; a second run over the same directory starts with a cold
// pool and takes its prefix hits from disk, every byte verified; a damaged record is quarantined
// and recomputed, never served.
TEST(Cli, SimulateDiskSecondRunHitsFromDisk) {
  TempDir dir;
  const std::string args =
      "simulate --model deepseek-v2-lite --agents 2 --independent 2 --shared-tokens 300 "
      "--unique-tokens 40 --block-tokens 16 --format json --disk " +
      dir.path() + "/tier";
  CommandResult first = RunTessera(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  nlohmann::json a = nlohmann::json::parse(first.out);
  EXPECT_EQ(a["tier_hits"], 0);
  EXPECT_GT(a["disk_records"].get<uint64_t>(), 0u);
  EXPECT_EQ(a["tier_written"], a["disk_records"]);

  CommandResult second = RunTessera(args);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  nlohmann::json b = nlohmann::json::parse(second.out);
  EXPECT_GT(b["tier_hits"].get<uint64_t>(), 0u);
  EXPECT_EQ(b["tier_hit_tokens"].get<uint64_t>(), b["tier_hits"].get<uint64_t>() * 16);
  EXPECT_EQ(b["verify_failures"], 0);
  EXPECT_EQ(b["tier_verify_failures"], 0);
  EXPECT_EQ(b["tier_written"], 0);  // everything sealed was on disk already
  EXPECT_GT(b["prefix_hit_tokens"].get<uint64_t>(), a["prefix_hit_tokens"].get<uint64_t>());

  // Flip a byte in the payload of the first record of the first segment.
  std::string seg = dir.path() + "/tier/seg-000001.tsr";
  {
    std::fstream f(seg, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekp(4096 + 200);
    f.put('\x77');
  }
  CommandResult third = RunTessera(args);
  ASSERT_EQ(third.exit_code, 0) << third.err;
  nlohmann::json c = nlohmann::json::parse(third.out);
  EXPECT_EQ(c["disk_quarantined"], 1);
  EXPECT_EQ(c["verify_failures"], 0);
  EXPECT_LT(c["tier_hits"].get<uint64_t>(), b["tier_hits"].get<uint64_t>());
  EXPECT_EQ(RunTessera("tier fsck " + dir.path() + "/tier").exit_code, 0);  // quarantined and rewritten
}

// Write-back writes what the pool evicts and, at the end of the run (a graceful shutdown), every
// sealed block still cached: a second run hits as after write-through.
TEST(Cli, SimulateDiskWriteBackCheckpointsAtExit) {
  TempDir dir;
  const std::string args =
      "simulate --model deepseek-v2-lite --agents 2 --independent 2 --shared-tokens 300 "
      "--unique-tokens 40 --block-tokens 16 --format json --tier-write write-back --disk " +
      dir.path() + "/tier";
  CommandResult first = RunTessera(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  nlohmann::json a = nlohmann::json::parse(first.out);
  EXPECT_GT(a["tier_written"].get<uint64_t>(), 0u);
  CommandResult second = RunTessera(args);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  nlohmann::json b = nlohmann::json::parse(second.out);
  EXPECT_GT(b["tier_hits"].get<uint64_t>(), 0u);
  EXPECT_EQ(b["verify_failures"], 0);
}

TEST(Cli, SimulateDeepSeekV4Pro) {
  CommandResult r = RunTessera(
      "simulate --model deepseek-v4-pro --agents 1 --independent 1 --shared-tokens 512 --unique-tokens 8 "
      "--swa-strategy snapshot --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["block_tokens"], 256);
  EXPECT_EQ(j["verify_failures"], 0);
  ASSERT_EQ(j["swa_strategies"].size(), 1u);
  EXPECT_EQ(j["swa_strategies"][0]["states_restored"], 1);  // the second wave's re-admission
  // 61 windows of 128 x 584 B + 30 x 4 previous-group rows of 8,192 B and 2,048 B.
  EXPECT_EQ(j["swa_strategies"][0]["bytes_kept_per_boundary"], 5788672);
}

// Window state of a hybrid model through a disk tier, under each strategy: the second run over the
// same directory starts cold, promotes every block from disk and (snapshot, retain) restores the
// window and compressor rows that came with them; every row and entry is verified.
TEST(Cli, SimulateHybridDiskUnderEachStrategy) {
  TempDir dir;
  std::string config = dir.Write("tiny-v4.json", R"({"model_type": "deepseek_v4", "num_hidden_layers": 4,
      "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 128, "qk_rope_head_dim": 64,
      "sliding_window": 128, "compress_ratios": [0, 4, 128, 4, 0], "num_nextn_predict_layers": 1,
      "index_head_dim": 32, "index_n_heads": 4, "index_topk": 16, "max_position_embeddings": 1048576})");
  const std::string args = "simulate --config " + config +
                           " --agents 1 --independent 1 --shared-tokens 768 --unique-tokens 40 --format json --disk " +
                           dir.path() + "/tier";
  ASSERT_EQ(RunTessera(args).exit_code, 0);
  CommandResult r = RunTessera(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["swa_strategies"].size(), 3u);
  for (const auto& st : j["swa_strategies"]) {
    SCOPED_TRACE(st["strategy"].get<std::string>());
    EXPECT_GT(st["tier_hits"].get<uint64_t>(), 0u);
    EXPECT_EQ(st["verify_failures"], 0);
    EXPECT_EQ(st["tier_verify_failures"], 0);
    EXPECT_EQ(st["tier_written"], 0);
    if (st["strategy"] == "recompute") {
      EXPECT_EQ(st["states_restored"], 0);
      EXPECT_GT(st["tokens_recomputed"].get<uint64_t>(), 0u);
    } else {
      EXPECT_EQ(st["states_restored"], st["prefix_hits"]);
      EXPECT_EQ(st["tokens_recomputed"], 0);
    }
  }
  EXPECT_EQ(RunTessera("tier fsck " + dir.path() + "/tier/snapshot").exit_code, 0);
}

TEST(Cli, LayoutDeepSeekV4Pro) {
  CommandResult r = RunTessera("layout --model deepseek-v4-pro --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["block_tokens"], 256);
  bool c4 = false, c128 = false;
  for (const auto& g : j["groups"]) {
    if (g["group"] == "compressed/4") {
      c4 = true;
      EXPECT_EQ(g["entries_per_block"], 64);
      // ADR 0020: the 30 layers' slices of 37,376 B share one page, padded once.
      EXPECT_EQ(g["layers_per_page"], 30);
      EXPECT_EQ(g["layer_stride"], 37376);
      EXPECT_EQ(g["page_bytes"], 1121472);
      EXPECT_EQ(g["block_bytes"], 1121472);
    }
    if (g["group"] == "compressed/128") {
      c128 = true;
      EXPECT_EQ(g["entries_per_block"], 2);
      EXPECT_EQ(g["layers_per_page"], 31);
      EXPECT_EQ(g["page_bytes"], 36288);
      EXPECT_EQ(g["padding_bytes"], 80);
    }
  }
  EXPECT_TRUE(c4 && c128);
  nlohmann::json v3 = nlohmann::json::parse(RunTessera("layout --model deepseek-v3 --format json").out);
  EXPECT_EQ(v3["block_tokens"], 64);
  ExpectInputError(RunTessera("layout --model deepseek-v4-pro --block-tokens 100"), "block-tokens");
  CommandResult note = RunTessera("layout --model deepseek-v4-pro --block-tokens 128");
  EXPECT_EQ(note.exit_code, 0);
  EXPECT_NE(note.out.find("misses a preference"), std::string::npos);
}

TEST(Cli, LedgerPhasesAndStrategies) {
  CommandResult r = RunTessera("ledger --model deepseek-v4-pro --context 1m --engine vllm --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["phases"][0]["phase"], "admission");
  EXPECT_EQ(j["phases"][0]["bytes"], 11041257600ULL);
  CommandResult t = RunTessera("ledger --model deepseek-v4-pro --context 1m --swa-strategy retain --format json");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  nlohmann::json k = nlohmann::json::parse(t.out);
  EXPECT_EQ(k["swa_strategies"].size(), 3u);
  EXPECT_EQ(k["inputs"]["swa_strategy"], "retain");
  ExpectInputError(RunTessera("ledger --model deepseek-v4-pro --context 1m --swa-strategy keep"), "swa-strategy");
}

TEST(Cli, TierFsckAndStats) {
  TempDir dir;
  std::string tier = dir.path() + "/tier";
  {
    DiskTierOptions o;
    o.dir = tier;
    auto t = std::move(DiskTier::Open(o)).value();
    std::vector<TierRecord> batch;
    for (uint64_t i = 0; i < 5; ++i)
      batch.push_back(TierRecord{Hash128{i + 1, i}, 0, std::vector<std::byte>(5000, std::byte{7})});
    ASSERT_TRUE(t->PutBatch(batch).ok());
  }
  CommandResult clean = RunTessera("tier fsck " + tier + " --format json");
  EXPECT_EQ(clean.exit_code, 0) << clean.err;
  nlohmann::json j = nlohmann::json::parse(clean.out);
  EXPECT_EQ(j["records"], 5);
  EXPECT_EQ(j["quarantined"], 0);
  // Damage the second record's payload: fsck quarantines it and exits 1; stats then shows 4.
  std::string seg = tier + "/seg-000001.tsr";
  {
    std::fstream f(seg, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 + 8192 + 4096 + 100);
    f.put('\x55');
  }
  CommandResult bad = RunTessera("tier fsck " + tier);
  EXPECT_EQ(bad.exit_code, 1) << bad.out << bad.err;
  EXPECT_NE(bad.out.find("payload fails authentication"), std::string::npos) << bad.out;
  nlohmann::json st = nlohmann::json::parse(RunTessera("tier stats " + tier + " --format json").out);
  EXPECT_EQ(st["records"], 4);
  EXPECT_EQ(st["quarantined"], 0);
  EXPECT_GT(st["dead_bytes"].get<uint64_t>(), 0u);
  ExpectInputError(RunTessera("tier stats " + dir.path() + "/missing"), "dir");
}

// --observed-trace: the trace's labels name reconciliation terms (here the MTP layer vLLM holds
// under MTP speculative decoding), reported with the labelled bytes.
TEST(Cli, ObservedTraceLabelsNameTerms) {
  TempDir dir;
  Ledger l = testing::MustLedger(testing::Preset("deepseek-v3"), testing::Context(8192, "", Engine::kVllm));
  LedgerOptions mtp = testing::Context(8192, "", Engine::kVllm);
  mtp.include_mtp = true;
  const uint64_t extra = testing::MustLedger(testing::Preset("deepseek-v3"), mtp).committed_bytes - l.committed_bytes;
  std::string trace = dir.Write("trace.txt", "# from the engine\n" + std::to_string(l.committed_bytes) + " kv_cache\n" +
                                                 std::to_string(extra) + " mtp_layers\n");
  CommandResult r =
      RunTessera("ledger --model deepseek-v3 --context 8192 --engine vllm --format json --observed-trace " + trace);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json rec = nlohmann::json::parse(r.out)["reconciliation"];
  ASSERT_EQ(rec["attributed"].size(), 1u) << rec.dump();
  EXPECT_EQ(rec["attributed"][0]["term"], "+mtp_layers");
  EXPECT_EQ(rec["attributed"][0]["trace_bytes"], extra);
  EXPECT_EQ(rec["unexplained_bytes"], 0);
}

// tier printed with printf: a full disk exited 0 with the output cut; --format markdown was taken
// and printed the table.
TEST(Cli, TierOutputIsCheckedAndMarkdownRefused) {
  TempDir dir;
  std::string tier = dir.path() + "/tier";
  {
    DiskTierOptions o;
    o.dir = tier;
    ASSERT_TRUE(DiskTier::Open(o).ok());
  }
  for (const std::string action : {"stats", "fsck"}) {
    for (const std::string format : {"table", "json"}) {
      std::string err = dir.path() + "/stderr";
      std::string cmd =
          std::string(TESSERA_BINARY) + " tier " + action + " " + tier + " --format " + format + " >/dev/full 2>" + err;
      int status = std::system(cmd.c_str());
      ASSERT_TRUE(WIFEXITED(status)) << action;
      EXPECT_EQ(WEXITSTATUS(status), 1) << action << " " << format;
      std::ifstream e(err);
      std::stringstream text;
      text << e.rdbuf();
      EXPECT_NE(text.str().find("standard output"), std::string::npos) << action << ": " << text.str();
    }
    ExpectInputError(RunTessera("tier " + action + " " + tier + " --format markdown"), "format");
  }
}

// Write-back with a host tier: the exit checkpoint writes what the pool evicted into host memory
// as well, so the directory ends up holding every block write-through would have written.
TEST(Cli, SimulateWriteBackThroughAHostTierLosesNothingAtExit) {
  TempDir dir;
  const std::string common = "simulate --agents 4 --capacity-blocks 40 --format json --disk ";
  CommandResult through = RunTessera(common + dir.path() + "/through --tier-write write-through");
  ASSERT_EQ(through.exit_code, 0) << through.err;
  CommandResult back = RunTessera(common + dir.path() + "/back --tier-write write-back --host-tier-bytes 1GiB");
  ASSERT_EQ(back.exit_code, 0) << back.err;
  nlohmann::json t = nlohmann::json::parse(through.out), b = nlohmann::json::parse(back.out);
  EXPECT_GT(b["evictions"].get<uint64_t>(), 0u);  // blocks did sit in the host tier
  EXPECT_EQ(b["disk_records"], t["disk_records"]);
  nlohmann::json st = nlohmann::json::parse(RunTessera("tier stats " + dir.path() + "/back --format json").out);
  EXPECT_EQ(st["records"], t["disk_records"]);
}

// fsck and stats never create a directory; a path that is not UTF-8 or holds a quote still gives
// valid JSON; a directory held by a writer is refused at once (exit 1, "locked").
TEST(Cli, TierCommandsAreReadOnlyEscapedAndLocked) {
  TempDir dir;
  for (const char* action : {"fsck", "stats"}) {
    ExpectInputError(RunTessera(std::string("tier ") + action + " " + dir.path() + "/absent"), "dir");
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/absent"));
  const std::string odd = dir.path() + "/a\"b\\c\xff";
  {
    DiskTierOptions o;
    o.dir = odd;
    auto t = std::move(DiskTier::Open(o)).value();
    ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{TierRecord{Hash128{1, 2}, 0, std::vector<std::byte>(100)}}).ok());
  }
  CommandResult r = RunTessera("tier stats '" + odd + "' --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);  // throws (fails the test) on invalid JSON
  EXPECT_EQ(j["records"], 1);
  DiskTierOptions o;
  o.dir = odd;
  auto holder = std::move(DiskTier::Open(o)).value();
  CommandResult locked = RunTessera("tier fsck '" + odd + "'");
  EXPECT_EQ(locked.exit_code, 1);
  EXPECT_NE(locked.err.find("locked"), std::string::npos) << locked.err;
}

TEST(Cli, HelpExitsZero) {
  CommandResult r = RunTessera("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("ledger"), std::string::npos);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// `tessera generate` (ADR 0017): weights written from a seed, read back, the dump's shape, the
// argmax chain, determinism, and a flipped page byte changing the logits.
TEST(CliGenerate, EndToEndWithDumpAndFlippedPageByte) {
  TempDir dir;
  const std::string w = dir.path() + "/tiny.safetensors", d1 = dir.path() + "/a.json", d2 = dir.path() + "/b.json",
                    d3 = dir.path() + "/c.json";
  const std::string prompt = "--prompt-tokens 5,17,200,3,3,90,1 --steps 6";
  CommandResult init = RunTessera("generate --model tiny-dsa --kv-format fp8_ds_mla " + prompt + " --weights " + w +
                                  " --init-weights --seed 9 --dump " + d1);
  ASSERT_EQ(init.exit_code, 0) << init.err;
  EXPECT_NE(init.out.find("tokens 5,17,200,3,3,90,1,"), std::string::npos) << init.out;
  std::ifstream f1(d1);
  const nlohmann::json j = nlohmann::json::parse(f1);
  EXPECT_EQ(j["model"], "tiny-dsa");
  EXPECT_EQ(j["kv_format"], "fp8_ds_mla");
  EXPECT_EQ(j["attention"], "absorbed");
  EXPECT_EQ(j["weights"], w);
  EXPECT_EQ(j["prompt_len"], 7);
  ASSERT_EQ(j["tokens"].size(), 13u);
  ASSERT_EQ(j["logits"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    const auto& row = j["logits"][i];
    ASSERT_EQ(row.size(), 256u);
    size_t best = 0;
    for (size_t k = 1; k < row.size(); ++k) {
      if (row[k].get<double>() > row[best].get<double>()) best = k;
    }
    EXPECT_EQ(j["tokens"][7 + i].get<size_t>(), best) << "step " << i;
  }
  // The file written is read back: the same run, byte for byte.
  CommandResult again =
      RunTessera("generate --model tiny-dsa --kv-format fp8_ds_mla " + prompt + " --weights " + w + " --dump " + d2);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  std::ifstream f2(d2);
  EXPECT_EQ(nlohmann::json::parse(f2), j);
  // A flipped byte of a prompt token's latent record (layer 1, position 2, byte 7) changes them.
  CommandResult flipped = RunTessera("generate --model tiny-dsa --kv-format fp8_ds_mla " + prompt + " --weights " + w +
                                     " --dump " + d3 + " --flip-page-byte 1,2,7");
  ASSERT_EQ(flipped.exit_code, 0) << flipped.err;
  std::ifstream f3(d3);
  const nlohmann::json k = nlohmann::json::parse(f3);
  EXPECT_EQ(k["tokens"][6], j["tokens"][6]);  // the prompt
  EXPECT_EQ(k["logits"][0], j["logits"][0]);  // computed before the flip (it comes after prefill)
  EXPECT_NE(k["logits"][1], j["logits"][1]);  // the first decode step reads the flipped record
  // Naive attention, bf16 pages: runs on the same file.
  CommandResult naive = RunTessera("generate --model tiny-dsa --attention naive " + prompt + " --weights " + w);
  EXPECT_EQ(naive.exit_code, 0) << naive.err;
}

// tiny-v4 (ADR 0018) through the same command: v4-fp8 pages, the dump, a flipped byte of a
// compressed entry changing the decode, and what it refuses.
TEST(CliGenerate, TinyV4) {
  TempDir dir;
  const std::string w = dir.path() + "/v4.safetensors", d1 = dir.path() + "/a.json", d2 = dir.path() + "/b.json";
  const std::string prompt = "--prompt-tokens 5,17,200,3,3,90,1,8,9,10 --steps 4";
  CommandResult init =
      RunTessera("generate --model tiny-v4 " + prompt + " --weights " + w + " --init-weights --seed 3 --dump " + d1);
  ASSERT_EQ(init.exit_code, 0) << init.err;
  std::ifstream f1(d1);
  const nlohmann::json j = nlohmann::json::parse(f1);
  EXPECT_EQ(j["model"], "tiny-v4");
  EXPECT_EQ(j["kv_format"], "v4-fp8");
  EXPECT_EQ(j["prompt_len"], 10);
  ASSERT_EQ(j["tokens"].size(), 14u);
  ASSERT_EQ(j["logits"].size(), 4u);
  // Layer 1 is a CSA layer (ratio 4): 10 prompt tokens make entries 0 and 1; flip entry 1's byte 3.
  CommandResult flipped = RunTessera("generate --model tiny-v4 " + prompt + " --weights " + w + " --dump " + d2 +
                                     " --flip-page-byte 1,1,3");
  ASSERT_EQ(flipped.exit_code, 0) << flipped.err;
  std::ifstream f2(d2);
  const nlohmann::json k = nlohmann::json::parse(f2);
  EXPECT_EQ(k["logits"][0], j["logits"][0]);  // computed before the flip
  EXPECT_NE(k["logits"][1], j["logits"][1]);
  ExpectInputError(RunTessera("generate --model tiny-v4 " + prompt + " --weights " + w + " --kv-format fp8_ds_mla"),
                   "kv-format");
  ExpectInputError(RunTessera("generate --model tiny-v4 " + prompt + " --weights " + w + " --attention naive"),
                   "attention");
  ExpectInputError(RunTessera("generate --model tiny-v4 " + prompt + " --weights " + w + " --swa-strategy sideways"),
                   "swa-strategy");
  // Layer 0 is sliding-window only: it has no compressed entries.
  ExpectInputError(RunTessera("generate --model tiny-v4 " + prompt + " --weights " + w + " --flip-page-byte 0,0,0"),
                   "flip-page-byte");
  ExpectInputError(RunTessera("generate --model tiny-v4 " + prompt + " --weights " + w + " --flip-page-byte 1,1,584"),
                   "flip-page-byte");
}

TEST(CliGenerate, BadInputExitsTwoNamingTheField) {
  TempDir dir;
  const std::string w = dir.path() + "/w.safetensors", dump = dir.path() + "/d.json";
  ASSERT_EQ(RunTessera("generate --model tiny-mla --prompt-tokens 1 --steps 1 --init-weights --weights " + w).exit_code,
            0);
  const std::string ok = " --prompt-tokens 1,2 --steps 2 --weights " + w + " --dump " + dump;
  ExpectInputError(RunTessera("generate --model tiny-v4" + ok), "weights");  // tiny-mla's file
  ExpectInputError(RunTessera("generate --model tiny-mla --swa-strategy retain" + ok), "swa-strategy");
  ExpectInputError(RunTessera("generate --model deepseek-v3" + ok), "model");
  ExpectInputError(RunTessera("generate --model tiny-mla --kv-format mha-bf16" + ok), "kv-format");
  ExpectInputError(RunTessera("generate --model tiny-mla --kv-format v4-fp8" + ok), "kv-format");
  ExpectInputError(RunTessera("generate --model tiny-mla --attention flash" + ok), "attention");
  ExpectInputError(RunTessera("generate --model tiny-dsa" + ok), "weights");  // tiny-mla's file
  ExpectInputError(RunTessera("generate --model tiny-mla --prompt-tokens 1,x --steps 2 --weights " + w),
                   "prompt-tokens");
  ExpectInputError(RunTessera("generate --model tiny-mla --prompt-tokens 1,256 --steps 2 --weights " + w),
                   "prompt-tokens");
  ExpectInputError(RunTessera("generate --model tiny-mla --prompt-tokens 1 --steps 0 --weights " + w), "steps");
  ExpectInputError(RunTessera("generate --model tiny-mla --prompt-tokens 1 --steps 2"), "weights");
  ExpectInputError(RunTessera("generate --model tiny-mla --flip-page-byte 4,0,0" + ok), "flip-page-byte");
  ExpectInputError(RunTessera("generate --model tiny-mla --flip-page-byte 0,2,0" + ok), "flip-page-byte");
  ExpectInputError(RunTessera("generate --model tiny-mla --flip-page-byte 0,0,1152" + ok), "flip-page-byte");
  ExpectInputError(
      RunTessera("generate --model tiny-mla --weights " + dir.path() + "/none --prompt-tokens 1 --steps 1"), "weights");
  // A truncated weight file names the tensor whose data is cut.
  {
    std::ifstream in(w, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string cut = dir.Write("cut.safetensors", bytes.substr(0, bytes.size() - 100));
    CommandResult r = RunTessera("generate --model tiny-mla --prompt-tokens 1 --steps 1 --weights " + cut);
    ExpectInputError(r, "head.weight");
  }
  EXPECT_FALSE(std::filesystem::exists(dump));
}

}  // namespace
}  // namespace tessera

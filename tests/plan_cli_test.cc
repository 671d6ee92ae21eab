// `tessera plan` and `tessera price` end to end through the binary: exit codes, one-line errors
// naming the field, gates and the rejected configurations.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

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

void ExpectInputError(const std::string& args, const std::string& field) {
  CommandResult r = RunTessera(args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
  EXPECT_EQ(Lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(field), std::string::npos) << "expected field " << field << " in: " << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

const std::string kPlan = "plan --model deepseek-v3.2 --gpu H200-141G --tp 8 --context 128k";

TEST(PlanCli, JsonAgreesWithItself) {
  CommandResult r = RunTessera(kPlan + " --gpu-memory-utilization 0.9 --weights-dtype fp8 --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["usable_bytes"].get<uint64_t>(), 126900000000ULL);
  EXPECT_EQ(j["kv_budget_bytes"].get<uint64_t>(),
            j["usable_bytes"].get<uint64_t>() - j["weights"]["bytes_per_rank"].get<uint64_t>());
  ASSERT_EQ(j["engines"].size(), 3u);
  for (const auto& e : j["engines"]) {
    for (const auto& ph : e["phases"]) {
      EXPECT_EQ(ph["max_concurrency"].get<uint64_t>(),
                j["kv_budget_bytes"].get<uint64_t>() / ph["bytes_per_request"].get<uint64_t>());
    }
  }
  EXPECT_TRUE(j["rejected"].empty());
}

TEST(PlanCli, TextAndMarkdown) {
  CommandResult t = RunTessera(kPlan + " --concurrency 4");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("KV budget"), std::string::npos);
  EXPECT_NE(t.out.find("max context"), std::string::npos);
  CommandResult m = RunTessera(kPlan + " --format markdown");
  ASSERT_EQ(m.exit_code, 0) << m.err;
  EXPECT_NE(m.out.find("| engine | phase |"), std::string::npos);
}

TEST(PlanCli, GatesExitOneAndListTheRejected) {
  CommandResult r = RunTessera(kPlan + " --min-concurrency 1000000");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.out.find("rejected configurations:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--min-concurrency"), std::string::npos);
  CommandResult j = RunTessera(kPlan + " --max-committed-bytes 1GiB --concurrency 2 --format json");
  EXPECT_EQ(j.exit_code, 1) << j.err;
  nlohmann::json k = nlohmann::json::parse(j.out);
  EXPECT_EQ(k["rejected"].size(), 3u);
  EXPECT_EQ(k["gates"]["max_committed_bytes"].get<uint64_t>(), 1073741824ULL);
  // Gates that every configuration passes: exit 0.
  CommandResult ok = RunTessera(kPlan + " --min-concurrency 1 --max-committed-bytes 1TiB");
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
}

// Rejections read in units, the exact count beside them (issue 22 point 4).
TEST(PlanCli, RejectionsInHumanUnits) {
  CommandResult r = RunTessera(kPlan + " --max-committed-bytes 1GiB --concurrency 2");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.out.find("per rank > --max-committed-bytes 1 GiB (1,073,741,824 B)"), std::string::npos) << r.out;
  CommandResult w = RunTessera("plan --model deepseek-v3 --gpu H100-80G --tp 1 --context 8k");
  EXPECT_EQ(w.exit_code, 1) << w.err;
  EXPECT_NE(w.out.find(" GiB ("), std::string::npos) << w.out;
  EXPECT_EQ(w.out.find("B per rank) plus reserve ("), std::string::npos) << w.out;
}

// --max-model-len caps vLLM's and SGLang's contexts (the longest-context search included);
// Tessera's pools have none (issue 22 point 2).
TEST(PlanCli, MaxModelLenCapsVllmAndSglang) {
  ExpectInputError(kPlan + " --max-model-len 64k", "max-model-len");  // the context 128k is past it
  CommandResult r = RunTessera(kPlan + " --concurrency 1 --max-model-len 128k --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  for (const auto& e : j["engines"]) {
    if (e["engine"] != "tessera") {
      EXPECT_LE(e["max_context"].get<uint64_t>(), 131072u) << e.dump();
    }
  }
}

TEST(PlanCli, BadInputExitsTwoNamingTheField) {
  const std::string base = "plan --model deepseek-v3.2 --context 128k";
  ExpectInputError(base + " --gpu A100 --tp 8", "gpu");
  ExpectInputError(base + " --tp 8", "gpu");
  ExpectInputError(base + " --gpu H200-141G --tp 8 --gpu-memory-utilization 0", "gpu-memory-utilization");
  ExpectInputError(base + " --gpu H200-141G --tp 8 --gpu-memory-utilization 1.1", "gpu-memory-utilization");
  ExpectInputError(base + " --gpu H200-141G --tp 8 --weights-dtype fp4", "weights-dtype");
  ExpectInputError("plan --model kimi-k2 --context 128k --gpu H200-141G --tp 8 --weights-dtype fp8", "weights-dtype");
  ExpectInputError(base + " --gpu H200-141G --tp 3", "tp");
  ExpectInputError(base + " --gpu H200-141G --tp 8 --engine trt", "engine");
  ExpectInputError(base + " --gpu H200-141G --tp 8 --concurrency 0", "concurrency");
  ExpectInputError(base + " --gpu H200-141G --tp 8 --format yaml", "format");
  ExpectInputError("plan --model deepseek-v3.2 --gpu H200-141G --tp 8", "context");
}

TEST(PlanCli, GpuSpecFile) {
  TempDir dir;
  std::string spec = dir.Write("gpu.json", R"({"name": "Mine", "memory_bytes": 141000000000,
      "hbm_bytes_per_s": 4800000000000, "dense_bf16_flops": 989500000000000, "dense_fp8_flops": 1979000000000000})");
  CommandResult a = RunTessera(kPlan + " --format json");
  CommandResult b =
      RunTessera("plan --model deepseek-v3.2 --gpu-spec " + spec + " --tp 8 --context 128k --format json");
  ASSERT_EQ(a.exit_code, 0);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(a.out)["engines"], nlohmann::json::parse(b.out)["engines"]);
  std::string bad = dir.Write("bad.json", R"({"name": "x", "memory_bytes": "lots"})");
  ExpectInputError("plan --model deepseek-v3.2 --gpu-spec " + bad + " --tp 8 --context 128k", "memory_bytes");
}

// price says what it prices (attention only), in units, and what its crossovers mean (issue 22
// point 4).
TEST(PriceCli, AttentionOnlyHumanUnitsAndCrossoversInWords) {
  CommandResult r = RunTessera("price --model deepseek-v3 --gpu H200-141G --tp 8 --batch 64 --context 128k");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("MLA attention for one decoded token per sequence"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("attention only:"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(" decode step, batch"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" s at the roofline"), std::string::npos) << r.out;  // 2.17 s, not 2174316.88 µs
  EXPECT_NE(r.out.find(" ms at the roofline"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(".88 µs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("compute-bound from context 23 tokens on at this batch (memory-bound below)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("compute-bound from batch 1 on at this context"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("crossover context 23"), std::string::npos) << r.out;
}

TEST(PriceCli, JsonAndErrors) {
  CommandResult r =
      RunTessera("price --model deepseek-v3 --gpu H200-141G --tp 8 --batch 64 --context 128k --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["absorbed"]["bound"], "memory");
  EXPECT_GT(j["naive"]["flops"].get<uint64_t>(), j["absorbed"]["flops"].get<uint64_t>());
  EXPECT_EQ(j["layers"][0]["absorbed_per_head"]["q_absorb"].get<uint64_t>(), 2u * 128 * 512);
  ExpectInputError("price --model llama-3.1-8b --gpu H200-141G --context 1k", "model");
  ExpectInputError("price --model deepseek-v3 --gpu H300 --context 1k", "gpu");
  ExpectInputError("price --model deepseek-v3 --gpu H200-141G --context 1k --batch 0", "batch");
}

}  // namespace
}  // namespace tessera

#include "tessera_tools/claims.h"

#include <gtest/gtest.h>

#include "test_support.h"

namespace tessera {
namespace {

const ClaimResult& Find(const ClaimCheck& c, const std::string& id) {
  for (const ClaimResult& r : c.results) {
    if (r.id == id) return r;
  }
  ADD_FAILURE() << "no claim " << id;
  static ClaimResult none;
  return none;
}

class SeedClaims : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<ClaimCheck> c = CheckSeedClaims();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    check_ = *c;
  }
  ClaimCheck check_;
};

TEST_F(SeedClaims, EveryPublishedCellIsChecked) {
  EXPECT_EQ(check_.results.size(), 23u);  // 5 contexts x 4 columns + CSA, HCA, SWA
}

TEST_F(SeedClaims, HcaIsNineHalvesNotFour) {
  const ClaimResult& r = Find(check_, "v4-hca");
  EXPECT_EQ(r.verdict, Verdict::kWrong);
  EXPECT_NE(r.exact.find("9/2"), std::string::npos);
  EXPECT_EQ(Find(check_, "v4-csa").verdict, Verdict::kCorrect);
  EXPECT_EQ(Find(check_, "v4-swa").verdict, Verdict::kCorrect);
}

TEST_F(SeedClaims, GbColumnIsGiB) {
  for (const char* id : {"v3-mha-8k", "v3-mha-32k", "v3-mha-128k"}) {
    EXPECT_EQ(Find(check_, id).verdict, Verdict::kMislabeled) << id;
    EXPECT_EQ(Find(check_, id).reading, "GiB") << id;
  }
  for (const char* id : {"v3-mha-512k", "v3-mha-1m"}) {
    EXPECT_EQ(Find(check_, id).verdict, Verdict::kMislabeled) << id;
    EXPECT_EQ(Find(check_, id).reading, "GiB/1000") << id;
  }
}

TEST_F(SeedClaims, MlaBf16PastEightKIsAboutOnePointTwoPercentHigh) {
  EXPECT_EQ(Find(check_, "v3-bf16-8k").verdict, Verdict::kMislabeled);
  for (const char* id : {"v3-bf16-32k", "v3-bf16-128k", "v3-bf16-512k", "v3-bf16-1m"}) {
    const ClaimResult& r = Find(check_, id);
    EXPECT_EQ(r.verdict, Verdict::kWrong) << id;
    EXPECT_NEAR(r.error_percent, 1.19, 0.02) << id;
  }
}

TEST_F(SeedClaims, Fp8ValuesAreLow) {
  for (const char* id : {"v3-fp8-32k", "v3-fp8-128k", "v3-fp8-512k", "v3-fp8-1m"}) {
    const ClaimResult& r = Find(check_, id);
    EXPECT_EQ(r.verdict, Verdict::kWrong) << id;
    EXPECT_LT(r.error_percent, -0.5) << id;
    EXPECT_GT(r.error_percent, -1.0) << id;
  }
}

TEST_F(SeedClaims, RatioIsAConstant) {
  for (const char* id : {"v3-ratio-8k", "v3-ratio-32k", "v3-ratio-1m"}) {
    EXPECT_EQ(Find(check_, id).verdict, Verdict::kWrong) << id;
    EXPECT_NE(Find(check_, id).exact.find("512/9"), std::string::npos) << id;
  }
  bool constant_finding = false;
  for (const std::string& f : check_.findings)
    constant_finding = constant_finding || f.find("same exact value") != std::string::npos;
  EXPECT_TRUE(constant_finding);
}

TEST(Claims, CorrectClaimIsCorrect) {
  ClaimCheck c = *CheckClaims(R"({"claims": [
      {"id": "a", "column": "x", "model": "deepseek-v3", "kv_format": "mla-bf16", "context": "128k",
       "quantity": "requested_bytes", "claimed": "9.21", "unit": "GB"},
      {"id": "b", "column": "x", "model": "deepseek-v3", "kv_format": "mla-bf16", "context": "128k",
       "quantity": "requested_bytes", "claimed": "9210691584", "unit": "B"}]})");
  EXPECT_EQ(c.results[0].verdict, Verdict::kCorrect);
  EXPECT_EQ(c.results[1].verdict, Verdict::kCorrect);
}

TEST(Claims, BadTablesNameTheField) {
  EXPECT_EQ(CheckClaims("{").status().field(), "claims");
  EXPECT_EQ(CheckClaims(R"({"claims": [{"id": "a", "model": "deepseek-v3", "quantity": "requested_bytes",
      "claimed": "1.2.3", "unit": "GB", "context": "8k"}]})")
                .status()
                .field(),
            "claimed");
  EXPECT_EQ(CheckClaims(R"({"claims": [{"id": "a", "model": "deepseek-v3", "quantity": "requested_bytes",
      "claimed": "1", "unit": "furlongs", "context": "8k"}]})")
                .status()
                .field(),
            "unit");
}

}  // namespace
}  // namespace tessera

#include "tessera/status.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

Result<int> Half(int v) {
  if (v % 2 != 0) return InvalidArgument("value", "must be even (got " + std::to_string(v) + ")");
  return v / 2;
}

Result<int> Quarter(int v) {
  TESSERA_ASSIGN_OR_RETURN(int h, Half(v));
  return Half(h);
}

TEST(Status, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "ok");
}

TEST(Status, ToStringNamesTheField) {
  Status s = InvalidArgument("qk_rope_head_dim", "must be a positive integer (got 0)");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.field(), "qk_rope_head_dim");
  EXPECT_EQ(s.ToString(), "qk_rope_head_dim: must be a positive integer (got 0)");
}

TEST(Status, ToStringIsOneLine) {
  Status s = InvalidArgument("config", "line one\nline two\r");
  EXPECT_EQ(s.ToString().find('\n'), std::string::npos);
  EXPECT_EQ(s.ToString().find('\r'), std::string::npos);
}

TEST(Result, CarriesValueOrStatus) {
  Result<int> ok = Half(8);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 4);
  Result<int> bad = Half(3);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().field(), "value");
}

TEST(Result, AssignOrReturnPropagates) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> bad = Quarter(6);  // 6/2 = 3 is odd
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("got 3"), std::string::npos);
}

TEST(Status, CodeNames) {
  EXPECT_EQ(StatusCodeName(StatusCode::kOutOfBlocks), "out of blocks");
  EXPECT_EQ(StatusCodeName(StatusCode::kDataLoss), "data loss");
}

}  // namespace
}  // namespace tessera

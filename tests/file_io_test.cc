#include "tessera/file_io.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_support.h"

namespace tessera {
namespace {

std::string Slurp(const std::string& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(FileIo, WritesAllFiles) {
  testing::TempDir dir;
  std::string a = dir.path() + "/a.md", b = dir.path() + "/b.json";
  ASSERT_TRUE(WriteFilesAtomically({{a, "alpha"}, {b, "{}"}}).ok());
  EXPECT_EQ(Slurp(a), "alpha");
  EXPECT_EQ(Slurp(b), "{}");
  // No temporaries left behind.
  int entries = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 2);
}

TEST(FileIo, NothingPartialOnFailure) {
  testing::TempDir dir;
  std::string good = dir.path() + "/good.md";
  std::string bad = dir.path() + "/no-such-dir/bad.json";
  Status st = WriteFilesAtomically({{good, "alpha"}, {bad, "{}"}});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.field(), "out");
  EXPECT_FALSE(std::filesystem::exists(good));
  int entries = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 0);
}

}  // namespace
}  // namespace tessera

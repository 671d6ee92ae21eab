#include "tessera/tier_key.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "tessera/disk_tier.h"
#include "tessera/unique_fd.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::TempDir;

mode_t ModeOf(const std::string& path) {
  struct stat sb {};
  EXPECT_EQ(::stat(path.c_str(), &sb), 0) << path;
  return sb.st_mode & 0777;
}

Result<TierKey> LoadAt(const std::string& dir, bool create) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  EXPECT_TRUE(fd.valid()) << dir;
  return LoadTierKeyAt(fd.get(), dir, create);
}

TEST(TierKey, CreatedOnceWithOwnerOnlyModeAndValidated) {
  TempDir dir;
  Result<TierKey> k = DiskTier::LoadOrCreateKey(dir.path() + "/sub");
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(k->secret.size(), 32u);
  EXPECT_TRUE(k->warnings.empty());
  EXPECT_EQ(ModeOf(dir.path() + "/sub/prefix.key"), 0600u);
  EXPECT_EQ(ModeOf(dir.path() + "/sub"), 0700u);
  EXPECT_EQ(DiskTier::LoadOrCreateKey(dir.path() + "/sub")->secret, k->secret);
  Result<TierKey> other = DiskTier::LoadOrCreateKey(dir.path() + "/other");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->secret, k->secret);
  std::filesystem::create_directories(dir.path() + "/bad");
  dir.Write("bad/prefix.key", "short");
  Result<TierKey> bad = DiskTier::LoadOrCreateKey(dir.path() + "/bad");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(bad.status().field(), "dir");
}

TEST(TierKey, AbsentKeyIsNotFoundWhenNotToBeCreated) {
  TempDir dir;
  Result<TierKey> k = LoadAt(dir.path(), /*create=*/false);
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(k.status().field(), "dir");
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/prefix.key"));
}

TEST(TierKey, LinkOrFifoIsRefusedNeverFollowed) {
  TempDir dir;
  const std::string victim = dir.Write("victim", std::string(32, 'v'));
  std::filesystem::create_directories(dir.path() + "/linked");
  std::filesystem::create_symlink(victim, dir.path() + "/linked/prefix.key");
  Result<TierKey> linked = LoadAt(dir.path() + "/linked", /*create=*/true);
  ASSERT_FALSE(linked.ok());
  EXPECT_EQ(linked.status().code(), StatusCode::kIoError);
  EXPECT_NE(linked.status().message().find("symbolic link"), std::string::npos) << linked.status().ToString();

  std::filesystem::create_directories(dir.path() + "/fifo");
  ASSERT_EQ(::mkfifo((dir.path() + "/fifo/prefix.key").c_str(), 0600), 0);
  Result<TierKey> fifo = LoadAt(dir.path() + "/fifo", /*create=*/true);  // must not block
  ASSERT_FALSE(fifo.ok());
  EXPECT_EQ(fifo.status().code(), StatusCode::kIoError);
  EXPECT_NE(fifo.status().message().find("not a regular file"), std::string::npos) << fifo.status().ToString();
}

TEST(TierKey, KeyReadableByOthersIsServedWithAWarning) {
  TempDir dir;
  Result<TierKey> k = DiskTier::LoadOrCreateKey(dir.path());
  ASSERT_TRUE(k.ok());
  ASSERT_EQ(::chmod((dir.path() + "/prefix.key").c_str(), 0644), 0);
  Result<TierKey> again = DiskTier::LoadOrCreateKey(dir.path());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->secret, k->secret);
  ASSERT_EQ(again->warnings.size(), 1u);
  EXPECT_NE(again->warnings[0].find("mode 644"), std::string::npos) << again->warnings[0];
}

TEST(TierKey, DirectoryIsRequired) {
  Status st = CreateTierDirectory("");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.field(), "dir");
}

}  // namespace
}  // namespace tessera

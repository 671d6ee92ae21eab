#include "tessera/file_io.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/file_io_testing.h"
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
  // A folder is created where missing, but not under a regular file.
  std::string plain = dir.Write("plain", "x");
  std::string bad = plain + "/bad.json";
  Status st = WriteFilesAtomically({{good, "alpha"}, {bad, "{}"}});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.field(), "out");
  EXPECT_NE(st.message().find(bad), std::string::npos) << st.ToString();
  EXPECT_EQ(st.message().find(".tmp"), std::string::npos) << st.ToString();
  EXPECT_FALSE(std::filesystem::exists(good));
  int entries = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);  // the plain file only
}

// --out receipts/v32 where receipts/ does not exist: the folders are made (issue 22 point 4).
TEST(FileIo, MissingParentFoldersAreCreated) {
  testing::TempDir dir;
  const std::string a = dir.path() + "/receipts/deep/v32.md";
  const std::string b = dir.path() + "/receipts/deep/v32.json";
  ASSERT_TRUE(WriteFilesAtomically({{a, "md"}, {b, "{}"}}).ok());
  EXPECT_TRUE(std::filesystem::is_regular_file(a));
  EXPECT_TRUE(std::filesystem::is_regular_file(b));
}

// A file the writer cannot create is named as the user gave it, never by its temporary name
// (here a folder squats on the temporary name, target.tmp.PID).
TEST(FileIo, ErrorsNameTheTargetNotTheTemporaryFile) {
  testing::TempDir dir;
  const std::string target = dir.path() + "/out.json";
  std::filesystem::create_directory(target + ".tmp." + std::to_string(::getpid()));
  Status st = WriteFilesAtomically({{target, "{}"}});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.field(), "out");
  EXPECT_NE(st.message().find("cannot write " + target + ":"), std::string::npos) << st.ToString();
  EXPECT_EQ(st.message().find(".tmp"), std::string::npos) << st.ToString();
  EXPECT_FALSE(std::filesystem::exists(target));
}

int Entries(const std::string& dir) {
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++n;
  }
  return n;
}

// A write the kernel refuses part-way (here: past the file-size limit, EFBIG) leaves no temporary
// file behind and the target untouched.
TEST(FileIo, FailedWriteLeavesNoTemporaryFile) {
  testing::TempDir dir;
  const std::string target = dir.path() + "/out.json";
  ASSERT_TRUE(WriteFilesAtomically({{target, "old"}}).ok());
  struct sigaction ignore {
  }, before{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &before), 0);
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  Status st = WriteFilesAtomically({{target, std::string(10000, 'x')}});
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::sigaction(SIGXFSZ, &before, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.field(), "out");
  EXPECT_NE(st.message().find("cannot write"), std::string::npos) << st.message();
  EXPECT_EQ(Entries(dir.path()), 1);
  EXPECT_EQ(*ReadRegularFile(target, "out"), "old");
}

// The second of two renames fails: the pair already on disk stays as it was (before, the first
// target had been replaced and then deleted).
int g_renames = 0;
int FailSecondRename(const char* from, const char* to) {
  if (++g_renames == 2) {
    errno = EIO;
    return -1;
  }
  return ::rename(from, to);
}

TEST(FileIo, FailedSecondRenameKeepsThePreviousPair) {
  testing::TempDir dir;
  std::string md = dir.path() + "/r.md", json = dir.path() + "/r.json";
  ASSERT_TRUE(WriteFilesAtomically({{md, "old md"}, {json, "old json"}}).ok());
  g_renames = 0;
  detail::SetRenameForTesting(&FailSecondRename);
  Status st = WriteFilesAtomically({{md, "new md"}, {json, "new json"}});
  detail::SetRenameForTesting(nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.field(), "out");
  EXPECT_NE(st.message().find("r.json"), std::string::npos) << st.message();
  EXPECT_EQ(Slurp(md), "old md");
  EXPECT_EQ(Slurp(json), "old json");
  EXPECT_EQ(Entries(dir.path()), 2);  // no temporaries, no backups
  // A new pair where nothing existed: nothing is left behind.
  std::string md2 = dir.path() + "/s.md", json2 = dir.path() + "/s.json";
  g_renames = 0;
  detail::SetRenameForTesting(&FailSecondRename);
  EXPECT_FALSE(WriteFilesAtomically({{md2, "new md"}, {json2, "new json"}}).ok());
  detail::SetRenameForTesting(nullptr);
  EXPECT_FALSE(std::filesystem::exists(md2));
  EXPECT_EQ(Entries(dir.path()), 2);
  // And when every rename succeeds the new pair replaces the old one, no backups left.
  ASSERT_TRUE(WriteFilesAtomically({{md, "new md"}, {json, "new json"}}).ok());
  EXPECT_EQ(Slurp(md), "new md");
  EXPECT_EQ(Slurp(json), "new json");
  EXPECT_EQ(Entries(dir.path()), 2);
}

// --out never replaces what is not a regular file: a symbolic link (to /dev/stdout or anywhere),
// a directory, a FIFO. The link, and what it points to, are left as they were.
TEST(FileIo, RefusesToReplaceAnythingButARegularFile) {
  testing::TempDir dir;
  std::string target = dir.Write("target.txt", "keep me");
  std::string link = dir.path() + "/link.json";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  Status st = WriteFilesAtomically({{link, "new"}});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.field(), "out");
  EXPECT_NE(st.message().find("symbolic link"), std::string::npos) << st.message();
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(Slurp(target), "keep me");

  std::string stdout_link = dir.path() + "/stdout";
  ASSERT_EQ(::symlink("/dev/stdout", stdout_link.c_str()), 0);
  EXPECT_FALSE(WriteFilesAtomically({{stdout_link, "x"}}).ok());
  EXPECT_TRUE(std::filesystem::is_symlink(stdout_link));

  std::string sub = dir.path() + "/sub";
  std::filesystem::create_directory(sub);
  st = WriteFilesAtomically({{sub, "x"}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(std::filesystem::is_directory(sub));

  std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  st = WriteFilesAtomically({{fifo, "x"}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));

  // Of a pair, one bad target stops both.
  std::string md = dir.path() + "/pair.md";
  EXPECT_FALSE(WriteFilesAtomically({{md, "x"}, {link, "y"}}).ok());
  EXPECT_FALSE(std::filesystem::exists(md));
  EXPECT_EQ(Entries(dir.path()), 5);  // target, link, stdout, sub, fifo: nothing new
}

TEST(FileIo, ReadsRegularFilesOnly) {
  testing::TempDir dir;
  std::string p = dir.Write("config.json", "{}");
  EXPECT_EQ(*ReadRegularFile(p, "config"), "{}");
  // A link to a regular file is read (Hugging Face hub snapshots are links into blobs/).
  std::string link = dir.path() + "/link.json";
  ASSERT_EQ(::symlink(p.c_str(), link.c_str()), 0);
  EXPECT_EQ(*ReadRegularFile(link, "config"), "{}");

  std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // A FIFO without a writer would block an open for reading: it is refused without opening it
  // that way (a hang here is caught by the test's timeout).
  for (const std::string& bad : {fifo, std::string("/dev/zero"), std::string("/dev/null"), dir.path()}) {
    Result<std::string> r = ReadRegularFile(bad, "config");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(r.status().field(), "config") << bad;
    EXPECT_NE(r.status().message().find("not a regular file"), std::string::npos) << r.status().message();
  }

  std::string big = dir.Write("big.json", std::string(1000, ' '));
  Result<std::string> r = ReadRegularFile(big, "trace", 999);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(r.status().field(), "trace");
  EXPECT_EQ(ReadRegularFile(big, "trace", 1000)->size(), 1000u);
  EXPECT_EQ(ReadRegularFile(dir.path() + "/missing", "config").status().code(), StatusCode::kIoError);
}

}  // namespace
}  // namespace tessera

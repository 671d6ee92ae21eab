#include "tessera/disk_tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "test_support.h"

namespace tessera {
namespace {

using testing::TempDir;

Hash128 Key(uint64_t i) { return Hash128{i * 0x9e3779b97f4a7c15ULL + 1, i}; }

// The payload of key i: a deterministic function of i, of a length that varies.
std::vector<std::byte> PayloadOf(uint64_t i) {
  std::vector<std::byte> p(1000 + (i * 7919) % 9000);
  uint64_t x = i * 0x9e3779b97f4a7c15ULL;
  for (size_t k = 0; k < p.size(); k += 8) {
    x += 0x9e3779b97f4a7c15ULL;
    uint64_t z = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    std::memcpy(p.data() + k, &z, std::min<size_t>(8, p.size() - k));
  }
  return p;
}

DiskRecord Rec(uint64_t i) { return DiskRecord{Key(i), static_cast<uint16_t>(i % 7), PayloadOf(i)}; }

std::unique_ptr<DiskTier> MustOpen(const DiskTierOptions& o) {
  Result<std::unique_ptr<DiskTier>> t = DiskTier::Open(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

DiskTierOptions Opts(const std::string& dir) {
  DiskTierOptions o;
  o.dir = dir;
  o.segment_bytes = 1 << 20;  // several segments
  return o;
}

// Every indexed record's bytes equal PayloadOf(its key); returns how many were checked.
size_t ExpectAllVerified(DiskTier& t, uint64_t max_key) {
  size_t n = 0;
  for (uint64_t i = 0; i < max_key; ++i) {
    if (!t.Contains(Key(i))) continue;
    Result<DiskRecord> r = t.Get(Key(i));
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
      continue;
    }
    EXPECT_EQ(r->payload, PayloadOf(i)) << "wrong bytes served for key " << i;
    ++n;
  }
  return n;
}

TEST(DiskTier, PutGetAndReopen) {
  TempDir dir;
  {
    auto t = MustOpen(Opts(dir.path()));
    for (uint64_t i = 0; i < 300; i += 10) {
      std::vector<DiskRecord> batch;
      for (uint64_t k = i; k < i + 10; ++k) batch.push_back(Rec(k));
      ASSERT_TRUE(t->PutBatch(batch).ok());
    }
    EXPECT_EQ(t->stats().records, 300u);
    EXPECT_GT(t->stats().segments, 1u);
    Result<DiskRecord> r = t->Get(Key(42));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->payload, PayloadOf(42));
    EXPECT_EQ(r->format_id, 42 % 7);
    EXPECT_EQ(t->Get(Key(1000)).status().code(), StatusCode::kNotFound);
  }
  auto t = MustOpen(Opts(dir.path()));
  EXPECT_EQ(t->stats().records, 300u);
  EXPECT_EQ(t->stats().verified, 300u);
  EXPECT_EQ(t->stats().quarantined, 0u);
  EXPECT_EQ(ExpectAllVerified(*t, 300), 300u);
}

TEST(DiskTier, NewerVersionWinsAndErasureSurvivesReopen) {
  TempDir dir;
  {
    auto t = MustOpen(Opts(dir.path()));
    ASSERT_TRUE(t->PutBatch(std::vector<DiskRecord>{Rec(1), Rec(2)}).ok());
    DiskRecord newer = Rec(1);
    newer.payload = PayloadOf(99);
    ASSERT_TRUE(t->PutBatch(std::vector<DiskRecord>{newer}).ok());
    ASSERT_TRUE(t->Erase(Key(2)).ok());
    EXPECT_GT(t->stats().dead_bytes, 0u);
  }
  auto t = MustOpen(Opts(dir.path()));
  EXPECT_EQ(t->Get(Key(1))->payload, PayloadOf(99));
  EXPECT_FALSE(t->Contains(Key(2)));
  ASSERT_TRUE(t->Compact().ok());
  EXPECT_EQ(t->stats().dead_bytes, 0u);
  EXPECT_EQ(t->Get(Key(1))->payload, PayloadOf(99));
  t.reset();  // the directory's lock goes with it
  auto again = MustOpen(Opts(dir.path()));
  EXPECT_EQ(again->stats().records, 1u);
  EXPECT_FALSE(again->Contains(Key(2)));
}

std::vector<std::filesystem::path> Segments(const std::string& dir) {
  std::vector<std::filesystem::path> out;
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".tsr") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void Poke(const std::filesystem::path& p, uint64_t offset, uint8_t xor_mask, size_t len = 1, bool zero = false) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  for (size_t i = 0; i < len; ++i) {
    f.seekg(static_cast<std::streamoff>(offset + i));
    char c = 0;
    f.get(c);
    c = zero ? 0 : static_cast<char>(c ^ static_cast<char>(xor_mask));
    f.seekp(static_cast<std::streamoff>(offset + i));
    f.put(c);
  }
}

// Offsets of the record headers in a segment written by this test (4,096-byte header slots).
struct Placed {
  uint64_t key;
  uint64_t offset;
  uint64_t len;
};

TEST(DiskTierFaults, EveryBitFlipInAHeaderOrPayloadIsDetected) {
  TempDir dir;
  DiskTierOptions o = Opts(dir.path());
  o.segment_bytes = 1ULL << 30;  // one segment, so that offsets are easy to follow
  std::vector<Placed> placed;
  {
    auto t = MustOpen(o);
    uint64_t off = 0;
    for (uint64_t i = 0; i < 200; ++i) {
      ASSERT_TRUE(t->PutBatch(std::vector<DiskRecord>{Rec(i)}).ok());
      uint64_t len = PayloadOf(i).size();
      placed.push_back({i, off, len});
      off += 4096 + (len + 4095) / 4096 * 4096;
    }
  }
  std::filesystem::path seg = Segments(dir.path()).at(0);
  std::mt19937_64 g(5);
  std::set<uint64_t> damaged;
  for (int k = 0; k < 60; ++k) {
    const Placed& p = placed[g() % placed.size()];
    // A bit in the 128-byte header or in the payload bytes (the slack after them carries nothing).
    uint64_t where = (g() % 2 == 0) ? p.offset + g() % 128 : p.offset + 4096 + g() % p.len;
    Poke(seg, where, static_cast<uint8_t>(1u << (g() % 8)));
    damaged.insert(p.key);
  }
  {
    auto t = MustOpen(o);
    EXPECT_GE(t->stats().quarantined, 1u);
    for (uint64_t k : damaged) EXPECT_FALSE(t->Contains(Key(k))) << "damaged record " << k << " still indexed";
    EXPECT_EQ(ExpectAllVerified(*t, 200), 200 - damaged.size());
    EXPECT_TRUE(std::filesystem::exists(dir.path() + "/quarantine"));
  }
  // Quarantined records are marked: a second open finds nothing new to quarantine.
  auto again = MustOpen(o);
  EXPECT_EQ(again->stats().quarantined, 0u);
  EXPECT_EQ(again->stats().records, 200 - damaged.size());
}

TEST(DiskTierFaults, TruncationAndZeroedPagesAreDetected) {
  TempDir dir;
  DiskTierOptions o = Opts(dir.path());
  o.segment_bytes = 1ULL << 30;
  {
    auto t = MustOpen(o);
    for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(t->PutBatch(std::vector<DiskRecord>{Rec(i)}).ok());
  }
  std::filesystem::path seg = Segments(dir.path()).at(0);
  uint64_t size = std::filesystem::file_size(seg);
  // Zero the first payload page of record 3 and the header slot of record 7.
  uint64_t off = 0;
  std::vector<uint64_t> offsets;
  for (uint64_t i = 0; i < 20; ++i) {
    offsets.push_back(off);
    off += 4096 + (PayloadOf(i).size() + 4095) / 4096 * 4096;
  }
  Poke(seg, offsets[3] + 4096, 0, 4096, true);
  Poke(seg, offsets[7], 0, 4096, true);
  // Cut the last record in half.
  std::filesystem::resize_file(seg, size - 2048);
  auto t = MustOpen(o);
  EXPECT_EQ(t->stats().quarantined, 3u);
  EXPECT_FALSE(t->Contains(Key(3)));
  EXPECT_FALSE(t->Contains(Key(7)));
  EXPECT_FALSE(t->Contains(Key(19)));
  EXPECT_EQ(ExpectAllVerified(*t, 20), 17u);
}

TEST(DiskTierFaults, CorruptionAfterOpenIsCaughtOnRead) {
  TempDir dir;
  DiskTierOptions o = Opts(dir.path());
  auto t = MustOpen(o);
  ASSERT_TRUE(t->PutBatch(std::vector<DiskRecord>{Rec(1), Rec(2)}).ok());
  Poke(Segments(dir.path()).at(0), 4096 + 10, 0x40);  // record 1's payload
  Result<DiskRecord> r = t->Get(Key(1));
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(t->Get(Key(1)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(t->Get(Key(2))->payload, PayloadOf(2));
  EXPECT_EQ(t->stats().read_failures, 1u);
}

TEST(DiskTierFaults, FullDiskIsAClearErrorAndServingContinues) {
  TempDir dir;
  DiskTierOptions o = Opts(dir.path());
  o.max_bytes = 64 * 1024;
  auto t = MustOpen(o);
  ASSERT_TRUE(t->PutBatch(std::vector<DiskRecord>{Rec(1), Rec(2)}).ok());
  std::vector<DiskRecord> big;
  for (uint64_t i = 10; i < 30; ++i) big.push_back(Rec(i));
  Status st = t->PutBatch(big);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.field(), "disk");
  EXPECT_NE(st.message().find("no space"), std::string::npos);
  for (uint64_t i = 10; i < 30; ++i) EXPECT_FALSE(t->Contains(Key(i)));
  EXPECT_EQ(t->Get(Key(2))->payload, PayloadOf(2));
}

// A full file system as the kernel reports it: the writer's file-size limit (RLIMIT_FSIZE) makes a
// write or extension fail part way through a batch (EFBIG), as ENOSPC would. The batch is not
// indexed, the error is clear, every earlier record is still served, and a reopen finds no part of
// the failed batch.
TEST(DiskTierFaults, KernelRefusedWriteMidBatchLeavesNothingPartial) {
  TempDir dir;
  DiskTierOptions o = Opts(dir.path());
  o.segment_bytes = 64ULL << 20;  // one segment: the limit is reached inside it
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{300 * 1024, 300 * 1024};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(2);
    Result<std::unique_ptr<DiskTier>> t = DiskTier::Open(o);
    if (!t.ok()) ::_exit(3);
    uint64_t next = 0;
    Status st = Status::Ok();
    while (st.ok() && next < 400) {
      std::vector<DiskRecord> batch;
      for (uint64_t k = next; k < next + 8; ++k) batch.push_back(Rec(k));
      st = (*t)->PutBatch(batch);
      if (st.ok()) next += 8;
    }
    if (st.ok() || st.code() != StatusCode::kIoError || st.field() != "disk") ::_exit(4);
    if (st.message().find("File too large") == std::string::npos) ::_exit(5);
    if (next == 0) ::_exit(6);  // the limit must leave room for some batches
    for (uint64_t k = next; k < next + 8; ++k) {
      if ((*t)->Contains(Key(k))) ::_exit(7);  // nothing of the failed batch is visible
    }
    for (uint64_t k = 0; k < next; ++k) {
      Result<DiskRecord> r = (*t)->Get(Key(k));
      if (!r.ok() || r->payload != PayloadOf(k)) ::_exit(8);
    }
    ::_exit(static_cast<int>(10 + next / 8));  // batches stored, for the parent
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  const int code = WEXITSTATUS(status);
  ASSERT_GE(code, 10) << "child check " << code << " failed";
  const uint64_t stored = static_cast<uint64_t>(code - 10) * 8;
  auto t = MustOpen(o);  // no limit now: a fresh scan of what the writer left
  EXPECT_EQ(t->stats().records, stored);
  EXPECT_EQ(t->stats().quarantined, 0u);  // the failed batch was cut off, not left half-written
  EXPECT_EQ(ExpectAllVerified(*t, 400), stored);
}

TEST(DiskTierFaults, WriterKilledMidBatchLeavesOnlyVerifiedOrQuarantinedRecords) {
  for (int round = 0; round < 3; ++round) {
    TempDir dir;
    DiskTierOptions o = Opts(dir.path());
    o.fsync = round == 0 ? FsyncPolicy::kEveryBatch : round == 1 ? FsyncPolicy::kPeriodic : FsyncPolicy::kNone;
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      Result<std::unique_ptr<DiskTier>> t = DiskTier::Open(o);
      if (!t.ok()) ::_exit(3);
      // Bounded: 40,000 records (about 220 MB), then wait to be killed.
      for (uint64_t i = 0; i < 40000; i += 8) {
        std::vector<DiskRecord> batch;
        for (uint64_t k = i; k < i + 8; ++k) batch.push_back(Rec(k));
        if (!(*t)->PutBatch(batch).ok()) ::_exit(4);
      }
      for (;;) ::pause();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + 100 * round));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer stopped by itself (" << status << ")";
    auto t = MustOpen(o);
    DiskTierStats s = t->stats();
    EXPECT_GT(s.records, 0u) << "round " << round;
    EXPECT_EQ(ExpectAllVerified(*t, 40000), s.records) << "round " << round;
  }
}

TEST(DiskTier, BadDirectoryNamesTheField) {
  DiskTierOptions o;
  o.dir = "/proc/self/no-such/dir";
  EXPECT_EQ(DiskTier::Open(o).status().field(), "dir");
  o.dir = "";
  EXPECT_EQ(DiskTier::Open(o).status().field(), "dir");
  EXPECT_EQ(ParseFsyncPolicy("always").status().field(), "fsync");
}

}  // namespace
}  // namespace tessera

#include "tessera/disk_tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
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

#define XXH_INLINE_ALL
#include <xxhash.h>

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

TierRecord Rec(uint64_t i) { return TierRecord{Key(i), static_cast<uint16_t>(i % 7), PayloadOf(i)}; }

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
    Result<TierRecord> r = t.Get(Key(i));
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
      std::vector<TierRecord> batch;
      for (uint64_t k = i; k < i + 10; ++k) batch.push_back(Rec(k));
      ASSERT_TRUE(t->PutBatch(batch).ok());
    }
    EXPECT_EQ(t->stats().records, 300u);
    EXPECT_GT(t->stats().segments, 1u);
    Result<TierRecord> r = t->Get(Key(42));
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

// ReadInto hands the verified payload to buffers filled in order (a block's head, its pages, its
// state), across the 256 KiB read chunks, as Get returns it.
TEST(DiskTier, ReadIntoScattersTheVerifiedPayload) {
  TempDir dir;
  auto t = MustOpen(Opts(dir.path()));
  TierRecord big{Key(900), 3, std::vector<std::byte>(600'001)};
  for (size_t i = 0; i < big.payload.size(); ++i) big.payload[i] = static_cast<std::byte>((i * 131) >> 3);
  ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{Rec(1), big}).ok());
  ASSERT_EQ(t->PayloadSize(Key(900)), 600'001u);
  EXPECT_FALSE(t->PayloadSize(Key(901)).has_value());
  std::vector<std::byte> a(104), b(300'000), c(600'001 - 104 - 300'000);
  const std::span<std::byte> parts[] = {a, b, c};
  uint16_t format_id = 0;
  ASSERT_TRUE(t->ReadInto(Key(900), parts, &format_id).ok());
  EXPECT_EQ(format_id, 3);
  std::vector<std::byte> joined(a);
  joined.insert(joined.end(), b.begin(), b.end());
  joined.insert(joined.end(), c.begin(), c.end());
  EXPECT_EQ(joined, big.payload);
  // One buffer of a small record; the same bytes as Get.
  std::vector<std::byte> one(PayloadOf(1).size());
  const std::span<std::byte> whole(one);
  ASSERT_TRUE(t->ReadInto(Key(1), {&whole, 1}, nullptr).ok());
  EXPECT_EQ(one, t->Get(Key(1))->payload);
  EXPECT_EQ(t->ReadInto(Key(901), {&whole, 1}, nullptr).code(), StatusCode::kNotFound);
}

// Records of the sizes the tiered store writes (a DeepSeek-V4-Pro block span, 1,430,208 B, 64
// bytes past a multiple of 128; a V3 fp8 block, 2,561,024 B) and others whose tags are fed to
// Poly1305 in two updates (ADR 0047), in one batch: after a reopen every one verifies and reads
// back byte-exact, through Get and through ReadInto into buffers that split the read chunks
// unevenly.
TEST(DiskTier, LargeRecordsRoundTripByteExact) {
  TempDir dir;
  DiskTierOptions o = Opts(dir.path());
  o.segment_bytes = 64ULL << 20;
  const std::vector<size_t> sizes{65535, 65536, 65537, 3 * 65536 + 17, 1430208, 2561024};
  std::vector<TierRecord> batch;
  for (size_t i = 0; i < sizes.size(); ++i) {
    TierRecord r{Key(500 + i), static_cast<uint16_t>(i), std::vector<std::byte>(sizes[i])};
    for (size_t k = 0; k < sizes[i]; ++k) r.payload[k] = static_cast<std::byte>((k * 2654435761u + i) >> 11);
    batch.push_back(std::move(r));
  }
  ASSERT_TRUE(MustOpen(o)->PutBatch(batch).ok());
  auto t = MustOpen(o);
  EXPECT_EQ(t->stats().verified, sizes.size());
  EXPECT_EQ(t->stats().quarantined, 0u);
  for (const TierRecord& want : batch) {
    Result<TierRecord> got = t->Get(want.key);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->payload, want.payload);
    const size_t n = want.payload.size();
    std::vector<std::byte> a(1000), b(n - 1000 - n / 3), c(n / 3);
    const std::span<std::byte> parts[] = {a, b, c};
    ASSERT_TRUE(t->ReadInto(want.key, parts, nullptr).ok());
    std::vector<std::byte> joined(a);
    joined.insert(joined.end(), b.begin(), b.end());
    joined.insert(joined.end(), c.begin(), c.end());
    EXPECT_EQ(joined, want.payload);
  }
}

// Buffers that do not add up to the record are refused naming "out", before anything is read.
TEST(DiskTier, ReadIntoRefusesBuffersOfTheWrongSize) {
  TempDir dir;
  auto t = MustOpen(Opts(dir.path()));
  ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{Rec(1)}).ok());
  std::vector<std::byte> short_buf(PayloadOf(1).size() - 1, std::byte{0x5a});
  const std::span<std::byte> one(short_buf);
  Status st = t->ReadInto(Key(1), {&one, 1}, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.field(), "out");
  EXPECT_EQ(short_buf, std::vector<std::byte>(short_buf.size(), std::byte{0x5a}));
  EXPECT_EQ(t->stats().reads, 0u);
  EXPECT_TRUE(t->Contains(Key(1)));
}

TEST(DiskTier, NewerVersionWinsAndErasureSurvivesReopen) {
  TempDir dir;
  {
    auto t = MustOpen(Opts(dir.path()));
    ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{Rec(1), Rec(2)}).ok());
    TierRecord newer = Rec(1);
    newer.payload = PayloadOf(99);
    ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{newer}).ok());
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
      ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{Rec(i)}).ok());
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
    for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{Rec(i)}).ok());
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

// A damaged region longer than the largest payload is marked dead by a chain of markers that
// the next open accepts: it is quarantined once, not at every open.
TEST(DiskTierFaults, ARegionLongerThanAPayloadIsQuarantinedOnce) {
  TempDir dir;
  DiskTierOptions o = Opts(dir.path());
  o.segment_bytes = 1ULL << 40;
  {
    auto t = MustOpen(o);
    ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{Rec(0), Rec(1)}).ok());
  }
  const std::filesystem::path seg = Segments(dir.path()).at(0);
  const uint64_t second = 4096 + (PayloadOf(0).size() + 4095) / 4096 * 4096;
  std::vector<char> rec1(std::filesystem::file_size(seg) - second);
  {
    std::ifstream in(seg, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(second));
    ASSERT_TRUE(in.read(rec1.data(), static_cast<std::streamsize>(rec1.size())));
  }
  // [record 0][a hole of zeros longer than kMaxPayloadBytes + a header slot][record 1]
  const uint64_t hole = kMaxPayloadBytes + 3 * 4096;
  std::filesystem::resize_file(seg, second + hole);
  {
    std::ofstream out(seg, std::ios::binary | std::ios::app);
    ASSERT_TRUE(out.write(rec1.data(), static_cast<std::streamsize>(rec1.size())));
  }
  {
    auto t = MustOpen(o);
    EXPECT_EQ(t->stats().quarantined, 1u);
    EXPECT_EQ(ExpectAllVerified(*t, 2), 2u);
  }
  auto t = MustOpen(o);
  EXPECT_EQ(t->stats().quarantined, 0u) << (t->quarantine_log().empty() ? "" : t->quarantine_log()[0]);
  EXPECT_EQ(t->stats().dead_bytes, hole);
  EXPECT_EQ(ExpectAllVerified(*t, 2), 2u);
  // The copy kept for a person is bounded.
  uint64_t copied = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir.path() + "/quarantine")) copied += f.file_size();
  EXPECT_LE(copied, 64ULL << 20);
}

TEST(DiskTierFaults, CorruptionAfterOpenIsCaughtOnRead) {
  TempDir dir;
  DiskTierOptions o = Opts(dir.path());
  auto t = MustOpen(o);
  ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{Rec(1), Rec(2)}).ok());
  Poke(Segments(dir.path()).at(0), 4096 + 10, 0x40);  // record 1's payload
  Result<TierRecord> r = t->Get(Key(1));
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(t->Get(Key(1)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(t->Get(Key(2))->payload, PayloadOf(2));
  EXPECT_EQ(t->stats().read_failures, 1u);
}

TEST(DiskTierFaults, CorruptionAfterOpenIsCaughtOnReadInto) {
  TempDir dir;
  DiskTierOptions o = Opts(dir.path());
  auto t = MustOpen(o);
  ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{Rec(1), Rec(2)}).ok());
  Poke(Segments(dir.path()).at(0), 4096 + 10, 0x40);  // record 1's payload
  std::vector<std::byte> out(PayloadOf(1).size(), std::byte{0x5a});
  const std::span<std::byte> whole(out);
  EXPECT_EQ(t->ReadInto(Key(1), {&whole, 1}, nullptr).code(), StatusCode::kDataLoss);
  EXPECT_EQ(out, std::vector<std::byte>(out.size()));  // zeroed: no unverified byte is left
  EXPECT_FALSE(t->Contains(Key(1)));                   // quarantined
  EXPECT_EQ(t->ReadInto(Key(1), {&whole, 1}, nullptr).code(), StatusCode::kNotFound);
  EXPECT_EQ(t->Get(Key(2))->payload, PayloadOf(2));
  EXPECT_EQ(t->stats().read_failures, 1u);
  // The region is quarantined on disk too: a reopen does not serve it.
  t.reset();
  auto again = MustOpen(o);
  EXPECT_FALSE(again->Contains(Key(1)));
  EXPECT_EQ(again->Get(Key(2))->payload, PayloadOf(2));
}

// A byte changed deep inside a large record (1.3 MB in, past the first read chunks)
// after open: ReadInto fails with kDataLoss, zeroes every buffer, and the record is quarantined on
// disk; Get of another large record in the batch still serves its exact bytes, after a reopen too.
TEST(DiskTierFaults, CorruptionDeepInALargeRecordIsCaughtOnReadInto) {
  TempDir dir;
  DiskTierOptions o = Opts(dir.path());
  o.segment_bytes = 64ULL << 20;
  std::vector<TierRecord> batch;
  for (uint64_t i = 0; i < 3; ++i) {
    TierRecord r{Key(700 + i), 1, std::vector<std::byte>(1430208)};
    for (size_t k = 0; k < r.payload.size(); ++k) r.payload[k] = static_cast<std::byte>((k * 40503u + i) >> 7);
    batch.push_back(std::move(r));
  }
  auto t = MustOpen(o);
  ASSERT_TRUE(t->PutBatch(batch).ok());
  const uint64_t record_bytes = 4096 + (1430208 + 4095) / 4096 * 4096;
  Poke(Segments(dir.path()).at(0), record_bytes + 4096 + 20 * 65536 + 123, 0x08);  // record 1's payload
  std::vector<std::byte> a(300'000, std::byte{0x5a}), b(1430208 - 300'000, std::byte{0x5a});
  const std::span<std::byte> parts[] = {a, b};
  EXPECT_EQ(t->ReadInto(Key(701), parts, nullptr).code(), StatusCode::kDataLoss);
  EXPECT_EQ(a, std::vector<std::byte>(a.size()));
  EXPECT_EQ(b, std::vector<std::byte>(b.size()));
  EXPECT_FALSE(t->Contains(Key(701)));
  EXPECT_EQ(t->Get(Key(702))->payload, batch[2].payload);
  t.reset();
  auto again = MustOpen(o);
  EXPECT_FALSE(again->Contains(Key(701)));
  EXPECT_EQ(again->Get(Key(700))->payload, batch[0].payload);
  EXPECT_EQ(again->Get(Key(702))->payload, batch[2].payload);
  EXPECT_EQ(again->stats().quarantined, 0u);  // marked dead on the read: not quarantined again
}

TEST(DiskTierFaults, FullDiskIsAClearErrorAndServingContinues) {
  TempDir dir;
  DiskTierOptions o = Opts(dir.path());
  o.max_bytes = 64 * 1024;
  auto t = MustOpen(o);
  ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{Rec(1), Rec(2)}).ok());
  std::vector<TierRecord> big;
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
      std::vector<TierRecord> batch;
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
      Result<TierRecord> r = (*t)->Get(Key(k));
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

// ---- Recovery: torn tails and a writer stopped at every step ---------------------------------

std::filesystem::path SegmentPath(const std::string& dir, uint32_t id) {
  char name[32];
  std::snprintf(name, sizeof name, "seg-%06u.tsr", id);
  return std::filesystem::path(dir) / name;
}

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void AppendBytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::app);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Writes `count` records starting at key `first`, one batch, and closes the tier.
void WriteRun(const DiskTierOptions& o, uint64_t first, uint64_t count) {
  auto t = MustOpen(o);
  ASSERT_NE(t, nullptr);
  std::vector<TierRecord> batch;
  for (uint64_t k = first; k < first + count; ++k) batch.push_back(Rec(k));
  ASSERT_TRUE(t->PutBatch(batch).ok());
}

enum class Damage { kAppendGarbage, kAppendSlotsOfGarbage, kCutPadding, kCutIntoPayload };

class TornTail : public ::testing::TestWithParam<Damage> {};

// Damage at a segment's end (a killed writer, a copy cut short, bytes appended) is cut off on the
// next open; the writer then appends at an aligned end, and every later run keeps its records.
TEST_P(TornTail, IsCutAndEveryLaterRunKeepsItsRecords) {
  TempDir dir;
  DiskTierOptions o = Opts(dir.path());
  o.segment_bytes = 1ULL << 30;  // one segment
  WriteRun(o, 0, 10);
  const std::filesystem::path seg = SegmentPath(dir.path(), 1);
  const uint64_t size = std::filesystem::file_size(seg);
  const uint64_t last_len = PayloadOf(9).size();
  const uint64_t last_padding = (last_len + 4095) / 4096 * 4096 - last_len;
  bool last_survives = true;
  switch (GetParam()) {
    case Damage::kAppendGarbage:
      AppendBytes(seg, std::string(1000, '\x5a'));
      break;
    case Damage::kAppendSlotsOfGarbage:
      AppendBytes(seg, std::string(3 * 4096 + 17, '\xa5'));
      break;
    case Damage::kCutPadding:
      ASSERT_GT(last_padding, 0u);
      std::filesystem::resize_file(seg, size - 1);  // the last record's padding, not its bytes
      break;
    case Damage::kCutIntoPayload:
      std::filesystem::resize_file(seg, size - last_padding - 100);
      last_survives = false;
      break;
  }
  for (uint64_t run = 1; run <= 3; ++run) {
    {
      auto t = MustOpen(o);
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(t->stats().quarantined, run == 1 && GetParam() != Damage::kCutPadding ? 1u : 0u) << "run " << run;
      EXPECT_EQ(std::filesystem::file_size(seg) % 4096, 0u) << "run " << run;
      std::vector<TierRecord> batch;
      for (uint64_t k = 100 * run; k < 100 * run + 5; ++k) batch.push_back(Rec(k));
      ASSERT_TRUE(t->PutBatch(batch).ok());
    }
    auto t = MustOpen(o);
    EXPECT_EQ(t->stats().quarantined, 0u) << "run " << run << ": the tail was cut once, not counted again";
    for (uint64_t k = 0; k < 9; ++k) EXPECT_TRUE(t->Contains(Key(k))) << "run " << run << " key " << k;
    EXPECT_EQ(t->Contains(Key(9)), last_survives);
    for (uint64_t r = 1; r <= run; ++r) {
      for (uint64_t k = 100 * r; k < 100 * r + 5; ++k) {
        Result<TierRecord> got = t->Get(Key(k));
        ASSERT_TRUE(got.ok()) << "run " << run << " key " << k << ": " << got.status().ToString();
        EXPECT_EQ(got->payload, PayloadOf(k));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, TornTail,
                         ::testing::Values(Damage::kAppendGarbage, Damage::kAppendSlotsOfGarbage, Damage::kCutPadding,
                                           Damage::kCutIntoPayload));

// A writer stopped (SIGKILL, at a hook, not after a sleep) at every step of a batch: the batches
// before it survive whole, a record of the stopped batch is served only when complete, and the
// next writer's records are all found after another open.
TEST(DiskTierRecovery, WriterStoppedAtEveryStepOfABatch) {
  for (FsyncPolicy policy : {FsyncPolicy::kEveryBatch, FsyncPolicy::kPeriodic, FsyncPolicy::kNone}) {
    const int steps = policy == FsyncPolicy::kEveryBatch ? 5 : 4;  // 4 records, (one sync)
    for (int stop_at = 1; stop_at <= steps; ++stop_at) {
      SCOPED_TRACE("policy " + std::to_string(static_cast<int>(policy)) + " step " + std::to_string(stop_at));
      TempDir dir;
      DiskTierOptions o = Opts(dir.path());
      o.fsync = policy;
      o.fsync_every_bytes = 4096;
      pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        DiskTierOptions co = o;
        Result<std::unique_ptr<DiskTier>> t = DiskTier::Open(co);
        if (!t.ok()) ::_exit(3);
        std::vector<TierRecord> before{Rec(0), Rec(1), Rec(2)};
        if (!(*t)->PutBatch(before).ok()) ::_exit(4);
        DiskTierOptions hooked = co;
        t->reset();
        int calls = 0;
        hooked.fault_hook = [&calls, stop_at](DiskWriteStep) {
          if (++calls == stop_at) ::raise(SIGKILL);
        };
        Result<std::unique_ptr<DiskTier>> h = DiskTier::Open(hooked);
        if (!h.ok()) ::_exit(5);
        std::vector<TierRecord> stopped{Rec(10), Rec(11), Rec(12), Rec(13)};
        (*h)->PutBatch(stopped).IgnoreError();  // the hook kills the process inside this call
        ::_exit(6);                             // the hook did not stop it: a failure
      }
      int status = 0;
      ::waitpid(pid, &status, 0);
      ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the writer was not stopped: " << status;
      {
        auto t = MustOpen(o);
        ASSERT_NE(t, nullptr);
        for (uint64_t k = 0; k < 3; ++k) {
          Result<TierRecord> r = t->Get(Key(k));
          ASSERT_TRUE(r.ok()) << k << ": " << r.status().ToString();
          EXPECT_EQ(r->payload, PayloadOf(k));
        }
        for (uint64_t k = 10; k < 14; ++k) {
          if (!t->Contains(Key(k))) continue;
          Result<TierRecord> r = t->Get(Key(k));  // a header reached the disk: so did its payload
          ASSERT_TRUE(r.ok()) << k << ": " << r.status().ToString();
          EXPECT_EQ(r->payload, PayloadOf(k));
        }
        std::vector<TierRecord> after{Rec(20), Rec(21)};
        ASSERT_TRUE(t->PutBatch(after).ok());
      }
      auto t = MustOpen(o);
      EXPECT_EQ(t->stats().quarantined, 0u);
      for (uint64_t k : {0, 1, 2, 20, 21}) {
        Result<TierRecord> r = t->Get(Key(k));
        ASSERT_TRUE(r.ok()) << k << ": " << r.status().ToString();
        EXPECT_EQ(r->payload, PayloadOf(k));
      }
    }
  }
}

// What a power failure can leave of a batch written with one fdatasync (ADR 0041): the batch's
// bytes up to any point (cut at every record boundary, inside a header slot, inside a payload,
// before the padding), or with any one record's header or payload pages never written (pages
// reach the disk in any order). Every case recovers exactly the complete authenticated records:
// those of the earlier batch, and those of the torn batch whose header and payload both arrived;
// nothing wrong is served; the next writer appends and all is found again.
void WriteFile(const std::filesystem::path& p, const std::string& bytes);

struct TornCase {
  std::string what;
  std::string bytes;            // the segment as the power failure left it
  std::set<uint64_t> complete;  // keys of the torn batch that must survive
};

std::vector<TornCase> TornCases(const std::string& full, uint64_t batch_start, const std::vector<uint64_t>& keys) {
  std::vector<TornCase> cases;
  std::vector<uint64_t> at;
  uint64_t off = batch_start;
  for (uint64_t k : keys) {
    at.push_back(off);
    off += 4096 + (PayloadOf(k).size() + 4095) / 4096 * 4096;
  }
  auto upto = [&](uint64_t cut) {
    std::set<uint64_t> done;
    for (size_t j = 0; j < keys.size(); ++j) {
      if (at[j] + 4096 + PayloadOf(keys[j]).size() <= cut) done.insert(keys[j]);
    }
    return done;
  };
  for (size_t j = 0; j < keys.size(); ++j) {
    const uint64_t len = PayloadOf(keys[j]).size();
    for (uint64_t cut : {at[j], at[j] + 64, at[j] + 4096, at[j] + 4096 + len / 2, at[j] + 4096 + len}) {
      cases.push_back({"cut at " + std::to_string(cut), full.substr(0, cut), upto(cut)});
    }
    std::set<uint64_t> others(keys.begin(), keys.end());
    others.erase(keys[j]);
    std::string no_payload = full, no_header = full, flipped = full;
    std::fill(no_payload.begin() + static_cast<ptrdiff_t>(at[j] + 4096),
              no_payload.begin() + static_cast<ptrdiff_t>(at[j] + 4096 + len), '\0');
    std::fill(no_header.begin() + static_cast<ptrdiff_t>(at[j]),
              no_header.begin() + static_cast<ptrdiff_t>(at[j] + 4096), '\0');
    flipped[at[j] + 4096 + len / 3] ^= 0x10;
    cases.push_back({"record " + std::to_string(j) + " payload unwritten", no_payload, others});
    cases.push_back({"record " + std::to_string(j) + " header unwritten", no_header, others});
    cases.push_back({"record " + std::to_string(j) + " payload byte flipped", flipped, others});
  }
  cases.push_back({"whole batch", full, std::set<uint64_t>(keys.begin(), keys.end())});
  return cases;
}

TEST(DiskTierRecovery, BatchTornAnywhereKeepsExactlyItsCompleteRecords) {
  TempDir src;
  DiskTierOptions o = Opts(src.path());
  o.segment_bytes = 1ULL << 30;  // one segment
  WriteRun(o, 0, 3);
  const uint64_t batch_start = std::filesystem::file_size(SegmentPath(src.path(), 1));
  const std::vector<uint64_t> keys{10, 11, 12, 13, 14};
  WriteRun(o, 10, keys.size());
  const std::string full = ReadFile(SegmentPath(src.path(), 1));
  for (const TornCase& c : TornCases(full, batch_start, keys)) {
    SCOPED_TRACE(c.what);
    TempDir dir;
    std::filesystem::copy_file(std::filesystem::path(src.path()) / "prefix.key",
                               std::filesystem::path(dir.path()) / "prefix.key");
    std::filesystem::permissions(std::filesystem::path(dir.path()) / "prefix.key",
                                 std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    WriteFile(SegmentPath(dir.path(), 1), c.bytes);
    DiskTierOptions d = o;
    d.dir = dir.path();
    {
      auto t = MustOpen(d);
      ASSERT_NE(t, nullptr);
      const bool damaged_inside =
          c.what.find("unwritten") != std::string::npos || c.what.find("flipped") != std::string::npos;
      if (c.what.find("payload") != std::string::npos) {
        EXPECT_GE(t->stats().quarantined, 1u);
      }
      if (!damaged_inside) {
        EXPECT_EQ(std::filesystem::file_size(SegmentPath(dir.path(), 1)) % 4096, 0u);
      }
      for (uint64_t k : {0, 1, 2}) EXPECT_TRUE(t->Contains(Key(k))) << k;
      for (uint64_t k : keys) EXPECT_EQ(t->Contains(Key(k)), c.complete.count(k) == 1) << k;
      EXPECT_EQ(ExpectAllVerified(*t, 20), 3 + c.complete.size());
      ASSERT_TRUE(t->PutBatch(std::vector<TierRecord>{Rec(20), Rec(21)}).ok());
    }
    auto t = MustOpen(d);
    EXPECT_EQ(t->stats().quarantined, 0u) << "recovery left something to quarantine again";
    EXPECT_EQ(ExpectAllVerified(*t, 22), 5 + c.complete.size());
  }
}

// ---- Hostile contents ------------------------------------------------------------------------

// The on-disk header fields a forger can reach without the key (docs/adr/0010-disk-tier.md).
constexpr size_t kPayloadLenAt = 32, kSeqAt = 40, kChecksumAt = 120;

// Recomputes the unkeyed framing checksum of the header at `off`, as a forger can.
void Refresh(std::string& seg, size_t off) {
  const uint64_t c = XXH3_64bits(seg.data() + off, kChecksumAt);
  std::memcpy(seg.data() + off + kChecksumAt, &c, sizeof c);
}

void WriteFile(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint64_t> Offsets(uint64_t count) {
  std::vector<uint64_t> out;
  uint64_t off = 0;
  for (uint64_t i = 0; i < count; ++i) {
    out.push_back(off);
    off += 4096 + (PayloadOf(i).size() + 4095) / 4096 * 4096;
  }
  return out;
}

// A header whose framing checksum is valid but whose length is absurd cannot wrap, hang a scan,
// allocate, or hide the records after it.
TEST(DiskTierHostile, ForgedLengthsAreBoundedBeforeUse) {
  for (uint64_t len : {uint64_t{1} << 62, ~uint64_t{0} - 100, uint64_t{3} << 30, uint64_t{40000}}) {
    SCOPED_TRACE(len);
    TempDir dir;
    DiskTierOptions o = Opts(dir.path());
    o.segment_bytes = 1ULL << 30;
    WriteRun(o, 0, 6);
    const std::vector<uint64_t> at = Offsets(6);
    const std::filesystem::path seg = SegmentPath(dir.path(), 1);
    std::string bytes = ReadFile(seg);
    std::memcpy(bytes.data() + at[2] + kPayloadLenAt, &len, sizeof len);  // record 2's header
    Refresh(bytes, at[2]);
    std::string tail = bytes.substr(at[4], 4096);  // a copy of record 4's header, appended with the length
    std::memcpy(tail.data() + kPayloadLenAt, &len, sizeof len);
    Refresh(tail, 0);
    WriteFile(seg, bytes + tail);
    {
      DiskTierOptions ro = o;
      ro.read_only = true;  // `tier stats`: the same scan, writing nothing
      auto t = MustOpen(ro);
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(t->stats().records, 5u);
    }
    auto t = MustOpen(o);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->stats().quarantined, 2u);  // record 2, and the forged tail
    EXPECT_FALSE(t->Contains(Key(2)));
    for (uint64_t k : {0, 1, 3, 4, 5}) EXPECT_EQ(t->Get(Key(k))->payload, PayloadOf(k)) << k;
  }
}

// Editing bytes and recomputing every unkeyed checksum is not enough: the record is quarantined.
TEST(DiskTierHostile, EditedRecordWithRecomputedChecksumIsRejected) {
  TempDir dir;
  DiskTierOptions o = Opts(dir.path());
  WriteRun(o, 0, 3);
  const std::vector<uint64_t> at = Offsets(3);
  const std::filesystem::path seg = SegmentPath(dir.path(), 1);
  std::string bytes = ReadFile(seg);
  bytes[at[1] + 4096 + 7] ^= 0x10;  // a KV byte of record 1
  Refresh(bytes, at[1]);
  WriteFile(seg, bytes);
  auto t = MustOpen(o);
  EXPECT_EQ(t->stats().quarantined, 1u);
  EXPECT_FALSE(t->Contains(Key(1)));
  EXPECT_EQ(t->Get(Key(0))->payload, PayloadOf(0));
  EXPECT_EQ(t->Get(Key(2))->payload, PayloadOf(2));
}

// A copy of a genuine record with a raised sequence number (and other bytes) does not override
// the original: its header no longer authenticates.
TEST(DiskTierHostile, ReplayWithAHigherSequenceNumberDoesNotOverride) {
  TempDir dir;
  DiskTierOptions o = Opts(dir.path());
  WriteRun(o, 0, 3);
  const std::vector<uint64_t> at = Offsets(3);
  const std::filesystem::path seg = SegmentPath(dir.path(), 1);
  std::string bytes = ReadFile(seg);
  std::string copy = bytes.substr(at[1], at[2] - at[1]);
  uint64_t seq = 0;
  std::memcpy(&seq, copy.data() + kSeqAt, sizeof seq);
  seq += 1000;
  std::memcpy(copy.data() + kSeqAt, &seq, sizeof seq);
  copy[4096 + 3] ^= 0x01;
  Refresh(copy, 0);
  WriteFile(seg, bytes + copy);
  auto t = MustOpen(o);
  EXPECT_EQ(t->stats().quarantined, 1u);
  EXPECT_EQ(t->Get(Key(1))->payload, PayloadOf(1));
}

// Records written under another directory's key (another fleet, a copied segment) are refused.
TEST(DiskTierHostile, RecordsOfAnotherDirectoryAreRejected) {
  TempDir a, b;
  WriteRun(Opts(a.path()), 0, 3);
  WriteRun(Opts(b.path()), 10, 2);
  std::filesystem::copy_file(SegmentPath(a.path(), 1), SegmentPath(b.path(), 2));
  auto t = MustOpen(Opts(b.path()));
  EXPECT_EQ(t->stats().records, 2u);
  EXPECT_GE(t->stats().quarantined, 1u);
  for (uint64_t k = 0; k < 3; ++k) EXPECT_FALSE(t->Contains(Key(k)));
  EXPECT_EQ(t->Get(Key(10))->payload, PayloadOf(10));
}

// ---- Files in the directory ------------------------------------------------------------------

TEST(DiskTierFiles, PlantedLinksAreNeverFollowed) {
  TempDir dir, elsewhere;
  const std::string victim = elsewhere.Write("victim", "precious");
  WriteRun(Opts(dir.path()), 0, 2);
  // A link named as a segment: refused by name, the target untouched.
  std::filesystem::create_symlink(victim, SegmentPath(dir.path(), 2));
  Result<std::unique_ptr<DiskTier>> t = DiskTier::Open(Opts(dir.path()));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().field(), "dir");
  EXPECT_NE(t.status().message().find("symbolic link"), std::string::npos) << t.status().ToString();
  EXPECT_EQ(ReadFile(victim), "precious");
  std::filesystem::remove(SegmentPath(dir.path(), 2));

  // A link where the quarantine file of a damaged record will be written: another name is used.
  std::filesystem::create_directory(dir.path() + "/quarantine");
  std::filesystem::create_symlink(victim, dir.path() + "/quarantine/seg-000001.tsr.0.bad");
  Poke(SegmentPath(dir.path(), 1), 4096 + 5, 0x01);  // record 0's payload
  {
    auto damaged = MustOpen(Opts(dir.path()));
    ASSERT_NE(damaged, nullptr);
    EXPECT_EQ(damaged->stats().quarantined, 1u);
  }
  EXPECT_EQ(ReadFile(victim), "precious");
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/quarantine/seg-000001.tsr.0.1.bad"));

  // The quarantine directory itself a link: refused, nothing written through it.
  std::filesystem::remove_all(dir.path() + "/quarantine");
  std::filesystem::create_directory_symlink(elsewhere.path(), dir.path() + "/quarantine");
  Poke(SegmentPath(dir.path(), 1), 4096 + (PayloadOf(0).size() + 4095) / 4096 * 4096 + 4096 + 5, 0x01);  // record 1
  Result<std::unique_ptr<DiskTier>> q = DiskTier::Open(Opts(dir.path()));
  EXPECT_FALSE(q.ok());
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(elsewhere.path()), {}), 1);  // only the victim

  // The key file a link: refused (whoever chose its target would know the key).
  TempDir k;
  std::filesystem::create_symlink(victim, k.path() + "/prefix.key");
  Result<std::unique_ptr<DiskTier>> lk = DiskTier::Open(Opts(k.path()));
  ASSERT_FALSE(lk.ok());
  EXPECT_NE(lk.status().message().find("symbolic link"), std::string::npos) << lk.status().ToString();
}

TEST(DiskTierFiles, ForeignTypesAreRefusedAndOtherNamesIgnored) {
  TempDir dir;
  WriteRun(Opts(dir.path()), 0, 2);
  // Names that are not exactly seg-NNNNNN.tsr are not segments: neither read nor changed.
  for (const char* name : {"seg-5", "seg-000001.bak", "seg-000001.tsr.bak", "seg-0000001.tsr", "seg-000000.tsr"}) {
    dir.Write(name, std::string(5000, 'x'));
  }
  {
    auto t = MustOpen(Opts(dir.path()));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->stats().segments, 1u);
    EXPECT_EQ(t->stats().quarantined, 0u);
    EXPECT_EQ(t->stats().records, 2u);
  }
  EXPECT_EQ(ReadFile(dir.path() + "/seg-000001.bak"), std::string(5000, 'x'));
  // A FIFO or a directory under a segment's name: a prompt, clear error (never a hang).
  ASSERT_EQ(::mkfifo(SegmentPath(dir.path(), 7).c_str(), 0600), 0);
  Result<std::unique_ptr<DiskTier>> fifo = DiskTier::Open(Opts(dir.path()));
  ASSERT_FALSE(fifo.ok());
  EXPECT_NE(fifo.status().message().find("not a regular file"), std::string::npos) << fifo.status().ToString();
  std::filesystem::remove(SegmentPath(dir.path(), 7));
  std::filesystem::create_directory(SegmentPath(dir.path(), 8));
  EXPECT_FALSE(DiskTier::Open(Opts(dir.path())).ok());
}

TEST(DiskTierFiles, OwnerOnlyModesAndWarningsForLaxOnes) {
  TempDir parent;
  const std::string dir = parent.path() + "/tier";
  WriteRun(Opts(dir), 0, 1);
  auto mode = [](const std::string& p) {
    struct stat st {};
    EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
    return st.st_mode & 0777;
  };
  EXPECT_EQ(mode(dir), 0700u);
  EXPECT_EQ(mode(SegmentPath(dir, 1)), 0600u);
  EXPECT_EQ(mode(dir + "/prefix.key"), 0600u);
  Poke(SegmentPath(dir, 1), 4096 + 5, 0x01);
  {
    auto t = MustOpen(Opts(dir));
    EXPECT_TRUE(t->warnings().empty());
  }
  EXPECT_EQ(mode(dir + "/quarantine"), 0700u);
  EXPECT_EQ(mode(dir + "/quarantine/seg-000001.tsr.0.bad"), 0600u);
  ::chmod((dir + "/prefix.key").c_str(), 0644);
  ::chmod(dir.c_str(), 0777);
  auto t = MustOpen(Opts(dir));
  ASSERT_EQ(t->warnings().size(), 2u);
  EXPECT_NE(t->warnings()[0].find("chmod 700"), std::string::npos) << t->warnings()[0];
  EXPECT_NE(t->warnings()[1].find("prefix.key has mode 644"), std::string::npos) << t->warnings()[1];
}

// ---- Locking and the key ---------------------------------------------------------------------

TEST(DiskTierLock, OneWriterOrSharedReaders) {
  TempDir dir;
  DiskTierOptions writer = Opts(dir.path()), reader = Opts(dir.path());
  reader.read_only = true;
  {
    auto w = MustOpen(writer);
    ASSERT_NE(w, nullptr);
    Result<std::unique_ptr<DiskTier>> second = DiskTier::Open(writer);
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(second.status().message().find("locked"), std::string::npos);
    EXPECT_EQ(DiskTier::Open(reader).status().code(), StatusCode::kFailedPrecondition);
    ASSERT_TRUE(w->PutBatch(std::vector<TierRecord>{Rec(1)}).ok());
  }
  auto r1 = MustOpen(reader);
  auto r2 = MustOpen(reader);
  ASSERT_NE(r1, nullptr);
  ASSERT_NE(r2, nullptr);
  EXPECT_EQ(r2->Get(Key(1))->payload, PayloadOf(1));
  EXPECT_EQ(DiskTier::Open(writer).status().code(), StatusCode::kFailedPrecondition);
}

TEST(DiskTierKey, MissingKeyWithRecordsIsAnErrorNotAQuarantine) {
  TempDir dir;
  WriteRun(Opts(dir.path()), 0, 3);
  const std::string key = ReadFile(dir.path() + "/prefix.key");
  const std::string before = ReadFile(SegmentPath(dir.path(), 1));
  std::filesystem::remove(dir.path() + "/prefix.key");
  for (bool read_only : {false, true}) {
    DiskTierOptions o = Opts(dir.path());
    o.read_only = read_only;
    Result<std::unique_ptr<DiskTier>> t = DiskTier::Open(o);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
    EXPECT_NE(t.status().message().find("prefix.key is missing"), std::string::npos) << t.status().ToString();
  }
  // A process that derives its prefix keys from the directory first is refused the same way: a
  // new key would make the next Open quarantine every record.
  Result<TierKey> minted = DiskTier::LoadOrCreateKey(dir.path());
  ASSERT_FALSE(minted.ok());
  EXPECT_EQ(minted.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(minted.status().field(), "dir");
  EXPECT_EQ(ReadFile(SegmentPath(dir.path(), 1)), before);
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/prefix.key"));
  dir.Write("prefix.key", key);
  ASSERT_TRUE(DiskTier::LoadOrCreateKey(dir.path()).ok());
  EXPECT_EQ(MustOpen(Opts(dir.path()))->stats().records, 3u);
}

TEST(DiskTier, FsckAndStatsCreateNothing) {
  TempDir parent;
  DiskTierOptions o = Opts(parent.path() + "/absent");
  o.create = false;
  EXPECT_EQ(DiskTier::Open(o).status().code(), StatusCode::kNotFound);
  o.read_only = true;
  EXPECT_EQ(DiskTier::Open(o).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(parent.path() + "/absent"));
  // An empty directory: nothing to check, and neither a key nor a segment appears.
  std::filesystem::create_directory(parent.path() + "/empty");
  DiskTierOptions e = Opts(parent.path() + "/empty");
  e.create = false;
  EXPECT_EQ(MustOpen(e)->stats().records, 0u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(parent.path() + "/empty"), {}), 0);
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

// libFuzzer target for the disk tier's segment scanner, recovery and record reader.
//
// Every input runs against a directory with a fixed `prefix.key`.
// Mode 0 (first input byte even): the rest of the input is a segment file as found on disk.
// Mode 1 (odd): two batches of known records are written, then the input drives a list of
// operations on the segment: flip a byte, set a header's payload length or sequence number (with
// the framing checksum recomputed, as a forger can), duplicate a record at the end, append input
// bytes, truncate. Either way:
//   - a read-only open (`tier stats`) and a writer's open must finish without crashing;
//   - every record served must be one written under that key with exactly its bytes (the input
//     does not know the key, so it cannot forge one): anything else aborts;
//   - after the writer's open (which recovers), a new record appended is found by the next open.
//
//   cmake --preset fuzz && cmake --build build/fuzz --target segment_fuzz
//   build/fuzz/fuzz/segment_fuzz -max_total_time=60
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "tessera/disk_tier.h"

namespace {

using namespace tessera;

constexpr uint64_t kKnown = 6;
constexpr uint64_t kLate = 100;  // the record appended after recovery
// Header field offsets of the version-2 format (docs/adr/0010-disk-tier.md).
constexpr size_t kPayloadLenAt = 32, kSeqAt = 40, kChecksumAt = 120, kSlot = 4096;

std::vector<std::byte> PayloadOf(uint64_t i) {
  std::vector<std::byte> p(300 + (i % 8) * 2500);
  for (size_t k = 0; k < p.size(); ++k) p[k] = std::byte{static_cast<uint8_t>((i * 131 + k * 7) & 0xff)};
  return p;
}

Hash128 KeyOf(uint64_t i) { return Hash128{i + 1, 0xabcdef ^ i}; }

std::string FreshDir() {
  static int n = 0;
  std::string dir = std::filesystem::temp_directory_path() /
                    ("tessera-fuzz-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string key(32, '\0');
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<char>(0x3c ^ i);
  std::ofstream(dir + "/prefix.key", std::ios::binary).write(key.data(), static_cast<std::streamsize>(key.size()));
  std::filesystem::permissions(dir + "/prefix.key",
                               std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  return dir;
}

DiskTierOptions Options(const std::string& dir) {
  DiskTierOptions o;
  o.dir = dir;
  o.fsync = FsyncPolicy::kNone;
  return o;
}

// Offsets of the records as written: two batches of three.
std::vector<uint64_t> Offsets() {
  std::vector<uint64_t> out;
  uint64_t off = 0;
  for (uint64_t i = 0; i < kKnown; ++i) {
    out.push_back(off);
    off += kSlot + (PayloadOf(i).size() + kSlot - 1) / kSlot * kSlot;
  }
  return out;
}

uint64_t U64(const uint8_t* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, sizeof v);
  return v;
}

void Refresh(std::string& seg, size_t off) {
  if (off + kChecksumAt + 8 > seg.size()) return;
  const uint64_t c = XXH3_64bits(seg.data() + off, kChecksumAt);
  std::memcpy(seg.data() + off + kChecksumAt, &c, sizeof c);
}

// Applies the input's operations to the segment's bytes.
void Damage(std::string& seg, const uint8_t* data, size_t size) {
  const std::vector<uint64_t> at = Offsets();
  for (size_t i = 0; i < size;) {
    const uint8_t op = data[i++] % 6;
    const size_t left = size - i;
    if (seg.empty()) return;
    switch (op) {
      case 0:  // flip a byte
        if (left < 3) return;
        seg[(size_t{data[i]} << 8 | data[i + 1]) * 7 % seg.size()] ^= static_cast<char>(data[i + 2]);
        i += 3;
        break;
      case 1:    // a header's payload length
      case 2: {  // a header's sequence number
        if (left < 9) return;
        const uint64_t off = at[data[i] % kKnown];
        const uint64_t v = U64(data + i + 1);
        i += 9;
        if (off + kChecksumAt + 8 > seg.size()) break;
        std::memcpy(seg.data() + off + (op == 1 ? kPayloadLenAt : kSeqAt), &v, sizeof v);
        Refresh(seg, off);
        break;
      }
      case 3: {  // a record duplicated at the end, its sequence number raised
        if (left < 1) return;
        const size_t r = data[i++] % kKnown;
        const uint64_t from = at[r], to = r + 1 < kKnown ? at[r + 1] : seg.size();
        if (to > seg.size() || from >= to) break;
        std::string copy = seg.substr(from, to - from);
        if (copy.size() > kSeqAt + 8) {
          uint64_t seq = 0;
          std::memcpy(&seq, copy.data() + kSeqAt, sizeof seq);
          seq += 1000;
          std::memcpy(copy.data() + kSeqAt, &seq, sizeof seq);
          Refresh(copy, 0);
        }
        seg += copy;
        break;
      }
      case 4: {  // bytes of the input appended
        if (left < 1) return;
        const size_t want = data[i++];
        const size_t n = std::min(want, size - i);
        seg.append(reinterpret_cast<const char*>(data + i), n);
        i += n;
        break;
      }
      case 5:  // truncated
        if (left < 1) return;
        seg.resize(seg.size() * (data[i++] % 128) / 128);
        break;
    }
  }
}

// Every record served is a known one with exactly its bytes.
void CheckServed(DiskTier& t, bool late_written) {
  for (const auto& [key, len] : t.Keys()) {
    bool known = false;
    for (uint64_t i = 0; i < kKnown; ++i) known = known || key == KeyOf(i);
    known = known || (late_written && key == KeyOf(kLate));
    if (!known) std::abort();  // a record under a key nobody wrote: a forgery got through
  }
  for (uint64_t i = 0; i < kKnown; ++i) {
    Result<TierRecord> r = t.Get(KeyOf(i));
    if (r.ok() && r->payload != PayloadOf(i)) std::abort();
  }
  const DiskTierStats s = t.stats();
  if (s.records > 0 && s.live_bytes == 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string dir = FreshDir();
  const std::string seg = dir + "/seg-000001.tsr";
  std::string bytes;
  if ((data[0] & 1) == 0) {
    bytes.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  } else {
    {
      auto t = std::move(DiskTier::Open(Options(dir))).value();
      for (uint64_t first : {uint64_t{0}, kKnown / 2}) {
        std::vector<TierRecord> batch;
        for (uint64_t i = first; i < first + kKnown / 2; ++i) batch.push_back(TierRecord{KeyOf(i), 0, PayloadOf(i)});
        if (!t->PutBatch(batch).ok()) std::abort();
      }
    }
    std::ifstream in(seg, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
    Damage(bytes, data + 1, size - 1);
  }
  std::ofstream(seg, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));

  DiskTierOptions ro = Options(dir);
  ro.read_only = true;
  if (Result<std::unique_ptr<DiskTier>> t = DiskTier::Open(ro); t.ok()) CheckServed(**t, false);
  bool late_written = false;
  if (Result<std::unique_ptr<DiskTier>> t = DiskTier::Open(Options(dir)); t.ok()) {
    CheckServed(**t, false);
    std::vector<TierRecord> late{TierRecord{KeyOf(kLate), 0, PayloadOf(kLate)}};
    late_written = (*t)->PutBatch(late).ok();
  }
  if (Result<std::unique_ptr<DiskTier>> t = DiskTier::Open(Options(dir)); t.ok()) {
    CheckServed(**t, late_written);
    if (late_written) {
      // Recovery left an aligned, verified end: what was appended after it is found.
      Result<TierRecord> r = (*t)->Get(KeyOf(kLate));
      if (!r.ok() || r->payload != PayloadOf(kLate)) std::abort();
    }
  } else if (late_written) {
    std::abort();
  }
  std::filesystem::remove_all(dir);
  return 0;
}

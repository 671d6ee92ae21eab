// libFuzzer target for the disk tier's segment scanner and record reader.
//
// Mode 0 (first input byte even): the rest of the input is a segment file as found on disk.
// Mode 1 (odd): a valid segment of four known records is written, then damaged by the input:
// pairs of (offset, xor) bytes, and a final truncation length. Either way the tier must open
// without crashing, and every record it serves must be byte-identical to the one written under
// that key: a wrong byte served aborts.
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

#include "tessera/disk_tier.h"

namespace {

using namespace tessera;

std::vector<std::byte> PayloadOf(uint64_t i) {
  std::vector<std::byte> p(300 + i * 2500);
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
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string dir = FreshDir();
  const std::string seg = dir + "/seg-000001.tsr";
  const bool damage = (data[0] & 1) != 0;
  if (!damage) {
    std::ofstream(seg, std::ios::binary)
        .write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  } else {
    {
      DiskTierOptions o;
      o.dir = dir;
      o.fsync = FsyncPolicy::kNone;
      auto t = std::move(DiskTier::Open(o)).value();
      std::vector<DiskRecord> batch;
      for (uint64_t i = 0; i < 4; ++i) batch.push_back(DiskRecord{KeyOf(i), 0, PayloadOf(i)});
      if (!t->PutBatch(batch).ok()) std::abort();
    }
    std::fstream f(seg, std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t file_size = std::filesystem::file_size(seg);
    size_t i = 1;
    for (; i + 3 <= size; i += 3) {
      uint64_t off = (uint64_t{data[i]} << 8 | data[i + 1]) * 7 % file_size;
      f.seekg(static_cast<std::streamoff>(off));
      char c = 0;
      f.get(c);
      f.seekp(static_cast<std::streamoff>(off));
      f.put(static_cast<char>(c ^ static_cast<char>(data[i + 2])));
    }
    f.close();
    if (i < size && (data[i] & 0x80) != 0) {
      std::filesystem::resize_file(seg, file_size * (data[i] & 0x7f) / 128);
    }
  }
  DiskTierOptions o;
  o.dir = dir;
  Result<std::unique_ptr<DiskTier>> t = DiskTier::Open(o);
  if (t.ok()) {
    for (uint64_t i = 0; i < 4; ++i) {
      Result<DiskRecord> r = (*t)->Get(KeyOf(i));
      if (r.ok() && (!damage || r->payload != PayloadOf(i))) {
        // Raw inputs cannot forge a record under our keys (that would need a valid checksum);
        // damaged known records must come back intact or not at all.
        if (damage) std::abort();
      }
    }
    DiskTierStats s = (*t)->stats();
    if (s.records > 0 && s.live_bytes == 0) std::abort();
  }
  std::filesystem::remove_all(dir);
  return 0;
}

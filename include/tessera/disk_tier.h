// DiskTier: a persistent store of sealed blocks in segment files.
//
// Admission: every Put is stored (the tiered store above decides what to demote). Promotion:
// none inside the tier — Get returns a verified copy; the caller promotes.
//
// Format (docs/adr/0010-disk-tier.md). A directory of append-only segment files
// `seg-NNNNNN.tsr`. Each record starts on a 4,096-byte boundary: a 4,096-byte header slot (a
// 64-byte header: magic, format version, record-format id, flags, key, payload length,
// sequence number, xxh3-64 payload checksum, xxh3-64 header checksum) followed by the payload,
// padded to 4,096 bytes, so that payloads are aligned for O_DIRECT.
//
// Crash consistency: a batch's payloads are written (and, under kEveryBatch, fdatasync'ed)
// before its headers; a record is visible only when its header and payload checksums verify.
// On open the index is rebuilt by scanning every segment; a record whose header or payload does
// not verify is copied to `quarantine/`, marked dead in place (a valid "quarantined" header), and
// counted — it is never served. Get verifies again on every read.
//
// Thread-safety: not thread-safe; one owner.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessera/hash.h"
#include "tessera/status.h"

namespace tessera {

enum class FsyncPolicy {
  kNone,       // never fsync: a power failure may lose any record not yet written back by the OS
  kPeriodic,   // fdatasync once `fsync_every_bytes` have been appended
  kEveryBatch  // payloads fdatasync'ed, then headers written and fdatasync'ed, per batch
};
Result<FsyncPolicy> ParseFsyncPolicy(std::string_view name);

struct DiskTierOptions {
  std::string dir;
  FsyncPolicy fsync = FsyncPolicy::kEveryBatch;
  uint64_t fsync_every_bytes = 64ULL << 20;
  uint64_t segment_bytes = 256ULL << 20;  // roll to a new segment past this size
  uint64_t max_bytes = 0;                 // 0: no cap; else Put fails once segments would exceed it
  bool read_only = false;                 // fsck/stats: scan and quarantine, write nothing else
};

struct DiskRecord {
  Hash128 key;
  uint16_t format_id = 0;
  std::vector<std::byte> payload;
};

struct DiskTierStats {
  uint64_t segments = 0;
  uint64_t records = 0;      // live records in the index
  uint64_t bytes = 0;        // bytes of all segment files
  uint64_t live_bytes = 0;   // bytes of live records (header slot + padded payload)
  uint64_t dead_bytes = 0;   // superseded, erased, quarantined records and tombstones
  uint64_t quarantined = 0;  // records quarantined since open (scan or read)
  uint64_t verified = 0;     // records verified by the opening scan
  uint64_t reads = 0, read_failures = 0, writes = 0;
};

class DiskTier {
 public:
  // Opens (creating when absent and not read-only) and rebuilds the index. Errors: kIoError on
  // "dir".
  static Result<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options);
  ~DiskTier();

  // Appends the records (all or nothing visible: on failure none of the batch is indexed).
  // Errors: kIoError on "disk" (including a full disk or the max_bytes cap).
  Status PutBatch(std::span<const DiskRecord> records);
  Status PutBatch(std::span<const DiskRecord* const> records);
  // The verified record, or kNotFound; a record that fails verification is quarantined and
  // reported as kDataLoss (never returned).
  Result<DiskRecord> Get(const Hash128& key);
  bool Contains(const Hash128& key) const { return index_.count(key) > 0; }
  Status Erase(const Hash128& key);
  // Moves a record that verified here but failed a check above (e.g. its stored tokens did not
  // match the prefix key asked for) to quarantine, with the reason logged. OK when absent.
  Status QuarantineKey(const Hash128& key, const std::string& why);
  // Live records as (key, payload length), oldest write first (seeds an LRU on open).
  std::vector<std::pair<Hash128, uint64_t>> Keys() const;
  // Rewrites live records into fresh segments and removes the old ones; crash-safe (a crash
  // leaves the old segments, the new ones, or both — duplicates resolve by sequence number).
  Status Compact();
  Status Sync();

  DiskTierStats stats() const;
  std::vector<std::string> quarantine_log() const { return quarantine_log_; }

 private:
  struct Location {
    uint32_t segment;
    uint64_t offset;
    uint64_t payload_len;
    uint64_t seq;
    uint16_t format_id;
  };
  struct Segment {
    uint32_t id;
    std::string path;
    int fd = -1;
    uint64_t size = 0;
  };
  DiskTier() = default;
  Status Scan(Segment& seg);
  Status Quarantine(Segment& seg, uint64_t offset, uint64_t len, const std::string& why);
  Status OpenSegment(uint32_t id, bool create);
  Status RollIfNeeded(uint64_t incoming);
  Segment* SegmentById(uint32_t id);

  DiskTierOptions options_;
  std::vector<Segment> segments_;
  std::unordered_map<Hash128, Location, Hash128Hasher> index_;
  uint64_t next_seq_ = 1;
  uint64_t unsynced_ = 0;
  uint64_t dead_bytes_ = 0;
  uint64_t quarantined_ = 0;
  uint64_t verified_ = 0;
  uint64_t reads_ = 0, read_failures_ = 0, writes_ = 0;
  std::vector<std::string> quarantine_log_;
};

}  // namespace tessera

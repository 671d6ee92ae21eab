// DiskTier: a persistent store of sealed blocks in segment files.
//
// Admission: every Put is stored (the tiered store above decides what to demote). Promotion:
// none inside the tier — Get returns a verified copy; the caller promotes.
//
// Format (docs/adr/0010-disk-tier.md, version 2). A directory of append-only segment files named
// exactly `seg-NNNNNN.tsr` (six digits, 1..999999; any other name is not a segment). Each record
// starts on a 4,096-byte boundary: a 4,096-byte header slot (a 128-byte header: magic, version,
// record-format id, flags, key, payload length, sequence number, two nonces and two tags, and an
// xxh3-64 framing checksum) followed by the payload, padded to 4,096 bytes, so that payloads are
// aligned for O_DIRECT.
//
// Authenticity: the header tag authenticates the header (length, sequence number, key, flags and
// the payload tag), the payload tag the payload bound to that header, both with a RecordMac keyed
// by the directory's `prefix.key` (tier_key.h). Only a holder of the key can write a record this
// tier accepts: an edited payload, a record copied from another directory, or a copy of a record
// with a raised sequence number fails and is quarantined; the xxh3 checksum only frames headers.
// Lengths come from authenticated headers and are bounded by the file and by kMaxPayloadBytes
// before any use, so a hostile length cannot wrap, allocate or skip valid records.
//
// Crash consistency: each record (header slot, payload, padding) is written with one pwritev (its
// writeback started at once, so the disk writes it while the next record is tagged) and,
// under kEveryBatch, the batch is fdatasync'ed once; a record is visible only when its header and
// payload verify, so a batch torn by a crash or a power failure (any of its pages missing, in any
// order) keeps exactly its complete records (docs/adr/0041-one-sync-per-batch.md). On open every
// segment is scanned: a region that does not verify is copied to `quarantine/`, marked dead in
// place (an authenticated dead marker) and counted; the scan resumes at the next record that
// verifies. A damaged or partial region at a segment's end (a writer killed mid-batch, bytes
// appended or cut off) is a torn tail: it is quarantined and the segment truncated (or padded) to
// the end of its last complete record, so the next writer appends at an aligned end and every
// complete record before it survives.
//
// The directory: created mode 0700 (segments and quarantine files 0600) because records hold
// tenants' prompt tokens. Every file is opened relative to the directory's descriptor with
// O_NOFOLLOW; a segment name that is a link, a FIFO or anything but a regular file makes Open fail
// naming it. A writer (and fsck) holds an exclusive flock on the directory, a read-only opener a
// shared one; a second writer gets kFailedPrecondition at once, never a shared write.
//
// Thread-safety: not thread-safe; one owner.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessera/hash128.h"
#include "tessera/record_mac.h"
#include "tessera/status.h"
#include "tessera/tier.h"
#include "tessera/tier_key.h"
#include "tessera/unique_fd.h"

namespace tessera {

enum class FsyncPolicy {
  kNone,       // never fsync: a power failure may lose any record not yet written back by the OS
  kPeriodic,   // fdatasync once `fsync_every_bytes` have been appended
  kEveryBatch  // one fdatasync per batch, after all its records are written
};
Result<FsyncPolicy> ParseFsyncPolicy(std::string_view name);

// The steps of a write, in order, for fault-injection tests (DiskTierOptions::fault_hook).
enum class DiskWriteStep {
  kRecordWritten,  // one record (header slot, payload, padding) is written, once per record
  kBatchSynced,    // the batch fdatasync'ed (kEveryBatch only); the batch is durable
};

// The largest payload one record may have; a header claiming more is damage.
inline constexpr uint64_t kMaxPayloadBytes = 1ULL << 30;

struct DiskTierOptions {
  std::string dir;
  FsyncPolicy fsync = FsyncPolicy::kEveryBatch;
  uint64_t fsync_every_bytes = 64ULL << 20;
  uint64_t segment_bytes = 256ULL << 20;  // roll to a new segment past this size
  uint64_t max_bytes = 0;                 // 0: no cap; else Put fails once segments would exceed it
  // Scan and report; write nothing (no quarantine, no truncation), take a shared lock.
  bool read_only = false;
  // Create the directory and its key when absent (false: fsck, which must not create anything).
  bool create = true;
  // Fault injection: called at each step of a write; a test stops the process there.
  std::function<void(DiskWriteStep)> fault_hook;
};

struct DiskTierStats {
  uint64_t segments = 0;
  uint64_t records = 0;          // live records in the index
  uint64_t bytes = 0;            // bytes of all segment files
  uint64_t live_bytes = 0;       // bytes of live records (header slot + padded payload)
  uint64_t dead_bytes = 0;       // superseded, erased, quarantined records and tombstones
  uint64_t quarantined = 0;      // regions quarantined since open (scan or read)
  uint64_t verified = 0;         // records verified by the opening scan
  uint64_t torn_tail_bytes = 0;  // bytes cut from (or padded onto) segment ends by recovery
  uint64_t reads = 0, read_failures = 0, writes = 0;
};

class DiskTier {
 public:
  // Opens (creating when absent, `create` and not read-only) and rebuilds the index.
  // Errors (field "dir"): kNotFound when absent and not to be created, or when records exist but
  // `prefix.key` does not; kFailedPrecondition when another process holds the directory's lock;
  // kIoError for a planted link, a foreign file named as a segment, or an I/O failure.
  static Result<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options);
  // The key of the tier directory `dir` (created 0700 with any missing parent), for a process
  // that derives its prefix keys from the directory before it opens the tier. Loaded, or created
  // only while the directory holds no segment — Open's rule: a directory whose key was lost is
  // refused (kNotFound on "dir"), never given a new key under which every record would fail.
  static Result<TierKey> LoadOrCreateKey(const std::string& dir);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Appends the records (all or nothing visible: on failure none of the batch is indexed).
  // Errors: kInvalidArgument on "payload" for a payload over kMaxPayloadBytes; kIoError on
  // "disk" (including a full disk or the max_bytes cap).
  Status PutBatch(std::span<const TierRecord> records);
  Status PutBatch(std::span<const TierRecord* const> records);
  // The verified record, or kNotFound; a record that fails verification is quarantined and
  // reported as kDataLoss (never returned).
  Result<TierRecord> Get(const Hash128& key);
  // The payload length of the record the index holds for `key`; nullopt when absent.
  std::optional<uint64_t> PayloadSize(const Hash128& key) const;
  // As Get, but reads the payload straight into `out` (buffers filled in order, e.g. a pool
  // block's pages), authenticating it chunk by chunk as it is read. The sizes must add up to
  // PayloadSize(key), else kInvalidArgument on "out" and nothing is read. kNotFound when absent;
  // a record that fails verification is quarantined, `out` zeroed, and kDataLoss returned.
  Status ReadInto(const Hash128& key, std::span<const std::span<std::byte>> out, uint16_t* format_id);
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
  // Superseded, erased and quarantined bytes in the segments (what Compact would reclaim); O(1).
  uint64_t dead_bytes() const { return dead_bytes_; }
  std::vector<std::string> quarantine_log() const { return quarantine_log_; }
  // Conditions worth an operator's attention that did not stop the open (permissions).
  const std::vector<std::string>& warnings() const { return warnings_; }
  // The directory's secret (prefix.key), for the managers' prefix keys. Empty for a read-only
  // open of a directory without one (then it holds no records).
  const std::vector<std::byte>& secret() const { return secret_; }

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
    std::string name;
    UniqueFd fd;
    uint64_t size = 0;
  };
  struct Probe;
  DiskTier() = default;
  Status OpenDirectory();
  Status OpenSegment(uint32_t id, bool create);
  Status Scan(Segment& seg);
  // What is at `off`; `expect_len` (a record the index knows): the length its header must have.
  Probe ProbeAt(const Segment& seg, uint64_t off, std::vector<std::byte>& payload,
                uint64_t expect_len = UINT64_MAX) const;
  // ProbeAt with the payload read into `into` (sizes adding up to expect_len).
  Probe ProbeInto(const Segment& seg, uint64_t off, std::span<const std::span<std::byte>> into,
                  uint64_t expect_len) const;
  // The header checks of ProbeAt; `payload_next` set when a payload is to be read and verified.
  Probe ProbeHeader(const Segment& seg, uint64_t off, uint64_t expect_len, bool* payload_next) const;
  // A verification failure on read: the record leaves the index, is quarantined, kDataLoss.
  Status FailRead(const Hash128& key, Segment* seg, uint64_t offset, uint64_t payload_len);
  Status Quarantine(Segment& seg, uint64_t offset, uint64_t len, const std::string& why, bool mark_dead);
  Status RollIfNeeded(uint64_t incoming);
  Status AppendRecords(std::span<const TierRecord* const> records, uint32_t flags);
  Segment* SegmentById(uint32_t id);
  void Hook(DiskWriteStep step) const {
    if (options_.fault_hook) options_.fault_hook(step);
  }

  DiskTierOptions options_;
  UniqueFd dir_fd_;
  std::vector<std::byte> secret_;
  std::unique_ptr<RecordMac> mac_;
  std::vector<Segment> segments_;
  std::unordered_map<Hash128, Location, Hash128Hasher> index_;
  uint64_t next_seq_ = 1;
  uint64_t unsynced_ = 0;
  uint64_t dead_bytes_ = 0;
  uint64_t quarantined_ = 0;
  uint64_t verified_ = 0;
  uint64_t torn_tail_bytes_ = 0;
  uint64_t reads_ = 0, read_failures_ = 0, writes_ = 0;
  std::vector<std::string> quarantine_log_;
  std::vector<std::string> warnings_;
};

}  // namespace tessera

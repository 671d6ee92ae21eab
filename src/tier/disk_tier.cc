#include "tessera/disk_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <optional>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "tessera/checked.h"
#include "tessera/tier_key.h"

namespace tessera {

namespace {

constexpr uint32_t kMagic = 0x52455354;  // "TSER" little-endian
constexpr uint16_t kVersion = 2;
constexpr uint64_t kSlot = 4096;
constexpr uint32_t kFlagTombstone = 1;
constexpr uint32_t kFlagDead = 2;  // a quarantined region, skipped by scans
constexpr uint32_t kMaxSegmentId = 999999;
constexpr char kMacLabel[] = "tessera disk record v2";
constexpr size_t kCopyChunk = 1 << 20;
// A quarantine copy keeps at most this much of a region (it is for a person to look at; the
// dead marker is what keeps the region from being served).
constexpr uint64_t kMaxQuarantineCopy = 64ULL << 20;

// The on-disk header. The payload tag covers bytes [0, kIdentityBytes) and the payload; the
// header tag covers bytes [0, kTaggedBytes), the payload tag included; the checksum covers
// [0, kChecksummedBytes) and only frames a header (it is no defence: anyone can compute it).
struct Header {
  uint32_t magic;
  uint16_t version;
  uint16_t format_id;
  uint32_t flags;
  uint32_t reserved;
  uint64_t key_lo;
  uint64_t key_hi;
  uint64_t payload_len;
  uint64_t seq;
  RecordMac::Nonce payload_nonce;
  RecordMac::Tag payload_tag;
  RecordMac::Nonce header_nonce;
  RecordMac::Tag header_tag;
  uint64_t reserved2;
  uint64_t header_checksum;
};
static_assert(sizeof(Header) == 128);
constexpr size_t kIdentityBytes = offsetof(Header, payload_nonce);
constexpr size_t kTaggedBytes = offsetof(Header, header_tag);
constexpr size_t kChecksummedBytes = offsetof(Header, header_checksum);

std::span<const std::byte> BytesOf(const Header& h, size_t n) { return {reinterpret_cast<const std::byte*>(&h), n}; }
uint64_t HeaderChecksum(const Header& h) { return XXH3_64bits(&h, kChecksummedBytes); }
// REQUIRES: len <= kMaxPayloadBytes (so neither sum can wrap).
uint64_t Padded(uint64_t len) { return CeilDiv(len, kSlot) * kSlot; }
uint64_t RecordBytes(uint64_t len) { return kSlot + Padded(len); }

// A record's header with both tags (payload, then header) and the framing checksum.
Header SealedHeader(const RecordMac& mac, const TierRecord& r, uint32_t flags, uint64_t seq) {
  Header h{};
  h.magic = kMagic;
  h.version = kVersion;
  h.format_id = r.format_id;
  h.flags = flags;
  h.key_lo = r.key.lo;
  h.key_hi = r.key.hi;
  h.payload_len = r.payload.size();
  h.seq = seq;
  h.payload_nonce = RecordMac::RandomNonce();
  h.payload_tag = mac.Compute(h.payload_nonce, {BytesOf(h, kIdentityBytes), r.payload});
  h.header_nonce = RecordMac::RandomNonce();
  h.header_tag = mac.Compute(h.header_nonce, {BytesOf(h, kTaggedBytes)});
  h.header_checksum = HeaderChecksum(h);
  return h;
}

Status Errno(const std::string& field, const std::string& what) {
  return IoError(field, what + ": " + std::strerror(errno));
}

Status WriteAt(int fd, const void* data, size_t len, uint64_t offset) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::pwrite(fd, p, len, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("disk", "write failed");
    }
    p += n;
    len -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

// Writes the buffers back to back at `offset`, resuming after short writes.
Status WriteVAt(int fd, std::span<iovec> iov, uint64_t offset) {
  size_t first = 0;
  while (first < iov.size()) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    const ssize_t n =
        ::pwritev(fd, iov.data() + first, static_cast<int>(iov.size() - first), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? Errno("disk", "write failed") : IoError("disk", "write made no progress");
    offset += static_cast<uint64_t>(n);
    for (size_t left = static_cast<size_t>(n); left > 0 && first < iov.size();) {
      const size_t take = std::min(left, iov[first].iov_len);
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
      iov[first].iov_len -= take;
      left -= take;
      if (iov[first].iov_len == 0) ++first;
    }
  }
  return Status::Ok();
}

bool ReadAt(int fd, void* data, size_t len, uint64_t offset) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    ssize_t n = ::pread(fd, p, len, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

// Reads a payload whose header verified and checks its tag chunk by chunk, each chunk right after
// its read while it is still in the cache (and while the kernel's readahead fetches the next);
// the caller uses the payload only when the whole tag matches (ADR 0041). Asking the kernel for
// the whole payload first (POSIX_FADV_WILLNEED) measured slower, 0.29x pread with the cache dropped.
constexpr size_t kReadChunk = size_t{256} * 1024;
// Reads the payload at `at` into `out` (in order) chunk by chunk, each chunk fed to the payload
// tag's verifier right after its read, while it is still in the cache. (Verifying on a second
// thread one chunk behind the reads was measured slower here: ADR 0041, "The read".)
bool ReadAndVerifyPayload(const RecordMac& mac, int fd, const Header& h, uint64_t at,
                          std::span<const std::span<std::byte>> out) {
  RecordMac::Verifier v = mac.Begin(h.payload_nonce);
  v.Update(BytesOf(h, kIdentityBytes));
  for (std::span<std::byte> o : out) {
    for (size_t done = 0; done < o.size();) {
      const size_t n = std::min(kReadChunk, o.size() - done);
      if (!ReadAt(fd, o.data() + done, n, at)) return false;
      v.Update({o.data() + done, n});
      done += n;
      at += n;
    }
  }
  return v.Matches(h.payload_tag);
}

std::string SegmentName(uint32_t id) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "seg-%06u.tsr", id);
  return buf;
}

// The id of a segment file name: exactly "seg-" six digits ".tsr", id 1..999999.
std::optional<uint32_t> ParseSegmentName(std::string_view name) {
  if (name.size() != 14 || name.substr(0, 4) != "seg-" || name.substr(10) != ".tsr") return std::nullopt;
  uint32_t id = 0;
  for (char c : name.substr(4, 6)) {
    if (c < '0' || c > '9') return std::nullopt;
    id = id * 10 + static_cast<uint32_t>(c - '0');
  }
  if (id == 0) return std::nullopt;
  return id;
}

// The ids of the segment files in the directory open as `dir_fd`, ascending.
Result<std::vector<uint32_t>> ListSegments(int dir_fd, const std::string& dir) {
  std::vector<uint32_t> ids;
  int list_fd = ::dup(dir_fd);
  DIR* d = list_fd >= 0 ? ::fdopendir(list_fd) : nullptr;
  if (d == nullptr) {
    if (list_fd >= 0) ::close(list_fd);
    return Errno("dir", "cannot list " + dir);
  }
  ::rewinddir(d);
  while (dirent* e = ::readdir(d)) {
    if (std::optional<uint32_t> id = ParseSegmentName(e->d_name)) ids.push_back(*id);
  }
  ::closedir(d);
  std::sort(ids.begin(), ids.end());
  return ids;
}

// The directory's key; created (when `create`) only while it holds no segment: segments whose
// key is missing cannot be authenticated, and a new key would make every record fail.
Result<TierKey> DirectoryKey(int dir_fd, const std::string& dir, size_t segments, bool create) {
  Result<TierKey> key = LoadTierKeyAt(dir_fd, dir, create && segments == 0);
  if (key.status().code() == StatusCode::kNotFound && segments > 0) {
    return NotFound("dir", dir + "/" + kTierKeyFile + " is missing: its " + std::to_string(segments) +
                               " segment files cannot be authenticated (restore the key or remove them)");
  }
  return key;
}

std::string Octal(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%03o", static_cast<unsigned>(mode & 0777));
  return buf;
}

}  // namespace

// What ProbeAt found at an offset.
struct DiskTier::Probe {
  enum Kind { kBad, kLive, kTombstone, kDead } kind = kBad;
  Header header{};
  uint64_t total = 0;  // bytes the record spans (header slot + padded payload)
  const char* why = "no record header";
};

Result<FsyncPolicy> ParseFsyncPolicy(std::string_view name) {
  if (name == "none") return FsyncPolicy::kNone;
  if (name == "periodic") return FsyncPolicy::kPeriodic;
  if (name == "batch") return FsyncPolicy::kEveryBatch;
  return InvalidArgument("fsync", "unknown policy \"" + std::string(name) + "\" (known: none, periodic, batch)");
}

DiskTier::~DiskTier() = default;

DiskTier::Segment* DiskTier::SegmentById(uint32_t id) {
  for (Segment& s : segments_) {
    if (s.id == id) return &s;
  }
  return nullptr;
}

Status DiskTier::OpenDirectory() {
  const std::string& dir = options_.dir;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return Errno("dir", "cannot open " + dir);
    if (options_.read_only || !options_.create) return NotFound("dir", dir + " does not exist");
    TESSERA_RETURN_IF_ERROR(CreateTierDirectory(dir));
  }
  dir_fd_.Reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd_.valid()) {
    if (errno == ENOTDIR) return IoError("dir", dir + " is not a directory");
    return Errno("dir", "cannot open " + dir);
  }
  if (::fstat(dir_fd_.get(), &st) != 0) return Errno("dir", "cannot stat " + dir);
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    warnings_.push_back(dir + " has mode " + Octal(st.st_mode) +
                        ": group or others can plant or remove files in it; chmod 700 it");
  }
  // One writer (or fsck) at a time; readers share. The lock goes with the descriptor.
  if (::flock(dir_fd_.get(), (options_.read_only ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return FailedPrecondition("dir",
                                dir + " is locked by another process (a writer or fsck); try again when it exits");
    }
    return Errno("dir", "cannot lock " + dir);
  }
  return Status::Ok();
}

Status DiskTier::OpenSegment(uint32_t id, bool create) {
  Segment seg;
  seg.id = id;
  seg.name = SegmentName(id);
  const std::string path = options_.dir + "/" + seg.name;
  // O_NOFOLLOW: a planted link is refused, never written through; O_NONBLOCK: a FIFO cannot
  // block the open (it is then refused as a foreign file type).
  int flags =
      (options_.read_only ? O_RDONLY : O_RDWR) | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (create ? O_CREAT | O_EXCL : 0);
  seg.fd.Reset(::openat(dir_fd_.get(), seg.name.c_str(), flags, 0600));
  if (!seg.fd.valid()) {
    if (errno == ELOOP) return IoError("dir", path + " is a symbolic link, not a segment file; remove it");
    return Errno("dir", "cannot open " + path);
  }
  struct stat st {};
  if (::fstat(seg.fd.get(), &st) != 0) return Errno("dir", "cannot stat " + path);
  if (!S_ISREG(st.st_mode)) return IoError("dir", path + " is not a regular file, not a segment; remove it");
  if (!create && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    warnings_.push_back(path + " has mode " + Octal(st.st_mode) +
                        ": group or others can read the prompt tokens it holds; chmod 600 it");
  }
  seg.size = static_cast<uint64_t>(st.st_size);
  segments_.push_back(std::move(seg));
  if (create) ::fsync(dir_fd_.get());
  return Status::Ok();
}

Result<TierKey> DiskTier::LoadOrCreateKey(const std::string& dir) {
  TESSERA_RETURN_IF_ERROR(CreateTierDirectory(dir));
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return Errno("dir", "cannot open " + dir);
  TESSERA_ASSIGN_OR_RETURN(const std::vector<uint32_t> ids, ListSegments(fd.get(), dir));
  return DirectoryKey(fd.get(), dir, ids.size(), /*create=*/true);
}

Result<std::unique_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options) {
  if (options.dir.empty()) return InvalidArgument("dir", "a directory is required");
  if (options.segment_bytes == 0) return InvalidArgument("segment-bytes", "must be positive");
  std::unique_ptr<DiskTier> t(new DiskTier());
  t->options_ = options;
  TESSERA_RETURN_IF_ERROR(t->OpenDirectory());

  TESSERA_ASSIGN_OR_RETURN(const std::vector<uint32_t> ids, ListSegments(t->dir_fd_.get(), options.dir));
  Result<TierKey> key = DirectoryKey(t->dir_fd_.get(), options.dir, ids.size(), !options.read_only && options.create);
  if (key.ok()) {
    t->secret_ = std::move(key->secret);
    for (std::string& w : key->warnings) t->warnings_.push_back(std::move(w));
    TESSERA_ASSIGN_OR_RETURN(RecordMac mac, RecordMac::Create(t->secret_, kMacLabel));
    t->mac_ = std::make_unique<RecordMac>(std::move(mac));
  } else if (key.status().code() != StatusCode::kNotFound || !ids.empty()) {
    return key.status();
  }  // else no key and no segment, none to be created (read-only, or !create): an empty tier

  for (uint32_t id : ids) TESSERA_RETURN_IF_ERROR(t->OpenSegment(id, false));
  for (Segment& seg : t->segments_) TESSERA_RETURN_IF_ERROR(t->Scan(seg));
  return t;
}

DiskTier::Probe DiskTier::ProbeHeader(const Segment& seg, uint64_t off, uint64_t expect_len, bool* payload_next) const {
  *payload_next = false;
  Probe p;
  Header& h = p.header;
  if (off > seg.size || seg.size - off < sizeof(Header) || !ReadAt(seg.fd.get(), &h, sizeof h, off)) return p;
  if (h.magic != kMagic || h.version != kVersion || h.header_checksum != HeaderChecksum(h)) {
    p.why = h.magic == kMagic ? "header checksum mismatch" : "no record header";
    return p;
  }
  // Bound every length by the format and by the file before any use.
  const bool tombstone = h.flags == kFlagTombstone, dead = h.flags == kFlagDead;
  if ((h.flags != 0 && !tombstone && !dead) || h.payload_len > kMaxPayloadBytes || (tombstone && h.payload_len != 0)) {
    p.why = "header fields out of range";
    return p;
  }
  // A payload must be in the file; a header-only record (a tombstone, an empty dead region) may
  // lack its padding at the end of a segment.
  if (h.payload_len > 0 && (seg.size - off < kSlot || seg.size - off - kSlot < h.payload_len)) {
    p.why = "record extends past the end of its segment";
    return p;
  }
  if (mac_ == nullptr || !mac_->Verify(h.header_nonce, {BytesOf(h, kTaggedBytes)}, h.header_tag)) {
    p.why = "header fails authentication";
    return p;
  }
  p.total = RecordBytes(h.payload_len);
  if (dead) {
    p.kind = Probe::kDead;
    return p;
  }
  if (expect_len != UINT64_MAX && h.payload_len != expect_len) {
    p.why = "header length differs from the index";
    return p;
  }
  *payload_next = true;
  return p;
}

DiskTier::Probe DiskTier::ProbeAt(const Segment& seg, uint64_t off, std::vector<std::byte>& payload,
                                  uint64_t expect_len) const {
  bool payload_next = false;
  Probe p = ProbeHeader(seg, off, expect_len, &payload_next);
  if (!payload_next) return p;
  payload.resize(p.header.payload_len);
  const std::span<std::byte> whole(payload);
  if (!ReadAndVerifyPayload(*mac_, seg.fd.get(), p.header, off + kSlot, {&whole, 1})) {
    p.why = "payload fails authentication";
    return p;
  }
  p.kind = p.header.flags == kFlagTombstone ? Probe::kTombstone : Probe::kLive;
  return p;
}

DiskTier::Probe DiskTier::ProbeInto(const Segment& seg, uint64_t off, std::span<const std::span<std::byte>> into,
                                    uint64_t expect_len) const {
  bool payload_next = false;
  Probe p = ProbeHeader(seg, off, expect_len, &payload_next);
  if (!payload_next) return p;
  if (!ReadAndVerifyPayload(*mac_, seg.fd.get(), p.header, off + kSlot, into)) {
    p.why = "payload fails authentication";
    return p;
  }
  p.kind = p.header.flags == kFlagTombstone ? Probe::kTombstone : Probe::kLive;
  return p;
}

// Scan invariant: [0, off) is a sequence of verified records, dead markers and quarantined
// regions; `end` is where the last of them ends (a record's padding may be missing at EOF).
// A region that does not verify ends at the next offset that does; when none does, it is the
// torn tail: quarantined and cut off, so the next append starts at `end`, slot-aligned.
Status DiskTier::Scan(Segment& seg) {
  std::vector<std::byte> payload;
  uint64_t off = 0, end = 0;
  while (off < seg.size) {
    Probe p = ProbeAt(seg, off, payload);
    if (p.kind == Probe::kBad) {
      uint64_t next = off + kSlot;
      while (next < seg.size && ProbeAt(seg, next, payload).kind == Probe::kBad) next += kSlot;
      if (next >= seg.size) {
        TESSERA_RETURN_IF_ERROR(Quarantine(seg, off, seg.size - off, std::string("torn tail: ") + p.why, false));
        break;
      }
      TESSERA_RETURN_IF_ERROR(Quarantine(seg, off, next - off, p.why, true));
      dead_bytes_ += next - off;
      off = end = next;
      continue;
    }
    const Header& h = p.header;
    if (p.kind == Probe::kDead) {
      dead_bytes_ += p.total;
    } else {
      ++verified_;
      next_seq_ = std::max(next_seq_, h.seq + 1);
      const Hash128 key{h.key_lo, h.key_hi};
      auto it = index_.find(key);
      if (it != index_.end() && it->second.seq > h.seq) {
        dead_bytes_ += p.total;  // an older version
      } else {
        if (it != index_.end()) dead_bytes_ += RecordBytes(it->second.payload_len);
        if (p.kind == Probe::kTombstone) {
          if (it != index_.end()) index_.erase(it);
          dead_bytes_ += p.total;
        } else {
          index_[key] = Location{seg.id, off, h.payload_len, h.seq, h.format_id};
        }
      }
    }
    off = end = off + p.total;
  }
  if (end != seg.size) {
    torn_tail_bytes_ += end > seg.size ? end - seg.size : seg.size - end;
    if (!options_.read_only) {
      if (::ftruncate(seg.fd.get(), static_cast<off_t>(end)) != 0 || ::fdatasync(seg.fd.get()) != 0) {
        return Errno("disk", "cannot cut the torn tail of " + options_.dir + "/" + seg.name);
      }
      seg.size = end;
    }
  }
  return Status::Ok();
}

Status DiskTier::Quarantine(Segment& seg, uint64_t offset, uint64_t len, const std::string& why, bool mark_dead) {
  ++quarantined_;
  quarantine_log_.push_back(options_.dir + "/" + seg.name + " @" + std::to_string(offset) + ": " + why);
  if (options_.read_only) return Status::Ok();
  // Keep a copy of what was there (best effort: the copy is for a person, the marking is what
  // keeps the region from being served), then mark the region dead in place.
  len = std::min(len, seg.size > offset ? seg.size - offset : 0);
  if (::mkdirat(dir_fd_.get(), "quarantine", 0700) != 0 && errno != EEXIST) {
    return Errno("disk", "cannot create " + options_.dir + "/quarantine");
  }
  UniqueFd qdir(::openat(dir_fd_.get(), "quarantine", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!qdir.valid()) return Errno("disk", options_.dir + "/quarantine is not a directory (a link?)");
  const std::string base = seg.name + "." + std::to_string(offset);
  UniqueFd out;
  for (int n = 0; n < 100 && !out.valid(); ++n) {
    const std::string name = base + (n == 0 ? "" : "." + std::to_string(n)) + ".bad";
    out.Reset(::openat(qdir.get(), name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!out.valid() && errno != EEXIST) break;
  }
  if (out.valid()) {
    const uint64_t keep = std::min(len, kMaxQuarantineCopy);
    std::vector<char> chunk(std::min<uint64_t>(keep, kCopyChunk));
    for (uint64_t done = 0; done < keep;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), keep - done));
      if (!ReadAt(seg.fd.get(), chunk.data(), n, offset + done) || !WriteAt(out.get(), chunk.data(), n, done).ok()) {
        break;
      }
      done += n;
    }
    ::fsync(out.get());
  }
  if (!mark_dead) return Status::Ok();
  // A chain of markers, each within the payload bound a scan enforces (a region of more than
  // kMaxPayloadBytes under one marker would fail that bound and be quarantined again at every
  // open). Regions are whole slots: they end where a verified record starts.
  for (uint64_t at = offset, left = len; left > 0;) {
    const uint64_t span = std::min(left, kSlot + kMaxPayloadBytes);
    Header h{};
    h.magic = kMagic;
    h.version = kVersion;
    h.flags = kFlagDead;
    h.payload_len = span > kSlot ? span - kSlot : 0;
    h.seq = next_seq_++;
    h.header_nonce = RecordMac::RandomNonce();
    h.header_tag = mac_->Compute(h.header_nonce, {BytesOf(h, kTaggedBytes)});
    h.header_checksum = HeaderChecksum(h);
    TESSERA_RETURN_IF_ERROR(WriteAt(seg.fd.get(), &h, sizeof h, at));
    at += span;
    left -= span;
  }
  if (::fdatasync(seg.fd.get()) != 0) return Errno("disk", "fdatasync failed");
  return Status::Ok();
}

Status DiskTier::RollIfNeeded(uint64_t incoming) {
  if (segments_.empty()) return OpenSegment(1, true);  // the first write creates the first segment
  Segment& active = segments_.back();
  if (active.size > 0 && active.size + incoming > options_.segment_bytes) {
    if (active.id >= kMaxSegmentId) return IoError("disk", "segment ids are exhausted; compact the tier");
    return OpenSegment(active.id + 1, true);
  }
  return Status::Ok();
}

Status DiskTier::PutBatch(std::span<const TierRecord> records) {
  std::vector<const TierRecord*> ptrs;
  ptrs.reserve(records.size());
  for (const TierRecord& r : records) ptrs.push_back(&r);
  return PutBatch(std::span<const TierRecord* const>(ptrs));
}

Status DiskTier::PutBatch(std::span<const TierRecord* const> records) { return AppendRecords(records, /*flags=*/0); }

// Long (~90 lines) on purpose: the write and its undo (the segment cut back on any failure) stay
// in one function so that every early return is seen to leave nothing of the batch.
Status DiskTier::AppendRecords(std::span<const TierRecord* const> records, uint32_t flags) {
  if (options_.read_only || mac_ == nullptr) return IoError("disk", "the tier is open read-only");
  Checked incoming = 0;
  for (const TierRecord* r : records) {
    if (r->payload.size() > kMaxPayloadBytes) {
      return InvalidArgument("payload", std::to_string(r->payload.size()) + " bytes exceed the record limit of " +
                                            std::to_string(kMaxPayloadBytes));
    }
    incoming += RecordBytes(r->payload.size());
  }
  if (incoming.overflowed()) return InvalidArgument("payload", "the batch is too large");
  if (options_.max_bytes > 0) {
    uint64_t used = 0;
    for (const Segment& s : segments_) used += s.size;
    if (used + incoming.value() > options_.max_bytes) {
      return IoError("disk", "no space: " + std::to_string(used) + " + " + std::to_string(incoming.value()) +
                                 " bytes exceed the cap of " + std::to_string(options_.max_bytes));
    }
  }
  TESSERA_RETURN_IF_ERROR(RollIfNeeded(incoming.value()));
  Segment& seg = segments_.back();
  const int fd = seg.fd.get();
  const uint64_t start = seg.size;
  // A failure leaves nothing of the batch: the segment is cut back to where it started.
  auto undo = [&](Status st) {
    (void)::ftruncate(fd, static_cast<off_t>(start));
    return st;
  };
  // One write per record, header slot, payload and padding together, and (kEveryBatch) one
  // fdatasync per batch: each header authenticates its own payload, so a batch torn by a power
  // failure (any of its pages lost, in any order) is recovered record by record (ADR 0041).
  alignas(64) static constexpr std::array<std::byte, kSlot> kZeros{};
  std::array<std::byte, kSlot> slot{};
  std::vector<Location> locations;
  locations.reserve(records.size());
  const uint64_t first_seq = next_seq_;
  next_seq_ += records.size();
  // The tags are computed on this thread: a second thread per record (ADR 0041) cost more CPU
  // than it saved without a core to spare (ADR 0047).
  uint64_t off = start;
  for (size_t i = 0; i < records.size(); ++i) {
    const TierRecord* r = records[i];
    const Header h = SealedHeader(*mac_, *r, flags, first_seq + i);
    std::memcpy(slot.data(), &h, sizeof h);
    const size_t pad = static_cast<size_t>(Padded(h.payload_len) - h.payload_len);
    std::array<iovec, 3> iov{iovec{slot.data(), slot.size()},
                             iovec{const_cast<std::byte*>(r->payload.data()), r->payload.size()},  // NOLINT
                             iovec{const_cast<std::byte*>(kZeros.data()), pad}};                   // NOLINT
    Status st = WriteVAt(fd, iov, off);
    if (!st.ok()) return undo(st);
    // Start the record's writeback now (no wait, no durability: the fdatasync below gives that),
    // so that the disk writes it while the next record is tagged and copied.
    if (options_.fsync == FsyncPolicy::kEveryBatch) {
      (void)::sync_file_range(fd, static_cast<off_t>(off), static_cast<off_t>(RecordBytes(h.payload_len)),
                              SYNC_FILE_RANGE_WRITE);
    }
    Hook(DiskWriteStep::kRecordWritten);
    locations.push_back(Location{seg.id, off, h.payload_len, h.seq, h.format_id});
    off += RecordBytes(r->payload.size());
  }
  if (options_.fsync == FsyncPolicy::kEveryBatch) {
    if (::fdatasync(fd) != 0) return undo(Errno("disk", "fdatasync failed"));
    Hook(DiskWriteStep::kBatchSynced);
  }
  seg.size = off;
  unsynced_ += off - start;
  for (size_t i = 0; i < records.size(); ++i) {
    auto it = index_.find(records[i]->key);
    if (it != index_.end()) {
      dead_bytes_ += RecordBytes(it->second.payload_len);
      index_.erase(it);
    }
    if (flags == kFlagTombstone) {
      dead_bytes_ += RecordBytes(0);
    } else {
      index_[records[i]->key] = locations[i];
    }
  }
  writes_ += records.size();
  if (options_.fsync == FsyncPolicy::kPeriodic && unsynced_ >= options_.fsync_every_bytes) return Sync();
  return Status::Ok();
}

Result<TierRecord> DiskTier::Get(const Hash128& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return NotFound("key", "not in the disk tier");
  ++reads_;
  const Location loc = it->second;
  Segment* seg = SegmentById(loc.segment);
  TierRecord r;
  r.key = key;
  r.format_id = loc.format_id;
  Probe p;
  if (seg != nullptr) p = ProbeAt(*seg, loc.offset, r.payload, loc.payload_len);
  const Header& h = p.header;
  if (p.kind != Probe::kLive || h.key_lo != key.lo || h.key_hi != key.hi || h.seq != loc.seq) {
    return FailRead(key, seg, loc.offset, loc.payload_len);
  }
  return r;
}

std::optional<uint64_t> DiskTier::PayloadSize(const Hash128& key) const {
  auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  return it->second.payload_len;
}

Status DiskTier::ReadInto(const Hash128& key, std::span<const std::span<std::byte>> out, uint16_t* format_id) {
  auto it = index_.find(key);
  if (it == index_.end()) return NotFound("key", "not in the disk tier");
  const Location loc = it->second;
  uint64_t total = 0;
  for (std::span<std::byte> o : out) total += o.size();
  if (total != loc.payload_len) {
    return InvalidArgument("out", std::to_string(total) + " bytes of buffers do not match the " +
                                      std::to_string(loc.payload_len) + "-byte record");
  }
  ++reads_;
  Segment* seg = SegmentById(loc.segment);
  Probe p;
  if (seg != nullptr) p = ProbeInto(*seg, loc.offset, out, loc.payload_len);
  const Header& h = p.header;
  if (p.kind != Probe::kLive || h.key_lo != key.lo || h.key_hi != key.hi || h.seq != loc.seq) {
    for (std::span<std::byte> o : out) {
      if (!o.empty()) std::memset(o.data(), 0, o.size());
    }
    return FailRead(key, seg, loc.offset, loc.payload_len);
  }
  if (format_id != nullptr) *format_id = loc.format_id;
  return Status::Ok();
}

Status DiskTier::FailRead(const Hash128& key, Segment* seg, uint64_t offset, uint64_t payload_len) {
  ++read_failures_;
  index_.erase(key);
  dead_bytes_ += RecordBytes(payload_len);
  if (seg != nullptr) {
    TESSERA_RETURN_IF_ERROR(Quarantine(*seg, offset, RecordBytes(payload_len), "failed verification on read", true));
  }
  return DataLoss("key", "record failed verification and was quarantined");
}

Status DiskTier::QuarantineKey(const Hash128& key, const std::string& why) {
  auto it = index_.find(key);
  if (it == index_.end()) return Status::Ok();
  const Location loc = it->second;
  index_.erase(it);
  dead_bytes_ += RecordBytes(loc.payload_len);
  Segment* seg = SegmentById(loc.segment);
  if (seg == nullptr) return Status::Ok();
  return Quarantine(*seg, loc.offset, RecordBytes(loc.payload_len), why, true);
}

std::vector<std::pair<Hash128, uint64_t>> DiskTier::Keys() const {
  std::vector<std::pair<uint64_t, std::pair<Hash128, uint64_t>>> by_seq;
  by_seq.reserve(index_.size());
  for (const auto& [key, loc] : index_) by_seq.push_back({loc.seq, {key, loc.payload_len}});
  std::sort(by_seq.begin(), by_seq.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::pair<Hash128, uint64_t>> out;
  out.reserve(by_seq.size());
  for (auto& e : by_seq) out.push_back(e.second);
  return out;
}

Status DiskTier::Erase(const Hash128& key) {
  if (index_.count(key) == 0) return Status::Ok();
  // A tombstone is an empty record flagged as such, written through the normal path.
  TierRecord tomb{key, 0, {}};
  const TierRecord* one = &tomb;
  return AppendRecords(std::span<const TierRecord* const>(&one, 1), kFlagTombstone);
}

Status DiskTier::Sync() {
  for (Segment& s : segments_) {
    if (::fdatasync(s.fd.get()) != 0) return Errno("disk", "fdatasync failed");
  }
  unsynced_ = 0;
  return Status::Ok();
}

Status DiskTier::Compact() {
  if (options_.read_only) return IoError("disk", "the tier is open read-only");
  std::vector<Segment> old = std::move(segments_);
  segments_.clear();
  const uint32_t first_new = old.empty() ? 1 : old.back().id + 1;
  if (first_new > kMaxSegmentId) {
    segments_ = std::move(old);
    return IoError("disk", "segment ids are exhausted");
  }
  // Live records in sequence order, copied with their headers (and so their tags and sequence
  // numbers) into new segments.
  std::vector<std::pair<Hash128, Location>> live(index_.begin(), index_.end());
  std::sort(live.begin(), live.end(), [](const auto& a, const auto& b) { return a.second.seq < b.second.seq; });
  Status st = OpenSegment(first_new, true);
  std::unordered_map<Hash128, Location, Hash128Hasher> fresh;
  std::vector<std::byte> buf;
  for (const auto& [key, loc] : live) {
    if (!st.ok()) break;
    const Segment* src = nullptr;
    for (const Segment& s : old) {
      if (s.id == loc.segment) src = &s;
    }
    const uint64_t total = RecordBytes(loc.payload_len);
    buf.resize(total);
    if (src == nullptr || !ReadAt(src->fd.get(), buf.data(), total, loc.offset)) {
      st = IoError("disk", "cannot read a live record during compaction");
      break;
    }
    Segment& dst = segments_.back();
    if (dst.size > 0 && dst.size + total > options_.segment_bytes) {
      st = dst.id >= kMaxSegmentId ? IoError("disk", "segment ids are exhausted") : OpenSegment(dst.id + 1, true);
      if (!st.ok()) break;
    }
    Segment& out = segments_.back();
    st = WriteAt(out.fd.get(), buf.data(), total, out.size);
    Location nl = loc;
    nl.segment = out.id;
    nl.offset = out.size;
    out.size += total;
    fresh[key] = nl;
  }
  for (Segment& s : segments_) {
    if (st.ok() && ::fsync(s.fd.get()) != 0) st = Errno("disk", "fsync failed");
  }
  if (!st.ok()) {
    // Keep the old segments; drop the partial new ones.
    for (Segment& s : segments_) ::unlinkat(dir_fd_.get(), s.name.c_str(), 0);
    segments_ = std::move(old);
    return st;
  }
  ::fsync(dir_fd_.get());
  for (Segment& s : old) ::unlinkat(dir_fd_.get(), s.name.c_str(), 0);
  ::fsync(dir_fd_.get());
  index_ = std::move(fresh);
  dead_bytes_ = 0;
  return Status::Ok();
}

DiskTierStats DiskTier::stats() const {
  DiskTierStats s;
  s.segments = segments_.size();
  s.records = index_.size();
  for (const Segment& seg : segments_) s.bytes += seg.size;
  for (const auto& [key, loc] : index_) s.live_bytes += RecordBytes(loc.payload_len);
  s.dead_bytes = dead_bytes_;
  s.quarantined = quarantined_;
  s.verified = verified_;
  s.torn_tail_bytes = torn_tail_bytes_;
  s.reads = reads_;
  s.read_failures = read_failures_;
  s.writes = writes_;
  return s;
}

}  // namespace tessera

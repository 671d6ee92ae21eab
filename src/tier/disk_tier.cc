#include "tessera/disk_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "tessera/checked.h"

namespace tessera {

namespace {

constexpr uint32_t kMagic = 0x52455354;  // "TSER" little-endian
constexpr uint16_t kVersion = 1;
constexpr uint64_t kSlot = 4096;
constexpr uint32_t kFlagTombstone = 1;
constexpr uint32_t kFlagQuarantined = 2;

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
  uint64_t payload_checksum;
  uint64_t header_checksum;
};
static_assert(sizeof(Header) == 64);

uint64_t HeaderChecksum(const Header& h) { return XXH3_64bits(&h, offsetof(Header, header_checksum)); }
uint64_t PayloadChecksum(std::span<const std::byte> p, uint64_t seq) {
  return XXH3_64bits_withSeed(p.data(), p.size(), seq);
}
uint64_t Padded(uint64_t len) { return CeilDiv(len, kSlot) * kSlot; }
uint64_t RecordBytes(uint64_t len) { return kSlot + Padded(len); }

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

bool ValidHeader(const Header& h) {
  return h.magic == kMagic && h.version == kVersion && h.header_checksum == HeaderChecksum(h);
}

std::string SegmentName(uint32_t id) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "seg-%06u.tsr", id);
  return buf;
}

void SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

Result<FsyncPolicy> ParseFsyncPolicy(std::string_view name) {
  if (name == "none") return FsyncPolicy::kNone;
  if (name == "periodic") return FsyncPolicy::kPeriodic;
  if (name == "batch") return FsyncPolicy::kEveryBatch;
  return InvalidArgument("fsync", "unknown policy \"" + std::string(name) + "\" (known: none, periodic, batch)");
}

DiskTier::~DiskTier() {
  for (Segment& s : segments_) {
    if (s.fd >= 0) ::close(s.fd);
  }
}

DiskTier::Segment* DiskTier::SegmentById(uint32_t id) {
  for (Segment& s : segments_) {
    if (s.id == id) return &s;
  }
  return nullptr;
}

Status DiskTier::OpenSegment(uint32_t id, bool create) {
  Segment seg;
  seg.id = id;
  seg.path = options_.dir + "/" + SegmentName(id);
  int flags = (options_.read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC | (create ? O_CREAT | O_EXCL : 0);
  seg.fd = ::open(seg.path.c_str(), flags, 0644);
  if (seg.fd < 0) return Errno("dir", "cannot open " + seg.path);
  struct stat st {};
  if (::fstat(seg.fd, &st) != 0) return Errno("dir", "cannot stat " + seg.path);
  seg.size = static_cast<uint64_t>(st.st_size);
  segments_.push_back(seg);
  if (create) SyncDir(options_.dir);
  return Status::Ok();
}

Result<std::unique_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options) {
  if (options.dir.empty()) return InvalidArgument("dir", "a directory is required");
  std::unique_ptr<DiskTier> t(new DiskTier());
  t->options_ = options;
  struct stat st {};
  if (::stat(options.dir.c_str(), &st) != 0) {
    if (options.read_only) return Errno("dir", "cannot open " + options.dir);
    if (::mkdir(options.dir.c_str(), 0755) != 0) return Errno("dir", "cannot create " + options.dir);
  } else if (!S_ISDIR(st.st_mode)) {
    return IoError("dir", options.dir + " is not a directory");
  }
  DIR* d = ::opendir(options.dir.c_str());
  if (d == nullptr) return Errno("dir", "cannot list " + options.dir);
  std::vector<uint32_t> ids;
  while (dirent* e = ::readdir(d)) {
    unsigned id = 0;
    char tail = 0;
    if (std::sscanf(e->d_name, "seg-%6u.tsr%c", &id, &tail) == 1) ids.push_back(id);
  }
  ::closedir(d);
  std::sort(ids.begin(), ids.end());
  for (uint32_t id : ids) TESSERA_RETURN_IF_ERROR(t->OpenSegment(id, false));
  for (Segment& seg : t->segments_) TESSERA_RETURN_IF_ERROR(t->Scan(seg));
  if (!options.read_only && t->segments_.empty()) TESSERA_RETURN_IF_ERROR(t->OpenSegment(1, true));
  return t;
}

Status DiskTier::Quarantine(Segment& seg, uint64_t offset, uint64_t len, const std::string& why) {
  ++quarantined_;
  std::string entry = seg.path + " @" + std::to_string(offset) + ": " + why;
  quarantine_log_.push_back(entry);
  if (options_.read_only) return Status::Ok();
  // Keep a copy of what was there, then mark the record dead in place so that it is never
  // served and a later scan does not count it again.
  std::string qdir = options_.dir + "/quarantine";
  ::mkdir(qdir.c_str(), 0755);
  len = std::min(len, seg.size > offset ? seg.size - offset : 0);
  std::vector<char> bytes(len);
  if (len > 0 && ReadAt(seg.fd, bytes.data(), len, offset)) {
    std::string path = qdir + "/" + SegmentName(seg.id) + "." + std::to_string(offset) + ".bad";
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      (void)WriteAt(fd, bytes.data(), bytes.size(), 0);
      ::fsync(fd);
      ::close(fd);
    }
  }
  Header h{};
  h.magic = kMagic;
  h.version = kVersion;
  h.flags = kFlagQuarantined;
  h.payload_len = len > kSlot ? len - kSlot : 0;
  h.header_checksum = HeaderChecksum(h);
  TESSERA_RETURN_IF_ERROR(WriteAt(seg.fd, &h, sizeof h, offset));
  if (::fdatasync(seg.fd) != 0) return Errno("disk", "fdatasync failed");
  return Status::Ok();
}

Status DiskTier::Scan(Segment& seg) {
  std::vector<std::byte> payload;
  for (uint64_t off = 0; off + sizeof(Header) <= seg.size;) {
    Header h{};
    if (!ReadAt(seg.fd, &h, sizeof h, off)) break;
    if (!ValidHeader(h)) {
      // Where a header should be there is none: a damaged header, the payload of a record whose
      // header was lost or never written (a torn batch), or a tail that was extended but not
      // written. The whole region up to the next valid header is one damaged record.
      uint64_t end = off + kSlot;
      while (end + sizeof(Header) <= seg.size) {
        Header next{};
        if (!ReadAt(seg.fd, &next, sizeof next, end) || ValidHeader(next)) break;
        end += kSlot;
      }
      end = std::min(end, seg.size);
      TESSERA_RETURN_IF_ERROR(
          Quarantine(seg, off, end - off, h.magic == kMagic ? "header checksum mismatch" : "no record header"));
      dead_bytes_ += end - off;
      off = end;
      continue;
    }
    const uint64_t total = RecordBytes(h.payload_len);
    if ((h.flags & kFlagQuarantined) != 0) {
      dead_bytes_ += std::min(total, seg.size - off);
      off += total;
      continue;
    }
    if (off + kSlot + h.payload_len > seg.size) {
      TESSERA_RETURN_IF_ERROR(Quarantine(seg, off, seg.size - off, "payload truncated"));
      dead_bytes_ += seg.size - off;
      break;
    }
    payload.resize(h.payload_len);
    if (!ReadAt(seg.fd, payload.data(), payload.size(), off + kSlot) ||
        PayloadChecksum(payload, h.seq) != h.payload_checksum) {
      TESSERA_RETURN_IF_ERROR(Quarantine(seg, off, total, "payload checksum mismatch"));
      dead_bytes_ += total;
      off += total;
      continue;
    }
    ++verified_;
    next_seq_ = std::max(next_seq_, h.seq + 1);
    Hash128 key{h.key_lo, h.key_hi};
    auto it = index_.find(key);
    if (it != index_.end() && it->second.seq > h.seq) {
      dead_bytes_ += total;  // an older version
    } else {
      if (it != index_.end()) dead_bytes_ += RecordBytes(it->second.payload_len);
      if ((h.flags & kFlagTombstone) != 0) {
        if (it != index_.end()) index_.erase(it);
        dead_bytes_ += total;
      } else {
        index_[key] = Location{seg.id, off, h.payload_len, h.seq, h.format_id};
      }
    }
    off += total;
  }
  return Status::Ok();
}

Status DiskTier::RollIfNeeded(uint64_t incoming) {
  Segment& active = segments_.back();
  if (active.size > 0 && active.size + incoming > options_.segment_bytes) {
    return OpenSegment(active.id + 1, true);
  }
  return Status::Ok();
}

Status DiskTier::PutBatch(std::span<const DiskRecord> records) {
  std::vector<const DiskRecord*> ptrs;
  ptrs.reserve(records.size());
  for (const DiskRecord& r : records) ptrs.push_back(&r);
  return PutBatch(std::span<const DiskRecord* const>(ptrs));
}

Status DiskTier::PutBatch(std::span<const DiskRecord* const> records) {
  if (options_.read_only) return IoError("disk", "the tier is open read-only");
  uint64_t incoming = 0;
  for (const DiskRecord* r : records) incoming += RecordBytes(r->payload.size());
  if (options_.max_bytes > 0) {
    uint64_t used = 0;
    for (const Segment& s : segments_) used += s.size;
    if (used + incoming > options_.max_bytes) {
      return IoError("disk", "no space: " + std::to_string(used) + " + " + std::to_string(incoming) +
                                 " bytes exceed the cap of " + std::to_string(options_.max_bytes));
    }
  }
  TESSERA_RETURN_IF_ERROR(RollIfNeeded(incoming));
  Segment& seg = segments_.back();
  const uint64_t start = seg.size;
  std::vector<Header> headers;
  std::vector<Location> locations;
  uint64_t off = start;
  for (const DiskRecord* rp : records) {
    const DiskRecord& r = *rp;
    Header h{};
    h.magic = kMagic;
    h.version = kVersion;
    h.format_id = r.format_id;
    h.key_lo = r.key.lo;
    h.key_hi = r.key.hi;
    h.payload_len = r.payload.size();
    h.seq = next_seq_++;
    h.payload_checksum = PayloadChecksum(r.payload, h.seq);
    h.header_checksum = HeaderChecksum(h);
    Status st = WriteAt(seg.fd, r.payload.data(), r.payload.size(), off + kSlot);
    if (!st.ok()) {
      (void)::ftruncate(seg.fd, static_cast<off_t>(start));
      return st;
    }
    headers.push_back(h);
    locations.push_back(Location{seg.id, off, h.payload_len, h.seq, h.format_id});
    off += RecordBytes(r.payload.size());
  }
  // Extend the file to the padded end so that the next record starts on a slot.
  if (::ftruncate(seg.fd, static_cast<off_t>(off)) != 0) {
    Status st = Errno("disk", "cannot extend " + seg.path);
    (void)::ftruncate(seg.fd, static_cast<off_t>(start));
    return st;
  }
  if (options_.fsync == FsyncPolicy::kEveryBatch && ::fdatasync(seg.fd) != 0) return Errno("disk", "fdatasync failed");
  for (size_t i = 0; i < headers.size(); ++i) {
    Status st = WriteAt(seg.fd, &headers[i], sizeof(Header), locations[i].offset);
    if (!st.ok()) {
      (void)::ftruncate(seg.fd, static_cast<off_t>(start));
      return st;
    }
  }
  if (options_.fsync == FsyncPolicy::kEveryBatch && ::fdatasync(seg.fd) != 0) return Errno("disk", "fdatasync failed");
  unsynced_ += off - start;
  if (options_.fsync == FsyncPolicy::kPeriodic && unsynced_ >= options_.fsync_every_bytes)
    TESSERA_RETURN_IF_ERROR(Sync());
  seg.size = off;
  for (size_t i = 0; i < records.size(); ++i) {
    auto it = index_.find(records[i]->key);
    if (it != index_.end()) dead_bytes_ += RecordBytes(it->second.payload_len);
    index_[records[i]->key] = locations[i];
  }
  writes_ += records.size();
  return Status::Ok();
}

Result<DiskRecord> DiskTier::Get(const Hash128& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return NotFound("key", "not in the disk tier");
  ++reads_;
  const Location loc = it->second;
  Segment* seg = SegmentById(loc.segment);
  Header h{};
  DiskRecord r;
  r.key = key;
  r.format_id = loc.format_id;
  r.payload.resize(loc.payload_len);
  bool ok = seg != nullptr && ReadAt(seg->fd, &h, sizeof h, loc.offset) && ValidHeader(h) && h.key_lo == key.lo &&
            h.key_hi == key.hi && h.seq == loc.seq && h.payload_len == loc.payload_len &&
            ReadAt(seg->fd, r.payload.data(), r.payload.size(), loc.offset + kSlot) &&
            PayloadChecksum(r.payload, h.seq) == h.payload_checksum;
  if (!ok) {
    ++read_failures_;
    index_.erase(it);
    dead_bytes_ += RecordBytes(loc.payload_len);
    if (seg != nullptr)
      TESSERA_RETURN_IF_ERROR(
          Quarantine(*seg, loc.offset, RecordBytes(loc.payload_len), "failed verification on read"));
    return Status(StatusCode::kDataLoss, "key", "record failed verification and was quarantined");
  }
  return r;
}

Status DiskTier::QuarantineKey(const Hash128& key, const std::string& why) {
  auto it = index_.find(key);
  if (it == index_.end()) return Status::Ok();
  const Location loc = it->second;
  index_.erase(it);
  dead_bytes_ += RecordBytes(loc.payload_len);
  Segment* seg = SegmentById(loc.segment);
  if (seg == nullptr) return Status::Ok();
  return Quarantine(*seg, loc.offset, RecordBytes(loc.payload_len), why);
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
  auto it = index_.find(key);
  if (it == index_.end()) return Status::Ok();
  DiskRecord tomb;
  tomb.key = key;
  // A tombstone is an empty record flagged as such; write it through the normal path.
  TESSERA_RETURN_IF_ERROR(RollIfNeeded(kSlot));
  Segment& seg = segments_.back();
  Header h{};
  h.magic = kMagic;
  h.version = kVersion;
  h.flags = kFlagTombstone;
  h.key_lo = key.lo;
  h.key_hi = key.hi;
  h.seq = next_seq_++;
  h.payload_checksum = PayloadChecksum({}, h.seq);
  h.header_checksum = HeaderChecksum(h);
  const uint64_t off = seg.size;
  if (::ftruncate(seg.fd, static_cast<off_t>(off + kSlot)) != 0) return Errno("disk", "cannot extend " + seg.path);
  TESSERA_RETURN_IF_ERROR(WriteAt(seg.fd, &h, sizeof h, off));
  if (options_.fsync == FsyncPolicy::kEveryBatch && ::fdatasync(seg.fd) != 0) return Errno("disk", "fdatasync failed");
  seg.size = off + kSlot;
  dead_bytes_ += RecordBytes(it->second.payload_len) + kSlot;
  index_.erase(it);
  return Status::Ok();
}

Status DiskTier::Sync() {
  for (Segment& s : segments_) {
    if (::fdatasync(s.fd) != 0) return Errno("disk", "fdatasync failed");
  }
  unsynced_ = 0;
  return Status::Ok();
}

Status DiskTier::Compact() {
  if (options_.read_only) return IoError("disk", "the tier is open read-only");
  std::vector<Segment> old = segments_;
  const uint32_t first_new = old.empty() ? 1 : old.back().id + 1;
  // Live records in sequence order, copied with their sequence numbers into new segments.
  std::vector<std::pair<Hash128, Location>> live(index_.begin(), index_.end());
  std::sort(live.begin(), live.end(), [](const auto& a, const auto& b) { return a.second.seq < b.second.seq; });
  segments_.clear();
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
    if (src == nullptr || !ReadAt(src->fd, buf.data(), total, loc.offset)) {
      st = IoError("disk", "cannot read a live record during compaction");
      break;
    }
    Segment& dst = segments_.back();
    if (dst.size > 0 && dst.size + total > options_.segment_bytes) {
      st = OpenSegment(dst.id + 1, true);
      if (!st.ok()) break;
    }
    Segment& out = segments_.back();
    st = WriteAt(out.fd, buf.data(), total, out.size);
    Location nl = loc;
    nl.segment = out.id;
    nl.offset = out.size;
    out.size += total;
    fresh[key] = nl;
  }
  for (Segment& s : segments_) {
    if (st.ok() && ::fsync(s.fd) != 0) st = Errno("disk", "fsync failed");
  }
  if (!st.ok()) {
    // Keep the old segments; drop the partial new ones.
    for (Segment& s : segments_) {
      ::close(s.fd);
      ::unlink(s.path.c_str());
    }
    segments_ = old;
    return st;
  }
  SyncDir(options_.dir);
  for (Segment& s : old) {
    ::close(s.fd);
    ::unlink(s.path.c_str());
  }
  SyncDir(options_.dir);
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
  s.reads = reads_;
  s.read_failures = read_failures_;
  s.writes = writes_;
  return s;
}

}  // namespace tessera

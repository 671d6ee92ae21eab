#include "tessera/tier_key.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "tessera/record_mac.h"
#include "tessera/unique_fd.h"

namespace tessera {

namespace {

Status Errno(const std::string& what, int err) { return IoError("dir", what + ": " + std::strerror(err)); }

Result<TierKey> ReadKey(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Errno("cannot stat " + path, errno);
  if (!S_ISREG(st.st_mode)) return IoError("dir", path + " is not a regular file; refusing it as a key");
  if (st.st_size != static_cast<off_t>(kTierKeyBytes)) {
    return DataLoss("dir", path + " holds " + std::to_string(st.st_size) + " bytes, expected a 32-byte key");
  }
  TierKey key;
  key.secret.resize(kTierKeyBytes);
  size_t done = 0;
  while (done < kTierKeyBytes) {
    ssize_t n = ::read(fd, key.secret.data() + done, kTierKeyBytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return DataLoss("dir", "cannot read the 32-byte key in " + path);
    done += static_cast<size_t>(n);
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    key.warnings.push_back(path + " has mode " + mode +
                           ": group or others can read it and forge records the tier accepts; chmod 600 it");
  }
  return key;
}

}  // namespace

Result<TierKey> LoadTierKeyAt(int dir_fd, const std::string& dir, bool create) {
  const std::string path = dir + "/" + kTierKeyFile;
  for (int attempt = 0; attempt < 2; ++attempt) {
    // O_NOFOLLOW: a planted link is refused, never read through; O_NONBLOCK: a FIFO cannot block.
    UniqueFd fd(::openat(dir_fd, kTierKeyFile, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (fd.valid()) return ReadKey(fd.get(), path);
    if (errno == ELOOP) return IoError("dir", path + " is a symbolic link; refusing to follow it");
    if (errno != ENOENT) return Errno("cannot read " + path, errno);
    if (!create) return NotFound("dir", path + " does not exist");
    // Create: write a temporary, fsync, then link it into place (fails if another process won).
    RecordMac::Nonce a = RecordMac::RandomNonce(), b = RecordMac::RandomNonce();
    TierKey key;
    key.secret.resize(kTierKeyBytes);
    std::memcpy(key.secret.data(), a.data(), a.size());
    std::memcpy(key.secret.data() + a.size(), b.data(), b.size());
    const std::string tmp_name = std::string(kTierKeyFile) + ".tmp." + std::to_string(::getpid());
    ::unlinkat(dir_fd, tmp_name.c_str(), 0);  // a stale temporary of a crashed process with our pid
    UniqueFd out(::openat(dir_fd, tmp_name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!out.valid()) return Errno("cannot create " + dir + "/" + tmp_name, errno);
    bool ok = ::write(out.get(), key.secret.data(), key.secret.size()) == static_cast<ssize_t>(key.secret.size()) &&
              ::fsync(out.get()) == 0;
    out.Reset();
    int linked = ok ? ::linkat(dir_fd, tmp_name.c_str(), dir_fd, kTierKeyFile, 0) : -1;
    int link_errno = errno;
    ::unlinkat(dir_fd, tmp_name.c_str(), 0);
    if (!ok) return IoError("dir", "cannot write " + dir + "/" + tmp_name);
    if (linked == 0) {
      ::fsync(dir_fd);
      return key;
    }
    if (link_errno != EEXIST) return Errno("cannot create " + path, link_errno);
    // Another process created it first: read theirs.
  }
  return IoError("dir", "cannot create " + path);
}

Status CreateTierDirectory(const std::string& dir) {
  if (dir.empty()) return InvalidArgument("dir", "a directory is required");
  for (size_t end = dir.find('/', 1);; end = dir.find('/', end + 1)) {
    const std::string part = dir.substr(0, end);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) return Errno("cannot create " + part, errno);
    if (end == std::string::npos) return Status::Ok();
  }
}

}  // namespace tessera

#include "tessera/file_io.h"
#include "tessera/unique_fd.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "file_io_testing.h"

namespace tessera {

namespace detail {
namespace {
RenameFunction g_rename = nullptr;
}  // namespace
void SetRenameForTesting(RenameFunction fn) { g_rename = fn; }
}  // namespace detail

namespace {

int Rename(const char* from, const char* to) {
  return detail::g_rename != nullptr ? detail::g_rename(from, to) : ::rename(from, to);
}

std::string KindOf(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

Status NotRegular(std::string_view field, const std::string& path, mode_t mode) {
  return InvalidArgument(std::string(field), path + " is " + KindOf(mode) + ", not a regular file");
}

}  // namespace

Result<std::string> ReadRegularFile(const std::string& path, std::string_view field, uint64_t max_bytes) {
  const std::string f(field);
  // Look before opening: opening a FIFO for reading can block and opening some devices has side
  // effects, so only a regular file is opened at all. The descriptor is checked again after the
  // open, since the path can change in between.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return IoError(f, "cannot open " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return NotRegular(field, path, st.st_mode);
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd.valid()) return IoError(f, "cannot open " + path + ": " + std::strerror(errno));
  if (::fstat(fd.get(), &st) != 0) return IoError(f, "cannot stat " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return NotRegular(field, path, st.st_mode);
  const std::string limit = std::to_string(max_bytes) + " B";
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > max_bytes) {
    return OutOfRange(f, path + " is " + std::to_string(st.st_size) + " B, more than the " + limit + " read");
  }
  // Read at most max_bytes + 1: a file that grows while it is read is refused, not cut short.
  std::string text;
  text.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (true) {
    if (done == text.size()) {
      if (text.size() > max_bytes) break;
      text.resize(std::min<uint64_t>(max_bytes + 1, text.size() + 4096));
    }
    ssize_t n = ::read(fd.get(), text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError(f, "cannot read " + path + ": " + std::strerror(errno));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  if (done > max_bytes) return OutOfRange(f, path + " grew past the " + limit + " read");
  text.resize(done);
  return text;
}

namespace {

// Writes `path`, a temporary name; errors name `target`, the file the user asked for.
Status WriteAll(const std::string& path, const std::string& contents, const std::string& target) {
  // O_EXCL: never opens an existing file, and never follows a link planted at the name.
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd.valid()) return IoError("out", "cannot write " + target + ": " + std::strerror(errno));
  // From here the file is ours: a failure removes it (nothing partial is left behind).
  auto fail = [&path, &target](const char* what) {
    Status st = IoError("out", std::string("cannot ") + what + " " + target + ": " + std::strerror(errno));
    ::unlink(path.c_str());
    return st;
  };
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = ::write(fd.get(), contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return fail("fsync");
  // A close that fails can lose the data: it is checked, not left to the destructor.
  if (::close(fd.Release()) != 0) return fail("close");
  return Status::Ok();
}

// Whether `path` may be replaced: absent, or a regular file. lstat, so that a symbolic link is
// seen as one (a rename would replace the link, not write where it points).
Result<bool> TargetExists(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    return IoError("out", "cannot stat " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgument("out", path + " exists and is " + KindOf(st.st_mode) +
                                      "; refusing to replace it (name a new file or a regular file)");
  }
  return true;
}

// Creates the missing folders above `path` ("receipts/v32" creates receipts/); an error names
// the folder and the target.
Status CreateParentFolders(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) return Status::Ok();
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec) return IoError("out", "cannot create the folder " + parent.string() + " for " + path + ": " + ec.message());
  return Status::Ok();
}

}  // namespace

// Long (~85 lines) on purpose: the renames and the rollback that puts the old set back share the
// backups' state; kept together so that every failure path is seen to restore it.
Status WriteFilesAtomically(const std::vector<std::pair<std::string, std::string>>& files) {
  const std::string suffix = "." + std::to_string(::getpid());
  std::vector<bool> existed;
  for (const auto& [path, contents] : files) {
    TESSERA_ASSIGN_OR_RETURN(bool exists, TargetExists(path));
    existed.push_back(exists);
  }
  std::vector<std::string> temps;
  auto cleanup = [&temps] {
    for (const std::string& t : temps) ::unlink(t.c_str());
  };
  for (const auto& [path, contents] : files) {
    std::string tmp = path + ".tmp" + suffix;
    Status st = CreateParentFolders(path);
    if (st.ok()) st = WriteAll(tmp, contents, path);
    if (!st.ok()) {
      cleanup();
      return st;
    }
    temps.push_back(tmp);
  }
  // Several files: keep each previous file under a second name until every rename has
  // succeeded, to put the old set back if one fails. A hard link keeps the target in place
  // meanwhile; where the file system has no hard links the target is moved aside instead.
  std::vector<std::string> backups(files.size());
  std::vector<bool> moved(files.size(), false);
  auto drop_backups = [&backups] {
    for (std::string& b : backups) {
      if (!b.empty()) ::unlink(b.c_str());
      b.clear();
    }
  };
  auto put_back_moved = [&](size_t from) {
    for (size_t j = from; j < files.size(); ++j) {
      if (moved[j] && ::rename(backups[j].c_str(), files[j].first.c_str()) == 0) backups[j].clear();
    }
  };
  if (files.size() > 1) {
    for (size_t i = 0; i < files.size(); ++i) {
      if (!existed[i]) continue;
      std::string backup = files[i].first + ".old" + suffix;
      if (::link(files[i].first.c_str(), backup.c_str()) != 0) {
        int err = errno;
        bool no_links = err == EPERM || err == ENOTSUP || err == EOPNOTSUPP || err == EMLINK || err == ENOSYS;
        if (!no_links || ::rename(files[i].first.c_str(), backup.c_str()) != 0) {
          put_back_moved(0);
          drop_backups();
          cleanup();
          return IoError("out", "cannot keep the previous " + files[i].first + " aside: " + std::strerror(err));
        }
        moved[i] = true;
      }
      backups[i] = backup;
    }
  }
  for (size_t i = 0; i < files.size(); ++i) {
    if (Rename(temps[i].c_str(), files[i].first.c_str()) == 0) continue;
    int err = errno;
    std::string lost;
    for (size_t j = 0; j < i; ++j) {
      if (backups[j].empty()) {
        ::unlink(files[j].first.c_str());
      } else if (::rename(backups[j].c_str(), files[j].first.c_str()) == 0) {
        backups[j].clear();
      } else {
        lost += "; the previous " + files[j].first + " is kept as " + backups[j];
        backups[j].clear();  // not removed: it is the only copy left
      }
    }
    put_back_moved(i);
    for (size_t j = i; j < files.size(); ++j) {
      if (moved[j] && !backups[j].empty()) {
        lost += "; the previous " + files[j].first + " is kept as " + backups[j];
        backups[j].clear();
      }
    }
    drop_backups();
    temps.erase(temps.begin(), temps.begin() + static_cast<std::ptrdiff_t>(i));
    cleanup();
    return IoError("out", "cannot rename into " + files[i].first + ": " + std::strerror(err) + lost);
  }
  drop_backups();
  return Status::Ok();
}

}  // namespace tessera

#include "tessera/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace tessera {

namespace {

Status WriteAll(const std::string& path, const std::string& contents) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return IoError("out", "cannot create " + path + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return IoError("out", "cannot write " + path + ": " + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    return IoError("out", "cannot fsync " + path + ": " + std::strerror(err));
  }
  if (::close(fd) != 0) return IoError("out", "cannot close " + path + ": " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace

Status WriteFilesAtomically(const std::vector<std::pair<std::string, std::string>>& files) {
  std::vector<std::string> temps;
  auto cleanup = [&temps] {
    for (const std::string& t : temps) ::unlink(t.c_str());
  };
  for (const auto& [path, contents] : files) {
    std::string tmp = path + ".tmp." + std::to_string(::getpid());
    Status st = WriteAll(tmp, contents);
    temps.push_back(tmp);
    if (!st.ok()) {
      cleanup();
      return st;
    }
  }
  for (size_t i = 0; i < files.size(); ++i) {
    if (::rename(temps[i].c_str(), files[i].first.c_str()) != 0) {
      int err = errno;
      for (size_t j = 0; j < i; ++j) ::unlink(files[j].first.c_str());
      cleanup();
      return IoError("out", "cannot rename into " + files[i].first + ": " + std::strerror(err));
    }
  }
  return Status::Ok();
}

}  // namespace tessera

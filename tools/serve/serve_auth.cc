// Secrets and the bearer token: the files they are read from, and the constant-time compare.
#include "tessera_tools/serve.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve_internal.h"

namespace tessera {

Result<std::vector<std::byte>> ReadSecretFile(const std::string& path, std::string_view field_name) {
  const std::string field(field_name);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return IoError(field, "cannot open " + path + ": " + std::strerror(errno));
  std::vector<std::byte> secret(4097);
  size_t n = 0;
  while (n < secret.size()) {
    const ssize_t r = ::read(fd, secret.data() + n, secret.size() - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += static_cast<size_t>(r);
  }
  ::close(fd);
  if (n > 4096) return OutOfRange(field, "larger than 4096 bytes");
  while (n > 0 && (secret[n - 1] == std::byte{'\n'} || secret[n - 1] == std::byte{'\r'})) --n;
  if (n < 16) return InvalidArgument(field, "the secret must be at least 16 bytes");
  secret.resize(n);
  return secret;
}

namespace serve_detail {

Result<std::vector<std::byte>> LoadBearerToken(const std::string& path, std::vector<std::string>* warnings) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::byte> token, ReadSecretFile(path, "http.token_file"));
  // Writable by group or others: anyone there could set the token (refused). Readable by them:
  // they could read it (a warning, as for the tier key: docs/adr/0031-serve-hardening.md).
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
      return InvalidArgument("http.token_file",
                             path + " has mode " + mode + ": writable by group or others (chmod 600)");
    }
    if ((st.st_mode & (S_IRGRP | S_IROTH)) != 0 && warnings != nullptr) {
      warnings->push_back(path + " has mode " + mode + ": the bearer token is readable by group or others (chmod 600)");
    }
  }
  return token;
}

}  // namespace serve_detail

bool ServeCore::Authorized(const char* authorization) const {
  if (http_token_.empty()) return true;
  if (authorization == nullptr) return false;
  std::string_view given(authorization);
  constexpr std::string_view kBearer = "Bearer ";
  if (!given.starts_with(kBearer)) return false;
  given.remove_prefix(kBearer.size());
  // Every byte of the token is compared whatever differs first: the time depends on the token's
  // length only, not on how much of it a guess got right.
  uint8_t diff = given.size() == http_token_.size() ? 0 : 1;
  for (size_t i = 0; i < http_token_.size(); ++i) {
    const uint8_t g = i < given.size() ? static_cast<uint8_t>(given[i]) : 0;
    diff |= static_cast<uint8_t>(g ^ static_cast<uint8_t>(http_token_[i]));
  }
  return diff == 0;
}

}  // namespace tessera

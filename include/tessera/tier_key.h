// The secret of a tier directory: `prefix.key`, 32 random bytes.
//
// Two things derive from it: the prefix keys of the managers that share the directory (so that a
// restarted process or another host computes the same keys), and the mac key that authenticates
// every record of the directory (RecordMac, label "tessera disk record v2"). Whoever can read it
// can forge records the tier accepts; it is created mode 0600 in a directory created 0700, and a
// key file that is a symbolic link or not a regular file is refused (never followed), one that
// group or others can read is reported as a warning (docs/SECURITY.md).
//
// Creation is race-free between processes: the key is written to a temporary, fsync'ed and
// link()ed into place; the loser of a race reads the winner's key.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "tessera/status.h"

namespace tessera {

inline constexpr char kTierKeyFile[] = "prefix.key";
inline constexpr size_t kTierKeyBytes = 32;

struct TierKey {
  std::vector<std::byte> secret;      // kTierKeyBytes
  std::vector<std::string> warnings;  // e.g. the key file is readable by others
};

// Reads `prefix.key` in the directory open as `dir_fd` (named `dir` in messages); creates it when
// absent and `create`. Errors (field "dir"): kNotFound when absent and !create; kDataLoss when it
// is not exactly 32 bytes; kIoError when it is a link or not a regular file, or on I/O failure.
Result<TierKey> LoadTierKeyAt(int dir_fd, const std::string& dir, bool create);

// Creates `dir` and any missing parent, each mode 0700; OK when it exists. kIoError on "dir".
Status CreateTierDirectory(const std::string& dir);

}  // namespace tessera

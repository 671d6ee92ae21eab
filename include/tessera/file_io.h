// Reading input files and writing output files without trusting what is at the path.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/status.h"

namespace tessera {

// What the CLI reads from one input file (a config.json, an allocation trace) at most.
constexpr uint64_t kMaxInputFileBytes = uint64_t{16} << 20;

// Reads the whole of `path`, which must name a regular file of at most `max_bytes`. A symbolic
// link is followed (Hugging Face hub snapshots link config.json into blobs/), but what it leads
// to must be a regular file: a FIFO, a device (/dev/zero, a tty), a socket or a directory is
// refused before anything is read, without blocking. Errors name `field`: kIoError when the file
// cannot be opened or read, kInvalidArgument when it is not a regular file, kOutOfRange when it
// is larger than `max_bytes`.
Result<std::string> ReadRegularFile(const std::string& path, std::string_view field,
                                    uint64_t max_bytes = kMaxInputFileBytes);

// Writes every (path, contents) pair, or none: each goes to a temporary file beside its
// target, is fsync'ed, and only when all are written are they renamed into place. A target
// that exists must be a regular file: a symbolic link, a device, a FIFO or a directory is never
// replaced (kInvalidArgument on "out"). When several files are written and a later rename fails,
// the targets already renamed get their previous contents back (kept under a hard link until
// every rename succeeded) or are removed if they did not exist, so the set on disk is the old
// one or the new one, never a mix. Missing folders above a target are created first (and stay
// if a later step fails). Other failures are kIoError on "out" naming the target, never a
// temporary name.
Status WriteFilesAtomically(const std::vector<std::pair<std::string, std::string>>& files);

}  // namespace tessera

// Test seam for file_io.cc: the rename WriteFilesAtomically uses, so that a test can make the
// second of two renames fail. Internal; not thread-safe (set it before, reset it after).
#pragma once

namespace tessera::detail {

using RenameFunction = int (*)(const char* from, const char* to);
// Installs `fn` (nullptr restores ::rename).
void SetRenameForTesting(RenameFunction fn);

}  // namespace tessera::detail

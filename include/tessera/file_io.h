// Writing output files so that a failure leaves nothing partial behind.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tessera/status.h"

namespace tessera {

// Writes every (path, contents) pair, or none: each goes to a temporary file beside its
// target, is fsync'ed, and only when all are written are they renamed into place. On failure
// the temporaries are removed (and targets renamed so far are removed) and the Status names
// "out" and the path.
Status WriteFilesAtomically(const std::vector<std::pair<std::string, std::string>>& files);

}  // namespace tessera

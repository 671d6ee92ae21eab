// The software version: `git describe --always --dirty` of the source tree when it was built, or
// "<project version>-unknown" when built without git (cmake/version.cmake).
#pragma once

#include <string_view>

namespace tessera {

std::string_view TesseraVersion();

}  // namespace tessera

#include "tessera_tools/version.h"

#include "tessera_version.h"

namespace tessera {

std::string_view TesseraVersion() { return TESSERA_VERSION_STRING; }

}  // namespace tessera

#include "tessera/hash128.h"

#include <cstdio>

namespace tessera {

std::string Hash128::Hex() const {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

}  // namespace tessera

#include "tessera/kv_events.h"

namespace tessera {

std::string_view KvEventKindName(KvEventKind k) {
  switch (k) {
    case KvEventKind::kBlockStored:
      return "BlockStored";
    case KvEventKind::kBlockRemoved:
      return "BlockRemoved";
    case KvEventKind::kAllBlocksCleared:
      return "AllBlocksCleared";
  }
  return "unknown";
}

std::string_view KvMediumName(KvMedium m) {
  switch (m) {
    case KvMedium::kGpu:
      return "GPU";
    case KvMedium::kCpu:
      return "CPU";
  }
  return "unknown";
}

}  // namespace tessera

#include <algorithm>

#include "tessera/block_source.h"

namespace tessera {

size_t FetchFromSource(BlockPool& pool, const BlockIndex& index, BlockSource& source, std::span<const uint32_t> prompt,
                       std::span<const Hash128> keys, size_t first, uint32_t domain, uint64_t salt,
                       PinnedBlocks* blocks, std::vector<std::vector<std::byte>>* states) {
  const uint32_t bt = pool.block_tokens();
  const size_t full_blocks = std::min<size_t>(prompt.size() / bt, keys.size());
  if (!pool.backed() || first >= full_blocks) return 0;
  std::vector<ChainLink> links;
  links.reserve(full_blocks - first);
  Hash128 parent = first == 0 ? index.root_key() : keys[first - 1];
  for (size_t i = first; i < full_blocks; ++i) {
    links.push_back({keys[i], parent, domain, salt, prompt.subspan(i * bt, bt), index.root_key()});
    parent = keys[i];
  }
  const size_t want = std::min<size_t>(source.Probe(links), pool.Available());
  if (want == 0) return 0;
  const size_t start = blocks->size();
  if (!blocks->Allocate(static_cast<uint32_t>(want)).ok()) return 0;
  const size_t got = source.Fetch(pool, std::span(links).first(want), blocks->ids().subspan(start), states);
  blocks->Truncate(start + got);  // the undelivered ones: filling -> free
  if (states != nullptr) states->resize(got);
  return got;
}

Result<uint64_t> CheckpointBlocks(const BlockPool& pool, const BlockIndex& index, BlockSource& source,
                                  const std::function<std::vector<std::byte>(BlockId)>& state_of) {
  if (!pool.backed()) return uint64_t{0};
  source.BeginCheckpoint();
  uint64_t n = 0;
  for (uint32_t i = 0; i < pool.capacity(); ++i) {
    const BlockId b{i};
    const BlockState s = pool.state(b);
    if ((s != BlockState::kSealed && s != BlockState::kCached) || !index.Indexed(b)) continue;
    SealedIdentity id = index.IdentityOf(b);
    std::vector<std::byte> state = state_of ? state_of(b) : std::vector<std::byte>();
    id.state = state;
    source.OnCheckpoint(pool, b, id);
    ++n;
  }
  TESSERA_RETURN_IF_ERROR(source.FinishCheckpoint());
  return n;
}

}  // namespace tessera

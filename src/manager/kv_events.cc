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

KvEventLog::View KvEventLog::operator[](size_t i) const {
  const Record& r = records_[i];
  View v{r.kind,       std::span<const Hash128>(keys_).subspan(r.keys_begin, r.keys_end - r.keys_begin),
         std::nullopt, std::span<const uint32_t>(tokens_).subspan(r.tokens_begin, r.tokens_end - r.tokens_begin),
         r.block_size, r.domain,
         r.medium};
  if (r.has_parent) v.parent_block_hash = r.parent;
  return v;
}

void KvEventLog::CopyTo(std::vector<KvEvent>* out) const {
  out->resize(records_.size());
  for (size_t i = 0; i < records_.size(); ++i) {
    const View v = (*this)[i];
    KvEvent& e = (*out)[i];
    e.kind = v.kind;
    e.block_hashes.assign(v.block_hashes.begin(), v.block_hashes.end());
    e.parent_block_hash = v.parent_block_hash;
    e.token_ids.assign(v.token_ids.begin(), v.token_ids.end());
    e.block_size = v.block_size;
    e.domain = v.domain;
    e.medium = v.medium;
  }
}

void KvEventLog::clear() {
  records_.clear();
  keys_.clear();
  tokens_.clear();
}

bool KvEventLog::AddStored(const std::optional<Hash128>& parent, const Hash128& key, std::span<const uint32_t> tokens,
                           uint32_t block_size, uint32_t domain, KvMedium medium, size_t max_records) {
  // The last record is the only one whose ranges end at the arenas' ends: it can grow.
  const bool merge = !records_.empty() && parent.has_value() && records_.back().kind == KvEventKind::kBlockStored &&
                     records_.back().domain == domain && keys_.back() == *parent;
  if (!merge) {
    if (records_.size() >= max_records) return false;
    records_.push_back(Record{parent.value_or(Hash128{}), keys_.size(), keys_.size(), tokens_.size(), tokens_.size(),
                              block_size, domain, KvEventKind::kBlockStored, medium, parent.has_value()});
  }
  keys_.push_back(key);
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  records_.back().keys_end = keys_.size();
  records_.back().tokens_end = tokens_.size();
  return true;
}

bool KvEventLog::AddRemoved(const Hash128& key, KvMedium medium, size_t max_records) {
  const bool merge = !records_.empty() && records_.back().kind == KvEventKind::kBlockRemoved;
  if (!merge) {
    if (records_.size() >= max_records) return false;
    records_.push_back(Record{Hash128{}, keys_.size(), keys_.size(), tokens_.size(), tokens_.size(), 0, 0,
                              KvEventKind::kBlockRemoved, medium, false});
  }
  keys_.push_back(key);
  records_.back().keys_end = keys_.size();
  return true;
}

bool KvEventLog::AddCleared(KvMedium medium, size_t max_records) {
  if (records_.size() >= max_records) return false;
  records_.push_back(Record{Hash128{}, keys_.size(), keys_.size(), tokens_.size(), tokens_.size(), 0, 0,
                            KvEventKind::kAllBlocksCleared, medium, false});
  return true;
}

}  // namespace tessera

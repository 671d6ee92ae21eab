#include "tessera/block_record.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "kv_stream.h"
#include "tessera/request_manager.h"
#include "test_support.h"

namespace tessera {
namespace {

using Stream = testing::KvStream;

constexpr uint32_t kBlock = 64;

std::unique_ptr<RequestManager> Manager(uint32_t capacity) {
  ManagerOptions o;
  o.capacity_blocks = capacity;
  o.hash_key_seed = 11;
  o.content_dedup = false;
  auto m = RequestManager::Create(testing::SeedFixture(), o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

// Admits and writes `s`, keeping the request: its blocks stay sealed in the pool.
RequestId Serve(RequestManager& m, const Stream& s) {
  Result<Admission> a = m.Admit(s.tokens(), {});
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  if (!a.ok()) return {};
  EXPECT_TRUE(m.AllocateSlots(a->id, s.tokens().size()).ok());
  EXPECT_TRUE(m.Append(a->id, std::span(s.tokens()), s.Writer()).ok());
  return a->id;
}

TEST(BlockRecord, EveryIdentityFieldIsChecked) {
  auto m = Manager(4);
  Stream a(1, kBlock);
  BlockId b = m->BlockTable(Serve(*m, a))[0];
  SealedIdentity id = m->index().IdentityOf(b);
  BlockRecordInfo info = BlockRecordInfoOf(m->pool());
  std::vector<std::byte> rec = EncodeBlockRecord(info, m->pool(), b, id);
  ChainLink link{id.key, id.parent_key, id.domain, id.salt, id.tokens, id.cache_identity};
  EXPECT_EQ(id.cache_identity, m->index().root_key());
  EXPECT_EQ(id.parent_key, m->index().root_key());  // the first block of a prompt
  Result<BlockRecordView> page = CheckBlockRecord(info, rec, link);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  EXPECT_EQ(page->pages.size(), m->pool().block_bytes());
  EXPECT_TRUE(page->state.empty());
  EXPECT_EQ(std::memcmp(page->pages.data(), m->pool().Bytes(m->pool().BlockHandleOf(b, 0)).data(), page->pages.size()),
            0);
  // A state travels after the pages and comes back whole; its length is checked.
  std::vector<std::byte> state(100, std::byte{7});
  SealedIdentity with_state = id;
  with_state.state = state;
  std::vector<std::byte> rec2 = EncodeBlockRecord(info, m->pool(), b, with_state);
  Result<BlockRecordView> page2 = CheckBlockRecord(info, rec2, link);
  ASSERT_TRUE(page2.ok()) << page2.status().ToString();
  EXPECT_TRUE(std::equal(page2->state.begin(), page2->state.end(), state.begin(), state.end()));
  EXPECT_FALSE(CheckBlockRecord(info, std::span(rec2).first(rec2.size() - 1), link).ok());

  auto fails = [&](ChainLink l, const char* why) {
    Result<BlockRecordView> r = CheckBlockRecord(info, rec, l);
    EXPECT_FALSE(r.ok()) << why;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().ToString();
    }
  };
  ChainLink l = link;
  l.key.lo ^= 1;
  fails(l, "prefix key");
  l = link;
  l.parent_key.hi ^= 1;
  fails(l, "parent key");
  l = link;
  l.domain = 3;
  fails(l, "domain");
  l = link;
  l.salt = 9;
  fails(l, "salt");
  l = link;
  l.cache_identity.lo ^= 1;
  fails(l, "cache identity");
  std::vector<uint32_t> other(id.tokens.begin(), id.tokens.end());
  other.back() ^= 1;
  l = link;
  l.tokens = other;
  fails(l, "tokens");
  BlockRecordInfo wrong = info;
  wrong.fingerprint ^= 1;
  EXPECT_FALSE(CheckBlockRecord(wrong, rec, link).ok());
  EXPECT_FALSE(CheckBlockRecord(info, std::span(rec).first(rec.size() - 1), link).ok());
  std::vector<std::byte> bad_magic = rec;
  bad_magic[0] = std::byte{0};
  EXPECT_FALSE(CheckBlockRecord(info, bad_magic, link).ok());
}

// The layout is fixed: a 104-byte header, the tokens padded to 64 bytes, the pages, the state.
TEST(BlockRecord, LengthIsHeaderTokensPagesAndState) {
  auto m = Manager(4);
  Stream a(5, kBlock);
  BlockId b = m->BlockTable(Serve(*m, a))[0];
  SealedIdentity id = m->index().IdentityOf(b);
  const BlockRecordInfo info = BlockRecordInfoOf(m->pool());
  EXPECT_EQ(info.block_tokens, kBlock);
  EXPECT_EQ(info.groups, m->pool().groups().size());
  EXPECT_EQ(info.page_bytes, m->pool().block_bytes());
  const size_t data = (104 + kBlock * 4 + 63) / 64 * 64;
  EXPECT_EQ(EncodeBlockRecord(info, m->pool(), b, id).size(), data + info.page_bytes);
  std::vector<std::byte> state(37, std::byte{1});
  id.state = state;
  EXPECT_EQ(EncodeBlockRecord(info, m->pool(), b, id).size(), data + info.page_bytes + 37);
}

// The fingerprint names the layout: another block size or record format is another layout.
TEST(BlockRecord, FingerprintDiffersAcrossLayouts) {
  auto make = [](uint32_t block_tokens, const std::string& format) {
    ManagerOptions o;
    o.capacity_blocks = 4;
    o.block_tokens = block_tokens;
    o.kv_format = format;
    auto m = RequestManager::Create(testing::Preset("deepseek-v3"), o);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? BlockRecordInfoOf((*m)->pool()).fingerprint : uint64_t{0};
  };
  const uint64_t base = make(64, "");
  EXPECT_EQ(make(64, ""), base);
  EXPECT_NE(make(128, ""), base);
  EXPECT_NE(make(64, "fp8_ds_mla"), base);
}

}  // namespace
}  // namespace tessera

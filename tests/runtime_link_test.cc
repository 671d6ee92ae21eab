// Links only tessera_runtime (the manager and the tiers), not the ledger or the CLI's libraries:
// an engine can adopt the runtime without the vLLM/SGLang sizing rules. This file must build and
// run with that library alone (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>
#include <string>

#include "tessera/geometry.h"
#include "tessera/request_manager.h"
#include "tessera/tier_adapters.h"
#include "tessera/tiered_store.h"

namespace tessera {
namespace {

TEST(Runtime, ManagerAndTiersWithoutTheLedger) {
  Result<Geometry> g = LoadPreset("deepseek-v4-flash");
  ASSERT_TRUE(g.ok());
  ManagerOptions o;
  o.capacity_blocks = 8;
  o.max_requests = 2;
  o.region_kind = RegionKind::kUnbacked;
  Result<std::unique_ptr<RequestManager>> m = RequestManager::Create(*g, o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::vector<uint32_t> prompt(600);
  std::iota(prompt.begin(), prompt.end(), 1u);
  Result<Admission> a = (*m)->Admit(prompt, RequestSpec{});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE((*m)->Append(a->id, prompt, nullptr).ok());
  EXPECT_EQ((*m)->Tokens(a->id), 600u);
  EXPECT_GT((*m)->bytes_held(), 0u);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(MakeHostTier(1 << 20));
  Result<std::unique_ptr<TieredStore>> store =
      TieredStore::Create((*m)->pool(), TieredStoreOptions{}, std::move(tiers));
  EXPECT_TRUE(store.ok()) << store.status().ToString();
}

}  // namespace
}  // namespace tessera

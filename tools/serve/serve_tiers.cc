// The tiers serve opens: a Redis or Redis Cluster checked to answer, the timed source.
#include "tessera_tools/serve.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve_internal.h"
#include "tessera/disk_tier.h"
#include "tessera/redis_cluster.h"
#include "tessera/redis_tier.h"
#include "tessera/tier_adapters.h"

namespace tessera {

Result<std::unique_ptr<Tier>> OpenReachableRedisTier(const std::string& url, const std::vector<std::string>& cluster,
                                                     const std::vector<std::byte>& secret,
                                                     const std::string& key_namespace, std::string_view model,
                                                     std::string_view format, uint32_t timeout_ms) {
#if !TESSERA_HAVE_REDIS
  (void)url, (void)cluster, (void)secret, (void)key_namespace, (void)model, (void)format, (void)timeout_ms;
  return FailedPrecondition(url.empty() ? "redis-cluster" : "redis",
                            "this build has no Redis tier (TESSERA_WITH_REDIS=OFF)");
#else
  // One namespace per server configuration (tenant domain 0): tenants are kept apart by the
  // keys, not the namespace — a block's prefix and content keys both hash its tenant domain
  // (tessera/block_index.h), so one tenant's keys never name another's blocks. The configured
  // prefix (tiers.redis_namespace, checked plain: no ':', '{', '}') takes the place of
  // RedisNamespace's leading "tessera".
  constexpr std::string_view kDefaultPrefix = "tessera";
  std::string ns = RedisNamespace(model, format, 0);
  if (!ns.starts_with(std::string(kDefaultPrefix) + ":")) return Internal("redis", "unexpected namespace " + ns);
  ns.replace(0, kDefaultPrefix.size(), key_namespace);
  if (!url.empty()) {
    TESSERA_ASSIGN_OR_RETURN(auto addr, ParseRedisAddress(url, "redis"));
    RedisTierOptions ro;
    ro.host = addr.first;
    ro.port = addr.second;
    ro.secret = secret;
    ro.timeout_ms = timeout_ms;
    ro.key_namespace = ns;
    {
      TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<RedisTier> probe, RedisTier::Open(ro));
      const Hash128 nothing{};
      (void)probe->GetBatch(std::span(&nothing, 1));
      if (!probe->stats().connected) return IoError("redis", "cannot reach " + url);
    }
    return MakeRedisTier(ro);
  }
  RedisClusterOptions ro;
  ro.seeds = cluster;
  ro.secret = secret;
  ro.timeout_ms = timeout_ms;
  ro.key_namespace = ns;
  {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<RedisClusterTier> probe, RedisClusterTier::Open(ro));
    if (probe->stats().slots_covered == 0) {
      std::string seeds;
      for (const std::string& seed : cluster) seeds += (seeds.empty() ? "" : ",") + seed;
      return IoError("redis-cluster", "no node of " + seeds + " answered");
    }
  }
  return MakeRedisClusterTier(ro);
#endif  // TESSERA_HAVE_REDIS
}

namespace serve_detail {

Result<std::vector<std::unique_ptr<Tier>>> OpenTiers(const ServeConfig& config, const std::vector<std::byte>& secret,
                                                     std::string_view model, std::string_view format) {
  std::vector<std::unique_ptr<Tier>> tiers;
  if (config.host_tier_bytes > 0) tiers.push_back(MakeHostTier(config.host_tier_bytes));
  if (!config.disk_dir.empty()) {
    DiskTierOptions d;
    d.dir = config.disk_dir;
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Tier> t, MakeDiskTier(d, config.disk_bytes));
    tiers.push_back(std::move(t));
  }
  if (!config.redis.empty() || !config.redis_cluster.empty()) {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Tier> t,
                             OpenReachableRedisTier(config.redis, config.redis_cluster, secret, config.redis_namespace,
                                                    model, format, config.redis_timeout_ms));
    tiers.push_back(std::move(t));
  }
  return tiers;
}

}  // namespace serve_detail

}  // namespace tessera

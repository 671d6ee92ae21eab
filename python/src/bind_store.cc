// tessera.TieredStore: host / disk / Redis / Redis Cluster tiers under a request manager (the
// manager's block source; docs/adr/0013-tiered-store.md).
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "manager.h"
#include "tessera/disk_tier.h"
#include "tessera/tier_adapters.h"
#include "tessera/tiered_store.h"

namespace tessera::py_bind {

namespace {

// A handle on the store attached to a manager (or detached from it since).
struct PyStore {
  std::shared_ptr<PyManager> pm;
  std::shared_ptr<TieredStore> store;
};

std::vector<std::byte> SecretBytes(const py::object& v, const char* arg) {
  if (!PyBytes_Check(v.ptr()) && !PyByteArray_Check(v.ptr())) ThrowType(arg, "must be bytes");
  const std::string s = py::bytes(v).cast<std::string>();
  if (s.size() < 16) ThrowValue(arg, "the fleet secret needs at least 16 bytes (got " + std::to_string(s.size()) + ")");
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

// "redis://HOST:PORT" or "redis://HOST" (port 6379). HOST: a name or IPv4 address.
void ParseRedisUrl(const std::string& url, RedisTierOptions* o) {
  const std::string scheme = "redis://";
  if (url.size() > 512) ThrowValue("redis_url", "longer than 512 characters");
  if (url.compare(0, scheme.size(), scheme) != 0) {
    ThrowValue("redis_url", "must start with redis:// (got \"" + url + "\")");
  }
  std::string rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  std::string host = rest;
  int port = 6379;
  if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
    host = rest.substr(0, colon);
    const std::string p = rest.substr(colon + 1);
    if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) {
      ThrowValue("redis_url", "port must be a number 1..65535 (got \"" + p + "\")");
    }
    port = std::stoi(p);
    if (port < 1 || port > 65535) ThrowValue("redis_url", "port must be 1..65535 (got " + p + ")");
  }
  if (host.empty() || host.size() > 253 ||
      host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") != std::string::npos) {
    ThrowValue("redis_url", "host must be a name or an IPv4 address (got \"" + host + "\")");
  }
  o->host = host;
  o->port = port;
}

// A Redis tier's refusal of one of its options, named by the Python argument that carried it.
Status AsArgument(const Status& s) {
  static const std::pair<std::string_view, const char*> kArgs[] = {{"seeds", "redis_cluster"},
                                                                   {"host", "redis_url"},
                                                                   {"port", "redis_url"},
                                                                   {"timeout_ms", "redis_timeout_ms"},
                                                                   {"key_namespace", "redis_namespace"},
                                                                   {"secret", "redis_secret"}};
  for (const auto& [field, arg] : kArgs) {
    if (s.field() == field) return Status(s.code(), arg, s.message());
  }
  return s;
}

std::shared_ptr<PyStore> Attach(const std::shared_ptr<PyManager>& pm, const py::object& host_bytes,
                                const py::object& disk_dir, const py::object& disk_bytes, const py::object& disk_fsync,
                                const py::object& redis_url, const py::object& redis_cluster,
                                const py::object& redis_secret, const py::object& redis_namespace,
                                const py::object& redis_tenant_domain, const py::object& redis_timeout_ms,
                                const py::object& write_policy, const py::object& batch_records,
                                const py::object& asynchronous) {
  if (!pm || !pm->m) ThrowType("manager", "must be a tessera.RequestManager");
  const uint64_t host = ToU64(host_bytes, "host_bytes");
  TieredStoreOptions so;
  so.write = TakeAs(ParseWritePolicy(ToStr(write_policy, "write_policy")), "write_policy");
  so.batch_records = ToU32(batch_records, "batch_records");
  so.asynchronous = ToBool(asynchronous, "asynchronous");
  std::optional<DiskTierOptions> disk;
  uint64_t disk_cap = ToU64(disk_bytes, "disk_bytes");
  if (!disk_dir.is_none()) {
    disk.emplace();
    disk->dir = ToStr(disk_dir, "disk_dir");
    if (disk->dir.empty()) ThrowValue("disk_dir", "must not be empty");
    disk->fsync = TakeAs(ParseFsyncPolicy(ToStr(disk_fsync, "disk_fsync")), "disk_fsync");
  }
  if (!redis_url.is_none() && !redis_cluster.is_none()) {
    ThrowValue("redis_url", "give redis_url or redis_cluster, not both");
  }
  const bool redis = !redis_url.is_none() || !redis_cluster.is_none();
  std::vector<std::byte> secret;
  std::string ns;
  uint32_t timeout = ToU32(redis_timeout_ms, "redis_timeout_ms");
  const uint32_t tenant_domain = ToU32(redis_tenant_domain, "redis_tenant_domain");
  if (tenant_domain != 0 && !redis_namespace.is_none()) {
    ThrowValue("redis_tenant_domain", "give redis_namespace (used whole) or redis_tenant_domain, not both");
  }
#ifndef TESSERA_HAVE_REDIS
  if (redis) ThrowValue(!redis_url.is_none() ? "redis_url" : "redis_cluster", "this build has no Redis tier");
#endif
  if (redis) {
    if (redis_secret.is_none())
      ThrowValue("redis_secret", "missing: a Redis tier needs the fleet's secret (>= 16 bytes)");
    secret = SecretBytes(redis_secret, "redis_secret");
#ifdef TESSERA_HAVE_REDIS
    // The namespace is the model, the record format and the tenant domain (RedisNamespace:
    // injective), so two tenants of one server never read each other's blocks; a namespace given
    // by the caller is used whole.
    ns = redis_namespace.is_none() ? RedisNamespace(pm->geometry.name, pm->kv_format, tenant_domain)
                                   : ToStr(redis_namespace, "redis_namespace");
#endif
  }
  std::optional<RedisTierOptions> ro;
  std::optional<RedisClusterOptions> co;
  if (!redis_url.is_none()) {
    ro.emplace();
    ParseRedisUrl(ToStr(redis_url, "redis_url"), &*ro);
    ro->secret = secret;
    ro->key_namespace = ns;
    ro->timeout_ms = timeout;
  } else if (!redis_cluster.is_none()) {
    co.emplace();
    const std::string seeds = ToStr(redis_cluster, "redis_cluster");
    size_t start = 0;
    while (start <= seeds.size()) {
      const size_t comma = seeds.find(',', start);
      const std::string s = seeds.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (s.empty()) ThrowValue("redis_cluster", "an empty seed in \"" + seeds + "\" (give host:port,...)");
      co->seeds.push_back(s);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    co->secret = secret;
    co->key_namespace = ns;
    co->timeout_ms = timeout;
  }
  if (host == 0 && !disk && !redis)
    ThrowValue("tiers", "give at least one of host_bytes, disk_dir, redis_url, redis_cluster");

  ManagerLock lk(*pm);
  std::shared_ptr<TieredStore> store;
  Status st;
  {
    py::gil_scoped_release nogil;
    std::vector<std::unique_ptr<Tier>> tiers;
    if (host > 0) tiers.push_back(MakeHostTier(host));
    // Keeps a tier that opened; else the first error (a Redis error named as its Python argument).
    auto add = [&](Result<std::unique_ptr<Tier>> t, bool as_argument) {
      if (t.ok()) {
        tiers.push_back(std::move(*t));
      } else {
        st = as_argument ? AsArgument(t.status()) : t.status();
      }
    };
    if (disk) add(MakeDiskTier(*disk, disk_cap), false);
    if (st.ok() && ro) add(MakeRedisTier(*ro), true);
    if (st.ok() && co) add(MakeRedisClusterTier(*co), true);
    if (st.ok()) {
      Result<std::unique_ptr<TieredStore>> s = TieredStore::Create(pm->m->pool(), so, std::move(tiers));
      if (s.ok())
        store = std::shared_ptr<TieredStore>(std::move(*s));
      else
        st = s.status();
    }
  }
  Check(st);
  pm->m->SetBlockSource(store.get());
  std::shared_ptr<TieredStore> old = std::move(pm->store);
  pm->store = store;
  {
    py::gil_scoped_release nogil;
    old.reset();  // the replaced store flushes as it goes
  }
  return std::make_shared<PyStore>(PyStore{pm, store});
}

py::dict StatsDict(const TieredStoreStats& s) {
  py::dict d;
  d["demoted"] = s.demoted;
  d["written_through"] = s.written_through;
  d["tier_hits"] = s.tier_hits;
  d["queued_hits"] = s.queued_hits;
  d["verify_failures"] = s.verify_failures;
  d["write_errors"] = s.write_errors;
  d["through_refused"] = s.through_refused;
  d["dropped"] = s.dropped;
  d["batches"] = s.batches;
  d["pending"] = s.pending;
  d["hits_per_tier"] = s.hits_per_tier;
  d["last_error"] = s.last_error;
  return d;
}

}  // namespace

void BindStore(py::module_& m) {
#ifdef TESSERA_HAVE_REDIS
  m.attr("HAVE_REDIS") = true;
#else
  m.attr("HAVE_REDIS") = false;
#endif
  py::class_<PyStore, std::shared_ptr<PyStore>>(m, "TieredStore")
      .def(py::init(&Attach), py::arg("manager"), py::kw_only(), py::arg("host_bytes") = 0,
           py::arg("disk_dir") = py::none(), py::arg("disk_bytes") = 0, py::arg("disk_fsync") = "batch",
           py::arg("redis_url") = py::none(), py::arg("redis_cluster") = py::none(),
           py::arg("redis_secret") = py::none(), py::arg("redis_namespace") = py::none(),
           py::arg("redis_tenant_domain") = 0, py::arg("redis_timeout_ms") = 200,
           py::arg("write_policy") = "write-back", py::arg("batch_records") = 16, py::arg("asynchronous") = true,
           "Tiers under `manager` (attached as its block source, replacing any earlier store): host memory of "
           "host_bytes, a disk directory, a Redis server (redis://HOST:PORT) or a Redis Cluster (host:port,...); "
           "Redis keys live in the namespace of the model, the KV format and redis_tenant_domain (or redis_namespace, "
           "whole).")
      .def("flush",
           [](PyStore& s) {
             ManagerLock lk(*s.pm);
             Status st;
             {
               py::gil_scoped_release nogil;
               st = s.store->Flush();
             }
             Check(st);
           })
      .def("stats",
           [](PyStore& s) {
             ManagerLock lk(*s.pm);
             return StatsDict(s.store->stats());
           })
      .def_property_readonly("tiers",
                             [](PyStore& s) {
                               std::vector<std::string> names;
                               for (size_t i = 0; i < s.store->tiers(); ++i) names.emplace_back(s.store->tier_name(i));
                               return names;
                             })
      .def(
          "tier_counters",
          [](PyStore& s, const py::object& index) {
            const uint32_t i = ToU32(index, "index");
            if (i >= s.store->tiers())
              ThrowValue("index", std::to_string(i) + " is not below " + std::to_string(s.store->tiers()));
            ManagerLock lk(*s.pm);
            const TierCounters c = s.store->tier_counters(i);
            py::dict d;
            d["records"] = c.records;
            d["bytes"] = c.bytes;
            d["capacity_bytes"] = c.capacity_bytes;
            d["evictions"] = c.evictions;
            d["quarantined"] = c.quarantined;
            return d;
          },
          py::arg("index"))
      .def_property_readonly("attached",
                             [](PyStore& s) {
                               ManagerLock lk(*s.pm);
                               return s.pm->store == s.store;
                             })
      .def("detach",
           [](PyStore& s) {
             ManagerLock lk(*s.pm);
             if (s.pm->store != s.store) return;
             s.pm->m->SetBlockSource(nullptr);
             s.pm->store.reset();
           })
      .def("metrics", [](PyStore& s) {
        ManagerLock lk(*s.pm);
        return MetricsDict(s.store->CollectMetrics());
      });
}

}  // namespace tessera::py_bind

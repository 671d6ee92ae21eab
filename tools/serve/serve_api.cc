// The HTTP API's calls on the core: admit, step, free, reset, layout and block reads.
#include "tessera_tools/serve.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "serve_internal.h"
#include "tessera/units.h"

namespace tessera {

using namespace serve_detail;  // NOLINT(google-build-using-namespace): the files of one server

std::pair<int, std::string> ServeCore::Handle(std::string_view path, std::string_view body) {
  std::pair<int, std::string> r;
  if (path == "/v1/admit") {
    r = HandleAdmit(body);
  } else if (path == "/v1/step") {
    r = HandleStep(body);
  } else if (path == "/v1/free") {
    r = HandleFree(body);
  } else if (path == "/v1/reset") {
    r = HandleReset();
  } else {
    r = {404, Error(InvalidArgument("path", "no such endpoint")).dump()};
  }
  return r;
}

// `lhs` names the variable declared: it cannot be parenthesised.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define TESSERA_HTTP_ASSIGN(lhs, expr)                                       \
  auto lhs##_result = (expr);                                                \
  if (!lhs##_result.ok()) return {400, Error(lhs##_result.status()).dump()}; \
  auto lhs = std::move(*lhs##_result)
// NOLINTEND(bugprone-macro-parentheses)

namespace {

struct AdmitCall {
  std::vector<uint32_t> tokens;
  RequestSpec spec;
};

Result<AdmitCall> ParseAdmitCall(const nlohmann::json& j) {
  TESSERA_RETURN_IF_ERROR(OnlyKeys(j, {"tokens", "tenant", "cache_salt", "priority"}));
  AdmitCall c;
  TESSERA_ASSIGN_OR_RETURN(c.tokens, U32Array(j, "tokens"));
  if (c.tokens.empty()) return InvalidArgument("tokens", "empty prompt");
  TESSERA_ASSIGN_OR_RETURN(uint64_t tenant, UintField(j, "tenant", UINT32_MAX, 0));
  TESSERA_ASSIGN_OR_RETURN(uint64_t salt, UintField(j, "cache_salt", UINT64_MAX, 0));
  TESSERA_ASSIGN_OR_RETURN(uint64_t priority,
                           UintField(j, "priority", kMaxRetentionPriority, kDefaultRetentionPriority));
  c.spec.tenant = static_cast<uint32_t>(tenant);
  c.spec.cache_salt = salt;
  c.spec.priority = static_cast<uint8_t>(priority);
  return c;
}

struct StepCall {
  std::vector<RequestId> requests;
  std::vector<uint32_t> counts;
  std::vector<uint32_t> tokens;
  uint32_t tenant = 0;
};

// "tenant": the caller's tenant (default 0): a call acts only on the requests it admitted.
Result<uint32_t> TenantField(const nlohmann::json& j) {
  TESSERA_ASSIGN_OR_RETURN(uint64_t tenant, UintField(j, "tenant", UINT32_MAX, 0));
  return static_cast<uint32_t>(tenant);
}

Result<StepCall> ParseStepCall(const nlohmann::json& j) {
  TESSERA_RETURN_IF_ERROR(OnlyKeys(j, {"requests", "counts", "tokens", "tenant"}));
  StepCall c;
  TESSERA_ASSIGN_OR_RETURN(std::vector<uint64_t> ids, U64Array(j, "requests"));
  TESSERA_ASSIGN_OR_RETURN(c.counts, U32Array(j, "counts"));
  TESSERA_ASSIGN_OR_RETURN(c.tokens, U32Array(j, "tokens"));
  TESSERA_ASSIGN_OR_RETURN(c.tenant, TenantField(j));
  c.requests.reserve(ids.size());
  std::set<uint32_t> unique;  // table slots: one request per slot is live
  for (uint64_t id : ids) {
    const RequestId r = RequestOfHandle(id);
    if (!unique.insert(r.value).second) return InvalidArgument("requests", "a request given twice");
    c.requests.push_back(r);
  }
  TESSERA_RETURN_IF_ERROR(CheckStepShape(c.requests, c.counts, c.tokens));
  return c;
}

// The records of `tokens` tokens, `record_bytes` each: exactly that many bytes.
Status CheckRecords(std::string_view records, uint64_t tokens, uint64_t record_bytes) {
  const Checked want = Checked(tokens) * record_bytes;
  if (want.overflowed() || want.value() != records.size()) {
    return InvalidArgument("records", std::to_string(records.size()) + " bytes given, " + std::to_string(tokens) +
                                          " tokens x " + std::to_string(record_bytes) + " record bytes expected");
  }
  return Status::Ok();
}

std::pair<int, std::string> BadRequest(const Status& st) { return {400, Error(st).dump()}; }

}  // namespace

std::pair<int, std::string> ServeCore::AdmitReply(const Admission& a) {
  nlohmann::json out = {{"request", RequestHandle(a.id)},        {"cached_tokens", a.cached_tokens},
                        {"cached_blocks", a.cached_blocks},      {"tier_blocks", a.tier_blocks},
                        {"state_restored", a.state_restored},    {"recompute_from", a.recompute_from},
                        {"recompute_tokens", a.recompute_tokens}};
  MutexLock lock(mu_);
  nlohmann::json table = nlohmann::json::array();
  for (BlockId b : manager_->BlockTable(a.id)) table.push_back(b.value);
  out["block_table"] = std::move(table);
  return {200, out.dump()};
}

std::pair<int, std::string> ServeCore::HandleAdmit(std::string_view body) {
  if (IsFramed(body)) return HandleAdmitFramed(body);
  TESSERA_HTTP_ASSIGN(j, ParseJson(body, "body"));
  TESSERA_HTTP_ASSIGN(call, ParseAdmitCall(j));
  Result<Admission> a = Admit(call.tokens, call.spec);
  if (!a.ok()) return {HttpStatusOf(a.status().code()), Error(a.status()).dump()};
  return AdmitReply(*a);
}

std::pair<int, std::string> ServeCore::HandleAdmitFramed(std::string_view body) {
  if (!config_.kv_engine) return BadRequest(InvalidArgument("body", "framed KV records need kv_source: engine"));
  TESSERA_HTTP_ASSIGN(frame, ParseFrame(body));
  TESSERA_HTTP_ASSIGN(header, ParseHeader(frame.header));
  TESSERA_HTTP_ASSIGN(call, ParseAdmitCall(header));
  if (Status st = CheckRecords(frame.records, call.tokens.size(), record_bytes_); !st.ok()) return BadRequest(st);
  Result<Admission> a = [&] {
    MutexLock lock(mu_);
    return AdmitLocked(call.tokens, call.spec, reinterpret_cast<const std::byte*>(frame.records.data()));
  }();
  if (!a.ok()) return {HttpStatusOf(a.status().code()), Error(a.status()).dump()};
  return AdmitReply(*a);
}

std::pair<int, std::string> ServeCore::StepReply(std::span<const RequestId> requests, std::span<const StatusCode> codes,
                                                 uint32_t tenant) {
  nlohmann::json out = {{"codes", nlohmann::json::array()}, {"block_tables", nlohmann::json::array()}};
  MutexLock lock(mu_);
  for (size_t i = 0; i < requests.size(); ++i) {
    out["codes"].push_back(std::string(StatusCodeName(codes[i])));
    nlohmann::json table = nlohmann::json::array();
    if (manager_->TenantOf(requests[i]) == tenant) {  // another tenant's table is not shown
      for (BlockId b : manager_->BlockTable(requests[i])) table.push_back(b.value);
    }
    out["block_tables"].push_back(std::move(table));
  }
  return {200, out.dump()};
}

std::pair<int, std::string> ServeCore::HandleStep(std::string_view body) {
  if (IsFramed(body)) return HandleStepFramed(body);
  TESSERA_HTTP_ASSIGN(j, ParseJson(body, "body"));
  TESSERA_HTTP_ASSIGN(call, ParseStepCall(j));
  std::vector<StatusCode> codes;
  Status st = StepAs(call.tenant, call.requests, call.counts, call.tokens, &codes);
  if (!st.ok()) return BadRequest(st);
  return StepReply(call.requests, codes, call.tenant);
}

std::pair<int, std::string> ServeCore::HandleStepFramed(std::string_view body) {
  if (!config_.kv_engine) return BadRequest(InvalidArgument("body", "framed KV records need kv_source: engine"));
  TESSERA_HTTP_ASSIGN(frame, ParseFrame(body));
  TESSERA_HTTP_ASSIGN(header, ParseHeader(frame.header));
  TESSERA_HTTP_ASSIGN(call, ParseStepCall(header));
  if (Status st = CheckRecords(frame.records, call.tokens.size(), record_bytes_); !st.ok()) return BadRequest(st);
  std::vector<StatusCode> codes;
  {
    MutexLock lock(mu_);
    StepLocked(call.requests, call.counts, call.tokens, reinterpret_cast<const std::byte*>(frame.records.data()),
               call.tenant, &codes);
  }
  return StepReply(call.requests, codes, call.tenant);
}

namespace {

// The query of a block read: count=N (1..2^20) and tenant=T (u32), each at most once.
Status ParseBlockQuery(std::string_view query, uint64_t* count, uint32_t* tenant) {
  bool seen_count = false;
  bool seen_tenant = false;
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (item.starts_with("count=") && !seen_count) {
      seen_count = true;
      Result<uint64_t> c = ParseUnsigned(item.substr(6), "count");
      if (!c.ok() || *c == 0 || *c > (1u << 20)) return InvalidArgument("count", "must be 1..1048576");
      *count = *c;
    } else if (item.starts_with("tenant=") && !seen_tenant) {
      seen_tenant = true;
      Result<uint64_t> t = ParseUnsigned(item.substr(7), "tenant");
      if (!t.ok() || *t > UINT32_MAX) return InvalidArgument("tenant", "must be a u32");
      *tenant = static_cast<uint32_t>(*t);
    } else {
      return InvalidArgument("query", "only count=N and tenant=T are known, each once");
    }
  }
  return Status::Ok();
}

}  // namespace

// GET /v1/layout: the token record layout of the frame.
std::pair<int, std::string> ServeCore::LayoutReply() const {
  nlohmann::json groups = nlohmann::json::array();
  const std::vector<PoolGroup>& pg = manager_->pool().groups();
  for (size_t g = 0; g < pg.size(); ++g) {
    nlohmann::json planes = nlohmann::json::array();
    for (uint32_t p = 0; p < pg[g].format.plane_count(); ++p) planes.push_back(pg[g].format.plane_bytes(p));
    groups.push_back({{"name", pg[g].name},
                      {"format", pg[g].format.name},
                      {"layers", pg[g].layers},
                      {"compress_ratio", pg[g].page.compress_ratio},
                      {"record_bytes", pg[g].format.record_bytes()},
                      {"plane_bytes", std::move(planes)},
                      {"in_frame", pg[g].page.compress_ratio == 1}});
  }
  const nlohmann::json out = {{"kv_source", config_.kv_engine ? "engine" : "synthetic"},
                              {"block_tokens", manager_->block_tokens()},
                              {"record_bytes", record_bytes_},
                              {"groups", std::move(groups)}};
  return {200, out.dump()};
}

std::pair<int, std::string> ServeCore::HandleGet(std::string_view path, bool* binary) {
  *binary = false;
  if (path == "/v1/layout") return LayoutReply();
  // /v1/requests/{id}/blocks/{i}
  constexpr std::string_view kPrefix = "/v1/requests/";
  if (!path.starts_with(kPrefix)) return {404, Error(InvalidArgument("path", "no such endpoint")).dump()};
  std::string_view rest = path.substr(kPrefix.size());
  const size_t slash = rest.find("/blocks/");
  if (slash == std::string_view::npos) return {404, Error(InvalidArgument("path", "no such endpoint")).dump()};
  Result<uint64_t> id = ParseUnsigned(rest.substr(0, slash), "request");
  if (!id.ok()) return BadRequest(InvalidArgument("request", "must be a request id"));
  std::string_view block_text = rest.substr(slash + 8);
  uint64_t count = 1;   // ?count=N: N consecutive block slots in one reply
  uint32_t tenant = 0;  // ?tenant=T: the caller's tenant (a request of another is not read)
  if (const size_t q = block_text.find('?'); q != std::string_view::npos) {
    std::string_view query = block_text.substr(q + 1);
    block_text = block_text.substr(0, q);
    if (Status st = ParseBlockQuery(query, &count, &tenant); !st.ok()) return BadRequest(st);
  }
  Result<uint64_t> slot = ParseUnsigned(block_text, "block");
  if (!slot.ok() || *slot > UINT32_MAX) return BadRequest(InvalidArgument("block", "must be a block index"));
  MutexLock lock(mu_);
  if (!manager_->pool().backed()) {
    return {409, Error(FailedPrecondition("pool", "an unbacked pool holds no bytes")).dump()};
  }
  if (record_bytes_ == 0) {
    return {409, Error(FailedPrecondition("model", "the model has no per-token records")).dump()};
  }
  const RequestId r = RequestOfHandle(*id);
  if (manager_->TenantOf(r) != tenant || prefix_hash_.find(r.value) == prefix_hash_.end()) {
    return BadRequest(InvalidArgument("request", "no live request " + std::to_string(*id)));
  }
  const uint64_t bt = manager_->block_tokens();
  const uint64_t tokens = manager_->Tokens(r);
  const uint64_t written_slots = std::min<uint64_t>(manager_->BlockTable(r).size(), (tokens + bt - 1) / bt);
  if (*slot >= written_slots) {
    return BadRequest(InvalidArgument("block", "the request holds no written token in block " + std::to_string(*slot)));
  }
  if (count > written_slots - *slot) {
    return BadRequest(InvalidArgument("count", "blocks " + std::to_string(*slot) + ".." +
                                                   std::to_string(*slot + count - 1) + " go past the " +
                                                   std::to_string(written_slots) + " written"));
  }
  const uint64_t first = *slot * bt;
  const uint64_t n = std::min(count * bt, tokens - first);
  // One block is always served (its size is the model's); a batch stays within the body bound.
  if (count > 1 && n * record_bytes_ > config_.http_max_body_bytes) {
    return BadRequest(OutOfRange(
        "count", "the reply would be " + std::to_string(n * record_bytes_) + " bytes, over http.max_body_bytes"));
  }
  std::string out(n * record_bytes_, '\0');
  const std::vector<PoolGroup>& pg = manager_->pool().groups();
  for (uint64_t p = first; p < first + n; ++p) {
    for (uint32_t g = 0; g < pg.size(); ++g) {
      if (pg[g].page.compress_ratio != 1) continue;
      for (uint32_t l = 0; l < pg[g].layers; ++l) {
        Result<ConstRecordView> v = manager_->Record(r, g, l, p);
        if (!v.ok()) return {500, Error(v.status()).dump()};
        char* dst = out.data() + (p - first) * record_bytes_ + static_cast<uint64_t>(record_offset_[g][l]);
        for (uint32_t k = 0; k < v->plane_count; ++k) {
          std::memcpy(dst, v->planes[k].data(), v->planes[k].size());
          dst += v->planes[k].size();
        }
      }
    }
  }
  *binary = true;
  kv_bytes_read_.fetch_add(out.size(), std::memory_order_relaxed);
  return {200, std::move(out)};
}

std::pair<int, std::string> ServeCore::HandleFree(std::string_view body) {
  TESSERA_HTTP_ASSIGN(j, ParseJson(body, "body"));
  if (Status st = OnlyKeys(j, {"request", "tenant"}); !st.ok()) return {400, Error(st).dump()};
  TESSERA_HTTP_ASSIGN(id, UintField(j, "request", UINT64_MAX, std::nullopt));
  TESSERA_HTTP_ASSIGN(tenant, TenantField(j));
  Status st = FreeAs(tenant, RequestOfHandle(id));
  if (!st.ok()) return {HttpStatusOf(st.code()), Error(st).dump()};
  return {200, "{}"};
}

std::pair<int, std::string> ServeCore::HandleReset() {
  MutexLock lock(mu_);
  Status st = manager_->ResetPrefixCache();
  PublishLocked();
  if (!st.ok()) return {HttpStatusOf(st.code()), Error(st).dump()};
  return {200, "{}"};
}

}  // namespace tessera

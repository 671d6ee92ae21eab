// What the files of `tessera serve` share (private to tools/serve, not a library header): the
// clock of the latency histograms, the API's body parsers (serve_frame.cc), the bearer token
// (serve_auth.cc), the tiers (serve_tiers.cc). The public interface is tessera/serve.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/status.h"
#include "tessera/tiered_store.h"
#include "tessera_tools/serve.h"

namespace tessera::serve_detail {

using Clock = std::chrono::steady_clock;

inline uint64_t NanosSince(Clock::time_point t0) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

// ---- The framed body and the API's JSON (serve_frame.cc) ----------------------------------

// A framed body: "TKV1", u32 little-endian header length, the JSON header, the records.
constexpr std::string_view kFrameMagic = "TKV1";
constexpr uint32_t kMaxFrameHeader = 65536;

inline bool IsFramed(std::string_view body) { return body.starts_with(kFrameMagic); }

struct Frame {
  std::string_view header;  // JSON text
  std::string_view records;
};

// Splits a framed body; every length is checked (errors name "body", "magic", "header_length").
Result<Frame> ParseFrame(std::string_view body);

// JSON text of the API: one value, UTF-8 without a byte order mark, no NUL byte anywhere
// (nlohmann's parser skips a BOM; a NUL is no JSON). Errors name `field`.
Result<nlohmann::json> ParseJson(std::string_view text, const char* field);
inline Result<nlohmann::json> ParseHeader(std::string_view text) { return ParseJson(text, "header"); }

// The API's error body: {"error": text, "field": field}.
nlohmann::json Error(const Status& st);
// 400 for bad input, 503 for no room, 409 for a refused state change, else 500.
int HttpStatusOf(StatusCode code);

// The JSON helpers: strict types, named fields. A missing field is `def`, or an error.
Result<uint64_t> UintField(const nlohmann::json& j, const char* name, uint64_t max, std::optional<uint64_t> def);
Result<std::vector<uint64_t>> U64Array(const nlohmann::json& j, const char* name);
Result<std::vector<uint32_t>> U32Array(const nlohmann::json& j, const char* name);
// `j` is an object with no key outside `keys` (an unknown key is named by at most 64 bytes).
Status OnlyKeys(const nlohmann::json& j, std::initializer_list<std::string_view> keys);

// ---- The core (serve_core.cc) --------------------------------------------------------------

// One count per request, and the counts add up to the tokens (errors name "counts", "tokens").
Status CheckStepShape(std::span<const RequestId> requests, std::span<const uint32_t> counts,
                      std::span<const uint32_t> tokens);

// ---- Authentication (serve_auth.cc) --------------------------------------------------------

// The bearer token of http.token_file: ReadSecretFile's rules, and the file's mode checked —
// writable by group or others is refused, readable by them a warning appended to `warnings`.
Result<std::vector<std::byte>> LoadBearerToken(const std::string& path, std::vector<std::string>* warnings);

// ---- Tiers (serve_tiers.cc) ------------------------------------------------------------------

// The configured tiers, fastest first (host, disk, Redis). `secret` is the fleet's (Redis);
// `model` and `format` name the Redis namespace.
Result<std::vector<std::unique_ptr<Tier>>> OpenTiers(const ServeConfig& config, const std::vector<std::byte>& secret,
                                                     std::string_view model, std::string_view format);

}  // namespace tessera::serve_detail

namespace tessera {

// Times the store's fetches (the promote latency) and forwards everything else.
class TimedSource final : public BlockSource {
 public:
  TimedSource(BlockSource* inner, std::shared_ptr<LatencyHistogram> h) : inner_(inner), h_(std::move(h)) {}
  void OnSealed(const BlockPool& pool, BlockId b, const SealedIdentity& id) override { inner_->OnSealed(pool, b, id); }
  void OnEvicted(const BlockPool& pool, BlockId b, const SealedIdentity& id) override {
    inner_->OnEvicted(pool, b, id);
  }
  void OnCheckpoint(const BlockPool& pool, BlockId b, const SealedIdentity& id) override {
    inner_->OnCheckpoint(pool, b, id);
  }
  void BeginCheckpoint() override { inner_->BeginCheckpoint(); }
  Status FinishCheckpoint() override { return inner_->FinishCheckpoint(); }
  size_t Probe(std::span<const ChainLink> links) override { return inner_->Probe(links); }
  size_t Fetch(BlockPool& pool, std::span<const ChainLink> links, std::span<const BlockId> blocks,
               std::vector<std::vector<std::byte>>* states) override {
    const serve_detail::Clock::time_point t0 = serve_detail::Clock::now();
    const size_t n = inner_->Fetch(pool, links, blocks, states);
    h_->Observe(serve_detail::NanosSince(t0));
    return n;
  }

 private:
  BlockSource* inner_;
  std::shared_ptr<LatencyHistogram> h_;
};

}  // namespace tessera

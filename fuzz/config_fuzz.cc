// libFuzzer target for the config.json reader and what a config's numbers flow into.
//
// The input is the text of a config.json, handed to GeometryFromConfigJson as `--config` does
// after reading the file. A geometry that parses is priced at a one-token, a 128K-token and a
// 2^40-token context under each engine (tessera, vllm, sglang), its default formats, and
// rendered as JSON. Any outcome is fine as long as it is a Status: a crash, an exception, a
// sanitizer report or a hang is a finding. Checked on every ledger that computes: the committed
// terms add up to the committed total, and the JSON rendering parses back.
//
//   cmake --preset fuzz && cmake --build build/fuzz --target config_fuzz
//   build/fuzz/fuzz/config_fuzz -dict=fuzz/config.dict fuzz/config_corpus -max_total_time=60
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "tessera/checked.h"
#include "tessera/geometry.h"
#include "tessera/ledger.h"
#include "tessera_tools/render.h"

namespace {

using namespace tessera;

void CheckLedger(const Ledger& l) {
  Checked sum(0);
  for (const Term& t : l.terms) sum += t.bytes;
  if (sum.overflowed() || sum.value() != l.committed_bytes) std::abort();
  const std::string json = RenderLedger(l, OutputFormat::kJson);
  if (!nlohmann::json::accept(json)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Result<Geometry> g = GeometryFromConfigJson(text, "fuzz.json");
  if (!g.ok()) return 0;
  for (Engine engine : {Engine::kTessera, Engine::kVllm, Engine::kSglang}) {
    for (uint64_t context : {uint64_t{1}, uint64_t{131072}, uint64_t{1} << 40}) {
      LedgerOptions o;
      o.context_tokens = context;
      o.engine = engine;
      Result<Ledger> l = ComputeLedger(*g, o);
      if (l.ok()) CheckLedger(*l);
    }
  }
  // The layout view (one token, the tessera engine) renders the cache map.
  LedgerOptions one;
  one.context_tokens = 1;
  Result<Ledger> l = ComputeLedger(*g, one);
  if (l.ok() && !nlohmann::json::accept(RenderLayout(*l, OutputFormat::kJson))) std::abort();
  return 0;
}

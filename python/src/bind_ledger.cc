// The ledger: tessera._core.ledger_json (the CLI's `tessera ledger --format json` text for the
// same options; tessera.ledger parses it into a dict), preset names, record formats.
#include <optional>
#include <string>

#include "common.h"
#include "tessera/geometry.h"
#include "tessera/ledger.h"
#include "tessera/ledger_json.h"
#include "tessera/units.h"

namespace tessera::py_bind {

namespace {

// A token count: an int, or a string as the CLI takes it ("128k").
uint64_t TokenCount(const py::object& v, const char* arg) {
  if (PyUnicode_Check(v.ptr())) return Take(ParseTokenCount(ToStr(v, arg), arg));
  return ToU64(v, arg);
}

uint32_t Small(const py::object& v, const char* arg) {
  const uint64_t x = ToU64(v, arg);
  if (x > 65536) ThrowValue(arg, std::to_string(x) + " is above 65536");
  return static_cast<uint32_t>(x);
}

std::string LedgerJson(const py::object& model, const py::object& config, const py::object& context,
                       const py::object& batch, const py::object& kv_format, const py::object& indexer_format,
                       const py::object& block_tokens, const py::object& tp, const py::object& dcp,
                       const py::object& spec_tokens, const py::object& include_mtp, const py::object& engine,
                       const py::object& kernel, const py::object& swa_strategy, const py::object& prefill_chunk) {
  const Geometry g = LoadModelArg(model, config);
  LedgerOptions o;
  if (context.is_none()) ThrowValue("context", "missing: give context=TOKENS (e.g. 131072 or \"128k\")");
  o.context_tokens = TokenCount(context, "context");
  o.batch = ToU64(batch, "batch");
  if (!kv_format.is_none()) o.kv_format = ToStr(kv_format, "kv_format");
  if (!indexer_format.is_none()) o.indexer_format = ToStr(indexer_format, "indexer_format");
  if (!block_tokens.is_none()) o.block_tokens = ToU64(block_tokens, "block_tokens");
  o.tp = Small(tp, "tp");
  o.dcp = Small(dcp, "dcp");
  o.spec_tokens = Small(spec_tokens, "spec_tokens");
  o.include_mtp = ToBool(include_mtp, "include_mtp");
  o.engine = TakeAs(ParseEngine(ToStr(engine, "engine")), "engine");
  o.kernel = TakeAs(ParseKernel(ToStr(kernel, "kernel")), "kernel");
  o.swa_strategy = TakeAs(ParseSwaStrategy(ToStr(swa_strategy, "swa_strategy")), "swa_strategy");
  o.prefill_chunk_tokens = TokenCount(prefill_chunk, "prefill_chunk");
  if (o.prefill_chunk_tokens == 0) ThrowValue("prefill_chunk", "must be positive");
  std::optional<Result<Ledger>> l;
  std::string text;
  {
    py::gil_scoped_release nogil;
    l.emplace(ComputeLedger(g, o));
    if (l->ok()) text = LedgerJsonText(**l);
  }
  if (!l->ok()) ThrowStatus(l->status());
  return text;
}

}  // namespace

void BindLedger(py::module_& m) {
  m.def("ledger_json", &LedgerJson, py::arg("model") = py::none(), py::arg("config") = py::none(),
        py::arg("context") = py::none(), py::arg("batch") = 1, py::arg("kv_format") = py::none(),
        py::arg("indexer_format") = py::none(), py::arg("block_tokens") = py::none(), py::arg("tp") = 1,
        py::arg("dcp") = 1, py::arg("spec_tokens") = 0, py::arg("include_mtp") = false, py::arg("engine") = "tessera",
        py::arg("kernel") = "flashmla", py::arg("swa_strategy") = "recompute", py::arg("prefill_chunk") = 8192,
        "The ledger as JSON text: exactly what `tessera ledger --format json` prints for the same options.");
  m.def("models", &PresetNames, "The shipped model presets.");
}

}  // namespace tessera::py_bind

// The ledger as JSON (include/tessera/ledger_json.h), one function per part of the document.
#include "tessera/ledger_json.h"

#include <string>

#include "tessera/codec.h"
#include "tessera/format.h"

namespace tessera {

using nlohmann::ordered_json;

namespace {

// "inputs": the options the ledger was computed with, and what was derived from them.
ordered_json InputsJson(const Ledger& l) {
  ordered_json in;
  in["context_tokens"] = l.options.context_tokens;
  in["batch"] = l.options.batch;
  in["kv_format"] = l.kv_format;
  in["indexer_format"] = l.indexer_format;
  in["block_tokens"] = l.block_tokens;
  in["block_tokens_reasons"] = l.block_reasons;
  in["tp"] = l.options.tp;
  in["dcp"] = l.options.dcp;
  in["spec_tokens"] = l.options.spec_tokens;
  in["include_mtp"] = l.options.include_mtp;
  in["engine"] = std::string(EngineName(l.options.engine));
  in["kernel"] = std::string(KernelName(l.options.kernel));
  in["swa_strategy"] = std::string(SwaStrategyName(l.options.swa_strategy));
  in["prefill_chunk_tokens"] = l.options.prefill_chunk_tokens;
  if (l.options.max_model_len) in["max_model_len"] = *l.options.max_model_len;
  if (l.options.kv_scale_format) in["kv_scale_format"] = std::string(ScaleFormatName(*l.options.kv_scale_format));
  if (l.options.indexer_scale_format) {
    in["indexer_scale_format"] = std::string(ScaleFormatName(*l.options.indexer_scale_format));
  }
  return in;
}

// The per-layer-kind summary ("layer_kinds").
ordered_json KindsJson(const Ledger& l) {
  ordered_json kinds = ordered_json::array();
  for (const LayerKindSummary& k : l.kinds) {
    ordered_json kj;
    kj["kind"] = std::string(LayerKindName(k.kind));
    kj["layers"] = k.layers;
    kj["bytes_per_token_per_layer"] = ExactJson(k.paged_bytes_per_token);
    if (k.window_bytes_per_token) kj["window_bytes_per_token"] = k.window_bytes_per_token;
    if (k.state_bytes) kj["state_bytes_per_layer"] = k.state_bytes;
    kinds.push_back(kj);
  }
  return kinds;
}

// The window strategies compared ("swa_strategies"), models with windows only.
ordered_json StrategiesJson(const Ledger& l) {
  ordered_json st = ordered_json::array();
  for (const StrategyFigures& f : l.swa_strategies) {
    st.push_back({{"strategy", std::string(SwaStrategyName(f.strategy))},
                  {"bytes_kept_per_boundary", f.bytes_kept_per_boundary},
                  {"bytes_copied_per_boundary", f.bytes_copied_per_boundary},
                  {"tokens_recomputed_per_hit", f.tokens_recomputed_per_hit}});
  }
  return st;
}

ordered_json TermsJson(const std::vector<Term>& terms) {
  ordered_json out = ordered_json::array();
  for (const Term& t : terms) out.push_back({{"name", std::string(LedgerTermName(t.term))}, {"bytes", t.bytes}});
  return out;
}

// One cache line ("caches"): its format, its growth or slots, its storage (pages or arena).
ordered_json CacheJson(const CacheLine& c) {
  ordered_json cj;
  cj["cache"] = c.name;
  cj["layer_kind"] = std::string(LayerKindName(c.layer_kind));
  cj["role"] = std::string(CacheRoleName(c.role));
  cj["mtp"] = c.mtp;
  cj["layers"] = c.layers;
  cj["format"] = c.format.name;
  cj["regions"] = c.format.RegionSummary();
  cj["packing"] = std::string(PackingName(c.format.packing));
  cj["record_bytes"] = c.record_bytes;
  cj["formula"] = c.formula;
  if (c.grows) {
    cj["compress_ratio"] = c.compress_ratio;
    cj["bytes_per_token_per_layer"] = ExactJson(c.bytes_per_token_per_layer);
  } else {
    cj["slots"] = c.slots;
    cj["bytes_per_slot"] = c.record_bytes;
    cj["per_request_constant"] = true;
  }
  cj["shape"] = c.shape;
  cj["shape_unit"] = c.shape_unit;
  cj["storage"] = c.in_pages ? "pages" : "per-request arena";
  if (c.in_pages) {
    cj["block_tokens"] = c.page.block_tokens;
    cj["entries_per_block"] = c.page.entries_per_block;
    cj["page_bytes"] = c.page.page_bytes;
    cj["page_padding_bytes"] = c.page.padding_bytes;
    cj["layers_per_page"] = c.page.layers_per_page;
  }
  cj["requested_bytes"] = c.requested_bytes;
  cj["committed_bytes"] = c.committed_bytes;
  cj["committed_terms"] = TermsJson(c.terms);
  cj["read_bytes_per_token"] = c.read_bytes_per_token;
  return cj;
}

ordered_json ReconciliationJson(const Reconciliation* rec) {
  ordered_json r;
  r["scope"] = rec->scope;
  r["predicted_bytes"] = rec->predicted_bytes;
  r["observed_bytes"] = rec->observed_bytes;
  r["difference_bytes"] = rec->difference_bytes;
  ordered_json at = ordered_json::array();
  for (const Attribution& a : rec->attributed) {
    ordered_json aj = {{"term", a.term}, {"bytes", a.bytes}};
    if (a.trace_bytes) aj["trace_bytes"] = *a.trace_bytes;
    at.push_back(aj);
  }
  r["attributed"] = at;
  r["unexplained_bytes"] = rec->unexplained_bytes;
  return r;
}

}  // namespace

ordered_json ExactJson(const Fraction& f) {
  if (f.is_integer()) return f.num();
  ordered_json j;
  j["fraction"] = f.ToString();
  j["decimal"] = f.ToDecimal(12);
  return j;
}

ordered_json LedgerToJson(const Ledger& l, const Reconciliation* rec) {
  ordered_json j;
  j["model"] = l.model;
  j["model_type"] = l.model_type;
  j["config_sha256"] = l.config_sha256;
  j["inputs"] = InputsJson(l);
  j["layers_counted"] = l.layers_counted;
  j["tokens_per_rank"] = l.tokens_per_rank;
  j["requested_bytes"] = l.requested_bytes;
  j["committed_bytes"] = l.committed_bytes;
  j["committed_bytes_all_ranks"] = l.committed_bytes_all_ranks;
  j["reserved_at_admission_bytes"] = l.reserved_at_admission_bytes;
  if (l.block_id_bytes) j["block_id_bytes"] = l.block_id_bytes;
  j["read_bytes_per_token"] = l.read_bytes_per_token;
  j["read_bytes_per_token_all_ranks"] = l.read_bytes_per_token_all_ranks;
  j["mha_equivalent_bytes"] = l.mha_equivalent_bytes;
  j["mha_bytes_per_token_per_layer"] = l.mha_bytes_per_token_per_layer;
  j["mha_ratio"] = ExactJson(l.mha_ratio);
  ordered_json phases = ordered_json::array();
  for (const PhaseBytes& p : l.phases) {
    phases.push_back({{"phase", std::string(LedgerPhaseName(p.phase))}, {"bytes", p.bytes}});
  }
  j["phases"] = phases;
  if (!l.swa_strategies.empty()) {
    j["swa_strategies"] = StrategiesJson(l);
    j["cached_boundaries"] = l.cached_boundaries;
  }
  j["committed_terms"] = TermsJson(l.terms);
  j["layer_kinds"] = KindsJson(l);
  ordered_json caches = ordered_json::array();
  for (const CacheLine& c : l.lines) caches.push_back(CacheJson(c));
  j["caches"] = caches;
  j["notes"] = l.notes;
  if (rec != nullptr) j["reconciliation"] = ReconciliationJson(rec);
  return j;
}

}  // namespace tessera

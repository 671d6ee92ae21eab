#include "tessera_tools/receipt.h"

#include <algorithm>
#include <sstream>

#include "render_json.h"
#include "tessera/checked.h"
#include "tessera/reconcile.h"
#include "tessera/units.h"
#include "tessera_tools/render.h"
#include "tessera_tools/version.h"

namespace tessera {

using nlohmann::ordered_json;

bool Receipt::all_passed() const {
  for (const ReceiptCheck& c : checks) {
    if (!c.passed) return false;
  }
  return true;
}

namespace {

uint64_t GrowingRequested(const Ledger& l) {
  uint64_t sum = 0;
  for (const CacheLine& c : l.lines) {
    if (c.grows) sum += c.requested_bytes;
  }
  return sum;
}

ordered_json FormatJson(const RecordFormat& f) {
  ordered_json j;
  j["name"] = f.name;
  j["description"] = f.description;
  j["packing"] = std::string(PackingName(f.packing));
  j["page_alignment"] = f.page_alignment;
  j["record_bytes"] = f.record_bytes();
  ordered_json regions = ordered_json::array();
  for (const Region& r : f.regions) {
    regions.push_back({{"name", r.name},
                       {"element", std::string(ElementTypeName(r.type))},
                       {"count", r.count},
                       {"bits", r.bits()},
                       {"plane", r.plane}});
  }
  j["regions"] = regions;
  return j;
}

}  // namespace

namespace {

void AddCheck(Receipt* receipt, std::string name, bool passed, std::string detail) {
  receipt->checks.push_back({std::move(name), passed, std::move(detail)});
}

// Checks 1 and 2: the ledger's own sums.
void CheckSums(const Ledger& ledger, const LedgerOptions& o, Receipt* receipt) {
  auto check = [&](std::string name, bool passed, std::string detail) {
    AddCheck(receipt, std::move(name), passed, std::move(detail));
  };
  // 1. The committed terms add up to the committed total.
  Checked term_sum(0);
  for (const Term& t : ledger.terms) term_sum += t.bytes;
  check("terms add up to committed_bytes", !term_sum.overflowed() && term_sum.value() == ledger.committed_bytes,
        WithThousands(term_sum.value()) + " vs " + WithThousands(ledger.committed_bytes));

  // 2. Each cache's requested bytes are layers x batch x entries x record.
  bool lines_ok = true;
  for (const CacheLine& c : ledger.lines) {
    uint64_t entries = c.grows ? (c.compress_ratio <= 1 ? o.context_tokens : o.context_tokens / c.compress_ratio)
                               : std::min<uint64_t>(o.context_tokens, c.slots);
    Checked expect = Checked(c.layers) * o.batch * entries * c.record_bytes;
    lines_ok = lines_ok && !expect.overflowed() && expect.value() == c.requested_bytes;
  }
  check("requested = layers x batch x entries x record, per cache", lines_ok,
        std::to_string(ledger.lines.size()) + " caches");
}

// Checks 3 to 5: the one-token control, linearity and determinism (ledgers computed again).
Status CheckControls(const Geometry& g, const Ledger& ledger, const LedgerOptions& o, Receipt* receipt) {
  auto check = [&](std::string name, bool passed, std::string detail) {
    AddCheck(receipt, std::move(name), passed, std::move(detail));
  };
  // 3. The one-token control: a single token costs exactly one record in every per-token cache.
  LedgerOptions one = o;
  one.context_tokens = 1;
  one.batch = 1;
  TESSERA_ASSIGN_OR_RETURN(Ledger tiny, ComputeLedger(g, one));
  Checked one_token(0);
  for (const CacheLine& c : tiny.lines) {
    if (c.grows && c.compress_ratio <= 1) one_token += Checked(c.layers) * c.record_bytes;
  }
  check("one-token control", !one_token.overflowed() && GrowingRequested(tiny) == one_token.value(),
        "1 token: " + WithThousands(GrowingRequested(tiny)) + " B in per-token caches, committed " +
            WithThousands(tiny.committed_bytes) + " B");

  // 4. Linearity: the per-token caches scale with batch; doubling the context doubles them when
  //    the context is a multiple of every compress ratio.
  LedgerOptions tripled = o;
  Checked batch3 = Checked(o.batch) * 3;
  if (!batch3.overflowed()) {
    tripled.batch = batch3.value();
    Result<Ledger> t3 = ComputeLedger(g, tripled);
    if (t3.ok()) {
      check("requested bytes scale linearly with batch", t3->requested_bytes == 3 * ledger.requested_bytes,
            "batch x3: " + WithThousands(t3->requested_bytes));
    }
  }
  LedgerOptions doubled = o;
  doubled.context_tokens = o.context_tokens * 2;
  Result<Ledger> d2 = ComputeLedger(g, doubled);
  uint64_t lcm = 1;
  for (const CacheLine& c : ledger.lines) {
    if (c.grows) lcm = Lcm(lcm, c.compress_ratio).value();
  }
  if (d2.ok() && o.context_tokens % lcm == 0) {
    check("per-token caches scale linearly with context", GrowingRequested(*d2) == 2 * GrowingRequested(ledger),
          "context x2: " + WithThousands(GrowingRequested(*d2)));
  }

  // 5. Determinism.
  TESSERA_ASSIGN_OR_RETURN(Ledger again, ComputeLedger(g, o));
  check("repeatable", detail::LedgerToJson(again, nullptr) == detail::LedgerToJson(ledger, nullptr), "computed twice");
  return Status::Ok();
}

// Check 6: the observation, when given, reconciled to named terms.
Result<std::optional<Reconciliation>> CheckObservation(const Geometry& g, const Ledger& ledger,
                                                       const ReceiptRequest& req, Receipt* receipt) {
  if (!req.observed_bytes) return std::optional<Reconciliation>();
  TESSERA_ASSIGN_OR_RETURN(Reconciliation r, Reconcile(g, ledger, *req.observed_bytes, req.observed_all_ranks));
  std::string detail;
  for (const Attribution& a : r.attributed) detail += a.term + " " + std::to_string(a.bytes) + " B; ";
  detail += "unexplained " + std::to_string(r.unexplained_bytes) + " B";
  AddCheck(receipt, "observation reconciled to named terms", r.unexplained_bytes == 0, detail);
  return std::optional<Reconciliation>(r);
}

// The receipt's "inputs": the model's source, its config hash and the geometry fields.
ordered_json InputsJson(const Geometry& g, const ReceiptRequest& req) {
  ordered_json in;
  in["model_source"] = req.model_source;
  in["config_sha256"] = g.config_sha256;
  in["model_type"] = g.model_type;
  in["num_hidden_layers"] = g.num_layers;
  in["num_nextn_predict_layers"] = g.num_mtp_layers;
  in["num_attention_heads"] = g.num_attention_heads;
  in["num_key_value_heads"] = g.num_kv_heads;
  in["head_dim"] = g.head_dim;
  in["kv_lora_rank"] = g.kv_lora_rank;
  in["qk_rope_head_dim"] = g.qk_rope_head_dim;
  in["latent_dim"] = g.latent_dim;
  in["index_head_dim"] = g.index_head_dim;
  in["index_topk"] = g.index_topk;
  in["sliding_window"] = g.sliding_window;
  if (req.observed_bytes) {
    in["observed_bytes"] = *req.observed_bytes;
    in["observed_scope"] = req.observed_all_ranks ? "all ranks" : "per rank";
  }
  return in;
}

// Each record format once, however many caches use it.
ordered_json FormatsJson(const Ledger& ledger) {
  ordered_json formats = ordered_json::array();
  std::vector<RecordFormat> seen;  // each format once, however many caches use it
  for (const CacheLine& c : ledger.lines) {
    if (std::find(seen.begin(), seen.end(), c.format) != seen.end()) continue;
    seen.push_back(c.format);
    formats.push_back(FormatJson(c.format));
  }
  return formats;
}

std::string ReceiptMarkdown(const Geometry& g, const ReceiptRequest& req, const Ledger& ledger,
                            const ordered_json& formats, const Reconciliation* rec,
                            const std::vector<ReceiptCheck>& checks) {
  std::ostringstream md;
  md << "# Cache receipt: " << ledger.model << "\n\n";
  md << "- tool: tessera " << TesseraVersion() << "\n- model source: " << req.model_source << "\n- config sha256: `"
     << g.config_sha256 << "`\n";
  md << "- geometry: " << g.num_layers << " layers (+" << g.num_mtp_layers << " MTP), " << g.num_attention_heads
     << " heads, " << g.num_kv_heads << " KV heads, latent " << g.latent_dim << " + rope " << g.qk_rope_head_dim
     << "\n\n";
  md << "## Formats\n\n";
  for (const auto& f : formats) {
    md << "- `" << f["name"].get<std::string>() << "`: " << f["record_bytes"].get<uint64_t>() << " B, "
       << f["packing"].get<std::string>() << ", page alignment " << f["page_alignment"].get<uint64_t>()
       << " B; regions:";
    for (const auto& r : f["regions"]) {
      md << " " << r["name"].get<std::string>() << " " << r["element"].get<std::string>() << " x"
         << r["count"].get<uint64_t>() << ";";
    }
    md << "\n";
  }
  md << "\n" << RenderLedger(ledger, OutputFormat::kMarkdown, rec) << "\n## Checks\n\n";
  for (const ReceiptCheck& c : checks)
    md << "- [" << (c.passed ? "x" : " ") << "] " << c.name << " — " << c.detail << "\n";
  return md.str();
}

}  // namespace

Result<Receipt> BuildReceipt(const Geometry& g, const ReceiptRequest& req) {
  TESSERA_ASSIGN_OR_RETURN(Ledger ledger, ComputeLedger(g, req.options));
  Receipt receipt;
  CheckSums(ledger, req.options, &receipt);
  TESSERA_RETURN_IF_ERROR(CheckControls(g, ledger, req.options, &receipt));
  TESSERA_ASSIGN_OR_RETURN(std::optional<Reconciliation> rec, CheckObservation(g, ledger, req, &receipt));

  ordered_json j;
  j["receipt_version"] = 1;
  j["tool"] = "tessera " + std::string(TesseraVersion());
  j["inputs"] = InputsJson(g, req);
  const ordered_json formats = FormatsJson(ledger);
  j["formats"] = formats;
  j["ledger"] = detail::LedgerToJson(ledger, rec ? &*rec : nullptr);
  ordered_json checks = ordered_json::array();
  for (const ReceiptCheck& c : receipt.checks)
    checks.push_back({{"check", c.name}, {"passed", c.passed}, {"detail", c.detail}});
  j["checks"] = checks;
  receipt.json = detail::DumpJson(j) + "\n";
  receipt.markdown = ReceiptMarkdown(g, req, ledger, formats, rec ? &*rec : nullptr, receipt.checks);
  return receipt;
}

}  // namespace tessera

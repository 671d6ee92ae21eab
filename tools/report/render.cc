#include "tessera_tools/render.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "render_json.h"
#include "tessera/codec.h"
#include "tessera/units.h"

namespace tessera {

using nlohmann::json;
using nlohmann::ordered_json;

Result<OutputFormat> ParseOutputFormat(std::string_view name) {
  if (name == "table") return OutputFormat::kTable;
  if (name == "json") return OutputFormat::kJson;
  if (name == "markdown") return OutputFormat::kMarkdown;
  return InvalidArgument("format",
                         "unknown output format \"" + std::string(name) + "\" (known: table, json, markdown)");
}

namespace {

std::string ShapeString(const CacheLine& l) {
  std::string s = "[";
  for (size_t i = 0; i < l.shape.size(); ++i) s += (i ? "," : "") + std::to_string(l.shape[i]);
  s += "]";
  if (l.shape_unit == "bytes") s += " B";
  return s;
}

std::string Signed(int64_t v) {
  if (v < 0) return "-" + FormatBytes(static_cast<uint64_t>(-(v + 1)) + 1);
  return "+" + FormatBytes(static_cast<uint64_t>(v));
}

// A simple aligned text table.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string Text() const {
    std::vector<size_t> w;
    for (const auto& r : rows_) {
      if (w.size() < r.size()) w.resize(r.size(), 0);
      for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
    }
    std::string out;
    for (const auto& r : rows_) {
      std::string line = "  ";
      for (size_t i = 0; i < r.size(); ++i) {
        line += r[i];
        if (i + 1 < r.size()) line += std::string(w[i] - r[i].size() + 2, ' ');
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      out += line + "\n";
    }
    return out;
  }
  std::string Markdown() const {
    std::string out;
    for (size_t ri = 0; ri < rows_.size(); ++ri) {
      out += "|";
      for (const auto& c : rows_[ri]) out += " " + c + " |";
      out += "\n";
      if (ri == 0) {
        out += "|";
        for (size_t i = 0; i < rows_[0].size(); ++i) out += " --- |";
        out += "\n";
      }
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string MtpText(const Ledger& l) {
  return l.options.include_mtp ? "included" : "not included (off by default; --include-mtp counts them)";
}

std::string InputsLine(const Ledger& l) {
  const LedgerOptions& o = l.options;
  std::string s = "context " + WithThousands(o.context_tokens) + " tokens, batch " + std::to_string(o.batch) +
                  ", kv-format " + l.kv_format;
  if (!l.indexer_format.empty()) s += ", indexer-format " + l.indexer_format;
  s += ", block " + std::to_string(l.block_tokens) + " tokens, tp " + std::to_string(o.tp) + ", dcp " +
       std::to_string(o.dcp) + ", spec-tokens " + std::to_string(o.spec_tokens) + ", engine " +
       std::string(EngineName(o.engine));
  if (o.max_model_len) s += ", max-model-len " + WithThousands(*o.max_model_len);
  return s;
}

}  // namespace

namespace detail {

ordered_json ClaimsToJson(const ClaimCheck& c) {
  ordered_json j;
  j["source"] = c.source;
  ordered_json rs = ordered_json::array();
  for (const ClaimResult& r : c.results) {
    ordered_json rj;
    rj["id"] = r.id;
    rj["column"] = r.column;
    rj["subject"] = r.subject;
    rj["claimed"] = r.claimed;
    rj["exact"] = r.exact;
    rj["verdict"] = std::string(VerdictName(r.verdict));
    rj["reading"] = r.reading;
    rj["error_percent"] = std::round(r.error_percent * 1000) / 1000;
    rj["detail"] = r.detail;
    rs.push_back(rj);
  }
  j["claims"] = rs;
  j["findings"] = c.findings;
  return j;
}

}  // namespace detail

// Long (~100 lines): the table and the Markdown forms of one ledger, written side by side so that
// a figure added to one is seen missing from the other (JSON is LedgerToJson).
std::string RenderLedger(const Ledger& l, OutputFormat format, const Reconciliation* rec) {
  if (format == OutputFormat::kJson) return detail::DumpJson(detail::LedgerToJson(l, rec)) + "\n";
  const bool md = format == OutputFormat::kMarkdown;
  std::ostringstream out;
  if (md) {
    out << "## Ledger: " << l.model << " (" << l.model_type << ")\n\n";
    out << "- inputs: " << InputsLine(l) << "\n";
    out << "- MTP layers: " << MtpText(l) << "\n";
    out << "- config sha256: `" << l.config_sha256 << "`\n";
    for (const std::string& r : l.block_reasons) out << "- block span: " << r << "\n";
    out << "\n";
  } else {
    out << "ledger: " << l.model << " (" << l.model_type << ")\n";
    out << "inputs: " << InputsLine(l) << "\n";
    out << "MTP layers: " << MtpText(l) << "\n";
    for (const std::string& r : l.block_reasons) out << "block span: " << r << "\n";
    out << "\n";
  }
  Table caches({"cache", "layers", "format", "record", "per token per layer", "shape", "storage", "requested",
                "committed/rank", "read/token"});
  for (const CacheLine& c : l.lines) {
    std::string per = c.grows ? c.bytes_per_token_per_layer.ToExactAndDecimal() + " B"
                              : std::to_string(c.record_bytes) + " B/slot x " + std::to_string(c.slots) + " (constant)";
    std::string storage =
        c.in_pages
            ? "pages of " + std::to_string(c.page.block_tokens) + " tokens (" +
                  std::to_string(c.page.entries_per_block) + " entries, " + WithThousands(c.page.page_bytes) + " B)" +
                  (c.page.packed() ? " (" + std::to_string(c.page.layers_per_page) + " layers per page)" : "")
            : "arena";
    caches.Add({c.name, std::to_string(c.layers), c.format.name, std::to_string(c.record_bytes) + " B", per,
                ShapeString(c), storage, WithThousands(c.requested_bytes), WithThousands(c.committed_bytes),
                WithThousands(c.read_bytes_per_token)});
  }
  out << (md ? "### Caches (bytes)\n\n" + caches.Markdown() : "caches (bytes):\n" + caches.Text()) << "\n";
  Table formulas({"cache", "requested bytes per request"});
  for (const CacheLine& c : l.lines) formulas.Add({c.name, c.formula});
  out << (md ? "### How each cache is priced\n\n" + formulas.Markdown()
             : "how each cache is priced (requested bytes per request):\n" + formulas.Text())
      << "\n";

  Table terms({"term", "bytes"});
  for (const Term& t : l.terms) terms.Add({std::string(LedgerTermName(t.term)), FormatBytes(t.bytes)});
  out << (md ? "### Committed per rank, by term\n\n" + terms.Markdown()
             : "committed per rank, by term:\n" + terms.Text())
      << "\n";

  Table totals({"total", "value"});
  totals.Add({"requested_bytes", FormatBytes(l.requested_bytes)});
  totals.Add({"committed_bytes (per rank)", FormatBytes(l.committed_bytes)});
  totals.Add({"committed_bytes_all_ranks", FormatBytes(l.committed_bytes_all_ranks)});
  totals.Add({"reserved_at_admission_bytes (per rank)", FormatBytes(l.reserved_at_admission_bytes)});
  totals.Add({"read_bytes_per_token (per rank)", FormatBytes(l.read_bytes_per_token)});
  totals.Add({"mha_equivalent_bytes", FormatBytes(l.mha_equivalent_bytes) + " (" +
                                          WithThousands(l.mha_bytes_per_token_per_layer) + " B per token per layer)"});
  totals.Add({"MHA-equivalent / requested", l.mha_ratio.ToString() + " = " + l.mha_ratio.ToDecimal(4) + "x"});
  out << (md ? "### Totals\n\n" + totals.Markdown() : "totals:\n" + totals.Text()) << "\n";

  Table phases({"phase (per rank)", "bytes"});
  for (const PhaseBytes& p : l.phases) phases.Add({std::string(LedgerPhaseName(p.phase)), FormatBytes(p.bytes)});
  out << (md ? "### Phases\n\n" + phases.Markdown()
             : "phases (admission, chunked-prefill peak, decode):\n" + phases.Text())
      << "\n";
  if (!l.swa_strategies.empty()) {
    Table st({"window strategy", "kept per boundary", "copied per boundary", "tokens recomputed per hit"});
    for (const StrategyFigures& f : l.swa_strategies) {
      st.Add({std::string(SwaStrategyName(f.strategy)) + (f.strategy == l.options.swa_strategy ? " (in use)" : ""),
              FormatBytes(f.bytes_kept_per_boundary), FormatBytes(f.bytes_copied_per_boundary),
              std::to_string(f.tokens_recomputed_per_hit)});
    }
    std::string head = "resuming a cached prefix at a block boundary (" + WithThousands(l.cached_boundaries) +
                       " boundaries sealed at this context):";
    out << (md ? "### " + head + "\n\n" + st.Markdown() : head + "\n" + st.Text()) << "\n";
  }

  Table kinds(
      {"layer kind", "layers", "paged bytes per token per layer", "window bytes per token", "state bytes per layer"});
  for (const LayerKindSummary& k : l.kinds) {
    kinds.Add({std::string(LayerKindName(k.kind)), std::to_string(k.layers),
               k.paged_bytes_per_token.ToExactAndDecimal() + " B",
               k.window_bytes_per_token ? std::to_string(k.window_bytes_per_token) + " B" : "-",
               k.state_bytes ? WithThousands(k.state_bytes) + " B" : "-"});
  }
  out << (md ? "### Per layer kind\n\n" + kinds.Markdown() : "per layer kind:\n" + kinds.Text());
  if (rec != nullptr) {
    out << (md ? "\n### Reconciliation\n\n" : "\nreconciliation (" + rec->scope + "):\n");
    out << (md ? "- " : "  ") << "predicted " << FormatBytes(rec->predicted_bytes) << "\n";
    out << (md ? "- " : "  ") << "observed  " << FormatBytes(rec->observed_bytes) << "\n";
    out << (md ? "- " : "  ") << "difference " << Signed(rec->difference_bytes) << "\n";
    for (const Attribution& a : rec->attributed) {
      out << (md ? "- " : "    ") << a.term << ": " << Signed(a.bytes);
      if (a.trace_bytes) out << " (trace label: " << FormatBytes(*a.trace_bytes) << ")";
      out << "\n";
    }
    out << (md ? "- " : "  ") << "unexplained " << Signed(rec->unexplained_bytes) << "\n";
  }
  if (!l.notes.empty()) {
    out << (md ? "\n### Notes\n\n" : "\nnotes:\n");
    for (const std::string& n : l.notes) out << (md ? "- " : "  - ") << n << "\n";
  }
  return out.str();
}

std::string RenderLayout(const Ledger& l, OutputFormat format) {
  const std::vector<CacheGroup>& groups = l.groups;
  ordered_json j;
  j["model"] = l.model;
  j["kernel"] = std::string(KernelName(l.options.kernel));
  j["block_tokens"] = l.block_tokens;
  j["block_tokens_reasons"] = l.block_reasons;
  j["notes"] = l.notes;
  ordered_json gs = ordered_json::array();
  for (const CacheGroup& g : groups) {
    ordered_json gj;
    gj["group"] = g.name;
    gj["role"] = std::string(CacheRoleName(g.role));
    gj["layers"] = g.layers;
    gj["lines"] = g.lines;
    gj["format"] = g.format.name;
    gj["regions"] = g.format.RegionSummary();
    gj["packing"] = std::string(PackingName(g.format.packing));
    gj["record_bytes"] = g.format.record_bytes();
    gj["storage"] = g.in_pages ? "pages" : "per-request arena";
    if (g.in_pages) {
      gj["compress_ratio"] = g.compress_ratio;
      gj["entries_per_block"] = g.page.entries_per_block;
      gj["data_bytes"] = g.page.data_bytes;
      gj["page_bytes"] = g.page.page_bytes;
      gj["padding_bytes"] = g.page.padding_bytes;
      gj["page_alignment"] = g.page.alignment;
      gj["layers_per_page"] = g.page.layers_per_page;
      gj["layer_stride"] = g.page.layer_stride;
      gj["block_bytes"] = GroupBlockBytes(g.page, g.layers).value();
      std::string why = std::to_string(l.block_tokens) + " tokens / " + std::to_string(g.compress_ratio) +
                        " per entry = " + std::to_string(g.page.entries_per_block) + " entries of " +
                        std::to_string(g.format.record_bytes()) + " B";
      if (g.page.packed()) {
        why += "; " + std::to_string(g.page.layers_per_page) + " layers' slices of " +
               std::to_string(g.page.data_bytes) + " B share one page";
      }
      if (g.page.padding_bytes > 0) {
        why += ", padded to a multiple of " + std::to_string(g.page.alignment) + " B (" + g.format.name + " alignment)";
      }
      gj["reason"] = why;
    } else {
      gj["slots"] = g.slots;
      gj["bytes_per_request"] = g.bytes_per_request;
      gj["reason"] = g.role == CacheRole::kWindow
                         ? "a ring of the last sliding_window tokens per layer"
                         : "fp32 compressor rows of incomplete (and, overlapping, previous) groups";
    }
    gs.push_back(gj);
  }
  j["groups"] = gs;
  if (format == OutputFormat::kJson) return detail::DumpJson(j) + "\n";
  const bool md = format == OutputFormat::kMarkdown;
  std::ostringstream out;
  out << (md ? "## Layout: " : "layout: ") << l.model << ", kernel " << KernelName(l.options.kernel) << "\n";
  out << (md ? "- " : "") << "block_tokens " << l.block_tokens << "\n";
  for (const std::string& r : l.block_reasons) out << (md ? "  - " : "  because: ") << r << "\n";
  for (const std::string& n : l.notes) out << (md ? "  - note: " : "  note: ") << n << "\n";
  Table t({"group", "layers", "format", "record", "storage", "entries/block", "page bytes", "padding", "why"});
  for (const auto& gj : gs) {
    bool pages = gj["storage"] == "pages";
    t.Add({gj["group"].get<std::string>(), std::to_string(gj["layers"].get<uint32_t>()),
           gj["format"].get<std::string>(), std::to_string(gj["record_bytes"].get<uint64_t>()) + " B",
           gj["storage"].get<std::string>(),
           pages ? std::to_string(gj["entries_per_block"].get<uint32_t>())
                 : std::to_string(gj["slots"].get<uint32_t>()) + " slots",
           pages ? WithThousands(gj["page_bytes"].get<uint64_t>())
                 : WithThousands(gj["bytes_per_request"].get<uint64_t>()) + "/request",
           pages ? std::to_string(gj["padding_bytes"].get<uint64_t>()) : "-", gj["reason"].get<std::string>()});
  }
  out << "\n" << (md ? t.Markdown() : t.Text());
  return out.str();
}

std::string RenderClaims(const ClaimCheck& c, OutputFormat format) {
  if (format == OutputFormat::kJson) return detail::DumpJson(detail::ClaimsToJson(c)) + "\n";
  const bool md = format == OutputFormat::kMarkdown;
  Table t({"claim", "subject", "claimed", "exact", "verdict", "detail"});
  for (const ClaimResult& r : c.results) {
    t.Add({r.id, r.subject, r.claimed, r.exact, std::string(VerdictName(r.verdict)), r.detail});
  }
  std::ostringstream out;
  out << (md ? "## Claim check\n\nsource: " : "claim check — source: ") << c.source << "\n\n";
  out << (md ? t.Markdown() : t.Text()) << "\n";
  out << (md ? "### Findings\n\n" : "findings:\n");
  for (const std::string& f : c.findings) out << (md ? "- " : "  - ") << f << "\n";
  return out.str();
}

}  // namespace tessera

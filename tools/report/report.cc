#include "tessera_tools/report.h"

#include <nlohmann/json.hpp>
#include <sstream>

#include "render_json.h"
#include "tessera/geometry.h"
#include "tessera/ledger.h"
#include "tessera/units.h"
#include "tessera_tools/claims.h"

namespace tessera {

using nlohmann::ordered_json;

namespace {

constexpr const char* kModels[] = {"deepseek-v3", "deepseek-v4-pro"};
constexpr uint64_t kContexts[] = {8192, 131072, 1048576};
constexpr Engine kEngines[] = {Engine::kTessera, Engine::kVllm, Engine::kSglang};

std::string Short(uint64_t bytes) { return FormatBinary(bytes) + " / " + FormatDecimal(bytes); }

}  // namespace

Result<std::string> RenderReport(OutputFormat format) {
  ordered_json rows = ordered_json::array();
  std::ostringstream table;
  const bool md = format == OutputFormat::kMarkdown;
  if (md) {
    table << "# Tessera report\n\nKV cache of one request, bytes exact; binary / decimal units.\n\n"
          << "| model | context | structural (requested) | tessera committed | vllm committed | vllm reserved at "
             "admission | "
             "sglang committed | read per token | MHA-equivalent | MHA / requested |\n"
          << "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  } else if (format == OutputFormat::kTable) {
    table << "tessera report: KV cache of one request (default record formats, batch 1, tp 1, MTP layers not counted)\n"
          << "units: binary (GiB) / decimal (GB); exact byte counts with --format json\n\n";
  }
  for (const char* model : kModels) {
    TESSERA_ASSIGN_OR_RETURN(Geometry g, LoadPreset(model));
    for (uint64_t context : kContexts) {
      ordered_json row;
      row["model"] = model;
      row["context_tokens"] = context;
      std::vector<Ledger> ledgers;
      for (Engine e : kEngines) {
        LedgerOptions o;
        o.context_tokens = context;
        o.engine = e;
        TESSERA_ASSIGN_OR_RETURN(Ledger l, ComputeLedger(g, o));
        ledgers.push_back(std::move(l));
      }
      const Ledger& t = ledgers[0];
      row["kv_format"] = t.kv_format;
      row["indexer_format"] = t.indexer_format;
      row["requested_bytes"] = t.requested_bytes;
      for (const Ledger& l : ledgers) {
        ordered_json e;
        e["block_tokens"] = l.block_tokens;
        e["committed_bytes"] = l.committed_bytes;
        e["reserved_at_admission_bytes"] = l.reserved_at_admission_bytes;
        row["engines"][std::string(EngineName(l.options.engine))] = e;
      }
      row["read_bytes_per_token"] = t.read_bytes_per_token;
      row["mha_equivalent_bytes"] = t.mha_equivalent_bytes;
      row["mha_ratio"] = detail::ExactJson(t.mha_ratio);
      rows.push_back(row);
      std::string ctx = WithThousands(context);
      if (md) {
        table << "| " << model << " (" << t.kv_format << ") | " << ctx << " | " << Short(t.requested_bytes) << " | "
              << Short(ledgers[0].committed_bytes) << " | " << Short(ledgers[1].committed_bytes) << " | "
              << Short(ledgers[1].reserved_at_admission_bytes) << " | " << Short(ledgers[2].committed_bytes) << " | "
              << Short(t.read_bytes_per_token) << " | " << Short(t.mha_equivalent_bytes) << " | "
              << t.mha_ratio.ToDecimal(4) << "x |\n";
      } else if (format == OutputFormat::kTable) {
        table << model << " (" << t.kv_format << (t.indexer_format.empty() ? "" : " + " + t.indexer_format) << ") at "
              << ctx << " tokens\n";
        table << "  structural (requested)      " << FormatBytes(t.requested_bytes) << "\n";
        for (const Ledger& l : ledgers) {
          std::string name = std::string(EngineName(l.options.engine)) + " committed";
          table << "  " << name << std::string(28 - name.size(), ' ') << FormatBytes(l.committed_bytes)
                << "  (blocks of " << l.block_tokens << " tokens)\n";
          if (l.reserved_at_admission_bytes != l.committed_bytes) {
            std::string r = std::string(EngineName(l.options.engine)) + " reserved at admission";
            table << "  " << r << std::string(r.size() < 28 ? 28 - r.size() : 1, ' ')
                  << FormatBytes(l.reserved_at_admission_bytes) << "\n";
          }
        }
        table << "  read per generated token    " << FormatBytes(t.read_bytes_per_token) << "\n";
        table << "  MHA-equivalent              " << FormatBytes(t.mha_equivalent_bytes) << "  ("
              << t.mha_ratio.ToDecimal(4) << "x the requested bytes)\n\n";
      }
    }
  }
  TESSERA_ASSIGN_OR_RETURN(ClaimCheck claims, CheckSeedClaims());
  if (format == OutputFormat::kJson) {
    ordered_json j;
    j["ledgers"] = rows;
    j["claim_check"] = detail::ClaimsToJson(claims);
    return detail::DumpJson(j) + "\n";
  }
  return table.str() + "\n" + RenderClaims(claims, format);
}

}  // namespace tessera

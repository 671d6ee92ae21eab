#include "tessera_tools/claims.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "embedded.h"
#include "tessera/checked.h"
#include "tessera/geometry.h"
#include "tessera/ledger.h"
#include "tessera/units.h"

namespace tessera {

using nlohmann::json;

std::string_view VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kCorrect:
      return "correct";
    case Verdict::kMislabeled:
      return "mislabeled unit";
    case Verdict::kWrong:
      return "wrong";
  }
  return "?";
}

namespace {

struct Decimal {
  Int128 scaled = 0;  // value x 10^places
  int places = 0;
};

Result<Decimal> ParseDecimal(const std::string& s, const std::string& id) {
  Decimal d;
  bool dot = false;
  if (s.empty()) return InvalidArgument("claimed", id + ": empty value");
  for (char c : s) {
    if (c == '.') {
      if (dot) return InvalidArgument("claimed", id + ": \"" + s + "\" is not a decimal");
      dot = true;
      continue;
    }
    if (c < '0' || c > '9') return InvalidArgument("claimed", id + ": \"" + s + "\" is not a decimal");
    d.scaled = d.scaled * 10 + (c - '0');
    if (dot) ++d.places;
    if (d.places > 12) return InvalidArgument("claimed", id + ": too many decimals");
  }
  return d;
}

Int128 Pow10(int p) {
  Int128 v = 1;
  while (p-- > 0) v *= 10;
  return v;
}

// Does `claimed` equal num/den rounded to the claimed number of places?
bool MatchesAtPrecision(const Decimal& c, Int128 num, Int128 den) {
  // |c.scaled / 10^p - num/den| <= 1 / (2 * 10^p)  <=>  |2 c.scaled den - 2 num 10^p| <= den
  Int128 lhs = 2 * c.scaled * den - 2 * num * Pow10(c.places);
  if (lhs < 0) lhs = -lhs;
  return lhs <= den;
}

double ErrorPercent(const Decimal& c, Int128 num, Int128 den) {
  double exact = static_cast<double>(num) / static_cast<double>(den);
  double claimed = static_cast<double>(c.scaled) / static_cast<double>(Pow10(c.places));
  return exact == 0 ? 0 : (claimed - exact) / exact * 100.0;
}

struct Reading {
  std::string name;
  Int128 unit;
};

std::string FormatPercent(double p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.2f%%", p);
  return buf;
}

std::string FractionDisplay(Int128 num, Int128 den, const char* unit) {
  Fraction f(static_cast<uint64_t>(num), static_cast<uint64_t>(den));
  std::string dec = f.ToDecimal(6);
  return dec + " " + unit;
}

// The quantity a claim names, read off the ledger: the exact value num/den, the readings (units)
// it may be printed in, the claim's own first, and r->exact.
Status ReadQuantity(const std::string& quantity, const std::string& unit, const std::string& layer_kind,
                    const std::string& model, const Geometry& g, const Ledger& ledger, ClaimResult* out,
                    std::vector<Reading>* out_readings, Int128* out_num, Int128* out_den) {
  ClaimResult& r = *out;
  std::vector<Reading>& readings = *out_readings;
  Int128& num = *out_num;
  Int128& den = *out_den;
  if (quantity == "requested_bytes") {
    num = ledger.requested_bytes;
    if (unit == "GB") {
      readings = {{"GB", 1000000000}, {"GiB", static_cast<Int128>(1) << 30}};
    } else if (unit == "TB") {
      readings = {{"TB", static_cast<Int128>(1000000000000LL)},
                  {"TiB", static_cast<Int128>(1) << 40},
                  {"GiB/1000", (static_cast<Int128>(1) << 30) * 1000}};
    } else if (unit == "B") {
      readings = {{"B", 1}};
    } else {
      return InvalidArgument("unit", r.id + ": unknown unit \"" + unit + "\"");
    }
    r.exact = FormatBytes(ledger.requested_bytes);
  } else if (quantity == "mha_ratio") {
    num = ledger.mha_ratio.num();
    den = ledger.mha_ratio.den();
    readings = {{"x", 1}};
    r.exact = ledger.mha_ratio.ToString() + " = " + ledger.mha_ratio.ToDecimal(4) + "x";
  } else if (quantity == "bytes_per_token_per_layer" || quantity == "window_bytes_per_token") {
    const LayerKindSummary* k = nullptr;
    for (const LayerKindSummary& s : ledger.kinds) {
      if (LayerKindName(s.kind) == layer_kind) k = &s;
    }
    if (k == nullptr)
      return InvalidArgument("layer_kind", r.id + ": " + model + " has no \"" + layer_kind + "\" layers");
    if (quantity == "bytes_per_token_per_layer") {
      num = k->paged_bytes_per_token.num();
      den = k->paged_bytes_per_token.den();
      r.exact = k->paged_bytes_per_token.ToExactAndDecimal() + " B";
    } else {
      num = k->window_bytes_per_token;
      r.exact = std::to_string(k->window_bytes_per_token) + " B per window token (a constant ring of " +
                std::to_string(g.sliding_window) + " tokens per layer, not per context token)";
    }
    readings = {{"B", 1}};
  } else {
    return InvalidArgument("quantity", r.id + ": unknown quantity \"" + quantity + "\"");
  }
  return Status::Ok();
}

// The verdict: correct in the claim's reading, mislabeled in another, else wrong by the
// nearest reading's error; r->detail says which.
void Judge(const Decimal& value, bool exact_claim, const std::string& unit, const std::vector<Reading>& readings,
           Int128 num, Int128 den, ClaimResult* out) {
  ClaimResult& r = *out;
  // The reading the claim names comes first; a match there is correct, elsewhere mislabeled.
  bool matched = false;
  for (size_t i = 0; i < readings.size(); ++i) {
    bool match = exact_claim ? value.scaled * den * readings[i].unit == num * Pow10(value.places)
                             : MatchesAtPrecision(value, num, den * readings[i].unit);
    if (match) {
      r.verdict = i == 0 ? Verdict::kCorrect : Verdict::kMislabeled;
      r.reading = readings[i].name;
      r.error_percent = ErrorPercent(value, num, den * readings[i].unit);
      matched = true;
      break;
    }
  }
  if (!matched) {
    double best = 1e300;
    for (const Reading& rd : readings) {
      double e = ErrorPercent(value, num, den * rd.unit);
      if (std::fabs(e) < std::fabs(best)) {
        best = e;
        r.reading = rd.name;
      }
    }
    r.verdict = Verdict::kWrong;
    r.error_percent = best;
  }
  for (const Reading& rd : readings) {
    if (rd.name == r.reading && rd.unit != 1) r.exact += " = " + FractionDisplay(num, den * rd.unit, rd.name.c_str());
  }
  if (r.verdict == Verdict::kCorrect) {
    r.detail = exact_claim ? "exact" : "matches at the claimed precision";
  } else if (r.verdict == Verdict::kMislabeled) {
    r.detail = "the value is " + r.reading + ", printed as " + unit;
  } else {
    r.detail = FormatPercent(r.error_percent) + (r.error_percent > 0 ? " high" : " low") +
               (readings.size() > 1 ? " (read as " + r.reading + ")" : "");
  }
}

// One claim of the table, evaluated (the geometries loaded once per model).
Result<ClaimResult> EvaluateClaim(const json& c, std::map<std::string, Geometry>* geometries) {
  auto str = [&](const char* key) -> std::string {
    return c.contains(key) && c[key].is_string() ? c[key].get<std::string>() : std::string();
  };
  ClaimResult r;
  r.id = str("id");
  r.column = str("column");
  std::string model = str("model"), kv_format = str("kv_format"), quantity = str("quantity"), unit = str("unit");
  std::string claimed = str("claimed"), context = str("context"), layer_kind = str("layer_kind");
  // "exact": the claim states an exact figure (a byte count per token), so rounding is no excuse.
  const bool exact_claim = c.contains("exact") && c["exact"].is_boolean() && c["exact"].get<bool>();
  if (r.id.empty() || model.empty() || quantity.empty() || claimed.empty()) {
    return InvalidArgument("claims", "each claim needs id, model, quantity and claimed");
  }
  r.claimed = claimed + " " + unit;
  TESSERA_ASSIGN_OR_RETURN(Decimal value, ParseDecimal(claimed, r.id));
  if (!geometries->count(model)) {
    TESSERA_ASSIGN_OR_RETURN(Geometry g, LoadPreset(model));
    geometries->emplace(model, std::move(g));
  }
  const Geometry& g = geometries->at(model);
  LedgerOptions opts;
  opts.kv_format = kv_format;
  opts.context_tokens = 1 << 20;
  if (!context.empty()) {
    TESSERA_ASSIGN_OR_RETURN(opts.context_tokens, ParseTokenCount(context, "context"));
  }
  TESSERA_ASSIGN_OR_RETURN(Ledger ledger, ComputeLedger(g, opts));
  r.subject = model + " " + ledger.kv_format + (context.empty() ? "" : " @ " + context);

  std::vector<Reading> readings;
  Int128 num = 0, den = 1;
  TESSERA_RETURN_IF_ERROR(ReadQuantity(quantity, unit, layer_kind, model, g, ledger, &r, &readings, &num, &den));
  Judge(value, exact_claim, unit, readings, num, den, &r);
  return r;
}

// A column's conclusion: its verdicts, the readings, and how far off the wrong values are.
std::string ColumnFinding(const ClaimCheck& check, const std::string& col) {
  int correct = 0, mislabeled = 0, wrong = 0;
  std::map<std::string, int> readings;
  double min_err = 1e300, max_err = -1e300;
  std::string exact_values;
  for (const ClaimResult& r : check.results) {
    if (r.column != col) continue;
    if (r.verdict == Verdict::kCorrect) ++correct;
    if (r.verdict == Verdict::kMislabeled) ++mislabeled;
    if (r.verdict == Verdict::kWrong) {
      ++wrong;
      min_err = std::min(min_err, r.error_percent);
      max_err = std::max(max_err, r.error_percent);
    }
    ++readings[r.reading];
  }
  std::string f = col + ": " + std::to_string(correct) + " correct, " + std::to_string(mislabeled) + " mislabeled, " +
                  std::to_string(wrong) + " wrong";
  std::string read_as;
  for (const auto& [name, count] : readings)
    read_as += (read_as.empty() ? "" : ", ") + std::to_string(count) + " read as " + name;
  f += " (" + read_as + ")";
  if (wrong > 0) {
    f += "; wrong values are off by " + FormatPercent(min_err) +
         (FormatPercent(min_err) == FormatPercent(max_err) ? "" : " to " + FormatPercent(max_err));
  }
  return f;
}

}  // namespace

Result<ClaimCheck> CheckClaims(std::string_view claims_json) {
  json doc;
  try {
    doc = json::parse(claims_json.begin(), claims_json.end());
  } catch (const json::parse_error& e) {
    return InvalidArgument("claims", "not valid JSON (byte " + std::to_string(e.byte) + ")");
  }
  if (!doc.is_object() || !doc.contains("claims") || !doc["claims"].is_array()) {
    return InvalidArgument("claims", "expected an object with a \"claims\" list");
  }
  ClaimCheck check;
  if (doc.contains("source") && doc["source"].is_string()) check.source = doc["source"].get<std::string>();

  std::map<std::string, Geometry> geometries;
  for (const json& c : doc["claims"]) {
    TESSERA_ASSIGN_OR_RETURN(ClaimResult r, EvaluateClaim(c, &geometries));
    check.results.push_back(std::move(r));
  }

  // Column conclusions.
  std::vector<std::string> columns;
  for (const ClaimResult& r : check.results) {
    if (std::find(columns.begin(), columns.end(), r.column) == columns.end()) columns.push_back(r.column);
  }
  for (const std::string& col : columns) check.findings.push_back(ColumnFinding(check, col));
  // A ratio that is the same exact fraction at every context is a constant, whatever the table prints.
  std::string ratio_exact;
  bool constant = true;
  int ratios = 0;
  for (const ClaimResult& r : check.results) {
    if (r.claimed.size() < 2 || r.claimed.substr(r.claimed.size() - 2) != " x") continue;
    ++ratios;
    if (ratio_exact.empty()) ratio_exact = r.exact;
    constant = constant && r.exact == ratio_exact;
  }
  if (ratios > 1 && constant) {
    check.findings.push_back("the MHA/MLA ratio is the same exact value at every context: " + ratio_exact +
                             " (printed differences are rounding artefacts)");
  }
  return check;
}

Result<ClaimCheck> CheckSeedClaims() {
  size_t n = 0;
  const data::EmbeddedFile* files = data::ClaimFiles(&n);
  for (size_t i = 0; i < n; ++i) {
    if (files[i].name == "seed-000") return CheckClaims(files[i].text);
  }
  return Internal("claims", "the seed claim table is not built in");
}

}  // namespace tessera

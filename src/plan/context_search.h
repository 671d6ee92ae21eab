// The longest-context search of `tessera plan`, over any source of per-phase bytes, exposed for
// its tests (which run it over fresh ledgers too). Internal to the plan module.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "tessera/checked.h"
#include "tessera/ledger.h"
#include "tessera/status.h"

namespace tessera::detail {

// The longest context in [0, hi] whose phase bytes x n fit the budget; `at(context)` gives a
// Result<PhaseTotals> (one request, one rank). Assumes the bytes never shrink as the context
// grows (tests check the answer's neighbours). The bytes are close to linear in the context, so
// each round probes the linear interpolation between the bracket's ends, then a point just
// across it, and bisects when that did not halve the bracket: a few probes instead of log2(hi).
// REQUIRES: n > 0, hi > 0.
template <class At>
Result<uint64_t> LongestContext(At&& at, size_t phase, uint64_t n, uint64_t budget, uint64_t hi) {
  const uint64_t limit = budget / n;  // fits <=> bytes <= limit
  TESSERA_ASSIGN_OR_RETURN(PhaseTotals top, at(hi));
  if (top[phase] <= limit) return hi;
  // Anchored at one token: when that does not fit nothing does, and the interpolation starts
  // from a real point (through zero, a fixed per-request cost would put the line far off).
  TESSERA_ASSIGN_OR_RETURN(PhaseTotals first, at(uint64_t{1}));
  if (first[phase] > limit) return uint64_t{0};
  uint64_t lo = 1, b_lo = first[phase], b_hi = top[phase];  // lo fits; hi does not
  auto probe = [&](uint64_t c) -> Status {
    if (c <= lo || c >= hi) return Status::Ok();
    TESSERA_ASSIGN_OR_RETURN(PhaseTotals b, at(c));
    if (b[phase] <= limit) {
      lo = c;
      b_lo = b[phase];
    } else {
      hi = c;
      b_hi = b[phase];
    }
    return Status::Ok();
  };
  while (hi - lo > 1) {
    const uint64_t width = hi - lo;
    uint64_t guess = lo + width / 2;
    if (b_hi > b_lo && limit >= b_lo) {
      guess = lo + static_cast<uint64_t>(static_cast<Int128>(limit - b_lo) * width / (b_hi - b_lo));
      guess = std::clamp<uint64_t>(guess, lo + 1, hi - 1);
    }
    TESSERA_RETURN_IF_ERROR(probe(guess));
    const uint64_t step = std::max<uint64_t>(1, width >> 6);
    TESSERA_RETURN_IF_ERROR(probe(lo == guess ? guess + step : guess > step ? guess - step : 0));
    if (hi - lo > width / 2) TESSERA_RETURN_IF_ERROR(probe(lo + (hi - lo) / 2));
  }
  return lo;
}

}  // namespace tessera::detail

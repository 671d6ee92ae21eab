// Byte counts for people: always labeled, binary and decimal side by side.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tessera/status.h"

namespace tessera {

// "9,210,691,584 B (8.578125 GiB, 9.211 GB)". Binary figures are exact when they terminate
// within 9 places, decimal ones are rounded to 4 significant places and marked "~" when rounded.
std::string FormatBytes(uint64_t bytes);
// "8.578125 GiB" / "9.211 GB" alone; the largest unit in which the value is >= 1.
std::string FormatBinary(uint64_t bytes);
std::string FormatDecimal(uint64_t bytes);
// 9210691584 -> "9,210,691,584".
std::string WithThousands(uint64_t v);

// Token counts as model cards write them: "8192", "128k" (= 131072), "1m" (= 1048576), "1M".
// `field` names the option in the error.
Result<uint64_t> ParseTokenCount(std::string_view text, std::string_view field);
// A byte size: a plain integer, or with a unit B, KiB, MiB, GiB, TiB (binary) or kB, MB, GB, TB
// (decimal): "64MiB", "1.5"-style fractions are refused. `field` names the option in the error.
Result<uint64_t> ParseByteSize(std::string_view text, std::string_view field);
// A plain non-negative integer (no suffix); `field` names the option in the error.
Result<uint64_t> ParseUnsigned(std::string_view text, std::string_view field);

}  // namespace tessera

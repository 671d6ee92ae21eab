#include "tessera/codec.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <string>
#include <string_view>

namespace tessera {
namespace {

constexpr uint32_t kFloatSignBit = 0x80000000u;

uint32_t FloatBits(float x) { return std::bit_cast<uint32_t>(x); }

// Rounds q >= 0 (q < 2^23, so q - floor(q) is exact) to the nearest integer, ties to even, without
// depending on the floating-point environment's rounding mode.
uint32_t RoundHalfEven(float q) {
  const float r = std::floor(q);
  const float d = q - r;
  auto n = static_cast<uint32_t>(r);
  if (d > 0.5f || (d == 0.5f && (n & 1u) != 0)) ++n;
  return n;
}

// The magnitude code (biased exponent << mbits | mantissa) of the minifloat nearest to a, ties to
// even, for 0 <= a <= the format's largest finite value. `bias` fixes the smallest normal
// exponent emin = 1 - bias. Rounding up out of a binade carries into the exponent field, which
// is exactly the next code, so the arithmetic needs no special case (nor does rounding a
// subnormal up to the smallest normal).
uint32_t RoundMagnitude(float a, int mbits, int bias) {
  const int emin = 1 - bias;
  if (a < std::ldexp(1.0f, emin)) {
    // Subnormal range: units of 2^(emin - mbits); the code is the unit count.
    return RoundHalfEven(std::ldexp(a, mbits - emin));
  }
  int exp = 0;
  std::frexp(a, &exp);                                         // a = f · 2^exp, f in [0.5, 1)
  const int e = exp - 1;                                       // a in [2^e, 2^(e+1))
  const uint32_t n = RoundHalfEven(std::ldexp(a, mbits - e));  // in [2^mbits, 2^(mbits+1)]
  return (static_cast<uint32_t>(e + bias) << mbits) + n - (1u << mbits);
}

void StoreLe16(uint16_t v, std::byte* p) {
  p[0] = static_cast<std::byte>(v & 0xFFu);
  p[1] = static_cast<std::byte>(v >> 8);
}
uint16_t LoadLe16(const std::byte* p) {
  return static_cast<uint16_t>(std::to_integer<uint16_t>(p[0]) | (std::to_integer<uint16_t>(p[1]) << 8));
}
void StoreLe32(uint32_t v, std::byte* p) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xFFu);
}
uint32_t LoadLe32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::to_integer<uint32_t>(p[i]) << (8 * i);
  return v;
}

Status CheckSize(std::string field, size_t got, size_t want, std::string_view what) {
  if (got == want) return Status::Ok();
  return InvalidArgument(std::move(field),
                         "expected " + std::to_string(want) + " " + std::string(what) + ", got " + std::to_string(got));
}

// Max |x| over `values`, or an error naming `field` at the first non-finite value.
Result<float> FiniteAmax(std::span<const float> values, size_t base, const std::string& field) {
  float amax = 0.0f;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return InvalidArgument(field, "value at index " + std::to_string(base + i) + " is not finite");
    }
    amax = std::max(amax, std::fabs(values[i]));
  }
  return amax;
}

void StoreRope(std::span<const float> rope, std::byte* out) {
  for (size_t i = 0; i < rope.size(); ++i) StoreLe16(FloatToBf16(rope[i]), out + 2 * i);
}
void LoadRope(const std::byte* in, std::span<float> rope) {
  for (size_t i = 0; i < rope.size(); ++i) rope[i] = Bf16ToFloat(LoadLe16(in + 2 * i));
}

}  // namespace

// ----- E4M3 -----

float DecodeE4M3(uint8_t code) {
  const bool negative = (code & 0x80u) != 0;
  const int e = (code >> 3) & 0xF;
  const int m = code & 0x7;
  if (e == 0xF && m == 0x7) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude =
      e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(static_cast<float>(8 + m), e - 10);
  return negative ? -magnitude : magnitude;
}

uint8_t EncodeE4M3(float x) {
  const uint8_t sign = (FloatBits(x) & kFloatSignBit) != 0 ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<uint8_t>(sign | kE4M3NaN);
  const float a = std::fabs(x);
  if (a >= kE4M3Max) return static_cast<uint8_t>(sign | kE4M3MaxCode);  // saturate, including inf
  return static_cast<uint8_t>(sign | RoundMagnitude(a, 3, 7));
}

// ----- UE8M0 -----

float DecodeUE8M0(uint8_t code) {
  if (code == kUE8M0NaN) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(code) - 127);
}

uint8_t EncodeUE8M0Ceil(float x) {
  if (std::isnan(x)) return kUE8M0NaN;
  if (!(x > 0.0f)) return 0x00;  // zero, negative, -inf
  const uint32_t bits = FloatBits(x);
  const uint32_t exponent = bits >> 23;  // sign is 0 here
  const uint32_t mantissa = bits & 0x7FFFFFu;
  if (exponent == 0) {
    // Subnormal: x = mantissa · 2^-149; 2^-127 is mantissa 2^22.
    return mantissa <= (1u << 22) ? 0x00 : 0x01;
  }
  // Normal x = 2^(exponent-127) · (1 + mantissa/2^23): the code of 2^(exponent-127) is `exponent`.
  const uint32_t code = mantissa == 0 ? exponent : exponent + 1;
  return static_cast<uint8_t>(std::min<uint32_t>(code, 0xFE));  // > 2^127 and +inf clamp to 2^127
}

// ----- E2M1 -----

float DecodeE2M1(uint8_t nibble) {
  const bool negative = (nibble & 0x8u) != 0;
  const int e = (nibble >> 1) & 0x3;
  const int m = nibble & 0x1;
  const float magnitude = e == 0 ? std::ldexp(static_cast<float>(m), -1) : std::ldexp(static_cast<float>(2 + m), e - 2);
  return negative ? -magnitude : magnitude;
}

uint8_t EncodeE2M1(float x) {
  const uint8_t sign = (FloatBits(x) & kFloatSignBit) != 0 ? 0x8 : 0x0;
  if (std::isnan(x)) return sign;
  const float a = std::fabs(x);
  if (a >= kE2M1Max) return static_cast<uint8_t>(sign | 0x7);
  return static_cast<uint8_t>(sign | RoundMagnitude(a, 1, 1));
}

Status PackE2M1(std::span<const float> values, std::span<uint8_t> packed) {
  TESSERA_RETURN_IF_ERROR(CheckSize("packed", packed.size(), (values.size() + 1) / 2, "bytes"));
  for (size_t i = 0; i < packed.size(); ++i) {
    const uint8_t lo = EncodeE2M1(values[2 * i]);
    const uint8_t hi = 2 * i + 1 < values.size() ? EncodeE2M1(values[2 * i + 1]) : 0;
    packed[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
  return Status::Ok();
}

Status UnpackE2M1(std::span<const uint8_t> packed, std::span<float> values) {
  if (values.size() != 2 * packed.size() && values.size() + 1 != 2 * packed.size()) {
    return InvalidArgument("values", "expected " + std::to_string(2 * packed.size()) + " or " +
                                         std::to_string(2 * packed.size() - (packed.empty() ? 0 : 1)) + " floats for " +
                                         std::to_string(packed.size()) + " packed bytes, got " +
                                         std::to_string(values.size()));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    const uint8_t byte = packed[i / 2];
    values[i] = DecodeE2M1(i % 2 == 0 ? static_cast<uint8_t>(byte & 0xFu) : static_cast<uint8_t>(byte >> 4));
  }
  return Status::Ok();
}

// ----- bf16 -----

uint16_t FloatToBf16(float x) {
  const uint32_t bits = FloatBits(x);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  // Adding 0x7FFF plus the lowest kept bit rounds the dropped half to nearest, ties to even; a
  // carry out of the mantissa bumps the exponent (up to infinity), which is what RNE wants.
  const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

float Bf16ToFloat(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

// ----- scale formats -----

std::string_view ScaleFormatName(ScaleFormat format) { return format == ScaleFormat::kAmax ? "amax" : "ue8m0"; }

Result<ScaleFormat> ParseScaleFormat(std::string_view name, std::string_view field) {
  if (name == "amax") return ScaleFormat::kAmax;
  if (name == "ue8m0") return ScaleFormat::kUe8m0;
  return InvalidArgument(std::string(field), "unknown scale format \"" + std::string(name) + "\" (known: amax, ue8m0)");
}

namespace {

// The power of two >= q, as a float (q > 0 and finite).
float Ue8m0Scale(float q) { return DecodeUE8M0(EncodeUE8M0Ceil(q)); }

constexpr float kFlashMlaScaleFloor = 1e-4f;  // FlashMLA tests/quant.py: clamp_min(scale_inv, 1e-4)
constexpr float kIndexerAmaxFloor = 1e-4f;    // vLLM indexer_k_quant_and_cache: fmaxf(amax, 1e-4)

float DsMlaTileScale(float amax, ScaleFormat format) {
  if (format == ScaleFormat::kUe8m0) return Ue8m0Scale(std::max(amax / kE4M3Max, kFlashMlaScaleFloor));
  return std::max(amax / kE4M3Max, FLT_MIN);
}

float IndexerScale(float amax, ScaleFormat format) {
  const float q = std::max(amax, kIndexerAmaxFloor) / kE4M3Max;
  return format == ScaleFormat::kUe8m0 ? Ue8m0Scale(q) : q;
}

}  // namespace

// ----- fp8_ds_mla -----

Status QuantizeFp8DsMla(std::span<const float> latent, std::span<const float> rope, std::span<std::byte> record,
                        ScaleFormat scales) {
  TESSERA_RETURN_IF_ERROR(CheckSize("latent", latent.size(), kFp8DsMlaLatentDim, "floats"));
  TESSERA_RETURN_IF_ERROR(CheckSize("rope", rope.size(), kFp8DsMlaRopeDim, "floats"));
  TESSERA_RETURN_IF_ERROR(CheckSize("record", record.size(), kFp8DsMlaRecordBytes, "bytes"));
  for (size_t t = 0; t < kFp8DsMlaTiles; ++t) {
    const std::span<const float> tile = latent.subspan(t * kFp8DsMlaTileSize, kFp8DsMlaTileSize);
    TESSERA_ASSIGN_OR_RETURN(const float amax, FiniteAmax(tile, t * kFp8DsMlaTileSize, "latent"));
    const float scale = DsMlaTileScale(amax, scales);
    StoreLe32(FloatBits(scale), record.data() + kFp8DsMlaScaleOffset + 4 * t);
    for (size_t i = 0; i < tile.size(); ++i) {
      record[t * kFp8DsMlaTileSize + i] = static_cast<std::byte>(EncodeE4M3(tile[i] / scale));
    }
  }
  StoreRope(rope, record.data() + kFp8DsMlaRopeOffset);
  return Status::Ok();
}

Status DequantizeFp8DsMla(std::span<const std::byte> record, std::span<float> latent, std::span<float> rope) {
  TESSERA_RETURN_IF_ERROR(CheckSize("record", record.size(), kFp8DsMlaRecordBytes, "bytes"));
  TESSERA_RETURN_IF_ERROR(CheckSize("latent", latent.size(), kFp8DsMlaLatentDim, "floats"));
  TESSERA_RETURN_IF_ERROR(CheckSize("rope", rope.size(), kFp8DsMlaRopeDim, "floats"));
  for (size_t t = 0; t < kFp8DsMlaTiles; ++t) {
    const float scale = std::bit_cast<float>(LoadLe32(record.data() + kFp8DsMlaScaleOffset + 4 * t));
    for (size_t i = t * kFp8DsMlaTileSize; i < (t + 1) * kFp8DsMlaTileSize; ++i) {
      latent[i] = DecodeE4M3(std::to_integer<uint8_t>(record[i])) * scale;
    }
  }
  LoadRope(record.data() + kFp8DsMlaRopeOffset, rope);
  return Status::Ok();
}

// ----- indexer fp8 -----

Status QuantizeIndexerFp8(std::span<const float> key, std::span<std::byte> record, ScaleFormat scales) {
  if (key.empty()) return InvalidArgument("key", "empty key");
  TESSERA_RETURN_IF_ERROR(CheckSize("record", record.size(), key.size() + 4, "bytes"));
  TESSERA_ASSIGN_OR_RETURN(const float amax, FiniteAmax(key, 0, "key"));
  const float scale = IndexerScale(amax, scales);
  for (size_t i = 0; i < key.size(); ++i) record[i] = static_cast<std::byte>(EncodeE4M3(key[i] / scale));
  StoreLe32(FloatBits(scale), record.data() + key.size());
  return Status::Ok();
}

Status DequantizeIndexerFp8(std::span<const std::byte> record, std::span<float> key) {
  if (key.empty()) return InvalidArgument("key", "empty key");
  TESSERA_RETURN_IF_ERROR(CheckSize("record", record.size(), key.size() + 4, "bytes"));
  const float scale = std::bit_cast<float>(LoadLe32(record.data() + key.size()));
  for (size_t i = 0; i < key.size(); ++i) key[i] = DecodeE4M3(std::to_integer<uint8_t>(record[i])) * scale;
  return Status::Ok();
}

// ----- V4 fp8 -----

Status QuantizeV4Fp8(std::span<const float> nope, std::span<const float> rope, std::span<std::byte> data_row,
                     std::span<std::byte> scale_row) {
  TESSERA_RETURN_IF_ERROR(CheckSize("nope", nope.size(), kV4NopeDim, "floats"));
  TESSERA_RETURN_IF_ERROR(CheckSize("rope", rope.size(), kV4RopeDim, "floats"));
  TESSERA_RETURN_IF_ERROR(CheckSize("data_row", data_row.size(), kV4DataRowBytes, "bytes"));
  TESSERA_RETURN_IF_ERROR(CheckSize("scale_row", scale_row.size(), kV4ScaleRowBytes, "bytes"));
  for (size_t t = 0; t < kV4Tiles; ++t) {
    const std::span<const float> tile = nope.subspan(t * kV4TileSize, kV4TileSize);
    TESSERA_ASSIGN_OR_RETURN(const float amax, FiniteAmax(tile, t * kV4TileSize, "nope"));
    const uint8_t scale_code = EncodeUE8M0Ceil(std::max(amax / kE4M3Max, kV4ScaleFloor));
    const float scale = DecodeUE8M0(scale_code);
    scale_row[t] = static_cast<std::byte>(scale_code);
    for (size_t i = 0; i < tile.size(); ++i) {
      data_row[t * kV4TileSize + i] = static_cast<std::byte>(EncodeE4M3(tile[i] / scale));
    }
  }
  scale_row[kV4Tiles] = std::byte{0};
  StoreRope(rope, data_row.data() + kV4RopeOffset);
  return Status::Ok();
}

Status DequantizeV4Fp8(std::span<const std::byte> data_row, std::span<const std::byte> scale_row, std::span<float> nope,
                       std::span<float> rope) {
  TESSERA_RETURN_IF_ERROR(CheckSize("data_row", data_row.size(), kV4DataRowBytes, "bytes"));
  TESSERA_RETURN_IF_ERROR(CheckSize("scale_row", scale_row.size(), kV4ScaleRowBytes, "bytes"));
  TESSERA_RETURN_IF_ERROR(CheckSize("nope", nope.size(), kV4NopeDim, "floats"));
  TESSERA_RETURN_IF_ERROR(CheckSize("rope", rope.size(), kV4RopeDim, "floats"));
  for (size_t t = 0; t < kV4Tiles; ++t) {
    const float scale = DecodeUE8M0(std::to_integer<uint8_t>(scale_row[t]));
    for (size_t i = t * kV4TileSize; i < (t + 1) * kV4TileSize; ++i) {
      nope[i] = DecodeE4M3(std::to_integer<uint8_t>(data_row[i])) * scale;
    }
  }
  LoadRope(data_row.data() + kV4RopeOffset, rope);
  return Status::Ok();
}

}  // namespace tessera

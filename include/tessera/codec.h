// Reference number-format codecs: the element encodings the cache formats of format.h store.
//
// Scalar, bit-exact, unoptimized reference implementations of
//   - FP8 E4M3 as defined by OCP 8-bit FP (OFP8) / OCP Microscaling (MX) v1.0, the "E4M3FN"
//     flavour FlashMLA and DeepSeek use: sign, 4 exponent bits (bias 7), 3 mantissa bits, no
//     infinities, S.1111.111 (0x7F / 0xFF) is NaN, max finite 448, min subnormal 2^-9;
//   - UE8M0, the MX shared scale: unsigned, 8 exponent bits (bias 127), value 2^(e-127), 0xFF NaN;
//   - FP4 E2M1, the MX element type: sign, 2 exponent bits (bias 1), 1 mantissa bit, values
//     ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}, no infinities and no NaN;
//   - bf16 (the upper half of an IEEE binary32);
// and the two DeepSeek fp8 KV records built on them (fp8_ds_mla for V3/V3.2, the V4 "MODEL1"
// record). They are the ground truth that kernels and engine ports are checked against, not a
// fast path.
//
// Rounding: every narrowing conversion rounds to nearest, ties to even (RNE), computed exactly
// (no dependence on the floating-point environment's rounding mode). Conversions to E4M3 and E2M1
// are *saturating*: finite values beyond the largest finite magnitude become ±max, as FlashMLA's
// and vLLM's quantizers clamp before casting (CUDA's __NV_SATFINITE).
//
// Byte order: multi-byte fields inside records (fp32 scales, bf16 values) are little-endian,
// whatever the host.
//
// Errors: functions that take spans check their sizes and return kInvalidArgument naming the span
// ("latent", "rope", "record", ...); on error nothing useful was written to the outputs.
//
// Thread-safety: every function is pure (no global state); all are safe to call concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <string_view>

#include "tessera/status.h"

namespace tessera {

// ---------------------------------------------------------------------------------------------
// FP8 E4M3 (E4M3FN)

inline constexpr float kE4M3Max = 448.0f;
inline constexpr uint8_t kE4M3NaN = 0x7F;      // canonical NaN; 0xFF (negative sign) is NaN too
inline constexpr uint8_t kE4M3MaxCode = 0x7E;  // +448

// Exact value of `code`: ±2^(e-7)·(1+m/8) for e in 1..15, ±2^-6·(m/8) for e = 0 (so 0x80 is -0),
// quiet NaN for 0x7F and 0xFF. Every E4M3 value is exactly representable as a float.
float DecodeE4M3(uint8_t code);

// RNE, saturating. Finite |x| > 448 → ±448 (0x7E / 0xFE). ±inf → ±448 (saturated like any other
// out-of-range value, not mapped to NaN: the format has no infinity and the quantizers clamp).
// NaN → 0x7F with the sign bit of the input copied (a negative NaN gives 0xFF), as torch's
// float8_e4m3fn cast does. -0 → 0x80; values that round to zero keep their sign.
uint8_t EncodeE4M3(float x);

// ---------------------------------------------------------------------------------------------
// UE8M0 (MX shared scale)

inline constexpr uint8_t kUE8M0NaN = 0xFF;

// 2^(code-127) for code 0..254 (2^-127 is a float subnormal, exactly representable; 2^127 is the
// largest). 0xFF → quiet NaN.
float DecodeUE8M0(uint8_t code);

// The code of the smallest representable power of two >= x: how DeepSeek picks tile scales
// (scale = 2^ceil(log2(amax/448))). Exact powers of two map to their own code; anything strictly
// between two powers rounds up. Computed from the float's bits, so it is exact where torch's
// `pow(2, log2(x).ceil())` in float32 can return the lower power for x within a few ulps above
// a power of two.
//   x <= 2^-127, including +0, -0, negative values and -inf → 0x00 (2^-127, the smallest scale:
//     it is the smallest representable value >= x);
//   x > 2^127, including +inf → 0xFE (2^127, clamped: no representable value is >= x);
//   NaN → 0xFF.
uint8_t EncodeUE8M0Ceil(float x);

// ---------------------------------------------------------------------------------------------
// FP4 E2M1 (MX element)

inline constexpr float kE2M1Max = 6.0f;

// Value of the low 4 bits of `nibble` (the high 4 bits are ignored): bit 3 sign, bits 2..1
// exponent, bit 0 mantissa. 0x8 is -0.
float DecodeE2M1(uint8_t nibble);

// RNE, saturating: |x| > 6 (including ±inf) → ±6. The format has no NaN; NaN → ±0 (sign of the
// input kept), a documented choice (an MX block carries NaN in its shared scale, not in elements).
// -0 → 0x8. Returns a value in 0x0..0xF.
uint8_t EncodeE2M1(float x);

// Packs values two per byte, element 2i in the LOW nibble and element 2i+1 in the high nibble
// (OCP MX convention). `packed` must hold exactly ceil(values.size()/2) bytes; for an odd count
// the last byte's high nibble is written as 0.
Status PackE2M1(std::span<const float> values, std::span<uint8_t> packed);
// Inverse of PackE2M1: `values` must hold 2·packed.size() or 2·packed.size()-1 floats (in the
// odd case the last byte's high nibble is ignored).
Status UnpackE2M1(std::span<const uint8_t> packed, std::span<float> values);

// ---------------------------------------------------------------------------------------------
// bf16

// RNE on the low 16 bits. NaN stays NaN (sign kept, quiet bit forced so a payload held only in
// the dropped bits cannot turn into infinity). Finite values that round past the largest bf16
// become ±inf, as RNE prescribes (bf16 has infinities).
uint16_t FloatToBf16(float x);
// Exact.
float Bf16ToFloat(uint16_t bits);

// ---------------------------------------------------------------------------------------------
// Scale formats of the fp32 scales in fp8_ds_mla and indexer-fp8 records: how a tile's scale is
// picked from its amax (max |x|). Both store the scale as a float32; they differ in its value.
// Which one each engine writes was measured against the engines' own writers (ADR 0033,
// tests/codec_engine_bytes_test.cc):
//   kAmax   the raw float32 quotient (vLLM's concat_and_cache_ds_mla for fp8_ds_mla);
//   kUe8m0  the power of two >= the quotient, 2^ceil(log2(q)) (vLLM's indexer_k_quant_and_cache
//           with scale_fmt "ue8m0", which vLLM's DeepSeek-V3.2 passes; FlashMLA's reference
//           quantizer tests/quant.py for fp8_ds_mla).
enum class ScaleFormat { kAmax, kUe8m0 };
std::string_view ScaleFormatName(ScaleFormat format);  // "amax", "ue8m0"
// Errors: kInvalidArgument on `field` for another name.
Result<ScaleFormat> ParseScaleFormat(std::string_view name, std::string_view field = "scale-format");

// ---------------------------------------------------------------------------------------------
// fp8_ds_mla record (DeepSeek V3 / V3.2, FlashMLA sparse, vLLM "fp8_ds_mla"): 656 bytes per token
//   [0, 512)    512 e4m3: latent[i] / scale[i / 128]
//   [512, 528)  4 fp32 scales, little-endian, one per 128-value tile
//   [528, 656)  64 bf16 rope values, little-endian, RNE from float (not quantized)
// Tile scale, kAmax (the default: what vLLM's concat_and_cache_ds_mla writes): max(amax / 448,
// FLT_MIN) in float32 (amax = max |x| over the tile), a raw fp32, FLT_MIN for an all-zero tile, so
// the scale stays a normal float and x/scale cannot overflow. kUe8m0 (FlashMLA's reference
// quantizer): 2^ceil(log2(max(amax / 448, 1e-4))), 2^-13 for an all-zero tile. Values are stored as
// EncodeE4M3(x / scale) (float division, then RNE, saturating).

inline constexpr size_t kFp8DsMlaLatentDim = 512;
inline constexpr size_t kFp8DsMlaRopeDim = 64;
inline constexpr size_t kFp8DsMlaTileSize = 128;
inline constexpr size_t kFp8DsMlaTiles = kFp8DsMlaLatentDim / kFp8DsMlaTileSize;            // 4
inline constexpr size_t kFp8DsMlaScaleOffset = kFp8DsMlaLatentDim;                          // 512
inline constexpr size_t kFp8DsMlaRopeOffset = kFp8DsMlaScaleOffset + 4 * kFp8DsMlaTiles;    // 528
inline constexpr size_t kFp8DsMlaRecordBytes = kFp8DsMlaRopeOffset + 2 * kFp8DsMlaRopeDim;  // 656

// Spans: latent 512, rope 64, record 656 bytes. Errors on "latent" when a latent value is not
// finite (a NaN or inf would poison the tile scale); rope values are converted as FloatToBf16
// does (NaN and inf pass through).
Status QuantizeFp8DsMla(std::span<const float> latent, std::span<const float> rope, std::span<std::byte> record,
                        ScaleFormat scales = ScaleFormat::kAmax);
// latent[i] = DecodeE4M3(byte i) * scale (one float multiply); rope = Bf16ToFloat. Engines round
// the products to bf16 afterwards; this returns them unrounded. Stored bytes are not validated
// (a NaN code or scale yields NaN).
Status DequantizeFp8DsMla(std::span<const std::byte> record, std::span<float> latent, std::span<float> rope);

// ---------------------------------------------------------------------------------------------
// indexer-fp8 record (DeepSeek-V3.2 lightning-indexer key): D e4m3 values key[i] / scale, then
// one fp32 scale, little-endian (D + 4 bytes; 132 for D = 128). The scale, as vLLM's
// indexer_k_quant_and_cache computes it: q = max(amax, 1e-4) / 448 in float32 over the whole key;
// kUe8m0 (the default: vLLM's DeepSeek-V3.2 passes scale_fmt "ue8m0") then rounds q up to
// 2^ceil(log2(q)); kAmax keeps q.

// Spans: key D floats, record D + 4 bytes (D > 0). Errors on "key" when a value is not finite.
Status QuantizeIndexerFp8(std::span<const float> key, std::span<std::byte> record,
                          ScaleFormat scales = ScaleFormat::kUe8m0);
// key[i] = DecodeE4M3(byte i) * scale (one float multiply). Stored bytes are not validated.
Status DequantizeIndexerFp8(std::span<const std::byte> record, std::span<float> key);

// ---------------------------------------------------------------------------------------------
// V4 fp8 record (DeepSeek V4, FlashMLA "MODEL1"): 584 bytes per token in two rows, which
// region-major pages store apart (all data rows of a page, then all scale rows):
//   data row (576 B):  [0, 448) 448 e4m3 nope values: nope[i] / scale[i / 64]
//                      [448, 576) 64 bf16 rope values, little-endian, RNE from float
//   scale row (8 B):   7 ue8m0 tile scales, then one zero pad byte
// Tile scale = 2^ceil(log2(max(amax/448, 1e-4))) = DecodeUE8M0(EncodeUE8M0Ceil(max(amax/448,
// 1e-4f))), all in float32, as FlashMLA's reference quantizer (the 1e-4 floor matches its
// FP8_AMAX_MARGIN; an all-zero tile gets 2^-13). Because the scale is a power of two >= amax/448,
// x / scale is exact (barring float underflow) and at most 448 (up to the float rounding of
// amax/448, which RNE absorbs), and dequantization (e4m3 · 2^k) is exact.

inline constexpr size_t kV4NopeDim = 448;
inline constexpr size_t kV4RopeDim = 64;
inline constexpr size_t kV4TileSize = 64;
inline constexpr size_t kV4Tiles = kV4NopeDim / kV4TileSize;               // 7
inline constexpr size_t kV4RopeOffset = kV4NopeDim;                        // 448
inline constexpr size_t kV4DataRowBytes = kV4RopeOffset + 2 * kV4RopeDim;  // 576
inline constexpr size_t kV4ScaleRowBytes = kV4Tiles + 1;                   // 8
inline constexpr float kV4ScaleFloor = 1e-4f;

// Spans: nope 448, rope 64, data_row 576 bytes, scale_row 8 bytes. Errors on "nope" when a nope
// value is not finite; rope values are converted as FloatToBf16 does.
Status QuantizeV4Fp8(std::span<const float> nope, std::span<const float> rope, std::span<std::byte> data_row,
                     std::span<std::byte> scale_row);
// nope[i] = DecodeE4M3(byte i) * DecodeUE8M0(scale[i / 64]); rope = Bf16ToFloat. The pad byte is
// ignored; stored bytes are not validated (a 0xFF scale yields NaN, a code·scale past FLT_MAX inf).
Status DequantizeV4Fp8(std::span<const std::byte> data_row, std::span<const std::byte> scale_row, std::span<float> nope,
                       std::span<float> rope);

}  // namespace tessera

// Record formats as data.
//
// A record is what one cache entry (one token, or one compressed group) stores in one layer.
// It is an ordered list of regions {name, element type, count}, each with its own precision,
// plus a packing rule and a page alignment. There is no single dtype field: a DeepSeek-V4 fp8
// record holds e4m3 content, a bf16 RoPE slice and ue8m0 scales.
//
// Packing:
//   kPerToken   — regions of one record are contiguous; records follow each other.
//   kRegionMajor — within a page, all entries' plane-0 bytes come first (e.g. the 576-B rows of
//                  v4-fp8, the 128-B keys of indexer-fp8), then all plane-1 bytes (the 8-B scale
//                  rows, the 4-B key scales), and so on.
// A record's bytes in per-token order (CopyRecordOut) are its planes in plane order, whatever the
// packing: regions are listed plane by plane.
//
// Thread-safety: values; const access is safe from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/codec.h"
#include "tessera/geometry.h"
#include "tessera/status.h"

namespace tessera {

enum class ElementType { kBf16, kFp16, kFp32, kFp8E4M3, kUe8m0, kFp4E2M1, kPad8 };
uint32_t ElementBits(ElementType type);
std::string_view ElementTypeName(ElementType type);

enum class Packing { kPerToken, kRegionMajor };
std::string_view PackingName(Packing packing);  // "per-token", "region-major"
// Errors: kInvalidArgument on `field` for another name.
Result<Packing> ParsePacking(std::string_view name, std::string_view field = "indexer-layout");

struct Region {
  std::string name;
  ElementType type = ElementType::kBf16;
  uint64_t count = 0;
  uint32_t plane = 0;  // region-major packing groups regions of one plane into one row
  uint64_t bits() const { return count * ElementBits(type); }
  friend bool operator==(const Region&, const Region&) = default;
};

// Which cache a format can store.
enum class FormatUse { kKv, kLatent, kIndexer, kState };
std::string_view FormatUseName(FormatUse use);

// What a record is, whatever it is called. Code that treats records differently asks this (or a
// field such as page_alignment), never the name: names are for people and for --kv-format.
enum class FormatFamily {
  kMha,              // per-head K and V of an MHA/GQA model (mha-bf16, mha-fp8)
  kExpanded,         // an MLA model expanded to per-head K and V (expanded-bf16)
  kMlaLatent,        // MLA latent + RoPE at one precision (mla-bf16, mla-fp16, mla-fp8)
  kFp8DsMla,         // FlashMLA's DeepSeek-V3.x fp8 record (fp8_ds_mla)
  kV4Fp8,            // FlashMLA's DeepSeek-V4 record (v4-fp8): the one vLLM and SGLang serve V4 with
  kV41Fp8,           // DeepSeek-V4.1 (v41-fp8)
  kSeed,             // the seed note's structural records, without scales (v4-seed, indexer-fp4-seed)
  kIndexer,          // lightning-indexer keys (indexer-fp8, indexer-mxfp4)
  kCompressorState,  // DeepSeek-V4 fp32 compressor state
  kLinearState,      // linear attention's convolution rows and recurrent state
};

struct RecordFormat {
  std::string name;
  std::string description;
  FormatUse use = FormatUse::kLatent;
  FormatFamily family = FormatFamily::kMlaLatent;
  std::vector<Region> regions;
  Packing packing = Packing::kPerToken;
  // Page bytes are padded up to a multiple of this (1 = no padding).
  uint64_t page_alignment = 1;
  // Records with fp32 tile scales (fp8_ds_mla, indexer-fp8): how the scales are picked. The
  // default is what the engine writes (fp8_ds_mla: vLLM's kAmax; indexer-fp8: vLLM's kUe8m0 for
  // DeepSeek-V3.2); a writer passes it to the codec (QuantizeFp8DsMla, QuantizeIndexerFp8). The
  // record's size does not depend on it.
  std::optional<ScaleFormat> scale_format;
  // indexer-fp8 only: the page layout is a named option (SetIndexerPacking). The default is
  // region-major, what vLLM's indexer_k_quant_and_cache_kernel and SGLang's DSA index buffer
  // write and DeepGEMM's paged MQA logits read (a block's keys, then its scales; ADR 0043).

  // Bytes of one record; every format here has whole-byte records (checked on build).
  uint64_t record_bytes() const;
  // Bytes of one record that fall in `plane`.
  uint64_t plane_bytes(uint32_t plane) const;
  uint32_t plane_count() const;
  // True when every region has the same element type (the cached shape is then in elements).
  bool single_element_type() const;
  uint64_t element_count() const;
  // "latent e4m3 x512 + scales fp32 x4 + rope bf16 x64"
  std::string RegionSummary() const;

  // Identity: every field equal (the same format built for the same geometry).
  friend bool operator==(const RecordFormat&, const RecordFormat&) = default;
};

struct FormatInfo {
  std::string name;
  FormatUse use;
  std::string description;
};
// Every format name BuildFormat accepts.
std::vector<FormatInfo> FormatCatalog();

// The dims a record format is built from: formats read these and nothing else of a model
// (docs/ARCHITECTURE.md, "Format -> Geometry"). FormatDimsOf gives a geometry's model-wide dims;
// a layer whose K and V differ (a sliding-window layer of MiMo-V2, a global layer of Gemma-4)
// replaces `kv` with its own.
struct FormatDims {
  std::string model;             // named in errors
  bool mla = false;              // has a latent (kv_lora_rank or compress_ratios)
  uint32_t attention_heads = 0;  // query heads (expanded-bf16 stores K and V per query head)
  KvDims kv;                     // per-head K and V of MHA/GQA records (MLA: query heads x v_head_dim)
  uint32_t qk_nope_head_dim = 0;
  uint32_t qk_rope_head_dim = 0;
  uint32_t v_head_dim = 0;
  uint32_t latent_dim = 0;  // content part of the MLA record
  uint32_t index_head_dim = 0;
};
FormatDims FormatDimsOf(const Geometry& g);

// Builds the named format for the dims (counts come from them). Errors on "kv-format" (or
// `field`) when the name is unknown or the dims cannot hold that record (an MLA format on an
// MHA model, a latent not divisible by the scale group, ...).
Result<RecordFormat> BuildFormat(std::string_view name, const FormatDims& dims, std::string_view field = "kv-format");
// BuildFormat(name, FormatDimsOf(g), field).
Result<RecordFormat> BuildFormat(std::string_view name, const Geometry& g, std::string_view field = "kv-format");

// DeepSeek-V4 compressor state: `floats` float32 values per slot.
RecordFormat CompressorStateFormat(uint32_t floats);
// A linear-attention layer's state (LinearStateDims): `conv` convolution values then
// `recurrent` recurrent-state values, each in its element type (bf16, fp16 or fp32).
RecordFormat LinearStateFormat(uint64_t conv, ElementType conv_type, uint64_t recurrent, ElementType recurrent_type);

// Where one record lives: a span per plane of its format (one plane for per-token formats; for
// region-major formats each plane's bytes sit in that plane's row of the page).
// Writable: handed to the KV writers while a block fills (RequestManager::Append) and by
// RequestManager::MutableRecord, which checks the block is still filling and not shared.
struct RecordView {
  std::array<std::span<std::byte>, 2> planes;
  uint32_t plane_count = 1;
};

// A read-only record: what RequestManager::Record and Entry return, since the block may be sealed
// (its bytes are final: the index, the tiers and later prefix hits serve them; issue 27.7, ADR
// 0039). The planes' element type is const, so a write through it does not compile.
struct ConstRecordView {
  std::array<std::span<const std::byte>, 2> planes;
  uint32_t plane_count = 1;
  ConstRecordView() = default;
  // NOLINTNEXTLINE(google-explicit-constructor): a writable view reads as a read-only one.
  ConstRecordView(const RecordView& v) : planes{v.planes[0], v.planes[1]}, plane_count(v.plane_count) {}
};

// A typed, read-only view of one region of one record.
struct RegionView {
  const Region* region = nullptr;
  std::span<const std::byte> bytes;
  uint64_t count() const { return region == nullptr ? 0 : region->count; }
  // Element i decoded to float (bf16, fp16, fp32, e4m3, ue8m0, e2m1 — packed two per byte, low
  // nibble first; pad reads 0). REQUIRES: i < count().
  float Get(uint64_t i) const;
};

// The region `name` of a record laid out by `format` in `record`. Errors: kNotFound on
// "region" for an unknown name; kInvalidArgument when the view is smaller than the format.
Result<RegionView> RegionOf(const RecordFormat& format, const ConstRecordView& record, std::string_view name);

// Lays an indexer-fp8 record out `packing`: region-major puts the key in plane 0 and its fp32
// scale in plane 1 (vLLM's and SGLang's page: a block's keys, then its scales); per-token keeps
// key and scale together. Errors: kInvalidArgument on `field` for any other format.
Status SetIndexerPacking(RecordFormat& format, Packing packing, std::string_view field = "indexer-layout");

// One record's bytes in per-token order (its planes back to back) from a view of any packing,
// and back. Errors: kInvalidArgument on "record" when the view's planes are smaller than the
// format's, on "bytes" when `bytes` is not record_bytes() long.
Status CopyRecordOut(const RecordFormat& format, const ConstRecordView& record, std::span<std::byte> bytes);
Status CopyRecordIn(const RecordFormat& format, std::span<const std::byte> bytes, const RecordView& record);

// An indexer-fp8 key written into / read from a record view of `format` (either packing), with
// the format's scale format (QuantizeIndexerFp8, DequantizeIndexerFp8). Errors: "indexer-format"
// for another format, and the codec's and CopyRecord*'s errors.
Status WriteIndexerFp8(const RecordFormat& format, std::span<const float> key, const RecordView& record);
Status ReadIndexerFp8(const RecordFormat& format, const ConstRecordView& record, std::span<float> key);

}  // namespace tessera

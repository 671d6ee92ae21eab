// Layout: the caches of a model as Tessera holds them — which record formats, which layers, the
// block token span and the bytes of one page — derived from geometry + format + kernel rules,
// each factor with its reason.
//
// This is the one piece of cache structure and page arithmetic that the ledger and the pools
// share (ComputeCacheLayout), so that the bytes the ledger predicts and the bytes the pools hold
// cannot drift apart. It knows no engine's sizing rules: the request manager links it without
// the ledger.
//
// Thread-safety: pure functions over values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/checked.h"
#include "tessera/format.h"
#include "tessera/geometry.h"
#include "tessera/status.h"

namespace tessera {

enum class Kernel {
  kFlashMla,       // FlashMLA: 64 entries per page
  kGeneric,        // no kernel preference beyond the hard constraints
  kCutlassMla,     // CUTLASS MLA: pages of 128 entries
  kFlashInferMla,  // FlashInfer MLA: pages of 32 (or 64) entries
};
std::string_view KernelName(Kernel kernel);
// Entries per page an MLA kernel reads (0 for kGeneric): FlashMLA 64, CUTLASS MLA 128, FlashInfer
// MLA 32 — the smallest page of each, what vLLM picks for it (docs/ENGINES.md).
uint32_t KernelPageEntries(Kernel kernel);
Result<Kernel> ParseKernel(std::string_view name);

// How a cached prefix that ends at a block boundary gets the sliding-window ring and the
// compressor state it needs to resume (models with windows: DeepSeek-V4).
enum class SwaStrategy {
  kRecompute,  // persist nothing; a hit names the last `window` tokens for the engine to recompute
  kSnapshot,   // copy the live ring and compressor rows beside each sealed boundary block
  kRetain,     // keep the raw window rows of each boundary alive (window kept in chunks of `window`
               // tokens); the overlapping compressor's previous-group rows are copied
};
std::string_view SwaStrategyName(SwaStrategy s);
Result<SwaStrategy> ParseSwaStrategy(std::string_view name);

struct BlockTokensChoice {
  uint32_t block_tokens = 0;
  std::vector<std::string> reasons;  // why each factor is there
  std::vector<std::string> notes;    // preferences an explicit choice misses
};

// Chooses the tokens one block spans for paged caches with the given compress ratios (1 for
// per-token caches). Hard constraint: a multiple of every ratio (a block boundary inside a
// compression group cannot be expressed). Preference: the kernel's entries per page for the
// finest paged cache (FlashMLA: 64), 16 tokens for MHA with a generic kernel.
// `requested` (from --block-tokens) must meet the hard constraints or the result is
// kInvalidArgument on "block-tokens" naming the constraint; missing a preference adds a note.
Result<BlockTokensChoice> ChooseBlockTokens(const std::vector<uint32_t>& ratios, bool mla, Kernel kernel,
                                            std::optional<uint64_t> requested);

// A page holds one block of `layers_per_page` layers: each layer's slice (its entries of the
// block, laid out by the format's packing) at `layer_stride` from the previous one, the whole
// padded up to `alignment`. Unpacked (layers_per_page 1) a slice is the page. Packed, the
// slices are back to back (layer_stride = data_bytes rounded up to kPackedSliceAlignment, so
// every slice starts 16-B aligned for a kernel's vector loads; v4-fp8's slices of 2 or 64
// entries are already multiples of 16 B) and only the page is padded, so the
// padding is paid once per page instead of once per layer (ADR 0020). A kernel addresses entry
// e of layer l of block b in place: base + b x block stride + l x layer_stride + the format's
// offset of e inside a slice; its block stride (page_bytes x pages per block) stays a multiple
// of `alignment`.
constexpr uint64_t kPackedSliceAlignment = 16;
struct PageLayout {
  uint32_t block_tokens = 0;
  uint32_t compress_ratio = 1;
  uint32_t entries_per_block = 0;
  uint64_t record_bytes = 0;
  uint64_t data_bytes = 0;       // one layer's slice: entries_per_block x record_bytes
  uint32_t layers_per_page = 1;  // layers whose slices share one page
  uint64_t layer_stride = 0;     // bytes from one layer's slice to the next: page_bytes unpacked, ~data_bytes packed
  uint64_t page_bytes = 0;       // layers_per_page x layer stride rounded up to `alignment`
  uint64_t padding_bytes = 0;    // page_bytes - layers_per_page x data_bytes
  uint64_t alignment = 1;
  bool packed() const { return layers_per_page > 1; }
};

// One page of `format` holding a block of `block_tokens` tokens at `compress_ratio` tokens
// per entry, for `layers_per_page` layers. `alignment` 0 means the format's own page alignment.
// Errors: kInvalidArgument on "block-tokens" when block_tokens is not a multiple of the ratio,
// on "layers" when layers_per_page is 0.
Result<PageLayout> ComputePageLayout(const RecordFormat& format, uint32_t compress_ratio, uint32_t block_tokens,
                                     uint64_t alignment = 0, uint32_t layers_per_page = 1);

// Page bytes of one block of a group of `layers` layers: its pages, ceil(layers /
// layers_per_page) of them. Overflow is reported through Checked.
Checked GroupBlockBytes(const PageLayout& page, uint32_t layers);
// Padding of a packed group's pages per block (0 unpacked: each layer's slice carries its own).
uint64_t PackedPaddingPerBlock(const PageLayout& page, uint32_t layers);

// Host bytes Tessera's pool keeps per block id, as the ledger counts them: a model of a fixed
// header (state, refcount, generation, LRU links, prefix key, content key) plus the block's token
// ids, stored so that a prefix hit is verified token by token. A model, not a measurement: the
// structures that hold the header today (the pool's per-block arrays and the index's identity)
// take BlockPool::kHeaderBytes + BlockIndex::kIdentityBytes = 98 B, not 64 (pinned by
// BlockMetadata.LedgerModelAgainstTheStructures); the token ids are exactly 4 B each.
constexpr uint64_t kBlockHeaderBytes = 64;
constexpr uint64_t BlockMetadataBytes(uint32_t block_tokens) { return kBlockHeaderBytes + 4ULL * block_tokens; }

// ---- The caches of a model -------------------------------------------------------------------

// The model's default main record format: "v4-fp8" for DeepSeek-V4, "fp8_ds_mla" for DeepSeek-V3.2
// (MLA with a sparse indexer), "mla-bf16" for dense MLA, "mha-bf16" for MHA/GQA.
std::string DefaultKvFormat(const Geometry& g);
// The indexer format that pairs with `main_format`: "" for a model without indexer dims,
// "indexer-fp4-seed" beside the seed note's structural records, "indexer-fp8" otherwise.
std::string DefaultIndexerFormat(const Geometry& g, const RecordFormat& main_format);

// Validated by MapCaches / ComputeCacheLayout; errors name the CLI option.
// The one set of layout options: the ledger's (LedgerOptions) and the manager's (ManagerOptions)
// options derive from it, so that each field is declared once and reaches ComputeCacheLayout as
// given (no copy by hand to drop one).
struct CacheLayoutOptions {
  std::string kv_format;                 // main record format; empty = DefaultKvFormat
  std::string indexer_format;            // empty = DefaultIndexerFormat of the main format
  std::optional<uint64_t> block_tokens;  // unset: derived (ChooseBlockTokens)
  Kernel kernel = Kernel::kFlashMla;
  bool include_mtp = false;  // whether MTP layers hold cache
  uint32_t tp = 1;           // tensor-parallel ranks: MHA/GQA heads shard, so a rank's record is smaller
  // Pack the layers of a paged group into one page per block when a page of one layer would be
  // padded (ADR 0020); false keeps one padded page per layer (the layout before ADR 0020).
  bool pack_layers = true;
  // The scale format of records with fp32 scales (fp8_ds_mla, indexer-fp8); unset: the format's
  // default, what the engine writes (ADR 0033). Set on a record without such scales it is
  // refused ("kv-scale-format", "indexer-scale-format").
  std::optional<ScaleFormat> kv_scale_format;
  std::optional<ScaleFormat> indexer_scale_format;
  // indexer-fp8's page layout; unset: the format's default, region-major (a block's keys, then its
  // scales), what vLLM and SGLang write (ADR 0043). Set on another indexer format, or on a model
  // without an indexer, it is refused ("indexer-layout").
  std::optional<Packing> indexer_packing;
};

// One cache kind over the layers that hold it, e.g. "csa.compressed" over the 30 CSA layers: the
// layers of one kind (MTP layers apart) whose cache has the same role, ratio, ring and dims
// (K/V heads and widths, linear state).
struct CacheLineSpec {
  std::string name;  // "[mtp.]<layer kind>.<role>"
  LayerKind layer_kind = LayerKind::kMla;
  CacheRole role = CacheRole::kLatent;
  bool mtp = false;
  uint32_t compress_ratio = 1;         // paged caches: tokens per entry
  uint32_t slots = 0;                  // per-request state: ring slots (window tokens or compressor slots)
  uint32_t state_floats = 0;           // compressor state: float32 values per slot
  KvDims kv;                           // MHA/GQA and sliding-window lines: the layers' K and V (unsharded)
  RecordFormat format;                 // as one rank stores it (MHA heads shard over tensor-parallel ranks)
  uint64_t record_bytes = 0;           // one record of the whole model (unsharded)
  std::vector<uint32_t> model_layers;  // the model layer indices that hold it, in model order
};

// The caches of a model in their resolved record formats, whatever engine holds them.
struct CacheMap {
  std::string kv_format;             // resolved name
  std::string indexer_format;        // resolved name; "" for a model without indexer dims
  RecordFormat main_format;          // the whole model's main record (unsharded)
  uint32_t layers_counted = 0;       // layers that hold cache: main layers, plus MTP when included
  std::vector<CacheLineSpec> lines;  // in order of first appearance over the model's layers
};

// Resolves and checks the formats (a kv format where the model needs one, a latent format where
// it has a latent, an indexer format only for a model with an indexer; an expanded per-head format
// on an MLA model replaces the latent and drops the indexer) and groups the layers into lines.
// Errors: kNotFound / kInvalidArgument on "kv-format" or "indexer-format"; "tp" when MHA/GQA KV
// heads cannot be split over `tp` ranks.
Result<CacheMap> MapCaches(const Geometry& g, const CacheLayoutOptions& options);

// Layers whose caches share a role, a record format and an entries-per-block (paged) or a ring
// (per-request arena) form one group, whatever their layer kind: one pool group, or one kind of
// ring in the per-request arena.
struct CacheGroup {
  std::string name;  // "compressed/4", "indexer/4", "window", "compressor_state/8", "latent/1", ...
  CacheRole role = CacheRole::kLatent;
  RecordFormat format;
  uint32_t layers = 0;
  // The model layers it holds, in model order: group layer i is model layer model_layers[i].
  std::vector<uint32_t> model_layers;
  std::vector<std::string> lines;  // the CacheMap lines merged into this group
  bool in_pages = true;
  uint32_t compress_ratio = 1;     // pages: tokens per entry
  PageLayout page;                 // pages
  uint32_t slots = 0;              // arena: ring slots per layer (without speculative extras)
  uint32_t state_floats = 0;       // arena, compressor state: float32 values per slot
  uint64_t bytes_per_request = 0;  // arena: layers x slots x record
};

// A CacheMap as Tessera holds it: caches that grow with the context in pages of one block span,
// per-request state (window rings, compressor state) in an arena sized once.
struct CacheLayout : CacheMap {
  BlockTokensChoice block;
  std::vector<CacheGroup> groups;       // in order of first appearance of their lines
  std::vector<uint32_t> group_of_line;  // lines[i] is held by groups[group_of_line[i]]
};

// Tessera's block span (ChooseBlockTokens over the paged lines' ratios) and its groups with their
// page layouts (ComputePageLayout, each format's own alignment). A paged group whose one-layer
// page would be padded holds all its layers in one page per block (options.pack_layers).
// Errors: "block-tokens" (see ChooseBlockTokens), "compress_ratios", "sliding_window" when a
// group's ring bytes overflow.
Result<CacheLayout> LayoutCaches(const Geometry& g, CacheMap caches, const CacheLayoutOptions& options);
// MapCaches, then LayoutCaches: what the pools hold, and what the ledger prices for engine tessera.
Result<CacheLayout> ComputeCacheLayout(const Geometry& g, const CacheLayoutOptions& options);

// Under retain, window rows live in chunks of `window` tokens that sealed blocks keep alive, so a
// chunk must end on a block boundary: kInvalidArgument on "swa-strategy" when the block span is
// not a multiple of the window. OK for every other strategy and for models without windows.
Status CheckWindowStrategy(const CacheLayout& layout, SwaStrategy strategy);

// Tensor-parallel ranks: positive, and for MHA/GQA a divisor or a multiple of every layer's KV
// heads (an MLA latent is one KV head, replicated on every rank); a linear-attention state shards
// by heads, so `tp` must divide them. Errors name "tp".
Status CheckTensorParallel(const Geometry& g, uint32_t tp);

}  // namespace tessera

// Reference DeepSeek-V4 hybrid attention over Tessera's pages and window rings (ADR 0018).
//
// CPU, fp32, scalar, like attention.h: the ground truth, not a fast path. One decode token of
// one layer attends, with one softmax whose denominator also holds a per-head sink, to
//   - the window: the last min(tokens, sliding_window) tokens' rows of the request's window
//     ring (the request's live state, RequestManager::LiveState), and
//   - compressed entries from pages (RequestManager::Entry): none for an SWA layer (ratio 0),
//     every complete one for HCA, the indexer's top-k for CSA (ratio 4; V4IndexerSelect scores
//     the indexer's own compressed keys).
// Rows and entries are decoded through the codecs (v4-fp8 by DequantizeV4Fp8; indexer keys
// indexer-mxfp4 or indexer-fp8); K = V = the decoded 512-value row (MQA), and the output's RoPE
// dims are rotated back to the query position. The compressor math that turns a group of state
// rows into an entry (softmax-gated pooling, RMSNorm, RoPE at the group's first token, fp8 or,
// for the indexer, Hadamard + fp4) is here too, as a KvWriters Compressor builds it.
//
// Counters (attention.h's convention: page_bytes = record bytes of every row/entry read; a
// multiply-add of a contraction is 2 FLOPs, nothing else counts), exactly (tests):
//   V4AttendFlops:   4 H n D    for n rows (window + entries): H·D for the scores, H·D for the sum
//   indexer:         IndexerFlops (attention.h): 2 n I (I_D + 1) over n indexer entries
//
// Thread-safety: pure functions; a V4PagedLayer is a snapshot of the window rows taken at Of().
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tessera/attention.h"
#include "tessera/format.h"
#include "tessera/geometry.h"
#include "tessera/request_manager.h"
#include "tessera/status.h"

namespace tessera {

// The dims a V4 decode needs. Of(): kInvalidArgument on "model" for a model that is not hybrid
// (DeepSeek-V4) or whose head_dim - qk_rope_head_dim is not the v4-fp8 record's 448 + 64.
struct V4Dims {
  uint32_t heads = 0;
  uint32_t head_dim = 0;  // nope + rope
  uint32_t rope = 0;
  uint32_t window = 0;
  IndexerDims indexer;  // zero without a CSA layer
  static Result<V4Dims> Of(const Geometry& g);
  uint32_t nope() const { return head_dim - rope; }
  float scale() const;  // 1/sqrt(head_dim)
};

uint64_t V4AttendFlops(const V4Dims& d, uint64_t rows);

// RoPE, interleaved pairs (x[2i], x[2i+1]) rotated by p·theta^(-2i/n) (n = x.size(), even;
// angles in double, cos/sin in float); inverse rotates back.
void RopeInterleaved(std::span<float> x, uint64_t position, double theta, bool inverse);
// x <- x H / sqrt(n), Sylvester Hadamard; n = x.size() a power of two (else kInvalidArgument
// on "x").
Status HadamardTransform(std::span<float> x);
// In place: each block of 32 becomes e2m1(x / s) · s with s = 2^ceil(log2(max(amax, 6·2^-126)/6))
// (the fp4 the indexer's query and keys carry). x.size() a multiple of 32.
Status RoundFp4Blocks(std::span<float> x);

// indexer-mxfp4 record of a key (D e2m1 packed low nibble first, then D/32 ue8m0 scales), with
// RoundFp4Blocks' scales; and its decoding.
Status QuantizeIndexerMxfp4(std::span<const float> key, std::span<std::byte> record);
Status DequantizeIndexerMxfp4(std::span<const std::byte> record, std::span<float> key);

// A window row in the ring: the v4-fp8 record's data row then its scale row (584 bytes).
Status EncodeV4WindowRow(std::span<const float> kv, std::span<std::byte> row);

// One compressor of one layer (main or the indexer's).
struct V4Compressor {
  uint32_t ratio = 0;
  uint32_t dim = 0;   // head_dim, or index_head_dim
  uint32_t rope = 0;  // the last `rope` dims are rotated
  double theta = 0;   // compress_rope_theta
  float eps = 1e-6f;
  std::span<const float> norm;  // dim
  bool indexer = false;         // Hadamard + fp4 after RoPE
  uint32_t coff() const { return ratio == 4 ? 2 : 1; }
};

// The entry of group `group` from its state rows (oldest first, each [k (coff·dim) | s (coff·dim)],
// s with ape added; ratio rows for an overlapping group 0, else coff·ratio), before quantization
// (the indexer's Hadamard and fp4 rounding included). Errors name "rows", "row_floats", "entry".
Status V4CompressEntry(const V4Compressor& c, uint64_t group, std::span<const float> rows, uint32_t row_floats,
                       std::span<float> entry);
// Encodes an entry into its page record: v4-fp8 (planes 0 and 1), indexer-mxfp4 or indexer-fp8.
// kInvalidArgument on "format" for any other.
Status EncodeV4Entry(std::span<const float> entry, const RecordFormat& format, const RecordView& record);

// The token being computed at position tokens(), not yet appended (a model attends to its own
// rows before the manager holds them): its window row (584 bytes, as EncodeV4WindowRow writes it)
// and the entries it completes (empty when it completes none): the v4-fp8 entry as data row then
// scale row, the indexer entry as its record.
struct V4Pending {
  std::span<const std::byte> window_row;
  std::span<const std::byte> entry;
  std::span<const std::byte> indexer_entry;
};

// One layer of one request: its window rows (a copy of the live state at Of()), its compressor
// rows, and its entries.
class V4PagedLayer {
 public:
  // Errors: "request", "layer" (no such request, or the layer has no window); "kv-format" when
  // window rows or entries are not v4-fp8 of the model's dims; "indexer-format" when the
  // indexer's are neither indexer-mxfp4 nor indexer-fp8.
  static Result<V4PagedLayer> Of(const RequestManager& manager, RequestId request, uint32_t layer);
  // The layer as of `tokens` (<= the request's): entries [0, tokens/ratio) from pages, and the
  // given window rows (oldest first, ending at position tokens-1; fewer than the window when a
  // caller rebuilding rings has no older rows), no compressor rows. Errors: as Of, "tokens",
  // "window_rows".
  static Result<V4PagedLayer> AsOf(const RequestManager& manager, RequestId request, uint32_t layer, uint64_t tokens,
                                   std::span<const std::byte> window_rows);

  uint64_t tokens() const { return tokens_; }
  uint32_t ratio() const { return ratio_; }
  bool has_indexer() const { return indexer_format_ != nullptr; }
  uint64_t entries() const { return ratio_ == 0 ? 0 : tokens_ / ratio_; }
  // Positions whose rows the window holds: [window_begin(), tokens()).
  uint64_t window_begin() const { return tokens_ - window_rows_; }

  // Adds the pending token (once): tokens() grows by one, the window slides over its row, and
  // its entries become readable. Errors: "window_row" / "entry" / "indexer_entry" when a span is
  // not the record's size or an entry is given exactly when the token completes no group.
  Status SetPending(const V4Pending& pending);

  // The live compressor rows (main, or the indexer's) of positions [state_begin(), tokens()) as
  // of Of(): the current incomplete group and, overlapping, the previous one; state_floats each.
  uint64_t state_begin() const { return state_begin_; }
  std::span<const float> state_rows(bool indexer) const { return indexer ? istate_ : state_; }
  uint32_t state_floats(bool indexer) const { return indexer ? istate_floats_ : state_floats_; }

  // Decoded rows (head_dim floats: nope then rope); counters may be null. Errors: "position" /
  // "entry" out of range.
  Status ReadWindow(uint64_t position, std::span<float> row, AttentionCounters* counters) const;
  Status ReadEntry(uint64_t entry, std::span<float> row, AttentionCounters* counters) const;
  Status ReadIndexerKey(uint64_t entry, std::span<float> key, AttentionCounters* counters) const;

 private:
  static Result<V4PagedLayer> Bind(const RequestManager& manager, RequestId request, uint32_t layer, size_t* layer_pos);
  const RequestManager* manager_ = nullptr;
  RequestId request_;
  uint32_t layer_ = 0;
  uint32_t ratio_ = 0;
  uint64_t tokens_ = 0;
  uint64_t window_rows_ = 0;
  uint64_t row_bytes_ = 0;
  uint32_t nope_ = 0, rope_ = 0, index_dim_ = 0;
  uint64_t window_capacity_ = 0;
  std::vector<std::byte> window_;  // window_rows_ rows, oldest first
  uint64_t state_begin_ = 0;
  uint32_t state_floats_ = 0, istate_floats_ = 0;
  std::vector<float> state_, istate_;
  bool pending_ = false;
  std::vector<std::byte> pending_entry_, pending_indexer_entry_;
  const RecordFormat* main_format_ = nullptr;
  const RecordFormat* indexer_format_ = nullptr;
};

// Attention of the query (heads x head_dim, RoPE applied at position tokens()-1) over the window
// and the compressed entries `entries` (ascending or not; summed window first, then in the
// order given), with the sink logits `sink` (heads). out: heads x head_dim, the RoPE dims
// rotated back at the query position with `rope_theta`. Errors name the span ("q", "sink",
// "out", "entries" out of range or on an SWA layer).
Status V4Attend(const V4PagedLayer& pages, std::span<const uint64_t> entries, std::span<const float> q,
                std::span<const float> sink, const V4Dims& dims, double rope_theta, std::span<float> out,
                AttentionCounters* counters);

// CSA: score[e] = sum_j weights[j] relu(q_j . key[e]) over every complete entry; selected = the
// min(topk, entries()) highest, ties to the lower entry, ascending. Errors: "indexer-format" when
// the layer has no indexer; spans as IndexerSelect.
Status V4IndexerSelect(const V4PagedLayer& pages, const IndexerQuery& query, const IndexerDims& dims,
                       std::vector<uint64_t>* selected, AttentionCounters* counters);

}  // namespace tessera

#include "tessera/v4_attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "tessera/codec.h"

namespace tessera {

namespace {

constexpr size_t kFp4Block = 32;
constexpr uint64_t kV4RowBytes = kV4DataRowBytes + kV4ScaleRowBytes;  // 584

Status CheckSpan(std::string_view field, size_t got, uint64_t want) {
  if (got != want) {
    return InvalidArgument(std::string(field),
                           "holds " + std::to_string(got) + " values, expected " + std::to_string(want));
  }
  return Status::Ok();
}

float Dot(const float* a, const float* b, size_t n) {
  float s = 0.0f;
  for (size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// The fp4 block scale: 2^ceil(log2(max(amax, 6·2^-126) · (1/6))), as a ue8m0 code.
uint8_t Fp4ScaleCode(const float* x) {
  float amax = 0.0f;
  for (size_t i = 0; i < kFp4Block; ++i) amax = std::max(amax, std::fabs(x[i]));
  amax = std::max(amax, 6.0f * 0x1p-126f);
  return EncodeUE8M0Ceil(amax * (1.0f / kE2M1Max));
}

enum class IndexerKind { kNone, kMxfp4, kFp8 };

IndexerKind KindOf(const RecordFormat& f) {
  if (f.regions.size() != 2 || f.regions[0].name != "key") return IndexerKind::kNone;
  if (f.regions[0].type == ElementType::kFp4E2M1 && f.regions[1].type == ElementType::kUe8m0 &&
      f.regions[0].count % kFp4Block == 0 && f.regions[1].count == f.regions[0].count / kFp4Block) {
    return IndexerKind::kMxfp4;
  }
  if (f.regions[0].type == ElementType::kFp8E4M3 && f.regions[1].type == ElementType::kFp32 &&
      f.regions[1].count == 1) {
    return IndexerKind::kFp8;
  }
  return IndexerKind::kNone;
}

bool IsV4Fp8(const RecordFormat& f) {
  return f.family == FormatFamily::kV4Fp8 && f.plane_count() == 2 && f.plane_bytes(0) == kV4DataRowBytes &&
         f.plane_bytes(1) == kV4ScaleRowBytes;
}

}  // namespace

Result<V4Dims> V4Dims::Of(const Geometry& g) {
  if (!g.is_hybrid) return InvalidArgument("model", g.name + " is not a hybrid (DeepSeek-V4) model");
  if (g.head_dim != kV4NopeDim + kV4RopeDim || g.qk_rope_head_dim != kV4RopeDim || g.num_attention_heads == 0) {
    return InvalidArgument("model", g.name + ": the v4-fp8 record needs head_dim 512 with qk_rope_head_dim 64");
  }
  V4Dims d;
  d.heads = g.num_attention_heads;
  d.head_dim = g.head_dim;
  d.rope = g.qk_rope_head_dim;
  d.window = g.sliding_window;
  d.indexer = IndexerDims{g.index_n_heads, g.index_head_dim, g.index_topk};
  return d;
}

float V4Dims::scale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }

uint64_t V4AttendFlops(const V4Dims& d, uint64_t rows) { return 4 * uint64_t{d.heads} * rows * d.head_dim; }

void RopeInterleaved(std::span<float> x, uint64_t position, double theta, bool inverse) {
  const size_t n = x.size();
  for (size_t i = 0; 2 * i + 1 < n; ++i) {
    const double angle =
        static_cast<double>(position) * std::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(n));
    const float c = static_cast<float>(std::cos(angle));
    const float s = inverse ? -static_cast<float>(std::sin(angle)) : static_cast<float>(std::sin(angle));
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * c - b * s;
    x[2 * i + 1] = a * s + b * c;
  }
}

Status HadamardTransform(std::span<float> x) {
  const size_t n = x.size();
  if (n == 0 || !std::has_single_bit(n)) return InvalidArgument("x", std::to_string(n) + " is not a power of two");
  // Butterflies: H_2n = [[H, H], [H, -H]] applied to the row vector x (x H, H symmetric).
  for (size_t h = 1; h < n; h *= 2) {
    for (size_t i = 0; i < n; i += 2 * h) {
      for (size_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  for (float& v : x) v *= scale;
  return Status::Ok();
}

Status RoundFp4Blocks(std::span<float> x) {
  if (x.size() % kFp4Block != 0) return InvalidArgument("x", std::to_string(x.size()) + " is not a multiple of 32");
  for (size_t b = 0; b < x.size(); b += kFp4Block) {
    const float s = DecodeUE8M0(Fp4ScaleCode(x.data() + b));
    for (size_t i = b; i < b + kFp4Block; ++i) x[i] = DecodeE2M1(EncodeE2M1(x[i] / s)) * s;
  }
  return Status::Ok();
}

Status QuantizeIndexerMxfp4(std::span<const float> key, std::span<std::byte> record) {
  const size_t d = key.size();
  if (d == 0 || d % kFp4Block != 0) return InvalidArgument("key", std::to_string(d) + " is not a multiple of 32");
  TESSERA_RETURN_IF_ERROR(CheckSpan("record", record.size(), d / 2 + d / kFp4Block));
  for (float v : key) {
    if (!std::isfinite(v)) return InvalidArgument("key", "a value is not finite");
  }
  for (size_t b = 0; b < d; b += kFp4Block) {
    const uint8_t code = Fp4ScaleCode(key.data() + b);
    const float s = DecodeUE8M0(code);
    for (size_t i = b; i < b + kFp4Block; i += 2) {
      const uint8_t lo = EncodeE2M1(key[i] / s), hi = EncodeE2M1(key[i + 1] / s);
      record[i / 2] = std::byte{static_cast<uint8_t>(lo | (hi << 4))};
    }
    record[d / 2 + b / kFp4Block] = std::byte{code};
  }
  return Status::Ok();
}

Status DequantizeIndexerMxfp4(std::span<const std::byte> record, std::span<float> key) {
  const size_t d = key.size();
  if (d == 0 || d % kFp4Block != 0) return InvalidArgument("key", std::to_string(d) + " is not a multiple of 32");
  TESSERA_RETURN_IF_ERROR(CheckSpan("record", record.size(), d / 2 + d / kFp4Block));
  for (size_t i = 0; i < d; ++i) {
    const uint8_t byte = std::to_integer<uint8_t>(record[i / 2]);
    const float s = DecodeUE8M0(std::to_integer<uint8_t>(record[d / 2 + i / kFp4Block]));
    key[i] = DecodeE2M1(i % 2 == 0 ? byte : static_cast<uint8_t>(byte >> 4)) * s;
  }
  return Status::Ok();
}

Status EncodeV4WindowRow(std::span<const float> kv, std::span<std::byte> row) {
  TESSERA_RETURN_IF_ERROR(CheckSpan("kv", kv.size(), kV4NopeDim + kV4RopeDim));
  TESSERA_RETURN_IF_ERROR(CheckSpan("row", row.size(), kV4RowBytes));
  return QuantizeV4Fp8(kv.first(kV4NopeDim), kv.subspan(kV4NopeDim), row.first(kV4DataRowBytes),
                       row.subspan(kV4DataRowBytes));
}

Status V4CompressEntry(const V4Compressor& c, uint64_t group, std::span<const float> rows, uint32_t row_floats,
                       std::span<float> entry) {
  const size_t dim = c.dim, coff = c.coff();
  if (c.ratio < 2 || dim == 0 || c.rope > dim || c.rope % 2 != 0) {
    return InvalidArgument("ratio", "a compressor needs ratio >= 2 and an even rope within dim");
  }
  TESSERA_RETURN_IF_ERROR(CheckSpan("row_floats", row_floats, 2 * coff * dim));
  TESSERA_RETURN_IF_ERROR(CheckSpan("norm", c.norm.size(), dim));
  TESSERA_RETURN_IF_ERROR(CheckSpan("entry", entry.size(), dim));
  const size_t own = c.ratio, prev = (coff == 2 && group > 0) ? c.ratio : 0;
  TESSERA_RETURN_IF_ERROR(CheckSpan("rows", rows.size(), (prev + own) * row_floats));
  const size_t n = prev + own;
  std::vector<float> logit(n), value(n);
  for (size_t col = 0; col < dim; ++col) {
    // Previous group's rows read the first dim columns, the group's own rows the last dim
    // (overlapping); a plain compressor has dim columns.
    for (size_t t = 0; t < n; ++t) {
      const float* row = rows.data() + t * row_floats;
      const size_t k = (t < prev || coff == 1) ? col : dim + col;
      value[t] = row[k];
      logit[t] = row[coff * dim + k];
    }
    float m = -INFINITY;
    for (float l : logit) m = std::max(m, l);
    float sum = 0.0f;
    for (float& l : logit) {
      l = std::exp(l - m);
      sum += l;
    }
    float acc = 0.0f;
    for (size_t t = 0; t < n; ++t) acc += logit[t] / sum * value[t];
    entry[col] = acc;
  }
  float ms = 0.0f;
  for (float v : entry) ms += v * v;
  const float inv = 1.0f / std::sqrt(ms / static_cast<float>(dim) + c.eps);
  for (size_t i = 0; i < dim; ++i) entry[i] = entry[i] * inv * c.norm[i];
  RopeInterleaved(entry.subspan(dim - c.rope), group * c.ratio, c.theta, false);
  if (c.indexer) {
    TESSERA_RETURN_IF_ERROR(HadamardTransform(entry));
    TESSERA_RETURN_IF_ERROR(RoundFp4Blocks(entry));
  }
  return Status::Ok();
}

Status EncodeV4Entry(std::span<const float> entry, const RecordFormat& format, const RecordView& record) {
  if (IsV4Fp8(format)) {
    TESSERA_RETURN_IF_ERROR(CheckSpan("entry", entry.size(), kV4NopeDim + kV4RopeDim));
    if (record.plane_count != 2) return InvalidArgument("record", "a v4-fp8 record has two planes");
    return QuantizeV4Fp8(entry.first(kV4NopeDim), entry.subspan(kV4NopeDim), record.planes[0].first(kV4DataRowBytes),
                         record.planes[1].first(kV4ScaleRowBytes));
  }
  const uint64_t bytes = format.record_bytes();
  switch (KindOf(format)) {
    case IndexerKind::kMxfp4:
      if (record.planes[0].size() < bytes)
        return InvalidArgument("record", "shorter than a " + format.name + " record");
      return QuantizeIndexerMxfp4(entry, record.planes[0].first(bytes));
    case IndexerKind::kFp8:
      return WriteIndexerFp8(format, entry, record);  // either page layout
    case IndexerKind::kNone:
      break;
  }
  return InvalidArgument("format", format.name + " is not a format the V4 reference writes");
}

Result<V4PagedLayer> V4PagedLayer::Bind(const RequestManager& manager, RequestId request, uint32_t layer,
                                        size_t* layer_pos) {
  const RequestStates* states = manager.states();
  if (states == nullptr) return InvalidArgument("layer", "the model has no windows");
  const std::vector<StateLayer>& layers = states->layers();
  size_t pos = layers.size();
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].layer == layer) pos = i;
  }
  if (pos == layers.size()) return InvalidArgument("layer", "layer " + std::to_string(layer) + " has no window");
  V4PagedLayer p;
  p.manager_ = &manager;
  p.request_ = request;
  p.layer_ = layer;
  p.ratio_ = layers[pos].ratio;
  p.tokens_ = manager.Tokens(request);
  p.row_bytes_ = states->options().window_record_bytes;
  if (p.row_bytes_ != kV4RowBytes) {
    return InvalidArgument("kv-format", "window rows of " + std::to_string(p.row_bytes_) +
                                            " bytes; the reference reads v4-fp8 rows of 584");
  }
  p.nope_ = kV4NopeDim;
  p.rope_ = kV4RopeDim;
  const auto& groups = manager.pool().groups();
  if (layers[pos].group >= 0) {
    p.main_format_ = &groups[static_cast<size_t>(layers[pos].group)].format;
    if (!IsV4Fp8(*p.main_format_)) {
      return InvalidArgument("kv-format", p.main_format_->name + " entries; the reference reads v4-fp8");
    }
  }
  if (layers[pos].igroup >= 0) {
    p.indexer_format_ = &groups[static_cast<size_t>(layers[pos].igroup)].format;
    if (KindOf(*p.indexer_format_) == IndexerKind::kNone) {
      return InvalidArgument("indexer-format", p.indexer_format_->name + " is neither indexer-mxfp4 nor indexer-fp8");
    }
    p.index_dim_ = static_cast<uint32_t>(p.indexer_format_->regions[0].count);
  }
  p.window_capacity_ = states->window();
  *layer_pos = pos;
  return p;
}

Result<V4PagedLayer> V4PagedLayer::AsOf(const RequestManager& manager, RequestId request, uint32_t layer,
                                        uint64_t tokens, std::span<const std::byte> window_rows) {
  size_t pos = 0;
  TESSERA_ASSIGN_OR_RETURN(V4PagedLayer p, Bind(manager, request, layer, &pos));
  if (tokens == 0 || tokens > p.tokens_) {
    return InvalidArgument("tokens", std::to_string(tokens) + "; the request holds " + std::to_string(p.tokens_));
  }
  if (window_rows.size() % p.row_bytes_ != 0 ||
      window_rows.size() / p.row_bytes_ > std::min(tokens, p.window_capacity_)) {
    return InvalidArgument("window_rows", "not whole rows of the last min(tokens, window) positions");
  }
  p.tokens_ = tokens;
  p.window_rows_ = window_rows.size() / p.row_bytes_;
  p.window_.assign(window_rows.begin(), window_rows.end());
  return p;
}

Result<V4PagedLayer> V4PagedLayer::Of(const RequestManager& manager, RequestId request, uint32_t layer) {
  size_t pos = 0;
  TESSERA_ASSIGN_OR_RETURN(V4PagedLayer p, Bind(manager, request, layer, &pos));
  const std::vector<StateLayer>& layers = manager.states()->layers();
  // LiveState: per state layer (in order) the window rows of the last min(tokens, window)
  // tokens, oldest first; then per compressed layer (in order) the main and the indexer's
  // compressor rows still needed.
  const uint64_t window = p.window_capacity_;
  p.window_rows_ = std::min<uint64_t>(p.tokens_, window);
  const std::vector<std::byte> live = manager.LiveState(request);
  const uint64_t size = p.window_rows_ * p.row_bytes_;
  uint64_t begin = pos * size;
  if (live.size() < layers.size() * size) return InvalidArgument("request", "no live window state");
  p.window_.assign(live.begin() + static_cast<std::ptrdiff_t>(begin),
                   live.begin() + static_cast<std::ptrdiff_t>(begin + size));
  begin = layers.size() * size;
  for (size_t i = 0; i < layers.size(); ++i) {
    const StateLayer& l = layers[i];
    if (l.ratio == 0) continue;
    const uint64_t span = uint64_t{l.coff - 1} * l.ratio;
    const uint64_t whole = p.tokens_ / l.ratio * l.ratio;
    const uint64_t start = whole >= span ? whole - span : 0;
    for (int which = 0; which < (l.istate_slots > 0 ? 2 : 1); ++which) {
      const uint32_t floats = which == 1 ? l.istate_floats : l.state_floats;
      const uint64_t bytes = (p.tokens_ - start) * floats * sizeof(float);
      if (live.size() < begin + bytes) return InvalidArgument("request", "no live compressor state");
      if (i == pos) {
        std::vector<float>& rows = which == 1 ? p.istate_ : p.state_;
        rows.resize((p.tokens_ - start) * floats);
        if (bytes > 0) std::memcpy(rows.data(), live.data() + begin, bytes);  // null data when empty
        (which == 1 ? p.istate_floats_ : p.state_floats_) = floats;
        p.state_begin_ = start;
      }
      begin += bytes;
    }
  }
  return p;
}

Status V4PagedLayer::SetPending(const V4Pending& pending) {
  if (pending_) return InvalidArgument("window_row", "a pending token is already set");
  TESSERA_RETURN_IF_ERROR(CheckSpan("window_row", pending.window_row.size(), row_bytes_));
  const bool completes = ratio_ != 0 && (tokens_ + 1) % ratio_ == 0;
  if (completes != !pending.entry.empty() || (completes && main_format_ == nullptr)) {
    return InvalidArgument(
        "entry", completes ? "the token completes a group: its entry is needed" : "the token completes no group");
  }
  if (completes != !pending.indexer_entry.empty() && indexer_format_ != nullptr) {
    return InvalidArgument("indexer_entry", "given exactly when the token completes a group");
  }
  if (completes) {
    TESSERA_RETURN_IF_ERROR(CheckSpan("entry", pending.entry.size(), main_format_->record_bytes()));
    pending_entry_.assign(pending.entry.begin(), pending.entry.end());
    if (indexer_format_ != nullptr) {
      TESSERA_RETURN_IF_ERROR(
          CheckSpan("indexer_entry", pending.indexer_entry.size(), indexer_format_->record_bytes()));
      pending_indexer_entry_.assign(pending.indexer_entry.begin(), pending.indexer_entry.end());
    }
  }
  if (window_rows_ == window_capacity_) {
    window_.erase(window_.begin(), window_.begin() + static_cast<std::ptrdiff_t>(row_bytes_));
  } else {
    ++window_rows_;
  }
  window_.insert(window_.end(), pending.window_row.begin(), pending.window_row.end());
  ++tokens_;
  pending_ = true;
  return Status::Ok();
}

Status V4PagedLayer::ReadWindow(uint64_t position, std::span<float> row, AttentionCounters* counters) const {
  TESSERA_RETURN_IF_ERROR(CheckSpan("row", row.size(), nope_ + rope_));
  if (position < window_begin() || position >= tokens_) {
    return InvalidArgument("position", std::to_string(position) + " is not in the window");
  }
  const std::span<const std::byte> rec(window_.data() + (position - window_begin()) * row_bytes_, row_bytes_);
  TESSERA_RETURN_IF_ERROR(
      DequantizeV4Fp8(rec.first(kV4DataRowBytes), rec.subspan(kV4DataRowBytes), row.first(nope_), row.subspan(nope_)));
  if (counters != nullptr) {
    counters->page_bytes += row_bytes_;
    counters->records += 1;
  }
  return Status::Ok();
}

Status V4PagedLayer::ReadEntry(uint64_t entry, std::span<float> row, AttentionCounters* counters) const {
  if (main_format_ == nullptr) return InvalidArgument("entries", "layer " + std::to_string(layer_) + " has no entries");
  TESSERA_RETURN_IF_ERROR(CheckSpan("row", row.size(), nope_ + rope_));
  if (entry >= entries()) return InvalidArgument("entry", std::to_string(entry) + " is not complete");
  if (!pending_entry_.empty() && entry + 1 == entries()) {
    const std::span<const std::byte> rec(pending_entry_);
    TESSERA_RETURN_IF_ERROR(DequantizeV4Fp8(rec.first(kV4DataRowBytes), rec.subspan(kV4DataRowBytes), row.first(nope_),
                                            row.subspan(nope_)));
  } else {
    TESSERA_ASSIGN_OR_RETURN(ConstRecordView view, manager_->Entry(request_, layer_, false, entry));
    TESSERA_RETURN_IF_ERROR(DequantizeV4Fp8(view.planes[0].first(kV4DataRowBytes),
                                            view.planes[1].first(kV4ScaleRowBytes), row.first(nope_),
                                            row.subspan(nope_)));
  }
  if (counters != nullptr) {
    counters->page_bytes += main_format_->record_bytes();
    counters->records += 1;
  }
  return Status::Ok();
}

Status V4PagedLayer::ReadIndexerKey(uint64_t entry, std::span<float> key, AttentionCounters* counters) const {
  if (indexer_format_ == nullptr) return InvalidArgument("indexer-format", "the layer has no indexer");
  TESSERA_RETURN_IF_ERROR(CheckSpan("key", key.size(), index_dim_));
  if (entry >= entries()) return InvalidArgument("entry", std::to_string(entry) + " is not complete");
  const uint64_t bytes = indexer_format_->record_bytes();
  std::span<const std::byte> rec;
  ConstRecordView view;
  std::vector<std::byte> gathered;
  if (!pending_indexer_entry_.empty() && entry + 1 == entries()) {
    rec = pending_indexer_entry_;
  } else {
    TESSERA_ASSIGN_OR_RETURN(view, manager_->Entry(request_, layer_, true, entry));
    gathered.resize(bytes);  // per-token order, whatever the page layout
    TESSERA_RETURN_IF_ERROR(CopyRecordOut(*indexer_format_, view, gathered));
    rec = gathered;
  }
  if (KindOf(*indexer_format_) == IndexerKind::kMxfp4) {
    TESSERA_RETURN_IF_ERROR(DequantizeIndexerMxfp4(rec, key));
  } else {
    TESSERA_RETURN_IF_ERROR(DequantizeIndexerFp8(rec, key));
  }
  if (counters != nullptr) {
    counters->page_bytes += bytes;
    counters->records += 1;
  }
  return Status::Ok();
}

Status V4Attend(const V4PagedLayer& pages, std::span<const uint64_t> entries, std::span<const float> q,
                std::span<const float> sink, const V4Dims& d, double rope_theta, std::span<float> out,
                AttentionCounters* counters) {
  const size_t H = d.heads, D = d.head_dim;
  TESSERA_RETURN_IF_ERROR(CheckSpan("q", q.size(), H * D));
  TESSERA_RETURN_IF_ERROR(CheckSpan("sink", sink.size(), H));
  TESSERA_RETURN_IF_ERROR(CheckSpan("out", out.size(), H * D));
  if (pages.tokens() == 0) return InvalidArgument("request", "no tokens to attend to");
  if (!entries.empty() && pages.ratio() == 0) return InvalidArgument("entries", "an SWA layer has no entries");
  const uint64_t first = pages.window_begin();
  const size_t n = static_cast<size_t>(pages.tokens() - first) + entries.size();
  AttentionCounters local;
  // Rows read once each: window oldest first, then the entries in the order given.
  std::vector<float> rows(n * D);
  size_t t = 0;
  for (uint64_t p = first; p < pages.tokens(); ++p, ++t) {
    TESSERA_RETURN_IF_ERROR(pages.ReadWindow(p, std::span(rows).subspan(t * D, D), &local));
  }
  for (uint64_t e : entries) {
    TESSERA_RETURN_IF_ERROR(pages.ReadEntry(e, std::span(rows).subspan(t * D, D), &local));
    ++t;
  }
  const float scale = d.scale();
  std::vector<float> s(n);
  for (size_t h = 0; h < H; ++h) {
    const float* qh = q.data() + h * D;
    float m = -INFINITY;
    for (size_t i = 0; i < n; ++i) {
      s[i] = Dot(qh, rows.data() + i * D, D) * scale;
      m = std::max(m, s[i]);
    }
    // The sink only enlarges the denominator (a logit with a zero value).
    float sum = std::exp(sink[h] - m);
    for (float& v : s) {
      v = std::exp(v - m);
      sum += v;
    }
    float* o = out.data() + h * D;
    std::fill(o, o + D, 0.0f);
    for (size_t i = 0; i < n; ++i) {
      const float a = s[i] / sum;
      const float* r = rows.data() + i * D;
      for (size_t j = 0; j < D; ++j) o[j] += a * r[j];
    }
    RopeInterleaved(std::span(o + d.nope(), d.rope), pages.tokens() - 1, rope_theta, true);
  }
  local.flops = V4AttendFlops(d, n);
  if (counters != nullptr) *counters += local;
  return Status::Ok();
}

Status V4IndexerSelect(const V4PagedLayer& pages, const IndexerQuery& query, const IndexerDims& d,
                       std::vector<uint64_t>* selected, AttentionCounters* counters) {
  if (!pages.has_indexer()) return InvalidArgument("indexer-format", "the layer has no indexer");
  const size_t I = d.heads, D = d.head_dim;
  TESSERA_RETURN_IF_ERROR(CheckSpan("q", query.q.size(), I * D));
  TESSERA_RETURN_IF_ERROR(CheckSpan("weights", query.weights.size(), I));
  const uint64_t n = pages.entries();
  AttentionCounters local;
  std::vector<float> key(D), score(n);
  for (uint64_t e = 0; e < n; ++e) {
    TESSERA_RETURN_IF_ERROR(pages.ReadIndexerKey(e, key, &local));
    float s = 0.0f;
    for (size_t j = 0; j < I; ++j) s += query.weights[j] * std::max(0.0f, Dot(query.q.data() + j * D, key.data(), D));
    score[e] = std::isnan(s) ? -INFINITY : s;  // a corrupt key ranks last: keeps the order strict
  }
  std::vector<uint64_t> order(n);
  for (uint64_t e = 0; e < n; ++e) order[e] = e;
  const uint64_t k = std::min<uint64_t>(d.topk, n);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](uint64_t a, uint64_t b) { return score[a] > score[b] || (score[a] == score[b] && a < b); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  *selected = std::move(order);
  local.flops = IndexerFlops(d, n);
  if (counters != nullptr) *counters += local;
  return Status::Ok();
}

}  // namespace tessera

// tessera.mounts: upstream attention kernels' arguments as torch tensors over a manager's pages
// (zero-copy; include/tessera/mounts.h, ADR 0035), and Tessera's CPU reference decode in the same
// terms, to check a kernel's output against (docs/ATTENTION.md, "Mounts").
//
// Each builder returns a dict keyed by the kernel's own parameter names, so that
// `flash_mla_with_kvcache(q, **args, tile_scheduler_metadata=meta)` takes it as it is. The KV
// tensors are views of the pool (torch.from_numpy over the pool's bytes, then view(dtype) and
// as_strided): they keep the manager alive, and they alias the pool, so what a request writes
// later is what the kernel reads. Index arrays are small int32 copies. torch is imported when a
// builder is called (the rest of the package does not need it).
#include <pybind11/numpy.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "manager.h"
#include "tessera/attention.h"
#include "tessera/codec.h"
#include "tessera/mounts.h"
#include "tessera/v4_attention.h"

namespace tessera::py_bind {
namespace {

// Bytes of a view's range of a pool, exported through the buffer protocol (writable: a kernel
// writes a decode token's KV into its slot); holds the manager alive.
struct MountBuffer {
  std::shared_ptr<PyManager> owner;
  std::byte* data = nullptr;
  size_t size = 0;
};

py::module_ Torch() {
  try {
    return py::module_::import("torch");
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_ImportError)) throw;
    PyErr_SetString(PyExc_ImportError, "tessera.mounts: the kernel arguments are torch tensors; install torch");
    throw py::error_already_set();
  }
}

py::object TorchDtype(const py::module_& torch, mounts::TensorDtype d) {
  return torch.attr(std::string(mounts::TensorDtypeName(d)).c_str());
}

// A zero-copy torch tensor of `t`. REQUIRES: pm's lock.
py::object ToTorch(const py::module_& torch, const std::shared_ptr<PyManager>& pm, const mounts::PageTensor& t) {
  const std::span<std::byte> bytes = Take(mounts::PageTensorBytes(pm->m->pool(), t));
  py::object buf = py::cast(MountBuffer{pm, bytes.data(), bytes.size()});
  py::object flat = torch.attr("from_numpy")(py::module_::import("numpy").attr("asarray")(buf));
  if (t.dtype != mounts::TensorDtype::kUint8) flat = flat.attr("view")(TorchDtype(torch, t.dtype));
  return flat.attr("as_strided")(py::cast(t.shape), py::cast(t.strides), 0);
}

py::object Int32Tensor(const py::module_& torch, const std::vector<int32_t>& v, std::vector<int64_t> shape) {
  py::array_t<int32_t> a(static_cast<ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(int32_t));
  return torch.attr("from_numpy")(a).attr("reshape")(py::cast(shape));
}

std::vector<RequestId> Requests(PyManager& pm, const py::object& request_ids) {
  std::vector<uint64_t> ids;
  ToU64Array(request_ids, "request_ids", &ids);
  std::vector<RequestId> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::optional<RequestId> id = pm.Find(ids[i]);
    if (!id) {
      ThrowValue("request_ids",
                 "element " + std::to_string(i) + " (" + std::to_string(ids[i]) + ") is not a live request");
    }
    out.push_back(*id);
  }
  return out;
}

// selected: one sequence of non-negative ints per request (positions or entries).
std::vector<std::vector<uint64_t>> Selections(const py::object& selected, size_t batch) {
  if (!py::isinstance<py::sequence>(selected) || py::isinstance<py::str>(selected)) {
    ThrowType("selected", "must be a sequence of one index sequence per request");
  }
  const auto seq = py::reinterpret_borrow<py::sequence>(selected);
  if (seq.size() != batch) {
    ThrowValue("selected", std::to_string(seq.size()) + " selections for " + std::to_string(batch) + " requests");
  }
  std::vector<std::vector<uint64_t>> out(batch);
  for (size_t i = 0; i < batch; ++i) {
    U32Array a;
    ToU32Array(seq[i], "selected", &a);
    out[i].assign(a.data, a.data + a.size);
  }
  return out;
}

std::vector<std::span<const uint64_t>> Spans(const std::vector<std::vector<uint64_t>>& v) {
  return {v.begin(), v.end()};
}

uint32_t TopK(const py::object& topk) { return topk.is_none() ? 0 : ToU32(topk, "topk"); }

// A float32 array of `want` values from any array-like (numpy, a CPU torch tensor, a list).
py::array_t<float, py::array::c_style | py::array::forcecast> Floats(const py::object& obj, const char* arg,
                                                                     size_t want) {
  auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(obj);
  if (!a) ThrowType(arg, "must be an array of floats");
  if (static_cast<size_t>(a.size()) != want) {
    ThrowValue(arg, "holds " + std::to_string(a.size()) + " values, expected " + std::to_string(want));
  }
  return a;
}

std::span<const float> Span(const py::array_t<float, py::array::c_style | py::array::forcecast>& a) {
  return {a.data(), static_cast<size_t>(a.size())};
}

py::dict SparseDict(const py::module_& torch, const std::shared_ptr<PyManager>& pm, const mounts::FlashMlaSparseArgs& a,
                    size_t batch) {
  py::dict d;
  d["k_cache"] = ToTorch(torch, pm, a.k_cache);
  d["indices"] = Int32Tensor(torch, a.indices, {static_cast<int64_t>(batch), 1, a.topk});
  d["topk_length"] = Int32Tensor(torch, a.topk_length, {static_cast<int64_t>(batch)});
  d["is_fp8_kvcache"] = true;
  d["head_dim_v"] = a.head_dim_v;
  return d;
}

// ---- Seeded random records ---------------------------------------------------------------------

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// n values uniform in [-1, 1), a function of (seed, key) only.
std::vector<float> Draws(uint64_t seed, uint64_t key, size_t n) {
  std::vector<float> v(n);
  uint64_t s = Mix(seed ^ Mix(key));
  for (float& x : v) {
    s = Mix(s);
    x = static_cast<float>((static_cast<double>(s >> 40) + 0.5) / 8388608.0 - 1.0);
  }
  return v;
}

// Writes one per-token record of `f` from draws. Errors name "kv_format".
Status WriteRecord(const RecordFormat& f, uint64_t seed, uint64_t key, const RecordView& r) {
  const uint64_t bytes = f.record_bytes();
  std::span<std::byte> rec = r.planes[0];
  if (f.family == FormatFamily::kFp8DsMla) {
    const std::vector<float> v = Draws(seed, key, kFp8DsMlaLatentDim + kFp8DsMlaRopeDim);
    return QuantizeFp8DsMla(std::span(v).first(kFp8DsMlaLatentDim), std::span(v).subspan(kFp8DsMlaLatentDim),
                            rec.first(bytes));
  }
  if (f.use == FormatUse::kIndexer && f.regions.size() == 2 && f.regions[0].type == ElementType::kFp8E4M3) {
    return WriteIndexerFp8(f, Draws(seed, key, f.regions[0].count), r);  // either page layout
  }
  if (f.family == FormatFamily::kMlaLatent && f.single_element_type() && f.regions[0].type == ElementType::kBf16) {
    const std::vector<float> v = Draws(seed, key, bytes / 2);
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t b = FloatToBf16(v[i]);
      rec[2 * i] = std::byte{static_cast<uint8_t>(b & 0xff)};
      rec[2 * i + 1] = std::byte{static_cast<uint8_t>(b >> 8)};
    }
    return Status::Ok();
  }
  return InvalidArgument("kv_format", f.name + ": append_random writes mla-bf16, fp8_ds_mla and indexer-fp8 records");
}

// Valid records of every cache with values uniform in [-1, 1): page records, window rows, compressor
// rows, and entries (drawn, not compressed from the rows: a mount reads entries as bytes).
KvWriters RandomWriters(const BlockPool& pool, uint64_t seed, const std::shared_ptr<Status>& failed) {
  std::vector<RecordFormat> formats;
  for (const PoolGroup& g : pool.groups()) formats.push_back(g.format);
  KvWriters w([formats, seed, failed](uint32_t g, uint32_t l, uint64_t p, const RecordView& r) {
    const Status st = WriteRecord(formats[g], seed, (uint64_t{g} << 56) ^ (uint64_t{l} << 40) ^ p, r);
    if (!st.ok() && failed->ok()) *failed = st;
  });
  w.window = [seed, failed](uint32_t l, uint64_t p, std::span<std::byte> row) {
    const Status st = EncodeV4WindowRow(Draws(seed, (uint64_t{1} << 63) ^ (uint64_t{l} << 40) ^ p, 512), row);
    if (!st.ok() && failed->ok()) *failed = st;
  };
  w.state = [seed](uint32_t l, bool indexer, uint64_t p, std::span<float> row) {
    const std::vector<float> v =
        Draws(seed, (uint64_t{3} << 62) ^ (uint64_t{l} << 40) ^ (uint64_t{indexer} << 39) ^ p, row.size());
    std::copy(v.begin(), v.end(), row.begin());
  };
  w.compress = [seed, failed, &pool](uint32_t l, bool indexer, uint64_t group, std::span<const float>, uint32_t,
                                     const RecordView& e) {
    const RecordFormat* f = nullptr;
    for (const PoolGroup& g : pool.groups()) {
      if (g.page.compress_ratio > 1 && (g.format.use == FormatUse::kIndexer) == indexer) f = &g.format;
    }
    const uint64_t dims = f == nullptr ? 0 : (indexer ? f->regions[0].count : kV4NopeDim + kV4RopeDim);
    const Status st =
        f == nullptr
            ? InvalidArgument("kv_format", "no entry format")
            : EncodeV4Entry(
                  Draws(seed, (uint64_t{5} << 60) ^ (uint64_t{l} << 40) ^ (uint64_t{indexer} << 39) ^ group, dims), *f,
                  e);
    if (!st.ok() && failed->ok()) *failed = st;
  };
  return w;
}

// ---- References ---------------------------------------------------------------------------------

py::tuple ReferenceDecode(PyManager& pm, const py::object& request_id, const py::object& layer, const py::object& q_lat,
                          const py::object& q_pe, const py::object& softmax_scale, const py::object& positions) {
  ManagerLock lk(pm);
  const RequestId r = pm.Live(request_id);
  const PagedLayer pages = Take(PagedLayer::Of(*pm.m, r, ToU32(layer, "layer")));
  const size_t L = pages.latent_dim(), R = pages.rope_dim();
  auto ql = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(q_lat);
  if (!ql || ql.ndim() != 2 || static_cast<size_t>(ql.shape(1)) != L) {
    ThrowValue("q_lat", "must be a [heads, " + std::to_string(L) + "] float array");
  }
  const auto heads = static_cast<uint32_t>(ql.shape(0));
  const auto qp = Floats(q_pe, "q_pe", size_t{heads} * R);
  std::vector<uint64_t> pos;
  if (positions.is_none()) {
    pos.resize(pages.tokens());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = i;
  } else {
    U32Array p;
    ToU32Array(positions, "positions", &p);
    pos.assign(p.data, p.data + p.size);
  }
  if (!py::isinstance<py::float_>(softmax_scale) && !py::isinstance<py::int_>(softmax_scale)) {
    ThrowType("softmax_scale", "must be a number");
  }
  py::array_t<float> out({static_cast<ssize_t>(heads), static_cast<ssize_t>(L)});
  py::array_t<float> lse(static_cast<ssize_t>(heads));
  const LatentQuery q{Span(ql), Span(qp), heads, softmax_scale.cast<float>()};
  Status st;
  {
    py::gil_scoped_release nogil;
    st = MlaLatentDecode(pages, pos, q, std::span(out.mutable_data(), out.size()),
                         std::span(lse.mutable_data(), lse.size()), nullptr);
  }
  Check(st);
  return py::make_tuple(out, lse);
}

py::array TopKArray(const std::vector<uint64_t>& v) {
  py::array_t<int64_t> a(static_cast<ssize_t>(v.size()));
  for (size_t i = 0; i < v.size(); ++i) a.mutable_data()[i] = static_cast<int64_t>(v[i]);
  return a;
}

py::array ReferenceIndexerTopK(PyManager& pm, const py::object& request_id, const py::object& layer,
                               const py::object& q, const py::object& weights, const py::object& topk) {
  ManagerLock lk(pm);
  const RequestId r = pm.Live(request_id);
  IndexerDims d = Take(IndexerDims::Of(pm.geometry));
  if (!topk.is_none()) d.topk = ToU32(topk, "topk");
  const auto qa = Floats(q, "q", size_t{d.heads} * d.head_dim);
  const auto wa = Floats(weights, "weights", d.heads);
  std::vector<uint64_t> selected;
  if (pm.m->states() != nullptr) {
    const V4PagedLayer pages = Take(V4PagedLayer::Of(*pm.m, r, ToU32(layer, "layer")));
    Check(V4IndexerSelect(pages, IndexerQuery{Span(qa), Span(wa)}, d, &selected, nullptr));
  } else {
    const PagedLayer pages = Take(PagedLayer::Of(*pm.m, r, ToU32(layer, "layer")));
    Check(IndexerSelect(pages, pages.tokens(), IndexerQuery{Span(qa), Span(wa)}, d, &selected, nullptr));
  }
  return TopKArray(selected);
}

py::array ReferenceV4Decode(PyManager& pm, const py::object& request_id, const py::object& layer, const py::object& q,
                            const py::object& sink, const py::object& entries, const py::object& rope_theta) {
  ManagerLock lk(pm);
  const RequestId r = pm.Live(request_id);
  const V4Dims d = Take(V4Dims::Of(pm.geometry));
  const V4PagedLayer pages = Take(V4PagedLayer::Of(*pm.m, r, ToU32(layer, "layer")));
  const auto qa = Floats(q, "q", size_t{d.heads} * d.head_dim);
  const auto sa = Floats(sink, "sink", d.heads);
  std::vector<uint64_t> e;
  if (entries.is_none()) {
    if (pages.ratio() == 4) ThrowValue("entries", "a CSA layer attends its indexer's selection: pass it");
    e.resize(pages.entries());
    for (size_t i = 0; i < e.size(); ++i) e[i] = i;
  } else {
    U32Array a;
    ToU32Array(entries, "entries", &a);
    e.assign(a.data, a.data + a.size);
  }
  if (!py::isinstance<py::float_>(rope_theta) && !py::isinstance<py::int_>(rope_theta)) {
    ThrowType("rope_theta", "must be a number");
  }
  py::array_t<float> out({static_cast<ssize_t>(d.heads), static_cast<ssize_t>(d.head_dim)});
  Check(V4Attend(pages, e, Span(qa), Span(sa), d, rope_theta.cast<double>(), std::span(out.mutable_data(), out.size()),
                 nullptr));
  return out;
}

// ---- Builders ------------------------------------------------------------------------------------

py::dict FlashMlaDense(const std::shared_ptr<PyManager>& pm, const py::object& request_ids, const py::object& layer,
                       const py::object& pending) {
  const py::module_ torch = Torch();
  ManagerLock lk(*pm);
  const std::vector<RequestId> ids = Requests(*pm, request_ids);
  const mounts::FlashMlaDenseArgs a = Take(mounts::BuildFlashMlaDense(
      *pm->m, ids, ToU32(layer, "layer"), mounts::MountOptions{.pending = ToU32(pending, "pending")}));
  py::dict d;
  d["k_cache"] = ToTorch(torch, pm, a.k_cache);
  d["block_table"] = Int32Tensor(torch, a.block_table, {static_cast<int64_t>(ids.size()), a.max_blocks});
  d["cache_seqlens"] = Int32Tensor(torch, a.cache_seqlens, {static_cast<int64_t>(ids.size())});
  d["head_dim_v"] = a.head_dim_v;
  return d;
}

py::dict FlashMlaSparse(const std::shared_ptr<PyManager>& pm, const py::object& request_ids, const py::object& layer,
                        const py::object& selected, const py::object& topk, const py::object& pending) {
  const py::module_ torch = Torch();
  ManagerLock lk(*pm);
  const std::vector<RequestId> ids = Requests(*pm, request_ids);
  const auto sel = Selections(selected, ids.size());
  const auto spans = Spans(sel);
  const mounts::FlashMlaSparseArgs a =
      Take(mounts::BuildFlashMlaSparse(*pm->m, ids, ToU32(layer, "layer"), spans, TopK(topk),
                                       mounts::MountOptions{.pending = ToU32(pending, "pending")}));
  return SparseDict(torch, pm, a, ids.size());
}

py::dict V4CompressedEntries(const std::shared_ptr<PyManager>& pm, const py::object& request_ids,
                             const py::object& layer, const py::object& selected, const py::object& topk,
                             const py::object& pending) {
  const py::module_ torch = Torch();
  ManagerLock lk(*pm);
  const std::vector<RequestId> ids = Requests(*pm, request_ids);
  std::vector<std::vector<uint64_t>> sel;
  if (!selected.is_none()) sel = Selections(selected, ids.size());
  const auto spans = Spans(sel);
  const mounts::FlashMlaSparseArgs a =
      Take(mounts::BuildV4CompressedEntries(*pm->m, ids, ToU32(layer, "layer"), spans, TopK(topk),
                                            mounts::MountOptions{.pending = ToU32(pending, "pending")}));
  return SparseDict(torch, pm, a, ids.size());
}

void V4Window(PyManager& pm, const py::object& layer) {
  ManagerLock lk(pm);
  Check(mounts::BuildV4Window(*pm.m, ToU32(layer, "layer")));
}

py::dict FlashInferMla(const std::shared_ptr<PyManager>& pm, const py::object& request_ids, const py::object& layer,
                       const py::object& q_len, const py::object& pending) {
  const py::module_ torch = Torch();
  ManagerLock lk(*pm);
  const std::vector<RequestId> ids = Requests(*pm, request_ids);
  const mounts::FlashInferMlaArgs a =
      Take(mounts::BuildFlashInferMla(*pm->m, ids, ToU32(layer, "layer"), ToU32(q_len, "q_len"),
                                      mounts::MountOptions{.pending = ToU32(pending, "pending")}));
  const auto n = [](const std::vector<int32_t>& v) { return std::vector<int64_t>{static_cast<int64_t>(v.size())}; };
  py::dict plan;
  plan["qo_indptr"] = Int32Tensor(torch, a.qo_indptr, n(a.qo_indptr));
  plan["kv_indptr"] = Int32Tensor(torch, a.kv_indptr, n(a.kv_indptr));
  plan["kv_indices"] = Int32Tensor(torch, a.kv_indices, n(a.kv_indices));
  plan["kv_len_arr"] = Int32Tensor(torch, a.kv_len_arr, n(a.kv_len_arr));
  plan["head_dim_ckv"] = a.head_dim_ckv;
  plan["head_dim_kpe"] = a.head_dim_kpe;
  plan["page_size"] = a.page_size;
  plan["kv_data_type"] = torch.attr("bfloat16");
  py::dict run;
  run["ckv_cache"] = ToTorch(torch, pm, a.ckv_cache);
  run["kpe_cache"] = ToTorch(torch, pm, a.kpe_cache);
  py::dict d;
  d["plan"] = plan;
  d["run"] = run;
  return d;
}

void AppendRandom(PyManager& pm, const py::object& request_id, const py::object& tokens, const py::object& seed) {
  U32Array t;
  ToU32Array(tokens, "tokens", &t);
  const uint64_t s = ToU64(seed, "seed");
  ManagerLock lk(pm);
  const RequestId r = pm.Live(request_id);
  if (!pm.backed) ThrowValue("backed", "an unbacked manager holds no KV bytes to write");
  auto failed = std::make_shared<Status>();
  const KvWriters w = RandomWriters(pm.m->pool(), s, failed);
  Status st;
  {
    py::gil_scoped_release nogil;
    st = pm.m->Append(r, std::span<const uint32_t>(t.data, t.size), w);
  }
  Check(st);
  Check(*failed);
}

}  // namespace

void BindMounts(py::module_& root) {
  py::module_ m = root.def_submodule("mounts", "Upstream attention kernels' arguments over a manager's pages");
  py::class_<MountBuffer>(m, "MountBuffer", py::buffer_protocol(),
                          "Bytes of a pool a kernel argument views (buffer protocol); keeps the manager alive.")
      .def_buffer([](MountBuffer& b) {
        return py::buffer_info(b.data, 1, py::format_descriptor<uint8_t>::format(), 1, {static_cast<ssize_t>(b.size)},
                               {ssize_t{1}}, false);
      });
  m.attr("FLASH_MLA_VERSION") = std::string(mounts::kFlashMlaVersion);
  m.attr("FLASHINFER_VERSION") = std::string(mounts::kFlashInferVersion);
  m.def("flash_mla_dense", &FlashMlaDense, py::arg("manager"), py::arg("request_ids"), py::arg("layer"), py::kw_only(),
        py::arg("pending") = 0,
        "FlashMLA flash_mla_with_kvcache's dense arguments: k_cache (bf16 [blocks, 64, 1, 576], a view of the "
        "pool), block_table, cache_seqlens (int32), head_dim_v.");
  m.def("flash_mla_sparse", &FlashMlaSparse, py::arg("manager"), py::arg("request_ids"), py::arg("layer"),
        py::arg("selected"), py::kw_only(), py::arg("topk") = py::none(), py::arg("pending") = 0,
        "FlashMLA's sparse decode arguments (DeepSeek-V3.2): k_cache (uint8 [blocks, block_tokens, 1, 656]), "
        "indices (int32 [batch, 1, topk]) of the positions `selected` per request, topk_length.");
  m.def("v4_compressed_entries", &V4CompressedEntries, py::arg("manager"), py::arg("request_ids"), py::arg("layer"),
        py::arg("selected") = py::none(), py::kw_only(), py::arg("topk") = py::none(), py::arg("pending") = 0,
        "DeepSeek-V4's compressed entries of one CSA/HCA layer as FlashMLA MODEL1 arguments: k_cache (uint8 "
        "[blocks, entries per block, 1, 584]), indices of `selected` entries (None: every complete one), "
        "topk_length.");
  m.def("v4_window", &V4Window, py::arg("manager"), py::arg("layer"),
        "DeepSeek-V4's window rows: refused (ValueError naming 'window', with the reason).");
  m.def("flashinfer_mla", &FlashInferMla, py::arg("manager"), py::arg("request_ids"), py::arg("layer"), py::kw_only(),
        py::arg("q_len") = 1, py::arg("pending") = 0,
        "FlashInfer BatchMLAPagedAttentionWrapper's arguments: {'plan': qo_indptr, kv_indptr, kv_indices, "
        "kv_len_arr, head_dim_ckv, head_dim_kpe, page_size, kv_data_type; 'run': ckv_cache, kpe_cache (two views "
        "of the same records)}.");
  m.def("append_random", &AppendRandom, py::arg("manager"), py::arg("request_id"), py::arg("tokens"), py::kw_only(),
        py::arg("seed") = 0,
        "Appends tokens whose records are valid random values in [-1, 1), a function of (seed, layer, position) "
        "(for examples and checks of a mount).");
  m.def("reference_decode", &ReferenceDecode, py::arg("manager"), py::arg("request_id"), py::arg("layer"),
        py::arg("q_lat"), py::arg("q_pe"), py::kw_only(), py::arg("softmax_scale"), py::arg("positions") = py::none(),
        "Tessera's CPU reference decode in the kernels' terms (attention.h MlaLatentDecode): (out float32 "
        "[heads, latent], lse float32 [heads], natural log) over `positions` (default: every token).");
  m.def("reference_indexer_topk", &ReferenceIndexerTopK, py::arg("manager"), py::arg("request_id"), py::arg("layer"),
        py::arg("q"), py::arg("weights"), py::kw_only(), py::arg("topk") = py::none(),
        "Tessera's reference lightning indexer (V3.2 over every token, V4 over the complete entries): the top-k, "
        "ascending (int64).");
  m.def("reference_v4_decode", &ReferenceV4Decode, py::arg("manager"), py::arg("request_id"), py::arg("layer"),
        py::arg("q"), py::arg("sink"), py::kw_only(), py::arg("entries") = py::none(), py::arg("rope_theta"),
        "Tessera's CPU reference DeepSeek-V4 decode (v4_attention.h V4Attend): window, then `entries` (HCA "
        "default: every complete one), one softmax with the sink; the output's RoPE dims rotated back.");
}

}  // namespace tessera::py_bind

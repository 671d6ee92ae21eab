// Shared by the binding files of tessera._core: errors, argument checks, the Bind* entry points.
//
// Every argument that comes from Python is checked here before it reaches the library: a wrong
// type is a TypeError, a wrong value (negative, out of range, wrong length) a ValueError, and
// both name the argument ("request_ids: ..."). Library errors (tessera::Status) become Python
// exceptions by code (ThrowStatus), with the field renamed the way Python spells it.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/geometry.h"
#include "tessera/status.h"

namespace tessera::py_bind {

namespace py = pybind11;

// model=NAME (a preset) or config=PATH (a config.json), exactly one; ValueError naming the
// argument otherwise (an unreadable config file too). Releases the GIL while reading the file.
Geometry LoadModelArg(const py::object& model, const py::object& config);

// One per binding file; module.cc calls them in order.
void BindErrors(py::module_& m);
void BindTierRecords(py::module_& m);  // bind_tier_records.cc (engine adapters)
void BindLedger(py::module_& m);
void BindManager(py::module_& m);
void BindStore(py::module_& m);
void BindEvents(py::module_& m);      // after BindManager: adds to tessera.RequestManager
void BindEnginePool(py::module_& m);  // bind_engine_pool.cc (vLLM adapter, several KV-cache groups)
void BindMounts(py::module_& m);      // bind_mounts.cc: tessera.mounts (kernel arguments over the pages)
void BindCuda(py::module_& m);        // bind_cuda.cc: CudaStaging when the CUDA module is built

// Exception types, created by BindErrors (module attributes TesseraError, OutOfBlocksError,
// DataLossError, TierIOError).
extern PyObject* g_tessera_error;
extern PyObject* g_out_of_blocks_error;
extern PyObject* g_data_loss_error;
extern PyObject* g_tier_io_error;

// A library field as Python names it: "kv-format" -> "kv_format".
std::string PyField(std::string_view field);
// Raises the Python exception for a non-OK status: kInvalidArgument, kNotFound, kOutOfRange ->
// ValueError (kFailedPrecondition too: a call the request's state does not allow, such as
// appending past the reserved slots); kOutOfBlocks -> OutOfBlocksError; kDataLoss -> DataLossError; kIoError ->
// TierIOError; others -> TesseraError. The message is "field: message".
[[noreturn]] void ThrowStatus(const Status& st);
inline void Check(const Status& st) {
  if (!st.ok()) ThrowStatus(st);
}
template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) ThrowStatus(r.status());
  return std::move(*r);
}

// As Take, with the error's field replaced by the Python argument `arg` (a parser that names its
// own field, e.g. ParseFsyncPolicy's "fsync" for the argument disk_fsync).
template <typename T>
T TakeAs(Result<T> r, std::string_view arg) {
  if (!r.ok()) ThrowStatus(Status(r.status().code(), std::string(arg), r.status().message()));
  return std::move(*r);
}

[[noreturn]] void ThrowType(std::string_view arg, std::string_view what);
[[noreturn]] void ThrowValue(std::string_view arg, std::string_view what);

// A Python int (not bool) in [0, max]; TypeError / ValueError naming `arg` otherwise.
uint64_t ToU64(py::handle obj, std::string_view arg, uint64_t max = UINT64_MAX);
uint32_t ToU32(py::handle obj, std::string_view arg);
// A str; TypeError naming `arg` otherwise.
std::string ToStr(py::handle obj, std::string_view arg);
bool ToBool(py::handle obj, std::string_view arg);

// A one-dimensional sequence of non-negative integers below 2^32: a numpy array of an integer
// dtype (any strides; other dtypes are a TypeError), or a list/tuple/range of ints. The values
// are read without a copy when `obj` is a C-contiguous uint32 array (then `data` points into
// it and `holder` keeps it); otherwise they are converted into `storage`.
struct U32Array {
  const uint32_t* data = nullptr;
  size_t size = 0;
  py::object holder;
  std::vector<uint32_t> storage;
};
void ToU32Array(py::handle obj, std::string_view arg, U32Array* out);

// As ToU32Array, for values below 2^64 (request ids: handles with a generation), always copied.
void ToU64Array(py::handle obj, std::string_view arg, std::vector<uint64_t>* out);

}  // namespace tessera::py_bind

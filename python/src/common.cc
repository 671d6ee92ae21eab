// Errors and argument checks shared by the binding files (common.h).
#include "common.h"

#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

namespace tessera::py_bind {

PyObject* g_tessera_error = nullptr;
PyObject* g_out_of_blocks_error = nullptr;
PyObject* g_data_loss_error = nullptr;
PyObject* g_tier_io_error = nullptr;

namespace {

PyObject* NewError(py::module_& m, const char* name, PyObject* base, const char* doc) {
  const std::string qualified = std::string("tessera.") + name;
  PyObject* e = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base, nullptr);
  if (e == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(e));  // add_object steals nothing: the module keeps its own reference
  return e;
}

}  // namespace

void BindErrors(py::module_& m) {
  g_tessera_error =
      NewError(m, "TesseraError", PyExc_RuntimeError, "An error of the Tessera library that is not about an argument.");
  g_out_of_blocks_error =
      NewError(m, "OutOfBlocksError", g_tessera_error, "The pool (or the request table) has no room; nothing changed.");
  g_data_loss_error = NewError(m, "DataLossError", g_tessera_error, "Stored bytes failed verification.");
  g_tier_io_error = NewError(m, "TierIOError", g_tessera_error, "Reading or writing a file or a tier failed.");
}

std::string PyField(std::string_view field) {
  std::string s(field);
  for (char& c : s) {
    if (c == '-') c = '_';
  }
  return s;
}

void ThrowStatus(const Status& st) {
  std::string msg = st.field().empty() ? st.message() : PyField(st.field()) + ": " + st.message();
  PyObject* type = g_tessera_error;
  switch (st.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:
      type = PyExc_ValueError;
      break;
    case StatusCode::kOutOfBlocks:
      type = g_out_of_blocks_error;
      break;
    case StatusCode::kDataLoss:
      type = g_data_loss_error;
      break;
    case StatusCode::kIoError:
      type = g_tier_io_error;
      break;
    default:
      break;
  }
  PyErr_SetString(type, msg.c_str());
  throw py::error_already_set();
}

void ThrowType(std::string_view arg, std::string_view what) {
  throw py::type_error(std::string(arg) + ": " + std::string(what));
}
void ThrowValue(std::string_view arg, std::string_view what) {
  throw py::value_error(std::string(arg) + ": " + std::string(what));
}

namespace {

std::string TypeName(py::handle obj) { return std::string(Py_TYPE(obj.ptr())->tp_name); }
std::string DtypeName(const py::dtype& dt) { return py::str(static_cast<py::handle>(dt)).cast<std::string>(); }

}  // namespace

uint64_t ToU64(py::handle obj, std::string_view arg, uint64_t max) {
  if (PyBool_Check(obj.ptr()) || !PyLong_Check(obj.ptr())) {
    // numpy integer scalars are accepted through __index__.
    if (!PyBool_Check(obj.ptr()) && PyIndex_Check(obj.ptr()) && !PyLong_Check(obj.ptr())) {
      py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(obj.ptr()));
      if (!i) throw py::error_already_set();
      return ToU64(i, arg, max);
    }
    ThrowType(arg, "must be an int (got " + TypeName(obj) + ")");
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow < 0 || (overflow == 0 && v < 0)) {
    ThrowValue(arg, "must not be negative (got " + py::str(obj).cast<std::string>() + ")");
  }
  uint64_t u = 0;
  if (overflow > 0) {
    u = PyLong_AsUnsignedLongLong(obj.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      ThrowValue(arg, "is above " + std::to_string(max) + " (got " + py::str(obj).cast<std::string>() + ")");
    }
  } else {
    u = static_cast<uint64_t>(v);
  }
  if (u > max) ThrowValue(arg, "is above " + std::to_string(max) + " (got " + std::to_string(u) + ")");
  return u;
}

uint32_t ToU32(py::handle obj, std::string_view arg) { return static_cast<uint32_t>(ToU64(obj, arg, UINT32_MAX)); }

std::string ToStr(py::handle obj, std::string_view arg) {
  if (!PyUnicode_Check(obj.ptr())) ThrowType(arg, "must be a str (got " + TypeName(obj) + ")");
  Py_ssize_t n = 0;
  const char* s = PyUnicode_AsUTF8AndSize(obj.ptr(), &n);
  if (s == nullptr) throw py::error_already_set();
  return std::string(s, static_cast<size_t>(n));
}

bool ToBool(py::handle obj, std::string_view arg) {
  if (!PyBool_Check(obj.ptr())) ThrowType(arg, "must be a bool (got " + TypeName(obj) + ")");
  return obj.ptr() == Py_True;
}

namespace {

// out[i] = element i of a strided integer array of T, refusing negatives and values past Out.
template <typename T, typename Out>
void ReadStrided(const char* base, ssize_t stride, size_t n, std::string_view arg, std::vector<Out>* out) {
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, base + static_cast<ssize_t>(i) * stride, sizeof(T));
    if constexpr (std::is_signed_v<T>) {
      if (v < 0) ThrowValue(arg, "element " + std::to_string(i) + " is negative (" + std::to_string(v) + ")");
    }
    const auto u = static_cast<uint64_t>(static_cast<std::make_unsigned_t<T>>(v));  // v >= 0 here
    if constexpr (sizeof(T) > sizeof(Out)) {
      constexpr uint64_t kMax = std::numeric_limits<Out>::max();
      if (u > kMax) {
        ThrowValue(
            arg, "element " + std::to_string(i) + " is above " + std::to_string(kMax) + " (" + std::to_string(v) + ")");
      }
    }
    (*out)[i] = static_cast<Out>(u);
  }
}

// ReadStrided of the unsigned type U or the signed type S of the same size.
template <typename U, typename S, typename Out>
void ReadSized(bool is_signed, const char* base, ssize_t stride, size_t n, std::string_view arg,
               std::vector<Out>* out) {
  static_assert(sizeof(U) == sizeof(S));
  if (is_signed) return ReadStrided<S>(base, stride, n, arg, out);
  ReadStrided<U>(base, stride, n, arg, out);
}

// ReadStrided for the array's integer dtype (kind 'u' or 'i', 1, 2, 4 or 8 bytes).
template <typename Out>
void ReadIntArray(const py::dtype& dt, const char* base, ssize_t stride, size_t n, std::string_view arg,
                  std::vector<Out>* out) {
  const bool is_signed = dt.kind() == 'i';
  switch (dt.itemsize()) {
    case 1:
      return ReadSized<uint8_t, int8_t>(is_signed, base, stride, n, arg, out);
    case 2:
      return ReadSized<uint16_t, int16_t>(is_signed, base, stride, n, arg, out);
    case 4:
      return ReadSized<uint32_t, int32_t>(is_signed, base, stride, n, arg, out);
    case 8:
      return ReadSized<uint64_t, int64_t>(is_signed, base, stride, n, arg, out);
    default:
      ThrowType(arg, "unsupported integer dtype " + DtypeName(dt));
  }
}

// A token id as CPython 3.11 keeps most of them: an exact int of at most one 30-bit digit, read
// from the object without a call (ADR 0037 amendment of 2026-12-03). False for anything else,
// which the caller reads the checked way; always false on another CPython (3.12 changed the
// layout; only Debian 12's 3.11 is built and tested here).
inline bool SmallInt(PyObject* o, uint32_t* v) {
#if PY_VERSION_HEX >= 0x030C0000
  (void)o;
  (void)v;
  return false;
#else
  static_assert(PyLong_SHIFT <= 32, "one digit fits a u32");
  if (!PyLong_CheckExact(o)) return false;
  const Py_ssize_t size = Py_SIZE(o);  // digits, negative for a negative int
  if (size == 0) {
    *v = 0;
    return true;
  }
  if (size != 1) return false;
  *v = static_cast<uint32_t>(reinterpret_cast<PyLongObject*>(o)->ob_digit[0]);
  return true;
#endif
}

}  // namespace

void ToU32Array(py::handle obj, std::string_view arg, U32Array* out) {
  out->data = nullptr;
  out->size = 0;
  out->holder = py::object();
  out->storage.clear();
  if (py::isinstance<py::array>(obj)) {
    auto a = py::reinterpret_borrow<py::array>(obj);
    if (a.ndim() != 1) ThrowValue(arg, "must be one-dimensional (got " + std::to_string(a.ndim()) + " dimensions)");
    const py::dtype dt = a.dtype();
    const char kind = dt.kind();
    if (kind != 'u' && kind != 'i') {
      ThrowType(arg, "must be an array of integers (got dtype " + DtypeName(dt) + ")");
    }
    // A non-native byte order is read by value: a native-order copy of the array.
    if (!dt.attr("isnative").cast<bool>()) {
      py::object native = a.attr("astype")(dt.attr("newbyteorder")("="));
      ToU32Array(native, arg, out);  // holds the copy when it views it
      return;
    }
    const auto n = static_cast<size_t>(a.shape(0));
    const ssize_t stride = a.strides(0);
    const auto* base = static_cast<const char*>(a.data());
    const ssize_t size = dt.itemsize();
    if (kind == 'u' && size == 4 && (n <= 1 || stride == 4)) {
      out->data = reinterpret_cast<const uint32_t*>(base);
      out->size = n;
      out->holder = a;
      return;
    }
    ReadIntArray(dt, base, stride, n, arg, &out->storage);
  } else if (PySequence_Check(obj.ptr()) && !PyUnicode_Check(obj.ptr()) && !PyBytes_Check(obj.ptr()) &&
             !PyByteArray_Check(obj.ptr())) {
    // A list, tuple or range, or any other Sequence of ints (vLLM's ConstantList, array.array):
    // one pass over its items (a list or tuple as it is, anything else through its iterator).
    py::object fast = py::reinterpret_steal<py::object>(PySequence_Fast(obj.ptr(), "not a sequence"));
    if (!fast) throw py::error_already_set();
    const auto n = static_cast<size_t>(PySequence_Fast_GET_SIZE(fast.ptr()));
    PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
    out->storage.resize(n);
    for (size_t i = 0; i < n; ++i) {
      // An int in range: read in place; anything else (and every error) by ToU32, which names it.
      uint32_t small = 0;
      if (SmallInt(items[i], &small)) {
        out->storage[i] = small;
        continue;
      }
      if (PyLong_CheckExact(items[i])) {
        int overflow = 0;
        const long long v = PyLong_AsLongLongAndOverflow(items[i], &overflow);
        if (overflow == 0 && v >= 0 && v <= static_cast<long long>(UINT32_MAX)) {
          out->storage[i] = static_cast<uint32_t>(v);
          continue;
        }
        PyErr_Clear();
      }
      out->storage[i] = ToU32(items[i], std::string(arg) + "[" + std::to_string(i) + "]");
    }
  } else {
    ThrowType(arg, "must be a numpy integer array or a sequence of ints (got " + TypeName(obj) + ")");
  }
  out->data = out->storage.data();
  out->size = out->storage.size();
}

void ToU64Array(py::handle obj, std::string_view arg, std::vector<uint64_t>* out) {
  out->clear();
  if (py::isinstance<py::array>(obj)) {
    auto a = py::reinterpret_borrow<py::array>(obj);
    if (a.ndim() != 1) ThrowValue(arg, "must be one-dimensional (got " + std::to_string(a.ndim()) + " dimensions)");
    const py::dtype dt = a.dtype();
    const char kind = dt.kind();
    if (kind != 'u' && kind != 'i') ThrowType(arg, "must be an array of integers (got dtype " + DtypeName(dt) + ")");
    if (!dt.attr("isnative").cast<bool>()) {  // read by value: a native-order copy
      ToU64Array(a.attr("astype")(dt.attr("newbyteorder")("=")), arg, out);
      return;
    }
    const auto n = static_cast<size_t>(a.shape(0));
    const ssize_t stride = a.strides(0);
    const auto* base = static_cast<const char*>(a.data());
    if (kind == 'u' && dt.itemsize() == 8 && (n <= 1 || stride == 8)) {  // the handles' own dtype
      out->resize(n);
      if (n > 0) std::memcpy(out->data(), base, n * sizeof(uint64_t));
      return;
    }
    ReadIntArray(dt, base, stride, n, arg, out);
  } else if (PySequence_Check(obj.ptr()) && !PyUnicode_Check(obj.ptr()) && !PyBytes_Check(obj.ptr()) &&
             !PyByteArray_Check(obj.ptr())) {
    py::object fast = py::reinterpret_steal<py::object>(PySequence_Fast(obj.ptr(), "not a sequence"));
    if (!fast) throw py::error_already_set();
    const auto n = static_cast<size_t>(PySequence_Fast_GET_SIZE(fast.ptr()));
    PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
    out->resize(n);
    for (size_t i = 0; i < n; ++i) (*out)[i] = ToU64(items[i], std::string(arg) + "[" + std::to_string(i) + "]");
  } else {
    ThrowType(arg, "must be a numpy integer array or a sequence of ints (got " + TypeName(obj) + ")");
  }
}

Geometry LoadModelArg(const py::object& model, const py::object& config) {
  if (!model.is_none() && !config.is_none()) ThrowValue("model", "give model or config, not both");
  if (!config.is_none()) {
    const std::string path = ToStr(config, "config");
    Result<Geometry> g = [&] {
      py::gil_scoped_release nogil;
      return LoadConfigFile(path);
    }();
    if (!g.ok() && g.status().code() == StatusCode::kIoError) {
      ThrowStatus(InvalidArgument("config", g.status().message()));
    }
    return Take(std::move(g));
  }
  if (model.is_none()) ThrowValue("model", "missing: give model=NAME (a preset) or config=PATH");
  return Take(LoadPreset(ToStr(model, "model")));
}

}  // namespace tessera::py_bind

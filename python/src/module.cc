// tessera._core: the extension module of the Python package `tessera` (docs/PYTHON.md).
//
// Each binding file defines one Bind* function (common.h); this file only calls them, so that a
// new file adds one line here.
#include <pybind11/pybind11.h>

#include "common.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "Tessera: KV-cache ledger and request manager for MLA models (C++ core)";
  tessera::py_bind::BindErrors(m);
  tessera::py_bind::BindTierRecords(m);
  tessera::py_bind::BindLedger(m);
  tessera::py_bind::BindManager(m);
  tessera::py_bind::BindStore(m);
  tessera::py_bind::BindEvents(m);
  tessera::py_bind::BindEnginePool(m);
  tessera::py_bind::BindMounts(m);
  tessera::py_bind::BindCuda(m);
}

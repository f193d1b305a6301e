// Fray: the one generic binder between Python and the torch-free launchers.
//
// Every launcher is called as  ext.<name>(ptrs, ints, floats, device, stream)  with three tuples
// of Python ints / ints / floats. fill_args() reads them with the CPython API straight into fixed
// storage (no allocation, no per-argument pybind11 casters), so one call costs the same for every
// op; a family's binding file is then only a list of def_launcher() lines.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/common/launch_abi.h"

namespace fray {

// Storage for one call's arguments; FrayArgs points into it.
struct ArgPack {
  static constexpr int kMax = 48;
  uint64_t ptrs[kMax];
  int64_t ints[kMax];
  double floats[kMax];
  FrayArgs args;
};

namespace binder_detail {

inline int tuple_size(PyObject* t, const char* what) {
  if (!PyTuple_Check(t)) {
    throw std::invalid_argument(std::string("fray: launcher ") + what + " must be a tuple");
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(t);
  if (n > ArgPack::kMax) {
    throw std::invalid_argument(std::string("fray: launcher ") + what + " holds more than " +
                                std::to_string(ArgPack::kMax) + " values");
  }
  return static_cast<int>(n);
}

}  // namespace binder_detail

// Fills `pack` from the Python tuples; raises (as a Python exception) on a non-int / non-float.
inline const FrayArgs& fill_args(ArgPack& pack, pybind11::handle ptrs, pybind11::handle ints,
                                 pybind11::handle floats, int device, uint64_t stream) {
  using binder_detail::tuple_size;
  const int np = tuple_size(ptrs.ptr(), "ptrs");
  const int ni = tuple_size(ints.ptr(), "ints");
  const int nf = tuple_size(floats.ptr(), "floats");
  for (int i = 0; i < np; ++i) pack.ptrs[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(ptrs.ptr(), i));
  for (int i = 0; i < ni; ++i) pack.ints[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(ints.ptr(), i));
  for (int i = 0; i < nf; ++i) pack.floats[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(floats.ptr(), i));
  if (PyErr_Occurred()) throw pybind11::error_already_set();
  pack.args = FrayArgs{pack.ptrs, np, pack.ints, ni, pack.floats, nf, device, stream};
  return pack.args;
}

// An ahead-of-time launcher: validates nothing the Python layer already checked, throws
// std::invalid_argument (-> ValueError) or std::runtime_error (-> RuntimeError) on failure.
using Launcher = void (*)(const FrayArgs&);

inline void def_launcher(pybind11::module_& m, const char* name, Launcher fn, const char* doc) {
  m.def(
      name,
      [fn](pybind11::handle ptrs, pybind11::handle ints, pybind11::handle floats, int device,
           uint64_t stream) {
        ArgPack pack;
        fn(fill_args(pack, ptrs, ints, floats, device, stream));
      },
      doc);
}

}  // namespace fray

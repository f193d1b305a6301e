// Fray: the one generic binder between Python and the torch-free launchers.
//
// Every launcher is called as  ext.<name>(ptrs, ints, floats, device, stream)  with three tuples
// of Python ints (or tensors and None in ptrs: see address()) / ints / floats. fill_args() reads them with the CPython API straight into fixed
// storage (no allocation, no per-argument pybind11 casters), so one call costs the same for every
// op; a family's binding file is then only a list of def_launcher() lines. The slot order of each
// launcher's tuples is documented beside it (cuda/<family>/<family>.h).
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>

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
  if (!PyTuple_Check(t)) {  // a wrong type is a TypeError, as in Python
    PyErr_Format(PyExc_TypeError, "fray: launcher %s must be a tuple, got %s", what, Py_TYPE(t)->tp_name);
    throw pybind11::error_already_set();
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(t);
  if (n > ArgPack::kMax) {
    throw std::invalid_argument(std::string("fray: launcher ") + what + " holds more than " +
                                std::to_string(ArgPack::kMax) + " values");
  }
  return static_cast<int>(n);
}

// A ptrs item: an int address, None (0: an absent optional tensor), or an object with a
// data_ptr() method (a torch.Tensor), whose address is read here rather than by a Python-level
// loop over the tensors before the call. Errors are left set for fill_args to raise.
inline uint64_t address(PyObject* item) {
  if (PyLong_Check(item)) return PyLong_AsUnsignedLongLong(item);
  if (item == Py_None) return 0;
  static PyObject* const name = PyUnicode_InternFromString("data_ptr");
  PyObject* value = PyObject_CallMethodNoArgs(item, name);
  if (value == nullptr) return 0;
  const uint64_t out = PyLong_AsUnsignedLongLong(value);
  Py_DECREF(value);
  return out;
}

}  // namespace binder_detail

// Fills `pack` from the Python tuples; raises (as a Python exception) on a non-int / non-float.
inline const FrayArgs& fill_args(ArgPack& pack, pybind11::handle ptrs, pybind11::handle ints,
                                 pybind11::handle floats, int device, uint64_t stream) {
  using binder_detail::tuple_size;
  const int np = tuple_size(ptrs.ptr(), "ptrs");
  const int ni = tuple_size(ints.ptr(), "ints");
  const int nf = tuple_size(floats.ptr(), "floats");
  for (int i = 0; i < np; ++i) pack.ptrs[i] = binder_detail::address(PyTuple_GET_ITEM(ptrs.ptr(), i));
  for (int i = 0; i < ni; ++i) pack.ints[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(ints.ptr(), i));
  for (int i = 0; i < nf; ++i) pack.floats[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(floats.ptr(), i));
  if (PyErr_Occurred()) throw pybind11::error_already_set();
  pack.args = FrayArgs{pack.ptrs, np, pack.ints, ni, pack.floats, nf, device, stream};
  return pack.args;
}

// An ahead-of-time launcher: validates nothing the Python layer already checked, throws
// std::invalid_argument (-> ValueError) or std::runtime_error (-> RuntimeError) on failure.
using Launcher = void (*)(const FrayArgs&);

namespace binder_detail {

// The Python entry of every launcher, a METH_FASTCALL C function: pybind11's dispatcher (argument
// casters, overload resolution, keyword handling) cost more per call than the launch itself.
inline PyObject* call_launcher(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  const auto fn = reinterpret_cast<Launcher>(PyCapsule_GetPointer(self, "fray.launcher"));
  if (fn == nullptr) return nullptr;
  if (nargs != 5) {
    PyErr_Format(PyExc_TypeError, "fray: a launcher takes (ptrs, ints, floats, device, stream), got %zd arguments",
                 nargs);
    return nullptr;
  }
  const long device = PyLong_AsLong(args[3]);
  const unsigned long long stream = PyLong_AsUnsignedLongLong(args[4]);
  if (PyErr_Occurred()) return nullptr;
  try {
    ArgPack pack;
    fn(fill_args(pack, args[0], args[1], args[2], static_cast<int>(device), stream));
  } catch (pybind11::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

}  // namespace binder_detail

// m.<name>(ptrs, ints, floats, device, stream) calls fn. The method table entry lives as long as
// the process (modules are never unloaded), so it is allocated once and never freed.
inline void def_launcher(pybind11::module_& m, const char* name, Launcher fn, const char* doc) {
  auto* def = new PyMethodDef{name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(
                                        &binder_detail::call_launcher)),
                              METH_FASTCALL, doc};
  pybind11::capsule self(reinterpret_cast<void*>(fn), "fray.launcher");
  PyObject* f = PyCFunction_NewEx(def, self.ptr(), m.attr("__name__").ptr());
  if (f == nullptr) throw pybind11::error_already_set();
  m.add_object(name, pybind11::reinterpret_steal<pybind11::object>(f));
}

#ifndef FRAY_CUDA_ARCHS
#define FRAY_CUDA_ARCHS "unknown"
#endif

// The build facts every family module reports, written once: m.archs() (the architectures its
// kernels were built for: FRAY_CUDA_ARCHS, which tools/cuda.bzl defines for the kernels'
// dependents) and m.cuda_runtime_version() (cudaRuntimeGetVersion()).
inline void def_build_info(pybind11::module_& m) {
  m.def("archs", [] { return std::string(FRAY_CUDA_ARCHS); }, "CUDA architectures this extension was compiled for.");
  m.def(
      "cuda_runtime_version",
      [] {
        int version = 0;
        if (cudaRuntimeGetVersion(&version) != cudaSuccess) throw std::runtime_error("fray: cudaRuntimeGetVersion failed");
        return version;
      },
      "cudaRuntimeGetVersion().");
}

}  // namespace fray

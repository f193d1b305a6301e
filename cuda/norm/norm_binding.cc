// Fray norm family: Python module _norm (bindings only; logic in norm_api.cc).
#include <pybind11/pybind11.h>

#include "cuda/common/binder.h"
#include "cuda/norm/norm.h"

namespace api = fray::norm_api;

PYBIND11_MODULE(_norm, m) {
  m.doc() = "Fray norm CUDA kernels: launchers (ptrs, ints, floats, device, stream); slots in cuda/norm/norm.h.";
  fray::def_launcher(m, "rmsnorm", &api::rmsnorm, "y = rmsnorm(x [+ residual -> sum_out]) * (weight + weight_offset).");
  fray::def_launcher(m, "layernorm", &api::layernorm, "y = layernorm(x) * weight (+ bias).");
  fray::def_build_info(m);
  m.def("num_kernel_instances", &api::num_kernel_instances, "Number of compiled RMSNorm kernels.");
}

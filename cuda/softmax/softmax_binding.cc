// Fray softmax family: Python module _softmax (bindings only; logic in softmax_api.cc).
#include <pybind11/pybind11.h>

#include "cuda/common/binder.h"
#include "cuda/softmax/softmax.h"

namespace api = fray::softmax_api;

PYBIND11_MODULE(_softmax, m) {
  m.doc() = "Fray softmax CUDA kernels: launchers (ptrs, ints, floats, device, stream); slots in "
            "cuda/softmax/softmax.h.";
  fray::def_launcher(m, "softmax", &api::softmax,
                     "y = softmax(x / temperature) per row (+ fp32 row max and log-sum-exp when given).");
  fray::def_build_info(m);
  m.def("num_kernel_instances", &api::num_kernel_instances, "Number of compiled softmax kernels.");
}

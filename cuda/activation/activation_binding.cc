// Fray activation family: Python module _activation (bindings only; logic in activation_api.cc).
#include <pybind11/pybind11.h>

#include "cuda/activation/activation.h"
#include "cuda/common/binder.h"

namespace api = fray::activation_api;

PYBIND11_MODULE(_activation, m) {
  m.doc() = "Fray gated-activation CUDA kernels: launchers (ptrs, ints, floats, device, stream); slots in "
            "cuda/activation/activation.h.";
  fray::def_launcher(m, "act_mul", &api::act_mul, "out = act(gate) * up (silu, gelu erf or gelu tanh).");
  fray::def_launcher(m, "unary", &api::unary, "out = act(x) (silu, gelu erf, gelu tanh, relu, tanh, sigmoid).");
  fray::def_build_info(m);
  m.def("num_kernel_instances", &api::num_kernel_instances, "Number of compiled activation kernels.");
}

// Fray rope family: Python module _rope (bindings only; logic in rope_api.cc).
#include <pybind11/pybind11.h>

#include "cuda/common/binder.h"
#include "cuda/rope/rope.h"

namespace api = fray::rope_api;

PYBIND11_MODULE(_rope, m) {
  m.doc() = "Fray rotary-embedding CUDA kernels: launchers (ptrs, ints, floats, device, stream); slots in "
            "cuda/rope/rope.h.";
  fray::def_launcher(m, "rope", &api::rope, "Rotary embedding of q (and k when given) by cos/sin rows at positions.");
  fray::def_build_info(m);
  m.def("num_kernel_instances", &api::num_kernel_instances, "Number of compiled rope kernels.");
}

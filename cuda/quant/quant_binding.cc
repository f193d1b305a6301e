// Fray quant family: Python module _quant (bindings only; logic in quant_api.cc).
#include <pybind11/pybind11.h>

#include "cuda/common/binder.h"
#include "cuda/quant/quant.h"

namespace api = fray::quant_api;

PYBIND11_MODULE(_quant, m) {
  m.doc() = "Fray quantizer CUDA kernels: launchers (ptrs, ints, floats, device, stream); slots in "
            "cuda/quant/quant.h.";
  fray::def_launcher(m, "quantize", &api::quantize,
                     "q, scale = x quantized per row or per (1, 128) block to int8 / float8_e4m3fn.");
  fray::def_build_info(m);
  m.def("num_kernel_instances", &api::num_kernel_instances, "Number of compiled quantizer kernels.");
}

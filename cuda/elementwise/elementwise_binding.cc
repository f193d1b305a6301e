// Fray elementwise family: Python module _elementwise (bindings only; logic in elementwise_api.cc).
#include <pybind11/pybind11.h>

#include "cuda/common/binder.h"
#include "cuda/elementwise/elementwise.h"

namespace api = fray::elementwise_api;

PYBIND11_MODULE(_elementwise, m) {
  m.doc() = "Fray elementwise CUDA kernels: launchers (ptrs, ints, floats, device, stream); slots in "
            "cuda/elementwise/elementwise.h.";
  fray::def_launcher(m, "vector_add", &api::vector_add, "out = a + b over n dense elements.");
  fray::def_launcher(m, "mul", &api::mul, "out = a * b over n dense elements.");
  fray::def_launcher(m, "axpy", &api::axpy, "out = a * x + b (scalars a, b) over n dense elements.");
  fray::def_build_info(m);
}

// Fray elementwise family: Python module _elementwise (bindings only; logic in elementwise_api.cc).
#include <pybind11/pybind11.h>

#include "cuda/elementwise/elementwise.h"

namespace api = fray::elementwise_api;
namespace py = pybind11;

PYBIND11_MODULE(_elementwise, m) {
  m.doc() = "Fray elementwise CUDA kernels (raw-pointer API; dtype codes 0 fp32, 1 fp16, 2 bf16).";
  m.def("vector_add", &api::vector_add, "out = a + b over n dense elements on the given stream.", py::arg("a"),
        py::arg("b"), py::arg("out"), py::arg("n"), py::arg("dtype"), py::arg("device_index"), py::arg("stream"));
  m.def("archs", &api::archs, "CUDA architectures this extension was compiled for.");
  m.def("cuda_runtime_version", &api::cuda_runtime_version, "cudaRuntimeGetVersion().");
}

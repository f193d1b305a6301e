// Fray softmax family: Python module _softmax (bindings only; logic in softmax_api.cc).
#include <pybind11/pybind11.h>

#include "cuda/softmax/softmax.h"

namespace api = fray::softmax_api;
namespace py = pybind11;

PYBIND11_MODULE(_softmax, m) {
  m.doc() = "Fray softmax CUDA kernels (raw-pointer API; dtype codes 0 fp32, 1 fp16, 2 bf16).";
  m.def("softmax", &api::softmax, "y = softmax(x / temperature) over each row, on the given stream.", py::arg("x"),
        py::arg("x_row_stride"), py::arg("x_dtype"), py::arg("y"), py::arg("y_row_stride"), py::arg("y_dtype"),
        py::arg("rows"), py::arg("cols"), py::arg("temperature"), py::arg("device_index"), py::arg("stream"));
  m.def("online_softmax", &api::online_softmax,
        "y = softmax(x) over each row, plus the fp32 row max and natural-log log-sum-exp.", py::arg("x"),
        py::arg("x_row_stride"), py::arg("y"), py::arg("y_row_stride"), py::arg("row_max"), py::arg("row_lse"),
        py::arg("rows"), py::arg("cols"), py::arg("dtype"), py::arg("device_index"), py::arg("stream"));
  m.def("archs", &api::archs, "CUDA architectures this extension was compiled for.");
  m.def("cuda_runtime_version", &api::cuda_runtime_version, "cudaRuntimeGetVersion().");
  m.def("num_kernel_instances", &api::num_kernel_instances, "Number of compiled softmax kernels.");
}

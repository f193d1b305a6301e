// Fray activation family: Python module _activation (bindings only; logic in activation_api.cc).
#include <pybind11/pybind11.h>

#include "cuda/activation/activation.h"

namespace api = fray::activation_api;
namespace py = pybind11;

PYBIND11_MODULE(_activation, m) {
  m.doc() = "Fray gated-activation CUDA kernels (raw-pointer API; dtype codes 0 fp32, 1 fp16, 2 bf16).";
  m.def("silu_mul", &api::silu_mul, "out = silu(gate) * up on the given stream.", py::arg("gate"),
        py::arg("gate_row_stride"), py::arg("up"), py::arg("up_row_stride"), py::arg("out"),
        py::arg("out_row_stride"), py::arg("rows"), py::arg("d"), py::arg("dtype"), py::arg("device_index"),
        py::arg("stream"));
  m.def("gelu_mul", &api::gelu_mul, "out = gelu(gate) * up (erf, or tanh if approximate_tanh) on the given stream.",
        py::arg("gate"), py::arg("gate_row_stride"), py::arg("up"), py::arg("up_row_stride"), py::arg("out"),
        py::arg("out_row_stride"), py::arg("rows"), py::arg("d"), py::arg("approximate_tanh"), py::arg("dtype"),
        py::arg("device_index"), py::arg("stream"));
  m.def("archs", &api::archs, "CUDA architectures this extension was compiled for.");
  m.def("cuda_runtime_version", &api::cuda_runtime_version, "cudaRuntimeGetVersion().");
  m.def("num_kernel_instances", &api::num_kernel_instances, "Number of compiled activation kernels.");
}

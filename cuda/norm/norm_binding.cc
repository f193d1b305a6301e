// Fray norm family: Python module _norm (bindings only; logic in norm_api.cc).
#include <pybind11/pybind11.h>

#include "cuda/norm/norm.h"

namespace api = fray::norm_api;
namespace py = pybind11;

PYBIND11_MODULE(_norm, m) {
  m.doc() = "Fray RMSNorm CUDA kernels (raw-pointer API; dtype codes 0 fp32, 1 fp16, 2 bf16).";
  m.def("rmsnorm", &api::rmsnorm, "y = rmsnorm(x) * (weight + weight_offset) on the given stream.", py::arg("x"),
        py::arg("x_row_stride"), py::arg("weight"), py::arg("weight_dtype"), py::arg("y"), py::arg("y_row_stride"),
        py::arg("rows"), py::arg("hidden"), py::arg("eps"), py::arg("weight_offset"), py::arg("x_dtype"),
        py::arg("device_index"), py::arg("stream"));
  m.def("add_rmsnorm", &api::add_rmsnorm,
        "sum_out = x + residual (rounded); y = rmsnorm(sum_out) * (weight + weight_offset).", py::arg("x"),
        py::arg("x_row_stride"), py::arg("residual"), py::arg("residual_row_stride"), py::arg("weight"),
        py::arg("weight_dtype"), py::arg("y"), py::arg("y_row_stride"), py::arg("sum_out"),
        py::arg("sum_row_stride"), py::arg("rows"), py::arg("hidden"), py::arg("eps"), py::arg("weight_offset"),
        py::arg("x_dtype"), py::arg("device_index"), py::arg("stream"));
  m.def("layernorm", &api::layernorm, "y = layernorm(x) * weight (+ bias; bias = 0: none) on the given stream.",
        py::arg("x"), py::arg("x_row_stride"), py::arg("weight"), py::arg("weight_dtype"), py::arg("bias"),
        py::arg("bias_dtype"), py::arg("y"), py::arg("y_row_stride"), py::arg("rows"), py::arg("hidden"),
        py::arg("eps"), py::arg("x_dtype"), py::arg("device_index"), py::arg("stream"));
  m.def("archs", &api::archs, "CUDA architectures this extension was compiled for.");
  m.def("cuda_runtime_version", &api::cuda_runtime_version, "cudaRuntimeGetVersion().");
  m.def("num_kernel_instances", &api::num_kernel_instances, "Number of compiled RMSNorm kernels.");
}

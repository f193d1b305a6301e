// Fray rope family: Python module _rope (bindings only; logic in rope_api.cc).
#include <pybind11/pybind11.h>

#include "cuda/rope/rope.h"

namespace api = fray::rope_api;
namespace py = pybind11;

PYBIND11_MODULE(_rope, m) {
  m.doc() = "Fray rotary-embedding CUDA kernels (raw-pointer API; dtype codes 0 fp32, 1 fp16, 2 bf16).";
  m.def("rope", &api::rope,
        "Rotary embedding of q (and k when k != 0) by cos/sin rows at positions, on the given stream.",
        py::arg("q"), py::arg("q_token_stride"), py::arg("q_head_stride"), py::arg("q_out"),
        py::arg("q_out_token_stride"), py::arg("q_out_head_stride"), py::arg("k"), py::arg("k_token_stride"),
        py::arg("k_head_stride"), py::arg("k_out"), py::arg("k_out_token_stride"), py::arg("k_out_head_stride"),
        py::arg("positions"), py::arg("positions_dtype"), py::arg("positions_stride"),
        py::arg("position_offset"), py::arg("cos"), py::arg("sin"), py::arg("cs_row_stride"), py::arg("tokens"),
        py::arg("q_heads"), py::arg("k_heads"), py::arg("head_dim"), py::arg("rotary_dim"), py::arg("neox"),
        py::arg("dtype"), py::arg("device_index"), py::arg("stream"));
  m.def("archs", &api::archs, "CUDA architectures this extension was compiled for.");
  m.def("cuda_runtime_version", &api::cuda_runtime_version, "cudaRuntimeGetVersion().");
  m.def("num_kernel_instances", &api::num_kernel_instances, "Number of compiled rope kernels.");
}

// Fray attention family: Python module _attention (bindings only; logic in attention_api.cc).
#include <pybind11/pybind11.h>

#include "cuda/attention/attention.h"

namespace api = fray::attention_api;
namespace py = pybind11;

PYBIND11_MODULE(_attention, m) {
  m.doc() = "Fray attention CUDA kernels (raw-pointer API; dtype codes 0 fp32, 1 fp16, 2 bf16).";
  m.def("decode_split_size", &api::decode_split_size,
        "Tokens per KV split for a decode launch (num_splits 0: the heuristic); splits = ceil(T / it).",
        py::arg("dtype"), py::arg("head_dim"), py::arg("group"), py::arg("batch"), py::arg("n_kv_heads"),
        py::arg("capacity"), py::arg("num_splits"), py::arg("num_sms"), py::arg("paged") = false);
  m.def("decode", &api::decode,
        "Split-KV decode attention over a contiguous (block_table 0) or paged cache, on the given stream.",
        py::arg("q"), py::arg("q_sb"), py::arg("q_sh"), py::arg("k"), py::arg("k_sb"), py::arg("k_sh"),
        py::arg("k_st"), py::arg("v"), py::arg("v_sb"), py::arg("v_sh"), py::arg("v_st"), py::arg("lens"),
        py::arg("block_table"), py::arg("bt_sb"), py::arg("page_size"), py::arg("out"), py::arg("o_sb"),
        py::arg("o_sh"), py::arg("lse"), py::arg("lse_sb"), py::arg("part_out"), py::arg("part_lse"),
        py::arg("batch"), py::arg("n_heads"), py::arg("n_kv_heads"), py::arg("head_dim"), py::arg("capacity"),
        py::arg("num_splits"), py::arg("split_size"), py::arg("scale"), py::arg("dtype"),
        py::arg("device_index"), py::arg("stream"));
  m.def("kv_append", &api::kv_append,
        "In place: cache position lens[b] of every sequence gets k_new[b] / v_new[b] (block_table 0: contiguous).",
        py::arg("k"), py::arg("k_sb"), py::arg("k_sh"), py::arg("k_st"), py::arg("v"), py::arg("v_sb"),
        py::arg("v_sh"), py::arg("v_st"), py::arg("k_new"), py::arg("kn_sb"), py::arg("kn_sh"), py::arg("v_new"),
        py::arg("vn_sb"), py::arg("vn_sh"), py::arg("lens"), py::arg("block_table"), py::arg("bt_sb"),
        py::arg("page_size"), py::arg("batch"), py::arg("n_kv_heads"), py::arg("head_dim"), py::arg("capacity"),
        py::arg("dtype"), py::arg("device_index"), py::arg("stream"));
  m.def("archs", &api::archs, "CUDA architectures this extension was compiled for.");
  m.def("cuda_runtime_version", &api::cuda_runtime_version, "cudaRuntimeGetVersion().");
  m.def("num_kernel_instances", &api::num_kernel_instances, "Number of compiled attention kernels.");
}

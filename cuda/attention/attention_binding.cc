// Fray attention family: Python module _attention (bindings only; logic in attention_api.cc).
#include <pybind11/pybind11.h>

#include "cuda/attention/attention.h"
#include "cuda/common/binder.h"

namespace api = fray::attention_api;
namespace py = pybind11;

PYBIND11_MODULE(_attention, m) {
  m.doc() = "Fray attention CUDA kernels: launchers (ptrs, ints, floats, device, stream); slots in "
            "cuda/attention/attention.h.";
  m.def("decode_split_size", &api::decode_split_size,
        "Tokens per KV split for a decode launch (num_splits 0: the heuristic); splits = ceil(T / it).",
        py::arg("dtype"), py::arg("head_dim"), py::arg("group"), py::arg("batch"), py::arg("n_kv_heads"),
        py::arg("capacity"), py::arg("num_splits"), py::arg("num_sms"), py::arg("paged") = false);
  fray::def_launcher(m, "decode", &api::decode,
                     "Split-KV decode attention over a contiguous (block_table 0) or paged cache.");
  fray::def_launcher(m, "kv_append", &api::kv_append,
                     "In place: cache position lens[b] of every sequence gets k_new[b] / v_new[b].");
  fray::def_build_info(m);
  m.def("num_kernel_instances", &api::num_kernel_instances, "Number of compiled attention kernels.");
}

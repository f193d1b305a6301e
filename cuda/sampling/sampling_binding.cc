// Fray sampling family: Python module _sampling (bindings only; logic in sampling_api.cc).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cuda/sampling/sampling.h"

namespace api = fray::sampling_api;
namespace py = pybind11;

PYBIND11_MODULE(_sampling, m) {
  m.doc() = "Fray sampling CUDA kernels (raw-pointer API; a pointer of 0 selects the scalar after it; "
            "dtype codes 0 fp32, 1 fp16, 2 bf16).";
  m.def("sample", &api::sample, "One token (and its logprob) per row: temperature, top-k, top-p, min-p, Philox draw.",
        py::arg("logits"), py::arg("row_stride"), py::arg("dtype"), py::arg("rows"), py::arg("cols"),
        py::arg("temperature"), py::arg("temperature_value"), py::arg("top_k"), py::arg("top_k_value"),
        py::arg("top_p"), py::arg("top_p_value"), py::arg("min_p"), py::arg("min_p_value"), py::arg("seeds"),
        py::arg("seed_value"), py::arg("offsets"), py::arg("offset_value"), py::arg("tokens"), py::arg("logprobs"),
        py::arg("device_index"), py::arg("stream"));
  m.def("apply_penalties", &api::apply_penalties, "Repetition / presence / frequency penalties in place (CSR).",
        py::arg("logits"), py::arg("row_stride"), py::arg("dtype"), py::arg("rows"), py::arg("cols"),
        py::arg("token_ids"), py::arg("ids_int64"), py::arg("num_ids"), py::arg("token_offsets"),
        py::arg("offsets_int64"), py::arg("repetition"), py::arg("repetition_value"), py::arg("presence"),
        py::arg("presence_value"), py::arg("frequency"), py::arg("frequency_value"), py::arg("device_index"),
        py::arg("stream"));
  m.def("decode_step", &api::decode_step, "apply_penalties then sample: two launches, no host sync.",
        py::arg("logits"), py::arg("row_stride"), py::arg("dtype"), py::arg("rows"), py::arg("cols"),
        py::arg("token_ids"), py::arg("ids_int64"), py::arg("num_ids"), py::arg("token_offsets"),
        py::arg("offsets_int64"), py::arg("repetition"), py::arg("repetition_value"), py::arg("presence"),
        py::arg("presence_value"), py::arg("frequency"), py::arg("frequency_value"), py::arg("temperature"),
        py::arg("temperature_value"), py::arg("top_k"), py::arg("top_k_value"), py::arg("top_p"),
        py::arg("top_p_value"), py::arg("min_p"), py::arg("min_p_value"), py::arg("seeds"), py::arg("seed_value"),
        py::arg("offsets"), py::arg("offset_value"), py::arg("tokens"), py::arg("logprobs"),
        py::arg("device_index"), py::arg("stream"));
  m.def("sample_max_width", &api::sample_max_width, "Widest row sample takes for a dtype code.", py::arg("dtype"));
  m.def("philox", &api::philox, "Philox-4x32-10 on the host (the kernels' code): 4 counter, 2 key words.",
        py::arg("counter"), py::arg("key"));
  m.def("archs", &api::archs, "CUDA architectures this extension was compiled for.");
  m.def("num_kernel_instances", &api::num_kernel_instances, "Number of compiled sampling kernels.");
}

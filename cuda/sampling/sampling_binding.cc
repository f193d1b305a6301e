// Fray sampling family: Python module _sampling (bindings only; logic in sampling_api.cc).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cuda/common/binder.h"
#include "cuda/sampling/sampling.h"

namespace api = fray::sampling_api;
namespace py = pybind11;

PYBIND11_MODULE(_sampling, m) {
  m.doc() = "Fray sampling CUDA kernels: launchers (ptrs, ints, floats, device, stream); slots in "
            "cuda/sampling/sampling.h (a pointer of 0 selects the value slot of the same parameter).";
  fray::def_launcher(m, "sample", &api::sample,
                     "One token (and its logprob) per row: temperature, top-k, top-p, min-p, Philox draw.");
  fray::def_launcher(m, "apply_penalties", &api::apply_penalties,
                     "Repetition / presence / frequency penalties in place (CSR).");
  fray::def_launcher(m, "decode_step", &api::decode_step, "apply_penalties then sample: two launches, no host sync.");
  m.def("sample_max_width", &api::sample_max_width, "Widest row sample takes for a dtype code.", py::arg("dtype"));
  m.def("philox", &api::philox, "Philox-4x32-10 on the host (the kernels' code): 4 counter, 2 key words.",
        py::arg("counter"), py::arg("key"));
  fray::def_build_info(m);
  m.def("num_kernel_instances", &api::num_kernel_instances, "Number of compiled sampling kernels.");
}

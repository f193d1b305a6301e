// Fray topk family: Python module _topk (bindings only; logic in topk_api.cc).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cuda/common/binder.h"
#include "cuda/topk/topk.h"

namespace api = fray::topk_api;
namespace py = pybind11;

PYBIND11_MODULE(_topk, m) {
  m.doc() = "Fray topk CUDA kernels: launchers (ptrs, ints, floats, device, stream); slots in cuda/topk/topk.h.";
  fray::def_launcher(m, "topk", &api::topk,
                     "values, indices [rows, k] = top-k of each row (rank order if sorted, else index order; or "
                     "int64 rank keys key << 24 | (2^24 - 1 - index) into rank_keys when it is not 0).");
  fray::def_launcher(m, "argmax", &api::argmax, "out[rows] (int64) = index of each row's maximum.");
  m.def("topk_plan", &api::topk_plan,
        "(cluster, slice, threads, digit bits, sort size, dynamic smem bytes, smem opt-in, streaming kernel) of a "
        "topk launch.",
        py::arg("rows"), py::arg("width"), py::arg("k"), py::arg("sorted"), py::arg("dtype"), py::arg("num_sms"),
        py::arg("max_clusters") = std::vector<int>{});
  m.def("stream_fit", &api::stream_fit,
        "Clusters of the streaming topk kernel the device holds at once, for cluster sizes 1, 2, 4, 8, 16 (0: not "
        "queried); the launcher's plan takes them.",
        py::arg("device_index"));
  m.def("stream_limits", &api::stream_limits,
        "(threads per CTA, CTAs per SM, entries per CTA = largest k, smem per SM, smem reserved per CTA, registers "
        "per thread, static smem bound) of the streaming topk kernel.");
  m.def("launch_limits", &api::launch_limits,
        "(max cluster, max portable cluster, smem per block without opt-in, opt-in smem limit per block, static "
        "smem bound, max blocks per launch).");
  m.def("max_width", &api::max_width, "Widest row topk takes.");
  m.def("max_sort_k", &api::max_sort_k, "Largest k topk returns in rank order (sorted=True).");
  fray::def_build_info(m);
  m.def("num_kernel_instances", &api::num_kernel_instances, "Number of compiled topk/argmax kernels.");
}

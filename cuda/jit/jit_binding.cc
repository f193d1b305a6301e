// Fray JIT loader: Python module _jit. A JIT kernel is a shared object with its own host code
// (CUTLASS 3.x kernels build their parameters and TMA descriptors on the host), so the loader
// dlopens it and calls the C entry points of cuda/common/launch_abi.h; it never sees torch.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/common/binder.h"
#include "cuda/common/launch_abi.h"

namespace py = pybind11;

namespace {

using WorkspaceFn = int64_t (*)(const FrayArgs*);
using DescribeFn = const char* (*)();

// Makes args.device current for one call when it is not already (one cudaGetDevice otherwise),
// and puts the caller's device back afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (device < 0) return;
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error("fray.jit: cudaGetDevice failed (no CUDA device or driver)");
    }
    if (current == device) return;
    const cudaError_t err = cudaSetDevice(device);
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error("fray.jit: cudaSetDevice(" + std::to_string(device) +
                               ") failed: " + cudaGetErrorString(err));
    }
    restore_ = current;
  }
  ~DeviceGuard() {
    if (restore_ >= 0) cudaSetDevice(restore_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int restore_ = -1;
};

class Module {
 public:
  explicit Module(const std::string& path) : path_(path) {
    // RTLD_LOCAL: every kernel carries its own static cudart and CUTLASS symbols.
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      const char* why = dlerror();
      throw std::runtime_error("fray.jit: cannot load " + path + ": " + (why ? why : "unknown dlopen error"));
    }
    launch_ = reinterpret_cast<FrayJitLaunch>(dlsym(handle_, "fray_jit_launch"));
    if (launch_ == nullptr) {
      dlclose(handle_);
      handle_ = nullptr;
      throw std::runtime_error("fray.jit: " + path + " does not export fray_jit_launch (extern \"C\", default visibility)");
    }
    workspace_ = reinterpret_cast<WorkspaceFn>(dlsym(handle_, "fray_jit_workspace_bytes"));
    describe_ = reinterpret_cast<DescribeFn>(dlsym(handle_, "fray_jit_describe"));
  }
  // The object stays mapped for the life of the process: a kernel may still be queued or captured
  // in a CUDA graph when the Python object goes away.
  ~Module() = default;

  void launch(py::handle ptrs, py::handle ints, py::handle floats, int device, uint64_t stream) const {
    fray::ArgPack pack;
    const FrayArgs& args = fray::fill_args(pack, ptrs, ints, floats, device, stream);
    char err[1024];
    err[0] = '\0';
    int rc;
    {
      DeviceGuard guard(device);
      rc = launch_(&args, err, static_cast<int32_t>(sizeof(err)));
    }
    if (rc != 0) {
      err[sizeof(err) - 1] = '\0';
      throw std::runtime_error(std::string("fray.jit: ") + (err[0] ? err : "kernel launch failed") +
                               " (rc " + std::to_string(rc) + ", " + path_ + ")");
    }
  }

  int64_t workspace_bytes(py::handle ptrs, py::handle ints, py::handle floats, int device, uint64_t stream) const {
    if (workspace_ == nullptr) return 0;
    fray::ArgPack pack;
    const int64_t bytes = workspace_(&fray::fill_args(pack, ptrs, ints, floats, device, stream));
    if (bytes < 0) {
      throw std::runtime_error("fray.jit: fray_jit_workspace_bytes refused these arguments (returned " +
                               std::to_string(bytes) + ", " + path_ + ")");
    }
    return bytes;
  }

  std::string describe() const {
    if (describe_ == nullptr) return std::string();
    const char* text = describe_();
    return text ? std::string(text) : std::string();
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* handle_ = nullptr;
  FrayJitLaunch launch_ = nullptr;
  WorkspaceFn workspace_ = nullptr;
  DescribeFn describe_ = nullptr;
};

int cuda_runtime_version() {
  int v = 0;
  return cudaRuntimeGetVersion(&v) == cudaSuccess ? v : 0;
}

int cuda_driver_version() {
  int v = 0;
  return cudaDriverGetVersion(&v) == cudaSuccess ? v : 0;
}

}  // namespace

PYBIND11_MODULE(_jit, m) {
  m.doc() = "Fray JIT loader: dlopen a kernel .so and call its fray_jit_launch (cuda/common/launch_abi.h).";
  py::class_<Module>(m, "Module")
      .def(py::init<const std::string&>(), py::arg("path"))
      .def("launch", &Module::launch, "fray_jit_launch(ptrs, ints, floats, device, stream); RuntimeError on failure.",
           py::arg("ptrs"), py::arg("ints"), py::arg("floats"), py::arg("device"), py::arg("stream"))
      .def("workspace_bytes", &Module::workspace_bytes, "fray_jit_workspace_bytes(...), 0 when not exported; RuntimeError when it returns < 0.",
           py::arg("ptrs"), py::arg("ints"), py::arg("floats"), py::arg("device"), py::arg("stream"))
      .def("describe", &Module::describe, "fray_jit_describe(), empty when not exported.")
      .def_property_readonly("path", &Module::path);
  m.def("cuda_runtime_version", &cuda_runtime_version, "cudaRuntimeGetVersion() (0 when unavailable).");
  m.def("cuda_driver_version", &cuda_driver_version, "cudaDriverGetVersion() (0 without a driver).");
}

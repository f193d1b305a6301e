// Fray: the one launch/error-check helper set for the whole tree (host only).
//
//  * DeviceGuard  - RAII device switch, a no-op when already on the right device.
//  * check_cuda   - throws std::runtime_error("fray: <what>: <cuda error string>").
//  * dtype_from_code - Python dtype code -> DType, or std::invalid_argument.
//  * require_slots - a FrayArgs record holds the slots a launcher reads, or std::invalid_argument.
//  * launch_error - cudaGetLastError() right after a kernel launch (launchers
//    return its value as their cudaError_t and never throw).
//  * sm_count     - the multiprocessor count of a device, read once per device.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <stdexcept>
#include <string>

#include "cuda/common/dtype.h"
#include "cuda/common/launch_abi.h"

namespace fray {

// Throws std::runtime_error (pybind11 -> RuntimeError) when err != cudaSuccess.
inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("fray: ") + what + ": " + cudaGetErrorString(err));
  }
}

// The DType of a Python-side dtype code; std::invalid_argument (pybind11 -> ValueError) naming
// `what` for any other integer. Every family's adapter converts codes through this.
inline DType dtype_from_code(int code, const char* what) {
  if (!is_valid_dtype_code(code)) {
    throw std::invalid_argument(std::string("fray: unsupported ") + what + " dtype code " + std::to_string(code) +
                                " (expected 0 = float32, 1 = float16, 2 = bfloat16)");
  }
  return static_cast<DType>(code);
}

// std::invalid_argument unless `a` holds exactly the slots launcher `op` reads: a call from a
// stale or hand-written caller never reads past its tuples.
inline void require_slots(const FrayArgs& a, int ptrs, int ints, int floats, const char* op) {
  if (a.num_ptrs != ptrs || a.num_ints != ints || a.num_floats != floats) {
    throw std::invalid_argument(std::string("fray: ") + op + " expects " + std::to_string(ptrs) + " ptrs, " +
                                std::to_string(ints) + " ints, " + std::to_string(floats) + " floats; got " +
                                std::to_string(a.num_ptrs) + ", " + std::to_string(a.num_ints) + ", " +
                                std::to_string(a.num_floats));
  }
}

// Status of the most recent launch on this host thread (clears the sticky
// launch-error slot, like every cudaGetLastError call).
inline cudaError_t launch_error() { return cudaGetLastError(); }

constexpr int kMaxDevices = 64;

// Multiprocessor count of `device`, read once per device (a host attribute query: no stream work,
// so it is safe during graph capture; cudaDeviceGetAttribute costs ~0.6 µs per call on the H200
// machine, profiled).
inline int sm_count(int device) {
  static std::atomic<int> cache[kMaxDevices];
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached) {
    const int v = cache[device].load(std::memory_order_relaxed);
    if (v > 0) return v;
  }
  int v = 0;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || v <= 0) {
    (void)cudaGetLastError();
    v = 132;  // H100/H200 SXM: only the launch shape depends on it
  }
  if (cached) cache[device].store(v, std::memory_order_relaxed);
  return v;
}

// If `device_index` >= 0 and differs from the current device, switches to it
// and restores the previous device on destruction; otherwise does nothing.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device_index) {
    if (device_index < 0) return;
    int current = 0;
    check_cuda(cudaGetDevice(&current), "cudaGetDevice");
    if (current != device_index) {
      check_cuda(cudaSetDevice(device_index), "cudaSetDevice");
      previous_ = current;
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) (void)cudaSetDevice(previous_);  // never throw from a destructor
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace fray

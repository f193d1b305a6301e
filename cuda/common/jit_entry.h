// Fray: the error side of the JIT entry-point contract (launch_abi.h): a JIT-compiled shared
// object reports a failure as a printf-formatted message into the caller's buffer, never by
// throwing across the library boundary.
#pragma once

#include <cuda_runtime_api.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "cuda/common/launch_abi.h"

namespace fray {

inline void jit_set_err(char* err, int32_t err_len, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
inline void jit_set_err(char* err, int32_t err_len, const char* fmt, ...) {
  if (err == nullptr || err_len <= 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, static_cast<size_t>(err_len), fmt, ap);
  va_end(ap);
}

// Opts `kernel` into `bytes` of dynamic shared memory on `device`: above 48 KB a kernel must, once
// per device (cudaFuncSetAttribute is per device; repeating it costs a launch's worth of host
// time). Tag: whose flag (one per kernel configuration). Returns 0, or 1 with the message set.
template <class Tag, class Kernel>
inline int jit_opt_in_smem(Kernel kernel, int bytes, int device, char* err, int32_t err_len, const char* tag) {
  constexpr int kMaxDevices = 64;
  static bool done[kMaxDevices] = {};
  if (bytes <= (48 << 10) || (device >= 0 && device < kMaxDevices && done[device])) return 0;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) {
    jit_set_err(err, err_len, "%s: cudaFuncSetAttribute(%d bytes of shared memory): %s", tag, bytes,
                cudaGetErrorString(e));
    return 1;
  }
  if (device >= 0 && device < kMaxDevices) done[device] = true;
  return 0;
}

}  // namespace fray

// The JIT contract's three exports for one configuration (one per translation unit), from the
// namespace NS that holds its launch<CONFIG> and workspace_bytes<CONFIG>.
#define FRAY_SM90_ENTRY(CONFIG, NS, TAG)                                                          \
  extern "C" __attribute__((visibility("default"))) int fray_jit_launch(const FrayArgs* args,    \
                                                                        char* err, int32_t len) { \
    try {                                                                                         \
      return NS::launch<CONFIG>(args, err, len);                                                  \
    } catch (...) {                                                                               \
      ::fray::jit_set_err(err, len, TAG ": unexpected C++ exception");                            \
      return 1;                                                                                   \
    }                                                                                             \
  }                                                                                               \
  extern "C" __attribute__((visibility("default"))) int64_t fray_jit_workspace_bytes(            \
      const FrayArgs* args) {                                                                     \
    try {                                                                                         \
      return NS::workspace_bytes<CONFIG>(args);                                                   \
    } catch (...) {                                                                               \
      return -1;                                                                                  \
    }                                                                                             \
  }                                                                                               \
  extern "C" __attribute__((visibility("default"))) const char* fray_jit_describe(void) {        \
    static char buf[192] = {};                                                                    \
    if (buf[0] == 0) CONFIG::describe(buf, sizeof(buf));                                          \
    return buf;                                                                                   \
  }

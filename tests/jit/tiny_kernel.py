"""The JIT's test kernel: a translation unit exporting the three entry points of
cuda/common/launch_abi.h around a trivial fill kernel (compiles in a few seconds).

Slots: ptrs (out: uint32 [n]), ints (n, seed); -DTINY_BLOCKS=<grid> (default 64) is its one tunable; out[i] = seed ^ (i * 2654435761) mod 2^32.
n < 0 makes fray_jit_launch fail with a message, before any CUDA call; fray_jit_workspace_bytes is
4 * n, and -1 (refused) without ints.
"""

SOURCE = r"""
#include <cstdio>
#include <cuda_runtime.h>

#include "cuda/common/launch_abi.h"
%(include)s

#ifndef TINY_BLOCKS
#define TINY_BLOCKS 64
#endif

namespace {
__global__ void fill(uint32_t* out, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    out[i] = seed ^ (uint32_t)((uint64_t)i * 2654435761ull);
  }
}
}  // namespace

#define FRAY_EXPORT extern "C" __attribute__((visibility("default")))

FRAY_EXPORT int fray_jit_launch(const FrayArgs* a, char* err, int32_t err_len) {
  if (a->num_ptrs != 1 || a->num_ints != 2) {
    snprintf(err, err_len, "tiny: expected 1 ptr and 2 ints, got %%d and %%d", a->num_ptrs, a->num_ints);
    return 2;
  }
  const int64_t n = a->ints[0];
  if (n < 0) {
    snprintf(err, err_len, "tiny: n must be >= 0, got %%lld", (long long)n);
    return 3;
  }
  if (n == 0) return 0;
  fill<<<TINY_BLOCKS, 256, 0, reinterpret_cast<cudaStream_t>(a->stream)>>>(reinterpret_cast<uint32_t*>(a->ptrs[0]), n,
                                                                 (uint32_t)a->ints[1]);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    snprintf(err, err_len, "tiny: %%s", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

FRAY_EXPORT int64_t fray_jit_workspace_bytes(const FrayArgs* a) { return a->num_ints > 0 ? 4 * a->ints[0] : -1; }

FRAY_EXPORT const char* fray_jit_describe(void) { return "tiny fill %(tag)s"; }
"""


def source(tag="v1", include=""):
    """The TU; `tag` changes the source text (another key), `include` adds a line such as
    '#include "extra.h"'."""
    return SOURCE % {"tag": tag, "include": include}


def expected(n, seed):
    return [(seed ^ ((i * 2654435761) & 0xFFFFFFFF)) & 0xFFFFFFFF for i in range(n)]

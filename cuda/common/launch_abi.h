// Fray: the one argument record every launcher takes, ahead-of-time and JIT alike.
//
// Python hands a launcher three flat tuples (device addresses, integers, floats) plus the device
// and its current stream; cuda/common/binder.h turns them into this record without allocating.
// Each launcher documents the order of its slots beside its definition. The record is plain C so
// that a JIT-compiled shared object (python/fray/jit) can take it across dlopen: such an object
// exports fray_jit_launch() below and reports failures through its message buffer, never by
// throwing across the library boundary.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct FrayArgs {
  const uint64_t* ptrs;  // device addresses; 0 marks an absent optional tensor
  int32_t num_ptrs;
  const int64_t* ints;  // sizes, strides, dtype codes, flags
  int32_t num_ints;
  const double* floats;  // scalars (eps, scale, ...)
  int32_t num_floats;
  int32_t device;   // CUDA device index the tensors live on (-1: the current one)
  uint64_t stream;  // cudaStream_t of that device
} FrayArgs;

// The entry point of a JIT-compiled shared object: launch on args->stream; 0 on success, or
// nonzero with a NUL-terminated message (at most err_len bytes) in err.
typedef int (*FrayJitLaunch)(const FrayArgs* args, char* err, int32_t err_len);

#ifdef __cplusplus
}
#endif

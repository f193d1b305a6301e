// Fray: element dtype codes shared by every operator family, plus the single
// dtype -> C++ type dispatch helper.
//
// Host- and device-safe: the enum can be used in kernels; dispatch_dtype is a
// host-side helper. Compiles with plain g++ (the CUDA half/bfloat16 headers are
// host-compilable) as well as nvcc.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <type_traits>
#include <utility>

namespace fray {

// Integer values are part of the Python ABI (0 fp32, 1 fp16, 2 bf16).
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Empty tag carrying a C++ element type: `using T = typename decltype(tag)::type;`.
template <typename T>
struct TypeTag {
  using type = T;
};

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct DTypeOf<__half> {
  static constexpr DType value = DType::kFloat16;
};
template <>
struct DTypeOf<__nv_bfloat16> {
  static constexpr DType value = DType::kBFloat16;
};

// True for the integer codes that name a DType.
inline constexpr bool is_valid_dtype_code(int code) { return code >= 0 && code <= 2; }

inline constexpr const char* dtype_name(DType d) {
  switch (d) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "invalid";
}

// Bytes per element of `d`.
inline constexpr int dtype_size(DType d) { return d == DType::kFloat32 ? 4 : 2; }

// Calls f(TypeTag<T>{}) for the C++ type T of `d` and returns its cudaError_t.
// An unsupported dtype returns cudaErrorInvalidValue without calling f.
template <class F>
inline cudaError_t dispatch_dtype(DType d, F&& f) {
  switch (d) {
    case DType::kFloat32: return std::forward<F>(f)(TypeTag<float>{});
    case DType::kFloat16: return std::forward<F>(f)(TypeTag<__half>{});
    case DType::kBFloat16: return std::forward<F>(f)(TypeTag<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

// Calls f(TypeTag<W>{}) for a weight dtype `w` allowed next to activations of type T: T itself,
// or fp32 when T is 16-bit. Any other weight dtype returns cudaErrorInvalidValue without calling f.
template <typename T, class F>
inline cudaError_t dispatch_weight_dtype(DType w, F&& f) {
  if (w == DTypeOf<T>::value) return std::forward<F>(f)(TypeTag<T>{});
  if constexpr (!std::is_same_v<T, float>) {
    if (w == DType::kFloat32) return std::forward<F>(f)(TypeTag<float>{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace fray

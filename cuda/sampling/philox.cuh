// Fray sampling family: Philox-4x32-10 (Salmon et al., SC'11), host and device.
// The same function serves the kernels and the host test hook (sampling_api philox), so the
// CPU tests check the arithmetic the GPU runs against Random123's known answers.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FRAY_HD __host__ __device__ __forceinline__
#else
#define FRAY_HD inline
#endif

namespace fray {
namespace sampling_detail {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

FRAY_HD uint32_t mulhi32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

// Ten rounds on counter c (4 words) with key k (2 words); the key is bumped between rounds.
FRAY_HD void philox4x32_10(uint32_t (&c)[4], uint32_t k0, uint32_t k1) {
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const uint32_t lo0 = c[0] * kPhiloxM0;
    const uint32_t hi0 = mulhi32(c[0], kPhiloxM0);
    const uint32_t lo1 = c[2] * kPhiloxM1;
    const uint32_t hi1 = mulhi32(c[2], kPhiloxM1);
    const uint32_t n0 = hi1 ^ c[1] ^ k0;
    const uint32_t n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
}

// The draw of one row: the top 24 bits of output word 0 for counter (offset lo, offset hi, 0, 0)
// and key (seed lo, seed hi); u = draw * 2^-24 (fray.reference.sampling.uniform).
FRAY_HD uint32_t philox_draw24(uint64_t seed, uint64_t offset) {
  uint32_t c[4] = {static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32), 0u, 0u};
  philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return c[0] >> 8;
}

}  // namespace sampling_detail
}  // namespace fray

#undef FRAY_HD

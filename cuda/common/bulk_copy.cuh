// Bulk async copies (TMA, cp.async.bulk) global -> shared memory, completing on mbarriers (sm_90).
// Shared by the softmax shared-memory kernel and the sampling kernel's row load.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fray {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// Makes the mbarrier.init above visible to the copy engine and to other threads.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// One arrival that also announces `bytes` of transactions (the barrier's count is 1).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// One try_wait on the phase of the given parity; SEM: "" (the default .acquire.cta) or
// ".acquire.cluster", for a barrier that other blocks of the cluster complete (st.async's
// complete_tx releases at cluster scope), so that the writes those blocks made before their
// release are visible here too, not only the pushed bytes.
#define FRAY_MBAR_TRY_WAIT(SEM, bar, parity, done)                                               \
  asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity" SEM ".shared::cta.b64 p, [%1], %2;\n\t" \
               "selp.u32 %0, 1, 0, p;\n\t}"                                                        \
               : "=r"(done)                                                                      \
               : "r"(smem_u32(bar)), "r"(parity)                                                 \
               : "memory")

__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  FRAY_MBAR_TRY_WAIT("", bar, parity, done);
  return done != 0;
}

__device__ __forceinline__ bool mbar_try_wait_cluster(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  FRAY_MBAR_TRY_WAIT(".acquire.cluster", bar, parity, done);
  return done != 0;
}

// Waits for the barrier's phase of the given parity to complete; the bytes its
// copies wrote to shared memory are then visible to the waiting thread.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// L2 policy for data read once: evict it first.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// global -> this block's shared memory, `bytes` (a multiple of 16; both
// addresses 16-byte aligned), completing `bytes` transactions on `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

// Thread 0 of a block: `vecs` 16-byte vectors from src (16-byte aligned) to dst (shared memory,
// 16-byte aligned) as bulk copies of chunk_vecs vectors (the last one shorter), chunk k
// completing on bars[k] (initialised here, each with one arrival, read-once L2 policy). The
// caller's next __syncthreads makes the initialised barriers visible to the block; then every
// thread waits on chunk k with mbar_wait(&bars[k], 0) before it reads that chunk.
__device__ __forceinline__ void bulk_load_chunks(void* dst, const void* src, int vecs, int chunk_vecs, uint64_t* bars) {
  const int chunks = (vecs + chunk_vecs - 1) / chunk_vecs;
  for (int k = 0; k < chunks; ++k) mbar_init(&bars[k], 1);
  mbar_init_fence();
  const uint64_t policy = evict_first_policy();
  for (int k = 0; k < chunks; ++k) {
    const int v0 = k * chunk_vecs;
    const uint32_t bytes = static_cast<uint32_t>(min(chunk_vecs, vecs - v0)) * 16u;
    mbar_arrive_expect_tx(&bars[k], bytes);
    bulk_load(static_cast<char*>(dst) + v0 * 16, static_cast<const char*>(src) + v0 * 16, bytes, &bars[k], policy);
  }
}

}  // namespace fray

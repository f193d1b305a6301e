// Fray: the Hopper GEMM, D[M, N] = A[M, K] * B + bias[N], composed from CUTLASS 3.x collectives.
//
// Mainloop: TMA loads into a multi-stage shared-memory ring, wgmma, one producer warpgroup and
// consumer warpgroups (cooperative: two consumers split one tile along M; ping-pong: two
// consumers alternate tiles so one's epilogue overlaps the other's mainloop), the persistent tile
// scheduler, and TMA multicast across a thread-block cluster. Epilogue: the TMA-store collective
// with a fused per-column bias (an EVT from the collective epilogue builder) and the output type.
//
// Every knob is a template parameter so that one JIT translation unit names one configuration:
//
//   #include "cuda/gemm/gemm_sm90.cuh"
//   using Config = fray::gemm::Sm90GemmConfig<cutlass::bfloat16_t, fray::gemm::kLayoutNK,
//       cutlass::bfloat16_t, true, 128, 256, 64, 2, 1, fray::gemm::kCooperative, 0,
//       fray::gemm::kRasterHeuristic, 1 /*swizzle*/, 0 /*epilogue subtile N: auto*/,
//       fray::gemm::kPersistent>;
//   FRAY_GEMM_ENTRY(Config)
//
// Layouts (all row-major in PyTorch terms): A [M, K] (K-major), D [M, N]. B is "nk" ([N, K],
// nn.Linear's weight; K-major, a column-major K x N for CUTLASS) or "kn" ([K, N]; N-major).
// TMA needs 16-byte aligned base addresses and row strides, which the entry point checks.
//
// Swap-AB (kSwapAB, for small M): CUTLASS computes D^T[N, M] = B^T[N, K] * A^T, so the weights
// fill the wgmma's 64-row M side and the few rows of A its N side (n8-n64; TMA zero-fills the
// rows past M). D^T is written column-major, which is D row-major; the bias becomes per-row. At
// M = 16 a 128-row tile over B wastes nothing, where the unswapped 128-row tile over A would
// compute 112 rows of padding and read B once per 128 rows of A anyway.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/numeric_types.h"

#include "cuda/common/jit_entry.h"
#include "cuda/common/launch.h"
#include "cuda/common/launch_abi.h"

namespace fray {
namespace gemm {

enum Layout : int { kLayoutNK = 0, kLayoutKN = 1 };
enum Schedule : int { kCooperative = 0, kPingpong = 1 };
// The persistent scheduler's raster order: the heuristic walks along the larger of M and N.
enum Raster : int { kRasterHeuristic = 0, kRasterAlongM = 1, kRasterAlongN = 2 };
// Tile scheduler: data-parallel persistent tiles, or stream-K, which splits the last partial wave
// along K (4096^3 in 128x256 tiles is 512 tiles on 132 SMs, 3.88 waves: a 3% tail to reclaim).
enum Scheduler : int { kPersistent = 0, kStreamK = 1 };

template <class T>
constexpr const char* element_name() {
  if constexpr (cute::is_same_v<T, cutlass::bfloat16_t>) return "bf16";
  else if constexpr (cute::is_same_v<T, cutlass::half_t>) return "fp16";
  else if constexpr (cute::is_same_v<T, float>) return "fp32";
  else return "?";
}

// Elements per 16-byte TMA transaction.
template <class T>
constexpr int kAlign16 = 128 / cutlass::sizeof_bits<T>::value;

template <class Element_, int kLayoutB_, class ElementOut_, bool kBias_, int kTileM_, int kTileN_,
          int kTileK_, int kClusterM_, int kClusterN_, int kSchedule_,
          int kStages_,  // 0: as many as fit beside the epilogue's shared memory
          int kRaster_, int kSwizzle_,
          int kEpiTileN_ = 0,  // 0: CUTLASS's choice (32 columns); else the TMA-store subtile's N
          int kScheduler_ = kPersistent,
          bool kSwapAB_ = false,  // D^T = B^T A^T: tile M runs over N (b's rows), tile N over M
          int kSplits_ = 1>       // > 1: split-K into this many slices (the stream-K scheduler's SplitK)
struct Sm90GemmConfig {
  using Element = Element_;
  using ElementOut = ElementOut_;
  using ElementAcc = float;
  static constexpr int kLayoutB = kLayoutB_;
  static constexpr bool kBias = kBias_;
  static constexpr int kTileM = kTileM_, kTileN = kTileN_, kTileK = kTileK_;
  static constexpr int kClusterM = kClusterM_, kClusterN = kClusterN_;
  static constexpr int kSchedule = kSchedule_;
  static constexpr int kStages = kStages_;
  static constexpr int kRaster = kRaster_;
  static constexpr int kSwizzle = kSwizzle_;
  static constexpr int kEpiTileN = kEpiTileN_;
  static constexpr int kScheduler = kScheduler_;
  static constexpr bool kSwapAB = kSwapAB_;
  static constexpr int kSplits = kSplits_;

  static_assert(cute::is_same_v<Element, cutlass::bfloat16_t> || cute::is_same_v<Element, cutlass::half_t>,
                "A and B are bf16 or fp16");
  static_assert(cute::is_same_v<ElementOut, Element> || cute::is_same_v<ElementOut, float>,
                "the output is the input dtype or fp32");
  // Cooperative splits the tile's M between two consumer warpgroups of 64 rows each at least.
  static_assert(kSchedule == kPingpong || kTileM >= 128, "the cooperative schedule needs tile M >= 128");
  static_assert(kSwizzle == 1 || kSwizzle == 2 || kSwizzle == 4 || kSwizzle == 8, "swizzle is 1, 2, 4 or 8");
  static_assert(kEpiTileN == 0 || kTileN % kEpiTileN == 0, "the epilogue subtile's N divides the tile's N");
  // CUTLASS's stream-K scheduler reduces partial tiles through the cooperative epilogue only.
  static_assert(kScheduler == kPersistent || kSchedule == kCooperative, "stream-K needs the cooperative schedule");
  static_assert(kSplits == 1 || kScheduler == kStreamK, "split-K runs on the stream-K scheduler");

  // CUTLASS's operands: unswapped A = a [M, K], B = b; swapped A = b as [N, K] (row-major for "nk",
  // column-major for "kn") and B = a as a K x M column-major, D = out^T column-major.
  using LayoutWeight = cute::conditional_t<kLayoutB == kLayoutNK, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutA = cute::conditional_t<kSwapAB, typename cutlass::layout::LayoutTranspose<LayoutWeight>::type,
                                      cutlass::layout::RowMajor>;
  using LayoutB = cute::conditional_t<kSwapAB, cutlass::layout::ColumnMajor, LayoutWeight>;
  using LayoutD = cute::conditional_t<kSwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;

  using TileShape = cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>, cute::Int<kTileK>>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>;

  using KernelSchedule = cute::conditional_t<kSchedule == kCooperative,
                                             cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                             cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using EpilogueSchedule = cute::conditional_t<kSchedule == kCooperative,
                                               cutlass::epilogue::TmaWarpSpecializedCooperative,
                                               cutlass::epilogue::TmaWarpSpecialized>;

  // No source C: D = acc (+ bias). The bias is read in the input dtype and added in fp32.
  using Fusion = cute::conditional_t<
      kBias,
      cute::conditional_t<
          kSwapAB,
          cutlass::epilogue::fusion::LinCombPerRowBias<ElementOut, float, Element, ElementOut, float, kAlign16<Element>>,
          cutlass::epilogue::fusion::LinCombPerColBias<ElementOut, float, Element, ElementOut, float, kAlign16<Element>>>,
      cutlass::epilogue::fusion::LinearCombination<ElementOut, float, void, float>>;

  // The subtile's M follows CUTLASS's own choice for the schedule (128 rows cooperative, 64 ping-pong).
  static constexpr int kEpiTileM = kSchedule == kCooperative ? (kTileM < 128 ? kTileM : 128) : (kTileM < 64 ? kTileM : 64);
  using EpilogueTile = cute::conditional_t<kEpiTileN == 0, cutlass::epilogue::collective::EpilogueTileAuto,
                                           cute::Shape<cute::Int<kEpiTileM>, cute::Int<(kEpiTileN > 0 ? kEpiTileN : 32)>>>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      EpilogueTile, ElementAcc, float,
      void, LayoutD, kAlign16<ElementOut>,  // C: none
      ElementOut, LayoutD, kAlign16<ElementOut>, EpilogueSchedule, Fusion>::CollectiveOp;

  using StageCount = cute::conditional_t<
      kStages == 0,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::collective::StageCount<(kStages > 0 ? kStages : 1)>>;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlign16<Element>, Element, LayoutB,
      kAlign16<Element>, ElementAcc, TileShape, ClusterShape, StageCount, KernelSchedule>::CollectiveOp;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue,
                                                          cute::conditional_t<kScheduler == kStreamK, cutlass::gemm::StreamKScheduler,
                                                                              cutlass::gemm::PersistentScheduler>>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  static void describe(char* buf, size_t len) {
    snprintf(buf, len, "gemm_sm90 %s b=%s out=%s%s %s%dx%dx%d c%dx%d %s stages=%s%d raster=%s swizzle=%d epi_n=%d%s%s",
             element_name<Element>(), kLayoutB == kLayoutNK ? "nk" : "kn", element_name<ElementOut>(),
             kBias ? " bias" : "", kSwapAB ? "swap-ab " : "", kTileM, kTileN, kTileK, kClusterM, kClusterN,
             kSchedule == kCooperative ? "coop" : "pingpong", kStages == 0 ? "auto:" : "",
             kStages == 0 ? static_cast<int>(CollectiveMainloop::DispatchPolicy::Stages) : kStages,
             kRaster == kRasterAlongM ? "m" : kRaster == kRasterAlongN ? "n" : "auto", kSwizzle,
             static_cast<int>(cute::size<1>(cute::shape(typename CollectiveEpilogue::EpilogueTile{}))),
             kScheduler == kStreamK ? " stream-k" : "", "");
    if (kSplits > 1) {
      const size_t used = strlen(buf);
      if (used < len) snprintf(buf + used, len - used, " split-k=%d", kSplits);
    }
  }
};

namespace detail {

using ::fray::jit_set_err;

// The SM count feeds the persistent grid (read once per device: cuda/common/launch.h).
using ::fray::sm_count;

inline bool aligned16(uint64_t addr) { return (addr & 15u) == 0; }

// Slots: ptrs = (a, b, bias or 0, out, [workspace]); ints = (M, N, K, lda, ldb, ldc), row strides
// in elements; floats = ().
// The problem's ints = (M, N, K, lda, ldb, ldc), row strides in elements: every GEMM entry's.
struct Problem {
  int64_t m, n, k, lda, ldb, ldc;
};

inline int read_problem(const FrayArgs* args, Problem* p, const char* tag, char* err, int32_t err_len) {
  p->m = args->ints[0];
  p->n = args->ints[1];
  p->k = args->ints[2];
  p->lda = args->ints[3];
  p->ldb = args->ints[4];
  p->ldc = args->ints[5];
  if (p->m < 1 || p->n < 1 || p->k < 1 || p->m > INT32_MAX || p->n > INT32_MAX || p->k > INT32_MAX) {
    jit_set_err(err, err_len, "%s: expected 1 <= M, N, K < 2^31, got M=%lld N=%lld K=%lld", tag, (long long)p->m,
                (long long)p->n, (long long)p->k);
    return 1;
  }
  return 0;
}

template <class Config>
struct GemmSlots : Problem {
  const typename Config::Element* a;
  const typename Config::Element* b;
  const typename Config::Element* bias;
  typename Config::ElementOut* out;
  void* workspace;
};

template <class Config>
int read_slots(const FrayArgs* args, GemmSlots<Config>* s, char* err, int32_t err_len) {
  using E = typename Config::Element;
  using O = typename Config::ElementOut;
  if (args == nullptr || args->num_ptrs < 4 || args->num_ints < 6) {
    jit_set_err(err, err_len, "gemm_sm90: expected ptrs (a, b, bias, out[, workspace]) and ints (M, N, K, lda, ldb, ldc), got %d ptrs and %d ints",
            args ? args->num_ptrs : -1, args ? args->num_ints : -1);
    return 1;
  }
  s->a = reinterpret_cast<const E*>(args->ptrs[0]);
  s->b = reinterpret_cast<const E*>(args->ptrs[1]);
  s->bias = reinterpret_cast<const E*>(args->ptrs[2]);
  s->out = reinterpret_cast<O*>(args->ptrs[3]);
  s->workspace = args->num_ptrs > 4 ? reinterpret_cast<void*>(args->ptrs[4]) : nullptr;
  if (read_problem(args, s, "gemm_sm90", err, err_len)) return 1;
  const int64_t b_cols = Config::kLayoutB == kLayoutNK ? s->k : s->n;
  if (s->lda < s->k || s->ldb < b_cols || s->ldc < s->n) {
    jit_set_err(err, err_len, "gemm_sm90: row strides too small: lda=%lld (K=%lld), ldb=%lld (%lld), ldc=%lld (N=%lld)",
            (long long)s->lda, (long long)s->k, (long long)s->ldb, (long long)b_cols, (long long)s->ldc, (long long)s->n);
    return 1;
  }
  // TMA: 16-byte aligned global base addresses and strides; the inner extent in bytes must be a
  // multiple of 16 as well (the row length K or N in elements times the element size).
  const int ae = kAlign16<E>, oe = kAlign16<O>;
  if (!aligned16(args->ptrs[0]) || !aligned16(args->ptrs[1]) || !aligned16(args->ptrs[3]) ||
      (s->bias != nullptr && !aligned16(args->ptrs[2]))) {
    jit_set_err(err, err_len, "gemm_sm90: TMA needs 16-byte aligned a, b, bias and out, got a=0x%llx b=0x%llx bias=0x%llx out=0x%llx",
            (unsigned long long)args->ptrs[0], (unsigned long long)args->ptrs[1], (unsigned long long)args->ptrs[2],
            (unsigned long long)args->ptrs[3]);
    return 1;
  }
  if (s->lda % ae || s->ldb % ae || s->ldc % oe || s->k % ae || (Config::kLayoutB == kLayoutKN && s->n % ae) || s->n % oe) {
    jit_set_err(err, err_len,
            "gemm_sm90: TMA needs 16-byte rows: lda, ldb, K%s multiples of %d and ldc, N multiples of %d; got lda=%lld ldb=%lld ldc=%lld N=%lld K=%lld",
            Config::kLayoutB == kLayoutKN ? ", N" : "", ae, oe, (long long)s->lda, (long long)s->ldb, (long long)s->ldc,
            (long long)s->n, (long long)s->k);
    return 1;
  }
  if (Config::kBias != (s->bias != nullptr)) {
    jit_set_err(err, err_len, "gemm_sm90: this kernel was built %s bias, got bias=0x%llx", Config::kBias ? "with" : "without",
            (unsigned long long)args->ptrs[2]);
    return 1;
  }
  return 0;
}

template <class Config>
typename Config::Gemm::Arguments make_arguments(const GemmSlots<Config>& s, int device) {
  using Gemm = typename Config::Gemm;
  using GemmKernel = typename Config::GemmKernel;
  using StrideA = typename GemmKernel::StrideA;
  using StrideB = typename GemmKernel::StrideB;
  using StrideD = typename GemmKernel::StrideD;
  // CuTe strides are (rows, K) for A and B, (rows, columns) for D, the unit stride a static 1.
  StrideA stride_a{};
  StrideB stride_b{};
  StrideD stride_d{};
  if constexpr (Config::kSwapAB) {
    // A = b as (N, K), B = a as (M, K), D = out^T as (N, M) with N contiguous.
    if constexpr (Config::kLayoutB == kLayoutNK) {
      cute::get<0>(stride_a) = s.ldb;
    } else {
      cute::get<1>(stride_a) = s.ldb;
    }
    cute::get<0>(stride_b) = s.lda;
    cute::get<1>(stride_d) = s.ldc;
  } else {
    cute::get<0>(stride_a) = s.lda;
    if constexpr (Config::kLayoutB == kLayoutNK) {
      cute::get<0>(stride_b) = s.ldb;  // (N, K): N strides by ldb, K is contiguous
    } else {
      cute::get<1>(stride_b) = s.ldb;  // (N, K): N is contiguous, K strides by ldb
    }
    cute::get<0>(stride_d) = s.ldc;
  }

  typename Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  const int rows = static_cast<int>(Config::kSwapAB ? s.n : s.m), cols = static_cast<int>(Config::kSwapAB ? s.m : s.n);
  args.problem_shape = cute::make_shape(rows, cols, static_cast<int>(s.k), 1);
  args.mainloop.ptr_A = Config::kSwapAB ? s.b : s.a;
  args.mainloop.dA = stride_a;
  args.mainloop.ptr_B = Config::kSwapAB ? s.a : s.b;
  args.mainloop.dB = stride_b;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = stride_d;
  args.epilogue.ptr_D = s.out;
  args.epilogue.dD = stride_d;
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  if constexpr (Config::kBias) {
    args.epilogue.thread.bias_ptr = s.bias;
  }
  args.hw_info.device_id = device;
  args.hw_info.sm_count = sm_count(device);
  args.scheduler.max_swizzle_size = Config::kSwizzle;
  if constexpr (Config::kSplits > 1) {
    args.scheduler.splits = Config::kSplits;
    args.scheduler.decomposition_mode = GemmKernel::TileScheduler::DecompositionMode::SplitK;
  }
  using RasterOpt = typename GemmKernel::TileScheduler::RasterOrderOptions;
  args.scheduler.raster_order = Config::kRaster == kRasterAlongM   ? RasterOpt::AlongM
                                : Config::kRaster == kRasterAlongN ? RasterOpt::AlongN
                                                                   : RasterOpt::Heuristic;
  return args;
}

inline int current_device(const FrayArgs* args) {
  if (args->device >= 0) return args->device;
  int d = 0;
  cudaGetDevice(&d);
  return d;
}

template <class Config>
int64_t workspace_bytes(const FrayArgs* args) {
  GemmSlots<Config> s{};
  if (read_slots<Config>(args, &s, nullptr, 0)) return 0;
  auto arguments = make_arguments<Config>(s, current_device(args));
  return static_cast<int64_t>(Config::Gemm::get_workspace_size(arguments));
}

// Checks, workspace, the shared-memory opt-in and the launch of one CUTLASS 3.x kernel from its
// built arguments: what every GEMM configuration here (gemm_sm90, scaled_gemm_sm90) shares.
template <class GemmKernel, class Gemm>
int run_kernel(const typename Gemm::Arguments& arguments, void* workspace, int device, cudaStream_t stream,
               const char* tag, char* err, int32_t err_len) {
  if (GemmKernel::can_implement(arguments) != true) {
    const auto& ps = arguments.problem_shape;
    if constexpr (cute::is_tuple<cute::remove_cvref_t<decltype(ps)>>::value) {
      jit_set_err(err, err_len, "%s: CUTLASS cannot implement the %d x %d x %d problem with this configuration", tag,
                  static_cast<int>(cute::get<0>(ps)), static_cast<int>(cute::get<1>(ps)),
                  static_cast<int>(cute::get<2>(ps)));
    } else {  // grouped: the shapes live on the device
      jit_set_err(err, err_len, "%s: CUTLASS cannot implement the problem with this configuration", tag);
    }
    return 1;
  }
  const size_t ws = GemmKernel::get_workspace_size(arguments);
  if (ws > 0) {
    if (workspace == nullptr) {
      jit_set_err(err, err_len, "%s: expected a workspace of %zu bytes as the last pointer, got none", tag, ws);
      return 1;
    }
    if (GemmKernel::initialize_workspace(arguments, workspace, stream) != cutlass::Status::kSuccess) {
      jit_set_err(err, err_len, "%s: initialising the %zu-byte workspace failed", tag, ws);
      return 1;
    }
  }
  // (the adapter's initialize() would repeat the opt-in on every launch)
  if (jit_opt_in_smem<GemmKernel>(cutlass::device_kernel<GemmKernel>, GemmKernel::SharedStorageSize, device, err,
                                  err_len, tag)) {
    return 1;
  }
  typename GemmKernel::Params params = GemmKernel::to_underlying_arguments(arguments, workspace);
  cutlass::Status st = Gemm::run(params, stream);
  if (st != cutlass::Status::kSuccess) {
    cudaError_t e = cudaGetLastError();
    jit_set_err(err, err_len, "%s: launch failed: %s (%s)", tag, cutlassGetStatusString(st), cudaGetErrorString(e));
    return 1;
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    jit_set_err(err, err_len, "%s: launch failed: %s", tag, cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

template <class Config>
int launch(const FrayArgs* args, char* err, int32_t err_len) {
  GemmSlots<Config> s{};
  if (read_slots<Config>(args, &s, err, err_len)) return 1;
  const int device = current_device(args);
  auto arguments = make_arguments<Config>(s, device);
  return run_kernel<typename Config::GemmKernel, typename Config::Gemm>(
      arguments, s.workspace, device, reinterpret_cast<cudaStream_t>(args->stream), "gemm_sm90", err, err_len);
}

}  // namespace detail
}  // namespace gemm
}  // namespace fray

#define FRAY_GEMM_ENTRY(CONFIG) FRAY_SM90_ENTRY(CONFIG, ::fray::gemm::detail, "gemm_sm90")

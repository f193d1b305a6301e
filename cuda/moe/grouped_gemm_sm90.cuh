// Fray: the Hopper grouped GEMM, out rows [offsets[g], offsets[g+1]) = a rows @ B_g, composed from
// CUTLASS 3.x's pointer-array collectives: per group its own TMA descriptors (updated in the
// kernel), wgmma, a persistent grouped tile scheduler over (group, tile), the TMA-store epilogue.
//
// The groups' sizes live on the device only (MoE dispatch counts, graph-captured offsets): a
// prologue kernel turns group_offsets [G + 1] into CUTLASS's per-group problem shapes, base
// pointers and strides inside the workspace, and CUTLASS's scheduler reads the shapes there (no
// host problem shapes: the grid is one CTA per SM and every CTA walks the groups' tiles), so
// nothing is read back on the host and the launch can be captured in a CUDA graph. The offsets are
// read as their running maximum clamped to [0, M] (as fray_triton.moe_gemm's tile map does):
// garbage offsets give garbage rows, never an access outside a or out.
//
//   #include "cuda/moe/grouped_gemm_sm90.cuh"
//   using Config = fray::moe::Sm90GroupedConfig<cutlass::bfloat16_t, fray::gemm::kLayoutNK, 128, 128, 64, 1, 1,
//                                               fray::gemm::kCooperative>;
//   FRAY_GROUPED_GEMM_ENTRY(Config)
//
// Slots: ptrs = (a, b, group_offsets (int32 [G + 1]), out, workspace); ints = (M, N, K, G, lda,
// ldb, stride_g, ldc): a [M, K] with row stride lda; b the weight stack, group g at b + g *
// stride_g, each [N, K] (kLayoutNK, row stride ldb) or [K, N] (kLayoutKN); out [M, N] with row
// stride ldc. Rows outside [offsets[0], offsets[G]) are not written.
#pragma once

#include "cuda/gemm/gemm_sm90.cuh"
#include "cutlass/gemm/group_array_problem_shape.hpp"

namespace fray {
namespace moe {

using gemm::kAlign16;
using gemm::kCooperative;
using gemm::kLayoutKN;
using gemm::kLayoutNK;

template <class Element_, int kLayoutB_, int kTileM_, int kTileN_, int kTileK_, int kClusterM_, int kClusterN_,
          int kSchedule_>
struct Sm90GroupedConfig {
  using Element = Element_;
  using ElementAcc = float;
  static constexpr int kLayoutB = kLayoutB_;
  static constexpr int kTileM = kTileM_, kTileN = kTileN_, kTileK = kTileK_;
  static constexpr int kClusterM = kClusterM_, kClusterN = kClusterN_;
  static constexpr int kSchedule = kSchedule_;
  static_assert(cute::is_same_v<Element, cutlass::bfloat16_t> || cute::is_same_v<Element, cutlass::half_t>,
                "a and b are bf16 or fp16");
  static_assert(kSchedule != kCooperative || kTileM >= 128, "the cooperative schedule needs tile M >= 128");

  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cute::conditional_t<kLayoutB == kLayoutNK, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutD = cutlass::layout::RowMajor;
  using TileShape = cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>, cute::Int<kTileK>>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>;
  using KernelSchedule = cute::conditional_t<kSchedule == kCooperative,
                                             cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                                             cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong>;
  using EpilogueSchedule = cute::conditional_t<kSchedule == kCooperative,
                                               cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
                                               cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;
  // No source C: D = acc, rounded once to the operands' dtype.
  using Fusion = cutlass::epilogue::fusion::LinearCombination<Element, float, void, float>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, void, LayoutD*, kAlign16<Element>,
      Element, LayoutD*, kAlign16<Element>, EpilogueSchedule, Fusion>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlign16<Element>, Element,
      LayoutB*, kAlign16<Element>, ElementAcc, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;

  static void describe(char* buf, size_t len) {
    snprintf(buf, len, "grouped_gemm_sm90 %s b=%s %dx%dx%d c%dx%d %s stages=%d", gemm::element_name<Element>(),
             kLayoutB == kLayoutNK ? "nk" : "kn", kTileM, kTileN, kTileK, kClusterM, kClusterN,
             kSchedule == kCooperative ? "coop" : "pingpong",
             static_cast<int>(CollectiveMainloop::DispatchPolicy::Stages));
  }
};

namespace detail {

using ::fray::jit_set_err;
using gemm::detail::aligned16;
using gemm::detail::current_device;

struct Slots {
  const void* a;
  const void* b;
  const int32_t* offsets;
  void* out;
  void* workspace;
  int64_t m, n, k, groups, lda, ldb, stride_g, ldc;
};

inline size_t round16(size_t v) { return (v + 15) & ~size_t(15); }
// CUTLASS's own workspace holds the per-SM TMA descriptors (CUtensorMap), which must be 128-byte
// aligned: a 16-byte multiple offset misaligned them whenever the group arrays' total was not a
// multiple of 128 ("misaligned address" at 8 groups on the H100, 2026-12-07).
inline size_t round128(size_t v) { return (v + 127) & ~size_t(127); }

// The per-group arrays at the start of the workspace; CUTLASS's own workspace follows them.
template <class Config>
struct Layout {
  using Shape = typename Config::ProblemShape::UnderlyingProblemShape;
  using E = typename Config::Element;
  size_t shapes, ptr_a, ptr_b, ptr_d, stride_a, stride_b, stride_d, total;
  explicit Layout(int64_t g) {
    size_t at = 0;
    shapes = at, at = round16(at + g * sizeof(Shape));
    ptr_a = at, at = round16(at + g * sizeof(const E*));
    ptr_b = at, at = round16(at + g * sizeof(const E*));
    ptr_d = at, at = round16(at + g * sizeof(E*));
    stride_a = at, at = round16(at + g * sizeof(typename Config::StrideA));
    stride_b = at, at = round16(at + g * sizeof(typename Config::StrideB));
    stride_d = at, at = round16(at + g * sizeof(typename Config::StrideD));
    total = round128(at);
  }
};

template <class Config>
__global__ void prepare_groups(Slots s, Layout<Config> lay) {
  using E = typename Config::Element;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= s.groups) return;
  // the running maximum of offsets[0..g] and of offsets[0..g+1], clamped to [0, M]
  int64_t lo = 0;
  for (int64_t i = 0; i <= g; ++i) lo = i == 0 ? s.offsets[0] : (s.offsets[i] > lo ? s.offsets[i] : lo);
  int64_t hi = s.offsets[g + 1] > lo ? s.offsets[g + 1] : lo;
  lo = lo < 0 ? 0 : (lo > s.m ? s.m : lo);
  hi = hi < 0 ? 0 : (hi > s.m ? s.m : hi);
  char* ws = static_cast<char*>(s.workspace);
  using Shape = typename Config::ProblemShape::UnderlyingProblemShape;
  reinterpret_cast<Shape*>(ws + lay.shapes)[g] =
      Shape(static_cast<int>(hi - lo), static_cast<int>(s.n), static_cast<int>(s.k));
  reinterpret_cast<const E**>(ws + lay.ptr_a)[g] = static_cast<const E*>(s.a) + lo * s.lda;
  reinterpret_cast<const E**>(ws + lay.ptr_b)[g] = static_cast<const E*>(s.b) + g * s.stride_g;
  reinterpret_cast<E**>(ws + lay.ptr_d)[g] = static_cast<E*>(s.out) + lo * s.ldc;
  typename Config::StrideA sa{};
  typename Config::StrideB sb{};
  typename Config::StrideD sd{};
  cute::get<0>(sa) = s.lda;
  if constexpr (Config::kLayoutB == kLayoutNK) {
    cute::get<0>(sb) = s.ldb;  // (N, K): N strides by ldb, K is contiguous
  } else {
    cute::get<1>(sb) = s.ldb;  // (N, K): N is contiguous, K strides by ldb
  }
  cute::get<0>(sd) = s.ldc;
  reinterpret_cast<typename Config::StrideA*>(ws + lay.stride_a)[g] = sa;
  reinterpret_cast<typename Config::StrideB*>(ws + lay.stride_b)[g] = sb;
  reinterpret_cast<typename Config::StrideD*>(ws + lay.stride_d)[g] = sd;
}

template <class Config>
int read_slots(const FrayArgs* args, Slots* s, char* err, int32_t err_len) {
  if (args == nullptr || args->num_ptrs < 4 || args->num_ints < 8) {
    jit_set_err(err, err_len, "grouped_gemm_sm90: expected ptrs (a, b, offsets, out, workspace) and ints (M, N, K, G, "
                "lda, ldb, stride_g, ldc), got %d ptrs and %d ints", args ? args->num_ptrs : -1,
                args ? args->num_ints : -1);
    return 1;
  }
  s->a = reinterpret_cast<const void*>(args->ptrs[0]);
  s->b = reinterpret_cast<const void*>(args->ptrs[1]);
  s->offsets = reinterpret_cast<const int32_t*>(args->ptrs[2]);
  s->out = reinterpret_cast<void*>(args->ptrs[3]);
  s->workspace = args->num_ptrs > 4 ? reinterpret_cast<void*>(args->ptrs[4]) : nullptr;
  s->m = args->ints[0], s->n = args->ints[1], s->k = args->ints[2], s->groups = args->ints[3];
  s->lda = args->ints[4], s->ldb = args->ints[5], s->stride_g = args->ints[6], s->ldc = args->ints[7];
  if (s->m < 1 || s->n < 1 || s->k < 1 || s->groups < 1 || s->m > INT32_MAX || s->n > INT32_MAX ||
      s->k > INT32_MAX || s->groups > INT32_MAX) {
    jit_set_err(err, err_len, "grouped_gemm_sm90: expected 1 <= M, N, K, G < 2^31, got M=%lld N=%lld K=%lld G=%lld",
                (long long)s->m, (long long)s->n, (long long)s->k, (long long)s->groups);
    return 1;
  }
  constexpr int ae = kAlign16<typename Config::Element>;
  if (!aligned16(args->ptrs[0]) || !aligned16(args->ptrs[1]) || !aligned16(args->ptrs[3]) || s->lda % ae ||
      s->ldb % ae || s->stride_g % ae || s->ldc % ae || s->k % ae || s->n % ae) {
    jit_set_err(err, err_len, "grouped_gemm_sm90: TMA needs 16-byte aligned a, b, out and rows: lda, ldb, stride_g, "
                "ldc, N, K multiples of %d", ae);
    return 1;
  }
  return 0;
}

template <class Config>
typename Config::Gemm::Arguments make_arguments(const Slots& s, const Layout<Config>& lay, int device) {
  using E = typename Config::Element;
  using Shape = typename Config::ProblemShape::UnderlyingProblemShape;
  char* ws = static_cast<char*>(s.workspace);
  typename Config::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = typename Config::ProblemShape{static_cast<int>(s.groups),
                                                     reinterpret_cast<Shape*>(ws + lay.shapes), nullptr};
  args.mainloop.ptr_A = reinterpret_cast<const E**>(ws + lay.ptr_a);
  args.mainloop.dA = reinterpret_cast<typename Config::StrideA*>(ws + lay.stride_a);
  args.mainloop.ptr_B = reinterpret_cast<const E**>(ws + lay.ptr_b);
  args.mainloop.dB = reinterpret_cast<typename Config::StrideB*>(ws + lay.stride_b);
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = reinterpret_cast<typename Config::StrideD*>(ws + lay.stride_d);
  args.epilogue.ptr_D = reinterpret_cast<E**>(ws + lay.ptr_d);
  args.epilogue.dD = reinterpret_cast<typename Config::StrideD*>(ws + lay.stride_d);
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  args.hw_info.device_id = device;
  args.hw_info.sm_count = gemm::detail::sm_count(device);
  return args;
}

template <class Config>
int64_t workspace_bytes(const FrayArgs* args) {
  Slots s{};
  if (read_slots<Config>(args, &s, nullptr, 0)) return 0;
  Layout<Config> lay(s.groups);
  s.workspace = nullptr;  // only sizes are read
  auto arguments = make_arguments<Config>(s, lay, current_device(args));
  return static_cast<int64_t>(lay.total + round16(Config::Gemm::get_workspace_size(arguments)));
}

template <class Config>
int launch(const FrayArgs* args, char* err, int32_t err_len) {
  Slots s{};
  if (read_slots<Config>(args, &s, err, err_len)) return 1;
  if (s.workspace == nullptr) {
    jit_set_err(err, err_len, "grouped_gemm_sm90: expected a workspace (fray_jit_workspace_bytes) as the last pointer");
    return 1;
  }
  const int device = current_device(args);
  auto stream = reinterpret_cast<cudaStream_t>(args->stream);
  Layout<Config> lay(s.groups);
  const int threads = 128;
  prepare_groups<Config><<<static_cast<unsigned>((s.groups + threads - 1) / threads), threads, 0, stream>>>(s, lay);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    jit_set_err(err, err_len, "grouped_gemm_sm90: the group prologue failed to launch: %s", cudaGetErrorString(e));
    return 1;
  }
  auto arguments = make_arguments<Config>(s, lay, device);
  return gemm::detail::run_kernel<typename Config::GemmKernel, typename Config::Gemm>(
      arguments, static_cast<char*>(s.workspace) + lay.total, device, stream, "grouped_gemm_sm90", err, err_len);
}

}  // namespace detail
}  // namespace moe
}  // namespace fray

#define FRAY_GROUPED_GEMM_ENTRY(CONFIG) FRAY_SM90_ENTRY(CONFIG, ::fray::moe::detail, "grouped_gemm_sm90")

// Fray: the Hopper scaled GEMM on 8-bit operands, D[M, N] = dequant(A[M, K]) * dequant(B[N, K])^T
// (+ bias[N]), composed from CUTLASS 3.x collectives like gemm_sm90.cuh, whose launch it shares.
//
// Inputs are int8 (int32 accumulation, exact) or float8_e4m3fn (fp32 accumulation on wgmma); B is
// [N, K] (nn.Linear's layout, K-major). Scales are fp32:
//
//   kScaleTensor  one scale for the operand (a device pointer to one float)
//   kScaleVector  a per-row scale of A ([M]) or a per-output-channel scale of B ([N]), applied in
//                 the epilogue: D = round(fp32(acc) * sb[n] * sa[m] (+ bias[n]))
//   kScaleBlock   (both operands; fp8 only) A's scales per row and 128 of K ([M, ceil(K / 128)]
//                 row-major, K-major for CUTLASS), B's per 128 x 128 block ([ceil(N / 128),
//                 ceil(K / 128)] row-major): the mainloop promotes each 128-deep slice of the
//                 wgmma accumulator into fp32 registers times sa * sb, as DeepSeek-V3 specifies
//                 (CUTLASS's blockwise-scaling FP8 mainloop). D = round(acc (+ bias[n])).
//
// fp8 with kFastAccum accumulates in the tensor core across all of K (CUTLASS's FP8FastAccum
// schedule, torch._scaled_mm's use_fast_accum=True); without it the mainloop promotes the
// accumulator into fp32 registers every few k-blocks (use_fast_accum=False).
//
// Slots: ptrs = (a, b, a_scale, b_scale, bias or 0, out, [workspace]); ints = (M, N, K, lda, ldb,
// ldc), row strides in elements; floats = ().
#pragma once

#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"

#include "cuda/gemm/gemm_sm90.cuh"

namespace fray {
namespace gemm {

enum ScaleKind : int { kScaleTensor = 0, kScaleVector = 1, kScaleBlock = 2 };

template <class T>
constexpr const char* element8_name() {
  if constexpr (cute::is_same_v<T, int8_t>) return "int8";
  else if constexpr (cute::is_same_v<T, cutlass::float_e4m3_t>) return "e4m3";
  else return element_name<T>();
}

constexpr int kScaleBlockK = 128;  // the K extent of every scale block (and the N extent of B's)

template <class ElementIn_, class ElementOut_, int kScaleA_, int kScaleB_, bool kBias_, int kTileM_, int kTileN_,
          int kTileK_, int kClusterM_, int kClusterN_, int kSchedule_, int kStages_, int kRaster_, int kSwizzle_,
          int kScheduler_ = kPersistent, bool kFastAccum_ = false>
struct Sm90ScaledGemmConfig {
  using ElementIn = ElementIn_;
  using ElementOut = ElementOut_;
  static constexpr bool kInt8 = cute::is_same_v<ElementIn, int8_t>;
  using ElementAcc = cute::conditional_t<kInt8, int32_t, float>;
  static constexpr int kScaleA = kScaleA_, kScaleB = kScaleB_;
  static constexpr bool kBlock = kScaleA == kScaleBlock;
  static constexpr bool kBias = kBias_;
  static constexpr int kTileM = kTileM_, kTileN = kTileN_, kTileK = kTileK_;
  static constexpr int kClusterM = kClusterM_, kClusterN = kClusterN_;
  static constexpr int kSchedule = kSchedule_, kStages = kStages_, kRaster = kRaster_, kSwizzle = kSwizzle_;
  static constexpr int kScheduler = kScheduler_;
  static constexpr bool kFastAccum = kFastAccum_;

  static_assert(kInt8 || cute::is_same_v<ElementIn, cutlass::float_e4m3_t>, "A and B are int8 or float8_e4m3fn");
  static_assert(cute::is_same_v<ElementOut, cutlass::bfloat16_t> || cute::is_same_v<ElementOut, cutlass::half_t> ||
                    cute::is_same_v<ElementOut, float>,
                "the output is bf16, fp16 or fp32");
  static_assert((kScaleA == kScaleBlock) == (kScaleB == kScaleBlock), "block scales are for both operands or neither");
  static_assert(!kBlock || !kInt8, "block scales are for float8_e4m3fn operands");
  static_assert(!kBlock || (kTileK % kScaleBlockK == 0 && kTileN % kScaleBlockK == 0),
                "block scales need tile K and tile N multiples of 128");
  static_assert(!(kFastAccum && (kInt8 || kBlock)), "fast accumulation is a choice for per-tensor / vector fp8 only");
  static_assert(kSchedule == kPingpong || kTileM >= 128, "the cooperative schedule needs tile M >= 128");
  static_assert(kScheduler == kPersistent || kSchedule == kCooperative, "stream-K needs the cooperative schedule");

  using LayoutA = cutlass::layout::RowMajor;     // a [M, K]
  using LayoutB = cutlass::layout::ColumnMajor;  // b [N, K]: a K x N column-major
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignIn = 16;            // 16 bytes of 8-bit elements
  using TileShape = cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>, cute::Int<kTileK>>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>;

  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

  // The epilogue: scale vectors as row / column broadcasts (element-wise loads, no alignment
  // needed), per-tensor scales as device scalars; the bias is read in the output dtype.
  struct Evt {
    template <int kKind>
    using ScaleRow = cute::conditional_t<kKind == kScaleVector,
                                         cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float,
                                                                                     cute::Stride<cute::_1, cute::_0, cute::_0>, 1>,
                                         cutlass::epilogue::fusion::Sm90ScalarBroadcast<float>>;
    template <int kKind>
    using ScaleCol = cute::conditional_t<kKind == kScaleVector,
                                         cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float,
                                                                                     cute::Stride<cute::_0, cute::_1, cute::_0>, 1>,
                                         cutlass::epilogue::fusion::Sm90ScalarBroadcast<float>>;
    using Bias = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, ElementOut, float,
                                                             cute::Stride<cute::_0, cute::_1, cute::_0>, 1>;
    using AccB = cutlass::epilogue::fusion::Sm90EVT<
        cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>,
        cutlass::epilogue::fusion::Sm90AccFetch, ScaleCol<kScaleB>>;
    using Scaled = cute::conditional_t<
        kBias,
        cutlass::epilogue::fusion::Sm90EVT<
            cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElementOut, float, kRound>, AccB,
            ScaleRow<kScaleA>, Bias>,
        cutlass::epilogue::fusion::Sm90EVT<
            cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, ElementOut, float, kRound>, AccB,
            ScaleRow<kScaleA>>>;
  };
  // Block scales are applied in the mainloop: the epilogue is D = acc (+ bias).
  using Fusion = cute::conditional_t<
      kBlock,
      cute::conditional_t<kBias,
                          cutlass::epilogue::fusion::LinCombPerColBias<ElementOut, float, ElementOut, ElementOut, float, 1>,
                          cutlass::epilogue::fusion::LinearCombination<ElementOut, float, void, float>>,
      typename Evt::Scaled>;

  using KernelSchedule = cute::conditional_t<
      kBlock,
      cute::conditional_t<kSchedule == kCooperative, cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                          cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise>,
      cute::conditional_t<
          kFastAccum,
          cute::conditional_t<kSchedule == kCooperative, cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum,
                              cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum>,
          cute::conditional_t<kSchedule == kCooperative, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                              cutlass::gemm::KernelTmaWarpSpecializedPingpong>>>;
  using EpilogueSchedule = cute::conditional_t<kSchedule == kCooperative, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                               cutlass::epilogue::TmaWarpSpecialized>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, void, LayoutD, kAlign16<ElementOut>, ElementOut,
      LayoutD, kAlign16<ElementOut>, EpilogueSchedule, Fusion>::CollectiveOp;

  using StageCount = cute::conditional_t<
      kStages == 0,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::collective::StageCount<(kStages > 0 ? kStages : 1)>>;

  // Block scales, K-major as fray.quantize writes them: A's [M, ceil(K / 128)], B's
  // [ceil(N / 128), ceil(K / 128)], both row-major.
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, kScaleBlockK, kScaleBlockK, cute::GMMA::Major::K,
                                                                cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using MainloopLayoutA = cute::conditional_t<kBlock, cute::tuple<LayoutA, LayoutSFA>, LayoutA>;
  using MainloopLayoutB = cute::conditional_t<kBlock, cute::tuple<LayoutB, LayoutSFB>, LayoutB>;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementIn, MainloopLayoutA, kAlignIn, ElementIn,
      MainloopLayoutB, kAlignIn, ElementAcc, TileShape, ClusterShape, StageCount, KernelSchedule>::CollectiveOp;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
      cute::Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue,
      cute::conditional_t<kScheduler == kStreamK, cutlass::gemm::StreamKScheduler, cutlass::gemm::PersistentScheduler>>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  static void describe(char* buf, size_t len) {
    static const char* kinds[] = {"tensor", "vector", "block"};
    snprintf(buf, len, "scaled_gemm_sm90 %s out=%s scales=%s/%s%s %dx%dx%d c%dx%d %s stages=%s%d raster=%s swizzle=%d%s%s",
             element8_name<ElementIn>(), element_name<ElementOut>(), kinds[kScaleA], kinds[kScaleB], kBias ? " bias" : "",
             kTileM, kTileN, kTileK, kClusterM, kClusterN, kSchedule == kCooperative ? "coop" : "pingpong",
             kStages == 0 ? "auto:" : "", kStages == 0 ? static_cast<int>(CollectiveMainloop::DispatchPolicy::Stages) : kStages,
             kRaster == kRasterAlongM ? "m" : kRaster == kRasterAlongN ? "n" : "auto", kSwizzle,
             kScheduler == kStreamK ? " stream-k" : "", kFastAccum ? " fast-accum" : "");
  }
};

namespace scaled_detail {

// The calls below name scaled_detail:: explicitly: Slots derives from detail::Problem, so argument-
// dependent lookup would also offer detail::read_slots / make_arguments (gemm_sm90's).

using ::fray::jit_set_err;
using detail::aligned16;

template <class Config>
struct Slots : detail::Problem {
  const typename Config::ElementIn* a;
  const typename Config::ElementIn* b;
  const float* a_scale;
  const float* b_scale;
  const typename Config::ElementOut* bias;
  typename Config::ElementOut* out;
  void* workspace;
};

template <class Config>
int read_slots(const FrayArgs* args, Slots<Config>* s, char* err, int32_t err_len) {
  using E = typename Config::ElementIn;
  using O = typename Config::ElementOut;
  if (args == nullptr || args->num_ptrs < 6 || args->num_ints < 6) {
    jit_set_err(err, err_len,
                "scaled_gemm_sm90: expected ptrs (a, b, a_scale, b_scale, bias, out[, workspace]) and ints (M, N, K, lda, "
                "ldb, ldc), got %d ptrs and %d ints",
                args ? args->num_ptrs : -1, args ? args->num_ints : -1);
    return 1;
  }
  s->a = reinterpret_cast<const E*>(args->ptrs[0]);
  s->b = reinterpret_cast<const E*>(args->ptrs[1]);
  s->a_scale = reinterpret_cast<const float*>(args->ptrs[2]);
  s->b_scale = reinterpret_cast<const float*>(args->ptrs[3]);
  s->bias = reinterpret_cast<const O*>(args->ptrs[4]);
  s->out = reinterpret_cast<O*>(args->ptrs[5]);
  s->workspace = args->num_ptrs > 6 ? reinterpret_cast<void*>(args->ptrs[6]) : nullptr;
  if (detail::read_problem(args, s, "scaled_gemm_sm90", err, err_len)) return 1;
  if (s->lda < s->k || s->ldb < s->k || s->ldc < s->n) {
    jit_set_err(err, err_len, "scaled_gemm_sm90: row strides too small: lda=%lld ldb=%lld (K=%lld), ldc=%lld (N=%lld)",
                (long long)s->lda, (long long)s->ldb, (long long)s->k, (long long)s->ldc, (long long)s->n);
    return 1;
  }
  if (s->a_scale == nullptr || s->b_scale == nullptr) {
    jit_set_err(err, err_len, "scaled_gemm_sm90: a_scale and b_scale are required, got a_scale=0x%llx b_scale=0x%llx",
                (unsigned long long)args->ptrs[2], (unsigned long long)args->ptrs[3]);
    return 1;
  }
  const int oe = kAlign16<O>;
  if (!aligned16(args->ptrs[0]) || !aligned16(args->ptrs[1]) || !aligned16(args->ptrs[5])) {
    jit_set_err(err, err_len, "scaled_gemm_sm90: TMA needs 16-byte aligned a, b and out, got a=0x%llx b=0x%llx out=0x%llx",
                (unsigned long long)args->ptrs[0], (unsigned long long)args->ptrs[1], (unsigned long long)args->ptrs[5]);
    return 1;
  }
  if (s->lda % 16 || s->ldb % 16 || s->k % 16 || s->ldc % oe || s->n % oe) {
    jit_set_err(err, err_len,
                "scaled_gemm_sm90: TMA needs 16-byte rows: lda, ldb, K multiples of 16 and ldc, N multiples of %d; got "
                "lda=%lld ldb=%lld ldc=%lld N=%lld K=%lld",
                oe, (long long)s->lda, (long long)s->ldb, (long long)s->ldc, (long long)s->n, (long long)s->k);
    return 1;
  }
  if (Config::kBias != (s->bias != nullptr)) {
    jit_set_err(err, err_len, "scaled_gemm_sm90: this kernel was built %s bias, got bias=0x%llx",
                Config::kBias ? "with" : "without", (unsigned long long)args->ptrs[4]);
    return 1;
  }
  return 0;
}

template <class Config>
typename Config::Gemm::Arguments make_arguments(const Slots<Config>& s, int device) {
  using Gemm = typename Config::Gemm;
  using GemmKernel = typename Config::GemmKernel;
  typename GemmKernel::StrideA stride_a{};
  typename GemmKernel::StrideB stride_b{};
  typename GemmKernel::StrideD stride_d{};
  cute::get<0>(stride_a) = s.lda;
  cute::get<0>(stride_b) = s.ldb;
  cute::get<0>(stride_d) = s.ldc;
  const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);

  typename Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = cute::make_shape(m, n, k, 1);
  args.mainloop.ptr_A = s.a;
  args.mainloop.dA = stride_a;
  args.mainloop.ptr_B = s.b;
  args.mainloop.dB = stride_b;
  if constexpr (Config::kBlock) {
    args.mainloop.ptr_SFA = s.a_scale;
    args.mainloop.layout_SFA = Config::ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(m, n, k, 1));
    args.mainloop.ptr_SFB = s.b_scale;
    args.mainloop.layout_SFB = Config::ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(m, n, k, 1));
  }
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = stride_d;
  args.epilogue.ptr_D = s.out;
  args.epilogue.dD = stride_d;
  if constexpr (Config::kBlock) {
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    if constexpr (Config::kBias) args.epilogue.thread.bias_ptr = s.bias;
  } else {
    // The tree's arguments nest as the nodes do: {children..., node op}.
    using Evt = typename Config::Evt;
    typename Evt::template ScaleCol<Config::kScaleB>::Arguments b_args{};
    typename Evt::template ScaleRow<Config::kScaleA>::Arguments a_args{};
    if constexpr (Config::kScaleB == kScaleVector) {
      b_args.ptr_row = s.b_scale;
    } else {
      b_args.scalar_ptrs[0] = s.b_scale;
    }
    if constexpr (Config::kScaleA == kScaleVector) {
      a_args.ptr_col = s.a_scale;
    } else {
      a_args.scalar_ptrs[0] = s.a_scale;
    }
    typename Evt::AccB::Arguments acc_b{{}, b_args, {}};
    if constexpr (Config::kBias) {
      typename Evt::Bias::Arguments bias_args{};
      bias_args.ptr_row = s.bias;
      args.epilogue.thread = {acc_b, a_args, bias_args, {}};
    } else {
      args.epilogue.thread = {acc_b, a_args, {}};
    }
  }
  args.hw_info.device_id = device;
  args.hw_info.sm_count = detail::sm_count(device);
  args.scheduler.max_swizzle_size = Config::kSwizzle;
  using RasterOpt = typename GemmKernel::TileScheduler::RasterOrderOptions;
  args.scheduler.raster_order = Config::kRaster == kRasterAlongM   ? RasterOpt::AlongM
                                : Config::kRaster == kRasterAlongN ? RasterOpt::AlongN
                                                                   : RasterOpt::Heuristic;
  return args;
}

template <class Config>
int64_t workspace_bytes(const FrayArgs* args) {
  Slots<Config> s{};
  if (scaled_detail::read_slots<Config>(args, &s, nullptr, 0)) return 0;
  auto arguments = scaled_detail::make_arguments<Config>(s, detail::current_device(args));
  return static_cast<int64_t>(Config::Gemm::get_workspace_size(arguments));
}

template <class Config>
int launch(const FrayArgs* args, char* err, int32_t err_len) {
  Slots<Config> s{};
  if (scaled_detail::read_slots<Config>(args, &s, err, err_len)) return 1;
  const int device = detail::current_device(args);
  auto arguments = scaled_detail::make_arguments<Config>(s, device);
  return detail::run_kernel<typename Config::GemmKernel, typename Config::Gemm>(
      arguments, s.workspace, device, reinterpret_cast<cudaStream_t>(args->stream), "scaled_gemm_sm90", err, err_len);
}

}  // namespace scaled_detail
}  // namespace gemm
}  // namespace fray

#define FRAY_SCALED_GEMM_ENTRY(CONFIG) FRAY_SM90_ENTRY(CONFIG, ::fray::gemm::scaled_detail, "scaled_gemm_sm90")

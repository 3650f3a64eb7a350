/* The CUTLASS kernel template behind cuda_gemm_fused (cutlass.h); included only by the
 * per-dtype instantiation files, so each dtype compiles in a translation unit of its own (the
 * two compile in parallel; CUTLASS kernels are slow to compile).
 *
 * Row-major y[M=T, N] = x[M, K] · w[N, K]ᵀ in CUTLASS's terms: A = x, row-major (K contiguous);
 * B = w seen as a K x N column-major matrix (K contiguous too: the "TN" layout both wgmma
 * operands like best); C (residual) and D (y) row-major. The epilogue is the visitor tree
 * LinCombPerColBiasEltAct: D = act(alpha·acc + beta·C + bias[n]) in fp32, one rounding at the
 * store, with act = the exact GELU below or Identity. beta = 0 skips the C loads altogether
 * (Sm90 EVT's is_C_load_needed), so bias-only costs no residual traffic; the GELU kernels have
 * no C operand. */
#pragma once

#include <stdint.h>

#include <type_traits>

#include <cuda_runtime.h>

/* Programmatic dependent launch inside the CUTLASS kernels: the producer warps wait
 * (griddepcontrol.wait) before their first load of A, B or C, and the consumers let the next
 * kernel launch once their last tile's MMAs are done. Launched with the attribute (run() below),
 * a GEMM's prologue (barrier setup, tensor-map prefetch) overlaps the tail of the kernel before it. */
#define CUTLASS_ENABLE_GDC_FOR_SM90 1

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

#include "backend/cuda/common.h"
#include "backend/cuda/gemm/cutlass.h"
extern "C" {
#include "util/error.h"
}

namespace nopad_gemm {

using namespace cute;

/* Tile configurations (the numbers are cuda_gemm_fused's config indices), chosen by measurement
 * on an H200 among cooperative 128x256 (cluster 2x1) and 256x128 (cluster 1x2), ping-pong
 * 128x128 (clusters 1x1 and 2x1) and 64x128, and epilogue subtiles 64x32, 64x64, 64x128, 128x32
 * and 128x64 (docs/gemm.md):
 * 0: ping-pong 128x128x64 — each consumer warpgroup owns a whole tile, so one's epilogue overlaps
 *    the other's MMAs; the GELU kernel takes 64x64 epilogue subtiles (32 independent elements per
 *    thread for the erf math and half the subtile barriers of the default 64x32).
 * 1: ping-pong 64x128x64 — twice the tiles of config 0, for grids under ~2 waves of 128x128
 *    tiles on 132 SMs, where config 0 leaves SMs idle in the last wave. */
using EpiAuto = cutlass::epilogue::collective::EpilogueTileAuto;
struct Cfg0 {
    using Tile = Shape<_128, _128, _64>;
    using Cluster = Shape<_1, _1, _1>;
    using Kernel = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
    using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
    using EpiTile = EpiAuto;
    using EpiTileGelu = Shape<_64, _64>;
};
struct Cfg1 {
    using Tile = Shape<_64, _128, _64>;
    using Cluster = Shape<_1, _1, _1>;
    using Kernel = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
    using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
    using EpiTile = EpiAuto;
    using EpiTileGelu = EpiAuto;
};
/* Exact GELU, x·Φ(x) = ½x·erfc(-x/√2), in fewer instructions than ½x·(1 + erff(x/√2)): at K = 768
 * the epilogue's arithmetic, not the MMAs, bounds the fused kernel (with a ReLU in its place the
 * same kernel runs 1.75x faster), so every instruction per element counts. With z = |x|/√2,
 * erfc(z) = t·P(t)·exp(-z²), t = 1/(1 + p·z) (Abramowitz & Stegun 7.1.26: |error| <= 1.5e-7 for
 * every z >= 0); Φ(x) = 1 - ½erfc(z) for x >= 0 and ½erfc(z) for x < 0, the tail taken directly
 * rather than as 1 + erf (no cancellation). The reciprocal and the exponential are single MUFU
 * instructions (rcp/ex2.approx.ftz, <= 2 ulp; d >= 1 and exp(-z²) only underflows where the tail
 * is below fp32 anyway): the IEEE and denormal-safe forms (1/d, __fdividef, __expf) add compare
 * and rescale instructions that cost the kernel 20-25% on an H200. Absolute error <= 5e-7·max(1,
 * |x|) against double-precision erf: 3 orders of magnitude under an fp16 or bf16 output's
 * rounding, and as exact as PyTorch's fp32 erf GELU to within that. ~15 instructions, 2 MUFU.
 * half_erfc_abs returns ½erfc(|x|/√2) and exp(-x²/2) in e (GELU's derivative uses both:
 * cutlass_train.cu). */
CUTLASS_HOST_DEVICE float half_erfc_abs(float x, float &e) {
    /* 1/√2 folded into p (0.3275911/√2) and -log2(e) into the exponent; ½ into P's coefficients */
    const float d = fmaf(0.23164188826636045f, fabsf(x), 1.0f);
    const float q = x * x * -0.72134752044448170f; /* -z²·log2(e), z = |x|/√2 */
    float t;
#ifdef __CUDA_ARCH__
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(t) : "f"(d));
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(q));
#else
    t = 1.0f / d;
    e = exp2f(q);
#endif
    float p = fmaf(0.5307027145f, t, -0.7265760135f);
    p = fmaf(p, t, 0.7107068705f);
    p = fmaf(p, t, -0.142248368f);
    p = fmaf(p, t, 0.127414796f);
    return p * t * e;
}

CUTLASS_HOST_DEVICE float gelu_erf(float x) {
    float e; /* exp(-x²/2), unused here */
    const float half_erfc = half_erfc_abs(x, e);
    return x * (x >= 0.0f ? 1.0f - half_erfc : half_erfc);
}

template <class T>
struct GeluErf {
    static const bool kIsHeavy = true;
    CUTLASS_HOST_DEVICE T operator()(T const &x) const { return T(gelu_erf(float(x))); }
};

template <class T, int N>
struct GeluErf<cutlass::Array<T, N>> {
    static const bool kIsHeavy = true;
    CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const &v) const {
        cutlass::Array<T, N> y;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < N; ++i) y[i] = T(gelu_erf(float(v[i])));
        return y;
    }
};

template <class Element, class Cfg, template <class> class Act>
struct Gemm {
    static constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value; /* 8: 16 bytes */
    static constexpr bool kGelu = std::is_same_v<Act<float>, GeluErf<float>>;
    using EpiTile = std::conditional_t<kGelu, typename Cfg::EpiTileGelu, typename Cfg::EpiTile>;
    /* The GELU kernel has no C operand at all (no beta·C arithmetic, no C buffer in shared
     * memory); the identity kernel reads C only when beta != 0 (the residual). */
    using ElementC = std::conditional_t<kGelu, void, Element>;
    using Fusion = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<
        Act, Element /*D*/, float /*compute*/, Element /*bias*/, ElementC /*C*/, float /*scalars*/>;
    using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Cfg::Tile,
        typename Cfg::Cluster, EpiTile, float, float,
        ElementC, cutlass::layout::RowMajor, kAlign, Element, cutlass::layout::RowMajor, kAlign,
        typename Cfg::Epilogue, Fusion>::CollectiveOp;
    using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor,
        kAlign, Element, cutlass::layout::ColumnMajor, kAlign, float, typename Cfg::Tile,
        typename Cfg::Cluster,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
            sizeof(typename CollectiveEpilogue::SharedStorage))>,
        typename Cfg::Kernel>::CollectiveOp;
    using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                        CollectiveEpilogue>;
    using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

/* The persistent grid is sized to the SMs (read once per device; 0 when the query fails). */
static inline int sm_count(int dev) {
    static int cached[CUDA_MAX_DEVICES];
    if (dev < 0) return 0;
    int n = cuda_cache_load(&cached[dev]);
    if (!n) {
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess) cuda_cache_store(&cached[dev], n);
        else cudaGetLastError(), n = 0;
    }
    return n;
}

/* How many clusters of this kernel fit on the device at once, with its real shared memory (once
 * per kernel and device). Without it the scheduler launches sm_count / cluster_size clusters,
 * and where the GPCs hold fewer 2-CTA clusters than that, the extra ones run as a second wave
 * after the rest: nearly twice the time for their share of the tiles. 0 when unknown. */
template <class Kernel>
static int max_active_clusters(int dev) {
    static int cached[CUDA_MAX_DEVICES]; /* 0: not asked yet; -1: the query failed */
    if (dev < 0) return 0;
    int known = cuda_cache_load(&cached[dev]);
    if (!known) {
        const void *fn = (const void *)cutlass::device_kernel<Kernel>;
        const int smem = (int)Kernel::SharedStorageSize;
        cudaLaunchAttribute attr;
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = size<0>(typename Kernel::ClusterShape{});
        attr.val.clusterDim.y = size<1>(typename Kernel::ClusterShape{});
        attr.val.clusterDim.z = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(attr.val.clusterDim.x, attr.val.clusterDim.y, 1);
        cfg.blockDim = dim3(Kernel::MaxThreadsPerBlock, 1, 1);
        cfg.dynamicSmemBytes = smem;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        int n = 0;
        if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
            cudaOccupancyMaxActiveClusters(&n, fn, &cfg) != cudaSuccess || n <= 0) {
            cudaGetLastError();
            n = -1;
        }
        cuda_cache_store(&cached[dev], n);
        known = n;
    }
    return known > 0 ? known : 0;
}

template <class Element, class Cfg, template <class> class Act>
nopad_status run(void *y, const void *x, const void *w, const void *bias, const void *residual,
                 int M, int K, int N, cudaStream_t stream) {
    using G = Gemm<Element, Cfg, Act>;
    using Dev = typename G::Device;
    /* All four operands are (rows, K or N, batch) with the second mode contiguous. */
    using Stride = cute::Stride<int64_t, _1, int64_t>;
    static_assert(std::is_same_v<typename G::Kernel::StrideA, Stride> &&
                  std::is_same_v<typename G::Kernel::StrideB, Stride> &&
                  std::is_same_v<typename G::Kernel::StrideC, Stride> &&
                  std::is_same_v<typename G::Kernel::StrideD, Stride>, "K- and N-contiguous operands");
    const Element *a = static_cast<const Element *>(x);
    const Element *b = static_cast<const Element *>(w);
    /* Without a residual, C points at D and beta = 0: C is never read (no load is issued). */
    using ElementC = typename G::ElementC;
    const ElementC *c = nullptr;
    if constexpr (!G::kGelu) c = static_cast<const Element *>(residual ? residual : y);
    Element *d = static_cast<Element *>(y);

    const int dev = cuda_current_device();
    cutlass::KernelHardwareInfo hw;
    hw.device_id = dev < 0 ? 0 : dev;
    hw.sm_count = sm_count(dev);
    hw.max_active_clusters = max_active_clusters<typename G::Kernel>(dev);
    typename Dev::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {M, N, K, 1},
        {a, Stride{K, _1{}, (int64_t)M * K}, b, Stride{K, _1{}, (int64_t)N * K}},
        {{}, c, Stride{N, _1{}, (int64_t)M * N}, d, Stride{N, _1{}, (int64_t)M * N}},
        hw};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = residual && !G::kGelu ? 1.0f : 0.0f;
    args.epilogue.thread.bias_ptr = static_cast<const Element *>(bias); /* NULL: adds 0 */

    Dev gemm;
    if (Dev::get_workspace_size(args) != 0) /* never for these data-parallel schedules */
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cutlass gemm: needs a workspace");
    cutlass::Status st = gemm.can_implement(args);
    if (st != cutlass::Status::kSuccess)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cutlass gemm: [%d, %d] x [%d, %d]ᵀ: %s", M, K,
                               N, K, cutlassGetStatusString(st));
    st = gemm.initialize(args, nullptr, stream);
    if (st == cutlass::Status::kSuccess) st = gemm.run(stream, nullptr, cuda_pdl_tensor_enabled() != 0);
    if (st != cutlass::Status::kSuccess) {
        cudaError_t err = cudaGetLastError();
        return nopad_set_error(NOPAD_ERR_BACKEND, "cutlass gemm: [%d, %d] x [%d, %d]ᵀ: %s (%s)", M, K, N,
                               K, cutlassGetStatusString(st), cudaGetErrorString(err));
    }
    return NOPAD_OK;
}

/* Runs config `cfg` with GELU (gelu != 0) or identity: the entry of each dtype's file. */
template <class Element>
nopad_status dispatch(int cfg, int gelu, void *y, const void *x, const void *w, const void *bias,
                      const void *residual, int M, int K, int N, cudaStream_t stream) {
    using cutlass::epilogue::thread::Identity;
    switch (cfg * 2 + (gelu ? 1 : 0)) {
    case 0: return run<Element, Cfg0, Identity>(y, x, w, bias, residual, M, K, N, stream);
    case 1: return run<Element, Cfg0, GeluErf>(y, x, w, bias, residual, M, K, N, stream);
    case 2: return run<Element, Cfg1, Identity>(y, x, w, bias, residual, M, K, N, stream);
    case 3: return run<Element, Cfg1, GeluErf>(y, x, w, bias, residual, M, K, N, stream);
    default: return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cutlass gemm: no config %d", cfg);
    }
}

} // namespace nopad_gemm

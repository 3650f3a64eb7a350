/* The FFN's GELU fused into its two GEMMs for training (cutlass.h: cuda_gemm_gelu_aux,
 * cuda_gemm_dgelu), bf16 only (training computes in bf16; fp16 is refused without loss scaling).
 * A translation unit of its own: CUTLASS kernels are slow to compile.
 *
 * Forward, u = x·Wᵀ + b and a = gelu(u) in one kernel: cutlass.cuh's TN GEMM with the visitor
 * tree LinCombPerColBiasEltActAux, which stores u (the aux output, kept for the backward) beside
 * D = gelu(u). Without it the step ran the GEMM writing u and a separate pass reading u and
 * writing a: one [T, I] read and one kernel more a layer.
 *
 * Backward, dU = (dA·W) ⊙ gelu'(u) in one kernel: dA [T, N_out] row-major times W [N_out, N_in]
 * (the forward's weight, so B is row-major K x N: N contiguous) with the visitor tree
 * LinCombDeEltAct reading u (the aux input) in the epilogue. Without it: the GEMM writing dA·W,
 * then a pass reading it and u and writing dU.
 *
 * Both use the exact erf GELU of cutlass.cuh (gelu_erf, ~5e-7 absolute) and its derivative
 * gelu'(x) = Φ(x) + x·φ(x) from the same erfc and exponential (gelu_erf_grad below), in float32,
 * with one rounding to bf16 at the store. Tile: cutlass.cuh's config 0 (ping-pong 128x128x64,
 * 64x64 epilogue subtiles): training's GEMMs have thousands of tiles. */
#ifdef NOPAD_HAVE_CUTLASS
#ifndef NDEBUG
#define NDEBUG /* as cutlass_bf16.cu: no device asserts in the mainloop */
#endif
#include "backend/cuda/gemm/cutlass.cuh"

namespace nopad_gemm {

/* gelu'(x) = Φ(x) + x·φ(x), φ(x) = exp(-x²/2)/√(2π), from gelu_erf's terms (same error bound). */
CUTLASS_HOST_DEVICE float gelu_erf_grad(float x) {
    float e; /* exp(-x²/2) */
    const float half_erfc = half_erfc_abs(x, e);
    const float cdf = x >= 0.0f ? 1.0f - half_erfc : half_erfc;
    return fmaf(x * 0.3989422804014327f, e, cdf);
}

/* The epilogue's binary op: dy · gelu'(z) (LinCombDeEltAct calls it with (alpha·acc, aux)). */
template <class T>
struct DGeluErf {
    static const bool kIsHeavy = true;
    CUTLASS_HOST_DEVICE T operator()(T const &dy, T const &z) const {
        return T(float(dy) * gelu_erf_grad(float(z)));
    }
};

template <class T, int N>
struct DGeluErf<cutlass::Array<T, N>> {
    static const bool kIsHeavy = true;
    CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const &dy,
                                                        cutlass::Array<T, N> const &z) const {
        cutlass::Array<T, N> y;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < N; ++i) y[i] = T(float(dy[i]) * gelu_erf_grad(float(z[i])));
        return y;
    }
};

/* A GEMM of config Cfg0 with B's layout and the epilogue's fusion as parameters. */
template <class Element, class LayoutB, class Fusion, class ElementC>
struct TrainGemm {
    static constexpr int kAlign = 8;
    using Cfg = Cfg0;
    using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Cfg::Tile, typename Cfg::Cluster,
        typename Cfg::EpiTileGelu, float, float, ElementC, cutlass::layout::RowMajor, kAlign, Element,
        cutlass::layout::RowMajor, kAlign, typename Cfg::Epilogue, Fusion>::CollectiveOp;
    using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor, kAlign, Element,
        LayoutB, kAlign, float, typename Cfg::Tile, typename Cfg::Cluster,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
            sizeof(typename CollectiveEpilogue::SharedStorage))>,
        typename Cfg::Kernel>::CollectiveOp;
    using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                        CollectiveEpilogue>;
    using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

using Bf16 = cutlass::bfloat16_t;
using GeluAux = TrainGemm<Bf16, cutlass::layout::ColumnMajor,
                          cutlass::epilogue::fusion::LinCombPerColBiasEltActAux<
                              cutlass::layout::RowMajor, GeluErf, Bf16, float, Bf16, Bf16, void, float>,
                          void>;
using DGelu = TrainGemm<Bf16, cutlass::layout::RowMajor,
                        cutlass::epilogue::fusion::LinCombDeEltAct<cutlass::layout::RowMajor, DGeluErf, Bf16,
                                                                   float, Bf16, void, float>,
                        void>;

template <class G>
static nopad_status run_train(typename G::Device::Arguments &args, const char *what, int M, int K, int N,
                              cudaStream_t stream) {
    using Dev = typename G::Device;
    const int dev = cuda_current_device();
    args.hw_info.device_id = dev < 0 ? 0 : dev;
    args.hw_info.sm_count = sm_count(dev);
    args.hw_info.max_active_clusters = max_active_clusters<typename G::Kernel>(dev);
    Dev gemm;
    if (Dev::get_workspace_size(args) != 0)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cutlass %s: needs a workspace", what);
    cutlass::Status st = gemm.can_implement(args);
    if (st != cutlass::Status::kSuccess)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cutlass %s: [%d, %d] x [%d, %d]: %s", what, M, K, K, N,
                               cutlassGetStatusString(st));
    st = gemm.initialize(args, nullptr, stream);
    if (st == cutlass::Status::kSuccess) st = gemm.run(stream, nullptr, cuda_pdl_tensor_enabled() != 0);
    if (st != cutlass::Status::kSuccess) {
        cudaError_t err = cudaGetLastError();
        return nopad_set_error(NOPAD_ERR_BACKEND, "cutlass %s: [%d, %d] x [%d, %d]: %s (%s)", what, M, K, K, N,
                               cutlassGetStatusString(st), cudaGetErrorString(err));
    }
    return NOPAD_OK;
}

} // namespace nopad_gemm

using namespace nopad_gemm;

/* y[M, N] = gelu(x[M, K]·w[N, K]ᵀ + bias), aux[M, N] = x·wᵀ + bias. */
nopad_status nopad_gemm_cutlass_gelu_aux_bf16(void *y, void *aux, const void *x, const void *w, const void *bias,
                                              int M, int K, int N, cudaStream_t stream) {
    using Stride = cute::Stride<int64_t, _1, int64_t>;
    using Dev = typename GeluAux::Device;
    typename Dev::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {M, N, K, 1},
        {static_cast<const Bf16 *>(x), Stride{K, _1{}, (int64_t)M * K}, static_cast<const Bf16 *>(w),
         Stride{K, _1{}, (int64_t)N * K}},
        {{}, nullptr, Stride{N, _1{}, (int64_t)M * N}, static_cast<Bf16 *>(y), Stride{N, _1{}, (int64_t)M * N}},
        {}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.thread.bias_ptr = static_cast<const Bf16 *>(bias);
    args.epilogue.thread.aux_ptr = static_cast<Bf16 *>(aux);
    args.epilogue.thread.dAux = Stride{N, _1{}, (int64_t)M * N};
    return run_train<GeluAux>(args, "gemm gelu+aux", M, K, N, stream);
}

/* dx[M, N] = (dy[M, K]·w[K, N]) ⊙ gelu'(aux[M, N]); w row-major [K, N]. */
nopad_status nopad_gemm_cutlass_dgelu_bf16(void *dx, const void *dy, const void *w, const void *aux, int M, int K,
                                           int N, cudaStream_t stream) {
    using StrideA = cute::Stride<int64_t, _1, int64_t>;
    using StrideB = cute::Stride<_1, int64_t, int64_t>; /* (n, k, l): N contiguous */
    using Dev = typename DGelu::Device;
    static_assert(std::is_same_v<typename DGelu::Kernel::StrideB, StrideB>, "B row-major K x N");
    typename Dev::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {M, N, K, 1},
        {static_cast<const Bf16 *>(dy), StrideA{K, _1{}, (int64_t)M * K}, static_cast<const Bf16 *>(w),
         StrideB{_1{}, N, (int64_t)K * N}},
        {{}, nullptr, StrideA{N, _1{}, (int64_t)M * N}, static_cast<Bf16 *>(dx), StrideA{N, _1{}, (int64_t)M * N}},
        {}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.thread.aux_ptr = static_cast<const Bf16 *>(aux);
    args.epilogue.thread.dAux = StrideA{N, _1{}, (int64_t)M * N};
    return run_train<DGelu>(args, "gemm dgelu", M, K, N, stream);
}
#endif

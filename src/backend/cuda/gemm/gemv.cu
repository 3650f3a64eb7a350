/* Linear layers of a decode step (gemv.h): y[T, N] = epilogue(x[T, K] · w[N, K]ᵀ), T <= 32.
 *
 * Work split. A CTA (8 warps) owns 16 output features (16 rows of w; for SwiGLU also the 16 rows
 * F further down that hold their up projection) and all of K, cut into chunks of KC elements (128;
 * 64 for SwiGLU's two row sets): chunk c belongs to warp c % 8. grid = ceil(N / 16) CTAs: 128 for
 * a 2048-wide layer, 2000 for a 32000-word LM head. The partial sums of the 8 warps meet in shared
 * memory and are added in warp order.
 *
 * Weights through shared memory by bulk copies. Each warp has NS slots of one chunk (2; 4 where
 * the grid is at most one CTA a SM and K is long, launch_nt); its lanes each issue one row's bulk
 * copy (cp.async.bulk, completing on the slot's mbarrier), so a chunk costs one instruction a row.
 * The warp's first NS chunks are requested before griddepcontrol.wait (programmatic dependent
 * launch): the weights do not depend on the kernel ahead, so they stream in while it finishes,
 * and a 2048-wide layer's CTA has all of its 64 KB requested before the wait. Each later chunk is
 * requested as soon as its slot is read. x, the residual and y are touched only after the wait; x
 * is read through L2 (.cg): the kernel ahead has just written it. docs/gemm.md has the
 * measurements against the first version of this kernel, which loaded the weights straight into
 * registers and requested only its first chunk before the wait.
 *
 * One m16n8k16 MMA takes w as A (16 features x 16 k) and x as B (16 k x 8 tokens). The order of k
 * inside a 32-element block does not change a dot product, so a lane (g = lane / 4, q = lane % 4)
 * reads 8 consecutive elements, k = 8q .. 8q+7 of the block, of weight rows g and g + 8 (two
 * 16-byte shared loads) and of token row g (one 16-byte load), and the block becomes two MMAs: the
 * first reads elements 8q .. 8q+3 where the fragment layout asks for columns 2q, 2q+1, 2q+8,
 * 2q+9, the second 8q+4 .. 8q+7; A and B agree on that permutation, so the products are those of
 * the true k order. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/activation.cuh"
#include "backend/cuda/common.h"
#include "backend/cuda/gemm/gemv.h"
#include "backend/cuda/ptx_helpers.cuh"
extern "C" {
#include "util/error.h"
#include "util/knobs.h"
}

namespace {

enum { WARPS = 8, THREADS = 32 * WARPS, FEATS = 16, KBLOCK = 32 };
enum out_kind { OUT_DTYPE = 0, OUT_F32 = 1, OUT_SWIGLU = 2 };

struct gemv_params {
    void *y;
    const void *x, *w, *bias, *residual;
    int T, K, N; /* N outputs; SwiGLU: N = F and w holds 2F rows */
    int act;     /* OUT_DTYPE: a nopad_activation, < 0 none */
};

/* 16 bytes of activations through L2: written by the kernel just ahead */
__device__ __forceinline__ uint4 load_activations(const void *p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}


/* The warps' partial sums (acc[s][j][r]: feature g + 8·(r / 2), token 8j + 2q + r % 2) meet in
 * `partial` [WARPS][ACC][32] and are added in warp order; then the epilogue and the store. */
template <bool BF16, int NT, int OUT>
__device__ __forceinline__ void finish(const gemv_params &p, const float (&acc)[OUT == OUT_SWIGLU ? 2 : 1][NT][4],
                                       float *partial_flat) {
    constexpr int SETS = OUT == OUT_SWIGLU ? 2 : 1;
    constexpr int ACC = SETS * NT * 4;
    float(*partial)[ACC][32] = reinterpret_cast<float(*)[ACC][32]>(partial_flat);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int n0 = blockIdx.x * FEATS;
#pragma unroll
    for (int s = 0; s < SETS; s++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) partial[warp][(s * NT + j) * 4 + r][lane] = acc[s][j][r];
    __syncthreads();
    for (int e = threadIdx.x; e < NT * 4 * 32; e += THREADS) {
        const int j = e / 128, r = (e / 32) % 4, l = e % 32;
        const int f = l / 4 + 8 * (r / 2), t = 8 * j + 2 * (l % 4) + r % 2, n = n0 + f;
        if (t >= p.T || n >= p.N) continue;
        float v = 0.0f, up = 0.0f;
#pragma unroll
        for (int wi = 0; wi < WARPS; wi++) { /* warp order: the same sum on every run */
            v += partial[wi][j * 4 + r][l];
            if (SETS == 2) up += partial[wi][(NT + j) * 4 + r][l];
        }
        const size_t i = (size_t)t * p.N + n;
        if (OUT == OUT_F32) {
            static_cast<float *>(p.y)[i] = v;
        } else if (OUT == OUT_SWIGLU) {
            static_cast<uint16_t *>(p.y)[i] = from_float<BF16>(v / (1.0f + __expf(-v)) * up);
        } else {
            if (p.bias) v += to_float<BF16>(static_cast<const uint16_t *>(p.bias)[n]);
            if (p.act >= 0) v = apply_activation(v, p.act);
            if (p.residual) v += to_float<BF16>(static_cast<const uint16_t *>(p.residual)[i]);
            static_cast<uint16_t *>(p.y)[i] = from_float<BF16>(v);
        }
    }
}

/* The shared memory of a CTA: each warp's NS slots of one chunk (16 rows, both row sets for
 * SwiGLU, of KC elements of k), later the partial sums, and each warp's NS barriers: 64 KB with
 * two slots, so that three CTAs fit a SM. Rows are not padded: the 16-byte loads of rows g and
 * g + 1 (one quarter-warp) share banks, a 2-way conflict; padding them apart (64 bytes a row,
 * 82 KB a CTA, two CTAs a SM) made a LLaMA-1B step slower (1 x 512 0.78 against 0.73 ms on an
 * H200: its gate|up projection's 352 CTAs then take 1.3 waves). */
template <bool BF16, int NT, int OUT, int NS> struct smem_layout {
    static constexpr int SETS = OUT == OUT_SWIGLU ? 2 : 1;
    static constexpr int KC = 128 / SETS;
    static constexpr int ROW = KC * 2;
    static constexpr int SLOT = SETS * FEATS * ROW;
    static constexpr int ACC = SETS * NT * 4;
    static constexpr int SLOTS_BYTES = WARPS * NS * SLOT;
    static constexpr int PARTIAL_BYTES = WARPS * ACC * 32 * 4;
    static constexpr int SMEM = (SLOTS_BYTES > PARTIAL_BYTES ? SLOTS_BYTES : PARTIAL_BYTES) + WARPS * NS * 8;
};

/* CTAs a SM the compiler must leave registers for. The two-slot kernels' 64 KB of shared memory
 * let three CTAs share a SM, but SwiGLU's 24-token kernel took 98 registers a thread, room for two:
 * LLaMA-1B's gate|up projection, 352 CTAs, then ran in 1.33 waves. Held to 80 registers (no
 * spills), three fit, and its 16 layers at 17-24 tokens take 301-306 µs instead of 349-358 (H100,
 * tools/gemv_bench). The other kernels stay as they are: at 17-24 tokens, three a SM made the qkv
 * and o projections (128-160 CTAs) slower, 89 -> 119 and 86 -> 114 µs, and the LM head, which
 * spills at 80 registers, 217 -> 240. Below 17 tokens SwiGLU takes fewer than 80 anyway. */
template <int NT, int OUT, int NS> constexpr int gemv_min_ctas() { return OUT == OUT_SWIGLU && NS == 2 && NT == 3 ? 3 : 1; }

template <bool BF16, int NT, int OUT, int NS>
__global__ void __launch_bounds__(THREADS, gemv_min_ctas<NT, OUT, NS>()) gemv_kernel(const gemv_params p) {
    using S = smem_layout<BF16, NT, OUT, NS>;
    constexpr int SETS = S::SETS, KC = S::KC, ROW = S::ROW, SLOT = S::SLOT;
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char *slots = smem; /* [WARPS][NS][SLOT]; the partial sums after the last chunk */
    uint64_t *bars = reinterpret_cast<uint64_t *>(smem + (S::SLOTS_BYTES > S::PARTIAL_BYTES ? S::SLOTS_BYTES
                                                                                           : S::PARTIAL_BYTES));

    allow_dependent_launch();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const int n0 = blockIdx.x * FEATS;
    const int n_chunks = (p.K + KC - 1) / KC;
    const int my_chunks = warp < n_chunks ? (n_chunks - warp + WARPS - 1) / WARPS : 0;
    uint64_t *bar = bars + NS * warp;
    unsigned char *my_slots = slots + (size_t)warp * NS * SLOT;
    const char *w = static_cast<const char *>(p.w);
    const int n_rows = min(FEATS, p.N - n0);

    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < NS; i++) mbar_init(&bar[i], 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncwarp();
    /* chunk i of this warp into slot i % NS: one bulk copy a row, a lane each */
    auto request = [&](int i) {
        const int k0 = (warp + WARPS * i) * KC;
        const uint32_t row_bytes = (uint32_t)min(KC, p.K - k0) * 2;
        if (lane == 0) mbar_arrive_expect_tx(&bar[i % NS], row_bytes * n_rows * SETS);
        __syncwarp();
        if (lane < SETS * FEATS && lane % FEATS < n_rows) {
            const int set = lane / FEATS, r = lane % FEATS;
            bulk_copy_g2s(my_slots + (i % NS) * SLOT + (set * FEATS + r) * ROW,
                          w + (((size_t)set * p.N + n0 + r) * p.K + k0) * 2, row_bytes, &bar[i % NS]);
        }
    };
#pragma unroll
    for (int i = 0; i < NS; i++)
        if (i < my_chunks) request(i);
    wait_for_upstream_grid();

    const uint16_t *x = static_cast<const uint16_t *>(p.x);
    const uint16_t *x_row[NT];
    bool x_ok[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int t = 8 * j + g;
        x_ok[j] = t < p.T;
        x_row[j] = x + (size_t)(x_ok[j] ? t : 0) * p.K + 8 * q;
    }
    float acc[SETS][NT][4];
#pragma unroll
    for (int s = 0; s < SETS; s++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[s][j][0] = acc[s][j][1] = acc[s][j][2] = acc[s][j][3] = 0.0f;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    constexpr int BLOCKS = KC / KBLOCK;
    for (int i = 0; i < my_chunks; i++) {
        const int k0 = (warp + WARPS * i) * KC;
        uint4 xa[BLOCKS][NT];
#pragma unroll
        for (int b = 0; b < BLOCKS; b++)
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int k = k0 + b * KBLOCK + 8 * q;
                xa[b][j] = k < p.K && x_ok[j] ? load_activations(x_row[j] + k0 + b * KBLOCK) : zero;
            }
        mbar_wait(&bar[i % NS], (i / NS) & 1);
        const unsigned char *slot = my_slots + (i % NS) * SLOT;
#pragma unroll
        for (int b = 0; b < BLOCKS; b++) {
            const bool ok = k0 + b * KBLOCK + 8 * q < p.K;
#pragma unroll
            for (int s = 0; s < SETS; s++) {
                const unsigned char *a_base = slot + (s * FEATS + g) * ROW + (b * KBLOCK + 8 * q) * 2;
                const uint4 r0 = ok ? *reinterpret_cast<const uint4 *>(a_base) : zero;
                const uint4 r1 = ok ? *reinterpret_cast<const uint4 *>(a_base + 8 * ROW) : zero;
                const uint32_t a_lo[4] = {r0.x, r1.x, r0.y, r1.y}, a_hi[4] = {r0.z, r1.z, r0.w, r1.w};
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    mma16816<BF16>(acc[s][j], a_lo, xa[b][j].x, xa[b][j].y);
                    mma16816<BF16>(acc[s][j], a_hi, xa[b][j].z, xa[b][j].w);
                }
            }
        }
        __syncwarp(); /* every lane has read the slot before it is refilled */
        if (i + NS < my_chunks) request(i + NS);
    }
    __syncthreads(); /* the slots become the partial sums */
    finish<BF16, NT, OUT>(p, acc, reinterpret_cast<float *>(slots));
}

template <bool BF16, int NT, int OUT, int NS> cudaError_t launch_ns(const gemv_params &p, cudaStream_t stream) {
    constexpr int smem = smem_layout<BF16, NT, OUT, NS>::SMEM;
    /* above 48 KiB a kernel must opt in, once a device (racing first calls set the same value) */
    static int attr_set[CUDA_MAX_DEVICES];
    const int dev = cuda_current_device();
    if (dev < 0 || !cuda_cache_load(&attr_set[dev])) {
        const cudaError_t e = cudaFuncSetAttribute(gemv_kernel<BF16, NT, OUT, NS>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) return e;
        if (dev >= 0) cuda_cache_store(&attr_set[dev], 1);
    }
    return launch_maybe_pdl(gemv_kernel<BF16, NT, OUT, NS>, dim3((unsigned)((p.N + FEATS - 1) / FEATS)),
                            dim3(THREADS), smem, stream, cuda_pdl_enabled() != 0, p);
}
/* Four slots a warp where the grid is at most one CTA a SM anyway and a warp has more than two
 * chunks (LLaMA-1B's down projection, K = 5632: 128 KB requested before the wait instead of 64):
 * at 1 token its 16 layers took 134 µs instead of 157 on an H200, the decode step 1 x 512 0.65
 * instead of 0.70 ms. */
template <bool BF16, int NT, int OUT> cudaError_t launch_nt(const gemv_params &p, cudaStream_t stream) {
    constexpr int KC = smem_layout<BF16, NT, OUT, 2>::KC;
    const int ctas = (p.N + FEATS - 1) / FEATS, chunks_per_warp = (p.K + KC - 1) / KC / WARPS;
    if (ctas <= cuda_sm_count() && chunks_per_warp > 2) return launch_ns<BF16, NT, OUT, 4>(p, stream);
    return launch_ns<BF16, NT, OUT, 2>(p, stream);
}

/* NT groups of 8 tokens: the kernel for T <= 8, 16, 24 or 32 */
template <bool BF16, int OUT> cudaError_t launch_t(const gemv_params &p, cudaStream_t stream) {
    if (p.T <= 8) return launch_nt<BF16, 1, OUT>(p, stream);
    if (p.T <= 16) return launch_nt<BF16, 2, OUT>(p, stream);
    if (p.T <= 24) return launch_nt<BF16, 3, OUT>(p, stream);
    return launch_nt<BF16, 4, OUT>(p, stream);
}

nopad_status launch(const char *what, nopad_dtype dtype, int out, const gemv_params &p, void *stream) {
    if (dtype != NOPAD_DTYPE_F16 && dtype != NOPAD_DTYPE_BF16)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: dtype must be F16 or BF16", what);
    if (!p.y || !p.x || !p.w) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: NULL y, x or w", what);
    if (!cuda_gemv_supported(p.T, p.K, p.N))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: T %d K %d N %d (needs 1 <= T <= %d, K %% 8 == 0, N >= 1)",
                               what, p.T, p.K, p.N, (int)CUDA_GEMV_MAX_T);
    if (((uintptr_t)p.x | (uintptr_t)p.w) & 15u)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: x and w must be 16-byte aligned", what);
    const bool bf16 = dtype == NOPAD_DTYPE_BF16;
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    const cudaError_t err =
        out == OUT_F32      ? (bf16 ? launch_t<true, OUT_F32>(p, st) : launch_t<false, OUT_F32>(p, st))
        : out == OUT_SWIGLU ? (bf16 ? launch_t<true, OUT_SWIGLU>(p, st) : launch_t<false, OUT_SWIGLU>(p, st))
                            : (bf16 ? launch_t<true, OUT_DTYPE>(p, st) : launch_t<false, OUT_DTYPE>(p, st));
    if (err != cudaSuccess) {
        cudaGetLastError();
        return nopad_set_error(NOPAD_ERR_BACKEND, "%s: launch: %s", what, cudaGetErrorString(err));
    }
    return NOPAD_OK;
}

int32_t clamp_tokens(long v) { return (int32_t)(v < 0 ? 0 : v > CUDA_GEMV_MAX_T ? CUDA_GEMV_MAX_T : v); }

} // namespace

extern "C" int cuda_gemv_supported(int32_t n_tokens, int32_t n_in, int32_t n_out) {
    return n_tokens >= 1 && n_tokens <= CUDA_GEMV_MAX_T && n_in >= 8 && n_in % 8 == 0 && n_out >= 1 &&
           (n_out + FEATS - 1) / FEATS <= 0x7fffffff / 2;
}

extern "C" int32_t cuda_gemv_max_tokens(void) { return clamp_tokens(knob_int(KNOB_GEMV_MAX_TOKENS)); }

extern "C" void cuda_gemv_set_max_tokens(int32_t max_tokens) {
    knob_set_int(KNOB_GEMV_MAX_TOKENS, clamp_tokens(max_tokens));
}

extern "C" nopad_status cuda_gemv(nopad_dtype dtype, void *y, const void *x, const void *w, const void *bias,
                                  const void *residual, int32_t n_tokens, int32_t n_in, int32_t n_out, int act,
                                  void *stream) {
    gemv_params p = {y, x, w, bias, residual, n_tokens, n_in, n_out, act};
    return launch("gemv", dtype, OUT_DTYPE, p, stream);
}

extern "C" nopad_status cuda_gemv_f32(nopad_dtype dtype, float *y, const void *x, const void *w, int32_t n_tokens,
                                      int32_t n_in, int32_t n_out, void *stream) {
    gemv_params p = {y, x, w, NULL, NULL, n_tokens, n_in, n_out, -1};
    return launch("gemv_f32", dtype, OUT_F32, p, stream);
}

extern "C" nopad_status cuda_gemv_swiglu(nopad_dtype dtype, void *y, const void *x, const void *w,
                                         int32_t n_tokens, int32_t n_in, int32_t n_ffn, void *stream) {
    gemv_params p = {y, x, w, NULL, NULL, n_tokens, n_in, n_ffn, -1};
    return launch("gemv_swiglu", dtype, OUT_SWIGLU, p, stream);
}

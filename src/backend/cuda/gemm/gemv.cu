/* Linear layers of a decode step (gemv.h): y[T, N] = epilogue(x[T, K] · w[N, K]ᵀ), T <= 32.
 *
 * Work split. A CTA (8 warps) owns 16 output features (16 rows of w; for SwiGLU also the 16 rows
 * F further down that hold their up projection) and all of K: its warps split K into 8 ranges of
 * 32-element blocks. grid = ceil(N / 16) CTAs: 128 for a 2048-wide layer, 2000 for a 32000-word LM
 * head. The partial sums of the 8 warps meet in shared memory and are added in warp order.
 *
 * No shared memory for the operands. One m16n8k16 MMA takes w as A (16 features x 16 k) and x as
 * B (16 k x 8 tokens). The order of k inside a block does not change a dot product, so a lane
 * (g = lane / 4, q = lane % 4) loads 8 consecutive elements, k = 8q .. 8q+7 of a 32-element
 * block, of weight rows g and g + 8 (two 16-byte loads) and of token row g (one 16-byte load), and
 * the block becomes two MMAs: the first reads elements 8q .. 8q+3 where the fragment layout asks
 * for columns 2q, 2q+1, 2q+8, 2q+9, the second 8q+4 .. 8q+7; A and B agree on that permutation,
 * so the products are those of the true k order. Every weight byte is loaded once, by one lane,
 * with a 16-byte load that bypasses L1 (it is never read again in the step), straight into the
 * registers the MMA reads.
 *
 * Latency. Each warp keeps two chunks of 4 blocks (2 with SwiGLU's two row sets) in flight: the
 * next chunk's weights are requested before the current chunk's MMAs, 8 KB a warp, 64 KB a CTA.
 * The first chunk is requested before griddepcontrol.wait (programmatic dependent launch): the
 * weights do not depend on the kernel ahead, so a layer's weights stream in while the norm before
 * it finishes; x, the residual and y are touched only after the wait. x is read through L2 (.cg):
 * the kernel ahead has just written it. */
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

/* 16 bytes of weights: read once, never again in the step (no L1 allocation); volatile keeps them
 * ahead of griddepcontrol.wait */
__device__ __forceinline__ uint4 load_weights(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
/* 16 bytes of activations through L2: written by the kernel just ahead */
__device__ __forceinline__ uint4 load_activations(const void *p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

template <bool BF16> __device__ __forceinline__ float to_float(uint16_t bits) {
    if (BF16) return __uint_as_float((uint32_t)bits << 16);
    return __half2float(__ushort_as_half(bits));
}
template <bool BF16> __device__ __forceinline__ uint16_t from_float(float v) {
    if (BF16) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
    return __half_as_ushort(__float2half_rn(v));
}

template <bool BF16, int NT, int OUT>
__global__ void __launch_bounds__(THREADS) gemv_kernel(const gemv_params p) {
    constexpr int SETS = OUT == OUT_SWIGLU ? 2 : 1; /* row sets: gate (and up) */
    constexpr int UNROLL = 4 / SETS;                /* 32-element blocks per chunk */
    constexpr int ACC = SETS * NT * 4;              /* accumulators a lane holds */
    __shared__ float partial[WARPS][ACC][32];

    allow_dependent_launch();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const int n0 = blockIdx.x * FEATS;
    const int n_blocks = (p.K + KBLOCK - 1) / KBLOCK;
    const int kb_begin = warp * n_blocks / WARPS, kb_end = (warp + 1) * n_blocks / WARPS;

    const uint16_t *w = static_cast<const uint16_t *>(p.w), *x = static_cast<const uint16_t *>(p.x);
    const uint16_t *w_row[SETS][2];
    bool w_ok[SETS][2];
#pragma unroll
    for (int s = 0; s < SETS; s++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int n = n0 + g + 8 * h;
            w_ok[s][h] = n < p.N;
            w_row[s][h] = w + ((size_t)s * p.N + (w_ok[s][h] ? n : 0)) * p.K + 8 * q;
        }
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
    uint4 wa[UNROLL][SETS][2], wb[UNROLL][SETS][2];
    /* the lane's 8 elements of block kb lie inside K (K % 8 == 0) */
#define BLOCK_OK(kb) ((kb) < kb_end && (kb) * KBLOCK + 8 * q < p.K)
#define LOAD_W(dst, kb0)                                                                           \
    _Pragma("unroll") for (int u = 0; u < UNROLL; u++) {                                           \
        const int kb = (kb0) + u;                                                                  \
        _Pragma("unroll") for (int s = 0; s < SETS; s++) _Pragma("unroll") for (int h = 0; h < 2; h++) \
            dst[u][s][h] = BLOCK_OK(kb) && w_ok[s][h] ? load_weights(w_row[s][h] + (size_t)kb * KBLOCK) : zero; \
    }
    LOAD_W(wa, kb_begin);
    wait_for_upstream_grid();
    for (int kb0 = kb_begin; kb0 < kb_end; kb0 += UNROLL) {
        uint4 xa[UNROLL][NT];
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
#pragma unroll
            for (int j = 0; j < NT; j++)
                xa[u][j] = BLOCK_OK(kb0 + u) && x_ok[j] ? load_activations(x_row[j] + (size_t)(kb0 + u) * KBLOCK) : zero;
        const bool more = kb0 + UNROLL < kb_end;
        if (more) LOAD_W(wb, kb0 + UNROLL);
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
#pragma unroll
            for (int s = 0; s < SETS; s++) {
                const uint4 r0 = wa[u][s][0], r1 = wa[u][s][1];
                const uint32_t a_lo[4] = {r0.x, r1.x, r0.y, r1.y}, a_hi[4] = {r0.z, r1.z, r0.w, r1.w};
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    mma16816<BF16>(acc[s][j], a_lo, xa[u][j].x, xa[u][j].y);
                    mma16816<BF16>(acc[s][j], a_hi, xa[u][j].z, xa[u][j].w);
                }
            }
        if (more) {
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
#pragma unroll
                for (int s = 0; s < SETS; s++) wa[u][s][0] = wb[u][s][0], wa[u][s][1] = wb[u][s][1];
        }
    }
#undef LOAD_W
#undef BLOCK_OK

    /* acc[s][j][r]: feature g + 8·(r / 2), token 8j + 2q + r % 2 */
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

template <bool BF16, int OUT> void (*pick(int T))(gemv_params) {
    if (T <= 8) return gemv_kernel<BF16, 1, OUT>;
    if (T <= 16) return gemv_kernel<BF16, 2, OUT>;
    return gemv_kernel<BF16, 4, OUT>;
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
    void (*kernel)(gemv_params) =
        out == OUT_F32      ? (bf16 ? pick<true, OUT_F32>(p.T) : pick<false, OUT_F32>(p.T))
        : out == OUT_SWIGLU ? (bf16 ? pick<true, OUT_SWIGLU>(p.T) : pick<false, OUT_SWIGLU>(p.T))
                            : (bf16 ? pick<true, OUT_DTYPE>(p.T) : pick<false, OUT_DTYPE>(p.T));
    const cudaError_t err = launch_maybe_pdl(kernel, dim3((unsigned)((p.N + FEATS - 1) / FEATS)), dim3(THREADS), 0,
                                             static_cast<cudaStream_t>(stream), cuda_pdl_enabled() != 0, p);
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

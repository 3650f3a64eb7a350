/* FP8 E4M3 kernels (fp8.h): the decode GEMV, the activations' quantizer and the GEMM's epilogue. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "backend/cuda/activation.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/quant/fp8.h"
#include "backend/cuda/quant/mma_rows.cuh"

namespace {

constexpr float E4M3_MAX = 448.0f;

/* ---- the GEMV ---------------------------------------------------------------------------------- */

/* Tensor cores, as qgemv.cuh: a block of 8 warps takes 16 weight rows and every token (tiles of 8,
 * NT of them); warp w sums the k-blocks of 64 values w, w + 8, ... with m16n8k16 MMAs (fp32
 * accumulation), and the warps' sums meet in shared memory. A lane (g = lane / 4, l4 = lane % 4)
 * loads 16 bytes of rows g and g + 8 at k-block offset 16·l4 (one 16-byte load each), and 16
 * activations of token g of each tile at the same offset: the MMA's k order is permuted, the same
 * way for both operands (logical k 2·l4 + {0, 1} and 2·l4 + 8 + {0, 1} of MMA j are the lane's
 * bytes 4j + {0, 1} and 4j + {2, 3}), which a sum over k does not see. The E4M3 pairs become fp16
 * pairs with one cvt each (exact: E4M3 ⊂ fp16, and ⊂ bf16 for the bf16 MMA); the activations are
 * used as they are. Each weight byte is read once, each activation once per 16 rows. */
constexpr int GEMV_WARPS = 8, GEMV_THREADS = GEMV_WARPS * 32, GEMV_ROWS = 16, KBLOCK = 64, PREFETCH = 4;

struct gemv_params {
    void *y;
    const void *x, *w, *bias, *residual;
    const float *scales;
    int T, K, N;
    int act;
    int out_f32;
};

/* Two E4M3 codes (the low byte first) as an MMA register of two fp16 (or bf16) values. */
template <bool BF16> __device__ __forceinline__ uint32_t e4m3x2_reg(uint32_t pair) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(pair & 0xffffu), __NV_E4M3);
    if (!BF16) return (uint32_t)h.x | ((uint32_t)h.y << 16);
    const float2 f = __half22float2(__half2(h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y); /* exact: E4M3 ⊂ bf16 */
    return *reinterpret_cast<const uint32_t *>(&b);
}

template <typename T, int NT>
__global__ void __launch_bounds__(GEMV_THREADS) fp8_gemv_kernel(const gemv_params p) {
    constexpr bool BF16 = sizeof(T) == 2 && !std::is_same<T, __half>::value;
    __shared__ float partial[GEMV_WARPS][NT * 4][32];
    allow_dependent_launch();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, l4 = lane % 4;
    const int n0 = blockIdx.x * GEMV_ROWS;
    /* rows past N read row N - 1 (in bounds) and are never stored */
    const uint8_t *w = static_cast<const uint8_t *>(p.w);
    const uint8_t *w_lo = w + (size_t)min(n0 + g, p.N - 1) * p.K, *w_hi = w + (size_t)min(n0 + g + 8, p.N - 1) * p.K;
    const T *x = static_cast<const T *>(p.x);
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    /* the lane's 16 bytes of k-block kb (zeros past K: K is a multiple of 16, so a lane's bytes
     * are all in or all out) */
    auto load_rows = [&](int kb, uint4 &lo, uint4 &hi) {
        const int k = kb * KBLOCK + 16 * l4;
        lo = k < p.K ? __ldg(reinterpret_cast<const uint4 *>(w_lo + k)) : zero;
        hi = k < p.K ? __ldg(reinterpret_cast<const uint4 *>(w_hi + k)) : zero;
    };
    /* the warp's k-blocks are warp, warp + 8, ...: the i-th of them is warp + 8i */
    const int n_kblocks = (p.K + KBLOCK - 1) / KBLOCK;
    const int mine = warp < n_kblocks ? (n_kblocks - warp + GEMV_WARPS - 1) / GEMV_WARPS : 0;
    /* PREFETCH k-blocks in flight a warp, in registers: the weights' first ones are requested
     * before griddepcontrol.wait (they stream in while the kernel ahead finishes), and every
     * k-block's MMAs run while the loads of the next PREFETCH - 1 are on their way */
    uint4 lo[PREFETCH], hi[PREFETCH];
#pragma unroll
    for (int u = 0; u < PREFETCH; u++)
        if (u < mine) load_rows(warp + u * GEMV_WARPS, lo[u], hi[u]);
    wait_for_upstream_grid(); /* x, the residual and y may belong to the kernel ahead */
    for (int i0 = 0; i0 < mine; i0 += PREFETCH) {
#pragma unroll
        for (int u = 0; u < PREFETCH; u++) {
            const int i = i0 + u;
            if (i >= mine) break;
            const uint4 wlo = lo[u], whi = hi[u];
            if (i + PREFETCH < mine) load_rows(warp + (i + PREFETCH) * GEMV_WARPS, lo[u], hi[u]);
            const int k = (warp + i * GEMV_WARPS) * KBLOCK + 16 * l4;
            const uint32_t wl[4] = {wlo.x, wlo.y, wlo.z, wlo.w}, wh[4] = {whi.x, whi.y, whi.z, whi.w};
            uint32_t a[4][4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                a[j][0] = e4m3x2_reg<BF16>(wl[j]);
                a[j][1] = e4m3x2_reg<BF16>(wh[j]);
                a[j][2] = e4m3x2_reg<BF16>(wl[j] >> 16);
                a[j][3] = e4m3x2_reg<BF16>(wh[j] >> 16);
            }
#pragma unroll
            for (int tile = 0; tile < NT; tile++) {
                const int t = 8 * tile + g;
                uint4 x0 = zero, x1 = zero;
                if (t < p.T && k < p.K) {
                    const uint4 *xr = reinterpret_cast<const uint4 *>(x + (size_t)t * p.K + k);
                    x0 = xr[0];
                    x1 = xr[1];
                }
                const uint32_t b[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                for (int j = 0; j < 4; j++) mma16816<BF16>(acc[tile], a[j], b[2 * j], b[2 * j + 1]);
            }
        }
    }
    mma_rows_reduce_store<BF16, GEMV_WARPS, NT>(partial, acc, n0, p.T, p.N, p.scales, p.y, p.bias, p.residual, p.act,
                                                p.out_f32);
}

template <typename T>
cudaError_t gemv_launch(const gemv_params &p, cudaStream_t s) {
    const dim3 grid((unsigned)((p.N + GEMV_ROWS - 1) / GEMV_ROWS)), block(GEMV_THREADS);
    /* tiles of 8 tokens: 1 for a decode step of up to 8 sequences, up to 4 */
    /* with programmatic dependent launch, as the other GEMVs of a decode step (cuda_pdl_enabled) */
    const bool pdl = cuda_pdl_enabled() != 0;
    if (p.T <= 8) return launch_maybe_pdl(fp8_gemv_kernel<T, 1>, grid, block, 0, s, pdl, p);
    if (p.T <= 16) return launch_maybe_pdl(fp8_gemv_kernel<T, 2>, grid, block, 0, s, pdl, p);
    if (p.T <= 24) return launch_maybe_pdl(fp8_gemv_kernel<T, 3>, grid, block, 0, s, pdl, p);
    return launch_maybe_pdl(fp8_gemv_kernel<T, 4>, grid, block, 0, s, pdl, p);
}

/* ---- the activations' quantizer ------------------------------------------------------------- */

constexpr int QUANT_THREADS = 256;

/* Block t: row t's max |x| (a block reduction), its scale, then its codes. The division is IEEE
 * (__fdiv_rn, whatever the compile flags) and the conversion nearest-even and saturating, as
 * io/fp8.c computes them on the host. */
template <typename T>
__global__ void __launch_bounds__(QUANT_THREADS) quantize_tokens_kernel(uint8_t *xq, float *xs, const T *x, int K) {
    __shared__ float warp_max[QUANT_THREADS / 32];
    const T *row = x + (size_t)blockIdx.x * K;
    uint8_t *q = xq + (size_t)blockIdx.x * K;
    float amax = 0.0f;
    for (int k = threadIdx.x; k < K; k += QUANT_THREADS) amax = fmaxf(amax, fabsf(to_f32(row[k])));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
    __syncthreads();
    amax = warp_max[0];
#pragma unroll
    for (int i = 1; i < QUANT_THREADS / 32; i++) amax = fmaxf(amax, warp_max[i]);
    float scale = __fdiv_rn(amax, E4M3_MAX);
    if (!(scale > 0.0f) || !isfinite(scale)) scale = 1.0f; /* io/fp8.h's fp8_e4m3_scale */
    if (threadIdx.x == 0) xs[blockIdx.x] = scale;
    for (int k = threadIdx.x; k < K; k += QUANT_THREADS)
        q[k] = (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(to_f32(row[k]), scale), __NV_SATFINITE, __NV_E4M3);
}

/* ---- the GEMM's epilogue -------------------------------------------------------------------- */

template <typename T>
__global__ void epilogue_kernel(T *out, const T *acc, const T *bias, int act, const T *residual, int T_rows, int N) {
    const size_t total = (size_t)T_rows * N;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        float v = to_f32(acc[i]);
        if (bias) v += to_f32(bias[i % (size_t)N]);
        if (act >= 0) v = apply_activation(v, act);
        if (residual) v += to_f32(residual[i]);
        out[i] = from_f32<T>(v);
    }
}

nopad_status check_dtype(const char *what, nopad_dtype dtype) {
    if (dtype != NOPAD_DTYPE_F16 && dtype != NOPAD_DTYPE_BF16)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: dtype %d is not F16 or BF16", what, (int)dtype);
    return NOPAD_OK;
}

nopad_status launched(const char *what, cudaError_t err) {
    if (err == cudaSuccess) return NOPAD_OK;
    cudaGetLastError();
    return nopad_set_error(NOPAD_ERR_BACKEND, "%s: launch: %s", what, cudaGetErrorString(err));
}

} // namespace

extern "C" int cuda_fp8_runs(int32_t n_in) { return n_in > 0 && n_in % 16 == 0; }

extern "C" nopad_status cuda_fp8_gemv(nopad_dtype dtype, void *y, const void *x, const void *w, const void *bias,
                                      const void *residual, int32_t n_tokens, int32_t n_in, int32_t n_out, int act,
                                      int out_f32, void *stream) {
    nopad_status st = check_dtype("fp8 gemv", dtype);
    if (st != NOPAD_OK) return st;
    if (!cuda_fp8_runs(n_in))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "fp8 gemv: rows of %d values (needs a positive multiple of 16)",
                               n_in);
    if (n_tokens < 1 || n_tokens > CUDA_FP8_GEMV_MAX_T || n_out < 1)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "fp8 gemv: T %d N %d (needs 1 <= T <= %d, N >= 1)", n_tokens,
                               n_out, (int)CUDA_FP8_GEMV_MAX_T);
    if (!y || !x || !w) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "fp8 gemv: NULL y, x or w");
    if (((uintptr_t)x & 15u) || ((uintptr_t)w & 15u))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "fp8 gemv: x and w must be 16-byte aligned");
    if (out_f32 && (bias || residual || act >= 0))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "fp8 gemv: a float32 output takes no epilogue");
    const gemv_params p = {y, x, w, bias, residual,
                           reinterpret_cast<const float *>(static_cast<const char *>(w) +
                                                           nopad_fp8_scales_offset(n_out, n_in)),
                           n_tokens, n_in, n_out, act, out_f32};
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    return launched("fp8 gemv", dtype == NOPAD_DTYPE_BF16 ? gemv_launch<__nv_bfloat16>(p, s) : gemv_launch<__half>(p, s));
}

extern "C" nopad_status cuda_fp8_quantize_tokens(nopad_dtype dtype, uint8_t *xq, float *xs, const void *x,
                                                 int32_t n_tokens, int32_t n_in, void *stream) {
    nopad_status st = check_dtype("fp8 quantize", dtype);
    if (st != NOPAD_OK || n_tokens == 0) return st;
    if (n_tokens < 0 || n_in < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "fp8 quantize: T %d K %d", n_tokens, n_in);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (dtype == NOPAD_DTYPE_BF16)
        quantize_tokens_kernel<__nv_bfloat16>
            <<<n_tokens, QUANT_THREADS, 0, s>>>(xq, xs, static_cast<const __nv_bfloat16 *>(x), n_in);
    else
        quantize_tokens_kernel<__half><<<n_tokens, QUANT_THREADS, 0, s>>>(xq, xs, static_cast<const __half *>(x), n_in);
    return launched("fp8 quantize", cudaGetLastError());
}

extern "C" nopad_status cuda_fp8_epilogue(nopad_dtype dtype, void *out, const void *acc, const void *bias, int act,
                                          const void *residual, int32_t n_tokens, int32_t n_out, void *stream) {
    nopad_status st = check_dtype("fp8 epilogue", dtype);
    if (st != NOPAD_OK || n_tokens == 0) return st;
    const size_t total = (size_t)n_tokens * (size_t)n_out;
    const unsigned blocks = (unsigned)(total / 256 + 1 < 65536 ? total / 256 + 1 : 65536);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (dtype == NOPAD_DTYPE_BF16)
        epilogue_kernel<__nv_bfloat16><<<blocks, 256, 0, s>>>(
            static_cast<__nv_bfloat16 *>(out), static_cast<const __nv_bfloat16 *>(acc),
            static_cast<const __nv_bfloat16 *>(bias), act, static_cast<const __nv_bfloat16 *>(residual), n_tokens,
            n_out);
    else
        epilogue_kernel<__half><<<blocks, 256, 0, s>>>(static_cast<__half *>(out), static_cast<const __half *>(acc),
                                                       static_cast<const __half *>(bias), act,
                                                       static_cast<const __half *>(residual), n_tokens, n_out);
    return launched("fp8 epilogue", cudaGetLastError());
}

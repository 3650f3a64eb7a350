/* FP8 E4M3 kernels (fp8.h): the decode GEMV, the activations' quantizer and the GEMM's epilogue. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/activation.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/quant/fp8.h"

namespace {

constexpr float E4M3_MAX = 448.0f;

/* ---- the GEMV -------------------------------------------------------------------------------- */

constexpr int GEMV_WARPS = 8; /* a block: 8 warps, one weight row each */
constexpr int GEMV_CHUNK = 16; /* bytes of a row a lane loads at once */

struct gemv_params {
    void *y;
    const void *x, *w, *bias, *residual;
    const float *scales;
    int T, K, N;
    int act;
    int out_f32;
};

/* 16 E4M3 codes to floats: 8 cvt.rn.f16x2.e4m3x2, exact (E4M3 ⊂ fp16), then fp16 -> fp32, exact. */
__device__ __forceinline__ void e4m3x16_to_f32(const uint4 raw, float *out) {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const __nv_fp8x2_storage_t pair = (__nv_fp8x2_storage_t)((words[i] >> (16 * h)) & 0xffffu);
            const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
            const float2 f = __half22float2(__half2(r));
            out[4 * i + 2 * h] = f.x;
            out[4 * i + 2 * h + 1] = f.y;
        }
    }
}

/* Warp w of the block: row n = blockIdx.x · 8 + w; lane l sums the 16-value chunks l, l + 32, ...
 * of the row for each of the NT (>= T) tokens, the warp adds the lanes' sums, lane 0 applies the
 * scale and the epilogue. */
template <typename T, int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32) fp8_gemv_kernel(const gemv_params p) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int n = blockIdx.x * GEMV_WARPS + warp;
    if (n >= p.N) return; /* a whole warp leaves: the shuffles below stay full-warp */
    const uint8_t *row = static_cast<const uint8_t *>(p.w) + (size_t)n * p.K;
    const T *x = static_cast<const T *>(p.x);
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    /* the next chunk's codes are loaded before this one's products: one load in flight a lane
     * while it computes */
    const int first = lane * GEMV_CHUNK, stride = 32 * GEMV_CHUNK;
    uint4 next = first < p.K ? __ldg(reinterpret_cast<const uint4 *>(row + first)) : make_uint4(0, 0, 0, 0);
    for (int k = first; k < p.K; k += stride) {
        const uint4 codes = next;
        if (k + stride < p.K) next = __ldg(reinterpret_cast<const uint4 *>(row + k + stride));
        float wf[16];
        e4m3x16_to_f32(codes, wf);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < p.T) {
                float xf[16];
                load_vec<T, 8>(xf, x + (size_t)t * p.K + k);
                load_vec<T, 8>(xf + 8, x + (size_t)t * p.K + k + 8);
                float s = acc[t];
#pragma unroll
                for (int j = 0; j < 16; j++) s = fmaf(wf[j], xf[j], s);
                acc[t] = s;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], off);
    if (lane != 0) return;
    const float scale = p.scales[n];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= p.T) break;
        float v = acc[t] * scale;
        const size_t i = (size_t)t * p.N + n;
        if (p.out_f32) {
            static_cast<float *>(p.y)[i] = v;
            continue;
        }
        if (p.bias) v += to_f32(static_cast<const T *>(p.bias)[n]);
        if (p.act >= 0) v = apply_activation(v, p.act);
        if (p.residual) v += to_f32(static_cast<const T *>(p.residual)[i]);
        static_cast<T *>(p.y)[i] = from_f32<T>(v);
    }
}

template <typename T>
cudaError_t gemv_launch(const gemv_params &p, cudaStream_t s) {
    const dim3 grid((unsigned)((p.N + GEMV_WARPS - 1) / GEMV_WARPS)), block(GEMV_WARPS * 32);
    /* the token count rounded up to a power of two: the accumulators stay in registers */
    if (p.T <= 1) fp8_gemv_kernel<T, 1><<<grid, block, 0, s>>>(p);
    else if (p.T <= 2) fp8_gemv_kernel<T, 2><<<grid, block, 0, s>>>(p);
    else if (p.T <= 4) fp8_gemv_kernel<T, 4><<<grid, block, 0, s>>>(p);
    else if (p.T <= 8) fp8_gemv_kernel<T, 8><<<grid, block, 0, s>>>(p);
    else if (p.T <= 16) fp8_gemv_kernel<T, 16><<<grid, block, 0, s>>>(p);
    else fp8_gemv_kernel<T, 32><<<grid, block, 0, s>>>(p);
    return cudaGetLastError();
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
__global__ void epilogue_kernel(void *out, const void *acc, int acc_f32, size_t ld_acc, const float *row_scales,
                                const float *token_scales, const T *bias, int act, const T *residual, int T_rows,
                                int N, int out_f32) {
    const size_t total = (size_t)T_rows * N;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / (size_t)N, n = i % (size_t)N, a = t * ld_acc + n;
        float v = acc_f32 ? static_cast<const float *>(acc)[a] : to_f32(static_cast<const T *>(acc)[a]);
        if (row_scales) v *= row_scales[n];
        if (token_scales) v *= token_scales[t];
        if (out_f32) {
            static_cast<float *>(out)[i] = v;
            continue;
        }
        if (bias) v += to_f32(bias[n]);
        if (act >= 0) v = apply_activation(v, act);
        if (residual) v += to_f32(residual[i]);
        static_cast<T *>(out)[i] = from_f32<T>(v);
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

extern "C" nopad_status cuda_fp8_epilogue(nopad_dtype dtype, void *out, const void *acc, int acc_f32, size_t ld_acc,
                                          const float *row_scales, const float *token_scales, const void *bias,
                                          int act, const void *residual, int32_t n_tokens, int32_t n_out, int out_f32,
                                          void *stream) {
    nopad_status st = check_dtype("fp8 epilogue", dtype);
    if (st != NOPAD_OK || n_tokens == 0) return st;
    if (out_f32 && (bias || residual || act >= 0))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "fp8 epilogue: a float32 output takes no epilogue");
    const size_t total = (size_t)n_tokens * (size_t)n_out;
    const unsigned blocks = (unsigned)(total / 256 + 1 < 65536 ? total / 256 + 1 : 65536);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (dtype == NOPAD_DTYPE_BF16)
        epilogue_kernel<__nv_bfloat16><<<blocks, 256, 0, s>>>(
            out, acc, acc_f32, ld_acc, row_scales, token_scales, static_cast<const __nv_bfloat16 *>(bias), act,
            static_cast<const __nv_bfloat16 *>(residual), n_tokens, n_out, out_f32);
    else
        epilogue_kernel<__half><<<blocks, 256, 0, s>>>(out, acc, acc_f32, ld_acc, row_scales, token_scales,
                                                       static_cast<const __half *>(bias), act,
                                                       static_cast<const __half *>(residual), n_tokens, n_out,
                                                       out_f32);
    return launched("fp8 epilogue", cudaGetLastError());
}

/* The quantized GEMV (quant.h, cuda_qgemv): y[T, N] = epilogue(x[T, K] · w[N, K]ᵀ) with w in a
 * block format, T <= 32. Compiled once per dtype (qgemv_f16.cu, qgemv_bf16.cu).
 *
 * Work split, as the fp16 gemv's (gemm/gemv.cu): a CTA of 8 warps owns 16 output rows and all of
 * K, cut into chunks of 32 values; chunk c belongs to warp c % 8; grid = ceil(N / 16). The warps'
 * partial sums meet in shared memory and are added in warp order (the same bits on every run).
 *
 * One chunk, 16 rows × 32 values, is two m16n8k16 MMAs per 8 tokens. Lane (g = lane / 4,
 * l4 = lane % 4) reads the integers of values 4·l4 .. 4·l4 + 3 (the first MMA) and 16 + 4·l4 ..
 * 16 + 4·l4 + 3 (the second) of rows g and g + 8 (quant.cuh, q_read_chunk), and the activations of
 * token g at the same values (two 8-byte loads). The fragment wants columns 2·l4, 2·l4 + 1,
 * 2·l4 + 8, 2·l4 + 9 of each 16; A and B both put value 4·l4 + i there, so the sum is over the
 * same products. The MMAs' fp32 sums Σ q·x are exact up to fp32 accumulation (each product of a
 * small integer and a 16-bit x is exact), then scaled by the row's chunk scale in fp32; the
 * formats with a min add min · Σ x, Σ x from the same MMA with A all ones. Q6_K's two scales per
 * chunk (one per 16 values) scale the two MMAs apart. */
#ifndef NOPAD_BACKEND_CUDA_QUANT_QGEMV_CUH
#define NOPAD_BACKEND_CUDA_QUANT_QGEMV_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/activation.cuh"
#include "backend/cuda/common.h"
#include "backend/cuda/ptx_helpers.cuh"
#include "backend/cuda/quant/quant.cuh"

namespace qgemv {

enum { WARPS = 8, THREADS = 32 * WARPS, FEATS = 16, CHUNK = 32 };

struct params {
    void *y;
    const void *x, *w, *bias, *residual;
    int T, K, N;
    int act;     /* a nopad_activation, < 0 none */
    int out_f32; /* y float32, no epilogue */
    size_t row_bytes;
};

template <bool BF16> __device__ __forceinline__ float to_float(uint16_t bits) {
    if (BF16) return __uint_as_float((uint32_t)bits << 16);
    return __half2float(__ushort_as_half(bits));
}
template <bool BF16> __device__ __forceinline__ uint16_t from_float(float v) {
    if (BF16) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
    return __half_as_ushort(__float2half_rn(v));
}
/* two small integers (exact in either dtype) as one fragment register, a in the low half */
template <bool BF16> __device__ __forceinline__ uint32_t pack2(int a, int b) {
    if (BF16) {
        const __nv_bfloat162 h = __floats2bfloat162_rn((float)a, (float)b);
        return *reinterpret_cast<const uint32_t *>(&h);
    }
    const __half2 h = __floats2half2_rn((float)a, (float)b);
    return *reinterpret_cast<const uint32_t *>(&h);
}
template <bool BF16> __device__ __forceinline__ uint32_t ones2() { return BF16 ? 0x3f803f80u : 0x3c003c00u; }

template <bool BF16, int FMT, int NT>
__global__ void __launch_bounds__(THREADS, 1) qgemv_kernel(const params p) {
    __shared__ float partial[WARPS][NT * 4][32];
    allow_dependent_launch();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, l4 = lane % 4;
    const int n0 = blockIdx.x * FEATS;
    /* rows past N read row N - 1 (in bounds) and are never stored */
    const int r_lo = min(n0 + g, p.N - 1), r_hi = min(n0 + g + 8, p.N - 1);
    const uint8_t *w = static_cast<const uint8_t *>(p.w);
    const uint8_t *w_lo = w + (size_t)r_lo * p.row_bytes, *w_hi = w + (size_t)r_hi * p.row_bytes;
    const uint16_t *x = static_cast<const uint16_t *>(p.x);
    const uint16_t *x_row[NT];
    bool x_ok[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int t = 8 * j + g;
        x_ok[j] = t < p.T;
        x_row[j] = x + (size_t)(x_ok[j] ? t : 0) * p.K + 4 * l4;
    }
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const int n_chunks = p.K / CHUNK;
    const uint2 zero = make_uint2(0, 0);
    /* the warp's first chunk of weights is read before the kernel ahead has finished (they do not
     * depend on it), each next one while the current one is multiplied: two chunks in flight */
    q_lane a = {}, b = {};
    if (warp < n_chunks) {
        a = q_read_chunk<FMT>(w_lo, warp, l4);
        b = q_read_chunk<FMT>(w_hi, warp, l4);
    }
    wait_for_upstream_grid(); /* x and the residual may come from it */
    for (int c = warp; c < n_chunks; c += WARPS) {
        q_lane next_a = a, next_b = b;
        if (c + WARPS < n_chunks) {
            next_a = q_read_chunk<FMT>(w_lo, c + WARPS, l4);
            next_b = q_read_chunk<FMT>(w_hi, c + WARPS, l4);
        }
        /* A: row g in registers 0 and 2, row g + 8 in 1 and 3 (m16n8k16's fragment order) */
        const uint32_t a_lo[4] = {pack2<BF16>(a.v[0], a.v[1]), pack2<BF16>(b.v[0], b.v[1]),
                                  pack2<BF16>(a.v[2], a.v[3]), pack2<BF16>(b.v[2], b.v[3])};
        const uint32_t a_hi[4] = {pack2<BF16>(a.v[4], a.v[5]), pack2<BF16>(b.v[4], b.v[5]),
                                  pack2<BF16>(a.v[6], a.v[7]), pack2<BF16>(b.v[6], b.v[7])};
        const uint32_t ones[4] = {ones2<BF16>(), ones2<BF16>(), ones2<BF16>(), ones2<BF16>()};
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const uint2 xl = x_ok[j] ? *reinterpret_cast<const uint2 *>(x_row[j] + c * CHUNK) : zero;
            const uint2 xh = x_ok[j] ? *reinterpret_cast<const uint2 *>(x_row[j] + c * CHUNK + 16) : zero;
            float lo[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            mma16816<BF16>(lo, a_lo, xl.x, xl.y);
            if (FMT == NOPAD_WEIGHT_Q6_K) {
                float hi[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mma16816<BF16>(hi, a_hi, xh.x, xh.y);
                acc[j][0] += a.scale * lo[0] + a.scale_hi * hi[0];
                acc[j][1] += a.scale * lo[1] + a.scale_hi * hi[1];
                acc[j][2] += b.scale * lo[2] + b.scale_hi * hi[2];
                acc[j][3] += b.scale * lo[3] + b.scale_hi * hi[3];
            } else {
                mma16816<BF16>(lo, a_hi, xh.x, xh.y);
                acc[j][0] += a.scale * lo[0];
                acc[j][1] += a.scale * lo[1];
                acc[j][2] += b.scale * lo[2];
                acc[j][3] += b.scale * lo[3];
            }
            if (qformat_has_min<FMT>()) {
                float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* Σ x of tokens 2·l4, 2·l4 + 1, twice */
                mma16816<BF16>(sum, ones, xl.x, xl.y);
                mma16816<BF16>(sum, ones, xh.x, xh.y);
                acc[j][0] += a.min * sum[0];
                acc[j][1] += a.min * sum[1];
                acc[j][2] += b.min * sum[2];
                acc[j][3] += b.min * sum[3];
            }
        }
        a = next_a;
        b = next_b;
    }
    /* acc[j][r]: row g + 8·(r / 2), token 8j + 2·l4 + r % 2 */
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int r = 0; r < 4; r++) partial[warp][j * 4 + r][lane] = acc[j][r];
    __syncthreads();
    for (int e = threadIdx.x; e < NT * 4 * 32; e += THREADS) {
        const int j = e / 128, r = (e / 32) % 4, l = e % 32;
        const int t = 8 * j + 2 * (l % 4) + r % 2, n = n0 + l / 4 + 8 * (r / 2);
        if (t >= p.T || n >= p.N) continue;
        float v = 0.0f;
#pragma unroll
        for (int wi = 0; wi < WARPS; wi++) v += partial[wi][j * 4 + r][l]; /* warp order */
        const size_t i = (size_t)t * p.N + n;
        if (p.out_f32) {
            static_cast<float *>(p.y)[i] = v;
            continue;
        }
        if (p.bias) v += to_float<BF16>(static_cast<const uint16_t *>(p.bias)[n]);
        if (p.act >= 0) v = apply_activation(v, p.act);
        if (p.residual) v += to_float<BF16>(static_cast<const uint16_t *>(p.residual)[i]);
        static_cast<uint16_t *>(p.y)[i] = from_float<BF16>(v);
    }
}

/* With programmatic dependent launch (cuda_pdl_enabled) as the fp16 gemv: the weights of the first
 * chunks stream in while the kernel ahead finishes. */
template <bool BF16, int FMT> cudaError_t launch_format(const params &p, cudaStream_t stream) {
    const dim3 grid((unsigned)((p.N + FEATS - 1) / FEATS)), block(THREADS);
    const bool pdl = cuda_pdl_enabled() != 0;
    if (p.T <= 8) return launch_maybe_pdl(qgemv_kernel<BF16, FMT, 1>, grid, block, 0, stream, pdl, p);
    if (p.T <= 16) return launch_maybe_pdl(qgemv_kernel<BF16, FMT, 2>, grid, block, 0, stream, pdl, p);
    if (p.T <= 24) return launch_maybe_pdl(qgemv_kernel<BF16, FMT, 3>, grid, block, 0, stream, pdl, p);
    return launch_maybe_pdl(qgemv_kernel<BF16, FMT, 4>, grid, block, 0, stream, pdl, p);
}

/* The kernel for p's format (checked by the caller: one of the eight). */
template <bool BF16> cudaError_t launch(int format, const params &p, cudaStream_t stream) {
    switch (format) {
    case NOPAD_WEIGHT_Q4_0: return launch_format<BF16, NOPAD_WEIGHT_Q4_0>(p, stream);
    case NOPAD_WEIGHT_Q4_1: return launch_format<BF16, NOPAD_WEIGHT_Q4_1>(p, stream);
    case NOPAD_WEIGHT_Q5_0: return launch_format<BF16, NOPAD_WEIGHT_Q5_0>(p, stream);
    case NOPAD_WEIGHT_Q5_1: return launch_format<BF16, NOPAD_WEIGHT_Q5_1>(p, stream);
    case NOPAD_WEIGHT_Q8_0: return launch_format<BF16, NOPAD_WEIGHT_Q8_0>(p, stream);
    case NOPAD_WEIGHT_Q4_K: return launch_format<BF16, NOPAD_WEIGHT_Q4_K>(p, stream);
    case NOPAD_WEIGHT_Q5_K: return launch_format<BF16, NOPAD_WEIGHT_Q5_K>(p, stream);
    default: return launch_format<BF16, NOPAD_WEIGHT_Q6_K>(p, stream);
    }
}

} // namespace qgemv

/* qgemv_f16.cu / qgemv_bf16.cu */
cudaError_t qgemv_launch_f16(int format, const qgemv::params &p, cudaStream_t stream);
cudaError_t qgemv_launch_bf16(int format, const qgemv::params &p, cudaStream_t stream);

#endif

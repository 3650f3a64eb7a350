/* quant.h's entries: the formats' sizes, the quantized GEMV's checks and dispatch (kernels in
 * qgemv.cuh), and the two dequantising kernels: a weight to the compute dtype for the prompts'
 * GEMM, and the embedding gather.
 *
 * Both dequantising kernels give each thread a quarter of a chunk of 32 (quant.cuh's q_lane: 8
 * values, two runs of 4), computed as scale·q + min in fp32 (the product exact, as
 * io/gguf_dequant.c's) and rounded once to the destination. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/quant/qgemv.cuh"
#include "backend/cuda/quant/quant.h"

extern "C" int32_t cuda_quant_block(nopad_weight_format format) {
    switch (format) {
    case NOPAD_WEIGHT_Q4_0:
    case NOPAD_WEIGHT_Q4_1:
    case NOPAD_WEIGHT_Q5_0:
    case NOPAD_WEIGHT_Q5_1:
    case NOPAD_WEIGHT_Q8_0: return 32;
    case NOPAD_WEIGHT_Q4_K:
    case NOPAD_WEIGHT_Q5_K:
    case NOPAD_WEIGHT_Q6_K: return 256;
    default: return 0;
    }
}

extern "C" int cuda_quant_runs(nopad_weight_format format, int32_t n_in) {
    const int32_t block = cuda_quant_block(format);
    return block > 0 && n_in > 0 && n_in % block == 0;
}

static int block_bytes(nopad_weight_format format) {
    switch (format) {
    case NOPAD_WEIGHT_Q4_0: return qformat<NOPAD_WEIGHT_Q4_0>::BYTES;
    case NOPAD_WEIGHT_Q4_1: return qformat<NOPAD_WEIGHT_Q4_1>::BYTES;
    case NOPAD_WEIGHT_Q5_0: return qformat<NOPAD_WEIGHT_Q5_0>::BYTES;
    case NOPAD_WEIGHT_Q5_1: return qformat<NOPAD_WEIGHT_Q5_1>::BYTES;
    case NOPAD_WEIGHT_Q8_0: return qformat<NOPAD_WEIGHT_Q8_0>::BYTES;
    case NOPAD_WEIGHT_Q4_K: return qformat<NOPAD_WEIGHT_Q4_K>::BYTES;
    case NOPAD_WEIGHT_Q5_K: return qformat<NOPAD_WEIGHT_Q5_K>::BYTES;
    case NOPAD_WEIGHT_Q6_K: return qformat<NOPAD_WEIGHT_Q6_K>::BYTES;
    default: return 0;
    }
}

extern "C" size_t cuda_quant_row_bytes(nopad_weight_format format, int32_t n_in) {
    const int32_t block = cuda_quant_block(format);
    return block ? (size_t)(n_in / block) * (size_t)block_bytes(format) : 0;
}

static nopad_status check_format(const char *what, nopad_dtype dtype, nopad_weight_format format, int32_t n_in) {
    if (dtype != NOPAD_DTYPE_F16 && dtype != NOPAD_DTYPE_BF16)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: dtype %d is not F16 or BF16", what, (int)dtype);
    if (!cuda_quant_block(format))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: weight format %d is not one the CUDA backend runs (Q4_0, Q4_1, Q5_0, Q5_1, "
                               "Q8_0, Q4_K, Q5_K, Q6_K)",
                               what, (int)format);
    if (!cuda_quant_runs(format, n_in))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s: rows of %d values are not whole blocks of %d (weight format %d)", what, n_in,
                               cuda_quant_block(format), (int)format);
    return NOPAD_OK;
}

extern "C" nopad_status cuda_qgemv(nopad_dtype dtype, void *y, const void *x, const void *w,
                                   nopad_weight_format format, const void *bias, const void *residual,
                                   int32_t n_tokens, int32_t n_in, int32_t n_out, int act, int out_f32,
                                   void *stream) {
    nopad_status st = check_format("qgemv", dtype, format, n_in);
    if (st != NOPAD_OK) return st;
    if (n_tokens < 1 || n_tokens > CUDA_QGEMV_MAX_T || n_out < 1 || (n_out + qgemv::FEATS - 1) / qgemv::FEATS > 0x7fffffff / 2)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "qgemv: T %d N %d (needs 1 <= T <= %d, N >= 1)", n_tokens,
                               n_out, (int)CUDA_QGEMV_MAX_T);
    if (!y || !x || !w) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "qgemv: NULL y, x or w");
    if (((uintptr_t)x & 7u) || ((uintptr_t)w & 1u))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "qgemv: x must be 8-byte aligned and w 2-byte aligned");
    if (out_f32 && (bias || residual || act >= 0))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "qgemv: a float32 output takes no epilogue");
    const qgemv::params p = {y, x, w, bias, residual, n_tokens, n_in, n_out, act, out_f32,
                             cuda_quant_row_bytes(format, n_in)};
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    const cudaError_t err = dtype == NOPAD_DTYPE_BF16 ? qgemv_launch_bf16((int)format, p, s)
                                                       : qgemv_launch_f16((int)format, p, s);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return nopad_set_error(NOPAD_ERR_BACKEND, "qgemv: launch: %s", cudaGetErrorString(err));
    }
    return NOPAD_OK;
}

/* ---- dequantising ------------------------------------------------------------------------------ */

/* Thread i of the row: chunk i / 4, quarter i % 4, into out[0 .. 32·chunks) of T (or float). */
template <int FMT, typename OUT>
__device__ __forceinline__ void dequant_quarter(OUT *out, const uint8_t *row, int i) {
    const int c = i / 4, l4 = i % 4;
    const q_lane q = q_read_chunk<FMT>(row, c, l4);
    OUT *lo = out + c * 32 + 4 * l4, *hi = lo + 16;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float a = q.scale * (float)q.v[k] + q.min, b = q.scale_hi * (float)q.v[4 + k] + q.min;
        if constexpr (sizeof(OUT) == 4) {
            lo[k] = a;
            hi[k] = b;
        } else {
            lo[k] = from_f32<OUT>(a);
            hi[k] = from_f32<OUT>(b);
        }
    }
}

template <int FMT, typename T>
__global__ void dequantize_kernel(T *out, const uint8_t *w, size_t row_bytes, int rows, int K) {
    const int quarters = K / 8; /* 4 a chunk of 32 */
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * quarters) return;
    const int r = (int)(i / quarters), q = (int)(i % quarters);
    dequant_quarter<FMT, T>(out + (size_t)r * K, w + (size_t)r * row_bytes, q);
}

/* One CTA a token, as decoder.cu's embed_tokens_kernel: the id from tokens, or from feed for a
 * token sampled after the step was packed; another rank's id gives 0, a bad one NaN. */
template <int FMT, typename T>
__global__ void embed_q_kernel(float *out, const int32_t *tokens, const int32_t *feed, const int32_t *positions,
                               int vocab, int vocab0, int vocab_rows, int n_positions, const uint8_t *word,
                               size_t row_bytes, const T *pos, int dim) {
    const int t = blockIdx.x;
    int id = tokens[t];
    if (id < 0 && feed) id = feed[-1 - id];
    const int p = positions ? positions[t] : 0;
    const bool bad = id < 0 || id >= vocab || (pos && (p < 0 || p >= n_positions));
    const bool held = id >= vocab0 && id - vocab0 < vocab_rows;
    float *row = out + (size_t)t * dim;
    if (bad || !held) {
        for (int i = threadIdx.x; i < dim; i += blockDim.x)
            row[i] = bad ? NAN : pos ? to_f32(pos[(size_t)p * dim + i]) : 0.0f;
        return;
    }
    const uint8_t *wr = word + (size_t)(id - vocab0) * row_bytes;
    for (int i = threadIdx.x; i < dim / 8; i += blockDim.x) dequant_quarter<FMT, float>(row, wr, i);
    if (!pos) return;
    __syncthreads(); /* the position row is added by other threads than wrote each value */
    for (int i = threadIdx.x; i < dim; i += blockDim.x) row[i] += to_f32(pos[(size_t)p * dim + i]);
}

#define QUANT_FORMAT_SWITCH(format, F, CALL)                                                                 \
    switch (format) {                                                                                       \
    case NOPAD_WEIGHT_Q4_0: { constexpr int F = NOPAD_WEIGHT_Q4_0; CALL; } break;                           \
    case NOPAD_WEIGHT_Q4_1: { constexpr int F = NOPAD_WEIGHT_Q4_1; CALL; } break;                           \
    case NOPAD_WEIGHT_Q5_0: { constexpr int F = NOPAD_WEIGHT_Q5_0; CALL; } break;                           \
    case NOPAD_WEIGHT_Q5_1: { constexpr int F = NOPAD_WEIGHT_Q5_1; CALL; } break;                           \
    case NOPAD_WEIGHT_Q8_0: { constexpr int F = NOPAD_WEIGHT_Q8_0; CALL; } break;                           \
    case NOPAD_WEIGHT_Q4_K: { constexpr int F = NOPAD_WEIGHT_Q4_K; CALL; } break;                           \
    case NOPAD_WEIGHT_Q5_K: { constexpr int F = NOPAD_WEIGHT_Q5_K; CALL; } break;                           \
    default: { constexpr int F = NOPAD_WEIGHT_Q6_K; CALL; } break;                                          \
    }

template <typename T>
static nopad_status dequantize_t(void *out, const void *w, nopad_weight_format format, int32_t rows, int32_t K,
                                 cudaStream_t s) {
    const size_t n = (size_t)rows * (K / 8);
    const unsigned grid = (unsigned)((n + 255) / 256);
    const size_t row_bytes = cuda_quant_row_bytes(format, K);
    QUANT_FORMAT_SWITCH(format, F,
                        (dequantize_kernel<F, T><<<grid, 256, 0, s>>>((T *)out, (const uint8_t *)w, row_bytes,
                                                                       rows, K)));
    return launch_status("quant dequantize");
}

extern "C" nopad_status cuda_quant_dequantize(nopad_dtype dtype, void *out, const void *w, nopad_weight_format format,
                                              int32_t rows, int32_t n_in, void *stream) {
    nopad_status st = check_format("quant dequantize", dtype, format, n_in);
    if (st != NOPAD_OK || rows <= 0) return st;
    if ((uintptr_t)w & 1u)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "quant dequantize: w must be 2-byte aligned");
    if ((size_t)rows * (size_t)(n_in / 8) > (size_t)0x7fffffff * 256)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "quant dequantize: %d rows of %d values is too many", rows,
                               n_in);
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, dequantize_t<__half>(out, w, format, rows, n_in, s),
                   dequantize_t<__nv_bfloat16>(out, w, format, rows, n_in, s));
}

template <typename T>
static nopad_status embed_t(float *out, const int32_t *tokens, const int32_t *feed, const int32_t *positions,
                            int32_t n, int32_t vocab, int32_t vocab0, int32_t vocab_rows, int32_t n_pos,
                            const void *word, nopad_weight_format format, const void *pos, int32_t dim,
                            cudaStream_t s) {
    const size_t row_bytes = cuda_quant_row_bytes(format, dim);
    QUANT_FORMAT_SWITCH(format, F,
                        (embed_q_kernel<F, T><<<n, 256, 0, s>>>(out, tokens, feed, positions, vocab, vocab0,
                                                                 vocab_rows, n_pos, (const uint8_t *)word,
                                                                 row_bytes, (const T *)pos, dim)));
    return launch_status("quant embed_tokens");
}

extern "C" nopad_status cuda_quant_embed_tokens(nopad_dtype dtype, float *out32, const int32_t *tokens,
                                                const int32_t *feed, const int32_t *positions, int32_t n_tokens,
                                                int32_t vocab, int32_t vocab0, int32_t vocab_rows,
                                                int32_t n_positions, const void *word, nopad_weight_format format,
                                                const void *pos, int32_t dim, void *stream) {
    nopad_status st = check_format("quant embed_tokens", dtype, format, dim);
    if (st != NOPAD_OK || n_tokens == 0) return st;
    if ((uintptr_t)word & 1u)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "quant embed_tokens: word must be 2-byte aligned");
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype,
                   embed_t<__half>(out32, tokens, feed, positions, n_tokens, vocab, vocab0, vocab_rows, n_positions,
                                   word, format, pos, dim, s),
                   embed_t<__nv_bfloat16>(out32, tokens, feed, positions, n_tokens, vocab, vocab0, vocab_rows,
                                          n_positions, word, format, pos, dim, s));
}

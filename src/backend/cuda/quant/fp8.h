/* CUDA kernels of FP8 E4M3 weights with a float32 scale per output row (backend.h's
 * NOPAD_WEIGHT_FP8_E4M3: w [N, K] as N rows of K E4M3 bytes, then the N scales at
 * w + nopad_fp8_scales_offset(N, K); docs/fp8.md). Hopper (sm_90a, the build's target; the
 * conversions need sm_89's cvt).
 *
 * - cuda_fp8_gemv: a decode step's 1 .. CUDA_FP8_GEMV_MAX_T tokens. A block takes 16 weight rows,
 *   its warps split K; the rows stream in 16-byte loads (half the bytes of fp16), E4M3 pairs become
 *   fp16 pairs with one cvt each (exact: every E4M3 value is an fp16, and a bf16) straight into
 *   m16n8k16 MMA fragments with the activations as they are (fp16 / bf16, not quantized), fp32
 *   accumulation, the row's scale applied once to the sum (as qgemv.cuh for the GGUF formats).
 * - cuda_fp8_quantize_tokens: the prompts' activations per token, for the FP8 GEMM
 *   (fp8_gemm.h): scale = max|x_t| / 448 (1 for a row of zeros), codes = E4M3(x / scale), nearest
 *   even and saturating, as io/fp8.h on the host, bit for bit.
 * - cuda_fp8_epilogue: the GEMM's scaled output (in the dtype) + bias, activation, + residual.
 * Nothing synchronises or allocates: every call can be captured in a CUDA graph. */
#ifndef NOPAD_BACKEND_CUDA_QUANT_FP8_H
#define NOPAD_BACKEND_CUDA_QUANT_FP8_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most tokens cuda_fp8_gemv takes; above it the prompts' FP8 GEMM (fp8_gemm.h). */
enum { CUDA_FP8_GEMV_MAX_T = 32 };

/* Whether the FP8 kernels run rows of n_in values: a positive multiple of 16 (the GEMV's 16-byte
 * loads, and cuBLASLt's FP8 GEMM wants its leading dimensions so). */
int cuda_fp8_runs(int32_t n_in);

/* y[T, N] = x[T, K] · (codes · scale)ᵀ, 1 <= T <= CUDA_FP8_GEMV_MAX_T, x in `dtype` (F16 or BF16)
 * 16-byte aligned, w 16-byte aligned. out_f32: y float32, no epilogue (bias, residual NULL, act < 0).
 * Else y in dtype with + bias[N] (NULL: none), act (a nopad_activation, < 0: none) and
 * + residual[T, N] (NULL: none; may alias y), in fp32 with one rounding at the store. */
nopad_status cuda_fp8_gemv(nopad_dtype dtype, void *y, const void *x, const void *w, const void *bias,
                           const void *residual, int32_t n_tokens, int32_t n_in, int32_t n_out, int act, int out_f32,
                           void *stream);

/* xq[T, K] E4M3 codes and xs[T] float32 scales of x[T, K] (dtype), per token. */
nopad_status cuda_fp8_quantize_tokens(nopad_dtype dtype, uint8_t *xq, float *xs, const void *x, int32_t n_tokens,
                                      int32_t n_in, void *stream);

/* out[t, n] = act(acc[t, n] + bias[n]) + residual[t, n], for t < T, n < N, everything in dtype with
 * rows N apart, in fp32 with one rounding at the store: bias, residual NULL when not applied, act < 0
 * none. residual and acc may alias out. */
nopad_status cuda_fp8_epilogue(nopad_dtype dtype, void *out, const void *acc, const void *bias, int act,
                               const void *residual, int32_t n_tokens, int32_t n_out, void *stream);

#ifdef __cplusplus
}
#endif
#endif

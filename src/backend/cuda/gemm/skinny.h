/* Linear layers for the few tokens of a small batch: y[T, N] = epilogue(x[T, K] · w[N, K]ᵀ) with
 * T <= CUDA_SKINNY_MAX_T, in one kernel whatever the epilogue (skinny.cu says how).
 *
 * At T = 26 (one short sentence) a BERT-base linear layer is a stream of 1.2–4.7 MB of weights
 * through ~0.2 GFLOP: what counts is reading the weights with every SM and doing the rest in the
 * same kernel. The library GEMMs run such shapes on 48-96 CTAs of the 132 SMs and add kernels of
 * their own (cuBLASLt's split-K reduction at K = 3072; the exact GELU as a separate pass).
 *
 * Epilogue, in fp32 with one rounding at the store: + bias[N] (NULL: none), then the activation
 * (act >= 0: a nopad_activation; act < 0: none), then + residual[T, N] (NULL: none; may alias y).
 * The K slices of a tile are summed in a fixed order, so equal inputs give identical bits.
 * No workspace, no allocation, no synchronisation: a call can be captured in a CUDA graph.
 * Requires K % 8 == 0 and K <= 4096, N % 64 == 0, 16-byte aligned x, w, y and residual, bias
 * 8-byte aligned. Anything else returns NOPAD_ERR_UNSUPPORTED (the caller takes another path). */
#ifndef NOPAD_BACKEND_CUDA_GEMM_SKINNY_H
#define NOPAD_BACKEND_CUDA_GEMM_SKINNY_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { CUDA_SKINNY_MAX_T = 256 };

/* Whether cuda_gemm_skinny takes this shape (the arguments it checks without looking at data). */
int cuda_gemm_skinny_supported(int32_t n_tokens, int32_t n_in, int32_t n_out);

nopad_status cuda_gemm_skinny(nopad_dtype dtype, void *y, const void *x, const void *w,
                              const void *bias, const void *residual, int32_t n_tokens,
                              int32_t n_in, int32_t n_out, int act, void *stream);

#ifdef __cplusplus
}
#endif
#endif

/* Internal: the backward of the linear layer y[T, N] = x[T, K]·w[N, K]ᵀ (+ b) on CUDA.
 *   gemm_backward.c  dx = dy·w (compute dtype) and dw32 += dyᵀ·x (float32) through cuBLASLt,
 *                    with a cache of plans per shape
 *   bias_grad.cu     db32 += Σ_t dy, a deterministic column sum */
#ifndef NOPAD_BACKEND_CUDA_TRAIN_GEMM_BACKWARD_H
#define NOPAD_BACKEND_CUDA_TRAIN_GEMM_BACKWARD_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "backend/cuda/gemm/cublaslt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- gemm_backward.c --------------------------------------------------------------------------- */
/* The plans of the two backward GEMMs, kept per backend (cuda_state.train_gemm_plans). */
typedef struct cuda_train_gemm_plans cuda_train_gemm_plans;

/* dx[T, K] = dy[T, N]·w[N, K] (+ dx when accumulate), in `dtype` with float32 accumulation.
 * *plans is created on first use. */
nopad_status cuda_train_gemm_dx(cuda_lt *lt, cuda_train_gemm_plans **plans, nopad_dtype dtype, void *dx,
                                const void *dy, const void *w, int32_t n_tokens, int32_t n_in,
                                int32_t n_out, int accumulate, cudaStream_t stream);

/* dw32[N, K] += dy[T, N]ᵀ·x[T, K]: dy and x in `dtype`, dw32 float32, float32 accumulation. */
nopad_status cuda_train_gemm_dw(cuda_lt *lt, cuda_train_gemm_plans **plans, nopad_dtype dtype, float *dw32,
                                const void *dy, const void *x, int32_t n_tokens, int32_t n_in,
                                int32_t n_out, cudaStream_t stream);

void cuda_train_gemm_plans_free(cuda_train_gemm_plans *plans);

/* ---- bias_grad.cu ------------------------------------------------------------------------------ */
/* Device scratch cuda_bias_grad needs for dy [T, N] (0 when T is small enough for one pass). */
size_t cuda_bias_grad_workspace_bytes(int32_t n_tokens, int32_t n_out);

/* db32[N] += Σ_t dy[t, :] (dy in `dtype`), summed in float32 in a fixed order; ws:
 * cuda_bias_grad_workspace_bytes of device memory (may be NULL when that is 0). */
nopad_status cuda_bias_grad(nopad_dtype dtype, float *db32, const void *dy, int32_t n_tokens, int32_t n_out,
                            float *ws, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

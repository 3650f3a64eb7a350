/* Linear layers of a decode step: y[T, N] = epilogue(x[T, K] · w[N, K]ᵀ) for T <= CUDA_GEMV_MAX_T,
 * streaming the weights through shared memory into tensor-core fragments (gemv.cu says how).
 *
 * A decode step at batch <= 32 reads every weight once and does almost no arithmetic with it: the
 * step's floor is its weight bytes over the copy bandwidth. cuBLASLt runs such shapes at about half
 * the copy rate on LLaMA-1B's layers (docs/decoder.md); this kernel stages the weights in shared
 * memory by bulk copies, two chunks a warp in flight, and requests the first ones before the kernel
 * ahead of it has finished.
 *
 * Three outputs:
 * - cuda_gemv: y in the compute dtype, with + bias[N] (NULL: none), the activation (act >= 0: a
 *   nopad_activation; < 0: none) and + residual[T, N] (NULL: none; may alias y), in fp32 with one
 *   rounding at the store;
 * - cuda_gemv_f32: y float32, no epilogue (the LM head's logits);
 * - cuda_gemv_swiglu: y[T, F] = silu(x · w[0:F]ᵀ) ⊙ (x · w[F:2F]ᵀ) for w [2F, K] (LLaMA's gate and
 *   up projections stacked), the gate_up product never stored.
 * The K slices are summed in a fixed order: equal inputs give identical bits. No workspace, no
 * allocation, no synchronisation: calls can be captured in a CUDA graph.
 * Requires 1 <= T <= CUDA_GEMV_MAX_T, K % 8 == 0, 16-byte aligned x and w; anything else returns
 * NOPAD_ERR_UNSUPPORTED (the caller takes another path). N is any size. */
#ifndef NOPAD_BACKEND_CUDA_GEMM_GEMV_H
#define NOPAD_BACKEND_CUDA_GEMM_GEMV_H

#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { CUDA_GEMV_MAX_T = 32 };

/* Whether the gemv kernels take this shape (the arguments they check without looking at data). */
int cuda_gemv_supported(int32_t n_tokens, int32_t n_in, int32_t n_out);

/* The largest T that the linear op and the LM head send to the gemv kernels: NOPAD_GEMV_MAX_TOKENS
 * (0 turns them off; at most CUDA_GEMV_MAX_T). */
int32_t cuda_gemv_max_tokens(void);
void cuda_gemv_set_max_tokens(int32_t max_tokens); /* for the benchmark and the tests */

nopad_status cuda_gemv(nopad_dtype dtype, void *y, const void *x, const void *w, const void *bias,
                       const void *residual, int32_t n_tokens, int32_t n_in, int32_t n_out, int act,
                       void *stream);
nopad_status cuda_gemv_f32(nopad_dtype dtype, float *y, const void *x, const void *w, int32_t n_tokens,
                           int32_t n_in, int32_t n_out, void *stream);
nopad_status cuda_gemv_swiglu(nopad_dtype dtype, void *y, const void *x, const void *w, int32_t n_tokens,
                              int32_t n_in, int32_t n_ffn, void *stream);

#ifdef __cplusplus
}
#endif
#endif

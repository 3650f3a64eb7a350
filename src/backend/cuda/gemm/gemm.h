/* The CUDA backend's linear op and where each GEMM goes: y[T, N] = epilogue(x[T, K] · w[N, K]ᵀ)
 * runs on the gemv kernels for a decode step's few tokens on a decoder's layers (gemv.h), on the
 * skinny GEMM for a few tokens of the BERT-family shapes (skinny.h), else on CUTLASS with the epilogue fused
 * (cutlass.h) where the mode and the shape say so, else on cuBLASLt (cublaslt.h), each path
 * handing shapes it does not take to the next. Nothing synchronises: a call can be captured in a
 * CUDA graph. */
#ifndef NOPAD_BACKEND_CUDA_GEMM_GEMM_H
#define NOPAD_BACKEND_CUDA_GEMM_GEMM_H

#include <stdint.h>

#include "backend/backend.h"
#include "backend/cuda/gemm/cutlass.h"
#include "backend/cuda/gemm/gemv.h"
#include "backend/cuda/gemm/skinny.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which path the linear op takes (NOPAD_GEMM=cublaslt|cutlass|auto; auto when unset): cuBLASLt
 * only, CUTLASS for every epilogue it has, or per shape and epilogue whichever measured faster
 * (docs/gemm.md). */
typedef enum cuda_gemm_mode {
    CUDA_GEMM_MODE_AUTO = 0,
    CUDA_GEMM_MODE_CUBLASLT = 1,
    CUDA_GEMM_MODE_CUTLASS = 2,
} cuda_gemm_mode;
cuda_gemm_mode cuda_gemm_get_mode(void);
void cuda_gemm_set_mode(cuda_gemm_mode mode); /* for the benchmark and the tests */

/* Which of cuBLASLt's heuristic answers a new GEMM plan takes: rank 0 (its first choice, the
 * default) up to CUDA_GEMM_LT_MAX_RANK (cublaslt.h). For the benchmark, which times the ranks
 * against each other (gemm_bench --lt-ranks); plans are cached per rank. Returns the rank set
 * (clamped). */
int cuda_gemm_set_lt_rank(int rank);

/* Whether the linear op calls cuda_gemm_fused for this shape and epilogue under the mode. */
int cuda_gemm_use_fused(int32_t n_tokens, int32_t n_in, int32_t n_out, cuda_gemm_epilogue ep);

/* The largest T that the linear op sends to the skinny GEMM: NOPAD_SKINNY_MAX_TOKENS (0 turns the
 * path off; at most CUDA_SKINNY_MAX_T), by default 32, the crossover measured in the whole
 * BERT-base forward (faster at 16 and 32 tokens, slower from 64; docs/gemm.md). Timed alone the
 * kernel is slower than a cuBLASLt GEMM at 32 tokens; in the forward it gains by replacing the
 * split-K reduction and GELU kernels and by fetching its weights before the kernel ahead of it
 * has finished. */
int32_t cuda_gemm_skinny_max_tokens(void);
/* Overrides it (0: off), for the benchmark and the tests. */
void cuda_gemm_skinny_set_max_tokens(int32_t max_tokens);

/* Whether the linear op takes the skinny GEMM for this shape: every supported shape within
 * cuda_gemm_skinny_max_tokens() whose smaller side (K or N) is at most 1024, the BERT-family
 * layers. Alone it beats the library path only at K >= 2·N, yet taking it for every GEMM of an
 * encoder forward is faster than taking it only where it wins alone (consecutive skinny kernels
 * fetch their weights while the one before finishes); a decoder's wider layers (LLaMA-1B: K and
 * N >= 2048) run faster on cuBLASLt (docs/gemm.md). */
int cuda_gemm_skinny_wins(int32_t n_tokens, int32_t n_in, int32_t n_out);

/* Whether the linear op takes the gemv kernels for this shape: T <= cuda_gemv_max_tokens() on a
 * shape the skinny GEMM does not take (a decoder's layers; docs/gemm.md has the measurements). */
int cuda_gemm_gemv_wins(int32_t n_tokens, int32_t n_in, int32_t n_out);

/* The same for LLaMA's gate and up projection with SwiGLU ([T, 2F] from w [2F, K]): also up to
 * CUDA_GEMV_MAX_T tokens where the skinny GEMM would take the layer, because the gemv kernel
 * applies SwiGLU in its epilogue and the skinny GEMM would need the [T, 2F] product stored and a
 * SwiGLU kernel after it (SmolLM2's shape at 28-32 tokens 8% faster a step, docs/gemm.md). */
int cuda_gemm_gemv_swiglu_wins(int32_t n_tokens, int32_t n_in, int32_t n_ffn);

#ifdef __cplusplus
}
#endif

/* The linear op itself, for the backend (C only: it needs the backend's cuBLASLt state). */
#ifndef __cplusplus
#include "backend/cuda/gemm/cublaslt.h"

nopad_status cuda_gemm_linear(cuda_lt *lt, nopad_dtype dtype, void *out, const void *x, const void *w,
                              const void *bias, const void *residual, int32_t n_tokens, int32_t n_in,
                              int32_t n_out, nopad_epilogue epilogue, nopad_activation act,
                              cudaStream_t stream);
#endif

#endif

/* The FP8 linear op for more tokens than the GEMV takes (fp8.h, CUDA_FP8_GEMV_MAX_T): the
 * activations quantized per token to E4M3 (cuda_fp8_quantize_tokens), then cuBLASLt's FP8 GEMM
 * on Hopper's tensor cores, the weight's row scales and the tokens' scales applied to the fp32
 * sums, in the first of two ways that applies:
 * - outer-vector scaling (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F for A and B, cuBLASLt 12.9+):
 *   the scales applied inside the GEMM, the output written in the compute dtype; a bias,
 *   activation or residual then in one pass over it (cuda_fp8_epilogue). Taken for N a multiple
 *   of 16 and a dtype output where cuBLASLt runs it (a refusal is kept per shape, said once);
 * - the GEMV over slices of CUDA_FP8_GEMV_MAX_T tokens, on the activations as they are, for the
 *   rest (odd N, the float32 output, a refused shape): slower for long prompts, never wrong.
 *   An unscaled FP8 GEMM (fp32 sums, the scales in a pass after) was the middle way until the
 *   first H100 run: cuBLAS 13.1 refused it for every N not a multiple of 16, leaving it only the
 *   float32 output, which the engine never asks of FP8 weights (docs/fp8.md).
 * Prompts longer than the scratch cap (64 MiB) allows are done in slices of tokens.
 * cuBLASLt's descriptors are made for each call (cheap), its heuristic's answer kept per shape.
 * C only: it needs the backend's cuBLASLt state. */
#ifndef NOPAD_BACKEND_CUDA_QUANT_FP8_GEMM_H
#define NOPAD_BACKEND_CUDA_QUANT_FP8_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "backend/cuda/gemm/cublaslt.h"

/* Which way the FP8 GEMM goes (tests and benchmarks force each). */
typedef enum cuda_fp8_gemm_way {
    CUDA_FP8_GEMM_AUTO = 0,      /* outer-vector scaling where it applies and cuBLASLt runs it */
    CUDA_FP8_GEMM_OUTER_VEC = 1, /* forced: an error where cuBLASLt refuses it */
    CUDA_FP8_GEMM_GEMV = 2,      /* the GEMV over slices of tokens */
} cuda_fp8_gemm_way;
void cuda_fp8_gemm_force(cuda_fp8_gemm_way way);
/* The way the last cuda_fp8_gemm call took (OUTER_VEC or GEMV; AUTO before any). */
cuda_fp8_gemm_way cuda_fp8_gemm_last_way(void);

/* Bytes of scratch cuda_fp8_gemm needs for this shape (at most about the cap, at least one token's). */
size_t cuda_fp8_gemm_scratch_bytes(int32_t n_tokens, int32_t n_in, int32_t n_out);

/* out[T, N] = epilogue(x[T, K] · wᵀ), w [N, K] FP8 E4M3 with its row scales (backend.h), as the
 * backend's gemm_q (out_f32: float32, epilogue NONE), with `scratch` of
 * cuda_fp8_gemm_scratch_bytes bytes (device memory nothing else uses until the stream has passed
 * this call, 256-byte aligned). */
nopad_status cuda_fp8_gemm(cuda_lt *lt, nopad_dtype dtype, void *out, const void *x, const void *w, const void *bias,
                           const void *residual, int32_t n_tokens, int32_t n_in, int32_t n_out,
                           nopad_epilogue epilogue, nopad_activation act, int out_f32, void *scratch,
                           cudaStream_t stream);

/* Sets the scratch cap (0: the default, 64 MiB), for the tests, which make it small to run the slices. */
void cuda_fp8_set_scratch_cap(size_t bytes);

#endif

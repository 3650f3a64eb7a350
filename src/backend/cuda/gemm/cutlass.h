/* Linear layers with the epilogue fused into the GEMM, through CUTLASS's SM90 TMA
 * warp-specialized kernels (wgmma): row-major y[T, N] = x[T, K] · w[N, K]ᵀ + bias[N], then
 *   CUDA_GEMM_BIAS           nothing more
 *   CUDA_GEMM_BIAS_GELU_ERF  y = 0.5·y·(1 + erf(y/√2)), the exact GELU (cuBLASLt only has tanh)
 *   CUDA_GEMM_BIAS_RESIDUAL  y += residual[T, N]
 * in fp16 or bf16 with fp32 accumulation and an fp32 epilogue (one rounding, at the store).
 * bias may be NULL (no bias). Any T >= 1; K and N multiples of 8 and 16-byte aligned pointers
 * (the TMA's rule), else NOPAD_ERR_UNSUPPORTED so the caller can fall back to cuBLASLt.
 * No allocation and no synchronisation per call (the kernels need no workspace), so a call can
 * be captured in a CUDA graph. Built without CUTLASS, every call returns NOPAD_ERR_UNSUPPORTED. */
#ifndef NOPAD_BACKEND_CUDA_GEMM_FUSED_H
#define NOPAD_BACKEND_CUDA_GEMM_FUSED_H

#include <stdint.h>

#include <cuda_runtime.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cuda_gemm_epilogue {
    CUDA_GEMM_BIAS = 0,
    CUDA_GEMM_BIAS_GELU_ERF = 1,
    CUDA_GEMM_BIAS_RESIDUAL = 2,
} cuda_gemm_epilogue;

/* Tile configurations compiled in (index = config number; see gemm_cutlass.cu for why each). */
enum { CUDA_GEMM_CONFIG_AUTO = -1 };

nopad_status cuda_gemm_fused(nopad_dtype dtype, void *y, const void *x, const void *w,
                             const void *bias, const void *residual, int32_t n_tokens,
                             int32_t n_in, int32_t n_out, cuda_gemm_epilogue ep,
                             cudaStream_t stream);

/* Same, with the tile configuration forced (0 <= config < cuda_gemm_fused_n_configs(), or
 * CUDA_GEMM_CONFIG_AUTO): for the benchmark and the tests. */
nopad_status cuda_gemm_fused_config(nopad_dtype dtype, void *y, const void *x, const void *w,
                                    const void *bias, const void *residual, int32_t n_tokens,
                                    int32_t n_in, int32_t n_out, cuda_gemm_epilogue ep,
                                    int config, cudaStream_t stream);

/* Which path cu_linear takes (NOPAD_GEMM=cublaslt|cutlass|auto, read at the first call; auto
 * when unset): cuBLASLt only, CUTLASS for every epilogue it has, or per shape and epilogue
 * whichever measured faster on an H200 (bench/RESULTS.md). */
typedef enum cuda_gemm_mode {
    CUDA_GEMM_MODE_AUTO = 0,
    CUDA_GEMM_MODE_CUBLASLT = 1,
    CUDA_GEMM_MODE_CUTLASS = 2,
} cuda_gemm_mode;
cuda_gemm_mode cuda_gemm_get_mode(void);
void cuda_gemm_set_mode(cuda_gemm_mode mode); /* for the benchmark and the tests */
/* Which of cuBLASLt's heuristic answers a new GEMM plan takes: rank 0 (its first choice, the
 * default) up to CUDA_GEMM_LT_MAX_RANK. For the benchmark, which times the ranks against each other
 * (gemm_bench --lt-ranks); plans are cached per rank. Returns the rank set (clamped). */
enum { CUDA_GEMM_LT_MAX_RANK = 7 };
int cuda_gemm_set_lt_rank(int rank);
/* Whether cu_linear should call cuda_gemm_fused for this shape and epilogue under the mode. */
int cuda_gemm_use_fused(int32_t n_tokens, int32_t n_in, int32_t n_out, cuda_gemm_epilogue ep);

/* 1 when the library was built with CUTLASS (the fused path exists), else 0. */
int cuda_gemm_fused_available(void);
int cuda_gemm_fused_n_configs(void);
const char *cuda_gemm_fused_config_name(int config);
/* The configuration cuda_gemm_fused picks for this shape. */
int cuda_gemm_fused_pick(int32_t n_tokens, int32_t n_in, int32_t n_out, cuda_gemm_epilogue ep);

#ifdef __cplusplus
}
#endif
#endif

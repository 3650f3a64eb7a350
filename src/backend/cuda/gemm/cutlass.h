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
#ifndef NOPAD_BACKEND_CUDA_GEMM_CUTLASS_H
#define NOPAD_BACKEND_CUDA_GEMM_CUTLASS_H

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

/* Tile configurations compiled in (index = config number; see cutlass.cuh for why each). */
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

/* Training's FFN with its exact-erf GELU fused (cutlass_train.cu), bf16 only; other dtypes,
 * K or N not multiples of 8, unaligned pointers and builds without CUTLASS return
 * NOPAD_ERR_UNSUPPORTED so the caller runs the unfused ops:
 *   cuda_gemm_gelu_aux:  y[T, n_out] = gelu(x[T, n_in]·w[n_out, n_in]ᵀ + bias), aux = the argument
 *   cuda_gemm_dgelu:     dx[T, n_in] = (dy[T, n_out]·w[n_out, n_in]) ⊙ gelu'(aux[T, n_in]) */
nopad_status cuda_gemm_gelu_aux(nopad_dtype dtype, void *y, void *aux, const void *x, const void *w,
                                const void *bias, int32_t n_tokens, int32_t n_in, int32_t n_out,
                                cudaStream_t stream);
nopad_status cuda_gemm_dgelu(nopad_dtype dtype, void *dx, const void *dy, const void *w, const void *aux,
                             int32_t n_tokens, int32_t n_in, int32_t n_out, cudaStream_t stream);

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

/* GEMMs through cuBLASLt: one handle, its workspace and a cache of plans (shape, epilogue and the
 * algorithm the heuristic picked, chosen once per shape). Owned by the CUDA backend, one per device.
 * Row-major y[T, N] = x[T, K] · w[N, K]ᵀ with cuBLASLt's fused epilogues. */
#ifndef NOPAD_BACKEND_CUDA_GEMM_CUBLASLT_H
#define NOPAD_BACKEND_CUDA_GEMM_CUBLASLT_H

#include <stdint.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "backend/backend.h"

enum { CUDA_LT_CACHE_SIZE = 512 };
/* The heuristic's answers a plan may take: rank 0 (its first choice) up to this. */
enum { CUDA_GEMM_LT_MAX_RANK = 7 };
#define CUDA_LT_WORKSPACE_BYTES ((size_t)32 << 20)

/* One cached GEMM configuration: shape, epilogue and the algorithm the heuristic picked. */
typedef struct cuda_lt_plan {
    int32_t n_tokens, n_in, n_out;
    int epilogue;   /* cublasLtEpilogue_t */
    int accumulate; /* beta = 1 with C = residual */
    int lt_rank;    /* the heuristic's answer taken (cuda_gemm_set_lt_rank) */
    int out_f32;    /* y in float32 (x and w in the compute dtype) */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layout_w, layout_x, layout_y;
    cublasLtMatmulAlgo_t algo;
} cuda_lt_plan;

typedef struct cuda_lt {
    cublasLtHandle_t handle;
    void *workspace; /* CUDA_LT_WORKSPACE_BYTES of device memory */
    cuda_lt_plan plans[CUDA_LT_CACHE_SIZE];
    int n_plans;
} cuda_lt;

/* Creates the handle and the workspace on the current device; on failure *lt is left empty. */
nopad_status cuda_lt_init(cuda_lt *lt);
void cuda_lt_destroy(cuda_lt *lt);

/* out[T, N] = x[T, K] · w[N, K]ᵀ with `epilogue` (+ bias[N]; accumulate: + residual[T, N]), the
 * algorithm the heuristic's answer number `rank` names (0: its first choice), on `stream`. */
nopad_status cuda_lt_matmul(cuda_lt *lt, nopad_dtype dtype, void *out, const void *x, const void *w,
                            const void *bias, const void *residual, int32_t n_tokens, int32_t n_in,
                            int32_t n_out, cublasLtEpilogue_t epilogue, int accumulate, int rank,
                            cudaStream_t stream);
/* out[T, N] = x[T, K] · w[N, K]ᵀ in float32 (x and w in `dtype`), no epilogue. */
nopad_status cuda_lt_matmul_f32(cuda_lt *lt, nopad_dtype dtype, float *out, const void *x, const void *w,
                                int32_t n_tokens, int32_t n_in, int32_t n_out, cudaStream_t stream);
#endif

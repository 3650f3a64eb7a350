/* cuBLASLt plans and their cache (cublaslt.h). */
#ifdef NOPAD_HAVE_CUDA

#include <string.h>

#include "backend/cuda/gemm/cublaslt.h"
#include "util/error.h"

static nopad_status lt_check(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return NOPAD_OK;
    return nopad_set_error(NOPAD_ERR_BACKEND, "cublasLt %s: status %d", what, (int)st);
}

nopad_status cuda_lt_init(cuda_lt *lt) {
    memset(lt, 0, sizeof *lt);
    nopad_status st = lt_check(cublasLtCreate(&lt->handle), "create");
    if (st == NOPAD_OK) {
        cudaError_t err = cudaMalloc(&lt->workspace, CUDA_LT_WORKSPACE_BYTES);
        if (err != cudaSuccess) {
            cudaGetLastError();
            lt->workspace = NULL;
            st = nopad_set_error(NOPAD_ERR_BACKEND, "cuda workspace: %s", cudaGetErrorString(err));
        }
    }
    return st;
}

static void plan_destroy(cuda_lt_plan *p) {
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    if (p->layout_w) cublasLtMatrixLayoutDestroy(p->layout_w);
    if (p->layout_x) cublasLtMatrixLayoutDestroy(p->layout_x);
    if (p->layout_y) cublasLtMatrixLayoutDestroy(p->layout_y);
    memset(p, 0, sizeof *p);
}

void cuda_lt_destroy(cuda_lt *lt) {
    for (int i = 0; i < lt->n_plans; i++) plan_destroy(&lt->plans[i]);
    lt->n_plans = 0;
    if (lt->handle) cublasLtDestroy(lt->handle);
    if (lt->workspace) cudaFree(lt->workspace);
    lt->handle = NULL;
    lt->workspace = NULL;
}

/* Row-major y[T, N] = x[T, K] · w[N, K]ᵀ is, in cuBLAS's column-major terms,
 * yᵀ[N, T] = op(w)[N, K] · xᵀ[K, T] with w seen as a K x N column-major matrix (op = transpose)
 * and x as K x T (no transpose). The bias epilogue adds a vector along N, the rows of yᵀ. */
static nopad_status plan_create(cuda_lt *lt, nopad_dtype dtype, int32_t T, int32_t K, int32_t N,
                                cublasLtEpilogue_t epilogue, int accumulate, int rank, int out_f32,
                                cuda_lt_plan *p) {
    memset(p, 0, sizeof *p);
    p->out_f32 = out_f32;
    p->n_tokens = T;
    p->n_in = K;
    p->n_out = N;
    p->epilogue = (int)epilogue;
    p->accumulate = accumulate;
    p->lt_rank = rank;
    const cudaDataType_t type = dtype == NOPAD_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    nopad_status st = lt_check(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
    if (st == NOPAD_OK)
        st = lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans), "transa");
    if (st == NOPAD_OK)
        st = lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof no_trans), "transb");
    if (st == NOPAD_OK)
        st = lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue), "epilogue");
    if (st == NOPAD_OK) st = lt_check(cublasLtMatrixLayoutCreate(&p->layout_w, type, K, N, K), "layout w");
    if (st == NOPAD_OK) st = lt_check(cublasLtMatrixLayoutCreate(&p->layout_x, type, K, T, K), "layout x");
    if (st == NOPAD_OK)
        st = lt_check(cublasLtMatrixLayoutCreate(&p->layout_y, out_f32 ? CUDA_R_32F : type, N, T, N), "layout y");
    if (st != NOPAD_OK) {
        plan_destroy(p);
        return st;
    }
    cublasLtMatmulPreference_t pref = NULL;
    size_t ws = CUDA_LT_WORKSPACE_BYTES;
    /* the first lt_rank + 1 answers; a rank past the last answer takes the last */
    cublasLtMatmulHeuristicResult_t results[CUDA_GEMM_LT_MAX_RANK + 1];
    int found = 0;
    st = lt_check(cublasLtMatmulPreferenceCreate(&pref), "preference");
    if (st == NOPAD_OK)
        st = lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                      "preference");
    if (st == NOPAD_OK)
        st = lt_check(cublasLtMatmulAlgoGetHeuristic(lt->handle, p->desc, p->layout_w, p->layout_x, p->layout_y,
                                                     p->layout_y, pref, rank + 1, results, &found),
                      "heuristic");
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (st == NOPAD_OK && found == 0)
        st = nopad_set_error(NOPAD_ERR_BACKEND, "cublasLt: no algorithm for a [%d, %d] x [%d, %d]ᵀ GEMM", T, K, N, K);
    if (st != NOPAD_OK) {
        plan_destroy(p);
        return st;
    }
    p->algo = results[rank < found ? rank : found - 1].algo;
    return NOPAD_OK;
}

static nopad_status find_plan(cuda_lt *lt, nopad_dtype dtype, int32_t T, int32_t K, int32_t N,
                              cublasLtEpilogue_t epilogue, int accumulate, int rank, int out_f32,
                              cuda_lt_plan **out) {
    for (int i = 0; i < lt->n_plans; i++) {
        cuda_lt_plan *p = &lt->plans[i];
        if (p->n_tokens == T && p->n_in == K && p->n_out == N && p->epilogue == (int)epilogue &&
            p->accumulate == accumulate && p->lt_rank == rank && p->out_f32 == out_f32) {
            *out = p;
            return NOPAD_OK;
        }
    }
    if (lt->n_plans == CUDA_LT_CACHE_SIZE) { /* full: start over rather than grow without bound */
        for (int i = 0; i < lt->n_plans; i++) plan_destroy(&lt->plans[i]);
        lt->n_plans = 0;
    }
    cuda_lt_plan *p = &lt->plans[lt->n_plans];
    nopad_status st = plan_create(lt, dtype, T, K, N, epilogue, accumulate, rank, out_f32, p);
    if (st != NOPAD_OK) return st;
    lt->n_plans++;
    *out = p;
    return NOPAD_OK;
}

nopad_status cuda_lt_matmul(cuda_lt *lt, nopad_dtype dtype, void *out, const void *x, const void *w,
                            const void *bias, const void *residual, int32_t n_tokens, int32_t n_in,
                            int32_t n_out, cublasLtEpilogue_t epilogue, int accumulate, int rank,
                            cudaStream_t stream) {
    cuda_lt_plan *p;
    nopad_status st = find_plan(lt, dtype, n_tokens, n_in, n_out, epilogue, accumulate, rank, 0, &p);
    if (st != NOPAD_OK) return st;
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        st = lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
                      "bias");
        if (st != NOPAD_OK) return st;
    }
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const void *c = accumulate ? residual : out;
    return lt_check(cublasLtMatmul(lt->handle, p->desc, &alpha, w, p->layout_w, x, p->layout_x, &beta, c,
                                   p->layout_y, out, p->layout_y, &p->algo, lt->workspace,
                                   CUDA_LT_WORKSPACE_BYTES, stream),
                    "matmul");
}

nopad_status cuda_lt_matmul_f32(cuda_lt *lt, nopad_dtype dtype, float *out, const void *x, const void *w,
                                int32_t n_tokens, int32_t n_in, int32_t n_out, cudaStream_t stream) {
    cuda_lt_plan *p;
    nopad_status st = find_plan(lt, dtype, n_tokens, n_in, n_out, CUBLASLT_EPILOGUE_DEFAULT, 0, 0, 1, &p);
    if (st != NOPAD_OK) return st;
    const float alpha = 1.0f, beta = 0.0f;
    return lt_check(cublasLtMatmul(lt->handle, p->desc, &alpha, w, p->layout_w, x, p->layout_x, &beta, out,
                                   p->layout_y, out, p->layout_y, &p->algo, lt->workspace,
                                   CUDA_LT_WORKSPACE_BYTES, stream),
                    "matmul (float32 out)");
}

#endif /* NOPAD_HAVE_CUDA */

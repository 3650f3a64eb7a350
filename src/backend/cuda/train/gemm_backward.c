/* The data and weight gradients of a linear layer through cuBLASLt (gemm_backward.h).
 *
 * Forward: y[T, N] = x[T, K]·w[N, K]ᵀ, row-major. cuBLASLt is column-major, and a row-major
 * [R, C] matrix is a column-major C x R one, so each GEMM is written on the transposes:
 *   dx[T, K] = dy·w        ->  dxᵀ (K x T) = wᵀ (K x N) · dyᵀ (N x T)        no transposes
 *   dw[N, K] += dyᵀ·x      ->  dwᵀ (K x N) += xᵀ (K x T) · (dyᵀ)ᵀ (T x N)    B transposed
 * A and B are in the compute dtype; dx (C = D) in the compute dtype; dw32 (C = D) in float32 with
 * beta = 1, so the gradient accumulates in float32 without a rounding to bf16 / fp16; compute
 * and scale types are float32 (a combination cublasLtMatmul lists for 16F and 16BF inputs).
 *
 * Plans (descriptors, layouts, the heuristic's first algorithm) are cached per shape and per the
 * alignment of the buffers: the heuristic assumes 256-byte aligned matrices unless told, and a
 * trainer's gradients may sit at any float offset of one allocation. */
#ifdef NOPAD_HAVE_CUDA

#include <stdlib.h>
#include <string.h>

#include "backend/cuda/train/gemm_backward.h"
#include "util/error.h"

enum { TRAIN_GEMM_PLANS = 128 };
typedef enum { GRAD_INPUT = 0, GRAD_WEIGHT = 1 } grad_kind;

typedef struct train_gemm_plan {
    grad_kind kind;
    nopad_dtype dtype;
    int32_t n_tokens, n_in, n_out;
    uint32_t align_a, align_b, align_c; /* bytes the matrices' pointers and leading dimensions allow */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layout_a, layout_b, layout_c; /* C and D share theirs */
    cublasLtMatmulAlgo_t algo;
} train_gemm_plan;

struct cuda_train_gemm_plans {
    train_gemm_plan plans[TRAIN_GEMM_PLANS];
    int n_plans;
};

static nopad_status lt_check(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return NOPAD_OK;
    return nopad_set_error(NOPAD_ERR_BACKEND, "cublasLt gemm_backward %s: status %d", what, (int)st);
}

/* The largest power of two up to 256 dividing both the address and the leading dimension in bytes. */
static uint32_t alignment_of(const void *p, size_t ld_bytes) {
    const uintptr_t bits = (uintptr_t)p | (uintptr_t)ld_bytes;
    uint32_t align = 256;
    while (align > 1 && (bits & (align - 1))) align >>= 1;
    return align;
}

static void plan_destroy(train_gemm_plan *p) {
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    if (p->layout_a) cublasLtMatrixLayoutDestroy(p->layout_a);
    if (p->layout_b) cublasLtMatrixLayoutDestroy(p->layout_b);
    if (p->layout_c) cublasLtMatrixLayoutDestroy(p->layout_c);
    memset(p, 0, sizeof *p);
}

void cuda_train_gemm_plans_free(cuda_train_gemm_plans *plans) {
    if (!plans) return;
    for (int i = 0; i < plans->n_plans; i++) plan_destroy(&plans->plans[i]);
    free(plans);
}

/* Fills p's descriptors and algorithm from its key fields (kind .. align_c). */
static nopad_status plan_create(cuda_lt *lt, train_gemm_plan *p) {
    const cudaDataType_t type = p->dtype == NOPAD_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const int64_t T = p->n_tokens, K = p->n_in, N = p->n_out;
    const cublasOperation_t transa = CUBLAS_OP_N;
    const cublasOperation_t transb = p->kind == GRAD_WEIGHT ? CUBLAS_OP_T : CUBLAS_OP_N;
    nopad_status st = lt_check(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    if (st == NOPAD_OK)
        st = lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa),
                      "transa");
    if (st == NOPAD_OK)
        st = lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb),
                      "transb");
    if (p->kind == GRAD_INPUT) {
        if (st == NOPAD_OK) st = lt_check(cublasLtMatrixLayoutCreate(&p->layout_a, type, K, N, K), "layout w");
        if (st == NOPAD_OK) st = lt_check(cublasLtMatrixLayoutCreate(&p->layout_b, type, N, T, N), "layout dy");
        if (st == NOPAD_OK) st = lt_check(cublasLtMatrixLayoutCreate(&p->layout_c, type, K, T, K), "layout dx");
    } else {
        if (st == NOPAD_OK) st = lt_check(cublasLtMatrixLayoutCreate(&p->layout_a, type, K, T, K), "layout x");
        /* dy as stored (N x T column-major); TRANSB makes it T x N */
        if (st == NOPAD_OK) st = lt_check(cublasLtMatrixLayoutCreate(&p->layout_b, type, N, T, N), "layout dy");
        if (st == NOPAD_OK) st = lt_check(cublasLtMatrixLayoutCreate(&p->layout_c, CUDA_R_32F, K, N, K), "layout dw");
    }
    cublasLtMatmulPreference_t pref = NULL;
    const size_t ws = CUDA_LT_WORKSPACE_BYTES;
    if (st == NOPAD_OK) st = lt_check(cublasLtMatmulPreferenceCreate(&pref), "preference");
    if (st == NOPAD_OK)
        st = lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                      "preference");
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        const uint32_t *bytes;
    } aligns[4] = {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &p->align_a},
                   {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &p->align_b},
                   {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &p->align_c},
                   {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &p->align_c}};
    for (int i = 0; i < 4 && st == NOPAD_OK; i++)
        st = lt_check(cublasLtMatmulPreferenceSetAttribute(pref, aligns[i].attr, aligns[i].bytes, sizeof(uint32_t)),
                      "alignment");
    /* a split-K algorithm adds its partial products in float32 (workspace), never in the output
     * type: dx in bf16 would otherwise be rounded once per split instead of once */
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    if (st == NOPAD_OK)
        st = lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                           sizeof schemes),
                      "reduction schemes");
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    if (st == NOPAD_OK)
        st = lt_check(cublasLtMatmulAlgoGetHeuristic(lt->handle, p->desc, p->layout_a, p->layout_b, p->layout_c,
                                                     p->layout_c, pref, 1, &result, &found),
                      "heuristic");
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (st == NOPAD_OK && found == 0)
        st = nopad_set_error(NOPAD_ERR_BACKEND, "cublasLt: no algorithm for the %s gradient of a [%d, %d] x [%d, %d]ᵀ GEMM",
                             p->kind == GRAD_INPUT ? "input" : "weight", (int)T, (int)K, (int)N, (int)K);
    if (st != NOPAD_OK) {
        plan_destroy(p);
        return st;
    }
    p->algo = result.algo;
    return NOPAD_OK;
}

static nopad_status find_plan(cuda_lt *lt, cuda_train_gemm_plans **plans_io, const train_gemm_plan *key,
                              train_gemm_plan **out) {
    cuda_train_gemm_plans *plans = *plans_io;
    if (!plans) {
        plans = calloc(1, sizeof *plans);
        if (!plans) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cuda gemm_backward: the plan cache");
        *plans_io = plans;
    }
    for (int i = 0; i < plans->n_plans; i++) {
        train_gemm_plan *p = &plans->plans[i];
        if (p->kind == key->kind && p->dtype == key->dtype && p->n_tokens == key->n_tokens &&
            p->n_in == key->n_in && p->n_out == key->n_out && p->align_a == key->align_a &&
            p->align_b == key->align_b && p->align_c == key->align_c) {
            *out = p;
            return NOPAD_OK;
        }
    }
    if (plans->n_plans == TRAIN_GEMM_PLANS) { /* full: start over rather than grow without bound */
        for (int i = 0; i < plans->n_plans; i++) plan_destroy(&plans->plans[i]);
        plans->n_plans = 0;
    }
    train_gemm_plan *p = &plans->plans[plans->n_plans];
    memset(p, 0, sizeof *p);
    p->kind = key->kind, p->dtype = key->dtype;
    p->n_tokens = key->n_tokens, p->n_in = key->n_in, p->n_out = key->n_out;
    p->align_a = key->align_a, p->align_b = key->align_b, p->align_c = key->align_c;
    nopad_status st = plan_create(lt, p);
    if (st != NOPAD_OK) return st;
    plans->n_plans++;
    *out = p;
    return NOPAD_OK;
}

static nopad_status check_dtype(nopad_dtype dtype) {
    if (dtype == NOPAD_DTYPE_F16 || dtype == NOPAD_DTYPE_BF16) return NOPAD_OK;
    return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cuda gemm_backward: dtype %d is not F16 or BF16", (int)dtype);
}

nopad_status cuda_train_gemm_dx(cuda_lt *lt, cuda_train_gemm_plans **plans, nopad_dtype dtype, void *dx,
                                const void *dy, const void *w, int32_t n_tokens, int32_t n_in,
                                int32_t n_out, int accumulate, cudaStream_t stream) {
    nopad_status st = check_dtype(dtype);
    if (st != NOPAD_OK) return st;
    const size_t elem = 2; /* fp16 / bf16 */
    train_gemm_plan key = {.kind = GRAD_INPUT, .dtype = dtype, .n_tokens = n_tokens, .n_in = n_in, .n_out = n_out,
                           .align_a = alignment_of(w, (size_t)n_in * elem),
                           .align_b = alignment_of(dy, (size_t)n_out * elem),
                           .align_c = alignment_of(dx, (size_t)n_in * elem)};
    train_gemm_plan *p;
    st = find_plan(lt, plans, &key, &p);
    if (st != NOPAD_OK) return st;
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    return lt_check(cublasLtMatmul(lt->handle, p->desc, &alpha, w, p->layout_a, dy, p->layout_b, &beta, dx,
                                   p->layout_c, dx, p->layout_c, &p->algo, lt->workspace, CUDA_LT_WORKSPACE_BYTES,
                                   stream),
                    "matmul (input gradient)");
}

nopad_status cuda_train_gemm_dw(cuda_lt *lt, cuda_train_gemm_plans **plans, nopad_dtype dtype, float *dw32,
                                const void *dy, const void *x, int32_t n_tokens, int32_t n_in,
                                int32_t n_out, cudaStream_t stream) {
    nopad_status st = check_dtype(dtype);
    if (st != NOPAD_OK) return st;
    const size_t elem = 2;
    train_gemm_plan key = {.kind = GRAD_WEIGHT, .dtype = dtype, .n_tokens = n_tokens, .n_in = n_in, .n_out = n_out,
                           .align_a = alignment_of(x, (size_t)n_in * elem),
                           .align_b = alignment_of(dy, (size_t)n_out * elem),
                           .align_c = alignment_of(dw32, (size_t)n_in * sizeof(float))};
    train_gemm_plan *p;
    st = find_plan(lt, plans, &key, &p);
    if (st != NOPAD_OK) return st;
    const float alpha = 1.0f, beta = 1.0f; /* dw32 += */
    return lt_check(cublasLtMatmul(lt->handle, p->desc, &alpha, x, p->layout_a, dy, p->layout_b, &beta, dw32,
                                   p->layout_c, dw32, p->layout_c, &p->algo, lt->workspace, CUDA_LT_WORKSPACE_BYTES,
                                   stream),
                    "matmul (weight gradient)");
}

#endif /* NOPAD_HAVE_CUDA */

/* The prompts' FP8 linear op (fp8_gemm.h). */
#ifdef NOPAD_HAVE_CUDA

#include <pthread.h>
#include <stdio.h>

#include "backend/cuda/quant/fp8_gemm.h"

#include "backend/cuda/quant/fp8.h"
#include "util/error.h"

#define DEFAULT_SCRATCH_CAP ((size_t)64 << 20)
enum { SCRATCH_ALIGN = 256, LD_MULTIPLE = 16 };

static size_t scratch_cap = DEFAULT_SCRATCH_CAP;
static cuda_fp8_gemm_way forced = CUDA_FP8_GEMM_AUTO, last_way = CUDA_FP8_GEMM_AUTO;
static int outer_vec_refusal_said; /* the first refusal is said on stderr, the rest are not */

void cuda_fp8_set_scratch_cap(size_t bytes) { scratch_cap = bytes ? bytes : DEFAULT_SCRATCH_CAP; }
void cuda_fp8_gemm_force(cuda_fp8_gemm_way way) { forced = way; }
cuda_fp8_gemm_way cuda_fp8_gemm_last_way(void) { return last_way; }

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Scratch of one token: its codes, its scale, and its scaled row in the dtype (when an epilogue follows). */
static size_t per_token_bytes(int32_t K, int32_t N) { return (size_t)K + sizeof(float) + (size_t)N * 2; }

/* Tokens a slice takes: all when they fit the cap, else as many as do (at least 1). */
static int32_t slice_tokens(int32_t T, int32_t K, int32_t N) {
    const size_t fit = scratch_cap / (per_token_bytes(K, N) + 3 * SCRATCH_ALIGN);
    return fit >= (size_t)T ? T : fit > 0 ? (int32_t)fit : 1;
}

size_t cuda_fp8_gemm_scratch_bytes(int32_t n_tokens, int32_t n_in, int32_t n_out) {
    const size_t t = (size_t)slice_tokens(n_tokens, n_in, n_out);
    return align_up(t * (size_t)n_in, SCRATCH_ALIGN) + align_up(t * sizeof(float), SCRATCH_ALIGN) +
           t * (size_t)n_out * 2;
}

/* The heuristic's answer per shape, kept as cublaslt.c keeps its plans (asking costs tens of
 * microseconds a call): the algorithm, or that there is none. One table for the process, keyed by
 * the cuBLASLt handle too, under a lock (contexts on other threads share it); full, it overwrites
 * its entries in turn. */
typedef struct algo_entry {
    cublasLtHandle_t handle;
    int32_t T, K, N;
    int dtype, found;
    cublasLtMatmulAlgo_t algo;
} algo_entry;
enum { ALGO_CACHE_SIZE = 256 };
static algo_entry algo_cache[ALGO_CACHE_SIZE];
static int algo_count, algo_next;
static pthread_mutex_t algo_lock = PTHREAD_MUTEX_INITIALIZER;

static int algo_find(const algo_entry *key, algo_entry *out) {
    int hit = 0;
    pthread_mutex_lock(&algo_lock);
    for (int i = 0; i < algo_count && !hit; i++) {
        const algo_entry *e = &algo_cache[i];
        if (e->handle == key->handle && e->T == key->T && e->K == key->K && e->N == key->N &&
            e->dtype == key->dtype) {
            *out = *e;
            hit = 1;
        }
    }
    pthread_mutex_unlock(&algo_lock);
    return hit;
}

static void algo_keep(const algo_entry *e) {
    pthread_mutex_lock(&algo_lock);
    if (algo_count < ALGO_CACHE_SIZE) {
        algo_cache[algo_count++] = *e;
    } else {
        algo_cache[algo_next] = *e;
        algo_next = (algo_next + 1) % ALGO_CACHE_SIZE;
    }
    pthread_mutex_unlock(&algo_lock);
}

static nopad_status lt_check(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return NOPAD_OK;
    return nopad_set_error(NOPAD_ERR_BACKEND, "cublasLt fp8 %s: status %d", what, (int)st);
}

/* One FP8 GEMM with outer-vector scaling: acc[T, N] (dtype, rows N apart) =
 * scale_w[n] · scale_x[t] · Σ_k xq[t, k] · wq[n, k].
 * In cuBLASLt's column-major terms as cublaslt.c: D[N, T] = op(A)[N, K] · B[K, T], A = wq seen as
 * K x N (transposed: FP8 wants the TN layout), B = xq as K x T. *refused: cuBLASLt has no
 * algorithm for it (not an error: the caller takes the GEMV). */
static nopad_status fp8_matmul(cuda_lt *lt, nopad_dtype dtype, void *acc, const uint8_t *xq, const float *xs,
                               const uint8_t *wq, const float *ws, int32_t T, int32_t K, int32_t N,
                               cudaStream_t stream, int *refused) {
    *refused = 0;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld_layout = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    const cudaDataType_t out_type = dtype == NOPAD_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
    nopad_status st = lt_check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    if (st == NOPAD_OK)
        st = lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans), "transa");
    if (st == NOPAD_OK)
        st = lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof no_trans),
                      "transb");
    if (st == NOPAD_OK) {
        const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        st = lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode),
                      "a scale mode");
        if (st == NOPAD_OK)
            st = lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode),
                          "b scale mode");
        if (st == NOPAD_OK)
            st = lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws, sizeof ws),
                          "a scales");
        if (st == NOPAD_OK)
            st = lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof xs),
                          "b scales");
        if (st != NOPAD_OK) *refused = 1; /* an older cuBLASLt without the attributes */
    }
    if (st == NOPAD_OK) st = lt_check(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, K, N, K), "layout a");
    if (st == NOPAD_OK) st = lt_check(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, K, T, K), "layout b");
    if (st == NOPAD_OK) st = lt_check(cublasLtMatrixLayoutCreate(&ld_layout, out_type, N, T, N), "layout d");
    algo_entry plan = {.handle = lt->handle, .T = T, .K = K, .N = N, .dtype = (int)dtype};
    int status = CUBLAS_STATUS_SUCCESS;
    if (st == NOPAD_OK && !algo_find(&plan, &plan)) {
        cublasLtMatmulHeuristicResult_t result;
        int found = 0;
        size_t ws_bytes = CUDA_LT_WORKSPACE_BYTES;
        st = lt_check(cublasLtMatmulPreferenceCreate(&pref), "preference");
        if (st == NOPAD_OK)
            st = lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                               &ws_bytes, sizeof ws_bytes),
                          "preference");
        if (st == NOPAD_OK) {
            status = (int)cublasLtMatmulAlgoGetHeuristic(lt->handle, desc, la, lb, ld_layout, ld_layout, pref, 1,
                                                         &result, &found);
            plan.found = status == CUBLAS_STATUS_SUCCESS && found > 0;
            if (plan.found) plan.algo = result.algo;
            algo_keep(&plan);
        }
    }
    /* any refusal of the heuristic (no algorithm, a layout or scale mode it does not take): the
     * caller takes another way */
    if (st == NOPAD_OK && !plan.found) {
        *refused = 1;
        st = nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                             "cublasLt: no FP8 algorithm for a [%d, %d] x [%d, %d]ᵀ GEMM with outer-vector scales "
                             "(status %d)", T, K, N, K, status);
    }
    if (st == NOPAD_OK) {
        const float alpha = 1.0f, beta = 0.0f;
        const cublasStatus_t m = cublasLtMatmul(lt->handle, desc, &alpha, wq, la, xq, lb, &beta, acc, ld_layout, acc,
                                                ld_layout, &plan.algo, lt->workspace, CUDA_LT_WORKSPACE_BYTES, stream);
        if (m == CUBLAS_STATUS_NOT_SUPPORTED || m == CUBLAS_STATUS_INVALID_VALUE) *refused = 1;
        st = lt_check(m, "matmul");
    }
    /* cuBLASLt reads the descriptors when the matmul is enqueued: they can go now */
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ld_layout) cublasLtMatrixLayoutDestroy(ld_layout);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
    return st;
}

nopad_status cuda_fp8_gemm(cuda_lt *lt, nopad_dtype dtype, void *out, const void *x, const void *w, const void *bias,
                           const void *residual, int32_t n_tokens, int32_t n_in, int32_t n_out,
                           nopad_epilogue epilogue, nopad_activation act, int out_f32, void *scratch,
                           cudaStream_t stream) {
    if (n_tokens == 0) return NOPAD_OK;
    if (!cuda_fp8_runs(n_in))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "fp8 gemm: rows of %d values (needs a positive multiple of 16)",
                               n_in);
    if (out_f32 && epilogue != NOPAD_EPILOGUE_NONE)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "fp8 gemm: a float32 output takes no epilogue");
    const size_t out_bytes = out_f32 ? sizeof(float) : 2;
    const uint8_t *wq = w;
    const float *ws = (const float *)(wq + nopad_fp8_scales_offset(n_out, n_in));
    const void *ep_bias = epilogue == NOPAD_EPILOGUE_NONE ? NULL : bias;
    const void *ep_residual = epilogue == NOPAD_EPILOGUE_BIAS_RESIDUAL ? residual : NULL;
    const int ep_act = epilogue == NOPAD_EPILOGUE_BIAS_ACT ? (int)act : -1;
    const int32_t slice = slice_tokens(n_tokens, n_in, n_out);
    const int outer_vec_fits = !out_f32 && n_out % LD_MULTIPLE == 0;
    uint8_t *xq = scratch;
    float *xs = (float *)((char *)scratch + align_up((size_t)slice * (size_t)n_in, SCRATCH_ALIGN));
    void *acc = (char *)xs + align_up((size_t)slice * sizeof(float), SCRATCH_ALIGN);
    for (int32_t t0 = 0; t0 < n_tokens; t0 += slice) {
        const int32_t T = n_tokens - t0 < slice ? n_tokens - t0 : slice;
        char *out_t = (char *)out + (size_t)t0 * (size_t)n_out * out_bytes;
        const void *residual_t = ep_residual ? (const char *)ep_residual + (size_t)t0 * (size_t)n_out * 2 : NULL;
        /* outer-vector scaling: into out itself when nothing follows, else into the scratch and
         * the epilogue's pass from there */
        if (forced == CUDA_FP8_GEMM_OUTER_VEC || (forced == CUDA_FP8_GEMM_AUTO && outer_vec_fits)) {
            if (!outer_vec_fits)
                return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "fp8 gemm: outer-vector scaling needs a dtype output "
                                       "and N a multiple of 16 (N %d)", n_out);
            nopad_status st = cuda_fp8_quantize_tokens(dtype, xq, xs, (const char *)x + (size_t)t0 * (size_t)n_in * 2,
                                                       T, n_in, stream);
            if (st != NOPAD_OK) return st;
            const int direct = ep_bias == NULL && ep_residual == NULL && ep_act < 0;
            int refused = 0;
            st = fp8_matmul(lt, dtype, direct ? (void *)out_t : acc, xq, xs, wq, ws, T, n_in, n_out, stream, &refused);
            if (st == NOPAD_OK) {
                last_way = CUDA_FP8_GEMM_OUTER_VEC;
                if (!direct) st = cuda_fp8_epilogue(dtype, out_t, acc, ep_bias, ep_act, residual_t, T, n_out, stream);
                if (st != NOPAD_OK) return st;
                continue;
            }
            if (!refused || forced == CUDA_FP8_GEMM_OUTER_VEC) return st;
            /* the refusal is kept per shape (algo_cache): other shapes still ask */
            if (!outer_vec_refusal_said)
                fprintf(stderr, "nopad: notice: %s; such FP8 prompts run the FP8 GEMV over slices of %d tokens\n",
                        nopad_last_error(), (int)CUDA_FP8_GEMV_MAX_T);
            outer_vec_refusal_said = 1;
            nopad_clear_error();
        }
        /* the GEMV, CUDA_FP8_GEMV_MAX_T tokens at a time, on the activations unquantized */
        for (int32_t g0 = 0; g0 < T; g0 += CUDA_FP8_GEMV_MAX_T) {
            const int32_t gt = T - g0 < CUDA_FP8_GEMV_MAX_T ? T - g0 : CUDA_FP8_GEMV_MAX_T;
            const size_t rows = (size_t)t0 + (size_t)g0;
            const nopad_status st = cuda_fp8_gemv(dtype, (char *)out + rows * (size_t)n_out * out_bytes,
                               (const char *)x + rows * (size_t)n_in * 2, w, ep_bias,
                               ep_residual ? (const char *)ep_residual + rows * (size_t)n_out * 2 : NULL, gt, n_in,
                               n_out, ep_act, out_f32, stream);
            if (st != NOPAD_OK) return st;
        }
        last_way = CUDA_FP8_GEMM_GEMV;
    }
    return NOPAD_OK;
}

#endif /* NOPAD_HAVE_CUDA */

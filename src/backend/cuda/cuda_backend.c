/* CUDA backend: the op table in fp16 or bf16 with fp32 accumulation. GEMMs of a few tokens go to
 * the skinny GEMM (gemm_skinny.h), the rest to CUTLASS (gemm_fused.h) or cuBLASLt with fused
 * epilogues (the algorithm is chosen once per shape and cached); attention is the fused
 * varlen kernel; the rest are the kernels of cuda_kernels.cu. Every op enqueues on the backend's
 * stream and returns: nothing synchronises inside a forward. */
#ifdef NOPAD_HAVE_CUDA

#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/gemm_fused.h"
#include "backend/cuda/gemm_skinny.h"
#include "util/error.h"

enum { GEMM_CACHE_SIZE = 512, GRAPH_CACHE_SIZE = 48, SEEN_KEYS = 64 };
#define CUBLASLT_WORKSPACE_BYTES ((size_t)32 << 20)
/* Device memory the backend holds whatever the model: cuBLASLt's workspace and the attention's
 * work counter. */
#define FIXED_EXTRA_BYTES (CUBLASLT_WORKSPACE_BYTES + NOPAD_ATTENTION_WORKSPACE_BYTES)

/* One cached GEMM configuration: shape, epilogue and the algorithm the heuristic picked. */
typedef struct gemm_plan {
    int32_t n_tokens, n_in, n_out;
    int epilogue; /* cublasLtEpilogue_t */
    int accumulate; /* beta = 1 with C = residual */
    int lt_rank;    /* the heuristic's answer taken (cuda_gemm_set_lt_rank) */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layout_w, layout_x, layout_y;
    cublasLtMatmulAlgo_t algo;
} gemm_plan;

/* One recorded forward, replayed whenever the same key comes back. */
typedef struct graph_entry {
    int64_t key[4];
    cudaGraphExec_t exec;
    uint64_t last_use; /* for evicting the least recently used */
} graph_entry;

typedef struct cuda_state {
    int device; /* the CUDA device ordinal everything below belongs to */
    cudaStream_t stream;
    int own_stream;
    cublasLtHandle_t lt;
    void *lt_workspace;
    float *scratch; /* device float32 staging for uploads and downloads */
    size_t scratch_bytes;
    gemm_plan plans[GEMM_CACHE_SIZE];
    int n_plans;
    graph_entry graphs[GRAPH_CACHE_SIZE];
    int n_graphs;
    uint64_t graph_clock;
    int64_t seen[SEEN_KEYS][4]; /* keys run once, not yet recorded */
    int next_seen;
    int32_t *pack_bad; /* device flag of pack_padded: the lengths did not match what the host said */
    void *attention_ws; /* the attention kernels' work counter (NOPAD_ATTENTION_WORKSPACE_BYTES,
                           zeroed once; every use is ordered on `stream`) */
    int cannot_record; /* a recording failed once (e.g. a caller's stream that cannot be captured):
                          run ops directly from then on */
} cuda_state;

static cuda_state *state_of(nopad_backend *be) { return (cuda_state *)be->impl; }

static nopad_status cuda_check(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return NOPAD_OK;
    return nopad_set_error(NOPAD_ERR_BACKEND, "cuda %s: %s", what, cudaGetErrorString(err));
}

static nopad_status lt_check(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return NOPAD_OK;
    return nopad_set_error(NOPAD_ERR_BACKEND, "cublasLt %s: status %d", what, (int)st);
}

/* ---- memory ----------------------------------------------------------------------------------- */

static nopad_status cu_alloc(nopad_backend *be, size_t bytes, void **out) {
    *out = NULL;
    cudaError_t err = cudaMalloc(out, bytes ? bytes : 16);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error so later calls are unaffected */
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cuda: cannot allocate %zu bytes: %s", bytes,
                               cudaGetErrorString(err));
    }
    return NOPAD_OK;
}

static void cu_free(nopad_backend *be, void *ptr) {
    if (ptr) cudaFree(ptr);
}

static nopad_status reserve_scratch(cuda_state *s, size_t bytes) {
    if (bytes <= s->scratch_bytes) return NOPAD_OK;
    if (s->scratch) cudaFree(s->scratch);
    s->scratch = NULL;
    s->scratch_bytes = 0;
    cudaError_t err = cudaMalloc((void **)&s->scratch, bytes);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cuda: cannot allocate %zu bytes of staging: %s",
                               bytes, cudaGetErrorString(err));
    }
    s->scratch_bytes = bytes;
    return NOPAD_OK;
}

static nopad_status cu_upload_f32(nopad_backend *be, void *dst, const float *src, size_t n) {
    cuda_state *s = state_of(be);
    nopad_status st = reserve_scratch(s, n * sizeof(float));
    be->extra_bytes = FIXED_EXTRA_BYTES + s->scratch_bytes;
    if (st != NOPAD_OK) return st;
    st = cuda_check(cudaMemcpyAsync(s->scratch, src, n * sizeof(float), cudaMemcpyHostToDevice, s->stream),
                    "upload");
    if (st == NOPAD_OK) st = cuda_convert_from_f32(be->dtype, dst, s->scratch, n, s->stream);
    /* the caller may reuse `src` and the scratch at once: wait (only at load time) */
    if (st == NOPAD_OK) st = cuda_check(cudaStreamSynchronize(s->stream), "upload");
    return st;
}

static nopad_status cu_download_f32(nopad_backend *be, float *dst, const void *src, size_t n) {
    cuda_state *s = state_of(be);
    nopad_status st = reserve_scratch(s, n * sizeof(float));
    be->extra_bytes = FIXED_EXTRA_BYTES + s->scratch_bytes;
    if (st != NOPAD_OK) return st;
    st = cuda_convert_to_f32(be->dtype, s->scratch, src, n, s->stream);
    if (st == NOPAD_OK)
        st = cuda_check(cudaMemcpyAsync(dst, s->scratch, n * sizeof(float), cudaMemcpyDeviceToHost, s->stream),
                        "download");
    if (st == NOPAD_OK) st = cuda_check(cudaStreamSynchronize(s->stream), "download");
    return st;
}

static nopad_status cu_upload_i32(nopad_backend *be, int32_t *dst, const int32_t *src, size_t n) {
    return cuda_check(cudaMemcpyAsync(dst, src, n * sizeof(int32_t), cudaMemcpyHostToDevice,
                                      state_of(be)->stream), "upload");
}

static void cu_release_staging(nopad_backend *be) {
    cuda_state *s = state_of(be);
    cudaStreamSynchronize(s->stream);
    if (s->scratch) cudaFree(s->scratch);
    s->scratch = NULL;
    s->scratch_bytes = 0;
    be->extra_bytes = FIXED_EXTRA_BYTES;
}

static nopad_status cu_synchronize(nopad_backend *be) {
    return cuda_check(cudaStreamSynchronize(state_of(be)->stream), "synchronize");
}

static nopad_status cu_copy(nopad_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes) return NOPAD_OK;
    return cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, state_of(be)->stream), "copy");
}

static nopad_status cu_pack_padded(nopad_backend *be, const int32_t *tokens, const int32_t *types,
                                   const int32_t *lengths, int32_t n_seqs, int32_t max_len,
                                   int32_t max_seqlen, int32_t n_tokens, int32_t *cu_out,
                                   int32_t *tokens_out, int32_t *types_out) {
    cuda_state *s = state_of(be);
    return cuda_pack_padded(tokens, types, lengths, n_seqs, max_len, max_seqlen, n_tokens, cu_out,
                            tokens_out, types_out, s->pack_bad, s->stream);
}

static nopad_status cu_unpack_padded(nopad_backend *be, void *out, const void *x, const int32_t *cu,
                                     int32_t n_seqs, int32_t max_len, int32_t dim) {
    /* rows of F16 or BF16: two bytes an element */
    return cuda_unpack_padded(out, x, cu, n_seqs, max_len, (size_t)dim * 2, state_of(be)->stream);
}

/* ---- recorded graphs -------------------------------------------------------------------------- */

static void cu_graph_clear(nopad_backend *be) {
    cuda_state *s = state_of(be);
    if (s->n_graphs) cudaStreamSynchronize(s->stream); /* none may still be running */
    for (int i = 0; i < s->n_graphs; i++) cudaGraphExecDestroy(s->graphs[i].exec);
    s->n_graphs = 0;
    be->graphs_held = 0;
    memset(s->seen, 0, sizeof s->seen);
}

/* Records record(ctx) by stream capture (the kernels are noted, not run) into *exec. Any failure,
 * of the ops or of the capture, leaves *exec NULL with the CUDA error state cleared. */
static void record_graph(cuda_state *s, nopad_status (*record)(void *ctx), void *ctx,
                         cudaGraphExec_t *exec) {
    *exec = NULL;
    /* thread-local mode: other threads of the process may keep calling CUDA while we capture */
    if (cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    nopad_status st = record(ctx);
    cudaGraph_t graph = NULL;
    cudaError_t err = cudaStreamEndCapture(s->stream, &graph);
    if (st == NOPAD_OK && err == cudaSuccess && graph) err = cudaGraphInstantiate(exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (st != NOPAD_OK || err != cudaSuccess) {
        cudaGetLastError();
        *exec = NULL;
    }
}

/* A key is recorded the second time it is seen: a shape that comes once is not worth the
 * recording (about as long as running it, plus instantiation). */
static int seen_before(cuda_state *s, const int64_t key[4]) {
    for (int i = 0; i < SEEN_KEYS; i++)
        if (memcmp(s->seen[i], key, sizeof s->seen[i]) == 0) return 1;
    memcpy(s->seen[s->next_seen], key, sizeof s->seen[0]);
    s->next_seen = (s->next_seen + 1) % SEEN_KEYS;
    return 0;
}

static nopad_status cu_graph_run(nopad_backend *be, const int64_t key[4],
                                 nopad_status (*record)(void *ctx), void *ctx) {
    cuda_state *s = state_of(be);
    /* the caller is recording our stream into a graph of its own: the ops go there directly */
    enum cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s->stream, &capturing) != cudaSuccess) cudaGetLastError();
    if (capturing != cudaStreamCaptureStatusNone) return record(ctx);
    graph_entry *e = NULL;
    for (int i = 0; i < s->n_graphs && !e; i++)
        if (memcmp(s->graphs[i].key, key, sizeof s->graphs[i].key) == 0) e = &s->graphs[i];
    if (!e) {
        if (s->cannot_record || !seen_before(s, key)) return record(ctx);
        cudaGraphExec_t exec;
        record_graph(s, record, ctx, &exec);
        if (!exec) {
            /* run the ops directly: a genuine error shows there; if they succeed, it was the
             * capture that failed (e.g. a caller's stream that cannot be captured) */
            nopad_status st = record(ctx);
            if (st == NOPAD_OK) s->cannot_record = 1;
            return st;
        }
        if (s->n_graphs == GRAPH_CACHE_SIZE) { /* evict the least recently used */
            int lru = 0;
            for (int i = 1; i < s->n_graphs; i++)
                if (s->graphs[i].last_use < s->graphs[lru].last_use) lru = i;
            cudaStreamSynchronize(s->stream);
            cudaGraphExecDestroy(s->graphs[lru].exec);
            s->graphs[lru] = s->graphs[--s->n_graphs];
        }
        e = &s->graphs[s->n_graphs++];
        memcpy(e->key, key, sizeof e->key);
        e->exec = exec;
        be->graphs_recorded++;
        be->graphs_held = s->n_graphs;
    }
    e->last_use = ++s->graph_clock;
    be->graph_replays++;
    return cuda_check(cudaGraphLaunch(e->exec, s->stream), "graph launch");
}

/* ---- GEMM through cuBLASLt ------------------------------------------------------------------- */

static int lt_rank_wanted; /* gemm_fused.h: cuda_gemm_set_lt_rank */

int cuda_gemm_set_lt_rank(int rank) {
    lt_rank_wanted = rank < 0 ? 0 : rank > CUDA_GEMM_LT_MAX_RANK ? CUDA_GEMM_LT_MAX_RANK : rank;
    return lt_rank_wanted;
}

static void plan_destroy(gemm_plan *p) {
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    if (p->layout_w) cublasLtMatrixLayoutDestroy(p->layout_w);
    if (p->layout_x) cublasLtMatrixLayoutDestroy(p->layout_x);
    if (p->layout_y) cublasLtMatrixLayoutDestroy(p->layout_y);
    memset(p, 0, sizeof *p);
}

/* Row-major y[T, N] = x[T, K] · w[N, K]ᵀ is, in cuBLAS's column-major terms,
 * yᵀ[N, T] = op(w)[N, K] · xᵀ[K, T] with w seen as a K x N column-major matrix (op = transpose)
 * and x as K x T (no transpose). The bias epilogue adds a vector along N, the rows of yᵀ. */
static nopad_status plan_create(cuda_state *s, nopad_dtype dtype, int32_t T, int32_t K, int32_t N,
                                cublasLtEpilogue_t epilogue, int accumulate, gemm_plan *p) {
    memset(p, 0, sizeof *p);
    p->n_tokens = T;
    p->n_in = K;
    p->n_out = N;
    p->epilogue = (int)epilogue;
    p->accumulate = accumulate;
    p->lt_rank = lt_rank_wanted;
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
    if (st == NOPAD_OK) st = lt_check(cublasLtMatrixLayoutCreate(&p->layout_y, type, N, T, N), "layout y");
    if (st != NOPAD_OK) {
        plan_destroy(p);
        return st;
    }
    cublasLtMatmulPreference_t pref = NULL;
    size_t ws = CUBLASLT_WORKSPACE_BYTES;
    /* the first lt_rank + 1 answers; a rank past the last answer takes the last */
    cublasLtMatmulHeuristicResult_t results[CUDA_GEMM_LT_MAX_RANK + 1];
    int found = 0;
    st = lt_check(cublasLtMatmulPreferenceCreate(&pref), "preference");
    if (st == NOPAD_OK)
        st = lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                      "preference");
    if (st == NOPAD_OK)
        st = lt_check(cublasLtMatmulAlgoGetHeuristic(s->lt, p->desc, p->layout_w, p->layout_x, p->layout_y,
                                                     p->layout_y, pref, lt_rank_wanted + 1, results, &found),
                      "heuristic");
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (st == NOPAD_OK && found == 0)
        st = nopad_set_error(NOPAD_ERR_BACKEND, "cublasLt: no algorithm for a [%d, %d] x [%d, %d]ᵀ GEMM", T, K, N, K);
    if (st != NOPAD_OK) {
        plan_destroy(p);
        return st;
    }
    p->algo = results[lt_rank_wanted < found ? lt_rank_wanted : found - 1].algo;
    return NOPAD_OK;
}

static nopad_status find_plan(cuda_state *s, nopad_dtype dtype, int32_t T, int32_t K, int32_t N,
                              cublasLtEpilogue_t epilogue, int accumulate, gemm_plan **out) {
    for (int i = 0; i < s->n_plans; i++) {
        gemm_plan *p = &s->plans[i];
        if (p->n_tokens == T && p->n_in == K && p->n_out == N && p->epilogue == (int)epilogue &&
            p->accumulate == accumulate && p->lt_rank == lt_rank_wanted) {
            *out = p;
            return NOPAD_OK;
        }
    }
    if (s->n_plans == GEMM_CACHE_SIZE) { /* full: start over rather than grow without bound */
        for (int i = 0; i < s->n_plans; i++) plan_destroy(&s->plans[i]);
        s->n_plans = 0;
    }
    gemm_plan *p = &s->plans[s->n_plans];
    nopad_status st = plan_create(s, dtype, T, K, N, epilogue, accumulate, p);
    if (st != NOPAD_OK) return st;
    s->n_plans++;
    *out = p;
    return NOPAD_OK;
}

/* The skinny GEMM's form of a linear op's epilogue: bias and residual NULL where the epilogue
 * does not add them, the activation -1 where it applies none. */
typedef struct skinny_epilogue {
    const void *bias, *residual;
    int act;
} skinny_epilogue;

static skinny_epilogue skinny_epilogue_of(nopad_epilogue epilogue, const void *bias, const void *residual,
                                          nopad_activation act) {
    skinny_epilogue e = {epilogue == NOPAD_EPILOGUE_NONE ? NULL : bias,
                         epilogue == NOPAD_EPILOGUE_BIAS_RESIDUAL ? residual : NULL,
                         epilogue == NOPAD_EPILOGUE_BIAS_ACT ? (int)act : -1};
    return e;
}

static nopad_status cu_linear(nopad_backend *be, void *out, const void *x, const void *w,
                              const void *bias, const void *residual, int32_t n_tokens,
                              int32_t n_in, int32_t n_out, nopad_epilogue epilogue,
                              nopad_activation act) {
    cuda_state *s = state_of(be);
    if (n_tokens == 0) return NOPAD_OK;
    /* ---- a few tokens (gemm_skinny.h): one kernel with every epilogue, weights read by all SMs;
     * shapes it does not take come back UNSUPPORTED and go on below */
    const skinny_epilogue se = skinny_epilogue_of(epilogue, bias, residual, act);
    if (cuda_gemm_skinny_wins(n_tokens, n_in, n_out)) {
        nopad_status sst = cuda_gemm_skinny(be->dtype, out, x, w, se.bias, se.residual, n_tokens, n_in,
                                            n_out, se.act, s->stream);
        if (sst != NOPAD_ERR_UNSUPPORTED) return sst;
    }
    /* ---- CUTLASS with the epilogue fused (gemm_fused.h): for the exact-erf GELU, which cuBLASLt
     * cannot fuse, and wherever NOPAD_GEMM=cutlass|auto picks it; shapes it does not take
     * (K or N not multiples of 8, ...) come back UNSUPPORTED and go on to cuBLASLt below. */
    const int fused_ep = epilogue == NOPAD_EPILOGUE_BIAS_ACT
                             ? (act == NOPAD_ACT_GELU ? CUDA_GEMM_BIAS_GELU_ERF : -1)
                         : epilogue == NOPAD_EPILOGUE_BIAS_RESIDUAL ? CUDA_GEMM_BIAS_RESIDUAL
                                                                    : CUDA_GEMM_BIAS;
    if (fused_ep >= 0 && cuda_gemm_use_fused(n_tokens, n_in, n_out, (cuda_gemm_epilogue)fused_ep)) {
        nopad_status fst = cuda_gemm_fused(be->dtype, out, x, w, epilogue == NOPAD_EPILOGUE_NONE ? NULL : bias,
                                           residual, n_tokens, n_in, n_out, (cuda_gemm_epilogue)fused_ep,
                                           s->stream);
        if (fst != NOPAD_ERR_UNSUPPORTED) return fst;
    }
    /* ---- cuBLASLt ---- */
    cublasLtEpilogue_t lt_epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    int separate_activation = 0;
    switch (epilogue) {
    case NOPAD_EPILOGUE_NONE: break;
    case NOPAD_EPILOGUE_BIAS:
    case NOPAD_EPILOGUE_BIAS_RESIDUAL: lt_epilogue = CUBLASLT_EPILOGUE_BIAS; break;
    case NOPAD_EPILOGUE_BIAS_ACT:
        /* cuBLASLt's GELU is the tanh approximation: exact-erf GELU gets its own pass. */
        if (act == NOPAD_ACT_GELU_TANH) lt_epilogue = CUBLASLT_EPILOGUE_GELU_BIAS;
        else if (act == NOPAD_ACT_RELU) lt_epilogue = CUBLASLT_EPILOGUE_RELU_BIAS;
        else separate_activation = 1;
        break;
    }
    const int accumulate = epilogue == NOPAD_EPILOGUE_BIAS_RESIDUAL;
    gemm_plan *p;
    nopad_status st = find_plan(s, be->dtype, n_tokens, n_in, n_out, lt_epilogue, accumulate, &p);
    if (st != NOPAD_OK) return st;
    if (lt_epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        st = lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
                      "bias");
        if (st != NOPAD_OK) return st;
    }
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const void *c = accumulate ? residual : out;
    st = lt_check(cublasLtMatmul(s->lt, p->desc, &alpha, w, p->layout_w, x, p->layout_x, &beta, c,
                                 p->layout_y, out, p->layout_y, &p->algo, s->lt_workspace,
                                 CUBLASLT_WORKSPACE_BYTES, s->stream),
                  "matmul");
    if (st == NOPAD_OK && separate_activation)
        st = cuda_bias_activation(be->dtype, out, bias, n_tokens, n_out, act, s->stream);
    return st;
}

/* ---- the other ops ------------------------------------------------------------------------- */

static nopad_status cu_embed_layernorm(nopad_backend *be, void *out, const int32_t *tokens,
                                       const int32_t *types, const nopad_seqs *seqs,
                                       int32_t position_offset, int32_t vocab_size,
                                       int32_t n_positions, int32_t type_vocab_size,
                                       const void *word, const void *pos, const void *type,
                                       const void *ln_weight, const void *ln_bias, float eps,
                                       int32_t dim) {
    return cuda_embed_layernorm(be->dtype, out, tokens, types, seqs->cu_seqlens, seqs->n_seqs,
                                seqs->n_tokens, position_offset, vocab_size, n_positions,
                                type_vocab_size, word, pos,
                                type, ln_weight, ln_bias, eps, dim, state_of(be)->stream);
}

static nopad_status cu_bias_residual_layernorm(nopad_backend *be, void *x, const void *bias,
                                               const void *residual, const void *ln_weight,
                                               const void *ln_bias, float eps, int32_t n_tokens,
                                               int32_t dim) {
    return cuda_bias_residual_layernorm(be->dtype, x, bias, residual, ln_weight, ln_bias, eps,
                                        n_tokens, dim, state_of(be)->stream);
}

static nopad_status cu_attention_varlen(nopad_backend *be, void *out, const void *qkv,
                                        const nopad_seqs *seqs, int32_t n_heads, int32_t head_size,
                                        float scale, int causal) {
    if (head_size != 32 && head_size != 64 && head_size != 128)
        return cuda_attention_varlen_generic(be->dtype, out, qkv, seqs->cu_seqlens, seqs->n_seqs,
                                             seqs->n_tokens, n_heads, head_size, scale, causal,
                                             state_of(be)->stream);
    return cuda_attention_varlen(be->dtype, out, qkv, seqs->cu_seqlens, seqs->n_seqs,
                                 seqs->n_tokens, seqs->max_seqlen, n_heads, head_size, scale, causal,
                                 state_of(be)->attention_ws, state_of(be)->stream);
}

/* Every op and shape, except attention heads over 128 (the generic kernel's limit). */
static int cu_supports(nopad_backend *be, nopad_op op, const nopad_op_shape *shape) {
    (void)be;
    if (op == NOPAD_OP_ATTENTION && shape) return shape->head_size >= 1 && shape->head_size <= 128;
    return 1;
}

static nopad_status cu_pool(nopad_backend *be, void *out, const void *x, const nopad_seqs *seqs,
                            int32_t dim, nopad_pooling mode) {
    return cuda_pool(be->dtype, out, x, seqs->cu_seqlens, seqs->n_seqs, dim, mode, state_of(be)->stream);
}

static nopad_status cu_l2_normalize(nopad_backend *be, void *x, int32_t rows, int32_t dim) {
    return cuda_l2_normalize(be->dtype, x, rows, dim, state_of(be)->stream);
}

static void cu_destroy(nopad_backend *be) {
    cuda_state *s = state_of(be);
    if (s) {
        if (s->stream) cudaStreamSynchronize(s->stream);
        for (int i = 0; i < s->n_graphs; i++) cudaGraphExecDestroy(s->graphs[i].exec);
        for (int i = 0; i < s->n_plans; i++) plan_destroy(&s->plans[i]);
        if (s->lt) cublasLtDestroy(s->lt);
        if (s->lt_workspace) cudaFree(s->lt_workspace);
        if (s->scratch) cudaFree(s->scratch);
        if (s->pack_bad) cudaFree(s->pack_bad);
        if (s->attention_ws) cudaFree(s->attention_ws);
        if (s->own_stream && s->stream) cudaStreamDestroy(s->stream);
        free(s);
    }
    free(be);
}

cudaStream_t cuda_backend_stream(nopad_backend *be) { return state_of(be)->stream; }

nopad_status nopad_backend_cuda_create(nopad_dtype dtype, int device, void *stream, nopad_backend **out) {
    *out = NULL;
    if (dtype != NOPAD_DTYPE_F16 && dtype != NOPAD_DTYPE_BF16)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "cuda: compute dtype must be F16 or BF16 (F32 runs on the CPU backend)");
    int n_devices = 0;
    cudaError_t err = cudaGetDeviceCount(&n_devices);
    if (err != cudaSuccess || n_devices == 0) {
        cudaGetLastError();
        return nopad_set_error(NOPAD_ERR_BACKEND, "cuda: no usable GPU (%s)",
                               err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    }
    if (device < 0 || device >= n_devices)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cuda: device %d does not exist (this machine has %d: 0..%d)",
                               device, n_devices, n_devices - 1);
    /* the backend's stream, handle and buffers belong to this device; every op of the backend
     * runs with it current (cuda_use_device) */
    err = cudaSetDevice(device);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return nopad_set_error(NOPAD_ERR_BACKEND, "cuda: cannot use device %d: %s", device, cudaGetErrorString(err));
    }
    nopad_backend *be = calloc(1, sizeof *be);
    cuda_state *s = calloc(1, sizeof *s);
    if (!be || !s) {
        free(be);
        free(s);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cuda: cannot allocate the backend");
    }
    be->impl = s;
    be->destroy = cu_destroy;
    s->device = device;
    nopad_status st = NOPAD_OK;
    if (stream) {
        s->stream = (cudaStream_t)stream;
    } else {
        st = cuda_check(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "stream");
        s->own_stream = st == NOPAD_OK;
    }
    if (st == NOPAD_OK) st = lt_check(cublasLtCreate(&s->lt), "create");
    if (st == NOPAD_OK) st = cuda_check(cudaMalloc(&s->lt_workspace, CUBLASLT_WORKSPACE_BYTES), "workspace");
    if (st == NOPAD_OK) st = cuda_check(cudaMalloc((void **)&s->pack_bad, sizeof(int32_t)), "flag");
    if (st == NOPAD_OK) st = cuda_check(cudaMalloc(&s->attention_ws, NOPAD_ATTENTION_WORKSPACE_BYTES), "workspace");
    /* zeroed on the backend's stream, which may not synchronise with the legacy default one */
    if (st == NOPAD_OK)
        st = cuda_check(cudaMemsetAsync(s->attention_ws, 0, NOPAD_ATTENTION_WORKSPACE_BYTES, s->stream), "workspace");
    if (st == NOPAD_OK) st = cuda_check(cudaStreamSynchronize(s->stream), "workspace");
    if (st != NOPAD_OK) {
        cu_destroy(be);
        return st;
    }
    be->name = "cuda";
    be->dtype = dtype;
    be->extra_bytes = FIXED_EXTRA_BYTES;
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->upload_f32 = cu_upload_f32;
    be->download_f32 = cu_download_f32;
    be->upload_i32 = cu_upload_i32;
    be->synchronize = cu_synchronize;
    be->release_staging = cu_release_staging;
    be->copy = cu_copy;
    be->graph_run = cu_graph_run;
    be->graph_clear = cu_graph_clear;
    be->supports = cu_supports;
    be->pack = cu_pack_padded;
    be->unpack = cu_unpack_padded;
    be->embed = cu_embed_layernorm;
    be->gemm = cu_linear;
    be->layernorm = cu_bias_residual_layernorm;
    be->attention = cu_attention_varlen;
    be->pool = cu_pool;
    be->l2_normalize = cu_l2_normalize;
    *out = be;
    return NOPAD_OK;
}

#endif /* NOPAD_HAVE_CUDA */

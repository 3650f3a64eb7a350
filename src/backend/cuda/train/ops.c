/* CUDA training ops of the elementwise, normalisation and loss family (backend.h, section
 * "training"): zero, activation(_backward), dropout, layernorm_backward, embed_backward,
 * scatter_add_rows, select_rows, cross_entropy, squared_error. Each adapter makes the backend's
 * device current and enqueues the kernels of train_kernels.h on the backend's stream: no host
 * synchronisation, so a training step can be recorded in a CUDA graph. */
#ifdef NOPAD_HAVE_CUDA

#include <cuda_runtime.h>

#include "backend/cuda/state.h"
#include "backend/cuda/train/train_kernels.h"
#include "backend/cuda/train/train_ops.h"
#include "util/error.h"

/* The float32 partial sums of the column sums (bias and LayerNorm gradients) live in the backend's
 * split_ws, its scratch for results that end within one op (the decoder attention uses it the
 * same way; ops on one stream never overlap). The size asked for depends on the width only, not
 * on the token count, so a step's first run grows it and the graphs recorded later keep naming the
 * same buffer. Growing frees the old buffer: graphs that name it are forgotten first, and nothing
 * may grow while a graph is being recorded (graph_run records a key the second time it comes). */
static nopad_status partial_scratch(nopad_backend *be, cuda_state *s, size_t floats, float **out) {
    const size_t need = floats * sizeof(float);
    *out = NULL;
    if (need > s->split_ws_bytes) {
        enum cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(s->stream, &capturing) != cudaSuccess) cudaGetLastError();
        if (capturing != cudaStreamCaptureStatusNone)
            return nopad_set_error(NOPAD_ERR_INTERNAL,
                                   "cuda training scratch: must grow to %zu bytes during a graph recording", need);
        if (s->split_ws) {
            cuda_graph_clear(be);
            nopad_status st = cuda_check(cudaStreamSynchronize(s->stream), "training scratch");
            if (st != NOPAD_OK) return st;
            cudaFree(s->split_ws);
            s->split_ws = NULL;
            s->split_ws_bytes = 0;
        }
        nopad_status st = cuda_check(cudaMalloc((void **)&s->split_ws, need), "training scratch");
        if (st != NOPAD_OK) {
            s->split_ws = NULL;
            return st;
        }
        s->split_ws_bytes = need;
    }
    *out = s->split_ws;
    return NOPAD_OK;
}

static nopad_status cu_zero(nopad_backend *be, void *dst, size_t bytes) {
    CUDA_ENTER(be, s);
    if (bytes == 0) return NOPAD_OK;
    return cuda_check(cudaMemsetAsync(dst, 0, bytes, s->stream), "zero");
}

static nopad_status cu_activation(nopad_backend *be, void *y, const void *x, int32_t n_tokens, int32_t dim,
                                  nopad_activation act) {
    CUDA_ENTER(be, s);
    return cuda_train_activation(be->dtype, y, x, (int64_t)n_tokens * dim, act, s->stream);
}

static nopad_status cu_activation_backward(nopad_backend *be, void *dx, float *db32, const void *dy, const void *x,
                                           int32_t n_tokens, int32_t dim, nopad_activation act) {
    CUDA_ENTER(be, s);
    if (n_tokens <= 0 || dim <= 0) return NOPAD_OK;
    float *partial32 = NULL;
    if (db32) {
        nopad_status st = partial_scratch(be, s, cuda_train_activation_backward_scratch_floats(dim), &partial32);
        if (st != NOPAD_OK) return st;
    }
    return cuda_train_activation_backward(be->dtype, dx, db32, dy, x, n_tokens, dim, act, partial32, s->stream);
}

static nopad_status cu_dropout(nopad_backend *be, void *y, const void *x, const void *residual,
                               const nopad_seqs *seqs, const int64_t *examples, int32_t dim, float p, uint64_t key,
                               uint32_t site) {
    CUDA_ENTER(be, s);
    return cuda_train_dropout(be->dtype, y, x, residual, seqs->cu_seqlens, seqs->n_seqs, examples, seqs->n_tokens,
                              dim, p, key, site, s->stream);
}

static nopad_status cu_layernorm_backward(nopad_backend *be, void *ds, float *dw32, float *db32, float *dbias32,
                                          const void *dy, const void *x, const void *w, float eps,
                                          int32_t n_tokens, int32_t dim) {
    CUDA_ENTER(be, s);
    if (n_tokens <= 0) return NOPAD_OK;
    float *partial32 = NULL;
    nopad_status st = partial_scratch(be, s, cuda_train_layernorm_backward_scratch_floats(dim), &partial32);
    if (st != NOPAD_OK) return st;
    return cuda_train_layernorm_backward(be->dtype, ds, dw32, db32, dbias32, dy, x, w, eps, n_tokens, dim, partial32,
                                         s->stream);
}

static nopad_status cu_embed_backward(nopad_backend *be, float *d_word32, float *d_pos32, float *d_type32,
                                      float *d_ln_w32, float *d_ln_b32, void *dy, const int32_t *tokens,
                                      const int32_t *types, const nopad_seqs *seqs, int32_t position_offset,
                                      const void *word, const void *pos, const void *type, const void *ln_weight,
                                      float eps, int32_t dim) {
    CUDA_ENTER(be, s);
    if (seqs->n_tokens <= 0) return NOPAD_OK;
    float *partial32 = NULL;
    nopad_status st = partial_scratch(be, s, cuda_train_embed_backward_scratch_floats(dim), &partial32);
    if (st != NOPAD_OK) return st;
    return cuda_train_embed_backward(be->dtype, d_word32, d_pos32, d_type32, d_ln_w32, d_ln_b32, dy, tokens, types,
                                     seqs->cu_seqlens, seqs->n_seqs, seqs->n_tokens, position_offset, word, pos,
                                     type, ln_weight, eps, dim, partial32, s->stream);
}

static nopad_status cu_scatter_add_rows(nopad_backend *be, void *x, const int32_t *rows, const void *src, int32_t n,
                                        int32_t dim) {
    CUDA_ENTER(be, s);
    return cuda_train_scatter_add_rows(be->dtype, x, rows, src, n, dim, s->stream);
}

static nopad_status cu_select_rows(nopad_backend *be, void *out, const void *x, const int32_t *rows, int32_t n,
                                   int32_t dim) {
    CUDA_ENTER(be, s);
    return cuda_train_select_rows(be->dtype, out, x, rows, n, dim, s->stream);
}

static nopad_status cu_cross_entropy(nopad_backend *be, float *losses32, void *dlogits, const void *logits,
                                     const int32_t *labels, int32_t n, int32_t classes, float grad_scale) {
    CUDA_ENTER(be, s);
    return cuda_train_cross_entropy(be->dtype, losses32, dlogits, logits, labels, n, classes, grad_scale, s->stream);
}

static nopad_status cu_squared_error(nopad_backend *be, float *losses32, void *dpred, const void *pred,
                                     const float *target32, int32_t n, float grad_scale) {
    CUDA_ENTER(be, s);
    return cuda_train_squared_error(be->dtype, losses32, dpred, pred, target32, n, grad_scale, s->stream);
}

void cuda_train_install_ops(nopad_backend *be) {
    be->zero = cu_zero;
    be->activation = cu_activation;
    be->activation_backward = cu_activation_backward;
    be->dropout = cu_dropout;
    be->layernorm_backward = cu_layernorm_backward;
    be->embed_backward = cu_embed_backward;
    be->scatter_add_rows = cu_scatter_add_rows;
    be->select_rows = cu_select_rows;
    be->cross_entropy = cu_cross_entropy;
    be->squared_error = cu_squared_error;
}

#endif /* NOPAD_HAVE_CUDA */

/* Contexts: running batches on a loaded model. A context owns what a stream of work mutates (the
 * workspace, the backend's stream and recorded graphs); nopad_encode checks a batch, packs it if
 * it is padded, runs the encoder and pools, on that context alone. */
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "util/error.h"

nopad_context_params nopad_context_default_params(void) {
    nopad_context_params p = {.max_batch_tokens = 0, .cuda_stream = NULL, .cuda_graph_max_tokens = 0,
                              .kv_cache_tokens = 0, .kv_block_size = 0};
    return p;
}

nopad_encode_params nopad_encode_default_params(void) {
    nopad_encode_params p = {.pooling = NOPAD_POOLING_MODEL, .normalize = -1, .batch_tokens = 0};
    return p;
}

nopad_status context_create_backend(const nopad_model_params *p, void *cuda_stream, nopad_backend **out) {
    const nopad_backend_params bp = {.device = p->device, .device_index = p->device_index, .dtype = p->dtype,
                                     .n_threads = p->n_threads, .cuda_stream = cuda_stream};
    return nopad_backend_create(&bp, out);
}

nopad_status context_create(nopad_model *model, const nopad_context_params *params, nopad_backend *be,
                            nopad_context **out) {
    *out = NULL;
    nopad_context *c = calloc(1, sizeof *c);
    if (!c) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_context_create: out of memory");
    c->model = model;
    c->params = params ? *params : nopad_context_default_params();
    pthread_mutex_init(&c->lock, NULL);
    nopad_status st = NOPAD_OK;
    if (be) {
        c->be = be;
    } else {
        st = context_create_backend(&model->params, c->params.cuda_stream, &c->be);
        c->owns_backend = 1;
    }
    if (st == NOPAD_OK && model->cfg.causal) {
        if (!c->be->attention_paged)
            st = nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                 "decoder models do not run on the %s backend",
                                 c->be->name);
        else
            st = decoder_state_init(c->be, &model->cfg, &model->dec, c->params.max_batch_tokens,
                                    c->params.kv_cache_tokens, c->params.kv_block_size, &c->dec);
    } else if (st == NOPAD_OK && c->params.max_batch_tokens > 0)
        st = encoder_workspace_reserve(c->be, &model->cfg, &model->weights.tp, &c->ws,
                                       c->params.max_batch_tokens, c->params.max_batch_tokens);
    /* the other ranks of a split model make the same context */
    if (st == NOPAD_OK) st = tp_context_created(c);
    if (st != NOPAD_OK) {
        context_destroy(c);
        return st;
    }
    *out = c;
    return NOPAD_OK;
}

nopad_status nopad_context_create(nopad_model *model, const nopad_context_params *params,
                                  nopad_context **out) {
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_context_create: out is NULL");
    *out = NULL;
    if (!model) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_context_create: model is NULL");
    return context_create(model, params, NULL, out);
}

void nopad_context_free(nopad_context *c) {
    /* the model's own context goes with the model (nopad_model_free) */
    if (!c || (c->model && c->model->context == c)) return;
    context_destroy(c);
}

void context_destroy(nopad_context *c) {
    if (!c) return;
    tp_context_freed(c);
    if (c->be) {
        encoder_workspace_free(c->be, &c->ws);
        decoder_state_free(c->be, &c->model->cfg, &c->dec);
        /* the default context's backend holds the weights: the model destroys it */
        if (c->owns_backend) c->be->destroy(c->be);
    }
    pthread_mutex_destroy(&c->lock);
    free(c);
}

nopad_status nopad_context_get_stats(const nopad_context *c, nopad_model_stats *out) {
    if (!c || !out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_context_get_stats: NULL argument");
    pthread_mutex_lock((pthread_mutex_t *)&c->lock);
    out->forwards = c->forwards;
    out->graph_replays = c->be->graph_replays;
    out->graphs_recorded = c->be->graphs_recorded;
    out->graphs_held = c->be->graphs_held;
    pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
    return NOPAD_OK;
}

nopad_status nopad_context_memory(const nopad_context *c, size_t *workspace_bytes, size_t *backend_bytes) {
    if (!c) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_context_memory: context is NULL");
    if (workspace_bytes) *workspace_bytes = c->ws.bytes + c->dec.bytes;
    if (backend_bytes) *backend_bytes = c->be->extra_bytes;
    return NOPAD_OK;
}

/* ---- checks ------------------------------------------------------------------------------- */

static int32_t longest_allowed(const nopad_model *m) {
    return m->cfg.max_position_embeddings - m->cfg.position_offset;
}

/* Checks a host packed batch against the model; returns the longest sequence in *max_seqlen. */
static nopad_status validate_host_packed(const nopad_model *m, int32_t n_seqs, const int32_t *cu_seqlens,
                                         const int32_t *tokens, const int32_t *types, int32_t *max_seqlen) {
    if (n_seqs <= 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "empty batch: n_seqs is %d, need >= 1", n_seqs);
    if (!cu_seqlens || !tokens)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cu_seqlens and tokens must not be NULL");
    if (cu_seqlens[0] != 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cu_seqlens[0] is %d, must be 0", cu_seqlens[0]);
    const int32_t limit = longest_allowed(m);
    *max_seqlen = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        int64_t len = (int64_t)cu_seqlens[s + 1] - cu_seqlens[s];
        if (len < 1)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "sequence %d is empty or cu_seqlens decreases (cu_seqlens[%d] = %d, "
                                   "cu_seqlens[%d] = %d); every sequence needs >= 1 token",
                                   s, s, cu_seqlens[s], s + 1, cu_seqlens[s + 1]);
        if (len > limit)
            return nopad_set_error(NOPAD_ERR_TOO_LONG, "sequence %d has %lld tokens, the model accepts at most %d",
                                   s, (long long)len, limit);
        if (len > *max_seqlen) *max_seqlen = (int32_t)len;
    }
    const int32_t tv = m->cfg.type_vocab_size > 0 ? m->cfg.type_vocab_size : 1;
    for (int32_t s = 0; s < n_seqs; s++) {
        for (int32_t t = cu_seqlens[s]; t < cu_seqlens[s + 1]; t++) {
            if (tokens[t] < 0 || tokens[t] >= m->cfg.vocab_size)
                return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                       "token id %d at sequence %d, position %d is outside the "
                                       "vocabulary [0, %d)",
                                       tokens[t], s, t - cu_seqlens[s], m->cfg.vocab_size);
            if (types && (types[t] < 0 || types[t] >= tv))
                return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                       "token type id %d at sequence %d, position %d is outside [0, %d)",
                                       types[t], s, t - cu_seqlens[s], tv);
        }
    }
    return NOPAD_OK;
}

/* Resolves the folder defaults of `params` and checks them against the requested outputs. */
static nopad_status resolve_encode_params(const nopad_model *m, const nopad_encode_params *params,
                                          int has_hidden, int has_pooled, const char *who,
                                          nopad_pooling *pooling, int *normalize) {
    nopad_encode_params p = params ? *params : nopad_encode_default_params();
    *pooling = p.pooling == NOPAD_POOLING_MODEL ? m->pipeline.pooling : p.pooling;
    *normalize = p.normalize < 0 ? m->pipeline.normalize : p.normalize != 0;
    if (*pooling < NOPAD_POOLING_NONE || *pooling > NOPAD_POOLING_MAX)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "pooling %d is not one of none, cls, mean, max",
                               (int)*pooling);
    if (has_pooled && *pooling == NOPAD_POOLING_NONE)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "pooled output requested but pooling is none");
    if (!has_hidden && !has_pooled)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: both hidden_out and pooled_out are NULL", who);
    return NOPAD_OK;
}

/* The sizes a device batch is told rather than reads: max_seqlen within the model (and <= limit,
 * the other bound the layout has), and n_tokens within max_batch_tokens. */
static nopad_status check_device_sizes(const nopad_context *c, int32_t n_tokens, int32_t max_seqlen,
                                       int32_t limit, const char *limit_name) {
    const int32_t model_limit = longest_allowed(c->model);
    if (max_seqlen < 1 || max_seqlen > model_limit || max_seqlen > limit)
        return nopad_set_error(max_seqlen > model_limit ? NOPAD_ERR_TOO_LONG : NOPAD_ERR_INVALID_ARGUMENT,
                               "max_seqlen %d: must be in [1, %d] (the model maximum) and <= %s (%d)",
                               max_seqlen, model_limit, limit_name, limit);
    if (c->params.max_batch_tokens > 0 && n_tokens > c->params.max_batch_tokens)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "batch has %d tokens, more than max_batch_tokens = %d; split it",
                               n_tokens, c->params.max_batch_tokens);
    return NOPAD_OK;
}

/* ---- one forward ---------------------------------------------------------------------------- */

/* Forwards of at most this many tokens replay recorded graphs (CUDA) by default. Below it the host
 * launching ~8 kernels per layer is as slow as the GPU running them; above it the launches hide
 * behind the GPU's work and the bucket's slack rows would only cost. */
enum { DEFAULT_GRAPH_MAX_TOKENS = 2048 };

/* The rows a forward of T tokens runs on: its bucket when the layers replay a recorded graph,
 * else 0 (the ops are launched directly on exactly T rows). */
static int32_t graph_rows(const nopad_context *c, int32_t T) {
    const int32_t limit = c->params.cuda_graph_max_tokens ? c->params.cuda_graph_max_tokens
                                                          : DEFAULT_GRAPH_MAX_TOKENS;
    if (!c->be->supports(c->be, NOPAD_OP_GRAPH, NULL) || limit < 0 || T > limit) return 0;
    const int32_t rows = encoder_token_bucket(T);
    if (c->params.max_batch_tokens > 0 && rows > c->params.max_batch_tokens) return 0;
    return rows;
}

typedef struct layers_call {
    nopad_context *c;
    nopad_seqs seqs; /* n_tokens = the bucket's rows; cu_seqlens in the workspace */
} layers_call;

static nopad_status record_layers(void *arg) {
    layers_call *call = arg;
    nopad_context *c = call->c;
    return encoder_layers(c->be, &c->model->cfg, &c->model->weights, &c->ws, &call->seqs,
                          call->seqs.n_tokens, c->ws.hidden);
}

/* Runs the encoder on a checked batch whose ids and cu_seqlens are in backend memory, with the
 * workspace already reserved for `rows` (graph_rows) or T tokens. The last hidden states end in
 * `hidden` [T, H]: ws->hidden, or a caller's device buffer. */
nopad_status context_run_encoder(nopad_context *c, const nopad_seqs *seqs, int32_t rows,
                                 const int32_t *tokens, const int32_t *types, void *hidden) {
    nopad_backend *be = c->be;
    const nopad_model *m = c->model;
    encoder_workspace *ws = &c->ws;
    c->forwards++;
    if (!rows) return encoder_forward(be, &m->cfg, &m->weights, ws, seqs, tokens, types, hidden);
    /* The layers replay a graph recorded for this bucket, B and max_seqlen (rounded up to 64,
     * the granularity of the attention's tiles). Embeddings run outside it on exactly T rows; the
     * graph's rows past T are slack: row-wise ops carry them along and nothing reads them back. */
    if (ws->generation != c->graph_generation) {
        be->graph_clear(be);
        c->graph_generation = ws->generation;
    }
    const int32_t T = seqs->n_tokens, B = seqs->n_seqs;
    nopad_status st = NOPAD_OK;
    if (seqs->cu_seqlens != ws->cu_seqlens)
        st = be->copy(be, ws->cu_seqlens, seqs->cu_seqlens, ((size_t)B + 1) * sizeof(int32_t));
    if (st == NOPAD_OK) st = encoder_embed(be, &m->cfg, &m->weights, ws, seqs, tokens, types, ws->hidden);
    if (st != NOPAD_OK) return st;
    layers_call call = {.c = c,
                        .seqs = {.n_seqs = B, .n_tokens = rows,
                                 .max_seqlen = (seqs->max_seqlen + 63) / 64 * 64,
                                 .cu_seqlens = ws->cu_seqlens}};
    const int64_t key[4] = {rows, B, call.seqs.max_seqlen, 0};
    st = be->graph_run(be, key, record_layers, &call);
    if (st == NOPAD_OK && m->weights.tp.comm) st = comm_watch(m->weights.tp.comm, be); /* the replay's collectives */
    if (st == NOPAD_OK && hidden != ws->hidden)
        st = be->copy(be, hidden, ws->hidden, (size_t)T * m->cfg.hidden_size * nopad_dtype_size(be->dtype));
    return st;
}

/* pooled[B, H] from hidden[T, H] (and L2-normalised when asked), in backend memory. */
static nopad_status pool_rows(nopad_context *c, void *pooled, const void *hidden, const nopad_seqs *seqs,
                              nopad_pooling pooling, int normalize) {
    const int32_t H = c->model->cfg.hidden_size;
    nopad_status st = c->be->pool(c->be, pooled, hidden, seqs, H, pooling);
    if (st == NOPAD_OK && normalize) st = c->be->l2_normalize(c->be, pooled, seqs->n_seqs, H);
    return st;
}

/* One forward of a checked host packed batch (the context locked). */
static nopad_status forward_host(nopad_context *c, int32_t n_seqs, const int32_t *cu_seqlens,
                                 const int32_t *tokens, const int32_t *types, int32_t max_seqlen,
                                 nopad_pooling pooling, int normalize, float *hidden_out, float *pooled_out,
                                 float *logits_out) {
    nopad_backend *be = c->be;
    const int32_t T = cu_seqlens[n_seqs], H = c->model->cfg.hidden_size;
    if (c->params.max_batch_tokens > 0 && T > c->params.max_batch_tokens)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "batch has %d tokens, more than max_batch_tokens = %d; split it",
                               T, c->params.max_batch_tokens);
    const int32_t rows = graph_rows(c, T);
    nopad_status st = encoder_workspace_reserve(be, &c->model->cfg, &c->model->weights.tp, &c->ws,
                                                rows ? rows : T, n_seqs);
    if (st != NOPAD_OK) return st;
    encoder_workspace *ws = &c->ws;
    st = be->upload_i32(be, ws->tokens, tokens, (size_t)T);
    if (st == NOPAD_OK && types) st = be->upload_i32(be, ws->types, types, (size_t)T);
    if (st == NOPAD_OK) st = be->upload_i32(be, ws->cu_seqlens, cu_seqlens, (size_t)n_seqs + 1);
    if (st != NOPAD_OK) return st;
    nopad_seqs seqs = {.n_seqs = n_seqs, .n_tokens = T, .max_seqlen = max_seqlen, .cu_seqlens = ws->cu_seqlens};
    st = tp_encoder_forward(c, &seqs, rows, ws->tokens, types ? ws->types : NULL, ws->hidden);
    if (st != NOPAD_OK) return st;
    if (pooled_out) {
        st = pool_rows(c, ws->pooled, ws->hidden, &seqs, pooling, normalize);
        if (st == NOPAD_OK) st = be->download_f32(be, pooled_out, ws->pooled, (size_t)n_seqs * H);
        if (st != NOPAD_OK) return st;
    }
    if (logits_out) { // [B, L] the classification head's
        st = encoder_classify(be, &c->model->cfg, &c->model->weights, ws, &seqs, ws->hidden);
        if (st == NOPAD_OK)
            st = be->download_f32(be, logits_out, ws->logits, (size_t)n_seqs * c->model->cfg.head.num_labels);
        if (st != NOPAD_OK) return st;
    }
    if (hidden_out) st = be->download_f32(be, hidden_out, ws->hidden, (size_t)T * H);
    if (st == NOPAD_OK) st = be->synchronize(be);
    return st;
}

/* A host packed batch in forwards of at most `budget` tokens (<= 0: one), sequences in order. */
static nopad_status encode_host_packed(nopad_context *c, int32_t n_seqs, const int32_t *cu,
                                       const int32_t *tokens, const int32_t *types, int32_t budget,
                                       nopad_pooling pooling, int normalize, float *hidden_out,
                                       float *pooled_out, float *logits_out) {
    int32_t max_seqlen = 0;
    nopad_status st = validate_host_packed(c->model, n_seqs, cu, tokens, types, &max_seqlen);
    if (st != NOPAD_OK) return st;
    if (budget <= 0 || cu[n_seqs] <= budget) {
        pthread_mutex_lock(&c->lock);
        st = forward_host(c, n_seqs, cu, tokens, types, max_seqlen, pooling, normalize, hidden_out, pooled_out,
                          logits_out);
        pthread_mutex_unlock(&c->lock);
        return st;
    }
    const int32_t H = c->model->cfg.hidden_size;
    int32_t *part = malloc(((size_t)n_seqs + 1) * sizeof *part); /* one forward's cu_seqlens */
    if (!part) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "out of memory splitting the batch");
    pthread_mutex_lock(&c->lock);
    for (int32_t start = 0; start < n_seqs && st == NOPAD_OK;) {
        int32_t end = start + 1, longest = cu[end] - cu[start];
        while (end < n_seqs && cu[end + 1] - cu[start] <= budget) {
            if (cu[end + 1] - cu[end] > longest) longest = cu[end + 1] - cu[end];
            end++;
        }
        for (int32_t s = start; s <= end; s++) part[s - start] = cu[s] - cu[start];
        st = forward_host(c, end - start, part, tokens + cu[start], types ? types + cu[start] : NULL, longest,
                          pooling, normalize, hidden_out ? hidden_out + (size_t)cu[start] * H : NULL,
                          pooled_out ? pooled_out + (size_t)start * H : NULL,
                          logits_out ? logits_out + (size_t)start * c->model->cfg.head.num_labels : NULL);
        if (st != NOPAD_OK)
            st = nopad_wrap_error(st, "sequences %d-%d (a forward of at most %d tokens)", start, end - 1, budget);
        start = end;
    }
    pthread_mutex_unlock(&c->lock);
    free(part);
    return st;
}

/* A host padded batch: packed on the host, run as a packed one, unpacked into hidden_out. */
static nopad_status encode_host_padded(nopad_context *c, const nopad_batch *b, int32_t budget,
                                       nopad_pooling pooling, int normalize, float *hidden_out,
                                       float *pooled_out, float *logits_out) {
    const int32_t n_seqs = b->n_seqs, max_len = b->max_len;
    if (n_seqs <= 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "empty batch: n_seqs is %d, need >= 1", n_seqs);
    if (max_len <= 0 || !b->tokens || !b->lengths)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "padded batch: need max_len >= 1, tokens and lengths");
    int32_t *cu = malloc(((size_t)n_seqs + 1) * sizeof *cu);
    if (!cu) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "out of memory");
    cu[0] = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        if (b->lengths[s] < 1 || b->lengths[s] > max_len) {
            free(cu);
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "lengths[%d] = %d is outside [1, max_len = %d]", s,
                                   b->lengths[s], max_len);
        }
        if ((int64_t)cu[s] + b->lengths[s] > INT32_MAX) {
            free(cu);
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "batch has more than 2^31 tokens");
        }
        cu[s + 1] = cu[s] + b->lengths[s];
    }
    const int32_t T = cu[n_seqs], H = c->model->cfg.hidden_size;
    int32_t *tokens = malloc((size_t)T * sizeof(int32_t));
    int32_t *types = b->token_type_ids ? malloc((size_t)T * sizeof(int32_t)) : NULL;
    float *hidden = hidden_out ? malloc((size_t)T * H * sizeof(float)) : NULL;
    nopad_status st = NOPAD_OK;
    if (!tokens || (b->token_type_ids && !types) || (hidden_out && !hidden)) {
        st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "out of memory packing the batch");
        goto done;
    }
    for (int32_t s = 0; s < n_seqs; s++) {
        memcpy(tokens + cu[s], b->tokens + (size_t)s * max_len, (size_t)b->lengths[s] * sizeof(int32_t));
        if (types)
            memcpy(types + cu[s], b->token_type_ids + (size_t)s * max_len, (size_t)b->lengths[s] * sizeof(int32_t));
    }
    st = encode_host_packed(c, n_seqs, cu, tokens, types, budget, pooling, normalize, hidden, pooled_out,
                            logits_out);
    if (st == NOPAD_OK && hidden_out) {
        for (int32_t s = 0; s < n_seqs; s++) {
            float *dst = hidden_out + (size_t)s * max_len * H;
            memcpy(dst, hidden + (size_t)cu[s] * H, (size_t)b->lengths[s] * H * sizeof(float));
            memset(dst + (size_t)b->lengths[s] * H, 0, (size_t)(max_len - b->lengths[s]) * H * sizeof(float));
        }
    }
done:
    free(cu);
    free(tokens);
    free(types);
    free(hidden);
    return st;
}

/* A device packed batch, used in place (the context locked). */
static nopad_status encode_device_packed(nopad_context *c, const nopad_batch *b, nopad_pooling pooling,
                                         int normalize, void *hidden_out, void *pooled_out) {
    if (b->n_seqs <= 0 || b->n_tokens < b->n_seqs || !b->cu_seqlens || !b->tokens)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "device packed batch: need n_seqs >= 1, n_tokens >= n_seqs (got %d, %d), "
                               "cu_seqlens and tokens", b->n_seqs, b->n_tokens);
    nopad_status st = check_device_sizes(c, b->n_tokens, b->max_seqlen, b->n_tokens, "n_tokens");
    if (st != NOPAD_OK) return st;
    pthread_mutex_lock(&c->lock);
    const int32_t rows = graph_rows(c, b->n_tokens);
    st = encoder_workspace_reserve(c->be, &c->model->cfg, &c->model->weights.tp, &c->ws,
                                   rows ? rows : b->n_tokens, b->n_seqs);
    if (st == NOPAD_OK) {
        nopad_seqs seqs = {.n_seqs = b->n_seqs, .n_tokens = b->n_tokens, .max_seqlen = b->max_seqlen,
                           .cu_seqlens = b->cu_seqlens};
        /* without a graph the caller's buffer carries the residual stream (no copy at the end);
         * a graph names the workspace's, and the rows are copied out after it */
        void *hidden = hidden_out ? hidden_out : c->ws.hidden;
        st = tp_encoder_forward(c, &seqs, rows, b->tokens, b->token_type_ids, hidden);
        if (st == NOPAD_OK && pooled_out) st = pool_rows(c, pooled_out, hidden, &seqs, pooling, normalize);
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

/* A device padded batch: packed on the GPU, run, unpacked into hidden_out (the context locked). */
static nopad_status encode_device_padded(nopad_context *c, const nopad_batch *b, nopad_pooling pooling,
                                         int normalize, void *hidden_out, void *pooled_out) {
    const int32_t n_seqs = b->n_seqs, max_len = b->max_len, n_tokens = b->n_tokens;
    nopad_backend *be = c->be;
    if (!be->supports(be, NOPAD_OP_PACK, NULL))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "device padded batch: backend %s cannot pack on the device",
                               be->name);
    if (n_seqs <= 0 || max_len <= 0 || !b->tokens || !b->lengths)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "device padded batch: need n_seqs >= 1, max_len >= 1 (got %d, %d), tokens and "
                               "lengths", n_seqs, max_len);
    if (n_tokens < n_seqs || (int64_t)n_tokens > (int64_t)n_seqs * max_len)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "device padded batch: n_tokens %d must be in [n_seqs, n_seqs * max_len] = "
                               "[%d, %lld] (it is the sum of the lengths)",
                               n_tokens, n_seqs, (long long)n_seqs * max_len);
    nopad_status st = check_device_sizes(c, n_tokens, b->max_seqlen, max_len, "max_len");
    if (st != NOPAD_OK) return st;
    pthread_mutex_lock(&c->lock);
    const int32_t rows = graph_rows(c, n_tokens);
    st = encoder_workspace_reserve(be, &c->model->cfg, &c->model->weights.tp, &c->ws,
                                   rows ? rows : n_tokens, n_seqs);
    encoder_workspace *ws = &c->ws;
    const int32_t *types = b->token_type_ids;
    if (st == NOPAD_OK)
        st = be->pack(be, b->tokens, types, b->lengths, n_seqs, max_len, b->max_seqlen, n_tokens, ws->cu_seqlens,
                      ws->tokens, types ? ws->types : NULL);
    nopad_seqs seqs = {.n_seqs = n_seqs, .n_tokens = n_tokens, .max_seqlen = b->max_seqlen,
                       .cu_seqlens = ws->cu_seqlens};
    if (st == NOPAD_OK) st = tp_encoder_forward(c, &seqs, rows, ws->tokens, types ? ws->types : NULL, ws->hidden);
    if (st == NOPAD_OK && hidden_out)
        st = be->unpack(be, hidden_out, ws->hidden, ws->cu_seqlens, n_seqs, max_len, c->model->cfg.hidden_size);
    if (st == NOPAD_OK && pooled_out) st = pool_rows(c, pooled_out, ws->hidden, &seqs, pooling, normalize);
    pthread_mutex_unlock(&c->lock);
    return st;
}

nopad_status nopad_encode(nopad_context *c, const nopad_batch *b, const nopad_encode_params *params,
                          void *hidden_out, void *pooled_out) {
    if (!c || !b) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_encode: context or batch is NULL");
    if (b->layout != NOPAD_LAYOUT_PACKED && b->layout != NOPAD_LAYOUT_PADDED)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_encode: layout %d is not packed (0) or padded (1)",
                               (int)b->layout);
    if (c->model->cfg.causal)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_encode: %s is a decoder; use nopad_decode / nopad_generate",
                               c->model->cfg.model_type);
    nopad_pooling pooling = NOPAD_POOLING_NONE;
    int normalize = 0;
    nopad_status st = resolve_encode_params(c->model, params, hidden_out != NULL, pooled_out != NULL, "nopad_encode",
                                            &pooling, &normalize);
    if (st != NOPAD_OK) return st;
    if (b->on_device) {
        if (c->model->params.device != NOPAD_DEVICE_CUDA)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "nopad_encode: a device batch needs a model loaded on cuda; give host "
                                   "buffers (on_device = 0) on the cpu");
        return b->layout == NOPAD_LAYOUT_PACKED
                   ? encode_device_packed(c, b, pooling, normalize, hidden_out, pooled_out)
                   : encode_device_padded(c, b, pooling, normalize, hidden_out, pooled_out);
    }
    const int32_t budget = params ? params->batch_tokens : 0;
    if (b->layout == NOPAD_LAYOUT_PADDED)
        return encode_host_padded(c, b, budget, pooling, normalize, hidden_out, pooled_out, NULL);
    return encode_host_packed(c, b->n_seqs, b->cu_seqlens, b->tokens, b->token_type_ids, budget, pooling,
                              normalize, hidden_out, pooled_out, NULL);
}

nopad_status nopad_classify(nopad_context *c, const nopad_batch *b, int32_t batch_tokens, float *logits) {
    if (!c || !b || !logits)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_classify: context, batch or logits is NULL");
    const nopad_model *m = c->model;
    if (m->cfg.causal || !m->cfg.head.present)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_classify: the model in '%s' has no sequence-classification head "
                               "(config.json's architectures[0] is not a *ForSequenceClassification)",
                               m->dir);
    if (b->on_device)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "nopad_classify: takes host batches (on_device = 0) for now");
    if (b->layout == NOPAD_LAYOUT_PADDED)
        return encode_host_padded(c, b, batch_tokens, NOPAD_POOLING_NONE, 0, NULL, NULL, logits);
    if (b->layout != NOPAD_LAYOUT_PACKED)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_classify: layout %d is not packed (0) or padded (1)",
                               (int)b->layout);
    return encode_host_packed(c, b->n_seqs, b->cu_seqlens, b->tokens, b->token_type_ids, batch_tokens,
                              NOPAD_POOLING_NONE, 0, NULL, NULL, logits);
}

nopad_status nopad_classify_packed(nopad_model *m, int32_t n_seqs, const int32_t *cu_seqlens,
                                   const int32_t *tokens, const int32_t *token_type_ids, float *logits) {
    if (!m) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_classify_packed: model is NULL");
    const nopad_batch b = {.layout = NOPAD_LAYOUT_PACKED, .n_seqs = n_seqs, .tokens = tokens,
                           .token_type_ids = token_type_ids, .cu_seqlens = cu_seqlens};
    return nopad_classify(m->context, &b, 0, logits);
}

nopad_status nopad_encode_packed(nopad_model *m, int32_t n_seqs, const int32_t *cu_seqlens,
                                 const int32_t *tokens, const int32_t *token_type_ids,
                                 const nopad_encode_params *params, float *hidden_out, float *pooled_out) {
    if (!m) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_encode_packed: model is NULL");
    const nopad_batch b = {.layout = NOPAD_LAYOUT_PACKED, .on_device = 0, .n_seqs = n_seqs,
                           .tokens = tokens, .token_type_ids = token_type_ids, .cu_seqlens = cu_seqlens};
    return nopad_encode(m->context, &b, params, hidden_out, pooled_out);
}

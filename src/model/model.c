/* The public model object: loads a Hugging Face folder, validates packed batches, runs the
 * encoder on the chosen backend and pools. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#ifdef NOPAD_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "io/hf_config.h"
#include "io/st_pipeline.h"
#include "io/safetensors.h"
#include "model/encoder.h"
#include "util/error.h"
#include "util/file.h"

struct nopad_model {
    char *dir;
    nopad_model_params params;
    model_config cfg;
    st_pipeline pipeline;
    int32_t max_seq_length;
    nopad_backend *be;
    encoder_weights weights;
    encoder_workspace ws;
    nopad_tokenizer *tokenizer;
    const char *tokenizer_kind;
    pthread_mutex_t lock; /* one forward at a time: the workspace is shared */
    uint32_t graph_generation; /* the workspace generation the backend's graphs were recorded on */
    int64_t forwards;
};

nopad_model_params nopad_model_default_params(void) {
    nopad_model_params p = {.device = NOPAD_DEVICE_CPU, .device_index = 0, .dtype = NOPAD_DTYPE_F32, .n_threads = 0,
                            .max_batch_tokens = 0, .cuda_stream = NULL,
                            .cuda_graph_max_tokens = 0};
    return p;
}

nopad_encode_params nopad_encode_default_params(void) {
    nopad_encode_params p = {.pooling = NOPAD_POOLING_MODEL, .normalize = -1};
    return p;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static const char *family_name(model_family f) {
    switch (f) {
    case FAMILY_BERT: return "BERT";
    case FAMILY_ROBERTA: return "RoBERTa";
    case FAMILY_DISTILBERT: return "DistilBERT";
    case FAMILY_ALBERT: return "ALBERT";
    }
    return "?";
}

static const char *dtype_name(nopad_dtype d) {
    return d == NOPAD_DTYPE_F32 ? "F32" : d == NOPAD_DTYPE_F16 ? "F16" : "BF16";
}

static nopad_status create_backend(const nopad_model_params *p, nopad_backend **out) {
    if (p->device == NOPAD_DEVICE_CUDA) {
#ifdef NOPAD_HAVE_CUDA
        return nopad_backend_cuda_create(p->dtype, p->device_index, p->cuda_stream, out);
#else
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "device cuda: this build of nopad has no CUDA backend (configure "
                               "with -DNOPAD_CUDA=ON); use cpu");
#endif
    }
    if (p->device != NOPAD_DEVICE_CPU)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "device %d is not cpu or cuda", (int)p->device);
    if (p->dtype != NOPAD_DTYPE_F32)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "dtype %s: the CPU backend computes in F32 (F16 and BF16 need the "
                               "CUDA backend)", dtype_name(p->dtype));
    return nopad_backend_cpu_create(p->n_threads, out);
}

static nopad_status load_model(nopad_model *m, const char *dir) {
    char path[4096];
    if (!is_dir(dir)) return nopad_set_error(NOPAD_ERR_IO, "%s: no such folder", dir);

    snprintf(path, sizeof path, "%s/config.json", dir);
    char *json;
    size_t len;
    nopad_status st = read_file(path, 0, &json, &len);
    if (st != NOPAD_OK) return st;
    st = hf_config_parse(json, len, path, &m->cfg);
    free(json);
    if (st != NOPAD_OK) return st;

    st = st_pipeline_load(dir, &m->pipeline);
    if (st != NOPAD_OK) return st;
    m->max_seq_length = m->cfg.max_position_embeddings - m->cfg.position_offset;
    if (m->pipeline.max_seq_length > 0 && m->pipeline.max_seq_length < m->max_seq_length)
        m->max_seq_length = m->pipeline.max_seq_length;

    st = create_backend(&m->params, &m->be);
    if (st != NOPAD_OK) return st;

    safetensors_checkpoint ckpt;
    st = safetensors_checkpoint_open(dir, &ckpt);
    if (st != NOPAD_OK) return st;
    st = encoder_weights_load(m->be, &m->cfg, &ckpt, dir, &m->weights);
    safetensors_checkpoint_close(&ckpt);
    if (st != NOPAD_OK) return st;
    /* the fp32 staging of the largest tensor (the word embeddings) is not needed any more */
    if (m->be->release_staging) m->be->release_staging(m->be);

    if (m->params.max_batch_tokens > 0) {
        st = encoder_workspace_reserve(m->be, &m->cfg, &m->ws, m->params.max_batch_tokens,
                                       m->params.max_batch_tokens);
        if (st != NOPAD_OK) return st;
    }

    m->tokenizer_kind = "none";
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    int has_json = is_file(path);
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    int has_vocab = is_file(path);
    if (has_json || has_vocab) {
        st = nopad_tokenizer_load(dir, &m->tokenizer);
        if (st != NOPAD_OK) return st;
        m->tokenizer_kind = has_json ? "tokenizer.json" : "vocab.txt";
    }
    return NOPAD_OK;
}

nopad_status nopad_model_load(const char *dir, const nopad_model_params *params, nopad_model **out) {
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_model_load: out is NULL");
    *out = NULL;
    if (!dir || !*dir)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_model_load: no folder given");
    nopad_model *m = calloc(1, sizeof *m);
    if (!m) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_model_load: out of memory");
    m->params = params ? *params : nopad_model_default_params();
    m->dir = strdup(dir);
    pthread_mutex_init(&m->lock, NULL);
    nopad_status st = m->dir ? load_model(m, dir)
                             : nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "out of memory");
    if (st != NOPAD_OK) {
        nopad_model_free(m);
        return st;
    }
    *out = m;
    return NOPAD_OK;
}

void nopad_model_free(nopad_model *m) {
    if (!m) return;
    if (m->be) {
        encoder_workspace_free(m->be, &m->ws);
        encoder_weights_free(m->be, &m->weights);
        m->be->destroy(m->be);
    }
    nopad_tokenizer_free(m->tokenizer);
    pthread_mutex_destroy(&m->lock);
    free(m->dir);
    free(m);
}

nopad_status nopad_model_get_stats(const nopad_model *m, nopad_model_stats *out) {
    if (!m || !out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_model_get_stats: NULL argument");
    pthread_mutex_lock((pthread_mutex_t *)&m->lock);
    out->forwards = m->forwards;
    out->graph_replays = m->be->graph_replays;
    out->graphs_recorded = m->be->graphs_recorded;
    out->graphs_held = m->be->graphs_held;
    pthread_mutex_unlock((pthread_mutex_t *)&m->lock);
    return NOPAD_OK;
}

nopad_status nopad_model_memory(const nopad_model *m, size_t *weights_bytes,
                                size_t *workspace_bytes, size_t *backend_bytes) {
    if (!m) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_model_memory: model is NULL");
    if (weights_bytes) *weights_bytes = m->weights.bytes;
    if (workspace_bytes) *workspace_bytes = m->ws.bytes;
    if (backend_bytes) *backend_bytes = m->be->extra_bytes;
    return NOPAD_OK;
}

const nopad_tokenizer *nopad_model_tokenizer(const nopad_model *m) {
    return m ? m->tokenizer : NULL;
}

nopad_status nopad_model_get_info(const nopad_model *m, nopad_model_info *out) {
    if (!m || !out)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_model_get_info: NULL argument");
    const model_config *c = &m->cfg;
    memset(out, 0, sizeof *out);
    out->model_type = c->model_type;
    out->family = family_name(c->family);
    out->activation = c->activation_name;
    out->weights_dtype = m->weights.weights_dtype;
    out->compute_dtype = dtype_name(m->be->dtype);
    out->vocab_size = c->vocab_size;
    out->hidden_size = c->hidden_size;
    out->embedding_size = c->embedding_size;
    out->num_layers = c->num_layers;
    out->num_heads = c->num_heads;
    out->head_size = c->head_size;
    out->intermediate_size = c->intermediate_size;
    out->max_position_embeddings = c->max_position_embeddings;
    out->max_seq_length = m->max_seq_length;
    out->type_vocab_size = c->type_vocab_size;
    out->layer_norm_eps = c->layer_norm_eps;
    out->n_params = m->weights.n_params;
    out->pooling = m->pipeline.pooling;
    out->normalize = m->pipeline.normalize;
    out->has_tokenizer = m->tokenizer != NULL;
    out->tokenizer_kind = m->tokenizer_kind;
    return NOPAD_OK;
}

/* Checks a packed batch against the model; returns the longest sequence in *max_seqlen. */
static nopad_status validate_batch(const nopad_model *m, int32_t n_seqs, const int32_t *cu_seqlens,
                                   const int32_t *tokens, const int32_t *types, int32_t *max_seqlen) {
    if (n_seqs <= 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "empty batch: n_seqs is %d, need >= 1", n_seqs);
    if (!cu_seqlens || !tokens)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cu_seqlens and tokens must not be NULL");
    if (cu_seqlens[0] != 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cu_seqlens[0] is %d, must be 0", cu_seqlens[0]);
    *max_seqlen = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        int64_t len = (int64_t)cu_seqlens[s + 1] - cu_seqlens[s];
        if (len < 1)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "sequence %d is empty or cu_seqlens decreases (cu_seqlens[%d] = %d, "
                                   "cu_seqlens[%d] = %d); every sequence needs >= 1 token",
                                   s, s, cu_seqlens[s], s + 1, cu_seqlens[s + 1]);
        int32_t limit = m->cfg.max_position_embeddings - m->cfg.position_offset;
        if (len > limit)
            return nopad_set_error(NOPAD_ERR_TOO_LONG,
                                   "sequence %d has %lld tokens, the model accepts at most %d",
                                   s, (long long)len, limit);
        if (len > *max_seqlen) *max_seqlen = (int32_t)len;
    }
    const int32_t T = cu_seqlens[n_seqs];
    for (int32_t s = 0; s < n_seqs; s++) {
        for (int32_t t = cu_seqlens[s]; t < cu_seqlens[s + 1]; t++) {
            if (tokens[t] < 0 || tokens[t] >= m->cfg.vocab_size)
                return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                       "token id %d at sequence %d, position %d is outside the "
                                       "vocabulary [0, %d)",
                                       tokens[t], s, t - cu_seqlens[s], m->cfg.vocab_size);
            if (types) {
                int32_t tv = m->cfg.type_vocab_size;
                if (types[t] < 0 || types[t] >= (tv > 0 ? tv : 1))
                    return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                           "token type id %d at sequence %d, position %d is outside "
                                           "[0, %d)",
                                           types[t], s, t - cu_seqlens[s], tv > 0 ? tv : 1);
            }
        }
    }
    (void)T;
    return NOPAD_OK;
}

/* Forwards of at most this many tokens replay recorded graphs (CUDA) by default. Below it the host
 * launching ~8 kernels per layer is as slow as the GPU running them; above it the launches hide
 * behind the GPU's work and the bucket's slack rows would only cost. */
enum { DEFAULT_GRAPH_MAX_TOKENS = 2048 };

/* The rows a forward of T tokens runs on: its bucket when the layers replay a recorded graph,
 * else 0 (the ops are launched directly on exactly T rows). */
static int32_t graph_rows(const nopad_model *m, int32_t T) {
    const int32_t limit = m->params.cuda_graph_max_tokens ? m->params.cuda_graph_max_tokens
                                                          : DEFAULT_GRAPH_MAX_TOKENS;
    if (!m->be->supports(m->be, NOPAD_OP_GRAPH, NULL) || limit < 0 || T > limit) return 0;
    const int32_t rows = encoder_token_bucket(T);
    if (m->params.max_batch_tokens > 0 && rows > m->params.max_batch_tokens) return 0;
    return rows;
}

typedef struct layers_call {
    nopad_model *m;
    nopad_seqs seqs; /* n_tokens = the bucket's rows; cu_seqlens in the workspace */
} layers_call;

static nopad_status record_layers(void *ctx) {
    layers_call *c = ctx;
    return encoder_layers(c->m->be, &c->m->cfg, &c->m->weights, &c->m->ws, &c->seqs,
                          c->seqs.n_tokens, c->m->ws.hidden);
}

/* Runs the encoder on a validated batch whose ids and cu_seqlens are in backend memory, with the
 * workspace already reserved for `rows` (graph_rows) or T tokens. The last hidden states end in
 * `hidden` [T, H]: ws->hidden, or a caller's device buffer. */
static nopad_status run_encoder(nopad_model *m, const nopad_seqs *seqs, int32_t rows,
                                const int32_t *tokens, const int32_t *types, void *hidden) {
    nopad_backend *be = m->be;
    encoder_workspace *ws = &m->ws;
    m->forwards++;
    if (!rows) return encoder_forward(be, &m->cfg, &m->weights, ws, seqs, tokens, types, hidden);
    /* The layers replay a graph recorded for this bucket, B and max_seqlen (rounded up to 64,
     * the granularity of the attention's tiles). Embeddings run outside it on exactly T rows; the
     * graph's rows past T are slack: row-wise ops carry them along and nothing reads them back. */
    if (ws->generation != m->graph_generation) {
        be->graph_clear(be);
        m->graph_generation = ws->generation;
    }
    const int32_t T = seqs->n_tokens, B = seqs->n_seqs;
    nopad_status st = NOPAD_OK;
    if (seqs->cu_seqlens != ws->cu_seqlens)
        st = be->copy(be, ws->cu_seqlens, seqs->cu_seqlens, ((size_t)B + 1) * sizeof(int32_t));
    if (st == NOPAD_OK) st = encoder_embed(be, &m->cfg, &m->weights, ws, seqs, tokens, types, ws->hidden);
    if (st != NOPAD_OK) return st;
    layers_call call = {.m = m,
                        .seqs = {.n_seqs = B, .n_tokens = rows,
                                 .max_seqlen = (seqs->max_seqlen + 63) / 64 * 64,
                                 .cu_seqlens = ws->cu_seqlens}};
    const int64_t key[4] = {rows, B, call.seqs.max_seqlen, 0};
    st = be->graph_run(be, key, record_layers, &call);
    if (st == NOPAD_OK && hidden != ws->hidden)
        st = be->copy(be, hidden, ws->hidden, (size_t)T * m->cfg.hidden_size * nopad_dtype_size(be->dtype));
    return st;
}

/* pooled[B, H] from hidden[T, H] (and L2-normalised when asked), in backend memory. */
static nopad_status pool_rows(nopad_model *m, void *pooled, const void *hidden, const nopad_seqs *seqs,
                              nopad_pooling pooling, int normalize) {
    nopad_status st = m->be->pool(m->be, pooled, hidden, seqs, m->cfg.hidden_size, pooling);
    if (st == NOPAD_OK && normalize) st = m->be->l2_normalize(m->be, pooled, seqs->n_seqs, m->cfg.hidden_size);
    return st;
}

static nopad_status encode_locked(nopad_model *m, int32_t n_seqs, const int32_t *cu_seqlens,
                                  const int32_t *tokens, const int32_t *types, int32_t max_seqlen,
                                  nopad_pooling pooling, int normalize, float *hidden_out,
                                  float *pooled_out) {
    nopad_backend *be = m->be;
    const int32_t T = cu_seqlens[n_seqs], H = m->cfg.hidden_size;
    if (m->params.max_batch_tokens > 0 && T > m->params.max_batch_tokens)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "batch has %d tokens, more than max_batch_tokens = %d; split it",
                               T, m->params.max_batch_tokens);
    const int32_t rows = graph_rows(m, T);
    nopad_status st = encoder_workspace_reserve(be, &m->cfg, &m->ws, rows ? rows : T, n_seqs);
    if (st != NOPAD_OK) return st;
    encoder_workspace *ws = &m->ws;
    st = be->upload_i32(be, ws->tokens, tokens, (size_t)T);
    if (st == NOPAD_OK && types) st = be->upload_i32(be, ws->types, types, (size_t)T);
    if (st == NOPAD_OK) st = be->upload_i32(be, ws->cu_seqlens, cu_seqlens, (size_t)n_seqs + 1);
    if (st != NOPAD_OK) return st;
    nopad_seqs seqs = {.n_seqs = n_seqs, .n_tokens = T, .max_seqlen = max_seqlen,
                       .cu_seqlens = ws->cu_seqlens};
    st = run_encoder(m, &seqs, rows, ws->tokens, types ? ws->types : NULL, ws->hidden);
    if (st != NOPAD_OK) return st;
    if (pooled_out) {
        st = pool_rows(m, ws->pooled, ws->hidden, &seqs, pooling, normalize);
        if (st == NOPAD_OK) st = be->download_f32(be, pooled_out, ws->pooled, (size_t)n_seqs * H);
        if (st != NOPAD_OK) return st;
    }
    if (hidden_out) st = be->download_f32(be, hidden_out, ws->hidden, (size_t)T * H);
    if (st == NOPAD_OK) st = be->synchronize(be);
    return st;
}

/* Resolves the folder defaults of `params` and checks them against the requested outputs.
 * `who` names the entry point in messages. */
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
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "pooled output requested but pooling is none");
    if (!has_hidden && !has_pooled)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s: both hidden_out and pooled_out are NULL", who);
    return NOPAD_OK;
}

nopad_status nopad_encode_packed(nopad_model *m, int32_t n_seqs, const int32_t *cu_seqlens,
                                 const int32_t *tokens, const int32_t *token_type_ids,
                                 const nopad_encode_params *params, float *hidden_out,
                                 float *pooled_out) {
    if (!m) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_encode_packed: model is NULL");
    nopad_pooling pooling = NOPAD_POOLING_NONE;
    int normalize = 0;
    nopad_status st = resolve_encode_params(m, params, hidden_out != NULL, pooled_out != NULL,
                                            "nopad_encode_packed", &pooling, &normalize);
    if (st != NOPAD_OK) return st;
    int32_t max_seqlen = 0;
    st = validate_batch(m, n_seqs, cu_seqlens, tokens, token_type_ids, &max_seqlen);
    if (st != NOPAD_OK) return st;
    pthread_mutex_lock(&m->lock);
    st = encode_locked(m, n_seqs, cu_seqlens, tokens, token_type_ids, max_seqlen, pooling, normalize,
                       hidden_out, pooled_out);
    pthread_mutex_unlock(&m->lock);
    return st;
}

nopad_status nopad_encode_padded(nopad_model *m, int32_t n_seqs, int32_t max_len,
                                 const int32_t *tokens, const int32_t *token_type_ids,
                                 const int32_t *lengths, const nopad_encode_params *params,
                                 float *hidden_out, float *pooled_out) {
    if (!m) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_encode_padded: model is NULL");
    if (n_seqs <= 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "empty batch: n_seqs is %d, need >= 1", n_seqs);
    if (max_len <= 0 || !tokens || !lengths)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_encode_padded: need max_len >= 1, tokens and lengths");
    int32_t *cu = malloc(((size_t)n_seqs + 1) * sizeof *cu);
    if (!cu) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "out of memory");
    cu[0] = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        if (lengths[s] < 1 || lengths[s] > max_len) {
            free(cu);
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "lengths[%d] = %d is outside [1, max_len = %d]", s, lengths[s], max_len);
        }
        if ((int64_t)cu[s] + lengths[s] > INT32_MAX) {
            free(cu);
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "batch has more than 2^31 tokens");
        }
        cu[s + 1] = cu[s] + lengths[s];
    }
    const int32_t T = cu[n_seqs], H = m->cfg.hidden_size;
    int32_t *packed_tokens = malloc((size_t)T * sizeof(int32_t));
    int32_t *packed_types = token_type_ids ? malloc((size_t)T * sizeof(int32_t)) : NULL;
    float *packed_hidden = hidden_out ? malloc((size_t)T * H * sizeof(float)) : NULL;
    nopad_status st = NOPAD_OK;
    if (!packed_tokens || (token_type_ids && !packed_types) || (hidden_out && !packed_hidden)) {
        st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "out of memory packing the batch");
        goto done;
    }
    for (int32_t s = 0; s < n_seqs; s++) {
        memcpy(packed_tokens + cu[s], tokens + (size_t)s * max_len, (size_t)lengths[s] * sizeof(int32_t));
        if (packed_types)
            memcpy(packed_types + cu[s], token_type_ids + (size_t)s * max_len,
                   (size_t)lengths[s] * sizeof(int32_t));
    }
    st = nopad_encode_packed(m, n_seqs, cu, packed_tokens, packed_types, params, packed_hidden,
                             pooled_out);
    if (st == NOPAD_OK && hidden_out) {
        for (int32_t s = 0; s < n_seqs; s++) {
            float *dst = hidden_out + (size_t)s * max_len * H;
            memcpy(dst, packed_hidden + (size_t)cu[s] * H, (size_t)lengths[s] * H * sizeof(float));
            memset(dst + (size_t)lengths[s] * H, 0, (size_t)(max_len - lengths[s]) * H * sizeof(float));
        }
    }
done:
    free(cu);
    free(packed_tokens);
    free(packed_types);
    free(packed_hidden);
    return st;
}

/* The checks both device entries start with: a model on CUDA, and the encode params resolved.
 * `who` names the entry in messages, `host_entry` the one to use for host buffers. */
static nopad_status check_device_entry(const nopad_model *m, const char *who, const char *host_entry,
                                       const nopad_encode_params *params, int has_hidden,
                                       int has_pooled, nopad_pooling *pooling, int *normalize) {
    if (!m) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: model is NULL", who);
    if (m->params.device != NOPAD_DEVICE_CUDA)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s needs a model loaded on cuda; use %s for host buffers", who, host_entry);
    return resolve_encode_params(m, params, has_hidden, has_pooled, who, pooling, normalize);
}

/* The sizes a device entry is told rather than reads: max_seqlen within the model (and <= limit,
 * the other bound the entry has), and n_tokens within max_batch_tokens. */
static nopad_status check_device_sizes(const nopad_model *m, int32_t n_tokens, int32_t max_seqlen,
                                       int32_t limit, const char *limit_name) {
    const int32_t model_limit = m->cfg.max_position_embeddings - m->cfg.position_offset;
    if (max_seqlen < 1 || max_seqlen > model_limit || max_seqlen > limit)
        return nopad_set_error(max_seqlen > model_limit ? NOPAD_ERR_TOO_LONG : NOPAD_ERR_INVALID_ARGUMENT,
                               "max_seqlen %d: must be in [1, %d] (the model maximum) and <= %s (%d)",
                               max_seqlen, model_limit, limit_name, limit);
    if (m->params.max_batch_tokens > 0 && n_tokens > m->params.max_batch_tokens)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "batch has %d tokens, more than max_batch_tokens = %d; split it",
                               n_tokens, m->params.max_batch_tokens);
    return NOPAD_OK;
}

nopad_status nopad_encode_packed_device(nopad_model *m, int32_t n_seqs, int32_t n_tokens,
                                        int32_t max_seqlen, const int32_t *cu_seqlens,
                                        const int32_t *tokens, const int32_t *token_type_ids,
                                        const nopad_encode_params *params, void *hidden_out,
                                        void *pooled_out) {
    nopad_pooling pooling = NOPAD_POOLING_NONE;
    int normalize = 0;
    nopad_status st = check_device_entry(m, "nopad_encode_packed_device", "nopad_encode_packed", params,
                                         hidden_out != NULL, pooled_out != NULL, &pooling, &normalize);
    if (st != NOPAD_OK) return st;
    if (n_seqs <= 0 || n_tokens < n_seqs || !cu_seqlens || !tokens)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_encode_packed_device: need n_seqs >= 1, n_tokens >= n_seqs "
                               "(got %d, %d), cu_seqlens and tokens", n_seqs, n_tokens);
    st = check_device_sizes(m, n_tokens, max_seqlen, n_tokens, "n_tokens");
    if (st != NOPAD_OK) return st;
    pthread_mutex_lock(&m->lock);
    const int32_t rows = graph_rows(m, n_tokens);
    st = encoder_workspace_reserve(m->be, &m->cfg, &m->ws, rows ? rows : n_tokens, n_seqs);
    if (st == NOPAD_OK) {
        nopad_seqs seqs = {.n_seqs = n_seqs, .n_tokens = n_tokens, .max_seqlen = max_seqlen,
                           .cu_seqlens = cu_seqlens};
        /* without a graph the caller's buffer carries the residual stream (no copy at the end);
         * a graph names the workspace's, and the rows are copied out after it */
        void *hidden = hidden_out ? hidden_out : m->ws.hidden;
        st = run_encoder(m, &seqs, rows, tokens, token_type_ids, hidden);
        if (st == NOPAD_OK && pooled_out) st = pool_rows(m, pooled_out, hidden, &seqs, pooling, normalize);
    }
    pthread_mutex_unlock(&m->lock);
    return st;
}

nopad_status nopad_encode_padded_device(nopad_model *m, int32_t n_seqs, int32_t max_len,
                                        int32_t n_tokens, int32_t max_seqlen, const int32_t *tokens,
                                        const int32_t *token_type_ids, const int32_t *lengths,
                                        const nopad_encode_params *params, void *hidden_out,
                                        void *pooled_out) {
    nopad_pooling pooling = NOPAD_POOLING_NONE;
    int normalize = 0;
    nopad_status st = check_device_entry(m, "nopad_encode_padded_device", "nopad_encode_padded", params,
                                         hidden_out != NULL, pooled_out != NULL, &pooling, &normalize);
    if (st != NOPAD_OK) return st;
    if (!m->be->supports(m->be, NOPAD_OP_PACK, NULL))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "nopad_encode_padded_device: backend %s cannot pack on the device",
                               m->be->name);
    if (n_seqs <= 0 || max_len <= 0 || !tokens || !lengths)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_encode_padded_device: need n_seqs >= 1, max_len >= 1 (got %d, "
                               "%d), tokens and lengths", n_seqs, max_len);
    if (n_tokens < n_seqs || (int64_t)n_tokens > (int64_t)n_seqs * max_len)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_encode_padded_device: n_tokens %d must be in [n_seqs, n_seqs * "
                               "max_len] = [%d, %lld] (it is the sum of the lengths)",
                               n_tokens, n_seqs, (long long)n_seqs * max_len);
    st = check_device_sizes(m, n_tokens, max_seqlen, max_len, "max_len");
    if (st != NOPAD_OK) return st;
    pthread_mutex_lock(&m->lock);
    nopad_backend *be = m->be;
    const int32_t rows = graph_rows(m, n_tokens);
    st = encoder_workspace_reserve(be, &m->cfg, &m->ws, rows ? rows : n_tokens, n_seqs);
    encoder_workspace *ws = &m->ws;
    if (st == NOPAD_OK)
        st = be->pack(be, tokens, token_type_ids, lengths, n_seqs, max_len, max_seqlen, n_tokens,
                             ws->cu_seqlens, ws->tokens, token_type_ids ? ws->types : NULL);
    nopad_seqs seqs = {.n_seqs = n_seqs, .n_tokens = n_tokens, .max_seqlen = max_seqlen,
                       .cu_seqlens = ws->cu_seqlens};
    if (st == NOPAD_OK)
        st = run_encoder(m, &seqs, rows, ws->tokens, token_type_ids ? ws->types : NULL, ws->hidden);
    if (st == NOPAD_OK && hidden_out)
        st = be->unpack(be, hidden_out, ws->hidden, ws->cu_seqlens, n_seqs, max_len, m->cfg.hidden_size);
    if (st == NOPAD_OK && pooled_out) st = pool_rows(m, pooled_out, ws->hidden, &seqs, pooling, normalize);
    pthread_mutex_unlock(&m->lock);
    return st;
}

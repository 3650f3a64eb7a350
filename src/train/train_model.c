/* The parameters of a model being trained: one flat float32 buffer each for the weights, their
 * gradients and the two optimiser moments, a table of HF-named tensors into them, and views (a
 * pointer per tensor) for the step code. The layout keeps each layer's query, key and value
 * tensors contiguous so they read as the fused [3H, H] QKV matrix the attention wants, while the
 * optimiser still sees three tensors (LAMB's trust ratio is per tensor, as in PyTorch). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "train/train.h"
#include "util/error.h"
#include "util/file.h"
#include "util/philox.h"
#include "util/types.h"

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        nopad_status st_ = (expr);                                                                 \
        if (st_ != NOPAD_OK) return st_;                                                           \
    } while (0)

/* Pass 0 records the tensor and its offset; pass 1 (buffers allocated) points the views at it. */
static nopad_status place(train_model *m, int pass, const char *name, int64_t rows, int64_t cols,
                          int decay, void **w, void **g) {
    if (pass == 0) {
        train_tensor *grown = realloc(m->tensors, (size_t)(m->n_tensors + 1) * sizeof *grown);
        if (!grown) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "train: out of memory");
        m->tensors = grown;
        train_tensor *t = &m->tensors[m->n_tensors++];
        snprintf(t->name, sizeof t->name, "%s", name);
        t->offset = m->n_params;
        t->rows = rows;
        t->cols = cols;
        t->decay = decay;
        m->n_params += rows * cols;
    } else if (w) {
        const train_tensor *t = train_model_find(m, name);
        *w = (char *)m->weights + (size_t)t->offset * m->elem_size;
        *g = m->grads + t->offset;
    }
    return NOPAD_OK;
}

/* Every tensor of the encoder and the task's head, in HF's names. */
static nopad_status layout(train_model *m, int pass) {
    const model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
    const char *p = m->prefix;
    char name[96];
#define PLACE(rows, cols, decay, field, fmt, ...)                                                  \
    do {                                                                                           \
        snprintf(name, sizeof name, fmt, __VA_ARGS__);                                             \
        TRY(place(m, pass, name, rows, cols, decay, pass ? &m->w.field : NULL,                    \
                  pass ? &m->g.field : NULL));                                                     \
    } while (0)
#define PLACE_PART(rows, cols, decay, fmt, ...) /* a later part of a fused tensor: no view */      \
    do {                                                                                           \
        snprintf(name, sizeof name, fmt, __VA_ARGS__);                                             \
        TRY(place(m, pass, name, rows, cols, decay, NULL, NULL));                                  \
    } while (0)
    PLACE(V, H, 1, word, "%sembeddings.word_embeddings.weight", p);
    PLACE(c->max_position_embeddings, H, 1, pos, "%sembeddings.position_embeddings.weight", p);
    PLACE(c->type_vocab_size, H, 1, type, "%sembeddings.token_type_embeddings.weight", p);
    PLACE(H, 1, 0, embed_ln_w, "%sembeddings.LayerNorm.weight", p);
    PLACE(H, 1, 0, embed_ln_b, "%sembeddings.LayerNorm.bias", p);
    for (int l = 0; l < c->num_layers; l++) {
        const char *e = "encoder.layer";
        PLACE(H, H, 1, layers[l].qkv_w, "%s%s.%d.attention.self.query.weight", p, e, l);
        PLACE_PART(H, H, 1, "%s%s.%d.attention.self.key.weight", p, e, l);
        PLACE_PART(H, H, 1, "%s%s.%d.attention.self.value.weight", p, e, l);
        PLACE(H, 1, 0, layers[l].qkv_b, "%s%s.%d.attention.self.query.bias", p, e, l);
        PLACE_PART(H, 1, 0, "%s%s.%d.attention.self.key.bias", p, e, l);
        PLACE_PART(H, 1, 0, "%s%s.%d.attention.self.value.bias", p, e, l);
        PLACE(H, H, 1, layers[l].attn_out_w, "%s%s.%d.attention.output.dense.weight", p, e, l);
        PLACE(H, 1, 0, layers[l].attn_out_b, "%s%s.%d.attention.output.dense.bias", p, e, l);
        PLACE(H, 1, 0, layers[l].attn_ln_w, "%s%s.%d.attention.output.LayerNorm.weight", p, e, l);
        PLACE(H, 1, 0, layers[l].attn_ln_b, "%s%s.%d.attention.output.LayerNorm.bias", p, e, l);
        PLACE(I, H, 1, layers[l].ffn_in_w, "%s%s.%d.intermediate.dense.weight", p, e, l);
        PLACE(I, 1, 0, layers[l].ffn_in_b, "%s%s.%d.intermediate.dense.bias", p, e, l);
        PLACE(H, I, 1, layers[l].ffn_out_w, "%s%s.%d.output.dense.weight", p, e, l);
        PLACE(H, 1, 0, layers[l].ffn_out_b, "%s%s.%d.output.dense.bias", p, e, l);
        PLACE(H, 1, 0, layers[l].ffn_ln_w, "%s%s.%d.output.LayerNorm.weight", p, e, l);
        PLACE(H, 1, 0, layers[l].ffn_ln_b, "%s%s.%d.output.LayerNorm.bias", p, e, l);
    }
    if (m->task == TRAIN_TASK_MLM) {
        PLACE(H, H, 1, mlm_dense_w, "%s", "cls.predictions.transform.dense.weight");
        PLACE(H, 1, 0, mlm_dense_b, "%s", "cls.predictions.transform.dense.bias");
        PLACE(H, 1, 0, mlm_ln_w, "%s", "cls.predictions.transform.LayerNorm.weight");
        PLACE(H, 1, 0, mlm_ln_b, "%s", "cls.predictions.transform.LayerNorm.bias");
        PLACE(V, 1, 0, mlm_bias, "%s", "cls.predictions.bias");
    } else {
        PLACE(H, H, 1, pool_w, "%spooler.dense.weight", p);
        PLACE(H, 1, 0, pool_b, "%spooler.dense.bias", p);
        PLACE(m->num_labels, H, 1, cls_w, "%s", "classifier.weight");
        PLACE(m->num_labels, 1, 0, cls_b, "%s", "classifier.bias");
    }
#undef PLACE
#undef PLACE_PART
    return NOPAD_OK;
}

const train_tensor *train_model_find(const train_model *m, const char *name) {
    for (int32_t i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

/* The ops a training step enqueues: a backend without them cannot train (yet). */
static nopad_status check_backend(const nopad_backend *be) {
    const struct { const void *op; const char *name; } ops[] = {
        {(const void *)be->zero, "zero"},
        {(const void *)be->gemm_backward, "gemm_backward"},
        {(const void *)be->activation, "activation"},
        {(const void *)be->activation_backward, "activation_backward"},
        {(const void *)be->layernorm_backward, "layernorm_backward"},
        {(const void *)be->embed_backward, "embed_backward"},
        {(const void *)be->attention_lse, "attention_lse"},
        {(const void *)be->attention_backward, "attention_backward"},
        {(const void *)be->scatter_add_rows, "scatter_add_rows"},
        {(const void *)be->select_rows, "select_rows"},
        {(const void *)be->pool, "pool"},
        {(const void *)be->upload, "upload"},
        {(const void *)be->cross_entropy, "cross_entropy"},
        {(const void *)be->squared_error, "squared_error"},
        {(const void *)be->adamw, "adamw"},
        {(const void *)be->lamb, "lamb"},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!ops[i].op)
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                   "training: the %s backend has no %s op yet (training runs on "
                                   "the CPU backend)", be->name, ops[i].name);
    /* fp16's 5 exponent bits flush small gradients (the loss is a mean over thousands of rows)
     * to zero without dynamic loss scaling; bf16 has float32's range */
    if (be->dtype == NOPAD_DTYPE_F16)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "training: the %s backend computes in "
                               "bf16 for training (fp16 would need dynamic loss scaling, not done "
                               "yet): use dtype bf16", be->name);
    return NOPAD_OK;
}

/* Whether `name` belongs to the task's head rather than to the encoder. */
static int is_head_tensor(const train_model *m, const char *name) {
    char pooler[32];
    snprintf(pooler, sizeof pooler, "%spooler.", m->prefix);
    return !strncmp(name, "cls.", 4) || !strncmp(name, "classifier.", 11) ||
           !strncmp(name, pooler, strlen(pooler));
}

/* A head tensor as HF's BertPreTrainedModel._init_weights makes it: a Linear's weight
 * normal(0, initializer_range), LayerNorm weights 1, biases 0. The normal draws are Box-Muller
 * on Philox4x32-10 keyed by the seed, with the tensor's index in the table as the stream. */
static void init_head_tensor(const train_model *m, int32_t index, uint64_t seed, float std,
                             float *out) {
    const train_tensor *t = &m->tensors[index];
    const int64_t n = t->rows * t->cols;
    const size_t len = strlen(t->name);
    if (t->cols == 1) {
        const float v = len >= 16 && !strcmp(t->name + len - 16, "LayerNorm.weight") ? 1.0f : 0.0f;
        for (int64_t i = 0; i < n; i++) out[i] = v;
        return;
    }
    const double two_pi = 6.283185307179586;
    const uint64_t stream = seed ^ ((uint64_t)(index + 1) * 0x9E3779B97F4A7C15ull);
    for (int64_t i = 0; i < n; i++) {
        const double u1 = ((double)philox_bits(stream, 2 * (uint64_t)i) + 1.0) / 4294967296.0;
        const double u2 = (double)philox_bits(stream, 2 * (uint64_t)i + 1) / 4294967296.0;
        out[i] = (float)(std * sqrt(-2.0 * log(u1)) * cos(two_pi * u2));
    }
}

static nopad_status load_tensors(train_model *m, const safetensors_checkpoint *ckpt,
                                 const char *dir, int new_head, uint64_t seed, float std) {
    float *host = NULL;
    size_t cap = 0;
    nopad_status st = NOPAD_OK;
    for (int32_t i = 0; i < m->n_tensors && st == NOPAD_OK; i++) {
        const train_tensor *t = &m->tensors[i];
        const safetensors_tensor *src = safetensors_checkpoint_find(ckpt, t->name);
        const char *arch = m->task == TRAIN_TASK_MLM ? "BertForMaskedLM" : "BertForSequenceClassification";
        if (!src && !(new_head && is_head_tensor(m, t->name))) {
            st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: tensor '%s' is missing (training a %s "
                                 "needs it%s)", dir, t->name, arch,
                                 is_head_tensor(m, t->name) ? "; a new head is created only when "
                                 "asked for: --num-labels N with nopad train" : "");
            break;
        }
        const size_t n = (size_t)(t->rows * t->cols);
        if (n > cap) {
            float *grown = realloc(host, n * sizeof *grown);
            if (!grown) {
                st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
                break;
            }
            host = grown;
            cap = n;
        }
        if (!src) {
            init_head_tensor(m, i, seed, std, host);
            m->new_head = 1;
            st = train_model_set_params(m, t->offset, host, (int64_t)n);
            continue;
        }
        const int ndim = t->cols == 1 ? 1 : 2;
        if (src->ndim != ndim || src->shape[0] != t->rows || (ndim == 2 && src->shape[1] != t->cols)) {
            st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: tensor '%s' has %d dims [%lld, ...], "
                                 "expected [%lld%s%lld] for this config.json", dir, t->name,
                                 src->ndim, (long long)(src->ndim ? src->shape[0] : 0),
                                 (long long)t->rows, ndim == 2 ? ", " : "",
                                 ndim == 2 ? (long long)t->cols : 0LL);
            break;
        }
        st = safetensors_to_f32(src, host);
        if (st == NOPAD_OK) st = train_model_set_params(m, t->offset, host, (int64_t)n);
    }
    free(host);
    return st;
}

/* config.json's initializer_range (HF's default 0.02 when absent). */
static float initializer_range(const char *json, size_t len) {
    cJSON *root = cJSON_ParseWithLength(json, len);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "initializer_range");
    const float r = cJSON_IsNumber(v) && v->valuedouble > 0 && v->valuedouble < 1 ?
                        (float)v->valuedouble : 0.02f;
    cJSON_Delete(root);
    return r;
}

static nopad_status load(nopad_backend *be, const char *dir, train_task task, int new_head,
                         int32_t num_labels, uint64_t seed, train_model *out);

nopad_status train_model_load(nopad_backend *be, const char *dir, train_task task,
                              train_model *out) {
    return load(be, dir, task, 0, 0, 0, out);
}

nopad_status train_model_load_new_head(nopad_backend *be, const char *dir, train_task task,
                                       int32_t num_labels, uint64_t seed, train_model *out) {
    memset(out, 0, sizeof *out);
    if (num_labels < 0 || num_labels > 1 << 20)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train: num_labels %d is outside "
                               "[1, %d]", (int)num_labels, 1 << 20);
    return load(be, dir, task, 1, num_labels, seed, out);
}

static nopad_status load(nopad_backend *be, const char *dir, train_task task, int new_head,
                         int32_t num_labels, uint64_t seed, train_model *out) {
    memset(out, 0, sizeof *out);
    TRY(check_backend(be));
    out->be = be;
    out->task = task;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *json = NULL;
    size_t len = 0;
    TRY(read_file(path, 1 << 20, &json, &len));
    nopad_status st = hf_config_parse(json, len, path, &out->cfg);
    const float init_std = initializer_range(json, len);
    free(json);
    if (st != NOPAD_OK) return st;
    if (out->cfg.family != FAMILY_BERT || out->cfg.type_vocab_size < 1)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: training supports BERT (model_type "
                               "\"bert\") only for now, not \"%s\"", dir, out->cfg.model_type);

    safetensors_checkpoint ckpt;
    TRY(safetensors_checkpoint_open(dir, &ckpt));
    /* Task checkpoints keep the encoder under "bert."; a bare BertModel has no prefix. */
    snprintf(out->prefix, sizeof out->prefix, "%s",
             safetensors_checkpoint_find(&ckpt, "bert.embeddings.word_embeddings.weight") ? "bert." : "");
    if (task == TRAIN_TASK_CLASSIFY) {
        const safetensors_tensor *cls = safetensors_checkpoint_find(&ckpt, "classifier.weight");
        if (cls && (cls->ndim != 2 || cls->shape[0] < 1 || cls->shape[0] > 1 << 20)) {
            safetensors_checkpoint_close(&ckpt);
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: classifier.weight is not [num_labels, "
                                   "hidden]", dir);
        }
        if (!cls && !(new_head && num_labels > 0)) {
            safetensors_checkpoint_close(&ckpt);
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: no classifier.weight (not a "
                                   "BertForSequenceClassification checkpoint): give the number of "
                                   "labels (nopad train --num-labels N) to start a new pooler and "
                                   "classifier", dir);
        }
        if (cls && num_labels > 0 && cls->shape[0] != num_labels) {
            const long long have = (long long)cls->shape[0]; /* read before the close frees it */
            safetensors_checkpoint_close(&ckpt);
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: the checkpoint's classifier has "
                                   "%lld labels, not the %d asked for", dir, have, (int)num_labels);
        }
        out->num_labels = cls ? (int32_t)cls->shape[0] : num_labels;
    }
    out->w.layers = calloc((size_t)out->cfg.num_layers, sizeof(train_layer));
    out->g.layers = calloc((size_t)out->cfg.num_layers, sizeof(train_layer));
    if (!out->w.layers || !out->g.layers)
        st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
    if (st == NOPAD_OK) st = layout(out, 0);
    const size_t bytes = (size_t)out->n_params * sizeof(float);
    float **buffers[4] = {&out->params, &out->grads, &out->adam_m, &out->adam_v};
    for (int i = 0; i < 4 && st == NOPAD_OK; i++) st = be->alloc(be, bytes, (void **)buffers[i]);
    for (int i = 1; i < 4 && st == NOPAD_OK; i++) st = be->zero(be, *buffers[i], bytes);
    /* the ops' copy of the weights: the master weights themselves on a float32 backend */
    out->elem_size = nopad_dtype_size(be->dtype);
    if (st == NOPAD_OK && be->dtype == NOPAD_DTYPE_F32) out->weights = out->params;
    else if (st == NOPAD_OK) st = be->alloc(be, (size_t)out->n_params * out->elem_size, &out->weights);
    if (st == NOPAD_OK) st = layout(out, 1);
    if (st == NOPAD_OK) st = load_tensors(out, &ckpt, dir, new_head, seed, init_std);
    safetensors_checkpoint_close(&ckpt);
    if (st != NOPAD_OK) train_model_free(out);
    return st;
}

void train_model_free(train_model *m) {
    if (m->weights && m->weights != (void *)m->params) m->be->free(m->be, m->weights);
    float *buffers[4] = {m->params, m->grads, m->adam_m, m->adam_v};
    for (int i = 0; i < 4; i++)
        if (buffers[i]) m->be->free(m->be, buffers[i]);
    free(m->tensors);
    free(m->w.layers);
    free(m->g.layers);
    memset(m, 0, sizeof *m);
}

train_optimizer train_optimizer_defaults(void) {
    return (train_optimizer){.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-6f,
                             .weight_decay = 0.01f, .max_grad_norm = 1.0f};
}

nopad_status train_model_set_params(train_model *m, int64_t offset, const float *host, int64_t n) {
    nopad_backend *be = m->be;
    if (offset < 0 || n < 0 || offset + n > m->n_params)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_model_set_params: elements "
                               "[%lld, %lld) outside the model's %lld", (long long)offset,
                               (long long)(offset + n), (long long)m->n_params);
    nopad_status st = be->upload(be, m->params + offset, host, (size_t)n * sizeof(float));
    if (st == NOPAD_OK && m->weights != (void *)m->params)
        st = be->upload_f32(be, (char *)m->weights + (size_t)offset * m->elem_size, host, (size_t)n);
    return st;
}

/* The tensor list of the optimiser ops: every tensor of the table over the four buffers. */
static nopad_status optimizer_step(train_model *m, const train_optimizer *opt, int lamb,
                                   float *grad_norm) {
    nopad_opt_tensor *list = malloc((size_t)m->n_tensors * sizeof *list);
    if (!list) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "optimiser: out of memory");
    for (int32_t i = 0; i < m->n_tensors; i++) {
        const train_tensor *t = &m->tensors[i];
        void *compute = m->weights == (void *)m->params ? NULL :
                        (char *)m->weights + (size_t)t->offset * m->elem_size;
        list[i] = (nopad_opt_tensor){m->params + t->offset, m->grads + t->offset,
                                     m->adam_m + t->offset, m->adam_v + t->offset, compute,
                                     t->rows * t->cols, t->decay ? opt->weight_decay : 0.0f};
    }
    const nopad_opt_step h = {opt->lr, opt->beta1, opt->beta2, opt->eps, opt->max_grad_norm,
                              m->step + 1};
    nopad_status st;
    if (lamb) {
        float *norm32 = NULL; /* backend memory for the norm, read back only when asked for */
        st = grad_norm ? m->be->alloc(m->be, sizeof(float), (void **)&norm32) : NOPAD_OK;
        if (st == NOPAD_OK) st = m->be->lamb(m->be, list, m->n_tensors, &h, norm32);
        if (st == NOPAD_OK && grad_norm) st = m->be->download(m->be, grad_norm, norm32, sizeof(float));
        if (norm32) m->be->free(m->be, norm32);
    } else {
        st = m->be->adamw(m->be, list, m->n_tensors, &h);
    }
    free(list);
    if (st == NOPAD_OK) m->step++;
    return st;
}

nopad_status train_adamw_step(train_model *m, const train_optimizer *opt) {
    return optimizer_step(m, opt, 0, NULL);
}

nopad_status train_lamb_step(train_model *m, const train_optimizer *opt, float *grad_norm) {
    return optimizer_step(m, opt, 1, grad_norm);
}

nopad_status train_clip_grad_norm(train_model *m, float max_norm, float *grad_norm) {
    nopad_backend *be = m->be;
    if (!be->clip_grad_norm)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "training: the %s backend has no "
                               "clip_grad_norm op yet", be->name);
    nopad_opt_tensor *list = malloc((size_t)m->n_tensors * sizeof *list);
    if (!list) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "gradient clipping: out of memory");
    for (int32_t i = 0; i < m->n_tensors; i++) {
        const train_tensor *t = &m->tensors[i];
        list[i] = (nopad_opt_tensor){m->params + t->offset, m->grads + t->offset, NULL, NULL,
                                     NULL, t->rows * t->cols, 0.0f};
    }
    float *norm32 = NULL; /* backend memory for the norm, read back only when asked for */
    nopad_status st = grad_norm ? be->alloc(be, sizeof(float), (void **)&norm32) : NOPAD_OK;
    if (st == NOPAD_OK) st = be->clip_grad_norm(be, list, m->n_tensors, max_norm, norm32);
    if (st == NOPAD_OK && grad_norm) st = be->download(be, grad_norm, norm32, sizeof(float));
    if (norm32) be->free(be, norm32);
    free(list);
    return st;
}

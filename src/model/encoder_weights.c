/* Loading encoder weights: resolve the family's tensor names, check every shape against the
 * config, convert to float32 then to the backend's dtype, fuse Q/K/V into one [3H, H] matrix.
 * Under tensor parallelism each tensor is read whole, checked whole, and only the rank's part
 * (rows or columns, encoder.h) goes to the backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/encoder.h"
#include "util/error.h"


typedef struct loader {
    nopad_backend *be;
    const safetensors_checkpoint *ckpt;
    const char *where;
    char prefix[128];      /* "bert." etc. for checkpoints saved from a task model */
    encoder_weights *w;
    unsigned dtype_mask;   /* bit per safetensors dtype seen */
    float *scratch;        /* host float32 staging buffer */
    size_t scratch_cap;
} loader;

static nopad_status track(loader *ld, void *ptr) {
    encoder_weights *w = ld->w;
    void **grown = realloc(w->allocations, (size_t)(w->n_allocations + 1) * sizeof *grown);
    if (!grown) {
        ld->be->free(ld->be, ptr);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", ld->where);
    }
    w->allocations = grown;
    w->allocations[w->n_allocations++] = ptr;
    return NOPAD_OK;
}

static nopad_status alloc_tensor(loader *ld, size_t n_elements, void **out) {
    nopad_status st = ld->be->alloc(ld->be, n_elements * nopad_dtype_size(ld->be->dtype), out);
    if (st != NOPAD_OK) return st;
    ld->w->bytes += n_elements * nopad_dtype_size(ld->be->dtype);
    return track(ld, *out);
}

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* The part of a [d0, d1] (or [d0]) tensor a rank holds: rows [row0, row0 + rows) and columns
 * [col0, col0 + cols); rows or cols 0 means all of them. */
typedef struct part {
    int64_t row0, rows, col0, cols;
} part;

static const part WHOLE = {0, 0, 0, 0};

/* Finds `name` (under the prefix), checks its shape is [d0] or [d0, d1] and uploads `p` of it,
 * packed [rows, cols], to dst + dst_offset elements. */
static nopad_status load_part_into(loader *ld, const char *name, int64_t d0, int64_t d1, part p,
                                   void *dst, size_t dst_offset) {
    char full[256];
    snprintf(full, sizeof full, "%s%s", ld->prefix, name);
    const safetensors_tensor *t = safetensors_checkpoint_find(ld->ckpt, full);
    if (!t) {
        /* Older checkpoints (TF-converted BERT) call LayerNorm parameters gamma and beta. */
        const char *ln = strstr(name, "LayerNorm.");
        if (ln) {
            char legacy[256];
            const char *suffix = strstr(ln, ".weight") ? "gamma" : "beta";
            snprintf(legacy, sizeof legacy, "%s%.*sLayerNorm.%s", ld->prefix, (int)(ln - name), name,
                     suffix);
            t = safetensors_checkpoint_find(ld->ckpt, legacy);
        }
    }
    if (!t) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: required tensor '%s' is missing", ld->where, full);
    int want_ndim = d1 > 0 ? 2 : 1;
    int64_t want[2] = {d0, d1};
    if (t->ndim != want_ndim || t->shape[0] != d0 || (want_ndim == 2 && t->shape[1] != d1)) {
        char got[128], exp[128];
        format_shape(got, sizeof got, t->ndim, t->shape);
        format_shape(exp, sizeof exp, want_ndim, want);
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: tensor '%s' has shape %s, expected %s for this config.json",
                               ld->where, full, got, exp);
    }
    size_t n = (size_t)t->n_elements;
    if (n > ld->scratch_cap) {
        float *grown = realloc(ld->scratch, n * sizeof(float));
        if (!grown) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", ld->where);
        ld->scratch = grown;
        ld->scratch_cap = n;
    }
    nopad_status st = safetensors_to_f32(t, ld->scratch);
    if (st != NOPAD_OK) return nopad_wrap_error(st, "%s", ld->where);
    /* one pass over the converted values: a NaN or infinity in the weights would turn every
     * output it reaches into NaN, on every interface, with no error */
    for (size_t i = 0; i < n; i++) {
        if (isfinite(ld->scratch[i])) continue;
        const int64_t cols = want_ndim == 2 ? d1 : 1;
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: tensor '%s' holds %s at element %zu (row %lld, column %lld); the "
                               "weights are corrupt (every value must be finite)",
                               ld->where, full, isnan(ld->scratch[i]) ? "NaN" : "an infinity", i,
                               (long long)((int64_t)i / cols), (long long)((int64_t)i % cols));
    }
    ld->dtype_mask |= 1u << t->dtype;
    ld->w->n_params += (int64_t)n; /* the whole tensor's, so every rank reports the whole model */
    /* the part, packed in place: row r's columns move to r · cols, never past a row still to be
     * read */
    const int64_t cols_all = want_ndim == 2 ? d1 : 1;
    const int64_t rows = p.rows ? p.rows : d0, cols = p.cols ? p.cols : cols_all;
    const float *first = ld->scratch + p.row0 * cols_all + p.col0;
    if (cols != cols_all) {
        for (int64_t r = 0; r < rows; r++)
            memmove(ld->scratch + r * cols, first + r * cols_all, (size_t)cols * sizeof(float));
        first = ld->scratch;
    }
    char *base = (char *)dst + dst_offset * nopad_dtype_size(ld->be->dtype);
    return ld->be->upload_f32(ld->be, base, first, (size_t)(rows * cols));
}

/* Allocates `p` of tensor `name` [d0, d1] and loads it. */
static nopad_status load_part(loader *ld, const char *name, int64_t d0, int64_t d1, part p,
                              void **out) {
    const int64_t rows = p.rows ? p.rows : d0, cols = p.cols ? p.cols : (d1 > 0 ? d1 : 1);
    nopad_status st = alloc_tensor(ld, (size_t)(rows * cols), out);
    if (st != NOPAD_OK) return st;
    return load_part_into(ld, name, d0, d1, p, *out, 0);
}

static nopad_status load(loader *ld, const char *name, int64_t d0, int64_t d1, void **out) {
    return load_part(ld, name, d0, d1, WHOLE, out);
}

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        nopad_status st_ = (expr);                                                                 \
        if (st_ != NOPAD_OK) return st_;                                                           \
    } while (0)

/* The tensor names of one layer, relative to its layer prefix. */
typedef struct layer_names {
    const char *q_w, *q_b, *k_w, *k_b, *v_w, *v_b, *o_w, *o_b, *ln1_w, *ln1_b;
    const char *in_w, *in_b, *out_w, *out_b, *ln2_w, *ln2_b;
} layer_names;

static const layer_names BERT_LAYER = {
    "attention.self.query.weight", "attention.self.query.bias", "attention.self.key.weight",
    "attention.self.key.bias",     "attention.self.value.weight", "attention.self.value.bias",
    "attention.output.dense.weight", "attention.output.dense.bias",
    "attention.output.LayerNorm.weight", "attention.output.LayerNorm.bias",
    "intermediate.dense.weight",   "intermediate.dense.bias", "output.dense.weight",
    "output.dense.bias",           "output.LayerNorm.weight", "output.LayerNorm.bias"};

static const layer_names DISTILBERT_LAYER = {
    "attention.q_lin.weight", "attention.q_lin.bias", "attention.k_lin.weight",
    "attention.k_lin.bias",   "attention.v_lin.weight", "attention.v_lin.bias",
    "attention.out_lin.weight", "attention.out_lin.bias", "sa_layer_norm.weight",
    "sa_layer_norm.bias",     "ffn.lin1.weight", "ffn.lin1.bias", "ffn.lin2.weight",
    "ffn.lin2.bias",          "output_layer_norm.weight", "output_layer_norm.bias"};

static const layer_names ALBERT_LAYER = {
    "attention.query.weight", "attention.query.bias", "attention.key.weight",
    "attention.key.bias",     "attention.value.weight", "attention.value.bias",
    "attention.dense.weight", "attention.dense.bias", "attention.LayerNorm.weight",
    "attention.LayerNorm.bias", "ffn.weight", "ffn.bias", "ffn_output.weight", "ffn_output.bias",
    "full_layer_layer_norm.weight", "full_layer_layer_norm.bias"};

static const layer_names DEBERTA_LAYER = {
    "attention.self.query_proj.weight", "attention.self.query_proj.bias",
    "attention.self.key_proj.weight",   "attention.self.key_proj.bias",
    "attention.self.value_proj.weight", "attention.self.value_proj.bias",
    "attention.output.dense.weight",    "attention.output.dense.bias",
    "attention.output.LayerNorm.weight", "attention.output.LayerNorm.bias",
    "intermediate.dense.weight",        "intermediate.dense.bias", "output.dense.weight",
    "output.dense.bias",                "output.LayerNorm.weight", "output.LayerNorm.bias"};

/* The rows of a Q, K or V projection that make this rank's heads (the columns of its attention
 * output), and the intermediate columns it holds (rows of FFN-in, columns of FFN-out). */
static part head_rows(const model_config *cfg, const tp_shard *tp) {
    return (part){.row0 = (int64_t)tp->head0 * cfg->head_size, .rows = (int64_t)tp->heads * cfg->head_size};
}
static part head_cols(const model_config *cfg, const tp_shard *tp) {
    return (part){.col0 = (int64_t)tp->head0 * cfg->head_size, .cols = (int64_t)tp->heads * cfg->head_size};
}

static nopad_status load_layer(loader *ld, const model_config *cfg, const char *layer_prefix,
                               const layer_names *n, encoder_layer *L) {
    const int64_t H = cfg->hidden_size, I = cfg->intermediate_size;
    const tp_shard *tp = &ld->w->tp;
    const int64_t Hl = (int64_t)tp->heads * cfg->head_size; // H at tp 1
    const part heads = head_rows(cfg, tp), ffn_rows = {.row0 = tp->ffn0, .rows = tp->ffn};
    const part ffn_cols = {.col0 = tp->ffn0, .cols = tp->ffn};
    char name[256];
#define NAME(field) (snprintf(name, sizeof name, "%s%s", layer_prefix, n->field), name)
    TRY(alloc_tensor(ld, (size_t)(3 * Hl * H), &L->qkv_weight));
    TRY(alloc_tensor(ld, (size_t)(3 * Hl), &L->qkv_bias));
    TRY(load_part_into(ld, NAME(q_w), H, H, heads, L->qkv_weight, 0));
    TRY(load_part_into(ld, NAME(k_w), H, H, heads, L->qkv_weight, (size_t)(Hl * H)));
    TRY(load_part_into(ld, NAME(v_w), H, H, heads, L->qkv_weight, (size_t)(2 * Hl * H)));
    TRY(load_part_into(ld, NAME(q_b), H, 0, heads, L->qkv_bias, 0));
    TRY(load_part_into(ld, NAME(k_b), H, 0, heads, L->qkv_bias, (size_t)Hl));
    TRY(load_part_into(ld, NAME(v_b), H, 0, heads, L->qkv_bias, (size_t)(2 * Hl)));
    TRY(load_part(ld, NAME(o_w), H, H, head_cols(cfg, tp), &L->attn_out_weight));
    TRY(load(ld, NAME(o_b), H, 0, &L->attn_out_bias));
    TRY(load(ld, NAME(ln1_w), H, 0, &L->attn_ln_weight));
    TRY(load(ld, NAME(ln1_b), H, 0, &L->attn_ln_bias));
    TRY(load_part(ld, NAME(in_w), I, H, ffn_rows, &L->ffn_in_weight));
    TRY(load_part(ld, NAME(in_b), I, 0, ffn_rows, &L->ffn_in_bias));
    TRY(load_part(ld, NAME(out_w), H, I, ffn_cols, &L->ffn_out_weight));
    TRY(load(ld, NAME(out_b), H, 0, &L->ffn_out_bias));
    TRY(load(ld, NAME(ln2_w), H, 0, &L->ffn_ln_weight));
    TRY(load(ld, NAME(ln2_b), H, 0, &L->ffn_ln_bias));
#undef NAME
    return NOPAD_OK;
}

/* DeBERTa: each layer's relative-position tables, pos_key = rel·Wkᵀ + bk and pos_query =
 * rel·Wqᵀ + bq [2k, H], with rel = LayerNorm(rel_embeddings) when norm_rel_ebd asks, and W the
 * layer's own key/query weights (share_att_key) or its pos_key_proj / pos_query_proj. They depend
 * on weights only, so they are computed here once with the backend's ops, not in every forward.
 * Each head reads only its own columns of them, so a rank projects with its heads' rows of W and
 * gets its [2k, Hl] columns. */
static nopad_status load_relative_tables(loader *ld, const model_config *cfg, encoder_weights *w) {
    const relative_attention *rel = &cfg->rel;
    const int64_t H = cfg->hidden_size, R = 2 * (int64_t)rel->att_span;
    const int64_t Hl = (int64_t)w->tp.heads * cfg->head_size;
    const size_t es = nopad_dtype_size(ld->be->dtype);
    void *table, *ln_w, *ln_b;
    TRY(load(ld, "encoder.rel_embeddings.weight", R, H, &table)); // [2k, H]
    if (rel->norm_rel_ebd) {
        TRY(load(ld, "encoder.LayerNorm.weight", H, 0, &ln_w));
        TRY(load(ld, "encoder.LayerNorm.bias", H, 0, &ln_b));
        TRY(ld->be->layernorm(ld->be, table, NULL, NULL, ln_w, ln_b, cfg->layer_norm_eps, (int32_t)R,
                              (int32_t)H));
    }
    char name[192];
    for (int l = 0; l < w->n_layer_weights; l++) {
        encoder_layer *L = &w->layers[l];
        for (int term = 0; term < 2; term++) { // 0: c2p (keys), 1: p2c (queries)
            if (!(term == 0 ? rel->c2p : rel->p2c)) continue;
            const void *weight, *bias;
            if (rel->share_att_key) { // the rows of the fused [3Hl, H] QKV: query 0, key 1
                weight = (const char *)L->qkv_weight + (size_t)(term == 0 ? Hl * H : 0) * es;
                bias = (const char *)L->qkv_bias + (size_t)(term == 0 ? Hl : 0) * es;
            } else {
                void *pw, *pb;
                const char *proj = term == 0 ? "pos_key_proj" : "pos_query_proj";
                snprintf(name, sizeof name, "encoder.layer.%d.attention.self.%s.weight", l, proj);
                TRY(load_part(ld, name, H, H, head_rows(cfg, &w->tp), &pw));
                snprintf(name, sizeof name, "encoder.layer.%d.attention.self.%s.bias", l, proj);
                TRY(load_part(ld, name, H, 0, head_rows(cfg, &w->tp), &pb));
                weight = pw, bias = pb;
            }
            void **out = term == 0 ? &L->rel_pos_key : &L->rel_pos_query;
            TRY(alloc_tensor(ld, (size_t)(R * Hl), out));
            TRY(ld->be->gemm(ld->be, *out, table, weight, bias, NULL, (int32_t)R, (int32_t)H,
                             (int32_t)Hl, NOPAD_EPILOGUE_BIAS, cfg->activation));
        }
    }
    return ld->be->synchronize(ld->be);
}

/* Checkpoints saved from task models (BertForSequenceClassification, ...) put the encoder under
 * "bert.", "roberta.", ...; find the prefix from the word-embedding tensor. */
static nopad_status find_prefix(loader *ld) {
    static const char *const suffix = "embeddings.word_embeddings.weight";
    const size_t suffix_len = strlen(suffix);
    const char *best = NULL;
    size_t best_len = 0;
    for (int f = 0; f < ld->ckpt->n_files; f++) {
        const safetensors_file *file = &ld->ckpt->files[f];
        for (int i = 0; i < file->n_tensors; i++) {
            const char *name = file->tensors[i].name;
            size_t len = strlen(name);
            if (len < suffix_len || strcmp(name + len - suffix_len, suffix) != 0) continue;
            size_t plen = len - suffix_len;
            if (plen > 0 && name[plen - 1] != '.') continue;
            if (!best || plen < best_len) {
                best = name;
                best_len = plen;
            }
        }
    }
    if (!best)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: required tensor '%s' is missing (no tensor "
                               "name ends with it)", ld->where, suffix);
    if (best_len >= sizeof ld->prefix)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: tensor name prefix too long", ld->where);
    memcpy(ld->prefix, best, best_len);
    ld->prefix[best_len] = '\0';
    return NOPAD_OK;
}

/* The tensor `name` under the checkpoint's prefix, or NULL. */
static const safetensors_tensor *find(const loader *ld, const char *name) {
    char full[256];
    snprintf(full, sizeof full, "%s%s", ld->prefix, name);
    return safetensors_checkpoint_find(ld->ckpt, full);
}

/* Where config.json and the weights disagree in a way the shape checks of load_into cannot see
 * (a tensor the config says is absent, layers past the config's count), an error naming both;
 * every such rule lives here. Loading such a pair would silently drop weights. */
static nopad_status check_config_against_weights(const loader *ld, const model_config *cfg) {
    const safetensors_tensor *types = find(ld, "embeddings.token_type_embeddings.weight");
    if (cfg->type_vocab_size == 0 && types && cfg->family != FAMILY_DISTILBERT)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: config.json says type_vocab_size 0 (no token types), but the weights "
                               "hold '%sembeddings.token_type_embeddings.weight' with %lld rows; the two "
                               "files disagree (set type_vocab_size to %lld, or drop the tensor)",
                               ld->where, ld->prefix, (long long)types->shape[0], (long long)types->shape[0]);
    char name[160];
    int expected = cfg->num_layers;
    const char *what = "num_hidden_layers";
    if (cfg->family == FAMILY_ALBERT) {
        snprintf(name, sizeof name, "encoder.albert_layer_groups.%d.albert_layers.0.ffn.weight",
                 cfg->num_hidden_groups);
        expected = cfg->num_hidden_groups;
        what = "num_hidden_groups";
    } else {
        snprintf(name, sizeof name, cfg->family == FAMILY_DISTILBERT ? "transformer.layer.%d.ffn.lin1.weight"
                                                                    : "encoder.layer.%d.intermediate.dense.weight",
                 cfg->num_layers);
    }
    if (find(ld, name))
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: config.json says %s %d, but the weights hold more ('%s%s' exists); the "
                               "two files disagree",
                               ld->where, what, expected, ld->prefix, name);
    return NOPAD_OK;
}

/* The classification head's tensors, at the checkpoint's top level (not under the encoder's
 * prefix, except BERT's and ALBERT's poolers, which live inside the encoder). */
static nopad_status load_head(loader *ld, const model_config *cfg, encoder_weights *w) {
    const int64_t H = cfg->hidden_size, L = cfg->head.num_labels;
    const char *dense = NULL, *out = "classifier";
    int in_encoder = 0;
    switch (cfg->family) {
    case FAMILY_BERT: dense = "pooler.dense", in_encoder = 1; break;
    case FAMILY_ALBERT: dense = "pooler", in_encoder = 1; break;
    case FAMILY_ROBERTA: dense = "classifier.dense", out = "classifier.out_proj"; break;
    case FAMILY_DISTILBERT: dense = "pre_classifier"; break;
    case FAMILY_DEBERTA_V2: dense = "pooler.dense"; break;
    case FAMILY_GPT2:
    case FAMILY_LLAMA: return nopad_set_error(NOPAD_ERR_INTERNAL, "%s: not an encoder", ld->where);
    }
    char name[160], prefix[sizeof ld->prefix];
    memcpy(prefix, ld->prefix, sizeof prefix);
    snprintf(name, sizeof name, "%s.weight", out);
    ld->prefix[0] = '\0';
    const safetensors_tensor *t = safetensors_checkpoint_find(ld->ckpt, name);
    nopad_status st = NOPAD_OK;
    if (t && t->ndim == 2 && t->shape[0] != L)
        st = nopad_set_error(NOPAD_ERR_FORMAT,
                             "%s: config.json's id2label names %lld labels, but the classifier "
                             "'%s' has %lld rows (shape [%lld, %lld]); the two files disagree",
                             ld->where, (long long)L, name, (long long)t->shape[0],
                             (long long)t->shape[0], (long long)t->shape[1]);
    if (st == NOPAD_OK) st = load(ld, name, L, H, &w->head_out_weight);
    snprintf(name, sizeof name, "%s.bias", out);
    if (st == NOPAD_OK) st = load(ld, name, L, 0, &w->head_out_bias);
    if (in_encoder) memcpy(ld->prefix, prefix, sizeof prefix);
    snprintf(name, sizeof name, "%s.weight", dense);
    if (st == NOPAD_OK) st = load(ld, name, H, H, &w->head_dense_weight);
    snprintf(name, sizeof name, "%s.bias", dense);
    if (st == NOPAD_OK) st = load(ld, name, H, 0, &w->head_dense_bias);
    memcpy(ld->prefix, prefix, sizeof prefix);
    return st;
}

static nopad_status load_all(loader *ld, const model_config *cfg, encoder_weights *w) {
    const int64_t E = cfg->embedding_size, H = cfg->hidden_size;
    TRY(find_prefix(ld));
    TRY(check_config_against_weights(ld, cfg));
    TRY(load(ld, "embeddings.word_embeddings.weight", cfg->vocab_size, E, &w->word_embeddings));
    if (cfg->absolute_positions)
        TRY(load(ld, "embeddings.position_embeddings.weight", cfg->max_position_embeddings, E,
                 &w->position_embeddings));
    if (cfg->type_vocab_size > 0)
        TRY(load(ld, "embeddings.token_type_embeddings.weight", cfg->type_vocab_size, E,
                 &w->type_embeddings));
    TRY(load(ld, "embeddings.LayerNorm.weight", E, 0, &w->embed_ln_weight));
    TRY(load(ld, "embeddings.LayerNorm.bias", E, 0, &w->embed_ln_bias));

    char layer_prefix[160];
    switch (cfg->family) {
    case FAMILY_BERT:
    case FAMILY_ROBERTA:
    case FAMILY_DEBERTA_V2:
    case FAMILY_DISTILBERT: {
        w->n_layer_weights = cfg->num_layers;
        w->layers = calloc((size_t)cfg->num_layers, sizeof *w->layers);
        w->n_steps = cfg->num_layers;
        w->schedule = calloc((size_t)cfg->num_layers, sizeof *w->schedule);
        if (!w->layers || !w->schedule)
            return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", ld->where);
        int distil = cfg->family == FAMILY_DISTILBERT;
        for (int l = 0; l < cfg->num_layers; l++) {
            snprintf(layer_prefix, sizeof layer_prefix,
                     distil ? "transformer.layer.%d." : "encoder.layer.%d.", l);
            const layer_names *names = distil                                ? &DISTILBERT_LAYER
                                       : cfg->family == FAMILY_DEBERTA_V2 ? &DEBERTA_LAYER
                                                                          : &BERT_LAYER;
            TRY(load_layer(ld, cfg, layer_prefix, names, &w->layers[l]));
            w->schedule[l] = &w->layers[l];
        }
        if (cfg->rel.enabled && (cfg->rel.c2p || cfg->rel.p2c)) TRY(load_relative_tables(ld, cfg, w));
        break;
    }
    case FAMILY_GPT2:
    case FAMILY_LLAMA:
        return nopad_set_error(NOPAD_ERR_INTERNAL, "%s: not an encoder", ld->where);
    case FAMILY_ALBERT: {
        TRY(load(ld, "encoder.embedding_hidden_mapping_in.weight", H, E, &w->embed_proj_weight));
        TRY(load(ld, "encoder.embedding_hidden_mapping_in.bias", H, 0, &w->embed_proj_bias));
        const int groups = cfg->num_hidden_groups, inner = cfg->inner_group_num;
        w->n_layer_weights = groups * inner;
        w->layers = calloc((size_t)w->n_layer_weights, sizeof *w->layers);
        /* As HF's AlbertTransformer: step i of num_hidden_layers runs group
         * i / (num_hidden_layers / num_hidden_groups), which applies its inner layers in order. */
        w->n_steps = cfg->num_layers * inner;
        w->schedule = calloc((size_t)w->n_steps, sizeof *w->schedule);
        if (!w->layers || !w->schedule)
            return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", ld->where);
        for (int g = 0; g < groups; g++) {
            for (int j = 0; j < inner; j++) {
                snprintf(layer_prefix, sizeof layer_prefix,
                         "encoder.albert_layer_groups.%d.albert_layers.%d.", g, j);
                TRY(load_layer(ld, cfg, layer_prefix, &ALBERT_LAYER, &w->layers[g * inner + j]));
            }
        }
        const int layers_per_group = cfg->num_layers / groups;
        for (int i = 0; i < cfg->num_layers; i++)
            for (int j = 0; j < inner; j++)
                w->schedule[i * inner + j] = &w->layers[(i / layers_per_group) * inner + j];
        break;
    }
    }
    if (cfg->head.present) TRY(load_head(ld, cfg, w));
    return NOPAD_OK;
}
#undef TRY

nopad_status encoder_weights_load(nopad_backend *be, const model_config *cfg,
                                  const safetensors_checkpoint *ckpt, const char *where,
                                  encoder_weights *out, const tp_shard *tp) {
    memset(out, 0, sizeof *out);
    nopad_status st;
    if (tp && tp->size > 1) {
        /* a shard planned for another config would read past tensors or leave heads out */
        if (tp->heads * tp->size != cfg->num_heads || tp->ffn * tp->size != cfg->intermediate_size)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "%s: tensor-parallel shard of %d heads and %d intermediate columns "
                                   "on each of %d ranks does not match the config's %d heads and "
                                   "intermediate size %d (plan it with tp_shard_plan for this config)",
                                   where, tp->heads, tp->ffn, tp->size, cfg->num_heads,
                                   cfg->intermediate_size);
        out->tp = *tp;
    } else if ((st = tp_shard_plan(cfg, NULL, 0, 1, &out->tp)) != NOPAD_OK) {
        return nopad_wrap_error(st, "%s", where);
    }
    loader ld = {.be = be, .ckpt = ckpt, .where = where, .w = out};
    st = load_all(&ld, cfg, out);
    free(ld.scratch);
    if (st != NOPAD_OK) {
        encoder_weights_free(be, out);
        return st;
    }
    unsigned m = ld.dtype_mask;
    const char *name = m == (1u << ST_F32)    ? "F32"
                       : m == (1u << ST_F16)  ? "F16"
                       : m == (1u << ST_BF16) ? "BF16"
                                              : "mixed";
    snprintf(out->weights_dtype, sizeof out->weights_dtype, "%s", name);
    return NOPAD_OK;
}

void encoder_weights_free(nopad_backend *be, encoder_weights *w) {
    if (!w) return;
    for (int i = 0; i < w->n_allocations; i++) be->free(be, w->allocations[i]);
    free(w->allocations);
    free(w->layers);
    free(w->schedule);
    memset(w, 0, sizeof *w);
}

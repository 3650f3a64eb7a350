/* Loading decoder weights from a safetensors checkpoint or a GGUF file: every tensor by its
 * Hugging Face name (GGUF names are mapped), shape-checked against the config, converted to
 * float32, fused (Q|K|V into one matrix, LLaMA's gate|up into one), then to the backend's dtype.
 * GPT-2's Conv1D weights are stored [in, out] and are transposed to nn.Linear's [out, in]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/gguf.h"
#include "io/gguf_dequant.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "util/error.h"

typedef struct source source;
struct source {
    const char *where;
    /* The float32 values of the tensor with HF name `name` into *data (the source's scratch,
     * valid until the next call) and its shape as [rows, cols] (cols = 1 for vectors), or
     * *found = 0. */
    nopad_status (*fetch)(source *src, const char *name, float **data, int64_t *rows,
                          int64_t *cols, int *found);
    const safetensors_checkpoint *ckpt;
    const gguf_file *gguf;
    const model_config *cfg;
    float *scratch, *scratch2;
    size_t cap, cap2;
    const char *dtype; /* of the checkpoint, for info */
};

static nopad_status reserve(float **buf, size_t *cap, size_t n, const char *where) {
    if (n <= *cap) return NOPAD_OK;
    float *grown = realloc(*buf, n * sizeof(float));
    if (!grown) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", where);
    *buf = grown;
    *cap = n;
    return NOPAD_OK;
}

/* safetensors: the name as given, or under the task model's or the base model's prefix */
static nopad_status st_fetch(source *src, const char *name, float **data, int64_t *rows,
                             int64_t *cols, int *found) {
    static const char *const prefixes[] = {"", "transformer.", "model."};
    const safetensors_tensor *t = NULL;
    char full[256];
    for (size_t i = 0; i < 3 && !t; i++) {
        snprintf(full, sizeof full, "%s%s", prefixes[i], name);
        t = safetensors_checkpoint_find(src->ckpt, full);
        /* GPT2Model checkpoints drop "transformer.", LlamaModel ones keep "model." only inside */
        if (!t && strncmp(name, "transformer.", 12) == 0) t = safetensors_checkpoint_find(src->ckpt, name + 12);
        if (!t && strncmp(name, "model.", 6) == 0) t = safetensors_checkpoint_find(src->ckpt, name + 6);
    }
    *found = t != NULL;
    if (!t) return NOPAD_OK;
    if (t->ndim < 1 || t->ndim > 2)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: tensor '%s' has %d dimensions, expected 1 or 2",
                               src->where, t->name, t->ndim);
    *rows = t->shape[0];
    *cols = t->ndim == 2 ? t->shape[1] : 1;
    nopad_status st = reserve(&src->scratch, &src->cap, (size_t)t->n_elements, src->where);
    if (st == NOPAD_OK) st = safetensors_to_f32(t, src->scratch);
    if (st != NOPAD_OK) return nopad_wrap_error(st, "%s", src->where);
    src->dtype = safetensors_dtype_name(t->dtype);
    *data = src->scratch;
    return NOPAD_OK;
}

/* llama.cpp's converter stores each head of Q and K with its two rotary halves interleaved
 * (row h·D + 2i + j holds HF's row h·D + j·D/2 + i); put them back in HF's order. */
static void unpermute_rows(float *dst, const float *src, int64_t n_heads, int64_t head_size,
                           int64_t cols) {
    const int64_t half = head_size / 2;
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t i = 0; i < half; i++)
            for (int64_t j = 0; j < 2; j++)
                memcpy(dst + (h * head_size + j * half + i) * cols,
                       src + (h * head_size + 2 * i + j) * cols, (size_t)cols * sizeof(float));
}

/* GGUF: HF names mapped to llama.cpp's */
static nopad_status gguf_fetch(source *src, const char *name, float **data, int64_t *rows,
                               int64_t *cols, int *found) {
    static const struct { const char *hf, *gguf; } map[] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},  {"self_attn.q_proj.bias", "attn_q.bias"},
        {"self_attn.k_proj.weight", "attn_k.weight"},  {"self_attn.k_proj.bias", "attn_k.bias"},
        {"self_attn.v_proj.weight", "attn_v.weight"},  {"self_attn.v_proj.bias", "attn_v.bias"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},   {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    char gname[128] = "";
    int layer = -1, permute_heads = 0;
    char rest[96];
    if (sscanf(name, "model.layers.%d.%95s", &layer, rest) == 2) {
        for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
            if (strcmp(rest, map[i].hf) == 0) snprintf(gname, sizeof gname, "blk.%d.%s", layer, map[i].gguf);
        if (strstr(rest, "q_proj")) permute_heads = src->cfg->num_heads;
        if (strstr(rest, "k_proj")) permute_heads = src->cfg->num_kv_heads;
    } else if (strcmp(name, "model.embed_tokens.weight") == 0) {
        snprintf(gname, sizeof gname, "token_embd.weight");
    } else if (strcmp(name, "model.norm.weight") == 0) {
        snprintf(gname, sizeof gname, "output_norm.weight");
    } else if (strcmp(name, "lm_head.weight") == 0) {
        snprintf(gname, sizeof gname, "output.weight");
    }
    *found = 0;
    if (!gname[0]) return NOPAD_OK;
    const gguf_tensor *t = NULL;
    for (uint64_t i = 0; i < src->gguf->n_tensors && !t; i++)
        if (strcmp(src->gguf->tensors[i].name, gname) == 0) t = &src->gguf->tensors[i];
    if (!t) return NOPAD_OK;
    *found = 1;
    if (t->n_dims < 1 || t->n_dims > 2)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: tensor '%s' has %u dimensions, expected 1 or 2",
                               src->where, gname, t->n_dims);
    /* GGUF dims[0] is the fastest: a [in, out] tensor is out rows of in values */
    *cols = t->n_dims == 2 ? t->dims[0] : 1;
    *rows = t->n_dims == 2 ? t->dims[1] : t->dims[0];
    nopad_status st = reserve(&src->scratch, &src->cap, (size_t)t->n_elements, src->where);
    if (st == NOPAD_OK) st = gguf_tensor_to_f32(src->gguf, t, src->scratch);
    if (st != NOPAD_OK) return st;
    const char *tn = gguf_tensor_type_name(t->type);
    if (t->n_dims == 2 && tn) src->dtype = tn;
    *data = src->scratch;
    /* the rotary interleave of llama.cpp's llama architecture (its qwen2 keeps HF's order) */
    if (permute_heads > 0 && src->cfg->family == FAMILY_LLAMA && strcmp(src->cfg->model_type, "qwen2") != 0) {
        const int64_t D = src->cfg->head_size;
        if (D % 2 != 0) /* the halves would skip a row of each head */
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: tensor '%s': head size %lld is odd",
                                   src->where, gname, (long long)D);
        if (*rows != permute_heads * D)
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: tensor '%s' has %lld rows, expected %lld",
                                   src->where, gname, (long long)*rows, (long long)(permute_heads * D));
        st = reserve(&src->scratch2, &src->cap2, (size_t)t->n_elements, src->where);
        if (st != NOPAD_OK) return st;
        unpermute_rows(src->scratch2, src->scratch, permute_heads, D, *cols);
        *data = src->scratch2;
    }
    return NOPAD_OK;
}

/* ---- building the weights ------------------------------------------------------------------- */

typedef struct loader {
    nopad_backend *be;
    source *src;
    decoder_weights *w;
} loader;

static nopad_status track_alloc(loader *ld, size_t n, void **out) {
    decoder_weights *w = ld->w;
    void **grown = realloc(w->allocations, (size_t)(w->n_allocations + 1) * sizeof *grown);
    if (!grown) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", ld->src->where);
    w->allocations = grown;
    nopad_status st = ld->be->alloc(ld->be, n * nopad_dtype_size(ld->be->dtype), out);
    if (st != NOPAD_OK) return st;
    w->allocations[w->n_allocations++] = *out;
    w->bytes += n * nopad_dtype_size(ld->be->dtype);
    return NOPAD_OK;
}

/* Fetches `name`, checks it is [rows, cols] (or, transposed, [cols, rows] stored: GPT-2's
 * Conv1D) and uploads rows [r0, r0 + nr) × columns [c0, c0 + nc) of it (a tensor-parallel rank's
 * part; the whole tensor: 0, rows, 0, cols) at dst + offset elements. Missing and optional:
 * *found = 0. */
static nopad_status put_part(loader *ld, const char *name, int64_t rows, int64_t cols, int transposed,
                             int64_t r0, int64_t nr, int64_t c0, int64_t nc, void *dst, size_t offset,
                             int optional, int *found_out) {
    float *data;
    int64_t r, c;
    int found;
    nopad_status st = ld->src->fetch(ld->src, name, &data, &r, &c, &found);
    if (st != NOPAD_OK) return st;
    if (found_out) *found_out = found;
    if (!found)
        return optional ? NOPAD_OK
                        : nopad_set_error(NOPAD_ERR_FORMAT, "%s: required tensor '%s' is missing",
                                          ld->src->where, name);
    const int64_t want_r = transposed ? cols : rows, want_c = transposed ? rows : cols;
    if (r != want_r || c != want_c)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld] for "
                               "this config",
                               ld->src->where, name, (long long)r, (long long)c,
                               (long long)want_r, (long long)want_c);
    const size_t n = (size_t)(rows * cols);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(data[i]))
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: tensor '%s' holds %s at element %zu; the weights are corrupt",
                                   ld->src->where, name, isnan(data[i]) ? "NaN" : "an infinity", i);
    if (transposed) {
        st = reserve(&ld->src->scratch2, &ld->src->cap2, n, ld->src->where);
        if (st != NOPAD_OK) return st;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) ld->src->scratch2[i * cols + j] = data[j * rows + i];
        data = ld->src->scratch2;
    }
    ld->w->n_params += (int64_t)n; /* the whole model's count, on every rank */
    if (r0 != 0 || nr != rows || c0 != 0 || nc != cols) {
        /* compact the part in place: row i of it is read from at or after where it is written */
        for (int64_t i = 0; i < nr; i++)
            memmove(data + i * nc, data + (r0 + i) * cols + c0, (size_t)nc * sizeof(float));
    }
    char *base = (char *)dst + offset * nopad_dtype_size(ld->be->dtype);
    return ld->be->upload_f32(ld->be, base, data, (size_t)(nr * nc));
}

static nopad_status put(loader *ld, const char *name, int64_t rows, int64_t cols, int transposed,
                        void *dst, size_t offset, int optional, int *found_out) {
    return put_part(ld, name, rows, cols, transposed, 0, rows, 0, cols, dst, offset, optional, found_out);
}

static nopad_status get(loader *ld, const char *name, int64_t rows, int64_t cols, int transposed,
                        void **out) {
    nopad_status st = track_alloc(ld, (size_t)(rows * cols), out);
    return st == NOPAD_OK ? put(ld, name, rows, cols, transposed, *out, 0, 0, NULL) : st;
}

/* A tensor-parallel part held whole in a buffer of its own: rows [r0, r0 + nr), columns
 * [c0, c0 + nc) of the [rows, cols] tensor. */
static nopad_status get_part(loader *ld, const char *name, int64_t rows, int64_t cols, int transposed,
                             int64_t r0, int64_t nr, int64_t c0, int64_t nc, void **out) {
    nopad_status st = track_alloc(ld, (size_t)(nr * nc), out);
    return st == NOPAD_OK ? put_part(ld, name, rows, cols, transposed, r0, nr, c0, nc, *out, 0, 0, NULL) : st;
}

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        nopad_status st_ = (expr);                                                                 \
        if (st_ != NOPAD_OK) return st_;                                                           \
    } while (0)

static nopad_status load_gpt2(loader *ld, const model_config *c) {
    decoder_weights *w = ld->w;
    const tp_shard *tp = &w->tp;
    const int64_t H = c->hidden_size, F = c->intermediate_size, D = c->head_size;
    const int64_t hd = (int64_t)tp->heads * D, h0 = (int64_t)tp->head0 * D; /* GPT-2: KV heads = heads */
    TRY(get_part(ld, "transformer.wte.weight", c->vocab_size, H, 0, tp->vocab0, tp->vocab_rows, 0, H, &w->tok_emb));
    TRY(get(ld, "transformer.wpe.weight", c->max_position_embeddings, H, 0, &w->pos_emb));
    char n[128];
    for (int32_t l = 0; l < c->num_layers; l++) {
        decoder_layer *L = &w->layers[l];
#define NAME(suffix) (snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix), n)
        TRY(get(ld, NAME("ln_1.weight"), H, 1, 0, &L->norm1_w));
        TRY(get(ld, NAME("ln_1.bias"), H, 1, 0, &L->norm1_b));
        /* c_attn is q | k | v rows (after the transpose): this rank's heads of each */
        TRY(track_alloc(ld, (size_t)(3 * hd * H), &L->qkv_w));
        TRY(track_alloc(ld, (size_t)(3 * hd), &L->qkv_b));
        for (int64_t part = 0; part < 3; part++) {
            TRY(put_part(ld, NAME("attn.c_attn.weight"), 3 * H, H, 1, part * H + h0, hd, 0, H, L->qkv_w,
                         (size_t)(part * hd * H), 0, NULL));
            TRY(put_part(ld, NAME("attn.c_attn.bias"), 3 * H, 1, 0, part * H + h0, hd, 0, 1, L->qkv_b,
                         (size_t)(part * hd), 0, NULL));
        }
        TRY(get_part(ld, NAME("attn.c_proj.weight"), H, H, 1, 0, H, h0, hd, &L->o_w));
        if (tp->rank == 0) TRY(get(ld, NAME("attn.c_proj.bias"), H, 1, 0, &L->o_b)); /* added once */
        TRY(get(ld, NAME("ln_2.weight"), H, 1, 0, &L->norm2_w));
        TRY(get(ld, NAME("ln_2.bias"), H, 1, 0, &L->norm2_b));
        TRY(get_part(ld, NAME("mlp.c_fc.weight"), F, H, 1, tp->ffn0, tp->ffn, 0, H, &L->up_w));
        TRY(get_part(ld, NAME("mlp.c_fc.bias"), F, 1, 0, tp->ffn0, tp->ffn, 0, 1, &L->up_b));
        TRY(get_part(ld, NAME("mlp.c_proj.weight"), H, F, 1, 0, H, tp->ffn0, tp->ffn, &L->down_w));
        if (tp->rank == 0) TRY(get(ld, NAME("mlp.c_proj.bias"), H, 1, 0, &L->down_b));
#undef NAME
    }
    TRY(get(ld, "transformer.ln_f.weight", H, 1, 0, &w->final_norm_w));
    TRY(get(ld, "transformer.ln_f.bias", H, 1, 0, &w->final_norm_b));
    w->lm_head = w->tok_emb; /* GPT2LMHeadModel ties its head */
    return NOPAD_OK;
}

static nopad_status load_llama(loader *ld, const model_config *c) {
    decoder_weights *w = ld->w;
    const tp_shard *tp = &w->tp;
    const int64_t H = c->hidden_size, F = c->intermediate_size, D = c->head_size;
    const int64_t qd = (int64_t)c->num_heads * D, kd = (int64_t)c->num_kv_heads * D;
    /* this rank's rows of Q (its query heads), of K and V (its key/value heads), of gate and up
     * (its intermediate columns); whole when tp is 1 */
    const int64_t q0 = (int64_t)tp->head0 * D, qn = (int64_t)tp->heads * D;
    const int64_t k0 = (int64_t)tp->kv_head0 * D, kn = (int64_t)tp->kv_heads * D;
    const int64_t f0 = tp->ffn0, fn = tp->ffn;
    TRY(get_part(ld, "model.embed_tokens.weight", c->vocab_size, H, 0, tp->vocab0, tp->vocab_rows, 0, H,
                 &w->tok_emb));
    char n[128];
    for (int32_t l = 0; l < c->num_layers; l++) {
        decoder_layer *L = &w->layers[l];
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), n)
        TRY(get(ld, NAME("input_layernorm.weight"), H, 1, 0, &L->norm1_w));
        TRY(track_alloc(ld, (size_t)((qn + 2 * kn) * H), &L->qkv_w));
        TRY(put_part(ld, NAME("self_attn.q_proj.weight"), qd, H, 0, q0, qn, 0, H, L->qkv_w, 0, 0, NULL));
        TRY(put_part(ld, NAME("self_attn.k_proj.weight"), kd, H, 0, k0, kn, 0, H, L->qkv_w, (size_t)(qn * H), 0, NULL));
        TRY(put_part(ld, NAME("self_attn.v_proj.weight"), kd, H, 0, k0, kn, 0, H, L->qkv_w,
                     (size_t)((qn + kn) * H), 0, NULL));
        if (c->qkv_bias) {
            TRY(track_alloc(ld, (size_t)(qn + 2 * kn), &L->qkv_b));
            TRY(put_part(ld, NAME("self_attn.q_proj.bias"), qd, 1, 0, q0, qn, 0, 1, L->qkv_b, 0, 0, NULL));
            TRY(put_part(ld, NAME("self_attn.k_proj.bias"), kd, 1, 0, k0, kn, 0, 1, L->qkv_b, (size_t)qn, 0, NULL));
            TRY(put_part(ld, NAME("self_attn.v_proj.bias"), kd, 1, 0, k0, kn, 0, 1, L->qkv_b, (size_t)(qn + kn), 0,
                         NULL));
        }
        TRY(get_part(ld, NAME("self_attn.o_proj.weight"), H, qd, 0, 0, H, q0, qn, &L->o_w));
        if (c->o_bias && tp->rank == 0) TRY(get(ld, NAME("self_attn.o_proj.bias"), H, 1, 0, &L->o_b)); /* added once */
        TRY(get(ld, NAME("post_attention_layernorm.weight"), H, 1, 0, &L->norm2_w));
        TRY(track_alloc(ld, (size_t)(2 * fn * H), &L->up_w));
        TRY(put_part(ld, NAME("mlp.gate_proj.weight"), F, H, 0, f0, fn, 0, H, L->up_w, 0, 0, NULL));
        TRY(put_part(ld, NAME("mlp.up_proj.weight"), F, H, 0, f0, fn, 0, H, L->up_w, (size_t)(fn * H), 0, NULL));
        TRY(get_part(ld, NAME("mlp.down_proj.weight"), H, F, 0, 0, H, f0, fn, &L->down_w));
#undef NAME
    }
    TRY(get(ld, "model.norm.weight", H, 1, 0, &w->final_norm_w));
    /* an untied head; a tied one may still be stored (it equals the embeddings) */
    if (!c->tie_word_embeddings) {
        TRY(get_part(ld, "lm_head.weight", c->vocab_size, H, 0, tp->vocab0, tp->vocab_rows, 0, H, &w->lm_head));
    } else {
        w->lm_head = w->tok_emb;
    }
    float *inv = malloc((size_t)(D / 2) * sizeof *inv);
    if (!inv) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", ld->src->where);
    decoder_rope_inv_freq(c, inv);
    /* float32 whatever the compute dtype: the rotation angles need the precision */
    void *dst;
    nopad_status st = ld->be->alloc(ld->be, (size_t)(D / 2) * sizeof(float), &dst);
    if (st == NOPAD_OK) {
        void **grown = realloc(w->allocations, (size_t)(w->n_allocations + 1) * sizeof *grown);
        if (!grown) {
            ld->be->free(ld->be, dst);
            st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "out of memory");
        } else {
            w->allocations = grown;
            w->allocations[w->n_allocations++] = dst;
            w->inv_freq = dst;
            /* a bit copy: upload_i32 moves 32-bit words unchanged */
            st = ld->be->upload_i32(ld->be, dst, (const int32_t *)inv, (size_t)(D / 2));
        }
    }
    free(inv);
    return st;
}

static nopad_status load(nopad_backend *be, const model_config *cfg, const tp_shard *tp, source *src,
                         decoder_weights *out) {
    memset(out, 0, sizeof *out);
    nopad_status planned = tp ? NOPAD_OK : tp_shard_plan(cfg, NULL, 0, 1, &out->tp);
    if (tp) out->tp = *tp;
    if (planned != NOPAD_OK) return planned;
    out->layers = calloc((size_t)cfg->num_layers, sizeof *out->layers);
    if (!out->layers) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", src->where);
    loader ld = {.be = be, .src = src, .w = out};
    nopad_status st = cfg->family == FAMILY_GPT2 ? load_gpt2(&ld, cfg) : load_llama(&ld, cfg);
    out->weights_dtype = src->dtype ? src->dtype : "F32";
    free(src->scratch);
    free(src->scratch2);
    if (st != NOPAD_OK) decoder_weights_free(be, out);
    return st;
}

nopad_status decoder_weights_load_st(nopad_backend *be, const model_config *cfg, const tp_shard *tp,
                                     const safetensors_checkpoint *ckpt, const char *where,
                                     decoder_weights *out) {
    source src = {.where = where, .fetch = st_fetch, .ckpt = ckpt, .cfg = cfg};
    return load(be, cfg, tp, &src, out);
}

nopad_status decoder_weights_load_gguf(nopad_backend *be, const model_config *cfg, const tp_shard *tp,
                                       const gguf_file *f, decoder_weights *out) {
    source src = {.where = f->path ? f->path : "gguf", .fetch = gguf_fetch, .gguf = f, .cfg = cfg};
    return load(be, cfg, tp, &src, out);
}

void decoder_weights_free(nopad_backend *be, decoder_weights *w) {
    for (int32_t i = 0; i < w->n_allocations; i++) be->free(be, w->allocations[i]);
    free(w->allocations);
    free(w->layers);
    memset(w, 0, sizeof *w);
}

/* Loading decoder weights from a safetensors checkpoint or a GGUF file: every tensor by its
 * Hugging Face name (GGUF names are mapped), shape-checked against the config, converted to
 * float32, fused (Q|K|V into one matrix, LLaMA's gate|up into one), then to the backend's dtype.
 * GPT-2's Conv1D weights are stored [in, out] and are transposed to nn.Linear's [out, in].
 * FP8 (docs/fp8.md): an F8_E4M3 safetensors weight with its `weight_scale` (per tensor or per
 * output channel) stays FP8 where the backend runs it, and `--weights fp8` quantizes the LLaMA
 * family's linear weights per output channel at load; elsewhere an F8 weight is dequantised
 * (code · scale in float32) like any other. */
#define _DEFAULT_SOURCE /* madvise under -std=c11 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io/fp8.h"
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
    const char *dtype;  /* of the checkpoint, for info */
    const char *stored; /* of the tensor fetched last, for the weight groups */
};

static nopad_status reserve(float **buf, size_t *cap, size_t n, const char *where) {
    if (n <= *cap) return NOPAD_OK;
    float *grown = realloc(*buf, n * sizeof(float));
    if (!grown) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", where);
    *buf = grown;
    *cap = n;
    return NOPAD_OK;
}

/* safetensors: the tensor of `name` as given, or under the task model's or the base model's
 * prefix, or NULL. */
static const safetensors_tensor *st_find(const source *src, const char *name) {
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
    return t;
}

/* The tensor beside F8 weight t ("<t minus .weight>.<suffix>"), or NULL. */
static const safetensors_tensor *st_beside(const source *src, const safetensors_tensor *t, const char *suffix) {
    char name[288];
    const size_t n = strlen(t->name);
    const size_t stem = n > 7 && strcmp(t->name + n - 7, ".weight") == 0 ? n - 7 : n;
    snprintf(name, sizeof name, "%.*s.%s", (int)stem, t->name, suffix);
    return safetensors_checkpoint_find(src->ckpt, name);
}

/* The scale of each of the `rows` rows of F8_E4M3 weight t, into scales[rows]: its
 * `weight_scale`, a scalar or [1] (per tensor, repeated) or [rows] or [rows, 1] (per output
 * channel), finite and positive. Every other FP8 layout is refused, naming the tensor. */
static nopad_status st_fp8_scales(source *src, const safetensors_tensor *t, int64_t rows, float *scales) {
    static const char supported[] = "nopad runs F8_E4M3 weights with a 'weight_scale' per tensor (a scalar or [1]) "
                                    "or per output channel ([N] or [N, 1])";
    const safetensors_tensor *s = st_beside(src, t, "weight_scale");
    if (!s) {
        const safetensors_tensor *inv = st_beside(src, t, "weight_scale_inv");
        if (inv)
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                   "%s: tensor '%s' has block-wise scales ('%s', %d dimensions): %s, not scales "
                                   "per block",
                                   src->where, t->name, inv->name, inv->ndim, supported);
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: F8_E4M3 tensor '%s' has no '%s' beside it: %s", src->where,
                               t->name, "weight_scale", supported);
    }
    const int per_tensor = s->n_elements == 1 && (s->ndim == 0 || s->ndim == 1 || (s->ndim == 2 && s->shape[0] == 1));
    const int per_channel = s->n_elements == rows && (s->ndim == 1 || (s->ndim == 2 && s->shape[1] == 1));
    if (!per_tensor && !per_channel) {
        char shape[96] = "";
        for (int d = 0; d < s->ndim; d++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", d ? ", " : "",
                     (long long)s->shape[d]);
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: tensor '%s' has a '%s' of shape [%s] for %lld rows: %s",
                               src->where, t->name, s->name, shape, (long long)rows, supported);
    }
    float one[1];
    nopad_status st = safetensors_to_f32(s, per_tensor ? one : scales);
    if (st != NOPAD_OK) return nopad_wrap_error(st, "%s", src->where);
    for (int64_t r = 0; r < rows; r++) {
        if (per_tensor) scales[r] = one[0];
        if (!(scales[r] > 0.0f) || !isfinite(scales[r]))
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: tensor '%s' has a scale of %g for row %lld (expected finite "
                                   "and positive)", src->where, s->name, (double)scales[r], (long long)r);
    }
    return NOPAD_OK;
}

/* An F8 safetensors weight's codes as float32 values (code · its row's scale), into dst[rows, cols]. */
static nopad_status st_fp8_to_f32(source *src, const safetensors_tensor *t, int64_t rows, int64_t cols, float *dst) {
    float *scales = malloc((size_t)rows * sizeof *scales);
    if (!scales) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", src->where);
    nopad_status st = st_fp8_scales(src, t, rows, scales);
    const uint8_t *codes = t->data;
    for (int64_t r = 0; r < rows && st == NOPAD_OK; r++)
        for (int64_t c = 0; c < cols; c++) dst[r * cols + c] = fp8_e4m3_to_f32(codes[r * cols + c]) * scales[r];
    free(scales);
    return st;
}

/* FP8 layouts other than E4M3 with per-tensor or per-channel scales: refused, naming the tensor. */
static nopad_status st_check_fp8(const source *src, const safetensors_tensor *t) {
    if (t->dtype == ST_F8_E5M2)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: tensor '%s' is F8_E5M2: nopad runs FP8 weights stored as F8_E4M3, with a "
                               "'weight_scale' per tensor or per output channel",
                               src->where, t->name);
    if (t->dtype == ST_F8_E4M3 && t->ndim != 2)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: F8_E4M3 tensor '%s' has %d dimensions: nopad runs FP8 "
                               "weight matrices only ([out, in])", src->where, t->name, t->ndim);
    return NOPAD_OK;
}

static nopad_status st_fetch(source *src, const char *name, float **data, int64_t *rows,
                             int64_t *cols, int *found) {
    const safetensors_tensor *t = st_find(src, name);
    *found = t != NULL;
    if (!t) return NOPAD_OK;
    if (t->ndim < 1 || t->ndim > 2)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: tensor '%s' has %d dimensions, expected 1 or 2",
                               src->where, t->name, t->ndim);
    *rows = t->shape[0];
    *cols = t->ndim == 2 ? t->shape[1] : 1;
    nopad_status st = st_check_fp8(src, t);
    if (st == NOPAD_OK) st = reserve(&src->scratch, &src->cap, (size_t)t->n_elements, src->where);
    if (st != NOPAD_OK) return st;
    if (t->dtype == ST_F8_E4M3)
        st = st_fp8_to_f32(src, t, *rows, *cols, src->scratch);
    else if ((st = safetensors_to_f32(t, src->scratch)) != NOPAD_OK)
        return nopad_wrap_error(st, "%s", src->where);
    if (st != NOPAD_OK) return st;
    src->stored = safetensors_dtype_name(t->dtype);
    /* the checkpoint's dtype for info: its tensors', or F8_E4M3 once a weight is (the rest of an FP8
     * checkpoint, embeddings and norms, is in a float dtype) */
    if (!src->dtype || strcmp(src->dtype, "F8_E4M3") != 0) src->dtype = src->stored;
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

/* The GGUF tensor of HF name `name` (llama.cpp's name into gname), or NULL; *permute_heads: the
 * heads whose rotary halves llama.cpp's converter interleaved (Q and K of its llama
 * architecture), else 0. */
static const gguf_tensor *gguf_lookup(const source *src, const char *name, char gname[128],
                                      int *permute_heads) {
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
    gname[0] = '\0';
    *permute_heads = 0;
    int layer = -1;
    char rest[96];
    if (sscanf(name, "model.layers.%d.%95s", &layer, rest) == 2) {
        for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
            if (strcmp(rest, map[i].hf) == 0) snprintf(gname, 128, "blk.%d.%s", layer, map[i].gguf);
        if (strstr(rest, "q_proj")) *permute_heads = src->cfg->num_heads;
        if (strstr(rest, "k_proj")) *permute_heads = src->cfg->num_kv_heads;
    } else if (strcmp(name, "model.embed_tokens.weight") == 0) {
        snprintf(gname, 128, "token_embd.weight");
    } else if (strcmp(name, "model.norm.weight") == 0) {
        snprintf(gname, 128, "output_norm.weight");
    } else if (strcmp(name, "lm_head.weight") == 0) {
        snprintf(gname, 128, "output.weight");
    }
    /* the rotary interleave of llama.cpp's llama architecture (its qwen2 keeps HF's order) */
    if (src->cfg->family != FAMILY_LLAMA || strcmp(src->cfg->model_type, "qwen2") == 0) *permute_heads = 0;
    if (!gname[0]) return NULL;
    const gguf_tensor *t = NULL;
    for (uint64_t i = 0; i < src->gguf->n_tensors && !t; i++)
        if (strcmp(src->gguf->tensors[i].name, gname) == 0) t = &src->gguf->tensors[i];
    return t;
}

/* GGUF: HF names mapped to llama.cpp's */
static nopad_status gguf_fetch(source *src, const char *name, float **data, int64_t *rows,
                               int64_t *cols, int *found) {
    char gname[128];
    int permute_heads;
    const gguf_tensor *t = gguf_lookup(src, name, gname, &permute_heads);
    *found = 0;
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
    src->stored = tn;
    *data = src->scratch;
    if (permute_heads > 0) {
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

#define TRY(expr)                                                                           \
    do {                                                                                           \
        nopad_status st_ = (expr);                                                                 \
        if (st_ != NOPAD_OK) return st_;                                                           \
    } while (0)

/* A group and format that was dequantised although native formats were asked for. */
typedef struct notice {
    const char *group;
    char stored[48];
    char reason[112];
    int32_t n_tensors;
} notice;

typedef struct loader {
    nopad_backend *be;
    source *src;
    decoder_weights *w;
    int native;        /* keep block formats the backend runs (GGUF only) */
    int fp8;           /* > 0 (--weights fp8): the LLaMA family's linear weights quantized to FP8
                          E4M3; 0: F8_E4M3 weights kept where the backend runs them; < 0 (a float
                          --weights): everything dequantised */
    int uses_map;      /* a weight points into the GGUF file's mapping */
    notice notices[16];
    int32_t n_notices;
} loader;

/* The group a tensor belongs to, by its HF name (llama.cpp's names for the groups). */
static const char *group_of(const char *name) {
    static const struct { const char *part, *group; } groups[] = {
        {"embed_tokens", "token_embd"}, {"wte.", "token_embd"},       {"wpe.", "position_embd"},
        {"q_proj.weight", "attn_qkv"},  {"k_proj.weight", "attn_qkv"}, {"v_proj.weight", "attn_qkv"},
        {"c_attn.weight", "attn_qkv"},  {"o_proj.weight", "attn_output"},
        {"attn.c_proj.weight", "attn_output"}, {"gate_proj.weight", "ffn_gate_up"},
        {"up_proj.weight", "ffn_gate_up"}, {"c_fc.weight", "ffn_gate_up"},
        {"down_proj.weight", "ffn_down"}, {"mlp.c_proj.weight", "ffn_down"}, {"lm_head", "output"},
    };
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++)
        if (strstr(name, groups[i].part)) return groups[i].group;
    return "norms_biases";
}

/* Counts `bytes` of one tensor under its group and format (held in memory, stored in the file). */
static nopad_status add_to_group(loader *ld, const char *group, const char *held, const char *stored,
                                 size_t bytes) {
    decoder_weights *w = ld->w;
    for (int32_t i = 0; i < w->n_groups; i++) {
        nopad_weight_group *g = &w->groups[i];
        if (strcmp(g->name, group) == 0 && strcmp(g->format, held) == 0 && strcmp(g->stored, stored) == 0) {
            g->n_tensors++;
            g->bytes += bytes;
            return NOPAD_OK;
        }
    }
    nopad_weight_group *grown = realloc(w->groups, (size_t)(w->n_groups + 1) * sizeof *grown);
    if (!grown) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", ld->src->where);
    w->groups = grown;
    w->groups[w->n_groups++] = (nopad_weight_group){.name = group, .format = held, .stored = stored,
                                                    .n_tensors = 1, .bytes = bytes};
    return NOPAD_OK;
}

/* Remembers that a tensor of `group`, stored as `stored`, is dequantised for `reason`. */
static void add_notice(loader *ld, const char *group, const char *stored, const char *reason) {
    for (int32_t i = 0; i < ld->n_notices; i++)
        if (strcmp(ld->notices[i].group, group) == 0 && strcmp(ld->notices[i].stored, stored) == 0 &&
            strcmp(ld->notices[i].reason, reason) == 0) {
            ld->notices[i].n_tensors++;
            return;
        }
    if (ld->n_notices == (int32_t)(sizeof ld->notices / sizeof ld->notices[0])) return;
    notice *n = &ld->notices[ld->n_notices++];
    n->group = group;
    snprintf(n->stored, sizeof n->stored, "%s", stored);
    snprintf(n->reason, sizeof n->reason, "%s", reason);
    n->n_tensors = 1;
}

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
    st = ld->be->upload_f32(ld->be, base, data, (size_t)(nr * nc));
    const char *held = nopad_dtype_name(ld->be->dtype);
    if (st == NOPAD_OK)
        st = add_to_group(ld, group_of(name), held, ld->src->stored ? ld->src->stored : held,
                          (size_t)(nr * nc) * nopad_dtype_size(ld->be->dtype));
    return st;
}

/* The block formats a backend may run (backend.h's nopad_weight_format), by ggml type id. */
static int is_block_format(uint32_t type) {
    return type == NOPAD_WEIGHT_Q4_0 || type == NOPAD_WEIGHT_Q4_1 || type == NOPAD_WEIGHT_Q5_0 ||
           type == NOPAD_WEIGHT_Q5_1 || type == NOPAD_WEIGHT_Q8_0 || type == NOPAD_WEIGHT_Q4_K ||
           type == NOPAD_WEIGHT_Q5_K || type == NOPAD_WEIGHT_Q6_K;
}

/* A linear weight held as FP8 E4M3 (backend.h's layout: the codes of its N = Σ rows[i] rows, then
 * their N scales): the n_parts tensors of HF names `names` (Q, K, V; gate, up; or one), each
 * [rows[i], cols]. A part stored F8_E4M3 keeps its codes and scales as they are (a per-tensor scale
 * repeated per row); any other part, with --weights fp8, is fetched as float32 and quantized per
 * output channel (io/fp8.h). *kept = 0 when the weight goes the float path instead: nothing asks
 * for FP8, it is the embeddings or the LM head (held in the compute dtype: a gather and the logits'
 * float32 GEMM read them), the model is split (tp > 1), or the backend does not run FP8 on rows of
 * `cols` values (a notice names the group when the file stores FP8). A part that is missing or
 * misshapen is left to the float path too, which names what is wrong. */
static nopad_status get_fp8(loader *ld, int n_parts, const char *const names[], const int64_t rows[], int64_t cols,
                            void **out, nopad_weight_format *format, int *kept) {
    source *src = ld->src;
    nopad_backend *be = ld->be;
    const char *group = group_of(names[0]);
    const safetensors_tensor *stored[3] = {NULL, NULL, NULL};
    int any_f8 = 0;
    for (int i = 0; i < n_parts && src->ckpt; i++) {
        const safetensors_tensor *t = st_find(src, names[i]);
        if (t && t->dtype == ST_F8_E4M3 && t->ndim == 2 && t->shape[0] == rows[i] && t->shape[1] == cols) {
            stored[i] = t;
            any_f8 = 1;
        }
    }
    if (ld->fp8 < 0 || (ld->fp8 == 0 && !any_f8)) return NOPAD_OK;
    if (strcmp(group, "token_embd") == 0 || strcmp(group, "output") == 0) {
        if (any_f8) add_notice(ld, group, "F8_E4M3", "the embeddings and the LM head are held in the compute dtype");
        return NOPAD_OK;
    }
    if (ld->w->tp.size > 1) {
        add_notice(ld, group, "F8_E4M3", "a split model (tp > 1) holds float weights only, for now");
        return NOPAD_OK;
    }
    if (!nopad_backend_runs_format(be, NOPAD_WEIGHT_FP8_E4M3, (int32_t)cols)) {
        char reason[112];
        if (!nopad_backend_runs_format(be, NOPAD_WEIGHT_FP8_E4M3, 4096))
            snprintf(reason, sizeof reason, "the %s backend has no FP8 kernels (they run on CUDA, Hopper)", be->name);
        else
            snprintf(reason, sizeof reason, "its rows of %lld values are not a multiple of 16 (FP8 GEMMs need it)",
                     (long long)cols);
        add_notice(ld, group, "F8_E4M3", reason);
        return NOPAD_OK;
    }
    int64_t n_rows = 0;
    for (int i = 0; i < n_parts; i++) n_rows += rows[i];
    const size_t scales_at = nopad_fp8_scales_offset(n_rows, cols), total = scales_at + (size_t)n_rows * sizeof(float);
    uint8_t *host = malloc(total);
    if (!host) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", src->where);
    memset(host, 0, scales_at); /* the padding before the scales, so the upload copies no garbage */
    const char *stored_as[3];
    nopad_status st = NOPAD_OK;
    int64_t row0 = 0;
    for (int i = 0; i < n_parts && st == NOPAD_OK; i++) {
        uint8_t *codes = host + (size_t)row0 * (size_t)cols;
        float *scales = (float *)(host + scales_at) + row0;
        if (stored[i]) {
            memcpy(codes, stored[i]->data, (size_t)(rows[i] * cols));
            for (int64_t k = 0; k < rows[i] * cols && st == NOPAD_OK; k++)
                if ((codes[k] & 0x7F) == 0x7F) /* E4M3's NaN, which the float path would refuse too */
                    st = nopad_set_error(NOPAD_ERR_FORMAT,
                                         "%s: tensor '%s' holds NaN at element %lld; the weights are corrupt",
                                         src->where, stored[i]->name, (long long)k);
            if (st == NOPAD_OK) st = st_fp8_scales(src, stored[i], rows[i], scales);
            stored_as[i] = src->dtype = "F8_E4M3";
        } else {
            float *data;
            int64_t r, c;
            int found;
            st = src->fetch(src, names[i], &data, &r, &c, &found);
            if (st == NOPAD_OK && (!found || r != rows[i] || c != cols)) {
                free(host);
                return NOPAD_OK; /* the float path names what is wrong */
            }
            for (int64_t k = 0; st == NOPAD_OK && k < rows[i] * cols; k++)
                if (!isfinite(data[k]))
                    st = nopad_set_error(NOPAD_ERR_FORMAT,
                                         "%s: tensor '%s' holds %s at element %lld; the weights are corrupt",
                                         src->where, names[i], isnan(data[k]) ? "NaN" : "an infinity", (long long)k);
            if (st == NOPAD_OK) fp8_e4m3_quantize_rows(data, rows[i], cols, codes, scales);
            stored_as[i] = src->stored ? src->stored : "F32";
        }
        row0 += rows[i];
    }
    if (st == NOPAD_OK) {
        decoder_weights *w = ld->w;
        void **grown = realloc(w->allocations, (size_t)(w->n_allocations + 1) * sizeof *grown);
        if (!grown) st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", src->where);
        else w->allocations = grown;
        if (st == NOPAD_OK) st = be->alloc(be, total, out);
        if (st == NOPAD_OK) {
            w->allocations[w->n_allocations++] = *out;
            st = be->upload(be, *out, host, total);
        }
    }
    free(host);
    if (st != NOPAD_OK) return st;
    ld->w->bytes += total;
    for (int i = 0; i < n_parts; i++) {
        ld->w->n_params += rows[i] * cols;
        /* the codes and this part's share of the scales */
        const size_t part_bytes = (size_t)(rows[i] * cols) + (size_t)rows[i] * sizeof(float) +
                                  (i == 0 ? scales_at - (size_t)(n_rows * cols) : 0);
        TRY(add_to_group(ld, group, "F8_E4M3", stored_as[i], part_bytes));
    }
    *format = NOPAD_WEIGHT_FP8_E4M3;
    *kept = 1;
    return NOPAD_OK;
}

/* A linear weight (or the token embeddings) kept in the GGUF file's block format: the n_parts
 * tensors of HF names `names`, each [rows[i], cols] (Q, K, V; gate, up; or one), their rows one
 * after another in *out. A lone tensor whose rows need no reordering is read where the file's
 * mapping holds it; parts are copied block for block (Q's and K's rows put back in HF's order).
 * *kept = 0 when the weight is to be dequantised instead: the loader was not asked for native
 * formats, a float type (silently), or a block format the backend cannot run (with a notice). A
 * tensor that is missing or misshapen is left to the float path, which names what is wrong. */
/* The whole pages of [p, p + n) in the file's read-only mapping let go once their tensor is copied:
 * the load's peak then holds one tensor of the file beside the model's copies, not all of them until
 * the end (LLaMA-1B's Q4_K_M with its Q4_K and Q6_K packed: a peak RSS of 1162 MB for the 638 MB
 * file before). A page read again comes back from the page cache. */
static void drop_mapped(const void *p, size_t n) {
    const long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) return;
    const uintptr_t a = ((uintptr_t)p + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
    const uintptr_t b = ((uintptr_t)p + n) / (uintptr_t)page * (uintptr_t)page;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

/* A linear weight (pack: the backend may lay it out for its kernels, backend.h's pack_q) or the
 * embeddings (pack 0: their rows are gathered one at a time) kept in the file's block format(s). */
static nopad_status get_native(loader *ld, int n_parts, const char *const names[], const int64_t rows[],
                               int64_t cols, int pack, void **out, nopad_weight_format *format, int *kept) {
    *kept = 0;
    *format = NOPAD_WEIGHT_DTYPE;
    source *src = ld->src;
    TRY(get_fp8(ld, n_parts, names, rows, cols, out, format, kept));
    if (*kept || ld->fp8 > 0 || !ld->native || !src->gguf) return NOPAD_OK;
    const gguf_tensor *t[3];
    int permute[3];
    char gname[128];
    for (int i = 0; i < n_parts; i++) {
        t[i] = gguf_lookup(src, names[i], gname, &permute[i]);
        if (!t[i] || t[i]->n_dims != 2 || t[i]->dims[0] != cols || t[i]->dims[1] != rows[i]) return NOPAD_OK;
    }
    const char *group = group_of(names[0]);
    const uint32_t type = t[0]->type;
    const char *type_name = gguf_tensor_type_name(type);
    if (type == 0 || type == 1 || type == 30) return NOPAD_OK; /* F32, F16, BF16: float already */
    nopad_backend *be = ld->be;
    int mixed = 0;
    for (int i = 1; i < n_parts; i++) mixed |= t[i]->type != type;
    if (mixed) {
        /* parts in different block formats stay as stored, each run of rows in its own, where the
         * backend runs such a weight (backend.h's NOPAD_WEIGHT_MIXED) and every part's format */
        int runs = ld->w->tp.size <= 1 && nopad_backend_runs_format(be, NOPAD_WEIGHT_MIXED, (int32_t)cols);
        char names_of[48] = "";
        for (int k = 0; k < n_parts; k++) {
            const char *tk = gguf_tensor_type_name(t[k]->type);
            snprintf(names_of + strlen(names_of), sizeof names_of - strlen(names_of), "%s%s", k ? " + " : "",
                     tk ? tk : "?");
            runs = runs && is_block_format(t[k]->type) &&
                   nopad_backend_runs_format(be, (nopad_weight_format)t[k]->type, (int32_t)cols);
        }
        if (!runs) {
            add_notice(ld, group, names_of,
                       ld->w->tp.size > 1 ? "a split model (tp > 1) holds float weights only, for now"
                                          : "the backend holds a fused matrix in one format");
            return NOPAD_OK;
        }
    }
    char reason[112];
    if (ld->w->tp.size > 1) {
        add_notice(ld, group, type_name, "a split model (tp > 1) holds float weights only, for now");
        return NOPAD_OK;
    }
    if (!is_block_format(type) || !nopad_backend_runs_format(be, (nopad_weight_format)type, (int32_t)cols)) {
        if (!be->gemm_q)
            snprintf(reason, sizeof reason, "the %s backend has no quantized kernels yet", be->name);
        else if (!is_block_format(type) || !nopad_backend_runs_format(be, (nopad_weight_format)type, 256 * 1024))
            snprintf(reason, sizeof reason, "the %s backend has no kernel for %s", be->name, type_name);
        else
            snprintf(reason, sizeof reason, "its rows of %lld values are not whole blocks of %s", (long long)cols,
                     type_name);
        add_notice(ld, group, type_name, reason);
        return NOPAD_OK;
    }
    const gguf_file *f = src->gguf;
    const size_t header = mixed ? NOPAD_MIXED_HEADER : 0; /* the parts' formats and rows, before them */
    /* each part as the backend holds it: laid out for its kernels at load where it says so (the
     * packed rows replace the stored ones: no second copy), else as stored */
    nopad_weight_format held[3];
    size_t held_bytes[3];
    int packs = 0, same = 1;
    for (int i = 0; i < n_parts; i++) {
        held[i] = (nopad_weight_format)t[i]->type;
        held_bytes[i] = (size_t)t[i]->nbytes;
        if (pack && be->packed_format && be->pack_q)
            held[i] = be->packed_format(be, held[i], rows[i], cols, &held_bytes[i]);
        packs |= held[i] != (nopad_weight_format)t[i]->type;
        same &= held[i] == held[0];
    }
    if (!mixed && !same) /* one format for the whole matrix: keep every part as stored */
        for (int i = 0; i < n_parts; i++) {
            held[i] = (nopad_weight_format)t[i]->type;
            held_bytes[i] = (size_t)t[i]->nbytes;
            packs = 0;
        }
    size_t total = header;
    for (int i = 0; i < n_parts; i++) total += held_bytes[i];
    /* the mapping is host memory: only a backend working in host memory (device -1: the CPU) reads
     * a weight there; a device backend gets a copy */
    if (n_parts == 1 && !permute[0] && !packs && f->map && be->device < 0) {
        *out = (void *)(f->bytes + f->data_offset + t[0]->offset); /* bounds checked at parse */
        ld->uses_map = 1;
    } else {
        decoder_weights *w = ld->w;
        void **grown = realloc(w->allocations, (size_t)(w->n_allocations + 1) * sizeof *grown);
        if (!grown) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", src->where);
        w->allocations = grown;
        nopad_status st = be->alloc(be, total, out);
        if (st != NOPAD_OK) return st;
        w->allocations[w->n_allocations++] = *out;
        char *dst = *out;
        if (mixed) {
            uint8_t h[NOPAD_MIXED_HEADER] = {0};
            nopad_mixed_weight mw = {.n_parts = (uint32_t)n_parts};
            for (int i = 0; i < n_parts; i++) {
                mw.format[i] = (uint32_t)held[i];
                mw.rows[i] = (int32_t)rows[i];
            }
            memcpy(h, &mw, sizeof mw);
            st = be->upload(be, dst, h, header);
            if (st != NOPAD_OK) return st;
            dst += header;
        }
        for (int i = 0; i < n_parts; i++) {
            const uint8_t *data = f->bytes + f->data_offset + t[i]->offset;
            const size_t row_bytes = (size_t)t[i]->nbytes / (size_t)rows[i];
            const int64_t D = src->cfg->head_size, half = D / 2;
            if (permute[i] > 0 && (D % 2 != 0 || rows[i] != permute[i] * D))
                return nopad_set_error(NOPAD_ERR_FORMAT, "%s: tensor '%s' has %lld rows, expected %lld heads of "
                                       "an even size %lld", src->where, t[i]->name, (long long)rows[i],
                                       (long long)permute[i], (long long)D);
            /* packed: the rows in order in host memory first (unpermuted where they need it) */
            uint8_t *ordered = NULL;
            if (held[i] != (nopad_weight_format)t[i]->type && permute[i]) {
                ordered = malloc((size_t)t[i]->nbytes);
                if (!ordered) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", src->where);
            }
            if (!permute[i] && held[i] == (nopad_weight_format)t[i]->type)
                st = be->upload(be, dst, data, (size_t)t[i]->nbytes); /* one copy, as stored */
            for (int64_t r = 0; permute[i] && r < rows[i] && st == NOPAD_OK; r++) {
                /* llama.cpp's row h·D + 2i + j is HF's row h·D + j·D/2 + i (unpermute_rows) */
                int64_t from = r;
                if (permute[i] > 0) {
                    const int64_t h = r / D, k = r % D, j = k / half, ii = k % half;
                    from = h * D + 2 * ii + j;
                }
                if (ordered) memcpy(ordered + (size_t)r * row_bytes, data + (size_t)from * row_bytes, row_bytes);
                else st = be->upload(be, dst + (size_t)r * row_bytes, data + (size_t)from * row_bytes, row_bytes);
            }
            if (st == NOPAD_OK && held[i] != (nopad_weight_format)t[i]->type)
                st = be->pack_q(be, dst, ordered ? ordered : data, (nopad_weight_format)t[i]->type, rows[i], cols);
            free(ordered);
            if (st != NOPAD_OK) return st;
            if (f->map) drop_mapped(data, (size_t)t[i]->nbytes); /* copied: the mapped rows are not read again */
            dst += held_bytes[i];
        }
    }
    ld->w->bytes += total;
    for (int i = 0; i < n_parts; i++) {
        ld->w->n_params += rows[i] * cols;
        const char *part_type = gguf_tensor_type_name(t[i]->type);
        TRY(add_to_group(ld, group, part_type, part_type, held_bytes[i] + (i == 0 ? header : 0)));
    }
    src->dtype = type_name;
    *format = mixed ? NOPAD_WEIGHT_MIXED : held[0];
    *kept = 1;
    return NOPAD_OK;
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
    int kept;
    const char *embed_name[] = {"model.embed_tokens.weight"};
    TRY(get_native(ld, 1, embed_name, (const int64_t[]){c->vocab_size}, H, 0, &w->tok_emb, &w->tok_emb_format, &kept));
    if (!kept)
        TRY(get_part(ld, "model.embed_tokens.weight", c->vocab_size, H, 0, tp->vocab0, tp->vocab_rows, 0, H,
                     &w->tok_emb));
    char n[128], n1[128], n2[128];
    for (int32_t l = 0; l < c->num_layers; l++) {
        decoder_layer *L = &w->layers[l];
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), n)
#define NAME_IN(buf, suffix) (snprintf(buf, sizeof buf, "model.layers.%d.%s", l, suffix), buf)
        TRY(get(ld, NAME("input_layernorm.weight"), H, 1, 0, &L->norm1_w));
        const char *qkv_names[] = {NAME("self_attn.q_proj.weight"), NAME_IN(n1, "self_attn.k_proj.weight"),
                                   NAME_IN(n2, "self_attn.v_proj.weight")};
        TRY(get_native(ld, 3, qkv_names, (const int64_t[]){qd, kd, kd}, H, 1, &L->qkv_w, &L->qkv_format, &kept));
        if (!kept) {
            TRY(track_alloc(ld, (size_t)((qn + 2 * kn) * H), &L->qkv_w));
            TRY(put_part(ld, NAME("self_attn.q_proj.weight"), qd, H, 0, q0, qn, 0, H, L->qkv_w, 0, 0, NULL));
            TRY(put_part(ld, NAME("self_attn.k_proj.weight"), kd, H, 0, k0, kn, 0, H, L->qkv_w, (size_t)(qn * H), 0,
                         NULL));
            TRY(put_part(ld, NAME("self_attn.v_proj.weight"), kd, H, 0, k0, kn, 0, H, L->qkv_w,
                         (size_t)((qn + kn) * H), 0, NULL));
        }
        if (c->qkv_bias) {
            TRY(track_alloc(ld, (size_t)(qn + 2 * kn), &L->qkv_b));
            TRY(put_part(ld, NAME("self_attn.q_proj.bias"), qd, 1, 0, q0, qn, 0, 1, L->qkv_b, 0, 0, NULL));
            TRY(put_part(ld, NAME("self_attn.k_proj.bias"), kd, 1, 0, k0, kn, 0, 1, L->qkv_b, (size_t)qn, 0, NULL));
            TRY(put_part(ld, NAME("self_attn.v_proj.bias"), kd, 1, 0, k0, kn, 0, 1, L->qkv_b, (size_t)(qn + kn), 0,
                         NULL));
        }
        const char *o_name[] = {NAME("self_attn.o_proj.weight")};
        TRY(get_native(ld, 1, o_name, (const int64_t[]){H}, qd, 1, &L->o_w, &L->o_format, &kept));
        if (!kept) TRY(get_part(ld, NAME("self_attn.o_proj.weight"), H, qd, 0, 0, H, q0, qn, &L->o_w));
        if (c->o_bias && tp->rank == 0) TRY(get(ld, NAME("self_attn.o_proj.bias"), H, 1, 0, &L->o_b)); /* added once */
        TRY(get(ld, NAME("post_attention_layernorm.weight"), H, 1, 0, &L->norm2_w));
        const char *up_names[] = {NAME("mlp.gate_proj.weight"), NAME_IN(n1, "mlp.up_proj.weight")};
        TRY(get_native(ld, 2, up_names, (const int64_t[]){F, F}, H, 1, &L->up_w, &L->up_format, &kept));
        if (!kept) {
            TRY(track_alloc(ld, (size_t)(2 * fn * H), &L->up_w));
            TRY(put_part(ld, NAME("mlp.gate_proj.weight"), F, H, 0, f0, fn, 0, H, L->up_w, 0, 0, NULL));
            TRY(put_part(ld, NAME("mlp.up_proj.weight"), F, H, 0, f0, fn, 0, H, L->up_w, (size_t)(fn * H), 0,
                         NULL));
        }
        const char *down_name[] = {NAME("mlp.down_proj.weight")};
        TRY(get_native(ld, 1, down_name, (const int64_t[]){H}, F, 1, &L->down_w, &L->down_format, &kept));
        if (!kept) TRY(get_part(ld, NAME("mlp.down_proj.weight"), H, F, 0, 0, H, f0, fn, &L->down_w));
#undef NAME_IN
#undef NAME
    }
    TRY(get(ld, "model.norm.weight", H, 1, 0, &w->final_norm_w));
    /* an untied head; a tied one may still be stored (it equals the embeddings) */
    if (!c->tie_word_embeddings) {
        const char *head_name[] = {"lm_head.weight"};
        TRY(get_native(ld, 1, head_name, (const int64_t[]){c->vocab_size}, H, 1, &w->lm_head, &w->lm_head_format, &kept));
        if (!kept)
            TRY(get_part(ld, "lm_head.weight", c->vocab_size, H, 0, tp->vocab0, tp->vocab_rows, 0, H, &w->lm_head));
    } else {
        w->lm_head = w->tok_emb;
        w->lm_head_format = w->tok_emb_format;
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
                         int native, int fp8, int *uses_map, decoder_weights *out) {
    memset(out, 0, sizeof *out);
    nopad_status planned = tp ? NOPAD_OK : tp_shard_plan(cfg, NULL, 0, 1, &out->tp);
    if (tp) out->tp = *tp;
    if (planned != NOPAD_OK) return planned;
    if (fp8 > 0 && !nopad_backend_runs_format(be, NOPAD_WEIGHT_FP8_E4M3, 4096))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: fp8 weights run on CUDA (Hopper); the %s backend has no FP8 "
                               "kernels", src->where, be->name);
    if (fp8 > 0 && cfg->family == FAMILY_GPT2)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: fp8 weights are for the LLaMA family (llama, mistral, "
                               "qwen2); GPT-2's layers are held in the compute dtype (weights auto)", src->where);
    if (fp8 > 0 && out->tp.size > 1)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: fp8 weights on a split model (tp %d) are not supported yet",
                               src->where, out->tp.size);
    out->layers = calloc((size_t)cfg->num_layers, sizeof *out->layers);
    if (!out->layers) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", src->where);
    loader ld = {.be = be, .src = src, .w = out, .native = native, .fp8 = fp8};
    nopad_status st = cfg->family == FAMILY_GPT2 ? load_gpt2(&ld, cfg) : load_llama(&ld, cfg);
    out->weights_dtype = src->dtype ? src->dtype : "F32";
    *uses_map = ld.uses_map;
    for (int32_t i = 0; i < ld.n_notices && st == NOPAD_OK; i++)
        fprintf(stderr, "nopad: notice: %s %s (%d %s) dequantised to %s: %s\n", ld.notices[i].group,
                ld.notices[i].stored, ld.notices[i].n_tensors, ld.notices[i].n_tensors == 1 ? "weight" : "weights",
                nopad_dtype_name(be->dtype), ld.notices[i].reason);
    free(src->scratch);
    free(src->scratch2);
    if (st != NOPAD_OK) decoder_weights_free(be, out);
    return st;
}

nopad_status decoder_weights_load_st(nopad_backend *be, const model_config *cfg, const tp_shard *tp,
                                     const safetensors_checkpoint *ckpt, const char *where, int fp8,
                                     decoder_weights *out) {
    source src = {.where = where, .fetch = st_fetch, .ckpt = ckpt, .cfg = cfg};
    int uses_map;
    return load(be, cfg, tp, &src, 0, fp8, &uses_map, out);
}

nopad_status decoder_weights_load_gguf(nopad_backend *be, const model_config *cfg, const tp_shard *tp,
                                       gguf_file *f, int native, int fp8, decoder_weights *out) {
    source src = {.where = f->path ? f->path : "gguf", .fetch = gguf_fetch, .gguf = f, .cfg = cfg};
    int uses_map = 0;
    nopad_status st = load(be, cfg, tp, &src, native, fp8, &uses_map, out);
    if (st == NOPAD_OK && uses_map) {
        /* the weights read the file's mapping from now on: theirs to unmap */
        out->map = f->map;
        out->map_size = f->map_size;
        f->map = NULL;
        /* loading touched pages the weights never read again (the tensors copied or dequantised,
         * the metadata): let them go, so the process holds what a step reads; the tensors kept
         * in the mapping come back from the page cache at their first use */
        madvise(out->map, out->map_size, MADV_DONTNEED);
    }
    return st;
}

void decoder_weights_free(nopad_backend *be, decoder_weights *w) {
    for (int32_t i = 0; i < w->n_allocations; i++) be->free(be, w->allocations[i]);
    if (w->map) munmap(w->map, w->map_size);
    free(w->allocations);
    free(w->groups);
    free(w->layers);
    memset(w, 0, sizeof *w);
}

/* A decoder's model_config from GGUF metadata (llama.cpp's keys: "<arch>.embedding_length",
 * ...), for the architectures whose graph nopad has: llama (SmolLM2, LLaMA, Mistral without a
 * window) and qwen2. Ids of special tokens come from tokenizer.ggml.*. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "io/gguf.h"
#include "io/gguf_config.h"
#include "util/error.h"

/* "<arch>.<key>" as a u32 (or i32 / u64 stored), or fallback when absent and has_fallback. */
static nopad_status arch_int(const gguf_file *f, const char *arch, const char *key,
                             int has_fallback, int32_t fallback, int32_t *out) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    const gguf_kv *kv = gguf_find(f, full);
    if (!kv) {
        if (has_fallback) {
            *out = fallback;
            return NOPAD_OK;
        }
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: metadata key %s is missing", f->path, full);
    }
    uint32_t u;
    uint64_t u64;
    int32_t i;
    if (gguf_get_u32(f, full, &u) == NOPAD_OK && u <= INT32_MAX) *out = (int32_t)u;
    else if (gguf_get_i32(f, full, &i) == NOPAD_OK && i >= 0) *out = i;
    else if (gguf_get_u64(f, full, &u64) == NOPAD_OK && u64 <= INT32_MAX) *out = (int32_t)u64;
    else
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: metadata key %s must be a count (uint32)",
                               f->path, full);
    nopad_clear_error();
    if (*out <= 0)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: metadata key %s must be positive", f->path,
                               full);
    return NOPAD_OK;
}

static nopad_status arch_float(const gguf_file *f, const char *arch, const char *key,
                               float fallback, float *out) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    if (!gguf_find(f, full)) {
        *out = fallback;
        return NOPAD_OK;
    }
    nopad_status st = gguf_get_f32(f, full, out);
    /* an epsilon, a RoPE base or a scaling factor: zero, negative, infinite or NaN means nothing
     * (an infinite epsilon zeroes every norm, an infinite base leaves positions unrotated) */
    if (st == NOPAD_OK && !(*out > 0 && isfinite(*out)))
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: metadata key %s is %g, expected a positive finite number",
                               f->path, full, (double)*out);
    return st;
}

nopad_status gguf_model_config(const gguf_file *f, model_config *out) {
    memset(out, 0, sizeof *out);
    gguf_str arch_s;
    nopad_status st = gguf_get_str(f, "general.architecture", &arch_s);
    if (st != NOPAD_OK) return st;
    char arch[32];
    snprintf(arch, sizeof arch, "%.*s", (int)(arch_s.len < 31 ? arch_s.len : 31), arch_s.data);
    if (strcmp(arch, "llama") != 0 && strcmp(arch, "qwen2") != 0)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: general.architecture \"%s\" is not supported (llama, qwen2)",
                               f->path, arch);
    snprintf(out->model_type, sizeof out->model_type, "%s", arch);
    out->family = FAMILY_LLAMA;
    out->causal = 1;
    out->positions = POSITIONS_ROPE;
    out->norm = NORM_RMSNORM;
    out->activation = NOPAD_ACT_SILU;
    snprintf(out->activation_name, sizeof out->activation_name, "silu");
    st = arch_int(f, arch, "context_length", 0, 0, &out->max_position_embeddings);
    if (st == NOPAD_OK) st = arch_int(f, arch, "embedding_length", 0, 0, &out->hidden_size);
    if (st == NOPAD_OK) st = arch_int(f, arch, "block_count", 0, 0, &out->num_layers);
    if (st == NOPAD_OK) st = arch_int(f, arch, "feed_forward_length", 0, 0, &out->intermediate_size);
    if (st == NOPAD_OK) st = arch_int(f, arch, "attention.head_count", 0, 0, &out->num_heads);
    if (st == NOPAD_OK)
        st = arch_int(f, arch, "attention.head_count_kv", 1, out->num_heads, &out->num_kv_heads);
    if (st == NOPAD_OK)
        st = arch_float(f, arch, "attention.layer_norm_rms_epsilon", 1e-6f, &out->layer_norm_eps);
    if (st == NOPAD_OK) st = arch_float(f, arch, "rope.freq_base", 10000.0f, &out->rope_theta);
    if (st != NOPAD_OK) return st;
    if (out->hidden_size % out->num_heads != 0 || out->num_heads % out->num_kv_heads != 0)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: %d heads, %d KV heads and embedding length %d do not divide",
                               f->path, out->num_heads, out->num_kv_heads, out->hidden_size);
    out->head_size = out->hidden_size / out->num_heads;
    /* RoPE turns pairs of dimensions, and llama.cpp's converter permutes Q and K by halves of a
     * head (reshape(n_head, 2, head_dim // 2, ...)): no odd head size can come from it */
    if (out->head_size % 2 != 0)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: head size %d (embedding length %d / %d heads) is odd, expected "
                               "an even head size (rotary embeddings turn pairs of dimensions)",
                               f->path, out->head_size, out->hidden_size, out->num_heads);
    int32_t rot = 0;
    st = arch_int(f, arch, "rope.dimension_count", 1, out->head_size, &rot);
    if (st != NOPAD_OK) return st;
    if (rot != out->head_size)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: partial rotary embeddings (rope.dimension_count %d of head size "
                               "%d) are not supported",
                               f->path, rot, out->head_size);
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    gguf_str scaling;
    out->rope.kind = ROPE_SCALING_NONE;
    out->rope.factor = 1.0f;
    if (gguf_find(f, key)) {
        st = gguf_get_str(f, key, &scaling);
        if (st != NOPAD_OK) return st;
        if (scaling.len == 6 && memcmp(scaling.data, "linear", 6) == 0) {
            out->rope.kind = ROPE_SCALING_LINEAR;
            st = arch_float(f, arch, "rope.scaling.factor", 1.0f, &out->rope.factor);
            if (st != NOPAD_OK) return st;
        } else if (!(scaling.len == 4 && memcmp(scaling.data, "none", 4) == 0)) {
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                   "%s: %s \"%.*s\" is not supported (none, linear)", f->path, key,
                                   (int)(scaling.len < 32 ? scaling.len : 32), scaling.data);
        }
    }
    /* the vocabulary: the token list of the tokenizer, else the embedding rows */
    const gguf_array *tokens;
    if (gguf_get_str_array(f, "tokenizer.ggml.tokens", &tokens) == NOPAD_OK && tokens->n > 0 &&
        tokens->n <= INT32_MAX) {
        out->vocab_size = (int32_t)tokens->n;
    } else {
        nopad_clear_error();
        const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
        if (!emb || emb->n_dims != 2)
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: no token list and no token_embd.weight",
                                   f->path);
        out->vocab_size = (int32_t)emb->dims[1];
    }
    out->tie_word_embeddings = gguf_find_tensor(f, "output.weight") == NULL;
    out->qkv_bias = gguf_find_tensor(f, "blk.0.attn_q.bias") != NULL;
    out->embedding_size = out->hidden_size;
    out->bos_token_id = -1;
    uint32_t id;
    if (gguf_find(f, "tokenizer.ggml.bos_token_id") &&
        gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &id) == NOPAD_OK)
        out->bos_token_id = (int32_t)id;
    if (gguf_find(f, "tokenizer.ggml.eos_token_id") &&
        gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &id) == NOPAD_OK)
        out->eos_token_ids[out->n_eos++] = (int32_t)id;
    if (gguf_find(f, "tokenizer.ggml.eot_token_id") &&
        gguf_get_u32(f, "tokenizer.ggml.eot_token_id", &id) == NOPAD_OK &&
        (out->n_eos == 0 || out->eos_token_ids[0] != (int32_t)id))
        out->eos_token_ids[out->n_eos++] = (int32_t)id;
    nopad_clear_error();
    return NOPAD_OK;
}

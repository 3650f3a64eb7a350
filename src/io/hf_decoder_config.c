/* config.json of the decoder families: gpt2, and llama with what shares its graph (mistral,
 * qwen2). A feature the engine does not implement (sliding-window attention, YaRN or dynamic
 * RoPE, MLP biases, cross-attention) is NOPAD_ERR_UNSUPPORTED naming the field, never ignored. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/hf_config.h"
#include "io/json.h"
#include "util/error.h"

enum { MAX_DIM = 1 << 16, MAX_LAYERS = 1024, MAX_VOCAB = 1 << 24, MAX_POSITIONS = 1 << 24 };

static const cJSON *field(const cJSON *obj, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

/* A positive float field; absent or null: fallback. Checked as the float it becomes: 1e300 is a
 * finite double but an infinite float, 1e-300 a float zero. */
static nopad_status get_pos_float(const cJSON *obj, const char *where, const char *key,
                                  double fallback, float *out) {
    const cJSON *item = field(obj, key);
    if (!item || cJSON_IsNull(item)) {
        *out = (float)fallback;
        return NOPAD_OK;
    }
    if (!cJSON_IsNumber(item)) return json_wrong_type(where, key, "a positive number", item);
    const float v = (float)item->valuedouble;
    if (!(v > 0) || !isfinite(v))
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: field \"%s\" is %g, expected a positive finite number (float32)",
                               where, key, item->valuedouble);
    *out = v;
    return NOPAD_OK;
}

static nopad_status get_bool(const cJSON *obj, const char *where, const char *key, int fallback,
                             int *out) {
    const cJSON *item = field(obj, key);
    if (!item || cJSON_IsNull(item)) {
        *out = fallback;
        return NOPAD_OK;
    }
    if (!cJSON_IsBool(item)) return json_wrong_type(where, key, "true or false", item);
    *out = cJSON_IsTrue(item);
    return NOPAD_OK;
}

/* bos_token_id: an id or null; eos_token_id: an id, a list of ids, or null. */
static nopad_status special_ids(const cJSON *root, const char *where, model_config *out) {
    out->bos_token_id = -1;
    out->n_eos = 0;
    const cJSON *bos = field(root, "bos_token_id");
    if (bos && !cJSON_IsNull(bos)) {
        nopad_status st = hf_get_int(root, where, "bos_token_id", 0, 0, 0, MAX_VOCAB,
                                     &out->bos_token_id);
        if (st != NOPAD_OK) return st;
    }
    const cJSON *eos = field(root, "eos_token_id");
    if (!eos || cJSON_IsNull(eos)) return NOPAD_OK;
    if (cJSON_IsNumber(eos)) return hf_get_int(root, where, "eos_token_id", 0, 0, 0, MAX_VOCAB,
                                               &out->eos_token_ids[out->n_eos++]);
    if (!cJSON_IsArray(eos)) return json_wrong_type(where, "eos_token_id", "an id or a list of ids", eos);
    const cJSON *item;
    cJSON_ArrayForEach(item, eos) {
        double v = cJSON_IsNumber(item) ? item->valuedouble : -1;
        if (v != floor(v) || v < 0 || v > MAX_VOCAB)
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: eos_token_id must hold token ids", where);
        if (out->n_eos == (int32_t)(sizeof out->eos_token_ids / sizeof out->eos_token_ids[0]))
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: more than 8 eos_token_id values",
                                   where);
        out->eos_token_ids[out->n_eos++] = (int32_t)v;
    }
    return NOPAD_OK;
}

/* rope_theta and the scaling, from rope_scaling (transformers 4) or rope_parameters (5). */
static nopad_status rope_config(const cJSON *root, const char *where, model_config *out) {
    const cJSON *params = field(root, "rope_parameters");
    const cJSON *scaling = field(root, "rope_scaling");
    const cJSON *src = cJSON_IsObject(params) ? params : cJSON_IsObject(scaling) ? scaling : NULL;
    const char *src_name = src == params ? "rope_parameters" : "rope_scaling";
    nopad_status st = get_pos_float(root, where, "rope_theta", 10000.0, &out->rope_theta);
    if (st == NOPAD_OK && src && field(src, "rope_theta"))
        st = get_pos_float(src, where, "rope_theta", 10000.0, &out->rope_theta);
    if (st != NOPAD_OK) return st;
    out->rope.kind = ROPE_SCALING_NONE;
    out->rope.factor = 1.0f;
    if (!src) {
        if ((params && !cJSON_IsNull(params)) || (scaling && !cJSON_IsNull(scaling)))
            return json_wrong_type(where, params ? "rope_parameters" : "rope_scaling",
                                   "an object or null", params ? params : scaling);
        return NOPAD_OK;
    }
    const cJSON *type = field(src, "rope_type");
    if (!type) type = field(src, "type");
    const char *name = cJSON_IsString(type) ? type->valuestring : "default";
    if (strcmp(name, "default") == 0) return NOPAD_OK;
    if (strcmp(name, "linear") == 0) {
        out->rope.kind = ROPE_SCALING_LINEAR;
        return get_pos_float(src, where, "factor", 1.0, &out->rope.factor);
    }
    if (strcmp(name, "llama3") == 0) {
        out->rope.kind = ROPE_SCALING_LLAMA3;
        st = get_pos_float(src, where, "factor", 8.0, &out->rope.factor);
        if (st == NOPAD_OK)
            st = get_pos_float(src, where, "low_freq_factor", 1.0, &out->rope.low_freq_factor);
        if (st == NOPAD_OK)
            st = get_pos_float(src, where, "high_freq_factor", 4.0, &out->rope.high_freq_factor);
        if (st == NOPAD_OK)
            st = hf_get_int(src, where, "original_max_position_embeddings", 0, 0, 1, MAX_POSITIONS,
                            &out->rope.original_max_positions);
        if (st == NOPAD_OK && !(out->rope.high_freq_factor > out->rope.low_freq_factor))
            st = nopad_set_error(NOPAD_ERR_FORMAT,
                                 "%s: %s: high_freq_factor must exceed low_freq_factor", where,
                                 src_name);
        return st;
    }
    return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                           "%s: %s type \"%.32s\" is not supported (default, linear, llama3)",
                           where, src_name, name);
}

static nopad_status gpt2_config(const cJSON *root, const char *where, model_config *out) {
    nopad_status st = hf_get_int(root, where, "vocab_size", 0, 0, 1, MAX_VOCAB, &out->vocab_size);
    if (st == NOPAD_OK) st = hf_get_int(root, where, "n_embd", 0, 0, 1, MAX_DIM, &out->hidden_size);
    if (st == NOPAD_OK) st = hf_get_int(root, where, "n_layer", 0, 0, 1, MAX_LAYERS, &out->num_layers);
    if (st == NOPAD_OK) st = hf_get_int(root, where, "n_head", 0, 0, 1, MAX_DIM, &out->num_heads);
    if (st == NOPAD_OK)
        st = hf_get_int(root, where, "n_positions", 0, 0, 1, MAX_POSITIONS,
                        &out->max_position_embeddings);
    if (st == NOPAD_OK)
        st = hf_get_int(root, where, "n_inner", 1, 4 * out->hidden_size, 1, MAX_DIM * 16,
                        &out->intermediate_size);
    if (st == NOPAD_OK)
        st = get_pos_float(root, where, "layer_norm_epsilon", 1e-5, &out->layer_norm_eps);
    if (st != NOPAD_OK) return st;
    const cJSON *act = field(root, "activation_function");
    const char *name = cJSON_IsString(act) ? act->valuestring : "gelu_new";
    if (!strcmp(name, "gelu_new") || !strcmp(name, "gelu_pytorch_tanh") || !strcmp(name, "gelu_fast"))
        out->activation = NOPAD_ACT_GELU_TANH;
    else if (!strcmp(name, "gelu"))
        out->activation = NOPAD_ACT_GELU;
    else if (!strcmp(name, "relu"))
        out->activation = NOPAD_ACT_RELU;
    else
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: activation_function \"%.32s\" is not supported (gelu_new, gelu, "
                               "relu)",
                               where, name);
    snprintf(out->activation_name, sizeof out->activation_name, "%s", name);
    int scale = 1, by_layer = 0, cross = 0;
    st = get_bool(root, where, "scale_attn_weights", 1, &scale);
    if (st == NOPAD_OK)
        st = get_bool(root, where, "scale_attn_by_inverse_layer_idx", 0, &by_layer);
    if (st == NOPAD_OK) st = get_bool(root, where, "add_cross_attention", 0, &cross);
    if (st != NOPAD_OK) return st;
    if (!scale || by_layer || cross)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: %s is not supported", where,
                               !scale ? "scale_attn_weights false"
                               : by_layer ? "scale_attn_by_inverse_layer_idx"
                                          : "add_cross_attention");
    out->family = FAMILY_GPT2;
    out->num_kv_heads = out->num_heads;
    out->positions = POSITIONS_LEARNED;
    out->norm = NORM_LAYERNORM;
    out->qkv_bias = out->o_bias = 1;
    out->tie_word_embeddings = 1; /* GPT2LMHeadModel always ties */
    if (out->hidden_size % out->num_heads != 0)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: n_embd %d is not divisible by n_head %d",
                               where, out->hidden_size, out->num_heads);
    out->head_size = out->hidden_size / out->num_heads;
    return NOPAD_OK;
}

static nopad_status llama_config(const cJSON *root, const char *model_type, const char *where,
                                 model_config *out) {
    nopad_status st = hf_get_int(root, where, "vocab_size", 0, 0, 1, MAX_VOCAB, &out->vocab_size);
    if (st == NOPAD_OK) st = hf_get_int(root, where, "hidden_size", 0, 0, 1, MAX_DIM, &out->hidden_size);
    if (st == NOPAD_OK)
        st = hf_get_int(root, where, "intermediate_size", 0, 0, 1, MAX_DIM * 16,
                        &out->intermediate_size);
    if (st == NOPAD_OK)
        st = hf_get_int(root, where, "num_hidden_layers", 0, 0, 1, MAX_LAYERS, &out->num_layers);
    if (st == NOPAD_OK)
        st = hf_get_int(root, where, "num_attention_heads", 0, 0, 1, MAX_DIM, &out->num_heads);
    if (st == NOPAD_OK)
        st = hf_get_int(root, where, "num_key_value_heads", 1, out->num_heads, 1, MAX_DIM,
                        &out->num_kv_heads);
    if (st == NOPAD_OK)
        st = hf_get_int(root, where, "max_position_embeddings", 0, 0, 1, MAX_POSITIONS,
                        &out->max_position_embeddings);
    if (st == NOPAD_OK) st = get_pos_float(root, where, "rms_norm_eps", 1e-6, &out->layer_norm_eps);
    if (st == NOPAD_OK) st = rope_config(root, where, out);
    if (st != NOPAD_OK) return st;
    if (out->num_heads % out->num_kv_heads != 0)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: num_attention_heads %d is not a multiple of num_key_value_heads "
                               "%d",
                               where, out->num_heads, out->num_kv_heads);
    const cJSON *hd = field(root, "head_dim");
    if (hd && !cJSON_IsNull(hd)) {
        st = hf_get_int(root, where, "head_dim", 0, 0, 2, MAX_DIM, &out->head_size);
        if (st != NOPAD_OK) return st;
    } else {
        if (out->hidden_size % out->num_heads != 0)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: hidden_size %d is not divisible by num_attention_heads %d",
                                   where, out->hidden_size, out->num_heads);
        out->head_size = out->hidden_size / out->num_heads;
    }
    if (out->head_size % 2 != 0)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: rotary embeddings need an even head size (%d)",
                               where, out->head_size);
    const cJSON *act = field(root, "hidden_act");
    const char *name = cJSON_IsString(act) ? act->valuestring : "silu";
    if (strcmp(name, "silu") != 0 && strcmp(name, "swish") != 0)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: hidden_act \"%.32s\" is not supported (silu: the SwiGLU MLP)",
                               where, name);
    snprintf(out->activation_name, sizeof out->activation_name, "silu");
    out->activation = NOPAD_ACT_SILU;
    int qwen2 = strcmp(model_type, "qwen2") == 0;
    int attention_bias = 0, mlp_bias = 0;
    st = get_bool(root, where, "attention_bias", 0, &attention_bias);
    if (st == NOPAD_OK) st = get_bool(root, where, "mlp_bias", 0, &mlp_bias);
    if (st == NOPAD_OK)
        st = get_bool(root, where, "tie_word_embeddings", 0, &out->tie_word_embeddings);
    if (st != NOPAD_OK) return st;
    if (mlp_bias) return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: mlp_bias true is not supported", where);
    out->qkv_bias = qwen2 || attention_bias;
    out->o_bias = attention_bias && !qwen2;
    /* sliding-window attention: refused rather than silently attending to everything */
    const cJSON *window = field(root, "sliding_window");
    int use_window = !qwen2;
    if (qwen2) {
        st = get_bool(root, where, "use_sliding_window", 0, &use_window);
        if (st != NOPAD_OK) return st;
    }
    if (use_window && cJSON_IsNumber(window) && window->valuedouble < out->max_position_embeddings)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: sliding_window %g (attention limited to a window shorter than "
                               "max_position_embeddings %d) is not supported",
                               where, window->valuedouble, out->max_position_embeddings);
    out->family = FAMILY_LLAMA;
    out->positions = POSITIONS_ROPE;
    out->norm = NORM_RMSNORM;
    return NOPAD_OK;
}

int hf_decoder_config(const cJSON *root, const char *model_type, const char *where,
                      model_config *out, nopad_status *st) {
    int gpt2 = strcmp(model_type, "gpt2") == 0;
    int llama = !strcmp(model_type, "llama") || !strcmp(model_type, "mistral") ||
                !strcmp(model_type, "qwen2");
    if (!gpt2 && !llama) return 0;
    snprintf(out->model_type, sizeof out->model_type, "%s", model_type);
    *st = gpt2 ? gpt2_config(root, where, out) : llama_config(root, model_type, where, out);
    if (*st == NOPAD_OK) *st = special_ids(root, where, out);
    out->causal = 1;
    out->embedding_size = out->hidden_size;
    out->type_vocab_size = 0;
    out->pad_token_id = 0;
    out->position_offset = 0;
    return 1;
}

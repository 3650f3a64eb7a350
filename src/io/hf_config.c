/* config.json, parsed with cJSON and dispatched on model_type (the BERT family today). */
#include "io/hf_config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/json.h"
#include "util/error.h"

typedef struct family_entry {
    const char *model_type;
    model_family family;
} family_entry;

static const family_entry FAMILIES[] = {
    {"bert", FAMILY_BERT},           {"roberta", FAMILY_ROBERTA},
    {"xlm-roberta", FAMILY_ROBERTA}, {"camembert", FAMILY_ROBERTA},
    {"distilbert", FAMILY_DISTILBERT}, {"albert", FAMILY_ALBERT},
};
#define SUPPORTED_TYPES                                                                            \
    "bert, roberta, xlm-roberta, camembert, distilbert, albert (encoders); gpt2, llama, mistral, " \
    "qwen2 (decoders)"

/* Reads an integer field. Absent: `fallback` if has_fallback, else an error naming the field. */
nopad_status hf_get_int(const cJSON *root, const char *where, const char *key, int has_fallback,
                            int32_t fallback, int32_t lo, int32_t hi, int32_t *out) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!item || cJSON_IsNull(item)) {
        if (has_fallback) {
            *out = fallback;
            return NOPAD_OK;
        }
        if (item)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: required field \"%s\" is null; expected an integer in "
                                   "[%d, %d]",
                                   where, key, lo, hi);
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: required field \"%s\" is missing", where, key);
    }
    if (!cJSON_IsNumber(item)) {
        char expected[64];
        snprintf(expected, sizeof expected, "an integer in [%d, %d]", lo, hi);
        return json_wrong_type(where, key, expected, item);
    }
    double v = item->valuedouble;
    if (v != floor(v) || v < lo || v > hi)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: field \"%s\" must be an integer in [%d, %d], found %.15g", where,
                               key, lo, hi, v);
    *out = (int32_t)v;
    return NOPAD_OK;
}

static nopad_status get_float(const cJSON *root, const char *where, const char *key,
                              float fallback, float *out) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!item || cJSON_IsNull(item)) {
        *out = fallback;
        return NOPAD_OK;
    }
    if (!cJSON_IsNumber(item)) return json_wrong_type(where, key, "a number in (0, 1]", item);
    if (!(item->valuedouble > 0) || item->valuedouble > 1)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: field \"%s\" must be a number in (0, 1], found %g",
                               where, key, item->valuedouble);
    *out = (float)item->valuedouble;
    return NOPAD_OK;
}

static nopad_status parse_activation(const cJSON *root, const char *where, const char *key,
                                     const char *fallback, model_config *cfg) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, key);
    const char *name = fallback;
    if (item && !cJSON_IsNull(item)) {
        if (!cJSON_IsString(item)) return json_wrong_type(where, key, "a string", item);
        name = item->valuestring;
    }
    if (!strcmp(name, "gelu"))
        cfg->activation = NOPAD_ACT_GELU;
    else if (!strcmp(name, "gelu_new") || !strcmp(name, "gelu_pytorch_tanh") ||
             !strcmp(name, "gelu_fast"))
        cfg->activation = NOPAD_ACT_GELU_TANH;
    else if (!strcmp(name, "relu"))
        cfg->activation = NOPAD_ACT_RELU;
    else
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: activation \"%s\" (field \"%s\") is not supported; expected "
                               "gelu, gelu_new, gelu_pytorch_tanh, gelu_fast or relu",
                               where, name, key);
    snprintf(cfg->activation_name, sizeof cfg->activation_name, "%s", name);
    return NOPAD_OK;
}

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        nopad_status st_ = (expr);                                                                 \
        if (st_ != NOPAD_OK) {                                                                     \
            cJSON_Delete(root);                                                                    \
            return st_;                                                                            \
        }                                                                                          \
    } while (0)

enum { MAX_DIM = 1 << 16, MAX_LAYERS = 1024, MAX_VOCAB = 1 << 24, MAX_POSITIONS = 1 << 20 };

nopad_status hf_config_parse(const char *json, size_t len, const char *where, model_config *out) {
    memset(out, 0, sizeof *out);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t offset = end ? (size_t)(end - json) : 0;
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: not valid JSON (error near byte %zu)", where,
                               offset);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: expected a JSON object", where);
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!type) {
        cJSON_Delete(root);
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: required field \"model_type\" is missing; expected a string (%s)",
                               where, SUPPORTED_TYPES);
    }
    if (!cJSON_IsString(type)) {
        nopad_status st = json_wrong_type(where, "model_type", "a string (" SUPPORTED_TYPES ")", type);
        cJSON_Delete(root);
        return st;
    }
    nopad_status dst;
    if (hf_decoder_config(root, type->valuestring, where, out, &dst)) {
        cJSON_Delete(root);
        return dst;
    }
    int found = 0;
    for (size_t i = 0; i < sizeof FAMILIES / sizeof FAMILIES[0]; i++) {
        if (!strcmp(type->valuestring, FAMILIES[i].model_type)) {
            out->family = FAMILIES[i].family;
            found = 1;
        }
    }
    if (!found) {
        nopad_status st = nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                          "%s: model_type \"%.64s\" is not supported; supported: %s",
                                          where, type->valuestring, SUPPORTED_TYPES);
        cJSON_Delete(root);
        return st;
    }
    snprintf(out->model_type, sizeof out->model_type, "%s", type->valuestring);

    if (out->family == FAMILY_DISTILBERT) {
        TRY(hf_get_int(root, where, "vocab_size", 0, 0, 1, MAX_VOCAB, &out->vocab_size));
        TRY(hf_get_int(root, where, "dim", 0, 0, 1, MAX_DIM, &out->hidden_size));
        TRY(hf_get_int(root, where, "n_layers", 0, 0, 1, MAX_LAYERS, &out->num_layers));
        TRY(hf_get_int(root, where, "n_heads", 0, 0, 1, MAX_DIM, &out->num_heads));
        TRY(hf_get_int(root, where, "hidden_dim", 0, 0, 1, MAX_DIM * 16, &out->intermediate_size));
        TRY(hf_get_int(root, where, "max_position_embeddings", 0, 0, 1, MAX_POSITIONS,
                    &out->max_position_embeddings));
        TRY(hf_get_int(root, where, "pad_token_id", 1, 0, 0, MAX_VOCAB, &out->pad_token_id));
        TRY(parse_activation(root, where, "activation", "gelu", out));
        out->layer_norm_eps = 1e-12f; /* fixed in DistilBERT's modeling code */
        out->type_vocab_size = 0;
        out->embedding_size = out->hidden_size;
    } else {
        TRY(hf_get_int(root, where, "vocab_size", 0, 0, 1, MAX_VOCAB, &out->vocab_size));
        TRY(hf_get_int(root, where, "hidden_size", 0, 0, 1, MAX_DIM, &out->hidden_size));
        TRY(hf_get_int(root, where, "num_hidden_layers", 0, 0, 1, MAX_LAYERS, &out->num_layers));
        TRY(hf_get_int(root, where, "num_attention_heads", 0, 0, 1, MAX_DIM, &out->num_heads));
        TRY(hf_get_int(root, where, "intermediate_size", 0, 0, 1, MAX_DIM * 16,
                    &out->intermediate_size));
        TRY(hf_get_int(root, where, "max_position_embeddings", 0, 0, 1, MAX_POSITIONS,
                    &out->max_position_embeddings));
        TRY(hf_get_int(root, where, "type_vocab_size", 1, 2, 0, MAX_VOCAB, &out->type_vocab_size));
        TRY(hf_get_int(root, where, "pad_token_id", 1, 0, 0, MAX_VOCAB, &out->pad_token_id));
        TRY(get_float(root, where, "layer_norm_eps", 1e-12f, &out->layer_norm_eps));
        TRY(parse_activation(root, where, "hidden_act",
                             out->family == FAMILY_ALBERT ? "gelu_new" : "gelu", out));
        const cJSON *pet = cJSON_GetObjectItemCaseSensitive(root, "position_embedding_type");
        if (pet && !cJSON_IsNull(pet) && !cJSON_IsString(pet)) {
            nopad_status st = json_wrong_type(where, "position_embedding_type",
                                         "the string \"absolute\"", pet);
            cJSON_Delete(root);
            return st;
        }
        if (cJSON_IsString(pet) && strcmp(pet->valuestring, "absolute") != 0) {
            nopad_status st = nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                              "%s: position_embedding_type \"%.64s\" is not "
                                              "supported; expected \"absolute\"",
                                              where, pet->valuestring);
            cJSON_Delete(root);
            return st;
        }
        out->embedding_size = out->hidden_size;
        if (out->family == FAMILY_ALBERT) {
            TRY(hf_get_int(root, where, "embedding_size", 0, 0, 1, MAX_DIM, &out->embedding_size));
            TRY(hf_get_int(root, where, "num_hidden_groups", 1, 1, 1, MAX_LAYERS,
                        &out->num_hidden_groups));
            TRY(hf_get_int(root, where, "inner_group_num", 1, 1, 1, MAX_LAYERS, &out->inner_group_num));
            if (out->num_layers % out->num_hidden_groups != 0) {
                cJSON_Delete(root);
                return nopad_set_error(NOPAD_ERR_FORMAT,
                                       "%s: num_hidden_layers (%d) must be a multiple of "
                                       "num_hidden_groups (%d)",
                                       where, out->num_layers, out->num_hidden_groups);
            }
        }
        if (out->family == FAMILY_ROBERTA) out->position_offset = out->pad_token_id + 1;
    }
    cJSON_Delete(root);

    if (out->hidden_size % out->num_heads != 0)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: hidden size %d is not divisible by the %d attention heads",
                               where, out->hidden_size, out->num_heads);
    out->head_size = out->hidden_size / out->num_heads;
    /* what every encoder family shares: bidirectional attention over learned positions, with
     * LayerNorm and one key/value head per query head */
    out->causal = 0;
    out->num_kv_heads = out->num_heads;
    out->positions = POSITIONS_LEARNED;
    out->rope_theta = 0.0f;
    out->norm = NORM_LAYERNORM;
    out->bos_token_id = -1;
    if (out->position_offset >= out->max_position_embeddings)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: pad_token_id %d leaves no positions (max_position_embeddings %d)",
                               where, out->pad_token_id, out->max_position_embeddings);
    return NOPAD_OK;
}
#undef TRY


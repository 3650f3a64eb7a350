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
    {"deberta-v2", FAMILY_DEBERTA_V2},
};
#define SUPPORTED_TYPES                                                                            \
    "bert, roberta, xlm-roberta, camembert, distilbert, albert, deberta-v2 (encoders); gpt2, "     \
    "llama, mistral, qwen2 (decoders)"

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
    /* (as the float it becomes: 1e-300 would be an epsilon of 0) */
    if (!((float)item->valuedouble > 0) || item->valuedouble > 1)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: field \"%s\" must be a number in (0, 1], found %g",
                               where, key, item->valuedouble);
    *out = (float)item->valuedouble;
    return NOPAD_OK;
}

/* A probability in [0, 1) (a dropout rate), or `fallback` when the field is absent or null. */
static nopad_status get_probability(const cJSON *root, const char *where, const char *key,
                                    float fallback, float *out) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!item || cJSON_IsNull(item)) {
        *out = fallback;
        return NOPAD_OK;
    }
    if (!cJSON_IsNumber(item)) return json_wrong_type(where, key, "a number in [0, 1)", item);
    if (!(item->valuedouble >= 0) || item->valuedouble >= 1)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: field \"%s\" must be a number in [0, 1), found %g",
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
    else if (!strcmp(name, "silu") || !strcmp(name, "swish"))
        cfg->activation = NOPAD_ACT_SILU;
    else
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: activation \"%s\" (field \"%s\") is not supported; expected "
                               "gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, relu, silu or swish",
                               where, name, key);
    snprintf(cfg->activation_name, sizeof cfg->activation_name, "%s", name);
    return NOPAD_OK;
}

enum { MAX_DIM = 1 << 16, MAX_LAYERS = 1024, MAX_VOCAB = 1 << 24, MAX_POSITIONS = 1 << 20 };

/* An optional boolean field: absent or null gives `fallback`. */
static nopad_status get_bool(const cJSON *root, const char *where, const char *key, int fallback,
                             int *out) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!item || cJSON_IsNull(item)) {
        *out = fallback;
        return NOPAD_OK;
    }
    if (!cJSON_IsBool(item)) return json_wrong_type(where, key, "true or false", item);
    *out = cJSON_IsTrue(item);
    return NOPAD_OK;
}

/* One term of DeBERTa's pos_att_type ("c2p", "p2c"; HF lowercases and strips them). */
static nopad_status deberta_term(const char *where, const char *term, size_t len,
                                 relative_attention *rel) {
    while (len && (*term == ' ' || *term == '\t')) term++, len--;
    while (len && (term[len - 1] == ' ' || term[len - 1] == '\t')) len--;
    char t[8] = {0};
    if (len < sizeof t)
        for (size_t i = 0; i < len; i++) t[i] = (char)(term[i] >= 'A' && term[i] <= 'Z' ? term[i] + 32 : term[i]);
    if (len < sizeof t && !strcmp(t, "c2p"))
        rel->c2p = 1;
    else if (len < sizeof t && !strcmp(t, "p2c"))
        rel->p2c = 1;
    else
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: pos_att_type term \"%.*s\" is not supported; expected \"c2p\" "
                               "and/or \"p2c\" (as a list, or joined by '|')",
                               where, (int)(len > 32 ? 32 : len), term);
    return NOPAD_OK;
}

/* DeBERTa-v2/v3's fields beyond BERT's, as DebertaV2Config and the modeling code read them
 * (several through getattr with a default: position_buckets, share_att_key, norm_rel_ebd). */
static nopad_status parse_deberta(const cJSON *root, const char *where, model_config *out) {
    relative_attention *rel = &out->rel;
    nopad_status st = get_bool(root, where, "relative_attention", 0, &rel->enabled);
    if (st == NOPAD_OK) st = get_bool(root, where, "position_biased_input", 1, &out->absolute_positions);
    if (st == NOPAD_OK) st = get_bool(root, where, "share_att_key", 0, &rel->share_att_key);
    if (st == NOPAD_OK)
        st = hf_get_int(root, where, "position_buckets", 1, -1, INT32_MIN, MAX_POSITIONS, &rel->position_buckets);
    if (st == NOPAD_OK)
        st = hf_get_int(root, where, "max_relative_positions", 1, -1, INT32_MIN, MAX_POSITIONS,
                        &rel->max_relative_positions);
    if (st != NOPAD_OK) return st;

    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(root, "pos_att_type");
    if (cJSON_IsString(pat)) {
        for (const char *p = pat->valuestring; st == NOPAD_OK;) {
            const char *bar = strchr(p, '|');
            const size_t n = bar ? (size_t)(bar - p) : strlen(p);
            st = deberta_term(where, p, n, rel);
            if (!bar) break;
            p = bar + 1;
        }
    } else if (cJSON_IsArray(pat)) {
        const cJSON *item;
        cJSON_ArrayForEach(item, pat) {
            if (!cJSON_IsString(item))
                return json_wrong_type(where, "pos_att_type", "a list of \"c2p\" / \"p2c\"", item);
            if ((st = deberta_term(where, item->valuestring, strlen(item->valuestring), rel)) != NOPAD_OK)
                return st;
        }
    } else if (pat && !cJSON_IsNull(pat)) {
        return json_wrong_type(where, "pos_att_type", "a list or a '|'-joined string of c2p, p2c", pat);
    }
    if (st != NOPAD_OK) return st;

    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "norm_rel_ebd");
    if (norm && !cJSON_IsNull(norm)) {
        if (!cJSON_IsString(norm)) return json_wrong_type(where, "norm_rel_ebd", "\"layer_norm\" or \"none\"", norm);
        if (!strcmp(norm->valuestring, "layer_norm"))
            rel->norm_rel_ebd = 1;
        else if (strcmp(norm->valuestring, "none") != 0)
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                   "%s: norm_rel_ebd \"%.64s\" is not supported; expected "
                                   "\"layer_norm\" or \"none\"",
                                   where, norm->valuestring);
    }
    int32_t v = 0;
    if ((st = hf_get_int(root, where, "conv_kernel_size", 1, 0, 0, MAX_DIM, &v)) != NOPAD_OK) return st;
    if (v > 0)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: conv_kernel_size %d asks for DeBERTa-v2's convolution after the "
                               "first layer (deberta-v2-xlarge), which is not supported; expected 0 "
                               "or absent",
                               where, v);
    if ((st = hf_get_int(root, where, "embedding_size", 1, out->hidden_size, 1, MAX_DIM, &v)) != NOPAD_OK)
        return st;
    if (v != out->hidden_size)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: embedding_size %d differs from hidden_size %d (DeBERTa's embed_proj), "
                               "which is not supported",
                               where, v, out->hidden_size);
    if ((st = hf_get_int(root, where, "attention_head_size", 1, out->hidden_size / out->num_heads, 1,
                         MAX_DIM, &v)) != NOPAD_OK)
        return st;
    if (v * out->num_heads != out->hidden_size)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: attention_head_size %d times %d heads is not hidden_size %d, which "
                               "is not supported",
                               where, v, out->num_heads, out->hidden_size);

    /* HF counts the terms in the scale even when relative_attention is off */
    out->attention_scale_factor = 1 + rel->c2p + rel->p2c;
    if (!rel->enabled) {
        if (!out->absolute_positions)
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                   "%s: relative_attention is false and position_biased_input is "
                                   "false: the model would see no positions at all; expected one "
                                   "of them true",
                                   where);
        rel->c2p = rel->p2c = 0;
        return NOPAD_OK;
    }
    if (rel->max_relative_positions < 1) rel->max_relative_positions = out->max_position_embeddings;
    rel->att_span = rel->max_relative_positions;
    if (rel->position_buckets > 0) {
        rel->att_span = rel->position_buckets;
        /* make_log_bucket_position divides by log((max_relative_positions - 1) / (buckets / 2)) */
        const int32_t mid = rel->position_buckets / 2;
        if (mid < 1 || rel->max_relative_positions - 1 <= mid)
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                   "%s: position_buckets %d with max_relative_positions %d: log "
                                   "buckets need position_buckets >= 2 and max_relative_positions > "
                                   "position_buckets / 2 + 1",
                                   where, rel->position_buckets, rel->max_relative_positions);
    }
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
        out->absolute_positions = 1;
        out->attention_scale_factor = 1;
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
        const int deberta = out->family == FAMILY_DEBERTA_V2; /* DebertaV2Config's defaults */
        TRY(hf_get_int(root, where, "type_vocab_size", 1, deberta ? 0 : 2, 0, MAX_VOCAB,
                       &out->type_vocab_size));
        TRY(hf_get_int(root, where, "pad_token_id", 1, 0, 0, MAX_VOCAB, &out->pad_token_id));
        TRY(get_float(root, where, "layer_norm_eps", deberta ? 1e-7f : 1e-12f, &out->layer_norm_eps));
        TRY(get_probability(root, where, "hidden_dropout_prob", 0.1f, &out->hidden_dropout_prob));
        TRY(get_probability(root, where, "attention_probs_dropout_prob", 0.1f,
                            &out->attention_probs_dropout_prob));
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
        out->absolute_positions = 1;
        out->attention_scale_factor = 1;
        if (deberta && out->hidden_size % out->num_heads == 0) TRY(parse_deberta(root, where, out));
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


void hf_labels_free(char **labels, int32_t n) {
    if (!labels) return;
    for (int32_t i = 0; i < n; i++) free(labels[i]);
    free(labels);
}

/* ACT2FN's names nopad computes, for the heads' poolers (which may also ask for tanh). */
static int pooler_activation(const char *name, nopad_activation *out) {
    static const struct { const char *name; nopad_activation act; } NAMES[] = {
        {"tanh", NOPAD_ACT_TANH},        {"gelu", NOPAD_ACT_GELU},
        {"gelu_new", NOPAD_ACT_GELU_TANH}, {"gelu_pytorch_tanh", NOPAD_ACT_GELU_TANH},
        {"gelu_fast", NOPAD_ACT_GELU_TANH}, {"relu", NOPAD_ACT_RELU},
        {"silu", NOPAD_ACT_SILU},        {"swish", NOPAD_ACT_SILU},
    };
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++)
        if (!strcmp(name, NAMES[i].name)) return *out = NAMES[i].act, 1;
    return 0;
}

nopad_status hf_config_head(const char *json, size_t len, const char *where, model_config *cfg,
                            char ***labels) {
    memset(&cfg->head, 0, sizeof cfg->head);
    *labels = NULL;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: not valid JSON", where);
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *arch = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    const char *suffix = "ForSequenceClassification";
    const size_t n_suffix = strlen(suffix);
    if (!cJSON_IsString(arch) || strlen(arch->valuestring) < n_suffix ||
        strcmp(arch->valuestring + strlen(arch->valuestring) - n_suffix, suffix) != 0) {
        cJSON_Delete(root);
        return NOPAD_OK;
    }
    classifier_head *h = &cfg->head;
    snprintf(h->architecture, sizeof h->architecture, "%s", arch->valuestring);
    h->act = cfg->family == FAMILY_DISTILBERT ? NOPAD_ACT_RELU : NOPAD_ACT_TANH;
    nopad_status st = NOPAD_OK;
    if (cfg->family == FAMILY_DEBERTA_V2) {
        const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "pooler_hidden_act");
        const char *name = cJSON_IsString(act) ? act->valuestring : "gelu";
        int32_t pooler_size = 0;
        if (act && !cJSON_IsNull(act) && !cJSON_IsString(act))
            st = json_wrong_type(where, "pooler_hidden_act", "a string", act);
        else if (!pooler_activation(name, &h->act))
            st = nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                 "%s: pooler_hidden_act \"%.32s\" is not supported; expected tanh, "
                                 "gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, relu, silu or swish",
                                 where, name);
        else if ((st = hf_get_int(root, where, "pooler_hidden_size", 1, cfg->hidden_size, 1, MAX_DIM,
                                  &pooler_size)) == NOPAD_OK &&
                 pooler_size != cfg->hidden_size)
            st = nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                 "%s: pooler_hidden_size %d differs from hidden_size %d, which is "
                                 "not supported",
                                 where, pooler_size, cfg->hidden_size);
    }
    /* HF derives num_labels from id2label ({"0": "LABEL_0", "1": "LABEL_1"} by default; a config
     * written by hand may give num_labels alone) */
    const cJSON *id2label = cJSON_GetObjectItemCaseSensitive(root, "id2label");
    int32_t n = 2;
    if (st == NOPAD_OK && (!id2label || cJSON_IsNull(id2label)))
        st = hf_get_int(root, where, "num_labels", 1, 2, 1, 1 << 20, &n);
    if (st == NOPAD_OK && id2label && !cJSON_IsNull(id2label)) {
        if (!cJSON_IsObject(id2label))
            st = json_wrong_type(where, "id2label", "an object {\"0\": label, ...}", id2label);
        else
            n = cJSON_GetArraySize(id2label);
        if (st == NOPAD_OK && n < 1)
            st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: id2label is empty; a classifier needs >= 1 label",
                                 where);
    }
    char **names = st == NOPAD_OK ? calloc((size_t)n, sizeof *names) : NULL;
    if (st == NOPAD_OK && !names) st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", where);
    for (int32_t i = 0; st == NOPAD_OK && i < n; i++) {
        char key[16], fallback[32];
        snprintf(key, sizeof key, "%d", i);
        snprintf(fallback, sizeof fallback, "LABEL_%d", i);
        const cJSON *label = id2label && cJSON_IsObject(id2label)
                                 ? cJSON_GetObjectItemCaseSensitive(id2label, key) : NULL;
        if (id2label && cJSON_IsObject(id2label) && !cJSON_IsString(label))
            st = nopad_set_error(NOPAD_ERR_FORMAT,
                                 "%s: id2label has %d entries but no string label for id \"%s\"; "
                                 "expected the ids 0 .. %d",
                                 where, n, key, n - 1);
        else if (!(names[i] = strdup(label ? label->valuestring : fallback)))
            st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", where);
    }
    cJSON_Delete(root);
    if (st != NOPAD_OK) {
        hf_labels_free(names, n);
        memset(h, 0, sizeof *h);
        return st;
    }
    h->present = 1;
    h->num_labels = n;
    *labels = names;
    return NOPAD_OK;
}

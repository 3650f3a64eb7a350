/* sentence-transformers folders: modules.json lists the pipeline (Transformer, Pooling,
 * Normalize, ...); 1_Pooling/config.json picks the pooling; sentence_bert_config.json caps the
 * sequence length. Modules we cannot reproduce exactly (Dense, other poolings) are refused rather
 * than silently skipped: a wrong embedding is worse than an error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "io/st_pipeline.h"
#include "io/json.h"
#include "util/error.h"
#include "util/file.h"

static nopad_status load_json(const char *path, cJSON **out) {
    char *text;
    size_t len;
    *out = NULL;
    nopad_status st = read_file(path, 0, &text, &len);
    if (st != NOPAD_OK) return st;
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    size_t offset = end ? (size_t)(end - text) : 0;
    free(text);
    if (!*out) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: not valid JSON (error near byte %zu)", path, offset);
    return NOPAD_OK;
}

/* A pooling flag: true or false; absent or null reads as false. Anything else ("yes", 7) is an
 * error rather than a silent false. */
static nopad_status flag(const char *path, const cJSON *cfg, const char *key, int *out) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(cfg, key);
    *out = 0;
    if (!item || cJSON_IsNull(item)) return NOPAD_OK;
    if (!cJSON_IsBool(item)) return json_wrong_type(path, key, "a boolean (true/false)", item);
    *out = cJSON_IsTrue(item);
    return NOPAD_OK;
}

/* load_json for files whose top level must be an object. */
static nopad_status load_json_object(const char *path, cJSON **out) {
    nopad_status st = load_json(path, out);
    if (st != NOPAD_OK || cJSON_IsObject(*out)) return st;
    st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: expected a JSON object, found %s", path,
                         json_type_name(*out));
    cJSON_Delete(*out);
    *out = NULL;
    return st;
}

static nopad_status load_pooling(const char *path, st_pipeline *out) {
    cJSON *cfg;
    nopad_status st = load_json_object(path, &cfg);
    if (st != NOPAD_OK) return st;
    static const char *const unsupported[] = {"pooling_mode_mean_sqrt_len_tokens",
                                              "pooling_mode_weightedmean_tokens",
                                              "pooling_mode_lasttoken"};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
        int on;
        st = flag(path, cfg, unsupported[i], &on);
        if (st == NOPAD_OK && on)
            st = nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: %s is not supported (cls, mean, max are)",
                                 path, unsupported[i]);
        if (st != NOPAD_OK) {
            cJSON_Delete(cfg);
            return st;
        }
    }
    int cls, mean, max;
    if ((st = flag(path, cfg, "pooling_mode_cls_token", &cls)) != NOPAD_OK ||
        (st = flag(path, cfg, "pooling_mode_mean_tokens", &mean)) != NOPAD_OK ||
        (st = flag(path, cfg, "pooling_mode_max_tokens", &max)) != NOPAD_OK) {
        cJSON_Delete(cfg);
        return st;
    }
    /* sentence-transformers >= 6 writes one string instead of the flags. */
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(cfg, "pooling_mode");
    if (mode && !cJSON_IsNull(mode) && !cJSON_IsString(mode)) {
        st = json_wrong_type(path, "pooling_mode", "a string (cls, mean or max)", mode);
        cJSON_Delete(cfg);
        return st;
    }
    if (cJSON_IsString(mode)) {
        const char *m = mode->valuestring;
        cls = !strcmp(m, "cls");
        mean = !strcmp(m, "mean");
        max = !strcmp(m, "max");
        if (!cls && !mean && !max) {
            st = nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                 "%s: pooling_mode \"%.64s\" is not supported (cls, mean, max are)",
                                 path, m);
            cJSON_Delete(cfg);
            return st;
        }
    }
    cJSON_Delete(cfg);
    if (cls + mean + max != 1)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: exactly one of pooling_mode_cls_token, pooling_mode_mean_tokens, "
                               "pooling_mode_max_tokens must be true (%d are)",
                               path, cls + mean + max);
    out->pooling = cls ? NOPAD_POOLING_CLS : mean ? NOPAD_POOLING_MEAN : NOPAD_POOLING_MAX;
    return NOPAD_OK;
}

nopad_status st_pipeline_load(const char *dir, st_pipeline *out) {
    char path[4096];
    memset(out, 0, sizeof *out);
    out->pooling = NOPAD_POOLING_CLS;

    snprintf(path, sizeof path, "%s/sentence_bert_config.json", dir);
    if (file_exists(path)) {
        cJSON *cfg;
        nopad_status st = load_json_object(path, &cfg);
        if (st != NOPAD_OK) return st;
        const cJSON *msl = cJSON_GetObjectItemCaseSensitive(cfg, "max_seq_length");
        if (msl && !cJSON_IsNull(msl)) {
            if (!cJSON_IsNumber(msl)) {
                st = json_wrong_type(path, "max_seq_length", "a positive integer", msl);
                cJSON_Delete(cfg);
                return st;
            }
            if (msl->valuedouble < 1 || msl->valuedouble > (1 << 24) ||
                msl->valuedouble != (double)(int32_t)msl->valuedouble) {
                st = nopad_set_error(NOPAD_ERR_FORMAT,
                                     "%s: max_seq_length must be a positive integer up to %d, found "
                                     "%.15g",
                                     path, 1 << 24, msl->valuedouble);
                cJSON_Delete(cfg);
                return st;
            }
            out->max_seq_length = (int32_t)msl->valuedouble;
        }
        cJSON_Delete(cfg);
    }

    /* sentence-transformers >= 6 keeps the limit only as the tokenizer's model_max_length
     * (tokenizer_config.json); older folders may have both, and then sentence_bert_config wins.
     * transformers writes a huge sentinel (1e30) when there is no limit: ignore such values. */
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (out->max_seq_length == 0 && file_exists(path)) {
        cJSON *cfg;
        nopad_status st = load_json_object(path, &cfg);
        if (st != NOPAD_OK) return st;
        const cJSON *mml = cJSON_GetObjectItemCaseSensitive(cfg, "model_max_length");
        if (cJSON_IsNumber(mml) && mml->valuedouble >= 1 && mml->valuedouble <= (1 << 24))
            out->max_seq_length = (int32_t)mml->valuedouble;
        cJSON_Delete(cfg);
    }

    snprintf(path, sizeof path, "%s/modules.json", dir);
    if (!file_exists(path)) return NOPAD_OK;
    cJSON *modules;
    nopad_status st = load_json(path, &modules);
    if (st != NOPAD_OK) return st;
    if (!cJSON_IsArray(modules)) {
        st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: expected a JSON array of modules, found %s",
                             path, json_type_name(modules));
        cJSON_Delete(modules);
        return st;
    }
    out->has_pipeline = 1;
    const cJSON *module;
    int index = 0;
    cJSON_ArrayForEach(module, modules) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(module, "type");
        const cJSON *mpath = cJSON_GetObjectItemCaseSensitive(module, "path");
        if (!cJSON_IsObject(module)) {
            st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: module %d: expected a JSON object, found %s",
                                 path, index, json_type_name(module));
            cJSON_Delete(modules);
            return st;
        }
        if (!cJSON_IsString(type) || !cJSON_IsString(mpath)) {
            const char *key = !cJSON_IsString(type) ? "type" : "path";
            const cJSON *bad = !cJSON_IsString(type) ? type : mpath;
            st = bad ? nopad_set_error(NOPAD_ERR_FORMAT,
                                       "%s: module %d: field \"%s\" has the wrong JSON type: "
                                       "expected a string, found %s",
                                       path, index, key, json_type_name(bad))
                     : nopad_set_error(NOPAD_ERR_FORMAT,
                                       "%s: module %d: required string field \"%s\" is missing",
                                       path, index, key);
            cJSON_Delete(modules);
            return st;
        }
        const char *t = type->valuestring;
        const char *dot = strrchr(t, '.');
        const char *short_name = dot ? dot + 1 : t;
        if (strstr(mpath->valuestring, "..")) {
            st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: module path \"%.200s\" leaves the folder",
                                 path, mpath->valuestring);
            cJSON_Delete(modules);
            return st;
        }
        if (!strcmp(short_name, "Transformer")) {
            /* the encoder itself: this folder */
        } else if (!strcmp(short_name, "Pooling")) {
            char cfg_path[4096];
            snprintf(cfg_path, sizeof cfg_path, "%s/%s/config.json", dir, mpath->valuestring);
            st = load_pooling(cfg_path, out);
            if (st != NOPAD_OK) {
                cJSON_Delete(modules);
                return st;
            }
        } else if (!strcmp(short_name, "Normalize")) {
            out->normalize = 1;
        } else {
            st = nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                 "%s: module %d of type \"%s\" is not supported (Transformer, "
                                 "Pooling and Normalize are)",
                                 path, index, t);
            cJSON_Delete(modules);
            return st;
        }
        index++;
    }
    cJSON_Delete(modules);
    return NOPAD_OK;
}

/* libFuzzer target: the GGUF parser on arbitrary bytes.
 * Beyond "no crash, no leak", a successful parse must keep its promises: every string, array and
 * tensor lies inside the buffer, lookups find every key and tensor, the getters agree with the
 * types, and tensor data follows the alignment rules. A parsed file's tokenizer metadata then
 * goes through the converter (tokenizer_gguf.c) and, when it converts, the tokenizer is built
 * and tokenizes a fixed text; a decoder config read from the metadata must be one the graph can
 * run. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/gguf.h"
#include "io/gguf_config.h"
#include "io/tokenizer_internal.h"

static void check_inside(const uint8_t *data, size_t size, const void *p, uint64_t n) {
    const uint8_t *b = p;
    if (n == 0) return;
    if (b < data || b > data + size || n > (uint64_t)(data + size - b)) __builtin_trap();
    volatile uint8_t sink = b[0];
    sink = b[n - 1];
    (void)sink;
}

static uint64_t value_size(gguf_type t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static void check_array(const uint8_t *data, size_t size, const gguf_array *a, int depth) {
    if (depth > GGUF_MAX_ARRAY_DEPTH) __builtin_trap();
    if (a->type == GGUF_TYPE_STRING) {
        for (uint64_t i = 0; i < a->n; i++)
            check_inside(data, size, a->strs[i].data, a->strs[i].len);
    } else if (a->type == GGUF_TYPE_ARRAY) {
        for (uint64_t i = 0; i < a->n; i++) check_array(data, size, &a->arrs[i], depth + 1);
    } else {
        uint64_t s = value_size(a->type);
        if (s == 0 || a->n > size / s) __builtin_trap();
        check_inside(data, size, a->data, a->n * s);
        if (a->type == GGUF_TYPE_BOOL)
            for (uint64_t i = 0; i < a->n; i++)
                if (a->data[i] > 1) __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file f;
    if (gguf_parse(data, size, "fuzz", &f) == NOPAD_OK) {
        if (f.version != 2 && f.version != 3) __builtin_trap();
        if (f.alignment == 0 || (f.alignment & (f.alignment - 1))) __builtin_trap();
        for (uint64_t i = 0; i < f.n_kv; i++) {
            const gguf_kv *kv = &f.kvs[i];
            check_inside(data, size, kv->key.data, kv->key.len);
            if (kv->key.len == 0) __builtin_trap();
            if (kv->type == GGUF_TYPE_STRING) check_inside(data, size, kv->str.data, kv->str.len);
            else if (kv->type == GGUF_TYPE_ARRAY) check_array(data, size, &kv->arr, 1);
            else check_inside(data, size, kv->data, value_size(kv->type));
            /* keys with a NUL cannot be looked up by C string; the others must be found */
            char key[256];
            if (kv->key.len < sizeof key && !memchr(kv->key.data, 0, (size_t)kv->key.len)) {
                memcpy(key, kv->key.data, (size_t)kv->key.len);
                key[kv->key.len] = '\0';
                if (gguf_find(&f, key) != kv) __builtin_trap();
                uint32_t u32;
                int32_t i32;
                uint64_t u64;
                float f32;
                int b;
                gguf_str s;
                const gguf_array *a;
                if ((gguf_get_u32(&f, key, &u32) == NOPAD_OK) != (kv->type == GGUF_TYPE_UINT32))
                    __builtin_trap();
                (void)gguf_get_i32(&f, key, &i32);
                (void)gguf_get_u64(&f, key, &u64);
                (void)gguf_get_f32(&f, key, &f32);
                if (gguf_get_bool(&f, key, &b) == NOPAD_OK && b != 0 && b != 1) __builtin_trap();
                (void)gguf_get_str(&f, key, &s);
                if (gguf_get_str_array(&f, key, &a) == NOPAD_OK)
                    for (uint64_t k = 0; k < a->n; k++) (void)gguf_array_str(a, k);
                if (gguf_get_f32_array(&f, key, &a) == NOPAD_OK)
                    for (uint64_t k = 0; k < a->n; k++) (void)gguf_array_f32(a, k);
                if (gguf_get_i32_array(&f, key, &a) == NOPAD_OK)
                    for (uint64_t k = 0; k < a->n; k++) (void)gguf_array_i32(a, k);
            }
        }
        uint64_t expected = 0;
        for (uint64_t i = 0; i < f.n_tensors; i++) {
            const gguf_tensor *t = &f.tensors[i];
            if (t->n_dims > GGUF_MAX_DIMS || strlen(t->name) >= GGUF_MAX_NAME) __builtin_trap();
            if (gguf_find_tensor(&f, t->name) != t) __builtin_trap();
            if (t->offset != expected || t->offset % f.alignment) __builtin_trap();
            expected += (t->nbytes + f.alignment - 1) / f.alignment * f.alignment;
            if (f.data_offset > size || t->offset > size - f.data_offset ||
                t->nbytes > size - f.data_offset - t->offset)
                __builtin_trap();
            const void *p;
            size_t n;
            if (gguf_tensor_data(&f, t, &p, &n) == NOPAD_OK) {
                if (n != t->nbytes) __builtin_trap();
                check_inside(data, size, p, n);
            }
        }
        cJSON *tree = NULL;
        if (tokenizer_json_from_gguf(&f, &tree) == NOPAD_OK) {
            nopad_tokenizer *tok = NULL;
            if (tokenizer_from_cjson(tree, "fuzz", &tok) == NOPAD_OK) {
                static const char text[] =
                    "Hello, world! <s> ab\xe2\x96\x81x \xf0\x9f\x98\x80 12345";
                int32_t ids[256], n = 0;
                nopad_tokenize_params p = nopad_tokenize_default_params();
                (void)nopad_tokenize(tok, text, sizeof text - 1, &p, ids, 256, &n);
                nopad_tokenizer_free(tok);
            }
            cJSON_Delete(tree);
        }
        /* a decoder's config from the metadata: what it accepts, the graph can run (an even
         * head size for RoPE and the Q/K un-permutation, finite positive epsilon and RoPE
         * values) */
        model_config cfg;
        if (gguf_model_config(&f, &cfg) == NOPAD_OK) {
            if (cfg.head_size < 2 || cfg.head_size % 2 != 0 ||
                cfg.head_size * cfg.num_heads != cfg.hidden_size || cfg.num_kv_heads < 1 ||
                cfg.num_heads % cfg.num_kv_heads != 0 ||
                !(cfg.layer_norm_eps > 0 && isfinite(cfg.layer_norm_eps)) ||
                !(cfg.rope_theta > 0 && isfinite(cfg.rope_theta)) ||
                !(cfg.rope.factor > 0 && isfinite(cfg.rope.factor)))
                __builtin_trap();
        }
    }
    gguf_close(&f);
    return 0;
}

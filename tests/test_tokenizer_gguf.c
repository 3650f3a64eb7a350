/* Tokenizers from GGUF metadata (src/io/tokenizer_gguf.c) against what Hugging Face transformers
 * builds from the same files (fixtures by scripts/make_gguf_tokenizer_fixtures.py):
 *   - small GGUF files (two SentencePiece "llama" ones, three byte-level "gpt2" ones with the
 *     plain, llama-bpe and qwen2 pre-tokenizers): the converted tokenizer.json tree equals
 *     transformers' and the ids equal its ids on every corpus line, with and without special
 *     tokens, and nopad_detokenize its decode (with and without skip_special_tokens);
 *   - the real SmolLM2-135M-Instruct GGUF (scripts/fetch_default_decoder.sh; its path in
 *     NOPAD_SMOLLM2_GGUF, skipped when absent): the same on every corpus line;
 *   - files the converter refuses, each with its message. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/gguf.h"
#include "io/tokenizer_internal.h"

static const char *const tiny[] = {"tiny_llama", "tiny_llama_merges", "tiny_gpt2",
                                   "tiny_gpt2_llama_bpe", "tiny_gpt2_qwen2"};
enum { N_TINY = sizeof tiny / sizeof tiny[0], MAX_IDS = 1 << 16 };

static const char *gguf_path(const char *name, const char *ext) {
    static char rel[256];
    snprintf(rel, sizeof rel, "tokenizer/gguf/%s.%s", name, ext);
    return test_data_path(rel);
}

static char *read_data(const char *path, size_t *len) {
    char *data = test_read_file(path, len);
    if (!data) fail_msg("cannot read %s (run scripts/make_gguf_tokenizer_fixtures.py)", path);
    return data;
}

/* ---- trees ---------------------------------------------------------------------------------- */

/* The path of the first place where two trees differ ("" when equal), for the failure message. */
static int first_difference(const cJSON *a, const cJSON *b, char *path, size_t cap) {
    size_t used = strlen(path);
    if ((a->type & 0xff) != (b->type & 0xff)) return 1;
    if (cJSON_IsObject(a)) {
        const cJSON *x;
        cJSON_ArrayForEach(x, a) {
            const cJSON *y = cJSON_GetObjectItemCaseSensitive(b, x->string);
            snprintf(path + used, cap - used, "/%.60s", x->string);
            if (!y || first_difference(x, y, path, cap)) return 1;
        }
        path[used] = '\0';
        if (cJSON_GetArraySize(a) != cJSON_GetArraySize(b)) {
            snprintf(path + used, cap - used, " (%d keys, transformers has %d)",
                     cJSON_GetArraySize(a), cJSON_GetArraySize(b));
            return 1;
        }
        return 0;
    }
    if (cJSON_IsArray(a)) {
        const cJSON *x = a->child, *y = b->child;
        for (int i = 0; x && y; i++, x = x->next, y = y->next) {
            snprintf(path + used, cap - used, "[%d]", i);
            if (first_difference(x, y, path, cap)) return 1;
        }
        path[used] = '\0';
        if (x || y) {
            snprintf(path + used, cap - used, " (%d items, transformers has %d)",
                     cJSON_GetArraySize(a), cJSON_GetArraySize(b));
            return 1;
        }
        return 0;
    }
    return !cJSON_Compare(a, b, 1);
}

static void test_trees_equal_transformers(void **state) {
    (void)state;
    for (int k = 0; k < N_TINY; k++) {
        gguf_file f;
        assert_nopad_ok(gguf_open(gguf_path(tiny[k], "gguf"), &f));
        cJSON *mine = NULL;
        assert_nopad_ok(tokenizer_json_from_gguf(&f, &mine));
        gguf_close(&f);
        size_t len;
        char *text = read_data(gguf_path(tiny[k], "json"), &len);
        cJSON *theirs = cJSON_ParseWithLength(text, len);
        free(text);
        assert_non_null(theirs);
        char path[512] = "";
        if (first_difference(mine, theirs, path, sizeof path))
            fail_msg("%s: the converted tree differs from transformers' at %s", tiny[k],
                     path[0] ? path : "the top");
        assert_true(cJSON_Compare(mine, theirs, 1));
        cJSON_Delete(mine);
        cJSON_Delete(theirs);
    }
}

/* ---- ids ------------------------------------------------------------------------------------ */

static void expect(const nopad_tokenizer *tok, const char *label, const char *text, size_t len,
                   int special, const cJSON *want, int32_t *ids) {
    nopad_tokenize_params p = nopad_tokenize_default_params();
    p.add_special_tokens = special;
    int32_t n = 0;
    nopad_status st = nopad_tokenize(tok, text, len, &p, ids, MAX_IDS, &n);
    if (st != NOPAD_OK) fail_msg("%s: %s", label, nopad_last_error());
    test_expect_ids(label, ids, n, want);
}

/* nopad_detokenize of the JSON id list `ids` equals transformers' decode (`want`: its hex). */
static void expect_decode(const nopad_tokenizer *tok, const char *label, const cJSON *ids,
                          int skip, const cJSON *want, int32_t *buf) {
    int32_t n = 0;
    const cJSON *id;
    cJSON_ArrayForEach(id, ids) buf[n++] = id->valueint;
    size_t len = 0;
    nopad_status st = nopad_detokenize(tok, buf, (size_t)n, skip, NULL, 0, &len); /* measure */
    if (st != NOPAD_ERR_BUFFER_TOO_SMALL) fail_msg("%s: decode: %s", label, nopad_last_error());
    char *text = malloc(len + 1);
    assert_non_null(text);
    st = nopad_detokenize(tok, buf, (size_t)n, skip, text, len + 1, &len);
    if (st != NOPAD_OK) fail_msg("%s: decode: %s", label, nopad_last_error());
    size_t want_len;
    char *expected = test_hex_decode(want->valuestring, &want_len);
    if (len != want_len || memcmp(text, expected, len) != 0)
        fail_msg("%s: decode%s gives \"%s\" (%zu bytes), transformers \"%s\" (%zu bytes)",
                 label, skip ? " skipping special tokens" : "", text, len, expected, want_len);
    free(expected);
    free(text);
}

/* Every line of `cases` (a .jsonl under tests/data) through `check`; returns the line count. */
static int for_each_case(const char *cases, void (*check)(const cJSON *row, const char *text,
                                                         size_t len, void *ctx),
                         void *ctx) {
    size_t size;
    char *data = read_data(test_data_path(cases), &size);
    int n = 0;
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n"), n++) {
        cJSON *row = cJSON_Parse(line);
        assert_non_null(row);
        size_t len;
        char *text = test_hex_decode(cJSON_GetObjectItem(row, "hex")->valuestring, &len);
        check(row, text, len, ctx);
        free(text);
        cJSON_Delete(row);
    }
    free(data);
    return n;
}

typedef struct tiny_ctx {
    nopad_tokenizer *tok[N_TINY];
    int32_t *ids;
} tiny_ctx;

static void check_tiny(const cJSON *row, const char *text, size_t len, void *ctx) {
    tiny_ctx *c = ctx;
    int line = cJSON_GetObjectItem(row, "line")->valueint;
    for (int k = 0; k < N_TINY; k++) {
        char key[96], label[160];
        snprintf(key, sizeof key, "%s", tiny[k]);
        snprintf(label, sizeof label, "%s, line %d", tiny[k], line);
        expect(c->tok[k], label, text, len, 1, cJSON_GetObjectItem(row, key), c->ids);
        snprintf(key, sizeof key, "%s/nospecial", tiny[k]);
        snprintf(label, sizeof label, "%s without special tokens, line %d", tiny[k], line);
        expect(c->tok[k], label, text, len, 0, cJSON_GetObjectItem(row, key), c->ids);
        const cJSON *ids = cJSON_GetObjectItem(row, tiny[k]);
        snprintf(label, sizeof label, "%s, line %d", tiny[k], line);
        snprintf(key, sizeof key, "%s/decode", tiny[k]);
        expect_decode(c->tok[k], label, ids, 0, cJSON_GetObjectItem(row, key), c->ids);
        snprintf(key, sizeof key, "%s/decode_skip", tiny[k]);
        expect_decode(c->tok[k], label, ids, 1, cJSON_GetObjectItem(row, key), c->ids);
    }
}

static void test_ids_equal_transformers(void **state) {
    (void)state;
    tiny_ctx c = {.ids = malloc(MAX_IDS * sizeof(int32_t))};
    assert_non_null(c.ids);
    for (int k = 0; k < N_TINY; k++) {
        /* through the public entry for one of them */
        if (k == 0) assert_nopad_ok(nopad_tokenizer_load(gguf_path(tiny[k], "gguf"), &c.tok[k]));
        else assert_nopad_ok(tokenizer_from_gguf_file(gguf_path(tiny[k], "gguf"), &c.tok[k]));
    }
    int n = for_each_case("tokenizer/gguf_cases.jsonl", check_tiny, &c);
    assert_true(n >= 386);
    print_message("%d lines x %d tokenizers: ids (with and without special tokens) and decodes "
                  "(with and without them) equal to transformers'\n", n, N_TINY);
    for (int k = 0; k < N_TINY; k++) nopad_tokenizer_free(c.tok[k]);
    free(c.ids);
}

/* What the tiny files' special tokens became: a user-defined token is matched whole but not
 * special, a control token spelled outside the byte alphabet is not added, the duplicate
 * spelling takes the later id. */
static void test_added_tokens(void **state) {
    (void)state;
    nopad_tokenizer *t;
    assert_nopad_ok(tokenizer_from_gguf_file(gguf_path("tiny_gpt2", "gguf"), &t));
    int32_t think = nopad_tokenizer_token_to_id(t, "<think>");
    assert_true(think >= 500);
    int32_t ids[8], n;
    nopad_tokenize_params p = nopad_tokenize_default_params();
    assert_nopad_ok(nopad_tokenize(t, "<think>", 7, &p, ids, 8, &n));
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], think);
    assert_int_equal(nopad_tokenizer_token_to_id(t, "<|ctl x|>"), -1);
    assert_int_equal(nopad_tokenizer_token_to_id(t, "\xc3\xa9"), think + 2); /* "é" */
    assert_true(nopad_tokenizer_token_to_id(t, "x\xc4\xa0y") > think);     /* "x y" respelled */
    nopad_tokenizer_free(t);

    assert_nopad_ok(tokenizer_from_gguf_file(gguf_path("tiny_llama", "gguf"), &t));
    assert_int_equal(nopad_tokenizer_token_to_id(t, "<s>"), 1);
    assert_nopad_ok(nopad_tokenize(t, "", 0, &p, ids, 8, &n));
    assert_int_equal(n, 1); /* add_bos_token defaults to true for "llama" */
    assert_int_equal(ids[0], 1);
    nopad_tokenizer_free(t);
}

/* ---- refusals ------------------------------------------------------------------------------- */

static void test_refused(void **state) {
    (void)state;
    static const struct {
        const char *name;
        nopad_status status;
        const char *fragment;
    } cases[] = {
        {"bad_model_t5", NOPAD_ERR_UNSUPPORTED,
         "tokenizer.ggml.model is 't5', which is not supported (gpt2: byte-level BPE, llama: "
         "SentencePiece BPE)"},
        {"bad_gemma", NOPAD_ERR_UNSUPPORTED, "a llama tokenizer of architecture 'gemma'"},
        {"bad_no_tokenizer", NOPAD_ERR_FORMAT,
         "no tokenizer in the metadata (no key tokenizer.ggml.model)"},
        {"bad_types_length", NOPAD_ERR_FORMAT,
         "tokenizer.ggml.token_type has 3 entries, expected one per token (6)"},
        {"bad_types_type", NOPAD_ERR_FORMAT,
         "key 'tokenizer.ggml.token_type' is array of uint32, expected array of int32"},
        {"bad_bos_range", NOPAD_ERR_FORMAT,
         "tokenizer.ggml.bos_token_id is 6, but there are 6 tokens"},
        {"bad_merge", NOPAD_ERR_FORMAT,
         "tokenizer.ggml.merges[0] 'a  b' is not two tokens separated by one space"},
        {"bad_merge_unknown", NOPAD_ERR_FORMAT,
         "model.merges[0]: token \"c\" is not in model.vocab"},
        {"bad_no_scores", NOPAD_ERR_FORMAT,
         "no tokenizer.ggml.merges, and no tokenizer.ggml.scores to derive them from"},
        {"bad_nan_score", NOPAD_ERR_FORMAT, "tokenizer.ggml.scores[5] is NaN"},
        {"bad_utf8", NOPAD_ERR_FORMAT, "tokenizer.ggml.tokens[1] is not valid UTF-8"},
        {"bad_nul", NOPAD_ERR_FORMAT, "tokenizer.ggml.tokens[1] contains a NUL byte"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nopad_tokenizer *t = (nopad_tokenizer *)1;
        const char *path = gguf_path(cases[i].name, "gguf");
        nopad_status st = nopad_tokenizer_load(path, &t);
        if (st != cases[i].status || !strstr(nopad_last_error(), cases[i].fragment))
            fail_msg("%s: %s: \"%s\", expected %s and \"%s\"", cases[i].name,
                     nopad_status_string(st), nopad_last_error(),
                     nopad_status_string(cases[i].status), cases[i].fragment);
        if (!strstr(nopad_last_error(), path))
            fail_msg("%s: \"%s\" does not name the file", cases[i].name, nopad_last_error());
        assert_null(t);
    }
    /* a file that is not GGUF, and a folder still loads as before */
    nopad_tokenizer *t;
    assert_nopad_error(nopad_tokenizer_load(gguf_path("tiny_gpt2", "json"), &t), NOPAD_ERR_FORMAT,
                       "not a GGUF file");
    assert_nopad_error(nopad_tokenizer_load(test_make_temp_dir(0), &t), NOPAD_ERR_IO,
                       "no tokenizer.json or vocab.txt");
    /* a missing .gguf is a missing file, not a missing folder */
    assert_nopad_error(nopad_tokenizer_load("/nonexistent/tok.gguf", &t), NOPAD_ERR_IO,
                       "GGUF file '/nonexistent/tok.gguf' does not exist");
    assert_nopad_error(nopad_tokenizer_load("/nonexistent/tok", &t), NOPAD_ERR_IO,
                       "tokenizer folder does not exist");
}

/* ---- the real file -------------------------------------------------------------------------- */

typedef struct smol_ctx {
    nopad_tokenizer *tok;
    int32_t *ids;
} smol_ctx;

static void check_smollm2(const cJSON *row, const char *text, size_t len, void *ctx) {
    smol_ctx *c = ctx;
    char label[96];
    int line = cJSON_GetObjectItem(row, "line")->valueint;
    snprintf(label, sizeof label, "SmolLM2, line %d", line);
    expect(c->tok, label, text, len, 1, cJSON_GetObjectItem(row, "ids"), c->ids);
    snprintf(label, sizeof label, "SmolLM2 without special tokens, line %d", line);
    expect(c->tok, label, text, len, 0, cJSON_GetObjectItem(row, "nospecial"), c->ids);
    snprintf(label, sizeof label, "SmolLM2, line %d", line);
    const cJSON *ids = cJSON_GetObjectItem(row, "ids");
    expect_decode(c->tok, label, ids, 0, cJSON_GetObjectItem(row, "decode"), c->ids);
    expect_decode(c->tok, label, ids, 1, cJSON_GetObjectItem(row, "decode_skip"), c->ids);
}

static void test_smollm2(void **state) {
    (void)state;
    const char *path = getenv("NOPAD_SMOLLM2_GGUF");
    struct stat sb;
    if (!path || !*path || stat(path, &sb) != 0) {
        print_message("NOPAD_SMOLLM2_GGUF is unset or missing: run "
                      "scripts/fetch_default_decoder.sh (scripts/test.sh does); SmolLM2 skipped\n");
        skip();
    }
    smol_ctx c = {.ids = malloc(MAX_IDS * sizeof(int32_t))};
    assert_non_null(c.ids);
    assert_nopad_ok(nopad_tokenizer_load(path, &c.tok));
    assert_int_equal(nopad_tokenizer_vocab_size(c.tok), 49152);
    assert_int_equal(nopad_tokenizer_token_to_id(c.tok, "<|im_start|>"), 1);
    int n = for_each_case("tokenizer/smollm2_gguf_cases.jsonl", check_smollm2, &c);
    assert_true(n >= 386);
    print_message("SmolLM2: %d lines: ids and decodes equal to transformers'\n", n);
    nopad_tokenizer_free(c.tok);
    free(c.ids);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trees_equal_transformers),
        cmocka_unit_test(test_ids_equal_transformers),
        cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_smollm2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

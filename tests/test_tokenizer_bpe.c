/* Byte-level BPE tokenizer (GPT-2 / RoBERTa style): parity with Hugging Face tokenizers on the
 * corpus and extra lines (fixtures from scripts/make_bpe_fixtures.py), special tokens, truncation,
 * the options that are refused, and bad input. Needs no model download. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_internal.h"


static char *read_data(const char *rel, size_t *len) {
    char *data = test_read_file(test_data_path(rel), len);
    if (!data) fail_msg("cannot read %s (run scripts/make_bpe_fixtures.py)", test_data_path(rel));
    return data;
}

static nopad_tokenizer *load_json_file(const char *rel) {
    size_t len;
    char *data = read_data(rel, &len);
    nopad_tokenizer *tok = NULL;
    assert_nopad_ok(tokenizer_from_json(data, len, rel, &tok));
    free(data);
    return tok;
}

/* Tokenizes every case of bpe_cases.jsonl with `tok` and compares with the list `key`.
 * Returns the number of lines checked. */
static int check_cases(const nopad_tokenizer *tok, const char *key,
                       const nopad_tokenize_params *params) {
    enum { CAP = 8192 };
    test_corpus corpus = test_corpus_load();
    int32_t *ids = malloc(CAP * sizeof *ids);
    assert_non_null(ids);
    size_t size;
    char *data = read_data("tokenizer/bpe_cases.jsonl", &size);
    int n_lines = 0;
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n"), n_lines++) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        int idx = cJSON_GetObjectItem(j, "line")->valueint;
        char *own = NULL;
        const char *text;
        size_t len;
        if (idx >= 0) {
            assert_true(idx < corpus.n);
            text = corpus.text[idx];
            len = corpus.len[idx];
        } else {
            own = test_hex_decode(cJSON_GetObjectItem(j, "hex")->valuestring, &len);
            text = own;
        }
        const cJSON *want = cJSON_GetObjectItem(j, key);
        assert_true(cJSON_IsArray(want));
        int32_t n = -1;
        nopad_status st = nopad_tokenize(tok, text, len, params, ids, CAP, &n);
        if (st != NOPAD_OK)
            fail_msg("[%s] case %d (\"%.200s\"): %s: %s", key, n_lines + 1, text,
                     nopad_status_string(st), nopad_last_error());
        char label[512];
        snprintf(label, sizeof label, "[%s] case %d: \"%.200s\"", key, n_lines + 1, text);
        test_expect_ids(label, ids, n, want);
        free(own);
        cJSON_Delete(j);
    }
    free(data);
    free(ids);
    test_corpus_free(&corpus);
    return n_lines;
}

/* ---- parity with HF -------------------------------------------------------------------------- */

static void test_roberta_cases(void **state) {
    (void)state;
    nopad_tokenizer *tok = load_json_file("tokenizer/bpe_roberta.json");
    int n = check_cases(tok, "roberta", NULL);
    nopad_tokenize_params p = nopad_tokenize_default_params();
    p.add_special_tokens = 0;
    check_cases(tok, "nospecial", &p);
    assert_true(n > 200);
    print_message("bpe_roberta.json: ids identical to HF on %d lines (with and without special "
                  "tokens)\n",
                  n);
    nopad_tokenizer_free(tok);
}

static void test_gpt2_cases(void **state) {
    (void)state;
    nopad_tokenizer *tok = load_json_file("tokenizer/bpe_gpt2.json");
    int n = check_cases(tok, "gpt2", NULL);
    print_message("bpe_gpt2.json: ids identical to HF on %d lines\n", n);
    nopad_tokenizer_free(tok);
}

/* ---- behaviour ------------------------------------------------------------------------------- */

static void tokenize_ok(const nopad_tokenizer *tok, const char *text,
                        const nopad_tokenize_params *p, int32_t *ids, int32_t cap, int32_t *n) {
    assert_nopad_ok(nopad_tokenize(tok, text, strlen(text), p, ids, cap, n));
}

static void test_special_tokens(void **state) {
    (void)state;
    nopad_tokenizer *tok = load_json_file("tokenizer/bpe_roberta.json");
    assert_int_equal(nopad_tokenizer_token_to_id(tok, "<s>"), 0);
    assert_int_equal(nopad_tokenizer_token_to_id(tok, "</s>"), 2);
    assert_int_equal(nopad_tokenizer_token_to_id(tok, "<mask>"), 4);
    int32_t ids[64], n;
    tokenize_ok(tok, "", NULL, ids, 64, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 2);
    /* <mask> is matched before the model and swallows the space before it (lstrip) */
    tokenize_ok(tok, "a <mask>", NULL, ids, 64, &n);
    assert_true(n >= 4);
    assert_int_equal(ids[n - 2], 4);
    int32_t with_space = n;
    tokenize_ok(tok, "a<mask>", NULL, ids, 64, &n);
    assert_int_equal(n, with_space);
    /* truncation keeps <s> ... </s> and a prefix of the content */
    int32_t full[64], nf;
    tokenize_ok(tok, "The quick brown fox jumps over the lazy dog.", NULL, full, 64, &nf);
    nopad_tokenize_params p = nopad_tokenize_default_params();
    p.truncate = 1;
    p.max_length = 5;
    tokenize_ok(tok, "The quick brown fox jumps over the lazy dog.", &p, ids, 64, &n);
    assert_int_equal(n, 5);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[4], 2);
    for (int i = 1; i < 4; i++) assert_int_equal(ids[i], full[i]);
    /* a buffer too small reports the size needed */
    assert_nopad_error(nopad_tokenize(tok, "hello world", 11, NULL, ids, 1, &n),
                       NOPAD_ERR_BUFFER_TOO_SMALL, "capacity");
    int32_t need = n;
    tokenize_ok(tok, "hello world", NULL, ids, 64, &n);
    assert_int_equal(n, need);
    nopad_tokenizer_free(tok);
}

static void test_invalid_utf8(void **state) {
    (void)state;
    nopad_tokenizer *tok = load_json_file("tokenizer/bpe_gpt2.json");
    int32_t ids[16], n;
    assert_nopad_error(nopad_tokenize(tok, "ab\x80", 3, NULL, ids, 16, &n),
                       NOPAD_ERR_INVALID_ARGUMENT, "offset 2");
    assert_nopad_error(nopad_tokenize(tok, "\xed\xa0\x80", 3, NULL, ids, 16, &n),
                       NOPAD_ERR_INVALID_ARGUMENT, "offset 0");
    assert_nopad_error(nopad_tokenize(tok, "hi \xf4\x90\x80\x80", 7, NULL, ids, 16, &n),
                       NOPAD_ERR_INVALID_ARGUMENT, "offset 3");
    nopad_tokenizer_free(tok);
}

/* bpe_gpt2.json with `key` of `section` set to the JSON `value`, loaded. */
static nopad_status load_edited(const char *section, const char *key, const char *value,
                                nopad_tokenizer **tok) {
    size_t len;
    char *data = read_data("tokenizer/bpe_gpt2.json", &len);
    cJSON *root = cJSON_ParseWithLength(data, len);
    free(data);
    assert_non_null(root);
    cJSON *item = cJSON_Parse(value);
    assert_non_null(item);
    if (key) {
        cJSON *obj = cJSON_GetObjectItem(root, section);
        assert_non_null(obj);
        cJSON_DeleteItemFromObject(obj, key);
        cJSON_AddItemToObject(obj, key, item);
    } else {
        cJSON_DeleteItemFromObject(root, section);
        cJSON_AddItemToObject(root, section, item);
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    *tok = NULL;
    nopad_status st = tokenizer_from_json(text, strlen(text), "edited.json", tok);
    free(text);
    return st;
}

static void test_refused_options(void **state) {
    (void)state;
    nopad_tokenizer *tok = NULL;
    assert_nopad_error(load_edited("model", "dropout", "0.1", &tok), NOPAD_ERR_UNSUPPORTED,
                       "dropout");
    assert_null(tok);
    assert_nopad_error(load_edited("pre_tokenizer", NULL, "{\"type\": \"UnicodeScripts\"}", &tok),
                       NOPAD_ERR_UNSUPPORTED, "UnicodeScripts");
    assert_nopad_error(load_edited("model", "continuing_subword_prefix", "7", &tok),
                       NOPAD_ERR_FORMAT, "continuing_subword_prefix");
    assert_nopad_error(load_edited("model", "merges", "[\"nospace\"]", &tok), NOPAD_ERR_FORMAT,
                       "model.merges[0]");
    assert_nopad_error(load_edited("model", "merges", "[[\"a\"]]", &tok), NOPAD_ERR_FORMAT,
                       "model.merges[0]");
    assert_nopad_error(load_edited("model", "merges", "[\"a \\u00e9\\u00e9\"]", &tok),
                       NOPAD_ERR_FORMAT, "not in model.vocab");
    assert_nopad_error(load_edited("model", "merges", "{}", &tok), NOPAD_ERR_FORMAT,
                       "model.merges");
    assert_nopad_error(load_edited("model", "unk_token", "\"<nope>\"", &tok), NOPAD_ERR_FORMAT,
                       "unk_token");
    assert_nopad_error(load_edited("model", "fuse_unk", "1", &tok), NOPAD_ERR_FORMAT,
                       "model.fuse_unk");

}

/* Options HF supports that the fixtures do not train: checked on small hand-built cases. */
static void test_options(void **state) {
    (void)state;
    nopad_tokenizer *tok = NULL;
    int32_t ids[64], n, m;
    /* ignore_merges (LLaMA-3's option) and use_regex false: ids from HF on the same edits */
    static const char text[] = "Hello, world!  It's 2024.\n";
    static const int32_t want_regex[] = {39, 68, 75, 382, 11, 276, 273, 75, 67, 0, 220, 220,
                                         40, 83, 6,  82,  220, 17, 15, 17, 19, 13, 198};
    static const int32_t want_no_regex[] = {39, 68, 75, 382, 11, 276, 273, 75, 67, 0, 362,
                                            40, 83, 6,  82,  220, 17, 15, 17, 19, 13, 198};
    assert_nopad_ok(load_edited("model", "ignore_merges", "true", &tok));
    tokenize_ok(tok, text, NULL, ids, 64, &n);
    assert_int_equal(n, 23);
    assert_memory_equal(ids, want_regex, sizeof want_regex);
    nopad_tokenizer_free(tok);
    assert_nopad_ok(load_edited("pre_tokenizer", NULL,
                                "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                                "\"trim_offsets\": true, \"use_regex\": false}",
                                &tok));
    tokenize_ok(tok, text, NULL, ids, 64, &m);
    assert_int_equal(m, 22);
    assert_memory_equal(ids, want_no_regex, sizeof want_no_regex);
    nopad_tokenizer_free(tok);
    /* unknown bytes: dropped without unk_token, one unk each with it, one per run with fuse_unk
     * (HF gives [3, 3], [3, 0, 0, 3] and [3, 0, 3]) */
    const char *base = "{\"model\": {\"type\": \"BPE\", \"unk_token\": %s, \"fuse_unk\": %s, "
                       "\"vocab\": {\"<unk>\": 0, \"a\": 1, \"b\": 2, \"ab\": 3}, "
                       "\"merges\": [[\"a\", \"b\"]]}, \"pre_tokenizer\": {\"type\": "
                       "\"ByteLevel\", \"add_prefix_space\": false}}";
    const struct { const char *unk, *fuse; int n; int32_t want[4]; } cases[] = {
        {"null", "false", 2, {3, 3}}, {"\"<unk>\"", "false", 4, {3, 0, 0, 3}}, {"\"<unk>\"", "true", 3, {3, 0, 3}}};
    char json[512];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        snprintf(json, sizeof json, base, cases[c].unk, cases[c].fuse);
        assert_nopad_ok(tokenizer_from_json(json, strlen(json), "unk.json", &tok));
        tokenize_ok(tok, "abxyab", NULL, ids, 64, &n); /* "abxyab" is one word */
        assert_int_equal(n, cases[c].n);
        for (int i = 0; i < n; i++) assert_int_equal(ids[i], cases[c].want[i]);
        nopad_tokenizer_free(tok);
    }
}

/* A 1 MiB word: the heap keeps BPE O(n log n) (the quadratic scan took minutes), and truncation
 * gives a prefix of the full answer. */
static void test_long_word(void **state) {
    (void)state;
    nopad_tokenizer *tok = load_json_file("tokenizer/bpe_roberta.json");
    enum { N = 1 << 20 };
    static const char words[] = "thequickbrownfoxjumpsoverthelazydogpackedbatches";
    char *text = malloc(N);
    int32_t *ids = malloc((N + 2) * sizeof *ids);
    assert_true(text && ids);
    for (int i = 0; i < N; i++) text[i] = words[i % (sizeof words - 1)];
    int32_t n = -1;
    assert_nopad_ok(nopad_tokenize(tok, text, N, NULL, ids, N + 2, &n));
    assert_int_equal(n, 786435); /* HF tokenizers gives as many */
    nopad_tokenize_params p = nopad_tokenize_default_params();
    p.truncate = 1;
    p.max_length = 100;
    int32_t head[100], m = -1;
    assert_nopad_ok(nopad_tokenize(tok, text, N, &p, head, 100, &m));
    assert_int_equal(m, 100);
    assert_memory_equal(head, ids, 99 * sizeof *ids);
    free(text);
    free(ids);
    nopad_tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roberta_cases),  cmocka_unit_test(test_gpt2_cases),
        cmocka_unit_test(test_special_tokens), cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_refused_options), cmocka_unit_test(test_options),
        cmocka_unit_test(test_long_word),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

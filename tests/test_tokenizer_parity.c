/* Every tokenizer family against Hugging Face tokenizers: the 15 tokenizer.json files of
 * tests/data/tokenizer/parity/ (WordPiece; byte-level BPE as GPT-2, RoBERTa, LLaMA-3, Qwen2,
 * SmolLM2; SentencePiece BPE with byte fallback; Unigram as XLM-R, ALBERT, DeBERTa-v3, with byte
 * fallback) on all corpus lines, with and without special tokens (fixtures and versions:
 * scripts/make_tokenizer_parity.py, tests/data/README.md). Truncation is checked against the
 * same answers: HF's template around a prefix of its content. A corrupted Precompiled charsmap
 * must give an error or a tokenizer that still tokenizes, never a crash. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_internal.h"

static char *read_data(const char *rel, size_t *len) {
    char *data = test_read_file(test_data_path(rel), len);
    if (!data) fail_msg("cannot read %s (run scripts/make_tokenizer_parity.py)", test_data_path(rel));
    return data;
}

static nopad_tokenizer *load_parity(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizer/parity/%s.json", name);
    size_t len;
    char *data = read_data(rel, &len);
    nopad_tokenizer *tok = NULL;
    nopad_status st = tokenizer_from_json(data, len, rel, &tok);
    free(data);
    if (st != NOPAD_OK) fail_msg("%s: %s", rel, nopad_last_error());
    return tok;
}

static int32_t *ids_of(const cJSON *list, int32_t *n) {
    *n = cJSON_GetArraySize(list);
    int32_t *ids = malloc(((size_t)*n + 1) * sizeof *ids);
    assert_non_null(ids);
    for (int32_t i = 0; i < *n; i++) ids[i] = (int32_t)cJSON_GetArrayItem(list, i)->valuedouble;
    return ids;
}

static void expect_same(const char *tok, int line, const char *what, const int32_t *want,
                        int32_t n_want, const int32_t *got, int32_t n_got) {
    int32_t k = 0;
    while (k < n_want && k < n_got && want[k] == got[k]) k++;
    if (k == n_want && k == n_got) return;
    fail_msg("%s line %d (%s): %d ids, HF %d; first difference at %d: %d, HF %d", tok, line, what,
             n_got, n_want, k, k < n_got ? got[k] : -1, k < n_want ? want[k] : -1);
}

static void test_every_family_on_the_corpus(void **state) {
    enum { CAP = 1 << 16 };
    test_corpus c = test_corpus_load();
    int32_t *ids = malloc(CAP * sizeof *ids), *want_trunc = malloc(CAP * sizeof *want_trunc);
    assert_true(ids && want_trunc);
    size_t size;
    char *data = read_data("tokenizer/parity_cases.jsonl", &size);
    char current[128] = "";
    nopad_tokenizer *tok = NULL;
    int n_cases = 0, n_tokenizers = 0, n_ids = 0;
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        const char *name = cJSON_GetObjectItem(j, "tok")->valuestring;
        int idx = cJSON_GetObjectItem(j, "line")->valueint;
        assert_true(idx >= 0 && idx < c.n);
        if (strcmp(name, current) != 0) {
            nopad_tokenizer_free(tok);
            tok = load_parity(name);
            snprintf(current, sizeof current, "%s", name);
            n_tokenizers++;
        }
        int32_t n_want, n_plain, n;
        int32_t *want = ids_of(cJSON_GetObjectItem(j, "ids"), &n_want);
        int32_t *plain = ids_of(cJSON_GetObjectItem(j, "ids_nospecial"), &n_plain);

        nopad_tokenize_params p = nopad_tokenize_default_params();
        assert_nopad_ok(nopad_tokenize(tok, c.text[idx], c.len[idx], &p, ids, CAP, &n));
        expect_same(name, idx, "special tokens", want, n_want, ids, n);
        p.add_special_tokens = 0;
        assert_nopad_ok(nopad_tokenize(tok, c.text[idx], c.len[idx], &p, ids, CAP, &n));
        expect_same(name, idx, "no special tokens", plain, n_plain, ids, n);

        /* truncated to a few ids: the template around the first content ids */
        int32_t n_special = n_want - n_plain, max = n_special + 5;
        if (n_want > max) {
            assert_int_equal(n_special, tok->n_prefix + tok->n_suffix);
            int32_t head = tok->n_prefix; /* the template's prefix, content, its suffix */
            memcpy(want_trunc, want, (size_t)head * sizeof *want);
            memcpy(want_trunc + head, plain, 5 * sizeof *plain);
            memcpy(want_trunc + head + 5, want + n_want - (n_special - head),
                   (size_t)(n_special - head) * sizeof *want);
            p = nopad_tokenize_default_params();
            p.truncate = 1;
            p.max_length = max;
            assert_nopad_ok(nopad_tokenize(tok, c.text[idx], c.len[idx], &p, ids, CAP, &n));
            expect_same(name, idx, "truncated", want_trunc, max, ids, n);
        }
        n_ids += n_want;
        n_cases++;
        free(want);
        free(plain);
        cJSON_Delete(j);
    }
    printf("  %d tokenizers, %d (tokenizer, line) cases, %d ids: all equal to HF\n", n_tokenizers,
           n_cases, n_ids);
    assert_true(n_tokenizers >= 15 && n_cases >= 15 * 300);
    nopad_tokenizer_free(tok);
    free(data);
    free(ids);
    free(want_trunc);
    test_corpus_free(&c);
}

/* The kinds the parity files cover, by the public kind query. */
static void test_kinds(void **state) {
    static const struct {
        const char *file, *kind;
    } cases[] = {
        {"wordpiece_bert", "wordpiece"},      {"bpe_gpt2", "bpe-byte-level"},
        {"bpe_llama3", "bpe-byte-level"},     {"bpe_smollm", "bpe-byte-level"},
        {"spbpe_llama2", "bpe-sentencepiece"}, {"spbpe_llama2_metaspace_v5", "bpe-sentencepiece"},
        {"unigram_xlmr", "unigram"},          {"unigram_bytefallback_v5", "unigram"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nopad_tokenizer *tok = load_parity(cases[i].file);
        const char *kind = nopad_tokenizer_kind_name(nopad_tokenizer_get_kind(tok));
        if (strcmp(kind, cases[i].kind) != 0)
            fail_msg("%s: kind %s, expected %s", cases[i].file, kind, cases[i].kind);
        nopad_tokenizer_free(tok);
    }
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Flips bytes of the real charsmap (trie units and pool) and re-encodes it: every variant must
 * load cleanly or fail with a message, and a loaded one must tokenize the corpus. Under the
 * sanitizer build this is where an unchecked trie index would show. */
static void test_corrupt_charsmap(void **state) {
    size_t len;
    char *data = read_data("tokenizer/parity/unigram_xlmr.json", &len);
    cJSON *root = cJSON_ParseWithLength(data, len);
    free(data);
    assert_non_null(root);
    cJSON *norm = cJSON_GetObjectItem(root, "normalizer");
    cJSON *pre = cJSON_GetArrayItem(cJSON_GetObjectItem(norm, "normalizers"), 0);
    cJSON *map = cJSON_GetObjectItem(pre, "precompiled_charsmap");
    assert_true(cJSON_IsString(map));
    const char *b64 = map->valuestring;
    size_t n64 = strlen(b64);
    test_corpus c = test_corpus_load();
    int32_t *ids = malloc((1 << 16) * sizeof *ids);
    assert_non_null(ids);
    /* the trie's byte size is the first little-endian u32: mutate base64 digits inside the trie */
    uint32_t v[8];
    for (int k = 0; k < 8; k++) v[k] = (uint32_t)(strchr(B64, b64[k]) - B64);
    uint32_t b0 = (v[0] << 2) | (v[1] >> 4), b1 = ((v[1] & 15) << 4) | (v[2] >> 2),
             b2 = ((v[2] & 3) << 6) | v[3], b3 = (v[4] << 2) | (v[5] >> 4);
    size_t trie_bytes = b0 | (b1 << 8) | (b2 << 16) | ((size_t)b3 << 24);
    size_t trie_end = (4 + trie_bytes) * 4 / 3;
    assert_true(trie_end > 16 && trie_end < n64);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    int loaded = 0, refused = 0;
    for (int trial = 0; trial < 40; trial++) {
        char *mut = strdup(b64);
        assert_non_null(mut);
        for (int k = 0; k < 64; k++) { /* 64 digits of the trie units */
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = 8 + (size_t)((rng >> 33) % (trie_end - 8));
            if (mut[at] != '=') mut[at] = B64[(rng >> 20) % 64];
        }
        cJSON_SetValuestring(map, mut);
        free(mut);
        char *text = cJSON_PrintUnformatted(root);
        nopad_tokenizer *tok = NULL;
        nopad_status st = tokenizer_from_json(text, strlen(text), "mutated", &tok);
        free(text);
        if (st != NOPAD_OK) {
            assert_null(tok);
            assert_true(strlen(nopad_last_error()) > 0);
            refused++;
            continue;
        }
        loaded++;
        for (int i = 0; i < c.n; i += 7) {
            int32_t n;
            st = nopad_tokenize(tok, c.text[i], c.len[i], NULL, ids, 1 << 16, &n);
            assert_true(st == NOPAD_OK || st == NOPAD_ERR_INVALID_ARGUMENT);
        }
        nopad_tokenizer_free(tok);
    }
    printf("  40 corrupted charsmaps: %d loaded and tokenized the corpus, %d refused\n", loaded,
           refused);
    free(ids);
    test_corpus_free(&c);
    cJSON_Delete(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_family_on_the_corpus),
        cmocka_unit_test(test_kinds),
        cmocka_unit_test(test_corrupt_charsmap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* WordPiece tokenizer: parity with Hugging Face tokenizers on a committed corpus (fixtures from
 * scripts/make_tokenizer_fixtures.py), plus the vocab.txt fallback, truncation, buffer sizes and
 * bad input. The corpus tests need all-MiniLM-L6-v2 (NOPAD_MINILM_DIR); the rest do not. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_internal.h"

/* ---- fixtures ------------------------------------------------------------------------------- */

typedef struct fixture_line {
    char *text; /* the bytes of `hex` (may hold NUL) */
    size_t len;
    cJSON *json; /* the whole record, for the expected id lists */
} fixture_line;

typedef struct fixture {
    fixture_line *lines;
    int n;
} fixture;


static fixture load_fixture(const char *rel) {
    fixture f = {0};
    size_t size;
    char *data = test_read_file(test_data_path(rel), &size);
    if (!data)
        fail_msg("cannot read %s (run scripts/make_tokenizer_fixtures.py)", test_data_path(rel));
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        if (!j) fail_msg("%s line %d is not JSON", rel, f.n + 1);
        f.lines = realloc(f.lines, (size_t)(f.n + 1) * sizeof *f.lines);
        assert_non_null(f.lines);
        fixture_line *l = &f.lines[f.n++];
        l->json = j;
        l->text = test_hex_decode(cJSON_GetObjectItem(j, "hex")->valuestring, &l->len);
    }
    free(data);
    return f;
}

static void free_fixture(fixture *f) {
    for (int i = 0; i < f->n; i++) {
        cJSON_Delete(f->lines[i].json);
        free(f->lines[i].text);
    }
    free(f->lines);
}

/* Tokenizes every line and compares with the list `key`; fails on the first mismatch, printing
 * the line, its text and both id lists. Returns the number of lines checked. */
static int check_fixture(const nopad_tokenizer *tok, const fixture *f, const char *key,
                         const nopad_tokenize_params *params) {
    enum { CAP = 8192 };
    int32_t *ids = malloc(CAP * sizeof *ids);
    assert_non_null(ids);
    for (int i = 0; i < f->n; i++) {
        const fixture_line *l = &f->lines[i];
        const cJSON *want = cJSON_GetObjectItem(l->json, key);
        if (!cJSON_IsArray(want)) fail_msg("fixture line %d has no \"%s\"", i + 1, key);
        int32_t n = -1;
        nopad_status st = nopad_tokenize(tok, l->text, l->len, params, ids, CAP, &n);
        if (st != NOPAD_OK)
            fail_msg("[%s] line %d (%s): %s: %s", key, i + 1,
                     cJSON_GetObjectItem(l->json, "text")->valuestring, nopad_status_string(st),
                     nopad_last_error());
        char label[512];
        snprintf(label, sizeof label, "[%s] line %d: \"%.300s\"", key, i + 1,
                 cJSON_GetObjectItem(l->json, "text")->valuestring);
        test_expect_ids(label, ids, n, want);
    }
    free(ids);
    return f->n;
}

static const char *need_minilm(void) {
    const char *dir = test_minilm_dir();
    if (!dir)
        fail_msg("NOPAD_MINILM_DIR is not set or has no config.json: run "
                 "scripts/fetch_default_model.sh and export NOPAD_MINILM_DIR");
    return dir;
}

/* MiniLM's tokenizer.json with `edit` applied (the variants the fixture script builds). */
static nopad_tokenizer *load_minilm_edited(void (*edit)(cJSON *root)) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", need_minilm());
    size_t len;
    char *data = test_read_file(path, &len);
    assert_non_null(data);
    cJSON *root = cJSON_ParseWithLength(data, len);
    assert_non_null(root);
    free(data);
    edit(root);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    nopad_tokenizer *tok = NULL;
    assert_nopad_ok(tokenizer_from_json(text, strlen(text), "edited tokenizer.json", &tok));
    free(text);
    return tok;
}

static void edit_cased(cJSON *root) {
    cJSON *norm = cJSON_GetObjectItem(root, "normalizer");
    cJSON_ReplaceItemInObject(norm, "lowercase", cJSON_CreateFalse());
    cJSON_ReplaceItemInObject(norm, "strip_accents", cJSON_CreateFalse());
}

static void edit_whitespace(cJSON *root) {
    cJSON *pre = cJSON_CreateObject();
    cJSON_AddStringToObject(pre, "type", "Whitespace");
    cJSON_ReplaceItemInObject(root, "pre_tokenizer", pre);
}

static void edit_lower_only(cJSON *root) {
    cJSON *norm = cJSON_GetObjectItem(root, "normalizer");
    cJSON_ReplaceItemInObject(norm, "strip_accents", cJSON_CreateFalse());
}

static void edit_no_normalizer(cJSON *root) {
    cJSON_ReplaceItemInObject(root, "normalizer", cJSON_CreateNull());
}

/* ---- parity with HF on the corpus ----------------------------------------------------------- */

static void test_corpus_uncased(void **state) {
    (void)state;
    nopad_tokenizer *tok = NULL;
    assert_nopad_ok(nopad_tokenizer_load(need_minilm(), &tok));
    assert_int_equal(nopad_tokenizer_vocab_size(tok), 30522);
    assert_int_equal(nopad_tokenizer_token_to_id(tok, "[CLS]"), 101);
    assert_int_equal(nopad_tokenizer_token_to_id(tok, "##ing"), 2075);
    assert_int_equal(nopad_tokenizer_token_to_id(tok, "no-such-token"), -1);
    fixture f = load_fixture("tokenizer/corpus.jsonl");
    assert_true(f.n >= 150);
    nopad_tokenize_params p = nopad_tokenize_default_params();
    int n = check_fixture(tok, &f, "uncased", &p);
    p.add_special_tokens = 0;
    check_fixture(tok, &f, "nospecial", &p);
    p = nopad_tokenize_default_params();
    p.truncate = 1;
    p.max_length = 16;
    check_fixture(tok, &f, "trunc16", &p);
    print_message("uncased parity: %d lines match HF tokenizers (also without specials and "
                  "truncated to 16)\n", n);
    free_fixture(&f);
    nopad_tokenizer_free(tok);
}

static void test_corpus_cased(void **state) {
    (void)state;
    nopad_tokenizer *tok = load_minilm_edited(edit_cased);
    fixture f = load_fixture("tokenizer/corpus.jsonl");
    nopad_tokenize_params p = nopad_tokenize_default_params();
    int n = check_fixture(tok, &f, "cased", &p);
    print_message("cased parity: %d lines match\n", n);
    free_fixture(&f);
    nopad_tokenizer_free(tok);
}

static void test_corpus_whitespace_pre_tokenizer(void **state) {
    (void)state;
    nopad_tokenizer *tok = load_minilm_edited(edit_whitespace);
    fixture f = load_fixture("tokenizer/corpus.jsonl");
    nopad_tokenize_params p = nopad_tokenize_default_params();
    int n = check_fixture(tok, &f, "ws", &p);
    print_message("Whitespace pre-tokenizer parity: %d lines match\n", n);
    free_fixture(&f);
    nopad_tokenizer_free(tok);
}

/* lowercase without accent stripping (İ becomes i + U+0307) and no normalizer at all */
static void test_corpus_lowercase_only_and_raw(void **state) {
    (void)state;
    fixture f = load_fixture("tokenizer/corpus.jsonl");
    nopad_tokenize_params p = nopad_tokenize_default_params();
    nopad_tokenizer *tok = load_minilm_edited(edit_lower_only);
    check_fixture(tok, &f, "lower", &p);
    nopad_tokenizer_free(tok);
    tok = load_minilm_edited(edit_no_normalizer);
    check_fixture(tok, &f, "raw", &p);
    nopad_tokenizer_free(tok);
    free_fixture(&f);
}

/* BERT's vocab.txt with do_lower_case must tokenize exactly like its tokenizer.json. */
static void test_corpus_vocab_txt(void **state) {
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/vocab.txt", need_minilm());
    size_t len;
    char *data = test_read_file(path, &len);
    assert_non_null(data);
    nopad_tokenizer *tok = NULL;
    assert_nopad_ok(tokenizer_from_vocab_txt(data, len, 1, path, &tok));
    free(data);
    assert_int_equal(nopad_tokenizer_vocab_size(tok), 30522);
    fixture f = load_fixture("tokenizer/corpus.jsonl");
    nopad_tokenize_params p = nopad_tokenize_default_params();
    check_fixture(tok, &f, "uncased", &p);
    free_fixture(&f);
    nopad_tokenizer_free(tok);
}

/* Many threads on one tokenizer get the single-threaded answers. */
typedef struct thread_job {
    const nopad_tokenizer *tok;
    const fixture *f;
    int failures;
} thread_job;

static void *thread_main(void *arg) {
    thread_job *job = arg;
    int32_t ids[4096];
    for (int rep = 0; rep < 5; rep++) {
        for (int i = 0; i < job->f->n; i++) {
            const fixture_line *l = &job->f->lines[i];
            const cJSON *want = cJSON_GetObjectItem(l->json, "uncased");
            int32_t n = 0;
            if (nopad_tokenize(job->tok, l->text, l->len, NULL, ids, 4096, &n) != NOPAD_OK ||
                n != cJSON_GetArraySize(want)) {
                job->failures++;
                continue;
            }
            for (int k = 0; k < n; k++)
                if (ids[k] != cJSON_GetArrayItem(want, k)->valueint) {
                    job->failures++;
                    break;
                }
        }
    }
    return NULL;
}

static void test_concurrent_tokenize(void **state) {
    (void)state;
    nopad_tokenizer *tok = NULL;
    assert_nopad_ok(nopad_tokenizer_load(need_minilm(), &tok));
    fixture f = load_fixture("tokenizer/corpus.jsonl");
    enum { N_THREADS = 8 };
    pthread_t threads[N_THREADS];
    thread_job jobs[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        jobs[i] = (thread_job){tok, &f, 0};
        assert_int_equal(pthread_create(&threads[i], NULL, thread_main, &jobs[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(threads[i], NULL);
        assert_int_equal(jobs[i].failures, 0);
    }
    free_fixture(&f);
    nopad_tokenizer_free(tok);
}

/* ---- a small hand-written tokenizer (tests/data/tokenizer/small_tokenizer.json) ------------- */

static nopad_tokenizer *load_small(void) {
    size_t len;
    char *data = test_read_file(test_data_path("tokenizer/small_tokenizer.json"), &len);
    assert_non_null(data);
    nopad_tokenizer *tok = NULL;
    assert_nopad_ok(tokenizer_from_json(data, len, "small_tokenizer.json", &tok));
    free(data);
    return tok;
}

/* Added tokens with lstrip / rstrip / single_word / normalized, against HF. */
static void test_small_added_token_flags(void **state) {
    (void)state;
    nopad_tokenizer *tok = load_small();
    assert_int_equal(nopad_tokenizer_vocab_size(tok), 42);
    assert_int_equal(nopad_tokenizer_token_to_id(tok, "<ent>"), 39);
    assert_int_equal(nopad_tokenizer_token_to_id(tok, "New York"), 40);
    fixture f = load_fixture("tokenizer/small_cases.jsonl");
    nopad_tokenize_params p = nopad_tokenize_default_params();
    check_fixture(tok, &f, "ids", &p);
    p.add_special_tokens = 0;
    check_fixture(tok, &f, "nospecial", &p);
    free_fixture(&f);
    nopad_tokenizer_free(tok);
}

/* Replace normalizers and Split pre-tokenizers whose pattern can match the empty string (""
 * as a String or a Regex, "a*"), against HF (tests/data/tokenizer/patterns/, by
 * scripts/make_tokenizer_pattern_fixtures.py): "" matches at every character boundary, never in
 * an empty input, and an empty match right after a match is skipped. */
static void test_empty_patterns(void **state) {
    (void)state;
    fixture f = load_fixture("tokenizer/patterns/cases.jsonl");
    nopad_tokenize_params p = nopad_tokenize_default_params();
    p.add_special_tokens = 0;
    nopad_tokenizer *tok = NULL;
    char loaded[64] = "";
    int32_t ids[512];
    for (int i = 0; i < f.n; i++) {
        const char *name = cJSON_GetObjectItem(f.lines[i].json, "tok")->valuestring;
        if (strcmp(name, loaded) != 0) {
            nopad_tokenizer_free(tok);
            char rel[128];
            snprintf(rel, sizeof rel, "tokenizer/patterns/%s.json", name);
            size_t len;
            char *data = test_read_file(test_data_path(rel), &len);
            if (!data) fail_msg("cannot read %s", test_data_path(rel));
            assert_nopad_ok(tokenizer_from_json(data, len, rel, &tok));
            free(data);
            snprintf(loaded, sizeof loaded, "%s", name);
        }
        int32_t n = 0;
        assert_nopad_ok(nopad_tokenize(tok, f.lines[i].text, f.lines[i].len, &p, ids, 512, &n));
        char label[160];
        snprintf(label, sizeof label, "%s: \"%.*s\"", name, (int)f.lines[i].len, f.lines[i].text);
        test_expect_ids(label, ids, n, cJSON_GetObjectItem(f.lines[i].json, "ids"));
    }
    assert_int_equal(f.n, 143);
    nopad_tokenizer_free(tok);
    free_fixture(&f);
}

static nopad_status tokenize_str(const nopad_tokenizer *tok, const char *text,
                                 const nopad_tokenize_params *p, int32_t *ids, int32_t cap,
                                 int32_t *n) {
    return nopad_tokenize(tok, text, strlen(text), p, ids, cap, n);
}

static void assert_ids(const int32_t *got, int32_t n, const int32_t *want, int32_t n_want) {
    assert_int_equal(n, n_want);
    for (int32_t i = 0; i < n; i++)
        if (got[i] != want[i]) fail_msg("id %d: got %d, want %d", (int)i, got[i], want[i]);
}

static void test_empty_and_specials(void **state) {
    (void)state;
    nopad_tokenizer *tok = load_small();
    int32_t ids[16], n = -1;
    assert_nopad_ok(nopad_tokenize(tok, NULL, 0, NULL, ids, 16, &n));
    assert_ids(ids, n, (int32_t[]){2, 3}, 2);
    assert_nopad_ok(tokenize_str(tok, " \t\n ", NULL, ids, 16, &n));
    assert_ids(ids, n, (int32_t[]){2, 3}, 2);
    nopad_tokenize_params p = nopad_tokenize_default_params();
    p.add_special_tokens = 0;
    assert_nopad_ok(tokenize_str(tok, "", &p, ids, 16, &n));
    assert_int_equal(n, 0);
    assert_nopad_ok(tokenize_str(tok, "hello world", &p, ids, 16, &n));
    assert_ids(ids, n, (int32_t[]){5, 6}, 2);
    /* [CLS] written in the text is the special token; [cls] is not */
    assert_nopad_ok(tokenize_str(tok, "[CLS]hello", &p, ids, 16, &n));
    assert_ids(ids, n, (int32_t[]){2, 5}, 2);
    nopad_tokenizer_free(tok);
}

/* A word longer than max_input_chars_per_word (8 here) characters, not bytes, is [UNK]. */
static void test_max_chars_per_word(void **state) {
    (void)state;
    nopad_tokenizer *tok = load_small();
    nopad_tokenize_params p = nopad_tokenize_default_params();
    p.add_special_tokens = 0;
    int32_t ids[16], n;
    assert_nopad_ok(tokenize_str(tok, "aaaaaaaa", &p, ids, 16, &n)); /* 8: a ##a x7 */
    assert_int_equal(n, 8);
    assert_nopad_ok(tokenize_str(tok, "aaaaaaaaa", &p, ids, 16, &n)); /* 9: [UNK] */
    assert_ids(ids, n, (int32_t[]){1}, 1);
    /* 5 x "é" is 10 bytes but 5 characters (after accent stripping: e ##e ##e ##e ##e) */
    assert_nopad_ok(tokenize_str(tok, "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", &p, ids, 16, &n));
    assert_ids(ids, n, (int32_t[]){29, 30, 30, 30, 30}, 5);
    /* a word with no full match is one [UNK], not a partial match plus [UNK] */
    assert_nopad_ok(tokenize_str(tok, "unaffablex affaq", &p, ids, 16, &n));
    assert_ids(ids, n, (int32_t[]){1, 1}, 2);
    nopad_tokenizer_free(tok);
}

static void test_truncation(void **state) {
    (void)state;
    nopad_tokenizer *tok = load_small();
    const char *text = "hello world hello world hello"; /* 5 content ids */
    int32_t ids[16], n = -1;
    nopad_tokenize_params p = nopad_tokenize_default_params();
    p.max_length = 7;
    assert_nopad_ok(tokenize_str(tok, text, &p, ids, 16, &n)); /* exactly the limit */
    assert_ids(ids, n, (int32_t[]){2, 5, 6, 5, 6, 5, 3}, 7);
    p.max_length = 5;
    assert_nopad_error(tokenize_str(tok, text, &p, ids, 16, &n), NOPAD_ERR_TOO_LONG, "7 ids");
    assert_true(strstr(nopad_last_error(), "max_length 5") != NULL);
    p.truncate = 1; /* the template survives, the content is cut */
    assert_nopad_ok(tokenize_str(tok, text, &p, ids, 16, &n));
    assert_ids(ids, n, (int32_t[]){2, 5, 6, 5, 3}, 5);
    p.max_length = 2;
    assert_nopad_ok(tokenize_str(tok, text, &p, ids, 16, &n));
    assert_ids(ids, n, (int32_t[]){2, 3}, 2);
    p.max_length = 1;
    assert_nopad_error(tokenize_str(tok, text, &p, ids, 16, &n), NOPAD_ERR_INVALID_ARGUMENT,
                       "max_length 1");
    p.add_special_tokens = 0;
    assert_nopad_ok(tokenize_str(tok, text, &p, ids, 16, &n));
    assert_ids(ids, n, (int32_t[]){5}, 1);
    /* a cut in the middle of a word keeps that word's first pieces; added tokens count too */
    p.add_special_tokens = 1;
    p.max_length = 4;
    assert_nopad_ok(tokenize_str(tok, "aaaa [MASK]", &p, ids, 16, &n));
    assert_ids(ids, n, (int32_t[]){2, 12, 11, 3}, 4);
    p.max_length = 0; /* no limit */
    p.truncate = 1;
    assert_nopad_ok(tokenize_str(tok, text, &p, ids, 16, &n));
    assert_int_equal(n, 7);
    nopad_tokenizer_free(tok);
}

static void test_buffer_too_small(void **state) {
    (void)state;
    nopad_tokenizer *tok = load_small();
    int32_t ids[16], n = -1;
    assert_nopad_error(tokenize_str(tok, "hello world", NULL, ids, 3, &n),
                       NOPAD_ERR_BUFFER_TOO_SMALL, "capacity 3");
    assert_int_equal(n, 4);
    n = -1;
    assert_nopad_error(tokenize_str(tok, "hello world", NULL, NULL, 0, &n),
                       NOPAD_ERR_BUFFER_TOO_SMALL, "4 ids");
    assert_int_equal(n, 4);
    assert_nopad_ok(tokenize_str(tok, "hello world", NULL, ids, 4, &n));
    assert_ids(ids, n, (int32_t[]){2, 5, 6, 3}, 4);
    nopad_tokenizer_free(tok);
}

static void test_bad_arguments(void **state) {
    (void)state;
    nopad_tokenizer *tok = load_small();
    int32_t ids[4], n;
    assert_nopad_error(nopad_tokenize(NULL, "a", 1, NULL, ids, 4, &n), NOPAD_ERR_INVALID_ARGUMENT,
                       "nopad_tokenize");
    assert_nopad_error(nopad_tokenize(tok, NULL, 3, NULL, ids, 4, &n), NOPAD_ERR_INVALID_ARGUMENT,
                       "text");
    assert_nopad_error(nopad_tokenize(tok, "a", 1, NULL, ids, 4, NULL), NOPAD_ERR_INVALID_ARGUMENT,
                       "n_ids");
    assert_nopad_error(nopad_tokenize(tok, "a", 1, NULL, ids, -1, &n), NOPAD_ERR_INVALID_ARGUMENT,
                       "capacity");
    nopad_tokenizer *other = NULL;
    assert_nopad_error(nopad_tokenizer_load(NULL, &other), NOPAD_ERR_INVALID_ARGUMENT, "folder");
    assert_int_equal(nopad_tokenizer_vocab_size(NULL), 0);
    assert_int_equal(nopad_tokenizer_token_to_id(NULL, "[CLS]"), -1);
    nopad_tokenizer_free(NULL);
    nopad_tokenizer_free(tok);
}

static void test_invalid_utf8(void **state) {
    (void)state;
    nopad_tokenizer *tok = load_small();
    static const struct {
        const char *bytes;
        size_t len;
        const char *offset;
    } cases[] = {
        {"ab\x80", 3, "offset 2"},                 /* stray continuation byte */
        {"a\xc0\xaf", 3, "offset 1"},              /* overlong '/' */
        {"\xc1\xbf", 2, "offset 0"},               /* overlong */
        {"xy\xe0\x80\xaf", 5, "offset 2"},         /* overlong 3-byte */
        {"\xf0\x80\x80\xaf", 4, "offset 0"},       /* overlong 4-byte */
        {"abc\xed\xa0\x80", 6, "offset 3"},        /* lone high surrogate U+D800 */
        {"\xed\xbf\xbf", 3, "offset 0"},           /* lone low surrogate U+DFFF */
        {"\xf4\x90\x80\x80", 4, "offset 0"},       /* above U+10FFFF */
        {"\xf5\x80\x80\x80", 4, "offset 0"},       /* F5 never appears */
        {"\xff", 1, "offset 0"},
        {"hello \xe4\xbd", 8, "offset 6"},         /* truncated at the end */
        {"\xe4\xbd" "a", 3, "offset 0"},           /* truncated before ASCII */
        {"ok \xc3\xa9 \xc3", 7, "offset 6"},
    };
    int32_t ids[32], n;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_nopad_error(nopad_tokenize(tok, cases[i].bytes, cases[i].len, NULL, ids, 32, &n),
                           NOPAD_ERR_INVALID_ARGUMENT, cases[i].offset);
    /* the boundaries of the valid ranges are accepted */
    const char ok[] = "\x7f\xc2\x80\xdf\xbf\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80\xf0\x90\x80\x80"
                      "\xf4\x8f\xbf\xbf";
    assert_nopad_ok(nopad_tokenize(tok, ok, sizeof ok - 1, NULL, ids, 32, &n));
    /* NUL is valid UTF-8: clean_text drops it */
    assert_nopad_ok(nopad_tokenize(tok, "hel\0lo", 6, NULL, ids, 32, &n));
    assert_ids(ids, n, (int32_t[]){2, 5, 3}, 3);
    nopad_tokenizer_free(tok);
}

/* Long texts are normalized in chunks; the ids must not depend on where the chunks fall. */
static void check_repeated(const nopad_tokenizer *tok, const char *unit, const int32_t *unit_ids,
                           int n_unit, int reps) {
    size_t unit_len = strlen(unit);
    char *text = malloc(unit_len * (size_t)reps);
    assert_non_null(text);
    for (int i = 0; i < reps; i++) memcpy(text + (size_t)i * unit_len, unit, unit_len);
    int32_t cap = n_unit * reps + 2;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    assert_non_null(ids);
    int32_t n;
    assert_nopad_ok(nopad_tokenize(tok, text, unit_len * (size_t)reps, NULL, ids, cap, &n));
    assert_int_equal(n, cap);
    for (int i = 0; i < reps; i++)
        for (int k = 0; k < n_unit; k++)
            if (ids[1 + i * n_unit + k] != unit_ids[k])
                fail_msg("rep %d id %d: got %d want %d", i, k, ids[1 + i * n_unit + k],
                         unit_ids[k]);
    /* truncation of a long text gives the prefix of the full answer */
    nopad_tokenize_params p = nopad_tokenize_default_params();
    p.truncate = 1;
    p.max_length = 512;
    int32_t cut[512];
    assert_nopad_ok(nopad_tokenize(tok, text, unit_len * (size_t)reps, &p, cut, 512, &n));
    assert_int_equal(n, 512);
    for (int i = 0; i < 511; i++) assert_int_equal(cut[i], ids[i]);
    assert_int_equal(cut[511], 3);
    free(ids);
    free(text);
}

static void test_long_text_chunks(void **state) {
    (void)state;
    nopad_tokenizer *tok = load_small();
    /* one piece of about 130 KB (no added tokens), cut into chunks at whitespace */
    const int32_t plain_ids[] = {5, 6, 21, 7, 8, 12, 11, 11, 11, 28, 14, 1, 15, 29, 30};
    check_repeated(tok, "hello world, unaff  aaaa\tCaf\xc3\xa9 x\xe4\xb8\x80y e\xcc\x81\xc3\xa9\n",
                   plain_ids, (int)(sizeof plain_ids / sizeof plain_ids[0]), 3000);
    /* many short pieces between added tokens */
    const int32_t added_ids[] = {5, 6, 21, 4, 14, 41, 15};
    check_repeated(tok, "hello world, [MASK] x<rs> y\n", added_ids,
                   (int)(sizeof added_ids / sizeof added_ids[0]), 3000);
    /* one enormous word without whitespace (no chunk boundary): [UNK] */
    size_t len = 200000;
    char *text = malloc(len);
    assert_non_null(text);
    memset(text, 'a', len);
    int32_t ids[4], n;
    assert_nopad_ok(nopad_tokenize(tok, text, len, NULL, ids, 4, &n));
    assert_ids(ids, n, (int32_t[]){2, 1, 3}, 3);
    free(text);
    nopad_tokenizer_free(tok);
}

/* NFD's canonical ordering sorts a run of marks by class, stably; a long run stays fast. The
 * marks are U+1D165 (class 216) and U+1D16D (class 226), which accent stripping keeps. */
static void test_mark_reordering(void **state) {
    (void)state;
    tok_normalizer nm = {.enabled = 1, .clean_text = 1, .handle_chinese_chars = 1,
                         .strip_accents = 1, .lowercase = 1};
    enum { PAIRS = 20000 };
    char *text = malloc(1 + PAIRS * 8 + 1);
    assert_non_null(text);
    size_t len = 0;
    text[len++] = 'A';
    for (int i = 0; i < PAIRS; i++) {
        len += (size_t)tok_utf8_put(0x1D16D, text + len);
        len += (size_t)tok_utf8_put(0x1D165, text + len);
    }
    text[len++] = 'B';
    tok_cpbuf out;
    tok_cpbuf_init(&out, NULL, 0);
    assert_nopad_ok(tok_normalize(&nm, text, len, &out));
    assert_int_equal(out.len, 2 + 2 * PAIRS);
    assert_int_equal(out.data[0], 'a');
    for (int i = 0; i < PAIRS; i++) {
        assert_int_equal(out.data[1 + i], 0x1D165);
        assert_int_equal(out.data[1 + PAIRS + i], 0x1D16D);
    }
    assert_int_equal(out.data[1 + 2 * PAIRS], 'b');
    /* a short run, and a run ending the text */
    out.len = 0;
    const char short_run[] = "x\xf0\x9d\x85\xad\xf0\x9d\x85\xa5 y\xf0\x9d\x85\xad\xf0\x9d\x85\xa5";
    assert_nopad_ok(tok_normalize(&nm, short_run, sizeof short_run - 1, &out));
    const uint32_t want[] = {'x', 0x1D165, 0x1D16D, ' ', 'y', 0x1D165, 0x1D16D};
    assert_int_equal(out.len, 7);
    for (int i = 0; i < 7; i++) assert_int_equal(out.data[i], want[i]);
    tok_cpbuf_free(&out);
    free(text);
}

/* ---- vocab.txt fallback --------------------------------------------------------------------- */

static const char small_vocab_txt[] =
    "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\nun\n##aff\n"
    "##able\ncafe\nCafé\n##s\n.\n";

static void write_file(const char *dir, const char *name, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_vocab_txt_fallback(void **state) {
    (void)state;
    const char *dir = test_make_temp_dir(0);
    write_file(dir, "vocab.txt", small_vocab_txt);
    nopad_tokenizer *tok = NULL;
    assert_nopad_ok(nopad_tokenizer_load(dir, &tok)); /* no tokenizer_config.json: uncased */
    assert_int_equal(nopad_tokenizer_vocab_size(tok), 14);
    assert_int_equal(nopad_tokenizer_token_to_id(tok, "##able"), 9);
    int32_t ids[16], n;
    assert_nopad_ok(tokenize_str(tok, "Hello WORLD unable. Café [MASK]", NULL, ids, 16, &n));
    assert_ids(ids, n, (int32_t[]){2, 5, 6, 7, 9, 13, 10, 4, 3}, 9);
    nopad_tokenizer_free(tok);

    write_file(dir, "tokenizer_config.json", "{\"do_lower_case\": false}");
    assert_nopad_ok(nopad_tokenizer_load(dir, &tok));
    assert_nopad_ok(tokenize_str(tok, "Hello hello Café", NULL, ids, 16, &n));
    assert_ids(ids, n, (int32_t[]){2, 1, 5, 11, 3}, 5);
    nopad_tokenizer_free(tok);

    write_file(dir, "tokenizer_config.json", "{\"do_lower_case\": \"yes\"}");
    assert_nopad_error(nopad_tokenizer_load(dir, &tok), NOPAD_ERR_FORMAT, "do_lower_case");
    write_file(dir, "tokenizer_config.json", "not json");
    assert_nopad_error(nopad_tokenizer_load(dir, &tok), NOPAD_ERR_FORMAT, "tokenizer_config.json");
    assert_null(tok);

    /* CRLF line ends are line ends; a missing [UNK] or [CLS] is reported */
    const char crlf[] = "[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\nhello\r\n";
    assert_nopad_ok(tokenizer_from_vocab_txt(crlf, sizeof crlf - 1, 1, "crlf", &tok));
    assert_int_equal(nopad_tokenizer_token_to_id(tok, "hello"), 4);
    nopad_tokenizer_free(tok);
    const char no_unk[] = "[CLS]\n[SEP]\nhello\n";
    assert_nopad_error(tokenizer_from_vocab_txt(no_unk, sizeof no_unk - 1, 1, "v", &tok),
                       NOPAD_ERR_FORMAT, "[UNK]");
    const char no_cls[] = "[UNK]\n[SEP]\nhello\n";
    assert_nopad_error(tokenizer_from_vocab_txt(no_cls, sizeof no_cls - 1, 1, "v", &tok),
                       NOPAD_ERR_FORMAT, "[CLS]");
    const char bad_utf8[] = "[UNK]\n[CLS]\n[SEP]\nab\xff\n";
    assert_nopad_error(tokenizer_from_vocab_txt(bad_utf8, sizeof bad_utf8 - 1, 1, "v", &tok),
                       NOPAD_ERR_FORMAT, "line 4");
}

static void test_missing_folder(void **state) {
    (void)state;
    nopad_tokenizer *tok = (nopad_tokenizer *)1;
    assert_nopad_error(nopad_tokenizer_load("/nonexistent/nopad/model", &tok), NOPAD_ERR_IO,
                       "/nonexistent/nopad/model");
    assert_null(tok);
    const char *dir = test_make_temp_dir(1);
    assert_nopad_error(nopad_tokenizer_load(dir, &tok), NOPAD_ERR_IO,
                       "no tokenizer.json or vocab.txt");
}

/* ---- malformed and unsupported tokenizer.json ----------------------------------------------- */

#define MODEL_OK                                                                                   \
    "\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", "                             \
    "\"continuing_subword_prefix\": \"##\", \"max_input_chars_per_word\": 100, "                 \
    "\"vocab\": {\"[UNK]\": 0, \"[CLS]\": 1, \"[SEP]\": 2, \"a\": 3}}"

static void expect_json_error(const char *json, nopad_status want, const char *needle) {
    nopad_tokenizer *tok = (nopad_tokenizer *)1;
    nopad_status st = tokenizer_from_json(json, strlen(json), "t.json", &tok);
    if (st != want)
        fail_msg("%s\n -> %s (want %s): %s", json, nopad_status_string(st),
                 nopad_status_string(want), nopad_last_error());
    if (!strstr(nopad_last_error(), needle))
        fail_msg("%s\n -> message \"%s\" does not mention \"%s\"", json, nopad_last_error(),
                 needle);
    assert_null(tok);
}

static void test_bad_json(void **state) {
    (void)state;
    expect_json_error("this is not json", NOPAD_ERR_FORMAT, "not valid JSON");
    expect_json_error("", NOPAD_ERR_FORMAT, "not valid JSON");
    expect_json_error("{\"model\": {", NOPAD_ERR_FORMAT, "not valid JSON");
    expect_json_error("[1, 2]", NOPAD_ERR_FORMAT, "object");
    expect_json_error("{}", NOPAD_ERR_FORMAT, "model");
    expect_json_error("{\"model\": {\"vocab\": {}}}", NOPAD_ERR_FORMAT, "model.type");
    expect_json_error("{\"model\": {\"type\": \"WordLevel\", \"vocab\": {}}}",
                      NOPAD_ERR_UNSUPPORTED, "\"WordLevel\"");
    expect_json_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\"]]}}",
                      NOPAD_ERR_FORMAT, "model.vocab[0]");
    expect_json_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", -1.0]], "
                      "\"unk_id\": 3}}",
                      NOPAD_ERR_FORMAT, "model.unk_id");
    expect_json_error("{\"model\": {\"type\": \"WordPiece\"}}", NOPAD_ERR_FORMAT, "model.vocab");
    expect_json_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": []}}", NOPAD_ERR_FORMAT,
                      "model.vocab");
    expect_json_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": \"x\"}}}",
                      NOPAD_ERR_FORMAT, "model.vocab[\"a\"]");
    expect_json_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": -3}}}",
                      NOPAD_ERR_FORMAT, "model.vocab[\"a\"]");
    expect_json_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 1.5}}}",
                      NOPAD_ERR_FORMAT, "model.vocab[\"a\"]");
    expect_json_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}",
                      NOPAD_ERR_FORMAT, "model.unk_token");
    expect_json_error("{\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", "
                      "\"continuing_subword_prefix\": \"##\", \"max_input_chars_per_word\": 100, "
                      "\"vocab\": {\"a\": 0}}}",
                      NOPAD_ERR_FORMAT, "is not in model.vocab");
    expect_json_error("{\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", "
                      "\"continuing_subword_prefix\": \"##\", \"vocab\": {\"[UNK]\": 0}}}",
                      NOPAD_ERR_FORMAT, "max_input_chars_per_word");
    expect_json_error("{\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", "
                      "\"continuing_subword_prefix\": \"##\", \"max_input_chars_per_word\": -1, "
                      "\"vocab\": {\"[UNK]\": 0}}}",
                      NOPAD_ERR_FORMAT, "max_input_chars_per_word");
    expect_json_error("{\"model\": {\"type\": \"WordPiece\", \"unk_token\": 7, "
                      "\"continuing_subword_prefix\": \"##\", \"max_input_chars_per_word\": 100, "
                      "\"vocab\": {\"[UNK]\": 0}}}",
                      NOPAD_ERR_FORMAT, "model.unk_token");
    expect_json_error("{" MODEL_OK ", \"normalizer\": {\"type\": \"ByteLevel\"}}",
                      NOPAD_ERR_UNSUPPORTED, "\"ByteLevel\"");
    expect_json_error("{" MODEL_OK ", \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": "
                      "[{\"type\": \"NFKC\"}, {\"type\": \"Replace\", \"content\": \"x\"}]}}",
                      NOPAD_ERR_FORMAT, "normalizer.normalizers[1].pattern");
    expect_json_error("{" MODEL_OK ", \"normalizer\": {\"type\": \"Replace\", \"content\": \"x\", "
                      "\"pattern\": {\"Regex\": \"(\"}}}",
                      NOPAD_ERR_UNSUPPORTED, "PCRE2");
    expect_json_error("{" MODEL_OK ", \"normalizer\": {\"type\": \"Precompiled\", "
                      "\"precompiled_charsmap\": \"AAAA\"}}",
                      NOPAD_ERR_FORMAT, "trie size");
    expect_json_error("{" MODEL_OK ", \"normalizer\": {\"type\": \"Precompiled\", "
                      "\"precompiled_charsmap\": \"not base64!\"}}",
                      NOPAD_ERR_FORMAT, "base64");
    expect_json_error("{" MODEL_OK ", \"normalizer\": {\"type\": \"BertNormalizer\", "
                      "\"lowercase\": 1}}",
                      NOPAD_ERR_FORMAT, "normalizer.lowercase");
    expect_json_error("{" MODEL_OK ", \"normalizer\": 5}", NOPAD_ERR_FORMAT, "normalizer");
    expect_json_error("{" MODEL_OK ", \"pre_tokenizer\": {\"type\": \"UnicodeScripts\"}}",
                      NOPAD_ERR_UNSUPPORTED, "UnicodeScripts");
    expect_json_error("{" MODEL_OK ", \"pre_tokenizer\": {\"type\": \"Metaspace\", "
                      "\"replacement\": \"ab\"}}",
                      NOPAD_ERR_FORMAT, "one character");
    expect_json_error("{" MODEL_OK ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": "
                      "{\"String\": \" \"}, \"behavior\": \"Sideways\"}}",
                      NOPAD_ERR_FORMAT, "behavior");
    expect_json_error("{" MODEL_OK ", \"pre_tokenizer\": {}}", NOPAD_ERR_FORMAT,
                      "pre_tokenizer.type");
    expect_json_error("{" MODEL_OK ", \"post_processor\": {\"type\": \"ByteLevel\"}}",
                      NOPAD_ERR_UNSUPPORTED, "\"ByteLevel\"");
    expect_json_error("{" MODEL_OK ", \"post_processor\": {\"type\": \"TemplateProcessing\", "
                      "\"single\": [{\"SpecialToken\": {\"id\": \"[CLS]\", \"type_id\": 0}}, "
                      "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": {}}}",
                      NOPAD_ERR_FORMAT, "[CLS]");
    expect_json_error("{" MODEL_OK ", \"post_processor\": {\"type\": \"TemplateProcessing\", "
                      "\"single\": [], \"special_tokens\": {}}}",
                      NOPAD_ERR_FORMAT, "$A");
    expect_json_error("{" MODEL_OK ", \"post_processor\": {\"type\": \"BertProcessing\", "
                      "\"sep\": [\"[SEP]\"], \"cls\": [\"[CLS]\", 1]}}",
                      NOPAD_ERR_FORMAT, "post_processor.sep");
    expect_json_error("{" MODEL_OK ", \"added_tokens\": {}}", NOPAD_ERR_FORMAT, "added_tokens");
    expect_json_error("{" MODEL_OK ", \"added_tokens\": [{\"id\": 1}]}", NOPAD_ERR_FORMAT,
                      "added_tokens[0].content");
    expect_json_error("{" MODEL_OK ", \"added_tokens\": [{\"id\": 1, \"content\": \"[CLS]\", "
                      "\"lstrip\": \"no\"}]}",
                      NOPAD_ERR_FORMAT, "added_tokens[0].lstrip");
    expect_json_error("{" MODEL_OK ", \"added_tokens\": [{\"content\": \"[CLS]\"}]}",
                      NOPAD_ERR_FORMAT, "added_tokens[0].id");
    expect_json_error("{" MODEL_OK ", \"added_tokens\": [{\"id\": 1, \"content\": \"\xff\"}]}",
                      NOPAD_ERR_FORMAT, "UTF-8");

    /* the smallest accepted file, and BertProcessing */
    const char ok[] = "{" MODEL_OK ", \"post_processor\": {\"type\": \"BertProcessing\", "
                      "\"sep\": [\"[SEP]\", 2], \"cls\": [\"[CLS]\", 1]}}";
    nopad_tokenizer *tok = NULL;
    assert_nopad_ok(tokenizer_from_json(ok, sizeof ok - 1, "ok.json", &tok));
    int32_t ids[8], n;
    /* null normalizer and pre-tokenizer: the whole text is one word */
    assert_nopad_ok(tokenize_str(tok, "a", NULL, ids, 8, &n));
    assert_ids(ids, n, (int32_t[]){1, 3, 2}, 3);
    assert_nopad_ok(tokenize_str(tok, "a a", NULL, ids, 8, &n));
    assert_ids(ids, n, (int32_t[]){1, 0, 2}, 3);
    nopad_tokenizer_free(tok);

    /* a tokenizer.json in a folder wins over vocab.txt, and its errors name the file */
    const char *dir = test_make_temp_dir(2);
    write_file(dir, "tokenizer.json", "{\"model\": {\"type\": \"WordLevel\"}}");
    write_file(dir, "vocab.txt", small_vocab_txt);
    assert_nopad_error(nopad_tokenizer_load(dir, &tok), NOPAD_ERR_UNSUPPORTED, "tokenizer.json");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_added_token_flags),
        cmocka_unit_test(test_empty_patterns),
        cmocka_unit_test(test_empty_and_specials),
        cmocka_unit_test(test_max_chars_per_word),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_buffer_too_small),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_long_text_chunks),
        cmocka_unit_test(test_mark_reordering),
        cmocka_unit_test(test_vocab_txt_fallback),
        cmocka_unit_test(test_missing_folder),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_corpus_uncased),
        cmocka_unit_test(test_corpus_cased),
        cmocka_unit_test(test_corpus_whitespace_pre_tokenizer),
        cmocka_unit_test(test_corpus_lowercase_only_and_raw),
        cmocka_unit_test(test_corpus_vocab_txt),
        cmocka_unit_test(test_concurrent_tokenize),
    };
    return cmocka_run_group_tests_name("tokenizer", tests, NULL, NULL);
}

/* The real all-MiniLM-L6-v2 (fetched by scripts/fetch_default_model.sh) against
 * sentence-transformers (fixtures by scripts/make_minilm_fixtures.py): token ids identical to
 * Hugging Face's, sentence embeddings with cosine >= 0.9999 each, and last hidden states within
 * row-relative error 1e-4; over-long inputs truncated to max_seq_length exactly as HF does. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "golden.h"

static nopad_model *model;

static int setup(void **state) {
    const char *dir = test_minilm_dir();
    if (!dir) {
        fprintf(stderr, "NOPAD_MINILM_DIR is unset or has no config.json: run "
                        "scripts/fetch_default_model.sh (scripts/test.sh does)\n");
        return -1; /* a missing model fails the test: CI must always run it */
    }
    if (nopad_model_load(dir, NULL, &model) != NOPAD_OK) {
        fprintf(stderr, "loading %s: %s\n", dir, nopad_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    nopad_model_free(model);
    return 0;
}

/* Splits a text file into lines (without '\n'); returns the count. */
static int read_lines(const char *path, char ***lines_out, char **buf_out) {
    size_t len;
    char *buf = test_read_file(path, &len);
    assert_non_null(buf);
    char **lines = NULL;
    int n = 0;
    char *p = buf;
    while (p < buf + len) {
        char *nl = memchr(p, '\n', (size_t)(buf + len - p));
        if (nl) *nl = '\0';
        lines = realloc(lines, (size_t)(n + 1) * sizeof *lines);
        lines[n++] = p;
        p = nl ? nl + 1 : buf + len;
    }
    *lines_out = lines;
    *buf_out = buf;
    return n;
}


static void check_file(const char *text_rel, const char *expected_rel, int truncate) {
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(model, &info));
    const nopad_tokenizer *tok = nopad_model_tokenizer(model);
    assert_non_null(tok);
    char **lines, *buf;
    int n = read_lines(test_data_path(text_rel), &lines, &buf);
    safetensors_file f;
    assert_nopad_ok(safetensors_open(test_data_path(expected_rel), &f));
    int64_t n_cu, n_ids;
    int32_t *want_ids = golden_copy(&f, "input_ids", ST_I32, &n_ids);
    int32_t *want_cu = golden_copy(&f, "cu_seqlens", ST_I32, &n_cu);
    float *want_emb = golden_copy(&f, "embeddings", ST_F32, NULL);
    float *want_hidden = golden_has(&f, "last_hidden_state")
                             ? golden_copy(&f, "last_hidden_state", ST_F32, NULL) : NULL;
    assert_int_equal(n_cu - 1, n);

    int32_t *ids = malloc((size_t)n_ids * sizeof *ids);
    int32_t *cu = malloc(((size_t)n + 1) * sizeof *cu);
    cu[0] = 0;
    nopad_tokenize_params tp = nopad_tokenize_default_params();
    tp.max_length = info.max_seq_length;
    for (int i = 0; i < n; i++) {
        int32_t got = 0;
        tp.truncate = truncate;
        nopad_status st = nopad_tokenize(tok, lines[i], strlen(lines[i]), &tp, ids + cu[i],
                                         (int32_t)n_ids - cu[i], &got);
        if (st != NOPAD_OK) fail_msg("line %d: %s: %s", i + 1, nopad_status_string(st), nopad_last_error());
        int32_t want_len = want_cu[i + 1] - want_cu[i];
        if (got != want_len || memcmp(ids + cu[i], want_ids + want_cu[i], (size_t)got * sizeof(int32_t)))
            fail_msg("line %d (\"%.60s\"): %d ids, Hugging Face gives %d, or they differ", i + 1,
                     lines[i], got, want_len);
        cu[i + 1] = cu[i] + got;
    }
    if (truncate) {
        /* the same lines without --truncate are errors naming both lengths */
        tp.truncate = 0;
        int32_t got, scratch[4096];
        assert_nopad_error(nopad_tokenize(tok, lines[0], strlen(lines[0]), &tp, scratch, 4096, &got),
                           NOPAD_ERR_TOO_LONG, "256");
        if (golden_has(&f, "untruncated_cu_seqlens")) {
            int32_t *full_cu = golden_copy(&f, "untruncated_cu_seqlens", ST_I32, NULL);
            assert_int_equal(got, full_cu[1] - full_cu[0]); /* the untruncated length is reported */
            free(full_cu);
        }
    }

    const int H = info.hidden_size;
    float *emb = malloc((size_t)n * H * sizeof(float));
    float *hidden = malloc((size_t)cu[n] * H * sizeof(float));
    assert_nopad_ok(nopad_encode_packed(model, n, cu, ids, NULL, NULL, hidden, emb));
    double worst = 1;
    for (int i = 0; i < n; i++) {
        double c = test_cosine(emb + (size_t)i * H, want_emb + (size_t)i * H, H);
        if (c < worst) worst = c;
        if (!(c >= 0.9999)) fail_msg("line %d: cosine %.6f < 0.9999", i + 1, c);
    }
    printf("  %s: %d sentences, %d tokens, ids identical, min cosine %.7f", text_rel, n, cu[n], worst);
    if (want_hidden) {
        double err = test_max_row_rel_error(hidden, want_hidden, cu[n], H);
        printf(", hidden max row rel err %.2e", err);
        if (!(err <= 1e-4)) fail_msg("hidden states: row error %.3e > 1e-4", err);
    }
    printf("\n");
    free(ids); free(cu); free(emb); free(hidden); free(want_ids); free(want_cu); free(want_emb);
    free(want_hidden); free(lines); free(buf);
    safetensors_close(&f);
}

static void test_info(void **state) {
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(model, &info));
    assert_string_equal(info.family, "BERT");
    assert_int_equal(info.hidden_size, 384);
    assert_int_equal(info.num_layers, 6);
    assert_int_equal(info.max_seq_length, 256); /* sentence_bert_config.json */
    assert_int_equal(info.pooling, NOPAD_POOLING_MEAN);
    assert_int_equal(info.normalize, 1);
    assert_true(info.has_tokenizer);
}

static void test_sentences(void **state) { check_file("minilm/sentences.txt", "minilm/expected.safetensors", 0); }
static void test_truncated_long_inputs(void **state) {
    check_file("minilm/long.txt", "minilm/long_expected.safetensors", 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_info),
        cmocka_unit_test(test_sentences),
        cmocka_unit_test(test_truncated_long_inputs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

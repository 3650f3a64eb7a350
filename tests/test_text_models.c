/* From text to hidden states against Hugging Face, for the families whose tokenizers are not
 * WordPiece: RoBERTa (byte-level BPE), XLM-RoBERTa and ALBERT (Unigram with the Precompiled
 * normalizer), as shipped in model folders (scripts/make_text_models.py). Each golden text is
 * tokenized by the model's own tokenizer, truncated to the model's maximum, and must give HF's
 * ids exactly; the packed batch then must give HF's hidden states within 1e-4 row-relative error
 * (the fp32 bound of test_encoder.c). */
#include <stdio.h>
#include <string.h>

#include "golden.h"

static const char *const TEXT_MODELS[] = {"roberta_text", "xlmr_text", "albert_text"};
enum { N_TEXT_MODELS = sizeof TEXT_MODELS / sizeof TEXT_MODELS[0] };

static void expect_ids(const char *model, int seq, const int32_t *want, int32_t n_want,
                       const int32_t *got, int32_t n_got) {
    int32_t k = 0;
    while (k < n_want && k < n_got && want[k] == got[k]) k++;
    if (k == n_want && k == n_got) return;
    fail_msg("%s text %d: %d ids, HF %d; first difference at %d (%d, HF %d)", model, seq, n_got,
             n_want, k, k < n_got ? got[k] : -1, k < n_want ? want[k] : -1);
}

static void test_text_to_hidden_states(void **state) {
    for (int i = 0; i < N_TEXT_MODELS; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "models/%s", TEXT_MODELS[i]);
        nopad_model *m = NULL;
        assert_nopad_ok(nopad_model_load(test_data_path(rel), NULL, &m));
        nopad_model_info info;
        assert_nopad_ok(nopad_model_get_info(m, &info));
        const nopad_tokenizer *tok = nopad_model_tokenizer(m);
        assert_non_null(tok);

        snprintf(rel, sizeof rel, "models/%s/golden.safetensors", TEXT_MODELS[i]);
        safetensors_file file;
        assert_nopad_ok(safetensors_open(test_data_path(rel), &file));
        int64_t n_tok, n_cu;
        int32_t *want_ids = golden_copy(&file, "input_ids", ST_I32, &n_tok);
        int32_t *cu = golden_copy(&file, "cu_seqlens", ST_I32, &n_cu);
        float *want = golden_copy(&file, "last_hidden_state", ST_F32, NULL);
        int32_t n_seqs = (int32_t)n_cu - 1;

        snprintf(rel, sizeof rel, "models/%s/golden_texts.txt", TEXT_MODELS[i]);
        size_t size;
        char *texts = test_read_file(test_data_path(rel), &size);
        assert_non_null(texts);
        int32_t *ids = malloc((size_t)n_tok * sizeof *ids);
        assert_non_null(ids);
        nopad_tokenize_params tp = nopad_tokenize_default_params();
        tp.truncate = 1;
        tp.max_length = info.max_seq_length;
        int32_t s = 0;
        for (char *line = strtok(texts, "\n"); line; line = strtok(NULL, "\n"), s++) {
            assert_true(s < n_seqs);
            int32_t n = 0;
            assert_nopad_ok(nopad_tokenize(tok, line, strlen(line), &tp, ids + cu[s],
                                           (int32_t)n_tok - cu[s], &n));
            expect_ids(TEXT_MODELS[i], s, want_ids + cu[s], cu[s + 1] - cu[s], ids + cu[s], n);
        }
        assert_int_equal(s, n_seqs);

        float *out = malloc((size_t)n_tok * info.hidden_size * sizeof *out);
        assert_non_null(out);
        nopad_encode_params p = nopad_encode_default_params();
        p.pooling = NOPAD_POOLING_NONE;
        assert_nopad_ok(nopad_encode_packed(m, n_seqs, cu, ids, NULL, &p, out, NULL));
        double err = test_max_row_rel_error(out, want, (int64_t)n_tok, info.hidden_size);
        printf("  %-13s %-12s tokenizer %-18s B=%d T=%-4d max row rel err %.2e\n", TEXT_MODELS[i],
               info.family, nopad_tokenizer_kind_name(nopad_tokenizer_get_kind(tok)), n_seqs,
               (int)n_tok, err);
        if (!(err <= 1e-4)) fail_msg("%s: row-relative error %.3e > 1e-4", TEXT_MODELS[i], err);
        free(out);
        free(ids);
        free(texts);
        free(want);
        free(cu);
        free(want_ids);
        safetensors_close(&file);
        nopad_model_free(m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_to_hidden_states),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

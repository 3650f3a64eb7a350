/* Decoders on the CPU against Hugging Face (fixtures: scripts/make_decoder_fixtures.py, tiny
 * random GPT-2 / LLaMA / Qwen2 models of odd shapes; scripts/make_smollm2_fixtures.py for the real
 * SmolLM2 GGUF): logits at every position within 1e-4 row-relative error of HF fp32 (both sides
 * fp32; differences come from summation order), 32 greedy tokens identical; the same logits
 * however a prompt is chunked, whatever the KV block size and whatever shares the step; and bad
 * input refused with nothing changed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "golden.h"

static const char *const DECODERS[] = {"gpt2_dec", "llama_gqa", "llama_mqa", "llama_linear",
                                       "qwen2_bias"};
enum { N_DECODERS = sizeof DECODERS / sizeof DECODERS[0], GREEDY = 32 };
static const double LOGITS_BOUND = 1e-4;

typedef struct dgolden {
    safetensors_file file;
    int32_t *ids, *cu, *greedy;
    float *logits;
    int32_t n_seqs, n_tokens;
} dgolden;

static void dgolden_load(const char *name, dgolden *g) {
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s/golden.safetensors", name);
    assert_nopad_ok(safetensors_open(test_data_path(rel), &g->file));
    int64_t n_tok, n_cu;
    g->ids = golden_copy(&g->file, "input_ids", ST_I32, &n_tok);
    g->cu = golden_copy(&g->file, "cu_seqlens", ST_I32, &n_cu);
    g->logits = golden_copy(&g->file, "logits", ST_F32, NULL);
    g->greedy = golden_copy(&g->file, "greedy", ST_I32, NULL);
    g->n_seqs = (int32_t)n_cu - 1;
    g->n_tokens = (int32_t)n_tok;
}

static void dgolden_free(dgolden *g) {
    free(g->ids);
    free(g->cu);
    free(g->logits);
    free(g->greedy);
    safetensors_close(&g->file);
}

static nopad_model *load_decoder(const char *name, const nopad_model_params *p) {
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s", name);
    nopad_model *m = NULL;
    assert_nopad_ok(nopad_model_load(test_data_path(rel), p, &m));
    return m;
}

static void test_hf_logits_and_greedy(void **state) {
    for (int i = 0; i < N_DECODERS; i++) {
        nopad_model *m = load_decoder(DECODERS[i], NULL);
        nopad_model_info info;
        assert_nopad_ok(nopad_model_get_info(m, &info));
        assert_true(info.is_decoder);
        dgolden g;
        dgolden_load(DECODERS[i], &g);
        const int32_t V = info.vocab_size;
        nopad_context *c = nopad_model_context(m);
        double worst = 0;
        for (int32_t b = 0; b < g.n_seqs; b++) {
            const int32_t n = g.cu[b + 1] - g.cu[b];
            float *logits = malloc((size_t)n * V * sizeof *logits);
            nopad_sequence *s;
            assert_nopad_ok(nopad_sequence_create(c, &s));
            const int32_t cu[2] = {0, n};
            assert_nopad_ok(nopad_decode(c, 1, &s, cu, g.ids + g.cu[b], 1, logits));
            double err = test_max_row_rel_error(logits, g.logits + (size_t)g.cu[b] * V, n, V);
            if (err > worst) worst = err;
            if (!(err <= LOGITS_BOUND))
                fail_msg("%s prompt %d: logits row-relative error %.3e > %.0e", DECODERS[i], b, err,
                         LOGITS_BOUND);
            nopad_sequence_free(s);
            free(logits);
        }
        /* greedy, all prompts in one call: each must give HF's 32 tokens */
        int32_t *out = malloc((size_t)g.n_seqs * GREEDY * sizeof *out), counts[16];
        assert_true(g.n_seqs <= 16);
        nopad_generate_params gp = nopad_generate_default_params();
        gp.max_tokens = GREEDY;
        gp.ignore_eos = 1;
        assert_nopad_ok(nopad_generate(c, g.n_seqs, g.cu, g.ids, &gp, out, counts, NULL, NULL));
        int same = 0;
        for (int32_t b = 0; b < g.n_seqs; b++) {
            assert_int_equal(counts[b], GREEDY);
            for (int k = 0; k < GREEDY; k++) {
                if (out[b * GREEDY + k] != g.greedy[b * GREEDY + k])
                    fail_msg("%s prompt %d: greedy token %d is %d, HF %d", DECODERS[i], b, k,
                             out[b * GREEDY + k], g.greedy[b * GREEDY + k]);
                same++;
            }
        }
        printf("  %-13s %-6s heads %d/%d D=%-3d T=%-4d max row rel err %.2e, %d greedy tokens equal\n",
               DECODERS[i], info.family, info.num_heads, info.num_kv_heads, info.head_size,
               g.n_tokens, worst, same);
        free(out);
        dgolden_free(&g);
        nopad_model_free(m);
    }
}

/* Three copies of llama_gqa's prompts as 15 sequences in one step, every position's logits: more
 * rows than the LM head computes at a time (256), so its row chunks must line up. */
static void test_many_rows_in_one_step(void **state) {
    dgolden g;
    dgolden_load("llama_gqa", &g);
    nopad_model_params p = nopad_model_default_params();
    p.max_batch_tokens = 3 * g.n_tokens;
    nopad_model *m = load_decoder("llama_gqa", &p);
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(m, &info));
    const int32_t V = info.vocab_size, B = 3 * g.n_seqs, T = 3 * g.n_tokens;
    nopad_context *c = nopad_model_context(m);
    nopad_sequence **seqs = calloc((size_t)B, sizeof *seqs);
    int32_t *cu = malloc(((size_t)B + 1) * sizeof *cu), *ids = malloc((size_t)T * sizeof *ids);
    float *want = malloc((size_t)T * V * sizeof *want), *got = malloc((size_t)T * V * sizeof *got);
    cu[0] = 0;
    for (int32_t k = 0; k < 3; k++) {
        memcpy(ids + k * g.n_tokens, g.ids, (size_t)g.n_tokens * sizeof *ids);
        memcpy(want + (size_t)k * g.n_tokens * V, g.logits, (size_t)g.n_tokens * V * sizeof *want);
        for (int32_t b = 0; b < g.n_seqs; b++) cu[k * g.n_seqs + b + 1] = k * g.n_tokens + g.cu[b + 1];
    }
    for (int32_t b = 0; b < B; b++) assert_nopad_ok(nopad_sequence_create(c, &seqs[b]));
    assert_nopad_ok(nopad_decode(c, B, seqs, cu, ids, 1, got));
    double err = test_max_row_rel_error(got, want, T, V);
    printf("  %d sequences, %d rows of logits in one step: max row rel err %.2e\n", B, T, err);
    assert_true(err <= LOGITS_BOUND);
    for (int32_t b = 0; b < B; b++) nopad_sequence_free(seqs[b]);
    free(seqs); free(cu); free(ids); free(want); free(got);
    nopad_model_free(m);
    dgolden_free(&g);
}

/* The longest prompt of llama_gqa: whole, in chunks of 1, 7 and 64, with block sizes 1, 3 and 16,
 * and sharing each step with other sequences (a second prompt and decode tokens): the logits of
 * every position agree to 1e-5 (fp32 sums in another order only). */
static void test_chunking_and_blocks(void **state) {
    dgolden g;
    dgolden_load("llama_gqa", &g);
    int32_t longest = 0;
    for (int32_t b = 1; b < g.n_seqs; b++)
        if (g.cu[b + 1] - g.cu[b] > g.cu[longest + 1] - g.cu[longest]) longest = b;
    const int32_t n = g.cu[longest + 1] - g.cu[longest];
    const int32_t *prompt = g.ids + g.cu[longest];
    static const int32_t blocks[] = {16, 1, 3};
    static const int32_t chunks[] = {0, 1, 7, 64};
    float *whole = NULL;
    int32_t V = 0;
    for (int bi = 0; bi < 3; bi++) {
        nopad_model_params p = nopad_model_default_params();
        p.kv_block_size = blocks[bi];
        p.kv_cache_tokens = 1024;
        nopad_model *m = load_decoder("llama_gqa", &p);
        nopad_model_info info;
        assert_nopad_ok(nopad_model_get_info(m, &info));
        V = info.vocab_size;
        nopad_context *c = nopad_model_context(m);
        float *logits = malloc((size_t)(n + 8) * V * sizeof *logits);
        for (int ci = 0; ci < 4; ci++) {
            const int32_t chunk = chunks[ci] ? chunks[ci] : n;
            nopad_sequence *s, *other, *other2;
            assert_nopad_ok(nopad_sequence_create(c, &s));
            assert_nopad_ok(nopad_sequence_create(c, &other));
            assert_nopad_ok(nopad_sequence_create(c, &other2));
            /* other2 already has a history: it brings one decode token per step */
            const int32_t cu1[2] = {0, 5};
            assert_nopad_ok(nopad_decode(c, 1, &other2, cu1, g.ids, 0, logits));
            float *got = malloc((size_t)n * V * sizeof *got);
            for (int32_t off = 0; off < n; off += chunk) {
                const int32_t len = n - off < chunk ? n - off : chunk;
                /* the step: [other2: 1 token] [s: the chunk] [other: 3 tokens, first chunk only] */
                int32_t toks[128 + 8], cu[4] = {0, 1, 1 + len, 0};
                nopad_sequence *seqs[3] = {other2, s, other};
                toks[0] = g.ids[(off / chunk) % g.n_tokens];
                memcpy(toks + 1, prompt + off, (size_t)len * sizeof *toks);
                int B = 2;
                if (off == 0) {
                    memcpy(toks + 1 + len, g.ids + 3, 3 * sizeof *toks);
                    cu[3] = 4 + len;
                    B = 3;
                }
                assert_true(1 + len + 3 <= 128 + 8);
                assert_nopad_ok(nopad_decode(c, B, seqs, cu, toks, 1, logits));
                memcpy(got + (size_t)off * V, logits + (size_t)1 * V, (size_t)len * V * sizeof *got);
            }
            assert_int_equal(nopad_sequence_length(s), n);
            if (!whole) {
                whole = got;
                double err = test_max_row_rel_error(whole, g.logits + (size_t)g.cu[longest] * V, n, V);
                assert_true(err <= LOGITS_BOUND);
            } else {
                double err = test_max_row_rel_error(got, whole, n, V);
                printf("  block %2d, chunk %3d: max row rel err against whole %.2e\n", blocks[bi],
                       chunk, err);
                if (!(err <= 1e-5)) fail_msg("block %d chunk %d: %.3e", blocks[bi], chunk, err);
                free(got);
            }
            nopad_sequence_free(s);
            nopad_sequence_free(other);
            nopad_sequence_free(other2);
        }
        free(logits);
        nopad_model_free(m);
    }
    free(whole);
    dgolden_free(&g);
}

static void test_bad_input(void **state) {
    nopad_model *m = NULL;
    assert_nopad_error(nopad_model_load(test_data_path("models/bad_mistral_window"), NULL, &m),
                       NOPAD_ERR_UNSUPPORTED, "sliding_window");
    assert_nopad_error(nopad_model_load(test_data_path("models/bad_rope_yarn"), NULL, &m),
                       NOPAD_ERR_UNSUPPORTED, "yarn");
    nopad_model_params p = nopad_model_default_params();
    p.kv_cache_tokens = 32;
    p.kv_block_size = 8;
    m = load_decoder("llama_gqa", &p);
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(m, &info));
    nopad_context *c = nopad_model_context(m);
    const int32_t V = info.vocab_size;
    float *logits = malloc((size_t)64 * V * sizeof *logits);
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = (i * 37 + 11) % V;
    nopad_sequence *a, *b;
    assert_nopad_ok(nopad_sequence_create(c, &a));
    assert_nopad_ok(nopad_sequence_create(c, &b));
    const int32_t cu20[2] = {0, 20};
    assert_nopad_ok(nopad_decode(c, 1, &a, cu20, toks, 0, logits));
    /* 20 more would need 3 blocks, 1 is free: refused, nothing changes */
    assert_nopad_error(nopad_decode(c, 1, &b, cu20, toks, 0, logits), NOPAD_ERR_OUT_OF_MEMORY,
                       "KV pool is exhausted");
    assert_int_equal(nopad_sequence_length(b), 0);
    const int32_t cu8[2] = {0, 8};
    assert_nopad_ok(nopad_decode(c, 1, &b, cu8, toks, 0, logits)); /* the free block still works */
    /* an id outside the vocabulary, a sequence twice, an empty span */
    toks[3] = V;
    const int32_t cu4[2] = {0, 4};
    assert_nopad_error(nopad_decode(c, 1, &a, cu4, toks, 0, logits), NOPAD_ERR_INVALID_ARGUMENT,
                       "outside the vocabulary");
    toks[3] = 1;
    nopad_sequence *twice[2] = {a, a};
    const int32_t cu2[3] = {0, 1, 2};
    assert_nopad_error(nopad_decode(c, 2, twice, cu2, toks, 0, logits), NOPAD_ERR_INVALID_ARGUMENT,
                       "twice");
    const int32_t cu0[2] = {0, 0};
    assert_nopad_error(nopad_decode(c, 1, &a, cu0, toks, 0, logits), NOPAD_ERR_INVALID_ARGUMENT,
                       "at least 1");
    assert_int_equal(nopad_sequence_length(a), 20);
    /* freeing gives the blocks back: the refused step now runs */
    nopad_sequence_free(b);
    assert_nopad_ok(nopad_sequence_create(c, &b));
    assert_nopad_ok(nopad_decode(c, 1, &b, cu8, toks, 0, logits));
    nopad_sequence_free(a);
    nopad_sequence_free(b);
    /* a prompt past the context, bad sampling, encode on a decoder */
    const int32_t cu_long[2] = {0, info.max_position_embeddings};
    int32_t *long_prompt = calloc((size_t)info.max_position_embeddings, sizeof *long_prompt);
    nopad_generate_params gp = nopad_generate_default_params();
    gp.max_tokens = 4;
    assert_nopad_error(nopad_generate(c, 1, cu_long, long_prompt, &gp, NULL, NULL, NULL, NULL),
                       NOPAD_ERR_TOO_LONG, "context");
    gp.sampling.top_p = 0.0f;
    assert_nopad_error(nopad_generate(c, 1, cu4, toks, &gp, NULL, NULL, NULL, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "top_p");
    assert_nopad_error(nopad_encode_packed(m, 1, cu4, toks, NULL, NULL, logits, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "decoder");
    free(long_prompt);
    free(logits);
    nopad_model_free(m);
    /* generation on an encoder */
    m = load_decoder("bert_a", NULL);
    nopad_sequence *e = NULL;
    assert_nopad_error(nopad_sequence_create(nopad_model_context(m), &e), NOPAD_ERR_INVALID_ARGUMENT,
                       "encoder");
    nopad_model_free(m);
}

/* The real default decoder from its GGUF (NOPAD_SMOLLM2_GGUF): HF's logits at the last position of
 * 8 prompts within 1e-4 and 64 greedy tokens identical. */
static void test_smollm2(void **state) {
    const char *path = getenv("NOPAD_SMOLLM2_GGUF");
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) {
        printf("  NOPAD_SMOLLM2_GGUF not set or missing: skipped\n");
        skip();
    }
    fclose(f);
    f = fopen(test_data_path("smollm2/golden.safetensors"), "rb");
    if (!f) {
        printf("  tests/data/smollm2/golden.safetensors absent (scripts/make_smollm2_fixtures.py): "
               "skipped\n");
        skip();
    }
    fclose(f);
    nopad_model *m = NULL;
    /* HF's reference computes with the dequantised weights in fp32: so does this (the weights kept
     * quantized are test_quant_decoder's) */
    nopad_model_params p = nopad_model_default_params();
    p.weights = NOPAD_WEIGHTS_F32;
    assert_nopad_ok(nopad_model_load(path, &p, &m));
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(m, &info));
    safetensors_file gf;
    assert_nopad_ok(safetensors_open(test_data_path("smollm2/golden.safetensors"), &gf));
    int64_t n_tok, n_cu;
    int32_t *ids = golden_copy(&gf, "input_ids", ST_I32, &n_tok);
    int32_t *cu = golden_copy(&gf, "cu_seqlens", ST_I32, &n_cu);
    float *want = golden_copy(&gf, "last_logits", ST_F32, NULL);
    int32_t *greedy = golden_copy(&gf, "greedy", ST_I32, NULL);
    const int32_t B = (int32_t)n_cu - 1, V = info.vocab_size;
    float *logits = malloc((size_t)B * V * sizeof *logits);
    nopad_context *c = nopad_model_context(m);
    nopad_sequence **seqs = calloc((size_t)B, sizeof *seqs);
    for (int32_t b = 0; b < B; b++) assert_nopad_ok(nopad_sequence_create(c, &seqs[b]));
    assert_nopad_ok(nopad_decode(c, B, seqs, cu, ids, 0, logits));
    double err = test_max_row_rel_error(logits, want, B, V);
    for (int32_t b = 0; b < B; b++) nopad_sequence_free(seqs[b]);
    const int32_t G = 64;
    int32_t *out = malloc((size_t)B * G * sizeof *out);
    nopad_generate_params gp = nopad_generate_default_params();
    gp.max_tokens = G;
    gp.ignore_eos = 1;
    assert_nopad_ok(nopad_generate(c, B, cu, ids, &gp, out, NULL, NULL, NULL));
    int equal = 0;
    for (int32_t i = 0; i < B * G; i++) equal += out[i] == greedy[i];
    printf("  SmolLM2-135M Q4_1: last-position logits max row rel err %.2e, greedy %d / %d equal\n",
           err, equal, B * G);
    if (!(err <= LOGITS_BOUND)) fail_msg("SmolLM2 logits: %.3e", err);
    assert_int_equal(equal, B * G);
    free(out);
    free(seqs);
    free(logits);
    free(ids);
    free(cu);
    free(want);
    free(greedy);
    safetensors_close(&gf);
    nopad_model_free(m);
}

/* nopad_decode_sample against sample_token on nopad_decode's logits: three steps of every prompt
 * of llama_gqa together, greedy, top-k / top-p and penalty / min-p (testutil.c). */
static void test_decode_sample(void **state) {
    dgolden g;
    dgolden_load("llama_gqa", &g);
    nopad_model *m = load_decoder("llama_gqa", NULL);
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(m, &info));
    const int n = test_decode_sample_matches_host(nopad_model_context(m), info.vocab_size, g.n_seqs,
                                                  g.cu, g.ids, 3, "llama_gqa");
    printf("  decode_sample: %d ids equal sample_token's (greedy, top-k/top-p, penalty/min-p)\n", n);
    nopad_model_free(m);
    dgolden_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hf_logits_and_greedy),
        cmocka_unit_test(test_many_rows_in_one_step),
        cmocka_unit_test(test_chunking_and_blocks),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_decode_sample),
        cmocka_unit_test(test_smollm2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

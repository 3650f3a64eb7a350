/* The encoder against Hugging Face: tiny random-init models of every family (fixtures made by
 * scripts/make_golden_fixtures.py), packed vs one-by-one, padded vs packed, pooling modes.
 * Bound: row-relative error <= 1e-4 against HF fp32 (both sides fp32; differences come from
 * summation order in GEMMs, softmax and LayerNorm, typically ~1e-6). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "golden.h"
#include "io/hf_config.h"
#include "model/encoder.h"

static const char *const MODELS[] = {"bert_a",       "bert_b",       "roberta_a", "xlmr_b",
                                     "distilbert_a", "distilbert_b", "albert_a",  "albert_b"};
enum { N_MODELS = sizeof MODELS / sizeof MODELS[0] };
static const double GOLDEN_BOUND = 1e-4;

typedef struct golden {
    safetensors_file file;
    int32_t *ids, *types, *cu;
    float *hidden;
    int32_t n_seqs, n_tokens;
} golden;

static void golden_load(const char *model, golden *g) {
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s/golden.safetensors", model);
    assert_nopad_ok(safetensors_open(test_data_path(rel), &g->file));
    int64_t n_cu, n_tok;
    g->ids = golden_copy(&g->file, "input_ids", ST_I32, &n_tok);
    g->types = golden_copy(&g->file, "token_type_ids", ST_I32, NULL);
    g->cu = golden_copy(&g->file, "cu_seqlens", ST_I32, &n_cu);
    g->hidden = golden_copy(&g->file, "last_hidden_state", ST_F32, NULL);
    g->n_seqs = (int32_t)n_cu - 1;
    g->n_tokens = (int32_t)n_tok;
    assert_int_equal(g->cu[g->n_seqs], g->n_tokens);
}

static void golden_free(golden *g) {
    free(g->ids);
    free(g->types);
    free(g->cu);
    free(g->hidden);
    safetensors_close(&g->file);
}

static nopad_model *load_model(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s", name);
    nopad_model *m = NULL;
    assert_nopad_ok(nopad_model_load(test_data_path(rel), NULL, &m));
    return m;
}

/* The model of tests/data/models/<name>, its info and its golden batch (free with golden_free and
 * nopad_model_free). */
static nopad_model *load_golden(const char *name, nopad_model_info *info, golden *g) {
    nopad_model *m = load_model(name);
    assert_nopad_ok(nopad_model_get_info(m, info));
    golden_load(name, g);
    return m;
}

static const int32_t *types_for(nopad_model *m, const golden *g) {
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(m, &info));
    return info.type_vocab_size > 0 ? g->types : NULL;
}

static void test_golden_hidden_states(void **state) {
    for (int i = 0; i < N_MODELS; i++) {
        nopad_model_info info;
        golden g;
        nopad_model *m = load_golden(MODELS[i], &info, &g);
        float *out = malloc((size_t)g.n_tokens * info.hidden_size * sizeof(float));
        for (int64_t k = 0; k < (int64_t)g.n_tokens * info.hidden_size; k++) out[k] = NAN;
        nopad_encode_params p = nopad_encode_default_params();
        p.pooling = NOPAD_POOLING_NONE;
        assert_nopad_ok(nopad_encode_packed(m, g.n_seqs, g.cu, g.ids, types_for(m, &g), &p, out, NULL));
        double err = test_max_row_rel_error(out, g.hidden, g.n_tokens, info.hidden_size);
        int longest = 0;
        for (int s = 0; s < g.n_seqs; s++)
            if (g.cu[s + 1] - g.cu[s] > longest) longest = g.cu[s + 1] - g.cu[s];
        printf("  %-13s %-10s H=%-3d heads=%d act=%-17s B=%d T=%-4d longest=%d  max row rel err %.2e\n",
               MODELS[i], info.family, info.hidden_size, info.num_heads, info.activation, g.n_seqs,
               g.n_tokens, longest, err);
        if (!(err <= GOLDEN_BOUND)) fail_msg("%s: row-relative error %.3e > %.0e", MODELS[i], err, GOLDEN_BOUND);
        assert_int_equal(longest, info.max_seq_length); /* the fixture reaches the model maximum */
        free(out);
        golden_free(&g);
        nopad_model_free(m);
    }
}

/* A batch's output equals each sequence run alone, and the library's own split of a host batch
 * (batch_tokens: forwards of at most that many tokens, in order; a budget smaller than a sequence
 * runs it alone) gives the same hidden and pooled rows, in place. 1e-5 row-relative: OpenBLAS
 * blocks GEMMs by the token count, so fp32 sums run in another order. */
static void test_packed_equals_one_by_one(void **state) {
    for (int i = 0; i < N_MODELS; i++) {
        nopad_model_info info;
        golden g;
        nopad_model *m = load_golden(MODELS[i], &info, &g);
        const int H = info.hidden_size;
        const int32_t *types = types_for(m, &g);
        float *packed = malloc((size_t)g.n_tokens * H * sizeof(float));
        float *single = malloc((size_t)g.n_tokens * H * sizeof(float));
        nopad_encode_params p = nopad_encode_default_params();
        p.pooling = NOPAD_POOLING_NONE;
        assert_nopad_ok(nopad_encode_packed(m, g.n_seqs, g.cu, g.ids, types, &p, packed, NULL));
        for (int s = 0; s < g.n_seqs; s++) {
            int32_t cu1[2] = {0, g.cu[s + 1] - g.cu[s]};
            assert_nopad_ok(nopad_encode_packed(m, 1, cu1, g.ids + g.cu[s],
                                                types ? types + g.cu[s] : NULL, &p,
                                                single + (size_t)g.cu[s] * H, NULL));
        }
        double err = test_max_row_rel_error(packed, single, g.n_tokens, H);
        if (!(err <= 1e-5)) fail_msg("%s: packed vs one-by-one row error %.3e > 1e-5", MODELS[i], err);
        float *pooled[2] = {malloc((size_t)g.n_seqs * H * sizeof(float)), malloc((size_t)g.n_seqs * H * sizeof(float))};
        nopad_encode_params mean = nopad_encode_default_params();
        mean.pooling = NOPAD_POOLING_MEAN;
        assert_nopad_ok(nopad_encode_packed(m, g.n_seqs, g.cu, g.ids, types, &mean, NULL, pooled[0]));
        const int32_t budgets[] = {1, 7, g.n_tokens / 2};
        for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
            p.batch_tokens = mean.batch_tokens = budgets[b];
            for (size_t k = 0; k < (size_t)g.n_tokens * H; k++) single[k] = NAN;
            assert_nopad_ok(nopad_encode_packed(m, g.n_seqs, g.cu, g.ids, types, &p, single, NULL));
            assert_nopad_ok(nopad_encode_packed(m, g.n_seqs, g.cu, g.ids, types, &mean, NULL, pooled[1]));
            err = fmax(test_max_row_rel_error(single, packed, g.n_tokens, H),
                       test_max_row_rel_error(pooled[1], pooled[0], g.n_seqs, H));
            if (!(err <= 1e-5)) fail_msg("%s batch_tokens %d: row error %.3e > 1e-5", MODELS[i], budgets[b], err);
        }
        free(pooled[0]);
        free(pooled[1]);
        free(packed);
        free(single);
        golden_free(&g);
        nopad_model_free(m);
    }
}

/* The padded entry packs inside and unpacks with zeros past each length. */
static void test_padded_equals_packed(void **state) {
    nopad_model_info info;
    golden g;
    nopad_model *m = load_golden("bert_a", &info, &g);
    const int H = info.hidden_size, S = info.max_seq_length, B = g.n_seqs;
    int32_t *ids = malloc((size_t)B * S * sizeof(int32_t));
    int32_t *types = malloc((size_t)B * S * sizeof(int32_t));
    int32_t *lengths = malloc((size_t)B * sizeof(int32_t));
    for (int s = 0; s < B; s++) {
        lengths[s] = g.cu[s + 1] - g.cu[s];
        for (int t = 0; t < S; t++) {
            /* padding slots hold garbage the entry must ignore */
            ids[s * S + t] = t < lengths[s] ? g.ids[g.cu[s] + t] : 7;
            types[s * S + t] = t < lengths[s] ? g.types[g.cu[s] + t] : 1;
        }
    }
    float *padded = malloc((size_t)B * S * H * sizeof(float));
    float *pooled_padded = malloc((size_t)B * H * sizeof(float));
    float *pooled_packed = malloc((size_t)B * H * sizeof(float));
    for (int64_t k = 0; k < (int64_t)B * S * H; k++) padded[k] = NAN;
    nopad_encode_params p = nopad_encode_default_params();
    p.pooling = NOPAD_POOLING_MEAN;
    const nopad_batch batch = {.layout = NOPAD_LAYOUT_PADDED, .n_seqs = B, .tokens = ids,
                               .token_type_ids = types, .lengths = lengths, .max_len = S};
    assert_nopad_ok(nopad_encode(nopad_model_context(m), &batch, &p, padded, pooled_padded));
    assert_nopad_ok(nopad_encode_packed(m, B, g.cu, g.ids, g.types, &p, NULL, pooled_packed));
    for (int s = 0; s < B; s++) {
        double err = test_max_row_rel_error(padded + (size_t)s * S * H, g.hidden + (size_t)g.cu[s] * H,
                                            lengths[s], H);
        if (!(err <= GOLDEN_BOUND)) fail_msg("padded sequence %d: error %.3e", s, err);
        for (int64_t k = (int64_t)lengths[s] * H; k < (int64_t)S * H; k++)
            if (padded[(size_t)s * S * H + k] != 0.0f) fail_msg("padding of sequence %d not zeroed", s);
    }
    assert_true(test_max_row_rel_error(pooled_padded, pooled_packed, B, H) <= 1e-6);
    free(ids);
    free(types);
    free(lengths);
    free(padded);
    free(pooled_padded);
    free(pooled_packed);
    golden_free(&g);
    nopad_model_free(m);
}

/* sentence-transformers folders: pooling and Normalize from the folder, against ST's output. */
static void test_sentence_transformers_pooling(void **state) {
    static const char *const ST_MODELS[] = {"st_mean_norm", "st_max", "st_cls_v6"};
    for (size_t i = 0; i < sizeof ST_MODELS / sizeof ST_MODELS[0]; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "models/%s/golden.safetensors", ST_MODELS[i]);
        if (access(test_data_path(rel), R_OK) != 0) continue;
        nopad_model_info info;
        golden g;
        nopad_model *m = load_golden(ST_MODELS[i], &info, &g);
        float *want = golden_copy(&g.file, "pooled", ST_F32, NULL);
        float *got = malloc((size_t)g.n_seqs * info.hidden_size * sizeof(float));
        assert_nopad_ok(nopad_encode_packed(m, g.n_seqs, g.cu, g.ids, types_for(m, &g), NULL, NULL, got));
        double err = test_max_row_rel_error(got, want, g.n_seqs, info.hidden_size);
        printf("  %-13s pooling=%d normalize=%d max row rel err %.2e\n", ST_MODELS[i], info.pooling,
               info.normalize, err);
        if (!(err <= GOLDEN_BOUND)) fail_msg("%s: pooled error %.3e", ST_MODELS[i], err);
        free(want);
        free(got);
        golden_free(&g);
        nopad_model_free(m);
    }
}

/* Every pooling mode equals the same reduction done here over the hidden states. */
static void test_pooling_modes_match_hidden(void **state) {
    nopad_model_info info;
    golden g;
    nopad_model *m = load_golden("roberta_a", &info, &g);
    const int H = info.hidden_size, B = g.n_seqs;
    float *hidden = malloc((size_t)g.n_tokens * H * sizeof(float));
    float *pooled = malloc((size_t)B * H * sizeof(float));
    float *want = malloc((size_t)B * H * sizeof(float));
    const nopad_pooling modes[] = {NOPAD_POOLING_CLS, NOPAD_POOLING_MEAN, NOPAD_POOLING_MAX};
    for (int mi = 0; mi < 3; mi++) {
        for (int norm = 0; norm < 2; norm++) {
            nopad_encode_params p = {.pooling = modes[mi], .normalize = norm};
            assert_nopad_ok(nopad_encode_packed(m, B, g.cu, g.ids, NULL, &p, hidden, pooled));
            for (int s = 0; s < B; s++) {
                for (int h = 0; h < H; h++) {
                    double acc = modes[mi] == NOPAD_POOLING_MAX ? -INFINITY : 0;
                    int start = g.cu[s], end = modes[mi] == NOPAD_POOLING_CLS ? start + 1 : g.cu[s + 1];
                    for (int t = start; t < end; t++) {
                        double v = hidden[(size_t)t * H + h];
                        acc = modes[mi] == NOPAD_POOLING_MAX ? fmax(acc, v) : acc + v;
                    }
                    if (modes[mi] == NOPAD_POOLING_MEAN) acc /= (end - start);
                    want[s * H + h] = (float)acc;
                }
                if (norm) {
                    double ss = 0;
                    for (int h = 0; h < H; h++) ss += (double)want[s * H + h] * want[s * H + h];
                    for (int h = 0; h < H; h++) want[s * H + h] /= (float)sqrt(ss);
                }
            }
            double err = test_max_row_rel_error(pooled, want, B, H);
            if (!(err <= 1e-6)) fail_msg("pooling %d normalize %d: error %.3e", modes[mi], norm, err);
        }
    }
    free(hidden);
    free(pooled);
    free(want);
    golden_free(&g);
    nopad_model_free(m);
}

/* The graph buckets (encoder_token_bucket): never below T, slack under max(16, T/16), multiples
 * of 16, the same bucket for every T between two buckets, and few of them up to the default limit. */
static void test_token_buckets(void **state) {
    int32_t prev = 0, n_buckets = 0;
    for (int32_t T = 1; T <= 1 << 20; T++) {
        const int32_t b = encoder_token_bucket(T);
        assert_true(b >= T);
        assert_int_equal(b % 16, 0);
        const int32_t slack_bound = T / 16 > 16 ? T / 16 : 16;
        if (!(b - T < slack_bound)) fail_msg("T = %d: bucket %d, slack %d >= %d", T, b, b - T, slack_bound);
        assert_true(b >= prev); /* monotone, so T in (previous bucket, b] shares b */
        if (b != prev && T <= 2048) n_buckets++;
        prev = b;
    }
    assert_int_equal(encoder_token_bucket(100), 112);
    assert_int_equal(encoder_token_bucket(2048), 2048);
    assert_int_equal(encoder_token_bucket(4352), 4352);
    assert_int_equal(encoder_token_bucket(INT32_MAX / 2), 1073741824);
    if (n_buckets > 80) fail_msg("%d buckets up to 2048 tokens", n_buckets);
}

/* Contexts: several on one model, each on its own thread, run the same batch at the same time and
 * agree with the default context (same arithmetic, so to 1e-6 row-relative); each counts its own
 * forwards and holds its own workspace (a fixed max_batch_tokens one refuses a larger batch). */
static void test_contexts(void **state) {
    nopad_model_info info;
    golden g;
    nopad_model *m = load_golden("bert_a", &info, &g);
    const int32_t H = info.hidden_size;
    const size_t n = (size_t)g.n_tokens * H;
    enum { N_CTX = 3 };
    nopad_context *ctx[N_CTX];
    ctx[0] = nopad_model_context(m);
    assert_non_null(ctx[0]);
    nopad_context_params cp = nopad_context_default_params();
    assert_nopad_ok(nopad_context_create(m, &cp, &ctx[1]));
    cp.max_batch_tokens = g.n_tokens;
    assert_nopad_ok(nopad_context_create(m, &cp, &ctx[2]));
    size_t ws_bytes = 0, be_bytes = 0;
    assert_nopad_ok(nopad_context_memory(ctx[2], &ws_bytes, &be_bytes));
    assert_true(ws_bytes > 0); /* allocated at creation */
    const nopad_batch batch = {.layout = NOPAD_LAYOUT_PACKED, .n_seqs = g.n_seqs, .tokens = g.ids,
                               .token_type_ids = types_for(m, &g), .cu_seqlens = g.cu};
    test_encode_job jobs[N_CTX];
    float *outs[N_CTX];
    pthread_t threads[N_CTX];
    for (int i = 0; i < N_CTX; i++) {
        outs[i] = malloc(n * sizeof(float));
        jobs[i] = (test_encode_job){.ctx = ctx[i], .batches = &batch, .n_batches = 1, .reps = 4, .out = &outs[i]};
        assert_int_equal(pthread_create(&threads[i], NULL, test_encode_job_run, &jobs[i]), 0);
    }
    for (int i = 0; i < N_CTX; i++) assert_int_equal(pthread_join(threads[i], NULL), 0);
    for (int i = 0; i < N_CTX; i++) {
        assert_nopad_ok(jobs[i].st);
        const double err = test_max_row_rel_error(outs[i], outs[0], g.n_tokens, H);
        if (!(err <= 1e-6)) fail_msg("context %d vs the default context: %.3e", i, err);
        const double vs_hf = test_max_row_rel_error(outs[i], g.hidden, g.n_tokens, H);
        if (!(vs_hf <= GOLDEN_BOUND)) fail_msg("context %d vs HF: %.3e", i, vs_hf);
        nopad_model_stats stats;
        assert_nopad_ok(nopad_context_get_stats(ctx[i], &stats));
        assert_int_equal(stats.forwards, 4);
    }
    /* a context's fixed workspace refuses a larger batch; the others are not affected */
    int32_t cu_big[2] = {0, g.n_tokens + 1};
    int32_t *ids_big = calloc((size_t)g.n_tokens + 1, sizeof(int32_t));
    const nopad_batch big = {.layout = NOPAD_LAYOUT_PACKED, .n_seqs = 1, .tokens = ids_big, .cu_seqlens = cu_big};
    if (g.n_tokens + 1 <= info.max_seq_length) {
        assert_nopad_error(nopad_encode(ctx[2], &big, NULL, outs[2], NULL), NOPAD_ERR_INVALID_ARGUMENT,
                           "max_batch_tokens");
    }
    assert_nopad_error(nopad_context_create(NULL, NULL, &ctx[1]), NOPAD_ERR_INVALID_ARGUMENT, "model is NULL");
    assert_null(ctx[1]);
    nopad_context_free(NULL);
    nopad_context_free(ctx[0]); /* the model's own: left alone, still usable */
    assert_nopad_ok(nopad_encode(ctx[0], &(nopad_batch){.layout = NOPAD_LAYOUT_PACKED, .n_seqs = g.n_seqs,
                                                        .tokens = g.ids, .token_type_ids = types_for(m, &g),
                                                        .cu_seqlens = g.cu},
                                 NULL, NULL, outs[0]));
    free(ids_big);
    for (int i = 0; i < N_CTX; i++) free(outs[i]);
    nopad_context_free(jobs[1].ctx);
    nopad_context_free(jobs[2].ctx);
    golden_free(&g);
    nopad_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_hidden_states),
        cmocka_unit_test(test_packed_equals_one_by_one),
        cmocka_unit_test(test_padded_equals_packed),
        cmocka_unit_test(test_sentence_transformers_pooling),
        cmocka_unit_test(test_pooling_modes_match_hidden),
        cmocka_unit_test(test_token_buckets),
        cmocka_unit_test(test_contexts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

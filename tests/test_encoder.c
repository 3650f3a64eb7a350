/* The encoder against Hugging Face: tiny random-init models of every family (fixtures made by
 * scripts/make_golden_fixtures.py), packed vs one-by-one, padded vs packed, pooling modes.
 * Bound: row-relative error <= 1e-4 against HF fp32 (both sides fp32; differences come from
 * summation order in GEMMs, softmax and LayerNorm, typically ~1e-6). The encoder's loop with
 * the LayerNorms and the attention fused into the linear layers (layernorm_linear,
 * attention_linear) against the loop of plain ops, on the CPU backend. */
#include <math.h>
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

static const int32_t *types_for(nopad_model *m, const golden *g) {
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(m, &info));
    return info.type_vocab_size > 0 ? g->types : NULL;
}

static void test_golden_hidden_states(void **state) {
    for (int i = 0; i < N_MODELS; i++) {
        nopad_model *m = load_model(MODELS[i]);
        nopad_model_info info;
        assert_nopad_ok(nopad_model_get_info(m, &info));
        golden g;
        golden_load(MODELS[i], &g);
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

/* A batch's output equals each sequence run alone. */
static void test_packed_equals_one_by_one(void **state) {
    for (int i = 0; i < N_MODELS; i++) {
        nopad_model *m = load_model(MODELS[i]);
        nopad_model_info info;
        assert_nopad_ok(nopad_model_get_info(m, &info));
        golden g;
        golden_load(MODELS[i], &g);
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
        free(packed);
        free(single);
        golden_free(&g);
        nopad_model_free(m);
    }
}

/* The padded entry packs inside and unpacks with zeros past each length. */
static void test_padded_equals_packed(void **state) {
    nopad_model *m = load_model("bert_a");
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(m, &info));
    golden g;
    golden_load("bert_a", &g);
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
    assert_nopad_ok(nopad_encode_padded(m, B, S, ids, types, lengths, &p, padded, pooled_padded));
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
        nopad_model *m = load_model(ST_MODELS[i]);
        nopad_model_info info;
        assert_nopad_ok(nopad_model_get_info(m, &info));
        golden g;
        golden_load(ST_MODELS[i], &g);
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
    nopad_model *m = load_model("roberta_a");
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(m, &info));
    golden g;
    golden_load("roberta_a", &g);
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

/* The CPU backend's fused ops, counting their calls. */
static int layernorm_linear_calls, attention_linear_calls;
static nopad_status (*cpu_layernorm_linear_op)(nopad_backend *, void *, void *, const void *, const void *,
                                                const void *, float, const void *, const void *, const void *,
                                                int32_t, int32_t, int32_t, nopad_epilogue, nopad_activation);
static nopad_status (*cpu_attention_linear_op)(nopad_backend *, void *, void *, const void *, const nopad_seqs *,
                                                int32_t, int32_t, float, const void *, const void *, const void *,
                                                int32_t, nopad_epilogue, nopad_activation);
static nopad_status counting_layernorm_linear(nopad_backend *be, void *out, void *xn, const void *x,
                                              const void *ln_weight, const void *ln_bias, float eps,
                                              const void *w, const void *bias, const void *residual,
                                              int32_t n_tokens, int32_t n_in, int32_t n_out,
                                              nopad_epilogue epilogue, nopad_activation act) {
    layernorm_linear_calls++;
    return cpu_layernorm_linear_op(be, out, xn, x, ln_weight, ln_bias, eps, w, bias, residual, n_tokens,
                                   n_in, n_out, epilogue, act);
}
static nopad_status counting_attention_linear(nopad_backend *be, void *out, void *context, const void *qkv,
                                              const nopad_seqs *seqs, int32_t n_heads, int32_t head_size,
                                              float scale, const void *w, const void *bias, const void *residual,
                                              int32_t n_out, nopad_epilogue epilogue, nopad_activation act) {
    attention_linear_calls++;
    return cpu_attention_linear_op(be, out, context, qkv, seqs, n_heads, head_size, scale, w, bias, residual,
                                   n_out, epilogue, act);
}

/* The encoder's loops (encoder_layers) with and without the fused ops, all four ways:
 * layernorm_linear takes every LayerNorm after the first layer's input (2 · layers - 1 of them:
 * the last LayerNorm has no linear layer after it) and attention_linear every attention (one per
 * layer). Same arithmetic in fp32 up to where bias and residual are added, so every way agrees
 * with the loop of plain ops to 1e-5 row-relative, and matches HF; on every family (ALBERT's
 * shared layers, DistilBERT's names). The CUDA kernels behind the fused ops are tested in
 * test_cuda_gemm. */
static void test_fused_loops(void **state) {
    for (int i = 0; i < N_MODELS; i++) {
        char rel[256], path[512];
        snprintf(rel, sizeof rel, "models/%s", MODELS[i]);
        snprintf(path, sizeof path, "%s/config.json", test_data_path(rel));
        size_t len;
        char *json = test_read_file(path, &len);
        assert_non_null(json);
        encoder_config cfg;
        assert_nopad_ok(hf_config_parse(json, len, path, &cfg));
        free(json);
        nopad_backend *be;
        assert_nopad_ok(nopad_backend_cpu_create(0, &be));
        safetensors_checkpoint ckpt;
        assert_nopad_ok(safetensors_checkpoint_open(test_data_path(rel), &ckpt));
        encoder_weights w;
        assert_nopad_ok(encoder_weights_load(be, &cfg, &ckpt, rel, &w));
        safetensors_checkpoint_close(&ckpt);
        golden g;
        golden_load(MODELS[i], &g);
        encoder_workspace ws = {0};
        assert_nopad_ok(encoder_workspace_reserve(be, &cfg, &ws, g.n_tokens, g.n_seqs));
        assert_nopad_ok(be->upload_i32(be, ws.tokens, g.ids, (size_t)g.n_tokens));
        assert_nopad_ok(be->upload_i32(be, ws.types, g.types, (size_t)g.n_tokens));
        assert_nopad_ok(be->upload_i32(be, ws.cu_seqlens, g.cu, (size_t)g.n_seqs + 1));
        int32_t longest = 0;
        for (int s = 0; s < g.n_seqs; s++)
            if (g.cu[s + 1] - g.cu[s] > longest) longest = g.cu[s + 1] - g.cu[s];
        const nopad_seqs seqs = {g.n_seqs, g.n_tokens, longest, ws.cu_seqlens};
        const size_t n = (size_t)g.n_tokens * cfg.hidden_size;
        float *out[4]; /* way = 2 · layernorm fused + attention fused */
        cpu_layernorm_linear_op = be->layernorm_linear;
        cpu_attention_linear_op = be->attention_linear;
        for (int way = 0; way < 4; way++) {
            const int fuse_ln = way / 2, fuse_attn = way % 2;
            be->layernorm_linear = fuse_ln ? counting_layernorm_linear : NULL;
            be->attention_linear = fuse_attn ? counting_attention_linear : NULL;
            layernorm_linear_calls = attention_linear_calls = 0;
            assert_nopad_ok(encoder_forward(be, &cfg, &w, &ws, &seqs, ws.tokens,
                                            cfg.type_vocab_size > 0 ? ws.types : NULL, ws.hidden));
            assert_int_equal(layernorm_linear_calls, fuse_ln ? 2 * w.n_steps - 1 : 0);
            assert_int_equal(attention_linear_calls, fuse_attn ? w.n_steps : 0);
            out[way] = malloc(n * sizeof(float));
            assert_nopad_ok(be->download_f32(be, out[way], ws.hidden, n));
        }
        be->layernorm_linear = cpu_layernorm_linear_op;
        be->attention_linear = cpu_attention_linear_op;
        for (int way = 1; way < 4; way++) {
            const double between = test_max_row_rel_error(out[way], out[0], g.n_tokens, cfg.hidden_size);
            const double vs_hf = test_max_row_rel_error(out[way], g.hidden, g.n_tokens, cfg.hidden_size);
            printf("  %-13s layernorm fused %d, attention fused %d: vs plain ops %.2e, vs HF %.2e\n", MODELS[i],
                   way / 2, way % 2, between, vs_hf);
            if (!(between <= 1e-5)) fail_msg("%s way %d: vs the loop of plain ops %.3e > 1e-5", MODELS[i], way, between);
            if (!(vs_hf <= GOLDEN_BOUND)) fail_msg("%s way %d: vs HF %.3e", MODELS[i], way, vs_hf);
        }
        for (int way = 0; way < 4; way++) free(out[way]);
        golden_free(&g);
        encoder_workspace_free(be, &ws);
        encoder_weights_free(be, &w);
        be->destroy(be);
    }
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_hidden_states),
        cmocka_unit_test(test_packed_equals_one_by_one),
        cmocka_unit_test(test_padded_equals_packed),
        cmocka_unit_test(test_sentence_transformers_pooling),
        cmocka_unit_test(test_pooling_modes_match_hidden),
        cmocka_unit_test(test_token_buckets),
        cmocka_unit_test(test_fused_loops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

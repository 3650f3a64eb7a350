/* DeBERTa-v2/v3 on the CPU against Hugging Face (scripts/make_deberta_fixtures.py): the bucket
 * function against torch's, hidden states of tiny random models covering both attention terms
 * alone and together, shared and separate position projections, log buckets of several sizes and
 * none, absolute positions or none; packed equals padded; bad configs are clear errors. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "golden.h"

/* Every distance in [-2047, 2047] must land in torch's bucket: the float32 ceil is exact or the
 * model reads another row of its position table. */
static void test_bucket_function_matches_torch(void **state) {
    safetensors_file f;
    assert_nopad_ok(safetensors_open(test_data_path("models/deberta_buckets.safetensors"), &f));
    int checked = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const safetensors_tensor *t = &f.tensors[i];
        nopad_rel_positions p = {0};
        assert_int_equal(sscanf(t->name, "buckets_%d_%d", &p.position_buckets, &p.max_relative_positions), 2);
        p.att_span = p.position_buckets;
        int64_t n;
        int32_t *want = golden_copy(&f, t->name, ST_I32, &n);
        assert_int_equal(n, 4095);
        for (int32_t d = -2047; d <= 2047; d++) {
            const int32_t got = nopad_rel_bucket(d, &p);
            if (got != want[d + 2047])
                fail_msg("%s: distance %d gives bucket %d, torch %d", t->name, d, got, want[d + 2047]);
        }
        free(want);
        checked++;
    }
    assert_true(checked >= 5);
    safetensors_close(&f);
}

/* HF's disentangled attention written out literally, in double, for one head of one sequence:
 * c2p gathers pos_key at clamp(bucket(i - j) + k), p2c gathers pos_query at
 * clamp(-bucket(j - i) + k) (HF builds p2c over (key, query) and transposes it). */
static void reference_head(double *out, const float *qkv, int32_t len, int32_t n_heads, int32_t d, int32_t h,
                           float scale, const float *pk, const float *pq, const nopad_rel_positions *rel) {
    const int32_t H = n_heads * d, k = rel->att_span;
    double *p = malloc((size_t)len * sizeof *p);
    assert_non_null(p);
    for (int32_t i = 0; i < len; i++) {
        const float *q = qkv + (size_t)i * 3 * H + (size_t)h * d;
        double mx = -INFINITY, sum = 0;
        for (int32_t j = 0; j < len; j++) {
            const float *kj = qkv + (size_t)j * 3 * H + H + (size_t)h * d;
            int32_t rc = nopad_rel_bucket(i - j, rel) + k, rp = -nopad_rel_bucket(j - i, rel) + k;
            rc = rc < 0 ? 0 : rc > 2 * k - 1 ? 2 * k - 1 : rc;
            rp = rp < 0 ? 0 : rp > 2 * k - 1 ? 2 * k - 1 : rp;
            double s = 0;
            for (int32_t e = 0; e < d; e++) {
                s += (double)q[e] * kj[e];
                if (pk) s += (double)q[e] * pk[(size_t)rc * H + (size_t)h * d + e];
                if (pq) s += (double)kj[e] * pq[(size_t)rp * H + (size_t)h * d + e];
            }
            p[j] = s * scale;
            if (p[j] > mx) mx = p[j];
        }
        for (int32_t j = 0; j < len; j++) sum += p[j] = exp(p[j] - mx);
        for (int32_t e = 0; e < d; e++) {
            double o = 0;
            for (int32_t j = 0; j < len; j++) o += p[j] / sum * qkv[(size_t)j * 3 * H + 2 * H + (size_t)h * d + e];
            out[(size_t)i * H + (size_t)h * d + e] = o;
        }
    }
    free(p);
}

/* The CPU op against the literal reference on random inputs: random lengths (1 to 300, far past
 * small tables so the clamp at both ends is hit), both terms, each alone, buckets and none. The
 * bound, 1e-5 of the output's scale, is float32 accumulation over <= 300 keys. */
static void test_attention_rel_op_against_reference(void **state) {
    nopad_backend *be = NULL;
    assert_nopad_ok(nopad_backend_cpu_create(2, &be));
    const struct { int32_t buckets, max_rel, span, c2p, p2c; } CASES[] = {
        {8, 64, 8, 1, 1}, {-1, 5, 5, 1, 1}, {256, 512, 256, 1, 1}, {16, 40, 16, 1, 0}, {32, 256, 32, 0, 1}, {4, 7, 4, 1, 1},
    };
    uint64_t rng = 25;
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        const int32_t n_heads = 3, d = 8, H = n_heads * d, B = 4, k = CASES[c].span;
        const nopad_rel_positions rel = {.att_span = k, .position_buckets = CASES[c].buckets,
                                         .max_relative_positions = CASES[c].max_rel};
        int32_t cu[5] = {0}, max_len = 0;
        for (int32_t b = 0; b < B; b++) {
            const int32_t len = b == 0 ? 1 : b == 1 ? 300 : 1 + (int32_t)(test_rand_u32(&rng) % 120);
            cu[b + 1] = cu[b] + len;
            if (len > max_len) max_len = len;
        }
        const int32_t T = cu[B];
        float *qkv = malloc((size_t)T * 3 * H * sizeof *qkv), *pk = malloc((size_t)2 * k * H * sizeof *pk);
        float *pq = malloc((size_t)2 * k * H * sizeof *pq), *out = malloc((size_t)T * H * sizeof *out);
        double *want = malloc((size_t)T * H * sizeof *want);
        assert_true(qkv && pk && pq && out && want);
        test_fill_uniform(qkv, (int64_t)T * 3 * H, -1.0f, 1.0f, &rng);
        test_fill_uniform(pk, (int64_t)2 * k * H, -1.0f, 1.0f, &rng);
        test_fill_uniform(pq, (int64_t)2 * k * H, -1.0f, 1.0f, &rng);
        const float scale = 1.0f / sqrtf((float)d * 3.0f);
        const nopad_seqs seqs = {.n_seqs = B, .n_tokens = T, .max_seqlen = max_len, .cu_seqlens = cu};
        assert_nopad_ok(be->attention_rel(be, out, qkv, &seqs, n_heads, d, scale, CASES[c].c2p ? pk : NULL,
                                          CASES[c].p2c ? pq : NULL, &rel));
        for (int32_t b = 0; b < B; b++)
            for (int32_t h = 0; h < n_heads; h++)
                reference_head(want + (size_t)cu[b] * H, qkv + (size_t)cu[b] * 3 * H, cu[b + 1] - cu[b], n_heads, d,
                               h, scale, CASES[c].c2p ? pk : NULL, CASES[c].p2c ? pq : NULL, &rel);
        double err = 0;
        for (int64_t i = 0; i < (int64_t)T * H; i++) {
            const double e = fabs(out[i] - want[i]);
            if (!(e <= err)) err = e;
        }
        printf("  buckets %4d max_rel %4d k %3d c2p %d p2c %d: max |out - reference| %.2e\n", CASES[c].buckets,
               CASES[c].max_rel, k, CASES[c].c2p, CASES[c].p2c, err);
        if (!(err <= 1e-5)) fail_msg("case %zu: error %.3e > 1e-5", c, err);
        free(qkv), free(pk), free(pq), free(out), free(want);
    }
    be->destroy(be);
}

static const char *const MODELS[] = {"deberta_v3_a", "deberta_v2_b", "deberta_c2p", "deberta_p2c"};

/* HF's fp32 hidden states within 1e-4 row-relative error (the fp32 bound of test_encoder.c: the
 * sums run in another order than torch's, and softmax and LayerNorm amplify a few ulps; observed
 * errors are ~1e-6). The padded layout of the same batch gives the same rows bit for bit (it is
 * packed on entry, then the same forward). */
static void test_hidden_states_match_hf(void **state) {
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "models/%s", MODELS[i]);
        nopad_model *m = NULL;
        assert_nopad_ok(nopad_model_load(test_data_path(rel), NULL, &m));
        nopad_model_info info;
        assert_nopad_ok(nopad_model_get_info(m, &info));
        assert_string_equal(info.model_type, "deberta-v2");
        snprintf(rel, sizeof rel, "models/%s/golden.safetensors", MODELS[i]);
        safetensors_file f;
        assert_nopad_ok(safetensors_open(test_data_path(rel), &f));
        int64_t T, n_cu;
        int32_t *ids = golden_copy(&f, "input_ids", ST_I32, &T);
        int32_t *types = golden_copy(&f, "token_type_ids", ST_I32, NULL);
        int32_t *cu = golden_copy(&f, "cu_seqlens", ST_I32, &n_cu);
        float *want = golden_copy(&f, "last_hidden_state", ST_F32, NULL);
        const int32_t B = (int32_t)n_cu - 1, H = info.hidden_size;
        float *out = malloc((size_t)T * H * sizeof *out);
        assert_non_null(out);
        nopad_encode_params p = nopad_encode_default_params();
        p.pooling = NOPAD_POOLING_NONE;
        assert_nopad_ok(nopad_encode_packed(m, B, cu, ids, info.type_vocab_size > 0 ? types : NULL, &p,
                                            out, NULL));
        const double err = test_max_row_rel_error(out, want, T, H);
        printf("  %-13s B=%d T=%-4d max row rel err %.2e\n", MODELS[i], B, (int)T, err);
        if (!(err <= 1e-4)) fail_msg("%s: row-relative error %.3e > 1e-4", MODELS[i], err);

        int32_t max_len = 0;
        for (int32_t s = 0; s < B; s++)
            if (cu[s + 1] - cu[s] > max_len) max_len = cu[s + 1] - cu[s];
        int32_t *pad_ids = calloc((size_t)B * max_len, sizeof *pad_ids);
        int32_t *pad_types = calloc((size_t)B * max_len, sizeof *pad_types);
        int32_t *lengths = malloc((size_t)B * sizeof *lengths);
        float *padded = malloc((size_t)B * max_len * H * sizeof *padded);
        assert_true(pad_ids && pad_types && lengths && padded);
        for (int32_t s = 0; s < B; s++) {
            lengths[s] = cu[s + 1] - cu[s];
            memcpy(pad_ids + (size_t)s * max_len, ids + cu[s], (size_t)lengths[s] * sizeof *ids);
            memcpy(pad_types + (size_t)s * max_len, types + cu[s], (size_t)lengths[s] * sizeof *ids);
        }
        nopad_batch b = {.layout = NOPAD_LAYOUT_PADDED, .n_seqs = B, .max_len = max_len,
                         .tokens = pad_ids, .token_type_ids = info.type_vocab_size > 0 ? pad_types : NULL,
                         .lengths = lengths};
        assert_nopad_ok(nopad_encode(nopad_model_context(m), &b, &p, padded, NULL));
        for (int32_t s = 0; s < B; s++)
            assert_memory_equal(padded + (size_t)s * max_len * H, out + (size_t)cu[s] * H,
                                (size_t)lengths[s] * H * sizeof(float));
        free(pad_ids), free(pad_types), free(lengths), free(padded);
        free(out), free(want), free(cu), free(types), free(ids);
        safetensors_close(&f);
        nopad_model_free(m);
    }
}

/* A copy of deberta_v3_a whose config.json has `from` replaced by `to`; returns the folder. */
static const char *edited_copy(int slot, const char *from, const char *to) {
    const char *dir = test_make_temp_dir(slot);
    char path[4096], cmd[8192];
    snprintf(cmd, sizeof cmd, "cp '%s'/model.safetensors '%s'/", test_data_path("models/deberta_v3_a"), dir);
    assert_int_equal(system(cmd), 0);
    size_t len;
    char *json = test_read_file(test_data_path("models/deberta_v3_a/config.json"), &len);
    assert_non_null(json);
    char *at = strstr(json, from);
    if (!at) fail_msg("config.json has no '%s'", from);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(json, 1, (size_t)(at - json), f);
    fputs(to, f);
    fputs(at + strlen(from), f);
    fclose(f);
    free(json);
    return dir;
}

static void expect_load_error(int slot, const char *from, const char *to, nopad_status want,
                              const char *needle) {
    const char *dir = edited_copy(slot, from, to);
    nopad_model *m = NULL;
    const nopad_status st = nopad_model_load(dir, NULL, &m);
    const char *msg = nopad_last_error();
    printf("  %-45s -> %s\n", to, msg);
    assert_int_equal(st, want);
    assert_null(m);
    if (!strstr(msg, needle)) fail_msg("message '%s' does not name '%s'", msg, needle);
    /* config errors name config.json; a missing tensor names the folder (the checkpoint may be
     * sharded) */
    if (!strstr(msg, want == NOPAD_ERR_UNSUPPORTED || strcmp(needle, "pos_key_proj") ? "config.json" : dir))
        fail_msg("message '%s' does not name the file", msg);
}

static void test_bad_configs_are_clear_errors(void **state) {
    expect_load_error(0, "\"pos_att_type\": [\n    \"p2c\",\n    \"c2p\"\n  ]",
                      "\"pos_att_type\": [\"p2c\", \"p2p\"]", NOPAD_ERR_UNSUPPORTED, "pos_att_type");
    expect_load_error(1, "\"relative_attention\": true", "\"relative_attention\": false",
                      NOPAD_ERR_UNSUPPORTED, "relative_attention");
    expect_load_error(2, "\"norm_rel_ebd\": \"layer_norm\"", "\"norm_rel_ebd\": \"batch_norm\"",
                      NOPAD_ERR_UNSUPPORTED, "norm_rel_ebd");
    expect_load_error(3, "\"position_buckets\": 8", "\"position_buckets\": 8, \"conv_kernel_size\": 3",
                      NOPAD_ERR_UNSUPPORTED, "conv_kernel_size");
    expect_load_error(4, "\"position_buckets\": 8", "\"position_buckets\": 200",
                      NOPAD_ERR_UNSUPPORTED, "position_buckets");
    expect_load_error(5, "\"hidden_act\": \"gelu\"", "\"hidden_act\": \"mish\"",
                      NOPAD_ERR_UNSUPPORTED, "hidden_act");
    expect_load_error(6, "\"share_att_key\": true", "\"share_att_key\": \"yes\"",
                      NOPAD_ERR_FORMAT, "share_att_key");
    /* separate projections asked for, shared ones in the file: the missing tensor is named */
    expect_load_error(7, "\"share_att_key\": true", "\"share_att_key\": false",
                      NOPAD_ERR_FORMAT, "pos_key_proj");
    /* the '|'-joined string form real DeBERTa-v3 configs use, in any case and spacing */
    const char *dir = edited_copy(8, "\"pos_att_type\": [\n    \"p2c\",\n    \"c2p\"\n  ]",
                                  "\"pos_att_type\": \"P2C | c2p\"");
    nopad_model *m = NULL;
    assert_nopad_ok(nopad_model_load(dir, NULL, &m));
    nopad_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bucket_function_matches_torch),
        cmocka_unit_test(test_attention_rel_op_against_reference),
        cmocka_unit_test(test_hidden_states_match_hf),
        cmocka_unit_test(test_bad_configs_are_clear_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

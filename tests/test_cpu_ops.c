/* The CPU backend's ops against direct double-precision formulas on random data and random
 * lengths (1 and the maximum included). The CPU ops are the reference every CUDA op is tested
 * against, so they get their own check here. Bound: 1e-5 relative (fp32 vs fp64 evaluation). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "testutil.h"

static nopad_backend *be;

static int setup(void **state) { return nopad_backend_cpu_create(2, &be) == NOPAD_OK ? 0 : -1; }
static int teardown(void **state) {
    be->destroy(be);
    return 0;
}

/* Random lengths in [1, max_len], first one 1 and last one max_len. */
static int32_t *random_cu_seqlens(int32_t n_seqs, int32_t max_len, uint64_t *rng) {
    int32_t *cu = malloc(((size_t)n_seqs + 1) * sizeof *cu);
    cu[0] = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        int32_t len = s == 0 ? 1 : s == n_seqs - 1 ? max_len : 1 + (int32_t)(test_rand_u32(rng) % max_len);
        cu[s + 1] = cu[s] + len;
    }
    return cu;
}

static void reference_attention(double *out, const float *qkv, const int32_t *cu, int32_t n_seqs,
                                int32_t heads, int32_t d, double scale, int causal) {
    const int32_t H = heads * d;
    for (int32_t s = 0; s < n_seqs; s++) {
        const int32_t start = cu[s], len = cu[s + 1] - cu[s];
        double *p = malloc((size_t)len * sizeof *p);
        for (int32_t h = 0; h < heads; h++) {
            for (int32_t i = 0; i < len; i++) {
                const float *q = qkv + (size_t)(start + i) * 3 * H + h * d;
                int32_t n_keys = causal ? i + 1 : len;
                double mx = -INFINITY, sum = 0;
                for (int32_t j = 0; j < n_keys; j++) {
                    const float *k = qkv + (size_t)(start + j) * 3 * H + H + h * d;
                    double dot = 0;
                    for (int32_t c = 0; c < d; c++) dot += (double)q[c] * k[c];
                    p[j] = dot * scale;
                    mx = fmax(mx, p[j]);
                }
                for (int32_t j = 0; j < n_keys; j++) sum += (p[j] = exp(p[j] - mx));
                for (int32_t c = 0; c < d; c++) {
                    double acc = 0;
                    for (int32_t j = 0; j < n_keys; j++)
                        acc += p[j] * qkv[(size_t)(start + j) * 3 * H + 2 * H + h * d + c];
                    out[(size_t)(start + i) * H + h * d + c] = acc / sum;
                }
            }
        }
        free(p);
    }
}

static double max_rel_vs_double(const float *got, const double *want, int64_t rows, int64_t cols) {
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double diff = 0, ref = 0;
        for (int64_t c = 0; c < cols; c++) {
            double d = got[r * cols + c] - want[r * cols + c];
            diff += d * d;
            ref += want[r * cols + c] * want[r * cols + c];
        }
        double rel = sqrt(diff) / fmax(sqrt(ref), 1e-12);
        if (!(rel <= worst)) worst = isnan(rel) ? INFINITY : fmax(worst, rel);
    }
    return worst;
}

static void test_attention_varlen(void **state) {
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    const int32_t head_sizes[] = {32, 64, 128, 12};
    const int32_t max_lens[] = {1, 7, 130, 300};
    const int32_t batches[] = {1, 5, 40};
    for (int hi = 0; hi < 4; hi++)
        for (int li = 0; li < 4; li++)
            for (int bi = 0; bi < 3; bi++)
                for (int causal = 0; causal < 2; causal++) {
                    const int32_t d = head_sizes[hi], heads = 3, B = batches[bi];
                    int32_t *cu = random_cu_seqlens(B, max_lens[li], &rng);
                    const int32_t T = cu[B], H = heads * d;
                    int32_t max_seqlen = 0;
                    for (int s = 0; s < B; s++)
                        if (cu[s + 1] - cu[s] > max_seqlen) max_seqlen = cu[s + 1] - cu[s];
                    float *qkv = malloc((size_t)T * 3 * H * sizeof(float));
                    float *out = malloc((size_t)T * H * sizeof(float));
                    double *want = malloc((size_t)T * H * sizeof(double));
                    test_fill_uniform(qkv, (int64_t)T * 3 * H, -2.0f, 2.0f, &rng);
                    for (int64_t k = 0; k < (int64_t)T * H; k++) out[k] = NAN; /* poison */
                    nopad_seqs seqs = {.n_seqs = B, .n_tokens = T, .max_seqlen = max_seqlen, .cu_seqlens = cu};
                    const float scale = 1.0f / sqrtf((float)d);
                    assert_int_equal(be->attention(be, out, qkv, &seqs, heads, d, scale, causal), NOPAD_OK);
                    reference_attention(want, qkv, cu, B, heads, d, scale, causal);
                    double err = max_rel_vs_double(out, want, T, H);
                    if (!(err <= 1e-5))
                        fail_msg("attention d=%d max_len=%d B=%d causal=%d: error %.3e", d,
                                 max_lens[li], B, causal, err);
                    free(cu);
                    free(qkv);
                    free(out);
                    free(want);
                }
}

static double activation_ref(double x, nopad_activation act) {
    switch (act) {
    case NOPAD_ACT_GELU: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    case NOPAD_ACT_GELU_TANH: return 0.5 * x * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
    case NOPAD_ACT_RELU: return x > 0 ? x : 0;
    case NOPAD_ACT_SILU: return x / (1 + exp(-x));
    case NOPAD_ACT_TANH: return tanh(x);
    }
    return x;
}

static void test_linear_epilogues(void **state) {
    uint64_t rng = 12345;
    const int32_t T = 37, K = 50, N = 23;
    float *x = malloc(sizeof(float) * T * K), *w = malloc(sizeof(float) * N * K);
    float *b = malloc(sizeof(float) * N), *r = malloc(sizeof(float) * T * N);
    float *out = malloc(sizeof(float) * T * N);
    double *want = malloc(sizeof(double) * T * N);
    test_fill_uniform(x, T * K, -1, 1, &rng);
    test_fill_uniform(w, N * K, -1, 1, &rng);
    test_fill_uniform(b, N, -1, 1, &rng);
    test_fill_uniform(r, T * N, -1, 1, &rng);
    for (int epi = NOPAD_EPILOGUE_NONE; epi <= NOPAD_EPILOGUE_BIAS_RESIDUAL; epi++)
        for (int act = NOPAD_ACT_GELU; act <= NOPAD_ACT_RELU; act++) {
            for (int t = 0; t < T; t++)
                for (int n = 0; n < N; n++) {
                    double acc = 0;
                    for (int k = 0; k < K; k++) acc += (double)x[t * K + k] * w[n * K + k];
                    if (epi != NOPAD_EPILOGUE_NONE) acc += b[n];
                    if (epi == NOPAD_EPILOGUE_BIAS_ACT) acc = activation_ref(acc, (nopad_activation)act);
                    if (epi == NOPAD_EPILOGUE_BIAS_RESIDUAL) acc += r[t * N + n];
                    want[t * N + n] = acc;
                }
            for (int k = 0; k < T * N; k++) out[k] = NAN;
            assert_int_equal(be->gemm(be, out, x, w, b, r, T, K, N, (nopad_epilogue)epi,
                                        (nopad_activation)act), NOPAD_OK);
            double err = max_rel_vs_double(out, want, T, N);
            if (!(err <= 1e-5)) fail_msg("linear epilogue %d act %d: error %.3e", epi, act, err);
        }
    /* residual aliasing the output, as the encoder may use it */
    memcpy(out, r, sizeof(float) * T * N);
    assert_int_equal(be->gemm(be, out, x, w, b, out, T, K, N, NOPAD_EPILOGUE_BIAS_RESIDUAL, 0), NOPAD_OK);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double acc = b[n] + r[t * N + n];
            for (int k = 0; k < K; k++) acc += (double)x[t * K + k] * w[n * K + k];
            want[t * N + n] = acc;
        }
    assert_true(max_rel_vs_double(out, want, T, N) <= 1e-5);
    free(x); free(w); free(b); free(r); free(out); free(want);
}

static void test_layernorms_and_embedding(void **state) {
    uint64_t rng = 777;
    const int32_t B = 6, D = 40, V = 30, P = 20, TV = 3, offset = 2;
    int32_t *cu = random_cu_seqlens(B, P - offset, &rng);
    const int32_t T = cu[B];
    int32_t *tokens = malloc(sizeof(int32_t) * T), *types = malloc(sizeof(int32_t) * T);
    for (int t = 0; t < T; t++) {
        tokens[t] = (int32_t)(test_rand_u32(&rng) % V);
        types[t] = (int32_t)(test_rand_u32(&rng) % TV);
    }
    float *word = malloc(sizeof(float) * V * D), *pos = malloc(sizeof(float) * P * D);
    float *type = malloc(sizeof(float) * TV * D), *g = malloc(sizeof(float) * D), *bb = malloc(sizeof(float) * D);
    float *out = malloc(sizeof(float) * T * D), *res = malloc(sizeof(float) * T * D);
    double *want = malloc(sizeof(double) * T * D);
    test_fill_uniform(word, V * D, -1, 1, &rng);
    test_fill_uniform(pos, P * D, -1, 1, &rng);
    test_fill_uniform(type, TV * D, -1, 1, &rng);
    test_fill_uniform(g, D, 0.5f, 1.5f, &rng);
    test_fill_uniform(bb, D, -0.5f, 0.5f, &rng);
    const float eps = 1e-5f;
    nopad_seqs seqs = {.n_seqs = B, .n_tokens = T, .max_seqlen = P - offset, .cu_seqlens = cu};
    assert_int_equal(be->embed(be, out, tokens, types, &seqs, offset, V, P, TV, word, pos, type, g,
                                         bb, eps, D), NOPAD_OK);
    for (int s = 0; s < B; s++)
        for (int t = cu[s]; t < cu[s + 1]; t++) {
            double v[64], mean = 0, var = 0;
            for (int i = 0; i < D; i++) {
                v[i] = (double)word[tokens[t] * D + i] + pos[(offset + t - cu[s]) * D + i] + type[types[t] * D + i];
                mean += v[i] / D;
            }
            for (int i = 0; i < D; i++) var += (v[i] - mean) * (v[i] - mean) / D;
            for (int i = 0; i < D; i++) want[t * D + i] = (v[i] - mean) / sqrt(var + eps) * g[i] + bb[i];
        }
    assert_true(max_rel_vs_double(out, want, T, D) <= 1e-5);

    /* bias + residual + LayerNorm in place */
    test_fill_uniform(res, T * D, -3, 3, &rng);
    for (int t = 0; t < T; t++) {
        double v[64], mean = 0, var = 0;
        for (int i = 0; i < D; i++) {
            v[i] = (double)out[t * D + i] + bb[i] + res[t * D + i];
            mean += v[i] / D;
        }
        for (int i = 0; i < D; i++) var += (v[i] - mean) * (v[i] - mean) / D;
        for (int i = 0; i < D; i++) want[t * D + i] = (v[i] - mean) / sqrt(var + eps) * g[i] + bb[i];
    }
    assert_int_equal(be->layernorm(be, out, bb, res, g, bb, eps, T, D), NOPAD_OK);
    assert_true(max_rel_vs_double(out, want, T, D) <= 1e-5);
    free(cu); free(tokens); free(types); free(word); free(pos); free(type); free(g); free(bb);
    free(out); free(res); free(want);
}

/* ---- row_argmax: a rank's greedy choice over its share of the vocabulary ----------------------- */

/* What a row holds: logits as a language model's look (a few strong ids over a normal spread),
 * ties among a few values (+0 and -0 among them), some -inf, one finite value among -inf, a
 * spread over hundreds of nats (most terms underflow), then the rows without a choice. */
typedef enum argmax_row {
    ARGMAX_LOGITS, ARGMAX_TIES, ARGMAX_SOME_NEG_INF, ARGMAX_ONE_FINITE, ARGMAX_WIDE,
    ARGMAX_ALL_NEG_INF, ARGMAX_NAN, ARGMAX_POS_INF, ARGMAX_NAN_AND_INF, ARGMAX_ROW_KINDS
} argmax_row;

static float rand_normal(uint64_t *rng) {
    const double u1 = ((test_rand_u32(rng) >> 8) + 1) / 16777217.0, u2 = (test_rand_u32(rng) >> 8) / 16777216.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static int32_t rand_below(uint64_t *rng, int32_t n) { return (int32_t)(test_rand_u32(rng) % (uint32_t)n); }

static void fill_argmax_row(float *x, int32_t cols, argmax_row kind, uint64_t *rng) {
    static const float TIE_VALUES[] = {2.5f, 0.0f, -0.0f, -1.0f, 2.5f, 0.5f};
    const float sd = kind == ARGMAX_WIDE ? 300.0f : 1.0f + 3.0f * (test_rand_u32(rng) >> 8) / 16777216.0f;
    for (int32_t j = 0; j < cols; j++)
        x[j] = kind == ARGMAX_TIES ? TIE_VALUES[rand_below(rng, 6)] : sd * rand_normal(rng);
    if (cols == 0) return;
    if (kind == ARGMAX_LOGITS)
        for (int32_t p = rand_below(rng, 6); p > 0; p--) x[rand_below(rng, cols)] += 5.0f + 10.0f * rand_normal(rng) * rand_normal(rng);
    const int32_t keep = rand_below(rng, cols);
    for (int32_t j = 0; j < cols; j++) {
        const int drop = kind == ARGMAX_ALL_NEG_INF || (kind == ARGMAX_ONE_FINITE && j != keep) ||
                         ((kind == ARGMAX_SOME_NEG_INF || kind >= ARGMAX_NAN) && rand_below(rng, 10) < 4);
        if (drop) x[j] = -INFINITY;
    }
    if (kind == ARGMAX_NAN || kind == ARGMAX_NAN_AND_INF) x[rand_below(rng, cols)] = NAN;
    if (kind == ARGMAX_POS_INF || kind == ARGMAX_NAN_AND_INF) x[rand_below(rng, cols)] = INFINITY;
}

/* cpu_row_argmax against test_reference_row_argmax: rows 1, 7, 300 x cols 1, 13, 5000 (and 0),
 * each row in a leading dimension wider than cols whose extra columns (FLT_MAX or NaN) must be
 * ignored, ids from id0 != 0. Max and id exact (bits: -0 and +0 differ), the exp-sum within
 * test_expsum_bound of a double sum (the op sums exp(x - max) in double, as sample_token does); rows without a choice exactly {NaN, -1, 0} (NaN,
 * +inf) or {-inf, -1, 0} (-inf only, no columns). */
static void test_row_argmax(void **state) {
    uint64_t rng = 0x5DEECE66Dull;
    static const int32_t ROWS[] = {1, 7, 300}, COLS[] = {0, 1, 13, 5000};
    double worst = 0.0, worst_of_bound = 0.0;
    int64_t checked = 0, no_choice = 0;
    for (int ri = 0; ri < 3; ri++)
        for (int ci = 0; ci < 4; ci++) {
            const int32_t rows = ROWS[ri], cols = COLS[ci], ld = cols + 1 + rand_below(&rng, 9);
            const int32_t id0 = 1 + rand_below(&rng, 100000);
            const float pad = (ri + ci) % 2 ? FLT_MAX : NAN;
            float *x = malloc((size_t)rows * ld * sizeof *x);          /* [rows, ld] */
            float *best = malloc((size_t)rows * 3 * sizeof *best);     /* [rows, 3] */
            for (int32_t r = 0; r < rows; r++) {
                /* one row holds only logits; more rows go through every kind */
                const argmax_row kind = rows == 1 ? ARGMAX_LOGITS : (argmax_row)(r % ARGMAX_ROW_KINDS);
                fill_argmax_row(x + (size_t)r * ld, cols, kind, &rng);
                for (int32_t j = cols; j < ld; j++) x[(size_t)r * ld + j] = pad;
            }
            for (int32_t k = 0; k < rows * 3; k++) best[k] = 12345.0f; /* poison */
            assert_nopad_ok(be->row_argmax(be, best, x, rows, cols, ld, id0));
            for (int32_t r = 0; r < rows; r++) {
                const test_argmax_ref want = test_reference_row_argmax(x + (size_t)r * ld, cols);
                const float *got = best + (size_t)r * 3;
                char where[96];
                snprintf(where, sizeof where, "row_argmax rows %d cols %d ld %d id0 %d, row %d", rows, cols, ld,
                         id0, r);
                checked++;
                if (want.bad || want.at < 0) {
                    no_choice++;
                    const int ok = want.bad ? isnan(got[0]) : got[0] == -INFINITY;
                    if (!ok || got[1] != -1.0f || got[2] != 0.0f)
                        fail_msg("%s: {%g, %g, %g}, want {%s, -1, 0}", where, got[0], got[1], got[2],
                                 want.bad ? "NaN" : "-inf");
                    continue;
                }
                if (memcmp(&got[0], &want.top, sizeof want.top) != 0 || got[1] != (float)(id0 + want.at))
                    fail_msg("%s: max %.9g at id %.0f, want %.9g at id %d", where, got[0], got[1], want.top,
                             id0 + want.at);
                const double err = fabs(got[2] - want.z) / want.z, bound = test_expsum_bound(cols, want.spread, 0);
                if (!(err <= bound)) fail_msg("%s: exp-sum %.9g, want %.17g: error %.3e over %.3e", where, got[2], want.z, err, bound);
                worst = fmax(worst, err);
                worst_of_bound = fmax(worst_of_bound, err / bound);
            }
            free(x);
            free(best);
        }
    printf("  row_argmax: %lld rows (%lld without a choice), exp-sum error at most %.2e (%.2f of its bound)\n",
           (long long)checked, (long long)no_choice, worst, worst_of_bound);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_varlen),
        cmocka_unit_test(test_linear_epilogues),
        cmocka_unit_test(test_layernorms_and_embedding),
        cmocka_unit_test(test_row_argmax),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* Sampling (issue 21): greedy and the repetition penalty, HF's warpers against probabilities
 * computed here in double from transformers' definitions (logits_process.py), the
 * counter-based draw, the errors, and the reuse of the scratch; OpenAI's presence and frequency
 * penalties and logit_bias against a plain reference, and the top log-probabilities against a
 * softmax in double (issue 44). Logits are random with fixed
 * seeds; nothing here is timed against a bound (the last test prints ns per call). */
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/sampling.h"

static const double TWO_PI = 6.283185307179586;

/* ---- helpers -------------------------------------------------------------------------------- */

static nopad_sampling_params sampled(float temperature) {
    nopad_sampling_params p = nopad_sampling_default_params();
    p.temperature = temperature;
    p.seed = 20260521;
    return p;
}

/* Logits ~ N(0, sd^2) (Box-Muller), the rough shape of a language model's. */
static void fill_normal(float *x, int64_t n, double sd, uint64_t *state) {
    for (int64_t i = 0; i < n; i++) {
        double u1 = (test_rand_u32(state) + 1.0) / 4294967297.0;
        double u2 = test_rand_u32(state) / 4294967296.0;
        x[i] = (float)(sd * sqrt(-2.0 * log(u1)) * cos(TWO_PI * u2));
    }
}

static int32_t argmax_lowest(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int32_t draw(sampler_scratch *s, const float *x, int32_t vocab,
                    const nopad_sampling_params *p, const int32_t *hist, int32_t n_hist,
                    uint64_t step, float *logprob) {
    int32_t id = -1;
    assert_nopad_ok(sample_token(s, x, vocab, p, hist, n_hist, step, &id, logprob));
    assert_true(id >= 0 && id < vocab);
    return id;
}

/* ---- the reference: HF's processors and warpers, literally, in double ------------------------ */

typedef struct ranked {
    double y;
    int32_t id;
} ranked;

/* torch.sort(scores, descending=False) with the tie rule of sampling.h: among equal scores the
 * higher id comes first, so the lower id ranks as the more likely. */
static int by_score_ascending(const void *a, const void *b) {
    const ranked *p = a, *q = b;
    if (p->y != q->y) return p->y < q->y ? -1 : 1;
    return q->id - p->id;
}

static int by_double_descending(const void *a, const void *b) {
    double p = *(const double *)a, q = *(const double *)b;
    return p > q ? -1 : p < q ? 1 : 0;
}

static void softmax(const double *y, int32_t n, double *out) {
    double m = -INFINITY, z = 0;
    for (int32_t i = 0; i < n; i++) m = y[i] > m ? y[i] : m;
    for (int32_t i = 0; i < n; i++) z += (out[i] = exp(y[i] - m));
    for (int32_t i = 0; i < n; i++) out[i] /= z;
}

/* The final distribution of a sampled call: probs[vocab], 0 for removed ids. Returns the count of
 * ids kept. RepetitionPenaltyLogitsProcessor (a mask of the distinct ids of the history), then
 * TemperatureLogitsWarper, TopKLogitsWarper (removes scores < the k-th largest), TopPLogitsWarper
 * (sorts ascending, removes cumulative softmax <= 1 - top_p, keeps the last), MinPLogitsWarper
 * (removes probs < min_p x the top prob). */
static int32_t ref_probs(const float *logits, int32_t vocab, const nopad_sampling_params *p,
                         const int32_t *hist, int32_t n_hist, double *probs) {
    double *y = malloc((size_t)vocab * sizeof *y);
    double *tmp = malloc((size_t)vocab * sizeof *tmp);
    ranked *r = malloc((size_t)vocab * sizeof *r);
    unsigned char *in_hist = calloc((size_t)vocab, 1);
    assert_true(y && tmp && r && in_hist);
    for (int32_t h = 0; h < n_hist; h++) in_hist[hist[h]] = 1;
    const double pen = p->repetition_penalty;
    for (int32_t i = 0; i < vocab; i++) {
        y[i] = logits[i];
        if (in_hist[i]) y[i] = y[i] < 0 ? y[i] * pen : y[i] / pen;
        y[i] /= p->temperature;
    }
    if (p->top_k > 0 && p->top_k < vocab) {
        memcpy(tmp, y, (size_t)vocab * sizeof *y);
        qsort(tmp, (size_t)vocab, sizeof *tmp, by_double_descending);
        double kth = tmp[p->top_k - 1];
        for (int32_t i = 0; i < vocab; i++)
            if (y[i] < kth) y[i] = -INFINITY;
    }
    if (p->top_p < 1.0f) {
        for (int32_t i = 0; i < vocab; i++) r[i] = (ranked){y[i], i};
        qsort(r, (size_t)vocab, sizeof *r, by_score_ascending);
        for (int32_t j = 0; j < vocab; j++) tmp[j] = r[j].y;
        softmax(tmp, vocab, tmp);
        double cum = 0;
        for (int32_t j = 0; j < vocab - 1; j++) { // the last (most likely) always stays
            cum += tmp[j];
            if (cum <= 1.0 - (double)p->top_p) y[r[j].id] = -INFINITY;
        }
    }
    if (p->min_p > 0.0f) {
        softmax(y, vocab, tmp);
        double top = 0;
        for (int32_t i = 0; i < vocab; i++) top = tmp[i] > top ? tmp[i] : top;
        for (int32_t i = 0; i < vocab; i++)
            if (tmp[i] < (double)p->min_p * top) y[i] = -INFINITY;
    }
    softmax(y, vocab, probs);
    int32_t kept = 0;
    for (int32_t i = 0; i < vocab; i++) kept += probs[i] > 0;
    free(y);
    free(tmp);
    free(r);
    free(in_hist);
    return kept;
}

/* ---- the chi-square test of the draws -------------------------------------------------------- */

enum { DRAWS = 200000, SMALL_V = 8 };

/* The chi-square quantile at upper tail probability 1e-6 for 1..7 degrees of freedom (the
 * inverse of the regularised upper incomplete gamma function Q(df/2, x/2) = 1e-6): a correct
 * sampler fails one case in a million. */
static const double CHI2_BOUND_1E6[SMALL_V] = {0, 23.93, 27.63, 30.67, 33.38, 35.89, 38.26, 40.52};

/* Draws DRAWS ids with steps 0..DRAWS-1 and checks them against the reference: no removed id is
 * ever drawn, every logprob is log(prob), and the frequencies pass the chi-square bound. The
 * counts go to `counts` [SMALL_V]; the reference probabilities to `probs` [SMALL_V]. */
static void check_draws(const char *label, const float *x, const nopad_sampling_params *p,
                        const int32_t *hist, int32_t n_hist, long *counts, double *probs) {
    int32_t kept = ref_probs(x, SMALL_V, p, hist, n_hist, probs);
    memset(counts, 0, SMALL_V * sizeof *counts);
    sampler_scratch s;
    sampler_scratch_init(&s);
    double worst_logprob = 0;
    for (uint64_t step = 0; step < DRAWS; step++) {
        float lp;
        int32_t id = draw(&s, x, SMALL_V, p, hist, n_hist, step, &lp);
        if (probs[id] == 0) fail_msg("%s: step %d drew id %d, which the warpers remove", label,
                                     (int)step, id);
        double err = fabs(lp - log(probs[id]));
        worst_logprob = err > worst_logprob ? err : worst_logprob;
        counts[id]++;
    }
    sampler_scratch_free(&s);
    assert_true(worst_logprob < 1e-5);

    double chi2 = 0;
    char ids[256] = "";
    for (int32_t i = 0; i < SMALL_V; i++) {
        if (probs[i] == 0) {
            assert_int_equal(counts[i], 0);
            continue;
        }
        double expect = DRAWS * probs[i];
        chi2 += (counts[i] - expect) * (counts[i] - expect) / expect;
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), " %d:%.4f/%.4f", i, probs[i],
                 (double)counts[i] / DRAWS);
    }
    printf("  %-34s kept %d (id:prob/freq)%s  chi2 %.2f (bound %.2f)\n", label, kept, ids, chi2,
           CHI2_BOUND_1E6[kept - 1]);
    if (kept > 1 && !(chi2 < CHI2_BOUND_1E6[kept - 1]))
        fail_msg("%s: chi2 %.2f over %d degrees of freedom exceeds %.2f (p = 1e-6)", label, chi2,
                 kept - 1, CHI2_BOUND_1E6[kept - 1]);
}

/* Eight fixed random logits in [-2, 2]. */
static void small_logits(float *x) {
    uint64_t state = 0x5EED0021ull;
    test_fill_uniform(x, SMALL_V, -2.0f, 2.0f, &state);
}

/* ---- params --------------------------------------------------------------------------------- */

static void test_default_params(void **unused) {
    nopad_sampling_params p = nopad_sampling_default_params();
    assert_true(p.temperature == 0.0f);
    assert_int_equal(p.top_k, 0);
    assert_true(p.top_p == 1.0f);
    assert_true(p.min_p == 0.0f);
    assert_true(p.repetition_penalty == 1.0f);
    assert_true(p.seed == 0);
    assert_true(p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f);
    assert_true(p.logit_bias == NULL && p.n_logit_bias == 0);
    assert_nopad_ok(sampling_check(&p));
}

static void test_bad_params(void **unused) {
    const float bad_temperature[] = {NAN, -0.5f, -INFINITY, INFINITY};
    const float bad_top_p[] = {0.0f, -0.1f, 1.0001f, NAN};
    const float bad_min_p[] = {1.0f, -0.01f, 2.0f, NAN};
    const float bad_penalty[] = {0.0f, -1.0f, NAN, INFINITY};
    float x[SMALL_V];
    small_logits(x);
    sampler_scratch s;
    sampler_scratch_init(&s);
    int32_t id;
    for (int i = 0; i < 4; i++) {
        nopad_sampling_params p = nopad_sampling_default_params();
        p.temperature = bad_temperature[i];
        assert_nopad_error(sampling_check(&p), NOPAD_ERR_INVALID_ARGUMENT,
                           "temperature is");
        assert_nopad_error(sampling_check(&p), NOPAD_ERR_INVALID_ARGUMENT,
                           "0 (greedy) or a finite number > 0");
        assert_nopad_error(sample_token(&s, x, SMALL_V, &p, NULL, 0, 0, &id, NULL),
                           NOPAD_ERR_INVALID_ARGUMENT, "temperature is");
        p = nopad_sampling_default_params();
        p.top_p = bad_top_p[i];
        assert_nopad_error(sampling_check(&p), NOPAD_ERR_INVALID_ARGUMENT, "top_p is");
        assert_nopad_error(sampling_check(&p), NOPAD_ERR_INVALID_ARGUMENT, "(0, 1]");
        p = nopad_sampling_default_params();
        p.min_p = bad_min_p[i];
        assert_nopad_error(sampling_check(&p), NOPAD_ERR_INVALID_ARGUMENT, "min_p is");
        assert_nopad_error(sampling_check(&p), NOPAD_ERR_INVALID_ARGUMENT, "[0, 1)");
        p = nopad_sampling_default_params();
        p.repetition_penalty = bad_penalty[i];
        assert_nopad_error(sampling_check(&p), NOPAD_ERR_INVALID_ARGUMENT,
                           "repetition_penalty is");
        assert_nopad_error(sampling_check(&p), NOPAD_ERR_INVALID_ARGUMENT, "finite number > 0");
    }
    nopad_sampling_params p = nopad_sampling_default_params();
    p.top_k = -1;
    assert_nopad_error(sampling_check(&p), NOPAD_ERR_INVALID_ARGUMENT, "top_k is -1");
    assert_nopad_error(sampling_check(&p), NOPAD_ERR_INVALID_ARGUMENT, ">= 0");
    assert_nopad_error(sampling_check(NULL), NOPAD_ERR_INVALID_ARGUMENT, "params are NULL");

    // the edges of the ranges are allowed
    p = nopad_sampling_default_params();
    p.temperature = 1e-30f;
    p.top_k = 1 << 30;
    p.top_p = 1e-30f;
    p.min_p = 0.999f;
    p.repetition_penalty = 1e-30f;
    p.presence_penalty = -2.0f;
    p.frequency_penalty = 2.0f;
    const nopad_logit_bias edges[] = {{0, -100.0f}, {7, 100.0f}};
    p.logit_bias = edges;
    p.n_logit_bias = 2;
    assert_nopad_ok(sampling_check(&p));

    // OpenAI's ranges for the penalties and logit_bias
    const float bad_openai_penalty[] = {-2.001f, 2.5f, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        p = nopad_sampling_default_params();
        p.presence_penalty = bad_openai_penalty[i];
        assert_nopad_error(sampling_check(&p), NOPAD_ERR_INVALID_ARGUMENT, "presence_penalty is");
        assert_nopad_error(sampling_check(&p), NOPAD_ERR_INVALID_ARGUMENT, "[-2, 2]");
        p = nopad_sampling_default_params();
        p.frequency_penalty = bad_openai_penalty[i];
        assert_nopad_error(sampling_check(&p), NOPAD_ERR_INVALID_ARGUMENT, "frequency_penalty is");
    }
    p = nopad_sampling_default_params();
    p.n_logit_bias = 1;
    assert_nopad_error(sampling_check(&p), NOPAD_ERR_INVALID_ARGUMENT, "1 entries and is NULL");
    const nopad_logit_bias bad_bias[][2] = {{{1, 100.5f}, {2, 0.0f}}, {{1, NAN}, {2, 0.0f}},
                                            {{-1, 1.0f}, {2, 0.0f}}, {{3, 1.0f}, {3, -1.0f}}};
    const char *const bad_bias_says[] = {"logit_bias[0] is (id 1, bias 100.5)", "bias nan",
                                         "(id -1, bias 1)", "lists id 3 twice"};
    for (int i = 0; i < 4; i++) {
        p.logit_bias = bad_bias[i];
        p.n_logit_bias = 2;
        assert_nopad_error(sampling_check(&p), NOPAD_ERR_INVALID_ARGUMENT, bad_bias_says[i]);
    }
    p.n_logit_bias = NOPAD_MAX_LOGIT_BIAS + 1;
    assert_nopad_error(sampling_check(&p), NOPAD_ERR_INVALID_ARGUMENT, "0 to 1024 entries");
    p.n_logit_bias = -1;
    assert_nopad_error(sampling_check(&p), NOPAD_ERR_INVALID_ARGUMENT, "-1 entries");
    // an id past the vocab: only the call knows the vocab
    const nopad_logit_bias past[] = {{SMALL_V, 1.0f}};
    p.logit_bias = past;
    p.n_logit_bias = 1;
    assert_nopad_ok(sampling_check(&p));
    assert_nopad_error(sample_token(&s, x, SMALL_V, &p, NULL, 0, 0, &id, NULL), NOPAD_ERR_INVALID_ARGUMENT,
                       "logit_bias[0] names id 8; ids must be in [0, 8)");
    assert_int_equal(s.n_allocs, 0); // bad params fail before the scratch is touched
    sampler_scratch_free(&s);
}

static void test_bad_calls(void **unused) {
    float x[SMALL_V];
    small_logits(x);
    sampler_scratch s;
    sampler_scratch_init(&s);
    int32_t id = -7;
    for (int greedy = 0; greedy < 2; greedy++) {
        nopad_sampling_params p = sampled(greedy ? 0.0f : 1.0f);
        p.repetition_penalty = 1.2f;
        const int32_t hist[] = {1, 2};
        float y[SMALL_V];
        memcpy(y, x, sizeof y);
        y[5] = NAN;
        assert_nopad_error(sample_token(&s, y, SMALL_V, &p, hist, 2, 0, &id, NULL),
                           NOPAD_ERR_INVALID_ARGUMENT, "logits hold NaN (id 5 of 8)");
        y[5] = INFINITY;
        assert_nopad_error(sample_token(&s, y, SMALL_V, &p, hist, 2, 0, &id, NULL),
                           NOPAD_ERR_INVALID_ARGUMENT, "logits hold +inf (id 5 of 8)");
        for (int i = 0; i < SMALL_V; i++) y[i] = -INFINITY;
        assert_nopad_error(sample_token(&s, y, SMALL_V, &p, hist, 2, 0, &id, NULL),
                           NOPAD_ERR_INVALID_ARGUMENT, "logits are all -inf");
        const int32_t bad_hist[] = {1, 8};
        assert_nopad_error(sample_token(&s, x, SMALL_V, &p, bad_hist, 2, 0, &id, NULL),
                           NOPAD_ERR_INVALID_ARGUMENT, "history[1] is 8; ids must be in [0, 8)");
        const int32_t neg_hist[] = {-1};
        assert_nopad_error(sample_token(&s, x, SMALL_V, &p, neg_hist, 1, 0, &id, NULL),
                           NOPAD_ERR_INVALID_ARGUMENT, "history[0] is -1");
        assert_nopad_error(sample_token(&s, x, SMALL_V, &p, NULL, 3, 0, &id, NULL),
                           NOPAD_ERR_INVALID_ARGUMENT, "history is NULL with n_history 3");
        assert_nopad_error(sample_token(&s, x, SMALL_V, &p, hist, -1, 0, &id, NULL),
                           NOPAD_ERR_INVALID_ARGUMENT, "n_history -1");
        assert_nopad_error(sample_token(&s, x, 0, &p, NULL, 0, 0, &id, NULL),
                           NOPAD_ERR_INVALID_ARGUMENT, "vocab is 0");
        assert_nopad_error(sample_token(&s, NULL, SMALL_V, &p, NULL, 0, 0, &id, NULL),
                           NOPAD_ERR_INVALID_ARGUMENT, "logits is NULL");
        assert_nopad_error(sample_token(&s, x, SMALL_V, &p, NULL, 0, 0, NULL, NULL),
                           NOPAD_ERR_INVALID_ARGUMENT, "out_id is NULL");
        assert_nopad_error(sample_token(NULL, x, SMALL_V, &p, NULL, 0, 0, &id, NULL),
                           NOPAD_ERR_INVALID_ARGUMENT, "scratch is NULL");
        assert_nopad_error(sample_token(&s, x, SMALL_V, NULL, NULL, 0, 0, &id, NULL),
                           NOPAD_ERR_INVALID_ARGUMENT, "params are NULL");
    }
    assert_int_equal(id, -7); // failing calls leave the output alone

    // one finite logit among -inf: that id, with logprob 0, greedy or sampled
    float y[SMALL_V];
    for (int i = 0; i < SMALL_V; i++) y[i] = -INFINITY;
    y[6] = -3.5f;
    for (int greedy = 0; greedy < 2; greedy++) {
        nopad_sampling_params p = sampled(greedy ? 0.0f : 0.9f);
        p.top_p = 0.5f;
        p.top_k = 3;
        float lp;
        assert_int_equal(draw(&s, y, SMALL_V, &p, NULL, 0, 11, &lp), 6);
        assert_true(lp == 0.0f);
    }
    sampler_scratch_free(&s);
}

/* ---- greedy and the repetition penalty ------------------------------------------------------- */

/* log softmax of the penalised logits at temperature 1, in double. */
static double ref_greedy_logprob(const float *x, int32_t vocab, float penalty,
                                 const int32_t *hist, int32_t n_hist, int32_t id) {
    nopad_sampling_params p = sampled(1.0f);
    p.repetition_penalty = penalty;
    double *probs = malloc((size_t)vocab * sizeof *probs);
    ref_probs(x, vocab, &p, hist, n_hist, probs);
    double lp = log(probs[id]);
    free(probs);
    return lp;
}

static void test_greedy(void **unused) {
    enum { V = 1000 };
    float x[V];
    uint64_t state = 0xA11CE;
    test_fill_uniform(x, V, -3.0f, 3.0f, &state);
    sampler_scratch s;
    sampler_scratch_init(&s);
    nopad_sampling_params p = nopad_sampling_default_params();
    float lp;
    int32_t want = argmax_lowest(x, V);
    assert_int_equal(draw(&s, x, V, &p, NULL, 0, 0, &lp), want);
    assert_float_equal(lp, ref_greedy_logprob(x, V, 1.0f, NULL, 0, want), 1e-5);

    // ties: the lowest id among equal maxima
    x[700] = x[300] = x[999] = 5.0f;
    assert_int_equal(draw(&s, x, V, &p, NULL, 0, 0, &lp), 300);
    assert_float_equal(lp, ref_greedy_logprob(x, V, 1.0f, NULL, 0, 300), 1e-5);

    // the seed and the step do not matter
    for (uint64_t step = 0; step < 50; step++) {
        p.seed = step * 7919;
        assert_int_equal(draw(&s, x, V, &p, NULL, 0, step, NULL), 300);
    }
    sampler_scratch_free(&s);
}

static void test_greedy_repetition_penalty(void **unused) {
    enum { V = 50 };
    float x[V];
    uint64_t state = 0xBEEF;
    sampler_scratch s;
    sampler_scratch_init(&s);
    nopad_sampling_params p = nopad_sampling_default_params();
    float lp;

    // positive logits are divided, once per distinct id: 2.0 / 1.2 = 1.667 > 1.6 whatever the
    // repeats (twice would be 1.389); 2.0 / 1.3 = 1.538 < 1.6 hands the win to id 20
    test_fill_uniform(x, V, -1.0f, 1.0f, &state);
    x[7] = 2.0f;
    x[20] = 1.6f;
    const int32_t once[] = {7}, repeats[] = {7, 3, 7, 7, 3};
    p.repetition_penalty = 1.2f;
    assert_int_equal(draw(&s, x, V, &p, once, 1, 0, &lp), 7);
    assert_float_equal(lp, ref_greedy_logprob(x, V, 1.2f, once, 1, 7), 1e-5);
    assert_int_equal(draw(&s, x, V, &p, repeats, 5, 0, &lp), 7);
    assert_float_equal(lp, ref_greedy_logprob(x, V, 1.2f, repeats, 5, 7), 1e-5);
    p.repetition_penalty = 1.3f;
    assert_int_equal(draw(&s, x, V, &p, repeats, 5, 0, &lp), 20);
    assert_float_equal(lp, ref_greedy_logprob(x, V, 1.3f, repeats, 5, 20), 1e-5);
    // a penalty < 1 favours the repeated ids
    p.repetition_penalty = 0.5f;
    const int32_t hist20[] = {20, 20};
    assert_int_equal(draw(&s, x, V, &p, hist20, 2, 0, &lp), 20);
    assert_float_equal(lp, ref_greedy_logprob(x, V, 0.5f, hist20, 2, 20), 1e-5);

    // negative logits are multiplied: -1.0 x 1.2 = -1.2 > -1.3 (twice: -1.44); x 1.4 = -1.4 < -1.3
    test_fill_uniform(x, V, -5.0f, -3.0f, &state);
    x[7] = -1.0f;
    x[20] = -1.3f;
    p.repetition_penalty = 1.2f;
    assert_int_equal(draw(&s, x, V, &p, repeats, 5, 0, &lp), 7);
    assert_float_equal(lp, ref_greedy_logprob(x, V, 1.2f, repeats, 5, 7), 1e-5);
    p.repetition_penalty = 1.4f;
    assert_int_equal(draw(&s, x, V, &p, repeats, 5, 0, &lp), 20);
    assert_float_equal(lp, ref_greedy_logprob(x, V, 1.4f, repeats, 5, 20), 1e-5);

    // a tie made by the penalty: 4.0 / 2 = 2.0 = x[9]; the lower id wins
    test_fill_uniform(x, V, -1.0f, 1.0f, &state);
    x[10] = 4.0f;
    x[9] = 2.0f;
    p.repetition_penalty = 2.0f;
    const int32_t hist10[] = {10};
    assert_int_equal(draw(&s, x, V, &p, hist10, 1, 0, &lp), 9);

    // the penalty leaves the caller's logits and the scratch marks as they were: a call without
    // history afterwards is the plain argmax
    assert_true(x[10] == 4.0f);
    assert_int_equal(draw(&s, x, V, &p, NULL, 0, 0, NULL), 10);
    for (int32_t i = 0; i < s.capacity; i++) assert_int_equal(s.seen[i], 0);

    // the logprob of a long random history with repeats, against the reference
    test_fill_uniform(x, V, -4.0f, 4.0f, &state);
    int32_t hist[300];
    for (int i = 0; i < 300; i++) hist[i] = (int32_t)(test_rand_u32(&state) % 25);
    p.repetition_penalty = 1.7f;
    int32_t id = draw(&s, x, V, &p, hist, 300, 0, &lp);
    assert_float_equal(lp, ref_greedy_logprob(x, V, 1.7f, hist, 300, id), 1e-5);
    sampler_scratch_free(&s);
}

static void test_top_k_1_is_greedy(void **unused) {
    enum { V = 5000 };
    float *x = malloc(V * sizeof *x);
    assert_non_null(x);
    uint64_t state = 0xC0FFEE;
    fill_normal(x, V, 3.0, &state);
    int32_t hist[64];
    for (int i = 0; i < 64; i++) hist[i] = (int32_t)(test_rand_u32(&state) % V);
    hist[0] = argmax_lowest(x, V); // the penalty may move the argmax
    sampler_scratch s;
    sampler_scratch_init(&s);
    const float temps[] = {0.05f, 0.7f, 1.0f, 3.0f, 50.0f};
    const float penalties[] = {1.0f, 1.5f};
    for (int ip = 0; ip < 2; ip++) {
        nopad_sampling_params g = nopad_sampling_default_params();
        g.repetition_penalty = penalties[ip];
        int32_t want = draw(&s, x, V, &g, hist, 64, 0, NULL);
        for (int it = 0; it < 5; it++) {
            nopad_sampling_params p = sampled(temps[it]);
            p.top_k = 1;
            p.repetition_penalty = penalties[ip];
            for (uint64_t step = 0; step < 20; step++) {
                float lp;
                assert_int_equal(draw(&s, x, V, &p, hist, 64, step, &lp), want);
                assert_true(lp == 0.0f);
            }
        }
    }
    sampler_scratch_free(&s);
    free(x);
}

/* ---- the draw ------------------------------------------------------------------------------- */

static void test_uniform(void **unused) {
    enum { N = 100000 };
    double sum = 0, prev = -1;
    for (uint64_t step = 0; step < N; step++) {
        double u = sampling_uniform(42, step);
        assert_true(u >= 0.0 && u < 1.0);
        assert_true(u != prev);
        assert_true(u == sampling_uniform(42, step)); // a pure function
        sum += u;
        prev = u;
    }
    assert_true(fabs(sum / N - 0.5) < 0.01);
    // the seeds give other streams
    int same = 0;
    for (uint64_t step = 0; step < 1000; step++) {
        same += sampling_uniform(0, step) == sampling_uniform(1, step);
        same += sampling_uniform(1, step) == sampling_uniform(2, step + 1);
    }
    assert_int_equal(same, 0);
}

/* One request of `n` steps: logits fresh per step from `state`, the history grows with each id. */
typedef struct request {
    int32_t vocab;
    nopad_sampling_params p;
    uint64_t state;
    int32_t hist[256];
    int32_t n_hist;
    float *x;
} request;

static int32_t request_step(request *r, sampler_scratch *s, uint64_t step) {
    fill_normal(r->x, r->vocab, 2.0, &r->state);
    int32_t id = draw(s, r->x, r->vocab, &r->p, r->hist, r->n_hist, step, NULL);
    r->hist[r->n_hist++] = id;
    return id;
}

static void request_init(request *r, int32_t vocab, uint64_t seed, float temperature) {
    memset(r, 0, sizeof *r);
    r->vocab = vocab;
    r->p = sampled(temperature);
    r->p.seed = seed;
    r->p.top_k = 40;
    r->p.top_p = 0.95f;
    r->p.min_p = 0.02f;
    r->p.repetition_penalty = 1.1f;
    r->state = seed | 1;
    r->hist[0] = 1;
    r->hist[1] = 2;
    r->n_hist = 2; // the prompt
    r->x = malloc((size_t)vocab * sizeof *r->x);
    assert_non_null(r->x);
}

static void test_determinism(void **unused) {
    enum { V = 64, STEPS = 100 };
    float x[V];
    uint64_t state = 0xD1CE;
    test_fill_uniform(x, V, -0.1f, 0.1f, &state); // nearly flat: every step's draw shows
    nopad_sampling_params p = sampled(1.0f);
    sampler_scratch a, b;
    sampler_scratch_init(&a);
    sampler_scratch_init(&b);
    int seen[V] = {0};
    int distinct = 0;
    for (uint64_t step = 0; step < 1000; step++) {
        float lp_a, lp_b;
        int32_t id = draw(&a, x, V, &p, NULL, 0, step, &lp_a);
        assert_int_equal(draw(&b, x, V, &p, NULL, 0, step, &lp_b), id);
        assert_int_equal(draw(&a, x, V, &p, NULL, 0, step, NULL), id);
        assert_true(lp_a == lp_b);
        distinct += !seen[id];
        seen[id] = 1;
    }
    assert_true(distinct >= 50); // 1000 steps over 64 nearly equal ids
    // another seed, another sequence
    nopad_sampling_params q = p;
    q.seed++;
    int differ = 0;
    for (uint64_t step = 0; step < 100; step++)
        differ += draw(&a, x, V, &p, NULL, 0, step, NULL) != draw(&a, x, V, &q, NULL, 0, step, NULL);
    assert_true(differ > 50);

    // a request alone and interleaved with another (other vocab, params, seed) on one scratch
    request r1, r2;
    int32_t alone[STEPS];
    request_init(&r1, 3000, 7, 0.8f);
    for (int i = 0; i < STEPS; i++) alone[i] = request_step(&r1, &a, (uint64_t)i);
    free(r1.x);
    request_init(&r1, 3000, 7, 0.8f);
    request_init(&r2, 20000, 8, 1.3f);
    for (int i = 0; i < STEPS; i++) {
        request_step(&r2, &b, (uint64_t)i);
        assert_int_equal(request_step(&r1, &b, (uint64_t)i), alone[i]);
        request_step(&r2, &b, (uint64_t)i + STEPS);
    }
    free(r1.x);
    free(r2.x);
    sampler_scratch_free(&a);
    sampler_scratch_free(&b);
}

/* ---- the warpers against the reference ------------------------------------------------------ */

static void test_temperature(void **unused) {
    float x[SMALL_V];
    small_logits(x);
    long counts[SMALL_V];
    double probs[SMALL_V];
    nopad_sampling_params p = sampled(0.7f);
    check_draws("temperature 0.7", x, &p, NULL, 0, counts, probs);
    p = sampled(1.5f);
    check_draws("temperature 1.5", x, &p, NULL, 0, counts, probs);
    for (int i = 0; i < SMALL_V; i++) assert_true(counts[i] > 0);
}

static void test_top_k(void **unused) {
    float x[SMALL_V];
    small_logits(x);
    long counts[SMALL_V];
    double probs[SMALL_V];
    nopad_sampling_params p = sampled(1.0f);
    p.top_k = 3;
    check_draws("top_k 3", x, &p, NULL, 0, counts, probs);
    // the three largest logits, and only they
    float third = -INFINITY;
    for (int i = 0; i < SMALL_V; i++) {
        int above = 0;
        for (int j = 0; j < SMALL_V; j++) above += x[j] > x[i];
        if (above == 2) third = x[i];
    }
    for (int i = 0; i < SMALL_V; i++) assert_int_equal(counts[i] > 0, x[i] >= third);

    // ties at the k-th value all stay (HF masks scores < the k-th): k = 3 keeps 2, 2, 1, 1, 1
    const float tied[SMALL_V] = {0.5f, 2.0f, 1.0f, 2.0f, 1.0f, 1.0f, -1.0f, 0.0f};
    check_draws("top_k 3, ties at the 3rd", tied, &p, NULL, 0, counts, probs);
    const int keep[SMALL_V] = {0, 1, 1, 1, 1, 1, 0, 0};
    for (int i = 0; i < SMALL_V; i++) assert_int_equal(counts[i] > 0, keep[i]);
}

static void test_top_p(void **unused) {
    float x[SMALL_V];
    small_logits(x);
    long counts[SMALL_V];
    double probs[SMALL_V];
    nopad_sampling_params p = sampled(1.0f);
    p.top_p = 0.6f;
    check_draws("top_p 0.6", x, &p, NULL, 0, counts, probs);

    // the boundary: the most likely ids up to and including the first whose cumulative
    // probability reaches 0.6, computed here by ranking; not near a rounding tie
    double full[SMALL_V];
    double y[SMALL_V];
    for (int i = 0; i < SMALL_V; i++) y[i] = x[i];
    softmax(y, SMALL_V, full);
    int order[SMALL_V];
    for (int i = 0; i < SMALL_V; i++) order[i] = i;
    for (int i = 0; i < SMALL_V; i++) // selection sort, descending
        for (int j = i + 1; j < SMALL_V; j++)
            if (full[order[j]] > full[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    double before = 0;
    int n_keep = 0;
    while (before < 0.6) before += full[order[n_keep++]];
    assert_true(n_keep >= 2 && n_keep < SMALL_V); // the fixture cuts somewhere inside
    double last = full[order[n_keep - 1]];
    assert_true(before - last < 0.6 - 1e-3 && before > 0.6 + 1e-3);
    printf("  top_p 0.6 keeps the %d most likely: mass %.4f without the last (id %d), %.4f with\n",
           n_keep, before - last, order[n_keep - 1], before);
    for (int r = 0; r < SMALL_V; r++) assert_int_equal(counts[order[r]] > 0, r < n_keep);

    // a cut inside a tie keeps the lower ids first: p = .698, .094 x 3, .0047 x 4; 0.75 keeps 0, 1
    const float tied[SMALL_V] = {3.0f, 1.0f, 1.0f, 1.0f, -2.0f, -2.0f, -2.0f, -2.0f};
    p.top_p = 0.75f;
    check_draws("top_p 0.75, cut inside a tie", tied, &p, NULL, 0, counts, probs);
    for (int i = 0; i < SMALL_V; i++) assert_int_equal(counts[i] > 0, i < 2);

    // so small that only the top id stays, at any temperature
    enum { V = 1000 };
    float big[V];
    uint64_t state = 0x70970;
    fill_normal(big, V, 2.0, &state);
    int32_t top = argmax_lowest(big, V);
    sampler_scratch s;
    sampler_scratch_init(&s);
    const float temps[] = {0.3f, 1.0f, 4.0f};
    for (int it = 0; it < 3; it++) {
        nopad_sampling_params q = sampled(temps[it]);
        q.top_p = 1e-6f;
        for (uint64_t step = 0; step < 1000; step++) {
            float lp;
            assert_int_equal(draw(&s, big, V, &q, NULL, 0, step, &lp), top);
            assert_true(lp == 0.0f);
        }
    }
    sampler_scratch_free(&s);
}

static void test_min_p(void **unused) {
    float x[SMALL_V];
    small_logits(x);
    long counts[SMALL_V];
    double probs[SMALL_V];
    nopad_sampling_params p = sampled(1.0f);
    p.min_p = 0.2f;
    check_draws("min_p 0.2", x, &p, NULL, 0, counts, probs);
    float xmax = x[argmax_lowest(x, SMALL_V)];
    int removed = 0;
    for (int i = 0; i < SMALL_V; i++) {
        int keep = exp((double)x[i] - xmax) >= 0.2;
        assert_int_equal(counts[i] > 0, keep);
        removed += !keep;
    }
    assert_true(removed > 0);
}

static void test_combined(void **unused) {
    float x[SMALL_V];
    small_logits(x);
    long counts[SMALL_V];
    double probs[SMALL_V];
    const int32_t hist[] = {1, 3, 3, 5, 1, 6};
    nopad_sampling_params p = sampled(0.8f);
    p.top_k = 6;
    p.top_p = 0.9f;
    p.min_p = 0.1f;
    p.repetition_penalty = 1.3f;
    check_draws("all: t 0.8 k 6 p 0.9 min_p 0.1 rp 1.3", x, &p, hist, 6, counts, probs);
    p.temperature = 1.7f;
    p.top_p = 0.97f;
    p.min_p = 0.05f;
    p.repetition_penalty = 0.8f;
    check_draws("all: t 1.7 k 6 p 0.97 min_p 0.05 rp 0.8", x, &p, hist, 6, counts, probs);
}

/* ---- large vocabularies and the scratch ------------------------------------------------------ */

static void check_large(const char *label, sampler_scratch *s, const float *x, int32_t vocab,
                        const nopad_sampling_params *p, const int32_t *hist, int32_t n_hist) {
    double *probs = malloc((size_t)vocab * sizeof *probs);
    assert_non_null(probs);
    int32_t kept = ref_probs(x, vocab, p, hist, n_hist, probs);
    double worst = 0;
    for (uint64_t step = 0; step < 64; step++) {
        float lp;
        int32_t id = draw(s, x, vocab, p, hist, n_hist, step, &lp);
        if (probs[id] == 0) fail_msg("%s: drew id %d, which the warpers remove", label, id);
        double err = fabs(lp - log(probs[id]));
        worst = err > worst ? err : worst;
    }
    printf("  %-40s vocab %6d kept %6d, worst logprob error %.2e\n", label, vocab, kept, worst);
    assert_true(worst < 1e-4); // a different kept set moves every logprob by its mass
    free(probs);
}

static void test_large_vocab_reuses_scratch(void **unused) {
    enum { V = 128256 };
    float *x = malloc(V * sizeof *x);
    assert_non_null(x);
    uint64_t state = 0x128256;
    fill_normal(x, V, 2.5, &state);
    int32_t hist[500];
    for (int i = 0; i < 500; i++) hist[i] = (int32_t)(test_rand_u32(&state) % 49152);

    sampler_scratch s;
    sampler_scratch_init(&s);
    nopad_sampling_params g = nopad_sampling_default_params();
    assert_int_equal(draw(&s, x, V, &g, NULL, 0, 0, NULL), argmax_lowest(x, V));
    assert_int_equal(s.n_allocs, 1);
    assert_int_equal(s.capacity, V);
    sampler_scratch first = s;

    nopad_sampling_params p = sampled(1.0f);
    p.top_p = 0.9f;
    check_large("top_p 0.9", &s, x, V, &p, NULL, 0);
    p = sampled(0.6f);
    p.top_p = 0.5f;
    check_large("t 0.6, top_p 0.5", &s, x, V, &p, NULL, 0);
    p = sampled(0.8f);
    p.top_k = 50;
    check_large("t 0.8, top_k 50", &s, x, V, &p, NULL, 0);
    p = sampled(1.0f);
    p.min_p = 0.1f;
    check_large("min_p 0.1", &s, x, V, &p, NULL, 0);
    p = sampled(1.2f);
    p.top_k = 2000;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repetition_penalty = 1.1f;
    check_large("t 1.2, top_k 2000, top_p 0.95, min_p 0.05, rp", &s, x, V, &p, hist, 500);
    check_large("the same on vocab 49152", &s, x, 49152, &p, hist, 500);
    p = sampled(0.7f);
    check_large("t 0.7 only", &s, x, V, &p, NULL, 0);

    // many ties: logits on a grid of 0.25 (top-k keeps every tie at the k-th; top-p ranks ties
    // by id), and logits ascending in id order (every id enters top-k's heap)
    for (int32_t i = 0; i < V; i++) x[i] = 0.25f * roundf(4.0f * x[i]);
    p = sampled(0.9f);
    p.top_k = 100;
    p.top_p = 0.8f;
    check_large("grid of 0.25: t 0.9, top_k 100, top_p 0.8", &s, x, V, &p, NULL, 0);
    p.top_k = 0;
    p.top_p = 0.3f;
    check_large("grid of 0.25: t 0.9, top_p 0.3", &s, x, V, &p, NULL, 0);
    for (int32_t i = 0; i < V; i++) x[i] = -8.0f + 16.0f * (float)i / V;
    p = sampled(0.5f);
    p.top_k = 3000;
    check_large("ascending: t 0.5, top_k 3000", &s, x, V, &p, NULL, 0);

    // all equal: top-p 0.5 keeps exactly the lower half of the ids (sums of ones are exact)
    for (int32_t i = 0; i < V; i++) x[i] = 1.5f;
    p = sampled(1.0f);
    p.top_p = 0.5f;
    for (uint64_t step = 0; step < 200; step++) {
        float lp;
        assert_true(draw(&s, x, V, &p, NULL, 0, step, &lp) < V / 2);
        assert_float_equal(lp, -log(V / 2), 1e-5);
    }

    // nothing was allocated after the first call
    assert_int_equal(s.n_allocs, 1);
    assert_int_equal(s.capacity, V);
    assert_ptr_equal(s.logits, first.logits);
    assert_ptr_equal(s.weight, first.weight);
    assert_ptr_equal(s.ids, first.ids);
    assert_ptr_equal(s.keys, first.keys);
    assert_ptr_equal(s.heap, first.heap);
    assert_ptr_equal(s.seen, first.seen);
    sampler_scratch_free(&s);
    assert_null(s.logits);
    free(x);

    // 256k ids
    enum { V256 = 262144 };
    float *y = malloc(V256 * sizeof *y);
    assert_non_null(y);
    fill_normal(y, V256, 2.5, &state);
    sampler_scratch_init(&s);
    p = sampled(1.0f);
    p.top_p = 0.9f;
    check_large("top_p 0.9", &s, y, V256, &p, NULL, 0);
    sampler_scratch_free(&s);
    free(y);
}

/* ---- speed (printed, not asserted) ---------------------------------------------------------- */

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double ns_per_call(sampler_scratch *s, const float *x, int32_t vocab,
                          const nopad_sampling_params *p) {
    enum { REPS = 200 };
    draw(s, x, vocab, p, NULL, 0, 0, NULL); // warm
    double t0 = seconds();
    for (uint64_t step = 0; step < REPS; step++) draw(s, x, vocab, p, NULL, 0, step, NULL);
    return (seconds() - t0) * 1e9 / REPS;
}

/* ---- OpenAI's penalties and logit_bias (issue 44) ------------------------------------------- */

/* log softmax of y[id] over y[vocab] in double. */
static double log_softmax_at(const float *y, int32_t vocab, int32_t id) {
    double m = -INFINITY, z = 0;
    for (int32_t i = 0; i < vocab; i++) m = y[i] > m ? y[i] : m;
    for (int32_t i = 0; i < vocab; i++) z += exp((double)y[i] - m);
    return (double)y[id] - m - log(z);
}

/* The definitions on a hand-made case: penalties count only the generated ids (the last `step`
 * of the history), logit_bias adds first. */
static void test_penalties_by_hand(void **unused) {
    const float x[4] = {1.0f, 0.5f, 0.25f, 0.0f};
    const int32_t hist[5] = {0, 1, 2, 2, 3}; // prompt 0 1, output 2 2 3
    sampler_scratch s;
    sampler_scratch_init(&s);
    nopad_sampling_params p = nopad_sampling_default_params();
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    float lp;
    // x2 = 0.25 - 2 * 0.5 - 0.25 = -1, x3 = 0 - 0.5 - 0.25 = -0.75; ids 0, 1 are prompt only
    const float want[4] = {1.0f, 0.5f, -1.0f, -0.75f};
    assert_int_equal(draw(&s, x, 4, &p, hist, 5, 3, &lp), 0);
    assert_true(fabs(lp - log_softmax_at(want, 4, 0)) < 1e-6);
    // step 1: only the last id (3) is output
    const float want1[4] = {1.0f, 0.5f, 0.25f, -0.75f};
    assert_int_equal(draw(&s, x, 4, &p, hist, 5, 1, &lp), 0);
    assert_true(fabs(lp - log_softmax_at(want1, 4, 0)) < 1e-6);
    // a step past the history counts all of it (as the history holds no more)
    const float want_all[4] = {0.25f, -0.25f, -1.0f, -0.75f};
    assert_int_equal(draw(&s, x, 4, &p, hist, 5, 9, &lp), 0);
    assert_true(fabs(lp - log_softmax_at(want_all, 4, 0)) < 1e-6);
    // logit_bias: id 1 to 1.25
    const nopad_logit_bias bias[] = {{1, 0.75f}};
    p.logit_bias = bias;
    p.n_logit_bias = 1;
    const float want_b[4] = {1.0f, 1.25f, -1.0f, -0.75f};
    assert_int_equal(draw(&s, x, 4, &p, hist, 5, 3, &lp), 1);
    assert_true(fabs(lp - log_softmax_at(want_b, 4, 1)) < 1e-6);
    // negative penalties encourage repeats: x2 = 0.25 + 2 * 2 = 4.25
    p.n_logit_bias = 0;
    p.frequency_penalty = -2.0f;
    p.presence_penalty = 0.0f;
    assert_int_equal(draw(&s, x, 4, &p, hist, 5, 3, &lp), 2);
    // logit_bias -100 all but bans an id: greedy and sampled never take it
    const nopad_logit_bias ban[] = {{0, -100.0f}};
    nopad_sampling_params q = sampled(1.0f);
    q.logit_bias = ban;
    q.n_logit_bias = 1;
    for (uint64_t step = 0; step < 2000; step++) assert_int_not_equal(draw(&s, x, 4, &q, NULL, 0, step, NULL), 0);
    sampler_scratch_free(&s);
}

/* The reference of the processing before the warpers, in fp32 as sampling.h defines it:
 * logit_bias, HF's repetition penalty once per distinct history id (a positive logit divided,
 * clamped to FLT_MAX), then logit - frequency · count - presence over the last min(step, n) ids. */
static void ref_process(float *y, int32_t vocab, const nopad_sampling_params *p, const int32_t *hist,
                        int32_t n_hist, uint64_t step) {
    for (int32_t j = 0; j < p->n_logit_bias; j++) y[p->logit_bias[j].id] += p->logit_bias[j].bias;
    unsigned char *seen = calloc((size_t)vocab, 1);
    int32_t *count = calloc((size_t)vocab, sizeof *count);
    assert_true(seen && count);
    for (int32_t h = 0; h < n_hist; h++) {
        const int32_t id = hist[h];
        if (seen[id]) continue;
        seen[id] = 1;
        float v = y[id] < 0 ? y[id] * p->repetition_penalty : y[id] / p->repetition_penalty;
        y[id] = v > FLT_MAX ? FLT_MAX : v;
    }
    const int32_t first = step < (uint64_t)n_hist ? n_hist - (int32_t)step : 0;
    for (int32_t h = first; h < n_hist; h++) count[hist[h]]++;
    for (int32_t i = 0; i < vocab; i++)
        if (count[i] > 0) y[i] = (y[i] - p->frequency_penalty * (float)count[i]) - p->presence_penalty;
    free(seen);
    free(count);
}

/* Random rows and params: sample_token with the penalties and logit_bias chooses exactly what it
 * chooses without them on logits processed by the reference (the same id, the same
 * log-probability bit for bit, the same top log-probabilities): the processing is OpenAI's and
 * HF's, and it enters the warpers as the logits do. */
static void test_penalties_and_bias_against_reference(void **unused) {
    enum { TRIALS = 400, MAX_HIST = 300, TOP = 5 };
    static const int32_t vocabs[] = {1, 50, 1000, 49152};
    uint64_t state = 0xB1A5;
    sampler_scratch s, t;
    sampler_scratch_init(&s);
    sampler_scratch_init(&t);
    int differ = 0; // rows where the processing changed the choice: the test sees it work
    for (int trial = 0; trial < TRIALS; trial++) {
        const int32_t V = vocabs[trial % 4];
        float *x = malloc((size_t)V * sizeof *x), *y = malloc((size_t)V * sizeof *y);
        int32_t hist[MAX_HIST];
        nopad_logit_bias bias[64];
        fill_normal(x, V, 1.0 + 2.0 * (test_rand_u32(&state) % 4), &state);
        const int32_t n_hist = (int32_t)(test_rand_u32(&state) % MAX_HIST);
        // a small pool, so that ids repeat
        const int32_t pool = 1 + (int32_t)(test_rand_u32(&state) % (V < 40 ? V : 40));
        const int32_t base = (int32_t)(test_rand_u32(&state) % V);
        for (int32_t h = 0; h < n_hist; h++) hist[h] = (base + (int32_t)(test_rand_u32(&state) % pool)) % V;
        const uint64_t step = test_rand_u32(&state) % (MAX_HIST + 20);
        nopad_sampling_params p = sampled(trial % 5 == 0 ? 0.0f : 0.3f + (float)(test_rand_u32(&state) % 100) / 50.0f);
        p.seed = test_rand_u32(&state);
        p.top_k = trial % 3 == 0 ? (int32_t)(1 + test_rand_u32(&state) % 50) : 0;
        p.top_p = trial % 4 == 1 ? 0.9f : 1.0f;
        p.min_p = trial % 7 == 2 ? 0.05f : 0.0f;
        p.repetition_penalty = trial % 2 ? 1.0f : 1.3f;
        p.presence_penalty = (float)((int)(test_rand_u32(&state) % 9) - 4) * 0.5f;
        p.frequency_penalty = (float)((int)(test_rand_u32(&state) % 9) - 4) * 0.5f;
        p.n_logit_bias = (int32_t)(test_rand_u32(&state) % (V < 64 ? V + 1 : 65));
        for (int32_t j = 0; j < p.n_logit_bias; j++) // distinct ids: a stride coprime to nothing repeated
            bias[j] = (nopad_logit_bias){(base + j) % V, (float)((int)(test_rand_u32(&state) % 401) - 200) / 2.0f};
        p.logit_bias = bias;
        memcpy(y, x, (size_t)V * sizeof *y);
        ref_process(y, V, &p, hist, n_hist, step);
        nopad_sampling_params plain = p;
        plain.repetition_penalty = 1.0f;
        plain.presence_penalty = plain.frequency_penalty = 0.0f;
        plain.n_logit_bias = 0;
        int32_t id, want_id, ids[TOP], want_ids[TOP], bare_id;
        float lp, want_lp, lps[TOP], want_lps[TOP];
        assert_nopad_ok(sample_token(&s, x, V, &p, hist, n_hist, step, &id, &lp));
        assert_nopad_ok(sampling_top_logprobs(&s, TOP, ids, lps));
        assert_nopad_ok(sample_token(&t, y, V, &plain, NULL, 0, step, &want_id, &want_lp));
        assert_nopad_ok(sampling_top_logprobs(&t, TOP, want_ids, want_lps));
        assert_int_equal(id, want_id);
        assert_memory_equal(&lp, &want_lp, sizeof lp);
        assert_memory_equal(ids, want_ids, sizeof ids);
        assert_memory_equal(lps, want_lps, sizeof lps);
        assert_nopad_ok(sample_token(&t, x, V, &plain, NULL, 0, step, &bare_id, NULL));
        differ += bare_id != id;
        free(x);
        free(y);
    }
    printf("  %d rows, %d of them chose otherwise without the processing\n", TRIALS, differ);
    assert_true(differ > TRIALS / 4);
    sampler_scratch_free(&s);
    sampler_scratch_free(&t);
}

/* ---- top log-probabilities (issue 44) --------------------------------------------------------- */

typedef struct by_logit {
    float x;
    int32_t id;
} by_logit;

/* Descending logit, then ascending id (-0 and +0 equal, as the comparisons see them). */
static int by_logit_descending(const void *a, const void *b) {
    const by_logit *p = a, *q = b;
    if (p->x != q->x) return p->x > q->x ? -1 : 1;
    return p->id - q->id;
}

/* The top log-probabilities against a softmax in double of the same logits (ref_probs: HF's
 * warpers; greedy: temperature 1, nothing dropped): the ids in the order of the logits with ties
 * by the lower id, each log-probability within 1e-5 (relative beyond magnitude 1; the issue asks
 * 1e-4: the host works in double and rounds once to float, ~1e-7), -inf exactly for the ids the
 * warpers drop; the chosen id's entry equals out_logprob. Rows: normal, ties from a few values,
 * some -inf; a vocab smaller than n pads with (-1, -inf). */
static void test_top_logprobs(void **unused) {
    enum { V = 3000, TOP = NOPAD_MAX_TOP_LOGPROBS };
    static const float tie_values[] = {2.0f, 1.0f, 0.0f, -0.0f, -3.0f};
    uint64_t state = 0x7095;
    float *x = malloc(V * sizeof *x);
    double *probs = malloc(V * sizeof *probs);
    by_logit *order = malloc(V * sizeof *order);
    sampler_scratch s;
    sampler_scratch_init(&s);
    int32_t ids[TOP];
    float lps[TOP];
    assert_nopad_error(sampling_top_logprobs(&s, 5, ids, lps), NOPAD_ERR_INVALID_ARGUMENT,
                       "after a successful sample_token");
    int dropped = 0, chosen_listed = 0;
    for (int trial = 0; trial < 60; trial++) {
        const int shape = trial % 3;
        if (shape == 1)
            for (int32_t i = 0; i < V; i++) x[i] = tie_values[test_rand_u32(&state) % 5];
        else
            fill_normal(x, V, 2.0, &state);
        if (shape == 2)
            for (int32_t i = 0; i < V; i++)
                if (test_rand_u32(&state) % 100 < 99) x[i] = -INFINITY; // ~30 finite: -inf in the top 20
        nopad_sampling_params p = sampled(trial % 4 == 0 ? 0.0f : 0.5f + 0.25f * (float)(trial % 5));
        p.seed = (uint64_t)trial;
        p.top_k = trial % 4 == 1 ? 7 : 0;
        p.top_p = trial % 4 == 2 ? 0.6f : 1.0f;
        p.min_p = trial % 8 == 3 ? 0.2f : 0.0f;
        const int32_t n = 1 + trial % TOP;
        int32_t id;
        float lp;
        assert_nopad_ok(sample_token(&s, x, V, &p, NULL, 0, (uint64_t)trial, &id, &lp));
        assert_nopad_ok(sampling_top_logprobs(&s, n, ids, lps));
        nopad_sampling_params r = p;
        if (r.temperature == 0.0f) r.temperature = 1.0f; // greedy's: temperature 1, nothing dropped
        ref_probs(x, V, &r, NULL, 0, probs);
        for (int32_t i = 0; i < V; i++) order[i] = (by_logit){x[i] == 0.0f ? 0.0f : x[i], i};
        qsort(order, V, sizeof *order, by_logit_descending);
        for (int32_t j = 0; j < n; j++) {
            assert_int_equal(ids[j], order[j].id);
            const double want = probs[order[j].id] > 0 ? log(probs[order[j].id]) : -INFINITY;
            if (want == -INFINITY) {
                assert_true(lps[j] == -INFINITY);
                dropped++;
            } else if (!(fabs(lps[j] - want) <= 1e-5 * fmax(1.0, fabs(want)))) {
                fail_msg("trial %d entry %d (id %d): logprob %.9g, softmax in double %.9g", trial, j, ids[j],
                         (double)lps[j], want);
            }
            if (ids[j] == id) {
                assert_memory_equal(&lps[j], &lp, sizeof lp);
                chosen_listed++;
            }
        }
    }
    assert_true(dropped > 0 && chosen_listed > 20);
    // a vocab smaller than n: the rest is (-1, -inf); n 0 writes nothing
    float small[3] = {0.5f, 2.0f, 0.5f};
    nopad_sampling_params g = nopad_sampling_default_params();
    int32_t id;
    assert_nopad_ok(sample_token(&s, small, 3, &g, NULL, 0, 0, &id, NULL));
    assert_nopad_ok(sampling_top_logprobs(&s, 5, ids, lps));
    const int32_t want_ids[5] = {1, 0, 2, -1, -1};
    assert_memory_equal(ids, want_ids, sizeof want_ids);
    assert_true(fabs(lps[0] - log_softmax_at(small, 3, 1)) < 1e-6 && lps[1] == lps[2] && lps[3] == -INFINITY &&
                lps[4] == -INFINITY);
    assert_nopad_ok(sampling_top_logprobs(&s, 0, NULL, NULL));
    assert_nopad_error(sampling_top_logprobs(&s, TOP + 1, ids, lps), NOPAD_ERR_INVALID_ARGUMENT, "at most 20");
    // a failed call leaves nothing to rank
    small[1] = NAN;
    assert_nopad_error(sample_token(&s, small, 3, &g, NULL, 0, 0, &id, NULL), NOPAD_ERR_INVALID_ARGUMENT, "NaN");
    assert_nopad_error(sampling_top_logprobs(&s, 1, ids, lps), NOPAD_ERR_INVALID_ARGUMENT, "sample_token");
    sampler_scratch_free(&s);
    free(x);
    free(probs);
    free(order);
}

static void test_print_speed(void **unused) {
    const int32_t vocabs[] = {49152, 128256};
    float *x = malloc(128256 * sizeof *x);
    assert_non_null(x);
    uint64_t state = 0x5BEED;
    fill_normal(x, 128256, 2.5, &state);
    sampler_scratch s;
    sampler_scratch_init(&s);
    nopad_sampling_params greedy = nopad_sampling_default_params();
    nopad_sampling_params nucleus = sampled(1.0f);
    nucleus.top_p = 0.9f;
    nopad_sampling_params top_k = sampled(1.0f);
    top_k.top_k = 50;
    for (int i = 0; i < 2; i++)
        printf("  vocab %6d (logits ~ N(0, 2.5^2)), one thread: greedy %7.0f ns/call, "
               "top_p 0.9 %7.0f ns/call, top_k 50 %7.0f ns/call\n",
               vocabs[i], ns_per_call(&s, x, vocabs[i], &greedy),
               ns_per_call(&s, x, vocabs[i], &nucleus), ns_per_call(&s, x, vocabs[i], &top_k));
    sampler_scratch_free(&s);
    free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_params),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_bad_calls),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_greedy_repetition_penalty),
        cmocka_unit_test(test_top_k_1_is_greedy),
        cmocka_unit_test(test_uniform),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_temperature),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_combined),
        cmocka_unit_test(test_large_vocab_reuses_scratch),
        cmocka_unit_test(test_penalties_by_hand),
        cmocka_unit_test(test_penalties_and_bias_against_reference),
        cmocka_unit_test(test_top_logprobs),
        cmocka_unit_test(test_print_speed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* The CUDA sampler (cuda_sample_rows) against the host's (sample_token, itself checked against
 * HF's definitions in test_sampling): batches of 64 rows, each with its own params, logits and
 * history, for vocabs of 1, 7, 1000, 32000, 49152, 151936 and 600000 ids. Params: greedy,
 * temperature alone, top-k 1 / 5 / >= vocab, top-p 0.05 / 0.5 / 0.9 / 1, min-p 0.05 / 0.3,
 * repetition penalty 1.3 and 0.7 over histories that repeat ids, all of them together, extreme
 * temperatures (top-p's cut bin then holds most of the vocab, more ids than the kernel lists in
 * shared memory) and random mixes. Logits: normal, exact ties from a few values (+0 and -0 among
 * them), some -inf, a flat row, logits near FLT_MAX (the penalty clamps, weights underflow),
 * logits over hundreds of nats, and the error rows (a NaN, a +inf, all -inf, a history id outside
 * the vocab, params sampling_check refuses, a mask that allows only -inf logits), where the GPU
 * gives -1. Rows also carry constraint masks (random, a single allowed id, every id allowed), the
 * presence and frequency penalties, logit_bias, and ask for the top log-probabilities (1, 3, 5 or
 * 20 a batch); the host's reference is sample_token (then sampling_top_logprobs) on the masked
 * logits. Every id must equal the host's (top ids too) and every log-probability be within 1e-5
 * (relative beyond magnitude 1; -inf exactly); a call without logprobs and top ids must give the
 * same ids. Mismatches are counted and printed before the test fails.
 * Then the backend's row_argmax (a tensor-parallel rank's greedy choice over its share of the
 * vocabulary) against the CPU op and a double-precision sum, directly and replayed from a CUDA
 * graph; and the device merge of ranks' greedy triples against the host's. Exit code 77 (skipped)
 * without a GPU. */
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/sampling_ops.h"
#include "cuda_testutil.h"
#include "model/sampling.h"

enum { ROWS = 64, BATCHES = 4, MAX_HISTORY = 3000, MAX_BIAS = 300, TOP = NOPAD_MAX_TOP_LOGPROBS };

/* The top log-probabilities each batch asks for. */
static const int32_t BATCH_TOP[BATCHES] = {5, 20, 1, 3};

/* 600000: the repetition penalty's bitmap outgrows the kernel's private histograms. */
static const int32_t VOCABS[] = {1, 7, 1000, 32000, 49152, 151936, 600000};

/* ---- random numbers (SplitMix64) ------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

static int32_t rng_below(uint64_t *s, int32_t n) { return (int32_t)(rng_unit(s) * n); }

static double rng_normal(uint64_t *s) {
    double u1 = 1.0 - rng_unit(s), u2 = rng_unit(s);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- rows --------------------------------------------------------------------------------- */

/* top_k codes below 0: -1 = vocab, -2 = vocab + 3 (both: no filter). */
typedef struct combo {
    float temperature;
    int32_t top_k;
    float top_p, min_p, repetition_penalty;
} combo;

static const combo COMBOS[] = {
    {0.0f, 0, 1.0f, 0.0f, 1.0f},       // greedy
    {0.0f, 0, 1.0f, 0.0f, 1.3f},       // greedy, penalty
    {0.0f, 0, 1.0f, 0.0f, 0.7f},
    {1.0f, 0, 1.0f, 0.0f, 1.0f},       // temperature alone
    {0.5f, 0, 1.0f, 0.0f, 1.0f},
    {1.7f, 0, 1.0f, 0.0f, 1.0f},
    {1.0f, 1, 1.0f, 0.0f, 1.0f},       // top-k
    {1.0f, 5, 1.0f, 0.0f, 1.0f},
    {0.8f, -1, 1.0f, 0.0f, 1.0f},
    {1.0f, -2, 1.0f, 0.0f, 1.0f},
    {1.0f, 0, 0.05f, 0.0f, 1.0f},      // top-p
    {1.0f, 0, 0.5f, 0.0f, 1.0f},
    {0.7f, 0, 0.9f, 0.0f, 1.0f},
    {1.3f, 0, 1.0f, 0.0f, 1.0f},
    {1.0f, 0, 1.0f, 0.05f, 1.0f},      // min-p
    {1.0f, 0, 1.0f, 0.3f, 1.0f},
    {1.0f, 0, 1.0f, 0.0f, 1.3f},       // repetition penalty
    {1.0f, 0, 1.0f, 0.0f, 0.7f},
    {0.8f, 50, 0.9f, 0.05f, 1.3f},     // everything
    {1.2f, 5, 0.5f, 0.3f, 0.7f},
    {0.6f, 1000, 0.95f, 0.02f, 1.1f},
    {2.0f, 0, 0.3f, 0.1f, 1.3f},
    {1.0f, 40, 0.05f, 0.0f, 1.0f},
    {0.3f, 0, 0.99f, 0.0f, 1.0f},
    {1.0f, 3, 1.0f, 0.5f, 1.0f},
    {5.0f, 0, 0.8f, 0.0f, 1.0f},       // high temperature: wide cut bins
    {100.0f, 0, 0.5f, 0.0f, 1.3f},     // nearly every id in top-p's first bin
    {1e-3f, 0, 0.9f, 0.0f, 1.0f},      // nearly greedy
    {1.0f, 2, 0.9f, 0.0f, 1.0f},
    {0.9f, 200, 0.7f, 0.0f, 0.7f},
};
enum { N_COMBOS = sizeof COMBOS / sizeof COMBOS[0] };

typedef enum kind {
    K_NORMAL, K_TIES, K_NEG_INF, K_FLAT, K_HUGE, K_WIDE, // sampled
    K_NAN, K_POS_INF, K_ALL_NEG_INF, K_BAD_HISTORY, K_BAD_PARAMS, K_MASKED_NEG_INF, // errors: -1
} kind;
static const char *const KIND_NAMES[] = {"normal", "ties", "some -inf", "flat", "huge", "wide",
                                         "NaN", "+inf", "all -inf", "bad history", "bad params",
                                         "a mask allowing only -inf"};

/* The sampled kinds, in the order rows take them (normal most often). */
static const kind KIND_CYCLE[] = {K_NORMAL, K_TIES, K_NEG_INF, K_NORMAL, K_FLAT,
                                  K_HUGE,   K_TIES, K_WIDE,    K_NORMAL};
enum { N_CYCLE = sizeof KIND_CYCLE / sizeof KIND_CYCLE[0] };

static void fill_logits(float *x, int32_t V, kind k, uint64_t *s) {
    static const float TIE_VALUES[] = {3.0f, 1.5f, 0.0f, -0.0f, -1.25f, -4.0f, 0.75f};
    switch (k) {
    case K_TIES: {
        int n_values = 2 + rng_below(s, 6); // 2..7 distinct values (+0 and -0 count as one)
        int first = rng_below(s, 7 - n_values + 1);
        for (int32_t i = 0; i < V; i++) x[i] = TIE_VALUES[first + rng_below(s, n_values)];
        break;
    }
    case K_FLAT:
        for (int32_t i = 0; i < V; i++) x[i] = 0.5f;
        break;
    case K_HUGE: // a few ids near +-FLT_MAX among normal ones
        for (int32_t i = 0; i < V; i++) {
            double u = rng_unit(s);
            x[i] = u < 0.05 ? 3.0e38f : u < 0.1 ? -3.0e38f : (float)(2.0 * rng_normal(s));
        }
        break;
    case K_WIDE: // logits over hundreds of nats: most weights underflow
        for (int32_t i = 0; i < V; i++) x[i] = (float)(300.0 * rng_normal(s));
        break;
    default: { // normal, with a few strong ids, as a language model's rows look
        double sd = 1.0 + 3.0 * rng_unit(s);
        for (int32_t i = 0; i < V; i++) x[i] = (float)(sd * rng_normal(s));
        int peaks = rng_below(s, 6);
        for (int j = 0; j < peaks; j++) x[rng_below(s, V)] += (float)(5.0 + 10.0 * rng_unit(s));
        break;
    }
    }
    if (k == K_NEG_INF) { // 40% of the ids, sometimes all but one
        int all_but_one = rng_below(s, 4) == 0;
        int32_t keep = rng_below(s, V);
        for (int32_t i = 0; i < V; i++)
            if (i != keep && (all_but_one || rng_unit(s) < 0.4)) x[i] = -INFINITY;
    }
    if (k == K_NAN) x[rng_below(s, V)] = NAN;
    if (k == K_POS_INF) x[rng_below(s, V)] = INFINITY;
    if (k == K_ALL_NEG_INF)
        for (int32_t i = 0; i < V; i++) x[i] = -INFINITY;
}

static int32_t argmax(const float *x, int32_t V) {
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* A history that repeats ids: drawn from a pool a third of its length, often with the top id. */
static int32_t fill_history(int32_t *h, const float *x, int32_t V, uint64_t *s) {
    if (rng_below(s, 4) == 0) return 0;
    int32_t n = 1 + rng_below(s, MAX_HISTORY);
    int32_t pool[1024];
    int32_t n_pool = 1 + rng_below(s, n / 3 + 1);
    if (n_pool > 1024) n_pool = 1024;
    for (int32_t j = 0; j < n_pool; j++) pool[j] = rng_below(s, V);
    if (rng_below(s, 2)) pool[0] = argmax(x, V);
    for (int32_t j = 0; j < n; j++) h[j] = pool[rng_below(s, n_pool)];
    return n;
}

static const char *const MASK_NAMES[] = {"no mask", "a random mask", "one id allowed", "every id allowed",
                                         "a mask allowing only -inf"};

static void describe(char *buf, size_t cap, const nopad_sampling_params *p, kind k,
                     int32_t n_hist, int mask_kind) {
    snprintf(buf, cap, "%s logits, t %g top_k %d top_p %g min_p %g penalty %g presence %g frequency %g, "
             "%d logit_bias, %s, %d history ids", KIND_NAMES[k], (double)p->temperature, p->top_k,
             (double)p->top_p, (double)p->min_p, (double)p->repetition_penalty, (double)p->presence_penalty,
             (double)p->frequency_penalty, p->n_logit_bias, MASK_NAMES[mask_kind], n_hist);
}

static int close_logprob(float got, float want) {
    if (got == want) return 1; // -inf on both sides too
    return fabsf(got - want) <= 1e-5f * fmaxf(1.0f, fabsf(want));
}

#define CUDA_OK(expr) assert_int_equal((expr), cudaSuccess)

/* ---- a batch: rows, the host's choices, the GPU's ------------------------------------------ */

typedef struct batch {
    int32_t V, words, n_top;
    float *logits;   /* [ROWS, V] host */
    int32_t *hist;   /* [ROWS * MAX_HISTORY] host, the rows' histories one after another */
    int32_t n_hist;
    nopad_logit_bias *bias; /* [ROWS * MAX_BIAS] the rows' logit_bias pairs one after another */
    int32_t n_bias;
    uint32_t *masks; /* [ROWS, words] the masked rows' bitmaps, n_masks of them */
    int32_t n_masks;
    float *masked;   /* [V] scratch: a row's logits after its mask */
    cuda_sample_row rows[ROWS];
    nopad_sampling_params params[ROWS];
    kind kinds[ROWS];
    int mask_kinds[ROWS];
    int32_t want_id[ROWS];
    float want_lp[ROWS];
    int32_t want_top_id[ROWS * TOP];
    float want_top_lp[ROWS * TOP];
} batch;

/* Params for row r of batch b: the combos in turn, every fourth row a random mix. */
static nopad_sampling_params row_params(int r, int b, int32_t V, uint64_t *rng) {
    nopad_sampling_params p = nopad_sampling_default_params();
    if (r % 4 == 3) {
        p.temperature = rng_below(rng, 6) == 0 ? 0.0f : (float)(0.1 + 2.0 * rng_unit(rng));
        p.top_k = rng_below(rng, 2) ? 0 : 1 + rng_below(rng, 100);
        p.top_p = rng_below(rng, 2) ? 1.0f : (float)(0.02 + 0.98 * rng_unit(rng));
        p.min_p = rng_below(rng, 2) ? 0.0f : (float)(0.4 * rng_unit(rng));
        p.repetition_penalty = rng_below(rng, 2) ? 1.0f : (float)(0.5 + rng_unit(rng));
    } else {
        const combo *c = &COMBOS[(r + b * 11) % N_COMBOS];
        p.temperature = c->temperature;
        p.top_k = c->top_k == -1 ? V : c->top_k == -2 ? V + 3 : c->top_k;
        p.top_p = c->top_p;
        p.min_p = c->min_p;
        p.repetition_penalty = c->repetition_penalty;
    }
    if (r % 3 == 0) { // OpenAI's penalties, in their whole range
        p.presence_penalty = (float)(4.0 * rng_unit(rng) - 2.0);
        p.frequency_penalty = (float)(4.0 * rng_unit(rng) - 2.0);
    }
    p.seed = rng_next(rng);
    return p;
}

/* Row r's logit_bias (every sixth row): up to MAX_BIAS distinct ids, consecutive from a random one,
 * biases in [-100, 100]; appended to the batch's pairs. */
static void row_bias(batch *bt, int r, nopad_sampling_params *p, uint64_t *rng) {
    if (r % 6 != 0) return;
    const int32_t V = bt->V, n = 1 + rng_below(rng, V < MAX_BIAS ? V : MAX_BIAS), first = rng_below(rng, V);
    nopad_logit_bias *b = bt->bias + bt->n_bias;
    for (int32_t j = 0; j < n; j++) b[j] = (nopad_logit_bias){(first + j) % V, (float)(200.0 * rng_unit(rng) - 100.0)};
    p->logit_bias = b;
    p->n_logit_bias = n;
    bt->n_bias += n;
}

/* Row r's mask kind: 0 none, 1 random (each id kept with probability 1/2 or 1/20), 2 a single id,
 * 3 every id, 4 only ids of -inf logits (an error row). */
static int row_mask_kind(int r, kind k) {
    if (k >= K_NAN) return k == K_MASKED_NEG_INF ? 4 : 0; // a mask could hide the other errors
    return r % 5 == 1 ? 1 : r % 10 == 2 ? 2 : r % 10 == 7 ? 3 : 0;
}

/* Fills the mask of row r's logits x (when it has one) into the batch's next bitmap and returns its
 * index from 1 (0: none); bt->masked = x with the refused ids -inf. */
static int32_t row_mask(batch *bt, const float *x, int mask_kind, uint64_t *rng) {
    const int32_t V = bt->V;
    memcpy(bt->masked, x, (size_t)V * sizeof *x);
    if (mask_kind == 0) return 0;
    uint32_t *m = bt->masks + (size_t)bt->n_masks * bt->words;
    memset(m, 0, (size_t)bt->words * sizeof *m);
    const double keep = rng_below(rng, 2) ? 0.5 : 0.05;
    const int32_t only = rng_below(rng, V);
    for (int32_t i = 0; i < V; i++) {
        const int allowed = mask_kind == 1 ? rng_unit(rng) < keep : mask_kind == 2 ? i == only
                          : mask_kind == 3 ? 1 : x[i] == -INFINITY;
        if (allowed) m[i >> 5] |= 1u << (i & 31);
        else bt->masked[i] = -INFINITY;
    }
    return ++bt->n_masks;
}

/* Fills batch b's rows (the last five are the error rows) and the host's choices; returns the
 * number of rows the host refused. */
static int make_batch(batch *bt, int b, sampler_scratch *scratch, uint64_t *rng) {
    const int32_t V = bt->V;
    int refused = 0;
    bt->n_hist = bt->n_bias = bt->n_masks = 0;
    bt->n_top = BATCH_TOP[b % BATCHES];
    for (int r = 0; r < ROWS; r++) {
        float *x = bt->logits + (size_t)r * V;
        const kind k = r == ROWS - 1 ? K_NAN : r == ROWS - 2 ? K_POS_INF
                     : r == ROWS - 3 ? K_ALL_NEG_INF : r == ROWS - 4 ? K_BAD_HISTORY
                     : r == ROWS - 5 ? K_BAD_PARAMS : r == ROWS - 6 ? K_MASKED_NEG_INF
                     : KIND_CYCLE[(r * 5 + b) % N_CYCLE];
        fill_logits(x, V, k == K_MASKED_NEG_INF ? K_NEG_INF : k, rng);
        nopad_sampling_params p = row_params(r, b, V, rng);
        row_bias(bt, r, &p, rng);
        const int mask_kind = row_mask_kind(r, k);
        const int32_t mask_index = row_mask(bt, x, mask_kind, rng);
        if (k == K_BAD_PARAMS) p.top_p = 0.0f;
        const uint64_t step = rng_next(rng) % 5000;
        int32_t *h = bt->hist + bt->n_hist;
        int32_t n_h = fill_history(h, x, V, rng);
        if (k == K_BAD_HISTORY) {
            if (n_h == 0) h[n_h++] = 0;
            h[rng_below(rng, n_h)] = rng_below(rng, 2) ? V : -1;
        }
        bt->kinds[r] = k;
        bt->mask_kinds[r] = mask_kind;
        bt->params[r] = p;
        bt->rows[r] = (cuda_sample_row){.temperature = p.temperature, .top_p = p.top_p,
                                        .min_p = p.min_p,
                                        .repetition_penalty = p.repetition_penalty,
                                        .presence_penalty = p.presence_penalty,
                                        .frequency_penalty = p.frequency_penalty,
                                        .top_k = p.top_k, .history_start = bt->n_hist,
                                        .history_len = n_h,
                                        .bias_start = p.n_logit_bias ? (int32_t)(p.logit_bias - bt->bias) : 0,
                                        .bias_len = p.n_logit_bias, .mask_index = mask_index,
                                        .seed = p.seed, .step = step};
        bt->n_hist += n_h;
        if (sample_token(scratch, bt->masked, V, &p, h, n_h, step, &bt->want_id[r], &bt->want_lp[r]) !=
                NOPAD_OK ||
            sampling_top_logprobs(scratch, bt->n_top, bt->want_top_id + r * TOP, bt->want_top_lp + r * TOP) !=
                NOPAD_OK) {
            bt->want_id[r] = -1;
            refused++;
        }
    }
    return refused;
}

typedef struct device_batch {
    float *logits, *lp, *top_lp;
    cuda_sample_row *rows;
    int32_t *hist, *ids, *top_ids;
    nopad_logit_bias *bias;
    uint32_t *masks;
} device_batch;

/* One call on fresh logits, with the log-probabilities and the batch's top ones or with neither;
 * returns its time in ms (events around the launch). */
static float run_gpu(const batch *bt, const device_batch *d, int with_logprobs, int32_t *ids,
                     float *lp, int32_t *top_ids, float *top_lp) {
    const size_t n = (size_t)ROWS * bt->V;
    CUDA_OK(cudaMemcpy(d->logits, bt->logits, n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d->ids, 0x7f, ROWS * sizeof(int32_t)));
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    CUDA_OK(cudaEventRecord(e0, 0));
    const int32_t n_top = with_logprobs ? bt->n_top : 0;
    assert_nopad_ok(cuda_sample_rows(d->logits, ROWS, bt->V, d->rows, d->hist, d->bias, d->masks, d->ids,
                                     with_logprobs ? d->lp : NULL, n_top, d->top_ids, d->top_lp, NULL));
    CUDA_OK(cudaEventRecord(e1, 0));
    CUDA_OK(cudaDeviceSynchronize());
    float ms = 0.0f;
    CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    CUDA_OK(cudaMemcpy(ids, d->ids, ROWS * sizeof(int32_t), cudaMemcpyDeviceToHost));
    if (with_logprobs) {
        CUDA_OK(cudaMemcpy(lp, d->lp, ROWS * sizeof(float), cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(top_ids, d->top_ids, (size_t)ROWS * n_top * sizeof(int32_t), cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(top_lp, d->top_lp, (size_t)ROWS * n_top * sizeof(float), cudaMemcpyDeviceToHost));
    }
    return ms;
}

/* ---- the tests ------------------------------------------------------------------------------ */

static void test_against_host(void **state) {
    (void)state;
    uint64_t rng = 20261201;
    sampler_scratch scratch;
    sampler_scratch_init(&scratch);
    int64_t total = 0, mismatches = 0, refused = 0, masked_rows = 0;
    for (size_t vi = 0; vi < sizeof VOCABS / sizeof VOCABS[0]; vi++) {
        batch *bt = calloc(1, sizeof *bt);
        bt->V = VOCABS[vi];
        const size_t n = (size_t)ROWS * bt->V;
        bt->words = (bt->V + 31) / 32;
        bt->logits = malloc(n * sizeof *bt->logits);
        bt->hist = malloc((size_t)ROWS * MAX_HISTORY * sizeof *bt->hist);
        bt->bias = malloc((size_t)ROWS * MAX_BIAS * sizeof *bt->bias);
        bt->masks = malloc((size_t)ROWS * bt->words * sizeof *bt->masks);
        bt->masked = malloc((size_t)bt->V * sizeof *bt->masked);
        device_batch d;
        CUDA_OK(cudaMalloc((void **)&d.logits, n * sizeof(float)));
        CUDA_OK(cudaMalloc((void **)&d.lp, ROWS * sizeof(float)));
        CUDA_OK(cudaMalloc((void **)&d.rows, sizeof bt->rows));
        CUDA_OK(cudaMalloc((void **)&d.hist, (size_t)ROWS * MAX_HISTORY * sizeof(int32_t)));
        CUDA_OK(cudaMalloc((void **)&d.ids, ROWS * sizeof(int32_t)));
        CUDA_OK(cudaMalloc((void **)&d.bias, (size_t)ROWS * MAX_BIAS * sizeof(nopad_logit_bias)));
        CUDA_OK(cudaMalloc((void **)&d.masks, (size_t)ROWS * bt->words * sizeof(uint32_t)));
        CUDA_OK(cudaMalloc((void **)&d.top_ids, (size_t)ROWS * TOP * sizeof(int32_t)));
        CUDA_OK(cudaMalloc((void **)&d.top_lp, (size_t)ROWS * TOP * sizeof(float)));
        float best_ms = 1e30f;
        for (int b = 0; b < BATCHES; b++) {
            refused += make_batch(bt, b, &scratch, &rng);
            CUDA_OK(cudaMemcpy(d.rows, bt->rows, sizeof bt->rows, cudaMemcpyHostToDevice));
            if (bt->n_hist > 0)
                CUDA_OK(cudaMemcpy(d.hist, bt->hist, (size_t)bt->n_hist * sizeof(int32_t),
                                   cudaMemcpyHostToDevice));
            if (bt->n_bias > 0)
                CUDA_OK(cudaMemcpy(d.bias, bt->bias, (size_t)bt->n_bias * sizeof(nopad_logit_bias),
                                   cudaMemcpyHostToDevice));
            if (bt->n_masks > 0)
                CUDA_OK(cudaMemcpy(d.masks, bt->masks, (size_t)bt->n_masks * bt->words * sizeof(uint32_t),
                                   cudaMemcpyHostToDevice));
            // with logprobs twice (the second timed), then without: the ids must not change
            int32_t got_id[ROWS], again_id[ROWS], top_id[ROWS * TOP];
            float got_lp[ROWS], top_lp[ROWS * TOP], ms;
            const int32_t k = bt->n_top;
            run_gpu(bt, &d, 1, got_id, got_lp, top_id, top_lp);
            ms = run_gpu(bt, &d, 1, again_id, got_lp, top_id, top_lp);
            if (ms < best_ms) best_ms = ms;
            run_gpu(bt, &d, 0, again_id, NULL, NULL, NULL);
            for (int r = 0; r < ROWS; r++) {
                total++;
                const int ok_id = got_id[r] == bt->want_id[r] && again_id[r] == got_id[r];
                const int ok_lp = bt->want_id[r] < 0 || close_logprob(got_lp[r], bt->want_lp[r]);
                int ok_top = 1, bad_j = -1;
                for (int j = 0; j < k && bt->want_id[r] >= 0 && ok_top; j++) {
                    ok_top = top_id[r * k + j] == bt->want_top_id[r * TOP + j] &&
                             close_logprob(top_lp[r * k + j], bt->want_top_lp[r * TOP + j]);
                    if (!ok_top) bad_j = j;
                }
                masked_rows += bt->mask_kinds[r] != 0;
                if (ok_id && ok_lp && ok_top) continue;
                mismatches++;
                char what[400];
                describe(what, sizeof what, &bt->params[r], bt->kinds[r], bt->rows[r].history_len,
                         bt->mask_kinds[r]);
                printf("  MISMATCH vocab %d batch %d row %d (%s): host id %d logprob %.7g, GPU id "
                       "%d logprob %.7g, without logprobs %d\n", bt->V, b, r, what,
                       bt->want_id[r], (double)bt->want_lp[r], got_id[r], (double)got_lp[r],
                       again_id[r]);
                if (bad_j >= 0)
                    printf("    top %d of %d: host id %d logprob %.7g, GPU id %d logprob %.7g\n", bad_j, k,
                           bt->want_top_id[r * TOP + bad_j], (double)bt->want_top_lp[r * TOP + bad_j],
                           top_id[r * k + bad_j], (double)top_lp[r * k + bad_j]);
            }
        }
        printf("  vocab %6d: %d batches of %d rows, %.3f ms a call\n", bt->V, BATCHES, ROWS,
               (double)best_ms);
        cudaFree(d.logits);
        cudaFree(d.lp);
        cudaFree(d.rows);
        cudaFree(d.hist);
        cudaFree(d.ids);
        cudaFree(d.bias);
        cudaFree(d.masks);
        cudaFree(d.top_ids);
        cudaFree(d.top_lp);
        free(bt->logits);
        free(bt->hist);
        free(bt->bias);
        free(bt->masks);
        free(bt->masked);
        free(bt);
    }
    sampler_scratch_free(&scratch);
    printf("  %lld rows (%lld the host refused, %lld masked), %lld mismatches\n", (long long)total,
           (long long)refused, (long long)masked_rows, (long long)mismatches);
    assert_true(refused >= 6 * BATCHES * (int64_t)(sizeof VOCABS / sizeof VOCABS[0]));
    assert_int_equal(mismatches, 0);
}

/* The launcher's own checks, and a call of no rows. */
static void test_arguments(void **state) {
    (void)state;
    assert_nopad_ok(cuda_sample_rows(NULL, 0, 10, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL));
    assert_nopad_error(cuda_sample_rows(NULL, 1, 10, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "NULL");
    assert_nopad_error(cuda_sample_rows(NULL, 1, 0, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "vocab");
    float *d;
    int32_t *id;
    cuda_sample_row *row;
    CUDA_OK(cudaMalloc((void **)&d, 4));
    CUDA_OK(cudaMalloc((void **)&id, 4));
    CUDA_OK(cudaMalloc((void **)&row, sizeof *row));
    assert_nopad_error(cuda_sample_rows(d, 1, 2000000, row, NULL, NULL, NULL, id, NULL, 0, NULL, NULL, NULL),
                       NOPAD_ERR_UNSUPPORTED, "vocab of 2000000");
    assert_nopad_error(cuda_sample_rows(d, 1, 10, row, NULL, NULL, NULL, id, NULL, 21, id, d, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "21 top ids; 0 to 20");
    assert_nopad_error(cuda_sample_rows(d, 1, 10, row, NULL, NULL, NULL, id, NULL, 2, NULL, d, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "without their arrays");
    cudaFree(d);
    cudaFree(id);
    cudaFree(row);
}

/* ---- row_argmax ------------------------------------------------------------------------------ */

/* The row kinds row_argmax sees: the sampled kinds, then those without a choice. */
static const kind ARGMAX_KINDS[] = {K_NORMAL, K_TIES, K_NEG_INF, K_FLAT, K_HUGE, K_WIDE, K_NAN, K_POS_INF, K_ALL_NEG_INF};
enum { N_ARGMAX_KINDS = sizeof ARGMAX_KINDS / sizeof ARGMAX_KINDS[0] };

/* x [rows, ld] (host) with rows of every kind, ld > cols, the extra columns FLT_MAX or NaN. */
static float *make_argmax_rows(int32_t rows, int32_t cols, int32_t ld, uint64_t *rng) {
    float *x = malloc((size_t)rows * ld * sizeof *x);
    const float pad = rng_below(rng, 2) ? FLT_MAX : NAN;
    for (int32_t r = 0; r < rows; r++) {
        float *row = x + (size_t)r * ld;
        if (cols > 0) fill_logits(row, cols, rows == 1 ? K_NORMAL : ARGMAX_KINDS[r % N_ARGMAX_KINDS], rng);
        for (int32_t j = cols; j < ld; j++) row[j] = pad;
    }
    return x;
}

/* The CUDA op against the CPU op on the same rows (rows 1, 7, 256 x cols 0, 1, 13, 5000, 49152,
 * 151936; ids from id0 != 0): max and id exact (bits), the rows without a choice exactly {NaN, -1, 0}
 * or {-inf, -1, 0}; the GPU's exp-sum within its bound (test_expsum_bound of a double sum) of the
 * exact sum, and of the CPU's (also a double sum) within both ops' bounds (the orders differ). */
static void test_row_argmax_against_cpu(void **state) {
    (void)state;
    static const int32_t ROWS_[] = {1, 7, 256}, COLS[] = {0, 1, 13, 5000, 49152, 151936};
    nopad_backend *cpu, *gpu;
    assert_nopad_ok(nopad_backend_cpu_create(0, &cpu));
    assert_nopad_ok(nopad_backend_cuda_create(NOPAD_DTYPE_BF16, 0, NULL, &gpu));
    assert_non_null(gpu->row_argmax);
    uint64_t rng = 20261206;
    double worst_exact = 0.0, worst_cpu = 0.0;
    int64_t checked = 0, no_choice = 0;
    for (size_t ri = 0; ri < sizeof ROWS_ / sizeof ROWS_[0]; ri++)
        for (size_t ci = 0; ci < sizeof COLS / sizeof COLS[0]; ci++) {
            const int32_t rows = ROWS_[ri], cols = COLS[ci], ld = cols + 1 + rng_below(&rng, 8);
            const int32_t id0 = 1 + rng_below(&rng, 1000000);
            float *x = make_argmax_rows(rows, cols, ld, &rng);                    /* [rows, ld] */
            float *want = malloc((size_t)rows * 3 * sizeof *want), *got = malloc((size_t)rows * 3 * sizeof *got);
            float *d_x, *d_best;
            assert_nopad_ok(gpu->alloc(gpu, (size_t)rows * ld * sizeof(float), (void **)&d_x));
            assert_nopad_ok(gpu->alloc(gpu, (size_t)rows * 3 * sizeof(float), (void **)&d_best));
            assert_nopad_ok(gpu->upload(gpu, d_x, x, (size_t)rows * ld * sizeof(float)));
            CUDA_OK(cudaMemsetAsync(d_best, 0x7f, (size_t)rows * 3 * sizeof(float), gpu->native_stream)); /* poison */
            assert_nopad_ok(gpu->row_argmax(gpu, d_best, d_x, rows, cols, ld, id0));
            assert_nopad_ok(gpu->download(gpu, got, d_best, (size_t)rows * 3 * sizeof(float)));
            assert_nopad_ok(cpu->row_argmax(cpu, want, x, rows, cols, ld, id0));
            for (int32_t r = 0; r < rows; r++) {
                const test_argmax_ref ref = test_reference_row_argmax(x + (size_t)r * ld, cols);
                const float *g = got + (size_t)r * 3, *c = want + (size_t)r * 3;
                char where[128];
                snprintf(where, sizeof where, "row_argmax rows %d cols %d ld %d id0 %d, row %d (%s)", rows, cols,
                         ld, id0, r, KIND_NAMES[rows == 1 ? K_NORMAL : ARGMAX_KINDS[r % N_ARGMAX_KINDS]]);
                checked++;
                const int same_max = (isnan(g[0]) && isnan(c[0])) || memcmp(&g[0], &c[0], sizeof g[0]) == 0;
                if (!same_max || g[1] != c[1])
                    fail_msg("%s: GPU max %.9g at id %.0f, CPU %.9g at id %.0f", where, g[0], g[1], c[0], c[1]);
                if (ref.bad || ref.at < 0) {
                    no_choice++;
                    const int ok = ref.bad ? isnan(g[0]) : g[0] == -INFINITY;
                    if (!ok || g[1] != -1.0f || g[2] != 0.0f || c[2] != 0.0f)
                        fail_msg("%s: GPU {%g, %g, %g}, CPU exp-sum %g, want {%s, -1, 0}", where, g[0], g[1], g[2],
                                 c[2], ref.bad ? "NaN" : "-inf");
                    continue;
                }
                if (g[1] != (float)(id0 + ref.at)) fail_msg("%s: id %.0f, want %d", where, g[1], id0 + ref.at);
                const double bound_gpu = test_expsum_bound(cols, ref.spread, 0);
                const double bound_both = 2 * bound_gpu; /* both sum in double */
                const double err_exact = fabs(g[2] - ref.z) / ref.z, err_cpu = fabs((double)g[2] - c[2]) / ref.z;
                if (!(err_exact <= bound_gpu))
                    fail_msg("%s: exp-sum %.9g, exact %.17g: error %.3e over %.3e", where, g[2], ref.z, err_exact,
                             bound_gpu);
                if (!(err_cpu <= bound_both))
                    fail_msg("%s: exp-sum %.9g, CPU %.9g: %.3e apart, over %.3e", where, g[2], c[2], err_cpu,
                             bound_both);
                worst_exact = fmax(worst_exact, err_exact);
                worst_cpu = fmax(worst_cpu, err_cpu);
            }
            gpu->free(gpu, d_x);
            gpu->free(gpu, d_best);
            free(x);
            free(want);
            free(got);
        }
    printf("  row_argmax: %lld rows (%lld without a choice); exp-sum at most %.2e from the exact sum, %.2e from "
           "the CPU's\n", (long long)checked, (long long)no_choice, worst_exact, worst_cpu);
    gpu->destroy(gpu);
    cpu->destroy(cpu);
}

typedef struct argmax_call {
    nopad_backend *be;
    float *best;
    const float *x;
    int32_t rows, cols, ld, id0;
} argmax_call;

static nopad_status record_row_argmax(void *ctx) {
    const argmax_call *a = ctx;
    return a->be->row_argmax(a->be, a->best, a->x, a->rows, a->cols, a->ld, a->id0);
}

/* The op inside a recorded graph (graph_run runs a key directly, records it the second time and
 * replays it after): on fresh rows each time, the result equals the CPU op's bit for bit in max
 * and id, and the exp-sum within both bounds; the graph was recorded once and replayed. */
static void test_row_argmax_graph(void **state) {
    (void)state;
    nopad_backend *cpu, *gpu;
    assert_nopad_ok(nopad_backend_cpu_create(0, &cpu));
    assert_nopad_ok(nopad_backend_cuda_create(NOPAD_DTYPE_F16, 0, NULL, &gpu));
    enum { ROWS_G = 33, COLS_G = 49152, LD_G = COLS_G + 5, ID0_G = 49152 };
    uint64_t rng = 77;
    float *d_x, *d_best;
    assert_nopad_ok(gpu->alloc(gpu, (size_t)ROWS_G * LD_G * sizeof(float), (void **)&d_x));
    assert_nopad_ok(gpu->alloc(gpu, (size_t)ROWS_G * 3 * sizeof(float), (void **)&d_best));
    argmax_call call = {.be = gpu, .best = d_best, .x = d_x, .rows = ROWS_G, .cols = COLS_G, .ld = LD_G, .id0 = ID0_G};
    const int64_t key[4] = {ROWS_G, COLS_G, LD_G, 0x6172676d6178}; /* "argmax" */
    const int64_t recorded = gpu->graphs_recorded, replays = gpu->graph_replays;
    float got[ROWS_G * 3], want[ROWS_G * 3];
    for (int run = 0; run < 4; run++) {
        float *x = make_argmax_rows(ROWS_G, COLS_G, LD_G, &rng);
        assert_nopad_ok(gpu->upload(gpu, d_x, x, (size_t)ROWS_G * LD_G * sizeof(float)));
        CUDA_OK(cudaMemsetAsync(d_best, 0x7f, sizeof got, gpu->native_stream));
        assert_nopad_ok(gpu->graph_run(gpu, key, record_row_argmax, &call));
        assert_nopad_ok(gpu->download(gpu, got, d_best, sizeof got));
        assert_nopad_ok(cpu->row_argmax(cpu, want, x, ROWS_G, COLS_G, LD_G, ID0_G));
        for (int32_t r = 0; r < ROWS_G; r++) {
            const float *g = got + r * 3, *c = want + r * 3;
            const test_argmax_ref ref = test_reference_row_argmax(x + (size_t)r * LD_G, COLS_G);
            const int same_max = (isnan(g[0]) && isnan(c[0])) || memcmp(&g[0], &c[0], sizeof g[0]) == 0;
            const double bound =
                ref.z > 0 ? 2 * test_expsum_bound(COLS_G, ref.spread, 0) : 0; /* both sum in double */
            const double apart = ref.z > 0 ? fabs((double)g[2] - c[2]) / ref.z : fabs((double)g[2] - c[2]);
            if (!same_max || g[1] != c[1] || !(apart <= bound))
                fail_msg("row_argmax in a graph, run %d row %d: GPU {%.9g, %.0f, %.9g}, CPU {%.9g, %.0f, %.9g}", run,
                         r, g[0], g[1], g[2], c[0], c[1], c[2]);
        }
        free(x);
    }
    assert_int_equal(gpu->graphs_recorded - recorded, 1);
    assert_int_equal(gpu->graph_replays - replays, 3);
    gpu->free(gpu, d_x);
    gpu->free(gpu, d_best);
    gpu->destroy(gpu);
    cpu->destroy(cpu);
}

/* Shapes the op refuses, and a call of no rows. */
static void test_row_argmax_arguments(void **state) {
    (void)state;
    nopad_backend *gpu;
    assert_nopad_ok(nopad_backend_cuda_create(NOPAD_DTYPE_BF16, 0, NULL, &gpu));
    assert_nopad_ok(gpu->row_argmax(gpu, NULL, NULL, 0, 10, 10, 0));
    assert_nopad_error(gpu->row_argmax(gpu, NULL, NULL, -1, 10, 10, 0), NOPAD_ERR_INVALID_ARGUMENT, "rows >= 0");
    assert_nopad_error(gpu->row_argmax(gpu, NULL, NULL, 2, 10, 9, 0), NOPAD_ERR_INVALID_ARGUMENT, "ld >= cols");
    assert_nopad_error(gpu->row_argmax(gpu, NULL, NULL, 2, -1, 9, 0), NOPAD_ERR_INVALID_ARGUMENT, "cols >= 0");
    gpu->destroy(gpu);
}

/* ---- greedy merge ------------------------------------------------------------------------- */

/* The device merge of ranks' triples (greedy_merge_begin, then sample_wait) against the host's
 * (sampling_merge_greedy, which the CPU tensor-parallel path runs): parts 1, 2, 3, 4 and 8 of
 * rows 1, 7 and 300, each row one of: distinct maxes, the same max on several parts (the lowest
 * part wins), some parts -inf, exp-sums from 1 to the vocabulary's size, maxes hundreds of nats
 * apart. Ids equal; log-probabilities within 2 float ulps of the host's (both take the same double
 * expression, exp and log within an ulp of double, and round once to float), and without
 * logprobs the same ids. Then the rows with no choice: a NaN part, or only -inf parts, fail
 * sample_wait naming the row. */
static void fill_triples(float *best, int32_t parts, int32_t n, uint64_t *rng) {
    const int32_t stride = 1 + rng_below(rng, 50000); /* ids a part holds */
    for (int32_t r = 0; r < n; r++) {
        const int kind = rng_below(rng, 4);
        const float base = (float)(rng_normal(rng) * 10.0);
        for (int32_t k = 0; k < parts; k++) {
            float *t = best + ((size_t)k * n + r) * 3;
            float m = base + (float)(kind == 3 ? rng_normal(rng) * 300.0 : rng_normal(rng) * 3.0);
            if (kind == 1 && rng_below(rng, 2)) m = base; /* ties across parts */
            const int inf = kind == 2 && k != (r % parts) && rng_below(rng, 2);
            t[0] = inf ? -INFINITY : m;
            t[1] = inf ? -1.0f : (float)(k * stride + rng_below(rng, stride));
            t[2] = inf ? 0.0f : (float)(1.0 + rng_unit(rng) * stride);
        }
    }
}

static void test_greedy_merge_against_host(void **state) {
    (void)state;
    static const int32_t PARTS[] = {1, 2, 3, 4, 8}, NS[] = {1, 7, 300};
    nopad_backend *gpu;
    assert_nopad_ok(nopad_backend_cuda_create(NOPAD_DTYPE_F16, 0, NULL, &gpu));
    assert_non_null(gpu->greedy_merge_begin);
    uint64_t rng = 20261207;
    int64_t checked = 0;
    float worst_ulps = 0.0f;
    for (size_t pi = 0; pi < sizeof PARTS / sizeof PARTS[0]; pi++)
        for (size_t ni = 0; ni < sizeof NS / sizeof NS[0]; ni++) {
            const int32_t parts = PARTS[pi], n = NS[ni];
            const size_t bytes = (size_t)parts * n * 3 * sizeof(float);
            float *best = malloc(bytes), *d_best, *lp = malloc((size_t)n * sizeof *lp);
            int32_t *ids = malloc((size_t)n * sizeof *ids), *ids2 = malloc((size_t)n * sizeof *ids2), *d_ids;
            fill_triples(best, parts, n, &rng);
            assert_nopad_ok(gpu->alloc(gpu, bytes, (void **)&d_best));
            assert_nopad_ok(gpu->alloc(gpu, (size_t)n * sizeof(int32_t), (void **)&d_ids));
            assert_nopad_ok(gpu->upload(gpu, d_best, best, bytes));
            assert_nopad_ok(gpu->greedy_merge_begin(gpu, d_best, parts, n, 1, d_ids));
            assert_nopad_ok(gpu->sample_wait(gpu, ids, lp, n, 0, NULL, NULL));
            assert_nopad_ok(gpu->greedy_merge_begin(gpu, d_best, parts, n, 0, d_ids));
            assert_nopad_ok(gpu->sample_wait(gpu, ids2, NULL, n, 0, NULL, NULL));
            int32_t *fed = malloc((size_t)n * sizeof *fed); /* ids_out: the next step's feed */
            assert_nopad_ok(gpu->download(gpu, fed, d_ids, (size_t)n * sizeof(int32_t)));
            for (int32_t r = 0; r < n; r++) {
                int32_t want;
                float want_lp;
                assert_nopad_ok(sampling_merge_greedy(best, parts, n, r, &want, &want_lp));
                const float ulps = fabsf(lp[r] - want_lp) / fmaxf(fabsf(want_lp) * FLT_EPSILON, FLT_MIN);
                if (ids[r] != want || ids2[r] != want || fed[r] != want || !(ulps <= 2.0f))
                    fail_msg("greedy merge, %d parts, %d rows, row %d: GPU id %d / %d (fed %d) logprob %.9g, host "
                             "id %d logprob %.9g", parts, n, r, ids[r], ids2[r], fed[r], lp[r], want, want_lp);
                worst_ulps = fmaxf(worst_ulps, ulps);
                checked++;
            }
            /* a NaN part, then only -inf parts, in a random row: sample_wait names it */
            const int32_t bad_row = rng_below(&rng, n);
            for (int pass = 0; pass < 2; pass++) {
                for (int32_t k = 0; k < parts; k++) {
                    float *t = best + ((size_t)k * n + bad_row) * 3;
                    if (pass == 0 && k == parts - 1) t[0] = NAN;
                    if (pass == 1) t[0] = -INFINITY, t[1] = -1.0f, t[2] = 0.0f;
                }
                assert_nopad_ok(gpu->upload(gpu, d_best, best, bytes));
                assert_nopad_ok(gpu->greedy_merge_begin(gpu, d_best, parts, n, 1, d_ids));
                char row_name[32];
                snprintf(row_name, sizeof row_name, "row %d ", bad_row);
                assert_nopad_error(gpu->sample_wait(gpu, ids, lp, n, 0, NULL, NULL), NOPAD_ERR_INVALID_ARGUMENT,
                                   row_name);
            }
            gpu->free(gpu, d_best);
            gpu->free(gpu, d_ids);
            free(best);
            free(lp);
            free(ids);
            free(ids2);
            free(fed);
        }
    printf("  greedy merge: %lld rows, log-probabilities at most %.1f float ulps from the host's\n",
           (long long)checked, worst_ulps);
    gpu->destroy(gpu);
}

int main(void) {
    if (test_skip_without_gpu()) return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_against_host),
        cmocka_unit_test(test_row_argmax_arguments),
        cmocka_unit_test(test_row_argmax_against_cpu),
        cmocka_unit_test(test_row_argmax_graph),
        cmocka_unit_test(test_greedy_merge_against_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Sampling on the host: logit_bias, repetition, frequency and presence penalties, temperature,
 * top-k, top-p, min-p, draw (sampling.h says whose rules and how ties go). A call is a few O(V) passes plus what a filter needs: top-k
 * keeps a heap of k logits, top-p sorts only the ids of the one weight bin where p is reached. */
#include "model/sampling.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

nopad_sampling_params nopad_sampling_default_params(void) {
    nopad_sampling_params p = {
        .temperature = 0.0f,
        .top_k = 0,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .repetition_penalty = 1.0f,
        .seed = 0,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .logit_bias = NULL,
        .n_logit_bias = 0,
    };
    return p;
}

static int compare_ids(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* logit_bias's entries: each id once (the device applies them all at once), biases as OpenAI's. */
static nopad_status check_logit_bias(const nopad_sampling_params *p) {
    const int32_t n = p->n_logit_bias;
    if (n == 0) return NOPAD_OK;
    if (n < 0 || n > NOPAD_MAX_LOGIT_BIAS || !p->logit_bias)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "sampling: logit_bias has %d entries%s; it must be 0 to %d entries "
                               "(id, bias)", n, p->logit_bias ? "" : " and is NULL",
                               NOPAD_MAX_LOGIT_BIAS);
    int32_t ids[NOPAD_MAX_LOGIT_BIAS];
    for (int32_t j = 0; j < n; j++) {
        const nopad_logit_bias *b = &p->logit_bias[j];
        if (b->id < 0 || !(b->bias >= -100.0f && b->bias <= 100.0f))
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "sampling: logit_bias[%d] is (id %d, bias %g); ids must be >= 0 and "
                                   "biases in [-100, 100]", j, b->id, (double)b->bias);
        ids[j] = b->id;
    }
    qsort(ids, (size_t)n, sizeof *ids, compare_ids);
    for (int32_t j = 1; j < n; j++)
        if (ids[j] == ids[j - 1])
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "sampling: logit_bias lists id %d twice; each id may appear once", ids[j]);
    return NOPAD_OK;
}

nopad_status sampling_check(const nopad_sampling_params *p) {
    if (!p) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "sampling: params are NULL");
    if (!(p->temperature >= 0.0f && p->temperature <= FLT_MAX))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "sampling: temperature is %g; it must be 0 (greedy) or a finite "
                               "number > 0", (double)p->temperature);
    if (p->top_k < 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "sampling: top_k is %d; it must be >= 0 (0: all ids)", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "sampling: top_p is %g; it must be in (0, 1] (1: off)",
                               (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p < 1.0f))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "sampling: min_p is %g; it must be in [0, 1) (0: off)",
                               (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f && p->repetition_penalty <= FLT_MAX))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "sampling: repetition_penalty is %g; it must be a finite number > 0 "
                               "(1: off)", (double)p->repetition_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "sampling: presence_penalty is %g; it must be in [-2, 2] (0: off)",
                               (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "sampling: frequency_penalty is %g; it must be in [-2, 2] (0: off)",
                               (double)p->frequency_penalty);
    return check_logit_bias(p);
}

nopad_status sampling_check_vocab(const nopad_sampling_params *p, int32_t vocab) {
    nopad_status st = sampling_check(p);
    if (st != NOPAD_OK) return st;
    for (int32_t j = 0; j < p->n_logit_bias; j++)
        if (p->logit_bias[j].id >= vocab)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "sampling: logit_bias[%d] names id %d; ids must be in [0, %d)", j,
                                   p->logit_bias[j].id, vocab);
    return NOPAD_OK;
}

/* ---- the random draw ------------------------------------------------------------------------ */

/* SplitMix64's output function (Steele, Lea, Flood 2014). */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The step-th output (from 0) of SplitMix64 whose state starts at mix64(seed): a counter-based
 * generator, so any step is drawn without the ones before it, and seeds 0, 1, 2, ... start far
 * apart on the Weyl sequence. The top 53 bits make the double. */
double sampling_uniform(uint64_t seed, uint64_t step) {
    uint64_t z = mix64(mix64(seed) + (step + 1) * 0x9E3779B97F4A7C15ull);
    return (double)(z >> 11) * 0x1.0p-53;
}

/* ---- scratch -------------------------------------------------------------------------------- */

void sampler_scratch_init(sampler_scratch *s) { memset(s, 0, sizeof *s); }

void sampler_scratch_free(sampler_scratch *s) {
    if (!s) return;
    free(s->logits);
    free(s->weight);
    free(s->ids);
    free(s->keys);
    free(s->heap);
    free(s->seen);
    free(s->counts);
    memset(s, 0, sizeof *s);
}

enum { SCRATCH_BYTES_PER_ID = sizeof(float) + sizeof(double) + sizeof(int32_t) + sizeof(uint64_t) +
                               sizeof(float) + sizeof(uint8_t) + sizeof(int32_t) };

static nopad_status scratch_reserve(sampler_scratch *s, int32_t vocab) {
    if (vocab <= s->capacity) return NOPAD_OK;
    int32_t n_allocs = s->n_allocs;
    sampler_scratch_free(s);
    size_t n = (size_t)vocab;
    s->logits = malloc(n * sizeof *s->logits);
    s->weight = malloc(n * sizeof *s->weight);
    s->ids = malloc(n * sizeof *s->ids);
    s->keys = malloc(n * sizeof *s->keys);
    s->heap = malloc(n * sizeof *s->heap);
    s->seen = calloc(n, sizeof *s->seen);
    s->counts = calloc(n, sizeof *s->counts);
    s->n_allocs = n_allocs;
    if (!s->logits || !s->weight || !s->ids || !s->keys || !s->heap || !s->seen || !s->counts) {
        sampler_scratch_free(s);
        s->n_allocs = n_allocs;
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY,
                               "sampling: cannot allocate the scratch for a vocab of %d ids "
                               "(%zu bytes)", vocab, n * SCRATCH_BYTES_PER_ID);
    }
    s->capacity = vocab;
    s->n_allocs = n_allocs + 1;
    return NOPAD_OK;
}

/* ---- ranking: 64-bit keys, ascending = logit descending, then id ascending ------------------- */

static inline uint64_t rank_key(float v, int32_t id) {
    if (v == 0.0f) v = 0.0f; // -0 ranks as +0, as the comparisons of the filters see it
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); // ascending in v as an unsigned integer
    return ((uint64_t)(uint32_t)~u << 32) | (uint32_t)id;
}

static inline int32_t key_id(uint64_t key) { return (int32_t)(uint32_t)key; }

static inline void swap_keys(uint64_t *a, uint64_t *b) {
    uint64_t t = *a;
    *a = *b;
    *b = t;
}

static void insertion_sort(uint64_t *a, int32_t n) {
    for (int32_t i = 1; i < n; i++) {
        uint64_t v = a[i];
        int32_t j = i;
        for (; j > 0 && a[j - 1] > v; j--) a[j] = a[j - 1];
        a[j] = v;
    }
}

static void sift_down(uint64_t *a, int32_t n, int32_t i) {
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && a[c + 1] > a[c]) c++;
        if (a[i] >= a[c]) return;
        swap_keys(&a[i], &a[c]);
        i = c;
    }
}

static void heap_sort(uint64_t *a, int32_t n) {
    for (int32_t i = n / 2 - 1; i >= 0; i--) sift_down(a, n, i);
    for (int32_t end = n - 1; end > 0; end--) {
        swap_keys(&a[0], &a[end]);
        sift_down(a, end, 0);
    }
}

/* Hoare partition around the median of three (n >= 3); returns j with a[0..j] <= a[j+1..n),
 * 0 <= j < n - 1. */
static int32_t partition(uint64_t *a, int32_t n) {
    int32_t mid = (n - 1) / 2;
    if (a[mid] < a[0]) swap_keys(&a[mid], &a[0]);
    if (a[n - 1] < a[0]) swap_keys(&a[n - 1], &a[0]);
    if (a[n - 1] < a[mid]) swap_keys(&a[n - 1], &a[mid]);
    uint64_t pivot = a[mid];
    int32_t i = -1, j = n;
    for (;;) {
        do i++; while (a[i] < pivot);
        do j--; while (a[j] > pivot);
        if (i >= j) return j;
        swap_keys(&a[i], &a[j]);
    }
}

static int depth_limit(int32_t n) {
    int d = 0;
    while (n > 1) { n >>= 1; d++; }
    return 2 * d;
}

enum { SMALL_RANGE = 16 };

static void sort_range(uint64_t *a, int32_t n, int depth) {
    while (n > SMALL_RANGE) {
        if (depth-- == 0) { heap_sort(a, n); return; }
        int32_t j = partition(a, n) + 1; // [0, j) and [j, n)
        if (j < n - j) { sort_range(a, j, depth); a += j; n -= j; } // recurse on the smaller side
        else { sort_range(a + j, n - j, depth); n = j; }
    }
    insertion_sort(a, n);
}

static void sort_keys(uint64_t *a, int32_t n) { sort_range(a, n, depth_limit(n)); }

/* ---- the warpers ---------------------------------------------------------------------------- */

/* HF's TopKLogitsWarper keeps the ids whose logit is >= the k-th largest, ties included, so only
 * that value is needed: a min-heap of the k largest in heap[0..k), one predictable comparison per
 * id once it is full. O(V log k) at worst, close to O(V) for logits in random order. */
static void sift_down_min(float *heap, int32_t k, int32_t i) {
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= k) return;
        if (c + 1 < k && heap[c + 1] < heap[c]) c++;
        if (heap[i] <= heap[c]) return;
        float t = heap[i];
        heap[i] = heap[c];
        heap[c] = t;
        i = c;
    }
}

static float kth_largest(float *heap, const float *x, int32_t n, int32_t k) {
    memcpy(heap, x, (size_t)k * sizeof *heap);
    for (int32_t i = k / 2 - 1; i >= 0; i--) sift_down_min(heap, k, i);
    float root = heap[0];
    for (int32_t i = k; i < n; i++) {
        if (x[i] <= root) continue;
        heap[0] = x[i];
        sift_down_min(heap, k, 0);
        root = heap[0];
    }
    return root;
}

/* Top-p bins ids by d = (max - logit) / temperature, BINS_PER_NAT bins per nat of d (the last
 * bin catches the rest), while the weights w = exp(-d) are computed. The bins below the one
 * where the cumulative mass reaches p are kept whole; only the ids of that bin are sorted. */
enum { N_BINS = 512, BINS_PER_NAT = 16 };

static inline double distance(float xmax, float v, double inv_t) {
    return ((double)xmax - (double)v) * inv_t;
}

static inline int weight_bin(double d) {
    double b = d * BINS_PER_NAT;
    return b < N_BINS - 1 ? (int)b : N_BINS - 1;
}

/* HF's TopPLogitsWarper on ids[0..n) whose weights sum to z, `mass` the weight per bin: keeps
 * the most likely ids up to and including the first whose cumulative probability reaches top_p
 * (an id stays when the mass ranked above it is < top_p: HF's "ascending cumulative
 * > 1 - top_p"). Returns the new count. */
static int32_t keep_top_p(sampler_scratch *s, int32_t n, double z, const double *mass,
                          float xmax, double inv_t, double top_p) {
    const float *x = s->logits;
    const double *w = s->weight;
    int32_t *ids = s->ids;
    uint64_t *keys = s->keys;
    const double target = top_p * z;

    int cut_bin = 0;
    double before = 0; // the mass of the bins before cut_bin
    for (; cut_bin < N_BINS - 1; cut_bin++) {
        if (before + mass[cut_bin] >= target) break;
        before += mass[cut_bin];
    }
    // a later bin holds only logits smaller than every logit of an earlier one: keep the bins
    // before cut_bin, and for now all of cut_bin, whose ids are ranked
    int32_t m = 0, n_sort = 0;
    for (int32_t i = 0; i < n; i++) {
        int b = weight_bin(distance(xmax, x[ids[i]], inv_t));
        if (b > cut_bin) continue;
        if (b == cut_bin) keys[n_sort++] = rank_key(x[ids[i]], ids[i]);
        ids[m++] = ids[i];
    }
    if (n_sort == 0) return m; // rounding left p a hair above the whole mass: keep all
    sort_keys(keys, n_sort);

    int32_t cut = n_sort - 1; // rounding can leave the sum a hair short of the bins': keep all
    double acc = before;
    for (int32_t j = 0; j < n_sort; j++) {
        acc += w[key_id(keys[j])];
        if (acc >= target) { cut = j; break; }
    }
    if (cut == n_sort - 1) return m;
    const uint64_t last = keys[cut]; // every id of an earlier bin ranks before it
    n = m;
    m = 0;
    for (int32_t i = 0; i < n; i++)
        if (rank_key(x[ids[i]], ids[i]) <= last) ids[m++] = ids[i];
    return m;
}

/* The largest logit, in lanes so that the loop vectorises without -ffast-math. */
enum { LANES = 16 };
static float max_logit(const float *x, int32_t n) {
    float m[LANES];
    for (int j = 0; j < LANES; j++) m[j] = -INFINITY;
    int32_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    for (; i < n; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
    for (int j = 1; j < LANES; j++) m[0] = m[j] > m[0] ? m[j] : m[0];
    return m[0];
}

/* Greedy's normaliser: Σ exp(x - xmax) over the row, in double. */
static double greedy_z(const float *x, int32_t n, float xmax) {
    double z = 0;
    for (int32_t i = 0; i < n; i++) z += exp((double)x[i] - xmax);
    return z;
}

/* ---- sample_token --------------------------------------------------------------------------- */

static nopad_status check_call(const sampler_scratch *s, const float *logits, int32_t vocab,
                               const nopad_sampling_params *p, const int32_t *history,
                               int32_t n_history, const int32_t *out_id) {
    if (!s || !logits || !out_id)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "sampling: %s is NULL", !s ? "the scratch" : !logits ? "logits"
                                                                                 : "out_id");
    if (vocab <= 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "sampling: vocab is %d; it must be > 0", vocab);
    if (n_history < 0 || (n_history > 0 && !history))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "sampling: history is %s with n_history %d; it must be >= 0 ids",
                               history ? "given" : "NULL", n_history);
    nopad_status st = sampling_check_vocab(p, vocab);
    if (st != NOPAD_OK) return st;
    for (int32_t h = 0; h < n_history; h++)
        if (history[h] < 0 || history[h] >= vocab)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "sampling: history[%d] is %d; ids must be in [0, %d)", h,
                                   history[h], vocab);
    return NOPAD_OK;
}

/* OpenAI's frequency and presence penalties over the output (the last n ids of the history), as
 * vLLM applies them: logit - frequency · count, then - presence, in fp32, once per distinct id. */
static void penalise_output(sampler_scratch *s, float *x, const nopad_sampling_params *p,
                            const int32_t *output, int32_t n) {
    int32_t *count = s->counts;
    for (int32_t h = 0; h < n; h++) count[output[h]]++;
    for (int32_t h = 0; h < n; h++) {
        const int32_t id = output[h];
        if (count[id] == 0) continue; // done at its first occurrence
        x[id] = (x[id] - p->frequency_penalty * (float)count[id]) - p->presence_penalty;
        count[id] = 0;
    }
}

nopad_status sample_token(sampler_scratch *s, const float *logits, int32_t vocab,
                          const nopad_sampling_params *p, const int32_t *history,
                          int32_t n_history, uint64_t step, int32_t *out_id, float *out_logprob) {
    if (s) s->last.vocab = 0;
    nopad_status st = check_call(s, logits, vocab, p, history, n_history, out_id);
    if (st != NOPAD_OK) return st;
    st = scratch_reserve(s, vocab);
    if (st != NOPAD_OK) return st;
    float *x = s->logits; // [vocab]

    int bad = 0;
    for (int32_t i = 0; i < vocab; i++) {
        float v = logits[i];
        x[i] = v;
        bad |= (v != v) | (v == INFINITY);
    }
    if (bad) {
        int32_t i = 0;
        while (!(logits[i] != logits[i] || logits[i] == INFINITY)) i++;
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "sampling: logits hold %s (id %d of %d); a logit must be finite or "
                               "-inf", logits[i] != logits[i] ? "NaN" : "+inf", i, vocab);
    }

    for (int32_t j = 0; j < p->n_logit_bias; j++) x[p->logit_bias[j].id] += p->logit_bias[j].bias;

    // HF's RepetitionPenaltyLogitsProcessor, once per distinct id, in fp32 as HF computes it;
    // a positive logit that overflows when divided by a tiny penalty stays the largest float
    if (p->repetition_penalty != 1.0f && n_history > 0) {
        const float pen = p->repetition_penalty;
        for (int32_t h = 0; h < n_history; h++) {
            int32_t id = history[h];
            if (s->seen[id]) continue;
            s->seen[id] = 1;
            float v = x[id] < 0 ? x[id] * pen : x[id] / pen;
            x[id] = v > FLT_MAX ? FLT_MAX : v;
        }
        for (int32_t h = 0; h < n_history; h++) s->seen[history[h]] = 0;
    }
    const int32_t n_output = step < (uint64_t)n_history ? (int32_t)step : n_history;
    if ((p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) && n_output > 0)
        penalise_output(s, x, p, history + (n_history - n_output), n_output);

    const float xmax = max_logit(x, vocab);
    if (xmax == -INFINITY)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "sampling: logits are all -inf (%d ids); no id can be chosen",
                               vocab);

    if (p->temperature == 0.0f) {
        int32_t best = 0;
        while (x[best] != xmax) best++; // the lowest id among equal maxima
        double log_z = NAN; // sampling_top_logprobs sums it when this call did not
        if (out_logprob) {
            log_z = log(greedy_z(x, vocab, xmax));
            *out_logprob = (float)-log_z;
        }
        s->last = (sampler_last_draw){.vocab = vocab, .n_kept = -1, .xmax = xmax, .inv_t = 1.0,
                                      .log_z = log_z};
        *out_id = best;
        return NOPAD_OK;
    }

    // the candidates, in id order: every id with a finite logit, or with top-k those >= the k-th
    // largest logit (the temperature keeps the order, so it enters only the weights)
    float lowest = -INFINITY; // the smallest logit kept
    if (p->top_k > 0 && p->top_k < vocab) {
        float kth = kth_largest(s->heap, x, vocab, p->top_k);
        if (kth > lowest) lowest = kth;
    }
    // and their weights: by id, exp(-d), d = (max - logit) / t, the probability x the total
    int32_t *ids = s->ids;
    double *w = s->weight;
    const double inv_t = 1.0 / p->temperature;
    const int top_p = p->top_p < 1.0f;
    double mass[N_BINS] = {0}; // top-p's weight per bin
    double z = 0;
    int32_t n = 0;
    for (int32_t i = 0; i < vocab; i++) {
        if (!(x[i] >= lowest && x[i] > -INFINITY)) continue;
        double d = distance(xmax, x[i], inv_t);
        double wi = exp(-d);
        ids[n++] = i;
        w[i] = wi;
        z += wi;
        if (top_p) mass[weight_bin(d)] += wi;
    }
    if (top_p) n = keep_top_p(s, n, z, mass, xmax, inv_t, p->top_p);
    if (p->min_p > 0.0f) { // HF's MinPLogitsWarper: prob / top prob = w, as the top id has w = 1
        const double min_p = p->min_p;
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            if (w[ids[i]] >= min_p) ids[m++] = ids[i];
        n = m;
    }

    // the draw: inverse CDF over the kept ids in id order; the top id (w = 1) is always kept
    if (top_p || p->min_p > 0.0f) {
        z = 0;
        for (int32_t i = 0; i < n; i++) z += w[ids[i]];
    }
    double target = sampling_uniform(p->seed, step) * z;
    double acc = 0;
    int32_t chosen = -1;
    for (int32_t i = 0; i < n; i++) {
        double wi = w[ids[i]];
        if (wi <= 0) continue; // underflowed: never drawn
        acc += wi;
        chosen = ids[i];
        if (acc > target) break;
    }
    if (out_logprob) *out_logprob = (float)(-distance(xmax, x[chosen], inv_t) - log(z));
    s->last = (sampler_last_draw){.vocab = vocab, .n_kept = n, .xmax = xmax, .inv_t = inv_t,
                                  .log_z = log(z)};
    *out_id = chosen;
    return NOPAD_OK;
}

/* Whether id is among ids[0, n), which are in ascending order. */
static int holds_id(const int32_t *ids, int32_t n, int32_t id) {
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (ids[mid] < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && ids[lo] == id;
}

nopad_status sampling_top_logprobs(const sampler_scratch *s, int32_t n, int32_t *ids, float *logprobs) {
    if (!s || s->last.vocab == 0 || n < 0 || (n > 0 && (!ids || !logprobs)))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "sampling: top logprobs need a scratch after a successful sample_token, "
                               "n >= 0 and ids, logprobs [n]");
    if (n > NOPAD_MAX_TOP_LOGPROBS)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "sampling: %d top logprobs; at most %d", n,
                               NOPAD_MAX_TOP_LOGPROBS);
    const sampler_last_draw *d = &s->last;
    const float *x = s->logits;
    const double log_z = d->log_z == d->log_z ? d->log_z : log(greedy_z(x, d->vocab, d->xmax));
    // the n best rank keys, ascending, by insertion: one comparison an id once n are held
    uint64_t best[NOPAD_MAX_TOP_LOGPROBS];
    const int32_t held_max = n < d->vocab ? n : d->vocab;
    int32_t held = 0;
    for (int32_t i = 0; i < d->vocab && held_max > 0; i++) {
        const uint64_t key = rank_key(x[i], i);
        if (held == held_max && key >= best[held - 1]) continue;
        int32_t j = held < held_max ? held++ : held - 1;
        for (; j > 0 && best[j - 1] > key; j--) best[j] = best[j - 1];
        best[j] = key;
    }
    for (int32_t j = 0; j < n; j++) {
        if (j >= held) {
            ids[j] = -1;
            logprobs[j] = -INFINITY;
            continue;
        }
        const int32_t id = key_id(best[j]);
        const int kept = x[id] > -INFINITY && (d->n_kept < 0 || holds_id(s->ids, d->n_kept, id));
        ids[j] = id;
        logprobs[j] = kept ? (float)(-distance(d->xmax, x[id], d->inv_t) - log_z) : -INFINITY;
    }
    return NOPAD_OK;
}

nopad_status sampling_merge_greedy(const float *best, int32_t parts, int32_t n, int32_t r, int32_t *out_id,
                                   float *out_logprob) {
    float top = -INFINITY, id = -1.0f;
    for (int32_t k = 0; k < parts; k++) {
        const float *t = best + ((size_t)k * n + r) * 3;
        if (t[0] != t[0])
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "sampling: the logits hold NaN or +inf (part %d of %d); a logit must be "
                                   "finite or -inf", k, parts);
        if (t[0] > top) top = t[0], id = t[1];
    }
    if (top == -INFINITY)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "sampling: the logits are all -inf; no id can be chosen");
    double z = 0;
    for (int32_t k = 0; k < parts; k++) {
        const float *t = best + ((size_t)k * n + r) * 3;
        if (t[0] > -INFINITY) z += (double)t[2] * exp((double)t[0] - top);
    }
    *out_id = (int32_t)id;
    if (out_logprob) *out_logprob = (float)-log(z);
    return NOPAD_OK;
}

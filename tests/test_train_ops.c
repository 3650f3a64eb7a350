/* The CPU backend's training ops (backend.h, "training") against central finite differences of
 * double-precision forward formulas written here, on random data: every input of every op, every
 * coordinate. The differences use h = 1e-6·max(1, |θ|) in double, so they are accurate to about
 * 1e-9 relative; the ops compute in float32 (with double accumulators), so their gradients agree
 * to about 1e-6. Bound: 1e-4 row-relative (test_max_row_rel_error), the bound the whole-model
 * test uses against PyTorch. Inputs are random uniforms, never zeros. Dropout, which has no
 * derivative to difference, is checked for its generator, its rate and its self-backward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "testutil.h"
#include "util/philox.h"

static nopad_backend *be;
static const double BOUND = 1e-4;

static int setup(void **state) { return nopad_backend_cpu_create(2, &be) == NOPAD_OK ? 0 : -1; }
static int teardown(void **state) {
    be->destroy(be);
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------------ */

static float *random_floats(int64_t n, float lo, float hi, uint64_t *rng) {
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    test_fill_uniform(x, n, lo, hi, rng);
    return x;
}

/* A scalar objective of the parameters theta[n] (double), for finite differences. */
typedef double (*objective)(void *ctx, const double *theta);

/* grad[n] of f at theta by central differences. theta is restored. */
static void finite_differences(objective f, void *ctx, double *theta, int64_t n, double *grad) {
    for (int64_t i = 0; i < n; i++) {
        const double saved = theta[i], h = 1e-6 * fmax(1.0, fabs(saved));
        theta[i] = saved + h;
        const double up = f(ctx, theta);
        theta[i] = saved - h;
        const double down = f(ctx, theta);
        theta[i] = saved;
        grad[i] = (up - down) / (2 * h);
    }
}

static double *to_double(const float *x, int64_t n) {
    double *d = malloc((size_t)(n ? n : 1) * sizeof *d);
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* Fails unless got[rows, cols] (float) matches want (double) row by row: |got_r - want_r| <=
 * BOUND·max(|want_r|, floor·mean row norm). The floor keeps rows whose exact gradient is zero
 * (a key of a one-token sequence) from comparing finite-difference noise (~1e-9) with itself. */
static void expect_close_floor(const char *what, const float *got, const double *want, int64_t rows,
                               int64_t cols, double floor) {
    double mean_norm = 0, worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double n = 0;
        for (int64_t c = 0; c < cols; c++) n += want[r * cols + c] * want[r * cols + c];
        mean_norm += sqrt(n) / rows;
    }
    for (int64_t r = 0; r < rows; r++) {
        double diff = 0, n = 0;
        for (int64_t c = 0; c < cols; c++) {
            const double d = got[r * cols + c] - want[r * cols + c];
            diff += d * d;
            n += want[r * cols + c] * want[r * cols + c];
        }
        const double err = sqrt(diff) / fmax(sqrt(n), fmax(floor * mean_norm, 1e-30));
        if (!(err <= worst)) worst = isnan(err) ? INFINITY : err;
    }
    if (!(worst <= BOUND)) fail_msg("%s: row-relative error %.3e > %.0e", what, worst, BOUND);
}

static void expect_close(const char *what, const float *got, const double *want, int64_t rows,
                         int64_t cols) {
    expect_close_floor(what, got, want, rows, cols, 1e-3);
}

static double dot_r(const double *y, const float *r, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += y[i] * r[i];
    return s;
}

/* ---- gemm --------------------------------------------------------------------------------- */

typedef struct gemm_ctx {
    int32_t T, K, N;
    const float *r; /* [T, N] upstream gradient */
    int which;      /* 0: theta = x, 1: w, 2: b */
    const double *x, *w, *b;
} gemm_ctx;

static double gemm_objective(void *ctx_, const double *theta) {
    const gemm_ctx *c = ctx_;
    const double *x = c->which == 0 ? theta : c->x, *w = c->which == 1 ? theta : c->w;
    const double *b = c->which == 2 ? theta : c->b;
    double s = 0;
    for (int32_t t = 0; t < c->T; t++)
        for (int32_t n = 0; n < c->N; n++) {
            double y = b[n];
            for (int32_t k = 0; k < c->K; k++) y += x[(size_t)t * c->K + k] * w[(size_t)n * c->K + k];
            s += y * c->r[(size_t)t * c->N + n];
        }
    return s;
}

static void test_gemm_backward(void **state) {
    uint64_t rng = 11;
    const int32_t T = 9, K = 13, N = 7;
    float *x = random_floats(T * K, -1, 1, &rng), *w = random_floats(N * K, -1, 1, &rng);
    float *b = random_floats(N, -1, 1, &rng), *dy = random_floats(T * N, -1, 1, &rng);
    /* Gradients start non-zero: parameters accumulate, dx accumulates when asked. */
    float *dx = random_floats(T * K, -1, 1, &rng), *dw = random_floats(N * K, -1, 1, &rng);
    float *db = random_floats(N, -1, 1, &rng);
    double *want_dx = to_double(dx, T * K), *want_dw = to_double(dw, N * K), *want_db = to_double(db, N);
    assert_nopad_ok(be->gemm_backward(be, dx, dw, db, dy, x, w, T, K, N, 1));

    gemm_ctx c = {T, K, N, dy, 0, to_double(x, T * K), to_double(w, N * K), to_double(b, N)};
    double *g = malloc(sizeof(double) * T * K);
    double *theta[3] = {(double *)c.x, (double *)c.w, (double *)c.b};
    double *want[3] = {want_dx, want_dw, want_db};
    const int64_t sizes[3] = {T * K, N * K, N};
    for (int which = 0; which < 3; which++) {
        c.which = which;
        finite_differences(gemm_objective, &c, theta[which], sizes[which], g);
        for (int64_t i = 0; i < sizes[which]; i++) want[which][i] += g[i];
    }
    expect_close("gemm dx (accumulated)", dx, want_dx, T, K);
    expect_close("gemm dw", dw, want_dw, N, K);
    expect_close("gemm db", db, want_db, 1, N);

    /* accumulate_dx = 0 overwrites dx; NULL outputs are skipped. */
    float *dx2 = random_floats(T * K, -1, 1, &rng);
    assert_nopad_ok(be->gemm_backward(be, dx2, NULL, NULL, dy, x, w, T, K, N, 0));
    c.which = 0;
    finite_differences(gemm_objective, &c, theta[0], T * K, g);
    expect_close("gemm dx (overwritten)", dx2, g, T, K);
    free(x), free(w), free(b), free(dy), free(dx), free(dw), free(db), free(dx2), free(g);
    free(want_dx), free(want_dw), free(want_db), free(theta[0]), free(theta[1]), free(theta[2]);
}

/* ---- activations -------------------------------------------------------------------------- */

static double act_ref(double x, nopad_activation act) {
    switch (act) {
    case NOPAD_ACT_GELU: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    case NOPAD_ACT_GELU_TANH: return 0.5 * x * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
    case NOPAD_ACT_RELU: return x > 0 ? x : 0;
    case NOPAD_ACT_SILU: return x / (1 + exp(-x));
    case NOPAD_ACT_TANH: return tanh(x);
    }
    return x;
}

typedef struct act_ctx {
    int64_t n;
    const float *r;
    nopad_activation act;
} act_ctx;

static double act_objective(void *ctx_, const double *x) {
    const act_ctx *c = ctx_;
    double s = 0;
    for (int64_t i = 0; i < c->n; i++) s += act_ref(x[i], c->act) * c->r[i];
    return s;
}

static void test_activation_backward(void **state) {
    uint64_t rng = 12;
    const int32_t T = 6, D = 11;
    const nopad_activation acts[] = {NOPAD_ACT_GELU, NOPAD_ACT_GELU_TANH, NOPAD_ACT_SILU,
                                     NOPAD_ACT_TANH, NOPAD_ACT_RELU};
    for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++) {
        float *x = random_floats(T * D, -3, 3, &rng), *dy = random_floats(T * D, -1, 1, &rng);
        if (acts[a] == NOPAD_ACT_RELU) /* keep away from the kink, where the derivative jumps */
            for (int64_t i = 0; i < T * D; i++) x[i] += x[i] >= 0 ? 0.1f : -0.1f;
        float *y = malloc(sizeof(float) * T * D), *dx = malloc(sizeof(float) * T * D);
        float *db = random_floats(D, -1, 1, &rng);
        double *want_db = to_double(db, D);
        /* forward against the double formula */
        assert_nopad_ok(be->activation(be, y, x, T, D, acts[a]));
        double *want_y = malloc(sizeof(double) * T * D);
        for (int64_t i = 0; i < T * D; i++) want_y[i] = act_ref(x[i], acts[a]);
        expect_close("activation forward", y, want_y, T, D);
        /* backward, in place over dy's copy */
        memcpy(dx, dy, sizeof(float) * T * D);
        assert_nopad_ok(be->activation_backward(be, dx, db, dx, x, T, D, acts[a]));
        act_ctx c = {T * D, dy, acts[a]};
        double *theta = to_double(x, T * D), *g = malloc(sizeof(double) * T * D);
        finite_differences(act_objective, &c, theta, T * D, g);
        expect_close("activation dx", dx, g, T, D);
        for (int32_t t = 0; t < T; t++)
            for (int32_t i = 0; i < D; i++) want_db[i] += g[(size_t)t * D + i];
        expect_close("activation db", db, want_db, 1, D);
        free(x), free(dy), free(y), free(dx), free(db), free(want_db), free(want_y), free(theta), free(g);
    }
}

/* ---- dropout ------------------------------------------------------------------------------ */

/* Random123's known-answer vectors for Philox4x32-10 (kat_vectors: zeros, all ones, pi's digits). */
static void test_philox_known_answers(void **state) {
    static const uint32_t cases[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
         0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
         0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int c = 0; c < 3; c++) {
        uint32_t out[4];
        philox4x32_10(cases[c], cases[c] + 4, out);
        for (int i = 0; i < 4; i++)
            if (out[i] != cases[c][6 + i])
                fail_msg("philox case %d word %d: %08x, want %08x", c, i, out[i], cases[c][6 + i]);
    }
    /* philox_bits reads block index / 4, lane index % 4, the seed as the key */
    uint32_t out[4];
    const uint32_t counter[4] = {5, 0, 0, 0}, key[2] = {0x89abcdefu, 0x01234567u};
    philox4x32_10(counter, key, out);
    for (int i = 0; i < 4; i++) assert_int_equal(philox_bits(0x0123456789abcdefull, 20 + i), out[i]);
}

/* The mask bit of row t (sequence s, cu[s] <= t < cu[s + 1]) and column c: backend.h's definition. */
static int kept_by_definition(uint64_t key, uint32_t site, const int64_t *examples, const int32_t *cu, int32_t s,
                              int32_t t, int32_t c, float p) {
    const uint64_t example = examples ? (uint64_t)examples[s] : (uint64_t)s;
    return hidden_dropout_bits(key, site, example, (uint32_t)(t - cu[s]), (uint32_t)c) >=
           (uint32_t)((double)p * 4294967296.0);
}

/* Dropout on a packed batch of 40 sequences of random lengths 1 .. 24 (ones included), rows of 37
 * columns (blocks of 4 cut by the row's end), example numbers random, one past 2³² (its high word
 * folds into the key): every element kept or dropped as backend.h defines it, the rate, the
 * residual form, the self-backward, the thread count, another site, and p = 0. */
static void test_dropout(void **state) {
    uint64_t rng = 18;
    enum { B = 40, DIM = 37 };
    int32_t cu[B + 1] = {0};
    int64_t examples[B];
    for (int32_t s = 0; s < B; s++) {
        cu[s + 1] = cu[s] + (s % 9 == 0 ? 1 : 1 + (int32_t)(test_rand_u32(&rng) % 24));
        examples[s] = (int64_t)(test_rand_u32(&rng) % 100000);
    }
    examples[7] = (int64_t)((1ull << 32) + 12345);
    const int32_t T = cu[B];
    const int64_t n = (int64_t)T * DIM;
    const nopad_seqs seqs = {B, T, 24, cu};
    const float p = 0.1f;
    const uint64_t key = 42;
    const uint32_t site = 5;
    float *x = random_floats(n, 0.5f, 1.5f, &rng), *y = malloc(sizeof(float) * n);
    float *dy = random_floats(n, 0.5f, 1.5f, &rng), *dx = malloc(sizeof(float) * n);
    assert_nopad_ok(be->dropout(be, y, x, NULL, &seqs, examples, DIM, p, key, site));
    int64_t dropped = 0;
    for (int32_t s = 0; s < B; s++)
        for (int32_t t = cu[s]; t < cu[s + 1]; t++)
            for (int32_t c = 0; c < DIM; c++) {
                const int64_t i = (int64_t)t * DIM + c;
                if (y[i] == 0.0f) dropped++;
                else if (fabsf(y[i] - x[i] / (1 - p)) > 1e-6f * y[i])
                    fail_msg("dropout element %lld: %g, want %g", (long long)i, y[i], x[i] / (1 - p));
                if ((y[i] != 0.0f) != kept_by_definition(key, site, examples, cu, s, t, c, p))
                    fail_msg("dropout row %d column %d: kept or dropped against its counter", t, c);
            }
    /* binomial(n, p): n = T·37 (about 18000), standard deviation about 40; 5 of them */
    if (fabs((double)dropped - p * n) > 5 * sqrt(n * p * (1 - p)))
        fail_msg("dropout p=%.2f dropped %lld of %lld", p, (long long)dropped, (long long)n);
    /* with a residual: residual + the same dropped values, in one pass */
    float *with_res = malloc(sizeof(float) * n);
    assert_nopad_ok(be->dropout(be, with_res, x, dy, &seqs, examples, DIM, p, key, site));
    for (int64_t i = 0; i < n; i++)
        if (with_res[i] != dy[i] + y[i])
            fail_msg("dropout with residual, element %lld: %g, want %g", (long long)i, with_res[i], dy[i] + y[i]);
    free(with_res);
    /* the backward is the same call on the gradient: zeros exactly where the forward dropped */
    assert_nopad_ok(be->dropout(be, dx, dy, NULL, &seqs, examples, DIM, p, key, site));
    for (int64_t i = 0; i < n; i++)
        if ((dx[i] == 0.0f) != (y[i] == 0.0f))
            fail_msg("dropout backward element %lld: mask differs from the forward's", (long long)i);
    /* another thread count gives the same bits; another site another mask; no example numbers
     * key sequence s as example s; p = 0 the identity */
    nopad_backend *one = NULL;
    assert_nopad_ok(nopad_backend_cpu_create(1, &one));
    assert_nopad_ok(one->dropout(one, dx, x, NULL, &seqs, examples, DIM, p, key, site));
    assert_memory_equal(dx, y, sizeof(float) * n);
    assert_nopad_ok(one->dropout(one, dx, x, NULL, &seqs, examples, DIM, p, key, site + 1));
    int64_t same = 0;
    for (int64_t i = 0; i < n; i++) same += (dx[i] == 0.0f) && (y[i] == 0.0f);
    if (same > 2 * p * p * n) fail_msg("dropout: sites 5 and 6 share %lld dropped elements", (long long)same);
    assert_nopad_ok(one->dropout(one, dx, x, NULL, &seqs, NULL, DIM, p, key, site));
    for (int32_t s = 0; s < B; s++)
        for (int32_t t = cu[s]; t < cu[s + 1]; t++)
            for (int32_t c = 0; c < DIM; c++)
                if ((dx[(int64_t)t * DIM + c] != 0.0f) != kept_by_definition(key, site, NULL, cu, s, t, c, p))
                    fail_msg("dropout without example numbers, row %d column %d: not sequence %d's bit", t, c, s);
    assert_nopad_ok(one->dropout(one, dx, x, NULL, &seqs, examples, DIM, 0.0f, key, site));
    assert_memory_equal(dx, x, sizeof(float) * n);
    one->destroy(one);
    free(x), free(y), free(dy), free(dx);
}

/* A sequence's masks do not depend on where it sits: the same examples packed in another order,
 * beside other sequences, give their rows the same output bit for bit, both for the hidden dropout
 * and for the attention's (whose output rows are a function of the sequence's own rows and
 * masks). Batch a: examples 70, 3, 500 (lengths 5, 1, 19); batch b: 500, 8, 70, 3 (lengths 19, 6,
 * 5, 1). */
static void test_dropout_keyed_by_example(void **state) {
    uint64_t rng = 19;
    enum { HEADS = 2, D = 8, H = HEADS * D };
    const int32_t len_of[] = {5, 1, 19, 6};    /* by example slot: 70, 3, 500, 8 */
    const int64_t number_of[] = {70, 3, 500, 8};
    const int slots_a[] = {0, 1, 2}, slots_b[] = {2, 3, 0, 1};
    float *rows[4], *qkv_rows[4];
    for (int k = 0; k < 4; k++) {
        rows[k] = random_floats((int64_t)len_of[k] * H, 0.5f, 1.5f, &rng);
        qkv_rows[k] = random_floats((int64_t)len_of[k] * 3 * H, -1.5f, 1.5f, &rng);
    }
    const int *slots[2] = {slots_a, slots_b};
    const int32_t n_seqs[2] = {3, 4};
    float *y[2], *att[2];
    int32_t cu[2][5];
    for (int b = 0; b < 2; b++) {
        int64_t examples[4];
        cu[b][0] = 0;
        for (int s = 0; s < n_seqs[b]; s++) {
            cu[b][s + 1] = cu[b][s] + len_of[slots[b][s]];
            examples[s] = number_of[slots[b][s]];
        }
        const int32_t T = cu[b][n_seqs[b]];
        float *x = malloc(sizeof(float) * T * H), *qkv = malloc(sizeof(float) * T * 3 * H);
        for (int s = 0; s < n_seqs[b]; s++) {
            const int k = slots[b][s];
            memcpy(x + (size_t)cu[b][s] * H, rows[k], sizeof(float) * len_of[k] * H);
            memcpy(qkv + (size_t)cu[b][s] * 3 * H, qkv_rows[k], sizeof(float) * len_of[k] * 3 * H);
        }
        const nopad_seqs seqs = {n_seqs[b], T, 19, cu[b]};
        y[b] = malloc(sizeof(float) * T * H);
        att[b] = malloc(sizeof(float) * T * H);
        float *lse = malloc(sizeof(float) * T * HEADS);
        assert_nopad_ok(be->dropout(be, y[b], x, NULL, &seqs, examples, H, 0.3f, 77, 2));
        const nopad_attention_dropout drop = {0.3f, 77, 1, examples};
        assert_nopad_ok(be->attention_lse(be, att[b], lse, qkv, &seqs, HEADS, D, 0.35f, 0, &drop));
        free(x), free(qkv), free(lse);
    }
    int64_t dropped = 0;
    for (int s = 0; s < n_seqs[0]; s++) {
        const int k = slots_a[s];
        int sb = 0;
        while (slots_b[sb] != k) sb++;
        const size_t at_a = (size_t)cu[0][s] * H, at_b = (size_t)cu[1][sb] * H, n = (size_t)len_of[k] * H;
        if (memcmp(y[0] + at_a, y[1] + at_b, n * sizeof(float)) != 0)
            fail_msg("dropout: example %lld's rows differ between the batches", (long long)number_of[k]);
        if (memcmp(att[0] + at_a, att[1] + at_b, n * sizeof(float)) != 0)
            fail_msg("attention dropout: example %lld's rows differ between the batches", (long long)number_of[k]);
        for (size_t i = 0; i < n; i++) dropped += y[0][at_a + i] == 0.0f;
    }
    assert_true(dropped > 0); /* the masks did drop something: 25 rows of 16 at 0.3 */
    for (int b = 0; b < 2; b++) free(y[b]), free(att[b]);
    for (int k = 0; k < 4; k++) free(rows[k]), free(qkv_rows[k]);
}

/* ---- LayerNorm ---------------------------------------------------------------------------- */

static void layernorm_ref(double *y, const double *s, const double *w, const double *b,
                          double eps, int32_t T, int32_t D) {
    for (int32_t t = 0; t < T; t++) {
        const double *row = s + (size_t)t * D;
        double mean = 0, var = 0;
        for (int32_t i = 0; i < D; i++) mean += row[i] / D;
        for (int32_t i = 0; i < D; i++) var += (row[i] - mean) * (row[i] - mean) / D;
        for (int32_t i = 0; i < D; i++)
            y[(size_t)t * D + i] = (row[i] - mean) / sqrt(var + eps) * w[i] + b[i];
    }
}

typedef struct ln_ctx {
    int32_t T, D;
    const float *r;
    int which; /* 0: s, 1: w, 2: b */
    const double *s, *w, *b;
    double eps;
} ln_ctx;

static double ln_objective(void *ctx_, const double *theta) {
    const ln_ctx *c = ctx_;
    double *y = malloc(sizeof(double) * c->T * c->D);
    layernorm_ref(y, c->which == 0 ? theta : c->s, c->which == 1 ? theta : c->w,
                  c->which == 2 ? theta : c->b, c->eps, c->T, c->D);
    const double v = dot_r(y, c->r, (int64_t)c->T * c->D);
    free(y);
    return v;
}

static void test_layernorm_backward(void **state) {
    uint64_t rng = 13;
    const int32_t T = 7, D = 24;
    const float eps = 1e-5f;
    float *s = random_floats(T * D, -2, 2, &rng), *w = random_floats(D, 0.5f, 1.5f, &rng);
    float *dy = random_floats(T * D, -1, 1, &rng);
    float *dw = random_floats(D, -1, 1, &rng), *db = random_floats(D, -1, 1, &rng);
    float *dbias = random_floats(D, -1, 1, &rng);
    double *want_dw = to_double(dw, D), *want_db = to_double(db, D), *want_dbias = to_double(dbias, D);
    float *ds = malloc(sizeof(float) * T * D);
    memcpy(ds, dy, sizeof(float) * T * D);
    assert_nopad_ok(be->layernorm_backward(be, ds, dw, db, dbias, ds, s, w, eps, T, D)); /* in place */

    float *b = random_floats(D, -1, 1, &rng); /* the bias does not enter the gradients but is part of y */
    ln_ctx c = {T, D, dy, 0, to_double(s, T * D), to_double(w, D), to_double(b, D), eps};
    double *g = malloc(sizeof(double) * T * D);
    finite_differences(ln_objective, &c, (double *)c.s, T * D, g);
    expect_close("layernorm ds", ds, g, T, D);
    for (int32_t t = 0; t < T; t++)
        for (int32_t i = 0; i < D; i++) want_dbias[i] += g[(size_t)t * D + i];
    expect_close("layernorm dbias", dbias, want_dbias, 1, D);
    c.which = 1;
    finite_differences(ln_objective, &c, (double *)c.w, D, g);
    for (int32_t i = 0; i < D; i++) want_dw[i] += g[i];
    expect_close("layernorm dw", dw, want_dw, 1, D);
    c.which = 2;
    finite_differences(ln_objective, &c, (double *)c.b, D, g);
    for (int32_t i = 0; i < D; i++) want_db[i] += g[i];
    expect_close("layernorm db", db, want_db, 1, D);
    free(s), free(w), free(dy), free(dw), free(db), free(dbias), free(ds), free(b), free(g);
    free(want_dw), free(want_db), free(want_dbias), free((void *)c.s), free((void *)c.w), free((void *)c.b);
}

/* ---- embedding ---------------------------------------------------------------------------- */

enum { EV = 5, EP = 9, ETV = 2, EE = 8 };
typedef struct embed_ctx {
    int32_t T, n_seqs, offset;
    const int32_t *tokens, *types, *cu;
    const float *r;
    double *tables[5]; /* word [EV, EE], pos [EP, EE], type [ETV, EE], ln_w, ln_b [EE] */
    int which;
} embed_ctx;

static double embed_objective(void *ctx_, const double *theta) {
    const embed_ctx *c = ctx_;
    const double *t[5];
    for (int k = 0; k < 5; k++) t[k] = k == c->which ? theta : c->tables[k];
    double *sum = malloc(sizeof(double) * c->T * EE), *y = malloc(sizeof(double) * c->T * EE);
    for (int32_t s = 0; s < c->n_seqs; s++)
        for (int32_t i = c->cu[s]; i < c->cu[s + 1]; i++)
            for (int32_t d = 0; d < EE; d++)
                sum[(size_t)i * EE + d] = t[0][c->tokens[i] * EE + d] +
                                          t[1][(c->offset + i - c->cu[s]) * EE + d] +
                                          t[2][c->types[i] * EE + d];
    layernorm_ref(y, sum, t[3], t[4], 1e-12, c->T, EE);
    const double v = dot_r(y, c->r, (int64_t)c->T * EE);
    free(sum), free(y);
    return v;
}

static void test_embed_backward(void **state) {
    uint64_t rng = 14;
    /* three sequences (lengths 3, 1, 5), tokens repeating inside and across them, position
     * offset 2 as RoBERTa's */
    const int32_t cu[] = {0, 3, 4, 9}, T = 9, offset = 2;
    const int32_t tokens[] = {1, 4, 1, 0, 2, 2, 4, 1, 3}, types[] = {0, 1, 1, 0, 0, 0, 1, 1, 1};
    const int64_t sizes[5] = {EV * EE, EP * EE, ETV * EE, EE, EE};
    float *tables[5], *grads[5];
    double *want[5];
    embed_ctx c = {T, 3, offset, tokens, types, cu, NULL, {0}, 0};
    for (int k = 0; k < 5; k++) {
        tables[k] = random_floats(sizes[k], k == 3 ? 0.5f : -1, k == 3 ? 1.5f : 1, &rng);
        grads[k] = random_floats(sizes[k], -1, 1, &rng); /* accumulated into */
        want[k] = to_double(grads[k], sizes[k]);
        c.tables[k] = to_double(tables[k], sizes[k]);
    }
    float *dy = random_floats(T * EE, -1, 1, &rng), *dy_copy = malloc(sizeof(float) * T * EE);
    memcpy(dy_copy, dy, sizeof(float) * T * EE);
    c.r = dy;
    nopad_seqs seqs = {3, T, 5, cu};
    assert_nopad_ok(be->embed_backward(be, grads[0], grads[1], grads[2], grads[3], grads[4],
                                       dy_copy, tokens, types, &seqs, offset, tables[0],
                                       tables[1], tables[2], tables[3], 1e-12f, EE));
    static const char *names[5] = {"d_word", "d_pos", "d_type", "d_ln_w", "d_ln_b"};
    for (int k = 0; k < 5; k++) {
        double *g = malloc(sizeof(double) * sizes[k]);
        c.which = k;
        finite_differences(embed_objective, &c, c.tables[k], sizes[k], g);
        for (int64_t i = 0; i < sizes[k]; i++) want[k][i] += g[i];
        expect_close(names[k], grads[k], want[k], sizes[k] / EE, EE);
        free(g);
    }
    for (int k = 0; k < 5; k++) free(tables[k]), free(grads[k]), free(want[k]), free(c.tables[k]);
    free(dy), free(dy_copy);
}

/* ---- attention ---------------------------------------------------------------------------- */

typedef struct attn_ctx {
    const int32_t *cu;
    int32_t n_seqs, T, heads, d, causal;
    double scale;
    const float *r; /* [T, heads·d] */
    const nopad_attention_dropout *drop; /* NULL: none */
} attn_ctx;

/* out[T, heads·d] and lse[T, heads] of packed qkv, in double. */
static void attention_ref(double *out, double *lse, const double *qkv, const attn_ctx *c) {
    const int32_t H = c->heads * c->d;
    for (int32_t s = 0; s < c->n_seqs; s++) {
        const int32_t start = c->cu[s], len = c->cu[s + 1] - start;
        double *p = malloc(sizeof(double) * len);
        for (int32_t h = 0; h < c->heads; h++)
            for (int32_t i = 0; i < len; i++) {
                const double *q = qkv + (size_t)(start + i) * 3 * H + h * c->d;
                const int32_t n_keys = c->causal ? i + 1 : len;
                double mx = -INFINITY, sum = 0;
                for (int32_t j = 0; j < n_keys; j++) {
                    const double *k = qkv + (size_t)(start + j) * 3 * H + H + h * c->d;
                    double dot = 0;
                    for (int32_t e = 0; e < c->d; e++) dot += q[e] * k[e];
                    p[j] = dot * c->scale;
                    mx = fmax(mx, p[j]);
                }
                for (int32_t j = 0; j < n_keys; j++) sum += (p[j] = exp(p[j] - mx));
                if (lse) lse[(size_t)(start + i) * c->heads + h] = mx + log(sum);
                if (c->drop) { /* backend.h's definition: the bits of (i, j) against p·2³² */
                    const uint32_t threshold = (uint32_t)((double)c->drop->p * 4294967296.0);
                    for (int32_t j = 0; j < n_keys; j++)
                        p[j] *= attention_dropout_bits(c->drop->key, c->drop->site, (uint32_t)h,
                                                       (uint64_t)c->drop->examples[s], (uint32_t)i,
                                                       (uint32_t)j) >= threshold
                                    ? 1.0 / (1.0 - (double)c->drop->p)
                                    : 0.0;
                }
                for (int32_t e = 0; e < c->d; e++) {
                    double acc = 0;
                    for (int32_t j = 0; j < n_keys; j++)
                        acc += p[j] * qkv[(size_t)(start + j) * 3 * H + 2 * H + h * c->d + e];
                    out[(size_t)(start + i) * H + h * c->d + e] = acc / sum;
                }
            }
        free(p);
    }
}

static double attn_objective(void *ctx_, const double *qkv) {
    const attn_ctx *c = ctx_;
    double *out = malloc(sizeof(double) * c->T * c->heads * c->d);
    attention_ref(out, NULL, qkv, c);
    const double v = dot_r(out, c->r, (int64_t)c->T * c->heads * c->d);
    free(out);
    return v;
}

/* Without dropout (sequences of 4, 1 and 6 tokens), then with attention dropout 0.3 (4, 1 and
 * 18 tokens, so that positions with bit 3 set pick the other words of their Philox blocks): the
 * forward against the double reference, which applies backend.h's mask itself, and the backward
 * against central differences of the reference with the mask fixed. */
static void test_attention_backward(void **state) {
    uint64_t rng = 15;
    const int64_t examples[] = {9, 4, (int64_t)((1ull << 33) + 4)}; /* the last one's high word: the key */
    const nopad_attention_dropout drop = {0.3f, 0x5EEDull, 5, examples};
    for (int variant = 0; variant < 4; variant++) {
        const int causal = variant & 1, dropped = variant >> 1;
        const int32_t cu[] = {0, 4, 5, dropped ? 23 : 11}, T = cu[3], heads = 2, d = 4, H = heads * d;
        attn_ctx c = {cu, 3, T, heads, d, causal, 1.0 / sqrt((double)d), NULL, dropped ? &drop : NULL};
        float *qkv = random_floats(T * 3 * H, -1.5f, 1.5f, &rng), *dout = random_floats(T * H, -1, 1, &rng);
        c.r = dout;
        float *out = malloc(sizeof(float) * T * H), *lse = malloc(sizeof(float) * T * heads);
        float *dqkv = malloc(sizeof(float) * T * 3 * H);
        nopad_seqs seqs = {3, T, T - 5 > 4 ? T - 5 : 4, cu};
        assert_nopad_ok(be->attention_lse(be, out, lse, qkv, &seqs, heads, d, (float)c.scale, causal, c.drop));
        double *theta = to_double(qkv, T * 3 * H), *want_out = malloc(sizeof(double) * T * H);
        double *want_lse = malloc(sizeof(double) * T * heads);
        attention_ref(want_out, want_lse, theta, &c);
        expect_close("attention_lse out", out, want_out, T, H);
        expect_close("attention_lse lse", lse, want_lse, T, heads);
        assert_nopad_ok(be->attention_backward(be, dqkv, dout, qkv, out, lse, &seqs, heads, d,
                                               (float)c.scale, causal, c.drop));
        double *g = malloc(sizeof(double) * T * 3 * H);
        finite_differences(attn_objective, &c, theta, T * 3 * H, g);
        /* rows of [T, 3, heads, d]: per token, the Q, K and V blocks; the one-token sequence's
         * query and key get no gradient (softmax over one key is 1), see expect_close's floor */
        /* with dropout the floor is 1e-2: out, rescaled by 1/(1 - p), is float32, so D = dout·out
         * carries ~1e-7 of rounding where the exact gradient is 0 (the one-token sequence) */
        expect_close_floor(variant == 0 ? "attention dqkv" : variant == 1 ? "attention dqkv (causal)"
                           : variant == 2 ? "attention dqkv (dropout)" : "attention dqkv (causal, dropout)",
                           dqkv, g, T * 3, H, dropped ? 1e-2 : 1e-3);
        free(qkv), free(dout), free(out), free(lse), free(dqkv), free(theta), free(want_out);
        free(want_lse), free(g);
    }
}

/* The attention's dropout mask: about p of the probabilities dropped, different sites, heads,
 * examples (also 2³² apart: the high word in the key) and keys drawing different masks, apart
 * from the hidden dropout's at the same numbers, and the four scores of a Philox block different
 * words of it. */
static void test_attention_dropout_bits(void **state) {
    (void)state;
    const uint32_t threshold = (uint32_t)(0.1 * 4294967296.0);
    int64_t dropped = 0, n = 0, same_site = 0, same_head = 0, same_example = 0, same_high = 0, same_hidden = 0;
    for (uint32_t i = 0; i < 64; i++)
        for (uint32_t j = 0; j < 64; j++) {
            const uint32_t b = attention_dropout_bits(42, 3, 1, 100, i, j);
            dropped += b < threshold, n++;
            same_site += b == attention_dropout_bits(42, 4, 1, 100, i, j);
            same_head += b == attention_dropout_bits(42, 3, 2, 100, i, j);
            same_example += b == attention_dropout_bits(42, 3, 1, 101, i, j);
            same_high += b == attention_dropout_bits(42, 3, 1, 100 + (1ull << 32), i, j);
            same_hidden += b == hidden_dropout_bits(42, 3, 100, i, j);
        }
    print_message("attention dropout p 0.1: %.4f of %lld dropped\n", (double)dropped / n, (long long)n);
    assert_true(fabs((double)dropped / n - 0.1) < 0.02); /* 4.7 standard deviations of 4096 draws */
    /* 4096 pairs of independent 32-bit words: a coincidence has probability 1e-6 */
    assert_true(same_site == 0 && same_head == 0 && same_example == 0 && same_high == 0 && same_hidden == 0);
    uint32_t block[4];
    attention_dropout_block(42, 3, 1, 100, 16, 32, block);
    assert_int_equal(attention_dropout_bits(42, 3, 1, 100, 16, 32), block[0]);
    assert_int_equal(attention_dropout_bits(42, 3, 1, 100, 16, 40), block[1]);
    assert_int_equal(attention_dropout_bits(42, 3, 1, 100, 24, 32), block[2]);
    assert_int_equal(attention_dropout_bits(42, 3, 1, 100, 24, 40), block[3]);
    assert_int_equal(attention_dropout_bits(42, 3, 1, 100, 17, 32) == block[0], 0);
}

/* ---- rows, losses ------------------------------------------------------------------------- */

static void test_scatter_add_rows(void **state) {
    uint64_t rng = 16;
    const int32_t rows[] = {3, 0, 3, 5}, n = 4, R = 6, D = 19;
    float *x = random_floats(R * D, -1, 1, &rng), *src = random_floats(n * D, -1, 1, &rng);
    double *want = to_double(x, R * D);
    for (int32_t i = 0; i < n; i++)
        for (int32_t d = 0; d < D; d++) want[(size_t)rows[i] * D + d] += src[(size_t)i * D + d];
    assert_nopad_ok(be->scatter_add_rows(be, x, rows, src, n, D));
    expect_close("scatter_add_rows", x, want, R, D);
    free(x), free(src), free(want);
}

typedef struct ce_ctx {
    int32_t n, classes;
    const int32_t *labels;
    double scale;
} ce_ctx;

static double ce_objective(void *ctx_, const double *logits) {
    const ce_ctx *c = ctx_;
    double total = 0;
    for (int32_t r = 0; r < c->n; r++) {
        const double *x = logits + (size_t)r * c->classes;
        double sum = 0;
        for (int32_t k = 0; k < c->classes; k++) sum += exp(x[k]);
        total += log(sum) - x[c->labels[r]];
    }
    return total * c->scale;
}

static void test_losses(void **state) {
    uint64_t rng = 17;
    const int32_t n = 5, classes = 13, labels[] = {0, 12, 7, 7, 3};
    float *logits = random_floats(n * classes, -4, 4, &rng);
    float *dlogits = malloc(sizeof(float) * n * classes), losses[5];
    const float scale = 1.0f / n;
    assert_nopad_ok(be->cross_entropy(be, losses, dlogits, logits, labels, n, classes, scale));
    ce_ctx c = {1, classes, NULL, 1.0};
    double *theta = to_double(logits, n * classes), *g = malloc(sizeof(double) * n * classes);
    double want_losses[5];
    for (int32_t r = 0; r < n; r++) {
        c.labels = labels + r;
        want_losses[r] = ce_objective(&c, theta + (size_t)r * classes);
    }
    expect_close("cross_entropy losses", losses, want_losses, 1, n);
    c = (ce_ctx){n, classes, labels, scale};
    finite_differences(ce_objective, &c, theta, n * classes, g);
    expect_close("cross_entropy dlogits", dlogits, g, n, classes);

    float pred[4] = {0.3f, -1.2f, 2.5f, 0.9f}, target[4] = {1.0f, -1.0f, 0.5f, 0.25f};
    float sq[4], dpred[4];
    assert_nopad_ok(be->squared_error(be, sq, dpred, pred, target, 4, 0.25f));
    for (int r = 0; r < 4; r++) {
        const double diff = (double)pred[r] - target[r];
        if (fabs(sq[r] - diff * diff) > 1e-6 * fmax(1, diff * diff) ||
            fabs(dpred[r] - 0.5 * diff) > 1e-6)
            fail_msg("squared_error row %d: loss %g (want %g), grad %g (want %g)", r, sq[r],
                     diff * diff, dpred[r], 0.5 * diff);
    }
    free(logits), free(dlogits), free(theta), free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_backward),      cmocka_unit_test(test_activation_backward),
        cmocka_unit_test(test_layernorm_backward), cmocka_unit_test(test_embed_backward),
        cmocka_unit_test(test_attention_backward), cmocka_unit_test(test_attention_dropout_bits),
        cmocka_unit_test(test_dropout_keyed_by_example),
        cmocka_unit_test(test_scatter_add_rows),
        cmocka_unit_test(test_losses),             cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_dropout),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

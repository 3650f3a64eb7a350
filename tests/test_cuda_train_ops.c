/* The CUDA training ops of the elementwise, normalisation and loss family (train/elementwise.cu,
 * norm_backward.cu, loss.cu, through the op table of train/ops.c) against the CPU backend's ops,
 * the float32 reference, in fp16 and bf16:
 *   zero, activation and activation_backward (every activation; the bias gradient with and
 *   without, dx aliasing dy), dropout (the mask equal to the CPU's bit for bit on random sequence
 *   lengths 1 .. 512, rows cutting Philox blocks, example numbers past 2³², misaligned views), layernorm_backward (dbias with and without, ds aliasing dy,
 *   two runs bit-identical; rows up to 1024 a warp each, wider ones up to 4096 a block each),
 *   embed_backward (random sequence lengths, position offset 0 and 2,
 *   token types 2 and 3 and none, ids repeating), select_rows, scatter_add_rows (repeated rows),
 *   cross_entropy (2 .. 50257 classes, odd row lengths, dlogits aliasing logits), squared_error,
 *   and a CUDA-graph capture of four ops replaying to the same bits.
 * Random data (never zeros), T = 1 and T = 4096 among the token counts, the BERT widths 768, 1024,
 * 3072, 4096 and odd ones. Inputs are rounded to the GPU dtype first, so both sides compute on the
 * same numbers; parameter gradients accumulate onto non-zero float32 buffers, the same on both
 * sides; outputs are NaN-poisoned before every call, so an unwritten element fails.
 * Bounds:
 *   - outputs in the dtype, max over rows of ||got_r - ref_r|| / ||ref_r||: fp16 2e-3, bf16 1.5e-2.
 *     The GPU computes in float32 from the same inputs, so the difference is the one rounding of
 *     the output (fp16 keeps 11 significant bits: at most 4.9e-4 relative an element; bf16 8:
 *     3.9e-3) plus float32-vs-double arithmetic (~1e-6), with margin. Dropout and squared error
 *     element by element: fp16 1e-3, bf16 8e-3 (the same one rounding).
 *   - float32 parameter gradients (bias, LayerNorm, embedding tables), the vector (or each table
 *     row) relative: 1e-4. Both sides sum the same float32 terms (the GPU before rounding its
 *     output), in another order and in float32 rather than double: ~1e-6 expected.
 *   - float32 losses: |got - ref| <= 1e-5·max(1, |ref|) (a float32 log-sum-exp of up to 50k
 *     terms: ~1e-6).
 *   - select_rows copies bits: equal. The dropout mask: equal.
 * Every case prints its errors, so a failure in a log says which op, dtype and shape.
 * No GPU: exit 77 (ctest: skipped). NOPAD_GPU_TEST_QUICK=1 uses T = 512 instead of 4096. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "cuda_testutil.h"

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "testutil.h"

static nopad_backend *cpu;
static nopad_backend *gpu[2];
static cudaStream_t streams[2]; /* gpu[d] runs on streams[d] */
static const nopad_dtype DTYPES[2] = {NOPAD_DTYPE_F16, NOPAD_DTYPE_BF16};
static const char *const DTYPE_NAMES[2] = {"f16", "bf16"};
static const double BOUND[2] = {2e-3, 1.5e-2};         /* row-relative, outputs in the dtype */
static const double ELEMENT_BOUND[2] = {1e-3, 8e-3};   /* element-relative, one rounding */
static const double GRAD32_BOUND = 1e-4;               /* float32 parameter gradients */
static const double LOSS_BOUND = 1e-5;                 /* float32 losses */
static const char *const ACT_NAMES[5] = {"gelu", "gelu_tanh", "relu", "silu", "tanh"};

static int32_t big_T(void) { return getenv("NOPAD_GPU_TEST_QUICK") ? 512 : 4096; }

/* ---- host and device buffers ---------------------------------------------------------------------- */

static float *random_floats(size_t n, float lo, float hi, uint64_t *rng) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    test_fill_uniform(x, (int64_t)n, lo, hi, rng);
    return x;
}

static float *copy_floats(const float *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

/* A device tensor of the dtype holding `host`, which is rewritten with the rounded values. */
static void *to_dtype(int d, float *host, size_t n) { return test_to_device(gpu[d], host, n); }

/* A device tensor of n elements of the dtype, NaN everywhere. */
static void poison(int d, void *dev, size_t n) {
    float *nan = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    assert_nopad_ok(gpu[d]->upload_f32(gpu[d], dev, nan, n));
    free(nan);
}

static void *alloc_dtype(int d, size_t n) {
    void *p;
    assert_nopad_ok(gpu[d]->alloc(gpu[d], (n ? n : 1) * 2, &p));
    return p;
}

/* A float32 device buffer holding host[n] as it is. */
static float *to_f32(int d, const float *host, size_t n) {
    void *p;
    assert_nopad_ok(gpu[d]->alloc(gpu[d], (n ? n : 1) * sizeof(float), &p));
    if (n) assert_nopad_ok(gpu[d]->upload(gpu[d], p, host, n * sizeof(float)));
    return p;
}

static int32_t *to_i32(int d, const int32_t *host, size_t n) {
    void *p;
    assert_nopad_ok(gpu[d]->alloc(gpu[d], (n ? n : 1) * sizeof(int32_t), &p));
    if (n) assert_nopad_ok(gpu[d]->upload_i32(gpu[d], p, host, n));
    return p;
}

static float *get_dtype(int d, const void *dev, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    assert_nopad_ok(gpu[d]->download_f32(gpu[d], h, dev, n));
    return h;
}

static float *get_f32(int d, const float *dev, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    assert_nopad_ok(gpu[d]->download(gpu[d], h, dev, n * sizeof(float)));
    return h;
}

static void release(int d, void *dev) { gpu[d]->free(gpu[d], dev); }

/* ---- comparisons -------------------------------------------------------------------------------------- */

/* Fails unless every element of got[rows, cols] is finite and the row-relative error is within
 * bound; returns the error. `what` names the case. */
static double expect_rows(const char *what, const float *got, const float *ref, int64_t rows, int64_t cols,
                          double bound) {
    for (int64_t i = 0; i < rows * cols; i++)
        if (!isfinite(got[i]))
            fail_msg("%s: element %lld (row %lld) = %g: unwritten or not finite (reference %g)", what, (long long)i,
                     (long long)(i / cols), got[i], ref[i]);
    const double err = test_max_row_rel_error(got, ref, rows, cols);
    if (!(err <= bound)) fail_msg("%s: row-relative error %.3g > %.3g", what, err, bound);
    return err;
}

static double max_d(double a, double b) { return a > b ? a : b; }

/* Random sequence lengths in [1, max_len] adding up to T: cu[B+1] (caller frees), B, the longest. */
static int32_t *random_cu_seqlens(int32_t T, int32_t max_len, uint64_t *rng, int32_t *n_seqs, int32_t *longest) {
    int32_t *cu = malloc(((size_t)T + 1) * sizeof(int32_t));
    int32_t b = 0, t = 0;
    *longest = 0;
    cu[0] = 0;
    while (t < T) {
        int32_t len = 1 + (int32_t)(test_rand_u32(rng) % (uint32_t)max_len);
        if (len > T - t) len = T - t;
        t += len;
        cu[++b] = t;
        if (len > *longest) *longest = len;
    }
    *n_seqs = b;
    return cu;
}

/* ---- zero ------------------------------------------------------------------------------------------- */

static void test_zero(void **state) {
    uint64_t rng = 0x7a65726fULL;
    for (int d = 0; d < 2; d++) {
        enum { BYTES = 1000, START = 3, LEN = 517 };
        unsigned char host[BYTES], back[BYTES];
        for (int i = 0; i < BYTES; i++) host[i] = (unsigned char)(1 + test_rand_u32(&rng) % 255);
        void *dev;
        assert_nopad_ok(gpu[d]->alloc(gpu[d], BYTES, &dev));
        assert_nopad_ok(gpu[d]->upload(gpu[d], dev, host, BYTES));
        assert_nopad_ok(gpu[d]->zero(gpu[d], (char *)dev + START, LEN));
        assert_nopad_ok(gpu[d]->zero(gpu[d], dev, 0));
        assert_nopad_ok(gpu[d]->download(gpu[d], back, dev, BYTES));
        for (int i = 0; i < BYTES; i++) {
            const unsigned char want = i >= START && i < START + LEN ? 0 : host[i];
            if (back[i] != want) fail_msg("%s zero: byte %d = %u, want %u", DTYPE_NAMES[d], i, back[i], want);
        }
        release(d, dev);
    }
    printf("zero: bytes [3, 520) of 1000 zeroed, the rest untouched\n");
}

/* ---- activation and its backward ------------------------------------------------------------------ */

static void test_activation(void **state) {
    const int32_t TB = big_T();
    const int32_t shapes[][2] = {{1, 768}, {5, 3}, {7, 1000}, {333, 3072}, {TB, 1024}, {TB, 4096}, {64, 768}};
    const int n_shapes = sizeof shapes / sizeof shapes[0];
    uint64_t rng = 0x61637469ULL;
    for (int d = 0; d < 2; d++)
        for (int act = 0; act < 5; act++) {
            double worst_y = 0, worst_dx = 0, worst_db = 0, worst_alias = 0;
            for (int si = 0; si < n_shapes; si++) {
                const int32_t T = shapes[si][0], dim = shapes[si][1];
                const size_t n = (size_t)T * dim;
                char what[160];
                float *x = random_floats(n, -4.0f, 4.0f, &rng), *dy = random_floats(n, -1.0f, 1.0f, &rng);
                float *db = random_floats((size_t)dim, -1.0f, 1.0f, &rng);
                void *x_dev = to_dtype(d, x, n), *dy_dev = to_dtype(d, dy, n), *out_dev = alloc_dtype(d, n);
                float *db_dev = to_f32(d, db, (size_t)dim);

                /* forward */
                float *ref = malloc(n * sizeof(float));
                assert_nopad_ok(cpu->activation(cpu, ref, x, T, dim, (nopad_activation)act));
                poison(d, out_dev, n);
                assert_nopad_ok(gpu[d]->activation(gpu[d], out_dev, x_dev, T, dim, (nopad_activation)act));
                float *got = get_dtype(d, out_dev, n);
                snprintf(what, sizeof what, "%s activation %s T %d dim %d", DTYPE_NAMES[d], ACT_NAMES[act], T, dim);
                worst_y = max_d(worst_y, expect_rows(what, got, ref, T, dim, BOUND[d]));
                free(got);

                /* backward with the bias gradient, into a separate dx */
                float *ref_db = copy_floats(db, (size_t)dim);
                assert_nopad_ok(cpu->activation_backward(cpu, ref, ref_db, dy, x, T, dim, (nopad_activation)act));
                poison(d, out_dev, n);
                assert_nopad_ok(gpu[d]->activation_backward(gpu[d], out_dev, db_dev, dy_dev, x_dev, T, dim,
                                                            (nopad_activation)act));
                got = get_dtype(d, out_dev, n);
                float *got_db = get_f32(d, db_dev, (size_t)dim);
                snprintf(what, sizeof what, "%s activation_backward %s T %d dim %d: dx", DTYPE_NAMES[d],
                         ACT_NAMES[act], T, dim);
                worst_dx = max_d(worst_dx, expect_rows(what, got, ref, T, dim, BOUND[d]));
                snprintf(what, sizeof what, "%s activation_backward %s T %d dim %d: db32", DTYPE_NAMES[d],
                         ACT_NAMES[act], T, dim);
                worst_db = max_d(worst_db, expect_rows(what, got_db, ref_db, 1, dim, GRAD32_BOUND));
                free(got), free(got_db);

                /* backward in place (dx = dy), no bias gradient */
                assert_nopad_ok(gpu[d]->activation_backward(gpu[d], dy_dev, NULL, dy_dev, x_dev, T, dim,
                                                            (nopad_activation)act));
                got = get_dtype(d, dy_dev, n);
                snprintf(what, sizeof what, "%s activation_backward %s T %d dim %d in place", DTYPE_NAMES[d],
                         ACT_NAMES[act], T, dim);
                worst_alias = max_d(worst_alias, expect_rows(what, got, ref, T, dim, BOUND[d]));
                free(got);

                release(d, x_dev), release(d, dy_dev), release(d, out_dev), release(d, db_dev);
                free(x), free(dy), free(db), free(ref), free(ref_db);
            }
            printf("%s %-9s worst: activation %.3g, backward dx %.3g (in place %.3g), db32 %.3g (bounds %.3g, %.3g)\n",
                   DTYPE_NAMES[d], ACT_NAMES[act], worst_y, worst_dx, worst_alias, worst_db, BOUND[d], GRAD32_BOUND);
        }
}

/* ---- dropout ---------------------------------------------------------------------------------------- */

/* Compares y = dropout(x) with the CPU's: the mask (zero or not) equal everywhere, kept values
 * within one rounding. Returns the number of dropped elements. */
static int64_t expect_dropout(const char *what, int d, const float *got, const float *ref, int64_t n) {
    int64_t dropped = 0;
    for (int64_t i = 0; i < n; i++) {
        if ((got[i] == 0.0f) != (ref[i] == 0.0f))
            fail_msg("%s: element %lld: %g but the CPU gives %g: the masks differ", what, (long long)i, got[i],
                     ref[i]);
        if (ref[i] == 0.0f) {
            dropped++;
            continue;
        }
        if (!(fabs((double)got[i] - ref[i]) <= ELEMENT_BOUND[d] * fabs(ref[i])))
            fail_msg("%s: element %lld: %g, the CPU %g (element bound %.3g)", what, (long long)i, got[i], ref[i],
                     ELEMENT_BOUND[d]);
    }
    return dropped;
}

/* A device copy of host[n] int64 (example numbers). */
static int64_t *to_i64(int d, const int64_t *host, size_t n) {
    void *p;
    assert_nopad_ok(gpu[d]->alloc(gpu[d], (n ? n : 1) * sizeof(int64_t), &p));
    if (n) assert_nopad_ok(gpu[d]->upload(gpu[d], p, host, n * sizeof(int64_t)));
    return p;
}

/* Dropout of packed rows keyed by (site, example, position, column): random sequence lengths in
 * [1, 512] (T = 1 among them: one sequence of one token; the longest the cap), rows of 1, 7, 37
 * (blocks of 4 cut by the row's end, no 16-byte vectors), 768 and 1024 columns, random example
 * numbers with some past 2³² (their high word in the key), and none (sequence s is example s);
 * aligned and a view one element in; in place as its own backward. */
static void test_dropout(void **state) {
    typedef struct { int32_t T, dim; } drop_case;
    const drop_case cases[] = {{1, 768}, {5, 1}, {300, 7}, {517, 37}, {4096, 768}, {2049, 1024}};
    const float rates[] = {0.1f, 0.5f};
    const uint64_t key = 0x9e3779b97f4a7c15ULL;
    const uint32_t sites[] = {0, 23};
    uint64_t rng = 0x64726f70ULL;
    for (int d = 0; d < 2; d++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
            for (int keyed = 0; keyed < 2; keyed++)
                for (size_t pi = 0; pi < 2; pi++) {
                    const int32_t T = cases[ci].T == 4096 ? big_T() : cases[ci].T, dim = cases[ci].dim;
                    const int64_t n = (int64_t)T * dim;
                    const float p = rates[pi];
                    const uint32_t site = sites[pi];
                    int32_t B, longest;
                    int32_t *cu = random_cu_seqlens(T, 512, &rng, &B, &longest);
                    int64_t *examples = malloc((size_t)B * sizeof(int64_t));
                    for (int32_t s = 0; s < B; s++)
                        examples[s] = (int64_t)test_rand_u32(&rng) + (s % 3 == 0 ? (int64_t)(s + 1) << 32 : 0);
                    const nopad_seqs cpu_seqs = {B, T, longest, cu};
                    int32_t *cu_dev = to_i32(d, cu, (size_t)B + 1);
                    int64_t *ex_dev = keyed ? to_i64(d, examples, (size_t)B) : NULL;
                    const nopad_seqs gpu_seqs = {B, T, longest, cu_dev};
                    /* |x| in [0.1, 1]: kept values stay normal numbers in fp16 */
                    float *x = random_floats((size_t)n + 1, 0.1f, 1.0f, &rng);
                    for (int64_t i = 0; i <= n; i++)
                        if (test_rand_u32(&rng) & 1) x[i] = -x[i];
                    void *x_dev = to_dtype(d, x, (size_t)n + 1), *y_dev = alloc_dtype(d, (size_t)n + 1);
                    float *ref = malloc((size_t)(n + 1) * sizeof(float));
                    const int64_t *cpu_ex = keyed ? examples : NULL;
                    char what[160];
                    /* aligned, then a view one element in (no 16-byte vectors) */
                    for (int shift = 0; shift < 2; shift++) {
                        assert_nopad_ok(cpu->dropout(cpu, ref, x + shift, NULL, &cpu_seqs, cpu_ex, dim, p, key, site));
                        poison(d, y_dev, (size_t)n + 1);
                        void *xs = (char *)x_dev + 2 * shift, *ys = (char *)y_dev + 2 * shift;
                        assert_nopad_ok(gpu[d]->dropout(gpu[d], ys, xs, NULL, &gpu_seqs, ex_dev, dim, p, key, site));
                        float *all = get_dtype(d, y_dev, (size_t)n + 1);
                        snprintf(what, sizeof what, "%s dropout T %d (%d sequences) dim %d p %.1f%s%s", DTYPE_NAMES[d],
                                 T, B, dim, p, keyed ? "" : " (no example numbers)", shift ? " (misaligned)" : "");
                        const int64_t dropped = expect_dropout(what, d, all + shift, ref, n);
                        /* nothing outside the n elements was written */
                        if (!isnan(all[shift ? 0 : n])) fail_msg("%s: an element past the range was written", what);
                        if (n >= 1000000 && shift == 0) {
                            const double rate = (double)dropped / n, sd = sqrt(p * (1 - p) / n);
                            printf("%s: dropped %.4f (5 sd = %.4f)\n", what, rate, 5 * sd);
                            if (fabs(rate - p) > 5 * sd) fail_msg("%s: dropped fraction %.4f", what, rate);
                        }
                        free(all);
                    }
                    /* in place (y = x), its own backward: the same mask again */
                    assert_nopad_ok(cpu->dropout(cpu, ref, x, NULL, &cpu_seqs, cpu_ex, dim, p, key, site));
                    assert_nopad_ok(gpu[d]->dropout(gpu[d], x_dev, x_dev, NULL, &gpu_seqs, ex_dev, dim, p, key, site));
                    float *got = get_dtype(d, x_dev, (size_t)n);
                    snprintf(what, sizeof what, "%s dropout T %d dim %d p %.1f in place", DTYPE_NAMES[d], T, dim, p);
                    expect_dropout(what, d, got, ref, n);
                    free(got);
                    release(d, x_dev), release(d, y_dev), release(d, cu_dev);
                    if (ex_dev) release(d, ex_dev);
                    free(x), free(ref), free(cu), free(examples);
                }
    /* p = 0: the identity; with a residual (a sub-layer's dropped output joining the residual
     * stream), in place over x: residual + the CPU's dropped values within one rounding of the
     * sum; both terms positive */
    for (int d = 0; d < 2; d++) {
        const int32_t T = 1031, dim = 97;
        const int64_t n = (int64_t)T * dim;
        int32_t B, longest;
        int32_t *cu = random_cu_seqlens(T, 512, &rng, &B, &longest);
        int64_t *examples = malloc((size_t)B * sizeof(int64_t));
        for (int32_t s = 0; s < B; s++) examples[s] = 1000 + 7 * s;
        const nopad_seqs cpu_seqs = {B, T, longest, cu};
        int32_t *cu_dev = to_i32(d, cu, (size_t)B + 1);
        int64_t *ex_dev = to_i64(d, examples, (size_t)B);
        const nopad_seqs gpu_seqs = {B, T, longest, cu_dev};
        float *x = random_floats((size_t)n, 0.5f, 1.5f, &rng), *r = random_floats((size_t)n, 0.5f, 1.5f, &rng);
        float *ref = malloc(sizeof(float) * (size_t)n);
        void *x_dev = to_dtype(d, x, (size_t)n), *r_dev = to_dtype(d, r, (size_t)n), *y_dev = alloc_dtype(d, (size_t)n);
        poison(d, y_dev, (size_t)n);
        assert_nopad_ok(gpu[d]->dropout(gpu[d], y_dev, x_dev, NULL, &gpu_seqs, ex_dev, dim, 0.0f, key, 3));
        float *got = get_dtype(d, y_dev, (size_t)n);
        for (int64_t i = 0; i < n; i++)
            if (got[i] != x[i]) fail_msg("%s dropout p = 0: element %lld %g != %g", DTYPE_NAMES[d], (long long)i, got[i], x[i]);
        free(got);
        assert_nopad_ok(cpu->dropout(cpu, ref, x, r, &cpu_seqs, examples, dim, 0.1f, key, 3));
        assert_nopad_ok(gpu[d]->dropout(gpu[d], x_dev, x_dev, r_dev, &gpu_seqs, ex_dev, dim, 0.1f, key, 3));
        got = get_dtype(d, x_dev, (size_t)n);
        for (int64_t i = 0; i < n; i++)
            if (!(fabs((double)got[i] - ref[i]) <= ELEMENT_BOUND[d] * fabs(ref[i])))
                fail_msg("%s dropout with residual: element %lld: %g, the CPU %g", DTYPE_NAMES[d], (long long)i,
                         got[i], ref[i]);
        free(got), free(x), free(r), free(ref), free(cu), free(examples);
        release(d, x_dev), release(d, r_dev), release(d, y_dev), release(d, cu_dev), release(d, ex_dev);
    }
    printf("dropout: masks equal to the CPU's (2 dtypes x 6 shapes x keyed or not x 2 rates, aligned, misaligned, "
           "in place, with a residual), values within %.3g / %.3g\n", ELEMENT_BOUND[0], ELEMENT_BOUND[1]);
}

/* ---- LayerNorm backward ---------------------------------------------------------------------------- */

/* LayerNorm inputs with a mean and a scale of their own per row (the residual stream's rows are
 * not centred). */
static float *layernorm_input(int32_t T, int32_t dim, uint64_t *rng) {
    float *s = random_floats((size_t)T * dim, -2.0f, 2.0f, rng);
    for (int32_t t = 0; t < T; t++) {
        float shift, scale;
        test_fill_uniform(&shift, 1, -3.0f, 3.0f, rng);
        test_fill_uniform(&scale, 1, 0.5f, 3.0f, rng);
        for (int32_t i = 0; i < dim; i++) s[(size_t)t * dim + i] = shift + scale * s[(size_t)t * dim + i];
    }
    return s;
}

static void test_layernorm_backward(void **state) {
    const int32_t TB = big_T();
    const int32_t shapes[][2] = {{1, 768}, {1, 1024}, {37, 100}, {257, 999}, {64, 8},  {300, 520},
                                 {TB, 768}, {TB, 1024}, {129, 256}, {5, 1}, {1, 4096}, {300, 3072},
                                 {TB, 4096}, {17, 2001}, {3, 4095}};
    const int n_shapes = sizeof shapes / sizeof shapes[0];
    const float eps = 1e-12f;
    uint64_t rng = 0x6c6e6277ULL;
    for (int d = 0; d < 2; d++) {
        double worst_ds = 0, worst_grad = 0;
        for (int si = 0; si < n_shapes; si++)
            for (int variant = 0; variant < 2; variant++) { /* 0: separate ds, dbias; 1: ds = dy, no dbias */
                const int32_t T = shapes[si][0], dim = shapes[si][1];
                const size_t n = (size_t)T * dim;
                const int with_dbias = variant == 0, alias = variant == 1;
                float *s = layernorm_input(T, dim, &rng), *dy = random_floats(n, -1.0f, 1.0f, &rng);
                float *w = random_floats((size_t)dim, 0.5f, 1.5f, &rng);
                float *g32[3]; /* dw, db, dbias: non-zero starting values */
                for (int k = 0; k < 3; k++) g32[k] = random_floats((size_t)dim, -1.0f, 1.0f, &rng);
                void *s_dev = to_dtype(d, s, n), *dy_dev = to_dtype(d, dy, n), *w_dev = to_dtype(d, w, (size_t)dim);
                void *ds_dev = alloc_dtype(d, n);
                float *g32_dev[3];
                for (int k = 0; k < 3; k++) g32_dev[k] = to_f32(d, g32[k], (size_t)dim);

                float *ref_ds = malloc(n * sizeof(float)), *ref_g[3];
                for (int k = 0; k < 3; k++) ref_g[k] = copy_floats(g32[k], (size_t)dim);
                assert_nopad_ok(cpu->layernorm_backward(cpu, ref_ds, ref_g[0], ref_g[1], with_dbias ? ref_g[2] : NULL,
                                                        dy, s, w, eps, T, dim));
                void *out = alias ? dy_dev : ds_dev;
                if (!alias) poison(d, ds_dev, n);
                assert_nopad_ok(gpu[d]->layernorm_backward(gpu[d], out, g32_dev[0], g32_dev[1],
                                                           with_dbias ? g32_dev[2] : NULL, dy_dev, s_dev, w_dev, eps,
                                                           T, dim));
                char what[160];
                float *got = get_dtype(d, out, n);
                snprintf(what, sizeof what, "%s layernorm_backward T %d dim %d%s: ds", DTYPE_NAMES[d], T, dim,
                         alias ? " (ds = dy)" : "");
                const double e_ds = expect_rows(what, got, ref_ds, T, dim, BOUND[d]);
                double e_grad = 0;
                static const char *const names[3] = {"dw32", "db32", "dbias32"};
                float *got_g[3];
                for (int k = 0; k < 3; k++) {
                    got_g[k] = get_f32(d, g32_dev[k], (size_t)dim);
                    snprintf(what, sizeof what, "%s layernorm_backward T %d dim %d: %s", DTYPE_NAMES[d], T, dim,
                             names[k]);
                    e_grad = max_d(e_grad, expect_rows(what, got_g[k], ref_g[k], 1, dim, GRAD32_BOUND));
                }
                printf("%s layernorm_backward T %4d dim %4d %-12s ds %.3g, dw/db/dbias %.3g\n", DTYPE_NAMES[d], T,
                       dim, alias ? "ds = dy" : "with dbias", e_ds, e_grad);
                worst_ds = max_d(worst_ds, e_ds), worst_grad = max_d(worst_grad, e_grad);

                /* a second run from the same starting gradients gives the same bits */
                if (!alias && T == TB) {
                    for (int k = 0; k < 3; k++)
                        assert_nopad_ok(gpu[d]->upload(gpu[d], g32_dev[k], g32[k], (size_t)dim * sizeof(float)));
                    assert_nopad_ok(gpu[d]->layernorm_backward(gpu[d], ds_dev, g32_dev[0], g32_dev[1], g32_dev[2],
                                                               dy_dev, s_dev, w_dev, eps, T, dim));
                    for (int k = 0; k < 3; k++) {
                        float *again = get_f32(d, g32_dev[k], (size_t)dim);
                        if (memcmp(again, got_g[k], (size_t)dim * sizeof(float)) != 0)
                            fail_msg("%s layernorm_backward T %d dim %d: %s differs between two runs", DTYPE_NAMES[d],
                                     T, dim, names[k]);
                        free(again);
                    }
                }
                for (int k = 0; k < 3; k++) free(got_g[k]), free(ref_g[k]), free(g32[k]), release(d, g32_dev[k]);
                free(got), free(ref_ds), free(s), free(dy), free(w);
                release(d, s_dev), release(d, dy_dev), release(d, w_dev), release(d, ds_dev);
            }
        printf("%s layernorm_backward worst: ds %.3g (bound %.3g), parameter gradients %.3g (bound %.3g); "
               "bit-identical reruns\n", DTYPE_NAMES[d], worst_ds, BOUND[d], worst_grad, GRAD32_BOUND);
    }
    /* wider than a block's registers: a clear refusal */
    assert_nopad_error(gpu[0]->layernorm_backward(gpu[0], NULL, NULL, NULL, NULL, NULL, NULL, NULL, eps, 4, 4100),
                       NOPAD_ERR_UNSUPPORTED, "width");
}

/* ---- embedding backward ----------------------------------------------------------------------------- */

typedef struct embed_case {
    int32_t T, dim, offset, type_vocab; /* type_vocab 0: no type table */
} embed_case;

static void test_embed_backward(void **state) {
    const int32_t TB = big_T();
    const embed_case cases[] = {{1, 768, 0, 2},   {300, 768, 0, 2},  {TB, 1024, 0, 2}, {TB, 768, 2, 1},
                                {517, 100, 0, 3}, {200, 1024, 2, 0}, {64, 999, 0, 2}, {300, 2048, 0, 3},
                                {1, 4096, 2, 2}};
    const int32_t V = 1000, P = 514, max_len = 512;
    const float eps = 1e-12f;
    uint64_t rng = 0x656d6264ULL;
    for (int d = 0; d < 2; d++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const embed_case c = cases[ci];
            const int32_t T = c.T, dim = c.dim, TV = c.type_vocab;
            const size_t n = (size_t)T * dim;
            int32_t B, longest;
            int32_t *cu = random_cu_seqlens(T, max_len, &rng, &B, &longest);
            /* ids: mostly 40 frequent ones and one as common as [MASK], so rows repeat a lot */
            int32_t *tokens = malloc((size_t)T * sizeof(int32_t)), *types = malloc((size_t)T * sizeof(int32_t));
            for (int32_t t = 0; t < T; t++) {
                const uint32_t r = test_rand_u32(&rng);
                tokens[t] = r % 7 == 0 ? 103 : r % 3 == 0 ? (int32_t)(test_rand_u32(&rng) % V)
                                                          : (int32_t)(test_rand_u32(&rng) % 40);
                types[t] = TV ? (int32_t)(test_rand_u32(&rng) % (uint32_t)TV) : 0;
            }
            float *word = random_floats((size_t)V * dim, -1.0f, 1.0f, &rng);
            float *pos = random_floats((size_t)P * dim, -0.5f, 0.5f, &rng);
            float *type = TV ? random_floats((size_t)TV * dim, -0.5f, 0.5f, &rng) : NULL;
            float *ln_w = random_floats((size_t)dim, 0.5f, 1.5f, &rng);
            float *dy = random_floats(n, -1.0f, 1.0f, &rng);
            /* float32 gradients, non-zero: word, pos, type, ln_w, ln_b */
            const size_t sizes[5] = {(size_t)V * dim, (size_t)P * dim, (size_t)(TV ? TV : 1) * dim, (size_t)dim,
                                     (size_t)dim};
            float *g[5], *ref_g[5], *g_dev[5];
            for (int k = 0; k < 5; k++) {
                g[k] = random_floats(sizes[k], -1.0f, 1.0f, &rng);
                ref_g[k] = copy_floats(g[k], sizes[k]);
                g_dev[k] = to_f32(d, g[k], sizes[k]);
            }
            void *word_dev = to_dtype(d, word, (size_t)V * dim), *pos_dev = to_dtype(d, pos, (size_t)P * dim);
            void *type_dev = TV ? to_dtype(d, type, (size_t)TV * dim) : NULL;
            void *ln_w_dev = to_dtype(d, ln_w, (size_t)dim), *dy_dev = to_dtype(d, dy, n);
            int32_t *tokens_dev = to_i32(d, tokens, (size_t)T), *types_dev = to_i32(d, types, (size_t)T);
            int32_t *cu_dev = to_i32(d, cu, (size_t)B + 1);

            const nopad_seqs host_seqs = {B, T, longest, cu}, dev_seqs = {B, T, longest, cu_dev};
            assert_nopad_ok(cpu->embed_backward(cpu, ref_g[0], ref_g[1], TV ? ref_g[2] : NULL, ref_g[3], ref_g[4], dy,
                                                tokens, TV ? types : NULL, &host_seqs, c.offset, word, pos, type,
                                                ln_w, eps, dim));
            assert_nopad_ok(gpu[d]->embed_backward(gpu[d], g_dev[0], g_dev[1], TV ? g_dev[2] : NULL, g_dev[3],
                                                   g_dev[4], dy_dev, tokens_dev, TV ? types_dev : NULL, &dev_seqs,
                                                   c.offset, word_dev, pos_dev, type_dev, ln_w_dev, eps, dim));
            char what[200];
            float *got = get_dtype(d, dy_dev, n);
            snprintf(what, sizeof what, "%s embed_backward T %d (%d seqs) dim %d offset %d types %d: ds over dy",
                     DTYPE_NAMES[d], T, B, dim, c.offset, TV);
            const double e_ds = expect_rows(what, got, dy, T, dim, BOUND[d]);
            static const char *const names[5] = {"d_word32", "d_pos32", "d_type32", "d_ln_w32", "d_ln_b32"};
            double e_tables = 0, e_ln = 0;
            for (int k = 0; k < 5; k++) {
                float *got_g = get_f32(d, g_dev[k], sizes[k]);
                snprintf(what, sizeof what, "%s embed_backward T %d dim %d offset %d types %d: %s", DTYPE_NAMES[d], T,
                         dim, c.offset, TV, names[k]);
                const double e = expect_rows(what, got_g, ref_g[k], (int64_t)(sizes[k] / dim), dim, GRAD32_BOUND);
                if (k < 3) e_tables = max_d(e_tables, e);
                else e_ln = max_d(e_ln, e);
                free(got_g);
            }
            printf("%s embed_backward T %4d (%3d seqs) dim %4d offset %d types %d: ds %.3g, tables %.3g, "
                   "LayerNorm %.3g\n", DTYPE_NAMES[d], T, B, dim, c.offset, TV, e_ds, e_tables, e_ln);
            free(got);
            for (int k = 0; k < 5; k++) free(g[k]), free(ref_g[k]), release(d, g_dev[k]);
            release(d, word_dev), release(d, pos_dev), release(d, ln_w_dev), release(d, dy_dev);
            if (type_dev) release(d, type_dev);
            release(d, tokens_dev), release(d, types_dev), release(d, cu_dev);
            free(cu), free(tokens), free(types), free(word), free(pos), free(type), free(ln_w), free(dy);
        }
}

/* ---- select_rows, scatter_add_rows --------------------------------------------------------------------- */

static void test_rows(void **state) {
    const int32_t R = 4096;                              /* rows of x */
    const int32_t dims[] = {768, 1024, 100, 3};
    const int32_t counts[] = {1, 37, 614, 2048};           /* n: rows selected / sources added */
    uint64_t rng = 0x726f7773ULL;
    for (int d = 0; d < 2; d++) {
        double worst_scatter = 0;
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (size_t ni = 0; ni < sizeof counts / sizeof counts[0]; ni++)
                for (int repeats = 0; repeats < 2; repeats++) {
                    const int32_t dim = dims[di], n = counts[ni];
                    /* distinct rows (masked positions, CLS rows) or drawn from 50 (repeats) */
                    int32_t *rows = malloc((size_t)n * sizeof(int32_t));
                    for (int32_t i = 0; i < n; i++)
                        rows[i] = repeats ? (int32_t)(test_rand_u32(&rng) % 50) : (int32_t)((i * 2 + 1) % R);
                    if (repeats && n > 2) rows[n - 1] = rows[0]; /* the first and the last source meet */
                    float *x = random_floats((size_t)R * dim, -1.0f, 1.0f, &rng);
                    float *src = random_floats((size_t)n * dim, -1.0f, 1.0f, &rng);
                    void *x_dev = to_dtype(d, x, (size_t)R * dim), *src_dev = to_dtype(d, src, (size_t)n * dim);
                    void *out_dev = alloc_dtype(d, (size_t)n * dim);
                    int32_t *rows_dev = to_i32(d, rows, (size_t)n);

                    poison(d, out_dev, (size_t)n * dim);
                    assert_nopad_ok(gpu[d]->select_rows(gpu[d], out_dev, x_dev, rows_dev, n, dim));
                    float *got = get_dtype(d, out_dev, (size_t)n * dim);
                    for (int32_t i = 0; i < n; i++)
                        for (int32_t c = 0; c < dim; c++)
                            if (memcmp(&got[(size_t)i * dim + c], &x[(size_t)rows[i] * dim + c], sizeof(float)))
                                fail_msg("%s select_rows n %d dim %d: out[%d][%d] = %g, x[%d][%d] = %g", DTYPE_NAMES[d],
                                         n, dim, i, c, got[(size_t)i * dim + c], rows[i], c, x[(size_t)rows[i] * dim + c]);
                    free(got);

                    float *ref = copy_floats(x, (size_t)R * dim);
                    assert_nopad_ok(cpu->scatter_add_rows(cpu, ref, rows, src, n, dim));
                    assert_nopad_ok(gpu[d]->scatter_add_rows(gpu[d], x_dev, rows_dev, src_dev, n, dim));
                    got = get_dtype(d, x_dev, (size_t)R * dim);
                    char what[160];
                    snprintf(what, sizeof what, "%s scatter_add_rows n %d dim %d%s", DTYPE_NAMES[d], n, dim,
                             repeats ? " (rows repeat)" : "");
                    worst_scatter = max_d(worst_scatter, expect_rows(what, got, ref, R, dim, BOUND[d]));
                    free(got), free(ref), free(rows), free(x), free(src);
                    release(d, x_dev), release(d, src_dev), release(d, out_dev), release(d, rows_dev);
                }
        printf("%s select_rows: bit-exact; scatter_add_rows worst %.3g (bound %.3g)\n", DTYPE_NAMES[d], worst_scatter,
               BOUND[d]);
    }
}

/* ---- losses ----------------------------------------------------------------------------------------- */

static double expect_losses(const char *what, const float *got, const float *ref, int32_t n) {
    double worst = 0;
    for (int32_t i = 0; i < n; i++) {
        const double err = fabs((double)got[i] - ref[i]) / fmax(1.0, fabs(ref[i]));
        if (!(err <= LOSS_BOUND)) fail_msg("%s: loss %d = %.9g, the CPU %.9g (bound %.3g)", what, i, got[i], ref[i],
                                          LOSS_BOUND);
        worst = max_d(worst, err);
    }
    return worst;
}

static void test_cross_entropy(void **state) {
    const int32_t nb = getenv("NOPAD_GPU_TEST_QUICK") ? 32 : 512;
    const int32_t cases[][3] = {/* n, classes, dlogits = logits */
                                {1, 2, 0},     {7, 3, 1},      {64, 1000, 0}, {5, 9, 0},    {nb, 30522, 0},
                                {3, 30522, 1}, {16, 50257, 0}, {33, 4096, 1}, {2, 30523, 0}};
    uint64_t rng = 0x63726f73ULL;
    for (int d = 0; d < 2; d++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const int32_t n = cases[ci][0], classes = cases[ci][1], alias = cases[ci][2];
            const size_t total = (size_t)n * classes;
            /* fp16 with a loss scale, as fp16 training runs: unscaled, most of a 30k-class row's
             * gradients (about 1/(n·classes)) are fp16 subnormals, whose absolute rounding adds
             * up to ~1e-3 of the row's norm */
            const float scale = (d == 0 ? 256.0f : 1.0f) / (float)n;
            float *logits = random_floats(total, -6.0f, 6.0f, &rng);
            int32_t *labels = malloc((size_t)n * sizeof(int32_t));
            for (int32_t i = 0; i < n; i++) labels[i] = (int32_t)(test_rand_u32(&rng) % (uint32_t)classes);
            labels[0] = classes - 1; /* the last class, in the scalar tail */
            void *logits_dev = to_dtype(d, logits, total), *dl_dev = alias ? logits_dev : alloc_dtype(d, total);
            int32_t *labels_dev = to_i32(d, labels, (size_t)n);
            float *nan = malloc((size_t)n * sizeof(float));
            for (int32_t i = 0; i < n; i++) nan[i] = NAN;
            float *losses_dev = to_f32(d, nan, (size_t)n);
            if (!alias) poison(d, dl_dev, total);

            float *ref_loss = malloc((size_t)n * sizeof(float)), *ref_dl = malloc(total * sizeof(float));
            assert_nopad_ok(cpu->cross_entropy(cpu, ref_loss, ref_dl, logits, labels, n, classes, scale));
            assert_nopad_ok(gpu[d]->cross_entropy(gpu[d], losses_dev, dl_dev, logits_dev, labels_dev, n, classes,
                                                  scale));
            char what[160];
            snprintf(what, sizeof what, "%s cross_entropy n %d classes %d%s", DTYPE_NAMES[d], n, classes,
                     alias ? " (dlogits = logits)" : "");
            float *got_loss = get_f32(d, losses_dev, (size_t)n), *got_dl = get_dtype(d, dl_dev, total);
            const double e_loss = expect_losses(what, got_loss, ref_loss, n);
            const double e_dl = expect_rows(what, got_dl, ref_dl, n, classes, BOUND[d]);
            printf("%s cross_entropy n %4d classes %5d%-18s losses %.3g (bound %.3g), dlogits %.3g (bound %.3g)\n",
                   DTYPE_NAMES[d], n, classes, alias ? " (in place)" : "", e_loss, LOSS_BOUND, e_dl, BOUND[d]);
            free(got_loss), free(got_dl), free(ref_loss), free(ref_dl), free(logits), free(labels), free(nan);
            release(d, logits_dev), release(d, labels_dev), release(d, losses_dev);
            if (!alias) release(d, dl_dev);
        }
}

static void test_squared_error(void **state) {
    const int32_t sizes[] = {1, 7, 1000};
    uint64_t rng = 0x73717565ULL;
    for (int d = 0; d < 2; d++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (int alias = 0; alias < 2; alias++) {
                const int32_t n = sizes[si];
                const float scale = 1.0f / (float)n;
                float *pred = random_floats((size_t)n, -3.0f, 3.0f, &rng);
                float *target = random_floats((size_t)n, -3.0f, 3.0f, &rng); /* float32: not rounded */
                void *pred_dev = to_dtype(d, pred, (size_t)n), *dp_dev = alias ? pred_dev : alloc_dtype(d, (size_t)n);
                float *target_dev = to_f32(d, target, (size_t)n);
                float *nan = malloc((size_t)n * sizeof(float));
                for (int32_t i = 0; i < n; i++) nan[i] = NAN;
                float *losses_dev = to_f32(d, nan, (size_t)n);
                if (!alias) poison(d, dp_dev, (size_t)n);
                float *ref_loss = malloc((size_t)n * sizeof(float)), *ref_dp = malloc((size_t)n * sizeof(float));
                assert_nopad_ok(cpu->squared_error(cpu, ref_loss, ref_dp, pred, target, n, scale));
                assert_nopad_ok(gpu[d]->squared_error(gpu[d], losses_dev, dp_dev, pred_dev, target_dev, n, scale));
                float *got_loss = get_f32(d, losses_dev, (size_t)n), *got_dp = get_dtype(d, dp_dev, (size_t)n);
                char what[160];
                snprintf(what, sizeof what, "%s squared_error n %d%s", DTYPE_NAMES[d], n, alias ? " in place" : "");
                double worst_dp = 0;
                for (int32_t i = 0; i < n; i++) {
                    const double rel = fabs((double)got_loss[i] - ref_loss[i]) / fmax(fabs(ref_loss[i]), 1e-30);
                    if (!(rel <= LOSS_BOUND))
                        fail_msg("%s: loss %d = %.9g, the CPU %.9g", what, i, got_loss[i], ref_loss[i]);
                    /* plus fp16's subnormal spacing for gradients near 0 */
                    const double err = fabs((double)got_dp[i] - ref_dp[i]);
                    if (!(err <= ELEMENT_BOUND[d] * fabs(ref_dp[i]) + 1e-7))
                        fail_msg("%s: dpred %d = %.9g, the CPU %.9g", what, i, got_dp[i], ref_dp[i]);
                    worst_dp = max_d(worst_dp, err / fmax(fabs(ref_dp[i]), 1e-30));
                }
                printf("%s squared_error n %4d%s: dpred element error %.3g (bound %.3g)\n", DTYPE_NAMES[d], n,
                       alias ? " in place" : "         ", worst_dp, ELEMENT_BOUND[d]);
                free(pred), free(target), free(nan), free(ref_loss), free(ref_dp), free(got_loss), free(got_dp);
                release(d, pred_dev), release(d, target_dev), release(d, losses_dev);
                if (!alias) release(d, dp_dev);
            }
}

/* ---- a CUDA-graph capture ------------------------------------------------------------------------------ */

/* The tensors of the captured sequence: activation_backward with db, layernorm_backward with all
 * gradients, dropout, cross_entropy. */
typedef struct graph_case {
    int32_t T, H, I, n, classes;
    void *x, *dy_act, *dx_act, *s, *dy_ln, *ds, *w, *drop, *logits, *dlogits;
    float *g32[4], *losses;
    int32_t *labels;
    nopad_seqs seqs;    /* the dropout's sequences (cu_seqlens on the device) */
    float *g32_init[4]; /* host */
} graph_case;

static nopad_status graph_ops(int d, graph_case *g) {
    nopad_backend *be = gpu[d];
    nopad_status st = be->activation_backward(be, g->dx_act, g->g32[0], g->dy_act, g->x, g->T, g->I, NOPAD_ACT_GELU);
    if (st == NOPAD_OK)
        st = be->layernorm_backward(be, g->ds, g->g32[1], g->g32[2], g->g32[3], g->dy_ln, g->s, g->w, 1e-12f, g->T,
                                    g->H);
    if (st == NOPAD_OK) st = be->dropout(be, g->drop, g->ds, NULL, &g->seqs, NULL, g->H, 0.1f, 42, 1000);
    if (st == NOPAD_OK)
        st = be->cross_entropy(be, g->losses, g->dlogits, g->logits, g->labels, g->n, g->classes, 1.0f / g->n);
    return st;
}

/* Everything the sequence writes, downloaded as raw bytes. */
static unsigned char *graph_outputs(int d, graph_case *g, size_t *bytes) {
    const size_t sizes[] = {(size_t)g->T * g->I * 2, (size_t)g->T * g->H * 2, (size_t)g->T * g->H * 2,
                            (size_t)g->n * g->classes * 2, (size_t)g->n * 4, (size_t)g->I * 4,
                            (size_t)g->H * 4, (size_t)g->H * 4, (size_t)g->H * 4};
    const void *ptrs[] = {g->dx_act, g->ds, g->drop, g->dlogits, g->losses, g->g32[0], g->g32[1], g->g32[2], g->g32[3]};
    size_t total = 0;
    for (int k = 0; k < 9; k++) total += sizes[k];
    unsigned char *out = malloc(total), *p = out;
    for (int k = 0; k < 9; k++) {
        assert_nopad_ok(gpu[d]->download(gpu[d], p, ptrs[k], sizes[k]));
        p += sizes[k];
    }
    *bytes = total;
    return out;
}

static void graph_reset(int d, graph_case *g) {
    const int32_t dims[4] = {g->I, g->H, g->H, g->H};
    for (int k = 0; k < 4; k++)
        assert_nopad_ok(gpu[d]->upload(gpu[d], g->g32[k], g->g32_init[k], (size_t)dims[k] * sizeof(float)));
    poison(d, g->dx_act, (size_t)g->T * g->I);
    poison(d, g->ds, (size_t)g->T * g->H);
    poison(d, g->drop, (size_t)g->T * g->H);
    poison(d, g->dlogits, (size_t)g->n * g->classes);
}

static void test_graph_capture(void **state) {
    uint64_t rng = 0x67726170ULL;
    for (int d = 0; d < 2; d++) {
        graph_case g = {.T = 1000, .H = 1024, .I = 4096, .n = 64, .classes = 30522};
        float *h;
        h = random_floats((size_t)g.T * g.I, -3.0f, 3.0f, &rng), g.x = to_dtype(d, h, (size_t)g.T * g.I), free(h);
        h = random_floats((size_t)g.T * g.I, -1.0f, 1.0f, &rng), g.dy_act = to_dtype(d, h, (size_t)g.T * g.I), free(h);
        h = layernorm_input(g.T, g.H, &rng), g.s = to_dtype(d, h, (size_t)g.T * g.H), free(h);
        h = random_floats((size_t)g.T * g.H, -1.0f, 1.0f, &rng), g.dy_ln = to_dtype(d, h, (size_t)g.T * g.H), free(h);
        h = random_floats((size_t)g.H, 0.5f, 1.5f, &rng), g.w = to_dtype(d, h, (size_t)g.H), free(h);
        h = random_floats((size_t)g.n * g.classes, -6.0f, 6.0f, &rng);
        g.logits = to_dtype(d, h, (size_t)g.n * g.classes), free(h);
        g.dx_act = alloc_dtype(d, (size_t)g.T * g.I), g.ds = alloc_dtype(d, (size_t)g.T * g.H);
        g.drop = alloc_dtype(d, (size_t)g.T * g.H), g.dlogits = alloc_dtype(d, (size_t)g.n * g.classes);
        const int32_t dims[4] = {g.I, g.H, g.H, g.H};
        for (int k = 0; k < 4; k++) {
            g.g32_init[k] = random_floats((size_t)dims[k], -1.0f, 1.0f, &rng);
            g.g32[k] = to_f32(d, g.g32_init[k], (size_t)dims[k]);
        }
        int32_t labels[64];
        for (int i = 0; i < g.n; i++) labels[i] = (int32_t)(test_rand_u32(&rng) % (uint32_t)g.classes);
        g.labels = to_i32(d, labels, (size_t)g.n);
        float nan[64];
        for (int i = 0; i < g.n; i++) nan[i] = NAN;
        g.losses = to_f32(d, nan, (size_t)g.n);
        int32_t B, longest;
        int32_t *cu = random_cu_seqlens(g.T, 512, &rng, &B, &longest);
        g.seqs = (nopad_seqs){B, g.T, longest, to_i32(d, cu, (size_t)B + 1)};
        free(cu);

        /* once directly: grows the scratch, gives the expected bits */
        graph_reset(d, &g);
        assert_nopad_ok(graph_ops(d, &g));
        size_t bytes, bytes2;
        unsigned char *direct = graph_outputs(d, &g, &bytes);

        graph_reset(d, &g);
        assert_nopad_ok(gpu[d]->synchronize(gpu[d]));
        cudaStream_t s = streams[d];
        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        const nopad_status st = graph_ops(d, &g);
        assert_int_equal(cudaStreamEndCapture(s, &graph), cudaSuccess);
        assert_nopad_ok(st);
        assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        assert_int_equal(cudaGraphLaunch(exec, s), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        unsigned char *replayed = graph_outputs(d, &g, &bytes2);
        assert_int_equal(bytes, bytes2);
        if (memcmp(direct, replayed, bytes) != 0)
            fail_msg("%s graph replay: the outputs differ from the direct run", DTYPE_NAMES[d]);
        printf("%s graph replay of activation_backward, layernorm_backward, dropout, cross_entropy: the direct "
               "run's bits (%zu bytes)\n", DTYPE_NAMES[d], bytes);
        free(direct), free(replayed);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        void *bufs[] = {g.x,      g.dy_act,  g.dx_act, g.s,      g.dy_ln,  g.ds,
                        g.w,      g.drop,    g.logits, g.dlogits, g.labels, g.losses, (void *)g.seqs.cu_seqlens};
        for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) release(d, bufs[k]);
        for (int k = 0; k < 4; k++) release(d, g.g32[k]), free(g.g32_init[k]);
    }
}

int main(void) {
    if (test_skip_without_gpu()) return 77;
    if (nopad_backend_cpu_create(0, &cpu) != NOPAD_OK) return 1;
    for (int d = 0; d < 2; d++)
        if (cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking) != cudaSuccess ||
            nopad_backend_cuda_create(DTYPES[d], 0, streams[d], &gpu[d]) != NOPAD_OK)
            return 1;
    if (getenv("NOPAD_TEST_FILTER")) cmocka_set_test_filter(getenv("NOPAD_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zero),          cmocka_unit_test(test_activation),
        cmocka_unit_test(test_dropout),       cmocka_unit_test(test_layernorm_backward),
        cmocka_unit_test(test_embed_backward), cmocka_unit_test(test_rows),
        cmocka_unit_test(test_cross_entropy), cmocka_unit_test(test_squared_error),
        cmocka_unit_test(test_graph_capture),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int d = 0; d < 2; d++) {
        gpu[d]->destroy(gpu[d]);
        cudaStreamDestroy(streams[d]);
    }
    cpu->destroy(cpu);
    return rc;
}

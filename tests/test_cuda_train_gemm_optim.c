/* The CUDA backend's gemm_backward, the GELU-fused FFN GEMMs (gemm_act_aux, gemm_dx_act: their
 * own comment below) and optimisers (adamw, lamb, clip_grad_norm) against the CPU backend's ops
 * (the float32 reference).
 *
 * gemm_backward, fp16 and bf16: random data (never zeros), T in {1, 7, 1000, 4096} on BERT-base
 * and BERT-large layer shapes, the MLM decoder (K 1024, N 30522) on T = 300 masked rows, odd
 * shapes (leading dimensions not multiples of 8) and buffers only 2- / 4-byte aligned; each case
 * under every NULL combination of dx / dw32 / db32 and with accumulate_dx off and on; dw32 and
 * db32 start from random non-zero values (they accumulate). Inputs are rounded to the GPU dtype
 * first, so both sides multiply the same numbers. Bounds:
 *   dx: max over rows of ||dx_r - ref_r|| / ||ref_r||, fp16 2e-3 and bf16 1.5e-2: the one output
 *       rounding (fp16 keeps 11 significant bits: at most 4.9e-4 relative an element; bf16 8:
 *       3.9e-3) plus float32 accumulation-order differences (~1e-6), with margin.
 *   dw32, db32: float32 sums of exact products of the rounded inputs on both sides, differing only
 *       in the order of the float32 additions: |got - ref| <= 1e-5 · (|start| + Σ_t |products|)
 *       per element (random-walk rounding over T = 4096 terms is ~64 · 6e-8 = 4e-6 of that).
 * dx is NaN-poisoned before every call without accumulation, so an unwritten element fails.
 *
 * Optimisers: lists of tensors of random sizes (1 element up to 3M, sizes not multiples of the
 * 65536-element chunk or of 4; the tensors of a list packed in one allocation per array, half of
 * them at offsets that are not multiples of 4 elements, so both the float4 and the scalar path
 * run); two steps with fresh gradients, weight decay on every other tensor; LAMB with and without
 * clipping; clip_grad_norm clipping and not; a list of 150 small tensors (more than one launch's
 * table of tensors); and, unless NOPAD_GPU_TEST_QUICK, a list of 328M elements (more than one
 * launch's table of chunks: tensors split across launches), which also prints the time of a step.
 * Float32 on both sides (the CPU in double): every element of p, m, v (and g for clipping) within
 * 1e-6 of the magnitude of the terms its update sums (bound_scales; a float32 evaluation is a few
 * ulps of that: ~3e-7 in a host emulation of the kernels' arithmetic), the gradient norm (written
 * to device memory) within 1e-6 relative; param_compute equal to the GPU's master weights rounded
 * to the dtype, every element (it is NaN-poisoned first). Between the two steps the CPU takes the
 * GPU's state, so each step's error is measured alone.
 * Determinism and graphs: clip_grad_norm + LAMB + AdamW, and gemm_backward (db32 over several row
 * slices), run twice from the same state give the same bits, and so do their recordings in a
 * CUDA graph, replayed (a host synchronisation or an allocation inside would break the capture).
 * No GPU: exit 77 (ctest: skipped). */
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
static const double DX_BOUND[2] = {2e-3, 1.5e-2};
static const double SUM_BOUND = 1e-5; /* dw32, db32 */
static const double OPT_BOUND = 1e-6;

static int quick(void) { return getenv("NOPAD_GPU_TEST_QUICK") != NULL; }

static float *random_floats(size_t n, float lo, float hi, uint64_t *rng) {
    float *x = malloc(n * sizeof(float));
    test_fill_uniform(x, (int64_t)n, lo, hi, rng);
    return x;
}

static float *copy_floats(const float *x, size_t n) {
    float *y = malloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static void poison(nopad_backend *be, void *dev, size_t n) {
    float *nan = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    assert_nopad_ok(be->upload_f32(be, dev, nan, n));
    assert_nopad_ok(be->synchronize(be));
    free(nan);
}

/* ---- gemm_backward ------------------------------------------------------------------------------- */

/* One problem: dy [T, N], x [T, K], w [N, K] and the starting dx0 [T, K], dw0 [N, K], db0 [N]. */
typedef struct grad_problem {
    int d; /* gpu[d] */
    int32_t T, K, N;
    int offset;                            /* elements every device pointer is moved by (0 or 1) */
    float *dy, *x, *w, *dx0, *dw0, *db0;   /* host; dy, x, w, dx0 rounded to the dtype */
    float *ref_dx, *ref_dx_acc, *ref_dw, *ref_db; /* CPU: dy·w, dx0 + dy·w, dw0 + dyᵀ·x, db0 + Σ dy */
    float *scale_dw, *scale_db;            /* |dw0| + |dy|ᵀ·|x|, |db0| + Σ |dy|: the bounds' scales */
    void *base[8];                         /* device allocations */
    void *d_dy, *d_x, *d_w, *d_dx0, *d_dx; /* device, compute dtype */
    float *d_dw, *d_dw0, *d_db;            /* device, float32 */
} grad_problem;

/* A device tensor of n elements of `elem` bytes at `offset` elements into a fresh allocation. */
static void *device_at(grad_problem *p, int slot, size_t n, size_t elem) {
    nopad_backend *be = gpu[p->d];
    assert_nopad_ok(be->alloc(be, (n + (size_t)p->offset) * elem, &p->base[slot]));
    return (char *)p->base[slot] + (size_t)p->offset * elem;
}

/* Uploads host floats into a compute-dtype device tensor and rewrites them rounded. */
static void *to_device_rounded(grad_problem *p, int slot, float *host, size_t n) {
    nopad_backend *be = gpu[p->d];
    void *dev = device_at(p, slot, n, 2);
    assert_nopad_ok(be->upload_f32(be, dev, host, n));
    assert_nopad_ok(be->download_f32(be, host, dev, n));
    return dev;
}

static void problem_make(grad_problem *p, int d, int32_t T, int32_t K, int32_t N, int offset, uint64_t *rng) {
    memset(p, 0, sizeof *p);
    p->d = d, p->T = T, p->K = K, p->N = N, p->offset = offset;
    const size_t TK = (size_t)T * K, TN = (size_t)T * N, NK = (size_t)N * K;
    /* |w| ~ sqrt(3/N): dx of order 1 */
    const float ws = sqrtf(3.0f / (float)N);
    p->dy = random_floats(TN, -1.0f, 1.0f, rng);
    p->x = random_floats(TK, -1.0f, 1.0f, rng);
    p->w = random_floats(NK, -ws, ws, rng);
    p->dx0 = random_floats(TK, -1.0f, 1.0f, rng);
    p->dw0 = random_floats(NK, -1.0f, 1.0f, rng);
    p->db0 = random_floats((size_t)N, -1.0f, 1.0f, rng);
    p->d_dy = to_device_rounded(p, 0, p->dy, TN);
    p->d_x = to_device_rounded(p, 1, p->x, TK);
    p->d_w = to_device_rounded(p, 2, p->w, NK);
    p->d_dx0 = to_device_rounded(p, 3, p->dx0, TK);
    p->d_dx = device_at(p, 4, TK, 2);
    p->d_dw = device_at(p, 5, NK, sizeof(float));
    p->d_dw0 = device_at(p, 6, NK, sizeof(float));
    p->d_db = device_at(p, 7, (size_t)N, sizeof(float));
    nopad_backend *be = gpu[d];
    assert_nopad_ok(be->upload(be, p->d_dw0, p->dw0, NK * sizeof(float)));

    /* the CPU reference on the rounded inputs */
    p->ref_dx = malloc(TK * sizeof(float));
    p->ref_dw = copy_floats(p->dw0, NK);
    p->ref_db = copy_floats(p->db0, (size_t)N);
    assert_nopad_ok(cpu->gemm_backward(cpu, p->ref_dx, p->ref_dw, p->ref_db, p->dy, p->x, p->w, T, K, N, 0));
    p->ref_dx_acc = malloc(TK * sizeof(float));
    for (size_t i = 0; i < TK; i++) p->ref_dx_acc[i] = (float)((double)p->dx0[i] + p->ref_dx[i]);
    /* the scales: the same sums over |terms| (the CPU op on |dy|, |x|) */
    float *abs_dy = malloc(TN * sizeof(float)), *abs_x = malloc(TK * sizeof(float));
    for (size_t i = 0; i < TN; i++) abs_dy[i] = fabsf(p->dy[i]);
    for (size_t i = 0; i < TK; i++) abs_x[i] = fabsf(p->x[i]);
    p->scale_dw = malloc(NK * sizeof(float));
    p->scale_db = malloc((size_t)N * sizeof(float));
    for (size_t i = 0; i < NK; i++) p->scale_dw[i] = fabsf(p->dw0[i]);
    for (int32_t n = 0; n < N; n++) p->scale_db[n] = fabsf(p->db0[n]);
    assert_nopad_ok(cpu->gemm_backward(cpu, NULL, p->scale_dw, p->scale_db, abs_dy, abs_x, p->w, T, K, N, 0));
    free(abs_dy), free(abs_x);
}

static void problem_free(grad_problem *p) {
    nopad_backend *be = gpu[p->d];
    for (int i = 0; i < 8; i++) be->free(be, p->base[i]);
    free(p->dy), free(p->x), free(p->w), free(p->dx0), free(p->dw0), free(p->db0);
    free(p->ref_dx), free(p->ref_dx_acc), free(p->ref_dw), free(p->ref_db), free(p->scale_dw), free(p->scale_db);
}

/* max |got - ref| / scale over n elements; fails on a non-finite value. */
static double sum_error(const float *got, const float *ref, const float *scale, size_t n, const char *what,
                        const char *label) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) fail_msg("%s: %s[%zu] = %g", label, what, i, got[i]);
        const double err = fabs((double)got[i] - ref[i]) / (scale[i] > 0 ? scale[i] : 1.0);
        if (err > worst) worst = err;
    }
    return worst;
}

/* One call of the GPU op with the outputs `mask` selects (1 dx, 2 dw32, 4 db32); the errors of
 * those outputs join worst[3] (dx, dw, db). */
static void grad_check(grad_problem *p, int mask, int accumulate, double worst[3]) {
    nopad_backend *be = gpu[p->d];
    const size_t TK = (size_t)p->T * p->K, NK = (size_t)p->N * p->K;
    char label[160];
    snprintf(label, sizeof label, "%s T %d K %d N %d offset %d outputs%s%s%s accumulate %d", DTYPE_NAMES[p->d],
             p->T, p->K, p->N, p->offset, mask & 1 ? " dx" : "", mask & 2 ? " dw32" : "", mask & 4 ? " db32" : "",
             accumulate);
    if (mask & 1) {
        if (accumulate) assert_nopad_ok(be->copy(be, p->d_dx, p->d_dx0, TK * 2));
        else poison(be, p->d_dx, TK);
    }
    if (mask & 2) assert_nopad_ok(be->copy(be, p->d_dw, p->d_dw0, NK * sizeof(float)));
    if (mask & 4) assert_nopad_ok(be->upload(be, p->d_db, p->db0, (size_t)p->N * sizeof(float)));
    assert_nopad_ok(be->gemm_backward(be, mask & 1 ? p->d_dx : NULL, mask & 2 ? p->d_dw : NULL,
                                      mask & 4 ? p->d_db : NULL, p->d_dy, p->d_x, p->d_w, p->T, p->K, p->N,
                                      accumulate));
    assert_nopad_ok(be->synchronize(be));
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    if (mask & 1) {
        float *dx = malloc(TK * sizeof(float));
        assert_nopad_ok(be->download_f32(be, dx, p->d_dx, TK));
        for (size_t i = 0; i < TK; i++)
            if (!isfinite(dx[i])) fail_msg("%s: dx[%zu] = %g (unwritten?)", label, i, dx[i]);
        const double err = test_max_row_rel_error(dx, accumulate ? p->ref_dx_acc : p->ref_dx, p->T, p->K);
        free(dx);
        if (!(err <= DX_BOUND[p->d])) fail_msg("%s: dx row rel err %.3g > %.3g", label, err, DX_BOUND[p->d]);
        if (err > worst[0]) worst[0] = err;
    }
    if (mask & 2) {
        float *dw = malloc(NK * sizeof(float));
        assert_nopad_ok(be->download(be, dw, p->d_dw, NK * sizeof(float)));
        const double err = sum_error(dw, p->ref_dw, p->scale_dw, NK, "dw32", label);
        free(dw);
        if (!(err <= SUM_BOUND)) fail_msg("%s: dw32 err %.3g of the terms' magnitude > %.3g", label, err, SUM_BOUND);
        if (err > worst[1]) worst[1] = err;
    }
    if (mask & 4) {
        float *db = malloc((size_t)p->N * sizeof(float));
        assert_nopad_ok(be->download(be, db, p->d_db, (size_t)p->N * sizeof(float)));
        const double err = sum_error(db, p->ref_db, p->scale_db, (size_t)p->N, "db32", label);
        free(db);
        if (!(err <= SUM_BOUND)) fail_msg("%s: db32 err %.3g of the terms' magnitude > %.3g", label, err, SUM_BOUND);
        if (err > worst[2]) worst[2] = err;
    }
}

/* Every NULL combination (mask 1..7) with accumulation off and on, on one problem. */
static void grad_case(int d, int32_t T, int32_t K, int32_t N, int offset, uint64_t *rng) {
    grad_problem p;
    problem_make(&p, d, T, K, N, offset, rng);
    double worst[3] = {0, 0, 0};
    for (int mask = 1; mask < 8; mask++)
        for (int accumulate = 0; accumulate < 2; accumulate++) {
            if (!(mask & 1) && accumulate) continue; /* accumulate_dx only concerns dx */
            grad_check(&p, mask, accumulate, worst);
        }
    /* all three NULL: nothing to do, and nothing fails */
    assert_nopad_ok(gpu[d]->gemm_backward(gpu[d], NULL, NULL, NULL, p.d_dy, p.d_x, p.d_w, T, K, N, 0));
    printf("%-4s T %4d K %4d N %5d offset %d: dx row rel err %.3g (bound %.3g), dw32 %.3g, db32 %.3g (bound %.0e)\n",
           DTYPE_NAMES[d], T, K, N, offset, worst[0], DX_BOUND[d], worst[1], worst[2], SUM_BOUND);
    problem_free(&p);
}

/* (K, N) of a BERT layer's GEMMs: qkv, FFN in, FFN out; base then large. */
static const int32_t SHAPES[6][2] = {{768, 2304}, {768, 3072}, {3072, 768}, {1024, 3072}, {1024, 4096}, {4096, 1024}};

static void test_gemm_backward_shapes(void **state) {
    (void)state;
    const int32_t Ts[] = {1, 7, 1000, 4096};
    const int n_T = quick() ? 3 : 4;
    uint64_t rng = 0x67726164676d6dULL;
    for (int d = 0; d < 2; d++)
        for (int ti = 0; ti < n_T; ti++)
            for (int si = 0; si < 6; si++) grad_case(d, Ts[ti], SHAPES[si][0], SHAPES[si][1], 0, &rng);
}

/* ---- the FFN's GELU fused into its GEMMs (gemm_act_aux, gemm_dx_act) ----------------------------------- */

/* gemm_act_aux against the CPU's gemm + activation and gemm_dx_act against its gemm_backward +
 * activation_backward, bf16 (the only dtype they fuse), on random inputs rounded to bf16 first:
 * T of 1, 7, 1000 and 4096 rows, BERT-base's and -large's FFN shapes. The pre-activation aux is
 * one bf16 rounding of a float32 sum, gelu(aux) and dx one rounding of float32 arithmetic each:
 * the dx bound of gemm_backward (1.5e-2 row-relative, bf16's 3.9e-3 per element with margin)
 * holds all three; the exact-erf GELU and its derivative in the epilogue are ~5e-7 absolute off
 * erf, far below. Outputs are NaN-poisoned first. Then what they refuse: fp16, an activation
 * other than the exact GELU (the caller runs the unfused ops). */
static void act_fusion_case(int32_t T, int32_t K, int32_t N, uint64_t *rng) {
    nopad_backend *be = gpu[1];
    const size_t TK = (size_t)T * K, TN = (size_t)T * N, NK = (size_t)N * K;
    float *x = random_floats(TK, -1.0f, 1.0f, rng), *w = random_floats(NK, -0.05f, 0.05f, rng);
    float *b = random_floats((size_t)N, -0.5f, 0.5f, rng), *dy = random_floats(TN, -1.0f, 1.0f, rng);
    float *aux_in = random_floats(TK, -3.0f, 3.0f, rng); /* the backward's pre-activation: GELU's curved range */
    void *d_x = test_to_device(be, x, TK), *d_w = test_to_device(be, w, NK), *d_b = test_to_device(be, b, (size_t)N);
    void *d_dy = test_to_device(be, dy, TN), *d_aux_in = test_to_device(be, aux_in, TK);
    void *d_y, *d_aux, *d_dx;
    assert_nopad_ok(be->alloc(be, TN * 2, &d_y));
    assert_nopad_ok(be->alloc(be, TN * 2, &d_aux));
    assert_nopad_ok(be->alloc(be, TK * 2, &d_dx));
    poison(be, d_y, TN), poison(be, d_aux, TN), poison(be, d_dx, TK);
    /* forward: u = x·wᵀ + b, y = gelu(u) */
    assert_nopad_ok(be->gemm_act_aux(be, d_y, d_aux, d_x, d_w, d_b, T, K, N, NOPAD_ACT_GELU));
    float *ref_u = malloc(TN * sizeof(float)), *ref_y = malloc(TN * sizeof(float));
    assert_nopad_ok(cpu->gemm(cpu, ref_u, x, w, b, NULL, T, K, N, NOPAD_EPILOGUE_BIAS, NOPAD_ACT_GELU));
    assert_nopad_ok(cpu->activation(cpu, ref_y, ref_u, T, N, NOPAD_ACT_GELU));
    float *got = malloc((TN > TK ? TN : TK) * sizeof(float));
    assert_nopad_ok(be->download_f32(be, got, d_aux, TN));
    const double err_u = test_max_row_rel_error(got, ref_u, T, N);
    assert_nopad_ok(be->download_f32(be, got, d_y, TN));
    const double err_y = test_max_row_rel_error(got, ref_y, T, N);
    /* backward: dx = (dy·w) ⊙ gelu'(aux_in) */
    assert_nopad_ok(be->gemm_dx_act(be, d_dx, d_dy, d_w, d_aux_in, T, K, N, NOPAD_ACT_GELU));
    float *ref_dx = malloc(TK * sizeof(float));
    assert_nopad_ok(cpu->gemm_backward(cpu, ref_dx, NULL, NULL, dy, NULL, w, T, K, N, 0));
    assert_nopad_ok(cpu->activation_backward(cpu, ref_dx, NULL, ref_dx, aux_in, T, K, NOPAD_ACT_GELU));
    assert_nopad_ok(be->download_f32(be, got, d_dx, TK));
    const double err_dx = test_max_row_rel_error(got, ref_dx, T, K);
    printf("bf16 T %4d K %4d N %4d: gemm_act_aux pre-activation %.3g, gelu %.3g; gemm_dx_act %.3g (bound %.3g)\n", T,
           K, N, err_u, err_y, err_dx, DX_BOUND[1]);
    if (!(err_u <= DX_BOUND[1] && err_y <= DX_BOUND[1] && err_dx <= DX_BOUND[1]))
        fail_msg("T %d K %d N %d: fused GELU GEMMs beyond %.3g", T, K, N, DX_BOUND[1]);
    be->free(be, d_x), be->free(be, d_w), be->free(be, d_b), be->free(be, d_dy), be->free(be, d_aux_in);
    be->free(be, d_y), be->free(be, d_aux), be->free(be, d_dx);
    free(x), free(w), free(b), free(dy), free(aux_in), free(ref_u), free(ref_y), free(ref_dx), free(got);
}

static void test_gemm_act_fusions(void **state) {
    (void)state;
    uint64_t rng = 0x67656c7566757365ULL;
    const int32_t Ts[] = {1, 7, 1000, 4096};
    const int32_t shapes[][2] = {{768, 3072}, {1024, 4096}}; /* the FFN in: K = hidden, N = intermediate */
    for (int ti = 0; ti < 4; ti++)
        for (int si = 0; si < 2; si++) {
            /* forward: K = hidden, N = intermediate; backward of the FFN out: dx over the
             * intermediate (K here), dy over the hidden (N) */
            act_fusion_case(Ts[ti], shapes[si][0], shapes[si][1], &rng);
            act_fusion_case(Ts[ti], shapes[si][1], shapes[si][0], &rng);
        }
    /* refused, not wrong: fp16, another activation, a K that is not a multiple of 8 */
    void *buf;
    assert_nopad_ok(gpu[1]->alloc(gpu[1], 64 * 64 * 2, &buf));
    assert_int_equal(gpu[0]->gemm_act_aux(gpu[0], buf, buf, buf, buf, NULL, 8, 64, 64, NOPAD_ACT_GELU),
                     NOPAD_ERR_UNSUPPORTED);
    assert_int_equal(gpu[1]->gemm_act_aux(gpu[1], buf, buf, buf, buf, NULL, 8, 64, 64, NOPAD_ACT_RELU),
                     NOPAD_ERR_UNSUPPORTED);
    assert_int_equal(gpu[1]->gemm_dx_act(gpu[1], buf, buf, buf, buf, 8, 60, 64, NOPAD_ACT_GELU),
                     NOPAD_ERR_UNSUPPORTED);
    assert_int_equal(gpu[1]->gemm_dx_act(gpu[1], buf, buf, buf, buf, 8, 64, 64, NOPAD_ACT_GELU_TANH),
                     NOPAD_ERR_UNSUPPORTED);
    gpu[1]->free(gpu[1], buf);
}

/* The MLM decoder: the masked rows (~15% of a batch) against the 30522-word vocabulary. */
static void test_gemm_backward_decoder(void **state) {
    (void)state;
    uint64_t rng = 0x6d6c6d64656364ULL;
    for (int d = 0; d < 2; d++) grad_case(d, 300, 1024, 30522, 0, &rng);
}

/* Leading dimensions that are not multiples of 8 elements, buffers at one element past an
 * aligned address (fp16 / bf16: 2 bytes; float32: 4 bytes), T of 1 and of several bias slices. */
static void test_gemm_backward_odd(void **state) {
    (void)state;
    const int32_t cases[][3] = {{1, 13, 7}, {13, 100, 37}, {7, 768, 2304}, {1000, 1023, 129}, {300, 64, 30522},
                                {20000, 96, 40}};
    uint64_t rng = 0x6f6464ULL;
    for (int d = 0; d < 2; d++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int offset = 0; offset < 2; offset++)
                grad_case(d, cases[c][0], cases[c][1], cases[c][2], offset, &rng);
}

/* ---- optimisers ------------------------------------------------------------------------------------ */

typedef enum { OPT_ADAMW, OPT_LAMB, OPT_CLIP } opt_kind;
static const char *const OPT_NAMES[3] = {"adamw", "lamb", "clip_grad_norm"};

/* A list of tensors, each array of the list packed in one allocation: tensor k at elements
 * [offset[k], offset[k] + size[k]); even k at a multiple of 4, odd k one past it. */
typedef struct opt_list {
    int d;
    int32_t n;
    int64_t *size, *offset, total;
    float *wd;
    float *p, *g, *m, *v;       /* host, the CPU's state [total] */
    float *dp, *dg, *dm, *dv;   /* device float32 [total] */
    void *dpc;                  /* device compute dtype [total] */
    nopad_opt_tensor *host_list, *dev_list;
} opt_list;

static void list_make(opt_list *l, int d, const int64_t *sizes, int32_t n, uint64_t *rng) {
    memset(l, 0, sizeof *l);
    l->d = d, l->n = n;
    l->size = malloc((size_t)n * sizeof(int64_t));
    l->offset = malloc((size_t)n * sizeof(int64_t));
    l->wd = malloc((size_t)n * sizeof(float));
    int64_t cursor = 0;
    for (int32_t k = 0; k < n; k++) {
        cursor = (cursor + 3) / 4 * 4 + (k & 1);
        l->size[k] = sizes[k];
        l->offset[k] = cursor;
        l->wd[k] = k % 2 == 0 ? 0.01f : 0.0f; /* decay on every other tensor */
        cursor += sizes[k];
    }
    l->total = cursor;
    const size_t bytes = (size_t)l->total * sizeof(float);
    /* zeros in the gaps between tensors, which no op touches */
    l->p = calloc((size_t)l->total, sizeof(float)), l->g = calloc((size_t)l->total, sizeof(float));
    l->m = calloc((size_t)l->total, sizeof(float));
    l->v = calloc((size_t)l->total, sizeof(float));
    /* weights of several magnitudes per tensor, as trained layers have */
    for (int32_t k = 0; k < n; k++) {
        const float scale = k % 3 == 0 ? 1.0f : k % 3 == 1 ? 0.05f : 0.002f;
        test_fill_uniform(l->p + l->offset[k], l->size[k], -scale, scale, rng);
    }
    nopad_backend *be = gpu[d];
    assert_nopad_ok(be->alloc(be, bytes, (void **)&l->dp));
    assert_nopad_ok(be->alloc(be, bytes, (void **)&l->dg));
    assert_nopad_ok(be->alloc(be, bytes, (void **)&l->dm));
    assert_nopad_ok(be->alloc(be, bytes, (void **)&l->dv));
    assert_nopad_ok(be->alloc(be, (size_t)l->total * 2, &l->dpc));
    assert_nopad_ok(be->upload(be, l->dp, l->p, bytes));
    assert_nopad_ok(be->upload(be, l->dm, l->m, bytes));
    assert_nopad_ok(be->upload(be, l->dv, l->v, bytes));
    poison(be, l->dpc, (size_t)l->total);
    l->host_list = calloc((size_t)n, sizeof(nopad_opt_tensor));
    l->dev_list = calloc((size_t)n, sizeof(nopad_opt_tensor));
    for (int32_t k = 0; k < n; k++) {
        const int64_t o = l->offset[k];
        l->host_list[k] = (nopad_opt_tensor){.param = l->p + o, .grad = l->g + o, .m = l->m + o, .v = l->v + o,
                                             .param_compute = NULL, .n = l->size[k], .weight_decay = l->wd[k]};
        l->dev_list[k] = (nopad_opt_tensor){.param = l->dp + o, .grad = l->dg + o, .m = l->dm + o, .v = l->dv + o,
                                            .param_compute = (char *)l->dpc + 2 * o, .n = l->size[k],
                                            .weight_decay = l->wd[k]};
    }
}

static void list_free(opt_list *l) {
    nopad_backend *be = gpu[l->d];
    be->free(be, l->dp), be->free(be, l->dg), be->free(be, l->dm), be->free(be, l->dv), be->free(be, l->dpc);
    free(l->size), free(l->offset), free(l->wd), free(l->p), free(l->g), free(l->m), free(l->v);
    free(l->host_list), free(l->dev_list);
}

/* Fresh gradients on both sides, of a magnitude per tensor. */
static void list_new_gradients(opt_list *l, uint64_t *rng) {
    for (int32_t k = 0; k < l->n; k++) {
        const float scale = k % 4 == 0 ? 1.0f : k % 4 == 1 ? 0.1f : k % 4 == 2 ? 0.01f : 1e-3f;
        test_fill_uniform(l->g + l->offset[k], l->size[k], -scale, scale, rng);
    }
    nopad_backend *be = gpu[l->d];
    assert_nopad_ok(be->upload(be, l->dg, l->g, (size_t)l->total * sizeof(float)));
    assert_nopad_ok(be->synchronize(be));
}

/* max over the list's elements of |gpu - cpu| / scale; fails on a non-finite value; the worst
 * tensor in *where. */
static double state_error(const opt_list *l, const float *dev, const float *cpu_after, const float *scale,
                          const char *what, const char *label, int32_t *where) {
    float *got = malloc((size_t)l->total * sizeof(float));
    nopad_backend *be = gpu[l->d];
    assert_nopad_ok(be->download(be, got, dev, (size_t)l->total * sizeof(float)));
    double worst = 0.0;
    for (int32_t k = 0; k < l->n; k++)
        for (int64_t i = l->offset[k]; i < l->offset[k] + l->size[k]; i++) {
            if (!isfinite(got[i])) fail_msg("%s: %s of tensor %d [%lld] = %g", label, what, k,
                                            (long long)(i - l->offset[k]), got[i]);
            const double err = fabs((double)got[i] - cpu_after[i]) / (scale[i] > 0 ? scale[i] : 1e-30);
            if (err > worst) worst = err, *where = k;
        }
    free(got);
    return worst;
}

/* The scales of the bounds: the magnitude of the terms each new value sums, from the state
 * before the step (p0, g0, m0, v0) and the CPU's new moments. A float32 evaluation is within a
 * few ulps of that, not of the value itself: where terms cancel (m = β1·m + (1-β1)·g with g
 * against m, then the update m̂ / (√v̂ + eps) from that m), the result is no more accurate than
 * its terms. p's: |p| + lr·ratio·((β1|m0| + (1-β1)|g|) / bc1 / (√v̂ + eps) + wd·|p|), with g
 * divided by LAMB's clipping divisor and LAMB's trust ratio from the CPU's values. */
static void bound_scales(const opt_list *l, opt_kind kind, const nopad_opt_step *h, float norm, const float *p0,
                         const float *g0, const float *m0, const float *v0, float *sp, float *sm, float *sv) {
    const double b1 = h->beta1, b2 = h->beta2, lr = h->lr, eps = h->eps;
    const double bc1 = 1.0 - pow(b1, (double)h->step), bc2 = 1.0 - pow(b2, (double)h->step);
    const double clip =
        kind == OPT_LAMB && h->max_grad_norm > 0 && norm > h->max_grad_norm ? (double)norm / h->max_grad_norm : 1.0;
    for (int32_t k = 0; k < l->n; k++) {
        const int64_t i0 = l->offset[k], i1 = i0 + l->size[k];
        const double wd = l->wd[k];
        double ratio = 1.0;
        if (kind == OPT_LAMB && wd != 0.0) {
            double p_sq = 0, u_sq = 0;
            for (int64_t i = i0; i < i1; i++) {
                const double u = ((double)l->m[i] / bc1) / (sqrt((double)l->v[i] / bc2) + eps) + wd * p0[i];
                p_sq += (double)p0[i] * p0[i];
                u_sq += u * u;
            }
            if (p_sq > 0 && u_sq > 0) ratio = sqrt(p_sq / u_sq);
        }
        for (int64_t i = i0; i < i1; i++) {
            const double g = g0[i] / clip;
            const double m_terms = b1 * fabs((double)m0[i]) + (1.0 - b1) * fabs(g);
            const double v_terms = b2 * v0[i] + (1.0 - b2) * g * g;
            const double dir_terms = (m_terms / bc1) / (sqrt((double)l->v[i] / bc2) + eps);
            sm[i] = (float)m_terms;
            sv[i] = (float)v_terms;
            sp[i] = (float)(fabs((double)p0[i]) + lr * ratio * (dir_terms + wd * fabs((double)p0[i])));
        }
    }
}

/* param_compute must be the GPU's master weights rounded to the dtype (the backend's own
 * conversion), bit for bit, every element. */
static void check_param_compute(const opt_list *l, const char *label) {
    nopad_backend *be = gpu[l->d];
    const size_t n = (size_t)l->total;
    float *master = malloc(n * sizeof(float)), *compute = malloc(n * sizeof(float)), *rounded = malloc(n * sizeof(float));
    void *tmp;
    assert_nopad_ok(be->download(be, master, l->dp, n * sizeof(float)));
    assert_nopad_ok(be->download_f32(be, compute, l->dpc, n));
    assert_nopad_ok(be->alloc(be, n * 2, &tmp));
    assert_nopad_ok(be->upload_f32(be, tmp, master, n));
    assert_nopad_ok(be->download_f32(be, rounded, tmp, n));
    be->free(be, tmp);
    for (int32_t k = 0; k < l->n; k++)
        for (int64_t i = l->offset[k]; i < l->offset[k] + l->size[k]; i++)
            if (!(compute[i] == rounded[i]))
                fail_msg("%s: param_compute of tensor %d [%lld] = %.9g, the master weight %.9g rounds to %.9g", label,
                         k, (long long)(i - l->offset[k]), compute[i], master[i], rounded[i]);
    free(master), free(compute), free(rounded);
}

/* One step of `kind` on both sides from the same state, then the comparison. bound: max_grad_norm
 * of LAMB, max_norm of clip_grad_norm. */
static void opt_step_check(opt_list *l, opt_kind kind, int64_t step, float bound, const char *list_name) {
    nopad_backend *be = gpu[l->d];
    const size_t n = (size_t)l->total;
    float *p0 = copy_floats(l->p, n), *g0 = copy_floats(l->g, n), *m0 = copy_floats(l->m, n), *v0 = copy_floats(l->v, n);
    const nopad_opt_step h = {.lr = kind == OPT_LAMB ? 4e-3f : 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f,
                              .eps = kind == OPT_LAMB ? 1e-6f : 1e-8f, .max_grad_norm = bound, .step = step};
    float *d_norm;
    assert_nopad_ok(be->alloc(be, sizeof(float), (void **)&d_norm));
    poison(be, d_norm, 1);
    float cpu_norm = NAN, gpu_norm = NAN;
    switch (kind) {
    case OPT_ADAMW:
        assert_nopad_ok(cpu->adamw(cpu, l->host_list, l->n, &h));
        assert_nopad_ok(be->adamw(be, l->dev_list, l->n, &h));
        break;
    case OPT_LAMB:
        assert_nopad_ok(cpu->lamb(cpu, l->host_list, l->n, &h, &cpu_norm));
        assert_nopad_ok(be->lamb(be, l->dev_list, l->n, &h, d_norm));
        break;
    case OPT_CLIP:
        assert_nopad_ok(cpu->clip_grad_norm(cpu, l->host_list, l->n, bound, &cpu_norm));
        assert_nopad_ok(be->clip_grad_norm(be, l->dev_list, l->n, bound, d_norm));
        break;
    }
    assert_nopad_ok(be->synchronize(be));
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    char label[160];
    snprintf(label, sizeof label, "%s %s %s (%d tensors, %lld elements) step %lld bound %g", DTYPE_NAMES[l->d],
             OPT_NAMES[kind], list_name, (int)l->n, (long long)l->total, (long long)step, bound);
    double norm_err = 0.0;
    if (kind != OPT_ADAMW) {
        assert_nopad_ok(be->download(be, &gpu_norm, d_norm, sizeof(float)));
        norm_err = fabs((double)gpu_norm - cpu_norm) / fabs((double)cpu_norm);
        if (!(norm_err <= OPT_BOUND))
            fail_msg("%s: gradient norm %.9g, CPU %.9g: rel err %.3g > %.0e", label, gpu_norm, cpu_norm, norm_err,
                     OPT_BOUND);
    }
    be->free(be, d_norm);
    int32_t wp = -1, wm = -1, wv = -1, wg = -1;
    double ep = 0, em = 0, ev = 0, eg = 0;
    if (kind == OPT_CLIP) {
        for (size_t i = 0; i < n; i++) g0[i] = fabsf(g0[i]); /* the scale: |g| */
        eg = state_error(l, l->dg, l->g, g0, "grad", label, &wg);
    } else {
        float *sp = malloc(n * sizeof(float)), *sm = malloc(n * sizeof(float)), *sv = malloc(n * sizeof(float));
        bound_scales(l, kind, &h, cpu_norm, p0, g0, m0, v0, sp, sm, sv);
        ep = state_error(l, l->dp, l->p, sp, "param", label, &wp);
        em = state_error(l, l->dm, l->m, sm, "m", label, &wm);
        ev = state_error(l, l->dv, l->v, sv, "v", label, &wv);
        free(sp), free(sm), free(sv);
        check_param_compute(l, label);
    }
    printf("%s: errors p %.3g (tensor %d), m %.3g (%d), v %.3g (%d), g %.3g (%d), norm %.3g (%.6g); bound %.0e\n",
           label, ep, wp, em, wm, ev, wv, eg, wg, norm_err, (double)cpu_norm, OPT_BOUND);
    if (!(ep <= OPT_BOUND && em <= OPT_BOUND && ev <= OPT_BOUND && eg <= OPT_BOUND))
        fail_msg("%s: an error above %.0e (see the line above)", label, OPT_BOUND);
    free(p0), free(g0), free(m0), free(v0);
}

/* Both sides continue from the GPU's state where they differ by rounding: the next step then
 * measures that step's error alone. */
static void list_sync_state(opt_list *l) {
    nopad_backend *be = gpu[l->d];
    const size_t bytes = (size_t)l->total * sizeof(float);
    assert_nopad_ok(be->download(be, l->p, l->dp, bytes));
    assert_nopad_ok(be->download(be, l->m, l->dm, bytes));
    assert_nopad_ok(be->download(be, l->v, l->dv, bytes));
    assert_nopad_ok(be->download(be, l->g, l->dg, bytes));
}

/* 20 tensors from 1 element to 3M: sizes around the 65536-element chunk, not multiples of 4. */
static const int64_t SIZES[20] = {1,     3,     4,      5,      7,      2,       17,      768,     1000,    3072,
                                  4095,  20481, 65535,  65536,  65537,  131075,  300001,  1048576, 2359296, 3000001};

static void run_list(int d, const int64_t *sizes, int32_t n, const char *name, int steps, uint64_t *rng) {
    for (int kind = 0; kind < 3; kind++) {
        /* LAMB: clipping by 1 (every list's norm is larger), none (0), a bound above the norm;
         * clip_grad_norm: clipping to 1, a bound above the norm (coefficient >= 1), none (0) */
        const float bounds[3] = {1.0f, 0.0f, 1e9f};
        const int n_bounds = kind == OPT_ADAMW ? 1 : 3;
        for (int b = 0; b < n_bounds; b++) {
            opt_list l;
            list_make(&l, d, sizes, n, rng);
            for (int step = 1; step <= steps; step++) {
                list_new_gradients(&l, rng);
                opt_step_check(&l, (opt_kind)kind, step, bounds[b], name);
                if (step < steps) list_sync_state(&l);
            }
            list_free(&l);
        }
    }
}

static void test_optimisers(void **state) {
    (void)state;
    uint64_t rng = 0x6f7074696dULL;
    for (int d = 0; d < 2; d++) run_list(d, SIZES, 20, "20 tensors", 2, &rng);
}

/* 150 small tensors: more than one launch's table of 96 tensor descriptors. */
static void test_optimisers_many_tensors(void **state) {
    (void)state;
    uint64_t rng = 0x6d616e79ULL;
    int64_t sizes[150];
    for (int k = 0; k < 150; k++) sizes[k] = 1 + test_rand_u32(&rng) % 5000;
    for (int d = 0; d < 2; d++) run_list(d, sizes, 150, "150 tensors", 2, &rng);
}

/* 328M elements (BERT-large has ~340M): more chunks than one launch's table of 4096, so tensors
 * are split between launches; then the time of a step at this size. */
static void test_optimisers_large(void **state) {
    (void)state;
    if (quick()) {
        printf("NOPAD_GPU_TEST_QUICK: the 328M-element list is left out\n");
        return;
    }
    uint64_t rng = 0x6c61726765ULL;
    int64_t sizes[12];
    for (int k = 0; k < 12; k++) sizes[k] = k % 3 == 2 ? 1024 + k : 41000000 + 7 * k;
    const int d = 1; /* bf16 */
    for (int kind = OPT_ADAMW; kind <= OPT_LAMB; kind++) {
        opt_list l;
        list_make(&l, d, sizes, 12, &rng);
        list_new_gradients(&l, &rng);
        opt_step_check(&l, (opt_kind)kind, 1, 1.0f, "large list");
        /* the time of a step (the GPU's state keeps moving; only the time is looked at) */
        nopad_backend *be = gpu[d];
        float *d_norm;
        assert_nopad_ok(be->alloc(be, sizeof(float), (void **)&d_norm));
        const nopad_opt_step h = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-6f, .max_grad_norm = 1.0f,
                                  .step = 2};
        cudaEvent_t start, stop;
        cudaEventCreate(&start), cudaEventCreate(&stop);
        const int reps = 5;
        for (int r = -1; r < reps; r++) {
            if (r == 0) cudaEventRecord(start, streams[d]);
            if (kind == OPT_ADAMW) assert_nopad_ok(be->adamw(be, l.dev_list, l.n, &h));
            else assert_nopad_ok(be->lamb(be, l.dev_list, l.n, &h, d_norm));
        }
        cudaEventRecord(stop, streams[d]);
        assert_int_equal(cudaEventSynchronize(stop), cudaSuccess);
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        ms /= reps;
        /* bytes an element moves: adamw reads p, g, m, v and writes p, m, v, the bf16 copy; lamb
         * also reads g for the norm and p, m, v again in its last pass */
        const double bytes = (double)l.total * (kind == OPT_ADAMW ? 30.0 : 46.0);
        printf("%s on %lld elements: %.3f ms a step, %.0f GB/s\n", OPT_NAMES[kind], (long long)l.total, ms,
               bytes / (ms * 1e-3) / 1e9);
        cudaEventDestroy(start), cudaEventDestroy(stop);
        be->free(be, d_norm);
        list_free(&l);
    }
}

/* ---- determinism and graph capture --------------------------------------------------------------- */

/* The list's device state back to p_init, zero moments and gradients g_init. */
static void list_reset(opt_list *l, const float *p_init, const float *g_init) {
    nopad_backend *be = gpu[l->d];
    const size_t bytes = (size_t)l->total * sizeof(float);
    float *zeros = calloc((size_t)l->total, sizeof(float));
    assert_nopad_ok(be->upload(be, l->dp, p_init, bytes));
    assert_nopad_ok(be->upload(be, l->dg, g_init, bytes));
    assert_nopad_ok(be->upload(be, l->dm, zeros, bytes));
    assert_nopad_ok(be->upload(be, l->dv, zeros, bytes));
    assert_nopad_ok(be->synchronize(be));
    free(zeros);
}

/* clip_grad_norm, then LAMB, then AdamW on the list; the two norms into d_norms[2]. */
static nopad_status optimiser_sequence(opt_list *l, float *d_norms) {
    nopad_backend *be = gpu[l->d];
    const nopad_opt_step lamb_h = {.lr = 4e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-6f, .max_grad_norm = 1.0f,
                                   .step = 1};
    const nopad_opt_step adamw_h = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .step = 2};
    nopad_status st = be->clip_grad_norm(be, l->dev_list, l->n, 5.0f, d_norms);
    if (st == NOPAD_OK) st = be->lamb(be, l->dev_list, l->n, &lamb_h, d_norms + 1);
    if (st == NOPAD_OK) st = be->adamw(be, l->dev_list, l->n, &adamw_h);
    return st;
}

/* The device state of the list and the norms, as bytes: p, m, v, g, param_compute, norms. */
static unsigned char *list_bytes(opt_list *l, const float *d_norms, size_t *n_bytes) {
    nopad_backend *be = gpu[l->d];
    const size_t f = (size_t)l->total * sizeof(float), c = (size_t)l->total * 2;
    unsigned char *out = malloc(4 * f + c + 2 * sizeof(float));
    assert_nopad_ok(be->download(be, out, l->dp, f));
    assert_nopad_ok(be->download(be, out + f, l->dm, f));
    assert_nopad_ok(be->download(be, out + 2 * f, l->dv, f));
    assert_nopad_ok(be->download(be, out + 3 * f, l->dg, f));
    assert_nopad_ok(be->download(be, out + 4 * f, l->dpc, c));
    assert_nopad_ok(be->download(be, out + 4 * f + c, d_norms, 2 * sizeof(float)));
    *n_bytes = 4 * f + c + 2 * sizeof(float);
    return out;
}

/* The same sequence twice from the same state gives the same bits (every reduction has a fixed
 * order), and so does its recording in a CUDA graph, replayed: nothing in it waits for the host
 * or allocates once the scratch has grown. */
static void test_optimisers_deterministic_and_graph(void **state) {
    (void)state;
    uint64_t rng = 0x64657465726dULL;
    for (int d = 0; d < 2; d++) {
        nopad_backend *be = gpu[d];
        opt_list l;
        list_make(&l, d, SIZES, 20, &rng);
        list_new_gradients(&l, &rng);
        float *p_init = copy_floats(l.p, (size_t)l.total), *g_init = copy_floats(l.g, (size_t)l.total);
        float *d_norms;
        assert_nopad_ok(be->alloc(be, 2 * sizeof(float), (void **)&d_norms));
        size_t n1, n2, n3;
        list_reset(&l, p_init, g_init);
        assert_nopad_ok(optimiser_sequence(&l, d_norms));
        unsigned char *first = list_bytes(&l, d_norms, &n1);
        list_reset(&l, p_init, g_init);
        assert_nopad_ok(optimiser_sequence(&l, d_norms));
        unsigned char *second = list_bytes(&l, d_norms, &n2);
        if (n1 != n2 || memcmp(first, second, n1) != 0)
            fail_msg("%s: clip_grad_norm + lamb + adamw twice from the same state: different bits", DTYPE_NAMES[d]);
        /* recorded, then replayed */
        list_reset(&l, p_init, g_init);
        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        assert_int_equal(cudaStreamBeginCapture(streams[d], cudaStreamCaptureModeThreadLocal), cudaSuccess);
        const nopad_status st = optimiser_sequence(&l, d_norms);
        assert_int_equal(cudaStreamEndCapture(streams[d], &graph), cudaSuccess);
        assert_nopad_ok(st);
        assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        assert_int_equal(cudaGraphLaunch(exec, streams[d]), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(streams[d]), cudaSuccess);
        unsigned char *replayed = list_bytes(&l, d_norms, &n3);
        if (n1 != n3 || memcmp(first, replayed, n1) != 0)
            fail_msg("%s: the sequence replayed from a CUDA graph differs from its direct run", DTYPE_NAMES[d]);
        printf("%s: clip_grad_norm + lamb + adamw on 20 tensors: the same bits twice and from a CUDA graph\n",
               DTYPE_NAMES[d]);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        free(first), free(second), free(replayed), free(p_init), free(g_init);
        be->free(be, d_norms);
        list_free(&l);
    }
}

/* gemm_backward twice (dw32 and db32 from the same start, db32 over several row slices) gives
 * the same bits, and so does its recording in a CUDA graph. */
static void test_gemm_backward_deterministic_and_graph(void **state) {
    (void)state;
    uint64_t rng = 0x67726170686dULL;
    for (int d = 0; d < 2; d++) {
        nopad_backend *be = gpu[d];
        grad_problem p;
        problem_make(&p, d, 3000, 256, 1000, 0, &rng);
        const size_t TK = (size_t)p.T * p.K, NK = (size_t)p.N * p.K, N = (size_t)p.N;
        unsigned char *runs[3];
        for (int run = 0; run < 3; run++) {
            assert_nopad_ok(be->copy(be, p.d_dx, p.d_dx0, TK * 2));
            assert_nopad_ok(be->copy(be, p.d_dw, p.d_dw0, NK * sizeof(float)));
            assert_nopad_ok(be->upload(be, p.d_db, p.db0, N * sizeof(float)));
            assert_nopad_ok(be->synchronize(be));
            cudaGraph_t graph = NULL;
            cudaGraphExec_t exec = NULL;
            if (run == 2) assert_int_equal(cudaStreamBeginCapture(streams[d], cudaStreamCaptureModeThreadLocal), cudaSuccess);
            const nopad_status st = be->gemm_backward(be, p.d_dx, p.d_dw, p.d_db, p.d_dy, p.d_x, p.d_w, p.T, p.K, p.N, 1);
            if (run == 2) {
                assert_int_equal(cudaStreamEndCapture(streams[d], &graph), cudaSuccess);
                assert_nopad_ok(st);
                assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
                assert_int_equal(cudaGraphLaunch(exec, streams[d]), cudaSuccess);
            }
            assert_nopad_ok(st);
            assert_nopad_ok(be->synchronize(be));
            runs[run] = malloc(TK * 2 + (NK + N) * sizeof(float));
            assert_nopad_ok(be->download(be, runs[run], p.d_dx, TK * 2));
            assert_nopad_ok(be->download(be, runs[run] + TK * 2, p.d_dw, NK * sizeof(float)));
            assert_nopad_ok(be->download(be, runs[run] + TK * 2 + NK * sizeof(float), p.d_db, N * sizeof(float)));
            if (exec) cudaGraphExecDestroy(exec);
            if (graph) cudaGraphDestroy(graph);
        }
        const size_t bytes = TK * 2 + (NK + N) * sizeof(float);
        if (memcmp(runs[0], runs[1], bytes) != 0) fail_msg("%s: gemm_backward twice: different bits", DTYPE_NAMES[d]);
        if (memcmp(runs[0], runs[2], bytes) != 0)
            fail_msg("%s: gemm_backward replayed from a CUDA graph differs from its direct run", DTYPE_NAMES[d]);
        printf("%s: gemm_backward T %d K %d N %d: the same bits twice and from a CUDA graph\n", DTYPE_NAMES[d], p.T,
               p.K, p.N);
        for (int run = 0; run < 3; run++) free(runs[run]);
        problem_free(&p);
    }
}

/* An empty list: the norm is 0; a list of empty tensors: nothing to do; a NULL gradient: an error. */
static void test_optimisers_edges(void **state) {
    (void)state;
    nopad_backend *be = gpu[0];
    float *d_norm, norm = NAN;
    assert_nopad_ok(be->alloc(be, sizeof(float), (void **)&d_norm));
    const nopad_opt_step h = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-6f, .max_grad_norm = 1.0f, .step = 1};
    poison(be, d_norm, 1);
    assert_nopad_ok(be->lamb(be, NULL, 0, &h, d_norm));
    assert_nopad_ok(be->download(be, &norm, d_norm, sizeof(float)));
    assert_true(norm == 0.0f);
    poison(be, d_norm, 1);
    assert_nopad_ok(be->clip_grad_norm(be, NULL, 0, 1.0f, d_norm));
    assert_nopad_ok(be->download(be, &norm, d_norm, sizeof(float)));
    assert_true(norm == 0.0f);
    assert_nopad_ok(be->adamw(be, NULL, 0, &h));
    nopad_opt_tensor empty = {.n = 0};
    assert_nopad_ok(be->adamw(be, &empty, 1, &h));
    assert_nopad_ok(be->lamb(be, &empty, 1, &h, NULL));
    nopad_opt_tensor no_grad = {.param = d_norm, .m = d_norm, .v = d_norm, .n = 1};
    assert_nopad_error(be->adamw(be, &no_grad, 1, &h), NOPAD_ERR_INVALID_ARGUMENT, "NULL");
    assert_nopad_error(be->clip_grad_norm(be, &no_grad, 1, 1.0f, NULL), NOPAD_ERR_INVALID_ARGUMENT, "NULL");
    assert_nopad_ok(be->synchronize(be));
    be->free(be, d_norm);
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
        cmocka_unit_test(test_gemm_backward_shapes), cmocka_unit_test(test_gemm_backward_decoder),
        cmocka_unit_test(test_gemm_backward_odd),    cmocka_unit_test(test_gemm_act_fusions),
        cmocka_unit_test(test_optimisers),
        cmocka_unit_test(test_optimisers_many_tensors), cmocka_unit_test(test_optimisers_large),
        cmocka_unit_test(test_optimisers_edges), cmocka_unit_test(test_optimisers_deterministic_and_graph),
        cmocka_unit_test(test_gemm_backward_deterministic_and_graph),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int d = 0; d < 2; d++) {
        gpu[d]->destroy(gpu[d]);
        cudaStreamDestroy(streams[d]);
    }
    cpu->destroy(cpu);
    return rc;
}

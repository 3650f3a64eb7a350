/* GPU tests of training's attention ops (attention_lse, attention_backward; kernels in
 * src/backend/cuda/train/attention_backward.cu) against the CPU backend's ops (float32, double
 * accumulation inside).
 *
 * Data: qkv uniform in [-2, 2) and dout in [-1, 1) (never zeros), rounded to the GPU dtype once
 * (test_to_device), so both sides compute on the same numbers; fp16 and bf16; head sizes 32, 64
 * and 128; several heads; causal off and on; lengths random with 1 and the maximum 512 among
 * them, plus lengths on and next to the kernels' 64-key and 32/64-query block edges.
 *
 * Per case:
 *   forward    GPU attention_lse against CPU attention_lse: out and lse.
 *   backward   GPU attention_backward on the CPU forward's out (rounded to the dtype) and lse,
 *              against the CPU backward on the same out and lse: the kernel's own error alone.
 *   chain      GPU backward on the GPU forward's out and lse (what training runs), against the
 *              CPU backward on the same out and lse. Printed beside it, not bounded: the chain
 *              against the CPU's float32 chain (out and lse in float32). That difference carries
 *              the rounding of `out` to the dtype, which reaches dS = P ⊙ (dP - D) through
 *              D = rowsum(dout ⊙ out) (FlashAttention's backward has it too): ~1e-2 row-relative
 *              in fp16 on dq rows of small norm (early causal queries), measured in a lane-level
 *              emulation of the kernel; the torch check bounds it against torch's own error.
 *
 * Bounds. lse: |gpu - cpu| <= 2e-5 (absolute; nats). Both sides exponentiate the same rounded
 * scores; the GPU's only errors are float32 ones: the q·k dot products (tensor-core fp32
 * accumulation over d <= 128 products of magnitude <= 4, about 1e-6 before the scale), ex2.approx
 * (2 ulp) and the float32 sum of up to 512 terms (~sqrt(512)·6e-8 relative, ~1.5e-6 in the log):
 * a few 1e-6 in all, |lse| <= ~7 here, so 2e-5 is a margin of ~5.
 * out, dq, dk, dv: max over (token, head) rows of ||gpu - cpu||_2 / max(||cpu||_2, floor), floor =
 * 5% of that tensor's RMS row norm in the case (rows whose exact gradient is 0 or tiny, e.g. dq of
 * a length-1 sequence or of query 0 under causal, where dS = P·(dP - D) cancels exactly: they are
 * judged against the tensor's scale). fp16 2e-3, bf16 2e-2: P and dS are rounded to the dtype
 * before their MMAs (2^-11, 2^-8 relative per element) and every output once more; errors of
 * random sign over many keys add up to about one rounding per row: a lane-level numpy emulation
 * of the backward kernel (ldmatrix and mma.m16n8k16 fragments as PTX defines them, fp16
 * roundings, these lengths and head sizes) gave 4.4e-4 .. 5.3e-4 for dq, dk and dv, 4x under the
 * fp16 bound; bf16's rounding unit is 8x larger, 5x under its bound.
 *
 * Outputs (out, lse, dqkv) are NaN-poisoned before every run and have 8 poisoned guard rows past
 * the end that must stay NaN. Per-case errors are printed for diagnosis from a log.
 *
 * NOPAD_ATTN_BWD_DUMP=DIR writes the chain's inputs and GPU outputs of the `dump` cases as
 * DIR/case_NN.json + DIR/case_NN_<name>.f32 (little-endian float32), which
 * scripts/torch_attention_backward_check.py compares against torch autograd on padded SDPA
 * (float32), bounding the chain's error by the C bounds or twice torch's own in the dtype.
 *
 * Both forwards with lse run every case (NOPAD_FMHA_WGMMA set in turn): wgmma (the inference
 * kernels of attention/wgmma.cu, which attention_lse takes at d = 64 and 128 on Hopper) and mma
 * (attention/mma.cu's mma.sync kernels, d = 32 and the fallback); then every case again, both
 * forwards, with the attention's dropout (p = 0.15) on both sides, the same bounds (the masks are equal bit for bit,
 * so what differs is the arithmetic above). EDGE128_LENGTHS sit on and next to 128-key tiles.
 *
 * NOPAD_ATTN_BWD_BENCH=1: instead of the tests, times attention_lse (both forwards) and
 * attention_backward (the whole op: dsum, the main kernel, dq) on the TRAIN workload's shapes, bf16, lengths
 * U[102, 512]: BERT-large (32 sequences, 16 heads x 64) and BERT-base (64 sequences, 12 x 64), then
 * BERT-large's batch at d = 128 (8 heads) and d = 32 (32 heads); the median of 20 CUDA-event timings after 3 warm-up runs, in ms and TFLOP/s (forward 4·Σlen²·d
 * per head, backward 10·Σlen²·d: the five GEMMs' useful work, as FlashAttention counts).
 *
 * No GPU: exit 77 (ctest: skipped). NOPAD_GPU_TEST_D=32|64|128 runs one head size. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cuda_runtime.h>

#include "cuda_testutil.h"

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "testutil.h"
#include "util/knobs.h"

static nopad_backend *cpu;
static nopad_backend *gpu[2];
static const nopad_dtype DTYPES[2] = {NOPAD_DTYPE_F16, NOPAD_DTYPE_BF16};
static const char *const DTYPE_NAMES[2] = {"f16", "bf16"};
static const double BOUND[2] = {2e-3, 2e-2};
static const double LSE_BOUND = 2e-5;
enum { GUARD_ROWS = 8 };

typedef struct {
    int32_t n_seqs, max_len, heads; /* heads at d = 128 is max(1, heads - 1) */
    const int32_t *lengths;         /* fixed lengths, or NULL: random with max_len and 1 first */
    int dump;                       /* written for the torch check when NOPAD_ATTN_BWD_DUMP is set */
} bwd_case;

static const int32_t EDGE_LENGTHS[] = {64, 65, 63, 128, 129, 33, 32, 2};
static const int32_t EDGE128_LENGTHS[] = {127, 128, 129, 255, 256, 257, 16, 17, 143, 112};
static const bwd_case CASES[] = {
    {5, 512, 3, NULL, 1},             /* 512 (eight 64-key blocks), 1, three random in [1, 512] */
    {24, 100, 2, NULL, 0},            /* many short sequences: most blocks cross a sequence's end */
    {8, 129, 2, EDGE_LENGTHS, 1},     /* on and next to the block edges */
    {10, 257, 2, EDGE128_LENGTHS, 0}, /* 128-key blocks, 16-key warps past the end */
};

/* the forwards with lse: NOPAD_FMHA_WGMMA 0 and 1; then both again with the attention's dropout
 * (p = 0.15: the forwards' and the backward's DROPOUT kernels), the CPU ops applying the same mask */
enum { N_VARIANTS = 4, VARIANT_DROPOUT = 2 };
static const char *const VARIANTS[N_VARIANTS] = {"mma", "wgmma", "dropout-mma", "dropout-wgmma"};
static const nopad_attention_dropout DROPOUT = {0.15f, 0x0123456789ABCDEFull, 7, NULL}; /* examples: each case's */
static const nopad_attention_dropout *drop; /* the variant's: NULL or &DROPOUT */
static int variant;

static int32_t *make_cu_seqlens(const bwd_case *c, uint64_t *rng) {
    int32_t *cu = malloc((size_t)(c->n_seqs + 1) * sizeof *cu);
    cu[0] = 0;
    for (int32_t s = 0; s < c->n_seqs; s++) {
        int32_t len;
        if (c->lengths) len = c->lengths[s];
        else if (s == 0) len = c->max_len;
        else if (s == 1) len = 1;
        else len = 1 + (int32_t)(test_rand_u32(rng) % (uint32_t)c->max_len);
        cu[s + 1] = cu[s] + len;
    }
    return cu;
}

/* ---- host helpers ---------------------------------------------------------------------------- */

static void *dev_alloc(nopad_backend *be, size_t bytes) {
    void *p;
    assert_nopad_ok(be->alloc(be, bytes, &p));
    return p;
}

/* n elements of be's dtype set to NaN */
static void poison(nopad_backend *be, void *dev, size_t n) {
    float *nan = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    assert_nopad_ok(be->upload_f32(be, dev, nan, n));
    free(nan);
}

/* n float32 values set to NaN */
static void poison32(nopad_backend *be, float *dev, size_t n) {
    float *nan = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    assert_nopad_ok(be->upload(be, dev, nan, n * sizeof(float)));
    assert_nopad_ok(be->synchronize(be));
    free(nan);
}

static float *download(nopad_backend *be, const void *dev, size_t n) {
    float *h = malloc(n * sizeof(float));
    assert_nopad_ok(be->download_f32(be, h, dev, n));
    return h;
}

static float *download32(nopad_backend *be, const float *dev, size_t n) {
    float *h = malloc(n * sizeof(float));
    assert_nopad_ok(be->download(be, h, dev, n * sizeof(float)));
    return h;
}

/* NaNs in x[0, n) (unwritten) and non-NaNs in x[n, n + guard) (written past the end). */
static void check_written(const char *what, const float *x, int64_t n, int64_t guard, const char *label) {
    int64_t n_nan = 0, n_stray = 0;
    for (int64_t i = 0; i < n; i++) n_nan += isnan(x[i]) ? 1 : 0;
    for (int64_t i = n; i < n + guard; i++) n_stray += isnan(x[i]) ? 0 : 1;
    if (n_nan || n_stray)
        fail_msg("%s %s: %lld NaN (unwritten) elements, %lld written past the end", label, what,
                 (long long)n_nan, (long long)n_stray);
}

/* max over rows r of ||a_r - b_r|| / max(||b_r||, floor), floor = 5% of b's RMS row norm; rows of
 * `cols` elements `stride` apart starting at offset `first`, `rows` of them */
static double row_rel_error(const float *a, const float *b, int64_t rows, int64_t cols, int64_t stride,
                            int64_t first) {
    double sum_sq = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const double v = b[first + r * stride + c];
            sum_sq += v * v;
        }
    const double floor = 0.05 * sqrt(sum_sq / (double)(rows > 0 ? rows : 1)) + 1e-30;
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double num = 0, den = 0;
        for (int64_t c = 0; c < cols; c++) {
            const double x = a[first + r * stride + c], y = b[first + r * stride + c];
            num += (x - y) * (x - y);
            den += y * y;
        }
        const double e = sqrt(num) / fmax(sqrt(den), floor);
        if (!(e <= worst)) worst = e; /* NaN sticks */
    }
    return worst;
}

/* ---- the dump for scripts/torch_attention_backward_check.py ----------------------------------- */

static const char *dump_dir(void) {
    const char *d = getenv("NOPAD_ATTN_BWD_DUMP");
    return d && *d ? d : NULL;
}

static void dump_floats(const char *dir, int id, const char *name, const float *x, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/case_%02d_%s.f32", dir, id, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(x, sizeof(float), n, f) != n) fail_msg("cannot write %s: %s", path, strerror(errno));
    fclose(f);
}

static void dump_case(int id, int dt, int32_t d, int32_t heads, int causal, float scale, const int32_t *cu,
                      int32_t B, const float *qkv, const float *dout, const float *out, const float *lse,
                      const float *dqkv) {
    const char *dir = dump_dir();
    const int64_t T = cu[B], H = (int64_t)heads * d;
    mkdir(dir, 0777);
    dump_floats(dir, id, "qkv", qkv, (size_t)(T * 3 * H));
    dump_floats(dir, id, "dout", dout, (size_t)(T * H));
    dump_floats(dir, id, "out", out, (size_t)(T * H));
    dump_floats(dir, id, "lse", lse, (size_t)(T * heads));
    dump_floats(dir, id, "dqkv", dqkv, (size_t)(T * 3 * H));
    char path[4096];
    snprintf(path, sizeof path, "%s/case_%02d.json", dir, id);
    FILE *f = fopen(path, "w");
    if (!f) fail_msg("cannot write %s: %s", path, strerror(errno));
    fprintf(f, "{\"dtype\": \"%s\", \"head_size\": %d, \"heads\": %d, \"causal\": %d, \"scale\": %.9g, "
               "\"cu_seqlens\": [", DTYPE_NAMES[dt], d, heads, causal, (double)scale);
    for (int32_t s = 0; s <= B; s++) fprintf(f, "%s%d", s ? ", " : "", cu[s]);
    fprintf(f, "]}\n");
    fclose(f);
}

/* ---- one case ---------------------------------------------------------------------------------- */

/* dqkv's q, k and v thirds against the reference (bound <= 0: printed only); returns the worst */
static double compare_dqkv(const char *label, const char *which, const float *got, const float *want, int64_t T,
                           int32_t heads, int32_t d, double bound) {
    const int64_t H = (int64_t)heads * d;
    double e[3];
    for (int p = 0; p < 3; p++) {
        e[p] = 0;
        for (int32_t h = 0; h < heads; h++) {
            const double eh = row_rel_error(got, want, T, d, 3 * H, p * H + (int64_t)h * d);
            if (!(eh <= e[p])) e[p] = eh;
        }
    }
    printf("    %-8s dq %.2e  dk %.2e  dv %.2e%s\n", which, e[0], e[1], e[2], bound > 0 ? "" : "  (not bounded)");
    const char *names[3] = {"dq", "dk", "dv"};
    for (int p = 0; p < 3 && bound > 0; p++)
        if (!(e[p] <= bound)) fail_msg("%s %s: %s row rel err %.3e > %.0e", label, which, names[p], e[p], bound);
    return fmax(e[0], fmax(e[1], e[2]));
}

static void run_case(const bwd_case *c, int case_index, int32_t d, int dt, int causal, uint64_t *rng) {
    static int dump_id = 0;
    nopad_backend *g = gpu[dt];
    int32_t *cu = make_cu_seqlens(c, rng);
    const int32_t B = c->n_seqs, T = cu[B];
    int32_t max_len = 0;
    for (int32_t s = 0; s < B; s++) max_len = cu[s + 1] - cu[s] > max_len ? cu[s + 1] - cu[s] : max_len;
    const int32_t heads = d == 128 && c->heads > 1 ? c->heads - 1 : c->heads;
    const int64_t H = (int64_t)heads * d, n_qkv = (int64_t)T * 3 * H, n_out = (int64_t)T * H,
                  n_lse = (int64_t)T * heads;
    const float scale = 1.0f / sqrtf((float)d);
    char label[160];
    snprintf(label, sizeof label, "[%s] %s d=%d heads=%d case %d (B=%d T=%d max=%d) causal=%d",
             VARIANTS[variant], DTYPE_NAMES[dt], d, heads, case_index, B, T, max_len, causal);
    printf("  %s\n", label);

    /* inputs, rounded to the dtype (the host copies rewritten with the rounded values) */
    float *qkv = malloc((size_t)n_qkv * sizeof(float)), *dout = malloc((size_t)n_out * sizeof(float));
    test_fill_uniform(qkv, n_qkv, -2.0f, 2.0f, rng);
    test_fill_uniform(dout, n_out, -1.0f, 1.0f, rng);
    void *d_qkv = test_to_device(g, qkv, (size_t)n_qkv);
    void *d_dout = test_to_device(g, dout, (size_t)n_out);
    int32_t *d_cu = dev_alloc(g, (size_t)(B + 1) * sizeof(int32_t));
    assert_nopad_ok(g->upload_i32(g, d_cu, cu, (size_t)B + 1));
    const nopad_seqs seqs_cpu = {B, T, max_len, cu}, seqs_gpu = {B, T, max_len, d_cu};
    /* with dropout, each sequence's masks keyed by an example number (every other one past 2³²:
     * its high word in the key), the CPU reading them from the host, the GPU from its copy */
    int64_t *examples = malloc((size_t)B * sizeof *examples);
    for (int32_t s = 0; s < B; s++) examples[s] = 1000 + 37 * (int64_t)s + ((int64_t)(s & 1) << 32);
    int64_t *d_examples = dev_alloc(g, (size_t)B * sizeof *examples);
    assert_nopad_ok(g->upload(g, d_examples, examples, (size_t)B * sizeof *examples));
    nopad_attention_dropout keyed_cpu = {0, 0, 0, NULL}, keyed_gpu = {0, 0, 0, NULL};
    if (drop) {
        keyed_cpu = *drop, keyed_cpu.examples = examples;
        keyed_gpu = *drop, keyed_gpu.examples = d_examples;
    }
    const nopad_attention_dropout *drop_cpu = drop ? &keyed_cpu : NULL, *drop_gpu = drop ? &keyed_gpu : NULL;

    /* CPU forward: out_ref [T, H] float32, lse_ref [T, heads] */
    float *out_ref = malloc((size_t)n_out * sizeof(float)), *lse_ref = malloc((size_t)n_lse * sizeof(float));
    assert_nopad_ok(cpu->attention_lse(cpu, out_ref, lse_ref, qkv, &seqs_cpu, heads, d, scale, causal, drop_cpu));

    /* GPU forward into poisoned out / lse with guard rows */
    void *d_out = dev_alloc(g, (size_t)(n_out + GUARD_ROWS * H) * 2);
    float *d_lse = dev_alloc(g, (size_t)(n_lse + GUARD_ROWS * heads) * sizeof(float));
    poison(g, d_out, (size_t)(n_out + GUARD_ROWS * H));
    poison32(g, d_lse, (size_t)(n_lse + GUARD_ROWS * heads));
    assert_nopad_ok(g->attention_lse(g, d_out, d_lse, d_qkv, &seqs_gpu, heads, d, scale, causal, drop_gpu));
    float *out_gpu = download(g, d_out, (size_t)(n_out + GUARD_ROWS * H));
    float *lse_gpu = download32(g, d_lse, (size_t)(n_lse + GUARD_ROWS * heads));
    check_written("forward out", out_gpu, n_out, GUARD_ROWS * H, label);
    check_written("forward lse", lse_gpu, n_lse, GUARD_ROWS * heads, label);
    double lse_err = 0;
    for (int64_t i = 0; i < n_lse; i++) lse_err = fmax(lse_err, fabs((double)lse_gpu[i] - lse_ref[i]));
    double out_err = 0;
    for (int32_t h = 0; h < heads; h++) out_err = fmax(out_err, row_rel_error(out_gpu, out_ref, T, d, H, (int64_t)h * d));
    printf("    forward  out %.2e  lse %.2e (abs)\n", out_err, lse_err);
    if (!(out_err <= BOUND[dt])) fail_msg("%s: forward out row rel err %.3e > %.0e", label, out_err, BOUND[dt]);
    if (!(lse_err <= LSE_BOUND)) fail_msg("%s: forward lse abs err %.3e > %.0e", label, lse_err, LSE_BOUND);

    /* backward alone: both sides on the CPU forward's out rounded to the dtype, and its lse */
    float *out_r = malloc((size_t)n_out * sizeof(float));
    memcpy(out_r, out_ref, (size_t)n_out * sizeof(float));
    void *d_out_r = test_to_device(g, out_r, (size_t)n_out);
    float *d_lse_ref = dev_alloc(g, (size_t)n_lse * sizeof(float));
    assert_nopad_ok(g->upload(g, d_lse_ref, lse_ref, (size_t)n_lse * sizeof(float)));
    void *d_dqkv = dev_alloc(g, (size_t)(n_qkv + GUARD_ROWS * 3 * H) * 2);
    poison(g, d_dqkv, (size_t)(n_qkv + GUARD_ROWS * 3 * H));
    assert_nopad_ok(g->attention_backward(g, d_dqkv, d_dout, d_qkv, d_out_r, d_lse_ref, &seqs_gpu, heads, d, scale,
                                          causal, drop_gpu));
    float *dqkv_gpu = download(g, d_dqkv, (size_t)(n_qkv + GUARD_ROWS * 3 * H));
    check_written("backward dqkv", dqkv_gpu, n_qkv, GUARD_ROWS * 3 * H, label);
    float *dqkv_ref = malloc((size_t)n_qkv * sizeof(float));
    assert_nopad_ok(cpu->attention_backward(cpu, dqkv_ref, dout, qkv, out_r, lse_ref, &seqs_cpu, heads, d, scale,
                                            causal, drop_cpu));
    compare_dqkv(label, "backward", dqkv_gpu, dqkv_ref, T, heads, d, BOUND[dt]);

    /* the chain: GPU forward then GPU backward, against the CPU backward on the GPU forward's
     * outputs (bounded), and against the float32 CPU chain (printed) */
    poison(g, d_dqkv, (size_t)(n_qkv + GUARD_ROWS * 3 * H));
    assert_nopad_ok(g->attention_backward(g, d_dqkv, d_dout, d_qkv, d_out, d_lse, &seqs_gpu, heads, d, scale,
                                          causal, drop_gpu));
    free(dqkv_gpu);
    dqkv_gpu = download(g, d_dqkv, (size_t)(n_qkv + GUARD_ROWS * 3 * H));
    check_written("chain dqkv", dqkv_gpu, n_qkv, GUARD_ROWS * 3 * H, label);
    assert_nopad_ok(cpu->attention_backward(cpu, dqkv_ref, dout, qkv, out_gpu, lse_gpu, &seqs_cpu, heads, d, scale,
                                            causal, drop_cpu));
    compare_dqkv(label, "chain", dqkv_gpu, dqkv_ref, T, heads, d, BOUND[dt]);
    assert_nopad_ok(cpu->attention_backward(cpu, dqkv_ref, dout, qkv, out_ref, lse_ref, &seqs_cpu, heads, d, scale,
                                            causal, drop_cpu));
    compare_dqkv(label, "vs fp32", dqkv_gpu, dqkv_ref, T, heads, d, 0);

    if (c->dump && dump_dir() && !drop) { /* the torch check has no dropout */
        dump_case(dump_id, dt, d, heads, causal, scale, cu, B, qkv, dout, out_gpu, lse_gpu, dqkv_gpu);
        printf("    dumped as case_%02d\n", dump_id);
        dump_id++;
    }

    g->free(g, d_qkv), g->free(g, d_dout), g->free(g, d_cu), g->free(g, d_out), g->free(g, d_lse);
    g->free(g, d_out_r), g->free(g, d_lse_ref), g->free(g, d_dqkv), g->free(g, d_examples);
    free(qkv), free(dout), free(out_ref), free(examples), free(lse_ref), free(out_gpu), free(lse_gpu), free(out_r);
    free(dqkv_gpu), free(dqkv_ref), free(cu);
}

static int head_size_selected(int32_t d) {
    const char *e = getenv("NOPAD_GPU_TEST_D");
    return !(e && *e) || atoi(e) == d;
}

static void run_grid(int32_t d, int dt, uint64_t seed) {
    if (!head_size_selected(d)) {
        printf("  d=%d skipped (NOPAD_GPU_TEST_D)\n", d);
        return;
    }
    for (variant = 0; variant < N_VARIANTS; variant++) { /* the same data for every variant */
        knob_set_int(KNOB_FMHA_WGMMA, variant & 1);
        drop = variant >= VARIANT_DROPOUT ? &DROPOUT : NULL;
        uint64_t rng = seed;
        for (int i = 0; i < (int)(sizeof CASES / sizeof CASES[0]); i++)
            for (int causal = 0; causal < 2; causal++) run_case(&CASES[i], i, d, dt, causal, &rng);
    }
    knob_set_int(KNOB_FMHA_WGMMA, 1);
    drop = NULL;
}

/* ---- NOPAD_ATTN_BWD_BENCH ------------------------------------------------------------------------ */

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* median ms of `runs` CUDA-event timings of fn on g's stream, after `warmup` untimed runs */
typedef void (*bench_fn)(void *ctx);
static float time_op(nopad_backend *g, bench_fn fn, void *ctx, int warmup, int runs) {
    cudaStream_t st = (cudaStream_t)cuda_backend_stream(g);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    for (int i = 0; i < warmup; i++) fn(ctx);
    assert_nopad_ok(g->synchronize(g));
    float ms[64];
    for (int i = 0; i < runs; i++) {
        cudaEventRecord(e0, st);
        fn(ctx);
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms[i], e0, e1);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    qsort(ms, (size_t)runs, sizeof ms[0], cmp_float);
    return ms[runs / 2];
}

typedef struct {
    nopad_backend *g;
    void *qkv, *dout, *out, *dqkv;
    float *lse;
    nopad_seqs seqs;
    int32_t heads, d;
    float scale;
} bench_ctx;

static void run_fwd(void *p) {
    bench_ctx *c = p;
    assert_nopad_ok(c->g->attention_lse(c->g, c->out, c->lse, c->qkv, &c->seqs, c->heads, c->d, c->scale, 0, drop));
}

static void run_bwd(void *p) {
    bench_ctx *c = p;
    assert_nopad_ok(c->g->attention_backward(c->g, c->dqkv, c->dout, c->qkv, c->out, c->lse, &c->seqs, c->heads, c->d,
                                             c->scale, 0, drop));
}

static void bench_shape(const char *name, int32_t B, int32_t heads, int32_t d, uint64_t seed) {
    nopad_backend *g = gpu[1]; /* bf16 */
    uint64_t rng = seed;
    int32_t *cu = malloc((size_t)(B + 1) * sizeof *cu);
    cu[0] = 0;
    int32_t max_len = 0;
    double sum_sq = 0;
    for (int32_t s = 0; s < B; s++) {
        const int32_t len = 102 + (int32_t)(test_rand_u32(&rng) % 411u); /* U[102, 512] */
        cu[s + 1] = cu[s] + len;
        max_len = len > max_len ? len : max_len;
        sum_sq += (double)len * len;
    }
    const int32_t T = cu[B];
    const int64_t H = (int64_t)heads * d;
    float *qkv = malloc((size_t)T * 3 * H * sizeof(float)), *dout = malloc((size_t)T * H * sizeof(float));
    test_fill_uniform(qkv, T * 3 * H, -2.0f, 2.0f, &rng);
    test_fill_uniform(dout, T * H, -1.0f, 1.0f, &rng);
    bench_ctx c = {g, test_to_device(g, qkv, (size_t)(T * 3 * H)), test_to_device(g, dout, (size_t)(T * H)),
                   dev_alloc(g, (size_t)(T * H) * 2), dev_alloc(g, (size_t)(T * 3 * H) * 2),
                   dev_alloc(g, (size_t)T * heads * sizeof(float)), {B, T, max_len, NULL}, heads, d,
                   1.0f / sqrtf((float)d)};
    int32_t *d_cu = dev_alloc(g, (size_t)(B + 1) * sizeof(int32_t));
    assert_nopad_ok(g->upload_i32(g, d_cu, cu, (size_t)B + 1));
    c.seqs.cu_seqlens = d_cu;
    const double fwd_flop = 4.0 * sum_sq * heads * d, bwd_flop = 2.5 * fwd_flop;
    printf("%s: B=%d T=%d max=%d heads=%d d=%d bf16; forward %.2f GFLOP, backward %.2f GFLOP\n", name, B, T, max_len,
           heads, d, fwd_flop * 1e-9, bwd_flop * 1e-9);
    for (int v = 0; v < N_VARIANTS; v++) {
        knob_set_int(KNOB_FMHA_WGMMA, v & 1);
        drop = v >= VARIANT_DROPOUT ? &DROPOUT : NULL;
        const float f = time_op(g, run_fwd, &c, 3, 20), b = time_op(g, run_bwd, &c, 3, 20);
        printf("  %-13s  forward+lse %7.3f ms %6.1f TFLOP/s   backward %7.3f ms %6.1f TFLOP/s\n", VARIANTS[v], f,
               fwd_flop / (f * 1e-3) * 1e-12, b, bwd_flop / (b * 1e-3) * 1e-12);
    }
    knob_set_int(KNOB_FMHA_WGMMA, 1);
    drop = NULL;
    g->free(g, c.qkv), g->free(g, c.dout), g->free(g, c.out), g->free(g, c.dqkv), g->free(g, c.lse);
    g->free(g, d_cu);
    free(qkv), free(dout), free(cu);
}

static int bench_requested(void) {
    const char *e = getenv("NOPAD_ATTN_BWD_BENCH");
    return e && *e && *e != '0';
}

static void test_f16_d32(void **state) { (void)state, run_grid(32, 0, 0x1234567ull); }
static void test_f16_d64(void **state) { (void)state, run_grid(64, 0, 0x2345678ull); }
static void test_f16_d128(void **state) { (void)state, run_grid(128, 0, 0x3456789ull); }
static void test_bf16_d32(void **state) { (void)state, run_grid(32, 1, 0x456789Aull); }
static void test_bf16_d64(void **state) { (void)state, run_grid(64, 1, 0x56789ABull); }
static void test_bf16_d128(void **state) { (void)state, run_grid(128, 1, 0x6789ABCull); }

/* Head sizes without a kernel are NOPAD_ERR_UNSUPPORTED, before anything is enqueued. */
static void test_unsupported(void **state) {
    (void)state;
    nopad_backend *g = gpu[0];
    void *p = dev_alloc(g, 1 << 16);
    int32_t cu[2] = {0, 4};
    int32_t *d_cu = dev_alloc(g, sizeof cu);
    assert_nopad_ok(g->upload_i32(g, d_cu, cu, 2));
    const nopad_seqs seqs = {1, 4, 4, d_cu};
    assert_nopad_error(g->attention_lse(g, p, p, p, &seqs, 2, 48, 1.0f, 0, NULL), NOPAD_ERR_UNSUPPORTED,
                       "head size 48");
    assert_nopad_error(g->attention_backward(g, p, p, p, p, p, &seqs, 2, 96, 1.0f, 1, NULL), NOPAD_ERR_UNSUPPORTED,
                       "head size 96");
    const nopad_attention_dropout bad_p = {1.0f, 1, 0, NULL}, bad_site = {0.1f, 1, 40000, NULL};
    assert_nopad_error(g->attention_lse(g, p, p, p, &seqs, 2, 64, 1.0f, 0, &bad_p), NOPAD_ERR_INVALID_ARGUMENT,
                       "dropout rate 1");
    assert_nopad_error(g->attention_backward(g, p, p, p, p, p, &seqs, 2, 64, 1.0f, 0, &bad_site),
                       NOPAD_ERR_INVALID_ARGUMENT, "dropout site 40000");
    assert_nopad_ok(g->synchronize(g));
    g->free(g, p), g->free(g, d_cu);
}

int main(void) {
    if (test_skip_without_gpu()) return 77;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    if (nopad_backend_cpu_create(0, &cpu) != NOPAD_OK) return 1;
    for (int dt = 0; dt < 2; dt++)
        if (nopad_backend_cuda_create(DTYPES[dt], 0, NULL, &gpu[dt]) != NOPAD_OK) {
            printf("cannot create the CUDA backend: %s\n", nopad_last_error());
            return 1;
        }
    if (bench_requested()) { /* timings only */
        bench_shape("BERT-large", 32, 16, 64, 0xBE27ull);
        bench_shape("BERT-base", 64, 12, 64, 0xBA5Eull);
        /* the other head sizes the knob switches, on BERT-large's batch */
        bench_shape("d=128", 32, 8, 128, 0xBE27ull);
        bench_shape("d=32", 32, 32, 32, 0xBE27ull);
        for (int dt = 0; dt < 2; dt++) gpu[dt]->destroy(gpu[dt]);
        cpu->destroy(cpu);
        return 0;
    }
    if (dump_dir()) printf("dumping cases for the torch check into %s\n", dump_dir());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unsupported), cmocka_unit_test(test_f16_d64),  cmocka_unit_test(test_f16_d32),
        cmocka_unit_test(test_f16_d128),    cmocka_unit_test(test_bf16_d64), cmocka_unit_test(test_bf16_d32),
        cmocka_unit_test(test_bf16_d128),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    for (int dt = 0; dt < 2; dt++) gpu[dt]->destroy(gpu[dt]);
    cpu->destroy(cpu);
    return failed;
}

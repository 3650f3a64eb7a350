/* The CUDA backend's linear layer and embedding gather on weights kept in a GGUF block format
 * (gemm_q, embed_tokens_q; backend/cuda/quant/), against the CPU's dequantisation
 * (backend/cpu/quant.h, cpu_quant_dequantize) and a double dot product.
 *
 * gemm_q, for each format (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), fp16 and bf16: random
 * blocks with fp16 scales of ordinary size, tiny ones (fp16 exponents 0..3: subnormal to 2.4e-4)
 * and huge ones (2^14 .. 65504), and all-equal blocks (every quant byte and scale the same); T in
 * {1, 2, 3, 8, 9, 33, 130} (the GEMV up to 32 tokens, its 8-token tiles part filled, and the
 * dequantise-then-GEMM path above), N in {1, 7, 17, 577} (odd: the 16-row tiles part filled), K of
 * 1, 2, 3 blocks, a long row (1536 / 2048) and a longer one (6496 / 6400: the staged GEMV's ring
 * of stages wraps); every GEMV call also runs on the weight copied 2 bytes past a 16-byte boundary
 * (the direct kernel, for weights not 16-byte aligned), which must give the same bits as the
 * staged kernel on the aligned copy (both sum the same chunks in the same order); every epilogue (none, bias, bias + each activation,
 * bias + residual) and the float32 output; the prompts' path also in slices of output rows (the
 * scratch cap made small). The activations are rounded to the dtype first (as the GPU sees them)
 * and scaled so that the outputs stay well inside fp16's range.
 *
 * Bound, per output (ref in double from the dequantised weights, M = Σ_k cap_k·|x_k| + |bias|
 * with cap_k = |scale|·max|q| + |min| of k's chunk: the size of what is summed, scale and min
 * parts counted apart as the kernel sums them):
 *   |got - ref| <= u_out·|ref| + 1.25·E·M + 2^-18·|pre-activation| + floor
 * - u_out, the output's rounding: 2^-11 (fp16), 2^-8 (bf16), 0 (float32);
 * - E, the sums: the GEMV's products q·x are exact and its fp32 sums over a chunk, the chunk
 *   scales and the sums over chunks and warps (at most K/256 + 8 + 2 additions at K = 2048) lose
 *   at most ~2^-23 each: 2^-17 bounds them with a factor > 2 to spare. The prompts' path first
 *   rounds every weight to the dtype: E = 2^-17 + u_dtype (2^-11, 2^-8);
 * - 1.25: the activations' slopes (|GELU'|, |SiLU'| <= 1.13, tanh and ReLU <= 1); 2^-18 their
 *   own float error;
 * - floor: half fp16's smallest subnormal (2^-25) for fp16 outputs, else 0.
 * A misread layout misplaces runs of values, each moving an output by far more than this bound.
 * Outputs are NaN-poisoned before each call, so an unwritten element fails.
 * The prompts' path in fp16 cannot hold weights beyond 65504 (the same limit as dequantising at
 * load, --weights f16): the huge scales run there in bf16 only.
 *
 * embed_tokens_q: each format, rows of 1 and 3 (super-)blocks; held ids, another rank's ids
 * (0 + position), fed ids (negative tokens read feed), a bad id and a bad position (NaN rows), with
 * and without a position table; equal to the host's float32 dequantised row + the rounded position
 * row, bit for bit (scale·q is exact in float and each value is rounded once, as on the CPU).
 *
 * SmolLM2 (NOPAD_SMOLLM2_GGUF, else skipped): loaded with --weights native and f16 on CUDA, three
 * prompts; all-position logits of one packed prompt step within the fp16 bound of
 * test_cuda_decoder (max row relative error 2e-2: both compute in fp16, the f16 copy adds its
 * weights' rounding); 32 greedy tokens each, printed with the first step where they part (a near
 * tie may part them; the logits bound is what fails the test); the weights' device bytes, native
 * within 10% of the file's size.
 * No GPU: exit 77 (ctest: skipped). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "cuda_testutil.h"

#include "backend/backend.h"
#include "backend/cpu/quant.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/quant/quant_gemm.h"
#include "nopad.h"

static nopad_backend *gpu[2];
static const nopad_dtype DTYPES[2] = {NOPAD_DTYPE_F16, NOPAD_DTYPE_BF16};
static const char *const DTYPE_NAMES[2] = {"f16", "bf16"};
static const double U_DTYPE[2] = {0x1p-11, 0x1p-8};

/* ---- random blocks ------------------------------------------------------------------------- */

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint32_t rnd(void) { return test_rand_u32(&rng); }

/* Uniform in [-1, 1), never 0 (a zero would hide a missing term). */
static float rnd_unit(void) {
    const float v = (float)((int32_t)rnd() >> 8) / 8388608.0f;
    return v != 0.0f ? v : 0.5f;
}

/* An fp16 with exponent field in [e_lo, e_hi] (15 is 1.0), random mantissa, never 0. */
static uint16_t rnd_fp16(int e_lo, int e_hi, int negative) {
    const int e = e_lo + (int)(rnd() % (uint32_t)(e_hi - e_lo + 1));
    int mantissa = (int)(rnd() & 0x3ff);
    if (e == 0 && mantissa == 0) mantissa = 1;
    if (e == 30 && mantissa > 0x3fe) mantissa = 0x3fe; /* <= 65504 */
    return (uint16_t)((negative ? 0x8000 : 0) | e << 10 | mantissa);
}

static double fp16_value(uint16_t h) {
    const int e = h >> 10 & 0x1f, m = h & 0x3ff;
    const double v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
    return h & 0x8000 ? -v : v;
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

typedef struct format_case {
    const char *name;
    nopad_weight_format format;
    int32_t block;
    size_t bytes;
    int d_offset; /* of the fp16 scale d */
    int m_offset; /* of Q4_1's / Q5_1's m or the k-quants' dmin, -1 if none */
    double max_q; /* the largest |q| (times the k-quants' 6-bit scale or Q6_K's int8 one) */
} format_case;

static const format_case FORMATS[] = {
    {"Q4_0", NOPAD_WEIGHT_Q4_0, 32, 18, 0, -1, 8},          {"Q4_1", NOPAD_WEIGHT_Q4_1, 32, 20, 0, 2, 15},
    {"Q5_0", NOPAD_WEIGHT_Q5_0, 32, 22, 0, -1, 16},         {"Q5_1", NOPAD_WEIGHT_Q5_1, 32, 24, 0, 2, 31},
    {"Q8_0", NOPAD_WEIGHT_Q8_0, 32, 34, 0, -1, 128},        {"Q4_K", NOPAD_WEIGHT_Q4_K, 256, 144, 0, 2, 63 * 15},
    {"Q5_K", NOPAD_WEIGHT_Q5_K, 256, 176, 0, 2, 63 * 31},   {"Q6_K", NOPAD_WEIGHT_Q6_K, 256, 210, 208, -1, 128 * 32},
};
enum { N_FORMATS = sizeof FORMATS / sizeof FORMATS[0] };

typedef enum regime { ORDINARY, TINY, HUGE, ALL_EQUAL } regime;
static const char *const REGIME_NAMES[] = {"ordinary", "tiny scales", "huge scales", "all-equal blocks"};

/* n_blocks blocks of f: random bytes, then the scales of the regime (Q4_1's / Q5_1's m of either
 * sign, the k-quants' dmin positive as ggml writes it, Q8_0's d of either sign). ALL_EQUAL: every
 * block the same, each of its quant bytes the same. */
static void random_blocks(const format_case *f, uint8_t *w, int64_t n_blocks, regime r) {
    const int e_lo = r == TINY ? 0 : r == HUGE ? 29 : 9, e_hi = r == TINY ? 3 : r == HUGE ? 30 : 14;
    for (int64_t b = 0; b < n_blocks; b++) {
        uint8_t *p = w + b * (int64_t)f->bytes;
        if (r == ALL_EQUAL && b > 0) {
            memcpy(p, w, f->bytes);
            continue;
        }
        const uint8_t same = (uint8_t)rnd();
        for (size_t i = 0; i < f->bytes; i++) p[i] = r == ALL_EQUAL ? same : (uint8_t)rnd();
        put16(p + f->d_offset, rnd_fp16(e_lo, e_hi, f->format == NOPAD_WEIGHT_Q8_0 && (rnd() & 1)));
        if (f->m_offset >= 0) {
            const int signed_min = f->format == NOPAD_WEIGHT_Q4_1 || f->format == NOPAD_WEIGHT_Q5_1;
            put16(p + f->m_offset, rnd_fp16(e_lo, e_hi, signed_min && (rnd() & 1)));
        }
    }
}

/* The most one value of the block at b can be per unit of activation, its scale and min parts
 * counted apart: |d|·max|q| + |m| (the k-quants' dmin times the largest 6-bit min). */
static double block_cap(const format_case *f, const uint8_t *b) {
    const double d = fabs(fp16_value(get16(b + f->d_offset)));
    const double m = f->m_offset >= 0 ? fabs(fp16_value(get16(b + f->m_offset))) : 0.0;
    return d * f->max_q + (f->block == 256 ? 63 * m : m);
}

/* ---- the reference ------------------------------------------------------------------------- */

static double activate(double v, nopad_activation act) {
    switch (act) {
    case NOPAD_ACT_GELU: return 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
    case NOPAD_ACT_GELU_TANH: return 0.5 * v * (1.0 + tanh(0.79788456080286535588 * (v + 0.044715 * v * v * v)));
    case NOPAD_ACT_RELU: return v > 0.0 ? v : 0.0;
    case NOPAD_ACT_SILU: return v / (1.0 + exp(-v));
    case NOPAD_ACT_TANH: return tanh(v);
    }
    return v;
}
static const nopad_activation ACTS[] = {NOPAD_ACT_GELU, NOPAD_ACT_GELU_TANH, NOPAD_ACT_RELU, NOPAD_ACT_SILU,
                                        NOPAD_ACT_TANH};

/* What one call computes: the four epilogues, or the float32 output. */
enum { EP_NONE, EP_BIAS, EP_BIAS_ACT, EP_BIAS_RESIDUAL, EP_F32, N_EP };
static const char *const EP_NAMES[N_EP] = {"none", "bias", "bias+act", "bias+residual", "f32"};

static void *device_floats(nopad_backend *be, float *host, size_t n) { return test_to_device(be, host, n); }

static void poison(nopad_backend *be, void *dev, size_t n, int f32) {
    float *nan = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    if (f32) assert_nopad_ok(be->upload(be, dev, nan, n * sizeof(float)));
    else assert_nopad_ok(be->upload_f32(be, dev, nan, n));
    assert_nopad_ok(be->synchronize(be));
    free(nan);
}

static int failures;

/* One gemm_q call against the reference; returns the worst |err| / bound. */
static double check_gemm(int di, const format_case *f, regime r, int32_t T, int32_t K, int32_t N, int ep,
                         nopad_activation act) {
    nopad_backend *be = gpu[di];
    const size_t row_bytes = cpu_quant_row_bytes((uint32_t)f->format, K);
    const int64_t n_blocks = (int64_t)N * (K / f->block);
    uint8_t *w = malloc((size_t)N * row_bytes);
    float *wf = malloc((size_t)N * K * sizeof(float)), *caps = malloc((size_t)N * K * sizeof(float));
    float *x = malloc((size_t)T * K * sizeof(float)), *bias = malloc((size_t)N * sizeof(float));
    float *res = malloc((size_t)T * N * sizeof(float)), *got = malloc((size_t)T * N * sizeof(float));
    random_blocks(f, w, n_blocks, r);
    double row_norm = 0.0;
    for (int32_t n = 0; n < N; n++) {
        const uint8_t *row = w + (size_t)n * row_bytes;
        assert_nopad_ok(cpu_quant_dequantize(wf + (size_t)n * K, row, (uint32_t)f->format, K));
        double s = 0.0;
        for (int32_t k = 0; k < K; k++) {
            caps[(size_t)n * K + k] = (float)block_cap(f, row + (size_t)(k / f->block) * f->bytes);
            s += (double)wf[(size_t)n * K + k] * wf[(size_t)n * K + k];
        }
        row_norm = fmax(row_norm, sqrt(s));
    }
    /* outputs of about 40 at most: far inside fp16's range whatever the scales */
    const float x_scale = row_norm > 64.0 ? (float)(64.0 / row_norm) : 1.0f;
    for (int64_t i = 0; i < (int64_t)T * K; i++) x[i] = x_scale * rnd_unit();
    for (int32_t n = 0; n < N; n++) bias[n] = rnd_unit();
    for (int64_t i = 0; i < (int64_t)T * N; i++) res[i] = rnd_unit();
    void *dw, *dout;
    assert_nopad_ok(be->alloc(be, (size_t)N * row_bytes, &dw));
    assert_nopad_ok(be->upload(be, dw, w, (size_t)N * row_bytes));
    void *dx = device_floats(be, x, (size_t)T * K); /* x, bias, res now hold the rounded values */
    void *db = device_floats(be, bias, (size_t)N), *dr = device_floats(be, res, (size_t)T * N);
    const int f32 = ep == EP_F32;
    assert_nopad_ok(be->alloc(be, (size_t)T * N * (f32 ? 4 : 2), &dout));
    poison(be, dout, (size_t)T * N, f32);
    const nopad_epilogue epilogue = ep == EP_BIAS ? NOPAD_EPILOGUE_BIAS
                                    : ep == EP_BIAS_ACT ? NOPAD_EPILOGUE_BIAS_ACT
                                    : ep == EP_BIAS_RESIDUAL ? NOPAD_EPILOGUE_BIAS_RESIDUAL
                                                             : NOPAD_EPILOGUE_NONE;
    assert_nopad_ok(be->gemm_q(be, dout, dx, dw, f->format, db, dr, T, K, N, epilogue, act, f32));
    if (f32) assert_nopad_ok(be->download(be, got, dout, (size_t)T * N * sizeof(float)));
    else assert_nopad_ok(be->download_f32(be, got, dout, (size_t)T * N));
    if (T <= 32) {
        /* the same weight 2 bytes past a 16-byte boundary runs the GEMV's direct kernel (the staged
         * one needs w 16-byte aligned, as the backend allocates it): the same bits */
        void *dw_odd;
        float *got_odd = malloc((size_t)T * N * sizeof(float));
        assert_nopad_ok(be->alloc(be, (size_t)N * row_bytes + 16, &dw_odd));
        assert_nopad_ok(be->upload(be, (char *)dw_odd + 2, w, (size_t)N * row_bytes));
        poison(be, dout, (size_t)T * N, f32);
        assert_nopad_ok(be->gemm_q(be, dout, dx, (char *)dw_odd + 2, f->format, db, dr, T, K, N, epilogue, act, f32));
        if (f32) assert_nopad_ok(be->download(be, got_odd, dout, (size_t)T * N * sizeof(float)));
        else assert_nopad_ok(be->download_f32(be, got_odd, dout, (size_t)T * N));
        if (memcmp(got, got_odd, (size_t)T * N * sizeof(float))) {
            for (int64_t i = 0; i < (int64_t)T * N; i++)
                if (memcmp(&got[i], &got_odd[i], sizeof(float))) {
                    printf("    %s %s %s T %d K %d N %d %s: y[%d, %d] staged %.9g, direct %.9g\n", DTYPE_NAMES[di],
                           f->name, REGIME_NAMES[r], T, K, N, EP_NAMES[ep], (int)(i / N), (int)(i % N), got[i],
                           got_odd[i]);
                    break;
                }
            failures++;
        }
        be->free(be, dw_odd);
        free(got_odd);
    }
    const double u_out = f32 ? 0.0 : U_DTYPE[di];
    const double E = 0x1p-17 + (T > 32 ? U_DTYPE[di] : 0.0);
    const double floor = !f32 && DTYPES[di] == NOPAD_DTYPE_F16 ? 0x1p-25 : 0.0;
    double worst = 0.0;
    for (int32_t t = 0; t < T; t++)
        for (int32_t n = 0; n < N; n++) {
            double dot = 0.0, mag = 0.0;
            const float *xr = x + (size_t)t * K, *wr = wf + (size_t)n * K, *cr = caps + (size_t)n * K;
            for (int32_t k = 0; k < K; k++) {
                dot += (double)wr[k] * xr[k];
                mag += (double)cr[k] * fabs(xr[k]);
            }
            double pre = dot, ref;
            if (ep != EP_NONE && ep != EP_F32) {
                pre += bias[n];
                mag += fabs(bias[n]);
            }
            ref = ep == EP_BIAS_ACT ? activate(pre, act) : pre;
            if (ep == EP_BIAS_RESIDUAL) ref += res[(size_t)t * N + n];
            double bound = u_out * fabs(ref) + 1.25 * E * mag + 0x1p-18 * fabs(pre) + floor;
            if (T > 32) {
                /* the prompts' path runs the ordinary GEMM (test_cuda_gemm bounds it), whose
                 * epilogue may round the product + bias and the residual on their own before their
                 * sum is rounded: up to half an ulp of each more (measured 1.2-1.6x the one-rounding
                 * bound with tiny weights, where the sum is the bias and the residual); fp16
                 * weights below 2^-14 are subnormal, each off by up to 2^-25 whatever its size */
                if (ep == EP_BIAS_RESIDUAL) bound += u_out * (fabs(pre) + fabs(res[(size_t)t * N + n]));
                if (DTYPES[di] == NOPAD_DTYPE_F16)
                    for (int32_t k = 0; k < K; k++) bound += 0x1p-25 * fabs(x[(size_t)t * K + k]);
            }
            const double v = got[(size_t)t * N + n], err = fabs(v - ref);
            /* all-zero rows (huge scales' activations scaled to fp16's smallest values) are exact */
            const double ratio = !isfinite(v) ? INFINITY : err == 0.0 ? 0.0 : err / bound;
            if (!(ratio <= 1.0) && worst <= 1.0)
                printf("    %s %s %s T %d K %d N %d %s: y[%d, %d] = %.9g, want %.9g (|err| %.3g > %.3g)\n",
                       DTYPE_NAMES[di], f->name, REGIME_NAMES[r], T, K, N, EP_NAMES[ep], t, n, v, ref, err, bound);
            if (!(ratio <= worst)) worst = ratio;
        }
    be->free(be, dw);
    be->free(be, dx);
    be->free(be, db);
    be->free(be, dr);
    be->free(be, dout);
    free(w);
    free(wf);
    free(caps);
    free(x);
    free(bias);
    free(res);
    free(got);
    return worst;
}

static const int32_t TOKENS[] = {1, 2, 3, 8, 9, 33, 130};
enum { N_TOKENS = sizeof TOKENS / sizeof TOKENS[0] };

/* (N, K in blocks; 0: the long row; 203 blocks of 32 or 25 super-blocks: the staged GEMV's ring
 * (4 to 8 stages of 512 values) wraps, its last stage part filled) */
static const int32_t SHAPES[][2] = {{1, 1}, {7, 2}, {577, 3}, {7, 0}, {577, 0}, {17, -1}};
enum { N_SHAPES = sizeof SHAPES / sizeof SHAPES[0] };

static void test_gemm_q(void **state) {
    (void)state;
    failures = 0;
    for (int di = 0; di < 2; di++)
        for (int fi = 0; fi < N_FORMATS; fi++) {
            const format_case *f = &FORMATS[fi];
            const int32_t long_k = f->block == 32 ? 1536 : 2048;
            double worst = 0.0;
            int calls = 0;
            for (int ti = 0; ti < N_TOKENS; ti++)
                for (int si = 0; si < N_SHAPES; si++) {
                    const int32_t T = TOKENS[ti], N = SHAPES[si][0];
                    const int32_t K = SHAPES[si][1] > 0 ? SHAPES[si][1] * f->block
                                      : SHAPES[si][1] < 0 ? (f->block == 32 ? 203 * 32 : 25 * 256)
                                                          : long_k;
                    const int ep = (ti + si) % N_EP;
                    const nopad_activation act = ACTS[(ti * N_SHAPES + si) % 5];
                    const double e = check_gemm(di, f, ORDINARY, T, K, N, ep, act);
                    worst = e > worst ? e : worst;
                    calls++;
                }
            /* the other regimes on fewer shapes: the GEMV's part-filled tiles and the prompts' path */
            static const int32_t RT[] = {1, 9, 33};
            for (int ri = TINY; ri <= ALL_EQUAL; ri++)
                for (int ti = 0; ti < 3; ti++) {
                    const int32_t T = RT[ti];
                    if (ri == HUGE && T > 32 && DTYPES[di] == NOPAD_DTYPE_F16) continue; /* see the top */
                    for (int ep = 0; ep < N_EP; ep++) {
                        const int32_t N = ep % 2 ? 577 : 7, K = ep % 2 ? f->block : long_k;
                        const double e = check_gemm(di, f, (regime)ri, T, K, N, ep, ACTS[ep]);
                        worst = e > worst ? e : worst;
                        calls++;
                    }
                }
            /* the prompts' path in slices of rows: a 256 KiB cap cuts 577 rows into 8 or 13 slices, the
             * last one 17 rows or 1 */
            cuda_quant_set_scratch_cap((size_t)256 << 10);
            for (int ep = 0; ep < N_EP; ep++) {
                const double e = check_gemm(di, f, ORDINARY, 33, long_k, 577, ep, ACTS[(ep + fi) % 5]);
                worst = e > worst ? e : worst;
                calls++;
            }
            cuda_quant_set_scratch_cap(0);
            printf("  %-4s %s: %d calls, worst |err| / bound %.3f\n", DTYPE_NAMES[di], f->name, calls, worst);
            if (!(worst <= 1.0)) failures++;
        }
    assert_int_equal(failures, 0);
}

/* supports(GEMM) with a block format: yes for the eight formats on whole blocks, no otherwise;
 * gemm_q refuses the rest with an error. */
static void test_supports(void **state) {
    (void)state;
    nopad_backend *be = gpu[0];
    for (int fi = 0; fi < N_FORMATS; fi++) {
        const format_case *f = &FORMATS[fi];
        assert_true(nopad_backend_runs_format(be, f->format, f->block));
        assert_true(nopad_backend_runs_format(be, f->format, 7 * f->block));
        assert_false(nopad_backend_runs_format(be, f->format, f->block + 16));
        assert_false(nopad_backend_runs_format(be, f->format, 0));
    }
    assert_false(nopad_backend_runs_format(be, (nopad_weight_format)10, 256)); /* Q2_K */
    assert_false(nopad_backend_runs_format(be, (nopad_weight_format)1, 256));  /* F16 */
    void *buf;
    assert_nopad_ok(be->alloc(be, 1 << 16, &buf));
    assert_int_equal(be->gemm_q(be, buf, buf, buf, NOPAD_WEIGHT_Q4_K, NULL, NULL, 1, 96, 1, NOPAD_EPILOGUE_NONE,
                                NOPAD_ACT_GELU, 0),
                     NOPAD_ERR_UNSUPPORTED);
    assert_int_equal(be->gemm_q(be, buf, buf, buf, (nopad_weight_format)10, NULL, NULL, 1, 256, 1,
                                NOPAD_EPILOGUE_NONE, NOPAD_ACT_GELU, 0),
                     NOPAD_ERR_UNSUPPORTED);
    assert_int_equal(be->gemm_q(be, buf, buf, buf, NOPAD_WEIGHT_Q8_0, buf, NULL, 1, 32, 1, NOPAD_EPILOGUE_BIAS,
                                NOPAD_ACT_GELU, 1),
                     NOPAD_ERR_INVALID_ARGUMENT);
    be->free(be, buf);
}

/* ---- embed_tokens_q ------------------------------------------------------------------------ */

static void test_embed_tokens_q(void **state) {
    (void)state;
    enum { V = 37, VOCAB0 = 5, ROWS = 20, P = 9, T = 10 };
    /* held ids, other ranks' (4, 30), fed ids (-1, -2: feed[0], feed[1]), a bad id (40) and a bad
     * position (the last token's 9 with P = 9) */
    const int32_t tokens[T] = {5, 24, 13, 4, 30, -1, -2, 40, 7, 8};
    const int32_t feed[2] = {17, 2}; /* a held id, another rank's */
    const int32_t positions[T] = {0, 1, 2, 3, 4, 5, 6, 7, 8, P};
    failures = 0;
    for (int di = 0; di < 2; di++)
        for (int fi = 0; fi < N_FORMATS; fi++)
            for (int blocks = 1; blocks <= 3; blocks += 2)
                for (int with_pos = 0; with_pos < 2; with_pos++) {
                    nopad_backend *be = gpu[di];
                    const format_case *f = &FORMATS[fi];
                    const int32_t dim = blocks * f->block;
                    const size_t row_bytes = cpu_quant_row_bytes((uint32_t)f->format, dim);
                    uint8_t *word = malloc(ROWS * row_bytes);
                    random_blocks(f, word, (int64_t)ROWS * blocks, fi % 2 ? ORDINARY : TINY);
                    float *pos = malloc((size_t)P * dim * sizeof(float)), *got = malloc((size_t)T * dim * 4);
                    float *row = malloc((size_t)dim * sizeof(float));
                    for (int64_t i = 0; i < (int64_t)P * dim; i++) pos[i] = rnd_unit();
                    void *dword, *dpos = with_pos ? device_floats(be, pos, (size_t)P * dim) : NULL;
                    int32_t *dtok, *dfeed, *dp;
                    float *dout;
                    assert_nopad_ok(be->alloc(be, ROWS * row_bytes, &dword));
                    assert_nopad_ok(be->upload(be, dword, word, ROWS * row_bytes));
                    assert_nopad_ok(be->alloc(be, sizeof tokens, (void **)&dtok));
                    assert_nopad_ok(be->alloc(be, sizeof feed, (void **)&dfeed));
                    assert_nopad_ok(be->alloc(be, sizeof positions, (void **)&dp));
                    assert_nopad_ok(be->alloc(be, (size_t)T * dim * 4, (void **)&dout));
                    assert_nopad_ok(be->upload_i32(be, dtok, tokens, T));
                    assert_nopad_ok(be->upload_i32(be, dfeed, feed, 2));
                    assert_nopad_ok(be->upload_i32(be, dp, positions, T));
                    poison(be, dout, (size_t)T * dim, 1);
                    assert_nopad_ok(be->embed_tokens_q(be, dout, dtok, dfeed, dp, T, V, VOCAB0, ROWS, P, dword,
                                                       f->format, dpos, dim));
                    assert_nopad_ok(be->download(be, got, dout, (size_t)T * dim * 4));
                    int bad_values = 0;
                    for (int t = 0; t < T; t++) {
                        const int32_t id = tokens[t] < 0 ? feed[-1 - tokens[t]] : tokens[t];
                        const int bad = id >= V || (with_pos && positions[t] >= P);
                        const int held = id >= VOCAB0 && id < VOCAB0 + ROWS;
                        if (held && !bad)
                            assert_nopad_ok(cpu_quant_dequantize(row, word + (size_t)(id - VOCAB0) * row_bytes,
                                                                 (uint32_t)f->format, dim));
                        for (int32_t i = 0; i < dim; i++) {
                            float want = held ? row[i] : 0.0f;
                            if (with_pos) want += pos[(size_t)positions[t] * dim + i];
                            const float v = got[(size_t)t * dim + i];
                            const int ok = bad ? isnan(v) : v == want;
                            if (!ok && bad_values++ == 0)
                                printf("    %s %s dim %d pos %d: token %d value %d = %.9g, want %.9g\n",
                                       DTYPE_NAMES[di], f->name, dim, with_pos, t, i, v, bad ? NAN : want);
                        }
                    }
                    if (bad_values) failures++;
                    be->free(be, dword);
                    if (dpos) be->free(be, dpos);
                    be->free(be, dtok);
                    be->free(be, dfeed);
                    be->free(be, dp);
                    be->free(be, dout);
                    free(word);
                    free(pos);
                    free(got);
                    free(row);
                }
    printf("  embed_tokens_q: %d failing cases of %d\n", failures, 2 * N_FORMATS * 2 * 2);
    assert_int_equal(failures, 0);
}

/* ---- SmolLM2 kept quantized ----------------------------------------------------------------- */

static nopad_model *load_cuda(const char *path, nopad_weights weights) {
    nopad_model_params p = nopad_model_default_params();
    p.device = NOPAD_DEVICE_CUDA;
    p.dtype = NOPAD_DTYPE_F16;
    p.weights = weights;
    nopad_model *m = NULL;
    assert_nopad_ok(nopad_model_load(path, &p, &m));
    return m;
}

/* Logits of every position of the prompts, one packed step. */
static float *prompt_logits(nopad_model *m, int32_t B, const int32_t *cu, const int32_t *ids, int32_t V) {
    nopad_context *c = nopad_model_context(m);
    nopad_sequence *seqs[8];
    for (int32_t b = 0; b < B; b++) assert_nopad_ok(nopad_sequence_create(c, &seqs[b]));
    float *logits = malloc((size_t)cu[B] * V * sizeof(float));
    assert_nopad_ok(nopad_decode(c, B, seqs, cu, ids, 1, logits));
    for (int32_t b = 0; b < B; b++) nopad_sequence_free(seqs[b]);
    return logits;
}

static void test_smollm2(void **state) {
    (void)state;
    const char *path = getenv("NOPAD_SMOLLM2_GGUF");
    FILE *file = path ? fopen(path, "rb") : NULL;
    if (!file) {
        printf("  NOPAD_SMOLLM2_GGUF not set: skipped\n");
        skip();
    }
    fseek(file, 0, SEEK_END);
    const long file_bytes = ftell(file);
    fclose(file);
    static const char *const texts[] = {
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
        "The quick brown fox jumps over the lazy dog. It was a bright cold day in April, and the clocks",
    };
    enum { B = 3, NEW = 32 };
    static const nopad_weights WEIGHTS[2] = {NOPAD_WEIGHTS_NATIVE, NOPAD_WEIGHTS_F16};
    static const char *const WEIGHT_NAMES[2] = {"native", "f16"};
    int32_t cu[B + 1] = {0}, ids[1024], out[2][B * NEW], counts[2][B];
    size_t bytes[2];
    float *logits[2];
    int32_t V = 0;
    /* one model at a time: each holds a context and its KV pool */
    for (int k = 0; k < 2; k++) {
        nopad_model *m = load_cuda(path, WEIGHTS[k]);
        nopad_model_info info;
        assert_nopad_ok(nopad_model_get_info(m, &info));
        V = info.vocab_size;
        if (k == 0)
            for (int i = 0; i < B; i++) {
                int32_t n = 0;
                assert_nopad_ok(nopad_tokenize(nopad_model_tokenizer(m), texts[i], strlen(texts[i]), NULL,
                                               ids + cu[i], 1024 - cu[i], &n));
                cu[i + 1] = cu[i] + n;
            }
        size_t work, backend;
        assert_nopad_ok(nopad_model_memory(m, &bytes[k], &work, &backend));
        /* one packed prompt step of cu[B] tokens (> 32: the prompts' path), every position */
        logits[k] = prompt_logits(m, B, cu, ids, V);
        nopad_generate_params gp = nopad_generate_default_params();
        gp.max_tokens = NEW;
        gp.ignore_eos = 1;
        gp.sampling.temperature = 0.0f;
        assert_nopad_ok(nopad_generate(nopad_model_context(m), B, cu, ids, &gp, out[k], counts[k], NULL, NULL));
        printf("  SmolLM2 %-6s: weights on the device %.1f MB (file %.1f MB)\n", WEIGHT_NAMES[k], bytes[k] / 1e6,
               file_bytes / 1e6);
        nopad_model_free(m);
    }
    const double err = test_max_row_rel_error(logits[0], logits[1], cu[B], V);
    printf("  prompt step, T = %d: logits native vs f16, max row rel err %.2e (bound 2e-2)\n", cu[B], err);
    free(logits[0]);
    free(logits[1]);
    for (int i = 0; i < B; i++) {
        int parted = counts[0][i] == counts[1][i] ? -1 : counts[0][i] < counts[1][i] ? counts[0][i] : counts[1][i];
        for (int k = 0; k < counts[0][i] && k < counts[1][i] && parted < 0; k++)
            if (out[0][i * NEW + k] != out[1][i * NEW + k]) parted = k;
        if (parted < 0) printf("  prompt %d: %d greedy ids identical\n", i, NEW);
        else printf("  prompt %d: greedy ids part at step %d of %d\n", i, parted, NEW);
    }
    assert_true(bytes[0] <= 1.1 * (double)file_bytes);
    assert_true(err <= 2e-2);
}

int main(void) {
    if (test_skip_without_gpu()) return 77;
    for (int d = 0; d < 2; d++)
        if (nopad_backend_cuda_create(DTYPES[d], 0, NULL, &gpu[d]) != NOPAD_OK) return 1;
    if (getenv("NOPAD_TEST_FILTER")) cmocka_set_test_filter(getenv("NOPAD_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_supports),
        cmocka_unit_test(test_gemm_q),
        cmocka_unit_test(test_embed_tokens_q),
        cmocka_unit_test(test_smollm2),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int d = 0; d < 2; d++) gpu[d]->destroy(gpu[d]);
    return rc;
}

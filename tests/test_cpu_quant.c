/* The CPU's quantized dot products (backend/cpu/quant.h) on random GGUF blocks of each format:
 * the activations' int8 blocks, one row's dot product on every path this CPU runs (portable,
 * AVX2, AVX2 + VNNI), and the GEMV / GEMM, all against dequantise (io/gguf_dequant, the test's
 * own Q5_K) then a double dot with the float activations; extreme scales, all-equal blocks, the
 * paths bit for bit where every product is exact, the GEMM bit for bit against the one-row dot,
 * the embedding rows' dequantisation, and rows that are not whole blocks. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/quant.h"
#include "io/gguf_dequant.h"

/* ---- random data ---------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

/* Uniform in [-1, 1), never exactly 0 (a zero would hide a missing term). */
static float rnd_unit(void) {
    float v = (float)((int32_t)rnd() >> 8) / 8388608.0f;
    return v != 0.0f ? v : 0.5f;
}

/* An fp16 with exponent field in [e_lo, e_hi] (15 is 1.0), random mantissa, the given sign. */
static uint16_t rnd_fp16(int e_lo, int e_hi, int negative) {
    int e = e_lo + (int)(rnd() % (uint32_t)(e_hi - e_lo + 1));
    int mantissa = (int)(rnd() & 0x3ff);
    if (e == 0 && mantissa == 0) mantissa = 1; /* the smallest subnormal, not zero */
    return (uint16_t)((negative ? 0x8000 : 0) | e << 10 | mantissa);
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

typedef struct format_case {
    const char *name;
    uint32_t type;
    int32_t block;
    size_t bytes;
    int d_offset;  /* of the fp16 scale d in a block */
    int m_offset;  /* of Q4_1's m / the k-quants' dmin, -1 if none */
} format_case;

static const format_case FORMATS[] = {
    {"Q8_0", CPU_QUANT_Q8_0, 32, 34, 0, -1},    {"Q4_0", CPU_QUANT_Q4_0, 32, 18, 0, -1},
    {"Q4_1", CPU_QUANT_Q4_1, 32, 20, 0, 2},     {"Q5_0", CPU_QUANT_Q5_0, 32, 22, 0, -1},
    {"Q5_1", CPU_QUANT_Q5_1, 32, 24, 0, 2},     {"Q4_K", CPU_QUANT_Q4_K, 256, 144, 0, 2},
    {"Q5_K", CPU_QUANT_Q5_K, 256, 176, 0, 2},   {"Q6_K", CPU_QUANT_Q6_K, 256, 210, 208, -1},
};

/* Q4_1's and Q5_1's m may take either sign (the k-quants' dmin is positive as ggml writes it). */
static int signed_min(const format_case *f) {
    return f->type == CPU_QUANT_Q4_1 || f->type == CPU_QUANT_Q5_1;
}

/* n_blocks random blocks: random quant / scale bytes, fp16 scales with exponents in
 * [e_lo, e_hi] (m of either sign, dmin positive: signed_min). */
static void random_blocks(const format_case *f, uint8_t *w, int64_t n_blocks, int e_lo, int e_hi) {
    for (int64_t b = 0; b < n_blocks; b++) {
        uint8_t *p = w + b * (int64_t)f->bytes;
        for (size_t i = 0; i < f->bytes; i++) p[i] = (uint8_t)rnd();
        put16(p + f->d_offset, rnd_fp16(e_lo, e_hi, f->type == CPU_QUANT_Q8_0 && (rnd() & 1)));
        if (f->m_offset >= 0)
            put16(p + f->m_offset, rnd_fp16(e_lo, e_hi, signed_min(f) && (rnd() & 1)));
    }
}

/* ---- the float reference -------------------------------------------------------------------- */

/* ggml's dequantize_row_q5_K (io/gguf_dequant has no Q5_K): block_q5_K, 176 bytes: fp16 d,
 * fp16 dmin, scales[12] (as Q4_K), qh[32], qs[128]; element 64k + l is qs[32k + l]'s low nibble
 * plus 16 · bit 2k of qh[l], element 64k + 32 + l its high nibble plus 16 · bit 2k+1;
 * x = d·sc·q - dmin·m. */
static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | (q[j - 4] >> 6) << 4;
        *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

static void dequant_q5_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 176) {
        const float d = gguf_fp16_to_f32((uint16_t)(b[0] | b[1] << 8));
        const float dmin = gguf_fp16_to_f32((uint16_t)(b[2] | b[3] << 8));
        const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
        for (int k = 0; k < 4; k++, ql += 32) {
            int sc, m;
            scale_min_k4(2 * k, scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            scale_min_k4(2 * k + 1, scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)((ql[l] & 0x0f) + (qh[l] >> (2 * k) & 1) * 16) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] >> (2 * k + 1) & 1) * 16) - m2;
        }
    }
}

static void dequant(const format_case *f, const uint8_t *w, int64_t n, float *out) {
    if (f->type == CPU_QUANT_Q5_K) dequant_q5_k(w, out, n / 256);
    else assert_int_equal(gguf_dequantize(f->type, w, n, out), NOPAD_OK);
}

static double fp16_at(const uint8_t *p) { return gguf_fp16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* The most one element of a block can contribute per unit of |activation|, counting its scale
 * part and its min part apart (both are summed on their own before they meet): |d|·max|q·sc|
 * plus |m| or dmin·63. */
static double block_cap(const format_case *f, const uint8_t *b) {
    const double d = fabs(fp16_at(b + f->d_offset));
    const double m = f->m_offset >= 0 ? fabs(fp16_at(b + f->m_offset)) : 0.0;
    switch (f->type) {
    case CPU_QUANT_Q8_0: return d * 128;
    case CPU_QUANT_Q4_0: return d * 8;
    case CPU_QUANT_Q4_1: return d * 15 + m;
    case CPU_QUANT_Q5_0: return d * 16;
    case CPU_QUANT_Q5_1: return d * 31 + m;
    case CPU_QUANT_Q4_K: return d * 63 * 15 + m * 63;
    case CPU_QUANT_Q5_K: return d * 63 * 31 + m * 63;
    default: return d * 128 * 32;
    }
}

/* The tolerance of one dot product of weight row w (its dequantised values wf) with x[K]:
 *  - the activations' rounding: element i moves by at most d_a/2 = max|x|_block / 254, so the
 *    dot by at most Σ |w_i|·max|x|_block(i) / 254 (times 1 + 1e-6 for the float 1/d_a that
 *    rounds it);
 *  - float rounding: the per-block products (fp16·d_a, int -> float, their product) and the sum
 *    over nb blocks (vector lanes then a horizontal sum on AVX2) each lose at most 2^-24 of
 *    their size; (nb + 8)·2^-22 of M = Σ_blocks cap·Σ|x| bounds them with a factor 4 to spare.
 *    The reference's own roundings (dequantise's "+ m", 2^-24 of cap) fall under the same M. */
static double dot_tolerance(const format_case *f, const uint8_t *w, const float *wf,
                            const float *x, int32_t K) {
    const int32_t act_block = f->block; /* q8 blocks have the weights' block size */
    double quant = 0.0, mag = 0.0;
    for (int32_t b = 0; b < K / act_block; b++) {
        double amax = 0.0, sum_abs = 0.0, w_abs = 0.0;
        for (int32_t i = b * act_block; i < (b + 1) * act_block; i++) {
            amax = fmax(amax, fabs(x[i]));
            sum_abs += fabs(x[i]);
            w_abs += fabs(wf[i]);
        }
        quant += w_abs * amax / 254.0 * (1 + 1e-6);
        mag += block_cap(f, w + (size_t)b * f->bytes) * sum_abs * (1 + 1.0 / 127);
    }
    return quant + (K / f->block + 8) * ldexp(mag, -22);
}

static double dot_double(const float *a, const float *b, int32_t K) {
    double s = 0.0;
    for (int32_t i = 0; i < K; i++) s += (double)a[i] * b[i];
    return s;
}

/* The paths this CPU runs, in isa[0..n): each up to the best. */
static int paths(cpu_quant_isa isa[3]) {
    int n = 0;
    for (int i = CPU_QUANT_PORTABLE; i <= (int)cpu_quant_best_isa(); i++) isa[n++] = (cpu_quant_isa)i;
    return n;
}

static const char *isa_name(cpu_quant_isa isa) {
    return isa == CPU_QUANT_AVX2_VNNI ? "AVX2+VNNI" : isa == CPU_QUANT_AVX2 ? "AVX2" : "portable";
}

/* Random x[K] whose blocks of 32 have magnitudes spread over 2^-4..2^4 (so a block's scale is
 * its own, not the row's), times `scale`. */
static void random_activations(float *x, int32_t K, float scale) {
    for (int32_t b = 0; b < K / 32; b++) {
        const float block_scale = scale * ldexpf(1.0f, (int)(rnd() % 9) - 4);
        for (int32_t i = 32 * b; i < 32 * (b + 1); i++) x[i] = block_scale * rnd_unit();
    }
}

/* One row of each path against the reference; returns the worst error / tolerance. */
static double check_dot(const format_case *f, const uint8_t *w, const float *x, int32_t K,
                        const char *label) {
    float *wf = malloc(sizeof(float) * (size_t)K);
    void *act = malloc(cpu_quant_act_row_bytes(f->type, K));
    assert_non_null(wf);
    assert_non_null(act);
    dequant(f, w, K, wf);
    assert_int_equal(cpu_quant_activations(act, x, f->type, K), NOPAD_OK);
    const double want = dot_double(wf, x, K), tol = dot_tolerance(f, w, wf, x, K);
    double worst = 0.0;
    cpu_quant_isa isa[3];
    for (int p = 0, n = paths(isa); p < n; p++) {
        float got = NAN;
        assert_int_equal(cpu_quant_dot(&got, w, act, f->type, K, isa[p]), NOPAD_OK);
        const double err = fabs(got - want);
        if (!(err <= tol))
            fail_msg("%s %s %s K=%d: %.9g, want %.9g (error %.3g > tolerance %.3g)", f->name,
                     isa_name(isa[p]), label, K, got, want, err, tol);
        worst = fmax(worst, err / tol);
    }
    free(wf);
    free(act);
    return worst;
}

/* ---- the activations ------------------------------------------------------------------------ */

static void test_activation_blocks(void **state) {
    (void)state;
    enum { K = 1024 };
    float x[K];
    random_activations(x, K, 3.0f);
    cpu_q8_block a32[K / 32];
    cpu_q8k_block a256[K / 256];
    assert_int_equal(cpu_quant_activations(a32, x, CPU_QUANT_Q4_0, K), NOPAD_OK);
    assert_int_equal(cpu_quant_activations(a256, x, CPU_QUANT_Q6_K, K), NOPAD_OK);
    for (int32_t i = 0; i < K; i++) {
        /* each element within half a step of its block's scale; the step is max|x| / 127 */
        const cpu_q8_block *b = &a32[i / 32];
        const cpu_q8k_block *bk = &a256[i / 256];
        assert_true(fabs(x[i] - (double)b->d * b->qs[i % 32]) <= b->d * 0.5 * (1 + 1e-6));
        assert_true(fabs(x[i] - (double)bk->d * bk->qs[i % 256]) <= bk->d * 0.5 * (1 + 1e-6));
        assert_true(abs(b->qs[i % 32]) <= 127 && abs(bk->qs[i % 256]) <= 127);
    }
    for (int b = 0; b < K / 32; b++) {
        float amax = 0.0f;
        int sum = 0;
        for (int l = 0; l < 32; l++) {
            amax = fmaxf(amax, fabsf(x[32 * b + l]));
            sum += a32[b].qs[l];
        }
        assert_true(a32[b].d == amax / 127.0f);
        assert_int_equal(a32[b].sum, sum);
    }
    for (int b = 0; b < K / 256; b++)
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += a256[b].qs[16 * g + l];
            assert_int_equal(a256[b].bsums[g], sum);
        }
}

/* Every path's activation blocks byte for byte the portable path's: random rows of mixed block
 * scales, values on the rounding boundaries (k + 1/2 steps, ties to even), a block of zeros, and
 * blocks holding an inf and a NaN (the same -127 / 0 codes and scale on every path). */
static void test_activation_paths(void **state) {
    (void)state;
    enum { K = 1024 };
    cpu_quant_isa isa[3];
    const int n_paths = paths(isa);
    float x[K];
    for (int rep = 0; rep < 40; rep++) {
        random_activations(x, K, rep % 2 ? 1e-3f : 7.0f);
        if (rep % 4 == 0) /* block 1: halfway values of the step max / 127 */
            for (int i = 32; i < 64; i++) x[i] = i == 32 ? 127.0f : (float)((int)(rnd() % 254) - 127) + 0.5f;
        if (rep == 2) {
            for (int i = 64; i < 96; i++) x[i] = 0.0f;
            x[300] = INFINITY;
            x[700] = NAN;
        }
        for (int kind = 0; kind < 2; kind++) {
            const uint32_t type = kind ? CPU_QUANT_Q6_K : CPU_QUANT_Q4_1;
            const size_t bytes = cpu_quant_act_row_bytes(type, K);
            uint8_t want[K / 32 * sizeof(cpu_q8_block) + K / 256 * sizeof(cpu_q8k_block)], got[sizeof want];
            memset(want, 0, sizeof want); /* padding compared too: equal when both start equal */
            memset(got, 0, sizeof got);
            assert_int_equal(cpu_quant_activations_on(want, x, type, K, CPU_QUANT_PORTABLE), NOPAD_OK);
            for (int p = 1; p < n_paths; p++) {
                assert_int_equal(cpu_quant_activations_on(got, x, type, K, isa[p]), NOPAD_OK);
                if (memcmp(want, got, bytes) != 0)
                    fail_msg("%s activations on %s differ from the portable path's (rep %d)",
                             kind ? "256-blocks" : "32-blocks", isa_name(isa[p]), rep);
            }
        }
    }
}

/* ---- one row -------------------------------------------------------------------------------- */

static void test_dot(void **state) {
    const format_case *f = *state;
    const int32_t lengths[] = {f->block, 2 * f->block, 2048, 4096};
    double worst = 0.0;
    for (size_t c = 0; c < sizeof lengths / sizeof lengths[0]; c++) {
        const int32_t K = lengths[c];
        for (int rep = 0; rep < 20; rep++) {
            uint8_t *w = malloc(cpu_quant_row_bytes(f->type, K));
            float *x = malloc(sizeof(float) * (size_t)K);
            assert_non_null(w);
            assert_non_null(x);
            random_blocks(f, w, K / f->block, 5, 12); /* scales 2^-10 .. 2^-2 */
            random_activations(x, K, 1.0f);
            worst = fmax(worst, check_dot(f, w, x, K, "random"));
            free(w);
            free(x);
        }
    }
    printf("%s: worst error / tolerance %.3f\n", f->name, worst);
}

/* The largest and the smallest (subnormal) fp16 scales, with activations from 1e-6 to 1e4: the
 * integer sums and float scaling must neither overflow nor flush to zero. */
static void test_extreme_scales(void **state) {
    const format_case *f = *state;
    enum { K = 512 };
    struct { int e_lo, e_hi; float x_scale; const char *label; } cases[] = {
        {30, 30, 1e-6f, "fp16 scales near 65504, tiny x"},
        {30, 30, 1e2f, "fp16 scales near 65504, large x"},
        {0, 1, 1e4f, "subnormal fp16 scales, large x"},
        {0, 0, 1e-6f, "subnormal fp16 scales, tiny x"},
    };
    uint8_t w[4096];
    float x[K];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        random_blocks(f, w, K / f->block, cases[c].e_lo, cases[c].e_hi);
        random_activations(x, K, cases[c].x_scale);
        check_dot(f, w, x, K, cases[c].label);
    }
}

/* Every quant byte of a block the same and every activation the same: one value repeated, the
 * sums at their largest (all quants at the top for 0xff bytes). */
static void test_all_equal_blocks(void **state) {
    const format_case *f = *state;
    enum { K = 512 };
    const uint8_t fills[] = {0x11, 0x77, 0xff, 0x80};
    uint8_t w[4096];
    float x[K];
    for (size_t c = 0; c < sizeof fills; c++) {
        random_blocks(f, w, K / f->block, 8, 12);
        for (int32_t b = 0; b < K / f->block; b++) { /* keep the fp16 fields, fill the rest */
            uint8_t *p = w + b * f->bytes;
            for (size_t i = 0; i < f->bytes; i++) {
                const int is_d = (int)i >= f->d_offset && (int)i < f->d_offset + 2;
                const int is_m = f->m_offset >= 0 && (int)i >= f->m_offset && (int)i < f->m_offset + 2;
                if (!is_d && !is_m) p[i] = fills[c];
            }
        }
        const float v = (c % 2 ? -1.0f : 1.0f) * (0.25f + 0.5f * fabsf(rnd_unit()));
        for (int32_t i = 0; i < K; i++) x[i] = v;
        check_dot(f, w, x, K, "all-equal blocks");
    }
}

/* Power-of-two scales (weights 2^-4, activations 2^-3) and activations in [-2, 2]: every
 * product and partial sum is a multiple of 2^-7 below 2^17, exact in float, so the two paths'
 * sums agree bit for bit whatever their order: their integer parts must be the same. */
static void test_paths_agree_exactly(void **state) {
    const format_case *f = *state;
    cpu_quant_isa isa[3];
    const int n_paths = paths(isa);
    if (n_paths < 2) {
        printf("%s: this CPU has no AVX2 + FMA + F16C, the AVX2 path is not compared\n", f->name);
        return;
    }
    enum { K = 512 };
    uint8_t w[4096];
    cpu_q8_block a32[K / 32];
    cpu_q8k_block a256[K / 256];
    for (int rep = 0; rep < 50; rep++) {
        random_blocks(f, w, K / f->block, 11, 11);
        for (int32_t b = 0; b < K / f->block; b++) {
            uint8_t *p = w + b * f->bytes;
            put16(p + f->d_offset, (uint16_t)((rnd() & 1 ? 0x8000 : 0) | 11 << 10));
            if (f->m_offset >= 0)
                put16(p + f->m_offset, (uint16_t)((signed_min(f) && rnd() & 1 ? 0x8000 : 0) | 11 << 10));
        }
        for (int b = 0; b < K / 32; b++) {
            a32[b].d = 0.125f;
            a32[b].sum = 0;
            for (int l = 0; l < 32; l++) a32[b].sum += a32[b].qs[l] = (int8_t)((int)(rnd() % 5) - 2);
        }
        for (int b = 0; b < K / 256; b++) {
            a256[b].d = 0.125f;
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int l = 0; l < 16; l++) s += a256[b].qs[16 * g + l] = (int8_t)((int)(rnd() % 5) - 2);
                a256[b].bsums[g] = (int16_t)s;
            }
        }
        const void *act = f->block == 256 ? (const void *)a256 : (const void *)a32;
        float portable = NAN;
        assert_int_equal(cpu_quant_dot(&portable, w, act, f->type, K, CPU_QUANT_PORTABLE), NOPAD_OK);
        for (int p = 1; p < n_paths; p++) {
            float other = NAN;
            assert_int_equal(cpu_quant_dot(&other, w, act, f->type, K, isa[p]), NOPAD_OK);
            if (memcmp(&portable, &other, sizeof(float)) != 0)
                fail_msg("%s: portable %.9g, %s %.9g on exact data", f->name, portable, isa_name(isa[p]), other);
        }
    }
}

/* ---- GEMV / GEMM ---------------------------------------------------------------------------- */

/* y[T, N] = x · Wᵀ on every path against the reference element by element: T = 1, 7, 31
 * (decode), 45 and 133 (prefill: over the GEMM's chunks of 64 tokens, not a multiple of its tiles
 * of 4 tokens), N = 37 and 101 (odd: over tiles of 16 rows, not a multiple of the 2- and 4-row
 * tiles), 1 and 2 threads. The int8 GEMM (below cpu_quant_sgemm_tokens: 32 on the portable path,
 * 128 for the k-quants on x86, every T for the blocks of 32 on x86) within the dot's tolerance and
 * bit for bit against the one-row dot on the same path (the same blocks, the same sums): a row's
 * result does not depend on how many tokens share its step. AVX2's and VNNI's bit for bit with
 * each other. From cpu_quant_sgemm_tokens on (dequantised rows and sgemm on x rounded as the int8
 * path rounds it, d·q per block) against the reference on that rounded x within float rounding alone,
 * K·2^-23·Σ|w·x| (a sum of K products loses at most K·2^-24 of Σ|w·x|, the d·q products one
 * rounding each; the reference's "+ m" roundings are far below). Then accumulate onto a random y0
 * (the residual): y0 + y bit for bit on the int8 path (the same dot, one add), within y's
 * tolerance plus one rounding of |y0 + y| on sgemm's (its beta = 1 may add in another order). */
static void test_linear(void **state) {
    const format_case *f = *state;
    const int32_t K = 2 * f->block + (f->block == 32 ? 512 : 0);
    const struct { int32_t T, N; } cases[] = {{1, 37}, {7, 37}, {31, 37}, {45, 101}, {133, 101}};
    /* the sgemm path's thresholds fall between the cases: 32 (portable), 128 (k-quants on x86) */
    assert_true(cpu_quant_sgemm_tokens(f->type, CPU_QUANT_PORTABLE) == 32);
    assert_true(cpu_quant_sgemm_tokens(f->type, cpu_quant_best_isa()) > 45);
    const int32_t T_max = 133, N_max = 101;
    const size_t row_bytes = cpu_quant_row_bytes(f->type, K), act_bytes = cpu_quant_act_row_bytes(f->type, K);
    uint8_t *w = malloc(row_bytes * N_max);
    float *wf = malloc(sizeof(float) * (size_t)K * N_max);
    float *x = malloc(sizeof(float) * (size_t)K * T_max), *y = malloc(sizeof(float) * T_max * N_max);
    float *y0 = malloc(sizeof(float) * T_max * N_max), *z = malloc(sizeof(float) * T_max * N_max);
    float *y_simd = malloc(sizeof(float) * T_max * N_max); /* the first SIMD path's y */
    uint8_t *act = malloc(act_bytes * T_max);
    float *xq = malloc(sizeof(float) * (size_t)K);
    assert_true(w && wf && x && y && y0 && z && y_simd && act && xq);
    random_blocks(f, w, (int64_t)N_max * (K / f->block), 5, 12);
    dequant(f, w, (int64_t)N_max * K, wf);
    cpu_quant_isa isa[3];
    const int n_paths = paths(isa);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int32_t T = cases[c].T, N = cases[c].N;
        random_activations(x, K * T, 1.0f);
        for (int32_t t = 0; t < T; t++)
            assert_int_equal(cpu_quant_activations(act + act_bytes * t, x + (size_t)t * K, f->type, K), NOPAD_OK);
        for (int p = 0; p < n_paths; p++)
            for (int threads = 1; threads <= 2; threads++) {
                const int sgemm = T >= cpu_quant_sgemm_tokens(f->type, isa[p]);
                for (int32_t i = 0; i < T * N; i++) y[i] = NAN;
                assert_int_equal(cpu_quant_linear_on(y, x, w, f->type, T, K, N, 0, threads, isa[p]), NOPAD_OK);
                for (int32_t i = 0; i < T * N; i++) z[i] = y0[i] = rnd_unit();
                assert_int_equal(cpu_quant_linear_on(z, x, w, f->type, T, K, N, 1, threads, isa[p]), NOPAD_OK);
                if (isa[p] != CPU_QUANT_PORTABLE && !sgemm) {
                    if (isa[p] == isa[1] && threads == 1) memcpy(y_simd, y, sizeof(float) * T * N);
                    else if (memcmp(y_simd, y, sizeof(float) * T * N) != 0)
                        fail_msg("%s linear T=%d: %s with %d threads differs from %s", f->name, T,
                                 isa_name(isa[p]), threads, isa_name(isa[1]));
                }
                for (int32_t t = 0; t < T; t++) {
                    const float *xr = x + (size_t)t * K;
                    const uint8_t *at = act + act_bytes * t;
                    if (sgemm) { /* the row as the int8 path sees it: d·q per block */
                        for (int32_t i = 0; i < K; i++) {
                            const cpu_q8_block *b8 = (const cpu_q8_block *)at + i / 32;
                            const cpu_q8k_block *bk = (const cpu_q8k_block *)at + i / 256;
                            xq[i] = f->block == 32 ? b8->d * (float)b8->qs[i % 32] : bk->d * (float)bk->qs[i % 256];
                        }
                        xr = xq;
                    }
                    for (int32_t n = 0; n < N; n++) {
                        const float *wr = wf + (size_t)n * K;
                        const double want = dot_double(wr, xr, K);
                        double tol = 0.0;
                        if (sgemm) {
                            for (int32_t i = 0; i < K; i++) tol += fabs((double)wr[i] * xr[i]);
                            tol = K * ldexp(tol, -23);
                        } else {
                            tol = dot_tolerance(f, w + row_bytes * n, wr, xr, K);
                        }
                        const size_t i = (size_t)t * N + n;
                        const float got = y[i];
                        if (!(fabs(got - want) <= tol))
                            fail_msg("%s linear %s T=%d N=%d, %d threads, y[%d, %d] = %.9g, want %.9g "
                                     "(tolerance %.3g)", f->name, isa_name(isa[p]), T, N, threads, t, n, got,
                                     want, tol);
                        const float sum = y0[i] + got;
                        if (sgemm ? !(fabs(z[i] - (y0[i] + want)) <= tol + ldexp(fabs(y0[i]) + fabs(want), -23))
                                  : memcmp(&z[i], &sum, sizeof sum) != 0)
                            fail_msg("%s linear %s T=%d accumulating: y[%d, %d] = %.9g, want %.9g + %.9g",
                                     f->name, isa_name(isa[p]), T, t, n, z[i], y0[i], got);
                        if (sgemm) continue;
                        float one = NAN;
                        assert_int_equal(cpu_quant_dot(&one, w + row_bytes * n, at, f->type, K, isa[p]), NOPAD_OK);
                        if (memcmp(&one, &got, sizeof one) != 0)
                            fail_msg("%s linear %s T=%d y[%d, %d] = %.9g, the one-row dot %.9g", f->name,
                                     isa_name(isa[p]), T, t, n, got, one);
                    }
                }
            }
    }
    free(w);
    free(wf);
    free(x);
    free(y);
    free(y0);
    free(z);
    free(y_simd);
    free(act);
    free(xq);
}

/* The embedding rows' dequantisation (cpu_quant_dequantize) bit for bit against the reference's
 * on random blocks, rows of one block and of many. */
static void test_dequantize(void **state) {
    const format_case *f = *state;
    const int32_t lengths[] = {f->block, 9 * f->block};
    for (size_t c = 0; c < sizeof lengths / sizeof lengths[0]; c++) {
        const int32_t K = lengths[c];
        uint8_t *w = malloc(cpu_quant_row_bytes(f->type, K));
        float *got = malloc(sizeof(float) * (size_t)K), *want = malloc(sizeof(float) * (size_t)K);
        assert_true(w && got && want);
        random_blocks(f, w, K / f->block, 0, 30);
        dequant(f, w, K, want);
        assert_int_equal(cpu_quant_dequantize(got, w, f->type, K), NOPAD_OK);
        for (int32_t i = 0; i < K; i++)
            if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                fail_msg("%s dequantize K=%d: value %d is %.9g, want %.9g", f->name, K, i, got[i], want[i]);
        free(w);
        free(got);
        free(want);
    }
}

/* ---- errors --------------------------------------------------------------------------------- */

static void expect_error(nopad_status got, nopad_status want, const char *needle) {
    assert_int_equal(got, want);
    if (!strstr(nopad_last_error(), needle))
        fail_msg("error \"%s\" does not name \"%s\"", nopad_last_error(), needle);
}

static void test_rows_not_whole_blocks(void **state) {
    (void)state;
    float x[320], y[4] = {0};
    uint8_t w[4096] = {0};
    cpu_q8k_block act[2];
    for (int i = 0; i < 320; i++) x[i] = rnd_unit();
    expect_error(cpu_quant_activations(act, x, CPU_QUANT_Q8_0, 48), NOPAD_ERR_INVALID_ARGUMENT,
                 "K = 48");
    expect_error(cpu_quant_activations(act, x, CPU_QUANT_Q8_0, 48), NOPAD_ERR_INVALID_ARGUMENT,
                 "block of 32");
    expect_error(cpu_quant_dot(y, w, act, CPU_QUANT_Q4_K, 320, CPU_QUANT_PORTABLE),
                 NOPAD_ERR_INVALID_ARGUMENT, "block of 256");
    expect_error(cpu_quant_linear(y, x, w, CPU_QUANT_Q5_0, 1, 48, 1, 0, 1), NOPAD_ERR_INVALID_ARGUMENT,
                 "K = 48 values of Q5_0");
    expect_error(cpu_quant_dequantize(y, w, CPU_QUANT_Q5_1, 40), NOPAD_ERR_INVALID_ARGUMENT,
                 "Q5_1, expected a positive multiple of its block of 32");
    expect_error(cpu_quant_linear(y, x, w, CPU_QUANT_Q6_K, 1, 320, 1, 0, 1),
                 NOPAD_ERR_INVALID_ARGUMENT, "K = 320");
    expect_error(cpu_quant_linear(y, x, w, CPU_QUANT_Q4_1, 1, 0, 1, 0, 1),
                 NOPAD_ERR_INVALID_ARGUMENT, "K = 0");
    expect_error(cpu_quant_linear(y, x, w, GGUF_TENSOR_F16, 1, 256, 1, 0, 1), NOPAD_ERR_UNSUPPORTED,
                 "type 1");
    assert_int_equal(cpu_quant_block_size(GGUF_TENSOR_F32), 0);
    assert_int_equal(cpu_quant_row_bytes(CPU_QUANT_Q5_K, 512), 352);
    assert_int_equal(cpu_quant_row_bytes(CPU_QUANT_Q5_0, 64), 44);
    assert_int_equal(cpu_quant_row_bytes(CPU_QUANT_Q5_1, 64), 48);
}

/* A fused weight whose parts differ in format (backend.h's NOPAD_WEIGHT_MIXED: a Q4_K_M file's Q4_K
 * Q and K beside a Q6_K V) through the CPU backend's gemm_q: each part's columns of out are bit for
 * bit what cpu_quant_linear gives for that part alone, at decode (1), the int8 GEMM's (7, 45) and
 * the k-quants' sgemm token counts (133), plain and with bias + residual, on 1 and 2 threads; a
 * header whose rows do not add up to n_out is a clear error. */
static void test_mixed_weight(void **state) {
    (void)state;
    const format_case *part[3] = {&FORMATS[5], &FORMATS[7], &FORMATS[0]}; /* Q4_K, Q6_K, Q8_0 */
    const int32_t rows[3] = {37, 19, 11}, K = 512, N = 37 + 19 + 11, T_max = 133;
    size_t bytes = NOPAD_MIXED_HEADER, at[3];
    for (int i = 0; i < 3; i++) {
        at[i] = bytes;
        bytes += cpu_quant_row_bytes(part[i]->type, K) * (size_t)rows[i];
    }
    uint8_t *w = calloc(bytes, 1);
    float *x = malloc(sizeof(float) * (size_t)K * T_max), *bias = malloc(sizeof(float) * N);
    float *res = malloc(sizeof(float) * T_max * N), *y = malloc(sizeof(float) * T_max * N);
    float *want = malloc(sizeof(float) * T_max * N);
    assert_true(w && x && bias && res && y && want);
    nopad_mixed_weight h = {.n_parts = 3};
    for (int i = 0; i < 3; i++) {
        h.format[i] = part[i]->type;
        h.rows[i] = rows[i];
        random_blocks(part[i], w + at[i], (int64_t)rows[i] * (K / part[i]->block), 5, 12);
    }
    memcpy(w, &h, sizeof h);
    for (int32_t n = 0; n < N; n++) bias[n] = rnd_unit();
    for (int threads = 1; threads <= 2; threads++) {
        nopad_backend *be = NULL;
        nopad_backend_params bp = {.device = NOPAD_DEVICE_CPU, .dtype = NOPAD_DTYPE_F32, .n_threads = threads};
        assert_int_equal(nopad_backend_create(&bp, &be), NOPAD_OK);
        assert_true(nopad_backend_runs_format(be, NOPAD_WEIGHT_MIXED, K));
        const int32_t Ts[] = {1, 7, 45, 133};
        for (size_t c = 0; c < sizeof Ts / sizeof Ts[0]; c++) {
            const int32_t T = Ts[c];
            random_activations(x, K * T, 1.0f);
            for (int residual = 0; residual <= 1; residual++) {
                for (int32_t i = 0; i < T * N; i++) {
                    res[i] = rnd_unit();
                    y[i] = NAN;
                    want[i] = residual ? res[i] : NAN;
                }
                int32_t row0 = 0;
                for (int i = 0; i < 3; i++) {
                    /* y as scratch: the part alone, [T, rows[i]], onto its columns of the residual */
                    for (int32_t t = 0; t < T; t++)
                        for (int32_t n = 0; n < rows[i]; n++) y[(size_t)t * rows[i] + n] = res[(size_t)t * N + row0 + n];
                    assert_int_equal(
                        cpu_quant_linear(y, x, w + at[i], part[i]->type, T, K, rows[i], residual, threads), NOPAD_OK);
                    for (int32_t t = 0; t < T; t++)
                        for (int32_t n = 0; n < rows[i]; n++) want[(size_t)t * N + row0 + n] = y[(size_t)t * rows[i] + n];
                    row0 += rows[i];
                }
                if (residual)
                    for (int32_t t = 0; t < T; t++)
                        for (int32_t n = 0; n < N; n++) want[(size_t)t * N + n] += bias[n];
                for (int32_t i = 0; i < T * N; i++) y[i] = NAN;
                assert_int_equal(be->gemm_q(be, y, x, w, NOPAD_WEIGHT_MIXED, residual ? bias : NULL,
                                            residual ? res : NULL, T, K, N,
                                            residual ? NOPAD_EPILOGUE_BIAS_RESIDUAL : NOPAD_EPILOGUE_NONE,
                                            NOPAD_ACT_GELU, 1),
                                 NOPAD_OK);
                for (int32_t i = 0; i < T * N; i++)
                    if (memcmp(&y[i], &want[i], sizeof y[i]) != 0)
                        fail_msg("mixed weight T=%d, %d threads%s: y[%d, %d] = %.9g, the part alone %.9g", T, threads,
                                 residual ? ", bias + residual" : "", i / N, i % N, y[i], want[i]);
            }
        }
        expect_error(be->gemm_q(be, y, x, w, NOPAD_WEIGHT_MIXED, NULL, NULL, 1, K, N + 1, NOPAD_EPILOGUE_NONE,
                                NOPAD_ACT_GELU, 1),
                     NOPAD_ERR_INVALID_ARGUMENT, "holds 67 rows, expected 1-4 parts and n_out = 68");
        be->destroy(be);
    }
    free(w);
    free(x);
    free(bias);
    free(res);
    free(y);
    free(want);
}

/* Q4_K, Q6_K and Q4_1 repacked at load, 8 rows interleaved (quant.h's CPU_QUANT_Q4_K_R8, _Q6_K_R8,
 * _Q4_1_R8, _Q8_0_R8), through
 * cpu_quant_linear on every path: random rows (fp16 scales 2^-10..2^-3), the extreme scales of
 * test_extreme_scales and all-equal blocks; K = 768 (3 super-blocks, an odd count; 24 blocks of 32), N = 8, 40 and
 * 104 (odd counts of groups of 8, over the GEMV's tiles of 16 rows), T = 1, 3, 7, 45 and 133 (the
 * int8 GEMV in groups of 4 tokens and one at a time, or sgemm on the rows dequantised where the path
 * takes it: the portable path from 32 tokens). Each y[t, n] within the dot's tolerance of the float
 * reference (the stored rows dequantised); on the int8 path bit for bit across the paths (the same
 * exact integers, then the same two fused multiply-adds), bit for bit against T = 1 on that token
 * (a row's result does not depend on how many tokens share its step), and with accumulate y0 + y
 * bit for bit; on sgemm's bit for bit against the stored rows' (the same dequantised floats, the
 * same sgemm calls). The repacking's errors: N not a multiple of 8, and the one-row entry points. */
typedef struct repacked_case {
    const format_case *stored;
    uint32_t type;       /* CPU_QUANT_Q4_K_R8, _Q6_K_R8, _Q4_1_R8 or _Q8_0_R8 */
    size_t group_bytes;  /* a group's block: 8 rows' blocks */
    nopad_status (*repack)(void *dst, const void *src, int32_t K, int32_t N);
} repacked_case;

static const repacked_case REPACKED[] = {
    {&FORMATS[5], CPU_QUANT_Q4_K_R8, CPU_QUANT_R8_BYTES, cpu_quant_repack_q4_k_r8},
    {&FORMATS[7], CPU_QUANT_Q6_K_R8, CPU_QUANT_R8_BYTES_6, cpu_quant_repack_q6_k_r8},
    {&FORMATS[2], CPU_QUANT_Q4_1_R8, CPU_QUANT_R8_BYTES_4_1, cpu_quant_repack_q4_1_r8},
    {&FORMATS[0], CPU_QUANT_Q8_0_R8, CPU_QUANT_R8_BYTES_8_0, cpu_quant_repack_q8_0_r8},
};

static void test_k_repacked(void **state) {
    const repacked_case *rc = *state;
    const format_case *f = rc->stored;
    const uint32_t R8 = rc->type;
    enum { K = 768, N_MAX = 104, T_MAX = 133 };
    const size_t row_bytes = cpu_quant_row_bytes(f->type, K);
    const size_t r8_bytes = cpu_quant_row_bytes(R8, K);
    const int32_t nb = K / f->block;
    assert_int_equal(r8_bytes * 8, (size_t)nb * rc->group_bytes);
    uint8_t *w = malloc(row_bytes * N_MAX), *wr = malloc(r8_bytes * N_MAX);
    float *wf = malloc(sizeof(float) * (size_t)K * N_MAX), *x = malloc(sizeof(float) * (size_t)K * T_MAX);
    float *y = malloc(sizeof(float) * T_MAX * N_MAX), *y1 = malloc(sizeof(float) * N_MAX);
    float *ys = malloc(sizeof(float) * T_MAX * N_MAX), *y0 = malloc(sizeof(float) * T_MAX * N_MAX);
    float *z = malloc(sizeof(float) * T_MAX * N_MAX), *y_int8 = malloc(sizeof(float) * T_MAX * N_MAX);
    uint8_t *act = malloc(cpu_quant_act_row_bytes(f->type, K) * T_MAX);
    assert_true(w && wr && wf && x && y && y1 && ys && y0 && z && y_int8 && act);
    const size_t act_bytes = cpu_quant_act_row_bytes(f->type, K);
    struct { int e_lo, e_hi; float x_scale; int fill; const char *label; } data[] = {
        {5, 12, 1.0f, -1, "random"},
        {30, 30, 1e-6f, -1, "fp16 scales near 65504, tiny x"},
        {0, 1, 1e4f, -1, "subnormal fp16 scales, large x"},
        {8, 12, 1.0f, 0xff, "all-equal blocks 0xff"},
        {8, 12, 1.0f, 0x77, "all-equal blocks 0x77"},
    };
    const struct { int32_t T, N; } cases[] = {{1, 40}, {3, 8}, {7, 104}, {45, 40}, {133, 104}};
    cpu_quant_isa isa[3];
    const int n_paths = paths(isa);
    for (size_t d = 0; d < sizeof data / sizeof data[0]; d++) {
        random_blocks(f, w, (int64_t)N_MAX * nb, data[d].e_lo, data[d].e_hi);
        if (data[d].fill >= 0) {
            for (int64_t b = 0; b < (int64_t)N_MAX * nb; b++) { /* all but d (and dmin, m) */
                if (f->type == CPU_QUANT_Q4_K) memset(w + b * 144 + 4, data[d].fill, 140);
                else if (f->type == CPU_QUANT_Q4_1) memset(w + b * 20 + 4, data[d].fill, 16);
                else if (f->type == CPU_QUANT_Q8_0) memset(w + b * 34 + 2, data[d].fill, 32);
                else memset(w + b * 210, data[d].fill, 208);
            }
        }
        dequant(f, w, (int64_t)N_MAX * K, wf);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const int32_t T = cases[c].T, N = cases[c].N;
            assert_int_equal(rc->repack(wr, w, K, N), NOPAD_OK);
            if (data[d].fill >= 0) {
                const float v = (c % 2 ? -1.0f : 1.0f) * (0.25f + 0.5f * fabsf(rnd_unit()));
                for (int32_t i = 0; i < K * T; i++) x[i] = v;
            } else {
                random_activations(x, K * T, data[d].x_scale);
            }
            for (int32_t t = 0; t < T; t++)
                assert_int_equal(cpu_quant_activations(act + act_bytes * t, x + (size_t)t * K, f->type, K),
                                 NOPAD_OK);
            int have_int8 = 0; /* 1 + the path whose int8 GEMV's y is in y_int8 */
            for (int p = 0; p < n_paths; p++)
                for (int threads = 1; threads <= 2; threads++) {
                    const int sg = T >= cpu_quant_sgemm_tokens(R8, isa[p]);
                    for (int32_t i = 0; i < T * N; i++) y[i] = NAN;
                    assert_int_equal(cpu_quant_linear_on(y, x, wr, R8, T, K, N, 0, threads, isa[p]),
                                     NOPAD_OK);
                    for (int32_t i = 0; i < T * N; i++) z[i] = y0[i] = rnd_unit();
                    assert_int_equal(cpu_quant_linear_on(z, x, wr, R8, T, K, N, 1, threads, isa[p]),
                                     NOPAD_OK);
                    if (sg) { /* the stored rows' sgemm: the same floats */
                        assert_int_equal(cpu_quant_linear_on(ys, x, w, f->type, T, K, N, 0, threads, isa[p]),
                                         NOPAD_OK);
                        if (memcmp(ys, y, sizeof(float) * T * N) != 0)
                            fail_msg("%s repacked (%s) %s T=%d N=%d: sgemm differs from the stored rows'",
                                     f->name, data[d].label, isa_name(isa[p]), T, N);
                    } else if (!have_int8) { /* the first path on the int8 GEMV (portable's is sgemm from 32) */
                        memcpy(y_int8, y, sizeof(float) * T * N);
                        have_int8 = isa[p] + 1;
                    } else if (memcmp(y_int8, y, sizeof(float) * T * N) != 0) {
                        fail_msg("%s repacked (%s) T=%d N=%d: %s with %d threads differs from %s", f->name, data[d].label, T,
                                 N, isa_name(isa[p]), threads, isa_name((cpu_quant_isa)(have_int8 - 1)));
                    }
                    for (int32_t t = 0; t < T; t++) {
                        if (!sg && T > 1) {
                            assert_int_equal(cpu_quant_linear_on(y1, x + (size_t)t * K, wr, R8, 1, K, N,
                                                                 0, threads, isa[p]),
                                             NOPAD_OK);
                            if (memcmp(y1, y + (size_t)t * N, sizeof(float) * N) != 0)
                                fail_msg("%s repacked (%s) %s T=%d: token %d differs from it alone", f->name, data[d].label,
                                         isa_name(isa[p]), T, t);
                        }
                        const float *xr = x + (size_t)t * K;
                        for (int32_t n = 0; n < N; n++) {
                            const float *wrow = wf + (size_t)n * K;
                            const double want = dot_double(wrow, xr, K);
                            double tol = dot_tolerance(f, w + row_bytes * n, wrow, xr, K);
                            if (sg) { /* x rounded to d·q first (test_linear's bound on top of the rounding) */
                                double mag = 0.0;
                                for (int32_t i = 0; i < K; i++) mag += fabs((double)wrow[i] * xr[i]);
                                tol += K * ldexp(mag, -23);
                            }
                            const size_t i = (size_t)t * N + n;
                            if (!(fabs(y[i] - want) <= tol))
                                fail_msg("%s repacked (%s) %s T=%d N=%d, %d threads: y[%d, %d] = %.9g, want %.9g "
                                         "(tolerance %.3g)", f->name, data[d].label, isa_name(isa[p]), T, N, threads, t, n, y[i],
                                         want, tol);
                            const float sum = y0[i] + y[i];
                            if (sg ? !(fabs(z[i] - (y0[i] + want)) <= tol + ldexp(fabs(y0[i]) + fabs(want), -23))
                                   : memcmp(&z[i], &sum, sizeof sum) != 0)
                                fail_msg("%s repacked (%s) %s T=%d accumulating: y[%d, %d] = %.9g, want %.9g + %.9g",
                                         f->name, data[d].label, isa_name(isa[p]), T, t, n, z[i], y0[i], y[i]);
                        }
                    }
                }
        }
    }
    expect_error(rc->repack(wr, w, K, 12), NOPAD_ERR_INVALID_ARGUMENT, "12 rows");
    expect_error(cpu_quant_linear(y, x, wr, R8, 1, K, 12, 0, 1), NOPAD_ERR_INVALID_ARGUMENT,
                 "N = 12 is not a multiple of 8");
    expect_error(cpu_quant_dot(y, wr, act, R8, K, CPU_QUANT_PORTABLE), NOPAD_ERR_UNSUPPORTED,
                 "groups of 8");
    expect_error(cpu_quant_dequantize(y, wr, R8, K), NOPAD_ERR_UNSUPPORTED, "groups of 8");
    free(w);
    free(wr);
    free(wf);
    free(x);
    free(y);
    free(y1);
    free(ys);
    free(y0);
    free(z);
    free(y_int8);
    free(act);
}

/* One test per format, named "<test> <format>" (the formats' order in FORMATS). */
#define ONE_FORMAT(fn, i, name) {#fn " " name, fn, NULL, NULL, (void *)&FORMATS[i]}
#define PER_FORMAT(fn)                                                                             \
    ONE_FORMAT(fn, 0, "Q8_0"), ONE_FORMAT(fn, 1, "Q4_0"), ONE_FORMAT(fn, 2, "Q4_1"),                \
        ONE_FORMAT(fn, 3, "Q5_0"), ONE_FORMAT(fn, 4, "Q5_1"), ONE_FORMAT(fn, 5, "Q4_K"),            \
        ONE_FORMAT(fn, 6, "Q5_K"), ONE_FORMAT(fn, 7, "Q6_K")

int main(void) {
    printf("best path on this CPU: %s\n", isa_name(cpu_quant_best_isa()));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_activation_blocks),
        cmocka_unit_test(test_activation_paths),
        PER_FORMAT(test_dot),
        PER_FORMAT(test_extreme_scales),
        PER_FORMAT(test_all_equal_blocks),
        PER_FORMAT(test_paths_agree_exactly),
        PER_FORMAT(test_linear),
        PER_FORMAT(test_dequantize),
        cmocka_unit_test(test_rows_not_whole_blocks),
        cmocka_unit_test(test_mixed_weight),
        {"test_k_repacked Q4_K", test_k_repacked, NULL, NULL, (void *)&REPACKED[0]},
        {"test_k_repacked Q6_K", test_k_repacked, NULL, NULL, (void *)&REPACKED[1]},
        {"test_k_repacked Q4_1", test_k_repacked, NULL, NULL, (void *)&REPACKED[2]},
        {"test_k_repacked Q8_0", test_k_repacked, NULL, NULL, (void *)&REPACKED[3]},
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* GGUF tensor data to float32: fp16 -> f32 on all 65536 inputs against two references, every
 * supported type bit for bit against the `gguf` package's dequantize() (fixtures of
 * scripts/make_gguf_dequant_fixtures.py; Q5_0 and Q5_1 against their definition on random
 * blocks), row slices against the whole tensor, the errors (unsupported types, rows out of
 * range), and a timing print for Q4_1 on 4096 x 4096. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */

#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/gguf.h"
#include "io/gguf_dequant.h"
#include "io/safetensors.h"

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- fp16 and bf16 ------------------------------------------------------------------------ */

/* The binary16 value of h computed in double from the definition (finite h only). */
static float fp16_by_definition(uint16_t h) {
    int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v = exp ? ldexp(1024 + man, exp - 25) : ldexp(man, -24);
    return (float)((h & 0x8000) ? -v : v); /* exact: 11 significant bits, exponents in range */
}

static void test_fp16_exhaustive(void **state) {
    (void)state;
    int n_nan = 0, n_sub = 0, n_checked_native = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        uint32_t got = bits_of(gguf_fp16_to_f32(h));
        uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
        uint32_t want;
        if (exp == 0x1f && man) { /* NaN: quiet, sign and payload kept */
            want = sign | 0x7fc00000u | man << 13;
            n_nan++;
        } else if (exp == 0x1f) {
            want = sign | 0x7f800000u;
        } else {
            want = bits_of(fp16_by_definition(h));
            if (h == 0x8000) want = 0x80000000u; /* -0.0 (the negation above keeps it too) */
            n_sub += exp == 0 && man != 0;
        }
        if (got != want) fail_msg("fp16 0x%04x -> 0x%08x, want 0x%08x", h, got, want);
#ifdef __FLT16_MAX__
        /* the compiler's own conversion (F16C or libgcc's soft-fp): IEEE's, sNaN made quiet */
        _Float16 hf;
        memcpy(&hf, &h, 2);
        uint32_t native = bits_of((float)hf);
        if (got != native)
            fail_msg("fp16 0x%04x -> 0x%08x, the compiler's _Float16 gives 0x%08x", h, got, native);
        n_checked_native++;
#endif
    }
    assert_int_equal(n_nan, 2 * 1023);
    assert_int_equal(n_sub, 2 * 1023);
    printf("fp16 -> f32: all 65536 values exact (%d also against _Float16)\n", n_checked_native);
}

static void test_bf16(void **state) {
    (void)state;
    for (uint32_t i = 0; i < 65536; i++)
        assert_int_equal(bits_of(gguf_bf16_to_f32((uint16_t)i)), i << 16);
    assert_true(gguf_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(gguf_bf16_to_f32(0xc040) == -3.0f);
}

/* ---- known answers ------------------------------------------------------------------------ */

typedef struct fixtures {
    gguf_file g;
    safetensors_file want;
} fixtures;

static int open_fixtures(void **state) {
    fixtures *fx = calloc(1, sizeof *fx);
    assert_non_null(fx);
    assert_nopad_ok(gguf_open(test_data_path("gguf/dequant.gguf"), &fx->g));
    assert_nopad_ok(
        safetensors_open(test_data_path("gguf/dequant_expected.safetensors"), &fx->want));
    *state = fx;
    return 0;
}

static int close_fixtures(void **state) {
    fixtures *fx = *state;
    gguf_close(&fx->g);
    safetensors_close(&fx->want);
    free(fx);
    return 0;
}

/* The expected values of tensor `t` (checked to be F32 of shape dims reversed), copied. */
static float *expected_values(const fixtures *fx, const gguf_tensor *t) {
    const safetensors_tensor *w = safetensors_find(&fx->want, t->name);
    if (!w) fail_msg("no expected values for '%s'", t->name);
    assert_int_equal(w->dtype, ST_F32);
    assert_int_equal(w->ndim, (int)t->n_dims);
    for (int d = 0; d < w->ndim; d++) assert_int_equal(w->shape[d], t->dims[t->n_dims - 1 - d]);
    assert_int_equal(w->n_elements, t->n_elements);
    float *v = malloc((size_t)w->n_elements * sizeof *v);
    assert_non_null(v);
    memcpy(v, w->data, (size_t)w->n_elements * sizeof *v);
    return v;
}

/* Fails at the first value whose bits differ. */
static void expect_bits(const char *label, const float *got, const float *want, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (bits_of(got[i]) != bits_of(want[i]))
            fail_msg("%s: value %lld is %.9g (0x%08x), want %.9g (0x%08x)", label, (long long)i,
                     got[i], bits_of(got[i]), want[i], bits_of(want[i]));
}

static void test_known_answers(void **state) {
    const fixtures *fx = *state;
    int types_seen[64] = {0}, n = 0;
    for (uint64_t i = 0; i < fx->g.n_tensors; i++) {
        const gguf_tensor *t = &fx->g.tensors[i];
        if (strncmp(t->name, "bad.", 4) == 0) continue;
        float *want = expected_values(fx, t);
        float *got = malloc((size_t)t->n_elements * sizeof *got);
        assert_non_null(got);
        memset(got, 0xff, (size_t)t->n_elements * sizeof *got);
        assert_nopad_ok(gguf_tensor_to_f32(&fx->g, t, got));
        char label[96];
        snprintf(label, sizeof label, "%s (%s)", t->name, gguf_tensor_type_name(t->type));
        expect_bits(label, got, want, t->n_elements);
        types_seen[t->type] = 1;
        n++;
        free(got);
        free(want);
    }
    assert_int_equal(n, fx->want.n_tensors);
    static const uint32_t all[] = {GGUF_TENSOR_F32,  GGUF_TENSOR_F16,  GGUF_TENSOR_BF16,
                                   GGUF_TENSOR_Q8_0, GGUF_TENSOR_Q4_0, GGUF_TENSOR_Q4_1,
                                   GGUF_TENSOR_Q4_K, GGUF_TENSOR_Q6_K};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        if (!types_seen[all[k]]) fail_msg("no fixture of type %s", gguf_tensor_type_name(all[k]));

    /* the fixture holds what it says: the special fp16 values, a NaN payload, a 3-D shape */
    const gguf_tensor *sp = gguf_find_tensor(&fx->g, "w.f16_special");
    assert_non_null(sp);
    float v[64];
    assert_nopad_ok(gguf_tensor_to_f32(&fx->g, sp, v));
    assert_true(isinf(v[2]) && v[2] > 0 && isinf(v[3]) && v[3] < 0);
    assert_int_equal(bits_of(v[6]), 0x7fc02000u); /* 0x7E01 */
    assert_true(v[7] == ldexpf(1.0f, -24));       /* the smallest subnormal */
    assert_true(v[12] == 65504.0f);
    const gguf_tensor *t3 = gguf_find_tensor(&fx->g, "w.q8_0_3d");
    assert_non_null(t3);
    assert_int_equal(t3->n_dims, 3);
    assert_int_equal(gguf_tensor_rows(t3), 6);
}

/* Every slice of rows equals the same rows of the whole tensor: one at a time, then all but the
 * first and last, then none. */
static void test_row_slices(void **state) {
    const fixtures *fx = *state;
    for (uint64_t i = 0; i < fx->g.n_tensors; i++) {
        const gguf_tensor *t = &fx->g.tensors[i];
        if (strncmp(t->name, "bad.", 4) == 0) continue;
        float *want = expected_values(fx, t);
        int64_t rows = gguf_tensor_rows(t), cols = t->dims[0];
        assert_int_equal(rows * cols, t->n_elements);
        float *got = malloc((size_t)t->n_elements * sizeof *got);
        assert_non_null(got);
        char label[96];
        for (int64_t r = 0; r < rows; r++) {
            assert_nopad_ok(gguf_rows_to_f32(&fx->g, t, r, 1, got));
            snprintf(label, sizeof label, "%s row %lld", t->name, (long long)r);
            expect_bits(label, got, want + r * cols, cols);
        }
        if (rows > 2) {
            assert_nopad_ok(gguf_rows_to_f32(&fx->g, t, 1, rows - 2, got));
            snprintf(label, sizeof label, "%s rows [1, %lld)", t->name, (long long)rows - 1);
            expect_bits(label, got, want + cols, (rows - 2) * cols);
        }
        assert_nopad_ok(gguf_rows_to_f32(&fx->g, t, rows, 0, NULL));
        assert_nopad_ok(gguf_rows_to_f32(&fx->g, t, 0, rows, got));
        expect_bits(t->name, got, want, t->n_elements);

        /* and from the bytes directly */
        const void *data;
        size_t nbytes;
        assert_nopad_ok(gguf_tensor_data(&fx->g, t, &data, &nbytes));
        assert_nopad_ok(gguf_dequantize(t->type, data, t->n_elements, got));
        expect_bits(t->name, got, want, t->n_elements);
        free(got);
        free(want);
    }
}

/* Q5_0 and Q5_1 on random blocks against ggml's definition evaluated in double: element e of a
 * block is the nibble of qs[e mod 16] (low for e < 16, high above) plus 16 · bit e of the
 * little-endian qh; x = (q - 16)·d or q·d + m. Both are exact in double and rounded once to float
 * (Q5_0's product is exact in float too), so the conversion must match bit for bit. Scales span
 * subnormal to 2^15, either sign. */
static void test_q5_blocks(void **state) {
    (void)state;
    enum { BLOCKS = 200, QK = 32 };
    uint64_t rng = 0x5bd1e995u;
    for (int with_min = 0; with_min <= 1; with_min++) {
        const int bytes = with_min ? 24 : 22;
        uint8_t data[BLOCKS * 24];
        float got[BLOCKS * QK];
        for (int i = 0; i < BLOCKS * bytes; i++) data[i] = (uint8_t)test_rand_u32(&rng);
        for (int b = 0; b < BLOCKS; b++) /* no inf / NaN scales: exponent field below 31 */
            for (int k = 0; k < 1 + with_min; k++) data[b * bytes + 2 * k + 1] &= 0xf7;
        assert_nopad_ok(gguf_dequantize(with_min ? GGUF_TENSOR_Q5_1 : GGUF_TENSOR_Q5_0, data, BLOCKS * QK, got));
        for (int b = 0; b < BLOCKS; b++) {
            const uint8_t *blk = data + b * bytes;
            const double d = fp16_by_definition((uint16_t)(blk[0] | blk[1] << 8));
            const double m = with_min ? fp16_by_definition((uint16_t)(blk[2] | blk[3] << 8)) : 0.0;
            const uint8_t *qh = blk + (with_min ? 4 : 2), *qs = qh + 4;
            for (int e = 0; e < QK; e++) {
                const int nibble = e < 16 ? qs[e] & 0x0f : qs[e - 16] >> 4;
                const int q = nibble + 16 * (qh[e / 8] >> (e % 8) & 1);
                const float want = (float)(with_min ? q * d + m : (q - 16) * d);
                if (bits_of(got[b * QK + e]) != bits_of(want))
                    fail_msg("Q5_%d block %d element %d: %.9g, want %.9g", with_min, b, e, got[b * QK + e], want);
            }
        }
    }
}

static void test_unsupported_types(void **state) {
    const fixtures *fx = *state;
    float out[512];
    const gguf_tensor *q5k = gguf_find_tensor(&fx->g, "bad.q5_k");
    const gguf_tensor *iq = gguf_find_tensor(&fx->g, "bad.iq4_xs");
    assert_non_null(q5k);
    assert_non_null(iq);
    assert_int_equal(q5k->type, 13);
    assert_nopad_error(gguf_tensor_to_f32(&fx->g, q5k, out), NOPAD_ERR_UNSUPPORTED,
                       "tensor 'bad.q5_k' has ggml type Q5_K (13), which cannot be converted to "
                       "float32 (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K)");
    assert_nopad_error(gguf_tensor_to_f32(&fx->g, q5k, out), NOPAD_ERR_UNSUPPORTED, "dequant.gguf");
    assert_nopad_error(gguf_rows_to_f32(&fx->g, q5k, 0, 1, out), NOPAD_ERR_UNSUPPORTED,
                       "tensor 'bad.q5_k' has ggml type Q5_K (13)");
    assert_nopad_error(gguf_tensor_to_f32(&fx->g, iq, out), NOPAD_ERR_UNSUPPORTED,
                       "tensor 'bad.iq4_xs' has ggml type IQ4_XS (23)");
    uint8_t zeros[256] = {0};
    assert_nopad_error(gguf_dequantize(13, zeros, 256, out), NOPAD_ERR_UNSUPPORTED,
                       "ggml type Q5_K (13) cannot be converted");
    assert_nopad_error(gguf_dequantize(99, zeros, 256, out), NOPAD_ERR_UNSUPPORTED,
                       "ggml type unknown (99)");
    assert_nopad_error(gguf_dequantize(GGUF_TENSOR_Q4_0, zeros, 48, out),
                       NOPAD_ERR_INVALID_ARGUMENT, "48 values of type Q4_0, expected a multiple");
    assert_nopad_error(gguf_tensor_to_f32(NULL, q5k, out), NOPAD_ERR_INVALID_ARGUMENT,
                       "need a file and a tensor");
}

static void test_rows_out_of_range(void **state) {
    const fixtures *fx = *state;
    const gguf_tensor *t = gguf_find_tensor(&fx->g, "w.q4_1"); /* [96, 5]: 5 rows of 96 */
    assert_non_null(t);
    assert_int_equal(gguf_tensor_rows(t), 5);
    float out[6 * 96];
    assert_nopad_error(gguf_rows_to_f32(&fx->g, t, 5, 1, out), NOPAD_ERR_INVALID_ARGUMENT,
                       "tensor 'w.q4_1': rows [5, 5 + 1) are out of range; it has 5 rows of 96 "
                       "values");
    assert_nopad_error(gguf_rows_to_f32(&fx->g, t, 0, 6, out), NOPAD_ERR_INVALID_ARGUMENT,
                       "out of range");
    assert_nopad_error(gguf_rows_to_f32(&fx->g, t, -1, 2, out), NOPAD_ERR_INVALID_ARGUMENT,
                       "rows [-1, -1 + 2)");
    assert_nopad_error(gguf_rows_to_f32(&fx->g, t, 2, -1, out), NOPAD_ERR_INVALID_ARGUMENT,
                       "out of range");
    assert_nopad_error(gguf_rows_to_f32(&fx->g, t, 1, INT64_MAX, out),
                       NOPAD_ERR_INVALID_ARGUMENT, "out of range");
    assert_nopad_error(gguf_rows_to_f32(&fx->g, t, INT64_MAX, 1, out),
                       NOPAD_ERR_INVALID_ARGUMENT, "out of range");
    assert_nopad_ok(gguf_rows_to_f32(&fx->g, t, 4, 1, out));
}

/* ---- timing ------------------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void put_le(uint8_t **p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) *(*p)++ = (uint8_t)(v >> (8 * i));
}

/* A GGUF file in memory holding one Q4_1 tensor "w" of [4096, 4096] (random nibbles, d and m
 * random normal fp16 values), converted whole (OpenMP) and row by row on one thread; both must
 * agree. Prints the rates; asserts nothing about them. */
static void test_q4_1_throughput(void **state) {
    (void)state;
    enum { N = 4096, BLOCK_BYTES = 20 };
    size_t data_bytes = (size_t)N * N / 32 * BLOCK_BYTES, header = 256;
    uint8_t *buf = malloc(header + data_bytes);
    assert_non_null(buf);
    uint8_t *p = buf;
    memcpy(p, "GGUF", 4), p += 4;
    put_le(&p, 3, 4), put_le(&p, 1, 8), put_le(&p, 0, 8); /* version, tensors, kvs */
    put_le(&p, 1, 8), *p++ = 'w';
    put_le(&p, 2, 4), put_le(&p, N, 8), put_le(&p, N, 8);
    put_le(&p, GGUF_TENSOR_Q4_1, 4), put_le(&p, 0, 8);
    while ((p - buf) % 32) *p++ = 0;
    size_t size = (size_t)(p - buf) + data_bytes;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (uint8_t *b = p; b < p + data_bytes; b += BLOCK_BYTES) {
        /* d in [2^-10, 2^-7), m in (-2^-4, 0]: finite normal fp16 */
        uint32_t r = test_rand_u32(&rng);
        put_le(&b, 0x1400u | (r & 0x7ff), 2);
        put_le(&b, 0x8000u | 0x2c00u | ((r >> 11) & 0x3ff), 2);
        b -= 4;
        for (int j = 4; j < BLOCK_BYTES; j++) b[j] = (uint8_t)test_rand_u32(&rng);
    }
    gguf_file f;
    assert_nopad_ok(gguf_parse(buf, size, "q4_1.gguf", &f));
    const gguf_tensor *t = gguf_find_tensor(&f, "w");
    assert_non_null(t);
    float *whole = malloc((size_t)N * N * sizeof *whole);
    float *rows = malloc((size_t)N * N * sizeof *rows);
    assert_non_null(whole);
    assert_non_null(rows);

    double best_whole = 1e30, best_rows = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_s();
        assert_nopad_ok(gguf_tensor_to_f32(&f, t, whole));
        double t1 = now_s();
        for (int64_t r = 0; r < N; r += 256)
            assert_nopad_ok(gguf_rows_to_f32(&f, t, r, 256, rows + r * N));
        double t2 = now_s();
        if (t1 - t0 < best_whole) best_whole = t1 - t0;
        if (t2 - t1 < best_rows) best_rows = t2 - t1;
    }
    expect_bits("Q4_1 4096x4096 whole vs rows", whole, rows, (int64_t)N * N);
    const char *threads = getenv("OMP_NUM_THREADS");
    double out_mb = (double)N * N * 4 / 1e6, in_mb = (double)data_bytes / 1e6;
    printf("Q4_1 4096x4096 -> f32: whole tensor (OMP_NUM_THREADS=%s) %.1f ms, %.0f MB/s of f32 "
           "out (%.0f MB/s of Q4_1 in); rows on one thread %.1f ms, %.0f MB/s out (%.0f MB/s in)\n",
           threads ? threads : "unset", 1e3 * best_whole, out_mb / best_whole, in_mb / best_whole,
           1e3 * best_rows, out_mb / best_rows, in_mb / best_rows);
    free(whole);
    free(rows);
    gguf_close(&f);
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16_exhaustive),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test_setup_teardown(test_known_answers, open_fixtures, close_fixtures),
        cmocka_unit_test_setup_teardown(test_row_slices, open_fixtures, close_fixtures),
        cmocka_unit_test(test_q5_blocks),
        cmocka_unit_test_setup_teardown(test_unsupported_types, open_fixtures, close_fixtures),
        cmocka_unit_test_setup_teardown(test_rows_out_of_range, open_fixtures, close_fixtures),
        cmocka_unit_test(test_q4_1_throughput),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* GPU tests of the fused varlen attention kernels against the CPU reference op.
 *
 * Inputs are uniform random in [-2, 2), rounded to half / bf16 once; the CPU op then runs in fp32 on
 * exactly those rounded values, so the only differences left are the kernel's own roundings: P in
 * half/bf16 before P V, the output in half/bf16, and ex2.approx. Error bound, per (token, head)
 * row of the output: ||gpu - cpu||_2 / ||cpu||_2 <= 2e-3 for fp16 (P and the output each carry
 * 2^-11 relative rounding) and <= 1e-2 for bf16 (2^-8 each).
 *
 * The output is poisoned with NaN (0xFFFF in both formats) before every run, and 8 rows past the
 * end are checked to stay poisoned, so an unwritten or stray-written element fails.
 *
 * No GPU (cudaGetDeviceCount fails or finds none): exit 77, which ctest reports as skipped.
 * NOPAD_GPU_TEST_QUICK=1 runs small shapes only (for compute-sanitizer, which is ~100x slower);
 * NOPAD_GPU_TEST_D=32|64|128 one head size only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_testutil.h"

#include "testutil.h"

#define CUDA_OK(expr)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) fail_msg("%s: %s", #expr, cudaGetErrorString(e_));                  \
    } while (0)

/* ---- host half / bf16 conversion (round to nearest even) -------------------------------------- */

static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const int32_t exp = (int32_t)((x >> 23) & 0xFF) - 127 + 15;
    uint32_t mant = x & 0x7FFFFFu;
    if (((x >> 23) & 0xFF) == 0xFF) return (uint16_t)(sign | 0x7C00u | (mant ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7C00u);
    if (exp <= 0) { /* subnormal half */
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        const int shift = 14 - exp;
        uint32_t h = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)exp << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++; /* may carry into the exponent: fine */
    return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FFu, x;
    if (exp == 0) {
        if (mant == 0) x = sign;
        else { /* normalise the subnormal */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400u)) { mant <<= 1; exp--; }
            x = sign | (exp << 23) | ((mant & 0x3FFu) << 13);
        }
    } else if (exp == 31) x = sign | 0x7F800000u | (mant << 13);
    else x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* ---- one case ----------------------------------------------------------------------------------- */

typedef struct {
    int32_t n_seqs, max_len, heads;
    int skewed; /* one max_len sequence among n_seqs-1 of 20 tokens */
} attn_case;

static int quick_mode(void) {
    const char *e = getenv("NOPAD_GPU_TEST_QUICK");
    return e && *e && strcmp(e, "0") != 0;
}

/* Lengths uniform in [1, max_len], with a 1 and a max_len among them whenever n_seqs allows. */
static int32_t *make_cu_seqlens(const attn_case *c, uint64_t *rng) {
    int32_t *cu = malloc((size_t)(c->n_seqs + 1) * sizeof *cu);
    cu[0] = 0;
    for (int32_t s = 0; s < c->n_seqs; s++) {
        int32_t len;
        if (c->skewed) len = s == c->n_seqs / 2 ? c->max_len : (c->max_len < 20 ? c->max_len : 20);
        else if (s == 0) len = c->max_len;
        else if (s == 1) len = 1;
        else len = 1 + (int32_t)(test_rand_u32(rng) % (uint32_t)c->max_len);
        cu[s + 1] = cu[s] + len;
    }
    return cu;
}

/* The attention workspace every GPU call gets (zeroed once in main, as nopad.h asks): the
 * persistent kernels count work items in it and must leave it zero. */
static void *g_workspace;

static void expect_workspace_zero(const char *when) {
    int32_t ws[NOPAD_ATTENTION_WORKSPACE_BYTES / 4];
    CUDA_OK(cudaMemcpy(ws, g_workspace, sizeof ws, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        if (ws[i] != 0) fail_msg("%s: workspace word %zu is %d, not 0", when, i, (int)ws[i]);
}

static void run_case(const attn_case *c, int32_t d, nopad_dtype dtype, int causal, uint64_t *rng) {
    int32_t *cu = make_cu_seqlens(c, rng);
    const int32_t B = c->n_seqs, T = cu[B], H = c->heads * d;
    const int64_t n_qkv = (int64_t)T * 3 * H, n_out = (int64_t)T * H, n_guard = 8 * (int64_t)H;
    float *qkv = malloc((size_t)n_qkv * sizeof(float));
    uint16_t *qkv16 = malloc((size_t)n_qkv * sizeof(uint16_t));
    test_fill_uniform(qkv, n_qkv, -2.0f, 2.0f, rng);
    for (int64_t i = 0; i < n_qkv; i++) {
        qkv16[i] = dtype == NOPAD_DTYPE_F16 ? f32_to_f16(qkv[i]) : test_f32_to_bf16(qkv[i]);
        qkv[i] = dtype == NOPAD_DTYPE_F16 ? f16_to_f32(qkv16[i]) : test_bf16_to_f32(qkv16[i]);
    }
    const float scale = 1.0f / sqrtf((float)d);

    float *want = malloc((size_t)n_out * sizeof(float));
    assert_nopad_ok(nopad_attention_varlen(NOPAD_DEVICE_CPU, NOPAD_DTYPE_F32, want, qkv, cu, B, T,
                                           c->max_len, c->heads, d, scale, causal, NULL, NULL));

    void *d_qkv, *d_out, *d_cu;
    CUDA_OK(cudaMalloc(&d_qkv, (size_t)n_qkv * 2));
    CUDA_OK(cudaMalloc(&d_out, (size_t)(n_out + n_guard) * 2));
    CUDA_OK(cudaMalloc(&d_cu, (size_t)(B + 1) * sizeof(int32_t)));
    CUDA_OK(cudaMemcpy(d_qkv, qkv16, (size_t)n_qkv * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_cu, cu, (size_t)(B + 1) * sizeof(int32_t), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_out, 0xFF, (size_t)(n_out + n_guard) * 2)); /* NaN poison */
    assert_nopad_ok(nopad_attention_varlen(NOPAD_DEVICE_CUDA, dtype, d_out, d_qkv, d_cu, B, T,
                                           c->max_len, c->heads, d, scale, causal, g_workspace, NULL));
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    expect_workspace_zero("after a call");

    uint16_t *got16 = malloc((size_t)(n_out + n_guard) * 2);
    float *got = malloc((size_t)n_out * sizeof(float));
    CUDA_OK(cudaMemcpy(got16, d_out, (size_t)(n_out + n_guard) * 2, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < n_out; i++)
        got[i] = dtype == NOPAD_DTYPE_F16 ? f16_to_f32(got16[i]) : test_bf16_to_f32(got16[i]);
    for (int64_t i = n_out; i < n_out + n_guard; i++)
        if (got16[i] != 0xFFFFu)
            fail_msg("d=%d B=%d max=%d causal=%d: element %lld past the output was written", d, B,
                     c->max_len, causal, (long long)(i - n_out));
    int64_t n_nan = 0;
    for (int64_t i = 0; i < n_out; i++) n_nan += isnan(got[i]) ? 1 : 0;
    const double err = test_max_row_rel_error(got, want, (int64_t)T * c->heads, d);
    const double bound = dtype == NOPAD_DTYPE_F16 ? 2e-3 : 1e-2;
    printf("  %s d=%3d heads=%d B=%3d max=%4d%s causal=%d T=%6d: row rel err %.2e%s\n",
           dtype == NOPAD_DTYPE_F16 ? "f16 " : "bf16", d, c->heads, B, c->max_len,
           c->skewed ? " skew" : "     ", causal, T, err, n_nan ? " NaN!" : "");
    if (n_nan || !(err <= bound))
        fail_msg("d=%d B=%d max=%d skew=%d causal=%d %s: %lld NaN (unwritten), row rel err %.3e > %.0e",
                 d, B, c->max_len, c->skewed, causal, dtype == NOPAD_DTYPE_F16 ? "f16" : "bf16",
                 (long long)n_nan, err, bound);

    /* a second call with the same workspace (the counter the first one left behind) and a
     * re-poisoned output gives the same bits */
    CUDA_OK(cudaMemset(d_out, 0xFF, (size_t)n_out * 2));
    assert_nopad_ok(nopad_attention_varlen(NOPAD_DEVICE_CUDA, dtype, d_out, d_qkv, d_cu, B, T,
                                           c->max_len, c->heads, d, scale, causal, g_workspace, NULL));
    uint16_t *again16 = malloc((size_t)n_out * 2);
    CUDA_OK(cudaMemcpy(again16, d_out, (size_t)n_out * 2, cudaMemcpyDeviceToHost));
    if (memcmp(again16, got16, (size_t)n_out * 2) != 0)
        fail_msg("d=%d B=%d max=%d causal=%d: a second call with the same workspace differs", d, B,
                 c->max_len, causal);
    expect_workspace_zero("after a second call");
    free(again16);

    CUDA_OK(cudaFree(d_qkv));
    CUDA_OK(cudaFree(d_out));
    CUDA_OK(cudaFree(d_cu));
    free(got16);
    free(got);
    free(want);
    free(qkv);
    free(qkv16);
    free(cu);
}

/* {1, 256}: T is exactly two 128-row tiles (every TMA box inside qkv); {4, 513}: one token past a
 * tile, just above the length where the dispatcher switches kernels; {1, 1}: T smaller than any tile */
static const attn_case full_cases[] = {
    {1, 1, 3, 0},     {1, 2048, 2, 0}, {200, 64, 3, 0}, {200, 300, 2, 0}, {7, 1000, 2, 0},
    {64, 2048, 2, 1}, {3, 129, 3, 0},  {5, 17, 4, 0},   {1, 256, 2, 0},   {4, 513, 2, 0},
};
static const attn_case quick_cases[] = {
    {1, 1, 2, 0}, {3, 129, 2, 0}, {6, 70, 2, 0}, {8, 150, 1, 1}, {2, 400, 1, 0},
};

/* NOPAD_GPU_TEST_D=64 (say): only that head size, so a sanitizer run can focus on one kernel */
static int head_size_selected(int32_t d) {
    const char *e = getenv("NOPAD_GPU_TEST_D");
    return !(e && *e) || atoi(e) == d;
}

static void run_grid(int32_t d, nopad_dtype dtype, uint64_t seed) {
    if (!head_size_selected(d)) {
        printf("  d=%d skipped (NOPAD_GPU_TEST_D)\n", d);
        return;
    }
    uint64_t rng = seed;
    const int quick = quick_mode();
    const attn_case *cases = quick ? quick_cases : full_cases;
    const int n = quick ? (int)(sizeof quick_cases / sizeof *quick_cases)
                        : (int)(sizeof full_cases / sizeof *full_cases);
    for (int i = 0; i < n; i++)
        for (int causal = 0; causal < 2; causal++) run_case(&cases[i], d, dtype, causal, &rng);
}

static void test_f16_d32(void **state) { run_grid(32, NOPAD_DTYPE_F16, 0x1234567ull); }
static void test_f16_d64(void **state) { run_grid(64, NOPAD_DTYPE_F16, 0x2345678ull); }
static void test_f16_d128(void **state) { run_grid(128, NOPAD_DTYPE_F16, 0x3456789ull); }
static void test_bf16_d32(void **state) { run_grid(32, NOPAD_DTYPE_BF16, 0x456789Aull); }
static void test_bf16_d64(void **state) { run_grid(64, NOPAD_DTYPE_BF16, 0x56789ABull); }
static void test_bf16_d128(void **state) { run_grid(128, NOPAD_DTYPE_BF16, 0x6789ABCull); }

static void test_unsupported(void **state) {
    void *p;
    CUDA_OK(cudaMalloc(&p, 4096));
    int32_t cu[2] = {0, 4};
    void *d_cu;
    CUDA_OK(cudaMalloc(&d_cu, sizeof cu));
    CUDA_OK(cudaMemcpy(d_cu, cu, sizeof cu, cudaMemcpyHostToDevice));
    assert_nopad_error(nopad_attention_varlen(NOPAD_DEVICE_CUDA, NOPAD_DTYPE_F16, p, p, d_cu, 1, 4, 4, 1,
                                              48, 1.0f, 0, NULL, NULL),
                       NOPAD_ERR_UNSUPPORTED, "head size 48");
    assert_nopad_error(nopad_attention_varlen(NOPAD_DEVICE_CUDA, NOPAD_DTYPE_F32, p, p, d_cu, 1, 4, 4, 1,
                                              64, 1.0f, 0, NULL, NULL),
                       NOPAD_ERR_UNSUPPORTED, "dtype");
    assert_nopad_error(nopad_attention_varlen(NOPAD_DEVICE_CUDA, NOPAD_DTYPE_F16, p, p, d_cu, 1, 4, 4, 1,
                                              64, 1.0f, 0, (char *)p + 4, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "8-byte aligned");
    CUDA_OK(cudaFree(p));
    CUDA_OK(cudaFree(d_cu));
}

int main(void) {
    if (test_skip_without_gpu()) return 77;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        printf("device: %s (sm_%d%d, %d SMs)%s\n", prop.name, prop.major, prop.minor,
               prop.multiProcessorCount, quick_mode() ? " [quick]" : "");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unsupported), cmocka_unit_test(test_f16_d64),
        cmocka_unit_test(test_f16_d32),     cmocka_unit_test(test_f16_d128),
        cmocka_unit_test(test_bf16_d64),    cmocka_unit_test(test_bf16_d32),
        cmocka_unit_test(test_bf16_d128),
    };
    if (cudaMalloc(&g_workspace, NOPAD_ATTENTION_WORKSPACE_BYTES) != cudaSuccess ||
        cudaMemset(g_workspace, 0, NOPAD_ATTENTION_WORKSPACE_BYTES) != cudaSuccess) {
        printf("cannot allocate the attention workspace\n");
        return 1;
    }
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    cudaFree(g_workspace);
    return failed;
}

/* FP8 E4M3 weights on CUDA (backend/cuda/quant/fp8.h, fp8_gemm.h; docs/fp8.md), against the host:
 *
 * quantize_tokens: the prompts' per-token quantizer, codes and scales equal bit for bit to
 * io/fp8.h's on the host (T in {1, 33, 130}, K in {16, 2064}, fp16 and bf16, rows of wide scales
 * and a row of zeros).
 *
 * gemm_q with NOPAD_WEIGHT_FP8_E4M3, fp16 and bf16, T in {1, 2, 7, 32, 33, 130, 512}, N in {1, 7,
 * 33, 64, 577} (odd N; 64 is a multiple of 16, where outer-vector scaling applies), K in {16, 48,
 * 1040}; random weights quantized per row on the host with row scales spread over 2^-8 .. 2^8, every
 * epilogue (none, bias, bias + each activation, bias + residual) and the float32 output. The
 * reference, in double, is the dequantised weights (code · scale) times:
 * - T <= 32 (the GEMV): the activations as given (rounded to the dtype). The products code · x are
 *   exact in fp32 (4 + 11 significant bits), summed by the tensor cores' fp32 accumulation, which
 *   truncates (up to 2^-23 of the magnitude summed) at each of the k8 stages of an m16n8k16 MMA
 *   (Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021), K/8 of them, then 8 warps'
 *   partial sums added (2^-24 each): E = (K/4 + 16)·2^-23 with a factor 2 to spare, times
 *   M = Σ_k |w_k·x_k| + |bias|;
 * - T > 32 (the GEMM): the activations quantized per token on the host (io/fp8.h, bit for bit what
 *   the device computes), dequantised. The FP8 products are exact; Hopper's FP8 MMAs keep about
 *   14 bits of their sums inside a k-block before cuBLASLt promotes them to fp32 (DeepSeek-V3's
 *   report, 3.3.2): E = 2^-12 (4x that). The outer-vector way rounds the scaled sum to the dtype
 *   before the epilogue's pass rounds again: one more u_out·|pre|.
 * and the output's own rounding: |got - ref| <= u_out·|ref| + 1.25·E·M + 2^-18·|pre| + floor, u_out
 * 2^-11 (fp16), 2^-8 (bf16), 0 (float32); 1.25 the activations' slopes; floor 2^-25 for fp16.
 * Both GEMM ways are forced in turn where they apply (outer-vector scaling: a dtype output, N a
 * multiple of 16; the GEMV of last resort, whose reference is the GEMV's): outer-vector scaling
 * refused by cuBLASLt is printed, not failed (AUTO falls back; the first H100 run, cuBLAS 13.1,
 * refused none), and AUTO's way is printed for N = 64 and 577;
 * T = 512 also runs in slices of tokens (the scratch cap made small). Outputs are NaN-poisoned
 * first: an unwritten one fails.
 *
 * GEMV against GEMM, T in {1, 7, 32}, outputs in the dtype: the same weights, the GEMM's
 * activations quantized; they differ by the activations' rounding: |Δ| <= Σ_k |w_k|·(|x_k|·2^-4 +
 * s_t·2^-10) (half an E4M3 step: 2^-4 relative, 2^-10·scale among the subnormals) plus both paths'
 * sum bounds above and each output's rounding.
 *
 * Decoders (tests/data/fp8): tiny_f8 (an F8_E4M3 checkpoint, kept FP8 on CUDA) against tiny_f8_ref
 * (the same weights dequantised, F32 on disk, fp16 on the device), and tiny_f8_ref with weights fp8
 * against tiny_f8_requant (its weights quantized per channel on the host and dequantised, fp16 on
 * the device): the GEMV paths within the fp16 bound, a prompt step within the activations' bound
 * (GEMV_BOUND, PROMPT_BOUND below); the weight groups say F8_E4M3 and count N·K + 4·N bytes (+ the
 * 16-byte padding); the device bytes. GPT-2 with weights fp8 refused.
 * SmolLM2-135M-Instruct's GGUF (NOPAD_SMOLLM2_GGUF, else skipped) with weights fp8 against f16: the
 * errors and bytes printed for docs/fp8.md, loose checks only.
 * No GPU: exit 77 (ctest: skipped). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "cuda_testutil.h"

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm/cublaslt.h"
#include "backend/cuda/quant/fp8.h"
#include "backend/cuda/quant/fp8_gemm.h"
#include "io/fp8.h"
#include "nopad.h"
#include "util/error.h"

static nopad_backend *gpu[2];
static const nopad_dtype DTYPES[2] = {NOPAD_DTYPE_F16, NOPAD_DTYPE_BF16};
static const char *const DTYPE_NAMES[2] = {"f16", "bf16"};
static const double U_DTYPE[2] = {0x1p-11, 0x1p-8};

static uint64_t rng = 0x9e3779b97f4a7c15ull;

/* Uniform in [-1, 1), never 0. */
static float rnd_unit(void) {
    const float v = (float)((int32_t)test_rand_u32(&rng) >> 8) / 8388608.0f;
    return v != 0.0f ? v : 0.5f;
}

static int failures;

/* The GEMV's sums: the relative error bound E of the file's comment. */
static double gemv_sum_error(int32_t K) { return (K / 4.0 + 16.0) * 0x1p-23; }
static int refusals; /* forced GEMM ways cuBLASLt refused (printed) */

/* ---- weights -------------------------------------------------------------------------------- */

typedef struct fp8_weight {
    uint8_t *packed; /* backend.h's layout: codes, padding, scales */
    size_t bytes;
    double *deq;     /* [N, K] code · scale */
    void *dev;
} fp8_weight;

static fp8_weight make_weight(nopad_backend *be, int32_t N, int32_t K) {
    fp8_weight w;
    float *f = calloc((size_t)N * K, sizeof *f);
    for (int32_t n = 0; n < N; n++) {
        const float row_scale = ldexpf(1.0f, (int)(test_rand_u32(&rng) % 17) - 8); /* 2^-8 .. 2^8 */
        for (int32_t k = 0; k < K; k++) f[(size_t)n * K + k] = row_scale * rnd_unit();
    }
    const size_t at = nopad_fp8_scales_offset(N, K);
    w.bytes = at + (size_t)N * sizeof(float);
    w.packed = calloc(w.bytes, 1);
    fp8_e4m3_quantize_rows(f, N, K, w.packed, (float *)(w.packed + at));
    w.deq = malloc((size_t)N * K * sizeof *w.deq);
    const float *scales = (const float *)(w.packed + at);
    for (int32_t n = 0; n < N; n++)
        for (int32_t k = 0; k < K; k++)
            w.deq[(size_t)n * K + k] = (double)fp8_e4m3_to_f32(w.packed[(size_t)n * K + k]) * scales[n];
    assert_nopad_ok(be->alloc(be, w.bytes, &w.dev));
    assert_nopad_ok(be->upload(be, w.dev, w.packed, w.bytes));
    free(f);
    return w;
}

static void free_weight(nopad_backend *be, fp8_weight *w) {
    be->free(be, w->dev);
    free(w->packed);
    free(w->deq);
}

/* x [T, K] quantized per token as the device does it (io/fp8.h), dequantised into xd; scales in xs. */
static void quantize_tokens_host(const float *x, int32_t T, int32_t K, double *xd, float *xs, uint8_t *codes) {
    uint8_t *q = codes ? codes : malloc((size_t)T * K);
    for (int32_t t = 0; t < T; t++) {
        float amax = 0.0f;
        for (int32_t k = 0; k < K; k++) amax = fmaxf(amax, fabsf(x[(size_t)t * K + k]));
        xs[t] = fp8_e4m3_scale(amax);
        for (int32_t k = 0; k < K; k++) {
            q[(size_t)t * K + k] = fp8_e4m3_from_f32(x[(size_t)t * K + k] / xs[t]);
            if (xd) xd[(size_t)t * K + k] = (double)fp8_e4m3_to_f32(q[(size_t)t * K + k]) * xs[t];
        }
    }
    if (!codes) free(q);
}

static void poison(nopad_backend *be, void *dev, size_t n, int f32) {
    float *nan = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    if (f32) assert_nopad_ok(be->upload(be, dev, nan, n * sizeof(float)));
    else assert_nopad_ok(be->upload_f32(be, dev, nan, n));
    assert_nopad_ok(be->synchronize(be));
    free(nan);
}

static double activate(double v, nopad_activation act) {
    switch (act) {
    case NOPAD_ACT_GELU: return 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
    case NOPAD_ACT_GELU_TANH: return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    case NOPAD_ACT_RELU: return v > 0 ? v : 0;
    case NOPAD_ACT_SILU: return v / (1.0 + exp(-v));
    case NOPAD_ACT_TANH: return tanh(v);
    default: return v;
    }
}

static const nopad_activation ACTS[] = {NOPAD_ACT_GELU, NOPAD_ACT_GELU_TANH, NOPAD_ACT_RELU, NOPAD_ACT_SILU,
                                        NOPAD_ACT_TANH};
enum { EP_NONE, EP_BIAS, EP_BIAS_ACT, EP_BIAS_RESIDUAL, EP_F32, N_EP };
static const char *const EP_NAMES[N_EP] = {"none", "bias", "bias+act", "bias+residual", "f32"};

/* ---- quantize_tokens ------------------------------------------------------------------------ */

static void test_quantize_tokens(void **state) {
    (void)state;
    static const int32_t Ts[] = {1, 33, 130}, Ks[] = {16, 2064};
    for (int di = 0; di < 2; di++)
        for (size_t ti = 0; ti < 3; ti++)
            for (size_t ki = 0; ki < 2; ki++) {
                nopad_backend *be = gpu[di];
                const int32_t T = Ts[ti], K = Ks[ki];
                float *x = malloc((size_t)T * K * sizeof *x), *xs = malloc((size_t)T * sizeof *xs);
                float *got_s = malloc((size_t)T * sizeof *got_s);
                uint8_t *q = malloc((size_t)T * K), *got_q = malloc((size_t)T * K);
                for (int32_t t = 0; t < T; t++) {
                    const float s = ldexpf(1.0f, (int)(test_rand_u32(&rng) % 25) - 12);
                    for (int32_t k = 0; k < K; k++) x[(size_t)t * K + k] = t == 1 ? 0.0f : s * rnd_unit();
                }
                void *dx = test_to_device(be, x, (size_t)T * K), *dq, *ds;
                assert_nopad_ok(be->alloc(be, (size_t)T * K, &dq));
                assert_nopad_ok(be->alloc(be, (size_t)T * sizeof(float), &ds));
                quantize_tokens_host(x, T, K, NULL, xs, q);
                assert_nopad_ok(cuda_fp8_quantize_tokens(DTYPES[di], dq, ds, dx, T, K, be->native_stream));
                assert_nopad_ok(be->download(be, got_q, dq, (size_t)T * K));
                assert_nopad_ok(be->download(be, got_s, ds, (size_t)T * sizeof(float)));
                if (memcmp(got_s, xs, (size_t)T * sizeof(float)) || memcmp(got_q, q, (size_t)T * K)) {
                    failures++;
                    for (int32_t i = 0; i < T * K; i++)
                        if (got_q[i] != q[i] || got_s[i / K] != xs[i / K]) {
                            printf("  quantize %s T %d K %d: [%d, %d] code 0x%02x scale %a, host 0x%02x %a\n",
                                   DTYPE_NAMES[di], T, K, i / K, i % K, got_q[i], (double)got_s[i / K], q[i],
                                   (double)xs[i / K]);
                            break;
                        }
                }
                be->free(be, dx);
                be->free(be, dq);
                be->free(be, ds);
                free(x);
                free(xs);
                free(got_s);
                free(q);
                free(got_q);
            }
    printf("  quantize_tokens: %d failing cases of 12\n", failures);
    assert_int_equal(failures, 0);
}

/* ---- gemm_q --------------------------------------------------------------------------------- */

static double compare_gemm(int di, int32_t T, int32_t K, int32_t N, int ep, nopad_activation act, const char *way,
                           const fp8_weight *wp, const float *x, const float *bias, const float *res, void *dout);

/* One gemm_q call against the reference; returns the worst |err| / bound (0 for a way cuBLASLt
 * does not run here, printed). */
static double check_gemm(int di, int32_t T, int32_t K, int32_t N, int ep, nopad_activation act, const char *way) {
    nopad_backend *be = gpu[di];
    fp8_weight w = make_weight(be, N, K);
    float *x = malloc((size_t)T * K * sizeof *x), *bias = malloc((size_t)N * sizeof *bias);
    float *res = malloc((size_t)T * N * sizeof *res);
    /* outputs of a few hundred at most (rows' scales up to 2^8, K up to 1040): x is scaled down to
     * keep fp16 far from its largest value */
    for (int64_t i = 0; i < (int64_t)T * K; i++) x[i] = rnd_unit() / 16.0f;
    for (int32_t n = 0; n < N; n++) bias[n] = rnd_unit();
    for (int64_t i = 0; i < (int64_t)T * N; i++) res[i] = rnd_unit();
    void *dx = test_to_device(be, x, (size_t)T * K), *db = test_to_device(be, bias, (size_t)N);
    void *dr = test_to_device(be, res, (size_t)T * N), *dout;
    const int f32 = ep == EP_F32;
    assert_nopad_ok(be->alloc(be, (size_t)T * N * (f32 ? 4 : 2), &dout));
    poison(be, dout, (size_t)T * N, f32);
    const nopad_epilogue epilogue = ep == EP_BIAS ? NOPAD_EPILOGUE_BIAS
                                    : ep == EP_BIAS_ACT ? NOPAD_EPILOGUE_BIAS_ACT
                                    : ep == EP_BIAS_RESIDUAL ? NOPAD_EPILOGUE_BIAS_RESIDUAL
                                                             : NOPAD_EPILOGUE_NONE;
    const nopad_status st = be->gemm_q(be, dout, dx, w.dev, NOPAD_WEIGHT_FP8_E4M3, db, dr, T, K, N, epilogue, act, f32);
    double worst = 0.0;
    if (st == NOPAD_ERR_UNSUPPORTED && way && strcmp(way, "outer-vec") == 0) {
        printf("    %s T %d K %d N %d, %s forced: %s (not available here)\n", DTYPE_NAMES[di], T, K, N, way,
               nopad_last_error());
        nopad_clear_error();
        refusals++;
    } else {
        assert_nopad_ok(st);
        worst = compare_gemm(di, T, K, N, ep, act, way, &w, x, bias, res, dout);
    }
    free_weight(be, &w);
    be->free(be, dx);
    be->free(be, db);
    be->free(be, dr);
    be->free(be, dout);
    free(x);
    free(bias);
    free(res);
    return worst;
}

/* check_gemm's comparison of the output dout with the reference. */
static double compare_gemm(int di, int32_t T, int32_t K, int32_t N, int ep, nopad_activation act, const char *way,
                           const fp8_weight *wp, const float *x, const float *bias, const float *res, void *dout) {
    nopad_backend *be = gpu[di];
    const fp8_weight w = *wp;
    const int f32 = ep == EP_F32;
    double worst = 0.0;
    float *got = malloc((size_t)T * N * sizeof *got);
    if (f32) assert_nopad_ok(be->download(be, got, dout, (size_t)T * N * sizeof(float)));
    else assert_nopad_ok(be->download_f32(be, got, dout, (size_t)T * N));
    /* the GEMM's activations are quantized; the GEMV's, also the GEMM's way of last resort, not */
    const int gemm = T > CUDA_FP8_GEMV_MAX_T && cuda_fp8_gemm_last_way() != CUDA_FP8_GEMM_GEMV;
    double *xd = malloc((size_t)T * K * sizeof *xd);
    float *xs = malloc((size_t)T * sizeof *xs);
    if (gemm) quantize_tokens_host(x, T, K, xd, xs, NULL);
    else
        for (int64_t i = 0; i < (int64_t)T * K; i++) xd[i] = x[i];
    const double u_out = f32 ? 0.0 : U_DTYPE[di];
    const double E = gemm ? 0x1p-12 : gemv_sum_error(K);
    const double floor = !f32 && DTYPES[di] == NOPAD_DTYPE_F16 ? 0x1p-25 : 0.0;
    const int outer_vec = gemm && cuda_fp8_gemm_last_way() == CUDA_FP8_GEMM_OUTER_VEC;
    for (int32_t t = 0; t < T; t++)
        for (int32_t n = 0; n < N; n++) {
            double dot = 0.0, mag = 0.0;
            for (int32_t k = 0; k < K; k++) {
                const double p = w.deq[(size_t)n * K + k] * xd[(size_t)t * K + k];
                dot += p;
                mag += fabs(p);
            }
            double pre = dot;
            if (ep != EP_NONE && ep != EP_F32) {
                pre += bias[n];
                mag += fabs(bias[n]);
            }
            double ref = ep == EP_BIAS_ACT ? activate(pre, act) : pre;
            if (ep == EP_BIAS_RESIDUAL) ref += res[(size_t)t * N + n];
            double bound = u_out * fabs(ref) + 1.25 * E * mag + 0x1p-18 * fabs(pre) + floor;
            if (outer_vec) bound += 1.25 * u_out * fabs(dot);
            const double v = got[(size_t)t * N + n], err = fabs(v - ref);
            const double ratio = !isfinite(v) ? INFINITY : err == 0.0 ? 0.0 : err / bound;
            if (!(ratio <= 1.0) && worst <= 1.0)
                printf("    %s T %d K %d N %d %s%s%s: y[%d, %d] = %.9g, want %.9g (|err| %.3g > %.3g)\n",
                       DTYPE_NAMES[di], T, K, N, EP_NAMES[ep], way ? " " : "", way ? way : "", t, n, v, ref, err,
                       bound);
            if (!(ratio <= worst)) worst = ratio;
        }
    free(xd);
    free(xs);
    free(got);
    return worst;
}

static const int32_t TOKENS[] = {1, 2, 7, 32, 33, 130, 512};
static const int32_t SHAPES[][2] = {{1, 16}, {7, 48}, {33, 1040}, {64, 48}, {577, 16}, {64, 1040}}; /* N, K */

static void test_gemm_q(void **state) {
    (void)state;
    int cases = 0, act_i = 0;
    for (int di = 0; di < 2; di++)
        for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++)
            for (size_t ti = 0; ti < sizeof TOKENS / sizeof TOKENS[0]; ti++)
                for (int ep = 0; ep < N_EP; ep++) {
                    const int32_t N = SHAPES[s][0], K = SHAPES[s][1], T = TOKENS[ti];
                    const nopad_activation act = ACTS[act_i++ % (sizeof ACTS / sizeof ACTS[0])];
                    const int gemm = T > CUDA_FP8_GEMV_MAX_T;
                    /* the GEMM every way: outer-vector scales where they apply (a dtype output, N a
                     * multiple of 16), the GEMV of last resort; T <= 32 the GEMV */
                    static const cuda_fp8_gemm_way WAYS[2] = {CUDA_FP8_GEMM_OUTER_VEC, CUDA_FP8_GEMM_GEMV};
                    static const char *const WAY_NAMES[2] = {"outer-vec", "gemv"};
                    for (int way = gemm ? 0 : 1; way < 2; way++) {
                        if (way == 0 && (ep == EP_F32 || N % 16 != 0)) continue;
                        cuda_fp8_gemm_force(gemm ? WAYS[way] : CUDA_FP8_GEMM_AUTO);
                        const double r = check_gemm(di, T, K, N, ep, act, gemm ? WAY_NAMES[way] : NULL);
                        cases++;
                        if (!(r <= 1.0)) failures++;
                    }
                }
    cuda_fp8_gemm_force(CUDA_FP8_GEMM_AUTO);
    /* slices of tokens: 512 tokens through a scratch of a few of them */
    cuda_fp8_set_scratch_cap(64 << 10);
    for (int di = 0; di < 2; di++)
        for (int ep = 0; ep < N_EP; ep++) {
            cases++;
            if (!(check_gemm(di, 512, 1040, 64, ep, NOPAD_ACT_SILU, "sliced") <= 1.0)) failures++;
        }
    cuda_fp8_set_scratch_cap(0);
    /* AUTO, for the record: the way it takes on a 16-multiple N and on an odd one */
    static const char *const WAY_SAID[3] = {"none", "outer-vector scales in cuBLASLt",
                                            "the FP8 GEMV over slices of 32 tokens"};
    for (int i = 0; i < 2; i++) {
        const int32_t N = i == 0 ? 64 : 577;
        cases++;
        if (!(check_gemm(0, 130, 1040, N, EP_BIAS, NOPAD_ACT_GELU, NULL) <= 1.0)) failures++;
        printf("  the FP8 GEMM's way here, N %d: %s\n", N, WAY_SAID[cuda_fp8_gemm_last_way()]);
    }
    printf("  gemm_q: %d failing cases of %d; %d forced outer-vector GEMMs refused (printed above)\n", failures, cases,
           refusals);
    assert_int_equal(failures, 0);
}

/* The GEMV (activations as they are) against the GEMM (activations quantized) on the same weights,
 * through cuda_fp8_gemv and cuda_fp8_gemm directly, T <= 32, outputs in the dtype (the GEMM's
 * outer-vector way; a float32 output would send it to the GEMV). */
static void test_gemv_against_gemm(void **state) {
    (void)state;
    cuda_lt lt;
    assert_nopad_ok(cuda_lt_init(&lt));
    cuda_fp8_gemm_force(CUDA_FP8_GEMM_AUTO);
    int gemm_was_gemv = 0;
    static const int32_t Ts[] = {1, 7, 32};
    double worst = 0.0, largest_gap = 0.0;
    for (int di = 0; di < 2; di++)
        for (size_t ti = 0; ti < 3; ti++) {
            nopad_backend *be = gpu[di];
            const int32_t T = Ts[ti], N = 576, K = 1040;
            fp8_weight w = make_weight(be, N, K);
            float *x = malloc((size_t)T * K * sizeof *x), *xs = malloc((size_t)T * sizeof *xs);
            float *a = malloc((size_t)T * N * sizeof *a), *b = malloc((size_t)T * N * sizeof *b);
            for (int64_t i = 0; i < (int64_t)T * K; i++) x[i] = rnd_unit() / 16.0f;
            void *dx = test_to_device(be, x, (size_t)T * K), *da, *db, *scratch;
            quantize_tokens_host(x, T, K, NULL, xs, NULL);
            assert_nopad_ok(be->alloc(be, (size_t)T * N * 2, &da));
            assert_nopad_ok(be->alloc(be, (size_t)T * N * 2, &db));
            assert_true(cudaMalloc(&scratch, cuda_fp8_gemm_scratch_bytes(T, K, N)) == cudaSuccess);
            assert_nopad_ok(be->synchronize(be));
            assert_nopad_ok(cuda_fp8_gemv(DTYPES[di], da, dx, w.dev, NULL, NULL, T, K, N, -1, 0, NULL));
            assert_nopad_ok(cuda_fp8_gemm(&lt, DTYPES[di], db, dx, w.dev, NULL, NULL, T, K, N, NOPAD_EPILOGUE_NONE,
                                          NOPAD_ACT_GELU, 0, scratch, NULL));
            assert_true(cudaDeviceSynchronize() == cudaSuccess);
            if (cuda_fp8_gemm_last_way() == CUDA_FP8_GEMM_GEMV) gemm_was_gemv = 1;
            assert_nopad_ok(be->download_f32(be, a, da, (size_t)T * N));
            assert_nopad_ok(be->download_f32(be, b, db, (size_t)T * N));
            for (int32_t t = 0; t < T; t++)
                for (int32_t n = 0; n < N; n++) {
                    double mag = 0.0, gap = 0.0;
                    for (int32_t k = 0; k < K; k++) {
                        const double wv = fabs(w.deq[(size_t)n * K + k]), xv = fabs(x[(size_t)t * K + k]);
                        mag += wv * xv;
                        gap += wv * (xv * 0x1p-4 + xs[t] * 0x1p-10);
                    }
                    /* both paths' sums, the GEMM's inputs bounded by mag · (1 + 2^-4), and each
                     * output rounded once to the dtype (|value| <= mag · (1 + 2^-4) + the sums'
                     * error, 1.25 to spare) */
                    const double bound = gap + (gemv_sum_error(K) + 0x1p-12 * 1.0625) * mag +
                                         2.0 * U_DTYPE[di] * 1.25 * mag;
                    const double d = fabs((double)a[(size_t)t * N + n] - b[(size_t)t * N + n]);
                    const double r = isfinite(d) ? d / bound : INFINITY;
                    if (!(r <= worst)) worst = r;
                    if (mag > 0 && d / mag > largest_gap) largest_gap = d / mag;
                }
            assert_true(cudaFree(scratch) == cudaSuccess);
            be->free(be, da);
            be->free(be, db);
            be->free(be, dx);
            free_weight(be, &w);
            free(x);
            free(xs);
            free(a);
            free(b);
        }
    cuda_lt_destroy(&lt);
    printf("  GEMV vs GEMM: worst |diff| / bound %.3f, largest |diff| / Σ|w·x| %.2e\n", worst, largest_gap);
    assert_true(worst <= 1.0);
    /* the GEMM's activations are quantized, the GEMV's are not: they must differ somewhere (the same
     * results would mean one path is not the one named), unless cuBLASLt refused the outer-vector
     * FP8 GEMM here and the GEMV stood in (printed) */
    if (gemm_was_gemv) printf("  cuBLASLt refused the outer-vector FP8 GEMM here: the GEMV stood in\n");
    else assert_true(largest_gap > 0.0);
}

static void test_supports(void **state) {
    (void)state;
    nopad_backend *be = gpu[0];
    assert_true(nopad_backend_runs_format(be, NOPAD_WEIGHT_FP8_E4M3, 16));
    assert_true(nopad_backend_runs_format(be, NOPAD_WEIGHT_FP8_E4M3, 4096));
    assert_false(nopad_backend_runs_format(be, NOPAD_WEIGHT_FP8_E4M3, 24));
    void *dummy;
    assert_nopad_ok(be->alloc(be, 4096, &dummy));
    assert_nopad_error(be->gemm_q(be, dummy, dummy, dummy, NOPAD_WEIGHT_FP8_E4M3, NULL, NULL, 1, 24, 8,
                                  NOPAD_EPILOGUE_NONE, NOPAD_ACT_GELU, 0),
                       NOPAD_ERR_UNSUPPORTED, "multiple of 16");
    assert_nopad_error(be->gemm_q(be, dummy, dummy, dummy, NOPAD_WEIGHT_FP8_E4M3, NULL, NULL, 40, 24, 8,
                                  NOPAD_EPILOGUE_NONE, NOPAD_ACT_GELU, 0),
                       NOPAD_ERR_UNSUPPORTED, "multiple of 16");
    be->free(be, dummy);
}

/* ---- decoders ------------------------------------------------------------------------------- */

static nopad_model *load_cuda(const char *rel, nopad_weights weights) {
    nopad_model_params p = nopad_model_default_params();
    p.device = NOPAD_DEVICE_CUDA;
    p.dtype = NOPAD_DTYPE_F16;
    p.weights = weights;
    nopad_model *m = NULL;
    assert_nopad_ok(nopad_model_load(test_data_path(rel), &p, &m));
    return m;
}

/* Logits of two models that compute with the same weight values (one FP8, one fp16 holding code ·
 * scale rounded to fp16, 2^-11): through the GEMV (prompts fed 16 tokens at a time, decode steps)
 * they differ by fp16 roundings, within test_cuda_decoder's fp16 bound. A prompt in one step (the
 * GEMM) quantizes every linear layer's activations per token, up to 2^-4 a value: on these random
 * models (hidden 32, heads of 32) that moves the logits by up to 0.242 (max row relative error
 * over 100 prompts of 31 tokens, in float64 on the host: scripts/make_fp8_fixtures.py --measure;
 * median 0.115), so 0.4. A misread scale moves them further: one matrix's row scales shifted by one
 * row moves them by 0.6 to 0.97 (the worst of 10 prompts, in float64; o_proj, down_proj or
 * gate_proj). */
static const double GEMV_BOUND = 2e-2, PROMPT_BOUND = 0.4;

typedef struct decoder_compare {
    double prompt, chunked, decode;
    int greedy_equal, greedy_total;
} decoder_compare;

/* Every position's logits of prompt `b` of cu into logits, fed in chunks of 16 tokens (the GEMV). */
static void feed_chunked(nopad_context *c, nopad_sequence *seq, const int32_t *cu, int b, const int32_t *ids,
                         int32_t V, float *logits) {
    for (int32_t t0 = cu[b]; t0 < cu[b + 1]; t0 += 16) {
        const int32_t n = cu[b + 1] - t0 < 16 ? cu[b + 1] - t0 : 16, chunk_cu[2] = {0, n};
        assert_nopad_ok(nopad_decode(c, 1, &seq, chunk_cu, ids + t0, 1, logits + (size_t)t0 * V));
    }
}

/* Every position's logits of two prompts (40 tokens) in one step (the GEMM: prompt) and fed in
 * chunks of 16 tokens (the GEMV: chunked), then 6 decode steps (the GEMV) after the chunked ones,
 * fed b's greedy ids, then 16 greedy tokens of each. */
static decoder_compare compare(nopad_model *a, nopad_model *b) {
    decoder_compare r = {0};
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(a, &info));
    const int32_t V = info.vocab_size, B = 2, cu[3] = {0, 9, 40};
    int32_t ids[40];
    for (int t = 0; t < 40; t++) ids[t] = (int32_t)(test_rand_u32(&rng) % (uint32_t)V);
    float *la = malloc((size_t)40 * V * sizeof *la), *lb = malloc((size_t)40 * V * sizeof *lb);
    nopad_context *ca = nopad_model_context(a), *cb = nopad_model_context(b);
    nopad_sequence *sa[2], *sb[2];
    for (int i = 0; i < B; i++) {
        assert_nopad_ok(nopad_sequence_create(ca, &sa[i]));
        assert_nopad_ok(nopad_sequence_create(cb, &sb[i]));
    }
    assert_nopad_ok(nopad_decode(ca, B, sa, cu, ids, 1, la));
    assert_nopad_ok(nopad_decode(cb, B, sb, cu, ids, 1, lb));
    r.prompt = test_max_row_rel_error(la, lb, 40, V);
    for (int i = 0; i < B; i++) { /* the decode steps continue from prompts fed through the GEMV */
        nopad_sequence_free(sa[i]);
        nopad_sequence_free(sb[i]);
        assert_nopad_ok(nopad_sequence_create(ca, &sa[i]));
        assert_nopad_ok(nopad_sequence_create(cb, &sb[i]));
        feed_chunked(ca, sa[i], cu, i, ids, V, la);
        feed_chunked(cb, sb[i], cu, i, ids, V, lb);
    }
    r.chunked = test_max_row_rel_error(la, lb, 40, V);
    const int32_t step_cu[3] = {0, 1, 2};
    int32_t next[2] = {cu[1] - 1, cu[2] - 1};
    for (int i = 0; i < B; i++) { /* each sequence's last prompt row, b's greedy id */
        int32_t best = 0;
        for (int32_t v = 1; v < V; v++)
            if (lb[(size_t)next[i] * V + v] > lb[(size_t)next[i] * V + best]) best = v;
        next[i] = best;
    }
    for (int s = 0; s < 6; s++) {
        assert_nopad_ok(nopad_decode(ca, B, sa, step_cu, next, 0, la));
        assert_nopad_ok(nopad_decode(cb, B, sb, step_cu, next, 0, lb));
        const double e = test_max_row_rel_error(la, lb, B, V);
        if (e > r.decode) r.decode = e;
        for (int i = 0; i < B; i++) {
            int32_t best = 0;
            for (int32_t v = 1; v < V; v++)
                if (lb[(size_t)i * V + v] > lb[(size_t)i * V + best]) best = v;
            next[i] = best;
        }
    }
    for (int i = 0; i < B; i++) {
        nopad_sequence_free(sa[i]);
        nopad_sequence_free(sb[i]);
    }
    enum { NEW = 16 };
    int32_t ga[2 * NEW], gb[2 * NEW];
    nopad_generate_params gp = nopad_generate_default_params();
    gp.max_tokens = NEW;
    gp.ignore_eos = 1;
    gp.sampling.temperature = 0.0f;
    assert_nopad_ok(nopad_generate(ca, B, cu, ids, &gp, ga, NULL, NULL, NULL));
    assert_nopad_ok(nopad_generate(cb, B, cu, ids, &gp, gb, NULL, NULL, NULL));
    for (int i = 0; i < B; i++)
        for (int k = 0; k < NEW && ga[i * NEW + k] == gb[i * NEW + k]; k++) r.greedy_equal++;
    r.greedy_total = B * NEW;
    free(la);
    free(lb);
    return r;
}

/* The FP8 groups of a model: their count and bytes (the codes, the scales and the padding). */
static void expect_fp8_groups(nopad_model *m, int64_t want_params) {
    nopad_weight_group g[32];
    const int32_t n = nopad_model_weight_groups(m, g, 32);
    int64_t bytes = 0;
    int groups = 0;
    for (int32_t i = 0; i < n; i++)
        if (strcmp(g[i].format, "F8_E4M3") == 0) {
            groups++;
            bytes += (int64_t)g[i].bytes;
            printf("    %-12s F8_E4M3 (stored %s) %d tensors, %zu bytes\n", g[i].name, g[i].stored, g[i].n_tensors,
                   g[i].bytes);
        }
    assert_int_equal(groups >= 4, 1); /* attn_qkv, attn_output, ffn_gate_up, ffn_down */
    /* one byte a weight, 4 a row of scales, under 16 of padding a matrix (8 of them) */
    assert_true(bytes >= want_params && bytes <= want_params + want_params / 8 + 8 * 16);
}

static void test_decoders(void **state) {
    (void)state;
    /* the linear weights of the fixtures: 2 layers of q 128x32, k, v 64x32, o 32x128, gate, up 96x32,
     * down 32x96 */
    const int64_t linear_params = 2 * (128 * 32 + 2 * 64 * 32 + 32 * 128 + 2 * 96 * 32 + 32 * 96);
    nopad_model *f8 = load_cuda("fp8/tiny_f8", NOPAD_WEIGHTS_AUTO);
    nopad_model *ref = load_cuda("fp8/tiny_f8_ref", NOPAD_WEIGHTS_F16);
    printf("  tiny_f8 (F8_E4M3 on disk) on CUDA:\n");
    expect_fp8_groups(f8, linear_params);
    decoder_compare r = compare(f8, ref);
    printf("  F8 checkpoint vs its dequantised twin in fp16: prompt logits %.2e (bound %.2g), chunked %.2e and "
           "decode %.2e (bound %.2g), greedy %d / %d equal\n",
           r.prompt, PROMPT_BOUND, r.chunked, r.decode, GEMV_BOUND, r.greedy_equal, r.greedy_total);
    assert_true(r.prompt <= PROMPT_BOUND);
    assert_true(r.chunked <= GEMV_BOUND);
    assert_true(r.decode <= GEMV_BOUND);
    nopad_model_free(f8);
    /* weights fp8: the same codes and scales as tiny_f8_requant holds dequantised (test_fp8 checks
     * them against io/fp8.c on the host) */
    nopad_model *q = load_cuda("fp8/tiny_f8_ref", NOPAD_WEIGHTS_FP8);
    nopad_model *requant = load_cuda("fp8/tiny_f8_requant", NOPAD_WEIGHTS_F16);
    printf("  tiny_f8_ref with weights fp8:\n");
    expect_fp8_groups(q, linear_params);
    r = compare(q, requant);
    printf("  weights fp8 vs the requantized weights in fp16: prompt logits %.2e (bound %.2g), chunked %.2e and "
           "decode %.2e (bound %.2g), greedy %d / %d equal\n",
           r.prompt, PROMPT_BOUND, r.chunked, r.decode, GEMV_BOUND, r.greedy_equal, r.greedy_total);
    assert_true(r.prompt <= PROMPT_BOUND);
    assert_true(r.chunked <= GEMV_BOUND);
    assert_true(r.decode <= GEMV_BOUND);
    r = compare(q, ref);
    printf("  weights fp8 vs f16, for the record (in float64 on the host FP8 weights move this random model's "
           "logits by up to 0.084, with FP8 activations 0.27): prompt %.2e, chunked %.2e, decode %.2e, greedy %d / %d "
           "equal\n",
           r.prompt, r.chunked, r.decode, r.greedy_equal, r.greedy_total);
    size_t bytes_q, bytes_ref, work, backend;
    assert_nopad_ok(nopad_model_memory(q, &bytes_q, &work, &backend));
    assert_nopad_ok(nopad_model_memory(ref, &bytes_ref, &work, &backend));
    printf("  weights on the device: fp8 %zu bytes, f16 %zu bytes\n", bytes_q, bytes_ref);
    /* the linear weights' fp16 bytes halved (less the scales); the rest as it was */
    assert_true(bytes_q < bytes_ref && bytes_ref - bytes_q >= (size_t)linear_params / 2);
    nopad_model_free(q);
    nopad_model_free(requant);
    nopad_model_free(ref);
    /* GPT-2 is refused outright */
    nopad_model_params p = nopad_model_default_params();
    p.device = NOPAD_DEVICE_CUDA;
    p.dtype = NOPAD_DTYPE_F16;
    p.weights = NOPAD_WEIGHTS_FP8;
    nopad_model *m = NULL;
    assert_nopad_error(nopad_model_load(test_data_path("models/gpt2_dec"), &p, &m), NOPAD_ERR_UNSUPPORTED,
                       "fp8 weights are for the LLaMA family");
}

/* SmolLM2-135M-Instruct (NOPAD_SMOLLM2_GGUF, else skipped), a trained model: weights fp8 against f16,
 * for the record (printed: the logits' error of a prompt step and of decode steps, greedy ids, the
 * bytes), asserting only what must hold whatever the model: the FP8 weights take less memory, and
 * the logits stay within 0.5 (a misread weight gives order 1; the measured values go in
 * docs/fp8.md). */
static void test_smollm2(void **state) {
    (void)state;
    const char *path = getenv("NOPAD_SMOLLM2_GGUF");
    FILE *file = path ? fopen(path, "rb") : NULL;
    if (!file) {
        printf("  NOPAD_SMOLLM2_GGUF not set: skipped\n");
        skip();
    }
    fclose(file);
    nopad_model_params p = nopad_model_default_params();
    p.device = NOPAD_DEVICE_CUDA;
    p.dtype = NOPAD_DTYPE_F16;
    nopad_model *m[2] = {NULL, NULL};
    p.weights = NOPAD_WEIGHTS_FP8;
    assert_nopad_ok(nopad_model_load(path, &p, &m[0]));
    p.weights = NOPAD_WEIGHTS_F16;
    assert_nopad_ok(nopad_model_load(path, &p, &m[1]));
    size_t bytes[2], work, backend;
    for (int i = 0; i < 2; i++) assert_nopad_ok(nopad_model_memory(m[i], &bytes[i], &work, &backend));
    const decoder_compare r = compare(m[0], m[1]);
    printf("  SmolLM2 weights fp8 vs f16: prompt logits %.2e, chunked %.2e, decode %.2e, greedy %d / %d equal; "
           "weights %.1f MB vs %.1f MB\n",
           r.prompt, r.chunked, r.decode, r.greedy_equal, r.greedy_total, bytes[0] / 1e6, bytes[1] / 1e6);
    assert_true(bytes[0] < bytes[1]);
    assert_true(r.prompt <= 0.5 && r.chunked <= 0.5 && r.decode <= 0.5);
    nopad_model_free(m[0]);
    nopad_model_free(m[1]);
}

int main(void) {
    if (test_skip_without_gpu()) return 77;
    for (int d = 0; d < 2; d++)
        if (nopad_backend_cuda_create(DTYPES[d], 0, NULL, &gpu[d]) != NOPAD_OK) return 1;
    if (getenv("NOPAD_TEST_FILTER")) cmocka_set_test_filter(getenv("NOPAD_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_supports),
        cmocka_unit_test(test_quantize_tokens),
        cmocka_unit_test(test_gemm_q),
        cmocka_unit_test(test_gemv_against_gemm),
        cmocka_unit_test(test_decoders),
        cmocka_unit_test(test_smollm2),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int d = 0; d < 2; d++) gpu[d]->destroy(gpu[d]);
    return rc;
}

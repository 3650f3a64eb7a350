/* cuda_gemm_fused (CUTLASS, epilogue fused) and cuda_gemm_skinny (few tokens, one kernel) against
 * an fp32 CPU reference.
 *
 * y[T, N] = x[T, K] · w[N, K]ᵀ + bias[N], then exact-erf GELU or + residual[T, N], in fp16 and
 * bf16, on random data (never zeros), for T in {1, 7, 128, 1000, 4352} and the BERT-base and
 * BERT-large layer shapes; every tile configuration on a few shapes; NULL bias; unsupported
 * shapes and pointers; a CUDA-graph capture; and cu_linear under each NOPAD_GEMM mode.
 * Inputs are rounded to the GPU dtype first, so both sides multiply the same numbers; the CPU
 * reference is the CPU backend's fp32 GEMM (OpenBLAS) with the epilogue in double.
 * Bounds, max over rows of ||y_r - ref_r|| / ||ref_r||: fp16 2e-3 and bf16 1.5e-2 — the one
 * output rounding (fp16 keeps 11 significant bits: at most 4.9e-4 relative per element; bf16 8
 * bits: 3.9e-3) plus fp32 accumulation-order differences (~1e-6 at K = 4096), with margin.
 * Outputs are NaN-poisoned before every call, so an unwritten element fails.
 * The skinny GEMM: T from 1 to its limit of 256 (one and several 64-token tiles), every epilogue
 * and activation, K not a multiple of 16 (a zero-filled slice tail), one and many K slices; it
 * must give identical bits twice. Same bounds. Its LayerNorm variant: the stored LayerNorm against
 * a double reference and y against the CPU GEMM of that stored LayerNorm, same bounds (the
 * LayerNorm output is rounded once, like y), rows with means far from zero. Its attention
 * variant: y against the CPU GEMM of the CPU attention op's output (rounded to the dtype), bounds
 * 1.5x (P is rounded too), on batches of 1 to 64 tokens and 1 to 26 sequences.
 * No GPU: exit 77 (ctest: skipped); built without CUTLASS, the fused tests skip.
 * NOPAD_GPU_TEST_QUICK=1 leaves out T = 4352. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm_fused.h"
#include "backend/cuda/gemm_skinny.h"
#include "testutil.h"

static nopad_backend *cpu;
static nopad_backend *gpu[2];
static cudaStream_t streams[2]; /* gpu[d] runs on streams[d] */
static const nopad_dtype DTYPES[2] = {NOPAD_DTYPE_F16, NOPAD_DTYPE_BF16};
static const char *const DTYPE_NAMES[2] = {"f16", "bf16"};
static const double BOUND[2] = {2e-3, 1.5e-2};
static const char *const EP_NAMES[3] = {"bias", "bias+gelu_erf", "bias+residual"};

/* (K, N) of a BERT layer's GEMMs: qkv, attention out, FFN in, FFN out; base then large. */
static const int32_t SHAPES[8][2] = {{768, 2304},  {768, 768},   {768, 3072},  {3072, 768},
                                     {1024, 3072}, {1024, 1024}, {1024, 4096}, {4096, 1024}};

/* Uploads host floats to a fresh device tensor of be's dtype and rewrites the host copy with the
 * rounded values, so the reference computes on exactly what the GPU sees. */
static void *to_device(nopad_backend *be, float *host, size_t n) {
    void *dev;
    assert_nopad_ok(be->alloc(be, n * 2, &dev));
    assert_nopad_ok(be->upload_f32(be, dev, host, n));
    assert_nopad_ok(be->download_f32(be, host, dev, n));
    return dev;
}

static void poison(nopad_backend *be, void *dev, size_t n) {
    float *nan = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    assert_nopad_ok(be->upload_f32(be, dev, nan, n));
    free(nan);
}

static float *random_floats(size_t n, float lo, float hi, uint64_t *rng) {
    float *x = malloc(n * sizeof(float));
    test_fill_uniform(x, (int64_t)n, lo, hi, rng);
    return x;
}

/* ref[T, N] = epilogue(acc) in double, acc = x · wᵀ in fp32 from the CPU backend. */
static void reference(float *ref, const float *acc, const float *bias, const float *res, int32_t T,
                      int32_t N, cuda_gemm_epilogue ep) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            double v = (double)acc[t * N + n] + (bias ? bias[n] : 0.0);
            if (ep == CUDA_GEMM_BIAS_GELU_ERF) v = 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
            if (ep == CUDA_GEMM_BIAS_RESIDUAL) v += res[t * N + n];
            ref[t * N + n] = (float)v;
        }
}

/* One problem: random x, w, bias, residual of the given shape in memory of gpu[d]. */
typedef struct problem {
    int32_t T, K, N;
    float *x, *w, *bias, *res, *acc; /* host, rounded to the dtype */
    void *dx, *dw, *dbias, *dres, *dy;
} problem;

static void problem_make(problem *p, int d, int32_t T, int32_t K, int32_t N, uint64_t *rng) {
    nopad_backend *be = gpu[d];
    memset(p, 0, sizeof *p);
    p->T = T, p->K = K, p->N = N;
    /* |w| ~ sqrt(3/K): outputs of order 1, where GELU is far from linear */
    const float ws = sqrtf(3.0f / (float)K);
    p->x = random_floats((size_t)T * K, -1.0f, 1.0f, rng);
    p->w = random_floats((size_t)N * K, -ws, ws, rng);
    p->bias = random_floats((size_t)N, -0.5f, 0.5f, rng);
    p->res = random_floats((size_t)T * N, -1.0f, 1.0f, rng);
    p->dx = to_device(be, p->x, (size_t)T * K);
    p->dw = to_device(be, p->w, (size_t)N * K);
    p->dbias = to_device(be, p->bias, (size_t)N);
    p->dres = to_device(be, p->res, (size_t)T * N);
    assert_nopad_ok(be->alloc(be, (size_t)T * N * 2, &p->dy));
    p->acc = malloc((size_t)T * N * sizeof(float));
    assert_nopad_ok(cpu->linear(cpu, p->acc, p->x, p->w, NULL, NULL, T, K, N, NOPAD_EPILOGUE_NONE,
                                NOPAD_ACT_GELU));
}

static void problem_free(problem *p, int d) {
    nopad_backend *be = gpu[d];
    be->free(be, p->dx), be->free(be, p->dw), be->free(be, p->dbias), be->free(be, p->dres);
    be->free(be, p->dy);
    free(p->x), free(p->w), free(p->bias), free(p->res), free(p->acc);
}

static void skip_without_cutlass(void) {
    if (!cuda_gemm_fused_available()) {
        printf("built without CUTLASS: no fused GEMMs to test\n");
        skip();
    }
}

/* Runs the fused GEMM (config, or auto) on a poisoned output and returns the row error. */
static double check(problem *p, int d, cuda_gemm_epilogue ep, int config, int with_bias) {
    nopad_backend *be = gpu[d];
    const size_t n = (size_t)p->T * p->N;
    poison(be, p->dy, n);
    assert_nopad_ok(cuda_gemm_fused_config(DTYPES[d], p->dy, p->dx, p->dw, with_bias ? p->dbias : NULL,
                                           p->dres, p->T, p->K, p->N, ep, config,
                                           streams[d]));
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    float *y = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
    assert_nopad_ok(be->download_f32(be, y, p->dy, n));
    reference(ref, p->acc, with_bias ? p->bias : NULL, p->res, p->T, p->N, ep);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(y[i])) fail_msg("%s %s T %d K %d N %d config %d: y[%zu] = %g (unwritten?)",
                                      DTYPE_NAMES[d], EP_NAMES[ep], p->T, p->K, p->N, config, i, y[i]);
    const double err = test_max_row_rel_error(y, ref, p->T, p->N);
    free(y), free(ref);
    if (!(err <= BOUND[d]))
        fail_msg("%s %s T %d K %d N %d config %d: row rel err %.3g > %.3g", DTYPE_NAMES[d],
                 EP_NAMES[ep], p->T, p->K, p->N, config, err, BOUND[d]);
    return err;
}

static void test_shapes(void **state) {
    skip_without_cutlass();
    const int32_t Ts[] = {1, 7, 128, 1000, 4352};
    const int n_T = getenv("NOPAD_GPU_TEST_QUICK") ? 4 : 5;
    uint64_t rng = 0x6e6f706164676d6dULL;
    for (int d = 0; d < 2; d++) {
        double worst[3] = {0, 0, 0};
        for (int ti = 0; ti < n_T; ti++)
            for (int si = 0; si < 8; si++) {
                problem p;
                problem_make(&p, d, Ts[ti], SHAPES[si][0], SHAPES[si][1], &rng);
                for (int ep = 0; ep < 3; ep++) {
                    const double err = check(&p, d, (cuda_gemm_epilogue)ep, CUDA_GEMM_CONFIG_AUTO, 1);
                    if (err > worst[ep]) worst[ep] = err;
                }
                problem_free(&p, d);
            }
        for (int ep = 0; ep < 3; ep++)
            printf("%s %-14s worst row rel err %.3g (bound %.3g)\n", DTYPE_NAMES[d], EP_NAMES[ep],
                   worst[ep], BOUND[d]);
    }
}

/* Every compiled tile configuration, whichever auto picks: partial tiles in M and N included. */
static void test_every_config(void **state) {
    skip_without_cutlass();
    const int32_t cases[][3] = {{7, 768, 3072}, {1000, 3072, 768}, {300, 1024, 1032}, {1, 4096, 1024}};
    uint64_t rng = 0x636f6e666967ULL;
    for (int d = 0; d < 2; d++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            problem p;
            problem_make(&p, d, cases[c][0], cases[c][1], cases[c][2], &rng);
            for (int cfg = 0; cfg < cuda_gemm_fused_n_configs(); cfg++)
                for (int ep = 0; ep < 3; ep++) check(&p, d, (cuda_gemm_epilogue)ep, cfg, 1);
            check(&p, d, CUDA_GEMM_BIAS, CUDA_GEMM_CONFIG_AUTO, 0); /* bias NULL: none added */
            check(&p, d, CUDA_GEMM_BIAS_GELU_ERF, CUDA_GEMM_CONFIG_AUTO, 0);
            problem_free(&p, d);
        }
}

static void test_unsupported(void **state) {
    skip_without_cutlass();
    uint64_t rng = 7;
    problem p;
    problem_make(&p, 0, 16, 64, 64, &rng);
    cudaStream_t s = streams[0];
    /* K or N not a multiple of 8: the caller falls back to cuBLASLt */
    assert_nopad_error(cuda_gemm_fused(NOPAD_DTYPE_F16, p.dy, p.dx, p.dw, p.dbias, NULL, 16, 60, 64,
                                       CUDA_GEMM_BIAS, s), NOPAD_ERR_UNSUPPORTED, "multiples of 8");
    assert_nopad_error(cuda_gemm_fused(NOPAD_DTYPE_F16, p.dy, p.dx, p.dw, p.dbias, NULL, 16, 64, 36,
                                       CUDA_GEMM_BIAS, s), NOPAD_ERR_UNSUPPORTED, "multiples of 8");
    /* a view one element in: not 16-byte aligned */
    assert_nopad_error(cuda_gemm_fused(NOPAD_DTYPE_F16, p.dy, (char *)p.dx + 2, p.dw, p.dbias, NULL, 8,
                                       64, 64, CUDA_GEMM_BIAS, s), NOPAD_ERR_UNSUPPORTED, "aligned");
    assert_nopad_error(cuda_gemm_fused(NOPAD_DTYPE_F16, p.dy, p.dx, p.dw, p.dbias, NULL, 16, 64, 64,
                                       CUDA_GEMM_BIAS_RESIDUAL, s), NOPAD_ERR_INVALID_ARGUMENT, "residual");
    assert_nopad_error(cuda_gemm_fused(NOPAD_DTYPE_F32, p.dy, p.dx, p.dw, p.dbias, NULL, 16, 64, 64,
                                       CUDA_GEMM_BIAS, s), NOPAD_ERR_UNSUPPORTED, "dtype");
    problem_free(&p, 0);
}

/* The call records into a CUDA graph (thread-local capture, as the backend records forwards):
 * no allocation, no synchronisation, nothing that capture refuses. */
static void test_graph_capture(void **state) {
    skip_without_cutlass();
    uint64_t rng = 11;
    for (int d = 0; d < 2; d++) {
        problem p;
        problem_make(&p, d, 1000, 768, 3072, &rng);
        cudaStream_t s = streams[d];
        poison(gpu[d], p.dy, (size_t)p.T * p.N);
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        nopad_status st = cuda_gemm_fused(DTYPES[d], p.dy, p.dx, p.dw, p.dbias, NULL, p.T, p.K, p.N,
                                          CUDA_GEMM_BIAS_GELU_ERF, s);
        assert_int_equal(cudaStreamEndCapture(s, &graph), cudaSuccess);
        assert_nopad_ok(st);
        assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        assert_int_equal(cudaGraphLaunch(exec, s), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        const size_t n = (size_t)p.T * p.N;
        float *y = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
        assert_nopad_ok(gpu[d]->download_f32(gpu[d], y, p.dy, n));
        reference(ref, p.acc, p.bias, NULL, p.T, p.N, CUDA_GEMM_BIAS_GELU_ERF);
        const double err = test_max_row_rel_error(y, ref, p.T, p.N);
        printf("%s graph replay: row rel err %.3g\n", DTYPE_NAMES[d], err);
        assert_true(err <= BOUND[d]);
        free(y), free(ref);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        problem_free(&p, d);
    }
}

/* cu_linear (the backend's linear op) under each mode gives the CPU backend's result: the hook
 * passes bias and residual through and maps the op's epilogues to the fused ones. */
static void test_backend_modes(void **state) {
    skip_without_cutlass();
    const cuda_gemm_mode modes[3] = {CUDA_GEMM_MODE_CUBLASLT, CUDA_GEMM_MODE_CUTLASS, CUDA_GEMM_MODE_AUTO};
    const nopad_epilogue eps[4] = {NOPAD_EPILOGUE_NONE, NOPAD_EPILOGUE_BIAS, NOPAD_EPILOGUE_BIAS_ACT,
                                   NOPAD_EPILOGUE_BIAS_RESIDUAL};
    const int32_t shapes[][3] = {{130, 768, 3072}, {5, 1024, 4096}, {77, 36, 100}};
    uint64_t rng = 13;
    const cuda_gemm_mode saved = cuda_gemm_get_mode();
    for (int d = 0; d < 2; d++)
        for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
            problem p;
            problem_make(&p, d, shapes[c][0], shapes[c][1], shapes[c][2], &rng);
            const size_t n = (size_t)p.T * p.N;
            float *y = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
            for (int m = 0; m < 3; m++)
                for (int e = 0; e < 4; e++) {
                    cuda_gemm_set_mode(modes[m]);
                    poison(gpu[d], p.dy, n);
                    assert_nopad_ok(gpu[d]->linear(gpu[d], p.dy, p.dx, p.dw, p.dbias, p.dres, p.T, p.K, p.N,
                                                   eps[e], NOPAD_ACT_GELU));
                    assert_nopad_ok(cpu->linear(cpu, ref, p.x, p.w, p.bias, p.res, p.T, p.K, p.N, eps[e],
                                                NOPAD_ACT_GELU));
                    assert_nopad_ok(gpu[d]->download_f32(gpu[d], y, p.dy, n));
                    const double err = test_max_row_rel_error(y, ref, p.T, p.N);
                    if (!(err <= BOUND[d]))
                        fail_msg("%s mode %d epilogue %d T %d K %d N %d: row rel err %.3g", DTYPE_NAMES[d],
                                 (int)modes[m], (int)eps[e], p.T, p.K, p.N, err);
                }
            free(y), free(ref);
            problem_free(&p, d);
        }
    cuda_gemm_set_mode(saved);
}

/* ---- the skinny GEMM ------------------------------------------------------------------------ */

/* ref[T, N] = act(acc + bias) + residual in double; act < 0: none. */
static void skinny_reference(float *ref, const float *acc, const float *bias, const float *res,
                             int32_t T, int32_t N, int act) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            double v = (double)acc[t * N + n] + (bias ? bias[n] : 0.0);
            if (act == NOPAD_ACT_GELU) v = 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
            if (act == NOPAD_ACT_GELU_TANH)
                v = 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
            if (act == NOPAD_ACT_RELU) v = v > 0.0 ? v : 0.0;
            if (res) v += res[t * N + n];
            ref[t * N + n] = (float)v;
        }
}

/* Runs the skinny GEMM twice on a poisoned output; both runs must match bit for bit; returns
 * the row error against the reference. with_residual 2: the residual is y itself (aliasing). */
static double skinny_check(problem *p, int d, int with_bias, int act, int with_residual) {
    nopad_backend *be = gpu[d];
    const size_t n = (size_t)p->T * p->N;
    float *y = malloc(n * sizeof(float)), *y2 = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
    const void *dres = with_residual == 1 ? p->dres : with_residual == 2 ? p->dy : NULL;
    for (int run = 0; run < 2; run++) {
        if (with_residual == 2) {
            assert_nopad_ok(be->upload_f32(be, p->dy, p->res, n)); /* y starts as the residual */
        } else {
            poison(be, p->dy, n);
        }
        assert_nopad_ok(cuda_gemm_skinny(DTYPES[d], p->dy, p->dx, p->dw, with_bias ? p->dbias : NULL, dres,
                                         p->T, p->K, p->N, act, streams[d]));
        assert_int_equal(cudaGetLastError(), cudaSuccess);
        assert_nopad_ok(be->download_f32(be, run ? y2 : y, p->dy, n));
    }
    if (memcmp(y, y2, n * sizeof(float)) != 0)
        fail_msg("%s skinny T %d K %d N %d act %d: two runs differ", DTYPE_NAMES[d], p->T, p->K, p->N, act);
    skinny_reference(ref, p->acc, with_bias ? p->bias : NULL, with_residual ? p->res : NULL, p->T, p->N, act);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(y[i]))
            fail_msg("%s skinny T %d K %d N %d act %d: y[%zu] = %g (unwritten?)", DTYPE_NAMES[d], p->T,
                     p->K, p->N, act, i, y[i]);
    const double err = test_max_row_rel_error(y, ref, p->T, p->N);
    if (!(err <= BOUND[d]))
        fail_msg("%s skinny T %d K %d N %d act %d bias %d residual %d: row rel err %.3g > %.3g",
                 DTYPE_NAMES[d], p->T, p->K, p->N, act, with_bias, with_residual, err, BOUND[d]);
    free(y), free(y2), free(ref);
    return err;
}

static void test_skinny_shapes(void **state) {
    /* T: 1, odd, one full 64-token tile, one past it, several tiles, the limit */
    const int32_t Ts[] = {1, 7, 26, 64, 65, 130, 256};
    const int n_T = getenv("NOPAD_GPU_TEST_QUICK") ? 5 : 7;
    uint64_t rng = 0x736b696e6e79ULL;
    for (int d = 0; d < 2; d++) {
        double worst = 0.0;
        for (int ti = 0; ti < n_T; ti++)
            for (int si = 0; si < 8; si++) {
                if (!cuda_gemm_skinny_supported(Ts[ti], SHAPES[si][0], SHAPES[si][1])) continue;
                problem p;
                problem_make(&p, d, Ts[ti], SHAPES[si][0], SHAPES[si][1], &rng);
                /* the encoder's epilogues: bias (qkv), bias + GELU (FFN in), none (before LayerNorm) */
                double e = skinny_check(&p, d, 1, -1, 0);
                if (e > worst) worst = e;
                e = skinny_check(&p, d, 1, NOPAD_ACT_GELU, 0);
                if (e > worst) worst = e;
                e = skinny_check(&p, d, 0, -1, 0);
                if (e > worst) worst = e;
                problem_free(&p, d);
            }
        printf("%s skinny worst row rel err %.3g (bound %.3g)\n", DTYPE_NAMES[d], worst, BOUND[d]);
    }
}

/* Every epilogue and activation, a residual that is y itself, K with a zero-filled slice tail
 * (200 and 776: not multiples of 16), one K slice (K = 8: half of it zeros), slices of 16
 * (K = 64 on one 64-feature tile: four of them), eight slices (K = 3072), several token tiles. */
static void test_skinny_epilogues(void **state) {
    const int32_t cases[][3] = {{26, 200, 192}, {1, 64, 64}, {100, 8, 128}, {64, 3072, 768}, {200, 776, 320}};
    uint64_t rng = 0x65706973ULL;
    for (int d = 0; d < 2; d++) {
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            problem p;
            problem_make(&p, d, cases[c][0], cases[c][1], cases[c][2], &rng);
            for (int act = -1; act <= NOPAD_ACT_RELU; act++) skinny_check(&p, d, 1, act, 0);
            skinny_check(&p, d, 1, -1, 1);
            skinny_check(&p, d, 1, -1, 2);
            skinny_check(&p, d, 0, NOPAD_ACT_GELU, 1);
            problem_free(&p, d);
        }
    }
}

static void test_skinny_unsupported(void **state) {
    uint64_t rng = 17;
    problem p;
    problem_make(&p, 0, 16, 64, 64, &rng);
    cudaStream_t s = streams[0];
    assert_false(cuda_gemm_skinny_supported(257, 768, 768));
    assert_false(cuda_gemm_skinny_supported(0, 768, 768));
    assert_false(cuda_gemm_skinny_supported(16, 60, 64));
    assert_false(cuda_gemm_skinny_supported(16, 64, 96));
    assert_nopad_error(cuda_gemm_skinny(NOPAD_DTYPE_F16, p.dy, p.dx, p.dw, p.dbias, NULL, 16, 64, 96, -1, s),
                       NOPAD_ERR_UNSUPPORTED, "N % 64");
    assert_nopad_error(cuda_gemm_skinny(NOPAD_DTYPE_F16, p.dy, p.dx, p.dw, p.dbias, NULL, 300, 64, 64, -1, s),
                       NOPAD_ERR_UNSUPPORTED, "T <= 256");
    assert_nopad_error(cuda_gemm_skinny(NOPAD_DTYPE_F16, p.dy, (char *)p.dx + 2, p.dw, p.dbias, NULL, 8, 64,
                                        64, -1, s), NOPAD_ERR_UNSUPPORTED, "aligned");
    assert_nopad_error(cuda_gemm_skinny(NOPAD_DTYPE_F32, p.dy, p.dx, p.dw, p.dbias, NULL, 16, 64, 64, -1, s),
                       NOPAD_ERR_UNSUPPORTED, "dtype");
    assert_nopad_error(cuda_gemm_skinny(NOPAD_DTYPE_F16, p.dy, NULL, p.dw, p.dbias, NULL, 16, 64, 64, -1, s),
                       NOPAD_ERR_INVALID_ARGUMENT, "NULL");
    assert_false(cuda_gemm_skinny_supported(16, 4104, 64)); /* K > 4096: more than 8 slices of 512 */
    problem_free(&p, 0);
}

/* A skinny GEMM (a cluster launch with a programmatic-serialisation attribute) recorded into a
 * CUDA graph and replayed twice. */
static void test_skinny_graph(void **state) {
    uint64_t rng = 19;
    for (int d = 0; d < 2; d++) {
        problem p;
        problem_make(&p, d, 26, 3072, 768, &rng);
        cudaStream_t s = streams[d];
        const size_t n = (size_t)p.T * p.N;
        poison(gpu[d], p.dy, n);
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        nopad_status st = cuda_gemm_skinny(DTYPES[d], p.dy, p.dx, p.dw, p.dbias, p.dres, p.T, p.K, p.N,
                                           -1, s);
        assert_int_equal(cudaStreamEndCapture(s, &graph), cudaSuccess);
        assert_nopad_ok(st);
        assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        float *y = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
        skinny_reference(ref, p.acc, p.bias, p.res, p.T, p.N, -1);
        for (int replay = 0; replay < 2; replay++) {
            poison(gpu[d], p.dy, n);
            assert_int_equal(cudaGraphLaunch(exec, s), cudaSuccess);
            assert_nopad_ok(gpu[d]->download_f32(gpu[d], y, p.dy, n));
            const double err = test_max_row_rel_error(y, ref, p.T, p.N);
            printf("%s skinny graph replay %d: row rel err %.3g\n", DTYPE_NAMES[d], replay, err);
            assert_true(err <= BOUND[d]);
        }
        free(y), free(ref);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        problem_free(&p, d);
    }
}

/* ---- the skinny GEMM with the LayerNorm of its input fused in ------------------------------ */

/* xn[T, K] = LayerNorm(x) in double (gamma g, beta b). */
static void layernorm_reference(float *xn, const float *x, const float *g, const float *b, float eps,
                                int32_t T, int32_t K) {
    for (int64_t t = 0; t < T; t++) {
        const float *row = x + t * K;
        double mean = 0, var = 0;
        for (int64_t k = 0; k < K; k++) mean += row[k];
        mean /= K;
        for (int64_t k = 0; k < K; k++) var += (row[k] - mean) * (row[k] - mean);
        const double rstd = 1.0 / sqrt(var / K + eps);
        for (int64_t k = 0; k < K; k++) xn[t * K + k] = (float)((row[k] - mean) * rstd * g[k] + b[k]);
    }
}

/* One problem of the LayerNorm variant: x rows with offsets up to +-4 and spreads from 0.25 to 2
 * (a mean well away from zero, as residual sums have), gamma in [0.5, 1.5], beta in [-0.5, 0.5]. */
typedef struct ln_problem {
    problem p; /* x, w, bias, residual; p.acc unused */
    float *g, *b;
    void *dg, *db, *dxn;
} ln_problem;

static void ln_problem_make(ln_problem *q, int d, int32_t T, int32_t K, int32_t N, uint64_t *rng) {
    problem *p = &q->p;
    problem_make(p, d, T, K, N, rng);
    float *off = random_floats((size_t)T * 2, 0.0f, 1.0f, rng);
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < K; k++) p->x[t * K + k] = 8.0f * (off[2 * t] - 0.5f) + (0.25f + 1.75f * off[2 * t + 1]) * p->x[t * K + k];
    free(off);
    gpu[d]->free(gpu[d], p->dx);
    p->dx = to_device(gpu[d], p->x, (size_t)T * K);
    q->g = random_floats((size_t)K, 0.5f, 1.5f, rng);
    q->b = random_floats((size_t)K, -0.5f, 0.5f, rng);
    q->dg = to_device(gpu[d], q->g, (size_t)K);
    q->db = to_device(gpu[d], q->b, (size_t)K);
    assert_nopad_ok(gpu[d]->alloc(gpu[d], (size_t)T * K * 2, &q->dxn));
}

static void ln_problem_free(ln_problem *q, int d) {
    gpu[d]->free(gpu[d], q->dg), gpu[d]->free(gpu[d], q->db), gpu[d]->free(gpu[d], q->dxn);
    free(q->g), free(q->b);
    problem_free(&q->p, d);
}

/* Runs the LayerNorm variant (through_backend: the backend's layernorm_linear op instead) twice on
 * poisoned xn and y; the runs must match bit for bit. xn is checked against the double
 * LayerNorm, and y against epilogue(xn · wᵀ) computed by the CPU from the xn the GPU stored (the
 * op's contract). Returns the worse of the two row errors. */
static double skinny_ln_check(ln_problem *q, int d, int act, int with_residual, int through_backend) {
    problem *p = &q->p;
    nopad_backend *be = gpu[d];
    const float eps = 1e-12f;
    const size_t nx = (size_t)p->T * p->K, ny = (size_t)p->T * p->N;
    float *xn[2], *y[2];
    for (int run = 0; run < 2; run++) {
        poison(be, q->dxn, nx);
        poison(be, p->dy, ny);
        const void *bias = p->dbias, *res = with_residual ? p->dres : NULL;
        if (through_backend) {
            const nopad_epilogue ep = with_residual ? NOPAD_EPILOGUE_BIAS_RESIDUAL
                                      : act >= 0   ? NOPAD_EPILOGUE_BIAS_ACT
                                                   : NOPAD_EPILOGUE_BIAS;
            assert_nopad_ok(be->layernorm_linear(be, p->dy, q->dxn, p->dx, q->dg, q->db, eps, p->dw, bias, res,
                                                 p->T, p->K, p->N, ep, act >= 0 ? (nopad_activation)act : NOPAD_ACT_GELU));
        } else {
            assert_nopad_ok(cuda_gemm_skinny_layernorm(DTYPES[d], p->dy, q->dxn, p->dx, q->dg, q->db, eps, p->dw,
                                                       bias, res, p->T, p->K, p->N, act, streams[d]));
        }
        assert_int_equal(cudaGetLastError(), cudaSuccess);
        xn[run] = malloc(nx * sizeof(float)), y[run] = malloc(ny * sizeof(float));
        assert_nopad_ok(be->download_f32(be, xn[run], q->dxn, nx));
        assert_nopad_ok(be->download_f32(be, y[run], p->dy, ny));
    }
    if (memcmp(xn[0], xn[1], nx * sizeof(float)) != 0 || memcmp(y[0], y[1], ny * sizeof(float)) != 0)
        fail_msg("%s skinny layernorm T %d K %d N %d: two runs differ", DTYPE_NAMES[d], p->T, p->K, p->N);
    for (size_t i = 0; i < nx; i++)
        if (!isfinite(xn[0][i])) fail_msg("%s skinny layernorm T %d K %d N %d: xn[%zu] = %g (unwritten?)",
                                          DTYPE_NAMES[d], p->T, p->K, p->N, i, xn[0][i]);
    for (size_t i = 0; i < ny; i++)
        if (!isfinite(y[0][i])) fail_msg("%s skinny layernorm T %d K %d N %d: y[%zu] = %g (unwritten?)",
                                         DTYPE_NAMES[d], p->T, p->K, p->N, i, y[0][i]);
    float *xn_ref = malloc(nx * sizeof(float)), *acc = malloc(ny * sizeof(float)), *ref = malloc(ny * sizeof(float));
    layernorm_reference(xn_ref, p->x, q->g, q->b, eps, p->T, p->K);
    const double err_xn = test_max_row_rel_error(xn[0], xn_ref, p->T, p->K);
    assert_nopad_ok(cpu->linear(cpu, acc, xn[0], p->w, NULL, NULL, p->T, p->K, p->N, NOPAD_EPILOGUE_NONE,
                                NOPAD_ACT_GELU));
    skinny_reference(ref, acc, p->bias, with_residual ? p->res : NULL, p->T, p->N, act);
    const double err_y = test_max_row_rel_error(y[0], ref, p->T, p->N);
    if (!(err_xn <= BOUND[d]) || !(err_y <= BOUND[d]))
        fail_msg("%s skinny layernorm%s T %d K %d N %d act %d residual %d: row rel err xn %.3g, y %.3g > %.3g",
                 DTYPE_NAMES[d], through_backend ? " (backend op)" : "", p->T, p->K, p->N, act, with_residual,
                 err_xn, err_y, BOUND[d]);
    for (int run = 0; run < 2; run++) free(xn[run]), free(y[run]);
    free(xn_ref), free(acc), free(ref);
    return err_xn > err_y ? err_xn : err_y;
}

/* The encoder's shapes (qkv and FFN in: K = hidden, every T from 1 to 256), every epilogue, K
 * with a zero-filled slice tail (200, 776), K = 8 (one slice), K = 3072 (eight slices), several
 * token tiles; and the backend op, whose shapes the kernel is not asked for (NOPAD_SKINNY_LN
 * unset, or T over the limit) take the LayerNorm kernel and the linear op instead. */
static void test_skinny_layernorm(void **state) {
    const int32_t Ts[] = {1, 7, 26, 64, 65, 130, 256};
    const int32_t shapes[][2] = {{768, 2304}, {768, 3072}, {1024, 3072}, {1024, 4096}, {384, 1536}};
    const int32_t odd[][3] = {{26, 200, 192}, {100, 776, 320}, {5, 8, 64}, {33, 3072, 768}};
    const int n_T = getenv("NOPAD_GPU_TEST_QUICK") ? 3 : 7;
    uint64_t rng = 0x6c6e6c696eULL;
    for (int d = 0; d < 2; d++) {
        double worst = 0.0;
        for (int ti = 0; ti < n_T; ti++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                ln_problem q;
                ln_problem_make(&q, d, Ts[ti], shapes[si][0], shapes[si][1], &rng);
                double e = skinny_ln_check(&q, d, NOPAD_ACT_GELU, 0, 0);
                if (e > worst) worst = e;
                e = skinny_ln_check(&q, d, -1, 0, 0);
                if (e > worst) worst = e;
                ln_problem_free(&q, d);
            }
        for (size_t c = 0; c < sizeof odd / sizeof odd[0]; c++) {
            ln_problem q;
            ln_problem_make(&q, d, odd[c][0], odd[c][1], odd[c][2], &rng);
            for (int act = -1; act <= NOPAD_ACT_RELU; act++) skinny_ln_check(&q, d, act, 0, 0);
            skinny_ln_check(&q, d, -1, 1, 0);
            /* the op's fallback, the LayerNorm kernel, takes rows of up to 2048 */
            if (odd[c][1] <= 2048) {
                skinny_ln_check(&q, d, NOPAD_ACT_GELU, 0, 1);
                skinny_ln_check(&q, d, -1, 1, 1);
            }
            ln_problem_free(&q, d);
        }
        printf("%s skinny layernorm worst row rel err (xn, y) %.3g (bound %.3g)\n", DTYPE_NAMES[d], worst, BOUND[d]);
    }
}

static void test_skinny_layernorm_bad_arguments(void **state) {
    uint64_t rng = 23;
    ln_problem q;
    ln_problem_make(&q, 0, 16, 64, 64, &rng);
    problem *p = &q.p;
    cudaStream_t s = streams[0];
    const nopad_dtype f16 = NOPAD_DTYPE_F16;
    assert_nopad_error(cuda_gemm_skinny_layernorm(f16, p->dy, p->dx, p->dx, q.dg, q.db, 1e-5f, p->dw, p->dbias,
                                                  NULL, 16, 64, 64, -1, s), NOPAD_ERR_INVALID_ARGUMENT, "overlap");
    assert_nopad_error(cuda_gemm_skinny_layernorm(f16, q.dxn, q.dxn, p->dx, q.dg, q.db, 1e-5f, p->dw, p->dbias,
                                                  NULL, 16, 64, 64, -1, s), NOPAD_ERR_INVALID_ARGUMENT, "overlap");
    assert_nopad_error(cuda_gemm_skinny_layernorm(f16, p->dy, q.dxn, p->dx, q.dg, q.db, 1e-5f, p->dw, p->dbias,
                                                  q.dxn, 16, 64, 64, -1, s), NOPAD_ERR_INVALID_ARGUMENT, "overlap");
    assert_nopad_error(cuda_gemm_skinny_layernorm(f16, p->dy, NULL, p->dx, q.dg, q.db, 1e-5f, p->dw, p->dbias,
                                                  NULL, 16, 64, 64, -1, s), NOPAD_ERR_INVALID_ARGUMENT, "NULL");
    assert_nopad_error(cuda_gemm_skinny_layernorm(f16, p->dy, q.dxn, p->dx, (char *)q.dg + 8, q.db, 1e-5f, p->dw,
                                                  p->dbias, NULL, 16, 64, 64, -1, s), NOPAD_ERR_UNSUPPORTED, "aligned");
    assert_nopad_error(cuda_gemm_skinny_layernorm(f16, p->dy, q.dxn, p->dx, q.dg, q.db, -1.0f, p->dw, p->dbias,
                                                  NULL, 16, 64, 64, -1, s), NOPAD_ERR_INVALID_ARGUMENT, "eps");
    assert_nopad_error(cuda_gemm_skinny_layernorm(f16, p->dy, q.dxn, p->dx, q.dg, q.db, 1e-5f, p->dw, p->dbias,
                                                  NULL, 300, 64, 64, -1, s), NOPAD_ERR_UNSUPPORTED, "T <= 256");
    ln_problem_free(&q, 0);
}

/* ---- the skinny GEMM with the attention of its input fused in ------------------------------ */

/* Bounds for the attention variant: the context is rounded to the dtype before the GEMM, as
 * the reference's is, but P is rounded too on the GPU (the A operand of P·v), as in the attention
 * kernels; 1.5x the GEMM bounds covers the second rounding. */
static const double ATTN_BOUND[2] = {3e-3, 2.25e-2};

/* Runs the attention variant (through_backend: the backend's attention_linear op, which takes the
 * attention kernel and the linear op where NOPAD_SKINNY_ATTN is unset) twice on a poisoned y, for
 * the sequences of `lens`; the runs must match bit for bit; y against epilogue(ctx · wᵀ) with ctx
 * the CPU attention op's output rounded to the dtype. Returns the row error. */
static double skinny_attention_check(int d, const int32_t *lens, int32_t n_seqs, int32_t slack, int32_t heads,
                                     int32_t head_size, int32_t N, int act, int with_residual, int through_backend,
                                     uint64_t *rng) {
    nopad_backend *be = gpu[d];
    int32_t cu[65];
    cu[0] = 0;
    for (int s = 0; s < n_seqs; s++) cu[s + 1] = cu[s] + lens[s];
    /* T: the sequences' tokens and `slack` rows past them, as in a graph recorded for a bucket */
    const int32_t real = cu[n_seqs], T = real + slack, K = heads * head_size;
    float *qkv = random_floats((size_t)T * 3 * K, -2.0f, 2.0f, rng);
    for (size_t i = (size_t)real * 3 * K; i < (size_t)T * 3 * K; i++) qkv[i] = NAN; /* slack: garbage */
    float *w = random_floats((size_t)N * K, -sqrtf(3.0f / K), sqrtf(3.0f / K), rng);
    float *bias = random_floats((size_t)N, -0.5f, 0.5f, rng), *res = random_floats((size_t)T * N, -1.0f, 1.0f, rng);
    void *dqkv = to_device(be, qkv, (size_t)T * 3 * K), *dw = to_device(be, w, (size_t)N * K);
    void *dbias = to_device(be, bias, (size_t)N), *dres = to_device(be, res, (size_t)T * N), *dy, *dctx, *dcu;
    assert_nopad_ok(be->alloc(be, (size_t)T * N * 2, &dy));
    assert_nopad_ok(be->alloc(be, (size_t)T * K * 2, &dctx));
    assert_nopad_ok(be->alloc(be, (size_t)(n_seqs + 1) * 4, &dcu));
    assert_nopad_ok(be->upload_i32(be, dcu, cu, (size_t)n_seqs + 1));
    const float scale = 1.0f / sqrtf((float)head_size);
    int32_t longest = 0;
    for (int s = 0; s < n_seqs; s++) longest = lens[s] > longest ? lens[s] : longest;
    const nopad_seqs dseqs = {n_seqs, T, longest, dcu}, hseqs = {n_seqs, real, longest, cu};
    const size_t ny = (size_t)T * N;
    float *y[2];
    for (int run = 0; run < 2; run++) {
        poison(be, dy, ny);
        if (through_backend) {
            const nopad_epilogue ep = with_residual ? NOPAD_EPILOGUE_BIAS_RESIDUAL
                                      : act >= 0   ? NOPAD_EPILOGUE_BIAS_ACT
                                                   : NOPAD_EPILOGUE_BIAS;
            assert_nopad_ok(be->attention_linear(be, dy, dctx, dqkv, &dseqs, heads, head_size, scale, dw, dbias,
                                                 with_residual ? dres : NULL, N, ep,
                                                 act >= 0 ? (nopad_activation)act : NOPAD_ACT_GELU));
        } else {
            assert_nopad_ok(cuda_gemm_skinny_attention(DTYPES[d], dy, dqkv, dcu, n_seqs, T, heads, head_size, scale,
                                                       dw, dbias, with_residual ? dres : NULL, N, act, streams[d]));
        }
        assert_int_equal(cudaGetLastError(), cudaSuccess);
        y[run] = malloc(ny * sizeof(float));
        assert_nopad_ok(be->download_f32(be, y[run], dy, ny));
    }
    if (memcmp(y[0], y[1], ny * sizeof(float)) != 0)
        fail_msg("%s skinny attention T %d B %d: two runs differ", DTYPE_NAMES[d], T, n_seqs);
    for (size_t i = 0; i < ny; i++)
        if (!isfinite(y[0][i])) fail_msg("%s skinny attention T %d B %d heads %d d %d: y[%zu] = %g (unwritten?)",
                                         DTYPE_NAMES[d], T, n_seqs, heads, head_size, i, y[0][i]);
    /* the reference: the CPU attention op, its output rounded to the dtype, the CPU GEMM */
    float *ctx = calloc((size_t)T * K, sizeof(float)), *acc = malloc(ny * sizeof(float)), *ref = malloc(ny * sizeof(float));
    assert_nopad_ok(cpu->attention_varlen(cpu, ctx, qkv, &hseqs, heads, head_size, scale, 0)); /* slack: 0 */
    be->free(be, to_device(be, ctx, (size_t)T * K));
    assert_nopad_ok(cpu->linear(cpu, acc, ctx, w, NULL, NULL, T, K, N, NOPAD_EPILOGUE_NONE, NOPAD_ACT_GELU));
    skinny_reference(ref, acc, bias, with_residual ? res : NULL, T, N, act);
    const double err = test_max_row_rel_error(y[0], ref, T, N);
    if (!(err <= ATTN_BOUND[d]))
        fail_msg("%s skinny attention%s T %d (%d slack) B %d heads %d d %d N %d act %d residual %d: row rel err "
                 "%.3g > %.3g", DTYPE_NAMES[d], through_backend ? " (backend op)" : "", T, slack, n_seqs, heads,
                 head_size, N, act, with_residual, err, ATTN_BOUND[d]);
    free(y[0]), free(y[1]), free(ctx), free(acc), free(ref);
    free(qkv), free(w), free(bias), free(res);
    be->free(be, dqkv), be->free(be, dw), be->free(be, dbias), be->free(be, dres), be->free(be, dy);
    be->free(be, dctx), be->free(be, dcu);
    return err;
}

/* Batches of one tile (T <= 64): one token; one sequence of 64; five of length 1; mixes whose
 * sequences cross the 16-token groups; 26 sequences of one token; rows past the last sequence. Head layouts of BERT-base,
 * BERT-large, MiniLM (d = 32) and small ones (one slice). Every epilogue; the backend op. */
static void test_skinny_attention(void **state) {
    static const int32_t lens[][27] = {{1, 1},  {1, 64}, {5, 1, 1, 1, 1, 1}, {4, 5, 20, 1, 6}, {3, 17, 15, 30},
                                       {1, 33}, {2, 7, 9},
                                       {26, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}};
    static const int32_t layouts[][3] = {{12, 64, 768}, {16, 64, 1024}, {12, 32, 384}, {2, 64, 128}, {1, 32, 64}};
    const int quick = getenv("NOPAD_GPU_TEST_QUICK") != NULL; /* under a sanitizer: 4 batches, 3 layouts */
    const size_t n_lens = quick ? 4 : sizeof lens / sizeof lens[0];
    const size_t n_layouts = quick ? 3 : sizeof layouts / sizeof layouts[0];
    uint64_t rng = 0x6174746eULL;
    for (int d = 0; d < 2; d++) {
        double worst = 0.0;
        for (size_t b = 0; b < n_lens; b++)
            for (size_t l = 0; l < n_layouts; l++) {
                const double e = skinny_attention_check(d, lens[b] + 1, lens[b][0], 0, layouts[l][0], layouts[l][1],
                                                        layouts[l][2], -1, 1, 0, &rng);
                if (e > worst) worst = e;
            }
        for (int act = -1; act <= NOPAD_ACT_RELU; act++)
            skinny_attention_check(d, lens[3] + 1, lens[3][0], 0, 12, 64, 768, act, 0, 0, &rng);
        /* slack rows (NaN) past the last sequence: 6 past 32 tokens, 1 past 16, 63 past one token */
        skinny_attention_check(d, lens[4] + 1, lens[4][0] - 1, 6, 12, 64, 768, -1, 1, 0, &rng);
        skinny_attention_check(d, lens[6] + 1, lens[6][0], 1, 12, 32, 384, -1, 1, 0, &rng);
        skinny_attention_check(d, lens[0] + 1, lens[0][0], 63, 16, 64, 1024, -1, 1, 0, &rng);
        skinny_attention_check(d, lens[4] + 1, lens[4][0], 0, 12, 32, 384, -1, 1, 1, &rng);
        skinny_attention_check(d, lens[3] + 1, lens[3][0], 0, 12, 64, 768, NOPAD_ACT_GELU, 0, 1, &rng);
        printf("%s skinny attention worst row rel err %.3g (bound %.3g)\n", DTYPE_NAMES[d], worst, ATTN_BOUND[d]);
    }
}

static void test_skinny_attention_bad_arguments(void **state) {
    nopad_backend *be = gpu[0];
    cudaStream_t s = streams[0];
    const nopad_dtype f16 = NOPAD_DTYPE_F16;
    const int32_t cu[3] = {0, 40, 65};
    void *qkv, *w, *y, *dcu;
    assert_nopad_ok(be->alloc(be, (size_t)65 * 3 * 768 * 2, &qkv));
    assert_nopad_ok(be->alloc(be, (size_t)768 * 768 * 2, &w));
    assert_nopad_ok(be->alloc(be, (size_t)65 * 768 * 2, &y));
    assert_nopad_ok(be->alloc(be, sizeof cu, &dcu));
    assert_nopad_ok(be->upload_i32(be, dcu, cu, 3));
    assert_false(cuda_gemm_skinny_attention_supported(65, 12, 64, 768));
    assert_false(cuda_gemm_skinny_attention_supported(16, 6, 128, 768));
    assert_false(cuda_gemm_skinny_attention_supported(16, 12, 64, 96));
    assert_true(cuda_gemm_skinny_attention_supported(64, 12, 64, 768));
    assert_nopad_error(cuda_gemm_skinny_attention(f16, y, qkv, dcu, 2, 65, 12, 64, 0.125f, w, NULL, NULL, 768, -1, s),
                       NOPAD_ERR_UNSUPPORTED, "T <= 64");
    assert_nopad_error(cuda_gemm_skinny_attention(f16, y, qkv, dcu, 1, 16, 6, 128, 0.125f, w, NULL, NULL, 768, -1, s),
                       NOPAD_ERR_UNSUPPORTED, "head size");
    assert_nopad_error(cuda_gemm_skinny_attention(f16, y, qkv, dcu, 0, 16, 12, 64, 0.125f, w, NULL, NULL, 768, -1, s),
                       NOPAD_ERR_INVALID_ARGUMENT, "sequences");
    assert_nopad_error(cuda_gemm_skinny_attention(f16, y, qkv, NULL, 1, 16, 12, 64, 0.125f, w, NULL, NULL, 768, -1, s),
                       NOPAD_ERR_INVALID_ARGUMENT, "cu_seqlens");
    assert_nopad_error(cuda_gemm_skinny_attention(f16, y, qkv, dcu, 1, 16, 12, 64, 0.0f, w, NULL, NULL, 768, -1, s),
                       NOPAD_ERR_INVALID_ARGUMENT, "scale");
    assert_nopad_error(cuda_gemm_skinny_attention(f16, qkv, qkv, dcu, 1, 16, 12, 64, 0.125f, w, NULL, NULL, 768, -1, s),
                       NOPAD_ERR_INVALID_ARGUMENT, "overlap");
    be->free(be, qkv), be->free(be, w), be->free(be, y), be->free(be, dcu);
}

int main(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("no CUDA device: skipping the GPU tests\n");
        return 77;
    }
    if (nopad_backend_cpu_create(0, &cpu) != NOPAD_OK) return 1;
    for (int d = 0; d < 2; d++)
        if (cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking) != cudaSuccess ||
            nopad_backend_cuda_create(DTYPES[d], streams[d], &gpu[d]) != NOPAD_OK)
            return 1;
    if (getenv("NOPAD_TEST_FILTER")) cmocka_set_test_filter(getenv("NOPAD_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),        cmocka_unit_test(test_every_config),
        cmocka_unit_test(test_unsupported),   cmocka_unit_test(test_graph_capture),
        cmocka_unit_test(test_backend_modes), cmocka_unit_test(test_skinny_shapes),
        cmocka_unit_test(test_skinny_epilogues), cmocka_unit_test(test_skinny_unsupported),
        cmocka_unit_test(test_skinny_graph), cmocka_unit_test(test_skinny_layernorm),
        cmocka_unit_test(test_skinny_layernorm_bad_arguments), cmocka_unit_test(test_skinny_attention),
        cmocka_unit_test(test_skinny_attention_bad_arguments),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int d = 0; d < 2; d++) {
        gpu[d]->destroy(gpu[d]);
        cudaStreamDestroy(streams[d]);
    }
    cpu->destroy(cpu);
    return rc;
}

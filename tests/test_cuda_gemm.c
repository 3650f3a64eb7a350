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
 * must give identical bits twice. Same bounds.
 * The gemv kernels (decode steps): T from 1 to 32 across their 8-, 16-, 24- and 32-token variants,
 * decoder layer shapes and odd ones (K not a multiple of 32, N not of 16, N = 1), every epilogue,
 * the float32 output against the fp32 reference within 1e-5 of each output's sum of |products|,
 * the fused SwiGLU; identical bits twice.
 * No GPU: exit 77 (ctest: skipped); built without CUTLASS, the fused tests skip.
 * NOPAD_GPU_TEST_QUICK=1 leaves out T = 4352. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "cuda_testutil.h"

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm/gemm.h"
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
    p->dx = test_to_device(be, p->x, (size_t)T * K);
    p->dw = test_to_device(be, p->w, (size_t)N * K);
    p->dbias = test_to_device(be, p->bias, (size_t)N);
    p->dres = test_to_device(be, p->res, (size_t)T * N);
    assert_nopad_ok(be->alloc(be, (size_t)T * N * 2, &p->dy));
    p->acc = malloc((size_t)T * N * sizeof(float));
    assert_nopad_ok(cpu->gemm(cpu, p->acc, p->x, p->w, NULL, NULL, T, K, N, NOPAD_EPILOGUE_NONE,
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
                    assert_nopad_ok(gpu[d]->gemm(gpu[d], p.dy, p.dx, p.dw, p.dbias, p.dres, p.T, p.K, p.N,
                                                   eps[e], NOPAD_ACT_GELU));
                    assert_nopad_ok(cpu->gemm(cpu, ref, p.x, p.w, p.bias, p.res, p.T, p.K, p.N, eps[e],
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

/* ---- the gemv kernels (decode steps) -------------------------------------------------------- */

/* Decoder layer shapes (K, N): LLaMA-1B's qkv, attention out, FFN out (four slots a warp), SmolLM2's
 * qkv and FFN in; and odd ones: K not a multiple of 32 (a block half outside K), N not a multiple
 * of 16 (a CTA's rows partly outside N), one output feature, K = 8; N = 9000, a grid of more than
 * one wave (SwiGLU's too); four slots a warp with 33 chunks (warps of 5 and 4, the last chunk 8
 * elements) and with 24. */
static const int32_t GEMV_SHAPES[][2] = {{2048, 2560}, {2048, 2048}, {5632, 2048}, {576, 960}, {576, 3072},
                                         {200, 100},   {776, 1},     {8, 48},      {256, 9000}, {4104, 16},
                                         {3000, 40}};
/* T: 1, the edges of the 8-, 16-, 24- and 32-token kernels */
static const int32_t GEMV_TS[] = {1, 3, 8, 9, 16, 17, 24, 25, 31, 32};

/* Runs the gemv (act, bias, residual as skinny_check) twice on a poisoned output: identical bits
 * both times, the row error within BOUND against the reference. */
static void gemv_check(problem *p, int d, int with_bias, int act, int with_residual, double *worst) {
    nopad_backend *be = gpu[d];
    const size_t n = (size_t)p->T * p->N;
    float *y = malloc(n * sizeof(float)), *y2 = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
    const void *dres = with_residual == 1 ? p->dres : with_residual == 2 ? p->dy : NULL;
    for (int run = 0; run < 2; run++) {
        if (with_residual == 2) assert_nopad_ok(be->upload_f32(be, p->dy, p->res, n));
        else poison(be, p->dy, n);
        assert_nopad_ok(cuda_gemv(DTYPES[d], p->dy, p->dx, p->dw, with_bias ? p->dbias : NULL, dres, p->T, p->K,
                                  p->N, act, streams[d]));
        assert_int_equal(cudaGetLastError(), cudaSuccess);
        assert_nopad_ok(be->download_f32(be, run ? y2 : y, p->dy, n));
    }
    if (memcmp(y, y2, n * sizeof(float)) != 0)
        fail_msg("%s gemv T %d K %d N %d: two runs differ", DTYPE_NAMES[d], p->T, p->K, p->N);
    skinny_reference(ref, p->acc, with_bias ? p->bias : NULL, with_residual ? p->res : NULL, p->T, p->N, act);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(y[i]))
            fail_msg("%s gemv T %d K %d N %d: y[%zu] = %g (unwritten?)", DTYPE_NAMES[d], p->T, p->K, p->N, i, y[i]);
    const double err = test_max_row_rel_error(y, ref, p->T, p->N);
    if (!(err <= BOUND[d]))
        fail_msg("%s gemv T %d K %d N %d act %d bias %d residual %d: row rel err %.3g > %.3g", DTYPE_NAMES[d],
                 p->T, p->K, p->N, act, with_bias, with_residual, err, BOUND[d]);
    if (err > *worst) *worst = err;
    free(y), free(y2), free(ref);
}

/* The float32 output (the LM head): no output rounding, so what is left is fp32 accumulation-order
 * noise. Both sides add the same exactly representable products in fp32 in different orders, so
 * each output is off by at most ~K·2^-24 of the sum of its products' magnitudes (|x|·|w|, not the
 * output, which may cancel to near zero); measured against that scale, 1e-5 holds for every K
 * here (K·2^-24 = 3.4e-4 is the worst case; random rounding errors add up to ~sqrt(K)·2^-24). */
static void gemv_f32_check(problem *p, int d, double *worst) {
    nopad_backend *be = gpu[d];
    const size_t n = (size_t)p->T * p->N;
    float *y = malloc(n * sizeof(float));
    void *dy32 = NULL;
    assert_nopad_ok(be->alloc(be, n * sizeof(float), &dy32));
    float *nan = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    /* on the GEMM's stream: a cudaMemcpy of pageable memory may still be landing when it returns,
     * and the test's streams do not synchronise with the legacy stream */
    assert_int_equal(cudaMemcpyAsync(dy32, nan, n * sizeof(float), cudaMemcpyHostToDevice, streams[d]), cudaSuccess);
    assert_nopad_ok(cuda_gemv_f32(DTYPES[d], dy32, p->dx, p->dw, p->T, p->K, p->N, streams[d]));
    assert_int_equal(cudaMemcpyAsync(y, dy32, n * sizeof(float), cudaMemcpyDeviceToHost, streams[d]), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(streams[d]), cudaSuccess);
    double err = 0.0;
    for (int64_t t = 0; t < p->T; t++)
        for (int64_t o = 0; o < p->N; o++) {
            const float v = y[t * p->N + o];
            if (!isfinite(v)) fail_msg("%s gemv_f32 T %d K %d N %d: y[%d][%d] = %g", DTYPE_NAMES[d], p->T, p->K, p->N, (int)t, (int)o, v);
            double scale = 0.0;
            for (int64_t k = 0; k < p->K; k++) scale += fabs((double)p->x[t * p->K + k] * p->w[o * p->K + k]);
            const double e = fabs((double)v - p->acc[t * p->N + o]) / (scale > 0.0 ? scale : 1.0);
            if (e > err) err = e;
        }
    if (!(err <= 1e-5))
        fail_msg("%s gemv_f32 T %d K %d N %d: error %.3g of the products' magnitude > 1e-5", DTYPE_NAMES[d], p->T,
                 p->K, p->N, err);
    if (err > *worst) *worst = err;
    be->free(be, dy32);
    free(y), free(nan);
}

/* SwiGLU fused: w [2F, K] as the problem's [N, K] with N = 2F; reference silu(acc[:, :F]) ·
 * acc[:, F:] in double, one output rounding (BOUND). */
static void gemv_swiglu_check(problem *p, int d, double *worst) {
    nopad_backend *be = gpu[d];
    const int32_t F = p->N / 2;
    const size_t n = (size_t)p->T * F;
    float *y = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
    poison(be, p->dy, n);
    assert_nopad_ok(cuda_gemv_swiglu(DTYPES[d], p->dy, p->dx, p->dw, p->T, p->K, F, streams[d]));
    assert_nopad_ok(be->download_f32(be, y, p->dy, n));
    for (int64_t t = 0; t < p->T; t++)
        for (int64_t i = 0; i < F; i++) {
            const double g = p->acc[t * p->N + i], u = p->acc[t * p->N + F + i];
            ref[t * F + i] = (float)(g / (1.0 + exp(-g)) * u);
        }
    for (size_t i = 0; i < n; i++)
        if (!isfinite(y[i])) fail_msg("%s gemv_swiglu T %d K %d F %d: y[%zu] = %g", DTYPE_NAMES[d], p->T, p->K, F, i, y[i]);
    const double err = test_max_row_rel_error(y, ref, p->T, F);
    if (!(err <= BOUND[d]))
        fail_msg("%s gemv_swiglu T %d K %d F %d: row rel err %.3g > %.3g", DTYPE_NAMES[d], p->T, p->K, F, err, BOUND[d]);
    if (err > *worst) *worst = err;
    free(y), free(ref);
}

static void test_gemv_shapes(void **state) {
    uint64_t rng = 0x67656d76ULL;
    const int n_shapes = (int)(sizeof GEMV_SHAPES / sizeof GEMV_SHAPES[0]);
    for (int d = 0; d < 2; d++) {
        double worst = 0.0, worst32 = 0.0, worst_glu = 0.0;
        for (size_t ti = 0; ti < sizeof GEMV_TS / sizeof GEMV_TS[0]; ti++)
            for (int si = 0; si < n_shapes; si++) {
                const int32_t T = GEMV_TS[ti], K = GEMV_SHAPES[si][0], N = GEMV_SHAPES[si][1];
                assert_true(cuda_gemv_supported(T, K, N));
                problem p;
                problem_make(&p, d, T, K, N, &rng);
                gemv_check(&p, d, 0, -1, 0, &worst);            /* LLaMA: no bias */
                gemv_check(&p, d, 1, -1, 0, &worst);            /* Qwen2's qkv, GPT-2 */
                gemv_f32_check(&p, d, &worst32);                /* the LM head */
                if (N % 2 == 0) gemv_swiglu_check(&p, d, &worst_glu);
                problem_free(&p, d);
            }
        printf("%s gemv worst row rel err %.3g, f32 %.3g, swiglu %.3g\n", DTYPE_NAMES[d], worst, worst32, worst_glu);
    }
}

/* Every activation (GPT-2's FFN in), a residual, a residual that is y itself. */
static void test_gemv_epilogues(void **state) {
    const int32_t cases[][3] = {{1, 768, 3072}, {5, 200, 100}, {32, 3072, 768}};
    uint64_t rng = 0x67657069ULL;
    double worst = 0.0;
    for (int d = 0; d < 2; d++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            problem p;
            problem_make(&p, d, cases[c][0], cases[c][1], cases[c][2], &rng);
            for (int act = -1; act <= NOPAD_ACT_RELU; act++) gemv_check(&p, d, 1, act, 0, &worst);
            gemv_check(&p, d, 1, -1, 1, &worst);
            gemv_check(&p, d, 1, -1, 2, &worst);
            gemv_check(&p, d, 0, NOPAD_ACT_GELU, 1, &worst);
            problem_free(&p, d);
        }
    printf("gemv epilogues worst row rel err %.3g\n", worst);
}

static void test_gemv_unsupported(void **state) {
    uint64_t rng = 23;
    problem p;
    problem_make(&p, 0, 16, 64, 64, &rng);
    cudaStream_t s = streams[0];
    assert_false(cuda_gemv_supported(33, 2048, 2048));
    assert_false(cuda_gemv_supported(0, 2048, 2048));
    assert_false(cuda_gemv_supported(4, 60, 64));
    assert_nopad_error(cuda_gemv(NOPAD_DTYPE_F16, p.dy, p.dx, p.dw, NULL, NULL, 33, 64, 64, -1, s),
                       NOPAD_ERR_UNSUPPORTED, "T <= 32");
    assert_nopad_error(cuda_gemv(NOPAD_DTYPE_F16, p.dy, (char *)p.dx + 2, p.dw, NULL, NULL, 8, 64, 64, -1, s),
                       NOPAD_ERR_UNSUPPORTED, "aligned");
    assert_nopad_error(cuda_gemv(NOPAD_DTYPE_F32, p.dy, p.dx, p.dw, NULL, NULL, 8, 64, 64, -1, s),
                       NOPAD_ERR_UNSUPPORTED, "dtype");
    assert_nopad_error(cuda_gemv_swiglu(NOPAD_DTYPE_BF16, p.dy, NULL, p.dw, 8, 64, 32, s),
                       NOPAD_ERR_INVALID_ARGUMENT, "NULL");
    problem_free(&p, 0);
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
        cmocka_unit_test(test_shapes),        cmocka_unit_test(test_every_config),
        cmocka_unit_test(test_unsupported),   cmocka_unit_test(test_graph_capture),
        cmocka_unit_test(test_backend_modes), cmocka_unit_test(test_skinny_shapes),
        cmocka_unit_test(test_skinny_epilogues), cmocka_unit_test(test_skinny_unsupported),
        cmocka_unit_test(test_skinny_graph),     cmocka_unit_test(test_gemv_shapes),
        cmocka_unit_test(test_gemv_epilogues),   cmocka_unit_test(test_gemv_unsupported),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int d = 0; d < 2; d++) {
        gpu[d]->destroy(gpu[d]);
        cudaStreamDestroy(streams[d]);
    }
    cpu->destroy(cpu);
    return rc;
}

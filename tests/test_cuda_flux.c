/* Flux's fused kernels (backend/cuda/flux/flux.h) on one GPU with emulated peers: W ranks are W
 * buffers and signal sets in this device's memory, and a second stream plays the other ranks
 * (cuda_flux_emulate_arrivals: one CTA that copies each chunk in and then sets its signal, in a
 * random order after random delays, while the fused kernel runs).
 *
 * - AllGather+GEMM against all-gather-then-GEMM: y[M, N] = x[M, K] · w[N, K]ᵀ with x gathered from
 *   W = 2, 4, 8 chunks of random, odd sizes (M odd, a chunk of 0 rows too), every rank's view,
 *   every tile configuration, fp16 and bf16; twice on the same buffers with a new epoch (nothing is
 *   reset between calls). The same after every rank pushed its chunk with cuda_flux_ag_push.
 * - GEMM+ReduceScatter against GEMM-then-reduce-scatter: each rank's partial x_s · w_sᵀ, the local
 *   chunk's sum in y, and this rank's partial tiles in the other ranks' inboxes with their signals
 *   set; also from a rank with no rows (no local tile). In the TMA configurations the peers'
 *   partials come through the ring as boxes (W - 1 = 1, 3 and 7 sources; a part-full last slot;
 *   column boxes past N skipped where N = 200, 392 and 2056 end inside a tile).
 * - A chunk that never arrives: the kernel ends within its timeout (50 ms here) and cuda_flux_check
 *   names the missing rank; the next call on the same buffers works.
 * - Both kernels recorded into a CUDA graph and replayed (also in the TMA configurations 1 and 2).
 * - Every configuration also with more tiles than SMs (the persistent ones 1 and 2 then take
 *   several tiles a CTA, and again on 3 CTAs) and with a chunk of 0 rows; the timeouts of both
 *   kernels in every one.
 * - Refused shapes and arguments.
 *
 * The reference is the unfused path on the CPU: the chunks gathered (or the partials summed),
 * then the GEMM of the CPU backend in fp32 (OpenBLAS), on inputs rounded to the GPU dtype first.
 * The other ranks' partials are given to the kernel rounded to the dtype (as their GEMMs would
 * store them), and the reference sums exactly those numbers, so both the AllGather and the
 * ReduceScatter outputs differ from it only by the fused GEMM's own fp32 accumulation order and its
 * one output rounding: the bounds of test_cuda_gemm, max over rows of ||y_r - ref_r|| / ||ref_r||,
 * fp16 2e-3 and bf16 1.5e-2 (one rounding: 4.9e-4 and 3.9e-3 relative per element; accumulation
 * order ~1e-6 at these K), with margin. Outputs and the gathered chunks not yet arrived are
 * NaN-poisoned, so a tile read before its chunk landed or never written fails.
 * No GPU: exit 77 (ctest: skipped). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "cuda_testutil.h"

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/flux/flux.h"
#include "testutil.h"

static nopad_backend *cpu;
static nopad_backend *gpu[2];
static cudaStream_t streams[2]; /* gpu[d] runs on streams[d], and so do the fused kernels */
static cudaStream_t peer_stream; /* the emulated peers, highest priority */
static const nopad_dtype DTYPES[2] = {NOPAD_DTYPE_F16, NOPAD_DTYPE_BF16};
static const char *const DTYPE_NAMES[2] = {"f16", "bf16"};
static const double BOUND[2] = {2e-3, 1.5e-2};
static const uint64_t TIMEOUT_NS = 50000000; /* 50 ms */

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    assert_int_equal(cudaMalloc(&p, bytes), cudaSuccess);
    return p;
}

static float *random_floats(size_t n, float lo, float hi, uint64_t *rng) {
    float *x = malloc(n * sizeof(float));
    test_fill_uniform(x, (int64_t)n, lo, hi, rng);
    return x;
}

static void poison(int d, void *dev, size_t n) {
    if (n == 0) return;
    float *nan = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    assert_nopad_ok(gpu[d]->upload_f32(gpu[d], dev, nan, n));
    free(nan);
}

/* Chunk sizes in [lo, hi] with an odd total. */
static void random_rows(int32_t *rows, int W, int32_t lo, int32_t hi, uint64_t *rng) {
    int64_t m = 0;
    for (int i = 0; i < W; i++) m += rows[i] = lo + (int32_t)(test_rand_u32(rng) % (uint32_t)(hi - lo + 1));
    if (m % 2 == 0) rows[W - 1] += rows[W - 1] > lo ? -1 : 1;
}

static void shuffle(int *v, int n, uint64_t *rng) {
    for (int i = n - 1; i > 0; i--) {
        const int j = (int)(test_rand_u32(rng) % (uint32_t)(i + 1)), t = v[i];
        v[i] = v[j], v[j] = t;
    }
}

/* The arrivals, uploaded for the feeding kernel; each after a random 0-300 µs beyond the one before. */
static cuda_flux_arrival *upload_arrivals(cuda_flux_arrival *items, int n, uint64_t *rng) {
    uint64_t at = 0;
    for (int i = 0; i < n; i++) items[i].at_ns = at += test_rand_u32(rng) % 300000;
    cuda_flux_arrival *dev = dev_alloc((size_t)(n > 0 ? n : 1) * sizeof *dev);
    assert_int_equal(cudaMemcpy(dev, items, (size_t)n * sizeof *dev, cudaMemcpyHostToDevice), cudaSuccess);
    return dev;
}

/* Checks that fail are printed and counted, and the test fails at its end: one run shows every
 * configuration, world size and dtype that fails, not only the first. */
static int failures;
static void check_failed(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("FAILED: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    failures++;
}
static void fail_if_failed(const char *test) {
    if (failures) fail_msg("%s: %d checks failed (above)", test, failures);
}

/* max row relative error; infinite when an element is not finite (unwritten, or read before its
 * chunk arrived: both poisoned with NaN) */
static double row_error(const char *what, const float *y, const float *ref, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows * cols; i++)
        if (!isfinite(y[i])) {
            printf("%s: y[%lld] (row %lld) = %g\n", what, (long long)i, (long long)(i / cols), y[i]);
            return INFINITY;
        }
    return test_max_row_rel_error(y, ref, rows, cols);
}

/* The tiles of a call under `config` (cuda_flux_rs_tiles' sizes, summed over the chunks), and the
 * device's SMs: the persistent configurations take several tiles a CTA when there are more. */
static int tile_count(const int32_t *rows, int W, int32_t N, int config) {
    int total = 0;
    for (int i = 0; i < W; i++) {
        int32_t tm, tn;
        cuda_flux_rs_tiles(config, rows[i], N, &tm, &tn);
        total += tm * tn;
    }
    return total;
}
static int test_sm_count(void) {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    return sms;
}

/* One call of either kernel: dtype DTYPES[d], W ranks, this rank's view, the chunks' rows. */
typedef struct flux_case {
    int d, W, rank, config;
    int32_t rows[CUDA_FLUX_MAX_WORLD];
    int32_t K, N;
    int32_t max_ctas;    /* cuda_flux_peers.max_ctas; 0: one CTA a SM */
    uint64_t timeout_ns; /* GEMM+ReduceScatter only (AllGather+GEMM: the default) */
    int missing;         /* GEMM+ReduceScatter only: a source whose partials never arrive, or -1 */
} flux_case;
typedef double (*run_fn)(const flux_case *c, uint64_t *rng);

/* The worse of two errors; NaN is the worst. */
static double worse(double a, double b) { return !(b <= a) ? b : a; }

/* More tiles than SMs: c's world with chunks of 300-600 rows (odd total) and a random rank's view,
 * so each persistent CTA takes several tiles (its ring's phases wrapping within and across them).
 * For the persistent configurations also the same on 3 CTAs (peers.max_ctas): 50-100 tiles a CTA,
 * the ring's phases wrapping hundreds of times, the remote chunks' waits (AllGather) or the local
 * chunk's partial boxes (ReduceScatter) in the middle of a CTA's run. Returns the worse row error. */
static double run_many_tiles(const char *kernel, flux_case c, run_fn run, uint64_t *rng) {
    random_rows(c.rows, c.W, 300, 600, rng);
    c.rank = (int)(test_rand_u32(rng) % (uint32_t)c.W);
    const int tiles = tile_count(c.rows, c.W, c.N, c.config);
    double worst = run(&c, rng);
    printf("%s %s config %d, %d tiles on %d SMs: row rel err %.3g\n", DTYPE_NAMES[c.d], kernel, c.config, tiles,
           test_sm_count(), worst);
    if (c.config < CUDA_FLUX_CONFIG_TMA_256) return worst; /* max_ctas bounds the persistent grids only */
    c.max_ctas = 3;
    const double e3 = run(&c, rng);
    printf("%s %s config %d, %d tiles on 3 CTAs: row rel err %.3g\n", DTYPE_NAMES[c.d], kernel, c.config, tiles, e3);
    return worse(worst, e3);
}

/* ---- AllGather+GEMM ---- */

/* One rank's AllGather+GEMM with the other chunks fed in random order; twice, new epoch each time.
 * Returns the worse row error. */
static double run_ag(const flux_case *c, uint64_t *rng) {
    const int d = c->d, W = c->W, r = c->rank;
    int64_t M = 0, row0[CUDA_FLUX_MAX_WORLD + 1];
    for (int i = 0; i < W; i++) row0[i] = M, M += c->rows[i];
    row0[W] = M;
    const int32_t K = c->K, N = c->N;
    float *x = random_floats((size_t)M * K, -1.0f, 1.0f, rng);
    float *w = random_floats((size_t)N * K, -sqrtf(3.0f / K), sqrtf(3.0f / K), rng);
    void *dsrc = test_to_device(gpu[d], x, (size_t)M * K); /* every rank's chunk, where peers send from */
    void *dw = test_to_device(gpu[d], w, (size_t)N * K);
    float *ref = malloc((size_t)M * N * sizeof(float)), *y = malloc((size_t)M * N * sizeof(float));
    assert_nopad_ok(cpu->gemm(cpu, ref, x, w, NULL, NULL, (int32_t)M, K, N, NOPAD_EPILOGUE_NONE, NOPAD_ACT_GELU));

    void *gathered = dev_alloc((size_t)(M ? M : 1) * K * 2), *dy = dev_alloc((size_t)(M ? M : 1) * N * 2);
    uint32_t *signals = dev_alloc(W * sizeof(uint32_t)), *error = dev_alloc(sizeof(uint32_t));
    assert_int_equal(cudaMemset(signals, 0, W * sizeof(uint32_t)), cudaSuccess);
    assert_int_equal(cudaMemset(error, 0, sizeof(uint32_t)), cudaSuccess);
    cuda_flux_peers peers = {.world = W, .rank = r, .error = error, .timeout_ns = CUDA_FLUX_DEFAULT_TIMEOUT_NS,
                             .max_ctas = c->max_ctas};
    for (int i = 0; i < W; i++) peers.buffers[i] = gathered, peers.signals[i] = signals; /* only rank r's are read */

    char what[160];
    double worst = 0;
    for (int round = 0; round < 2; round++) {
        const uint32_t epoch = 1000u * (uint32_t)round + 1u + test_rand_u32(rng) % 999u;
        poison(d, gathered, (size_t)M * K);
        poison(d, dy, (size_t)M * N);
        const size_t es = 2;
        assert_int_equal(cudaMemcpy((char *)gathered + row0[r] * K * es, (char *)dsrc + row0[r] * K * es,
                                    (size_t)c->rows[r] * K * es, cudaMemcpyDeviceToDevice),
                         cudaSuccess);
        int order[CUDA_FLUX_MAX_WORLD], n = 0;
        for (int i = 0; i < W; i++)
            if (i != r) order[n++] = i;
        shuffle(order, n, rng);
        cuda_flux_arrival items[CUDA_FLUX_MAX_WORLD];
        for (int i = 0; i < n; i++) {
            const int from = order[i];
            items[i] = (cuda_flux_arrival){.src = (char *)dsrc + row0[from] * K * es,
                                           .dst = (char *)gathered + row0[from] * K * es,
                                           .bytes = (uint64_t)c->rows[from] * K * es,
                                           .signals = signals + from, .n_signals = 1, .value = epoch};
        }
        cuda_flux_arrival *ditems = upload_arrivals(items, n, rng);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        assert_nopad_ok(cuda_flux_emulate_arrivals(ditems, n, peer_stream));
        assert_nopad_ok(cuda_flux_ag_gemm(DTYPES[d], dy, dw, &peers, c->rows, K, N, epoch, c->config, streams[d]));
        assert_nopad_ok(cuda_flux_check(&peers, streams[d]));
        assert_int_equal(cudaStreamSynchronize(peer_stream), cudaSuccess);
        cudaFree(ditems);
        assert_nopad_ok(gpu[d]->download_f32(gpu[d], y, dy, (size_t)M * N));
        snprintf(what, sizeof what, "%s all-gather+gemm W %d rank %d config %d M %lld K %d N %d round %d",
                 DTYPE_NAMES[d], W, r, c->config, (long long)M, K, N, round);
        const double err = row_error(what, y, ref, M, N);
        if (!(err <= BOUND[d])) check_failed("%s: row rel err %.3g > %.3g", what, err, BOUND[d]);
        if (err > worst) worst = err;
    }
    cudaFree(gathered), cudaFree(dy), cudaFree(signals), cudaFree(error);
    gpu[d]->free(gpu[d], dsrc), gpu[d]->free(gpu[d], dw);
    free(x), free(w), free(ref), free(y);
    return worst;
}

static void test_ag_gemm(void **state) {
    (void)state;
    failures = 0;
    uint64_t rng = 0x666c75782d6167ULL;
    const int worlds[] = {2, 4, 8};
    for (int d = 0; d < 2; d++) {
        double worst = 0, worst_cfg[CUDA_FLUX_N_CONFIGS] = {0};
        for (int wi = 0; wi < 3; wi++)
            for (int config = 0; config < CUDA_FLUX_N_CONFIGS; config++) {
                flux_case c = {.d = d, .W = worlds[wi], .config = config, .K = 256, .N = 328};
                random_rows(c.rows, c.W, 1, 300, &rng);
                c.rank = (int)(test_rand_u32(&rng) % (uint32_t)c.W);
                double e = run_ag(&c, &rng);
                if (!(e <= worst_cfg[config])) worst_cfg[config] = e;
                c.rank = (c.rank + 1) % c.W; /* a second rank's view of the same sizes */
                e = run_ag(&c, &rng);
                if (!(e <= worst_cfg[config])) worst_cfg[config] = e;
            }
        for (int config = 0; config < CUDA_FLUX_N_CONFIGS; config++) {
            printf("%s all-gather+gemm config %d (%s): worst row rel err %.3g\n", DTYPE_NAMES[d], config,
                   cuda_flux_config_name(config), worst_cfg[config]);
            if (!(worst_cfg[config] <= worst)) worst = worst_cfg[config];
        }
        /* a rank with no rows, and a K of several pipeline rounds: the pick's and every configuration */
        for (int config = CUDA_FLUX_CONFIG_AUTO; config < CUDA_FLUX_N_CONFIGS; config++) {
            flux_case c = {.d = d, .W = 4, .rank = 1, .config = config, .rows = {129, 0, 77, 257}, .K = 1024, .N = 264};
            const double e = run_ag(&c, &rng);
            if (!(e <= worst)) worst = e;
        }
        /* more tiles than SMs (~160 of 128 x 256, ~290 of 128 x 128 at 132 SMs; 16 slices a
         * tile), the last column tile reaching past N; W = 8 */
        for (int config = 0; config < CUDA_FLUX_N_CONFIGS; config++) {
            const flux_case c = {.d = d, .W = 8, .config = config, .K = 1024, .N = 1032};
            worst = worse(worst, run_many_tiles("all-gather+gemm", c, run_ag, &rng));
        }
        printf("%s all-gather+gemm worst row rel err %.3g (bound %.3g)\n", DTYPE_NAMES[d], worst, BOUND[d]);
    }
    fail_if_failed("all-gather+gemm");
}

/* Every rank pushes its chunk into the others' buffers with cuda_flux_ag_push (W buffers, W signal
 * sets); then every rank's fused GEMM gives the full product. */
static void test_ag_push(void **state) {
    (void)state;
    failures = 0;
    uint64_t rng = 0x70757368ULL;
    enum { W = 4 };
    const int d = 0;
    int32_t rows[W];
    random_rows(rows, W, 20, 200, &rng);
    int64_t M = 0, row0[W];
    for (int i = 0; i < W; i++) row0[i] = M, M += rows[i];
    const int32_t K = 128, N = 136;
    float *x = random_floats((size_t)M * K, -1.0f, 1.0f, &rng);
    float *w = random_floats((size_t)N * K, -0.15f, 0.15f, &rng);
    void *dsrc = test_to_device(gpu[d], x, (size_t)M * K), *dw = test_to_device(gpu[d], w, (size_t)N * K);
    float *ref = malloc((size_t)M * N * sizeof(float)), *y = malloc((size_t)M * N * sizeof(float));
    assert_nopad_ok(cpu->gemm(cpu, ref, x, w, NULL, NULL, (int32_t)M, K, N, NOPAD_EPILOGUE_NONE, NOPAD_ACT_GELU));
    cuda_flux_peers peers = {.world = W, .error = dev_alloc(4), .timeout_ns = CUDA_FLUX_DEFAULT_TIMEOUT_NS};
    assert_int_equal(cudaMemset(peers.error, 0, 4), cudaSuccess);
    for (int i = 0; i < W; i++) {
        peers.buffers[i] = dev_alloc((size_t)M * K * 2);
        peers.signals[i] = dev_alloc(W * sizeof(uint32_t));
        assert_int_equal(cudaMemset(peers.signals[i], 0, W * sizeof(uint32_t)), cudaSuccess);
        poison(d, peers.buffers[i], (size_t)M * K);
        assert_int_equal(cudaMemcpy((char *)peers.buffers[i] + row0[i] * K * 2, (char *)dsrc + row0[i] * K * 2,
                                    (size_t)rows[i] * K * 2, cudaMemcpyDeviceToDevice),
                         cudaSuccess);
    }
    void *dy = dev_alloc((size_t)M * N * 2);
    const uint32_t epoch = 77;
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    for (int from = 0; from < W; from++) {
        cuda_flux_peers view = peers;
        view.rank = from;
        assert_nopad_ok(cuda_flux_ag_push(DTYPES[d], &view, rows, K, epoch, peer_stream));
    }
    for (int r = 0; r < W; r++) {
        peers.rank = r;
        poison(d, dy, (size_t)M * N);
        assert_nopad_ok(cuda_flux_ag_gemm(DTYPES[d], dy, dw, &peers, rows, K, N, epoch, CUDA_FLUX_CONFIG_AUTO,
                                          streams[d]));
        assert_nopad_ok(cuda_flux_check(&peers, streams[d]));
        assert_nopad_ok(gpu[d]->download_f32(gpu[d], y, dy, (size_t)M * N));
        char what[96];
        snprintf(what, sizeof what, "pushed all-gather+gemm rank %d of %d", r, W);
        const double err = row_error(what, y, ref, M, N);
        if (!(err <= BOUND[d])) check_failed("%s: row rel err %.3g > %.3g", what, err, BOUND[d]);
    }
    assert_int_equal(cudaStreamSynchronize(peer_stream), cudaSuccess);
    for (int i = 0; i < W; i++) cudaFree(peers.buffers[i]), cudaFree(peers.signals[i]);
    cudaFree(peers.error), cudaFree(dy);
    gpu[d]->free(gpu[d], dsrc), gpu[d]->free(gpu[d], dw);
    free(x), free(w), free(ref), free(y);
    fail_if_failed("pushed all-gather+gemm");
}

/* ---- GEMM+ReduceScatter ---- */

/* Returns the row error of y (the local chunk's sum) or, with c->missing >= 0, checks the timeout. */
static double run_rs(const flux_case *c, uint64_t *rng) {
    const int d = c->d, W = c->W, r = c->rank;
    int64_t M = 0, row0[CUDA_FLUX_MAX_WORLD + 1];
    for (int i = 0; i < W; i++) row0[i] = M, M += c->rows[i];
    row0[W] = M;
    const int32_t K = c->K, N = c->N, rows_r = c->rows[r];
    const int config = c->config == CUDA_FLUX_CONFIG_AUTO ? cuda_flux_pick(c->rows, W, K, N) : c->config;
    const float ws = sqrtf(3.0f / K);

    /* every rank's partial on the CPU; the others' rounded to the dtype, as their GEMMs store them */
    float *partial[CUDA_FLUX_MAX_WORLD];
    float *x_r = NULL, *w_r = NULL;
    void *dx = NULL, *dw = NULL;
    for (int s = 0; s < W; s++) {
        float *x = random_floats((size_t)M * K, -1.0f, 1.0f, rng), *w = random_floats((size_t)N * K, -ws, ws, rng);
        partial[s] = malloc((size_t)(M ? M : 1) * N * sizeof(float));
        if (s == r) {
            dx = test_to_device(gpu[d], x, (size_t)M * K), dw = test_to_device(gpu[d], w, (size_t)N * K);
            x_r = x, w_r = w;
        } else {
            /* the same rounding the GPU applies to its inputs */
            gpu[d]->free(gpu[d], test_to_device(gpu[d], x, (size_t)M * K));
            gpu[d]->free(gpu[d], test_to_device(gpu[d], w, (size_t)N * K));
        }
        assert_nopad_ok(cpu->gemm(cpu, partial[s], x, w, NULL, NULL, (int32_t)M, K, N, NOPAD_EPILOGUE_NONE,
                                  NOPAD_ACT_GELU));
        if (s != r) {
            gpu[d]->free(gpu[d], test_to_device(gpu[d], partial[s], (size_t)M * N));
            free(x), free(w);
        }
    }

    /* the W inboxes and signal sets; the others' partials of the local chunk staged to be fed in */
    void *inbox[CUDA_FLUX_MAX_WORLD];
    uint32_t *signals[CUDA_FLUX_MAX_WORLD];
    size_t n_words[CUDA_FLUX_MAX_WORLD];
    cuda_flux_peers peers = {.world = W, .rank = r, .error = dev_alloc(4), .timeout_ns = c->timeout_ns,
                             .max_ctas = c->max_ctas};
    assert_int_equal(cudaMemset(peers.error, 0, 4), cudaSuccess);
    for (int i = 0; i < W; i++) {
        inbox[i] = dev_alloc(cuda_flux_rs_inbox_bytes(DTYPES[d], c->rows[i], N, W) + 16);
        n_words[i] = cuda_flux_rs_signal_words(c->rows[i], N, W);
        signals[i] = dev_alloc(n_words[i] * sizeof(uint32_t) + 4);
        assert_int_equal(cudaMemset(signals[i], 0, n_words[i] * sizeof(uint32_t)), cudaSuccess);
        poison(d, inbox[i], (size_t)W * c->rows[i] * N);
        peers.buffers[i] = inbox[i], peers.signals[i] = signals[i];
    }
    float *staged_host = malloc((size_t)(rows_r ? W * rows_r : 1) * N * sizeof(float));
    for (int s = 0; s < W; s++)
        memcpy(staged_host + (size_t)s * rows_r * N, partial[s] + row0[r] * N, (size_t)rows_r * N * sizeof(float));
    void *staged = test_to_device(gpu[d], staged_host, (size_t)W * rows_r * N);
    int32_t tiles_m, tiles_n;
    cuda_flux_rs_tiles(config, rows_r, N, &tiles_m, &tiles_n);
    const uint32_t epoch = 5 + test_rand_u32(rng) % 1000u;
    int order[CUDA_FLUX_MAX_WORLD], n = 0;
    for (int s = 0; s < W; s++)
        if (s != r && s != c->missing) order[n++] = s;
    shuffle(order, n, rng);
    cuda_flux_arrival items[CUDA_FLUX_MAX_WORLD];
    for (int i = 0; i < n; i++) {
        const int s = order[i];
        const size_t slot = (size_t)s * rows_r * N * 2;
        items[i] = (cuda_flux_arrival){.src = (char *)staged + slot, .dst = (char *)inbox[r] + slot,
                                       .bytes = (uint64_t)rows_r * N * 2,
                                       .signals = signals[r] + cuda_flux_rs_signal_index(config, rows_r, N, W, s, 0, 0),
                                       .n_signals = (uint32_t)(tiles_m * tiles_n), .value = epoch};
    }
    cuda_flux_arrival *ditems = upload_arrivals(items, n, rng);
    void *dy = dev_alloc((size_t)(rows_r ? rows_r : 1) * N * 2);
    poison(d, dy, (size_t)rows_r * N);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_nopad_ok(cuda_flux_emulate_arrivals(ditems, n, peer_stream));
    assert_nopad_ok(cuda_flux_gemm_rs(DTYPES[d], dy, dx, dw, &peers, c->rows, K, N, epoch, c->config, streams[d]));
    const nopad_status st = cuda_flux_check(&peers, streams[d]);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_int_equal(cudaStreamSynchronize(peer_stream), cudaSuccess);
    const double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);

    char what[160];
    snprintf(what, sizeof what, "%s gemm+reduce-scatter W %d rank %d config %d M %lld K %d N %d", DTYPE_NAMES[d], W,
             r, config, (long long)M, K, N);
    double err = 0;
    if (c->missing >= 0) {
        char expect[64];
        snprintf(expect, sizeof expect, "partial tiles of rank %d did not arrive", c->missing);
        assert_nopad_error(st, NOPAD_ERR_BACKEND, expect);
        if (secs > 5.0) fail_msg("%s: the timeout took %.1f s", what, secs);
    } else {
        assert_nopad_ok(st);
        /* the local chunk: this rank's fp32 partial plus the others' rounded ones */
        float *ref = malloc((size_t)(rows_r ? rows_r : 1) * N * sizeof(float));
        float *y = malloc((size_t)(W * (M ? M : 1)) * N * sizeof(float));
        for (int64_t i = 0; i < (int64_t)rows_r * N; i++) {
            double v = 0;
            for (int s = 0; s < W; s++) v += partial[s][row0[r] * N + i];
            ref[i] = (float)v;
        }
        assert_nopad_ok(gpu[d]->download_f32(gpu[d], y, dy, (size_t)rows_r * N));
        err = row_error(what, y, ref, rows_r, N);
        if (!(err <= BOUND[d])) check_failed("%s: row rel err %.3g > %.3g", what, err, BOUND[d]);
        /* this rank's partial tiles in every other rank's inbox, slot r, and their signals */
        for (int o = 0; o < W; o++) {
            if (o == r || c->rows[o] == 0) continue;
            assert_nopad_ok(gpu[d]->download_f32(gpu[d], y, inbox[o], (size_t)W * c->rows[o] * N));
            char sub[200];
            snprintf(sub, sizeof sub, "%s: rank %d's inbox", what, o);
            const double e = row_error(sub, y + (size_t)r * c->rows[o] * N, partial[r] + row0[o] * N, c->rows[o], N);
            if (!(e <= BOUND[d])) check_failed("%s: row rel err %.3g > %.3g", sub, e, BOUND[d]);
            int32_t tm, tn;
            cuda_flux_rs_tiles(config, c->rows[o], N, &tm, &tn);
            uint32_t *words = malloc(n_words[o] * sizeof(uint32_t));
            assert_int_equal(cudaMemcpy(words, signals[o], n_words[o] * sizeof(uint32_t), cudaMemcpyDeviceToHost),
                             cudaSuccess);
            for (int32_t t = 0; t < tm * tn; t++) {
                const int64_t at = cuda_flux_rs_signal_index(config, c->rows[o], N, W, r, t / tn, t % tn);
                if (words[at] != epoch) {
                    check_failed("%s: signal of tile %d is %u, not %u", sub, t, words[at], epoch);
                    break;
                }
            }
            free(words);
        }
        free(ref), free(y);
    }
    cudaFree(ditems), cudaFree(dy), cudaFree(peers.error);
    for (int i = 0; i < W; i++) cudaFree(inbox[i]), cudaFree(signals[i]);
    gpu[d]->free(gpu[d], staged), gpu[d]->free(gpu[d], dx), gpu[d]->free(gpu[d], dw);
    for (int s = 0; s < W; s++) free(partial[s]);
    free(staged_host), free(x_r), free(w_r);
    return err;
}

static void test_gemm_rs(void **state) {
    (void)state;
    failures = 0;
    uint64_t rng = 0x666c75782d7273ULL;
    const int worlds[] = {2, 4, 8};
    for (int d = 0; d < 2; d++) {
        double worst = 0, worst_cfg[CUDA_FLUX_N_CONFIGS] = {0};
        for (int wi = 0; wi < 3; wi++)
            for (int config = 0; config < CUDA_FLUX_N_CONFIGS; config++)
                for (int k = 0; k < 2; k++) {
                    flux_case c = {.d = d, .W = worlds[wi], .config = config, .K = 192, .N = 200,
                                   .timeout_ns = CUDA_FLUX_DEFAULT_TIMEOUT_NS, .missing = -1};
                    random_rows(c.rows, c.W, 1, 300, &rng);
                    c.rank = (int)(test_rand_u32(&rng) % (uint32_t)c.W);
                    const double e = run_rs(&c, &rng);
                    if (!(e <= worst_cfg[config])) worst_cfg[config] = e;
                }
        for (int config = 0; config < CUDA_FLUX_N_CONFIGS; config++) {
            printf("%s gemm+reduce-scatter config %d (%s): worst row rel err %.3g\n", DTYPE_NAMES[d], config,
                   cuda_flux_config_name(config), worst_cfg[config]);
            if (!(worst_cfg[config] <= worst)) worst = worst_cfg[config];
        }
        for (int config = CUDA_FLUX_CONFIG_AUTO; config < CUDA_FLUX_N_CONFIGS; config++) {
            flux_case c = {.d = d, .W = 4, .rank = 2, .config = config, .rows = {300, 0, 131, 255}, .K = 1024, .N = 392,
                           .timeout_ns = CUDA_FLUX_DEFAULT_TIMEOUT_NS, .missing = -1};
            const double e = run_rs(&c, &rng);
            if (!(e <= worst)) worst = e;
            /* the rank with no rows: no local tile, no sum (the TMA configurations encode no inbox
             * map for it); its partial tiles still go to every other rank's inbox */
            c.rank = 1;
            run_rs(&c, &rng);
        }
        /* more tiles than SMs (~145 of 128 x 256, ~270 of 128 x 128): persistent CTAs take several
         * tiles, remote and local ones (the local chunk's last, waiting for the peers' partials) */
        for (int config = 0; config < CUDA_FLUX_N_CONFIGS; config++) {
            const flux_case c = {.d = d, .W = 4, .config = config, .K = 512, .N = 2056,
                                 .timeout_ns = CUDA_FLUX_DEFAULT_TIMEOUT_NS, .missing = -1};
            worst = worse(worst, run_many_tiles("gemm+reduce-scatter", c, run_rs, &rng));
        }
        printf("%s gemm+reduce-scatter worst row rel err %.3g (bound %.3g)\n", DTYPE_NAMES[d], worst, BOUND[d]);
    }
    fail_if_failed("gemm+reduce-scatter");
}

/* ---- a chunk that never arrives ---- */

static void test_timeout(void **state) {
    (void)state;
    uint64_t rng = 0x74696d656f7574ULL;
    enum { W = 4 };
    const int d = 1, r = 1, missing = 3;
    const int32_t rows[4] = {100, 131, 64, 200}, K = 128, N = 256;
    int64_t M = 0;
    for (int i = 0; i < W; i++) M += rows[i];
    void *gathered = dev_alloc((size_t)M * K * 2), *dw = dev_alloc((size_t)N * K * 2), *dy = dev_alloc((size_t)M * N * 2);
    poison(d, gathered, (size_t)M * K);
    poison(d, dw, (size_t)N * K);
    uint32_t *signals = dev_alloc(W * 4), *error = dev_alloc(4);
    assert_int_equal(cudaMemset(error, 0, 4), cudaSuccess);
    const uint32_t epoch = 9, present[4] = {epoch, 0, epoch, 0}; /* rank 3's chunk never comes */
    assert_int_equal(cudaMemcpy(signals, present, sizeof present, cudaMemcpyHostToDevice), cudaSuccess);
    cuda_flux_peers peers = {.world = W, .rank = r, .error = error, .timeout_ns = TIMEOUT_NS};
    for (int i = 0; i < W; i++) peers.buffers[i] = gathered, peers.signals[i] = signals;
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    for (int config = 0; config < CUDA_FLUX_N_CONFIGS; config++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        assert_nopad_ok(cuda_flux_ag_gemm(DTYPES[d], dy, dw, &peers, rows, K, N, epoch, config, streams[d]));
        char expect[64];
        snprintf(expect, sizeof expect, "chunk of rank %d did not arrive", missing);
        assert_nopad_error(cuda_flux_check(&peers, streams[d]), NOPAD_ERR_BACKEND, expect);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        printf("all-gather+gemm config %d: missing chunk reported after %.3f s (timeout %.3f s)\n", config, secs,
               TIMEOUT_NS / 1e9);
        if (secs > 5.0) fail_msg("the timeout took %.1f s", secs);
    }
    /* the error word was cleared: with the chunk signalled, the same call succeeds */
    assert_nopad_ok(cuda_flux_signal(signals + missing, 1, epoch, streams[d]));
    assert_nopad_ok(cuda_flux_ag_gemm(DTYPES[d], dy, dw, &peers, rows, K, N, epoch, CUDA_FLUX_CONFIG_AUTO, streams[d]));
    assert_nopad_ok(cuda_flux_check(&peers, streams[d]));
    cudaFree(gathered), cudaFree(dw), cudaFree(dy), cudaFree(signals), cudaFree(error);

    /* GEMM+ReduceScatter: one source's partials never come, in every configuration */
    for (int config = 0; config < CUDA_FLUX_N_CONFIGS; config++) {
        flux_case c = {.d = 0, .W = 4, .rank = 0, .config = config, .rows = {257, 3, 128, 99},
                       .K = 128, .N = 136, .timeout_ns = TIMEOUT_NS, .missing = 2};
        run_rs(&c, &rng);
    }
}

/* ---- a CUDA graph ---- */

/* Both kernels record into a CUDA graph (thread-local capture, as the backend records forwards) and
 * replay with every chunk and partial present (signals set before): no allocation, no
 * synchronisation, nothing capture refuses; each replay gives the reference. */
static void test_graph(void **state) {
    (void)state;
    uint64_t rng = 0x6772617068ULL;
    enum { W = 4 };
    const int d = 0, r = 2;
    const int32_t rows[W] = {70, 129, 64, 3}, K = 128, N = 136;
    int64_t M = 0;
    for (int i = 0; i < W; i++) M += rows[i];
    float *x = random_floats((size_t)M * K, -1.0f, 1.0f, &rng), *w = random_floats((size_t)N * K, -0.15f, 0.15f, &rng);
    void *dx = test_to_device(gpu[d], x, (size_t)M * K), *dw = test_to_device(gpu[d], w, (size_t)N * K);
    float *ref = malloc((size_t)M * N * sizeof(float)), *y = malloc((size_t)M * N * sizeof(float));
    assert_nopad_ok(cpu->gemm(cpu, ref, x, w, NULL, NULL, (int32_t)M, K, N, NOPAD_EPILOGUE_NONE, NOPAD_ACT_GELU));
    const uint32_t epoch = 3;
    /* AllGather+GEMM: the gathered buffer complete, every chunk signalled */
    uint32_t *signals = dev_alloc(cuda_flux_rs_signal_words(rows[r], N, W) * 4 + 64), *error = dev_alloc(4);
    assert_int_equal(cudaMemset(error, 0, 4), cudaSuccess);
    assert_nopad_ok(cuda_flux_signal(signals, W, epoch, streams[d]));
    cuda_flux_peers peers = {.world = W, .rank = r, .error = error, .timeout_ns = TIMEOUT_NS};
    for (int i = 0; i < W; i++) peers.buffers[i] = dx, peers.signals[i] = signals;
    void *dy = dev_alloc((size_t)M * N * 2);
    assert_int_equal(cudaStreamSynchronize(streams[d]), cudaSuccess);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    /* the pick's configuration, and the TMA ones (their tensor maps are encoded on the host during
     * the capture and baked into the graph as kernel parameters) */
    const int graph_configs[3] = {CUDA_FLUX_CONFIG_AUTO, CUDA_FLUX_CONFIG_TMA_256, CUDA_FLUX_CONFIG_TMA_128};
    for (int gc = 0; gc < 3; gc++) {
        assert_int_equal(cudaStreamBeginCapture(streams[d], cudaStreamCaptureModeThreadLocal), cudaSuccess);
        assert_nopad_ok(
            cuda_flux_ag_gemm(DTYPES[d], dy, dw, &peers, rows, K, N, epoch, graph_configs[gc], streams[d]));
        assert_int_equal(cudaStreamEndCapture(streams[d], &graph), cudaSuccess);
        assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        for (int replay = 0; replay < 2; replay++) {
            poison(d, dy, (size_t)M * N);
            assert_int_equal(cudaGraphLaunch(exec, streams[d]), cudaSuccess);
            assert_nopad_ok(cuda_flux_check(&peers, streams[d]));
            assert_nopad_ok(gpu[d]->download_f32(gpu[d], y, dy, (size_t)M * N));
            const double err = row_error("graph all-gather+gemm", y, ref, M, N);
            if (!(err <= BOUND[d]))
                fail_msg("graph all-gather+gemm config %d replay %d: row rel err %.3g", graph_configs[gc], replay, err);
        }
        cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
    }

    /* GEMM+ReduceScatter at W = 1 (its own inbox, no peer: y is this rank's partial) in a graph:
     * the pick's configuration and the TMA ones */
    const int32_t all[1] = {(int32_t)M};
    cuda_flux_peers one = {.world = 1, .rank = 0, .error = error, .timeout_ns = TIMEOUT_NS};
    one.buffers[0] = dev_alloc(cuda_flux_rs_inbox_bytes(DTYPES[d], (int32_t)M, N, 1)), one.signals[0] = signals;
    for (int gc = 0; gc < 3; gc++) {
        assert_int_equal(cudaStreamBeginCapture(streams[d], cudaStreamCaptureModeThreadLocal), cudaSuccess);
        assert_nopad_ok(
            cuda_flux_gemm_rs(DTYPES[d], dy, dx, dw, &one, all, K, N, epoch, graph_configs[gc], streams[d]));
        assert_int_equal(cudaStreamEndCapture(streams[d], &graph), cudaSuccess);
        assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        poison(d, dy, (size_t)M * N);
        assert_int_equal(cudaGraphLaunch(exec, streams[d]), cudaSuccess);
        assert_nopad_ok(cuda_flux_check(&one, streams[d]));
        assert_nopad_ok(gpu[d]->download_f32(gpu[d], y, dy, (size_t)M * N));
        const double err = row_error("graph gemm+reduce-scatter", y, ref, M, N);
        if (!(err <= BOUND[d])) fail_msg("graph gemm+reduce-scatter config %d: row rel err %.3g", graph_configs[gc], err);
        cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
    }
    cudaFree(one.buffers[0]), cudaFree(signals), cudaFree(error), cudaFree(dy);
    gpu[d]->free(gpu[d], dx), gpu[d]->free(gpu[d], dw);
    free(x), free(w), free(ref), free(y);
}

static void test_unsupported(void **state) {
    (void)state;
    void *buf = dev_alloc(1 << 20);
    uint32_t *words = dev_alloc(64);
    cuda_flux_peers peers = {.world = 2, .rank = 0, .error = words + 8};
    for (int i = 0; i < 2; i++) peers.buffers[i] = buf, peers.signals[i] = words;
    const int32_t rows[2] = {3, 4};
    cudaStream_t s = streams[0];
    assert_nopad_error(cuda_flux_ag_gemm(NOPAD_DTYPE_F16, buf, buf, &peers, rows, 96, 64, 1, -1, s),
                       NOPAD_ERR_UNSUPPORTED, "multiple of 64");
    assert_nopad_error(cuda_flux_ag_gemm(NOPAD_DTYPE_F16, buf, buf, &peers, rows, 64, 60, 1, -1, s),
                       NOPAD_ERR_UNSUPPORTED, "of 8");
    assert_nopad_error(cuda_flux_gemm_rs(NOPAD_DTYPE_F32, buf, buf, buf, &peers, rows, 64, 64, 1, -1, s),
                       NOPAD_ERR_UNSUPPORTED, "dtype");
    assert_nopad_error(cuda_flux_gemm_rs(NOPAD_DTYPE_F16, buf, (char *)buf + 2, buf, &peers, rows, 64, 64, 1, -1, s),
                       NOPAD_ERR_UNSUPPORTED, "aligned");
    assert_nopad_error(cuda_flux_ag_gemm(NOPAD_DTYPE_F16, buf, buf, &peers, rows, 64, 64, 1, 7, s),
                       NOPAD_ERR_INVALID_ARGUMENT, "no config");
    peers.max_ctas = -1;
    assert_nopad_error(cuda_flux_gemm_rs(NOPAD_DTYPE_F16, buf, buf, buf, &peers, rows, 64, 64, 1, 2, s),
                       NOPAD_ERR_INVALID_ARGUMENT, "max_ctas");
    peers.max_ctas = 0;
    peers.world = CUDA_FLUX_MAX_WORLD + 1;
    assert_nopad_error(cuda_flux_ag_gemm(NOPAD_DTYPE_F16, buf, buf, &peers, rows, 64, 64, 1, -1, s),
                       NOPAD_ERR_INVALID_ARGUMENT, "world");
    peers.world = 2, peers.rank = 2;
    assert_nopad_error(cuda_flux_gemm_rs(NOPAD_DTYPE_BF16, buf, buf, buf, &peers, rows, 64, 64, 1, -1, s),
                       NOPAD_ERR_INVALID_ARGUMENT, "rank 2");
    peers.rank = 0, peers.signals[1] = NULL;
    assert_nopad_error(cuda_flux_ag_gemm(NOPAD_DTYPE_F16, buf, buf, &peers, rows, 64, 64, 1, -1, s),
                       NOPAD_ERR_INVALID_ARGUMENT, "NULL");
    cudaFree(buf), cudaFree(words);
}

int main(void) {
    if (test_skip_without_gpu()) return 77;
    if (nopad_backend_cpu_create(0, &cpu) != NOPAD_OK) return 1;
    for (int d = 0; d < 2; d++)
        if (cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking) != cudaSuccess ||
            nopad_backend_cuda_create(DTYPES[d], 0, streams[d], &gpu[d]) != NOPAD_OK)
            return 1;
    int lowest, highest;
    if (cudaDeviceGetStreamPriorityRange(&lowest, &highest) != cudaSuccess ||
        cudaStreamCreateWithPriority(&peer_stream, cudaStreamNonBlocking, highest) != cudaSuccess)
        return 1;
    if (getenv("NOPAD_TEST_FILTER")) cmocka_set_test_filter(getenv("NOPAD_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unsupported), cmocka_unit_test(test_timeout), cmocka_unit_test(test_ag_gemm),
        cmocka_unit_test(test_ag_push),     cmocka_unit_test(test_gemm_rs),     cmocka_unit_test(test_graph),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int d = 0; d < 2; d++) {
        gpu[d]->destroy(gpu[d]);
        cudaStreamDestroy(streams[d]);
    }
    cudaStreamDestroy(peer_stream);
    cpu->destroy(cpu);
    return rc;
}

/* Flux benchmark (backend/cuda/flux/flux.h) on one GPU with emulated peers, at the tensor-parallel
 * layer GEMMs of LLaMA-3-8B (hidden 4096, qkv 6144, FFN 14336) and LLaMA-3-70B (8192, 10240, 28672):
 *   ag qkv      AllGather+GEMM  x[T, H] gathered, w [qkv/tp, H]
 *   ag gate_up  AllGather+GEMM  x[T, H] gathered, w [2·FFN/tp, H]
 *   rs o        GEMM+ReduceScatter  x[T, H/tp], w [H, H/tp]
 *   rs down     GEMM+ReduceScatter  x[T, FFN/tp], w [H, FFN/tp]
 * at T tokens in all (T / tp rows a rank), this process playing rank 0, for:
 *   plain    the cuBLASLt GEMM of the same shape (what the unfused path runs after or before its
 *            collective; the GEMM+ReduceScatter's is the partial [T, H] GEMM);
 *   fused    each tile configuration and the one cuda_flux_pick takes, every chunk present (every
 *            signal set before the kernel): the fusion's own cost;
 *   delayed  the fastest configuration (or --pick's) with the other ranks' chunks arriving as over
 *            a link of --rate-gbs GB/s (default 400, NVLink 4 one direction on an H100 SXM): chunk p
 *            (p = 1 .. tp-1, in the kernel's order) signalled p·bytes/rate after the kernel starts,
 *            by one CTA on a second stream (cuda_flux_emulate_arrivals; the data itself is already
 *            there, so the link's traffic costs this GPU's memory nothing); bytes = a rank's chunk
 *            of x (AllGather) or its partial of the local chunk of y (ReduceScatter). The
 *            persistent grid runs on SMs - 1 CTAs here by default (--delayed-ctas): the arrivals
 *            CTA must be resident beside it, and with one persistent CTA on every SM it waited for
 *            an SM to free up, which delayed every emulated signal (on an H100 the share hidden at
 *            T = 16384 went from -14..-73% to +26..+87% at 10 of 12 ReduceScatter points with one
 *            SM left free: bench/results/flux_2026-12-07d_H100). Real peers signal from their own
 *            GPUs, so the fused runs with every chunk present (and --devices) keep the full grid;
 *   comm     (tp-1)·bytes/rate, the collective alone at that rate;
 *   hidden   the share of comm the fused kernel hides: (plain + comm - delayed) / comm, against
 *            running the collective, then the GEMM.
 * The other ranks' inboxes (GEMM+ReduceScatter) share one buffer: the kernel's stores go there
 * as they would over the link, and land on top of each other.
 * Timing: CUDA events around each launch (both streams joined for delayed), 5 warm-up runs, the
 * median of --reps (default 20) timed runs per variant. Random data (fixed seed, never zeros).
 *
 * With --devices N (N GPUs of one host, peer access between them; bench/flux_multi.sh), the real
 * thing instead, all ranks in this process (one stream pair per GPU), tp = N, host wall-clock around
 * the launches on every GPU until all are done (median of --reps after the warm-up):
 *   gemm     every rank's cuBLASLt GEMM alone;
 *   comm     the NCCL collective alone (ncclAllGather of the chunks / ncclReduceScatter of the
 *            partials; libnccl opened at run time, $NOPAD_NCCL_LIBRARY or libnccl.so.2);
 *   unfused  the collective, then cuBLASLt (AllGather) or cuBLASLt, then the collective;
 *   fused    AllGather: each rank pushes its chunk to the others by the copy engine
 *            (cuda_flux_ag_push, a stream of its own) while its fused kernel runs; ReduceScatter:
 *            the fused kernel, storing into the peers' inboxes over NVLink;
 *   hidden   (unfused - fused) / comm; and the fused output against the unfused one (max row
 *            relative error over rank 0's output, a check that the peers' data arrived).
 * NVLink multicast is never used; keep NCCL_NVLS_ENABLE=0 in the environment.
 *
 * Usage: flux_bench --help (below, in usage()). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dlfcn.h>

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/flux/flux.h"
#include "backend/cuda/gemm/cublaslt.h"

#include "bench_check.h"

enum { WARMUP = 5, MAX_REPS = 200, MAX_LIST = 8, PATTERN_ELEMS = 16 << 20 };

typedef struct model_shape {
    const char *name;
    int32_t hidden, qkv, ffn;
} model_shape;
static const model_shape MODELS[2] = {{"8b", 4096, 6144, 14336}, {"70b", 8192, 10240, 28672}};

typedef struct layer_op {
    const char *name;
    int all_gather;
} layer_op;
static const layer_op OPS[4] = {{"qkv", 1}, {"gate_up", 1}, {"o", 0}, {"down", 0}};

static cudaStream_t stream, peer_stream;
static cudaEvent_t ev_start, ev_stop, ev_peer;
static cuda_lt lt;
static nopad_dtype dtype = NOPAD_DTYPE_F16;
static int reps = 20;
static double rate_gbs = 400.0;
/* cuda_flux_peers.max_ctas (0: one CTA a SM) of the fused runs with every chunk present and of --devices
 * (--max-ctas), and of the delayed runs (--delayed-ctas; -1 until main sets the default, SMs - 1) */
static int32_t max_ctas = 0, delayed_ctas = -1;

/* Device pools, sized for the largest shape, filled once with random values. */
static void *pool_x, *pool_w, *pool_y, *pool_inbox, *pool_sink;
static uint32_t *sig_own, *sig_sink, *error_word;
static cuda_flux_arrival *dev_items;

static void parse_list(const char *s, int32_t *out, int *n) {
    *n = 0;
    while (*s && *n < MAX_LIST) {
        out[(*n)++] = (int32_t)strtol(s, (char **)&s, 10);
        if (*s == ',') s++;
    }
}

static void shape_of(const model_shape *m, const layer_op *op, int32_t tp, int32_t *K, int32_t *N) {
    if (op->all_gather) *K = m->hidden, *N = (op->name[0] == 'q' ? m->qkv : 2 * m->ffn) / tp;
    else *K = (op->name[0] == 'o' ? m->hidden : m->ffn) / tp, *N = m->hidden;
}

/* Fills n elements with copies of a random pattern (uploaded once, to the first backend's GPU). */
static void fill_random(nopad_backend *be, void *dst, size_t n) {
    static void *pattern;
    if (!pattern) {
        float *h = malloc((size_t)PATTERN_ELEMS * sizeof(float));
        for (size_t i = 0; i < PATTERN_ELEMS; i++) {
            const float u = bench_uniform();
            h[i] = u == 0.0f ? 0.5f : u; /* never zero */
        }
        CHECK_NOPAD(be->alloc(be, (size_t)PATTERN_ELEMS * 2, &pattern));
        CHECK_NOPAD(be->upload_f32(be, pattern, h, PATTERN_ELEMS));
        free(h);
    }
    for (size_t at = 0; at < n; at += PATTERN_ELEMS) {
        const size_t k = n - at < PATTERN_ELEMS ? n - at : PATTERN_ELEMS;
        CHECK_CUDA(cudaMemcpy((char *)dst + at * 2, pattern, k * 2, cudaMemcpyDefault)); /* any GPU's */
    }
}

typedef struct point {
    const model_shape *m;
    const layer_op *op;
    int32_t T, tp, K, N;
    int32_t rows[CUDA_FLUX_MAX_WORLD];
    cuda_flux_peers peers;
    uint64_t chunk_bytes;
    int n_items;
} point;

typedef enum { RUN_PLAIN, RUN_FUSED, RUN_DELAYED } run_kind;

static uint32_t epoch = 1;

/* One timed launch, ms. Fused with every chunk present: the signals hold the epoch already. Delayed:
 * the signals are cleared first, and the feeder sets them. */
static float run_once(point *p, run_kind kind, int config) {
    cuda_flux_peers peers = p->peers;
    if (kind == RUN_DELAYED) peers.max_ctas = delayed_ctas;
    const size_t own_words = cuda_flux_rs_signal_words(p->rows[0], p->N, p->tp);
    if (kind == RUN_DELAYED)
        CHECK_CUDA(cudaMemsetAsync(sig_own, 0, (p->op->all_gather ? (size_t)p->tp : own_words) * 4, stream));
    CHECK_CUDA(cudaEventRecord(ev_start, stream));
    if (kind == RUN_DELAYED) {
        CHECK_CUDA(cudaStreamWaitEvent(peer_stream, ev_start, 0));
        CHECK_NOPAD(cuda_flux_emulate_arrivals(dev_items, p->n_items, peer_stream));
    }
    if (kind == RUN_PLAIN) {
        CHECK_NOPAD(cuda_lt_matmul(&lt, dtype, pool_y, pool_x, pool_w, NULL, NULL, p->T, p->K, p->N,
                                   CUBLASLT_EPILOGUE_DEFAULT, 0, 0, stream));
    } else if (p->op->all_gather) {
        CHECK_NOPAD(cuda_flux_ag_gemm(dtype, pool_y, pool_w, &peers, p->rows, p->K, p->N, epoch, config, stream));
    } else {
        CHECK_NOPAD(cuda_flux_gemm_rs(dtype, pool_y, pool_x, pool_w, &peers, p->rows, p->K, p->N, epoch, config,
                                      stream));
    }
    if (kind == RUN_DELAYED) {
        CHECK_CUDA(cudaEventRecord(ev_peer, peer_stream));
        CHECK_CUDA(cudaStreamWaitEvent(stream, ev_peer, 0));
    }
    CHECK_CUDA(cudaEventRecord(ev_stop, stream));
    CHECK_CUDA(cudaEventSynchronize(ev_stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, ev_start, ev_stop));
    if (kind != RUN_PLAIN) CHECK_NOPAD(cuda_flux_check(&peers, stream));
    return ms;
}

/* The GEMM rate of this GPU in this run, for the ideal times (BENCHMARKS.md): an 8192^3 cuBLASLt
 * GEMM, median of reps after the warm-up, TFLOP/s. */
static double reference_tflops(nopad_backend *be) {
    const int32_t S = 8192;
    void *a, *b, *c;
    CHECK_CUDA(cudaMalloc(&a, (size_t)S * S * 2));
    CHECK_CUDA(cudaMalloc(&b, (size_t)S * S * 2));
    CHECK_CUDA(cudaMalloc(&c, (size_t)S * S * 2));
    fill_random(be, a, (size_t)S * S);
    fill_random(be, b, (size_t)S * S);
    float ms[MAX_REPS];
    for (int i = 0; i < WARMUP + reps; i++) {
        CHECK_CUDA(cudaEventRecord(ev_start, stream));
        CHECK_NOPAD(cuda_lt_matmul(&lt, dtype, c, a, b, NULL, NULL, S, S, S, CUBLASLT_EPILOGUE_DEFAULT, 0, 0, stream));
        CHECK_CUDA(cudaEventRecord(ev_stop, stream));
        CHECK_CUDA(cudaEventSynchronize(ev_stop));
        if (i >= WARMUP) CHECK_CUDA(cudaEventElapsedTime(&ms[i - WARMUP], ev_start, ev_stop));
    }
    qsort(ms, (size_t)reps, sizeof ms[0], bench_cmp_float);
    cudaFree(a), cudaFree(b), cudaFree(c);
    return 2.0 * S * S * (double)S / (ms[reps / 2] * 1e9);
}

static float median_ms(point *p, run_kind kind, int config) {
    float ms[MAX_REPS];
    for (int i = 0; i < WARMUP; i++) run_once(p, kind, config);
    for (int i = 0; i < reps; i++) ms[i] = run_once(p, kind, config);
    qsort(ms, (size_t)reps, sizeof ms[0], bench_cmp_float);
    return ms[reps / 2];
}

/* ---- several GPUs of one host (--devices N) ---- */

typedef struct nccl_api {
    ncclResult_t (*get_version)(int *);
    ncclResult_t (*comm_init_all)(ncclComm_t *, int, const int *);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*reduce_scatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                   cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    const char *(*error_string)(ncclResult_t);
} nccl_api;
static nccl_api nccl;

#define CHECK_NCCL(x)                                                                               \
    do {                                                                                            \
        ncclResult_t r_ = (x);                                                                      \
        if (r_ != ncclSuccess) {                                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, nccl.error_string(r_));     \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

/* libnccl at run time, as the communicator opens it (the build machine has only the header). */
static void nccl_open(void) {
    const char *path = getenv("NOPAD_NCCL_LIBRARY") ? getenv("NOPAD_NCCL_LIBRARY") : "libnccl.so.2";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "flux_bench: cannot open %s: %s (set NOPAD_NCCL_LIBRARY)\n", path, dlerror());
        exit(1);
    }
    const struct {
        const char *name;
        void *slot;
    } symbols[] = {{"ncclGetVersion", &nccl.get_version},       {"ncclCommInitAll", &nccl.comm_init_all},
                   {"ncclCommDestroy", &nccl.comm_destroy},     {"ncclAllGather", &nccl.all_gather},
                   {"ncclReduceScatter", &nccl.reduce_scatter}, {"ncclGroupStart", &nccl.group_start},
                   {"ncclGroupEnd", &nccl.group_end},           {"ncclGetErrorString", &nccl.error_string}};
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
        void *f = dlsym(lib, symbols[i].name);
        if (!f) {
            fprintf(stderr, "flux_bench: %s has no %s\n", path, symbols[i].name);
            exit(1);
        }
        memcpy(symbols[i].slot, &f, sizeof f);
    }
}

/* One rank: its GPU's streams, cuBLASLt, backend (for the check's downloads) and buffers.
 *   AllGather:     x = the gathered [T, K] (its own chunk at its rows), y / y_ref [T, N];
 *   ReduceScatter: x [T, K], partial [T, N], y / y_ref [T / W, N], inbox [W][T / W][N]. */
typedef struct rank_state {
    cudaStream_t stream, comm;
    cuda_lt *lt;
    nopad_backend *be;
    ncclComm_t nccl_comm;
    void *x, *w, *y, *y_ref, *partial, *inbox;
    uint32_t *signals, *error;
    cuda_flux_peers peers;
} rank_state;

typedef enum { MULTI_GEMM, MULTI_COMM, MULTI_UNFUSED, MULTI_FUSED } multi_mode;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Every rank's part of one run, launched GPU by GPU, timed on the host until all GPUs are done. */
static double multi_once(rank_state *rs, int W, const point *p, multi_mode mode) {
    const int ag = p->op->all_gather;
    const ncclDataType_t nt = dtype == NOPAD_DTYPE_BF16 ? ncclBfloat16 : ncclFloat16;
    const size_t rows = (size_t)p->rows[0];
    for (int d = 0; d < W; d++) {
        CHECK_CUDA(cudaSetDevice(d));
        CHECK_CUDA(cudaDeviceSynchronize());
    }
    epoch++;
    const double t0 = now_ms();
    if (!ag && (mode == MULTI_GEMM || mode == MULTI_UNFUSED))
        for (int d = 0; d < W; d++) {
            CHECK_CUDA(cudaSetDevice(d));
            CHECK_NOPAD(cuda_lt_matmul(rs[d].lt, dtype, rs[d].partial, rs[d].x, rs[d].w, NULL, NULL, p->T, p->K, p->N,
                                       CUBLASLT_EPILOGUE_DEFAULT, 0, 0, rs[d].stream));
        }
    if (mode == MULTI_COMM || mode == MULTI_UNFUSED) {
        CHECK_NCCL(nccl.group_start());
        for (int d = 0; d < W; d++) {
            if (ag)
                CHECK_NCCL(nccl.all_gather((char *)rs[d].x + d * rows * p->K * 2, rs[d].x, rows * p->K, nt,
                                           rs[d].nccl_comm, rs[d].stream));
            else
                CHECK_NCCL(nccl.reduce_scatter(rs[d].partial, rs[d].y_ref, rows * p->N, nt, ncclSum, rs[d].nccl_comm,
                                               rs[d].stream));
        }
        CHECK_NCCL(nccl.group_end());
    }
    if (ag && (mode == MULTI_GEMM || mode == MULTI_UNFUSED))
        for (int d = 0; d < W; d++) {
            CHECK_CUDA(cudaSetDevice(d));
            CHECK_NOPAD(cuda_lt_matmul(rs[d].lt, dtype, rs[d].y_ref, rs[d].x, rs[d].w, NULL, NULL, p->T, p->K, p->N,
                                       CUBLASLT_EPILOGUE_DEFAULT, 0, 0, rs[d].stream));
        }
    if (mode == MULTI_FUSED)
        for (int d = 0; d < W; d++) {
            CHECK_CUDA(cudaSetDevice(d));
            if (ag) {
                CHECK_NOPAD(cuda_flux_ag_push(dtype, &rs[d].peers, p->rows, p->K, epoch, rs[d].comm));
                CHECK_NOPAD(cuda_flux_ag_gemm(dtype, rs[d].y, rs[d].w, &rs[d].peers, p->rows, p->K, p->N, epoch,
                                              CUDA_FLUX_CONFIG_AUTO, rs[d].stream));
            } else {
                CHECK_NOPAD(cuda_flux_gemm_rs(dtype, rs[d].y, rs[d].x, rs[d].w, &rs[d].peers, p->rows, p->K, p->N,
                                              epoch, CUDA_FLUX_CONFIG_AUTO, rs[d].stream));
            }
        }
    for (int d = 0; d < W; d++) {
        CHECK_CUDA(cudaSetDevice(d));
        CHECK_CUDA(cudaDeviceSynchronize());
    }
    const double ms = now_ms() - t0;
    if (mode == MULTI_FUSED)
        for (int d = 0; d < W; d++) {
            CHECK_CUDA(cudaSetDevice(d));
            CHECK_NOPAD(cuda_flux_check(&rs[d].peers, rs[d].stream));
        }
    return ms;
}

static double multi_median(rank_state *rs, int W, const point *p, multi_mode mode) {
    double ms[MAX_REPS];
    for (int i = 0; i < WARMUP; i++) multi_once(rs, W, p, mode);
    for (int i = 0; i < reps; i++) ms[i] = multi_once(rs, W, p, mode);
    for (int i = 1; i < reps; i++) /* insertion sort: a few dozen values */
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
            const double t = ms[j];
            ms[j] = ms[j - 1], ms[j - 1] = t;
        }
    return ms[reps / 2];
}

/* Rank 0's fused output against the unfused one: max row relative error. */
static double multi_check(rank_state *rs, const point *p) {
    const size_t rows = p->op->all_gather ? (size_t)p->T : (size_t)p->rows[0], n = rows * p->N;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_NOPAD(rs[0].be->download_f32(rs[0].be, a, rs[0].y, n));
    CHECK_NOPAD(rs[0].be->download_f32(rs[0].be, b, rs[0].y_ref, n));
    double worst = 0;
    for (size_t r = 0; r < rows; r++) {
        double e2 = 0, r2 = 0;
        for (size_t c = 0; c < (size_t)p->N; c++) {
            const double dv = (double)a[r * p->N + c] - b[r * p->N + c];
            e2 += dv * dv, r2 += (double)b[r * p->N + c] * b[r * p->N + c];
        }
        const double e = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
        if (!(e <= worst)) worst = e; /* NaN wins */
    }
    free(a), free(b);
    return worst;
}

static int run_devices(int W, const int32_t *tokens, int n_tokens, const int *use_model, FILE *json, const char *gpu,
                       int driver, int runtime) {
    int n_dev = 0;
    CHECK_CUDA(cudaGetDeviceCount(&n_dev));
    if (W < 2 || W > CUDA_FLUX_MAX_WORLD || W > n_dev) {
        fprintf(stderr, "flux_bench: --devices %d: this host has %d GPUs (2..%d)\n", W, n_dev, CUDA_FLUX_MAX_WORLD);
        return 2;
    }
    nccl_open();
    int nccl_version = 0;
    CHECK_NCCL(nccl.get_version(&nccl_version));
    printf("flux_bench: %d GPUs in one process, NCCL %d, peer access between all\n", W, nccl_version);
    rank_state rs[CUDA_FLUX_MAX_WORLD];
    memset(rs, 0, sizeof rs);
    int devs[CUDA_FLUX_MAX_WORLD];
    ncclComm_t comms[CUDA_FLUX_MAX_WORLD];
    for (int d = 0; d < W; d++) {
        devs[d] = d;
        CHECK_CUDA(cudaSetDevice(d));
        for (int e = 0; e < W; e++) {
            int can = 0;
            CHECK_CUDA(cudaDeviceCanAccessPeer(&can, d, e));
            if (e != d && !can) {
                fprintf(stderr, "flux_bench: GPU %d cannot reach GPU %d's memory\n", d, e);
                return 1;
            }
            if (e != d) CHECK_CUDA(cudaDeviceEnablePeerAccess(e, 0));
        }
        CHECK_CUDA(cudaStreamCreateWithFlags(&rs[d].stream, cudaStreamNonBlocking));
        CHECK_CUDA(cudaStreamCreateWithFlags(&rs[d].comm, cudaStreamNonBlocking));
        rs[d].lt = calloc(1, sizeof *rs[d].lt);
        CHECK_NOPAD(cuda_lt_init(rs[d].lt));
        CHECK_NOPAD(nopad_backend_cuda_create(dtype, d, rs[d].stream, &rs[d].be));
    }
    CHECK_NCCL(nccl.comm_init_all(comms, W, devs));
    for (int d = 0; d < W; d++) rs[d].nccl_comm = comms[d];
    if (json)
        fprintf(json, "{\"gpu\": \"%s\", \"devices\": %d, \"driver\": %d, \"runtime\": %d, \"nccl\": %d, \"dtype\": \"%s\", "
                      "\"build\": \"%s\", \"reps\": %d, \"statistic\": \"median of host wall-clock ms, launch to all GPUs done\", "
                      "\"rows\": [\n",
                gpu, W, driver, runtime, nccl_version, dtype == NOPAD_DTYPE_BF16 ? "bf16" : "f16", nopad_build_id(), reps);
    printf("%-4s %-8s %6s %3s %6s %6s  %9s %9s %9s %9s %9s %7s %9s\n", "model", "gemm", "T", "tp", "K", "N", "gemm ms",
           "comm ms", "unfus ms", "fused ms", "fus/gemm", "hidden", "check");
    int first = 1;
    for (int mi = 0; mi < 2; mi++)
        for (int oi = 0; oi < 4; oi++)
            for (int ki = 0; ki < n_tokens; ki++) {
                if (!use_model[mi]) continue;
                point p = {.m = &MODELS[mi], .op = &OPS[oi], .T = tokens[ki], .tp = W};
                shape_of(p.m, p.op, W, &p.K, &p.N);
                if (p.T % W) continue;
                for (int d = 0; d < W; d++) p.rows[d] = p.T / W;
                const int ag = p.op->all_gather;
                const size_t rows = (size_t)p.rows[0], T = (size_t)p.T;
                for (int d = 0; d < W; d++) {
                    CHECK_CUDA(cudaSetDevice(d));
                    rank_state *r = &rs[d];
                    CHECK_CUDA(cudaMalloc(&r->x, T * p.K * 2));
                    CHECK_CUDA(cudaMalloc(&r->w, (size_t)p.N * p.K * 2));
                    CHECK_CUDA(cudaMalloc(&r->y, (ag ? T : rows) * p.N * 2));
                    CHECK_CUDA(cudaMalloc(&r->y_ref, (ag ? T : rows) * p.N * 2));
                    CHECK_CUDA(cudaMalloc(&r->partial, ag ? 16 : T * p.N * 2));
                    CHECK_CUDA(cudaMalloc(&r->inbox, ag ? 16 : cuda_flux_rs_inbox_bytes(dtype, p.rows[d], p.N, W)));
                    const size_t words = ag ? (size_t)W : cuda_flux_rs_signal_words(p.rows[d], p.N, W);
                    CHECK_CUDA(cudaMalloc((void **)&r->signals, words * 4));
                    CHECK_CUDA(cudaMalloc((void **)&r->error, 4));
                    CHECK_CUDA(cudaMemset(r->signals, 0, words * 4));
                    CHECK_CUDA(cudaMemset(r->error, 0, 4));
                    fill_random(r->be, r->x, T * p.K);
                    fill_random(r->be, r->w, (size_t)p.N * p.K);
                }
                for (int d = 0; d < W; d++) {
                    rs[d].peers = (cuda_flux_peers){.world = W, .rank = d, .error = rs[d].error,
                                                    .timeout_ns = CUDA_FLUX_DEFAULT_TIMEOUT_NS,
                                                    .max_ctas = max_ctas};
                    for (int e = 0; e < W; e++) {
                        rs[d].peers.buffers[e] = ag ? rs[e].x : rs[e].inbox;
                        rs[d].peers.signals[e] = rs[e].signals;
                    }
                }
                const double gemm = multi_median(rs, W, &p, MULTI_GEMM);
                const double comm = multi_median(rs, W, &p, MULTI_COMM);
                const double unfused = multi_median(rs, W, &p, MULTI_UNFUSED);
                const double fused = multi_median(rs, W, &p, MULTI_FUSED);
                const double check = multi_check(rs, &p);
                const double hidden = (unfused - fused) / comm;
                printf("%-4s %-8s %6d %3d %6d %6d  %9.4f %9.4f %9.4f %9.4f %9.3f %6.1f%% %9.2e\n", p.m->name, p.op->name,
                       p.T, W, p.K, p.N, gemm, comm, unfused, fused, fused / gemm, 100 * hidden, check);
                fflush(stdout);
                if (json) {
                    fprintf(json, "%s  {\"model\": \"%s\", \"gemm\": \"%s\", \"tokens\": %d, \"tp\": %d, \"K\": %d, "
                                  "\"N\": %d, \"gemm_ms\": %.5f, \"comm_ms\": %.5f, \"unfused_ms\": %.5f, \"fused_ms\": "
                                  "%.5f, \"hidden\": %.4f, \"check_row_rel_err\": %.3g}",
                            first ? "" : ",\n", p.m->name, p.op->name, p.T, W, p.K, p.N, gemm, comm, unfused, fused,
                            hidden, check);
                    fflush(json);
                }
                first = 0;
                for (int d = 0; d < W; d++) {
                    CHECK_CUDA(cudaSetDevice(d));
                    rank_state *r = &rs[d];
                    cudaFree(r->x), cudaFree(r->w), cudaFree(r->y), cudaFree(r->y_ref), cudaFree(r->partial);
                    cudaFree(r->inbox), cudaFree(r->signals), cudaFree(r->error);
                }
            }
    if (json) fprintf(json, "\n]}\n");
    for (int d = 0; d < W; d++) {
        CHECK_CUDA(cudaSetDevice(d));
        nccl.comm_destroy(rs[d].nccl_comm);
        cuda_lt_destroy(rs[d].lt);
        free(rs[d].lt);
        rs[d].be->destroy(rs[d].be);
    }
    return 0;
}

static void usage(FILE *to) {
    fprintf(to,
            "usage: flux_bench [--json FILE] [--dtype f16|bf16] [--reps N] [--tokens 1024,4096,16384] [--tp 2,4,8]\n"
            "                  [--models 8b,70b] [--rate-gbs 400] [--configs 0,1,...] [--pick C] [--max-ctas N]\n"
            "                  [--delayed-ctas N] [--devices N]\n"
            "Flux's fused kernels on one GPU with emulated peers (or --devices N GPUs of this host): the plain\n"
            "cuBLASLt GEMM, each tile configuration with every chunk present, and the fastest (or --pick C) with\n"
            "the other ranks' chunks arriving as over a --rate-gbs GB/s link; the share of the collective hidden.\n"
            "  --configs a,b      time only these tile configurations (0..%d)\n"
            "  --pick C           the delayed runs take configuration C, not the fastest\n"
            "  --max-ctas N       the persistent configurations on at most N CTAs in the runs with every chunk\n"
            "                     present and with --devices (default 0: one CTA a SM, the full grid)\n"
            "  --delayed-ctas N   the same for the delayed runs only (default: SMs - 1; 0: the full grid). The\n"
            "                     emulated peers' arrivals CTA must be resident while the persistent grid runs;\n"
            "                     with a CTA on every SM it waits for one to free up, and every emulated signal\n"
            "                     comes late. Real peers need no such CTA: the other runs keep the full grid.\n"
            "Times: the median of --reps (default 20) CUDA-event times after 5 warm-up runs.\n",
            CUDA_FLUX_N_CONFIGS - 1);
}

int main(int argc, char **argv) {
    const char *json_path = NULL;
    int32_t tokens[MAX_LIST] = {1024, 4096, 16384}, tps[MAX_LIST] = {2, 4, 8};
    int n_tokens = 3, n_tps = 3, use_model[2] = {1, 1}, devices = 0, n_configs = CUDA_FLUX_N_CONFIGS, forced_pick = -1;
    int32_t configs[MAX_LIST] = {0};
    for (int c = 0; c < CUDA_FLUX_N_CONFIGS && c < MAX_LIST; c++) configs[c] = c;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            i++;
            dtype = !strcmp(argv[i], "bf16") ? NOPAD_DTYPE_BF16 : NOPAD_DTYPE_F16;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) parse_list(argv[++i], tokens, &n_tokens);
        else if (!strcmp(argv[i], "--tp") && i + 1 < argc) parse_list(argv[++i], tps, &n_tps);
        else if (!strcmp(argv[i], "--models") && i + 1 < argc) {
            const char *s = argv[++i];
            use_model[0] = strstr(s, "8b") != NULL;
            use_model[1] = strstr(s, "70b") ? 1 : 0;
        } else if (!strcmp(argv[i], "--rate-gbs") && i + 1 < argc) rate_gbs = atof(argv[++i]);
        else if (!strcmp(argv[i], "--devices") && i + 1 < argc) devices = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--configs") && i + 1 < argc) parse_list(argv[++i], configs, &n_configs);
        else if (!strcmp(argv[i], "--pick") && i + 1 < argc) forced_pick = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max-ctas") && i + 1 < argc) max_ctas = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--delayed-ctas") && i + 1 < argc) {
            delayed_ctas = atoi(argv[++i]);
            if (delayed_ctas < 0) {
                fprintf(stderr, "flux_bench: --delayed-ctas %d: 0 (the full grid) or more\n", delayed_ctas);
                return 2;
            }
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "flux_bench: unknown or incomplete option %s\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    int bad_config = forced_pick >= CUDA_FLUX_N_CONFIGS;
    for (int c = 0; c < n_configs; c++) bad_config |= configs[c] < 0 || configs[c] >= CUDA_FLUX_N_CONFIGS;
    if (reps < 1 || reps > MAX_REPS || rate_gbs <= 0 || bad_config || max_ctas < 0) {
        fprintf(stderr, "flux_bench: --reps 1..%d, --rate-gbs > 0, configurations 0..%d, --max-ctas >= 0\n", MAX_REPS,
                CUDA_FLUX_N_CONFIGS - 1);
        return 2;
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    const size_t lt_version = cublasLtGetVersion();
    char date[32];
    const time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    const char *dname = dtype == NOPAD_DTYPE_BF16 ? "bf16" : "f16";
    /* the delayed runs leave the emulated arrivals' CTA an SM (usage()) */
    if (delayed_ctas < 0) delayed_ctas = prop.multiProcessorCount > 1 ? prop.multiProcessorCount - 1 : 0;
    printf("flux_bench: %s, %d SMs, driver %d, runtime %d, cuBLASLt %zu, build %s, %s, %s; median of %d runs after "
           "%d warm-up; link %.0f GB/s; this process is rank 0; persistent grids at most %d CTAs with every chunk "
           "present, %d in the delayed runs (0: one a SM)\n",
           prop.name, prop.multiProcessorCount, driver, runtime, lt_version, nopad_build_id(), date, dname, reps,
           WARMUP, rate_gbs, max_ctas, delayed_ctas);

    if (devices) {
        FILE *json = json_path ? fopen(json_path, "w") : NULL;
        const int rc = run_devices(devices, tokens, n_tokens, use_model, json, prop.name, driver, runtime);
        if (json) fclose(json);
        return rc;
    }
    int lowest, highest;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
    CHECK_CUDA(cudaStreamCreateWithPriority(&peer_stream, cudaStreamNonBlocking, highest));
    CHECK_CUDA(cudaEventCreate(&ev_start));
    CHECK_CUDA(cudaEventCreate(&ev_stop));
    CHECK_CUDA(cudaEventCreateWithFlags(&ev_peer, cudaEventDisableTiming));
    nopad_backend *be = NULL;
    CHECK_NOPAD(nopad_backend_cuda_create(dtype, 0, stream, &be));
    CHECK_NOPAD(cuda_lt_init(&lt));

    /* pool sizes: the largest operand of any point asked for */
    size_t max_x = 0, max_w = 0, max_y = 0, max_out = 0, max_words = 0;
    for (int mi = 0; mi < 2; mi++)
        for (int oi = 0; oi < 4; oi++)
            for (int ti = 0; ti < n_tps; ti++)
                for (int ki = 0; ki < n_tokens; ki++) {
                    if (!use_model[mi]) continue;
                    int32_t K, N;
                    shape_of(&MODELS[mi], &OPS[oi], tps[ti], &K, &N);
                    const size_t T = (size_t)tokens[ki];
                    if (T * K > max_x) max_x = T * K;
                    if ((size_t)N * K > max_w) max_w = (size_t)N * K;
                    if (T * N > max_y) max_y = T * N;
                    if (!OPS[oi].all_gather && T * N > max_out) max_out = T * N;
                    const size_t words = cuda_flux_rs_signal_words((int32_t)(T / tps[ti]), N, tps[ti]);
                    if (words > max_words) max_words = words;
                }
    if (max_words < CUDA_FLUX_MAX_WORLD) max_words = CUDA_FLUX_MAX_WORLD;
    CHECK_CUDA(cudaMalloc(&pool_x, max_x * 2));
    CHECK_CUDA(cudaMalloc(&pool_w, max_w * 2));
    CHECK_CUDA(cudaMalloc(&pool_y, max_y * 2));
    CHECK_CUDA(cudaMalloc(&pool_inbox, (max_out ? max_out : 1) * 2));
    CHECK_CUDA(cudaMalloc(&pool_sink, (max_out ? max_out : 1) * 2));
    CHECK_CUDA(cudaMalloc((void **)&sig_own, max_words * 4));
    CHECK_CUDA(cudaMalloc((void **)&sig_sink, max_words * 4));
    CHECK_CUDA(cudaMalloc((void **)&error_word, 4));
    CHECK_CUDA(cudaMalloc((void **)&dev_items, CUDA_FLUX_MAX_WORLD * sizeof(cuda_flux_arrival)));
    CHECK_CUDA(cudaMemset(error_word, 0, 4));
    fill_random(be, pool_x, max_x);
    fill_random(be, pool_w, max_w);
    fill_random(be, pool_inbox, max_out ? max_out : 1);
    CHECK_CUDA(cudaDeviceSynchronize());
    const double ref_tflops = reference_tflops(be);
    printf("cuBLASLt 8192^3 %s GEMM: %.0f TFLOP/s\n", dname, ref_tflops);

    FILE *json = json_path ? fopen(json_path, "w") : NULL;
    if (json_path && !json) {
        fprintf(stderr, "flux_bench: cannot write %s\n", json_path);
        return 1;
    }
    if (json)
        fprintf(json, "{\"gpu\": \"%s\", \"sms\": %d, \"driver\": %d, \"runtime\": %d, \"cublaslt\": %zu, "
                      "\"build\": \"%s\", \"date\": \"%s\", \"dtype\": \"%s\", \"reps\": %d, \"warmup\": %d, "
                      "\"rate_gbs\": %.1f, \"rank\": 0, \"statistic\": \"median of CUDA-event times of single launches\", "
                      "\"ref_gemm_8192_tflops\": %.1f, \"max_ctas\": %d, \"delayed_ctas\": %d, \"configs\": [",
                prop.name, prop.multiProcessorCount, driver, runtime, lt_version, nopad_build_id(), date, dname, reps,
                WARMUP, rate_gbs, ref_tflops, max_ctas, delayed_ctas);
    for (int c = 0; c < CUDA_FLUX_N_CONFIGS; c++) {
        printf("config %d: %s\n", c, cuda_flux_config_name(c));
        if (json) fprintf(json, "%s\"%s\"", c ? ", " : "", cuda_flux_config_name(c));
    }
    if (json) fprintf(json, "], \"rows\": [\n");
    printf("%-4s %-8s %6s %3s %6s %6s  %8s", "model", "gemm", "T", "tp", "K", "N", "plain ms");
    for (int c = 0; c < CUDA_FLUX_N_CONFIGS; c++) printf("  cfg%d ms", c);
    printf(" %4s %4s %8s %8s  %8s %9s %7s\n", "pick", "best", "pick/pl", "best/pl", "comm ms", "delay ms", "hidden");
    int first = 1;
    for (int mi = 0; mi < 2; mi++)
        for (int oi = 0; oi < 4; oi++)
            for (int ti = 0; ti < n_tps; ti++)
                for (int ki = 0; ki < n_tokens; ki++) {
                    if (!use_model[mi]) continue;
                    point p = {.m = &MODELS[mi], .op = &OPS[oi], .T = tokens[ki], .tp = tps[ti]};
                    shape_of(p.m, p.op, p.tp, &p.K, &p.N);
                    if (p.T % p.tp) continue;
                    for (int d = 0; d < p.tp; d++) p.rows[d] = p.T / p.tp;
                    const int ag = p.op->all_gather;
                    p.peers = (cuda_flux_peers){.world = p.tp, .rank = 0, .error = error_word,
                                                .timeout_ns = CUDA_FLUX_DEFAULT_TIMEOUT_NS, .max_ctas = max_ctas};
                    for (int d = 0; d < p.tp; d++) {
                        /* AllGather: one gathered buffer (only rank 0's is read); ReduceScatter: rank 0's
                         * inbox, the others' all in one sink */
                        p.peers.buffers[d] = ag ? pool_x : d == 0 ? pool_inbox : pool_sink;
                        p.peers.signals[d] = d == 0 ? sig_own : sig_sink;
                    }
                    const int pick = forced_pick >= 0 ? forced_pick : cuda_flux_pick(p.rows, p.tp, p.K, p.N);
                    /* every chunk present: the own signals hold the epoch */
                    const size_t own_words = ag ? (size_t)p.tp : cuda_flux_rs_signal_words(p.rows[0], p.N, p.tp);
                    CHECK_NOPAD(cuda_flux_signal(sig_own, (int64_t)own_words, epoch, stream));
                    CHECK_CUDA(cudaStreamSynchronize(stream));
                    const float plain = median_ms(&p, RUN_PLAIN, 0);
                    float fused[CUDA_FLUX_N_CONFIGS];
                    for (int c = 0; c < CUDA_FLUX_N_CONFIGS; c++) fused[c] = NAN; /* not timed: --configs */
                    for (int c = 0; c < n_configs; c++) fused[configs[c]] = median_ms(&p, RUN_FUSED, configs[c]);
                    if (isnan(fused[pick])) fused[pick] = median_ms(&p, RUN_FUSED, pick);
                    int best = pick;
                    for (int c = 0; c < CUDA_FLUX_N_CONFIGS; c++)
                        if (fused[c] < fused[best]) best = c;
                    /* the delayed runs take the fastest configuration (or --pick's) */
                    const int timed = forced_pick >= 0 ? pick : best;

                    /* the arrivals: position q's chunk (AllGather: rank -q; ReduceScatter: the sources
                     * in the order their partials of chunk 0 come) after q chunk transfers */
                    p.chunk_bytes = (uint64_t)p.rows[0] * (ag ? p.K : p.N) * 2;
                    const double chunk_ns = (double)p.chunk_bytes / (rate_gbs * 1e9) * 1e9;
                    cuda_flux_arrival items[CUDA_FLUX_MAX_WORLD];
                    int32_t tiles_m, tiles_n;
                    cuda_flux_rs_tiles(timed, p.rows[0], p.N, &tiles_m, &tiles_n);
                    p.n_items = p.tp - 1;
                    for (int q = 1; q < p.tp; q++) {
                        const int from = ag ? p.tp - q : q;
                        items[q - 1] = (cuda_flux_arrival){
                            .at_ns = (uint64_t)(q * chunk_ns), .value = epoch,
                            .signals = ag ? sig_own + from
                                          : sig_own + cuda_flux_rs_signal_index(timed, p.rows[0], p.N, p.tp, from, 0, 0),
                            .n_signals = ag ? 1u : (uint32_t)(tiles_m * tiles_n)};
                    }
                    CHECK_CUDA(cudaMemcpy(dev_items, items, (size_t)p.n_items * sizeof items[0],
                                          cudaMemcpyHostToDevice));
                    const float delayed = median_ms(&p, RUN_DELAYED, timed);
                    const double comm = (p.tp - 1) * chunk_ns / 1e6;
                    const double hidden = (plain + comm - delayed) / comm;
                    printf("%-4s %-8s %6d %3d %6d %6d  %8.4f", p.m->name, p.op->name, p.T, p.tp, p.K, p.N, plain);
                    for (int c = 0; c < CUDA_FLUX_N_CONFIGS; c++) printf(" %8.4f", fused[c]);
                    printf(" %4d %4d %8.3f %8.3f  %8.4f %9.4f %6.1f%%\n", pick, best, fused[pick] / plain,
                           fused[best] / plain, comm, delayed, 100.0 * hidden);
                    fflush(stdout);
                    if (json) {
                        fprintf(json, "%s  {\"model\": \"%s\", \"gemm\": \"%s\", \"kind\": \"%s\", \"tokens\": %d, "
                                      "\"tp\": %d, \"K\": %d, \"N\": %d, \"plain_ms\": %.5f, \"fused_ms\": [",
                                first ? "" : ",\n", p.m->name, p.op->name, ag ? "allgather_gemm" : "gemm_reducescatter",
                                p.T, p.tp, p.K, p.N, plain);
                        for (int c = 0; c < CUDA_FLUX_N_CONFIGS; c++) {
                            if (isnan(fused[c])) fprintf(json, "%snull", c ? ", " : "");
                            else fprintf(json, "%s%.5f", c ? ", " : "", fused[c]);
                        }
                        fprintf(json, "], \"pick\": %d, \"best\": %d, \"pick_over_plain\": %.4f, \"best_over_plain\": "
                                      "%.4f, \"comm_ms\": %.5f, \"delayed_config\": %d, \"delayed_ms\": %.5f, \"hidden\": %.4f}",
                                pick, best, fused[pick] / plain, fused[best] / plain, comm, timed, delayed, hidden);
                        fflush(json);
                    }
                    first = 0;
                }
    if (json) {
        fprintf(json, "\n]}\n");
        fclose(json);
    }
    cudaFree(pool_x), cudaFree(pool_w), cudaFree(pool_y), cudaFree(pool_inbox), cudaFree(pool_sink);
    cudaFree(sig_own), cudaFree(sig_sink), cudaFree(error_word), cudaFree(dev_items);
    cuda_lt_destroy(&lt);
    be->destroy(be);
    return 0;
}

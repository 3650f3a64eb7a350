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
 *   delayed  the picked configuration with the other ranks' chunks arriving as over a link of
 *            --rate-gbs GB/s (default 400, NVLink 4 one direction on an H100 SXM): chunk p (p = 1
 *            .. tp-1, in the kernel's order) signalled p·bytes/rate after the kernel starts, by
 *            one CTA on a second stream (cuda_flux_emulate_arrivals; the data itself is already
 *            there, so the link's traffic costs this GPU's memory nothing); bytes = a rank's chunk
 *            of x (AllGather) or its partial of the local chunk of y (ReduceScatter);
 *   comm     (tp-1)·bytes/rate, the collective alone at that rate;
 *   hidden   the share of comm the fused kernel hides: (plain + comm - delayed) / comm, against
 *            running the collective, then the GEMM.
 * The other ranks' inboxes (GEMM+ReduceScatter) share one buffer: the kernel's stores go there
 * as they would over the link, and land on top of each other.
 * Timing: CUDA events around each launch (both streams joined for delayed), 5 warm-up runs, the
 * median of --reps (default 20) timed runs per variant. Random data (fixed seed, never zeros).
 *
 * Usage: flux_bench [--json FILE] [--dtype f16|bf16] [--reps N] [--tokens 1024,4096,16384]
 *                   [--tp 2,4,8] [--models 8b,70b] [--rate-gbs 400] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

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

/* Fills n elements with copies of a random pattern (the pattern uploaded once, by the backend). */
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
        CHECK_CUDA(cudaMemcpy((char *)dst + at * 2, pattern, k * 2, cudaMemcpyDeviceToDevice));
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
        CHECK_NOPAD(cuda_flux_ag_gemm(dtype, pool_y, pool_w, &p->peers, p->rows, p->K, p->N, epoch, config, stream));
    } else {
        CHECK_NOPAD(cuda_flux_gemm_rs(dtype, pool_y, pool_x, pool_w, &p->peers, p->rows, p->K, p->N, epoch, config,
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
    if (kind != RUN_PLAIN) CHECK_NOPAD(cuda_flux_check(&p->peers, stream));
    return ms;
}

static float median_ms(point *p, run_kind kind, int config) {
    float ms[MAX_REPS];
    for (int i = 0; i < WARMUP; i++) run_once(p, kind, config);
    for (int i = 0; i < reps; i++) ms[i] = run_once(p, kind, config);
    qsort(ms, (size_t)reps, sizeof ms[0], bench_cmp_float);
    return ms[reps / 2];
}

int main(int argc, char **argv) {
    const char *json_path = NULL;
    int32_t tokens[MAX_LIST] = {1024, 4096, 16384}, tps[MAX_LIST] = {2, 4, 8};
    int n_tokens = 3, n_tps = 3, use_model[2] = {1, 1};
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
        else {
            fprintf(stderr, "usage: flux_bench [--json FILE] [--dtype f16|bf16] [--reps N] [--tokens a,b] [--tp a,b] "
                            "[--models 8b,70b] [--rate-gbs R]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS || rate_gbs <= 0) {
        fprintf(stderr, "flux_bench: --reps 1..%d, --rate-gbs > 0\n", MAX_REPS);
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
    printf("flux_bench: %s, %d SMs, driver %d, runtime %d, cuBLASLt %zu, build %s, %s, %s; median of %d runs after "
           "%d warm-up; link %.0f GB/s; this process is rank 0\n",
           prop.name, prop.multiProcessorCount, driver, runtime, lt_version, nopad_build_id(), date, dname, reps,
           WARMUP, rate_gbs);

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

    FILE *json = json_path ? fopen(json_path, "w") : NULL;
    if (json_path && !json) {
        fprintf(stderr, "flux_bench: cannot write %s\n", json_path);
        return 1;
    }
    if (json)
        fprintf(json, "{\"gpu\": \"%s\", \"sms\": %d, \"driver\": %d, \"runtime\": %d, \"cublaslt\": %zu, "
                      "\"build\": \"%s\", \"date\": \"%s\", \"dtype\": \"%s\", \"reps\": %d, \"warmup\": %d, "
                      "\"rate_gbs\": %.1f, \"rank\": 0, \"statistic\": \"median of CUDA-event times of single launches\", "
                      "\"configs\": [\"%s\", \"%s\"], \"rows\": [\n",
                prop.name, prop.multiProcessorCount, driver, runtime, lt_version, nopad_build_id(), date, dname, reps,
                WARMUP, rate_gbs, cuda_flux_config_name(0), cuda_flux_config_name(1));
    printf("%-4s %-8s %6s %3s %6s %6s  %9s %9s %9s %6s %8s  %8s %9s %7s\n", "model", "gemm", "T", "tp", "K", "N",
           "plain ms", "cfg0 ms", "cfg1 ms", "pick", "fused/pl", "comm ms", "delay ms", "hidden");
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
                                                .timeout_ns = CUDA_FLUX_DEFAULT_TIMEOUT_NS};
                    for (int d = 0; d < p.tp; d++) {
                        /* AllGather: one gathered buffer (only rank 0's is read); ReduceScatter: rank 0's
                         * inbox, the others' all in one sink */
                        p.peers.buffers[d] = ag ? pool_x : d == 0 ? pool_inbox : pool_sink;
                        p.peers.signals[d] = d == 0 ? sig_own : sig_sink;
                    }
                    const int pick = cuda_flux_pick(p.rows, p.tp, p.N);
                    /* every chunk present: the own signals hold the epoch */
                    const size_t own_words = ag ? (size_t)p.tp : cuda_flux_rs_signal_words(p.rows[0], p.N, p.tp);
                    CHECK_NOPAD(cuda_flux_signal(sig_own, (int64_t)own_words, epoch, stream));
                    CHECK_CUDA(cudaStreamSynchronize(stream));
                    const float plain = median_ms(&p, RUN_PLAIN, 0);
                    float fused[CUDA_FLUX_N_CONFIGS];
                    for (int c = 0; c < CUDA_FLUX_N_CONFIGS; c++) fused[c] = median_ms(&p, RUN_FUSED, c);

                    /* the arrivals: position q's chunk (AllGather: rank -q; ReduceScatter: the sources
                     * in the order their partials of chunk 0 come) after q chunk transfers */
                    p.chunk_bytes = (uint64_t)p.rows[0] * (ag ? p.K : p.N) * 2;
                    const double chunk_ns = (double)p.chunk_bytes / (rate_gbs * 1e9) * 1e9;
                    cuda_flux_arrival items[CUDA_FLUX_MAX_WORLD];
                    int32_t tiles_m, tiles_n;
                    cuda_flux_rs_tiles(pick, p.rows[0], p.N, &tiles_m, &tiles_n);
                    p.n_items = p.tp - 1;
                    for (int q = 1; q < p.tp; q++) {
                        const int from = ag ? p.tp - q : q;
                        items[q - 1] = (cuda_flux_arrival){
                            .at_ns = (uint64_t)(q * chunk_ns), .value = epoch,
                            .signals = ag ? sig_own + from
                                          : sig_own + cuda_flux_rs_signal_index(pick, p.rows[0], p.N, p.tp, from, 0, 0),
                            .n_signals = ag ? 1u : (uint32_t)(tiles_m * tiles_n)};
                    }
                    CHECK_CUDA(cudaMemcpy(dev_items, items, (size_t)p.n_items * sizeof items[0],
                                          cudaMemcpyHostToDevice));
                    const float delayed = median_ms(&p, RUN_DELAYED, pick);
                    const double comm = (p.tp - 1) * chunk_ns / 1e6;
                    const double hidden = (plain + comm - delayed) / comm;
                    printf("%-4s %-8s %6d %3d %6d %6d  %9.4f %9.4f %9.4f %6d %8.3f  %8.4f %9.4f %6.1f%%\n", p.m->name,
                           p.op->name, p.T, p.tp, p.K, p.N, plain, fused[0], fused[1], pick, fused[pick] / plain, comm,
                           delayed, 100.0 * hidden);
                    fflush(stdout);
                    if (json) {
                        fprintf(json, "%s  {\"model\": \"%s\", \"gemm\": \"%s\", \"kind\": \"%s\", \"tokens\": %d, "
                                      "\"tp\": %d, \"K\": %d, \"N\": %d, \"plain_ms\": %.5f, \"fused_ms\": [%.5f, %.5f], "
                                      "\"pick\": %d, \"fused_over_plain\": %.4f, \"comm_ms\": %.5f, \"delayed_ms\": %.5f, "
                                      "\"hidden\": %.4f}",
                                first ? "" : ",\n", p.m->name, p.op->name, ag ? "allgather_gemm" : "gemm_reducescatter",
                                p.T, p.tp, p.K, p.N, plain, fused[0], fused[1], pick, fused[pick] / plain, comm, delayed,
                                hidden);
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

/* GEMM benchmark of the CUDA backend: for each BERT-base/large layer GEMM and token count, the
 * cuBLASLt path as cu_linear takes it without CUTLASS (for the exact GELU: cuBLASLt with a bias
 * epilogue, then the separate bias+GELU pass) against the CUTLASS kernel with the epilogue fused
 * (each tile configuration, and the one cuda_gemm_fused picks), cu_linear under
 * NOPAD_GEMM=auto, and for T <= 256 the skinny GEMM (gemm_skinny.h; "auto" takes it up to
 * NOPAD_SKINNY_MAX_TOKENS, the cuBLASLt variants never).
 *
 * Timing (time_variants): CUDA-graph replays of max(20, sets) back-to-back launches, the
 * variants taking turns; per launch, the median over R rounds (--reps, default 15). Random data
 * (uniform, never zeros); the operands (x, w, y, residual) rotate over up to 64 buffer sets, so
 * that one replay touches >= 256 MB, or >= 100 MB for the smallest problems: past the H200's
 * 60 MB L2, so small problems are not timed out of the cache. TFLOP/s = 2·T·K·N / time.
 *
 * Usage: gemm_bench [--json FILE] [--reps ROUNDS] [--dtype f16|bf16|both] [--quick] [--only TEXT]
 *                   [--tokens T1,T2,...] [--lt-ranks N] [--llama]
 * (--only "base ffn_in+gelu 39798": the GEMMs whose "model gemm T" contains TEXT; --tokens: these
 * token counts instead of the default list; --lt-ranks N: also cuBLASLt's heuristic answers 2..N+1,
 * each timed as the cuBLASLt path takes its first; a rank past its last answer repeats the last;
 * --llama: LLaMA-1B's decoder layers instead, qkv 2048 -> 2560, o 2048 -> 2048, gate|up 2048 ->
 * 11264, down 5632 -> 2048, no bias, as a decode step runs them when cuBLASLt takes them) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm/gemm.h"

#include "bench_check.h"

enum { POOL_ELEMS = 208 << 20, W_POOL_ELEMS = 64 << 20, MAX_SETS = 64, MAX_REPS = 400, MAX_VARIANTS = 16,
       MAX_EVENTS = MAX_REPS * MAX_VARIANTS + 1, MIN_LAUNCHES_PER_GRAPH = 20 };
static const size_t WORKING_SET_BYTES = (size_t)256 << 20;

typedef struct variant {
    const char *path; /* "cublaslt", "cutlass", "auto", "skinny"; for the GELU shape also
                         "cublaslt-gemm" and "cutlass-gemm": the GEMM with the bias epilogue only
                         (no GELU) */
    int config;       /* cutlass tile configuration, -1 = the picked one; for "cublaslt-rank", the
                         rank of cuBLASLt's heuristic answer (cuda_gemm_set_lt_rank) */
} variant;

typedef struct layer_gemm {
    const char *name;
    int K_is_I, N_is;     /* K = H or I; N = 3H, H or I; (--llama) H + 512 or 2I */
    nopad_epilogue op_ep; /* cu_linear's epilogue */
} layer_gemm;

static nopad_backend *be;
static cudaStream_t stream;
static void *pool_x, *pool_w, *pool_y, *pool_r, *bias;
static int reps = 15; /* rounds of graph replays */
static int32_t skinny_default; /* cu_linear's skinny limit before the benchmark overrides it */
static int lt_ranks; /* --lt-ranks: also time cuBLASLt's answers of rank 1..lt_ranks (its 2nd to (lt_ranks+1)-th) */

/* One launch of a variant on buffer set `set`. */
static void launch(const variant *v, nopad_dtype dtype, int set, int32_t T, int32_t K, int32_t N,
                   nopad_epilogue op_ep) {
    const size_t es = 2;
    char *x = (char *)pool_x + (size_t)set * T * K * es;
    char *w = (char *)pool_w + (size_t)set * N * K * es;
    char *y = (char *)pool_y + (size_t)set * T * N * es;
    char *r = (char *)pool_r + (size_t)set * T * N * es;
    if (strncmp(v->path, "cutlass", 7) == 0) {
        if (strcmp(v->path, "cutlass-gemm") == 0) op_ep = NOPAD_EPILOGUE_BIAS;
        const cuda_gemm_epilogue ep = op_ep == NOPAD_EPILOGUE_BIAS_ACT       ? CUDA_GEMM_BIAS_GELU_ERF
                                      : op_ep == NOPAD_EPILOGUE_BIAS_RESIDUAL ? CUDA_GEMM_BIAS_RESIDUAL
                                                                              : CUDA_GEMM_BIAS;
        CHECK_NOPAD(cuda_gemm_fused_config(dtype, y, x, w, op_ep == NOPAD_EPILOGUE_NONE ? NULL : bias, r, T, K,
                                           N, ep, v->config, stream));
    } else if (strcmp(v->path, "skinny") == 0) {
        CHECK_NOPAD(cuda_gemm_skinny(dtype, y, x, w, op_ep == NOPAD_EPILOGUE_NONE ? NULL : bias,
                                     op_ep == NOPAD_EPILOGUE_BIAS_RESIDUAL ? r : NULL, T, K, N,
                                     op_ep == NOPAD_EPILOGUE_BIAS_ACT ? (int)NOPAD_ACT_GELU : -1, stream));
    } else {
        const int is_auto = strcmp(v->path, "auto") == 0;
        cuda_gemm_set_mode(is_auto ? CUDA_GEMM_MODE_AUTO : CUDA_GEMM_MODE_CUBLASLT);
        cuda_gemm_skinny_set_max_tokens(is_auto ? skinny_default : 0);
        cuda_gemm_set_lt_rank(strcmp(v->path, "cublaslt-rank") == 0 ? v->config : 0);
        if (strcmp(v->path, "cublaslt-gemm") == 0) op_ep = NOPAD_EPILOGUE_BIAS;
        CHECK_NOPAD(be->gemm(be, y, x, w, bias, r, T, K, N, op_ep, NOPAD_ACT_GELU));
        cuda_gemm_set_lt_rank(0);
    }
}

/* Median milliseconds of one launch of each variant. Each variant's launches are captured in a
 * CUDA graph of max(20, sets) back-to-back launches (one per buffer set at least), as the
 * backend records a forward: the GPU time is measured, not the host's launch rate, which bounds
 * small problems otherwise. The variants' graphs take turns (v0, v1, ..., v0, v1, ...), with an
 * event between consecutive replays, so that clock and temperature drift reaches every variant
 * alike; per variant, the median over the rounds of (replay time / launches). */
static void time_variants(const variant *vs, int nv, nopad_dtype dtype, int32_t T, int32_t K,
                          int32_t N, nopad_epilogue op_ep, int sets, double *ms_out) {
    static cudaEvent_t ev[MAX_EVENTS];
    static int have_events;
    if (!have_events) {
        for (int i = 0; i < MAX_EVENTS; i++) CHECK_CUDA(cudaEventCreate(&ev[i]));
        have_events = 1;
    }
    const int launches = sets > MIN_LAUNCHES_PER_GRAPH ? sets : MIN_LAUNCHES_PER_GRAPH;
    cudaGraphExec_t exec[MAX_VARIANTS];
    for (int v = 0; v < nv; v++) {
        /* warm-up outside the graph: module load, cuBLASLt plans, clocks */
        for (int i = 0; i < 3 + sets; i++) launch(&vs[v], dtype, i % sets, T, K, N, op_ep);
        cudaGraph_t graph;
        CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < launches; i++) launch(&vs[v], dtype, i % sets, T, K, N, op_ep);
        CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
        CHECK_CUDA(cudaGraphInstantiate(&exec[v], graph, 0));
        CHECK_CUDA(cudaGraphDestroy(graph));
        CHECK_CUDA(cudaGraphLaunch(exec[v], stream));
    }
    CHECK_CUDA(cudaEventRecord(ev[0], stream));
    for (int r = 0; r < reps; r++)
        for (int v = 0; v < nv; v++) {
            CHECK_CUDA(cudaGraphLaunch(exec[v], stream));
            CHECK_CUDA(cudaEventRecord(ev[r * nv + v + 1], stream));
        }
    CHECK_CUDA(cudaEventSynchronize(ev[reps * nv]));
    CHECK_CUDA(cudaGetLastError());
    for (int v = 0; v < nv; v++) {
        float ms[MAX_REPS];
        for (int r = 0; r < reps; r++)
            CHECK_CUDA(cudaEventElapsedTime(&ms[r], ev[r * nv + v], ev[r * nv + v + 1]));
        qsort(ms, (size_t)reps, sizeof ms[0], bench_cmp_float);
        ms_out[v] = (reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2])) / launches;
        CHECK_CUDA(cudaGraphExecDestroy(exec[v]));
    }
}

static void fill_random(nopad_dtype dtype, void *dst, size_t n, float lo, float hi, uint64_t seed) {
    const size_t chunk = (size_t)16 << 20;
    float *h = malloc(chunk * sizeof(float));
    uint64_t s = seed;
    for (size_t i = 0; i < chunk; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        h[i] = lo + (hi - lo) * (float)((s >> 40) * (1.0 / 16777216.0));
    }
    /* 16M values, repeated at a shifting offset: values, not uniqueness, set a GEMM's speed */
    for (size_t off = 0; off < n; off += chunk) {
        const size_t m = n - off < chunk ? n - off : chunk;
        CHECK_NOPAD(be->upload_f32(be, (char *)dst + off * 2, h + (off / chunk * 7919) % (chunk - m + 1), m));
    }
    free(h);
}

int main(int argc, char **argv) {
    const char *json_path = NULL;
    int dtype_mask = 3, quick = 0, llama = 0;
    const char *only = NULL; /* run only the GEMMs whose "model gemm T" contains this */
    const char *tokens_arg = NULL; /* "16,32": token counts to run instead of the default list */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            dtype_mask = !strcmp(d, "f16") ? 1 : !strcmp(d, "bf16") ? 2 : 3;
        } else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens_arg = argv[++i];
        else if (!strcmp(argv[i], "--lt-ranks") && i + 1 < argc) lt_ranks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--llama")) llama = 1;
        else {
            fprintf(stderr, "usage: gemm_bench [--json FILE] [--reps ROUNDS] [--dtype f16|bf16|both] [--quick] [--only TEXT] "
                            "[--tokens T1,T2,...] [--lt-ranks N (1..%d)]\n", CUDA_GEMM_LT_MAX_RANK);
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS) reps = 15;
    if (lt_ranks < 0 || lt_ranks > CUDA_GEMM_LT_MAX_RANK) {
        fprintf(stderr, "gemm_bench: --lt-ranks: expected 0..%d, got %d\n", CUDA_GEMM_LT_MAX_RANK, lt_ranks);
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
    char date[32];
    const time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    printf("gemm_bench: %s, %d SMs, driver %d, runtime %d, %s; median of %d rounds of graphs of >= %d "
           "launches; CUTLASS %s\n",
           prop.name, prop.multiProcessorCount, driver, runtime, date, reps, MIN_LAUNCHES_PER_GRAPH,
           cuda_gemm_fused_available() ? "on" : "off (cuBLASLt only)");
    FILE *json = json_path ? fopen(json_path, "w") : NULL;
    if (json)
        fprintf(json, "{\"gpu\": \"%s\", \"sms\": %d, \"driver\": %d, \"runtime\": %d, \"date\": \"%s\", "
                      "\"rounds\": %d, \"min_launches_per_graph\": %d, \"statistic\": \"median over rounds of graph replay "
                      "ms / launches (max(20, sets)); variants interleaved\", \"rows\": [\n",
                prop.name, prop.multiProcessorCount, driver, runtime, date, reps, MIN_LAUNCHES_PER_GRAPH);
    int first_row = 1;

    int32_t Ts[16] = {16, 32, 128, 1024, 4352, 39798};
    int n_T = quick ? 4 : 6;
    if (tokens_arg) {
        n_T = 0;
        for (const char *c = tokens_arg; *c && n_T < 16;) {
            char *end;
            const long t = strtol(c, &end, 10);
            if (end == c || t < 1 || t > 65536) {
                fprintf(stderr, "gemm_bench: --tokens: expected a comma-separated list of counts in [1, 65536], got \"%s\"\n",
                        tokens_arg);
                return 2;
            }
            Ts[n_T++] = (int32_t)t;
            c = *end == ',' ? end + 1 : end;
        }
    }
    skinny_default = cuda_gemm_skinny_max_tokens();
    const struct { const char *name; int32_t H, I; } bert_models[2] = {{"base", 768, 3072}, {"large", 1024, 4096}},
                                                     llama_models[1] = {{"llama1b", 2048, 5632}};
    const layer_gemm bert_gemms[] = {
        {"qkv", 0, 3, NOPAD_EPILOGUE_BIAS},                /* [T,H]·[3H,H]ᵀ + b */
        {"attn_out", 0, 1, NOPAD_EPILOGUE_NONE},           /* as the encoder calls it today */
        {"attn_out+res", 0, 1, NOPAD_EPILOGUE_BIAS_RESIDUAL},
        {"ffn_in+gelu", 0, 4, NOPAD_EPILOGUE_BIAS_ACT},    /* [T,H]·[I,H]ᵀ + b, erf GELU */
        {"ffn_out", 1, 1, NOPAD_EPILOGUE_NONE},
        {"ffn_out+res", 1, 1, NOPAD_EPILOGUE_BIAS_RESIDUAL},
    };
    const layer_gemm llama_gemms[] = {
        {"qkv", 0, 5, NOPAD_EPILOGUE_NONE},     /* 32 query heads + 2 x 4 KV heads of 64 */
        {"o", 0, 1, NOPAD_EPILOGUE_NONE},
        {"gate_up", 0, 6, NOPAD_EPILOGUE_NONE}, /* the SwiGLU's two projections, one GEMM */
        {"down", 1, 1, NOPAD_EPILOGUE_NONE},
    };
    const int n_models = llama ? 1 : 2;
    const layer_gemm *gemms = llama ? llama_gemms : bert_gemms;
    const int n_gemms = llama ? 4 : (int)(sizeof bert_gemms / sizeof bert_gemms[0]);

    for (int d = 0; d < 2; d++) {
        if (!(dtype_mask & (1 << d))) continue;
        const nopad_dtype dtype = d == 0 ? NOPAD_DTYPE_F16 : NOPAD_DTYPE_BF16;
        const char *dname = d == 0 ? "f16" : "bf16";
        CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        CHECK_NOPAD(nopad_backend_cuda_create(dtype, 0, stream, &be));
        CHECK_NOPAD(be->alloc(be, (size_t)POOL_ELEMS * 2, &pool_x));
        CHECK_NOPAD(be->alloc(be, (size_t)W_POOL_ELEMS * 2, &pool_w));
        CHECK_NOPAD(be->alloc(be, (size_t)POOL_ELEMS * 2, &pool_y));
        CHECK_NOPAD(be->alloc(be, (size_t)POOL_ELEMS * 2, &pool_r));
        CHECK_NOPAD(be->alloc(be, 8192 * 2, &bias));
        fill_random(dtype, pool_x, POOL_ELEMS, -1.0f, 1.0f, 1);
        fill_random(dtype, pool_w, W_POOL_ELEMS, -0.05f, 0.05f, 2); /* ~ sqrt(3/K) at K = 1024 */
        fill_random(dtype, pool_y, POOL_ELEMS, -1.0f, 1.0f, 3);
        fill_random(dtype, pool_r, POOL_ELEMS, -1.0f, 1.0f, 4);
        fill_random(dtype, bias, 8192, -0.5f, 0.5f, 5);
        be->release_staging(be);

        printf("\n%-4s %-5s %-13s %6s %5s %5s | %-28s %8s %6s | %s\n", "dt", "model", "gemm", "T", "K", "N",
               "path (* = config auto picks)", "ms", "TFLOPs", "vs cublaslt path");
        for (int mi = 0; mi < n_models; mi++)
            for (int ti = 0; ti < n_T; ti++)
                for (int g = 0; g < n_gemms; g++) {
                    const int32_t H = llama ? llama_models[mi].H : bert_models[mi].H;
                    const int32_t I = llama ? llama_models[mi].I : bert_models[mi].I, T = Ts[ti];
                    const int32_t K = gemms[g].K_is_I ? I : H;
                    const int32_t N = gemms[g].N_is == 3   ? 3 * H
                                      : gemms[g].N_is == 4 ? I
                                      : gemms[g].N_is == 5 ? H + 512
                                      : gemms[g].N_is == 6 ? 2 * I
                                                           : H;
                    const size_t set_bytes = ((size_t)T * K + (size_t)N * K + 2 * (size_t)T * N) * 2;
                    int sets = (int)((WORKING_SET_BYTES + set_bytes - 1) / set_bytes);
                    if (sets > MAX_SETS) sets = MAX_SETS;
                    while (sets > 1 && (size_t)sets * T * (K > N ? K : N) > (size_t)POOL_ELEMS) sets--;
                    while (sets > 1 && (size_t)sets * N * K > (size_t)W_POOL_ELEMS) sets--;
                    char what[96];
                    const char *model_name = llama ? llama_models[mi].name : bert_models[mi].name;
                    snprintf(what, sizeof what, "%s %s %d", model_name, gemms[g].name, T);
                    if (only && !strstr(what, only)) continue;
                    const nopad_epilogue op_ep = gemms[g].op_ep;
                    const cuda_gemm_epilogue fep = op_ep == NOPAD_EPILOGUE_BIAS_ACT ? CUDA_GEMM_BIAS_GELU_ERF
                                                   : op_ep == NOPAD_EPILOGUE_BIAS_RESIDUAL ? CUDA_GEMM_BIAS_RESIDUAL
                                                                                          : CUDA_GEMM_BIAS;
                    variant vs[MAX_VARIANTS];
                    int nv = 0;
                    vs[nv++] = (variant){"cublaslt", -1};
                    if (op_ep == NOPAD_EPILOGUE_BIAS_ACT) {
                        vs[nv++] = (variant){"cublaslt-gemm", -1};
                        vs[nv++] = (variant){"cutlass-gemm", -1}; /* the picked tiles, bias only */
                    }
                    for (int c = 0; c < cuda_gemm_fused_n_configs() && nv < MAX_VARIANTS - 1; c++)
                        vs[nv++] = (variant){"cutlass", c};
                    vs[nv++] = (variant){"auto", -1};
                    if (cuda_gemm_skinny_supported(T, K, N)) vs[nv++] = (variant){"skinny", -1};
                    for (int rk = 1; rk <= lt_ranks && nv < MAX_VARIANTS; rk++) vs[nv++] = (variant){"cublaslt-rank", rk};
                    const int picked = cuda_gemm_fused_pick(T, K, N, fep);
                    cuda_gemm_set_mode(CUDA_GEMM_MODE_AUTO);
                    const int auto_fused = cuda_gemm_use_fused(T, K, N, fep);
                    cuda_gemm_skinny_set_max_tokens(skinny_default);
                    const int auto_skinny = cuda_gemm_skinny_wins(T, K, N);
                    const double flops = 2.0 * T * K * N;
                    double ms[MAX_VARIANTS];
                    time_variants(vs, nv, dtype, T, K, N, op_ep, sets, ms);
                    for (int vi = 0; vi < nv; vi++) {
                        char label[64];
                        const char *config = "";
                        if (!strcmp(vs[vi].path, "cutlass")) {
                            config = cuda_gemm_fused_config_name(vs[vi].config);
                            snprintf(label, sizeof label, "cutlass %s%s", config, vs[vi].config == picked ? "*" : "");
                        } else if (!strcmp(vs[vi].path, "auto")) {
                            config = auto_skinny ? "skinny" : auto_fused ? cuda_gemm_fused_config_name(picked) : "cublaslt";
                            snprintf(label, sizeof label, "auto -> %s",
                                     auto_skinny ? "skinny" : auto_fused ? "cutlass" : "cublaslt");
                        } else if (!strcmp(vs[vi].path, "skinny")) {
                            config = "skinny";
                            snprintf(label, sizeof label, "skinny (one kernel)");
                        } else if (!strcmp(vs[vi].path, "cublaslt-rank")) {
                            snprintf(label, sizeof label, "cublaslt heuristic #%d%s", vs[vi].config + 1,
                                     op_ep == NOPAD_EPILOGUE_BIAS_ACT ? " + gelu" : "");
                        } else if (!strcmp(vs[vi].path, "cublaslt-gemm"))
                            snprintf(label, sizeof label, "(cublaslt gemm+bias alone)");
                        else if (!strcmp(vs[vi].path, "cutlass-gemm"))
                            snprintf(label, sizeof label, "(cutlass gemm+bias alone)");
                        else
                            snprintf(label, sizeof label, "%s",
                                     op_ep == NOPAD_EPILOGUE_BIAS_ACT ? "cublaslt + gelu pass" : "cublaslt");
                        printf("%-4s %-5s %-13s %6d %5d %5d | %-28s %8.4f %6.1f | %5.2fx\n", dname,
                               model_name, gemms[g].name, T, K, N, label, ms[vi], flops / ms[vi] * 1e-9,
                               ms[0] / ms[vi]);
                        if (json) {
                            fprintf(json, "%s  {\"dtype\": \"%s\", \"model\": \"%s\", \"gemm\": \"%s\", \"T\": %d, "
                                          "\"K\": %d, \"N\": %d, \"path\": \"%s\", \"config\": \"%s\", "
                                          "\"picked\": %s, \"sets\": %d, \"ms\": %.5f, \"tflops\": %.2f}",
                                    first_row ? "" : ",\n", dname, model_name, gemms[g].name, T, K, N,
                                    vs[vi].path, config,
                                    !strcmp(vs[vi].path, "cutlass") && vs[vi].config == picked ? "true" : "false",
                                    sets, ms[vi], flops / ms[vi] * 1e-9);
                            first_row = 0;
                        }
                    }
                    fflush(stdout);
                }
        be->free(be, pool_x), be->free(be, pool_w), be->free(be, pool_y), be->free(be, pool_r);
        be->free(be, bias);
        be->destroy(be);
        CHECK_CUDA(cudaStreamDestroy(stream));
    }
    if (json) {
        fprintf(json, "\n]}\n");
        fclose(json);
    }
    return 0;
}

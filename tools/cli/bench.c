/* `nopad bench`: times the encoder forward on the ENC workload of docs/design.md — for each
 * batch × max point, sequence lengths uniform in [ceil(0.2·max), max] and random token ids — on
 * nopad alone. Each forward is one synchronous nopad_encode_packed call (ids in, CLS rows out, so
 * the transfers are a few KB); the median of --iters calls after --warmup is reported with
 * tokens/s, achieved TFLOP/s (useful FLOPs only: no credit for padding, there is none), the
 * fraction of a peak given with --peak-tflops, and the memory the model holds. Comparisons with
 * other engines live in bench/ (they need the same data in one process). */
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nopad.h"

static const char bench_help[] =
    "usage: nopad bench --model DIR [options]\n"
    "\n"
    "Times the encoder on random batches (lengths uniform in [0.2*max, max], random ids).\n"
    "\n"
    "options:\n"
    "  --model DIR          Hugging Face model folder (required)\n"
    "  --device cpu|cuda    default cpu\n"
    "  --dtype fp32|fp16|bf16  compute dtype (cpu: fp32; cuda: fp16 default, or bf16)\n"
    "  --threads N          CPU threads (default: all)\n"
    "  --batch B --max M    one point; default: the grid batch {1,16,64,128} x max {64..1024}\n"
    "                       (points beyond the model's maximum length are skipped; on the CPU,\n"
    "                       points over 8192 tokens unless --all)\n"
    "  --all                do not skip large points on the CPU\n"
    "  --iters N            timed forwards per point (default 20)\n"
    "  --warmup N           untimed forwards first (default 3)\n"
    "  --seed S             random seed (default 20261121)\n"
    "  --peak-tflops X      report the fraction of this rate (e.g. a measured matmul rate)\n"
    "  --cuda-graph-max-tokens N  cuda: replay recorded graphs up to N tokens (default 2048;\n"
    "                       -1: launch every kernel directly)\n"
    "  --json               one JSON object per point instead of a table\n";

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static double now_ms(void) { return now_seconds() * 1e3; }

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int usage_error(const char *msg, const char *arg) {
    fprintf(stderr, "nopad bench: %s%s%s\n%s", msg, arg ? " " : "", arg ? arg : "", bench_help);
    return 2;
}

static int int_in_range(const char *s, int lo, int hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

typedef struct point_result {
    int batch, max, tokens;
    double ms, tokens_per_s, tflops;
} point_result;

static int run_point(nopad_model *model, const nopad_model_info *info, int B, int M, int iters,
                     int warmup, uint64_t *rng, point_result *r) {
    int32_t *cu = malloc(sizeof(int32_t) * (B + 1));
    int64_t sum_sq = 0;
    cu[0] = 0;
    const int lo = (int)ceil(0.2 * M);
    for (int s = 0; s < B; s++) {
        int len = lo + (int)(rng_next(rng) % (uint64_t)(M - lo + 1));
        cu[s + 1] = cu[s] + len;
        sum_sq += (int64_t)len * len;
    }
    const int T = cu[B], H = info->hidden_size, I = info->intermediate_size;
    int32_t *ids = malloc(sizeof(int32_t) * T);
    for (int t = 0; t < T; t++) ids[t] = (int32_t)(rng_next(rng) % (uint64_t)info->vocab_size);
    float *pooled = malloc(sizeof(float) * B * H);
    double *times = malloc(sizeof(double) * iters);
    nopad_encode_params p = {.pooling = NOPAD_POOLING_CLS, .normalize = 0};
    int ok = 1;
    for (int i = 0; i < warmup + iters && ok; i++) {
        double t0 = now_ms();
        if (nopad_encode_packed(model, B, cu, ids, NULL, &p, NULL, pooled) != NOPAD_OK) {
            fprintf(stderr, "nopad bench: error: %d x %d: %s\n", B, M, nopad_last_error());
            ok = 0;
        }
        if (i >= warmup) times[i - warmup] = now_ms() - t0;
    }
    if (ok) {
        qsort(times, iters, sizeof *times, compare_double);
        r->batch = B;
        r->max = M;
        r->tokens = T;
        r->ms = times[iters / 2];
        r->tokens_per_s = T / (r->ms * 1e-3);
        /* per layer: QKV 6H², output 2H², FFN 4HI per token (multiply-adds x2), attention 4·H·L² */
        double flops = (double)info->num_layers *
                       ((double)T * (8.0 * H * H + 4.0 * H * I) + 4.0 * H * (double)sum_sq);
        r->tflops = flops / (r->ms * 1e-3) / 1e12;
    }
    free(cu);
    free(ids);
    free(pooled);
    free(times);
    return ok;
}

enum {
    OPT_MODEL = 256, OPT_DEVICE, OPT_DTYPE, OPT_THREADS, OPT_BATCH, OPT_MAX, OPT_ALL, OPT_ITERS,
    OPT_WARMUP, OPT_SEED, OPT_PEAK_TFLOPS, OPT_CUDA_GRAPH_MAX_TOKENS, OPT_JSON
};

static const struct option long_options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"max", required_argument, NULL, OPT_MAX},
    {"all", no_argument, NULL, OPT_ALL},
    {"iters", required_argument, NULL, OPT_ITERS},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"seed", required_argument, NULL, OPT_SEED},
    {"peak-tflops", required_argument, NULL, OPT_PEAK_TFLOPS},
    {"cuda-graph-max-tokens", required_argument, NULL, OPT_CUDA_GRAPH_MAX_TOKENS},
    {"json", no_argument, NULL, OPT_JSON},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

int cmd_bench(int argc, char **argv) {
    const char *model_dir = NULL;
    nopad_model_params mp = nopad_model_default_params();
    int dtype_given = 0, batch = 0, max = 0, iters = 20, warmup = 3, all = 0, json = 0;
    uint64_t seed = 20261121;
    double peak = 0;
    cli_parser p = cli_parser_start(argc, argv, long_options);
    int c;
    while ((c = cli_getopt(&p)) != -1) {
        const char *v = optarg;
        int n;
        char *end;
        switch (c) {
        case 'h': fputs(bench_help, stdout); return 0;
        case OPT_ALL: all = 1; break;
        case OPT_JSON: json = 1; break;
        case OPT_MODEL: model_dir = v; break;
        case OPT_DEVICE:
            if (device_from_name(v, &mp.device))
                return usage_error("--device must be cpu or cuda, not", v);
            break;
        case OPT_DTYPE:
            if (dtype_from_name(v, &mp.dtype))
                return usage_error("--dtype must be fp32, fp16 or bf16, not", v);
            dtype_given = 1;
            break;
        case OPT_THREADS:
            if (!int_in_range(v, 0, 4096, &mp.n_threads)) return usage_error("bad --threads", v);
            break;
        case OPT_BATCH:
            if (!int_in_range(v, 1, 1 << 20, &batch)) return usage_error("bad --batch", v);
            break;
        case OPT_MAX:
            if (!int_in_range(v, 1, 1 << 20, &max)) return usage_error("bad --max", v);
            break;
        case OPT_ITERS:
            if (!int_in_range(v, 1, 1 << 20, &iters)) return usage_error("bad --iters", v);
            break;
        case OPT_WARMUP:
            if (!int_in_range(v, 0, 1 << 20, &warmup)) return usage_error("bad --warmup", v);
            break;
        case OPT_SEED:
            if (!int_in_range(v, 0, 1 << 30, &n)) return usage_error("bad --seed", v);
            seed = (uint64_t)n * 2654435761u + 1;
            break;
        case OPT_CUDA_GRAPH_MAX_TOKENS:
            if (!int_in_range(v, -1, 1 << 30, &n))
                return usage_error("bad --cuda-graph-max-tokens", v);
            mp.cuda_graph_max_tokens = n;
            break;
        case OPT_PEAK_TFLOPS:
            peak = strtod(v, &end);
            if (*end || !(peak > 0)) return usage_error("bad --peak-tflops", v);
            break;
        default:
            if (p.error == CLI_OPT_NEEDS_VALUE) return usage_error("missing value for", p.arg);
            return usage_error("unknown option", p.arg);
        }
    }
    if (!model_dir) return usage_error("--model is required", NULL);
    if ((batch > 0) != (max > 0)) return usage_error("--batch and --max go together", NULL);
    if (mp.device == NOPAD_DEVICE_CUDA && !dtype_given) mp.dtype = NOPAD_DTYPE_F16;

    static const int grid_batch[] = {1, 16, 64, 128}, grid_max[] = {64, 128, 256, 512, 1024};
    int points[20][2], n_points = 0;
    if (batch) {
        points[n_points][0] = batch, points[n_points][1] = max, n_points++;
    } else {
        for (int b = 0; b < 4; b++)
            for (int m = 0; m < 5; m++)
                points[n_points][0] = grid_batch[b], points[n_points][1] = grid_max[m], n_points++;
    }
    int max_tokens = 0;
    for (int i = 0; i < n_points; i++)
        if (points[i][0] * points[i][1] > max_tokens) max_tokens = points[i][0] * points[i][1];
    if (mp.device == NOPAD_DEVICE_CUDA) mp.max_batch_tokens = max_tokens; /* allocated once, at load */

    nopad_model *model;
    if (nopad_model_load(model_dir, &mp, &model) != NOPAD_OK) {
        fprintf(stderr, "nopad bench: error: %s\n", nopad_last_error());
        return 1;
    }
    nopad_model_info info;
    nopad_model_get_info(model, &info);
    if (info.is_decoder) {
        fprintf(stderr, "nopad bench: error: %s is a decoder (%s); bench times encoders\n",
                model_dir, info.family);
        nopad_model_free(model);
        return 1;
    }
    if (batch && max > info.max_seq_length) {
        fprintf(stderr, "nopad bench: error: --max %d: the model accepts at most %d tokens per sequence\n",
                max, info.max_seq_length);
        nopad_model_free(model);
        return 1;
    }
    if (!json)
        printf("%s %s, %d layers, hidden %d, on %s %s; median of %d forwards after %d warm-up\n"
               "| batch x max | tokens | ms | tokens/s | TFLOP/s |%s\n|---|---|---|---|---|%s\n",
               info.family, model_dir, info.num_layers, info.hidden_size,
               mp.device == NOPAD_DEVICE_CUDA ? "cuda" : "cpu", info.compute_dtype, iters, warmup,
               peak > 0 ? " of peak |" : "", peak > 0 ? "---|" : "");
    uint64_t rng = seed ? seed : 1;
    int status = 0, n_run = 0;
    for (int i = 0; i < n_points; i++) {
        const int B = points[i][0], M = points[i][1];
        if (M > info.max_seq_length) continue;
        if (!batch && mp.device == NOPAD_DEVICE_CPU && !all && B * M > 8192) continue;
        point_result r;
        if (!run_point(model, &info, B, M, iters, warmup, &rng, &r)) {
            status = 1;
            break;
        }
        n_run++;
        if (json) /* the rates in significant digits: a tiny model's TFLOP/s rounds to 0.000 */
            printf("{\"batch\": %d, \"max\": %d, \"tokens\": %d, \"ms\": %.4f, \"tokens_per_s\": %.0f, "
                   "\"tflops\": %.6g%s%.6g}\n",
                   r.batch, r.max, r.tokens, r.ms, r.tokens_per_s, r.tflops,
                   ", \"fraction_of_peak\": ", peak > 0 ? r.tflops / peak : 0.0);
        else if (peak > 0)
            printf("| %d x %d | %d | %.3f | %.0f | %.2f | %.2f |\n", r.batch, r.max, r.tokens, r.ms,
                   r.tokens_per_s, r.tflops, r.tflops / peak);
        else
            printf("| %d x %d | %d | %.3f | %.0f | %.2f |\n", r.batch, r.max, r.tokens, r.ms,
                   r.tokens_per_s, r.tflops);
        fflush(stdout);
    }
    if (status == 0 && n_run == 0) {
        fprintf(stderr, "nopad bench: error: no point of the grid fits this model (maximum length %d%s); "
                        "choose one with --batch and --max\n",
                info.max_seq_length, mp.device == NOPAD_DEVICE_CPU && !all ? ", CPU points <= 8192 tokens" : "");
        status = 1;
    }
    size_t weights = 0, workspace = 0, backend = 0;
    nopad_model_memory(model, &weights, &workspace, &backend);
    if (json)
        printf("{\"weights_bytes\": %zu, \"workspace_bytes\": %zu, \"backend_bytes\": %zu}\n", weights,
               workspace, backend);
    else
        printf("memory: weights %.1f MiB, workspace %.1f MiB, backend %.1f MiB (total %.1f MiB)\n",
               weights / 1048576.0, workspace / 1048576.0, backend / 1048576.0,
               (weights + workspace + backend) / 1048576.0);
    nopad_model_free(model);
    return status;
}

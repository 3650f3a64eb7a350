/* Training-step benchmark of the CUDA backend (issue 24's TRAIN workload): masked-LM steps of a
 * BERT checkpoint on random packed batches, timed by part — forward (encoder, MLM head on the
 * masked rows, loss), backward, optimiser — with CUDA events on the backend's stream.
 *
 * A batch is B sequences with lengths uniform in [--min-len, --max-len] and random ids; 15% of
 * each sequence's positions (at least one) are masked, with random labels. --batches distinct
 * batches are drawn before the clock starts and cycled, so the host's drawing is never timed.
 * After --warmup steps, each of --steps steps records four events (start, after the forward's
 * enqueue, after the backward's, after the optimiser's) and then reads the loss back (the step's
 * one host synchronisation, as in training). Reported: the median of each part and of the whole
 * step, useful (real) tokens per second from the median step and the mean batch, the device
 * memory the model, optimiser state and workspace take (cudaMemGetInfo before loading and after
 * the first step; the CUDA context excluded), and the losses of the first and last steps.
 *
 * Usage: train_bench --model DIR [--batch 32] [--min-len 102] [--max-len 512] [--mask 0.15]
 *                    [--steps 20] [--warmup 5] [--batches 8] [--dtype bf16|f16]
 *                    [--optimizer adamw|lamb] [--lr 1e-4] [--seed 1] [--json FILE]
 *                    [--lengths FILE] [--dropout 0]
 * --dropout P: hidden and attention dropout at rate P (the TRAIN workload runs without, as its HF
 * peer does; this measures what the dropouts cost).
 * --lengths: the batches' sequence lengths, a line a batch (whitespace-separated), instead of
 * drawing them — so a peer can run the very same batches (bench/train_bench.py writes it); the
 * line count is the number of batches and each line's count the batch size.
 * The checkpoint needs the encoder; a missing MLM head is created (HF's initialisation). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "train/train.h"
#include "util/error.h"
#include "util/philox.h"

#include "bench_check.h"

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        nopad_status st_ = (expr);                                                                 \
        if (st_ != NOPAD_OK) {                                                                     \
            fprintf(stderr, "train_bench: %s: %s\n", #expr, nopad_last_error());                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define CUDA_CHECK(expr)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "train_bench: %s: %s\n", #expr, cudaGetErrorString(e_));              \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

enum { MAX_STEPS = 1000, MAX_BATCHES = 64 };

/* The host's clock, for the time a step takes to enqueue (host_enqueue_ms: near step_ms means
 * the GPU waits for the host). */
static double host_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* One drawn batch and the arrays it points at. */
typedef struct drawn_batch {
    train_batch b;
    int32_t *cu, *tokens, *positions, *labels;
} drawn_batch;

static uint64_t draw_counter;
static uint32_t draw(uint64_t seed) { return philox_bits(seed, draw_counter++); }

/* lengths: B given lengths, or NULL to draw them in [min_len, max_len]. */
static void draw_batch(drawn_batch *d, int32_t B, const int32_t *lengths, int32_t min_len,
                       int32_t max_len, double mask, int32_t vocab, uint64_t seed) {
    d->cu = malloc((size_t)(B + 1) * sizeof(int32_t));
    d->cu[0] = 0;
    for (int32_t s = 0; s < B; s++)
        d->cu[s + 1] = d->cu[s] + (lengths ? lengths[s] :
                                   min_len + (int32_t)(draw(seed) % (uint32_t)(max_len - min_len + 1)));
    const int32_t T = d->cu[B];
    d->tokens = malloc((size_t)T * sizeof(int32_t));
    d->positions = malloc((size_t)T * sizeof(int32_t));
    d->labels = malloc((size_t)T * sizeof(int32_t));
    int32_t M = 0;
    /* ids above 999: BERT's vocabularies keep [PAD], [unused..], [CLS], [SEP], [MASK] below */
    const uint32_t lo = vocab > 2000 ? 1000 : 1, span = (uint32_t)vocab - lo;
    for (int32_t s = 0; s < B; s++) {
        const int32_t len = d->cu[s + 1] - d->cu[s];
        int32_t want = (int32_t)floor(mask * len + 0.5);
        if (want < 1) want = 1;
        /* the first `want` positions of a random permutation would do; a stride does as well
         * for timing and keeps the positions sorted */
        const double stride = (double)len / want;
        for (int32_t i = 0; i < want; i++) {
            d->positions[M] = d->cu[s] + (int32_t)(i * stride);
            d->labels[M++] = (int32_t)(lo + draw(seed) % span);
        }
    }
    for (int32_t t = 0; t < T; t++) d->tokens[t] = (int32_t)(lo + draw(seed) % span);
    d->b = (train_batch){.n_seqs = B, .cu_seqlens = d->cu, .tokens = d->tokens, .types = NULL,
                         .n_masked = M, .mlm_positions = d->positions, .mlm_labels = d->labels};
}

static float median(float *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_float);
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    const char *model_dir = NULL, *json_path = NULL, *dtype_name = "bf16", *optimizer = "adamw";
    const char *lengths_path = NULL;
    int32_t B = 32, min_len = 102, max_len = 512, steps = 20, warmup = 5, n_batches = 8;
    double mask = 0.15, lr = 1e-4, dropout = 0;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "train_bench: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--model")) model_dir = v;
        else if (!strcmp(a, "--json")) json_path = v;
        else if (!strcmp(a, "--lengths")) lengths_path = v;
        else if (!strcmp(a, "--dtype")) dtype_name = v;
        else if (!strcmp(a, "--optimizer")) optimizer = v;
        else if (!strcmp(a, "--batch")) B = atoi(v);
        else if (!strcmp(a, "--min-len")) min_len = atoi(v);
        else if (!strcmp(a, "--max-len")) max_len = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--warmup")) warmup = atoi(v);
        else if (!strcmp(a, "--batches")) n_batches = atoi(v);
        else if (!strcmp(a, "--mask")) mask = atof(v);
        else if (!strcmp(a, "--lr")) lr = atof(v);
        else if (!strcmp(a, "--dropout")) dropout = atof(v);
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
        else { fprintf(stderr, "train_bench: unknown option %s\n", a); return 2; }
        i++;
    }
    if (!model_dir || B < 1 || min_len < 1 || max_len < min_len || steps < 1 || steps > MAX_STEPS ||
        warmup < 0 || n_batches < 1 || n_batches > MAX_BATCHES || !(mask > 0 && mask < 1) ||
        !(dropout >= 0 && dropout < 1)) {
        fprintf(stderr, "usage: train_bench --model DIR [--batch B] [--min-len L] [--max-len L] "
                        "[--mask P in (0,1)] [--steps 1..%d] [--warmup N] [--batches 1..%d] "
                        "[--dtype bf16|f16] [--optimizer adamw|lamb] [--lr X] [--seed S] "
                        "[--json FILE] [--lengths FILE] [--dropout P in [0,1)]\n", MAX_STEPS, MAX_BATCHES);
        return 2;
    }
    const nopad_dtype dtype = !strcmp(dtype_name, "f16") || !strcmp(dtype_name, "fp16") ?
                                  NOPAD_DTYPE_F16 : NOPAD_DTYPE_BF16;
    const int lamb = !strcmp(optimizer, "lamb");

    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    size_t free_before, free_after, total;
    CUDA_CHECK(cudaFree(0)); /* the context first, so its memory is not counted */
    CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
    nopad_backend_params bp = {.device = NOPAD_DEVICE_CUDA, .device_index = 0, .dtype = dtype,
                               .cuda_stream = stream};
    nopad_backend *be = NULL;
    CHECK(nopad_backend_create(&bp, &be));
    train_model m;
    CHECK(train_model_load_new_head(be, model_dir, TRAIN_TASK_MLM, 0, seed, &m));
    const model_config *c = &m.cfg;
    if (max_len > c->max_position_embeddings) {
        fprintf(stderr, "train_bench: --max-len %d is above the model's %d positions\n", max_len,
                c->max_position_embeddings);
        return 2;
    }
    /* the given lengths: a line a batch */
    static int32_t given[MAX_BATCHES][4096];
    if (lengths_path) {
        FILE *f = fopen(lengths_path, "r");
        if (!f) { fprintf(stderr, "train_bench: cannot read %s\n", lengths_path); return 2; }
        char line[65536];
        n_batches = 0;
        while (fgets(line, sizeof line, f) && n_batches < MAX_BATCHES) {
            int32_t n = 0;
            for (char *tok = strtok(line, " \t\n"); tok && n < 4096; tok = strtok(NULL, " \t\n")) {
                const int32_t len = atoi(tok);
                if (len < 1 || len > c->max_position_embeddings) {
                    fprintf(stderr, "train_bench: %s: length %d outside [1, %d]\n", lengths_path, len,
                            c->max_position_embeddings);
                    return 2;
                }
                given[n_batches][n++] = len;
            }
            if (n == 0) continue;
            if (n_batches > 0 && n != B) {
                fprintf(stderr, "train_bench: %s: batches of different sizes (%d, %d)\n", lengths_path, B, n);
                return 2;
            }
            B = n;
            n_batches++;
        }
        fclose(f);
        if (n_batches == 0) { fprintf(stderr, "train_bench: %s: no batch\n", lengths_path); return 2; }
    }
    drawn_batch batches[MAX_BATCHES];
    int32_t max_tokens = 0;
    double mean_tokens = 0, mean_masked = 0;
    for (int i = 0; i < n_batches; i++) {
        draw_batch(&batches[i], B, lengths_path ? given[i] : NULL, min_len, max_len, mask,
                   c->vocab_size, seed + 1000 + (uint64_t)i);
        const int32_t T = batches[i].cu[B];
        if (T > max_tokens) max_tokens = T;
        mean_tokens += (double)T / n_batches;
        mean_masked += (double)batches[i].b.n_masked / n_batches;
    }
    train_context ctx;
    CHECK(train_context_init(&m, max_tokens, B, &ctx));
    ctx.dropout = ctx.attention_dropout = (float)dropout;
    ctx.dropout_seed = seed;
    train_optimizer opt = train_optimizer_defaults();
    opt.lr = (float)lr;

    cudaEvent_t ev[MAX_STEPS][4];
    for (int s = 0; s < steps; s++)
        for (int k = 0; k < 4; k++) CUDA_CHECK(cudaEventCreate(&ev[s][k]));
    double first_loss = 0, last_loss = 0;
    float host_ms[MAX_STEPS];
    for (int s = 0; s < warmup + steps; s++) {
        const train_batch *b = &batches[s % n_batches].b;
        const int timed = s >= warmup;
        cudaEvent_t *e = timed ? ev[s - warmup] : NULL;
        if (timed) CUDA_CHECK(cudaEventRecord(e[0], stream));
        const double h0 = host_now_ms();
        CHECK(train_forward(&ctx, b));
        if (timed) CUDA_CHECK(cudaEventRecord(e[1], stream));
        CHECK(train_backward(&ctx));
        if (timed) CUDA_CHECK(cudaEventRecord(e[2], stream));
        CHECK(lamb ? train_lamb_step(&m, &opt, NULL) : train_adamw_step(&m, &opt));
        if (timed) CUDA_CHECK(cudaEventRecord(e[3], stream));
        if (timed) host_ms[s - warmup] = (float)(host_now_ms() - h0);
        double loss;
        CHECK(train_read_loss(&ctx, &loss));
        if (!isfinite(loss)) {
            fprintf(stderr, "train_bench: step %d: the loss is %g\n", s, loss);
            return 1;
        }
        if (s == 0) {
            first_loss = loss;
            CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
        }
        last_loss = loss;
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    float fwd[MAX_STEPS], bwd[MAX_STEPS], opt_ms[MAX_STEPS], step[MAX_STEPS];
    for (int s = 0; s < steps; s++) {
        CUDA_CHECK(cudaEventElapsedTime(&fwd[s], ev[s][0], ev[s][1]));
        CUDA_CHECK(cudaEventElapsedTime(&bwd[s], ev[s][1], ev[s][2]));
        CUDA_CHECK(cudaEventElapsedTime(&opt_ms[s], ev[s][2], ev[s][3]));
        CUDA_CHECK(cudaEventElapsedTime(&step[s], ev[s][0], ev[s][3]));
    }
    const float f = median(fwd, steps), bk = median(bwd, steps), o = median(opt_ms, steps),
                st = median(step, steps), host = median(host_ms, steps);
    const double mem_gb = (double)(free_before - free_after) / 1e9;
    const double tok_s = mean_tokens / (st * 1e-3);
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    char json[2048];
    snprintf(json, sizeof json,
             "{\"engine\": \"nopad\", \"build\": \"%s\", \"gpu\": \"%s\", \"dtype\": \"%s\", \"optimizer\": \"%s\", "
             "\"dropout\": %g, \"layers\": %d, \"hidden\": %d, \"batch\": %d, \"min_len\": %d, \"max_len\": %d, "
             "\"mean_tokens\": %.1f, \"mean_masked\": %.1f, \"steps\": %d, \"warmup\": %d, "
             "\"forward_ms\": %.3f, \"backward_ms\": %.3f, \"optimizer_ms\": %.3f, "
             "\"step_ms\": %.3f, \"host_enqueue_ms\": %.3f, \"useful_tok_s\": %.0f, \"memory_gb\": %.3f, "
             "\"params\": %lld, \"first_loss\": %.4f, \"last_loss\": %.4f}\n",
             nopad_build_id(), prop.name, dtype == NOPAD_DTYPE_BF16 ? "bf16" : "f16", lamb ? "lamb" : "adamw", dropout,
             c->num_layers, c->hidden_size, B, min_len, max_len, mean_tokens, mean_masked, steps,
             warmup, f, bk, o, st, host, tok_s, mem_gb, (long long)m.n_params, first_loss, last_loss);
    fputs(json, stdout);
    if (json_path) {
        FILE *out = fopen(json_path, "w");
        if (!out || fputs(json, out) < 0 || fclose(out) != 0) {
            fprintf(stderr, "train_bench: cannot write %s\n", json_path);
            return 1;
        }
    }
    for (int s = 0; s < steps; s++)
        for (int k = 0; k < 4; k++) cudaEventDestroy(ev[s][k]);
    for (int i = 0; i < n_batches; i++)
        free(batches[i].cu), free(batches[i].tokens), free(batches[i].positions), free(batches[i].labels);
    train_context_free(&ctx);
    train_model_free(&m);
    be->destroy(be);
    cudaStreamDestroy(stream);
    return 0;
}

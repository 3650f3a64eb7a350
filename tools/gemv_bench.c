/* A decode step's linear layers alone: the gemv kernels (src/backend/cuda/gemm/gemv.h) over the
 * weights of a LLaMA-1B-shaped model (hidden 2048, FFN 5632, 32 heads over 4 KV heads of 64, 16
 * layers, 32000 words), without the norms, attention and sampling that run between them in a step.
 * It tells the two halves of a step's distance to its floor apart: the linear layers' own speed
 * and the rest.
 *
 * Modes, each captured once into a CUDA graph (programmatic launches as in a decode step) and
 * replayed; per mode the median of `reps` replays, after 3 warm-up replays:
 * - chain: per layer qkv, o, gate|up (SwiGLU) and down, then the float32 LM head, in step order;
 * - qkv, o, gateup, down: that layer's projection alone, the 16 layers' weights in turn;
 * - head: the LM head 4 times over 4 copies.
 * GB/s = weight bytes a replay reads / its time; the weights (1.55 GB for the chain) are far larger
 * than the L2 cache, so every replay reads them from memory. The device-to-device copy rate of 1 GB
 * (bytes read + written), measured in the same run, is the ceiling the floor of DEC uses.
 *
 * Usage: gemv_bench [--dtype f16|bf16] [--tokens 1,8,16,32] [--reps R]
 * Prints one JSON object per (mode, tokens) on stdout, a copy-rate object first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm/gemv.h"

#include "bench_check.h"

enum { MAX_LIST = 16, MAX_REPS = 101, LAYERS = 16, HIDDEN = 2048, FFN = 5632, QKV = (32 + 2 * 4) * 64,
       VOCAB = 32000, HEAD_COPIES = 4 };

/* Random values in [-scale, scale] into n elements of backend memory, uploaded in chunks. */
static void fill(nopad_backend *be, void *dst, size_t n, float scale) {
    const size_t chunk = (size_t)1 << 22;
    float *host = malloc(chunk * sizeof *host);
    for (size_t off = 0; off < n; off += chunk) {
        const size_t m = n - off < chunk ? n - off : chunk;
        for (size_t i = 0; i < m; i++) host[i] = scale * bench_uniform();
        CHECK_NOPAD(be->upload_f32(be, (char *)dst + off * 2, host, m));
    }
    free(host);
}

typedef struct model {
    void *qkv[LAYERS], *o[LAYERS], *gate_up[LAYERS], *down[LAYERS], *head[HEAD_COPIES];
    void *x, *y;   /* activations: x [32, FFN], y [32, 2·FFN] in the compute dtype */
    float *logits; /* [32, VOCAB] */
} model;

static const char *MODES[] = {"chain", "qkv", "o", "gateup", "down", "head"};
enum { N_MODES = 6 };

/* One replay's launches of a mode; returns the weight bytes they read. */
static size_t enqueue(nopad_dtype dt, const model *m, int mode, int T, cudaStream_t st) {
    size_t bytes = 0;
    for (int l = 0; l < LAYERS; l++) {
        if (mode == 0 || mode == 1) {
            CHECK_NOPAD(cuda_gemv(dt, m->y, m->x, m->qkv[l], NULL, NULL, T, HIDDEN, QKV, -1, st));
            bytes += (size_t)QKV * HIDDEN * 2;
        }
        if (mode == 0 || mode == 2) {
            CHECK_NOPAD(cuda_gemv(dt, m->y, m->x, m->o[l], NULL, NULL, T, HIDDEN, HIDDEN, -1, st));
            bytes += (size_t)HIDDEN * HIDDEN * 2;
        }
        if (mode == 0 || mode == 3) {
            CHECK_NOPAD(cuda_gemv_swiglu(dt, m->y, m->x, m->gate_up[l], T, HIDDEN, FFN, st));
            bytes += (size_t)2 * FFN * HIDDEN * 2;
        }
        if (mode == 0 || mode == 4) {
            CHECK_NOPAD(cuda_gemv(dt, m->y, m->x, m->down[l], NULL, NULL, T, FFN, HIDDEN, -1, st));
            bytes += (size_t)HIDDEN * FFN * 2;
        }
    }
    const int heads = mode == 0 ? 1 : mode == 5 ? HEAD_COPIES : 0;
    for (int h = 0; h < heads; h++) {
        CHECK_NOPAD(cuda_gemv_f32(dt, m->logits, m->x, m->head[h], T, HIDDEN, VOCAB, st));
        bytes += (size_t)VOCAB * HIDDEN * 2;
    }
    return bytes;
}

int main(int argc, char **argv) {
    nopad_dtype dtype = NOPAD_DTYPE_F16;
    int reps = 21;
    int tokens[MAX_LIST] = {1, 8, 16, 32}, n_tokens = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--dtype")) dtype = !strcmp(v, "bf16") ? NOPAD_DTYPE_BF16 : NOPAD_DTYPE_F16, i++;
        else if (!strcmp(a, "--reps")) reps = atoi(v), i++;
        else if (!strcmp(a, "--tokens")) {
            n_tokens = 0;
            for (const char *s = v; *s && n_tokens < MAX_LIST;) {
                tokens[n_tokens++] = atoi(s);
                const char *comma = strchr(s, ',');
                if (!comma) break;
                s = comma + 1;
            }
            i++;
        } else {
            fprintf(stderr, "gemv_bench: unknown argument %s\n", a);
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    if (reps > MAX_REPS) reps = MAX_REPS;
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 1 || tokens[i] > CUDA_GEMV_MAX_T) {
            fprintf(stderr, "gemv_bench: tokens must be 1 to %d\n", (int)CUDA_GEMV_MAX_T);
            return 2;
        }
    nopad_backend *be;
    CHECK_NOPAD(nopad_backend_cuda_create(dtype, 0, NULL, &be));
    cudaStream_t stream = (cudaStream_t)cuda_backend_stream(be);
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));

    /* the ceiling: a 1 GB device-to-device copy, bytes read + written */
    {
        const size_t n = (size_t)1 << 30;
        void *a, *b;
        CHECK_CUDA(cudaMalloc(&a, n));
        CHECK_CUDA(cudaMalloc(&b, n));
        CHECK_CUDA(cudaMemsetAsync(a, 1, n, stream));
        float ms[5];
        for (int r = 0; r < 6; r++) {
            CHECK_CUDA(cudaEventRecord(e0, stream));
            CHECK_CUDA(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, stream));
            CHECK_CUDA(cudaEventRecord(e1, stream));
            CHECK_CUDA(cudaEventSynchronize(e1));
            if (r > 0) CHECK_CUDA(cudaEventElapsedTime(&ms[r - 1], e0, e1));
        }
        qsort(ms, 5, sizeof *ms, bench_cmp_float);
        printf("{\"copy_gbps\": %.1f}\n", 2.0 * n / (ms[2] * 1e-3) / 1e9);
        CHECK_CUDA(cudaFree(a));
        CHECK_CUDA(cudaFree(b));
    }

    model m;
    const float ws = 0.03f; /* ~1/sqrt(K): outputs of order one */
    for (int l = 0; l < LAYERS; l++) {
        CHECK_NOPAD(be->alloc(be, (size_t)QKV * HIDDEN * 2, &m.qkv[l]));
        CHECK_NOPAD(be->alloc(be, (size_t)HIDDEN * HIDDEN * 2, &m.o[l]));
        CHECK_NOPAD(be->alloc(be, (size_t)2 * FFN * HIDDEN * 2, &m.gate_up[l]));
        CHECK_NOPAD(be->alloc(be, (size_t)HIDDEN * FFN * 2, &m.down[l]));
        fill(be, m.qkv[l], (size_t)QKV * HIDDEN, ws);
        fill(be, m.o[l], (size_t)HIDDEN * HIDDEN, ws);
        fill(be, m.gate_up[l], (size_t)2 * FFN * HIDDEN, ws);
        fill(be, m.down[l], (size_t)HIDDEN * FFN, ws);
    }
    for (int h = 0; h < HEAD_COPIES; h++) {
        CHECK_NOPAD(be->alloc(be, (size_t)VOCAB * HIDDEN * 2, &m.head[h]));
        fill(be, m.head[h], (size_t)VOCAB * HIDDEN, ws);
    }
    CHECK_NOPAD(be->alloc(be, (size_t)32 * FFN * 2, &m.x));
    CHECK_NOPAD(be->alloc(be, (size_t)32 * 2 * FFN * 2, &m.y));
    CHECK_NOPAD(be->alloc(be, (size_t)32 * VOCAB * sizeof(float), (void **)&m.logits));
    fill(be, m.x, (size_t)32 * FFN, 1.0f);
    CHECK_CUDA(cudaStreamSynchronize(stream));

    for (int ti = 0; ti < n_tokens; ti++) {
        const int T = tokens[ti];
        for (int mode = 0; mode < N_MODES; mode++) {
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
            const size_t bytes = enqueue(dtype, &m, mode, T, stream);
            CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
            CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
            float us[MAX_REPS];
            for (int r = 0; r < 3 + reps; r++) {
                CHECK_CUDA(cudaEventRecord(e0, stream));
                CHECK_CUDA(cudaGraphLaunch(exec, stream));
                CHECK_CUDA(cudaEventRecord(e1, stream));
                CHECK_CUDA(cudaEventSynchronize(e1));
                float ms;
                CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
                if (r >= 3) us[r - 3] = ms * 1000.0f;
            }
            qsort(us, (size_t)reps, sizeof *us, bench_cmp_float);
            const float med = us[reps / 2];
            printf("{\"mode\": \"%s\", \"tokens\": %d, \"dtype\": \"%s\", \"us\": %.1f, \"min_us\": %.1f, "
                   "\"weight_bytes\": %zu, \"gbps\": %.1f}\n",
                   MODES[mode], T, dtype == NOPAD_DTYPE_BF16 ? "bf16" : "f16", med, us[0], bytes,
                   bytes / (med * 1e-6) / 1e9);
            fflush(stdout);
            CHECK_CUDA(cudaGraphExecDestroy(exec));
            CHECK_CUDA(cudaGraphDestroy(graph));
        }
    }
    be->destroy(be);
    return 0;
}

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
 * --format q4_0|q4_1|q5_0|q5_1|q8_0|q4_k|q5_k|q6_k keeps the weights in that GGUF block format
 * (random blocks, scales of 1/64) and runs the backend's gemm_q on them (backend/cuda/quant/): the
 * quantized GEMV up to 32 tokens, above it the weight dequantised into a scratch and the GEMM, so
 * any token count goes (one direct call per mode first: the scratch grows outside the capture).
 * gate|up is then a plain [2F, K] product (the decoder applies SwiGLU after it on such weights).
 * The default, f16, is the compute dtype's own weights on the gemv kernels (tokens <= 32).
 * --format fp8 keeps them as FP8 E4M3 codes with a float32 scale a row (NOPAD_WEIGHT_FP8_E4M3,
 * quant/fp8.h: the FP8 GEMV up to 32 tokens, cuBLASLt's FP8 GEMM above); random codes, scales 1/64.
 * --misalign puts each block-format weight 2 bytes past a 16-byte boundary, which runs the
 * quantized GEMV's direct kernel (2-byte loads) instead of the staged one (qgemv.cuh): the two
 * measured on the same shapes.
 *
 * Usage: gemv_bench [--dtype f16|bf16] [--format f16|q4_0|...] [--misalign] [--tokens 1,8,16,32] [--reps R]
 * Prints one JSON object per (mode, tokens) on stdout, a copy-rate object first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm/gemv.h"
#include "backend/cuda/quant/quant.h"

#include "bench_check.h"

enum { MAX_LIST = 16, MAX_TOKENS = 1024, MAX_REPS = 101, LAYERS = 16, HIDDEN = 2048, FFN = 5632, QKV = (32 + 2 * 4) * 64,
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

/* The GGUF block formats by name: ggml's id, values and bytes a block, where its fp16 scale d and
 * (Q4_1, Q5_1: m; k-quants: dmin) min sit. */
typedef struct block_format {
    const char *name;
    nopad_weight_format format;
    int values, bytes, d_at, m_at;
} block_format;
static const block_format FORMATS[] = {
    {"q4_0", NOPAD_WEIGHT_Q4_0, 32, 18, 0, -1},   {"q4_1", NOPAD_WEIGHT_Q4_1, 32, 20, 0, 2},
    {"q5_0", NOPAD_WEIGHT_Q5_0, 32, 22, 0, -1},   {"q5_1", NOPAD_WEIGHT_Q5_1, 32, 24, 0, 2},
    {"q8_0", NOPAD_WEIGHT_Q8_0, 32, 34, 0, -1},   {"q4_k", NOPAD_WEIGHT_Q4_K, 256, 144, 0, 2},
    {"q5_k", NOPAD_WEIGHT_Q5_K, 256, 176, 0, 2},  {"q6_k", NOPAD_WEIGHT_Q6_K, 256, 210, 208, -1},
    {"fp8", NOPAD_WEIGHT_FP8_E4M3, 1, 1, -1, -1}, /* codes, then a float32 scale a row */
};

/* rows × K random E4M3 codes (never a NaN: 0x7f, 0xff), then a scale of 1/64 a row */
static void fill_fp8(nopad_backend *be, void *dst, size_t rows, int K) {
    const size_t codes = rows * (size_t)K, at = nopad_fp8_scales_offset((int64_t)rows, K);
    unsigned char *host = calloc(at + rows * sizeof(float), 1);
    for (size_t i = 0; i < codes; i++) {
        const unsigned char c = (unsigned char)(bench_uniform() * 127.0f + 128.0f);
        host[i] = (c & 0x7f) == 0x7f ? (unsigned char)(c - 1) : c;
    }
    float *scale = (float *)(host + at);
    for (size_t r = 0; r < rows; r++) scale[r] = 1.0f / 64.0f;
    CHECK_NOPAD(be->upload(be, dst, host, at + rows * sizeof(float)));
    CHECK_NOPAD(be->synchronize(be));
    free(host);
}

/* rows × K values of random blocks of f (d = m = 1/64, fp16 0x2400) into backend memory */
static void fill_blocks(nopad_backend *be, void *dst, const block_format *f, size_t rows, int K) {
    if (f->format == NOPAD_WEIGHT_FP8_E4M3) {
        fill_fp8(be, dst, rows, K);
        return;
    }
    const size_t row_bytes = (size_t)(K / f->values) * f->bytes, chunk_rows = ((size_t)1 << 24) / row_bytes + 1;
    unsigned char *host = malloc(chunk_rows * row_bytes);
    for (size_t r0 = 0; r0 < rows; r0 += chunk_rows) {
        const size_t n = rows - r0 < chunk_rows ? rows - r0 : chunk_rows, blocks = n * (K / f->values);
        for (size_t i = 0; i < n * row_bytes; i++) host[i] = (unsigned char)(bench_uniform() * 127.0f + 128.0f);
        for (size_t b = 0; b < blocks; b++) {
            unsigned char *p = host + b * f->bytes;
            p[f->d_at] = 0x00, p[f->d_at + 1] = 0x24;
            if (f->m_at >= 0) p[f->m_at] = 0x00, p[f->m_at + 1] = 0x24;
        }
        CHECK_NOPAD(be->upload(be, (char *)dst + r0 * row_bytes, host, n * row_bytes));
        CHECK_NOPAD(be->synchronize(be));
    }
    free(host);
}

typedef struct model {
    void *qkv[LAYERS], *o[LAYERS], *gate_up[LAYERS], *down[LAYERS], *head[HEAD_COPIES];
    void *x, *y;   /* activations: x [T, FFN], y [T, 2·FFN] in the compute dtype */
    float *logits; /* [T, VOCAB] */
    const block_format *blocks; /* the weights' block format, NULL: the compute dtype */
    nopad_backend *be;
} model;

/* Bytes of a weight of n_out rows of K values. */
static size_t weight_bytes(const model *m, size_t n_out, int K) {
    if (m->blocks && m->blocks->format == NOPAD_WEIGHT_FP8_E4M3)
        return nopad_fp8_scales_offset((int64_t)n_out, K) + n_out * sizeof(float);
    return m->blocks ? n_out * cuda_quant_row_bytes(m->blocks->format, K) : n_out * (size_t)K * 2;
}

/* y[T, N] = x · wᵀ on either kind of weight (out_f32: float32 logits) */
static void linear(const model *m, nopad_dtype dt, void *y, const void *w, int T, int K, int N, int out_f32,
                   cudaStream_t st) {
    if (m->blocks)
        CHECK_NOPAD(m->be->gemm_q(m->be, y, m->x, w, m->blocks->format, NULL, NULL, T, K, N, NOPAD_EPILOGUE_NONE,
                                  NOPAD_ACT_GELU, out_f32));
    else if (out_f32)
        CHECK_NOPAD(cuda_gemv_f32(dt, y, m->x, w, T, K, N, st));
    else
        CHECK_NOPAD(cuda_gemv(dt, y, m->x, w, NULL, NULL, T, K, N, -1, st));
}

static const char *MODES[] = {"chain", "qkv", "o", "gateup", "down", "head"};
enum { N_MODES = 6 };

/* One replay's launches of a mode; returns the weight bytes they read. */
static size_t enqueue(nopad_dtype dt, const model *m, int mode, int T, cudaStream_t st) {
    size_t bytes = 0;
    for (int l = 0; l < LAYERS; l++) {
        if (mode == 0 || mode == 1) {
            linear(m, dt, m->y, m->qkv[l], T, HIDDEN, QKV, 0, st);
            bytes += weight_bytes(m, QKV, HIDDEN);
        }
        if (mode == 0 || mode == 2) {
            linear(m, dt, m->y, m->o[l], T, HIDDEN, HIDDEN, 0, st);
            bytes += weight_bytes(m, HIDDEN, HIDDEN);
        }
        if (mode == 0 || mode == 3) {
            if (m->blocks) linear(m, dt, m->y, m->gate_up[l], T, HIDDEN, 2 * FFN, 0, st);
            else CHECK_NOPAD(cuda_gemv_swiglu(dt, m->y, m->x, m->gate_up[l], T, HIDDEN, FFN, st));
            bytes += weight_bytes(m, 2 * FFN, HIDDEN);
        }
        if (mode == 0 || mode == 4) {
            linear(m, dt, m->y, m->down[l], T, FFN, HIDDEN, 0, st);
            bytes += weight_bytes(m, HIDDEN, FFN);
        }
    }
    const int heads = mode == 0 ? 1 : mode == 5 ? HEAD_COPIES : 0;
    for (int h = 0; h < heads; h++) {
        linear(m, dt, m->logits, m->head[h], T, HIDDEN, VOCAB, 1, st);
        bytes += weight_bytes(m, VOCAB, HIDDEN);
    }
    return bytes;
}

int main(int argc, char **argv) {
    nopad_dtype dtype = NOPAD_DTYPE_F16;
    const block_format *blocks = NULL;
    int reps = 21, misalign = 0; /* bytes a block-format weight starts past a 16-byte boundary */
    int tokens[MAX_LIST] = {1, 8, 16, 32}, n_tokens = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--dtype")) dtype = !strcmp(v, "bf16") ? NOPAD_DTYPE_BF16 : NOPAD_DTYPE_F16, i++;
        else if (!strcmp(a, "--reps")) reps = atoi(v), i++;
        else if (!strcmp(a, "--misalign")) misalign = 2;
        else if (!strcmp(a, "--format")) {
            blocks = NULL;
            for (size_t f = 0; f < sizeof FORMATS / sizeof FORMATS[0]; f++)
                if (!strcmp(v, FORMATS[f].name)) blocks = &FORMATS[f];
            if (!blocks && strcmp(v, "f16")) {
                fprintf(stderr, "gemv_bench: --format f16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k or fp8\n");
                return 2;
            }
            i++;
        }
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
    if (misalign && blocks && blocks->format == NOPAD_WEIGHT_FP8_E4M3) {
        fprintf(stderr, "gemv_bench: --misalign is for the GGUF block formats (FP8 weights need 16-byte rows)\n");
        return 2;
    }
    if (reps < 1) reps = 1;
    if (reps > MAX_REPS) reps = MAX_REPS;
    const int most_tokens = blocks ? MAX_TOKENS : CUDA_GEMV_MAX_T;
    int max_t = 1;
    for (int i = 0; i < n_tokens; i++) {
        if (tokens[i] < 1 || tokens[i] > most_tokens) {
            fprintf(stderr, "gemv_bench: tokens must be 1 to %d\n", most_tokens);
            return 2;
        }
        max_t = tokens[i] > max_t ? tokens[i] : max_t;
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
    m.blocks = blocks;
    m.be = be;
    const float ws = 0.03f; /* ~1/sqrt(K): outputs of order one */
    /* each weight [n_out, K] allocated and filled in its storage */
#define WEIGHT(ptr, n_out, K)                                                                                \
    do {                                                                                                     \
        CHECK_NOPAD(be->alloc(be, weight_bytes(&m, (n_out), (K)) + 16, &(ptr)));                             \
        if (blocks) (ptr) = (char *)(ptr) + misalign;                                                        \
        if (blocks) fill_blocks(be, (ptr), blocks, (n_out), (K));                                            \
        else fill(be, (ptr), (size_t)(n_out) * (K), ws);                                                     \
    } while (0)
    for (int l = 0; l < LAYERS; l++) {
        WEIGHT(m.qkv[l], QKV, HIDDEN);
        WEIGHT(m.o[l], HIDDEN, HIDDEN);
        WEIGHT(m.gate_up[l], 2 * FFN, HIDDEN);
        WEIGHT(m.down[l], HIDDEN, FFN);
    }
    for (int h = 0; h < HEAD_COPIES; h++) WEIGHT(m.head[h], VOCAB, HIDDEN);
#undef WEIGHT
    CHECK_NOPAD(be->alloc(be, (size_t)max_t * FFN * 2, &m.x));
    CHECK_NOPAD(be->alloc(be, (size_t)max_t * 2 * FFN * 2, &m.y));
    CHECK_NOPAD(be->alloc(be, (size_t)max_t * VOCAB * sizeof(float), (void **)&m.logits));
    fill(be, m.x, (size_t)max_t * FFN, 1.0f);
    CHECK_CUDA(cudaStreamSynchronize(stream));

    for (int ti = 0; ti < n_tokens; ti++) {
        const int T = tokens[ti];
        for (int mode = 0; mode < N_MODES; mode++) {
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            if (blocks) enqueue(dtype, &m, mode, T, stream); /* gemm_q's scratch grows outside the capture */
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
            printf("{\"mode\": \"%s\", \"tokens\": %d, \"dtype\": \"%s\", \"format\": \"%s\", \"misalign\": %d, "
                   "\"us\": %.1f, \"min_us\": %.1f, \"weight_bytes\": %zu, \"gbps\": %.1f}\n",
                   MODES[mode], T, dtype == NOPAD_DTYPE_BF16 ? "bf16" : "f16", blocks ? blocks->name : "f16",
                   blocks ? misalign : 0, med, us[0], bytes,
                   bytes / (med * 1e-6) / 1e9);
            fflush(stdout);
            CHECK_CUDA(cudaGraphExecDestroy(exec));
            CHECK_CUDA(cudaGraphDestroy(graph));
        }
    }
    be->destroy(be);
    return 0;
}

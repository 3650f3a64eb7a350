/* The decoder's paged attention alone (the attention_paged op of the CUDA backend), decode
 * steps: B sequences, one new query row each, over L keys of history in a paged KV cache (blocks
 * of 16, block tables over a shuffled pool). Per point, the median over rounds of the time per
 * launch (CUDA events around `launches` back-to-back launches, the key splits' merge included),
 * and the useful bandwidth: the K and V bytes the step must read (B·L·kv_heads·D·2·dtype bytes)
 * per second. Random data (uniform, never zeros); the launches rotate over enough copies of the
 * cache that one round reads >= 256 MB, so small points are not timed out of the L2.
 *
 * Usage: attn_paged_bench [--dtype f16|bf16] [--heads H --kv-heads K --head-size D]
 *                         [--batches 1,32] [--contexts 512,1024,...] [--reps R]
 * Prints one JSON object per point on stdout (bench/attn_decode_bench.py runs it beside torch). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

#include "bench_check.h"

enum { BLOCK = 16, MAX_LIST = 16, MAX_REPS = 101 };
static const size_t ROUND_BYTES = (size_t)256 << 20;

static int parse_list(const char *s, int *out) {
    int n = 0;
    while (*s && n < MAX_LIST) {
        out[n++] = atoi(s);
        const char *comma = strchr(s, ',');
        if (!comma) break;
        s = comma + 1;
    }
    return n;
}

int main(int argc, char **argv) {
    nopad_dtype dtype = NOPAD_DTYPE_F16;
    int H = 32, KVH = 4, D = 64, reps = 21;
    int batches[MAX_LIST] = {1, 32}, n_batches = 2;
    int contexts[MAX_LIST] = {512, 1024, 2048, 4096, 8192}, n_contexts = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--dtype")) dtype = !strcmp(v, "bf16") ? NOPAD_DTYPE_BF16 : NOPAD_DTYPE_F16, i++;
        else if (!strcmp(a, "--heads")) H = atoi(v), i++;
        else if (!strcmp(a, "--kv-heads")) KVH = atoi(v), i++;
        else if (!strcmp(a, "--head-size")) D = atoi(v), i++;
        else if (!strcmp(a, "--batches")) n_batches = parse_list(v, batches), i++;
        else if (!strcmp(a, "--contexts")) n_contexts = parse_list(v, contexts), i++;
        else if (!strcmp(a, "--reps")) reps = atoi(v), i++;
        else {
            fprintf(stderr, "attn_paged_bench: unknown argument %s\n", a);
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    if (reps > MAX_REPS) reps = MAX_REPS;
    nopad_backend *be;
    CHECK_NOPAD(nopad_backend_cuda_create(dtype, 0, NULL, &be));
    cudaStream_t stream = (cudaStream_t)cuda_backend_stream(be);
    const size_t es = 2;
    for (int bi = 0; bi < n_batches; bi++) {
        for (int ci = 0; ci < n_contexts; ci++) {
            const int B = batches[bi], L = contexts[ci];
            const int blocks_per_seq = (L + BLOCK - 1) / BLOCK;
            const size_t kv_bytes = (size_t)B * L * KVH * D * 2 * es; /* K and V read by one step */
            int sets = (int)((ROUND_BYTES + kv_bytes - 1) / kv_bytes);
            if (sets > 64) sets = 64;
            const int launches = sets < 20 ? 20 : sets;
            const int n_blocks = sets * B * blocks_per_seq;
            const size_t cache_elems = (size_t)n_blocks * BLOCK * KVH * D;
            /* the cache: random, uploaded in chunks */
            void *k_cache, *v_cache;
            CHECK_NOPAD(be->alloc(be, cache_elems * es, &k_cache));
            CHECK_NOPAD(be->alloc(be, cache_elems * es, &v_cache));
            const size_t chunk = (size_t)1 << 22;
            float *host = malloc(chunk * sizeof *host);
            for (size_t off = 0; off < cache_elems; off += chunk) {
                const size_t n = cache_elems - off < chunk ? cache_elems - off : chunk;
                for (size_t i = 0; i < n; i++) host[i] = bench_uniform();
                CHECK_NOPAD(be->upload_f32(be, (char *)k_cache + off * es, host, n));
                for (size_t i = 0; i < n; i++) host[i] = bench_uniform();
                CHECK_NOPAD(be->upload_f32(be, (char *)v_cache + off * es, host, n));
            }
            free(host);
            /* queries: [B, H + 2·KVH, D] rows as the decoder's qkv */
            const size_t qkv_elems = (size_t)B * (H + 2 * KVH) * D;
            float *q = malloc(qkv_elems * sizeof *q);
            for (size_t i = 0; i < qkv_elems; i++) q[i] = bench_uniform();
            void *qkv, *out;
            CHECK_NOPAD(be->alloc(be, qkv_elems * es, &qkv));
            CHECK_NOPAD(be->alloc(be, (size_t)B * H * D * es, &out));
            CHECK_NOPAD(be->upload_f32(be, qkv, q, qkv_elems));
            free(q);
            /* per set: cu_q, seqlen_k and a block table over that set's shuffled blocks */
            int32_t *perm = malloc((size_t)n_blocks * sizeof *perm);
            for (int i = 0; i < n_blocks; i++) perm[i] = i;
            for (int i = n_blocks - 1; i > 0; i--) {
                int j = (int)((bench_rand_u64() >> 33) % (uint64_t)(i + 1)), x = perm[i];
                perm[i] = perm[j];
                perm[j] = x;
            }
            int32_t *hi32 = malloc(((size_t)B + 1 + B) * sizeof *hi32);
            for (int b = 0; b <= B; b++) hi32[b] = b;
            for (int b = 0; b < B; b++) hi32[B + 1 + b] = L;
            int32_t *d_meta, *d_tables;
            CHECK_NOPAD(be->alloc(be, ((size_t)2 * B + 1) * sizeof(int32_t), (void **)&d_meta));
            CHECK_NOPAD(be->alloc(be, (size_t)n_blocks * sizeof(int32_t), (void **)&d_tables));
            CHECK_NOPAD(be->upload_i32(be, d_meta, hi32, (size_t)2 * B + 1));
            CHECK_NOPAD(be->upload_i32(be, d_tables, perm, (size_t)n_blocks));
            free(hi32);
            free(perm);
            nopad_kv_batch *kv = malloc((size_t)sets * sizeof *kv);
            for (int s = 0; s < sets; s++)
                kv[s] = (nopad_kv_batch){.n_seqs = B, .n_tokens = B, .max_q = 1, .max_k = L, .no_history = 0,
                                         .cu_q = d_meta, .seqlen_k = d_meta + B + 1,
                                         .block_table = d_tables + (size_t)s * B * blocks_per_seq,
                                         .max_blocks = blocks_per_seq, .block_size = BLOCK};
            const float scale = 1.0f / sqrtf((float)D);
            for (int w = 0; w < 3; w++) /* warm-up (and the workspace grows here) */
                for (int s = 0; s < sets; s++)
                    CHECK_NOPAD(be->attention_paged(be, out, qkv, k_cache, v_cache, &kv[s], H, KVH, D, scale));
            CHECK_CUDA(cudaStreamSynchronize(stream));
            cudaEvent_t e0, e1;
            CHECK_CUDA(cudaEventCreate(&e0));
            CHECK_CUDA(cudaEventCreate(&e1));
            float us[MAX_REPS];
            for (int r = 0; r < reps; r++) {
                CHECK_CUDA(cudaEventRecord(e0, stream));
                for (int i = 0; i < launches; i++)
                    CHECK_NOPAD(be->attention_paged(be, out, qkv, k_cache, v_cache, &kv[i % sets], H, KVH, D,
                                                    scale));
                CHECK_CUDA(cudaEventRecord(e1, stream));
                CHECK_CUDA(cudaEventSynchronize(e1));
                float ms;
                CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
                us[r] = ms * 1000.0f / launches;
            }
            qsort(us, (size_t)reps, sizeof us[0], bench_cmp_float);
            const float med = us[reps / 2];
            printf("{\"impl\": \"nopad\", \"dtype\": \"%s\", \"batch\": %d, \"context\": %d, \"heads\": %d, "
                   "\"kv_heads\": %d, \"head_size\": %d, \"us\": %.3f, \"kv_bytes\": %zu, \"GBps\": %.1f, "
                   "\"launches\": %d, \"copies\": %d, \"rounds\": %d}\n",
                   dtype == NOPAD_DTYPE_BF16 ? "bf16" : "f16", B, L, H, KVH, D, med, kv_bytes,
                   kv_bytes / (med * 1e-6) / 1e9, launches, sets, reps);
            fflush(stdout);
            CHECK_CUDA(cudaEventDestroy(e0));
            CHECK_CUDA(cudaEventDestroy(e1));
            be->free(be, k_cache);
            be->free(be, v_cache);
            be->free(be, qkv);
            be->free(be, out);
            be->free(be, d_meta);
            be->free(be, d_tables);
            free(kv);
        }
    }
    be->destroy(be);
    return 0;
}

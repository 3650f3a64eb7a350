/* The CPU's paged attention: tasks over (sequence, KV head, tile of query rows), each an online
 * softmax over chunks of its keys (cpu_attention_paged.h has the layout); the chunk kernel is the
 * portable C below or AVX2's (cpu_attention_paged_avx2.c). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_attention_paged.h"
#include "backend/cpu/cpu_ops.h"
#include "util/error.h"

enum { LANES = CPU_ATTN_LANES, NARROW = CPU_ATTN_NARROW, KEYS = CPU_ATTN_KEYS };

/* cpu_attention_paged.h's 2^x in scalar float, the same steps as the AVX2 path's. */
static inline float exp2_portable(float x) {
    if (!(x >= CPU_ATTN_EXP2_LOWEST)) return x < CPU_ATTN_EXP2_LOWEST ? 0.0f : x; /* -inf and NaN */
    /* round to nearest even by the float adder (exact below 2^22; no fast-math folds it away) */
    const float n = (x + 12582912.0f) - 12582912.0f, f = x - n;
    const float p =
        1.0f +
        f * (CPU_ATTN_EXP2_C1 +
             f * (CPU_ATTN_EXP2_C2 +
                  f * (CPU_ATTN_EXP2_C3 + f * (CPU_ATTN_EXP2_C4 + f * (CPU_ATTN_EXP2_C5 + f * CPU_ATTN_EXP2_C6)))));
    uint32_t bits;
    memcpy(&bits, &p, sizeof bits);
    bits += (uint32_t)(int32_t)n << 23; /* p in [0.7, 1.5) and n >= -125: a normal float */
    float y;
    memcpy(&y, &bits, sizeof y);
    return y;
}

/* The chunk kernel (cpu_attention_chunk_fn) in plain C: loops over the lanes, which the compiler
 * vectorises for the baseline ISA. */
static void chunk_portable(int32_t lanes, const float *qt, const float *const *k, const float *const *v,
                           int32_t n_keys, int32_t D, const int32_t *pos, int32_t key0, float *p, float *m, float *l,
                           float *ot) {
    for (int32_t j = 0; j < n_keys; j++) {
        float *s = p + (size_t)j * lanes;
        for (int r = 0; r < lanes; r++) s[r] = 0.0f;
        for (int32_t d = 0; d < D; d++) {
            const float kd = k[j][d], *q = qt + (size_t)d * lanes;
            for (int r = 0; r < lanes; r++) s[r] += q[r] * kd;
        }
        if (pos)
            for (int r = 0; r < lanes; r++)
                if (key0 + j > pos[r]) s[r] = -INFINITY;
    }
    float m_new[LANES], alpha[LANES];
    for (int r = 0; r < lanes; r++) {
        float mx = m[r];
        for (int32_t j = 0; j < n_keys; j++) mx = p[(size_t)j * lanes + r] > mx ? p[(size_t)j * lanes + r] : mx;
        m_new[r] = mx;
        alpha[r] = exp2_portable(m[r] - mx); /* 0 at the first chunk (m = -inf) */
        m[r] = mx;
        l[r] *= alpha[r];
    }
    for (int32_t j = 0; j < n_keys; j++)
        for (int r = 0; r < lanes; r++) {
            const float w = exp2_portable(p[(size_t)j * lanes + r] - m_new[r]);
            p[(size_t)j * lanes + r] = w;
            l[r] += w;
        }
    for (int32_t d = 0; d < D; d++) {
        float *o = ot + (size_t)d * lanes;
        for (int r = 0; r < lanes; r++) o[r] *= alpha[r];
        for (int32_t j = 0; j < n_keys; j++) {
            const float vd = v[j][d], *w = p + (size_t)j * lanes;
            for (int r = 0; r < lanes; r++) o[r] += vd * w[r];
        }
    }
}

void cpu_attention_exp2_on(cpu_quant_isa isa, float *y, const float *x, int32_t n) {
#if defined(__x86_64__)
    if (isa != CPU_QUANT_PORTABLE) {
        cpu_attention_exp2_avx2(y, x, n);
        return;
    }
#endif
    for (int32_t i = 0; i < n; i++) y[i] = exp2_portable(x[i]);
}

/* A thread's scratch: the tile's queries and output, transposed, the chunk's weights and its key
 * and value rows. */
typedef struct tile_scratch {
    float *qt, *ot;   /* [D][LANES] */
    float *p;         /* [KEYS][LANES] */
    const float *k[KEYS], *v[KEYS];
} tile_scratch;

/* Task tile of sequence b's rows for KV head g: rows tile·LANES .. of n_new · group, row i being
 * new token i / group and query head g · group + i % group. A tile of up to NARROW rows (decode)
 * runs NARROW lanes: half the work of LANES. */
static void run_tile(cpu_attention_chunk_fn *chunk, tile_scratch *sc, float *out, const float *qkv,
                     const float *k_cache, const float *v_cache, const nopad_kv_batch *kv, int32_t b, int32_t g,
                     int32_t tile, int32_t n_heads, int32_t n_kv_heads, int32_t D, float q_scale) {
    const int32_t group = n_heads / n_kv_heads, bs = kv->block_size;
    const int32_t first = kv->cu_q[b], n_new = kv->cu_q[b + 1] - first, past = kv->seqlen_k[b] - n_new;
    const int32_t row0 = tile * LANES, rows = n_new * group - row0 < LANES ? n_new * group - row0 : LANES;
    const int32_t lanes = rows <= NARROW ? NARROW : LANES;
    const size_t qkv_row = (size_t)(n_heads + 2 * n_kv_heads) * D, kv_row = (size_t)n_kv_heads * D;
    const int32_t *blocks = kv->block_table + (size_t)b * kv->max_blocks;
    int32_t pos[LANES];
    float m[LANES], l[LANES];
    for (int32_t r = 0; r < lanes; r++) {
        /* lanes past the rows repeat the last row's position, on zero queries: finite, unused */
        const int32_t i = row0 + (r < rows ? r : rows - 1);
        pos[r] = past + i / group;
        m[r] = -INFINITY;
        l[r] = 0.0f;
        const float *q = qkv + (size_t)(first + i / group) * qkv_row + (size_t)(g * group + i % group) * D;
        for (int32_t d = 0; d < D; d++) sc->qt[(size_t)d * lanes + r] = r < rows ? q[d] * q_scale : 0.0f;
    }
    memset(sc->ot, 0, (size_t)D * lanes * sizeof(float));
    /* keys 0 .. the last row's position; masking only where a chunk passes the first row's */
    const int32_t n_keys = pos[rows - 1] + 1, unmasked = pos[0] + 1;
    for (int32_t key0 = 0; key0 < n_keys; key0 += KEYS) {
        const int32_t nk = n_keys - key0 < KEYS ? n_keys - key0 : KEYS;
        for (int32_t j = 0; j < nk; j++) {
            const int32_t key = key0 + j;
            const size_t slot = (size_t)blocks[key / bs] * bs + key % bs;
            sc->k[j] = k_cache + slot * kv_row + (size_t)g * D;
            sc->v[j] = v_cache + slot * kv_row + (size_t)g * D;
        }
        chunk(lanes, sc->qt, sc->k, sc->v, nk, D, key0 + nk > unmasked ? pos : NULL, key0, sc->p, m, l, sc->ot);
    }
    for (int32_t r = 0; r < rows; r++) {
        const int32_t i = row0 + r;
        float *o = out + (size_t)(first + i / group) * n_heads * D + (size_t)(g * group + i % group) * D;
        const float inv = 1.0f / l[r];
        for (int32_t d = 0; d < D; d++) o[d] = sc->ot[(size_t)d * lanes + r] * inv;
    }
}

nopad_status cpu_attention_paged_on(cpu_quant_isa isa, nopad_backend *be, void *out_, const void *qkv_,
                                    const void *k_cache_, const void *v_cache_, const nopad_kv_batch *kv,
                                    int32_t n_heads, int32_t n_kv_heads, int32_t head_size, float scale) {
    float *out = out_;                                    // [T, H·D]
    const float *qkv = qkv_;                              // [T, H + 2·KVH, D]
    const float *k_cache = k_cache_, *v_cache = v_cache_; // [slots, KVH, D]
    const int32_t group = n_heads / n_kv_heads, D = head_size, B = kv->n_seqs;
    cpu_attention_chunk_fn *chunk = chunk_portable;
#if defined(__x86_64__)
    if (isa != CPU_QUANT_PORTABLE) chunk = cpu_attention_chunk_avx2;
#endif
    /* tasks: sequence b's tiles × KV heads from task_start[b] */
    int64_t *task_start = malloc(((size_t)B + 1) * sizeof *task_start);
    if (!task_start) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cpu attention_paged: no task list");
    task_start[0] = 0;
    for (int32_t b = 0; b < B; b++) {
        const int64_t rows = (int64_t)(kv->cu_q[b + 1] - kv->cu_q[b]) * group;
        task_start[b + 1] = task_start[b] + (rows + LANES - 1) / LANES * n_kv_heads;
    }
    const int64_t n_tasks = task_start[B];
    const float q_scale = scale * 1.44269504088896341f; /* log2(e): scores in log2 units */
    int failed = 0;
#pragma omp parallel num_threads(cpu_threads_for(be, n_tasks))
    {
        tile_scratch sc;
        const size_t tile_bytes = ((size_t)D * LANES * sizeof(float) + 63) / 64 * 64;
        sc.qt = aligned_alloc(64, tile_bytes);
        sc.ot = aligned_alloc(64, tile_bytes);
        sc.p = aligned_alloc(64, (size_t)KEYS * LANES * sizeof(float));
        if (!sc.qt || !sc.ot || !sc.p) {
#pragma omp atomic write
            failed = 1;
        }
        /* a sequence's last tiles (the most keys) first, so the short ones fill in at the end */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n_tasks; task++) {
            if (!sc.qt || !sc.ot || !sc.p) continue;
            int32_t lo = 0, hi = B - 1; /* the sequence: the last b with task_start[b] <= task */
            while (lo < hi) {
                const int32_t mid = (lo + hi + 1) / 2;
                if (task_start[mid] <= task) lo = mid;
                else hi = mid - 1;
            }
            const int64_t local = task - task_start[lo];
            const int32_t n_tiles = (int32_t)((task_start[lo + 1] - task_start[lo]) / n_kv_heads);
            run_tile(chunk, &sc, out, qkv, k_cache, v_cache, kv, lo, (int32_t)(local % n_kv_heads),
                     n_tiles - 1 - (int32_t)(local / n_kv_heads), n_heads, n_kv_heads, D, q_scale);
        }
        free(sc.qt);
        free(sc.ot);
        free(sc.p);
    }
    free(task_start);
    if (failed) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cpu attention_paged: no scratch memory");
    return NOPAD_OK;
}

nopad_status cpu_attention_paged(nopad_backend *be, void *out, const void *qkv, const void *k_cache,
                                 const void *v_cache, const nopad_kv_batch *kv, int32_t n_heads, int32_t n_kv_heads,
                                 int32_t head_size, float scale) {
    return cpu_attention_paged_on(cpu_quant_best_isa(), be, out, qkv, k_cache, v_cache, kv, n_heads, n_kv_heads,
                                  head_size, scale);
}

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
    float base[LANES], alpha[LANES];
    for (int r = 0; r < lanes; r++) {
        float mx = m[r];
        for (int32_t j = 0; j < n_keys; j++) mx = p[(size_t)j * lanes + r] > mx ? p[(size_t)j * lanes + r] : mx;
        /* the weights' base: the max, or 0 for a row with every key so far masked (-inf: its
         * weights 2^-inf are 0, not 2^(-inf + inf)) */
        base[r] = mx == -INFINITY ? 0.0f : mx;
        alpha[r] = exp2_portable(m[r] - base[r]); /* 0 at the row's first unmasked chunk (m = -inf) */
        m[r] = mx;
        l[r] *= alpha[r];
    }
    for (int32_t j = 0; j < n_keys; j++)
        for (int r = 0; r < lanes; r++) {
            const float w = exp2_portable(p[(size_t)j * lanes + r] - base[r]);
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

/* Tile `tile` of sequence b's rows for KV head g: rows tile·LANES .. of n_new · group, row i being
 * new token i / group and query head g · group + i % group. A tile of up to NARROW rows (decode)
 * runs NARROW lanes: half the work of LANES. */
typedef struct tile_shape {
    int32_t first, past, row0, rows, lanes, n_keys; /* n_keys: the keys its last row reads */
} tile_shape;

static tile_shape shape_of(const nopad_kv_batch *kv, int32_t b, int32_t tile, int32_t group) {
    tile_shape t;
    const int32_t n_new = kv->cu_q[b + 1] - kv->cu_q[b];
    t.first = kv->cu_q[b];
    t.past = kv->seqlen_k[b] - n_new;
    t.row0 = tile * LANES;
    t.rows = n_new * group - t.row0 < LANES ? n_new * group - t.row0 : LANES;
    t.lanes = t.rows <= NARROW ? NARROW : LANES;
    t.n_keys = t.past + (t.row0 + t.rows - 1) / group + 1;
    return t;
}

/* A task: one segment of a tile's keys for one KV head. A tile whose keys span several segments
 * leaves each segment's running max, sum and output in a partial slot ([2 + D][lanes]: m, l, ot)
 * for merge_tile; one of a single segment writes its rows. */
typedef struct attn_task {
    int32_t b, g, tile, segment, n_segments;
    int64_t partial; /* the segment's slot (merge_tile's: segment 0's), -1: the tile is one segment */
} attn_task;

enum { SEGMENT = CPU_ATTN_SEGMENT };

static void run_tile(cpu_attention_chunk_fn *chunk, tile_scratch *sc, float *out, float *partial,
                     const float *qkv, const float *k_cache, const float *v_cache, const nopad_kv_batch *kv,
                     const attn_task *task, int32_t n_heads, int32_t n_kv_heads, int32_t D, float q_scale) {
    const int32_t group = n_heads / n_kv_heads, bs = kv->block_size, g = task->g;
    const tile_shape t = shape_of(kv, task->b, task->tile, group);
    const int32_t lanes = t.lanes;
    const size_t qkv_row = (size_t)(n_heads + 2 * n_kv_heads) * D, kv_row = (size_t)n_kv_heads * D;
    const int32_t *blocks = kv->block_table + (size_t)task->b * kv->max_blocks;
    int32_t pos[LANES];
    float m[LANES], l[LANES];
    for (int32_t r = 0; r < lanes; r++) {
        /* lanes past the rows repeat the last row's position, on zero queries: finite, unused */
        const int32_t i = t.row0 + (r < t.rows ? r : t.rows - 1);
        pos[r] = t.past + i / group;
        m[r] = -INFINITY;
        l[r] = 0.0f;
        const float *q = qkv + (size_t)(t.first + i / group) * qkv_row + (size_t)(g * group + i % group) * D;
        for (int32_t d = 0; d < D; d++) sc->qt[(size_t)d * lanes + r] = r < t.rows ? q[d] * q_scale : 0.0f;
    }
    memset(sc->ot, 0, (size_t)D * lanes * sizeof(float));
    /* the segment's keys, up to the last row's position; masking only where a chunk passes the
     * first row's (a row can find its whole segment masked: its max stays -inf, its sums 0) */
    const int32_t key_begin = task->segment * SEGMENT, unmasked = pos[0] + 1;
    const int32_t key_end = t.n_keys - key_begin < SEGMENT ? t.n_keys : key_begin + SEGMENT;
    for (int32_t key0 = key_begin; key0 < key_end; key0 += KEYS) {
        const int32_t nk = key_end - key0 < KEYS ? key_end - key0 : KEYS;
        for (int32_t j = 0; j < nk; j++) {
            const int32_t key = key0 + j;
            const size_t slot = (size_t)blocks[key / bs] * bs + key % bs;
            sc->k[j] = k_cache + slot * kv_row + (size_t)g * D;
            sc->v[j] = v_cache + slot * kv_row + (size_t)g * D;
        }
        chunk(lanes, sc->qt, sc->k, sc->v, nk, D, key0 + nk > unmasked ? pos : NULL, key0, sc->p, m, l, sc->ot);
    }
    if (partial) {
        memcpy(partial, m, (size_t)lanes * sizeof(float));
        memcpy(partial + lanes, l, (size_t)lanes * sizeof(float));
        memcpy(partial + 2 * lanes, sc->ot, (size_t)D * lanes * sizeof(float));
        return;
    }
    for (int32_t r = 0; r < t.rows; r++) {
        const int32_t i = t.row0 + r;
        float *o = out + (size_t)(t.first + i / group) * n_heads * D + (size_t)(g * group + i % group) * D;
        const float inv = 1.0f / l[r];
        for (int32_t d = 0; d < D; d++) o[d] = sc->ot[(size_t)d * lanes + r] * inv;
    }
}

/* A split tile's rows from its segments' partial slots (task->n_segments of them from `slots`,
 * slot_floats apart), in segment order: each segment's sums weighed by 2^(its max − the rows'
 * max), lane-wise into acc [D][lanes]. Segment 0 holds key 0, which every row reads, so the rows'
 * max is finite and a segment that masks a row whole weighs 0 for it. */
static void merge_tile(float *out, float *acc, const float *slots, size_t slot_floats, const nopad_kv_batch *kv,
                       const attn_task *task, int32_t n_heads, int32_t n_kv_heads, int32_t D) {
    const int32_t group = n_heads / n_kv_heads, g = task->g;
    const tile_shape t = shape_of(kv, task->b, task->tile, group);
    const int32_t lanes = t.lanes;
    float max[LANES], sum[LANES], w[LANES];
    for (int32_t r = 0; r < lanes; r++) max[r] = -INFINITY, sum[r] = 0.0f;
    for (int32_t s = 0; s < task->n_segments; s++)
        for (int32_t r = 0; r < lanes; r++) max[r] = fmaxf(max[r], slots[s * slot_floats + r]);
    memset(acc, 0, (size_t)D * lanes * sizeof(float));
    for (int32_t s = 0; s < task->n_segments; s++) {
        const float *m = slots + s * slot_floats, *l = m + lanes, *ot = m + 2 * lanes;
        for (int32_t r = 0; r < lanes; r++) {
            w[r] = exp2_portable(m[r] - max[r]);
            sum[r] += w[r] * l[r];
        }
        for (int32_t d = 0; d < D; d++)
            for (int32_t r = 0; r < lanes; r++) acc[(size_t)d * lanes + r] += w[r] * ot[(size_t)d * lanes + r];
    }
    for (int32_t r = 0; r < t.rows; r++) {
        const int32_t i = t.row0 + r;
        float *o = out + (size_t)(t.first + i / group) * n_heads * D + (size_t)(g * group + i % group) * D;
        const float inv = 1.0f / sum[r];
        for (int32_t d = 0; d < D; d++) o[d] = acc[(size_t)d * lanes + r] * inv;
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
    /* The tasks, each sequence's last tiles (the most keys) first so the short ones fill in at the
     * end; after them one entry per split tile, for the merges once every task ran. */
    int64_t n_tasks = 0, n_split = 0, n_partials = 0;
    for (int32_t b = 0; b < B; b++) {
        const int32_t n_tiles = ((kv->cu_q[b + 1] - kv->cu_q[b]) * group + LANES - 1) / LANES;
        for (int32_t tile = 0; tile < n_tiles; tile++) {
            const int32_t n_seg = (shape_of(kv, b, tile, group).n_keys + SEGMENT - 1) / SEGMENT;
            n_tasks += (int64_t)n_seg * n_kv_heads;
            if (n_seg > 1) n_split += n_kv_heads, n_partials += (int64_t)n_seg * n_kv_heads;
        }
    }
    attn_task *tasks = malloc(((size_t)n_tasks + (size_t)n_split + 1) * sizeof *tasks);
    float *partials = n_partials ? malloc((size_t)n_partials * (2 + D) * LANES * sizeof(float)) : NULL;
    if (!tasks || (n_partials && !partials)) {
        free(tasks);
        free(partials);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cpu attention_paged: no task list for %lld tasks",
                               (long long)n_tasks);
    }
    attn_task *split = tasks + n_tasks; /* [n_split]: partial is the tile's segment 0's slot */
    int64_t next = 0, next_split = 0, next_partial = 0;
    for (int32_t b = 0; b < B; b++) {
        const int32_t n_tiles = ((kv->cu_q[b + 1] - kv->cu_q[b]) * group + LANES - 1) / LANES;
        for (int32_t tile = n_tiles - 1; tile >= 0; tile--) {
            const int32_t n_seg = (shape_of(kv, b, tile, group).n_keys + SEGMENT - 1) / SEGMENT;
            for (int32_t g = 0; g < n_kv_heads; g++) {
                for (int32_t seg = 0; seg < n_seg; seg++)
                    tasks[next++] = (attn_task){.b = b, .g = g, .tile = tile, .segment = seg, .n_segments = n_seg,
                                                .partial = n_seg > 1 ? next_partial + seg : -1};
                if (n_seg > 1) {
                    split[next_split++] = (attn_task){.b = b, .g = g, .tile = tile, .segment = 0,
                                                      .n_segments = n_seg, .partial = next_partial};
                    next_partial += n_seg;
                }
            }
        }
    }
    const size_t slot_floats = (size_t)(2 + D) * LANES; /* a slot's room: the widest tile's */
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
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n_tasks; i++) {
            if (!sc.qt || !sc.ot || !sc.p) continue;
            const attn_task *task = &tasks[i];
            run_tile(chunk, &sc, out, task->partial >= 0 ? partials + (size_t)task->partial * slot_floats : NULL,
                     qkv, k_cache, v_cache, kv, task, n_heads, n_kv_heads, D, q_scale);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n_split; i++)
            if (!failed)
                merge_tile(out, sc.ot, partials + (size_t)split[i].partial * slot_floats, slot_floats, kv, &split[i],
                           n_heads, n_kv_heads, D);
        free(sc.qt);
        free(sc.ot);
        free(sc.p);
    }
    free(tasks);
    free(partials);
    if (failed) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cpu attention_paged: no scratch memory");
    return NOPAD_OK;
}

nopad_status cpu_attention_paged(nopad_backend *be, void *out, const void *qkv, const void *k_cache,
                                 const void *v_cache, const nopad_kv_batch *kv, int32_t n_heads, int32_t n_kv_heads,
                                 int32_t head_size, float scale) {
    return cpu_attention_paged_on(cpu_quant_best_isa(), be, out, qkv, k_cache, v_cache, kv, n_heads, n_kv_heads,
                                  head_size, scale);
}

/* CUDA: the decoder ops (fp16 / bf16 storage, fp32 arithmetic), each tested against the CPU op:
 * token embedding, LayerNorm / RMSNorm into a new buffer (after a residual add, or alone), rotary
 * embeddings fused with the paged KV store, causal attention over paged keys and values (below),
 * SwiGLU and the row gather. */
#include "backend/cuda/common.cuh"
#include "backend/cuda/decoder_ops.h"

#include <type_traits>

#include "backend/cuda/attention/attention.h"
#include "backend/cuda/attention/common.cuh"

template <typename T>
__global__ void embed_tokens_kernel(float *out, const int32_t *tokens, const int32_t *feed,
                                    const int32_t *positions, int vocab, int vocab0, int vocab_rows,
                                    int n_positions, const T *word, const T *pos, int dim) {
    const int t = blockIdx.x;
    int id = tokens[t];
    if (id < 0 && feed) id = feed[-1 - id]; /* the step before's id, sampled after this was packed */
    const int p = positions ? positions[t] : 0;
    const bool bad = id < 0 || id >= vocab || (pos && (p < 0 || p >= n_positions));
    const bool held = id >= vocab0 && id - vocab0 < vocab_rows; /* else another rank's id: 0 */
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = bad ? NAN : held ? to_f32(word[(size_t)(id - vocab0) * dim + i]) : 0.0f;
        if (!bad && pos) v += to_f32(pos[(size_t)p * dim + i]);
        out[(size_t)t * dim + i] = v;
    }
}

/* out = norm(h) per row; with x, first h += x (the sub-layer's output joins the residual stream). */
template <typename T>
__global__ void norm_kernel(T *out, float *h, const T *x, const T *w, const T *b, float eps, int dim,
                            int rms) {
    __shared__ float red[2][32];
    allow_dependent_launch(); /* the next GEMM may start streaming its weights */
    wait_for_upstream_grid();
    float *row = h + (size_t)blockIdx.x * dim;
    const T *xr = x ? x + (size_t)blockIdx.x * dim : NULL;
    float s = 0.0f, ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = row[i];
        if (xr) {
            v += to_f32(xr[i]);
            row[i] = v; /* read back below by this same thread only */
        }
        s += v;
        ss += v * v;
    }
    s = warp_sum(s);
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) {
        red[0][threadIdx.x / 32] = s;
        red[1][threadIdx.x / 32] = ss;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        const int nw = blockDim.x / 32;
        float a = threadIdx.x < nw ? red[0][threadIdx.x] : 0.0f;
        float c = threadIdx.x < nw ? red[1][threadIdx.x] : 0.0f;
        a = warp_sum(a);
        c = warp_sum(c);
        if (threadIdx.x == 0) {
            red[0][0] = a;
            red[1][0] = c;
        }
    }
    __syncthreads();
    const float mean = red[0][0] / dim;
    const float inv = rms ? rsqrtf(red[1][0] / dim + eps)
                          : rsqrtf(fmaxf(red[1][0] / dim - mean * mean, 0.0f) + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = row[i];
        float y = rms ? v * inv * to_f32(w[i]) : (v - mean) * inv * to_f32(w[i]);
        if (!rms && b) y += to_f32(b[i]);
        out[(size_t)blockIdx.x * dim + i] = from_f32<T>(y);
    }
}

/* norm_kernel for rows of dim % 4 == 0 and dim <= 1024·ITERS (every model's hidden size up to
 * 8192): a thread holds its ITERS groups of 4 elements in registers, so that each row is read
 * from L2 once, all loads in flight together, and written once. The generic kernel's loops read,
 * add and store element by element, and since a store might alias the next load, each of a
 * thread's dim / 256 elements cost a round trip to L2: ~6 µs a norm of one 2048-wide row on an
 * H200, against the ~2 µs of one round trip (the decode step at batch 1 spends 33 norms a step). */
template <typename T, int ITERS>
__global__ void __launch_bounds__(256) norm_rows_kernel(T *__restrict__ out, float *__restrict__ h,
                                                        const T *__restrict__ x, const T *__restrict__ w,
                                                        const T *__restrict__ b, float eps, int dim, int rms) {
    __shared__ float red[2][8];
    allow_dependent_launch(); /* the next GEMM may start streaming its weights */
    float wv[ITERS][4], bv[ITERS][4]; /* the norm's weights do not depend on the kernel ahead */
#pragma unroll
    for (int it = 0; it < ITERS; it++) {
        const int e = (it * 256 + threadIdx.x) * 4;
#pragma unroll
        for (int j = 0; j < 4; j++) wv[it][j] = bv[it][j] = 0.0f;
        if (e < dim) {
            load_vec<T, 4>(wv[it], w + e);
            if (!rms && b) load_vec<T, 4>(bv[it], b + e);
        }
    }
    wait_for_upstream_grid();
    float *row = h + (size_t)blockIdx.x * dim;
    const T *xr = x ? x + (size_t)blockIdx.x * dim : nullptr;
    float v[ITERS][4];
#pragma unroll
    for (int it = 0; it < ITERS; it++) {
        const int e = (it * 256 + threadIdx.x) * 4;
        float xv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const float4 hv = e < dim ? *reinterpret_cast<const float4 *>(row + e) : make_float4(0, 0, 0, 0);
        if (xr && e < dim) load_vec<T, 4>(xv, xr + e);
        v[it][0] = hv.x + xv[0], v[it][1] = hv.y + xv[1], v[it][2] = hv.z + xv[2], v[it][3] = hv.w + xv[3];
    }
    float s = 0.0f, ss = 0.0f;
#pragma unroll
    for (int it = 0; it < ITERS; it++)
#pragma unroll
        for (int j = 0; j < 4; j++) s += v[it][j], ss += v[it][j] * v[it][j];
    s = warp_sum(s);
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) red[0][threadIdx.x / 32] = s, red[1][threadIdx.x / 32] = ss;
    __syncthreads();
    s = ss = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) s += red[0][i], ss += red[1][i]; /* warp order: the same sum every run */
    const float mean = s / dim;
    const float inv = rms ? rsqrtf(ss / dim + eps) : rsqrtf(fmaxf(ss / dim - mean * mean, 0.0f) + eps);
#pragma unroll
    for (int it = 0; it < ITERS; it++) {
        const int e = (it * 256 + threadIdx.x) * 4;
        if (e >= dim) continue;
        if (xr) *reinterpret_cast<float4 *>(row + e) = make_float4(v[it][0], v[it][1], v[it][2], v[it][3]);
        float y[4];
#pragma unroll
        for (int j = 0; j < 4; j++) y[j] = (rms ? v[it][j] : v[it][j] - mean) * inv * wv[it][j] + bv[it][j];
        store_vec<T, 4>(out + (size_t)blockIdx.x * dim + e, y);
    }
}

/* Per token (a CTA each): rotary embeddings on the Q and K heads of its qkv row (when inv_freq),
 * the rotated K written both in place and into the cache slot, V copied into the cache. A thread
 * takes VEC consecutive pairs (i, i + half) of one head, and the CTA is wide enough that each
 * thread has about one group: a second group's loads would wait for the first one's stores (they
 * might alias), one more round trip to L2 each. V is read before any store to the row. */
template <typename T, int VEC>
__global__ void rope_kv_store_kernel(T *qkv, T *k_cache, T *v_cache, const int32_t *positions,
                                     const int32_t *slots, int n_heads, int n_kv_heads,
                                     int head_size, const float *inv_freq) {
    const int t = blockIdx.x, half = head_size / 2;
    const int kv = n_kv_heads * head_size;
    allow_dependent_launch();
    wait_for_upstream_grid();
    T *row = qkv + (size_t)t * (n_heads + 2 * n_kv_heads) * head_size;
    T *k_dst = k_cache + (size_t)slots[t] * kv, *v_dst = v_cache + (size_t)slots[t] * kv;
    const T *v = row + (size_t)(n_heads + n_kv_heads) * head_size;
    for (int i = threadIdx.x * VEC; i < kv; i += blockDim.x * VEC) {
        float vv[VEC];
        load_vec<T, VEC>(vv, v + i);
        store_vec<T, VEC>(v_dst + i, vv);
    }
    if (inv_freq) {
        const float p = (float)positions[t];
        const int per_head = half / VEC;
        for (int k = threadIdx.x; k < (n_heads + n_kv_heads) * per_head; k += blockDim.x) {
            const int h = k / per_head, i0 = (k % per_head) * VEC;
            T *x = row + (size_t)h * head_size;
            float a[VEC], b[VEC], ra[VEC], rb[VEC];
            load_vec<T, VEC>(a, x + i0);
            load_vec<T, VEC>(b, x + i0 + half);
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                float sn, cs;
                sincosf(p * inv_freq[i0 + j], &sn, &cs);
                ra[j] = a[j] * cs - b[j] * sn;
                rb[j] = b[j] * cs + a[j] * sn;
            }
            store_vec<T, VEC>(x + i0, ra);
            store_vec<T, VEC>(x + i0 + half, rb);
            if (h >= n_heads) {
                T *kk = k_dst + (size_t)(h - n_heads) * head_size;
                store_vec<T, VEC>(kk + i0, ra);
                store_vec<T, VEC>(kk + i0 + half, rb);
            }
        }
    } else {
        const T *k = row + (size_t)n_heads * head_size;
        for (int i = threadIdx.x * VEC; i < kv; i += blockDim.x * VEC) {
            float kv4[VEC];
            load_vec<T, VEC>(kv4, k + i);
            store_vec<T, VEC>(k_dst + i, kv4);
        }
    }
}

/* ---- causal attention over the paged cache ---------------------------------------------------
 *
 * One CTA takes up to 16 query vectors that read the same KV head: R consecutive new tokens of one
 * sequence (1 for a decode step) times the Gc query heads of that KV head it serves (grouped-query
 * attention: every key and value row comes from memory once for all of them). The 16 vectors are
 * one m16 tile of mma.sync, FlashAttention-2 style (mma.cu): S = Q·Kᵀ and O += P·V on tensor
 * cores, the online softmax in fp32 registers. Its four warps split the CTA's keys: each walks
 * every fourth 16-key tile, gathered from the paged cache through the block table with cp.async
 * into its own two or three buffers (no CTA-wide barrier in the loop), and keeps its own (max,
 * sum, O); the four are merged through shared memory at the end. When few CTAs would face long histories
 * (decode at small batch), blockIdx.z also splits the keys across CTAs (flash-decoding): each
 * split writes (max, sum, unnormalised O) to the workspace and attention_combine_kernel merges
 * them. A split's keys are a share of its own sequence's keys, not of the step's longest: a recorded
 * decode step sizes for a history up to twice the real one (a power-of-two block-table width),
 * and fixed shares of that would leave half the splits empty and the other half twice as long.
 *
 * ROPE_STORE (decode steps: one new token per sequence) folds rope_kv_store in: each CTA turns its
 * query vectors in shared memory; the split that holds the new token's position loads that
 * token's K and V rows with Q, turns K in shared memory, writes both into the cache and copies
 * them into the tile buffer that holds the position, so no warp gathers them back from the cache
 * and every tile of earlier keys can be requested before the wait. One launch a layer fewer, and
 * qkv is left as it came. */
enum { PA_WARPS = 4, PA_THREADS = 32 * PA_WARPS, PA_KEYS = 16, PA_QV = 16 };
/* A warp's K/V tile buffers: two, or three (two tiles in flight while it computes on one) where the
 * grid is small enough that each CTA's own depth sets the bandwidth: at most 2.5 CTAs a SM, up to
 * head size 96 (128 would take 108 KB a CTA). H100, a LLaMA-1B decode step, against two buffers:
 * 8 x 2048 (2.2 CTAs a SM) 0.96-1.01 -> 0.93-0.98 ms, the SmolLM2 shape 16 x 256 (1.5) 0.79 ->
 * 0.72-0.74; but 32 x 2048 (2.9) 1.59-1.60 -> 1.64-1.67 and 64 x 2048 (3.9) 2.06 -> 2.28. */
static bool pa_three_stages(long ctas, int head_size) { return head_size <= 96 && 2 * ctas <= 5L * cuda_sm_count(); }

struct paged_args {
    void *out;               /* [T, n_heads·D] */
    float *ws;               /* [T, n_heads, splits, D + 2] when splits > 1 */
    const uint16_t *qkv, *k_cache, *v_cache;
    uint16_t *k_store, *v_store; /* ROPE_STORE: the caches again, written */
    const float *inv_freq;       /* ROPE_STORE: [D/2] rotary frequencies; NULL: no rotation (GPT-2) */
    const int32_t *cu_q, *seqlen_k, *block_table;
    int n_seqs, max_blocks, block_size, n_heads, n_kv_heads;
    int rows;                /* R: query rows per CTA */
    int heads_per_cta;       /* Gc: query heads of one KV head per CTA (blockIdx.y: KV head x chunk) */
    float scale_log2;        /* scale · log2(e) */
};

template <int D, bool BF16, bool ROPE_STORE, int STAGES>
__global__ void __launch_bounds__(PA_THREADS) paged_attention_kernel(paged_args a) {
    using E = typename std::conditional<BF16, __nv_bfloat16, __half>::type;
    constexpr int LDS = D + 8, DT = D / 8, KQ = D / 16, CH = D / 8, HALF = D / 2;
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *sQ = smem;                                   /* [16][LDS] */
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    uint16_t *sK = sQ + PA_QV * LDS + warp * 2 * STAGES * PA_KEYS * LDS; /* this warp's [STAGES][16][LDS] */
    uint16_t *sV = sK + STAGES * PA_KEYS * LDS;                          /* [STAGES][16][LDS] */
    /* ROPE_STORE: the new token's K row (turned here) and V row, after every warp's buffers */
    uint16_t *sNewK = sQ + PA_QV * LDS + PA_WARPS * 2 * STAGES * PA_KEYS * LDS, *sNewV = sNewK + LDS;

    const int t0 = blockIdx.x, split = blockIdx.z, n_splits = gridDim.z;
    const int G = a.n_heads / a.n_kv_heads, Gc = a.heads_per_cta;
    allow_dependent_launch();
    /* Before griddepcontrol.wait: only what the kernels ahead in this step do not write — the
     * step's index arrays (uploaded before it) and the keys and values of earlier steps. */
    const int chunks = (G + Gc - 1) / Gc;
    const int kvh = blockIdx.y / chunks, g0 = (blockIdx.y % chunks) * Gc, gc = min(Gc, G - g0);
    /* a decode step (ROPE_STORE) holds one token a sequence, so token t0 is sequence t0: no search
     * through cu_q, whose dependent loads are on the critical path where the kernel ahead
     * (cuBLASLt's, from 25 tokens) does not launch it early */
    const int b = ROPE_STORE ? t0 : sequence_of(a.cu_q, a.n_seqs, t0);
    const int q0 = ROPE_STORE ? t0 : a.cu_q[b], n_new = ROPE_STORE ? 1 : a.cu_q[b + 1] - q0;
    if ((t0 - q0) % a.rows != 0) return; /* not the first row of a group: another CTA's */
    const int n_rows = min(a.rows, q0 + n_new - t0);
    const int history = a.seqlen_k[b] - n_new;         /* keys stored before this step */
    const int pos0 = history + (t0 - q0);              /* the first row's position */
    /* this split's share of the keys the group's last row sees, in whole tiles */
    const int n_keys = pos0 + n_rows;
    const int keys_per_split = ((n_keys + PA_KEYS - 1) / PA_KEYS + n_splits - 1) / n_splits * PA_KEYS;
    const int key_begin = split * keys_per_split;
    const int key_end = min(key_begin + keys_per_split, n_keys);
    const size_t row_stride = (size_t)(a.n_heads + 2 * a.n_kv_heads) * D;
    /* query vector qi = r·Gc + g: row t0 + r, head kvh·G + g0 + g */
    auto vector_ok = [&](int qi) { return qi / Gc < n_rows && qi % Gc < gc; };
    auto row_of = [&](int qi) { return t0 + qi / Gc; };
    auto head_of = [&](int qi) { return kvh * G + g0 + qi % Gc; };

    if (key_begin >= key_end) { /* this split lies past every row's keys: an empty partial */
        wait_for_upstream_grid(); /* the workspace may still be read by the previous merge */
        if (tid < PA_QV && vector_ok(tid)) {
            float *part = a.ws + (((size_t)row_of(tid) * a.n_heads + head_of(tid)) * n_splits + split) * (D + 2);
            part[0] = -INFINITY;
            part[1] = 0.0f;
        }
        return;
    }
    const int32_t *blocks = a.block_table + (size_t)b * a.max_blocks;
    const int bs = a.block_size;
    /* ROPE_STORE: the split whose keys hold the group's one new token, at pos0 */
    const bool holds_new = ROPE_STORE && pos0 >= key_begin && pos0 < key_end;
    auto load_tile = [&](int key0, int buf) { /* this warp's 16 keys from key0, K and V */
        for (int i = lane; i < PA_KEYS * CH; i += 32) {
            const int k = i / CH, c = i % CH, j = key0 + k;
            if (holds_new && j == pos0) continue; /* not in the cache yet: fill_new_row's */
            const bool ok = j < key_end;
            const size_t slot = ok ? (size_t)blocks[j / bs] * bs + j % bs : 0;
            const size_t off = (slot * a.n_kv_heads + kvh) * D + c * 8;
            cp_async16(sK + (buf * PA_KEYS + k) * LDS + c * 8, a.k_cache + off, ok);
            cp_async16(sV + (buf * PA_KEYS + k) * LDS + c * 8, a.v_cache + off, ok);
        }
    };
    /* the new token's rows into a tile buffer, from shared memory (after they are turned) */
    auto fill_new_row = [&](int key0, int buf) {
        if (!holds_new || pos0 < key0 || pos0 >= key0 + PA_KEYS) return;
        const int k = pos0 - key0;
        for (int c = lane; c < CH; c += 32) {
            *reinterpret_cast<uint4 *>(sK + (buf * PA_KEYS + k) * LDS + c * 8) = *reinterpret_cast<const uint4 *>(sNewK + c * 8);
            *reinterpret_cast<uint4 *>(sV + (buf * PA_KEYS + k) * LDS + c * 8) = *reinterpret_cast<const uint4 *>(sNewV + c * 8);
        }
    };
    const int n_tiles = (key_end - key_begin + PA_KEYS - 1) / PA_KEYS;
    /* the warp's i-th tile (its tiles are every PA_WARPS-th of the split's) and whether it holds
     * only earlier steps' keys (a decode step's every tile but the last; with ROPE_STORE every
     * tile, the new token's row apart) */
    auto tile_exists = [&](int i) { return warp + i * PA_WARPS < n_tiles; };
    auto tile_key = [&](int i) { return key_begin + (warp + i * PA_WARPS) * PA_KEYS; };
    auto tile_early = [&](int i) { return ROPE_STORE || tile_key(i) + PA_KEYS <= history; };
    /* The warp's first EARLY tiles come with Q, in one commit group: before the wait where they
     * hold only earlier steps' keys, so their gathers overlap the kernels ahead. Small grids (three
     * buffers) fill every buffer so; large ones (two) only the first, and request the second after
     * Q, so that the first tile's work need not wait for it: H100, all up front made the SmolLM2
     * shape's attention at 64 x 256 (384 CTAs) 346 -> 385 µs a step, and sped up 1-16 sequences. */
    constexpr int EARLY = STAGES == 3 ? STAGES : 1;
#pragma unroll
    for (int i = 0; i < EARLY; i++)
        if (tile_exists(i) && tile_early(i)) load_tile(tile_key(i), i);
    wait_for_upstream_grid();
#pragma unroll
    for (int i = 0; i < EARLY; i++)
        if (tile_exists(i) && !tile_early(i)) load_tile(tile_key(i), i);
    if (holds_new) { /* the new token's K and V rows with Q, in one round trip */
        const uint16_t *k_src = a.qkv + (size_t)t0 * row_stride + (size_t)(a.n_heads + kvh) * D;
        for (int i = tid; i < 2 * CH; i += PA_THREADS) {
            const int v = i / CH, c = i % CH;
            cp_async16((v ? sNewV : sNewK) + c * 8, k_src + (size_t)v * a.n_kv_heads * D + c * 8, true);
        }
    }
    for (int i = tid; i < PA_QV * CH; i += PA_THREADS) {
        const int qi = i / CH, c = i % CH;
        const bool ok = vector_ok(qi);
        const uint16_t *src = ok ? a.qkv + (size_t)(t0 + qi / Gc) * row_stride +
                                       (size_t)(kvh * G + g0 + qi % Gc) * D + c * 8
                                 : a.qkv;
        cp_async16(sQ + qi * LDS + c * 8, src, ok);
    }
    cp_async_commit();
#pragma unroll
    for (int i = EARLY; i < STAGES; i++) { /* the rest of the first STAGES tiles, a group each */
        if (tile_exists(i)) load_tile(tile_key(i), i);
        cp_async_commit();
    }
    cp_async_wait_group<STAGES - EARLY>(); /* Q and the first EARLY tiles */
    __syncthreads(); /* Q visible to every warp */
    if constexpr (ROPE_STORE) {
        if (a.inv_freq) { /* the query vectors turned in place, as rope_kv_store_kernel turns them */
            E *q = reinterpret_cast<E *>(sQ);
            for (int i = tid; i < PA_QV * HALF; i += PA_THREADS) {
                const int qi = i / HALF, j = i % HALF;
                if (!vector_ok(qi)) continue;
                float sn, cs;
                sincosf((float)(pos0 + qi / Gc) * a.inv_freq[j], &sn, &cs);
                const float x = to_f32(q[qi * LDS + j]), y = to_f32(q[qi * LDS + j + HALF]);
                q[qi * LDS + j] = from_f32<E>(x * cs - y * sn);
                q[qi * LDS + j + HALF] = from_f32<E>(y * cs + x * sn);
            }
            if (holds_new) { /* the new K row, with rope_kv_store_kernel's arithmetic: the same rounded K */
                E *k = reinterpret_cast<E *>(sNewK);
                for (int i = tid; i < HALF; i += PA_THREADS) {
                    float sn, cs;
                    sincosf((float)pos0 * a.inv_freq[i], &sn, &cs);
                    const float x = to_f32(k[i]), y = to_f32(k[i + HALF]);
                    k[i] = from_f32<E>(x * cs - y * sn);
                    k[i + HALF] = from_f32<E>(y * cs + x * sn);
                }
            }
            __syncthreads();
        }
        if (holds_new) {
            /* into the cache (every head chunk of the split writes the same values; nothing in
             * this kernel reads them back) and into the tile buffer that holds pos0 if it is one
             * of this warp's first STAGES tiles, requested above; later tiles fill it as they are
             * loaded */
            const size_t slot = (size_t)blocks[pos0 / bs] * bs + pos0 % bs;
            for (int i = tid; i < 2 * CH; i += PA_THREADS) {
                const int v = i / CH, c = i % CH;
                uint16_t *dst = (v ? a.v_store : a.k_store) + (slot * a.n_kv_heads + kvh) * D + c * 8;
                *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>((v ? sNewV : sNewK) + c * 8);
            }
#pragma unroll
            for (int i = 0; i < STAGES; i++)
                if (tile_exists(i)) fill_new_row(tile_key(i), i);
        }
    }
    uint32_t qf[KQ][4];
#pragma unroll
    for (int kk = 0; kk < KQ; kk++) ldmatrix_x4(qf[kk], sQ + (lane & 15) * LDS + kk * 16 + (lane >> 4) * 8);

    float o[DT][4];
#pragma unroll
    for (int t = 0; t < DT; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    /* this thread's two rows of S: query vectors lane/4 and lane/4 + 8 */
    int row_pos[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int qi = lane / 4 + r * 8;
        row_pos[r] = vector_ok(qi) ? pos0 + qi / Gc : -1; /* -1: a padding row, every key masked */
    }
    /* the warp's tiles stream through its STAGES buffers: the first STAGES came with Q; once tile
     * it is computed on, tile it + STAGES is requested into its buffer (one commit group a tile,
     * empty past the last, so the counts stay even) */
    for (int it = 0, j = warp; j < n_tiles; it++, j += PA_WARPS) {
        const int buf = it % STAGES;
        cp_async_wait_group<STAGES - 1>(); /* tile it has landed: the later groups hold the next STAGES - 1 */
        __syncwarp();
        const uint16_t *k_s = sK + buf * PA_KEYS * LDS, *v_s = sV + buf * PA_KEYS * LDS;
        float s[2][4];
#pragma unroll
        for (int t = 0; t < 2; t++) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KQ; kk++) {
            uint32_t bf[4];
            ldmatrix_x4(bf, k_s + ((lane & 7) + (lane >> 4) * 8) * LDS + kk * 16 + ((lane >> 3) & 1) * 8);
            mma16816<BF16>(s[0], qf[kk], bf[0], bf[1]);
            mma16816<BF16>(s[1], qf[kk], bf[2], bf[3]);
        }
        const int key0 = key_begin + j * PA_KEYS;
#pragma unroll
        for (int t = 0; t < 2; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = key0 + t * 8 + (lane & 3) * 2 + (e & 1);
                if (key >= key_end || key > row_pos[e >> 1]) s[t][e] = -INFINITY;
            }
        online_softmax_tile<2, DT>(s, o, m_run, l_run, a.scale_log2); /* attention/common.cuh */
        mma_pv_step<BF16, D>(o, s[0], s[1], v_s, LDS, lane);
        __syncwarp(); /* every lane is done with this buffer before the next tile's copy into it */
        const int next = j + STAGES * PA_WARPS;
        if (next < n_tiles) {
            load_tile(key_begin + next * PA_KEYS, buf);
            fill_new_row(key_begin + next * PA_KEYS, buf);
        }
        cp_async_commit();
    }

    /* merge the four warps: (max, sum, O) of each into shared memory (the K/V buffers, free now) */
    __syncthreads();
    float *sm_m = reinterpret_cast<float *>(sQ + PA_QV * LDS); /* [warps][16] */
    float *sm_l = sm_m + PA_WARPS * PA_QV;                     /* [warps][16] */
    float *sm_o = sm_l + PA_WARPS * PA_QV;                     /* [warps][16][D] */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = l_run[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int qi = lane / 4 + r * 8;
        if ((lane & 3) == 0) {
            sm_m[warp * PA_QV + qi] = m_run[r];
            sm_l[warp * PA_QV + qi] = l;
        }
#pragma unroll
        for (int t = 0; t < DT; t++) {
            const int col = t * 8 + (lane & 3) * 2;
            sm_o[(warp * PA_QV + qi) * D + col] = o[t][2 * r];
            sm_o[(warp * PA_QV + qi) * D + col + 1] = o[t][2 * r + 1];
        }
    }
    __syncthreads();
    for (int i = tid; i < PA_QV * CH; i += PA_THREADS) {
        const int qi = i / CH, c = i % CH;
        if (!vector_ok(qi)) continue;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < PA_WARPS; w++) M = fmaxf(M, sm_m[w * PA_QV + qi]);
        float L = 0.0f, acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (M != -INFINITY) {
#pragma unroll
            for (int w = 0; w < PA_WARPS; w++) {
                const float mw = sm_m[w * PA_QV + qi];
                if (mw == -INFINITY) continue;
                const float f = fast_exp2((mw - M) * a.scale_log2);
                L += sm_l[w * PA_QV + qi] * f;
#pragma unroll
                for (int e = 0; e < 8; e++) acc[e] += sm_o[(w * PA_QV + qi) * D + c * 8 + e] * f;
            }
        }
        const size_t t = (size_t)row_of(qi);
        const int h = head_of(qi);
        if (n_splits == 1) {
            const float inv = row_sum_inverse(L);
#pragma unroll
            for (int e = 0; e < 8; e++) acc[e] *= inv;
            *reinterpret_cast<uint4 *>(reinterpret_cast<uint16_t *>(a.out) + t * a.n_heads * D + (size_t)h * D +
                                       c * 8) = pack8<BF16>(acc);
        } else {
            float *part = a.ws + ((t * a.n_heads + h) * n_splits + split) * (D + 2);
#pragma unroll
            for (int e = 0; e < 8; e++) part[2 + c * 8 + e] = acc[e];
            if (c == 0) { /* the max in natural-log units of the scaled scores, as the merge reads it */
                part[0] = M == -INFINITY ? -INFINITY : M * a.scale_log2 * 0.6931471805599453f;
                part[1] = L;
            }
        }
    }
}

/* The key splits' partial results of one (token, head) merged: out = Σ_s O_s·e^(m_s − M) / Σ_s
 * l_s·e^(m_s − M). One pass over the splits, eight at a time with every load of a group issued
 * before its arithmetic, the running maximum rescaling what came before (the online softmax across
 * splits): one round trip to L2 for up to eight splits, where a pass for the maximum, one for the
 * sum and one for O made three. */
template <typename T>
__global__ void attention_combine_kernel(T *out, const float *ws, int n_heads, int head_size,
                                         int n_splits) {
    constexpr int GROUP = 8;
    const int t = blockIdx.x, h = blockIdx.y;
    const size_t stride = (size_t)head_size + 2; /* a split's [max, sum, O[head_size]] */
    allow_dependent_launch();
    wait_for_upstream_grid();
    const float *parts = ws + ((size_t)t * n_heads + h) * n_splits * stride;
    for (int d = threadIdx.x; d < head_size; d += blockDim.x) {
        float M = -INFINITY, L = 0.0f, o = 0.0f;
        for (int s0 = 0; s0 < n_splits; s0 += GROUP) {
            float m[GROUP], l[GROUP], v[GROUP];
#pragma unroll
            for (int i = 0; i < GROUP; i++) {
                const bool ok = s0 + i < n_splits;
                const float *part = parts + (size_t)(ok ? s0 + i : 0) * stride;
                m[i] = ok ? part[0] : -INFINITY;
                l[i] = ok ? part[1] : 0.0f;
                v[i] = ok ? part[2 + d] : 0.0f;
            }
            float group_max = M;
#pragma unroll
            for (int i = 0; i < GROUP; i++) group_max = fmaxf(group_max, m[i]);
            if (group_max == -INFINITY) continue; /* only empty splits so far */
            if (M != -INFINITY) {
                const float f = __expf(M - group_max);
                L *= f;
                o *= f;
            }
#pragma unroll
            for (int i = 0; i < GROUP; i++)
                if (m[i] != -INFINITY) {
                    const float f = __expf(m[i] - group_max);
                    L += l[i] * f;
                    o += v[i] * f;
                }
            M = group_max;
        }
        out[(size_t)t * n_heads * head_size + (size_t)h * head_size + d] = from_f32<T>(o / L);
    }
}

template <typename T>
__global__ void swiglu_kernel(T *out, const T *gate_up, int dim, size_t n) {
    allow_dependent_launch();
    wait_for_upstream_grid();
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        const size_t t = k / dim, i = k % dim;
        const float g = to_f32(gate_up[t * 2 * dim + i]), u = to_f32(gate_up[t * 2 * dim + dim + i]);
        out[k] = from_f32<T>(g / (1.0f + __expf(-g)) * u);
    }
}

__global__ void gather_rows_kernel(float *out, const float *x, const int32_t *rows, int dim) {
    allow_dependent_launch();
    wait_for_upstream_grid();
    const float *src = x + (size_t)rows[blockIdx.x] * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[(size_t)blockIdx.x * dim + i] = src[i];
}

template <typename T>
__global__ void residual_add_kernel(float *h, const T *x, size_t n) {
    allow_dependent_launch();
    wait_for_upstream_grid();
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x)
        h[k] += to_f32(x[k]);
}

/* ---- C launchers: a typed body each, dispatched on the dtype ---------------------------------- */

template <typename T>
static nopad_status embed_t(void *out, const int32_t *tokens, const int32_t *feed,
                            const int32_t *positions, int n, int vocab, int vocab0, int vocab_rows,
                            int n_pos, const void *word, const void *pos, int dim, cudaStream_t s) {
    embed_tokens_kernel<T><<<n, 256, 0, s>>>((float *)out, tokens, feed, positions, vocab, vocab0,
                                             vocab_rows, n_pos, (const T *)word, (const T *)pos, dim);
    return launch_status("embed_tokens");
}

extern "C" nopad_status cuda_dec_embed_tokens(nopad_dtype dtype, float *out, const int32_t *tokens,
                                              const int32_t *feed, const int32_t *positions, int32_t n_tokens,
                                              int32_t vocab, int32_t vocab0, int32_t vocab_rows,
                                              int32_t n_positions, const void *word, const void *pos,
                                              int32_t dim, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (n_tokens == 0) return NOPAD_OK;
    DISPATCH_DTYPE(dtype,
                   embed_t<__half>(out, tokens, feed, positions, n_tokens, vocab, vocab0, vocab_rows, n_positions,
                                   word, pos, dim, s),
                   embed_t<__nv_bfloat16>(out, tokens, feed, positions, n_tokens, vocab, vocab0, vocab_rows,
                                          n_positions, word, pos, dim, s));
}

template <typename T>
static nopad_status norm_t(void *out, float *h, const void *x, const void *w, const void *b, float eps,
                           int n, int dim, int rms, cudaStream_t s) {
    const bool vec = dim % 4 == 0 && ((uintptr_t)out | (uintptr_t)h | (uintptr_t)x | (uintptr_t)w | (uintptr_t)b) % 16 == 0;
    if (vec && dim <= 8192) {
        const int iters = dim <= 1024 ? 1 : dim <= 2048 ? 2 : dim <= 4096 ? 4 : 8;
        void (*kernel)(T *, float *, const T *, const T *, const T *, float, int, int) =
            iters == 1 ? norm_rows_kernel<T, 1> : iters == 2 ? norm_rows_kernel<T, 2>
                                                : iters == 4 ? norm_rows_kernel<T, 4> : norm_rows_kernel<T, 8>;
        launch_row_kernel(kernel, dim3(n), dim3(256), s, (T *)out, h, (const T *)x, (const T *)w, (const T *)b,
                          eps, dim, rms);
    } else {
        launch_row_kernel(norm_kernel<T>, dim3(n), dim3(256), s, (T *)out, h, (const T *)x, (const T *)w,
                          (const T *)b, eps, dim, rms);
    }
    return launch_status("norm");
}

extern "C" nopad_status cuda_dec_norm(nopad_dtype dtype, void *out, float *h, const void *x,
                                      const void *w, const void *b, float eps, int32_t n_tokens,
                                      int32_t dim, int rms, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (n_tokens == 0) return NOPAD_OK;
    DISPATCH_DTYPE(dtype, norm_t<__half>(out, h, x, w, b, eps, n_tokens, dim, rms, s),
                   norm_t<__nv_bfloat16>(out, h, x, w, b, eps, n_tokens, dim, rms, s));
}

template <typename T>
static nopad_status rope_kv_store_t(void *qkv, void *k_cache, void *v_cache, const int32_t *positions,
                                    const int32_t *slots, int n, int n_heads, int n_kv_heads,
                                    int head_size, const float *inv_freq, cudaStream_t s) {
    /* 4 pairs a thread where a head's halves split into 4s (head sizes % 8 == 0: every model's) */
    const bool vec = head_size % 8 == 0 && ((uintptr_t)qkv | (uintptr_t)k_cache | (uintptr_t)v_cache) % 8 == 0;
    const int VEC = vec ? 4 : 1;
    const int groups = (n_heads + n_kv_heads) * (head_size / 2) / VEC, copies = n_kv_heads * head_size / VEC;
    int threads = (groups > copies ? groups : copies) + 31;
    threads = threads / 32 * 32 < 64 ? 64 : threads / 32 * 32 > 1024 ? 1024 : threads / 32 * 32;
    launch_row_kernel(vec ? rope_kv_store_kernel<T, 4> : rope_kv_store_kernel<T, 1>, dim3(n), dim3(threads), s,
                      (T *)qkv, (T *)k_cache, (T *)v_cache, positions, slots, n_heads, n_kv_heads, head_size,
                      inv_freq);
    return launch_status("rope_kv_store");
}

extern "C" nopad_status cuda_dec_rope_kv_store(nopad_dtype dtype, void *qkv, void *k_cache,
                                               void *v_cache, const int32_t *positions,
                                               const int32_t *slots, int32_t n_tokens,
                                               int32_t n_heads, int32_t n_kv_heads,
                                               int32_t head_size, const float *inv_freq,
                                               void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (n_tokens == 0) return NOPAD_OK;
    DISPATCH_DTYPE(dtype, rope_kv_store_t<__half>(qkv, k_cache, v_cache, positions, slots, n_tokens, n_heads, n_kv_heads, head_size, inv_freq, s),
                   rope_kv_store_t<__nv_bfloat16>(qkv, k_cache, v_cache, positions, slots, n_tokens, n_heads, n_kv_heads, head_size, inv_freq, s));
}

/* The launch shape of the paged attention for kv: query rows and heads per CTA, key splits. */
typedef struct paged_plan {
    int rows, heads_per_cta, chunks, splits, stages;
    size_t smem;
} paged_plan;

static paged_plan plan_paged(const nopad_kv_batch *kv, int n_heads, int n_kv_heads, int head_size) {
    paged_plan p;
    const int G = n_heads / n_kv_heads;
    p.heads_per_cta = G < PA_QV ? G : PA_QV;
    p.chunks = (G + p.heads_per_cta - 1) / p.heads_per_cta;
    p.rows = PA_QV / p.heads_per_cta;
    if (p.rows > kv->max_q) p.rows = kv->max_q;
    if (p.rows < 1) p.rows = 1;
    /* CTAs that hold rows; the keys are split until there are about 4 a SM */
    const long groups = kv->max_q <= 1 ? kv->n_seqs
                                        : (long)kv->n_seqs * ((kv->max_q + p.rows - 1) / p.rows);
    const long ctas = (groups < kv->n_tokens ? groups : kv->n_tokens) * (long)n_kv_heads * p.chunks;
    const int n_tiles = kv->max_k > 0 ? (kv->max_k + PA_KEYS - 1) / PA_KEYS : 1;
    /* about 2 CTAs a SM, at least two 16-key tiles per warp in a split. Against 4 CTAs and one
     * tile (H200, a LLaMA-1B decode step, one run each): 1 x 512 0.648 against 0.653 ms, 8 x 512
     * 0.753 against 0.770-0.779, 1 x 2048 0.702 against 0.746-0.752, 8 x 2048 0.888 against
     * 0.894-0.918; fewer splits, fewer partial results to merge. */
    const long target = 2L * cuda_sm_count();
    long want = (target + ctas - 1) / ctas;
    const long most = (n_tiles + 2 * PA_WARPS - 1) / (2 * PA_WARPS);
    if (want > most) want = most;
    if (want < 1) want = 1;
    p.splits = (int)want; /* the kernel shares each sequence's own keys among them */
    p.stages = pa_three_stages(ctas * p.splits, head_size) ? 3 : 2;
    const size_t lds = (size_t)head_size + 8;
    /* every warp's K/V buffers, then the new token's K and V rows (ROPE_STORE) */
    const size_t kv_bytes = ((size_t)PA_WARPS * 2 * p.stages * PA_KEYS + 2) * lds * 2;
    const size_t merge_bytes = (size_t)PA_WARPS * PA_QV * (2 + head_size) * sizeof(float);
    p.smem = (size_t)PA_QV * lds * 2 + (kv_bytes > merge_bytes ? kv_bytes : merge_bytes);
    return p;
}

static bool paged_head_size(int d) { return d == 32 || d == 48 || d == 64 || d == 80 || d == 96 || d == 128; }

/* Whether the prompts-only path takes this step: the fused causal attention of the encoder over the
 * new tokens (tensor cores), for head sizes it has. */
static bool use_prefill_path(const nopad_kv_batch *kv, int head_size) {
    return kv->no_history && (head_size == 32 || head_size == 64 || head_size == 128);
}

extern "C" void cuda_dec_attention_workspace(const nopad_kv_batch *kv, nopad_dtype dtype,
                                             int32_t n_heads, int32_t n_kv_heads, int32_t head_size,
                                             size_t *split_bytes, size_t *expand_bytes) {
    const size_t elem = dtype == NOPAD_DTYPE_F32 ? 4 : 2;
    *split_bytes = 0;
    *expand_bytes = 0;
    if (kv->n_tokens <= 0) return;
    if (use_prefill_path(kv, head_size)) {
        if (n_heads != n_kv_heads) *expand_bytes = (size_t)kv->n_tokens * 3 * n_heads * head_size * elem;
        return;
    }
    const paged_plan p = plan_paged(kv, n_heads, n_kv_heads, head_size);
    if (p.splits > 1)
        *split_bytes = (size_t)kv->n_tokens * n_heads * p.splits * (head_size + 2) * sizeof(float);
}

/* [T, H + 2·KVH, D] -> [T, 3, H, D]: each query head gets its own copy of its K and V head, the
 * layout of the encoder's attention. */
template <typename T>
__global__ void expand_kv_heads_kernel(T *out, const T *qkv, int n_heads, int n_kv_heads, int head_size) {
    const int t = blockIdx.x, G = n_heads / n_kv_heads, DV = head_size / 8;
    const T *src = qkv + (size_t)t * (n_heads + 2 * n_kv_heads) * head_size;
    T *dst = out + (size_t)t * 3 * n_heads * head_size;
    for (int i = threadIdx.x; i < 3 * n_heads * DV; i += blockDim.x) {
        const int part = i / (n_heads * DV), h = (i / DV) % n_heads, c = i % DV;
        const int from = part == 0 ? h : n_heads + (part - 1) * n_kv_heads + h / G;
        *reinterpret_cast<uint4 *>(dst + (size_t)(part * n_heads + h) * head_size + c * 8) =
            *reinterpret_cast<const uint4 *>(src + (size_t)from * head_size + c * 8);
    }
}

/* rope_store: the decode form with rope_kv_store folded in (inv_freq NULL: K stored unturned). */
template <typename T>
static nopad_status attention_t(void *out, const void *qkv, void *k_cache, void *v_cache,
                                const nopad_kv_batch *kv, int n_heads, int n_kv_heads, int head_size,
                                float scale, bool rope_store, const float *inv_freq,
                                const cuda_dec_attention_ws *ws, cudaStream_t s) {
    if (!rope_store && use_prefill_path(kv, head_size)) {
        const void *packed = qkv;
        if (n_heads != n_kv_heads) {
            expand_kv_heads_kernel<T><<<kv->n_tokens, 128, 0, s>>>((T *)ws->expand, (const T *)qkv,
                                                                   n_heads, n_kv_heads, head_size);
            nopad_status st = launch_status("expand_kv_heads");
            if (st != NOPAD_OK) return st;
            packed = ws->expand;
        }
        return cuda_attention(std::is_same<T, __half>::value ? NOPAD_DTYPE_F16 : NOPAD_DTYPE_BF16,
                              out, packed, kv->cu_q, kv->n_seqs, kv->n_tokens, kv->max_q, n_heads,
                              head_size, scale, 1, ws->attention, s);
    }
    const paged_plan p = plan_paged(kv, n_heads, n_kv_heads, head_size);
    paged_args a;
    a.out = out;
    a.ws = ws->split;
    a.qkv = (const uint16_t *)qkv;
    a.k_cache = (const uint16_t *)k_cache;
    a.v_cache = (const uint16_t *)v_cache;
    a.k_store = (uint16_t *)k_cache;
    a.v_store = (uint16_t *)v_cache;
    a.inv_freq = inv_freq;
    a.cu_q = kv->cu_q;
    a.seqlen_k = kv->seqlen_k;
    a.block_table = kv->block_table;
    a.n_seqs = kv->n_seqs;
    a.max_blocks = kv->max_blocks;
    a.block_size = kv->block_size;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv_heads;
    a.rows = p.rows;
    a.heads_per_cta = p.heads_per_cta;
    a.scale_log2 = scale * 1.4426950408889634f;
    constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
    void (*kernel)(paged_args) = nullptr;
#define PAGED_KERNEL(D, S) (rope_store ? paged_attention_kernel<D, BF16, true, S> : paged_attention_kernel<D, BF16, false, S>)
#define PAGED_KERNELS(D) (p.stages == 3 ? PAGED_KERNEL(D, 3) : PAGED_KERNEL(D, 2))
    switch (head_size) {
    case 32: kernel = PAGED_KERNELS(32); break;
    case 48: kernel = PAGED_KERNELS(48); break;
    case 64: kernel = PAGED_KERNELS(64); break;
    case 80: kernel = PAGED_KERNELS(80); break;
    case 96: kernel = PAGED_KERNELS(96); break;
    default: kernel = PAGED_KERNEL(128, 2); break;
    }
#undef PAGED_KERNELS
#undef PAGED_KERNEL
    if (p.smem > 48 * 1024) {
        /* above 48 KB a kernel opts in, once per kernel and device (and so never inside a graph
         * capture after the first call) */
        static int opted[2][2][6][CUDA_MAX_DEVICES];
        const int slot = head_size / 16 - 2 < 6 ? head_size / 16 - 2 : 5, dev = cuda_current_device();
        int *once = &opted[rope_store][p.stages == 3][slot][dev < 0 ? 0 : dev];
        if (dev < 0 || !cuda_cache_load(once)) {
            const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024);
            if (e != cudaSuccess) return nopad_set_error(NOPAD_ERR_BACKEND, "cuda attention_paged: %s", cudaGetErrorString(e));
            if (dev >= 0) cuda_cache_store(once, 1);
        }
    }
    dim3 grid((unsigned)kv->n_tokens, (unsigned)(n_kv_heads * p.chunks), (unsigned)p.splits);
    launch_maybe_pdl(kernel, grid, dim3(PA_THREADS), p.smem, s, cuda_pdl_tensor_enabled() != 0, a);
    nopad_status st = launch_status("attention_paged");
    if (st != NOPAD_OK || p.splits == 1) return st;
    launch_row_kernel(attention_combine_kernel<T>, dim3((unsigned)kv->n_tokens, (unsigned)n_heads), dim3(64), s,
                      (T *)out, (const float *)ws->split, n_heads, head_size, p.splits);
    return launch_status("attention_combine");
}

extern "C" nopad_status cuda_dec_attention_paged(nopad_dtype dtype, void *out, const void *qkv,
                                                 const void *k_cache, const void *v_cache,
                                                 const nopad_kv_batch *kv, int32_t n_heads,
                                                 int32_t n_kv_heads, int32_t head_size,
                                                 float scale, const cuda_dec_attention_ws *workspace,
                                                 void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (kv->n_tokens == 0) return NOPAD_OK;
    if (!paged_head_size(head_size) || n_kv_heads < 1 || n_heads % n_kv_heads != 0)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "cuda attention_paged: head size %d (32, 48, 64, 80, 96 or 128), %d "
                               "heads over %d KV heads (a whole number of query heads each)",
                               head_size, n_heads, n_kv_heads);
    DISPATCH_DTYPE(dtype, attention_t<__half>(out, qkv, (void *)k_cache, (void *)v_cache, kv, n_heads, n_kv_heads, head_size, scale, false, nullptr, workspace, s),
                   attention_t<__nv_bfloat16>(out, qkv, (void *)k_cache, (void *)v_cache, kv, n_heads, n_kv_heads, head_size, scale, false, nullptr, workspace, s));
}

extern "C" nopad_status cuda_dec_attention_paged_rope(nopad_dtype dtype, void *out, const void *qkv,
                                                      void *k_cache, void *v_cache,
                                                      const nopad_kv_batch *kv, int32_t n_heads,
                                                      int32_t n_kv_heads, int32_t head_size, float scale,
                                                      const float *inv_freq,
                                                      const cuda_dec_attention_ws *workspace, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (kv->n_tokens == 0) return NOPAD_OK;
    if (kv->max_q != 1 || kv->n_tokens != kv->n_seqs)
        return nopad_set_error(NOPAD_ERR_INTERNAL, "cuda attention_paged_rope: %d tokens of %d sequences, at most "
                               "%d a sequence; it takes one new token each", kv->n_tokens, kv->n_seqs, kv->max_q);
    if (!paged_head_size(head_size) || n_kv_heads < 1 || n_heads % n_kv_heads != 0)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "cuda attention_paged: head size %d (32, 48, 64, 80, 96 or 128), %d "
                               "heads over %d KV heads (a whole number of query heads each)",
                               head_size, n_heads, n_kv_heads);
    DISPATCH_DTYPE(dtype, attention_t<__half>(out, qkv, k_cache, v_cache, kv, n_heads, n_kv_heads, head_size, scale, true, inv_freq, workspace, s),
                   attention_t<__nv_bfloat16>(out, qkv, k_cache, v_cache, kv, n_heads, n_kv_heads, head_size, scale, true, inv_freq, workspace, s));
}

template <typename T>
static nopad_status swiglu_t(void *out, const void *gate_up, int n, int dim, cudaStream_t s) {
    const size_t total = (size_t)n * dim;
    launch_row_kernel(swiglu_kernel<T>, dim3(grid_for(total, 256)), dim3(256), s, (T *)out, (const T *)gate_up,
                      dim, total);
    return launch_status("swiglu");
}

extern "C" nopad_status cuda_dec_swiglu(nopad_dtype dtype, void *out, const void *gate_up,
                                        int32_t n_tokens, int32_t dim, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (n_tokens == 0) return NOPAD_OK;
    DISPATCH_DTYPE(dtype, swiglu_t<__half>(out, gate_up, n_tokens, dim, s),
                   swiglu_t<__nv_bfloat16>(out, gate_up, n_tokens, dim, s));
}

extern "C" nopad_status cuda_dec_gather_rows(float *out, const float *x, const int32_t *rows,
                                             int32_t n, int32_t dim, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (n == 0) return NOPAD_OK;
    launch_row_kernel(gather_rows_kernel, dim3(n), dim3(256), s, out, x, rows, dim);
    return launch_status("gather_rows");
}

template <typename T>
static nopad_status residual_t(float *h, const void *x, size_t n, cudaStream_t s) {
    launch_row_kernel(residual_add_kernel<T>, dim3(grid_for(n, 256)), dim3(256), s, h, (const T *)x, n);
    return launch_status("residual_add");
}

extern "C" nopad_status cuda_dec_residual_add(nopad_dtype dtype, float *h, const void *x,
                                              int32_t n_tokens, int32_t dim, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    const size_t n = (size_t)n_tokens * dim;
    if (n == 0) return NOPAD_OK;
    DISPATCH_DTYPE(dtype, residual_t<__half>(h, x, n, s), residual_t<__nv_bfloat16>(h, x, n, s));
}

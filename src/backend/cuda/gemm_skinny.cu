/* Skinny linear layers (gemm_skinny.h): y[T, N] = epilogue(x[T, K] · w[N, K]ᵀ) for T <= 256.
 *
 * Work split. A CTA (8 warps) owns an output tile of 64 features (rows of w) x up to 64 tokens and
 * one slice of K: grid = N/64 tiles x `splits` slices x ceil(T/64) token tiles, with the fewest
 * slices (1..8) whose grid covers the SMs (BERT-base at T <= 64: 144, 144, 96 and 96 CTAs for the
 * qkv, FFN-in, attention-out and FFN-out GEMMs). Each CTA brings its weight slice and token slice
 * into shared memory with one bulk copy per row (cp.async.bulk, completing on an mbarrier). The
 * MMAs are mma.sync m16n8k16 with w as the A operand (16 features per warp) and x as B (8 tokens
 * per MMA), both K-contiguous as ldmatrix reads them; warp w takes features 16·(w % 4) and tokens
 * 32·(w / 4) .. +32.
 *
 * Reduction. The slices of a tile form one thread-block cluster. Each CTA stages its fp32 partial
 * tile in its own shared memory; after a cluster barrier, CTA r sums token rows r, r + splits, ...
 * over the cluster's tiles through distributed shared memory, in slice order (deterministic),
 * applies bias, activation and residual and stores y. No workspace, no atomics, no second kernel.
 * (A first version reduced through global memory, the last CTA of a tile summing every slice
 * after a fence and a ticket: the serial chain of L2 round trips made each GEMM take 12-14 us
 * in ncu at 64 tokens; this one takes 7.9-10.2 there, 7.1-8.3 at 32, against 4.6-5.9 for a
 * cuBLASLt GEMM and 2.6 for its split-K reduction kernel; bench/results/
 * enc_2026-11-21_H200_ncu_skinny.txt.)
 *
 * LayerNorm variant (cuda_gemm_skinny_layernorm). Since a cluster holds every K slice of its
 * token rows, it can also normalise them: each CTA takes its slice's statistics, the cluster
 * merges them (layernorm_tile), and each CTA normalises its slice in shared memory before the
 * MMAs; feature tile 0 stores the normalised rows. Gamma and beta arrive with the weights.
 *
 * Attention variant (cuda_gemm_skinny_attention). For one tile of tokens (T <= 64) the input of
 * the attention-out GEMM can be made where it is used: slices hold whole heads, and each CTA
 * brings the q, k and v of its heads for every token and computes their context in shared memory
 * (attention_tile) instead of reading it. The feature tiles of a slice repeat that work; the
 * context never goes to memory and the attention kernel goes.
 *
 * Programmatic dependent launch. The weights do not depend on the kernel before, so each CTA issues
 * their copies first and only then waits (griddepcontrol.wait) for the upstream grid before
 * reading x and the residual; and it lets its own dependents launch at once, so the next layer's
 * CTAs can be resident and streaming their weights while this one finishes. The wait covers the
 * upstream grid's completion and memory flush, so reading its output is safe however early either
 * kernel started. */
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/activation.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/gemm_skinny.h"
#include "backend/cuda/ptx_helpers.cuh"
extern "C" {
#include "util/error.h"
}

namespace {

namespace cg = cooperative_groups;

enum {
    THREADS = 256,
    TILE_N = 64,     /* features per CTA: 16 per warp, two warps per 16 features */
    TILE_T = 64,     /* tokens per CTA */
    MAX_SPLITS = 8,  /* slices of K per tile = the cluster size (8: the portable limit) */
    MAX_KS = 512,    /* the longest slice */
    ROW_PAD = 8,     /* elements past each shared row: ldmatrix's 8 rows land on distinct banks */
    STAGE_LD = TILE_N + 4, /* floats per row of the fp32 partial tile [token][feature] */
};
constexpr size_t STAGE_BYTES = (size_t)TILE_T * STAGE_LD * 4;
constexpr size_t MAX_SMEM = 200u << 10; /* a slice whose tiles need more is not taken */

struct params {
    void *y;
    const void *x, *w, *bias, *residual;
    int T, K, N, ks, act;
    /* the LayerNorm variant (gemm_skinny.h): gamma, beta [K]; xn [T, K] receives LN(x) */
    const void *ln_w, *ln_b;
    void *xn;
    float eps;
    /* the attention variant: x is qkv [T, 3, heads, d] (K = heads·d, rows 3·K apart), the
     * sequences cu_seqlens[n_seqs + 1]; scores scaled by scale·log2(e) in exp2 */
    const int32_t *cu_seqlens;
    int n_seqs;
    float scale_log2;
};

/* Shared memory for a slice of ks and up to `rows` tokens: the w and x tiles, two rows for the
 * LayerNorm variant's gamma and beta slices, and (attention variant, attn) the q, k and v tiles;
 * the staged partial tile later overwrites them. */
size_t smem_bytes(int ks, int rows, bool attn = false) {
    const size_t tiles = (size_t)(TILE_N + (rows + 15) / 16 * 16 * (attn ? 4 : 1) + 2) * (ks + ROW_PAD) * 2;
    return tiles > STAGE_BYTES ? tiles : STAGE_BYTES;
}

template <bool BF16> struct elem;
template <> struct elem<false> {
    using T = __half;
    static __device__ __forceinline__ float f(T v) { return __half2float(v); }
};
template <> struct elem<true> {
    using T = __nv_bfloat16;
    static __device__ __forceinline__ float f(T v) { return __bfloat162float(v); }
};

/* Four consecutive elements (8 bytes) as floats. */
template <bool BF16>
__device__ __forceinline__ void load4(float v[4], const void *base, size_t i) {
    using T = typename elem<BF16>::T;
    const uint2 raw = *reinterpret_cast<const uint2 *>(static_cast<const T *>(base) + i);
    const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
    for (int j = 0; j < 4; j++) v[j] = elem<BF16>::f(e[j]);
}

/* Eight consecutive elements (16 bytes) as floats, and back. */
template <bool BF16>
__device__ __forceinline__ void load8(float v[8], const void *src) {
    using T = typename elem<BF16>::T;
    const uint4 raw = *reinterpret_cast<const uint4 *>(src);
    const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = elem<BF16>::f(e[j]);
}


/* The LayerNorm variant: the token tile sx[rows][k_valid] (this CTA's slice of K of each row) is
 * replaced by its LayerNorm, rounded to the dtype as the LayerNorm kernel would store it; the
 * CTAs of feature tile 0 also store it to xn. Each CTA computes, per row, its slice's mean and sum
 * of squared deviations (two passes over shared memory, no cancellation); after a cluster barrier
 * each merges the cluster's slices in slice order (Chan, Golub and LeVeque's pairwise update:
 * M2 = sum M2_s + n_s (mean_s - mean)^2), so every CTA normalises with the whole row's statistics
 * and the same bits on every run. The cluster holds every slice of K, hence the whole row. */
template <bool BF16>
__device__ void layernorm_tile(const params &p, typename elem<BF16>::T *sx,
                               const typename elem<BF16>::T *sln, int ld, int k0, int k_valid,
                               int rows, int t0, cg::cluster_group &cluster, float2 *slice_stats,
                               float2 *row_stats) {
    using T = typename elem<BF16>::T;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, chunks = k_valid / 8;
    for (int r = warp; r < rows; r += THREADS / 32) {
        const T *row = sx + r * ld;
        float sum = 0.0f;
        for (int c = lane; c < chunks; c += 32) {
            float v[8];
            load8<BF16>(v, row + 8 * c);
#pragma unroll
            for (int j = 0; j < 8; j++) sum += v[j];
        }
        const float mean = warp_sum(sum) / (float)k_valid;
        float m2 = 0.0f;
        for (int c = lane; c < chunks; c += 32) {
            float v[8];
            load8<BF16>(v, row + 8 * c);
#pragma unroll
            for (int j = 0; j < 8; j++) m2 += (v[j] - mean) * (v[j] - mean);
        }
        m2 = warp_sum(m2);
        if (lane == 0) slice_stats[r] = make_float2(mean, m2);
    }
    cluster.sync(); /* every slice's statistics are in place */
    const int splits = (int)cluster.num_blocks();
    if (tid < rows) {
        float2 part[MAX_SPLITS];
#pragma unroll
        for (int s = 0; s < MAX_SPLITS; s++)
            if (s < splits) part[s] = *cluster.map_shared_rank(slice_stats + tid, s);
        float mean = 0.0f;
#pragma unroll
        for (int s = 0; s < MAX_SPLITS; s++)
            if (s < splits) mean += (float)min(p.ks, p.K - s * p.ks) * part[s].x;
        mean /= (float)p.K;
        float m2 = 0.0f;
#pragma unroll
        for (int s = 0; s < MAX_SPLITS; s++)
            if (s < splits) {
                const float d = part[s].x - mean;
                m2 += part[s].y + (float)min(p.ks, p.K - s * p.ks) * d * d;
            }
        row_stats[tid] = make_float2(mean, rsqrtf(m2 / (float)p.K + p.eps));
    }
    __syncthreads();
    T *xn = static_cast<T *>(p.xn);
    const bool store = blockIdx.x == 0;
    for (int i = tid; i < rows * chunks; i += THREADS) {
        const int r = i / chunks, c = (i % chunks) * 8;
        float v[8], g[8], b[8];
        load8<BF16>(v, sx + r * ld + c);
        load8<BF16>(g, sln + c);      /* gamma's slice */
        load8<BF16>(b, sln + ld + c); /* beta's */
        const float2 st = row_stats[r];
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = (v[j] - st.x) * st.y * g[j] + b[j];
        const uint4 out = pack8<BF16>(v);
        *reinterpret_cast<uint4 *>(sx + r * ld + c) = out;
        if (store) *reinterpret_cast<uint4 *>(xn + (size_t)(t0 + r) * p.K + k0 + c) = out;
    }
    __syncthreads(); /* the MMAs read the normalised tile */
}

/* The attention variant: the token tile sx[16·groups][k_valid] (this CTA's slice of the context,
 * heads k0/D .. k0/D + heads_here) is computed from the q, k and v slices of those heads, for
 * every token of the batch (one tile: T <= 64, so every key of every sequence is here). A warp
 * takes one head and 16 queries: S = q·kᵀ (mma.sync, k rows as the column-major B operand), keys
 * of other sequences and past T masked, softmax in registers (the four lanes of a quad share a
 * row), P rounded to the dtype as the A operand of P·v (v rows through ldmatrix.trans), divided
 * by the row sum and stored to sx. Queries past T, and past the last sequence (cu_seqlens[B] may
 * be below T: the slack rows of a graph recorded for a bucket), get zeros; such keys are masked. The feature tiles of a slice each
 * compute the same context: at T <= 64 that is a few hundred thousand FLOPs per CTA, against a
 * kernel and a round trip through global memory saved. */
template <bool BF16, int D>
__device__ void attention_tile(const params &p, typename elem<BF16>::T *sx, const typename elem<BF16>::T *sq,
                               const typename elem<BF16>::T *sk, const typename elem<BF16>::T *sv, int ld,
                               int heads_here, int rows, int groups, const int *seq_of) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int task = warp; task < heads_here * 4; task += THREADS / 32) {
        const int h = task / 4, qg = task % 4;
        if (qg >= groups) continue; /* warp-uniform */
        const int c0 = h * D;
        uint32_t qf[D / 16][4];
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            ldmatrix_x4(qf[kk], sq + (qg * 16 + (lane & 15)) * ld + c0 + kk * 16 + (lane >> 4) * 8);
        /* s[t]: queries qg·16 + lane/4 (+8) x keys 8t + 2(lane % 4) (+1) */
        float s[8][4];
#pragma unroll
        for (int t = 0; t < 8; t++) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
            for (int nn = 0; nn < 4; nn++) {
                if (nn >= groups) continue;
                uint32_t b[4];
                ldmatrix_x4(b, sk + (nn * 16 + (lane & 7) + (lane >> 4) * 8) * ld + c0 + kk * 16 + ((lane >> 3) & 1) * 8);
                mma16816<BF16>(s[2 * nn], qf[kk], b[0], b[1]);
                mma16816<BF16>(s[2 * nn + 1], qf[kk], b[2], b[3]);
            }
        }
        float l[2];
        masked_softmax_rows<8>(s, l, qg * 16, rows, seq_of, p.scale_log2, lane);
        /* O = P·v: the S accumulators of key tiles 2kk, 2kk+1 are the A fragment of key step kk */
        float o[D / 8][4];
#pragma unroll
        for (int t = 0; t < D / 8; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            if (kk < groups) mma_pv_step<BF16, D>(o, s[2 * kk], s[2 * kk + 1], sv + kk * 16 * ld + c0, ld, lane);
        const int row = qg * 16 + lane / 4;
#pragma unroll
        for (int t = 0; t < D / 8; t++) {
            const int col = c0 + t * 8 + (lane & 3) * 2;
            *reinterpret_cast<uint32_t *>(sx + row * ld + col) = pack2<BF16>(o[t][0] * l[0], o[t][1] * l[0]);
            *reinterpret_cast<uint32_t *>(sx + (row + 8) * ld + col) = pack2<BF16>(o[t][2] * l[1], o[t][3] * l[1]);
        }
    }
    __syncthreads(); /* the MMAs read the context tile */
}

/* y[t][n .. n+4) = act(v + bias) + residual, rounded once. */
template <bool BF16>
__device__ __forceinline__ void epilogue_store(const params &p, float v[4], int t, int n) {
    if (p.bias) {
        float b[4];
        load4<BF16>(b, p.bias, n);
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] += b[j];
    }
    if (p.act >= 0) {
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = apply_activation(v[j], p.act);
    }
    const size_t i = (size_t)t * p.N + n;
    if (p.residual) {
        float r[4];
        load4<BF16>(r, p.residual, i);
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] += r[j];
    }
    uint2 out;
    out.x = pack2<BF16>(v[0], v[1]);
    out.y = pack2<BF16>(v[2], v[3]);
    *reinterpret_cast<uint2 *>(static_cast<typename elem<BF16>::T *>(p.y) + i) = out;
}

/* LN: the LayerNorm variant; HEAD_D > 0: the attention variant for that head size. */
template <bool BF16, bool LN, int HEAD_D>
__global__ void __launch_bounds__(THREADS) skinny_gemm_kernel(const params p) {
    using T = typename elem<BF16>::T;
    constexpr bool ATTN = HEAD_D > 0;
    extern __shared__ __align__(128) unsigned char smem[];
    const int ld = p.ks + ROW_PAD;
    T *sw = reinterpret_cast<T *>(smem); /* [64 features][ld] */
    T *sx = sw + TILE_N * ld;            /* [16·groups tokens][ld] */
    float *stage = reinterpret_cast<float *>(smem); /* [64 tokens][STAGE_LD], after the MMAs */
    __shared__ uint64_t loaded; /* completes when both tiles have landed */
    __shared__ float2 slice_stats[LN ? TILE_T : 1], row_stats[LN ? TILE_T : 1]; /* LN variant */
    __shared__ int seq_of[ATTN ? TILE_T : 1]; /* attention variant: the sequence of each token */
    cg::cluster_group cluster = cg::this_cluster();

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int n0 = blockIdx.x * TILE_N, split = blockIdx.y, t0 = blockIdx.z * TILE_T;
    const int k0 = split * p.ks;
    const int k_valid = min(p.ks, p.K - k0);      /* elements of the slice inside K (% 8 == 0) */
    const int k_len = (k_valid + 15) / 16 * 16;   /* what the MMAs read: zeros past k_valid */
    const int rows = min(TILE_T, p.T - t0);       /* tokens of this tile, >= 1 */
    const int groups = (rows + 15) / 16;          /* 16-token groups the MMAs read */
    const uint32_t row_bytes = (uint32_t)k_valid * 2;

    if (tid == 0) {
        mbar_init(&loaded, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        mbar_arrive_expect_tx(&loaded, (uint32_t)(TILE_N + rows * (ATTN ? 3 : 1) + (LN ? 2 : 0)) * row_bytes);
    }
    /* zeros where the MMAs read past the copies: the slice's tail past K, tokens past T */
    const int tail_chunks = (k_len - k_valid) / 8;
    for (int i = tid; i < (TILE_N + 16 * groups) * tail_chunks; i += THREADS) {
        const int r = i / tail_chunks, c = k_valid + (i % tail_chunks) * 8;
        *reinterpret_cast<uint4 *>(sw + r * ld + c) = make_uint4(0, 0, 0, 0); /* sx follows sw */
    }
    /* (attention variant: the q, k and v tiles follow sx, with zeros past T too: a v row of
     * NaN would poison P·v even where P is 0) */
    for (int tile = 0; tile < (ATTN ? 4 : 1); tile++)
        for (int i = tid; i < (16 * groups - rows) * (k_len / 8); i += THREADS) {
            const int r = rows + i / (k_len / 8), c = (i % (k_len / 8)) * 8;
            *reinterpret_cast<uint4 *>(sx + (tile * 16 * groups + r) * ld + c) = make_uint4(0, 0, 0, 0);
        }
    __syncthreads(); /* the barrier is initialised before any copy signals it */

    /* One bulk copy per row, a thread each; the weight slice first: it does not depend on the
     * upstream kernel. */
    if (tid < TILE_N)
        bulk_copy_g2s(sw + tid * ld, static_cast<const T *>(p.w) + (size_t)(n0 + tid) * p.K + k0, row_bytes,
                      &loaded);
    T *sln = sx + 16 * groups * ld; /* LN: the slices of gamma, then beta (one row each) */
    T *sq = sx + 16 * groups * ld;  /* attention: the q, k and v tiles, [16·groups][ld] each */
    if (LN && tid >= THREADS - 2) /* two threads the token rows leave free (rows <= 64) */
        bulk_copy_g2s(sln + (tid - (THREADS - 2)) * ld,
                      static_cast<const T *>(tid == THREADS - 2 ? p.ln_w : p.ln_b) + k0, row_bytes, &loaded);
    allow_dependent_launch();
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    if (ATTN) {
        /* thread 64 + j copies row j % rows of q (j / rows = 0), k (1) or v (2); t0 = 0 */
        const int j = tid - TILE_N;
        if (j >= 0 && j < 3 * rows)
            bulk_copy_g2s(sq + ((j / rows) * 16 * groups + j % rows) * ld,
                          static_cast<const T *>(p.x) + (size_t)(j % rows) * 3 * p.K + (j / rows) * p.K + k0,
                          row_bytes, &loaded);
        if (tid < rows) { /* the last sequence starting at or before token tid; -1 past the
                             last sequence (the slack rows of a graph recorded for a bucket) */
            int lo = 0, hi = p.n_seqs - 1;
            while (lo < hi) {
                const int mid = (lo + hi + 1) / 2;
                if (p.cu_seqlens[mid] <= tid) lo = mid;
                else hi = mid - 1;
            }
            seq_of[tid] = tid < p.cu_seqlens[p.n_seqs] ? lo : -1;
        }
    } else if (tid >= TILE_N && tid < TILE_N + rows) {
        bulk_copy_g2s(sx + (tid - TILE_N) * ld, static_cast<const T *>(p.x) + (size_t)(t0 + tid - TILE_N) * p.K + k0,
                      row_bytes, &loaded);
    }
    mbar_wait(&loaded, 0);
    if constexpr (ATTN) {
        T *sk = sq + 16 * groups * ld, *sv = sk + 16 * groups * ld;
        __syncthreads(); /* seq_of */
        /* v rows of tokens in no sequence (graph slack) hold whatever was there; P is 0 for them,
         * but 0 · NaN is NaN: zero them (their q and k only feed scores that are masked) */
        for (int i = tid; i < rows * (k_len / 8); i += THREADS)
            if (seq_of[i / (k_len / 8)] < 0)
                *reinterpret_cast<uint4 *>(sv + (i / (k_len / 8)) * ld + (i % (k_len / 8)) * 8) = make_uint4(0, 0, 0, 0);
        __syncthreads();
        attention_tile<BF16, HEAD_D>(p, sx, sq, sk, sv, ld, k_valid / HEAD_D, rows, groups, seq_of);
    }
    if constexpr (LN) layernorm_tile<BF16>(p, sx, sln, ld, k0, k_valid, rows, t0, cluster, slice_stats, row_stats);

    /* acc[j]: features (g, g + 8) of the warp's 16 x tokens 8j + 2q + (0, 1) of its 32,
     * g = lane / 4, q = lane % 4 */
    const int fg = warp % 4, g0 = 2 * (warp / 4);
    float acc[4][4];
#pragma unroll
    for (int j = 0; j < 4; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    if (g0 < groups) {
        const T *a_row = sw + (fg * 16 + lane % 16) * ld + (lane / 16) * 8;
        const T *b_row = sx + (g0 * 16 + lane % 8 + (lane / 16) * 8) * ld + ((lane / 8) % 2) * 8;
        const bool second = g0 + 1 < groups;
        for (int kk = 0; kk < k_len; kk += 16) {
            uint32_t a[4], b[4];
            ldmatrix_x4(a, a_row + kk);
            ldmatrix_x4(b, b_row + kk);
            mma16816<BF16>(acc[0], a, b[0], b[1]);
            mma16816<BF16>(acc[1], a, b[2], b[3]);
            if (second) {
                ldmatrix_x4(b, b_row + 16 * ld + kk);
                mma16816<BF16>(acc[2], a, b[0], b[1]);
                mma16816<BF16>(acc[3], a, b[2], b[3]);
            }
        }
    }
    __syncthreads(); /* the tiles become the staging tile */
    if (g0 < groups) {
        const int f = fg * 16 + lane / 4, tq = g0 * 16 + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            stage[(8 * j + tq) * STAGE_LD + f] = acc[j][0];
            stage[(8 * j + tq + 1) * STAGE_LD + f] = acc[j][1];
            stage[(8 * j + tq) * STAGE_LD + f + 8] = acc[j][2];
            stage[(8 * j + tq + 1) * STAGE_LD + f + 8] = acc[j][3];
        }
    }
    cluster.sync(); /* every slice's partial tile is staged (release / acquire across the cluster) */

    /* CTA r of the cluster finishes token rows r, r + splits, ...: 16 threads per row, 4 features
     * each, every slice's value loaded before the first add. */
    const int splits = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    const int owned = (rows - rank + splits - 1) / splits; /* rows rank + splits·j, j < owned */
    for (int i = tid; i < owned * (TILE_N / 4); i += THREADS) {
        const int t = rank + splits * (i / (TILE_N / 4)), f = (i % (TILE_N / 4)) * 4;
        float4 q[MAX_SPLITS];
#pragma unroll
        for (int s = 0; s < MAX_SPLITS; s++)
            if (s < splits) q[s] = *cluster.map_shared_rank(reinterpret_cast<float4 *>(stage + t * STAGE_LD + f), s);
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int s = 0; s < MAX_SPLITS; s++) /* slice order: the same sum on every run */
            if (s < splits) v[0] += q[s].x, v[1] += q[s].y, v[2] += q[s].z, v[3] += q[s].w;
        epilogue_store<BF16>(p, v, t0 + t, n0 + f);
    }
    cluster.sync(); /* no CTA leaves while another still reads its shared memory */
}

/* The fewest slices (1..8) whose grid covers the SMs, else 8; a slice is a multiple of 16
 * elements, at most MAX_KS, with tiles that fit MAX_SMEM. Returns 0 when no slice fits (K > 4096). */
int choose_slice(int T, int K, int N, int *ks_out, int *splits_out) {
    /* NOPAD_SKINNY_MIN_CTAS: the grid the slices aim for (default: the SMs; for experiments —
     * a third or half of the SMs, or twice them, measured no better) */
    static int min_ctas = -1;
    if (min_ctas < 0) min_ctas = getenv("NOPAD_SKINNY_MIN_CTAS") ? atoi(getenv("NOPAD_SKINNY_MIN_CTAS")) : 0;
    const int tiles = N / TILE_N, z = (T + TILE_T - 1) / TILE_T, sms = min_ctas > 0 ? min_ctas : cuda_sm_count();
    const int rows = T < TILE_T ? T : TILE_T;
    int found = 0;
    for (int splits = 1; splits <= MAX_SPLITS; splits++) {
        const int ks = ((K + splits - 1) / splits + 15) / 16 * 16;
        if ((K + ks - 1) / ks != splits) continue; /* a shorter slice count covers K already */
        if (ks > MAX_KS || smem_bytes(ks, rows) > MAX_SMEM) continue;
        *ks_out = ks, *splits_out = splits, found = 1;
        if ((long)tiles * splits * z >= sms) break;
    }
    return found;
}

/* The attention variant's slices hold whole heads (d elements each): the fewest slices (1..8)
 * whose grid covers the SMs, else the most; 0 when none fits. BERT-base (12 heads of 64, N = 768):
 * 6 slices of 2 heads, 72 CTAs; BERT-large (16 heads): 8 slices of 2, 128 CTAs. */
int choose_slice_heads(int T, int K, int N, int d, int *ks_out, int *splits_out) {
    const int heads = K / d, tiles = N / TILE_N, sms = cuda_sm_count();
    int found = 0;
    for (int splits = 1; splits <= MAX_SPLITS; splits++) {
        const int per = (heads + splits - 1) / splits;
        if ((heads + per - 1) / per != splits) continue;
        const int ks = per * d;
        if (ks > MAX_KS || smem_bytes(ks, T, true) > MAX_SMEM) continue;
        *ks_out = ks, *splits_out = splits, found = 1;
        if (tiles * splits >= sms) break;
    }
    return found;
}

enum variant { PLAIN = 0, LAYERNORM = 1, ATTENTION_32 = 2, ATTENTION_64 = 3 };

} // namespace

extern "C" int cuda_gemm_skinny_supported(int32_t n_tokens, int32_t n_in, int32_t n_out) {
    int ks, splits;
    return n_tokens >= 1 && n_tokens <= CUDA_SKINNY_MAX_T && n_in >= 8 && n_in % 8 == 0 &&
           n_out >= TILE_N && n_out % TILE_N == 0 && n_out / TILE_N <= 65535 &&
           choose_slice(n_tokens, n_in, n_out, &ks, &splits);
}

/* Whether the byte ranges [a, a + na) and [b, b + nb) meet. */
static bool overlaps(const void *a, size_t na, const void *b, size_t nb) {
    const uintptr_t ua = (uintptr_t)a, ub = (uintptr_t)b;
    return ua < ub + nb && ub < ua + na;
}

/* Checks what every variant needs and launches one. p.ks is chosen here. */
static nopad_status skinny_launch(nopad_dtype dtype, params p, variant v, void *stream) {
    static const char *const names[4] = {"skinny gemm", "skinny layernorm gemm", "skinny attention gemm",
                                         "skinny attention gemm"};
    const char *what = names[v];
    const bool attention = v == ATTENTION_32 || v == ATTENTION_64;
    const int head_size = v == ATTENTION_32 ? 32 : 64;
    if (dtype != NOPAD_DTYPE_F16 && dtype != NOPAD_DTYPE_BF16)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: dtype must be F16 or BF16", what);
    if (!p.y || !p.x || !p.w)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: NULL y, x or w", what);
    int splits = 1;
    if (attention) {
        if (!cuda_gemm_skinny_attention_supported(p.T, p.K / head_size, head_size, p.N) || p.K % head_size)
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                   "%s: T %d, %d heads of %d, N %d (needs 1 <= T <= %d, head size 32 or 64, N %% 64 == 0)",
                                   what, p.T, p.K / head_size, head_size, p.N, (int)TILE_T);
        choose_slice_heads(p.T, p.K, p.N, head_size, &p.ks, &splits);
    } else {
        if (!cuda_gemm_skinny_supported(p.T, p.K, p.N))
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                   "%s: T %d K %d N %d (needs 1 <= T <= %d, K %% 8 == 0 and <= 4096, N %% 64 == 0)",
                                   what, p.T, p.K, p.N, (int)CUDA_SKINNY_MAX_T);
        choose_slice(p.T, p.K, p.N, &p.ks, &splits);
    }
    if ((((uintptr_t)p.y | (uintptr_t)p.x | (uintptr_t)p.w | (uintptr_t)p.residual) & 15u) ||
        ((uintptr_t)p.bias & 7u))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: x, w, y and residual must be 16-byte aligned, bias 8-byte aligned", what);
    const size_t xbytes = (size_t)p.T * p.K * 2 * (attention ? 3 : 1), ybytes = (size_t)p.T * p.N * 2;
    if (v == LAYERNORM) {
        /* xn is written while other CTAs still read x, and y while they read both */
        if (overlaps(p.xn, xbytes, p.x, xbytes) || overlaps(p.y, ybytes, p.x, xbytes) ||
            overlaps(p.y, ybytes, p.xn, xbytes) || (p.residual && overlaps(p.residual, ybytes, p.xn, xbytes)))
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "%s: xn must not overlap x, y or residual, nor y overlap x", what);
    } else if (attention && overlaps(p.y, ybytes, p.x, xbytes)) {
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: y must not overlap qkv", what);
    }

    void (*const kernels[2][4])(params) = {
        {skinny_gemm_kernel<false, false, 0>, skinny_gemm_kernel<false, true, 0>,
         skinny_gemm_kernel<false, false, 32>, skinny_gemm_kernel<false, false, 64>},
        {skinny_gemm_kernel<true, false, 0>, skinny_gemm_kernel<true, true, 0>,
         skinny_gemm_kernel<true, false, 32>, skinny_gemm_kernel<true, false, 64>}};
    const int di = dtype == NOPAD_DTYPE_BF16;
    void (*kernel)(params) = kernels[di][v];
    /* the shared-memory limit is a per-device attribute of the kernel: set once per device */
    static int attr_set[64][2][4];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        cudaGetLastError();
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: no current device below 64", what);
    }
    if (!attr_set[dev][di][v]) {
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)MAX_SMEM) != cudaSuccess)
            return nopad_set_error(NOPAD_ERR_BACKEND, "%s: %s", what, cudaGetErrorString(cudaGetLastError()));
        attr_set[dev][di][v] = 1;
    }
    const int pdl = cuda_pdl_enabled();
    cudaLaunchAttribute attrs[2];
    attrs[0].id = cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = 1;
    attrs[0].val.clusterDim.y = (unsigned)splits;
    attrs[0].val.clusterDim.z = 1;
    attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[1].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(p.N / TILE_N, splits, (p.T + TILE_T - 1) / TILE_T);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = smem_bytes(p.ks, p.T < TILE_T ? p.T : TILE_T, attention);
    cfg.stream = static_cast<cudaStream_t>(stream);
    cfg.attrs = attrs;
    cfg.numAttrs = pdl ? 2 : 1;
    const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, p);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return nopad_set_error(NOPAD_ERR_BACKEND, "%s: launch: %s", what, cudaGetErrorString(err));
    }
    return NOPAD_OK;
}

extern "C" nopad_status cuda_gemm_skinny(nopad_dtype dtype, void *y, const void *x, const void *w,
                                         const void *bias, const void *residual, int32_t n_tokens,
                                         int32_t n_in, int32_t n_out, int act, void *stream) {
    params p = {};
    p.y = y, p.x = x, p.w = w, p.bias = bias, p.residual = residual;
    p.T = n_tokens, p.K = n_in, p.N = n_out, p.act = act;
    return skinny_launch(dtype, p, PLAIN, stream);
}


extern "C" nopad_status cuda_gemm_skinny_layernorm(nopad_dtype dtype, void *y, void *xn, const void *x,
                                                   const void *ln_weight, const void *ln_bias, float eps,
                                                   const void *w, const void *bias, const void *residual,
                                                   int32_t n_tokens, int32_t n_in, int32_t n_out, int act,
                                                   void *stream) {
    if (!xn || !ln_weight || !ln_bias)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "skinny layernorm gemm: NULL xn, ln_weight or ln_bias");
    if (((uintptr_t)xn | (uintptr_t)ln_weight | (uintptr_t)ln_bias) & 15u)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "skinny layernorm gemm: xn, ln_weight and ln_bias must be 16-byte aligned");
    if (!(eps >= 0.0f))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "skinny layernorm gemm: eps %g (expected >= 0)",
                               (double)eps);
    params p = {};
    p.y = y, p.x = x, p.w = w, p.bias = bias, p.residual = residual;
    p.T = n_tokens, p.K = n_in, p.N = n_out, p.act = act;
    p.ln_w = ln_weight, p.ln_b = ln_bias, p.xn = xn, p.eps = eps;
    return skinny_launch(dtype, p, LAYERNORM, stream);
}

extern "C" int cuda_gemm_skinny_attention_supported(int32_t n_tokens, int32_t n_heads, int32_t head_size,
                                                    int32_t n_out) {
    int ks, splits;
    return n_tokens >= 1 && n_tokens <= TILE_T && (head_size == 32 || head_size == 64) && n_heads >= 1 &&
           n_heads <= 4096 / head_size && n_out >= TILE_N && n_out % TILE_N == 0 && n_out / TILE_N <= 65535 &&
           choose_slice_heads(n_tokens, n_heads * head_size, n_out, head_size, &ks, &splits);
}

extern "C" nopad_status cuda_gemm_skinny_attention(nopad_dtype dtype, void *y, const void *qkv,
                                                   const int32_t *cu_seqlens, int32_t n_seqs, int32_t n_tokens,
                                                   int32_t n_heads, int32_t head_size, float scale, const void *w,
                                                   const void *bias, const void *residual, int32_t n_out, int act,
                                                   void *stream) {
    if (!cu_seqlens || n_seqs < 1 || n_seqs > n_tokens)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "skinny attention gemm: %d sequences for %d tokens (expected 1..T, cu_seqlens given)",
                               n_seqs, n_tokens);
    if (!(scale > 0.0f))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "skinny attention gemm: scale %g (expected > 0)",
                               (double)scale);
    if (head_size != 32 && head_size != 64)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "skinny attention gemm: head size %d (32 or 64)", head_size);
    params p = {};
    p.y = y, p.x = qkv, p.w = w, p.bias = bias, p.residual = residual;
    p.T = n_tokens, p.K = n_heads * head_size, p.N = n_out, p.act = act;
    p.cu_seqlens = cu_seqlens, p.n_seqs = n_seqs, p.scale_log2 = scale * 1.4426950408889634f;
    return skinny_launch(dtype, p, head_size == 32 ? ATTENTION_32 : ATTENTION_64, stream);
}

static int32_t max_tokens_value = -1; /* -1: NOPAD_SKINNY_MAX_TOKENS not read yet */

extern "C" int32_t cuda_gemm_skinny_max_tokens(void) {
    int32_t &value = max_tokens_value;
    if (value < 0) {
        const char *env = getenv("NOPAD_SKINNY_MAX_TOKENS");
        /* default 32: measured on an H200 (BERT-base forward, CUDA graphs, A/B in one run,
         * bench/RESULTS.md ENC v5): 16 tokens 0.385 -> 0.320 ms, 32 tokens 0.390 -> 0.367, but
         * 64 tokens 0.401 -> 0.462 and 100 tokens 0.435 -> 0.562 */
        long v = env ? strtol(env, NULL, 10) : 32;
        value = (int32_t)(v < 0 ? 0 : v > CUDA_SKINNY_MAX_T ? CUDA_SKINNY_MAX_T : v);
    }
    return value;
}

extern "C" void cuda_gemm_skinny_set_max_tokens(int32_t max_tokens) {
    max_tokens_value = max_tokens < 0 ? 0 : max_tokens > CUDA_SKINNY_MAX_T ? CUDA_SKINNY_MAX_T : max_tokens;
}

extern "C" int cuda_gemm_skinny_wins(int32_t n_tokens, int32_t n_in, int32_t n_out, int act) {
    static int only_wins = -1;
    if (only_wins < 0) only_wins = getenv("NOPAD_SKINNY_ONLY_WINS") && getenv("NOPAD_SKINNY_ONLY_WINS")[0] == '1';
    if (n_tokens > cuda_gemm_skinny_max_tokens() || !cuda_gemm_skinny_supported(n_tokens, n_in, n_out)) return 0;
    return !only_wins || n_in >= 2 * n_out || (act == NOPAD_ACT_GELU && n_tokens <= 16);
}

extern "C" int cuda_gemm_skinny_layernorm_takes(int32_t n_tokens, int32_t n_in, int32_t n_out) {
    static int enabled = -1;
    /* off unless NOPAD_SKINNY_LN=1 until measured on a GPU */
    if (enabled < 0) enabled = getenv("NOPAD_SKINNY_LN") && getenv("NOPAD_SKINNY_LN")[0] == '1';
    return enabled && n_tokens <= cuda_gemm_skinny_max_tokens() && cuda_gemm_skinny_supported(n_tokens, n_in, n_out);
}

extern "C" int cuda_gemm_skinny_attention_takes(int32_t n_tokens, int32_t n_heads, int32_t head_size,
                                                int32_t n_out) {
    static int enabled = -1;
    /* off unless NOPAD_SKINNY_ATTN=1 until measured on a GPU */
    if (enabled < 0) enabled = getenv("NOPAD_SKINNY_ATTN") && getenv("NOPAD_SKINNY_ATTN")[0] == '1';
    return enabled && n_tokens <= cuda_gemm_skinny_max_tokens() &&
           cuda_gemm_skinny_attention_supported(n_tokens, n_heads, head_size, n_out);
}

/* CUDA: every encoder layer of a small batch (T <= 32 tokens) in one cooperative kernel
 * (encoder_small.h says why).
 *
 * One CTA per SM, 8 warps. A layer is five phases, each ended by a grid-wide barrier:
 *   A  qkv[T, 3H]  = LN(s2)·Wqkvᵀ + b     (layer 0: the embedding output instead of LN(s2));
 *                    x = LN(s2) is stored to hidden, the residual of phase C
 *   B  context     = attention(qkv)       a warp per (head, 16 queries)
 *   C  s1[T, H]    = context·Woᵀ + bo + x
 *   D  ffn[T, I]   = act(LN(s1)·W1ᵀ + b1); x1 = LN(s1) is stored to context, the residual of E
 *   E  s2[T, H]    = ffn·W2ᵀ + b2 + x1
 * and after the last layer hidden = LN(s2).
 *
 * GEMM phases: the N outputs are cut into chunks of 8 features; a CTA takes up to 4 neighbouring
 * chunks (an "item"), so that the items cover the grid once. Its 8 warps split K in blocks of 32
 * (block b to warp b % 8) and each warp runs m16n8k16 MMAs with the tokens as M (one or two
 * 16-row tiles) and the features as N. Both operands come straight from global memory, 16 bytes
 * per thread per block: thread (g, q) loads row g of the activations (and of the weights) at
 * k = 8q .. 8q+7, which is a valid A (and B) fragment pair for two k16 steps if the k order inside
 * the block is permuted the same way for both operands (the dot product does not care): step 0
 * takes k {8q .. 8q+3} as the fragment's {2q, 2q+1, 2q+8, 2q+9}, step 1 takes {8q+4 .. 8q+7}. So
 * there is no shared-memory staging and no ldmatrix. The 8 warps' partial sums are added in
 * warp order through shared memory (the same bits on every run), then bias, activation and
 * residual, one rounding at the store.
 *
 * LayerNorm phases (A after layer 0, D): every CTA computes the row statistics of all T rows
 * itself (two passes over registers, warp per row) and normalises its A fragments as it loads
 * them (rounded to the dtype, as the LayerNorm kernel stores them); the CTAs without an item in
 * the phase's GEMM store the normalised rows for the residual. No CTA waits on another for
 * statistics.
 *
 * Activations written in the kernel are read with ld.global.cg (L2, not the SM's L1, which
 * other SMs' writes do not update); weights with the read-only path. At the start of each layer
 * each CTA prefetches into L2 (cp.async.bulk.prefetch) the weight rows of its items in the
 * layer's other GEMMs and in the next layer's qkv GEMM.
 *
 * Status (2026-11-21, H200): correct, and slower than the layer loop of one kernel per op
 * (0.47 against 0.32 ms at 16 tokens): ncu shows it bound by each warp's long instruction stream
 * (bench/NOTES_enc_small.md says where and what to change), so NOPAD_ENCODER_SMALL is off. */
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/activation.cuh"
#include "backend/cuda/encoder_small.h"
#include "backend/cuda/ptx_helpers.cuh"
extern "C" {
#include "util/error.h"
}

namespace cg = cooperative_groups;

namespace {

constexpr int THREADS = 256, WARPS = THREADS / 32;
constexpr int MAX_T = CUDA_ENCODER_SMALL_MAX_T;
constexpr int MAX_CHUNKS = 4;   /* 8-feature chunks per item */
constexpr int UNROLL = 3;       /* K blocks a warp has in flight (4 spills) */
constexpr int MAX_HIDDEN = 1024; /* row statistics hold a row in registers: 32 values per lane */
constexpr int ATTN_LD = 64 + 8; /* shared-memory row of a q / k / v tile (padded: no bank conflicts) */
constexpr int ATTN_WARP_ELEMS = (16 + 2 * MAX_T) * ATTN_LD;
constexpr size_t RED_BYTES = (size_t)WARPS * MAX_CHUNKS * 2 * 4 * 32 * sizeof(float);
constexpr size_t ATTN_BYTES = (size_t)WARPS * ATTN_WARP_ELEMS * sizeof(uint16_t);
constexpr size_t SMEM_BYTES = RED_BYTES > ATTN_BYTES ? RED_BYTES : ATTN_BYTES;

struct layer_w {
    const uint16_t *qkv_w, *qkv_b, *out_w, *out_b, *ln1_w, *ln1_b, *in_w, *in_b, *ffn_out_w, *ffn_out_b, *ln2_w,
        *ln2_b;
};

struct params {
    uint16_t *hidden, *qkv, *context, *sums, *ffn; /* [T, H], [T, 3H], [T, H], [T, H], [T, I] */
    const int32_t *cu_seqlens;
    int n_seqs, T, H, I, heads, act, n_steps;
    float eps, scale_log2;
    layer_w layers[CUDA_ENCODER_SMALL_MAX_STEPS];
};

/* CTA 0's SM clock at the start, and when it reached and left each grid barrier (for the phase
 * breakdown of cuda_encoder_small_phase_cycles; one thread of one CTA writes them) */
constexpr int MAX_BARRIERS = 5 * CUDA_ENCODER_SMALL_MAX_STEPS;
__device__ long long barrier_clock[1 + 2 * MAX_BARRIERS];
/* and inside each GEMM phase: the row statistics done, the K loop done, the epilogue done */
__device__ long long detail_clock[MAX_BARRIERS][3];

/* ---- element conversions -------------------------------------------------------------------- */

template <bool BF16>
__device__ __forceinline__ float2 unpack2(uint32_t v) {
    if constexpr (BF16) {
        return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
    } else {
        __half2 h = *reinterpret_cast<__half2 *>(&v);
        return __half22float2(h);
    }
}
template <bool BF16>
__device__ __forceinline__ float to_float(uint16_t v) {
    return unpack2<BF16>((uint32_t)v).x;
}
template <bool BF16>
__device__ __forceinline__ uint16_t from_float(float v) {
    return (uint16_t)(pack2<BF16>(v, 0.0f) & 0xffffu);
}
template <bool BF16>
__device__ __forceinline__ void unpack8(float f[8], uint4 v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 p = unpack2<BF16>(w[i]);
        f[2 * i] = p.x, f[2 * i + 1] = p.y;
    }
}

/* activations written earlier in this kernel: through L2 */
__device__ __forceinline__ uint4 load_act(const uint16_t *p) { return __ldcg(reinterpret_cast<const uint4 *>(p)); }
/* weights, read-only for the kernel's life */
__device__ __forceinline__ uint4 load_w(const uint16_t *p) { return __ldg(reinterpret_cast<const uint4 *>(p)); }


/* ---- LayerNorm ------------------------------------------------------------------------------ */

/* stats[r] = (mean, 1/sqrt(var + eps)) of rows r < T of x[T, K]: a warp per row, the row in
 * registers, mean first and then the squared deviations (no cancellation). A warp's rows are
 * all loaded before any is reduced (one trip to L2, not one per row). K <= MAX_HIDDEN. */
template <bool BF16>
__device__ __noinline__ void row_stats(const uint16_t *x, int T, int K, float eps, float2 *stats) {
    constexpr int ROWS = MAX_T / WARPS, CHUNKS = MAX_HIDDEN / 256; /* per warp; per lane and row */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    uint4 raw[ROWS][CHUNKS];
#pragma unroll
    for (int j = 0; j < ROWS; j++)
#pragma unroll
        for (int i = 0; i < CHUNKS; i++) {
            const int r = warp + j * WARPS, k = (i * 32 + lane) * 8;
            raw[j][i] = r < T && k < K ? load_act(x + (size_t)r * K + k) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
    for (int j = 0; j < ROWS; j++) {
        const int r = warp + j * WARPS;
        if (r >= T) break; /* warp-uniform */
        float v[CHUNKS][8];
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < CHUNKS; i++) {
            unpack8<BF16>(v[i], raw[j][i]);
#pragma unroll
            for (int e = 0; e < 8; e++) sum += v[i][e]; /* zeros past K */
        }
        const float mean = warp_sum(sum) / (float)K;
        float m2 = 0.0f;
#pragma unroll
        for (int i = 0; i < CHUNKS; i++)
            if ((i * 32 + lane) * 8 < K) {
#pragma unroll
                for (int e = 0; e < 8; e++) m2 += (v[i][e] - mean) * (v[i][e] - mean);
            }
        m2 = warp_sum(m2);
        if (lane == 0) stats[r] = make_float2(mean, rsqrtf(m2 / (float)K + eps));
    }
}

/* Eight elements k .. k+7 of a row, normalised and rounded to the dtype. The one formula used
 * both for the stored rows and for the GEMM operand, so the two agree bit for bit. */
template <bool BF16>
__device__ __forceinline__ uint4 normalise8(uint4 x, float2 st, uint4 gamma8, uint4 beta8) {
    float v[8], g[8], b[8];
    unpack8<BF16>(v, x);
    unpack8<BF16>(g, gamma8);
    unpack8<BF16>(b, beta8);
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = (v[j] - st.x) * st.y * g[j] + b[j];
    return pack8<BF16>(v);
}

/* xn[T, K] = LN(x): the share of the 16-byte chunks of CTA `worker` of `workers`. */
template <bool BF16>
__device__ __noinline__ void store_normalised(uint16_t *xn, const uint16_t *x, const uint16_t *gamma, const uint16_t *beta,
                                 const float2 *stats, int T, int K, int worker, int workers) {
    const int chunks = T * K / 8;
    for (int i = worker * THREADS + threadIdx.x; i < chunks; i += workers * THREADS) {
        const int r = i / (K / 8), k = (i % (K / 8)) * 8;
        *reinterpret_cast<uint4 *>(xn + (size_t)r * K + k) =
            normalise8<BF16>(load_act(x + (size_t)r * K + k), stats[r], load_w(gamma + k), load_w(beta + k));
    }
}

/* ---- GEMM phases ---------------------------------------------------------------------------- */

struct gemm_args {
    const uint16_t *in;                 /* [T, K] */
    const uint16_t *ln_w, *ln_b;        /* non-NULL: the operand is LN(in) (stats in shared memory) */
    const uint16_t *w, *bias, *residual; /* [N, K], [N], [T, N] (NULL: none) */
    uint16_t *out;                      /* [T, N] */
    int K, N, act;                      /* act < 0: none */
};

/* features per item, in 8-feature chunks, so that the items cover the grid about once */
__device__ __host__ __forceinline__ int chunks_per_item(int N, int grid) {
    const int m = (N / 8 + grid - 1) / grid;
    return m < 1 ? 1 : m > MAX_CHUNKS ? MAX_CHUNKS : m;
}

/* How many items a GEMM of N outputs has on this grid. */
__device__ __forceinline__ int gemm_items(int N) {
    const int m = chunks_per_item(N, gridDim.x);
    return (N / 8 + m - 1) / m;
}

/* The rows normalised in a LayerNorm phase are stored by the CTAs that have no item of the
 * phase's GEMM (their stores then cost the GEMM nothing), or by all CTAs when none is idle. */
template <bool BF16>
__device__ void store_normalised_idle(uint16_t *xn, const uint16_t *x, const uint16_t *gamma, const uint16_t *beta,
                                      const float2 *stats, int T, int K, int gemm_n) {
    const int busy = gemm_items(gemm_n), idle = (int)gridDim.x - busy;
    if (idle <= 0) store_normalised<BF16>(xn, x, gamma, beta, stats, T, K, blockIdx.x, gridDim.x);
    else if ((int)blockIdx.x >= busy) store_normalised<BF16>(xn, x, gamma, beta, stats, T, K, blockIdx.x - busy, idle);
}

/* Bulk prefetch into L2 of the weight rows this CTA's items of a GEMM will read. */
__device__ __forceinline__ void prefetch_weights(const uint16_t *w, int K, int N) {
    if (threadIdx.x != 0) return;
    const int m = chunks_per_item(N, gridDim.x), n_items = (N / 8 + m - 1) / m;
    for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
        const int c0 = item * m, mc = min(m, N / 8 - c0);
        const uint16_t *p = w + (size_t)c0 * 8 * K;
        const uint32_t bytes = (uint32_t)mc * 8u * (uint32_t)K * 2u;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
    }
}

__device__ __forceinline__ void mark(int phase, int which) {
    if (blockIdx.x == 0 && threadIdx.x == 0) detail_clock[phase][which] = clock64();
}

/* Not inlined, nor are the other phases: one copy of each stays in the instruction cache for
 * every GEMM of every layer (inlined five times over, the kernel was ~15k instructions, and every
 * phase waited for its code to come from L2). */
template <bool BF16>
__device__ __noinline__ void gemm_phase(const gemm_args a, int T, const float2 *stats, float *red, int phase) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const int m = chunks_per_item(a.N, gridDim.x), n_items = (a.N / 8 + m - 1) / m;
    const int kblocks = a.K / 32, mtiles = T > 16 ? 2 : 1;
    for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
        const int c0 = item * m, mc = min(m, a.N / 8 - c0);
        /* this thread's epilogue elements (i = threadIdx.x + THREADS·j): their bias and residual,
         * loaded now so that their latency passes under the K loop's */
        const int features = mc * 8;
        constexpr int EPI = MAX_T * MAX_CHUNKS * 8 / THREADS;
        float epi_bias[EPI], epi_res[EPI];
#pragma unroll
        for (int j = 0; j < EPI; j++) {
            const int i = threadIdx.x + THREADS * j, tok = i / features, n = 8 * c0 + i % features;
            const bool valid = i < T * features;
            epi_bias[j] = valid && a.bias ? to_float<BF16>(a.bias[n]) : 0.0f;
            epi_res[j] = valid && a.residual ? to_float<BF16>(__ldcg(a.residual + (size_t)tok * a.N + n)) : 0.0f;
        }
        float acc[MAX_CHUNKS][2][4];
#pragma unroll
        for (int c = 0; c < MAX_CHUNKS; c++)
#pragma unroll
            for (int t = 0; t < 2; t++) acc[c][t][0] = acc[c][t][1] = acc[c][t][2] = acc[c][t][3] = 0.0f;
        for (int kb0 = warp; kb0 < kblocks; kb0 += WARPS * UNROLL) {
            /* every load of UNROLL blocks first, then the MMAs */
            uint4 xa[UNROLL][2][2], wb[UNROLL][MAX_CHUNKS], gb[UNROLL][2];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const int kb = kb0 + u * WARPS, k = kb * 32 + 8 * q;
                if (kb >= kblocks) continue;
#pragma unroll
                for (int t = 0; t < 2; t++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int r = 16 * t + g + 8 * h;
                        xa[u][t][h] = t < mtiles && r < T ? load_act(a.in + (size_t)r * a.K + k) : make_uint4(0, 0, 0, 0);
                    }
#pragma unroll
                for (int c = 0; c < MAX_CHUNKS; c++)
                    if (c < mc) wb[u][c] = load_w(a.w + (size_t)(8 * (c0 + c) + g) * a.K + k);
                if (a.ln_w) gb[u][0] = load_w(a.ln_w + k), gb[u][1] = load_w(a.ln_b + k);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const int kb = kb0 + u * WARPS;
                if (kb >= kblocks) continue;
                if (a.ln_w) {
#pragma unroll
                    for (int t = 0; t < 2; t++)
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const int r = 16 * t + g + 8 * h;
                            if (t < mtiles && r < T) xa[u][t][h] = normalise8<BF16>(xa[u][t][h], stats[r], gb[u][0], gb[u][1]);
                        }
                }
#pragma unroll
                for (int c = 0; c < MAX_CHUNKS; c++) {
                    if (c >= mc) continue;
#pragma unroll
                    for (int t = 0; t < 2; t++) {
                        if (t >= mtiles) continue;
                        const uint32_t s0[4] = {xa[u][t][0].x, xa[u][t][1].x, xa[u][t][0].y, xa[u][t][1].y};
                        const uint32_t s1[4] = {xa[u][t][0].z, xa[u][t][1].z, xa[u][t][0].w, xa[u][t][1].w};
                        mma16816<BF16>(acc[c][t], s0, wb[u][c].x, wb[u][c].y);
                        mma16816<BF16>(acc[c][t], s1, wb[u][c].z, wb[u][c].w);
                    }
                }
            }
        }
        if (item == (int)blockIdx.x) mark(phase, 1);
        /* red[warp][chunk][tile][e][lane] */
#pragma unroll
        for (int c = 0; c < MAX_CHUNKS; c++)
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (c < mc && t < mtiles) red[(((warp * MAX_CHUNKS + c) * 2 + t) * 4 + e) * 32 + lane] = acc[c][t][e];
        __syncthreads();
#pragma unroll
        for (int j = 0; j < EPI; j++) {
            const int i = threadIdx.x + THREADS * j;
            if (i >= T * features) continue; /* (not break: every thread reaches the barrier below alike) */
            const int tok = i / features, fl = i % features, c = fl / 8, f = fl % 8;
            const int t = tok / 16, rr = tok % 16;
            /* accumulator element of token rr (row g = rr % 8, upper half rr / 8) and feature f
             * (column 2(lane % 4) + e % 2) */
            const int src_lane = (rr % 8) * 4 + f / 2, e = (rr / 8) * 2 + f % 2;
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; w++) v += red[(((w * MAX_CHUNKS + c) * 2 + t) * 4 + e) * 32 + src_lane];
            const int n = 8 * (c0 + c) + f;
            v += epi_bias[j];
            if (a.act >= 0) v = apply_activation(v, a.act);
            v += epi_res[j];
            a.out[(size_t)tok * a.N + n] = from_float<BF16>(v);
        }
        __syncthreads(); /* red is reused by the next item */
        if (item == (int)blockIdx.x) mark(phase, 2);
    }
}

/* ---- attention phase ------------------------------------------------------------------------ */

/* context[T, heads·D] = softmax(scale · q·kᵀ) v per head over the keys of each query's sequence.
 * Warp task (head h, queries 16·qg ..): q, k and v of head h staged in the warp's shared memory
 * (rows past T, and v rows of tokens in no sequence, as zeros: 0 · NaN would be NaN), S in
 * registers, P as the A operand of P·v (as attention_varlen.cu's kernel and gemm_skinny.cu's
 * attention variant do). */
template <bool BF16, int D>
__device__ __noinline__ void attention_phase(const params &p, const int *seq_of, uint16_t *smem_attn) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int T = p.T, H = p.H, groups = (T + 15) / 16, tasks = p.heads * groups;
    uint16_t *sq = smem_attn + warp * ATTN_WARP_ELEMS, *sk = sq + 16 * ATTN_LD, *sv = sk + MAX_T * ATTN_LD;
    for (int task = warp * gridDim.x + blockIdx.x; task < tasks; task += gridDim.x * WARPS) {
        const int h = task / groups, qg = task % groups, col = h * D;
        /* every load in flight first, then the shared-memory stores */
        constexpr int QN = 16 * (D / 8) / 32, KVN = MAX_T * (D / 8) / 32; /* 16-byte chunks per lane */
        uint4 qr[QN], kr[KVN], vr[KVN];
#pragma unroll
        for (int j = 0; j < QN; j++) {
            const int i = lane + 32 * j, row = qg * 16 + i / (D / 8), c = (i % (D / 8)) * 8;
            qr[j] = row < T ? load_act(p.qkv + (size_t)row * 3 * H + col + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < KVN; j++) {
            const int i = lane + 32 * j, r = i / (D / 8), c = (i % (D / 8)) * 8;
            const uint16_t *src = p.qkv + (size_t)r * 3 * H + col + c;
            kr[j] = r < T ? load_act(src + H) : make_uint4(0, 0, 0, 0);
            vr[j] = r < T && seq_of[r] >= 0 ? load_act(src + 2 * H) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < QN; j++) {
            const int i = lane + 32 * j;
            *reinterpret_cast<uint4 *>(sq + (i / (D / 8)) * ATTN_LD + (i % (D / 8)) * 8) = qr[j];
        }
#pragma unroll
        for (int j = 0; j < KVN; j++) {
            const int i = lane + 32 * j, off = (i / (D / 8)) * ATTN_LD + (i % (D / 8)) * 8;
            *reinterpret_cast<uint4 *>(sk + off) = kr[j];
            *reinterpret_cast<uint4 *>(sv + off) = vr[j];
        }
        __syncwarp();
        uint32_t qf[D / 16][4];
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) ldmatrix_x4(qf[kk], sq + (lane & 15) * ATTN_LD + kk * 16 + (lane >> 4) * 8);
        /* s[t]: queries qg·16 + lane/4 (+8) x keys 8t + 2(lane % 4) (+1) */
        float s[MAX_T / 8][4];
#pragma unroll
        for (int t = 0; t < MAX_T / 8; t++) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
            for (int nn = 0; nn < MAX_T / 16; nn++) {
                if (nn >= groups) continue;
                uint32_t b[4];
                ldmatrix_x4(b, sk + (nn * 16 + (lane & 7) + (lane >> 4) * 8) * ATTN_LD + kk * 16 + ((lane >> 3) & 1) * 8);
                mma16816<BF16>(s[2 * nn], qf[kk], b[0], b[1]);
                mma16816<BF16>(s[2 * nn + 1], qf[kk], b[2], b[3]);
            }
        float inv_sum[2];
        masked_softmax_rows<MAX_T / 8>(s, inv_sum, qg * 16, T, seq_of, p.scale_log2, lane);
        float o[D / 8][4];
#pragma unroll
        for (int t = 0; t < D / 8; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < MAX_T / 16; kk++)
            if (kk < groups) mma_pv_step<BF16, D>(o, s[2 * kk], s[2 * kk + 1], sv + kk * 16 * ATTN_LD, ATTN_LD, lane);
        const int row = qg * 16 + lane / 4;
#pragma unroll
        for (int t = 0; t < D / 8; t++) {
            const int c = col + t * 8 + (lane & 3) * 2;
            if (row < T)
                *reinterpret_cast<uint32_t *>(p.context + (size_t)row * H + c) =
                    pack2<BF16>(o[t][0] * inv_sum[0], o[t][1] * inv_sum[0]);
            if (row + 8 < T)
                *reinterpret_cast<uint32_t *>(p.context + (size_t)(row + 8) * H + c) =
                    pack2<BF16>(o[t][2] * inv_sum[1], o[t][3] * inv_sum[1]);
        }
        __syncwarp(); /* the tiles are restaged by the next task */
    }
}

/* ---- the kernel ----------------------------------------------------------------------------- */

__device__ __forceinline__ void barrier(cg::grid_group &grid, int &n) {
    const bool timer = blockIdx.x == 0 && threadIdx.x == 0;
    if (timer) barrier_clock[1 + 2 * n] = clock64();
    grid.sync();
    if (timer) barrier_clock[2 + 2 * n] = clock64();
    n++;
}

template <bool BF16, int D>
__global__ void __launch_bounds__(THREADS, 1) encoder_small_kernel(const __grid_constant__ params p) {
    extern __shared__ __align__(16) unsigned char smem[];
    float *red = reinterpret_cast<float *>(smem);            /* GEMM phases */
    uint16_t *smem_attn = reinterpret_cast<uint16_t *>(smem); /* attention phase */
    __shared__ float2 stats[MAX_T];
    __shared__ int seq_of[MAX_T];
    cg::grid_group grid = cg::this_grid();
    const int T = p.T, H = p.H, I = p.I;
    int barriers = 0;
    if (blockIdx.x == 0 && threadIdx.x == 0) barrier_clock[0] = clock64();

    if (threadIdx.x < T) { /* the sequence of each token; -1 past cu_seqlens[n_seqs] */
        int lo = 0, hi = p.n_seqs - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (p.cu_seqlens[mid] <= (int)threadIdx.x) lo = mid;
            else hi = mid - 1;
        }
        seq_of[threadIdx.x] = (int)threadIdx.x < p.cu_seqlens[p.n_seqs] ? lo : -1;
    }
    prefetch_weights(p.layers[0].qkv_w, H, 3 * H);
    __syncthreads();

    for (int step = 0; step < p.n_steps; step++) {
        const layer_w &L = p.layers[step];
        prefetch_weights(L.out_w, H, H);
        prefetch_weights(L.in_w, H, I);
        prefetch_weights(L.ffn_out_w, I, H);
        if (step + 1 < p.n_steps) prefetch_weights(p.layers[step + 1].qkv_w, H, 3 * H);

        /* A: qkv = x · Wqkvᵀ + b, x = LN(s2) of the layer before (stored: phase C's residual) */
        if (step == 0) {
            const gemm_args qkv = {p.hidden, nullptr, nullptr, L.qkv_w, L.qkv_b, nullptr, p.qkv, H, 3 * H, -1};
            mark(barriers, 0);
            gemm_phase<BF16>(qkv, T, stats, red, barriers);
        } else {
            const layer_w &prev = p.layers[step - 1];
            row_stats<BF16>(p.sums, T, H, p.eps, stats);
            __syncthreads();
            store_normalised_idle<BF16>(p.hidden, p.sums, prev.ln2_w, prev.ln2_b, stats, T, H, 3 * H);
            /* (built whole, as every phase's arguments are: a version that set the LayerNorm
             * fields on the step-0 arguments afterwards read the wrong operand on the GPU; the
             * two-layer check of test_small_kernel_phases caught it) */
            const gemm_args qkv = {p.sums, prev.ln2_w, prev.ln2_b, L.qkv_w, L.qkv_b, nullptr, p.qkv, H, 3 * H, -1};
            mark(barriers, 0);
            gemm_phase<BF16>(qkv, T, stats, red, barriers);
        }
        barrier(grid, barriers);

        /* B: context = attention(qkv) */
        attention_phase<BF16, D>(p, seq_of, smem_attn);
        barrier(grid, barriers);

        /* C: s1 = context · Woᵀ + bo + x */
        const gemm_args out = {p.context, nullptr, nullptr, L.out_w, L.out_b, p.hidden, p.sums, H, H, -1};
        mark(barriers, 0);
        gemm_phase<BF16>(out, T, stats, red, barriers);
        barrier(grid, barriers);

        /* D: x1 = LN(s1) (stored to context: phase E's residual); ffn = act(x1 · W1ᵀ + b1) */
        row_stats<BF16>(p.sums, T, H, p.eps, stats);
        __syncthreads();
        store_normalised_idle<BF16>(p.context, p.sums, L.ln1_w, L.ln1_b, stats, T, H, I);
        const gemm_args in = {p.sums, L.ln1_w, L.ln1_b, L.in_w, L.in_b, nullptr, p.ffn, H, I, p.act};
        mark(barriers, 0);
        gemm_phase<BF16>(in, T, stats, red, barriers);
        barrier(grid, barriers);

        /* E: s2 = ffn · W2ᵀ + b2 + x1 */
        const gemm_args ffn_out = {p.ffn, nullptr, nullptr, L.ffn_out_w, L.ffn_out_b, p.context, p.sums, I, H, -1};
        mark(barriers, 0);
        gemm_phase<BF16>(ffn_out, T, stats, red, barriers);
        barrier(grid, barriers);
    }
    /* hidden = LN(s2) of the last layer */
    const layer_w &last = p.layers[p.n_steps - 1];
    row_stats<BF16>(p.sums, T, H, p.eps, stats);
    __syncthreads();
    store_normalised<BF16>(p.hidden, p.sums, last.ln2_w, last.ln2_b, stats, T, H, blockIdx.x, gridDim.x);
}

int mode_value = -1; /* -1: NOPAD_ENCODER_SMALL not read yet */
long launches = 0;   /* kernels launched (or recorded into a graph), for tests */

} // namespace

extern "C" int cuda_encoder_small_supported(int32_t n_tokens, int32_t n_steps, int32_t hidden, int32_t n_heads,
                                            int32_t head_size, int32_t intermediate) {
    return n_tokens >= 1 && n_tokens <= MAX_T && n_steps >= 1 && n_steps <= CUDA_ENCODER_SMALL_MAX_STEPS &&
           hidden >= 32 && hidden <= MAX_HIDDEN && hidden % 32 == 0 && (head_size == 32 || head_size == 64) &&
           n_heads >= 1 && n_heads * head_size == hidden && intermediate >= 32 && intermediate % 32 == 0;
}

extern "C" void cuda_encoder_small_set_mode(int mode) { mode_value = mode < 0 ? -1 : mode != 0; }

extern "C" int cuda_encoder_small_takes(int32_t n_tokens, int32_t n_steps, int32_t hidden, int32_t n_heads,
                                        int32_t head_size, int32_t intermediate) {
    if (mode_value < 0) {
        /* off unless NOPAD_ENCODER_SMALL=1 until measured on a GPU */
        const char *env = getenv("NOPAD_ENCODER_SMALL");
        mode_value = env && env[0] == '1';
    }
    return mode_value && cuda_encoder_small_supported(n_tokens, n_steps, hidden, n_heads, head_size, intermediate);
}

extern "C" nopad_status cuda_encoder_small(nopad_dtype dtype, void *hidden, const encoder_layer *const *schedule,
                                           int32_t n_steps, const int32_t *cu_seqlens, int32_t n_seqs,
                                           int32_t n_tokens, int32_t hidden_size, int32_t n_heads, int32_t head_size,
                                           int32_t intermediate, float eps, float scale, int act, void *qkv,
                                           void *context, void *sums, void *ffn, void *stream) {
    const char *what = "small-batch encoder kernel";
    if (dtype != NOPAD_DTYPE_F16 && dtype != NOPAD_DTYPE_BF16)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: dtype must be F16 or BF16", what);
    if (!cuda_encoder_small_supported(n_tokens, n_steps, hidden_size, n_heads, head_size, intermediate))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: T %d, %d layers, hidden %d = %d heads of %d, intermediate %d (needs T <= %d, "
                               "<= %d layers, hidden <= %d and %% 32 == 0, head size 32 or 64, intermediate %% 32 == 0)",
                               what, n_tokens, n_steps, hidden_size, n_heads, head_size, intermediate, MAX_T,
                               CUDA_ENCODER_SMALL_MAX_STEPS, MAX_HIDDEN);
    if (!hidden || !qkv || !context || !sums || !ffn || !cu_seqlens || !schedule || n_seqs < 1 || !(eps > 0.0f))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: NULL buffer, no sequences or eps <= 0", what);
    params p = {};
    p.hidden = static_cast<uint16_t *>(hidden), p.qkv = static_cast<uint16_t *>(qkv);
    p.context = static_cast<uint16_t *>(context), p.sums = static_cast<uint16_t *>(sums);
    p.ffn = static_cast<uint16_t *>(ffn);
    p.cu_seqlens = cu_seqlens, p.n_seqs = n_seqs, p.T = n_tokens, p.H = hidden_size, p.I = intermediate;
    p.heads = n_heads, p.act = act, p.n_steps = n_steps, p.eps = eps, p.scale_log2 = scale * 1.4426950408889634f;
    uintptr_t align = (uintptr_t)hidden | (uintptr_t)qkv | (uintptr_t)context | (uintptr_t)sums | (uintptr_t)ffn;
    for (int s = 0; s < n_steps; s++) {
        const encoder_layer *L = schedule[s];
        if (!L) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: layer %d has no weights", what, s);
        const void *const ptrs[12] = {L->qkv_weight, L->qkv_bias,     L->attn_out_weight, L->attn_out_bias,
                                      L->attn_ln_weight, L->attn_ln_bias, L->ffn_in_weight, L->ffn_in_bias,
                                      L->ffn_out_weight, L->ffn_out_bias, L->ffn_ln_weight, L->ffn_ln_bias};
        static const char *const names[12] = {"qkv weight", "qkv bias", "attention-out weight", "attention-out bias",
                                              "attention LayerNorm weight", "attention LayerNorm bias", "FFN-in weight",
                                              "FFN-in bias", "FFN-out weight", "FFN-out bias", "FFN LayerNorm weight",
                                              "FFN LayerNorm bias"};
        for (int i = 0; i < 12; i++) {
            if (!ptrs[i])
                return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: layer %d has no %s (every bias and LayerNorm is required)",
                                       what, s, names[i]);
            align |= (uintptr_t)ptrs[i];
        }
        layer_w &w = p.layers[s];
        w.qkv_w = (const uint16_t *)L->qkv_weight, w.qkv_b = (const uint16_t *)L->qkv_bias;
        w.out_w = (const uint16_t *)L->attn_out_weight, w.out_b = (const uint16_t *)L->attn_out_bias;
        w.ln1_w = (const uint16_t *)L->attn_ln_weight, w.ln1_b = (const uint16_t *)L->attn_ln_bias;
        w.in_w = (const uint16_t *)L->ffn_in_weight, w.in_b = (const uint16_t *)L->ffn_in_bias;
        w.ffn_out_w = (const uint16_t *)L->ffn_out_weight, w.ffn_out_b = (const uint16_t *)L->ffn_out_bias;
        w.ln2_w = (const uint16_t *)L->ffn_ln_weight, w.ln2_b = (const uint16_t *)L->ffn_ln_bias;
    }
    if (align & 15u) return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: buffers and weights must be 16-byte aligned", what);

    void (*kernel)(params) = dtype == NOPAD_DTYPE_BF16 ? (head_size == 32 ? encoder_small_kernel<true, 32>
                                                                          : encoder_small_kernel<true, 64>)
                                                       : (head_size == 32 ? encoder_small_kernel<false, 32>
                                                                          : encoder_small_kernel<false, 64>);
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        cudaGetLastError();
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: no current device below 64", what);
    }
    /* per device and kernel: the shared-memory limit, and how many CTAs can be resident at once */
    static int grid_of[64][4];
    const int ki = (dtype == NOPAD_DTYPE_BF16) * 2 + (head_size == 64);
    if (!grid_of[dev][ki]) {
        int sms = 0, per_sm = 0;
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM_BYTES) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, THREADS, SMEM_BYTES) != cudaSuccess) {
            const cudaError_t e = cudaGetLastError();
            return nopad_set_error(NOPAD_ERR_BACKEND, "%s: %s", what, cudaGetErrorString(e));
        }
        if (per_sm < 1) return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: no CTA fits an SM", what);
        grid_of[dev][ki] = sms; /* one CTA per SM: the barriers need every CTA resident */
    }
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid_of[dev][ki]);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = SMEM_BYTES;
    cfg.stream = static_cast<cudaStream_t>(stream);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, p);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return nopad_set_error(NOPAD_ERR_BACKEND, "%s: launch: %s", what, cudaGetErrorString(err));
    }
    launches++;
    return NOPAD_OK;
}

extern "C" long cuda_encoder_small_launches(void) { return launches; }

extern "C" int cuda_encoder_small_phase_cycles(long long *work, long long *wait, long long (*gemm)[3],
                                               int max_phases) {
    long long clk[1 + 2 * MAX_BARRIERS], detail[MAX_BARRIERS][3];
    if (cudaMemcpyFromSymbol(clk, barrier_clock, sizeof clk) != cudaSuccess ||
        cudaMemcpyFromSymbol(detail, detail_clock, sizeof detail) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    int n = 0;
    for (; n < max_phases && n < MAX_BARRIERS && clk[2 + 2 * n] != 0; n++) {
        const long long start = n == 0 ? clk[0] : clk[2 * n];
        work[n] = clk[1 + 2 * n] - start;
        wait[n] = clk[2 + 2 * n] - clk[1 + 2 * n];
        for (int j = 0; j < 3; j++) gemm[n][j] = detail[n][j] ? detail[n][j] - start : 0;
    }
    return n;
}

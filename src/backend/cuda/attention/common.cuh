/* What the fused attention kernels share: where a CTA's sequence, head and query rows are in the
 * packed qkv [T, 3, heads, D] (prologue), the normalisation of O by the row sums and its store
 * into out [T, heads * D] (epilogue), and for the mma.sync kernels (attention/mma.cu,
 * deberta/attention_rel.cu, train/attention_backward.cu) the tile loads, the online softmax of a
 * key tile and the staged store of a warp's rows. */
#ifndef NOPAD_BACKEND_CUDA_ATTENTION_COMMON_CUH
#define NOPAD_BACKEND_CUDA_ATTENTION_COMMON_CUH

#include <math.h>
#include <stdint.h>

#include "backend/cuda/attention/kernels.h"
#include "backend/cuda/ptx_helpers.cuh"
#include "util/philox.h"

/* One head of one sequence in the packed qkv: q, k and v point at the sequence's row 0 of the
 * head's Q, K and V columns; consecutive rows are row_stride elements apart. */
struct attention_head {
    const uint16_t *q, *k, *v;
    int hidden;        // heads * D: the row length of out
    size_t row_stride; // 3 * hidden: the row length of qkv
};

template <int D>
static __device__ __forceinline__ attention_head attention_head_of(const uint16_t *qkv, int start, int head,
                                                                  int n_heads) {
    attention_head h;
    h.hidden = n_heads * D;
    h.row_stride = (size_t)3 * h.hidden;
    h.q = qkv + (size_t)start * h.row_stride + (size_t)head * D;
    h.k = h.q + h.hidden;
    h.v = h.q + 2 * h.hidden;
    return h;
}

/* 1 / the row sum, or 0 for a row that saw no key (causal rows past every key stay zero). */
static __device__ __forceinline__ float row_sum_inverse(float l) { return l > 0.0f ? 1.0f / l : 0.0f; }

/* The m16 accumulator layout of mma.sync and wgmma: a thread holds rows lane/4 and lane/4 + 8 of its
 * warp's 16, each quad (four lanes) a row's partial sums. inv[r] = 1 / the whole row's sum. */
static __device__ __forceinline__ void quad_row_inverse(const float l_run[2], float inv[2]) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = l_run[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        inv[r] = row_sum_inverse(l);
    }
}

/* Copies rows [row0, row0+ROWS) of one head's Q, K or V (src points at row 0 of the sequence;
 * row0 < len) into a shared tile [ROWS][D+8]; rows at or past `len` are zero-filled, their source
 * address clamped to the last row so that it stays mapped. The 8-element pad per row spreads
 * ldmatrix's eight 16-byte row reads over all 32 banks. Thread t copies chunk t % CHUNKS of rows
 * t / CHUNKS + i * THREADS / CHUNKS: per-thread constant offsets and one 64-bit base per tile, as in
 * wgmma.cu's load_tile_sw (a 64-bit multiply and a bounds check per chunk cost the wgmma kernels
 * 10-20%; docs/attention.md). */
template <int ROWS, int D, int THREADS>
static __device__ __forceinline__ void load_tile(uint16_t *dst, const uint16_t *src, size_t row_stride,
                                                 int row0, int len, int tid) {
    constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
    constexpr int LDS = D + 8;
    constexpr int ROW_STEP = THREADS / CHUNKS;  // rows between a thread's chunks
    static_assert(THREADS % CHUNKS == 0 && ROWS % ROW_STEP == 0, "whole rows per pass");
    const uint16_t *tile = src + (size_t)row0 * row_stride;
    const int last = len - row0 - 1;  // >= 0
    const int r0 = tid / CHUNKS, ch = tid % CHUNKS;
#pragma unroll
    for (int i = 0; i < ROWS / ROW_STEP; i++) {
        const int r = r0 + i * ROW_STEP;
        cp_async16(dst + r * LDS + ch * 8, tile + (min(r, last) * (int)row_stride + ch * 8), r <= last);
    }
}

/* One key tile's online softmax in the mma.sync layout (the 4 threads of a quad share a row): s
 * [NT][4] raw scores in, exp2(scale_log2·s - running max) out; the running max m_run, sum l_run
 * and the output accumulators o [DT][4] rescaled. Scores of -inf (masked) give 0; a row with no
 * visible key yet (causal) keeps -inf as its max and subtracts 0, so exp2 gives 0, not NaN. */
template <int NT, int DT>
static __device__ __forceinline__ void online_softmax_tile(float (*s)[4], float (*o)[4], float m_run[2],
                                                           float l_run[2], float scale_log2) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = -INFINITY;
#pragma unroll
        for (int t = 0; t < NT; t++) mx = fmaxf(mx, fmaxf(s[t][2 * r], s[t][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run[r], mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new * scale_log2;
        const float alpha = fast_exp2(fmaf(m_run[r], scale_log2, -m_use));
        m_run[r] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++) {  /* one FFMA + one MUFU per score */
            s[t][2 * r] = fast_exp2(fmaf(s[t][2 * r], scale_log2, -m_use));
            s[t][2 * r + 1] = fast_exp2(fmaf(s[t][2 * r + 1], scale_log2, -m_use));
            sum += s[t][2 * r] + s[t][2 * r + 1];
        }
        l_run[r] = l_run[r] * alpha + sum;
#pragma unroll
        for (int t = 0; t < DT; t++) {
            o[t][2 * r] *= alpha;
            o[t][2 * r + 1] *= alpha;
        }
    }
}

/* A warp's 16 output rows from its mma.sync accumulators o [D/8][4] times inv (quad_row_inverse):
 * rounded into the warp's staging rows sO [16][D+8] (free shared memory: the caller synchronises
 * before), then stored with 16-byte writes to out rows row0 .. row0 + 15 of the sequence starting
 * at packed row `start`, those below len, columns head·D .. head·D + D - 1 of rows `hidden` long. */
template <bool BF16, int D>
static __device__ __forceinline__ void store_warp_rows(uint16_t *out, uint16_t *sO, const float (*o)[4],
                                                       const float inv[2], int lane, int row0, int len,
                                                       int start, int hidden, int head) {
    constexpr int LDS = D + 8, CHUNKS = D / 8;
#pragma unroll
    for (int t = 0; t < D / 8; t++) {
        const int col = t * 8 + (lane & 3) * 2;
        *reinterpret_cast<uint32_t *>(sO + (lane / 4) * LDS + col) = pack2<BF16>(o[t][0] * inv[0], o[t][1] * inv[0]);
        *reinterpret_cast<uint32_t *>(sO + (lane / 4 + 8) * LDS + col) = pack2<BF16>(o[t][2] * inv[1], o[t][3] * inv[1]);
    }
    __syncwarp();
#pragma unroll
    for (int c = lane; c < 16 * CHUNKS; c += 32) {
        const int r = c / CHUNKS, ch = c % CHUNKS;
        const int row = row0 + r;
        if (row < len)
            *reinterpret_cast<uint4 *>(out + (size_t)(start + row) * hidden + (size_t)head * D + ch * 8) =
                *reinterpret_cast<const uint4 *>(sO + r * LDS + ch * 8);
    }
}

/* The number that keys sequence seq's dropout masks: its example's, or seq when none is given. */
static __device__ __forceinline__ uint64_t attention_dropout_example(const attention_dropout_params &d, int seq) {
    return d.examples ? (uint64_t)d.examples[seq] : (uint64_t)seq;
}

/* Training's attention dropout on the m16 accumulator layout: the mask factors (d.scale or 0) of
 * the eight scores a thread holds in two neighbouring n8 tiles, z[dt][e] for tile dt (0, 1) and
 * element e: row r0 + 8·(e >> 1), column c0 + 8·dt + (e & 1). r0 is the thread's first row of
 * its 16 (bit 3 clear: the 16-row groups start on multiples of 16), c0 the pair's first column
 * + 2·(lane & 3) (the pair starts on a multiple of 16). QROWS: rows are queries (the forward's
 * S), else keys (the backward's Sᵀ). The four scores {i, i+8} x {j, j+8} of a column pair share
 * one Philox block (util/philox.h), so two blocks cover the eight. */
template <bool QROWS>
static __device__ __forceinline__ void attention_dropout_pair(float z[2][4], const attention_dropout_params &d,
                                                              int head, uint64_t example, int r0, int c0) {
#pragma unroll
    for (int b = 0; b < 2; b++) {
        const uint32_t row = (uint32_t)r0, col = (uint32_t)(c0 + b);
        uint32_t w[4];
        attention_dropout_block(d.key, d.site, (uint32_t)head, example, QROWS ? row : col, QROWS ? col : row, w);
#pragma unroll
        for (int dt = 0; dt < 2; dt++)
#pragma unroll
            for (int rh = 0; rh < 2; rh++) /* word ((i >> 3) & 1)·2 + ((j >> 3) & 1) */
                z[dt][rh * 2 + b] = w[QROWS ? rh * 2 + dt : dt * 2 + rh] >= d.threshold ? d.scale : 0.0f;
    }
}

/* The forward's dropout on a key tile of probabilities in the m16 accumulator layout: s holds NT
 * n8 tiles of 4 (s[4t + e]: row row_a + 8·(e >> 1), key n0 + 8t + 2·(lane & 3) + (e & 1); row_a
 * with bit 3 clear, n0 a multiple of 16), each multiplied by its mask factor. */
template <int NT>
static __device__ __forceinline__ void attention_dropout_tile(float *s, const attention_dropout_params &d, int head,
                                                              uint64_t example, int row_a, int n0, int lane) {
#pragma unroll
    for (int tp = 0; tp < NT / 2; tp++) {
        float z[2][4];
        attention_dropout_pair<true>(z, d, head, example, row_a, n0 + tp * 16 + (lane & 3) * 2);
#pragma unroll
        for (int dt = 0; dt < 2; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[4 * (2 * tp + dt) + e] *= z[dt][e];
    }
}

#endif

/* CUDA: varlen attention for training on the packed QKV, head sizes 32, 64 and 128.
 *
 * Forward with lse (cuda_attention_lse): the inference kernels, which write each query row's
 * log-sum-exp from their epilogue when given an lse pointer (inference passes NULL; their main
 * loops are unchanged): at d = 64 and 128 the wgmma kernels of attention/wgmma.cu with the
 * dispatcher's tile rule (the mma.sync kernel measured 165 TFLOP/s on BERT-large's forward, the
 * wgmma one is the faster inference path there), at d = 32 the mma.sync kernels of attention/mma.cu.
 *
 * A backward of 128 keys a CTA (8 warps, float4 dQ atomics, one barrier a query block, longest
 * sequences first) lost to this one on an H200 (BERT-large's attention, 24 layers: 0.300 against
 * 0.291 ms a layer; docs/training.md): the kernel is latency-bound, not atomic-bound.
 *
 * Backward (cuda_attention_backward), FlashAttention-2's algorithm, three kernels on the stream:
 *   1. dsum [T, heads] = rowsum(dout ⊙ out) in float32 (D_i of the paper), and dq32 zeroed;
 *   2. the main kernel, one CTA of 4 warps per (block of 64 keys, head, sequence): K_j and V_j stay
 *      in shared memory, dK_j and dV_j in registers (each warp owns 16 keys), and the CTA walks the
 *      query blocks that can see its keys (BLOCK_M = 64 rows; 32 at d = 128 to keep the registers
 *      and two CTAs a SM):
 *          Sᵀ  = K_j·Q_iᵀ            [16 keys x BLOCK_M] per warp (the transpose, so that Pᵀ and
 *          dPᵀ = V_j·dO_iᵀ                                 dSᵀ are A fragments as they stand)
 *          Pᵀ  = exp(scale·Sᵀ - lse)                        (float32; masked entries 0)
 *          dSᵀ = Pᵀ ⊙ (dPᵀ - dsum)
 *          dV_j += Pᵀ·dO_i,  dK_j += dSᵀ·Q_i               (P, dS rounded to the dtype for the MMA)
 *          dQ_i += dS·K_j   (dSᵀ through shared memory; each warp a [16 x D/split] slice; float32
 *                            atomic adds into dq32 [T, heads, D])
 *   3. dqkv's Q part = scale·dq32, rounded.
 * dQ accumulates by atomics rather than in a second pass over the keys: a separate dQ kernel
 * would recompute S and dP (two of the five GEMMs of the loop) for every (query, key) block;
 * atomics cost one float2 reduction per accumulator element and key block, which L2 absorbs (FA2
 * does the same). The price: dQ's float32 sum order varies between runs (differences of a few
 * float32 ulps before rounding to the dtype), so the backward is not bitwise deterministic.
 *
 * Attention dropout (backend.h, nopad_attention_dropout): the forward runs the DROPOUT
 * instantiation of attention/wgmma.cu's one-warpgroup 64-key kernel (d = 64, 128; attention/mma.cu's
 * 64 x 64 kernel at d = 32 or with NOPAD_FMHA_WGMMA=0), which multiplies each key tile's
 * probabilities by their mask factors after the softmax has summed them; the
 * backward's DROPOUT instantiation regenerates the factors Zᵀ from the same Philox counters (two
 * n-tiles of Sᵀ, eight scores, per two Philox blocks: attention_dropout_pair in common.cuh), dV
 * takes Pᵀ ⊙ Zᵀ and dSᵀ = Pᵀ ⊙ (Zᵀ ⊙ dPᵀ - dsum); dsum = rowsum(dout ⊙ out) needs no change, out
 * being the dropped output.
 *
 * Causal (top-left = bottom-right here, query and key lengths being equal): a key block only
 * visits query blocks from the one holding its first key (earlier queries see none of its keys),
 * and masks scores only in blocks that cross the diagonal or a sequence's end. Nothing is padded:
 * the grid is (ceil(max_seqlen / 64), heads, sequences) and CTAs past their sequence's end exit.
 *
 * mma.m16n8k16 fragment layouts used throughout (lane = thread % 32, g = lane / 4, c = lane % 4):
 *   A (16x16, row-major)  a[0] = (row g, cols 2c, 2c+1), a[1] = row g+8, a[2] = cols +8, a[3] = both
 *   B (16x8, "col")       b[0] = (k 2c, 2c+1; col g), b[1] = k + 8
 *   C (16x8, float)       c[0], c[1] = (row g, cols 2c, 2c+1), c[2], c[3] = row g + 8
 * So the accumulators of two neighbouring n8 tiles (cols 0-7 and 8-15) are, packed in pairs, the A
 * fragment of one k16 step (mma_pv_step in ptx_helpers.cuh relies on it, and so does this file). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "backend/cuda/attention/common.cuh"
#include "backend/cuda/attention/kernels.h"
#include "backend/cuda/common.h"
#include "backend/cuda/ptx_helpers.cuh"
#include "backend/cuda/train/attention_backward.h"
extern "C" {
#include "util/error.h"
#include "util/knobs.h"
}

enum { BWD_WARPS = 4, BWD_THREADS = BWD_WARPS * 32, BWD_BLOCK_N = 16 * BWD_WARPS };

/* ---- shared-memory staging ----------------------------------------------------------------------- */

/* 4-byte async copy global -> shared, zero-filled when !valid. */
static __device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
}

/* ---- 1. dsum = rowsum(dout ⊙ out) ------------------------------------------------------------------- */

/* One (token, head) row per group of D/8 threads, each reading 16 bytes of dout and of out. */
template <int D, bool BF16>
__global__ void __launch_bounds__(256) attention_bwd_dsum_kernel(float *__restrict__ dsum,          // [T, heads]
                                                                 const uint16_t *__restrict__ dout,  // [T, heads*D]
                                                                 const uint16_t *__restrict__ out,   // [T, heads*D]
                                                                 int64_t rows) {
    constexpr int G = D / 8;  // threads per row: 4, 8 or 16 (a power of two dividing 32)
    const int64_t gid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t row = gid / G;
    const int part = (int)(gid % G);
    float acc = 0.0f;
    if (row < rows) {
        const uint4 a = *reinterpret_cast<const uint4 *>(dout + row * D + part * 8);
        const uint4 b = *reinterpret_cast<const uint4 *>(out + row * D + part * 8);
        const uint32_t *pa = reinterpret_cast<const uint32_t *>(&a), *pb = reinterpret_cast<const uint32_t *>(&b);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 fa, fb;
            if (BF16) {
                fa = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&pa[i]));
                fb = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&pb[i]));
            } else {
                fa = __half22float2(*reinterpret_cast<const __half2 *>(&pa[i]));
                fb = __half22float2(*reinterpret_cast<const __half2 *>(&pb[i]));
            }
            acc = fmaf(fa.x, fb.x, acc);
            acc = fmaf(fa.y, fb.y, acc);
        }
    }
#pragma unroll
    for (int o = G / 2; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (row < rows && part == 0) dsum[row] = acc;
}

/* ---- 3. dq (the Q third of dqkv) = scale·dq32 ------------------------------------------------------- */

template <bool BF16>
__global__ void __launch_bounds__(256) attention_bwd_dq_kernel(uint16_t *__restrict__ dqkv,      // [T, 3, hidden]
                                                               const float *__restrict__ dq32,  // [T, hidden]
                                                               int hidden, int64_t n_chunks, float scale) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;  // chunk of 8 elements
    if (i >= n_chunks) return;
    const int64_t e = i * 8, t = e / hidden;
    const int col = (int)(e - t * hidden);
    const float4 lo = *reinterpret_cast<const float4 *>(dq32 + e);
    const float4 hi = *reinterpret_cast<const float4 *>(dq32 + e + 4);
    const float v[8] = {lo.x * scale, lo.y * scale, lo.z * scale, lo.w * scale,
                        hi.x * scale, hi.y * scale, hi.z * scale, hi.w * scale};
    *reinterpret_cast<uint4 *>(dqkv + t * 3 * hidden + col) = pack8<BF16>(v);
}

/* ---- 2. the main kernel ------------------------------------------------------------------------------- */

template <int D, int BLOCK_M, bool BF16, bool DROPOUT>
__global__ void __launch_bounds__(BWD_THREADS)
attention_bwd_kernel(uint16_t *__restrict__ dqkv,             // [T, 3, heads, D]: the K and V thirds
                     float *__restrict__ dq32,                // [T, heads, D], zeroed: += dS·K
                     const uint16_t *__restrict__ qkv,        // [T, 3, heads, D]
                     const uint16_t *__restrict__ dout,       // [T, heads*D]
                     const float *__restrict__ lse,           // [T, heads]
                     const float *__restrict__ dsum,          // [T, heads]
                     const int32_t *__restrict__ cu_seqlens,  // [B+1]
                     int seq_offset, int n_heads, float scale, int causal,
                     attention_dropout_params drop) {          // used when DROPOUT
    constexpr int BLOCK_N = BWD_BLOCK_N;
    constexpr int LDS = D + 8;         // row pitch of the Q, dO, K, V tiles
    constexpr int LDS_S = BLOCK_M + 8; // row pitch of dSᵀ [BLOCK_N][BLOCK_M]
    constexpr int MT = BLOCK_M / 8;    // n8 tiles of Sᵀ per warp (query columns)
    constexpr int DT = D / 8;          // n8 tiles of dK, dV per warp
    /* the dQ step: BLOCK_M / 16 row groups of 16 queries, the warps left over split D */
    constexpr int QG = BLOCK_M / 16;
    constexpr int DSPLIT = BWD_WARPS / QG;
    constexpr int DW = D / DSPLIT;
    static_assert(BWD_WARPS % QG == 0 && DW % 16 == 0, "the dQ step's warp split");
    constexpr float LOG2E = 1.4426950408889634f;

    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *sK = smem;                     // [BLOCK_N][LDS]
    uint16_t *sV = sK + BLOCK_N * LDS;       // [BLOCK_N][LDS]
    uint16_t *sQ = sV + BLOCK_N * LDS;       // [2][BLOCK_M][LDS] (double-buffered by query block)
    uint16_t *sdO = sQ + 2 * BLOCK_M * LDS;  // [2][BLOCK_M][LDS]
    uint16_t *sdS = sdO + 2 * BLOCK_M * LDS; // [BLOCK_N][LDS_S]: dSᵀ, key-major
    float *sL = reinterpret_cast<float *>(sdS + BLOCK_N * LDS_S); // [2][BLOCK_M] lse
    float *sDs = sL + 2 * BLOCK_M;                                // [2][BLOCK_M] dsum

    const int seq = seq_offset + blockIdx.z, head = blockIdx.y;
    const int start = cu_seqlens[seq];
    const int len = cu_seqlens[seq + 1] - start;
    const int n0 = blockIdx.x * BLOCK_N;  // this CTA's first key
    if (n0 >= len) return;
    const uint64_t example = DROPOUT ? attention_dropout_example(drop, seq) : 0; // keys the masks

    const int hidden = n_heads * D;
    const size_t row_stride = (size_t)3 * hidden;
    const uint16_t *q_g = qkv + (size_t)start * row_stride + (size_t)head * D;  // row 0 of the head's Q
    const uint16_t *k_g = q_g + hidden, *v_g = q_g + 2 * hidden;
    const uint16_t *do_g = dout + (size_t)start * hidden + (size_t)head * D;   // rows `hidden` apart
    const float *lse_g = lse + (size_t)start * n_heads + head;                 // rows n_heads apart
    const float *dsum_g = dsum + (size_t)start * n_heads + head;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    /* causal: queries before n0 see none of these keys */
    const int m_begin = causal ? (n0 / BLOCK_M) * BLOCK_M : 0;
    const int n_iters = (len - m_begin + BLOCK_M - 1) / BLOCK_M;

    /* query block m0's Q, dO, lse and dsum into buffer b; rows past len zero-filled (their lse of 0
     * is harmless: those scores are masked) */
    auto load_query_block = [&](int m0, int b) {
        load_tile<BLOCK_M, D, BWD_THREADS>(sQ + b * BLOCK_M * LDS, q_g, row_stride, m0, len, tid);
        load_tile<BLOCK_M, D, BWD_THREADS>(sdO + b * BLOCK_M * LDS, do_g, (size_t)hidden, m0, len, tid);
        if (tid < BLOCK_M) {
            const int q = min(m0 + tid, len - 1);
            cp_async4(sL + b * BLOCK_M + tid, lse_g + (size_t)q * n_heads, m0 + tid < len);
            cp_async4(sDs + b * BLOCK_M + tid, dsum_g + (size_t)q * n_heads, m0 + tid < len);
        }
    };
    load_tile<BLOCK_N, D, BWD_THREADS>(sK, k_g, row_stride, n0, len, tid);
    load_tile<BLOCK_N, D, BWD_THREADS>(sV, v_g, row_stride, n0, len, tid);
    load_query_block(m_begin, 0);
    cp_async_commit();

    /* dK_j, dV_j of this warp's 16 keys [16 x D]: C fragments, rows = keys */
    float dk[DT][4], dv[DT][4];
#pragma unroll
    for (int t = 0; t < DT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[t][e] = dv[t][e] = 0.0f;

    const float scale_log2 = scale * LOG2E;
    const int key_w = n0 + warp * 16;  // this warp's first key (the row of its C fragments' g = 0)

    for (int it = 0; it < n_iters; it++) {
        const int m0 = m_begin + it * BLOCK_M, b = it & 1;
        cp_async_wait_all();
        __syncthreads();  // block `it` visible to all; every warp is done with buffer b^1 and with sdS
        if (it + 1 < n_iters) {
            load_query_block(m0 + BLOCK_M, b ^ 1);
            cp_async_commit();
        }
        const uint16_t *q_s = sQ + b * BLOCK_M * LDS, *do_s = sdO + b * BLOCK_M * LDS;
        const float *l_s = sL + b * BLOCK_M, *ds_s = sDs + b * BLOCK_M;

        /* Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ, [16 keys x BLOCK_M queries] per warp. A: the warp's 16
         * K (V) rows, row-major [key][d]; B = Qᵀ: Q rows [query][d] are B's columns, contiguous in
         * k = d, so plain ldmatrix: matrices (queries 0-7, d 0-7), (0-7, d 8-15), (8-15, 0-7),
         * (8-15, 8-15) give b[0], b[1] of n-tile 2nn and b[2], b[3] of n-tile 2nn+1. */
        float s[MT][4], dp[MT][4];
#pragma unroll
        for (int t = 0; t < MT; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[t][e] = dp[t][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t ak[4], av[4];
            ldmatrix_x4(ak, sK + (warp * 16 + (lane & 15)) * LDS + kk * 16 + (lane >> 4) * 8);
            ldmatrix_x4(av, sV + (warp * 16 + (lane & 15)) * LDS + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int nn = 0; nn < MT / 2; nn++) {
                const int boff = (nn * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + kk * 16 + ((lane >> 3) & 1) * 8;
                uint32_t bq[4], bo[4];
                ldmatrix_x4(bq, q_s + boff);
                mma16816<BF16>(s[2 * nn], ak, bq[0], bq[1]);
                mma16816<BF16>(s[2 * nn + 1], ak, bq[2], bq[3]);
                ldmatrix_x4(bo, do_s + boff);
                mma16816<BF16>(dp[2 * nn], av, bo[0], bo[1]);
                mma16816<BF16>(dp[2 * nn + 1], av, bo[2], bo[3]);
            }
        }

        /* Pᵀ = exp2(scale_log2·S - lse·log2 e) in s, dSᵀ = Pᵀ ⊙ (dPᵀ - dsum) in dp. Element e of
         * n-tile t: key key_w + g + 8·(e/2), query m0 + 8t + 2c + e%2. Masked (0): keys past the
         * sequence (their zero K rows would otherwise give exp(-lse)), queries past it, and keys
         * after the query under causal; only blocks crossing one of those edges test. With dropout,
         * s = Pᵀ ⊙ Zᵀ (what weighted V) and dSᵀ = Pᵀ ⊙ (Zᵀ ⊙ dPᵀ - dsum), the forward's Z
         * regenerated from the counters two n-tiles at a time. */
        const bool edge = m0 + BLOCK_M > len || n0 + BLOCK_N > len || (causal && n0 + BLOCK_N - 1 > m0);
        float z[2][4]; // the mask factors of n-tiles t & ~1 and t | 1 (DROPOUT)
#pragma unroll
        for (int t = 0; t < MT; t++) {
            const int qc = t * 8 + (lane & 3) * 2;  // query column of e = 0 within the block
            const float2 l2 = *reinterpret_cast<const float2 *>(l_s + qc);
            const float2 d2 = *reinterpret_cast<const float2 *>(ds_s + qc);
            if constexpr (DROPOUT) {
                if ((t & 1) == 0) attention_dropout_pair<false>(z, drop, head, example, key_w + lane / 4, m0 + qc);
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float lq = (e & 1) ? l2.y : l2.x, dq = (e & 1) ? d2.y : d2.x;
                float p = fast_exp2(fmaf(s[t][e], scale_log2, -lq * LOG2E));
                if (edge) {
                    const int key = key_w + lane / 4 + (e >> 1) * 8, q = m0 + qc + (e & 1);
                    if (key >= len || q >= len || (causal && key > q)) p = 0.0f;
                }
                if constexpr (DROPOUT) {
                    const float zz = z[t & 1][e];
                    s[t][e] = p * zz;
                    dp[t][e] = p * (dp[t][e] * zz - dq);
                } else {
                    s[t][e] = p;
                    dp[t][e] = p * (dp[t][e] - dq);
                }
            }
        }

        /* dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i (scale applied at the end): A = the accumulators of
         * n-tiles 2kk, 2kk+1 (queries 16kk..16kk+15 = the k16 step); B = dO (Q) rows [query][d],
         * row-major in k = query: ldmatrix.trans (mma_pv_step). */
#pragma unroll
        for (int kk = 0; kk < MT / 2; kk++) {
            mma_pv_step<BF16, D>(dv, s[2 * kk], s[2 * kk + 1], do_s + kk * 16 * LDS, LDS, lane);
            mma_pv_step<BF16, D>(dk, dp[2 * kk], dp[2 * kk + 1], q_s + kk * 16 * LDS, LDS, lane);
        }

        /* dSᵀ to shared memory, key-major [key][query], the same rounding as the dK MMA's A: thread
         * (g, c) writes keys g and g+8 of its warp, queries 8t + 2c, +1 (banks: 36g + 4t + c words,
         * distinct across the warp) */
#pragma unroll
        for (int t = 0; t < MT; t++) {
            const int col = t * 8 + (lane & 3) * 2;
            *reinterpret_cast<uint32_t *>(sdS + (warp * 16 + lane / 4) * LDS_S + col) = pack2<BF16>(dp[t][0], dp[t][1]);
            *reinterpret_cast<uint32_t *>(sdS + (warp * 16 + lane / 4 + 8) * LDS_S + col) = pack2<BF16>(dp[t][2], dp[t][3]);
        }
        __syncthreads();

        /* dQ_i += dS K_j for this warp's 16 queries (row group qg) x DW columns (slice dsl), summed
         * over the CTA's 64 keys in k16 steps. A = dS [query][key] from dSᵀ stored [key][query]:
         * ldmatrix.trans of the matrices (keys 0-7, queries 0-7) -> a[0], (keys 0-7, queries 8-15)
         * -> a[1], (keys 8-15, queries 0-7) -> a[2], (8-15, 8-15) -> a[3]; B = K rows [key][d],
         * row-major in k = key: ldmatrix.trans as V in P·V. */
        const int qg = warp % QG, dsl = warp / QG;
        float acc[DW / 8][4];
#pragma unroll
        for (int t = 0; t < DW / 8; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; kk++) {
            uint32_t a[4];
            ldmatrix_x4_trans(a, sdS + (kk * 16 + (lane & 7) + (lane >> 4) * 8) * LDS_S + qg * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int dd = 0; dd < DW / 16; dd++) {
                uint32_t bk[4];
                ldmatrix_x4_trans(bk, sK + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + dsl * DW + dd * 16 +
                                          (lane >> 4) * 8);
                mma16816<BF16>(acc[2 * dd], a, bk[0], bk[1]);
                mma16816<BF16>(acc[2 * dd + 1], a, bk[2], bk[3]);
            }
        }
        /* rows m0 + 16qg + g (+8) inside the sequence: float2 reductions into dq32 (sm_90) */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int q = m0 + qg * 16 + lane / 4 + r * 8;
            if (q < len) {
                float *dst = dq32 + ((size_t)(start + q) * n_heads + head) * D + dsl * DW + (lane & 3) * 2;
#pragma unroll
                for (int t = 0; t < DW / 8; t++)
                    atomicAdd(reinterpret_cast<float2 *>(dst + t * 8), make_float2(acc[t][2 * r], acc[t][2 * r + 1]));
            }
        }
    }

    /* dK = scale·dSᵀQ and dV into dqkv's K and V thirds, keys inside the sequence: thread (g, c)
     * holds keys g, g+8 of its warp, dims 8t + 2c, +1 */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key_w + lane / 4 + r * 8;
        if (key < len) {
            uint16_t *dk_row = dqkv + (size_t)(start + key) * row_stride + hidden + (size_t)head * D + (lane & 3) * 2;
            uint16_t *dv_row = dk_row + hidden;
#pragma unroll
            for (int t = 0; t < DT; t++) {
                *reinterpret_cast<uint32_t *>(dk_row + t * 8) = pack2<BF16>(dk[t][2 * r] * scale, dk[t][2 * r + 1] * scale);
                *reinterpret_cast<uint32_t *>(dv_row + t * 8) = pack2<BF16>(dv[t][2 * r], dv[t][2 * r + 1]);
            }
        }
    }
}

/* ---- launchers ------------------------------------------------------------------------------------------- */

template <int D, int BLOCK_M, bool BF16, bool DROPOUT>
static cudaError_t launch_bwd(void *dqkv, float *dq32, const void *qkv, const void *dout, const float *lse,
                              const float *dsum, const int32_t *cu_seqlens, int32_t n_seqs, int32_t max_seqlen,
                              int32_t n_heads, float scale, int causal, const attention_dropout_params &drop,
                              cudaStream_t stream) {
    const size_t smem = (size_t)(2 * BWD_BLOCK_N + 4 * BLOCK_M) * (D + 8) * sizeof(uint16_t) +
                        (size_t)BWD_BLOCK_N * (BLOCK_M + 8) * sizeof(uint16_t) + 4 * BLOCK_M * sizeof(float);
    auto kernel = attention_bwd_kernel<D, BLOCK_M, BF16, DROPOUT>;
    /* above 48 KB a kernel must opt in: once per instantiation and device */
    static int attr_set[CUDA_MAX_DEVICES];
    const int dev = cuda_current_device();
    if (dev < 0 || !cuda_cache_load(&attr_set[dev])) {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        if (dev >= 0) cuda_cache_store(&attr_set[dev], 1);
    }
    const unsigned n_blocks = (unsigned)((max_seqlen + BWD_BLOCK_N - 1) / BWD_BLOCK_N);
    /* gridDim.z is limited to 65535: larger batches in slices */
    for (int32_t s0 = 0; s0 < n_seqs; s0 += 65535) {
        const int32_t ns = n_seqs - s0 < 65535 ? n_seqs - s0 : 65535;
        kernel<<<dim3(n_blocks, (unsigned)n_heads, (unsigned)ns), BWD_THREADS, smem, stream>>>(
            (uint16_t *)dqkv, dq32, (const uint16_t *)qkv, (const uint16_t *)dout, lse, dsum, cu_seqlens, s0, n_heads,
            scale, causal, drop);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

template <int D, bool BF16>
static cudaError_t run_backward(void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                                const int32_t *cu_seqlens, int32_t n_seqs, int32_t n_tokens, int32_t max_seqlen,
                                int32_t n_heads, float scale, int causal, const attention_dropout_params &drop,
                                float *dq32, float *dsum, cudaStream_t stream) {
    const int64_t rows = (int64_t)n_tokens * n_heads;
    cudaError_t e = cudaMemsetAsync(dq32, 0, (size_t)rows * D * sizeof(float), stream);
    if (e != cudaSuccess) return e;
    const int64_t dsum_threads = rows * (D / 8);
    attention_bwd_dsum_kernel<D, BF16><<<(unsigned)((dsum_threads + 255) / 256), 256, 0, stream>>>(
        dsum, (const uint16_t *)dout, (const uint16_t *)out, rows);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    /* d = 128: 32 query rows a block keeps dK, dV, S and dP in registers and two CTAs a SM */
    constexpr int BLOCK_M = D == 128 ? 32 : 64;
    e = drop.threshold > 0
            ? launch_bwd<D, BLOCK_M, BF16, true>(dqkv, dq32, qkv, dout, lse, dsum, cu_seqlens, n_seqs, max_seqlen,
                                                 n_heads, scale, causal, drop, stream)
            : launch_bwd<D, BLOCK_M, BF16, false>(dqkv, dq32, qkv, dout, lse, dsum, cu_seqlens, n_seqs, max_seqlen,
                                                  n_heads, scale, causal, drop, stream);
    if (e != cudaSuccess) return e;
    const int64_t chunks = rows * D / 8;
    attention_bwd_dq_kernel<BF16><<<(unsigned)((chunks + 255) / 256), 256, 0, stream>>>(
        (uint16_t *)dqkv, dq32, n_heads * D, chunks, scale);
    return cudaGetLastError();
}

/* ---- C entry points ------------------------------------------------------------------------------------- */

static nopad_status check_args(const char *op, const void *a, const void *b, const void *c, int32_t n_seqs,
                               int32_t n_tokens, int32_t max_seqlen, int32_t n_heads, int32_t head_size, float scale,
                               const nopad_attention_dropout *drop) {
    char what[64];
    snprintf(what, sizeof what, "cuda %s", op);
    const nopad_status st = nopad_attention_dropout_check(what, drop);
    if (st != NOPAD_OK) return st;
    if (head_size != 32 && head_size != 64 && head_size != 128)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cuda %s: head size %d has no kernel (32, 64, 128)", op,
                               head_size);
    if (n_seqs < 1 || max_seqlen < 1 || n_heads < 1 || n_heads > 65535 || n_tokens < n_seqs)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cuda %s: need n_seqs, max_seqlen >= 1, 1 <= n_heads <= 65535 and n_tokens >= "
                               "n_seqs (got %d, %d, %d, %d)", op, n_seqs, max_seqlen, n_heads, n_tokens);
    if (!(scale > 0.0f) || isinf(scale))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cuda %s: scale must be positive and finite (got %g)",
                               op, (double)scale);
    if (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) % 16)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cuda %s: the tensors must be 16-byte aligned", op);
    return NOPAD_OK;
}

/* The kernels' form of a dropout (threshold 0: none). */
static attention_dropout_params dropout_params_of(const nopad_attention_dropout *drop) {
    attention_dropout_params d = {0, 1.0f, 0, 0, nullptr};
    if (drop && drop->p > 0.0f) {
        d.threshold = dropout_threshold(drop->p);
        d.scale = (float)(1.0 / (1.0 - (double)drop->p));
        d.key = drop->key;
        d.site = drop->site;
        d.examples = drop->examples;
    }
    return d;
}

extern "C" size_t cuda_attention_backward_ws_bytes(int32_t n_tokens, int32_t n_heads, int32_t head_size) {
    /* dq32 [T, heads, D] then dsum [T, heads]; dq32's size is a multiple of 16 bytes (D >= 4) */
    return (size_t)n_tokens * n_heads * ((size_t)head_size + 1) * sizeof(float);
}

extern "C" nopad_status cuda_attention_lse(int bf16, void *out, float *lse32, const void *qkv,
                                           const int32_t *cu_seqlens, int32_t n_seqs, int32_t n_tokens,
                                           int32_t max_seqlen, int32_t n_heads, int32_t head_size, float scale,
                                           int causal, const nopad_attention_dropout *drop, void *stream) {
    nopad_status st = check_args("attention_lse", out, qkv, qkv, n_seqs, n_tokens, max_seqlen, n_heads, head_size,
                                 scale, drop);
    if (st != NOPAD_OK) return st;
    const attention_dropout_params dp = dropout_params_of(drop);
    cudaError_t e;
    if (dp.threshold > 0 && head_size >= 64 && knob_int(KNOB_FMHA_WGMMA) != 0) {
        /* the attention's dropout: the one-warpgroup, 64-key wgmma kernel */
        const float thresh = (float)knob_float(KNOB_FMHA_RESCALE);
        e = cuda_attention_wgmma(head_size, 64, 64, false, bf16 != 0, out, qkv, cu_seqlens, n_seqs, max_seqlen,
                                 n_heads, scale, thresh >= 0.0f && thresh <= 8.0f ? thresh : 8.0f, causal, false,
                                 (cudaStream_t)stream, lse32, &dp);
    } else if (dp.threshold > 0) {
        /* d = 32, or wgmma off: the mma.sync kernel's 64 x 64 tile */
        e = cuda_attention_mma(head_size, 64, 64, bf16 != 0, out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale,
                               causal, false, (cudaStream_t)stream, lse32, &dp);
    } else if (head_size >= 64 && knob_int(KNOB_FMHA_WGMMA) != 0) {
        /* d = 64, 128: the wgmma kernels inference runs (on Hopper; the FA3 kernel, which dispatch.cu
         * prefers for some d = 64 batches above 512 tokens, has no lse), with the tile rule of
         * dispatch.cu's run_wgmma (its per-shape defaults; the tile knobs are for inference) */
        const int bm = max_seqlen <= (head_size == 64 ? (causal ? 1024 : 512) : 256) ? 64 : 128;
        const bool one_key_tile = head_size == 64 && bm == 64 && max_seqlen > 64 && max_seqlen <= 128 &&
                                  (int64_t)2 * n_heads * n_seqs < (int64_t)4 * cuda_sm_count();
        const int bn = (head_size == 128 && bm == 128) || one_key_tile ? 128 : 64;
        const bool pipelined = head_size == 64 && bm == 128 && bn == 64;
        const float thresh = (float)knob_float(KNOB_FMHA_RESCALE);
        e = cuda_attention_wgmma(head_size, bm, bn, pipelined, bf16 != 0, out, qkv, cu_seqlens, n_seqs, max_seqlen,
                                 n_heads, scale, thresh >= 0.0f && thresh <= 8.0f ? thresh : 8.0f, causal, false,
                                 (cudaStream_t)stream, lse32);
    } else {
        /* the tile rule of the inference dispatcher's mma.sync path (dispatch.cu, run_mma) */
        const int bm = max_seqlen <= (head_size == 128 ? 512 : 256) ? 64 : 128;
        const int bn = head_size == 128 && bm == 128 ? 128 : 64;
        e = cuda_attention_mma(head_size, bm, bn, bf16 != 0, out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale,
                               causal, false, (cudaStream_t)stream, lse32);
    }
    if (e != cudaSuccess)
        return nopad_set_error(NOPAD_ERR_BACKEND, "cuda attention_lse: launch failed: %s (%s)", cudaGetErrorString(e),
                               cudaGetErrorName(e));
    return NOPAD_OK;
}

extern "C" nopad_status cuda_attention_backward(int bf16, void *dqkv, const void *dout, const void *qkv,
                                                const void *out, const float *lse32, const int32_t *cu_seqlens,
                                                int32_t n_seqs, int32_t n_tokens, int32_t max_seqlen,
                                                int32_t n_heads, int32_t head_size, float scale, int causal,
                                                const nopad_attention_dropout *drop, void *ws, void *stream) {
    nopad_status st = check_args("attention_backward", dqkv, dout, qkv, n_seqs, n_tokens, max_seqlen, n_heads,
                                 head_size, scale, drop);
    if (st != NOPAD_OK) return st;
    if (((uintptr_t)out | (uintptr_t)ws) % 16)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cuda attention_backward: out and the workspace must be 16-byte aligned");
    float *dq32 = (float *)ws;                                      // [T, heads, D]
    float *dsum = dq32 + (size_t)n_tokens * n_heads * head_size;    // [T, heads]
    cudaStream_t s = (cudaStream_t)stream;
    const attention_dropout_params dp = dropout_params_of(drop);
    cudaError_t e;
#define RUN(D, B) run_backward<D, B>(dqkv, dout, qkv, out, lse32, cu_seqlens, n_seqs, n_tokens, max_seqlen, n_heads, \
                                     scale, causal, dp, dq32, dsum, s)
    if (bf16) e = head_size == 32 ? RUN(32, true) : head_size == 64 ? RUN(64, true) : RUN(128, true);
    else e = head_size == 32 ? RUN(32, false) : head_size == 64 ? RUN(64, false) : RUN(128, false);
#undef RUN
    if (e != cudaSuccess)
        return nopad_set_error(NOPAD_ERR_BACKEND, "cuda attention_backward: launch failed: %s (%s)",
                               cudaGetErrorString(e), cudaGetErrorName(e));
    return NOPAD_OK;
}

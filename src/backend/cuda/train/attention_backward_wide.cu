/* CUDA: the "wide" attention backward main kernel, the candidate against attention_backward.cu's
 * attention_bwd_kernel (NOPAD_TRAIN_ATTN=new|old|new64 picks; the losers of the A/B go). Same
 * algorithm (FlashAttention-2's, from the saved lse and dsum = rowsum(dout ⊙ out)), same inputs and
 * outputs, the same preprocess (dsum, dq32 zeroed) and postprocess (dq = scale·dq32) kernels. What
 * differs, and why:
 *
 *   - 128 keys a CTA (8 warps of 16 keys) instead of 64 (4 warps). Each key block's CTA walks all
 *     the query blocks that see it, re-reading Q_i, dO_i, lse_i, dsum_i and adding its dQ_i share by
 *     atomics; twice the keys per CTA halves both per key. At the BERT-large shape the 64-key
 *     kernel issues ~32M float2 REDs a layer (~125 G/s at 6 ms / 24 layers), which may be near what
 *     L2's atomic units sustain (not measured): a likely limiter.
 *   - dQ by float4 reductions (red.global.add.v4.f32, sm_90): lanes c and c^1 of a quad trade half
 *     their C fragment by one shuffle so each holds four consecutive columns of one row. Half the
 *     RED operations again: a quarter of the old kernel's in all.
 *   - One __syncthreads per query block instead of two: dSᵀ is double-buffered and the dQ step of
 *     block i runs at the end of iteration i+1, after the barrier that also publishes block i+1's
 *     cp.async data (dQ reads only dSᵀ and K, never the Q/dO buffer the prefetch then overwrites).
 *     A warp no longer waits for the slowest warp's dSᵀ before its dQ MMAs.
 *   - A warp whose 16 keys all lie past the sequence's end skips its S, dP, dV and dK work, and the
 *     dQ step sums over the live keys only (a 128-key block ends mid-way half the time).
 *   - Sequences longest first: a CTA's work grows with its sequence's length (it walks all its query
 *     blocks), and with ~11 waves of one CTA a SM at the BERT-large shape, long CTAs started last
 *     leave SMs idle at the end; a one-block kernel ranks the sequences by length first.
 * Registers: dK, dV of 16 keys and S, dP of BLOCK_M queries a thread, as in the 64-key kernel
 * (218 at d = 64 against its 181; 242 at d = 128, 148 at d = 32; no spills), so a SM holds one
 * 8-warp CTA where it held two 4-warp ones: the same 8 warps. The 4-warp build (185 at d = 64)
 * keeps two CTAs a SM.
 *
 * mma.m16n8k16 fragment layouts (lane = thread % 32, g = lane / 4, c = lane % 4):
 *   A (16x16, row-major)  a[0] = (row g, cols 2c, 2c+1), a[1] = row g+8, a[2] = cols +8, a[3] = both
 *   B (16x8, "col")       b[0] = (k 2c, 2c+1; col g), b[1] = k + 8
 *   C (16x8, float)       c[0], c[1] = (row g, cols 2c, 2c+1), c[2], c[3] = row g + 8
 * Two neighbouring n8 C tiles packed in pairs are the A fragment of one k16 step (mma_pv_step). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/common.h"
#include "backend/cuda/ptx_helpers.cuh"
#include "backend/cuda/train/attention_backward.h"

/* WARPS = 8 (128 keys a CTA) is the candidate; WARPS = 4 (64 keys, two CTAs a SM as the old kernel)
 * keeps the other changes and is timed beside it (NOPAD_TRAIN_ATTN=new64), in case one CTA a SM
 * loses more to unhidden prologues (K, V loads) and barriers than the halved reductions gain. */

/* Rows [row0, row0 + ROWS) of one head's Q, K, V or dO (src: the sequence's row 0, rows row_stride
 * elements apart, row0 < len) into a shared tile [ROWS][D + 8], rows at or past len zero-filled (the
 * source clamped to the last row so it stays mapped). The 8-element pad spreads ldmatrix's eight
 * 16-byte row reads over all 32 banks. */
template <int ROWS, int D, int THREADS>
static __device__ __forceinline__ void wide_load_tile(uint16_t *dst, const uint16_t *src, size_t row_stride, int row0,
                                                      int len, int tid) {
    constexpr int CHUNKS = D / 8, LDS = D + 8, ROW_STEP = THREADS / CHUNKS;
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

static __device__ __forceinline__ void wide_cp_async4(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
}

template <int D, int BLOCK_M, int WARPS, bool BF16>
__global__ void __launch_bounds__(WARPS * 32)
attention_bwd_wide_kernel(uint16_t *__restrict__ dqkv,             // [T, 3, heads, D]: the K and V thirds
                          float *__restrict__ dq32,                // [T, heads, D], zeroed: += dS·K
                          const uint16_t *__restrict__ qkv,        // [T, 3, heads, D]
                          const uint16_t *__restrict__ dout,       // [T, heads*D]
                          const float *__restrict__ lse,           // [T, heads]
                          const float *__restrict__ dsum,          // [T, heads]
                          const int32_t *__restrict__ cu_seqlens,  // [B+1]
                          const int32_t *__restrict__ order,       // [B] sequences longest first, or NULL
                          int seq_offset, int n_heads, float scale, int causal) {
    constexpr int THREADS = WARPS * 32;
    constexpr int BLOCK_N = 16 * WARPS;    // 128 keys (64 with 4 warps)
    constexpr int LDS = D + 8;             // row pitch of the Q, dO, K, V tiles
    constexpr int LDS_S = BLOCK_M + 8;     // row pitch of dSᵀ [BLOCK_N][BLOCK_M]
    constexpr int MT = BLOCK_M / 8;        // n8 tiles of Sᵀ per warp (query columns)
    constexpr int DT = D / 8;              // n8 tiles of dK, dV per warp
    /* the dQ step: BLOCK_M / 16 row groups of 16 queries, the warps left over split D */
    constexpr int QG = BLOCK_M / 16;
    constexpr int DSPLIT = WARPS / QG;
    constexpr int DW = D / DSPLIT;
    static_assert(WARPS % QG == 0 && DW % 16 == 0, "the dQ step's warp split");
    constexpr float LOG2E = 1.4426950408889634f;

    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *sK = smem;                      // [BLOCK_N][LDS]
    uint16_t *sV = sK + BLOCK_N * LDS;        // [BLOCK_N][LDS]
    uint16_t *sQ = sV + BLOCK_N * LDS;        // [2][BLOCK_M][LDS] (double-buffered by query block)
    uint16_t *sdO = sQ + 2 * BLOCK_M * LDS;   // [2][BLOCK_M][LDS]
    uint16_t *sdS = sdO + 2 * BLOCK_M * LDS;  // [2][BLOCK_N][LDS_S]: dSᵀ, key-major, by query block
    float *sL = reinterpret_cast<float *>(sdS + 2 * BLOCK_N * LDS_S);  // [2][BLOCK_M] lse
    float *sDs = sL + 2 * BLOCK_M;                                     // [2][BLOCK_M] dsum

    const int seq = order ? order[seq_offset + blockIdx.z] : seq_offset + blockIdx.z, head = blockIdx.y;
    const int start = cu_seqlens[seq];
    const int len = cu_seqlens[seq + 1] - start;
    const int n0 = blockIdx.x * BLOCK_N;  // this CTA's first key
    if (n0 >= len) return;

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
    /* warps (= k16 steps of the dQ step) holding at least one key inside the sequence */
    const int live16 = min(BLOCK_N / 16, (len - n0 + 15) / 16);
    const int key_w = n0 + warp * 16;  // this warp's first key (the row of its C fragments' g = 0)
    const bool warp_live = key_w < len;

    auto load_query_block = [&](int m0, int b) {
        wide_load_tile<BLOCK_M, D, THREADS>(sQ + b * BLOCK_M * LDS, q_g, row_stride, m0, len, tid);
        wide_load_tile<BLOCK_M, D, THREADS>(sdO + b * BLOCK_M * LDS, do_g, (size_t)hidden, m0, len, tid);
        if (tid < BLOCK_M) {
            const int q = min(m0 + tid, len - 1);
            wide_cp_async4(sL + b * BLOCK_M + tid, lse_g + (size_t)q * n_heads, m0 + tid < len);
            wide_cp_async4(sDs + b * BLOCK_M + tid, dsum_g + (size_t)q * n_heads, m0 + tid < len);
        }
    };

    /* dQ_i += dS K_j for query block m0 from dSᵀ buffer b: this warp's 16 queries (row group qg) x DW
     * columns (slice dsl), summed over the live keys in k16 steps. A = dS [query][key] from dSᵀ
     * stored [key][query]: ldmatrix.trans of (keys 0-7, queries 0-7) -> a[0], (keys 0-7, queries
     * 8-15) -> a[1], (keys 8-15, queries 0-7) -> a[2], (8-15, 8-15) -> a[3]; B = K rows [key][d],
     * row-major in k = key: ldmatrix.trans as V in P·V. */
    auto dq_step = [&](int m0, int b) {
        /* the warp index through an opaque move: otherwise the compiler hoists this step's addresses
         * out of the query loop, and at d = 128 the registers they hold spilled */
        int wv;
        asm volatile("mov.u32 %0, %1;\n" : "=r"(wv) : "r"(warp));
        const int qg = wv % QG, dsl = wv / QG;
        const uint16_t *ds_s = sdS + b * BLOCK_N * LDS_S;
        float acc[DW / 8][4];
#pragma unroll
        for (int t = 0; t < DW / 8; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; kk++) {
            if (kk < live16) {
                uint32_t a[4];
                ldmatrix_x4_trans(a, ds_s + (kk * 16 + (lane & 7) + (lane >> 4) * 8) * LDS_S + qg * 16 +
                                         ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int dd = 0; dd < DW / 16; dd++) {
                    uint32_t bk[4];
                    ldmatrix_x4_trans(bk, sK + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + dsl * DW +
                                              dd * 16 + (lane >> 4) * 8);
                    mma16816<BF16>(acc[2 * dd], a, bk[0], bk[1]);
                    mma16816<BF16>(acc[2 * dd + 1], a, bk[2], bk[3]);
                }
            }
        }
        /* float4 reductions: in each n8 tile, lane (g, c) holds row g cols 2c, 2c+1 (acc[0..1]) and row
         * g+8 the same cols (acc[2..3]). Lanes c = 2k and 2k+1 swap halves with one shuffle: the even
         * lane ends with row g, cols 4k..4k+3 = (its acc[0..1], the odd lane's acc[0..1]), the odd lane
         * with row g+8, cols 4k..4k+3 = (the even lane's acc[2..3], its acc[2..3]). */
        const bool odd = lane & 1;
        const int q = m0 + qg * 16 + lane / 4 + (odd ? 8 : 0);
        float *dst = dq32 + ((size_t)(start + q) * n_heads + head) * D + dsl * DW + ((lane & 3) >> 1) * 4;
#pragma unroll
        for (int t = 0; t < DW / 8; t++) {
            const float send0 = odd ? acc[t][0] : acc[t][2], send1 = odd ? acc[t][1] : acc[t][3];
            const float got0 = __shfl_xor_sync(0xffffffffu, send0, 1);
            const float got1 = __shfl_xor_sync(0xffffffffu, send1, 1);
            const float4 v = odd ? make_float4(got0, got1, acc[t][2], acc[t][3])
                                 : make_float4(acc[t][0], acc[t][1], got0, got1);
            if (q < len) atomicAdd(reinterpret_cast<float4 *>(dst + t * 8), v);
        }
    };

    wide_load_tile<BLOCK_N, D, THREADS>(sK, k_g, row_stride, n0, len, tid);
    wide_load_tile<BLOCK_N, D, THREADS>(sV, v_g, row_stride, n0, len, tid);
    load_query_block(m_begin, 0);
    cp_async_commit();

    /* dK_j, dV_j of this warp's 16 keys [16 x D]: C fragments, rows = keys */
    float dk[DT][4], dv[DT][4];
#pragma unroll
    for (int t = 0; t < DT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[t][e] = dv[t][e] = 0.0f;

    const float scale_log2 = scale * LOG2E;

    for (int it = 0; it < n_iters; it++) {
        const int m0 = m_begin + it * BLOCK_M, b = it & 1;
        cp_async_wait_all();
        /* The one barrier of the iteration: block `it` (buffer b) and dSᵀ of block it-1 (buffer b^1)
         * visible to all; every warp done with block it-1's Q/dO (buffer b^1, overwritten by the
         * prefetch below) and with dSᵀ buffer b (read by the dQ step of block it-2, last iteration). */
        __syncthreads();
        if (it + 1 < n_iters) {
            load_query_block(m0 + BLOCK_M, b ^ 1);
            cp_async_commit();
        }
        /* a warp with no key in the sequence only shares the loads and the dQ step */
        if (warp_live) {
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
             * after the query under causal; only blocks crossing one of those edges test (tested per
             * CTA, not per warp: the per-warp test cost 13 registers and spilled at d = 128). */
            const bool edge = m0 + BLOCK_M > len || n0 + BLOCK_N > len || (causal && n0 + BLOCK_N - 1 > m0);
#pragma unroll
            for (int t = 0; t < MT; t++) {
                const int qc = t * 8 + (lane & 3) * 2;  // query column of e = 0 within the block
                const float2 l2 = *reinterpret_cast<const float2 *>(l_s + qc);
                const float2 d2 = *reinterpret_cast<const float2 *>(ds_s + qc);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float lq = (e & 1) ? l2.y : l2.x, dq = (e & 1) ? d2.y : d2.x;
                    float p = fast_exp2(fmaf(s[t][e], scale_log2, -lq * LOG2E));
                    if (edge) {
                        const int key = key_w + lane / 4 + (e >> 1) * 8, q = m0 + qc + (e & 1);
                        if (key >= len || q >= len || (causal && key > q)) p = 0.0f;
                    }
                    s[t][e] = p;
                    dp[t][e] = p * (dp[t][e] - dq);
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

            /* dSᵀ into buffer b, key-major [key][query], rounded as the dK MMA's A: thread (g, c) writes
             * keys g and g+8 of its warp, queries 8t + 2c, +1. Words: row pitch LDS_S/2 = 36 (BLOCK_M =
             * 64) or 20 (32) words, so the quad's 8 rows x 4 words hit 36g + 4t + c mod 32 = 4g + 4t + c
             * (distinct over g, c for a fixed t) or 20g + 4t + c: 20g mod 32 = {0,20,8,28,16,4,24,12},
             * again distinct multiples of 4 - no bank conflict either way. */
            uint16_t *ds_w = sdS + b * BLOCK_N * LDS_S;
#pragma unroll
            for (int t = 0; t < MT; t++) {
                const int col = t * 8 + (lane & 3) * 2;
                *reinterpret_cast<uint32_t *>(ds_w + (warp * 16 + lane / 4) * LDS_S + col) =
                    pack2<BF16>(dp[t][0], dp[t][1]);
                *reinterpret_cast<uint32_t *>(ds_w + (warp * 16 + lane / 4 + 8) * LDS_S + col) =
                    pack2<BF16>(dp[t][2], dp[t][3]);
            }
        }
        /* the previous block's dQ (its dSᵀ was published by this iteration's barrier), after this
         * block's S and dP are dead: at d = 128 their registers beside the dQ accumulators spilled */
        if (it > 0) dq_step(m0 - BLOCK_M, b ^ 1);
    }
    /* the last query block's dQ, once every warp's dSᵀ is in */
    __syncthreads();
    dq_step(m_begin + (n_iters - 1) * BLOCK_M, (n_iters - 1) & 1);

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

/* order[rank] = the sequence of that rank by length, longest first (ties by index). One block, the
 * lengths in shared memory, O(B²) compares: launched for B <= WIDE_ORDER_MAX only. */
enum { WIDE_ORDER_MAX = 2048 };
__global__ void __launch_bounds__(1024) attention_bwd_order_kernel(int32_t *__restrict__ order,
                                                                   const int32_t *__restrict__ cu_seqlens, int n_seqs) {
    __shared__ int32_t len_s[WIDE_ORDER_MAX];
    for (int i = threadIdx.x; i < n_seqs; i += blockDim.x) len_s[i] = cu_seqlens[i + 1] - cu_seqlens[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n_seqs; i += blockDim.x) {
        const int li = len_s[i];
        int rank = 0;
        for (int j = 0; j < n_seqs; j++) rank += len_s[j] > li || (len_s[j] == li && j < i);
        order[rank] = i;
    }
}

template <int D, int BLOCK_M, int WARPS, bool BF16>
static cudaError_t launch_wide(void *dqkv, float *dq32, const void *qkv, const void *dout, const float *lse,
                               const float *dsum, const int32_t *cu_seqlens, int32_t *order, int32_t n_seqs,
                               int32_t max_seqlen, int32_t n_heads, float scale, int causal, cudaStream_t stream) {
    /* K, V; Q, dO double-buffered; dSᵀ double-buffered; lse, dsum double-buffered:
     * d = 64: 36 + 36 + 36 KB + 1 KB; d = 128 (BLOCK_M 32): 68 + 34 + 20 KB */
    constexpr int BLOCK_N = 16 * WARPS;
    const size_t smem = (size_t)(2 * BLOCK_N + 4 * BLOCK_M) * (D + 8) * sizeof(uint16_t) +
                        (size_t)2 * BLOCK_N * (BLOCK_M + 8) * sizeof(uint16_t) + 4 * BLOCK_M * sizeof(float);
    auto kernel = attention_bwd_wide_kernel<D, BLOCK_M, WARPS, BF16>;
    static int attr_set[CUDA_MAX_DEVICES];
    const int dev = cuda_current_device();
    if (dev < 0 || !cuda_cache_load(&attr_set[dev])) {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        if (dev >= 0) cuda_cache_store(&attr_set[dev], 1);
    }
    const unsigned n_blocks = (unsigned)((max_seqlen + BLOCK_N - 1) / BLOCK_N);
    if (n_seqs > 1 && n_seqs <= WIDE_ORDER_MAX) {
        attention_bwd_order_kernel<<<1, 1024, 0, stream>>>(order, cu_seqlens, n_seqs);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    } else {
        order = nullptr;
    }
    for (int32_t s0 = 0; s0 < n_seqs; s0 += 65535) {  // gridDim.z <= 65535
        const int32_t ns = n_seqs - s0 < 65535 ? n_seqs - s0 : 65535;
        kernel<<<dim3(n_blocks, (unsigned)n_heads, (unsigned)ns), WARPS * 32, smem, stream>>>(
            (uint16_t *)dqkv, dq32, (const uint16_t *)qkv, (const uint16_t *)dout, lse, dsum, cu_seqlens, order, s0, n_heads,
            scale, causal);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

/* d = 128: 32 query rows a block (S, dP of 32 queries beside dK, dV of 16 x 128 in registers) */
template <int WARPS, bool BF16>
static cudaError_t launch_head(int head_size, void *dqkv, float *dq32, const void *qkv, const void *dout,
                               const float *lse, const float *dsum, const int32_t *cu_seqlens, int32_t *order,
                               int32_t n_seqs, int32_t max_seqlen, int32_t n_heads, float scale, int causal,
                               cudaStream_t s) {
    if (head_size == 32)
        return launch_wide<32, 64, WARPS, BF16>(dqkv, dq32, qkv, dout, lse, dsum, cu_seqlens, order, n_seqs,
                                                max_seqlen, n_heads, scale, causal, s);
    if (head_size == 64)
        return launch_wide<64, 64, WARPS, BF16>(dqkv, dq32, qkv, dout, lse, dsum, cu_seqlens, order, n_seqs,
                                                max_seqlen, n_heads, scale, causal, s);
    return launch_wide<128, 32, WARPS, BF16>(dqkv, dq32, qkv, dout, lse, dsum, cu_seqlens, order, n_seqs, max_seqlen,
                                             n_heads, scale, causal, s);
}

extern "C" int cuda_attention_bwd_wide_main(int warps, int head_size, int bf16, void *dqkv, float *dq32,
                                            const void *qkv, const void *dout, const float *lse, const float *dsum,
                                            const int32_t *cu_seqlens, int32_t *order, int32_t n_seqs,
                                            int32_t max_seqlen, int32_t n_heads, float scale, int causal,
                                            void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
#define HEAD(W, B) launch_head<W, B>(head_size, dqkv, dq32, qkv, dout, lse, dsum, cu_seqlens, order, n_seqs, \
                                     max_seqlen, n_heads, scale, causal, s)
    if (warps == 4) return bf16 ? HEAD(4, true) : HEAD(4, false);
    return bf16 ? HEAD(8, true) : HEAD(8, false);
#undef HEAD
}

/* CUDA: fused variable-length multi-head attention (FlashAttention-2 scheme, mma.sync), head sizes
 * 32, 64 and 128; the dispatcher (dispatch.cu) sends head size 32 here, and 64 and 128 when
 * NOPAD_FMHA_WGMMA=0. *
 * One CTA per (query tile of one sequence, head). Q, K and V are read straight from the packed
 * output of the fused QKV projection, qkv [T, 3, heads, D] (row stride 3*heads*D), and the output
 * goes straight into out [T, heads*D]: no padding, no [B, S, S] buffer, the scores live in
 * registers only (online softmax in fp32). The sequence a CTA serves is found on the device from
 * cu_seqlens, so nothing is synchronised with the host; CTAs whose tile starts past their
 * sequence's end exit at once (the grid is sized by max_seqlen).
 *
 * Warp layout: each warp owns 16 query rows (BLOCK_M = 16 * NWARPS) and walks every key tile
 * (BLOCK_N keys) of its sequence. Per tile: S = Q K^T with mma.m16n8k16 (Q fragments held in
 * registers for the whole CTA), mask the ragged tail (and the causal triangle), rescale the
 * running max/sum, then O += P V with P repacked from the S accumulators into A fragments without
 * touching shared memory. K/V tiles are double-buffered in shared memory with cp.async so the next
 * tile's load overlaps this tile's math.
 *
 * Training (train/attention_backward.cu) runs this kernel with `lse` set: the epilogue then also
 * writes each query row's log-sum-exp, lse[T, heads] = scale·m + ln l from the running max m and
 * sum l the online softmax already holds (float32, before any rounding). Inference passes NULL and
 * pays one uniform branch after the loop; nothing inside the loop changes. With the attention's
 * dropout (a separate instantiation, DROPOUT) each key tile's probabilities are multiplied by their
 * mask factors after the softmax has summed them and before they weight V. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/attention/common.cuh"
#include "backend/cuda/attention/kernels.h"
#include "backend/cuda/common.h"
#include "backend/cuda/ptx_helpers.cuh"

/* ---- the kernel --------------------------------------------------------------------------------- */

template <int D, int NWARPS, int BLOCK_N, bool BF16, bool DROPOUT>
__global__ void __launch_bounds__(NWARPS * 32, (D <= 64 && BLOCK_N == 64 ? 2 : 1))
attention_varlen_kernel(uint16_t *__restrict__ out,        // [T, heads*D]
                        const uint16_t *__restrict__ qkv,  // [T, 3, heads, D]
                        const int32_t *__restrict__ cu_seqlens, int seq_offset, int n_heads,
                        float scale_log2, int causal,
                        float *__restrict__ lse,           // [T, heads] or NULL
                        attention_dropout_params drop) {   // used when DROPOUT
    constexpr int BLOCK_M = 16 * NWARPS;
    constexpr int THREADS = NWARPS * 32;
    constexpr int LDS = D + 8;
    constexpr int NT = BLOCK_N / 8;  // n8 tiles of S per warp
    constexpr int DT = D / 8;        // n8 tiles of O per warp
    constexpr int KQ = D / 16;       // k16 steps of Q K^T

    /* launched early behind the QKV GEMM: nothing is read before it ends; the next kernel may be
     * scheduled only after that (wgmma.cu says why) */
    wait_for_upstream_grid();
    allow_dependent_launch();
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *sQ = smem;                    // [BLOCK_M][LDS]
    uint16_t *sK = sQ + BLOCK_M * LDS;      // [2][BLOCK_N][LDS]
    uint16_t *sV = sK + 2 * BLOCK_N * LDS;  // [2][BLOCK_N][LDS]

    const int seq = seq_offset + blockIdx.z, head = blockIdx.y;
    const int start = cu_seqlens[seq];
    const int len = cu_seqlens[seq + 1] - start;
    /* causal: the last query tiles see the most keys; hand them out first */
    const int m_block = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int m0 = m_block * BLOCK_M;
    if (m0 >= len) return;
    const uint64_t example = DROPOUT ? attention_dropout_example(drop, seq) : 0; // keys the masks

    const attention_head hd = attention_head_of<D>(qkv, start, head, n_heads);
    const int hidden = hd.hidden;
    const size_t row_stride = hd.row_stride;
    const uint16_t *q_g = hd.q, *k_g = hd.k, *v_g = hd.v;

    const int n_end = causal ? min(len, m0 + BLOCK_M) : len;  // keys this tile can see
    const int n_tiles = (n_end + BLOCK_N - 1) / BLOCK_N;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

    load_tile<BLOCK_M, D, THREADS>(sQ, q_g, row_stride, m0, len, tid);
    load_tile<BLOCK_N, D, THREADS>(sK, k_g, row_stride, 0, len, tid);
    load_tile<BLOCK_N, D, THREADS>(sV, v_g, row_stride, 0, len, tid);
    cp_async_commit();

    float o[DT][4];
#pragma unroll
    for (int t = 0; t < DT; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
    /* rows (lane/4) and (lane/4 + 8) of this warp's 16; m = raw running max, l a per-thread partial */
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    uint32_t qf[KQ][4];
    const int row_a = m0 + warp * 16 + lane / 4;  // query position in the sequence (row_b = +8)

    for (int j = 0; j < n_tiles; j++) {
        cp_async_wait_all();
        __syncthreads();  // tile j visible to all; every warp is done with buffer (j+1)&1
        if (j == 0) {
#pragma unroll
            for (int kk = 0; kk < KQ; kk++)
                ldmatrix_x4(qf[kk], sQ + (warp * 16 + (lane & 15)) * LDS + kk * 16 + (lane >> 4) * 8);
        }
        if (j + 1 < n_tiles) {
            const int nb = (j + 1) & 1;
            load_tile<BLOCK_N, D, THREADS>(sK + nb * BLOCK_N * LDS, k_g, row_stride, (j + 1) * BLOCK_N, len, tid);
            load_tile<BLOCK_N, D, THREADS>(sV + nb * BLOCK_N * LDS, v_g, row_stride, (j + 1) * BLOCK_N, len, tid);
            cp_async_commit();
        }
        const uint16_t *k_s = sK + (j & 1) * BLOCK_N * LDS;
        const uint16_t *v_s = sV + (j & 1) * BLOCK_N * LDS;

        /* S = Q K^T: [16 x BLOCK_N] per warp. K rows in shared memory are B in column-major. */
        float s[NT][4];
#pragma unroll
        for (int t = 0; t < NT; t++) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KQ; kk++) {
#pragma unroll
            for (int nn = 0; nn < NT / 2; nn++) {
                uint32_t b[4];
                ldmatrix_x4(b, k_s + (nn * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + kk * 16 + ((lane >> 3) & 1) * 8);
                mma16816<BF16>(s[2 * nn], qf[kk], b[0], b[1]);
                mma16816<BF16>(s[2 * nn + 1], qf[kk], b[2], b[3]);
            }
        }

        /* mask keys past the end and (causal) keys after the query; the scale (> 0) is folded into
         * the exponent below, so raw scores order the same as scaled ones */
        const int n0 = j * BLOCK_N;
        if (n0 + BLOCK_N > len || (causal && n0 + BLOCK_N - 1 > m0 + warp * 16)) {
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int col = n0 + t * 8 + (lane & 3) * 2 + (e & 1);
                    const int row = row_a + (e >> 1) * 8;
                    if (col >= len || (causal && col > row)) s[t][e] = -INFINITY;
                }
        }

        online_softmax_tile<NT, DT>(s, o, m_run, l_run, scale_log2);
        if constexpr (DROPOUT) /* training: P ⊙ Z weights V; l_run keeps the undropped sum */
            attention_dropout_tile<NT>(&s[0][0], drop, head, example, row_a, n0, lane);

        /* O += P V. The S accumulators of n-tiles 2k, 2k+1 are exactly the A fragment of k-step k.
         * V rows in shared memory are B in row-major: ldmatrix.trans. */
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; kk++)
            mma_pv_step<BF16, D>(o, s[2 * kk], s[2 * kk + 1], v_s + kk * 16 * LDS, LDS, lane);
    }

    /* normalise, stage this warp's 16 rows in its own (already consumed) Q rows, then store rows
     * inside the sequence with 16-byte writes */
    float inv[2];
    quad_row_inverse(l_run, inv);
    if (lse != nullptr) { /* training: lse = ln Σ_j exp(scale·s_j) = (m·scale_log2 + log2 l)·ln 2 */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = l_run[r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int row = row_a + r * 8;
            if ((lane & 3) == 0 && row < len)
                lse[(size_t)(start + row) * n_heads + head] = (m_run[r] * scale_log2 + log2f(l)) * 0.6931471805599453f;
        }
    }
    __syncwarp();  // every lane's ldmatrix of these Q rows is done before any lane overwrites them
    store_warp_rows<BF16, D>(out, sQ + warp * 16 * LDS, o, inv, lane, m0 + warp * 16, len, start, hidden, head);
}

/* ---- launcher ----------------------------------------------------------------------------------- */

template <int D, int NWARPS, int BLOCK_N, bool BF16, bool DROPOUT = false>
static cudaError_t launch(void *out, const void *qkv, const int32_t *cu_seqlens, int32_t n_seqs,
                          int32_t max_seqlen, int32_t n_heads, float scale, int causal, bool pdl,
                          cudaStream_t stream, float *lse, const attention_dropout_params *drop = nullptr) {
    constexpr int BLOCK_M = 16 * NWARPS;
    const size_t smem = (size_t)(BLOCK_M + 4 * BLOCK_N) * (D + 8) * sizeof(uint16_t);
    auto kernel = attention_varlen_kernel<D, NWARPS, BLOCK_N, BF16, DROPOUT>;
    const attention_dropout_params no_drop = {0, 1.0f, 0, 0, nullptr};
    /* above 48 KB a kernel must opt in; done once per instantiation and device (also keeps it out
     * of graph capture after the first call) */
    static int attr_set[CUDA_MAX_DEVICES];
    const int dev = cuda_current_device();
    if (dev < 0 || !cuda_cache_load(&attr_set[dev])) {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        if (dev >= 0) cuda_cache_store(&attr_set[dev], 1);
    }
    const float scale_log2 = scale * 1.4426950408889634f;
    const unsigned m_blocks = (unsigned)((max_seqlen + BLOCK_M - 1) / BLOCK_M);
    /* gridDim.z is limited to 65535: launch larger batches in slices */
    for (int32_t s0 = 0; s0 < n_seqs; s0 += 65535) {
        const int32_t ns = n_seqs - s0 < 65535 ? n_seqs - s0 : 65535;
        dim3 grid(m_blocks, (unsigned)n_heads, (unsigned)ns);
        cudaError_t e = launch_maybe_pdl(kernel, grid, dim3(NWARPS * 32), smem, stream, pdl,
                                         (uint16_t *)out, (const uint16_t *)qkv, cu_seqlens, s0, n_heads, scale_log2,
                                         causal, lse, drop ? *drop : no_drop);
        if (e == cudaSuccess) e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

template <int D, bool BF16>
static cudaError_t launch_tile(int block_m, int block_n, void *out, const void *qkv, const int32_t *cu_seqlens,
                               int32_t n_seqs, int32_t max_seqlen, int32_t n_heads, float scale, int causal, bool pdl,
                               cudaStream_t stream, float *lse, const attention_dropout_params *drop) {
    if (drop && drop->threshold > 0) /* one tile shape for training's dropout: fewer instantiations */
        return launch<D, 4, 64, BF16, true>(out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, causal, pdl,
                                            stream, lse, drop);
    if (block_m == 64 && block_n == 64)
        return launch<D, 4, 64, BF16>(out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, causal, pdl, stream, lse);
    if (block_m == 64)
        return launch<D, 4, 128, BF16>(out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, causal, pdl, stream, lse);
    if (block_n == 64)
        return launch<D, 8, 64, BF16>(out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, causal, pdl, stream, lse);
    return launch<D, 8, 128, BF16>(out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, causal, pdl, stream, lse);
}

template <bool BF16>
static cudaError_t launch_head(int32_t head_size, int block_m, int block_n, void *out, const void *qkv,
                               const int32_t *cu_seqlens, int32_t n_seqs, int32_t max_seqlen, int32_t n_heads,
                               float scale, int causal, bool pdl, cudaStream_t stream, float *lse,
                               const attention_dropout_params *drop) {
    switch (head_size) {
    case 32: return launch_tile<32, BF16>(block_m, block_n, out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, causal, pdl, stream, lse, drop);
    case 64: return launch_tile<64, BF16>(block_m, block_n, out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, causal, pdl, stream, lse, drop);
    default: return launch_tile<128, BF16>(block_m, block_n, out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, causal, pdl, stream, lse, drop);
    }
}

cudaError_t cuda_attention_mma(int32_t head_size, int block_m, int block_n, bool bf16, void *out, const void *qkv,
                               const int32_t *cu_seqlens, int32_t n_seqs, int32_t max_seqlen, int32_t n_heads,
                               float scale, int causal, bool pdl, cudaStream_t stream, float *lse,
                               const attention_dropout_params *drop) {
    return bf16 ? launch_head<true>(head_size, block_m, block_n, out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads,
                                    scale, causal, pdl, stream, lse, drop)
                : launch_head<false>(head_size, block_m, block_n, out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads,
                                     scale, causal, pdl, stream, lse, drop);
}

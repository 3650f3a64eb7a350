/* CUDA: fused variable-length attention for head sizes 64 and 128 on Hopper tensor cores (wgmma).
 *
 * Same contract and the same online-softmax scheme as mma.cu (read that first); what
 * differs is the matrix engine. Each warpgroup (4 warps) owns 64 query rows. S = Q K^T is one
 * chain of wgmma.m64nNk16 with both operands in shared memory (Q and K tiles stored in the 128-byte
 * swizzled K-major layout wgmma reads without bank conflicts), P V takes P straight from the S
 * registers as the A operand and V from shared memory through the transposing descriptor (V rows
 * are key-major, i.e. MN-major for B). K/V tiles are double-buffered with cp.async as before; a
 * proxy fence hands the cp.async data to the tensor cores' async proxy.
 *
 * A head of 128 is two 64-column slabs per tile (each its own swizzled tile; O is two 64-wide
 * accumulators). With 128-row tiles at d = 64 the FA3 intra-warpgroup overlap is used (the pipe
 * kernel below); the running max is rescaled lazily (see softmax_tile).
 *
 * Why a second kernel: mma.sync tops out near 230 useful TFLOP/s for d = 64 on an H100/H200
 * (docs/attention.md); wgmma has about twice the tensor throughput and runs asynchronously.
 * The tile shape is chosen by the dispatcher (dispatch.cu). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include <type_traits>

#include "backend/cuda/attention/common.cuh"
#include "backend/cuda/attention/kernels.h"
#include "backend/cuda/common.h"
#include "util/knobs.h"
#include "backend/cuda/ptx_helpers.cuh"
#include "backend/cuda/attention/wgmma_helpers.cuh"

/* tile [D/64][ROWS][64]: a head of 128 is two 64-column slabs, each its own swizzled K-major tile.
 * Rows row0 .. row0 + ROWS - 1 of src (row_stride elements apart; row0 < len); rows at or past len
 * are zero-filled, their source address clamped to the last row so that it stays inside the
 * sequence. Thread t copies chunk t % CH of rows t / CH + i * THREADS / CH: the chunk, the swizzle
 * and both offsets are per-thread constants, so a tile costs one 64-bit product for its base (the
 * same for every thread) and per chunk a compare, a min, a multiply-add and the copy (a 64-bit
 * multiply and a bounds check per chunk were a quarter of the pipelined kernel's loop
 * instructions; docs/attention.md). */
template <int ROWS, int THREADS, int D>
static __device__ __forceinline__ void load_tile_sw(uint16_t *dst, const uint16_t *src, size_t row_stride,
                                                    int row0, int len, int tid) {
    constexpr int CH = D / 8;                // 16-byte chunks per row
    constexpr int ROW_STEP = THREADS / CH;   // rows between a thread's chunks
    static_assert(ROWS % ROW_STEP == 0 && ROW_STEP % 8 == 0, "whole rows per pass, swizzle phase per thread fixed");
    const uint16_t *tile = src + (size_t)row0 * row_stride;
    const int last = len - row0 - 1;  // >= 0
    const int r0 = tid / CH, ch = tid % CH;
    uint16_t *d = dst + (CH > 8 ? (ch >> 3) * ROWS * 64 : 0) + r0 * 64 + (((ch & 7) ^ (r0 & 7)) << 3);
#pragma unroll
    for (int i = 0; i < ROWS / ROW_STEP; i++) {
        const int r = r0 + i * ROW_STEP;
        cp_async16(d + i * ROW_STEP * 64, tile + (min(r, last) * (int)row_stride + ch * 8), r <= last);
    }
}

/* A warpgroup whose 64 query rows all lie past the sequence's end (the second of a 128-row tile
 * whose last block has <= 64 rows) runs this instead of the kernel's loop: it loads its share of
 * every K/V tile and meets every __syncthreads as the loop would (tile t into buffer t % STAGES,
 * PREFETCH tiles ahead, one cp.async group per tile loaded or not), but issues no MMAs and no
 * softmax, so the tensor cores go to the other warpgroup and the SM's other CTA (the FA3 kernel
 * does the same). It is a separate path taken before any wgmma code: with the test inside the
 * loop, ptxas serialised every wgmma of the kernel (warning C7520). The caller has committed
 * the groups of tiles 0 .. PREFETCH-1. */
template <int BLOCK_N, int THREADS, int D, int STAGES, int PREFETCH>
static __device__ __forceinline__ void dead_warpgroup_loads(uint16_t *sK, uint16_t *sV, const uint16_t *k_g,
                                                            const uint16_t *v_g, size_t row_stride, int len,
                                                            int n_tiles, int tid) {
    for (int j = 0; j < n_tiles; j++) {
        cp_async_wait_group<PREFETCH - 1>();
        fence_proxy_async();
        __syncthreads();
        if (j + PREFETCH < n_tiles) {
            const int nb = (j + PREFETCH) % STAGES;
            load_tile_sw<BLOCK_N, THREADS, D>(sK + nb * BLOCK_N * D, k_g, row_stride, (j + PREFETCH) * BLOCK_N, len, tid);
            load_tile_sw<BLOCK_N, THREADS, D>(sV + nb * BLOCK_N * D, v_g, row_stride, (j + PREFETCH) * BLOCK_N, len, tid);
        }
        cp_async_commit();
    }
}

/* ---- the kernel (head size 64 or 128) --------------------------------------------------------------- */

/* Training's forward (train/attention_backward.cu, cuda_attention_lse) passes lse (and, with the
 * attention's dropout, runs the DROPOUT instantiation of the one-warpgroup 64-key kernel, which
 * multiplies each key tile's probabilities by their mask factors after the softmax has summed
 * them, as attention/mma.cu's): each query row's
 * log-sum-exp of its scaled scores, lse[T, heads] = ln Σ_j exp(scale·s_j), written after the loop
 * from the running max m (the kept one under lazy rescaling: l and O were summed against it) and
 * the row sum l, whose four quad partials are added here: lse = (m·scale_log2 + log2 l)·ln 2, as
 * attention/mma.cu's epilogue. Inference passes NULL; nothing inside the main loop changes. */
static __device__ __forceinline__ void write_lse(float *lse, const float m_run[2], const float l_run[2],
                                                 float scale_log2, int row_a, int len, int start, int head,
                                                 int n_heads, int lane) {
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

template <int D, int NWG, int BLOCK_N, bool BF16, bool DROPOUT = false>
__global__ void __launch_bounds__(NWG * 128, (D == 64 && BLOCK_N == 64 ? (NWG == 1 ? (DROPOUT ? 4 : 5) : 2) : 1))
attention_varlen_wgmma_kernel(uint16_t *__restrict__ out,        // [T, heads*64]
                              const uint16_t *__restrict__ qkv,  // [T, 3, heads, 64]
                              const int32_t *__restrict__ cu_seqlens, int seq_offset, int n_heads,
                              float scale_log2, float rescale_thresh, int causal,
                              float *__restrict__ lse,           // [T, heads] or NULL: see write_lse
                              attention_dropout_params drop) {   // training, when DROPOUT
    constexpr int DS = D / 64;  // 64-column slabs
    constexpr int BLOCK_M = 64 * NWG;
    constexpr int THREADS = NWG * 128;

    /* Launched early behind the QKV GEMM: nothing is read before it ends. Only then may a
     * programmatic dependent (the next GEMM) be scheduled and start loading its weights: signalled
     * before the wait, a chain of short launches ran ahead of itself (16 x 64: 4.5 instead of
     * 3.4 us; docs/attention.md). */
    wait_for_upstream_grid();
    allow_dependent_launch();
    extern __shared__ uint16_t smem_raw[];
    /* the swizzle is applied to absolute address bits: tiles start on 1024-byte boundaries */
    const uint32_t pad = (1024u - (smem_addr(smem_raw) & 1023u)) & 1023u;
    uint16_t *sQ = smem_raw + pad / 2;      // [BLOCK_M][64] swizzled
    uint16_t *sK = sQ + BLOCK_M * D;        // [2][BLOCK_N][64]
    uint16_t *sV = sK + 2 * BLOCK_N * D;    // [2][BLOCK_N][64]

    /* grid (query tiles, heads, sequences), or causal (heads, sequences, query tiles); see launch_wgmma */
    const int seq = seq_offset + (causal ? blockIdx.y : blockIdx.z), head = causal ? blockIdx.x : blockIdx.y;
    const int start = cu_seqlens[seq];
    const int len = cu_seqlens[seq + 1] - start;
    const int m_block = causal ? (int)(gridDim.z - 1 - blockIdx.z) : (int)blockIdx.x;
    const int m0 = m_block * BLOCK_M;
    if (m0 >= len) return;
    const uint64_t example = DROPOUT ? attention_dropout_example(drop, seq) : 0; // keys the masks

    const attention_head hd = attention_head_of<D>(qkv, start, head, n_heads);
    const int hidden = hd.hidden;
    const size_t row_stride = hd.row_stride;
    const uint16_t *q_g = hd.q, *k_g = hd.k, *v_g = hd.v;

    const int n_end = causal ? min(len, m0 + BLOCK_M) : len;
    const int n_tiles = (n_end + BLOCK_N - 1) / BLOCK_N;
    const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
    const int wrow0 = m0 + wg * 64 + warp * 16;  // first query row of this warp
    const int row_a = wrow0 + lane / 4;          // this thread's rows: row_a, row_a + 8
    const bool live = NWG == 1 || m0 + wg * 64 < len;  // see dead_warpgroup_loads

    load_tile_sw<BLOCK_M, THREADS, D>(sQ, q_g, row_stride, m0, len, tid);
    load_tile_sw<BLOCK_N, THREADS, D>(sK, k_g, row_stride, 0, len, tid);
    load_tile_sw<BLOCK_N, THREADS, D>(sV, v_g, row_stride, 0, len, tid);
    cp_async_commit();
    if (!live) {
        dead_warpgroup_loads<BLOCK_N, THREADS, D, 2, 1>(sK, sV, k_g, v_g, row_stride, len, n_tiles, tid);
        return;
    }

    float o[32 * DS];  // O [64 x D] per warpgroup: n8 column group t holds o[4t..4t+3]
#pragma unroll
    for (int i = 0; i < 32 * DS; i++) o[i] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    const uint16_t *q_wg = sQ + wg * 64 * 64;  // this warpgroup's rows in slab 0

    /* one key tile: the S product, the online softmax and P V over its first W keys (W = BLOCK_N, or
     * BLOCK_N / 2 for a half-width last tile; see half_last) */
    auto key_tile = [&](int j, auto width) {
        constexpr int W = decltype(width)::value, WT = W / 8;  // keys, n8 column groups
        cp_async_wait_all();
        fence_proxy_async();
        __syncthreads();  // tile j visible to every warp and to the async proxy; buffer (j+1)&1 free
        if (j + 1 < n_tiles) {
            const int nb = (j + 1) & 1;
            load_tile_sw<BLOCK_N, THREADS, D>(sK + nb * BLOCK_N * D, k_g, row_stride, (j + 1) * BLOCK_N, len, tid);
            load_tile_sw<BLOCK_N, THREADS, D>(sV + nb * BLOCK_N * D, v_g, row_stride, (j + 1) * BLOCK_N, len, tid);
            cp_async_commit();
        }
        const uint16_t *k_s = sK + (j & 1) * BLOCK_N * D;
        const uint16_t *v_s = sV + (j & 1) * BLOCK_N * D;

        /* S = Q K^T, four k16 steps along the head dimension (+32 bytes each inside the swizzle atom) */
        float s[W / 2];
#pragma unroll
        for (int i = 0; i < W / 2; i++) s[i] = 0.0f;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            wgmma_ss<BF16, W>(s, sw128_desc(q_wg + (kk >> 2) * BLOCK_M * 64 + (kk & 3) * 16),
                              sw128_desc(k_s + (kk >> 2) * BLOCK_N * 64 + (kk & 3) * 16), kk > 0);
        wgmma_commit();
        wgmma_wait0();

        /* softmax_tile (wgmma_helpers.cuh) inline, with O rescaled row by row inside the loop:
         * calling softmax_tile and rescaling after it is 1.5-2% slower at 128 x 512, the encoder's
         * main case of this kernel */
        const int n0 = j * BLOCK_N;
        if (n0 + W > len || (causal && n0 + W - 1 > wrow0)) {
#pragma unroll
            for (int t = 0; t < WT; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int col = n0 + t * 8 + (lane & 3) * 2 + (e & 1);
                    const int row = row_a + (e >> 1) * 8;
                    if (col >= len || (causal && col > row)) s[4 * t + e] = -INFINITY;
                }
        }

#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int t = 0; t < WT; t++) mx = fmaxf(mx, fmaxf(s[4 * t + 2 * r], s[4 * t + 2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            /* lazy rescaling: keep the old max unless the new one is larger by more than
             * rescale_thresh (log2 units), so p <= 2^thresh and O is rarely rescaled; exact final
             * normalisation because l and O use the same max. (both -inf: NaN > t is false) */
            const bool bump = (fmaxf(m_run[r], mx) - m_run[r]) * scale_log2 > rescale_thresh;
            const float m_keep = bump ? fmaxf(m_run[r], mx) : m_run[r];
            const float m_use = m_keep == -INFINITY ? 0.0f : m_keep * scale_log2;
            const float alpha = bump ? fast_exp2(fmaf(m_run[r], scale_log2, -m_use)) : 1.0f;
            m_run[r] = m_keep;
            float sum = 0.0f;
#pragma unroll
            for (int t = 0; t < WT; t++) {
                s[4 * t + 2 * r] = fast_exp2(fmaf(s[4 * t + 2 * r], scale_log2, -m_use));
                s[4 * t + 2 * r + 1] = fast_exp2(fmaf(s[4 * t + 2 * r + 1], scale_log2, -m_use));
                sum += s[4 * t + 2 * r] + s[4 * t + 2 * r + 1];
            }
            l_run[r] = l_run[r] * alpha + sum;
            if (!NOPAD_FMHA_VOTE || __any_sync(0xffffffffu, alpha != 1.0f)) {
#pragma unroll
                for (int t = 0; t < 8 * DS; t++) {
                    o[4 * t + 2 * r] *= alpha;
                    o[4 * t + 2 * r + 1] *= alpha;
                }
            }
        }

        if constexpr (DROPOUT) /* training: P ⊙ Z weights V; l_run keeps the undropped sum */
            attention_dropout_tile<WT>(s, drop, head, example, row_a, n0, lane);

        /* O += P V: P from registers (S groups 2k, 2k+1 form the A fragment of k-step k), V through the
         * transposing descriptor, 16 keys = 2048 bytes per k-step */
        uint32_t pa[W / 16][4];
        pack_p<BF16, W / 16>(pa, s);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < W / 16; kk++)
#pragma unroll
            for (int ds = 0; ds < DS; ds++)
                wgmma_rs<BF16>(o + 32 * ds, pa[kk], sw128_desc(v_s + ds * BLOCK_N * 64 + kk * 16 * 64));
        wgmma_commit();
        wgmma_wait0();
    };
    /* the half-width last key tile, taken after the loop (the pipelined kernel below says why) */
    const bool half_last = n_tiles > 1 && n_end - (n_tiles - 1) * BLOCK_N <= BLOCK_N / 2;
    const int n_full = n_tiles - (half_last ? 1 : 0);
    for (int j = 0; j < n_full; j++) key_tile(j, std::integral_constant<int, BLOCK_N>{});
    if (half_last) key_tile(n_tiles - 1, std::integral_constant<int, BLOCK_N / 2>{});

    float inv[2];
    quad_row_inverse(l_run, inv);
    if (lse != nullptr) write_lse(lse, m_run, l_run, scale_log2, row_a, len, start, head, n_heads, lane);
    /* stage O in this warpgroup's Q rows (swizzled, conflict-free), once all its wgmma reads are done */
    if (wg == 0) asm volatile("bar.sync 1, 128;\n" ::: "memory");
    else asm volatile("bar.sync 2, 128;\n" ::: "memory");
    uint16_t *sO = sQ + wg * 64 * 64;  // slab ds of these rows at + ds * BLOCK_M * 64
    const int r0 = warp * 16 + lane / 4;
#pragma unroll
    for (int t = 0; t < 8 * DS; t++) {
        const int col = (t & 7) * 8 + (lane & 3) * 2;
        uint16_t *slab = sO + (t >> 3) * BLOCK_M * 64;
        *reinterpret_cast<uint32_t *>(slab + sw_off(r0, col)) = pack2<BF16>(o[4 * t] * inv[0], o[4 * t + 1] * inv[0]);
        *reinterpret_cast<uint32_t *>(slab + sw_off(r0 + 8, col)) = pack2<BF16>(o[4 * t + 2] * inv[1], o[4 * t + 3] * inv[1]);
    }
    __syncwarp();
    constexpr int CH = D / 8;
#pragma unroll
    for (int c = lane; c < 16 * CH; c += 32) {  // this warp's 16 rows, D/8 chunks of 16 bytes each
        const int r = warp * 16 + c / CH, ch = c % CH;
        const int row = m0 + wg * 64 + r;
        if (row < len)
            *reinterpret_cast<uint4 *>(out + (size_t)(start + row) * hidden + (size_t)head * D + ch * 8) =
                *reinterpret_cast<const uint4 *>(sO + (ch >> 3) * BLOCK_M * 64 + r * 64 + (((ch & 7) ^ (r & 7)) << 3));
    }
}

/* ---- pipelined variant ----------------------------------------------------------------------------
 * FlashAttention-3's intra-warpgroup overlap: in iteration j the warpgroup issues S_j = Q K_j^T and
 * O += P_{j-1} V_{j-1} back to back, waits only for S_j, and runs the softmax of S_j on the CUDA
 * cores while the tensor cores still work on P_{j-1} V_{j-1}. V_{j-1} is still being read when tile
 * j+2 is loaded (two tiles ahead, see PREFETCH), so K/V take four shared-memory stages. */

/* two CTAs a SM at d = 64 with 64-key tiles (<= 128 registers): the 16 x 512 case */
template <int D, int NWG, int BLOCK_N, bool BF16>
__global__ void __launch_bounds__(NWG * 128, (D == 64 && NWG == 2 && BLOCK_N == 64 ? 2 : 1))
attention_varlen_wgmma_pipe_kernel(uint16_t *__restrict__ out,        // [T, heads*64]
                                   const uint16_t *__restrict__ qkv,  // [T, 3, heads, 64]
                                   const int32_t *__restrict__ cu_seqlens, int seq_offset, int n_heads,
                                   float scale_log2, float rescale_thresh, int causal,
                                   float *__restrict__ lse,  // [T, heads] or NULL: see write_lse
                                   attention_dropout_params) { // none here: the plain kernel's signature
    constexpr int DS = D / 64;  // 64-column slabs
    constexpr int BLOCK_M = 64 * NWG;
    constexpr int THREADS = NWG * 128;
    constexpr int NT = BLOCK_N / 8;
    constexpr int KS = BLOCK_N / 16;  // k16 steps of P V
    /* K/V tiles are loaded PREFETCH tiles ahead: one tile ahead, the cp.async latency (L2 or HBM,
     * ~1 us) was longer than one tile's MMAs at 16 x 512. V_{j-1} is still read in iteration j, so
     * STAGES = PREFETCH + 2 buffers. */
    constexpr int PREFETCH = 2, STAGES = PREFETCH + 2;

    wait_for_upstream_grid(); /* as in attention_varlen_wgmma_kernel: wait, then let the next one launch */
    allow_dependent_launch();
    extern __shared__ uint16_t smem_raw[];
    const uint32_t pad = (1024u - (smem_addr(smem_raw) & 1023u)) & 1023u;
    uint16_t *sQ = smem_raw + pad / 2;         // [BLOCK_M][64] swizzled
    uint16_t *sK = sQ + BLOCK_M * D;           // [STAGES][BLOCK_N][64]
    uint16_t *sV = sK + STAGES * BLOCK_N * D;  // [STAGES][BLOCK_N][64]

    /* grid (query tiles, heads, sequences), or causal (heads, sequences, query tiles); see launch_wgmma */
    const int seq = seq_offset + (causal ? blockIdx.y : blockIdx.z), head = causal ? blockIdx.x : blockIdx.y;
    const int start = cu_seqlens[seq];
    const int len = cu_seqlens[seq + 1] - start;
    const int m_block = causal ? (int)(gridDim.z - 1 - blockIdx.z) : (int)blockIdx.x;
    const int m0 = m_block * BLOCK_M;
    if (m0 >= len) return;

    const attention_head hd = attention_head_of<D>(qkv, start, head, n_heads);
    const int hidden = hd.hidden;
    const size_t row_stride = hd.row_stride;
    const uint16_t *q_g = hd.q, *k_g = hd.k, *v_g = hd.v;

    const int n_end = causal ? min(len, m0 + BLOCK_M) : len;
    const int n_tiles = (n_end + BLOCK_N - 1) / BLOCK_N;
    const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
    const int wrow0 = m0 + wg * 64 + warp * 16;
    const int row_a = wrow0 + lane / 4;
    const uint16_t *q_wg = sQ + wg * 64 * 64;  // this warpgroup's rows in slab 0
    const bool live = NWG == 1 || m0 + wg * 64 < len;  // see dead_warpgroup_loads

    load_tile_sw<BLOCK_M, THREADS, D>(sQ, q_g, row_stride, m0, len, tid);
    load_tile_sw<BLOCK_N, THREADS, D>(sK, k_g, row_stride, 0, len, tid);
    load_tile_sw<BLOCK_N, THREADS, D>(sV, v_g, row_stride, 0, len, tid);
    cp_async_commit();
#pragma unroll
    for (int p = 1; p < PREFETCH; p++) {  // one group per tile, empty past the last
        if (p < n_tiles) {
            load_tile_sw<BLOCK_N, THREADS, D>(sK + p * BLOCK_N * D, k_g, row_stride, p * BLOCK_N, len, tid);
            load_tile_sw<BLOCK_N, THREADS, D>(sV + p * BLOCK_N * D, v_g, row_stride, p * BLOCK_N, len, tid);
        }
        cp_async_commit();
    }
    if (!live) {
        dead_warpgroup_loads<BLOCK_N, THREADS, D, STAGES, PREFETCH>(sK, sV, k_g, v_g, row_stride, len, n_tiles, tid);
        return;
    }

    float o[32 * DS];
#pragma unroll
    for (int i = 0; i < 32 * DS; i++) o[i] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f}, alpha[2];
    float s[BLOCK_N / 2];
    uint32_t pa[KS][4];

    /* The half-width last key tile: when the sequence's last tile holds at most BLOCK_N / 2 keys
     * (half of all sequences, for lengths spread evenly), S is the m64n(BLOCK_N/2) product, its
     * softmax covers those columns only, and the last P V takes half the k-steps. The rest of the
     * tile is masked anyway (past the end, or for causal past every row of the query tile), so its
     * P would be exactly 0: the skipped work adds nothing. That tile is peeled off the loop: with
     * the choice made inside the loop (while a P V is in flight), ptxas serialised every wgmma of
     * the kernel (warnings C7511/C7520), and so it did with a half-width choice in the prologue,
     * which is why a sequence of a single tile is always taken at full width. s[] past the half
     * keeps stale values that no P V reads. */
    const bool half_last = n_tiles > 1 && n_end - (n_tiles - 1) * BLOCK_N <= BLOCK_N / 2;
    const int n_full = n_tiles - (half_last ? 1 : 0);  // tiles at full width: the prologue's and the loop's

    /* prologue: S_0 and its softmax */
    cp_async_wait_group<PREFETCH - 1>();  // tile 0 (and Q) landed
    fence_proxy_async();
    __syncthreads();
    if (PREFETCH < n_tiles) {
        load_tile_sw<BLOCK_N, THREADS, D>(sK + (PREFETCH % STAGES) * BLOCK_N * D, k_g, row_stride, PREFETCH * BLOCK_N, len, tid);
        load_tile_sw<BLOCK_N, THREADS, D>(sV + (PREFETCH % STAGES) * BLOCK_N * D, v_g, row_stride, PREFETCH * BLOCK_N, len, tid);
    }
    cp_async_commit();
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; i++) s[i] = 0.0f;
    fence_regs<BLOCK_N / 2>(s);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        wgmma_ss<BF16, BLOCK_N>(s, sw128_desc(q_wg + (kk >> 2) * BLOCK_M * 64 + (kk & 3) * 16),
                                sw128_desc(sK + (kk >> 2) * BLOCK_N * 64 + (kk & 3) * 16), kk > 0);
    wgmma_commit();
    wgmma_wait0();
    fence_regs<BLOCK_N / 2>(s);
    softmax_tile<NT>(s, m_run, l_run, alpha, scale_log2, rescale_thresh, 0, len, wrow0, row_a, causal, lane);
    pack_p<BF16, KS>(pa, s);

    /* one iteration: S_j = Q K_j^T over the tile's first W keys (W = BLOCK_N, or BLOCK_N / 2 for the
     * half-width last tile, whose product goes to registers of its own before the softmax reads
     * it), P_(j-1) V_(j-1) beside it, the softmax of S_j under that P V */
    auto kv_step = [&](int j, auto width) {
        constexpr int W = decltype(width)::value;
        cp_async_wait_group<PREFETCH - 1>();
        fence_proxy_async();
        __syncthreads();  // tile j landed; every warpgroup is past iteration j-1 (stage (j-2) % STAGES free)
        if (j + PREFETCH < n_tiles) {
            const int nb = (j + PREFETCH) % STAGES;
            load_tile_sw<BLOCK_N, THREADS, D>(sK + nb * BLOCK_N * D, k_g, row_stride, (j + PREFETCH) * BLOCK_N, len, tid);
            load_tile_sw<BLOCK_N, THREADS, D>(sV + nb * BLOCK_N * D, v_g, row_stride, (j + PREFETCH) * BLOCK_N, len, tid);
        }
        cp_async_commit();
        const uint16_t *k_s = sK + (j % STAGES) * BLOCK_N * D;
        const uint16_t *v_prev = sV + ((j - 1) % STAGES) * BLOCK_N * D;
        float sh[W / 2];
        float *sw = W == BLOCK_N ? s : sh;  // S_j's accumulators
        if constexpr (W != BLOCK_N) {
#pragma unroll
            for (int i = 0; i < W / 2; i++) sh[i] = 0.0f;
        }
        fence_regs<W / 2>(sw);
        fence_regs<32 * DS>(o);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            wgmma_ss<BF16, W>(sw, sw128_desc(q_wg + (kk >> 2) * BLOCK_M * 64 + (kk & 3) * 16),
                              sw128_desc(k_s + (kk >> 2) * BLOCK_N * 64 + (kk & 3) * 16), kk > 0);
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
#pragma unroll
            for (int ds = 0; ds < DS; ds++)
                wgmma_rs<BF16>(o + 32 * ds, pa[kk], sw128_desc(v_prev + ds * BLOCK_N * 64 + kk * 16 * 64));
        wgmma_commit();
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // S_j done, P V may run on
        fence_regs<W / 2>(sw);
        if constexpr (W != BLOCK_N) {
#pragma unroll
            for (int i = 0; i < W / 2; i++) s[i] = sh[i];
        }
        softmax_tile<W / 8>(s, m_run, l_run, alpha, scale_log2, rescale_thresh, j * BLOCK_N, len, wrow0, row_a, causal, lane);
        wgmma_wait0();
        fence_regs<32 * DS>(o);
        if (!NOPAD_FMHA_VOTE || __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f))
            rescale_o<8 * DS>(o, alpha);
        pack_p<BF16, W / 16>(pa, s);
    };
    for (int j = 1; j < n_full; j++) kv_step(j, std::integral_constant<int, BLOCK_N>{});
    if (half_last) kv_step(n_tiles - 1, std::integral_constant<int, BLOCK_N / 2>{});
    /* epilogue: the last P V (half the k-steps after a half-width tile: P is 0 past its keys) */
    {
        const uint16_t *v_last = sV + ((n_tiles - 1) % STAGES) * BLOCK_N * D;
        fence_regs<32 * DS>(o);
        wgmma_fence();
        if (half_last) {
#pragma unroll
            for (int kk = 0; kk < KS / 2; kk++)
#pragma unroll
                for (int ds = 0; ds < DS; ds++)
                    wgmma_rs<BF16>(o + 32 * ds, pa[kk], sw128_desc(v_last + ds * BLOCK_N * 64 + kk * 16 * 64));
        } else {
#pragma unroll
            for (int kk = 0; kk < KS; kk++)
#pragma unroll
                for (int ds = 0; ds < DS; ds++)
                    wgmma_rs<BF16>(o + 32 * ds, pa[kk], sw128_desc(v_last + ds * BLOCK_N * 64 + kk * 16 * 64));
        }
        wgmma_commit();
        wgmma_wait0();
        fence_regs<32 * DS>(o);
    }

    float inv[2];
    quad_row_inverse(l_run, inv);
    if (lse != nullptr) write_lse(lse, m_run, l_run, scale_log2, row_a, len, start, head, n_heads, lane);
    if (wg == 0) asm volatile("bar.sync 1, 128;\n" ::: "memory");
    else asm volatile("bar.sync 2, 128;\n" ::: "memory");
    uint16_t *sO = sQ + wg * 64 * 64;  // slab ds of these rows at + ds * BLOCK_M * 64
    const int r0 = warp * 16 + lane / 4;
#pragma unroll
    for (int t = 0; t < 8 * DS; t++) {
        const int col = (t & 7) * 8 + (lane & 3) * 2;
        uint16_t *slab = sO + (t >> 3) * BLOCK_M * 64;
        *reinterpret_cast<uint32_t *>(slab + sw_off(r0, col)) = pack2<BF16>(o[4 * t] * inv[0], o[4 * t + 1] * inv[0]);
        *reinterpret_cast<uint32_t *>(slab + sw_off(r0 + 8, col)) = pack2<BF16>(o[4 * t + 2] * inv[1], o[4 * t + 3] * inv[1]);
    }
    __syncwarp();
    constexpr int CH = D / 8;
#pragma unroll
    for (int c = lane; c < 16 * CH; c += 32) {  // this warp's 16 rows, D/8 chunks of 16 bytes each
        const int r = warp * 16 + c / CH, ch = c % CH;
        const int row = m0 + wg * 64 + r;
        if (row < len)
            *reinterpret_cast<uint4 *>(out + (size_t)(start + row) * hidden + (size_t)head * D + ch * 8) =
                *reinterpret_cast<const uint4 *>(sO + (ch >> 3) * BLOCK_M * 64 + r * 64 + (((ch & 7) ^ (r & 7)) << 3));
    }
}

/* ---- launcher ----------------------------------------------------------------------------------- */

template <int D, int NWG, int BLOCK_N, bool BF16, bool PIPE, bool DROPOUT = false>
static cudaError_t launch_wgmma(void *out, const void *qkv, const int32_t *cu_seqlens, int32_t n_seqs,
                                int32_t max_seqlen, int32_t n_heads, float scale, float rescale_thresh, int causal,
                                bool pdl, cudaStream_t stream, float *lse,
                                const attention_dropout_params *drop = nullptr) {
    constexpr int BLOCK_M = 64 * NWG;
    /* Q + K/V stages (2 plain, 4 pipelined) + alignment slack */
    const size_t smem = (size_t)(BLOCK_M + (PIPE ? 8 : 4) * BLOCK_N) * D * sizeof(uint16_t) + 1024;
    auto kernel = PIPE ? attention_varlen_wgmma_pipe_kernel<D, NWG, BLOCK_N, BF16>
                       : attention_varlen_wgmma_kernel<D, NWG, BLOCK_N, BF16, DROPOUT>;
    const attention_dropout_params no_drop = {0, 1.0f, 0, 0, nullptr};
    const unsigned m_blocks = (unsigned)((max_seqlen + BLOCK_M - 1) / BLOCK_M);
    /* The one-warpgroup d = 64 kernel with 64-key tiles fits five CTAs a SM (<= 96 registers, 42 KB
     * of shared memory); asking for FOUR_CTA_SMEM bytes of shared memory holds it to four. Five win
     * 4-7% on grids of >= 2.5 waves of four and lose up to 13% on smaller grids of longer tiles: the
     * fifth CTA slows the others, which pays only when it also shortens the wave count.
     * NOPAD_FMHA_V5_CTAS=4|5 overrides. */
    constexpr bool FIVE_A_SM = !PIPE && !DROPOUT && D == 64 && NWG == 1 && BLOCK_N == 64;
    constexpr size_t FOUR_CTA_SMEM = 46 * 1024;
    const long ctas_env = knob_int(KNOB_FMHA_V5_CTAS);
    const uint64_t grid_ctas = (uint64_t)m_blocks * (uint64_t)n_heads * (uint64_t)n_seqs;
    const bool five = ctas_env == 4 ? false : ctas_env == 5 ? true : grid_ctas * 2 >= (uint64_t)5 * 4 * cuda_sm_count();
    const size_t launch_smem = FIVE_A_SM && !five && smem < FOUR_CTA_SMEM ? FOUR_CTA_SMEM : smem;
    /* above 48 KB a kernel must opt in: once per instantiation and device */
    static int attr_set[CUDA_MAX_DEVICES];
    const int dev = cuda_current_device();
    if (dev < 0 || !cuda_cache_load(&attr_set[dev])) {
        const size_t most = FIVE_A_SM && smem < FOUR_CTA_SMEM ? FOUR_CTA_SMEM : smem;
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most);
        if (e != cudaSuccess) return e;
        if (dev >= 0) cuda_cache_store(&attr_set[dev], 1);
    }
    const float scale_log2 = scale * 1.4426950408889634f;
    for (int32_t s0 = 0; s0 < n_seqs; s0 += 65535) {
        const int32_t ns = n_seqs - s0 < 65535 ? n_seqs - s0 : 65535;
        /* Non-causal: the query tiles of one (sequence, head) are neighbours in the launch order and
         * share K / V in L2. Causal: the query tile is the slowest index and runs last tile first,
         * so the tiles with the most keys start first and the short ones fill the tail (causal up to
         * +25%; the same order non-causal loses 1-13%). */
        const dim3 grid = causal ? dim3((unsigned)n_heads, (unsigned)ns, m_blocks)
                                 : dim3(m_blocks, (unsigned)n_heads, (unsigned)ns);
        cudaError_t e = launch_maybe_pdl(kernel, grid, dim3(NWG * 128), launch_smem, stream, pdl,
                                         (uint16_t *)out, (const uint16_t *)qkv, cu_seqlens, s0, n_heads, scale_log2,
                                         rescale_thresh, causal, lse, drop ? *drop : no_drop);
        if (e == cudaSuccess) e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

template <int D, bool BF16>
static cudaError_t launch_tile(int block_m, int block_n, bool pipe, void *out, const void *qkv,
                               const int32_t *cu_seqlens, int32_t n_seqs, int32_t max_seqlen, int32_t n_heads,
                               float scale, float rt, int causal, bool pdl, cudaStream_t st, float *lse,
                               const attention_dropout_params *drop) {
    if (drop && drop->threshold > 0) /* training's dropout: one tile shape, fewer instantiations */
        return launch_wgmma<D, 1, 64, BF16, false, true>(out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, rt,
                                                         causal, pdl, st, lse, drop);
    if (pipe)
        return block_m == 64 ? launch_wgmma<D, 1, 64, BF16, true>(out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, rt, causal, pdl, st, lse)
                             : launch_wgmma<D, 2, 64, BF16, true>(out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, rt, causal, pdl, st, lse);
    if (block_m == 64 && block_n == 64) return launch_wgmma<D, 1, 64, BF16, false>(out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, rt, causal, pdl, st, lse);
    if (block_m == 64) return launch_wgmma<D, 1, 128, BF16, false>(out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, rt, causal, pdl, st, lse);
    if (block_n == 64) return launch_wgmma<D, 2, 64, BF16, false>(out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, rt, causal, pdl, st, lse);
    return launch_wgmma<D, 2, 128, BF16, false>(out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, rt, causal, pdl, st, lse);
}

cudaError_t cuda_attention_wgmma(int32_t head_size, int block_m, int block_n, bool pipe, bool bf16, void *out,
                                 const void *qkv, const int32_t *cu_seqlens, int32_t n_seqs, int32_t max_seqlen,
                                 int32_t n_heads, float scale, float rescale_thresh, int causal, bool pdl,
                                 cudaStream_t st, float *lse, const attention_dropout_params *drop) {
    if (head_size == 128)
        return bf16 ? launch_tile<128, true>(block_m, block_n, pipe, out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, rescale_thresh, causal, pdl, st, lse, drop)
                    : launch_tile<128, false>(block_m, block_n, pipe, out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, rescale_thresh, causal, pdl, st, lse, drop);
    return bf16 ? launch_tile<64, true>(block_m, block_n, pipe, out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, rescale_thresh, causal, pdl, st, lse, drop)
                : launch_tile<64, false>(block_m, block_n, pipe, out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, rescale_thresh, causal, pdl, st, lse, drop);
}

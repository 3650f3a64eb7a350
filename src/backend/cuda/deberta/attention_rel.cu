/* CUDA: DeBERTa's disentangled attention on the packed stream (the backend's attention_rel op; the
 * reference is src/backend/cpu/cpu_attention_rel.c). Two steps, as the CPU op does it:
 *
 * 1. Projections: for every token t and head h, the content-to-position and position-to-content
 *    rows against the table rows the batch can reach,
 *      c2p[t, h, r] = q_t · pos_key[r_lo + r]    p2c[t, h, r] = k_t · pos_query[r_lo + r]
 *    scratch [T, heads, W], W = r_hi - r_lo + 1 <= min(2·max_seqlen - 1, 2k) (the bucket is
 *    monotone in the distance, so one sequence of max_seqlen tokens reaches rows r_lo .. r_hi and
 *    every shorter one a sub-range). Head sizes 32/64/128 (section 3): mma.sync with float32
 *    accumulation into fp16 scratch; other head sizes (1, 2b): float32 FMAs, float32 scratch.
 * 2. Attention: a varlen flash attention where each raw score q_i·k_j gets c2p[i, r_ij] +
 *    p2c[j, r_ij] added before the running maximum, r_ij the table row of the distance i - j read
 *    from `rows` (below): for 32/64/128 attention/mma.cu's tile with the terms staged in shared
 *    memory a tile at a time (section 3), else attention/generic.cu's warp a row gathering them.
 *    No [S, S] bias exists: the only per-pair state is the scratch rows the tile's queries and
 *    keys own.
 *
 * rows[d + sat] (int32, d in [-sat, sat]) = clamp(bucket(d) + k, 0, 2k - 1), the table row of
 * distance d, built on the host with nopad_rel_bucket (the CPU's exact float32 ceil) and uploaded
 * once per bucket setting by the backend (cuda_backend.c); past ±sat the row is saturated at 0 or
 * 2k - 1, so distances are clamped to ±sat before the lookup. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend/cuda/attention/common.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/deberta/attention_rel.h"

/* What the attention kernels need to add the relative terms to a score. */
struct rel_bias {
    const float *c2p, *p2c;  // [T, heads, W] or NULL (term absent)
    const int32_t *rows;     // [2·sat + 1]
    int sat, r_lo, W;
};

/* c2p[i, r_ij] + p2c[j, r_ij] for query token ti and key token tj (packed indices) of head h,
 * i - j = dist their distance inside the sequence. */
static __device__ __forceinline__ float rel_term(const rel_bias &rb, int heads, int h, int ti, int tj, int dist) {
    dist = max(-rb.sat, min(rb.sat, dist));
    int r = __ldg(rb.rows + dist + rb.sat) - rb.r_lo;
    r = max(0, min(rb.W - 1, r));  // in range by construction (monotone buckets); never read outside
    float b = 0.0f;
    if (rb.c2p) b += __ldg(rb.c2p + ((size_t)ti * heads + h) * rb.W + r);
    if (rb.p2c) b += __ldg(rb.p2c + ((size_t)tj * heads + h) * rb.W + r);
    return b;
}

/* ---- 1. the projections ---------------------------------------------------------------------- */

/* The projections as float32 FMAs, for head sizes without the tensor-core kernel below (the tiny
 * fixtures' 8, any other <= 128). One CTA: 32 tokens × 32 table rows of one head and one term (blockIdx.z = head·2 + term, term 0
 * c2p from Q and pos_key, 1 p2c from K and pos_query). Both operands staged as float32 in shared
 * memory, [32][D + 1] (the +1 makes the column reads of B conflict-free: thread x reads row x).
 * Thread (x, y) computes rows 4y .. 4y+3 of the tokens at table row x; a warp's 32 stores are one
 * contiguous 128-byte run of a scratch row. */
enum { PROJ_TILE = 32, PROJ_MAX_D = 128 };

template <typename T>
__global__ void __launch_bounds__(256)
rel_proj_kernel(float *__restrict__ c2p, float *__restrict__ p2c, const T *__restrict__ qkv,
                const T *__restrict__ pos_key, const T *__restrict__ pos_query, int n_tokens, int heads, int d,
                int r_lo, int W) {
    __shared__ float sa[PROJ_TILE][PROJ_MAX_D + 1];  // tokens' q or k [32][d]
    __shared__ float sb[PROJ_TILE][PROJ_MAX_D + 1];  // table rows [32][d]
    const int h = blockIdx.z / 2, term = blockIdx.z % 2;
    const T *table = term == 0 ? pos_key : pos_query;
    float *dst = term == 0 ? c2p : p2c;
    wait_for_upstream_grid();
    if (!table) return;  // uniform over the CTA
    const int H = heads * d;
    const int t0 = blockIdx.y * PROJ_TILE, r0 = blockIdx.x * PROJ_TILE;
    const int tid = threadIdx.y * 32 + threadIdx.x;
    /* q is column block 0 of a qkv row, k block 1 */
    const T *a = qkv + (size_t)term * H + (size_t)h * d;
    const T *b = table + (size_t)r_lo * H + (size_t)h * d;
    for (int i = tid; i < PROJ_TILE * d; i += 256) {
        const int row = i / d, e = i % d;
        sa[row][e] = t0 + row < n_tokens ? to_f32(a[(size_t)(t0 + row) * 3 * H + e]) : 0.0f;
        sb[row][e] = r0 + row < W ? to_f32(b[(size_t)(r0 + row) * H + e]) : 0.0f;
    }
    __syncthreads();
    const int x = threadIdx.x, y = threadIdx.y;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int e = 0; e < d; e++) {
        const float bv = sb[x][e];
#pragma unroll
        for (int u = 0; u < 4; u++) acc[u] = fmaf(sa[4 * y + u][e], bv, acc[u]);
    }
    if (r0 + x >= W) return;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int t = t0 + 4 * y + u;
        if (t < n_tokens) dst[((size_t)t * heads + h) * W + r0 + x] = acc[u];
    }
}

/* Rows [row0, row0+ROWS) of one head's Q, K or V into a shared tile [ROWS][D+8], rows at or past
 * `len` zero-filled (attention/mma.cu's load_tile; the pad spreads ldmatrix's rows over the banks). */
template <int ROWS, int D, int THREADS>
static __device__ __forceinline__ void rel_load_tile(uint16_t *dst, const uint16_t *src, size_t row_stride,
                                                     int row0, int len, int tid) {
    constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
    constexpr int LDS = D + 8;
    constexpr int ROW_STEP = THREADS / CHUNKS;
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

/* ---- 2b. any head size <= 128: one warp per (query token, head), as attention/generic.cu ---- */

template <typename T>
__global__ void attention_rel_generic_kernel(T *__restrict__ out, const T *__restrict__ qkv,
                                             const int32_t *__restrict__ cu_seqlens, int n_seqs, int n_tokens,
                                             int heads, int d, float scale, rel_bias rb) {
    const int warp = (int)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    const int t = warp / heads, h = warp % heads;
    wait_for_upstream_grid();
    /* rows past the last sequence (a recorded graph's slack) have no distances: skip them */
    if (t >= n_tokens || t >= cu_seqlens[n_seqs]) return;
    const int s = sequence_of(cu_seqlens, n_seqs, t);
    const int start = cu_seqlens[s], end = cu_seqlens[s + 1];
    const size_t H = (size_t)heads * d, stride = 3 * H;
    float q[4], acc[4] = {0, 0, 0, 0};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int c = lane + 32 * k;
        q[k] = c < d ? to_f32(qkv[t * stride + (size_t)h * d + c]) : 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = start; j < end; j++) {
        const T *kr = qkv + j * stride + H + (size_t)h * d, *vr = kr + H;
        float dot = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int c = lane + 32 * k;
            if (c < d) dot += q[k] * to_f32(kr[c]);
        }
        dot = (warp_sum(dot) + rel_term(rb, heads, h, t, j, t - j)) * scale;
        const float m_new = fmaxf(m, dot), correction = __expf(m - m_new), p = __expf(dot - m_new);
        l = l * correction + p;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int c = lane + 32 * k;
            acc[k] = acc[k] * correction + (c < d ? p * to_f32(vr[c]) : 0.0f);
        }
        m = m_new;
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int c = lane + 32 * k;
        if (c < d) out[t * H + (size_t)h * d + c] = from_f32<T>(acc[k] / l);
    }
}

/* ---- 3. head sizes 32, 64, 128: tensor cores, fp16 scratch read tile by tile -------------------
 *
 * The same two steps on tensor cores with the scratch in fp16. A first version kept float32
 * scratch [T, heads, W] and gathered each score's two terms from global memory: 9.7 ms a
 * DeBERTa-v3-base layer at 128 x 512 against 2.5 ms for this one (H200; docs/deberta.md).
 *  - rel_proj_half_kernel: one CTA = 64 tokens x 64 table rows of one head and term, mma.sync
 *    with float32 accumulation (skipped when none of its 64 tokens reads any of its 64 columns:
 *    proj_tile_needed), its accumulators rounded to fp16
 *    (saturated at ±65504; for bf16 inputs too: fp16 keeps 3 more mantissa bits and attention
 *    logits never come near the range) and stored through shared memory as 16-byte rows of
 *    [T, heads, Wp] half, Wp = W rounded up to 8 (rows 16-byte aligned; the pad rows are
 *    products with zero-filled table rows, 0).
 *  - attention_rel_band_kernel: the varlen flash attention of attention/mma.cu (64 queries x 64
 *    keys, 4 warps, online softmax in float32) where each raw score gets its two terms from
 *    windows staged in shared memory once per (query tile, key tile): query row i
 *    meets keys n0 .. n0 + 63, distances i - n0 - 63 .. i - n0, and the column is monotone in the
 *    distance, so it reads one run of at most 64 scratch columns (when a step of one distance
 *    moves at most one column: DeBERTa's buckets); key row j likewise over the tile's queries.
 *    sC[q][c] = c2p[m0 + q, sB[q] + c], sP[k][c] = p2c[n0 + k, sB[64 + k] + c] (sB the run's
 *    start rounded down to 8, so at most 9 chunks of 8), and sR[dd] the column of distance
 *    m0 - n0 - 63 + dd. The windows of tile j + 1 are loaded with cp.async after every warp has
 *    used those of tile j (one extra barrier a tile, two with the fit check), under the softmax
 *    and P·V of tile j. A tile with a run wider than 72 columns (buckets whose log part grows
 *    faster than one row a distance) gathers from global memory, in fp16. */

enum { WIN_CH = 9, WIN_COLS = WIN_CH * 8, WIN_LDB = WIN_COLS + 8 };

struct rel_band {
    const uint16_t *c2p, *p2c;  // [T, heads, Wp] fp16 bits, or NULL (term absent)
    const int32_t *rows;        // [2·sat + 1]
    int sat, r_lo, W, Wp;
};

static __device__ __forceinline__ int band_col(const rel_band &rb, int dist) {
    dist = max(-rb.sat, min(rb.sat, dist));
    const int r = __ldg(rb.rows + dist + rb.sat) - rb.r_lo;
    return max(0, min(rb.W - 1, r));
}

static __device__ __forceinline__ float half_bits_to_f32(uint16_t x) { return __half2float(__ushort_as_half(x)); }

static __device__ __forceinline__ uint32_t pack_half2_sat(float a, float b) {
    a = fminf(fmaxf(a, -65504.0f), 65504.0f);
    b = fminf(fmaxf(b, -65504.0f), 65504.0f);
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t *>(&h);
}

/* Whether a token of [t0, t0 + 64) reads a column of [r0, r0 + 64) of this term: token t at
 * position p of a sequence of L tokens reads c2p at distances p - (L - 1) .. p (it is the query)
 * and p2c at -p .. L - 1 - p (it is the key); rows past the last sequence read nothing. Called by
 * the whole CTA (a barrier decides). The attention kernel's windows may load columns a token
 * does not read (to 8-alignment, and for pairs past the sequence's end), but never uses them. */
static __device__ __forceinline__ bool proj_tile_needed(const rel_band &rb, const int32_t *cu_seqlens, int n_seqs,
                                                        int n_tokens, int term, int t0, int r0, int tid) {
    bool hit = false;
    const int t = t0 + tid;
    if (tid < 64 && t < n_tokens && t < cu_seqlens[n_seqs]) {
        const int sq = sequence_of(cu_seqlens, n_seqs, t);
        const int p = t - cu_seqlens[sq], L = cu_seqlens[sq + 1] - cu_seqlens[sq];
        const int lo = band_col(rb, term == 0 ? p - (L - 1) : -p), hi = band_col(rb, term == 0 ? p : L - 1 - p);
        hit = lo < r0 + 64 && hi >= r0;
    }
    return __syncthreads_or(hit) != 0;
}

template <int D, bool BF16>
__global__ void __launch_bounds__(128)
rel_proj_half_kernel(uint16_t *__restrict__ c2p, uint16_t *__restrict__ p2c, const uint16_t *__restrict__ qkv,
                     const uint16_t *__restrict__ pos_key, const uint16_t *__restrict__ pos_query, int n_tokens,
                     int heads, rel_band rb, const int32_t *__restrict__ cu_seqlens, int n_seqs) {
    const int r_lo = rb.r_lo, W = rb.W, Wp = rb.Wp;
    constexpr int ROWS = 64, LDS = D + 8, KQ = D / 16, NT = ROWS / 8, LDO = ROWS + 8;
    static_assert(2 * ROWS * LDS >= ROWS * LDO, "the output tile fits in the operands' space");
    __shared__ __align__(16) uint16_t smem[2 * ROWS * LDS];
    uint16_t *sA = smem, *sB = smem + ROWS * LDS;  // tokens [64][D+8], table rows [64][D+8]
    const int h = blockIdx.z / 2, term = blockIdx.z % 2;
    const uint16_t *table = term == 0 ? pos_key : pos_query;
    uint16_t *dst = term == 0 ? c2p : p2c;
    wait_for_upstream_grid();
    if (!table) return;  // uniform over the CTA
    const int H = heads * D;
    const int t0 = blockIdx.y * ROWS, r0 = blockIdx.x * ROWS;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    if (!proj_tile_needed(rb, cu_seqlens, n_seqs, n_tokens, term, t0, r0, tid)) return;
    rel_load_tile<ROWS, D, 128>(sA, qkv + (size_t)term * H + (size_t)h * D, (size_t)3 * H, t0, n_tokens, tid);
    rel_load_tile<ROWS, D, 128>(sB, table + (size_t)r_lo * H + (size_t)h * D, (size_t)H, r0, W, tid);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    float acc[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KQ; kk++) {
        uint32_t a[4];
        ldmatrix_x4(a, sA + (warp * 16 + (lane & 15)) * LDS + kk * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int nn = 0; nn < NT / 2; nn++) {
            uint32_t b[4];
            ldmatrix_x4(b, sB + (nn * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + kk * 16 + ((lane >> 3) & 1) * 8);
            mma16816<BF16>(acc[2 * nn], a, b[0], b[1]);
            mma16816<BF16>(acc[2 * nn + 1], a, b[2], b[3]);
        }
    }
    __syncthreads();  // every warp is done with sA / sB: the output tile [64 tokens][64 rows] goes there
    uint16_t *sO = smem;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const int tok = warp * 16 + lane / 4, col = t * 8 + (lane & 3) * 2;
        *reinterpret_cast<uint32_t *>(sO + tok * LDO + col) = pack_half2_sat(acc[t][0], acc[t][1]);
        *reinterpret_cast<uint32_t *>(sO + (tok + 8) * LDO + col) = pack_half2_sat(acc[t][2], acc[t][3]);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < ROWS * 8 / 128; i++) {
        const int c = tid + i * 128, row = c / 8, ch = c % 8;
        const int tok = t0 + row, r = r0 + ch * 8;
        if (tok < n_tokens && r < Wp)
            *reinterpret_cast<uint4 *>(dst + ((size_t)tok * heads + h) * Wp + r) =
                *reinterpret_cast<const uint4 *>(sO + row * LDO + ch * 8);
    }
}

/* Issues the cp.async loads of key tile n0's windows (query tile m0) and writes sR (the column of
 * each of the tile's 127 distances) and sB (each row's first loaded column); returns whether every
 * window fits WIN_COLS columns (uniform over the CTA: the barrier inside decides it). Query row q
 * (i = m0 + q) reaches distances i - n0 - 63 .. i - n0, key row c (j = n0 + c) m0 - j .. m0 + 63 - j:
 * 64 consecutive distances each, so at most 64 columns, 8-aligned 72. */
static __device__ __forceinline__ bool band_load(uint16_t *sC, uint16_t *sP, int *sR, int *sB, const rel_band &rb,
                                                 int start, int len, int head, int heads, int m0, int n0, int tid) {
    const int dlo = m0 - n0 - 63;
    if (tid < 127) sR[tid] = band_col(rb, dlo + tid);
    const int lo_d = tid < 64 ? dlo + tid : m0 - n0 - (tid - 64);
    const int lo = band_col(rb, lo_d), hi = band_col(rb, lo_d + 63);
    const int base = lo & ~7;
    sB[tid] = base;
    sB[128 + tid] = (hi - base) / 8 + 1;  // chunks this row needs
    if (__syncthreads_or(hi - base >= WIN_COLS)) return false;
    for (int i = tid; i < 2 * 64 * WIN_CH; i += 128) {
        const int which = i / (64 * WIN_CH), rem = i % (64 * WIN_CH), row = rem / WIN_CH, ch = rem % WIN_CH;
        const uint16_t *src = which ? rb.p2c : rb.c2p;
        if (!src || ch >= sB[128 + which * 64 + row]) continue;
        const int r0 = which ? n0 : m0, col = sB[which * 64 + row] + ch * 8;
        const bool ok = r0 + row < len;
        const int tok = start + (ok ? r0 + row : r0);
        cp_async16((which ? sP : sC) + row * WIN_LDB + ch * 8, src + ((size_t)tok * heads + head) * rb.Wp + col, ok);
    }
    return true;
}

template <int D, bool BF16>
__global__ void __launch_bounds__(128, (D <= 64 ? 3 : 1))
attention_rel_band_kernel(uint16_t *__restrict__ out,        // [T, heads*D]
                          const uint16_t *__restrict__ qkv,  // [T, 3, heads, D]
                          const int32_t *__restrict__ cu_seqlens, int seq_offset, int n_heads, float scale_log2,
                          rel_band rb) {
    constexpr int NWARPS = 4, BLOCK_N = 64;
    constexpr int BLOCK_M = 16 * NWARPS;
    constexpr int THREADS = NWARPS * 32;
    constexpr int LDS = D + 8;
    constexpr int NT = BLOCK_N / 8;
    constexpr int DT = D / 8;
    constexpr int KQ = D / 16;

    wait_for_upstream_grid();
    allow_dependent_launch();
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *sQ = smem;                    // [BLOCK_M][LDS]
    uint16_t *sK = sQ + BLOCK_M * LDS;      // [2][BLOCK_N][LDS]
    uint16_t *sV = sK + 2 * BLOCK_N * LDS;  // [2][BLOCK_N][LDS]
    uint16_t *sC = sV + 2 * BLOCK_N * LDS;  // [BLOCK_M][WIN_LDB]
    uint16_t *sP = sC + BLOCK_M * WIN_LDB;  // [BLOCK_N][WIN_LDB]
    int *sR = reinterpret_cast<int *>(sP + BLOCK_N * WIN_LDB);  // [128]
    int *sB = sR + 128;                                         // [256]

    const int seq = seq_offset + blockIdx.z, head = blockIdx.y;
    const int start = cu_seqlens[seq];
    const int len = cu_seqlens[seq + 1] - start;
    const int m0 = blockIdx.x * BLOCK_M;
    if (m0 >= len) return;

    const attention_head hd = attention_head_of<D>(qkv, start, head, n_heads);
    const int hidden = hd.hidden;
    const size_t row_stride = hd.row_stride;
    const uint16_t *q_g = hd.q, *k_g = hd.k, *v_g = hd.v;
    const int n_tiles = (len + BLOCK_N - 1) / BLOCK_N;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

    rel_load_tile<BLOCK_M, D, THREADS>(sQ, q_g, row_stride, m0, len, tid);
    rel_load_tile<BLOCK_N, D, THREADS>(sK, k_g, row_stride, 0, len, tid);
    rel_load_tile<BLOCK_N, D, THREADS>(sV, v_g, row_stride, 0, len, tid);
    bool band = band_load(sC, sP, sR, sB, rb, start, len, head, n_heads, m0, 0, tid);
    cp_async_commit();

    float o[DT][4];
#pragma unroll
    for (int t = 0; t < DT; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    uint32_t qf[KQ][4];
    const int qw = warp * 16 + lane / 4;  // this lane's first query row in the tile (the second + 8)
    const int row_a = m0 + qw;

    for (int j = 0; j < n_tiles; j++) {
        cp_async_wait_all();
        __syncthreads();  // tile j and its band visible to all; every warp is done with buffer (j+1)&1
        if (j == 0) {
#pragma unroll
            for (int kk = 0; kk < KQ; kk++)
                ldmatrix_x4(qf[kk], sQ + (warp * 16 + (lane & 15)) * LDS + kk * 16 + (lane >> 4) * 8);
        }
        if (j + 1 < n_tiles) {
            const int nb = (j + 1) & 1;
            rel_load_tile<BLOCK_N, D, THREADS>(sK + nb * BLOCK_N * LDS, k_g, row_stride, (j + 1) * BLOCK_N, len, tid);
            rel_load_tile<BLOCK_N, D, THREADS>(sV + nb * BLOCK_N * LDS, v_g, row_stride, (j + 1) * BLOCK_N, len, tid);
            cp_async_commit();
        }
        const uint16_t *k_s = sK + (j & 1) * BLOCK_N * LDS;
        const uint16_t *v_s = sV + (j & 1) * BLOCK_N * LDS;

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

        /* the relative terms: from the band in shared memory (or, for a band too wide, from global) */
        const int n0 = j * BLOCK_N;
        if (band) {
            const int bq[2] = {sB[qw], sB[qw + 8]};
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const int kc0 = t * 8 + (lane & 3) * 2;
                const int bk[2] = {sB[64 + kc0], sB[65 + kc0]};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int kc = kc0 + (e & 1), qr = qw + (e >> 1) * 8;
                    const int col = n0 + kc, row = m0 + qr;
                    if (col >= len) s[t][e] = -INFINITY;
                    else if (row < len) {
                        const int b = sR[qr - kc + 63];
                        float add = 0.0f;
                        if (rb.c2p) add += half_bits_to_f32(sC[qr * WIN_LDB + b - bq[e >> 1]]);
                        if (rb.p2c) add += half_bits_to_f32(sP[kc * WIN_LDB + b - bk[e & 1]]);
                        s[t][e] += add;
                    }
                }
            }
        } else {
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int col = n0 + t * 8 + (lane & 3) * 2 + (e & 1), row = row_a + (e >> 1) * 8;
                    if (col >= len) s[t][e] = -INFINITY;
                    else if (row < len) {
                        const int b = band_col(rb, row - col);
                        float add = 0.0f;
                        if (rb.c2p) add += half_bits_to_f32(__ldg(rb.c2p + ((size_t)(start + row) * n_heads + head) * rb.Wp + b));
                        if (rb.p2c) add += half_bits_to_f32(__ldg(rb.p2c + ((size_t)(start + col) * n_heads + head) * rb.Wp + b));
                        s[t][e] += add;
                    }
                }
        }
        if (j + 1 < n_tiles) {
            __syncthreads();  // every warp is done with band j
            band = band_load(sC, sP, sR, sB, rb, start, len, head, n_heads, m0, n0 + BLOCK_N, tid);
            cp_async_commit();
        }

#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int t = 0; t < NT; t++) mx = fmaxf(mx, fmaxf(s[t][2 * r], s[t][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m_run[r], mx);
            const float m_use = m_new * scale_log2;
            const float alpha = fast_exp2(fmaf(m_run[r], scale_log2, -m_use));
            m_run[r] = m_new;
            float sum = 0.0f;
#pragma unroll
            for (int t = 0; t < NT; t++) {
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

#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; kk++)
            mma_pv_step<BF16, D>(o, s[2 * kk], s[2 * kk + 1], v_s + kk * 16 * LDS, LDS, lane);
    }

    float inv[2];
    quad_row_inverse(l_run, inv);
    uint16_t *sO = sQ + warp * 16 * LDS;
    __syncwarp();
#pragma unroll
    for (int t = 0; t < DT; t++) {
        const int col = t * 8 + (lane & 3) * 2;
        *reinterpret_cast<uint32_t *>(sO + (lane / 4) * LDS + col) = pack2<BF16>(o[t][0] * inv[0], o[t][1] * inv[0]);
        *reinterpret_cast<uint32_t *>(sO + (lane / 4 + 8) * LDS + col) = pack2<BF16>(o[t][2] * inv[1], o[t][3] * inv[1]);
    }
    __syncwarp();
    constexpr int CHUNKS = D / 8;
#pragma unroll
    for (int c = lane; c < 16 * CHUNKS; c += 32) {
        const int r = c / CHUNKS, ch = c % CHUNKS;
        const int row = m0 + warp * 16 + r;
        if (row < len)
            *reinterpret_cast<uint4 *>(out + (size_t)(start + row) * hidden + (size_t)head * D + ch * 8) =
                *reinterpret_cast<const uint4 *>(sO + r * LDS + ch * 8);
    }
}

template <int D, bool BF16>
static cudaError_t launch_band(void *out, const void *qkv, const int32_t *cu_seqlens, int32_t n_seqs,
                               int32_t max_seqlen, int32_t n_heads, float scale, const rel_band &rb,
                               cudaStream_t stream) {
    constexpr int BLOCK_M = 64, BLOCK_N = 64;
    const size_t smem = (size_t)(BLOCK_M + 4 * BLOCK_N) * (D + 8) * sizeof(uint16_t) +
                        (size_t)(BLOCK_M + BLOCK_N) * WIN_LDB * sizeof(uint16_t) + 384 * sizeof(int);
    auto kernel = attention_rel_band_kernel<D, BF16>;
    static int attr_set[CUDA_MAX_DEVICES];
    const int dev = cuda_current_device();
    if (dev < 0 || !cuda_cache_load(&attr_set[dev])) {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        if (dev >= 0) cuda_cache_store(&attr_set[dev], 1);
    }
    const float scale_log2 = scale * 1.4426950408889634f;
    const unsigned m_blocks = (unsigned)((max_seqlen + BLOCK_M - 1) / BLOCK_M);
    for (int32_t s0 = 0; s0 < n_seqs; s0 += 65535) {
        const int32_t ns = n_seqs - s0 < 65535 ? n_seqs - s0 : 65535;
        kernel<<<dim3(m_blocks, (unsigned)n_heads, (unsigned)ns), 128, smem, stream>>>(
            (uint16_t *)out, (const uint16_t *)qkv, cu_seqlens, s0, n_heads, scale_log2, rb);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

static int band_wp(int W) { return (W + 7) / 8 * 8; }

/* Whether this head size runs the tensor-core path (else the generic kernels). */
static bool use_band(int head_size) { return head_size == 32 || head_size == 64 || head_size == 128; }

template <bool BF16>
static nopad_status attention_rel_band(const cuda_attention_rel_args *a, cudaStream_t s, bool proj_only) {
    const int Wp = band_wp(a->W);
    uint16_t *c2p = (uint16_t *)a->c2p, *p2c = (uint16_t *)a->p2c;
    const rel_band rb = {c2p, p2c, a->rows, a->sat, a->r_lo, a->W, Wp};
    const int D = a->head_size;
    const dim3 pgrid((unsigned)((Wp + 63) / 64), (unsigned)((a->n_tokens + 63) / 64), (unsigned)(2 * a->n_heads));
    const uint16_t *q = (const uint16_t *)a->qkv, *pk = (const uint16_t *)a->pos_key, *pq = (const uint16_t *)a->pos_query;
    if (D == 32) rel_proj_half_kernel<32, BF16><<<pgrid, 128, 0, s>>>(c2p, p2c, q, pk, pq, a->n_tokens, a->n_heads, rb, a->cu_seqlens, a->n_seqs);
    else if (D == 64) rel_proj_half_kernel<64, BF16><<<pgrid, 128, 0, s>>>(c2p, p2c, q, pk, pq, a->n_tokens, a->n_heads, rb, a->cu_seqlens, a->n_seqs);
    else rel_proj_half_kernel<128, BF16><<<pgrid, 128, 0, s>>>(c2p, p2c, q, pk, pq, a->n_tokens, a->n_heads, rb, a->cu_seqlens, a->n_seqs);
    const nopad_status st = launch_status("attention_rel projections");
    if (st != NOPAD_OK || proj_only) return st;
    cudaError_t e = D == 32 ? launch_band<32, BF16>(a->out, a->qkv, a->cu_seqlens, a->n_seqs, a->max_seqlen, a->n_heads, a->scale, rb, s)
                  : D == 64 ? launch_band<64, BF16>(a->out, a->qkv, a->cu_seqlens, a->n_seqs, a->max_seqlen, a->n_heads, a->scale, rb, s)
                            : launch_band<128, BF16>(a->out, a->qkv, a->cu_seqlens, a->n_seqs, a->max_seqlen, a->n_heads, a->scale, rb, s);
    if (e != cudaSuccess)
        return nopad_set_error(NOPAD_ERR_BACKEND, "cuda attention_rel: launch failed: %s (%s)", cudaGetErrorString(e),
                               cudaGetErrorName(e));
    return NOPAD_OK;
}

extern "C" size_t cuda_attention_rel_term_bytes(int32_t n_tokens, int32_t n_heads, int32_t head_size, int32_t W) {
    const size_t per_row = use_band(head_size) ? (size_t)band_wp(W) * 2 : (size_t)W * 4;
    return ((size_t)n_tokens * n_heads * per_row + 15) / 16 * 16;
}

/* ---- the launcher ----------------------------------------------------------------------------- */

template <typename T, bool BF16>
static nopad_status attention_rel_t(const cuda_attention_rel_args *a, cudaStream_t s, bool proj_only) {
    if (use_band(a->head_size)) return attention_rel_band<BF16>(a, s, proj_only);
    /* other head sizes: float32 scratch [T, heads, W] from FMAs, one warp per (query token, head) */
    const rel_bias rb = {a->c2p, a->p2c, a->rows, a->sat, a->r_lo, a->W};
    const int D = a->head_size;
    const dim3 pgrid((unsigned)((a->W + PROJ_TILE - 1) / PROJ_TILE),
                     (unsigned)((a->n_tokens + PROJ_TILE - 1) / PROJ_TILE), (unsigned)(2 * a->n_heads));
    rel_proj_kernel<T><<<pgrid, dim3(32, 8), 0, s>>>(a->c2p, a->p2c, (const T *)a->qkv, (const T *)a->pos_key,
                                                     (const T *)a->pos_query, a->n_tokens, a->n_heads, D, a->r_lo,
                                                     a->W);
    const nopad_status st = launch_status("attention_rel projections");
    if (st != NOPAD_OK || proj_only) return st;
    const size_t warps = (size_t)a->n_tokens * a->n_heads;
    const int blocks = (int)((warps * 32 + 255) / 256);
    attention_rel_generic_kernel<T><<<blocks, 256, 0, s>>>((T *)a->out, (const T *)a->qkv, a->cu_seqlens, a->n_seqs,
                                                           a->n_tokens, a->n_heads, D, a->scale, rb);
    return launch_status("attention_rel");
}

static nopad_status attention_rel_entry(nopad_dtype dtype, const cuda_attention_rel_args *a, void *stream,
                                        bool proj_only) {
    if (a->n_tokens == 0) return NOPAD_OK;
    if (a->head_size < 1 || a->head_size > PROJ_MAX_D)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cuda attention_rel: head size %d is not in [1, %d]",
                               a->head_size, PROJ_MAX_D);
    if (a->n_seqs < 1 || a->max_seqlen < 1 || a->n_heads < 1 || a->n_heads > 32767 || a->W < 1 ||
        (a->n_tokens + PROJ_TILE - 1) / PROJ_TILE > 65535)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cuda attention_rel: need n_seqs, max_seqlen, W >= 1, 1 <= n_heads <= 32767 and "
                               "n_tokens <= %d (got %d, %d, %d, %d, %d)",
                               65535 * PROJ_TILE, a->n_seqs, a->max_seqlen, a->W, a->n_heads, a->n_tokens);
    if (((uintptr_t)a->out | (uintptr_t)a->qkv) % 16)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cuda attention_rel: qkv and out must be 16-byte aligned");
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, (attention_rel_t<__half, false>(a, s, proj_only)),
                   (attention_rel_t<__nv_bfloat16, true>(a, s, proj_only)));
}

extern "C" nopad_status cuda_attention_rel(nopad_dtype dtype, const cuda_attention_rel_args *a, void *stream) {
    return attention_rel_entry(dtype, a, stream, false);
}

extern "C" nopad_status cuda_attention_rel_projections(nopad_dtype dtype, const cuda_attention_rel_args *a,
                                                       void *stream) {
    return attention_rel_entry(dtype, a, stream, true);
}

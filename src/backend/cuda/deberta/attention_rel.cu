/* CUDA: DeBERTa's disentangled attention on the packed stream (the backend's attention_rel op; the
 * reference is src/backend/cpu/cpu_attention_rel.c). Each raw score q_i·k_j gets
 *   c2p_ij + p2c_ij = q_i · pos_key[r_ij] + k_j · pos_query[r_ij]
 * added before the running maximum of a varlen flash attention, r_ij the table row of the distance
 * i - j read from `rows` (below). No [S, S] bias exists.
 *
 * - Head sizes 32, 64, 128 (section 3): one kernel; each (query tile, key tile) computes the two
 *   terms for the table rows its distances reach on tensor cores, in shared memory.
 * - Other head sizes (sections 1 and 2b; the tiny fixtures' 8, any other <= 128): two steps as the
 *   CPU op, float32 FMAs into scratch [T, heads, W] per term,
 *     c2p[t, h, r] = q_t · pos_key[r_lo + r]    p2c[t, h, r] = k_t · pos_query[r_lo + r]
 *   W = r_hi - r_lo + 1 <= min(2·max_seqlen - 1, 2k) (the bucket is monotone in the distance, so
 *   one sequence of max_seqlen tokens reaches rows r_lo .. r_hi and every shorter one a
 *   sub-range), then attention/generic.cu's warp a query row gathering them.
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

/* ---- 3. head sizes 32, 64, 128: one fused tensor-core kernel -----------------------------------
 *
 * attention/mma.cu's FlashAttention-2 tile (64 queries x 64 keys, 4 warps, cp.async double
 * buffering of K and V, online softmax in float32) with the relative terms computed inside the
 * tile: no scratch, nothing written but the output.
 *
 * Query tile m0 against key tile n0 meets the 127 distances delta - 63 + dd, dd = 0 .. 126
 * (delta = m0 - n0; query row qr and key row kc of the tile are dd = qr - kc + 63 apart). The
 * tile loads the window of pos_key and pos_query rows by distance, win[dd] = table[row(delta - 63
 * + dd)] (rows repeat where buckets merge distances; any bucket function works), and computes on
 * tensor cores, float32 accumulation:
 *   C[qr][dd] = q_(m0+qr) · pos_key-window[dd]     (the warp's own 16 query rows, Q in registers)
 *   P[kc][dd] = k_(n0+kc) · pos_query-window[dd]   (16 key rows a warp)
 * A score needs C only at dd = qr - kc + 63, i.e. dd in qr .. qr + 63 (80 window columns a warp,
 * not 128), and P likewise; each is stored skewed so that the score's term sits at its (qr, kc):
 *   sCs[qr][63 - kc] = C[qr][qr - kc + 63]      sPt[qr][kc] = P[kc][qr - kc + 63]
 * in float32, so the terms add no rounding of their own (an fp16 tile, half the shared memory,
 * needed conversions and saturation: with the k-outermost products below, 1.48 -> 1.30 ms a layer,
 * the two changes not measured apart). A thread's two scores (qr, kc) and (qr, kc + 1) then
 * read one 64-bit word of each. That is 2.5 more 64 x 64 x D products a tile pair than plain
 * attention, all on operands in shared memory or registers, against the earlier design's
 * projections into an fp16 scratch [T, heads, W] per term (1.6 GB written and read back a
 * DeBERTa-v3-base layer at 128 x 512) whose windows the tile gathered: docs/deberta.md.
 *
 * Per key tile j: wait for K_j, V_j and window j; issue K_(j+1), V_(j+1); C and P; a barrier
 * (sPt's rows come from every warp); issue window j + 1 (single-buffered: the barrier freed it);
 * S = Q·Kᵀ plus the terms; softmax; P·V. Q's tile is staged where sCs goes: read into registers
 * once, before the first C is written. */

enum { WIN_ROWS = 128, WIN_COLS_WARP = 80, TERM_LD = 64 + 8 };

struct rel_tables {
    const uint16_t *pos_key, *pos_query;  // [2k, heads·D] or NULL (term absent)
    const int32_t *rows;                  // [2·sat + 1]
    int sat;
};

static __device__ __forceinline__ int table_row(const rel_tables &rt, int dist) {
    dist = max(-rt.sat, min(rt.sat, dist));
    return __ldg(rt.rows + dist + rt.sat);
}

/* Issues the cp.async loads of the windows of the tile pair at offset delta: row dd < 127 of each
 * is the table row of distance delta - 63 + dd, row 127 zero (computed, never stored). */
template <int D>
static __device__ __forceinline__ void window_load(uint16_t *sWk, uint16_t *sWq, const rel_tables &rt, int head,
                                                   int hidden, int delta, int tid) {
    constexpr int CHUNKS = D / 8, LDS = D + 8, ROW_STEP = 128 / CHUNKS;
    const int r0 = tid / CHUNKS, ch = tid % CHUNKS;
#pragma unroll
    for (int i = 0; i < WIN_ROWS / ROW_STEP; i++) {
        const int dd = r0 + i * ROW_STEP;
        const size_t src = (size_t)table_row(rt, delta - 63 + dd) * hidden + (size_t)head * D + ch * 8;
        if (rt.pos_key) cp_async16(sWk + dd * LDS + ch * 8, rt.pos_key + src, dd < 127);
        if (rt.pos_query) cp_async16(sWq + dd * LDS + ch * 8, rt.pos_query + src, dd < 127);
    }
}

/* The warp's 16 rows (its query rows for C, key rows for P) times window columns c0 .. c0 + 79,
 * each product handed to store(row, dd, value) with row 0..15 inside the warp's slab. */
template <int D, bool BF16, typename Store>
static __device__ __forceinline__ void window_product(const uint32_t (*a)[4], const uint16_t *win, int c0, int lane,
                                                      Store store) {
    constexpr int LDS = D + 8, KQ = D / 16, NN = WIN_COLS_WARP / 16;
    float acc[2 * NN][4];
#pragma unroll
    for (int t = 0; t < 2 * NN; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
    const uint16_t *b_rows = win + (c0 + (lane & 7) + (lane >> 4) * 8) * LDS + ((lane >> 3) & 1) * 8;
    /* k outermost: 2·NN independent accumulator chains between two uses of one */
#pragma unroll
    for (int kk = 0; kk < KQ; kk++)
#pragma unroll
        for (int nn = 0; nn < NN; nn++) {
            uint32_t b[4];
            ldmatrix_x4(b, b_rows + nn * 16 * LDS + kk * 16);
            mma16816<BF16>(acc[2 * nn], a[kk], b[0], b[1]);
            mma16816<BF16>(acc[2 * nn + 1], a[kk], b[2], b[3]);
        }
#pragma unroll
    for (int t = 0; t < 2 * NN; t++) {
        const int row = lane / 4, dd = c0 + t * 8 + (lane & 3) * 2;
        store(row, dd, acc[t][0]);
        store(row, dd + 1, acc[t][1]);
        store(row + 8, dd, acc[t][2]);
        store(row + 8, dd + 1, acc[t][3]);
    }
}

/* s[t][e] += C + P of each of the warp's 16 x 64 scores, from the skewed tiles; FULL: every key
 * of the tile is inside the sequence (else the ones past it get -inf). */
template <bool FULL, int NT>
static __device__ __forceinline__ void add_rel_terms(float (*s)[4], const float *sCs, const float *sPt,
                                                     bool c2p, bool p2c, int qw, int lane, int n0, int len) {
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int kc = t * 8 + (lane & 3) * 2, qr = qw + h * 8;  // scores (qr, kc), (qr, kc + 1)
            float a0 = s[t][2 * h], a1 = s[t][2 * h + 1];
            if (c2p) {  // columns 62 - kc (for kc + 1) and 63 - kc (for kc)
                const float2 c = *reinterpret_cast<const float2 *>(sCs + qr * TERM_LD + 62 - kc);
                a0 += c.y, a1 += c.x;
            }
            if (p2c) {
                const float2 p = *reinterpret_cast<const float2 *>(sPt + qr * TERM_LD + kc);
                a0 += p.x, a1 += p.y;
            }
            s[t][2 * h] = !FULL && n0 + kc >= len ? -INFINITY : a0;
            s[t][2 * h + 1] = !FULL && n0 + kc + 1 >= len ? -INFINITY : a1;
        }
}

template <int D, bool BF16>
__global__ void __launch_bounds__(128, (D <= 64 ? 2 : 1))
attention_rel_fused_kernel(uint16_t *__restrict__ out,        // [T, heads*D]
                           const uint16_t *__restrict__ qkv,  // [T, 3, heads, D]
                           const int32_t *__restrict__ cu_seqlens, int seq_offset, int n_heads, float scale_log2,
                           rel_tables rt) {
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
    uint16_t *sK = smem;                        // [2][BLOCK_N][LDS]
    uint16_t *sV = sK + 2 * BLOCK_N * LDS;      // [2][BLOCK_N][LDS]
    uint16_t *sWk = sV + 2 * BLOCK_N * LDS;     // [WIN_ROWS][LDS] pos_key's window
    uint16_t *sWq = sWk + WIN_ROWS * LDS;       // [WIN_ROWS][LDS] pos_query's window
    /* [BLOCK_M][TERM_LD] float32 each; Q's tile [BLOCK_M][LDS] and the output's are staged in sCs */
    float *sCs = reinterpret_cast<float *>(sWq + WIN_ROWS * LDS);
    float *sPt = sCs + BLOCK_M * TERM_LD;
    uint16_t *sQ = reinterpret_cast<uint16_t *>(sCs);
    static_assert(2 * TERM_LD >= LDS, "Q's tile fits where sCs goes");

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
    const bool c2p = rt.pos_key != NULL, p2c = rt.pos_query != NULL;

    load_tile<BLOCK_M, D, THREADS>(sQ, q_g, row_stride, m0, len, tid);
    load_tile<BLOCK_N, D, THREADS>(sK, k_g, row_stride, 0, len, tid);
    load_tile<BLOCK_N, D, THREADS>(sV, v_g, row_stride, 0, len, tid);
    window_load<D>(sWk, sWq, rt, head, hidden, m0, tid);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    uint32_t qf[KQ][4];
#pragma unroll
    for (int kk = 0; kk < KQ; kk++) ldmatrix_x4(qf[kk], sQ + (warp * 16 + (lane & 15)) * LDS + kk * 16 + (lane >> 4) * 8);

    float o[DT][4];
#pragma unroll
    for (int t = 0; t < DT; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    const int qw = warp * 16 + lane / 4;  // this lane's first query row in the tile (the second + 8)

    for (int j = 0; j < n_tiles; j++) {
        cp_async_wait_all();
        __syncthreads();  // tile j and its windows visible; every warp done with tile j - 1 (and Q's tile)
        if (j + 1 < n_tiles) {
            const int nb = (j + 1) & 1;
            load_tile<BLOCK_N, D, THREADS>(sK + nb * BLOCK_N * LDS, k_g, row_stride, (j + 1) * BLOCK_N, len, tid);
            load_tile<BLOCK_N, D, THREADS>(sV + nb * BLOCK_N * LDS, v_g, row_stride, (j + 1) * BLOCK_N, len, tid);
            cp_async_commit();
        }
        const uint16_t *k_s = sK + (j & 1) * BLOCK_N * LDS;
        const uint16_t *v_s = sV + (j & 1) * BLOCK_N * LDS;
        const int n0 = j * BLOCK_N;

        /* C and P of this tile pair, skewed into sCs / sPt */
        if (c2p) {
            const int q_base = warp * 16;  // C[qr][dd] is needed for dd - qr in 0 .. 63
            window_product<D, BF16>(qf, sWk, q_base, lane, [&](int row, int dd, float v) {
                const int qr = q_base + row, x = dd - qr;
                if (x >= 0 && x < 64) sCs[qr * TERM_LD + x] = v;
            });
        }
        if (p2c) {
            uint32_t kf[KQ][4];
#pragma unroll
            for (int kk = 0; kk < KQ; kk++)
                ldmatrix_x4(kf[kk], k_s + (warp * 16 + (lane & 15)) * LDS + kk * 16 + (lane >> 4) * 8);
            const int k_base = warp * 16;  // P[kc][dd] is needed for qr = dd + kc - 63 in 0 .. 63
            window_product<D, BF16>(kf, sWq, 48 - k_base, lane, [&](int row, int dd, float v) {
                const int kc = k_base + row, qr = dd + kc - 63;
                if (qr >= 0 && qr < 64) sPt[qr * TERM_LD + kc] = v;
            });
        }
        __syncthreads();  // sPt complete; the windows are free
        if (j + 1 < n_tiles) {
            window_load<D>(sWk, sWq, rt, head, hidden, m0 - n0 - BLOCK_N, tid);
            cp_async_commit();
        }

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
        if (n0 + BLOCK_N <= len) add_rel_terms<true, NT>(s, sCs, sPt, c2p, p2c, qw, lane, n0, len);
        else add_rel_terms<false, NT>(s, sCs, sPt, c2p, p2c, qw, lane, n0, len);

        online_softmax_tile<NT, DT>(s, o, m_run, l_run, scale_log2);

#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; kk++)
            mma_pv_step<BF16, D>(o, s[2 * kk], s[2 * kk + 1], v_s + kk * 16 * LDS, LDS, lane);
    }

    float inv[2];
    quad_row_inverse(l_run, inv);
    __syncthreads();  // every warp is done with sCs: its space stages the output
    store_warp_rows<BF16, D>(out, sQ + warp * 16 * LDS, o, inv, lane, m0 + warp * 16, len, start, hidden, head);
}

template <int D, bool BF16>
static cudaError_t launch_fused(void *out, const void *qkv, const int32_t *cu_seqlens, int32_t n_seqs,
                                int32_t max_seqlen, int32_t n_heads, float scale, const rel_tables &rt,
                                cudaStream_t stream) {
    constexpr int BLOCK_M = 64, BLOCK_N = 64;
    const size_t smem = (size_t)(4 * BLOCK_N + 2 * WIN_ROWS) * (D + 8) * sizeof(uint16_t) +
                        (size_t)2 * BLOCK_M * TERM_LD * sizeof(float);
    auto kernel = attention_rel_fused_kernel<D, BF16>;
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
            (uint16_t *)out, (const uint16_t *)qkv, cu_seqlens, s0, n_heads, scale_log2, rt);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

/* Whether this head size runs the fused tensor-core kernel (else the generic kernels and their
 * float32 scratch). */
static bool use_fused(int head_size) { return head_size == 32 || head_size == 64 || head_size == 128; }

template <bool BF16>
static nopad_status attention_rel_fused(const cuda_attention_rel_args *a, cudaStream_t s) {
    const rel_tables rt = {(const uint16_t *)a->pos_key, (const uint16_t *)a->pos_query, a->rows, a->sat};
    const int D = a->head_size;
    cudaError_t e = D == 32 ? launch_fused<32, BF16>(a->out, a->qkv, a->cu_seqlens, a->n_seqs, a->max_seqlen, a->n_heads, a->scale, rt, s)
                  : D == 64 ? launch_fused<64, BF16>(a->out, a->qkv, a->cu_seqlens, a->n_seqs, a->max_seqlen, a->n_heads, a->scale, rt, s)
                            : launch_fused<128, BF16>(a->out, a->qkv, a->cu_seqlens, a->n_seqs, a->max_seqlen, a->n_heads, a->scale, rt, s);
    if (e != cudaSuccess)
        return nopad_set_error(NOPAD_ERR_BACKEND, "cuda attention_rel: launch failed: %s (%s)", cudaGetErrorString(e),
                               cudaGetErrorName(e));
    return NOPAD_OK;
}

extern "C" size_t cuda_attention_rel_term_bytes(int32_t n_tokens, int32_t n_heads, int32_t head_size, int32_t W) {
    if (use_fused(head_size)) return 0;
    return ((size_t)n_tokens * n_heads * W * sizeof(float) + 15) / 16 * 16;
}

/* ---- the launcher ----------------------------------------------------------------------------- */

template <typename T, bool BF16>
static nopad_status attention_rel_t(const cuda_attention_rel_args *a, cudaStream_t s) {
    if (use_fused(a->head_size)) return attention_rel_fused<BF16>(a, s);
    /* other head sizes: float32 scratch [T, heads, W] from FMAs, one warp per (query token, head) */
    if ((a->n_tokens + PROJ_TILE - 1) / PROJ_TILE > 65535 || a->W < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cuda attention_rel: head size %d needs W >= 1 and n_tokens <= %d (got %d, %d)",
                               a->head_size, 65535 * PROJ_TILE, a->W, a->n_tokens);
    const rel_bias rb = {a->c2p, a->p2c, a->rows, a->sat, a->r_lo, a->W};
    const int D = a->head_size;
    const dim3 pgrid((unsigned)((a->W + PROJ_TILE - 1) / PROJ_TILE),
                     (unsigned)((a->n_tokens + PROJ_TILE - 1) / PROJ_TILE), (unsigned)(2 * a->n_heads));
    rel_proj_kernel<T><<<pgrid, dim3(32, 8), 0, s>>>(a->c2p, a->p2c, (const T *)a->qkv, (const T *)a->pos_key,
                                                     (const T *)a->pos_query, a->n_tokens, a->n_heads, D, a->r_lo,
                                                     a->W);
    const nopad_status st = launch_status("attention_rel projections");
    if (st != NOPAD_OK) return st;
    const size_t warps = (size_t)a->n_tokens * a->n_heads;
    const int blocks = (int)((warps * 32 + 255) / 256);
    attention_rel_generic_kernel<T><<<blocks, 256, 0, s>>>((T *)a->out, (const T *)a->qkv, a->cu_seqlens, a->n_seqs,
                                                           a->n_tokens, a->n_heads, D, a->scale, rb);
    return launch_status("attention_rel");
}

extern "C" nopad_status cuda_attention_rel(nopad_dtype dtype, const cuda_attention_rel_args *a, void *stream) {
    if (a->n_tokens == 0) return NOPAD_OK;
    if (a->head_size < 1 || a->head_size > PROJ_MAX_D)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cuda attention_rel: head size %d is not in [1, %d]",
                               a->head_size, PROJ_MAX_D);
    if (a->n_seqs < 1 || a->max_seqlen < 1 || a->n_heads < 1 || a->n_heads > 32767)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cuda attention_rel: need n_seqs, max_seqlen >= 1 and 1 <= n_heads <= 32767 (got %d, "
                               "%d, %d)", a->n_seqs, a->max_seqlen, a->n_heads);
    if (((uintptr_t)a->out | (uintptr_t)a->qkv | (uintptr_t)a->pos_key | (uintptr_t)a->pos_query) % 16)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cuda attention_rel: qkv, out and the position tables must be 16-byte aligned");
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, (attention_rel_t<__half, false>(a, s)), (attention_rel_t<__nv_bfloat16, true>(a, s)));
}

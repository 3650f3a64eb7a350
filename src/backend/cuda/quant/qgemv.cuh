/* The quantized GEMV (quant.h, cuda_qgemv): y[T, N] = epilogue(x[T, K] · w[N, K]ᵀ) with w in a
 * block format, T <= 32. Compiled once per dtype (qgemv_f16.cu, qgemv_bf16.cu).
 *
 * Work split, as the fp16 gemv's (gemm/gemv.cu): a CTA of 8 warps owns 16 output rows and all of
 * K, cut into chunks of 32 values; chunk c belongs to warp c % 8; grid = ceil(N / 16). The warps'
 * partial sums meet in shared memory and are added in warp order (the same bits on every run).
 *
 * One chunk, 16 rows × 32 values, is two m16n8k16 MMAs per 8 tokens. Lane (g = lane / 4,
 * l4 = lane % 4) reads the integers of values 4·l4 .. 4·l4 + 3 (the first MMA) and 16 + 4·l4 ..
 * 16 + 4·l4 + 3 (the second) of rows g and g + 8 (quant.cuh, q_read_chunk), and the activations of
 * token g at the same values (two 8-byte loads). The fragment wants columns 2·l4, 2·l4 + 1,
 * 2·l4 + 8, 2·l4 + 9 of each 16; A and B both put value 4·l4 + i there, so the sum is over the
 * same products. The MMAs' fp32 sums Σ q·x are exact up to fp32 accumulation (each product of a
 * small integer and a 16-bit x is exact), then scaled by the row's chunk scale in fp32; the
 * formats with a min add min · Σ x, Σ x from the same MMA with A all ones. Q6_K's two scales per
 * chunk (one per 16 values) scale the two MMAs apart.
 *
 * Two kernels read the blocks, chosen in launch_tile: the staged one (16-byte cp.async into a
 * shared-memory ring) for w 16-byte aligned, the direct one (2-byte loads from global memory) for
 * any other w. Both run multiply_chunk on the same chunks in the same order: the same bits. */
#ifndef NOPAD_BACKEND_CUDA_QUANT_QGEMV_CUH
#define NOPAD_BACKEND_CUDA_QUANT_QGEMV_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/activation.cuh"
#include "backend/cuda/common.h"
#include "backend/cuda/ptx_helpers.cuh"
#include "backend/cuda/quant/mma_rows.cuh"
#include "backend/cuda/quant/quant.cuh"

namespace qgemv {

enum { WARPS = 8, THREADS = 32 * WARPS, FEATS = 16, CHUNK = 32 };

struct params {
    void *y;
    const void *x, *w, *bias, *residual;
    int T, K, N;
    int act;     /* a nopad_activation, < 0 none */
    int out_f32; /* y float32, no epilogue */
    size_t row_bytes;
};

/* two small integers (|a|, |b| <= 128, exact in either dtype) as one fragment register, a in the
 * low half. fp16 without conversions (int -> float -> half2 is three conversions a pair, which the
 * CUDA guide rates at 16 a clock a SM, a quarter of integer or fp16 arithmetic): fp16's values 1024 .. 2047 are
 * 0x6400 + their distance from 1024 in bits, so 0x6480 + q is 1152 + q, and 1152 + q - 1152 is q
 * exactly (every |q| <= 128; checked on the host for each). bf16's 7 mantissa bits hold no such
 * run of 257 integers: it converts. */
template <bool BF16> __device__ __forceinline__ uint32_t pack2(int a, int b) {
    if (BF16) {
        const __nv_bfloat162 h = __floats2bfloat162_rn((float)a, (float)b);
        return *reinterpret_cast<const uint32_t *>(&h);
    }
    const uint32_t biased = (uint32_t)(a + 0x6480) | (uint32_t)(b + 0x6480) << 16;
    const __half2 h = __hsub2(*reinterpret_cast<const __half2 *>(&biased), __half2half2(__ushort_as_half(0x6480)));
    return *reinterpret_cast<const uint32_t *>(&h);
}
template <bool BF16> __device__ __forceinline__ uint32_t ones2() { return BF16 ? 0x3f803f80u : 0x3c003c00u; }

/* What a lane holds of one chunk of one row for the MMAs: pair[k] the 16-bit values v[2k],
 * v[2k + 1] of q_lane in the dtype (pairs 0, 1 the first 16 values, 2, 3 the second), and the
 * chunk's scales and min. */
struct q_frag {
    uint32_t pair[4];
    float scale, scale_hi, min;
};
template <bool BF16, int FMT> __device__ __forceinline__ q_frag q_read_frag(const uint8_t *row, int c, int l4) {
    q_frag f;
    if constexpr (!BF16 && q_has_pairs<FMT>()) { /* the bytes put in place, one subtraction a pair */
        const q_pairs q = q_read_pairs<FMT>(row, c, l4);
        const __half2 bias = __half2half2(__ushort_as_half((unsigned short)q_pair_bias<FMT>()));
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const __half2 h = __hsub2(*reinterpret_cast<const __half2 *>(&q.pair[k]), bias);
            f.pair[k] = *reinterpret_cast<const uint32_t *>(&h);
        }
        f.scale = q.scale;
        f.scale_hi = q.scale_hi;
        f.min = q.min;
        return f;
    }
    const q_lane q = q_read_chunk<FMT>(row, c, l4);
#pragma unroll
    for (int k = 0; k < 4; k++) f.pair[k] = pack2<BF16>(q.v[2 * k], q.v[2 * k + 1]);
    f.scale = q.scale;
    f.scale_hi = q.scale_hi;
    f.min = q.min;
    return f;
}

/* Where lane (g, l4) reads token tile j's activations (token 8j + g, values 4·l4 ..) and whether
 * that token exists (x_ok: else zeros). */
template <int NT> struct x_lanes {
    const uint16_t *row[NT];
    bool ok[NT];
};
template <int NT> __device__ __forceinline__ x_lanes<NT> x_lanes_of(const params &p, int g, int l4) {
    x_lanes<NT> xl;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int t = 8 * j + g;
        xl.ok[j] = t < p.T;
        xl.row[j] = static_cast<const uint16_t *>(p.x) + (size_t)(xl.ok[j] ? t : 0) * p.K + 4 * l4;
    }
    return xl;
}

/* acc += chunk c of rows g (a) and g + 8 (b) times every token tile's activations at c. Both
 * kernels below run this same code in the same chunk order, so they give the same bits. */
template <bool BF16, int FMT, int NT>
__device__ __forceinline__ void multiply_chunk(float (&acc)[NT][4], const q_frag &a, const q_frag &b,
                                               const x_lanes<NT> &xl, int c) {
    const uint2 zero = make_uint2(0, 0);
    /* A: row g in registers 0 and 2, row g + 8 in 1 and 3 (m16n8k16's fragment order) */
    const uint32_t a_lo[4] = {a.pair[0], b.pair[0], a.pair[1], b.pair[1]};
    const uint32_t a_hi[4] = {a.pair[2], b.pair[2], a.pair[3], b.pair[3]};
    const uint32_t ones[4] = {ones2<BF16>(), ones2<BF16>(), ones2<BF16>(), ones2<BF16>()};
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const uint2 xlo = xl.ok[j] ? *reinterpret_cast<const uint2 *>(xl.row[j] + c * CHUNK) : zero;
        const uint2 xhi = xl.ok[j] ? *reinterpret_cast<const uint2 *>(xl.row[j] + c * CHUNK + 16) : zero;
        float lo[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma16816<BF16>(lo, a_lo, xlo.x, xlo.y);
        if (FMT == NOPAD_WEIGHT_Q6_K) {
            float hi[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            mma16816<BF16>(hi, a_hi, xhi.x, xhi.y);
            acc[j][0] += a.scale * lo[0] + a.scale_hi * hi[0];
            acc[j][1] += a.scale * lo[1] + a.scale_hi * hi[1];
            acc[j][2] += b.scale * lo[2] + b.scale_hi * hi[2];
            acc[j][3] += b.scale * lo[3] + b.scale_hi * hi[3];
        } else {
            mma16816<BF16>(lo, a_hi, xhi.x, xhi.y);
            acc[j][0] += a.scale * lo[0];
            acc[j][1] += a.scale * lo[1];
            acc[j][2] += b.scale * lo[2];
            acc[j][3] += b.scale * lo[3];
        }
        if (qformat_has_min<FMT>()) {
            float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* Σ x of tokens 2·l4, 2·l4 + 1, twice */
            mma16816<BF16>(sum, ones, xlo.x, xlo.y);
            mma16816<BF16>(sum, ones, xhi.x, xhi.y);
            acc[j][0] += a.min * sum[0];
            acc[j][1] += a.min * sum[1];
            acc[j][2] += b.min * sum[2];
            acc[j][3] += b.min * sum[3];
        }
    }
}

/* The direct kernel: each lane reads its chunks' bytes from global memory itself, 16 bits at a
 * time (a block is only 2-byte aligned), one chunk ahead. For weights not 16-byte aligned. */
template <bool BF16, int FMT, int NT>
__global__ void __launch_bounds__(THREADS, 1) qgemv_kernel(const params p) {
    __shared__ float partial[WARPS][NT * 4][32];
    allow_dependent_launch();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, l4 = lane % 4;
    const int n0 = blockIdx.x * FEATS;
    /* rows past N read row N - 1 (in bounds) and are never stored */
    const int r_lo = min(n0 + g, p.N - 1), r_hi = min(n0 + g + 8, p.N - 1);
    const uint8_t *w = static_cast<const uint8_t *>(p.w);
    const uint8_t *w_lo = w + (size_t)r_lo * p.row_bytes, *w_hi = w + (size_t)r_hi * p.row_bytes;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const int n_chunks = p.K / CHUNK;
    /* the warp's first chunk of weights is read before the kernel ahead has finished (they do not
     * depend on it), each next one while the current one is multiplied: two chunks in flight */
    q_frag a = {}, b = {};
    if (warp < n_chunks) {
        a = q_read_frag<BF16, FMT>(w_lo, warp, l4);
        b = q_read_frag<BF16, FMT>(w_hi, warp, l4);
    }
    wait_for_upstream_grid(); /* x and the residual may come from it */
    const x_lanes<NT> xl = x_lanes_of<NT>(p, g, l4);
    for (int c = warp; c < n_chunks; c += WARPS) {
        q_frag next_a = a, next_b = b;
        if (c + WARPS < n_chunks) {
            next_a = q_read_frag<BF16, FMT>(w_lo, c + WARPS, l4);
            next_b = q_read_frag<BF16, FMT>(w_hi, c + WARPS, l4);
        }
        multiply_chunk<BF16, FMT, NT>(acc, a, b, xl, c);
        a = next_a;
        b = next_b;
    }
    mma_rows_reduce_store<BF16, WARPS, NT>(partial, acc, n0, p.T, p.N, nullptr, p.y, p.bias, p.residual, p.act, p.out_f32);
}

/* The staged kernel's shared-memory ring. Stage s is values 512s .. 512s + 511 of the CTA's 16
 * rows: 16 blocks of 32 or two super-blocks a row, `BYTES` contiguous bytes of each row, chunks
 * 16s + w and 16s + 8 + w for warp w, in that order (the direct kernel's chunk-to-warp map and
 * order; two chunks a warp between two barriers, whose reads and MMAs can overlap). A row's run is
 * copied with 16-byte cp.async from the 16-byte aligned address at or below its start (the rows
 * are contiguous, so those bytes belong to the weight whenever w itself is 16-byte aligned) and up
 * to its last byte (the last 16 bytes zero-filled past it): SEG bytes a row hold the run at any
 * alignment. STAGES fills up to 40 KiB (3 to 7 stages): 27-34 KiB of weights requested ahead a
 * CTA, which at one CTA a SM (N = 2048: 128 CTAs) is about what an H100 needs in flight to run at
 * its copy rate (3.3 TB/s × ~1 µs / 132 SMs = 25 KiB). */
enum { CHUNKS_A_WARP = 2, STAGE_CHUNKS = WARPS * CHUNKS_A_WARP };
template <int FMT> struct stage_ring {
    /* a row's blocks a stage */
    static constexpr int BLOCKS = qformat<FMT>::BLOCK == CHUNK ? STAGE_CHUNKS : STAGE_CHUNKS * CHUNK / qformat<FMT>::BLOCK;
    static constexpr int BYTES = BLOCKS * qformat<FMT>::BYTES;
    static constexpr int SEG = (BYTES + 15) / 16 * 16 + 16;
    static constexpr int STAGES = 40960 / (FEATS * SEG);
    static constexpr int RING = STAGES * FEATS * SEG;
};

/* Piece `piece` (0 .. SEG/16 - 1) of stage s of row `row` (its first byte at `row`): the 16
 * bytes at `from` go to the row's slot + 16·piece, of which the first src_bytes (1..16) are the
 * weight's (copy_stage reads only those and zeroes the rest); src_bytes 0: nothing to copy. The run of `bytes` bytes starts at offset
 * run_offset(row, s) of the slot. Host and device (the host checks the ring's layout). */
struct stage_piece {
    const uint8_t *from;
    int src_bytes;
};
template <int FMT> __host__ __device__ __forceinline__ const uint8_t *stage_run(const uint8_t *row, int s) {
    return row + (size_t)s * stage_ring<FMT>::BYTES;
}
template <int FMT> __host__ __device__ __forceinline__ int run_offset(const uint8_t *row, int s) {
    return (int)(reinterpret_cast<uintptr_t>(stage_run<FMT>(row, s)) & 15);
}
/* bytes of stage s's run in each row: 16 blocks of 32 (fewer in the last stage) or two
 * super-blocks (one in the last stage of an odd count) */
template <int FMT> __host__ __device__ __forceinline__ int stage_bytes(int s, int n_chunks) {
    constexpr int per_block = qformat<FMT>::BLOCK / CHUNK; /* chunks a block: 1 or 8 */
    const int blocks = (n_chunks - STAGE_CHUNKS * s) / per_block;
    return (blocks < stage_ring<FMT>::BLOCKS ? blocks : stage_ring<FMT>::BLOCKS) * qformat<FMT>::BYTES;
}
template <int FMT>
__host__ __device__ __forceinline__ stage_piece stage_piece_of(const uint8_t *row, int s, int bytes, int piece) {
    const uint8_t *run = stage_run<FMT>(row, s);
    const uint8_t *from = run - run_offset<FMT>(row, s) + 16 * piece;
    const long left = (long)(run + bytes - from); /* the run's bytes at and after `from` */
    return stage_piece{from, left <= 0 ? 0 : left < 16 ? (int)left : 16};
}

/* Stage s of the CTA's rows n0 .. n0 + 15 (rows past N: row N - 1) into buf, row r's slot at
 * buf + r·SEG, one 16-byte piece a thread at a time. */
template <int FMT>
__device__ __forceinline__ void copy_stage(uint8_t *buf, const params &p, int n0, int s, int n_chunks) {
    using R = stage_ring<FMT>;
    constexpr int PIECES = R::SEG / 16;
    const int bytes = stage_bytes<FMT>(s, n_chunks);
    for (int e = threadIdx.x; e < FEATS * PIECES; e += THREADS) {
        const int r = e / PIECES, piece = e % PIECES;
        const uint8_t *row = static_cast<const uint8_t *>(p.w) + (size_t)min(n0 + r, p.N - 1) * p.row_bytes;
        const stage_piece c = stage_piece_of<FMT>(row, s, bytes, piece);
        uint8_t *to = buf + r * R::SEG + 16 * piece;
        if (c.src_bytes == 16) {
            cp_async16(to, c.from, true);
        } else if (c.src_bytes > 0) {
            /* a run's last piece: its bytes in pairs (the blocks are 2-byte aligned), so no
             * 16-byte read reaches past the weight's end (compute-sanitizer flagged cp.async's
             * zero-filling form there as a 16-byte read); the slot is free as for cp.async, and
             * the barrier that publishes the stage publishes these stores too */
            for (int i = 0; i < 16; i += 2) {
                const uint16_t v = i < c.src_bytes ? *reinterpret_cast<const uint16_t *>(c.from + i) : 0;
                *reinterpret_cast<uint16_t *>(to + i) = v;
            }
        }
    }
}

/* The staged kernel: the CTA copies its rows' bytes into a ring of STAGES stages with 16-byte
 * cp.async, STAGES - 1 stages ahead of the warps, which decode from shared memory (q_read_frag,
 * as the direct kernel). Needs w 16-byte aligned. The first STAGES - 1 stages are requested before
 * griddepcontrol.wait: the weights stream in while the kernel ahead finishes. */
template <bool BF16, int FMT, int NT>
__global__ void __launch_bounds__(THREADS, 1) qgemv_staged_kernel(const params p) {
    using R = stage_ring<FMT>;
    static_assert(R::STAGES >= 2, "a ring of at least two stages");
    static_assert(R::RING >= (int)sizeof(float) * WARPS * NT * 4 * 32, "the warps' partial sums reuse the ring");
    __shared__ __align__(16) uint8_t ring[R::RING];
    allow_dependent_launch();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, l4 = lane % 4;
    const int n0 = blockIdx.x * FEATS;
    const int n_chunks = p.K / CHUNK, n_stages = (n_chunks + STAGE_CHUNKS - 1) / STAGE_CHUNKS;
    /* where rows g and g + 8 start in global memory: their runs' offsets mod 16 in the ring */
    const uint8_t *w = static_cast<const uint8_t *>(p.w);
    const uint8_t *w_lo = w + (size_t)min(n0 + g, p.N - 1) * p.row_bytes;
    const uint8_t *w_hi = w + (size_t)min(n0 + g + 8, p.N - 1) * p.row_bytes;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    /* one commit group a stage, empty past the last: group i is stage i */
    for (int s = 0; s < R::STAGES - 1; s++) {
        if (s < n_stages) copy_stage<FMT>(ring + (s % R::STAGES) * FEATS * R::SEG, p, n0, s, n_chunks);
        cp_async_commit();
    }
    wait_for_upstream_grid(); /* x and the residual may come from it */
    const x_lanes<NT> xl = x_lanes_of<NT>(p, g, l4);
    for (int s = 0; s < n_stages; s++) {
        /* into the slot stage s - 1 used: every warp is past it (the barrier ending s - 1) */
        const int ahead = s + R::STAGES - 1;
        if (ahead < n_stages) copy_stage<FMT>(ring + (ahead % R::STAGES) * FEATS * R::SEG, p, n0, ahead, n_chunks);
        cp_async_commit();
        cp_async_wait_group<R::STAGES - 1>(); /* this thread's pieces of stage s have landed */
        __syncthreads();                      /* and every thread's */
        const uint8_t *buf = ring + (s % R::STAGES) * FEATS * R::SEG;
        const uint8_t *run_lo = buf + g * R::SEG + run_offset<FMT>(w_lo, s);
        const uint8_t *run_hi = buf + (g + 8) * R::SEG + run_offset<FMT>(w_hi, s);
#pragma unroll
        for (int h = 0; h < CHUNKS_A_WARP; h++) {
            const int in_stage = WARPS * h + warp, c = STAGE_CHUNKS * s + in_stage;
            if (c < n_chunks) {
                const q_frag a = q_read_frag<BF16, FMT>(run_lo, in_stage, l4);
                const q_frag b = q_read_frag<BF16, FMT>(run_hi, in_stage, l4);
                multiply_chunk<BF16, FMT, NT>(acc, a, b, xl, c);
            }
        }
        __syncthreads(); /* stage s's slot may be refilled */
    }
    cp_async_wait_all(); /* nothing left in flight (every stage was waited for above) */
    mma_rows_reduce_store<BF16, WARPS, NT>(reinterpret_cast<float (*)[NT * 4][32]>(ring), acc, n0, p.T, p.N, nullptr, p.y,
                                          p.bias, p.residual, p.act, p.out_f32);
}

template <bool BF16, int FMT, int NT>
cudaError_t launch_tile(const params &p, dim3 grid, dim3 block, bool pdl, cudaStream_t stream) {
    if (reinterpret_cast<uintptr_t>(p.w) % 16 == 0)
        return launch_maybe_pdl(qgemv_staged_kernel<BF16, FMT, NT>, grid, block, 0, stream, pdl, p);
    return launch_maybe_pdl(qgemv_kernel<BF16, FMT, NT>, grid, block, 0, stream, pdl, p);
}

/* With programmatic dependent launch (cuda_pdl_enabled) as the fp16 gemv: the weights of the first
 * chunks stream in while the kernel ahead finishes. The one place the two kernels part: the staged
 * kernel (16-byte copies into shared memory, ~30 KiB in flight a CTA) wherever w is 16-byte
 * aligned, which every weight the backend allocates is; the direct one (2-byte loads, two chunks
 * in flight a warp) for a w at any other address. They give the same bits (test_cuda_quant
 * checks). */
template <bool BF16, int FMT> cudaError_t launch_format(const params &p, cudaStream_t stream) {
    const dim3 grid((unsigned)((p.N + FEATS - 1) / FEATS)), block(THREADS);
    const bool pdl = cuda_pdl_enabled() != 0;
    if (p.T <= 8) return launch_tile<BF16, FMT, 1>(p, grid, block, pdl, stream);
    if (p.T <= 16) return launch_tile<BF16, FMT, 2>(p, grid, block, pdl, stream);
    if (p.T <= 24) return launch_tile<BF16, FMT, 3>(p, grid, block, pdl, stream);
    return launch_tile<BF16, FMT, 4>(p, grid, block, pdl, stream);
}

/* The kernel for p's format (checked by the caller: one of the eight). */
template <bool BF16> cudaError_t launch(int format, const params &p, cudaStream_t stream) {
    switch (format) {
    case NOPAD_WEIGHT_Q4_0: return launch_format<BF16, NOPAD_WEIGHT_Q4_0>(p, stream);
    case NOPAD_WEIGHT_Q4_1: return launch_format<BF16, NOPAD_WEIGHT_Q4_1>(p, stream);
    case NOPAD_WEIGHT_Q5_0: return launch_format<BF16, NOPAD_WEIGHT_Q5_0>(p, stream);
    case NOPAD_WEIGHT_Q5_1: return launch_format<BF16, NOPAD_WEIGHT_Q5_1>(p, stream);
    case NOPAD_WEIGHT_Q8_0: return launch_format<BF16, NOPAD_WEIGHT_Q8_0>(p, stream);
    case NOPAD_WEIGHT_Q4_K: return launch_format<BF16, NOPAD_WEIGHT_Q4_K>(p, stream);
    case NOPAD_WEIGHT_Q5_K: return launch_format<BF16, NOPAD_WEIGHT_Q5_K>(p, stream);
    default: return launch_format<BF16, NOPAD_WEIGHT_Q6_K>(p, stream);
    }
}

} // namespace qgemv

/* qgemv_f16.cu / qgemv_bf16.cu */
cudaError_t qgemv_launch_f16(int format, const qgemv::params &p, cudaStream_t stream);
cudaError_t qgemv_launch_bf16(int format, const qgemv::params &p, cudaStream_t stream);

#endif

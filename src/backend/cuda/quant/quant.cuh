/* Device-side reading of GGUF block formats (ggml-common.h's layouts, as backend/cpu/quant.h and
 * io/gguf_dequant.c read them), shared by the quantized GEMV (qgemv.cu) and the dequantising
 * kernels (dequant.cu).
 *
 * A row of K values is K / 32 blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) or K / 256 super-blocks
 * (Q4_K, Q5_K, Q6_K), each read here as eight chunks of 32. Every value of a chunk is
 * scale·q + min with q a small integer (|q| <= 128), one scale per chunk (Q6_K: one per 16
 * values, `scale_hi` for the second 16) and one min (0 for the formats without one). Blocks are
 * only 2-byte aligned (18, 20, 22, 34, 210 bytes), so every read is of 16 bits or less. */
#ifndef NOPAD_BACKEND_CUDA_QUANT_QUANT_CUH
#define NOPAD_BACKEND_CUDA_QUANT_QUANT_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "backend/backend.h"

/* Elements and bytes of one (super-)block. */
template <int FMT> struct qformat;
template <> struct qformat<NOPAD_WEIGHT_Q4_0> { static constexpr int BLOCK = 32, BYTES = 18; };
template <> struct qformat<NOPAD_WEIGHT_Q4_1> { static constexpr int BLOCK = 32, BYTES = 20; };
template <> struct qformat<NOPAD_WEIGHT_Q5_0> { static constexpr int BLOCK = 32, BYTES = 22; };
template <> struct qformat<NOPAD_WEIGHT_Q5_1> { static constexpr int BLOCK = 32, BYTES = 24; };
template <> struct qformat<NOPAD_WEIGHT_Q8_0> { static constexpr int BLOCK = 32, BYTES = 34; };
template <> struct qformat<NOPAD_WEIGHT_Q4_K> { static constexpr int BLOCK = 256, BYTES = 144; };
template <> struct qformat<NOPAD_WEIGHT_Q5_K> { static constexpr int BLOCK = 256, BYTES = 176; };
template <> struct qformat<NOPAD_WEIGHT_Q6_K> { static constexpr int BLOCK = 256, BYTES = 210; };

/* Whether the format has a min per chunk (x = scale·q + min): its dot product needs Σ x. */
template <int FMT> __host__ __device__ constexpr bool qformat_has_min() {
    return FMT == NOPAD_WEIGHT_Q4_1 || FMT == NOPAD_WEIGHT_Q5_1 || FMT == NOPAD_WEIGHT_Q4_K ||
           FMT == NOPAD_WEIGHT_Q5_K;
}

__host__ __device__ __forceinline__ uint32_t q_ld16(const uint8_t *p) { return *reinterpret_cast<const uint16_t *>(p); }
/* 4 bytes at a 2-byte aligned address, little-endian */
__host__ __device__ __forceinline__ uint32_t q_ld32(const uint8_t *p) { return q_ld16(p) | q_ld16(p + 2) << 16; }
__host__ __device__ __forceinline__ float q_half(const uint8_t *p) { return __half2float(__ushort_as_half((uint16_t)q_ld16(p))); }

/* ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j (0..7) from the 12 bytes q. */
__host__ __device__ __forceinline__ void q_scale_min_k4(int j, const uint8_t *q, int &sc, int &m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0x0f) | (q[j - 4] >> 6) << 4;
        m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

/* What a lane reads of one chunk of 32 of one row: v[0..3] the integers of elements
 * 4·l4 .. 4·l4 + 3 and v[4..7] those of 16 + 4·l4 .. 16 + 4·l4 + 3 (l4 in 0..3; four lanes read a
 * chunk), the offsets (Q4_0's 8, Q5_0's 16, Q6_K's 32) already subtracted; value = scale·v + min,
 * scale_hi for v[4..7]. */
/* Q4_K / Q5_K chunk c (0 .. K/32 - 1): its super-block of the row at `row` (returned), the
 * sub-block *s (c % 8), and that sub-block's scale d·sc and min -dmin·m (x = scale·q + min). */
template <int FMT>
__host__ __device__ __forceinline__ const uint8_t *q_k_sub_block(const uint8_t *row, int c, int *s, float *scale,
                                                               float *min) {
    const uint8_t *b = row + (size_t)(c / 8) * qformat<FMT>::BYTES;
    *s = c % 8;
    int sc, m;
    q_scale_min_k4(*s, b + 4, sc, m);
    *scale = q_half(b) * (float)sc;
    *min = -(q_half(b + 2) * (float)m);
    return b;
}

struct q_lane {
    int v[8];
    float scale, scale_hi, min;
};

/* Chunk c (0 .. K/32 - 1) of the row at `row`, the part of lane l4. */
template <int FMT> __host__ __device__ __forceinline__ q_lane q_read_chunk(const uint8_t *row, int c, int l4) {
    q_lane r;
    r.min = 0.0f;
    if (FMT == NOPAD_WEIGHT_Q4_0 || FMT == NOPAD_WEIGHT_Q4_1 || FMT == NOPAD_WEIGHT_Q5_0 ||
        FMT == NOPAD_WEIGHT_Q5_1) {
        /* d [, m] [, qh[4]], qs[16]: byte j holds element j (low nibble) and j + 16 (high) */
        const uint8_t *b = row + (size_t)c * qformat<FMT>::BYTES;
        constexpr bool has_m = FMT == NOPAD_WEIGHT_Q4_1 || FMT == NOPAD_WEIGHT_Q5_1;
        constexpr bool five = FMT == NOPAD_WEIGHT_Q5_0 || FMT == NOPAD_WEIGHT_Q5_1;
        constexpr int qs_at = 2 + (has_m ? 2 : 0) + (five ? 4 : 0);
        constexpr int offset = has_m ? 0 : five ? 16 : 8;
        r.scale = r.scale_hi = q_half(b);
        if (has_m) r.min = q_half(b + 2);
        const uint32_t qs = q_ld32(b + qs_at + 4 * l4);
        const uint32_t qh = five ? q_ld32(b + 2 + (has_m ? 2 : 0)) : 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int byte = (qs >> (8 * i)) & 0xff, e = 4 * l4 + i;
            const int hi_lo = five ? (int)((qh >> e) & 1) << 4 : 0;
            const int hi_hi = five ? (int)((qh >> (e + 16)) & 1) << 4 : 0;
            r.v[i] = ((byte & 0x0f) | hi_lo) - offset;
            r.v[4 + i] = ((byte >> 4) | hi_hi) - offset;
        }
    } else if (FMT == NOPAD_WEIGHT_Q8_0) {
        /* d, int8 qs[32] */
        const uint8_t *b = row + (size_t)c * 34;
        r.scale = r.scale_hi = q_half(b);
        const uint32_t lo = q_ld32(b + 2 + 4 * l4), hi = q_ld32(b + 18 + 4 * l4);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            r.v[i] = (int8_t)(lo >> (8 * i));
            r.v[4 + i] = (int8_t)(hi >> (8 * i));
        }
    } else if (FMT == NOPAD_WEIGHT_Q4_K || FMT == NOPAD_WEIGHT_Q5_K) {
        /* d, dmin, scales[12], [qh[32],] qs[128]: sub-block s's element l is qs[32·(s/2) + l]'s
         * nibble s % 2, and (Q5_K) 16 · bit s of qh[l]; x = d·sc_s·q - dmin·m_s */
        constexpr bool five = FMT == NOPAD_WEIGHT_Q5_K;
        int s;
        const uint8_t *b = q_k_sub_block<FMT>(row, c, &s, &r.scale, &r.min);
        r.scale_hi = r.scale;
        const uint8_t *qs = b + (five ? 48 : 16) + 32 * (s / 2);
        const uint32_t lo = q_ld32(qs + 4 * l4), hi = q_ld32(qs + 16 + 4 * l4);
        const uint32_t hlo = five ? q_ld32(b + 16 + 4 * l4) : 0, hhi = five ? q_ld32(b + 32 + 4 * l4) : 0;
        const int shift = 4 * (s % 2);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            r.v[i] = (int)((lo >> (8 * i + shift)) & 15) | (five ? (int)((hlo >> (8 * i + s)) & 1) << 4 : 0);
            r.v[4 + i] = (int)((hi >> (8 * i + shift)) & 15) | (five ? (int)((hhi >> (8 * i + s)) & 1) << 4 : 0);
        }
    } else { /* NOPAD_WEIGHT_Q6_K */
        /* ql[128], qh[64], int8 scales[16], d. Chunk c: half h = c / 4, cc = c % 4; element l is
         * ql[64h + 32·(cc % 2) + l]'s nibble cc / 2 and bits 2·cc, 2·cc + 1 of qh[32h + l], minus
         * 32; scales[8h + 2·cc] for l < 16, scales[8h + 2·cc + 1] after */
        const uint8_t *b = row + (size_t)(c / 8) * 210;
        const int h = (c % 8) / 4, cc = c % 4;
        const float d = q_half(b + 208);
        const int8_t *sc = reinterpret_cast<const int8_t *>(b + 192) + 8 * h + 2 * cc;
        r.scale = d * (float)sc[0];
        r.scale_hi = d * (float)sc[1];
        const uint8_t *ql = b + 64 * h + 32 * (cc % 2), *qh = b + 128 + 32 * h;
        const uint32_t lo = q_ld32(ql + 4 * l4), hi = q_ld32(ql + 16 + 4 * l4);
        const uint32_t hlo = q_ld32(qh + 4 * l4), hhi = q_ld32(qh + 16 + 4 * l4);
        const int ns = 4 * (cc / 2), hs = 2 * cc;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            r.v[i] = ((int)((lo >> (8 * i + ns)) & 15) | (int)((hlo >> (8 * i + hs)) & 3) << 4) - 32;
            r.v[4 + i] = ((int)((hi >> (8 * i + ns)) & 15) | (int)((hhi >> (8 * i + hs)) & 3) << 4) - 32;
        }
    }
    return r;
}

/* Q4_0, Q4_1, Q8_0, Q4_K and Q6_K read straight into fp16 pairs (q_read_pairs): a lane's values of
 * a chunk as pair[k] = the fp16 bits of bias + v[2k] (low half) and bias + v[2k + 1] (high half),
 * bias + v in 1024 .. 2047 (fp16's integers a step apart, so pair - bias, in fp16, is v exactly),
 * `bias` the fp16 bits of q_pair_bias: no integer is formed, each half is a byte of the block (or
 * its nibble, with Q6_K's two high bits) moved into place and or-ed with 0x6400. scale, scale_hi
 * and min as q_read_chunk's. (Q5_0, Q5_1 and Q5_K spread one bit a value from qh: they form
 * integers.) */
template <int FMT> __host__ __device__ constexpr bool q_has_pairs() {
    return FMT == NOPAD_WEIGHT_Q4_0 || FMT == NOPAD_WEIGHT_Q4_1 || FMT == NOPAD_WEIGHT_Q8_0 ||
           FMT == NOPAD_WEIGHT_Q4_K || FMT == NOPAD_WEIGHT_Q6_K;
}
/* 1024 + the value a stored 0 stands for, negated: Q4_0's 8 (v = nibble - 8), Q8_0's 128 (the
 * byte's sign bit flipped is v + 128), Q6_K's 32; Q4_1 and Q4_K store v itself */
template <int FMT> __host__ __device__ constexpr uint32_t q_pair_bias() {
    return FMT == NOPAD_WEIGHT_Q4_0 ? 0x6408u
           : FMT == NOPAD_WEIGHT_Q8_0 ? 0x6480u
           : FMT == NOPAD_WEIGHT_Q6_K ? 0x6420u
                                      : 0x6400u;
}
struct q_pairs {
    uint32_t pair[4];
    float scale, scale_hi, min;
};
/* bytes 0, 1 of u into the low bytes of its two halves, and bytes 2, 3, or-ed with 0x6400 */
__host__ __device__ __forceinline__ uint32_t q_pair01(uint32_t u) { return (u & 0xffu) | (u & 0xff00u) << 8 | 0x64006400u; }
__host__ __device__ __forceinline__ uint32_t q_pair23(uint32_t u) { return (u >> 16 & 0xffu) | (u >> 8 & 0xff0000u) | 0x64006400u; }

/* Chunk c of the row at `row`, the part of lane l4, for the formats of q_has_pairs. */
template <int FMT> __host__ __device__ __forceinline__ q_pairs q_read_pairs(const uint8_t *row, int c, int l4) {
    q_pairs r;
    r.min = 0.0f;
    uint32_t lo, hi; /* the bytes of values 4·l4 .. 4·l4 + 3 and 16 + 4·l4 .. as bias + v - 1024 */
    if (FMT == NOPAD_WEIGHT_Q8_0) { /* d, int8 qs[32] */
        const uint8_t *b = row + (size_t)c * qformat<FMT>::BYTES;
        r.scale = r.scale_hi = q_half(b);
        lo = q_ld32(b + 2 + 4 * l4) ^ 0x80808080u;
        hi = q_ld32(b + 18 + 4 * l4) ^ 0x80808080u;
    } else if (FMT == NOPAD_WEIGHT_Q4_K) { /* q_read_chunk's layout, nibble s % 2 of each byte */
        int s;
        const uint8_t *b = q_k_sub_block<FMT>(row, c, &s, &r.scale, &r.min);
        r.scale_hi = r.scale;
        const uint8_t *qs = b + 16 + 32 * (s / 2);
        const int shift = 4 * (s % 2);
        lo = q_ld32(qs + 4 * l4) >> shift & 0x0f0f0f0fu;
        hi = q_ld32(qs + 16 + 4 * l4) >> shift & 0x0f0f0f0fu;
    } else if (FMT == NOPAD_WEIGHT_Q6_K) { /* q_read_chunk's layout: nibble | 2 high bits << 4, 0 .. 63 */
        const uint8_t *b = row + (size_t)(c / 8) * qformat<FMT>::BYTES;
        const int h = (c % 8) / 4, cc = c % 4;
        const float d = q_half(b + 208);
        const int8_t *sc = reinterpret_cast<const int8_t *>(b + 192) + 8 * h + 2 * cc;
        r.scale = d * (float)sc[0];
        r.scale_hi = d * (float)sc[1];
        const uint8_t *ql = b + 64 * h + 32 * (cc % 2), *qh = b + 128 + 32 * h;
        const int ns = 4 * (cc / 2), hs = 2 * cc;
        lo = (q_ld32(ql + 4 * l4) >> ns & 0x0f0f0f0fu) | (q_ld32(qh + 4 * l4) >> hs & 0x03030303u) << 4;
        hi = (q_ld32(ql + 16 + 4 * l4) >> ns & 0x0f0f0f0fu) | (q_ld32(qh + 16 + 4 * l4) >> hs & 0x03030303u) << 4;
    } else { /* Q4_0: d, qs[16]; Q4_1: d, m, qs[16]; byte j holds value j (low nibble) and j + 16 */
        constexpr bool has_m = FMT == NOPAD_WEIGHT_Q4_1;
        const uint8_t *b = row + (size_t)c * qformat<FMT>::BYTES;
        r.scale = r.scale_hi = q_half(b);
        if (has_m) r.min = q_half(b + 2);
        const uint32_t qs = q_ld32(b + (has_m ? 4 : 2) + 4 * l4);
        lo = qs & 0x0f0f0f0fu;
        hi = qs >> 4 & 0x0f0f0f0fu;
    }
    r.pair[0] = q_pair01(lo);
    r.pair[1] = q_pair23(lo);
    r.pair[2] = q_pair01(hi);
    r.pair[3] = q_pair23(hi);
    return r;
}

#endif

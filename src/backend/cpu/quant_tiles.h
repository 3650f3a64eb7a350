/* The tile kernels of quant.h's GEMM on x86-64, written once and compiled twice: by quant_avx2.c
 * for AVX2 + FMA + F16C and by quant_vnni.c with AVX-512 VNNI's VPDPBUSD on 256-bit vectors besides
 * (QUANT_TILES_VNNI), each defining TARGET (the functions' target attribute), QUANT_TILES_VNNI and
 * QUANT_TILES_GEMM (the entry point's name) before including it. Both give the same integer sums,
 * hence the same floats bit for bit.
 *
 * The core step multiplies unsigned bytes by signed bytes and sums them into int32 lanes:
 * _mm256_maddubs_epi16 (pairs into int16) then _mm256_madd_epi16, or VPDPBUSD in one. Weight
 * quants are made unsigned (0..15, 0..31, 0..63) and the activations are |q| <= 127, so a maddubs
 * pair is at most 2·63·127 = 16002 and never saturates. Q8_0's signed weights use the sign trick
 * (|w| × a·sign(w)): at most 2·128·127 = 32512. Offsets (Q4_0's 8, Q5_0's 16, Q6_K's 32) and
 * mins are taken off with the activations' block sums, in integers, as in quant.c.
 *
 * Every kernel computes a tile of R weight rows × C activation rows: a weight block is unpacked
 * once for the C tokens and an activation block loaded once for the R rows; the R·C independent
 * sums also hide the latency of each one's chain of multiply-adds, which bounds a lone dot product
 * (prefill was dequantised tiles and sgemm before this, docs/decoder.md). A (row, token) pair's
 * arithmetic is the same whatever the tile, in the same order, so its result is bit for bit the
 * one-row dot's (R = C = 1): a row's output does not depend on how many tokens share its step. */
#ifndef NOPAD_BACKEND_CPU_QUANT_TILES_H
#define NOPAD_BACKEND_CPU_QUANT_TILES_H

#include <immintrin.h>
#include <string.h>

#include "backend/cpu/quant.h"

/* the tile kernels take R and C as constants from their callers: inlined, their loops unroll and
 * the R·C accumulators live in registers */
#define KERNEL TARGET static inline __attribute__((always_inline))

enum { QK = CPU_QUANT_QK, QK_K = CPU_QUANT_QK_K };
enum { R_MAX = QUANT_TILES_ROWS32, C_MAX = 4 }; /* the largest tile any kernel below is called with (C_MAX: one SSE register) */

TARGET static inline float fp16_at(const uint8_t *p) {
    return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8));
}

TARGET static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* acc + Σ u·a over 32 bytes as 8 int32 (u unsigned, a signed): VPDPBUSD where the CPU has it,
 * else pairs summed into int16 (maddubs) then into int32 (madd). */
TARGET static inline __m256i dot_u8_i8(__m256i acc, __m256i u, __m256i a) {
#if QUANT_TILES_VNNI
    return _mm256_dpbusd_epi32(acc, u, a);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1)));
#endif
}

/* 16 bytes of nibble pairs -> 32 bytes: elements 0..15 (low nibbles) then 16..31 (high). */
TARGET static inline __m256i unpack_nibbles16(const uint8_t *p) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

/* Q5_0 / Q5_1's 32 fifth bits (qh, little-endian) -> 16 in byte i where bit i is set, else 0
 * (ggml's bytes_from_bits_32: each byte gets its qh byte, then is compared with its own bit). */
TARGET static inline __m256i fifth_bits(const uint8_t *qh) {
    int32_t bits;
    memcpy(&bits, qh, sizeof bits);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                   0x0101010101010101, 0x0000000000000000));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                                          _mm256_set1_epi64x(-1));
    return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

/* v[0..C-1] in lanes 0..C-1 (C is 1 or 4), built from scalars: a vector load of floats just
 * stored one by one would wait for the stores (no store forwarding). */
KERNEL __m128 lanes(const float v[C_MAX], const int C) {
    return C == 1 ? _mm_set_ss(v[0]) : _mm_setr_ps(v[0], v[1], v[2], v[3]);
}

/* ---- blocks of 32: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 --------------------------------------------- */

/* A weight block of 32 unpacked for the tile: u its quants as unsigned bytes (|q| for Q8_0), q
 * Q8_0's signed quants (their signs), dm its fp16 d and m as floats (lanes 0 and 1). */
typedef struct block32 {
    __m256i u, q;
    __m128 dm;
} block32;

KERNEL block32 unpack32(uint32_t type, const uint8_t *w) {
    block32 b;
    b.q = _mm256_setzero_si256();
    b.dm = _mm_setzero_ps();
    switch (type) {
    case CPU_QUANT_Q8_0:
        b.q = _mm256_loadu_si256((const __m256i *)(w + 2));
        b.u = _mm256_abs_epi8(b.q);
        b.dm = _mm_set_ss(fp16_at(w));
        break;
    case CPU_QUANT_Q4_0:
        b.u = unpack_nibbles16(w + 2);
        b.dm = _mm_set_ss(fp16_at(w));
        break;
    case CPU_QUANT_Q5_0:
        b.u = _mm256_or_si256(unpack_nibbles16(w + 6), fifth_bits(w + 2));
        b.dm = _mm_set_ss(fp16_at(w));
        break;
    default: { /* Q4_1, Q5_1: d and m in one conversion */
        int32_t dm16;
        memcpy(&dm16, w, sizeof dm16);
        b.dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm16));
        b.u = type == CPU_QUANT_Q4_1 ? unpack_nibbles16(w + 4)
                                     : _mm256_or_si256(unpack_nibbles16(w + 8), fifth_bits(w + 4));
    }
    }
    return b;
}

/* out[r·C + c] = row r · token c, for R rows of nb blocks (w_bytes apart) and C <= 4 rows of
 * activations (a_bytes apart). Per block: Q8_0 d_w·d_a·Σ |q|·a·sign(q); Q4_0 / Q5_0 d_w·d_a·(Σ
 * q·a - 8·Σa / 16·Σa), the offset in one lane's sum; Q4_1 / Q5_1 d_w·d_a·Σ q·a, and m·(d_a·Σa)
 * summed on its own, the tile's tokens in the lanes of one register per row (a lane's sum is the
 * same whatever C is). */
KERNEL void tile32(uint32_t type, const uint8_t *w, size_t w_bytes, const uint8_t *a, size_t a_bytes,
                   int32_t nb, float *out, const int R, const int C) {
    const size_t bytes = type == CPU_QUANT_Q8_0   ? 34
                         : type == CPU_QUANT_Q4_0 ? 18
                         : type == CPU_QUANT_Q4_1 ? 20
                         : type == CPU_QUANT_Q5_0 ? 22
                                                  : 24;
    const int with_min = type == CPU_QUANT_Q4_1 || type == CPU_QUANT_Q5_1;
    const int32_t offset = type == CPU_QUANT_Q4_0 ? 8 : type == CPU_QUANT_Q5_0 ? 16 : 0;
    __m256 acc[R_MAX][C_MAX];
    __m128 sum_m[R_MAX];
    for (int r = 0; r < R; r++) {
        sum_m[r] = _mm_setzero_ps();
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    }
    for (int32_t i = 0; i < nb; i++) {
        block32 wb[R_MAX];
        for (int r = 0; r < R; r++) wb[r] = unpack32(type, w + w_bytes * (size_t)r + bytes * (size_t)i);
        if (with_min) {
            float s_a[C_MAX] = {0};
            for (int c = 0; c < C; c++) {
                const cpu_q8_block *ab = (const cpu_q8_block *)(a + a_bytes * (size_t)c) + i;
                s_a[c] = ab->d * (float)ab->sum;
            }
            const __m128 s = lanes(s_a, C);
            for (int r = 0; r < R; r++)
                sum_m[r] = _mm_fmadd_ps(_mm_shuffle_ps(wb[r].dm, wb[r].dm, 0x55), s, sum_m[r]);
        }
        for (int c = 0; c < C; c++) {
            const cpu_q8_block *ab = (const cpu_q8_block *)(a + a_bytes * (size_t)c) + i;
            const __m256i y = _mm256_loadu_si256((const __m256i *)ab->qs);
            for (int r = 0; r < R; r++) {
                /* the offset's -o·Σa starts lane 0 */
                const __m256i start = offset ? _mm256_setr_epi32(-offset * ab->sum, 0, 0, 0, 0, 0, 0, 0)
                                             : _mm256_setzero_si256();
                const __m256i dot = type == CPU_QUANT_Q8_0 ? dot_u8_i8(start, wb[r].u, _mm256_sign_epi8(y, wb[r].q))
                                                           : dot_u8_i8(start, wb[r].u, y);
                acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(_mm_cvtss_f32(wb[r].dm) * ab->d),
                                            _mm256_cvtepi32_ps(dot), acc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        float m[4];
        _mm_storeu_ps(m, sum_m[r]);
        for (int c = 0; c < C; c++) out[r * C + c] = with_min ? hsum_ps(acc[r][c]) + m[c] : hsum_ps(acc[r][c]);
    }
}

#if !QUANT_TILES_VNNI /* VPDPBUSD has no part in the k-quants: their sub-block scales need madd */
/* ---- the k-quants: Q4_K, Q5_K, Q6_K --------------------------------------------------------- */

/* A Q4_K / Q5_K block's 12 bytes of 6-bit scales and mins at q (ggml's get_scale_min_k4 for all 8
 * sub-blocks at once, in a vector; reads 16 bytes, the last 4 the block's own quants, unused):
 * int16 lanes 0..7 the scales, 8..15 the mins. Bytes 0..3 hold scales 0..3 and bytes 4..7 mins
 * 0..3 in their low 6 bits; bytes 8..11 scales 4..7 (low nibble) and mins 4..7 (high nibble),
 * whose top 2 bits are the top 2 bits of bytes 0..3 and 4..7. */
TARGET static inline __m256i scales_mins_k4(const uint8_t *q) {
    const __m128i v = _mm_loadu_si128((const __m128i *)q);
    const __m128i low = _mm_and_si128(v, _mm_set_epi64x(0, 0x3f3f3f3f3f3f3f3f)); /* bytes 0..7 */
    const __m128i b8 = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, 8, 9, 10, 11, 8, 9, 10, 11));
    const __m128i nib = _mm_blend_epi32(_mm_and_si128(b8, _mm_set1_epi8(0x0f)),
                                        _mm_and_si128(_mm_srli_epi16(b8, 4), _mm_set1_epi8(0x0f)), 0x8);
    const __m128i top = _mm_shuffle_epi8(_mm_and_si128(_mm_srli_epi16(v, 6), _mm_set1_epi8(3)),
                                         _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 2, 3, 4, 5, 6, 7));
    const __m128i all = _mm_or_si128(low, _mm_or_si128(nib, _mm_slli_epi16(top, 4))); /* sc 0-3, m 0-3, sc 4-7, m 4-7 */
    return _mm256_cvtepu8_epi16(
        _mm_shuffle_epi8(all, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15)));
}

/* s2 holds 8 int16 in each 128-bit half: lane a of them in every int16 of the low half, lane b in
 * every int16 of the high half (one byte shuffle) */
KERNEL __m256i pick16(__m256i s2, const int a, const int b) {
    return _mm256_shuffle_epi8(s2, _mm256_set_m128i(_mm_set1_epi16((short)(0x0100 * (2 * b + 1) + 2 * b)),
                                                    _mm_set1_epi16((short)(0x0100 * (2 * a + 1) + 2 * a))));
}

/* Q4_K and Q5_K (layouts in quant.c): per 64 elements one 32-byte load of qs gives sub-blocks
 * 2k (low nibbles) and 2k+1 (high); Q5_K adds bit 2k / 2k+1 of qh as 16. The scales multiply
 * the int16 pair sums (madd), the mins go through the block sums: Σ_j m_j·(bsum_2j + bsum_2j+1),
 * one madd of the 8 mins with the 8 pair sums. The scales and mins are unpacked once per block
 * in vectors (scales_mins_k4); the integers are ggml's, summed in the same lanes whatever the tile. */
KERNEL void tile45_k(int five_bits, const uint8_t *w, size_t w_bytes, const uint8_t *a, size_t a_bytes,
                     int32_t nb, float *out, const int R, const int C) {
    const size_t bytes = five_bits ? 176 : 144;
    const __m256i low4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    __m256 acc[R_MAX][C_MAX];
    __m128 sum_m[R_MAX]; /* the mins' part: the tile's tokens in the lanes */
    for (int r = 0; r < R; r++) {
        sum_m[r] = _mm_setzero_ps();
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    }
    for (int32_t i = 0; i < nb; i++) {
        __m256i sumi[R_MAX][C_MAX], sc2[R_MAX];
        __m128i mins[R_MAX];
        for (int r = 0; r < R; r++) {
            const __m256i sm = scales_mins_k4(w + w_bytes * (size_t)r + bytes * (size_t)i + 4);
            sc2[r] = _mm256_permute2x128_si256(sm, sm, 0x00); /* the scales in both halves */
            mins[r] = _mm256_extracti128_si256(sm, 1);
            for (int c = 0; c < C; c++) sumi[r][c] = _mm256_setzero_si256();
        }
        for (int k = 0; k < 4; k++) {
            __m256i lo[R_MAX], hi[R_MAX], sc0[R_MAX], sc1[R_MAX];
            for (int r = 0; r < R; r++) {
                const uint8_t *wb = w + w_bytes * (size_t)r + bytes * (size_t)i;
                sc0[r] = pick16(sc2[r], 2 * k, 2 * k);
                sc1[r] = pick16(sc2[r], 2 * k + 1, 2 * k + 1);
                const __m256i q = _mm256_loadu_si256((const __m256i *)(wb + (five_bits ? 48 : 16) + 32 * k));
                lo[r] = _mm256_and_si256(q, low4);
                hi[r] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
                if (five_bits) {
                    const __m256i qh = _mm256_loadu_si256((const __m256i *)(wb + 16));
                    lo[r] = _mm256_or_si256(lo[r], _mm256_slli_epi16(
                                _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), one), 4));
                    hi[r] = _mm256_or_si256(hi[r], _mm256_slli_epi16(
                                _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k + 1), one), 4));
                }
            }
            for (int c = 0; c < C; c++) {
                const cpu_q8k_block *ab = (const cpu_q8k_block *)(a + a_bytes * (size_t)c) + i;
                const __m256i y0 = _mm256_loadu_si256((const __m256i *)(ab->qs + 64 * k));
                const __m256i y1 = _mm256_loadu_si256((const __m256i *)(ab->qs + 64 * k + 32));
                for (int r = 0; r < R; r++) {
                    const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo[r], y0), sc0[r]);
                    const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi[r], y1), sc1[r]);
                    sumi[r][c] = _mm256_add_epi32(sumi[r][c], _mm256_add_epi32(p0, p1));
                }
            }
        }
        float d_a[C_MAX] = {0};
        int32_t summ[R_MAX][C_MAX];
        for (int c = 0; c < C; c++) {
            const cpu_q8k_block *ab = (const cpu_q8k_block *)(a + a_bytes * (size_t)c) + i;
            d_a[c] = ab->d;
            /* the 8 sub-blocks' activation sums: bsums paired (|sum| <= 64·127, no int16 overflow) */
            const __m128i b0 = _mm_loadu_si128((const __m128i *)ab->bsums);
            const __m128i b1 = _mm_loadu_si128((const __m128i *)(ab->bsums + 8));
            const __m128i pairs = _mm_hadd_epi16(b0, b1);
            for (int r = 0; r < R; r++) {
                __m128i p = _mm_madd_epi16(mins[r], pairs);
                p = _mm_add_epi32(p, _mm_shuffle_epi32(p, 0x4e));
                p = _mm_add_epi32(p, _mm_shuffle_epi32(p, 0xb1));
                summ[r][c] = _mm_cvtsi128_si32(p);
            }
        }
        for (int r = 0; r < R; r++) {
            int32_t dm16; /* d and dmin, converted in one */
            memcpy(&dm16, w + w_bytes * (size_t)r + bytes * (size_t)i, sizeof dm16);
            const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm16));
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(_mm_cvtss_f32(dm) * d_a[c]), _mm256_cvtepi32_ps(sumi[r][c]),
                                            acc[r][c]);
            /* lane c: dmin·d_a·Σ m·bsum, as the one-token sum computes it */
            const __m128 dmin_da = _mm_mul_ps(_mm_shuffle_ps(dm, dm, 0x55), lanes(d_a, C));
            const __m128i m = C == 1 ? _mm_cvtsi32_si128(summ[r][0])
                                     : _mm_setr_epi32(summ[r][0], summ[r][1], summ[r][2], summ[r][3]);
            sum_m[r] = _mm_sub_ps(sum_m[r], _mm_mul_ps(dmin_da, _mm_cvtepi32_ps(m)));
        }
    }
    for (int r = 0; r < R; r++) {
        float m[4];
        _mm_storeu_ps(m, sum_m[r]);
        for (int c = 0; c < C; c++) out[r * C + c] = hsum_ps(acc[r][c]) + m[c];
    }
}

/* Q6_K (layout in io/gguf_dequant.c): per half of 128, 32-byte loads of ql[0..31], ql[32..63]
 * and qh[0..31] give four runs of 32 quants (0..63); a run's two groups of 16 sit in the two
 * 128-bit lanes, so one madd with (scale_lo, scale_hi) per lane applies both scales (picked from the
 * half's 8 scales by a byte shuffle). The offset 32 comes off as 32·Σ_g scale_g·bsum_g, one madd of
 * the 16 scales with the 16 block sums. */
KERNEL void tile6_k(const uint8_t *w, size_t w_bytes, const uint8_t *a, size_t a_bytes, int32_t nb,
                    float *out, const int R, const int C) {
    const __m256i low4 = _mm256_set1_epi8(0x0f), low2 = _mm256_set1_epi8(3);
    __m256 acc[R_MAX][C_MAX];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    for (int32_t i = 0; i < nb; i++) {
        __m256i sumi[R_MAX][C_MAX], sc16[R_MAX];
        for (int r = 0; r < R; r++) {
            sc16[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + w_bytes * (size_t)r + 210 * (size_t)i + 192)));
            for (int c = 0; c < C; c++) sumi[r][c] = _mm256_setzero_si256();
        }
        for (int h = 0; h < 2; h++) {
            __m256i half_sc[R_MAX], qh[R_MAX];
            for (int r = 0; r < R; r++) {
                /* scales 8h .. 8h+7 in both halves */
                half_sc[r] = h == 0 ? _mm256_permute2x128_si256(sc16[r], sc16[r], 0x00)
                                    : _mm256_permute2x128_si256(sc16[r], sc16[r], 0x11);
                qh[r] = _mm256_loadu_si256((const __m256i *)(w + w_bytes * (size_t)r + 210 * (size_t)i + 128 + 32 * h));
            }
            for (int run = 0; run < 4; run++) {
                __m256i q[R_MAX], scale[R_MAX];
                for (int r = 0; r < R; r++) {
                    const uint8_t *wb = w + w_bytes * (size_t)r + 210 * (size_t)i;
                    const __m256i l = _mm256_loadu_si256((const __m256i *)(wb + 64 * h + 32 * (run & 1)));
                    q[r] = _mm256_or_si256(
                        _mm256_and_si256(run < 2 ? l : _mm256_srli_epi16(l, 4), low4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh[r], 2 * run), low2), 4));
                    scale[r] = pick16(half_sc[r], 2 * run, 2 * run + 1); /* groups 8h + 2run, + 1 */
                }
                for (int c = 0; c < C; c++) {
                    const cpu_q8k_block *ab = (const cpu_q8k_block *)(a + a_bytes * (size_t)c) + i;
                    const __m256i y = _mm256_loadu_si256((const __m256i *)(ab->qs + 128 * h + 32 * run));
                    for (int r = 0; r < R; r++)
                        sumi[r][c] = _mm256_add_epi32(sumi[r][c],
                                                      _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], y), scale[r]));
                }
            }
        }
        for (int c = 0; c < C; c++) {
            const cpu_q8k_block *ab = (const cpu_q8k_block *)(a + a_bytes * (size_t)c) + i;
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)ab->bsums);
            for (int r = 0; r < R; r++) {
                const uint8_t *wb = w + w_bytes * (size_t)r + 210 * (size_t)i;
                /* Σ_g sc_g·bsum_g: |sc·bsum| <= 128·2032, 8 int32 lanes of two each */
                const __m256i o = _mm256_madd_epi16(sc16[r], bsums);
                __m128i o4 = _mm_add_epi32(_mm256_castsi256_si128(o), _mm256_extracti128_si256(o, 1));
                o4 = _mm_add_epi32(o4, _mm_shuffle_epi32(o4, 0x4e));
                o4 = _mm_add_epi32(o4, _mm_shuffle_epi32(o4, 0xb1));
                const int32_t offset = _mm_cvtsi128_si32(o4);
                const __m256i s = _mm256_sub_epi32(sumi[r][c], _mm256_setr_epi32(32 * offset, 0, 0, 0, 0, 0, 0, 0));
                acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(fp16_at(wb + 208) * ab->d), _mm256_cvtepi32_ps(s),
                                            acc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) out[r * C + c] = hsum_ps(acc[r][c]);
}

#endif

/* ---- the tiles ------------------------------------------------------------------------------ */

KERNEL void tile(uint32_t type, const uint8_t *w, size_t w_bytes, const uint8_t *a, size_t a_bytes, int32_t nb,
                 float *out, const int R, const int C) {
    switch (type) {
#if !QUANT_TILES_VNNI
    case CPU_QUANT_Q4_K: tile45_k(0, w, w_bytes, a, a_bytes, nb, out, R, C); break;
    case CPU_QUANT_Q5_K: tile45_k(1, w, w_bytes, a, a_bytes, nb, out, R, C); break;
    case CPU_QUANT_Q6_K: tile6_k(w, w_bytes, a, a_bytes, nb, out, R, C); break;
#endif
    case CPU_QUANT_Q8_0: tile32(CPU_QUANT_Q8_0, w, w_bytes, a, a_bytes, nb, out, R, C); break;
    case CPU_QUANT_Q4_0: tile32(CPU_QUANT_Q4_0, w, w_bytes, a, a_bytes, nb, out, R, C); break;
    case CPU_QUANT_Q4_1: tile32(CPU_QUANT_Q4_1, w, w_bytes, a, a_bytes, nb, out, R, C); break;
    case CPU_QUANT_Q5_0: tile32(CPU_QUANT_Q5_0, w, w_bytes, a, a_bytes, nb, out, R, C); break;
    default: tile32(CPU_QUANT_Q5_1, w, w_bytes, a, a_bytes, nb, out, R, C);
    }
}

/* One function per tile shape, each with every format's kernel inlined: n_tiles tiles of R rows
 * one after the other (rows w_bytes apart) against C tokens, into y[c · ldy + r]. */
#define TILE_FN(R, C)                                                                              \
    TARGET static void tiles_##R##x##C(uint32_t type, const uint8_t *w, size_t w_bytes, int32_t n_tiles,  \
                                       const uint8_t *a, size_t a_bytes, int32_t nb, float *y, size_t ldy, \
                                       int accumulate) {                                            \
        for (int32_t k = 0; k < n_tiles; k++) {                                                     \
            float out[R * C];                                                                       \
            tile(type, w + w_bytes * (size_t)k * R, w_bytes, a, a_bytes, nb, out, R, C);            \
            for (int r = 0; r < R; r++)                                                             \
                for (int c = 0; c < C; c++) {                                                       \
                    float *dst = y + ldy * (size_t)c + (size_t)k * R + r;                           \
                    *dst = accumulate ? *dst + out[r * C + c] : out[r * C + c];                     \
                }                                                                                   \
        }                                                                                           \
    }
#define TILE_FN_OF(R, C) TILE_FN(R, C) /* R expanded first */
#define TILES_NAME(R, C) tiles_##R##x##C
#define TILES_OF(R, C) TILES_NAME(R, C)
TILE_FN(1, 1)
TILE_FN(1, 4)
#if QUANT_TILES_ROWS32 > 1
TILE_FN_OF(QUANT_TILES_ROWS32, 1)
TILE_FN_OF(QUANT_TILES_ROWS32, 4)
#endif

/* y[t · ldy + r] (+)= row r · token t with the kernels above, reading the blocks as stored. */
TARGET static void gemm_stored(uint32_t type, const uint8_t *w, size_t w_bytes, int32_t n_rows, const uint8_t *a,
                               size_t act_bytes, int32_t n_tokens, int32_t n_blocks, float *y, size_t ldy,
                               int accumulate) {
    /* Tiles of QUANT_TILES_ROWS32 rows × 4 tokens for the blocks of 32 (AVX2: 2; VNNI's prompts
     * run on panels, below, and come here only for the rows and tokens left over), 1 × 4 for the
     * k-quants (their per-block integer sums take a register per pair besides the float sums): as
     * many accumulators as the registers hold beside the unpacked weights (docs/decoder.md). Below 4
     * tokens (decode) one row at a time: the weights come from DRAM there, and rows read side by
     * side are streams the hardware prefetchers follow badly (SmolLM2's Q8_0 LM head, 30 MB, ran
     * at a third of one row's rate in 4-row tiles). The caller's rows are few (a tile of them
     * stays in L1 while every group of tokens passes). */
    const int wide = cpu_quant_block_size(type) == QK && n_tokens >= 4;
    const int32_t R = wide ? QUANT_TILES_ROWS32 : 1, full = n_rows / R * R;
    for (int32_t t0 = 0; t0 < n_tokens;) {
        const int four = n_tokens - t0 >= 4;
        const uint8_t *at = a + act_bytes * (size_t)t0;
        float *yt = y + ldy * (size_t)t0;
        if (wide)
            (four ? TILES_OF(QUANT_TILES_ROWS32, 4) : TILES_OF(QUANT_TILES_ROWS32, 1))(
                type, w, w_bytes, full / R, at, act_bytes, n_blocks, yt, ldy, accumulate);
        (four ? tiles_1x4 : tiles_1x1)(type, w + w_bytes * (size_t)(wide ? full : 0), w_bytes,
                                       wide ? n_rows - full : n_rows, at, act_bytes, n_blocks,
                                       yt + (wide ? full : 0), ldy, accumulate);
        t0 += four ? 4 : 1;
    }
}


#if QUANT_TILES_VNNI
/* ---- prompts on panels (quant.h's cpu_q8_panel, cpu_w_panel): 4 rows × 4 tokens ----------------- */

/* The 4 rows from w (w_bytes apart) as n_blocks weight panels. */
TARGET static void pack_rows(uint32_t type, const uint8_t *w, size_t w_bytes, int32_t nb, cpu_w_panel *out) {
    const size_t bytes = cpu_quant_row_bytes(type, QK);
    for (int32_t i = 0; i < nb; i++)
        for (int r = 0; r < 4; r++) {
            const block32 b = unpack32(type, w + w_bytes * (size_t)r + bytes * (size_t)i);
            const float d = _mm_cvtss_f32(b.dm);
            _mm_storeu_ps(out[i].d[r], _mm_set1_ps(d));
            out[i].m[r] = _mm_cvtss_f32(_mm_shuffle_ps(b.dm, b.dm, 0x55));
            /* VPDPBUSD of 128 (unsigned) with the signed quants: 128 · each lane's sum (b.q is 0
             * for the other formats) */
            const __m256i sum128 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), b.q);
            _mm256_storeu_si256((__m256i *)out[i].start[r], _mm256_sub_epi32(_mm256_setzero_si256(), sum128));
            _mm256_storeu_si256((__m256i *)out[i].q[r], type == CPU_QUANT_Q8_0 ? b.q : b.u);
        }
}

void cpu_quant_pack_vnni(uint32_t type, const void *act, size_t act_bytes, int32_t nb, cpu_q8_panel *out) {
    const int32_t offset = type == CPU_QUANT_Q4_0 ? 8 : type == CPU_QUANT_Q5_0 ? 16 : 0;
    for (int32_t i = 0; i < nb; i++)
        for (int c = 0; c < 4; c++) {
            const cpu_q8_block *ab = (const cpu_q8_block *)((const uint8_t *)act + act_bytes * (size_t)c) + i;
            out[i].d[c] = ab->d;
            out[i].d_sum[c] = ab->d * (float)ab->sum;
            out[i].offset_sum[c] = -offset * ab->sum;
            memcpy(out[i].q[c], ab->qs, QK);
            if (type == CPU_QUANT_Q8_0)
                for (int l = 0; l < QK; l++) out[i].q[c][l] ^= 0x80; /* q + 128 as unsigned */
        }
}

/* tile32's sums on panels: per (row, token) the same integers in the same lanes, the same scale
 * d_w·d_a and the same fused multiply-adds, so the same floats bit for bit. What it saves per
 * (row, token) and block is Q8_0's sign (the lanes start at -128 · Σw instead), the scale's
 * scalar product and broadcast (4 rows × 4 tokens of products in 4 vector multiplies), and every
 * weight block's unpacking and conversion, done once per call instead of once per 4 tokens. */
enum { SCALE_BLOCKS = 32 }; /* tile_panels' blocks a pass: their scales take 2 KB of stack */

KERNEL void tile_panels(uint32_t type, const cpu_w_panel *wp, const cpu_q8_panel *ap, int32_t nb, float *y,
                        size_t ldy, int accumulate) {
    const int with_min = type == CPU_QUANT_Q4_1 || type == CPU_QUANT_Q5_1;
    const int with_offset = type == CPU_QUANT_Q4_0 || type == CPU_QUANT_Q5_0;
    __m256 acc[4][4];
    __m128 sum_m[4];
    for (int r = 0; r < 4; r++) {
        sum_m[r] = _mm_setzero_ps();
        for (int c = 0; c < 4; c++) acc[r][c] = _mm256_setzero_ps();
    }
    for (int32_t i0 = 0; i0 < nb; i0 += SCALE_BLOCKS) {
        const int32_t n = nb - i0 < SCALE_BLOCKS ? nb - i0 : SCALE_BLOCKS;
        /* d_w · d_a ahead of the blocks that use them, read back as broadcasts that the FMAs fold
         * in (computed per block beside its sums, they cost a shuffle and a broadcast a product:
         * 5% slower) */
        float scale[SCALE_BLOCKS][4][4];
        for (int32_t i = 0; i < n; i++)
            for (int r = 0; r < 4; r++)
                _mm_storeu_ps(scale[i][r], _mm_mul_ps(_mm_loadu_ps(wp[i0 + i].d[r]), _mm_loadu_ps(ap[i0 + i].d)));
        for (int32_t i = 0; i < n; i++) {
            const cpu_w_panel *w = wp + i0 + i;
            const cpu_q8_panel *a = ap + i0 + i;
            if (with_min)
                for (int r = 0; r < 4; r++)
                    sum_m[r] = _mm_fmadd_ps(_mm_set1_ps(w->m[r]), _mm_loadu_ps(a->d_sum), sum_m[r]);
            __m256i wq[4];
            for (int r = 0; r < 4; r++) wq[r] = _mm256_loadu_si256((const __m256i *)w->q[r]);
            for (int c = 0; c < 4; c++) {
                const __m256i aq = _mm256_loadu_si256((const __m256i *)a->q[c]);
                const __m256i start = with_offset ? _mm256_setr_epi32(a->offset_sum[c], 0, 0, 0, 0, 0, 0, 0)
                                                  : _mm256_setzero_si256();
                for (int r = 0; r < 4; r++) {
                    const __m256i dot =
                        type == CPU_QUANT_Q8_0
                            ? _mm256_dpbusd_epi32(_mm256_loadu_si256((const __m256i *)w->start[r]), aq, wq[r])
                            : _mm256_dpbusd_epi32(start, wq[r], aq);
                    acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(scale[i][r][c]), _mm256_cvtepi32_ps(dot), acc[r][c]);
                }
            }
        }
    }
    for (int r = 0; r < 4; r++) {
        float m[4];
        _mm_storeu_ps(m, sum_m[r]);
        for (int c = 0; c < 4; c++) {
            const float v = with_min ? hsum_ps(acc[r][c]) + m[c] : hsum_ps(acc[r][c]);
            float *dst = y + ldy * (size_t)c + r;
            *dst = accumulate ? *dst + v : v;
        }
    }
}

TARGET static void tiles_panels(uint32_t type, const cpu_w_panel *wp, const cpu_q8_panel *ap, int32_t nb, float *y,
                                size_t ldy, int accumulate) {
    switch (type) {
    case CPU_QUANT_Q8_0: tile_panels(CPU_QUANT_Q8_0, wp, ap, nb, y, ldy, accumulate); break;
    case CPU_QUANT_Q4_0: tile_panels(CPU_QUANT_Q4_0, wp, ap, nb, y, ldy, accumulate); break;
    case CPU_QUANT_Q4_1: tile_panels(CPU_QUANT_Q4_1, wp, ap, nb, y, ldy, accumulate); break;
    case CPU_QUANT_Q5_0: tile_panels(CPU_QUANT_Q5_0, wp, ap, nb, y, ldy, accumulate); break;
    default: tile_panels(CPU_QUANT_Q5_1, wp, ap, nb, y, ldy, accumulate);
    }
}

void QUANT_TILES_GEMM(uint32_t type, const void *w_, size_t w_bytes, int32_t n_rows, const void *act,
                      size_t act_bytes, int32_t n_tokens, int32_t n_blocks, float *y, size_t ldy, int accumulate,
                      const cpu_q8_panel *panels, cpu_w_panel *scratch) {
    const uint8_t *w = w_, *a = act;
    const int32_t groups = panels ? n_tokens / 4 : 0, quads = n_rows / 4;
    if (groups == 0 || quads == 0) {
        gemm_stored(type, w, w_bytes, n_rows, a, act_bytes, n_tokens, n_blocks, y, ldy, accumulate);
        return;
    }
    /* the caller's rows are few (a tile of them, packed here once, stays in L1/L2 while every group
     * of 4 tokens passes) */
    for (int32_t q = 0; q < quads; q++)
        pack_rows(type, w + w_bytes * (size_t)(4 * q), w_bytes, n_blocks, scratch + (size_t)q * n_blocks);
    for (int32_t g = 0; g < groups; g++)
        for (int32_t q = 0; q < quads; q++)
            tiles_panels(type, scratch + (size_t)q * n_blocks, panels + (size_t)g * n_blocks, n_blocks,
                         y + ldy * (size_t)(4 * g) + 4 * q, ldy, accumulate);
    /* the rows past the last 4 for the grouped tokens, then every row for the tokens past them */
    if (n_rows > 4 * quads)
        gemm_stored(type, w + w_bytes * (size_t)(4 * quads), w_bytes, n_rows - 4 * quads, a, act_bytes, 4 * groups,
                    n_blocks, y + 4 * quads, ldy, accumulate);
    if (n_tokens > 4 * groups)
        gemm_stored(type, w, w_bytes, n_rows, a + act_bytes * (size_t)(4 * groups), act_bytes, n_tokens - 4 * groups,
                    n_blocks, y + ldy * (size_t)(4 * groups), ldy, accumulate);
}
#else
void QUANT_TILES_GEMM(uint32_t type, const void *w, size_t w_bytes, int32_t n_rows, const void *act,
                      size_t act_bytes, int32_t n_tokens, int32_t n_blocks, float *y, size_t ldy, int accumulate) {
    gemm_stored(type, w, w_bytes, n_rows, act, act_bytes, n_tokens, n_blocks, y, ldy, accumulate);
}
#endif

#endif

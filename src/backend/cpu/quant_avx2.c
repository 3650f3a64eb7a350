/* The AVX2 dot products of quant.h: the same integer sums as quant.c's portable path, 32 bytes
 * at a time. Each function is compiled for AVX2 + FMA + F16C on its own (the attribute), so the
 * library needs no global -mavx2; quant.c calls them only where the CPU has all three.
 *
 * The core step is _mm256_maddubs_epi16 (unsigned bytes × signed bytes, pairs summed into int16):
 * weight quants are made unsigned (0..15, 0..31, 0..63) and the activations are |q| <= 127, so
 * a pair is at most 2·63·127 = 16002 and never saturates. Q8_0's signed weights use the sign
 * trick (|w| × a·sign(w)): at most 2·128·127 = 32512. Offsets (Q4_0's 8, Q6_K's 32) and mins are
 * taken off with the activations' block sums, in integers, as in quant.c. */
#include "backend/cpu/quant.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#define TARGET __attribute__((target("avx2,fma,f16c")))

enum { QK = CPU_QUANT_QK, QK_K = CPU_QUANT_QK_K };

TARGET static inline float fp16_at(const uint8_t *p) {
    return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8));
}

TARGET static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Σ u·a over 32 bytes as 8 int32 (u unsigned, a signed). */
TARGET static inline __m256i dot_u8_i8(__m256i u, __m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1));
}

/* 16 bytes of nibble pairs -> 32 bytes: elements 0..15 (low nibbles) then 16..31 (high). */
TARGET static inline __m256i unpack_nibbles16(const uint8_t *p) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

TARGET static float dot_q8_0(const uint8_t *w, const cpu_q8_block *a, int32_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int32_t i = 0; i < nb; i++, w += 34) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(w + 2));
        const __m256i y = _mm256_loadu_si256((const __m256i *)a[i].qs);
        const __m256i s = dot_u8_i8(_mm256_abs_epi8(q), _mm256_sign_epi8(y, q));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_at(w) * a[i].d), _mm256_cvtepi32_ps(s), acc);
    }
    return hsum_ps(acc);
}

TARGET static float dot_q4_0(const uint8_t *w, const cpu_q8_block *a, int32_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int32_t i = 0; i < nb; i++, w += 18) {
        const __m256i y = _mm256_loadu_si256((const __m256i *)a[i].qs);
        /* Σ (q - 8)·a = Σ q·a - 8·Σ a: the offset goes into one lane's sum */
        const __m256i s = _mm256_sub_epi32(dot_u8_i8(unpack_nibbles16(w + 2), y),
                                           _mm256_setr_epi32(8 * a[i].sum, 0, 0, 0, 0, 0, 0, 0));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_at(w) * a[i].d), _mm256_cvtepi32_ps(s), acc);
    }
    return hsum_ps(acc);
}

TARGET static float dot_q4_1(const uint8_t *w, const cpu_q8_block *a, int32_t nb) {
    __m256 acc = _mm256_setzero_ps();
    __m128 sum_m = _mm_setzero_ps();
    for (int32_t i = 0; i < nb; i++, w += 20) {
        const __m256i y = _mm256_loadu_si256((const __m256i *)a[i].qs);
        const __m256i s = dot_u8_i8(unpack_nibbles16(w + 4), y);
        /* d and m in one conversion: lane 0 d·d_a, lane 1 m·d_a·Σa */
        int32_t dm16;
        memcpy(&dm16, w, sizeof dm16);
        const __m128 dm = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dm16)),
                                     _mm_setr_ps(a[i].d, a[i].d * (float)a[i].sum, 0, 0));
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dm), _mm256_cvtepi32_ps(s), acc);
        sum_m = _mm_add_ps(sum_m, dm);
    }
    return hsum_ps(acc) + _mm_cvtss_f32(_mm_shuffle_ps(sum_m, sum_m, 1));
}

/* ggml's get_scale_min_k4 (as quant.c). */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | (q[j - 4] >> 6) << 4;
        *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

/* Q4_K and Q5_K (layouts in quant.c): per 64 elements one 32-byte load of qs gives sub-blocks
 * 2k (low nibbles) and 2k+1 (high); Q5_K adds bit 2k / 2k+1 of qh as 16. The scales multiply
 * the int16 pair sums (madd), the mins go through the block sums. */
TARGET static float dot_q45_k(const uint8_t *w, const cpu_q8k_block *a, int32_t nb,
                              int five_bits) {
    const size_t bytes = five_bits ? 176 : 144;
    const __m256i low4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    float sum_m = 0.0f;
    for (int32_t i = 0; i < nb; i++, w += bytes) {
        const uint8_t *scales = w + 4, *qs = w + (five_bits ? 48 : 16);
        const __m256i qh = five_bits ? _mm256_loadu_si256((const __m256i *)(w + 16))
                                     : _mm256_setzero_si256();
        __m256i sumi = _mm256_setzero_si256();
        int32_t summ = 0;
        for (int k = 0; k < 4; k++, qs += 32) {
            int sc0, m0, sc1, m1;
            scale_min_k4(2 * k, scales, &sc0, &m0);
            scale_min_k4(2 * k + 1, scales, &sc1, &m1);
            const __m256i q = _mm256_loadu_si256((const __m256i *)qs);
            __m256i lo = _mm256_and_si256(q, low4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
            if (five_bits) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(
                         _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(
                         _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k + 1), one), 4));
            }
            const __m256i y0 = _mm256_loadu_si256((const __m256i *)(a[i].qs + 64 * k));
            const __m256i y1 = _mm256_loadu_si256((const __m256i *)(a[i].qs + 64 * k + 32));
            const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0),
                                                 _mm256_set1_epi16((int16_t)sc0));
            const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1),
                                                 _mm256_set1_epi16((int16_t)sc1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
            summ += m0 * (a[i].bsums[4 * k] + a[i].bsums[4 * k + 1]) +
                    m1 * (a[i].bsums[4 * k + 2] + a[i].bsums[4 * k + 3]);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_at(w) * a[i].d), _mm256_cvtepi32_ps(sumi), acc);
        sum_m -= fp16_at(w + 2) * a[i].d * (float)summ;
    }
    return hsum_ps(acc) + sum_m;
}

/* Q6_K (layout in io/gguf_dequant.c): per half of 128, 32-byte loads of ql[0..31], ql[32..63]
 * and qh[0..31] give four runs of 32 quants (0..63); a run's two groups of 16 sit in the two
 * 128-bit lanes, so one madd with (scale_lo, scale_hi) per lane applies both scales. The
 * offset 32 comes off as 32·Σ_g scale_g·bsum_g. */
TARGET static float dot_q6_k(const uint8_t *w, const cpu_q8k_block *a, int32_t nb) {
    const __m256i low4 = _mm256_set1_epi8(0x0f), low2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int32_t i = 0; i < nb; i++, w += 210) {
        const uint8_t *ql = w, *qhp = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++, ql += 64, qhp += 32) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)qhp);
            const __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, low4),
                                _mm256_slli_epi16(_mm256_and_si256(qh, low2), 4)),
                _mm256_or_si256(_mm256_and_si256(l1, low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), low2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), low2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), low2), 4)),
            };
            for (int r = 0; r < 4; r++) {
                const __m256i y =
                    _mm256_loadu_si256((const __m256i *)(a[i].qs + 128 * h + 32 * r));
                const int g = 8 * h + 2 * r;
                const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]),
                                                       _mm_set1_epi16(sc[g]));
                sumi = _mm256_add_epi32(sumi,
                                        _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], y), scale));
            }
        }
        int32_t offset = 0;
        for (int g = 0; g < 16; g++) offset += sc[g] * a[i].bsums[g];
        sumi = _mm256_sub_epi32(sumi, _mm256_setr_epi32(32 * offset, 0, 0, 0, 0, 0, 0, 0));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_at(w + 208) * a[i].d),
                              _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc);
}

float cpu_quant_dot_avx2(uint32_t type, const void *w, const void *act, int32_t n_blocks) {
    switch (type) {
    case CPU_QUANT_Q8_0: return dot_q8_0(w, act, n_blocks);
    case CPU_QUANT_Q4_0: return dot_q4_0(w, act, n_blocks);
    case CPU_QUANT_Q4_1: return dot_q4_1(w, act, n_blocks);
    case CPU_QUANT_Q4_K: return dot_q45_k(w, act, n_blocks, 0);
    case CPU_QUANT_Q5_K: return dot_q45_k(w, act, n_blocks, 1);
    default: return dot_q6_k(w, act, n_blocks);
    }
}

#endif

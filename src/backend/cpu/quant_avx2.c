/* quant.h's GEMM for AVX2 + FMA + F16C (quant_tiles.h), and the activations' quantization. The
 * functions are compiled for those on their own (the attribute), so the library needs no global
 * -mavx2; quant.c calls them only where the CPU has all three. */
#if defined(__x86_64__)

#define TARGET __attribute__((target("avx2,fma,f16c")))
#define QUANT_TILES_VNNI 0
#define QUANT_TILES_ROWS32 2
#define QUANT_TILES_GEMM cpu_quant_gemm_avx2
#include "backend/cpu/quant_tiles.h"

/* 8 int32 (|v| <= 127 after the clamp) summed. */
TARGET static inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* quant.c's quantize_block on n values (a multiple of 32), the same d and q bit for bit: max|x| is
 * exact whatever the order, d = max / 127 and 1/d in scalar float as there, x·(1/d) the same
 * product, rounded to nearest even (CVTPS2DQ under the default rounding mode, as lrintf) and
 * clamped to ±127. A NaN x is skipped by the max (MAXPS returns its second operand, the running
 * max) as fmaxf skips it, and comes out -127 as lrintf's LONG_MIN clamped. sums16[j] = Σ q over
 * elements 16j .. 16j+15. */
TARGET float cpu_quant_quantize_avx2(int8_t *q, int16_t *sums16, const float *x, int32_t n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 amax = _mm256_setzero_ps();
    for (int32_t i = 0; i < n; i += 8) amax = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), amax);
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
    const __m256 scale = _mm256_set1_ps(id);
    const __m256i top = _mm256_set1_epi32(127), bottom = _mm256_set1_epi32(-127);
    for (int32_t i = 0; i < n; i += 32) {
        __m256i v[4];
        for (int k = 0; k < 4; k++)
            v[k] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), scale)),
                                                     top),
                                    bottom);
        sums16[i / 16] = (int16_t)hsum_epi32(_mm256_add_epi32(v[0], v[1]));
        sums16[i / 16 + 1] = (int16_t)hsum_epi32(_mm256_add_epi32(v[2], v[3]));
        /* packs interleave the 128-bit lanes: 0 4 1 5 2 6 3 7 in dwords, undone by the permute */
        const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
        _mm256_storeu_si256((__m256i *)(q + i),
                            _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
    return d;
}

#endif

/* cpu_attention_paged.h's chunk kernel and 2^x in AVX2 + FMA, compiled for those on their own (the
 * attribute), so the library needs no global -mavx2; cpu_attention_paged.c calls them only where
 * cpu_quant_best_isa found AVX2 and FMA. A tile's 16 lanes are two 8-float vectors. */
#if defined(__x86_64__)

#include <immintrin.h>
#include <math.h>

#include "backend/cpu/cpu_attention_paged.h"

#define TARGET __attribute__((target("avx2,fma")))

_Static_assert(CPU_ATTN_LANES == 16, "the AVX2 kernel holds a tile's rows in two vectors");

/* The portable exp2's steps on 8 lanes: round to nearest (ROUNDPS), the polynomial by FMA, 2^n
 * added to the exponent bits. A NaN x stays NaN (MAXPS returns its second operand; CVTPS2DQ gives
 * INT_MIN for it, which the shift by 23 makes 0). */
TARGET static inline __m256 exp2_8(__m256 x) {
    const __m256 lowest = _mm256_set1_ps(CPU_ATTN_EXP2_LOWEST);
    const __m256 xc = _mm256_max_ps(lowest, x);
    const __m256 n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(xc, n);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(CPU_ATTN_EXP2_C6), f, _mm256_set1_ps(CPU_ATTN_EXP2_C5));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(CPU_ATTN_EXP2_C4));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(CPU_ATTN_EXP2_C3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(CPU_ATTN_EXP2_C2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(CPU_ATTN_EXP2_C1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i scaled = _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23));
    return _mm256_andnot_ps(_mm256_cmp_ps(x, lowest, _CMP_LT_OQ), _mm256_castsi256_ps(scaled));
}

TARGET void cpu_attention_exp2_avx2(float *y, const float *x, int32_t n) {
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp2_8(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float in[8] = {0}, res[8];
        for (int32_t t = i; t < n; t++) in[t - i] = x[t];
        _mm256_storeu_ps(res, exp2_8(_mm256_loadu_ps(in)));
        for (int32_t t = i; t < n; t++) y[t] = res[t - i];
    }
}

/* Scores of 4 keys for the tile's 16 rows: 8 independent chains of multiply-adds, enough to hide
 * FMA's latency; per d one load of the rows' queries serves 4 keys. */
TARGET static inline void scores_4(const float *qt, const float *const *k, int32_t D, float *s) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, e0 = a0, e1 = a0;
    const float *k0 = k[0], *k1 = k[1], *k2 = k[2], *k3 = k[3];
    for (int32_t d = 0; d < D; d++) {
        const __m256 q0 = _mm256_load_ps(qt + (size_t)d * 16), q1 = _mm256_load_ps(qt + (size_t)d * 16 + 8);
        __m256 kd = _mm256_broadcast_ss(k0 + d);
        a0 = _mm256_fmadd_ps(q0, kd, a0), a1 = _mm256_fmadd_ps(q1, kd, a1);
        kd = _mm256_broadcast_ss(k1 + d);
        b0 = _mm256_fmadd_ps(q0, kd, b0), b1 = _mm256_fmadd_ps(q1, kd, b1);
        kd = _mm256_broadcast_ss(k2 + d);
        c0 = _mm256_fmadd_ps(q0, kd, c0), c1 = _mm256_fmadd_ps(q1, kd, c1);
        kd = _mm256_broadcast_ss(k3 + d);
        e0 = _mm256_fmadd_ps(q0, kd, e0), e1 = _mm256_fmadd_ps(q1, kd, e1);
    }
    _mm256_store_ps(s, a0), _mm256_store_ps(s + 8, a1);
    _mm256_store_ps(s + 16, b0), _mm256_store_ps(s + 24, b1);
    _mm256_store_ps(s + 32, c0), _mm256_store_ps(s + 40, c1);
    _mm256_store_ps(s + 48, e0), _mm256_store_ps(s + 56, e1);
}

TARGET static inline void scores_1(const float *qt, const float *k, int32_t D, float *s) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (int32_t d = 0; d < D; d++) {
        const __m256 kd = _mm256_broadcast_ss(k + d);
        a0 = _mm256_fmadd_ps(_mm256_load_ps(qt + (size_t)d * 16), kd, a0);
        a1 = _mm256_fmadd_ps(_mm256_load_ps(qt + (size_t)d * 16 + 8), kd, a1);
    }
    _mm256_store_ps(s, a0), _mm256_store_ps(s + 8, a1);
}

TARGET void cpu_attention_chunk_avx2(const float *qt, const float *const *k, const float *const *v, int32_t n_keys,
                                     int32_t D, const int32_t *pos, int32_t key0, float *p, float *m, float *l,
                                     float *ot) {
    int32_t j = 0;
    for (; j + 4 <= n_keys; j += 4) scores_4(qt, k + j, D, p + (size_t)j * 16);
    for (; j < n_keys; j++) scores_1(qt, k[j], D, p + (size_t)j * 16);
    const __m256 minus_inf = _mm256_set1_ps(-INFINITY);
    if (pos) {
        const __m256i pos0 = _mm256_loadu_si256((const __m256i *)pos), pos1 = _mm256_loadu_si256((const __m256i *)(pos + 8));
        for (j = 0; j < n_keys; j++) {
            const __m256i key = _mm256_set1_epi32(key0 + j);
            float *s = p + (size_t)j * 16;
            _mm256_store_ps(s, _mm256_blendv_ps(_mm256_load_ps(s), minus_inf,
                                                _mm256_castsi256_ps(_mm256_cmpgt_epi32(key, pos0))));
            _mm256_store_ps(s + 8, _mm256_blendv_ps(_mm256_load_ps(s + 8), minus_inf,
                                                    _mm256_castsi256_ps(_mm256_cmpgt_epi32(key, pos1))));
        }
    }
    const __m256 m0 = _mm256_loadu_ps(m), m1 = _mm256_loadu_ps(m + 8);
    __m256 max0 = m0, max1 = m1;
    for (j = 0; j < n_keys; j++) {
        max0 = _mm256_max_ps(_mm256_load_ps(p + (size_t)j * 16), max0);
        max1 = _mm256_max_ps(_mm256_load_ps(p + (size_t)j * 16 + 8), max1);
    }
    /* the old sums' weight: 0 at the first chunk (m = -inf) */
    const __m256 alpha0 = exp2_8(_mm256_sub_ps(m0, max0)), alpha1 = exp2_8(_mm256_sub_ps(m1, max1));
    _mm256_storeu_ps(m, max0), _mm256_storeu_ps(m + 8, max1);
    __m256 sum0 = _mm256_setzero_ps(), sum1 = sum0;
    for (j = 0; j < n_keys; j++) {
        float *s = p + (size_t)j * 16;
        const __m256 w0 = exp2_8(_mm256_sub_ps(_mm256_load_ps(s), max0));
        const __m256 w1 = exp2_8(_mm256_sub_ps(_mm256_load_ps(s + 8), max1));
        _mm256_store_ps(s, w0), _mm256_store_ps(s + 8, w1);
        sum0 = _mm256_add_ps(sum0, w0), sum1 = _mm256_add_ps(sum1, w1);
    }
    _mm256_storeu_ps(l, _mm256_fmadd_ps(_mm256_loadu_ps(l), alpha0, sum0));
    _mm256_storeu_ps(l + 8, _mm256_fmadd_ps(_mm256_loadu_ps(l + 8), alpha1, sum1));
    /* ot[d] = alpha · ot[d] + Σ_j v[j][d] · w[j], 4 d at a time: 8 accumulators over the keys */
    int32_t d = 0;
    for (; d + 4 <= D; d += 4) {
        float *o = ot + (size_t)d * 16;
        __m256 a0 = _mm256_mul_ps(_mm256_load_ps(o), alpha0), a1 = _mm256_mul_ps(_mm256_load_ps(o + 8), alpha1);
        __m256 b0 = _mm256_mul_ps(_mm256_load_ps(o + 16), alpha0), b1 = _mm256_mul_ps(_mm256_load_ps(o + 24), alpha1);
        __m256 c0 = _mm256_mul_ps(_mm256_load_ps(o + 32), alpha0), c1 = _mm256_mul_ps(_mm256_load_ps(o + 40), alpha1);
        __m256 e0 = _mm256_mul_ps(_mm256_load_ps(o + 48), alpha0), e1 = _mm256_mul_ps(_mm256_load_ps(o + 56), alpha1);
        for (j = 0; j < n_keys; j++) {
            const float *vj = v[j] + d;
            const __m256 w0 = _mm256_load_ps(p + (size_t)j * 16), w1 = _mm256_load_ps(p + (size_t)j * 16 + 8);
            __m256 vd = _mm256_broadcast_ss(vj);
            a0 = _mm256_fmadd_ps(vd, w0, a0), a1 = _mm256_fmadd_ps(vd, w1, a1);
            vd = _mm256_broadcast_ss(vj + 1);
            b0 = _mm256_fmadd_ps(vd, w0, b0), b1 = _mm256_fmadd_ps(vd, w1, b1);
            vd = _mm256_broadcast_ss(vj + 2);
            c0 = _mm256_fmadd_ps(vd, w0, c0), c1 = _mm256_fmadd_ps(vd, w1, c1);
            vd = _mm256_broadcast_ss(vj + 3);
            e0 = _mm256_fmadd_ps(vd, w0, e0), e1 = _mm256_fmadd_ps(vd, w1, e1);
        }
        _mm256_store_ps(o, a0), _mm256_store_ps(o + 8, a1);
        _mm256_store_ps(o + 16, b0), _mm256_store_ps(o + 24, b1);
        _mm256_store_ps(o + 32, c0), _mm256_store_ps(o + 40, c1);
        _mm256_store_ps(o + 48, e0), _mm256_store_ps(o + 56, e1);
    }
    for (; d < D; d++) {
        float *o = ot + (size_t)d * 16;
        __m256 a0 = _mm256_mul_ps(_mm256_load_ps(o), alpha0), a1 = _mm256_mul_ps(_mm256_load_ps(o + 8), alpha1);
        for (j = 0; j < n_keys; j++) {
            const __m256 vd = _mm256_broadcast_ss(v[j] + d);
            a0 = _mm256_fmadd_ps(vd, _mm256_load_ps(p + (size_t)j * 16), a0);
            a1 = _mm256_fmadd_ps(vd, _mm256_load_ps(p + (size_t)j * 16 + 8), a1);
        }
        _mm256_store_ps(o, a0), _mm256_store_ps(o + 8, a1);
    }
}

#endif

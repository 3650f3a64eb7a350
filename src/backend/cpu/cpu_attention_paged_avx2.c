/* cpu_attention_paged.h's chunk kernel and 2^x in AVX2 + FMA, compiled for those on their own (the
 * attribute), so the library needs no global -mavx2; cpu_attention_paged.c calls them only where
 * cpu_quant_best_isa found AVX2 and FMA. A tile's 16 lanes are two 8-float vectors, a narrow
 * tile's 8 one. */
#if defined(__x86_64__)

#include <immintrin.h>
#include <math.h>

#include "backend/cpu/cpu_attention_paged.h"

#define TARGET __attribute__((target("avx2,fma")))
#define INLINE __attribute__((always_inline)) inline

_Static_assert(CPU_ATTN_LANES == 16 && CPU_ATTN_NARROW == 8,
               "the AVX2 kernel holds a tile's rows in one or two vectors");

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
    const __m256i scaled =
        _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23));
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

/* The chunk kernel for a tile of NV vectors of 8 lanes (1 or 2; a constant once inlined, so the
 * loops over vectors unroll and the accumulators stay in registers). Scores of 8 / NV keys at a
 * time and the output 8 / NV values of d at a time: 8 independent chains of multiply-adds, enough
 * to hide FMA's latency, and one load of a d's (or a key's) row vectors serves all of them. */
TARGET static INLINE void chunk_vectors(const int NV, const float *qt, const float *const *k, const float *const *v,
                                        int32_t n_keys, int32_t D, const int32_t *pos, int32_t key0, float *p, float *m,
                                        float *l, float *ot) {
    const int W = 8 * NV, STEP = 8 / NV; /* lanes; keys (and values of d) a step */
    int32_t j = 0;
    for (; j + STEP <= n_keys; j += STEP) {
        __m256 acc[8][2];
        for (int i = 0; i < STEP; i++)
            for (int h = 0; h < NV; h++) acc[i][h] = _mm256_setzero_ps();
        for (int32_t d = 0; d < D; d++) {
            __m256 q[2];
            for (int h = 0; h < NV; h++) q[h] = _mm256_load_ps(qt + (size_t)d * W + 8 * h);
            for (int i = 0; i < STEP; i++) {
                const __m256 kd = _mm256_broadcast_ss(k[j + i] + d);
                for (int h = 0; h < NV; h++) acc[i][h] = _mm256_fmadd_ps(q[h], kd, acc[i][h]);
            }
        }
        for (int i = 0; i < STEP; i++)
            for (int h = 0; h < NV; h++) _mm256_store_ps(p + (size_t)(j + i) * W + 8 * h, acc[i][h]);
    }
    for (; j < n_keys; j++) {
        __m256 acc[2];
        for (int h = 0; h < NV; h++) acc[h] = _mm256_setzero_ps();
        for (int32_t d = 0; d < D; d++) {
            const __m256 kd = _mm256_broadcast_ss(k[j] + d);
            for (int h = 0; h < NV; h++)
                acc[h] = _mm256_fmadd_ps(_mm256_load_ps(qt + (size_t)d * W + 8 * h), kd, acc[h]);
        }
        for (int h = 0; h < NV; h++) _mm256_store_ps(p + (size_t)j * W + 8 * h, acc[h]);
    }
    const __m256 minus_inf = _mm256_set1_ps(-INFINITY);
    if (pos) {
        for (j = 0; j < n_keys; j++) {
            const __m256i key = _mm256_set1_epi32(key0 + j);
            for (int h = 0; h < NV; h++) {
                float *s = p + (size_t)j * W + 8 * h;
                const __m256i row_pos = _mm256_loadu_si256((const __m256i *)(pos + 8 * h));
                _mm256_store_ps(s, _mm256_blendv_ps(_mm256_load_ps(s), minus_inf,
                                                    _mm256_castsi256_ps(_mm256_cmpgt_epi32(key, row_pos))));
            }
        }
    }
    __m256 old_max[2], max[2], base[2], alpha[2], sum[2];
    for (int h = 0; h < NV; h++) max[h] = old_max[h] = _mm256_loadu_ps(m + 8 * h);
    for (j = 0; j < n_keys; j++)
        for (int h = 0; h < NV; h++) max[h] = _mm256_max_ps(_mm256_load_ps(p + (size_t)j * W + 8 * h), max[h]);
    for (int h = 0; h < NV; h++) {
        /* the weights' base: the max, or 0 in a row with every key so far masked (portable's) */
        base[h] = _mm256_andnot_ps(_mm256_cmp_ps(max[h], minus_inf, _CMP_EQ_OQ), max[h]);
        alpha[h] = exp2_8(_mm256_sub_ps(old_max[h], base[h])); /* the old sums' weight: 0 at the first chunk */
        _mm256_storeu_ps(m + 8 * h, max[h]);
        sum[h] = _mm256_setzero_ps();
    }
    for (j = 0; j < n_keys; j++)
        for (int h = 0; h < NV; h++) {
            float *s = p + (size_t)j * W + 8 * h;
            const __m256 w = exp2_8(_mm256_sub_ps(_mm256_load_ps(s), base[h]));
            _mm256_store_ps(s, w);
            sum[h] = _mm256_add_ps(sum[h], w);
        }
    for (int h = 0; h < NV; h++)
        _mm256_storeu_ps(l + 8 * h, _mm256_fmadd_ps(_mm256_loadu_ps(l + 8 * h), alpha[h], sum[h]));
    /* ot[d] = alpha · ot[d] + Σ_j v[j][d] · w[j] */
    int32_t d = 0;
    for (; d + STEP <= D; d += STEP) {
        __m256 acc[8][2];
        for (int i = 0; i < STEP; i++)
            for (int h = 0; h < NV; h++)
                acc[i][h] = _mm256_mul_ps(_mm256_load_ps(ot + (size_t)(d + i) * W + 8 * h), alpha[h]);
        for (j = 0; j < n_keys; j++) {
            __m256 w[2];
            for (int h = 0; h < NV; h++) w[h] = _mm256_load_ps(p + (size_t)j * W + 8 * h);
            for (int i = 0; i < STEP; i++) {
                const __m256 vd = _mm256_broadcast_ss(v[j] + d + i);
                for (int h = 0; h < NV; h++) acc[i][h] = _mm256_fmadd_ps(vd, w[h], acc[i][h]);
            }
        }
        for (int i = 0; i < STEP; i++)
            for (int h = 0; h < NV; h++) _mm256_store_ps(ot + (size_t)(d + i) * W + 8 * h, acc[i][h]);
    }
    for (; d < D; d++) {
        __m256 acc[2];
        for (int h = 0; h < NV; h++) acc[h] = _mm256_mul_ps(_mm256_load_ps(ot + (size_t)d * W + 8 * h), alpha[h]);
        for (j = 0; j < n_keys; j++) {
            const __m256 vd = _mm256_broadcast_ss(v[j] + d);
            for (int h = 0; h < NV; h++)
                acc[h] = _mm256_fmadd_ps(vd, _mm256_load_ps(p + (size_t)j * W + 8 * h), acc[h]);
        }
        for (int h = 0; h < NV; h++) _mm256_store_ps(ot + (size_t)d * W + 8 * h, acc[h]);
    }
}

TARGET void cpu_attention_chunk_avx2(int32_t lanes, const float *qt, const float *const *k, const float *const *v,
                                     int32_t n_keys, int32_t D, const int32_t *pos, int32_t key0, float *p, float *m,
                                     float *l, float *ot) {
    if (lanes == 8) chunk_vectors(1, qt, k, v, n_keys, D, pos, key0, p, m, l, ot);
    else chunk_vectors(2, qt, k, v, n_keys, D, pos, key0, p, m, l, ot);
}

#endif

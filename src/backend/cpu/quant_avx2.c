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

/* ---- Q4_K repacked, 8 rows in the lanes (quant.h's CPU_QUANT_Q4_K_R8) --------------------------- */

/* One token's sums for a group of 8 rows: lane r of the result is row r's dot. Per super-block the
 * integers are exact and the portable path's (Σ_j sc_j·Σ q·a and Σ_j m_j·Σ a, summed per row in
 * int32 lanes), then acc = fma(sumi, d·d_a, acc) and acc = fma(-summ, dmin·d_a, acc). Per 32
 * bytes of quants (4 bytes of 8 rows) one broadcast of 4 activations for the low nibbles and one for
 * the high, and the maddubs results summed in int16 over a sub-block: 8 of them, each pair at most
 * 2·15·127, so |sum| <= 30480 and never saturates. */
/* C tokens (1 or 4) against a group: out[c] lane r = row r · token c. The weights' unpacking (the
 * nibbles of each 32-byte load, the scales and mins) is shared by the C tokens; a token's integers
 * and float operations are the same whatever C is, so its result is too (bit for bit). */
TARGET static inline __attribute__((always_inline)) void r8_dot(const uint8_t *w, const void *const *a_, int32_t nb,
                                                                __m256 *out, const int C) {
    const cpu_q8k_block *a[4];
    for (int c = 0; c < C; c++) a[c] = a_[c];
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256 acc[4];
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int32_t i = 0; i < nb; i++, w += CPU_QUANT_R8_BYTES) {
        /* the group's stream 4 super-blocks ahead (past a group's end, the next group's: the rows are
         * one stream): from DRAM 8.4-8.8 ns a row's super-block against 10.0-12.7 without, 1.8 KB to
         * 9 KB ahead all within the noise of each other but 1 KB (docs/decoder.md) */
        for (int o = 0; o < CPU_QUANT_R8_BYTES; o += 64)
            _mm_prefetch((const char *)w + 4 * CPU_QUANT_R8_BYTES + o, _MM_HINT_T0);
        __m256i sumi[4];
        for (int c = 0; c < C; c++) sumi[c] = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            __m256i s_lo[4], s_hi[4];
            for (int c = 0; c < C; c++) s_lo[c] = s_hi[c] = _mm256_setzero_si256();
            const uint8_t *qs = w + 160 + 256 * k;
            for (int l = 0; l < 8; l++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * l));
                const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
                for (int c = 0; c < C; c++) {
                    int32_t alo, ahi;
                    memcpy(&alo, a[c][i].qs + 64 * k + 4 * l, 4);
                    memcpy(&ahi, a[c][i].qs + 64 * k + 32 + 4 * l, 4);
                    s_lo[c] = _mm256_add_epi16(s_lo[c], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(alo)));
                    s_hi[c] = _mm256_add_epi16(s_hi[c], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(ahi)));
                }
            }
            /* the 8 rows' scales of sub-blocks 2k and 2k+1 as (sc, sc) int16 pairs, lane r row r */
            __m256i sc0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + 32 + 16 * k)));
            __m256i sc1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + 40 + 16 * k)));
            sc0 = _mm256_or_si256(sc0, _mm256_slli_epi32(sc0, 16));
            sc1 = _mm256_or_si256(sc1, _mm256_slli_epi32(sc1, 16));
            for (int c = 0; c < C; c++) {
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(s_lo[c], sc0));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(s_hi[c], sc1));
            }
        }
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w));
        const __m256 dmin8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 16)));
        for (int c = 0; c < C; c++) {
            /* the mins: lane r (m_2p, m_2p+1) · (Σa over sub-block 2p, over 2p+1), |Σa| <= 32·127 */
            const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)a[c][i].bsums),
                                                 _mm_loadu_si128((const __m128i *)(a[c][i].bsums + 8)));
            const __m256i b[4] = {_mm256_broadcastd_epi32(pairs), _mm256_broadcastd_epi32(_mm_shuffle_epi32(pairs, 0x55)),
                                  _mm256_broadcastd_epi32(_mm_shuffle_epi32(pairs, 0xaa)),
                                  _mm256_broadcastd_epi32(_mm_shuffle_epi32(pairs, 0xff))};
            __m256i summ = _mm256_setzero_si256();
            for (int p = 0; p < 4; p++)
                summ = _mm256_add_epi32(
                    summ, _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(w + 96 + 16 * p))), b[p]));
            const __m256 da = _mm256_set1_ps(a[c][i].d);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[c]), _mm256_mul_ps(d8, da), acc[c]);
            acc[c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(dmin8, da), acc[c]);
        }
    }
    for (int c = 0; c < C; c++) out[c] = acc[c];
}

/* Q6_K's 8 rows in the lanes (quant.h's CPU_QUANT_Q6_K_R8): per 4 quant positions of a half, one load
 * each of ql (two) and qh gives the 4 runs' 6-bit quants of 8 rows × 4 elements; 4 broadcasts of 4
 * activations. A maddubs pair is at most 2·63·127 = 16002, so two are summed in int16 before each
 * madd by the group's scales (as (sc, sc) pairs of each row, a byte shuffle of the row's two
 * groups' scales). The offset 32 comes off as 32·Σ_g sc_g·bsum_g (8 madds of the rows' scale pairs
 * with the activations' block-sum pairs); then acc = fma(sumi, d·d_a, acc): the integers of
 * dot_q6_k, the portable path's floats bit for bit. */
TARGET static inline __attribute__((always_inline)) void r8_6_dot(const uint8_t *w, const void *const *a_, int32_t nb,
                                                                  __m256 *out, const int C) {
    const cpu_q8k_block *a[4];
    for (int c = 0; c < C; c++) a[c] = a_[c];
    const __m256i low4 = _mm256_set1_epi8(0x0f), bits45 = _mm256_set1_epi8(0x30);
    /* lane r's first (second) int16 in both of its halves: byte indices within each 128-bit half */
    const __m256i dup_lo = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5,
                                            8, 9, 8, 9, 12, 13, 12, 13);
    const __m256i dup_hi = _mm256_add_epi8(dup_lo, _mm256_set1_epi8(2));
    __m256 acc[4];
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int32_t i = 0; i < nb; i++, w += CPU_QUANT_R8_BYTES_6) {
        for (int o = 0; o < CPU_QUANT_R8_BYTES_6; o += 64) /* as r8_dot: 4 super-blocks ahead */
            _mm_prefetch((const char *)w + 4 * CPU_QUANT_R8_BYTES_6 + o, _MM_HINT_T0);
        __m256i sumi[4], offs[4];
        for (int c = 0; c < C; c++) sumi[c] = offs[c] = _mm256_setzero_si256();
        /* group g's scales as (sc, sc) per row lane, read back by the madds below as memory operands
         * (the 8 pairs held in registers beside the quants spilled: 1.06x the stored rows from L2,
         * against 1.32x this way) */
        __m256i sc[16];
        for (int p = 0; p < 8; p++) {
            /* lane r: row r's scales of groups 2p, 2p+1 as int16 */
            const __m256i pair = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16 + 16 * p)));
            for (int c = 0; c < C; c++) {
                int32_t bs;
                memcpy(&bs, a[c][i].bsums + 2 * p, sizeof bs);
                offs[c] = _mm256_add_epi32(offs[c], _mm256_madd_epi16(pair, _mm256_set1_epi32(bs)));
            }
            sc[2 * p] = _mm256_shuffle_epi8(pair, dup_lo);
            sc[2 * p + 1] = _mm256_shuffle_epi8(pair, dup_hi);
        }
        for (int h = 0; h < 2; h++)
            for (int gp = 0; gp < 2; gp++) /* positions 16gp .. 16gp+15 of each run: group 8h + 2run + gp */
                for (int half = 0; half < 2; half++) {
                    __m256i q[2][4]; /* the two 4-position steps' 4 runs, shared by the C tokens */
                    for (int mm = 0; mm < 2; mm++) {
                        const int m = 4 * gp + 2 * half + mm;
                        const __m256i la = _mm256_loadu_si256((const __m256i *)(w + 144 + 512 * h + 32 * m));
                        const __m256i lb = _mm256_loadu_si256((const __m256i *)(w + 144 + 512 * h + 32 * (m + 8)));
                        const __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 1168 + 256 * h + 32 * m));
                        q[mm][0] = _mm256_or_si256(_mm256_and_si256(la, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45));
                        q[mm][1] = _mm256_or_si256(_mm256_and_si256(lb, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45));
                        q[mm][2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(la, 4), low4), _mm256_and_si256(qh, bits45));
                        q[mm][3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lb, 4), low4),
                                                   _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45));
                    }
                    const int m0 = 4 * gp + 2 * half;
                    for (int c = 0; c < C; c++)
                        for (int run = 0; run < 4; run++) {
                            int32_t a0, a1;
                            memcpy(&a0, a[c][i].qs + 128 * h + 32 * run + 4 * m0, sizeof a0);
                            memcpy(&a1, a[c][i].qs + 128 * h + 32 * run + 4 * m0 + 4, sizeof a1);
                            const __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(q[0][run], _mm256_set1_epi32(a0)),
                                                               _mm256_maddubs_epi16(q[1][run], _mm256_set1_epi32(a1)));
                            sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(t, sc[8 * h + 2 * run + gp]));
                        }
                }
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w));
        for (int c = 0; c < C; c++) {
            const __m256i s = _mm256_sub_epi32(sumi[c], _mm256_slli_epi32(offs[c], 5));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d8, _mm256_set1_ps(a[c][i].d)), acc[c]);
        }
    }
    for (int c = 0; c < C; c++) out[c] = acc[c];
}

/* Q4_1's 8 rows in the lanes (quant.h's CPU_QUANT_Q4_1_R8): per block 4 loads of 32 bytes (4 quant
 * bytes of 8 rows each), their low and high nibbles against broadcasts of the 4 activations they
 * meet, the 8 maddubs results summed in int16 (each at most 2·15·127, so |sum| <= 30480), one madd
 * into the rows' int32 lanes; then acc = fma(Σ q·a, d·d_a, acc) and accm = fma(m, d_a·Σa, accm)
 * (two chains: the m part is independent of the quants), the result acc + accm: the portable
 * path's floats bit for bit. */
TARGET static inline __attribute__((always_inline)) void r8_4_1_dot(const uint8_t *w, const void *const *a_, int32_t nb,
                                                                    __m256 *out, const int C) {
    const cpu_q8_block *a[4];
    for (int c = 0; c < C; c++) a[c] = a_[c];
    const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256 acc[4], accm[4];
    for (int c = 0; c < C; c++) acc[c] = accm[c] = _mm256_setzero_ps();
    for (int32_t i = 0; i < nb; i++, w += CPU_QUANT_R8_BYTES_4_1) {
        for (int o = 0; o < CPU_QUANT_R8_BYTES_4_1; o += 64)
            _mm_prefetch((const char *)w + 8 * CPU_QUANT_R8_BYTES_4_1 + o, _MM_HINT_T0);
        __m256i s[4];
        for (int c = 0; c < C; c++) s[c] = _mm256_setzero_si256();
        for (int l = 0; l < 4; l++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(w + 32 + 32 * l));
            const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            for (int c = 0; c < C; c++) {
                int32_t alo, ahi;
                memcpy(&alo, a[c][i].qs + 4 * l, 4);
                memcpy(&ahi, a[c][i].qs + 16 + 4 * l, 4);
                s[c] = _mm256_add_epi16(s[c], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(alo)));
                s[c] = _mm256_add_epi16(s[c], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(ahi)));
            }
        }
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w));
        const __m256 m8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 16)));
        for (int c = 0; c < C; c++) {
            const __m256i sumi = _mm256_madd_epi16(s[c], ones);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(d8, _mm256_set1_ps(a[c][i].d)), acc[c]);
            accm[c] = _mm256_fmadd_ps(m8, _mm256_set1_ps(a[c][i].d * (float)a[c][i].sum), accm[c]);
        }
    }
    for (int c = 0; c < C; c++) out[c] = _mm256_add_ps(acc[c], accm[c]);
}

/* Q8_0's 8 rows in the lanes (quant.h's CPU_QUANT_Q8_0_R8): per block 8 loads of 32 bytes (4 quants
 * of 8 rows each), |w| shared by the C tokens, each token's 4 activations broadcast and signed by w
 * (maddubs takes an unsigned operand: |w|·(a·sign(w)) = w·a), each maddubs result (up to
 * 2·127·127) widened by madd at once; then acc = fma(Σ q·a, d·d_a, acc): the portable path's
 * floats bit for bit. */
TARGET static inline __attribute__((always_inline)) void r8_8_0_dot(const uint8_t *w, const void *const *a_, int32_t nb,
                                                                    __m256 *out, const int C) {
    const cpu_q8_block *a[4];
    for (int c = 0; c < C; c++) a[c] = a_[c];
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int32_t i = 0; i < nb; i++, w += CPU_QUANT_R8_BYTES_8_0) {
        for (int o = 0; o < CPU_QUANT_R8_BYTES_8_0; o += 64)
            _mm_prefetch((const char *)w + 4 * CPU_QUANT_R8_BYTES_8_0 + o, _MM_HINT_T0);
        __m256i s[4];
        for (int c = 0; c < C; c++) s[c] = _mm256_setzero_si256();
        for (int l = 0; l < 8; l++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * l)), u = _mm256_abs_epi8(v);
            for (int c = 0; c < C; c++) {
                int32_t a4;
                memcpy(&a4, a[c][i].qs + 4 * l, 4);
                const __m256i p = _mm256_maddubs_epi16(u, _mm256_sign_epi8(_mm256_set1_epi32(a4), v));
                s[c] = _mm256_add_epi32(s[c], _mm256_madd_epi16(p, ones));
            }
        }
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w));
        for (int c = 0; c < C; c++)
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[c]), _mm256_mul_ps(d8, _mm256_set1_ps(a[c][i].d)), acc[c]);
    }
    for (int c = 0; c < C; c++) out[c] = acc[c];
}

/* A kernel's C tokens (1 or 4) against a group of 8 rows: lane r of out[c] is row r · token c (a[c]
 * token c's activation blocks, the kernel's block type). */
typedef void r8_kernel(const uint8_t *w, const void *const *a, int32_t nb, __m256 *out, const int C);

/* The repacked formats' GEMV: each group of 8 rows (group_bytes a super-block) against the tokens 4
 * at a time (they share the weights' unpacking), the rest one at a time. Inlined with a constant
 * `dot` (r8_dot, r8_6_dot), so the kernel is inlined too and its C a constant. */
TARGET static inline __attribute__((always_inline)) void gemm_r8(r8_kernel *dot, size_t group_bytes, const void *w_,
                                                                 int32_t n_groups, const void *act, size_t act_bytes,
                                                                 int32_t n_tokens, int32_t nb, float *y, size_t ldy,
                                                                 int accumulate) {
    const uint8_t *w = w_;
    for (int32_t g = 0; g < n_groups; g++)
        for (int32_t t = 0; t < n_tokens;) {
            const int C = n_tokens - t >= 4 ? 4 : 1; /* groups of 4 tokens share the unpacking */
            const void *a[4];
            for (int c = 0; c < C; c++) a[c] = (const uint8_t *)act + act_bytes * (size_t)(t + c);
            __m256 v[4];
            if (C == 4) dot(w + (size_t)g * nb * group_bytes, a, nb, v, 4);
            else dot(w + (size_t)g * nb * group_bytes, a, nb, v, 1);
            for (int c = 0; c < C; c++) {
                float *dst = y + ldy * (size_t)(t + c) + 8 * g;
                _mm256_storeu_ps(dst, accumulate ? _mm256_add_ps(_mm256_loadu_ps(dst), v[c]) : v[c]);
            }
            t += C;
        }
}

TARGET void cpu_quant_gemm_r8_avx2(const void *w, int32_t n_groups, const void *act, size_t act_bytes,
                                   int32_t n_tokens, int32_t nb, float *y, size_t ldy, int accumulate) {
    gemm_r8(r8_dot, CPU_QUANT_R8_BYTES, w, n_groups, act, act_bytes, n_tokens, nb, y, ldy, accumulate);
}

TARGET void cpu_quant_gemm_r8_6_avx2(const void *w, int32_t n_groups, const void *act, size_t act_bytes,
                                     int32_t n_tokens, int32_t nb, float *y, size_t ldy, int accumulate) {
    gemm_r8(r8_6_dot, CPU_QUANT_R8_BYTES_6, w, n_groups, act, act_bytes, n_tokens, nb, y, ldy, accumulate);
}

TARGET void cpu_quant_gemm_r8_4_1_avx2(const void *w, int32_t n_groups, const void *act, size_t act_bytes,
                                       int32_t n_tokens, int32_t nb, float *y, size_t ldy, int accumulate) {
    gemm_r8(r8_4_1_dot, CPU_QUANT_R8_BYTES_4_1, w, n_groups, act, act_bytes, n_tokens, nb, y, ldy, accumulate);
}

TARGET void cpu_quant_gemm_r8_8_0_avx2(const void *w, int32_t n_groups, const void *act, size_t act_bytes,
                                       int32_t n_tokens, int32_t nb, float *y, size_t ldy, int accumulate) {
    gemm_r8(r8_8_0_dot, CPU_QUANT_R8_BYTES_8_0, w, n_groups, act, act_bytes, n_tokens, nb, y, ldy, accumulate);
}

#endif

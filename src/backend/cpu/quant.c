/* CPU linear layers on GGUF block-quantized weights: the activations' quantization, the portable
 * dot products and the parallel GEMV / GEMM (quant.h). Weight blocks are read byte by byte
 * (little-endian, any alignment), as io/gguf_dequant.c does; the backend layer may not include
 * io/, so the fp16 conversion and the row dequantisers for prefill are this file's own (the
 * test checks them against io/gguf_dequant). */
#include "backend/cpu/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include <omp.h>

#include "util/error.h"

enum { QK = CPU_QUANT_QK, QK_K = CPU_QUANT_QK_K };

/* The fp16 at p (little-endian) as float, exactly (scales are finite: no NaN / inf handling
 * beyond keeping them NaN / inf). */
static float fp16(const uint8_t *p) {
    const uint32_t h = (uint32_t)(p[0] | p[1] << 8);
    const uint32_t sign = (h & 0x8000u) << 16, exp = h >> 10 & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | man << 13;
    else if (exp) bits = sign | (exp + 112) << 23 | man << 13; /* rebias 15 -> 127 */
    else if (!man) bits = sign;
    else { /* subnormal: man · 2^-24 */
        int top = 9;
        while (!(man >> top)) top--;
        bits = sign | (uint32_t)(top + 103) << 23 | (man << (23 - top) & 0x7fffffu);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ---- formats -------------------------------------------------------------------------------- */

typedef struct quant_format {
    const char *name;
    int32_t block;        /* elements per block */
    size_t bytes;         /* bytes per weight block */
    int k_quant;          /* activations as cpu_q8k_block (else cpu_q8_block) */
} quant_format;

static const quant_format *find_format(uint32_t type) {
    static const quant_format q4_0 = {"Q4_0", QK, 18, 0}, q4_1 = {"Q4_1", QK, 20, 0},
                              q5_0 = {"Q5_0", QK, 22, 0}, q5_1 = {"Q5_1", QK, 24, 0},
                              q8_0 = {"Q8_0", QK, 34, 0}, q4_k = {"Q4_K", QK_K, 144, 1},
                              q5_k = {"Q5_K", QK_K, 176, 1}, q6_k = {"Q6_K", QK_K, 210, 1},
                              q4_k_r8 = {"Q4_K_R8", QK_K, CPU_QUANT_R8_BYTES / 8, 1}, /* bytes a row */
                              q6_k_r8 = {"Q6_K_R8", QK_K, CPU_QUANT_R8_BYTES_6 / 8, 1},
                              q4_1_r8 = {"Q4_1_R8", QK, CPU_QUANT_R8_BYTES_4_1 / 8, 0},
                              q8_0_r8 = {"Q8_0_R8", QK, CPU_QUANT_R8_BYTES_8_0 / 8, 0};
    switch (type) {
    case CPU_QUANT_Q4_0: return &q4_0;
    case CPU_QUANT_Q4_1: return &q4_1;
    case CPU_QUANT_Q5_0: return &q5_0;
    case CPU_QUANT_Q5_1: return &q5_1;
    case CPU_QUANT_Q8_0: return &q8_0;
    case CPU_QUANT_Q4_K: return &q4_k;
    case CPU_QUANT_Q5_K: return &q5_k;
    case CPU_QUANT_Q6_K: return &q6_k;
    case CPU_QUANT_Q4_K_R8: return &q4_k_r8;
    case CPU_QUANT_Q6_K_R8: return &q6_k_r8;
    case CPU_QUANT_Q4_1_R8: return &q4_1_r8;
    case CPU_QUANT_Q8_0_R8: return &q8_0_r8;
    default: return NULL;
    }
}

/* A format laid out at load in groups of 8 interleaved rows (no file holds it). */
static int is_r8(uint32_t type) {
    return type == CPU_QUANT_Q4_K_R8 || type == CPU_QUANT_Q6_K_R8 || type == CPU_QUANT_Q4_1_R8 ||
           type == CPU_QUANT_Q8_0_R8;
}

/* The format of `type` for a row of K, or an error naming what is wrong. */
static nopad_status check(const char *fn, uint32_t type, int32_t K, const quant_format **f) {
    *f = find_format(type);
    if (!*f)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: ggml type %u is not a quantized format the CPU runs "
                               "(Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, and Q4_K / Q6_K / Q4_1 / Q8_0 repacked)",
                               fn, type);
    if (K <= 0 || K % (*f)->block != 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s: rows of K = %d values of %s, expected a positive multiple of "
                               "its block of %d",
                               fn, K, (*f)->name, (*f)->block);
    return NOPAD_OK;
}

int32_t cpu_quant_block_size(uint32_t type) {
    const quant_format *f = find_format(type);
    return f ? f->block : 0;
}

size_t cpu_quant_row_bytes(uint32_t type, int32_t K) {
    const quant_format *f = find_format(type);
    return f && K > 0 ? (size_t)(K / f->block) * f->bytes : 0;
}

size_t cpu_quant_act_row_bytes(uint32_t type, int32_t K) {
    const quant_format *f = find_format(type);
    if (!f || K <= 0) return 0;
    return f->k_quant ? (size_t)(K / QK_K) * sizeof(cpu_q8k_block)
                      : (size_t)(K / QK) * sizeof(cpu_q8_block);
}

/* The path `isa` on this CPU, or an error naming `fn`. */
static nopad_status check_isa(const char *fn, cpu_quant_isa isa) {
    if (isa > cpu_quant_best_isa())
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: the %s path asked for on a CPU (or build) without %s", fn,
                               isa == CPU_QUANT_AVX2 ? "AVX2" : "AVX-512 VNNI",
                               isa == CPU_QUANT_AVX2 ? "AVX2, FMA and F16C" : "AVX2, FMA, F16C, AVX512VNNI and AVX512VL");
    return NOPAD_OK;
}

/* ---- activations ---------------------------------------------------------------------------- */

/* n values to int8 with d = max|x| / 127 (0 for an all-zero block: every q is then 0), rounded
 * to nearest: |x_i - d·q_i| <= d/2. */
static float quantize_block(int8_t *q, const float *x, int n) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < n; i++) {
        /* x·(1/d) can round a hair past 127.5 only when it should give 127 */
        long v = lrintf(x[i] * id);
        q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
    return d;
}

nopad_status cpu_quant_activations_on(void *act, const float *x, uint32_t type, int32_t K, cpu_quant_isa isa) {
    const quant_format *f;
    nopad_status st = check("cpu_quant_activations", type, K, &f);
    if (st == NOPAD_OK) st = check_isa("cpu_quant_activations", isa);
    if (st != NOPAD_OK) return st;
#if defined(__x86_64__)
    if (isa != CPU_QUANT_PORTABLE) { /* the same blocks bit for bit */
        if (f->k_quant) {
            cpu_q8k_block *b = act;
            for (int32_t i = 0; i < K / QK_K; i++, x += QK_K) b[i].d = cpu_quant_quantize_avx2(b[i].qs, b[i].bsums, x, QK_K);
        } else {
            cpu_q8_block *b = act;
            for (int32_t i = 0; i < K / QK; i++, x += QK) {
                int16_t sums[2];
                b[i].d = cpu_quant_quantize_avx2(b[i].qs, sums, x, QK);
                b[i].sum = sums[0] + sums[1];
            }
        }
        return NOPAD_OK;
    }
#endif
    if (f->k_quant) {
        cpu_q8k_block *b = act;
        for (int32_t i = 0; i < K / QK_K; i++, x += QK_K) {
            b[i].d = quantize_block(b[i].qs, x, QK_K);
            for (int j = 0; j < QK_K / 16; j++) {
                int s = 0;
                for (int l = 0; l < 16; l++) s += b[i].qs[16 * j + l];
                b[i].bsums[j] = (int16_t)s;
            }
        }
    } else {
        cpu_q8_block *b = act;
        for (int32_t i = 0; i < K / QK; i++, x += QK) {
            b[i].d = quantize_block(b[i].qs, x, QK);
            int s = 0;
            for (int l = 0; l < QK; l++) s += b[i].qs[l];
            b[i].sum = s;
        }
    }
    return NOPAD_OK;
}

nopad_status cpu_quant_activations(void *act, const float *x, uint32_t type, int32_t K) {
    return cpu_quant_activations_on(act, x, type, K, cpu_quant_best_isa());
}

/* ---- portable dot products: nb weight blocks w with activation blocks a --------------------- */

static float dot_q8_0(const uint8_t *w, const cpu_q8_block *a, int32_t nb) {
    float sum = 0.0f;
    for (int32_t i = 0; i < nb; i++, w += 34) {
        int32_t s = 0;
        for (int l = 0; l < QK; l++) s += (int8_t)w[2 + l] * a[i].qs[l];
        sum += fp16(w) * a[i].d * (float)s;
    }
    return sum;
}

/* Q4_0 and Q4_1: byte l of qs holds element l (low nibble) and l + 16 (high). Q5_0 and Q5_1
 * add bit e of qh (4 bytes, little-endian) as 16 to element e. */
static int32_t nibbles_dot(const uint8_t *qs, const uint8_t *qh, const int8_t *a) {
    const uint32_t high = qh ? (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24
                             : 0;
    int32_t s = 0;
    for (int l = 0; l < QK / 2; l++)
        s += (int)((qs[l] & 0x0f) | (high >> l & 1) << 4) * a[l] +
             (int)((qs[l] >> 4) | (high >> (l + QK / 2) & 1) << 4) * a[l + QK / 2];
    return s;
}

/* Q4_0 (fp16 d, qs[16]; x = (q - 8)·d) and Q5_0 (fp16 d, qh[4], qs[16]; x = (q - 16)·d):
 * Σ (q - o)·a = Σ q·a - o·Σ a. */
static float dot_q4_5_0(const uint8_t *w, const cpu_q8_block *a, int32_t nb, int five_bits) {
    const int32_t offset = five_bits ? 16 : 8;
    float sum = 0.0f;
    for (int32_t i = 0; i < nb; i++, w += five_bits ? 22 : 18)
        sum += fp16(w) * a[i].d *
               (float)(nibbles_dot(w + (five_bits ? 6 : 2), five_bits ? w + 2 : NULL, a[i].qs) - offset * a[i].sum);
    return sum;
}

/* Q4_1 (fp16 d, fp16 m, qs[16]) and Q5_1 (fp16 d, fp16 m, qh[4], qs[16]): x = q·d + m. */
static float dot_q4_5_1(const uint8_t *w, const cpu_q8_block *a, int32_t nb, int five_bits) {
    float sum = 0.0f, sum_m = 0.0f;
    for (int32_t i = 0; i < nb; i++, w += five_bits ? 24 : 20) {
        sum += fp16(w) * a[i].d * (float)nibbles_dot(w + (five_bits ? 8 : 4), five_bits ? w + 4 : NULL, a[i].qs);
        sum_m += fp16(w + 2) * a[i].d * (float)a[i].sum;
    }
    return sum + sum_m;
}

/* ggml's get_scale_min_k4 (as io/gguf_dequant.c): the 6-bit scale and min of sub-block j. */
static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | (q[j - 4] >> 6) << 4;
        *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

/* Q4_K and Q5_K: x = d·sc_j·q - dmin·m_j in sub-block j of 32, so a super-block gives
 * d·d_a·Σ_j sc_j·Σ q·a - dmin·d_a·Σ_j m_j·Σ a. qs byte 32k + l holds element 64k + l (low nibble)
 * and 64k + 32 + l (high); Q5_K's fifth bit of those is bit 2k / 2k+1 of qh[l]. */
static float dot_q45_k(const uint8_t *w, const cpu_q8k_block *a, int32_t nb, int five_bits) {
    const size_t bytes = five_bits ? 176 : 144;
    float sum = 0.0f;
    for (int32_t i = 0; i < nb; i++, w += bytes) {
        const uint8_t *scales = w + 4, *qh = w + 16, *qs = w + (five_bits ? 48 : 16);
        const int8_t *q8 = a[i].qs;
        int32_t sumi = 0, summ = 0;
        for (int k = 0; k < 4; k++, qs += 32, q8 += 64) {
            int sc0, m0, sc1, m1;
            scale_min_k4(2 * k, scales, &sc0, &m0);
            scale_min_k4(2 * k + 1, scales, &sc1, &m1);
            int32_t s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                int lo = qs[l] & 0x0f, hi = qs[l] >> 4;
                if (five_bits) {
                    lo |= (qh[l] >> (2 * k) & 1) << 4;
                    hi |= (qh[l] >> (2 * k + 1) & 1) << 4;
                }
                s0 += lo * q8[l];
                s1 += hi * q8[l + 32];
            }
            sumi += sc0 * s0 + sc1 * s1;
            summ += m0 * (a[i].bsums[4 * k] + a[i].bsums[4 * k + 1]) +
                    m1 * (a[i].bsums[4 * k + 2] + a[i].bsums[4 * k + 3]);
        }
        sum += fp16(w) * a[i].d * (float)sumi - fp16(w + 2) * a[i].d * (float)summ;
    }
    return sum;
}

/* Q6_K (layout in io/gguf_dequant.c): x = d·scale_g·(q - 32) per group g of 16, so a super-block
 * gives d·d_a·Σ_g scale_g·(Σ q·a - 32·Σ a). */
static float dot_q6_k(const uint8_t *w, const cpu_q8k_block *a, int32_t nb) {
    float sum = 0.0f;
    for (int32_t i = 0; i < nb; i++, w += 210) {
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        int32_t group[16] = {0}; /* Σ q·a per group of 16 */
        for (int h = 0; h < 2; h++, ql += 64, qh += 32) {
            const int8_t *q8 = a[i].qs + 128 * h;
            int32_t *g = group + 8 * h;
            for (int l = 0; l < 32; l++) {
                const int q1 = (ql[l] & 0x0f) | (qh[l] & 3) << 4;
                const int q2 = (ql[l + 32] & 0x0f) | (qh[l] >> 2 & 3) << 4;
                const int q3 = (ql[l] >> 4) | (qh[l] >> 4 & 3) << 4;
                const int q4 = (ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4;
                g[l / 16] += q1 * q8[l];
                g[l / 16 + 2] += q2 * q8[l + 32];
                g[l / 16 + 4] += q3 * q8[l + 64];
                g[l / 16 + 6] += q4 * q8[l + 96];
            }
        }
        int32_t sumi = 0;
        for (int j = 0; j < 16; j++) sumi += sc[j] * (group[j] - 32 * a[i].bsums[j]);
        sum += fp16(w + 208) * a[i].d * (float)sumi;
    }
    return sum;
}

static float dot_portable(uint32_t type, const void *w, const void *act, int32_t nb) {
    switch (type) {
    case CPU_QUANT_Q8_0: return dot_q8_0(w, act, nb);
    case CPU_QUANT_Q4_0: return dot_q4_5_0(w, act, nb, 0);
    case CPU_QUANT_Q4_1: return dot_q4_5_1(w, act, nb, 0);
    case CPU_QUANT_Q5_0: return dot_q4_5_0(w, act, nb, 1);
    case CPU_QUANT_Q5_1: return dot_q4_5_1(w, act, nb, 1);
    case CPU_QUANT_Q4_K: return dot_q45_k(w, act, nb, 0);
    case CPU_QUANT_Q5_K: return dot_q45_k(w, act, nb, 1);
    default: return dot_q6_k(w, act, nb);
    }
}

/* ---- Q4_K repacked, 8 rows interleaved (quant.h's CPU_QUANT_Q4_K_R8) ------------------------- */

/* The repacked formats' layout at load: the N rows (N a multiple of 8, K of the block) of src as
 * stored (src_bytes a row's block) into groups of 8 rows, group g's block i at
 * dst + (g · K/block + i) · dst_bytes, `move` putting row r's block b into its places in o. */
static nopad_status repack_r8(const char *fn, void *dst_, const void *src_, int32_t K, int32_t N, int32_t block,
                              size_t src_bytes, size_t dst_bytes, void (*move)(uint8_t *o, int r, const uint8_t *b)) {
    if (K <= 0 || K % block != 0 || N < 0 || N % 8 != 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s: %d rows of K = %d, expected a multiple of 8 rows of a positive multiple of %d "
                               "values",
                               fn, N, K, block);
    uint8_t *dst = dst_;
    const uint8_t *src = src_;
    const int32_t nb = K / block;
    const size_t row = (size_t)nb * src_bytes;
    for (int32_t g = 0; g < N / 8; g++)
        for (int32_t i = 0; i < nb; i++) {
            uint8_t *o = dst + ((size_t)g * nb + i) * dst_bytes;
            for (int r = 0; r < 8; r++) move(o, r, src + (size_t)(8 * g + r) * row + (size_t)i * src_bytes);
        }
    return NOPAD_OK;
}

/* Row r's Q4_K super-block b (d, dmin, 12 bytes of scales and mins, 128 of quants) into CPU_QUANT_Q4_K_R8's
 * block o. */
static void move_q4_k_r8(uint8_t *o, int r, const uint8_t *b) {
    memcpy(o + 2 * r, b, 2);
    memcpy(o + 16 + 2 * r, b + 2, 2);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        scale_min_k4(j, b + 4, &sc, &m);
        o[32 + 8 * j + r] = (uint8_t)sc;
        o[96 + 16 * (j / 2) + 2 * r + j % 2] = (uint8_t)m;
    }
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < 8; l++) memcpy(o + 160 + 256 * k + 32 * l + 4 * r, b + 16 + 32 * k + 4 * l, 4);
}

nopad_status cpu_quant_repack_q4_k_r8(void *dst, const void *src, int32_t K, int32_t N) {
    return repack_r8("cpu_quant_repack_q4_k_r8", dst, src, K, N, QK_K, 144, CPU_QUANT_R8_BYTES, move_q4_k_r8);
}

/* rows (a multiple of 8) repacked rows of K to float [rows, K], the values of dequant_q45_k bit for
 * bit (the same d·sc and dmin·m products, the same d1·q - m1): a group's super-block at a time, its
 * 32-byte runs of 8 rows' quants each written to the 8 rows (one pass over the weights in order:
 * prompts dequantise every row once a call, and a row at a time ran 1.1x slower, docs/decoder.md) */
static void dequant_r8(const uint8_t *w, int32_t K, int32_t rows, float *out) {
    const int32_t nb = K / QK_K;
    for (int32_t g = 0; g < rows / 8; g++)
        for (int32_t i = 0; i < nb; i++) {
            const uint8_t *o = w + ((size_t)g * nb + i) * CPU_QUANT_R8_BYTES;
            float dl[8][8], ml[8][8]; /* [row][sub-block] */
            for (int r = 0; r < 8; r++) {
                const float d = fp16(o + 2 * r), dmin = fp16(o + 16 + 2 * r);
                for (int j = 0; j < 8; j++) {
                    dl[r][j] = d * (float)o[32 + 8 * j + r];
                    ml[r][j] = dmin * (float)o[96 + 16 * (j / 2) + 2 * r + j % 2];
                }
            }
            float *y = out + (size_t)8 * g * K + (size_t)i * QK_K;
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < 8; l++) {
                    const uint8_t *q = o + 160 + 256 * k + 32 * l;
                    for (int r = 0; r < 8; r++) {
                        float *yr = y + (size_t)r * K + 64 * k + 4 * l;
                        for (int b = 0; b < 4; b++) {
                            yr[b] = dl[r][2 * k] * (float)(q[4 * r + b] & 0x0f) - ml[r][2 * k];
                            yr[32 + b] = dl[r][2 * k + 1] * (float)(q[4 * r + b] >> 4) - ml[r][2 * k + 1];
                        }
                    }
                }
        }
}

/* The portable GEMV on the repacked rows: per row and super-block the exact integers of
 * dot_q45_k, then the AVX2 path's two fused multiply-adds (fmaf), so the same floats bit for bit. */
static void gemm_r8_portable(const void *w_, int32_t n_groups, const void *act_, size_t act_bytes,
                             int32_t n_tokens, int32_t nb, float *y, size_t ldy, int accumulate) {
    const uint8_t *w = w_, *act = act_;
    for (int32_t g = 0; g < n_groups; g++)
        for (int32_t t = 0; t < n_tokens; t++) {
            const cpu_q8k_block *a = (const cpu_q8k_block *)(act + act_bytes * (size_t)t);
            float acc[8] = {0};
            for (int32_t i = 0; i < nb; i++) {
                const uint8_t *o = w + ((size_t)g * nb + i) * CPU_QUANT_R8_BYTES;
                for (int r = 0; r < 8; r++) {
                    int32_t sumi = 0, summ = 0;
                    for (int j = 0; j < 8; j++) {
                        int32_t s = 0;
                        for (int l = 0; l < 32; l++) {
                            const uint8_t q = o[160 + 256 * (j / 2) + 32 * (l / 4) + 4 * r + l % 4];
                            s += (j % 2 ? q >> 4 : q & 0x0f) * a[i].qs[64 * (j / 2) + 32 * (j % 2) + l];
                        }
                        sumi += o[32 + 8 * j + r] * s;
                        summ += o[96 + 16 * (j / 2) + 2 * r + j % 2] * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
                    }
                    acc[r] = fmaf((float)sumi, fp16(o + 2 * r) * a[i].d, acc[r]);
                    acc[r] = fmaf(-(float)summ, fp16(o + 16 + 2 * r) * a[i].d, acc[r]);
                }
            }
            for (int r = 0; r < 8; r++) {
                float *dst = y + ldy * (size_t)t + 8 * g + r;
                *dst = accumulate ? *dst + acc[r] : acc[r];
            }
        }
}

/* Row r's Q6_K super-block b (ql, qh, scales, d) into CPU_QUANT_Q6_K_R8's block o. */
static void move_q6_k_r8(uint8_t *o, int r, const uint8_t *b) {
    memcpy(o + 2 * r, b + 208, 2);
    for (int p = 0; p < 8; p++) memcpy(o + 16 + 16 * p + 2 * r, b + 192 + 2 * p, 2);
    for (int h = 0; h < 2; h++) {
        for (int m = 0; m < 16; m++) memcpy(o + 144 + 512 * h + 32 * m + 4 * r, b + 64 * h + 4 * m, 4);
        for (int m = 0; m < 8; m++) memcpy(o + 1168 + 256 * h + 32 * m + 4 * r, b + 128 + 32 * h + 4 * m, 4);
    }
}

nopad_status cpu_quant_repack_q6_k_r8(void *dst, const void *src, int32_t K, int32_t N) {
    return repack_r8("cpu_quant_repack_q6_k_r8", dst, src, K, N, QK_K, 210, CPU_QUANT_R8_BYTES_6, move_q6_k_r8);
}

/* Row r's quant e (0..255) of a Q6_K group super-block o (CPU_QUANT_Q6_K_R8), 0..63. */
static int r8_6_quant(const uint8_t *o, int r, int e) {
    const int h = e / 128, run = e % 128 / 32, l = e % 32;
    const int m = l / 4 + (run & 1) * 8, b = l % 4;
    const uint8_t ql = o[144 + 512 * h + 32 * m + 4 * r + b];
    const uint8_t qh = o[1168 + 256 * h + 32 * (l / 4) + 4 * r + b];
    return (run < 2 ? ql & 0x0f : ql >> 4) | (qh >> (2 * run) & 3) << 4;
}

/* Row r's scale of group j (0..15). */
static int r8_6_scale(const uint8_t *o, int r, int j) { return (int8_t)o[16 + 16 * (j / 2) + 2 * r + j % 2]; }

/* rows (a multiple of 8) repacked Q6_K rows of K to float [rows, K]: dequant_q6_k's values bit for
 * bit (d·sc·(q - 32) in the same order) */
static void dequant_r8_6(const uint8_t *w, int32_t K, int32_t rows, float *out) {
    const int32_t nb = K / QK_K;
    for (int32_t g = 0; g < rows / 8; g++)
        for (int32_t i = 0; i < nb; i++) {
            const uint8_t *o = w + ((size_t)g * nb + i) * CPU_QUANT_R8_BYTES_6;
            for (int r = 0; r < 8; r++) {
                float *y = out + (size_t)(8 * g + r) * K + (size_t)i * QK_K;
                const float d = fp16(o + 2 * r);
                for (int e = 0; e < QK_K; e++)
                    y[e] = d * (float)r8_6_scale(o, r, e / 16) * (float)(r8_6_quant(o, r, e) - 32);
            }
        }
}

/* The portable GEMV on repacked Q6_K: dot_q6_k's integers, then one fused multiply-add (fmaf) as
 * the AVX2 path's, the same floats bit for bit. */
static void gemm_r8_6_portable(const void *w_, int32_t n_groups, const void *act_, size_t act_bytes,
                               int32_t n_tokens, int32_t nb, float *y, size_t ldy, int accumulate) {
    const uint8_t *w = w_, *act = act_;
    for (int32_t g = 0; g < n_groups; g++)
        for (int32_t t = 0; t < n_tokens; t++) {
            const cpu_q8k_block *a = (const cpu_q8k_block *)(act + act_bytes * (size_t)t);
            float acc[8] = {0};
            for (int32_t i = 0; i < nb; i++) {
                const uint8_t *o = w + ((size_t)g * nb + i) * CPU_QUANT_R8_BYTES_6;
                for (int r = 0; r < 8; r++) {
                    int32_t sumi = 0;
                    for (int j = 0; j < 16; j++) {
                        int32_t s = 0;
                        for (int e = 16 * j; e < 16 * j + 16; e++) s += r8_6_quant(o, r, e) * a[i].qs[e];
                        sumi += r8_6_scale(o, r, j) * (s - 32 * a[i].bsums[j]);
                    }
                    acc[r] = fmaf((float)sumi, fp16(o + 2 * r) * a[i].d, acc[r]);
                }
            }
            for (int r = 0; r < 8; r++) {
                float *dst = y + ldy * (size_t)t + 8 * g + r;
                *dst = accumulate ? *dst + acc[r] : acc[r];
            }
        }
}

/* ---- dispatch ------------------------------------------------------------------------------- */

#if defined(__x86_64__)
#define HAVE_AVX2_PATH 1
#include <cpuid.h>
#else
#define HAVE_AVX2_PATH 0
#endif

/* ---- Q4_1 repacked, 8 rows interleaved (quant.h's CPU_QUANT_Q4_1_R8) ------------------------- */

/* Row r's Q4_1 block b (d, m, 16 bytes of nibble pairs) into CPU_QUANT_Q4_1_R8's block o. */
static void move_q4_1_r8(uint8_t *o, int r, const uint8_t *b) {
    memcpy(o + 2 * r, b, 2);
    memcpy(o + 16 + 2 * r, b + 2, 2);
    for (int l = 0; l < 4; l++) memcpy(o + 32 + 32 * l + 4 * r, b + 4 + 4 * l, 4);
}

nopad_status cpu_quant_repack_q4_1_r8(void *dst, const void *src, int32_t K, int32_t N) {
    return repack_r8("cpu_quant_repack_q4_1_r8", dst, src, K, N, QK, 20, CPU_QUANT_R8_BYTES_4_1, move_q4_1_r8);
}

/* ---- Q8_0 repacked, 8 rows interleaved (quant.h's CPU_QUANT_Q8_0_R8) ------------------------- */

/* Row r's Q8_0 block b (d, 32 int8) into CPU_QUANT_Q8_0_R8's block o. */
static void move_q8_0_r8(uint8_t *o, int r, const uint8_t *b) {
    memcpy(o + 2 * r, b, 2);
    for (int l = 0; l < 8; l++) memcpy(o + 16 + 32 * l + 4 * r, b + 2 + 4 * l, 4);
}

nopad_status cpu_quant_repack_q8_0_r8(void *dst, const void *src, int32_t K, int32_t N) {
    return repack_r8("cpu_quant_repack_q8_0_r8", dst, src, K, N, QK, 34, CPU_QUANT_R8_BYTES_8_0, move_q8_0_r8);
}

/* ---- the blocks of 32 repacked (Q4_1 and Q8_0): their reference dequantiser and portable GEMV -- */

/* Row r's value l (0..31) of a repacked block o: Q4_1's nibble (low nibbles are values 0..15, high
 * 16..31; quants from byte 32, after the 8 d and 8 m), Q8_0's int8 (from byte 16, after the 8 d). */
static inline int r8_32_quant(const uint8_t *o, int q4_1, int r, int l) {
    if (!q4_1) return (int8_t)o[16 + 32 * (l / 4) + 4 * r + l % 4];
    const uint8_t q = o[32 + 32 * (l % 16 / 4) + 4 * r + l % 4];
    return l < 16 ? q & 0x0f : q >> 4;
}

/* rows (a multiple of 8) repacked Q4_1 (q4_1) or Q8_0 rows of K to float [rows, K]: dequant_q4_5's
 * q·d + m and dequant_q8_0's q·d bit for bit. */
static void dequant_r8_32(const uint8_t *w, int32_t K, int32_t rows, float *out, int q4_1) {
    const int32_t nb = K / QK;
    const size_t block_bytes = q4_1 ? CPU_QUANT_R8_BYTES_4_1 : CPU_QUANT_R8_BYTES_8_0;
    for (int32_t g = 0; g < rows / 8; g++)
        for (int32_t i = 0; i < nb; i++) {
            const uint8_t *o = w + ((size_t)g * nb + i) * block_bytes;
            for (int r = 0; r < 8; r++) {
                const float d = fp16(o + 2 * r);
                float *y = out + (size_t)(8 * g + r) * K + (size_t)i * QK;
                if (q4_1) {
                    const float m = fp16(o + 16 + 2 * r);
                    for (int l = 0; l < QK; l++) y[l] = (float)r8_32_quant(o, 1, r, l) * d + m;
                } else {
                    for (int l = 0; l < QK; l++) y[l] = (float)r8_32_quant(o, 0, r, l) * d;
                }
            }
        }
}

/* The portable GEMV on repacked Q4_1 (q4_1) or Q8_0: per row and block the exact Σ q·a, then the AVX2
 * paths' fused multiply-adds (fmaf): into the q part, and for Q4_1 the m part, summed at the end;
 * the same floats bit for bit. */
static inline void gemm_r8_32_portable(int q4_1, const void *w_, int32_t n_groups, const void *act_,
                                       size_t act_bytes, int32_t n_tokens, int32_t nb, float *y, size_t ldy,
                                       int accumulate) {
    const uint8_t *w = w_, *act = act_;
    const size_t block_bytes = q4_1 ? CPU_QUANT_R8_BYTES_4_1 : CPU_QUANT_R8_BYTES_8_0;
    for (int32_t g = 0; g < n_groups; g++)
        for (int32_t t = 0; t < n_tokens; t++) {
            const cpu_q8_block *a = (const cpu_q8_block *)(act + act_bytes * (size_t)t);
            float acc[8] = {0}, accm[8] = {0};
            for (int32_t i = 0; i < nb; i++) {
                const uint8_t *o = w + ((size_t)g * nb + i) * block_bytes;
                for (int r = 0; r < 8; r++) {
                    int32_t s = 0;
                    for (int l = 0; l < QK; l++) s += r8_32_quant(o, q4_1, r, l) * a[i].qs[l];
                    acc[r] = fmaf((float)s, fp16(o + 2 * r) * a[i].d, acc[r]);
                    if (q4_1) accm[r] = fmaf(fp16(o + 16 + 2 * r), a[i].d * (float)a[i].sum, accm[r]);
                }
            }
            for (int r = 0; r < 8; r++) {
                float *dst = y + ldy * (size_t)t + 8 * g + r;
                const float v = q4_1 ? acc[r] + accm[r] : acc[r];
                *dst = accumulate ? *dst + v : v;
            }
        }
}

static void gemm_r8_4_1_portable(const void *w, int32_t n_groups, const void *act, size_t act_bytes,
                                 int32_t n_tokens, int32_t nb, float *y, size_t ldy, int accumulate) {
    gemm_r8_32_portable(1, w, n_groups, act, act_bytes, n_tokens, nb, y, ldy, accumulate);
}

static void gemm_r8_8_0_portable(const void *w, int32_t n_groups, const void *act, size_t act_bytes,
                                 int32_t n_tokens, int32_t nb, float *y, size_t ldy, int accumulate) {
    gemm_r8_32_portable(0, w, n_groups, act, act_bytes, n_tokens, nb, y, ldy, accumulate);
}

static cpu_quant_isa detect_isa(void) {
#if HAVE_AVX2_PATH
    /* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports has no "f16c" */
    unsigned eax, ebx, ecx = 0, edx;
    const int f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c)
        return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") ? CPU_QUANT_AVX2_VNNI
                                                                                          : CPU_QUANT_AVX2;
#endif
    return CPU_QUANT_PORTABLE;
}

/* Detected once: CPUID traps to the hypervisor in a VM (microseconds), once per linear layer
 * would cost a decode step a fraction of a millisecond. Threads racing here store the same. */
cpu_quant_isa cpu_quant_best_isa(void) {
    static _Atomic int best = -1;
    int isa = best;
    if (isa < 0) best = isa = (int)detect_isa();
    return (cpu_quant_isa)isa;
}

/* The repacked formats' GEMMs (quant.h's CPU_QUANT_*_R8): groups of 8 rows against the tokens, the
 * portable C and the AVX2 kernel giving the same floats. */
typedef void (*gemm_r8_fn)(const void *w, int32_t n_groups, const void *act, size_t act_bytes, int32_t n_tokens,
                           int32_t nb, float *y, size_t ldy, int accumulate);
#if HAVE_AVX2_PATH
#define R8_AVX2(f) f
#else
#define R8_AVX2(f) NULL
#endif
static const struct {
    uint32_t type;
    gemm_r8_fn portable, avx2;
} R8_GEMMS[] = {
    {CPU_QUANT_Q4_K_R8, gemm_r8_portable, R8_AVX2(cpu_quant_gemm_r8_avx2)},
    {CPU_QUANT_Q6_K_R8, gemm_r8_6_portable, R8_AVX2(cpu_quant_gemm_r8_6_avx2)},
    {CPU_QUANT_Q4_1_R8, gemm_r8_4_1_portable, R8_AVX2(cpu_quant_gemm_r8_4_1_avx2)},
    {CPU_QUANT_Q8_0_R8, gemm_r8_8_0_portable, R8_AVX2(cpu_quant_gemm_r8_8_0_avx2)},
};

/* y[t · ldy + r] (+)= row r · token t, rows w_bytes apart, tokens act_bytes apart; `panels` and
 * `scratch` as cpu_quant_gemm_vnni's (or NULL), for the VNNI path. */
static void gemm_on(cpu_quant_isa isa, uint32_t type, const uint8_t *w, size_t w_bytes, int32_t rows,
                    const uint8_t *act, size_t act_bytes, int32_t tokens, int32_t nb, float *y,
                    size_t ldy, int accumulate, const cpu_q8_panel *panels, cpu_w_panel *scratch) {
    /* the repacked formats (rows: a multiple of 8, cpu_quant_linear_ld's check) */
    for (size_t k = 0; k < sizeof R8_GEMMS / sizeof R8_GEMMS[0]; k++) {
        if (type != R8_GEMMS[k].type) continue;
        const gemm_r8_fn gemm =
            isa != CPU_QUANT_PORTABLE && R8_GEMMS[k].avx2 ? R8_GEMMS[k].avx2 : R8_GEMMS[k].portable;
        gemm(w, rows / 8, act, act_bytes, tokens, nb, y, ldy, accumulate);
        return;
    }
#if HAVE_AVX2_PATH
    if (isa == CPU_QUANT_AVX2_VNNI && find_format(type)->block == QK) { /* the k-quants: AVX2's */
        cpu_quant_gemm_vnni(type, w, w_bytes, rows, act, act_bytes, tokens, nb, y, ldy, accumulate, panels,
                            scratch);
        return;
    }
    if (isa != CPU_QUANT_PORTABLE) {
        cpu_quant_gemm_avx2(type, w, w_bytes, rows, act, act_bytes, tokens, nb, y, ldy, accumulate);
        return;
    }
#endif
    (void)isa;
    (void)panels;
    (void)scratch;
    for (int32_t r = 0; r < rows; r++)
        for (int32_t t = 0; t < tokens; t++) {
            const float dot = dot_portable(type, w + w_bytes * (size_t)r, act + act_bytes * (size_t)t, nb);
            float *out = y + ldy * (size_t)t + r;
            *out = accumulate ? *out + dot : dot;
        }
}

nopad_status cpu_quant_dot(float *out, const void *w, const void *act, uint32_t type, int32_t K,
                           cpu_quant_isa isa) {
    const quant_format *f;
    nopad_status st = check("cpu_quant_dot", type, K, &f);
    if (st == NOPAD_OK) st = check_isa("cpu_quant_dot", isa);
    if (st == NOPAD_OK && is_r8(type))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cpu_quant_dot: %s holds rows in groups of 8, not one", f->name);
    if (st != NOPAD_OK) return st;
    gemm_on(isa, type, w, 0, 1, act, 0, 1, K / f->block, out, 1, 0, NULL, NULL);
    return NOPAD_OK;
}

/* ---- float rows, for prefill ------------------------------------------------------------- */

/* nb blocks of w to float, ggml's dequantize_row_* (x as in each dot product above). */
static void dequant_q8_0(const uint8_t *w, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, w += 34, y += QK)
        for (int l = 0; l < QK; l++) y[l] = (float)(int8_t)w[2 + l] * fp16(w);
}

/* Q4_0, Q4_1, Q5_0, Q5_1 (layouts at their dot products). */
static void dequant_q4_5(const uint8_t *w, float *y, int64_t nb, int five_bits, int with_min) {
    const size_t bytes = (five_bits ? 22 : 18) + (with_min ? 2 : 0);
    const int offset = with_min ? 0 : five_bits ? 16 : 8;
    for (int64_t i = 0; i < nb; i++, w += bytes, y += QK) {
        const float d = fp16(w), m = with_min ? fp16(w + 2) : 0.0f;
        const uint8_t *qh = w + (with_min ? 4 : 2), *qs = qh + (five_bits ? 4 : 0);
        const uint32_t high = five_bits ? (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                                              (uint32_t)qh[3] << 24
                                        : 0;
        for (int l = 0; l < QK / 2; l++) {
            const int lo = (int)((qs[l] & 0x0f) | (high >> l & 1) << 4) - offset;
            const int hi = (int)((qs[l] >> 4) | (high >> (l + QK / 2) & 1) << 4) - offset;
            y[l] = with_min ? (float)lo * d + m : (float)lo * d;
            y[l + QK / 2] = with_min ? (float)hi * d + m : (float)hi * d;
        }
    }
}

static void dequant_q45_k(const uint8_t *w, float *y, int64_t nb, int five_bits) {
    for (int64_t i = 0; i < nb; i++, w += five_bits ? 176 : 144) {
        const float d = fp16(w), dmin = fp16(w + 2);
        const uint8_t *scales = w + 4, *qh = w + 16, *qs = w + (five_bits ? 48 : 16);
        for (int k = 0; k < 4; k++, qs += 32) {
            int sc, m;
            scale_min_k4(2 * k, scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            scale_min_k4(2 * k + 1, scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                int q = qs[l] & 0x0f;
                if (five_bits) q |= (qh[l] >> (2 * k) & 1) << 4;
                *y++ = d1 * (float)q - m1;
            }
            for (int l = 0; l < 32; l++) {
                int q = qs[l] >> 4;
                if (five_bits) q |= (qh[l] >> (2 * k + 1) & 1) << 4;
                *y++ = d2 * (float)q - m2;
            }
        }
    }
}

static void dequant_q6_k(const uint8_t *w, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, w += 210) {
        const float d = fp16(w + 208);
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        for (int h = 0; h < 2; h++, y += 128, ql += 64, qh += 32, sc += 8)
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                y[l] = d * (float)sc[is] * (float)(((ql[l] & 0x0f) | (qh[l] & 3) << 4) - 32);
                y[l + 32] = d * (float)sc[is + 2] *
                            (float)(((ql[l + 32] & 0x0f) | (qh[l] >> 2 & 3) << 4) - 32);
                y[l + 64] = d * (float)sc[is + 4] * (float)(((ql[l] >> 4) | (qh[l] >> 4 & 3) << 4) - 32);
                y[l + 96] = d * (float)sc[is + 6] *
                            (float)(((ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4) - 32);
            }
    }
}

static void dequant_rows(uint32_t type, const uint8_t *w, int64_t n_values, float *out) {
    switch (type) {
    case CPU_QUANT_Q8_0: dequant_q8_0(w, out, n_values / QK); break;
    case CPU_QUANT_Q4_0: dequant_q4_5(w, out, n_values / QK, 0, 0); break;
    case CPU_QUANT_Q4_1: dequant_q4_5(w, out, n_values / QK, 0, 1); break;
    case CPU_QUANT_Q5_0: dequant_q4_5(w, out, n_values / QK, 1, 0); break;
    case CPU_QUANT_Q5_1: dequant_q4_5(w, out, n_values / QK, 1, 1); break;
    case CPU_QUANT_Q4_K: dequant_q45_k(w, out, n_values / QK_K, 0); break;
    case CPU_QUANT_Q5_K: dequant_q45_k(w, out, n_values / QK_K, 1); break;
    default: dequant_q6_k(w, out, n_values / QK_K);
    }
}

nopad_status cpu_quant_dequantize(float *out, const void *w, uint32_t type, int32_t K) {
    const quant_format *f;
    nopad_status st = check("cpu_quant_dequantize", type, K, &f);
    if (st == NOPAD_OK && is_r8(type))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cpu_quant_dequantize: %s holds rows in groups of 8, not one",
                               f->name);
    if (st == NOPAD_OK) dequant_rows(type, w, K, out);
    return st;
}

/* ---- GEMV / GEMM ---------------------------------------------------------------------------- */

/* Weight rows per work item of the int8 path, and tokens per pass over them: a tile's rows
 * (TILE_ROWS · K bytes at 4-8 bits, tens of KB) stay in L1/L2 while a chunk of TOKEN_CHUNK
 * quantized rows of x (about 100 KB at K = 1536) passes over them from L2. */
enum { TILE_ROWS = 16, TOKEN_CHUNK = 64 };

/* From cpu_quant_sgemm_tokens on, a weight row is used often enough that dequantising it once to
 * float and running OpenBLAS's sgemm beats the int8 dot products: on the portable path each dot
 * unpacks the row's blocks again; the k-quants' int8 GEMM on x86 (4 tokens × 1 row) loses to
 * sgemm's float tiles from about 128 tokens on (LLaMA-1B's shapes, one thread: 1.00-1.10x sgemm
 * at 128, 0.77-0.94x at 512, 1.75-2.1x at 32; docs/decoder.md). Tiles of up to PREFILL_ROWS rows:
 * each sgemm call lays out (packs) all T rows of x again, so fewer, larger tiles pack less (256
 * rows against 64: LLaMA-1B's Q4_K layers at 512 tokens 1.08-1.10x, one thread), down to
 * PREFILL_ROWS_MIN while there are fewer than 4 tiles a thread to share out. */
enum { PREFILL_ROWS = 256, PREFILL_ROWS_MIN = 64 };

/* y = x · Wᵀ for many tokens: tiles of weight rows dequantised into a thread's scratch
 * [tile_rows, K], then sgemm over all T tokens. OpenBLAS must run single-threaded
 * (the CPU backend sets it so): the threads are these. x is first rounded as the int8 path
 * rounds it (each block to d·q, d and q as cpu_quant_activations makes them), so that both paths
 * compute the same products and differ by float summation order only: a row's result does not
 * depend on how many tokens share its step (a prompt whole or in chunks, alone or batched with
 * others), as it does not with float weights. */
static nopad_status linear_dequantized(float *y, size_t ldy, const float *x, const uint8_t *w, uint32_t type,
                                       int32_t T, int32_t K, int32_t N, int accumulate,
                                       int n_threads) {
    const size_t w_bytes = cpu_quant_row_bytes(type, K);
    int32_t tile_rows = PREFILL_ROWS;
    while (tile_rows > PREFILL_ROWS_MIN && (N + tile_rows - 1) / tile_rows < 4 * n_threads) tile_rows /= 2;
    const int32_t tiles = (N + tile_rows - 1) / tile_rows;
    const int32_t block = find_format(type)->k_quant ? QK_K : QK;
    float *xr = malloc(sizeof(float) * (size_t)T * K); /* [T, K] x rounded as the int8 path does */
    if (!xr)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY,
                               "cpu_quant_linear: %zu bytes for %d rows of rounded activations",
                               sizeof(float) * (size_t)T * K, T);
    int failed = 0;
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t b = 0; b < (int64_t)T * (K / block); b++) {
        int8_t q[QK_K];
        const float d = quantize_block(q, x + b * block, block);
        for (int32_t i = 0; i < block; i++) xr[b * block + i] = d * (float)q[i];
    }
    x = xr;
#pragma omp parallel num_threads(n_threads)
    {
        float *scratch = malloc(sizeof(float) * (size_t)tile_rows * K);
        if (!scratch) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int32_t tile = 0; tile < tiles; tile++) {
            if (!scratch) continue;
            const int32_t r0 = tile * tile_rows;
            const int32_t rows = N - r0 < tile_rows ? N - r0 : tile_rows;
            if (type == CPU_QUANT_Q4_K_R8) dequant_r8(w + w_bytes * (size_t)r0, K, rows, scratch); /* r0, rows: 8s */
            else if (type == CPU_QUANT_Q6_K_R8) dequant_r8_6(w + w_bytes * (size_t)r0, K, rows, scratch);
            else if (type == CPU_QUANT_Q4_1_R8) dequant_r8_32(w + w_bytes * (size_t)r0, K, rows, scratch, 1);
            else if (type == CPU_QUANT_Q8_0_R8) dequant_r8_32(w + w_bytes * (size_t)r0, K, rows, scratch, 0);
            else dequant_rows(type, w + w_bytes * (size_t)r0, (int64_t)rows * K, scratch);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, rows, K, 1.0f, x, K,
                        scratch, K, accumulate ? 1.0f : 0.0f, y + r0, (int)ldy);
        }
        free(scratch);
    }
    free(xr);
    if (failed)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY,
                               "cpu_quant_linear: %zu bytes a thread for %d dequantised rows of "
                               "K = %d",
                               sizeof(float) * (size_t)tile_rows * K, tile_rows, K);
    return NOPAD_OK;
}

int32_t cpu_quant_sgemm_tokens(uint32_t type, cpu_quant_isa isa) {
    const quant_format *f = find_format(type);
    if (isa == CPU_QUANT_PORTABLE) return 32;
    /* the repacked k-quants' GEMV takes 4 tokens at a time: at 512 tokens, one thread, 1.5x sgemm
     * on LLaMA-1B's Q4_K gate|up rows (145 ms against 212-221), 1.2x on its Q6_K down rows (247
     * against 296-346) */
    if (is_r8(type)) return INT32_MAX;
    return f && f->k_quant ? 128 : INT32_MAX;
}

nopad_status cpu_quant_linear_on(float *y, const float *x, const void *w, uint32_t type, int32_t T,
                                 int32_t K, int32_t N, int accumulate, int n_threads, cpu_quant_isa isa) {
    return cpu_quant_linear_ld(y, (size_t)N, x, w, type, T, K, N, accumulate, n_threads, isa);
}

nopad_status cpu_quant_linear_ld(float *y, size_t ldy, const float *x, const void *w, uint32_t type, int32_t T,
                                 int32_t K, int32_t N, int accumulate, int n_threads, cpu_quant_isa isa) {
    const quant_format *f;
    nopad_status st = check("cpu_quant_linear", type, K, &f);
    if (st == NOPAD_OK) st = check_isa("cpu_quant_linear", isa);
    if (st != NOPAD_OK) return st;
    if (T < 0 || N < 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cpu_quant_linear: T = %d tokens and N = %d rows, expected >= 0",
                               T, N);
    if (ldy < (size_t)N)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cpu_quant_linear: rows of y %zu floats apart, expected >= N = %d", ldy, N);
    if (is_r8(type) && N % 8 != 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cpu_quant_linear: %s in groups of 8 rows, N = %d is not a multiple of 8", f->name, N);
    if (T == 0 || N == 0) return NOPAD_OK;
    if (n_threads <= 0) n_threads = omp_get_max_threads();
    if (T >= cpu_quant_sgemm_tokens(type, isa))
        return linear_dequantized(y, ldy, x, w, type, T, K, N, accumulate, n_threads);
    const size_t act_bytes = cpu_quant_act_row_bytes(type, K), w_bytes = cpu_quant_row_bytes(type, K);
    const int32_t nb = K / f->block;
    /* prompts on VNNI: the activations' panels, made once here for every thread's rows */
    const int32_t groups = isa == CPU_QUANT_AVX2_VNNI && f->block == QK && !is_r8(type) ? T / 4 : 0;
    uint8_t *act = malloc(act_bytes * (size_t)T); /* malloc's alignment suits both block types */
    cpu_q8_panel *panels = groups ? malloc(sizeof(cpu_q8_panel) * (size_t)groups * nb) : NULL;
    if (!act || (groups && !panels)) {
        free(act);
        free(panels);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY,
                               "cpu_quant_linear: %zu bytes for %d rows of quantized activations",
                               act_bytes * (size_t)T + sizeof(cpu_q8_panel) * (size_t)groups * nb, T);
    }
    const int32_t tiles = (N + TILE_ROWS - 1) / TILE_ROWS;
    /* Decode's few rows of x are quantized here, before the threads start (0.1-0.3 us a row of
     * SmolLM2's 576-1536 values): in the parallel region they cost a barrier while one thread
     * quantizes and the others wait, on top of the fork and the join, and a step runs ~210 such
     * regions (docs/decoder.md). From the tokens on that the threads share, in the region. */
    const int early = T < 4 * n_threads;
    if (early)
        for (int32_t t = 0; t < T; t++)
            cpu_quant_activations_on(act + act_bytes * (size_t)t, x + (size_t)t * K, type, K, isa);
    int failed = 0;
#pragma omp parallel num_threads(n_threads) if ((int64_t)T * N * K > (1 << 18))
    {
        if (!early) {
#pragma omp for schedule(static)
            for (int32_t t = 0; t < T; t++)
                cpu_quant_activations_on(act + act_bytes * (size_t)t, x + (size_t)t * K, type, K, isa);
        }
#if HAVE_AVX2_PATH
        if (groups) { /* an omp for's barrier only where there are panels to make */
#pragma omp for schedule(static)
            for (int32_t g = 0; g < groups; g++)
                cpu_quant_pack_vnni(type, act + act_bytes * (size_t)(4 * g), act_bytes, nb, panels + (size_t)g * nb);
        }
#endif
        /* a thread's tile of weight rows as panels, 4 rows a panel */
        cpu_w_panel *scratch = groups ? malloc(sizeof(cpu_w_panel) * (TILE_ROWS / 4) * (size_t)nb) : NULL;
        if (groups && !scratch) {
#pragma omp atomic write
            failed = 1;
        }
        /* each thread a run of row tiles, each tile read from memory once for all T tokens; the
         * region's join is the only wait */
#pragma omp for schedule(static) nowait
        for (int32_t tile = 0; tile < tiles; tile++) {
            if (groups && !scratch) continue;
            const int32_t r0 = tile * TILE_ROWS, rows = N - r0 < TILE_ROWS ? N - r0 : TILE_ROWS;
            /* on panels all T tokens in one call: the tile's rows are packed once for them */
            const int32_t chunk = panels ? T : TOKEN_CHUNK;
            for (int32_t t0 = 0; t0 < T; t0 += chunk)
                gemm_on(isa, type, (const uint8_t *)w + w_bytes * (size_t)r0, w_bytes, rows,
                        act + act_bytes * (size_t)t0, act_bytes, T - t0 < chunk ? T - t0 : chunk, nb,
                        y + (size_t)t0 * ldy + r0, ldy, accumulate, panels, scratch);
        }
        free(scratch);
    }
    free(act);
    free(panels);
    if (failed)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY,
                               "cpu_quant_linear: %zu bytes a thread for %d weight rows as panels of K = %d",
                               sizeof(cpu_w_panel) * (TILE_ROWS / 4) * (size_t)nb, TILE_ROWS, K);
    return NOPAD_OK;
}

nopad_status cpu_quant_linear(float *y, const float *x, const void *w, uint32_t type, int32_t T,
                              int32_t K, int32_t N, int accumulate, int n_threads) {
    return cpu_quant_linear_on(y, x, w, type, T, K, N, accumulate, n_threads, cpu_quant_best_isa());
}

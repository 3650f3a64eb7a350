/* GGUF tensor data to float32, following ggml's block definitions (ggml-common.h) and its
 * reference dequantize_row_* (ggml-quants.c). Blocks are read byte by byte (little-endian, any
 * alignment), never through structs.
 *
 * Why the result is ggml's bit for bit on any build: every product of a quant and an fp16 scale
 * is exact in float32. An fp16 has 11 significant bits; Q8_0 multiplies it by |q| <= 128,
 * Q4_0 by |q| <= 8, Q4_1 by q <= 15, Q5_0 by |q| <= 16, Q5_1 by q <= 31, Q4_K by a scale <= 63
 * then q <= 15, Q6_K by |scale| <= 128 then |q| <= 32: 23 significant bits at most, and nothing
 * leaves float32's exponent range. So a value is rounded at most once, at Q4_1's / Q5_1's "+ m"
 * or Q4_K's "- dmin·m", whatever the order of
 * the multiplies and whether the compiler fuses a multiply-add; the code keeps ggml's order. */
#include "io/gguf_dequant.h"

#include <string.h>

#include "util/error.h"

enum { QK = 32, QK_K = 256 }; /* elements per block: the legacy formats, the k-quants */

/* ---- scalars -------------------------------------------------------------------------------- */

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float gguf_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp != 0 && exp != 0x1f) /* normal: rebias 15 -> 127 */
        return f32_from_bits(sign | (exp + 112) << 23 | man << 13);
    if (exp == 0x1f) /* inf, or NaN made quiet (bit 22) with its payload kept */
        return f32_from_bits(sign | 0x7f800000u | man << 13 | (man ? 0x400000u : 0));
    if (man == 0) return f32_from_bits(sign);
    /* subnormal: man · 2^-24 = 1.f · 2^(p-24) with p the top set bit of man */
    int p = 9;
    while (!(man >> p)) p--;
    return f32_from_bits(sign | (uint32_t)(p + 103) << 23 | (man << (23 - p) & 0x7fffffu));
}

float gguf_bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

/* ---- one type each: nb blocks (elements for the unblocked types) from src into y ------------ */

static void deq_f32(const uint8_t *src, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++, src += 4)
        y[i] = f32_from_bits((uint32_t)src[0] | (uint32_t)src[1] << 8 | (uint32_t)src[2] << 16 |
                             (uint32_t)src[3] << 24);
}

static void deq_f16(const uint8_t *src, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = gguf_fp16_to_f32(rd16(src + 2 * i));
}

static void deq_bf16(const uint8_t *src, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = gguf_bf16_to_f32(rd16(src + 2 * i));
}

/* block_q8_0, 34 bytes: fp16 d, int8 qs[32]; x = qs·d */
static void deq_q8_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 34, y += QK) {
        const float d = gguf_fp16_to_f32(rd16(b));
        for (int j = 0; j < QK; j++) y[j] = (float)(int8_t)b[2 + j] * d;
    }
}

/* block_q4_0, 18 bytes: fp16 d, qs[16]; byte j holds element j (low nibble) and j+16 (high);
 * x = (q - 8)·d */
static void deq_q4_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 18, y += QK) {
        const float d = gguf_fp16_to_f32(rd16(b));
        const uint8_t *qs = b + 2;
        for (int j = 0; j < QK / 2; j++) {
            y[j] = (float)((qs[j] & 0x0f) - 8) * d;
            y[j + QK / 2] = (float)((qs[j] >> 4) - 8) * d;
        }
    }
}

/* block_q4_1, 20 bytes: fp16 d, fp16 m, qs[16] as Q4_0; x = q·d + m */
static void deq_q4_1(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 20, y += QK) {
        const float d = gguf_fp16_to_f32(rd16(b)), m = gguf_fp16_to_f32(rd16(b + 2));
        const uint8_t *qs = b + 4;
        for (int j = 0; j < QK / 2; j++) {
            y[j] = (float)(qs[j] & 0x0f) * d + m;
            y[j + QK / 2] = (float)(qs[j] >> 4) * d + m;
        }
    }
}

/* The 32 fifth bits of Q5_0 / Q5_1 (qh, little-endian): bit e belongs to element e. */
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* block_q5_0, 22 bytes: fp16 d, qh[4], qs[16]; element j (j < 16) is qs[j]'s low nibble plus 16 ·
 * bit j of qh, element j + 16 its high nibble plus 16 · bit j + 16; x = (q - 16)·d */
static void deq_q5_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 22, y += QK) {
        const float d = gguf_fp16_to_f32(rd16(b));
        const uint32_t qh = rd32(b + 2);
        const uint8_t *qs = b + 6;
        for (int j = 0; j < QK / 2; j++) {
            y[j] = (float)((int)((qs[j] & 0x0f) | (qh >> j & 1) << 4) - 16) * d;
            y[j + QK / 2] = (float)((int)((qs[j] >> 4) | (qh >> (j + 16) & 1) << 4) - 16) * d;
        }
    }
}

/* block_q5_1, 24 bytes: fp16 d, fp16 m, qh[4], qs[16] as Q5_0; x = q·d + m */
static void deq_q5_1(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 24, y += QK) {
        const float d = gguf_fp16_to_f32(rd16(b)), m = gguf_fp16_to_f32(rd16(b + 2));
        const uint32_t qh = rd32(b + 4);
        const uint8_t *qs = b + 8;
        for (int j = 0; j < QK / 2; j++) {
            y[j] = (float)(int)((qs[j] & 0x0f) | (qh >> j & 1) << 4) * d + m;
            y[j + QK / 2] = (float)(int)((qs[j] >> 4) | (qh >> (j + 16) & 1) << 4) * d + m;
        }
    }
}

/* ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j (0..7) from the 12 bytes
 * q[0..3] = sc0..3 (low 6 bits), q[4..7] = m0..3 (low 6 bits), q[8..11] = sc4..7 (low nibble)
 * and m4..7 (high nibble), the top 2 bits of sc4..7 / m4..7 in the top bits of q[0..3] / q[4..7]. */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0f) | (q[j - 4] >> 6) << 4);
        *m = (uint8_t)((q[j + 4] >> 4) | (q[j] >> 6) << 4);
    }
}

/* block_q4_K, 144 bytes: fp16 d, fp16 dmin, scales[12], qs[128]. Eight sub-blocks of 32; qs
 * byte 32·k + l holds element 64·k + l (low nibble, sub-block 2k) and 64·k + 32 + l (high, 2k+1).
 * x = (d·sc)·q - dmin·m */
static void deq_q4_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 144) {
        const float d = gguf_fp16_to_f32(rd16(b)), dmin = gguf_fp16_to_f32(rd16(b + 2));
        const uint8_t *scales = b + 4, *q = b + 16;
        for (int k = 0; k < 4; k++, q += 32) {
            uint8_t sc, m;
            scale_min_k4(2 * k, scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            scale_min_k4(2 * k + 1, scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0x0f) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

/* block_q6_K, 210 bytes: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], fp16 d.
 * Two halves of 128; in half h, l < 32: ql[64h + l] gives elements l (low nibble) and l + 64
 * (high), ql[64h + 32 + l] elements l + 32 and l + 96, qh[32h + l] bits 0-1 / 2-3 / 4-5 / 6-7
 * the high bits of elements l / l+32 / l+64 / l+96. Element e of the half takes
 * scales[8h + e/16]. x = (d·scale)·(q - 32) */
static void deq_q6_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 210) {
        const float d = gguf_fp16_to_f32(rd16(b + 208));
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int h = 0; h < 2; h++, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4) - 32;
                const int q2 = ((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4) - 32;
                const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

/* ---- the table ------------------------------------------------------------------------------ */

typedef void (*deq_fn)(const uint8_t *src, float *y, int64_t n_blocks);

typedef struct deq_type {
    uint32_t block, size; /* elements and bytes per block */
    deq_fn fn;
} deq_type;

static const deq_type *find_type(uint32_t type) {
    static const deq_type f32 = {1, 4, deq_f32}, f16 = {1, 2, deq_f16}, bf16 = {1, 2, deq_bf16},
                          q8_0 = {QK, 34, deq_q8_0}, q4_0 = {QK, 18, deq_q4_0},
                          q4_1 = {QK, 20, deq_q4_1}, q5_0 = {QK, 22, deq_q5_0},
                          q5_1 = {QK, 24, deq_q5_1}, q4_k = {QK_K, 144, deq_q4_k},
                          q6_k = {QK_K, 210, deq_q6_k};
    switch (type) {
    case GGUF_TENSOR_F32: return &f32;
    case GGUF_TENSOR_F16: return &f16;
    case GGUF_TENSOR_BF16: return &bf16;
    case GGUF_TENSOR_Q8_0: return &q8_0;
    case GGUF_TENSOR_Q4_0: return &q4_0;
    case GGUF_TENSOR_Q4_1: return &q4_1;
    case GGUF_TENSOR_Q5_0: return &q5_0;
    case GGUF_TENSOR_Q5_1: return &q5_1;
    case GGUF_TENSOR_Q4_K: return &q4_k;
    case GGUF_TENSOR_Q6_K: return &q6_k;
    default: return NULL;
    }
}

#define SUPPORTED "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K"

static const char *type_name(uint32_t type) {
    const char *name = gguf_tensor_type_name(type);
    return name ? name : "unknown";
}

/* ---- entry points --------------------------------------------------------------------------- */

nopad_status gguf_dequantize(uint32_t type, const void *src, int64_t n, float *out) {
    const deq_type *dt = find_type(type);
    if (!dt)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "gguf_dequantize: ggml type %s (%u) cannot be converted to float32 "
                               "(supported: " SUPPORTED ")",
                               type_name(type), type);
    if (n < 0 || n % dt->block != 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "gguf_dequantize: %lld values of type %s, expected a multiple of "
                               "its block of %u",
                               (long long)n, type_name(type), dt->block);
    if (n > 0 && (!src || !out))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "gguf_dequantize: need the source bytes and an output");
    dt->fn(src, out, n / dt->block);
    return NOPAD_OK;
}

int64_t gguf_tensor_rows(const gguf_tensor *t) {
    int64_t rows = 1;
    for (int d = 1; d < GGUF_MAX_DIMS; d++) {
        if (t->dims[d] == 0) return 0;
        if (rows > INT64_MAX / t->dims[d]) rows = INT64_MAX;
        else rows *= t->dims[d];
    }
    return rows;
}

/* The checks shared by both entry points: the type, then where its bytes are. */
static nopad_status tensor_bytes(const gguf_file *f, const gguf_tensor *t, const char *fn,
                                 const deq_type **dt, const uint8_t **data) {
    if (!f || !t)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: need a file and a tensor", fn);
    const char *where = f->path ? f->path : "<gguf>";
    *dt = find_type(t->type);
    if (!*dt)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: tensor '%s' has ggml type %s (%u), which cannot be converted "
                               "to float32 (supported: " SUPPORTED ")",
                               where, t->name, type_name(t->type), t->type);
    const void *p;
    size_t nbytes;
    nopad_status st = gguf_tensor_data(f, t, &p, &nbytes);
    if (st != NOPAD_OK) return st;
    *data = p;
    return NOPAD_OK;
}

nopad_status gguf_rows_to_f32(const gguf_file *f, const gguf_tensor *t, int64_t first_row,
                              int64_t n_rows, float *out) {
    const deq_type *dt = NULL;
    const uint8_t *data = NULL;
    nopad_status st = tensor_bytes(f, t, "gguf_rows_to_f32", &dt, &data);
    if (st != NOPAD_OK) return st;
    int64_t rows = gguf_tensor_rows(t);
    if (first_row < 0 || n_rows < 0 || first_row > rows || n_rows > rows - first_row)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s: tensor '%s': rows [%lld, %lld + %lld) are out of range; it "
                               "has %lld rows of %lld values",
                               f->path ? f->path : "<gguf>", t->name, (long long)first_row,
                               (long long)first_row, (long long)n_rows, (long long)rows,
                               (long long)t->dims[0]);
    int64_t row_blocks = t->dims[0] / dt->block; /* rows are whole blocks (checked at parse) */
    if (n_rows == 0 || row_blocks == 0) return NOPAD_OK;
    if (!out)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "gguf_rows_to_f32: out is NULL");
    dt->fn(data + (size_t)(first_row * row_blocks) * dt->size, out, n_rows * row_blocks);
    return NOPAD_OK;
}

/* Blocks per OpenMP work item: about 64K values, and the whole tensor on one thread below it. */
enum { CHUNK_VALUES = 1 << 16 };

nopad_status gguf_tensor_to_f32(const gguf_file *f, const gguf_tensor *t, float *out) {
    const deq_type *dt = NULL;
    const uint8_t *data = NULL;
    nopad_status st = tensor_bytes(f, t, "gguf_tensor_to_f32", &dt, &data);
    if (st != NOPAD_OK) return st;
    int64_t nb = t->n_elements / dt->block;
    if (nb == 0) return NOPAD_OK;
    if (!out)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "gguf_tensor_to_f32: out is NULL");
    int64_t chunk = CHUNK_VALUES / dt->block; /* blocks; the block sizes divide CHUNK_VALUES */
    int64_t n_chunks = (nb + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (n_chunks > 1)
    for (int64_t c = 0; c < n_chunks; c++) {
        int64_t b0 = c * chunk, n = nb - b0 < chunk ? nb - b0 : chunk;
        dt->fn(data + (size_t)b0 * dt->size, out + b0 * dt->block, n);
    }
    return NOPAD_OK;
}

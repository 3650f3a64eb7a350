/* CPU: the op table's linear layer and embedding gather on weights kept in a GGUF block format
 * (backend.h, nopad_weight_format), on quant.c's kernels. */
#include <stdint.h>
#include <string.h>

#include "backend/cpu/cpu_embed.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/quant.h"
#include "util/error.h"

_Static_assert(sizeof(nopad_mixed_weight) <= NOPAD_MIXED_HEADER, "the mixed weight's header outgrew its bytes");
_Static_assert((int)NOPAD_WEIGHT_Q4_K_R8 == (int)CPU_QUANT_Q4_K_R8 && (int)NOPAD_WEIGHT_Q6_K_R8 == (int)CPU_QUANT_Q6_K_R8 &&
                   (int)NOPAD_WEIGHT_Q4_1_R8 == (int)CPU_QUANT_Q4_1_R8 && (int)NOPAD_WEIGHT_Q8_0_R8 == (int)CPU_QUANT_Q8_0_R8,
               "a repacked format has one number");

int cpu_runs_format(nopad_weight_format format, int32_t n_in) {
    if (format == NOPAD_WEIGHT_DTYPE) return 1;
    if (format == NOPAD_WEIGHT_MIXED) return n_in > 0; /* its parts' formats are asked on their own */
    const int32_t block = cpu_quant_block_size((uint32_t)format);
    return block > 0 && n_in > 0 && n_in % block == 0;
}

/* Q4_K, Q6_K, Q4_1 and Q8_0 are held in groups of 8 interleaved rows where the CPU runs the AVX2
 * GEMV (quant.h's CPU_QUANT_Q4_K_R8, _Q6_K_R8, _Q4_1_R8 and _Q8_0_R8: one memory stream, the 8 rows'
 * sums in one register; LLaMA-1B's shapes at one token 1.3-1.75x (Q4_K) and 1.15-1.3x (Q6_K) the
 * rows as stored; SmolLM2 Q4_1's decode and prompts 1.2x and 1.7x on one thread, docs/decoder.md),
 * Q4_K in 2.8% more bytes, the others in the same; rows not a multiple of 8, or beyond int32, stay
 * as stored. Q4_1 and Q8_0 only without VNNI: there the prompts' panel kernel (VPDPBUSD) reads the
 * rows as stored, and the repacked GEMV was not measured against it. */
nopad_weight_format cpu_packed_format(nopad_backend *be, nopad_weight_format format, int64_t rows, int64_t cols,
                                      size_t *bytes) {
    (void)be;
    const nopad_weight_format packed = format == NOPAD_WEIGHT_Q4_K   ? NOPAD_WEIGHT_Q4_K_R8
                                       : format == NOPAD_WEIGHT_Q6_K ? NOPAD_WEIGHT_Q6_K_R8
                                       : format == NOPAD_WEIGHT_Q4_1 ? NOPAD_WEIGHT_Q4_1_R8
                                       : format == NOPAD_WEIGHT_Q8_0 ? NOPAD_WEIGHT_Q8_0_R8
                                                                     : format;
    const int32_t block = cpu_quant_block_size((uint32_t)format);
    if (packed == format || rows <= 0 || rows % 8 != 0 || rows > INT32_MAX || cols <= 0 || cols % block != 0 ||
        cols > INT32_MAX || cpu_quant_best_isa() == CPU_QUANT_PORTABLE ||
        (block == CPU_QUANT_QK && cpu_quant_best_isa() != CPU_QUANT_AVX2))
        return format;
    *bytes = cpu_quant_row_bytes((uint32_t)packed, (int32_t)cols) * (size_t)rows;
    return packed;
}

nopad_status cpu_pack_q(nopad_backend *be, void *dst, const void *src, nopad_weight_format format, int64_t rows,
                        int64_t cols) {
    size_t bytes;
    const nopad_weight_format packed = cpu_packed_format(be, format, rows, cols, &bytes);
    if (packed == format)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cpu pack_q: a weight of format %d, %lld x %lld, is held as stored", (int)format,
                               (long long)rows, (long long)cols);
    return packed == NOPAD_WEIGHT_Q4_K_R8   ? cpu_quant_repack_q4_k_r8(dst, src, (int32_t)cols, (int32_t)rows)
           : packed == NOPAD_WEIGHT_Q6_K_R8 ? cpu_quant_repack_q6_k_r8(dst, src, (int32_t)cols, (int32_t)rows)
           : packed == NOPAD_WEIGHT_Q4_1_R8 ? cpu_quant_repack_q4_1_r8(dst, src, (int32_t)cols, (int32_t)rows)
                                            : cpu_quant_repack_q8_0_r8(dst, src, (int32_t)cols, (int32_t)rows);
}

nopad_status cpu_gemm_q(nopad_backend *be, void *out_, const void *x_, const void *w,
                        nopad_weight_format format, const void *bias_, const void *residual_,
                        int32_t n_tokens, int32_t n_in, int32_t n_out, nopad_epilogue epilogue,
                        nopad_activation act, int out_f32) {
    (void)out_f32; /* the CPU's dtype is float32 */
    float *out = out_;                 // [T, n_out]
    const float *x = x_;               // [T, n_in]
    const float *bias = bias_;         // [n_out]
    const float *residual = residual_; // [T, n_out]
    if (n_tokens == 0) return NOPAD_OK;
    /* a residual is added by accumulating onto it, in place: no pass over a scratch copy */
    const int accumulate = epilogue == NOPAD_EPILOGUE_BIAS_RESIDUAL;
    if (accumulate && residual != out) memcpy(out, residual, (size_t)n_tokens * n_out * sizeof(float));
    nopad_status st = NOPAD_OK;
    if (format == NOPAD_WEIGHT_MIXED) {
        /* each part's rows into its columns of out: the same floats as the part alone */
        nopad_mixed_weight h;
        memcpy(&h, w, sizeof h);
        int64_t rows = 0;
        for (uint32_t i = 0; i < h.n_parts && i < NOPAD_MIXED_PARTS; i++) rows += h.rows[i];
        if (h.n_parts < 1 || h.n_parts > NOPAD_MIXED_PARTS || rows != n_out)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "cpu gemm_q: a mixed-format weight of %u parts holds %lld rows, expected 1-%d parts "
                                   "and n_out = %d",
                                   h.n_parts, (long long)rows, NOPAD_MIXED_PARTS, n_out);
        const uint8_t *part = (const uint8_t *)w + NOPAD_MIXED_HEADER;
        int32_t row0 = 0;
        for (uint32_t i = 0; i < h.n_parts && st == NOPAD_OK; i++) {
            st = cpu_quant_linear_ld(out + row0, (size_t)n_out, x, part, h.format[i], n_tokens, n_in, h.rows[i],
                                     accumulate, cpu_threads(be), cpu_quant_best_isa());
            part += cpu_quant_row_bytes(h.format[i], n_in) * (size_t)h.rows[i];
            row0 += h.rows[i];
        }
    } else {
        st = cpu_quant_linear(out, x, w, (uint32_t)format, n_tokens, n_in, n_out, accumulate, cpu_threads(be));
    }
    if (st != NOPAD_OK) return nopad_wrap_error(st, "cpu gemm_q");
    if (epilogue == NOPAD_EPILOGUE_NONE) return NOPAD_OK;
#pragma omp parallel for num_threads(cpu_threads_for(be, n_tokens))
    for (int32_t t = 0; t < n_tokens; t++) {
        float *row = out + (size_t)t * n_out;
        if (epilogue == NOPAD_EPILOGUE_BIAS_ACT)
            for (int32_t i = 0; i < n_out; i++) row[i] = cpu_activate(row[i] + bias[i], act);
        else
            for (int32_t i = 0; i < n_out; i++) row[i] += bias[i];
    }
    return NOPAD_OK;
}

nopad_status cpu_embed_tokens_q(nopad_backend *be, float *out, const int32_t *tokens, const int32_t *feed,
                                const int32_t *positions, int32_t n_tokens, int32_t vocab_size,
                                int32_t vocab0, int32_t vocab_rows, int32_t n_positions, const void *word,
                                nopad_weight_format format, const void *pos_, int32_t dim) {
    const float *pos = pos_; // [P, dim] or NULL
    if (format == NOPAD_WEIGHT_MIXED || format == NOPAD_WEIGHT_Q4_K_R8 || format == NOPAD_WEIGHT_Q6_K_R8 ||
        format == NOPAD_WEIGHT_Q4_1_R8 || format == NOPAD_WEIGHT_Q8_0_R8 || !cpu_runs_format(format, dim))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "cpu embed_tokens_q: weight format %d with rows of %d values is not one the "
                               "CPU runs",
                               (int)format, dim);
    const size_t row_bytes = cpu_quant_row_bytes((uint32_t)format, dim);
#pragma omp parallel for num_threads(cpu_threads_for(be, n_tokens))
    for (int32_t t = 0; t < n_tokens; t++) {
        float *row = out + (size_t)t * dim;
        int32_t p;
        const int32_t local = cpu_embed_row(row, t, tokens, feed, positions, vocab_size, vocab0, vocab_rows,
                                            n_positions, pos, dim, &p);
        if (local < 0) continue;
        /* the format and dim were checked above: this cannot fail */
        cpu_quant_dequantize(row, (const uint8_t *)word + (size_t)local * row_bytes, (uint32_t)format, dim);
        if (pos)
            for (int32_t i = 0; i < dim; i++) row[i] += pos[(size_t)p * dim + i];
    }
    return NOPAD_OK;
}

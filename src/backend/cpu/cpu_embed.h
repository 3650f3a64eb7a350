/* CPU: what the two embedding gathers (cpu_embed_tokens on float tables, cpu_embed_tokens_q on
 * block-quantized ones) share: which row a packed token reads, and the rows that read none. */
#ifndef NOPAD_BACKEND_CPU_CPU_EMBED_H
#define NOPAD_BACKEND_CPU_CPU_EMBED_H

#include <math.h>
#include <stdint.h>

/* Token t's id (tokens[t], or the step before's sampled id feed[-1 - tokens[t]] where negative: it
 * was sampled after this step was packed) and position. Returns the row of this rank's table to
 * gather (id - vocab0) with *p its position, or -1 when there is none and `row` [dim] is written
 * already: NaN for an id outside [0, vocab_size) or a position outside [0, n_positions) (when pos
 * [n_positions, dim] is given), the position's row of pos (or zeros) for another rank's id. */
static inline int32_t cpu_embed_row(float *row, int32_t t, const int32_t *tokens, const int32_t *feed,
                                    const int32_t *positions, int32_t vocab_size, int32_t vocab0,
                                    int32_t vocab_rows, int32_t n_positions, const float *pos, int32_t dim,
                                    int32_t *p) {
    int32_t id = tokens[t];
    *p = positions ? positions[t] : 0;
    if (id < 0 && feed) id = feed[-1 - id];
    if (id < 0 || id >= vocab_size || (pos && (*p < 0 || *p >= n_positions))) {
        for (int32_t i = 0; i < dim; i++) row[i] = NAN;
        return -1;
    }
    if (id < vocab0 || id >= vocab0 + vocab_rows) { /* another rank's id */
        for (int32_t i = 0; i < dim; i++) row[i] = pos ? pos[(size_t)*p * dim + i] : 0.0f;
        return -1;
    }
    return id - vocab0;
}

#endif

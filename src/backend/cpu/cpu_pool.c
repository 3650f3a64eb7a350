/* CPU: pooling over each packed sequence, and L2 normalisation of rows. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "util/error.h"

nopad_status cpu_pool(nopad_backend *be, void *out_, const void *x_, const nopad_seqs *seqs,
                      int32_t dim, nopad_pooling mode) {
    float *out = out_;      // [B, dim]
    const float *x = x_;    // [T, dim]
    if (mode != NOPAD_POOLING_CLS && mode != NOPAD_POOLING_MEAN && mode != NOPAD_POOLING_MAX)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "pool: mode %d is not cls, mean or max",
                               (int)mode);
#pragma omp parallel for schedule(static) num_threads(cpu_threads_for(be, seqs->n_seqs))
    for (int32_t s = 0; s < seqs->n_seqs; s++) {
        const int32_t start = seqs->cu_seqlens[s], end = seqs->cu_seqlens[s + 1];
        float *o = out + (size_t)s * dim;
        memcpy(o, x + (size_t)start * dim, (size_t)dim * sizeof(float));
        if (mode == NOPAD_POOLING_CLS) continue;
        for (int32_t t = start + 1; t < end; t++) {
            const float *row = x + (size_t)t * dim;
            if (mode == NOPAD_POOLING_MEAN)
                for (int32_t i = 0; i < dim; i++) o[i] += row[i];
            else
                for (int32_t i = 0; i < dim; i++) o[i] = row[i] > o[i] ? row[i] : o[i];
        }
        if (mode == NOPAD_POOLING_MEAN) {
            const float inv = 1.0f / (float)(end - start);
            for (int32_t i = 0; i < dim; i++) o[i] *= inv;
        }
    }
    return NOPAD_OK;
}

nopad_status cpu_l2_normalize(nopad_backend *be, void *x_, int32_t rows, int32_t dim) {
    float *x = x_;  // [rows, dim]
#pragma omp parallel for schedule(static) num_threads(cpu_threads_for(be, rows))
    for (int32_t r = 0; r < rows; r++) {
        float *row = x + (size_t)r * dim;
        double ss = 0;
        for (int32_t i = 0; i < dim; i++) ss += (double)row[i] * row[i];
        const float inv = (float)(1.0 / fmax(sqrt(ss), 1e-12));
        for (int32_t i = 0; i < dim; i++) row[i] *= inv;
    }
    return NOPAD_OK;
}

/* CPU: the backward ops of the encoder (gemm, activation, LayerNorm, embedding, row scatter).
 * Parameter gradients are sums over tokens; each is computed by splitting the *features* across
 * threads and walking the tokens in order, so no two threads write one element and the result
 * does not depend on the thread count. Row statistics are accumulated in double, as the forward
 * LayerNorm does: the reference must not be the least accurate side of a comparison. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "backend/cpu/cpu_ops.h"
#include "util/error.h"
#include "util/philox.h"

/* [c0, c1): thread tid's share of n columns, in multiples of 16 (whole cache lines). */
static void column_share(int32_t n, int tid, int nt, int32_t *c0, int32_t *c1) {
    const int32_t per = ((n + nt - 1) / nt + 15) & ~15;
    *c0 = tid * per < n ? tid * per : n;
    *c1 = *c0 + per < n ? *c0 + per : n;
}

nopad_status cpu_zero(nopad_backend *be, void *dst, size_t bytes) {
    if (bytes) memset(dst, 0, bytes);
    return NOPAD_OK;
}

nopad_status cpu_gemm_backward(nopad_backend *be, void *dx_, float *dw, float *db, const void *dy_,
                               const void *x_, const void *w_, int32_t n_tokens, int32_t n_in,
                               int32_t n_out, int accumulate_dx) {
    float *dx = dx_;         // [T, K] or NULL
    /* dw [N, K] or NULL, db [N] or NULL */
    const float *dy = dy_;   // [T, N]
    const float *x = x_;     // [T, K]
    const float *w = w_;     // [N, K]
    if (n_tokens == 0) return NOPAD_OK; /* no rows of dx; nothing to add to dw, db */
    const float beta_dx = accumulate_dx ? 1.0f : 0.0f;
#pragma omp parallel num_threads(cpu_threads(be))
    {
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        if (dx) { /* rows of dx: dx[r0:r1] = dy[r0:r1]·w */
            const int32_t per = (n_tokens + nt - 1) / nt;
            const int32_t r0 = tid * per < n_tokens ? tid * per : n_tokens;
            const int32_t r1 = r0 + per < n_tokens ? r0 + per : n_tokens;
            if (r1 > r0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, n_in, n_out, 1.0f,
                            dy + (size_t)r0 * n_out, n_out, w, n_in, beta_dx,
                            dx + (size_t)r0 * n_in, n_in);
        }
        int32_t c0, c1; /* output features: rows of dw, entries of db */
        column_share(n_out, tid, nt, &c0, &c1);
        if (dw && c1 > c0) /* dw[c0:c1] += dy[:, c0:c1]ᵀ·x */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, n_in, n_tokens, 1.0f,
                        dy + c0, n_out, x, n_in, 1.0f, dw + (size_t)c0 * n_in, n_in);
        if (db)
            for (int32_t c = c0; c < c1; c++) {
                double sum = 0;
                for (int32_t t = 0; t < n_tokens; t++) sum += dy[(size_t)t * n_out + c];
                db[c] += (float)sum;
            }
    }
    return NOPAD_OK;
}

nopad_status cpu_activation(nopad_backend *be, void *y_, const void *x_, int32_t n_tokens,
                            int32_t dim, nopad_activation act) {
    float *y = y_;          // [T, dim]
    const float *x = x_;    // [T, dim]
    const int64_t n = (int64_t)n_tokens * dim;
#pragma omp parallel for schedule(static) num_threads(cpu_threads(be))
    for (int64_t i = 0; i < n; i++) y[i] = cpu_activate(x[i], act);
    return NOPAD_OK;
}

/* act'(x), in double: the derivative of each formula cpu_activate evaluates. */
static double activation_derivative(double x, nopad_activation act) {
    switch (act) {
    case NOPAD_ACT_GELU: /* Φ(x) + x·φ(x) */
        return 0.5 * (1.0 + erf(x * 0.70710678118654752)) +
               x * exp(-0.5 * x * x) * 0.39894228040143268; /* 1/sqrt(2π) */
    case NOPAD_ACT_GELU_TANH: {
        const double k = 0.79788456080286536, c = 0.044715;
        const double t = tanh(k * (x + c * x * x * x));
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x);
    }
    case NOPAD_ACT_RELU: return x > 0.0 ? 1.0 : 0.0;
    case NOPAD_ACT_SILU: {
        const double s = 1.0 / (1.0 + exp(-x));
        return s * (1.0 + x * (1.0 - s));
    }
    case NOPAD_ACT_TANH: {
        const double t = tanh(x);
        return 1.0 - t * t;
    }
    }
    return 1.0;
}

nopad_status cpu_activation_backward(nopad_backend *be, void *dx_, float *db, const void *dy_,
                                     const void *x_, int32_t n_tokens, int32_t dim,
                                     nopad_activation act) {
    float *dx = dx_;         // [T, dim], may alias dy
    /* db [dim] or NULL */
    const float *dy = dy_;   // [T, dim]
    const float *x = x_;     // [T, dim] pre-activation
    const int64_t n = (int64_t)n_tokens * dim;
    const int n_threads = cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(n_threads)
    for (int64_t i = 0; i < n; i++) dx[i] = (float)(dy[i] * activation_derivative(x[i], act));
    if (db) {
#pragma omp parallel num_threads(n_threads)
        {
            int32_t c0, c1;
            column_share(dim, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
            for (int32_t c = c0; c < c1; c++) {
                double sum = 0;
                for (int32_t t = 0; t < n_tokens; t++) sum += dx[(size_t)t * dim + c];
                db[c] += (float)sum;
            }
        }
    }
    return NOPAD_OK;
}

nopad_status cpu_dropout(nopad_backend *be, void *y_, const void *x_, const void *residual_,
                         const nopad_seqs *seqs, const int64_t *examples, int32_t dim, float p, uint64_t key,
                         uint32_t site) {
    float *y = y_;                 // [T, dim], may alias x
    const float *x = x_;           // [T, dim]
    const float *res = residual_;  // [T, dim] or NULL
    const int32_t *cu = seqs->cu_seqlens;
    /* keep when the 32 bits reach p·2³²: probability 1 - p up to 2⁻³² */
    const uint32_t threshold = dropout_threshold(p);
    const float scale = (float)(1.0 / (1.0 - p));
#pragma omp parallel for schedule(dynamic, 1) num_threads(cpu_threads(be))
    for (int32_t s = 0; s < seqs->n_seqs; s++) {
        const uint64_t example = examples ? (uint64_t)examples[s] : (uint64_t)s;
        for (int32_t t = cu[s]; t < cu[s + 1]; t++) {
            const size_t row = (size_t)t * dim;
            uint32_t bits[4];
            for (int32_t c = 0; c < dim; c++) {
                if ((c & 3) == 0) hidden_dropout_block(key, site, example, (uint32_t)(t - cu[s]), (uint32_t)c, bits);
                const float kept = bits[c & 3] >= threshold ? x[row + c] * scale : 0.0f;
                y[row + c] = res ? res[row + c] + kept : kept;
            }
        }
    }
    return NOPAD_OK;
}

/* mean and 1/std of each row of s [T, dim] into stats [T, 2], as cpu_layernorm_row computes them. */
static void row_stats(nopad_backend *be, float *stats, const float *s, int32_t n_tokens,
                      int32_t dim, float eps) {
#pragma omp parallel for schedule(static) num_threads(cpu_threads(be))
    for (int32_t t = 0; t < n_tokens; t++) {
        const float *row = s + (size_t)t * dim;
        double sum = 0, var = 0;
        for (int32_t i = 0; i < dim; i++) sum += row[i];
        const double mean = sum / dim;
        for (int32_t i = 0; i < dim; i++) var += (row[i] - mean) * (row[i] - mean);
        stats[2 * t] = (float)mean;
        stats[2 * t + 1] = (float)(1.0 / sqrt(var / dim + eps));
    }
}

/* The LayerNorm backward once the row statistics are known: dw, db (feature-parallel), then ds
 * row by row (in place over dy is safe: a row's sums are taken before it is overwritten), then
 * dbias. */
static void layernorm_backward_rows(nopad_backend *be, float *ds, float *dw, float *db,
                                    float *dbias, const float *dy, const float *s,
                                    const float *stats, const float *w, int32_t n_tokens,
                                    int32_t dim) {
    const int n_threads = cpu_threads(be);
#pragma omp parallel num_threads(n_threads)
    {
        int32_t c0, c1;
        column_share(dim, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
        for (int32_t c = c0; c < c1; c++) {
            double sum_w = 0, sum_b = 0;
            for (int32_t t = 0; t < n_tokens; t++) {
                const size_t i = (size_t)t * dim + c;
                sum_w += (double)dy[i] * ((s[i] - stats[2 * t]) * stats[2 * t + 1]);
                sum_b += dy[i];
            }
            if (dw) dw[c] += (float)sum_w;
            if (db) db[c] += (float)sum_b;
        }
    }
#pragma omp parallel for schedule(static) num_threads(n_threads)
    for (int32_t t = 0; t < n_tokens; t++) {
        /* ds = rstd·(g - mean(g) - ŝ·mean(g·ŝ)) with g = dy ⊙ w, ŝ the normalised row */
        const float *dy_row = dy + (size_t)t * dim, *s_row = s + (size_t)t * dim;
        const double mean = stats[2 * t], rstd = stats[2 * t + 1];
        double sum_g = 0, sum_gs = 0;
        for (int32_t i = 0; i < dim; i++) {
            const double g = (double)dy_row[i] * w[i];
            sum_g += g;
            sum_gs += g * ((s_row[i] - mean) * rstd);
        }
        const double mean_g = sum_g / dim, mean_gs = sum_gs / dim;
        float *ds_row = ds + (size_t)t * dim;
        for (int32_t i = 0; i < dim; i++) {
            const double g = (double)dy_row[i] * w[i];
            ds_row[i] = (float)(rstd * (g - mean_g - (s_row[i] - mean) * rstd * mean_gs));
        }
    }
    if (dbias) {
#pragma omp parallel num_threads(n_threads)
        {
            int32_t c0, c1;
            column_share(dim, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
            for (int32_t c = c0; c < c1; c++) {
                double sum = 0;
                for (int32_t t = 0; t < n_tokens; t++) sum += ds[(size_t)t * dim + c];
                dbias[c] += (float)sum;
            }
        }
    }
}

nopad_status cpu_layernorm_backward(nopad_backend *be, void *ds, float *dw, float *db, float *dbias,
                                    const void *dy, const void *s, const void *w, float eps,
                                    int32_t n_tokens, int32_t dim) {
    if (n_tokens == 0) return NOPAD_OK;
    float *stats = malloc((size_t)n_tokens * 2 * sizeof(float)); // [T, 2] mean, 1/std
    if (!stats) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cpu layernorm backward: no scratch memory");
    row_stats(be, stats, s, n_tokens, dim, eps);
    layernorm_backward_rows(be, ds, dw, db, dbias, dy, s, stats, w, n_tokens, dim);
    free(stats);
    return NOPAD_OK;
}

nopad_status cpu_embed_backward(nopad_backend *be, float *d_word, float *d_pos, float *d_type,
                                float *d_ln_w, float *d_ln_b, void *dy_, const int32_t *tokens,
                                const int32_t *types, const nopad_seqs *seqs,
                                int32_t position_offset, const void *word_, const void *pos_,
                                const void *type_, const void *ln_weight, float eps,
                                int32_t dim) {
    /* d_word [V, E], d_pos [P, E], d_type [TV, E] or NULL */
    float *dy = dy_;                                               // [T, E], becomes ds
    const float *word = word_, *pos = pos_, *type = type_;
    const int32_t n_tokens = seqs->n_tokens;
    if (n_tokens == 0) return NOPAD_OK;
    float *sum = malloc((size_t)n_tokens * dim * sizeof(float));   // [T, E] the recomputed sum
    float *stats = malloc((size_t)n_tokens * 2 * sizeof(float));   // [T, 2]
    int32_t *position = malloc((size_t)n_tokens * sizeof(int32_t)); // [T] each token's row of pos
    if (!sum || !stats || !position) {
        free(sum), free(stats), free(position);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cpu embed backward: no scratch memory");
    }
    const int n_threads = cpu_threads(be);
    for (int32_t s = 0; s < seqs->n_seqs; s++)
        for (int32_t t = seqs->cu_seqlens[s]; t < seqs->cu_seqlens[s + 1]; t++)
            position[t] = position_offset + t - seqs->cu_seqlens[s];
#pragma omp parallel for schedule(static) num_threads(n_threads)
    for (int32_t t = 0; t < n_tokens; t++) {
        float *row = sum + (size_t)t * dim;
        const float *wr = word + (size_t)tokens[t] * dim, *pr = pos + (size_t)position[t] * dim;
        for (int32_t i = 0; i < dim; i++) row[i] = wr[i] + pr[i];
        if (type) {
            const float *tr = type + (size_t)(types ? types[t] : 0) * dim;
            for (int32_t i = 0; i < dim; i++) row[i] += tr[i];
        }
    }
    row_stats(be, stats, sum, n_tokens, dim, eps);
    layernorm_backward_rows(be, dy, d_ln_w, d_ln_b, NULL, dy, sum, stats, ln_weight, n_tokens, dim);
    /* Scatter-add: tokens repeat, so features are split across threads and tokens walked in order. */
#pragma omp parallel num_threads(n_threads)
    {
        int32_t c0, c1;
        column_share(dim, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
        for (int32_t t = 0; t < n_tokens; t++) {
            const float *g = dy + (size_t)t * dim;
            float *wr = d_word + (size_t)tokens[t] * dim, *pr = d_pos + (size_t)position[t] * dim;
            float *tr = d_type ? d_type + (size_t)(types ? types[t] : 0) * dim : NULL;
            for (int32_t i = c0; i < c1; i++) {
                wr[i] += g[i];
                pr[i] += g[i];
                if (tr) tr[i] += g[i];
            }
        }
    }
    free(sum), free(stats), free(position);
    return NOPAD_OK;
}

nopad_status cpu_scatter_add_rows(nopad_backend *be, void *x_, const int32_t *rows,
                                  const void *src_, int32_t n, int32_t dim) {
    float *x = x_;            // [*, dim]
    const float *src = src_;  // [n, dim]
#pragma omp parallel num_threads(cpu_threads(be))
    {
        int32_t c0, c1;
        column_share(dim, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
        for (int32_t i = 0; i < n; i++)
            for (int32_t c = c0; c < c1; c++) x[(size_t)rows[i] * dim + c] += src[(size_t)i * dim + c];
    }
    return NOPAD_OK;
}

nopad_status cpu_select_rows(nopad_backend *be, void *out_, const void *x_, const int32_t *rows,
                             int32_t n, int32_t dim) {
    float *out = out_;       // [n, dim]
    const float *x = x_;     // [*, dim]
#pragma omp parallel for schedule(static) num_threads(cpu_threads(be))
    for (int32_t i = 0; i < n; i++)
        memcpy(out + (size_t)i * dim, x + (size_t)rows[i] * dim, (size_t)dim * sizeof(float));
    return NOPAD_OK;
}

/* CPU: the decoder ops of the op table (float32), the reference the CUDA ones are tested against:
 * token embedding, LayerNorm / RMSNorm into a new buffer (alone or after a residual add), rotary
 * embeddings with the paged KV store, SwiGLU, and the row gather for the LM head; the causal
 * attention over the paged KV store is cpu_attention_paged.c's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_embed.h"
#include "backend/cpu/cpu_ops.h"

nopad_status cpu_embed_tokens(nopad_backend *be, float *out_, const int32_t *tokens, const int32_t *feed,
                              const int32_t *positions, int32_t n_tokens, int32_t vocab_size,
                              int32_t vocab0, int32_t vocab_rows, int32_t n_positions,
                              const void *word_, const void *pos_, int32_t dim) {
    float *out = out_;              // [T, dim]
    const float *word = word_;      // [vocab_rows, dim]: ids vocab0 ..
    const float *pos = pos_;        // [P, dim] or NULL
#pragma omp parallel for num_threads(cpu_threads_for(be, n_tokens))
    for (int32_t t = 0; t < n_tokens; t++) {
        float *row = out + (size_t)t * dim;
        int32_t p;
        const int32_t local = cpu_embed_row(row, t, tokens, feed, positions, vocab_size, vocab0, vocab_rows,
                                            n_positions, pos, dim, &p);
        if (local < 0) continue;
        const float *w = word + (size_t)local * dim;
        if (pos) {
            const float *pr = pos + (size_t)p * dim;
            for (int32_t i = 0; i < dim; i++) row[i] = w[i] + pr[i];
        } else {
            memcpy(row, w, (size_t)dim * sizeof(float));
        }
    }
    return NOPAD_OK;
}

nopad_status cpu_norm(nopad_backend *be, void *out_, const float *x_, const void *w_, const void *b_,
                      float eps, int32_t n_tokens, int32_t dim, int rms) {
    float *out = out_;
    const float *x = x_, *w = w_, *b = b_;
#pragma omp parallel for num_threads(cpu_threads_for(be, n_tokens))
    for (int32_t t = 0; t < n_tokens; t++) {
        const float *xr = x + (size_t)t * dim;
        float *yr = out + (size_t)t * dim;
        if (!rms) {
            cpu_layernorm_row(yr, xr, w, b, eps, dim);
            continue;
        }
        /* as HF's LlamaRMSNorm: the mean of squares in float32, then x · rsqrt(ms + eps) · w */
        double ss = 0.0;
        for (int32_t i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        const float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
        for (int32_t i = 0; i < dim; i++) yr[i] = w[i] * (xr[i] * inv);
    }
    return NOPAD_OK;
}

/* Rotary embeddings in place on the Q and K heads (rope_kv_store's first half). */
static void rope_in_place(nopad_backend *be, float *qkv /* [T, H + 2·KVH, D] */,
                          const int32_t *positions, int32_t n_tokens, int32_t n_heads,
                          int32_t n_kv_heads, int32_t head_size, const float *inv_freq) {
    const int32_t half = head_size / 2, rotated = n_heads + n_kv_heads;
    const size_t row = (size_t)(n_heads + 2 * n_kv_heads) * head_size;
#pragma omp parallel for num_threads(cpu_threads_for(be, n_tokens))
    for (int32_t t = 0; t < n_tokens; t++) {
        const float p = (float)positions[t];
        for (int32_t i = 0; i < half; i++) {
            /* HF: freqs = inv_freq · position in float32, then cos / sin in float32 */
            const float angle = p * inv_freq[i];
            const float c = cosf(angle), s = sinf(angle);
            for (int32_t h = 0; h < rotated; h++) {
                float *x = qkv + (size_t)t * row + (size_t)h * head_size;
                const float a = x[i], b = x[i + half];
                x[i] = a * c - b * s;
                x[i + half] = b * c + a * s;
            }
        }
    }
}

nopad_status cpu_rope_kv_store(nopad_backend *be, void *qkv_, void *k_cache_, void *v_cache_,
                               const int32_t *positions, const int32_t *slots, int32_t n_tokens,
                               int32_t n_heads, int32_t n_kv_heads, int32_t head_size,
                               const float *inv_freq) {
    float *k_cache = k_cache_, *v_cache = v_cache_; // [slots, KVH, D]
    float *qkv = qkv_;                              // [T, H + 2·KVH, D]
    if (inv_freq) rope_in_place(be, qkv, positions, n_tokens, n_heads, n_kv_heads, head_size, inv_freq);
    const size_t kv = (size_t)n_kv_heads * head_size;
    const size_t row = (size_t)(n_heads + 2 * n_kv_heads) * head_size;
    for (int32_t t = 0; t < n_tokens; t++) {
        const float *k = qkv + (size_t)t * row + (size_t)n_heads * head_size;
        memcpy(k_cache + (size_t)slots[t] * kv, k, kv * sizeof(float));
        memcpy(v_cache + (size_t)slots[t] * kv, k + kv, kv * sizeof(float));
    }
    return NOPAD_OK;
}

nopad_status cpu_swiglu(nopad_backend *be, void *out_, const void *gate_up_, int32_t n_tokens,
                        int32_t dim) {
    float *out = out_;               // [T, F]
    const float *gate_up = gate_up_; // [T, 2F]: gate | up
#pragma omp parallel for num_threads(cpu_threads_for(be, n_tokens))
    for (int32_t t = 0; t < n_tokens; t++) {
        const float *g = gate_up + (size_t)t * 2 * dim, *u = g + dim;
        float *o = out + (size_t)t * dim;
        for (int32_t i = 0; i < dim; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
    return NOPAD_OK;
}

nopad_status cpu_residual_add(nopad_backend *be, float *h, const void *x_, int32_t n_tokens,
                              int32_t dim) {
    const float *x = x_;
    const size_t n = (size_t)n_tokens * dim;
#pragma omp parallel for num_threads(cpu_threads_for(be, n_tokens))
    for (size_t i = 0; i < n; i++) h[i] += x[i];
    return NOPAD_OK;
}

nopad_status cpu_add_norm(nopad_backend *be, void *out, float *h, const void *x, const void *w,
                          const void *b, float eps, int32_t n_tokens, int32_t dim, int rms) {
    nopad_status st = cpu_residual_add(be, h, x, n_tokens, dim);
    return st == NOPAD_OK ? cpu_norm(be, out, h, w, b, eps, n_tokens, dim, rms) : st;
}

nopad_status cpu_gather_rows(nopad_backend *be, float *out_, const float *x_, const int32_t *rows,
                             int32_t n, int32_t dim) {
    float *out = out_;
    const float *x = x_;
    for (int32_t i = 0; i < n; i++)
        memcpy(out + (size_t)i * dim, x + (size_t)rows[i] * dim, (size_t)dim * sizeof(float));
    return NOPAD_OK;
}

nopad_status cpu_row_argmax(nopad_backend *be, float *best, const float *x, int32_t rows, int32_t cols,
                            int32_t ld, int32_t id0) {
#pragma omp parallel for num_threads(cpu_threads_for(be, rows))
    for (int32_t r = 0; r < rows; r++) {
        const float *row = x + (size_t)r * ld; // [cols]
        float *out = best + (size_t)r * 3;
        float top = -INFINITY;
        int32_t at = -1, bad = 0;
        for (int32_t j = 0; j < cols; j++) {
            const float v = row[j];
            bad |= (v != v) | (v == INFINITY);
            if (v > top) top = v, at = j;
        }
        if (bad) {
            out[0] = NAN, out[1] = -1.0f, out[2] = 0.0f;
            continue;
        }
        double z = 0.0; /* in double as sample_token sums it: a float32 sum drifts ~1e-4 at 150k ids */
        if (at >= 0)
            for (int32_t j = 0; j < cols; j++) z += exp((double)row[j] - top);
        out[0] = top;
        out[1] = at >= 0 ? (float)(id0 + at) : -1.0f;
        out[2] = (float)z;
    }
    return NOPAD_OK;
}

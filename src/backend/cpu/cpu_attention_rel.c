/* CPU: DeBERTa's disentangled attention on packed QKV (the reference for every backend). Each
 * (sequence, head) is one task, as in cpu_attention.c. The relative terms come from two small
 * GEMMs per task against the rows of the position tables the sequence can reach,
 * c2p[i, r] = q_i·pos_key[r] and p2c[j, r] = k_j·pos_query[r] ([len, n_r], n_r <= min(2·len - 1,
 * 2k)), gathered into each score as it is computed: no [len, len] bias is stored. (Three dot
 * products per score instead made DeBERTa-v3-base's forward 1.8x BERT-base's on 2 threads.) */
#include <math.h>
#include <stdlib.h>

#include <cblas.h>

#include "backend/cpu/cpu_ops.h"
#include "util/error.h"

static float dot(const float *a, const float *b, int32_t n) {
    float s = 0.0f;
    for (int32_t d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

nopad_status cpu_attention_rel(nopad_backend *be, void *out_, const void *qkv_,
                               const nopad_seqs *seqs, int32_t n_heads, int32_t head_size,
                               float scale, const void *pos_key_, const void *pos_query_,
                               const nopad_rel_positions *rel) {
    float *out = out_;                   // [T, n_heads * head_size]
    const float *qkv = qkv_;             // [T, 3, n_heads, head_size]
    const float *pos_key = pos_key_;     // [2k, n_heads * head_size] or NULL (no c2p)
    const float *pos_query = pos_query_; // [2k, n_heads * head_size] or NULL (no p2c)
    const int32_t hidden = n_heads * head_size, span = rel->att_span;
    const size_t row_stride = (size_t)3 * hidden;
    const int32_t max_len = seqs->max_seqlen > 0 ? seqs->max_seqlen : 1;
    const int64_t n_tasks = (int64_t)seqs->n_seqs * n_heads;
    if (span < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "attention_rel: att_span %d, need >= 1", span);
    /* the most table rows one sequence reaches: one per distance, at most the whole table */
    const int32_t max_rows = 2 * max_len - 1 < 2 * span ? 2 * max_len - 1 : 2 * span;
    int failed = 0;

#pragma omp parallel num_threads(cpu_threads(be))
    {
        /* scores[max_len] for one query row; row_of[2·max_len - 1]: the table row of each
         * relative distance i - j in [-(max_len - 1), max_len - 1] (non-decreasing in it, as the
         * bucket is); c2p, p2c [max_len, max_rows] */
        float *scores = malloc((size_t)max_len * sizeof(float));
        int32_t *row_of = malloc((size_t)(2 * max_len - 1) * sizeof(int32_t));
        float *c2p = malloc((size_t)max_len * max_rows * sizeof(float));
        float *p2c = malloc((size_t)max_len * max_rows * sizeof(float));
        const int ok = scores && row_of && c2p && p2c;
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
        if (ok) {
            for (int32_t d = -(max_len - 1); d <= max_len - 1; d++) {
                int32_t r = nopad_rel_bucket(d, rel) + span;
                row_of[d + max_len - 1] = r < 0 ? 0 : r > 2 * span - 1 ? 2 * span - 1 : r;
            }
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n_tasks; task++) {
            if (!ok) continue;
            const int32_t s = (int32_t)(task / n_heads), h = (int32_t)(task % n_heads);
            const int32_t start = seqs->cu_seqlens[s];
            const int32_t len = seqs->cu_seqlens[s + 1] - start;
            const float *q_base = qkv + (size_t)start * row_stride + (size_t)h * head_size;
            const float *k_base = q_base + hidden;
            const float *v_base = q_base + 2 * hidden;
            // the table rows this sequence reaches: r_lo .. r_lo + n_r - 1
            const int32_t r_lo = row_of[max_len - len], n_r = row_of[max_len + len - 2] - r_lo + 1;
            // c2p[i, r] = q_i · pos_key[r_lo + r], p2c[j, r] = k_j · pos_query[r_lo + r]  [len, n_r]
            if (pos_key)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, len, n_r, head_size, 1.0f, q_base,
                            (int)row_stride, pos_key + (size_t)r_lo * hidden + (size_t)h * head_size, hidden,
                            0.0f, c2p, n_r);
            if (pos_query)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, len, n_r, head_size, 1.0f, k_base,
                            (int)row_stride, pos_query + (size_t)r_lo * hidden + (size_t)h * head_size, hidden,
                            0.0f, p2c, n_r);
            for (int32_t i = 0; i < len; i++) {
                const float *q = q_base + (size_t)i * row_stride;
                float max_score = -INFINITY;
                for (int32_t j = 0; j < len; j++) {
                    const float *k = k_base + (size_t)j * row_stride;
                    const size_t r = (size_t)(row_of[i - j + max_len - 1] - r_lo);
                    float score = dot(q, k, head_size);
                    if (pos_key) score += c2p[(size_t)i * n_r + r];   // content -> position
                    if (pos_query) score += p2c[(size_t)j * n_r + r]; // position -> content
                    scores[j] = score * scale;
                    if (scores[j] > max_score) max_score = scores[j];
                }
                float sum = 0.0f;
                for (int32_t j = 0; j < len; j++) {
                    scores[j] = expf(scores[j] - max_score);
                    sum += scores[j];
                }
                const float inv_sum = 1.0f / sum;
                float *o = out + (size_t)(start + i) * hidden + (size_t)h * head_size;
                for (int32_t d = 0; d < head_size; d++) o[d] = 0.0f;
                for (int32_t j = 0; j < len; j++) {
                    const float p = scores[j] * inv_sum;
                    const float *v = v_base + (size_t)j * row_stride;
                    for (int32_t d = 0; d < head_size; d++) o[d] += p * v[d];
                }
            }
        }
        free(scores);
        free(row_of);
        free(c2p);
        free(p2c);
    }
    if (failed) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cpu attention_rel: no scratch memory");
    return NOPAD_OK;
}

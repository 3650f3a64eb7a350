/* CPU: varlen attention for training — the forward that also keeps each query row's
 * log-sum-exp, and the backward that recomputes the probabilities from it (FlashAttention-2's
 * scheme, without the tiling: one task per (sequence, head), one query row at a time). A task
 * owns the dK and dV rows of its sequence and head, so tasks never write the same element and
 * nothing is padded. With dropout (nopad_attention_dropout) each probability's mask comes from
 * its own Philox counter, in the forward and again in the backward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "util/error.h"
#include "util/philox.h"

/* The attention's dropout (backend.h, nopad_attention_dropout) as the loops apply it. */
typedef struct {
    int on;
    uint32_t threshold; /* keep when the bits reach p·2³² */
    double scale;       /* 1 / (1 - p) */
    uint64_t key;
    uint32_t site;
    const int64_t *examples; /* [B] or NULL: sequence s is example s */
} dropout_rule;

static dropout_rule dropout_rule_of(const nopad_attention_dropout *drop) {
    dropout_rule r = {0, 0, 1.0, 0, 0, NULL};
    if (drop && drop->p > 0) {
        r.on = 1;
        r.threshold = dropout_threshold(drop->p);
        r.scale = 1.0 / (1.0 - (double)drop->p);
        r.key = drop->key;
        r.site = drop->site;
        r.examples = drop->examples;
    }
    return r;
}

/* Z_ij of sequence s: 1/(1 - p) for a kept probability, 0 for a dropped one. */
static double dropout_factor(const dropout_rule *r, int32_t head, int32_t s, int32_t i, int32_t j) {
    const uint64_t example = r->examples ? (uint64_t)r->examples[s] : (uint64_t)s;
    return attention_dropout_bits(r->key, r->site, (uint32_t)head, example, (uint32_t)i, (uint32_t)j) >=
                   r->threshold
               ? r->scale
               : 0.0;
}

nopad_status cpu_attention_lse(nopad_backend *be, void *out_, float *lse, const void *qkv_,
                               const nopad_seqs *seqs, int32_t n_heads, int32_t head_size,
                               float scale, int causal, const nopad_attention_dropout *drop) {
    float *out = out_;        // [T, n_heads * head_size]
    const float *qkv = qkv_;  // [T, 3, n_heads, head_size]
    // lse [T, n_heads]
    const int32_t hidden = n_heads * head_size;
    const size_t row_stride = (size_t)3 * hidden;
    const int64_t n_tasks = (int64_t)seqs->n_seqs * n_heads;
    nopad_status st = nopad_attention_dropout_check("cpu attention", drop);
    if (st != NOPAD_OK) return st;
    const dropout_rule dr = dropout_rule_of(drop);
    int failed = 0;
#pragma omp parallel num_threads(cpu_threads(be))
    {
        double *p = malloc((size_t)(seqs->max_seqlen > 0 ? seqs->max_seqlen : 1) * sizeof *p); // [len]
        if (!p) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n_tasks; task++) {
            if (!p) continue;
            const int32_t s = (int32_t)(task / n_heads), h = (int32_t)(task % n_heads);
            const int32_t start = seqs->cu_seqlens[s], len = seqs->cu_seqlens[s + 1] - start;
            const float *q_base = qkv + (size_t)start * row_stride + (size_t)h * head_size;
            const float *k_base = q_base + hidden, *v_base = q_base + 2 * hidden;
            for (int32_t i = 0; i < len; i++) {
                const float *q = q_base + (size_t)i * row_stride;
                const int32_t n_keys = causal ? i + 1 : len;
                double max_score = -INFINITY, sum = 0;
                for (int32_t j = 0; j < n_keys; j++) {
                    const float *k = k_base + (size_t)j * row_stride;
                    double dot = 0;
                    for (int32_t d = 0; d < head_size; d++) dot += (double)q[d] * k[d];
                    p[j] = dot * scale;
                    if (p[j] > max_score) max_score = p[j];
                }
                for (int32_t j = 0; j < n_keys; j++) sum += (p[j] = exp(p[j] - max_score));
                lse[(size_t)(start + i) * n_heads + h] = (float)(max_score + log(sum));
                if (dr.on) /* the normaliser stays the undropped one */
                    for (int32_t j = 0; j < n_keys; j++) p[j] *= dropout_factor(&dr, h, s, i, j);
                float *o = out + (size_t)(start + i) * hidden + (size_t)h * head_size;
                for (int32_t d = 0; d < head_size; d++) {
                    double acc = 0;
                    for (int32_t j = 0; j < n_keys; j++) acc += p[j] * v_base[(size_t)j * row_stride + d];
                    o[d] = (float)(acc / sum);
                }
            }
        }
        free(p);
    }
    if (failed) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cpu attention_lse: no scratch memory");
    return NOPAD_OK;
}

nopad_status cpu_attention_backward(nopad_backend *be, void *dqkv_, const void *dout_,
                                    const void *qkv_, const void *out_, const float *lse,
                                    const nopad_seqs *seqs, int32_t n_heads, int32_t head_size,
                                    float scale, int causal, const nopad_attention_dropout *drop) {
    float *dqkv = dqkv_;        // [T, 3, n_heads, head_size]
    const float *dout = dout_;  // [T, n_heads * head_size]
    const float *qkv = qkv_;    // [T, 3, n_heads, head_size]
    const float *out = out_;    // [T, n_heads * head_size]
    // lse [T, n_heads]
    const int32_t hidden = n_heads * head_size;
    const size_t row_stride = (size_t)3 * hidden;
    const int64_t n_tasks = (int64_t)seqs->n_seqs * n_heads;
    nopad_status st = nopad_attention_dropout_check("cpu attention", drop);
    if (st != NOPAD_OK) return st;
    const dropout_rule dr = dropout_rule_of(drop);
    int failed = 0;
#pragma omp parallel num_threads(cpu_threads(be))
    {
        const size_t max_len = (size_t)(seqs->max_seqlen > 0 ? seqs->max_seqlen : 1);
        double *dq_acc = malloc((size_t)head_size * sizeof *dq_acc); // [head_size] row i's dq
        double *dk = malloc(max_len * head_size * sizeof *dk);       // [len, head_size]
        double *dv = malloc(max_len * head_size * sizeof *dv);       // [len, head_size]
        if (!dq_acc || !dk || !dv) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n_tasks; task++) {
            if (!dq_acc || !dk || !dv) continue; /* this thread's scratch failed: reported below */
            const int32_t s = (int32_t)(task / n_heads), h = (int32_t)(task % n_heads);
            const int32_t start = seqs->cu_seqlens[s], len = seqs->cu_seqlens[s + 1] - start;
            const size_t head = (size_t)h * head_size;
            const float *q_base = qkv + (size_t)start * row_stride + head;
            const float *k_base = q_base + hidden, *v_base = q_base + 2 * hidden;
            memset(dk, 0, (size_t)len * head_size * sizeof *dk);
            memset(dv, 0, (size_t)len * head_size * sizeof *dv);
            for (int32_t i = 0; i < len; i++) {
                const float *q = q_base + (size_t)i * row_stride;
                const float *do_i = dout + (size_t)(start + i) * hidden + head;
                const float *o_i = out + (size_t)(start + i) * hidden + head;
                const double row_lse = lse[(size_t)(start + i) * n_heads + h];
                const int32_t n_keys = causal ? i + 1 : len;
                double D = 0; /* Σ_j P_ij·dP_ij, = dout_i·out_i */
                for (int32_t d = 0; d < head_size; d++) D += (double)do_i[d] * o_i[d];
                float *dq = dqkv + (size_t)(start + i) * row_stride + head;
                for (int32_t d = 0; d < head_size; d++) dq_acc[d] = 0;
                for (int32_t j = 0; j < n_keys; j++) {
                    const float *k = k_base + (size_t)j * row_stride;
                    const float *v = v_base + (size_t)j * row_stride;
                    double dot = 0, dp = 0;
                    for (int32_t d = 0; d < head_size; d++) {
                        dot += (double)q[d] * k[d];
                        dp += (double)do_i[d] * v[d];
                    }
                    const double p = exp(dot * scale - row_lse); /* P_ij */
                    const double z = dr.on ? dropout_factor(&dr, h, s, i, j) : 1.0; /* Z_ij */
                    const double ds = p * (dp * z - D) * scale;  /* dS_ij, with dq's and dk's scale */
                    for (int32_t d = 0; d < head_size; d++) {
                        dq_acc[d] += ds * k[d];
                        dk[(size_t)j * head_size + d] += ds * q[d];
                        dv[(size_t)j * head_size + d] += p * z * do_i[d];
                    }
                }
                for (int32_t d = 0; d < head_size; d++) dq[d] = (float)dq_acc[d];
            }
            for (int32_t j = 0; j < len; j++) {
                float *dk_row = dqkv + (size_t)(start + j) * row_stride + hidden + head;
                float *dv_row = dk_row + hidden;
                for (int32_t d = 0; d < head_size; d++) {
                    dk_row[d] = (float)dk[(size_t)j * head_size + d];
                    dv_row[d] = (float)dv[(size_t)j * head_size + d];
                }
            }
        }
        free(dq_acc), free(dk), free(dv);
    }
    if (failed) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cpu attention backward: no scratch memory");
    return NOPAD_OK;
}

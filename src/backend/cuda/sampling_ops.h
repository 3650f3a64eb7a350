/* C launchers of the CUDA sampler (sampling.cu): sample_token of src/model/sampling.c for many
 * rows of logits on the GPU, so that a decode step sends back only the chosen ids; and of the
 * greedy choice over a share of the vocabulary that tensor-parallel ranks merge (row_argmax.cu). */
#ifndef NOPAD_BACKEND_CUDA_SAMPLING_OPS_H
#define NOPAD_BACKEND_CUDA_SAMPLING_OPS_H

#include <stdint.h>

#include "nopad.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One row's sampling request, as the kernel reads it (device memory, uploaded by the caller).
 * Zero in the fields from presence_penalty on means off. */
typedef struct cuda_sample_row {
    float temperature, top_p, min_p, repetition_penalty;
    float presence_penalty, frequency_penalty;
    int32_t top_k;
    int32_t history_start, history_len; /* the row's ids in `history` (penalties); the last
                                           min(step, history_len) of them are its output */
    int32_t bias_start, bias_len;       /* the row's logit_bias pairs in `biases` */
    int32_t mask_index;                 /* 0: every id allowed; k > 0: the row's allowed ids are
                                           masks' k-th bitmap (from 1) of (vocab + 31) / 32 words,
                                           bit t of word t / 32 */
    uint64_t seed, step;                /* the draw: sampling_uniform(seed, step) */
} cuda_sample_row;

/* For each of n rows of logits [n, vocab] (device, float32; modified in place, used as scratch):
 * ids[r] = the id sample_token (src/model/sampling.c) would choose for row r with these params
 * after its mask set the refused ids to -inf, logprobs[r] (may be NULL) its log-probability
 * exactly as sample_token defines out_logprob, and with n_top > 0 (at most
 * NOPAD_MAX_TOP_LOGPROBS) top_ids / top_logprobs [n, n_top] what sampling_top_logprobs gives
 * after that call. rows[n], history, biases and masks are device memory (each may be NULL when
 * no row names it). One CTA per row. A row with NaN / +inf logits (after its mask), or all -inf,
 * gets id -1 (the host then reports the error); so does a row whose params sampling_check
 * refuses or whose history or logit_bias holds an id outside [0, vocab). No host
 * synchronisation; enqueued on stream. Vocabs up to 1.1 million ids. */
nopad_status cuda_sample_rows(float *logits, int32_t n, int32_t vocab, const cuda_sample_row *rows,
                              const int32_t *history, const nopad_logit_bias *biases, const uint32_t *masks,
                              int32_t *ids, float *logprobs, int32_t n_top, int32_t *top_ids, float *top_logprobs,
                              void *stream);

/* row_argmax of backend.h: best[rows, 3] (device) = {max, id0 + its lowest column, Σ expf(x - max)}
 * of each row of x[rows, ld] (device, float32, its first cols columns); a row holding NaN or +inf
 * gives {NaN, -1, 0}, one of -inf only (or cols 0) {-inf, -1, 0}. The sum is taken in double and
 * rounded once. One CTA per row; no host synchronisation, no allocation (a graph may record it);
 * enqueued on stream. */
nopad_status cuda_row_argmax(float *best, const float *x, int32_t rows, int32_t cols, int32_t ld,
                             int32_t id0, void *stream);

/* greedy_merge_begin's kernel (backend.h): ids[r] (device) = the greedy choice of row r from the
 * ranks' row_argmax triples best[parts, n, 3] (device), as sampling_merge_greedy (model/sampling.h)
 * chooses it, logprobs[r] (device, may be NULL) its log-probability; -1 (and NaN) for a row with a
 * NaN part or only -inf parts. No host synchronisation; enqueued on stream. */
nopad_status cuda_greedy_merge(const float *best, int32_t parts, int32_t n, int32_t *ids, float *logprobs,
                               void *stream);

#ifdef __cplusplus
}
#endif
#endif

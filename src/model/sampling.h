/* Sampling: the next token of one sequence from its logits on the host: logit_bias, then in
 * Hugging Face's order (transformers' generate with do_sample=True) the repetition penalty, vLLM's
 * frequency and presence penalties (OpenAI's definitions, over the generated ids only), then
 * temperature, top-k, top-p, min-p, then a draw from the softmax of what remains; temperature 0 is
 * the argmax. (A constraint's mask comes before all of it: its caller sets the refused logits to
 * -inf.)
 *
 * Ties, where HF leaves the order to torch:
 *   - top-k keeps every id whose logit equals the k-th largest, as HF's TopKLogitsWarper does
 *     (it removes `scores < topk(scores, k)[..., -1]`, so all ties at the k-th value stay);
 *   - top-p ranks equal logits by id, the lower id first (kept first), where HF's unstable
 *     torch.sort leaves it open;
 *   - greedy takes the lowest id among equal maxima.
 * Probabilities are computed in double from the fp32 logits; HF works in fp32, so a set can differ
 * only where a top-p or min-p boundary falls within fp32 rounding of a probability.
 *
 * The draw is a pure function of (seed, step): sampling_uniform below, the step-th output of
 * SplitMix64 started from a mixed seed. The same request therefore gives the same tokens alone or
 * batched with others, on any thread, in any order of calls. The uniform u picks, in id order
 * over the kept ids, the first id whose cumulative weight exceeds u x the total (inverse CDF). */
#ifndef NOPAD_MODEL_SAMPLING_H
#define NOPAD_MODEL_SAMPLING_H

#include <stdint.h>

#include "nopad.h"

/* What a sample_token call drew from, for sampling_top_logprobs: the processed logits x (the
 * scratch's) and the ids the filters kept (the scratch's ids[0, n_kept) in id order; n_kept -1:
 * every id of finite logit, greedy). A kept id's log-probability is -(xmax - x[i]) · inv_t - log_z. */
typedef struct sampler_last_draw {
    int32_t vocab;     // 0: no successful call yet
    int32_t n_kept;
    float xmax;
    double inv_t;      // 1 / temperature; 1 for greedy
    double log_z;
} sampler_last_draw;

/* Per-call buffers sized to the vocab, reused: after the first call at the largest vocab a call
 * allocates nothing. One scratch serves one thread at a time; between calls it holds its buffers
 * and what the last call drew from (the processed logits and `last`). */
typedef struct sampler_scratch {
    float *logits;    // [capacity] the call's logits after logit_bias and the penalties
    double *weight;   // [capacity] exp((logit - max) / temperature) of the candidates, by id
    int32_t *ids;     // [capacity] the candidate ids, in id order
    uint64_t *keys;   // [capacity] top-p's sort keys: logit descending, then id ascending
    float *heap;      // [capacity] top-k's min-heap of the k largest logits
    uint8_t *seen;    // [capacity] repetition-penalty marks, all zero between calls
    int32_t *counts;  // [capacity] frequency-penalty counts, all zero between calls
    int32_t capacity; // ids the buffers hold
    int32_t n_allocs; // times the buffers were allocated (tests check reuse)
    sampler_last_draw last;
} sampler_scratch;

void sampler_scratch_init(sampler_scratch *s);
void sampler_scratch_free(sampler_scratch *s);

/* NOPAD_ERR_INVALID_ARGUMENT naming the field and its allowed range for a temperature that is
 * NaN, negative or infinite, top_k < 0, top_p outside (0, 1], min_p outside [0, 1), a
 * repetition penalty that is not a finite number > 0, presence or frequency penalties outside
 * [-2, 2], or a logit_bias that is NULL with entries, longer than NOPAD_MAX_LOGIT_BIAS, holds a
 * negative or repeated id or a bias outside [-100, 100] (ids past the vocab: sample_token). */
nopad_status sampling_check(const nopad_sampling_params *p);

/* sampling_check, then the logit_bias ids against a vocab of `vocab` ids. */
nopad_status sampling_check_vocab(const nopad_sampling_params *p, int32_t vocab);

/* A uniform double in [0, 1) with 53 random bits, a pure function of (seed, step). */
double sampling_uniform(uint64_t seed, uint64_t step);

/* Chooses the next id from `logits` [vocab] (fp32, host, not modified). `history` [n_history]
 * holds the ids of the prompt and of everything generated so far (may be NULL when n_history is
 * 0); the repetition penalty applies once to each distinct id in it. `step` is the index of the
 * token in the sequence's output, the draw's counter: the last min(step, n_history) ids of
 * history are the output, which the presence and frequency penalties count. `out_logprob` (may be
 * NULL) receives the log-probability of the chosen id under the final distribution; for greedy,
 * under the processed logits at temperature 1. NaN or +inf logits, logits all -inf, history or
 * logit_bias ids outside the vocab are NOPAD_ERR_INVALID_ARGUMENT. */
nopad_status sample_token(sampler_scratch *s, const float *logits, int32_t vocab,
                          const nopad_sampling_params *p, const int32_t *history,
                          int32_t n_history, uint64_t step, int32_t *out_id, float *out_logprob);

/* The n (>= 0) most likely ids of the distribution the last successful sample_token call on `s`
 * drew from, most likely first (the processed logits ranked descending, ties by the lower id; -inf
 * logits last), into ids[n], and their log-probabilities into logprobs[n]: under that call's
 * final distribution (its out_logprob for the chosen id), -inf for an id its filters dropped or
 * whose logit is -inf. Past the vocab: id -1, -inf. NOPAD_ERR_INVALID_ARGUMENT without such a
 * call. O(vocab) for n up to NOPAD_MAX_TOP_LOGPROBS. */
nopad_status sampling_top_logprobs(const sampler_scratch *s, int32_t n, int32_t *ids, float *logprobs);

/* The greedy choice of row r of a split model from its ranks' row_argmax triples (backend.h):
 * best[parts, n, 3] (host) holds part k's {max, id, exp-sum} of row r at best + (k * n + r) * 3.
 * The largest max wins, the lowest part on ties (parts hold ids in order, so the lowest id wins,
 * as in sample_token); *out_logprob (may be NULL) = -log Σ_k sum_k · exp(max_k - max), the sum in
 * double. A part holding NaN / +inf, or every part -inf, is NOPAD_ERR_INVALID_ARGUMENT. The CUDA
 * merge (greedy_merge_begin) computes the same. */
nopad_status sampling_merge_greedy(const float *best, int32_t parts, int32_t n, int32_t r, int32_t *out_id,
                                   float *out_logprob);

#endif

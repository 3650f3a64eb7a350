/* C launchers of the CUDA training kernels of the elementwise, normalisation and loss family
 * (elementwise.cu, norm_backward.cu, loss.cu), called by the op-table adapters in ops.c; backend.h
 * (section "training") says what each op computes. Tensors are device pointers of `dtype` (F16 or
 * BF16) unless their name ends in 32 (float32); every launcher enqueues on `stream` (a
 * cudaStream_t) and returns without waiting, so a training step can be captured in a CUDA graph.
 *
 * Column sums over tokens (the gradients of biases and LayerNorm parameters) are deterministic:
 * the first kernel gives each block a fixed set of rows and writes the block's float32 partial
 * sums into `partial32`, then a second kernel adds the partials in block order onto the gradient.
 * partial32 holds the number of floats the matching *_scratch_floats query gives; that number
 * depends on the width and the device only, not on the token count, so a buffer grown on a step's
 * first run serves every later step. */
#ifndef NOPAD_BACKEND_CUDA_TRAIN_KERNELS_H
#define NOPAD_BACKEND_CUDA_TRAIN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The widest row layernorm_backward and embed_backward take: a warp holds a row of up to 1024 in
 * registers; wider rows go to a block each (256 threads, up to 16 columns a thread). */
enum { CUDA_TRAIN_NORM_MAX_DIM = 4096 };

/* ---- elementwise.cu ---- */

/* y[n] = act(x) (y may alias x). */
nopad_status cuda_train_activation(nopad_dtype dtype, void *y, const void *x, int64_t n,
                                   nopad_activation act, void *stream);

size_t cuda_train_activation_backward_scratch_floats(int32_t dim);
/* dx[T, dim] = dy ⊙ act'(x) (dx may alias dy); db32[dim] += Σ_t dx when db32 is not NULL (then
 * partial32 is the scratch). */
nopad_status cuda_train_activation_backward(nopad_dtype dtype, void *dx, float *db32, const void *dy,
                                            const void *x, int32_t n_tokens, int32_t dim,
                                            nopad_activation act, float *partial32, void *stream);

/* The dropout op of backend.h on [n_tokens, dim] rows: y[t, c] = x[t, c] / (1 - p) where
 * hidden_dropout_bits(key, site, examples[s], t - cu_seqlens[s], c) >= p·2³² (t in sequence s;
 * examples NULL: s), else 0, plus residual[t, c] when residual is not NULL (y may alias x): the
 * CPU's mask bit for bit (util/philox.h is compiled for the device too). */
nopad_status cuda_train_dropout(nopad_dtype dtype, void *y, const void *x, const void *residual,
                                const int32_t *cu_seqlens, int32_t n_seqs, const int64_t *examples,
                                int32_t n_tokens, int32_t dim, float p, uint64_t key, uint32_t site, void *stream);

/* out[n, dim] = x[rows[i], :]. */
nopad_status cuda_train_select_rows(nopad_dtype dtype, void *out, const void *x, const int32_t *rows,
                                    int32_t n, int32_t dim, void *stream);

/* x[rows[i], :] += src[i, :] for i < n; rows may repeat (a repeated row gets its sources added in
 * order, in float32, and is rounded once: the result does not depend on scheduling). */
nopad_status cuda_train_scatter_add_rows(nopad_dtype dtype, void *x, const int32_t *rows, const void *src,
                                         int32_t n, int32_t dim, void *stream);

/* ---- norm_backward.cu (dim <= CUDA_TRAIN_NORM_MAX_DIM) ---- */

size_t cuda_train_layernorm_backward_scratch_floats(int32_t dim);
/* ds[T, dim] = ∂L/∂s of y = LN(s)·w + b given dy (ds may alias dy); dw32 += Σ_t dy ⊙ ŝ,
 * db32 += Σ_t dy, dbias32 += Σ_t ds (each may be NULL). */
nopad_status cuda_train_layernorm_backward(nopad_dtype dtype, void *ds, float *dw32, float *db32,
                                           float *dbias32, const void *dy, const void *s, const void *w,
                                           float eps, int32_t n_tokens, int32_t dim, float *partial32,
                                           void *stream);

size_t cuda_train_embed_backward_scratch_floats(int32_t dim);
/* The embedding's backward: s = word[tokens] + pos[offset + t - start(seq)] (+ type[types])
 * recomputed, dy [T, dim] overwritten with ∂L/∂s through the LayerNorm (d_ln_w32, d_ln_b32 +=, in
 * fixed order), then ∂L/∂s scatter-added into d_word32 [V, dim], d_pos32 [P, dim] and d_type32
 * [TV, dim] with float32 atomics (d_pos32 / d_type32 NULL or pos / type NULL: skipped). */
nopad_status cuda_train_embed_backward(nopad_dtype dtype, float *d_word32, float *d_pos32, float *d_type32,
                                       float *d_ln_w32, float *d_ln_b32, void *dy, const int32_t *tokens,
                                       const int32_t *types, const int32_t *cu_seqlens, int32_t n_seqs,
                                       int32_t n_tokens, int32_t position_offset, const void *word,
                                       const void *pos, const void *type, const void *ln_weight, float eps,
                                       int32_t dim, float *partial32, void *stream);

/* ---- loss.cu ---- */

/* losses32[n] = logsumexp(row) - row[label], dlogits [n, classes] = (softmax(row) -
 * onehot(label))·grad_scale (dlogits may alias logits); one block per row. */
nopad_status cuda_train_cross_entropy(nopad_dtype dtype, float *losses32, void *dlogits, const void *logits,
                                      const int32_t *labels, int32_t n, int32_t classes, float grad_scale,
                                      void *stream);

/* losses32[n] = (pred - target32)², dpred[n] = 2·(pred - target32)·grad_scale (dpred may alias pred). */
nopad_status cuda_train_squared_error(nopad_dtype dtype, float *losses32, void *dpred, const void *pred,
                                      const float *target32, int32_t n, float grad_scale, void *stream);

/* ---- shared by the column sums (elementwise.cu) ---- */

/* out[v][c] += Σ_b partial32[(b·n_vec + v)·dim + c] for b < n_blocks, in order of b, for each of
 * the n_vec (<= 3) vectors whose out[v] is not NULL. */
nopad_status cuda_train_column_finish(float *const out[3], const float *partial32, int32_t n_blocks,
                                      int32_t n_vec, int32_t dim, void *stream);

#ifdef __cplusplus
}
#endif
#endif

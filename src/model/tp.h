/* Tensor parallelism (Megatron's layout): which part of every split tensor this rank holds.
 *
 *   QKV, gate|up, an encoder's FFN-in: split by output rows (columns of the activation): each rank
 *       computes its heads / its slice of the intermediate activation, with no communication.
 *   O, down, an encoder's FFN-out: split by input columns: each rank's product is a partial sum,
 *       and one all-reduce per sub-layer makes it whole; the bias is added once (rank 0 holds it).
 *   A decoder's embedding and LM head: split by vocabulary rows. A rank's embedding gives zero rows
 *       for ids it does not hold, and the all-reduce after it puts each token's row together; its LM
 *       head gives the logits of its ids, which are gathered for sampling.
 *   Norms and everything else: whole on every rank (the residual stream is replicated), except in
 *       a sequence-parallel forward (below), where each rank holds a block of rows.
 *
 * Heads: each rank holds heads / size query heads. Key/value heads are split the same way when
 * size divides them, and replicated when size is a multiple of them (rank r then holds the one
 * key/value head its query heads read). */
#ifndef NOPAD_MODEL_TP_H
#define NOPAD_MODEL_TP_H

#include <stdint.h>

#include "io/model_config.h"
#include "nopad.h"
#include "parallel/comm.h"

typedef struct tp_shard {
    nopad_comm *comm;          /* the group; NULL when nothing is split (size 1; NOPAD_COMM_FORCE
                                  keeps a group of one, whose collectives still run) */
    int32_t rank, size;
    int32_t heads, head0;      /* query heads held, the first one's global index */
    int32_t kv_heads, kv_head0;/* key/value heads held, the first one's global index */
    int32_t ffn, ffn0;         /* intermediate columns held, the first one's global index */
    int32_t vocab_stride;      /* ceil(V / size): rank r holds ids [r · stride, ...) */
    int32_t vocab0, vocab_rows;/* ids [vocab0, vocab0 + vocab_rows) held (the last rank may hold
                                  fewer than the stride) */
    int32_t seq_min_tokens;    /* forwards of at least this many rows run sequence-parallel
                                  (tp_seq_plan); 0: none. NOPAD_TP_SEQUENCE_PARALLEL=1 gives size
                                  (a loaded model's ranks take rank 0's: model.c) */
} tp_shard;

/* The shard of `rank` of `size` for cfg; size 1 holds everything. A size that does not divide the
 * query heads, the key/value heads (nor is a multiple of them) or the intermediate size is
 * NOPAD_ERR_INVALID_ARGUMENT naming the sizes that would work. comm may be NULL (planning only). */
nopad_status tp_shard_plan(const model_config *cfg, nopad_comm *comm, int32_t rank, int32_t size,
                           tp_shard *out);

/* ---- sequence parallelism: the residual stream split by rows ---------------------------------
 *
 * In a forward of T rows that takes it (tp_seq_plan), rank r holds rows [row0, row0 + rows) of the
 * residual stream and of its norms, at their own places in the [T, hidden] buffers, inside its chunk
 * [row0, row0 + chunk), chunk = ceil(T / size): every rank's chunk has the same count, as the
 * collectives need, and the last chunks run past T into padding rows that nothing reads back (a
 * rank may hold none: T = 5 over 4 ranks gives 2, 2, 1, 0). So the buffers the seams below touch
 * hold size · chunk <= T + size - 1 rows. Per layer, in place of the all-reduce after O and down:
 *   - O, down (split by rows): tp_linear_rs, the partial products reduce-scattered to the rows'
 *     owners; the residual add and the next norm on the rank's rows only;
 *   - QKV, gate|up (split by columns): tp_ag_linear, the normed rows all-gathered, then the GEMM
 *     on all T rows for the rank's heads / columns.
 * Attention, RoPE, the KV cache and cu_seqlens see all T rows, as without it. The communication is
 * the all-reduce's, in two halves that the fused kernels can hide in the GEMMs' tiles. */
typedef struct tp_seq {
    int32_t chunk; /* ceil(T / size) rows a rank */
    int32_t row0;  /* rank · chunk: this rank's first row */
    int32_t rows;  /* rows of [row0, row0 + chunk) below T: the ones this rank computes */
} tp_seq;

/* 1, with *out, when a forward of T rows runs sequence-parallel (a group, and T >= seq_min_tokens);
 * else 0. The caller keeps decode steps out: they are few rows, and recorded in CUDA graphs. */
int tp_seq_plan(const tp_shard *tp, int32_t T, tp_seq *out);

/* out[T, N] = epilogue(x[T, K] · wᵀ) on this rank's shard, for a weight in the backend's dtype
 * (gemm) or a block format (gemm_q). No communication. */
nopad_status tp_linear(nopad_backend *be, void *out, const void *x, const void *w, nopad_weight_format format,
                       const void *bias, int32_t T, int32_t K, int32_t N, nopad_epilogue epilogue,
                       nopad_activation act);

/* The column-split GEMM of a sequence-parallel forward: x [size · chunk, K] in the backend's dtype
 * holds this rank's rows at [row0, row0 + chunk) (the norm wrote them there); the other ranks'
 * chunks are all-gathered into place, then out[T, N] = tp_linear(x[T, K]). */
nopad_status tp_ag_linear(nopad_backend *be, const tp_shard *tp, const tp_seq *sq, void *out, void *x,
                          const void *w, nopad_weight_format format, const void *bias, int32_t T, int32_t K,
                          int32_t N, nopad_epilogue epilogue, nopad_activation act);

/* The row-split GEMM of a sequence-parallel forward: out [size · chunk, N] in the backend's dtype
 * gets this rank's partial products tp_linear(x[T, K]) in its first T rows, reduce-scattered:
 * rows [row0, row0 + chunk) of out then hold the sum over the ranks (the rest is scratch). */
nopad_status tp_linear_rs(nopad_backend *be, const tp_shard *tp, const tp_seq *sq, void *out, const void *x,
                          const void *w, nopad_weight_format format, const void *bias, int32_t T, int32_t K,
                          int32_t N, nopad_epilogue epilogue, nopad_activation act);

#endif

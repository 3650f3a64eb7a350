/* Tensor parallelism (Megatron's layout): which part of every split tensor this rank holds.
 *
 *   QKV, gate|up, an encoder's FFN-in: split by output rows (columns of the activation): each rank
 *       computes its heads / its slice of the intermediate activation, with no communication.
 *   O, down, an encoder's FFN-out: split by input columns: each rank's product is a partial sum,
 *       and one all-reduce per sub-layer makes it whole; the bias is added once (rank 0 holds it).
 *   A decoder's embedding and LM head: split by vocabulary rows. A rank's embedding gives zero rows
 *       for ids it does not hold, and the all-reduce after it puts each token's row together; its LM
 *       head gives the logits of its ids, which are gathered for sampling.
 *   Norms and everything else: whole on every rank (the residual stream is replicated).
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
} tp_shard;

/* The shard of `rank` of `size` for cfg; size 1 holds everything. A size that does not divide the
 * query heads, the key/value heads (nor is a multiple of them) or the intermediate size is
 * NOPAD_ERR_INVALID_ARGUMENT naming the sizes that would work. comm may be NULL (planning only). */
nopad_status tp_shard_plan(const model_config *cfg, nopad_comm *comm, int32_t rank, int32_t size,
                           tp_shard *out);

#endif

/* C entry point of the CUDA attention_rel op (deberta/attention_rel.cu): DeBERTa's disentangled
 * attention on packed QKV. The backend (cuda_backend.c) owns the scratch and the bucket table. */
#ifndef NOPAD_BACKEND_CUDA_DEBERTA_ATTENTION_REL_H
#define NOPAD_BACKEND_CUDA_DEBERTA_ATTENTION_REL_H

#include <stddef.h>
#include <stdint.h>

#include "nopad.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuda_attention_rel_args {
    void *out;                  /* [T, heads·D] */
    const void *qkv;            /* [T, 3, heads, D] */
    const int32_t *cu_seqlens;  /* [n_seqs + 1], device */
    int32_t n_seqs, n_tokens, max_seqlen, n_heads, head_size;
    float scale;
    const void *pos_key;        /* [2k, heads·D] or NULL (no c2p) */
    const void *pos_query;      /* [2k, heads·D] or NULL (no p2c) */
    const int32_t *rows;        /* [2·sat + 1], device: table row of distance d at rows[d + sat] */
    int32_t sat;                /* rows are constant past ±sat */
    int32_t r_lo, W;            /* table rows r_lo .. r_lo + W - 1 are the ones max_seqlen reaches */
    float *c2p, *p2c;           /* scratch, cuda_attention_rel_term_bytes each (16-byte aligned), NULL
                                 * with their table: [T, heads, W] float32 for the generic head sizes;
                                 * unused (0 bytes) for 32/64/128, whose kernel computes the terms
                                 * inside its tiles */
} cuda_attention_rel_args;

/* The bytes of one term's scratch (c2p or p2c) for this shape, a multiple of 16 (0: none needed). */
size_t cuda_attention_rel_term_bytes(int32_t n_tokens, int32_t n_heads, int32_t head_size, int32_t W);

/* Enqueues the attention on `stream`. Head sizes 1..128 (32/64/128: one fused tensor-core kernel;
 * others: the projections into the scratch, then a warp per query row); NOPAD_ERR_UNSUPPORTED
 * otherwise. qkv, out and the tables 16-byte aligned. No host synchronisation. */
nopad_status cuda_attention_rel(nopad_dtype dtype, const cuda_attention_rel_args *args, void *stream);

#ifdef __cplusplus
}
#endif
#endif

/* The CPU's paged attention (the op table's attention_paged): its tiles and the kernels that run
 * them, portable C and AVX2 + FMA, chosen at run time.
 *
 * A task is one sequence, one KV head, a tile of CPU_ATTN_LANES query rows and a segment of their
 * keys, a row being a (new token, query head of that KV head's group) pair: the heads of a group and the tile's tokens
 * share every K and V row they load. The kernels hold the tile transposed, a vector lane per row
 * ([D][LANES]), so Q·Kᵀ and P·V are broadcast multiply-adds across the rows with no horizontal
 * sums, and the softmax (max, exp, sum) runs lane-wise too. Keys come in chunks of CPU_ATTN_KEYS
 * with an online softmax (FlashAttention's): the scores are a [KEYS][LANES] tile, whatever the
 * history's length. Q is scaled by scale·log2(e) once, so the softmax takes powers of two. */
#ifndef NOPAD_BACKEND_CPU_ATTENTION_PAGED_H
#define NOPAD_BACKEND_CPU_ATTENTION_PAGED_H

#include "backend/backend.h"
#include "backend/cpu/quant.h"

#define CPU_ATTN_LANES 16 /* query rows of a tile: two AVX2 vectors */
#define CPU_ATTN_NARROW 8 /* a tile of at most 8 rows (a decode step's group of heads) takes 8 lanes */
#define CPU_ATTN_KEYS 32  /* keys of a chunk */
/* A task reads at most one segment of a tile's keys, [s · SEGMENT, (s + 1) · SEGMENT); a tile whose
 * keys span several merges its segments' sums after. So long histories give a step's threads work
 * even when it has few tiles (one sequence's decode: as many tiles as KV heads). The bounds are
 * fixed positions: a row's arithmetic does not depend on the rows that share its step. 512: a
 * prompt of up to 512 tokens is not split (256 cost a 512-token prompt 9%, 512 a 1024-token one
 * 4%). */
#define CPU_ATTN_SEGMENT 512

/* One chunk of n_keys (1 .. CPU_ATTN_KEYS) keys for a tile of `lanes` lanes (CPU_ATTN_LANES or
 * CPU_ATTN_NARROW). qt [D][lanes]: the rows' queries, scaled; k[j], v[j]: key j's rows of D
 * floats. pos [lanes]: each row's position, key0 + j beyond it is masked; NULL when no key of the
 * chunk is beyond any row's. m, l [lanes]: the running max (log2 units; -inf while every key so
 * far was masked for the row) and sum of the rows' weights, updated; ot [D][lanes]: the running
 * Σ weight · v, rescaled and accumulated. p: scratch [KEYS][lanes]. */
typedef void cpu_attention_chunk_fn(int32_t lanes, const float *qt, const float *const *k, const float *const *v,
                                    int32_t n_keys, int32_t D, const int32_t *pos, int32_t key0, float *p, float *m,
                                    float *l, float *ot);
cpu_attention_chunk_fn cpu_attention_chunk_avx2;

/* 2^x for x <= 0 (and -inf: 0, NaN: NaN), the kernels' exponential: n = round(x), a degree-6
 * polynomial fitted to 2^f on [-1/2, 1/2] (relative error 1.9e-9 in exact arithmetic, 1.1e-7 in
 * float), times 2^n through the exponent bits; below 2^-125 it is 0, so masked keys weigh nothing.
 * y[i] = 2^x[i] on the ISA's path, for the test of that bound. */
#define CPU_ATTN_EXP2_LOWEST -125.0f
#define CPU_ATTN_EXP2_C1 6.931471825e-01f
#define CPU_ATTN_EXP2_C2 2.402264625e-01f
#define CPU_ATTN_EXP2_C3 5.550328642e-02f
#define CPU_ATTN_EXP2_C4 9.618489072e-03f
#define CPU_ATTN_EXP2_C5 1.339993090e-03f
#define CPU_ATTN_EXP2_C6 1.534581097e-04f
void cpu_attention_exp2_on(cpu_quant_isa isa, float *y, const float *x, int32_t n);
void cpu_attention_exp2_avx2(float *y, const float *x, int32_t n);

/* cpu_attention_paged on a chosen path (cpu_quant_best_isa's answer: AVX2 on either x86 path),
 * so the test runs every path this CPU has. */
nopad_status cpu_attention_paged_on(cpu_quant_isa isa, nopad_backend *be, void *out, const void *qkv,
                                    const void *k_cache, const void *v_cache, const nopad_kv_batch *kv,
                                    int32_t n_heads, int32_t n_kv_heads, int32_t head_size, float scale);

#endif

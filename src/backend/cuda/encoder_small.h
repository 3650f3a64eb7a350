/* The whole encoder stack in one kernel for batches of at most 32 tokens.
 *
 * At 26 tokens a BERT-base layer is seven kernels (qkv GEMM, attention, attention-out GEMM,
 * LayerNorm, FFN-in GEMM, FFN-out GEMM, LayerNorm), each bound by its latency: a launch, a fetch
 * of its weights, a few microseconds of dependent loads, a drain (bench/NOTES_enc_small.md).
 * This kernel runs every layer in one cooperative launch: one CTA per SM, the phases of a layer
 * separated by grid-wide barriers instead of kernel boundaries, the LayerNorms folded into the
 * GEMMs that read their output (each CTA takes the row statistics itself), and each CTA's weight
 * slices of the layer prefetched into L2 while the phases before them run.
 * encoder_small.cu says how each phase divides its work.
 *
 * Same contract as the backend's encoder_layers op (backend.h) and the same arithmetic as the
 * layer loop of src/model/encoder.c with the skinny GEMMs, except where a rounding differs:
 * the pre-LayerNorm sums are stored rounded to the dtype (the loop's LayerNorm kernel adds them
 * in fp32). Requires T <= 32, hidden <= 1024 with hidden % 32 == 0, head size 32 or 64,
 * intermediate % 32 == 0, at most CUDA_ENCODER_SMALL_MAX_STEPS layers, 16-byte aligned buffers
 * and weights, and a device that can launch one cooperative CTA per SM. */
#ifndef NOPAD_BACKEND_CUDA_ENCODER_SMALL_H
#define NOPAD_BACKEND_CUDA_ENCODER_SMALL_H

#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { CUDA_ENCODER_SMALL_MAX_T = 32, CUDA_ENCODER_SMALL_MAX_STEPS = 32 };

/* Whether the kernel takes this shape (no data looked at). */
int cuda_encoder_small_supported(int32_t n_tokens, int32_t n_steps, int32_t hidden, int32_t n_heads,
                                 int32_t head_size, int32_t intermediate);

/* Whether the backend's encoder_layers op takes it: supported and switched on
 * (NOPAD_ENCODER_SMALL, read at the first call, or cuda_encoder_small_set_mode). */
int cuda_encoder_small_takes(int32_t n_tokens, int32_t n_steps, int32_t hidden, int32_t n_heads,
                             int32_t head_size, int32_t intermediate);

/* 1: on, 0: off (for tests and A/B runs; overrides NOPAD_ENCODER_SMALL); -1: as
 * NOPAD_ENCODER_SMALL says again. */
void cuda_encoder_small_set_mode(int mode);

/* How many times the kernel was launched (or recorded into a graph) in this process: tests
 * check that the path they mean to test was taken. */
long cuda_encoder_small_launches(void);

/* For the last launch that has finished: CTA 0's SM cycles of work in each phase (from the end of
 * the barrier before, or the kernel's start, to its arrival at the barrier after) and of waiting
 * at that barrier, phase by phase (five a layer); in GEMM phases also the cycles from the phase's
 * start to its GEMM's start, to the end of its K loop and to the end of its epilogue (0 in the
 * attention phase). Returns how many phases it wrote (a diagnostic: one thread of one CTA reads
 * its clock). */
int cuda_encoder_small_phase_cycles(long long *work, long long *wait, long long (*gemm)[3], int max_phases);

/* hidden [T, hidden] in and out; cu_seqlens [n_seqs + 1] in device memory (tokens past
 * cu_seqlens[n_seqs], the slack rows of a graph recorded for a bucket, belong to no sequence:
 * they attend to nothing and nothing attends to them). act: a nopad_activation. */
nopad_status cuda_encoder_small(nopad_dtype dtype, void *hidden, const encoder_layer *const *schedule,
                                int32_t n_steps, const int32_t *cu_seqlens, int32_t n_seqs, int32_t n_tokens,
                                int32_t hidden_size, int32_t n_heads, int32_t head_size, int32_t intermediate,
                                float eps, float scale, int act, void *qkv, void *context, void *sums,
                                void *ffn, void *stream);

#ifdef __cplusplus
}
#endif

#endif

/* CPU linear layers on GGUF block-quantized weights, kept as stored: Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1 (blocks of 32), Q4_K, Q5_K, Q6_K (super-blocks of 256). Block layouts as ggml-common.h (and
 * io/gguf_dequant.c, the float reference).
 *
 * A row of float activations is quantized once to int8 blocks (as llama.cpp's q8_0 / q8_K): a
 * float scale d = max|x| / 127 per block and x_i ≈ d·q_i, |q_i| <= 127. A weight row times such
 * a row is then integer sums per (sub-)block, scaled once per block in float. The only error
 * beyond float rounding is the activations' rounding: at most d/2 = max|x|_block / 254 per
 * element.
 *
 * Two paths give the same integers: portable C (quant.c) and AVX2 (quant_avx2.c, compiled per
 * function for AVX2 + FMA + F16C and chosen at run time). Their float sums over blocks may be
 * ordered differently: they agree to float rounding, exactly when every product is exact. */
#ifndef NOPAD_BACKEND_CPU_QUANT_H
#define NOPAD_BACKEND_CPU_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "nopad.h"

/* ggml type ids (the file's numbering), as io/gguf.h's. */
enum {
    CPU_QUANT_Q4_0 = 2,
    CPU_QUANT_Q4_1 = 3,
    CPU_QUANT_Q5_0 = 6,
    CPU_QUANT_Q5_1 = 7,
    CPU_QUANT_Q8_0 = 8,
    CPU_QUANT_Q4_K = 12,
    CPU_QUANT_Q5_K = 13,
    CPU_QUANT_Q6_K = 14,
    /* Q4_K repacked at load, 8 rows interleaved (no file holds it): backend.h's
     * NOPAD_WEIGHT_Q4_K_R8, below */
    CPU_QUANT_Q4_K_R8 = 258,
    CPU_QUANT_Q6_K_R8 = 259, /* Q6_K likewise: NOPAD_WEIGHT_Q6_K_R8 */
    CPU_QUANT_Q4_1_R8 = 260, /* Q4_1 likewise: NOPAD_WEIGHT_Q4_1_R8 */
    CPU_QUANT_Q8_0_R8 = 261, /* Q8_0 likewise: NOPAD_WEIGHT_Q8_0_R8 */
};

enum { CPU_QUANT_QK = 32, CPU_QUANT_QK_K = 256 }; /* elements per block / per super-block */

/* The activations for the formats of 32 values: `sum` (Σ qs) lets Q4_1's and Q5_1's offset m
 * be applied once per block (Σ (d_w·q + m)·a = d_w·Σ q·a + m·Σ a), as Q4_0's 8 and Q5_0's 16. */
typedef struct cpu_q8_block {
    float d;
    int32_t sum;
    int8_t qs[CPU_QUANT_QK];
} cpu_q8_block;

/* The activations for the k-quants: 256 values, `bsums[j]` = Σ qs[16j .. 16j+15] (Q4_K / Q5_K
 * subtract their mins per 32, Q6_K its offset of 32 per 16, from these). */
typedef struct cpu_q8k_block {
    float d;
    int16_t bsums[CPU_QUANT_QK_K / 16];
    int8_t qs[CPU_QUANT_QK_K];
} cpu_q8k_block;

typedef enum cpu_quant_isa {
    CPU_QUANT_PORTABLE,   /* plain C, any CPU */
    CPU_QUANT_AVX2,       /* x86-64 with AVX2, FMA and F16C */
    CPU_QUANT_AVX2_VNNI,  /* and AVX512VNNI + AVX512VL: VPDPBUSD on 256-bit vectors */
} cpu_quant_isa;

/* The fastest path this CPU runs. */
cpu_quant_isa cpu_quant_best_isa(void);

/* Elements per block of `type` (32 or 256), 0 when it is not one of the eight formats. */
int32_t cpu_quant_block_size(uint32_t type);

/* Bytes of one weight row of K values (K a multiple of the block), as stored in the file. */
size_t cpu_quant_row_bytes(uint32_t type, int32_t K);

/* Bytes of one row of K quantized activations for weights of `type`: K/32 cpu_q8_block or
 * K/256 cpu_q8k_block. */
size_t cpu_quant_act_row_bytes(uint32_t type, int32_t K);

/* x[K] -> act (cpu_quant_act_row_bytes(type, K) bytes, aligned as the blocks), the blocks that
 * weights of `type` take. An unsupported type is NOPAD_ERR_UNSUPPORTED, a K that is not a whole
 * number of blocks NOPAD_ERR_INVALID_ARGUMENT naming K and the block. */
nopad_status cpu_quant_activations(void *act, const float *x, uint32_t type, int32_t K);

/* cpu_quant_activations on the path `isa` (the same blocks bit for bit on every path; a path this
 * CPU lacks is NOPAD_ERR_UNSUPPORTED). */
nopad_status cpu_quant_activations_on(void *act, const float *x, uint32_t type, int32_t K, cpu_quant_isa isa);

/* *out = (one weight row w of `type`, K values) · (one activation row act from
 * cpu_quant_activations), on the path `isa` (one this CPU lacks is NOPAD_ERR_UNSUPPORTED). Errors
 * as cpu_quant_activations. */
nopad_status cpu_quant_dot(float *out, const void *w, const void *act, uint32_t type, int32_t K,
                           cpu_quant_isa isa);

/* out[K] = one weight row w of `type` as float (the embedding rows of a block-quantized table,
 * dequantised as they are gathered). Errors as cpu_quant_activations. */
nopad_status cpu_quant_dequantize(float *out, const void *w, uint32_t type, int32_t K);

/* From this many tokens on, cpu_quant_linear dequantises tiles of weight rows to float and runs
 * sgemm instead of the int8 dot products, for weights of `type` on the path `isa`: 32 on the
 * portable path, 128 for the k-quants on x86 (where sgemm's reuse of a float tile beats their
 * int8 GEMM: docs/decoder.md), never for the blocks of 32 and the repacked k-quants on x86. */
int32_t cpu_quant_sgemm_tokens(uint32_t type, cpu_quant_isa isa);

/* y[T, N] = x[T, K] · W[N, K]ᵀ, or y += x · Wᵀ when `accumulate` (a residual added in place:
 * y may be the residual, never x). W's N rows stored one after the other as in the GGUF file
 * (row n at w + n · cpu_quant_row_bytes(type, K)), on n_threads OpenMP threads (<= 0: the
 * OpenMP default), in parallel over runs of W's rows, on the best path. The rows of x are
 * quantized once each; below cpu_quant_sgemm_tokens the int8 dot products run (on x86 as a small
 * GEMM: tiles of weight rows × tokens), and a row's result is bit for bit its one-row dot's
 * (cpu_quant_dot), whatever T is. From it on, x is rounded as those int8 blocks round it (d·q) and
 * each thread dequantises up to 256 rows at a time to float and multiplies them with OpenBLAS's
 * sgemm, which must then be single-threaded (the CPU backend sets it so): the same products, a row's
 * result differing from the dot's by float summation order only. Errors as
 * cpu_quant_activations, NOPAD_ERR_OUT_OF_MEMORY for the scratch buffers. */
nopad_status cpu_quant_linear(float *y, const float *x, const void *w, uint32_t type, int32_t T,
                              int32_t K, int32_t N, int accumulate, int n_threads);

/* The AVX2 quantization of n values x (n a multiple of 32) to int8 q with their sums per 16,
 * returning d (quant_avx2.c, cpu_quant_activations's on x86-64 CPUs with AVX2; bit for bit the
 * portable one's). */
float cpu_quant_quantize_avx2(int8_t *q, int16_t *sums16, const float *x, int32_t n);

/* cpu_quant_linear on the path `isa` (the tests run each; a path this CPU lacks is
 * NOPAD_ERR_UNSUPPORTED). */
nopad_status cpu_quant_linear_on(float *y, const float *x, const void *w, uint32_t type, int32_t T,
                                 int32_t K, int32_t N, int accumulate, int n_threads, cpu_quant_isa isa);

/* cpu_quant_linear_on into y's first N columns, its rows ldy floats apart (ldy >= N, else
 * NOPAD_ERR_INVALID_ARGUMENT): y[t · ldy + n]. A fused weight whose parts differ in format runs
 * one part at a time into its columns (cpu_quant_ops.c, backend.h's NOPAD_WEIGHT_MIXED). */
nopad_status cpu_quant_linear_ld(float *y, size_t ldy, const float *x, const void *w, uint32_t type, int32_t T,
                                 int32_t K, int32_t N, int accumulate, int n_threads, cpu_quant_isa isa);

/* Q4_K repacked for the GEMV (CPU_QUANT_Q4_K_R8): N rows (N a multiple of 8) in groups of 8, each
 * group's super-block i one block of CPU_QUANT_R8_BYTES bytes that holds the 8 rows' super-block i
 * (group g's block i at w + (8g · K/256 + i) · CPU_QUANT_R8_BYTES, so a row still averages
 * cpu_quant_row_bytes = K/256 · 148 bytes, 2.8% over Q4_K's 144: the scales and mins a byte
 * each instead of 6 bits). Laid out so that one 32-byte load holds the same 4 quant bytes of all 8
 * rows, and a kernel keeps the 8 rows' sums in the 8 lanes of one register (llama.cpp repacks its
 * Q4_K likewise, ggml-cpu/repack.cpp's q4_K_8x8): an activation's 4 bytes are broadcast once for 8
 * rows, int16 sums run over 8 products before the scales' madd, and no row needs a horizontal sum.
 *   [0, 16)      d of rows 0..7 (fp16)
 *   [16, 32)     dmin of rows 0..7 (fp16)
 *   [32, 96)     scales: byte 8j + r = row r's 6-bit scale of sub-block j (0..7)
 *   [96, 160)    mins: byte 16p + 2r + e = row r's 6-bit min of sub-block 2p + e
 *   [160, 1184)  quants: byte 256k + 32l + 4r + b = row r's qs byte 32k + 4l + b (k 0..3, l 0..7):
 *                its low nibble element 64k + 4l + b, its high nibble element 64k + 32 + 4l + b */
enum { CPU_QUANT_R8_BYTES = 1184 };

/* Q6_K repacked likewise (CPU_QUANT_Q6_K_R8): a group's super-block i of CPU_QUANT_R8_BYTES_6 bytes,
 * 8 · 210 (the same bytes as stored), at w + (8g · K/256 + i) · CPU_QUANT_R8_BYTES_6:
 *   [0, 16)       d of rows 0..7 (fp16)
 *   [16, 144)     scales: byte 16p + 2r + e = row r's int8 scale of group 2p + e (16 groups of 16)
 *   [144, 1168)   ql: byte 512h + 32m + 4r + b = row r's ql byte 64h + 4m + b (h 0..1, m 0..15)
 *   [1168, 1680)  qh: byte 256h + 32m + 4r + b = row r's qh byte 32h + 4m + b (m 0..7)
 * (ql and qh as io/gguf_dequant.c's Q6_K: quant element 128h + 32·run + l from ql byte 64h + l
 * (runs 0, 2) or 64h + 32 + l (runs 1, 3), low nibble for runs 0-1, high for 2-3, and bits 2·run of
 * qh byte 32h + l.) */
enum { CPU_QUANT_R8_BYTES_6 = 1680 };

/* Q4_1 repacked likewise (CPU_QUANT_Q4_1_R8): a group's block i of 32 values in CPU_QUANT_R8_BYTES_4_1
 * bytes, 8 · 20 (the same bytes as stored), at w + (8g · K/32 + i) · CPU_QUANT_R8_BYTES_4_1:
 *   [0, 16)    d of rows 0..7 (fp16)
 *   [16, 32)   m of rows 0..7 (fp16)
 *   [32, 160)  quants: byte 32l + 4r + b = row r's qs byte 4l + b (l 0..3): its low nibble element
 *              4l + b, its high nibble element 16 + 4l + b
 * One 32-byte load is 4 quant bytes of each of the 8 rows; a kernel sums each row's Σ q·a in int16
 * over the block (8 maddubs results, each at most 2·15·127: |sum| <= 30480) and keeps the 8 rows'
 * sums in one register's lanes. */
enum { CPU_QUANT_R8_BYTES_4_1 = 160 };

/* Q8_0 repacked likewise (CPU_QUANT_Q8_0_R8): a group's block i of 32 in CPU_QUANT_R8_BYTES_8_0 bytes,
 * 8 · 34 (the same bytes as stored), at w + (8g · K/32 + i) · CPU_QUANT_R8_BYTES_8_0:
 *   [0, 16)    d of rows 0..7 (fp16)
 *   [16, 272)  quants: byte 32l + 4r + b = row r's qs byte 4l + b (l 0..7), element 4l + b
 * A maddubs result of two int8 products is up to 2·127·127, so each is widened (madd) at once. */
enum { CPU_QUANT_R8_BYTES_8_0 = 272 };

/* dst = the N rows of K values of Q4_K at src (as stored) repacked as CPU_QUANT_Q4_K_R8
 * (cpu_quant_row_bytes(CPU_QUANT_Q4_K_R8, K) · N bytes; dst and src apart). N not a multiple of 8
 * or K not of 256 is NOPAD_ERR_INVALID_ARGUMENT. */
nopad_status cpu_quant_repack_q4_k_r8(void *dst, const void *src, int32_t K, int32_t N);
/* The same for Q6_K rows as stored -> CPU_QUANT_Q6_K_R8. */
nopad_status cpu_quant_repack_q6_k_r8(void *dst, const void *src, int32_t K, int32_t N);
/* The same for Q4_1 rows as stored -> CPU_QUANT_Q4_1_R8 (K a multiple of 32). */
nopad_status cpu_quant_repack_q4_1_r8(void *dst, const void *src, int32_t K, int32_t N);
/* The same for Q8_0 rows as stored -> CPU_QUANT_Q8_0_R8 (K a multiple of 32). */
nopad_status cpu_quant_repack_q8_0_r8(void *dst, const void *src, int32_t K, int32_t N);

/* The AVX2 GEMV on CPU_QUANT_Q4_K_R8 (quant_avx2.c): y[t · ldy + r] (+)= row r · token t for
 * n_groups groups of 8 rows (group g at w + g · 8 · nb · 148) and n_tokens activation rows act_bytes
 * apart, nb super-blocks each. The same floats bit for bit as the portable path's (quant.c): the
 * same exact integers per super-block, then the same two fused multiply-adds. */
void cpu_quant_gemm_r8_avx2(const void *w, int32_t n_groups, const void *act, size_t act_bytes, int32_t n_tokens,
                            int32_t nb, float *y, size_t ldy, int accumulate);
/* The same on CPU_QUANT_Q6_K_R8 (groups at w + g · 8 · nb · 210). */
void cpu_quant_gemm_r8_6_avx2(const void *w, int32_t n_groups, const void *act, size_t act_bytes, int32_t n_tokens,
                              int32_t nb, float *y, size_t ldy, int accumulate);
/* The same on CPU_QUANT_Q4_1_R8 (groups at w + g · 8 · nb · 20, nb blocks of 32, act cpu_q8_block):
 * per row and block the exact Σ q·a, then acc = fma(Σ q·a, d·d_a, acc) and accm = fma(m, d_a·Σa,
 * accm) per row, the row's result acc + accm (the portable path's floats bit for bit). */
void cpu_quant_gemm_r8_4_1_avx2(const void *w, int32_t n_groups, const void *act, size_t act_bytes, int32_t n_tokens,
                                int32_t nb, float *y, size_t ldy, int accumulate);
/* The same on CPU_QUANT_Q8_0_R8 (groups at w + g · 8 · nb · 34): per row and block the exact Σ q·a,
 * then acc = fma(Σ q·a, d·d_a, acc) (the portable path's floats bit for bit). */
void cpu_quant_gemm_r8_8_0_avx2(const void *w, int32_t n_groups, const void *act, size_t act_bytes, int32_t n_tokens,
                                int32_t nb, float *y, size_t ldy, int accumulate);

/* The VNNI GEMM's operands for prompts (blocks of 32), laid out once so that its kernel of 4
 * weight rows × 4 tokens finds each block's scales and quants together, converted and unpacked:
 * one block of 4 tokens' activations, and one block of 4 weight rows. Q8_0's signed weights meet
 * activations moved to unsigned (q + 128, VPDPBUSD's unsigned operand), the 128·Σw that adds taken
 * off by starting each lane's sum at -128 × that lane's weights (the same integers as |w|·a·sign(w),
 * without a sign per token and row). */
typedef struct cpu_q8_panel {
    float d[4];             /* d_a of the 4 tokens */
    float d_sum[4];         /* d_a · Σq: Q4_1's and Q5_1's m multiply it */
    int32_t offset_sum[4];  /* -8 · Σq (Q4_0), -16 · Σq (Q5_0), else 0 */
    uint8_t q[4][CPU_QUANT_QK]; /* Q8_0: q + 128; the others: q (int8) */
} cpu_q8_panel;

typedef struct cpu_w_panel {
    float d[4][4];          /* d_w of each row, 4 times (the tile's 4 tokens) */
    float m[4];             /* Q4_1's and Q5_1's m, else 0 */
    int32_t start[4][8];    /* Q8_0: -128 · each lane's 4 weights summed, else 0 */
    uint8_t q[4][CPU_QUANT_QK]; /* Q8_0's int8 quants; the others' unsigned 0..15 / 0..31 */
} cpu_w_panel;

/* The x86-64 GEMMs (quant_tiles.h, compiled by quant_avx2.c and quant_vnni.c; the checks are the
 * caller's; only on x86-64 builds): y[t · ldy + r] = (or += when `accumulate`) weight row r ·
 * activation row t, for n_rows rows w_bytes apart and n_tokens rows of cpu_quant_activations
 * act_bytes apart, n_blocks blocks each. Both give the same floats bit for bit. */
void cpu_quant_gemm_avx2(uint32_t type, const void *w, size_t w_bytes, int32_t n_rows, const void *act,
                         size_t act_bytes, int32_t n_tokens, int32_t n_blocks, float *y, size_t ldy,
                         int accumulate);
/* The blocks of 32 only. With `panels` (cpu_quant_pack_vnni of the same n_tokens rows: n_tokens / 4
 * groups of n_blocks panels) and `scratch` (n_rows / 4 · n_blocks weight panels), whole groups of
 * 4 tokens and 4 rows run the prompt kernel on them, the same floats bit for bit; without them
 * (NULL), or for the rows and tokens left over, the kernels that read the blocks as stored. */
void cpu_quant_gemm_vnni(uint32_t type, const void *w, size_t w_bytes, int32_t n_rows, const void *act,
                         size_t act_bytes, int32_t n_tokens, int32_t n_blocks, float *y, size_t ldy,
                         int accumulate, const cpu_q8_panel *panels, cpu_w_panel *scratch);
/* panels[n_blocks] = the n_blocks blocks of 4 rows of cpu_quant_activations (act_bytes apart) for
 * weights of `type`, a block of 32 (quant_vnni.c). */
void cpu_quant_pack_vnni(uint32_t type, const void *act, size_t act_bytes, int32_t n_blocks, cpu_q8_panel *panels);

#endif

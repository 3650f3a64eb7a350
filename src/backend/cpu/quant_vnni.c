/* quant.h's GEMM with AVX-512 VNNI's VPDPBUSD on 256-bit vectors (quant_tiles.h), for the blocks
 * of 32: one instruction for maddubs + madd, and AVX-512's 32 vector registers hold tiles of 4
 * rows × 4 tokens (the k-quants' sub-block scales still need madd: quant.c sends them to the AVX2
 * GEMM). Prompts run on panels (quant.h's cpu_q8_panel and cpu_w_panel): VPDPBUSD's sums do not
 * saturate, which lets Q8_0's activations be offset to unsigned instead of taking the weights'
 * signs per token. quant.c calls it only where the CPU has AVX2, FMA, F16C, AVX512VNNI and
 * AVX512VL. */
#if defined(__x86_64__)

#define TARGET __attribute__((target("avx2,fma,f16c,avx512vnni,avx512vl")))
#define QUANT_TILES_VNNI 1
#define QUANT_TILES_GEMM cpu_quant_gemm_vnni
#define QUANT_TILES_ROWS32 1 /* prompts run on panels; the blocks as stored are read one row at a time */
#include "backend/cpu/quant_tiles.h"

#endif

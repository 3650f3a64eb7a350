/* quant.h's GEMM for AVX2 + FMA + F16C (quant_tiles.h). The functions are compiled for those on
 * their own (the attribute), so the library needs no global -mavx2; quant.c calls them only where
 * the CPU has all three. */
#if defined(__x86_64__)

#define TARGET __attribute__((target("avx2,fma,f16c")))
#define QUANT_TILES_VNNI 0
#define QUANT_TILES_GEMM cpu_quant_gemm_avx2
#define QUANT_TILES_ROWS32 2
#include "backend/cpu/quant_tiles.h"

#endif

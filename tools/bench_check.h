/* What the benchmark tools (gemm_bench, attn_paged_bench) share: exit with the file, line, call
 * and message when a CUDA or nopad call fails (a benchmark has nothing to recover). */
#ifndef NOPAD_TOOLS_BENCH_CHECK_H
#define NOPAD_TOOLS_BENCH_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include "nopad.h"

#define CHECK_CUDA(x)                                                                               \
    do {                                                                                            \
        cudaError_t e_ = (x);                                                                       \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)
#define CHECK_NOPAD(x)                                                                              \
    do {                                                                                            \
        nopad_status s_ = (x);                                                                      \
        if (s_ != NOPAD_OK) {                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, nopad_last_error());       \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

#endif

/* What the benchmark tools share: exit with the file, line, call and message when a CUDA or nopad
 * call fails (a benchmark has nothing to recover); their random data (a 64-bit LCG with a fixed
 * seed: the same data every run); the comparison qsort needs for their medians. */
#ifndef NOPAD_TOOLS_BENCH_CHECK_H
#define NOPAD_TOOLS_BENCH_CHECK_H

#include <stdint.h>
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

static uint64_t bench_rng_state = 12345;
static inline uint64_t bench_rand_u64(void) {
    bench_rng_state = bench_rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return bench_rng_state;
}
/* uniform in [-1, 1) */
static inline float bench_uniform(void) {
    return (float)((bench_rand_u64() >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
}

static inline int bench_cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

#endif

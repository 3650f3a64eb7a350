/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the
 * generator of cuRAND's Philox and of PyTorch's CUDA dropout): a counter-based generator, so
 * the random number of element i is a pure function of (seed, i). Training uses it for dropout:
 * the backward regenerates the forward's mask from the same counters instead of storing it, and
 * every backend (host C, CUDA device code) computes the same bits. Checked against Random123's
 * known-answer vectors in tests/test_train_ops.c. */
#ifndef NOPAD_UTIL_PHILOX_H
#define NOPAD_UTIL_PHILOX_H

#include <stdint.h>

#if defined(__CUDACC__)
#define NOPAD_PHILOX_FN static inline __host__ __device__
#else
#define NOPAD_PHILOX_FN static inline
#endif

/* out[4] = Philox4x32-10(counter[4], key[2]). */
NOPAD_PHILOX_FN void philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u; /* the golden ratio and sqrt(3) - 1, Weyl sequence bumps of the key */
        k1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* The 32 random bits of element `index` of the stream `seed`: four consecutive elements share
 * one Philox block (counter = index / 4), so a kernel thread that handles four gets them in one
 * call. */
NOPAD_PHILOX_FN uint32_t philox_bits(uint64_t seed, uint64_t index) {
    const uint64_t block = index >> 2;
    const uint32_t counter[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0, 0};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    philox4x32_10(counter, key, out);
    return out[index & 3];
}

#endif

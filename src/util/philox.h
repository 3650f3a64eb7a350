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

/* Dropout keeps an element when its 32 bits reach this: probability 1 - p up to 2⁻³². */
NOPAD_PHILOX_FN uint32_t dropout_threshold(float p) { return (uint32_t)((double)p * 4294967296.0); }

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

/* Training's dropout masks are keyed by the example, not by the batch: a mask bit is a function of
 * the step's key, the dropout site, the example's number in the corpus and the position inside
 * its sequence, so it does not depend on where the sequence sits in a packed batch, nor on which
 * process of a data-parallel run computes it. The example's low 32 bits are a counter word; its
 * high bits fold into the key (times an odd constant: distinct high words give distinct keys). */
NOPAD_PHILOX_FN uint64_t dropout_example_key(uint64_t key, uint64_t example) {
    return key ^ ((example >> 32) * 0x9E3779B97F4A7C15ull);
}

/* Hidden-state dropout (after the embeddings and the sub-layers' output projections): the block of
 * columns 4·(col / 4) .. + 3 of the token at `position` of example `example` at dropout site
 * `site` (< 2³¹: counter[3]'s top bit stays clear, apart from the attention's blocks below). */
NOPAD_PHILOX_FN void hidden_dropout_block(uint64_t key, uint32_t site, uint64_t example, uint32_t position,
                                          uint32_t col, uint32_t out[4]) {
    const uint32_t counter[4] = {col >> 2, position, (uint32_t)example, site & 0x7FFFFFFFu};
    const uint64_t k = dropout_example_key(key, example);
    const uint32_t k2[2] = {(uint32_t)k, (uint32_t)(k >> 32)};
    philox4x32_10(counter, k2, out);
}

/* The 32 bits of column `col`: word col & 3 of its block. */
NOPAD_PHILOX_FN uint32_t hidden_dropout_bits(uint64_t key, uint32_t site, uint64_t example, uint32_t position,
                                             uint32_t col) {
    uint32_t out[4];
    hidden_dropout_block(key, site, example, position, col, out);
    return out[col & 3];
}

/* Attention-probability dropout: the bits of score (query i, key j) — positions inside their
 * sequence — of head `head` at dropout site `site` (the layer), in the sequence of example
 * `example`. One Philox block serves the 2 x 2 scores {i, i+8} x {j, j+8} with bit 3 of i and j
 * clear: exactly the four scores a thread of an mma.m16n8k16 kernel holds in two neighbouring n8
 * tiles, whichever of queries or keys are its rows (the forward's S, the backward's Sᵀ), so each
 * block is drawn once and no bit is wasted. counter[3]'s top bit keeps these blocks apart from
 * the hidden dropout's (and philox_bits') under the same key. */
NOPAD_PHILOX_FN void attention_dropout_block(uint64_t seed, uint32_t site, uint32_t head, uint64_t example,
                                             uint32_t i, uint32_t j, uint32_t out[4]) {
    const uint32_t counter[4] = {i & ~8u, j & ~8u, (uint32_t)example,
                                 0x80000000u | (site << 16) | (head & 0xFFFFu)};
    const uint64_t k = dropout_example_key(seed, example);
    const uint32_t key[2] = {(uint32_t)k, (uint32_t)(k >> 32)};
    philox4x32_10(counter, key, out);
}

/* The 32 bits of score (i, j): word ((i >> 3) & 1)·2 + ((j >> 3) & 1) of its block. */
NOPAD_PHILOX_FN uint32_t attention_dropout_bits(uint64_t seed, uint32_t site, uint32_t head, uint64_t example,
                                                uint32_t i, uint32_t j) {
    uint32_t out[4];
    attention_dropout_block(seed, site, head, example, i, j, out);
    return out[((i >> 3) & 1) * 2 + ((j >> 3) & 1)];
}

#endif

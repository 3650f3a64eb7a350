/* The KV block manager: reference counts, the free stack, the content-hash index of published
 * blocks, and the least-recently-used list of cached ones. Every operation is O(1) but a lookup,
 * which walks one hash bucket and compares one block's ids. */
#include "engine/kv_blocks.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

nopad_status kv_blocks_init(kv_blocks *m, int32_t n_blocks, int32_t block_size) {
    memset(m, 0, sizeof *m);
    if (n_blocks <= 0 || block_size <= 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "kv blocks: %d blocks of %d tokens (both must be >= 1)", n_blocks,
                               block_size);
    uint32_t n_buckets = 1;
    while (n_buckets < 2u * (uint32_t)n_blocks) n_buckets *= 2;
    const size_t n = (size_t)n_blocks;
    m->n_blocks = n_blocks;
    m->block_size = block_size;
    m->ref = calloc(n, sizeof *m->ref);
    m->hash = calloc(n, sizeof *m->hash);
    m->parent = calloc(n, sizeof *m->parent);
    m->content = malloc(n * (size_t)block_size * sizeof *m->content);
    m->free_ids = malloc(n * sizeof *m->free_ids);
    m->lru_prev = malloc(n * sizeof *m->lru_prev);
    m->lru_next = malloc(n * sizeof *m->lru_next);
    m->bucket = malloc(n_buckets * sizeof *m->bucket);
    m->bucket_next = malloc(n * sizeof *m->bucket_next);
    if (!m->ref || !m->hash || !m->parent || !m->content || !m->free_ids || !m->lru_prev ||
        !m->lru_next || !m->bucket || !m->bucket_next) {
        kv_blocks_free(m);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "kv blocks: out of memory for %d blocks",
                               n_blocks);
    }
    m->bucket_mask = n_buckets - 1;
    for (uint32_t b = 0; b < n_buckets; b++) m->bucket[b] = -1;
    /* the lowest id on top, as the context's own stack hands them out */
    for (int32_t b = 0; b < n_blocks; b++) m->free_ids[b] = n_blocks - 1 - b;
    m->n_free = n_blocks;
    m->lru_head = m->lru_tail = -1;
    return NOPAD_OK;
}

void kv_blocks_free(kv_blocks *m) {
    free(m->ref);
    free(m->hash);
    free(m->parent);
    free(m->content);
    free(m->free_ids);
    free(m->lru_prev);
    free(m->lru_next);
    free(m->bucket);
    free(m->bucket_next);
    memset(m, 0, sizeof *m);
}

uint64_t kv_blocks_hash(uint64_t parent, const int32_t *tokens, int32_t block_size) {
    /* FNV-1a over the ids' 32-bit words, then SplitMix64's finaliser to spread the bits */
    uint64_t h = parent ^ 0xcbf29ce484222325ull;
    for (int32_t i = 0; i < block_size; i++) {
        h ^= (uint32_t)tokens[i];
        h *= 0x100000001b3ull;
    }
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h ? h : 1;
}

static void lru_remove(kv_blocks *m, int32_t b) {
    const int32_t p = m->lru_prev[b], n = m->lru_next[b];
    if (p >= 0) m->lru_next[p] = n; else m->lru_head = n;
    if (n >= 0) m->lru_prev[n] = p; else m->lru_tail = p;
    m->n_cached--;
}

static void lru_append(kv_blocks *m, int32_t b) {
    m->lru_prev[b] = m->lru_tail;
    m->lru_next[b] = -1;
    if (m->lru_tail >= 0) m->lru_next[m->lru_tail] = b; else m->lru_head = b;
    m->lru_tail = b;
    m->n_cached++;
}

static void index_remove(kv_blocks *m, int32_t b) {
    int32_t *link = &m->bucket[m->hash[b] & m->bucket_mask];
    while (*link != b) link = &m->bucket_next[*link];
    *link = m->bucket_next[b];
    m->hash[b] = 0;
}

static int32_t index_find(const kv_blocks *m, uint64_t hash) {
    for (int32_t b = m->bucket[hash & m->bucket_mask]; b >= 0; b = m->bucket_next[b])
        if (m->hash[b] == hash) return b;
    return -1;
}

int32_t kv_blocks_take(kv_blocks *m) {
    int32_t b;
    if (m->n_free > 0) {
        b = m->free_ids[--m->n_free];
    } else if (m->lru_head >= 0) {
        b = m->lru_head;
        lru_remove(m, b);
        index_remove(m, b);
        m->evictions++;
    } else {
        return -1;
    }
    m->ref[b] = 1;
    m->n_used++;
    return b;
}

int32_t kv_blocks_find(kv_blocks *m, uint64_t hash, uint64_t parent, const int32_t *tokens) {
    const int32_t b = index_find(m, hash);
    if (b < 0 || m->parent[b] != parent ||
        memcmp(m->content + (size_t)b * m->block_size, tokens,
               (size_t)m->block_size * sizeof *tokens) != 0)
        return -1;
    if (m->ref[b] == 0) {
        lru_remove(m, b);
        m->n_used++;
    }
    m->ref[b]++;
    return b;
}

void kv_blocks_publish(kv_blocks *m, int32_t block, uint64_t hash, uint64_t parent,
                       const int32_t *tokens) {
    if (m->hash[block] != 0 || index_find(m, hash) >= 0) return;
    m->hash[block] = hash;
    m->parent[block] = parent;
    memcpy(m->content + (size_t)block * m->block_size, tokens,
           (size_t)m->block_size * sizeof *tokens);
    uint32_t k = (uint32_t)(hash & m->bucket_mask);
    m->bucket_next[block] = m->bucket[k];
    m->bucket[k] = block;
}

void kv_blocks_release(kv_blocks *m, int32_t block) {
    if (--m->ref[block] > 0) return;
    m->n_used--;
    if (m->hash[block] != 0) lru_append(m, block);
    else m->free_ids[m->n_free++] = block;
}

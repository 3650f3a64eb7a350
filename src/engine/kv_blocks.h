/* The KV block manager of one context's paged pool: which block holds what, and who uses it.
 *
 * Every block is in one of three states:
 *   used    referenced by one or more requests (ref > 0);
 *   cached  unreferenced but holding a published full block of tokens, findable by its content
 *           hash, kept in least-recently-used order and evicted when free blocks run out;
 *   free    unreferenced and holding nothing anyone can find.
 * A full block's hash chains its parent's (the block before it in the sequence) with its token
 * ids, so equal hashes mean equal prefixes: requests whose prompts begin alike share those blocks
 * (refcount + 1) instead of computing them again. Lookups compare the stored parent hash and
 * token ids too, so a hash collision costs a recomputation, never a wrong answer.
 *
 * Not thread-safe: the engine thread alone owns it. */
#ifndef NOPAD_ENGINE_KV_BLOCKS_H
#define NOPAD_ENGINE_KV_BLOCKS_H

#include <stdint.h>

#include "nopad.h"

typedef struct kv_blocks {
    int32_t n_blocks, block_size;
    int32_t *ref;            // [n_blocks] requests holding the block
    uint64_t *hash;          // [n_blocks] published content hash, 0: none
    uint64_t *parent;        // [n_blocks] the parent hash the block was published under
    int32_t *content;        // [n_blocks, block_size] the token ids of published blocks
    int32_t *free_ids;       // stack of free blocks, the lowest id on top
    int32_t n_free;
    int32_t *lru_prev, *lru_next; // [n_blocks] the cached blocks, oldest first (-1 ends)
    int32_t lru_head, lru_tail;
    int32_t n_cached, n_used;
    int32_t *bucket;         // [n_buckets] first block of each hash bucket, -1: empty
    int32_t *bucket_next;    // [n_blocks] next block in the same bucket
    uint32_t bucket_mask;    // n_buckets - 1 (a power of two)
    int64_t evictions;       // cached blocks taken for new content
} kv_blocks;

nopad_status kv_blocks_init(kv_blocks *m, int32_t n_blocks, int32_t block_size);
void kv_blocks_free(kv_blocks *m);

/* Blocks a request can take now: the free ones and the cached ones (evicted on demand). */
static inline int32_t kv_blocks_available(const kv_blocks *m) { return m->n_free + m->n_cached; }

/* The content hash of a full block of `block_size` token ids after the block hashed `parent`
 * (0 for a sequence's first block). Never 0. */
uint64_t kv_blocks_hash(uint64_t parent, const int32_t *tokens, int32_t block_size);

/* Takes a block for new content: a free one, else the least recently used cached one (its
 * content is forgotten). Returns its id with ref = 1, or -1 when every block is used. */
int32_t kv_blocks_take(kv_blocks *m);

/* The published block holding `tokens` after `parent`, with ref + 1, or -1 when none holds it. */
int32_t kv_blocks_find(kv_blocks *m, uint64_t hash, uint64_t parent, const int32_t *tokens);

/* Makes a block the caller just filled findable under `hash`. A block already published stays as
 * it is; so does one whose content another block already holds (the copy stays private and goes
 * back to the free blocks when released). */
void kv_blocks_publish(kv_blocks *m, int32_t block, uint64_t hash, uint64_t parent,
                       const int32_t *tokens);

/* Drops one reference. An unreferenced published block becomes cached (the most recently used);
 * any other goes back to the free blocks. */
void kv_blocks_release(kv_blocks *m, int32_t block);

#endif

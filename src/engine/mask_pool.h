/* The constraint masks of a step's rows, computed by worker threads beside the engine thread. The
 * vocabulary's trie is read-only and each request's matcher is its own, so rows are independent
 * and a step with many constrained requests takes the time of its slowest masks, not of their
 * sum (docs/grammar.md has the numbers). */
#ifndef NOPAD_ENGINE_MASK_POOL_H
#define NOPAD_ENGINE_MASK_POOL_H

#include <stdint.h>

#include "grammar/grammar.h"
#include "nopad.h"

typedef struct mask_pool mask_pool;

/* n_workers >= 1 threads, waiting for work. */
nopad_status mask_pool_create(int n_workers, mask_pool **out);
/* Stops and joins the workers; no run may be in flight. NULL is a no-op. */
void mask_pool_free(mask_pool *p);
/* masks[j] = grammar_token_mask_shared(cache, matchers[j], ...) for j < n, rows handed out one at
 * a time to the workers and the calling thread; returns once all are done: the lowest j whose mask
 * allows no token, or -1. One caller at a time. */
int32_t mask_pool_run(mask_pool *p, grammar_mask_cache *cache, grammar_matcher *const *matchers,
                      uint32_t *const *masks, int32_t n);

#endif

/* Masks shared by the requests of one vocabulary (grammar_mask_cache, grammar.h): keyed by the
 * grammar's fingerprint and the matcher's state, so requests under the same schema (each with its
 * own compiled copy) compute each state's mask once between them. A lock guards the table; a
 * mask is computed outside it, so two threads may compute one state at once (the work is wasted,
 * the result the same). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"
#include "util/error.h"

#define SHARED_KEY_WORDS 256 /* the longest state key kept, as the matcher's own kept masks */

typedef struct shared_entry {
    uint64_t fingerprint, key_hash; /* 0 / 0 with key_len 0: empty */
    uint32_t key_len;
    uint32_t *key;                  /* [SHARED_KEY_WORDS] */
    uint32_t *mask;                 /* [words] */
    int32_t allowed;
    uint64_t used;
} shared_entry;

struct grammar_mask_cache {
    const grammar_token_trie *trie;
    size_t words;
    pthread_mutex_t lock;
    shared_entry *entries;
    uint32_t n_entries;
    uint64_t clock, hits, misses;
};

nopad_status grammar_mask_cache_create(const grammar_token_trie *trie, uint32_t n_entries,
                                       grammar_mask_cache **out) {
    *out = NULL;
    if (!trie || n_entries == 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "grammar_mask_cache_create: need a trie and entries >= 1");
    grammar_mask_cache *c = calloc(1, sizeof *c);
    if (!c) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "grammar_mask_cache_create: out of memory");
    c->trie = trie;
    c->words = ((size_t)grammar_token_trie_vocab_size(trie) + 31) / 32;
    c->entries = calloc(n_entries, sizeof *c->entries);
    c->n_entries = n_entries;
    pthread_mutex_init(&c->lock, NULL);
    if (!c->entries) {
        grammar_mask_cache_free(c);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "grammar_mask_cache_create: out of memory for %u entries",
                               n_entries);
    }
    *out = c;
    return NOPAD_OK;
}

void grammar_mask_cache_free(grammar_mask_cache *c) {
    if (!c) return;
    for (uint32_t i = 0; c->entries && i < c->n_entries; i++) {
        free(c->entries[i].key);
        free(c->entries[i].mask);
    }
    free(c->entries);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static uint64_t key_hash(const uint32_t *key, uint32_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t i = 0; i < n; i++) h = (h ^ key[i]) * 0x100000001b3ull;
    return h;
}

int32_t grammar_token_mask_shared(grammar_mask_cache *c, grammar_matcher *m, uint32_t *mask) {
    uint32_t key[SHARED_KEY_WORDS];
    const uint32_t n = grammar_matcher_state_key(m, key, SHARED_KEY_WORDS);
    if (n == 0) return grammar_token_mask(c->trie, m, mask); /* too large a state to key */
    const uint64_t fp = grammar_matcher_grammar(m)->fingerprint, h = key_hash(key, n);
    pthread_mutex_lock(&c->lock);
    for (uint32_t i = 0; i < c->n_entries; i++) {
        shared_entry *e = &c->entries[i];
        if (e->key_len != n || e->key_hash != h || e->fingerprint != fp || memcmp(e->key, key, n * sizeof *key))
            continue;
        memcpy(mask, e->mask, c->words * sizeof *mask);
        const int32_t allowed = e->allowed;
        e->used = ++c->clock;
        c->hits++;
        pthread_mutex_unlock(&c->lock);
        return allowed;
    }
    c->misses++;
    pthread_mutex_unlock(&c->lock);
    const int32_t allowed = grammar_token_mask(c->trie, m, mask);
    pthread_mutex_lock(&c->lock);
    shared_entry *e = &c->entries[0]; /* the least recently used (an empty one first) */
    for (uint32_t i = 1; i < c->n_entries; i++)
        if (c->entries[i].used < e->used) e = &c->entries[i];
    if (!e->key) e->key = malloc(SHARED_KEY_WORDS * sizeof *e->key);
    if (!e->mask) e->mask = malloc(c->words * sizeof *e->mask);
    if (e->key && e->mask) { /* out of memory: nothing kept, the mask stands */
        e->fingerprint = fp;
        e->key_hash = h;
        e->key_len = n;
        memcpy(e->key, key, n * sizeof *key);
        memcpy(e->mask, mask, c->words * sizeof *mask);
        e->allowed = allowed;
        e->used = ++c->clock;
    }
    pthread_mutex_unlock(&c->lock);
    return allowed;
}

void grammar_mask_cache_counts(grammar_mask_cache *c, uint64_t *hits, uint64_t *misses) {
    pthread_mutex_lock(&c->lock);
    *hits = c->hits;
    *misses = c->misses;
    pthread_mutex_unlock(&c->lock);
}

/* The vocabulary: an open-addressing hash map (linear probing) from token bytes to id.
 * WordPiece looks up several candidate substrings per word, so lookups must be cheap: the table
 * is at most half full and each slot keeps 32 bits of the hash to skip most key compares. */
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_internal.h"
#include "util/error.h"

uint64_t tok_hash_bytes(const char *s, size_t len) {
    uint64_t h = TOK_HASH_INIT;
    for (size_t i = 0; i < len; i++) h = tok_hash_step(h, (uint8_t)s[i]);
    return h;
}

/* FNV's low bits are weak for short keys; fold the high half in before masking. */
static uint32_t slot_hash(uint64_t h) { return (uint32_t)(h ^ (h >> 32)); }

static nopad_status alloc_slots(tok_vocab *v, size_t n_slots) {
    v->slots = malloc(n_slots * sizeof *v->slots);
    if (!v->slots)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY,
                               "tokenizer: cannot allocate %zu vocab slots", n_slots);
    for (size_t i = 0; i < n_slots; i++) v->slots[i].id = -1;
    v->mask = (uint32_t)(n_slots - 1);
    return NOPAD_OK;
}

nopad_status tok_vocab_init(tok_vocab *v, size_t expected) {
    memset(v, 0, sizeof *v);
    v->max_id = -1;
    if (expected > (1u << 29))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "tokenizer: vocab of %zu entries is too large", expected);
    size_t n_slots = 16;
    while (n_slots < expected * 2) n_slots *= 2;
    return alloc_slots(v, n_slots);
}

static void insert_slot(tok_vocab *v, tok_vocab_slot s) {
    uint32_t i = s.hash & v->mask;
    while (v->slots[i].id >= 0) i = (i + 1) & v->mask;
    v->slots[i] = s;
}

static nopad_status grow(tok_vocab *v) {
    tok_vocab_slot *old = v->slots;
    size_t n_old = (size_t)v->mask + 1;
    if (n_old >= (1u << 30))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "tokenizer: vocab too large");
    nopad_status st = alloc_slots(v, n_old * 2);
    if (st != NOPAD_OK) {
        v->slots = old;
        return st;
    }
    for (size_t i = 0; i < n_old; i++)
        if (old[i].id >= 0) insert_slot(v, old[i]);
    free(old);
    return NOPAD_OK;
}

int32_t tok_vocab_find(const tok_vocab *v, uint64_t hash, const char *key, size_t len) {
    if (len > v->max_key_len) return -1;
    uint32_t h = slot_hash(hash);
    for (uint32_t i = h & v->mask;; i = (i + 1) & v->mask) {
        const tok_vocab_slot *s = &v->slots[i];
        if (s->id < 0) return -1;
        if (s->hash == h && s->len == len && memcmp(v->pool + s->offset, key, len) == 0)
            return s->id;
    }
}

int32_t tok_vocab_get(const tok_vocab *v, const char *key, size_t len) {
    return tok_vocab_find(v, tok_hash_bytes(key, len), key, len);
}

nopad_status tok_vocab_put(tok_vocab *v, const char *key, size_t len, int32_t id) {
    uint32_t h = slot_hash(tok_hash_bytes(key, len));
    for (uint32_t i = h & v->mask;; i = (i + 1) & v->mask) {
        tok_vocab_slot *s = &v->slots[i];
        if (s->id < 0) break;
        if (s->hash == h && s->len == len && memcmp(v->pool + s->offset, key, len) == 0) {
            s->id = id; /* a later duplicate wins */
            if (id > v->max_id) v->max_id = id;
            return NOPAD_OK;
        }
    }
    if ((size_t)(v->count + 1) * 2 > (size_t)v->mask + 1) {
        nopad_status st = grow(v);
        if (st != NOPAD_OK) return st;
    }
    if (len > UINT32_MAX - v->pool_len)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "tokenizer: vocab strings exceed 4 GiB");
    if (!v->pool || v->pool_len + len > v->pool_cap) { /* allocated even for "" keys */
        size_t cap = v->pool_cap ? v->pool_cap * 2 : 4096;
        while (cap < v->pool_len + len) cap *= 2;
        char *pool = realloc(v->pool, cap);
        if (!pool)
            return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tokenizer: cannot allocate %zu bytes",
                                   cap);
        v->pool = pool;
        v->pool_cap = cap;
    }
    if (len) memcpy(v->pool + v->pool_len, key, len);
    tok_vocab_slot s = {h, (uint32_t)len, (uint32_t)v->pool_len, id};
    v->pool_len += len;
    insert_slot(v, s);
    v->count++;
    if (len > v->max_key_len) v->max_key_len = (uint32_t)len;
    if (id > v->max_id) v->max_id = id;
    return NOPAD_OK;
}

void tok_vocab_free(tok_vocab *v) {
    free(v->slots);
    free(v->pool);
    memset(v, 0, sizeof *v);
    v->max_id = -1;
}

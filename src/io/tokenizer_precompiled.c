/* SentencePiece's precompiled charsmap: the normalization rules (nmt_nfkc and friends) that a
 * SentencePiece model carries, which tokenizer.json keeps as base64 in a Precompiled normalizer.
 *
 * Layout: a little-endian u32 byte size of a darts-clone double-array trie, the trie's u32 units,
 * then a pool of NUL-terminated replacement strings; a trie key's value is the offset of its
 * replacement in the pool. Normalization is HF's (spm_precompiled), kept exactly even where it
 * looks odd: the text goes by extended grapheme cluster (utf8proc's segmentation); a cluster of
 * fewer than 6 bytes whose bytes start with a trie key is replaced whole by that key's
 * replacement, taking the SHORTEST matching key; otherwise each character is replaced on its own
 * when it starts with a key, or kept. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "io/tokenizer_internal.h"
#include "util/error.h"

struct tok_precompiled {
    uint32_t *units; /* the double array */
    size_t n_units;
    char *pool;      /* replacement strings, each ended by NUL (the last one may end the pool) */
    size_t pool_len;
};

void tok_precompiled_free(struct tok_precompiled *p) {
    if (!p) return;
    free(p->units);
    free(p->pool);
    free(p);
}

static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Standard base64 with padding; returns the decoded length or -1. */
static long b64_decode(const char *s, size_t n, unsigned char *out) {
    if (n % 4 != 0) return -1;
    size_t len = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            unsigned char c = (unsigned char)s[i + k];
            if (c == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
            } else {
                if (pad) return -1; /* data after padding */
                v[k] = b64_value(c);
                if (v[k] < 0) return -1;
            }
        }
        uint32_t x = ((uint32_t)v[0] << 18) | ((uint32_t)v[1] << 12) | ((uint32_t)v[2] << 6) |
                     (uint32_t)v[3];
        out[len++] = (unsigned char)(x >> 16);
        if (pad < 2) out[len++] = (unsigned char)(x >> 8);
        if (pad < 1) out[len++] = (unsigned char)x;
    }
    return (long)len;
}

nopad_status tok_precompiled_load(const char *base64, const char *where,
                                  struct tok_precompiled **out) {
    *out = NULL;
    size_t n = strlen(base64);
    unsigned char *raw = malloc(n / 4 * 3 + 3);
    if (!raw) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", where);
    long len = b64_decode(base64, n, raw);
    if (len < 0) {
        free(raw);
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: normalizer precompiled_charsmap is not valid base64", where);
    }
    uint32_t trie_bytes = 0;
    if (len >= 4)
        trie_bytes = (uint32_t)raw[0] | ((uint32_t)raw[1] << 8) | ((uint32_t)raw[2] << 16) |
                     ((uint32_t)raw[3] << 24);
    if (len < 4 || trie_bytes % 4 != 0 || trie_bytes == 0 || (size_t)trie_bytes > (size_t)len - 4) {
        free(raw);
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: normalizer precompiled_charsmap: trie size %u does not fit "
                               "the %ld bytes (expected a multiple of 4, at most size - 4)",
                               where, trie_bytes, len);
    }
    struct tok_precompiled *p = calloc(1, sizeof *p);
    size_t pool_len = (size_t)len - 4 - trie_bytes;
    if (p) {
        p->n_units = trie_bytes / 4;
        p->units = malloc(trie_bytes);
        p->pool = malloc(pool_len + 1);
        p->pool_len = pool_len;
    }
    if (!p || !p->units || !p->pool) {
        tok_precompiled_free(p);
        free(raw);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", where);
    }
    for (size_t i = 0; i < p->n_units; i++) {
        const unsigned char *u = raw + 4 + 4 * i;
        p->units[i] = (uint32_t)u[0] | ((uint32_t)u[1] << 8) | ((uint32_t)u[2] << 16) |
                      ((uint32_t)u[3] << 24);
    }
    memcpy(p->pool, raw + 4 + trie_bytes, pool_len);
    p->pool[pool_len] = '\0';
    free(raw);
    if (tok_utf8_check(p->pool, pool_len) != pool_len) {
        tok_precompiled_free(p);
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: normalizer precompiled_charsmap: the replacement strings are "
                               "not valid UTF-8",
                               where);
    }
    *out = p;
    return NOPAD_OK;
}

/* darts-clone unit fields */
static int unit_has_leaf(uint32_t u) { return (u >> 8) & 1; }
static uint32_t unit_value(uint32_t u) { return u & 0x7FFFFFFFu; }
static uint32_t unit_label(uint32_t u) { return u & (0x80000000u | 0xFFu); }
static size_t unit_offset(uint32_t u) { return (size_t)((u >> 10) << ((u & (1u << 9)) >> 6)); }

/* The replacement of the shortest trie key that prefixes key[0..n), or NULL. Every index is
 * checked, so a hostile trie can only give "no match". */
static const char *first_prefix(const struct tok_precompiled *p, const char *key, size_t n,
                                size_t *out_len) {
    if (p->n_units == 0) return NULL;
    size_t pos = unit_offset(p->units[0]);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)key[i];
        if (c == 0) return NULL;
        pos ^= c;
        if (pos >= p->n_units) return NULL;
        uint32_t u = p->units[pos];
        if (unit_label(u) != c) return NULL;
        pos ^= unit_offset(u);
        if (unit_has_leaf(u)) {
            if (pos >= p->n_units) return NULL;
            size_t v = unit_value(p->units[pos]);
            if (v > p->pool_len) return NULL;
            const char *r = p->pool + v;
            size_t len = strlen(r); /* the pool ends with an extra NUL */
            /* a replacement cut inside a character is not UTF-8: take none of it */
            if (tok_utf8_check(r, len) != len) return NULL;
            *out_len = len;
            return r;
        }
    }
    return NULL;
}

nopad_status tok_precompiled_normalize(const struct tok_precompiled *p, const char *s, size_t n,
                                       tok_str *out) {
    nopad_status st = NOPAD_OK;
    utf8proc_int32_t state = 0;
    size_t pos = 0;
    while (pos < n && st == NOPAD_OK) {
        /* one extended grapheme cluster: s[pos .. end) */
        size_t end = pos;
        uint32_t c = tok_utf8_next(s, &end);
        while (end < n) {
            size_t q = end;
            uint32_t d = tok_utf8_next(s, &q);
            if (utf8proc_grapheme_break_stateful((utf8proc_int32_t)c, (utf8proc_int32_t)d, &state))
                break;
            c = d;
            end = q;
        }
        size_t rlen;
        const char *r = end - pos < 6 ? first_prefix(p, s + pos, end - pos, &rlen) : NULL;
        if (r) {
            st = tok_str_append(out, r, rlen);
        } else {
            for (size_t q = pos; q < end && st == NOPAD_OK;) {
                size_t q0 = q;
                tok_utf8_next(s, &q);
                r = first_prefix(p, s + q0, q - q0, &rlen);
                st = r ? tok_str_append(out, r, rlen) : tok_str_append(out, s + q0, q - q0);
            }
        }
        pos = end;
    }
    return st;
}

/* UTF-8 handling and the BertNormalizer.
 *
 * HF's BertNormalizer runs four passes over the whole string: clean_text, CJK spacing, strip
 * accents (NFD, then drop nonspacing marks), lowercase. Each pass maps one character to zero or
 * more characters, so we run all four per character and append the result; the one piece of
 * context NFD needs, canonical reordering of combining marks, is done on the tail of the output.
 * Lowercasing before reordering gives the same result because no character that lowercasing
 * changes has a nonzero combining class. */
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_internal.h"
#include "util/error.h"

size_t tok_utf8_check(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned char b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        size_t need;
        unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (b >= 0xC2 && b <= 0xDF) need = 1;
        else if (b == 0xE0) need = 2, lo = 0xA0;          /* no overlong 3-byte forms */
        else if (b >= 0xE1 && b <= 0xEC) need = 2;
        else if (b == 0xED) need = 2, hi = 0x9F;          /* no surrogates D800..DFFF */
        else if (b >= 0xEE && b <= 0xEF) need = 2;
        else if (b == 0xF0) need = 3, lo = 0x90;          /* no overlong 4-byte forms */
        else if (b >= 0xF1 && b <= 0xF3) need = 3;
        else if (b == 0xF4) need = 3, hi = 0x8F;          /* nothing above U+10FFFF */
        else return i;                                    /* 80..C1 (incl. overlong C0/C1), F5.. */
        if (len - i <= need) return i;                    /* truncated sequence */
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += need + 1;
    }
    return len;
}

uint32_t tok_utf8_next(const char *str, size_t *pos) {
    const unsigned char *s = (const unsigned char *)str + *pos;
    if (s[0] < 0x80) {
        *pos += 1;
        return s[0];
    }
    if (s[0] < 0xE0) {
        *pos += 2;
        return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    }
    if (s[0] < 0xF0) {
        *pos += 3;
        return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    *pos += 4;
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
           ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

int tok_utf8_put(uint32_t c, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (c < 0x80) {
        o[0] = (unsigned char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (unsigned char)(0xC0 | (c >> 6));
        o[1] = (unsigned char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (c >> 12));
        o[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (c >> 18));
    o[1] = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (c & 0x3F));
    return 4;
}

void tok_cpbuf_init(tok_cpbuf *b, uint32_t *storage, size_t cap) {
    b->data = b->initial = storage;
    b->len = 0;
    b->cap = b->initial_cap = storage ? cap : 0;
}

nopad_status tok_cpbuf_reserve(tok_cpbuf *b, size_t extra) {
    if (extra <= b->cap - b->len) return NOPAD_OK;
    if (extra > SIZE_MAX / sizeof(uint32_t) / 2 - b->len)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tokenizer: text too large to normalize");
    size_t cap = b->cap * 2;
    if (cap < b->len + extra) cap = b->len + extra;
    uint32_t *data;
    if (b->data == b->initial) {
        data = malloc(cap * sizeof *data);
        if (data && b->len) memcpy(data, b->data, b->len * sizeof *data);
    } else {
        data = realloc(b->data, cap * sizeof *data);
    }
    if (!data)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY,
                               "tokenizer: cannot allocate %zu code points", cap);
    b->data = data;
    b->cap = cap;
    return NOPAD_OK;
}

void tok_cpbuf_free(tok_cpbuf *b) {
    if (b->data != b->initial) free(b->data);
    tok_cpbuf_init(b, b->initial, b->initial_cap);
}

/* Appends c; with NFD on, a combining mark moves before marks of a higher class (canonical
 * ordering, a stable insertion sort within the run of marks). */
static void push(tok_cpbuf *out, uint32_t c, int reorder) {
    size_t j = out->len++;
    int ccc = reorder ? tok_combining_class(c) : 0;
    if (ccc) {
        while (j > 0 && tok_combining_class(out->data[j - 1]) > ccc) {
            out->data[j] = out->data[j - 1];
            j--;
        }
    }
    out->data[j] = c;
}

/* The strip-accents and lowercase passes of one character. */
static void push_stripped_lowered(const tok_normalizer *nm, tok_cpbuf *out, uint32_t c) {
    uint32_t dec[TOK_MAX_DECOMP];
    int n = 1;
    dec[0] = c;
    if (nm->strip_accents) n = tok_strip_accents(c, dec);
    for (int i = 0; i < n; i++) {
        if (nm->lowercase) {
            uint32_t low[2];
            int m = tok_lowercase(dec[i], low);
            for (int k = 0; k < m; k++) push(out, low[k], nm->strip_accents);
        } else {
            push(out, dec[i], nm->strip_accents);
        }
    }
}

/* Upper bound on what one input character becomes, by construction: two CJK spaces around a
 * decomposition of up to TOK_MAX_DECOMP characters, each lowercased to at most 2 (in practice
 * never more than 3 in all). */
enum { MAX_OUT_PER_CHAR = 2 + 2 * TOK_MAX_DECOMP };

nopad_status tok_normalize(const tok_normalizer *nm, const char *s, size_t len, tok_cpbuf *out) {
    /* reserve per slice of input, so a long text does not reserve MAX_OUT_PER_CHAR x its size;
     * a slice has at most as many characters as bytes */
    enum { SLICE = 1024 };
    size_t pos = 0, budget = 0;
    while (pos < len) {
        if (budget == 0) {
            budget = len - pos < SLICE ? len - pos : SLICE;
            nopad_status st = tok_cpbuf_reserve(out, budget * MAX_OUT_PER_CHAR);
            if (st != NOPAD_OK) return st;
        }
        budget--;
        uint32_t c = tok_utf8_next(s, &pos);
        if (!nm->enabled) {
            out->data[out->len++] = c;
            continue;
        }
        if (c < 0x80) { /* ASCII fast path: no marks, no decompositions, no CJK */
            if (nm->clean_text) {
                if (c == '\t' || c == '\n' || c == '\r') c = ' ';
                else if (c < 0x20 || c == 0x7F) continue;
            }
            if (nm->lowercase && c >= 'A' && c <= 'Z') c += 32;
            out->data[out->len++] = c;
            continue;
        }
        if (nm->clean_text) {
            if (c == 0xFFFD || tok_is_control(c)) continue;
            if (tok_is_whitespace(c)) c = ' ';
        }
        if (nm->handle_chinese_chars && tok_is_chinese(c)) {
            out->data[out->len++] = ' ';
            push_stripped_lowered(nm, out, c);
            out->data[out->len++] = ' ';
        } else {
            push_stripped_lowered(nm, out, c);
        }
    }
    return NOPAD_OK;
}

/* UTF-8 handling and the BertNormalizer.
 *
 * HF's BertNormalizer runs four passes over the whole string: clean_text, CJK spacing, strip
 * accents (NFD, then drop nonspacing marks), lowercase. Each pass maps one character to zero or
 * more characters, so we run all four per character and append the result; the one piece of
 * context NFD needs, canonical reordering of combining marks, is done on each run of marks once
 * it ends. Lowercasing before reordering gives the same result because no character that
 * lowercasing changes has a nonzero combining class. */
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

/* Canonical ordering (the part of NFD that needs context): each maximal run of combining marks
 * (class > 0) is stably sorted by class. Marks are appended as they come and a run is sorted
 * when it ends, only if it is out of order; a counting sort keeps even a hostile run of
 * thousands of marks linear. */
typedef struct mark_run {
    size_t start; /* index of the run's first mark */
    int max_ccc;  /* highest class in the run so far */
    int unsorted;
} mark_run;

static nopad_status sort_run(tok_cpbuf *out, mark_run *run) {
    uint32_t *a = out->data + run->start;
    size_t n = out->len - run->start;
    run->unsorted = 0;
    if (n <= 32) { /* the usual case: a couple of marks */
        for (size_t i = 1; i < n; i++) {
            uint32_t c = a[i];
            int ccc = tok_combining_class(c);
            size_t j = i;
            for (; j > 0 && tok_combining_class(a[j - 1]) > ccc; j--) a[j] = a[j - 1];
            a[j] = c;
        }
        return NOPAD_OK;
    }
    size_t count[257] = {0};
    uint32_t *sorted = malloc(n * sizeof *sorted);
    if (!sorted)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tokenizer: cannot sort %zu marks", n);
    for (size_t i = 0; i < n; i++) count[tok_combining_class(a[i]) + 1]++;
    for (int k = 0; k < 256; k++) count[k + 1] += count[k];
    for (size_t i = 0; i < n; i++) sorted[count[tok_combining_class(a[i])]++] = a[i];
    memcpy(a, sorted, n * sizeof *a);
    free(sorted);
    return NOPAD_OK;
}

/* Appends a character of class 0, which ends the current run of marks. */
static nopad_status push_starter(tok_cpbuf *out, uint32_t c, mark_run *run) {
    nopad_status st = run->unsorted ? sort_run(out, run) : NOPAD_OK;
    out->data[out->len++] = c;
    run->start = out->len;
    run->max_ccc = 0;
    return st;
}

static nopad_status push(tok_cpbuf *out, uint32_t c, int reorder, mark_run *run) {
    int ccc = reorder ? tok_combining_class(c) : 0;
    if (ccc == 0) return push_starter(out, c, run);
    if (ccc < run->max_ccc) run->unsorted = 1;
    else run->max_ccc = ccc;
    out->data[out->len++] = c;
    return NOPAD_OK;
}

/* The strip-accents and lowercase passes of one character. */
static nopad_status push_stripped_lowered(const tok_normalizer *nm, tok_cpbuf *out, uint32_t c,
                                          mark_run *run) {
    uint32_t dec[TOK_MAX_DECOMP];
    int n = 1;
    dec[0] = c;
    if (nm->strip_accents) n = tok_strip_accents(c, dec);
    nopad_status st = NOPAD_OK;
    for (int i = 0; i < n && st == NOPAD_OK; i++) {
        uint32_t low[2];
        int m = 1;
        low[0] = dec[i];
        if (nm->lowercase) m = tok_lowercase(dec[i], low);
        for (int k = 0; k < m && st == NOPAD_OK; k++)
            st = push(out, low[k], nm->strip_accents, run);
    }
    return st;
}

/* Upper bound on what one input character becomes, by construction: two CJK spaces around a
 * decomposition of up to TOK_MAX_DECOMP characters, each lowercased to at most 2 (in practice
 * never more than 3 in all). */
enum { MAX_OUT_PER_CHAR = 2 + 2 * TOK_MAX_DECOMP };

nopad_status tok_normalize(const tok_normalizer *nm, const char *s, size_t len, tok_cpbuf *out) {
    mark_run run = {out->len, 0, 0};
    nopad_status st = NOPAD_OK;
    size_t pos = 0;
    while (pos < len && st == NOPAD_OK) {
        /* Room for the worst case of the next character; when short, grow for the rest of the
         * text at one code point per byte (the common case), so growth is rare and short texts
         * stay in the caller's storage. */
        if (out->cap - out->len < MAX_OUT_PER_CHAR) {
            st = tok_cpbuf_reserve(out, MAX_OUT_PER_CHAR + (len - pos));
            if (st != NOPAD_OK) return st;
        }
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
            st = push_starter(out, c, &run);
            continue;
        }
        if (nm->clean_text) {
            if (c == 0xFFFD || tok_is_control(c)) continue;
            if (tok_is_whitespace(c)) c = ' ';
        }
        if (nm->handle_chinese_chars && tok_is_chinese(c)) {
            st = push_starter(out, ' ', &run);
            if (st == NOPAD_OK) st = push_stripped_lowered(nm, out, c, &run);
            if (st == NOPAD_OK) st = push_starter(out, ' ', &run);
        } else {
            st = push_stripped_lowered(nm, out, c, &run);
        }
    }
    if (st == NOPAD_OK && run.unsorted) st = sort_run(out, &run);
    return st;
}

/* The general tokenizer pipeline: normalizer and pre-tokenizer steps over UTF-8 strings, as
 * Hugging Face tokenizers composes them (Sequence flattened into one list).
 *
 *   normalizers      BertNormalizer, NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents,
 *                    Replace (String or Regex), Prepend, Precompiled (SentencePiece's charsmap),
 *                    Nmt, Sequence
 *   pre-tokenizers   WhitespaceSplit, Whitespace, BertPreTokenizer, Punctuation, Digits, Split
 *                    (String or Regex, every behavior, invert), Metaspace, ByteLevel,
 *                    CharDelimiterSplit, Sequence
 *
 * A pre-tokenizer step maps each word to zero or more words the way HF's
 * NormalizedString::split does: the pattern gives matches and the gaps between them, the
 * behavior decides which spans are kept and how matches join their neighbours, and empty words
 * are dropped. Unicode forms come from utf8proc; regexes run on PCRE2 in UTF mode. */
#define _GNU_SOURCE /* memmem */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "io/tokenizer_internal.h"
#include "util/error.h"

/* GPT-2's split regex with \s spelled out as the White_Space property, which is what Oniguruma
 * (HF's regex engine) means by \s; PCRE2's own \s differs (U+0085, for one). */
#define WS "\\p{White_Space}"
const char tok_gpt2_split_regex[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS
                                    "\\p{L}\\p{N}]+|" WS "+(?!\\P{White_Space})|" WS "+";

void tok_byte_chars(char chars[256][2], uint8_t lens[256]) {
    /* printable Latin-1 bytes stand for themselves, the others take U+0100 on, in byte order */
    memset(chars, 0, 256 * 2);
    int next = 256;
    for (int c = 0; c < 256; c++) {
        int printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE);
        uint32_t cp = printable ? (uint32_t)c : (uint32_t)next++;
        char buf[4];
        int len = tok_utf8_put(cp, buf);
        memcpy(chars[c], buf, (size_t)len);
        lens[c] = (uint8_t)len;
    }
}

/* ---- strings and words ---------------------------------------------------------------------- */

nopad_status tok_str_reserve(tok_str *s, size_t need) {
    if (need <= s->cap) return NOPAD_OK;
    size_t cap = s->cap * 2 > need ? s->cap * 2 : need;
    if (cap < 64) cap = 64;
    char *d = realloc(s->data, cap);
    if (!d) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tokenizer: cannot allocate %zu bytes", cap);
    s->data = d;
    s->cap = cap;
    return NOPAD_OK;
}

nopad_status tok_str_append(tok_str *s, const char *bytes, size_t n) {
    nopad_status st = tok_str_reserve(s, s->len + n);
    if (st != NOPAD_OK) return st;
    if (n) memcpy(s->data + s->len, bytes, n);
    s->len += n;
    return NOPAD_OK;
}

void tok_str_free(tok_str *s) {
    free(s->data);
    memset(s, 0, sizeof *s);
}

static void words_free(tok_words *w) {
    tok_str_free(&w->buf);
    free(w->start);
    free(w->len);
    free(w->first);
    memset(w, 0, sizeof *w);
}

void tok_pipe_work_free(tok_pipe_work *w) {
    tok_str_free(&w->norm[0]);
    tok_str_free(&w->norm[1]);
    words_free(&w->words[0]);
    words_free(&w->words[1]);
    tok_cpbuf_free(&w->cps);
    free(w->spans);
    pcre2_match_data_free((pcre2_match_data *)w->match);
    free(w->ids);
    free(w->best);
    free(w->best_start);
    free(w->best_id);
    memset(w, 0, sizeof *w);
}

nopad_status tok_pipe_reserve_ids(tok_pipe_work *w, size_t n) {
    if (n <= w->ids_cap) return NOPAD_OK;
    size_t cap = w->ids_cap * 2 > n ? w->ids_cap * 2 : n;
    int32_t *ids = realloc(w->ids, cap * sizeof *ids);
    if (!ids) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    w->ids = ids;
    w->ids_cap = cap;
    return NOPAD_OK;
}

/* Appends a word (empty words are dropped, as HF drops empty splits). */
static nopad_status push_word(tok_words *w, const char *s, size_t n, int first) {
    if (n == 0) return NOPAD_OK;
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        size_t *start = realloc(w->start, cap * sizeof *start);
        if (start) w->start = start;
        size_t *len = realloc(w->len, cap * sizeof *len);
        if (len) w->len = len;
        uint8_t *fst = realloc(w->first, cap);
        if (fst) w->first = fst;
        if (!start || !len || !fst)
            return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        w->cap = cap;
    }
    w->start[w->n] = w->buf.len;
    w->len[w->n] = n;
    w->first[w->n] = (uint8_t)(first != 0);
    w->n++;
    return tok_str_append(&w->buf, s, n);
}

/* ---- regexes -------------------------------------------------------------------------------- */

nopad_status tok_regex_compile(const char *pattern, size_t len, const char *path, const char *where,
                               struct pcre2_real_code_8 **out) {
    /* \s and \S -> the White_Space property, inside or outside a class */
    tok_str p = {0};
    nopad_status st = tok_str_reserve(&p, len * 2 + 1);
    for (size_t i = 0; i < len && st == NOPAD_OK; i++) {
        if (pattern[i] == '\\' && i + 1 < len) {
            char c = pattern[i + 1];
            if (c == 's') st = tok_str_append(&p, "\\p{White_Space}", 15);
            else if (c == 'S') st = tok_str_append(&p, "\\P{White_Space}", 15);
            else st = tok_str_append(&p, pattern + i, 2);
            i++;
        } else {
            st = tok_str_append(&p, pattern + i, 1);
        }
    }
    if (st != NOPAD_OK) {
        tok_str_free(&p);
        return st;
    }
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)p.data, p.len, PCRE2_UTF | PCRE2_UCP, &err, &off,
                                   NULL);
    tok_str_free(&p);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: %s: regex \"%.80s\" is not supported by PCRE2 (%s)", where,
                               path, pattern, (const char *)msg);
    }
    /* JIT-compiled matching is several times faster; where the platform has no JIT the
     * interpreter runs the same pattern */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = (struct pcre2_real_code_8 *)re;
    return NOPAD_OK;
}

/* ---- normalizer steps ----------------------------------------------------------------------- */


/* SentencePiece's NMT normalization as HF's Nmt normalizer does it: some controls go, some
 * spaces become ' '. Returns 0 to drop c. */
static int nmt_map(uint32_t c, uint32_t *out) {
    if ((c >= 0x0001 && c <= 0x0008) || c == 0x000B || (c >= 0x000E && c <= 0x001F) ||
        c == 0x007F || c == 0x008F || c == 0x009F)
        return 0;
    if (c == 0x0009 || c == 0x000A || c == 0x000C || c == 0x000D || c == 0x1680 ||
        (c >= 0x200B && c <= 0x200F) || c == 0x2028 || c == 0x2029 || c == 0x2581 ||
        c == 0xFEFF || c == 0xFFFD)
        c = ' ';
    *out = c;
    return 1;
}

static nopad_status put_cp(tok_str *out, uint32_t c) {
    nopad_status st = tok_str_reserve(out, out->len + 4);
    if (st == NOPAD_OK) out->len += (size_t)tok_utf8_put(c, out->data + out->len);
    return st;
}

/* NFC, NFD, NFKC, NFKD as HF's unicode-normalization tables give them (tokenizer_unicode.c
 * applies where they differ from utf8proc's newer data): full decomposition, canonical ordering
 * of marks by combining class (stable), then for the composed forms the canonical composition
 * algorithm (a mark composes with the last starter unless a mark of equal or higher class, or a
 * starter, stands between them). */
static nopad_status unicode_form(tok_norm_kind kind, tok_pipe_work *w, const char *s, size_t n,
                                 tok_str *out) {
    size_t ascii = 0;
    while (ascii < n && (unsigned char)s[ascii] < 0x80) ascii++;
    if (ascii == n) return tok_str_append(out, s, n); /* ASCII is in every normal form */
    int compat = kind == TOK_NORM_NFKC || kind == TOK_NORM_NFKD;
    int compose = kind == TOK_NORM_NFC || kind == TOK_NORM_NFKC;
    tok_cpbuf *cp = &w->cps;
    cp->len = 0;
    nopad_status st = NOPAD_OK;
    for (size_t pos = 0; pos < n && st == NOPAD_OK;) {
        uint32_t dec[TOK_MAX_COMPAT_DECOMP];
        int k = tok_decompose(tok_utf8_next(s, &pos), compat, dec, TOK_MAX_COMPAT_DECOMP);
        st = tok_cpbuf_reserve(cp, (size_t)k);
        for (int i = 0; i < k && st == NOPAD_OK; i++) {
            /* canonical ordering: a mark moves before the marks of higher class just before it */
            int ccc = tok_combining_class(dec[i]);
            size_t j = cp->len++;
            if (ccc)
                for (; j > 0 && tok_combining_class(cp->data[j - 1]) > ccc; j--)
                    cp->data[j] = cp->data[j - 1];
            cp->data[j] = dec[i];
        }
    }
    if (st != NOPAD_OK) return st;
    size_t len = cp->len;
    if (compose && len > 0) {
        size_t starter = SIZE_MAX, k = 0;
        int last_ccc = -1; /* class of the last character kept after the starter; -1: none */
        for (size_t i = 0; i < len; i++) {
            uint32_t c = cp->data[i], composite;
            int ccc = tok_combining_class(c);
            if (starter != SIZE_MAX && c >= 0x300 && (last_ccc == -1 || (last_ccc != 0 && last_ccc < ccc)) &&
                tok_compose_pair(cp->data[starter], c, &composite)) {
                cp->data[starter] = composite;
                continue;
            }
            if (ccc == 0) {
                starter = k;
                last_ccc = -1;
            } else {
                last_ccc = ccc;
            }
            cp->data[k++] = c;
        }
        len = k;
    }
    for (size_t i = 0; i < len && st == NOPAD_OK; i++) st = put_cp(out, cp->data[i]);
    return st;
}

static size_t utf8_len_at(const char *s, size_t pos) {
    unsigned char b = (unsigned char)s[pos];
    return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

/* Finds the next match of a literal or a regex in s[from..n): *ms, *me; 0 when none. As HF's
 * patterns (a String is an escaped regex, run by Oniguruma's find_iter): an empty literal matches
 * at every character boundary, the two ends included; an empty input has no match at all; and an
 * empty match where the previous match ended (last_end; SIZE_MAX: none yet) is skipped. */
static int find_next(const char *lit, size_t lit_len, const pcre2_code *re, tok_pipe_work *w,
                     const char *s, size_t n, size_t from, size_t last_end, size_t *ms,
                     size_t *me, nopad_status *st) {
    if (n == 0 || from > n) return 0;
    if (!re && lit_len == 0) {
        *ms = *me = from;
        return 1;
    }
    while (re) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK,
                             (pcre2_match_data *)w->match, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (rc < 0) {
            *st = nopad_set_error(NOPAD_ERR_INTERNAL, "tokenizer: regex match failed (PCRE2 %d)",
                                  rc);
            return 0;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer((pcre2_match_data *)w->match);
        if (ov[0] == ov[1] && ov[1] == last_end) { /* try again one character further */
            if (ov[1] >= n) return 0;
            from = ov[1] + utf8_len_at(s, ov[1]);
            continue;
        }
        *ms = ov[0];
        *me = ov[1];
        return 1;
    }
    if (from >= n || n - from < lit_len) return 0;
    const char *p = memmem(s + from, n - from, lit, lit_len);
    if (!p) return 0;
    *ms = (size_t)(p - s);
    *me = *ms + lit_len;
    return 1;
}

static nopad_status ensure_match_data(tok_pipe_work *w) {
    if (w->match) return NOPAD_OK;
    /* room for the whole-match pair; no pattern of ours needs its groups */
    w->match = pcre2_match_data_create(16, NULL);
    return w->match ? NOPAD_OK
                    : nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
}

/* Replace: every non-overlapping match, left to right, becomes content. */
static nopad_status norm_replace(const tok_norm_step *step, tok_pipe_work *w, const char *s,
                                 size_t n, tok_str *out) {
    nopad_status st = step->re ? ensure_match_data(w) : NOPAD_OK;
    size_t pos = 0, from = 0, last_end = SIZE_MAX, ms, me;
    while (st == NOPAD_OK && find_next(step->pattern, step->pattern_len,
                                       (const pcre2_code *)step->re, w, s, n, from, last_end, &ms,
                                       &me, &st)) {
        st = tok_str_append(out, s + pos, ms - pos);
        if (st == NOPAD_OK) st = tok_str_append(out, step->content, step->content_len);
        pos = last_end = me;
        from = me > ms ? me : (me < n ? me + utf8_len_at(s, me) : n + 1);
        if (me == ms && me < n) { /* an empty match: keep the character it stood before */
            st = st == NOPAD_OK ? tok_str_append(out, s + me, utf8_len_at(s, me)) : st;
            pos = me + utf8_len_at(s, me);
        }
    }
    if (st == NOPAD_OK && pos < n) st = tok_str_append(out, s + pos, n - pos);
    return st;
}

static nopad_status norm_step(const tok_norm_step *step, tok_pipe_work *w, const char *s, size_t n,
                              tok_str *out) {
    nopad_status st = NOPAD_OK;
    out->len = 0;
    switch (step->kind) {
    case TOK_NORM_BERT:
        w->cps.len = 0;
        st = tok_normalize(&step->bert, s, n, &w->cps);
        for (size_t i = 0; i < w->cps.len && st == NOPAD_OK; i++) st = put_cp(out, w->cps.data[i]);
        return st;
    case TOK_NORM_NFC:
    case TOK_NORM_NFD:
    case TOK_NORM_NFKC:
    case TOK_NORM_NFKD:
        return unicode_form(step->kind, w, s, n, out);
    case TOK_NORM_LOWERCASE:
        for (size_t pos = 0; pos < n && st == NOPAD_OK;) {
            uint32_t lower[2];
            int k = tok_lowercase(tok_utf8_next(s, &pos), lower);
            for (int i = 0; i < k && st == NOPAD_OK; i++) st = put_cp(out, lower[i]);
        }
        return st;
    case TOK_NORM_STRIP: {
        size_t a = 0, b = n;
        while (step->left && a < b) {
            size_t q = a;
            if (!tok_is_whitespace(tok_utf8_next(s, &q))) break;
            a = q;
        }
        while (step->right && b > a) {
            size_t p = b - 1;
            while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
            size_t q = p;
            if (!tok_is_whitespace(tok_utf8_next(s, &q))) break;
            b = p;
        }
        return tok_str_append(out, s + a, b - a);
    }
    case TOK_NORM_STRIP_ACCENTS:
        for (size_t pos = 0; pos < n && st == NOPAD_OK;) {
            size_t p0 = pos;
            if (!tok_is_combining_mark(tok_utf8_next(s, &pos)))
                st = tok_str_append(out, s + p0, pos - p0);
        }
        return st;
    case TOK_NORM_REPLACE:
        return norm_replace(step, w, s, n, out);
    case TOK_NORM_PREPEND:
        if (n > 0) st = tok_str_append(out, step->content, step->content_len);
        return st == NOPAD_OK ? tok_str_append(out, s, n) : st;
    case TOK_NORM_PRECOMPILED:
        if (!step->charsmap) return tok_str_append(out, s, n);
        return tok_precompiled_normalize(step->charsmap, s, n, out);
    case TOK_NORM_NMT:
        for (size_t pos = 0; pos < n && st == NOPAD_OK;) {
            uint32_t c;
            if (nmt_map(tok_utf8_next(s, &pos), &c)) st = put_cp(out, c);
        }
        return st;
    }
    return nopad_set_error(NOPAD_ERR_INTERNAL, "tokenizer: unknown normalizer step");
}

nopad_status tok_pipeline_normalize(const nopad_tokenizer *t, tok_pipe_work *w, const char *s,
                                    size_t n, tok_str *out) {
    const char *cur = s;
    size_t cur_len = n;
    int which = 0;
    for (int32_t i = 0; i < t->n_norm_steps; i++) {
        tok_str *dst = &w->norm[which];
        nopad_status st = norm_step(&t->norm_steps[i], w, cur, cur_len, dst);
        if (st != NOPAD_OK) return st;
        cur = dst->data;
        cur_len = dst->len;
        which ^= 1;
    }
    out->len = 0;
    return tok_str_append(out, cur, cur_len);
}

/* ---- pre-tokenizer steps -------------------------------------------------------------------- */

static nopad_status push_span(tok_pipe_work *w, size_t *n_spans, size_t a, size_t b, int match) {
    if (3 * (*n_spans + 1) > w->spans_cap) {
        size_t cap = w->spans_cap ? 2 * w->spans_cap : 96;
        size_t *sp = realloc(w->spans, cap * sizeof *sp);
        if (!sp) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        w->spans = sp;
        w->spans_cap = cap;
    }
    size_t *sp = w->spans + 3 * (*n_spans)++;
    sp[0] = a;
    sp[1] = b;
    sp[2] = (size_t)match;
    return NOPAD_OK;
}

typedef int (*char_pred)(const tok_pre_step *step, uint32_t c);

static int pred_whitespace(const tok_pre_step *step, uint32_t c) { return tok_is_whitespace(c); }
static int pred_punct(const tok_pre_step *step, uint32_t c) { return tok_is_punct(c); }
/* Rust's char::is_numeric (Nd, Nl, No), which HF's Digits splits on */
static int pred_digit(const tok_pre_step *step, uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* HF's find_matches: the spans of s[0..n) as (start, end, is_match), covering it in order. A
 * character predicate gives one match per matching character; a literal or a regex gives its
 * non-overlapping matches. */
static nopad_status find_spans(const tok_pre_step *step, char_pred pred, const char *lit,
                               size_t lit_len, const pcre2_code *re, tok_pipe_work *w,
                               const char *s, size_t n, size_t *n_spans) {
    *n_spans = 0;
    nopad_status st = NOPAD_OK;
    if (pred) {
        size_t last = 0;
        for (size_t pos = 0; pos < n && st == NOPAD_OK;) {
            size_t p0 = pos;
            uint32_t c = tok_utf8_next(s, &pos);
            if (!pred(step, c)) continue;
            if (last < p0) st = push_span(w, n_spans, last, p0, 0);
            if (st == NOPAD_OK) st = push_span(w, n_spans, p0, pos, 1);
            last = pos;
        }
        if (st == NOPAD_OK && last < n) st = push_span(w, n_spans, last, n, 0);
        return st;
    }
    if (re && (st = ensure_match_data(w)) != NOPAD_OK) return st;
    size_t prev = 0, from = 0, last_end = SIZE_MAX, ms, me;
    while (find_next(lit, lit_len, re, w, s, n, from, last_end, &ms, &me, &st)) {
        if (prev != ms) st = push_span(w, n_spans, prev, ms, 0);
        if (st == NOPAD_OK) st = push_span(w, n_spans, ms, me, 1);
        if (st != NOPAD_OK) return st;
        prev = last_end = me;
        from = me > ms ? me : (me < n ? me + utf8_len_at(s, me) : n + 1);
    }
    if (st == NOPAD_OK && prev != n) st = push_span(w, n_spans, prev, n, 0);
    return st;
}

/* HF's NormalizedString::split: applies the behavior to the spans and pushes the words. */
static nopad_status split_spans(tok_pipe_work *w, size_t n_spans, tok_split_behavior behavior,
                                int invert, const char *s, int first, tok_words *out) {
    size_t *sp = w->spans;
    if (invert)
        for (size_t i = 0; i < n_spans; i++) sp[3 * i + 2] = !sp[3 * i + 2];
    /* merge in place: k spans of (start, end, remove) */
    size_t k = 0;
    int prev_match = 0;
    if (behavior == TOK_SPLIT_MERGED_WITH_NEXT) {
        /* walks backwards: a match joins the span after it */
        size_t kk = n_spans;
        for (size_t ii = n_spans; ii-- > 0;) {
            size_t a = sp[3 * ii], b = sp[3 * ii + 1];
            int m = (int)sp[3 * ii + 2];
            if (m && !prev_match && kk < n_spans) {
                sp[3 * kk] = a;
            } else {
                kk--;
                sp[3 * kk] = a;
                sp[3 * kk + 1] = b;
                sp[3 * kk + 2] = 0;
            }
            prev_match = m;
        }
        /* spans kk..n_spans in order */
        for (size_t i = kk; i < n_spans; i++) {
            nopad_status st = push_word(out, s + sp[3 * i], sp[3 * i + 1] - sp[3 * i],
                                        first && sp[3 * i] == 0);
            if (st != NOPAD_OK) return st;
        }
        return NOPAD_OK;
    }
    for (size_t i = 0; i < n_spans; i++) {
        size_t a = sp[3 * i], b = sp[3 * i + 1];
        int m = (int)sp[3 * i + 2];
        int join = 0, remove = 0;
        switch (behavior) {
        case TOK_SPLIT_REMOVED: remove = m; break;
        case TOK_SPLIT_ISOLATED: break;
        case TOK_SPLIT_CONTIGUOUS: join = k > 0 && m == prev_match; break;
        case TOK_SPLIT_MERGED_WITH_PREVIOUS: join = k > 0 && m && !prev_match; break;
        case TOK_SPLIT_MERGED_WITH_NEXT: break;
        }
        if (join) {
            sp[3 * (k - 1) + 1] = b;
        } else {
            sp[3 * k] = a;
            sp[3 * k + 1] = b;
            sp[3 * k + 2] = (size_t)remove;
            k++;
        }
        prev_match = m;
    }
    for (size_t i = 0; i < k; i++) {
        if (sp[3 * i + 2]) continue;
        nopad_status st = push_word(out, s + sp[3 * i], sp[3 * i + 1] - sp[3 * i],
                                    first && sp[3 * i] == 0);
        if (st != NOPAD_OK) return st;
    }
    return NOPAD_OK;
}

/* \w+|[^\w\s]+ kept, whitespace removed (HF's Whitespace pre-tokenizer). */
static nopad_status split_whitespace_regex(const char *s, size_t n, int first, tok_words *out) {
    size_t start = 0;
    int cls_prev = 0;
    for (size_t pos = 0; pos <= n;) {
        size_t p0 = pos;
        int cls = 0;
        if (pos < n) {
            uint32_t c = tok_utf8_next(s, &pos);
            cls = tok_is_whitespace(c) ? 0 : tok_is_word(c) ? 1 : 2;
        } else {
            pos++;
        }
        if (cls != cls_prev) {
            if (cls_prev) {
                nopad_status st = push_word(out, s + start, p0 - start, first && start == 0);
                if (st != NOPAD_OK) return st;
            }
            start = p0;
        }
        cls_prev = cls;
    }
    return NOPAD_OK;
}

static nopad_status pre_step(const tok_pre_step *step, tok_pipe_work *w, const char *s, size_t n,
                             int first, tok_words *out) {
    size_t n_spans = 0;
    nopad_status st = NOPAD_OK;
    switch (step->kind) {
    case TOK_PS_WHITESPACE_SPLIT:
        st = find_spans(step, pred_whitespace, NULL, 0, NULL, w, s, n, &n_spans);
        return st == NOPAD_OK ? split_spans(w, n_spans, TOK_SPLIT_REMOVED, 0, s, first, out) : st;
    case TOK_PS_WHITESPACE:
        return split_whitespace_regex(s, n, first, out);
    case TOK_PS_BERT: {
        /* whitespace removed, then each punctuation character isolated */
        tok_words tmp = {0};
        st = find_spans(step, pred_whitespace, NULL, 0, NULL, w, s, n, &n_spans);
        if (st == NOPAD_OK) st = split_spans(w, n_spans, TOK_SPLIT_REMOVED, 0, s, first, &tmp);
        for (size_t i = 0; i < tmp.n && st == NOPAD_OK; i++) {
            const char *ws = tmp.buf.data + tmp.start[i];
            st = find_spans(step, pred_punct, NULL, 0, NULL, w, ws, tmp.len[i], &n_spans);
            if (st == NOPAD_OK)
                st = split_spans(w, n_spans, TOK_SPLIT_ISOLATED, 0, ws, tmp.first[i], out);
        }
        words_free(&tmp);
        return st;
    }
    case TOK_PS_PUNCTUATION:
        st = find_spans(step, pred_punct, NULL, 0, NULL, w, s, n, &n_spans);
        return st == NOPAD_OK ? split_spans(w, n_spans, step->behavior, 0, s, first, out) : st;
    case TOK_PS_DIGITS:
        st = find_spans(step, pred_digit, NULL, 0, NULL, w, s, n, &n_spans);
        return st == NOPAD_OK ? split_spans(w, n_spans,
                                            step->individual_digits ? TOK_SPLIT_ISOLATED
                                                                    : TOK_SPLIT_CONTIGUOUS,
                                            0, s, first, out)
                              : st;
    case TOK_PS_SPLIT:
        st = find_spans(step, NULL, step->pattern, step->pattern_len, (const pcre2_code *)step->re,
                        w, s, n, &n_spans);
        return st == NOPAD_OK ? split_spans(w, n_spans, step->behavior, step->invert, s, first, out)
                              : st;
    case TOK_PS_CHAR_DELIMITER:
        st = find_spans(step, NULL, step->ch, (size_t)step->ch_len, NULL, w, s, n, &n_spans);
        return st == NOPAD_OK ? split_spans(w, n_spans, TOK_SPLIT_REMOVED, 0, s, first, out) : st;
    case TOK_PS_METASPACE: {
        /* ' ' -> replacement, maybe a leading replacement, then split before each replacement */
        tok_str *r = &w->norm[0];
        r->len = 0;
        int starts = (size_t)step->ch_len <= n && memcmp(s, step->ch, (size_t)step->ch_len) == 0;
        if (!starts && n > 0 && s[0] == ' ') starts = 1; /* the space becomes the replacement */
        if (!starts && (step->prepend_scheme == 0 || (step->prepend_scheme == 1 && first)))
            st = tok_str_append(r, step->ch, (size_t)step->ch_len);
        for (size_t i = 0; i < n && st == NOPAD_OK; i++)
            st = s[i] == ' ' ? tok_str_append(r, step->ch, (size_t)step->ch_len)
                             : tok_str_append(r, s + i, 1);
        if (st != NOPAD_OK) return st;
        if (!step->split) return push_word(out, r->data, r->len, first);
        st = find_spans(step, NULL, step->ch, (size_t)step->ch_len, NULL, w, r->data, r->len,
                        &n_spans);
        return st == NOPAD_OK ? split_spans(w, n_spans, TOK_SPLIT_MERGED_WITH_NEXT, 0, r->data,
                                            first, out)
                              : st;
    }
    case TOK_PS_BYTELEVEL: {
        /* a leading space when asked, the GPT-2 split, then each byte as its character */
        tok_str *r = &w->norm[0];
        r->len = 0;
        if (step->add_prefix_space && (n == 0 || s[0] != ' ')) st = tok_str_append(r, " ", 1);
        if (st == NOPAD_OK) st = tok_str_append(r, s, n);
        if (st != NOPAD_OK) return st;
        if (step->re) {
            st = find_spans(step, NULL, NULL, 0, (const pcre2_code *)step->re, w, r->data, r->len,
                            &n_spans);
        } else {
            n_spans = 0;
            st = r->len ? push_span(w, &n_spans, 0, r->len, 0) : NOPAD_OK;
        }
        tok_str *m = &w->norm[1];
        for (size_t i = 0; i < n_spans && st == NOPAD_OK; i++) {
            m->len = 0;
            size_t a = w->spans[3 * i], e = w->spans[3 * i + 1];
            st = tok_str_reserve(m, 2 * (e - a)); /* each byte is one or two bytes of UTF-8 */
            for (size_t k = a; k < e && st == NOPAD_OK; k++) {
                uint8_t b = (uint8_t)r->data[k];
                memcpy(m->data + m->len, step->byte_char[b], 2);
                m->len += step->byte_char_len[b];
            }
            if (st == NOPAD_OK) st = push_word(out, m->data, m->len, first && w->spans[3 * i] == 0);
        }
        return st;
    }
    }
    return nopad_set_error(NOPAD_ERR_INTERNAL, "tokenizer: unknown pre-tokenizer step");
}

nopad_status tok_pipeline_pre_tokenize(const nopad_tokenizer *t, tok_pipe_work *w, const char *s,
                                       size_t n, int at_start, tok_word_fn fn, void *ctx) {
    tok_words *cur = &w->words[0], *next = &w->words[1];
    cur->n = 0;
    cur->buf.len = 0;
    nopad_status st = push_word(cur, s, n, at_start);
    for (int32_t k = 0; k < t->n_pre_steps && st == NOPAD_OK; k++) {
        next->n = 0;
        next->buf.len = 0;
        for (size_t i = 0; i < cur->n && st == NOPAD_OK; i++)
            st = pre_step(&t->pre_steps[k], w, cur->buf.data + cur->start[i], cur->len[i],
                          cur->first[i], next);
        tok_words *tmp = cur;
        cur = next;
        next = tmp;
    }
    int stop = 0;
    for (size_t i = 0; i < cur->n && st == NOPAD_OK && !stop; i++)
        st = fn(ctx, cur->buf.data + cur->start[i], cur->len[i], &stop);
    return st;
}

/* ---- loading -------------------------------------------------------------------------------- */

static const char *type_of(const cJSON *obj) {
    const cJSON *type = tok_json_field(obj, "type");
    return cJSON_IsString(type) && type->valuestring ? type->valuestring : NULL;
}

static char *dup_bytes(const char *s, size_t len) {
    char *d = malloc(len + 1);
    if (d) {
        if (len) memcpy(d, s, len);
        d[len] = '\0';
    }
    return d;
}

static nopad_status get_str(const cJSON *obj, const char *key, const char *path, const char *where,
                            const char **out) {
    const cJSON *item = tok_json_field(obj, key);
    if (!cJSON_IsString(item) || !item->valuestring)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s.%s must be a string", where, path, key);
    size_t len = strlen(item->valuestring);
    if (tok_utf8_check(item->valuestring, len) != len)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s.%s is not valid UTF-8", where, path, key);
    *out = item->valuestring;
    return NOPAD_OK;
}

/* {"String": "..."} or {"Regex": "..."}: a literal or a compiled regex. */
static nopad_status get_pattern(const cJSON *obj, const char *path, const char *where, char **lit,
                                size_t *lit_len, struct pcre2_real_code_8 **re) {
    const cJSON *pat = tok_json_field(obj, "pattern");
    const cJSON *str = cJSON_IsObject(pat) ? tok_json_field(pat, "String") : NULL;
    const cJSON *rx = cJSON_IsObject(pat) ? tok_json_field(pat, "Regex") : NULL;
    if (cJSON_IsString(str) && str->valuestring) {
        *lit_len = strlen(str->valuestring);
        *lit = dup_bytes(str->valuestring, *lit_len);
        return *lit ? NOPAD_OK
                    : nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", where);
    }
    if (cJSON_IsString(rx) && rx->valuestring) {
        char sub[96];
        snprintf(sub, sizeof sub, "%s.pattern.Regex", path);
        return tok_regex_compile(rx->valuestring, strlen(rx->valuestring), sub, where, re);
    }
    return nopad_set_error(NOPAD_ERR_FORMAT,
                           "%s: %s.pattern must be {\"String\": ...} or {\"Regex\": ...}", where,
                           path);
}

static nopad_status add_norm(nopad_tokenizer *t, tok_norm_step **out, const char *where) {
    tok_norm_step *steps = realloc(t->norm_steps, (size_t)(t->n_norm_steps + 1) * sizeof *steps);
    if (!steps) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", where);
    t->norm_steps = steps;
    *out = &steps[t->n_norm_steps++];
    memset(*out, 0, sizeof **out);
    return NOPAD_OK;
}

static nopad_status load_norm(nopad_tokenizer *t, const cJSON *n, const char *path,
                              const char *where, int depth) {
    if (!cJSON_IsObject(n))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s must be an object", where, path);
    const char *type = type_of(n);
    if (!type) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: missing field %s.type", where, path);
    nopad_status st = NOPAD_OK;
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = tok_json_field(n, "normalizers");
        if (!cJSON_IsArray(list))
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s.normalizers must be an array", where,
                                   path);
        if (depth > 8)
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: %s: Sequence nested too deeply",
                                   where, path);
        int i = 0;
        const cJSON *item;
        cJSON_ArrayForEach(item, list) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.normalizers[%d]", path, i++);
            st = load_norm(t, item, sub, where, depth + 1);
            if (st != NOPAD_OK) return st;
        }
        return NOPAD_OK;
    }
    static const struct { const char *name; tok_norm_kind kind; } simple[] = {
        {"NFC", TOK_NORM_NFC},           {"NFD", TOK_NORM_NFD},
        {"NFKC", TOK_NORM_NFKC},         {"NFKD", TOK_NORM_NFKD},
        {"Lowercase", TOK_NORM_LOWERCASE}, {"StripAccents", TOK_NORM_STRIP_ACCENTS},
        {"Nmt", TOK_NORM_NMT},
    };
    tok_norm_step *step = NULL;
    for (size_t k = 0; k < sizeof simple / sizeof simple[0]; k++) {
        if (strcmp(type, simple[k].name) != 0) continue;
        st = add_norm(t, &step, where);
        if (st == NOPAD_OK) step->kind = simple[k].kind;
        return st;
    }
    char sub[160];
    if (strcmp(type, "BertNormalizer") == 0) {
        st = add_norm(t, &step, where);
        if (st != NOPAD_OK) return st;
        step->kind = TOK_NORM_BERT;
        tok_normalizer *nm = &step->bert;
        nm->enabled = 1;
        snprintf(sub, sizeof sub, "%s.clean_text", path);
        st = tok_json_get_bool(n, "clean_text", 1, sub, where, &nm->clean_text);
        snprintf(sub, sizeof sub, "%s.handle_chinese_chars", path);
        if (st == NOPAD_OK)
            st = tok_json_get_bool(n, "handle_chinese_chars", 1, sub, where,
                                   &nm->handle_chinese_chars);
        snprintf(sub, sizeof sub, "%s.lowercase", path);
        if (st == NOPAD_OK) st = tok_json_get_bool(n, "lowercase", 1, sub, where, &nm->lowercase);
        snprintf(sub, sizeof sub, "%s.strip_accents", path);
        if (st == NOPAD_OK)
            st = tok_json_get_bool(n, "strip_accents", nm->lowercase, sub, where,
                                   &nm->strip_accents);
        return st;
    }
    if (strcmp(type, "Strip") == 0) {
        st = add_norm(t, &step, where);
        if (st != NOPAD_OK) return st;
        step->kind = TOK_NORM_STRIP;
        snprintf(sub, sizeof sub, "%s.strip_left", path);
        st = tok_json_get_bool(n, "strip_left", 1, sub, where, &step->left);
        snprintf(sub, sizeof sub, "%s.strip_right", path);
        if (st == NOPAD_OK) st = tok_json_get_bool(n, "strip_right", 1, sub, where, &step->right);
        return st;
    }
    if (strcmp(type, "Replace") == 0 || strcmp(type, "Prepend") == 0) {
        int replace = type[0] == 'R';
        const char *content = NULL;
        st = get_str(n, replace ? "content" : "prepend", path, where, &content);
        if (st == NOPAD_OK) st = add_norm(t, &step, where);
        if (st != NOPAD_OK) return st;
        step->kind = replace ? TOK_NORM_REPLACE : TOK_NORM_PREPEND;
        step->content_len = strlen(content);
        step->content = dup_bytes(content, step->content_len);
        if (!step->content) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", where);
        if (replace) st = get_pattern(n, path, where, &step->pattern, &step->pattern_len, &step->re);
        return st;
    }
    if (strcmp(type, "Precompiled") == 0) {
        const cJSON *map = tok_json_field(n, "precompiled_charsmap");
        st = add_norm(t, &step, where);
        if (st != NOPAD_OK) return st;
        step->kind = TOK_NORM_PRECOMPILED;
        if (!map || cJSON_IsNull(map)) return NOPAD_OK; /* HF: no charsmap, no change */
        if (!cJSON_IsString(map) || !map->valuestring)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: %s.precompiled_charsmap must be a base64 string", where,
                                   path);
        if (map->valuestring[0] == '\0') return NOPAD_OK;
        return tok_precompiled_load(map->valuestring, where, &step->charsmap);
    }
    return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                           "%s: %s type \"%s\" is not supported (BertNormalizer, NFC, NFD, NFKC, "
                           "NFKD, Lowercase, Strip, StripAccents, Replace, Prepend, Precompiled, "
                           "Nmt, Sequence)",
                           where, path, type);
}

nopad_status tok_pipeline_load_normalizer(nopad_tokenizer *t, const cJSON *n, const char *where) {
    if (!n || cJSON_IsNull(n)) return NOPAD_OK;
    return load_norm(t, n, "normalizer", where, 0);
}

static nopad_status add_pre(nopad_tokenizer *t, tok_pre_step **out, const char *where) {
    tok_pre_step *steps = realloc(t->pre_steps, (size_t)(t->n_pre_steps + 1) * sizeof *steps);
    if (!steps) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", where);
    t->pre_steps = steps;
    *out = &steps[t->n_pre_steps++];
    memset(*out, 0, sizeof **out);
    return NOPAD_OK;
}

static nopad_status get_behavior(const cJSON *p, const char *path, const char *where,
                                 tok_split_behavior dflt, tok_split_behavior *out) {
    const cJSON *b = tok_json_field(p, "behavior");
    *out = dflt;
    if (!b || cJSON_IsNull(b)) return NOPAD_OK;
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    for (int k = 0; k < 5 && cJSON_IsString(b); k++)
        if (strcmp(b->valuestring, names[k]) == 0) {
            *out = (tok_split_behavior)k;
            return NOPAD_OK;
        }
    return nopad_set_error(NOPAD_ERR_FORMAT,
                           "%s: %s.behavior must be Removed, Isolated, MergedWithPrevious, "
                           "MergedWithNext or Contiguous",
                           where, path);
}

/* One character given as a string (Metaspace's replacement, CharDelimiterSplit's delimiter). */
static nopad_status get_char(const cJSON *p, const char *key, const char *path, const char *where,
                             tok_pre_step *step) {
    const char *s = NULL;
    nopad_status st = get_str(p, key, path, where, &s);
    if (st != NOPAD_OK) return st;
    size_t len = strlen(s), pos = 0;
    if (len == 0 || (tok_utf8_next(s, &pos), pos != len))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s.%s must be one character", where, path,
                               key);
    memcpy(step->ch, s, len);
    step->ch_len = (int)len;
    return NOPAD_OK;
}

static nopad_status load_pre(nopad_tokenizer *t, const cJSON *p, const char *path,
                             const char *where, int depth) {
    if (!cJSON_IsObject(p))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s must be an object", where, path);
    const char *type = type_of(p);
    if (!type) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: missing field %s.type", where, path);
    nopad_status st = NOPAD_OK;
    char sub[160];
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = tok_json_field(p, "pretokenizers");
        if (!cJSON_IsArray(list))
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s.pretokenizers must be an array",
                                   where, path);
        if (depth > 8)
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: %s: Sequence nested too deeply",
                                   where, path);
        int i = 0;
        const cJSON *item;
        cJSON_ArrayForEach(item, list) {
            snprintf(sub, sizeof sub, "%s.pretokenizers[%d]", path, i++);
            st = load_pre(t, item, sub, where, depth + 1);
            if (st != NOPAD_OK) return st;
        }
        return NOPAD_OK;
    }
    tok_pre_step *step = NULL;
    static const struct { const char *name; tok_pre_kind kind; } simple[] = {
        {"WhitespaceSplit", TOK_PS_WHITESPACE_SPLIT},
        {"Whitespace", TOK_PS_WHITESPACE},
        {"BertPreTokenizer", TOK_PS_BERT},
    };
    for (size_t k = 0; k < sizeof simple / sizeof simple[0]; k++) {
        if (strcmp(type, simple[k].name) != 0) continue;
        st = add_pre(t, &step, where);
        if (st == NOPAD_OK) step->kind = simple[k].kind;
        return st;
    }
    if (strcmp(type, "Punctuation") == 0) {
        st = add_pre(t, &step, where);
        if (st != NOPAD_OK) return st;
        step->kind = TOK_PS_PUNCTUATION;
        return get_behavior(p, path, where, TOK_SPLIT_ISOLATED, &step->behavior);
    }
    if (strcmp(type, "Digits") == 0) {
        st = add_pre(t, &step, where);
        if (st != NOPAD_OK) return st;
        step->kind = TOK_PS_DIGITS;
        snprintf(sub, sizeof sub, "%s.individual_digits", path);
        return tok_json_get_bool(p, "individual_digits", 0, sub, where, &step->individual_digits);
    }
    if (strcmp(type, "Split") == 0) {
        st = add_pre(t, &step, where);
        if (st != NOPAD_OK) return st;
        step->kind = TOK_PS_SPLIT;
        st = get_behavior(p, path, where, TOK_SPLIT_ISOLATED, &step->behavior);
        snprintf(sub, sizeof sub, "%s.invert", path);
        if (st == NOPAD_OK) st = tok_json_get_bool(p, "invert", 0, sub, where, &step->invert);
        if (st == NOPAD_OK)
            st = get_pattern(p, path, where, &step->pattern, &step->pattern_len, &step->re);
        return st;
    }
    if (strcmp(type, "CharDelimiterSplit") == 0) {
        st = add_pre(t, &step, where);
        if (st != NOPAD_OK) return st;
        step->kind = TOK_PS_CHAR_DELIMITER;
        return get_char(p, "delimiter", path, where, step);
    }
    if (strcmp(type, "Metaspace") == 0) {
        st = add_pre(t, &step, where);
        if (st != NOPAD_OK) return st;
        step->kind = TOK_PS_METASPACE;
        st = get_char(p, "replacement", path, where, step);
        snprintf(sub, sizeof sub, "%s.split", path);
        if (st == NOPAD_OK) st = tok_json_get_bool(p, "split", 1, sub, where, &step->split);
        if (st != NOPAD_OK) return st;
        /* prepend_scheme (newer files) or add_prefix_space (older ones: true means always) */
        const cJSON *scheme = tok_json_field(p, "prepend_scheme");
        if (cJSON_IsString(scheme)) {
            const char *v = scheme->valuestring;
            step->prepend_scheme = strcmp(v, "always") == 0 ? 0
                                   : strcmp(v, "first") == 0 ? 1
                                   : strcmp(v, "never") == 0 ? 2 : -1;
            if (step->prepend_scheme < 0)
                return nopad_set_error(NOPAD_ERR_FORMAT,
                                       "%s: %s.prepend_scheme must be always, first or never",
                                       where, path);
            return NOPAD_OK;
        }
        int add_prefix = 1;
        snprintf(sub, sizeof sub, "%s.add_prefix_space", path);
        st = tok_json_get_bool(p, "add_prefix_space", 1, sub, where, &add_prefix);
        step->prepend_scheme = add_prefix ? 0 : 2;
        return st;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        st = add_pre(t, &step, where);
        if (st != NOPAD_OK) return st;
        step->kind = TOK_PS_BYTELEVEL;
        tok_byte_chars(step->byte_char, step->byte_char_len);
        int use_regex = 1, trim = 0;
        snprintf(sub, sizeof sub, "%s.add_prefix_space", path);
        st = tok_json_get_bool(p, "add_prefix_space", 1, sub, where, &step->add_prefix_space);
        snprintf(sub, sizeof sub, "%s.use_regex", path);
        if (st == NOPAD_OK) st = tok_json_get_bool(p, "use_regex", 1, sub, where, &use_regex);
        snprintf(sub, sizeof sub, "%s.trim_offsets", path); /* offsets only */
        if (st == NOPAD_OK) st = tok_json_get_bool(p, "trim_offsets", 1, sub, where, &trim);
        if (st == NOPAD_OK && use_regex)
            st = tok_regex_compile(tok_gpt2_split_regex, strlen(tok_gpt2_split_regex), path, where,
                                   &step->re);
        return st;
    }
    return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                           "%s: %s type \"%s\" is not supported (WhitespaceSplit, Whitespace, "
                           "BertPreTokenizer, Punctuation, Digits, Split, CharDelimiterSplit, "
                           "Metaspace, ByteLevel, Sequence)",
                           where, path, type);
}

nopad_status tok_pipeline_load_pre_tokenizer(nopad_tokenizer *t, const cJSON *p,
                                             const char *where) {
    if (!p || cJSON_IsNull(p)) return NOPAD_OK;
    return load_pre(t, p, "pre_tokenizer", where, 0);
}

void tok_pipeline_free(nopad_tokenizer *t) {
    for (int32_t i = 0; i < t->n_norm_steps; i++) {
        tok_norm_step *s = &t->norm_steps[i];
        free(s->pattern);
        free(s->content);
        pcre2_code_free((pcre2_code *)s->re);
        tok_precompiled_free(s->charsmap);
    }
    free(t->norm_steps);
    for (int32_t i = 0; i < t->n_pre_steps; i++) {
        free(t->pre_steps[i].pattern);
        pcre2_code_free((pcre2_code *)t->pre_steps[i].re);
    }
    free(t->pre_steps);
    t->norm_steps = NULL;
    t->pre_steps = NULL;
    t->n_norm_steps = t->n_pre_steps = 0;
}

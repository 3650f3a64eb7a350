/* Decoding: ids -> text, as Hugging Face tokenizers' Tokenizer.decode does it.
 *
 *   1. each id becomes its token string: an added token's content first, else the model vocab's
 *      entry (an id with neither is dropped, as HF drops it); with skip_special_tokens the added
 *      tokens marked special are dropped;
 *   2. the tokenizer.json "decoder" runs as HF's decode_chain: each step maps the list of token
 *      strings to a new list (a Sequence runs its steps in turn), then the list is joined;
 *      without a decoder the tokens are joined by " ".
 *
 * Steps: ByteLevel (GPT-2's characters back to bytes, then bytes to text as Rust's
 * String::from_utf8_lossy does: each maximal invalid subpart becomes U+FFFD), Metaspace,
 * ByteFallback (<0xNN> runs to bytes; a run that is not valid UTF-8 gives one U+FFFD per token),
 * Fuse, Strip, Replace (String patterns), WordPiece (prefix, cleanup), BPEDecoder (suffix), CTC.
 * Another step type (or a Regex Replace) leaves the tokenizer loadable; decoding then fails with
 * NOPAD_ERR_UNSUPPORTED naming it.
 *
 * The stream (nopad_decode_stream) follows HF's DecodeStream: it keeps a short window of ids,
 * decodes the window, and returns what the window's text adds to the text of its first ids, so
 * the first-token rules of Metaspace / WordPiece / Strip see the same tokens as a whole decode.
 * Unlike HF it decodes the window "settled": without the text a later id can still change, which
 * is the bytes of an unfinished UTF-8 sequence at the end (ByteLevel) and a run of <0xNN> tokens
 * at the end (ByteFallback, where one bad byte turns the whole run into U+FFFD). That text waits
 * for the id that settles it, or for the flush, which decodes the window whole. So every chunk
 * is valid UTF-8 and the chunks plus the flush are the whole decode. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_internal.h"
#include "util/error.h"

#define REPLACEMENT_CHAR "\xEF\xBF\xBD" /* U+FFFD */

/* ---- the decoder of tokenizer.json ---------------------------------------------------------- */

typedef enum dec_kind {
    DEC_BYTE_LEVEL,
    DEC_METASPACE,
    DEC_BYTE_FALLBACK,
    DEC_FUSE,
    DEC_STRIP,
    DEC_REPLACE,
    DEC_WORDPIECE,
    DEC_BPE,
    DEC_CTC,
} dec_kind;

enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

/* One step of the decode chain (a Sequence is flattened: its steps run in turn either way). */
typedef struct dec_step {
    dec_kind kind;
    char *a;        /* Replace pattern, WordPiece prefix, BPEDecoder suffix, CTC pad_token */
    size_t a_len;
    char *b;        /* Replace content, CTC word_delimiter_token */
    size_t b_len;
    uint32_t ch;    /* Metaspace replacement, Strip content */
    int prepend;    /* Metaspace: PREPEND_* */
    size_t start, stop; /* Strip: how many leading / trailing `ch` may go */
    int cleanup;    /* WordPiece, CTC */
} dec_step;

/* id -> token: the token of id i is pool[off .. off + len) when present, NUL-terminated. */
enum { ENTRY_PRESENT = 1, ENTRY_SPECIAL = 2, ENTRY_BYTE = 4 };
typedef struct dec_entry {
    size_t off;
    uint32_t len;
    uint8_t flags; /* ENTRY_*: ENTRY_BYTE for a "<0xNN>" token (ByteFallback's runs) */
} dec_entry;

struct tok_decoder {
    int none;            /* no decoder: tokens are joined by " " */
    dec_step *steps;
    int n_steps;
    char *unsupported;   /* why decoding is refused (a step type nopad lacks), or NULL */
    int has_byte_fallback, has_byte_level, has_metaspace, has_space_replace;
    dec_entry *entries;  /* [n_entries] */
    int32_t n_entries;   /* the tokenizer's vocab_size */
    char *pool;
};

static nopad_status out_of_memory(const char *where) {
    return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory building the decoder",
                           where);
}

void tok_decoder_free(struct tok_decoder *d) {
    if (!d) return;
    for (int i = 0; i < d->n_steps; i++) {
        free(d->steps[i].a);
        free(d->steps[i].b);
    }
    free(d->steps);
    free(d->unsupported);
    free(d->entries);
    free(d->pool);
    free(d);
}

static char *dup_bytes(const char *s, size_t len) {
    char *p = malloc(len + 1);
    if (p) {
        if (len) memcpy(p, s, len);
        p[len] = '\0';
    }
    return p;
}

/* An optional string field: absent or null gives `dflt`; else a valid UTF-8 string. */
static nopad_status get_str(const cJSON *obj, const char *key, const char *dflt, const char *path,
                            const char *where, const char **out) {
    const cJSON *item = tok_json_field(obj, key);
    if (!item || cJSON_IsNull(item)) {
        *out = dflt;
        return NOPAD_OK;
    }
    if (!cJSON_IsString(item) || !item->valuestring)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s.%s must be a string", where, path, key);
    size_t len = strlen(item->valuestring);
    if (tok_utf8_check(item->valuestring, len) != len)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s.%s is not valid UTF-8", where, path, key);
    *out = item->valuestring;
    return NOPAD_OK;
}

/* A string field that holds exactly one character (Metaspace's replacement, Strip's content). */
static nopad_status get_char(const cJSON *obj, const char *key, const char *dflt, const char *path,
                             const char *where, uint32_t *out) {
    const char *s = dflt;
    nopad_status st = get_str(obj, key, dflt, path, where, &s);
    if (st != NOPAD_OK) return st;
    size_t pos = 0, len = strlen(s);
    if (len > 0) *out = tok_utf8_next(s, &pos);
    if (len == 0 || pos != len)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s.%s must be one character (got \"%.32s\")",
                               where, path, key, s);
    return NOPAD_OK;
}

/* An optional whole number >= 0 (Strip's start and stop). */
static nopad_status get_count(const cJSON *obj, const char *key, const char *path,
                              const char *where, size_t *out) {
    const cJSON *item = tok_json_field(obj, key);
    *out = 0;
    if (!item || cJSON_IsNull(item)) return NOPAD_OK;
    double v = cJSON_IsNumber(item) ? item->valuedouble : -1;
    if (!(v >= 0 && v <= 1e15) || v != (double)(int64_t)v)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s.%s must be a whole number >= 0", where,
                               path, key);
    *out = (size_t)v;
    return NOPAD_OK;
}

static nopad_status add_step(struct tok_decoder *d, const dec_step *s, const char *where) {
    dec_step *steps = realloc(d->steps, (size_t)(d->n_steps + 1) * sizeof *steps);
    if (!steps) return out_of_memory(where);
    d->steps = steps;
    steps[d->n_steps++] = *s;
    return NOPAD_OK;
}

/* Keeps the first reason decoding is not possible; the tokenizer still loads. */
static nopad_status mark_unsupported(struct tok_decoder *d, const char *where, const char *path,
                                     const char *what) {
    if (d->unsupported) return NOPAD_OK;
    char msg[512];
    snprintf(msg, sizeof msg,
             "%s: %s %s is not supported for decoding (ByteLevel, Metaspace, ByteFallback, Fuse, "
             "Strip, Replace with a String pattern, WordPiece, BPEDecoder, CTC, Sequence)",
             where, path, what);
    d->unsupported = dup_bytes(msg, strlen(msg));
    return d->unsupported ? NOPAD_OK : out_of_memory(where);
}

static nopad_status parse_step(struct tok_decoder *d, const cJSON *j, const char *path,
                               const char *where, int depth) {
    if (!cJSON_IsObject(j))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s must be an object", where, path);
    const cJSON *type_item = tok_json_field(j, "type");
    if (!cJSON_IsString(type_item) || !type_item->valuestring)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s.type must be a string", where, path);
    const char *type = type_item->valuestring;
    dec_step s = {0};
    const char *a = NULL, *b = NULL;
    nopad_status st = NOPAD_OK;
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = tok_json_field(j, "decoders");
        if (!cJSON_IsArray(list))
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s.decoders must be an array", where,
                                   path);
        if (depth >= 32)
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s: Sequences nested too deep", where,
                                   path);
        int i = 0;
        const cJSON *item;
        cJSON_ArrayForEach(item, list) {
            char sub[256];
            snprintf(sub, sizeof sub, "%.200s.decoders[%d]", path, i++);
            st = parse_step(d, item, sub, where, depth + 1);
            if (st != NOPAD_OK) return st;
        }
        return NOPAD_OK;
    } else if (strcmp(type, "ByteLevel") == 0) {
        s.kind = DEC_BYTE_LEVEL;
        d->has_byte_level = 1;
    } else if (strcmp(type, "Metaspace") == 0) {
        s.kind = DEC_METASPACE;
        d->has_metaspace = 1;
        st = get_char(j, "replacement", "\xE2\x96\x81", path, where, &s.ch);
        const char *scheme = NULL;
        if (st == NOPAD_OK) st = get_str(j, "prepend_scheme", NULL, path, where, &scheme);
        if (st != NOPAD_OK) return st;
        if (!scheme) { /* files from before prepend_scheme: add_prefix_space */
            int add = 1;
            char sub[256];
            snprintf(sub, sizeof sub, "%.200s.add_prefix_space", path);
            st = tok_json_get_bool(j, "add_prefix_space", 1, sub, where, &add);
            if (st != NOPAD_OK) return st;
            s.prepend = add ? PREPEND_ALWAYS : PREPEND_NEVER;
        } else if (strcmp(scheme, "always") == 0) {
            s.prepend = PREPEND_ALWAYS;
        } else if (strcmp(scheme, "first") == 0) {
            s.prepend = PREPEND_FIRST;
        } else if (strcmp(scheme, "never") == 0) {
            s.prepend = PREPEND_NEVER;
        } else {
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: %s.prepend_scheme \"%.32s\" is not always, first or never",
                                   where, path, scheme);
        }
    } else if (strcmp(type, "ByteFallback") == 0) {
        s.kind = DEC_BYTE_FALLBACK;
        d->has_byte_fallback = 1;
    } else if (strcmp(type, "Fuse") == 0) {
        s.kind = DEC_FUSE;
    } else if (strcmp(type, "Strip") == 0) {
        s.kind = DEC_STRIP;
        st = get_char(j, "content", " ", path, where, &s.ch);
        if (st == NOPAD_OK) st = get_count(j, "start", path, where, &s.start);
        if (st == NOPAD_OK) st = get_count(j, "stop", path, where, &s.stop);
        if (st != NOPAD_OK) return st;
    } else if (strcmp(type, "Replace") == 0) {
        s.kind = DEC_REPLACE;
        const cJSON *pattern = tok_json_field(j, "pattern");
        char sub[256];
        snprintf(sub, sizeof sub, "%.200s.pattern", path);
        if (cJSON_IsObject(pattern) && tok_json_field(pattern, "Regex"))
            return mark_unsupported(d, where, sub, "{\"Regex\": ...}");
        if (!cJSON_IsObject(pattern) || !tok_json_field(pattern, "String"))
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: %s must be {\"String\": ...} or {\"Regex\": ...}", where,
                                   sub);
        st = get_str(pattern, "String", "", sub, where, &a);
        if (st == NOPAD_OK) st = get_str(j, "content", "", path, where, &b);
        if (st != NOPAD_OK) return st;
        if (strcmp(a, "\xE2\x96\x81") == 0 && strcmp(b, " ") == 0) d->has_space_replace = 1;
    } else if (strcmp(type, "WordPiece") == 0) {
        s.kind = DEC_WORDPIECE;
        char sub[256];
        snprintf(sub, sizeof sub, "%.200s.cleanup", path);
        st = get_str(j, "prefix", "##", path, where, &a);
        if (st == NOPAD_OK) st = tok_json_get_bool(j, "cleanup", 1, sub, where, &s.cleanup);
        if (st != NOPAD_OK) return st;
    } else if (strcmp(type, "BPEDecoder") == 0) {
        s.kind = DEC_BPE;
        st = get_str(j, "suffix", "</w>", path, where, &a);
        if (st != NOPAD_OK) return st;
    } else if (strcmp(type, "CTC") == 0) {
        s.kind = DEC_CTC;
        char sub[256];
        snprintf(sub, sizeof sub, "%.200s.cleanup", path);
        st = get_str(j, "pad_token", "<pad>", path, where, &a);
        if (st == NOPAD_OK) st = get_str(j, "word_delimiter_token", "|", path, where, &b);
        if (st == NOPAD_OK) st = tok_json_get_bool(j, "cleanup", 1, sub, where, &s.cleanup);
        if (st != NOPAD_OK) return st;
    } else {
        char what[96];
        snprintf(what, sizeof what, "type \"%.64s\"", type);
        return mark_unsupported(d, where, path, what);
    }
    if (a) {
        s.a_len = strlen(a);
        if (!(s.a = dup_bytes(a, s.a_len))) return out_of_memory(where);
    }
    if (b) {
        s.b_len = strlen(b);
        if (!(s.b = dup_bytes(b, s.b_len))) {
            free(s.a);
            return out_of_memory(where);
        }
    }
    st = add_step(d, &s, where);
    if (st != NOPAD_OK) {
        free(s.a);
        free(s.b);
    }
    return st;
}

/* HF's ByteFallback test: six bytes "<0x" h h ">" where Rust's u8::from_str_radix(hh, 16) takes
 * the two middle bytes (which allows a leading '+'). */
static int byte_token(const char *s, size_t len, uint8_t *byte) {
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return 0;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int digit = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
        if (i == 3 && c == '+') continue; /* from_str_radix accepts a sign */
        if (digit < 0) return 0;
        v = v * 16 + digit;
    }
    *byte = (uint8_t)v;
    return 1;
}

/* Appends s[0..n) to pool at *len, lossy when it is not valid UTF-8 (tokenizer.json strings are
 * valid; this keeps every decode valid UTF-8 whatever the file held). */
static size_t lossy_len(const char *s, size_t n);
static size_t lossy_into(char *out, const char *s, size_t n);

/* The id -> token table: the model vocab's entries, then the added tokens over them (HF looks an
 * id up in the added tokens first). An added token with normalized set reads back as its
 * normalized form, and a token is special when its string is the content of a special added
 * token, as in HF 0.23 (so a normalized special token whose form changed is not skipped). This
 * is the one place that knows where a model keeps its pieces: a model that keeps them outside
 * t->vocab adds its loop here. */
static nopad_status build_id_table(const nopad_tokenizer *t, struct tok_decoder *d,
                                   const char *where) {
    int32_t n = t->vocab_size;
    d->n_entries = n;
    d->entries = calloc((size_t)(n > 0 ? n : 1), sizeof *d->entries);
    if (!d->entries) return out_of_memory(where);
    const tok_vocab *v = &t->vocab;
    size_t total = 1;
    if (v->slots)
        for (size_t i = 0; i <= v->mask; i++)
            if (v->slots[i].id >= 0)
                total += lossy_len(v->pool + v->slots[i].offset, v->slots[i].len) + 1;
    for (int32_t i = 0; i < t->n_added; i++)
        total += lossy_len(t->added[i].pattern, t->added[i].pattern_len) + 1;
    d->pool = malloc(total);
    if (!d->pool) return out_of_memory(where);
    size_t used = 0;
    if (v->slots) {
        for (size_t i = 0; i <= v->mask; i++) {
            const tok_vocab_slot *s = &v->slots[i];
            if (s->id < 0 || s->id >= n) continue;
            dec_entry *e = &d->entries[s->id];
            e->off = used;
            e->len = (uint32_t)lossy_into(d->pool + used, v->pool + s->offset, s->len);
            e->flags = ENTRY_PRESENT;
            used += e->len;
            d->pool[used++] = '\0';
        }
    }
    for (int32_t i = 0; i < t->n_added; i++) {
        const tok_added *a = &t->added[i];
        if (a->id < 0 || a->id >= n) continue;
        dec_entry *e = &d->entries[a->id];
        e->off = used;
        e->len = (uint32_t)lossy_into(d->pool + used, a->pattern, a->pattern_len);
        e->flags = ENTRY_PRESENT;
        used += e->len;
        d->pool[used++] = '\0';
    }
    int any_special = 0;
    for (int32_t i = 0; i < t->n_added; i++) any_special |= t->added[i].special;
    for (int32_t i = 0; i < n; i++) {
        uint8_t byte;
        dec_entry *e = &d->entries[i];
        if (!(e->flags & ENTRY_PRESENT)) continue;
        if (byte_token(d->pool + e->off, e->len, &byte)) e->flags |= ENTRY_BYTE;
        int32_t k = any_special ? tok_vocab_get(&t->added_index, d->pool + e->off, e->len) : -1;
        if (k >= 0 && t->added[k].special) e->flags |= ENTRY_SPECIAL;
    }
    return NOPAD_OK;
}

nopad_status tok_decoder_load(nopad_tokenizer *t, const struct cJSON *decoder, const char *where) {
    if (!where) where = "tokenizer.json";
    tok_decoder_free(t->decoder);
    struct tok_decoder *d = t->decoder = calloc(1, sizeof *d);
    if (!d) return out_of_memory(where);
    nopad_status st = NOPAD_OK;
    if (!decoder || cJSON_IsNull(decoder)) d->none = 1;
    else if (!cJSON_IsObject(decoder))
        st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: decoder must be an object or null", where);
    else st = parse_step(d, decoder, "decoder", where, 0);
    if (st == NOPAD_OK) st = build_id_table(t, d, where);
    return st;
}

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence that starts at s[0] (s[0..n) with n >= 1), 0 when s[0]
 * starts an invalid one; *sub receives the length of the maximal subpart that Rust's
 * from_utf8_lossy turns into one U+FFFD (>= 1), *open whether that subpart is the start of a
 * valid sequence cut off by the end of s (more bytes could still complete it). */
static size_t utf8_seq(const uint8_t *s, size_t n, size_t *sub, int *open) {
    uint8_t b = s[0];
    *open = 0;
    *sub = 1;
    if (b < 0x80) return 1;
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b == 0xE0) need = 2, lo = 0xA0;
    else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) need = 2;
    else if (b == 0xED) need = 2, hi = 0x9F;
    else if (b == 0xF0) need = 3, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) need = 3;
    else if (b == 0xF4) need = 3, hi = 0x8F;
    else return 0;
    for (size_t k = 1; k <= need; k++) {
        if (k >= n) {
            *sub = k;
            *open = 1;
            return 0;
        }
        uint8_t c = s[k];
        if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) {
            *sub = k;
            return 0;
        }
    }
    return need + 1;
}

static size_t lossy_len(const char *s, size_t n) {
    size_t len = 0;
    for (size_t i = 0; i < n;) {
        size_t sub;
        int open;
        size_t k = utf8_seq((const uint8_t *)s + i, n - i, &sub, &open);
        len += k ? k : 3;
        i += k ? k : sub;
    }
    return len;
}

static size_t lossy_into(char *out, const char *s, size_t n) {
    size_t len = 0;
    for (size_t i = 0; i < n;) {
        size_t sub;
        int open;
        size_t k = utf8_seq((const uint8_t *)s + i, n - i, &sub, &open);
        if (k) memcpy(out + len, s + i, k);
        else memcpy(out + len, REPLACEMENT_CHAR, 3);
        len += k ? k : 3;
        i += k ? k : sub;
    }
    return len;
}

/* GPT-2's bytes_to_unicode reversed: the byte a code point stands for, or -1. The printable
 * Latin-1 bytes stand for themselves; the other 68 (00-20, 7F-A0, AD) took U+0100.. in order. */
static int gpt2_byte(uint32_t cp) {
    if (cp < 0x100) {
        int printable = (cp >= '!' && cp <= '~') || (cp >= 0xA1 && cp <= 0xAC) || cp >= 0xAE;
        return printable ? (int)cp : -1;
    }
    uint32_t k = cp - 0x100;
    return k <= 0x20 ? (int)k : k <= 66 ? (int)(0x7F + k - 33) : k == 67 ? 0xAD : -1;
}

/* ---- token lists ---------------------------------------------------------------------------- */

/* Token i is buf[tok[i].off .. + tok[i].len), made from the id at index tok[i].src. */
typedef struct dec_tok {
    size_t off, len, src;
} dec_tok;

typedef struct dec_list {
    char *buf;
    size_t len, cap;
    dec_tok *tok;
    size_t n, cap_n;
    int oom; /* sticky: a failed allocation; checked once per step */
} dec_list;

typedef struct dec_work {
    dec_list lists[2];
    char *scratch[2]; /* WordPiece cleanup, CTC: a token through several replacements */
    size_t scratch_len[2], scratch_cap[2];
    uint8_t *bytes;   /* ByteLevel / ByteFallback bytes */
    size_t bytes_len, bytes_cap;
    size_t *starts;   /* ByteLevel: the first byte of each token */
    size_t starts_cap;
    char *text;       /* the joined result */
    size_t text_len, text_cap;
} dec_work;

static void work_free(dec_work *w) {
    for (int i = 0; i < 2; i++) {
        free(w->lists[i].buf);
        free(w->lists[i].tok);
        free(w->scratch[i]);
    }
    free(w->bytes);
    free(w->starts);
    free(w->text);
    memset(w, 0, sizeof *w);
}

static int grow(void **p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return 0;
    size_t cap2 = *cap * 2 > need ? *cap * 2 : need;
    if (cap2 < 64) cap2 = 64;
    if (cap2 > SIZE_MAX / size) return -1;
    void *q = realloc(*p, cap2 * size);
    if (!q) return -1;
    *p = q;
    *cap = cap2;
    return 0;
}

static void list_clear(dec_list *l) {
    l->len = 0;
    l->n = 0;
    l->oom = 0;
}

/* Starts a new (empty) token made from id index `src`. */
static void list_open(dec_list *l, size_t src) {
    if (grow((void **)&l->tok, &l->cap_n, l->n + 1, sizeof *l->tok)) {
        l->oom = 1;
        return;
    }
    l->tok[l->n++] = (dec_tok){l->len, 0, src};
}

/* Appends bytes to the last token. */
static void list_put(dec_list *l, const char *s, size_t n) {
    if (l->oom || n == 0) return;
    if (l->len > SIZE_MAX - n || grow((void **)&l->buf, &l->cap, l->len + n, 1)) {
        l->oom = 1;
        return;
    }
    memcpy(l->buf + l->len, s, n);
    l->len += n;
    l->tok[l->n - 1].len += n;
}

/* (A list whose tokens are all empty may have no buffer yet.) */
static const char *tok_text(const dec_list *l, size_t i) {
    return l->buf ? l->buf + l->tok[i].off : "";
}

/* Appends s with every non-overlapping pat replaced by rep, as Rust's str::replace does (an
 * empty pattern matches at every character boundary, the two ends included). */
static void put_replaced(dec_list *out, const char *s, size_t n, const char *pat, size_t pn,
                         const char *rep, size_t rn) {
    if (pn == 0) {
        list_put(out, rep, rn);
        for (size_t i = 0; i < n;) {
            size_t j = i;
            tok_utf8_next(s, &j);
            list_put(out, s + i, j - i);
            list_put(out, rep, rn);
            i = j;
        }
        return;
    }
    size_t i = 0, from = 0;
    while (i + pn <= n) {
        if (memcmp(s + i, pat, pn) == 0) {
            list_put(out, s + from, i - from);
            list_put(out, rep, rn);
            i += pn;
            from = i;
        } else {
            i++;
        }
    }
    if (from < n) list_put(out, s + from, n - from); /* (s may be NULL when n is 0) */
}

/* The same into a scratch buffer (for chains of replacements). */
static int scratch_replace(dec_work *w, int dst, const char *s, size_t n, const char *pat,
                           size_t pn, const char *rep, size_t rn) {
    dec_list tmp = {.buf = w->scratch[dst], .cap = w->scratch_cap[dst]};
    dec_tok one;
    tmp.tok = &one;
    tmp.n = 1;
    tmp.cap_n = 1;
    one = (dec_tok){0, 0, 0};
    put_replaced(&tmp, s, n, pat, pn, rep, rn);
    w->scratch[dst] = tmp.buf;
    w->scratch_cap[dst] = tmp.cap;
    w->scratch_len[dst] = tmp.len;
    return tmp.oom ? -1 : 0;
}

/* HF's wordpiece::cleanup, replacement after replacement over the whole string; the result is in
 * scratch[*which]. */
static int cleanup_into(dec_work *w, const char *s, size_t n, int *which) {
    static const char *const from[] = {" .", " ?", " !", " ,", " ' ", " n't", " 'm", " do not",
                                       " 's", " 've", " 're"};
    static const char *const to[] = {".", "?", "!", ",", "'", "n't", "'m", " don't", "'s", "'ve",
                                     "'re"};
    int cur = 0;
    if (scratch_replace(w, cur, s, n, from[0], strlen(from[0]), to[0], strlen(to[0]))) return -1;
    for (int k = 1; k < 11; k++) {
        if (!w->scratch_len[cur] || !memchr(w->scratch[cur], ' ', w->scratch_len[cur]))
            break; /* every pattern has a space */
        if (scratch_replace(w, 1 - cur, w->scratch[cur], w->scratch_len[cur], from[k],
                            strlen(from[k]), to[k], strlen(to[k])))
            return -1;
        cur = 1 - cur;
    }
    *which = cur;
    return 0;
}

/* ---- the steps ------------------------------------------------------------------------------ */

/* Each step reads `in` and writes `out`. *pending is lowered to the id index from which the
 * text may still change when more ids follow; with `settle` that text is left out. */

static void run_byte_level(dec_work *w, const dec_list *in, dec_list *out, int settle,
                           size_t *pending) {
    w->bytes_len = 0;
    if (grow((void **)&w->starts, &w->starts_cap, in->n + 1, sizeof *w->starts)) {
        out->oom = 1;
        return;
    }
    for (size_t i = 0; i < in->n; i++) {
        const char *s = tok_text(in, i);
        size_t n = in->tok[i].len;
        w->starts[i] = w->bytes_len;
        if (grow((void **)&w->bytes, &w->bytes_cap, w->bytes_len + n, 1)) {
            out->oom = 1;
            return;
        }
        /* a token whose characters all stand for bytes gives those bytes, any other its UTF-8 */
        size_t k = w->bytes_len;
        int all = 1;
        for (size_t pos = 0; pos < n && all;) {
            int b = gpt2_byte(tok_utf8_next(s, &pos));
            if (b < 0) all = 0;
            else w->bytes[k++] = (uint8_t)b;
        }
        if (!all) {
            memcpy(w->bytes + w->bytes_len, s, n);
            k = w->bytes_len + n;
        }
        w->bytes_len = k;
    }
    w->starts[in->n] = w->bytes_len;
    list_open(out, in->n ? in->tok[0].src : 0);
    const uint8_t *b = w->bytes;
    for (size_t i = 0; i < w->bytes_len;) {
        size_t sub;
        int open;
        size_t k = utf8_seq(b + i, w->bytes_len - i, &sub, &open);
        if (k) {
            list_put(out, (const char *)b + i, k);
            i += k;
            continue;
        }
        if (open) { /* the last bytes may yet become a character: from their token on */
            size_t t = in->n;
            while (t > 0 && !(w->starts[t - 1] <= i && i < w->starts[t])) t--;
            if (t > 0 && in->tok[t - 1].src < *pending) *pending = in->tok[t - 1].src;
            if (settle) break;
        }
        list_put(out, REPLACEMENT_CHAR, 3);
        i += sub;
    }
}

static void run_metaspace(const dec_step *st, const dec_list *in, dec_list *out) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = tok_text(in, i);
        size_t n = in->tok[i].len;
        list_open(out, in->tok[i].src);
        for (size_t pos = 0; pos < n;) {
            size_t from = pos;
            uint32_t c = tok_utf8_next(s, &pos);
            if (c != st->ch) list_put(out, s + from, pos - from);
            else if (i != 0 || st->prepend == PREPEND_NEVER) list_put(out, " ", 1);
        }
    }
}

static void run_byte_fallback(dec_work *w, const dec_list *in, dec_list *out, int settle,
                              size_t *pending) {
    size_t run = 0; /* tokens in the current run of <0xNN> tokens, ending before token i */
    w->bytes_len = 0;
    for (size_t i = 0; i <= in->n; i++) {
        uint8_t byte;
        int is_byte = i < in->n && byte_token(tok_text(in, i), in->tok[i].len, &byte);
        if (is_byte) {
            if (grow((void **)&w->bytes, &w->bytes_cap, w->bytes_len + 1, 1)) {
                out->oom = 1;
                return;
            }
            w->bytes[w->bytes_len++] = byte;
            run++;
            continue;
        }
        if (run) {
            size_t first = i - run;
            /* a run still open at the end may become valid, or all U+FFFD, with the next ids */
            if (i == in->n && in->tok[first].src < *pending) *pending = in->tok[first].src;
            if (i == in->n && settle) break;
            if (tok_utf8_check((const char *)w->bytes, w->bytes_len) == w->bytes_len) {
                list_open(out, in->tok[first].src);
                list_put(out, (const char *)w->bytes, w->bytes_len);
            } else {
                for (size_t k = first; k < i; k++) {
                    list_open(out, in->tok[k].src);
                    list_put(out, REPLACEMENT_CHAR, 3);
                }
            }
            run = 0;
            w->bytes_len = 0;
        }
        if (i < in->n) {
            list_open(out, in->tok[i].src);
            list_put(out, tok_text(in, i), in->tok[i].len);
        }
    }
}

static void run_fuse(const dec_list *in, dec_list *out) {
    list_open(out, in->n ? in->tok[0].src : 0);
    for (size_t i = 0; i < in->n; i++) list_put(out, tok_text(in, i), in->tok[i].len);
}

/* Up to `start` leading and `stop` trailing `ch` go (the trailing ones never past the leading
 * cut; HF 0.23 panics on a token that short, its older code does this). */
static void run_strip(const dec_step *st, const dec_list *in, dec_list *out) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = tok_text(in, i);
        size_t n = in->tok[i].len;
        size_t begin = 0, count = 0;
        for (size_t pos = 0; pos < n && count < st->start; count++) {
            if (tok_utf8_next(s, &pos) != st->ch) break;
            begin = pos;
        }
        size_t end = n;
        count = 0;
        while (end > begin && count < st->stop) {
            size_t p = end - 1;
            while (p > begin && ((uint8_t)s[p] & 0xC0) == 0x80) p--;
            size_t q = p;
            if (tok_utf8_next(s, &q) != st->ch) break;
            end = p;
            count++;
        }
        list_open(out, in->tok[i].src);
        list_put(out, s + begin, end - begin);
    }
}

/* HF runs a String pattern as an escaped regex: like Rust's replace, except that an empty
 * pattern finds nothing in an empty token. */
static void run_replace(const dec_step *st, const dec_list *in, dec_list *out) {
    for (size_t i = 0; i < in->n; i++) {
        list_open(out, in->tok[i].src);
        if (st->a_len == 0 && in->tok[i].len == 0) continue;
        put_replaced(out, tok_text(in, i), in->tok[i].len, st->a, st->a_len, st->b, st->b_len);
    }
}

static void run_wordpiece(const dec_step *st, dec_work *w, const dec_list *in, dec_list *out) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = tok_text(in, i);
        size_t n = in->tok[i].len;
        list_open(out, in->tok[i].src);
        /* the token as HF has it before cleanup: a continuation loses its prefix, any other
         * token after the first gets a space */
        const char *body = s;
        size_t body_n = n;
        int space = 0;
        if (i != 0) {
            if (n >= st->a_len && memcmp(s, st->a, st->a_len) == 0) {
                body += st->a_len;
                body_n -= st->a_len;
            } else {
                space = 1;
            }
        }
        if (!st->cleanup) {
            if (space) list_put(out, " ", 1);
            list_put(out, body, body_n);
            continue;
        }
        if (grow((void **)&w->bytes, &w->bytes_cap, body_n + 1, 1)) {
            out->oom = 1;
            return;
        }
        size_t m = 0;
        if (space) w->bytes[m++] = ' ';
        memcpy(w->bytes + m, body, body_n);
        int which;
        if (cleanup_into(w, (const char *)w->bytes, m + body_n, &which)) {
            out->oom = 1;
            return;
        }
        list_put(out, w->scratch[which], w->scratch_len[which]);
    }
}

/* The suffix becomes a space, or nothing on the last token; settled, the last token gives only
 * what it has either way (the common start of both), since an id after it would make it a space. */
static void run_bpe(const dec_step *st, dec_work *w, const dec_list *in, dec_list *out, int settle,
                    size_t *pending) {
    for (size_t i = 0; i < in->n; i++) {
        list_open(out, in->tok[i].src);
        int last = i + 1 == in->n;
        if (last && settle) {
            const char *s = tok_text(in, i);
            size_t n = in->tok[i].len;
            if (scratch_replace(w, 0, s, n, st->a, st->a_len, "", 0) ||
                scratch_replace(w, 1, s, n, st->a, st->a_len, " ", 1)) {
                out->oom = 1;
                return;
            }
            size_t k = 0;
            while (k < w->scratch_len[0] && k < w->scratch_len[1] &&
                   w->scratch[0][k] == w->scratch[1][k])
                k++;
            list_put(out, w->scratch[0], k);
            if (k < w->scratch_len[0] && in->tok[i].src < *pending) *pending = in->tok[i].src;
            continue;
        }
        put_replaced(out, tok_text(in, i), in->tok[i].len, st->a, st->a_len, last ? "" : " ",
                     last ? 0 : 1);
    }
}

/* Repeated tokens collapse to one, the pad token goes, and with cleanup the WordPiece cleanup
 * runs and the word delimiter becomes a space; tokens left empty are dropped. */
static void run_ctc(const dec_step *st, dec_work *w, const dec_list *in, dec_list *out) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = tok_text(in, i);
        size_t n = in->tok[i].len;
        if (i > 0 && in->tok[i - 1].len == n && memcmp(tok_text(in, i - 1), s, n) == 0) continue;
        if (scratch_replace(w, 0, s, n, st->a, st->a_len, "", 0)) {
            out->oom = 1;
            return;
        }
        int which = 0;
        if (st->cleanup) {
            /* cleanup works on a copy: it reuses both scratch buffers */
            if (grow((void **)&w->bytes, &w->bytes_cap, w->scratch_len[0] + 1, 1)) {
                out->oom = 1;
                return;
            }
            size_t m = w->scratch_len[0];
            if (m) memcpy(w->bytes, w->scratch[0], m);
            if (cleanup_into(w, (const char *)w->bytes, m, &which) ||
                scratch_replace(w, 1 - which, w->scratch[which], w->scratch_len[which], st->b,
                                st->b_len, " ", 1)) {
                out->oom = 1;
                return;
            }
            which = 1 - which;
        }
        if (w->scratch_len[which] == 0) continue;
        list_open(out, in->tok[i].src);
        list_put(out, w->scratch[which], w->scratch_len[which]);
    }
}

/* ---- decoding ids --------------------------------------------------------------------------- */

/* The token of an id, NULL when it has none (dropped, as HF drops it). */
static const dec_entry *entry_of(const struct tok_decoder *d, int32_t id) {
    const dec_entry *e = &d->entries[id];
    return (e->flags & ENTRY_PRESENT) ? e : NULL;
}

const char *nopad_tokenizer_id_to_token(const nopad_tokenizer *tok, int32_t id, size_t *len) {
    if (len) *len = 0;
    if (!tok || !tok->decoder || id < 0 || id >= tok->decoder->n_entries) return NULL;
    const dec_entry *e = entry_of(tok->decoder, id);
    if (!e) return NULL;
    if (len) *len = e->len;
    return tok->decoder->pool + e->off;
}

/* GPT-2's bytes_to_unicode inverted: code point -> byte, -1 for a code point no byte maps to
 * (filled once, by pthread_once). */
static int16_t cp_to_byte[324];
static pthread_once_t cp_to_byte_once = PTHREAD_ONCE_INIT;

static void byte_level_decoder(void) {
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp_to_byte[printable ? b : 256 + extra++] = (int16_t)b;
    }
}

/* One UTF-8 character of s (len > 0): its code point, *adv its length; -1 when malformed. */
static long utf8_next(const uint8_t *s, size_t len, size_t *adv) {
    uint8_t c = s[0];
    size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || n > len) return -1;
    long v = n == 1 ? c : c & (0x7F >> n);
    for (size_t k = 1; k < n; k++) {
        if ((s[k] & 0xC0) != 0x80) return -1;
        v = v << 6 | (s[k] & 0x3F);
    }
    *adv = n;
    return v;
}

nopad_status nopad_tokenizer_token_bytes(const nopad_tokenizer *tok, int32_t id, uint8_t *out, size_t capacity,
                                         size_t *len) {
    static const char fn[] = "nopad_tokenizer_token_bytes";
    if (!tok || !len || (capacity > 0 && !out))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: need a tokenizer, out[capacity] and len", fn);
    *len = 0;
    const nopad_tokenizer_kind kind = nopad_tokenizer_get_kind(tok);
    if (kind != NOPAD_TOKENIZER_BPE_BYTE_LEVEL && kind != NOPAD_TOKENIZER_BPE_SENTENCEPIECE)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: a %s tokenizer's tokens have no bytes of their own (their "
                               "spacing depends on the neighbours)", fn, nopad_tokenizer_kind_name(kind));
    size_t n = 0;
    const uint8_t *s = (const uint8_t *)nopad_tokenizer_id_to_token(tok, id, &n);
    if (id < 0 || id >= nopad_tokenizer_vocab_size(tok))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: id %d is outside the vocabulary (0 to %d)", fn, id,
                               nopad_tokenizer_vocab_size(tok) - 1);
    if (!s || n == 0) return NOPAD_OK;
    /* a special token (<|im_end|>, <s>) decodes to nothing without its specials and to something
     * with them (a lone "▁" decodes to nothing either way: SentencePiece's decoder strips a
     * leading space, but the token is a space) */
    char text[8];
    size_t text_len = 0, with_len = 0;
    nopad_status st = nopad_detokenize(tok, &id, 1, 1, text, sizeof text, &text_len);
    if ((st == NOPAD_OK || st == NOPAD_ERR_BUFFER_TOO_SMALL) && text_len == 0) {
        st = nopad_detokenize(tok, &id, 1, 0, text, sizeof text, &with_len);
        if ((st == NOPAD_OK || st == NOPAD_ERR_BUFFER_TOO_SMALL) && with_len > 0) return NOPAD_OK;
    }
    /* the bytes, written while they fit and counted past that */
    size_t at = 0, i = 0;
#define PUT(b) (at < capacity ? (void)(out[at] = (uint8_t)(b)) : (void)0, at++)
    if (kind == NOPAD_TOKENIZER_BPE_BYTE_LEVEL) {
        pthread_once(&cp_to_byte_once, byte_level_decoder);
        while (i < n) {
            size_t adv = 0;
            const long cp = utf8_next(s + i, n - i, &adv);
            if (cp < 0 || cp >= 324 || cp_to_byte[cp] < 0) return NOPAD_OK; /* an added token's own spelling */
            PUT(cp_to_byte[cp]);
            i += adv;
        }
    } else if (n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>') {
        static const char HEX[] = "0123456789ABCDEF";
        const char *h1 = s[3] ? strchr(HEX, s[3]) : NULL, *h2 = s[4] ? strchr(HEX, s[4]) : NULL;
        if (!h1 || !h2) return NOPAD_OK;
        PUT((h1 - HEX) * 16 + (h2 - HEX)); /* byte fallback <0xNN> */
    } else {
        while (i < n) { /* SentencePiece: U+2581 is a space */
            if (i + 3 <= n && s[i] == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) {
                PUT(' ');
                i += 3;
            } else {
                PUT(s[i++]);
            }
        }
    }
#undef PUT
    *len = at;
    if (at > capacity && out) /* out NULL and capacity 0: a measure */
        return nopad_set_error(NOPAD_ERR_BUFFER_TOO_SMALL, "%s: id %d has %zu bytes, room for %zu", fn, id, at,
                               capacity);
    return NOPAD_OK;
}

/* `index` is the id's position in the caller's array, SIZE_MAX for the stream's one id. */
static nopad_status check_id(const nopad_tokenizer *t, int32_t id, size_t index, const char *fn) {
    if (id >= 0 && id < t->decoder->n_entries) return NOPAD_OK;
    char at[48] = "";
    if (index != SIZE_MAX) snprintf(at, sizeof at, " at position %zu", index);
    return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                           "%s: id %lld%s is outside the vocabulary (%d ids, 0 to %d)", fn,
                           (long long)id, at, (int)t->decoder->n_entries,
                           (int)t->decoder->n_entries - 1);
}

static nopad_status check_decoder(const nopad_tokenizer *t, const char *fn) {
    if (!t || !t->decoder)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: need a tokenizer", fn);
    if (t->decoder->unsupported)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: %s", fn, t->decoder->unsupported);
    return NOPAD_OK;
}

/* Decodes ids[0..n) into w->text (NUL-terminated); `settle` leaves out the text that a later id
 * may still change. *pending (may be NULL) receives the index of the first id whose text may
 * change, n when none. Ids are checked by the caller. */
static nopad_status decode_ids(const nopad_tokenizer *t, dec_work *w, const int32_t *ids, size_t n,
                               int skip_special, int settle, size_t *pending, const char *fn) {
    const struct tok_decoder *d = t->decoder;
    dec_list *in = &w->lists[0], *out = &w->lists[1];
    list_clear(in);
    for (size_t i = 0; i < n; i++) {
        const dec_entry *e = entry_of(d, ids[i]);
        if (!e || (skip_special && (e->flags & ENTRY_SPECIAL))) continue;
        list_open(in, i);
        list_put(in, d->pool + e->off, e->len);
    }
    size_t pend = n;
    for (int k = 0; k < d->n_steps && !in->oom; k++) {
        const dec_step *st = &d->steps[k];
        list_clear(out);
        switch (st->kind) {
        case DEC_BYTE_LEVEL: run_byte_level(w, in, out, settle, &pend); break;
        case DEC_METASPACE: run_metaspace(st, in, out); break;
        case DEC_BYTE_FALLBACK: run_byte_fallback(w, in, out, settle, &pend); break;
        case DEC_FUSE: run_fuse(in, out); break;
        case DEC_STRIP: run_strip(st, in, out); break;
        case DEC_REPLACE: run_replace(st, in, out); break;
        case DEC_WORDPIECE: run_wordpiece(st, w, in, out); break;
        case DEC_BPE: run_bpe(st, w, in, out, settle, &pend); break;
        case DEC_CTC: run_ctc(st, w, in, out); break;
        }
        dec_list *swap = in;
        in = out;
        out = swap;
    }
    /* join: "" after a decoder, " " without one */
    size_t need = in->len + (d->none && in->n ? in->n - 1 : 0) + 1;
    if (in->oom || grow((void **)&w->text, &w->text_cap, need, 1))
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory decoding %zu ids", fn,
                               n);
    size_t len = 0;
    for (size_t i = 0; i < in->n; i++) {
        if (d->none && i > 0) w->text[len++] = ' ';
        if (in->tok[i].len) memcpy(w->text + len, tok_text(in, i), in->tok[i].len);
        len += in->tok[i].len;
    }
    w->text[len] = '\0';
    w->text_len = len;
    if (pending) *pending = pend;
    return NOPAD_OK;
}

nopad_status nopad_detokenize(const nopad_tokenizer *tok, const int32_t *ids, size_t n_ids,
                              int skip_special_tokens, char *text, size_t capacity,
                              size_t *text_len) {
    static const char fn[] = "nopad_detokenize";
    if (text_len) *text_len = 0;
    if (!tok || !text_len || (!ids && n_ids) || (!text && capacity))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s: need a tokenizer, ids (or n_ids 0), text_len and text for "
                               "capacity %zu",
                               fn, capacity);
    nopad_status st = check_decoder(tok, fn);
    for (size_t i = 0; i < n_ids && st == NOPAD_OK; i++) st = check_id(tok, ids[i], i, fn);
    if (st != NOPAD_OK) return st;
    dec_work w = {0};
    st = decode_ids(tok, &w, ids, n_ids, skip_special_tokens, 0, NULL, fn);
    if (st == NOPAD_OK) {
        *text_len = w.text_len;
        if (w.text_len + 1 > capacity)
            st = nopad_set_error(NOPAD_ERR_BUFFER_TOO_SMALL,
                                 "%s: the text of %zu bytes and its NUL do not fit in capacity %zu",
                                 fn, w.text_len, capacity);
        else memcpy(text, w.text, w.text_len + 1);
    }
    work_free(&w);
    return st;
}

/* ---- the stream ----------------------------------------------------------------------------- */

struct nopad_decode_stream {
    const nopad_tokenizer *tok;
    int skip_special;
    int32_t *ids;     /* the window: ids[0..n) */
    size_t n, cap;
    size_t done;      /* ids[0..done) are the window's prefix, whose text is already out */
    char *prefix;     /* the settled decode of ids[0..done) */
    size_t prefix_len, prefix_cap;
    int open_run;     /* the window ends in a run of <0xNN> tokens (ByteFallback) */
    char *chunk;      /* the text returned last */
    size_t chunk_len, chunk_cap;
    dec_work w;
};

/* A stream decodes a window of the last ids, which gives the whole decode's text only when each
 * token's text depends on its neighbours in the ways the window keeps: the first-token rules,
 * bytes joining into characters, the last token of BPEDecoder. Once ByteLevel or Fuse has made
 * the tokens one string, a step that reads across tokens would see the window's start as the
 * text's start: only Metaspace, Fuse and a Strip of at most one leading character may follow
 * (LLaMA-2's chain ends in Fuse, Strip(" ", 1, 0)). */
static const char *unstreamable(const struct tok_decoder *d) {
    static const char *const names[] = {"ByteLevel", "Metaspace", "ByteFallback", "Fuse", "Strip",
                                        "Replace", "WordPiece", "BPEDecoder", "CTC"};
    int fused = 0;
    for (int i = 0; i < d->n_steps; i++) {
        const dec_step *s = &d->steps[i];
        int ok = s->kind == DEC_METASPACE || s->kind == DEC_FUSE ||
                 (s->kind == DEC_STRIP && s->start <= 1 && s->stop == 0);
        if (fused && !ok) return names[s->kind];
        if (s->kind == DEC_FUSE || s->kind == DEC_BYTE_LEVEL) fused = 1;
    }
    return NULL;
}

nopad_status nopad_decode_stream_create(const nopad_tokenizer *tok, int skip_special_tokens,
                                        nopad_decode_stream **out) {
    static const char fn[] = "nopad_decode_stream_create";
    if (out) *out = NULL;
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    nopad_status st = check_decoder(tok, fn);
    if (st != NOPAD_OK) return st;
    const char *step = unstreamable(tok->decoder);
    if (step)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: this decoder cannot be streamed: a %s step after ByteLevel or "
                               "Fuse reads across tokens, so the text of earlier ids would depend "
                               "on later ones (nopad_detokenize decodes it)",
                               fn, step);
    nopad_decode_stream *s = calloc(1, sizeof *s);
    if (!s) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    s->tok = tok;
    s->skip_special = skip_special_tokens;
    *out = s;
    return NOPAD_OK;
}

void nopad_decode_stream_free(nopad_decode_stream *s) {
    if (!s) return;
    free(s->ids);
    free(s->prefix);
    free(s->chunk);
    work_free(&s->w);
    free(s);
}

/* The chunk: what s->w.text (the decode of the whole window) adds to the prefix. */
static nopad_status take_chunk(nopad_decode_stream *s, const char *fn) {
    const char *text = s->w.text;
    size_t len = s->w.text_len;
    s->chunk_len = 0;
    if (len < s->prefix_len || (s->prefix_len && memcmp(text, s->prefix, s->prefix_len) != 0))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: this tokenizer's decoder changed text it had already given "
                               "when id %d followed (its output is not a prefix of the longer "
                               "decode), so it cannot be streamed",
                               fn, (int)s->ids[s->n - 1]);
    len -= s->prefix_len;
    if (grow((void **)&s->chunk, &s->chunk_cap, len + 1, 1))
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    memcpy(s->chunk, text + s->prefix_len, len + 1);
    s->chunk_len = len;
    return NOPAD_OK;
}

nopad_status nopad_decode_stream_step(nopad_decode_stream *s, int32_t id, const char **text,
                                      size_t *len) {
    static const char fn[] = "nopad_decode_stream_step";
    if (text) *text = "";
    if (len) *len = 0;
    if (!s || !text || !len)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: need a stream, text and len", fn);
    const struct tok_decoder *d = s->tok->decoder;
    nopad_status st = check_id(s->tok, id, SIZE_MAX, fn);
    if (st != NOPAD_OK) return st;
    const dec_entry *e = entry_of(d, id);
    /* ids that a decode drops never reach the window */
    if (!e || (s->skip_special && (e->flags & ENTRY_SPECIAL))) return NOPAD_OK;
    if (grow((void **)&s->ids, &s->cap, s->n + 1, sizeof *s->ids))
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    s->ids[s->n++] = id;
    /* another byte of an open run settles nothing: no decode, so a long run costs O(1) a step */
    if (s->open_run && (e->flags & ENTRY_BYTE)) return NOPAD_OK;
    size_t pending;
    st = decode_ids(s->tok, &s->w, s->ids, s->n, s->skip_special, 1, &pending, fn);
    if (st == NOPAD_OK) st = take_chunk(s, fn);
    if (st != NOPAD_OK) {
        s->n--; /* as it was */
        return st;
    }
    s->open_run = d->has_byte_fallback && pending < s->n;
    if (s->chunk_len == 0) return NOPAD_OK;
    /* HF's move: the window now starts where the previous chunk's ids start, and all of it is
     * prefix; so it stays a few ids long */
    memmove(s->ids, s->ids + s->done, (s->n - s->done) * sizeof *s->ids);
    s->n -= s->done;
    s->done = s->n;
    st = decode_ids(s->tok, &s->w, s->ids, s->n, s->skip_special, 1, NULL, fn);
    if (st == NOPAD_OK && grow((void **)&s->prefix, &s->prefix_cap, s->w.text_len + 1, 1))
        st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (st != NOPAD_OK) return st;
    memcpy(s->prefix, s->w.text, s->w.text_len + 1);
    s->prefix_len = s->w.text_len;
    *text = s->chunk;
    *len = s->chunk_len;
    return NOPAD_OK;
}

nopad_status nopad_decode_stream_flush(nopad_decode_stream *s, const char **text, size_t *len) {
    static const char fn[] = "nopad_decode_stream_flush";
    if (text) *text = "";
    if (len) *len = 0;
    if (!s || !text || !len)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: need a stream, text and len", fn);
    nopad_status st = NOPAD_OK;
    s->chunk_len = 0;
    if (s->n > 0) {
        st = decode_ids(s->tok, &s->w, s->ids, s->n, s->skip_special, 0, NULL, fn);
        if (st == NOPAD_OK) st = take_chunk(s, fn);
    }
    /* the stream starts afresh */
    s->n = s->done = s->prefix_len = 0;
    s->open_run = 0;
    if (st != NOPAD_OK) return st;
    if (s->chunk_len) {
        *text = s->chunk;
        *len = s->chunk_len;
    }
    return NOPAD_OK;
}

/* ---- the tokenizer's kind ------------------------------------------------------------------- */

/* Whether the pre-tokenizer steps (the general pipeline) hold one of `kind`. */
static int has_pre_step(const nopad_tokenizer *t, tok_pre_kind kind) {
    for (int32_t i = 0; t->general && i < t->n_pre_steps; i++)
        if (t->pre_steps[i].kind == kind) return 1;
    return 0;
}

nopad_tokenizer_kind nopad_tokenizer_get_kind(const nopad_tokenizer *t) {
    if (!t) return NOPAD_TOKENIZER_WORDPIECE;
    const struct tok_decoder *d = t->decoder;
    switch (t->model) {
    case TOK_MODEL_WORDPIECE: return NOPAD_TOKENIZER_WORDPIECE;
    case TOK_MODEL_UNIGRAM: return NOPAD_TOKENIZER_UNIGRAM;
    case TOK_MODEL_BPE:
        /* byte-level: the ByteLevel pre-tokenizer, alone or in a Sequence (LLaMA-3's Split then
         * ByteLevel), which its decoder mirrors; SentencePiece-style: byte fallback, or "▁" for
         * spaces (Metaspace, or a Replace normalizer and decoder) */
        if (t->pre == TOK_PRE_BYTELEVEL || has_pre_step(t, TOK_PS_BYTELEVEL) ||
            (d && d->has_byte_level))
            return NOPAD_TOKENIZER_BPE_BYTE_LEVEL;
        if (t->bpe.byte_fallback || has_pre_step(t, TOK_PS_METASPACE) ||
            (d && (d->has_byte_fallback || d->has_metaspace || d->has_space_replace)))
            return NOPAD_TOKENIZER_BPE_SENTENCEPIECE;
        return NOPAD_TOKENIZER_BPE;
    }
    return NOPAD_TOKENIZER_BPE; /* a model kind added to tok_model_kind and not here yet */
}

const char *nopad_tokenizer_kind_name(nopad_tokenizer_kind kind) {
    switch (kind) {
    case NOPAD_TOKENIZER_WORDPIECE: return "wordpiece";
    case NOPAD_TOKENIZER_BPE_BYTE_LEVEL: return "bpe-byte-level";
    case NOPAD_TOKENIZER_BPE_SENTENCEPIECE: return "bpe-sentencepiece";
    case NOPAD_TOKENIZER_UNIGRAM: return "unigram";
    case NOPAD_TOKENIZER_BPE: return "bpe";
    }
    return "unknown";
}

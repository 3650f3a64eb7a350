/* Tokenization: text -> ids, as Hugging Face tokenizers does it for WordPiece models (BPE models
 * share steps 1 and 5 and run tokenizer_bpe.c in between).
 *
 *   1. split the raw text on added tokens ([CLS], [MASK], ...), leftmost-longest;
 *   2. normalize each remaining piece (tokenizer_normalize.c);
 *   3. pre-tokenize it into words (whitespace / punctuation);
 *   4. WordPiece each word: greedy longest-match-first, "##" on continuation pieces; a word with
 *      no full match, or longer than max_input_chars_per_word characters, becomes [UNK];
 *   5. wrap in the template ([CLS] ... [SEP]) and truncate.
 *
 * All state of a call lives in its own tok_run, so calls on one tokenizer may run concurrently.
 * A call makes one allocation for short texts and a few buffers for long ones, never one per
 * character. With truncation the work stops once enough ids exist. */
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_internal.h"
#include "util/error.h"

/* A long piece is normalized and split in chunks of about this many bytes, cut after an ASCII
 * whitespace byte, which is a word boundary in every supported pre-tokenizer; memory stays
 * bounded and truncated calls stop early. */
enum { CHUNK_BYTES = 16384 };

/* Inline storage of a tok_run: enough for texts of a few hundred bytes without more allocations. */
enum { INLINE_CPS = 1024, INLINE_BYTES = 512 };

typedef struct tok_run {
    const nopad_tokenizer *tok;
    int32_t *ids;     /* ids[capacity]; content ids start at offset (after the template prefix) */
    int64_t capacity;
    int64_t offset;
    int64_t count;    /* content ids so far */
    int64_t limit;    /* content ids wanted (truncation), INT64_MAX without */
    tok_cpbuf cps;    /* normalized code points of the current chunk */
    tok_cpbuf cps2;   /* decoded pieces of normalized text (normalized added tokens only) */
    char *word;       /* UTF-8 of the current word */
    size_t word_len, word_cap;
    int64_t word_chars;
    char *key;        /* prefix + rest of the word: the WordPiece candidates */
    uint64_t *hash;   /* hash[i] = hash of key[0..i) */
    size_t key_cap;
    char *text2;      /* UTF-8 of the normalized text (normalized added tokens only) */
    size_t text2_cap;
    tok_bpe_work bpe; /* BPE models */
    tok_pipe_work pipe; /* the general pipeline */
    tok_str gen_text;   /* its normalized text */
    uint32_t cps_storage[INLINE_CPS];
    char word_storage[INLINE_BYTES];
    char key_storage[INLINE_BYTES];
    uint64_t hash_storage[INLINE_BYTES + 1];
} tok_run;

static int run_full(const tok_run *r) { return r->count >= r->limit; }

static void emit(tok_run *r, int32_t id) {
    if (r->count < r->limit && r->offset + r->count < r->capacity)
        r->ids[r->offset + r->count] = id;
    r->count++;
}

/* Grows a byte buffer that may start on inline storage (or NULL). */
static nopad_status grow_bytes(char **buf, size_t *cap, const char *storage, size_t need) {
    if (need <= *cap) return NOPAD_OK;
    size_t cap2 = *cap * 2 > need ? *cap * 2 : need;
    int inline_storage = storage && *buf == storage;
    char *b = inline_storage ? malloc(cap2) : realloc(*buf, cap2);
    if (!b)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tokenizer: cannot allocate %zu bytes",
                               cap2);
    if (inline_storage) memcpy(b, storage, *cap);
    *buf = b;
    *cap = cap2;
    return NOPAD_OK;
}

static nopad_status reserve_key(tok_run *r, size_t need) {
    if (need <= r->key_cap) return NOPAD_OK;
    char *key = r->key == r->key_storage ? malloc(need) : realloc(r->key, need);
    if (key) r->key = key;
    uint64_t *hash = r->hash == r->hash_storage ? malloc((need + 1) * sizeof *hash)
                                                : realloc(r->hash, (need + 1) * sizeof *hash);
    if (hash) r->hash = hash;
    if (!key || !hash)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY,
                               "tokenizer: cannot allocate a %zu-byte word", need);
    r->key_cap = need;
    return NOPAD_OK;
}

static int is_continuation(char b) { return ((unsigned char)b & 0xC0) == 0x80; }

/* WordPiece on one word w[0..n) of n_chars characters. */
static nopad_status wordpiece(tok_run *r, const char *w, size_t n, int64_t n_chars) {
    const nopad_tokenizer *t = r->tok;
    const tok_vocab *v = &t->vocab;
    if (n_chars > t->max_chars_per_word) {
        emit(r, t->unk_id);
        if (r->count > r->limit) r->count = r->limit;
        return NOPAD_OK;
    }
    const size_t plen = t->subword_prefix_len;
    nopad_status st = reserve_key(r, plen + n);
    if (st != NOPAD_OK) return st;
    int64_t saved = r->count;
    int bad = 0;
    size_t start = 0;
    while (start < n) {
        /* key = (start > 0 ? prefix : "") + w[start..n); every candidate is a prefix of key,
         * and none longer than the longest token can match, so only lim bytes matter (this
         * keeps a long word with a huge max_input_chars_per_word linear, not quadratic) */
        size_t klen0 = start ? plen : 0;
        size_t lim = klen0 + (n - start);
        if (lim > v->max_key_len) lim = v->max_key_len;
        if (lim <= klen0) { /* even one character plus the prefix is longer than any token */
            bad = 1;
            break;
        }
        if (start) memcpy(r->key, t->subword_prefix, plen);
        memcpy(r->key + klen0, w + start, lim - klen0);
        r->hash[0] = TOK_HASH_INIT;
        for (size_t i = 0; i < lim; i++)
            r->hash[i + 1] = tok_hash_step(r->hash[i], (uint8_t)r->key[i]);
        size_t end = n;
        if (klen0 + (end - start) > lim) { /* skip candidates longer than the longest token */
            end = start + (lim - klen0);
            while (end > start && is_continuation(w[end])) end--;
        }
        int32_t id = -1;
        while (end > start) {
            size_t len = klen0 + (end - start);
            id = tok_vocab_find(v, r->hash[len], r->key, len);
            if (id >= 0) break;
            do end--;
            while (end > start && is_continuation(w[end]));
        }
        if (id < 0) {
            bad = 1;
            break;
        }
        emit(r, id);
        start = end;
    }
    if (bad) { /* the whole word is unknown, not just its tail */
        r->count = saved;
        emit(r, t->unk_id);
    }
    if (r->count > r->limit) r->count = r->limit;
    return NOPAD_OK;
}

static nopad_status flush_word(tok_run *r) {
    if (r->word_chars == 0) return NOPAD_OK;
    nopad_status st = wordpiece(r, r->word, r->word_len, r->word_chars);
    r->word_len = 0;
    r->word_chars = 0;
    return st;
}

static nopad_status append_char(tok_run *r, uint32_t c) {
    r->word_chars++;
    /* a word past the limit becomes [UNK] whatever it holds: count it, do not store it */
    if (r->word_chars > r->tok->max_chars_per_word) return NOPAD_OK;
    if (r->word_len + 4 > r->word_cap) {
        nopad_status st = grow_bytes(&r->word, &r->word_cap, r->word_storage, r->word_len + 4);
        if (st != NOPAD_OK) return st;
    }
    r->word_len += (size_t)tok_utf8_put(c, r->word + r->word_len);
    return NOPAD_OK;
}

/* Pre-tokenizes normalized text into words and runs WordPiece on each. */
static nopad_status split_words(tok_run *r, const uint32_t *cps, size_t n) {
    const tok_pre_tokenizer pre = r->tok->pre;
    int word_class = 0; /* Whitespace pre-tokenizer: 1 = \w run, 2 = other run */
    nopad_status st = NOPAD_OK;
    for (size_t i = 0; i < n && st == NOPAD_OK && !run_full(r); i++) {
        uint32_t c = cps[i];
        switch (pre) {
        case TOK_PRE_NONE:
        case TOK_PRE_BYTELEVEL: /* BPE only, which never comes here */
            st = append_char(r, c);
            break;
        case TOK_PRE_BERT:
            if (tok_is_whitespace(c)) {
                st = flush_word(r);
            } else if (tok_is_punct(c)) {
                st = flush_word(r);
                if (st == NOPAD_OK) st = append_char(r, c);
                if (st == NOPAD_OK) st = flush_word(r);
            } else {
                st = append_char(r, c);
            }
            break;
        case TOK_PRE_WHITESPACE_SPLIT:
            st = tok_is_whitespace(c) ? flush_word(r) : append_char(r, c);
            break;
        case TOK_PRE_WHITESPACE: {
            int cls = tok_is_whitespace(c) ? 0 : tok_is_word(c) ? 1 : 2;
            if (cls != word_class) st = flush_word(r);
            word_class = cls;
            if (cls && st == NOPAD_OK) st = append_char(r, c);
            break;
        }
        }
    }
    if (st == NOPAD_OK && !run_full(r)) st = flush_word(r);
    r->word_len = 0;
    r->word_chars = 0;
    return st;
}

static int is_ascii_space(char b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }

/* A piece of text between added tokens; at_start: it begins the text (Metaspace "first"). */
typedef nopad_status (*piece_fn)(tok_run *r, const char *s, size_t n, int at_start);

static uint32_t char_before(const char *s, size_t pos, size_t *start) {
    size_t p = pos - 1;
    while (p > 0 && is_continuation(s[p])) p--;
    *start = p;
    size_t q = p;
    return tok_utf8_next(s, &q);
}

/* Splits s[0..n) on the added tokens of matcher `m` like HF's AddedVocabulary::find_matches:
 * leftmost-longest matches, honouring single_word / lstrip / rstrip; text between matches goes
 * to `piece`, each match becomes its id. */
static nopad_status split_added(tok_run *r, const tok_matcher *m, const char *s, size_t n,
                                int at_start, piece_fn piece) {
    const nopad_tokenizer *t = r->tok;
    size_t start_offset = 0, pos = 0;
    nopad_status st = NOPAD_OK;
    while (m->count > 0 && pos < n && !run_full(r)) {
        size_t mstart = 0, mlen = 0;
        int32_t which = -1;
        for (size_t p = pos; p < n && which < 0; p++) {
            uint8_t b = (uint8_t)s[p];
            for (int32_t k = m->first[b]; k < m->first[b + 1]; k++) {
                const tok_added *a = &t->added[m->order[k]];
                if (a->pattern_len > mlen && a->pattern_len <= n - p &&
                    memcmp(a->pattern, s + p, a->pattern_len) == 0) {
                    mlen = a->pattern_len;
                    which = m->order[k];
                    mstart = p;
                }
            }
        }
        if (which < 0) break;
        const tok_added *a = &t->added[which];
        size_t start = mstart, stop = mstart + mlen, q;
        pos = stop;
        if (a->single_word) { /* only as a whole word: no \w character touching either side */
            int left_word = start > 0 && tok_is_word(char_before(s, start, &q));
            q = stop;
            int right_word = stop < n && tok_is_word(tok_utf8_next(s, &q));
            if (left_word || right_word) continue;
        }
        if (a->lstrip) { /* the token swallows the whitespace before it */
            while (start > start_offset && tok_is_whitespace(char_before(s, start, &q))) start = q;
        }
        if (a->rstrip) { /* ... and after it */
            while (stop < n) {
                q = stop;
                if (!tok_is_whitespace(tok_utf8_next(s, &q))) break;
                stop = q;
            }
            pos = stop;
        }
        if (start_offset < start)
            st = piece(r, s + start_offset, start - start_offset, at_start && start_offset == 0);
        if (st != NOPAD_OK) return st;
        if (!run_full(r)) emit(r, a->id);
        start_offset = stop;
    }
    if (start_offset < n && !run_full(r))
        st = piece(r, s + start_offset, n - start_offset, at_start && start_offset == 0);
    return st;
}

/* A piece of normalized text between normalized added tokens. */
static nopad_status normalized_piece(tok_run *r, const char *s, size_t n, int at_start) {
    r->cps2.len = 0;
    nopad_status st = tok_cpbuf_reserve(&r->cps2, n);
    if (st != NOPAD_OK) return st;
    for (size_t pos = 0; pos < n;) r->cps2.data[r->cps2.len++] = tok_utf8_next(s, &pos);
    return split_words(r, r->cps2.data, r->cps2.len);
}

/* BPE: the ids of one word. Returns nonzero once truncation is reached. */
static int bpe_emit(void *ctx, const int32_t *ids, size_t n) {
    tok_run *r = ctx;
    for (size_t i = 0; i < n && !run_full(r); i++) emit(r, ids[i]);
    return run_full(r);
}

/* BPE: a piece of text between added tokens (the normalizer is null, so raw and normalized
 * added tokens are matched on the same text). */
static nopad_status bpe_piece(tok_run *r, const char *s, size_t n, int at_start) {
    return tok_bpe_encode_piece(r->tok, &r->bpe, s, n, bpe_emit, r);
}

/* ---- the general pipeline: normalizer steps, pre-tokenizer steps, any model ---------------- */

/* One pre-tokenized word through the model. */
static nopad_status general_word(void *ctx, const char *w, size_t n, int *stop) {
    tok_run *r = ctx;
    const nopad_tokenizer *t = r->tok;
    nopad_status st = NOPAD_OK;
    size_t n_ids = 0;
    switch (t->model) {
    case TOK_MODEL_WORDPIECE: {
        int64_t chars = 0;
        for (size_t i = 0; i < n; i++) chars += !is_continuation(w[i]);
        st = wordpiece(r, w, n, chars);
        *stop = run_full(r);
        return st;
    }
    case TOK_MODEL_BPE:
        st = tok_bpe_encode_word(t, &r->bpe, &r->pipe, w, n, &n_ids);
        break;
    case TOK_MODEL_UNIGRAM:
        st = tok_unigram_encode_word(t, &r->pipe, w, n, &n_ids);
        break;
    }
    for (size_t i = 0; i < n_ids && st == NOPAD_OK && !run_full(r); i++) emit(r, r->pipe.ids[i]);
    *stop = run_full(r);
    return st;
}

/* A piece of normalized text between normalized added tokens. */
static nopad_status general_words(tok_run *r, const char *s, size_t n, int at_start) {
    return tok_pipeline_pre_tokenize(r->tok, &r->pipe, s, n, at_start, general_word, r);
}

/* A piece of raw text between raw added tokens: normalize it whole, then split it on the
 * normalized added tokens. */
static nopad_status general_piece(tok_run *r, const char *s, size_t n, int at_start) {
    const nopad_tokenizer *t = r->tok;
    nopad_status st = tok_pipeline_normalize(t, &r->pipe, s, n, &r->gen_text);
    if (st != NOPAD_OK) return st;
    if (t->norm_matcher.count == 0)
        return general_words(r, r->gen_text.data, r->gen_text.len, at_start);
    /* split_added's pieces point into gen_text, which general_words leaves alone */
    return split_added(r, &t->norm_matcher, r->gen_text.data, r->gen_text.len, at_start,
                       general_words);
}

/* A piece of raw text between raw added tokens. */
static nopad_status raw_piece(tok_run *r, const char *s, size_t n, int at_start) {
    const nopad_tokenizer *t = r->tok;
    nopad_status st = NOPAD_OK;
    if (t->general) return general_piece(r, s, n, at_start);
    if (t->model == TOK_MODEL_BPE)
        return t->norm_matcher.count == 0
                   ? bpe_piece(r, s, n, at_start)
                   : split_added(r, &t->norm_matcher, s, n, at_start, bpe_piece);
    if (t->norm_matcher.count == 0) {
        for (size_t p = 0; p < n && st == NOPAD_OK && !run_full(r);) {
            size_t q = n;
            if (t->pre != TOK_PRE_NONE && n - p > CHUNK_BYTES) {
                q = p + CHUNK_BYTES;
                while (q < n && !is_ascii_space(s[q])) q++;
                if (q < n) q++;
            }
            r->cps.len = 0;
            st = tok_normalize(&t->norm, s + p, q - p, &r->cps);
            if (st == NOPAD_OK) st = split_words(r, r->cps.data, r->cps.len);
            p = q;
        }
        return st;
    }
    /* Normalized added tokens are matched on the normalized text (HF matches them after
     * normalization, against their own normalized form), so normalize the whole piece. */
    r->cps.len = 0;
    st = tok_normalize(&t->norm, s, n, &r->cps);
    if (st != NOPAD_OK) return st;
    if (r->cps.len > (SIZE_MAX - 1) / 4)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tokenizer: text too large");
    st = grow_bytes(&r->text2, &r->text2_cap, NULL, r->cps.len * 4 + 1);
    if (st != NOPAD_OK) return st;
    size_t len = 0;
    for (size_t i = 0; i < r->cps.len; i++)
        len += (size_t)tok_utf8_put(r->cps.data[i], r->text2 + len);
    return split_added(r, &t->norm_matcher, r->text2, len, at_start, normalized_piece);
}

nopad_tokenize_params nopad_tokenize_default_params(void) {
    nopad_tokenize_params p = {.add_special_tokens = 1, .truncate = 0, .max_length = 0};
    return p;
}

nopad_status nopad_tokenize(const nopad_tokenizer *tok, const char *text, size_t len,
                            const nopad_tokenize_params *params, int32_t *ids, int32_t capacity,
                            int32_t *n_ids) {
    if (n_ids) *n_ids = 0;
    if (!tok || !n_ids || (!text && len > 0) || capacity < 0 || (!ids && capacity > 0))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_tokenize: need a tokenizer, text (or len 0), n_ids and ids "
                               "for capacity %d",
                               (int)capacity);
    nopad_tokenize_params p = params ? *params : nopad_tokenize_default_params();
    size_t bad = tok_utf8_check(text, len);
    if (bad < len)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_tokenize: text is not valid UTF-8 at byte offset %zu "
                               "(byte 0x%02X)",
                               bad, (unsigned)(unsigned char)text[bad]);

    int64_t n_prefix = p.add_special_tokens ? tok->n_prefix : 0;
    int64_t n_special = n_prefix + (p.add_special_tokens ? tok->n_suffix : 0);
    int64_t limit = INT64_MAX;
    if (p.truncate && p.max_length > 0) {
        if (p.max_length < n_special)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "nopad_tokenize: max_length %d leaves no room for the %lld "
                                   "special tokens",
                                   (int)p.max_length, (long long)n_special);
        limit = p.max_length - n_special;
    }

    tok_run *r = malloc(sizeof *r); /* ~10 KiB: one allocation, kept off small thread stacks */
    if (!r) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_tokenize: out of memory");
    r->tok = tok;
    r->ids = ids;
    r->capacity = capacity;
    r->offset = n_prefix;
    r->count = 0;
    r->limit = limit;
    tok_cpbuf_init(&r->cps, r->cps_storage, INLINE_CPS);
    tok_cpbuf_init(&r->cps2, NULL, 0);
    r->word = r->word_storage;
    r->word_len = 0;
    r->word_cap = INLINE_BYTES;
    r->word_chars = 0;
    r->key = r->key_storage;
    r->hash = r->hash_storage;
    r->key_cap = INLINE_BYTES;
    r->text2 = NULL;
    r->text2_cap = 0;
    memset(&r->bpe, 0, sizeof r->bpe);
    memset(&r->pipe, 0, sizeof r->pipe);
    memset(&r->gen_text, 0, sizeof r->gen_text);

    nopad_status st = split_added(r, &tok->raw_matcher, text, len, 1, raw_piece);

    tok_cpbuf_free(&r->cps);
    tok_cpbuf_free(&r->cps2);
    if (r->word != r->word_storage) free(r->word);
    if (r->key != r->key_storage) free(r->key);
    if (r->hash != r->hash_storage) free(r->hash);
    free(r->text2);
    tok_bpe_work_free(&r->bpe);
    tok_pipe_work_free(&r->pipe);
    tok_str_free(&r->gen_text);
    int64_t total = n_special + r->count;
    free(r);
    if (st != NOPAD_OK) return st;

    if (p.max_length > 0 && total > p.max_length) {
        /* report the full length so callers can say by how much the limit is exceeded */
        *n_ids = total > INT32_MAX ? INT32_MAX : (int32_t)total;
        return nopad_set_error(NOPAD_ERR_TOO_LONG,
                               "nopad_tokenize: text gives %lld ids, more than max_length %d "
                               "(set truncate to cut it)",
                               (long long)total, (int)p.max_length);
    }
    if (total > INT32_MAX)
        return nopad_set_error(NOPAD_ERR_TOO_LONG, "nopad_tokenize: text gives %lld ids",
                               (long long)total);
    *n_ids = (int32_t)total;
    if (total > capacity)
        return nopad_set_error(NOPAD_ERR_BUFFER_TOO_SMALL,
                               "nopad_tokenize: %lld ids do not fit in capacity %d",
                               (long long)total, (int)capacity);
    if (p.add_special_tokens && total > 0) { /* total 0: ids may be NULL (a measuring call) */
        for (int32_t i = 0; i < tok->n_prefix; i++) ids[i] = tok->prefix_ids[i];
        int32_t *suffix = ids + (total - tok->n_suffix);
        for (int32_t i = 0; i < tok->n_suffix; i++) suffix[i] = tok->suffix_ids[i];
    }
    return NOPAD_OK;
}

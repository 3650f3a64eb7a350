/* Byte-level BPE (GPT-2, RoBERTa), as Hugging Face tokenizers does it:
 *
 *   1. ByteLevel pre-tokenizer: a piece of text (between added tokens) gets a leading space when
 *      add_prefix_space is set and it does not start with one, and is split by GPT-2's regex
 *      (run by PCRE2 in UTF mode with Unicode properties);
 *   2. each word's bytes become characters (GPT-2's bytes_to_unicode), each one a vocab symbol;
 *   3. BPE: the adjacent pair with the lowest merge rank is merged, leftmost first, until no pair
 *      has a merge. Like HF's word.rs, candidates wait in a binary heap and a popped one that no
 *      longer applies is skipped, so a word of n bytes takes O(n log n), not O(n^2).
 *
 * Supported: model.unk_token (or null: unknown characters are dropped), fuse_unk,
 * ignore_merges, merges as "a b" strings or ["a", "b"] pairs. Refused: dropout,
 * continuing_subword_prefix / end_of_word_suffix, byte_fallback (SentencePiece-style BPE). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_internal.h"
#include "util/error.h"

void tok_bpe_free(tok_bpe *b) {
    tok_vocab_free(&b->merges);
    free(b->merge_result);
    free(b->prefix);
    free(b->suffix);
    pcre2_code_free((pcre2_code *)b->split_re);
    memset(b, 0, sizeof *b);
}

void tok_bpe_work_free(tok_bpe_work *w) {
    free(w->sym);
    free(w->prev);
    free(w->next);
    free(w->heap);
    free(w->text);
    free(w->word);
    pcre2_match_data_free((pcre2_match_data *)w->match);
    memset(w, 0, sizeof *w);
}

/* ---- loading -------------------------------------------------------------------------------- */

static nopad_status out_of_memory(const char *where) {
    return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory building the tokenizer",
                           where);
}

/* An optional string option: absent, null or "" give NULL. */
static nopad_status optional_string(const cJSON *model, const char *key, const char *where,
                                    char **out, size_t *out_len) {
    const cJSON *item = tok_json_field(model, key);
    *out = NULL;
    *out_len = 0;
    if (!item || cJSON_IsNull(item)) return NOPAD_OK;
    if (!cJSON_IsString(item) || !item->valuestring)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: model.%s must be a string or null", where,
                               key);
    size_t len = strlen(item->valuestring);
    if (len == 0) return NOPAD_OK;
    if (tok_utf8_check(item->valuestring, len) != len)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: model.%s is not valid UTF-8", where, key);
    *out = malloc(len + 1);
    if (!*out) return out_of_memory(where);
    memcpy(*out, item->valuestring, len + 1);
    *out_len = len;
    return NOPAD_OK;
}

static void pair_key(int32_t a, int32_t b, char key[8]) {
    memcpy(key, &a, 4);
    memcpy(key + 4, &b, 4);
}

/* One entry of model.merges: "a b" or ["a", "b"]. */
static nopad_status merge_parts(const cJSON *m, int i, const char *where, const char **a,
                                size_t *a_len, const char **b, size_t *b_len) {
    if (cJSON_IsString(m) && m->valuestring) {
        const char *s = m->valuestring, *sp = strchr(s, ' ');
        if (!sp)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: model.merges[%d] \"%.64s\" is not two tokens split by a "
                                   "space",
                                   where, i, s);
        *a = s;
        *a_len = (size_t)(sp - s);
        *b = sp + 1;
        *b_len = strlen(sp + 1);
        return NOPAD_OK;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
        cJSON_IsString(cJSON_GetArrayItem(m, 0)) && cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
        *a = cJSON_GetArrayItem(m, 0)->valuestring;
        *b = cJSON_GetArrayItem(m, 1)->valuestring;
        *a_len = strlen(*a);
        *b_len = strlen(*b);
        return NOPAD_OK;
    }
    return nopad_set_error(NOPAD_ERR_FORMAT,
                           "%s: model.merges[%d] must be \"a b\" or [\"a\", \"b\"]", where, i);
}

nopad_status tok_bpe_load_model(nopad_tokenizer *t, const cJSON *model, const char *where) {
    tok_bpe *b = &t->bpe;
    t->model = TOK_MODEL_BPE;
    nopad_status st = optional_string(model, "continuing_subword_prefix", where, &b->prefix,
                                      &b->prefix_len);
    if (st == NOPAD_OK)
        st = optional_string(model, "end_of_word_suffix", where, &b->suffix, &b->suffix_len);
    if (st != NOPAD_OK) return st;
    const cJSON *dropout = tok_json_field(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) &&
        !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: BPE model.dropout is not supported (only null)", where);
    st = tok_json_get_bool(model, "byte_fallback", 0, "model.byte_fallback", where,
                           &b->byte_fallback);
    if (st == NOPAD_OK)
        st = tok_json_get_bool(model, "fuse_unk", 0, "model.fuse_unk", where, &b->fuse_unk);
    if (st == NOPAD_OK)
        st = tok_json_get_bool(model, "ignore_merges", 0, "model.ignore_merges", where,
                               &b->ignore_merges);
    if (st != NOPAD_OK) return st;

    t->unk_id = -1;
    const cJSON *unk = tok_json_field(model, "unk_token");
    if (unk && !cJSON_IsNull(unk)) {
        if (!cJSON_IsString(unk) || !unk->valuestring)
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: model.unk_token must be a string or null",
                                   where);
        t->unk_id = tok_vocab_get(&t->vocab, unk->valuestring, strlen(unk->valuestring));
        if (t->unk_id < 0)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: model.unk_token \"%.64s\" is not in model.vocab", where,
                                   unk->valuestring);
    }

    const cJSON *merges = tok_json_field(model, "merges");
    if (!merges) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: missing field model.merges", where);
    if (!cJSON_IsArray(merges))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: model.merges must be an array", where);
    int n = cJSON_GetArraySize(merges);
    st = tok_vocab_init(&b->merges, (size_t)n);
    if (st != NOPAD_OK) return nopad_wrap_error(st, "%s", where);
    b->merge_result = malloc((size_t)(n ? n : 1) * sizeof *b->merge_result);
    char *joined = NULL;
    size_t joined_cap = 0;
    if (!b->merge_result) return out_of_memory(where);
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        const char *pa = NULL, *pb = NULL;
        size_t la = 0, lb = 0;
        st = merge_parts(m, i, where, &pa, &la, &pb, &lb);
        if (st != NOPAD_OK) break;
        int32_t ia = tok_vocab_get(&t->vocab, pa, la), ib = tok_vocab_get(&t->vocab, pb, lb);
        if (ia < 0 || ib < 0) {
            st = nopad_set_error(NOPAD_ERR_FORMAT,
                                 "%s: model.merges[%d]: token \"%.*s\" is not in model.vocab",
                                 where, i, (int)(ia < 0 ? (la > 64 ? 64 : la) : (lb > 64 ? 64 : lb)),
                                 ia < 0 ? pa : pb);
            break;
        }
        if (la + lb > joined_cap) {
            char *j2 = realloc(joined, la + lb);
            if (!j2) {
                st = out_of_memory(where);
                break;
            }
            joined = j2;
            joined_cap = la + lb;
        }
        memcpy(joined, pa, la);
        memcpy(joined + la, pb, lb);
        int32_t result = tok_vocab_get(&t->vocab, joined, la + lb);
        if (result < 0) {
            st = nopad_set_error(NOPAD_ERR_FORMAT,
                                 "%s: model.merges[%d]: the merged token \"%.*s\" is not in "
                                 "model.vocab",
                                 where, i, (int)(la + lb > 64 ? 64 : la + lb), joined);
            break;
        }
        char key[8];
        pair_key(ia, ib, key);
        /* a repeated pair takes its later rank, as HF's HashMap built in file order does */
        st = tok_vocab_put(&b->merges, key, 8, i);
        if (st != NOPAD_OK) break;
        b->merge_result[i] = result;
        i++;
    }
    free(joined);
    b->n_merges = i;
    tok_byte_fallback_ids(&t->vocab, b->fallback_id);
    return st;
}

nopad_status tok_bpe_load_byte_level(nopad_tokenizer *t, const cJSON *pre, const char *where) {
    tok_bpe *b = &t->bpe;
    if (t->model != TOK_MODEL_BPE)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: pre_tokenizer ByteLevel is supported with a BPE model only",
                               where);
    nopad_status st = tok_json_get_bool(pre, "add_prefix_space", 1,
                                        "pre_tokenizer.add_prefix_space", where,
                                        &b->add_prefix_space);
    if (st == NOPAD_OK)
        st = tok_json_get_bool(pre, "use_regex", 1, "pre_tokenizer.use_regex", where,
                               &b->use_regex);
    int trim = 0; /* trim_offsets changes offsets only, and nopad returns none */
    if (st == NOPAD_OK)
        st = tok_json_get_bool(pre, "trim_offsets", 1, "pre_tokenizer.trim_offsets", where, &trim);
    if (st != NOPAD_OK) return st;
    tok_byte_chars(b->byte_char, b->byte_char_len);
    for (int c = 0; c < 256; c++)
        b->byte_id[c] = tok_vocab_get(&t->vocab, b->byte_char[c], b->byte_char_len[c]);
    if (b->use_regex && !b->split_re)
        return tok_regex_compile(tok_gpt2_split_regex, strlen(tok_gpt2_split_regex),
                                 "pre_tokenizer", where, &b->split_re);
    return NOPAD_OK;
}

/* ---- encoding ------------------------------------------------------------------------------- */

static nopad_status reserve(tok_bpe_work *w, size_t n) {
    if (n <= w->cap) return NOPAD_OK;
    size_t cap = w->cap * 2 > n ? w->cap * 2 : n;
    int32_t *sym = realloc(w->sym, cap * sizeof *sym);
    if (sym) w->sym = sym;
    int32_t *prev = realloc(w->prev, cap * sizeof *prev);
    if (prev) w->prev = prev;
    int32_t *next = realloc(w->next, cap * sizeof *next);
    if (next) w->next = next;
    /* n - 1 first candidates, then at most two per merge, and there are at most n - 1 merges */
    tok_bpe_merge *heap = realloc(w->heap, 3 * cap * sizeof *heap);
    if (heap) w->heap = heap;
    if (!sym || !prev || !next || !heap)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tokenizer: cannot allocate a %zu-byte word",
                               n);
    w->cap = cap;
    w->heap_cap = 3 * cap;
    return NOPAD_OK;
}

/* HF's Merge order: lower rank first, then lower position. */
static int merge_before(const tok_bpe_merge *x, const tok_bpe_merge *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void heap_push(tok_bpe_work *w, tok_bpe_merge m) {
    size_t i = w->heap_len++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!merge_before(&m, &w->heap[parent])) break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = m;
}

static tok_bpe_merge heap_pop(tok_bpe_work *w) {
    tok_bpe_merge top = w->heap[0], last = w->heap[--w->heap_len];
    size_t i = 0, n = w->heap_len;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && merge_before(&w->heap[c + 1], &w->heap[c])) c++;
        if (!merge_before(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

static nopad_status reserve_bytes(char **buf, size_t *cap, size_t n) {
    if (n <= *cap) return NOPAD_OK;
    size_t c = *cap * 2 > n ? *cap * 2 : n;
    char *p = realloc(*buf, c);
    if (!p) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tokenizer: cannot allocate %zu bytes", c);
    *buf = p;
    *cap = c;
    return NOPAD_OK;
}

/* The rank of the merge of x and y, or -1. */
static int32_t pair_rank(const tok_bpe *b, int32_t x, int32_t y) {
    char key[8];
    pair_key(x, y, key);
    return tok_vocab_get(&b->merges, key, 8);
}

/* Queues the merge of symbol pos with the one after it, if there is one. */
static void push_pair(const tok_bpe *b, tok_bpe_work *w, int32_t pos) {
    int32_t rank = pair_rank(b, w->sym[pos], w->sym[w->next[pos]]);
    if (rank >= 0) heap_push(w, (tok_bpe_merge){rank, pos, b->merge_result[rank]});
}

/* Merges w->sym[0..m) by rank until no pair merges; returns the number of symbols left. */
static size_t merge_symbols(const tok_bpe *b, tok_bpe_work *w, size_t m) {
    if (m == 0) return 0;
    for (size_t i = 0; i < m; i++) {
        w->prev[i] = (int32_t)i - 1;
        w->next[i] = i + 1 < m ? (int32_t)i + 1 : -1;
    }
    w->heap_len = 0;
    for (size_t i = 0; i + 1 < m; i++) push_pair(b, w, (int32_t)i);
    while (w->heap_len > 0) {
        tok_bpe_merge top = heap_pop(w);
        int32_t pos = top.pos;
        if (w->prev[pos] == -2 || w->next[pos] < 0) continue; /* merged away, or now last */
        int32_t right = w->next[pos];
        /* HF's test: does the pair there now still merge into the same token? */
        int32_t rank = pair_rank(b, w->sym[pos], w->sym[right]);
        if (rank < 0 || b->merge_result[rank] != top.result) continue;
        w->sym[pos] = top.result;
        w->next[pos] = w->next[right];
        w->prev[right] = -2;
        if (w->next[pos] >= 0) w->prev[w->next[pos]] = pos;
        if (w->prev[pos] >= 0) push_pair(b, w, w->prev[pos]);
        if (w->next[pos] >= 0) push_pair(b, w, pos);
    }
    size_t k = 0; /* the surviving symbols, in order, to the front of sym */
    for (int32_t i = 0; i >= 0; i = w->next[i]) w->sym[k++] = w->sym[i];
    return k;
}

/* BPE on one word s[0..n) of raw bytes; its ids go to emit. */
static nopad_status bpe_word(const nopad_tokenizer *t, tok_bpe_work *w, const char *s, size_t n,
                             tok_emit_fn emit, void *ctx, int *stop) {
    const tok_bpe *b = &t->bpe;
    if (n == 0) return NOPAD_OK;
    nopad_status st;
    if (b->ignore_merges) { /* the whole word, if it is a token */
        st = reserve_bytes(&w->word, &w->word_cap, 2 * n);
        if (st != NOPAD_OK) return st;
        size_t len = 0;
        for (size_t i = 0; i < n; i++) {
            uint8_t c = (uint8_t)s[i];
            memcpy(w->word + len, b->byte_char[c], b->byte_char_len[c]);
            len += b->byte_char_len[c];
        }
        int32_t id = tok_vocab_get(&t->vocab, w->word, len);
        if (id >= 0) {
            *stop = emit(ctx, &id, 1);
            return NOPAD_OK;
        }
    }
    if (n >= INT32_MAX / 4)
        return nopad_set_error(NOPAD_ERR_TOO_LONG, "tokenizer: a word of %zu bytes is too long", n);
    st = reserve(w, n);
    if (st != NOPAD_OK) return st;
    size_t m = 0;
    int pending_unk = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = b->byte_id[(uint8_t)s[i]];
        if (id >= 0) {
            w->sym[m++] = id;
            pending_unk = 0;
        } else if (t->unk_id >= 0) { /* else HF drops the character */
            if (!(b->fuse_unk && pending_unk)) w->sym[m++] = t->unk_id;
            pending_unk = 1;
        }
    }
    m = merge_symbols(b, w, m);
    if (m == 0) return NOPAD_OK;
    *stop = emit(ctx, w->sym, m);
    return NOPAD_OK;
}

nopad_status tok_bpe_encode_piece(const nopad_tokenizer *t, tok_bpe_work *w, const char *s,
                                  size_t n, tok_emit_fn emit, void *ctx) {
    const tok_bpe *b = &t->bpe;
    nopad_status st;
    if (b->add_prefix_space && (n == 0 || s[0] != ' ')) {
        st = reserve_bytes(&w->text, &w->text_cap, n + 1);
        if (st != NOPAD_OK) return st;
        w->text[0] = ' ';
        if (n) memcpy(w->text + 1, s, n);
        s = w->text;
        n++;
    }
    int stop = 0;
    if (!b->split_re) return bpe_word(t, w, s, n, emit, ctx, &stop);
    if (!w->match) {
        w->match = pcre2_match_data_create_from_pattern((const pcre2_code *)b->split_re, NULL);
        if (!w->match)
            return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tokenizer: cannot allocate a match");
    }
    size_t off = 0;
    st = NOPAD_OK;
    while (off < n && !stop && st == NOPAD_OK) {
        int rc = pcre2_match((const pcre2_code *)b->split_re, (PCRE2_SPTR)s, n, off,
                             PCRE2_NO_UTF_CHECK, (pcre2_match_data *)w->match, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) {
            st = bpe_word(t, w, s + off, n - off, emit, ctx, &stop);
            break;
        }
        if (rc < 0)
            return nopad_set_error(NOPAD_ERR_INTERNAL,
                                   "tokenizer: the ByteLevel regex failed (PCRE2 error %d)", rc);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer((pcre2_match_data *)w->match);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms || ms < off) { /* the regex never matches empty; be safe anyway */
            st = bpe_word(t, w, s + off, n - off, emit, ctx, &stop);
            break;
        }
        if (ms > off) st = bpe_word(t, w, s + off, ms - off, emit, ctx, &stop);
        if (st == NOPAD_OK && !stop) st = bpe_word(t, w, s + ms, me - ms, emit, ctx, &stop);
        off = me;
    }
    return st;
}

/* The general pipeline's BPE on one word (HF's BPE::merge_word): each character is a symbol
 * (with continuing_subword_prefix after the first, end_of_word_suffix on the last); a character
 * not in the vocab becomes its bytes' <0xNN> tokens with byte_fallback (when all exist), else the
 * unknown token (consecutive ones fused with fuse_unk), else it is dropped. As in HF, a pending
 * unknown token is only written when the next known character (or the end) comes. */
nopad_status tok_bpe_encode_word(const nopad_tokenizer *t, tok_bpe_work *bw, tok_pipe_work *w,
                                 const char *s, size_t n, size_t *n_ids) {
    const tok_bpe *b = &t->bpe;
    *n_ids = 0;
    if (n == 0) return NOPAD_OK;
    if (b->ignore_merges) {
        int32_t id = tok_vocab_get(&t->vocab, s, n);
        if (id >= 0) {
            nopad_status st = tok_pipe_reserve_ids(w, 1);
            if (st == NOPAD_OK) {
                w->ids[0] = id;
                *n_ids = 1;
            }
            return st;
        }
    }
    if (n >= INT32_MAX / 4)
        return nopad_set_error(NOPAD_ERR_TOO_LONG, "tokenizer: a word of %zu bytes is too long", n);
    /* up to 4 byte-fallback symbols per byte-length character: at most n symbols */
    nopad_status st = reserve(bw, n);
    if (st == NOPAD_OK) st = reserve_bytes(&bw->word, &bw->word_cap, b->prefix_len + 4 + b->suffix_len);
    if (st != NOPAD_OK) return st;
    size_t m = 0;
    int32_t unk = -1; /* pending unknown token */
    for (size_t pos = 0; pos < n;) {
        size_t p0 = pos;
        tok_utf8_next(s, &pos);
        size_t len = 0;
        if (p0 > 0 && b->prefix_len) {
            memcpy(bw->word, b->prefix, b->prefix_len);
            len = b->prefix_len;
        }
        memcpy(bw->word + len, s + p0, pos - p0);
        len += pos - p0;
        if (pos == n && b->suffix_len) {
            memcpy(bw->word + len, b->suffix, b->suffix_len);
            len += b->suffix_len;
        }
        int32_t id = tok_vocab_get(&t->vocab, bw->word, len);
        if (id >= 0) {
            if (unk >= 0) bw->sym[m++] = unk;
            unk = -1;
            bw->sym[m++] = id;
            continue;
        }
        if (b->byte_fallback) {
            int all = 1;
            for (size_t i = 0; i < len && all; i++) all = b->fallback_id[(uint8_t)bw->word[i]] >= 0;
            if (all) {
                if (m + len > bw->cap) {
                    st = reserve(bw, m + len + (n - pos));
                    if (st != NOPAD_OK) return st;
                }
                for (size_t i = 0; i < len; i++) bw->sym[m++] = b->fallback_id[(uint8_t)bw->word[i]];
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (unk >= 0 && !b->fuse_unk) bw->sym[m++] = unk;
            unk = t->unk_id;
        }
        if (m + 2 + (n - pos) > bw->cap) {
            st = reserve(bw, m + 2 + (n - pos));
            if (st != NOPAD_OK) return st;
        }
    }
    if (unk >= 0) bw->sym[m++] = unk;
    m = merge_symbols(b, bw, m);
    st = tok_pipe_reserve_ids(w, m);
    if (st != NOPAD_OK) return st;
    if (m) memcpy(w->ids, bw->sym, m * sizeof *w->ids); /* every character dropped: none */
    *n_ids = m;
    return NOPAD_OK;
}

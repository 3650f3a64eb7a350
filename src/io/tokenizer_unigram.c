/* Unigram (SentencePiece's model: XLM-RoBERTa, ALBERT, DeBERTa-v3, T5), as Hugging Face
 * tokenizers encodes with it:
 *
 *   Viterbi over the word's bytes: at each character boundary, every vocab piece that starts
 *   there extends the best path ending there (score = sum of piece log-probabilities; a strictly
 *   better score wins, so among equals the first found, i.e. the shortest piece, stays). A
 *   position where no piece of exactly one character starts also gets the unknown piece for that
 *   character, scored min_score - 10. Walking back, consecutive unknown characters fuse into one
 *   string; a fused string that is a piece is that piece, else its bytes' <0xNN> tokens when
 *   byte_fallback is on (and all exist), else the unknown id.
 *
 * Pieces are found by hashing every prefix of the rest of the word up to the longest piece, so a
 * word of n bytes costs O(n * longest piece) lookups and no trie is needed. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_internal.h"
#include "util/error.h"

static const double UNK_PENALTY = 10.0;

void tok_unigram_free(tok_unigram *u) {
    free(u->score);
    memset(u, 0, sizeof *u);
}

void tok_byte_fallback_ids(const tok_vocab *v, int32_t fallback[256]) {
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        fallback[b] = tok_vocab_get(v, name, 6);
    }
}

nopad_status tok_unigram_load_model(nopad_tokenizer *t, const cJSON *model, const char *where) {
    tok_unigram *u = &t->unigram;
    t->model = TOK_MODEL_UNIGRAM;
    const cJSON *vocab = tok_json_field(model, "vocab");
    if (!vocab) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: missing field model.vocab", where);
    if (!cJSON_IsArray(vocab))
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: model.vocab of a Unigram model must be an array of "
                               "[piece, score]",
                               where);
    int n = cJSON_GetArraySize(vocab);
    if (n <= 0)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: model.vocab of a Unigram model is empty",
                               where);
    nopad_status st = tok_vocab_init(&t->vocab, (size_t)n);
    if (st != NOPAD_OK) return nopad_wrap_error(st, "%s", where);
    u->score = malloc((size_t)n * sizeof *u->score);
    if (!u->score) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", where);
    u->n = n;
    u->min_score = INFINITY;
    int i = 0;
    const cJSON *entry;
    cJSON_ArrayForEach(entry, vocab) {
        const cJSON *piece = cJSON_GetArrayItem(entry, 0), *score = cJSON_GetArrayItem(entry, 1);
        if (!cJSON_IsArray(entry) || cJSON_GetArraySize(entry) != 2 || !cJSON_IsString(piece) ||
            !piece->valuestring || !cJSON_IsNumber(score) || !isfinite(score->valuedouble))
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: model.vocab[%d] must be [piece, finite score]", where, i);
        size_t len = strlen(piece->valuestring);
        if (tok_utf8_check(piece->valuestring, len) != len)
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: model.vocab[%d] is not valid UTF-8",
                                   where, i);
        /* a repeated piece maps to its later id, as HF's HashMap built in order does */
        st = tok_vocab_put(&t->vocab, piece->valuestring, len, i);
        if (st != NOPAD_OK) return nopad_wrap_error(st, "%s", where);
        u->score[i] = score->valuedouble;
        if (u->score[i] < u->min_score) u->min_score = u->score[i];
        i++;
    }
    t->unk_id = -1;
    const cJSON *unk = tok_json_field(model, "unk_id");
    if (unk && !cJSON_IsNull(unk)) {
        if (!tok_json_as_id(unk, &t->unk_id) || t->unk_id >= n)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: model.unk_id must be null or an index of model.vocab "
                                   "(0..%d)",
                                   where, n - 1);
    }
    st = tok_json_get_bool(model, "byte_fallback", 0, "model.byte_fallback", where,
                           &u->byte_fallback);
    if (st != NOPAD_OK) return st;
    tok_byte_fallback_ids(&t->vocab, u->fallback_id);
    return NOPAD_OK;
}

static nopad_status reserve_best(tok_pipe_work *w, size_t n) {
    if (n <= w->best_cap) return NOPAD_OK;
    size_t cap = w->best_cap * 2 > n ? w->best_cap * 2 : n;
    double *best = realloc(w->best, cap * sizeof *best);
    if (best) w->best = best;
    int32_t *start = realloc(w->best_start, cap * sizeof *start);
    if (start) w->best_start = start;
    int32_t *id = realloc(w->best_id, cap * sizeof *id);
    if (id) w->best_id = id;
    if (!best || !start || !id)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tokenizer: cannot allocate a %zu-byte word",
                               n);
    w->best_cap = cap;
    return NOPAD_OK;
}

static size_t char_len(const char *s, size_t pos) {
    unsigned char b = (unsigned char)s[pos];
    return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

/* Appends the id(s) of one result string s[a..b): its piece id, else byte fallback, else unk. */
static nopad_status emit_string(const nopad_tokenizer *t, tok_pipe_work *w, size_t *n_ids,
                                const char *s, size_t len, int32_t id) {
    const tok_unigram *u = &t->unigram;
    if (id < 0) id = tok_vocab_get(&t->vocab, s, len);
    if (id < 0 && u->byte_fallback) {
        int all = 1;
        for (size_t i = 0; i < len && all; i++) all = u->fallback_id[(uint8_t)s[i]] >= 0;
        if (all) {
            nopad_status st = tok_pipe_reserve_ids(w, *n_ids + len);
            if (st != NOPAD_OK) return st;
            for (size_t i = 0; i < len; i++) w->ids[(*n_ids)++] = u->fallback_id[(uint8_t)s[i]];
            return NOPAD_OK;
        }
    }
    if (id < 0) id = t->unk_id;
    if (id < 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "tokenizer: the Unigram model has no unknown piece (unk_id null) "
                               "and the text holds a character it cannot encode");
    nopad_status st = tok_pipe_reserve_ids(w, *n_ids + 1);
    if (st == NOPAD_OK) w->ids[(*n_ids)++] = id;
    return st;
}

nopad_status tok_unigram_encode_word(const nopad_tokenizer *t, tok_pipe_work *w, const char *s,
                                     size_t n, size_t *n_ids) {
    const tok_unigram *u = &t->unigram;
    *n_ids = 0;
    if (n == 0) return NOPAD_OK;
    if (n >= INT32_MAX)
        return nopad_set_error(NOPAD_ERR_TOO_LONG, "tokenizer: a word of %zu bytes is too long", n);
    nopad_status st = reserve_best(w, n + 1);
    if (st != NOPAD_OK) return st;
    const double unk_score = u->min_score - UNK_PENALTY;
    const size_t max_len = t->vocab.max_key_len;
    for (size_t i = 0; i <= n; i++) w->best_start[i] = -1;
    w->best[0] = 0;
    for (size_t start = 0; start < n;) {
        size_t mblen = char_len(s, start);
        int has_single = 0;
        const double here = w->best[start];
        if (w->best_start[start] >= 0 || start == 0) {
            uint64_t h = TOK_HASH_INIT;
            size_t lim = n - start < max_len ? n - start : max_len;
            for (size_t len = 1; len <= lim; len++) {
                h = tok_hash_step(h, (uint8_t)s[start + len - 1]);
                /* pieces are valid UTF-8, so only lengths that end a character can match */
                if (start + len < n && ((unsigned char)s[start + len] & 0xC0) == 0x80) continue;
                int32_t id = tok_vocab_find(&t->vocab, h, s + start, len);
                if (id < 0) continue;
                double cand = here + u->score[id];
                size_t end = start + len;
                if (w->best_start[end] < 0 || cand > w->best[end]) {
                    w->best[end] = cand;
                    w->best_start[end] = (int32_t)start;
                    w->best_id[end] = id;
                }
                if (len == mblen) has_single = 1;
            }
            if (!has_single) {
                size_t end = start + mblen;
                double cand = here + unk_score;
                if (w->best_start[end] < 0 || cand > w->best[end]) {
                    if (t->unk_id < 0)
                        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                               "tokenizer: the Unigram model has no unknown piece "
                                               "(unk_id null) and the text holds a character it "
                                               "cannot encode");
                    w->best[end] = cand;
                    w->best_start[end] = (int32_t)start;
                    w->best_id[end] = t->unk_id;
                }
            }
        }
        start += mblen;
    }
    /* walk back, recording the path as (start, end, id) triples in w->spans, last piece first;
     * runs of unknown characters fuse into one triple with id -1 */
    size_t n_seg = 0;
    for (size_t end = n; end > 0;) {
        size_t start = (size_t)w->best_start[end];
        int32_t id = w->best_id[end];
        int fuse = t->unk_id >= 0 && id == t->unk_id; /* HF's fuse_unk, always on for Unigram */
        if (fuse && n_seg > 0 && w->spans[3 * (n_seg - 1) + 2] == SIZE_MAX) {
            w->spans[3 * (n_seg - 1)] = start;
        } else {
            if (3 * (n_seg + 1) > w->spans_cap) {
                size_t cap = w->spans_cap ? 2 * w->spans_cap : 96;
                size_t *sp = realloc(w->spans, cap * sizeof *sp);
                if (!sp) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
                w->spans = sp;
                w->spans_cap = cap;
            }
            w->spans[3 * n_seg] = start;
            w->spans[3 * n_seg + 1] = end;
            w->spans[3 * n_seg + 2] = fuse ? SIZE_MAX : (size_t)id;
            n_seg++;
        }
        end = start;
    }
    size_t count = 0;
    for (size_t k = n_seg; k-- > 0;) {
        const size_t *sp = w->spans + 3 * k;
        st = emit_string(t, w, &count, s + sp[0], sp[1] - sp[0],
                         sp[2] == SIZE_MAX ? -1 : (int32_t)sp[2]);
        if (st != NOPAD_OK) return st;
    }
    *n_ids = count;
    return NOPAD_OK;
}

/* Training data: reading and tokenizing a corpus, dynamic MLM masking, token-budget batches. */
#include "train/data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/json.h"
#include "io/tokenizer_internal.h"
#include "util/error.h"
#include "util/file.h"
#include "util/philox.h"

/* Counter word 3 separates the generator's uses, so no two draw the same block (its bits above
 * the second carry the high half of a 64-bit example index). */
enum { STREAM_MASK = 0, STREAM_SHUFFLE = TRAIN_SHUFFLE_EXAMPLES, STREAM_BLOCKS = TRAIN_SHUFFLE_BLOCKS };
/* Counter word 0 of the draw that picks the one masked token of an example none was chosen in
 * (positions are below 2^31, so it meets no per-token draw). */
static const uint32_t FALLBACK_POS = 0xFFFFFFFFu;

train_data_params train_data_default_params(void) {
    train_data_params p = {.format = TRAIN_DATA_LINES, .task = TRAIN_TASK_MLM, .num_labels = 2,
                           .max_length = 512, .vocab_size = 0, .truncate = 0, .mask_prob = 0.15f};
    return p;
}

static void draw(uint64_t seed, uint32_t c0, uint32_t c1, uint32_t c2, uint32_t stream,
                 uint32_t out[4]) {
    const uint32_t counter[4] = {c0, c1, c2, stream};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    philox4x32_10(counter, key, out);
}

/* A uniform index in [0, n) from 32 random bits (Lemire's multiply; the bias is below n / 2^32). */
static uint32_t uniform_index(uint32_t bits, uint32_t n) {
    return (uint32_t)(((uint64_t)bits * n) >> 32);
}

/* ---- loading --------------------------------------------------------------------------------- */

/* One call of train_dataset_add_lines: the dataset and the tokenizer's output scratch. */
typedef struct builder {
    train_dataset *d;
    int32_t *scratch;
    int32_t cap_scratch;
} builder;

static nopad_status grow(void **p, size_t elem, int64_t need, int64_t *cap) {
    if (need <= *cap) return NOPAD_OK;
    int64_t n = *cap ? *cap : 1024;
    while (n < need) n *= 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "training data: out of memory");
    *p = q;
    *cap = n;
    return NOPAD_OK;
}

/* Room for one more example in every per-example array (offsets has one entry more). */
static nopad_status grow_examples(train_dataset *d) {
    if (d->n_examples + 2 <= d->cap_examples) return NOPAD_OK;
    const int32_t n = d->cap_examples ? 2 * d->cap_examples : 1024;
    int64_t *off = realloc(d->offsets, (size_t)(n + 1) * sizeof *off);
    if (off) d->offsets = off;
    int32_t *t0 = off ? realloc(d->type0_len, (size_t)n * sizeof *t0) : NULL;
    if (t0) d->type0_len = t0;
    int64_t *ln = t0 ? realloc(d->line, (size_t)n * sizeof *ln) : NULL;
    if (ln) d->line = ln;
    int64_t *ix = ln ? realloc(d->index, (size_t)n * sizeof *ix) : NULL;
    if (ix) d->index = ix;
    int32_t *lab = ix ? realloc(d->labels, (size_t)n * sizeof *lab) : NULL;
    if (lab) d->labels = lab;
    float *tg = lab ? realloc(d->targets, (size_t)n * sizeof *tg) : NULL;
    if (tg) d->targets = tg;
    if (!tg) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "training data: out of memory");
    d->cap_examples = n;
    return NOPAD_OK;
}

/* Ids of `text` without special tokens, into b->scratch + at; *n receives the count. */
static nopad_status tokenize(builder *b, const nopad_tokenizer *tok, const char *text, size_t len,
                             int32_t at, int32_t *n, const char *where) {
    nopad_tokenize_params tp = nopad_tokenize_default_params();
    tp.add_special_tokens = 0;
    for (;;) {
        nopad_status st = nopad_tokenize(tok, text, len, &tp, b->scratch + at, b->cap_scratch - at, n);
        if (st == NOPAD_OK) return NOPAD_OK;
        if (st != NOPAD_ERR_BUFFER_TOO_SMALL) return nopad_wrap_error(st, "%s", where);
        int64_t cap = b->cap_scratch;
        st = grow((void **)&b->scratch, sizeof(int32_t), (int64_t)at + *n + 1, &cap);
        if (st != NOPAD_OK) return st;
        b->cap_scratch = (int32_t)cap;
    }
}

static nopad_status add_example(builder *b, const nopad_tokenizer *tok, const char *a, size_t la_bytes,
                                const char *pb, size_t lb_bytes, int32_t label, float target,
                                int64_t line, int64_t index, const char *where) {
    train_dataset *d = b->d;
    int32_t la = 0, lb = 0;
    nopad_status st = tokenize(b, tok, a, la_bytes, 0, &la, where);
    if (st == NOPAD_OK && pb) st = tokenize(b, tok, pb, lb_bytes, la, &lb, where);
    if (st != NOPAD_OK) return st;
    if (d->params.format == TRAIN_DATA_LINES && la == 0) { // nothing but whitespace or controls
        d->n_skipped++;
        return NOPAD_OK;
    }
    const int32_t n_special = tok->n_prefix + tok->n_suffix * (pb ? 2 : 1);
    const int32_t budget = d->params.max_length - n_special;
    if (budget < 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s: the template alone has %d special tokens, more than the model "
                               "maximum %d", where, n_special, d->params.max_length);
    const int packed = d->params.pack && d->params.task == TRAIN_TASK_MLM; /* lines cut anew later */
    if (la + lb > budget && !packed) {
        if (!d->params.truncate)
            return nopad_set_error(NOPAD_ERR_TOO_LONG,
                                   "%s: %d tokens with the special ones, more than the model "
                                   "maximum %d (truncation is off)",
                                   where, la + lb + n_special, d->params.max_length);
        d->n_truncated++;
        int32_t ka = la, kb = lb;
        while (ka + kb > budget) { // longest first
            if (ka > kb) ka--;
            else kb--;
        }
        memmove(b->scratch + ka, b->scratch + la, (size_t)kb * sizeof(int32_t));
        la = ka, lb = kb;
    }
    if (d->params.task == TRAIN_TASK_MLM) { // nothing left to predict: only [UNK]s or specials
        int32_t maskable = 0;
        for (int32_t i = 0; i < la + lb && !maskable; i++)
            maskable = b->scratch[i] >= 0 && b->scratch[i] < d->vocab_size && !d->special[b->scratch[i]];
        if (!maskable) {
            d->n_skipped++;
            return NOPAD_OK;
        }
    }
    const int32_t len = la + lb + n_special;
    st = grow((void **)&d->ids, sizeof(int32_t), d->n_tokens + len, &d->cap_tokens);
    if (st == NOPAD_OK) st = grow_examples(d);
    if (st != NOPAD_OK) return st;
    int32_t *out = d->ids + d->n_tokens;
    int32_t k = 0;
    for (int32_t i = 0; i < tok->n_prefix; i++) out[k++] = tok->prefix_ids[i];
    for (int32_t i = 0; i < la; i++) out[k++] = b->scratch[i];
    for (int32_t i = 0; i < tok->n_suffix; i++) out[k++] = tok->suffix_ids[i];
    const int32_t type0 = k;
    if (pb) {
        for (int32_t i = 0; i < lb; i++) out[k++] = b->scratch[la + i];
        for (int32_t i = 0; i < tok->n_suffix; i++) out[k++] = tok->suffix_ids[i];
    }
    for (int32_t i = 0; i < k; i++)
        if (out[i] < 0 || out[i] >= d->vocab_size)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "%s: token id %d is outside the model's vocabulary of %d",
                                   where, out[i], d->vocab_size);
    const int32_t e = d->n_examples++;
    d->offsets[e] = d->n_tokens;
    d->n_tokens += k;
    d->offsets[e + 1] = d->n_tokens;
    d->type0_len[e] = type0;
    d->line[e] = line;
    d->index[e] = index;
    d->labels[e] = label;
    d->targets[e] = target;
    return NOPAD_OK;
}

/* The label of a JSONL line: an integer in [0, num_labels), or a finite number for regression. */
static nopad_status parse_label(const train_dataset *d, const cJSON *obj, const char *where,
                                int32_t *label, float *target) {
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(obj, "label");
    if (!l) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: no \"label\" field", where);
    if (!cJSON_IsNumber(l)) return json_wrong_type(where, "label", "a number", l);
    const double v = l->valuedouble;
    if (d->params.num_labels == 1) {
        if (!isfinite(v) || !isfinite((float)v))
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: label %g is not a finite float32", where, v);
        *target = (float)v;
        return NOPAD_OK;
    }
    if (v != floor(v))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: label %g is not an integer", where, v);
    if (v < 0 || v >= d->params.num_labels)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s: label %g out of range, expected 0 to %d", where, v,
                               d->params.num_labels - 1);
    *label = (int32_t)v;
    return NOPAD_OK;
}

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\v' && s[i] != '\f') return 0;
    return 1;
}

static nopad_status load_line(builder *b, const nopad_tokenizer *tok, const char *s, size_t n,
                              int64_t line, int64_t index, const char *where) {
    train_dataset *d = b->d;
    if (blank(s, n)) {
        d->n_skipped++;
        return NOPAD_OK;
    }
    if (d->params.format == TRAIN_DATA_LINES)
        return add_example(b, tok, s, n, NULL, 0, 0, 0.0f, line, index, where);
    cJSON *obj = cJSON_ParseWithLength(s, n);
    nopad_status st = NOPAD_OK;
    if (!obj || !cJSON_IsObject(obj)) {
        st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s", where,
                             obj ? "not a JSON object" : "not valid JSON");
        cJSON_Delete(obj);
        return st;
    }
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(obj, "text");
    const cJSON *pair = cJSON_GetObjectItemCaseSensitive(obj, "text_pair");
    int32_t label = 0;
    float target = 0.0f;
    if (!text) st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: no \"text\" field", where);
    else if (!cJSON_IsString(text)) st = json_wrong_type(where, "text", "a string", text);
    else if (pair && !cJSON_IsNull(pair) && !cJSON_IsString(pair))
        st = json_wrong_type(where, "text_pair", "a string", pair);
    if (st == NOPAD_OK && d->params.task == TRAIN_TASK_CLASSIFY)
        st = parse_label(d, obj, where, &label, &target);
    if (st == NOPAD_OK) {
        const int has_pair = pair && cJSON_IsString(pair);
        st = add_example(b, tok, text->valuestring, strlen(text->valuestring),
                         has_pair ? pair->valuestring : NULL,
                         has_pair ? strlen(pair->valuestring) : 0, label, target, line, index,
                         where);
    }
    cJSON_Delete(obj);
    return st;
}

/* continues[id] for whole-word masking: the pieces that start with the WordPiece continuation
 * prefix ("##"). Words are only known that way for WordPiece (as in HF's whole-word collator);
 * a BPE or Unigram vocabulary marks word starts instead, with pieces such as punctuation that
 * belong to neither. */
static nopad_status word_pieces(const nopad_tokenizer *tok, train_dataset *d) {
    const char *prefix = tok->model == TOK_MODEL_WORDPIECE ? tok->subword_prefix
                         : tok->model == TOK_MODEL_BPE     ? tok->bpe.prefix
                                                           : NULL;
    const size_t prefix_len = tok->model == TOK_MODEL_WORDPIECE ? tok->subword_prefix_len
                              : tok->model == TOK_MODEL_BPE     ? tok->bpe.prefix_len
                                                                : 0;
    if (!prefix || prefix_len == 0)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "training data: whole-word masking needs a WordPiece tokenizer (words "
                               "continued by \"##\" pieces); this tokenizer is %s without a "
                               "continuing-subword prefix",
                               tok->model == TOK_MODEL_BPE ? "BPE" : tok->model == TOK_MODEL_UNIGRAM
                                                                         ? "Unigram" : "WordPiece");
    d->continues = calloc((size_t)d->vocab_size, 1);
    if (!d->continues) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "training data: out of memory");
    for (int32_t id = 0; id < d->vocab_size; id++) {
        size_t len = 0;
        const char *piece = d->special[id] ? NULL : nopad_tokenizer_id_to_token(tok, id, &len);
        d->continues[id] = piece && len > prefix_len && memcmp(piece, prefix, prefix_len) == 0;
    }
    return NOPAD_OK;
}

static nopad_status special_tokens(const nopad_tokenizer *tok, train_dataset *d) {
    const int32_t V = d->vocab_size;
    d->special = calloc((size_t)V, 1);
    d->plain_ids = malloc((size_t)V * sizeof(int32_t));
    if (!d->special || !d->plain_ids)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "training data: out of memory");
    for (int32_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].special && tok->added[i].id >= 0 && tok->added[i].id < V)
            d->special[tok->added[i].id] = 1;
    for (int32_t i = 0; i < tok->n_prefix; i++)
        if (tok->prefix_ids[i] < V) d->special[tok->prefix_ids[i]] = 1;
    for (int32_t i = 0; i < tok->n_suffix; i++)
        if (tok->suffix_ids[i] < V) d->special[tok->suffix_ids[i]] = 1;
    d->mask_id = nopad_tokenizer_token_to_id(tok, "[MASK]");
    if (d->mask_id < 0) d->mask_id = nopad_tokenizer_token_to_id(tok, "<mask>");
    if (d->mask_id >= V) d->mask_id = -1;
    if (d->mask_id >= 0) d->special[d->mask_id] = 1;
    for (int32_t i = 0; i < V; i++)
        if (!d->special[i]) d->plain_ids[d->n_plain++] = i;
    if (d->params.task == TRAIN_TASK_MLM && (d->mask_id < 0 || d->n_plain == 0))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "training data: masked-LM needs a [MASK] (or <mask>) token in the "
                               "tokenizer and model vocabulary, and ids that are not special");
    return d->params.whole_word ? word_pieces(tok, d) : NOPAD_OK;
}

nopad_status train_dataset_load(const char *path, const nopad_tokenizer *tok,
                                const train_data_params *params, train_dataset *out) {
    memset(out, 0, sizeof *out);
    if (!path || !tok || !params)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_dataset_load: NULL argument");
    char *text = NULL;
    size_t len = 0;
    nopad_status st = read_file(path, 0, &text, &len);
    if (st == NOPAD_OK) st = train_dataset_parse(text, len, path, tok, params, out);
    free(text);
    return st;
}

nopad_status train_dataset_init(const nopad_tokenizer *tok, const train_data_params *params,
                                train_dataset *out) {
    memset(out, 0, sizeof *out);
    if (!tok || !params)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_dataset_init: NULL argument");
    const train_data_params *p = params;
    if (p->format != TRAIN_DATA_LINES && p->format != TRAIN_DATA_JSONL)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "training data: unknown format %d",
                               (int)p->format);
    if (p->task == TRAIN_TASK_CLASSIFY && p->format != TRAIN_DATA_JSONL)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "training data: classification reads JSONL (\"text\", \"label\")");
    if (p->task == TRAIN_TASK_CLASSIFY && p->num_labels < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "training data: num_labels %d, expected >= 1", p->num_labels);
    if (p->max_length < 3)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "training data: max_length %d, expected >= 3", p->max_length);
    if (p->task == TRAIN_TASK_MLM && !(p->mask_prob > 0.0f && p->mask_prob < 1.0f))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "training data: mask_prob %g, expected in (0, 1)", p->mask_prob);
    out->params = *p;
    out->vocab_size = p->vocab_size > 0 ? p->vocab_size : nopad_tokenizer_vocab_size(tok);
    out->mask_id = -1;
    nopad_status st = special_tokens(tok, out);
    if (st != NOPAD_OK) train_dataset_free(out);
    return st;
}

nopad_status train_dataset_add_lines(train_dataset *d, const nopad_tokenizer *tok, const char *text,
                                     size_t len, size_t owned, const char *path,
                                     int64_t first_line, int64_t first_index) {
    builder b = {.d = d, .cap_scratch = 256};
    b.scratch = malloc((size_t)b.cap_scratch * sizeof(int32_t));
    if (!b.scratch) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "training data: out of memory");
    nopad_status st = NOPAD_OK;
    int64_t line = first_line, index = first_index;
    for (size_t at = 0; st == NOPAD_OK && at < owned; line++) {
        const char *nl = memchr(text + at, '\n', len - at);
        const size_t end = nl ? (size_t)(nl - text) : len;
        size_t n = end - at;
        if (n && text[at + n - 1] == '\r') n--;
        char where[64 + 512];
        snprintf(where, sizeof where, "%.512s: line %lld", path, (long long)line);
        const int32_t before = d->n_examples;
        st = load_line(&b, tok, text + at, n, line, index, where);
        index += d->n_examples - before;
        at = end + 1;
    }
    free(b.scratch);
    return st;
}

void train_dataset_clear(train_dataset *d) {
    d->n_examples = 0;
    d->n_tokens = 0;
    d->n_truncated = d->n_skipped = 0;
}

size_t train_dataset_bytes(const train_dataset *d) {
    return (size_t)d->cap_tokens * sizeof(int32_t) +
           (size_t)d->cap_examples * (sizeof *d->offsets + sizeof *d->type0_len + sizeof *d->line +
                                      sizeof *d->index + sizeof *d->labels + sizeof *d->targets) +
           (d->special ? (size_t)d->vocab_size * (1 + sizeof(int32_t)) : 0);
}

/* params.pack: the examples already lie one after another in ids, so packing only cuts the stream
 * anew, into pieces of max_length tokens (HF's run_mlm.py without --line_by_line: its group_texts
 * keeps the remainder only when it fills a block; here it is a shorter last example). A piece is
 * keyed by its place (index = its number), so its masking is its own; a piece with no token that
 * can be masked (only specials) is dropped and counted in n_skipped. */
nopad_status train_dataset_pack(train_dataset *d, int64_t first_cut, const int32_t *tail, int64_t n_tail) {
    const int64_t L = d->params.max_length, n_own = d->n_tokens, n_all = n_own + n_tail;
    if (first_cut < 0 || n_tail < 0 || (n_tail > 0 && !tail))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_dataset_pack: first cut %lld, tail of %lld",
                               (long long)first_cut, (long long)n_tail);
    if (n_all > d->cap_tokens) { /* the tail goes after the dataset's own tokens */
        int32_t *ids = realloc(d->ids, (size_t)n_all * sizeof *ids);
        if (!ids) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "training data: out of memory");
        d->ids = ids;
        d->cap_tokens = n_all;
    }
    if (n_tail > 0) memcpy(d->ids + n_own, tail, (size_t)n_tail * sizeof *tail);
    const int64_t *old_off = d->offsets;
    const int64_t *old_line = d->line;
    const int32_t n_old = d->n_examples;
    const int64_t max_pieces = n_own > first_cut ? (n_own - first_cut + L - 1) / L : 0;
    int64_t *off = malloc((size_t)(max_pieces + 1) * sizeof *off);
    int64_t *line = malloc((size_t)(max_pieces + 1) * sizeof *line);
    if (!off || !line) {
        free(off), free(line);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "training data: out of memory");
    }
    int32_t n = 0, e = 0; /* e: the old example holding the piece's first token */
    int64_t kept = 0;     /* tokens of the kept pieces, written to ids from the start */
    for (int64_t at = first_cut; at < n_own; at += L) {
        const int64_t end = at + L < n_all ? at + L : n_all;
        while (e + 1 < n_old && old_off[e + 1] <= at) e++;
        int maskable = 0;
        for (int64_t i = at; i < end && !maskable; i++) maskable = !d->special[d->ids[i]];
        if (!maskable) {
            d->n_skipped++;
            continue;
        }
        memmove(d->ids + kept, d->ids + at, (size_t)(end - at) * sizeof *d->ids);
        off[n] = kept;
        line[n] = old_line[e];
        kept += end - at;
        n++;
    }
    off[n] = kept;
    if (n > d->cap_examples) { /* more pieces than examples: the per-example arrays grow */
        int32_t *t0 = realloc(d->type0_len, (size_t)n * sizeof *t0);
        if (t0) d->type0_len = t0;
        int64_t *ix = t0 ? realloc(d->index, (size_t)n * sizeof *ix) : NULL;
        if (ix) d->index = ix;
        if (!t0 || !ix) {
            free(off), free(line);
            return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "training data: out of memory");
        }
        d->cap_examples = n;
    }
    for (int32_t i = 0; i < n; i++) {
        d->type0_len[i] = (int32_t)(off[i + 1] - off[i]);
        d->index[i] = i;
    }
    free(d->offsets), free(d->line);
    d->offsets = off;
    d->line = line;
    d->n_examples = n;
    d->n_tokens = kept;
    return NOPAD_OK;
}

nopad_status train_dataset_parse(const char *text, size_t len, const char *path,
                                 const nopad_tokenizer *tok, const train_data_params *params,
                                 train_dataset *out) {
    memset(out, 0, sizeof *out);
    if ((!text && len) || !path || !tok || !params)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_dataset_parse: NULL argument");
    nopad_status st = train_dataset_init(tok, params, out);
    if (st != NOPAD_OK) return st;
    st = train_dataset_add_lines(out, tok, text, len, len, path, 1, 0);
    if (st == NOPAD_OK && params->pack && params->task == TRAIN_TASK_MLM && out->n_examples > 0)
        st = train_dataset_pack(out, 0, NULL, 0);
    if (st == NOPAD_OK && out->n_examples == 0)
        st = nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: no training example (%d lines skipped: blank, or "
                             "nothing to mask)", path, out->n_skipped);
    if (st == NOPAD_OK) {
        const train_data_params *p = params;
        const int regression = p->task == TRAIN_TASK_CLASSIFY && p->num_labels == 1;
        if (p->task != TRAIN_TASK_CLASSIFY || regression) free(out->labels), out->labels = NULL;
        if (!regression) free(out->targets), out->targets = NULL;
    }
    if (st != NOPAD_OK) train_dataset_free(out);
    return st;
}

void train_dataset_free(train_dataset *d) {
    if (!d) return;
    free(d->ids), free(d->offsets), free(d->type0_len), free(d->line), free(d->index);
    free(d->labels);
    free(d->targets), free(d->special), free(d->plain_ids), free(d->continues);
    memset(d, 0, sizeof *d);
}

/* ---- masking --------------------------------------------------------------------------------- */

static int32_t corrupt(const train_dataset *d, int32_t id, const uint32_t r[4]) {
    static const uint32_t MASK_BELOW = 3435973837u;   // 0.8 · 2^32
    static const uint32_t RANDOM_BELOW = 3865470566u; // 0.9 · 2^32
    if (r[1] < MASK_BELOW) return d->mask_id;
    if (r[1] < RANDOM_BELOW) return d->plain_ids[uniform_index(r[2], (uint32_t)d->n_plain)];
    return id;
}

/* The piece at p (not special) starts a word: a whole-word draw is taken there. */
static int starts_word(const train_dataset *d, const int32_t *ids, int32_t p) {
    return p == 0 || d->special[ids[p - 1]] || !d->continues[ids[p]];
}

/* Chooses the piece at p: corrupted by the draw r (its own), recorded. */
static void choose(const train_dataset *d, const int32_t *ids, int32_t p, const uint32_t r[4],
                   int32_t *tokens, int32_t *positions, int32_t *labels, int32_t *n) {
    tokens[p] = corrupt(d, ids[p], r);
    positions[*n] = p;
    labels[(*n)++] = ids[p];
}

int32_t train_mask_example(const train_dataset *d, uint64_t seed, uint32_t epoch, int32_t example,
                           int32_t *tokens, int32_t *positions, int32_t *labels) {
    const uint64_t key = (uint64_t)d->index[example];
    const uint32_t key_lo = (uint32_t)key, stream = STREAM_MASK | (uint32_t)(key >> 32) << 2;
    const int32_t *ids = d->ids + d->offsets[example];
    const int32_t len = (int32_t)(d->offsets[example + 1] - d->offsets[example]);
    const uint32_t below = (uint32_t)fmin((double)d->params.mask_prob * 4294967296.0, 4294967295.0);
    const int whole = d->continues != NULL;
    int32_t n = 0, units = 0; /* units: the pieces (words with whole_word) that can be chosen */
    int chosen = 0;           /* whole_word: the current word is chosen */
    for (int32_t p = 0; p < len; p++) {
        tokens[p] = ids[p];
        if (d->special[ids[p]]) continue;
        uint32_t r[4];
        draw(seed, (uint32_t)p, key_lo, epoch, stream, r);
        if (!whole || starts_word(d, ids, p)) {
            units++;
            chosen = r[0] < below;
        }
        if (chosen) choose(d, ids, p, r, tokens, positions, labels, &n);
    }
    if (n == 0 && units > 0) {
        uint32_t r[4];
        draw(seed, FALLBACK_POS, key_lo, epoch, stream, r);
        uint32_t k = uniform_index(r[0], (uint32_t)units);
        int32_t p = 0;
        for (; p < len; p++) /* the k-th unit's first piece */
            if (!d->special[ids[p]] && (!whole || starts_word(d, ids, p)) && k-- == 0) break;
        for (int32_t q = p; q < len && !d->special[ids[q]] && (q == p || !starts_word(d, ids, q)); q++) {
            uint32_t rq[4];
            draw(seed, (uint32_t)q, key_lo, epoch, stream, rq);
            if (q == p) rq[1] = r[1], rq[2] = r[2]; /* the fallback piece: corrupted as before */
            choose(d, ids, q, rq, tokens, positions, labels, &n);
            if (!whole) break;
        }
    }
    return n;
}

/* ---- batches --------------------------------------------------------------------------------- */

void train_shuffle(int32_t *order, int32_t n, uint64_t seed, uint32_t epoch, uint32_t window,
                   train_shuffle_kind kind) {
    for (int32_t i = 0; i < n; i++) order[i] = i;
    for (int32_t i = n - 1; i > 0; i--) { // Fisher-Yates
        uint32_t r[4];
        draw(seed, (uint32_t)i, window, epoch, (uint32_t)kind, r);
        const int32_t j = (int32_t)uniform_index(r[0], (uint32_t)i + 1);
        const int32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

nopad_status train_loader_init(const train_dataset *d, int32_t max_tokens, int32_t max_seqs,
                               uint64_t seed, train_loader *out) {
    memset(out, 0, sizeof *out);
    if (!d || d->n_examples < 1 || max_tokens < 1 || max_seqs < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "train_loader_init: %s (max_tokens %d, max_seqs %d)",
                               !d || d->n_examples < 1 ? "no dataset" : "empty budget", max_tokens,
                               max_seqs);
    for (int32_t e = 0; e < d->n_examples; e++) {
        const int64_t len = d->offsets[e + 1] - d->offsets[e];
        if (len > max_tokens)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "training data: the example of line %lld has %lld tokens, "
                                   "more than the batch budget of %d",
                                   (long long)d->line[e], (long long)len, max_tokens);
    }
    out->data = d;
    out->max_tokens = max_tokens;
    out->max_seqs = max_seqs;
    out->seed = seed;
    const size_t T = (size_t)max_tokens, B = (size_t)max_seqs;
    out->order = malloc((size_t)d->n_examples * sizeof(int32_t));
    out->examples = malloc(B * sizeof(int32_t));
    out->numbers = malloc(B * sizeof(int64_t));
    out->cu_seqlens = malloc((B + 1) * sizeof(int32_t));
    out->tokens = malloc(T * sizeof(int32_t));
    out->types = malloc(T * sizeof(int32_t));
    out->mlm_positions = malloc(T * sizeof(int32_t));
    out->mlm_labels = malloc(T * sizeof(int32_t));
    out->labels = malloc(B * sizeof(int32_t));
    out->targets = malloc(B * sizeof(float));
    if (!out->order || !out->examples || !out->numbers || !out->cu_seqlens || !out->tokens || !out->types ||
        !out->mlm_positions || !out->mlm_labels || !out->labels || !out->targets) {
        train_loader_free(out);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "train_loader_init: out of memory");
    }
    return train_loader_seek(out, 0, 0);
}

nopad_status train_loader_seek(train_loader *l, uint32_t epoch, int32_t cursor) {
    const int32_t n = l->data->n_examples;
    if (cursor < 0 || cursor > n)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "train_loader_seek: cursor %d outside [0, %d]", cursor, n);
    train_shuffle(l->order, n, l->seed, epoch, l->window, TRAIN_SHUFFLE_EXAMPLES);
    l->epoch = epoch;
    l->cursor = cursor;
    return NOPAD_OK;
}

int train_loader_next(train_loader *l) {
    const train_dataset *d = l->data;
    if (l->cursor >= d->n_examples) return 0;
    const int mlm = d->params.task == TRAIN_TASK_MLM;
    const int regression = !mlm && d->params.num_labels == 1;
    int32_t T = 0, B = 0, M = 0;
    l->cu_seqlens[0] = 0;
    while (l->cursor < d->n_examples && B < l->max_seqs) {
        const int32_t e = l->order[l->cursor];
        const int32_t len = (int32_t)(d->offsets[e + 1] - d->offsets[e]);
        if (T + len > l->max_tokens) break;
        if (mlm) {
            const int32_t m = train_mask_example(d, l->seed, l->epoch, e, l->tokens + T,
                                                 l->mlm_positions + M, l->mlm_labels + M);
            for (int32_t i = 0; i < m; i++) l->mlm_positions[M + i] += T;
            M += m;
        } else {
            memcpy(l->tokens + T, d->ids + d->offsets[e], (size_t)len * sizeof(int32_t));
            if (regression) l->targets[B] = d->targets[e];
            else l->labels[B] = d->labels[e];
        }
        for (int32_t i = 0; i < len; i++) l->types[T + i] = i < d->type0_len[e] ? 0 : 1;
        l->numbers[B] = d->index[e];
        l->examples[B++] = e;
        T += len;
        l->cu_seqlens[B] = T;
        l->cursor++;
    }
    train_batch b = {.n_seqs = B, .cu_seqlens = l->cu_seqlens, .tokens = l->tokens,
                     .types = l->types, .examples = l->numbers};
    if (mlm) {
        b.n_masked = M;
        b.mlm_positions = l->mlm_positions;
        b.mlm_labels = l->mlm_labels;
    } else {
        b.labels = regression ? NULL : l->labels;
        b.targets = regression ? l->targets : NULL;
    }
    l->batch = b;
    return 1;
}

void train_loader_free(train_loader *l) {
    if (!l) return;
    free(l->order), free(l->examples), free(l->numbers), free(l->cu_seqlens), free(l->tokens), free(l->types);
    free(l->mlm_positions), free(l->mlm_labels), free(l->labels), free(l->targets);
    memset(l, 0, sizeof *l);
}

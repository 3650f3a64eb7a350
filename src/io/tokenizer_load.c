/* Loading a tokenizer: tokenizer.json (Hugging Face tokenizers' format) or a legacy vocab.txt.
 *
 * Supported tokenizer.json parts:
 *   model           WordPiece, BPE (tokenizer_bpe.c; byte-level or SentencePiece-style with
 *                   byte_fallback), Unigram (tokenizer_unigram.c); WordLevel: NOPAD_ERR_UNSUPPORTED
 *   normalizer,     BERT-style WordPiece and plain byte-level BPE take their fast paths here; any
 *   pre_tokenizer   other combination runs the general pipeline (tokenizer_pipeline.c lists the
 *                   steps it knows)
 *   post_processor  TemplateProcessing (its single template), BertProcessing, RobertaProcessing,
 *                   ByteLevel (ids unchanged), a Sequence of those, or null
 *   added_tokens    all flags (single_word, lstrip, rstrip, normalized)
 * "truncation" and "padding" are ignored: nopad_tokenize_params decide those per call. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "io/tokenizer_internal.h"
#include "util/error.h"
#include "util/file.h"

static char *dup_bytes(const char *s, size_t len) {
    char *d = malloc(len + 1);
    if (d) {
        if (len) memcpy(d, s, len);
        d[len] = '\0';
    }
    return d;
}

static nopad_status out_of_memory(const char *where) {
    return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory building the tokenizer",
                           where);
}

void nopad_tokenizer_free(nopad_tokenizer *t) {
    if (!t) return;
    tok_vocab_free(&t->vocab);
    tok_bpe_free(&t->bpe);
    tok_decoder_free(t->decoder);
    tok_unigram_free(&t->unigram);
    tok_pipeline_free(t);
    free(t->subword_prefix);
    for (int32_t i = 0; i < t->n_added; i++) {
        if (t->added[i].pattern != t->added[i].content) free(t->added[i].pattern);
        free(t->added[i].content);
    }
    free(t->added);
    tok_vocab_free(&t->added_index);
    free(t->raw_matcher.order);
    free(t->norm_matcher.order);
    free(t->prefix_ids);
    free(t->suffix_ids);
    free(t->pair_template);
    free(t);
}

int32_t nopad_tokenizer_vocab_size(const nopad_tokenizer *t) { return t ? t->vocab_size : 0; }

int32_t nopad_tokenizer_token_to_id(const nopad_tokenizer *t, const char *token) {
    if (!t || !token) return -1;
    size_t len = strlen(token);
    int32_t i = tok_vocab_get(&t->added_index, token, len); /* added tokens first, as HF does */
    return i >= 0 ? t->added[i].id : tok_vocab_get(&t->vocab, token, len);
}

/* ---- shared construction steps -------------------------------------------------------------- */

static nopad_status new_tokenizer(nopad_tokenizer **out, const char *where) {
    nopad_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return out_of_memory(where);
    t->max_added_id = -1;
    nopad_status st = tok_vocab_init(&t->added_index, 16);
    if (st != NOPAD_OK) {
        free(t);
        return st;
    }
    *out = t;
    return NOPAD_OK;
}

static nopad_status set_subword_prefix(nopad_tokenizer *t, const char *s, const char *where) {
    t->subword_prefix_len = strlen(s);
    t->subword_prefix = dup_bytes(s, t->subword_prefix_len);
    return t->subword_prefix ? NOPAD_OK : out_of_memory(where);
}

/* Adds an added token the way HF's AddedVocabulary::add_tokens does: a token already in the
 * vocab keeps the vocab's id, a new one gets the next id after the vocab; a repeated content
 * replaces the earlier entry's flags. */
static nopad_status add_token(nopad_tokenizer *t, const char *content, size_t len,
                              const tok_added *flags, const char *where) {
    if (len == 0) return NOPAD_OK; /* HF ignores empty added tokens */
    int32_t seen = tok_vocab_get(&t->added_index, content, len);
    if (seen >= 0) {
        tok_added *a = &t->added[seen];
        a->single_word = flags->single_word;
        a->lstrip = flags->lstrip;
        a->rstrip = flags->rstrip;
        a->normalized = flags->normalized;
        a->special = flags->special;
        return NOPAD_OK;
    }
    int32_t id = tok_vocab_get(&t->vocab, content, len);
    if (id < 0) {
        int32_t max = t->max_added_id;
        if (max == INT32_MAX - 1)
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: too many added tokens", where);
        id = max < 0 ? t->vocab.count : (max >= t->vocab.count ? max + 1 : t->vocab.count);
    }
    if (t->n_added == INT32_MAX - 1)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: too many added tokens", where);
    nopad_status st = tok_vocab_put(&t->added_index, content, len, t->n_added);
    if (st != NOPAD_OK) return st;
    tok_added *added = realloc(t->added, (size_t)(t->n_added + 1) * sizeof *added);
    if (!added) return out_of_memory(where);
    t->added = added;
    tok_added *a = &added[t->n_added];
    *a = *flags;
    a->content = dup_bytes(content, len);
    if (!a->content) return out_of_memory(where);
    a->len = len;
    a->pattern = a->content;
    a->pattern_len = len;
    a->id = id;
    if (id > t->max_added_id) t->max_added_id = id;
    t->n_added++;
    return NOPAD_OK;
}

/* Groups the added tokens of one kind by the first byte of their pattern. Within a bucket,
 * special tokens come first, then the others, each in file order: HF builds its matcher from
 * the same order, which decides between two tokens with equal patterns. */
static nopad_status build_matcher(nopad_tokenizer *t, int normalized, tok_matcher *m,
                                  const char *where) {
    int32_t counts[257] = {0};
    m->count = 0;
    for (int32_t i = 0; i < t->n_added; i++) {
        const tok_added *a = &t->added[i];
        if (a->normalized != normalized || a->pattern_len == 0) continue;
        counts[(uint8_t)a->pattern[0] + 1]++;
        m->count++;
    }
    for (int b = 0; b < 256; b++) counts[b + 1] += counts[b];
    memcpy(m->first, counts, sizeof counts);
    m->order = malloc((size_t)(m->count ? m->count : 1) * sizeof *m->order);
    if (!m->order) return out_of_memory(where);
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t i = 0; i < t->n_added; i++) {
            const tok_added *a = &t->added[i];
            if (a->normalized != normalized || a->pattern_len == 0) continue;
            if (a->special != (pass == 0)) continue;
            m->order[counts[(uint8_t)a->pattern[0]]++] = i;
        }
    }
    return NOPAD_OK;
}

/* Normalizes the patterns of normalized added tokens, then indexes both kinds and computes the
 * vocab size. Called once everything else is loaded. */
static nopad_status finish(nopad_tokenizer *t, const char *where) {
    for (int32_t i = 0; i < t->n_added && t->general; i++) {
        tok_added *a = &t->added[i];
        if (!a->normalized || t->n_norm_steps == 0) continue;
        tok_pipe_work w = {0};
        tok_str out = {0};
        nopad_status st = tok_pipeline_normalize(t, &w, a->content, a->len, &out);
        tok_pipe_work_free(&w);
        if (st != NOPAD_OK) {
            tok_str_free(&out);
            return st;
        }
        if (!out.data && (out.data = malloc(1)) == NULL) return out_of_memory(where);
        a->pattern = out.data;
        a->pattern_len = out.len;
    }
    for (int32_t i = 0; i < t->n_added && !t->general; i++) {
        tok_added *a = &t->added[i];
        if (!a->normalized || !t->norm.enabled) continue;
        tok_cpbuf cps;
        tok_cpbuf_init(&cps, NULL, 0);
        nopad_status st = tok_normalize(&t->norm, a->content, a->len, &cps);
        char *pattern = st == NOPAD_OK ? malloc(cps.len * 4 + 1) : NULL;
        if (!pattern) {
            tok_cpbuf_free(&cps);
            return st != NOPAD_OK ? st : out_of_memory(where);
        }
        size_t len = 0;
        for (size_t k = 0; k < cps.len; k++)
            len += (size_t)tok_utf8_put(cps.data[k], pattern + len);
        tok_cpbuf_free(&cps);
        a->pattern = pattern;
        a->pattern_len = len;
    }
    nopad_status st = build_matcher(t, 0, &t->raw_matcher, where);
    if (st == NOPAD_OK) st = build_matcher(t, 1, &t->norm_matcher, where);
    if (st != NOPAD_OK) return st;

    int64_t max_id = t->vocab.max_id;
    for (int32_t i = 0; i < t->n_added; i++)
        if (t->added[i].id > max_id) max_id = t->added[i].id;
    for (int32_t i = 0; i < t->n_prefix; i++)
        if (t->prefix_ids[i] > max_id) max_id = t->prefix_ids[i];
    for (int32_t i = 0; i < t->n_suffix; i++)
        if (t->suffix_ids[i] > max_id) max_id = t->suffix_ids[i];
    for (int32_t i = 0; i < t->n_pair_template; i++)
        if (t->pair_template[2 * i] > max_id) max_id = t->pair_template[2 * i];
    if (max_id >= INT32_MAX)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: token id %lld is too large", where,
                               (long long)max_id);
    t->vocab_size = (int32_t)(max_id + 1);
    return NOPAD_OK;
}

static nopad_status set_template(nopad_tokenizer *t, const int32_t *prefix, int32_t n_prefix,
                                 const int32_t *suffix, int32_t n_suffix, const char *where) {
    t->prefix_ids = malloc((size_t)(n_prefix ? n_prefix : 1) * sizeof(int32_t));
    t->suffix_ids = malloc((size_t)(n_suffix ? n_suffix : 1) * sizeof(int32_t));
    if (!t->prefix_ids || !t->suffix_ids) return out_of_memory(where);
    for (int32_t i = 0; i < n_prefix; i++) t->prefix_ids[i] = prefix[i];
    for (int32_t i = 0; i < n_suffix; i++) t->suffix_ids[i] = suffix[i];
    t->n_prefix = n_prefix;
    t->n_suffix = n_suffix;
    return NOPAD_OK;
}

/* The pair template as (id, type id) pieces; see nopad_tokenizer.pair_template. */
static nopad_status set_pair_template(nopad_tokenizer *t, const int32_t *pieces, int32_t n,
                                      const char *where) {
    free(t->pair_template);
    t->pair_template = malloc((size_t)(n ? 2 * n : 1) * sizeof(int32_t));
    if (!t->pair_template) return out_of_memory(where);
    for (int32_t i = 0; i < 2 * n; i++) t->pair_template[i] = pieces[i];
    t->n_pair_template = n;
    return NOPAD_OK;
}

/* BERT's pair: [CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1. RoBERTa's: <s> $A </s> </s> $B </s>, all type
 * 0 (as tokenizers' RobertaProcessing gives them). */
static nopad_status set_bert_pair(nopad_tokenizer *t, int32_t cls, int32_t sep, int roberta,
                                  const char *where) {
    const int32_t bert[] = {cls, 0, TOK_PAIR_A, 0, sep, 0, TOK_PAIR_B, 1, sep, 1};
    const int32_t rob[] = {cls, 0, TOK_PAIR_A, 0, sep, 0, sep, 0, TOK_PAIR_B, 0, sep, 0};
    return roberta ? set_pair_template(t, rob, 6, where) : set_pair_template(t, bert, 5, where);
}

/* ---- tokenizer.json ------------------------------------------------------------------------- */

static const cJSON *field(const cJSON *obj, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

/* A JSON number that is a whole id in [0, INT32_MAX). */
static int as_id(const cJSON *item, int32_t *out) {
    if (!cJSON_IsNumber(item)) return 0;
    double d = item->valuedouble;
    if (!(d >= 0 && d < (double)INT32_MAX) || d != (double)(int64_t)d) return 0;
    *out = (int32_t)d;
    return 1;
}

/* A string field that must be valid UTF-8 without NUL (cJSON stops at an escaped \u0000). */
static nopad_status get_string(const cJSON *obj, const char *key, const char *path,
                               const char *where, const char **out) {
    const cJSON *item = field(obj, key);
    if (!item) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: missing field %s", where, path);
    if (!cJSON_IsString(item) || !item->valuestring)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s must be a string", where, path);
    size_t len = strlen(item->valuestring);
    if (tok_utf8_check(item->valuestring, len) != len)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s is not valid UTF-8", where, path);
    *out = item->valuestring;
    return NOPAD_OK;
}

/* An optional boolean: absent or null gives `dflt`. */
static nopad_status get_bool(const cJSON *obj, const char *key, int dflt, const char *path,
                             const char *where, int *out) {
    const cJSON *item = field(obj, key);
    if (!item || cJSON_IsNull(item)) {
        *out = dflt;
        return NOPAD_OK;
    }
    if (!cJSON_IsBool(item))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s must be true or false", where, path);
    *out = cJSON_IsTrue(item);
    return NOPAD_OK;
}

const struct cJSON *tok_json_field(const struct cJSON *obj, const char *key) {
    return field(obj, key);
}
int tok_json_as_id(const struct cJSON *item, int32_t *out) { return as_id(item, out); }
nopad_status tok_json_get_bool(const struct cJSON *obj, const char *key, int dflt,
                               const char *path, const char *where, int *out) {
    return get_bool(obj, key, dflt, path, where, out);
}

static const char *type_of(const cJSON *obj) {
    const cJSON *type = field(obj, "type");
    return cJSON_IsString(type) && type->valuestring ? type->valuestring : NULL;
}

static int is_type(const cJSON *obj, const char *name) {
    const char *type = cJSON_IsObject(obj) ? type_of(obj) : NULL;
    return type && strcmp(type, name) == 0;
}

static nopad_status parse_model(nopad_tokenizer *t, const cJSON *model, const char *where) {
    if (!cJSON_IsObject(model))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: missing \"model\" object", where);
    const char *type = type_of(model);
    if (!type) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: missing field model.type", where);
    if (strcmp(type, "Unigram") == 0) return tok_unigram_load_model(t, model, where);
    int bpe = strcmp(type, "BPE") == 0;
    if (strcmp(type, "WordPiece") != 0 && !bpe)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: model type \"%s\" is not supported (WordPiece, BPE, Unigram)",
                               where, type);
    const cJSON *vocab = field(model, "vocab");
    if (!vocab) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: missing field model.vocab", where);
    if (!cJSON_IsObject(vocab))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: model.vocab must be an object", where);
    nopad_status st = tok_vocab_init(&t->vocab, (size_t)cJSON_GetArraySize(vocab));
    if (st != NOPAD_OK) return nopad_wrap_error(st, "%s", where);
    const cJSON *entry;
    cJSON_ArrayForEach(entry, vocab) {
        int32_t id;
        if (!entry->string || !as_id(entry, &id))
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: model.vocab[\"%.64s\"] must be an id in [0, 2^31-1)",
                                   where, entry->string ? entry->string : "");
        st = tok_vocab_put(&t->vocab, entry->string, strlen(entry->string), id);
        if (st != NOPAD_OK) return nopad_wrap_error(st, "%s", where);
    }
    if (bpe) return tok_bpe_load_model(t, model, where);

    const char *unk, *prefix;
    st = get_string(model, "unk_token", "model.unk_token", where, &unk);
    if (st == NOPAD_OK)
        st = get_string(model, "continuing_subword_prefix", "model.continuing_subword_prefix",
                        where, &prefix);
    if (st != NOPAD_OK) return st;
    t->unk_id = tok_vocab_get(&t->vocab, unk, strlen(unk));
    if (t->unk_id < 0)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: model.unk_token \"%.64s\" is not in model.vocab", where, unk);
    st = set_subword_prefix(t, prefix, where);
    if (st != NOPAD_OK) return st;

    const cJSON *max_chars = field(model, "max_input_chars_per_word");
    if (!max_chars)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: missing field model.max_input_chars_per_word",
                               where);
    double d = cJSON_IsNumber(max_chars) ? max_chars->valuedouble : -1;
    if (!(d >= 0 && d <= 9.0e18) || d != (double)(int64_t)d)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: model.max_input_chars_per_word must be a whole number >= 0",
                               where);
    t->max_chars_per_word = (int64_t)d;
    return NOPAD_OK;
}

static nopad_status parse_normalizer(nopad_tokenizer *t, const cJSON *n, const char *where) {
    t->norm.enabled = 0;
    if (!n || cJSON_IsNull(n)) return NOPAD_OK;
    if (!cJSON_IsObject(n))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: normalizer must be an object or null", where);
    const char *type = type_of(n);
    if (!type) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: missing field normalizer.type", where);
    if (strcmp(type, "BertNormalizer") != 0)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: normalizer type \"%s\" is not supported (only BertNormalizer)",
                               where, type);
    tok_normalizer *nm = &t->norm;
    nm->enabled = 1;
    nopad_status st = get_bool(n, "clean_text", 1, "normalizer.clean_text", where, &nm->clean_text);
    if (st == NOPAD_OK)
        st = get_bool(n, "handle_chinese_chars", 1, "normalizer.handle_chinese_chars", where,
                      &nm->handle_chinese_chars);
    if (st == NOPAD_OK)
        st = get_bool(n, "lowercase", 1, "normalizer.lowercase", where, &nm->lowercase);
    /* strip_accents: null means "same as lowercase" */
    if (st == NOPAD_OK)
        st = get_bool(n, "strip_accents", nm->lowercase, "normalizer.strip_accents", where,
                      &nm->strip_accents);
    return st;
}

static nopad_status parse_pre_tokenizer(nopad_tokenizer *t, const cJSON *p, const char *where) {
    t->pre = TOK_PRE_NONE;
    if (!p || cJSON_IsNull(p)) return NOPAD_OK;
    if (!cJSON_IsObject(p))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: pre_tokenizer must be an object or null",
                               where);
    const char *type = type_of(p);
    if (!type)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: missing field pre_tokenizer.type", where);
    if (strcmp(type, "BertPreTokenizer") == 0) t->pre = TOK_PRE_BERT;
    else if (strcmp(type, "WhitespaceSplit") == 0) t->pre = TOK_PRE_WHITESPACE_SPLIT;
    else if (strcmp(type, "Whitespace") == 0) t->pre = TOK_PRE_WHITESPACE;
    else if (strcmp(type, "ByteLevel") == 0) {
        t->pre = TOK_PRE_BYTELEVEL;
        return tok_bpe_load_byte_level(t, p, where);
    } else
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: pre_tokenizer type \"%s\" is not supported (BertPreTokenizer, "
                               "Whitespace, WhitespaceSplit, ByteLevel)",
                               where, type);
    return NOPAD_OK;
}

/* The ids of one special token of a TemplateProcessing: special_tokens[name].ids. */
static nopad_status template_ids(const cJSON *specials, const char *name, int32_t *ids,
                                 int32_t *n, int32_t cap, const char *where) {
    const cJSON *sp = field(specials, name);
    if (!cJSON_IsObject(sp))
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: post_processor.special_tokens has no \"%.64s\" used by the "
                               "single template",
                               where, name);
    const cJSON *list = field(sp, "ids");
    if (!cJSON_IsArray(list))
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: post_processor.special_tokens[\"%.64s\"].ids must be an array",
                               where, name);
    const cJSON *item;
    cJSON_ArrayForEach(item, list) {
        if (*n >= cap)
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                   "%s: post_processor: more than %d special ids in a template",
                                   where, (int)cap);
        if (!as_id(item, &ids[*n]))
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: post_processor.special_tokens[\"%.64s\"].ids holds a "
                                   "non-id",
                                   where, name);
        (*n)++;
    }
    return NOPAD_OK;
}

/* ["[CLS]", 101] of BertProcessing / RobertaProcessing. */
static nopad_status pair_id(const cJSON *p, const char *key, int32_t *id, const char *where) {
    const cJSON *pair = field(p, key);
    if (!cJSON_IsArray(pair) || cJSON_GetArraySize(pair) != 2 ||
        !cJSON_IsString(cJSON_GetArrayItem(pair, 0)) || !as_id(cJSON_GetArrayItem(pair, 1), id))
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: post_processor.%s must be [token, id]", where, key);
    return NOPAD_OK;
}

/* TemplateProcessing's "pair" (absent: none, see nopad_tokenizer.pair_template): each piece
 * {"Sequence": {"id": "A"|"B", "type_id": n}} or {"SpecialToken": {"id": name, "type_id": n}}. */
static nopad_status parse_pair_template(nopad_tokenizer *t, const cJSON *pair,
                                        const cJSON *specials, const char *where) {
    enum { MAX_PIECES = 64 };
    int32_t pieces[2 * MAX_PIECES], n = 0, ids[MAX_PIECES], seen_a = 0, seen_b = 0;
    if (!pair || cJSON_IsNull(pair)) return NOPAD_OK;
    if (!cJSON_IsArray(pair))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: post_processor.pair must be an array", where);
    const cJSON *piece;
    cJSON_ArrayForEach(piece, pair) {
        const cJSON *seq = field(piece, "Sequence"), *sp = field(piece, "SpecialToken");
        const cJSON *body = cJSON_IsObject(seq) ? seq : sp;
        const cJSON *id = field(body, "id"), *type = field(body, "type_id");
        int32_t type_id = 0;
        if (!cJSON_IsObject(body) || !cJSON_IsString(id) || (type && !as_id(type, &type_id)))
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: post_processor.pair: each piece must be {\"Sequence\": {\"id\", "
                                   "\"type_id\"}} or {\"SpecialToken\": {\"id\", \"type_id\"}}",
                                   where);
        int32_t n_ids = 0;
        if (body == seq) {
            const int a = !strcmp(id->valuestring, "A"), b = !strcmp(id->valuestring, "B");
            if (!a && !b)
                return nopad_set_error(NOPAD_ERR_FORMAT,
                                       "%s: post_processor.pair: sequence \"%.16s\" is neither A nor B",
                                       where, id->valuestring);
            seen_a += a, seen_b += b;
            ids[n_ids++] = a ? TOK_PAIR_A : TOK_PAIR_B;
        } else {
            nopad_status st = template_ids(specials, id->valuestring, ids, &n_ids, MAX_PIECES, where);
            if (st != NOPAD_OK) return st;
        }
        for (int32_t k = 0; k < n_ids; k++) {
            if (n >= MAX_PIECES)
                return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                       "%s: post_processor.pair: more than %d pieces", where, MAX_PIECES);
            pieces[2 * n] = ids[k];
            pieces[2 * n + 1] = type_id;
            n++;
        }
    }
    if (seen_a != 1 || seen_b != 1)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: post_processor.pair must hold $A and $B once each (found %d, %d)",
                               where, seen_a, seen_b);
    return set_pair_template(t, pieces, n, where);
}

static nopad_status parse_post_processor(nopad_tokenizer *t, const cJSON *p, const char *where) {
    enum { MAX_SPECIAL = 64 };
    int32_t prefix[MAX_SPECIAL], suffix[MAX_SPECIAL], n_prefix = 0, n_suffix = 0;
    nopad_status st = NOPAD_OK;
    if (!p || cJSON_IsNull(p)) return set_template(t, prefix, 0, suffix, 0, where);
    if (!cJSON_IsObject(p))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: post_processor must be an object or null",
                               where);
    const char *type = type_of(p);
    if (!type)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: missing field post_processor.type", where);
    if (strcmp(type, "BertProcessing") == 0 || strcmp(type, "RobertaProcessing") == 0) {
        st = pair_id(p, "cls", &prefix[0], where);
        if (st == NOPAD_OK) st = pair_id(p, "sep", &suffix[0], where);
        if (st == NOPAD_OK)
            st = set_bert_pair(t, prefix[0], suffix[0], strcmp(type, "RobertaProcessing") == 0, where);
        if (st != NOPAD_OK) return st;
        return set_template(t, prefix, 1, suffix, 1, where);
    }
    /* ByteLevel's post-processing (trim_offsets) moves offsets only; the ids stay as they are */
    if (strcmp(type, "ByteLevel") == 0 && t->model == TOK_MODEL_BPE)
        return set_template(t, prefix, 0, suffix, 0, where);
    if (strcmp(type, "Sequence") == 0) { /* e.g. [ByteLevel, TemplateProcessing] (LLaMA-3) */
        const cJSON *list = field(p, "processors");
        if (!cJSON_IsArray(list))
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: post_processor.processors must be an array", where);
        const cJSON *item, *chosen = NULL;
        cJSON_ArrayForEach(item, list) {
            if (is_type(item, "ByteLevel") && t->model == TOK_MODEL_BPE) continue;
            if (chosen)
                return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                       "%s: post_processor Sequence with more than one processor "
                                       "that adds tokens is not supported",
                                       where);
            chosen = item;
        }
        if (chosen && is_type(chosen, "Sequence"))
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                   "%s: post_processor: nested Sequence is not supported", where);
        return parse_post_processor(t, chosen, where);
    }
    if (strcmp(type, "TemplateProcessing") != 0)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: post_processor type \"%s\" is not supported "
                               "(TemplateProcessing, BertProcessing, RobertaProcessing, "
                               "ByteLevel with BPE)",
                               where, type);
    const cJSON *single = field(p, "single");
    const cJSON *specials = field(p, "special_tokens");
    if (!cJSON_IsArray(single))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: post_processor.single must be an array",
                               where);
    if (!cJSON_IsObject(specials))
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: post_processor.special_tokens must be an object", where);
    int n_sequences = 0;
    const cJSON *piece;
    cJSON_ArrayForEach(piece, single) {
        const cJSON *seq = field(piece, "Sequence");
        const cJSON *sp = field(piece, "SpecialToken");
        if (cJSON_IsObject(seq)) {
            const cJSON *id = field(seq, "id");
            if (!cJSON_IsString(id) || strcmp(id->valuestring, "A") != 0)
                return nopad_set_error(NOPAD_ERR_FORMAT,
                                       "%s: post_processor.single must use sequence \"A\"", where);
            n_sequences++;
        } else if (cJSON_IsObject(sp)) {
            const cJSON *id = field(sp, "id");
            if (!cJSON_IsString(id) || !id->valuestring)
                return nopad_set_error(NOPAD_ERR_FORMAT,
                                       "%s: post_processor.single: SpecialToken.id must be a "
                                       "string",
                                       where);
            st = n_sequences == 0 ? template_ids(specials, id->valuestring, prefix, &n_prefix,
                                                 MAX_SPECIAL, where)
                                  : template_ids(specials, id->valuestring, suffix, &n_suffix,
                                                 MAX_SPECIAL, where);
            if (st != NOPAD_OK) return st;
        } else {
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: post_processor.single: each piece must be {\"Sequence\": "
                                   "...} or {\"SpecialToken\": ...}",
                                   where);
        }
    }
    if (n_sequences != 1)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: post_processor.single must hold $A exactly once (found %d)",
                               where, n_sequences);
    st = parse_pair_template(t, field(p, "pair"), specials, where);
    if (st != NOPAD_OK) return st;
    return set_template(t, prefix, n_prefix, suffix, n_suffix, where);
}

static nopad_status parse_added_tokens(nopad_tokenizer *t, const cJSON *list, const char *where) {
    if (!list || cJSON_IsNull(list)) return NOPAD_OK;
    if (!cJSON_IsArray(list))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: added_tokens must be an array", where);
    int i = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, list) {
        char path[64];
        snprintf(path, sizeof path, "added_tokens[%d]", i);
        if (!cJSON_IsObject(item))
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s must be an object", where, path);
        int32_t id;
        if (!as_id(field(item, "id"), &id))
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s.id must be an id", where, path);
        char sub[96];
        snprintf(sub, sizeof sub, "%s.content", path);
        const char *content;
        nopad_status st = get_string(item, "content", sub, where, &content);
        int b[5] = {0};
        static const char *const names[5] = {"single_word", "lstrip", "rstrip", "normalized",
                                             "special"};
        /* HF's defaults: normalized unless special */
        int special = 0;
        if (st == NOPAD_OK) {
            snprintf(sub, sizeof sub, "%s.special", path);
            st = get_bool(item, "special", 0, sub, where, &special);
        }
        for (int k = 0; k < 5 && st == NOPAD_OK; k++) {
            snprintf(sub, sizeof sub, "%s.%s", path, names[k]);
            st = get_bool(item, names[k], k == 3 ? !special : 0, sub, where, &b[k]);
        }
        if (st != NOPAD_OK) return st;
        tok_added flags = {0};
        flags.single_word = (uint8_t)b[0];
        flags.lstrip = (uint8_t)b[1];
        flags.rstrip = (uint8_t)b[2];
        flags.normalized = (uint8_t)b[3];
        flags.special = (uint8_t)b[4];
        (void)id; /* HF recomputes the id (vocab id, else the next free one) and so do we */
        st = add_token(t, content, strlen(content), &flags, where);
        if (st != NOPAD_OK) return st;
        i++;
    }
    return NOPAD_OK;
}

/* The two shapes with a fast path of their own (tokenizer.c, tokenizer_bpe.c): BERT-style
 * WordPiece and plain byte-level BPE. Everything else runs the general pipeline. */
static int has_fast_path(const nopad_tokenizer *t, const cJSON *norm, const cJSON *pre) {
    int no_norm = !norm || cJSON_IsNull(norm);
    int no_pre = !pre || cJSON_IsNull(pre);
    if (t->model == TOK_MODEL_WORDPIECE)
        return (no_norm || is_type(norm, "BertNormalizer")) &&
               (no_pre || is_type(pre, "BertPreTokenizer") || is_type(pre, "Whitespace") ||
                is_type(pre, "WhitespaceSplit"));
    if (t->model == TOK_MODEL_BPE)
        return no_norm && is_type(pre, "ByteLevel") && !t->bpe.byte_fallback && !t->bpe.prefix &&
               !t->bpe.suffix;
    return 0;
}

static nopad_status parse_pipeline(nopad_tokenizer *t, const cJSON *norm, const cJSON *pre,
                                   const char *where) {
    if (has_fast_path(t, norm, pre)) {
        nopad_status st = parse_normalizer(t, norm, where);
        return st == NOPAD_OK ? parse_pre_tokenizer(t, pre, where) : st;
    }
    t->general = 1;
    nopad_status st = tok_pipeline_load_normalizer(t, norm, where);
    return st == NOPAD_OK ? tok_pipeline_load_pre_tokenizer(t, pre, where) : st;
}

nopad_status tokenizer_from_cjson(const cJSON *root, const char *where, nopad_tokenizer **out) {
    if (!where) where = "tokenizer.json";
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: need out", where);
    *out = NULL;
    nopad_tokenizer *t = NULL;
    nopad_status st = new_tokenizer(&t, where);
    if (st == NOPAD_OK && !cJSON_IsObject(root))
        st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: top level must be a JSON object", where);
    if (st == NOPAD_OK) st = parse_model(t, field(root, "model"), where);
    if (st == NOPAD_OK)
        st = parse_pipeline(t, field(root, "normalizer"), field(root, "pre_tokenizer"), where);
    if (st == NOPAD_OK) st = parse_post_processor(t, field(root, "post_processor"), where);
    if (st == NOPAD_OK) st = parse_added_tokens(t, field(root, "added_tokens"), where);
    if (st == NOPAD_OK) st = finish(t, where);
    if (st == NOPAD_OK) st = tok_decoder_load(t, field(root, "decoder"), where);
    if (st != NOPAD_OK) {
        nopad_tokenizer_free(t);
        return st;
    }
    *out = t;
    return NOPAD_OK;
}

nopad_status tokenizer_from_json(const char *json, size_t len, const char *where,
                                 nopad_tokenizer **out) {
    if (!where) where = "tokenizer.json";
    if (!out || (!json && len))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: need json bytes and out", where);
    *out = NULL;
    cJSON *root = cJSON_ParseWithLength(json ? json : "", len);
    if (!root) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: not valid JSON", where);
    nopad_status st = tokenizer_from_cjson(root, where, out);
    cJSON_Delete(root);
    return st;
}

/* ---- vocab.txt ------------------------------------------------------------------------------ */

nopad_status tokenizer_from_vocab_txt(const char *text, size_t len, int lowercase,
                                      const char *where, nopad_tokenizer **out) {
    if (!where) where = "vocab.txt";
    if (!out || (!text && len))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: need text bytes and out", where);
    *out = NULL;
    nopad_tokenizer *t = NULL;
    nopad_status st = new_tokenizer(&t, where);
    if (st != NOPAD_OK) return st;
    /* lines end at \n, \r\n or \r, as Python's text mode reads them (transformers' load_vocab) */
    size_t n_lines = 0;
    for (size_t i = 0; i < len; i++)
        if (text[i] == '\n' || (text[i] == '\r' && (i + 1 == len || text[i + 1] != '\n')))
            n_lines++;
    st = tok_vocab_init(&t->vocab, n_lines + 1);
    int64_t line = 0;
    for (size_t pos = 0; pos < len && st == NOPAD_OK; line++) {
        size_t end = pos;
        while (end < len && text[end] != '\n' && text[end] != '\r') end++;
        if (line >= INT32_MAX) {
            st = nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: too many lines", where);
        } else if (tok_utf8_check(text + pos, end - pos) != end - pos) {
            st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: line %lld is not valid UTF-8", where,
                                 (long long)line + 1);
        } else {
            st = tok_vocab_put(&t->vocab, text + pos, end - pos, (int32_t)line);
        }
        if (end < len && text[end] == '\r' && end + 1 < len && text[end + 1] == '\n') end++;
        pos = end + 1;
    }
    if (st == NOPAD_OK) {
        t->norm = (tok_normalizer){.enabled = 1, .clean_text = 1, .handle_chinese_chars = 1,
                                   .strip_accents = lowercase, .lowercase = lowercase};
        t->pre = TOK_PRE_BERT;
        t->max_chars_per_word = 100;
        t->unk_id = tok_vocab_get(&t->vocab, "[UNK]", 5);
        if (t->unk_id < 0) st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: no [UNK] line", where);
    }
    if (st == NOPAD_OK) st = set_subword_prefix(t, "##", where);
    int32_t cls = tok_vocab_get(&t->vocab, "[CLS]", 5);
    int32_t sep = tok_vocab_get(&t->vocab, "[SEP]", 5);
    if (st == NOPAD_OK && (cls < 0 || sep < 0))
        st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: no %s line (needed for [CLS] text [SEP])",
                             where, cls < 0 ? "[CLS]" : "[SEP]");
    if (st == NOPAD_OK) st = set_template(t, &cls, 1, &sep, 1, where);
    if (st == NOPAD_OK) st = set_bert_pair(t, cls, sep, 0, where);
    /* BERT's special tokens are never split or normalized */
    static const char *const specials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    tok_added flags = {.special = 1};
    for (int i = 0; i < 5 && st == NOPAD_OK; i++)
        if (tok_vocab_get(&t->vocab, specials[i], strlen(specials[i])) >= 0)
            st = add_token(t, specials[i], strlen(specials[i]), &flags, where);
    if (st == NOPAD_OK) st = finish(t, where);
    if (st == NOPAD_OK) { /* transformers' BERT converter: WordPiece("##"), cleanup on */
        cJSON *dec = cJSON_Parse("{\"type\": \"WordPiece\", \"prefix\": \"##\", \"cleanup\": true}");
        st = dec ? tok_decoder_load(t, dec, where) : out_of_memory(where);
        cJSON_Delete(dec);
    }
    if (st != NOPAD_OK) {
        nopad_tokenizer_free(t);
        return st;
    }
    *out = t;
    return NOPAD_OK;
}

/* ---- a model folder ------------------------------------------------------------------------- */

/* Reads a whole file. A missing file is not an error: *data stays NULL. */
static nopad_status read_optional_file(const char *path, char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    if (!file_exists(path)) return NOPAD_OK;
    return read_file(path, 0, data, len);
}

/* do_lower_case from tokenizer_config.json; true when the file or the key is absent. */
static nopad_status read_do_lower_case(const char *path, int *lowercase) {
    *lowercase = 1;
    char *data;
    size_t len;
    nopad_status st = read_optional_file(path, &data, &len);
    if (st != NOPAD_OK || !data) return st;
    cJSON *root = cJSON_ParseWithLength(data, len);
    free(data);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: not a JSON object", path);
    }
    st = get_bool(root, "do_lower_case", 1, "do_lower_case", path, lowercase);
    cJSON_Delete(root);
    return st;
}

nopad_status nopad_tokenizer_load(const char *dir, nopad_tokenizer **out) {
    if (out) *out = NULL;
    if (!dir || !out)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_tokenizer_load: need a folder and an output pointer");
    struct stat sb;
    if (stat(dir, &sb) == 0 && S_ISREG(sb.st_mode)) return tokenizer_from_gguf_file(dir, out);
    /* a missing "x.gguf" was meant as a GGUF file, not a folder */
    const size_t dir_len = strlen(dir);
    if (stat(dir, &sb) != 0 && dir_len >= 5 && strcasecmp(dir + dir_len - 5, ".gguf") == 0)
        return nopad_set_error(NOPAD_ERR_IO, "GGUF file '%s' does not exist", dir);
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return nopad_set_error(NOPAD_ERR_IO, "%s: tokenizer folder does not exist", dir);
    size_t n = strlen(dir) + sizeof "/tokenizer_config.json";
    char *path = malloc(n);
    if (!path) return out_of_memory(dir);
    char *data = NULL;
    size_t len = 0;
    snprintf(path, n, "%s/tokenizer.json", dir);
    nopad_status st = read_optional_file(path, &data, &len);
    if (st == NOPAD_OK && data) {
        st = tokenizer_from_json(data, len, path, out);
    } else if (st == NOPAD_OK) {
        int lowercase = 1;
        snprintf(path, n, "%s/tokenizer_config.json", dir);
        st = read_do_lower_case(path, &lowercase);
        snprintf(path, n, "%s/vocab.txt", dir);
        if (st == NOPAD_OK) st = read_optional_file(path, &data, &len);
        if (st == NOPAD_OK && data) st = tokenizer_from_vocab_txt(data, len, lowercase, path, out);
        else if (st == NOPAD_OK)
            st = nopad_set_error(NOPAD_ERR_IO, "%s: no tokenizer.json or vocab.txt", dir);
    }
    free(data);
    free(path);
    return st;
}

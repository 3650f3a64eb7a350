/* A tokenizer from a GGUF file's metadata. A GGUF has no tokenizer.json: it stores the vocabulary,
 * scores, merges, token types and special ids under llama.cpp's keys (tokenizer.ggml.*). This
 * file builds from them the tokenizer.json tree that Hugging Face transformers builds from the
 * same file (transformers 5: integrations/gguf/gguf_tokenizer_mapping.py, loaded through
 * AutoTokenizer.from_pretrained(folder, gguf_file=...)), then hands it to tokenizer_from_cjson.
 *
 *   tokenizer.ggml.model "gpt2"   byte-level BPE as GPT2Tokenizer: tokens spelled outside the
 *                                 byte alphabet are respelled byte by byte; ByteLevel
 *                                 pre-tokenizer and decoder
 *   tokenizer.ggml.model "llama"  SentencePiece BPE as LlamaTokenizer: byte_fallback, fuse_unk,
 *                                 Metaspace (prepend "first"); with no merges in the file they
 *                                 are derived from the scores (generate_merges)
 * For both, a tokenizer.ggml.pre that transformers knows a split regex for gives
 * Split(regex, isolated) + ByteLevel(use_regex: false) as the pre-tokenizer. Added tokens, in
 * the order transformers adds them (which decides the ids of new ones): the tokenizer class's
 * own defaults (<|endoftext|>; <s> </s> <unk>), the tokens typed CONTROL (special), the ones
 * typed USER_DEFINED (not special), then the file's bos, eos, unknown and padding tokens; a
 * content already added keeps its first flags. The template adds bos when add_bos_token says so
 * (default: yes for llama, no for gpt2) and eos when add_eos_token does. */
#define _POSIX_C_SOURCE 200809L

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/gguf.h"
#include "io/tokenizer_internal.h"
#include "util/error.h"

/* The split regexes of transformers' GGUF_PRE_TOKENIZER_SPLITS, by tokenizer.ggml.pre. */
#define LLAMA3_SPLIT \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|" \
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define TEKKEN_SPLIT \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|" \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|" \
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_SPLIT \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|" \
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN35_SPLIT \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}|" \
    " ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define GPT4O_SPLIT \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|" \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|" \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const struct {
    const char *pre, *regex;
} pre_splits[] = {
    {"llama3", LLAMA3_SPLIT},      {"llama-v3", LLAMA3_SPLIT},    {"llama-bpe", LLAMA3_SPLIT},
    {"falcon3", LLAMA3_SPLIT},     {"falcon-h1", LLAMA3_SPLIT},   {"pixtral", LLAMA3_SPLIT},
    {"midm-2.0", LLAMA3_SPLIT},    {"lfm2", LLAMA3_SPLIT},        {"jina-v5-nano", LLAMA3_SPLIT},
    {"dbrx", LLAMA3_SPLIT},        {"smaug-bpe", LLAMA3_SPLIT},   {"tekken", TEKKEN_SPLIT},
    {"qwen2", QWEN2_SPLIT},        {"deepseek-r1-qwen", QWEN2_SPLIT}, {"kormo", QWEN2_SPLIT},
    {"f2llmv2", QWEN2_SPLIT},      {"megrez", QWEN2_SPLIT},       {"qwen35", QWEN35_SPLIT},
    {"gpt-4o", GPT4O_SPLIT},       {"llama4", GPT4O_SPLIT},       {"kanana2", GPT4O_SPLIT},
    {"talkie", GPT4O_SPLIT},       {"minimax-m2", GPT4O_SPLIT},
};

/* llama.cpp's token types (tokenizer.ggml.token_type). */
enum { TOKEN_CONTROL = 3, TOKEN_USER_DEFINED = 4 };
/* transformers' special tokens, in the order its tokenizers list them. */
enum { BOS, EOS, UNK, PAD, N_SPECIAL };
static const char *const special_keys[N_SPECIAL] = {
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"};

typedef struct added {
    const char *content; /* NUL-terminated, owned by the converter's strings */
    int32_t id;
    int special;
} added;

typedef struct converter {
    const gguf_file *f;
    const char *where;
    int byte_level;                 /* "gpt2" */
    const gguf_array *tokens, *types, *scores, *merges;
    uint32_t n;                     /* tokens */
    int64_t special[N_SPECIAL];     /* ids, -1 when absent */
    int add_bos, add_eos;
    const char *split_regex;        /* NULL: no Split */
    char **original;                /* [n] the tokens as the file spells them, NUL-terminated */
    char **spelled;                 /* [n] as the vocab spells them (the same for llama) */
    tok_vocab vocab;                /* spelled -> id (a later duplicate wins) */
    tok_vocab by_original;          /* original -> id, for derived merges */
    added *added;
    int32_t n_added, cap_added;
    int32_t max_added_id;           /* -1 when none */
    tok_vocab added_index;          /* content -> index into added */
} converter;

static nopad_status out_of_memory(const char *where) {
    return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory converting the GGUF "
                           "tokenizer", where);
}

/* ---- reading the metadata ------------------------------------------------------------------- */

static int str_is(gguf_str s, const char *lit) {
    return s.len == strlen(lit) && memcmp(s.data, lit, (size_t)s.len) == 0;
}

/* An optional array key: NULL when absent, else it must have one entry per token. */
static nopad_status per_token_array(converter *c, const char *key, gguf_type elem,
                                    const gguf_array **out) {
    *out = NULL;
    if (!gguf_find(c->f, key)) return NOPAD_OK;
    nopad_status st = elem == GGUF_TYPE_INT32   ? gguf_get_i32_array(c->f, key, out)
                      : elem == GGUF_TYPE_FLOAT32 ? gguf_get_f32_array(c->f, key, out)
                                                  : gguf_get_str_array(c->f, key, out);
    if (st != NOPAD_OK) return st;
    if (elem != GGUF_TYPE_STRING && (*out)->n != c->n)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: %s has %llu entries, expected one per token (%u)", c->where,
                               key, (unsigned long long)(*out)->n, c->n);
    return NOPAD_OK;
}

static nopad_status optional_bool(converter *c, const char *key, int dflt, int *out) {
    *out = dflt;
    return gguf_find(c->f, key) ? gguf_get_bool(c->f, key, out) : NOPAD_OK;
}

static nopad_status read_metadata(converter *c) {
    if (!gguf_find(c->f, "tokenizer.ggml.model"))
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: no tokenizer in the metadata (no key tokenizer.ggml.model)",
                               c->where);
    gguf_str model;
    nopad_status st = gguf_get_str(c->f, "tokenizer.ggml.model", &model);
    if (st != NOPAD_OK) return st;
    c->byte_level = str_is(model, "gpt2");
    if (!c->byte_level && !str_is(model, "llama"))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: tokenizer.ggml.model is '%.*s', which is not supported (gpt2: "
                               "byte-level BPE, llama: SentencePiece BPE)",
                               c->where, model.len > 64 ? 64 : (int)model.len, model.data);
    gguf_str arch;
    if (!c->byte_level && gguf_find(c->f, "general.architecture") &&
        gguf_get_str(c->f, "general.architecture", &arch) == NOPAD_OK) {
        /* transformers builds these with converters of their own */
        static const char *const own[] = {"gemma", "gemma2", "gemma3", "phi3"};
        for (int i = 0; i < 4; i++)
            if (str_is(arch, own[i]))
                return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                       "%s: a llama tokenizer of architecture '%s' is not "
                                       "supported (transformers converts it its own way)",
                                       c->where, own[i]);
    }

    st = gguf_get_str_array(c->f, "tokenizer.ggml.tokens", &c->tokens);
    if (st != NOPAD_OK) return st;
    if (c->tokens->n == 0)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: tokenizer.ggml.tokens is empty", c->where);
    if (c->tokens->n >= (uint64_t)INT32_MAX)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: %llu tokens is too many", c->where,
                               (unsigned long long)c->tokens->n);
    c->n = (uint32_t)c->tokens->n;
    st = per_token_array(c, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &c->types);
    if (st == NOPAD_OK) st = per_token_array(c, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32,
                                             &c->scores);
    if (st == NOPAD_OK) st = per_token_array(c, "tokenizer.ggml.merges", GGUF_TYPE_STRING,
                                             &c->merges);
    for (int s = 0; s < N_SPECIAL && st == NOPAD_OK; s++) {
        c->special[s] = -1;
        if (!gguf_find(c->f, special_keys[s])) continue;
        uint32_t id;
        st = gguf_get_u32(c->f, special_keys[s], &id);
        if (st == NOPAD_OK && id >= c->n)
            st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s is %u, but there are %u tokens",
                                 c->where, special_keys[s], id, c->n);
        c->special[s] = id;
    }
    /* transformers: llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise */
    if (st == NOPAD_OK)
        st = optional_bool(c, "tokenizer.ggml.add_bos_token", !c->byte_level, &c->add_bos);
    if (st == NOPAD_OK) st = optional_bool(c, "tokenizer.ggml.add_eos_token", 0, &c->add_eos);
    if (st != NOPAD_OK) return st;
    if (c->special[BOS] < 0) c->add_bos = 0;
    if (c->special[EOS] < 0) c->add_eos = 0;

    c->split_regex = NULL;
    if (gguf_find(c->f, "tokenizer.ggml.pre")) {
        gguf_str pre;
        st = gguf_get_str(c->f, "tokenizer.ggml.pre", &pre);
        for (size_t i = 0; st == NOPAD_OK && i < sizeof pre_splits / sizeof pre_splits[0]; i++)
            if (str_is(pre, pre_splits[i].pre)) c->split_regex = pre_splits[i].regex;
    }
    return st;
}

/* ---- spelling the vocabulary ---------------------------------------------------------------- */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 for
 * U+0100.. in byte order. A token is spelled in this alphabet when all its characters are. */
static int printable_byte(uint32_t b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

static uint32_t byte_char(uint8_t b) {
    if (printable_byte(b)) return b;
    uint32_t n = 0;
    for (uint32_t x = 0; x < b; x++) n += !printable_byte(x);
    return 256 + n;
}

static int in_byte_alphabet(uint32_t c) { return printable_byte(c) || (c >= 256 && c <= 323); }

/* A NUL-terminated copy of a string of the file, checked: valid UTF-8, no NUL (transformers
 * decodes the file's strings as strict UTF-8; a tree key cannot hold a NUL). */
static nopad_status copy_checked(converter *c, gguf_str s, const char *key, uint64_t i,
                                 char **out) {
    if (memchr(s.data, 0, (size_t)s.len))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s[%llu] contains a NUL byte", c->where,
                               key, (unsigned long long)i);
    if (tok_utf8_check(s.data, (size_t)s.len) != s.len)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s[%llu] is not valid UTF-8", c->where, key,
                               (unsigned long long)i);
    char *p = malloc((size_t)s.len + 1);
    if (!p) return out_of_memory(c->where);
    memcpy(p, s.data, (size_t)s.len);
    p[s.len] = '\0';
    *out = p;
    return NOPAD_OK;
}

static nopad_status spell(converter *c, const char *tok, char **out) {
    size_t len = strlen(tok), pos = 0;
    int ok = 1;
    while (pos < len && ok) ok = in_byte_alphabet(tok_utf8_next(tok, &pos));
    if (ok) {
        *out = (char *)tok;
        return NOPAD_OK;
    }
    char *p = malloc(2 * len + 1); /* each byte becomes a character of 1 or 2 bytes */
    if (!p) return out_of_memory(c->where);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += (size_t)tok_utf8_put(byte_char((uint8_t)tok[i]), p + n);
    p[n] = '\0';
    *out = p;
    return NOPAD_OK;
}

static nopad_status read_tokens(converter *c) {
    c->original = calloc(c->n, sizeof *c->original);
    c->spelled = calloc(c->n, sizeof *c->spelled);
    if (!c->original || !c->spelled) return out_of_memory(c->where);
    nopad_status st = tok_vocab_init(&c->vocab, c->n);
    if (st == NOPAD_OK) st = tok_vocab_init(&c->by_original, c->n);
    for (uint32_t i = 0; i < c->n && st == NOPAD_OK; i++) {
        st = copy_checked(c, gguf_array_str(c->tokens, i), "tokenizer.ggml.tokens", i,
                          &c->original[i]);
        if (st != NOPAD_OK) break;
        if (c->byte_level) st = spell(c, c->original[i], &c->spelled[i]);
        else c->spelled[i] = c->original[i];
        if (st == NOPAD_OK)
            st = tok_vocab_put(&c->vocab, c->spelled[i], strlen(c->spelled[i]), (int32_t)i);
        if (st == NOPAD_OK)
            st = tok_vocab_put(&c->by_original, c->original[i], strlen(c->original[i]),
                               (int32_t)i);
    }
    return st;
}

static int32_t vocab_id(const tok_vocab *v, const char *s) {
    return tok_vocab_get(v, s, strlen(s));
}

/* ---- added tokens --------------------------------------------------------------------------- */

/* As tokenizers' AddedVocabulary::add_tokens: a content already added is skipped; a new one
 * takes its vocab id, else the next id past the vocab and the added tokens. */
static nopad_status add(converter *c, const char *content, int special) {
    size_t len = strlen(content);
    if (len == 0 || tok_vocab_get(&c->added_index, content, len) >= 0) return NOPAD_OK;
    int32_t id = vocab_id(&c->vocab, content);
    if (id < 0) {
        int32_t max = c->max_added_id, size = c->vocab.count;
        id = max < 0 ? size : (max >= size || size == 0 ? max + 1 : size);
    }
    if (c->n_added == c->cap_added) {
        int32_t cap = c->cap_added ? 2 * c->cap_added : 16;
        added *a = realloc(c->added, (size_t)cap * sizeof *a);
        if (!a) return out_of_memory(c->where);
        c->added = a;
        c->cap_added = cap;
    }
    c->added[c->n_added] = (added){content, id, special};
    nopad_status st = tok_vocab_put(&c->added_index, content, len, c->n_added);
    if (st != NOPAD_OK) return st;
    c->n_added++;
    if (id > c->max_added_id) c->max_added_id = id;
    return NOPAD_OK;
}

static int all_in_byte_alphabet(const char *s) {
    size_t len = strlen(s), pos = 0;
    while (pos < len)
        if (!in_byte_alphabet(tok_utf8_next(s, &pos))) return 0;
    return 1;
}

static nopad_status add_tokens(converter *c) {
    nopad_status st = tok_vocab_init(&c->added_index, 64);
    /* 1. the tokenizer class's defaults (GPT2Tokenizer: unk = bos = eos = <|endoftext|>;
     *    LlamaTokenizer: bos <s>, eos </s>, unk <unk>) */
    if (st == NOPAD_OK && c->byte_level) st = add(c, "<|endoftext|>", 1);
    if (st == NOPAD_OK && !c->byte_level) st = add(c, "<s>", 1);
    if (st == NOPAD_OK && !c->byte_level) st = add(c, "</s>", 1);
    if (st == NOPAD_OK && !c->byte_level) st = add(c, "<unk>", 1);
    /* 2. CONTROL tokens as special ones; in a byte-level vocabulary one spelled outside the byte
     *    alphabet is a llama.cpp mislabel and is skipped */
    for (uint32_t i = 0; c->types && i < c->n && st == NOPAD_OK; i++)
        if (gguf_array_i32(c->types, i) == TOKEN_CONTROL &&
            (!c->byte_level || all_in_byte_alphabet(c->original[i])))
            st = add(c, c->original[i], 1);
    /* 3. USER_DEFINED tokens that the vocabulary (added tokens included) holds, not special */
    for (uint32_t i = 0; c->types && i < c->n && st == NOPAD_OK; i++) {
        const char *t = c->original[i];
        if (gguf_array_i32(c->types, i) == TOKEN_USER_DEFINED &&
            (vocab_id(&c->vocab, t) >= 0 || vocab_id(&c->added_index, t) >= 0))
            st = add(c, t, 0);
    }
    /* 4. the file's bos, eos, unknown and padding tokens, as the file spells them */
    for (int s = 0; s < N_SPECIAL && st == NOPAD_OK; s++)
        if (c->special[s] >= 0) st = add(c, c->original[c->special[s]], 1);
    return st;
}

/* The id the tokenizer gives a content: an added token's, else the vocab's. */
static int32_t token_id(const converter *c, const char *content) {
    int32_t i = vocab_id(&c->added_index, content);
    return i >= 0 ? c->added[i].id : vocab_id(&c->vocab, content);
}

/* ---- merges --------------------------------------------------------------------------------- */

static nopad_status add_pair(cJSON *list, const char *a, size_t la, const char *b, size_t lb,
                             const char *where) {
    cJSON *pair = cJSON_CreateArray();
    char *sa = malloc(la + 1), *sb = malloc(lb + 1);
    if (!pair || !sa || !sb) {
        cJSON_Delete(pair);
        free(sa);
        free(sb);
        return out_of_memory(where);
    }
    memcpy(sa, a, la), sa[la] = '\0';
    memcpy(sb, b, lb), sb[lb] = '\0';
    cJSON *ja = cJSON_CreateString(sa), *jb = cJSON_CreateString(sb);
    free(sa);
    free(sb);
    if (!ja || !jb) {
        cJSON_Delete(ja);
        cJSON_Delete(jb);
        cJSON_Delete(pair);
        return out_of_memory(where);
    }
    cJSON_AddItemToArray(pair, ja);
    cJSON_AddItemToArray(pair, jb);
    cJSON_AddItemToArray(list, pair);
    return NOPAD_OK;
}

/* The file's merges, "a b" each, as transformers splits them: on the one space. */
static nopad_status file_merges(converter *c, cJSON *list) {
    for (uint64_t i = 0; i < c->merges->n; i++) {
        char *m;
        nopad_status st = copy_checked(c, gguf_array_str(c->merges, i), "tokenizer.ggml.merges",
                                       i, &m);
        if (st != NOPAD_OK) return st;
        char *sp = strchr(m, ' ');
        if (!sp || strchr(sp + 1, ' ')) {
            st = nopad_set_error(NOPAD_ERR_FORMAT,
                                 "%s: tokenizer.ggml.merges[%llu] '%.64s' is not two tokens "
                                 "separated by one space",
                                 c->where, (unsigned long long)i, m);
            free(m);
            return st;
        }
        st = add_pair(list, m, (size_t)(sp - m), sp + 1, strlen(sp + 1), c->where);
        free(m);
        if (st != NOPAD_OK) return st;
    }
    return NOPAD_OK;
}

/* A merge derived from the vocabulary: the token `merge` split after `left_len` bytes. */
typedef struct derived {
    double score;           /* of the merged token */
    uint32_t left_cps, right_cps;
    int32_t left_id, right_id;
    uint32_t token;         /* the merged token's index (its first occurrence) */
    uint32_t left_len;      /* bytes */
    uint64_t seq;           /* order of generation, for a stable sort */
} derived;

static int compare_local(const void *x, const void *y) {
    const derived *a = x, *b = y;
    if (a->left_id != b->left_id) return a->left_id < b->left_id ? -1 : 1;
    return a->right_id < b->right_id ? -1 : a->right_id > b->right_id;
}

/* Best score first, then longer left piece, then longer right piece, then generation order. */
static int compare_derived(const void *x, const void *y) {
    const derived *a = x, *b = y;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->left_cps != b->left_cps) return a->left_cps > b->left_cps ? -1 : 1;
    if (a->right_cps != b->right_cps) return a->right_cps > b->right_cps ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

static size_t count_cps(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += ((uint8_t)s[i] & 0xC0) != 0x80;
    return n;
}

/* transformers' generate_merges(vocab, scores): for each distinct token (first occurrence
 * order, the score of its last occurrence), every split into two pieces that are both tokens,
 * ordered by the pieces' ids; then all of them by score, left length and right length (in
 * characters), best first, ties in that order. Pieces and ids are the file's spellings. */
static nopad_status derived_merges(converter *c, cJSON *list) {
    if (!c->scores)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: no tokenizer.ggml.merges, and no tokenizer.ggml.scores to "
                               "derive them from",
                               c->where);
    derived *all = NULL;
    size_t n = 0, cap = 0;
    uint64_t seq = 0;
    tok_vocab seen; /* tokens met so far */
    nopad_status st = tok_vocab_init(&seen, c->n);
    for (uint32_t i = 0; i < c->n && st == NOPAD_OK; i++) {
        const char *tok = c->original[i];
        size_t len = strlen(tok);
        int32_t last = vocab_id(&c->by_original, tok);
        /* the first occurrence stands for the token; its score is the last occurrence's */
        if (tok_vocab_get(&seen, tok, len) >= 0) continue;
        st = tok_vocab_put(&seen, tok, len, (int32_t)i);
        if (st != NOPAD_OK) break;
        float score = gguf_array_f32(c->scores, (uint64_t)last);
        if (isnan(score)) {
            st = nopad_set_error(NOPAD_ERR_FORMAT,
                                 "%s: tokenizer.ggml.scores[%d] is NaN; merges cannot be "
                                 "derived from it",
                                 c->where, last);
            break;
        }
        size_t start = n;
        uint32_t total_cps = (uint32_t)count_cps(tok, len), left_cps = 0;
        size_t pos = 0;
        while (pos < len) {
            (void)tok_utf8_next(tok, &pos);
            left_cps++;
            if (pos >= len) break;
            int32_t l = tok_vocab_get(&c->by_original, tok, pos);
            int32_t r = l >= 0 ? tok_vocab_get(&c->by_original, tok + pos, len - pos) : -1;
            if (l < 0 || r < 0) continue;
            if (n == cap) {
                size_t nc = cap ? 2 * cap : 1024;
                derived *d = realloc(all, nc * sizeof *d);
                if (!d) {
                    st = out_of_memory(c->where);
                    break;
                }
                all = d;
                cap = nc;
            }
            all[n++] = (derived){score, left_cps, total_cps - left_cps, l, r, i, (uint32_t)pos, 0};
        }
        if (n > start) qsort(all + start, n - start, sizeof *all, compare_local);
        for (size_t k = start; k < n; k++) all[k].seq = seq++;
    }
    if (st == NOPAD_OK && n) qsort(all, n, sizeof *all, compare_derived);
    for (size_t k = 0; k < n && st == NOPAD_OK; k++) {
        const char *tok = c->original[all[k].token];
        st = add_pair(list, tok, all[k].left_len, tok + all[k].left_len,
                      strlen(tok) - all[k].left_len, c->where);
    }
    free(all);
    tok_vocab_free(&seen);
    return st;
}

/* ---- the tree ------------------------------------------------------------------------------- */

/* cJSON reports allocation failures as NULL items; building checks once at the end. */
typedef struct builder {
    int failed;
} builder;

static cJSON *obj(builder *b, cJSON *parent, const char *key) {
    cJSON *o = cJSON_CreateObject();
    if (!o || (parent && !cJSON_AddItemToObject(parent, key, o))) {
        cJSON_Delete(o);
        b->failed = 1;
        return NULL;
    }
    return o;
}

static void put_str(builder *b, cJSON *o, const char *key, const char *v) {
    if (!o || !cJSON_AddStringToObject(o, key, v)) b->failed = 1;
}
static void put_bool(builder *b, cJSON *o, const char *key, int v) {
    if (!o || !cJSON_AddBoolToObject(o, key, v)) b->failed = 1;
}
static void put_num(builder *b, cJSON *o, const char *key, double v) {
    if (!o || !cJSON_AddNumberToObject(o, key, v)) b->failed = 1;
}
static void put_null(builder *b, cJSON *o, const char *key) {
    if (!o || !cJSON_AddNullToObject(o, key)) b->failed = 1;
}
static cJSON *arr(builder *b, cJSON *o, const char *key) {
    cJSON *a = o ? cJSON_AddArrayToObject(o, key) : NULL;
    if (!a) b->failed = 1;
    return a;
}
static cJSON *item(builder *b, cJSON *list) {
    cJSON *o = cJSON_CreateObject();
    if (!o || !list || !cJSON_AddItemToArray(list, o)) {
        cJSON_Delete(o); /* not attached */
        b->failed = 1;
        return NULL;
    }
    return o;
}

static void push(builder *b, cJSON *list, cJSON *value) {
    if (!value || !list || !cJSON_AddItemToArray(list, value)) {
        cJSON_Delete(value); /* not attached */
        b->failed = 1;
    }
}

static int compare_added_ids(const void *x, const void *y) {
    const added *a = x, *b = y;
    return a->id < b->id ? -1 : a->id > b->id;
}

static void build_added_tokens(builder *b, converter *c, cJSON *root) {
    cJSON *list = arr(b, root, "added_tokens");
    added *sorted = malloc((size_t)(c->n_added ? c->n_added : 1) * sizeof *sorted);
    if (!sorted) {
        b->failed = 1;
        return;
    }
    memcpy(sorted, c->added, (size_t)c->n_added * sizeof *sorted);
    qsort(sorted, (size_t)c->n_added, sizeof *sorted, compare_added_ids); /* as HF lists them */
    for (int32_t i = 0; i < c->n_added; i++) {
        cJSON *t = item(b, list);
        put_num(b, t, "id", sorted[i].id);
        put_str(b, t, "content", sorted[i].content);
        put_bool(b, t, "single_word", 0);
        put_bool(b, t, "lstrip", 0);
        put_bool(b, t, "rstrip", 0);
        put_bool(b, t, "normalized", 0);
        put_bool(b, t, "special", sorted[i].special);
    }
    free(sorted);
}

static void build_pre_tokenizer(builder *b, converter *c, cJSON *root) {
    cJSON *pre = obj(b, root, "pre_tokenizer");
    if (c->split_regex) {
        put_str(b, pre, "type", "Sequence");
        cJSON *list = arr(b, pre, "pretokenizers");
        cJSON *split = item(b, list);
        put_str(b, split, "type", "Split");
        cJSON *pattern = obj(b, split, "pattern");
        put_str(b, pattern, "Regex", c->split_regex);
        put_str(b, split, "behavior", "Isolated");
        put_bool(b, split, "invert", 0);
        cJSON *bl = item(b, list);
        put_str(b, bl, "type", "ByteLevel");
        put_bool(b, bl, "add_prefix_space", 0);
        put_bool(b, bl, "trim_offsets", 1);
        put_bool(b, bl, "use_regex", 0);
    } else if (c->byte_level) {
        put_str(b, pre, "type", "ByteLevel");
        put_bool(b, pre, "add_prefix_space", 0);
        put_bool(b, pre, "trim_offsets", 1);
        put_bool(b, pre, "use_regex", 1);
    } else {
        put_str(b, pre, "type", "Metaspace");
        put_str(b, pre, "replacement", "\xe2\x96\x81");
        put_str(b, pre, "prepend_scheme", "first");
        put_bool(b, pre, "split", 0);
    }
}

static void template_piece(builder *b, cJSON *list, const char *special, const char *seq,
                           int type_id) {
    cJSON *piece = item(b, list);
    cJSON *inner = obj(b, piece, special ? "SpecialToken" : "Sequence");
    put_str(b, inner, "id", special ? special : seq);
    put_num(b, inner, "type_id", type_id);
}

/* transformers' update_post_processor: "[bos:0] $A:0 [eos:0]", the pair adding
 * "[bos:1] $B:1 [eos:1]". */
static void build_post_processor(builder *b, converter *c, cJSON *root) {
    const char *bos = c->add_bos ? c->original[c->special[BOS]] : NULL;
    const char *eos = c->add_eos ? c->original[c->special[EOS]] : NULL;
    cJSON *p = obj(b, root, "post_processor");
    put_str(b, p, "type", "TemplateProcessing");
    cJSON *single = arr(b, p, "single");
    if (bos) template_piece(b, single, bos, NULL, 0);
    template_piece(b, single, NULL, "A", 0);
    if (eos) template_piece(b, single, eos, NULL, 0);
    cJSON *pair = arr(b, p, "pair");
    for (int k = 0; k < 2; k++) {
        if (bos) template_piece(b, pair, bos, NULL, k);
        template_piece(b, pair, NULL, k ? "B" : "A", k);
        if (eos) template_piece(b, pair, eos, NULL, k);
    }
    cJSON *specials = obj(b, p, "special_tokens");
    const char *names[2] = {bos, eos};
    for (int k = 0; k < 2; k++) {
        if (!names[k] || (k == 1 && bos && strcmp(bos, eos) == 0)) continue;
        cJSON *s = obj(b, specials, names[k]);
        put_str(b, s, "id", names[k]);
        push(b, arr(b, s, "ids"), cJSON_CreateNumber(token_id(c, names[k])));
        push(b, arr(b, s, "tokens"), cJSON_CreateString(names[k]));
    }
}

static void build_decoder(builder *b, converter *c, cJSON *root) {
    cJSON *d = obj(b, root, "decoder");
    if (c->byte_level) {
        put_str(b, d, "type", "ByteLevel");
        put_bool(b, d, "add_prefix_space", 1);
        put_bool(b, d, "trim_offsets", 1);
        put_bool(b, d, "use_regex", 1);
        return;
    }
    put_str(b, d, "type", "Sequence");
    cJSON *list = arr(b, d, "decoders");
    cJSON *replace = item(b, list);
    put_str(b, replace, "type", "Replace");
    cJSON *pattern = obj(b, replace, "pattern");
    put_str(b, pattern, "String", "\xe2\x96\x81");
    put_str(b, replace, "content", " ");
    put_str(b, item(b, list), "type", "ByteFallback");
    put_str(b, item(b, list), "type", "Fuse");
    cJSON *strip = item(b, list);
    put_str(b, strip, "type", "Strip");
    put_str(b, strip, "content", " ");
    put_num(b, strip, "start", 1);
    put_num(b, strip, "stop", 0);
}

static nopad_status build_model(builder *b, converter *c, cJSON *root) {
    cJSON *m = obj(b, root, "model");
    put_str(b, m, "type", "BPE");
    put_null(b, m, "dropout");
    put_null(b, m, "unk_token");
    if (c->byte_level) {
        put_str(b, m, "continuing_subword_prefix", "");
        put_str(b, m, "end_of_word_suffix", "");
    } else {
        put_null(b, m, "continuing_subword_prefix");
        put_null(b, m, "end_of_word_suffix");
    }
    put_bool(b, m, "fuse_unk", !c->byte_level);
    put_bool(b, m, "byte_fallback", !c->byte_level);
    put_bool(b, m, "ignore_merges", 0);
    /* in id order, each spelling once, with the id of its last occurrence */
    cJSON *vocab = obj(b, m, "vocab");
    for (uint32_t i = 0; i < c->n && !b->failed; i++)
        if (vocab_id(&c->vocab, c->spelled[i]) == (int32_t)i)
            put_num(b, vocab, c->spelled[i], i);
    cJSON *merges = arr(b, m, "merges");
    if (b->failed) return out_of_memory(c->where);
    return c->merges ? file_merges(c, merges) : derived_merges(c, merges);
}

static void converter_free(converter *c) {
    for (uint32_t i = 0; i < c->n; i++) {
        if (c->spelled && c->original && c->spelled[i] != c->original[i]) free(c->spelled[i]);
        if (c->original) free(c->original[i]);
    }
    free(c->original);
    free(c->spelled);
    tok_vocab_free(&c->vocab);
    tok_vocab_free(&c->by_original);
    tok_vocab_free(&c->added_index);
    free(c->added);
}

nopad_status tokenizer_json_from_gguf(const gguf_file *f, cJSON **out) {
    if (!f || !out)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "tokenizer_json_from_gguf: need a file and out");
    *out = NULL;
    converter c = {.f = f, .where = f->path ? f->path : "<gguf>", .max_added_id = -1};
    nopad_status st = read_metadata(&c);
    if (st == NOPAD_OK) st = read_tokens(&c);
    if (st == NOPAD_OK) st = add_tokens(&c);
    builder b = {0};
    cJSON *root = NULL;
    if (st == NOPAD_OK) {
        root = obj(&b, NULL, NULL);
        put_str(&b, root, "version", "1.0");
        put_null(&b, root, "truncation");
        put_null(&b, root, "padding");
        build_added_tokens(&b, &c, root);
        put_null(&b, root, "normalizer");
        build_pre_tokenizer(&b, &c, root);
        build_post_processor(&b, &c, root);
        build_decoder(&b, &c, root);
        st = build_model(&b, &c, root);
        if (st == NOPAD_OK && b.failed) st = out_of_memory(c.where);
    }
    converter_free(&c);
    if (st != NOPAD_OK) {
        cJSON_Delete(root);
        return st;
    }
    *out = root;
    return NOPAD_OK;
}

nopad_status tokenizer_from_gguf_file(const char *path, nopad_tokenizer **out) {
    if (out) *out = NULL;
    if (!path || !out)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "tokenizer_from_gguf_file: need a path and out");
    gguf_file f;
    nopad_status st = gguf_open(path, &f);
    if (st != NOPAD_OK) return st;
    cJSON *root = NULL;
    st = tokenizer_json_from_gguf(&f, &root);
    if (st == NOPAD_OK) st = tokenizer_from_cjson(root, path, out);
    cJSON_Delete(root);
    gguf_close(&f);
    return st;
}

/* Internal tokenizer entry points (the public ones are in nopad.h). */
#ifndef NOPAD_IO_TOKENIZER_INTERNAL_H
#define NOPAD_IO_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "nopad.h"

/* Builds a tokenizer from the bytes of a tokenizer.json (the fuzzed entry point). `where` names
 * the source in error messages. */
nopad_status tokenizer_from_json(const char *json, size_t len, const char *where,
                                 nopad_tokenizer **out);

struct cJSON;
/* The same from a parsed tokenizer.json tree (GGUF metadata is converted into one). */
nopad_status tokenizer_from_cjson(const struct cJSON *root, const char *where,
                                  nopad_tokenizer **out);

/* A tokenizer from a GGUF file's metadata (tokenizer.ggml.*): the tokenizer.json tree that
 * transformers builds from the same file, given to tokenizer_from_cjson (tokenizer_gguf.c). */
nopad_status tokenizer_from_gguf_file(const char *path, nopad_tokenizer **out);
struct gguf_file;
/* That tree alone (tests compare it with transformers'); free it with cJSON_Delete. */
nopad_status tokenizer_json_from_gguf(const struct gguf_file *f, struct cJSON **out);

/* Builds a WordPiece tokenizer from the bytes of a vocab.txt (one token per line, line = id). */
nopad_status tokenizer_from_vocab_txt(const char *text, size_t len, int lowercase,
                                      const char *where, nopad_tokenizer **out);

/* Reads tokenizer.json's "decoder" (NULL or null: none, tokens joined by " ") into t->decoder and
 * builds the id -> token table; call it once the vocab and added tokens are final. A decoder
 * type nopad lacks is not an error here: nopad_detokenize refuses it (tokenizer_decode.c). */
struct tok_decoder;
nopad_status tok_decoder_load(nopad_tokenizer *t, const struct cJSON *decoder, const char *where);
void tok_decoder_free(struct tok_decoder *d);

/* ---- the tokenizer object, shared by src/io/tokenizer*.c -------------------------------------
 *
 * The pipeline is Hugging Face tokenizers':
 *   raw text -> split out added tokens ([CLS], ...) -> normalize (BertNormalizer)
 *            -> pre-tokenize (BertPreTokenizer) -> WordPiece -> template ([CLS] $A [SEP]);
 * for byte-level BPE (GPT-2, RoBERTa; tokenizer_bpe.c) the middle is instead
 *            -> ByteLevel (GPT-2 split regex, bytes as characters) -> BPE merges.
 * The object is immutable after loading, so any number of threads may tokenize with it. */

/* Open-addressing hash map from token bytes to id (tokenizer_vocab.c). Keys live back to back in
 * one pool; a slot holds a 32-bit hash so most misses never touch the pool. */
typedef struct tok_vocab_slot {
    uint32_t hash;
    uint32_t len;
    uint32_t offset; /* into pool */
    int32_t id;      /* -1: empty slot */
} tok_vocab_slot;

typedef struct tok_vocab {
    tok_vocab_slot *slots;
    uint32_t mask; /* number of slots - 1 (a power of two) */
    int32_t count;
    char *pool;
    size_t pool_len, pool_cap;
    uint32_t max_key_len; /* longest key: no lookup of a longer string can succeed */
    int32_t max_id;       /* -1 when empty */
} tok_vocab;

/* FNV-1a, fed byte by byte so WordPiece can hash every prefix of a candidate in one pass. */
#define TOK_HASH_INIT 14695981039346656037ull
static inline uint64_t tok_hash_step(uint64_t h, uint8_t byte) {
    return (h ^ byte) * 1099511628211ull;
}
uint64_t tok_hash_bytes(const char *s, size_t len);

nopad_status tok_vocab_init(tok_vocab *v, size_t expected);
/* Inserts or overwrites (a later duplicate wins, as in a Python dict or a Rust HashMap). */
nopad_status tok_vocab_put(tok_vocab *v, const char *key, size_t len, int32_t id);
/* Id of key, or -1. `hash` is tok_hash_bytes(key, len). */
int32_t tok_vocab_find(const tok_vocab *v, uint64_t hash, const char *key, size_t len);
int32_t tok_vocab_get(const tok_vocab *v, const char *key, size_t len);
void tok_vocab_free(tok_vocab *v);

/* BertNormalizer settings; enabled == 0 for a null normalizer. */
typedef struct tok_normalizer {
    int enabled;
    int clean_text;
    int handle_chinese_chars;
    int strip_accents;
    int lowercase;
} tok_normalizer;

typedef enum tok_pre_tokenizer {
    TOK_PRE_NONE = 0,          /* null: each segment is one word */
    TOK_PRE_BERT = 1,          /* split on whitespace, isolate each punctuation char */
    TOK_PRE_WHITESPACE_SPLIT,  /* split on whitespace only */
    TOK_PRE_WHITESPACE,        /* the regex \w+|[^\w\s]+ */
    TOK_PRE_BYTELEVEL,         /* GPT-2's split regex, then bytes -> characters (BPE only) */
} tok_pre_tokenizer;

typedef enum tok_model_kind {
    TOK_MODEL_WORDPIECE = 0,
    TOK_MODEL_BPE = 1,
    TOK_MODEL_UNIGRAM = 2,
} tok_model_kind;

struct pcre2_real_code_8; /* pcre2_code of <pcre2.h>, kept out of this header */

/* A BPE model (tokenizer_bpe.c): merges keyed by the ids of the pair, ranked by file order. */
typedef struct tok_bpe {
    tok_vocab merges;       /* 8 bytes (left id, right id) -> rank (the merge's index) */
    int32_t *merge_result;  /* [n_merges] the id of the merged token */
    int32_t n_merges;
    int fuse_unk;           /* consecutive unknown characters give one unk */
    int ignore_merges;      /* a word that is a vocab entry is that token, merges or not */
    /* ByteLevel pre-tokenizer */
    int add_prefix_space;   /* a piece not starting with ' ' gets one */
    int use_regex;          /* split with GPT-2's regex (else the piece is one word) */
    struct pcre2_real_code_8 *split_re;
    char byte_char[256][2]; /* GPT-2's bytes_to_unicode, as UTF-8 (1 or 2 bytes) */
    uint8_t byte_char_len[256];
    int32_t byte_id[256];   /* vocab id of each byte's character, -1 if absent */
    /* the general pipeline's BPE (tok_bpe_encode_word): symbols are the word's characters */
    int byte_fallback;      /* an unknown character becomes its bytes' <0xNN> tokens */
    int32_t fallback_id[256]; /* id of "<0xNN>", -1 if absent */
    char *prefix, *suffix;  /* continuing_subword_prefix / end_of_word_suffix, NULL when none */
    size_t prefix_len, suffix_len;
} tok_bpe;

/* A Unigram model (tokenizer_unigram.c): pieces in nopad_tokenizer.vocab, scores by id. */
typedef struct tok_unigram {
    double *score;           /* [n] log-probability of each piece */
    int32_t n;
    double min_score;        /* unknown characters score min_score - 10, as in SentencePiece */
    int byte_fallback;       /* an unknown piece becomes its bytes' <0xNN> tokens */
    int32_t fallback_id[256];
} tok_unigram;

/* ---- the general pipeline (tokenizer_pipeline.c) --------------------------------------------
 * Tokenizers that are not plain BERT WordPiece or plain byte-level BPE run a list of normalizer
 * steps (Sequence flattened) and a list of pre-tokenizer steps over UTF-8 strings. */

typedef enum tok_norm_kind {
    TOK_NORM_BERT, TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD, TOK_NORM_LOWERCASE,
    TOK_NORM_STRIP, TOK_NORM_STRIP_ACCENTS, TOK_NORM_REPLACE, TOK_NORM_PREPEND,
    TOK_NORM_PRECOMPILED, TOK_NORM_NMT,
} tok_norm_kind;

struct tok_precompiled; /* SentencePiece's precompiled charsmap (tokenizer_precompiled.c) */

typedef struct tok_norm_step {
    tok_norm_kind kind;
    tok_normalizer bert;           /* BERT */
    int left, right;               /* STRIP */
    char *pattern, *content;       /* REPLACE: the literal pattern (NULL with a regex) and content;
                                      PREPEND: content */
    size_t pattern_len, content_len;
    struct pcre2_real_code_8 *re;  /* REPLACE with a Regex */
    struct tok_precompiled *charsmap; /* PRECOMPILED; NULL: an empty charsmap, no change */
} tok_norm_step;

typedef enum tok_split_behavior {
    TOK_SPLIT_REMOVED, TOK_SPLIT_ISOLATED, TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT, TOK_SPLIT_CONTIGUOUS,
} tok_split_behavior;

typedef enum tok_pre_kind {
    TOK_PS_WHITESPACE_SPLIT, TOK_PS_WHITESPACE, TOK_PS_BERT, TOK_PS_PUNCTUATION, TOK_PS_DIGITS,
    TOK_PS_SPLIT, TOK_PS_METASPACE, TOK_PS_BYTELEVEL, TOK_PS_CHAR_DELIMITER,
} tok_pre_kind;

typedef struct tok_pre_step {
    tok_pre_kind kind;
    tok_split_behavior behavior;   /* PUNCTUATION, SPLIT */
    int invert;                    /* SPLIT */
    int individual_digits;         /* DIGITS */
    char *pattern;                 /* SPLIT with a String pattern (NULL with a regex) */
    size_t pattern_len;
    struct pcre2_real_code_8 *re;  /* SPLIT with a Regex; BYTELEVEL with use_regex */
    char ch[4];                    /* METASPACE replacement, CHAR_DELIMITER delimiter (UTF-8) */
    int ch_len;
    int prepend_scheme;            /* METASPACE: 0 always, 1 first, 2 never */
    int split;                     /* METASPACE */
    int add_prefix_space;          /* BYTELEVEL */
    char byte_char[256][2];        /* BYTELEVEL: GPT-2's bytes_to_unicode, as UTF-8 */
    uint8_t byte_char_len[256];
} tok_pre_step;

/* An entry of tokenizer.json's added_tokens: matched in the text before the model runs. */
typedef struct tok_added {
    char *content; /* UTF-8, the raw form */
    size_t len;
    char *pattern; /* what is matched: content, or its normalized form when normalized == 1 */
    size_t pattern_len;
    int32_t id;
    uint8_t single_word, lstrip, rstrip, normalized, special;
} tok_added;

/* Added tokens of one kind (raw or normalized) indexed by the first byte of their pattern, so the
 * scan looks at one small bucket per byte of text. */
typedef struct tok_matcher {
    int32_t *order;     /* indices into nopad_tokenizer.added, grouped by first byte */
    int32_t first[257]; /* bucket b is order[first[b] .. first[b+1]) */
    int32_t count;
} tok_matcher;

enum { TOK_PAIR_A = -1, TOK_PAIR_B = -2 };

struct nopad_tokenizer {
    tok_model_kind model;
    tok_bpe bpe; /* model == TOK_MODEL_BPE */
    tok_unigram unigram; /* model == TOK_MODEL_UNIGRAM */
    int general; /* 1: the general pipeline below; 0: norm + pre (BERT WordPiece, byte-level BPE) */
    tok_norm_step *norm_steps;
    int32_t n_norm_steps;
    tok_pre_step *pre_steps;
    int32_t n_pre_steps;
    tok_vocab vocab;
    tok_normalizer norm;
    tok_pre_tokenizer pre;
    int32_t unk_id;       /* -1: none (BPE drops unknown characters) */
    char *subword_prefix; /* "##" */
    size_t subword_prefix_len;
    int64_t max_chars_per_word; /* a longer word becomes unk */
    tok_added *added;
    int32_t n_added;
    tok_vocab added_index;    /* content -> index into added */
    int32_t max_added_id;     /* -1 when there are none */
    tok_matcher raw_matcher;  /* added tokens with normalized == 0, matched on the raw text */
    tok_matcher norm_matcher; /* normalized == 1, matched on the normalized text */
    int32_t *prefix_ids;      /* the single-sequence template: prefix_ids $A suffix_ids */
    int32_t n_prefix;
    int32_t *suffix_ids;
    int32_t n_suffix;
    int32_t *pair_template;   /* [n_pair_template, 2]: (id, type id) of each piece of the pair
                                 template, id TOK_PAIR_A / TOK_PAIR_B standing for $A / $B */
    int32_t n_pair_template;  /* 0: none given, so $A:0 $B:1 (HF without a post-processor) */
    int32_t vocab_size; /* largest id + 1, over the model vocab and the added tokens */
    struct tok_decoder *decoder; /* ids -> text (tokenizer_decode.c) */
};

/* ---- Unicode, as Hugging Face's BERT components see it (tokenizer_unicode.c) ----------------- */

/* Rust's char::is_whitespace (the White_Space property). */
int tok_is_whitespace(uint32_t c);
/* HF's is_control: general category C* except \t \n \r. */
int tok_is_control(uint32_t c);
/* The CJK ideograph ranges BERT puts spaces around. */
int tok_is_chinese(uint32_t c);
/* HF's is_bert_punc: ASCII punctuation or general category P*. */
int tok_is_punct(uint32_t c);
/* \w of the Rust regex crate (Alphabetic, M, Nd, Pc, Join_Control): the Whitespace
 * pre-tokenizer's \w+|[^\w\s]+ and added tokens' single_word. */
int tok_is_word(uint32_t c);
/* Rust's char::to_lowercase: 1 or 2 code points into out. */
int tok_lowercase(uint32_t c, uint32_t out[2]);
/* NFD of one code point with nonspacing marks dropped: 0..TOK_MAX_DECOMP code points. */
enum { TOK_MAX_DECOMP = 8 };
int tok_strip_accents(uint32_t c, uint32_t out[TOK_MAX_DECOMP]);
/* Canonical combining class, as HF's NFD orders marks. */
int tok_combining_class(uint32_t c);
/* HF's StripAccents test (unicode-normalization's is_combining_mark: a Mark known to its tables). */
int tok_is_combining_mark(uint32_t c);
/* The full canonical (compat: compatibility) decomposition of c as HF's tables know it. */
enum { TOK_MAX_COMPAT_DECOMP = 32 };
int tok_decompose(uint32_t c, int compat, uint32_t *out, int cap);
/* The primary composite of a + b (1), or 0 when they do not compose for HF. */
int tok_compose_pair(uint32_t a, uint32_t b, uint32_t *out);

/* ---- UTF-8 and normalization (tokenizer_normalize.c) ------------------------------------- */

/* Offset of the first byte that is not valid UTF-8 (overlong forms, surrogates and code points
 * above U+10FFFF are invalid), or len when all of it is valid. */
size_t tok_utf8_check(const char *s, size_t len);
/* Decodes one code point of valid UTF-8 at s[*pos] and advances *pos. */
uint32_t tok_utf8_next(const char *s, size_t *pos);
/* Writes the UTF-8 of c into out[0..4) and returns its length. */
int tok_utf8_put(uint32_t c, char *out);

/* A growable code point array; starts on caller-provided storage so short texts never allocate. */
typedef struct tok_cpbuf {
    uint32_t *data;
    size_t len, cap;
    uint32_t *initial; /* caller storage (not freed) and its capacity */
    size_t initial_cap;
} tok_cpbuf;
void tok_cpbuf_init(tok_cpbuf *b, uint32_t *storage, size_t cap);
nopad_status tok_cpbuf_reserve(tok_cpbuf *b, size_t extra);
void tok_cpbuf_free(tok_cpbuf *b);

/* Appends the normalized code points of the valid UTF-8 s[0..len) to out. */
nopad_status tok_normalize(const tok_normalizer *norm, const char *s, size_t len, tok_cpbuf *out);

/* ---- JSON helpers of tokenizer_load.c, for the model files ---------------------------------- */

struct cJSON;
const struct cJSON *tok_json_field(const struct cJSON *obj, const char *key);
/* A JSON number that is a whole id in [0, INT32_MAX). */
int tok_json_as_id(const struct cJSON *item, int32_t *out);
/* An optional boolean: absent or null gives `dflt`. */
nopad_status tok_json_get_bool(const struct cJSON *obj, const char *key, int dflt,
                               const char *path, const char *where, int *out);

/* ---- BPE (tokenizer_bpe.c) ------------------------------------------------------------------ */

/* Reads model.merges / unk_token / options of a "BPE" model; t->vocab is already loaded. */
nopad_status tok_bpe_load_model(nopad_tokenizer *t, const struct cJSON *model, const char *where);
/* Reads a "ByteLevel" pre_tokenizer (compiles the split regex). */
nopad_status tok_bpe_load_byte_level(nopad_tokenizer *t, const struct cJSON *pre,
                                     const char *where);
void tok_bpe_free(tok_bpe *b);

/* Per-call scratch space of BPE encoding. */
typedef struct tok_bpe_merge {
    int32_t rank, pos, result; /* merge symbol pos with the next one into result */
} tok_bpe_merge;

typedef struct tok_bpe_work {
    int32_t *sym;        /* the word's symbols (ids), a list linked by prev / next */
    int32_t *prev, *next; /* -1 at the ends; prev[i] == -2 once symbol i is merged away */
    size_t cap;
    tok_bpe_merge *heap; /* candidate merges, lowest rank then leftmost first */
    size_t heap_len, heap_cap;
    char *text;    /* the piece with a prefix space */
    size_t text_cap;
    char *word;    /* the word as byte characters (ignore_merges) */
    size_t word_cap;
    void *match;   /* pcre2_match_data */
} tok_bpe_work;
void tok_bpe_work_free(tok_bpe_work *w);

/* Receives the ids of one word; returns nonzero to stop (truncation reached). */
typedef int (*tok_emit_fn)(void *ctx, const int32_t *ids, size_t n);
/* Encodes a piece of text between added tokens: ByteLevel pre-tokenization, then BPE on each
 * word, giving the ids to `emit` word by word. */
nopad_status tok_bpe_encode_piece(const nopad_tokenizer *t, tok_bpe_work *w, const char *s,
                                  size_t n, tok_emit_fn emit, void *ctx);

/* ---- the general pipeline (tokenizer_pipeline.c) ------------------------------------------ */

/* GPT-2's split regex for PCRE2, and GPT-2's bytes_to_unicode as UTF-8 (1 or 2 bytes a byte). */
extern const char tok_gpt2_split_regex[];
void tok_byte_chars(char chars[256][2], uint8_t lens[256]);
/* Compiles a regex of tokenizer.json (Oniguruma syntax) with PCRE2 in UTF mode with Unicode
 * properties; \s and \S become the White_Space property, as Oniguruma means them. */
nopad_status tok_regex_compile(const char *pattern, size_t len, const char *path, const char *where,
                               struct pcre2_real_code_8 **out);

/* Reads tokenizer.json's normalizer / pre_tokenizer into step lists (Sequence flattened). */
nopad_status tok_pipeline_load_normalizer(nopad_tokenizer *t, const struct cJSON *n,
                                          const char *where);
nopad_status tok_pipeline_load_pre_tokenizer(nopad_tokenizer *t, const struct cJSON *p,
                                             const char *where);
void tok_pipeline_free(nopad_tokenizer *t);

/* A growable byte string. */
typedef struct tok_str {
    char *data;
    size_t len, cap;
} tok_str;
nopad_status tok_str_reserve(tok_str *s, size_t need);
nopad_status tok_str_append(tok_str *s, const char *bytes, size_t n);
void tok_str_free(tok_str *s);

/* Words of a pre-tokenized piece: word i is buf[start[i] .. start[i] + len[i]); first[i] is set
 * when it begins where the piece begins (Metaspace's prepend_scheme "first"). */
typedef struct tok_words {
    tok_str buf;
    size_t *start, *len;
    uint8_t *first;
    size_t n, cap;
} tok_words;

/* Per-call scratch space of the general pipeline. */
typedef struct tok_pipe_work {
    tok_str norm[2];     /* normalization ping-pong */
    tok_words words[2];  /* pre-tokenization ping-pong */
    tok_cpbuf cps;       /* BertNormalizer steps */
    size_t *spans;       /* (start, end, is_match) triples of one split */
    size_t spans_cap;
    void *match;         /* pcre2_match_data */
    int32_t *ids;        /* the ids of one word (Unigram, general BPE) */
    size_t ids_cap;
    double *best;        /* Unigram's Viterbi: best score ending at each byte */
    int32_t *best_start, *best_id;
    size_t best_cap;
} tok_pipe_work;
void tok_pipe_work_free(tok_pipe_work *w);

/* Runs the normalizer steps over s[0..n) into out (replacing its contents). */
nopad_status tok_pipeline_normalize(const nopad_tokenizer *t, tok_pipe_work *w, const char *s,
                                    size_t n, tok_str *out);
/* Runs the pre-tokenizer steps over s[0..n) (at_start: the piece begins the text) and gives each
 * word to fn; fn returns nonzero to stop (truncation reached). */
typedef nopad_status (*tok_word_fn)(void *ctx, const char *word, size_t len, int *stop);
nopad_status tok_pipeline_pre_tokenize(const nopad_tokenizer *t, tok_pipe_work *w, const char *s,
                                       size_t n, int at_start, tok_word_fn fn, void *ctx);

/* ---- SentencePiece's precompiled charsmap (tokenizer_precompiled.c) ------------------------ */

/* Parses the base64 text of a Precompiled normalizer's precompiled_charsmap. */
nopad_status tok_precompiled_load(const char *base64, const char *where,
                                  struct tok_precompiled **out);
void tok_precompiled_free(struct tok_precompiled *p);
/* Appends the normalized form of the valid UTF-8 s[0..n) to out. */
nopad_status tok_precompiled_normalize(const struct tok_precompiled *p, const char *s, size_t n,
                                       tok_str *out);

/* ---- Unigram (tokenizer_unigram.c) and the general BPE word (tokenizer_bpe.c) -------------- */

/* Reads a "Unigram" model: vocab [[piece, score], ...], unk_id, byte_fallback. */
nopad_status tok_unigram_load_model(nopad_tokenizer *t, const struct cJSON *model,
                                    const char *where);
void tok_unigram_free(tok_unigram *u);
/* The ids of one word into w->ids; *n_ids receives their number. */
nopad_status tok_unigram_encode_word(const nopad_tokenizer *t, tok_pipe_work *w, const char *s,
                                     size_t n, size_t *n_ids);
nopad_status tok_bpe_encode_word(const nopad_tokenizer *t, tok_bpe_work *bw, tok_pipe_work *w,
                                 const char *s, size_t n, size_t *n_ids);
/* Sets fallback[b] to the id of "<0xNN>" for every byte b (-1 when absent). */
void tok_byte_fallback_ids(const tok_vocab *v, int32_t fallback[256]);
nopad_status tok_pipe_reserve_ids(tok_pipe_work *w, size_t n);

#endif

/* libFuzzer target: the tokenizer loaders on arbitrary bytes, and tokenization of arbitrary text.
 *
 * The first byte picks what the rest is: (b % 8) 0 = a tokenizer.json, 1 = text for a fixed
 * WordPiece tokenizer, 2 = a vocab.txt, 3 = text for a fixed byte-level BPE tokenizer, 4 = text
 * for a fixed Unigram tokenizer (NFKC, Replace, Lowercase, Metaspace, byte fallback), 5 = text
 * for a fixed SentencePiece-style BPE (Prepend, Replace, byte fallback), 6 = text for a fixed
 * general byte-level BPE (Split regex, Digits, ByteLevel, NFC, Strip), 7 = a tokenizer.json; b / 8
 * picks the tokenize params. Beyond "no crash, no leak" the
 * text mode checks the promises nopad_tokenize makes: invalid UTF-8 is always refused, every id
 * is in the vocab, the template is kept, truncation gives a prefix of the full answer, and a
 * capacity-0 call reports the size a real call then fills; the same text split in two goes
 * through the pair template (check_pair). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_internal.h"

/* A small tokenizer using every feature: normalized and raw added tokens with all flags, a
 * two-token prefix, a short max_input_chars_per_word. */
static const char fixed_json[] =
    "{\"added_tokens\": ["
    "{\"id\": 0, \"content\": \"[PAD]\", \"special\": true, \"normalized\": false},"
    "{\"id\": 1, \"content\": \"[UNK]\", \"special\": true, \"normalized\": false},"
    "{\"id\": 2, \"content\": \"[CLS]\", \"special\": true, \"normalized\": false},"
    "{\"id\": 3, \"content\": \"[SEP]\", \"special\": true, \"normalized\": false},"
    "{\"id\": 4, \"content\": \"[MASK]\", \"special\": true, \"normalized\": false, "
    "\"lstrip\": true},"
    "{\"id\": 20, \"content\": \"<ent>\", \"single_word\": true, \"normalized\": true},"
    "{\"id\": 21, \"content\": \"New York\", \"normalized\": true, \"rstrip\": true},"
    "{\"id\": 22, \"content\": \"\xc4\xb0x\", \"normalized\": true}],"
    "\"normalizer\": {\"type\": \"BertNormalizer\", \"clean_text\": true, "
    "\"handle_chinese_chars\": true, \"strip_accents\": null, \"lowercase\": true},"
    "\"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"},"
    "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": ["
    "{\"SpecialToken\": {\"id\": \"[CLS]\", \"type_id\": 0}},"
    "{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},"
    "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}},"
    "{\"SpecialToken\": {\"id\": \"[SEP]\", \"type_id\": 0}}],"
    "\"special_tokens\": {\"[CLS]\": {\"id\": \"[CLS]\", \"ids\": [2], \"tokens\": [\"[CLS]\"]},"
    "\"<s>\": {\"id\": \"<s>\", \"ids\": [5, 6], \"tokens\": [\"a\", \"b\"]},"
    "\"[SEP]\": {\"id\": \"[SEP]\", \"ids\": [3], \"tokens\": [\"[SEP]\"]}}},"
    "\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", "
    "\"continuing_subword_prefix\": \"##\", \"max_input_chars_per_word\": 12, \"vocab\": {"
    "\"[PAD]\": 0, \"[UNK]\": 1, \"[CLS]\": 2, \"[SEP]\": 3, \"[MASK]\": 4, \"a\": 5, \"b\": 6, "
    "\"##a\": 7, \"##b\": 8, \"e\": 9, \"##e\": 10, \"\xe4\xb8\x80\": 11, \"i\": 12, "
    "\"##\xcc\x87\": 13, \"new\": 14, \"york\": 15, \",\": 16, \"!\": 17, \"ab\": 18, "
    "\"##ab\": 19}}}";

/* A byte-level BPE tokenizer: printable ASCII and the space's character (U+0120) only, so other
 * bytes take the unk path (fused), a few merges, <mask> with lstrip, <s> $A </s>. */
static const char fixed_bpe_json[] =
    "{\"added_tokens\": ["
    "{\"id\": 0, \"content\": \"<s>\", \"special\": true, \"normalized\": false},"
    "{\"id\": 1, \"content\": \"</s>\", \"special\": true, \"normalized\": false},"
    "{\"id\": 2, \"content\": \"<unk>\", \"special\": true, \"normalized\": false},"
    "{\"id\": 3, \"content\": \"<mask>\", \"special\": true, \"normalized\": false, "
    "\"lstrip\": true},"
    "{\"id\": 200, \"content\": \"xyz\", \"normalized\": true}],"
    "\"normalizer\": null,"
    "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
    "\"trim_offsets\": true, \"use_regex\": true},"
    "\"post_processor\": {\"type\": \"RobertaProcessing\", \"sep\": [\"</s>\", 1], "
    "\"cls\": [\"<s>\", 0], \"trim_offsets\": true, \"add_prefix_space\": true},"
    "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\", "
    "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, \"fuse_unk\": true, "
    "\"byte_fallback\": false, \"ignore_merges\": false, \"vocab\": {"
    "\"<s>\": 0, \"</s>\": 1, \"<unk>\": 2, \"<mask>\": 3, \"\u0120\": 4, \"t\": 5, \"h\": 6, "
    "\"e\": 7, \"a\": 8, \"b\": 9, \"\u0120t\": 10, \"he\": 11, \"\u0120the\": 12, "
    "\"ab\": 13, \"abab\": 14, \"\u0120\u0120\": 15, \"'\": 16, \"s\": 17, \"'s\": 18, "
    "\"1\": 19, \"2\": 20, \"12\": 21, \"!\": 22, \".\": 23, \"\u010a\": 24}, "
    "\"merges\": [\"\u0120 t\", \"h e\", [\"\u0120t\", \"he\"], \"a b\", \"ab ab\", "
    "\"\u0120 \u0120\", \"' s\", \"1 2\"]}}";

static nopad_tokenizer *fixed_bpe_tokenizer(void) {
    static nopad_tokenizer *tok;
    if (!tok &&
        tokenizer_from_json(fixed_bpe_json, sizeof fixed_bpe_json - 1, "fixed bpe", &tok) !=
            NOPAD_OK)
        __builtin_trap();
    return tok;
}

/* Unigram with the general pipeline: NFKC, a regex Replace, Lowercase, Metaspace, byte fallback
 * for what no piece covers, a fused unknown otherwise. */
static const char fixed_unigram_json[] =
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true, "
    "\"normalized\": false}, {\"id\": 1, \"content\": \"<s>\", \"special\": true, "
    "\"normalized\": false}, {\"id\": 30, \"content\": \"Ab\", \"normalized\": true}],"
    "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFKC\"}, "
    "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \" {2,}\"}, \"content\": \" \"}, "
    "{\"type\": \"Lowercase\"}, {\"type\": \"StripAccents\"}]},"
    "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\u2581\", "
    "\"prepend_scheme\": \"first\", \"split\": true},"
    "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": ["
    "{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, "
    "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
    "\"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}},"
    "\"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"byte_fallback\": true, \"vocab\": ["
    "[\"<unk>\", 0.0], [\"<s>\", 0.0], [\"\u2581\", -2.0], [\"a\", -3.0], [\"b\", -3.5], "
    "[\"ab\", -4.0], [\"\u2581a\", -3.2], [\"\u2581ab\", -5.0], [\"e\", -3.0], "
    "[\"\u00e9\", -4.5], [\"1\", -4.0], [\"12\", -5.5], [\"<0xC3>\", -9.0], [\"<0xA9>\", -9.0], "
    "[\"<0xE4>\", -9.0], [\"<0xB8>\", -9.0], [\"<0x80>\", -9.0], [\"x\", -6.0], "
    "[\"\u4e00\", -7.0], [\"ba\", -4.4]]}}";

/* SentencePiece-style BPE (LLaMA-2): Prepend and Replace make the spaces, byte fallback. */
static const char fixed_spbpe_json[] =
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true, "
    "\"normalized\": false}, {\"id\": 1, \"content\": \"<s>\", \"special\": true, "
    "\"normalized\": false}],"
    "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", "
    "\"prepend\": \"\u2581\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "
    "\"content\": \"\u2581\"}]}, \"pre_tokenizer\": null,"
    "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": ["
    "{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, "
    "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
    "\"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}},"
    "\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, "
    "\"byte_fallback\": true, \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"<0x0A>\": 2, "
    "\"<0xC3>\": 3, \"<0xA9>\": 4, \"<0xF0>\": 5, \"\u2581\": 6, \"a\": 7, \"b\": 8, "
    "\"\u2581a\": 9, \"ab\": 10, \"\u2581ab\": 11, \"1\": 12, \"\u2581\u2581\": 13}, "
    "\"merges\": [\"\u2581 a\", \"a b\", \"\u2581a b\", \"\u2581 \u2581\"]}}";

/* Byte-level BPE on the general pipeline (LLaMA-3 / Qwen2 style): NFC and Strip, a Split regex,
 * Digits, then ByteLevel without its own regex; ignore_merges. */
static const char fixed_general_bpe_json[] =
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"<|x|>\", \"special\": true, "
    "\"normalized\": false}],"
    "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, "
    "{\"type\": \"Strip\", \"strip_left\": false, \"strip_right\": true}]},"
    "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
    "\"pattern\": {\"Regex\": \"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, "
    "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"Digits\", "
    "\"individual_digits\": true}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
    "\"use_regex\": false}]}, \"post_processor\": null,"
    "\"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {\"<|x|>\": 0, "
    "\"a\": 1, \"b\": 2, \"ab\": 3, \"\u0120\": 4, \"\u0120a\": 5, \"1\": 6, \"\u00c3\": 7, "
    "\"\u00a9\": 8, \"\u00c3\u00a9\": 9, \"abab\": 10}, "
    "\"merges\": [\"a b\", \"\u0120 a\", \"\u00c3 \u00a9\", \"ab ab\"]}}";

static nopad_tokenizer *fixed_general(int which) {
    static nopad_tokenizer *toks[3];
    static const char *const json[3] = {fixed_unigram_json, fixed_spbpe_json,
                                        fixed_general_bpe_json};
    if (!toks[which] &&
        tokenizer_from_json(json[which], strlen(json[which]), "fixed general", &toks[which]) !=
            NOPAD_OK)
        __builtin_trap();
    return toks[which];
}

static nopad_tokenizer *fixed_tokenizer(void) {
    static nopad_tokenizer *tok;
    if (!tok && tokenizer_from_json(fixed_json, sizeof fixed_json - 1, "fixed", &tok) != NOPAD_OK)
        __builtin_trap();
    return tok;
}

/* Tokenizes `text` with params from `flags` and checks the invariants. */
static void check_tokenize(const nopad_tokenizer *tok, const char *text, size_t len,
                           unsigned flags) {
    nopad_tokenize_params p = nopad_tokenize_default_params();
    p.add_special_tokens = flags & 1;
    p.truncate = (flags >> 1) & 1;
    p.max_length = (int32_t)(flags >> 2); /* 0..7 */
    int valid = tok_utf8_check(text, len) == len;

    int32_t need = -1;
    nopad_status st = nopad_tokenize(tok, text, len, &p, NULL, 0, &need);
    if (!valid) {
        if (st != NOPAD_ERR_INVALID_ARGUMENT) __builtin_trap();
        return;
    }
    int32_t n_special = p.add_special_tokens ? tok->n_prefix + tok->n_suffix : 0;
    if (st == NOPAD_ERR_INVALID_ARGUMENT) { /* only for a max_length below the template */
        if (!(p.truncate && p.max_length > 0 && p.max_length < n_special)) __builtin_trap();
        return;
    }
    if (st == NOPAD_ERR_TOO_LONG) {
        if (p.truncate || p.max_length <= 0) __builtin_trap();
        return;
    }
    if (st != NOPAD_OK && st != NOPAD_ERR_BUFFER_TOO_SMALL) __builtin_trap();
    if (st == NOPAD_OK && need != 0) __builtin_trap();
    if (need < n_special) __builtin_trap();
    if (p.truncate && p.max_length > 0 && need > p.max_length) __builtin_trap();

    int32_t *ids = malloc(((size_t)need + 1) * sizeof *ids);
    int32_t n = -1;
    if (!ids) return;
    if (nopad_tokenize(tok, text, len, &p, ids, need, &n) != NOPAD_OK || n != need)
        __builtin_trap();
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= nopad_tokenizer_vocab_size(tok)) __builtin_trap();
    if (p.add_special_tokens) {
        for (int32_t i = 0; i < tok->n_prefix; i++)
            if (ids[i] != tok->prefix_ids[i]) __builtin_trap();
        for (int32_t i = 0; i < tok->n_suffix; i++)
            if (ids[n - tok->n_suffix + i] != tok->suffix_ids[i]) __builtin_trap();
    }
    /* the untruncated answer starts with the truncated one's content */
    if (p.truncate && p.max_length > 0) {
        nopad_tokenize_params full = p;
        full.truncate = 0;
        full.max_length = 0;
        int32_t n_full = -1;
        nopad_tokenize(tok, text, len, &full, NULL, 0, &n_full);
        int32_t *all = malloc(((size_t)n_full + 1) * sizeof *all);
        if (all) {
            if (nopad_tokenize(tok, text, len, &full, all, n_full, &n_full) != NOPAD_OK)
                __builtin_trap();
            int32_t content = n - n_special;
            if (n_full - n_special < content) __builtin_trap();
            int32_t head = p.add_special_tokens ? tok->n_prefix : 0;
            for (int32_t i = head; i < head + content; i++)
                if (ids[i] != all[i]) __builtin_trap();
            free(all);
        }
    }
    free(ids);
}

/* The text split in two as a pair: the promises of nopad_tokenize_pair (invalid UTF-8 refused,
 * ids in the vocab, a measuring call's size filled exactly, truncation within max_length). */
static void check_pair(const nopad_tokenizer *tok, const char *text, size_t len, unsigned flags) {
    nopad_tokenize_params p = nopad_tokenize_default_params();
    p.add_special_tokens = flags & 1;
    p.truncate = (flags >> 1) & 1;
    p.max_length = (int32_t)(flags >> 2) * 3; /* 0..21 */
    const size_t cut = len / 2;
    const int valid = tok_utf8_check(text, cut) == cut && tok_utf8_check(text + cut, len - cut) == len - cut;
    int32_t need = -1;
    nopad_status st = nopad_tokenize_pair(tok, text, cut, text + cut, len - cut, &p, NULL, NULL, 0, &need);
    if (!valid) {
        if (st != NOPAD_ERR_INVALID_ARGUMENT) __builtin_trap();
        return;
    }
    if (st == NOPAD_ERR_INVALID_ARGUMENT || st == NOPAD_ERR_TOO_LONG) return;
    if (st != NOPAD_OK && st != NOPAD_ERR_BUFFER_TOO_SMALL) __builtin_trap();
    if (p.truncate && p.max_length > 0 && need > p.max_length) __builtin_trap();
    int32_t *ids = malloc(((size_t)need + 1) * sizeof *ids), *types = malloc(((size_t)need + 1) * sizeof *types);
    int32_t n = -1;
    if (ids && types) {
        if (nopad_tokenize_pair(tok, text, cut, text + cut, len - cut, &p, ids, types, need, &n) != NOPAD_OK ||
            n != need)
            __builtin_trap();
        for (int32_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= nopad_tokenizer_vocab_size(tok)) __builtin_trap();
    }
    free(ids);
    free(types);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    unsigned mode = data[0] % 8, flags = data[0] / 8 % 32;
    const char *rest = (const char *)data + 1;
    size_t len = size - 1;
    nopad_tokenizer *tok = NULL;
    if (mode == 1 || mode == 3) {
        check_tokenize(mode == 1 ? fixed_tokenizer() : fixed_bpe_tokenizer(), rest, len, flags);
        check_pair(mode == 1 ? fixed_tokenizer() : fixed_bpe_tokenizer(), rest, len, flags);
        return 0;
    }
    if (mode >= 4 && mode <= 6) {
        check_tokenize(fixed_general((int)mode - 4), rest, len, flags);
        check_pair(fixed_general((int)mode - 4), rest, len, flags);
        return 0;
    }
    nopad_status st = mode != 2 ? tokenizer_from_json(rest, len, "fuzz", &tok)
                                : tokenizer_from_vocab_txt(rest, len, flags & 1, "fuzz", &tok);
    if (st != NOPAD_OK) {
        if (tok) __builtin_trap();
        return 0;
    }
    /* a tokenizer that loads must tokenize anything: its own bytes and a fixed mix */
    static const char mix[] = "Hello, [MASK] world! caf\xc3\xa9 \xe4\xb8\x80\xe4\xba\x8c "
                              "New York <ent> [CLS]x\xc4\xb0\t\xf0\x9f\x98\x80 ##a aaaaaaaaaaaa";
    check_tokenize(tok, mix, sizeof mix - 1, flags);
    check_tokenize(tok, rest, len < 4096 ? len : 4096, flags);
    check_pair(tok, mix, sizeof mix - 1, flags);
    check_pair(tok, rest, len < 4096 ? len : 4096, flags);
    nopad_tokenizer_token_to_id(tok, "[CLS]");
    nopad_tokenizer_free(tok);
    return 0;
}

/* Decoding (ids -> text) and the decode stream: parity with Hugging Face tokenizers' decode on the
 * fixtures of scripts/make_decode_fixtures.py (every decoder type), scripts/make_bpe_fixtures.py
 * (byte-level BPE) and, when present, the parity fixtures of every tokenizer family; U+FFFD
 * cases; bad ids and buffers; unsupported decoders; the tokenizer's kind. The stream is checked
 * wherever a decode is: every chunk valid UTF-8, the chunks plus the flush equal to the decode. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/tokenizer_internal.h"

static char *read_data(const char *rel, size_t *len) {
    char *data = test_read_file(test_data_path(rel), len);
    if (!data) fail_msg("cannot read %s", test_data_path(rel));
    return data;
}

static nopad_tokenizer *load_json_file(const char *rel) {
    size_t len;
    char *data = read_data(rel, &len);
    nopad_tokenizer *tok = NULL;
    assert_nopad_ok(tokenizer_from_json(data, len, rel, &tok));
    free(data);
    return tok;
}

static nopad_tokenizer *load_json_text(const char *json) {
    nopad_tokenizer *tok = NULL;
    assert_nopad_ok(tokenizer_from_json(json, strlen(json), "test", &tok));
    return tok;
}

/* nopad_detokenize into a fresh NUL-terminated string (measured first). */
static char *detok(const nopad_tokenizer *tok, const int32_t *ids, size_t n, int skip,
                   size_t *len) {
    size_t need = 0;
    nopad_status st = nopad_detokenize(tok, ids, n, skip, NULL, 0, &need);
    if (st != NOPAD_ERR_BUFFER_TOO_SMALL) assert_nopad_ok(st);
    char *text = malloc(need + 1);
    assert_non_null(text);
    assert_nopad_ok(nopad_detokenize(tok, ids, n, skip, text, need + 1, len));
    assert_int_equal(*len, need);
    assert_int_equal(text[need], '\0');
    return text;
}

static int valid_utf8(const char *s, size_t n) { return tok_utf8_check(s, n) == n; }

/* Streams ids one by one: every chunk must be valid UTF-8 and all chunks plus the flush must be
 * `want`. Returns 0, or -1 when the decoder cannot be streamed (NOPAD_ERR_UNSUPPORTED). */
static int check_stream(const char *label, const nopad_tokenizer *tok, const int32_t *ids,
                        size_t n, int skip, const char *want, size_t want_len) {
    nopad_decode_stream *s = NULL;
    nopad_status st = nopad_decode_stream_create(tok, skip, &s);
    if (st == NOPAD_ERR_UNSUPPORTED) return -1;
    assert_nopad_ok(st);
    char *all = malloc(want_len + 64);
    size_t got = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *text = NULL;
        size_t len = 0;
        if (i < n) assert_nopad_ok(nopad_decode_stream_step(s, ids[i], &text, &len));
        else assert_nopad_ok(nopad_decode_stream_flush(s, &text, &len));
        assert_non_null(text);
        assert_int_equal(text[len], '\0');
        if (!valid_utf8(text, len)) fail_msg("%s: chunk %zu is not valid UTF-8", label, i);
        if (got + len > want_len || memcmp(all + 0, want, got) != 0 ||
            memcmp(want + got, text, len) != 0)
            fail_msg("%s: after id %zu of %zu the chunks (%zu bytes, then %zu) differ from the "
                     "decode \"%.*s\"",
                     label, i, n, got, len, (int)(want_len < 200 ? want_len : 200), want);
        memcpy(all + got, text, len);
        got += len;
    }
    if (got != want_len) fail_msg("%s: the stream gave %zu bytes, the decode %zu", label, got, want_len);
    free(all);
    nopad_decode_stream_free(s);
    return 0;
}

/* Decodes ids and expects `want_hex` (HF's decode as hex UTF-8); then the stream. */
static void expect_decode(const char *label, const nopad_tokenizer *tok, const cJSON *ids_json,
                          int skip, const char *want_hex, int *streamed) {
    int n = cJSON_GetArraySize(ids_json);
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)cJSON_GetArrayItem(ids_json, i)->valuedouble;
    size_t want_len, len;
    char *want = test_hex_decode(want_hex, &want_len);
    char *got = detok(tok, ids, (size_t)n, skip, &len);
    if (len != want_len || memcmp(got, want, len) != 0)
        fail_msg("%s (skip_special_tokens %d): nopad \"%s\", HF \"%s\"", label, skip, got, want);
    if (!valid_utf8(got, len)) fail_msg("%s: the decode is not valid UTF-8", label);
    int rc = check_stream(label, tok, ids, (size_t)n, skip, want, want_len);
    if (streamed && rc == 0) (*streamed)++;
    free(got);
    free(want);
    free(ids);
}

/* ---- fixtures ------------------------------------------------------------------------------- */

/* Every decoder type (scripts/make_decode_fixtures.py): WordPiece-model tokenizers whose decoders
 * are the point; 24 random id lists each, with and without skip_special_tokens. */
static void test_decoders_match_hf(void **state) {
    size_t size;
    char *data = read_data("tokenizer/decode_cases.jsonl", &size);
    int n_decoders = 0, n_cases = 0, unstreamable = 0;
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        const char *name = cJSON_GetObjectItem(j, "name")->valuestring;
        nopad_tokenizer *tok = load_json_text(cJSON_GetObjectItem(j, "tokenizer")->valuestring);
        const cJSON *c;
        int streamed = 0, k = 0;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "cases")) {
            char label[160];
            snprintf(label, sizeof label, "decoder \"%s\", case %d", name, k++);
            const cJSON *ids = cJSON_GetArrayItem(c, 0);
            expect_decode(label, tok, ids, 0, cJSON_GetArrayItem(c, 1)->valuestring, &streamed);
            expect_decode(label, tok, ids, 1, cJSON_GetArrayItem(c, 2)->valuestring, &streamed);
            n_cases += 2;
        }
        /* streams are refused only where a step reads across tokens after Fuse / ByteLevel */
        if (streamed == 0) {
            unstreamable++;
            assert_true(strcmp(name, "nested Sequence") == 0 || strcmp(name, "Fuse Strip") == 0);
        }
        nopad_tokenizer_free(tok);
        cJSON_Delete(j);
        n_decoders++;
    }
    free(data);
    assert_true(n_decoders >= 20);
    print_message("decoders: %d types and combinations, %d decodes equal to HF's (%d decoders "
                  "not streamable)\n",
                  n_decoders, n_cases, unstreamable);
}

/* Byte-level BPE fixtures: HF's decode of every corpus and extra line. */
static void test_byte_level_bpe_matches_hf(void **state) {
    nopad_tokenizer *roberta = load_json_file("tokenizer/bpe_roberta.json");
    nopad_tokenizer *gpt2 = load_json_file("tokenizer/bpe_gpt2.json");
    size_t size;
    char *data = read_data("tokenizer/bpe_cases.jsonl", &size);
    int n = 0;
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n"), n++) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        const cJSON *dec = cJSON_GetObjectItem(j, "decode_roberta");
        if (!dec) fail_msg("bpe_cases.jsonl has no decode fields: run scripts/make_bpe_fixtures.py "
                           "--decode-only");
        char label[64];
        snprintf(label, sizeof label, "bpe_cases line %d", n);
        const cJSON *ids = cJSON_GetObjectItem(j, "roberta");
        expect_decode(label, roberta, ids, 0, dec->valuestring, NULL);
        expect_decode(label, roberta, ids, 1,
                      cJSON_GetObjectItem(j, "decode_roberta_skip")->valuestring, NULL);
        expect_decode(label, gpt2, cJSON_GetObjectItem(j, "gpt2"), 0,
                      cJSON_GetObjectItem(j, "decode_gpt2")->valuestring, NULL);
        cJSON_Delete(j);
    }
    assert_true(n > 200);
    free(data);
    nopad_tokenizer_free(roberta);
    nopad_tokenizer_free(gpt2);
}

/* The parity fixtures of every family (tokenizer/parity_cases.jsonl, tokenizer/parity/<tok>.json):
 * decode(ids_nospecial) and decode(ids, skip_special_tokens) equal to HF's, and the stream, for
 * every tokenizer nopad loads; the ones refused as unsupported are counted. */
static void test_parity_fixtures(void **state) {
    size_t size;
    char *data = test_read_file(test_data_path("tokenizer/parity_cases.jsonl"), &size);
    if (!data) {
        print_message("no tokenizer/parity_cases.jsonl: parity decode skipped\n");
        skip();
    }
    enum { MAX_TOKS = 64 };
    char names[MAX_TOKS][64];
    nopad_tokenizer *toks[MAX_TOKS];
    int loaded[MAX_TOKS], n_toks = 0, lines_ok = 0, lines_skipped = 0;
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        const char *name = cJSON_GetObjectItem(j, "tok")->valuestring;
        int k = 0;
        while (k < n_toks && strcmp(names[k], name) != 0) k++;
        if (k == n_toks) {
            assert_true(n_toks < MAX_TOKS);
            snprintf(names[k], sizeof names[k], "%s", name);
            char rel[128];
            snprintf(rel, sizeof rel, "tokenizer/parity/%s.json", name);
            size_t len;
            char *json = read_data(rel, &len);
            toks[k] = NULL;
            nopad_status st = tokenizer_from_json(json, len, rel, &toks[k]);
            free(json);
            if (st != NOPAD_OK && st != NOPAD_ERR_UNSUPPORTED)
                fail_msg("%s: %s", rel, nopad_last_error());
            loaded[k] = st == NOPAD_OK;
            if (!loaded[k]) print_message("%s: unsupported: %s\n", rel, nopad_last_error());
            n_toks++;
        }
        if (!loaded[k]) {
            lines_skipped++;
            cJSON_Delete(j);
            continue;
        }
        char label[128];
        snprintf(label, sizeof label, "parity %s line %d", name,
                 cJSON_GetObjectItem(j, "line")->valueint);
        expect_decode(label, toks[k], cJSON_GetObjectItem(j, "ids_nospecial"), 0,
                      cJSON_GetObjectItem(j, "decode")->valuestring, NULL);
        expect_decode(label, toks[k], cJSON_GetObjectItem(j, "ids"), 1,
                      cJSON_GetObjectItem(j, "decode_skip")->valuestring, NULL);
        lines_ok++;
        cJSON_Delete(j);
    }
    int n_loaded = 0;
    for (int k = 0; k < n_toks; k++) {
        n_loaded += loaded[k];
        nopad_tokenizer_free(toks[k]);
    }
    print_message("parity decode: %d tokenizers (%d unsupported, %d lines skipped), %d lines "
                  "equal to HF's, decoded and streamed\n",
                  n_toks, n_toks - n_loaded, lines_skipped, lines_ok);
    free(data);
    assert_true(lines_ok > 0);
}

/* The real SmolLM2-135M-Instruct GGUF (scripts/fetch_default_decoder.sh; NOPAD_SMOLLM2_GGUF):
 * HF's decode of every corpus line (tokenizer/smollm2_gguf_cases.jsonl), whole and streamed. */
static void test_smollm2_gguf(void **state) {
    const char *path = getenv("NOPAD_SMOLLM2_GGUF");
    size_t size;
    char *data = test_read_file(test_data_path("tokenizer/smollm2_gguf_cases.jsonl"), &size);
    nopad_tokenizer *tok = NULL;
    if (!path || !data || nopad_tokenizer_load(path, &tok) != NOPAD_OK) {
        free(data);
        print_message("no SmolLM2 GGUF (NOPAD_SMOLLM2_GGUF; scripts/fetch_default_decoder.sh)\n");
        skip();
    }
    assert_int_equal(nopad_tokenizer_get_kind(tok), NOPAD_TOKENIZER_BPE_BYTE_LEVEL);
    int n = 0;
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n"), n++) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        char label[64];
        snprintf(label, sizeof label, "SmolLM2 line %d", n);
        expect_decode(label, tok, cJSON_GetObjectItem(j, "nospecial"), 0,
                      cJSON_GetObjectItem(j, "decode")->valuestring, NULL);
        expect_decode(label, tok, cJSON_GetObjectItem(j, "ids"), 1,
                      cJSON_GetObjectItem(j, "decode_skip")->valuestring, NULL);
        cJSON_Delete(j);
    }
    assert_true(n > 300);
    free(data);
    nopad_tokenizer_free(tok);
}

/* ---- hand-made cases ------------------------------------------------------------------------ */

static void expect_text(const nopad_tokenizer *tok, const int32_t *ids, size_t n, int skip,
                        const char *want) {
    size_t len;
    char *got = detok(tok, ids, n, skip, &len);
    if (len != strlen(want) || strcmp(got, want) != 0)
        fail_msg("decode: \"%s\", want \"%s\"", got, want);
    free(got);
    assert_int_equal(check_stream("expect_text", tok, ids, n, skip, want, strlen(want)), 0);
}

static int32_t id_of(const nopad_tokenizer *tok, const char *token) {
    int32_t id = nopad_tokenizer_token_to_id(tok, token);
    if (id < 0) fail_msg("no token \"%s\"", token);
    return id;
}

/* The small WordPiece fixture (HF tokenizers 0.23.3 gives these strings): "##" joins, other
 * tokens get a space, the cleanup pulls punctuation in, special tokens stay unless skipped. */
static void test_wordpiece(void **state) {
    nopad_tokenizer *tok = load_json_file("tokenizer/small_tokenizer.json");
    int32_t hello[] = {2, 5, 21, 6, 23, 3}; /* [CLS] hello , world ! [SEP] */
    expect_text(tok, hello, 6, 0, "[CLS] hello, world! [SEP]");
    expect_text(tok, hello, 6, 1, "hello, world!");
    expect_text(tok, hello, 0, 0, "");
    int32_t pieces[] = {id_of(tok, "un"), id_of(tok, "##aff"), id_of(tok, "##able")};
    expect_text(tok, pieces, 3, 0, "unaffable");
    /* a normalized added token reads back normalized (HF 0.23) */
    int32_t added[] = {id_of(tok, "<ent>"), id_of(tok, "New York"), id_of(tok, "[MASK]")};
    expect_text(tok, added, 3, 1, "<ent> new york");
    expect_text(tok, added, 3, 0, "<ent> new york [MASK]");
    assert_int_equal(nopad_tokenizer_get_kind(tok), NOPAD_TOKENIZER_WORDPIECE);
    nopad_tokenizer_free(tok);

    /* vocab.txt: transformers' BERT decoder, WordPiece("##") with cleanup */
    static const char vocab[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n,\nworld\n!\n##s\ni\n'\nm\n";
    assert_nopad_ok(tokenizer_from_vocab_txt(vocab, strlen(vocab), 1, "vocab.txt", &tok));
    int32_t ids[] = {2, 5, 9, 6, 7, 8, 10, 11, 12, 3};
    expect_text(tok, ids, 10, 1, "hellos, world! i ' m"); /* cleanup looks inside one token */
    expect_text(tok, ids, 10, 0, "[CLS] hellos, world! i ' m [SEP]");
    nopad_tokenizer_free(tok);
}

/* CTC with cleanup on ids that begin with the pad token: the first token is left empty before
 * any scratch buffer exists (an offset on a null pointer under clang's UBSan, the seed
 * fuzz/corpus/decode/ctc). The texts are HF tokenizers 0.23's decode of the same file. */
static void test_ctc_pad_first(void **state) {
    nopad_tokenizer *tok = load_json_text(
        "{\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", "
        "\"continuing_subword_prefix\": \"##\", \"max_input_chars_per_word\": 100, "
        "\"vocab\": {\"[UNK]\": 0, \"a\": 1, \"<pad>\": 2, \"|\": 3, \" .\": 4, \"b\": 5}}, "
        "\"decoder\": {\"type\": \"CTC\", \"pad_token\": \"<pad>\", \"word_delimiter_token\": \"|\", "
        "\"cleanup\": true}}");
    int32_t seed[] = {2, 1, 1, 2, 1, 3, 4, 2}, pad[] = {2}, pads[] = {2, 2, 5}, space[] = {2, 3, 1};
    expect_text(tok, seed, 8, 0, "aa .");
    expect_text(tok, pad, 1, 0, "");
    expect_text(tok, pads, 3, 0, "b");
    expect_text(tok, space, 3, 0, " a");
    nopad_tokenizer_free(tok);
}

/* A 4-byte emoji split over four byte-level tokens comes out whole, once; an unfinished one is
 * U+FFFD at the flush; bytes that can no longer form a character come out at once. */
static void test_stream_holds_back_partial_characters(void **state) {
    nopad_tokenizer *tok = load_json_file("tokenizer/bpe_gpt2.json");
    /* GPT-2's characters for F0 9F 98 80 (U+1F600) */
    const int32_t f0 = id_of(tok, "\xC3\xB0"), b9f = id_of(tok, "\xC5\x81"),
                  b98 = id_of(tok, "\xC4\xBA"), b80 = id_of(tok, "\xC4\xA2"),
                  a = id_of(tok, "a");
    nopad_decode_stream *s;
    assert_nopad_ok(nopad_decode_stream_create(tok, 0, &s));
    const char *text;
    size_t len;
    assert_nopad_ok(nopad_decode_stream_step(s, a, &text, &len));
    assert_string_equal(text, "a");
    const int32_t parts[] = {f0, b9f, b98};
    for (int i = 0; i < 3; i++) {
        assert_nopad_ok(nopad_decode_stream_step(s, parts[i], &text, &len));
        assert_int_equal(len, 0);
        assert_string_equal(text, "");
    }
    assert_nopad_ok(nopad_decode_stream_step(s, b80, &text, &len));
    assert_string_equal(text, "\xF0\x9F\x98\x80");
    assert_nopad_ok(nopad_decode_stream_step(s, a, &text, &len));
    assert_string_equal(text, "a");
    /* unfinished at the end: the flush gives U+FFFD, as the whole decode does */
    assert_nopad_ok(nopad_decode_stream_step(s, f0, &text, &len));
    assert_nopad_ok(nopad_decode_stream_step(s, b9f, &text, &len));
    assert_int_equal(len, 0);
    assert_nopad_ok(nopad_decode_stream_flush(s, &text, &len));
    assert_string_equal(text, "\xEF\xBF\xBD");
    /* the stream starts afresh after a flush; F0 then "a": F0 can no longer be completed */
    assert_nopad_ok(nopad_decode_stream_step(s, f0, &text, &len));
    assert_int_equal(len, 0);
    assert_nopad_ok(nopad_decode_stream_step(s, a, &text, &len));
    assert_string_equal(text, "\xEF\xBF\xBD" "a");
    assert_nopad_ok(nopad_decode_stream_flush(s, &text, &len));
    assert_int_equal(len, 0);
    nopad_decode_stream_free(s);
    nopad_tokenizer_free(tok);
}

/* Bytes to text as Rust's from_utf8_lossy: each maximal invalid subpart is one U+FFFD (Python's
 * bytes.decode("utf-8", "replace") agrees; these strings are its output). */
static void test_lossy_bytes(void **state) {
    nopad_tokenizer *tok = load_json_file("tokenizer/bpe_gpt2.json");
    static const struct {
        const char *bytes;
        const char *want;
    } cases[] = {
        {"\xF0\x9F\x98" "a", "\xEF\xBF\xBD" "a"},             /* cut short: one U+FFFD */
        {"\xC3\x28", "\xEF\xBF\xBD("},                         /* bad continuation */
        {"\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD"},              /* lone continuations */
        {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* a surrogate */
        {"\xC0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD"},              /* overlong */
        {"\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* > U+10FFFF */
        {"\xE5\x8F", "\xEF\xBF\xBD"},                          /* unfinished at the end */
        {"\xFF" "b\xE5\x8F\xAB", "\xEF\xBF\xBD" "b\xE5\x8F\xAB"},
    };
    /* GPT-2's bytes_to_unicode: a byte's character is the byte itself when printable Latin-1 */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int32_t ids[8];
        size_t n = 0;
        for (const unsigned char *p = (const unsigned char *)cases[c].bytes; *p; p++) {
            int b = *p;
            int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
            int cp = b;
            if (!printable) { /* the k-th non-printable byte is U+0100 + k */
                int k = 0;
                for (int x = 0; x < b; x++)
                    if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) k++;
                cp = 0x100 + k;
            }
            char u[5] = {0};
            tok_utf8_put((uint32_t)cp, u);
            ids[n++] = id_of(tok, u);
        }
        expect_text(tok, ids, n, 0, cases[c].want);
    }
    nopad_tokenizer_free(tok);
}

/* ByteFallback: a valid run is its text; an invalid one U+FFFD per token; the stream holds a
 * run back until a token ends it (a later byte could still make it all U+FFFD). */
static void test_byte_fallback(void **state) {
    static const char json[] =
        "{\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", "
        "\"continuing_subword_prefix\": \"##\", \"max_input_chars_per_word\": 100, \"vocab\": "
        "{\"[UNK]\": 0, \"<0x61>\": 1, \"<0xE5>\": 2, \"<0x8F>\": 3, \"<0xAB>\": 4, \"\xE2\x96\x81x\": 5, "
        "\"<0x0A>\": 6}}, \"decoder\": {\"type\": \"Sequence\", \"decoders\": ["
        "{\"type\": \"Replace\", \"pattern\": {\"String\": \"\xE2\x96\x81\"}, \"content\": \" \"}, "
        "{\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, "
        "{\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}}";
    nopad_tokenizer *tok = load_json_text(json);
    int32_t valid[] = {5, 1, 2, 3, 4, 5};
    expect_text(tok, valid, 6, 0, "xa\xE5\x8F\xAB x");
    int32_t invalid[] = {5, 1, 2, 5}; /* a, E5: not UTF-8, so both become U+FFFD */
    expect_text(tok, invalid, 4, 0, "x\xEF\xBF\xBD\xEF\xBF\xBD x");
    int32_t newline[] = {5, 6, 5};
    expect_text(tok, newline, 3, 0, "x\n x");
    nopad_decode_stream *s;
    assert_nopad_ok(nopad_decode_stream_create(tok, 0, &s));
    const char *text;
    size_t len;
    assert_nopad_ok(nopad_decode_stream_step(s, 5, &text, &len));
    assert_string_equal(text, "x");
    assert_nopad_ok(nopad_decode_stream_step(s, 1, &text, &len));
    assert_int_equal(len, 0); /* "a" waits: the run is open */
    assert_nopad_ok(nopad_decode_stream_step(s, 2, &text, &len));
    assert_int_equal(len, 0);
    assert_nopad_ok(nopad_decode_stream_step(s, 5, &text, &len));
    assert_string_equal(text, "\xEF\xBF\xBD\xEF\xBF\xBD x");
    nopad_decode_stream_free(s);
    assert_int_equal(nopad_tokenizer_get_kind(tok), NOPAD_TOKENIZER_WORDPIECE);
    nopad_tokenizer_free(tok);
}

/* A long stream costs O(1) a token: the window stays a few ids long (1M ids in well under the
 * test's time; quadratic work would take minutes). */
static void test_long_stream(void **state) {
    nopad_tokenizer *tok = load_json_file("tokenizer/bpe_roberta.json");
    enum { N = 6 * 166667 };
    const int32_t cycle[] = {id_of(tok, "\xC4\xA0" "th"), id_of(tok, "\xC3\xB0"),
                             id_of(tok, "\xC5\x81"), id_of(tok, "\xC4\xBA"),
                             id_of(tok, "\xC4\xA2"), id_of(tok, ",")};
    nopad_decode_stream *s;
    assert_nopad_ok(nopad_decode_stream_create(tok, 0, &s));
    size_t total = 0;
    clock_t t0 = clock();
    for (int i = 0; i < N; i++) {
        const char *text;
        size_t len;
        assert_nopad_ok(nopad_decode_stream_step(s, cycle[i % 6], &text, &len));
        total += len;
    }
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    assert_int_equal(total, (size_t)N / 6 * strlen(" th\xF0\x9F\x98\x80,"));
    print_message("stream: %d ids in %.2f s\n", N, secs);
    assert_true(secs < 20);
    nopad_decode_stream_free(s);
    nopad_tokenizer_free(tok);
}

/* ---- errors --------------------------------------------------------------------------------- */

static void test_bad_ids_and_buffers(void **state) {
    nopad_tokenizer *tok = load_json_file("tokenizer/bpe_roberta.json");
    const int32_t V = nopad_tokenizer_vocab_size(tok);
    char buf[64];
    size_t len = 99;
    int32_t bad[] = {0, V};
    assert_nopad_error(nopad_detokenize(tok, bad, 2, 0, buf, sizeof buf, &len),
                       NOPAD_ERR_INVALID_ARGUMENT, "outside the vocabulary");
    char want[96];
    snprintf(want, sizeof want, "id %d at position 1", (int)V);
    assert_nopad_error(nopad_detokenize(tok, bad, 2, 0, buf, sizeof buf, &len),
                       NOPAD_ERR_INVALID_ARGUMENT, want);
    assert_int_equal(len, 0);
    int32_t neg[] = {-1};
    assert_nopad_error(nopad_detokenize(tok, neg, 1, 0, buf, sizeof buf, &len),
                       NOPAD_ERR_INVALID_ARGUMENT, "id -1");
    snprintf(want, sizeof want, "(%d ids, 0 to %d)", (int)V, (int)V - 1);
    assert_nopad_error(nopad_detokenize(tok, neg, 1, 0, buf, sizeof buf, &len),
                       NOPAD_ERR_INVALID_ARGUMENT, want);
    assert_nopad_error(nopad_detokenize(NULL, neg, 1, 0, buf, sizeof buf, &len),
                       NOPAD_ERR_INVALID_ARGUMENT, "need a tokenizer");
    assert_nopad_error(nopad_detokenize(tok, NULL, 1, 0, buf, sizeof buf, &len),
                       NOPAD_ERR_INVALID_ARGUMENT, "need a tokenizer");
    assert_nopad_error(nopad_detokenize(tok, neg, 0, 0, NULL, 4, &len),
                       NOPAD_ERR_INVALID_ARGUMENT, "capacity 4");

    /* sizes: the text needs its length + 1 for the NUL */
    int32_t hi[] = {id_of(tok, "h"), id_of(tok, "i")};
    assert_nopad_error(nopad_detokenize(tok, hi, 2, 0, NULL, 0, &len), NOPAD_ERR_BUFFER_TOO_SMALL,
                       "do not fit");
    assert_int_equal(len, 2);
    assert_nopad_error(nopad_detokenize(tok, hi, 2, 0, buf, 2, &len), NOPAD_ERR_BUFFER_TOO_SMALL,
                       "capacity 2");
    assert_int_equal(len, 2);
    assert_nopad_ok(nopad_detokenize(tok, hi, 2, 0, buf, 3, &len));
    assert_string_equal(buf, "hi");
    assert_nopad_ok(nopad_detokenize(tok, hi, 0, 0, buf, 1, &len));
    assert_int_equal(len, 0);
    assert_string_equal(buf, "");

    /* the stream refuses a bad id and carries on as before */
    nopad_decode_stream *s;
    assert_nopad_ok(nopad_decode_stream_create(tok, 0, &s));
    const char *text;
    assert_nopad_ok(nopad_decode_stream_step(s, hi[0], &text, &len));
    assert_nopad_error(nopad_decode_stream_step(s, V, &text, &len), NOPAD_ERR_INVALID_ARGUMENT,
                       "outside the vocabulary");
    assert_int_equal(len, 0);
    assert_string_equal(text, "");
    assert_nopad_ok(nopad_decode_stream_step(s, hi[1], &text, &len));
    assert_string_equal(text, "i");
    assert_nopad_error(nopad_decode_stream_step(NULL, 1, &text, &len), NOPAD_ERR_INVALID_ARGUMENT,
                       "need a stream");
    assert_nopad_error(nopad_decode_stream_flush(s, NULL, &len), NOPAD_ERR_INVALID_ARGUMENT,
                       "need a stream");
    nopad_decode_stream_free(s);
    nopad_decode_stream_free(NULL);
    assert_nopad_error(nopad_decode_stream_create(tok, 0, NULL), NOPAD_ERR_INVALID_ARGUMENT,
                       "out is NULL");
    assert_nopad_error(nopad_decode_stream_create(NULL, 0, &s), NOPAD_ERR_INVALID_ARGUMENT,
                       "need a tokenizer");
    assert_null(s);
    nopad_tokenizer_free(tok);
}

/* The tokenizer.json of a one-word WordPiece vocab with the given "decoder" value. */
static char *with_decoder(const char *decoder) {
    static const char fmt[] =
        "{\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", "
        "\"continuing_subword_prefix\": \"##\", \"max_input_chars_per_word\": 100, "
        "\"vocab\": {\"[UNK]\": 0, \"hi\": 1}}, \"decoder\": %s}";
    char *json = malloc(sizeof fmt + strlen(decoder));
    sprintf(json, fmt, decoder);
    return json;
}

/* A decoder nopad lacks leaves the tokenizer usable for encoding; decoding names it. Malformed
 * decoders fail the load. */
static void test_unsupported_and_malformed_decoders(void **state) {
    static const struct {
        const char *decoder, *needle;
    } unsupported[] = {
        {"{\"type\": \"Nope\"}", "decoder type \"Nope\" is not supported"},
        {"{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": \"Foo\"}]}",
         "decoder.decoders[1] type \"Foo\""},
        {"{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"a+\"}, \"content\": \"b\"}",
         "decoder.pattern {\"Regex\": ...}"},
    };
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
        char *json = with_decoder(unsupported[i].decoder);
        nopad_tokenizer *tok = load_json_text(json);
        int32_t ids[4], n = 0;
        assert_nopad_ok(nopad_tokenize(tok, "hi", 2, NULL, ids, 4, &n));
        assert_int_equal(n, 1);
        char buf[16];
        size_t len;
        assert_nopad_error(nopad_detokenize(tok, ids, 1, 0, buf, sizeof buf, &len),
                           NOPAD_ERR_UNSUPPORTED, unsupported[i].needle);
        nopad_decode_stream *s;
        assert_nopad_error(nopad_decode_stream_create(tok, 0, &s), NOPAD_ERR_UNSUPPORTED,
                           unsupported[i].needle);
        nopad_tokenizer_free(tok);
        free(json);
    }
    static const struct {
        const char *decoder, *needle;
    } malformed[] = {
        {"5", "decoder must be an object or null"},
        {"{\"kind\": \"WordPiece\"}", "decoder.type must be a string"},
        {"{\"type\": \"Sequence\"}", "decoder.decoders must be an array"},
        {"{\"type\": \"Sequence\", \"decoders\": [7]}", "decoder.decoders[0] must be an object"},
        {"{\"type\": \"Metaspace\", \"replacement\": \"ab\"}", "must be one character"},
        {"{\"type\": \"Metaspace\", \"prepend_scheme\": \"sometimes\"}", "not always, first or never"},
        {"{\"type\": \"WordPiece\", \"cleanup\": \"yes\"}", "decoder.cleanup must be true or false"},
        {"{\"type\": \"Strip\", \"start\": -1}", "decoder.start must be a whole number"},
        {"{\"type\": \"Replace\", \"pattern\": \"a\", \"content\": \"b\"}", "decoder.pattern must be"},
        {"{\"type\": \"BPEDecoder\", \"suffix\": 3}", "decoder.suffix must be a string"},
    };
    for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
        char *json = with_decoder(malformed[i].decoder);
        nopad_tokenizer *tok = (nopad_tokenizer *)0x1;
        assert_nopad_error(tokenizer_from_json(json, strlen(json), "t.json", &tok),
                           NOPAD_ERR_FORMAT, malformed[i].needle);
        assert_null(tok);
        free(json);
    }
    /* no decoder (absent or null): tokens joined by spaces */
    char *json = with_decoder("null");
    nopad_tokenizer *tok = load_json_text(json);
    int32_t ids[] = {1, 0, 1};
    expect_text(tok, ids, 3, 0, "hi [UNK] hi");
    nopad_tokenizer_free(tok);
    free(json);
}

/* id -> token as HF's id_to_token: the vocab's spelling, added tokens (normalized ones in their
 * normalized form), NULL out of range. */
static void test_id_to_token(void **state) {
    nopad_tokenizer *tok = load_json_file("tokenizer/small_tokenizer.json");
    static const char *const tokens[] = {"[CLS]", "##aff", "un", "<ent>", "[MASK]"};
    for (size_t i = 0; i < 5; i++) {
        size_t len = 0;
        const char *s = nopad_tokenizer_id_to_token(tok, id_of(tok, tokens[i]), &len);
        assert_non_null(s);
        assert_string_equal(s, tokens[i]);
        assert_int_equal(len, strlen(tokens[i]));
    }
    assert_string_equal(nopad_tokenizer_id_to_token(tok, id_of(tok, "New York"), NULL), "new york");
    size_t len = 7;
    assert_null(nopad_tokenizer_id_to_token(tok, -1, &len));
    assert_int_equal(len, 0);
    assert_null(nopad_tokenizer_id_to_token(tok, nopad_tokenizer_vocab_size(tok), NULL));
    assert_null(nopad_tokenizer_id_to_token(NULL, 0, NULL));
    nopad_tokenizer_free(tok);
}

/* nopad_tokenizer_token_bytes: over a text's ids, the bytes join into the text itself (byte-level
 * BPE, where ids split characters too, and SentencePiece BPE with its byte fallback); a special
 * token has none; the errors. */
static void token_bytes_rejoin(nopad_tokenizer *tok, const char *text, int specials, int stripped_space) {
    int32_t ids[512], n = 0;
    nopad_tokenize_params tp = nopad_tokenize_default_params();
    tp.add_special_tokens = specials;
    assert_nopad_ok(nopad_tokenize(tok, text, strlen(text), &tp, ids, 512, &n));
    char joined[2048];
    size_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t len = 0;
        assert_nopad_ok(nopad_tokenizer_token_bytes(tok, ids[i], (uint8_t *)joined + at, sizeof joined - at, &len));
        at += len;
    }
    joined[at] = '\0';
    /* SentencePiece's decoder strips the text's first space, which its first token does carry */
    char decoded[2048] = " ";
    size_t dlen = 0;
    assert_nopad_ok(nopad_detokenize(tok, ids, (size_t)n, 1, decoded + stripped_space, sizeof decoded - 1, &dlen));
    dlen += (size_t)stripped_space;
    assert_int_equal(at, dlen);
    assert_memory_equal(joined, decoded, dlen);
}

static void test_token_bytes(void **state) {
    /* characters of 1-4 bytes, split across ids by byte-level BPE's small vocabulary */
    static const char text[] = "Caf\xC3\xA9 \xE2\x82\xAC" "5 \xF0\x9F\x98\x80 na\xC3\xAF" "ve, x  y\n";
    nopad_tokenizer *gpt2 = load_json_file("tokenizer/bpe_gpt2.json");
    token_bytes_rejoin(gpt2, text, 0, 0);
    size_t len = 0;
    uint8_t one[1];
    int32_t ids[64], n = 0;
    assert_nopad_ok(nopad_tokenize(gpt2, "\xE2\x82\xAC", 3, NULL, ids, 64, &n));
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        assert_nopad_ok(nopad_tokenizer_token_bytes(gpt2, ids[i], NULL, 0, &len)); /* a measure */
        total += len;
    }
    assert_int_equal(total, 3);
    /* too small a buffer: the length and an error; out of the vocabulary */
    assert_int_equal(nopad_tokenizer_token_bytes(gpt2, id_of(gpt2, "Ġword"), one, 1, &len), NOPAD_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(len, 5); /* " word" */
    assert_int_equal(nopad_tokenizer_token_bytes(gpt2, -1, one, 1, &len), NOPAD_ERR_INVALID_ARGUMENT);
    assert_int_equal(nopad_tokenizer_token_bytes(gpt2, nopad_tokenizer_vocab_size(gpt2), one, 1, &len),
                     NOPAD_ERR_INVALID_ARGUMENT);
    nopad_tokenizer_free(gpt2);
    /* SentencePiece BPE (LLaMA-2's, when the parity files are there): "▁" spaces, <0xNN> bytes,
     * the BOS a special token of no bytes */
    size_t flen;
    char *data = test_read_file(test_data_path("tokenizer/parity/spbpe_llama2.json"), &flen);
    if (data) {
        nopad_tokenizer *sp = NULL;
        assert_nopad_ok(tokenizer_from_json(data, flen, "spbpe_llama2.json", &sp));
        free(data);
        /* "€" and "😀" are tokens of their own here, and so are lone "▁"s (spaces, not special tokens) */
        token_bytes_rejoin(sp, "Hello \xE2\x82\xAC world \xF0\x9F\x98\x80", 1, 1);
        assert_nopad_ok(nopad_tokenizer_token_bytes(sp, id_of(sp, "<s>"), one, 1, &len));
        assert_int_equal(len, 0);
        nopad_tokenizer_free(sp);
    }
    /* WordPiece: a token's spacing depends on its neighbours */
    nopad_tokenizer *wp = load_json_file("tokenizer/small_tokenizer.json");
    assert_int_equal(nopad_tokenizer_token_bytes(wp, id_of(wp, "un"), one, 1, &len), NOPAD_ERR_UNSUPPORTED);
    nopad_tokenizer_free(wp);
}

static void test_kinds(void **state) {
    assert_string_equal(nopad_tokenizer_kind_name(NOPAD_TOKENIZER_WORDPIECE), "wordpiece");
    assert_string_equal(nopad_tokenizer_kind_name(NOPAD_TOKENIZER_BPE_BYTE_LEVEL), "bpe-byte-level");
    assert_string_equal(nopad_tokenizer_kind_name(NOPAD_TOKENIZER_BPE_SENTENCEPIECE),
                        "bpe-sentencepiece");
    assert_string_equal(nopad_tokenizer_kind_name(NOPAD_TOKENIZER_UNIGRAM), "unigram");
    assert_string_equal(nopad_tokenizer_kind_name(NOPAD_TOKENIZER_BPE), "bpe");
    assert_string_equal(nopad_tokenizer_kind_name((nopad_tokenizer_kind)99), "unknown");
    static const struct {
        const char *file;
        nopad_tokenizer_kind kind;
    } files[] = {
        {"tokenizer/small_tokenizer.json", NOPAD_TOKENIZER_WORDPIECE},
        {"tokenizer/bpe_roberta.json", NOPAD_TOKENIZER_BPE_BYTE_LEVEL},
        {"tokenizer/bpe_gpt2.json", NOPAD_TOKENIZER_BPE_BYTE_LEVEL},
        {"tokenizer/parity/bpe_llama3.json", NOPAD_TOKENIZER_BPE_BYTE_LEVEL},
        {"tokenizer/parity/spbpe_llama2.json", NOPAD_TOKENIZER_BPE_SENTENCEPIECE},
        {"tokenizer/parity/unigram_xlmr.json", NOPAD_TOKENIZER_UNIGRAM},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        size_t len;
        char *data = test_read_file(test_data_path(files[i].file), &len);
        if (!data) continue; /* the parity files may not be there */
        nopad_tokenizer *tok = NULL;
        nopad_status st = tokenizer_from_json(data, len, files[i].file, &tok);
        free(data);
        if (st == NOPAD_ERR_UNSUPPORTED) continue;
        assert_nopad_ok(st);
        if (nopad_tokenizer_get_kind(tok) != files[i].kind)
            fail_msg("%s: kind %s, want %s", files[i].file,
                     nopad_tokenizer_kind_name(nopad_tokenizer_get_kind(tok)),
                     nopad_tokenizer_kind_name(files[i].kind));
        nopad_tokenizer_free(tok);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decoders_match_hf),
        cmocka_unit_test(test_byte_level_bpe_matches_hf),
        cmocka_unit_test(test_parity_fixtures),
        cmocka_unit_test(test_smollm2_gguf),
        cmocka_unit_test(test_wordpiece),
        cmocka_unit_test(test_ctc_pad_first),
        cmocka_unit_test(test_stream_holds_back_partial_characters),
        cmocka_unit_test(test_lossy_bytes),
        cmocka_unit_test(test_byte_fallback),
        cmocka_unit_test(test_long_stream),
        cmocka_unit_test(test_bad_ids_and_buffers),
        cmocka_unit_test(test_unsupported_and_malformed_decoders),
        cmocka_unit_test(test_id_to_token),
        cmocka_unit_test(test_token_bytes),
        cmocka_unit_test(test_kinds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

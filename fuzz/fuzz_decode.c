/* libFuzzer target: decoding (nopad_detokenize and the decode stream) on arbitrary ids, and the
 * decoder part of tokenizer.json on arbitrary bytes.
 *
 * The first byte picks what the rest is: (b % 10) 0..8 = ids (two bytes each) for a fixed
 * tokenizer with one of nine decoders (ByteLevel; LLaMA-2's Replace, ByteFallback, Fuse, Strip;
 * WordPiece; Metaspace; ByteFallback + Metaspace "first"; BPEDecoder; CTC; none; Fuse then
 * Strip, which cannot be streamed), 9 = a tokenizer.json whose ids 0.. are then decoded; b / 10
 * picks skip_special_tokens. Beyond "no crash, no leak" it checks the promises: ids in range
 * decode, others are refused; the text is valid UTF-8; a capacity-0 call reports the size a real
 * call then fills; every stream chunk is valid UTF-8 and the chunks plus the flush equal the
 * decode. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_internal.h"

/* Tokens that hit every decoder's rules: GPT-2 byte characters that split UTF-8 characters,
 * <0xNN> runs valid and not, "▁" at token starts and inside, "##", cleanup patterns, BPE
 * suffixes, CTC pads and delimiters, an empty token. */
static const char vocab[] =
    "\"[UNK]\": 0, \"a\": 1, \"##b\": 2, \"\xe2\x96\x81\": 3, \"\xe2\x96\x81" "a\": 4, "
    "\"b\xe2\x96\x81" "c\": 5, \" .\": 6, \"do\": 7, \" do not\": 8, \"n't\": 9, \"'\": 10, "
    "\"<0x41>\": 11, \"<0x0A>\": 12, \"<0xE5>\": 13, \"<0x8F>\": 14, \"<0xAB>\": 15, "
    "\"<0xF0>\": 16, \"<0x9F>\": 17, \"<0xFF>\": 18, \"<0x+F>\": 19, \"\xc4\xa0hello\": 20, "
    "\"\xc3\xb0\": 21, \"\xc5\x81\": 22, \"\xc4\xba\": 23, \"\xc4\xa2\": 24, \"\xc3\xa5\": 25, "
    "\"x</w>\": 26, \"y</w>z</w>\": 27, \"<pad>\": 28, \"|\": 29, \"\xe6\xbc\xa2\": 30, "
    "\"  \": 31, \"\": 32, \"\xef\xbf\xbd\": 33, \"\xc3\x83\": 34, \"\xc4\xa3\xc3\x83\": 35";
enum { VOCAB = 36, ADDED = 2 }; /* + [CLS] (special) and <x> */

static const char *const decoders[] = {
    "{\"type\": \"ByteLevel\"}",
    "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": "
    "\"\xe2\x96\x81\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, "
    "{\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}",
    "{\"type\": \"WordPiece\", \"prefix\": \"##\", \"cleanup\": true}",
    "{\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", \"prepend_scheme\": \"always\"}",
    "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}, {\"type\": "
    "\"Metaspace\", \"replacement\": \"\xe2\x96\x81\", \"prepend_scheme\": \"first\"}]}",
    "{\"type\": \"BPEDecoder\", \"suffix\": \"</w>\"}",
    "{\"type\": \"CTC\", \"pad_token\": \"<pad>\", \"word_delimiter_token\": \"|\", "
    "\"cleanup\": true}",
    "null",
    "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": \"Strip\", "
    "\"content\": \" \", \"start\": 3, \"stop\": 2}]}",
};
enum { N_DECODERS = sizeof decoders / sizeof decoders[0] };

static nopad_tokenizer *fixed[N_DECODERS];

static nopad_tokenizer *fixed_tokenizer(int k) {
    if (fixed[k]) return fixed[k];
    char json[4096];
    snprintf(json, sizeof json,
             "{\"added_tokens\": [{\"id\": %d, \"content\": \"[CLS]\", \"special\": true}, "
             "{\"id\": %d, \"content\": \"<x>\", \"special\": false}], "
             "\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", "
             "\"continuing_subword_prefix\": \"##\", \"max_input_chars_per_word\": 100, "
             "\"vocab\": {%s}}, \"decoder\": %s}",
             VOCAB, VOCAB + 1, vocab, decoders[k]);
    if (tokenizer_from_json(json, strlen(json), "fuzz", &fixed[k]) != NOPAD_OK) abort();
    return fixed[k];
}

static void check_decode(const nopad_tokenizer *tok, const int32_t *ids, size_t n, int skip) {
    const int32_t V = nopad_tokenizer_vocab_size(tok);
    int in_range = 1;
    for (size_t i = 0; i < n; i++) in_range &= ids[i] >= 0 && ids[i] < V;
    size_t need = 0;
    nopad_status st = nopad_detokenize(tok, ids, n, skip, NULL, 0, &need);
    if (st == NOPAD_ERR_UNSUPPORTED) return; /* a decoder nopad lacks (tokenizer.json mode) */
    if (!in_range) {
        if (st != NOPAD_ERR_INVALID_ARGUMENT) abort();
        return;
    }
    if (st != NOPAD_ERR_BUFFER_TOO_SMALL) abort(); /* the NUL never fits in capacity 0 */
    char *text = malloc(need + 1);
    size_t len = 0;
    if (!text) return;
    if (nopad_detokenize(tok, ids, n, skip, text, need + 1, &len) != NOPAD_OK || len != need ||
        text[len] != '\0' || tok_utf8_check(text, len) != len)
        abort();
    nopad_decode_stream *s = NULL;
    st = nopad_decode_stream_create(tok, skip, &s);
    if (st == NOPAD_OK) {
        size_t got = 0;
        for (size_t i = 0; i <= n; i++) {
            const char *chunk;
            size_t k;
            st = i < n ? nopad_decode_stream_step(s, ids[i], &chunk, &k)
                       : nopad_decode_stream_flush(s, &chunk, &k);
            if (st != NOPAD_OK || tok_utf8_check(chunk, k) != k || got + k > len ||
                memcmp(text + got, chunk, k) != 0)
                abort();
            got += k;
        }
        if (got != len) abort();
        nopad_decode_stream_free(s);
    } else if (st != NOPAD_ERR_UNSUPPORTED) {
        abort();
    }
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int mode = data[0] % 10, skip = (data[0] / 10) & 1;
    data++;
    size--;
    if (mode < N_DECODERS) {
        const nopad_tokenizer *tok = fixed_tokenizer(mode);
        const int32_t V = nopad_tokenizer_vocab_size(tok);
        size_t n = size / 2;
        if (n > 256) n = 256;
        int32_t ids[256];
        for (size_t i = 0; i < n; i++) {
            int v = data[2 * i] | (data[2 * i + 1] << 8);
            /* mostly in range; 0xFFxx are the out-of-range ids, some negative */
            ids[i] = (v >> 8) == 0xFF ? (int32_t)(v & 0x7F) - 64 + ((v & 0x80) ? V + 64 : 0)
                                      : (int32_t)(v % V);
        }
        check_decode(tok, ids, n, skip);
        return 0;
    }
    nopad_tokenizer *tok = NULL;
    if (tokenizer_from_json((const char *)data, size, "fuzz", &tok) != NOPAD_OK) return 0;
    const int32_t V = nopad_tokenizer_vocab_size(tok);
    int32_t ids[64];
    size_t n = 0;
    for (int32_t i = 0; i < V && n < 64; i++) ids[n++] = i;
    check_decode(tok, ids, n, skip);
    nopad_tokenizer_free(tok);
    return 0;
}

/* libFuzzer target: grammars from JSON schemas, regexes and choices (src/grammar/), then text
 * through the matcher and masks over a small vocabulary.
 *
 * Input: a mode byte (0 schema, 1 regex, 2 choices split at '\n', 3 any JSON object, 4 a JSON
 * sequence: schemas split at 0x1E, between "<", "," and ">", 1 to (mode byte / 5) % 4 values or,
 * when that is 0, any number), the grammar's source up to the first NUL, then the text.
 * Invariants: a refused byte leaves the state as it was; a restore returns to the saved state;
 * every token a mask allows is accepted by the matcher and every refused one is not; EOS is
 * allowed exactly when accepting. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "grammar/grammar.h"

/* A fixed vocabulary of JSON-ish pieces: one byte each of the usual alphabet and some longer
 * tokens, one special token (length 0), EOS last. */
static const char *const VOCAB[] = {
    "{", "}", "[", "]", "\"", ":", ",", " ", "\n", "-", ".", "0", "1", "9", "e", "a", "b", "z", "t",
    "r", "u", "f", "l", "s", "n", "\\", "\xC3\xA9", "\xE2", "\x82", "\xAC", "\":", "\",", "{\"", "null",
    "true", "false", "\": \"", "12", "ab", "\"a\"", "}]", "x", "-1", "\"}", "", "<eos>",
};
#define N_VOCAB ((int32_t)(sizeof(VOCAB) / sizeof(VOCAB[0])))

static grammar_token_trie *vocab_trie(void) {
    static grammar_token_trie *trie;
    if (!trie) {
        const uint8_t *ptrs[N_VOCAB];
        uint32_t lens[N_VOCAB];
        for (int32_t i = 0; i < N_VOCAB; i++) {
            ptrs[i] = (const uint8_t *)VOCAB[i];
            lens[i] = i == N_VOCAB - 1 ? 0 : (uint32_t)strlen(VOCAB[i]);
        }
        int32_t eos = N_VOCAB - 1;
        if (grammar_token_trie_create(ptrs, lens, N_VOCAB, &eos, 1, &trie) != NOPAD_OK) __builtin_trap();
    }
    return trie;
}

static void check_mask(grammar_matcher *m, const grammar_token_trie *trie) {
    uint32_t mask[(N_VOCAB + 31) / 32];
    int32_t allowed = grammar_token_mask(trie, m, mask);
    int32_t count = 0;
    for (int32_t t = 0; t < N_VOCAB; t++) {
        int bit = (mask[t >> 5] >> (t & 31)) & 1;
        count += bit;
        grammar_mark mark = grammar_matcher_save(m);
        int alive = grammar_matcher_accept_token(m, trie, t);
        grammar_matcher_restore(m, mark);
        if (bit != alive) __builtin_trap();
    }
    if (count != allowed) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int mode = data[0] % 5, max_count = (data[0] / 5) % 4;
    data++;
    size--;
    const uint8_t *nul = memchr(data, 0, size);
    size_t src_len = nul ? (size_t)(nul - data) : size;
    const uint8_t *text = nul ? nul + 1 : data + size;
    size_t text_len = nul ? size - src_len - 1 : 0;
    if (text_len > 2048) text_len = 2048; /* bounded time a run */

    grammar *g = NULL;
    nopad_status st;
    if (mode == 0) {
        st = grammar_from_json_schema((const char *)data, src_len, &g);
    } else if (mode == 1) {
        st = grammar_from_regex((const char *)data, src_len, &g);
    } else if (mode == 2) {
        const char *choices[64];
        size_t lens[64], n = 0, start = 0;
        for (size_t i = 0; i <= src_len && n < 64; i++) {
            if (i == src_len || data[i] == '\n') {
                choices[n] = (const char *)data + start;
                lens[n++] = i - start;
                start = i + 1;
            }
        }
        st = grammar_from_choices(choices, lens, n, &g);
    } else if (mode == 3) {
        st = grammar_any_json_object(&g);
    } else {
        const char *schemas[16];
        size_t lens[16], n = 0, start = 0;
        for (size_t i = 0; i <= src_len && n < 16; i++) {
            if (i == src_len || data[i] == 0x1E) {
                schemas[n] = (const char *)data + start;
                lens[n++] = i - start;
                start = i + 1;
            }
        }
        st = grammar_from_json_sequence(schemas, lens, n, "<", ",", ">", 1, max_count ? max_count : -1, &g);
    }
    if (st != NOPAD_OK) {
        if (g) __builtin_trap();
        return 0;
    }
    grammar_matcher *m = NULL;
    if (grammar_matcher_create(g, &m) != NOPAD_OK) __builtin_trap();
    const grammar_token_trie *trie = vocab_trie();
    check_mask(m, trie);
    for (size_t i = 0; i < text_len; i++) {
        int accepting = grammar_matcher_is_accepting(m), more = grammar_matcher_can_continue(m);
        grammar_mark mark = grammar_matcher_save(m);
        if (!grammar_matcher_accept(m, text[i])) {
            /* refused: nothing changed */
            if (grammar_matcher_is_accepting(m) != accepting || grammar_matcher_can_continue(m) != more)
                __builtin_trap();
            continue;
        }
        if (i % 7 == 0) { /* a rollback and the same byte again */
            grammar_matcher_restore(m, mark);
            if (grammar_matcher_is_accepting(m) != accepting) __builtin_trap();
            if (!grammar_matcher_accept(m, text[i])) __builtin_trap();
        }
        if (i % 64 == 0) {
            check_mask(m, trie);
            if (grammar_matcher_commit(m) != NOPAD_OK) __builtin_trap();
        }
    }
    check_mask(m, trie);
    grammar_matcher_free(m);
    grammar_free(g);
    return 0;
}

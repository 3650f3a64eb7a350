/* libFuzzer target: nopad serve's request-body parser (tools/serve/openai.c) and the chat
 * templates it feeds. The first byte picks the route (below 0xf0: % 4 gives completions, chat,
 * /v1/embeddings, /embed; 0xf0 and up: /predict or /rerank by its low bit), the rest is the body. Any input parses or is refused with a 400-class error and a message; a
 * parsed request holds what the server relies on: its values in range, its texts UTF-8, and no
 * NUL in its body (cJSON would have cut a string there). */
#include <ctype.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "openai.h"

static void check_utf8(const char *text);

/* An error's message goes back as JSON: it must be UTF-8 even where it quotes a cut text. */
static void check_error(const api_error *e) {
    if (e->status < 400 || e->status > 500 || !e->message[0] || !e->type) __builtin_trap();
    check_utf8(e->message);
}

/* A text the server passes on must be UTF-8 as the tokenizers check it (no overlong forms, no
 * surrogates, nothing above U+10FFFF): else a 400 naming the field, not the tokenizer's error. */
static void check_utf8(const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    if (!s) return;
    while (*s) {
        int need = *s < 0x80 ? 0 : *s >= 0xC2 && *s <= 0xDF ? 1 : *s >= 0xE0 && *s <= 0xEF ? 2
                 : *s >= 0xF0 && *s <= 0xF4 ? 3 : -1;
        if (need < 0) __builtin_trap();
        const unsigned cp0 = need == 0 ? *s : *s & (0x3Fu >> need);
        unsigned cp = cp0;
        for (int k = 1; k <= need; k++) {
            if ((s[k] & 0xC0) != 0x80) __builtin_trap();
            cp = cp << 6 | (s[k] & 0x3F);
        }
        static const unsigned least[] = {0, 0x80, 0x800, 0x10000};
        if (cp < least[need] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) __builtin_trap();
        s += need + 1;
    }
}

/* cJSON ends a string at a NUL, so a body it took must hold none: no raw NUL byte, and no \u
 * escape (a "u" after an odd run of backslashes) that is 0000 or has a non-hex digit, which cJSON
 * reads as a NUL too. */
static void check_no_nul(const char *body, size_t len) {
    if (memchr(body, 0, len)) __builtin_trap();
    for (size_t i = 1; i < len; i++) {
        if (body[i] != 'u') continue;
        size_t slashes = 0;
        while (slashes < i && body[i - 1 - slashes] == '\\') slashes++;
        if (slashes % 2 == 0) continue;
        if (i + 5 > len || memcmp(body + i + 1, "0000", 4) == 0) __builtin_trap();
        for (int k = 1; k <= 4; k++)
            if (!isxdigit((unsigned char)body[i + k])) __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int route = data[0] < 0xf0 ? data[0] % 4 : 4 + (data[0] & 1);
    const char *body = (const char *)data + 1;
    const size_t len = size - 1;
    api_error e;
    if (route < 2) {
        gen_request r;
        if (openai_parse_generation(body, len, route == 0 ? GEN_COMPLETION : GEN_CHAT, &r, &e)) {
            check_error(&e);
            return 0;
        }
        if (r.max_tokens == 0 || r.max_tokens < -1 || r.min_tokens < 0 || r.top_k < 0) __builtin_trap();
        if (!(r.temperature >= 0) || !(r.top_p > 0 && r.top_p <= 1) || !(r.min_p >= 0 && r.min_p < 1) ||
            !(r.repetition_penalty > 0) || !(r.presence_penalty >= -2 && r.presence_penalty <= 2) ||
            !(r.frequency_penalty >= -2 && r.frequency_penalty <= 2))
            __builtin_trap();
        /* what the engine refuses must not get past the parser: logit_bias ids distinct and >= 0,
         * biases in [-100, 100]; top_logprobs in range and only with logprobs */
        if (r.n_logit_bias < 0 || r.n_logit_bias > NOPAD_MAX_LOGIT_BIAS || (r.n_logit_bias && !r.logit_bias))
            __builtin_trap();
        for (int32_t i = 0; i < r.n_logit_bias; i++) {
            if (r.logit_bias[i].id < 0 || !(r.logit_bias[i].bias >= -100 && r.logit_bias[i].bias <= 100))
                __builtin_trap();
            for (int32_t k = 0; k < i; k++)
                if (r.logit_bias[k].id == r.logit_bias[i].id) __builtin_trap();
        }
        if (r.top_logprobs < 0 || r.top_logprobs > NOPAD_MAX_TOP_LOGPROBS || (r.top_logprobs && !r.logprobs))
            __builtin_trap();
        check_no_nul(body, len);
        check_utf8(r.prompt);
        for (int32_t i = 0; i < r.n_stops; i++) {
            if (!r.stops[i] || !r.stops[i][0]) __builtin_trap();
            check_utf8(r.stops[i]);
        }
        for (int i = 0; i < r.n_messages; i++) check_utf8(r.messages[i].content);
        if (route == 0) {
            if (!r.prompt == !r.prompt_ids) __builtin_trap();
            if (r.prompt_ids && r.n_prompt_ids < 1) __builtin_trap();
        } else {
            if (r.n_messages < 1) __builtin_trap();
            for (int f = 0; f < CHAT_N_FAMILIES; f++) {
                chat_template t = {.family = (chat_family)f};
                size_t n = 0;
                char *prompt = chat_template_apply(&t, r.messages, r.n_messages, &n);
                if (!prompt || strlen(prompt) != n) __builtin_trap();
                free(prompt);
            }
        }
        gen_request_free(&r);
    } else if (route >= 4) {
        classify_request r;
        if (openai_parse_classify(body, len, route == 5, &r, &e)) {
            check_error(&e);
            return 0;
        }
        if (r.n_inputs < 1 || r.n_inputs > EMBED_MAX_INPUTS) __builtin_trap();
        check_no_nul(body, len);
        for (int i = 0; i < r.n_inputs; i++) {
            if (!r.a[i] || !r.a[i][0] || (r.b[i] && !r.b[i][0]) || (r.rerank && !r.b[i])) __builtin_trap();
            check_utf8(r.a[i]);
            check_utf8(r.b[i]);
        }
        classify_request_free(&r);
    } else {
        embed_request r;
        if (openai_parse_embeddings(body, len, route == 3, &r, &e)) {
            check_error(&e);
            return 0;
        }
        if (r.n_inputs < 1 || r.n_inputs > EMBED_MAX_INPUTS || r.dimensions < 0) __builtin_trap();
        check_no_nul(body, len);
        for (int i = 0; i < r.n_inputs; i++) {
            if (r.texts ? !r.texts[i] || !r.texts[i][0] : r.n_ids[i] < 1) __builtin_trap();
            if (r.texts) check_utf8(r.texts[i]);
        }
        embed_request_free(&r);
    }
    /* template detection on arbitrary text never fails but by returning -1 */
    char *text = malloc(len + 1);
    if (text) {
        memcpy(text, body, len);
        text[len] = '\0';
        chat_template t;
        if (chat_template_detect(text, &t) == 0) chat_template_free(&t);
        free(text);
    }
    return 0;
}

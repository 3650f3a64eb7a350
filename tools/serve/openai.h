/* The OpenAI-style request bodies the server accepts, parsed and checked into plain structs, and
 * the error object every failure answers with. Pure functions of the body's bytes (no model, no
 * HTTP): fuzz/fuzz_serve_request.c drives them.
 *
 * Strict by design: a field of the wrong type, a value out of range, a
 * feature nopad does not implement (a suffix, best_of above 1, /v1/responses' top_logprobs,
 * echo with logprobs, ...) and any field the route does not know are a 400 naming the
 * field, never silently ignored. Fields that change nothing (user, metadata, store, ...) are
 * accepted. The body is one JSON object and nothing after it; its strings hold no NUL (cJSON
 * would cut them there) and are UTF-8, else a 400 naming the string (messages[1].content,
 * stop[0], input[3]) with the byte offset inside it. */
#ifndef NOPAD_TOOLS_SERVE_OPENAI_H
#define NOPAD_TOOLS_SERVE_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include "chat_template.h"
#include "nopad.h"

/* An OpenAI-style error: {"error": {"message", "type", "param", "code"}} with an HTTP status. */
typedef struct api_error {
    int status;         /* 400, 404, 413, 429, ... */
    const char *type;   /* "invalid_request_error", ... */
    const char *code;   /* NULL or a short code ("context_length_exceeded", ...) */
    char param[64];     /* the field in question, or "" */
    char message[512];
} api_error;

/* Fills e and returns -1 (for `return api_fail(...)`). */
int api_fail(api_error *e, int status, const char *type, const char *code, const char *param,
             const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;

/* GEN_RESPONSES: /v1/responses, text in and out: its input and instructions become chat messages
 * (instructions the system message; function_call items an assistant turn's calls,
 * function_call_output items tool turns), its tools chat's, max_output_tokens max_tokens. */
typedef enum gen_kind { GEN_COMPLETION, GEN_CHAT, GEN_RESPONSES } gen_kind;

enum { GEN_MAX_CHOICES = 16 };

/* A /v1/completions, /v1/chat/completions or /v1/responses request. Strings are owned
 * (gen_request_free). */
typedef struct gen_request {
    gen_kind kind;
    char *model;            /* NULL when absent */
    int stream, include_usage;
    /* completions: the prompt as text, or as token ids */
    char *prompt;
    int32_t *prompt_ids;
    int32_t n_prompt_ids;
    int echo;               /* the prompt's text leads the answer's text */
    /* chat and responses */
    chat_message *messages; /* roles and contents owned here */
    int n_messages;
    char *instructions;     /* responses: as given (also messages[0]), NULL when absent */
    int32_t n;              /* choices: n engine requests of the same prompt (seeds seed, seed + 1,
                               ...), at most GEN_MAX_CHOICES */
    int32_t max_tokens;     /* -1: not given (completions: 16; chat: what the context leaves) */
    int32_t min_tokens;     /* 0: none */
    double temperature, top_p, min_p, repetition_penalty;
    int32_t top_k;
    int has_seed;
    uint64_t seed;
    char **stops;
    int32_t n_stops;
    int32_t *stop_ids;
    int32_t n_stop_ids;
    int ignore_eos;
    /* OpenAI's penalties over the generated ids, in [-2, 2] (nopad.h: nopad_sampling_params) */
    double presence_penalty, frequency_penalty;
    nopad_logit_bias *logit_bias; /* [n_logit_bias], ids distinct (not yet checked against the
                                     vocabulary: the parser knows no model) */
    int32_t n_logit_bias;
    int logprobs;           /* 1: each chosen token's log-probability (completions "logprobs": k,
                               chat "logprobs": true) */
    int32_t top_logprobs;   /* and that many most likely alternatives at each position
                               (completions k, chat "top_logprobs"), 0..NOPAD_MAX_TOP_LOGPROBS */
    /* chat: the tools offered (names and definitions owned), tool_choice "none" (the tools are
     * not offered then), parallel_tool_calls (0: at most one call is returned) */
    chat_tool *tools;
    int n_tools;
    int tool_choice_none;
    int tool_choice_required; /* "required" or a named function: the answer is calls only, forced by
                                 a constraint (structured_tool_choice) */
    int tool_choice_named;    /* the named function's index in tools; -1: any of them */
    int parallel_tool_calls;
    nopad_constraint *constraint; /* response_format, guided_* or text.format: what the output must
                                     be (structured.h); NULL: free text */
} gen_request;

/* Parses a completions (kind GEN_COMPLETION), chat or responses body. 0, or -1 with e filled
 * (400). */
int openai_parse_generation(const char *body, size_t len, gen_kind kind, gen_request *out,
                            api_error *e);
void gen_request_free(gen_request *r);

/* POST /v1/embeddings {input, model, encoding_format, dimensions, user} and TEI's POST /embed
 * {inputs, normalize, truncate, truncation_direction}: inputs as texts or as token ids. */
typedef struct embed_request {
    int tei;                /* 1: /embed */
    char *model;
    int n_inputs;
    char **texts;           /* [n_inputs] or NULL when the inputs are ids */
    int32_t **ids;          /* [n_inputs] arrays, lengths in n_ids */
    int32_t *n_ids;
    int base64;             /* encoding_format "base64" */
    int normalize;          /* 1: L2-normalise (TEI's default); -1: the model's default */
    int truncate;
    int32_t dimensions;     /* 0: the model's size */
} embed_request;

enum { EMBED_MAX_INPUTS = 2048 };

int openai_parse_embeddings(const char *body, size_t len, int tei, embed_request *out, api_error *e);
void embed_request_free(embed_request *r);

/* TEI's POST /predict {inputs, raw_scores, truncate, truncation_direction} and POST /rerank
 * {query, texts, raw_scores, return_text, truncate, truncation_direction}, for an encoder with a
 * sequence-classification head. /predict's inputs as TEI reads them: a string, or [a, b] (one
 * pair), else a list whose items are strings or [a] / [a, b] arrays (a batch). */
typedef struct classify_request {
    int rerank;             /* 1: /rerank: the query paired with each text */
    int batch;              /* /predict: a list of inputs, answered with a list per input */
    int n_inputs;
    char **a;               /* [n_inputs] the text, or a pair's first text (/rerank: the query) */
    char **b;               /* [n_inputs] a pair's second text, NULL entries for single texts */
    int raw_scores;         /* 1: logits; 0: softmax (sigmoid for one label) */
    int return_text;        /* /rerank: each result carries its text */
    int truncate;
} classify_request;

int openai_parse_classify(const char *body, size_t len, int rerank, classify_request *out, api_error *e);
void classify_request_free(classify_request *r);

#endif

/* Structured outputs in nopad serve: the request fields that constrain a generation (OpenAI's
 * response_format, vLLM's guided_json / guided_regex / guided_choice) as a nopad_constraint. */
#ifndef NOPAD_SERVE_STRUCTURED_H
#define NOPAD_SERVE_STRUCTURED_H

#include <cjson/cJSON.h>

#include "nopad.h"
#include "openai.h"

/* The constraint a request body asks for: *out NULL when none (response_format absent or "text").
 * At most one of response_format (non-text), guided_json, guided_regex and guided_choice. A bad
 * or unsupported one is -1 with e filled: 400 naming the field, with the schema keyword and its
 * path where the schema is the cause (an unsupported keyword is never ignored). */
int structured_constraint(const cJSON *body, nopad_constraint **out, api_error *e);
/* /v1/responses' text.format: {"type": "text"} (no constraint), {"type": "json_object"} or
 * {"type": "json_schema", "name", "schema", "strict"}. */
int structured_text_format(const cJSON *format, nopad_constraint **out, api_error *e);
/* tool_choice "required" or a named function (r->tool_choice_required): the answer forced to be
 * calls in the model family's format (tool_calls.h), each naming one of the tools (or the named
 * one) with arguments valid against its parameters: one call, or with "required" and
 * parallel_tool_calls one or more. A tool whose parameters hold an unsupported keyword is a 400
 * naming the keyword and its path in them; with another constraint already (*out set) a 400. */
int structured_tool_choice(const gen_request *r, chat_tool_format format, nopad_constraint **out,
                           api_error *e);

#endif

/* Tool calls in a model's answer: the text parsed back into OpenAI's `tool_calls`, and how much of
 * a growing answer a stream may send as content before a call might begin. Pure functions of the
 * text (no model, no HTTP): tests/test_serve_tools.c drives them.
 *
 * The formats are the families' own (chat_template.h: chat_tool_format):
 *   Hermes   <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number, text around
 *            them is content;
 *   Llama-3  the whole answer one {"name": ..., "parameters": {...}} object (several joined by
 *            ';'), after an optional <|python_tag|>;
 *   Mistral  [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...] (the marker is a special token
 *            the text usually lacks: a bare array of such objects counts too), text before it
 *            content.
 * A call whose JSON does not parse, lacks a name, or has arguments that are not an object stays
 * text (content), as does a call cut off by the length limit. */
#ifndef NOPAD_TOOLS_SERVE_TOOL_CALLS_H
#define NOPAD_TOOLS_SERVE_TOOL_CALLS_H

#include <stddef.h>

#include "chat_template.h"

typedef struct tool_call {
    char *name;
    char *arguments; /* the arguments object as compact JSON text */
} tool_call;

typedef struct tool_answer {
    char *content;   /* the text outside the calls; NULL when it is only white space */
    tool_call *calls;
    int n_calls;
} tool_answer;

/* Parses text[0..len). max_calls > 0 keeps the first max_calls calls (parallel_tool_calls false:
 * 1), the later ones dropped; 0 keeps all. 0, or -1 when out of memory. With no call found,
 * content is the text as it is (NULL when empty). */
int tool_answer_parse(chat_tool_format format, const char *text, size_t len, int max_calls,
                      tool_answer *out);
void tool_answer_free(tool_answer *a);

/* How many bytes of the answer so far, text[0..len), a stream may send as content now: all of it
 * but what is, or may become, the start of a call (Hermes: from "<tool_call>", or a tail that
 * "<tool_call>" begins with; Llama-3: everything while the answer so far is white space or starts
 * with '{'; Mistral: the same with '[', and from "[TOOL_CALLS]"). The bytes held back are sent
 * at the end: as calls, or as content when they are none. */
size_t tool_text_releasable(chat_tool_format format, const char *text, size_t len);

#endif

/* Chat templates: messages -> the prompt text a chat model was trained on.
 *
 * nopad runs no Jinja. Like llama.cpp (llm_chat_detect_template / llm_chat_apply_template), the
 * server recognises the family of the model's template from marker strings in its text and
 * renders that family's format in C: ChatML (SmolLM2, Qwen), Llama-3, Llama-2 with its system /
 * BOS / strip variants, Mistral v1, v3, v3-tekken and v7. A template it does not recognise is an
 * error at startup (--chat-template NAME picks a family instead), never a silently wrong prompt.
 *
 * The rendered text carries no BOS: it is tokenized with the tokenizer's special tokens added,
 * which puts the BOS where the model wants one (as llama.cpp does). */
#ifndef NOPAD_TOOLS_SERVE_CHAT_TEMPLATE_H
#define NOPAD_TOOLS_SERVE_CHAT_TEMPLATE_H

#include <stddef.h>

typedef enum chat_family {
    CHAT_CHATML,
    CHAT_LLAMA3,
    CHAT_LLAMA2,            /* [INST] without a system message (it joins the first turn) */
    CHAT_LLAMA2_SYS,        /* <<SYS>> ... <</SYS>> inside the first [INST] */
    CHAT_LLAMA2_SYS_BOS,    /* ... and <s> before every later [INST] */
    CHAT_LLAMA2_SYS_STRIP,  /* ... and contents stripped of surrounding white space */
    CHAT_MISTRAL_V1,
    CHAT_MISTRAL_V3,
    CHAT_MISTRAL_V3_TEKKEN,
    CHAT_MISTRAL_V7,
    CHAT_N_FAMILIES
} chat_family;

typedef struct chat_template {
    chat_family family;
    /* ChatML templates that open with a system turn of their own when the messages have none
     * (SmolLM2: "You are a helpful AI assistant named SmolLM, ..."): its text, else NULL. */
    char *default_system;
} chat_template;

/* A call an assistant turn made (it goes back into the prompt): arguments as JSON text. */
typedef struct chat_tool_call {
    const char *id, *name, *arguments;
} chat_tool_call;

typedef struct chat_message {
    const char *role;    /* "system", "user", "assistant", "tool" */
    const char *content; /* UTF-8; "" for an assistant turn that only calls tools */
    const chat_tool_call *tool_calls; /* an assistant turn's calls, n_tool_calls of them */
    int n_tool_calls;
    const char *tool_call_id; /* a tool turn: the call it answers, or NULL */
} chat_message;

/* A function the model may call: its name and its OpenAI definition as JSON text
 * ({"type": "function", "function": {"name", "description", "parameters"}}). */
typedef struct chat_tool {
    const char *name, *json;
} chat_tool;

/* How a family writes tool definitions, calls and results, and how its answers call tools:
 * Hermes / Qwen2.5 (<tool_call>{"name", "arguments"}</tool_call>; the format for every family
 * without one of its own, SmolLM2 included), Llama-3.1 (a bare {"name", "parameters"} object) or
 * Mistral ([TOOL_CALLS] [{"name", "arguments"}, ...]). */
typedef enum chat_tool_format { TOOLS_HERMES, TOOLS_LLAMA3, TOOLS_MISTRAL } chat_tool_format;

chat_tool_format chat_template_tool_format(const chat_template *t);

/* Recognises a template's family from its text as llama.cpp does. 0, or -1 when the text matches
 * none of the families (the caller names --chat-template). */
int chat_template_detect(const char *text, chat_template *out);
/* The turn markers of other chat formats found in an unrecognised template ("<start_of_turn>",
 * "<|user|>", ...), comma-separated into buf (cap bytes), for the error that names them; "" when
 * none is found. */
void chat_template_markers(const char *text, char *buf, size_t cap);
/* The family named `name` ("chatml", "llama3", ...; chat_template_names lists them), or -1. */
int chat_template_by_name(const char *name, chat_template *out);
/* "chatml, llama3, llama2, ..." for messages. */
const char *chat_template_names(void);
const char *chat_family_name(chat_family family);
void chat_template_free(chat_template *t);

/* The prompt for `n` messages followed by the assistant's turn, as a new NUL-terminated string
 * (*len its length), or NULL when out of memory. */
char *chat_template_apply(const chat_template *t, const chat_message *messages, int n, size_t *len);
/* The same with `n_tools` tool definitions offered to the model in the family's tool format
 * (chat_template_tool_format); tool turns and assistant turns with calls are written in that
 * format whether tools are offered or not. */
char *chat_template_apply_tools(const chat_template *t, const chat_message *messages, int n,
                                const chat_tool *tools, int n_tools, size_t *len);

#endif

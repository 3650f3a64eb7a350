/* Where a model keeps its chat template (the Jinja text that turns messages into a prompt): a
 * GGUF file's tokenizer.chat_template, or a Hugging Face folder's chat_template.jinja or
 * tokenizer_config.json "chat_template". Only the text is read here; what it means is the
 * front end's business (tools/serve/chat_template.c). */
#ifndef NOPAD_IO_CHAT_TEMPLATE_H
#define NOPAD_IO_CHAT_TEMPLATE_H

#include "io/gguf.h"
#include "nopad.h"

/* The template of a GGUF file as a new NUL-terminated string, or *out = NULL when it has none.
 * A tokenizer.chat_template that is not a string is NOPAD_ERR_FORMAT. */
nopad_status chat_template_from_gguf(const gguf_file *f, char **out);

/* The template of a model folder: chat_template.jinja when present, else tokenizer_config.json's
 * "chat_template" (a string, or a list of {"name", "template"} of which the one named "default"),
 * as a new string; *out = NULL when there is none. A file that is there but unreadable, or a
 * "chat_template" of another shape, is an error naming it. */
nopad_status chat_template_from_folder(const char *dir, char **out);

#endif

/* One input line to token ids: text through the model's tokenizer, or decimal ids (--ids). Both
 * grow *ids (capacity *cap) as needed, cut at max_length (> 0) when truncate is set, and print a
 * message naming the line and return -1 on a bad line. */
#ifndef NOPAD_TOOLS_CLI_INPUT_H
#define NOPAD_TOOLS_CLI_INPUT_H

#include <stddef.h>
#include <stdint.h>

#include "nopad.h"

/* With the tokenizer's special tokens. A sequence over max_length without truncation is
 * measured again without the limit so that the message can give both lengths. */
int tokenize_line(const nopad_tokenizer *tok, const char *text, size_t len, int64_t line_no,
                  int32_t max_length, int truncate, int32_t **ids, size_t *cap, int32_t *n_ids);

/* Whitespace-separated decimal ids in [0, vocab_size), at least one, used as given. */
int parse_id_line(const char *line, size_t len, int64_t line_no, int32_t vocab_size,
                  int32_t max_length, int truncate, int32_t **ids, size_t *cap, int32_t *n_ids);

#endif

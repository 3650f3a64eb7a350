/* Internal tokenizer entry points (the public ones are in nopad.h). */
#ifndef NOPAD_IO_TOKENIZER_INTERNAL_H
#define NOPAD_IO_TOKENIZER_INTERNAL_H

#include <stddef.h>

#include "nopad.h"

/* Builds a tokenizer from the bytes of a tokenizer.json (the fuzzed entry point). `where` names
 * the source in error messages. */
nopad_status tokenizer_from_json(const char *json, size_t len, const char *where,
                                 nopad_tokenizer **out);

/* Builds a WordPiece tokenizer from the bytes of a vocab.txt (one token per line, line = id). */
nopad_status tokenizer_from_vocab_txt(const char *text, size_t len, int lowercase,
                                      const char *where, nopad_tokenizer **out);

#endif

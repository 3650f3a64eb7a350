/* A decoder's model_config from a GGUF file's metadata (gguf_config.c). */
#ifndef NOPAD_IO_GGUF_CONFIG_H
#define NOPAD_IO_GGUF_CONFIG_H

#include "io/gguf.h"
#include "io/model_config.h"
#include "nopad.h"

/* An architecture other than llama / qwen2 -> NOPAD_ERR_UNSUPPORTED naming it; missing or
 * malformed keys -> NOPAD_ERR_FORMAT naming the key. */
nopad_status gguf_model_config(const gguf_file *f, model_config *out);

#endif

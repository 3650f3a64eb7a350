/* Hugging Face config.json: the family from model_type, then its hyperparameters. */
#ifndef NOPAD_IO_HF_CONFIG_H
#define NOPAD_IO_HF_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "io/model_config.h"
#include "nopad.h"

/* Parses config.json bytes. `where` names the file in messages. Unsupported model_type ->
 * NOPAD_ERR_UNSUPPORTED; not JSON, missing or out-of-range fields -> NOPAD_ERR_FORMAT. */
nopad_status hf_config_parse(const char *json, size_t len, const char *where, model_config *out);

#endif

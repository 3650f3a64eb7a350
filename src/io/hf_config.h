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

/* The encoder's sequence-classification head (cfg->head) and its labels (*labels: [num_labels]
 * malloc'd strings, id2label in id order, freed with hf_labels_free), from config.json bytes
 * already accepted by hf_config_parse. No head (a bare encoder, a token classifier, ...) leaves
 * cfg->head.present 0 and *labels NULL. id2label must number its labels 0 .. n-1. */
nopad_status hf_config_head(const char *json, size_t len, const char *where, model_config *cfg,
                            char ***labels);
void hf_labels_free(char **labels, int32_t n);

/* The decoder families (hf_decoder_config.c): gpt2, llama, mistral, qwen2. Returns 1 and fills
 * *st when model_type is one of them. */
struct cJSON;
int hf_decoder_config(const struct cJSON *root, const char *model_type, const char *where,
                      model_config *out, nopad_status *st);

/* Shared field readers: an integer in [lo, hi] (absent: fallback when has_fallback, else an
 * error naming the field). */
nopad_status hf_get_int(const struct cJSON *root, const char *where, const char *key,
                        int has_fallback, int32_t fallback, int32_t lo, int32_t hi, int32_t *out);

#endif

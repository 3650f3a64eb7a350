/* The sentence-transformers files of a model folder: how its embeddings are pooled. */
#ifndef NOPAD_IO_ST_PIPELINE_H
#define NOPAD_IO_ST_PIPELINE_H

#include <stdint.h>

#include "nopad.h"

/* What the sentence-transformers files of a folder say (modules.json, 1_Pooling/config.json,
 * sentence_bert_config.json). Folders without them get has_pipeline = 0 and CLS pooling. */
typedef struct st_pipeline {
    int has_pipeline;
    nopad_pooling pooling;
    int normalize;
    int32_t max_seq_length; /* 0 when not given */
} st_pipeline;

nopad_status st_pipeline_load(const char *dir, st_pipeline *out);

#endif

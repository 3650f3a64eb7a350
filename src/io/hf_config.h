/* Hugging Face config.json for the BERT family, and the sentence-transformers side files. */
#ifndef NOPAD_IO_HF_CONFIG_H
#define NOPAD_IO_HF_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "nopad.h"

typedef enum encoder_family {
    FAMILY_BERT = 0,
    FAMILY_ROBERTA,    /* also xlm-roberta, camembert: positions start at pad_token_id + 1 */
    FAMILY_DISTILBERT, /* own tensor names, no token types */
    FAMILY_ALBERT,     /* factorised embeddings, shared layer groups */
} encoder_family;

typedef struct encoder_config {
    char model_type[32];
    encoder_family family;
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t embedding_size; /* ALBERT: embedding_size; others: = hidden_size */
    int32_t num_layers;
    int32_t num_heads;
    int32_t head_size;
    int32_t intermediate_size;
    int32_t max_position_embeddings;
    int32_t type_vocab_size;  /* 0: no token-type embeddings (DistilBERT) */
    int32_t pad_token_id;
    int32_t position_offset;  /* first position id: pad_token_id + 1 for RoBERTa, else 0 */
    int32_t num_hidden_groups;/* ALBERT */
    int32_t inner_group_num;  /* ALBERT */
    float layer_norm_eps;
    nopad_activation activation;
    char activation_name[32];
} encoder_config;

/* Parses config.json bytes. `where` names the file in messages. Unsupported model_type ->
 * NOPAD_ERR_UNSUPPORTED; not JSON, missing or out-of-range fields -> NOPAD_ERR_FORMAT. */
nopad_status hf_config_parse(const char *json, size_t len, const char *where, encoder_config *out);

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

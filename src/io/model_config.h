/* The one description of a model's architecture and hyperparameters, for every family. The
 * config parsers of io/ fill it (hf_config.c from config.json; later GGUF metadata); model/ reads
 * it to build the graph. Plain data: no behaviour, nothing above util/. */
#ifndef NOPAD_IO_MODEL_CONFIG_H
#define NOPAD_IO_MODEL_CONFIG_H

#include <stdint.h>

#include "util/types.h"

typedef enum model_family {
    FAMILY_BERT = 0,
    FAMILY_ROBERTA,    /* also xlm-roberta, camembert: positions start at pad_token_id + 1 */
    FAMILY_DISTILBERT, /* own tensor names, no token types */
    FAMILY_ALBERT,     /* factorised embeddings, shared layer groups */
} model_family;

/* How the model places tokens: the encoders' learned position table, or rotary embeddings
 * (decoders; not implemented yet, so no parser sets it). */
typedef enum model_positions { POSITIONS_LEARNED = 0, POSITIONS_ROPE = 1 } model_positions;

/* The norm the layers use (decoders' RMSNorm is not implemented yet; no parser sets it). */
typedef enum model_norm { NORM_LAYERNORM = 0, NORM_RMSNORM = 1 } model_norm;

typedef struct model_config {
    char model_type[32];      /* config.json's model_type, as written */
    model_family family;
    int causal;               /* 1: decoder (each token sees only earlier ones); 0: encoder */
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t embedding_size;   /* ALBERT: embedding_size; others: = hidden_size */
    int32_t num_layers;
    int32_t num_heads;
    int32_t num_kv_heads;     /* grouped-query attention; = num_heads for every encoder */
    int32_t head_size;
    int32_t intermediate_size;
    int32_t max_position_embeddings;
    int32_t type_vocab_size;  /* 0: no token-type embeddings (DistilBERT) */
    int32_t pad_token_id;
    int32_t position_offset;  /* first position id: pad_token_id + 1 for RoBERTa, else 0 */
    model_positions positions;
    float rope_theta;         /* POSITIONS_ROPE only */
    model_norm norm;
    float layer_norm_eps;
    int32_t num_hidden_groups;/* ALBERT */
    int32_t inner_group_num;  /* ALBERT */
    nopad_activation activation;
    char activation_name[32];
} model_config;

#endif

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
    FAMILY_DEBERTA_V2, /* deberta-v2 (and v3): disentangled relative attention, usually no
                          absolute positions */
    FAMILY_GPT2,       /* decoder: learned positions, LayerNorm, gelu_new, Conv1D weights, tied head */
    FAMILY_LLAMA,      /* decoder: RMSNorm, RoPE, SwiGLU, grouped-query attention (also mistral,
                          qwen2 with QKV biases, SmolLM2) */
} model_family;

/* How the model places tokens: a learned position table, or rotary embeddings. */
typedef enum model_positions { POSITIONS_LEARNED = 0, POSITIONS_ROPE = 1 } model_positions;

/* The norm the layers use. */
typedef enum model_norm { NORM_LAYERNORM = 0, NORM_RMSNORM = 1 } model_norm;

/* RoPE frequency scaling (config.json rope_scaling / rope_parameters). */
typedef enum rope_scaling_kind {
    ROPE_SCALING_NONE = 0,
    ROPE_SCALING_LINEAR, /* positions / factor */
    ROPE_SCALING_LLAMA3, /* Llama 3.1: low frequencies / factor, smooth band between */
} rope_scaling_kind;

typedef struct rope_scaling {
    rope_scaling_kind kind;
    float factor;
    float low_freq_factor, high_freq_factor; /* LLAMA3 */
    int32_t original_max_positions;          /* LLAMA3 */
} rope_scaling;

/* DeBERTa-v2/v3's disentangled attention (HF DisentangledSelfAttention): each score gets a
 * content-to-position term q_i·pos_key[r] and a position-to-content term k_j·pos_query[r], where
 * r = clamp(bucket(i - j) + att_span, 0, 2·att_span - 1) indexes the relative embeddings. */
typedef struct relative_attention {
    int enabled;                    /* config.json relative_attention */
    int c2p, p2c;                   /* pos_att_type holds "c2p" / "p2c" */
    int share_att_key;              /* positions projected by the layer's own query/key weights */
    int norm_rel_ebd;               /* norm_rel_ebd "layer_norm": LayerNorm on rel_embeddings */
    int32_t position_buckets;       /* <= 0: no log buckets */
    int32_t max_relative_positions; /* as HF resolves it: max_position_embeddings when < 1 */
    int32_t att_span;               /* k: position_buckets if > 0, else max_relative_positions;
                                       rel_embeddings has 2k rows */
} relative_attention;

/* A sequence-classification head on each sequence's first token, as every family's
 * *ForSequenceClassification has it: logits = act(h[0]·W1ᵀ + b1)·W2ᵀ + b2 (BERT's pooler +
 * classifier, RoBERTa's classifier.dense + out_proj, DeBERTa's ContextPooler + classifier). */
typedef struct classifier_head {
    int present;          /* config.json's architectures[0] is a *ForSequenceClassification */
    int32_t num_labels;   /* id2label's size, as HF derives num_labels */
    nopad_activation act; /* tanh; relu (DistilBERT); pooler_hidden_act (DeBERTa) */
    char architecture[64];
} classifier_head;

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
    int absolute_positions;   /* 1: learned position embeddings are added at the input (0:
                                 DeBERTa with position_biased_input false) */
    relative_attention rel;   /* DeBERTa-v2/v3 */
    classifier_head head;     /* encoders: filled by hf_config_head */
    int32_t attention_scale_factor; /* scores scaled by 1/sqrt(head_size · this): 1, or DeBERTa's
                                       1 + |pos_att_type| */
    model_positions positions;
    float rope_theta;         /* POSITIONS_ROPE only */
    model_norm norm;
    float layer_norm_eps;
    float hidden_dropout_prob;/* encoders, training only: dropout after the embeddings and after
                                 each sub-layer (BertConfig's default 0.1) */
    float attention_probs_dropout_prob; /* encoders, training only: dropout of the attention
                                 probabilities (BertConfig's default 0.1) */
    int32_t num_hidden_groups;/* ALBERT */
    int32_t inner_group_num;  /* ALBERT */
    nopad_activation activation;
    char activation_name[32];
    /* decoders */
    int qkv_bias;             /* biases on the Q, K, V projections (Qwen2, attention_bias) */
    int o_bias;               /* a bias on the output projection (attention_bias) */
    int tie_word_embeddings;  /* the LM head is the token embedding matrix */
    rope_scaling rope;        /* how rotary frequencies are scaled for long contexts */
    int32_t bos_token_id;     /* -1: none */
    int32_t eos_token_ids[8]; /* generation stops at any of these */
    int32_t n_eos;
} model_config;

#endif

/* libFuzzer target: config.json parsing and model_type dispatch, and the classification head. */
#include <stddef.h>
#include <stdint.h>

#include "io/hf_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    model_config cfg;
    if (hf_config_parse((const char *)data, size, "fuzz", &cfg) == NOPAD_OK) {
        /* Invariants a successful parse promises to the loader. An encoder's heads split its
         * hidden size; a decoder may set head_dim apart from it (Mistral-Nemo: 32 x 128 over
         * 5120), but always to an even size (RoPE turns pairs) and whole KV groups. */
        if (!cfg.causal && cfg.head_size * cfg.num_heads != cfg.hidden_size) __builtin_trap();
        if (cfg.causal && (cfg.head_size <= 0 || cfg.head_size % 2 != 0 || cfg.num_kv_heads <= 0 ||
                           cfg.num_heads % cfg.num_kv_heads != 0))
            __builtin_trap();
        if (cfg.position_offset >= cfg.max_position_embeddings) __builtin_trap();
        /* DeBERTa: the position tables have 2k >= 2 rows and the log buckets can reach */
        if (cfg.rel.enabled && (cfg.rel.att_span < 1 || cfg.rel.max_relative_positions < 1 ||
                                (cfg.rel.position_buckets > 0 &&
                                 cfg.rel.max_relative_positions - 1 <= cfg.rel.position_buckets / 2)))
            __builtin_trap();
        if (!cfg.causal && !cfg.rel.enabled && !cfg.absolute_positions) __builtin_trap();
        /* the head's labels: a count from id2label that hf_config_head returns, each a string */
        char **labels = NULL;
        if (!cfg.causal && hf_config_head((const char *)data, size, "fuzz", &cfg, &labels) == NOPAD_OK) {
            if (cfg.head.present && (cfg.head.num_labels < 1 || !labels)) __builtin_trap();
            for (int32_t i = 0; cfg.head.present && i < cfg.head.num_labels; i++)
                if (!labels[i]) __builtin_trap();
            hf_labels_free(labels, cfg.head.num_labels);
        }
    }
    return 0;
}

/* libFuzzer target: config.json parsing and model_type dispatch. */
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
    }
    return 0;
}

/* libFuzzer target: config.json parsing and model_type dispatch. */
#include <stddef.h>
#include <stdint.h>

#include "io/hf_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    model_config cfg;
    if (hf_config_parse((const char *)data, size, "fuzz", &cfg) == NOPAD_OK) {
        /* Invariants a successful parse promises to the loader. */
        if (cfg.head_size * cfg.num_heads != cfg.hidden_size) __builtin_trap();
        if (cfg.position_offset >= cfg.max_position_embeddings) __builtin_trap();
    }
    return 0;
}

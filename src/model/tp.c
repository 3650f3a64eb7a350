/* The tensor-parallel shard plan (tp.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tp.h"
#include "util/error.h"

static int fits(const model_config *cfg, int32_t size) {
    const int32_t nh = cfg->num_heads, kvh = cfg->num_kv_heads > 0 ? cfg->num_kv_heads : cfg->num_heads;
    if (size < 1 || nh % size != 0 || cfg->intermediate_size % size != 0) return 0;
    return kvh % size == 0 || size % kvh == 0;
}

nopad_status tp_shard_plan(const model_config *cfg, nopad_comm *comm, int32_t rank, int32_t size,
                           tp_shard *out) {
    memset(out, 0, sizeof *out);
    if (size < 1 || rank < 0 || rank >= size)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "tensor parallelism: rank %d of %d", rank, size);
    const int32_t nh = cfg->num_heads, kvh = cfg->num_kv_heads > 0 ? cfg->num_kv_heads : cfg->num_heads;
    if (!fits(cfg, size)) {
        char ok[256] = "";
        size_t used = 0;
        for (int32_t d = 1; d <= nh && used + 16 < sizeof ok; d++)
            if (fits(cfg, d)) used += (size_t)snprintf(ok + used, sizeof ok - used, "%s%d", used ? ", " : "", d);
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "tensor parallelism: tp %d does not split this model (%d query heads, %d "
                               "key/value heads, intermediate size %d: tp must divide the query heads "
                               "and the intermediate size, and divide or be a multiple of the key/value "
                               "heads); tp that work: %s",
                               size, nh, kvh, cfg->intermediate_size, ok);
    }
    out->comm = size > 1 ? comm : NULL;
    out->rank = rank;
    out->size = size;
    out->heads = nh / size;
    out->head0 = rank * out->heads;
    if (kvh % size == 0) {
        out->kv_heads = kvh / size;
        out->kv_head0 = rank * out->kv_heads;
    } else { /* size is a multiple of kvh: size / kvh ranks share each key/value head */
        out->kv_heads = 1;
        out->kv_head0 = rank / (size / kvh);
    }
    out->ffn = cfg->intermediate_size / size;
    out->ffn0 = rank * out->ffn;
    const int32_t V = cfg->vocab_size;
    out->vocab_stride = (V + size - 1) / size;
    out->vocab0 = rank * out->vocab_stride;
    const int32_t left = V - out->vocab0;
    out->vocab_rows = left < 0 ? 0 : left < out->vocab_stride ? left : out->vocab_stride;
    return NOPAD_OK;
}

/* ---- the launcher's world, from its environment (MPI is not started for this) ---------------- */

static int32_t env_int(const char *const *names, int32_t fallback) {
    for (const char *const *n = names; *n; n++) {
        const char *v = getenv(*n);
        if (v && *v) return (int32_t)atoi(v);
    }
    return fallback;
}

int32_t nopad_world_rank(void) {
    static const char *const names[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", NULL};
    return env_int(names, 0);
}

int32_t nopad_world_size(void) {
    static const char *const names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};
    return env_int(names, 1);
}

nopad_status nopad_tp_follow(const char *dir, const nopad_model_params *params) {
    (void)dir, (void)params;
    return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "nopad_tp_follow: not built yet");
}

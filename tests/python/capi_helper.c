/* C side of the Python tests: compiled by tests/python against include/nopad.h and the libnopad.so
 * the package loads.
 *
 *   capi_helper abi
 *       prints "struct field offset size" for every public struct, and "struct - sizeof -" lines,
 *       to check the ctypes declarations against the header;
 *   capi_helper encode DIR IDS CU POOLING OUT
 *       nopad_encode_packed on raw int32 files IDS [T] and CU [B+1], pooling -1..3 (-1: the
 *       folder's), normalize as the folder says; writes raw float32 [T, H] (pooling 0) or [B, H]. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nopad.h"

#define FIELD(s, f) printf("%s %s %zu %zu\n", #s, #f, offsetof(s, f), sizeof(((s *)0)->f))
#define SIZE(s) printf("%s - %zu -\n", #s, sizeof(s))

static void abi(void) {
    FIELD(nopad_tokenize_params, add_special_tokens);
    FIELD(nopad_tokenize_params, truncate);
    FIELD(nopad_tokenize_params, max_length);
    SIZE(nopad_tokenize_params);
    FIELD(nopad_model_params, device);
    FIELD(nopad_model_params, device_index);
    FIELD(nopad_model_params, dtype);
    FIELD(nopad_model_params, n_threads);
    FIELD(nopad_model_params, max_batch_tokens);
    FIELD(nopad_model_params, cuda_stream);
    FIELD(nopad_model_params, cuda_graph_max_tokens);
    FIELD(nopad_model_params, kv_cache_tokens);
    FIELD(nopad_model_params, kv_block_size);
    FIELD(nopad_model_params, tp_size);
    FIELD(nopad_model_params, weights);
    SIZE(nopad_model_params);
    FIELD(nopad_model_info, model_type);
    FIELD(nopad_model_info, family);
    FIELD(nopad_model_info, activation);
    FIELD(nopad_model_info, weights_dtype);
    FIELD(nopad_model_info, compute_dtype);
    FIELD(nopad_model_info, vocab_size);
    FIELD(nopad_model_info, hidden_size);
    FIELD(nopad_model_info, embedding_size);
    FIELD(nopad_model_info, num_layers);
    FIELD(nopad_model_info, num_heads);
    FIELD(nopad_model_info, head_size);
    FIELD(nopad_model_info, intermediate_size);
    FIELD(nopad_model_info, max_position_embeddings);
    FIELD(nopad_model_info, max_seq_length);
    FIELD(nopad_model_info, type_vocab_size);
    FIELD(nopad_model_info, layer_norm_eps);
    FIELD(nopad_model_info, n_params);
    FIELD(nopad_model_info, pooling);
    FIELD(nopad_model_info, normalize);
    FIELD(nopad_model_info, has_tokenizer);
    FIELD(nopad_model_info, tokenizer_kind);
    FIELD(nopad_model_info, is_decoder);
    FIELD(nopad_model_info, num_kv_heads);
    FIELD(nopad_model_info, bos_token_id);
    FIELD(nopad_model_info, eos_token_id);
    FIELD(nopad_model_info, tp_size);
    SIZE(nopad_model_info);
    FIELD(nopad_model_stats, forwards);
    FIELD(nopad_model_stats, graph_replays);
    FIELD(nopad_model_stats, graphs_recorded);
    FIELD(nopad_model_stats, graphs_held);
    SIZE(nopad_model_stats);
    FIELD(nopad_encode_params, pooling);
    FIELD(nopad_encode_params, normalize);
    FIELD(nopad_encode_params, batch_tokens);
    SIZE(nopad_encode_params);
    FIELD(nopad_context_params, max_batch_tokens);
    FIELD(nopad_context_params, cuda_stream);
    FIELD(nopad_context_params, cuda_graph_max_tokens);
    FIELD(nopad_context_params, kv_cache_tokens);
    FIELD(nopad_context_params, kv_block_size);
    SIZE(nopad_context_params);
    FIELD(nopad_sampling_params, temperature);
    FIELD(nopad_sampling_params, top_k);
    FIELD(nopad_sampling_params, top_p);
    FIELD(nopad_sampling_params, min_p);
    FIELD(nopad_sampling_params, repetition_penalty);
    FIELD(nopad_sampling_params, seed);
    FIELD(nopad_sampling_params, presence_penalty);
    FIELD(nopad_sampling_params, frequency_penalty);
    FIELD(nopad_sampling_params, logit_bias);
    FIELD(nopad_sampling_params, n_logit_bias);
    SIZE(nopad_sampling_params);
    FIELD(nopad_generate_params, max_tokens);
    FIELD(nopad_generate_params, ignore_eos);
    FIELD(nopad_generate_params, sampling);
    SIZE(nopad_generate_params);
    FIELD(nopad_batch, layout);
    FIELD(nopad_batch, on_device);
    FIELD(nopad_batch, n_seqs);
    FIELD(nopad_batch, tokens);
    FIELD(nopad_batch, token_type_ids);
    FIELD(nopad_batch, cu_seqlens);
    FIELD(nopad_batch, lengths);
    FIELD(nopad_batch, max_len);
    FIELD(nopad_batch, n_tokens);
    FIELD(nopad_batch, max_seqlen);
    SIZE(nopad_batch);
    printf("enum - %zu -\n", sizeof(nopad_pooling));
}

static void *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static int encode(char **argv) {
    size_t ids_len, cu_len;
    int32_t *ids = read_all(argv[3], &ids_len), *cu = read_all(argv[4], &cu_len);
    if (!ids || !cu) return fprintf(stderr, "cannot read inputs\n"), 1;
    nopad_model *m;
    if (nopad_model_load(argv[2], NULL, &m) != NOPAD_OK)
        return fprintf(stderr, "%s\n", nopad_last_error()), 1;
    nopad_model_info info;
    nopad_model_get_info(m, &info);
    int32_t n_seqs = (int32_t)(cu_len / 4) - 1, T = (int32_t)(ids_len / 4);
    nopad_encode_params p = nopad_encode_default_params();
    p.pooling = (nopad_pooling)atoi(argv[5]);
    int per_token = p.pooling == NOPAD_POOLING_NONE;
    size_t rows = per_token ? (size_t)T : (size_t)n_seqs;
    float *out = malloc(rows * (size_t)info.hidden_size * sizeof(float));
    nopad_status st = nopad_encode_packed(m, n_seqs, cu, ids, NULL, &p, per_token ? out : NULL,
                                          per_token ? NULL : out);
    if (st != NOPAD_OK) return fprintf(stderr, "%s\n", nopad_last_error()), 1;
    FILE *f = fopen(argv[6], "wb");
    fwrite(out, sizeof(float), rows * (size_t)info.hidden_size, f);
    fclose(f);
    free(out);
    free(ids);
    free(cu);
    nopad_model_free(m);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "abi") == 0) {
        abi();
        return 0;
    }
    if (argc == 7 && strcmp(argv[1], "encode") == 0) return encode(argv);
    fprintf(stderr, "usage: capi_helper abi | encode DIR IDS CU POOLING OUT\n");
    return 2;
}

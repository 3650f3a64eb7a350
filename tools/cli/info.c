/* `nopad info`: what a model folder or GGUF file holds, as aligned 'key: value' lines or one JSON
 * object. */
#include <cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nopad.h"

static const char info_help[] =
    "usage: nopad info --model M [--json] [--device D] [--dtype T] [--weights W]\n"
    "\n"
    "Loads a model and prints what it is: an encoder's architecture, sizes, tokenizer and\n"
    "default pooling; a decoder's architecture, sizes, context length, tokenizer and its\n"
    "beginning and end of sequence tokens; for both, how each group of weights is held in\n"
    "memory (its format, and the file's where that differs) and the bytes they take.\n"
    "\n"
    "options:\n"
    "  --model M       a Hugging Face model folder or a .gguf file [required]\n"
    "  --json          print one JSON object instead of aligned 'key: value' lines\n"
    "  --device D      cpu (default) or cuda\n"
    "  --dtype T       compute dtype: fp32 (CPU default), fp16 (CUDA default) or bf16\n"
    "  --weights W     auto (default), native, f32, f16, bf16 or fp8: as nopad generate holds them\n"
    "  -h, --help      show this help\n";

/* Shortest decimal that reads back as the same float: 1e-12, not 9.99999996e-13. */
static void format_float(char *buf, size_t cap, float x) {
    for (int precision = 1; precision <= 9; precision++) {
        snprintf(buf, cap, "%.*g", precision, (double)x);
        if (strtof(buf, NULL) == x) return;
    }
}

static const char *or_unknown(const char *s) { return s && s[0] ? s : "unknown"; }

static void print_field(const char *key, const char *fmt, ...) PRINTF_LIKE(2, 3);
static void print_field(const char *key, const char *fmt, ...) {
    char label[64];
    snprintf(label, sizeof label, "%s:", key);
    printf("%-21s ", label);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
}

/* The tokenizer's kind ("bpe-byte-level", ...) or NULL without one. */
static const char *tokenizer_kind(const nopad_model *model) {
    const nopad_tokenizer *tok = nopad_model_tokenizer(model);
    return tok ? nopad_tokenizer_kind_name(nopad_tokenizer_get_kind(tok)) : NULL;
}

/* "2 (<|im_end|>)", or "none" for -1. */
static void format_token(char *buf, size_t cap, const nopad_model *model, int32_t id) {
    const nopad_tokenizer *tok = nopad_model_tokenizer(model);
    const char *s = id >= 0 && tok ? nopad_tokenizer_id_to_token(tok, id, NULL) : NULL;
    if (id < 0) snprintf(buf, cap, "none");
    else if (s) snprintf(buf, cap, "%" PRId32 " (%s)", id, s);
    else snprintf(buf, cap, "%" PRId32, id);
}

/* The model's weight groups (nopad_model_weight_groups), or NULL with *n = 0 when out of memory. */
static nopad_weight_group *weight_groups(const nopad_model *model, int32_t *n) {
    *n = nopad_model_weight_groups(model, NULL, 0);
    nopad_weight_group *g = calloc((size_t)(*n > 0 ? *n : 1), sizeof *g);
    if (!g) *n = 0;
    else nopad_model_weight_groups(model, g, *n);
    return g;
}

/* "weights in memory" and a line per group: format (stored as), tensors, bytes. */
static void print_weights_text(const nopad_model *model) {
    size_t bytes = 0;
    nopad_model_memory(model, &bytes, NULL, NULL);
    print_field("weights in memory", "%zu bytes (%.1f MB)", bytes, (double)bytes / 1e6);
    int32_t n;
    nopad_weight_group *g = weight_groups(model, &n);
    for (int32_t i = 0; i < n; i++) {
        char key[64], stored[48] = "", tensors[32] = "";
        snprintf(key, sizeof key, "  %s", g[i].name);
        if (strcmp(g[i].format, g[i].stored) != 0) snprintf(stored, sizeof stored, " (stored %s)", g[i].stored);
        /* an encoder's one group counts no tensors */
        if (g[i].n_tensors > 0) snprintf(tensors, sizeof tensors, ", %" PRId32 " tensors", g[i].n_tensors);
        print_field(key, "%s%s%s, %.2f MB", g[i].format, stored, tensors, (double)g[i].bytes / 1e6);
    }
    free(g);
}

static void print_decoder_text(const nopad_model *model, const nopad_model_info *m) {
    char eps[32], bos[160], eos[160];
    format_float(eps, sizeof eps, m->layer_norm_eps);
    format_token(bos, sizeof bos, model, m->bos_token_id);
    format_token(eos, sizeof eos, model, m->eos_token_id);
    const char *kind = tokenizer_kind(model);
    print_field("kind", "decoder");
    print_field("family", "%s", or_unknown(m->family));
    print_field("model type", "%s", or_unknown(m->model_type));
    print_field("vocab size", "%" PRId32, m->vocab_size);
    print_field("hidden size", "%" PRId32, m->hidden_size);
    print_field("layers", "%" PRId32, m->num_layers);
    print_field("heads", "%" PRId32, m->num_heads);
    print_field("kv heads", "%" PRId32, m->num_kv_heads);
    print_field("head size", "%" PRId32, m->head_size);
    print_field("intermediate size", "%" PRId32, m->intermediate_size);
    print_field("context length", "%" PRId32, m->max_position_embeddings);
    print_field("activation", "%s", or_unknown(m->activation));
    print_field("norm eps", "%s", eps);
    print_field("weights dtype", "%s", or_unknown(m->weights_dtype));
    print_field("compute dtype", "%s", or_unknown(m->compute_dtype));
    print_field("parameters", "%" PRId64 " (%.2fM)", m->n_params, (double)m->n_params / 1e6);
    if (kind) print_field("tokenizer", "%s (%s)", kind, or_unknown(m->tokenizer_kind));
    else print_field("tokenizer", "%s", or_unknown(m->tokenizer_kind));
    print_field("bos token", "%s", bos);
    print_field("eos token", "%s", eos);
    print_weights_text(model);
}

static void print_info_text(const nopad_model *model, const nopad_model_info *m) {
    if (m->is_decoder) {
        print_decoder_text(model, m);
        return;
    }
    char eps[32];
    format_float(eps, sizeof eps, m->layer_norm_eps);
    print_field("kind", "encoder");
    print_field("family", "%s", or_unknown(m->family));
    print_field("model type", "%s", or_unknown(m->model_type));
    print_field("vocab size", "%" PRId32, m->vocab_size);
    print_field("hidden size", "%" PRId32, m->hidden_size);
    if (m->embedding_size != m->hidden_size)
        print_field("embedding size", "%" PRId32, m->embedding_size);
    print_field("layers", "%" PRId32, m->num_layers);
    print_field("heads", "%" PRId32, m->num_heads);
    print_field("head size", "%" PRId32, m->head_size);
    print_field("intermediate size", "%" PRId32, m->intermediate_size);
    print_field("max positions", "%" PRId32, m->max_position_embeddings);
    print_field("max sequence length", "%" PRId32, m->max_seq_length);
    print_field("token types", "%" PRId32, m->type_vocab_size);
    print_field("activation", "%s", or_unknown(m->activation));
    print_field("layer norm eps", "%s", eps);
    print_field("weights dtype", "%s", or_unknown(m->weights_dtype));
    print_field("compute dtype", "%s", or_unknown(m->compute_dtype));
    print_field("parameters", "%" PRId64 " (%.2fM)", m->n_params, (double)m->n_params / 1e6);
    /* "none", or "unsupported" for one nopad cannot load (the load's warning says why) */
    print_field("tokenizer", "%s", or_unknown(m->tokenizer_kind));
    print_field("pooling", "%s", pooling_name(m->pooling));
    print_field("normalize", "%s", m->normalize ? "yes" : "no");
    const int32_t n_labels = nopad_model_num_labels(model);
    if (n_labels > 0) { /* a *ForSequenceClassification head: nopad classify / rerank */
        char names[512] = "";
        size_t n = 0;
        for (int32_t i = 0; i < n_labels && n < sizeof names; i++)
            n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", nopad_model_label(model, i));
        print_field("labels", "%" PRId32 " (%s%s)", n_labels, names, n >= sizeof names ? "..." : "");
    }
    print_weights_text(model);
}

static int print_info_json(const nopad_model *model, const nopad_model_info *m) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return -1;
    char eps[32];
    format_float(eps, sizeof eps, m->layer_norm_eps);
    cJSON_AddStringToObject(o, "kind", m->is_decoder ? "decoder" : "encoder");
    cJSON_AddStringToObject(o, "family", or_unknown(m->family));
    cJSON_AddStringToObject(o, "model_type", or_unknown(m->model_type));
    cJSON_AddNumberToObject(o, "vocab_size", m->vocab_size);
    cJSON_AddNumberToObject(o, "hidden_size", m->hidden_size);
    cJSON_AddNumberToObject(o, "embedding_size", m->embedding_size);
    cJSON_AddNumberToObject(o, "num_layers", m->num_layers);
    cJSON_AddNumberToObject(o, "num_heads", m->num_heads);
    cJSON_AddNumberToObject(o, "head_size", m->head_size);
    cJSON_AddNumberToObject(o, "intermediate_size", m->intermediate_size);
    cJSON_AddNumberToObject(o, "max_position_embeddings", m->max_position_embeddings);
    cJSON_AddNumberToObject(o, "max_seq_length", m->max_seq_length);
    cJSON_AddNumberToObject(o, "type_vocab_size", m->type_vocab_size);
    cJSON_AddStringToObject(o, "activation", or_unknown(m->activation));
    cJSON_AddNumberToObject(o, "layer_norm_eps", strtod(eps, NULL)); /* 1e-12, not 9.99e-13 */
    cJSON_AddStringToObject(o, "weights_dtype", or_unknown(m->weights_dtype));
    cJSON_AddStringToObject(o, "compute_dtype", or_unknown(m->compute_dtype));
    cJSON_AddNumberToObject(o, "n_params", (double)m->n_params); /* exact below 2^53 */
    cJSON_AddBoolToObject(o, "has_tokenizer", m->has_tokenizer != 0);
    cJSON_AddStringToObject(o, "tokenizer", or_unknown(m->tokenizer_kind));
    if (!m->is_decoder) { /* the classification head's id2label, [] without one */
        cJSON *labels = cJSON_AddArrayToObject(o, "labels");
        for (int32_t i = 0; labels && i < nopad_model_num_labels(model); i++)
            cJSON_AddItemToArray(labels, cJSON_CreateString(nopad_model_label(model, i)));
    }
    if (m->is_decoder) {
        const char *kind = tokenizer_kind(model);
        if (kind) cJSON_AddStringToObject(o, "tokenizer_kind", kind);
        else cJSON_AddNullToObject(o, "tokenizer_kind");
        cJSON_AddNumberToObject(o, "num_kv_heads", m->num_kv_heads);
        cJSON_AddNumberToObject(o, "context_length", m->max_position_embeddings);
        if (m->bos_token_id >= 0) cJSON_AddNumberToObject(o, "bos_token_id", m->bos_token_id);
        else cJSON_AddNullToObject(o, "bos_token_id");
        if (m->eos_token_id >= 0) cJSON_AddNumberToObject(o, "eos_token_id", m->eos_token_id);
        else cJSON_AddNullToObject(o, "eos_token_id");
    } else {
        cJSON_AddStringToObject(o, "pooling", pooling_name(m->pooling));
        cJSON_AddBoolToObject(o, "normalize", m->normalize != 0);
    }
    size_t bytes = 0;
    nopad_model_memory(model, &bytes, NULL, NULL);
    cJSON_AddNumberToObject(o, "weights_bytes", (double)bytes);
    cJSON *groups = cJSON_AddArrayToObject(o, "weight_groups");
    int32_t n;
    nopad_weight_group *g = weight_groups(model, &n);
    for (int32_t i = 0; groups && i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        if (!e) break;
        cJSON_AddStringToObject(e, "name", g[i].name);
        cJSON_AddStringToObject(e, "format", g[i].format);
        cJSON_AddStringToObject(e, "stored", g[i].stored);
        cJSON_AddNumberToObject(e, "n_tensors", g[i].n_tensors);
        cJSON_AddNumberToObject(e, "bytes", (double)g[i].bytes);
        cJSON_AddItemToArray(groups, e);
    }
    free(g);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return -1;
    puts(text);
    cJSON_free(text);
    return 0;
}

enum { OPT_MODEL = 256, OPT_JSON, OPT_DEVICE, OPT_DTYPE, OPT_WEIGHTS };

static const struct option long_options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"json", no_argument, NULL, OPT_JSON},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"weights", required_argument, NULL, OPT_WEIGHTS},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

int cmd_info(int argc, char **argv) {
    const char *model_dir = NULL;
    int json = 0;
    nopad_device device = NOPAD_DEVICE_CPU;
    nopad_dtype dtype = NOPAD_DTYPE_F32;
    int dtype_given = 0;
    nopad_weights weights = NOPAD_WEIGHTS_AUTO;
    cli_parser p = cli_parser_start(argc, argv, long_options);
    int c;
    while ((c = cli_getopt(&p)) != -1) {
        int bad = 0;
        switch (c) {
        case 'h': fputs(info_help, stdout); return EXIT_OK;
        case OPT_MODEL: model_dir = optarg; break;
        case OPT_JSON: json = 1; break;
        case OPT_DEVICE: bad = parse_device(optarg, &device); break;
        case OPT_DTYPE:
            bad = parse_dtype(optarg, &dtype);
            dtype_given = 1;
            break;
        case OPT_WEIGHTS: bad = parse_weights(optarg, &weights); break;
        default:
            cli_print_opt_error(&p);
            bad = 1;
        }
        if (bad) {
            fputs("usage: nopad info --model M [--json]   (nopad info --help)\n", stderr);
            return EXIT_USAGE;
        }
    }
    if (!model_dir) {
        print_error("missing --model M");
        fputs("usage: nopad info --model M [--json]   (nopad info --help)\n", stderr);
        return EXIT_USAGE;
    }
    nopad_model_params params = model_params(device, dtype, dtype_given, 0);
    params.weights = weights;
    nopad_model *model = open_model_with(model_dir, &params);
    if (!model) return EXIT_ERROR;
    nopad_model_info info;
    nopad_status status = nopad_model_get_info(model, &info);
    int rc = EXIT_OK;
    if (status != NOPAD_OK) {
        print_error("%s", library_error(status));
        rc = EXIT_ERROR;
    } else if (json) {
        if (print_info_json(model, &info)) {
            print_error("out of memory");
            rc = EXIT_ERROR;
        }
    } else {
        print_info_text(model, &info);
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        print_error("cannot write stdout: %s", strerror(errno));
        rc = EXIT_ERROR;
    }
    nopad_model_free(model);
    return rc;
}
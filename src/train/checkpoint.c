/* Training checkpoints: config.json, model.safetensors, optimizer.safetensors, trainer_state.json. */
#include "train/checkpoint.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "io/json.h"
#include "io/safetensors.h"
#include "util/error.h"
#include "util/file.h"

/* -2: the schedule and the run's shape (epochs, batch budgets) joined the state; -3: streamed
 * data (the window and the buffer; a -2 state held its data in memory); -4: the evaluations
 * and their metric (a -2 or -3 state recorded none); -5: the folder is written whole, and both
 * safetensors files record their step (older ones may not) */
static const char *const STATE_FORMAT = "nopad-train-5";
static const char *const OLDER_FORMATS[] = {"nopad-train-4", "nopad-train-3", "nopad-train-2"};
enum { N_OLDER_FORMATS = sizeof OLDER_FORMATS / sizeof OLDER_FORMATS[0] };

const char *const TRAIN_TOKENIZER_FILES[] = {"tokenizer.json", "tokenizer_config.json",
                                             "special_tokens_map.json", "vocab.txt", "vocab.json",
                                             "merges.txt", "added_tokens.json"};
const size_t TRAIN_N_TOKENIZER_FILES = sizeof TRAIN_TOKENIZER_FILES / sizeof TRAIN_TOKENIZER_FILES[0];
static const char *const OPT_NAMES[] = {"adamw", "lamb"};
static const char *const TASK_NAMES[] = {"mlm", "classify"};
static const char *const METRIC_NAMES[] = {"none", "loss", "accuracy"};

const char *train_optimizer_kind_name(train_optimizer_kind kind) {
    return (unsigned)kind <= TRAIN_OPT_LAMB ? OPT_NAMES[kind] : "unknown";
}

const char *train_metric_name(train_metric metric) {
    return (unsigned)metric <= TRAIN_METRIC_ACCURACY ? METRIC_NAMES[metric] : "unknown";
}

/* ---- the history of evaluations -------------------------------------------------------------- */

nopad_status train_state_add_eval(train_state *s, const train_eval *e) {
    if (s->n_evals > 0 && e->step <= s->evals[s->n_evals - 1].step)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "an evaluation at step %lld after one "
                               "at step %lld", (long long)e->step,
                               (long long)s->evals[s->n_evals - 1].step);
    if (s->n_evals == INT32_MAX)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "too many evaluations");
    /* grown by doubling: the capacity is the next power of two */
    const int32_t n = s->n_evals;
    if ((n & (n - 1)) == 0) {
        const size_t cap = n ? 2 * (size_t)n : 4;
        train_eval *grown = realloc(s->evals, cap * sizeof *grown);
        if (!grown) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "evaluations: out of memory");
        s->evals = grown;
    }
    s->evals[s->n_evals++] = *e;
    return NOPAD_OK;
}

int train_metric_better(train_metric metric, const train_eval *a, const train_eval *b) {
    return metric == TRAIN_METRIC_ACCURACY ? a->accuracy > b->accuracy : a->loss < b->loss;
}

int32_t train_state_best(const train_state *s) {
    int32_t best = -1;
    for (int32_t i = 0; i < s->n_evals; i++)
        if (best < 0 || train_metric_better(s->metric, &s->evals[i], &s->evals[best])) best = i;
    return best;
}

int32_t train_state_stale(const train_state *s, double min_delta) {
    int32_t ref = 0, stale = 0;
    for (int32_t i = 1; i < s->n_evals; i++) {
        const train_eval *e = &s->evals[i], *r = &s->evals[ref];
        const int improved = s->metric == TRAIN_METRIC_ACCURACY ? e->accuracy - r->accuracy > min_delta
                                                                 : r->loss - e->loss > min_delta;
        if (improved) ref = i, stale = 0;
        else stale++;
    }
    return stale;
}

void train_state_free(train_state *s) {
    free(s->evals);
    s->evals = NULL;
    s->n_evals = 0;
}

/* A float32 as the shortest decimal that reads back to it ("1e-12", not 9.99999996e-13). */
static cJSON *float_json(float x) {
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) { // 9 significant digits always read back
        snprintf(buf, sizeof buf, "%.*g", digits, (double)x);
        if ((float)strtod(buf, NULL) == x) break;
    }
    return cJSON_CreateNumber(strtod(buf, NULL));
}

/* A double as the shortest decimal that reads back to it, as raw JSON text: cJSON prints 15
 * digits when they read back to within a relative epsilon, not exactly (0.30000000000000004
 * would come back as 0.3). */
static cJSON *double_json(double x) {
    char buf[32];
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, x);
        if (strtod(buf, NULL) == x) break;
    }
    return cJSON_CreateRaw(buf);
}

/* ---- writing --------------------------------------------------------------------------------- */

/* dir/name, fsynced: dir is the staging folder of a save, which is renamed into place whole. */
static nopad_status write_file(const char *dir, const char *name, const void *head, size_t head_len,
                               const void *body, size_t body_len) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return write_file_synced(path, head, head_len, body, body_len);
}

static nopad_status write_json(const char *dir, const char *name, const cJSON *root) {
    char *text = root ? cJSON_Print(root) : NULL;
    if (!text) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s/%s: out of memory", dir, name);
    const size_t len = strlen(text);
    text[len] = '\n'; // cJSON_Print's buffer has the NUL there; the file gets a final newline
    nopad_status st = write_file(dir, name, text, len + 1, NULL, 0);
    free(text);
    return st;
}

/* The name a tensor is saved under: HF's task models keep the encoder under "bert.", so a model
 * loaded from a bare encoder (no prefix) and given a head is saved as BertForMaskedLM /
 * BertForSequenceClassification name it; the head's own tensors ("cls.*", "classifier.*") have
 * no prefix. */
static void saved_name(const train_model *m, const char *name, char out[128]) {
    if (!strncmp(name, "cls.", 4) || !strncmp(name, "classifier.", 11)) {
        snprintf(out, 128, "%s", name);
        return;
    }
    const size_t n = strlen(m->prefix);
    snprintf(out, 128, "bert.%s", strncmp(name, m->prefix, n) ? name : name + n);
}

/* Every tensor of the model, n_kinds times over, as float32 safetensors: copy k of tensor i is
 * named kinds[k] + its saved name and holds data[k · n_params + offset_i ...]. The header (JSON
 * padded with spaces to 8 bytes, as the format wants for aligned data), then the tensors back to
 * back in that order. */
static nopad_status write_safetensors(const train_model *m, const float *data,
                                      const char *const *kinds, int n_kinds, const char *dir,
                                      const char *name) {
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    /* the step of the weights or moments (metadata values are strings): a resume refuses a
     * folder whose files are of different steps */
    char step[32];
    snprintf(step, sizeof step, "%lld", (long long)m->step);
    cJSON_AddStringToObject(meta, "step", step);
    int ok = root && meta;
    size_t offset = 0;
    for (int32_t j = 0; j < n_kinds * m->n_tensors && ok; j++) {
        const train_tensor *t = &m->tensors[j % m->n_tensors];
        char saved[128], key[160];
        saved_name(m, t->name, saved);
        snprintf(key, sizeof key, "%s%s", kinds[j / m->n_tensors], saved);
        cJSON *e = cJSON_AddObjectToObject(root, key);
        const double shape[2] = {(double)t->rows, (double)t->cols};
        const size_t bytes = (size_t)(t->rows * t->cols) * sizeof(float);
        const double range[2] = {(double)offset, (double)(offset + bytes)};
        ok = e && cJSON_AddStringToObject(e, "dtype", "F32") &&
             cJSON_AddItemToObject(e, "shape", cJSON_CreateDoubleArray(shape, t->cols == 1 ? 1 : 2)) &&
             cJSON_AddItemToObject(e, "data_offsets", cJSON_CreateDoubleArray(range, 2));
        offset += bytes;
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s/%s: out of memory", dir, name);
    const size_t json_len = strlen(json), padded = (json_len + 7) / 8 * 8;
    uint8_t *head = malloc(8 + padded);
    if (!head) {
        free(json);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s/%s: out of memory", dir, name);
    }
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)((uint64_t)padded >> (8 * i)); // little-endian
    memcpy(head + 8, json, json_len);
    memset(head + 8 + json_len, ' ', padded - json_len);
    free(json);
    /* the table's tensors tile [0, n_params) in order, so the body is the buffer itself */
    assert(offset == (size_t)n_kinds * (size_t)m->n_params * sizeof(float));
    nopad_status st = write_file(dir, name, head, 8 + padded, data, offset);
    free(head);
    return st;
}

static cJSON *config_json(const train_model *m) {
    const model_config *c = &m->cfg;
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON *arch = cJSON_AddArrayToObject(root, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(m->task == TRAIN_TASK_MLM
                                                      ? "BertForMaskedLM"
                                                      : "BertForSequenceClassification"));
    cJSON_AddStringToObject(root, "model_type", "bert");
    cJSON_AddNumberToObject(root, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(root, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(root, "num_hidden_layers", c->num_layers);
    cJSON_AddNumberToObject(root, "num_attention_heads", c->num_heads);
    cJSON_AddNumberToObject(root, "intermediate_size", c->intermediate_size);
    cJSON_AddStringToObject(root, "hidden_act", c->activation_name);
    cJSON_AddNumberToObject(root, "max_position_embeddings", c->max_position_embeddings);
    cJSON_AddNumberToObject(root, "type_vocab_size", c->type_vocab_size);
    cJSON_AddItemToObject(root, "layer_norm_eps", float_json(c->layer_norm_eps));
    cJSON_AddItemToObject(root, "hidden_dropout_prob", float_json(c->hidden_dropout_prob));
    cJSON_AddItemToObject(root, "attention_probs_dropout_prob",
                          float_json(c->attention_probs_dropout_prob));
    cJSON_AddNumberToObject(root, "pad_token_id", c->pad_token_id);
    cJSON_AddStringToObject(root, "position_embedding_type", "absolute");
    cJSON_AddTrueToObject(root, "tie_word_embeddings");
    cJSON_AddStringToObject(root, "dtype", "float32");
    if (m->task == TRAIN_TASK_CLASSIFY) {
        cJSON *id2label = cJSON_AddObjectToObject(root, "id2label");
        cJSON *label2id = cJSON_AddObjectToObject(root, "label2id");
        for (int32_t i = 0; i < m->num_labels; i++) {
            char id[16], label[32];
            snprintf(id, sizeof id, "%d", i);
            snprintf(label, sizeof label, "LABEL_%d", i);
            cJSON_AddStringToObject(id2label, id, label);
            cJSON_AddNumberToObject(label2id, label, i);
        }
        if (m->num_labels == 1) cJSON_AddStringToObject(root, "problem_type", "regression");
    }
    return root;
}

static cJSON *state_json(const train_model *m, const train_state *s) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddStringToObject(root, "format", STATE_FORMAT);
    cJSON_AddStringToObject(root, "task", TASK_NAMES[m->task]);
    cJSON_AddNumberToObject(root, "num_labels", m->num_labels);
    cJSON_AddNumberToObject(root, "step", (double)m->step);
    cJSON *o = cJSON_AddObjectToObject(root, "optimizer");
    cJSON_AddStringToObject(o, "name", OPT_NAMES[s->kind]);
    cJSON_AddItemToObject(o, "lr", float_json(s->opt.lr));
    cJSON_AddItemToObject(o, "beta1", float_json(s->opt.beta1));
    cJSON_AddItemToObject(o, "beta2", float_json(s->opt.beta2));
    cJSON_AddItemToObject(o, "eps", float_json(s->opt.eps));
    cJSON_AddItemToObject(o, "weight_decay", float_json(s->opt.weight_decay));
    cJSON_AddItemToObject(o, "max_grad_norm", float_json(s->opt.max_grad_norm));
    cJSON_AddItemToObject(root, "dropout", float_json(s->dropout));
    cJSON_AddItemToObject(root, "attention_dropout", float_json(s->attention_dropout));
    /* doubles as the shortest decimals that read back to the same double */
    cJSON *sc = cJSON_AddObjectToObject(root, "schedule");
    cJSON_AddStringToObject(sc, "kind", train_schedule_kind_name(s->schedule.kind));
    cJSON_AddItemToObject(sc, "lr", double_json(s->schedule.lr));
    cJSON_AddNumberToObject(sc, "warmup_steps", (double)s->schedule.warmup_steps);
    cJSON_AddNumberToObject(sc, "total_steps", (double)s->schedule.total_steps);
    cJSON_AddItemToObject(sc, "lr_end", double_json(s->schedule.lr_end));
    cJSON_AddItemToObject(sc, "power", double_json(s->schedule.power));
    cJSON *d = cJSON_AddObjectToObject(root, "data");
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, s->data_seed); // a string: JSON numbers are doubles
    cJSON_AddStringToObject(d, "seed", seed);
    cJSON_AddNumberToObject(d, "epoch", s->epoch);
    cJSON_AddNumberToObject(d, "window", s->window);
    cJSON_AddNumberToObject(d, "cursor", s->cursor);
    cJSON_AddNumberToObject(d, "stream_buffer", (double)s->stream_buffer);
    cJSON_AddNumberToObject(d, "epochs", s->epochs);
    cJSON_AddNumberToObject(d, "batch_tokens", s->batch_tokens);
    cJSON_AddNumberToObject(d, "batch_seqs", s->batch_seqs);
    cJSON_AddBoolToObject(d, "whole_word_mask", s->whole_word != 0);
    cJSON_AddBoolToObject(d, "pack_lines", s->pack_lines != 0);
    if (s->metric != TRAIN_METRIC_NONE) {
        /* the metrics read back exactly, so a resumed run picks the best as one that did not
         * stop; "best" is derived from them, for readers */
        cJSON_AddStringToObject(root, "eval_metric", METRIC_NAMES[s->metric]);
        cJSON *list = cJSON_AddArrayToObject(root, "evaluations");
        for (int32_t i = 0; i < s->n_evals && list; i++) {
            const train_eval *e = &s->evals[i];
            cJSON *item = cJSON_CreateObject();
            if (!item || !cJSON_AddItemToArray(list, item)) {
                cJSON_Delete(item);
                break;
            }
            cJSON_AddNumberToObject(item, "step", (double)e->step);
            cJSON_AddNumberToObject(item, "epoch", e->epoch);
            cJSON_AddItemToObject(item, "eval_loss", double_json(e->loss));
            if (e->accuracy >= 0) cJSON_AddItemToObject(item, "eval_accuracy", double_json(e->accuracy));
            cJSON_AddNumberToObject(item, "eval_examples", e->examples);
        }
        const int32_t b = train_state_best(s);
        if (b >= 0) {
            cJSON *best = cJSON_AddObjectToObject(root, "best");
            cJSON_AddStringToObject(best, "metric", METRIC_NAMES[s->metric]);
            cJSON_AddNumberToObject(best, "step", (double)s->evals[b].step);
            cJSON_AddItemToObject(best, "value", double_json(s->metric == TRAIN_METRIC_ACCURACY
                                                                 ? s->evals[b].accuracy
                                                                 : s->evals[b].loss));
        }
    }
    return root;
}

/* optimizer.safetensors: "exp_avg.<name>" for every tensor, then "exp_avg_sq.<name>". */
static nopad_status write_moments(const train_model *m, const char *dir) {
    static const char *const kinds[2] = {"exp_avg.", "exp_avg_sq."};
    const size_t n = (size_t)m->n_params;
    float *both = malloc(2 * n * sizeof *both);
    if (!both) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
    nopad_status st = m->be->download(m->be, both, m->adam_m, n * sizeof(float));
    if (st == NOPAD_OK) st = m->be->download(m->be, both + n, m->adam_v, n * sizeof(float));
    if (st == NOPAD_OK) st = write_safetensors(m, both, kinds, 2, dir, "optimizer.safetensors");
    free(both);
    return st;
}

/* model.safetensors (the float32 master weights) and config.json: what nopad and HF load. */
static nopad_status write_weights(const train_model *m, const char *dir) {
    const size_t n = (size_t)m->n_params;
    float *host = malloc(n * sizeof *host);
    if (!host) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
    nopad_status st = m->be->download(m->be, host, m->params, n * sizeof(float));
    static const char *const plain[1] = {""};
    if (st == NOPAD_OK) st = write_safetensors(m, host, plain, 1, dir, "model.safetensors");
    free(host);
    if (st == NOPAD_OK) {
        cJSON *config = config_json(m);
        st = write_json(dir, "config.json", config);
        cJSON_Delete(config);
    }
    return st;
}

nopad_status train_checkpoint_save(const train_model *m, const train_state *state, const char *dir,
                                   const char *tokenizer_from) {
    if (!m || !state || !dir || !m->params)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_checkpoint_save: NULL argument");
    if ((unsigned)state->kind > TRAIN_OPT_LAMB)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "train_checkpoint_save: unknown optimizer %d", (int)state->kind);
    if ((unsigned)state->schedule.kind > TRAIN_SCHEDULE_CONSTANT)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_checkpoint_save: unknown "
                               "schedule %d", (int)state->schedule.kind);
    struct stat sb;
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return nopad_set_error(NOPAD_ERR_IO, "%s: not a folder", dir);
    char stage[4096];
    nopad_status st = folder_stage_begin(dir, stage, sizeof stage);
    if (st != NOPAD_OK) return st;
    st = write_weights(m, stage);
    if (st == NOPAD_OK) st = write_moments(m, stage);
    if (st == NOPAD_OK) {
        cJSON *s = state_json(m, state);
        st = write_json(stage, "trainer_state.json", s);
        cJSON_Delete(s);
    }
    if (st == NOPAD_OK && tokenizer_from)
        st = copy_files(tokenizer_from, stage, TRAIN_TOKENIZER_FILES, TRAIN_N_TOKENIZER_FILES);
    if (st == NOPAD_OK) return folder_stage_commit(dir, stage);
    folder_stage_abort(stage);
    return st;
}

/* ---- reading --------------------------------------------------------------------------------- */

static nopad_status get_number(const cJSON *obj, const char *key, const char *where, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: no \"%s\" field", where, key);
    if (!cJSON_IsNumber(v)) return json_wrong_type(where, key, "a number", v);
    if (!isfinite(v->valuedouble))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: \"%s\" is not finite", where, key);
    *out = v->valuedouble;
    return NOPAD_OK;
}

static nopad_status get_string(const cJSON *obj, const char *key, const char *where, const char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: no \"%s\" field", where, key);
    if (!cJSON_IsString(v)) return json_wrong_type(where, key, "a string", v);
    *out = v->valuestring;
    return NOPAD_OK;
}

static nopad_status get_object(const cJSON *obj, const char *key, const char *where, const cJSON **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: no \"%s\" field", where, key);
    if (!cJSON_IsObject(v)) return json_wrong_type(where, key, "an object", v);
    *out = v;
    return NOPAD_OK;
}

/* An integer field in [lo, hi]. */
static nopad_status get_int(const cJSON *obj, const char *key, const char *where, double lo,
                            double hi, double *out) {
    nopad_status st = get_number(obj, key, where, out);
    if (st == NOPAD_OK && (*out != floor(*out) || *out < lo || *out > hi))
        st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: \"%s\" is %g, expected an integer in [%.0f, %.0f]",
                             where, key, *out, lo, hi);
    return st;
}

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        nopad_status st_ = (expr);                                                                 \
        if (st_ != NOPAD_OK) return st_;                                                           \
    } while (0)

/* The format and the task, read before the weights: another task's folder is named as such, not
 * as a head tensor the load misses. */
static nopad_status check_state_header(const cJSON *root, const char *where, train_task task) {
    if (!cJSON_IsObject(root)) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: not a JSON object", where);
    const char *text = NULL;
    TRY(get_string(root, "format", where, &text));
    int known = !strcmp(text, STATE_FORMAT);
    for (int i = 0; i < N_OLDER_FORMATS; i++) known |= !strcmp(text, OLDER_FORMATS[i]);
    if (!known)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: format \"%.64s\", expected \"%s\" "
                               "(or \"%s\", \"%s\", \"%s\")", where, text, STATE_FORMAT,
                               OLDER_FORMATS[0], OLDER_FORMATS[1], OLDER_FORMATS[2]);
    TRY(get_string(root, "task", where, &text));
    if (strcmp(text, TASK_NAMES[task]) != 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s: the checkpoint is of task \"%.32s\", not \"%s\"", where, text,
                               TASK_NAMES[task]);
    return NOPAD_OK;
}

static nopad_status parse_schedule(const cJSON *root, const char *where, train_schedule *out) {
    const cJSON *sc = NULL;
    const char *text = NULL;
    double v = 0;
    TRY(get_object(root, "schedule", where, &sc));
    TRY(get_string(sc, "kind", where, &text));
    if (train_schedule_kind_from_name(text, &out->kind) != 0)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: schedule \"%.32s\", expected linear, "
                               "polynomial or constant", where, text);
    TRY(get_number(sc, "lr", where, &out->lr));
    TRY(get_int(sc, "warmup_steps", where, 0, 9007199254740992.0, &v));
    out->warmup_steps = (int64_t)v;
    TRY(get_int(sc, "total_steps", where, 0, 9007199254740992.0, &v));
    out->total_steps = (int64_t)v;
    TRY(get_number(sc, "lr_end", where, &out->lr_end));
    TRY(get_number(sc, "power", where, &out->power));
    if (out->lr < 0 || out->lr_end < 0)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: schedule learning rates %g and %g, expected "
                               ">= 0", where, out->lr, out->lr_end);
    return NOPAD_OK;
}

/* "eval_metric" and "evaluations" (absent: none recorded); into s->evals, which the caller frees. */
static nopad_status parse_evals(const cJSON *root, const char *where, train_state *s) {
    s->metric = TRAIN_METRIC_NONE;
    if (!cJSON_GetObjectItemCaseSensitive(root, "eval_metric")) return NOPAD_OK;
    const char *text = NULL;
    TRY(get_string(root, "eval_metric", where, &text));
    if (!strcmp(text, "loss")) s->metric = TRAIN_METRIC_LOSS;
    else if (!strcmp(text, "accuracy")) s->metric = TRAIN_METRIC_ACCURACY;
    else
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: eval_metric \"%.32s\", expected loss or "
                               "accuracy", where, text);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "evaluations");
    if (!list) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: no \"evaluations\" field", where);
    if (!cJSON_IsArray(list)) return json_wrong_type(where, "evaluations", "an array", list);
    const cJSON *item = NULL;
    cJSON_ArrayForEach(item, list) {
        char at[64];
        snprintf(at, sizeof at, "evaluation %d", s->n_evals + 1);
        if (!cJSON_IsObject(item))
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s is not an object", where, at);
        train_eval e = {.accuracy = -1};
        double v = 0;
        TRY(get_int(item, "step", where, 1, 9007199254740992.0, &v));
        e.step = (int64_t)v;
        TRY(get_int(item, "epoch", where, 0, 2147483647.0, &v));
        e.epoch = (int32_t)v;
        TRY(get_int(item, "eval_examples", where, 0, 2147483647.0, &v));
        e.examples = (int32_t)v;
        TRY(get_number(item, "eval_loss", where, &e.loss));
        if (cJSON_GetObjectItemCaseSensitive(item, "eval_accuracy")) {
            TRY(get_number(item, "eval_accuracy", where, &e.accuracy));
            if (!(e.accuracy >= 0 && e.accuracy <= 1))
                return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s: eval_accuracy %g is outside "
                                       "[0, 1]", where, at, e.accuracy);
        } else if (s->metric == TRAIN_METRIC_ACCURACY) {
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s has no \"eval_accuracy\", but the "
                                   "metric is accuracy", where, at);
        }
        if (e.loss < 0)
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s: eval_loss %g is negative", where, at,
                                   e.loss);
        if (s->n_evals > 0 && e.step <= s->evals[s->n_evals - 1].step)
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s: an evaluation at step %lld after one "
                                   "at step %lld", where, at, (long long)e.step,
                                   (long long)s->evals[s->n_evals - 1].step);
        TRY(train_state_add_eval(s, &e));
    }
    return NOPAD_OK;
}

static nopad_status parse_state(const cJSON *root, const char *where, const train_model *m,
                                train_state *s, int64_t *step) {
    const char *text = NULL;
    double v = 0;
    TRY(check_state_header(root, where, m->task));
    TRY(get_int(root, "num_labels", where, 0, 1 << 20, &v));
    if ((int32_t)v != m->num_labels)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: num_labels %g, but the classifier has %d",
                               where, v, m->num_labels);
    TRY(get_int(root, "step", where, 0, 9007199254740992.0, &v));
    *step = (int64_t)v;
    const cJSON *o = NULL, *d = NULL;
    TRY(get_object(root, "optimizer", where, &o));
    TRY(get_string(o, "name", where, &text));
    if (!strcmp(text, "adamw")) s->kind = TRAIN_OPT_ADAMW;
    else if (!strcmp(text, "lamb")) s->kind = TRAIN_OPT_LAMB;
    else
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: optimizer \"%.32s\", expected adamw or lamb",
                               where, text);
    struct { const char *key; float *dst; } fields[] = {
        {"lr", &s->opt.lr}, {"beta1", &s->opt.beta1}, {"beta2", &s->opt.beta2},
        {"eps", &s->opt.eps}, {"weight_decay", &s->opt.weight_decay},
        {"max_grad_norm", &s->opt.max_grad_norm},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        TRY(get_number(o, fields[i].key, where, &v));
        *fields[i].dst = (float)v;
    }
    /* the dropout rates: 0 in states saved before they were recorded (they trained without) */
    struct { const char *key; float *dst; } rates[] = {
        {"dropout", &s->dropout}, {"attention_dropout", &s->attention_dropout},
    };
    for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++) {
        *rates[i].dst = 0;
        if (!cJSON_GetObjectItemCaseSensitive(root, rates[i].key)) continue;
        TRY(get_number(root, rates[i].key, where, &v));
        if (!(v >= 0 && v < 1))
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: \"%s\" %g is outside [0, 1)", where,
                                   rates[i].key, v);
        *rates[i].dst = (float)v;
    }
    TRY(get_object(root, "data", where, &d));
    TRY(get_string(d, "seed", where, &text));
    char *end = NULL;
    errno = 0;
    const unsigned long long seed = strtoull(text, &end, 10);
    if (!*text || *end || errno || text[0] == '-')
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: data seed \"%.32s\" is not a 64-bit unsigned "
                               "decimal", where, text);
    s->data_seed = (uint64_t)seed;
    TRY(get_int(d, "epoch", where, 0, 4294967295.0, &v));
    s->epoch = (uint32_t)v;
    TRY(get_int(d, "cursor", where, 0, 2147483647.0, &v));
    s->cursor = (int32_t)v;
    s->window = 0;
    s->stream_buffer = 0;
    if (cJSON_GetObjectItemCaseSensitive(d, "stream_buffer")) { // absent from -2 states
        TRY(get_int(d, "window", where, 0, 2147483647.0, &v));
        s->window = (int32_t)v;
        TRY(get_int(d, "stream_buffer", where, 0, 9007199254740992.0, &v));
        s->stream_buffer = (int64_t)v;
    }
    struct { const char *key; int32_t *dst; } shape[] = {
        {"epochs", &s->epochs}, {"batch_tokens", &s->batch_tokens}, {"batch_seqs", &s->batch_seqs},
    };
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++) {
        TRY(get_int(d, shape[i].key, where, 0, 2147483647.0, &v));
        *shape[i].dst = (int32_t)v;
    }
    /* absent from states saved before these options existed: they were off */
    struct { const char *key; int *dst; } flags[] = {
        {"whole_word_mask", &s->whole_word}, {"pack_lines", &s->pack_lines},
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(d, flags[i].key);
        if (f && !cJSON_IsBool(f))
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: \"%s\" is not true or false", where, flags[i].key);
        *flags[i].dst = f && cJSON_IsTrue(f);
    }
    TRY(parse_evals(root, where, s));
    return parse_schedule(root, where, &s->schedule);
}

/* The step a safetensors file of a checkpoint records in its metadata; *present 0 when it
 * records none (files saved before nopad-train-5, or not by nopad). */
static nopad_status safetensors_step(const char *path, int64_t *step, int *present) {
    *present = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return nopad_set_error(NOPAD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    uint8_t len8[8];
    uint64_t len = 0;
    char *header = NULL;
    nopad_status st = NOPAD_OK;
    if (fread(len8, 1, 8, f) != 8) st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: shorter than 8 bytes", path);
    for (int i = 0; i < 8 && st == NOPAD_OK; i++) len |= (uint64_t)len8[i] << (8 * i);
    if (st == NOPAD_OK && len > ((uint64_t)1 << 27))
        st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: a %llu-byte header", path, (unsigned long long)len);
    if (st == NOPAD_OK && !(header = malloc((size_t)len + 1)))
        st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    if (st == NOPAD_OK && fread(header, 1, (size_t)len, f) != (size_t)len)
        st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: the header is cut short", path);
    fclose(f);
    cJSON *root = st == NOPAD_OK ? cJSON_ParseWithLength(header, (size_t)len) : NULL;
    free(header);
    if (st == NOPAD_OK && !root) st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: the header is not JSON", path);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, "step");
    if (st == NOPAD_OK && v) {
        char *end = NULL;
        const long long n = cJSON_IsString(v) ? strtoll(v->valuestring, &end, 10) : -1;
        if (n < 0 || !end || end == v->valuestring || *end)
            st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: the metadata's step is not a whole number",
                                 path);
        *step = n;
        *present = 1;
    }
    cJSON_Delete(root);
    return st;
}

/* Every file of the folder must be of trainer_state.json's step: a folder mixing two saves
 * (files copied together, or saved in place by nopad before nopad-train-5 and interrupted)
 * would resume weights of one step with the optimiser or data position of another. */
static nopad_status check_steps(const char *dir, const cJSON *root, const char *where) {
    double v = 0;
    TRY(get_int(root, "step", where, 0, 9007199254740992.0, &v));
    const char *format = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "format"));
    const int recorded = format && !strcmp(format, STATE_FORMAT); /* older files may lack it */
    static const char *const files[] = {"model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        int64_t step = 0;
        int present = 0;
        TRY(safetensors_step(path, &step, &present));
        if (!present && recorded)
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: records no step in its metadata, which "
                                   "a %s checkpoint has: the folder was not written by one save",
                                   path, STATE_FORMAT);
        if (present && step != (int64_t)v)
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: a mix of saves: trainer_state.json is of "
                                   "step %.0f, %s of step %lld; resume from a checkpoint folder "
                                   "written whole", dir, v, files[i], (long long)step);
    }
    return NOPAD_OK;
}

/* The moments from optimizer.safetensors into adam_m and adam_v. */
static nopad_status load_moments(train_model *m, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    safetensors_file f;
    TRY(safetensors_open(path, &f));
    float *host = NULL;
    nopad_status st = NOPAD_OK;
    for (int32_t i = 0; i < m->n_tensors && st == NOPAD_OK; i++) {
        const train_tensor *t = &m->tensors[i];
        for (int k = 0; k < 2 && st == NOPAD_OK; k++) {
            char saved[128], name[160];
            saved_name(m, t->name, saved);
            snprintf(name, sizeof name, "%s.%s", k ? "exp_avg_sq" : "exp_avg", saved);
            const safetensors_tensor *src = safetensors_find(&f, name);
            const int64_t n = t->rows * t->cols;
            if (!src) {
                st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: tensor '%s' is missing", path, name);
                break;
            }
            if (src->dtype != ST_F32 || src->n_elements != n) {
                st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: tensor '%s' is %s of %lld elements, "
                                     "expected F32 of %lld", path, name,
                                     safetensors_dtype_name(src->dtype), (long long)src->n_elements,
                                     (long long)n);
                break;
            }
            float *grown = realloc(host, (size_t)n * sizeof *host);
            if (!grown) {
                st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
                break;
            }
            host = grown;
            st = safetensors_to_f32(src, host);
            if (st == NOPAD_OK)
                st = m->be->upload(m->be, (k ? m->adam_v : m->adam_m) + t->offset, host,
                                   (size_t)n * sizeof(float));
        }
    }
    free(host);
    safetensors_close(&f);
    return st;
}

nopad_status train_checkpoint_load(nopad_backend *be, const char *dir, train_task task,
                                   train_model *out, train_state *state) {
    memset(state, 0, sizeof *state);
    memset(out, 0, sizeof *out);
    char path[4096];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    char *text = NULL;
    size_t len = 0;
    TRY(read_file(path, 1 << 26, &text, &len)); // a history of evaluations is ~100 bytes each
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) return nopad_set_error(NOPAD_ERR_FORMAT, "%s: not valid JSON", path);
    nopad_status st = check_state_header(root, path, task);
    if (st == NOPAD_OK) st = check_steps(dir, root, path);
    int loaded = 0;
    if (st == NOPAD_OK) {
        st = train_model_load(be, dir, task, out);
        loaded = st == NOPAD_OK;
    }
    int64_t step = 0;
    if (st == NOPAD_OK) st = parse_state(root, path, out, state, &step);
    if (st == NOPAD_OK) st = load_moments(out, dir);
    if (st == NOPAD_OK && state->n_evals > 0 && state->evals[state->n_evals - 1].step > step)
        st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: an evaluation at step %lld, past the "
                             "checkpoint's step %lld", path,
                             (long long)state->evals[state->n_evals - 1].step, (long long)step);
    if (st == NOPAD_OK) out->step = step;
    cJSON_Delete(root);
    if (st != NOPAD_OK) train_state_free(state);
    if (st != NOPAD_OK && loaded) train_model_free(out);
    return st;
}

/* ---- the weights alone (a run's best evaluation) --------------------------------------------- */

nopad_status train_checkpoint_save_weights(const train_model *m, const train_eval *e,
                                           train_metric metric, const char *dir,
                                           const char *tokenizer_from) {
    if (!m || !e || !dir || !m->params)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "train_checkpoint_save_weights: NULL argument");
    char stage[4096];
    nopad_status st = folder_stage_begin(dir, stage, sizeof stage);
    if (st != NOPAD_OK) return st;
    st = write_weights(m, stage);
    if (st == NOPAD_OK) {
        cJSON *r = cJSON_CreateObject();
        if (r) {
            cJSON_AddNumberToObject(r, "step", (double)e->step);
            cJSON_AddNumberToObject(r, "epoch", e->epoch);
            cJSON_AddItemToObject(r, "eval_loss", double_json(e->loss));
            if (e->accuracy >= 0) cJSON_AddItemToObject(r, "eval_accuracy", double_json(e->accuracy));
            cJSON_AddNumberToObject(r, "eval_examples", e->examples);
            cJSON_AddStringToObject(r, "metric", train_metric_name(metric));
        }
        st = write_json(stage, "eval_results.json", r);
        cJSON_Delete(r);
    }
    if (st == NOPAD_OK && tokenizer_from)
        st = copy_files(tokenizer_from, stage, TRAIN_TOKENIZER_FILES, TRAIN_N_TOKENIZER_FILES);
    if (st == NOPAD_OK) return folder_stage_commit(dir, stage);
    folder_stage_abort(stage);
    return st;
}

nopad_status train_checkpoint_weights_step(const char *dir, int64_t *step) {
    char path[4096];
    snprintf(path, sizeof path, "%s/eval_results.json", dir);
    char *text = NULL;
    size_t len = 0;
    TRY(read_file(path, 1 << 20, &text, &len));
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: not a JSON object", path);
    }
    double v = 0;
    nopad_status st = get_int(root, "step", path, 0, 9007199254740992.0, &v);
    cJSON_Delete(root);
    if (st == NOPAD_OK) *step = (int64_t)v;
    return st;
}

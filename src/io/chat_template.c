/* Reading a model's chat template text (see chat_template.h). */
#include "io/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/json.h"
#include "util/error.h"
#include "util/file.h"

static nopad_status copy_text(const char *text, size_t len, const char *where, char **out) {
    if (memchr(text, '\0', len))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: the chat template holds a NUL byte", where);
    *out = malloc(len + 1);
    if (!*out) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", where);
    memcpy(*out, text, len);
    (*out)[len] = '\0';
    return NOPAD_OK;
}

nopad_status chat_template_from_gguf(const gguf_file *f, char **out) {
    *out = NULL;
    if (!gguf_find(f, "tokenizer.chat_template")) return NOPAD_OK;
    gguf_str s;
    nopad_status st = gguf_get_str(f, "tokenizer.chat_template", &s);
    if (st != NOPAD_OK) return st;
    return copy_text(s.data, (size_t)s.len, f->path, out);
}

/* tokenizer_config.json's "chat_template": a string, or [{"name", "template"}, ...]. */
static nopad_status from_config(const char *path, char **out) {
    char *data;
    size_t len;
    nopad_status st = read_file(path, 0, &data, &len);
    if (st != NOPAD_OK) return st;
    cJSON *root = cJSON_ParseWithLength(data, len);
    free(data);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: not a JSON object", path);
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    if (cJSON_IsArray(t)) {
        const cJSON *entry, *found = NULL;
        cJSON_ArrayForEach(entry, t) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(entry, "name");
            if (cJSON_IsString(name) && strcmp(name->valuestring, "default") == 0)
                found = cJSON_GetObjectItemCaseSensitive(entry, "template");
        }
        if (!found) {
            cJSON_Delete(root);
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: \"chat_template\" is a list without an entry named "
                                   "\"default\"",
                                   path);
        }
        t = found;
    }
    if (t && !cJSON_IsNull(t) && !cJSON_IsString(t)) {
        st = json_wrong_type(path, "chat_template", "a string", t);
        cJSON_Delete(root);
        return st;
    }
    st = cJSON_IsString(t) ? copy_text(t->valuestring, strlen(t->valuestring), path, out) : NOPAD_OK;
    cJSON_Delete(root);
    return st;
}

nopad_status chat_template_from_folder(const char *dir, char **out) {
    *out = NULL;
    size_t n = strlen(dir) + sizeof "/tokenizer_config.json";
    char *path = malloc(n);
    if (!path) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
    nopad_status st = NOPAD_OK;
    snprintf(path, n, "%s/chat_template.jinja", dir);
    if (file_exists(path)) {
        size_t len;
        st = read_file(path, 0, out, &len);
        if (st == NOPAD_OK && strlen(*out) != len) {
            free(*out);
            *out = NULL;
            st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: the chat template holds a NUL byte", path);
        }
    } else {
        snprintf(path, n, "%s/tokenizer_config.json", dir);
        if (file_exists(path)) st = from_config(path, out);
    }
    free(path);
    return st;
}

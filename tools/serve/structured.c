/* response_format {"type": "json_object"} / {"type": "json_schema", "json_schema": {"schema": ...}}
 * and vLLM's guided_json (a schema, as an object or its text), guided_regex and guided_choice, to
 * a nopad_constraint (the engine then masks every step to the documents it allows). */
#include "structured.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID "invalid_request_error"

/* JSON null counts as absent, as the OpenAI API treats it. */
static const cJSON *field(const cJSON *obj, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* The library's refusal of a schema, regex or choice list as a 400 on `param`. */
static int refused(api_error *e, nopad_status st, const char *param) {
    return api_fail(e, 400, INVALID, st == NOPAD_ERR_UNSUPPORTED ? "unsupported_value" : "invalid_value", param,
                    "'%s': %s", param, nopad_last_error());
}

/* A schema given as a JSON object (or, for guided_json, its text). */
static int from_schema(const cJSON *schema, const char *param, nopad_constraint **out, api_error *e) {
    if (cJSON_IsString(schema)) {
        const nopad_status st = nopad_constraint_json_schema(schema->valuestring, strlen(schema->valuestring), out);
        return st == NOPAD_OK ? 0 : refused(e, st, param);
    }
    if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return api_fail(e, 400, INVALID, "invalid_type", param, "'%s' must be a JSON schema (an object)", param);
    char *text = cJSON_PrintUnformatted(schema);
    if (!text) return api_fail(e, 500, "server_error", NULL, param, "out of memory");
    const nopad_status st = nopad_constraint_json_schema(text, strlen(text), out);
    cJSON_free(text);
    return st == NOPAD_OK ? 0 : refused(e, st, param);
}

/* A format object, chat's response_format or /v1/responses' text.format (`param`): {"type": "text"},
 * {"type": "json_object"} or {"type": "json_schema", ...} with the schema at json_schema.schema
 * (response_format) or at schema (text.format): schema_path. */
static int from_format(const cJSON *v, const char *param, const char *schema_path, nopad_constraint **out,
                       api_error *e) {
    char where[64];
    const cJSON *type = cJSON_IsObject(v) ? field(v, "type") : NULL;
    if (!cJSON_IsString(type))
        return api_fail(e, 400, INVALID, "invalid_type", param,
                        "'%s' must be an object with a string 'type' (\"text\", \"json_object\" or "
                        "\"json_schema\")", param);
    if (!strcmp(type->valuestring, "text")) return 0;
    if (!strcmp(type->valuestring, "json_object")) {
        const nopad_status st = nopad_constraint_json_object(out);
        return st == NOPAD_OK ? 0 : refused(e, st, param);
    }
    if (!strcmp(type->valuestring, "json_schema")) {
        /* schema_path: "json_schema.schema" or "schema", one or two keys down */
        const char *dot = strchr(schema_path, '.');
        const cJSON *schema = v;
        if (dot) {
            char outer[32];
            snprintf(outer, sizeof outer, "%.*s", (int)(dot - schema_path), schema_path);
            schema = field(schema, outer);
        }
        schema = cJSON_IsObject(schema) ? field(schema, dot ? dot + 1 : schema_path) : NULL;
        snprintf(where, sizeof where, "%s.%s", param, schema_path);
        if (!schema)
            return api_fail(e, 400, INVALID, "invalid_value", where,
                            "'%s' of type \"json_schema\" needs '%s'", param, schema_path);
        /* strict or not, the output follows the schema: nopad never samples outside it */
        return from_schema(schema, where, out, e);
    }
    snprintf(where, sizeof where, "%s.type", param);
    return api_fail(e, 400, INVALID, "unsupported_value", where,
                    "'%s' type \"%s\" is not supported (\"text\", \"json_object\" or \"json_schema\")", param,
                    type->valuestring);
}

static int from_choices(const cJSON *v, nopad_constraint **out, api_error *e) {
    const int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
    if (n < 1)
        return api_fail(e, 400, INVALID, "invalid_value", "guided_choice",
                        "'guided_choice' must be a non-empty list of strings");
    const char **choices = malloc((size_t)n * sizeof *choices);
    if (!choices) return api_fail(e, 500, "server_error", NULL, "guided_choice", "out of memory");
    int i = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, v) {
        if (!cJSON_IsString(c)) {
            free(choices);
            return api_fail(e, 400, INVALID, "invalid_type", "guided_choice",
                            "'guided_choice' item %d is not a string", i);
        }
        choices[i++] = c->valuestring;
    }
    const nopad_status st = nopad_constraint_choices(choices, n, out);
    free(choices);
    return st == NOPAD_OK ? 0 : refused(e, st, "guided_choice");
}

int structured_constraint(const cJSON *body, nopad_constraint **out, api_error *e) {
    *out = NULL;
    const cJSON *rf = field(body, "response_format"), *gj = field(body, "guided_json"),
                *gr = field(body, "guided_regex"), *gc = field(body, "guided_choice");
    const cJSON *rf_type = cJSON_IsObject(rf) ? field(rf, "type") : NULL;
    const int rf_constrains = rf && !(cJSON_IsString(rf_type) && !strcmp(rf_type->valuestring, "text"));
    if (rf_constrains + !!gj + !!gr + !!gc > 1)
        return api_fail(e, 400, INVALID, "invalid_value", gj ? "guided_json" : gr ? "guided_regex" : "guided_choice",
                        "give at most one of response_format (other than text), guided_json, guided_regex and "
                        "guided_choice");
    if (rf) return from_format(rf, "response_format", "json_schema.schema", out, e);
    if (gj) return from_schema(gj, "guided_json", out, e);
    if (gc) return from_choices(gc, out, e);
    if (gr) {
        if (!cJSON_IsString(gr))
            return api_fail(e, 400, INVALID, "invalid_type", "guided_regex", "'guided_regex' must be a string");
        const nopad_status st = nopad_constraint_regex(gr->valuestring, strlen(gr->valuestring), out);
        return st == NOPAD_OK ? 0 : refused(e, st, "guided_regex");
    }
    return 0;
}

int structured_text_format(const cJSON *format, nopad_constraint **out, api_error *e) {
    *out = NULL;
    return from_format(format, "text.format", "schema", out, e);
}

/* ---- tool_choice "required" / a named function ---------------------------------------------- */

/* 1 when every $ref in v points into the schema's $defs / definitions, which a tool's call schema
 * carries at its root (a "#" or "#/properties/..." pointer would mean something else there). */
static int refs_into_defs(const cJSON *v, const char **bad) {
    for (const cJSON *c = v ? v->child : NULL; c; c = c->next) {
        if (c->string && !strcmp(c->string, "$ref") && cJSON_IsString(c) &&
            strncmp(c->valuestring, "#/$defs/", 8) && strncmp(c->valuestring, "#/definitions/", 14)) {
            *bad = c->valuestring;
            return 0;
        }
        if ((cJSON_IsObject(c) || cJSON_IsArray(c)) && !refs_into_defs(c, bad)) return 0;
    }
    return 1;
}

/* The schema of one call of a tool: {"name": its name, <args_key>: its parameters}, the
 * parameters' $defs / definitions moved to the root so that their $ref still resolve. Parameters
 * absent or {}: no arguments ({}), as OpenAI reads them. NULL when out of memory. */
static char *call_schema(const char *name, const cJSON *params, const char *args_key) {
    cJSON *args = params && params->child ? cJSON_Duplicate(params, 1)
                         : cJSON_Parse("{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}");
    cJSON *s = cJSON_CreateObject(), *props = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    cJSON *required = cJSON_CreateArray();
    char *text = NULL;
    if (args && s && props && fn && required) {
        cJSON *defs = cJSON_DetachItemFromObjectCaseSensitive(args, "$defs");
        cJSON *definitions = cJSON_DetachItemFromObjectCaseSensitive(args, "definitions");
        cJSON_AddStringToObject(s, "type", "object");
        cJSON_AddStringToObject(fn, "const", name);
        cJSON_AddItemToObject(props, "name", fn), fn = NULL;
        cJSON_AddItemToObject(props, args_key, args), args = NULL;
        cJSON_AddItemToObject(s, "properties", props), props = NULL;
        cJSON_AddItemToArray(required, cJSON_CreateString("name"));
        cJSON_AddItemToArray(required, cJSON_CreateString(args_key));
        cJSON_AddItemToObject(s, "required", required), required = NULL;
        cJSON_AddFalseToObject(s, "additionalProperties");
        if (defs) cJSON_AddItemToObject(s, "$defs", defs);
        if (definitions) cJSON_AddItemToObject(s, "definitions", definitions);
        text = cJSON_PrintUnformatted(s);
    }
    cJSON_Delete(args), cJSON_Delete(s), cJSON_Delete(props), cJSON_Delete(fn), cJSON_Delete(required);
    return text;
}

int structured_tool_choice(const gen_request *r, chat_tool_format format, nopad_constraint **out,
                           api_error *e) {
    if (*out)
        return api_fail(e, 400, INVALID, "invalid_value", "tool_choice",
                        "'tool_choice' %s makes the answer tool calls: it cannot be combined with a "
                        "structured output (response_format, guided_* or text.format)",
                        r->tool_choice_named >= 0 ? "naming a function" : "\"required\"");
    const int first = r->tool_choice_named >= 0 ? r->tool_choice_named : 0;
    const int n = r->tool_choice_named >= 0 ? 1 : r->n_tools;
    char **schemas = calloc((size_t)n, sizeof *schemas);
    if (!schemas) return api_fail(e, 500, "server_error", NULL, "tools", "out of memory");
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const int k = first + i;
        char param[64];
        snprintf(param, sizeof param,
                 r->kind == GEN_RESPONSES ? "tools[%d].parameters" : "tools[%d].function.parameters", k);
        /* the definition: {"type", "function": {"name", "description", "parameters"}} */
        cJSON *def = cJSON_Parse(r->tools[k].json);
        const cJSON *params = field(field(def, "function"), "parameters");
        const char *bad_ref = NULL;
        nopad_constraint *alone = NULL;
        if (!def) {
            rc = api_fail(e, 500, "server_error", NULL, "tools", "out of memory");
        } else if (params && !refs_into_defs(params, &bad_ref)) {
            rc = api_fail(e, 400, INVALID, "unsupported_value", param,
                          "'%s': a $ref to \"%.100s\" is not supported with tool_choice: only refs into the "
                          "parameters' $defs or definitions", param, bad_ref);
        } else if (params && from_schema(params, param, &alone, e)) {
            rc = -1; /* compiled alone first: the error names the keyword by its path in them */
        } else if (!(schemas[i] = call_schema(r->tools[k].name, params,
                                              format == TOOLS_LLAMA3 ? "parameters" : "arguments"))) {
            rc = api_fail(e, 500, "server_error", NULL, "tools", "out of memory");
        }
        nopad_constraint_free(alone);
        cJSON_Delete(def);
    }
    if (!rc) {
        /* the families' own call syntax (tool_calls.h), one call or, with parallel calls under
         * "required", any number */
        const int32_t max = r->tool_choice_named < 0 && r->parallel_tool_calls ? -1 : 1;
        const char *open = format == TOOLS_HERMES ? "<tool_call>\n" : format == TOOLS_MISTRAL ? "[" : "";
        const char *sep = format == TOOLS_HERMES    ? "\n</tool_call>\n<tool_call>\n"
                          : format == TOOLS_MISTRAL ? ", "
                                                    : ";";
        const char *close = format == TOOLS_HERMES ? "\n</tool_call>" : format == TOOLS_MISTRAL ? "]" : "";
        const nopad_status st =
            nopad_constraint_json_sequence((const char *const *)schemas, n, open, sep, close, 1, max, out);
        if (st != NOPAD_OK) rc = refused(e, st, "tools");
    }
    for (int i = 0; i < n; i++) cJSON_free(schemas[i]);
    free(schemas);
    return rc;
}

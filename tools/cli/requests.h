/* `nopad generate`'s request-file mode (requests.c): JSON lines of requests through the engine,
 * JSON lines of results in completion order. */
#ifndef NOPAD_TOOLS_CLI_REQUESTS_H
#define NOPAD_TOOLS_CLI_REQUESTS_H

#include <stdint.h>

#include "nopad.h"

typedef struct requests_options {
    const char *model;
    const char *input_path;   /* NULL: stdin */
    const char *output_path;  /* NULL: stdout */
    /* defaults for what a line leaves out */
    long max_tokens, top_k;
    double temperature, top_p, min_p, repetition_penalty;
    uint64_t seed;
    int ignore_eos;
    /* the engine */
    int32_t kv_tokens, max_running, step_tokens;
    nopad_device device;
    nopad_dtype dtype;        /* resolved: fp32 on the CPU, fp16 on CUDA unless given */
    nopad_weights weights;    /* --weights */
    int threads;
    int32_t tp;               /* --tp: ranks the model is split over */
} requests_options;

/* What the model is loaded with, on rank 0 and (--tp) every other rank alike. */
nopad_model_params requests_model_params(const requests_options *o);

/* Runs the file; the process exit status (1 when a line failed or a write failed). */
int generate_requests(const requests_options *o);

#endif

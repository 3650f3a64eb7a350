/* What every `nopad` subcommand shares: exit codes, error messages, option parsing (getopt_long
 * with nopad's rules and messages), option values, model loading, growable buffers.
 *
 * A subcommand is one file defining `int cmd_NAME(int argc, char **argv)`, where argv[0] is the
 * subcommand's name and the return value is the process exit status; main.c lists it in its
 * table. The CLI uses the public API only (include/nopad.h). */
#ifndef NOPAD_TOOLS_CLI_H
#define NOPAD_TOOLS_CLI_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>

#include "nopad.h"

enum { EXIT_OK = 0, EXIT_ERROR = 1, EXIT_USAGE = 2 };

#if defined(__GNUC__)
#define PRINTF_LIKE(a, b) __attribute__((format(printf, a, b)))
#else
#define PRINTF_LIKE(a, b)
#endif

/* The subcommands (main.c's table). */
int cmd_embed(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_serve(int argc, char **argv); /* tools/serve/serve.c */
int cmd_train(int argc, char **argv);
int cmd_classify(int argc, char **argv); /* classify.c */
int cmd_rerank(int argc, char **argv);   /* classify.c */

/* ---- messages ---------------------------------------------------------------------------- */

/* Set while a progress line without its newline is on stderr, so that a message starts afresh. */
extern int progress_line_open;

/* "nopad: error: <message>" on stderr. */
void print_error(const char *fmt, ...) PRINTF_LIKE(1, 2);

/* The library's message for a failed call, or the status name when it left none. */
const char *library_error(nopad_status status);

/* ---- command-line parsing ---------------------------------------------------------------- */

/* Why cli_getopt stopped at an argument. */
typedef enum cli_opt_error {
    CLI_OPT_UNKNOWN,      /* not an option of this command (or an abbreviated one) */
    CLI_OPT_TAKES_NO_VALUE, /* "--flag=VALUE" */
    CLI_OPT_NEEDS_VALUE,  /* "--name" last, without its value */
    CLI_OPT_UNEXPECTED,   /* a positional argument: no subcommand takes any yet */
} cli_opt_error;

/* getopt_long over a subcommand's argv (argv[0] its name), with nopad's rules: long options are
 * spelled out in full ("--name VALUE" or "--name=VALUE"; getopt's abbreviations are refused),
 * the only short option is "-h", which stands alone, options stop at the first positional
 * argument, and "--" is no option. Each subcommand's `options` lists {"help", no_argument, NULL,
 * 'h'} among its own. getopt prints nothing; the caller words the messages. */
typedef struct cli_parser {
    int argc;
    char **argv;
    const struct option *options; /* ends with a zero entry */
    /* after CLI_BAD: */
    cli_opt_error error;
    const char *arg;  /* the argument in question, whole */
    int name_len;     /* the length of its name: arg up to any '=' */
} cli_parser;

enum { CLI_BAD = -2 };

/* Starts parsing argv[1..argc-1]. */
cli_parser cli_parser_start(int argc, char **argv, const struct option *options);

/* The next option's `val` (its value, if any, in optarg), -1 after the last one, or CLI_BAD with
 * p->error, p->arg and p->name_len set. */
int cli_getopt(cli_parser *p);

/* Reports a CLI_BAD with print_error, in the words embed and info have always used. */
void cli_print_opt_error(const cli_parser *p);

/* Option values. Each parse_* prints why it fails and returns -1, else stores and returns 0. */
int parse_int(const char *name, const char *s, long lo, long hi, long *out); /* whole decimal */
int parse_float(const char *name, const char *s, double *out);  /* a finite decimal number */
int parse_u64(const char *name, const char *s, uint64_t *out);  /* whole decimal, unsigned */
int parse_pooling(const char *s, nopad_pooling *out); /* cls, mean, max, none */
int parse_device(const char *s, nopad_device *out);   /* cpu, cuda */
int parse_dtype(const char *s, nopad_dtype *out);     /* fp32, fp16, bf16 */
/* The same look-ups without a message. */
int device_from_name(const char *s, nopad_device *out);
int dtype_from_name(const char *s, nopad_dtype *out);
const char *pooling_name(nopad_pooling p);

/* ---- shared helpers ---------------------------------------------------------------------- */

/* Loads `dir` (a model folder or a GGUF file), or prints why not and returns NULL. Without
 * dtype_given the CPU computes in fp32, the GPU in fp16. */
nopad_model *open_model(const char *dir, nopad_device device, nopad_dtype dtype, int dtype_given,
                        int n_threads);
/* The same with every load parameter given. */
nopad_model *open_model_with(const char *path, const nopad_model_params *params);
/* Whether a loaded model is a decoder (nopad generate) rather than an encoder (nopad embed). */
int model_is_decoder(const nopad_model *model);

/* Makes room for `n` elements of `size` bytes in *buf (capacity *cap elements), or prints "out
 * of memory" and returns -1. */
int reserve(void **buf, size_t *cap, size_t n, size_t size);

/* CLOCK_MONOTONIC in seconds. */
double now_seconds(void);

#endif

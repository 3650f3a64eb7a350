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
int parse_weights(const char *s, nopad_weights *out); /* auto, native, f32, f16, bf16, fp8 */
/* The same look-ups without a message. */
int device_from_name(const char *s, nopad_device *out);
int dtype_from_name(const char *s, nopad_dtype *out);
const char *pooling_name(nopad_pooling p);

/* ---- shared helpers ---------------------------------------------------------------------- */

/* The load parameters of the commands' --device, --dtype and --threads. Without dtype_given the
 * CPU computes in fp32, the GPU in fp16. */
nopad_model_params model_params(nopad_device device, nopad_dtype dtype, int dtype_given, int n_threads);
/* Loads `dir` (a model folder or a GGUF file) with model_params(...), or prints why not and
 * returns NULL. */
nopad_model *open_model(const char *dir, nopad_device device, nopad_dtype dtype, int dtype_given,
                        int n_threads);
/* The same with every load parameter given. */
nopad_model *open_model_with(const char *path, const nopad_model_params *params);
/* Whether a loaded model is a decoder (nopad generate) rather than an encoder (nopad embed). */
int model_is_decoder(const nopad_model *model);

/* ---- tensor parallelism (--tp N, docs/parallel.md) ---------------------------------------- */

/* The process's own command line, as main() got it (main.c sets it): --tp restarts it under
 * mpirun. */
extern char **cli_argv;

/* The help line of --tp, the same in every command that takes it. */
#define TP_HELP                                                                                    \
    "  --tp N                  split the model over N processes (tensor parallelism; one per GPU\n" \
    "                          with --device cuda); without a launcher nopad starts them under\n" \
    "                          mpirun itself (docs/parallel.md). Default 1\n"
enum { TP_MAX = 1024 };

/* Where this process stands in a --tp N run. Returns its rank in the launcher's world: 0 loads the
 * model with tp_size N and runs the command (alone when N is 1); > 0 calls tp_follow. Without a
 * launcher and N > 1 it does not return: it execs `mpirun -np N ... <this binary> <cli_argv>`.
 * -1 after an error (printed): no mpirun, a world of another size. */
int tp_begin(long tp, nopad_device device);

/* Execs `mpirun -np n --bind-to none [--oversubscribe on the CPU] [--allow-run-as-root] <this
 * binary> <cli_argv after argv[0]>` (mpirun is $NOPAD_MPIRUN, else the first on PATH); returns only
 * after a failure, printed with `flag` (the option asking for n processes: --tp, --nproc). */
void start_under_mpirun(const char *flag, long n, nopad_device device);

/* A rank > 0: loads its shard of the model at `path` with `params` (exactly those rank 0 loads
 * with) and runs the steps rank 0 sends until rank 0 frees the model. Prints nothing unless it
 * fails; returns the exit status. */
int tp_follow(const char *path, const nopad_model_params *params);

/* Where the process's own binary is (/proc/self/exe resolved), or -1. */
int self_path(char *out, size_t cap);

/* Makes room for `n` elements of `size` bytes in *buf (capacity *cap elements), or prints "out
 * of memory" and returns -1. */
int reserve(void **buf, size_t *cap, size_t n, size_t size);

/* CLOCK_MONOTONIC in seconds. */
double now_seconds(void);

#endif

/* The helpers of cli.h: messages, option parsing, option values, model loading, buffers. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- messages ---------------------------------------------------------------------------- */

int progress_line_open;

void print_error(const char *fmt, ...) {
    /* One write of the whole line: under a launcher every rank's stderr goes to one terminal,
     * where pieces of two messages would interleave. A rank other than 0 says whose it is. */
    char line[8192];
    int n = snprintf(line, sizeof line, "%snopad: error: ", progress_line_open ? "\n" : "");
    if (nopad_world_size() > 1 && nopad_world_rank() > 0)
        n += snprintf(line + n, sizeof line - (size_t)n, "rank %d: ", (int)nopad_world_rank());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    progress_line_open = 0;
    fprintf(stderr, "%s\n", line);
}

const char *library_error(nopad_status status) {
    const char *message = nopad_last_error();
    return message && message[0] ? message : nopad_status_string(status);
}

/* ---- command-line parsing ---------------------------------------------------------------- */

cli_parser cli_parser_start(int argc, char **argv, const struct option *options) {
    optind = 0; /* glibc: start afresh */
    opterr = 0; /* the caller words the messages */
    return (cli_parser){.argc = argc, .argv = argv, .options = options};
}

/* Whether `arg` is "--NAME" or "--NAME=...", NAME spelled out in full. */
static int spells(const char *arg, const char *name) {
    size_t n = strlen(name);
    return arg[0] == '-' && arg[1] == '-' && strncmp(arg + 2, name, n) == 0 &&
           (arg[2 + n] == '\0' || arg[2 + n] == '=');
}

static int bad(cli_parser *p, const char *arg, cli_opt_error error) {
    const char *eq = strchr(arg, '=');
    p->arg = arg;
    p->name_len = (int)(eq ? (size_t)(eq - arg) : strlen(arg));
    p->error = error;
    return CLI_BAD;
}

/* Says what is wrong with argv[at], an option getopt refused or one that breaks nopad's rules. */
static int diagnose(cli_parser *p, int at) {
    const char *arg = p->argv[at];
    if (arg[0] != '-' || arg[1] == '\0') return bad(p, arg, CLI_OPT_UNEXPECTED);
    const char *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    int has_arg = -1;
    if (n == 2 && arg[1] == 'h') {
        has_arg = no_argument;
    } else if (n > 2 && arg[1] == '-') {
        for (const struct option *o = p->options; o->name; o++)
            if (strlen(o->name) == n - 2 && strncmp(arg + 2, o->name, n - 2) == 0)
                has_arg = o->has_arg;
    }
    if (has_arg == no_argument && eq) return bad(p, arg, CLI_OPT_TAKES_NO_VALUE);
    if (has_arg == required_argument && !eq && at + 1 >= p->argc)
        return bad(p, arg, CLI_OPT_NEEDS_VALUE);
    return bad(p, arg, CLI_OPT_UNKNOWN);
}

int cli_getopt(cli_parser *p) {
    /* With '+' getopt neither permutes nor reads past a positional argument, and it advances
     * optind only past the arguments it returns, so the current one is argv[at]. */
    const int at = optind > 0 ? optind : 1;
    int index = -1;
    int c = getopt_long(p->argc, p->argv, "+:h", p->options, &index);
    if (c == -1) {
        if (optind != at) return bad(p, "--", CLI_OPT_UNKNOWN); /* getopt skipped a "--" */
        if (optind < p->argc) return bad(p, p->argv[optind], CLI_OPT_UNEXPECTED);
        return -1;
    }
    if (c != '?' && c != ':') {
        const char *arg = p->argv[at];
        if (index >= 0 ? spells(arg, p->options[index].name) : strcmp(arg, "-h") == 0) return c;
    }
    return diagnose(p, at);
}

void cli_print_opt_error(const cli_parser *p) {
    switch (p->error) {
    case CLI_OPT_UNKNOWN: print_error("unknown option '%.*s'", p->name_len, p->arg); break;
    case CLI_OPT_TAKES_NO_VALUE:
        print_error("option %.*s takes no value", p->name_len, p->arg);
        break;
    case CLI_OPT_NEEDS_VALUE: print_error("option %.*s needs a value", p->name_len, p->arg); break;
    case CLI_OPT_UNEXPECTED: print_error("unexpected argument '%s'", p->arg); break;
    }
}

/* ---- option values ----------------------------------------------------------------------- */

int parse_int(const char *name, const char *s, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo || v > hi) {
        print_error("%s expects an integer in [%ld, %ld], got '%s'", name, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int parse_float(const char *name, const char *s, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno == ERANGE && v != 0) errno = 0, v = HUGE_VAL; /* an overflow is caught as infinite */
    if (errno || end == s || *end != '\0' || !isfinite(v)) {
        print_error("%s expects a finite number, got '%s'", name, s);
        return -1;
    }
    *out = v;
    return 0;
}

int parse_u64(const char *name, const char *s, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = s[0] >= '0' && s[0] <= '9' ? strtoull(s, &end, 10) : 0;
    if (errno || !end || *end != '\0') {
        print_error("%s expects an integer in [0, 18446744073709551615], got '%s'", name, s);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

const char *pooling_name(nopad_pooling p) {
    switch (p) {
    case NOPAD_POOLING_MODEL: return "model";
    case NOPAD_POOLING_NONE: return "none";
    case NOPAD_POOLING_CLS: return "cls";
    case NOPAD_POOLING_MEAN: return "mean";
    case NOPAD_POOLING_MAX: return "max";
    }
    return "unknown";
}

int parse_pooling(const char *s, nopad_pooling *out) {
    static const nopad_pooling all[] = {NOPAD_POOLING_NONE, NOPAD_POOLING_CLS, NOPAD_POOLING_MEAN,
                                        NOPAD_POOLING_MAX};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(s, pooling_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    }
    print_error("unknown pooling '%s' (expected cls, mean, max or none)", s);
    return -1;
}

int device_from_name(const char *s, nopad_device *out) {
    if (strcmp(s, "cpu") == 0) *out = NOPAD_DEVICE_CPU;
    else if (strcmp(s, "cuda") == 0) *out = NOPAD_DEVICE_CUDA;
    else return -1;
    return 0;
}

int dtype_from_name(const char *s, nopad_dtype *out) {
    if (strcmp(s, "fp32") == 0) *out = NOPAD_DTYPE_F32;
    else if (strcmp(s, "fp16") == 0) *out = NOPAD_DTYPE_F16;
    else if (strcmp(s, "bf16") == 0) *out = NOPAD_DTYPE_BF16;
    else return -1;
    return 0;
}

int parse_device(const char *s, nopad_device *out) {
    if (device_from_name(s, out) == 0) return 0;
    print_error("unknown device '%s' (expected cpu or cuda)", s);
    return -1;
}

int parse_dtype(const char *s, nopad_dtype *out) {
    if (dtype_from_name(s, out) == 0) return 0;
    print_error("unknown dtype '%s' (expected fp32, fp16 or bf16)", s);
    return -1;
}

int parse_weights(const char *s, nopad_weights *out) {
    static const struct { const char *name; nopad_weights w; } names[] = {
        {"auto", NOPAD_WEIGHTS_AUTO}, {"native", NOPAD_WEIGHTS_NATIVE}, {"f32", NOPAD_WEIGHTS_F32},
        {"f16", NOPAD_WEIGHTS_F16},   {"bf16", NOPAD_WEIGHTS_BF16},     {"fp8", NOPAD_WEIGHTS_FP8},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].w;
            return 0;
        }
    print_error("unknown weights '%s' (expected auto, native, f32, f16, bf16 or fp8)", s);
    return -1;
}

/* ---- model loading ----------------------------------------------------------------------- */

/* Whether `path` starts with the GGUF magic. */
static int is_gguf_file(const char *path) {
    char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(magic, 1, sizeof magic, f) : 0;
    if (f) fclose(f);
    return got == sizeof magic && memcmp(magic, "GGUF", sizeof magic) == 0;
}

/* ".gguf" at the end, in any case: the user meant a GGUF file, not a folder. */
static int has_gguf_suffix(const char *path) {
    const size_t n = strlen(path);
    return n >= 5 && strcasecmp(path + n - 5, ".gguf") == 0;
}

/* The path is checked here first so that a mistyped path reads as such rather than as a missing
 * config.json. A file is a model only as GGUF; a file named .gguf goes to the library, which says
 * what its first bytes are; any other file keeps the folder message (the Python package says the
 * same). */
nopad_model *open_model_with(const char *path, const nopad_model_params *params) {
    struct stat st;
    const char *what = has_gguf_suffix(path) ? "GGUF file" : "model folder";
    if (stat(path, &st) != 0) {
        if (errno == ENOENT) print_error("%s '%s' does not exist", what, path);
        else print_error("%s '%s': %s", what, path, strerror(errno));
        return NULL;
    }
    if (!S_ISDIR(st.st_mode) && !(S_ISREG(st.st_mode) && (is_gguf_file(path) || has_gguf_suffix(path)))) {
        print_error("model folder '%s' is not a folder", path);
        return NULL;
    }
    nopad_model *model = NULL;
    nopad_status status = nopad_model_load(path, params, &model);
    if (status != NOPAD_OK) {
        print_error("cannot load model '%s': %s", path, library_error(status));
        nopad_model_free(model);
        return NULL;
    }
    return model;
}

nopad_model_params model_params(nopad_device device, nopad_dtype dtype, int dtype_given, int n_threads) {
    nopad_model_params params = nopad_model_default_params();
    params.device = device;
    params.dtype = dtype_given ? dtype : device == NOPAD_DEVICE_CUDA ? NOPAD_DTYPE_F16 : NOPAD_DTYPE_F32;
    params.n_threads = n_threads;
    return params;
}

nopad_model *open_model(const char *dir, nopad_device device, nopad_dtype dtype, int dtype_given,
                        int n_threads) {
    const nopad_model_params params = model_params(device, dtype, dtype_given, n_threads);
    return open_model_with(dir, &params);
}

int model_is_decoder(const nopad_model *model) {
    nopad_model_info info;
    return nopad_model_get_info(model, &info) == NOPAD_OK && info.is_decoder;
}

/* ---- tensor parallelism ------------------------------------------------------------------ */

char **cli_argv;

/* Set in the environment of the mpirun that --tp (or train's --nproc) starts: a process that finds
 * it and yet no launcher's world would otherwise start mpirun again, and again. */
#define TP_STARTED_ENV "NOPAD_TP_STARTED"

int self_path(char *out, size_t cap) {
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    if (n <= 0 || (size_t)n >= cap - 1) return -1;
    out[n] = '\0';
    return 0;
}

static int is_executable_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* $NOPAD_MPIRUN when set, else the first mpirun on PATH; -1 (and why, in `why`) when none. */
static int find_mpirun(char *out, size_t cap, char *why, size_t why_cap) {
    const char *forced = getenv("NOPAD_MPIRUN");
    if (forced && forced[0]) {
        if (is_executable_file(forced) && strlen(forced) < cap) {
            snprintf(out, cap, "%s", forced);
            return 0;
        }
        snprintf(why, why_cap, "NOPAD_MPIRUN=%s is not an executable file", forced);
        return -1;
    }
    const char *path = getenv("PATH");
    for (const char *dir = path; dir && *dir;) {
        const char *end = strchr(dir, ':');
        const size_t len = end ? (size_t)(end - dir) : strlen(dir);
        if (len > 0 && (size_t)snprintf(out, cap, "%.*s/mpirun", (int)len, dir) < cap &&
            is_executable_file(out))
            return 0;
        dir = end ? end + 1 : NULL;
    }
    snprintf(why, why_cap, "no mpirun on PATH");
    return -1;
}

void start_under_mpirun(const char *flag, long tp, nopad_device device) {
    const char *cmd = cli_argv && cli_argv[1] ? cli_argv[1] : "...";
    if (getenv(TP_STARTED_ENV)) {
        print_error("%s %ld: nopad was started under mpirun, yet it sees no launcher's world "
                    "(none of OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS is set): run it under "
                    "your own launcher, e.g. mpirun -np %ld nopad %s ...",
                    flag, tp, tp, cmd);
        return;
    }
    char mpirun[4096], why[4200], self[4096];
    if (find_mpirun(mpirun, sizeof mpirun, why, sizeof why)) {
        print_error("%s %ld needs Open MPI's mpirun (%s; apt-get install openmpi-bin), or run the "
                    "command under your own launcher: mpirun -np %ld nopad %s ...",
                    flag, tp, why, tp, cmd);
        return;
    }
    if (self_path(self, sizeof self)) {
        print_error("%s %ld: cannot find this program's own file (/proc/self/exe) to start it "
                    "under mpirun; run it under your own launcher: mpirun -np %ld nopad %s ...",
                    flag, tp, tp, cmd);
        return;
    }
    int argc = 0;
    while (cli_argv[argc]) argc++;
    char np[24];
    snprintf(np, sizeof np, "%ld", tp);
    /* mpirun, --quiet, -np N, --bind-to none, two optional flags, self, the arguments, NULL */
    char **args = calloc((size_t)argc + 9, sizeof *args);
    if (!args) {
        print_error("out of memory");
        return;
    }
    int n = 0;
    args[n++] = mpirun;
    args[n++] = "--quiet"; /* the ranks' own messages say what failed, without mpirun's banners */
    args[n++] = "-np";
    args[n++] = np;
    /* each rank's OpenMP threads go where the kernel puts them (Open MPI would pin every rank to
     * one core) */
    args[n++] = "--bind-to";
    args[n++] = "none";
    /* on the CPU N ranks may outnumber the cores, which Open MPI refuses by default; on CUDA a
     * rank is a GPU, and the library refuses more ranks than GPUs itself */
    if (device == NOPAD_DEVICE_CPU) args[n++] = "--oversubscribe";
    if (geteuid() == 0) args[n++] = "--allow-run-as-root";
    args[n++] = self;
    for (int i = 1; i < argc; i++) args[n++] = cli_argv[i];
    args[n] = NULL;
    if (setenv(TP_STARTED_ENV, np, 1) == 0) execv(mpirun, args);
    print_error("%s %ld: cannot start %s: %s", flag, tp, mpirun, strerror(errno));
    free(args);
}

int tp_begin(long tp, nopad_device device) {
    const int32_t world = nopad_world_size();
    if (tp <= 1) return 0;
    if (world == 1) {
        start_under_mpirun("--tp", tp, device);
        return -1;
    }
    if (world != tp) {
        if (nopad_world_rank() == 0) /* the others see the same, and stop without repeating it */
            print_error("--tp %ld needs a world of %ld processes, and the launcher started %d: run "
                    "mpirun -np %ld (or srun -n %ld) with --tp %ld, or --tp %d in this world",
                    tp, tp, (int)world, tp, tp, tp, (int)world);
        return -1;
    }
    return nopad_world_rank();
}

int tp_follow(const char *path, const nopad_model_params *params) {
    /* A terminal's Ctrl-C reaches every rank, and srun passes SIGTERM to every task: rank 0 alone
     * acts on them, and its nopad_model_free ends this rank through the library's protocol (a
     * follower that died first would leave rank 0's last collective without a peer). */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    nopad_status status = nopad_tp_follow(path, params);
    if (status != NOPAD_OK) {
        print_error("model '%s': %s", path, library_error(status));
        return EXIT_ERROR;
    }
    return EXIT_OK;
}

/* ---- buffers and time -------------------------------------------------------------------- */

int reserve(void **buf, size_t *cap, size_t n, size_t size) {
    if (n <= *cap) return 0;
    size_t new_cap = *cap ? *cap : 64;
    while (new_cap < n) new_cap *= 2;
    if (new_cap > SIZE_MAX / size) new_cap = n;
    void *p = realloc(*buf, new_cap * size);
    if (!p) {
        print_error("out of memory (%zu bytes)", new_cap * size);
        return -1;
    }
    *buf = p;
    *cap = new_cap;
    return 0;
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

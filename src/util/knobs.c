/* The table of tuning knobs (knobs.h). Where a knob is used, its consumer clamps or validates the
 * value (e.g. a tile size other than 64 or 128 means "per shape"); the table only parses. */
#include "util/knobs.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef enum knob_kind {
    KIND_INT,    /* a decimal integer (atoi) */
    KIND_SWITCH, /* 0 when the value starts with '0', else 1 */
    KIND_CHOICE, /* the index of the value in `choices` ('|'-separated), else the default */
    KIND_FLOAT,  /* atof */
} knob_kind;

typedef struct knob_def {
    const char *name;
    knob_kind kind;
    double dflt;         /* the default (a choice: its index) */
    const char *choices; /* KIND_CHOICE only */
    const char *meaning;
} knob_def;

static const knob_def KNOBS[KNOB_COUNT] = {
    [KNOB_GEMM] = {"NOPAD_GEMM", KIND_CHOICE, 0, "auto|cublaslt|cutlass",
                   "linear layers: cublaslt only, cutlass (epilogues fused) wherever it applies, or auto per shape"},
    [KNOB_SKINNY_MAX_TOKENS] = {"NOPAD_SKINNY_MAX_TOKENS", KIND_INT, 32, NULL,
                                "linear layers of at most this many tokens run the skinny GEMM (0 = off, at most 256)"},
    [KNOB_GEMV_MAX_TOKENS] = {"NOPAD_GEMV_MAX_TOKENS", KIND_INT, 24, NULL,
                              "linear layers of at most this many tokens (decode steps) stream their weights "
                              "through the gemv kernels (0 = off, at most 32)"},
    [KNOB_PDL] = {"NOPAD_PDL", KIND_SWITCH, 1, NULL,
                  "0 = no programmatic dependent launch (each kernel waits for the previous one to end)"},
    [KNOB_PDL_TENSOR] = {"NOPAD_PDL_TENSOR", KIND_SWITCH, 1, NULL,
                         "0 = the CUTLASS GEMMs and the attention kernels launch plainly"},
    [KNOB_FMHA_FA3] = {"NOPAD_FMHA_FA3", KIND_INT, -1, NULL,
                       "1 / 0 = always / never the FA3-style attention kernel (head size 64); -1 per shape"},
    [KNOB_FMHA_FA3_PERSIST] = {"NOPAD_FMHA_FA3_PERSIST", KIND_INT, 1, NULL,
                               "FA3 kernel: 0 = one CTA per tile instead of the persistent grid"},
    [KNOB_FMHA_FA3_WG] = {"NOPAD_FMHA_FA3_WG", KIND_INT, 3, NULL, "FA3 kernel: consumer warpgroups (2 | 3)"},
    [KNOB_FMHA_FA3_STAGES] = {"NOPAD_FMHA_FA3_STAGES", KIND_INT, 2, NULL, "FA3 kernel: K/V stages (2 | 3)"},
    [KNOB_FMHA_FA3_PINGPONG] = {"NOPAD_FMHA_FA3_PINGPONG", KIND_INT, 1, NULL,
                                "FA3 kernel: 0 = consumer warpgroups issue their wgmmas without taking turns"},
    [KNOB_FMHA_WGMMA] = {"NOPAD_FMHA_WGMMA", KIND_INT, 1, NULL,
                         "0 = the mma.sync attention kernels instead of the wgmma ones"},
    [KNOB_FMHA_WG_M] = {"NOPAD_FMHA_WG_M", KIND_INT, 0, NULL,
                        "wgmma attention: query rows a tile (64 | 128; else per shape)"},
    [KNOB_FMHA_WG_N] = {"NOPAD_FMHA_WG_N", KIND_INT, 0, NULL,
                        "wgmma attention: keys a tile (64 | 128; else per shape)"},
    [KNOB_FMHA_WG_PIPE] = {"NOPAD_FMHA_WG_PIPE", KIND_INT, -1, NULL,
                           "wgmma attention: 1 / 0 = the pipelined variant or not; -1 per shape"},
    [KNOB_FMHA_V5_CTAS] = {"NOPAD_FMHA_V5_CTAS", KIND_INT, 0, NULL,
                           "4 / 5 CTAs a SM for the 64 x 64 wgmma attention kernel; else per grid"},
    [KNOB_FMHA_BLOCK_M] = {"NOPAD_FMHA_BLOCK_M", KIND_INT, 0, NULL,
                           "mma.sync attention: query rows a tile (64 | 128; else per shape)"},
    [KNOB_FMHA_BLOCK_N] = {"NOPAD_FMHA_BLOCK_N", KIND_INT, 0, NULL,
                           "mma.sync attention: keys a tile (64 | 128; else per shape)"},
    [KNOB_FMHA_RESCALE] = {"NOPAD_FMHA_RESCALE", KIND_FLOAT, 8, NULL,
                           "online softmax: rescale only when the running maximum grows by more than this "
                           "(log2 units, 0 to 8; 0 = at every new maximum)"},
    [KNOB_COMM_FORCE] = {"NOPAD_COMM_FORCE", KIND_INT, 0, NULL,
                         "1 = a world of one rank still runs its collectives through MPI (when built with it) "
                         "and NCCL (tests that path, measures its overhead on one GPU)"},
    /* 30 s: a healthy collective waits at most for its peers' share of one step (milliseconds to
     * seconds), while the bound on a dead peer is 60 s for the whole job: half of it to
     * notice, the rest for the abort and the exit. */
    [KNOB_COMM_TIMEOUT] = {"NOPAD_COMM_TIMEOUT", KIND_FLOAT, 30, NULL,
                           "seconds an NCCL collective may stay incomplete before the watchdog aborts the "
                           "communicator (a dead or stuck peer)"},
    /* off by default: on the CPU the split gains nothing (the same bytes move, in two collectives
     * instead of one), and on CUDA it is to pay once the fused AllGather / ReduceScatter GEMMs are
     * wired in (model/tp_seq.c); until then a test and measurement switch */
    [KNOB_TP_SEQUENCE_PARALLEL] = {"NOPAD_TP_SEQUENCE_PARALLEL", KIND_SWITCH, 0, NULL,
                                   "1 = a split model's forwards of at least tp rows (not decode steps) run "
                                   "sequence-parallel: the residual stream split by rows, reduce-scatter and "
                                   "all-gather in place of each all-reduce"},
};

static double values[KNOB_COUNT]; /* each knob's value, parsed as its kind says */
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* The index of `word` among the '|'-separated `choices`, or -1. */
static int choice_index(const char *choices, const char *word) {
    const size_t len = strlen(word);
    int index = 0;
    for (const char *c = choices; *c; index++) {
        const char *end = strchr(c, '|');
        const size_t n = end ? (size_t)(end - c) : strlen(c);
        if (n == len && strncmp(c, word, n) == 0) return index;
        if (!end) break;
        c = end + 1;
    }
    return -1;
}

static void read_all(void) {
    for (int i = 0; i < KNOB_COUNT; i++) {
        const knob_def *k = &KNOBS[i];
        const char *env = getenv(k->name);
        values[i] = k->dflt;
        if (!env || !*env) continue;
        switch (k->kind) {
        case KIND_INT: values[i] = atoi(env); break;
        case KIND_SWITCH: values[i] = env[0] != '0'; break;
        case KIND_CHOICE: {
            const int c = choice_index(k->choices, env);
            if (c >= 0) values[i] = c;
            break;
        }
        case KIND_FLOAT: values[i] = atof(env); break;
        }
    }
}

static double get(knob_id id) {
    pthread_once(&once, read_all);
    return values[id];
}

long knob_int(knob_id id) { return (long)get(id); }
double knob_float(knob_id id) { return get(id); }

void knob_set_int(knob_id id, long value) {
    pthread_once(&once, read_all);
    values[id] = (double)value;
}

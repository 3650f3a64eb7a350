/* The tuning knobs: every NOPAD_* environment switch of the library, in one table (knobs.c) with
 * its name, default and meaning. Each is read once, at the first access of any knob, by whichever
 * thread comes first; later changes to the environment are not seen. Values are parsed as the
 * table says: an unset or empty variable means the default. */
#ifndef NOPAD_UTIL_KNOBS_H
#define NOPAD_UTIL_KNOBS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum knob_id {
    KNOB_GEMM,                /* choice: auto | cublaslt | cutlass (cuda_gemm_mode's order) */
    KNOB_SKINNY_MAX_TOKENS,   /* int */
    KNOB_GEMV_MAX_TOKENS,     /* int */
    KNOB_PDL,                 /* switch */
    KNOB_PDL_TENSOR,          /* switch */
    KNOB_FMHA_FA3,            /* int: -1 per shape, 0 never, 1 always */
    KNOB_FMHA_FA3_PERSIST,    /* int */
    KNOB_FMHA_FA3_WG,         /* int */
    KNOB_FMHA_FA3_STAGES,     /* int */
    KNOB_FMHA_FA3_PINGPONG,   /* int */
    KNOB_FMHA_WGMMA,          /* int */
    KNOB_FMHA_WG_M,           /* int */
    KNOB_FMHA_WG_N,           /* int */
    KNOB_FMHA_WG_PIPE,        /* int */
    KNOB_FMHA_V5_CTAS,        /* int */
    KNOB_FMHA_BLOCK_M,        /* int */
    KNOB_FMHA_BLOCK_N,        /* int */
    KNOB_FMHA_RESCALE,        /* float */
    KNOB_COMM_FORCE,          /* int: 1 = a world of one still goes through MPI and NCCL */
    KNOB_COMM_TIMEOUT,        /* float: seconds before the NCCL watchdog aborts a collective */
    KNOB_TP_SEQUENCE_PARALLEL,/* switch: forwards of >= tp rows split the residual stream by rows */
    KNOB_COUNT
} knob_id;

/* The value as an integer: an int knob's number, a switch's 0 / 1, a choice's index (an unknown
 * word gives the default's), a float knob's value truncated. */
long knob_int(knob_id id);
double knob_float(knob_id id);

/* Overrides a knob's value from now on (the benchmark and the tests; cuda_gemm_set_mode,
 * cuda_gemm_skinny_set_max_tokens). Not meant to race with running work. */
void knob_set_int(knob_id id, long value);

#ifdef __cplusplus
}
#endif
#endif

/* The CPU settings that the nopad CLI and nopad-worker restart themselves with, before anything
 * runs: OpenMP's idle-thread policy and OpenBLAS's kernels, both read by libraries that load
 * before main. Call restart_with_cpu_settings(argv) first thing in main. */
#ifndef NOPAD_TOOLS_CPU_SETTINGS_H
#define NOPAD_TOOLS_CPU_SETTINGS_H

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nopad.h"

/* OpenMP's idle workers spin for about 3 ms (libgomp's default, 300,000 turns) before they sleep,
 * waiting for the next parallel region. On shared cores (a laptop, a CI runner, a busy server)
 * the spinning worker holds a core that the thread with the work is waiting for, and each of the
 * ~150 regions of a decode step can wait for a time slice: 48 SmolLM2 tokens took 1-3 minutes
 * instead of 8 s on 2 cores shared with compilers. Sleeping at once (OMP_WAIT_POLICY=passive)
 * costs a wake-up a region, 13% on a quiet machine; 1,000 turns (about 10 us) cover the gap
 * between two regions of a step and cost 3% there, and under load they match passive waits
 * (bench/RESULTS.md, CPU section; docs/cpu.md). libgomp reads the setting when it is loaded,
 * before main: the program sets it and restarts itself, unless the user chose a policy. */
#define OMP_SPIN_TURNS "1000"

static int pick_omp_wait_policy(void) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return 0;
    return setenv("GOMP_SPINCOUNT", OMP_SPIN_TURNS, 1) == 0;
}

/* OpenBLAS picks its kernels when the program starts. On CPUs it does not recognise (some virtual
 * machines) it falls back to its SSE3 ("Prescott") kernels, about half as fast as the AVX2 /
 * AVX-512 ones: the program picks the family this CPU supports, unless the user chose one. */
static int pick_blas_kernels(void) {
    if (getenv("OPENBLAS_CORETYPE") || strcmp(nopad_cpu_blas_kernels(), "Prescott") != 0) return 0;
    const char *core = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                       : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                         : NULL;
    return core && setenv("OPENBLAS_CORETYPE", core, 1) == 0;
}

/* Both settings are read by libraries loaded before main: one restart applies them. It execs the
 * binary's own path, not /proc/self/exe, which would name the process "exe" in ps and top. */
static void restart_with_cpu_settings(char **argv) {
    int changed = pick_blas_kernels();
    changed |= pick_omp_wait_policy();
    if (!changed) return;
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || (size_t)n >= sizeof self - 1) return; /* carry on as we are */
    self[n] = '\0';
    execv(self, argv); /* returns only on failure: carry on as we are */
}

#endif

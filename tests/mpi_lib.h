/* What the multi-process tests (tests/mpi_*.c, run under mpirun at 2, 3 and 4 ranks) share:
 * running cmocka tests so that only rank 0 prints unless something fails, and a failure on any
 * rank ends the whole job at once instead of leaving the other ranks waiting in a collective; and
 * data every rank can compute for every other rank (drawn from a seed, the rank and the index). */
#ifndef NOPAD_TESTS_MPI_LIB_H
#define NOPAD_TESTS_MPI_LIB_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

/* Runs each test as a cmocka group of its own. Ranks > 0 write into a scratch file, shown on
 * stderr only when one of their tests fails. A failing test ends its rank at once with status 1,
 * without MPI_Finalize (which would wait for ranks stuck in a collective): mpirun sees a rank die
 * and ends the job. */
static inline int mpi_test_run(const char *group, const struct CMUnitTest *tests, size_t n) {
    const int quiet = nopad_world_rank() > 0;
    int err_fd = 2, log_fd = -1;
    if (quiet) {
        FILE *log = tmpfile();
        if (!log) return 1;
        fflush(NULL);
        log_fd = fileno(log);
        err_fd = dup(2);
        if (err_fd < 0 || dup2(log_fd, 1) < 0 || dup2(log_fd, 2) < 0) return 1;
    }
    for (size_t i = 0; i < n; i++) {
        if (quiet && (ftruncate(log_fd, 0) != 0 || lseek(log_fd, 0, SEEK_SET) != 0)) return 1;
        if (_cmocka_run_group_tests(group, &tests[i], 1, NULL, NULL) == 0) continue;
        fflush(NULL);
        char text[4096];
        ssize_t got;
        if (quiet && lseek(log_fd, 0, SEEK_SET) == 0)
            while ((got = read(log_fd, text, sizeof text)) > 0)
                if (write(err_fd, text, (size_t)got) != got) break;
        dprintf(err_fd, "%s: %s failed on rank %d of %d\n", group, tests[i].name, nopad_world_rank(),
                nopad_world_size());
        _Exit(1);
    }
    return 0;
}
#define MPI_RUN_TESTS(tests) mpi_test_run(#tests, tests, sizeof(tests) / sizeof((tests)[0]))

/* A 64-bit draw that depends on (seed, rank, i) only (splitmix64's finaliser, three times). */
static inline uint64_t mpi_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static inline uint64_t mpi_draw(uint64_t seed, int32_t rank, uint64_t i) {
    return mpi_mix(mpi_mix(mpi_mix(seed) ^ (uint64_t)(uint32_t)rank) ^ i);
}
/* Uniform in [-1, 1). */
static inline float mpi_draw_float(uint64_t seed, int32_t rank, uint64_t i) {
    return (float)((double)(mpi_draw(seed, rank, i) >> 40) / (double)(1ull << 23) - 1.0);
}

#endif

/* The communicator on MPI (host memory), run under mpirun at 2, 3 and 4 ranks: every collective
 * against a reference each rank computes alone (every rank's data is drawn from the seed, its rank
 * and the index, so any rank knows what every other holds), in every element type, at odd counts
 * (1, 3, 1000003), roots other than 0, all-to-all(v) with uneven counts and zeros, in-place
 * all-gather, sub-groups, the barrier, a big host broadcast, a world of one under the launcher,
 * and the refusals. */
#include <math.h>
#include <signal.h>
#include <string.h>
#include <time.h>

#include "mpi_lib.h"
#include "parallel/comm.h"

static const comm_type TYPES[] = {COMM_F32, COMM_F16, COMM_BF16, COMM_I32, COMM_I64, COMM_BYTE};
static const char *const TYPE_NAMES[] = {"F32", "F16", "BF16", "I32", "I64", "BYTE"};
static const size_t TYPE_SIZES[] = {4, 2, 2, 4, 8, 1};
enum { N_TYPES = sizeof TYPES / sizeof TYPES[0] };
static const size_t COUNTS[] = {1, 3, 1000003};
enum { N_COUNTS = sizeof COUNTS / sizeof COUNTS[0] };

/* ---- reference values ---------------------------------------------------------------------- */

/* bf16 by hand (test_f32_to_bf16, rounded to nearest even); F16 through the compiler's _Float16,
 * which rounds the same way: conversions independent of the library's. */
static uint16_t to_f16(float f) {
    const _Float16 h = (_Float16)f;
    uint16_t bits;
    memcpy(&bits, &h, 2);
    return bits;
}
static float from_f16(uint16_t bits) {
    _Float16 h;
    memcpy(&h, &bits, 2);
    return (float)h;
}

/* Element i of `rank`'s data for `seed`, as a double (exact for every type here). */
static double element(comm_type t, uint64_t seed, int32_t rank, uint64_t i) {
    const uint64_t d = mpi_draw(seed, rank, i);
    switch (t) {
    case COMM_F32: return mpi_draw_float(seed, rank, i);
    case COMM_F16: return from_f16(to_f16(mpi_draw_float(seed, rank, i)));
    case COMM_BF16: return test_bf16_to_f32(test_f32_to_bf16(mpi_draw_float(seed, rank, i)));
    case COMM_I32: return (double)((int64_t)(d % 2000001) - 1000000);
    case COMM_I64: return (double)((int64_t)(d >> 20) - ((int64_t)1 << 43)); /* past int32, exact in double */
    case COMM_BYTE: return (double)(d & 0xff);
    }
    return 0;
}

/* Stores v (exact or rounded to nearest even) as element i of a buffer of type t. */
static void store(comm_type t, void *buf, size_t i, double v) {
    switch (t) {
    case COMM_F32: ((float *)buf)[i] = (float)v; break;
    case COMM_F16: ((uint16_t *)buf)[i] = to_f16((float)v); break;
    case COMM_BF16: ((uint16_t *)buf)[i] = test_f32_to_bf16((float)v); break;
    case COMM_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case COMM_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case COMM_BYTE: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    }
}

static double load(comm_type t, const void *buf, size_t i) {
    switch (t) {
    case COMM_F32: return ((const float *)buf)[i];
    case COMM_F16: return from_f16(((const uint16_t *)buf)[i]);
    case COMM_BF16: return test_bf16_to_f32(((const uint16_t *)buf)[i]);
    case COMM_I32: return ((const int32_t *)buf)[i];
    case COMM_I64: return (double)((const int64_t *)buf)[i];
    case COMM_BYTE: return ((const uint8_t *)buf)[i];
    }
    return 0;
}

static void *fill(comm_type t, size_t n, uint64_t seed, int32_t rank, uint64_t first) {
    void *buf = malloc(n * TYPE_SIZES[t] + 1);
    assert_non_null(buf);
    for (size_t i = 0; i < n; i++) store(t, buf, i, element(t, seed, rank, first + i));
    return buf;
}

/* Unit roundoff of a type's additions (0: exact). */
static double unit_roundoff(comm_type t) {
    return t == COMM_F32 ? 0x1p-24 : t == COMM_F16 ? 0x1p-11 : t == COMM_BF16 ? 0x1p-8 : 0;
}

/* Checks got (n elements of type t) against the reduction over every rank of element(first + i).
 * Max and min are exact. A sum is compared with the sum taken in double, within
 * size · u · Σ|x| + size · 2^-24: MPI adds in an order of its own and rounds each of the size - 1
 * partial sums to the type (each rounding is at most u times a partial sum, itself at most Σ|x|),
 * the stored result is one more rounding, and 2^-24 covers F16's subnormal spacing near zero.
 * Integers add exactly. */
static void check_reduced(const char *what, comm_type t, comm_reduce op, const void *got, size_t n, uint64_t seed,
                          uint64_t first, int32_t size) {
    for (size_t i = 0; i < n; i++) {
        double want = element(t, seed, 0, first + i), abs_sum = fabs(want);
        for (int32_t r = 1; r < size; r++) {
            const double x = element(t, seed, r, first + i);
            want = op == COMM_SUM ? want + x : op == COMM_MAX ? fmax(want, x) : fmin(want, x);
            abs_sum += fabs(x);
        }
        const double g = load(t, got, i);
        const double tol = op == COMM_SUM && unit_roundoff(t) > 0 ? size * unit_roundoff(t) * abs_sum + size * 0x1p-24 : 0;
        if (!(fabs(g - want) <= tol))
            fail_msg("%s %s op %d element %zu of %zu: got %.9g, want %.9g (tolerance %.3g)", what,
                     TYPE_NAMES[t], (int)op, i, n, g, want, tol);
    }
}

static void check_exact(const char *what, comm_type t, const void *got, size_t n, uint64_t seed, int32_t rank,
                        uint64_t first) {
    for (size_t i = 0; i < n; i++) {
        const double want = element(t, seed, rank, first + i), g = load(t, got, i);
        if (g != want)
            fail_msg("%s %s element %zu of %zu (from rank %d): got %.17g, want %.17g", what, TYPE_NAMES[t], i, n,
                     rank, g, want);
    }
}

static nopad_comm *world(void) {
    nopad_comm *c = NULL;
    assert_nopad_ok(comm_world(nopad_world_size(), &c));
    return c;
}

/* ---- tests ------------------------------------------------------------------------------------- */

static void test_world_and_refusals(void **state) {
    nopad_comm *c = world();
    const int32_t size = comm_size(c), rank = comm_rank(c);
    assert_int_equal(size, nopad_world_size());
    assert_int_equal(rank, nopad_world_rank());
    assert_true(size >= 2);
    /* one machine: every rank is local, in world order (split by key = rank) */
    assert_int_equal(comm_local_size(c), size);
    assert_int_equal(comm_local_rank(c), rank);

    nopad_comm *other = NULL;
    assert_nopad_error(comm_world(size + 1, &other), NOPAD_ERR_INVALID_ARGUMENT, "launcher's world has");
    assert_null(other);
    int32_t x = 1;
    assert_nopad_error(comm_broadcast(c, NULL, &x, 1, COMM_I32, size), NOPAD_ERR_INVALID_ARGUMENT, "root");
    assert_nopad_error(comm_all_reduce(c, NULL, &x, 1, COMM_BYTE, COMM_SUM), NOPAD_ERR_INVALID_ARGUMENT,
                       "BYTE");
    assert_nopad_error(comm_all_reduce(c, NULL, &x, 1, (comm_type)17, COMM_SUM), NOPAD_ERR_INVALID_ARGUMENT,
                       "element type");
    comm_free(c);
}

static void test_all_reduce(void **state) {
    nopad_comm *c = world();
    const int32_t size = comm_size(c), rank = comm_rank(c);
    uint64_t seed = 100;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const comm_type t = TYPES[ti];
        if (t == COMM_BYTE) continue;
        for (int op = COMM_SUM; op <= COMM_MIN; op++) {
            for (int ci = 0; ci < N_COUNTS; ci++) {
                const size_t n = COUNTS[ci];
                if (n > 1000 && op != COMM_SUM) continue; /* the long count once a type is enough */
                seed++;
                void *buf = fill(t, n, seed, rank, 0);
                assert_nopad_ok(comm_all_reduce(c, NULL, buf, n, t, (comm_reduce)op));
                check_reduced("all_reduce", t, (comm_reduce)op, buf, n, seed, 0, size);
                free(buf);
            }
        }
    }
    comm_free(c);
}

static void test_all_gather(void **state) {
    nopad_comm *c = world();
    const int32_t size = comm_size(c), rank = comm_rank(c);
    uint64_t seed = 200;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const comm_type t = TYPES[ti];
        const size_t es = TYPE_SIZES[t];
        for (int ci = 0; ci < N_COUNTS; ci++) {
            const size_t n = COUNTS[ci];
            for (int in_place = 0; in_place < 2; in_place++) {
                seed++;
                void *send = fill(t, n, seed, rank, 0);
                char *recv = malloc((size_t)size * n * es);
                assert_non_null(recv);
                memset(recv, 0x5a, (size_t)size * n * es);
                const void *src = send;
                if (in_place) {
                    memcpy(recv + (size_t)rank * n * es, send, n * es);
                    src = recv + (size_t)rank * n * es;
                }
                assert_nopad_ok(comm_all_gather(c, NULL, recv, src, n, t));
                for (int32_t r = 0; r < size; r++)
                    check_exact(in_place ? "all_gather in place" : "all_gather", t, recv + (size_t)r * n * es, n,
                                seed, r, 0);
                free(send);
                free(recv);
            }
        }
    }
    comm_free(c);
}

static void test_reduce_scatter(void **state) {
    nopad_comm *c = world();
    const int32_t size = comm_size(c), rank = comm_rank(c);
    uint64_t seed = 300;
    static const size_t counts[] = {1, 3, 250001};
    for (int ti = 0; ti < N_TYPES; ti++) {
        const comm_type t = TYPES[ti];
        if (t == COMM_BYTE) continue;
        for (int op = COMM_SUM; op <= COMM_MIN; op++) {
            for (int ci = 0; ci < 3; ci++) {
                const size_t n = counts[ci];
                seed++;
                void *send = fill(t, (size_t)size * n, seed, rank, 0);
                void *recv = malloc(n * TYPE_SIZES[t]);
                assert_non_null(recv);
                assert_nopad_ok(comm_reduce_scatter(c, NULL, recv, send, n, t, (comm_reduce)op));
                /* this rank's part: elements rank · n .. of every rank's send */
                check_reduced("reduce_scatter", t, (comm_reduce)op, recv, n, seed, (uint64_t)rank * n, size);
                /* in place (recv = send + rank · n) the same, and the very bits the all-reduce gives
                 * this block (a residual stream split by rows must equal the replicated one) */
                const size_t es = TYPE_SIZES[t];
                char *in_place = fill(t, (size_t)size * n, seed, rank, 0), *reduced = fill(t, (size_t)size * n, seed, rank, 0);
                assert_nopad_ok(comm_reduce_scatter(c, NULL, in_place + (size_t)rank * n * es, in_place, n, t,
                                                    (comm_reduce)op));
                assert_nopad_ok(comm_all_reduce(c, NULL, reduced, (size_t)size * n, t, (comm_reduce)op));
                if (memcmp(in_place + (size_t)rank * n * es, recv, n * es) != 0)
                    fail_msg("reduce_scatter %s op %d n %zu: in place differs", TYPE_NAMES[t], op, n);
                if (memcmp(reduced + (size_t)rank * n * es, recv, n * es) != 0)
                    fail_msg("reduce_scatter %s op %d n %zu: not the all-reduce's bits", TYPE_NAMES[t], op, n);
                free(in_place);
                free(reduced);
                free(send);
                free(recv);
            }
        }
    }
    comm_free(c);
}

static void test_broadcast_from_every_root(void **state) {
    nopad_comm *c = world();
    const int32_t size = comm_size(c), rank = comm_rank(c);
    uint64_t seed = 400;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const comm_type t = TYPES[ti];
        for (int ci = 0; ci < N_COUNTS; ci++) {
            const size_t n = COUNTS[ci];
            for (int32_t root = size - 1; root >= 0; root--) {
                if (n > 1000 && root != 1) continue; /* the long count from a root other than 0 */
                seed++;
                void *buf = fill(t, n, seed, rank, 0); /* every rank's own data, overwritten but root's */
                assert_nopad_ok(comm_broadcast(c, NULL, buf, n, t, root));
                check_exact("broadcast", t, buf, n, seed, root, 0);
                free(buf);
            }
        }
    }
    comm_free(c);
}

/* Elements rank `from` sends rank `to`: uneven, and none for some pairs (a rank to itself too). */
static size_t a2a_count(int32_t from, int32_t to) { return (size_t)((from * 2 + to * 3) % 4) * 3; }

static void test_all_to_allv_uneven(void **state) {
    nopad_comm *c = world();
    const int32_t size = comm_size(c), rank = comm_rank(c);
    static const comm_type types[] = {COMM_F32, COMM_F16, COMM_I64, COMM_BYTE};
    size_t *sc = calloc((size_t)size * 4, sizeof *sc), *so = sc + size, *rc = sc + 2 * size, *ro = sc + 3 * size;
    assert_non_null(sc);
    /* parts laid out with a gap of 2 elements after each (the gaps must stay untouched), and the
     * send parts in reverse rank order, so offsets are not just running sums */
    int has_zero = 0;
    for (int32_t f = 0; f < size; f++)
        for (int32_t p = 0; p < size; p++) has_zero |= a2a_count(f, p) == 0;
    assert_true(has_zero);
    size_t send_total = 0, recv_total = 0;
    for (int32_t p = size - 1; p >= 0; p--) {
        sc[p] = a2a_count(rank, p);
        so[p] = send_total;
        send_total += sc[p] + 2;
    }
    for (int32_t p = 0; p < size; p++) {
        rc[p] = a2a_count(p, rank);
        ro[p] = recv_total;
        recv_total += rc[p] + 2;
    }
    for (int k = 0; k < 4; k++) {
        const comm_type t = types[k];
        const uint64_t seed = 500 + (uint64_t)k;
        char *send = calloc(send_total + 1, TYPE_SIZES[t]);
        char *recv = malloc((recv_total + 1) * TYPE_SIZES[t]);
        assert_true(send && recv);
        memset(recv, 0x77, (recv_total + 1) * TYPE_SIZES[t]);
        for (int32_t p = 0; p < size; p++) /* element j for rank p: index p · 1000 + j of our data */
            for (size_t j = 0; j < sc[p]; j++) store(t, send, so[p] + j, element(t, seed, rank, (uint64_t)p * 1000 + j));
        assert_nopad_ok(comm_all_to_allv(c, NULL, recv, rc, ro, send, sc, so, t));
        for (int32_t p = 0; p < size; p++) {
            check_exact("all_to_allv", t, recv + ro[p] * TYPE_SIZES[t], rc[p], seed, p, (uint64_t)rank * 1000);
            for (size_t g = 0; g < 2 * TYPE_SIZES[t]; g++)
                if ((uint8_t)recv[(ro[p] + rc[p]) * TYPE_SIZES[t] + g] != 0x77)
                    fail_msg("all_to_allv %s: the gap after rank %d's part was written", TYPE_NAMES[t], p);
        }
        /* started, then other collectives while it is in flight (as a training step's exchange of
         * the next step), then waited for: the same bytes. The counts are the caller's to reuse
         * once started: overwritten before the wait. */
        char *later = malloc((recv_total + 1) * TYPE_SIZES[t]);
        size_t *counts = malloc(4 * (size_t)size * sizeof *counts);
        assert_true(later && counts);
        memcpy(counts, sc, 4 * (size_t)size * sizeof *counts);
        memset(later, 0x77, (recv_total + 1) * TYPE_SIZES[t]);
        comm_host_request *req = NULL;
        assert_nopad_ok(comm_host_all_to_allv_start(c, later, counts + 2 * size, counts + 3 * size, send, counts,
                                                    counts + size, t, &req));
        memset(counts, 0xff, 4 * (size_t)size * sizeof *counts);
        int64_t sum = rank + 1;
        assert_nopad_ok(comm_all_reduce(c, NULL, &sum, 1, COMM_I64, COMM_SUM));
        assert_int_equal(sum, (int64_t)size * (size + 1) / 2);
        assert_nopad_ok(comm_barrier(c, NULL));
        assert_nopad_ok(comm_host_wait(c, req));
        if (memcmp(later, recv, (recv_total + 1) * TYPE_SIZES[t]) != 0)
            fail_msg("all_to_allv %s started and waited: not the bytes of the blocking call", TYPE_NAMES[t]);
        free(counts);
        free(later);
        free(send);
        free(recv);
    }
    free(sc);
    comm_free(c);
}

/* A rank that never joins: the others' bounded wait ends in a clear error within the bound, and
 * says the world is out of step. Rank 0 joins afterwards, so nothing is left pending. */
static void test_wait_limit(void **state) {
    (void)state;
    nopad_comm *c = world();
    const int32_t rank = comm_rank(c);
    nopad_comm *d = NULL;
    assert_nopad_ok(comm_split(c, 0, rank, &d));
    int32_t value = rank + 1;
    if (rank != 0) {
        comm_set_wait_limit(d, 0.3);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        const nopad_status st = comm_all_reduce(d, NULL, &value, 1, COMM_I32, COMM_SUM);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const double waited = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        assert_int_equal(st, NOPAD_ERR_BACKEND);
        assert_non_null(strstr(nopad_last_error(), "did not join within 0.3 s"));
        assert_true(comm_timed_out(d));
        assert_true(waited >= 0.3 && waited < 30); /* bounded: the test's own limit is far above */
    } else {
        assert_false(comm_timed_out(d));
    }
    assert_nopad_ok(comm_barrier(c, NULL));
    if (rank == 0) assert_nopad_ok(comm_all_reduce(d, NULL, &value, 1, COMM_I32, COMM_SUM));
    assert_nopad_ok(comm_barrier(c, NULL));
    comm_free(d);
    comm_free(c);
}

static void test_split_into_two_groups(void **state) {
    nopad_comm *c = world();
    const int32_t size = comm_size(c), rank = comm_rank(c);
    nopad_comm *half = NULL;
    /* even and odd ranks, each group in reverse order of world rank */
    assert_nopad_ok(comm_split(c, rank % 2, -rank, &half));
    const int32_t members = (size - rank % 2 + 1) / 2;
    assert_int_equal(comm_size(half), members);
    int32_t higher = 0; /* ranks of my parity above me come first */
    for (int32_t r = rank + 2; r < size; r += 2) higher++;
    assert_int_equal(comm_rank(half), higher);
    /* a sum over the group only: the world ranks of my parity */
    int64_t sum = rank, want = 0;
    for (int32_t r = rank % 2; r < size; r += 2) want += r;
    assert_nopad_ok(comm_all_reduce(half, NULL, &sum, 1, COMM_I64, COMM_SUM));
    assert_int_equal(sum, want);
    /* the group's rank 0 broadcasts to its group alone */
    int32_t root_world = rank;
    assert_nopad_ok(comm_broadcast(half, NULL, &root_world, 1, COMM_I32, 0));
    const int32_t top = size - 1 - ((size - 1 - rank) % 2); /* highest rank of my parity */
    assert_int_equal(root_world, top);
    comm_free(half);
    /* the world still works after the group is gone */
    int32_t one = 1;
    assert_nopad_ok(comm_all_reduce(c, NULL, &one, 1, COMM_I32, COMM_SUM));
    assert_int_equal(one, size);
    comm_free(c);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_barrier_waits_for_the_last(void **state) {
    nopad_comm *c = world();
    assert_nopad_ok(comm_barrier(c, NULL));
    const double start = now_s();
    /* the last rank arrives 300 ms late; the others must wait for it. 150 ms allows for the
     * ranks leaving the first barrier up to 150 ms apart on a busy machine */
    if (comm_rank(c) == comm_size(c) - 1) nanosleep(&(struct timespec){0, 300 * 1000 * 1000}, NULL);
    assert_nopad_ok(comm_barrier(c, NULL));
    const double waited = now_s() - start;
    if (!(waited >= 0.15)) fail_msg("comm_barrier returned after %.3f s, before the late rank came (0.3 s)", waited);
    comm_free(c);
}

static void test_host_broadcast_big(void **state) {
    nopad_comm *c = world();
    const int32_t size = comm_size(c), rank = comm_rank(c);
    const size_t bytes = ((size_t)48 << 20) + 5; /* 48 MiB and an odd tail */
    const int32_t root = size - 1;
    uint8_t *buf = malloc(bytes);
    assert_non_null(buf);
    for (size_t i = 0; i < bytes; i++) buf[i] = (uint8_t)(mpi_draw(600, rank, i / 8) >> (8 * (i % 8)));
    assert_nopad_ok(comm_host_broadcast(c, buf, bytes, root));
    for (size_t i = 0; i < bytes; i++)
        if (buf[i] != (uint8_t)(mpi_draw(600, root, i / 8) >> (8 * (i % 8))))
            fail_msg("host_broadcast: byte %zu of %zu differs from root %d's", i, bytes, root);
    free(buf);
    comm_free(c);
}

/* comm_world(1) under the launcher: this process alone, no MPI: collectives copy. */
static void test_world_of_one_under_the_launcher(void **state) {
    nopad_comm *c = NULL;
    assert_nopad_ok(comm_world(1, &c));
    assert_int_equal(comm_size(c), 1);
    assert_int_equal(comm_rank(c), 0);
    float x[3] = {0.25f, -1.5f, 3.0f};
    assert_nopad_ok(comm_all_reduce(c, NULL, x, 3, COMM_F32, COMM_SUM));
    assert_true(x[0] == 0.25f && x[1] == -1.5f && x[2] == 3.0f);
    float y[3] = {0};
    assert_nopad_ok(comm_all_gather(c, NULL, y, x, 3, COMM_F32));
    assert_memory_equal(x, y, sizeof x);
    int64_t send[5] = {1, 2, 3, 4, 5}, recv[5] = {0};
    const size_t sc[1] = {3}, so[1] = {2}, rcount[1] = {3}, ro[1] = {1};
    assert_nopad_ok(comm_all_to_allv(c, NULL, recv, rcount, ro, send, sc, so, COMM_I64));
    assert_true(recv[0] == 0 && recv[1] == 3 && recv[2] == 4 && recv[3] == 5 && recv[4] == 0);
    assert_nopad_ok(comm_barrier(c, NULL));
    comm_free(c);
}

/* For tests/cli_comm_fault.sh: all-reduces without end, until rank NOPAD_TEST_KILL_RANK kills
 * itself (SIGKILL) or rank NOPAD_TEST_EXIT_RANK exits with status 3 (exit: MPI_Finalize runs at
 * exit) after 50 of them. The others are then inside an all-reduce that can never complete: the
 * launcher must end them. Returns only on a communicator error. */
static int run_until_a_rank_dies(void) {
    const char *kill_env = getenv("NOPAD_TEST_KILL_RANK"), *exit_env = getenv("NOPAD_TEST_EXIT_RANK");
    const int32_t kill_rank = kill_env ? atoi(kill_env) : -1, exit_rank = exit_env ? atoi(exit_env) : -1;
    nopad_comm *c = NULL;
    if (comm_world(nopad_world_size(), &c) != NOPAD_OK) {
        fprintf(stderr, "rank %d: %s\n", nopad_world_rank(), nopad_last_error());
        return 1;
    }
    float x[4096] = {0};
    for (long i = 0;; i++) {
        if (i == 50 && comm_rank(c) == kill_rank) raise(SIGKILL);
        if (i == 50 && comm_rank(c) == exit_rank) exit(3);
        if (comm_all_reduce(c, NULL, x, 4096, COMM_F32, COMM_SUM) != NOPAD_OK) {
            fprintf(stderr, "rank %d: %s\n", comm_rank(c), nopad_last_error());
            return 1;
        }
    }
}

int main(void) {
    if (getenv("NOPAD_TEST_KILL_RANK") || getenv("NOPAD_TEST_EXIT_RANK")) return run_until_a_rank_dies();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world_and_refusals),
        cmocka_unit_test(test_all_reduce),
        cmocka_unit_test(test_all_gather),
        cmocka_unit_test(test_reduce_scatter),
        cmocka_unit_test(test_broadcast_from_every_root),
        cmocka_unit_test(test_all_to_allv_uneven),
        cmocka_unit_test(test_split_into_two_groups),
        cmocka_unit_test(test_wait_limit),
        cmocka_unit_test(test_barrier_waits_for_the_last),
        cmocka_unit_test(test_host_broadcast_big),
        cmocka_unit_test(test_world_of_one_under_the_launcher),
    };
    return MPI_RUN_TESTS(tests);
}

/* The communicator on NCCL with one GPU: NOPAD_COMM_FORCE makes a world of one go through NCCL
 * (bootstrapped locally, no MPI), so every collective on device buffers must give back its input
 * exactly (one rank: a sum, max or min over one value is that value), in every type, at odd counts;
 * a collective captured in a CUDA graph through be->graph_run and replayed on new data; the
 * watchdog aborting a collective that stays pending past NOPAD_COMM_TIMEOUT; and a missing libnccl
 * refused naming the file and NOPAD_NCCL_LIBRARY. Exits 77 without a GPU. Needs libnccl.so.2 on the
 * loader's path, or NOPAD_NCCL_LIBRARY naming it. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_testutil.h"
#include "parallel/comm.h"
#include "util/knobs.h"

static const comm_type TYPES[] = {COMM_F32, COMM_F16, COMM_BF16, COMM_I32, COMM_I64, COMM_BYTE};
enum { N_TYPES = sizeof TYPES / sizeof TYPES[0] };
static const size_t COUNTS[] = {1, 3, 1000003};

static nopad_backend *gpu(void) {
    nopad_backend_params p = {.device = NOPAD_DEVICE_CUDA, .device_index = 0, .dtype = NOPAD_DTYPE_BF16};
    nopad_backend *be = NULL;
    assert_nopad_ok(nopad_backend_create(&p, &be));
    return be;
}

/* n random elements of type t, valid values (no NaN: they must compare equal byte for byte). */
static uint8_t *random_elements(comm_type t, size_t n, uint64_t *rng) {
    const size_t es = comm_type_size(t);
    uint8_t *h = malloc(n * es);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = test_rand_u32(rng);
        const float f = (float)((double)u / 4294967296.0 * 4.0 - 2.0);
        switch (t) {
        case COMM_F32: memcpy(h + 4 * i, &f, 4); break;
        case COMM_F16: {
            const _Float16 x = (_Float16)f;
            memcpy(h + 2 * i, &x, 2);
            break;
        }
        case COMM_BF16: {
            uint32_t bits;
            memcpy(&bits, &f, 4);
            const uint16_t top = (uint16_t)(bits >> 16);
            memcpy(h + 2 * i, &top, 2);
            break;
        }
        case COMM_I32: memcpy(h + 4 * i, &u, 4); break;
        case COMM_I64: {
            const uint64_t v = ((uint64_t)test_rand_u32(rng) << 32) | u;
            memcpy(h + 8 * i, &v, 8);
            break;
        }
        case COMM_BYTE: h[i] = (uint8_t)u; break;
        }
    }
    return h;
}

static void *to_device(nopad_backend *be, const void *host, size_t bytes) {
    void *d = NULL;
    assert_nopad_ok(be->alloc(be, bytes, &d));
    assert_nopad_ok(be->upload(be, d, host, bytes));
    return d;
}

static void expect_device_equals(nopad_backend *be, const void *dev, const void *want, size_t bytes, const char *what) {
    uint8_t *got = malloc(bytes);
    assert_non_null(got);
    assert_nopad_ok(be->download(be, got, dev, bytes));
    for (size_t i = 0; i < bytes; i++)
        if (got[i] != ((const uint8_t *)want)[i]) fail_msg("%s: byte %zu of %zu differs", what, i, bytes);
    free(got);
}

/* Runs first: a missing library is refused, then the real one (the caller's setting) loads. */
static void test_missing_libnccl_refused(void **state) {
    const char *saved = getenv("NOPAD_NCCL_LIBRARY");
    char *keep = saved ? strdup(saved) : NULL;
    setenv("NOPAD_NCCL_LIBRARY", "/nonexistent/libnccl-missing.so.2", 1);
    nopad_backend *be = gpu();
    nopad_comm *c = NULL;
    assert_nopad_ok(comm_world(1, &c));
    assert_nopad_error(comm_attach(c, be), NOPAD_ERR_UNSUPPORTED, "/nonexistent/libnccl-missing.so.2");
    assert_nopad_error(comm_attach(c, be), NOPAD_ERR_UNSUPPORTED, "NOPAD_NCCL_LIBRARY");
    float x = 1;
    assert_nopad_error(comm_all_reduce(c, be, &x, 1, COMM_F32, COMM_SUM), NOPAD_ERR_INVALID_ARGUMENT, "comm_attach");
    if (keep) setenv("NOPAD_NCCL_LIBRARY", keep, 1);
    else unsetenv("NOPAD_NCCL_LIBRARY");
    free(keep);
    assert_nopad_ok(comm_attach(c, be));
    comm_free(c);
    be->destroy(be);
}

static void test_collectives_of_one_rank(void **state) {
    nopad_backend *be = gpu();
    nopad_comm *c = NULL;
    assert_nopad_ok(comm_world(1, &c));
    assert_nopad_ok(comm_attach(c, be));
    assert_nopad_ok(comm_attach(c, be)); /* the same device again: nothing to do */
    uint64_t rng = 7;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const comm_type t = TYPES[ti];
        const size_t es = comm_type_size(t);
        for (int ci = 0; ci < 3; ci++) {
            const size_t n = COUNTS[ci], bytes = n * es;
            uint8_t *h = random_elements(t, n, &rng);
            void *a = to_device(be, h, bytes), *b = NULL;
            assert_nopad_ok(be->alloc(be, bytes, &b));
            if (t != COMM_BYTE)
                for (int op = COMM_SUM; op <= COMM_MIN; op++) {
                    assert_nopad_ok(comm_all_reduce(c, be, a, n, t, (comm_reduce)op));
                    expect_device_equals(be, a, h, bytes, "all_reduce");
                }
            assert_nopad_ok(comm_all_gather(c, be, b, a, n, t));
            expect_device_equals(be, b, h, bytes, "all_gather");
            assert_nopad_ok(comm_all_gather(c, be, b, b, n, t));
            expect_device_equals(be, b, h, bytes, "all_gather in place");
            if (t != COMM_BYTE) {
                assert_nopad_ok(be->upload(be, b, h + bytes / 2, bytes - bytes / 2)); /* b differs from a */
                assert_nopad_ok(comm_reduce_scatter(c, be, b, a, n, t, COMM_SUM));
                expect_device_equals(be, b, h, bytes, "reduce_scatter");
            }
            assert_nopad_ok(comm_broadcast(c, be, a, n, t, 0));
            expect_device_equals(be, a, h, bytes, "broadcast");
            /* all-to-all(v) to itself: n - 1 elements from offset 1 to offset 0 */
            const size_t cnt[1] = {n - 1}, send_off[1] = {1}, recv_off[1] = {0};
            assert_nopad_ok(comm_all_to_allv(c, be, b, cnt, recv_off, a, cnt, send_off, t));
            expect_device_equals(be, b, h + es, (n - 1) * es, "all_to_allv");
            be->free(be, a);
            be->free(be, b);
            free(h);
        }
    }
    assert_nopad_ok(comm_barrier(c, be));
    comm_free(c);
    be->destroy(be);
}

typedef struct graph_job {
    nopad_comm *c;
    nopad_backend *be;
    void *src, *tmp, *dst;
    size_t n;
} graph_job;

/* dst = all_reduce(copy of src): the collective between two ops, all on the backend's stream. */
static nopad_status record_reduce(void *arg) {
    graph_job *j = arg;
    nopad_status st = j->be->copy(j->be, j->tmp, j->src, j->n * 4);
    if (st == NOPAD_OK) st = comm_all_reduce(j->c, j->be, j->tmp, j->n, COMM_F32, COMM_SUM);
    if (st == NOPAD_OK) st = j->be->copy(j->be, j->dst, j->tmp, j->n * 4);
    return st;
}

static void test_collective_in_a_graph(void **state) {
    nopad_backend *be = gpu();
    assert_non_null(be->graph_run);
    nopad_comm *c = NULL;
    assert_nopad_ok(comm_world(1, &c));
    assert_nopad_ok(comm_attach(c, be));
    uint64_t rng = 11;
    graph_job j = {.c = c, .be = be, .n = 4099};
    float *h = malloc(j.n * 4);
    assert_non_null(h);
    assert_nopad_ok(be->alloc(be, j.n * 4, &j.src));
    assert_nopad_ok(be->alloc(be, j.n * 4, &j.tmp));
    assert_nopad_ok(be->alloc(be, j.n * 4, &j.dst));
    const int64_t key[4] = {0x636f6d6d, 1, 2, 3};
    const int64_t recorded = be->graphs_recorded, replays = be->graph_replays;
    for (int round = 0; round < 3; round++) { /* the first records, the others replay on new data */
        test_fill_uniform(h, (int64_t)j.n, -3.0f, 3.0f, &rng);
        assert_nopad_ok(be->upload(be, j.src, h, j.n * 4));
        assert_nopad_ok(be->graph_run(be, key, record_reduce, &j));
        assert_nopad_ok(comm_watch(c, be));
        expect_device_equals(be, j.dst, h, j.n * 4, "all_reduce in a graph");
    }
    assert_int_equal(be->graphs_recorded - recorded, 1);
    assert_true(be->graph_replays - replays >= 2);
    be->free(be, j.src);
    be->free(be, j.tmp);
    be->free(be, j.dst);
    free(h);
    comm_free(c);
    be->destroy(be);
}

static void CUDART_CB sleep_on_stream(void *seconds) { sleep(*(unsigned *)seconds); }

/* A collective held back on its stream for 4 s, with NOPAD_COMM_TIMEOUT at 1 s: the watchdog
 * aborts the communicator and the next call says why. */
static void test_watchdog_aborts_a_stuck_collective(void **state) {
    knob_set_int(KNOB_COMM_TIMEOUT, 1);
    nopad_backend *be = gpu();
    nopad_comm *c = NULL;
    assert_nopad_ok(comm_world(1, &c));
    assert_nopad_ok(comm_attach(c, be));
    float *d = NULL;
    assert_nopad_ok(be->alloc(be, 64 * sizeof *d, (void **)&d));
    static unsigned seconds = 4;
    assert_int_equal(cudaLaunchHostFunc((cudaStream_t)be->native_stream, sleep_on_stream, &seconds), cudaSuccess);
    assert_nopad_ok(comm_all_reduce(c, be, d, 64, COMM_F32, COMM_SUM));
    assert_nopad_ok(be->synchronize(be)); /* the host function ends; the aborted kernel returns */
    assert_nopad_error(comm_all_reduce(c, be, d, 64, COMM_F32, COMM_SUM), NOPAD_ERR_BACKEND, "NOPAD_COMM_TIMEOUT");
    assert_nopad_error(comm_barrier(c, be), NOPAD_ERR_BACKEND, "aborted");
    comm_free(c);
    be->free(be, d);
    be->destroy(be);
    knob_set_int(KNOB_COMM_TIMEOUT, 30);
}

int main(void) {
    const int skip = test_skip_without_gpu();
    if (skip) return skip;
    knob_set_int(KNOB_COMM_FORCE, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_libnccl_refused),
        cmocka_unit_test(test_collectives_of_one_rank),
        cmocka_unit_test(test_collective_in_a_graph),
        cmocka_unit_test(test_watchdog_aborts_a_stuck_collective),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

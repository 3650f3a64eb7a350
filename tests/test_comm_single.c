/* The communicator's world of one, without a launcher (a plain process, tp = 1): no MPI, every
 * collective a copy at most, on random data; and a world of more ranks refused with what to run. */
#include <string.h>

#include "parallel/comm.h"
#include "testutil.h"

static void test_world_of_one_copies(void **state) {
    nopad_comm *c = NULL;
    assert_nopad_ok(comm_world(1, &c));
    assert_int_equal(comm_size(c), 1);
    assert_int_equal(comm_rank(c), 0);
    assert_int_equal(comm_local_size(c), 1);
    assert_int_equal(comm_local_rank(c), 0);
    assert_nopad_ok(comm_attach(c, NULL));

    uint64_t rng = 17;
    enum { N = 1001 };
    float a[N], keep[N], b[N];
    test_fill_uniform(a, N, -2.0f, 2.0f, &rng);
    memcpy(keep, a, sizeof a);
    for (int op = COMM_SUM; op <= COMM_MIN; op++) {
        assert_nopad_ok(comm_all_reduce(c, NULL, a, N, COMM_F32, (comm_reduce)op));
        assert_memory_equal(a, keep, sizeof a);
    }
    memset(b, 0, sizeof b);
    assert_nopad_ok(comm_all_gather(c, NULL, b, a, N, COMM_F32));
    assert_memory_equal(b, keep, sizeof b);
    assert_nopad_ok(comm_all_gather(c, NULL, b, b, N, COMM_F32)); /* in place */
    assert_memory_equal(b, keep, sizeof b);
    memset(b, 0, sizeof b);
    assert_nopad_ok(comm_reduce_scatter(c, NULL, b, a, N, COMM_F32, COMM_SUM));
    assert_memory_equal(b, keep, sizeof b);
    assert_nopad_ok(comm_broadcast(c, NULL, a, N, COMM_F32, 0));
    assert_memory_equal(a, keep, sizeof a);

    /* all-to-all(v) to itself: 7 bytes from offset 3 to offset 11, the rest untouched */
    uint8_t send[16], recv[20];
    for (int i = 0; i < 16; i++) send[i] = (uint8_t)test_rand_u32(&rng);
    memset(recv, 0xee, sizeof recv);
    const size_t count[1] = {7}, send_off[1] = {3}, recv_off[1] = {11};
    assert_nopad_ok(comm_all_to_allv(c, NULL, recv, count, recv_off, send, count, send_off, COMM_BYTE));
    assert_memory_equal(recv + 11, send + 3, 7);
    for (int i = 0; i < 11; i++) assert_int_equal(recv[i], 0xee);
    assert_int_equal(recv[18], 0xee);
    const size_t other[1] = {6};
    assert_nopad_error(comm_all_to_allv(c, NULL, recv, other, recv_off, send, count, send_off, COMM_BYTE),
                       NOPAD_ERR_INVALID_ARGUMENT, "sends itself 7");

    assert_nopad_ok(comm_barrier(c, NULL));
    assert_nopad_ok(comm_host_broadcast(c, send, sizeof send, 0));
    assert_nopad_error(comm_host_broadcast(c, send, sizeof send, 1), NOPAD_ERR_INVALID_ARGUMENT, "root 1");

    nopad_comm *part = NULL;
    assert_nopad_ok(comm_split(c, 0, 0, &part));
    assert_int_equal(comm_size(part), 1);
    comm_free(part);
    comm_free(c);
}

static void test_more_ranks_without_a_launcher_refused(void **state) {
    nopad_comm *c = NULL;
#ifdef NOPAD_TEST_NO_MPI
    assert_nopad_error(comm_world(2, &c), NOPAD_ERR_UNSUPPORTED, "libopenmpi-dev");
#else
    assert_nopad_error(comm_world(2, &c), NOPAD_ERR_INVALID_ARGUMENT, "mpirun -np 2");
#endif
    assert_null(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world_of_one_copies),
        cmocka_unit_test(test_more_ranks_without_a_launcher_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

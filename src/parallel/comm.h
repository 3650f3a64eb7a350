/* The communicator: collectives between the ranks of a tensor-parallel (or, later, data-parallel)
 * group, on engines that exist — never a transport of our own:
 *   - a CPU backend's tensors (host memory) go through MPI (Open MPI);
 *   - a CUDA backend's tensors (device memory) go through NCCL, enqueued on that backend's stream
 *     with no host sync, so a step that calls them can be recorded in a CUDA graph. NCCL's unique
 *     id goes out over MPI, so ranks may sit on several machines.
 * A world of one rank (no launcher, or a build without MPI) costs nothing: every collective is a
 * copy at most, and no MPI or NCCL call is made.
 *
 * The process's world comes from its launcher (mpirun, srun: MPI's environment); nopad never
 * starts MPI when tp is 1. Every MPI or NCCL failure is a nopad_status with a message naming the
 * operation, the rank and the library's own words. A rank that dies makes the others fail within
 * a bounded time (the launcher ends the job; NCCL's pending work is aborted by a watchdog after
 * NOPAD_COMM_TIMEOUT seconds, see util/knobs.c), never a hang.
 *
 * Buffers: `be` is the backend whose memory the buffer lives in. NULL or a CPU backend: host
 * memory, MPI. A CUDA backend: its device memory, NCCL on its stream. Counts are elements. */
#ifndef NOPAD_PARALLEL_COMM_H
#define NOPAD_PARALLEL_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "nopad.h"

typedef struct nopad_comm nopad_comm;

typedef enum comm_type {
    COMM_F32 = 0,
    COMM_F16 = 1,
    COMM_BF16 = 2,
    COMM_I32 = 3,
    COMM_I64 = 4,
    COMM_BYTE = 5, /* broadcast, all-gather and all-to-all(v) only */
} comm_type;

typedef enum comm_reduce { COMM_SUM = 0, COMM_MAX = 1, COMM_MIN = 2 } comm_reduce;

/* The comm_type of a backend's tensor elements. */
comm_type comm_type_of(nopad_dtype dtype);
/* Bytes of one element of `t` (0 for a value that is not a comm_type). */
size_t comm_type_size(comm_type t);

/* The world this process was launched in, as a communicator (a new handle each call; free it).
 * `want` is the size asked for (tp_size; <= 1: one rank, never touching MPI). Under a launcher
 * whose world has `want` ranks, MPI is initialised (thread level MPI_THREAD_MULTIPLE) if it is not
 * already; a world of another size, no launcher, or a build without MPI is a clear
 * NOPAD_ERR_INVALID_ARGUMENT / NOPAD_ERR_UNSUPPORTED naming what to run instead. */
nopad_status comm_world(int32_t want, nopad_comm **out);
/* A world started from this process, with no launcher: `workers` processes of `program` (argv[1]
 * = `arg`) on this machine, through MPI_Comm_spawn (Open MPI starts them; they may oversubscribe
 * the cores, and are not bound to any). This process is rank 0 and the workers ranks 1..workers;
 * each worker finds the world with comm_parent. Freeing the communicator disconnects the workers
 * (collective: they free theirs too). */
nopad_status comm_spawn(int32_t workers, const char *program, const char *arg, nopad_comm **out);
/* In a process that comm_spawn started: the world of its leader (rank 0) and its workers.
 * NOPAD_ERR_INVALID_ARGUMENT when no leader started this process. */
nopad_status comm_parent(nopad_comm **out);
/* A sub-group: ranks of equal `color` form one communicator, ordered by `key` (MPI_Comm_split). */
nopad_status comm_split(nopad_comm *c, int32_t color, int32_t key, nopad_comm **out);
void comm_free(nopad_comm *c);

int32_t comm_rank(const nopad_comm *c);
int32_t comm_size(const nopad_comm *c);
/* Ranks on this rank's machine, and this rank's index among them (the CUDA device it takes). */
int32_t comm_local_rank(const nopad_comm *c);
int32_t comm_local_size(const nopad_comm *c);

/* Prepares collectives on `be`'s memory: for a CUDA backend, the NCCL communicator on its device
 * (once per communicator; later calls with a backend of the same device return at once). Checks
 * what must agree across ranks and refuses clearly: more ranks on a machine than GPUs, GPUs of
 * different kinds. Collective: every rank calls it. */
nopad_status comm_attach(nopad_comm *c, nopad_backend *be);

/* ---- collectives: every rank calls them in the same order, with the same counts ------------- */
/* buf[count] = reduce over ranks of buf[count], in place. */
nopad_status comm_all_reduce(nopad_comm *c, nopad_backend *be, void *buf, size_t count, comm_type t,
                             comm_reduce op);
/* The same all-reduce, left running while be's stream goes on with later work (a data-parallel
 * backward's gradient buckets, each started as soon as it is written): on a CUDA backend NCCL runs
 * it on a second stream after the work be's stream holds so far, and be's stream must not touch
 * buf until comm_join. On host memory it completes before returning (MPI progresses only inside
 * its calls: there is nothing to overlap with). */
nopad_status comm_all_reduce_async(nopad_comm *c, nopad_backend *be, void *buf, size_t count, comm_type t,
                                   comm_reduce op);
/* be's stream waits for every comm_all_reduce_async started on it so far (nothing on the host). */
nopad_status comm_join(nopad_comm *c, nopad_backend *be);
/* recv[size · count] = rank 0's send[count] | rank 1's | ...; send may be recv + rank · count. */
nopad_status comm_all_gather(nopad_comm *c, nopad_backend *be, void *recv, const void *send, size_t count,
                             comm_type t);
/* recv[count] = reduce over ranks of their send[rank · count .. (rank + 1) · count); recv may be
 * send + rank · count. On host memory floats are summed as comm_all_reduce sums them (in double,
 * rounded once): the same bits as the all-reduce gives those elements. */
nopad_status comm_reduce_scatter(nopad_comm *c, nopad_backend *be, void *recv, const void *send,
                                 size_t count, comm_type t, comm_reduce op);
/* buf[count] = root's buf[count]. */
nopad_status comm_broadcast(nopad_comm *c, nopad_backend *be, void *buf, size_t count, comm_type t,
                            int32_t root);
/* Rank r sends send[send_offsets[p] .. + send_counts[p]) to each rank p and receives rank p's part
 * into recv[recv_offsets[p] .. + recv_counts[p]); counts and offsets [size], in elements. */
nopad_status comm_all_to_allv(nopad_comm *c, nopad_backend *be, void *recv, const size_t *recv_counts,
                              const size_t *recv_offsets, const void *send, const size_t *send_counts,
                              const size_t *send_offsets, comm_type t);
/* Returns once every rank has called it (for a CUDA backend: once its stream's work before it is
 * done on every rank). */
nopad_status comm_barrier(nopad_comm *c, nopad_backend *be);

/* For the NCCL watchdog: marks the current end of be's stream, which holds collectives enqueued
 * outside the calls above (a replayed CUDA graph that recorded them). When that point is not
 * reached within NOPAD_COMM_TIMEOUT seconds, the communicator is aborted and the next call fails.
 * A no-op without NCCL. */
nopad_status comm_watch(nopad_comm *c, nopad_backend *be);

/* Bounds every later wait of this rank's host collectives (MPI) to `seconds` (0: unbounded, the
 * default): one that waits longer fails with NOPAD_ERR_BACKEND saying so, and comm_timed_out
 * then returns 1. The world is then out of step: the collective that gave up is still pending, and
 * MPI may read and write its buffers at any later MPI call, so the process should end soon. A
 * tensor-parallel follower bounds the collectives inside a step, where the others are at most a
 * step's work away, and not its wait for the next step. */
void comm_set_wait_limit(nopad_comm *c, double seconds);
int comm_timed_out(const nopad_comm *c);

/* ---- host control messages (a step's plan from rank 0): MPI on host memory, whatever backend -- */
nopad_status comm_host_broadcast(nopad_comm *c, void *buf, size_t bytes, int32_t root);

/* comm_all_to_allv on host memory, started here and finished by comm_host_wait, so that it
 * overlaps the caller's work (a training step's exchange of the next step's sequences). MPI moves
 * it inside the MPI calls in between (the step's own collectives) and inside the wait. recv and
 * send stay untouched until the wait; the counts and offsets are copied. Every rank starts and
 * waits the same exchanges in the same order, among its other collectives. *out is NULL when
 * nothing is left to wait for (a world without MPI copies at once). */
typedef struct comm_host_request comm_host_request;
nopad_status comm_host_all_to_allv_start(nopad_comm *c, void *recv, const size_t *recv_counts,
                                         const size_t *recv_offsets, const void *send, const size_t *send_counts,
                                         const size_t *send_offsets, comm_type t, comm_host_request **out);
/* Waits for the exchange and frees req (NULL: nothing to wait for). */
nopad_status comm_host_wait(nopad_comm *c, comm_host_request *req);

#endif

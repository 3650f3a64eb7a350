/* The communicator's NCCL transport (comm_nccl.c), for comm.c only: an NCCL communicator over a
 * nopad_comm's ranks on one CUDA device, collectives enqueued on a backend's stream, and the
 * watchdog that aborts it when a peer stops answering. Present in CUDA builds only; libnccl is
 * loaded at run time ($NOPAD_NCCL_LIBRARY, else libnccl.so.2). */
#ifndef NOPAD_PARALLEL_COMM_NCCL_H
#define NOPAD_PARALLEL_COMM_NCCL_H

#ifdef NOPAD_HAVE_CUDA

#include "parallel/comm.h"

typedef struct comm_nccl comm_nccl;

/* Collective over c's ranks (its host collectives carry the unique id and the checks): loads
 * libnccl, checks that the ranks of this machine do not outnumber its GPUs and that every rank has
 * the same kind of GPU, then creates the NCCL communicator on be's device and starts its watchdog.
 * Every rank gets the same verdict, so a refusal on one rank never leaves the others waiting. */
nopad_status comm_nccl_create(nopad_comm *c, nopad_backend *be, comm_nccl **out);
/* Destroys the communicator (aborts it when it failed or has work that never completed). */
void comm_nccl_free(comm_nccl *n);
int32_t comm_nccl_device(const comm_nccl *n);
/* Aborts the communicator now (a peer is known to be gone): stuck kernels return, and every later
 * call fails naming `cause`. Safe from any thread. */
void comm_nccl_abort(comm_nccl *n, const char *cause);

/* The collectives of comm.h on be's device memory, enqueued on be->native_stream. */
nopad_status comm_nccl_all_reduce(comm_nccl *n, nopad_backend *be, void *buf, size_t count, comm_type t,
                                  comm_reduce op);
/* comm_all_reduce_async and comm_join: NCCL on the communicator's second stream, ordered after
 * be's stream with events. */
nopad_status comm_nccl_all_reduce_async(comm_nccl *n, nopad_backend *be, void *buf, size_t count, comm_type t,
                                        comm_reduce op);
nopad_status comm_nccl_join(comm_nccl *n, nopad_backend *be);
nopad_status comm_nccl_all_gather(comm_nccl *n, nopad_backend *be, void *recv, const void *send, size_t count,
                                  comm_type t);
nopad_status comm_nccl_reduce_scatter(comm_nccl *n, nopad_backend *be, void *recv, const void *send,
                                      size_t count, comm_type t, comm_reduce op);
nopad_status comm_nccl_broadcast(comm_nccl *n, nopad_backend *be, void *buf, size_t count, comm_type t,
                                 int32_t root);
nopad_status comm_nccl_all_to_allv(comm_nccl *n, nopad_backend *be, void *recv, const size_t *recv_counts,
                                   const size_t *recv_offsets, const void *send, const size_t *send_counts,
                                   const size_t *send_offsets, comm_type t);
/* A one-element all-reduce, then a wait for the stream: every rank's work before it is done. */
nopad_status comm_nccl_barrier(comm_nccl *n, nopad_backend *be);
/* Puts a point on be's stream for the watchdog to time (see comm_watch in comm.h). */
nopad_status comm_nccl_watch(comm_nccl *n, nopad_backend *be);

#endif
#endif

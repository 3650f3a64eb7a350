/* The communicator's NCCL transport (comm_nccl.h). libnccl is opened at run time, so binaries never
 * need it unless a world runs on GPUs. Collectives are enqueued on the backend's stream and never
 * wait on the host, so a step can be captured in a CUDA graph.
 *
 * A dead peer must not hang the survivors inside a kernel that waits for it. A watchdog thread per
 * communicator polls every 100 ms: NCCL's asynchronous error, and the oldest collective not yet
 * seen complete (an event recorded after each one, with the time it was enqueued). An error, or a
 * collective pending for more than NOPAD_COMM_TIMEOUT seconds, aborts the communicator
 * (ncclCommAbort lets the stuck kernels return); every later call fails naming the cause. One
 * mutex serialises NCCL calls, the ring of events and the abort, so the abort never frees the
 * communicator under a call. */
#include "parallel/comm_nccl.h"

#ifdef NOPAD_HAVE_CUDA

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "util/error.h"
#include "util/knobs.h"

/* ---- libnccl, loaded once ---------------------------------------------------------------------- */

/* The entry points used, typed from nccl.h's own declarations. */
typedef struct nccl_api {
    __typeof__(ncclGetErrorString) *GetErrorString;
    __typeof__(ncclGetLastError) *GetLastError;
    __typeof__(ncclGetUniqueId) *GetUniqueId;
    __typeof__(ncclCommInitRank) *CommInitRank;
    __typeof__(ncclCommDestroy) *CommDestroy;
    __typeof__(ncclCommAbort) *CommAbort;
    __typeof__(ncclCommGetAsyncError) *CommGetAsyncError;
    __typeof__(ncclAllReduce) *AllReduce;
    __typeof__(ncclAllGather) *AllGather;
    __typeof__(ncclReduceScatter) *ReduceScatter;
    __typeof__(ncclBroadcast) *Broadcast;
    __typeof__(ncclSend) *Send;
    __typeof__(ncclRecv) *Recv;
    __typeof__(ncclGroupStart) *GroupStart;
    __typeof__(ncclGroupEnd) *GroupEnd;
} nccl_api;

static nccl_api api;
static int api_loaded;
static pthread_mutex_t api_lock = PTHREAD_MUTEX_INITIALIZER;

/* $NOPAD_NCCL_LIBRARY when set (an explicit choice wins), else libnccl.so.2 from the loader's
 * path. A failure is not remembered: a later call may find the library. */
static nopad_status nccl_load(void) {
    pthread_mutex_lock(&api_lock);
    nopad_status st = NOPAD_OK;
    if (api_loaded) goto done;
    const char *env = getenv("NOPAD_NCCL_LIBRARY");
    const char *path = env && *env ? env : "libnccl.so.2";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        st = nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                             "NCCL: cannot load %s (%s): collectives on CUDA need libnccl 2 (pip install "
                             "nvidia-nccl-cu12 puts it under site-packages/nvidia/nccl/lib); add its folder to "
                             "LD_LIBRARY_PATH or set NOPAD_NCCL_LIBRARY to the file",
                             path, dlerror());
        goto done;
    }
    struct {
        const char *name;
        void **slot;
    } const symbols[] = {
        {"ncclGetErrorString", (void **)&api.GetErrorString}, {"ncclGetLastError", (void **)&api.GetLastError},
        {"ncclGetUniqueId", (void **)&api.GetUniqueId},       {"ncclCommInitRank", (void **)&api.CommInitRank},
        {"ncclCommDestroy", (void **)&api.CommDestroy},       {"ncclCommAbort", (void **)&api.CommAbort},
        {"ncclCommGetAsyncError", (void **)&api.CommGetAsyncError},
        {"ncclAllReduce", (void **)&api.AllReduce},           {"ncclAllGather", (void **)&api.AllGather},
        {"ncclReduceScatter", (void **)&api.ReduceScatter},   {"ncclBroadcast", (void **)&api.Broadcast},
        {"ncclSend", (void **)&api.Send},                     {"ncclRecv", (void **)&api.Recv},
        {"ncclGroupStart", (void **)&api.GroupStart},         {"ncclGroupEnd", (void **)&api.GroupEnd},
    };
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
        *symbols[i].slot = dlsym(lib, symbols[i].name);
        if (!*symbols[i].slot) {
            st = nopad_set_error(NOPAD_ERR_UNSUPPORTED, "NCCL: %s has no %s (NCCL 2.12 or later is needed; set "
                                 "NOPAD_NCCL_LIBRARY to another libnccl)", path, symbols[i].name);
            dlclose(lib);
            goto done;
        }
    }
    api_loaded = 1; /* kept open for the life of the process */
done:
    pthread_mutex_unlock(&api_lock);
    return st;
}

/* ---- the communicator and its watchdog ---------------------------------------------------------- */

enum { WATCH_SLOTS = 64 };

struct comm_nccl {
    ncclComm_t comm;
    int32_t device, rank, size;
    float *one; /* [1] on the device: the barrier's all-reduce */
    double timeout_s;

    pthread_mutex_t lock; /* NCCL calls, the ring, the abort and the fields below */
    pthread_cond_t wake;
    pthread_t watchdog;
    int watching, stop, aborted;
    char cause[512]; /* why it was aborted */
    /* collectives enqueued and not yet seen complete: slots [tail, head) mod WATCH_SLOTS, each an
     * event recorded after it and the time it was enqueued */
    cudaEvent_t events[WATCH_SLOTS];
    double enqueued_at[WATCH_SLOTS];
    uint64_t head, tail;
    /* comm_all_reduce_async: the second stream its collectives run on, the point of a backend's
     * stream they start after, and the point the backend's stream waits for (comm_join) */
    cudaStream_t side;
    cudaEvent_t side_start, side_done;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Aborts the communicator for `cause` (the lock held): the stuck kernels return, and every later
 * call fails with the cause. */
static void abort_locked(comm_nccl *n, const char *cause) {
    if (n->aborted) return;
    snprintf(n->cause, sizeof n->cause, "%s", cause);
    n->aborted = 1;
    api.CommAbort(n->comm);
    fprintf(stderr, "nopad: rank %d: NCCL communicator aborted: %s\n", n->rank, n->cause);
}

void comm_nccl_abort(comm_nccl *n, const char *cause) {
    pthread_mutex_lock(&n->lock);
    abort_locked(n, cause);
    pthread_mutex_unlock(&n->lock);
}

static void *watchdog_main(void *arg) {
    comm_nccl *n = arg;
    cudaSetDevice(n->device);
    pthread_mutex_lock(&n->lock);
    while (!n->stop && !n->aborted) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&n->wake, &n->lock, &until);
        if (n->stop) break;
        char cause[512];
        ncclResult_t async = ncclSuccess;
        const ncclResult_t r = api.CommGetAsyncError(n->comm, &async);
        if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
            snprintf(cause, sizeof cause, "NCCL reported an error: %s (%s)",
                     api.GetErrorString(r != ncclSuccess ? r : async), api.GetLastError(n->comm));
            abort_locked(n, cause);
            break;
        }
        /* stream order: the oldest pending collective is the one to time */
        while (n->tail < n->head) {
            const uint64_t slot = n->tail % WATCH_SLOTS;
            const cudaError_t q = cudaEventQuery(n->events[slot]);
            if (q == cudaSuccess) {
                n->tail++;
                continue;
            }
            const double waited = now_s() - n->enqueued_at[slot];
            if (q != cudaErrorNotReady) {
                snprintf(cause, sizeof cause, "waiting for a collective: CUDA: %s", cudaGetErrorString(q));
                abort_locked(n, cause);
            } else if (waited > n->timeout_s) {
                snprintf(cause, sizeof cause,
                         "a collective enqueued %.1f s ago has not completed (NOPAD_COMM_TIMEOUT = %g s): a peer "
                         "rank died or stopped calling the collectives",
                         waited, n->timeout_s);
                abort_locked(n, cause);
            }
            break;
        }
    }
    pthread_mutex_unlock(&n->lock);
    return NULL;
}

/* Records a point after the work enqueued so far on `stream` for the watchdog to time (the lock
 * held). Not while the stream is being captured into a graph: the graph's replays are marked by
 * comm_watch. A full ring drops its oldest point: the newer one covers it (stream order), only
 * its clock starts later. */
static nopad_status watch_locked(comm_nccl *n, cudaStream_t stream, const char *op) {
    enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(stream, &capture);
    if (e == cudaSuccess && capture != cudaStreamCaptureStatusNone) return NOPAD_OK;
    if (n->head - n->tail == WATCH_SLOTS) n->tail++;
    const uint64_t slot = n->head % WATCH_SLOTS;
    if (e == cudaSuccess) e = cudaEventRecord(n->events[slot], stream);
    if (e != cudaSuccess)
        return nopad_set_error(NOPAD_ERR_BACKEND, "%s on rank %d: marking the stream for the watchdog: CUDA: %s",
                               op, n->rank, cudaGetErrorString(e));
    n->enqueued_at[slot] = now_s();
    n->head++;
    return NOPAD_OK;
}

/* Takes the lock for a call; refuses once aborted. */
static nopad_status enter(comm_nccl *n, const char *op) {
    pthread_mutex_lock(&n->lock);
    if (!n->aborted) return NOPAD_OK;
    nopad_status st = nopad_set_error(NOPAD_ERR_BACKEND, "%s on rank %d of %d: the NCCL communicator was aborted: %s",
                                      op, n->rank, n->size, n->cause);
    pthread_mutex_unlock(&n->lock);
    return st;
}

/* After an enqueue: its result as a status, the watchdog's mark, the lock released. */
static nopad_status leave_on(comm_nccl *n, cudaStream_t stream, const char *op, ncclResult_t r) {
    nopad_status st = NOPAD_OK;
    if (r != ncclSuccess && r != ncclInProgress)
        st = nopad_set_error(NOPAD_ERR_BACKEND, "%s on rank %d of %d (CUDA device %d): NCCL: %s (%s)", op, n->rank,
                             n->size, n->device, api.GetErrorString(r), api.GetLastError(n->comm));
    else
        st = watch_locked(n, stream, op);
    pthread_mutex_unlock(&n->lock);
    return st;
}

static nopad_status leave(comm_nccl *n, nopad_backend *be, const char *op, ncclResult_t r) {
    return leave_on(n, (cudaStream_t)be->native_stream, op, r);
}

static ncclDataType_t nccl_type(comm_type t) {
    switch (t) {
    case COMM_F32: return ncclFloat32;
    case COMM_F16: return ncclFloat16;
    case COMM_BF16: return ncclBfloat16;
    case COMM_I32: return ncclInt32;
    case COMM_I64: return ncclInt64;
    case COMM_BYTE: break;
    }
    return ncclUint8;
}

static ncclRedOp_t nccl_op(comm_reduce op) { return op == COMM_MAX ? ncclMax : op == COMM_MIN ? ncclMin : ncclSum; }

/* ---- creation ------------------------------------------------------------------------------------ */

/* What each rank tells the others before NCCL starts, so that every rank reaches the same verdict. */
typedef struct rank_report {
    char gpu[256];      /* cudaGetDeviceProperties().name of the device it takes */
    int32_t loaded;     /* libnccl found */
    int32_t gpus;       /* GPUs on its machine */
    int32_t local_size; /* ranks on its machine */
    int32_t device;
} rank_report;

typedef struct id_message {
    int32_t ok;
    ncclUniqueId id;
} id_message;

static nopad_status check_reports(nopad_comm *c, const rank_report *all, nopad_status load_st) {
    const int32_t me = comm_rank(c);
    for (int32_t r = 0; r < comm_size(c); r++) {
        if (!all[r].loaded) {
            if (r == me) return load_st; /* our own message says what is missing */
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "comm_attach on rank %d: rank %d could not load libnccl",
                                   me, r);
        }
        if (all[r].local_size > all[r].gpus)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "comm_attach on rank %d: %d ranks run on rank %d's machine, which has %d GPU%s: "
                                   "one GPU a rank (start fewer ranks there)",
                                   me, all[r].local_size, r, all[r].gpus, all[r].gpus == 1 ? "" : "s");
        if (strcmp(all[r].gpu, all[0].gpu) != 0)
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                                   "comm_attach on rank %d: GPUs of different kinds: rank 0 has %s, rank %d has %s "
                                   "(tensor parallelism needs the same GPU on every rank)",
                                   me, all[0].gpu, r, all[r].gpu);
    }
    return NOPAD_OK;
}

static nopad_status cuda_failure(const char *what, int32_t rank, cudaError_t e) {
    return nopad_set_error(NOPAD_ERR_BACKEND, "comm_attach on rank %d: %s: CUDA: %s", rank, what, cudaGetErrorString(e));
}

nopad_status comm_nccl_create(nopad_comm *c, nopad_backend *be, comm_nccl **out) {
    const int32_t rank = comm_rank(c), size = comm_size(c);
    rank_report mine;
    memset(&mine, 0, sizeof mine);
    const nopad_status load_st = nccl_load();
    char load_message[1024];
    snprintf(load_message, sizeof load_message, "%s", load_st == NOPAD_OK ? "" : nopad_last_error());
    mine.loaded = load_st == NOPAD_OK;
    mine.local_size = comm_local_size(c);
    mine.device = be->device;
    int gpus = 0;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
    mine.gpus = gpus;
    if (cudaGetDeviceProperties(&prop, be->device) == cudaSuccess) snprintf(mine.gpu, sizeof mine.gpu, "%s", prop.name);

    rank_report *all = calloc((size_t)size, sizeof *all);
    if (!all) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "comm_attach: out of memory");
    nopad_status st = comm_all_gather(c, NULL, all, &mine, sizeof mine, COMM_BYTE);
    if (st == NOPAD_OK) {
        if (!mine.loaded) nopad_set_error(load_st, "%s", load_message);
        st = check_reports(c, all, load_st);
    }
    free(all);
    if (st != NOPAD_OK) return st;

    /* rank 0's unique id, or its failure, to every rank */
    id_message msg;
    memset(&msg, 0, sizeof msg);
    ncclResult_t r = ncclSuccess;
    if (rank == 0) {
        r = api.GetUniqueId(&msg.id);
        msg.ok = r == ncclSuccess;
    }
    if ((st = comm_host_broadcast(c, &msg, sizeof msg, 0)) != NOPAD_OK) return st;
    if (!msg.ok)
        return nopad_set_error(NOPAD_ERR_BACKEND, "comm_attach on rank %d: ncclGetUniqueId failed on rank 0%s%s", rank,
                               rank == 0 ? ": " : "", rank == 0 ? api.GetErrorString(r) : "");

    comm_nccl *n = calloc(1, sizeof *n);
    if (!n) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "comm_attach: out of memory");
    n->device = be->device;
    n->rank = rank;
    n->size = size;
    n->timeout_s = knob_float(KNOB_COMM_TIMEOUT) > 0 ? knob_float(KNOB_COMM_TIMEOUT) : 30;
    pthread_mutex_init(&n->lock, NULL);
    pthread_cond_init(&n->wake, NULL);

    /* NVLink multicast (NVLS) stays off on the shared machines unless the user chose otherwise */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    int previous = 0;
    cudaGetDevice(&previous);
    cudaError_t e = cudaSetDevice(be->device);
    if (e != cudaSuccess) {
        st = cuda_failure("cudaSetDevice", rank, e);
        goto fail;
    }
    r = api.CommInitRank(&n->comm, size, msg.id, rank);
    if (r != ncclSuccess) {
        n->comm = NULL;
        st = nopad_set_error(NOPAD_ERR_BACKEND, "comm_attach on rank %d of %d (CUDA device %d): ncclCommInitRank: %s (%s)",
                             rank, size, be->device, api.GetErrorString(r), api.GetLastError(NULL));
        goto fail;
    }
    if ((e = cudaMalloc((void **)&n->one, sizeof *n->one)) != cudaSuccess) {
        st = cuda_failure("cudaMalloc of the barrier's element", rank, e);
        goto fail;
    }
    for (int i = 0; i < WATCH_SLOTS; i++)
        if ((e = cudaEventCreateWithFlags(&n->events[i], cudaEventDisableTiming)) != cudaSuccess) {
            st = cuda_failure("cudaEventCreate", rank, e);
            goto fail;
        }
    if ((e = cudaStreamCreateWithFlags(&n->side, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&n->side_start, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&n->side_done, cudaEventDisableTiming)) != cudaSuccess) {
        st = cuda_failure("the stream of the overlapped all-reduces", rank, e);
        goto fail;
    }
    const int rc = pthread_create(&n->watchdog, NULL, watchdog_main, n);
    if (rc != 0) {
        st = nopad_set_error(NOPAD_ERR_BACKEND, "comm_attach on rank %d: the NCCL watchdog thread: %s", rank, strerror(rc));
        goto fail;
    }
    n->watching = 1;
    cudaSetDevice(previous);
    *out = n;
    return NOPAD_OK;
fail:
    comm_nccl_free(n);
    cudaSetDevice(previous);
    return st;
}

void comm_nccl_free(comm_nccl *n) {
    if (!n) return;
    if (n->watching) {
        pthread_mutex_lock(&n->lock);
        n->stop = 1;
        pthread_cond_signal(&n->wake);
        pthread_mutex_unlock(&n->lock);
        pthread_join(n->watchdog, NULL);
    }
    if (n->comm && !n->aborted) {
        /* ncclCommDestroy waits for the work enqueued: with a collective still pending (a peer gone)
         * it would wait forever, so that case aborts */
        int pending = 0;
        for (uint64_t i = n->tail; i < n->head; i++) pending |= cudaEventQuery(n->events[i % WATCH_SLOTS]) == cudaErrorNotReady;
        ncclResult_t async = ncclSuccess;
        api.CommGetAsyncError(n->comm, &async);
        if (pending || async != ncclSuccess) api.CommAbort(n->comm);
        else api.CommDestroy(n->comm);
    }
    for (int i = 0; i < WATCH_SLOTS; i++)
        if (n->events[i]) cudaEventDestroy(n->events[i]);
    if (n->side_start) cudaEventDestroy(n->side_start);
    if (n->side_done) cudaEventDestroy(n->side_done);
    if (n->side) cudaStreamDestroy(n->side);
    cudaFree(n->one);
    pthread_cond_destroy(&n->wake);
    pthread_mutex_destroy(&n->lock);
    free(n);
}

int32_t comm_nccl_device(const comm_nccl *n) { return n->device; }

/* ---- collectives ---------------------------------------------------------------------------------- */

#define STREAM(be) ((cudaStream_t)(be)->native_stream)

nopad_status comm_nccl_all_reduce(comm_nccl *n, nopad_backend *be, void *buf, size_t count, comm_type t,
                                  comm_reduce op) {
    const char *name = "comm_all_reduce";
    nopad_status st = enter(n, name);
    if (st != NOPAD_OK) return st;
    return leave(n, be, name, api.AllReduce(buf, buf, count, nccl_type(t), nccl_op(op), n->comm, STREAM(be)));
}

nopad_status comm_nccl_all_reduce_async(comm_nccl *n, nopad_backend *be, void *buf, size_t count, comm_type t,
                                        comm_reduce op) {
    const char *name = "comm_all_reduce_async";
    nopad_status st = enter(n, name);
    if (st != NOPAD_OK) return st;
    cudaError_t e = cudaEventRecord(n->side_start, STREAM(be));
    if (e == cudaSuccess) e = cudaStreamWaitEvent(n->side, n->side_start, 0);
    if (e != cudaSuccess) {
        pthread_mutex_unlock(&n->lock);
        return cuda_failure("comm_all_reduce_async: ordering the second stream after the backend's", n->rank, e);
    }
    return leave_on(n, n->side, name, api.AllReduce(buf, buf, count, nccl_type(t), nccl_op(op), n->comm, n->side));
}

nopad_status comm_nccl_join(comm_nccl *n, nopad_backend *be) {
    nopad_status st = enter(n, "comm_join");
    if (st != NOPAD_OK) return st;
    cudaError_t e = cudaEventRecord(n->side_done, n->side);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(STREAM(be), n->side_done, 0);
    pthread_mutex_unlock(&n->lock);
    return e == cudaSuccess ? NOPAD_OK : cuda_failure("comm_join", n->rank, e);
}

nopad_status comm_nccl_all_gather(comm_nccl *n, nopad_backend *be, void *recv, const void *send, size_t count,
                                  comm_type t) {
    const char *name = "comm_all_gather";
    nopad_status st = enter(n, name);
    if (st != NOPAD_OK) return st;
    return leave(n, be, name, api.AllGather(send, recv, count, nccl_type(t), n->comm, STREAM(be)));
}

nopad_status comm_nccl_reduce_scatter(comm_nccl *n, nopad_backend *be, void *recv, const void *send, size_t count,
                                      comm_type t, comm_reduce op) {
    const char *name = "comm_reduce_scatter";
    nopad_status st = enter(n, name);
    if (st != NOPAD_OK) return st;
    return leave(n, be, name, api.ReduceScatter(send, recv, count, nccl_type(t), nccl_op(op), n->comm, STREAM(be)));
}

nopad_status comm_nccl_broadcast(comm_nccl *n, nopad_backend *be, void *buf, size_t count, comm_type t, int32_t root) {
    const char *name = "comm_broadcast";
    nopad_status st = enter(n, name);
    if (st != NOPAD_OK) return st;
    return leave(n, be, name, api.Broadcast(buf, buf, count, nccl_type(t), root, n->comm, STREAM(be)));
}

nopad_status comm_nccl_all_to_allv(comm_nccl *n, nopad_backend *be, void *recv, const size_t *recv_counts,
                                   const size_t *recv_offsets, const void *send, const size_t *send_counts,
                                   const size_t *send_offsets, comm_type t) {
    const char *name = "comm_all_to_allv";
    nopad_status st = enter(n, name);
    if (st != NOPAD_OK) return st;
    const size_t es = comm_type_size(t);
    /* one group: every send and receive of the exchange start together (no ordering deadlock) */
    ncclResult_t r = api.GroupStart();
    for (int32_t p = 0; p < n->size && r == ncclSuccess; p++) {
        if (send_counts[p])
            r = api.Send((const char *)send + send_offsets[p] * es, send_counts[p], nccl_type(t), p, n->comm, STREAM(be));
        if (r == ncclSuccess && recv_counts[p])
            r = api.Recv((char *)recv + recv_offsets[p] * es, recv_counts[p], nccl_type(t), p, n->comm, STREAM(be));
    }
    const ncclResult_t end = api.GroupEnd(); /* closes the group even after a failed call */
    return leave(n, be, name, r != ncclSuccess ? r : end);
}

nopad_status comm_nccl_barrier(comm_nccl *n, nopad_backend *be) {
    const char *name = "comm_barrier";
    nopad_status st = enter(n, name);
    if (st != NOPAD_OK) return st;
    st = leave(n, be, name, api.AllReduce(n->one, n->one, 1, ncclFloat32, ncclSum, n->comm, STREAM(be)));
    if (st != NOPAD_OK) return st;
    /* the wait holds no lock: the watchdog may abort a barrier that a dead peer never reaches */
    const cudaError_t e = cudaStreamSynchronize(STREAM(be));
    if ((st = enter(n, name)) != NOPAD_OK) return st;
    pthread_mutex_unlock(&n->lock);
    if (e != cudaSuccess)
        return nopad_set_error(NOPAD_ERR_BACKEND, "%s on rank %d: waiting for the stream: CUDA: %s", name, n->rank,
                               cudaGetErrorString(e));
    return NOPAD_OK;
}

nopad_status comm_nccl_watch(comm_nccl *n, nopad_backend *be) {
    const char *name = "comm_watch";
    nopad_status st = enter(n, name);
    if (st != NOPAD_OK) return st;
    st = watch_locked(n, STREAM(be), name);
    pthread_mutex_unlock(&n->lock);
    return st;
}

#endif /* NOPAD_HAVE_CUDA */

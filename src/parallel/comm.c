/* The communicator (comm.h): the world and its sub-groups, and each collective routed to the
 * engine that moves it — a copy for a world of one, MPI for host memory, NCCL (comm_nccl.c) for a
 * CUDA backend's memory. MPI has no half-precision types: F16 and BF16 travel as 2-byte types of
 * our own with reductions of our own (computed in float32, rounded to nearest even). */
#define _DEFAULT_SOURCE /* glibc's on_exit: the exit status decides between finalising and aborting */
#include "parallel/comm.h"

#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifdef NOPAD_HAVE_MPI
#include <mpi.h>
#endif

#include "parallel/comm_nccl.h"
#include "util/error.h"
#include "util/knobs.h"

struct nopad_comm {
    int32_t rank, size;
    int32_t local_rank, local_size; /* among the ranks of this machine */
    int forced;                     /* NOPAD_COMM_FORCE: a world of one still through MPI and NCCL */
    double wait_limit_s;            /* comm_set_wait_limit: 0 unbounded */
    int timed_out;                  /* a host collective gave up waiting */
    int abandoned;                  /* a host collective was left pending (timed out, or a spawned
                                       world lost a rank): MPI may still write into its buffers
                                       at any later MPI call, so ours are not freed */
#ifdef NOPAD_HAVE_MPI
    MPI_Comm mpi;   /* a communicator of our own (never the caller's); MPI_COMM_NULL: no MPI */
    MPI_Comm inter; /* a spawned world's link between leader and workers (disconnected with it);
                       MPI_COMM_NULL otherwise */
    /* a spawned world (comm_spawn / comm_parent) has no launcher to end it when a rank dies, and
     * Open MPI leaves the others waiting: each rank watches the others' processes (one machine) */
    int64_t *pids;      /* [size] each rank's process id; NULL when not spawned */
    struct pollfd *exits; /* [size] a pidfd per other rank (readable once it ended; fd -1 for this
                             rank, or where the kernel has no pidfd_open: /proc is read then) */
    pthread_t watcher;
    int watching;
    int stop_watch;     /* __atomic: comm_free stops the watcher */
    int lost;           /* __atomic: a rank ended unexpectedly (lost_why says which); the leader's
                           calls fail from then on */
    int lost_claimed;   /* __atomic: world_lost's work is done once, by the first to see the loss */
    char lost_why[256];
#endif
#ifdef NOPAD_HAVE_CUDA
    comm_nccl *nccl; /* NCCL over these ranks, once attached to a CUDA backend */
#endif
};

size_t comm_type_size(comm_type t) {
    switch (t) {
    case COMM_F32: return 4;
    case COMM_F16: return 2;
    case COMM_BF16: return 2;
    case COMM_I32: return 4;
    case COMM_I64: return 8;
    case COMM_BYTE: return 1;
    }
    return 0;
}

comm_type comm_type_of(nopad_dtype dtype) {
    switch (dtype) {
    case NOPAD_DTYPE_F16: return COMM_F16;
    case NOPAD_DTYPE_BF16: return COMM_BF16;
    case NOPAD_DTYPE_F32: break;
    }
    return COMM_F32;
}

/* Buffers of a CUDA backend live in device memory; NULL or a CPU backend means host memory. */
static int on_device(const nopad_backend *be) { return be && be->device >= 0; }

static nopad_status check_args(const nopad_comm *c, const char *op, comm_type t, int reduces, comm_reduce red) {
    if (!c) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: communicator is NULL", op);
    if (comm_type_size(t) == 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: element type %d is not a comm_type", op, (int)t);
    if (reduces && t == COMM_BYTE)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: BYTE elements cannot be reduced (F32, F16, BF16, I32 or I64)", op);
    if (reduces && (red < COMM_SUM || red > COMM_MIN))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: reduction %d is not sum, max or min", op, (int)red);
    return NOPAD_OK;
}

/* ---- half precision for MPI's reductions ----------------------------------------------------- */
#ifdef NOPAD_HAVE_MPI

static float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        const float v = ldexpf((float)mant, -24); /* zero or subnormal */
        return sign ? -v : v;
    }
    const uint32_t bits = exp == 31 ? sign | 0x7f800000u | (mant << 13) : sign | ((exp + 112u) << 23) | (mant << 13);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Rounded to nearest, ties to even, as the CUDA conversions do. */
static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0)); /* inf, NaN */
    if (ax >= 0x47800000u) return (uint16_t)(sign | 0x7c00u); /* 2^16 and above: inf */
    if (ax < 0x38800000u) {
        /* below 2^-14: a subnormal half; adding 0.5 puts its 10 bits at the bottom of the float's
         * mantissa, rounded by the FPU to nearest even */
        float m;
        memcpy(&m, &ax, sizeof m);
        m += 0.5f;
        uint32_t r;
        memcpy(&r, &m, sizeof r);
        return (uint16_t)(sign | (r - 0x3f000000u));
    }
    const uint32_t odd = (ax >> 13) & 1u;
    ax += 0xc8000fffu + odd; /* exponent rebiased (-112 << 23) and the 13 dropped bits rounded */
    return (uint16_t)(sign | (ax >> 13));
}

static float bf16_to_f32(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* NaN stays NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* MPI's part of the process: started once (unless the caller started it), finalised at exit. */
static pthread_mutex_t mpi_lock = PTHREAD_MUTEX_INITIALIZER;
static int mpi_ready;
static MPI_Datatype mpi_f16, mpi_bf16;

/* MPI_Finalize waits for every rank to finalise: a rank that leaves on an error while the others
 * wait for it in a collective would hang the job. So a failing exit aborts the world instead, and
 * the launcher ends every rank with a message naming this one; a clean exit finalises. */
static int spawned_worlds; /* __atomic: worlds this process leads that comm_spawn started and are not freed */
static int spawned_worker; /* this process is a worker that a leader started (comm_parent) */

static void mpi_end_at_exit(int status, void *unused) {
    (void)unused;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    /* a world this process leads that was not disconnected (its workers died, or the model was not
     * freed) would be waited for by MPI_Finalize, forever if a worker is gone; the workers end on
     * their own when this process is gone (their watcher) */
    if (__atomic_load_n(&spawned_worlds, __ATOMIC_ACQUIRE) != 0) return;
    if (status != 0 && (nopad_world_size() <= 1 || spawned_worker)) {
        /* no launcher's world to end: a leader's workers end with its process (Open MPI's daemon
         * ends them), and a worker's own world was disconnected or is being ended (comm.c) */
        MPI_Finalize();
        return;
    }
    if (status != 0) {
        /* said here: Open MPI's own notice of the abort does not always reach the launcher */
        int rank = 0, size = 1;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        fprintf(stderr, "nopad: rank %d of %d exits with status %d: aborting the MPI job\n", rank, size, status);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, status);
    }
    MPI_Finalize();
}

static nopad_status mpi_error(int rc, const char *op, const nopad_comm *c) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "MPI error %d", rc);
    return nopad_set_error(NOPAD_ERR_BACKEND, "%s on rank %d of %d: MPI: %s", op, c ? c->rank : nopad_world_rank(),
                           c ? c->size : nopad_world_size(), text);
}

/* MPI initialised (thread level MPI_THREAD_MULTIPLE: the engine's thread and the caller's may both
 * run collectives on communicators of their own), with our half types. */
static nopad_status mpi_start(void) {
    pthread_mutex_lock(&mpi_lock);
    nopad_status st = NOPAD_OK;
    if (mpi_ready) goto done;
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) {
        st = nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "comm_world: MPI was already finalised in this process");
        goto done;
    }
    if (!initialized) {
        int provided = 0;
        const int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) {
            st = mpi_error(rc, "comm_world: MPI_Init_thread", NULL);
            goto done;
        }
        on_exit(mpi_end_at_exit, NULL);
    }
    MPI_Type_contiguous(2, MPI_BYTE, &mpi_f16);
    MPI_Type_commit(&mpi_f16);
    MPI_Type_contiguous(2, MPI_BYTE, &mpi_bf16);
    MPI_Type_commit(&mpi_bf16);
    mpi_ready = 1;
done:
    pthread_mutex_unlock(&mpi_lock);
    return st;
}

static MPI_Datatype mpi_type(comm_type t) {
    switch (t) {
    case COMM_F32: return MPI_FLOAT;
    case COMM_F16: return mpi_f16;
    case COMM_BF16: return mpi_bf16;
    case COMM_I32: return MPI_INT32_T;
    case COMM_I64: return MPI_INT64_T;
    case COMM_BYTE: break;
    }
    return MPI_BYTE;
}

static int uses_mpi(const nopad_comm *c) { return c->mpi != MPI_COMM_NULL; }

/* MPI counts are int: a count past INT_MAX is refused rather than cut. */
static nopad_status int_count(const nopad_comm *c, const char *op, size_t n, int *out) {
    if (n > INT_MAX)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s on rank %d: %zu elements in one part; MPI takes at most %d", op, c->rank, n,
                               INT_MAX);
    *out = (int)n;
    return NOPAD_OK;
}

/* The rank-loss error of a spawned world. */
static nopad_status lost_error(const nopad_comm *c, const char *op) {
    return nopad_set_error(NOPAD_ERR_BACKEND, "%s on rank %d of %d: %s", op, c->rank, c->size, c->lost_why);
}

/* Before a host collective starts: NOPAD_OK, or the error of a spawned world that lost a rank.
 * Nothing is sent to a rank that is gone: Open MPI's TCP transport (the one between a leader and
 * the workers it spawned) aborts the process on a failed write, and a spawned leader's abort can
 * hang in Open MPI. The watcher finds a loss within WATCH_PERIOD_MS; this finds it at once. */
static int32_t lost_rank(const nopad_comm *c);
static void world_lost(nopad_comm *c, int32_t gone);

static nopad_status mpi_begin(nopad_comm *c, const char *op) {
    if (!c->pids) return NOPAD_OK;
    if (!__atomic_load_n(&c->lost, __ATOMIC_ACQUIRE)) {
        const int32_t gone = lost_rank(c);
        if (gone < 0) return NOPAD_OK;
        world_lost(c, gone);
    }
    return lost_error(c, op);
}

/* Waits for a collective that MPI's nonblocking call started (rc: what the call returned). Like
 * MPI_Wait it polls; between polls it looks whether a spawned world lost a rank, which would leave
 * the request pending forever (it is then left to the dead world). */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static nopad_status mpi_finish(nopad_comm *c, int rc, MPI_Request *req, const char *op) {
    if (rc != MPI_SUCCESS) return mpi_error(rc, op, c);
    const double start = c->wait_limit_s > 0 ? now_s() : 0;
    for (uint32_t polls = 1;; polls++) {
        int done = 0;
        rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_error(rc, op, c);
        if (done) return NOPAD_OK;
        if (__atomic_load_n(&c->lost, __ATOMIC_ACQUIRE)) {
            c->abandoned = 1;
            return lost_error(c, op);
        }
        if (c->wait_limit_s > 0 && polls % 1024 == 0 && now_s() - start > c->wait_limit_s) {
            c->timed_out = c->abandoned = 1;
            return nopad_set_error(NOPAD_ERR_BACKEND,
                                   "%s on rank %d of %d: the other ranks did not join within %g s (a rank failed "
                                   "alone or is stuck; NOPAD_COMM_TIMEOUT sets the bound); this rank's world is out "
                                   "of step", op, c->rank, c->size, c->wait_limit_s);
        }
    }
}

enum { WATCH_PERIOD_MS = 100 };

static void sleep_ms(int ms) {
    const struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Whether process `pid` still runs: it exists and is no zombie (/proc/PID/stat's state). */
static int process_alive(int64_t pid) {
    char path[64], text[512];
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *close_paren = strrchr(text, ')'); /* the name may hold spaces and parentheses */
    return !close_paren || (close_paren[1] == ' ' && close_paren[2] != 'Z' && close_paren[2] != 'X');
}

/* The first rank of a spawned world whose process is gone, or -1. One poll(2) on the pidfds (a
 * microsecond or two: cheap enough before every host collective), /proc where there are none. */
static int32_t lost_rank(const nopad_comm *c) {
    if (c->exits && poll(c->exits, (nfds_t)c->size, 0) > 0)
        for (int32_t r = 0; r < c->size; r++)
            if (c->exits[r].revents) return r;
    for (int32_t r = 0; r < c->size; r++)
        if (r != c->rank && (!c->exits || c->exits[r].fd < 0) && !process_alive(c->pids[r])) return r;
    return -1;
}

/* A rank of a spawned world is gone. A worker ends too: nothing is left for it to do, and its peers
 * may be waiting for it. The leader (the caller's process) ends its other workers, aborts NCCL so
 * that stuck kernels return, and fails every later call of the world with the cause. */
static void world_lost(nopad_comm *c, int32_t gone) {
    if (__atomic_exchange_n(&c->lost_claimed, 1, __ATOMIC_ACQ_REL)) {
        while (!__atomic_load_n(&c->lost, __ATOMIC_ACQUIRE)) sleep_ms(1); /* the other finder's cause */
        return;
    }
    if (c->rank != 0) {
        fprintf(stderr, "nopad-worker: rank %d of %d: rank %d (pid %lld, %s) ended unexpectedly; this worker ends "
                        "too\n", c->rank, c->size, gone, (long long)c->pids[gone], gone == 0 ? "the leader" : "a worker");
        fflush(stderr);
        _exit(1);
    }
    snprintf(c->lost_why, sizeof c->lost_why,
             "tensor-parallel worker rank %d (pid %lld, started by this process) ended unexpectedly (its message, if "
             "any, is above); the other workers were ended, and the model must be freed and loaded again",
             gone, (long long)c->pids[gone]);
    for (int32_t r = 1; r < c->size; r++)
        if (r != gone) kill((pid_t)c->pids[r], SIGKILL);
    fprintf(stderr, "nopad: %s\n", c->lost_why);
    __atomic_store_n(&c->lost, 1, __ATOMIC_RELEASE);
#ifdef NOPAD_HAVE_CUDA
    comm_nccl *nccl = __atomic_load_n(&c->nccl, __ATOMIC_ACQUIRE);
    if (nccl) comm_nccl_abort(nccl, c->lost_why);
#endif
}

static void *watcher_main(void *arg) {
    nopad_comm *c = arg;
    while (!__atomic_load_n(&c->stop_watch, __ATOMIC_ACQUIRE)) {
        const int32_t gone = lost_rank(c);
        if (gone >= 0) {
            world_lost(c, gone);
            return NULL;
        }
        sleep_ms(WATCH_PERIOD_MS);
    }
    return NULL;
}

/* A spawned world: every rank's process id, and the watcher. */
static nopad_status watch_spawned(nopad_comm *c) {
    c->pids = calloc((size_t)c->size, sizeof *c->pids);
    if (!c->pids) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "comm: out of memory");
    int64_t mine = (int64_t)getpid();
    const int rc = MPI_Allgather(&mine, 1, MPI_INT64_T, c->pids, 1, MPI_INT64_T, c->mpi);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "comm: MPI_Allgather (the ranks' process ids)", c);
    c->exits = calloc((size_t)c->size, sizeof *c->exits);
    if (!c->exits) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "comm: out of memory");
    for (int32_t r = 0; r < c->size; r++) {
        c->exits[r].fd = -1;
        c->exits[r].events = POLLIN;
#ifdef SYS_pidfd_open
        if (r != c->rank) c->exits[r].fd = (int)syscall(SYS_pidfd_open, (pid_t)c->pids[r], 0);
#endif
    }
    if (pthread_create(&c->watcher, NULL, watcher_main, c) != 0)
        return nopad_set_error(NOPAD_ERR_BACKEND, "comm: cannot start the thread that watches the workers");
    c->watching = 1;
    return NOPAD_OK;
}

/* Before a spawned world is disconnected (collective: a rank missing would hang it), its ranks meet
 * in a barrier bounded by NOPAD_COMM_TIMEOUT. 0 when all came; otherwise a rank is stuck or gone:
 * the leader ends its workers, a worker ends. */
static int spawned_farewell(nopad_comm *c) {
    if (__atomic_load_n(&c->lost, __ATOMIC_ACQUIRE)) return -1;
    MPI_Request req;
    if (MPI_Ibarrier(c->mpi, &req) == MPI_SUCCESS) {
        const double limit_ms = 1000.0 * (knob_float(KNOB_COMM_TIMEOUT) > 0 ? knob_float(KNOB_COMM_TIMEOUT) : 30);
        for (double waited_ms = 0; waited_ms <= limit_ms; waited_ms += 1) {
            int done = 0;
            if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
            if (done) return 0;
            if ((long)waited_ms % WATCH_PERIOD_MS == 0 && lost_rank(c) >= 0) break;
            sleep_ms(1);
        }
    }
    if (c->rank != 0) {
        fprintf(stderr, "nopad-worker: rank %d of %d: the leader did not end the model with this worker; ending\n",
                c->rank, c->size);
        fflush(stderr);
        _exit(1);
    }
    fprintf(stderr, "nopad: the tensor-parallel workers did not end the model with this process (a worker is stuck "
                    "or gone): ending them\n");
    for (int32_t r = 1; r < c->size; r++) kill((pid_t)c->pids[r], SIGKILL);
    return -1;
}

/* The communicator over `mpi` (ours from now on): its ranks, this machine's share, errors returned. */
static nopad_status comm_from_mpi(MPI_Comm mpi, int forced, nopad_comm **out) {
    nopad_comm *c = calloc(1, sizeof *c);
    if (!c) {
        MPI_Comm_free(&mpi);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "comm: out of memory");
    }
    c->mpi = mpi;
    c->inter = MPI_COMM_NULL;
    c->pids = NULL;
    c->exits = NULL;
    c->forced = forced;
    MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
    int rank = 0, size = 1;
    MPI_Comm_rank(mpi, &rank);
    MPI_Comm_size(mpi, &size);
    c->rank = rank;
    c->size = size;
    MPI_Comm local;
    int rc = MPI_Comm_split_type(mpi, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
    if (rc != MPI_SUCCESS) {
        nopad_status st = mpi_error(rc, "comm: MPI_Comm_split_type (the ranks of this machine)", c);
        comm_free(c);
        return st;
    }
    MPI_Comm_rank(local, &rank);
    MPI_Comm_size(local, &size);
    c->local_rank = rank;
    c->local_size = size;
    MPI_Comm_free(&local);
    *out = c;
    return NOPAD_OK;
}

#endif /* NOPAD_HAVE_MPI */

/* A world of one rank that needs no MPI. */
static nopad_status comm_single(int forced, nopad_comm **out) {
    nopad_comm *c = calloc(1, sizeof *c);
    if (!c) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "comm: out of memory");
    c->size = 1;
    c->local_size = 1;
    c->forced = forced;
#ifdef NOPAD_HAVE_MPI
    c->mpi = MPI_COMM_NULL;
    c->inter = MPI_COMM_NULL;
    c->pids = NULL;
#endif
    *out = c;
    return NOPAD_OK;
}

nopad_status comm_world(int32_t want, nopad_comm **out) {
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "comm_world: out is NULL");
    *out = NULL;
    const int forced = knob_int(KNOB_COMM_FORCE) != 0;
    if (want <= 1 && !forced) return comm_single(0, out);
    const int32_t launched = nopad_world_size();
#ifndef NOPAD_HAVE_MPI
    if (want > 1)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "a world of %d ranks: this build of nopad has no MPI (install it: "
                               "apt-get install libopenmpi-dev openmpi-bin, then configure and build again)",
                               want);
    (void)launched;
    return comm_single(1, out); /* forced: NCCL bootstraps on its own, no MPI needed */
#else
    if (want > 1 && launched <= 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "a world of %d ranks: this process was not started by a launcher (its world "
                               "has one rank); run it under `mpirun -np %d ...`, or use the CLI's --tp %d or "
                               "--nproc %d, which start the ranks",
                               want, want, want, want);
    if (want > 1 && launched != want)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "a world of %d ranks: the launcher's world has %d ranks; they must be equal "
                               "(mpirun -np %d, or %d ranks asked for)",
                               want, launched, want, launched);
    nopad_status st = mpi_start();
    if (st != NOPAD_OK) return st;
    /* a forced world of one is this process alone, whatever world it was launched in */
    MPI_Comm base = want > 1 ? MPI_COMM_WORLD : MPI_COMM_SELF;
    int size = 0;
    MPI_Comm_size(base, &size);
    if (want > 1 && size != want)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "a world of %d ranks: MPI's world has %d ranks (the launcher's environment "
                               "said %d)",
                               want, size, launched);
    MPI_Comm mine;
    const int rc = MPI_Comm_dup(base, &mine);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "comm_world: MPI_Comm_dup", NULL);
    return comm_from_mpi(mine, forced && want <= 1, out);
#endif
}

nopad_status comm_spawn(int32_t workers, const char *program, const char *arg, nopad_comm **out) {
    if (!out || !program || !arg)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "comm_spawn: program, argument or out is NULL");
    *out = NULL;
    if (workers < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "comm_spawn: %d workers; at least 1", workers);
#ifndef NOPAD_HAVE_MPI
    return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                           "tensor parallelism over %d ranks: this build of nopad has no MPI to start its workers "
                           "(install it: apt-get install libopenmpi-dev openmpi-bin, then configure and build again)",
                           workers + 1);
#else
    nopad_status st = mpi_start();
    if (st != NOPAD_OK) return st;
    MPI_Info info;
    MPI_Info_create(&info);
    /* the workers of a CPU model may be more than the cores, and each runs its own threads
     * (comm_attach counts the GPUs for a CUDA one) */
    MPI_Info_set(info, "map_by", "slot:OVERSUBSCRIBE");
    MPI_Info_set(info, "bind_to", "none");
    int *codes = calloc((size_t)workers, sizeof *codes);
    MPI_Comm self = MPI_COMM_NULL, inter = MPI_COMM_NULL, world = MPI_COMM_NULL;
    int rc = codes ? MPI_Comm_dup(MPI_COMM_SELF, &self) : MPI_SUCCESS;
    if (!codes) st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "comm_spawn: out of memory");
    else if (rc != MPI_SUCCESS) st = mpi_error(rc, "comm_spawn: MPI_Comm_dup", NULL);
    if (st == NOPAD_OK) {
        MPI_Comm_set_errhandler(self, MPI_ERRORS_RETURN);
        char *argv[] = {(char *)arg, NULL};
        rc = MPI_Comm_spawn(program, argv, workers, info, 0, self, &inter, codes);
        if (rc != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING];
            int len = 0;
            if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "MPI error %d", rc);
            st = nopad_set_error(NOPAD_ERR_BACKEND, "tensor parallelism over %d ranks: starting %d workers (%s %s) "
                                 "failed: MPI_Comm_spawn: %s", workers + 1, workers, program, arg, text);
        }
    }
    if (st == NOPAD_OK) {
        MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
        rc = MPI_Intercomm_merge(inter, 0, &world); /* low group: the leader is rank 0 */
        if (rc != MPI_SUCCESS) st = mpi_error(rc, "comm_spawn: MPI_Intercomm_merge", NULL);
    }
    if (self != MPI_COMM_NULL) MPI_Comm_free(&self);
    MPI_Info_free(&info);
    free(codes);
    if (st == NOPAD_OK) st = comm_from_mpi(world, 0, out);
    if (st == NOPAD_OK) {
        (*out)->inter = inter;
        __atomic_add_fetch(&spawned_worlds, 1, __ATOMIC_ACQ_REL);
        st = watch_spawned(*out);
        if (st != NOPAD_OK) {
            comm_free(*out);
            *out = NULL;
        }
    } else if (inter != MPI_COMM_NULL) {
        MPI_Comm_disconnect(&inter);
    }
    return st;
#endif
}

nopad_status comm_parent(nopad_comm **out) {
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "comm_parent: out is NULL");
    *out = NULL;
#ifndef NOPAD_HAVE_MPI
    return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "comm_parent: this build of nopad has no MPI");
#else
    nopad_status st = mpi_start();
    if (st != NOPAD_OK) return st;
    MPI_Comm parent = MPI_COMM_NULL, world = MPI_COMM_NULL;
    MPI_Comm_get_parent(&parent);
    spawned_worker = parent != MPI_COMM_NULL; /* its launcher's world is its fellow workers' */
    if (parent == MPI_COMM_NULL)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "this process was not started by a nopad leader (nopad_model_load with tp_size > 1 "
                               "and no launcher starts its workers itself)");
    MPI_Comm_set_errhandler(parent, MPI_ERRORS_RETURN);
    const int rc = MPI_Intercomm_merge(parent, 1, &world); /* high group: after the leader */
    if (rc != MPI_SUCCESS) return mpi_error(rc, "comm_parent: MPI_Intercomm_merge", NULL);
    st = comm_from_mpi(world, 0, out);
    if (st == NOPAD_OK) {
        (*out)->inter = parent;
        st = watch_spawned(*out);
        if (st != NOPAD_OK) {
            comm_free(*out);
            *out = NULL;
        }
    }
    return st;
#endif
}

nopad_status comm_split(nopad_comm *c, int32_t color, int32_t key, nopad_comm **out) {
    if (!c || !out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "comm_split: communicator or out is NULL");
    *out = NULL;
    if (color < 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "comm_split on rank %d: color %d is negative", c->rank,
                               color);
#ifdef NOPAD_HAVE_MPI
    if (uses_mpi(c)) {
        MPI_Comm part;
        const int rc = MPI_Comm_split(c->mpi, color, key, &part);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "comm_split: MPI_Comm_split", c);
        return comm_from_mpi(part, c->forced, out);
    }
#endif
    return comm_single(c->forced, out);
}

void comm_free(nopad_comm *c) {
    if (!c) return;
#ifdef NOPAD_HAVE_CUDA
    comm_nccl_free(c->nccl);
#endif
#ifdef NOPAD_HAVE_MPI
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (c->watching) {
        __atomic_store_n(&c->stop_watch, 1, __ATOMIC_RELEASE);
        pthread_join(c->watcher, NULL);
    }
    if (uses_mpi(c) && !finalized && !c->abandoned) { /* an abandoned world is left to MPI */
        if (c->inter == MPI_COMM_NULL) {
            MPI_Comm_free(&c->mpi);
        } else if (spawned_farewell(c) == 0) {
            /* leader and workers disconnect (collective), so that each can finalise alone later
             * (Open MPI 4.1 hangs disconnecting the merged world itself; it is freed) */
            MPI_Comm_free(&c->mpi);
            MPI_Comm_disconnect(&c->inter);
            if (c->rank == 0) __atomic_sub_fetch(&spawned_worlds, 1, __ATOMIC_ACQ_REL);
        } /* else the world is dead: its handles are left to it */
    }
    if (c->exits)
        for (int32_t r = 0; r < c->size; r++)
            if (c->exits[r].fd >= 0) close(c->exits[r].fd);
    free(c->exits);
    free(c->pids);
#endif
    free(c);
}

int32_t comm_rank(const nopad_comm *c) { return c->rank; }
int32_t comm_size(const nopad_comm *c) { return c->size; }
int32_t comm_local_rank(const nopad_comm *c) { return c->local_rank; }
int32_t comm_local_size(const nopad_comm *c) { return c->local_size; }

nopad_status comm_attach(nopad_comm *c, nopad_backend *be) {
    if (!c) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "comm_attach: communicator is NULL");
    if (!on_device(be) || (c->size == 1 && !c->forced)) return NOPAD_OK; /* host memory, or copies */
#ifdef NOPAD_HAVE_CUDA
    if (c->nccl) {
        if (comm_nccl_device(c->nccl) == be->device) return NOPAD_OK;
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "comm_attach on rank %d: the communicator already runs NCCL on CUDA device %d, "
                               "not device %d (one device a rank)",
                               c->rank, comm_nccl_device(c->nccl), be->device);
    }
    return comm_nccl_create(c, be, &c->nccl);
#else
    return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "comm_attach: backend %s on device %d in a build without CUDA",
                           be->name, be->device);
#endif
}

/* ---- routing ----------------------------------------------------------------------------------- */

typedef enum route { ROUTE_COPY, ROUTE_MPI, ROUTE_NCCL } route;

/* Which engine moves a collective on be's memory: NCCL once attached, MPI for host memory of a
 * world that has it, else (a world of one) a copy at most. */
static nopad_status route_of(const nopad_comm *c, const nopad_backend *be, const char *op, route *out) {
    if (on_device(be)) {
#ifdef NOPAD_HAVE_CUDA
        if (c->nccl) {
            if (comm_nccl_device(c->nccl) != be->device)
                return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                       "%s on rank %d: buffer on CUDA device %d, the communicator's NCCL on device %d",
                                       op, c->rank, be->device, comm_nccl_device(c->nccl));
            *out = ROUTE_NCCL;
            return NOPAD_OK;
        }
#endif
        if (c->size == 1 && !c->forced) {
            *out = ROUTE_COPY;
            return NOPAD_OK;
        }
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "%s on rank %d: device memory of CUDA device %d, but the communicator was not "
                               "attached to it (call comm_attach with this backend on every rank first)",
                               op, c->rank, be->device);
    }
#ifdef NOPAD_HAVE_MPI
    if (uses_mpi(c)) {
        *out = ROUTE_MPI;
        return NOPAD_OK;
    }
#endif
    *out = ROUTE_COPY;
    return NOPAD_OK;
}

/* dst = src (bytes), in be's memory; nothing when they are the same buffer. */
static nopad_status copy_bytes(nopad_backend *be, void *dst, const void *src, size_t bytes) {
    if (dst == src || bytes == 0) return NOPAD_OK;
    if (on_device(be)) return be->copy(be, dst, src, bytes);
    memcpy(dst, src, bytes);
    return NOPAD_OK;
}

#ifdef NOPAD_HAVE_MPI
/* Element i of rank r's part of an all-gather of `n` floating-point elements of type t. */
static float gathered_at(const void *all, size_t n, int32_t r, size_t i, comm_type t) {
    const size_t k = (size_t)r * n + i;
    if (t == COMM_F16) return f16_to_f32(((const uint16_t *)all)[k]);
    if (t == COMM_BF16) return bf16_to_f32(((const uint16_t *)all)[k]);
    return ((const float *)all)[k];
}

/* out[n] = the reduction over the `size` parts of all[size, n]. Floats are summed in double and
 * rounded once: for a few float parts the double sum is exact or nearly, so the result does not
 * depend on the order they come in. Integers exactly. */
static void reduce_parts(const void *all, int32_t size, size_t n, comm_type t, comm_reduce op, void *out) {
    for (size_t i = 0; i < n; i++) {
        if (t == COMM_I32 || t == COMM_I64) {
            int64_t acc = t == COMM_I32 ? ((const int32_t *)all)[i] : ((const int64_t *)all)[i];
            for (int32_t r = 1; r < size; r++) {
                const int64_t v = t == COMM_I32 ? ((const int32_t *)all)[(size_t)r * n + i]
                                                : ((const int64_t *)all)[(size_t)r * n + i];
                acc = op == COMM_SUM ? acc + v : op == COMM_MAX ? (v > acc ? v : acc) : (v < acc ? v : acc);
            }
            if (t == COMM_I32) ((int32_t *)out)[i] = (int32_t)acc;
            else ((int64_t *)out)[i] = acc;
            continue;
        }
        double acc = gathered_at(all, n, 0, i, t);
        for (int32_t r = 1; r < size; r++) {
            const double v = gathered_at(all, n, r, i, t);
            acc = op == COMM_SUM ? acc + v : op == COMM_MAX ? fmax(acc, v) : fmin(acc, v);
        }
        if (t == COMM_F32) ((float *)out)[i] = (float)acc;
        else if (t == COMM_F16) ((uint16_t *)out)[i] = f32_to_f16((float)acc);
        else ((uint16_t *)out)[i] = f32_to_bf16((float)acc);
    }
}

/* The host all-reduce: every rank's part gathered, then reduced on each rank (reduce_parts). MPI's
 * own reductions add in float in an order of their algorithm's choosing, which moved SmolLM2's
 * logits at tp 3 by 5e-6 to 1.5e-5 of the row's norm from one process, order to order; this one
 * gives every rank the same bits, independent of the algorithm, and is nonblocking (a spawned
 * world's lost rank is noticed). In pieces of ALL_REDUCE_PIECE bytes a rank. */
enum { ALL_REDUCE_PIECE = 1 << 20 };
static nopad_status mpi_all_reduce(nopad_comm *c, void *buf, size_t count, comm_type t, comm_reduce op) {
    const size_t esize = comm_type_size(t), piece = ALL_REDUCE_PIECE / esize;
    const size_t first = count < piece ? count : piece;
    void *all = malloc((size_t)c->size * first * esize);
    if (!all) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "comm_all_reduce: out of memory");
    nopad_status st = NOPAD_OK;
    for (size_t done = 0; done < count && st == NOPAD_OK;) {
        const size_t n = count - done < piece ? count - done : piece;
        char *part = (char *)buf + done * esize;
        MPI_Request req;
        if ((st = mpi_begin(c, "comm_all_reduce")) != NOPAD_OK) break;
        const int rc = MPI_Iallgather(part, (int)n, mpi_type(t), all, (int)n, mpi_type(t), c->mpi, &req);
        st = mpi_finish(c, rc, &req, "comm_all_reduce: MPI_Iallgather");
        if (st == NOPAD_OK) reduce_parts(all, c->size, n, t, op, part);
        done += n;
    }
    if (!c->abandoned) free(all);
    return st;
}

/* The host reduce-scatter: every rank's part of this rank's block exchanged (an all-to-all), then
 * reduced here as mpi_all_reduce reduces (reduce_parts, floats in double, rounded once): a block
 * gets the bits the all-reduce gives those elements, so a residual stream split by rows
 * (sequence parallelism, model/tp.h) equals the replicated one's. recv may be send + rank · count
 * (in place): send is read whole into the exchange before recv is written. The exchange holds
 * size · count elements, as many as send. */
static nopad_status mpi_reduce_scatter(nopad_comm *c, void *recv, const void *send, size_t count, comm_type t,
                                       comm_reduce op) {
    const char *name = "comm_reduce_scatter";
    int n = 0;
    nopad_status st = int_count(c, name, count, &n);
    if (st != NOPAD_OK) return st;
    void *all = malloc((size_t)c->size * count * comm_type_size(t));
    if (!all) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
    MPI_Request req;
    if ((st = mpi_begin(c, name)) == NOPAD_OK) {
        const int rc = MPI_Ialltoall(send, n, mpi_type(t), all, n, mpi_type(t), c->mpi, &req);
        st = mpi_finish(c, rc, &req, "comm_reduce_scatter: MPI_Ialltoall");
    }
    if (st == NOPAD_OK) reduce_parts(all, c->size, count, t, op, recv);
    if (!c->abandoned) free(all);
    return st;
}
#endif

/* ---- collectives ------------------------------------------------------------------------------- */

nopad_status comm_all_reduce(nopad_comm *c, nopad_backend *be, void *buf, size_t count, comm_type t,
                             comm_reduce op) {
    const char *name = "comm_all_reduce";
    nopad_status st = check_args(c, name, t, 1, op);
    route r = ROUTE_COPY;
    if (st == NOPAD_OK) st = route_of(c, be, name, &r);
    if (st != NOPAD_OK || count == 0) return st;
    switch (r) {
    case ROUTE_COPY: return NOPAD_OK; /* in place over one rank: the buffer is the answer */
#ifdef NOPAD_HAVE_CUDA
    case ROUTE_NCCL: return comm_nccl_all_reduce(c->nccl, be, buf, count, t, op);
#endif
#ifdef NOPAD_HAVE_MPI
    case ROUTE_MPI: return mpi_all_reduce(c, buf, count, t, op);
#endif
    default: break;
    }
    return nopad_set_error(NOPAD_ERR_INTERNAL, "%s: no route", name);
}

nopad_status comm_all_reduce_async(nopad_comm *c, nopad_backend *be, void *buf, size_t count, comm_type t,
                                   comm_reduce op) {
#ifdef NOPAD_HAVE_CUDA
    const char *name = "comm_all_reduce_async";
    route r = ROUTE_COPY;
    nopad_status st = check_args(c, name, t, 1, op);
    if (st == NOPAD_OK) st = route_of(c, be, name, &r);
    if (st != NOPAD_OK || count == 0) return st;
    if (r == ROUTE_NCCL) return comm_nccl_all_reduce_async(c->nccl, be, buf, count, t, op);
#endif
    return comm_all_reduce(c, be, buf, count, t, op);
}

nopad_status comm_join(nopad_comm *c, nopad_backend *be) {
    if (!c) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "comm_join: communicator is NULL");
#ifdef NOPAD_HAVE_CUDA
    if (c->nccl && on_device(be)) return comm_nccl_join(c->nccl, be);
#endif
    (void)be;
    return NOPAD_OK;
}

nopad_status comm_all_gather(nopad_comm *c, nopad_backend *be, void *recv, const void *send, size_t count,
                             comm_type t) {
    const char *name = "comm_all_gather";
    nopad_status st = check_args(c, name, t, 0, COMM_SUM);
    route r = ROUTE_COPY;
    if (st == NOPAD_OK) st = route_of(c, be, name, &r);
    if (st != NOPAD_OK || count == 0) return st;
    const size_t part = count * comm_type_size(t);
    switch (r) {
    case ROUTE_COPY: return copy_bytes(be, recv, send, part);
#ifdef NOPAD_HAVE_CUDA
    case ROUTE_NCCL: return comm_nccl_all_gather(c->nccl, be, recv, send, count, t);
#endif
#ifdef NOPAD_HAVE_MPI
    case ROUTE_MPI: {
        int n = 0;
        if ((st = int_count(c, name, count, &n)) != NOPAD_OK) return st;
        const int in_place = send == (const char *)recv + (size_t)c->rank * part;
        if ((st = mpi_begin(c, name)) != NOPAD_OK) return st;
        MPI_Request req;
        const int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, mpi_type(t), recv, n, mpi_type(t), c->mpi,
                                      &req);
        return mpi_finish(c, rc, &req, "comm_all_gather: MPI_Iallgather");
    }
#endif
    default: break;
    }
    return nopad_set_error(NOPAD_ERR_INTERNAL, "%s: no route", name);
}

nopad_status comm_reduce_scatter(nopad_comm *c, nopad_backend *be, void *recv, const void *send, size_t count,
                                 comm_type t, comm_reduce op) {
    const char *name = "comm_reduce_scatter";
    nopad_status st = check_args(c, name, t, 1, op);
    route r = ROUTE_COPY;
    if (st == NOPAD_OK) st = route_of(c, be, name, &r);
    if (st != NOPAD_OK || count == 0) return st;
    switch (r) {
    case ROUTE_COPY: return copy_bytes(be, recv, send, count * comm_type_size(t));
#ifdef NOPAD_HAVE_CUDA
    case ROUTE_NCCL: return comm_nccl_reduce_scatter(c->nccl, be, recv, send, count, t, op);
#endif
#ifdef NOPAD_HAVE_MPI
    case ROUTE_MPI: return mpi_reduce_scatter(c, recv, send, count, t, op);
#endif
    default: break;
    }
    return nopad_set_error(NOPAD_ERR_INTERNAL, "%s: no route", name);
}

static nopad_status check_root(const nopad_comm *c, const char *op, int32_t root) {
    if (root < 0 || root >= c->size)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s on rank %d: root %d is not a rank of 0 .. %d", op,
                               c->rank, root, c->size - 1);
    return NOPAD_OK;
}

#ifdef NOPAD_HAVE_MPI
/* MPI_Ibcast of `count` elements of `type` (`size` bytes each) in INT_MAX pieces. */
static nopad_status mpi_broadcast(nopad_comm *c, void *buf, size_t count, size_t size, MPI_Datatype type,
                                  int32_t root, const char *op) {
    for (size_t done = 0; done < count;) {
        const size_t n = count - done < (size_t)INT_MAX ? count - done : (size_t)INT_MAX;
        nopad_status st = mpi_begin(c, op);
        if (st != NOPAD_OK) return st;
        MPI_Request req;
        const int rc = MPI_Ibcast((char *)buf + done * size, (int)n, type, root, c->mpi, &req);
        st = mpi_finish(c, rc, &req, op);
        if (st != NOPAD_OK) return st;
        done += n;
    }
    return NOPAD_OK;
}
#endif

nopad_status comm_broadcast(nopad_comm *c, nopad_backend *be, void *buf, size_t count, comm_type t, int32_t root) {
    const char *name = "comm_broadcast";
    nopad_status st = check_args(c, name, t, 0, COMM_SUM);
    route r = ROUTE_COPY;
    if (st == NOPAD_OK) st = check_root(c, name, root);
    if (st == NOPAD_OK) st = route_of(c, be, name, &r);
    if (st != NOPAD_OK || count == 0) return st;
    switch (r) {
    case ROUTE_COPY: return NOPAD_OK;
#ifdef NOPAD_HAVE_CUDA
    case ROUTE_NCCL: return comm_nccl_broadcast(c->nccl, be, buf, count, t, root);
#endif
#ifdef NOPAD_HAVE_MPI
    case ROUTE_MPI:
        return mpi_broadcast(c, buf, count, comm_type_size(t), mpi_type(t), root, "comm_broadcast: MPI_Ibcast");
#endif
    default: break;
    }
    return nopad_set_error(NOPAD_ERR_INTERNAL, "%s: no route", name);
}

#ifdef NOPAD_HAVE_MPI
/* A started MPI_Ialltoallv: MPI reads its int counts and offsets until it completes. */
struct comm_host_request {
    MPI_Request req;
    int rc; /* what MPI_Ialltoallv returned */
    int *ints; /* [4 · size] send counts, send offsets, receive counts, receive offsets */
};

static nopad_status mpi_all_to_allv_start(nopad_comm *c, void *recv, const size_t *recv_counts,
                                          const size_t *recv_offsets, const void *send, const size_t *send_counts,
                                          const size_t *send_offsets, comm_type t, comm_host_request **out) {
    const char *name = "comm_all_to_allv";
    comm_host_request *r = calloc(1, sizeof *r);
    int *ints = malloc(4 * (size_t)c->size * sizeof *ints);
    if (!r || !ints) {
        free(r), free(ints);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
    }
    r->ints = ints;
    int *scount = ints, *soff = ints + c->size, *rcount = ints + 2 * c->size, *roff = ints + 3 * c->size;
    nopad_status st = NOPAD_OK;
    for (int32_t p = 0; p < c->size && st == NOPAD_OK; p++) {
        st = int_count(c, name, send_counts[p], &scount[p]);
        if (st == NOPAD_OK) st = int_count(c, name, send_offsets[p], &soff[p]);
        if (st == NOPAD_OK) st = int_count(c, name, recv_counts[p], &rcount[p]);
        if (st == NOPAD_OK) st = int_count(c, name, recv_offsets[p], &roff[p]);
    }
    if (st == NOPAD_OK) st = mpi_begin(c, name);
    if (st != NOPAD_OK) {
        free(ints), free(r);
        return st;
    }
    r->rc = MPI_Ialltoallv(send, scount, soff, mpi_type(t), recv, rcount, roff, mpi_type(t), c->mpi, &r->req);
    *out = r;
    return NOPAD_OK;
}

static nopad_status mpi_wait(nopad_comm *c, comm_host_request *r) {
    const nopad_status st = mpi_finish(c, r->rc, &r->req, "comm_all_to_allv: MPI_Ialltoallv");
    if (!c->abandoned) free(r->ints);
    free(r);
    return st;
}

static nopad_status mpi_all_to_allv(nopad_comm *c, void *recv, const size_t *recv_counts,
                                    const size_t *recv_offsets, const void *send, const size_t *send_counts,
                                    const size_t *send_offsets, comm_type t) {
    comm_host_request *r = NULL;
    const nopad_status st =
        mpi_all_to_allv_start(c, recv, recv_counts, recv_offsets, send, send_counts, send_offsets, t, &r);
    return st == NOPAD_OK ? mpi_wait(c, r) : st;
}
#endif

nopad_status comm_all_to_allv(nopad_comm *c, nopad_backend *be, void *recv, const size_t *recv_counts,
                              const size_t *recv_offsets, const void *send, const size_t *send_counts,
                              const size_t *send_offsets, comm_type t) {
    const char *name = "comm_all_to_allv";
    nopad_status st = check_args(c, name, t, 0, COMM_SUM);
    if (st != NOPAD_OK) return st;
    if (!recv_counts || !recv_offsets || !send_counts || !send_offsets)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s on rank %d: counts and offsets must not be NULL", name,
                               c->rank);
    route r = ROUTE_COPY;
    if ((st = route_of(c, be, name, &r)) != NOPAD_OK) return st;
    switch (r) {
    case ROUTE_COPY:
        if (send_counts[0] != recv_counts[0])
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "%s: one rank sends itself %zu elements but expects %zu", name, send_counts[0],
                                   recv_counts[0]);
        return copy_bytes(be, (char *)recv + recv_offsets[0] * comm_type_size(t),
                          (const char *)send + send_offsets[0] * comm_type_size(t), send_counts[0] * comm_type_size(t));
#ifdef NOPAD_HAVE_CUDA
    case ROUTE_NCCL:
        return comm_nccl_all_to_allv(c->nccl, be, recv, recv_counts, recv_offsets, send, send_counts, send_offsets, t);
#endif
#ifdef NOPAD_HAVE_MPI
    case ROUTE_MPI: return mpi_all_to_allv(c, recv, recv_counts, recv_offsets, send, send_counts, send_offsets, t);
#endif
    default: break;
    }
    return nopad_set_error(NOPAD_ERR_INTERNAL, "%s: no route", name);
}

nopad_status comm_barrier(nopad_comm *c, nopad_backend *be) {
    const char *name = "comm_barrier";
    if (!c) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: communicator is NULL", name);
    route r = ROUTE_COPY;
    nopad_status st = route_of(c, be, name, &r);
    if (st != NOPAD_OK) return st;
#ifdef NOPAD_HAVE_MPI
    /* the hosts meet first, so that the device part below waits only for stream work, never for a
     * slower host (the NCCL watchdog times device waits) */
    if (uses_mpi(c)) {
        if ((st = mpi_begin(c, name)) != NOPAD_OK) return st;
        MPI_Request req;
        const int rc = MPI_Ibarrier(c->mpi, &req);
        st = mpi_finish(c, rc, &req, "comm_barrier: MPI_Ibarrier");
        if (st != NOPAD_OK) return st;
    }
#endif
#ifdef NOPAD_HAVE_CUDA
    if (r == ROUTE_NCCL) return comm_nccl_barrier(c->nccl, be);
#endif
    if (r == ROUTE_COPY && on_device(be)) return be->synchronize(be);
    return NOPAD_OK;
}

nopad_status comm_watch(nopad_comm *c, nopad_backend *be) {
    if (!c) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "comm_watch: communicator is NULL");
#ifdef NOPAD_HAVE_CUDA
    if (c->nccl && on_device(be)) return comm_nccl_watch(c->nccl, be);
#endif
    (void)be;
    return NOPAD_OK;
}

nopad_status comm_host_broadcast(nopad_comm *c, void *buf, size_t bytes, int32_t root) {
    const char *name = "comm_host_broadcast";
    if (!c) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: communicator is NULL", name);
    nopad_status st = check_root(c, name, root);
    if (st != NOPAD_OK) return st;
#ifdef NOPAD_HAVE_MPI
    if (uses_mpi(c)) return mpi_broadcast(c, buf, bytes, 1, MPI_BYTE, root, "comm_host_broadcast: MPI_Ibcast");
#endif
    (void)buf, (void)bytes;
    return NOPAD_OK;
}

nopad_status comm_host_all_to_allv_start(nopad_comm *c, void *recv, const size_t *recv_counts,
                                         const size_t *recv_offsets, const void *send, const size_t *send_counts,
                                         const size_t *send_offsets, comm_type t, comm_host_request **out) {
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "comm_host_all_to_allv_start: out is NULL");
    *out = NULL;
#ifdef NOPAD_HAVE_MPI
    if (c && uses_mpi(c)) {
        nopad_status st = check_args(c, "comm_host_all_to_allv_start", t, 0, COMM_SUM);
        if (st == NOPAD_OK && (!recv_counts || !recv_offsets || !send_counts || !send_offsets))
            st = nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                 "comm_host_all_to_allv_start on rank %d: counts and offsets must not be NULL",
                                 c->rank);
        if (st != NOPAD_OK) return st;
        return mpi_all_to_allv_start(c, recv, recv_counts, recv_offsets, send, send_counts, send_offsets, t, out);
    }
#endif
    /* no MPI: a world of one, whose exchange is a copy */
    return comm_all_to_allv(c, NULL, recv, recv_counts, recv_offsets, send, send_counts, send_offsets, t);
}

nopad_status comm_host_wait(nopad_comm *c, comm_host_request *req) {
    if (!req) return NOPAD_OK;
#ifdef NOPAD_HAVE_MPI
    return mpi_wait(c, req);
#else
    (void)c;
    return nopad_set_error(NOPAD_ERR_INTERNAL, "comm_host_wait: a request in a build without MPI");
#endif
}

void comm_set_wait_limit(nopad_comm *c, double seconds) {
    if (c) c->wait_limit_s = seconds > 0 ? seconds : 0;
}

int comm_timed_out(const nopad_comm *c) { return c && c->timed_out; }

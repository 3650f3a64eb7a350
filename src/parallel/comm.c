/* The communicator (comm.h): the world and its sub-groups, and each collective routed to the
 * engine that moves it — a copy for a world of one, MPI for host memory, NCCL (comm_nccl.c) for a
 * CUDA backend's memory. MPI has no half-precision types: F16 and BF16 travel as 2-byte types of
 * our own with reductions of our own (computed in float32, rounded to nearest even). */
#define _DEFAULT_SOURCE /* glibc's on_exit: the exit status decides between finalising and aborting */
#include "parallel/comm.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
#ifdef NOPAD_HAVE_MPI
    MPI_Comm mpi; /* a communicator of our own (never the caller's); MPI_COMM_NULL: no MPI */
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

/* inout[i] = op(in[i], inout[i]) over 2-byte halves, in float32, rounded back. */
#define HALF_OP(name, to_f32, from_f32, expr)                                                      \
    static void name(void *in, void *inout, int *len, MPI_Datatype *type) {                        \
        (void)type;                                                                                \
        const uint16_t *a = in;                                                                    \
        uint16_t *b = inout;                                                                       \
        for (int i = 0; i < *len; i++) {                                                           \
            const float x = to_f32(a[i]), y = to_f32(b[i]);                                        \
            b[i] = from_f32(expr);                                                                 \
        }                                                                                          \
    }
HALF_OP(f16_sum, f16_to_f32, f32_to_f16, x + y)
HALF_OP(f16_max, f16_to_f32, f32_to_f16, fmaxf(x, y))
HALF_OP(f16_min, f16_to_f32, f32_to_f16, fminf(x, y))
HALF_OP(bf16_sum, bf16_to_f32, f32_to_bf16, x + y)
HALF_OP(bf16_max, bf16_to_f32, f32_to_bf16, fmaxf(x, y))
HALF_OP(bf16_min, bf16_to_f32, f32_to_bf16, fminf(x, y))
#undef HALF_OP

/* MPI's part of the process: started once (unless the caller started it), finalised at exit. */
static pthread_mutex_t mpi_lock = PTHREAD_MUTEX_INITIALIZER;
static int mpi_ready;
static MPI_Datatype mpi_f16, mpi_bf16;
static MPI_Op mpi_half_ops[2][3]; /* [bf16?][comm_reduce] */

/* MPI_Finalize waits for every rank to finalise: a rank that leaves on an error while the others
 * wait for it in a collective would hang the job. So a failing exit aborts the world instead, and
 * the launcher ends every rank with a message naming this one; a clean exit finalises. */
static void mpi_end_at_exit(int status, void *unused) {
    (void)unused;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
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
 * run collectives on communicators of their own), with our half types and reductions. */
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
    MPI_User_function *const fns[2][3] = {{f16_sum, f16_max, f16_min}, {bf16_sum, bf16_max, bf16_min}};
    for (int b = 0; b < 2; b++)
        for (int r = 0; r < 3; r++) MPI_Op_create(fns[b][r], 1, &mpi_half_ops[b][r]);
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

static MPI_Op mpi_op(comm_type t, comm_reduce op) {
    if (t == COMM_F16 || t == COMM_BF16) return mpi_half_ops[t == COMM_BF16][op];
    return op == COMM_MAX ? MPI_MAX : op == COMM_MIN ? MPI_MIN : MPI_SUM;
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

/* The communicator over `mpi` (ours from now on): its ranks, this machine's share, errors returned. */
static nopad_status comm_from_mpi(MPI_Comm mpi, int forced, nopad_comm **out) {
    nopad_comm *c = calloc(1, sizeof *c);
    if (!c) {
        MPI_Comm_free(&mpi);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "comm: out of memory");
    }
    c->mpi = mpi;
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
                               "tensor parallelism over %d ranks: this build of nopad has no MPI (install it: "
                               "apt-get install libopenmpi-dev openmpi-bin, then configure and build again)",
                               want);
    (void)launched;
    return comm_single(1, out); /* forced: NCCL bootstraps on its own, no MPI needed */
#else
    if (want > 1 && launched <= 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "tensor parallelism over %d ranks: this process was not started by a launcher "
                               "(its world has one rank); run it under `mpirun -np %d ...`, or use the CLI's "
                               "--tp %d, which starts the ranks",
                               want, want, want);
    if (want > 1 && launched != want)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "tensor parallelism over %d ranks: the launcher's world has %d ranks; they must "
                               "be equal (mpirun -np %d, or tp %d)",
                               want, launched, want, launched);
    nopad_status st = mpi_start();
    if (st != NOPAD_OK) return st;
    /* a forced world of one is this process alone, whatever world it was launched in */
    MPI_Comm base = want > 1 ? MPI_COMM_WORLD : MPI_COMM_SELF;
    int size = 0;
    MPI_Comm_size(base, &size);
    if (want > 1 && size != want)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "tensor parallelism over %d ranks: MPI's world has %d ranks (the launcher's "
                               "environment said %d)",
                               want, size, launched);
    MPI_Comm mine;
    const int rc = MPI_Comm_dup(base, &mine);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "comm_world: MPI_Comm_dup", NULL);
    return comm_from_mpi(mine, forced && want <= 1, out);
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
    if (uses_mpi(c) && !finalized) MPI_Comm_free(&c->mpi);
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
    case ROUTE_MPI:
        /* in INT_MAX pieces: element-wise, so pieces change nothing */
        for (size_t done = 0; done < count;) {
            const size_t n = count - done < (size_t)INT_MAX ? count - done : (size_t)INT_MAX;
            const int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + done * comm_type_size(t), (int)n, mpi_type(t),
                                         mpi_op(t, op), c->mpi);
            if (rc != MPI_SUCCESS) return mpi_error(rc, "comm_all_reduce: MPI_Allreduce", c);
            done += n;
        }
        return NOPAD_OK;
#endif
    default: break;
    }
    return nopad_set_error(NOPAD_ERR_INTERNAL, "%s: no route", name);
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
        const int rc = MPI_Allgather(in_place ? MPI_IN_PLACE : send, n, mpi_type(t), recv, n, mpi_type(t), c->mpi);
        return rc == MPI_SUCCESS ? NOPAD_OK : mpi_error(rc, "comm_all_gather: MPI_Allgather", c);
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
    case ROUTE_MPI: {
        int n = 0;
        if ((st = int_count(c, name, count, &n)) != NOPAD_OK) return st;
        const int rc = MPI_Reduce_scatter_block(send, recv, n, mpi_type(t), mpi_op(t, op), c->mpi);
        return rc == MPI_SUCCESS ? NOPAD_OK : mpi_error(rc, "comm_reduce_scatter: MPI_Reduce_scatter_block", c);
    }
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
/* MPI_Bcast of `count` elements of `type` (`size` bytes each) in INT_MAX pieces. */
static nopad_status mpi_broadcast(const nopad_comm *c, void *buf, size_t count, size_t size, MPI_Datatype type,
                                  int32_t root, const char *op) {
    for (size_t done = 0; done < count;) {
        const size_t n = count - done < (size_t)INT_MAX ? count - done : (size_t)INT_MAX;
        const int rc = MPI_Bcast((char *)buf + done * size, (int)n, type, root, c->mpi);
        if (rc != MPI_SUCCESS) return mpi_error(rc, op, c);
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
        return mpi_broadcast(c, buf, count, comm_type_size(t), mpi_type(t), root, "comm_broadcast: MPI_Bcast");
#endif
    default: break;
    }
    return nopad_set_error(NOPAD_ERR_INTERNAL, "%s: no route", name);
}

#ifdef NOPAD_HAVE_MPI
static nopad_status mpi_all_to_allv(const nopad_comm *c, void *recv, const size_t *recv_counts,
                                    const size_t *recv_offsets, const void *send, const size_t *send_counts,
                                    const size_t *send_offsets, comm_type t) {
    const char *name = "comm_all_to_allv";
    int *ints = malloc(4 * (size_t)c->size * sizeof *ints);
    if (!ints) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
    int *scount = ints, *soff = ints + c->size, *rcount = ints + 2 * c->size, *roff = ints + 3 * c->size;
    nopad_status st = NOPAD_OK;
    for (int32_t p = 0; p < c->size && st == NOPAD_OK; p++) {
        st = int_count(c, name, send_counts[p], &scount[p]);
        if (st == NOPAD_OK) st = int_count(c, name, send_offsets[p], &soff[p]);
        if (st == NOPAD_OK) st = int_count(c, name, recv_counts[p], &rcount[p]);
        if (st == NOPAD_OK) st = int_count(c, name, recv_offsets[p], &roff[p]);
    }
    if (st == NOPAD_OK) {
        const int rc = MPI_Alltoallv(send, scount, soff, mpi_type(t), recv, rcount, roff, mpi_type(t), c->mpi);
        if (rc != MPI_SUCCESS) st = mpi_error(rc, "comm_all_to_allv: MPI_Alltoallv", c);
    }
    free(ints);
    return st;
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
        const int rc = MPI_Barrier(c->mpi);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "comm_barrier: MPI_Barrier", c);
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
    if (uses_mpi(c)) return mpi_broadcast(c, buf, bytes, 1, MPI_BYTE, root, "comm_host_broadcast: MPI_Bcast");
#endif
    (void)buf, (void)bytes;
    return NOPAD_OK;
}

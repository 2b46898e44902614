/* transport_mpi - the Open MPI transport (see transport_mpi.h). */
#include "transport/transport_mpi.h"

#include <limits.h>
#include <stdio.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/reduce.h"
#include "transport/hosts.h"

typedef struct mpi_transport {
    cx_transport base;
    MPI_Comm comm, local, cross;
    /* A duplicate for splits (subset contexts), made on user threads while the background thread
     * uses comm; splits of one transport are serialised by split_mu. */
    MPI_Comm split_comm;
    pthread_mutex_t split_mu;
    int pretend_local_size; /* tests' pretend hosts (cx_transport_mpi_create), kept by subsets */
} mpi_transport;

/* Process-wide MPI state. MPI itself is process-global, so this is the one place that must be:
 * the user ops and the 2-byte datatype are created once, and MPI is finalized at exit only if
 * Conflux initialised it. */
static pthread_once_t mpi_once = PTHREAD_ONCE_INIT;
static int mpi_init_status;
static char mpi_init_message[512];
static MPI_Datatype half_type = MPI_DATATYPE_NULL;
static MPI_Op half_ops[2][CFX_OP_COUNT]; /* [0] float16, [1] bfloat16 */

/* The deadline of every wait (CFX_TRANSPORT_TIMEOUT_S). An MPI call in flight cannot be cancelled,
 * so a wait past it gives the call up: the world is lost for this process (`world_lost`, with the
 * message every later call repeats), nothing here calls MPI again, and at exit the job is aborted
 * rather than finalized, since MPI_Finalize would wait for the silent peer. `suspects` names the
 * ranks a stuck call may be waiting for: those on other hosts, else the other ranks. */
static _Atomic double wait_deadline_s = 30;
static atomic_int world_lost;
static char world_lost_message[CX_ERROR_MAX];
static char suspects[1024] = "another rank";

static void finalize_at_exit(void)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return;
    if (atomic_load(&world_lost)) {
        fprintf(stderr, "conflux: aborting the MPI job: %s\n", world_lost_message);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Finalize();
}

#define HALF_OP(name, dt, op)                                                               \
    static void name(void *in, void *inout, int *len, MPI_Datatype *type)                  \
    {                                                                                      \
        (void)type;                                                                        \
        cx_reduce_into(inout, in, (size_t)*len, dt, op);                                   \
    }
HALF_OP(f16_sum, CFX_FLOAT16, CFX_OP_SUM)
HALF_OP(f16_min, CFX_FLOAT16, CFX_OP_MIN)
HALF_OP(f16_max, CFX_FLOAT16, CFX_OP_MAX)
HALF_OP(f16_prod, CFX_FLOAT16, CFX_OP_PRODUCT)
HALF_OP(bf16_sum, CFX_BFLOAT16, CFX_OP_SUM)
HALF_OP(bf16_min, CFX_BFLOAT16, CFX_OP_MIN)
HALF_OP(bf16_max, CFX_BFLOAT16, CFX_OP_MAX)
HALF_OP(bf16_prod, CFX_BFLOAT16, CFX_OP_PRODUCT)

static void init_mpi_once(void)
{
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
            mpi_init_status = CFX_ERR_TRANSPORT;
            snprintf(mpi_init_message, sizeof mpi_init_message, "MPI_Init_thread failed");
            return;
        }
        atexit(finalize_at_exit);
        if (provided < MPI_THREAD_MULTIPLE) {
            mpi_init_status = CFX_ERR_TRANSPORT;
            snprintf(mpi_init_message, sizeof mpi_init_message, "this MPI provides thread level %d, "
                     "Conflux needs MPI_THREAD_MULTIPLE (%d)", provided, MPI_THREAD_MULTIPLE);
            return;
        }
    } else {
        int provided = 0;
        MPI_Query_thread(&provided);
        if (provided < MPI_THREAD_MULTIPLE) {
            mpi_init_status = CFX_ERR_TRANSPORT;
            snprintf(mpi_init_message, sizeof mpi_init_message, "the application initialised MPI "
                     "with thread level %d; Conflux's background thread needs MPI_THREAD_MULTIPLE "
                     "(call MPI_Init_thread with MPI_THREAD_MULTIPLE)", provided);
            return;
        }
    }
    MPI_Type_contiguous(2, MPI_BYTE, &half_type);
    MPI_Type_commit(&half_type);
    MPI_User_function *fns[2][CFX_OP_COUNT] = {
        {f16_sum, f16_sum, f16_min, f16_max, f16_prod},
        {bf16_sum, bf16_sum, bf16_min, bf16_max, bf16_prod}};
    for (int d = 0; d < 2; d++)
        for (int o = 0; o < CFX_OP_COUNT; o++)
            if (fns[d][o]) /* none for Adasum: exec/adasum.c runs it over sendrecv */
                MPI_Op_create(fns[d][o], 1, &half_ops[d][o]);
}

static cfx_status mpi_error(int rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return cx_fail(CFX_ERR_TRANSPORT, "%s failed: %s", what, text);
}

/* Waits for a request without holding a core for long: MPI_Test (which also drives progress, as
 * Open MPI has no progress thread here) in a loop that yields the core between tests, for up to
 * 200 us, then sleeps with exponential backoff (20 us doubling to 500 us). A cache-sized chunk
 * completes within the yielding phase; a sleep there would cost more than the chunk (a nanosleep
 * of 1 us takes ~60 us with the default timer slack). Sleeping only starts when other ranks are
 * genuinely late. */
static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Gives up a wait past its deadline (see wait_deadline_s). */
static cfx_status give_up(const char *what, double waited_us)
{
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    snprintf(world_lost_message, sizeof world_lost_message, "%s (rank %d, host %s): a peer died or "
             "stopped answering within %g s (CFX_TRANSPORT_TIMEOUT_S); waited %.2f s: suspect %s. "
             "An MPI call cannot be cancelled: this process makes no further MPI calls and the job "
             "is aborted at exit", what, rank, host, atomic_load(&wait_deadline_s), waited_us * 1e-6, suspects);
    atomic_store(&world_lost, 1);
    return cx_fail(CFX_ERR_PEER_LOST, "%s", world_lost_message);
}

static cfx_status wait_request(MPI_Request *req, const char *what)
{
    if (atomic_load(&world_lost))
        return cx_fail(CFX_ERR_PEER_LOST, "%s", world_lost_message);
    int done = 0;
    double start = 0;
    for (unsigned i = 0;; i++) {
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return mpi_error(rc, what);
        if (done)
            return CFX_OK;
        if (i == 16)
            start = now_us();
        if (i >= 16) {
            if ((i & 15) == 0 && now_us() - start > 200)
                break;
            sched_yield();
        }
    }
    long sleep_ns = 20000;
    for (;;) {
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return mpi_error(rc, what);
        if (done)
            return CFX_OK;
        if (sleep_ns < 500000)
            sleep_ns *= 2;
        double waited = now_us() - start;
        if (waited > atomic_load(&wait_deadline_s) * 1e6)
            return give_up(what, waited);
    }
}

/* The suspects of a stuck call (see wait_deadline_s): every rank's host, gathered once over the
 * world at the first transport. */
static cfx_status find_suspects(void)
{
    enum { HOST_MAX = 64 };
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char mine[HOST_MAX] = {0};
    gethostname(mine, HOST_MAX - 1);
    char *all = calloc((size_t)size, HOST_MAX);
    if (!all)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for %d host names", size);
    int rc = MPI_Allgather(mine, HOST_MAX, MPI_CHAR, all, HOST_MAX, MPI_CHAR, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        free(all);
        return mpi_error(rc, "MPI_Allgather (host names)");
    }
    bool other_hosts = false;
    for (int r = 0; r < size; r++)
        other_hosts = other_hosts || strcmp(all + (size_t)r * HOST_MAX, mine) != 0;
    size_t len = 0;
    for (int r = 0; r < size && len + 1 < sizeof suspects; r++) {
        const char *host = all + (size_t)r * HOST_MAX;
        if (r == rank || (other_hosts && strcmp(host, mine) == 0))
            continue;
        int w = snprintf(suspects + len, sizeof suspects - len, "%srank %d on host %s",
                         len ? " or " : "", r, host);
        if (w < 0 || (size_t)w >= sizeof suspects - len)
            break;
        len += (size_t)w;
    }
    free(all);
    return CFX_OK;
}

static MPI_Comm comm_of(cx_transport *t) { return ((mpi_transport *)t)->comm; }

static cfx_status check_int(size_t n, const char *what)
{
    if (n > INT_MAX)
        return cx_fail(CFX_ERR_UNSUPPORTED, "%s: %zu exceeds MPI's int count limit", what, n);
    return CFX_OK;
}

static cfx_status mpi_gather_bytes(cx_transport *t, const void *send, size_t len, void **recv_out,
                                   size_t *lens_out)
{
    MPI_Comm comm = comm_of(t);
    int size = t->size;
    unsigned long long mine = len;
    unsigned long long *all = t->rank == 0 ? malloc(sizeof *all * (size_t)size) : NULL;
    *recv_out = NULL;
    if (t->rank == 0 && !all)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory gathering request sizes");
    MPI_Request req;
    int rc = MPI_Igather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all, 1, MPI_UNSIGNED_LONG_LONG, 0, comm, &req);
    cfx_status st = rc == MPI_SUCCESS ? wait_request(&req, "MPI_Igather") : mpi_error(rc, "MPI_Igather");
    int *counts = NULL, *displs = NULL;
    char *buf = NULL;
    if (!st && t->rank == 0) {
        counts = malloc(sizeof *counts * (size_t)size);
        displs = malloc(sizeof *displs * (size_t)size);
        size_t total = 0;
        for (int r = 0; r < size; r++)
            total += all[r];
        buf = malloc(total ? total : 1);
        if (!counts || !displs || !buf)
            st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory gathering %zu request bytes", total);
        else if (!(st = check_int(total, "gathered request bytes"))) {
            size_t off = 0;
            for (int r = 0; r < size; r++) {
                counts[r] = (int)all[r];
                displs[r] = (int)off;
                lens_out[r] = all[r];
                off += all[r];
            }
        }
    }
    /* Every rank must enter the gatherv even if rank 0 failed locally, or the others hang. */
    if (!st || t->rank == 0) {
        if (st == CFX_OK && (st = check_int(len, "request bytes")) == CFX_OK) {
            rc = MPI_Igatherv(send, (int)len, MPI_BYTE, buf, counts, displs, MPI_BYTE, 0, comm, &req);
            st = rc == MPI_SUCCESS ? wait_request(&req, "MPI_Igatherv") : mpi_error(rc, "MPI_Igatherv");
        }
    }
    free(all);
    free(counts);
    free(displs);
    if (st) {
        free(buf);
        return st;
    }
    *recv_out = buf;
    return CFX_OK;
}

static cfx_status mpi_bcast_bytes(cx_transport *t, void **buf, size_t *len, int root)
{
    MPI_Comm comm = comm_of(t);
    unsigned long long n = *len;
    MPI_Request req;
    int rc = MPI_Ibcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, comm, &req);
    cfx_status st = rc == MPI_SUCCESS ? wait_request(&req, "MPI_Ibcast") : mpi_error(rc, "MPI_Ibcast");
    if (st)
        return st;
    if ((st = check_int(n, "response bytes")))
        return st;
    void *data = *buf;
    if (t->rank != root && !(data = malloc(n ? n : 1)))
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for %llu response bytes", n);
    rc = MPI_Ibcast(data, (int)n, MPI_BYTE, root, comm, &req);
    st = rc == MPI_SUCCESS ? wait_request(&req, "MPI_Ibcast") : mpi_error(rc, "MPI_Ibcast");
    if (st) {
        if (t->rank != root)
            free(data);
        return st;
    }
    *buf = data;
    *len = n;
    return CFX_OK;
}

static cfx_status mpi_allreduce_and(cx_transport *t, uint64_t *words, size_t count)
{
    MPI_Request req;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, words, (int)count, MPI_UINT64_T, MPI_BAND, comm_of(t), &req);
    return rc == MPI_SUCCESS ? wait_request(&req, "MPI_Iallreduce") : mpi_error(rc, "MPI_Iallreduce");
}

static MPI_Datatype mpi_type(cfx_dtype dtype)
{
    switch (dtype) {
    case CFX_UINT8: return MPI_UINT8_T;
    case CFX_INT8: return MPI_INT8_T;
    case CFX_UINT16: return MPI_UINT16_T;
    case CFX_INT16: return MPI_INT16_T;
    case CFX_INT32: return MPI_INT32_T;
    case CFX_INT64: return MPI_INT64_T;
    case CFX_FLOAT16: return half_type;
    case CFX_BFLOAT16: return half_type;
    case CFX_FLOAT32: return MPI_FLOAT;
    case CFX_FLOAT64: return MPI_DOUBLE;
    case CFX_BOOL: return MPI_UINT8_T;
    }
    return MPI_DATATYPE_NULL;
}

static MPI_Op mpi_op(cfx_dtype dtype, cfx_reduce_op op)
{
    if (dtype == CFX_FLOAT16 || dtype == CFX_BFLOAT16)
        return half_ops[dtype == CFX_BFLOAT16][op];
    if (dtype == CFX_BOOL)
        return (op == CFX_OP_MIN || op == CFX_OP_PRODUCT) ? MPI_LAND : MPI_LOR;
    switch (op) {
    case CFX_OP_SUM:
    case CFX_OP_AVERAGE: return MPI_SUM;
    case CFX_OP_MIN: return MPI_MIN;
    case CFX_OP_MAX: return MPI_MAX;
    case CFX_OP_PRODUCT: return MPI_PROD;
    case CFX_OP_ADASUM: break; /* not an MPI reduction: exec/adasum.c */
    }
    return MPI_OP_NULL;
}

/* In-place allreduce on `comm` (the job's, or the cross-host one). Data-plane calls are made only
 * after every rank agreed to run them, so the ranks arrive together and the blocking call waits
 * briefly; it is also Open MPI's tuned algorithm, several times faster on large buffers than the
 * nonblocking one (libnbc). The control plane, where ranks do wait for each other, stays
 * nonblocking. */
static cfx_status iallreduce(MPI_Comm comm, void *buf, size_t count, cfx_dtype dtype,
                             cfx_reduce_op op, const char *what)
{
    cfx_status st = check_int(count, what);
    if (st)
        return st;
    int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, mpi_type(dtype), mpi_op(dtype, op), comm);
    return rc == MPI_SUCCESS ? CFX_OK : mpi_error(rc, what);
}

static cfx_status mpi_allreduce(cx_transport *t, void *buf, size_t count, cfx_dtype dtype,
                                cfx_reduce_op op)
{
    return iallreduce(comm_of(t), buf, count, dtype, op, "MPI_Allreduce");
}

/* Converts per-rank byte counts to MPI's ints (NULL and an error beyond INT_MAX). */
static int *int_counts(const size_t *v, int n, const char *what, cfx_status *st)
{
    int *out = malloc(sizeof *out * (size_t)n);
    if (!out) {
        *st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for %s", what);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (v[i] > INT_MAX) {
            free(out);
            *st = cx_fail(CFX_ERR_UNSUPPORTED, "%s: %zu bytes exceed MPI's int count limit", what, v[i]);
            return NULL;
        }
        out[i] = (int)v[i];
    }
    return out;
}

static cfx_status mpi_allgatherv(cx_transport *t, const void *send, size_t send_bytes, void *recv,
                                 const size_t *recv_bytes, const size_t *displs)
{
    cfx_status st = check_int(send_bytes, "allgather bytes");
    int *counts = st ? NULL : int_counts(recv_bytes, t->size, "allgather counts", &st);
    int *offs = st ? NULL : int_counts(displs, t->size, "allgather displacements", &st);
    if (!st) {
        MPI_Request req;
        int rc = MPI_Iallgatherv(send, (int)send_bytes, MPI_BYTE, recv, counts, offs, MPI_BYTE,
                                 comm_of(t), &req);
        st = rc == MPI_SUCCESS ? wait_request(&req, "MPI_Iallgatherv") : mpi_error(rc, "MPI_Iallgatherv");
    }
    free(counts);
    free(offs);
    return st;
}

static cfx_status mpi_broadcast(cx_transport *t, void *buf, size_t bytes, int root)
{
    /* In pieces below INT_MAX so any size works. */
    const size_t piece = (size_t)1 << 30;
    for (size_t off = 0; off < bytes || (bytes == 0 && off == 0); off += piece) {
        size_t n = bytes - off < piece ? bytes - off : piece;
        MPI_Request req;
        int rc = MPI_Ibcast((char *)buf + off, (int)n, MPI_BYTE, root, comm_of(t), &req);
        cfx_status st = rc == MPI_SUCCESS ? wait_request(&req, "MPI_Ibcast") : mpi_error(rc, "MPI_Ibcast");
        if (st)
            return st;
        if (bytes == 0)
            break;
    }
    return CFX_OK;
}

static cfx_status mpi_alltoallv(cx_transport *t, const void *send, const size_t *send_bytes,
                                const size_t *sdispls, void *recv, const size_t *recv_bytes,
                                const size_t *rdispls)
{
    cfx_status st = CFX_OK;
    int *sc = int_counts(send_bytes, t->size, "alltoall send counts", &st);
    int *sd = st ? NULL : int_counts(sdispls, t->size, "alltoall send displacements", &st);
    int *rc_ = st ? NULL : int_counts(recv_bytes, t->size, "alltoall receive counts", &st);
    int *rd = st ? NULL : int_counts(rdispls, t->size, "alltoall receive displacements", &st);
    if (!st) {
        MPI_Request req;
        int rc = MPI_Ialltoallv(send, sc, sd, MPI_BYTE, recv, rc_, rd, MPI_BYTE, comm_of(t), &req);
        st = rc == MPI_SUCCESS ? wait_request(&req, "MPI_Ialltoallv") : mpi_error(rc, "MPI_Ialltoallv");
    }
    free(sc);
    free(sd);
    free(rc_);
    free(rd);
    return st;
}

static cfx_status mpi_reduce_scatter(cx_transport *t, const void *send, void *recv,
                                     const size_t *counts, cfx_dtype dtype, cfx_reduce_op op)
{
    cfx_status st = CFX_OK;
    int *c = int_counts(counts, t->size, "reducescatter counts", &st);
    if (!st) {
        MPI_Request req;
        int rc = MPI_Ireduce_scatter(send, recv, c, mpi_type(dtype), mpi_op(dtype, op), comm_of(t), &req);
        st = rc == MPI_SUCCESS ? wait_request(&req, "MPI_Ireduce_scatter")
                               : mpi_error(rc, "MPI_Ireduce_scatter");
    }
    free(c);
    return st;
}

static cfx_status mpi_barrier(cx_transport *t)
{
    MPI_Request req;
    int rc = MPI_Ibarrier(comm_of(t), &req);
    return rc == MPI_SUCCESS ? wait_request(&req, "MPI_Ibarrier") : mpi_error(rc, "MPI_Ibarrier");
}

static cfx_status mpi_cross_allreduce(cx_transport *t, void *buf, size_t count, cfx_dtype dtype,
                                      cfx_reduce_op op)
{
    return iallreduce(((mpi_transport *)t)->cross, buf, count, dtype, op,
                      "MPI_Allreduce (cross-host)");
}

/* Point to point on the job's, the host's or the cross-host communicator, in pieces below
 * INT_MAX bytes (both sides cut a direction's bytes alike, and MPI keeps a pair's order). */
#define SENDRECV_TAG 0x5ada
static cfx_status mpi_sendrecv(cx_transport *t, cx_group group, const void *send, size_t send_bytes,
                               int to, void *recv, size_t recv_bytes, int from)
{
    mpi_transport *m = (mpi_transport *)t;
    MPI_Comm comm = group == CX_GROUP_LOCAL ? m->local : group == CX_GROUP_CROSS ? m->cross : m->comm;
    const size_t piece = (size_t)1 << 30;
    size_t sb = to < 0 ? 0 : send_bytes, rb = from < 0 ? 0 : recv_bytes;
    cfx_status st = CFX_OK;
    for (size_t off = 0; !st && (off < sb || off < rb); off += piece) {
        MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        int rc = MPI_SUCCESS;
        if (off < rb)
            rc = MPI_Irecv((char *)recv + off, (int)(rb - off < piece ? rb - off : piece), MPI_BYTE,
                           from, SENDRECV_TAG, comm, &req[0]);
        if (rc == MPI_SUCCESS && off < sb)
            rc = MPI_Isend((const char *)send + off, (int)(sb - off < piece ? sb - off : piece),
                           MPI_BYTE, to, SENDRECV_TAG, comm, &req[1]);
        if (rc != MPI_SUCCESS) { /* nothing was sent: a posted receive is taken back */
            if (req[0] != MPI_REQUEST_NULL) {
                MPI_Cancel(&req[0]);
                MPI_Wait(&req[0], MPI_STATUS_IGNORE);
            }
            return mpi_error(rc, off < sb ? "MPI_Isend" : "MPI_Irecv");
        }
        for (int i = 0; i < 2; i++) /* both are waited for, even after a failure */
            if (req[i] != MPI_REQUEST_NULL) {
                cfx_status w = wait_request(&req[i], i ? "MPI_Isend" : "MPI_Irecv");
                st = st ? st : w;
            }
    }
    return st;
}

static void mpi_destroy(cx_transport *t)
{
    mpi_transport *m = (mpi_transport *)t;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
        MPI_Comm_free(&m->cross);
        MPI_Comm_free(&m->local);
        MPI_Comm_free(&m->split_comm);
        MPI_Comm_free(&m->comm);
    }
    pthread_mutex_destroy(&m->split_mu);
    free(m);
}

static cfx_status from_comm(MPI_Comm comm, int pretend_local_size, cx_transport **out);

/* A peer on this host was lost in the shared-memory segment: MPI_Finalize at exit would wait for
 * it, so the job is aborted then instead (see wait_deadline_s). */
static void mpi_mark_lost(cx_transport *t)
{
    (void)t;
    if (!atomic_exchange(&world_lost, 1))
        snprintf(world_lost_message, sizeof world_lost_message, "a peer on this host was lost "
                 "(the shared-memory segment's deadline, CFX_TRANSPORT_TIMEOUT_S)");
}

static cfx_status mpi_split(cx_transport *t, const int *ranks, size_t n, cx_transport **out)
{
    mpi_transport *m = (mpi_transport *)t;
    *out = NULL;
    int key = -1;
    for (size_t i = 0; i < n; i++)
        if (ranks[i] == t->rank)
            key = (int)i;
    MPI_Comm sub = MPI_COMM_NULL;
    pthread_mutex_lock(&m->split_mu);
    int rc = MPI_Comm_split(m->split_comm, key >= 0 ? 0 : MPI_UNDEFINED, key, &sub);
    pthread_mutex_unlock(&m->split_mu);
    if (rc != MPI_SUCCESS)
        return mpi_error(rc, "MPI_Comm_split (subset context)");
    if (sub == MPI_COMM_NULL)
        return CFX_OK;
    return from_comm(sub, m->pretend_local_size, out);
}

static const cx_transport_ops mpi_ops = {
    .name = "mpi",
    /* The engine's segment reduces a host's share faster than Open MPI's own shared memory
     * (docs/performance.md); an MPI collective cannot be cancelled once started. */
    .caps = {.prefers_host_shm = true, .aborts_in_flight = false,
             .optional = CX_TRANSPORT_CROSS_ALLREDUCE | CX_TRANSPORT_SPLIT | CX_TRANSPORT_SENDRECV |
                         CX_TRANSPORT_MARK_LOST},
    .gather_bytes = mpi_gather_bytes,
    .bcast_bytes = mpi_bcast_bytes,
    .allreduce_and = mpi_allreduce_and,
    .allreduce = mpi_allreduce,
    .allgatherv = mpi_allgatherv,
    .broadcast = mpi_broadcast,
    .alltoallv = mpi_alltoallv,
    .reduce_scatter = mpi_reduce_scatter,
    .barrier = mpi_barrier,
    .cross_allreduce = mpi_cross_allreduce,
    .sendrecv = mpi_sendrecv,
    .split = mpi_split,
    .mark_lost = mpi_mark_lost,
    .destroy = mpi_destroy,
};

cfx_status cx_transport_mpi_create(const cx_transport_params *p, cx_transport **out)
{
    *out = NULL;
    pthread_once(&mpi_once, init_mpi_once);
    if (mpi_init_status)
        return cx_fail((cfx_status)mpi_init_status, "%s", mpi_init_message);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return cx_fail(CFX_ERR_TRANSPORT, "MPI has already been finalized in this process");
    /* Once per process (every rank makes the same transports in the same order, so the collective
     * matches), so that a give-up on another context's thread reads a settled text. */
    static atomic_int suspects_found;
    cfx_status st = CFX_OK;
    if (!atomic_load(&suspects_found) && !(st = find_suspects()))
        atomic_store(&suspects_found, 1);
    if (st)
        return st;
    atomic_store(&wait_deadline_s, p->timeout_s);
    MPI_Comm comm;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    if (rc != MPI_SUCCESS)
        return mpi_error(rc, "MPI_Comm_dup(MPI_COMM_WORLD)");
    return from_comm(comm, p->pretend_local_size, out);
}

/* Every rank's host as the lowest rank of `comm` sharing its memory (Open MPI's notion of a node),
 * or its pretend host: host_of has `size` entries. */
static int hosts_of(MPI_Comm comm, int rank, int pretend_local_size, int *host_of, int size)
{
    if (pretend_local_size > 0) { /* tests: pretend hosts (cx_transport_mpi_create) */
        for (int r = 0; r < size; r++)
            host_of[r] = r / pretend_local_size;
        return MPI_SUCCESS;
    }
    MPI_Comm node;
    int rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS)
        return rc;
    int lowest = rank;
    rc = MPI_Allreduce(&rank, &lowest, 1, MPI_INT, MPI_MIN, node);
    MPI_Comm_free(&node);
    return rc != MPI_SUCCESS ? rc : MPI_Allgather(&lowest, 1, MPI_INT, host_of, 1, MPI_INT, comm);
}

/* The transport over `comm` (owned from here on, also on failure). */
static cfx_status from_comm(MPI_Comm comm, int pretend_local_size, cx_transport **out)
{
    mpi_transport *m = calloc(1, sizeof *m);
    if (!m) {
        MPI_Comm_free(&comm);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the MPI transport");
    }
    m->comm = comm;
    m->pretend_local_size = pretend_local_size;
    pthread_mutex_init(&m->split_mu, NULL);
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, &m->base.rank);
    MPI_Comm_size(m->comm, &m->base.size);
    /* The grouping every transport shares (hosts.h), over Open MPI's nodes; the communicators
     * follow it: the host's in rank order, the cross group's in host order. */
    int *host_of = malloc(sizeof *host_of * (size_t)m->base.size);
    cx_host_groups g = {0};
    int rc = host_of ? hosts_of(m->comm, m->base.rank, pretend_local_size, host_of, m->base.size)
                     : MPI_ERR_NO_MEM;
    cfx_status st = CFX_OK;
    if (rc == MPI_SUCCESS &&
        !(st = cx_host_groups_make(host_of, m->base.size, m->base.rank, &g))) {
        rc = MPI_Comm_split(m->comm, g.host_index, m->base.rank, &m->local);
        if (rc == MPI_SUCCESS)
            rc = MPI_Comm_split(m->comm, g.local_rank, g.cross_rank, &m->cross);
        if (rc == MPI_SUCCESS)
            rc = MPI_Comm_dup(m->comm, &m->split_comm);
    }
    free(host_of);
    cx_host_groups_free(&g);
    if (rc != MPI_SUCCESS || st) {
        MPI_Comm_free(&m->comm);
        pthread_mutex_destroy(&m->split_mu);
        free(m);
        return st ? st : mpi_error(rc, "splitting the communicator by host");
    }
    MPI_Comm_rank(m->local, &m->base.local_rank);
    MPI_Comm_size(m->local, &m->base.local_size);
    MPI_Comm_rank(m->cross, &m->base.cross_rank);
    MPI_Comm_size(m->cross, &m->base.cross_size);
    m->base.ops = &mpi_ops;
    *out = &m->base;
    return CFX_OK;
}

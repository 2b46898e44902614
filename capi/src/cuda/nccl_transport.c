/* nccl_transport - collectives on device memory over NCCL (see nccl_transport.h). */
#include "cuda/nccl_transport.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/error.h"

struct cx_nccl {
    ncclComm_t comm;      /* NULL once aborted */
    cudaStream_t stream;  /* the caller's (not owned) */
    int rank, size, device;
    bool failed;
    double timeout_s;     /* how long a call on a non-blocking communicator may stay in progress */
};

_Static_assert(CX_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "NCCL unique id size changed");

/* Non-blocking communicators (ncclConfig_t.blocking = 0) and ncclCommFinalize: NCCL 2.14. */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
#define CX_NCCL_NONBLOCKING 1
#else
#define CX_NCCL_NONBLOCKING 0
#endif

/* bfloat16: NCCL 2.10. Before 2.19 nccl.h declares ncclBfloat16 only for CUDA compilers
 * (__CUDA_BF16_TYPES_EXIST__), so C code names it by its value, which is part of NCCL's ABI. */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
#define CX_NCCL_BF16 ((ncclDataType_t)9)
#endif

static void backoff(unsigned *spins)
{
    if (++*spins < 64)
        return;
    struct timespec ts = {0, *spins < 1024 ? 2000 : 50000}; /* 2 us, later 50 us */
    nanosleep(&ts, NULL);
}

/* A call on a non-blocking communicator may return ncclInProgress: poll the communicator until it
 * settles (its result), or until timeout_s passes (ncclInProgress is returned then). */
static ncclResult_t settle(ncclComm_t comm, ncclResult_t r, double timeout_s)
{
    if (r != ncclInProgress || !comm)
        return r;
    double deadline = cx_now_s() + timeout_s;
    for (unsigned spins = 0;; backoff(&spins)) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(comm, &state);
        if (q != ncclSuccess)
            return q;
        if (state != ncclInProgress)
            return state;
        if (cx_now_s() > deadline)
            return ncclInProgress;
    }
}

/* ---- errors ----------------------------------------------------------------------------------- */

/* Records an NCCL failure; anything but a bad argument poisons the communicator. */
static cfx_status nccl_fail(cx_nccl *c, ncclResult_t r, const char *what)
{
    const char *detail = c && c->comm ? ncclGetLastError(c->comm) : ncclGetLastError(NULL);
    if (c && r != ncclInvalidArgument)
        c->failed = true;
    if (r == ncclInProgress)
        return cx_fail(CFX_ERR_TIMEOUT, "%s: still in progress after %.1f s on the non-blocking "
                       "NCCL communicator (a peer may be gone)", what, c ? c->timeout_s : 0.0);
    return cx_fail(CFX_ERR_NCCL, "%s: %s (ncclResult %d)%s%s", what, ncclGetErrorString(r), (int)r,
                   detail && *detail ? ": " : "", detail ? detail : "");
}

static cfx_status cuda_fail(cudaError_t e, const char *what)
{
    (void)cudaGetLastError();
    return cx_fail(CFX_ERR_CUDA, "%s: %s (%d): %s", what, cudaGetErrorName(e), (int)e,
                   cudaGetErrorString(e));
}

static ncclResult_t settle_on(cx_nccl *c, ncclResult_t r)
{
    return c ? settle(c->comm, r, c->timeout_s) : r;
}

#define NCCL_TRY(c, call)                                                                         \
    do {                                                                                          \
        ncclResult_t r_ = settle_on((c), (call));                                                 \
        if (r_ != ncclSuccess)                                                                    \
            return nccl_fail((c), r_, #call);                                                     \
    } while (0)

/* Every collective starts here: a poisoned communicator fails at once, and the calling thread
 * must have the communicator's device current. */
static cfx_status ready(cx_nccl *c, const char *what)
{
    if (!c)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: NULL communicator", what);
    if (c->failed || !c->comm)
        return cx_fail(CFX_ERR_NCCL, "%s: the NCCL communicator failed earlier and was not "
                       "recovered", what);
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != c->device) {
        cudaError_t e = cudaSetDevice(c->device);
        if (e != cudaSuccess)
            return cuda_fail(e, "cudaSetDevice");
    }
    return CFX_OK;
}

/* Ends a group opened by the caller whatever happened inside, so NCCL's group depth stays right. */
static cfx_status group_end(cx_nccl *c, cfx_status st, const char *what)
{
    ncclResult_t r = settle(c->comm, ncclGroupEnd(), c->timeout_s);
    if (st)
        return st;
    return r == ncclSuccess ? CFX_OK : nccl_fail(c, r, what);
}

/* ---- mapping ---------------------------------------------------------------------------------- */

static bool is_float(cfx_dtype dtype)
{
    return dtype == CFX_FLOAT16 || dtype == CFX_BFLOAT16 || dtype == CFX_FLOAT32 ||
           dtype == CFX_FLOAT64;
}

bool cx_nccl_reducible(cfx_dtype dtype, cfx_reduce_op op)
{
    if ((unsigned)dtype >= CFX_DTYPE_COUNT || dtype == CFX_UINT16 || dtype == CFX_INT16 ||
        (unsigned)op > CFX_OP_PRODUCT) /* ops past product are not one NCCL reduction */
        return false;
#ifndef CX_NCCL_BF16
    if (dtype == CFX_BFLOAT16)
        return false;
#endif
    /* NCCL's float min/max return the other operand for a NaN; reduce.c returns NaN. */
    return !(is_float(dtype) && (op == CFX_OP_MIN || op == CFX_OP_MAX));
}

static cfx_status map(cfx_dtype dtype, cfx_reduce_op op, ncclDataType_t *nd, ncclRedOp_t *no)
{
    if ((unsigned)dtype >= CFX_DTYPE_COUNT || (unsigned)op >= CFX_OP_COUNT)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "NCCL: dtype %d or op %d out of range", (int)dtype,
                       (int)op);
    switch (dtype) {
    case CFX_UINT8: *nd = ncclUint8; break;
    case CFX_INT8: *nd = ncclInt8; break;
    case CFX_INT32: *nd = ncclInt32; break;
    case CFX_INT64: *nd = ncclInt64; break;
    case CFX_FLOAT16: *nd = ncclFloat16; break;
    case CFX_BFLOAT16:
#ifdef CX_NCCL_BF16
        *nd = CX_NCCL_BF16;
        break;
#else
        return cx_fail(CFX_ERR_UNSUPPORTED, "NCCL %d has no bfloat16 (2.10 or later has)",
                       NCCL_VERSION_CODE);
#endif
    case CFX_FLOAT32: *nd = ncclFloat32; break;
    case CFX_FLOAT64: *nd = ncclFloat64; break;
    case CFX_BOOL: *nd = ncclUint8; break;
    case CFX_UINT16:
    case CFX_INT16:
        return cx_fail(CFX_ERR_UNSUPPORTED, "NCCL has no %s reduction (use the host-staged path)",
                       cfx_dtype_name(dtype));
    }
    switch (op) {
    case CFX_OP_SUM:
    case CFX_OP_AVERAGE: *no = dtype == CFX_BOOL ? ncclMax : ncclSum; break; /* bool or = max */
    case CFX_OP_MIN: *no = ncclMin; break;
    case CFX_OP_MAX: *no = ncclMax; break;
    case CFX_OP_PRODUCT: *no = dtype == CFX_BOOL ? ncclMin : ncclProd; break; /* bool and = min */
    default: /* an op that is not one NCCL reduction: the host-staged path */
        return cx_fail(CFX_ERR_UNSUPPORTED, "NCCL has no %s reduction (use the host-staged path)",
                       cfx_op_name(op));
    }
    return CFX_OK;
}

cfx_status cx_nccl_map(cfx_dtype dtype, cfx_reduce_op op, int *nccl_dtype, int *nccl_op)
{
    ncclDataType_t nd = ncclUint8;
    ncclRedOp_t no = ncclSum;
    cfx_status st = map(dtype, op, &nd, &no);
    if (!st) {
        *nccl_dtype = (int)nd;
        *nccl_op = (int)no;
    }
    return st;
}

/* ---- communicator ----------------------------------------------------------------------------- */

int cx_nccl_version(void)
{
    int v = 0;
    return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

cfx_status cx_nccl_get_unique_id(unsigned char out[CX_NCCL_ID_BYTES])
{
    ncclUniqueId id;
    NCCL_TRY(NULL, ncclGetUniqueId(&id));
    memcpy(out, id.internal, CX_NCCL_ID_BYTES);
    return CFX_OK;
}

/* Waits, against the deadline, for a non-blocking communicator's initialisation. */
static cfx_status await_init(cx_nccl *c, ncclResult_t r)
{
    r = settle(c->comm, r, c->timeout_s);
    if (r == ncclSuccess)
        return CFX_OK;
    cfx_status st = r == ncclInProgress
                        ? cx_fail(CFX_ERR_TIMEOUT, "NCCL communicator set-up on rank %d of %d did "
                                  "not finish within %.1f s (a peer may have failed its set-up)",
                                  c->rank, c->size, c->timeout_s)
                        : nccl_fail(NULL, r, "ncclCommInitRankConfig");
    if (c->comm)
        (void)ncclCommAbort(c->comm); /* also stops its bootstrap threads */
    c->comm = NULL;
    return st;
}

cfx_status cx_nccl_comm_create(int rank, int size, const unsigned char id[CX_NCCL_ID_BYTES],
                               int device, void *stream, double timeout_s, cx_nccl **out)
{
    *out = NULL;
    if (size < 1 || rank < 0 || rank >= size || device < 0 || !id || !(timeout_s > 0))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cx_nccl_comm_create: rank %d of %d on device %d, "
                       "timeout %g s", rank, size, device, timeout_s);
    cx_nccl *c = calloc(1, sizeof *c);
    if (!c)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for an NCCL communicator");
    c->rank = rank;
    c->size = size;
    c->device = device;
    c->stream = (cudaStream_t)stream;
    c->timeout_s = timeout_s;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        free(c);
        return cuda_fail(e, "NCCL communicator set-up: cudaSetDevice");
    }
    ncclUniqueId uid;
    memcpy(uid.internal, id, CX_NCCL_ID_BYTES);
#if CX_NCCL_NONBLOCKING
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0; /* returns at once; polled against the deadline, aborted when it passes */
    cfx_status st = await_init(c, ncclCommInitRankConfig(&c->comm, size, uid, rank, &config));
#else
    ncclResult_t r = ncclCommInitRank(&c->comm, size, uid, rank); /* blocks: no deadline */
    cfx_status st = r == ncclSuccess ? CFX_OK : nccl_fail(NULL, r, "ncclCommInitRank");
    if (st)
        c->comm = NULL;
#endif
    if (st) {
        free(c);
        return st;
    }
    *out = c;
    return CFX_OK;
}

void cx_nccl_abort(cx_nccl *c)
{
    if (!c)
        return;
    c->failed = true;
    if (c->comm) {
        (void)cudaSetDevice(c->device);
        (void)ncclCommAbort(c->comm); /* stops its kernels: work queued behind them can run */
        c->comm = NULL;
    }
}

void cx_nccl_comm_destroy(cx_nccl *c)
{
    if (!c)
        return;
    (void)cudaSetDevice(c->device);
    if (c->comm && !c->failed) {
        /* Every rank destroys at the same point of the agreed order; bounded, so that a peer that
         * vanished turns this into an abort rather than a hang. */
#if CX_NCCL_NONBLOCKING
        if (settle(c->comm, ncclCommFinalize(c->comm), c->timeout_s) == ncclSuccess &&
            ncclCommDestroy(c->comm) == ncclSuccess)
            c->comm = NULL;
#else
        if (cx_nccl_wait(c, c->timeout_s) == CFX_OK && ncclCommDestroy(c->comm) == ncclSuccess)
            c->comm = NULL;
#endif
    }
    cx_nccl_abort(c); /* a failed one, or one that did not finish */
    free(c);
}

void *cx_nccl_stream(const cx_nccl *c) { return c ? (void *)c->stream : NULL; }
int cx_nccl_device(const cx_nccl *c) { return c ? c->device : -1; }
int cx_nccl_rank(const cx_nccl *c) { return c ? c->rank : -1; }
int cx_nccl_size(const cx_nccl *c) { return c ? c->size : -1; }
bool cx_nccl_failed(const cx_nccl *c) { return !c || c->failed || !c->comm; }

/* ---- collectives ------------------------------------------------------------------------------ */

cfx_status cx_nccl_allreduce(cx_nccl *c, const void *send, void *recv, size_t count,
                             cfx_dtype dtype, cfx_reduce_op op)
{
    cfx_status st = ready(c, "ncclAllReduce");
    ncclDataType_t nd;
    ncclRedOp_t no;
    if (!st)
        st = map(dtype, op, &nd, &no);
    if (st || count == 0)
        return st;
    NCCL_TRY(c, ncclAllReduce(send, recv, count, nd, no, c->comm, c->stream));
    return CFX_OK;
}

cfx_status cx_nccl_allgatherv(cx_nccl *c, const void *send, size_t send_bytes, void *recv,
                              const size_t *recv_bytes, const size_t *displs)
{
    cfx_status st = ready(c, "NCCL allgather");
    if (st)
        return st;
    bool equal = true;
    for (int r = 0; r < c->size; r++)
        equal = equal && recv_bytes[r] == send_bytes && displs[r] == (size_t)r * send_bytes;
    if (equal) {
        if (send_bytes)
            NCCL_TRY(c, ncclAllGather(send, recv, send_bytes, ncclUint8, c->comm, c->stream));
        return CFX_OK;
    }
    NCCL_TRY(c, ncclGroupStart());
    for (int r = 0; !st && r < c->size; r++) {
        if (!recv_bytes[r])
            continue;
        ncclResult_t res = ncclBroadcast(r == c->rank ? send : NULL, (char *)recv + displs[r],
                                         recv_bytes[r], ncclUint8, r, c->comm, c->stream);
        if (res != ncclSuccess)
            st = nccl_fail(c, res, "ncclBroadcast (allgatherv)");
    }
    return group_end(c, st, "ncclGroupEnd (allgatherv)");
}

cfx_status cx_nccl_broadcast(cx_nccl *c, void *buf, size_t bytes, int root)
{
    cfx_status st = ready(c, "ncclBroadcast");
    if (st || bytes == 0)
        return st;
    if (root < 0 || root >= c->size)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "ncclBroadcast: root %d of %d ranks", root, c->size);
    NCCL_TRY(c, ncclBroadcast(buf, buf, bytes, ncclUint8, root, c->comm, c->stream));
    return CFX_OK;
}

cfx_status cx_nccl_alltoallv(cx_nccl *c, const void *send, const size_t *send_bytes,
                             const size_t *sdispls, void *recv, const size_t *recv_bytes,
                             const size_t *rdispls)
{
    cfx_status st = ready(c, "NCCL alltoall");
    if (st)
        return st;
    NCCL_TRY(c, ncclGroupStart());
    for (int j = 0; !st && j < c->size; j++) {
        ncclResult_t res = ncclSuccess;
        if (send_bytes[j])
            res = ncclSend((const char *)send + sdispls[j], send_bytes[j], ncclUint8, j, c->comm,
                           c->stream);
        if (res == ncclSuccess && recv_bytes[j])
            res = ncclRecv((char *)recv + rdispls[j], recv_bytes[j], ncclUint8, j, c->comm,
                           c->stream);
        if (res != ncclSuccess)
            st = nccl_fail(c, res, "ncclSend/ncclRecv (alltoall)");
    }
    return group_end(c, st, "ncclGroupEnd (alltoall)");
}

cfx_status cx_nccl_reduce_scatter(cx_nccl *c, const void *send, void *recv, const size_t *counts,
                                  cfx_dtype dtype, cfx_reduce_op op)
{
    cfx_status st = ready(c, "NCCL reducescatter");
    ncclDataType_t nd;
    ncclRedOp_t no;
    if (!st)
        st = map(dtype, op, &nd, &no);
    if (st)
        return st;
    size_t esize = cfx_dtype_size(dtype);
    bool equal = true;
    for (int r = 1; r < c->size; r++)
        equal = equal && counts[r] == counts[0];
    if (equal) {
        if (counts[0])
            NCCL_TRY(c, ncclReduceScatter(send, recv, counts[0], nd, no, c->comm, c->stream));
        return CFX_OK;
    }
    /* Uneven blocks (NCCL has no reduce-scatter-v): one reduce per block, rooted at its owner. */
    NCCL_TRY(c, ncclGroupStart());
    size_t off = 0;
    for (int r = 0; !st && r < c->size; r++) {
        if (counts[r]) {
            ncclResult_t res = ncclReduce((const char *)send + off * esize, recv, counts[r], nd, no,
                                          r, c->comm, c->stream);
            if (res != ncclSuccess)
                st = nccl_fail(c, res, "ncclReduce (reducescatter)");
        }
        off += counts[r];
    }
    return group_end(c, st, "ncclGroupEnd (reducescatter)");
}

/* ---- completion ------------------------------------------------------------------------------- */

cfx_status cx_nccl_check(cx_nccl *c)
{
    if (!c)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cx_nccl_check: no communicator");
    if (!c->comm)
        return cx_fail(CFX_ERR_NCCL, "the NCCL communicator was aborted");
    ncclResult_t async = ncclSuccess;
    NCCL_TRY(c, ncclCommGetAsyncError(c->comm, &async));
    if (async != ncclSuccess && async != ncclInProgress)
        return nccl_fail(c, async, "NCCL asynchronous error");
    return CFX_OK;
}

cfx_status cx_nccl_wait(cx_nccl *c, double timeout_s)
{
    if (!c)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cx_nccl_wait: NULL communicator");
    double deadline = timeout_s < 0 ? -1.0 : cx_now_s() + timeout_s;
    for (unsigned spins = 0;;) {
        cudaError_t e = cudaStreamQuery(c->stream);
        if (e == cudaSuccess)
            return CFX_OK;
        if (e != cudaErrorNotReady) {
            c->failed = true;
            return cuda_fail(e, "cudaStreamQuery (NCCL stream)");
        }
        (void)cudaGetLastError();
        cfx_status st = cx_nccl_check(c);
        if (st)
            return st;
        if (deadline >= 0 && cx_now_s() > deadline) {
            c->failed = true;
            return cx_fail(CFX_ERR_TIMEOUT, "NCCL work on rank %d did not complete within %.1f s "
                           "(a peer may be gone); the communicator will be aborted", c->rank,
                           timeout_s);
        }
        backoff(&spins);
    }
}

/*
 * transport - the one internal interface between the engine and a communication backend.
 *
 * A transport owns a communicator (MPI: a duplicate of MPI_COMM_WORLD; local: a group of threads in
 * one process) and offers two planes:
 * - the control plane the background thread negotiates over (gather of request bytes at rank 0,
 *   broadcast of the response bytes, an AND-allreduce of a bit vector);
 * - the data plane the collective engine moves tensor bytes over (host memory only).
 * Every call is made by the context's background thread alone, in the same order on every rank, so
 * implementations need no locking. Calls block until done but must not burn a core while they wait
 * (nonblocking operation, short spin, then sleeping backoff). On failure a call returns a status and
 * sets cfx_last_error() on the calling thread; the engine then fails the affected handles.
 *
 * Implementations: transport_mpi.c (Open MPI), transport_local.c (thread ranks, and size 1).
 */
#ifndef CFX_TRANSPORT_H
#define CFX_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "conflux/conflux.h"

typedef struct cx_transport cx_transport;

/* The ranks a point-to-point call names: the job's (rank), this host's (local_rank), or those with
 * this rank's local rank, one per host (cross_rank). */
typedef enum cx_group { CX_GROUP_WORLD = 0, CX_GROUP_LOCAL = 1, CX_GROUP_CROSS = 2 } cx_group;

typedef struct cx_transport_ops {
    const char *name; /* "mpi", "local" */

    /* -- control plane -- */
    /* Gathers `len` bytes from every rank at rank 0. At rank 0, *recv_out is a malloc'ed
     * concatenation in rank order (the caller frees it) and lens_out[r] the bytes of rank r
     * (lens_out has size entries). Other ranks get *recv_out = NULL. */
    cfx_status (*gather_bytes)(cx_transport *t, const void *send, size_t len, void **recv_out,
                               size_t *lens_out);
    /* Broadcasts a byte string from `root`. At root *buf/len are the input; elsewhere *buf is set
     * to a malloc'ed copy (the caller frees it) and *len to its size. */
    cfx_status (*bcast_bytes)(cx_transport *t, void **buf, size_t *len, int root);
    /* words[i] = AND over ranks of words[i], in place. */
    cfx_status (*allreduce_and)(cx_transport *t, uint64_t *words, size_t count);

    /* -- data plane (host memory) -- */
    /* In place: buf = op over ranks (AVERAGE is treated as SUM; the engine scales). */
    cfx_status (*allreduce)(cx_transport *t, void *buf, size_t count, cfx_dtype dtype,
                            cfx_reduce_op op);
    /* Each rank sends send_bytes; rank r's bytes land at recv + displs[r] (recv_bytes[r] long). */
    cfx_status (*allgatherv)(cx_transport *t, const void *send, size_t send_bytes, void *recv,
                             const size_t *recv_bytes, const size_t *displs);
    cfx_status (*broadcast)(cx_transport *t, void *buf, size_t bytes, int root);
    /* Rank r sends send_bytes[j] from send + sdispls[j] to rank j, receives recv_bytes[j] from
     * rank j at recv + rdispls[j]. */
    cfx_status (*alltoallv)(cx_transport *t, const void *send, const size_t *send_bytes,
                            const size_t *sdispls, void *recv, const size_t *recv_bytes,
                            const size_t *rdispls);
    /* Reduces `send` (sum of counts[] elements) across ranks; rank r receives elements
     * [sum(counts[0..r)), +counts[r]) in recv. */
    cfx_status (*reduce_scatter)(cx_transport *t, const void *send, void *recv,
                                 const size_t *counts, cfx_dtype dtype, cfx_reduce_op op);
    cfx_status (*barrier)(cx_transport *t);
    /* In place over the ranks that share this rank's local rank, one per host (NULL when the
     * transport has a single host). */
    cfx_status (*cross_allreduce)(cx_transport *t, void *buf, size_t count, cfx_dtype dtype,
                                  cfx_reduce_op op);

    /* A transport over the ranks listed (ascending, valid, the same on every rank: the caller
     * checked), numbered in that order; non-members get NULL. Collective over t's ranks, in the
     * same order of splits everywhere. Made on a user thread while the background thread uses t,
     * so it must not use t's own channel. NULL in transports that cannot split. */
    cfx_status (*split)(cx_transport *t, const int *ranks, size_t n, cx_transport **out);

    /* -- point to point (host memory) -- */
    /* Sends send_bytes from `send` to rank `to` of `group` and receives recv_bytes into `recv`
     * from rank `from`, both under way at once, so two ranks may exchange with each other
     * (to < 0: nothing is sent; from < 0: nothing received). The peer's matching call names the
     * same byte count; messages between two ranks arrive in the order they were sent. */
    cfx_status (*sendrecv)(cx_transport *t, cx_group group, const void *send, size_t send_bytes,
                           int to, void *recv, size_t recv_bytes, int from);

    /* Frees the transport (collective: every rank calls it, in the same place of the order). */
    void (*destroy)(cx_transport *t);
} cx_transport_ops;

struct cx_transport {
    const cx_transport_ops *ops;
    int rank, size;
    int local_rank, local_size; /* ranks sharing this host */
    int cross_rank, cross_size; /* ranks with this local rank, one per host */
};

#endif /* CFX_TRANSPORT_H */

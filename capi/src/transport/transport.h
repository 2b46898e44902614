/*
 * transport - the one internal interface between the engine and a communication backend.
 *
 * A transport owns a communicator (MPI: a duplicate of MPI_COMM_WORLD; Gloo: a context over TCP;
 * local: a group of threads in one process) and offers two planes:
 * - the control plane the background thread negotiates over (gather of request bytes at rank 0,
 *   broadcast of the response bytes, an AND-allreduce of a bit vector);
 * - the data plane the collective engine moves tensor bytes over (host memory only).
 * Every call is made by the context's background thread alone, in the same order on every rank, so
 * implementations need no locking. Calls block until done but must not burn a core while they wait
 * (nonblocking operation, short spin, then sleeping backoff). On failure a call returns a status and
 * sets cfx_last_error() on the calling thread; the engine then fails the affected handles.
 *
 * What a transport can do beyond the calls every transport has is said by its capabilities
 * (cx_transport_caps), never by its name: the engine reads them to choose its paths, and checks at
 * context creation that they match the calls the table fills (cx_transport_check). The host
 * shared-memory path is not a transport's business: exec/shm_layer.h wraps any transport whose
 * capabilities ask for it.
 *
 * Implementations: transport_mpi.c (Open MPI), transport_gloo.cpp (Gloo over TCP, with
 * gloo_lost.cpp, gloo_state.h and gloo_exchange.h), transport_local.c (thread ranks, and size 1),
 * each one line of the registry (registry.c: kind, name, feature bit, create function, how its
 * ranks meet, capabilities), which everything that chooses or names a transport reads.
 * docs/architecture.md "Writing a transport" is the guide for the next one: its file and its
 * registry line are the two places it touches.
 *
 * The deadline rule. Every wait for a peer, in every call below and in creation, ends at a
 * deadline: the creation's meeting at cx_transport_params.rendezvous_s, every later wait at
 * cx_transport_params.timeout_s (CFX_TRANSPORT_TIMEOUT_S, read once per init by base/config.c and
 * handed to the create function). A wait that passes it fails with CFX_ERR_PEER_LOST naming the
 * rank waited for (or CFX_ERR_TIMEOUT when no single rank is to blame); no call waits forever for
 * a peer that died or went silent. A transport whose calls cannot be cancelled (MPI) gives the
 * call up at the deadline and says so in caps.aborts_in_flight = false.
 */
#ifndef CFX_TRANSPORT_H
#define CFX_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conflux/conflux.h"
#include "rendezvous/store.h"

typedef struct cx_transport cx_transport;

/* The ranks a point-to-point call names: the job's (rank), this host's (local_rank), or those with
 * this rank's local rank, one per host (cross_rank). */
typedef enum cx_group { CX_GROUP_WORLD = 0, CX_GROUP_LOCAL = 1, CX_GROUP_CROSS = 2 } cx_group;

/* The optional calls of cx_transport_ops, as bits of cx_transport_caps.optional: a transport sets
 * the bit exactly when it fills the call. */
enum {
    CX_TRANSPORT_CROSS_ALLREDUCE = 1u << 0, /* cross_allreduce: the two-level (hierarchical) paths */
    CX_TRANSPORT_SPLIT = 1u << 1,           /* split: subset contexts */
    CX_TRANSPORT_SENDRECV = 1u << 2,        /* sendrecv: Adasum */
    CX_TRANSPORT_MARK_LOST = 1u << 3,       /* mark_lost: a transport that waits for peers at exit */
    CX_TRANSPORT_CROSS_PIPELINE = 1u << 4,  /* cross_allreduce_post, _wait: pipelined chunks */
};

/* How many cross_allreduce_post calls may be under way at once (posted, not yet waited for). */
#define CX_CROSS_IN_FLIGHT 2

typedef struct cx_transport_caps {
    /* Between ranks of one host, the engine's shared-memory path (exec/shm_layer.h: one segment
     * per host, reduction split across the local ranks, the per-cycle agreement through the
     * segment) is faster than this transport's own calls, so CFX_SHM=auto turns it on, and across
     * hosts the two-level path uses it within each host. False for a transport that is itself
     * in-process memory (local). */
    bool prefers_host_shm;
    /* A call in flight returns with an error when a peer is lost or a deadline passes (so a stall
     * timeout can end it). False: a call waits for its peers as long as they live; the stall
     * inspector can then only report. */
    bool aborts_in_flight;
    /* CX_TRANSPORT_* bits: the optional calls this transport fills. */
    uint32_t optional;
    /* The chunk of the two-level path across hosts that pays this transport's per-call cost
     * (each local rank's block of a chunk crosses hosts in one call) when CFX_CHUNK_BYTES and
     * CFX_HIERARCHICAL_CHUNK_BYTES leave it open; 0: the engine's chunk (CFX_CHUNK_BYTES). */
    size_t cross_chunk_bytes;
} cx_transport_caps;

typedef struct cx_transport_ops {
    const char *name; /* "mpi", "local": for messages only, never compared */
    cx_transport_caps caps;

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
    /* In place over the ranks that share this rank's local rank, one per host (optional:
     * CX_TRANSPORT_CROSS_ALLREDUCE). */
    cfx_status (*cross_allreduce)(cx_transport *t, void *buf, size_t count, cfx_dtype dtype,
                                  cfx_reduce_op op);
    /* cross_allreduce in two halves, so that the engine reduces the next chunk within the host
     * while this one crosses (optional: CX_TRANSPORT_CROSS_PIPELINE). _post starts it (it may
     * also finish it); up to CX_CROSS_IN_FLIGHT may be under way, and `buf` must stay untouched
     * until _wait, which finishes the oldest one under way and leaves its result in its buf.
     * Posts, waits and plain cross_allreduce calls come in the same order on every rank of the
     * cross group. After a failed call the caller waits for nothing more. */
    cfx_status (*cross_allreduce_post)(cx_transport *t, void *buf, size_t count, cfx_dtype dtype,
                                       cfx_reduce_op op);
    cfx_status (*cross_allreduce_wait)(cx_transport *t);

    /* A transport over the ranks listed (ascending, valid, the same on every rank: the caller
     * checked), numbered in that order; non-members get NULL. Collective over t's ranks, in the
     * same order of splits everywhere. Made on a user thread while the background thread uses t,
     * so it must not use t's own channel (optional: CX_TRANSPORT_SPLIT). */
    cfx_status (*split)(cx_transport *t, const int *ranks, size_t n, cx_transport **out);

    /* -- point to point (host memory) -- */
    /* Sends send_bytes from `send` to rank `to` of `group` and receives recv_bytes into `recv`
     * from rank `from`, both under way at once, so two ranks may exchange with each other
     * (to < 0: nothing is sent; from < 0: nothing received). The peer's matching call names the
     * same byte count; messages between two ranks arrive in the order they were sent (optional:
     * CX_TRANSPORT_SENDRECV). */
    cfx_status (*sendrecv)(cx_transport *t, cx_group group, const void *send, size_t send_bytes,
                           int to, void *recv, size_t recv_bytes, int from);

    /* -- failure -- */
    /* A layer above found a peer lost (the host segment's deadline: exec/shm.h), so nothing may
     * wait for a peer any more, the destroy below included; later calls may fail at once
     * (optional: CX_TRANSPORT_MARK_LOST, for a transport whose destroy or exit meets its peers). */
    void (*mark_lost)(cx_transport *t);

    /* Frees the transport (collective: every rank calls it, in the same place of the order). */
    void (*destroy)(cx_transport *t);
} cx_transport_ops;

struct cx_transport {
    const cx_transport_ops *ops;
    int rank, size;
    int local_rank, local_size; /* ranks sharing this host */
    int cross_rank, cross_size; /* ranks with this local rank, one per host */
};

/* What a transport's create function is given (registry.h: one per transport). Every CFX_*
 * setting the transport needs comes in here, read once per init; a transport never calls getenv
 * nor a base/ reader of the environment. */
typedef struct cx_transport_params {
    /* This process's rank and the world's size: from the launcher, the caller (cfx_init_group)
     * or the membership round (elastic). -1 for a transport that finds them itself from the
     * launcher's world (CX_MEETS_LAUNCH: MPI). */
    int rank, size;
    /* Where the ranks meet (CX_MEETS_STORE), a key space this world alone uses; NULL for the
     * other ways of meeting. Taken over, also on failure: the transport destroys it when every
     * rank is done with it (or at once, when it fails). */
    cx_store *store;
    /* Rank 0 serves the TCP store: once it is gone, the store is gone too. */
    int store_on_rank0;
    /* The deadline rule (above): every wait for a peer after creation, and the meeting. */
    double timeout_s;
    double rendezvous_s;
    /* > 0 (CFX_TEST_LOCAL_SIZE, tests only): pretend hosts of that many consecutive ranks;
     * given only to a transport whose entry groups hosts (CX_ENTRY_HOST_GROUPS). */
    int pretend_local_size;
} cx_transport_params;

/* The create function's contract. Collective over the ranks of the new world: every rank calls it
 * with the same size and its own rank. On success *out is a transport whose table passes
 * cx_transport_check, with rank and size as given (or as the launcher's world says), and
 * local_* / cross_* from cx_host_groups (transport/hosts.h) or, for ranks that share one
 * process, one host. On failure *out is NULL, the status is returned with cx_fail's message
 * naming what failed (the peer, the store, the missing piece), params->store is destroyed, and
 * nothing is left running. Creation may block for peers, up to params->rendezvous_s. */
typedef cfx_status cx_transport_create_fn(const cx_transport_params *p, cx_transport **out);

/* Whether t fills the optional call `bit` (CX_TRANSPORT_*). */
static inline bool cx_transport_has(const cx_transport *t, uint32_t bit)
{
    return (t->ops->caps.optional & bit) != 0;
}

/* CFX_ERR_INTERNAL naming the transport and the call when its table lacks a required call or its
 * capabilities promise an optional call it does not fill (or fill one they do not promise). */
cfx_status cx_transport_check(const cx_transport *t);

/* Every rank's `mine`, in rank order, over the data plane: *all_out is malloc'ed (the caller
 * frees it), NULL on failure. Collective. */
cfx_status cx_transport_allgather_int32(cx_transport *t, int32_t mine, int32_t **all_out);

#endif /* CFX_TRANSPORT_H */

/*
 * context - the cfx_context: configuration, transport, tensor queue, handle table and the
 * background thread, and their lifetime (create -> shutdown -> free).
 *
 * Everything the engine knows hangs off a context; nothing is process-global except MPI itself.
 * cx_context_create takes any transport, so unit tests run whole jobs of thread ranks in one
 * process; cfx_init (api.c) picks the transport from the configuration.
 */
#ifndef CFX_CONTEXT_H
#define CFX_CONTEXT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "base/config.h"
#include "engine/loop.h"
#include "engine/gradset.h"
#include "engine/membership.h"
#include "protocol/handles.h"
#include "base/log.h"
#include "protocol/queue.h"
#include "transport/transport.h"

struct cfx_context {
    cx_config cfg;
    cx_logger log;
    cx_transport *transport;       /* or the shared-memory layer over it (exec/shm_layer.h) */
    const char *transport_name;    /* its registry name (static storage; kept across reforms) */
    cx_queue queue;
    cx_handles handles;
    cx_gradsets gradsets;          /* committed gradient sets (gradset.h) */
    cx_loop *loop;
    pthread_t thread;
    bool thread_started;
    atomic_int running;            /* 1 while the background thread accepts work */
    atomic_int shutdown_requested; /* cfx_shutdown was called on this rank */
    atomic_ulong noname_counter[8]; /* per collective kind, for generated names */
    /* 1 + the CUDA ordinal this rank's device tensors use (0: none submitted yet). The first
     * device tensor binds it (api.c); one device per rank, as NCCL's communicator has. */
    atomic_int cuda_device_bound;
    int rank, size, local_rank, local_size, cross_rank, cross_size;
    /* Observability (timeline.h). `timeline` belongs to the background thread while it runs (NULL
     * = off: the hooks check only that); cfx_timeline_start/stop hand a new one over in tl_next,
     * which the thread adopts at the top of its next cycle (tl_change set). */
    struct cx_timeline *timeline;
    pthread_mutex_t tl_mu;
    pthread_cond_t tl_cv;
    struct cx_timeline *tl_next;
    atomic_int tl_change;
    uint64_t tl_requested, tl_applied;
    struct cfx_context *live_next; /* the process's live contexts, for the exit handler */
    /* Subset contexts (cfx_context_create_subset): the context this one was split from and the
     * ones split from it, guarded by one process-wide lock (context.c). A parent's shutdown
     * shuts its subsets down; freeing either side unlinks it. */
    struct cfx_context *parent, *children, *next_sibling;
    /* Elastic worlds (cfx_elastic_init): the membership rounds this context's world comes from;
     * NULL for a fixed world. transport is NULL between a failed reform and the next. */
    cx_membership *membership;
};

/* Creates a context over `transport` (ownership moves to the context, also on failure) and starts
 * its background thread. Collective over the transport's ranks. */
cfx_status cx_context_create(cx_transport *transport, const cx_config *cfg, cfx_context **out);

/* Stops the background thread (collectively, see loop.h); idempotent. */
cfx_status cx_context_shutdown(cfx_context *ctx);

/* Starts (path != NULL) or stops the timeline at run time; waits until the background thread
 * adopted the change. The rank is inserted into `path` (cx_timeline_rank_path). */
cfx_status cx_context_set_timeline(cfx_context *ctx, const char *path, bool mark_cycles);

/* Runs the context's negotiation cycles on the calling thread until done(arg) or deadline_s
 * (CLOCK_MONOTONIC seconds), when that is safe: the background thread is running, no device tensor
 * was ever submitted (the device path belongs to the background thread) and CFX_WAIT_RUNS_CYCLES
 * is on. CX_DRIVE_BUSY when it did not (or stopped early): the caller then waits as usual. */
cx_drive_result cx_context_drive(cfx_context *ctx, bool (*done)(void *), void *arg, double deadline_s);

/* cx_context_drive for timeout_s seconds (< 0: no limit); returns the timeout left for the usual
 * wait that follows (0 when it ran out here). */
double cx_context_drive_for(cfx_context *ctx, bool (*done)(void *), void *arg, double timeout_s);

/* cfx_wait: the handle's work driven on this thread (cx_context_drive), then the usual wait. */
cfx_status cx_context_wait(cfx_context *ctx, cfx_handle handle, double timeout_s);

/* Shuts down if needed and frees everything. */
void cx_context_free(cfx_context *ctx);

/* A context over the ranks of `parent` listed in `ranks` (ascending, valid and agreed by the
 * caller); non-members get *out = NULL and CFX_OK. Collective over parent's ranks. Its own
 * negotiation, cache, background thread and data path among its ranks. */
cfx_status cx_context_create_subset(cfx_context *parent, const int *ranks, size_t n,
                                    cfx_context **out);

/* An elastic context: its first world from membership round(s) (m is taken over, also on
 * failure). */
cfx_status cx_context_create_elastic(cx_membership *m, const cx_config *cfg,
                                     const cfx_reform_options *o, cfx_context **out);

/* Forms ctx's world again in place (cfx_context_reform): pending work fails, the old world's
 * thread, loop, data path, gradient sets and transport are released, a membership round gives
 * the new transport, and the world starts over it. */
cfx_status cx_context_reform(cfx_context *ctx, const cfx_reform_options *o);

#endif /* CFX_CONTEXT_H */

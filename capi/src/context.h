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

#include "config.h"
#include "handles.h"
#include "log.h"
#include "queue.h"
#include "transport.h"

typedef struct cx_loop cx_loop;

struct cfx_context {
    cx_config cfg;
    cx_logger log;
    cx_transport *transport;
    cx_queue queue;
    cx_handles handles;
    cx_loop *loop;
    pthread_t thread;
    bool thread_started;
    atomic_int running;            /* 1 while the background thread accepts work */
    atomic_int shutdown_requested; /* cfx_shutdown was called on this rank */
    atomic_ulong noname_counter[8]; /* per collective kind, for generated names */
    int rank, size, local_rank, local_size, cross_rank, cross_size;
};

/* Creates a context over `transport` (ownership moves to the context, also on failure) and starts
 * its background thread. Collective over the transport's ranks. */
cfx_status cx_context_create(cx_transport *transport, const cx_config *cfg, cfx_context **out);

/* Stops the background thread (collectively, see loop.h); idempotent. */
cfx_status cx_context_shutdown(cfx_context *ctx);

/* Shuts down if needed and frees everything. */
void cx_context_free(cfx_context *ctx);

#endif /* CFX_CONTEXT_H */

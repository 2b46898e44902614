/*
 * loop_env - what the background loop (loop.c) and its cycles (cycle.c) use of their owner, the
 * context: one struct, filled by context.c, so neither reaches into the context's struct. Its own
 * header because loop.h and cycle.h both need it and neither may include the other.
 */
#ifndef CFX_LOOP_ENV_H
#define CFX_LOOP_ENV_H

#include <stdatomic.h>

#include "base/config.h"
#include "base/log.h"
#include "protocol/handles.h"
#include "protocol/queue.h"
#include "transport/transport.h"

struct cx_gradsets;
struct cx_timeline;

/* What the loop uses of its owner (the context): passed in, so the loop never reaches into the
 * context's struct. Every pointer stays valid until cx_loop_destroy. */
typedef struct cx_loop_env {
    cx_config *cfg;                /* the loop writes the tuned fields (autotune) */
    cx_logger *log;
    cx_transport *transport;
    cx_queue *queue;
    cx_handles *handles;
    struct cx_gradsets *gradsets;  /* the context's gradient sets (gradset.h) */
    atomic_int *running;           /* cleared when the loop stops accepting work */
    atomic_int *shutdown_requested;
    /* Nonzero once a device tensor was submitted: from then on only the background thread runs
     * cycles (cx_loop_drive returns CX_DRIVE_BUSY; see cx_loop_fence). */
    atomic_int *device_bound;
    /* Timeline hand-over: while *timeline_change is set, take_timeline(owner) returns the
     * timeline the loop uses from then on (NULL: off) and clears it. */
    atomic_int *timeline_change;
    struct cx_timeline *(*take_timeline)(void *owner);
    void *owner;
} cx_loop_env;

#endif /* CFX_LOOP_ENV_H */

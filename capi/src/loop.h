/*
 * loop - the background thread of a context: one negotiation cycle after another.
 *
 * A cycle: take the new requests; classify them against the response cache; one AND-allreduce of
 * a bit vector (status bits + cache hits + invalidated bits) tells every rank which cached tensors
 * are ready everywhere and whether anyone has uncached requests, asked to shut down or joined; if
 * so, the slow path gathers the uncached requests at the coordinator and broadcasts its response
 * list; every rank then executes the same ordered list (cached responses by ascending bit, then the
 * coordinator's). The thread sleeps on the queue's condition variable when it has nothing in flight
 * (woken at once by new work, or after the cycle time to take part in other ranks' cycles), backs
 * off when its tensors wait for other ranks, and never spins a core. A shutdown requested on any
 * rank ends the loop on every rank at the same cycle; pending tensors then fail with
 * CFX_ERR_SHUT_DOWN naming the rank(s) that asked.
 */
#ifndef CFX_LOOP_H
#define CFX_LOOP_H

#include "conflux/conflux.h"

typedef struct cx_loop cx_loop;

/* Creates the loop state for ctx (before the thread starts). */
cfx_status cx_loop_create(cfx_context *ctx, cx_loop **out);
void cx_loop_destroy(cx_loop *loop);

/* The collective engine the loop drives (for the context to attach data paths). */
struct cx_exec *cx_loop_exec(cx_loop *loop);

/* The thread's body; arg is the cfx_context. */
void *cx_loop_main(void *arg);

#endif /* CFX_LOOP_H */

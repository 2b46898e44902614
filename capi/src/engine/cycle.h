/*
 * cycle - one negotiation cycle of a context, and the state that lives from one cycle to the next
 * (response cache, pending cache hits, requests for the coordinator, the coordinator itself, the
 * collective engine, the autotuner).
 *
 * A cycle: take the new requests; classify them against the response cache; one AND-allreduce of
 * a bit vector (status bits + cache hits + invalidated bits + gradient-set bits) tells every rank
 * which cached tensors are ready everywhere and whether anyone has uncached requests, asked to
 * shut down or joined; if so, the slow path gathers the uncached requests at the coordinator and
 * broadcasts its response list; every rank then executes the same ordered list (cached responses
 * by ascending bit, then the coordinator's), then the gradient-set buckets every rank agreed on.
 *
 * Who runs a cycle and when is loop.c's: every call here is made under the loop's run_mu, by the
 * background thread or by a thread driving its own work, never by two at once.
 */
#ifndef CFX_CYCLE_H
#define CFX_CYCLE_H

#include <stdbool.h>

#include "conflux/conflux.h"
#include "engine/loop_env.h"

typedef struct cx_cycle cx_cycle;
struct cx_exec;

/* The cycle state for the context described by `env` (copied; its pointers must outlive it). */
cfx_status cx_cycle_create(const cx_loop_env *env, cx_cycle **out);
void cx_cycle_destroy(cx_cycle *c); /* accepts NULL */

/* The collective engine the cycles drive. */
struct cx_exec *cx_cycle_exec(cx_cycle *c);

/* One cycle. *progress: something new arrived or ran; *stop: the loop must end (a shutdown or an
 * elastic reform agreed by every rank; pending work has then failed). A failure is returned as a
 * status with the error message set; the caller then ends the loop with cx_cycle_fail_all. */
cfx_status cx_cycle_run(cx_cycle *c, bool *progress, bool *stop);

/* Ends every pending tensor and gradient set with `status` and `reason`, and stops the context
 * accepting work (*env.running = 0). */
void cx_cycle_fail_all(cx_cycle *c, cfx_status status, const char *reason);

#endif /* CFX_CYCLE_H */

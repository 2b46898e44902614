/*
 * loop - the background thread of a context, and who runs its negotiation cycles when.
 *
 * One cycle (cycle.h) takes the new requests, agrees with every rank through one AND-allreduce of
 * a bit vector which cached tensors are ready everywhere, runs the slow path through the
 * coordinator when needed, and executes the same ordered response list on every rank. This module
 * runs cycle after cycle: the thread sleeps on the queue's condition variable when it has nothing
 * in flight (woken at once by new work, or after the cycle time to take part in other ranks'
 * cycles), backs off when its tensors wait for other ranks, and never spins a core. A shutdown
 * requested on any rank ends the loop on every rank at the same cycle; pending tensors then fail
 * with CFX_ERR_SHUT_DOWN naming the rank(s) that asked.
 *
 * Cycles are collective but not bound to a thread: a thread that waits for its own work (cfx_wait,
 * cfx_gradset_wait) runs them itself while no other thread does (cx_loop_drive), so a lone
 * collective costs no hand-off to the background thread and back; the background thread stands
 * aside meanwhile and takes over what is left when the waiter returns. run_mu makes one cycle run
 * at a time, whoever runs it.
 */
#ifndef CFX_LOOP_H
#define CFX_LOOP_H

#include <stdatomic.h>
#include <stdbool.h>

#include "conflux/conflux.h"
#include "engine/loop_env.h"

typedef struct cx_loop cx_loop;

/* Creates the loop state (before the thread starts). */
cfx_status cx_loop_create(const cx_loop_env *env, cx_loop **out);
void cx_loop_destroy(cx_loop *loop);

/* The collective engine the loop drives (for the context to attach data paths). */
struct cx_exec *cx_loop_exec(cx_loop *loop);

typedef enum cx_drive_result {
    CX_DRIVE_DONE,    /* done(arg) became true */
    CX_DRIVE_TIMEOUT, /* deadline_s (CLOCK_MONOTONIC seconds) passed first */
    CX_DRIVE_BUSY     /* the background thread runs the cycles, or the loop has ended: wait as usual */
} cx_drive_result;

/* Runs cycles on the calling thread until done(arg) (polled between cycles), the deadline or
 * CX_DRIVE_BUSY (also once *env.device_bound is set: the device path belongs to the background
 * thread). */
cx_drive_result cx_loop_drive(cx_loop *loop, bool (*done)(void *), void *arg, double deadline_s);

/* Returns once no cycle is running: a thread that changes what cycles may meet (the first device
 * tensor) calls it after publishing the change and before enqueueing, so every later cycle sees it. */
void cx_loop_fence(cx_loop *loop);

/* The thread's body; arg is the cx_loop. */
void *cx_loop_main(void *arg);

#endif /* CFX_LOOP_H */

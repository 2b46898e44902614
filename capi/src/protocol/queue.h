/*
 * queue - the tensor table and request queue between the framework threads and the background
 * thread.
 *
 * Framework threads push entries (one per tensor; a grouped call pushes all of its tensors
 * atomically); the background thread pops the new ones each cycle and later takes each entry out
 * of the table by name when its response runs. A name stays in the table from push until its
 * collective completes, which is how a second in-flight tensor of the same name is refused.
 * Thread-safe (one mutex; the background thread sleeps on its condition variable when idle).
 */
#ifndef CFX_QUEUE_H
#define CFX_QUEUE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/strmap.h"
#include "protocol/wire.h"

typedef struct cx_entry {
    cx_request req;       /* the request this rank sends (owned strings) */
    void *input;          /* borrowed user buffer */
    void *output;         /* allreduce/broadcast: where the result goes (may equal input) */
    size_t bytes;         /* input bytes */
    void *stream;         /* device tensors: the producer's cudaStream_t (NULL: legacy default) */
    void *ready_event;    /* device tensors: recorded on `stream` at submission (owned), or NULL */
    int64_t *splits;      /* alltoall: size entries (owned), or NULL */
    cfx_handle handle;
    size_t part;          /* index of this tensor within its handle */
    double enqueue_time;  /* monotonic seconds */
    bool popped;          /* the background thread has taken it from the new list (queue lock) */
    struct cx_entry *next;
} cx_entry;

typedef struct cx_queue {
    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    cx_strmap table;       /* name -> cx_entry, every entry not yet completed */
    cx_entry *head, *tail; /* pushed, not yet popped by the background thread */
    /* Entries pushed or a wake-up (shutdown, timeline, a gradient-set bucket) since the background
     * thread last popped, readable without the lock; and whether that thread sleeps on work_cv: a
     * waker that sees it awake only sets has_work (no lock, no syscall). Both sides store their
     * flag, then load the other's (seq_cst), so no wake-up is lost. */
    atomic_int has_work;
    atomic_int sleeping;
    /* Lazy wake-ups (set at creation when waiting threads run cycles, loop.h): the first push that
     * finds the thread asleep does not wake it but owes the wake-up, because the pusher most often
     * waits for its work next and then runs it itself; the next push, cx_queue_pay_wake or the
     * thread's cycle-time timeout pays it. */
    bool lazy_wake;
    atomic_int wake_owed;
    /* Set while the thread sleeps longer than the cycle time (a long-idle context): then a push
     * wakes it at once, lazy or not, so no work waits for the long sleep. */
    atomic_int deep_idle;
    bool closed;           /* shut down: pushes are refused */
    char close_reason[512];
} cx_queue;

cfx_status cx_queue_init(cx_queue *q);
/* Frees every entry still in the table. */
void cx_queue_destroy(cx_queue *q);

/* Adds `n` entries atomically. CFX_ERR_DUPLICATE_NAME (nothing added) when a name is in flight or
 * repeated within the batch; CFX_ERR_SHUT_DOWN once closed. Ownership of the entries moves to the queue on success. */
cfx_status cx_queue_push(cx_queue *q, cx_entry **entries, size_t n);

/* Takes every entry pushed since the last pop, in push order (a linked list; they stay in the
 * table). */
cx_entry *cx_queue_pop_new(cx_queue *q);

/* Removes an entry from the table by name (NULL if absent). The caller owns and frees it. */
/* Removes the named entry from the table and returns it, if the background thread has popped it
 * (an entry still in the new list stays: a response for it can only be another rank's business,
 * such as a failure the coordinator sent before this rank's request went out). */
cx_entry *cx_queue_take(cx_queue *q, const char *name);

/* Sleeps until an entry is pushed, cx_queue_wake is called, or timeout_s passes. */
void cx_queue_wait(cx_queue *q, double timeout_s);
/* cx_queue_wake as a push wakes: lazily (the first wake-up while the thread sleeps is owed). */
void cx_queue_wake_lazy(cx_queue *q);

/* Wakes the background thread if a push owes it a wake-up (lazy_wake): a thread that will not run
 * the cycles itself after all, or that polls. */
void cx_queue_pay_wake(cx_queue *q);

/* A thread that runs the cycles itself takes over the owed wake-up: its next cycle pops what was
 * pushed (and it wakes the background thread for whatever it leaves behind). */
static inline void cx_queue_forgive_wake(cx_queue *q) { atomic_store(&q->wake_owed, 0); }

/* Sleeps until the next push or wake, or timeout_s, even while new work is queued (a thread that
 * leaves the queue to another one). */
void cx_queue_sleep(cx_queue *q, double timeout_s);
/* Lock-free: whether an entry or a wake-up is waiting for the background thread. */
bool cx_queue_has_new(cx_queue *q);
/* Any thread: wakes the background thread (lock-free when it is not asleep). */
void cx_queue_wake(cx_queue *q);

/* Refuses further pushes (CFX_ERR_SHUT_DOWN with `reason`) and returns every entry of the table
 * as a linked list, for the caller to fail. */
cx_entry *cx_queue_close(cx_queue *q, const char *reason);

/* Entries in the table (pushed and not yet completed). */
size_t cx_queue_in_flight(cx_queue *q);

void cx_entry_free(cx_entry *e);

#endif /* CFX_QUEUE_H */

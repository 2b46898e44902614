/* queue - the tensor table and request queue (see queue.h). */
#include "protocol/queue.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/dtype.h"
#include "base/error.h"
#include "cuda/cuda_kernels.h"

cfx_status cx_queue_init(cx_queue *q)
{
    memset(q, 0, sizeof *q);
    cx_strmap_init(&q->table);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&q->work_cv, &attr);
    pthread_condattr_destroy(&attr);
    if (rc || pthread_mutex_init(&q->mu, NULL))
        return cx_fail(CFX_ERR_INTERNAL, "cannot create the tensor queue's lock");
    return CFX_OK;
}

void cx_entry_free(cx_entry *e)
{
    if (!e)
        return;
    cx_request_free(&e->req);
    free(e->splits);
#if defined(CFX_HAVE_CUDA) && CFX_HAVE_CUDA
    cx_cuda_event_destroy(e->ready_event); /* safe while a stream still waits on it */
#endif
    free(e);
}

void cx_queue_destroy(cx_queue *q)
{
    cx_entry *e = cx_queue_close(q, "the context was freed");
    while (e) {
        cx_entry *next = e->next;
        cx_entry_free(e);
        e = next;
    }
    cx_strmap_destroy(&q->table);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->work_cv);
}

/* After has_work was set: whether the sleeping thread must be woken now, or owes it (lazy). */
static bool must_wake(cx_queue *q)
{
    bool wake = atomic_load(&q->sleeping) &&
                (!q->lazy_wake || atomic_load(&q->deep_idle) || atomic_exchange(&q->wake_owed, 1));
    if (wake)
        atomic_store(&q->wake_owed, 0);
    return wake;
}

cfx_status cx_queue_push(cx_queue *q, cx_entry **entries, size_t n)
{
    pthread_mutex_lock(&q->mu);
    if (q->closed) {
        pthread_mutex_unlock(&q->mu);
        return cx_fail(CFX_ERR_SHUT_DOWN, "tensor '%s': %s", n ? entries[0]->req.name : "",
                       q->close_reason);
    }
    for (size_t i = 0; i < n; i++) {
        const char *name = entries[i]->req.name;
        bool dup = cx_strmap_get(&q->table, name) != NULL;
        for (size_t j = 0; j < i && !dup; j++)
            dup = strcmp(entries[j]->req.name, name) == 0;
        if (dup) {
            pthread_mutex_unlock(&q->mu);
            return cx_fail(CFX_ERR_DUPLICATE_NAME, "tensor '%s': a %s of the same name is already "
                           "in flight on this rank; wait for it to complete or use another name",
                           name, cx_coll_name(entries[i]->req.coll));
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!cx_strmap_put(&q->table, entries[i]->req.name, entries[i])) {
            for (size_t j = 0; j < i; j++)
                cx_strmap_remove(&q->table, entries[j]->req.name);
            pthread_mutex_unlock(&q->mu);
            return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory adding tensor '%s' to the table",
                           entries[i]->req.name);
        }
    }
    for (size_t i = 0; i < n; i++) {
        entries[i]->next = NULL;
        if (q->tail)
            q->tail->next = entries[i];
        else
            q->head = entries[i];
        q->tail = entries[i];
    }
    atomic_store(&q->has_work, 1);
    bool wake = must_wake(q);
    pthread_mutex_unlock(&q->mu);
    if (wake) /* after the unlock: the woken thread takes the lock at once */
        pthread_cond_signal(&q->work_cv);
    return CFX_OK;
}

cx_entry *cx_queue_pop_new(cx_queue *q)
{
    pthread_mutex_lock(&q->mu);
    cx_entry *head = q->head;
    for (cx_entry *e = head; e; e = e->next)
        e->popped = true;
    q->head = q->tail = NULL;
    atomic_store(&q->has_work, 0);
    pthread_mutex_unlock(&q->mu);
    return head;
}

cx_entry *cx_queue_take(cx_queue *q, const char *name)
{
    pthread_mutex_lock(&q->mu);
    cx_entry *e = cx_strmap_get(&q->table, name);
    if (e && e->popped)
        cx_strmap_remove(&q->table, name);
    else
        e = NULL;
    pthread_mutex_unlock(&q->mu);
    return e;
}

static void wait_work_cv(cx_queue *q, double timeout_s, bool even_with_work)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long ns = (long long)ts.tv_nsec + (long long)(timeout_s * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000ll);
    ts.tv_nsec = (long)(ns % 1000000000ll);
    pthread_mutex_lock(&q->mu);
    atomic_store(&q->sleeping, 1);
    if (even_with_work || !atomic_load(&q->has_work))
        pthread_cond_timedwait(&q->work_cv, &q->mu, &ts);
    atomic_store(&q->sleeping, 0);
    atomic_store(&q->wake_owed, 0); /* awake: it sees what was pushed */
    pthread_mutex_unlock(&q->mu);
}

void cx_queue_wait(cx_queue *q, double timeout_s) { wait_work_cv(q, timeout_s, false); }

void cx_queue_sleep(cx_queue *q, double timeout_s) { wait_work_cv(q, timeout_s, true); }

bool cx_queue_has_new(cx_queue *q) { return atomic_load(&q->has_work) != 0; }

void cx_queue_wake(cx_queue *q)
{
    atomic_store(&q->has_work, 1);
    if (!atomic_load(&q->sleeping))
        return; /* awake: it sees has_work before it could sleep (cx_queue_wait) */
    pthread_mutex_lock(&q->mu);
    pthread_cond_signal(&q->work_cv);
    pthread_mutex_unlock(&q->mu);
}

void cx_queue_wake_lazy(cx_queue *q)
{
    atomic_store(&q->has_work, 1);
    if (!atomic_load(&q->sleeping))
        return;
    pthread_mutex_lock(&q->mu);
    bool wake = must_wake(q);
    pthread_mutex_unlock(&q->mu);
    if (wake)
        pthread_cond_signal(&q->work_cv);
}

void cx_queue_pay_wake(cx_queue *q)
{
    if (!atomic_load(&q->wake_owed))
        return;
    pthread_mutex_lock(&q->mu);
    bool owed = atomic_exchange(&q->wake_owed, 0);
    pthread_mutex_unlock(&q->mu);
    if (owed)
        pthread_cond_signal(&q->work_cv);
}

cx_entry *cx_queue_close(cx_queue *q, const char *reason)
{
    pthread_mutex_lock(&q->mu);
    if (!q->closed)
        snprintf(q->close_reason, sizeof q->close_reason, "%s", reason);
    q->closed = true;
    cx_entry *list = NULL;
    const char *key;
    void *value;
    for (size_t pos = 0; cx_strmap_next(&q->table, &pos, &key, &value);) {
        cx_entry *e = value;
        e->next = list;
        list = e;
    }
    cx_strmap_destroy(&q->table);
    cx_strmap_init(&q->table);
    q->head = q->tail = NULL;
    pthread_mutex_unlock(&q->mu);
    return list;
}

size_t cx_queue_in_flight(cx_queue *q)
{
    pthread_mutex_lock(&q->mu);
    size_t n = q->table.count;
    pthread_mutex_unlock(&q->mu);
    return n;
}

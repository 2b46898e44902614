/* handles - the table behind cfx_handle values (see handles.h). */
#include "protocol/handles.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/error.h"

cfx_status cx_handles_init(cx_handles *h)
{
    memset(h, 0, sizeof *h);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&h->done_cv, &attr);
    pthread_condattr_destroy(&attr);
    if (rc || pthread_mutex_init(&h->mu, NULL))
        return cx_fail(CFX_ERR_INTERNAL, "cannot create the handle table's lock");
    return CFX_OK;
}

static void free_outputs(cx_slot *s)
{
    for (size_t i = 0; i < s->noutputs; i++) {
        free(s->outputs[i].data);
        free(s->outputs[i].splits);
    }
    free(s->outputs);
    s->outputs = NULL;
    s->noutputs = 0;
}

void cx_handles_destroy(cx_handles *h)
{
    for (size_t i = 0; i < h->count; i++) {
        free_outputs(h->slots[i]);
        free(h->slots[i]->message);
        free(h->slots[i]);
    }
    free(h->slots);
    free(h->free_list);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->done_cv);
    memset(h, 0, sizeof *h);
}

/* Locked. NULL for a stale handle. */
static cx_slot *lookup(cx_handles *h, cfx_handle handle)
{
    uint64_t index = (handle & 0xffffffffu);
    if (index == 0 || index > h->count)
        return NULL;
    cx_slot *s = h->slots[index - 1];
    if (!s->in_use || s->generation != (uint32_t)(handle >> 32))
        return NULL;
    return s;
}

/* Locked. As lookup, but a handle the user released (detached, still running) is stale too. */
static cx_slot *lookup_user(cx_handles *h, cfx_handle handle)
{
    cx_slot *s = lookup(h, handle);
    return (s && !s->detached) ? s : NULL;
}

static cfx_status stale(cfx_handle handle)
{
    return cx_fail(CFX_ERR_STALE_HANDLE, "handle %llu is not a live handle of this context "
                   "(already released, or never returned by it)", (unsigned long long)handle);
}

static void recycle(cx_handles *h, cx_slot *s, size_t index)
{
    free_outputs(s);
    free(s->message);
    s->message = NULL;
    s->in_use = 0;
    s->detached = 0;
    s->generation++;
    h->free_list[h->nfree++] = (uint32_t)index;
}

cfx_status cx_handles_create(cx_handles *h, size_t parts, size_t noutputs, cfx_handle *out)
{
    cx_output *outputs = NULL;
    if (noutputs && !(outputs = calloc(noutputs, sizeof *outputs)))
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for %zu outputs", noutputs);
    pthread_mutex_lock(&h->mu);
    size_t index;
    if (h->nfree) {
        index = h->free_list[--h->nfree];
    } else {
        if (h->count == h->capacity) {
            size_t cap = h->capacity ? h->capacity * 2 : 64;
            cx_slot **slots = realloc(h->slots, cap * sizeof *slots);
            uint32_t *fl = slots ? realloc(h->free_list, cap * sizeof *fl) : NULL;
            if (slots)
                h->slots = slots;
            if (!slots || !fl || cap > UINT32_MAX) {
                pthread_mutex_unlock(&h->mu);
                free(outputs);
                return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the handle table");
            }
            h->free_list = fl;
            h->capacity = cap;
        }
        cx_slot *s = calloc(1, sizeof *s);
        if (!s) {
            pthread_mutex_unlock(&h->mu);
            free(outputs);
            return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for a handle");
        }
        s->generation = 1;
        index = h->count;
        h->slots[h->count++] = s;
    }
    cx_slot *s = h->slots[index];
    s->in_use = 1;
    s->detached = 0;
    atomic_store(&s->done, 0);
    s->status = CFX_ERR_IN_PROGRESS;
    s->parts_left = parts;
    s->noutputs = noutputs;
    s->outputs = outputs;
    s->join_rank = -1;
    *out = ((uint64_t)s->generation << 32) | (uint64_t)(index + 1);
    pthread_mutex_unlock(&h->mu);
    return CFX_OK;
}

void cx_handles_discard(cx_handles *h, cfx_handle handle)
{
    pthread_mutex_lock(&h->mu);
    cx_slot *s = lookup(h, handle);
    if (s)
        recycle(h, s, (handle & 0xffffffffu) - 1);
    pthread_mutex_unlock(&h->mu);
}

void cx_handles_set_output(cx_handles *h, cfx_handle handle, size_t index, const cx_output *o)
{
    pthread_mutex_lock(&h->mu);
    cx_slot *s = lookup(h, handle);
    if (s && index < s->noutputs) {
        free(s->outputs[index].data);
        free(s->outputs[index].splits);
        s->outputs[index] = *o;
    } else {
        free(o->data);
        free(o->splits);
    }
    pthread_mutex_unlock(&h->mu);
}

void cx_handles_set_join_rank(cx_handles *h, cfx_handle handle, int rank)
{
    pthread_mutex_lock(&h->mu);
    cx_slot *s = lookup(h, handle);
    if (s)
        s->join_rank = rank;
    pthread_mutex_unlock(&h->mu);
}

void cx_handles_complete_part(cx_handles *h, cfx_handle handle, cfx_status status,
                              const char *message)
{
    pthread_mutex_lock(&h->mu);
    cx_slot *s = lookup(h, handle);
    if (!s || atomic_load(&s->done)) {
        pthread_mutex_unlock(&h->mu);
        return;
    }
    if (status != CFX_OK && s->message == NULL) {
        s->status = status;
        s->message = strdup(message ? message : cfx_status_string(status));
    }
    if (s->parts_left > 0)
        s->parts_left--;
    if (s->parts_left == 0) {
        if (s->status == CFX_ERR_IN_PROGRESS)
            s->status = CFX_OK;
        atomic_store_explicit(&s->done, 1, memory_order_release);
        if (s->detached)
            recycle(h, s, (handle & 0xffffffffu) - 1);
        pthread_cond_broadcast(&h->done_cv);
    }
    pthread_mutex_unlock(&h->mu);
}

cfx_status cx_handles_poll(cx_handles *h, cfx_handle handle, int *out)
{
    pthread_mutex_lock(&h->mu);
    cx_slot *s = lookup_user(h, handle);
    if (s)
        *out = atomic_load(&s->done);
    pthread_mutex_unlock(&h->mu);
    return s ? CFX_OK : stale(handle);
}

/* Completion of a small collective comes within microseconds: spin briefly (yielding) before
 * sleeping, since a condition-variable wake-up alone costs tens of microseconds. */
#define WAIT_SPIN_S 50e-6

cfx_status cx_handles_wait(cx_handles *h, cfx_handle handle, double timeout_s)
{
    double start = cx_now_s();
    double deadline = timeout_s < 0 ? INFINITY : start + timeout_s;
    pthread_mutex_lock(&h->mu);
    cx_slot *s = lookup_user(h, handle);
    if (!s) {
        pthread_mutex_unlock(&h->mu);
        return stale(handle);
    }
    pthread_mutex_unlock(&h->mu);
    /* The slot pointer stays valid while the handle is not released; a concurrent release by the
     * caller's own other thread is a misuse the generation check below still catches. */
    while (!atomic_load_explicit(&s->done, memory_order_acquire) && cx_now_s() - start < WAIT_SPIN_S &&
           cx_now_s() < deadline)
        sched_yield();
    pthread_mutex_lock(&h->mu);
    for (;;) {
        s = lookup_user(h, handle);
        if (!s) {
            pthread_mutex_unlock(&h->mu);
            return stale(handle);
        }
        if (atomic_load(&s->done))
            break;
        double now = cx_now_s();
        if (now >= deadline) {
            pthread_mutex_unlock(&h->mu);
            return cx_fail(CFX_ERR_TIMEOUT, "handle %llu still pending after %.3f s",
                           (unsigned long long)handle, timeout_s);
        }
        double until = deadline == INFINITY ? now + 3600 : deadline;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double wake = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + (until - now);
        ts.tv_sec = (time_t)wake;
        ts.tv_nsec = (long)((wake - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&h->done_cv, &h->mu, &ts);
    }
    cfx_status st = s->status;
    if (st != CFX_OK)
        cx_fail(st, "%s", s->message ? s->message : cfx_status_string(st));
    pthread_mutex_unlock(&h->mu);
    return st;
}

cfx_status cx_handles_status(cx_handles *h, cfx_handle handle)
{
    pthread_mutex_lock(&h->mu);
    cx_slot *s = lookup_user(h, handle);
    cfx_status st = s ? (atomic_load(&s->done) ? s->status : CFX_ERR_IN_PROGRESS) : stale(handle);
    if (s && st != CFX_OK && st != CFX_ERR_IN_PROGRESS)
        cx_fail(st, "%s", s->message ? s->message : cfx_status_string(st));
    pthread_mutex_unlock(&h->mu);
    return st;
}

const char *cx_handles_message(cx_handles *h, cfx_handle handle)
{
    pthread_mutex_lock(&h->mu);
    cx_slot *s = lookup_user(h, handle);
    const char *m = NULL;
    if (!s)
        stale(handle);
    else
        m = (atomic_load(&s->done) && s->message) ? s->message : "";
    pthread_mutex_unlock(&h->mu);
    return m;
}

cfx_status cx_handles_release(cx_handles *h, cfx_handle handle)
{
    pthread_mutex_lock(&h->mu);
    cx_slot *s = lookup_user(h, handle);
    if (!s) {
        pthread_mutex_unlock(&h->mu);
        return stale(handle);
    }
    if (atomic_load(&s->done))
        recycle(h, s, (handle & 0xffffffffu) - 1);
    else
        s->detached = 1;
    pthread_mutex_unlock(&h->mu);
    return CFX_OK;
}

/* Locked. A completed, successful slot with output `index`, or an error status. */
static cfx_status completed_output(cx_handles *h, cfx_handle handle, size_t index, cx_slot **out)
{
    cx_slot *s = lookup_user(h, handle);
    if (!s)
        return stale(handle);
    if (!atomic_load(&s->done))
        return cx_fail(CFX_ERR_IN_PROGRESS, "handle %llu has not completed yet",
                       (unsigned long long)handle);
    if (s->status != CFX_OK)
        return cx_fail(s->status, "%s", s->message ? s->message : cfx_status_string(s->status));
    if (index >= s->noutputs || !s->outputs)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "handle %llu has %zu outputs; index %zu is out "
                       "of range", (unsigned long long)handle, s->noutputs, index);
    *out = s;
    return CFX_OK;
}

cfx_status cx_handles_output_count(cx_handles *h, cfx_handle handle, size_t *out)
{
    pthread_mutex_lock(&h->mu);
    cx_slot *s = lookup_user(h, handle);
    cfx_status st = CFX_OK;
    if (!s)
        st = stale(handle);
    else if (!atomic_load(&s->done))
        st = cx_fail(CFX_ERR_IN_PROGRESS, "handle %llu has not completed yet",
                     (unsigned long long)handle);
    else
        *out = s->noutputs;
    pthread_mutex_unlock(&h->mu);
    return st;
}

cfx_status cx_handles_output(cx_handles *h, cfx_handle handle, size_t index, cfx_tensor *out)
{
    pthread_mutex_lock(&h->mu);
    cx_slot *s = NULL;
    cfx_status st = completed_output(h, handle, index, &s);
    if (st == CFX_OK) {
        cx_output *o = &s->outputs[index];
        out->data = o->data;
        out->shape = o->shape;
        out->ndim = o->ndim;
        out->dtype = o->dtype;
        out->device = CFX_DEVICE_CPU;
        out->stream = NULL;
    }
    pthread_mutex_unlock(&h->mu);
    return st;
}

cfx_status cx_handles_output_copy(cx_handles *h, cfx_handle handle, size_t index, void *dst,
                                  size_t dst_bytes)
{
    pthread_mutex_lock(&h->mu);
    cx_slot *s = NULL;
    cfx_status st = completed_output(h, handle, index, &s);
    if (st == CFX_OK) {
        cx_output *o = &s->outputs[index];
        if (dst_bytes < o->bytes)
            st = cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_handle_output_copy: destination holds %zu "
                         "bytes but output %zu has %zu", dst_bytes, index, o->bytes);
        else if (o->bytes && !dst)
            st = cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_handle_output_copy: dst is NULL");
        else if (o->bytes)
            memcpy(dst, o->data, o->bytes);
    }
    pthread_mutex_unlock(&h->mu);
    return st;
}

cfx_status cx_handles_splits(cx_handles *h, cfx_handle handle, size_t index, const int64_t **out)
{
    pthread_mutex_lock(&h->mu);
    cx_slot *s = NULL;
    cfx_status st = completed_output(h, handle, index, &s);
    if (st == CFX_OK) {
        if (s->outputs[index].splits)
            *out = s->outputs[index].splits;
        else
            st = cx_fail(CFX_ERR_INVALID_ARGUMENT, "handle %llu: output %zu has no per-rank splits "
                         "(only allgather and alltoall have them)", (unsigned long long)handle, index);
    }
    pthread_mutex_unlock(&h->mu);
    return st;
}

cfx_status cx_handles_join_rank(cx_handles *h, cfx_handle handle, int *out)
{
    pthread_mutex_lock(&h->mu);
    cx_slot *s = lookup_user(h, handle);
    cfx_status st = CFX_OK;
    if (!s)
        st = stale(handle);
    else if (!atomic_load(&s->done))
        st = cx_fail(CFX_ERR_IN_PROGRESS, "handle %llu has not completed yet", (unsigned long long)handle);
    else if (s->join_rank < 0)
        st = cx_fail(CFX_ERR_INVALID_ARGUMENT, "handle %llu is not a completed join", (unsigned long long)handle);
    else
        *out = s->join_rank;
    pthread_mutex_unlock(&h->mu);
    return st;
}

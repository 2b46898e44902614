/* gradset - gradient sets at run time: step state and the loop's part (see gradset.h). */
#include "engine/gradset.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/dtype.h"
#include "exec/shared_pool.h"
#include "kernels/reduce.h"
#include "observe/timeline.h"

static size_t set_bits(const cfx_gradset *s) { return 1 + (size_t)s->nbuckets; }
static size_t set_words(const cfx_gradset *s) { return (set_bits(s) + 63) / 64; }

cfx_status cx_gradsets_init(cx_gradsets *g, cx_queue *queue, const cx_logger *log, int size)
{
    memset(g, 0, sizeof *g);
    g->queue = queue;
    g->log = log;
    g->size = size;
    if (pthread_mutex_init(&g->mu, NULL))
        return cx_fail(CFX_ERR_INTERNAL, "cannot create the gradient sets' lock");
    return CFX_OK;
}

/* The context is going away: a released set is freed; one the caller still holds is orphaned
 * (its calls fail with CFX_ERR_SHUT_DOWN; cfx_gradset_free then frees it). */
static void drop(cfx_gradset *s)
{
    if (atomic_load(&s->released)) {
        cx_gradset_destroy(s);
        return;
    }
    s->registry = NULL;
    s->ctx = NULL;
    s->attached = false;
}

void cx_gradsets_destroy(cx_gradsets *g)
{
    for (size_t i = 0; i < g->nattached; i++)
        drop(g->attached[i]);
    for (cfx_gradset *s = g->pending_head, *next; s; s = next) {
        next = s->next_pending;
        drop(s);
    }
    free(g->attached);
    pthread_mutex_destroy(&g->mu);
    memset(g, 0, sizeof *g);
}

void cx_gradset_destroy(cfx_gradset *set)
{
    if (!set)
        return;
    for (int32_t i = 0; i < set->ngrads; i++)
        free(set->grads[i].name);
    free(set->grads);
    free(set->buckets);
    free(set->items);
    free(set->entries);
    free(set->entry_ptrs);
    free(set->no_entries);
    free(set->item_names);
    if (set->storage)
        cx_pool_free(set->storage);
    free(set->residual);
    pthread_mutex_destroy(&set->mu);
    pthread_cond_destroy(&set->done_cv);
    free(set->name);
    free(set);
}

/* Records a failure on the set (first one wins) and wakes its waiters. */
static void fail_set(cfx_gradset *set, cfx_status status, const char *reason)
{
    pthread_mutex_lock(&set->mu);
    if (!atomic_load(&set->failed)) {
        set->fail_status = status;
        snprintf(set->fail_message, sizeof set->fail_message, "gradient set '%s': %s", set->name,
                 reason);
        atomic_store(&set->failed, 1);
    }
    pthread_cond_broadcast(&set->done_cv);
    pthread_mutex_unlock(&set->mu);
}

cfx_status cx_gradsets_attach(cx_gradsets *g, cfx_gradset *set)
{
    pthread_mutex_lock(&g->mu);
    if (g->closed) {
        cfx_status st = g->close_status;
        char why[CX_ERROR_MAX];
        snprintf(why, sizeof why, "%s", g->close_reason);
        pthread_mutex_unlock(&g->mu);
        return cx_fail(st, "gradient set '%s': %s", set->name, why);
    }
    set->registry = g;
    set->next_pending = NULL;
    if (g->pending_tail)
        g->pending_tail->next_pending = set;
    else
        g->pending_head = set;
    g->pending_tail = set;
    pthread_mutex_unlock(&g->mu);
    cx_queue_wake(g->queue);
    return CFX_OK;
}

void cx_gradsets_release(cx_gradsets *g, cfx_gradset *set)
{
    if (!g || !set->registry) { /* never committed: nobody else knows it */
        cx_gradset_destroy(set);
        return;
    }
    pthread_mutex_lock(&g->mu);
    bool closed = g->closed;
    bool pending_only = false;
    if (closed) { /* the loop is gone: take it out of the registry and free it here */
        cfx_gradset **link = &g->pending_head, *prev = NULL;
        for (; *link && *link != set; link = &(*link)->next_pending)
            prev = *link;
        if (*link) {
            *link = set->next_pending;
            if (g->pending_tail == set)
                g->pending_tail = prev;
            pending_only = true;
        }
        for (size_t i = 0; i < g->nattached && !pending_only; i++) {
            if (g->attached[i] == set) {
                memmove(&g->attached[i], &g->attached[i + 1],
                        (g->nattached - i - 1) * sizeof *g->attached);
                g->nattached--;
                pending_only = true;
            }
        }
    }
    atomic_store(&set->released, 1);
    pthread_mutex_unlock(&g->mu);
    if (closed)
        cx_gradset_destroy(set);
    else
        cx_queue_wake(g->queue);
}

void cx_gradset_reset_step(cfx_gradset *set)
{
    for (int32_t i = 0; i < set->ngrads; i++)
        atomic_store_explicit(&set->grads[i].passes, 0, memory_order_relaxed);
    for (int32_t b = 0; b < set->nbuckets; b++) {
        atomic_store_explicit(&set->buckets[b].pending, set->buckets[b].ngrads,
                              memory_order_relaxed);
        atomic_store_explicit(&set->buckets[b].state, CX_BUCKET_IDLE, memory_order_release);
    }
    atomic_store(&set->buckets_left, set->nbuckets);
}

/* ---- step ---------------------------------------------------------------------------------- */

static void mark_ready(cfx_gradset *set, cx_bucket *b)
{
    int idle = CX_BUCKET_IDLE;
    if (atomic_compare_exchange_strong(&b->state, &idle, CX_BUCKET_READY))
        cx_queue_wake_lazy(set->registry->queue);
}

cfx_status cx_gradset_ready(cfx_gradset *set, int32_t index)
{
    /* A bucket marked ready while the background thread slept owes it a wake-up (queue.h): paid
     * here by the next ready call, so a bucket starts by the next gradient of backward at the
     * latest, while the last one runs on the thread in cfx_gradset_wait with no hand-off. */
    cx_queue_pay_wake(set->registry->queue);
    cx_grad *g = &set->grads[index];
    int passes = atomic_fetch_add_explicit(&g->passes, 1, memory_order_relaxed) + 1;
    if (passes > set->accumulate_steps) {
        atomic_fetch_sub_explicit(&g->passes, 1, memory_order_relaxed);
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_gradset_ready: gradient '%s' of set '%s' "
                       "marked ready %d times in one step (accumulate_steps %d); call "
                       "cfx_gradset_wait to end the step", g->name, set->name, passes,
                       set->accumulate_steps);
    }
    if (passes < set->accumulate_steps)
        return CFX_OK;
    cx_bucket *b = &set->buckets[g->bucket];
    if (atomic_fetch_sub_explicit(&b->pending, 1, memory_order_acq_rel) == 1)
        mark_ready(set, b);
    return CFX_OK;
}

/* Names (up to a line's worth) the buckets not reduced yet, for a timeout's message. */
static void missing_buckets(const cfx_gradset *set, char *buf, size_t size)
{
    size_t used = 0;
    int listed = 0, missing = 0;
    buf[0] = '\0';
    for (int32_t b = 0; b < set->nbuckets; b++) {
        if (atomic_load(&set->buckets[b].state) == CX_BUCKET_DONE)
            continue;
        missing++;
        if (used + 40 < size)
            used += (size_t)snprintf(buf + used, size - used, "%s%d", listed++ ? ", " : "", b);
    }
    if (missing > listed && used + 16 < size)
        snprintf(buf + used, size - used, ", ... (%d in all)", missing);
}

void cx_gradset_mark_unused(cfx_gradset *set)
{
    /* Unused gradients are reduced as they are: every bucket still counting goes out now. */
    for (int32_t b = 0; b < set->nbuckets; b++)
        if (atomic_load_explicit(&set->buckets[b].state, memory_order_acquire) == CX_BUCKET_IDLE)
            mark_ready(set, &set->buckets[b]);
}

bool cx_gradset_step_over(void *set_arg)
{
    cfx_gradset *set = set_arg;
    return atomic_load(&set->buckets_left) == 0 || atomic_load(&set->failed);
}

cfx_status cx_gradset_wait(cfx_gradset *set, double timeout_s)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    if (timeout_s >= 0) {
        long long ns = (long long)deadline.tv_nsec + (long long)(timeout_s * 1e9);
        deadline.tv_sec += (time_t)(ns / 1000000000ll);
        deadline.tv_nsec = (long)(ns % 1000000000ll);
    }
    pthread_mutex_lock(&set->mu);
    bool timed_out = false;
    while (atomic_load(&set->buckets_left) > 0 && !atomic_load(&set->failed) && !timed_out) {
        if (timeout_s < 0)
            pthread_cond_wait(&set->done_cv, &set->mu);
        else
            timed_out = pthread_cond_timedwait(&set->done_cv, &set->mu, &deadline) != 0;
    }
    pthread_mutex_unlock(&set->mu);
    /* A step every bucket of which was reduced is complete, even if the job stopped right after. */
    if (atomic_load(&set->buckets_left) > 0 && atomic_load(&set->failed))
        return cx_fail(set->fail_status, "%s", set->fail_message);
    if (atomic_load(&set->buckets_left) > 0) {
        char which[256];
        missing_buckets(set, which, sizeof which);
        return cx_fail(CFX_ERR_TIMEOUT, "cfx_gradset_wait: gradient set '%s': buckets [%s] of %d "
                       "not reduced within %g s (some ranks have not marked or waited for them); "
                       "the step is still pending", set->name, which, set->nbuckets, timeout_s);
    }
    cx_gradset_reset_step(set);
    return CFX_OK;
}

/* ---- the loop's part ------------------------------------------------------------------------ */

size_t cx_gradsets_words(const cx_gradsets *g)
{
    size_t words = 0;
    for (size_t i = 0; i < g->nattached; i++)
        words += set_words(g->attached[i]);
    return words;
}

bool cx_gradsets_fill(cx_gradsets *g, uint64_t *words, bool joined, double now)
{
    for (size_t i = 0; i < g->nattached; i++) {
        cfx_gradset *s = g->attached[i];
        size_t n = set_words(s);
        memset(words, 0, n * sizeof *words);
        if (atomic_load_explicit(&s->released, memory_order_acquire))
            words[0] |= 1;
        for (int32_t b = 0; b < s->nbuckets; b++) {
            size_t bit = 1 + (size_t)b;
            bool ready = atomic_load_explicit(&s->buckets[b].state, memory_order_acquire) ==
                         CX_BUCKET_READY;
            if (ready && s->buckets[b].ready_since == 0)
                s->buckets[b].ready_since = now;
            if (joined || ready)
                words[bit / 64] |= 1ull << (bit % 64);
        }
        words += n;
    }
    pthread_mutex_lock(&g->mu);
    bool pending = g->pending_head != NULL;
    pthread_mutex_unlock(&g->mu);
    return pending;
}

static bool bit_set(const uint64_t *w, size_t bit) { return (w[bit / 64] >> (bit % 64)) & 1; }

/* Runs buckets [b0, b1) of `s` (agreed everywhere, one dtype and device) as one batch. */
static cfx_status run_buckets(cfx_gradset *s, int32_t b0, int32_t b1, cx_exec *x)
{
    const cx_bucket *first = &s->buckets[b0];
    const cx_bucket *last = &s->buckets[b1 - 1];
    size_t i0 = first->first_item, n = last->first_item + last->nitems - i0;
    cx_allreduce_batch batch = {
        .items = s->items + i0, .n = n,
        .entries = (x->joined ? s->no_entries : s->entry_ptrs) + i0,
        .dtype = (cfx_dtype)first->dtype, .op = (cfx_reduce_op)s->op,
        .esize = cfx_dtype_size((cfx_dtype)first->dtype), .total = 0,
        .prescale = cx_tensor_factor((cfx_dtype)first->dtype, s->prescale),
        .postscale = cx_tensor_factor((cfx_dtype)first->dtype, s->postscale) /
                     (s->op == CFX_OP_AVERAGE ? (double)x->transport->size : 1.0)};
    for (int32_t b = b0; b < b1; b++)
        batch.total += s->buckets[b].elements;
    double tl[4] = {0};
    bool timed = CX_TL(x->timeline) != NULL;
    if (timed)
        tl[0] = tl[1] = cx_timeline_now();
    cfx_status st;
    x->residual = first->residual; /* consecutive buckets' residuals are back to back */
    if (first->device == CFX_DEVICE_CPU)
        st = cx_exec_allreduce_host(x, &batch, tl);
    else if (x->device_ops)
        st = x->device_ops->allreduce(x, &batch, tl);
    else
        st = cx_fail(CFX_ERR_UNSUPPORTED, "gradient set '%s': no device data path in this engine",
                     s->name);
    x->residual = NULL;
    if (timed && !st) {
        double t3 = cx_timeline_now();
        for (int32_t b = b0; b < b1; b++) {
            const cx_response *it = &s->items[s->buckets[b].first_item];
            cx_timeline_phase(x->timeline, it->name, CX_TL_COLLECTIVE, "ALLREDUCE",
                              tl[1] ? tl[1] : tl[0], tl[2] ? tl[2] : t3,
                              (int64_t)(batch.total * batch.esize), (int64_t)(b1 - b0));
        }
    }
    return st;
}

/* Marks buckets [b0, b1) reduced; wakes the waiters when the step is complete. */
static void finish_buckets(cfx_gradset *s, int32_t b0, int32_t b1)
{
    for (int32_t b = b0; b < b1; b++) {
        s->buckets[b].ready_since = 0;
        atomic_store_explicit(&s->buckets[b].state, CX_BUCKET_DONE, memory_order_release);
    }
    if (atomic_fetch_sub(&s->buckets_left, b1 - b0) == b1 - b0) {
        pthread_mutex_lock(&s->mu);
        pthread_cond_broadcast(&s->done_cv);
        pthread_mutex_unlock(&s->mu);
    }
}

static cfx_status run_set(cfx_gradset *s, const uint64_t *w, cx_exec *x, bool *progress)
{
    for (int32_t b = 0; b < s->nbuckets;) {
        if (!bit_set(w, 1 + (size_t)b)) {
            b++;
            continue;
        }
        int32_t end = b + 1;
        /* Error feedback: one bucket per batch, so each element is packed by the same local rank
         * every step (the blocks a batch is cut into depend on its size) and its residual is here. */
        while (!s->residual && end < s->nbuckets && bit_set(w, 1 + (size_t)end) &&
               s->buckets[end].dtype == s->buckets[b].dtype &&
               s->buckets[end].device == s->buckets[b].device)
            end++;
        *progress = true;
        cfx_status st = run_buckets(s, b, end, x);
        if (st)
            return st;
        if (!x->joined)
            finish_buckets(s, b, end);
        b = end;
    }
    return CFX_OK;
}

cfx_status cx_gradsets_after(cx_gradsets *g, const uint64_t *words, bool run_buckets,
                             bool attach_all, cx_exec *x, bool *progress)
{
    size_t keep = 0;
    cfx_status st = CFX_OK;
    for (size_t i = 0; i < g->nattached; i++) {
        cfx_gradset *s = g->attached[i];
        const uint64_t *w = words;
        words += set_words(s);
        if (bit_set(w, 0)) { /* every rank freed it */
            *progress = true;
            cx_gradset_destroy(s);
            continue;
        }
        g->attached[keep++] = s;
        if (!st && run_buckets)
            st = run_set(s, w, x, progress);
    }
    g->nattached = keep;
    if (st || !attach_all)
        return st;
    pthread_mutex_lock(&g->mu);
    cfx_gradset *s = g->pending_head;
    if (s && g->nattached == g->cap_attached) {
        size_t cap = g->cap_attached ? 2 * g->cap_attached : 4;
        cfx_gradset **grown = realloc(g->attached, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&g->mu);
            return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory attaching gradient set '%s'",
                           s->name);
        }
        g->attached = grown;
        g->cap_attached = cap;
    }
    if (s) {
        g->pending_head = s->next_pending;
        if (!g->pending_head)
            g->pending_tail = NULL;
        s->attached = true;
        g->attached[g->nattached++] = s;
        *progress = true;
        cx_log(g->log, CX_LOG_DEBUG, "gradset", "attached gradient set '%s': %d gradients in %d "
               "buckets", s->name, s->ngrads, s->nbuckets);
    }
    pthread_mutex_unlock(&g->mu);
    return CFX_OK;
}

bool cx_gradsets_busy(cx_gradsets *g)
{
    for (size_t i = 0; i < g->nattached; i++) {
        cfx_gradset *s = g->attached[i];
        for (int32_t b = 0; b < s->nbuckets; b++)
            if (atomic_load_explicit(&s->buckets[b].state, memory_order_relaxed) ==
                CX_BUCKET_READY)
                return true;
    }
    pthread_mutex_lock(&g->mu);
    bool pending = g->pending_head != NULL;
    pthread_mutex_unlock(&g->mu);
    return pending;
}

void cx_gradsets_fail(cx_gradsets *g, cfx_status status, const char *reason)
{
    pthread_mutex_lock(&g->mu);
    if (!g->closed) {
        g->closed = true;
        g->close_status = status;
        snprintf(g->close_reason, sizeof g->close_reason, "%s", reason);
    }
    for (size_t i = 0; i < g->nattached; i++)
        fail_set(g->attached[i], status, reason);
    for (cfx_gradset *s = g->pending_head; s; s = s->next_pending)
        fail_set(s, status, reason);
    pthread_mutex_unlock(&g->mu);
}

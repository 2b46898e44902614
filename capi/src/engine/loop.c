/* loop - the background thread: negotiation cycles, idling and shutdown (see loop.h). */
#include "engine/loop.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "base/clock.h"
#include "protocol/cache.h"
#include "exec/device_exec.h"
#include "engine/gradset.h"
#include "base/dtype.h"
#include "base/error.h"
#include "exec/execute.h"
#include "protocol/negotiate.h"
#include "observe/autotune.h"
#include "protocol/fusion.h"
#include "observe/timeline.h"

/* Status bits of word 0, stored inverted (set = "no rank"), so one AND-allreduce answers
 * "does any rank ...?" for each. */
enum {
    STATUS_SHUTDOWN = 1u << 0,
    STATUS_UNCACHED = 1u << 1,
    STATUS_INVALID = 1u << 2,
    STATUS_JOINED = 1u << 3,
    STATUS_GRADSET_READY = 1u << 4, /* some rank has a gradient-set bucket ready */
    /* Not inverted: set = this rank has a committed gradient set waiting to attach, so the AND
     * says whether every rank has one (gradset.h). */
    STATUS_ATTACH_ALL = 1u << 5,
};

struct cx_loop {
    cx_loop_env env;
    /* Whoever runs a cycle holds run_mu: the background thread, or a thread waiting for its own
     * work (cx_loop_drive). `stopped` (under run_mu): the loop has ended, no cycle runs again.
     * `drivers`: threads inside cx_loop_drive, so the background thread stands aside. */
    pthread_mutex_t run_mu;
    bool stopped;
    atomic_int drivers;
    atomic_bool gradsets_busy; /* cx_gradsets_busy after the last cycle */
    atomic_int driven;         /* set by every driven cycle: the context is not idle */
    cx_timeline *timeline; /* from env.take_timeline; NULL: off */
    cx_cache cache;
    bool is_coordinator;
    cx_coordinator coord;
    cx_exec exec;
    /* Cache hits waiting for the other ranks: entry and first-seen time by bit, and the mask. */
    cx_entry **hit_entry;
    double *hit_since;
    uint64_t *hit_mask;
    size_t nhits;
    /* Bits this rank found invalid this cycle. */
    uint64_t *invalid_mask;
    bool any_invalid;
    /* Requests for the coordinator, sent at the next slow path. */
    cx_entry **unsent;
    size_t nunsent, cap_unsent;
    /* Coordinator only: stall failures waiting for the next slow path. */
    cx_response_list stalled;
    double last_stall_check;
    uint64_t *vec;
    size_t vec_cap;
    /* Observability: cycles that did work (timeline marks); the coordinator's autotuner and the
     * parameters it wants every rank to switch to at the next slow path. */
    uint64_t cycles;
    cx_autotune *tuner;
    bool tune_pending;
    cx_tune_params tune_next;
};

static size_t words_for(size_t bits) { return (bits + 63) / 64; }

cfx_status cx_loop_create(const cx_loop_env *given, cx_loop **out)
{
    cx_loop *L = calloc(1, sizeof *L);
    if (!L)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the background loop");
    L->env = *given;
    pthread_mutex_init(&L->run_mu, NULL);
    atomic_init(&L->drivers, 0);
    atomic_init(&L->gradsets_busy, false);
    atomic_init(&L->driven, 0);
    const cx_loop_env *env = &L->env;
    size_t cap = (size_t)env->cfg->cache_capacity;
    size_t words = words_for(cap) ? words_for(cap) : 1;
    cfx_status st = cx_cache_init(&L->cache, cap);
    if (!st && (!(L->hit_entry = calloc(cap ? cap : 1, sizeof *L->hit_entry)) ||
                !(L->hit_since = calloc(cap ? cap : 1, sizeof *L->hit_since)) ||
                !(L->hit_mask = calloc(words, sizeof *L->hit_mask)) ||
                !(L->invalid_mask = calloc(words, sizeof *L->invalid_mask))))
        st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the cache bookkeeping");
    L->is_coordinator = env->transport->rank == 0;
    if (!st && L->is_coordinator)
        st = cx_coordinator_init(&L->coord, env->transport->size);
    if (!st && L->is_coordinator && env->cfg->autotune) { /* CFX_AUTOTUNE: rank 0 decides */
        cx_tune_params start = {env->cfg->fusion_threshold, env->cfg->chunk_bytes,
                                env->cfg->cycle_time_ms};
        st = cx_autotune_create(&start, env->cfg->autotune_window_s, env->cfg->autotune_log,
                                env->log, &L->tuner);
        if (!st) {
            L->tune_next = cx_autotune_params(L->tuner);
            L->tune_pending = true;
        }
    }
    if (st) {
        cx_loop_destroy(L);
        return st;
    }
    cx_exec_init(&L->exec, env->transport, env->cfg, env->queue, env->handles, env->log);
    L->exec.device_ops = &cx_device_path_ops;
    *out = L;
    return CFX_OK;
}

cx_exec *cx_loop_exec(cx_loop *L) { return &L->exec; }

void cx_loop_destroy(cx_loop *L)
{
    if (!L)
        return;
    cx_cache_destroy(&L->cache);
    if (L->is_coordinator)
        cx_coordinator_destroy(&L->coord);
    cx_exec_destroy(&L->exec);
    cx_response_list_free(&L->stalled);
    cx_autotune_destroy(L->tuner);
    free(L->hit_entry);
    free(L->hit_since);
    free(L->hit_mask);
    free(L->invalid_mask);
    free(L->unsent);
    free(L->vec);
    pthread_mutex_destroy(&L->run_mu);
    free(L);
}

static cfx_status push_unsent(cx_loop *L, cx_entry *e)
{
    if (L->nunsent == L->cap_unsent) {
        size_t cap = L->cap_unsent ? L->cap_unsent * 2 : 64;
        cx_entry **u = realloc(L->unsent, cap * sizeof *u);
        if (!u)
            return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory queueing requests");
        L->unsent = u;
        L->cap_unsent = cap;
    }
    L->unsent[L->nunsent++] = e;
    return CFX_OK;
}

static void add_hit(cx_loop *L, cx_entry *e, size_t bit, double now)
{
    L->hit_entry[bit] = e;
    L->hit_since[bit] = now;
    L->hit_mask[bit / 64] |= 1ull << (bit % 64);
    L->nhits++;
}

static cx_entry *remove_hit(cx_loop *L, size_t bit)
{
    cx_entry *e = L->hit_entry[bit];
    if (!e)
        return NULL;
    L->hit_entry[bit] = NULL;
    L->hit_mask[bit / 64] &= ~(1ull << (bit % 64));
    L->nhits--;
    return e;
}

/* Some rank has joined: this rank's cache hits that cannot take part in join (anything but
 * allreduce) fail now, whatever the other ranks submitted, so none waits for a rank that will not
 * come (the coordinator does the same for requests on the slow path). */
static void fail_unjoinable_hits(cx_loop *L)
{
    size_t words = words_for(L->cache.nbits);
    for (size_t w = 0; w < words; w++) {
        for (uint64_t m = L->hit_mask[w]; m; m &= m - 1) {
            size_t b = w * 64 + (size_t)__builtin_ctzll(m);
            const cx_response *r = cx_cache_get(&L->cache, b);
            if (!r || r->coll == CX_ALLREDUCE || !L->hit_entry[b])
                continue;
            cx_entry *e = cx_queue_take(L->env.queue, L->hit_entry[b]->req.name);
            remove_hit(L, b);
            char msg[CX_ERROR_MAX];
            snprintf(msg, sizeof msg, "tensor '%s': %s cannot run while ranks have joined; only "
                     "allreduce takes part in join", r->name, cx_coll_name(r->coll));
            cx_exec_complete(&L->exec, e, CFX_ERR_JOINED, msg);
        }
    }
}

static void mark_invalid(cx_loop *L, size_t bit)
{
    L->invalid_mask[bit / 64] |= 1ull << (bit % 64);
    L->any_invalid = true;
}

/* Sorts a new entry: cache hit (wait for the others through the bit vector) or a request for the
 * coordinator (miss, invalidated parameters, barrier, join). */
static cfx_status classify(cx_loop *L, cx_entry *e, double now)
{
    if (e->req.coll == CX_JOIN)
        L->exec.joined = true;
    size_t bit;
    cx_cache_result res = (e->req.coll == CX_JOIN || e->req.coll == CX_BARRIER)
                              ? CX_CACHE_MISS
                              : cx_cache_lookup(&L->cache, &e->req, &bit);
    if (res == CX_CACHE_HIT && !L->hit_entry[bit]) {
        add_hit(L, e, bit, now);
        return CFX_OK;
    }
    if (res == CX_CACHE_INVALID)
        mark_invalid(L, bit);
    return push_unsent(L, e);
}

static cfx_status ensure_vec(cx_loop *L, size_t words)
{
    if (L->vec_cap >= words)
        return CFX_OK;
    uint64_t *v = realloc(L->vec, words * sizeof *v);
    if (!v)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the bit vector");
    L->vec = v;
    L->vec_cap = words;
    return CFX_OK;
}

/* A copy of cached response `bit` for execution; with joined ranks, collectives other than
 * allreduce fail (every rank knows "someone joined" from the bit vector, so all fail alike). */
static cfx_status cached_response(cx_loop *L, size_t bit, bool joined_any, cx_response_list *out)
{
    cx_response r;
    if (!cx_response_copy(&r, cx_cache_get(&L->cache, bit)))
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory copying a cached response");
    if (joined_any && r.coll != CX_ALLREDUCE) {
        char msg[512];
        snprintf(msg, sizeof msg, "tensor '%s': %s cannot run while ranks have joined; only "
                 "allreduce takes part in join", r.name, cx_coll_name(r.coll));
        r.status = CFX_ERR_JOINED;
        r.message = strdup(msg);
    }
    if (!cx_response_list_push(out, &r))
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the response list");
    return CFX_OK;
}

/* Gathers the unsent requests at the coordinator and receives its response list. */
static cfx_status slow_path(cx_loop *L, double now, cx_response_list *responses)
{
    const cx_loop_env *env = &L->env;
    cx_transport *t = env->transport;
    cx_request_list mine = {.rank = env->transport->rank, .count = L->nunsent};
    mine.flags = atomic_load(env->shutdown_requested) ? CX_LIST_SHUTDOWN : 0;
    mine.items = malloc((L->nunsent ? L->nunsent : 1) * sizeof *mine.items);
    if (!mine.items)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the request list");
    for (size_t i = 0; i < L->nunsent; i++)
        mine.items[i] = L->unsent[i]->req; /* shallow: encoding only reads */
    cx_bytes bytes = {0};
    cfx_status st = cx_encode_requests(&mine, &bytes);
    free(mine.items);
    L->nunsent = 0;
    void *gathered = NULL;
    size_t lens[t->size];
    if (!st)
        st = t->ops->gather_bytes(t, bytes.data, bytes.len, &gathered, lens);
    cx_bytes_free(&bytes);
    if (st)
        return st;

    void *answer = NULL;
    size_t answer_len = 0;
    cx_bytes encoded = {0};
    if (L->is_coordinator) {
        cx_request_list *lists = calloc((size_t)t->size, sizeof *lists);
        cx_response_list decided = {0};
        size_t off = 0;
        st = lists ? CFX_OK : cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for request lists");
        for (int r = 0; !st && r < t->size; r++) {
            st = cx_decode_requests((char *)gathered + off, lens[r], &lists[r]);
            off += lens[r];
        }
        if (!st)
            st = cx_coordinator_process(&L->coord, lists, now, &decided);
        for (size_t i = 0; !st && i < L->stalled.count; i++)
            if (!cx_response_list_push(&decided, &L->stalled.items[i]))
                st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the response list");
        free(L->stalled.items);
        memset(&L->stalled, 0, sizeof L->stalled);
        if (!st && L->tune_pending) { /* autotune: every rank switches after this decode */
            decided.flags |= CX_LIST_TUNED;
            decided.tuned_fusion_threshold = L->tune_next.fusion_threshold;
            decided.tuned_chunk_bytes = L->tune_next.chunk_bytes;
            decided.tuned_cycle_time_ms = L->tune_next.cycle_time_ms;
            L->tune_pending = false;
        }
        if (!st)
            st = cx_encode_responses(&decided, &encoded);
        cx_response_list_free(&decided);
        for (int r = 0; lists && r < t->size; r++)
            cx_request_list_free(&lists[r]);
        free(lists);
        /* A coordinator failure must still reach the other ranks, or they wait forever: send an
         * empty list and report the failure locally. */
        if (st) {
            cx_bytes_free(&encoded);
            cx_response_list none = {0};
            cx_encode_responses(&none, &encoded);
        }
        answer = encoded.data;
        answer_len = encoded.len;
    }
    free(gathered);
    cfx_status bst = t->ops->bcast_bytes(t, &answer, &answer_len, 0);
    if (st || bst) {
        if (!L->is_coordinator)
            free(answer);
        cx_bytes_free(&encoded);
        return st ? st : bst;
    }
    cx_response_list decided;
    st = cx_decode_responses(answer, answer_len, &decided);
    if (!L->is_coordinator)
        free(answer);
    cx_bytes_free(&encoded);
    if (!st && (decided.flags & CX_LIST_TUNED)) {
        /* The coordinator's tuned parameters, applied on every rank at this same point, before
         * this cycle's responses are planned into fusion batches. */
        env->cfg->fusion_threshold = decided.tuned_fusion_threshold;
        env->cfg->chunk_bytes = decided.tuned_chunk_bytes;
        env->cfg->cycle_time_ms = decided.tuned_cycle_time_ms;
        cx_log(env->log, CX_LOG_DEBUG, "autotune", "now fusion %lld B, chunk %lld B, cycle %g ms",
               (long long)env->cfg->fusion_threshold, (long long)env->cfg->chunk_bytes,
               env->cfg->cycle_time_ms);
    }
    for (size_t i = 0; !st && i < decided.count; i++) {
        cx_response *r = &decided.items[i];
        size_t bit, evicted;
        if (cx_cache_cacheable(r) && cx_cache_put(&L->cache, r, &bit, &evicted) && evicted != SIZE_MAX) {
            /* A pending hit on a bit that now means another tensor must be negotiated afresh. */
            cx_entry *e = remove_hit(L, evicted);
            if (e)
                st = push_unsent(L, e);
        }
        if (!st && !cx_response_list_push(responses, r))
            st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the response list");
        if (!st)
            memset(r, 0, sizeof *r); /* moved into `responses` */
    }
    cx_response_list_free(&decided);
    return st;
}

/* Names the ranks that asked for shutdown (one byte from each) for the pending handles' message. */
static void shutdown_reason(cx_loop *L, char *buf, size_t size)
{
    const cx_loop_env *env = &L->env;
    cx_transport *t = env->transport;
    int n = t->size;
    uint8_t mine = (uint8_t)atomic_load(env->shutdown_requested); /* 2: exit handler */
    uint8_t *all = calloc((size_t)n, 1);
    size_t ones[n], displs[n];
    for (int r = 0; r < n; r++) {
        ones[r] = 1;
        displs[r] = (size_t)r;
    }
    bool known = all && t->ops->allgatherv(t, &mine, 1, all, ones, displs) == CFX_OK;
    size_t used = (size_t)snprintf(buf, size, "Conflux was shut down by rank%s ",
                                   known ? "(s)" : "s");
    if (!known) {
        snprintf(buf + used, size - used, "(unknown)");
    } else {
        int listed = 0;
        for (int r = 0; r < n && used + 48 < size; r++)
            if (all[r])
                used += (size_t)snprintf(buf + used, size - used, "%s%d%s", listed++ ? ", " : "[", r,
                                         all[r] == 2 ? " (exited without cfx_shutdown)" : "");
        snprintf(buf + used, size - used, "]");
    }
    free(all);
    if (mine == 0)
        cx_log(env->log, CX_LOG_INFO, "loop", "%s; stopping", buf);
}

static void fail_all(cx_loop *L, cfx_status status, const char *reason)
{
    /* Not running from here on, before any waiter can see its handle fail. */
    atomic_store(L->env.running, 0);
    cx_gradsets_fail(L->env.gradsets, status, reason);
    cx_entry *e = cx_queue_close(L->env.queue, reason);
    while (e) {
        cx_entry *next = e->next;
        char msg[CX_ERROR_MAX];
        snprintf(msg, sizeof msg, "tensor '%s' (%s) did not complete: %s", e->req.name,
                 cx_coll_name(e->req.coll), reason);
        cx_exec_complete(&L->exec, e, status, msg);
        e = next;
    }
    memset(L->hit_entry, 0, sizeof *L->hit_entry * (L->cache.capacity ? L->cache.capacity : 1));
    L->nhits = 0;
    L->nunsent = 0;
}

/* Autotune (coordinator): bytes the allreduces of this cycle reduced feed the tuner; a change it
 * asks for goes to every rank with the next slow path (slow_path, CX_LIST_TUNED). */
static void autotune_sample(cx_loop *L, const cx_response_list *responses)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < responses->count; i++)
        if (responses->items[i].status == CFX_OK && responses->items[i].coll == CX_ALLREDUCE)
            bytes += cx_response_bytes(&responses->items[i]);
    if (cx_autotune_update(L->tuner, cx_now_s(), bytes, &L->tune_next))
        L->tune_pending = true;
}

/* One cycle. *progress: something new arrived or ran; *stop: the loop must end. */
static cfx_status cycle(cx_loop *L, bool *progress, bool *stop)
{
    const cx_loop_env *env = &L->env;
    cx_transport *t = env->transport;
    double now = cx_now_s();
    cfx_status st = CFX_OK;
    *progress = false;

    if (CX_TL_ENABLED && atomic_load_explicit(env->timeline_change, memory_order_relaxed)) {
        L->timeline = env->take_timeline(env->owner); /* cfx_timeline_start/stop, CFX_TIMELINE */
        L->exec.timeline = L->timeline;
        L->coord.timeline = L->timeline;
    }
    for (cx_entry *e = cx_queue_pop_new(env->queue), *next; e; e = next) {
        next = e->next;
        *progress = true;
        if (CX_TL(L->timeline))
            cx_timeline_seen(L->timeline, e->req.name, e->enqueue_time, now);
        if ((st = classify(L, e, now)))
            return st;
    }
    /* Cached tensors the other ranks have not matched for a while go through the coordinator,
     * whose stall inspector can then name the missing ranks. */
    double age_limit = env->cfg->stall_warning_s > 0 ? env->cfg->stall_warning_s / 2 : INFINITY;
    if (L->nhits && env->cfg->stall_timeout_s > 0 && env->cfg->stall_timeout_s / 2 < age_limit)
        age_limit = env->cfg->stall_timeout_s / 2;
    if (L->nhits && isfinite(age_limit)) /* visit only the pending hits, word by word */
        for (size_t w = 0; w < words_for(L->cache.nbits); w++)
            for (uint64_t m = L->hit_mask[w]; m; m &= m - 1) {
                size_t b = w * 64 + (size_t)__builtin_ctzll(m);
                if (now - L->hit_since[b] > age_limit)
                    mark_invalid(L, b);
            }
    if (L->is_coordinator && now - L->last_stall_check >= 0.1) {
        L->last_stall_check = now;
        st = cx_coordinator_check_stalls(&L->coord, now, env->cfg->stall_warning_s,
                                         env->cfg->stall_timeout_s, env->log, &L->stalled);
        if (st)
            return st;
    }

    size_t nbits = L->cache.nbits, words = words_for(nbits);
    size_t gwords = cx_gradsets_words(env->gradsets), nvec = 1 + 2 * words + gwords;
    if ((st = ensure_vec(L, nvec)))
        return st;
    uint64_t *gbits = L->vec + 1 + 2 * words;
    bool attach_mine = cx_gradsets_fill(env->gradsets, gbits, L->exec.joined, now);
    uint64_t status = ~0ull;
    if (atomic_load(env->shutdown_requested))
        status &= ~(uint64_t)STATUS_SHUTDOWN;
    if (L->nunsent || L->stalled.count || L->tune_pending)
        status &= ~(uint64_t)STATUS_UNCACHED;
    if (L->any_invalid)
        status &= ~(uint64_t)STATUS_INVALID;
    if (L->exec.joined)
        status &= ~(uint64_t)STATUS_JOINED;
    if (!L->exec.joined && gwords && cx_gradsets_busy(env->gradsets))
        status &= ~(uint64_t)STATUS_GRADSET_READY;
    if (!attach_mine)
        status &= ~(uint64_t)STATUS_ATTACH_ALL;
    uint64_t *hits = L->vec + 1, *invalid = L->vec + 1 + words;
    L->vec[0] = status;
    if (L->exec.joined) { /* a joined rank agrees to every cached tensor */
        memset(hits, 0, words * sizeof *hits);
        for (size_t b = 0; b < nbits; b++)
            if (cx_cache_get(&L->cache, b))
                hits[b / 64] |= 1ull << (b % 64);
    } else {
        memcpy(hits, L->hit_mask, words * sizeof *hits);
    }
    for (size_t w = 0; w < words; w++)
        invalid[w] = ~L->invalid_mask[w];
    /* On one host the shared-memory layer answers this through its segment (exec/shm_layer.h). */
    if ((st = t->ops->allreduce_and(t, L->vec, nvec)))
        return st;
    status = L->vec[0];
    bool shutdown_any = !(status & STATUS_SHUTDOWN);
    bool uncached_any = !(status & STATUS_UNCACHED);
    bool invalid_any = !(status & STATUS_INVALID);
    bool joined_any = !(status & STATUS_JOINED);
    bool gradset_ready_any = !(status & STATUS_GRADSET_READY);
    bool attach_all = status & STATUS_ATTACH_ALL;

    if (invalid_any) {
        for (size_t b = 0; b < nbits; b++) {
            if (invalid[b / 64] & (1ull << (b % 64)))
                continue;
            cx_cache_erase(&L->cache, b);
            hits[b / 64] &= ~(1ull << (b % 64));
            cx_entry *e = remove_hit(L, b);
            if (e && (st = push_unsent(L, e)))
                return st;
        }
        memset(L->invalid_mask, 0, words * sizeof *L->invalid_mask);
        L->any_invalid = false;
    }

    cx_response_list responses = {0};
    for (size_t w = 0; w < words && !st; w++) {
        for (uint64_t m = hits[w]; m && !st; m &= m - 1) {
            size_t b = w * 64 + (size_t)__builtin_ctzll(m);
            if (!cx_cache_get(&L->cache, b))
                continue;
            st = cached_response(L, b, joined_any, &responses);
            cx_cache_touch(&L->cache, b);
            remove_hit(L, b);
        }
    }
    if (!st && joined_any && !L->exec.joined)
        fail_unjoinable_hits(L);
    if (!st && (uncached_any || invalid_any))
        st = slow_path(L, now, &responses);
    if (!st && responses.count) {
        *progress = true;
        st = cx_execute(&L->exec, &responses);
        if (L->tuner)
            autotune_sample(L, &responses);
    }
    /* Gradient-set buckets every rank agreed on, after the responses (the same order everywhere). */
    if (!st && (gwords || attach_all))
        st = cx_gradsets_after(env->gradsets, gbits, gradset_ready_any, attach_all, &L->exec,
                               progress);
    if (CX_TL(L->timeline) && *progress && cx_timeline_marks_cycles(L->timeline))
        cx_timeline_cycle(L->timeline, L->cycles++, now, cx_timeline_now());
    cx_response_list_free(&responses);
    if (!st && shutdown_any) {
        char reason[512];
        shutdown_reason(L, reason, sizeof reason);
        /* 3: this rank stops to form its elastic world again (cfx_context_reform). */
        bool reform = atomic_load(env->shutdown_requested) == 3;
        if (reform)
            snprintf(reason + strlen(reason), sizeof reason - strlen(reason),
                     " (the elastic world is being formed again)");
        fail_all(L, reform ? CFX_ERR_MEMBERSHIP_CHANGED : CFX_ERR_SHUT_DOWN, reason);
        *stop = true;
    }
    if (L->nunsent)
        *progress = true; /* requests moved back from the cache go out next cycle */
    return st;
}

/* Bounded adaptive spinning. After a cycle that did work the thread polls the queue (lock-free)
 * for a while before it sleeps, so a request submitted soon after the last one does not pay a
 * futex wake-up. The budget adapts: doubled (up to SPIN_MAX_S) when a spin caught work, halved
 * (down to SPIN_MIN_S) when it ran out; after SPIN_WINDOW_S without progress the thread does not
 * spin at all, so an idle context stays asleep and a rank waiting on a slow peer stops polling. */
#define SPIN_MIN_S 2e-6
#define SPIN_MAX_S 100e-6
#define SPIN_WINDOW_S 2e-3
/* A context idle for DEEP_IDLE_CYCLES heartbeat cycles in a row (nothing in flight, no waiter)
 * wakes only every DEEP_IDLE_STRETCH cycle times to take part in other ranks' cycles. */
#define DEEP_IDLE_CYCLES 200
#define DEEP_IDLE_STRETCH 50
/* How long a driving thread yields to a background thread in its cycle before it waits as usual. */
#define DRIVE_YIELD_S 50e-6

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Polls for new work for up to budget_s; true when some arrived. */
static bool spin_for_work(cx_queue *q, double budget_s)
{
    double end = cx_now_s() + budget_s;
    for (unsigned i = 0;; i++) {
        if (cx_queue_has_new(q))
            return true;
        cpu_relax();
        if ((i & 31) == 31 && cx_now_s() >= end)
            return false;
    }
}

/* One cycle with the loop's error handling, run_mu held; true when the loop has ended. */
static bool run_cycle(cx_loop *L, bool *progress)
{
    bool stop = false;
    cfx_status st = cycle(L, progress, &stop);
    if (st) {
        char reason[CX_ERROR_MAX];
        snprintf(reason, sizeof reason, "the background thread stopped after an error: %s",
                 cx_error_message());
        cx_log(L->env.log, CX_LOG_ERROR, "loop", "%s", reason);
        fail_all(L, st == CFX_ERR_TRANSPORT ? CFX_ERR_TRANSPORT : st, reason);
        stop = true;
    }
    if (stop)
        L->stopped = true;
    atomic_store(&L->gradsets_busy, !stop && cx_gradsets_busy(L->env.gradsets));
    return stop;
}

/* The back-off while this rank's tensors wait for other ranks: 1 us doubling to the cycle time. */
static double backoff_s(double cycle_s, int idle_streak)
{
    return fmin(cycle_s, 1e-6 * (double)(1 << (idle_streak < 10 ? idle_streak : 10)));
}

/* Work in flight on this rank, or a gradient-set bucket the last cycle left ready or pending (the
 * gradient sets are the cycle's: sampled under run_mu, read from any thread). */
static bool engine_busy(cx_loop *L)
{
    return cx_queue_in_flight(L->env.queue) != 0 || atomic_load(&L->gradsets_busy);
}

cx_drive_result cx_loop_drive(cx_loop *L, bool (*done)(void *), void *arg, double deadline_s)
{
    const cx_loop_env *env = &L->env;
    cx_drive_result result = CX_DRIVE_DONE;
    int idle_streak = 0;
    double busy_since = -1;
    atomic_fetch_add(&L->drivers, 1);
    while (!done(arg)) {
        double now = cx_now_s();
        if (now >= deadline_s) {
            result = CX_DRIVE_TIMEOUT;
            break;
        }
        if (pthread_mutex_trylock(&L->run_mu) != 0) {
            /* The background thread is in a cycle (most likely the one that runs our work): let
             * it finish; after a short while leave the waiting to the caller's usual path. */
            if (busy_since < 0)
                busy_since = now;
            if (now - busy_since > DRIVE_YIELD_S) {
                result = CX_DRIVE_BUSY;
                break;
            }
            sched_yield();
            continue;
        }
        busy_since = -1;
        if (L->stopped || (env->device_bound && atomic_load(env->device_bound))) {
            pthread_mutex_unlock(&L->run_mu);
            result = CX_DRIVE_BUSY;
            break;
        }
        cx_queue_forgive_wake(env->queue);
        atomic_store(&L->driven, 1);
        bool progress = false;
        bool stop = run_cycle(L, &progress);
        double cycle_s = env->cfg->cycle_time_ms * 1e-3;
        pthread_mutex_unlock(&L->run_mu);
        if (stop)
            continue; /* the work failed with the loop: `done` says so */
        idle_streak = progress ? 0 : idle_streak + 1;
        if (idle_streak > 1) {
            struct timespec ts = {0, (long)(backoff_s(cycle_s, idle_streak) * 1e9)};
            nanosleep(&ts, NULL);
        }
    }
    atomic_fetch_sub(&L->drivers, 1);
    if (engine_busy(L))
        cx_queue_wake(env->queue); /* what is left is the background thread's again */
    return result;
}

void cx_loop_fence(cx_loop *L)
{
    pthread_mutex_lock(&L->run_mu);
    pthread_mutex_unlock(&L->run_mu);
}

void *cx_loop_main(void *arg)
{
    cx_loop *L = arg;
    const cx_loop_env *env = &L->env;
    int idle_streak = 0, quiet_cycles = 0;
    double spin_s = SPIN_MAX_S / 4, last_progress = -INFINITY;
    pthread_mutex_lock(&L->run_mu); /* the cycle time is read under run_mu: autotune changes it */
    double cycle_s = env->cfg->cycle_time_ms * 1e-3;
    pthread_mutex_unlock(&L->run_mu);
#ifdef PR_SET_TIMERSLACK
    prctl(PR_SET_TIMERSLACK, 1000ul); /* the back-off's microsecond sleeps, not the default 50 us */
#endif
    for (;;) {
        bool shutdown = atomic_load(env->shutdown_requested);
        if (atomic_load(&L->drivers) && !shutdown) {
            /* A waiting thread runs the cycles; it wakes this one when it leaves work behind. */
            cx_queue_sleep(env->queue, cycle_s);
            continue;
        }
        if (!cx_queue_has_new(env->queue) && !shutdown) {
            bool caught = false;
            if (cx_now_s() - last_progress < SPIN_WINDOW_S) {
                caught = spin_for_work(env->queue, spin_s);
                spin_s = caught ? fmin(2 * spin_s, SPIN_MAX_S) : fmax(spin_s / 2, SPIN_MIN_S);
            }
            if (caught)
                ;
            else if (!engine_busy(L)) {
                /* Long idle (every rank counts the same cycles, so the ranks stretch together):
                 * fewer heartbeat cycles, and a push wakes the thread at once meanwhile. */
                bool deep = quiet_cycles >= DEEP_IDLE_CYCLES;
                atomic_store(&env->queue->deep_idle, deep);
                cx_queue_wait(env->queue, deep ? DEEP_IDLE_STRETCH * cycle_s : cycle_s);
                atomic_store(&env->queue->deep_idle, 0);
            }
            else if (idle_streak > 0) /* our tensors wait for other ranks: back off */
                cx_queue_wait(env->queue, backoff_s(cycle_s, idle_streak));
        }
        pthread_mutex_lock(&L->run_mu);
        if (L->stopped) {
            pthread_mutex_unlock(&L->run_mu);
            break;
        }
        if (atomic_load(&L->drivers) && !atomic_load(env->shutdown_requested)) {
            pthread_mutex_unlock(&L->run_mu); /* a waiter took over meanwhile */
            continue;
        }
        bool progress = false;
        bool stop = run_cycle(L, &progress);
        cycle_s = env->cfg->cycle_time_ms * 1e-3;
        pthread_mutex_unlock(&L->run_mu);
        if (stop)
            break;
        if (progress)
            last_progress = cx_now_s();
        idle_streak = progress ? 0 : idle_streak + 1;
        bool driven = atomic_exchange(&L->driven, 0); /* a waiter ran cycles since the last one */
        quiet_cycles = progress || driven || engine_busy(L) ? 0 : quiet_cycles + 1;
    }
    /* CUDA and NCCL state is made and ended by this thread alone (device_exec.h). */
    cx_device_destroy(L->exec.device);
    L->exec.device = NULL;
    atomic_store(env->running, 0);
    return NULL;
}

/* cycle - one negotiation cycle and the state cycles share (see cycle.h). */
#include "engine/cycle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/dtype.h"
#include "base/error.h"
#include "engine/gradset.h"
#include "exec/device_exec.h"
#include "observe/autotune.h"
#include "observe/timeline.h"
#include "protocol/cache.h"
#include "protocol/fusion.h"
#include "protocol/negotiate.h"

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

struct cx_cycle {
    cx_loop_env env;
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

cfx_status cx_cycle_create(const cx_loop_env *given, cx_cycle **out)
{
    cx_cycle *c = calloc(1, sizeof *c);
    if (!c)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the background loop");
    c->env = *given;
    const cx_loop_env *env = &c->env;
    size_t cap = (size_t)env->cfg->cache_capacity;
    size_t words = words_for(cap) ? words_for(cap) : 1;
    cfx_status st = cx_cache_init(&c->cache, cap);
    if (!st && (!(c->hit_entry = calloc(cap ? cap : 1, sizeof *c->hit_entry)) ||
                !(c->hit_since = calloc(cap ? cap : 1, sizeof *c->hit_since)) ||
                !(c->hit_mask = calloc(words, sizeof *c->hit_mask)) ||
                !(c->invalid_mask = calloc(words, sizeof *c->invalid_mask))))
        st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the cache bookkeeping");
    c->is_coordinator = env->transport->rank == 0;
    if (!st && c->is_coordinator)
        st = cx_coordinator_init(&c->coord, env->transport->size);
    if (!st && c->is_coordinator && env->cfg->autotune) { /* CFX_AUTOTUNE: rank 0 decides */
        cx_tune_params start = {env->cfg->fusion_threshold, env->cfg->chunk_bytes,
                                env->cfg->cycle_time_ms};
        st = cx_autotune_create(&start, env->cfg->autotune_window_s, env->cfg->autotune_log,
                                env->log, &c->tuner);
        if (!st) {
            c->tune_next = cx_autotune_params(c->tuner);
            c->tune_pending = true;
        }
    }
    if (st) {
        cx_cycle_destroy(c);
        return st;
    }
    cx_exec_init(&c->exec, env->transport, env->cfg, env->queue, env->handles, env->log);
    c->exec.device_ops = &cx_device_path_ops;
    *out = c;
    return CFX_OK;
}

cx_exec *cx_cycle_exec(cx_cycle *c) { return &c->exec; }

void cx_cycle_destroy(cx_cycle *c)
{
    if (!c)
        return;
    cx_cache_destroy(&c->cache);
    if (c->is_coordinator)
        cx_coordinator_destroy(&c->coord);
    cx_exec_destroy(&c->exec);
    cx_response_list_free(&c->stalled);
    cx_autotune_destroy(c->tuner);
    free(c->hit_entry);
    free(c->hit_since);
    free(c->hit_mask);
    free(c->invalid_mask);
    free(c->unsent);
    free(c->vec);
    free(c);
}

static cfx_status push_unsent(cx_cycle *c, cx_entry *e)
{
    if (c->nunsent == c->cap_unsent) {
        size_t cap = c->cap_unsent ? c->cap_unsent * 2 : 64;
        cx_entry **u = realloc(c->unsent, cap * sizeof *u);
        if (!u)
            return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory queueing requests");
        c->unsent = u;
        c->cap_unsent = cap;
    }
    c->unsent[c->nunsent++] = e;
    return CFX_OK;
}

static void add_hit(cx_cycle *c, cx_entry *e, size_t bit, double now)
{
    c->hit_entry[bit] = e;
    c->hit_since[bit] = now;
    c->hit_mask[bit / 64] |= 1ull << (bit % 64);
    c->nhits++;
}

static cx_entry *remove_hit(cx_cycle *c, size_t bit)
{
    cx_entry *e = c->hit_entry[bit];
    if (!e)
        return NULL;
    c->hit_entry[bit] = NULL;
    c->hit_mask[bit / 64] &= ~(1ull << (bit % 64));
    c->nhits--;
    return e;
}

/* Some rank has joined: this rank's cache hits that cannot take part in join (anything but
 * allreduce) fail now, whatever the other ranks submitted, so none waits for a rank that will not
 * come (the coordinator does the same for requests on the slow path). */
static void fail_unjoinable_hits(cx_cycle *c)
{
    size_t words = words_for(c->cache.nbits);
    for (size_t w = 0; w < words; w++) {
        for (uint64_t m = c->hit_mask[w]; m; m &= m - 1) {
            size_t b = w * 64 + (size_t)__builtin_ctzll(m);
            const cx_response *r = cx_cache_get(&c->cache, b);
            if (!r || r->coll == CX_ALLREDUCE || !c->hit_entry[b])
                continue;
            cx_entry *e = cx_queue_take(c->env.queue, c->hit_entry[b]->req.name);
            remove_hit(c, b);
            char msg[CX_ERROR_MAX];
            snprintf(msg, sizeof msg, "tensor '%s': %s cannot run while ranks have joined; only "
                     "allreduce takes part in join", r->name, cx_coll_name(r->coll));
            cx_exec_complete(&c->exec, e, CFX_ERR_JOINED, msg);
        }
    }
}

static void mark_invalid(cx_cycle *c, size_t bit)
{
    c->invalid_mask[bit / 64] |= 1ull << (bit % 64);
    c->any_invalid = true;
}

/* Sorts a new entry: cache hit (wait for the others through the bit vector) or a request for the
 * coordinator (miss, invalidated parameters, barrier, join). */
static cfx_status classify(cx_cycle *c, cx_entry *e, double now)
{
    if (e->req.coll == CX_JOIN)
        c->exec.joined = true;
    size_t bit;
    cx_cache_result res = (e->req.coll == CX_JOIN || e->req.coll == CX_BARRIER)
                              ? CX_CACHE_MISS
                              : cx_cache_lookup(&c->cache, &e->req, &bit);
    if (res == CX_CACHE_HIT && !c->hit_entry[bit]) {
        add_hit(c, e, bit, now);
        return CFX_OK;
    }
    if (res == CX_CACHE_INVALID)
        mark_invalid(c, bit);
    return push_unsent(c, e);
}

static cfx_status ensure_vec(cx_cycle *c, size_t words)
{
    if (c->vec_cap >= words)
        return CFX_OK;
    uint64_t *v = realloc(c->vec, words * sizeof *v);
    if (!v)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the bit vector");
    c->vec = v;
    c->vec_cap = words;
    return CFX_OK;
}

/* A copy of cached response `bit` for execution; with joined ranks, collectives other than
 * allreduce fail (every rank knows "someone joined" from the bit vector, so all fail alike). */
static cfx_status cached_response(cx_cycle *c, size_t bit, bool joined_any, cx_response_list *out)
{
    cx_response r;
    if (!cx_response_copy(&r, cx_cache_get(&c->cache, bit)))
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
static cfx_status slow_path(cx_cycle *c, double now, cx_response_list *responses)
{
    const cx_loop_env *env = &c->env;
    cx_transport *t = env->transport;
    cx_request_list mine = {.rank = env->transport->rank, .count = c->nunsent};
    mine.flags = atomic_load(env->shutdown_requested) ? CX_LIST_SHUTDOWN : 0;
    mine.items = malloc((c->nunsent ? c->nunsent : 1) * sizeof *mine.items);
    if (!mine.items)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the request list");
    for (size_t i = 0; i < c->nunsent; i++)
        mine.items[i] = c->unsent[i]->req; /* shallow: encoding only reads */
    cx_bytes bytes = {0};
    cfx_status st = cx_encode_requests(&mine, &bytes);
    free(mine.items);
    c->nunsent = 0;
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
    if (c->is_coordinator) {
        cx_request_list *lists = calloc((size_t)t->size, sizeof *lists);
        cx_response_list decided = {0};
        size_t off = 0;
        st = lists ? CFX_OK : cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for request lists");
        for (int r = 0; !st && r < t->size; r++) {
            st = cx_decode_requests((char *)gathered + off, lens[r], &lists[r]);
            off += lens[r];
        }
        if (!st)
            st = cx_coordinator_process(&c->coord, lists, now, &decided);
        for (size_t i = 0; !st && i < c->stalled.count; i++)
            if (!cx_response_list_push(&decided, &c->stalled.items[i]))
                st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the response list");
        free(c->stalled.items);
        memset(&c->stalled, 0, sizeof c->stalled);
        if (!st && c->tune_pending) { /* autotune: every rank switches after this decode */
            decided.flags |= CX_LIST_TUNED;
            decided.tuned_fusion_threshold = c->tune_next.fusion_threshold;
            decided.tuned_chunk_bytes = c->tune_next.chunk_bytes;
            decided.tuned_cycle_time_ms = c->tune_next.cycle_time_ms;
            c->tune_pending = false;
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
        if (!c->is_coordinator)
            free(answer);
        cx_bytes_free(&encoded);
        return st ? st : bst;
    }
    cx_response_list decided;
    st = cx_decode_responses(answer, answer_len, &decided);
    if (!c->is_coordinator)
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
        if (cx_cache_cacheable(r) && cx_cache_put(&c->cache, r, &bit, &evicted) && evicted != SIZE_MAX) {
            /* A pending hit on a bit that now means another tensor must be negotiated afresh. */
            cx_entry *e = remove_hit(c, evicted);
            if (e)
                st = push_unsent(c, e);
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
static void shutdown_reason(cx_cycle *c, char *buf, size_t size)
{
    const cx_loop_env *env = &c->env;
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

void cx_cycle_fail_all(cx_cycle *c, cfx_status status, const char *reason)
{
    /* Not running from here on, before any waiter can see its handle fail. */
    atomic_store(c->env.running, 0);
    cx_gradsets_fail(c->env.gradsets, status, reason);
    cx_entry *e = cx_queue_close(c->env.queue, reason);
    while (e) {
        cx_entry *next = e->next;
        char msg[CX_ERROR_MAX];
        snprintf(msg, sizeof msg, "tensor '%s' (%s) did not complete: %s", e->req.name,
                 cx_coll_name(e->req.coll), reason);
        cx_exec_complete(&c->exec, e, status, msg);
        e = next;
    }
    memset(c->hit_entry, 0, sizeof *c->hit_entry * (c->cache.capacity ? c->cache.capacity : 1));
    c->nhits = 0;
    c->nunsent = 0;
}

/* Autotune (coordinator): bytes the allreduces of this cycle reduced feed the tuner; a change it
 * asks for goes to every rank with the next slow path (slow_path, CX_LIST_TUNED). */
static void autotune_sample(cx_cycle *c, const cx_response_list *responses)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < responses->count; i++)
        if (responses->items[i].status == CFX_OK && responses->items[i].coll == CX_ALLREDUCE)
            bytes += cx_response_bytes(&responses->items[i]);
    if (cx_autotune_update(c->tuner, cx_now_s(), bytes, &c->tune_next))
        c->tune_pending = true;
}

cfx_status cx_cycle_run(cx_cycle *c, bool *progress, bool *stop)
{
    const cx_loop_env *env = &c->env;
    cx_transport *t = env->transport;
    double now = cx_now_s();
    cfx_status st = CFX_OK;
    *progress = false;

    if (CX_TL_ENABLED && atomic_load_explicit(env->timeline_change, memory_order_relaxed)) {
        c->timeline = env->take_timeline(env->owner); /* cfx_timeline_start/stop, CFX_TIMELINE */
        c->exec.timeline = c->timeline;
        c->coord.timeline = c->timeline;
    }
    for (cx_entry *e = cx_queue_pop_new(env->queue), *next; e; e = next) {
        next = e->next;
        *progress = true;
        if (CX_TL(c->timeline))
            cx_timeline_seen(c->timeline, e->req.name, e->enqueue_time, now);
        if ((st = classify(c, e, now)))
            return st;
    }
    /* Cached tensors the other ranks have not matched for a while go through the coordinator,
     * whose stall inspector can then name the missing ranks. */
    double age_limit = env->cfg->stall_warning_s > 0 ? env->cfg->stall_warning_s / 2 : INFINITY;
    if (c->nhits && env->cfg->stall_timeout_s > 0 && env->cfg->stall_timeout_s / 2 < age_limit)
        age_limit = env->cfg->stall_timeout_s / 2;
    if (c->nhits && isfinite(age_limit)) /* visit only the pending hits, word by word */
        for (size_t w = 0; w < words_for(c->cache.nbits); w++)
            for (uint64_t m = c->hit_mask[w]; m; m &= m - 1) {
                size_t b = w * 64 + (size_t)__builtin_ctzll(m);
                if (now - c->hit_since[b] > age_limit)
                    mark_invalid(c, b);
            }
    if (c->is_coordinator && now - c->last_stall_check >= 0.1) {
        c->last_stall_check = now;
        st = cx_coordinator_check_stalls(&c->coord, now, env->cfg->stall_warning_s,
                                         env->cfg->stall_timeout_s, env->log, &c->stalled);
        if (st)
            return st;
    }

    size_t nbits = c->cache.nbits, words = words_for(nbits);
    size_t gwords = cx_gradsets_words(env->gradsets), nvec = 1 + 2 * words + gwords;
    if ((st = ensure_vec(c, nvec)))
        return st;
    uint64_t *gbits = c->vec + 1 + 2 * words;
    bool attach_mine = cx_gradsets_fill(env->gradsets, gbits, c->exec.joined, now);
    uint64_t status = ~0ull;
    if (atomic_load(env->shutdown_requested))
        status &= ~(uint64_t)STATUS_SHUTDOWN;
    if (c->nunsent || c->stalled.count || c->tune_pending)
        status &= ~(uint64_t)STATUS_UNCACHED;
    if (c->any_invalid)
        status &= ~(uint64_t)STATUS_INVALID;
    if (c->exec.joined)
        status &= ~(uint64_t)STATUS_JOINED;
    if (!c->exec.joined && gwords && cx_gradsets_busy(env->gradsets))
        status &= ~(uint64_t)STATUS_GRADSET_READY;
    if (!attach_mine)
        status &= ~(uint64_t)STATUS_ATTACH_ALL;
    uint64_t *hits = c->vec + 1, *invalid = c->vec + 1 + words;
    c->vec[0] = status;
    if (c->exec.joined) { /* a joined rank agrees to every cached tensor */
        memset(hits, 0, words * sizeof *hits);
        for (size_t b = 0; b < nbits; b++)
            if (cx_cache_get(&c->cache, b))
                hits[b / 64] |= 1ull << (b % 64);
    } else {
        memcpy(hits, c->hit_mask, words * sizeof *hits);
    }
    for (size_t w = 0; w < words; w++)
        invalid[w] = ~c->invalid_mask[w];
    /* On one host the shared-memory layer answers this through its segment (exec/shm_layer.h). */
    if ((st = t->ops->allreduce_and(t, c->vec, nvec)))
        return st;
    status = c->vec[0];
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
            cx_cache_erase(&c->cache, b);
            hits[b / 64] &= ~(1ull << (b % 64));
            cx_entry *e = remove_hit(c, b);
            if (e && (st = push_unsent(c, e)))
                return st;
        }
        memset(c->invalid_mask, 0, words * sizeof *c->invalid_mask);
        c->any_invalid = false;
    }

    cx_response_list responses = {0};
    for (size_t w = 0; w < words && !st; w++) {
        for (uint64_t m = hits[w]; m && !st; m &= m - 1) {
            size_t b = w * 64 + (size_t)__builtin_ctzll(m);
            if (!cx_cache_get(&c->cache, b))
                continue;
            st = cached_response(c, b, joined_any, &responses);
            cx_cache_touch(&c->cache, b);
            remove_hit(c, b);
        }
    }
    if (!st && joined_any && !c->exec.joined)
        fail_unjoinable_hits(c);
    if (!st && (uncached_any || invalid_any))
        st = slow_path(c, now, &responses);
    if (!st && responses.count) {
        *progress = true;
        st = cx_execute(&c->exec, &responses);
        if (c->tuner)
            autotune_sample(c, &responses);
    }
    /* Gradient-set buckets every rank agreed on, after the responses (the same order everywhere). */
    if (!st && (gwords || attach_all))
        st = cx_gradsets_after(env->gradsets, gbits, gradset_ready_any, attach_all, &c->exec,
                               progress);
    if (CX_TL(c->timeline) && *progress && cx_timeline_marks_cycles(c->timeline))
        cx_timeline_cycle(c->timeline, c->cycles++, now, cx_timeline_now());
    cx_response_list_free(&responses);
    if (!st && shutdown_any) {
        char reason[512];
        shutdown_reason(c, reason, sizeof reason);
        /* 3: this rank stops to form its elastic world again (cfx_context_reform). */
        bool reform = atomic_load(env->shutdown_requested) == 3;
        if (reform)
            snprintf(reason + strlen(reason), sizeof reason - strlen(reason),
                     " (the elastic world is being formed again)");
        cx_cycle_fail_all(c, reform ? CFX_ERR_MEMBERSHIP_CHANGED : CFX_ERR_SHUT_DOWN, reason);
        *stop = true;
    }
    if (c->nunsent)
        *progress = true; /* requests moved back from the cache go out next cycle */
    return st;
}

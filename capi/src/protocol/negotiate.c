/* negotiate - the coordinator: readiness, validation, ordering, stalls (see negotiate.h). */
#include "protocol/negotiate.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/compress.h"
#include "observe/timeline.h"

typedef struct cx_pending {
    cx_request *reqs;  /* size entries; reqs[r].name == NULL while rank r has not submitted */
    int count;
    double first_seen;
    double last_warned;
    uint64_t arrival;
} cx_pending;

typedef struct cx_group {
    uint32_t expected;
    cx_response_list held;
} cx_group;

bool cx_response_list_push(cx_response_list *l, cx_response *r)
{
    /* Lists built here hold 8 items, then double at every power of two. */
    size_t n = l->count;
    if (n == 0 || (n >= 8 && (n & (n - 1)) == 0)) {
        size_t ncap = n == 0 ? 8 : n * 2;
        cx_response *items = realloc(l->items, ncap * sizeof *items);
        if (!items) {
            cx_response_free(r);
            return false;
        }
        l->items = items;
    }
    l->items[l->count++] = *r;
    return true;
}

cfx_status cx_coordinator_init(cx_coordinator *c, int size)
{
    memset(c, 0, sizeof *c);
    c->size = size;
    c->last_joined = -1;
    cx_strmap_init(&c->pending);
    cx_strmap_init(&c->groups);
    if (!(c->joined = calloc((size_t)size, sizeof *c->joined)))
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the coordinator");
    return CFX_OK;
}

static void pending_free(cx_pending *p, int size)
{
    for (int r = 0; r < size; r++)
        cx_request_free(&p->reqs[r]);
    free(p->reqs);
    free(p);
}

void cx_coordinator_destroy(cx_coordinator *c)
{
    const char *key;
    void *value;
    for (size_t pos = 0; cx_strmap_next(&c->pending, &pos, &key, &value);)
        pending_free(value, c->size);
    for (size_t pos = 0; cx_strmap_next(&c->groups, &pos, &key, &value);) {
        cx_group *g = value;
        cx_response_list_free(&g->held);
        free(g);
    }
    cx_strmap_destroy(&c->pending);
    cx_strmap_destroy(&c->groups);
    free(c->joined);
    memset(c, 0, sizeof *c);
}

static const char *device_text(int32_t device, char *buf, size_t size)
{
    if (device == CFX_DEVICE_CPU)
        snprintf(buf, size, "CPU");
    else
        snprintf(buf, size, "CUDA device %d", device);
    return buf;
}

/* Sets r to an error response: every rank completes the tensor with this status and message. */
static void fail_response(cx_response *r, cfx_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail_response(cx_response *r, cfx_status status, const char *fmt, ...)
{
    char msg[CX_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->status = status;
    free(r->message);
    r->message = strdup(msg);
}

static bool full_shape_collective(int coll)
{
    return coll == CX_ALLREDUCE || coll == CX_BROADCAST || coll == CX_REDUCESCATTER;
}

/* Compares rank r's request with the first submitter's; false (and r->status set) on mismatch. */
static bool check_against(cx_response *out, const cx_request *a, int ra, const cx_request *b, int rb)
{
    const char *name = a->name;
    char s1[512], s2[512];
    if (a->coll != b->coll) {
        fail_response(out, CFX_ERR_MISMATCH, "tensor '%s': mismatched collective: rank %d submitted "
                      "%s but rank %d submitted %s", name, ra, cx_coll_name(a->coll), rb,
                      cx_coll_name(b->coll));
        return false;
    }
    if (a->dtype != b->dtype) {
        fail_response(out, CFX_ERR_MISMATCH, "tensor '%s': mismatched dtype in %s: rank %d has %s "
                      "but rank %d has %s", name, cx_coll_name(a->coll), ra,
                      cfx_dtype_name(a->dtype), rb, cfx_dtype_name(b->dtype));
        return false;
    }
    /* The kind of memory, not the ordinal: each rank numbers its own GPUs. */
    if (!cx_same_device_kind(a->device, b->device)) {
        fail_response(out, CFX_ERR_MISMATCH, "tensor '%s': mismatched device in %s: rank %d has "
                      "%s but rank %d has %s", name, cx_coll_name(a->coll), ra,
                      device_text(a->device, s1, sizeof s1), rb, device_text(b->device, s2, sizeof s2));
        return false;
    }
    if (a->group_size != b->group_size) {
        fail_response(out, CFX_ERR_MISMATCH, "tensor '%s': mismatched grouping: rank %d submitted it "
                      "in a group of %u tensors but rank %d in a group of %u", name, ra,
                      a->group_size, rb, b->group_size);
        return false;
    }
    if (a->coll == CX_ALLREDUCE || a->coll == CX_REDUCESCATTER) {
        if (a->op != b->op) {
            fail_response(out, CFX_ERR_MISMATCH, "tensor '%s': mismatched reduction op in %s: rank "
                          "%d asked for %s but rank %d for %s", name, cx_coll_name(a->coll), ra,
                          cfx_op_name(a->op), rb, cfx_op_name(b->op));
            return false;
        }
        if (a->prescale != b->prescale || a->postscale != b->postscale) {
            fail_response(out, CFX_ERR_MISMATCH, "tensor '%s': mismatched scale factors in %s: rank "
                          "%d sent (prescale %.17g, postscale %.17g) but rank %d sent (prescale "
                          "%.17g, postscale %.17g)", name, cx_coll_name(a->coll), ra, a->prescale,
                          a->postscale, rb, b->prescale, b->postscale);
            return false;
        }
        if (a->compression != b->compression) {
            fail_response(out, CFX_ERR_MISMATCH, "tensor '%s': mismatched compression in %s: rank "
                          "%d asked for %s but rank %d for %s", name, cx_coll_name(a->coll), ra,
                          cx_compression_name(a->compression), rb,
                          cx_compression_name(b->compression));
            return false;
        }
    }
    if (a->coll == CX_BROADCAST && a->root != b->root) {
        fail_response(out, CFX_ERR_MISMATCH, "tensor '%s': mismatched broadcast root: rank %d named "
                      "root %d but rank %d named root %d", name, ra, a->root, rb, b->root);
        return false;
    }
    bool same = a->ndim == b->ndim;
    int32_t first = full_shape_collective(a->coll) ? 0 : 1;
    for (int32_t i = first; same && i < a->ndim; i++)
        same = a->shape[i] == b->shape[i];
    if (!same) {
        fail_response(out, CFX_ERR_MISMATCH, "tensor '%s': mismatched shape in %s: rank %d has "
                      "shape %s but rank %d has shape %s%s", name, cx_coll_name(a->coll), ra,
                      cx_shape_format(a->ndim, a->shape, s1, sizeof s1), rb,
                      cx_shape_format(b->ndim, b->shape, s2, sizeof s2),
                      first ? " (all dimensions after the first must match)" : "");
        return false;
    }
    return true;
}

/* Builds the response for a ready tensor from the requests of its submitters. */
static cfx_status build_response(cx_coordinator *c, cx_pending *p, cx_response *out)
{
    memset(out, 0, sizeof *out);
    int first = -1;
    for (int r = 0; r < c->size && first < 0; r++)
        if (p->reqs[r].name)
            first = r;
    const cx_request *a = &p->reqs[first];
    out->coll = a->coll;
    out->dtype = a->dtype;
    out->op = a->op;
    out->device = a->device;
    out->root = a->root;
    out->ndim = a->ndim;
    memcpy(out->shape, a->shape, sizeof out->shape);
    out->prescale = a->prescale;
    out->postscale = a->postscale;
    out->compression = a->compression;
    out->group_size = a->group_size;
    out->status = CFX_OK;
    out->last_joined = -1;
    out->name = strdup(a->name);
    out->group = a->group ? strdup(a->group) : NULL;
    if (!out->name || (a->group && !out->group)) {
        cx_response_free(out);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory building a response");
    }
    for (int r = first + 1; r < c->size; r++)
        if (p->reqs[r].name && !check_against(out, a, first, &p->reqs[r], r))
            return CFX_OK;
    if (c->joined_count > 0 && a->coll != CX_ALLREDUCE && a->coll != CX_JOIN) {
        char ranks[256] = "";
        size_t used = 0;
        for (int r = 0; r < c->size && used < sizeof ranks - 16; r++)
            if (c->joined[r] && !p->reqs[r].name)
                used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d", used ? ", " : "", r);
        if (used) {
            fail_response(out, CFX_ERR_JOINED, "tensor '%s': %s cannot run while ranks have joined "
                          "(joined: %s); only allreduce takes part in join", a->name,
                          cx_coll_name(a->coll), ranks);
            return CFX_OK;
        }
    }
    if (a->coll == CX_ALLGATHER) {
        if (!(out->rank_rows = malloc(sizeof(int64_t) * (size_t)c->size))) {
            cx_response_free(out);
            return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory building a response");
        }
        out->nrows = (uint32_t)c->size;
        for (int r = 0; r < c->size; r++)
            out->rank_rows[r] = p->reqs[r].shape[0];
    }
    return CFX_OK;
}

/* Emits a finished response: grouped members are held until their whole group is answered. */
static cfx_status emit(cx_coordinator *c, cx_response *r, cx_response_list *out)
{
    if (!r->group || r->group_size <= 1) {
        if (!cx_response_list_push(out, r))
            return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the response list");
        return CFX_OK;
    }
    cx_group *g = cx_strmap_get(&c->groups, r->group);
    if (!g) {
        if (!(g = calloc(1, sizeof *g)) || !cx_strmap_put(&c->groups, r->group, g)) {
            free(g);
            cx_response_free(r);
            return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for a group");
        }
        g->expected = r->group_size;
    }
    if (!cx_response_list_push(&g->held, r))
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for a group");
    if (g->held.count < g->expected)
        return CFX_OK;
    cx_strmap_remove(&c->groups, g->held.items[0].group);
    cfx_status st = CFX_OK;
    for (size_t i = 0; i < g->held.count; i++)
        if (!cx_response_list_push(out, &g->held.items[i]))
            st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the response list");
    free(g->held.items);
    free(g);
    return st;
}

static bool is_ready(const cx_coordinator *c, const cx_pending *p)
{
    if (p->count + c->joined_count < c->size)
        return false;
    for (int r = 0; r < c->size; r++)
        if (!p->reqs[r].name && !c->joined[r])
            return false;
    return true;
}

/* While ranks have joined, a request other than allreduce cannot run: it is answered (failed) at
 * once. */
static bool unjoinable(const cx_coordinator *c, const cx_pending *p)
{
    if (c->joined_count == 0)
        return false;
    for (int r = 0; r < c->size; r++)
        if (p->reqs[r].name)
            return p->reqs[r].coll != CX_ALLREDUCE;
    return false;
}

static cfx_status answer(cx_coordinator *c, const char *name, cx_pending *p, cx_response_list *out)
{
    cx_response r;
    cfx_status st = build_response(c, p, &r);
    cx_strmap_remove(&c->pending, name);
    pending_free(p, c->size);
    return st == CFX_OK ? emit(c, &r, out) : st;
}

static cfx_status add_request(cx_coordinator *c, int rank, const cx_request *q, double now,
                              cx_response_list *out)
{
    if (q->coll == CX_JOIN) {
        if (!c->joined[rank]) {
            c->joined[rank] = true;
            c->joined_count++;
        }
        c->last_joined = rank;
        return CFX_OK;
    }
    cx_pending *p = cx_strmap_get(&c->pending, q->name);
    if (!p) {
        if (!(p = calloc(1, sizeof *p)) || !(p->reqs = calloc((size_t)c->size, sizeof *p->reqs)) ||
            !cx_strmap_put(&c->pending, q->name, p)) {
            if (p)
                free(p->reqs);
            free(p);
            return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for pending tensor '%s'", q->name);
        }
        p->first_seen = now;
        p->last_warned = now;
        p->arrival = c->arrivals++;
    }
    if (p->reqs[rank].name) /* a rank cannot have two in flight; the queue refuses duplicates */
        return cx_fail(CFX_ERR_INTERNAL, "tensor '%s' submitted twice by rank %d", q->name, rank);
    if (!cx_request_copy(&p->reqs[rank], q))
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for pending tensor '%s'", q->name);
    p->count++;
    if (CX_TL(c->timeline)) { /* the moment the coordinator learns that `rank` is ready */
        char label[32];
        snprintf(label, sizeof label, "rank %d ready", rank);
        cx_timeline_mark(c->timeline, q->name, label, rank, now);
    }
    /* Only allreduce takes part in join: anything else fails at once (build_response names the
     * joined ranks), so ranks whose requests differ (drifted generated names) never wait. */
    if (is_ready(c, p) || unjoinable(c, p))
        return answer(c, q->name, p, out);
    return CFX_OK;
}

/* After joins, tensors waiting only for joined ranks become ready, and those that cannot take part
 * in join fail; answer them in arrival order. */
static cfx_status answer_joined_ready(cx_coordinator *c, cx_response_list *out)
{
    for (;;) {
        const char *key, *best_key = NULL;
        void *value;
        cx_pending *best = NULL;
        for (size_t pos = 0; cx_strmap_next(&c->pending, &pos, &key, &value);) {
            cx_pending *p = value;
            if ((is_ready(c, p) || unjoinable(c, p)) && (!best || p->arrival < best->arrival)) {
                best = p;
                best_key = key;
            }
        }
        if (!best)
            return CFX_OK;
        char *name = strdup(best_key);
        if (!name)
            return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory");
        cfx_status st = answer(c, name, best, out);
        free(name);
        if (st)
            return st;
    }
}

cfx_status cx_coordinator_process(cx_coordinator *c, const cx_request_list *lists, double now,
                                  cx_response_list *out)
{
    int joined_before = c->joined_count;
    for (int r = 0; r < c->size; r++) {
        for (size_t i = 0; i < lists[r].count; i++) {
            cfx_status st = add_request(c, r, &lists[r].items[i], now, out);
            if (st)
                return st;
        }
    }
    if (c->joined_count != joined_before) {
        cfx_status st = answer_joined_ready(c, out);
        if (st)
            return st;
    }
    if (c->joined_count == c->size) {
        cx_response r;
        memset(&r, 0, sizeof r);
        r.coll = CX_JOIN;
        r.status = CFX_OK;
        r.device = CFX_DEVICE_CPU;
        r.last_joined = c->last_joined;
        if (!(r.name = strdup("join")) || !cx_response_list_push(out, &r))
            return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the join response");
        memset(c->joined, 0, sizeof(bool) * (size_t)c->size);
        c->joined_count = 0;
        c->last_joined = -1;
    }
    return CFX_OK;
}

static size_t format_ranks(const cx_coordinator *c, const cx_pending *p, bool present, char *buf,
                           size_t size)
{
    size_t used = 0;
    int listed = 0;
    buf[0] = '\0';
    for (int r = 0; r < c->size && used + 24 < size; r++) {
        bool has = p->reqs[r].name != NULL || c->joined[r];
        if (has != present)
            continue;
        if (listed == 32) {
            used += (size_t)snprintf(buf + used, size - used, ", ...");
            break;
        }
        used += (size_t)snprintf(buf + used, size - used, "%s%d", listed ? ", " : "", r);
        listed++;
    }
    return used;
}

cfx_status cx_coordinator_check_stalls(cx_coordinator *c, double now, double warning_s,
                                       double timeout_s, const cx_logger *log,
                                       cx_response_list *out)
{
    const char *key;
    void *value;
    for (size_t pos = 0; cx_strmap_next(&c->pending, &pos, &key, &value);) {
        cx_pending *p = value;
        double age = now - p->first_seen;
        char ready[512], missing[512];
        int submitter = 0; /* the lowest rank that submitted: a request to describe the tensor */
        while (!p->reqs[submitter].name)
            submitter++;
        if (timeout_s > 0 && age >= timeout_s) {
            format_ranks(c, p, true, ready, sizeof ready);
            format_ranks(c, p, false, missing, sizeof missing);
            cx_response r;
            memset(&r, 0, sizeof r);
            r.coll = p->reqs[submitter].coll;
            r.dtype = p->reqs[submitter].dtype;
            r.device = p->reqs[submitter].device;
            r.last_joined = -1;
            r.name = strdup(key);
            r.group = p->reqs[submitter].group ? strdup(p->reqs[submitter].group) : NULL;
            r.group_size = 0; /* a stalled member fails alone; its group can never complete */
            fail_response(&r, CFX_ERR_STALL, "tensor '%s': stalled for %.1f s (CFX_STALL_TIMEOUT_S=%g): "
                          "submitted by ranks [%s] but never by ranks [%s]", key, age, timeout_s,
                          ready, missing);
            cx_log(log, CX_LOG_ERROR, "stall", "%s", r.message);
            char *name = strdup(key);
            cx_strmap_remove(&c->pending, name ? name : key);
            free(name);
            pending_free(p, c->size);
            if (!r.name || !cx_response_list_push(out, &r))
                return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory reporting a stall");
            pos = 0; /* the map changed: rescan */
            continue;
        }
        if (warning_s > 0 && age >= warning_s && now - p->last_warned >= warning_s) {
            p->last_warned = now;
            format_ranks(c, p, true, ready, sizeof ready);
            format_ranks(c, p, false, missing, sizeof missing);
            cx_log(log, CX_LOG_WARNING, "stall", "tensor '%s' (%s) has waited %.1f s: ready on ranks "
                   "[%s], missing on ranks [%s]. Ranks may be submitting different tensors, or some "
                   "ranks stopped submitting.", key, cx_coll_name(p->reqs[submitter].coll),
                   age, ready, missing);
        }
    }
    return CFX_OK;
}

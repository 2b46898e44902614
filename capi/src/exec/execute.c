/* execute - the collective engine on one rank (see execute.h). */
#include "exec/execute.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/error.h"
#include "base/hugemem.h"
#include "base/split.h"
#include "protocol/fusion.h"
#include "kernels/compress.h"
#include "kernels/reduce.h"
#include "exec/adasum.h"
#include "exec/combine16.h"
#include "exec/shm.h"
#include "observe/timeline.h"

static void parse_fail_test(cx_exec *x);

void cx_exec_init(cx_exec *x, cx_transport *t, const cx_config *cfg, cx_queue *q, cx_handles *h,
                  const cx_logger *log)
{
    memset(x, 0, sizeof *x);
    x->transport = t;
    x->cfg = cfg;
    x->queue = q;
    x->handles = h;
    x->log = log;
    parse_fail_test(x);
}

/* ---- failure agreement (execute.h) ------------------------------------------------------------ */

/* CFX_TEST_FAIL=RANKS:PREFIX[:done] (tests only): the ranks RANKS (comma-separated, 0..63) fail
 * every batch whose first tensor name starts with PREFIX, at its ready agreement, or with ":done"
 * at the done agreement of the device paths. */
static void parse_fail_test(cx_exec *x)
{
    const char *v = getenv("CFX_TEST_FAIL");
    if (!v || !*v)
        return;
    struct cx_fail_test f = {0, CX_AGREE_READY, ""};
    const char *p = v;
    char *end = NULL;
    for (;;) {
        long r = strtol(p, &end, 10);
        if (end == p || r < 0 || r > 63)
            goto bad;
        f.ranks |= 1ull << r;
        p = end;
        if (*p != ',')
            break;
        p++;
    }
    if (*p++ != ':')
        goto bad;
    const char *colon = strchr(p, ':');
    size_t len = colon ? (size_t)(colon - p) : strlen(p);
    if (len == 0 || len >= sizeof f.prefix || (colon && strcmp(colon + 1, "done") != 0))
        goto bad;
    memcpy(f.prefix, p, len);
    f.phase = colon ? CX_AGREE_DONE : CX_AGREE_READY;
    x->fail_test = f;
    return;
bad:
    cx_log(x->log, CX_LOG_ERROR, "execute", "CFX_TEST_FAIL=%s: expected RANKS:PREFIX[:done] "
           "(ranks 0..63, comma-separated); ignored", v);
}

static bool injected(const cx_exec *x, cx_agree_phase phase, const char *name)
{
    const struct cx_fail_test *f = &x->fail_test;
    int r = x->transport->rank;
    return f->prefix[0] && f->phase == (int)phase && r < 64 && ((f->ranks >> r) & 1) && name &&
           strncmp(name, f->prefix, strlen(f->prefix)) == 0;
}

/* What the lowest failing rank tells the others (fixed size: no allocation on any rank). */
typedef struct agree_reason {
    int32_t status;
    char message[1020];
} agree_reason;

/* " (ranks 1, 2 and 5 failed; rank 1's reason)" when more than one rank failed, else "". */
static void list_failed(const uint64_t *ok, int size, int nfailed, char *out, size_t len)
{
    out[0] = '\0';
    if (nfailed < 2)
        return;
    size_t used = (size_t)snprintf(out, len, " (ranks");
    int listed = 0, first = -1;
    for (int r = 0; r < size && used < len; r++) {
        if ((ok[r / 64] >> (r % 64)) & 1)
            continue;
        if (first < 0)
            first = r;
        if (listed == 8) {
            used += (size_t)snprintf(out + used, len - used, " and %d more", nfailed - listed);
            break;
        }
        used += (size_t)snprintf(out + used, len - used, "%s %d", !listed ? "" :
                                 listed == nfailed - 1 ? " and" : ",", r);
        listed++;
    }
    if (used < len)
        snprintf(out + used, len - used, " failed; rank %d's reason)", first);
}

cfx_status cx_exec_agree(cx_exec *x, cfx_status local, cx_agree_phase phase, const char *name,
                         uint32_t *flags)
{
    cx_transport *t = x->transport;
    if (!local && injected(x, phase, name))
        local = cx_fail(CFX_ERR_OUT_OF_MEMORY, "injected failure on rank %d (CFX_TEST_FAIL: "
                        "prefix '%s', %s agreement)", t->rank, x->fail_test.prefix,
                        phase == CX_AGREE_DONE ? "done" : "ready");
    if (t->size == 1)
        return local; /* its message is still this thread's */
    agree_reason why;
    memset(&why, 0, sizeof why);
    if (local) {
        why.status = (int32_t)local;
        snprintf(why.message, sizeof why.message, "%s", cx_error_message());
    }
    int size = t->size;
    size_t nw = ((size_t)size + 63) / 64 + 1; /* a bit per rank, then the flags (inverted: OR) */
    uint64_t words[nw];
    for (size_t i = 0; i < nw; i++)
        words[i] = ~0ull;
    if (local)
        words[t->rank / 64] &= ~(1ull << (t->rank % 64));
    words[nw - 1] = ~(uint64_t)(flags ? *flags : 0);
    cfx_status st = t->ops->allreduce_and(t, words, nw);
    if (st)
        return st;
    if (flags)
        *flags = (uint32_t)~words[nw - 1];
    int first = -1, nfailed = 0;
    for (int r = 0; r < size; r++)
        if (!((words[r / 64] >> (r % 64)) & 1)) {
            first = first < 0 ? r : first;
            nfailed++;
        }
    if (first < 0)
        return CFX_OK;
    if ((st = t->ops->broadcast(t, &why, sizeof why, first)))
        return st;
    why.message[sizeof why.message - 1] = '\0';
    cfx_status agreed = why.status > 0 && why.status <= CFX_ERR_NCCL ? (cfx_status)why.status
                                                                     : CFX_ERR_INTERNAL;
    char others[160];
    list_failed(words, size, nfailed, others, sizeof others);
    return cx_fail(agreed, "rank %d %s%s: %s", first, phase == CX_AGREE_READY ?
                   "could not take part" : "failed after the collective", others, why.message);
}

/* A response whose entry this rank lost (an internal inconsistency): it still takes part in the
 * agreement with this failure, so the peers fail the response too instead of waiting for it. */
static cfx_status lost_entry(const cx_exec *x, const char *name)
{
    return cx_fail(CFX_ERR_INTERNAL, "tensor '%s' missing from the table on rank %d", name,
                   x->transport->rank);
}

/* A device response on an engine without a device path (cx_exec.device_ops unset). */
static cfx_status no_device_path(const cx_response *r)
{
    return cx_fail(CFX_ERR_UNSUPPORTED, "tensor '%s': no device data path in this engine", r->name);
}

void cx_exec_destroy(cx_exec *x)
{
    if (x->device && x->device_ops) /* normally done already by the background thread (loop.c) */
        x->device_ops->destroy(x->device);
    x->device = NULL;
    cx_adasum_free(x->adasum);
    x->adasum = NULL;
    cx_huge_free(x->fusion, x->fusion_cap);
    cx_huge_free(x->scratch, x->scratch_cap);
    cx_huge_free(x->segs, x->segs_cap);
    x->fusion = x->scratch = x->segs = NULL;
    x->fusion_cap = x->scratch_cap = x->segs_cap = 0;
}

void cx_exec_complete(cx_exec *x, cx_entry *e, cfx_status status, const char *message)
{
    if (!e)
        return;
    cx_handles_complete_part(x->handles, e->handle, status, message);
    cx_entry_free(e);
}

/* Grows *buf to at least `bytes` (contents not kept). From 2 MiB on huge pages (hugemem.h): the
 * fusion and scratch buffers are what MPI reduces on the cross-host path. */
static cfx_status reserve(void **buf, size_t *cap, size_t bytes)
{
    if (*cap >= bytes)
        return CFX_OK;
    size_t ncap = *cap ? *cap : 4096;
    while (ncap < bytes)
        ncap *= 2;
    void *p = cx_huge_alloc(ncap);
    if (!p)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for a %zu-byte buffer", ncap);
    cx_huge_free(*buf, *cap);
    *buf = p;
    *cap = ncap;
    return CFX_OK;
}

static size_t elements_per_chunk(const cx_exec *x, size_t esize)
{
    size_t n = (size_t)x->cfg->chunk_bytes / esize;
    return n ? n : 1;
}

/* Deterministic reduce-scatter of one chunk: rank r owns block r, receives every rank's copy of it
 * and reduces them in rank order. `send` holds n elements; `out` receives this rank's block. */
static cfx_status ordered_reduce_scatter(cx_exec *x, const void *send, void *out, const size_t *counts,
                                         cfx_dtype dtype, cfx_reduce_op op)
{
    cx_transport *t = x->transport;
    int size = t->size;
    size_t esize = cfx_dtype_size(dtype);
    size_t mine = counts[t->rank];
    size_t sb[size], sd[size], rb[size], rd[size];
    size_t off = 0;
    for (int j = 0; j < size; j++) {
        sb[j] = counts[j] * esize;
        sd[j] = off;
        off += sb[j];
        rb[j] = mine * esize;
        rd[j] = (size_t)j * mine * esize;
    }
    cfx_status st = reserve(&x->scratch, &x->scratch_cap, mine * esize * (size_t)size);
    if (st)
        return st;
    st = t->ops->alltoallv(t, send, sb, sd, x->scratch, rb, rd);
    if (st)
        return st;
    const char *in = x->scratch;
    memmove(out, in, mine * esize);
    for (int j = 1; j < size; j++)
        cx_reduce_into(out, in + (size_t)j * mine * esize, mine, dtype, op);
    return CFX_OK;
}

/* The ordered path's largest block of a batch of n elements: its first step's (every later step
 * is as long or shorter). */
static size_t ordered_block_elems(const cx_exec *x, size_t n, size_t esize)
{
    size_t size = (size_t)x->transport->size;
    size_t step = elements_per_chunk(x, esize) * size;
    size_t len = n < step ? n : step;
    return (len + size - 1) / size;
}

/* What reduce_chunks' ordered path uses, reserved before the batch's ready agreement so that a
 * failure comes before any collective: x->scratch holds the alltoall's receive area (a block from
 * every rank) and then this rank's reduced block. */
static cfx_status reserve_ordered(cx_exec *x, size_t n, size_t esize)
{
    if (!x->cfg->deterministic || x->transport->size == 1 || n == 0)
        return CFX_OK;
    size_t block = ordered_block_elems(x, n, esize) * esize;
    return reserve(&x->scratch, &x->scratch_cap, block * ((size_t)x->transport->size + 1) + 1);
}

/* reduce_chunks with compression on this leg: each chunk packed into the 16-bit `half` with the
 * prescale fused in, combined over the ranks in float32 and rounded once (exec/combine16.h),
 * unpacked with the postscale fused in. */
static cfx_status compressed_chunks(cx_exec *x, const void *src, void *dst, size_t n,
                                    cfx_dtype dtype, cfx_reduce_op op, double prescale,
                                    double postscale, cfx_dtype half)
{
    cx_transport *t = x->transport;
    size_t esize = cfx_dtype_size(dtype);
    size_t step = elements_per_chunk(x, esize);
    cfx_status st = reserve(&x->scratch, &x->scratch_cap,
                            cx_combine16_bytes(n < step ? n : step, t->size));
    for (size_t off = 0; off < n && !st; off += step) {
        size_t len = n - off < step ? n - off : step;
        void *residual = x->residual ? (char *)x->residual + off * esize : NULL;
        cx_compress_pack(x->scratch, (const char *)src + off * esize, residual, len, dtype, half,
                         prescale);
        st = cx_combine16(t, CX_GROUP_WORLD, x->scratch, len, half, op);
        if (!st)
            cx_compress_unpack((char *)dst + off * esize, x->scratch, len, dtype, half, postscale);
    }
    return st;
}

/* Allreduce of n elements from src into dst (which may be the same), chunk by chunk, with the
 * prescale applied as each chunk is staged and the postscale right after its reduction, while
 * the chunk is still in cache. Deterministic mode reduces every element in rank order (its
 * scratch reserved by reserve_ordered). */
static cfx_status reduce_chunks(cx_exec *x, const void *src, void *dst, size_t n, cfx_dtype dtype,
                                cfx_reduce_op op, double prescale, double postscale, uint8_t wire)
{
    cx_transport *t = x->transport;
    int size = t->size;
    size_t esize = cfx_dtype_size(dtype);
    bool ordered = x->cfg->deterministic && size > 1;
    /* MPI's path crosses hosts whenever the job spans them. */
    int half = ordered || size == 1 ? -1 : cx_compression_leg(wire, dtype, t->cross_size > 1);
    if (half >= 0)
        return compressed_chunks(x, src, dst, n, dtype, op, prescale, postscale, (cfx_dtype)half);
    /* Ordered: each rank owns a chunk-sized block of every step. */
    size_t step = elements_per_chunk(x, esize) * (ordered ? (size_t)size : 1);
    size_t counts[size], bytes[size], displs[size];
    char *block = ordered ? (char *)x->scratch +
                            ordered_block_elems(x, n, esize) * esize * (size_t)size : NULL;
    cfx_status st = CFX_OK;
    for (size_t off = 0; off < n && !st; off += step) {
        size_t len = n - off < step ? n - off : step;
        const char *in = (const char *)src + off * esize;
        char *chunk = (char *)dst + off * esize;
        if (in != chunk)
            cx_scale_copy(chunk, in, len, dtype, prescale);
        else
            cx_scale(chunk, len, dtype, prescale);
        if (size > 1 && !ordered) {
            st = t->ops->allreduce(t, chunk, len, dtype, op);
        } else if (ordered) {
            for (int r = 0; r < size; r++) {
                counts[r] = cx_split_start(len, size, r + 1) - cx_split_start(len, size, r);
                bytes[r] = counts[r] * esize;
                displs[r] = cx_split_start(len, size, r) * esize;
            }
            st = ordered_reduce_scatter(x, chunk, block, counts, dtype, op);
            if (!st)
                st = t->ops->allgatherv(t, block, bytes[t->rank], chunk, bytes, displs);
        }
        if (!st)
            cx_scale(chunk, len, dtype, postscale);
    }
    return st;
}

/* Whether allreduces take the shared-memory path. It combines in rank order, so it keeps the
 * deterministic guarantee on one host; across hosts deterministic mode takes the ordered path. */
static bool use_shm(const cx_exec *x)
{
    return x->shm && (!x->cfg->deterministic || !x->hierarchical);
}

static double final_scale(const cx_exec *x, const cx_response *r)
{
    double f = r->postscale;
    if (r->op == CFX_OP_AVERAGE)
        f /= (double)x->transport->size;
    return f;
}

/* entries == NULL: they could not be listed; each is taken from the table by name. */
static void fail_entries(cx_exec *x, const cx_response *items, size_t n, cx_entry **entries,
                         cfx_status st, const char *msg)
{
    for (size_t i = 0; i < n; i++) {
        cx_entry *e = entries ? entries[i] : cx_queue_take(x->queue, items[i].name);
        if (e)
            cx_exec_complete(x, e, st, msg);
        else if (!x->joined)
            cx_log(x->log, CX_LOG_ERROR, "execute", "tensor '%s' missing from the table", items[i].name);
    }
}

/* Timeline (timeline.h): PACK, ALLREDUCE and UNPACK of a batch, from stamps t[0..3], on the lane
 * of every tensor in it; the collective carries the batch's bytes and tensor count. */
#define TL_STAMP(t, i) do { if (CX_TL(x->timeline)) (t)[i] = cx_timeline_now(); } while (0)
static void timeline_allreduce(cx_exec *x, const cx_response *items, size_t n, const double *t,
                               size_t bytes)
{
    for (size_t i = 0; i < n; i++) {
        cx_timeline_phase(x->timeline, items[i].name, CX_TL_PACK, "PACK", t[0], t[1], -1, 0);
        cx_timeline_phase(x->timeline, items[i].name, CX_TL_COLLECTIVE, "ALLREDUCE", t[1], t[2],
                          (int64_t)bytes, (int64_t)n);
        cx_timeline_phase(x->timeline, items[i].name, CX_TL_UNPACK, "UNPACK", t[2], t[3], -1, 0);
    }
}

/* Timeline: every tensor of the list ends NEGOTIATE as the list starts to run; failures get a mark. */
static void timeline_negotiated(cx_exec *x, const cx_response_list *responses)
{
    double now = cx_timeline_now();
    for (size_t i = 0; i < responses->count; i++) {
        const cx_response *r = &responses->items[i];
        cx_timeline_negotiated(x->timeline, r->name, now);
        if (r->status != CFX_OK)
            cx_timeline_mark(x->timeline, r->name, cfx_status_string((cfx_status)r->status), -1, now);
    }
}

/* Whether `next` continues the `bytes` at `prev` in memory (two NULLs, a joined rank's identity,
 * continue each other too). */
static bool follows(const void *prev, size_t bytes, const void *next)
{
    return prev && next ? (const char *)prev + bytes == (const char *)next : prev == next;
}

/* Appends `count` elements at src/dst (NULL for a joined rank's identity) to the first `n`
 * segments and returns the new number: a tensor that continues the last one in memory, input and
 * output alike, extends it. A gradient set's owned bucket (contiguous on every rank) becomes one
 * segment, however many gradients it holds, and so stays within the direct path's segment limit;
 * the direct path checks that every local rank cut its batch alike (exec/shm.c). */
static size_t add_segment(cx_segment *segs, size_t n, const void *src, void *dst, size_t count,
                          size_t esize)
{
    cx_segment *last = n ? &segs[n - 1] : NULL;
    if (last && follows(last->src, last->count * esize, src) &&
        follows(last->dst, last->count * esize, dst)) {
        last->count += count;
        return n;
    }
    segs[n] = (cx_segment){src, dst, count};
    return n + 1;
}

cfx_status cx_exec_allreduce_host(cx_exec *x, const cx_allreduce_batch *b, double *tl)
{
    const cx_response *items = b->items;
    cx_entry *const *entries = b->entries;
    size_t n = b->n, esize = b->esize, total = b->total;
    cfx_dtype dtype = b->dtype;
    cfx_reduce_op op = b->op;
    double pre = b->prescale, post = b->postscale;
    const char *name = items[0].name;
    uint8_t wire = items[0].compression; /* agreed, the same for the whole batch */
    if (b->local) /* failed before it started: only the agreement */
        return cx_exec_agree(x, b->local, CX_AGREE_READY, name, NULL);
    if (op == CFX_OP_ADASUM) { /* its own data path (adasum.h); across hosts after a host average */
        cx_shm *host = x->shm && x->hierarchical && use_shm(x) ? x->shm : NULL;
        cfx_status st = cx_exec_agree(x, cx_adasum_reserve(&x->adasum, items, entries, n, dtype),
                                      CX_AGREE_READY, name, NULL);
        TL_STAMP(tl, 1);
        if (!st)
            st = cx_adasum_allreduce(x->adasum, x->transport, host, items, entries, n, dtype, pre,
                                     post);
        TL_STAMP(tl, 2);
        return st;
    }
    cfx_status st = CFX_OK;
    if (use_shm(x)) {
        /* Straight from the tensors into shared memory and back: no fusion buffer. */
        size_t nsegs = 0;
        st = reserve(&x->segs, &x->segs_cap, n * sizeof(cx_segment));
        cx_segment *segs = x->segs;
        for (size_t i = 0; !st && i < n; i++)
            nsegs = add_segment(segs, nsegs, entries[i] ? entries[i]->input : NULL,
                                entries[i] ? entries[i]->output : NULL,
                                (size_t)cx_shape_elements(items[i].ndim, items[i].shape), esize);
        st = cx_exec_agree(x, st, CX_AGREE_READY, name, NULL);
        if (!st) {
            TL_STAMP(tl, 1);
            st = cx_shm_allreduce_wire(x->shm, x->transport, segs, nsegs, dtype, op, pre, post,
                                       x->hierarchical, cx_compression_leg(wire, dtype, true),
                                       x->residual);
            TL_STAMP(tl, 2);
            const char *why;
            int direct = cx_shm_direct_state(x->shm, &why);
            if (direct != x->direct_logged) {
                x->direct_logged = direct;
                if (direct > 0)
                    cx_log(x->log, CX_LOG_INFO, "execute", "allreduce path direct: tensors in "
                           "shared tensor memory on every local rank, reduced without copies");
                else
                    cx_log(x->log, CX_LOG_WARNING, "execute", "no direct path for tensors in "
                           "shared tensor memory (%s): they take the copies", why);
            }
        }
    } else if (n == 1 && entries[0]) {
        cx_entry *e = entries[0];
        st = cx_exec_agree(x, reserve_ordered(x, total, esize), CX_AGREE_READY, name, NULL);
        TL_STAMP(tl, 1);
        if (!st)
            st = reduce_chunks(x, e->input, e->output, total, dtype, op, pre, post, wire);
        TL_STAMP(tl, 2);
    } else {
        st = reserve(&x->fusion, &x->fusion_cap, total * esize + 1);
        if (!st)
            st = reserve_ordered(x, total, esize);
        char *buf = x->fusion;
        size_t off = 0;
        for (size_t i = 0; !st && i < n; i++) {
            size_t count = (size_t)cx_shape_elements(items[i].ndim, items[i].shape);
            if (entries[i])
                cx_scale_copy(buf + off * esize, entries[i]->input, count, dtype, pre);
            else /* joined: contribute the identity */
                cx_fill_identity(buf + off * esize, count, dtype, op);
            off += count;
        }
        st = cx_exec_agree(x, st, CX_AGREE_READY, name, NULL);
        TL_STAMP(tl, 1);
        if (!st)
            st = reduce_chunks(x, buf, buf, total, dtype, op, 1.0, 1.0, wire);
        TL_STAMP(tl, 2);
        off = 0;
        for (size_t i = 0; !st && i < n; i++) {
            size_t count = (size_t)cx_shape_elements(items[i].ndim, items[i].shape);
            if (entries[i])
                cx_scale_copy(entries[i]->output, buf + off * esize, count, dtype, post);
            off += count;
        }
    }
    return st;
}

/* One or more fused allreduce responses. */
static cfx_status run_allreduce(cx_exec *x, const cx_response *items, size_t n)
{
    const cx_response *first = &items[0];
    cx_entry *stack_entries[16];
    cx_entry **entries = n <= 16 ? stack_entries : malloc(n * sizeof *entries);
    cx_allreduce_batch b = {items, n, entries, (cfx_dtype)first->dtype, (cfx_reduce_op)first->op,
                            cfx_dtype_size((cfx_dtype)first->dtype), 0, first->prescale,
                            final_scale(x, first), CFX_OK};
    /* A rank that cannot list its entries, or lost one (not joined), still takes part in the
     * batch's ready agreement (b.local), so that every rank fails the batch. */
    if (!entries)
        b.local = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for %zu entries", n);
    for (size_t i = 0; i < n; i++) {
        if (entries) {
            entries[i] = cx_queue_take(x->queue, items[i].name);
            if (!entries[i] && !x->joined && !b.local)
                b.local = lost_entry(x, items[i].name);
        }
        b.total += (size_t)cx_shape_elements(items[i].ndim, items[i].shape);
    }
    double tl[4] = {0};
    TL_STAMP(tl, 0);
    /* Device tensors (the kind is agreed, so every rank takes the same branch): cx_device_ops. */
    cfx_status st = first->device == CFX_DEVICE_CPU ? cx_exec_allreduce_host(x, &b, tl)
                    : x->device_ops                 ? x->device_ops->allreduce(x, &b, tl)
                                                    : no_device_path(first);
    TL_STAMP(tl, 3);
    if (CX_TL(x->timeline) && !st)
        timeline_allreduce(x, items, n, tl, b.total * b.esize);
    if (st) {
        char msg[CX_ERROR_MAX];
        snprintf(msg, sizeof msg, "allreduce of tensor '%s'%s failed: %s", first->name,
                 n > 1 ? " and the tensors fused with it" : "", cx_error_message());
        fail_entries(x, items, n, entries, st, msg);
    } else {
        for (size_t i = 0; i < n; i++)
            cx_exec_complete(x, entries[i], CFX_OK, NULL);
    }
    if (entries != stack_entries)
        free(entries);
    return st;
}

static size_t row_bytes(const cx_response *r)
{
    size_t b = cfx_dtype_size(r->dtype);
    for (int32_t i = 1; i < r->ndim; i++)
        b *= (size_t)r->shape[i];
    return b;
}

static void set_output(cx_exec *x, cx_entry *e, void *data, size_t bytes, const cx_response *r,
                       int64_t rows, int64_t *splits)
{
    cx_output o;
    memset(&o, 0, sizeof o);
    o.data = data;
    o.bytes = bytes;
    o.dtype = r->dtype;
    o.ndim = r->ndim;
    memcpy(o.shape, r->shape, sizeof o.shape);
    o.shape[0] = rows;
    o.splits = splits;
    cx_handles_set_output(x->handles, e->handle, e->part, &o);
}

static cfx_status run_allgather(cx_exec *x, const cx_response *r, cx_entry *e)
{
    cx_transport *t = x->transport;
    int size = t->size;
    size_t rb = row_bytes(r);
    size_t bytes[size], displs[size];
    size_t total = 0;
    int64_t rows = 0;
    int64_t *splits = malloc(sizeof(int64_t) * (size_t)size);
    for (int j = 0; j < size; j++) {
        bytes[j] = (size_t)r->rank_rows[j] * rb;
        displs[j] = total;
        total += bytes[j];
        rows += r->rank_rows[j];
        if (splits)
            splits[j] = r->rank_rows[j];
    }
    void *out = malloc(total ? total : 1);
    cfx_status st = !e ? lost_entry(x, r->name)
                    : out && splits ? CFX_OK
                                    : cx_fail(CFX_ERR_OUT_OF_MEMORY, "allgather of tensor '%s': "
                                              "out of memory for %zu output bytes", r->name, total);
    st = cx_exec_agree(x, st, CX_AGREE_READY, r->name, NULL);
    if (!st)
        st = t->ops->allgatherv(t, e->input, bytes[t->rank], out, bytes, displs);
    if (st) {
        free(out);
        free(splits);
        return st;
    }
    set_output(x, e, out, total, r, rows, splits);
    return CFX_OK;
}

static cfx_status run_alltoall(cx_exec *x, const cx_response *r, cx_entry *e)
{
    cx_transport *t = x->transport;
    int size = t->size;
    size_t rb = row_bytes(r);
    int64_t *recv_rows = malloc(sizeof(int64_t) * (size_t)size);
    cfx_status st = !e ? lost_entry(x, r->name)
                    : recv_rows ? CFX_OK
                                : cx_fail(CFX_ERR_OUT_OF_MEMORY, "alltoall of tensor '%s': out of "
                                          "memory", r->name);
    size_t eight[size], sd[size], sb[size], rbytes[size], rd[size];
    for (int j = 0; j < size; j++) {
        eight[j] = sizeof(int64_t);
        sd[j] = rd[j] = (size_t)j * sizeof(int64_t);
    }
    st = cx_exec_agree(x, st, CX_AGREE_READY, r->name, NULL);
    if (!st)
        st = t->ops->alltoallv(t, e->splits, eight, sd, recv_rows, eight, rd);
    if (st) {
        free(recv_rows);
        return st;
    }
    /* The row counts came in: the output is allocated, and agreed on, before the data moves. */
    size_t soff = 0, roff = 0;
    for (int j = 0; !st && j < size; j++) {
        sb[j] = (size_t)e->splits[j] * rb;
        sd[j] = soff;
        soff += sb[j];
        if (recv_rows[j] < 0)
            st = cx_fail(CFX_ERR_INTERNAL, "alltoall of tensor '%s': rank %d announced %lld rows",
                         r->name, j, (long long)recv_rows[j]);
        rbytes[j] = (size_t)recv_rows[j] * rb;
        rd[j] = roff;
        roff += rbytes[j];
    }
    void *out = st ? NULL : malloc(roff ? roff : 1);
    if (!st && !out)
        st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "alltoall of tensor '%s': out of memory for %zu bytes",
                     r->name, roff);
    st = cx_exec_agree(x, st, CX_AGREE_READY, r->name, NULL);
    if (!st)
        st = t->ops->alltoallv(t, e->input, sb, sd, out, rbytes, rd);
    if (st) {
        free(out);
        free(recv_rows);
        return st;
    }
    int64_t rows = 0;
    for (int j = 0; j < size; j++)
        rows += recv_rows[j];
    set_output(x, e, out, roff, r, rows, recv_rows);
    return CFX_OK;
}

/* Rows rank r receives from a reducescatter of d0 rows over size ranks. */
static int64_t scatter_rows(int64_t d0, int size, int r)
{
    return d0 / size + (r < d0 % size ? 1 : 0);
}

static cfx_status run_reducescatter(cx_exec *x, const cx_response *r, cx_entry *e)
{
    cx_transport *t = x->transport;
    int size = t->size;
    cfx_dtype dtype = (cfx_dtype)r->dtype;
    size_t esize = cfx_dtype_size(dtype);
    size_t row_elems = row_bytes(r) / esize;
    size_t counts[size];
    size_t total = 0;
    for (int j = 0; j < size; j++) {
        counts[j] = (size_t)scatter_rows(r->shape[0], size, j) * row_elems;
        total += counts[j];
    }
    size_t mine = counts[t->rank];
    void *out = malloc(mine * esize + 1);
    void *send = e ? e->input : NULL;
    void *scaled = NULL;
    cfx_status st = !e ? lost_entry(x, r->name)
                    : out ? CFX_OK
                          : cx_fail(CFX_ERR_OUT_OF_MEMORY, "reducescatter of tensor '%s': out of "
                                    "memory", r->name);
    if (!st && r->prescale != 1.0) {
        if (!(scaled = malloc(total * esize + 1)))
            st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "reducescatter of tensor '%s': out of memory", r->name);
        else
            cx_scale_copy(scaled, e->input, total, dtype, r->prescale);
        send = scaled;
    }
    if (!st && x->cfg->deterministic && size > 1) /* the ordered path's receive area */
        st = reserve(&x->scratch, &x->scratch_cap, mine * esize * (size_t)size + 1);
    st = cx_exec_agree(x, st, CX_AGREE_READY, r->name, NULL);
    if (!st) {
        if (size == 1)
            memcpy(out, send, mine * esize);
        else if (x->cfg->deterministic)
            st = ordered_reduce_scatter(x, send, out, counts, dtype, (cfx_reduce_op)r->op);
        else
            st = t->ops->reduce_scatter(t, send, out, counts, dtype, (cfx_reduce_op)r->op);
    }
    free(scaled);
    if (st) {
        free(out);
        return st;
    }
    cx_scale(out, mine, dtype, final_scale(x, r));
    set_output(x, e, out, mine * esize, r, scatter_rows(r->shape[0], size, t->rank), NULL);
    return CFX_OK;
}

/* Several allgathers as one allgatherv: each rank sends its inputs back to back; each output is
 * then assembled from every rank's part. */
static cfx_status run_allgather_fused(cx_exec *x, const cx_response *items, size_t n)
{
    cx_transport *t = x->transport;
    int size = t->size;
    cx_entry **entries = calloc(n, sizeof *entries);
    size_t *rb = calloc(n, sizeof *rb);
    char **outs = calloc(n, sizeof *outs); /* every output, allocated before the agreement */
    int64_t **splits = calloc(n, sizeof *splits);
    size_t bytes[size], displs[size];
    cfx_status st = entries && rb && outs && splits ? CFX_OK
                                                    : cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; entries && i < n; i++) {
        entries[i] = cx_queue_take(x->queue, items[i].name);
        if (!entries[i] && !st)
            st = lost_entry(x, items[i].name);
    }
    size_t total = 0;
    for (int r = 0; !st && r < size; r++) {
        bytes[r] = 0;
        for (size_t i = 0; i < n; i++)
            bytes[r] += (size_t)items[i].rank_rows[r] * row_bytes(&items[i]);
        displs[r] = total;
        total += bytes[r];
    }
    char *send = NULL, *recv = NULL;
    if (!st) {
        send = malloc(bytes[t->rank] + 1);
        recv = malloc(total + 1);
        if (!send || !recv)
            st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for a fused allgather of %zu bytes", total);
    }
    for (size_t i = 0; !st && i < n; i++) {
        rb[i] = row_bytes(&items[i]);
        outs[i] = malloc(cx_allgather_bytes(&items[i]) + 1);
        splits[i] = malloc(sizeof(int64_t) * (size_t)size);
        if (!outs[i] || !splits[i])
            st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for allgather output '%s'", items[i].name);
    }
    size_t off = 0;
    for (size_t i = 0; !st && i < n; i++) {
        size_t b = (size_t)items[i].rank_rows[t->rank] * rb[i];
        if (b)
            memcpy(send + off, entries[i]->input, b);
        off += b;
    }
    st = cx_exec_agree(x, st, CX_AGREE_READY, items[0].name, NULL);
    if (!st)
        st = t->ops->allgatherv(t, send, bytes[t->rank], recv, bytes, displs);
    size_t part[size]; /* read position within each rank's part of recv */
    for (int r = 0; r < size; r++)
        part[r] = 0;
    for (size_t i = 0; !st && i < n; i++) {
        size_t o = 0;
        int64_t rows = 0;
        for (int r = 0; r < size; r++) {
            size_t b = (size_t)items[i].rank_rows[r] * rb[i];
            if (b)
                memcpy(outs[i] + o, recv + displs[r] + part[r], b);
            part[r] += b;
            o += b;
            splits[i][r] = items[i].rank_rows[r];
            rows += splits[i][r];
        }
        set_output(x, entries[i], outs[i], cx_allgather_bytes(&items[i]), &items[i], rows, splits[i]);
        outs[i] = NULL;
        splits[i] = NULL;
    }
    free(send);
    free(recv);
    char msg[CX_ERROR_MAX];
    if (st)
        snprintf(msg, sizeof msg, "allgather of tensor '%s' and the tensors fused with it failed: %s",
                 items[0].name, cx_error_message());
    for (size_t i = 0; i < n; i++) {
        cx_exec_complete(x, entries ? entries[i] : cx_queue_take(x->queue, items[i].name), st,
                         st ? msg : NULL);
        if (outs)
            free(outs[i]);
        if (splits)
            free(splits[i]);
    }
    free(entries);
    free(rb);
    free(outs);
    free(splits);
    return st;
}

cfx_status cx_exec_single_host(cx_exec *x, const cx_response *r, cx_entry *e)
{
    cx_transport *t = x->transport;
    cfx_status st;
    switch (r->coll) {
    case CX_BROADCAST:
        st = cx_exec_agree(x, e ? CFX_OK : lost_entry(x, r->name), CX_AGREE_READY, r->name, NULL);
        return st || t->size == 1 ? st : t->ops->broadcast(t, e->input, e->bytes, r->root);
    case CX_ALLGATHER:
        return run_allgather(x, r, e);
    case CX_ALLTOALL:
        return run_alltoall(x, r, e);
    case CX_REDUCESCATTER:
        return run_reducescatter(x, r, e);
    case CX_BARRIER:
        return t->size == 1 ? CFX_OK : t->ops->barrier(t);
    case CX_JOIN: /* no communication */
        if (e)
            cx_handles_set_join_rank(x->handles, e->handle, r->last_joined);
        x->joined = false;
        return e ? CFX_OK : lost_entry(x, r->name);
    default:
        return cx_fail(CFX_ERR_INTERNAL, "tensor '%s': unknown collective %d", r->name, r->coll);
    }
}

cfx_status cx_execute(cx_exec *x, const cx_response_list *responses)
{
    cfx_status failure = CFX_OK;
    if (CX_TL(x->timeline))
        timeline_negotiated(x, responses);
    for (size_t i = 0; i < responses->count;) {
        const cx_response *r = &responses->items[i];
        if (r->status != CFX_OK) {
            cx_exec_complete(x, cx_queue_take(x->queue, r->name), (cfx_status)r->status, r->message);
            i++;
            continue;
        }
        if (r->coll == CX_ALLREDUCE) {
            /* The shared-memory path reads every tensor where it lies, so large tensors fuse as
             * freely as small ones: chunks then run across tensor boundaries, and no tensor's tail
             * is a short chunk of its own. Elsewhere the fusion buffer would copy them. */
            int64_t cap = use_shm(x) && r->device == CFX_DEVICE_CPU ? INT64_MAX : x->cfg->chunk_bytes;
            size_t n = cx_fusion_batch(responses->items, responses->count, i,
                                       x->cfg->fusion_threshold, cap);
            cfx_status st = run_allreduce(x, r, n);
            if (st == CFX_ERR_TRANSPORT && !failure)
                failure = st;
            i += n;
            continue;
        }
        if (r->coll == CX_ALLGATHER && r->device == CFX_DEVICE_CPU) { /* device: one at a time */
            size_t n = cx_fusion_batch(responses->items, responses->count, i,
                                       x->cfg->fusion_threshold, x->cfg->chunk_bytes);
            if (n > 1) {
                cfx_status st = run_allgather_fused(x, r, n);
                if (st == CFX_ERR_TRANSPORT && !failure)
                    failure = st;
                i += n;
                continue;
            }
        }
        cx_entry *e = cx_queue_take(x->queue, r->name);
        i++;
        double tl[2] = {0};
        TL_STAMP(tl, 0);
        /* A lost entry (e == NULL) still takes part, so the peers fail the response with it. */
        cfx_status st = r->device == CFX_DEVICE_CPU ? cx_exec_single_host(x, r, e)
                        : x->device_ops             ? x->device_ops->single(x, r, e)
                                                    : no_device_path(r);
        TL_STAMP(tl, 1);
        if (!e) {
            cx_log(x->log, CX_LOG_ERROR, "execute", "tensor '%s' (%s) missing from the table",
                   r->name, cx_coll_name(r->coll));
            if (st == CFX_ERR_TRANSPORT && !failure)
                failure = st;
            continue;
        }
        if (CX_TL(x->timeline))
            cx_timeline_phase(x->timeline, r->name, CX_TL_COLLECTIVE, cx_timeline_coll_label(r->coll),
                              tl[0], tl[1], (int64_t)e->bytes, 1);
        if (st) {
            char msg[CX_ERROR_MAX];
            snprintf(msg, sizeof msg, "%s of tensor '%s' failed: %s", cx_coll_name(r->coll), r->name,
                     cx_error_message());
            cx_exec_complete(x, e, st, msg);
            if (st == CFX_ERR_TRANSPORT && !failure)
                failure = st;
        } else {
            cx_exec_complete(x, e, CFX_OK, NULL);
        }
    }
    return failure;
}

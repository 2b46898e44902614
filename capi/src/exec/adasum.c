/* adasum - the Adasum allreduce over point to point (see adasum.h). */
#include "exec/adasum.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/error.h"
#include "base/split.h"
#include "kernels/dot.h"
#include "kernels/reduce.h"

struct cx_adasum {
    char *buf;          /* a fused batch, packed (one tensor alone is reduced in its output) */
    size_t buf_cap;
    char *recv;         /* the partner's piece: half of the current range, or all of it (fold) */
    size_t recv_cap;
    size_t *offs;       /* n + 1 tensor offsets in elements */
    double *dots;       /* 3 per tensor: a.b, |a|^2, |b|^2 (a: the left vector), then as many to
                           receive into */
    size_t ntensors_cap;
};

/* One run: the ranks of `group` that take part (count of them, this rank is `index`), and
 * whether each level's dot products are summed over this host's ranks too (hierarchical). */
typedef struct run {
    cx_transport *t;
    cx_adasum *a;
    cfx_dtype dtype;
    size_t esize, n;
    char *work;         /* the batch: tensor i is elements [offs[i], offs[i + 1]) */
    cx_group group;
    int count, index;
    cx_shm *local_dots; /* hierarchical: the segment that sums each level's dot products over
                           this host's ranks too; else NULL */
} run;

static cfx_status grow(void **p, size_t *cap, size_t bytes)
{
    if (*cap >= bytes && *p)
        return CFX_OK;
    void *q = malloc(bytes ? bytes : 1);
    if (!q)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "Adasum: out of memory for a %zu-byte buffer", bytes);
    free(*p);
    *p = q;
    *cap = bytes;
    return CFX_OK;
}

cfx_status cx_adasum_reserve(cx_adasum **ap, const cx_response *items, cx_entry *const *entries,
                             size_t n, cfx_dtype dtype)
{
    if (!cx_dot_dtype_ok(dtype))
        return cx_fail(CFX_ERR_UNSUPPORTED, "tensor '%s': Adasum reduces float16, bfloat16, "
                       "float32 and float64 tensors, not %s", items[0].name, cfx_dtype_name(dtype));
    if (!*ap && !(*ap = calloc(1, sizeof **ap)))
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "Adasum: out of memory");
    cx_adasum *a = *ap;
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += (size_t)cx_shape_elements(items[i].ndim, items[i].shape);
    size_t bytes = total * cfx_dtype_size(dtype);
    cfx_status st = grow((void **)&a->recv, &a->recv_cap, bytes);
    if (!st && !(n == 1 && entries[0])) /* see cx_adasum_allreduce */
        st = grow((void **)&a->buf, &a->buf_cap, bytes);
    if (!st && (a->ntensors_cap < n || !a->offs)) {
        size_t *offs = malloc((n + 1) * sizeof *offs);
        double *dots = malloc(6 * n * sizeof *dots);
        if (!offs || !dots) {
            free(offs);
            free(dots);
            return cx_fail(CFX_ERR_OUT_OF_MEMORY, "Adasum: out of memory for %zu tensors", n);
        }
        free(a->offs);
        free(a->dots);
        a->offs = offs;
        a->dots = dots;
        a->ntensors_cap = n;
    }
    return st;
}

void cx_adasum_free(cx_adasum *a)
{
    if (!a)
        return;
    free(a->buf);
    free(a->recv);
    free(a->offs);
    free(a->dots);
    free(a);
}

static int pow2_floor(int n)
{
    int p = 1;
    while (p <= n / 2)
        p *= 2;
    return p;
}

/* vals[0..k) summed, in place, over the members base .. base + width - 1 of group g (this rank
 * is member idx): the same bits on every member (recursive doubling adds pairs, and x + y is
 * y + x; members beyond the largest power of two fold in first and get the sum back). */
static cfx_status group_sum(cx_transport *t, cx_group g, int base, int width, int idx,
                            double *vals, double *tmp, size_t k)
{
    if (width <= 1)
        return CFX_OK;
    int rel = idx - base, p = pow2_floor(width), extra = width - p;
    size_t bytes = k * sizeof *vals;
    cfx_status st;
    if (rel >= p) {
        st = t->ops->sendrecv(t, g, vals, bytes, base + rel - p, NULL, 0, -1);
        return st ? st : t->ops->sendrecv(t, g, NULL, 0, -1, vals, bytes, base + rel - p);
    }
    if (rel < extra) {
        if ((st = t->ops->sendrecv(t, g, NULL, 0, -1, tmp, bytes, base + rel + p)))
            return st;
        for (size_t i = 0; i < k; i++)
            vals[i] += tmp[i];
    }
    for (int d = 1; d < p; d <<= 1) {
        int peer = base + (rel ^ d);
        if ((st = t->ops->sendrecv(t, g, vals, bytes, peer, tmp, bytes, peer)))
            return st;
        for (size_t i = 0; i < k; i++)
            vals[i] += tmp[i];
    }
    return rel < extra ? t->ops->sendrecv(t, g, vals, bytes, base + rel + p, NULL, 0, -1) : CFX_OK;
}

/* The first tensor that ends after element lo. */
static size_t first_tensor(const run *r, size_t lo)
{
    size_t l = 0, h = r->n; /* offs[i + 1] > lo for the answer */
    while (l < h) {
        size_t m = l + (h - l) / 2;
        if (r->a->offs[m + 1] > lo)
            h = m;
        else
            l = m + 1;
    }
    return l;
}

/* Combines elements [lo, hi): this rank's at work + lo with the partner's in recv (from its
 * start). `mine_left`: this rank's piece belongs to the left vector. The partial dot products
 * are summed over the members [base, base + width) of the run's group (and the host's ranks in a
 * hierarchical run) before any element changes. */
static cfx_status combine(run *r, size_t lo, size_t hi, bool mine_left, int base, int width)
{
    cx_adasum *a = r->a;
    size_t es = r->esize;
    double *dots = a->dots, *tmp = a->dots + 3 * r->n;
    memset(dots, 0, 3 * r->n * sizeof *dots);
    const char *mine = r->work + lo * es, *theirs = a->recv;
    for (size_t i = first_tensor(r, lo); i < r->n && a->offs[i] < hi; i++) {
        size_t s = a->offs[i] > lo ? a->offs[i] : lo;
        size_t e = a->offs[i + 1] < hi ? a->offs[i + 1] : hi;
        const char *pm = mine + (s - lo) * es, *pt = theirs + (s - lo) * es;
        cx_dot3(mine_left ? pm : pt, mine_left ? pt : pm, e - s, r->dtype, &dots[3 * i]);
    }
    cfx_status st = CFX_OK;
    if (r->local_dots) {
        cx_segment host = {dots, dots, 3 * r->n};
        st = cx_shm_allreduce(r->local_dots, r->t, &host, 1, CFX_FLOAT64, CFX_OP_SUM, 1.0, 1.0,
                              false);
    }
    if (!st)
        st = group_sum(r->t, r->group, base, width, r->index, dots, tmp, 3 * r->n);
    if (st)
        return st;
    for (size_t i = first_tensor(r, lo); i < r->n && a->offs[i] < hi; i++) {
        size_t s = a->offs[i] > lo ? a->offs[i] : lo;
        size_t e = a->offs[i + 1] < hi ? a->offs[i + 1] : hi;
        double ab = dots[3 * i], aa = dots[3 * i + 1], bb = dots[3 * i + 2];
        double ca = aa > 0 ? 1.0 - ab / (2.0 * aa) : 1.0;
        double cb = bb > 0 ? 1.0 - ab / (2.0 * bb) : 1.0;
        char *pm = r->work + s * es;
        const char *pt = theirs + (s - lo) * es;
        if (mine_left)
            cx_axpby(pm, ca, pm, cb, pt, e - s, r->dtype);
        else
            cx_axpby(pm, ca, pt, cb, pm, e - s, r->dtype);
    }
    return CFX_OK;
}

/* Steps 1-4 of adasum.h on elements [lo0, hi0) of the batch. */
static cfx_status tree(run *r, size_t lo0, size_t hi0)
{
    cx_transport *t = r->t;
    cx_group g = r->group;
    int me = r->index, p = pow2_floor(r->count), extra = r->count - p;
    size_t es = r->esize;
    char *whole = r->work + lo0 * es;
    size_t bytes = (hi0 - lo0) * es;
    cfx_status st = CFX_OK;
    if (r->count <= 1)
        return CFX_OK;
    if (me >= p) { /* folded in: the partner reduces for this rank */
        st = t->ops->sendrecv(t, g, whole, bytes, me - p, NULL, 0, -1);
        return st ? st : t->ops->sendrecv(t, g, NULL, 0, -1, whole, bytes, me - p);
    }
    if (me < extra) {
        st = t->ops->sendrecv(t, g, NULL, 0, -1, r->a->recv, bytes, me + p);
        if (!st)
            st = combine(r, lo0, hi0, true, me, 1);
    }
    size_t lo = lo0, len = hi0 - lo0;
    size_t saved_lo[32], saved_len[32];
    int depth = 0;
    for (int level = 1; level < p && !st; level <<= 1, depth++) {
        size_t first = len / 2, second = len - first;
        int peer = me ^ level;
        bool left = !(me & level);
        size_t keep_lo = left ? lo : lo + first, keep_len = left ? first : second;
        size_t give_lo = left ? lo + first : lo, give_len = left ? second : first;
        st = t->ops->sendrecv(t, g, r->work + give_lo * es, give_len * es, peer, r->a->recv,
                              keep_len * es, peer);
        saved_lo[depth] = lo;
        saved_len[depth] = len;
        lo = keep_lo;
        len = keep_len;
        if (!st)
            st = combine(r, lo, lo + len, left, me & ~(2 * level - 1), 2 * level);
    }
    for (int level = p / 2; level >= 1 && !st; level >>= 1) {
        depth--;
        bool left = !(me & level);
        size_t other_lo = left ? lo + len : saved_lo[depth];
        size_t other_len = saved_len[depth] - len;
        st = t->ops->sendrecv(t, g, r->work + lo * es, len * es, me ^ level,
                              r->work + other_lo * es, other_len * es, me ^ level);
        lo = saved_lo[depth];
        len = saved_len[depth];
    }
    if (!st && me < extra)
        st = t->ops->sendrecv(t, g, whole, bytes, me + p, NULL, 0, -1);
    return st;
}

cfx_status cx_adasum_allreduce(cx_adasum *a, cx_transport *t, cx_shm *shm,
                               const cx_response *items, cx_entry *const *entries, size_t n,
                               cfx_dtype dtype, double prescale, double postscale)
{
    if (!cx_transport_has(t, CX_TRANSPORT_SENDRECV))
        return cx_fail(CFX_ERR_UNSUPPORTED, "tensor '%s': Adasum needs point to point, which the "
                       "%s transport lacks", items[0].name, t->ops->name);
    size_t es = cfx_dtype_size(dtype), total = 0;
    for (size_t i = 0; i < n; i++) {
        a->offs[i] = total;
        total += (size_t)cx_shape_elements(items[i].ndim, items[i].shape);
    }
    a->offs[n] = total;
    /* A tensor alone is reduced where its result goes; a fused batch in the buffer. */
    bool alone = n == 1 && entries[0];
    char *work = alone ? entries[0]->output : a->buf;
    for (size_t i = 0; i < n; i++) {
        char *dst = work + a->offs[i] * es;
        size_t count = a->offs[i + 1] - a->offs[i];
        if (!count)
            continue;
        if (!entries[i])
            memset(dst, 0, count * es);
        else if (entries[i]->input == dst)
            cx_scale(dst, count, dtype, prescale);
        else
            cx_scale_copy(dst, entries[i]->input, count, dtype, prescale);
    }
    run r = {t, a, dtype, es, n, work, CX_GROUP_WORLD, t->size, t->rank, NULL};
    cfx_status st = CFX_OK;
    if (total && shm && t->cross_size > 1) {
        cx_segment all = {work, work, total};
        st = cx_shm_allreduce(shm, t, &all, 1, dtype, CFX_OP_SUM, 1.0, 1.0 / t->local_size, false);
        r.group = CX_GROUP_CROSS;
        r.count = t->cross_size;
        r.index = t->cross_rank;
        r.local_dots = t->local_size > 1 ? shm : NULL;
        if (!st)
            st = tree(&r, cx_split_start(total, t->local_size, t->local_rank),
                      cx_split_start(total, t->local_size, t->local_rank + 1));
        if (!st)
            st = cx_shm_allgather_blocks(shm, work, total, es); /* the host's shards */
    } else if (total) {
        st = tree(&r, 0, total);
    }
    if (st)
        return st;
    for (size_t i = 0; i < n; i++) {
        char *src = work + a->offs[i] * es;
        size_t count = a->offs[i + 1] - a->offs[i];
        if (!entries[i] || !count)
            continue;
        if (entries[i]->output == src)
            cx_scale(src, count, dtype, postscale);
        else
            cx_scale_copy(entries[i]->output, src, count, dtype, postscale);
    }
    return CFX_OK;
}

/* shm_copy - the copy path of the host segment's allreduce and the dispatch of a batch between it
 * and the direct path (shm.h: cx_shm_allreduce, cx_shm_allreduce_wire): the tensors are copied
 * into the local ranks' slots chunk by chunk, each rank reduces its block of a chunk in local-rank
 * order (its own block straight from its tensors unless staged), copies it out at once, and the
 * other blocks after the next barrier: one barrier a chunk; across hosts each block crosses
 * between its reduction and its copy out, pipelined where the transport posts the call. */
#include <stdlib.h>
#include <string.h>

#include "exec/shm_barrier.h"
#include "exec/shm_cross.h"
#include "kernels/reduce.h"

/* A position in a segment list, advanced as chunks are copied in or out. */
typedef struct cursor {
    size_t seg, pos; /* segment index, elements consumed within it */
} cursor;

/* What to do with each stretch (the part of a chunk inside one segment) of a walk. */
typedef enum { WALK_SKIP, WALK_COPY_IN, WALK_COPY_OUT, WALK_REDUCE_OWN } walk_kind;
typedef struct walk_op {
    walk_kind kind;
    uint8_t *buf;           /* COPY_IN: destination; COPY_OUT: source; REDUCE_OWN: the result */
    const uint8_t *other;   /* REDUCE_OWN: NULL: res (op)= own; else res = other (op) own, or
                             * own (op) other with own_first */
    bool own_first;
    cfx_dtype dtype;
    cfx_reduce_op op;
    double factor;          /* COPY_IN: prescale; COPY_OUT: postscale */
} walk_op;

/* Applies `w` to the next `count` elements of the segments, stretch by stretch, and advances the
 * cursor past them. A joined rank's missing source reads as the op's identity; a missing
 * destination is skipped. */
static void walk(const cx_segment *segs, cursor *c, size_t count, const walk_op *w)
{
    size_t esize = cfx_dtype_size(w->dtype), at = 0;
    while (count) {
        const cx_segment *g = &segs[c->seg];
        size_t n = g->count - c->pos < count ? g->count - c->pos : count;
        const uint8_t *src = g->src ? (const uint8_t *)g->src + c->pos * esize : NULL;
        uint8_t *dst = g->dst ? (uint8_t *)g->dst + c->pos * esize : NULL;
        uint8_t *buf = w->buf + at * esize;
        switch (w->kind) {
        case WALK_SKIP:
            break;
        case WALK_COPY_IN:
            if (src)
                cx_scale_copy(buf, src, n, w->dtype, w->factor);
            else
                cx_fill_identity(buf, n, w->dtype, w->op);
            break;
        case WALK_COPY_OUT:
            if (dst)
                cx_scale_copy(dst, buf, n, w->dtype, w->factor);
            break;
        case WALK_REDUCE_OWN: /* only where every source is present (not staged) */
            if (!w->other)
                cx_reduce_into(buf, src, n, w->dtype, w->op);
            else if (w->own_first)
                cx_reduce3(buf, src, w->other + at * esize, n, w->dtype, w->op);
            else
                cx_reduce3(buf, w->other + at * esize, src, n, w->dtype, w->op);
            break;
        }
        at += n;
        count -= n;
        if ((c->pos += n) == g->count) {
            c->seg++;
            c->pos = 0;
        }
    }
}

/* Reduces this rank's block (elements [lo, lo + count) of chunk buffer k) into res, combining the
 * local ranks in rank order: the peers' copies from their slots, this rank's own from its slot
 * when staged, else straight from its tensors (cursor `own`). */
static void reduce_own_block(cx_shm *s, int k, const cx_segment *segs, cursor own, bool staged,
                             size_t lo, size_t count, uint8_t *res, cfx_dtype dtype, cfx_reduce_op op)
{
    size_t b = lo * cfx_dtype_size(dtype);
    const uint8_t *in[2]; /* local ranks 0 and 1 (there are always two or more) */
    for (int q = 0; q < 2; q++)
        in[q] = q == s->me && !staged ? NULL : cx_shm_slot(s, k, q) + b;
    walk_op w = {WALK_REDUCE_OWN, res, in[0] ? in[0] : in[1], !in[0], dtype, op, 1.0};
    if (in[0] && in[1]) {
        cx_reduce3(res, in[0], in[1], count, dtype, op);
    } else {
        cursor c = own;
        walk(segs, &c, count, &w);
    }
    for (int q = 2; q < s->nlocal; q++) {
        if (q == s->me && !staged) {
            cursor c = own;
            w.other = NULL;
            walk(segs, &c, count, &w);
        } else {
            cx_reduce_into(res, cx_shm_slot(s, k, q) + b, count, dtype, op);
        }
    }
}

/* Copies the elements of chunk buffer k (`count` of them, this rank's block [lo, hi)) from the
 * tensors at cursor `c` into this rank's slot: all but the own block, which goes too when
 * staged; `*own` gets the cursor at the own block. With `skip` nothing is copied and the cursors
 * just move on. */
static void copy_in_chunk(cx_shm *s, int k, const cx_segment *segs, cursor *c, cursor *own,
                          size_t count, size_t lo, size_t hi, bool stage_own, bool skip,
                          cfx_dtype dtype, cfx_reduce_op op, double prescale)
{
    size_t esize = cfx_dtype_size(dtype);
    walk_op copy = {WALK_COPY_IN, cx_shm_slot(s, k, s->me), NULL, false, dtype, op, prescale};
    walk_op pass = {WALK_SKIP, copy.buf, NULL, false, dtype, op, 1.0};
    walk(segs, c, lo, skip ? &pass : &copy);
    *own = *c;
    copy.buf += lo * esize;
    walk(segs, c, hi - lo, skip || !stage_own ? &pass : &copy);
    copy.buf += (hi - lo) * esize;
    walk(segs, c, count - hi, skip ? &pass : &copy);
}

/* The direct path: every local rank's tensors are in its pool, so nothing is copied in or out.
 * On one host, local rank i reduces block i of the whole batch in L1-sized strips, each written
 * into every rank's output right after its reduction. Across hosts (hierarchical), the work keeps
 * the copy path's chunks and blocks, so every local rank makes exactly the cross-host calls the
 * copy path makes and each host may take either path: block i of each chunk is reduced into
 * private scratch, allreduced across hosts, then written into every local rank's output. (Not the
 * shared result area: with no barrier per chunk, a rank's block of a short last chunk would
 * overlap a slower rank's block of a full one.) Every element has one reader and one writer, so
 * the only barrier is the one at the end. */
static cfx_status direct_allreduce(cx_shm *s, cx_transport *t, const cx_segment *segs, size_t n,
                                   cfx_dtype dtype, cfx_reduce_op op, double postscale,
                                   bool hierarchical, int wire, uint8_t *residual)
{
    cfx_status st = CFX_OK;
    if (!hierarchical)
        cx_shm_direct_one_host(s, segs, n, dtype, op, postscale);
    else
        st = cx_shm_direct_across_hosts(s, t, segs, n, dtype, op, postscale, wire, residual);
    cfx_status lost = cx_shm_barrier(s);
    return st ? st : lost;
}

/* What the copy path still owes a chunk once its block is reduced: where this rank's block
 * goes in its outputs, the chunk's block bounds, and its results. */
typedef struct chunk_tail {
    cursor own_out;
    size_t lo, hi, count;
    uint8_t *res;
} chunk_tail;

/* Copies the other ranks' blocks of a chunk out of the results into the tensors; every rank
 * must have passed a barrier after writing its block. `out` is the output cursor of the whole
 * batch; `out_op` the copy out, its buf set here. */
static void copy_out_others(const cx_segment *segs, cursor *out, const chunk_tail *c,
                            walk_op *out_op)
{
    size_t esize = cfx_dtype_size(out_op->dtype);
    out_op->buf = c->res;
    walk(segs, out, c->lo, out_op);
    walk_op skip_out = {WALK_SKIP, c->res, NULL, false, out_op->dtype, out_op->op, 1.0};
    walk(segs, out, c->hi - c->lo, &skip_out);
    out_op->buf = c->res + c->hi * esize;
    walk(segs, out, c->count - c->hi, out_op);
}

/* Copies this rank's block of a chunk out of the results into the tensors. */
static void copy_out_own(const cx_segment *segs, chunk_tail *c, walk_op *out_op)
{
    out_op->buf = c->res + c->lo * cfx_dtype_size(out_op->dtype);
    walk(segs, &c->own_out, c->hi - c->lo, out_op);
}

/* The end of a chunk on the copy path whose own block is out: the barrier after which every
 * block is in the results, and the other blocks out. */
static cfx_status finish_chunk(cx_shm *s, const cx_segment *segs, cursor *out, chunk_tail *c,
                               walk_op *out_op)
{
    cfx_status st = cx_shm_barrier(s);
    if (!st)
        copy_out_others(segs, out, c, out_op);
    return st;
}

/* finish_chunk for a chunk whose block was posted across hosts: its result, and the own block
 * out, first. */
static cfx_status finish_posted(cx_shm *s, cx_transport *t, const cx_segment *segs, cursor *out,
                                chunk_tail *c, walk_op *out_op)
{
    cfx_status st = t->ops->cross_allreduce_wait(t);
    if (st)
        return st;
    copy_out_own(segs, c, out_op);
    return finish_chunk(s, segs, out, c, out_op);
}

cfx_status cx_shm_allreduce(cx_shm *s, cx_transport *t, const cx_segment *segs, size_t nsegs,
                            cfx_dtype dtype, cfx_reduce_op op, double prescale, double postscale,
                            bool hierarchical)
{
    return cx_shm_allreduce_wire(s, t, segs, nsegs, dtype, op, prescale, postscale, hierarchical,
                                 -1, NULL);
}

cfx_status cx_shm_allreduce_wire(cx_shm *s, cx_transport *t, const cx_segment *segs,
                                 size_t nsegs, cfx_dtype dtype, cfx_reduce_op op, double prescale,
                                 double postscale, bool hierarchical, int wire, void *residual)
{
    size_t esize = cfx_dtype_size(dtype);
    size_t per_chunk = s->chunk / esize;
    size_t n = 0;
    for (size_t i = 0; i < nsegs; i++)
        n += segs[i].count;
    /* This rank's own block is read where it lies, unless it must be scaled or a joined rank's
     * identity stands in for it: then it is staged in the rank's own slot like the rest. */
    bool stage_own = prescale != 1.0;
    for (size_t i = 0; i < nsegs && !stage_own; i++)
        stage_own = segs[i].count && !segs[i].src;
    cursor in = {0, 0}, out = {0, 0};
    /* Skip leading empty segments so the cursors never stand on one. */
    while (in.seg < nsegs && segs[in.seg].count == 0)
        in.seg++;
    out = in;
    /* A rank offering the direct path skips the first chunk's copy in; if the offer is not taken
     * it copies in after the barrier, and one more barrier follows. Every rank reads the same
     * offers, so all take the same path. */
    bool offers = n && s->direct != DIRECT_OFF; /* the same on every rank */
    bool offered = offers && cx_shm_offer_direct(s, segs, nsegs, esize, prescale);
    bool pipelined = hierarchical && wire < 0 &&
                     cx_transport_has(t, CX_TRANSPORT_CROSS_PIPELINE);
    /* The last chunk, when `pending`: posted across hosts (`pipelined`), or with its results in
     * once every rank passed the next barrier. */
    chunk_tail prev = {{0, 0}, 0, 0, 0, NULL};
    bool pending = false;
    int k = 0;
    for (size_t off = 0; off < n; off += per_chunk, k ^= 1) {
        size_t count = n - off < per_chunk ? n - off : per_chunk;
        size_t lo = cx_shm_block_start(count, s->nlocal, s->me);
        size_t hi = cx_shm_block_start(count, s->nlocal, s->me + 1);
        cursor in_first = in, own;
        copy_in_chunk(s, k, segs, &in, &own, count, lo, hi, stage_own, off == 0 && offered, dtype,
                      op, prescale);
        cfx_status st = cx_shm_barrier(s);
        if (st)
            return st;
        if (off == 0 && offers) {
            int takers = 0;
            for (int q = 0; q < s->nlocal; q++)
                takers += s->offers[q].ok != 0;
            bool all_take = takers == s->nlocal && cx_shm_same_cuts(s);
            if (all_take && s->direct == DIRECT_UNTRIED && (st = cx_shm_setup_direct(s)))
                return st;
            if (all_take && s->direct == DIRECT_READY)
                return direct_allreduce(s, t, segs, n, dtype, op, postscale, hierarchical,
                                        wire, residual);
            if (takers) { /* some ranks skipped their copy in */
                if (offered)
                    copy_in_chunk(s, k, segs, &in_first, &own, count, lo, hi, stage_own, false,
                                  dtype, op, prescale);
                if ((st = cx_shm_barrier(s)))
                    return st;
            }
        }
        walk_op out_op = {WALK_COPY_OUT, NULL, NULL, false, dtype, op, postscale};
        /* Every rank wrote its block of the last chunk before this barrier. */
        if (pending && !pipelined)
            copy_out_others(segs, &out, &prev, &out_op);
        uint8_t *res = s->results + (size_t)k * s->chunk;
        /* The own block goes out before the next barrier (no peer reads this rank's tensors,
         * only its slot): one strip at a time, right after its reduction, while it is in L1.
         * Hierarchical mode copies it out after the cross-host step. */
        chunk_tail cur = {own, lo, hi, count, res};
        size_t strip = hierarchical ? hi - lo : CX_SHM_OWN_STRIP_BYTES / esize;
        for (size_t a = lo; a < hi; a += strip) {
            size_t m = hi - a < strip ? hi - a : strip;
            reduce_own_block(s, k, segs, own, stage_own, a, m, res + a * esize, dtype, op);
            walk_op step = {WALK_SKIP, res, NULL, false, dtype, op, 1.0};
            walk(segs, &own, m, &step); /* `own` follows the strips */
            if (!hierarchical) {
                out_op.buf = res + a * esize;
                walk(segs, &cur.own_out, m, &out_op);
            }
        }
        if (pipelined) {
            /* This chunk crosses while the last one is finished; the next is copied in and
             * reduced (the slots and results alternate, and each barrier keeps a slot from being
             * rewritten before every rank read it). */
            st = t->ops->cross_allreduce_post(t, res + lo * esize, hi - lo, dtype, op);
            if (!st && pending)
                st = finish_posted(s, t, segs, &out, &prev, &out_op);
        } else if (hierarchical) {
            /* Every local rank sends its own block across hosts: all links work at once. Ranks
             * with an empty block still call, so the cross communicator's calls match. */
            void *own_residual = residual ? (uint8_t *)residual + (off + lo) * esize : NULL;
            st = cx_shm_cross_leg(s, t, res + lo * esize, hi - lo, dtype, op, wire, own_residual);
            if (!st)
                copy_out_own(segs, &cur, &out_op);
        }
        if (st)
            return st;
        /* Not posted, one barrier a chunk: the next chunk's, after its copy in, also says that
         * this chunk's results are in. The slots and results alternate: the next copy in writes
         * the other slot, and this chunk's slot and result are rewritten only after the barrier
         * after next, which every rank passes only once it has read them. (A posted chunk's
         * result comes in only after the next barrier, hence its own one.) */
        prev = cur;
        pending = true;
    }
    if (!pending)
        return CFX_OK;
    walk_op out_op = {WALK_COPY_OUT, prev.res, NULL, false, dtype, op, postscale};
    return pipelined ? finish_posted(s, t, segs, &out, &prev, &out_op)
                     : finish_chunk(s, segs, &out, &prev, &out_op);
}

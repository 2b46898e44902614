/* shm_layer - the host shared-memory path as a layer over a transport (see shm_layer.h). */
#include "exec/shm_layer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

typedef struct shm_layer {
    cx_transport base;      /* rank and group sizes copied from inner; ops points at `ops` */
    cx_transport_ops ops;   /* inner's table, each call forwarded (NULL where inner has none) */
    cx_transport *inner;
    cx_host_path path;
    /* hierarchical_and's rows: CX_SHM_AND_MAX_WORDS words, and as many bools per bit (leaders) */
    uint64_t *and_row;
    unsigned char *and_bools;
} shm_layer;

static cx_transport *inner_of(cx_transport *t) { return ((shm_layer *)t)->inner; }

static cfx_status layer_gather_bytes(cx_transport *t, const void *send, size_t len,
                                     void **recv_out, size_t *lens_out)
{
    cx_transport *in = inner_of(t);
    return in->ops->gather_bytes(in, send, len, recv_out, lens_out);
}

static cfx_status layer_bcast_bytes(cx_transport *t, void **buf, size_t *len, int root)
{
    cx_transport *in = inner_of(t);
    return in->ops->bcast_bytes(in, buf, len, root);
}

/* Several hosts, over a transport whose calls end at its deadline (an AND waits for every rank,
 * so it must be able to give up on a lost one): the host's AND through the segment, the hosts'
 * AND between the ranks of local rank 0 (one cross_allreduce of the bits as bools, whose MIN is
 * AND), and the result back through the segment, where the other local ranks bring all ones. A
 * world AND over the transport costs every rank a message from every other: over Gloo ~1 ms a
 * cycle between two pretend hosts, where this takes one exchange between the leaders. After the
 * words, the leader's status and its error text travel the same way, so that its host fails with
 * it, naming what the leader named, instead of going on with bits the leader never got. */
#define AND_TEXT_WORDS 64 /* the leader's error text: 512 bytes */
static bool hierarchical_and_fits(const shm_layer *l, size_t count)
{
    return l->path.hierarchical && l->inner->ops->caps.aborts_in_flight &&
           count + 1 + AND_TEXT_WORDS <= CX_SHM_AND_MAX_WORDS;
}

static cfx_status hierarchical_and(shm_layer *l, uint64_t *words, size_t count)
{
    uint64_t *row = l->and_row;
    bool done = false;
    cfx_status st = cx_shm_allreduce_and(l->path.shm, words, count, &done);
    if (st)
        return st;
    cfx_status cross = CFX_OK;
    memset(row, 0xff, (count + 1 + AND_TEXT_WORDS) * sizeof *row);
    if (l->base.local_rank == 0) {
        size_t nbits = count * 64;
        for (size_t b = 0; b < nbits; b++)
            l->and_bools[b] = (unsigned char)((words[b / 64] >> (b % 64)) & 1);
        cross = l->inner->ops->cross_allreduce(l->inner, l->and_bools, nbits, CFX_BOOL,
                                               CFX_OP_MIN);
        memset(row, 0, count * sizeof *row);
        for (size_t b = 0; b < nbits; b++)
            row[b / 64] |= (uint64_t)(l->and_bools[b] != 0) << (b % 64);
        if (cross) {
            row[count] = (uint64_t)(uint32_t)cross;
            char *text = (char *)(row + count + 1);
            snprintf(text, AND_TEXT_WORDS * 8, "%s", cx_error_message());
        }
    }
    st = cx_shm_allreduce_and(l->path.shm, row, count + 1 + AND_TEXT_WORDS, &done);
    if (cross || st)
        return cross ? cross : st;
    if (row[count] != ~0ull) {
        char *text = (char *)(row + count + 1);
        text[AND_TEXT_WORDS * 8 - 1] = '\0';
        return cx_fail((cfx_status)(int32_t)row[count], "AND of the ready bits across hosts (rank "
                       "%d): this host's local rank 0 failed: %s", l->base.rank, text);
    }
    memcpy(words, row, count * sizeof *words);
    return CFX_OK;
}

/* The agreement of every cycle goes through the segment (docs/architecture.md "One cycle in
 * detail"): on one host wholly, across hosts through hierarchical_and where it fits; otherwise
 * through the transport on every rank alike (count is the same everywhere). */
static cfx_status layer_allreduce_and(cx_transport *t, uint64_t *words, size_t count)
{
    shm_layer *l = (shm_layer *)t;
    bool done = false;
    if (hierarchical_and_fits(l, count))
        return hierarchical_and(l, words, count);
    if (!l->path.hierarchical) {
        cfx_status st = cx_shm_allreduce_and(l->path.shm, words, count, &done);
        if (st || done)
            return st;
    }
    return l->inner->ops->allreduce_and(l->inner, words, count);
}

static cfx_status layer_allreduce(cx_transport *t, void *buf, size_t count, cfx_dtype dtype,
                                  cfx_reduce_op op)
{
    cx_transport *in = inner_of(t);
    return in->ops->allreduce(in, buf, count, dtype, op);
}

static cfx_status layer_allgatherv(cx_transport *t, const void *send, size_t send_bytes,
                                   void *recv, const size_t *recv_bytes, const size_t *displs)
{
    cx_transport *in = inner_of(t);
    return in->ops->allgatherv(in, send, send_bytes, recv, recv_bytes, displs);
}

static cfx_status layer_broadcast(cx_transport *t, void *buf, size_t bytes, int root)
{
    cx_transport *in = inner_of(t);
    return in->ops->broadcast(in, buf, bytes, root);
}

static cfx_status layer_alltoallv(cx_transport *t, const void *send, const size_t *send_bytes,
                                  const size_t *sdispls, void *recv, const size_t *recv_bytes,
                                  const size_t *rdispls)
{
    cx_transport *in = inner_of(t);
    return in->ops->alltoallv(in, send, send_bytes, sdispls, recv, recv_bytes, rdispls);
}

static cfx_status layer_reduce_scatter(cx_transport *t, const void *send, void *recv,
                                       const size_t *counts, cfx_dtype dtype, cfx_reduce_op op)
{
    cx_transport *in = inner_of(t);
    return in->ops->reduce_scatter(in, send, recv, counts, dtype, op);
}

static cfx_status layer_barrier(cx_transport *t)
{
    cx_transport *in = inner_of(t);
    return in->ops->barrier(in);
}

static cfx_status layer_cross_allreduce(cx_transport *t, void *buf, size_t count, cfx_dtype dtype,
                                        cfx_reduce_op op)
{
    cx_transport *in = inner_of(t);
    return in->ops->cross_allreduce(in, buf, count, dtype, op);
}

static cfx_status layer_cross_allreduce_post(cx_transport *t, void *buf, size_t count,
                                             cfx_dtype dtype, cfx_reduce_op op)
{
    cx_transport *in = inner_of(t);
    return in->ops->cross_allreduce_post(in, buf, count, dtype, op);
}

static cfx_status layer_cross_allreduce_wait(cx_transport *t)
{
    cx_transport *in = inner_of(t);
    return in->ops->cross_allreduce_wait(in);
}

/* A subset is the inner transport's: its context sets up a host path of its own. */
static cfx_status layer_split(cx_transport *t, const int *ranks, size_t n, cx_transport **out)
{
    cx_transport *in = inner_of(t);
    return in->ops->split(in, ranks, n, out);
}

static cfx_status layer_sendrecv(cx_transport *t, cx_group group, const void *send,
                                 size_t send_bytes, int to, void *recv, size_t recv_bytes,
                                 int from)
{
    cx_transport *in = inner_of(t);
    return in->ops->sendrecv(in, group, send, send_bytes, to, recv, recv_bytes, from);
}

static void layer_mark_lost(cx_transport *t)
{
    cx_transport *in = inner_of(t);
    in->ops->mark_lost(in);
}

/* The segment first, as before the layer existed: its unmapping needs no peer. A peer the segment
 * lost is the transport's news too: its destroy must not wait for that peer. */
static void layer_destroy(cx_transport *t)
{
    shm_layer *l = (shm_layer *)t;
    if (cx_shm_failure(l->path.shm) && cx_transport_has(l->inner, CX_TRANSPORT_MARK_LOST))
        l->inner->ops->mark_lost(l->inner);
    cx_shm_destroy(l->path.shm);
    l->inner->ops->destroy(l->inner);
    free(l->and_row);
    free(l->and_bools);
    free(l);
}

static cfx_status wrap(cx_transport *inner, cx_host_path path, cx_transport **out)
{
    shm_layer *l = calloc(1, sizeof *l);
    if (l && path.hierarchical) {
        l->and_row = malloc(CX_SHM_AND_MAX_WORDS * sizeof *l->and_row);
        l->and_bools = malloc(CX_SHM_AND_MAX_WORDS * 64);
    }
    if (!l || (path.hierarchical && (!l->and_row || !l->and_bools))) {
        if (l) {
            free(l->and_row);
            free(l->and_bools);
        }
        free(l);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the shared-memory layer");
    }
    const cx_transport_ops *in = inner->ops;
    l->ops = (cx_transport_ops){
        .name = in->name,
        .caps = in->caps,
        .gather_bytes = layer_gather_bytes,
        .bcast_bytes = layer_bcast_bytes,
        .allreduce_and = layer_allreduce_and,
        .allreduce = layer_allreduce,
        .allgatherv = layer_allgatherv,
        .broadcast = layer_broadcast,
        .alltoallv = layer_alltoallv,
        .reduce_scatter = layer_reduce_scatter,
        .barrier = layer_barrier,
        .cross_allreduce = in->cross_allreduce ? layer_cross_allreduce : NULL,
        .cross_allreduce_post = in->cross_allreduce_post ? layer_cross_allreduce_post : NULL,
        .cross_allreduce_wait = in->cross_allreduce_wait ? layer_cross_allreduce_wait : NULL,
        .split = in->split ? layer_split : NULL,
        .sendrecv = in->sendrecv ? layer_sendrecv : NULL,
        .mark_lost = in->mark_lost ? layer_mark_lost : NULL,
        .destroy = layer_destroy,
    };
    l->base = *inner;
    l->base.ops = &l->ops;
    l->inner = inner;
    l->path = path;
    *out = &l->base;
    return CFX_OK;
}

cx_host_path cx_shm_layer_path(const cx_transport *t)
{
    if (t->ops->destroy != layer_destroy) /* not a layer: the one mark every layer carries */
        return (cx_host_path){NULL, false};
    return ((const shm_layer *)t)->path;
}

/* Whether every host has the same number of ranks (the two-level path needs equal blocks). */
static cfx_status homogeneous(cx_transport *t, bool *out)
{
    int32_t *all = NULL;
    cfx_status st = cx_transport_allgather_int32(t, t->local_size, &all);
    *out = true;
    for (int r = 0; !st && r < t->size; r++)
        *out = *out && all[r] == t->local_size;
    free(all);
    return st;
}

cfx_status cx_shm_layer_setup(cx_transport **tp, const cx_config *c, const cx_logger *log)
{
    cx_transport *t = *tp;
    bool wanted = c->shm == 1 || (c->shm == -1 && t->ops->caps.prefers_host_shm);
    if (t->size == 1 || !wanted)
        return CFX_OK;
    uint64_t one_host = t->local_size == t->size ? 1 : 0;
    cfx_status st = t->ops->allreduce_and(t, &one_host, 1);
    if (st)
        return st;
    if (!one_host) {
        bool same = false;
        if ((st = homogeneous(t, &same)))
            return st;
        if (c->hierarchical == 0 || !cx_transport_has(t, CX_TRANSPORT_CROSS_ALLREDUCE))
            return CFX_OK;
        if (!same) {
            if (t->rank == 0)
                cx_log(log, CX_LOG_WARNING, "context", "hosts have different numbers of ranks: "
                       "hierarchical allreduce is off, %s carries every allreduce", t->ops->name);
            return CFX_OK;
        }
    }
    if (t->local_size == 1) /* the same on every rank here */
        return CFX_OK;
    cx_host_path path = {NULL, !one_host};
    /* Across hosts a chunk's blocks cross in one transport call each: the chunk the user set for
     * this path, else the one the transport wants, else the engine's. */
    size_t chunk = (size_t)c->chunk_bytes;
    if (!one_host && c->hierarchical_chunk_bytes > 0)
        chunk = (size_t)c->hierarchical_chunk_bytes;
    else if (!one_host && t->ops->caps.cross_chunk_bytes)
        chunk = t->ops->caps.cross_chunk_bytes;
    st = cx_shm_create(t, chunk, c->transport_timeout_s, c->test.direct_map_fail, &path.shm);
    if (st == CFX_ERR_TRANSPORT) { /* no usable /dev/shm: the transport alone still works */
        cx_log(log, CX_LOG_WARNING, "context", "%s; %s carries every allreduce",
               cx_error_message(), t->ops->name);
        return CFX_OK;
    }
    if (!st && (st = wrap(t, path, tp)))
        cx_shm_destroy(path.shm);
    return st;
}

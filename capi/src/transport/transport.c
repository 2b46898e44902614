/* transport - what the engine checks of any transport, and helpers over its calls (transport.h). */
#include "transport/transport.h"

#include <stdlib.h>

#include "base/error.h"

cfx_status cx_transport_check(const cx_transport *t)
{
    const cx_transport_ops *o = t->ops;
    const char *name = o->name ? o->name : "(unnamed)";
    const struct {
        bool filled;
        const char *call;
    } required[] = {{o->gather_bytes, "gather_bytes"}, {o->bcast_bytes, "bcast_bytes"},
                    {o->allreduce_and, "allreduce_and"}, {o->allreduce, "allreduce"},
                    {o->allgatherv, "allgatherv"}, {o->broadcast, "broadcast"},
                    {o->alltoallv, "alltoallv"}, {o->reduce_scatter, "reduce_scatter"},
                    {o->barrier, "barrier"}, {o->destroy, "destroy"}};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!required[i].filled)
            return cx_fail(CFX_ERR_INTERNAL, "the %s transport lacks %s, which every transport "
                           "needs (transport.h)", name, required[i].call);
    const struct {
        uint32_t bit;
        bool filled;
        const char *call;
    } optional[] = {{CX_TRANSPORT_CROSS_ALLREDUCE, o->cross_allreduce, "cross_allreduce"},
                    {CX_TRANSPORT_SPLIT, o->split, "split"},
                    {CX_TRANSPORT_SENDRECV, o->sendrecv, "sendrecv"},
                    {CX_TRANSPORT_MARK_LOST, o->mark_lost, "mark_lost"},
                    {CX_TRANSPORT_CROSS_PIPELINE,
                     o->cross_allreduce_post && o->cross_allreduce_wait,
                     "cross_allreduce_post and _wait"}};
    for (size_t i = 0; i < sizeof optional / sizeof optional[0]; i++)
        if (cx_transport_has(t, optional[i].bit) != optional[i].filled)
            return cx_fail(CFX_ERR_INTERNAL, "the %s transport's capabilities %s %s, but its table "
                           "%s it", name, optional[i].filled ? "omit" : "promise", optional[i].call,
                           optional[i].filled ? "fills" : "lacks");
    return CFX_OK;
}

cfx_status cx_transport_allgather_int32(cx_transport *t, int32_t mine, int32_t **all_out)
{
    size_t n = (size_t)t->size;
    int32_t *all = malloc(sizeof *all * n);
    size_t *bytes = malloc(sizeof *bytes * n), *displs = malloc(sizeof *displs * n);
    cfx_status st = (all && bytes && displs) ? CFX_OK
                                             : cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t r = 0; !st && r < n; r++) {
        bytes[r] = sizeof mine;
        displs[r] = r * sizeof mine;
    }
    if (!st)
        st = t->ops->allgatherv(t, &mine, sizeof mine, all, bytes, displs);
    free(bytes);
    free(displs);
    if (st) {
        free(all);
        all = NULL;
    }
    *all_out = all;
    return st;
}

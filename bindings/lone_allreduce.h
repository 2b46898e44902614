/*
 * lone_allreduce.h - how every binding's native code submits a lone allreduce with its per-call
 * options (the Python, Java and Lua wrappers through conflux.i, and conflux._torch_native): the
 * plain cfx_allreduce_async, or cfx_allreduce_async_opts when a compression is asked for. Keeping
 * the plain call for the common case keeps its error messages those of cfx_allreduce_async.
 */
#ifndef CFX_BIND_LONE_ALLREDUCE_H
#define CFX_BIND_LONE_ALLREDUCE_H

#include "conflux/conflux.h"

static inline cfx_status cfx_bind_allreduce_async(cfx_context *ctx, const char *name,
                                                  const cfx_tensor *input, void *output, int op,
                                                  double prescale, double postscale,
                                                  int compression, cfx_handle *out)
{
    cfx_allreduce_options o;
    cfx_status st;
    if (compression == CFX_COMPRESSION_NONE)
        return cfx_allreduce_async(ctx, name, input, output, (cfx_reduce_op)op, prescale,
                                   postscale, out);
    st = cfx_allreduce_options_init(&o, CFX_ALLREDUCE_OPTIONS_VERSION);
    o.op = op;
    o.prescale = prescale;
    o.postscale = postscale;
    o.compression = compression;
    return st == CFX_OK ? cfx_allreduce_async_opts(ctx, name, input, output, &o, out) : st;
}

#endif /* CFX_BIND_LONE_ALLREDUCE_H */

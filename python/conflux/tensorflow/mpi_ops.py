"""conflux.tensorflow's collectives with Horovod's TF2 signatures. Each returns TF tensors made by
the op library's ops, eagerly or inside tf.function. `device_dense`, `device_sparse`,
`ignore_name_scope` and `process_set` (the global set only) are accepted for Horovod scripts.
"""
import tensorflow as tf

from conflux import _core

from . import _ops
from .compression import Compression, plan


def _op(op, average):
    if average is not None:
        if op is not None:
            raise ValueError("The op parameter supersedes average; please provide only one of them.")
        return _core.Average if average else _core.Sum
    return _core.Average if op is None else _core.check_op(op)


def _global_only(process_set):
    if process_set is not None and getattr(process_set, "process_set_id", 0) not in (0, None):
        raise NotImplementedError("conflux.tensorflow: the TF ops run on the global process set only")


def _sparse_allreduce(slices, op, name):
    """IndexedSlices: every rank's values and indices gathered (Horovod's way); Average divides."""
    if op not in (_core.Sum, _core.Average):
        raise NotImplementedError("conflux.tensorflow: IndexedSlices are reduced with Sum or "
                                  "Average only (use sparse_as_dense for other ops)")
    values = _ops.allgather(slices.values, None if name is None else name + ".values")
    indices = _ops.allgather(slices.indices, None if name is None else name + ".indices")
    if op == _core.Average:
        values = values / tf.cast(_ops.size_op(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def allreduce(tensor, average=None, device_dense='', device_sparse='',
              compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
              name=None, process_set=None, ignore_name_scope=False):
    """Reduces `tensor` over every rank (default: Average). tf.IndexedSlices are allgathered."""
    _global_only(process_set)
    rop = _op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        return _sparse_allreduce(tensor, rop, name)
    tensor = tf.convert_to_tensor(tensor)
    code, compressor = plan(compression, tensor.dtype)
    ctx = None
    if compressor is not None:
        tensor, ctx = compressor.compress(tensor)
    out = _ops.allreduce(tensor, rop, prescale_factor, postscale_factor, code, name)
    return out if compressor is None else compressor.decompress(out, ctx)


def grouped_allreduce(tensors, average=None, device_dense='', device_sparse='',
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None, name=None, ignore_name_scope=False):
    """Reduces a list of tensors in one submission (negotiated and fused together)."""
    _global_only(process_set)
    rop = _op(op, average)
    tensors = list(tensors)
    out = [None] * len(tensors)
    dense, idx, ctxs, comps = [], [], [], []
    code = 0
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            out[i] = _sparse_allreduce(t, rop, None if name is None else "%s.%d" % (name, i))
            continue
        t = tf.convert_to_tensor(t)
        c, compressor = plan(compression, t.dtype)
        code = code or c
        ctx = None
        if compressor is not None:
            t, ctx = compressor.compress(t)
        dense.append(t)
        idx.append(i)
        ctxs.append(ctx)
        comps.append(compressor)
    reduced = _ops.grouped_allreduce(dense, rop, prescale_factor, postscale_factor, code, name)
    for i, r, ctx, compressor in zip(idx, reduced, ctxs, comps):
        out[i] = r if compressor is None else compressor.decompress(r, ctx)
    return out


def allgather(tensor, name=None, ignore_name_scope=False, process_set=None):
    """Concatenates every rank's tensor along dim 0 (dim 0 may differ by rank)."""
    _global_only(process_set)
    if isinstance(tensor, tf.IndexedSlices):
        raise TypeError("allgather takes dense tensors")
    return _ops.allgather(tf.convert_to_tensor(tensor), name)


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=None):
    return [allgather(t, None if name is None else "%s.%d" % (name, i), process_set=process_set)
            for i, t in enumerate(tensors)]


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=None):
    """root_rank's tensor on every rank."""
    _global_only(process_set)
    return _ops.broadcast(tf.convert_to_tensor(tensor), _core.check_root(root_rank), name)


def broadcast_(variables, root_rank, name=None, process_set=None):
    """In place on variables: each takes root_rank's value (returns the variables)."""
    _global_only(process_set)
    single = isinstance(variables, tf.Variable)
    vs = [variables] if single else list(variables)
    for i, v in enumerate(vs):
        nm = None if name is None else (name if single else "%s.%d" % (name, i))
        v.assign(_ops.broadcast(tf.convert_to_tensor(v), root_rank, _var_name("broadcast", nm, v)))
    return variables


def _var_name(kind, name, var):
    if name is not None or tf.executing_eagerly():
        return name
    return _ops.engine_name(kind, None, label=getattr(var, "path", None) or var.name)


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=None):
    """Sends splits[j] rows of `tensor` to rank j (equal parts without splits); returns
    (received rows, rows received from each rank)."""
    _global_only(process_set)
    return tuple(_ops.alltoall(tf.convert_to_tensor(tensor), splits, name))


def reducescatter(tensor, device_dense='', compression=Compression.none, op=None, name=None,
                  process_set=None, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces over ranks (default Average) and leaves rank r the r-th block of dim 0."""
    _global_only(process_set)
    rop = _op(op, None)
    return _ops.reducescatter(tf.convert_to_tensor(tensor), rop, prescale_factor,
                              postscale_factor, name)


def grouped_reducescatter(tensors, device_dense='', compression=Compression.none, op=None,
                          process_set=None, prescale_factor=1.0, postscale_factor=1.0, name=None):
    return [reducescatter(t, op=op, name=None if name is None else "%s.%d" % (name, i),
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor)
            for i, t in enumerate(tensors)]


def join():
    """This rank has no more data: it takes part in the others' allreduces with zeros until all
    joined; returns the rank that joined last (an int32 tensor)."""
    return _ops.join()


def barrier(process_set=None):
    _global_only(process_set)
    return _ops.barrier()

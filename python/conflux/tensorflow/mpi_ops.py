"""conflux.tensorflow's collectives with Horovod's TF2 signatures. Each returns TF tensors made by
the op library's ops, eagerly or inside tf.function. `device_dense`, `device_sparse` and
`ignore_name_scope` are accepted for Horovod scripts. `process_set` (a registered
hvd.ProcessSet: hvd.init(process_sets=...) or hvd.add_process_set()) runs the collective among its
ranks only, on the set's own subset context; as in Horovod, root_rank is the job's rank of the
root, results are in the order of the set's ranks, and a rank outside the set gets a ValueError.
"""
import tensorflow as tf

from conflux import _args
from conflux import _core

from . import _ops
from .compression import Compression, plan


def _op(op, average):
    if average is not None:
        if op is not None:
            raise ValueError("The op parameter supersedes average; please provide only one of them.")
        return _core.Average if average else _core.Sum
    return _core.Average if op is None else _args.check_op(op)


def _set_id(process_set):
    """The op attr process_set_id of `process_set` (0: the job), its subset context registered
    with the op library (a graph traced for the set finds the set's current context)."""
    if process_set is None or getattr(process_set, "process_set_id", None) == 0:
        return 0
    from conflux.horovod.common import process_sets as _ps
    subset = _ps.subset_of(process_set)  # ValueError for one not registered
    if not subset.included():
        raise ValueError("rank %d is not in %s: its collectives run on its ranks only"
                         % (_core.rank(), process_set))
    _ops.set_process_set(process_set.process_set_id, subset.ctx.address)
    _watch_removals(_ps)
    return process_set.process_set_id


def _watch_removals(ps_module):
    if not _watching:
        ps_module.on_remove(lambda set_id: _ops.set_process_set(set_id, 0))
        _watching.append(True)


_watching = []


def _set_root(process_set, set_id, root_rank):
    """A job's root rank as the rank within the set (the engine's root)."""
    root_rank = _args.check_root(root_rank)
    if set_id == 0:
        return root_rank
    if root_rank not in process_set.ranks:
        raise ValueError("root_rank %d is not in %s" % (root_rank, process_set))
    return process_set.ranks.index(root_rank)


def _sparse_allreduce(slices, op, name, ps=0):
    """IndexedSlices: every rank's values and indices gathered (Horovod's way); Average divides."""
    if op not in (_core.Sum, _core.Average):
        raise NotImplementedError("conflux.tensorflow: IndexedSlices are reduced with Sum or "
                                  "Average only (use sparse_as_dense for other ops)")
    values = _ops.allgather(slices.values, None if name is None else name + ".values", ps)
    indices = _ops.allgather(slices.indices, None if name is None else name + ".indices", ps)
    if op == _core.Average:
        n = _ops.size_op() if ps == 0 else len(_ps_ranks(ps))
        values = values / tf.cast(n, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def _ps_ranks(set_id):
    from conflux.horovod.common import process_sets as _ps
    return _ps._table[set_id].process_set.ranks


def allreduce(tensor, average=None, device_dense='', device_sparse='',
              compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
              name=None, process_set=None, ignore_name_scope=False):
    """Reduces `tensor` over every rank (default: Average). tf.IndexedSlices are allgathered."""
    ps = _set_id(process_set)
    rop = _op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        return _sparse_allreduce(tensor, rop, name, ps)
    tensor = tf.convert_to_tensor(tensor)
    code, compressor = plan(compression, tensor.dtype)
    ctx = None
    if compressor is not None:
        tensor, ctx = compressor.compress(tensor)
    out = _ops.allreduce(tensor, rop, prescale_factor, postscale_factor, code, name, ps)
    return out if compressor is None else compressor.decompress(out, ctx)


def grouped_allreduce(tensors, average=None, device_dense='', device_sparse='',
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None, name=None, ignore_name_scope=False):
    """Reduces a list of tensors in one submission (negotiated and fused together)."""
    ps = _set_id(process_set)
    rop = _op(op, average)
    tensors = list(tensors)
    out = [None] * len(tensors)
    dense, idx, ctxs, comps = [], [], [], []
    code = 0
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            out[i] = _sparse_allreduce(t, rop, None if name is None else "%s.%d" % (name, i), ps)
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
    reduced = _ops.grouped_allreduce(dense, rop, prescale_factor, postscale_factor, code, name,
                                     ps)
    for i, r, ctx, compressor in zip(idx, reduced, ctxs, comps):
        out[i] = r if compressor is None else compressor.decompress(r, ctx)
    return out


def allgather(tensor, name=None, ignore_name_scope=False, process_set=None):
    """Concatenates every rank's tensor along dim 0 (dim 0 may differ by rank)."""
    ps = _set_id(process_set)
    if isinstance(tensor, tf.IndexedSlices):
        raise TypeError("allgather takes dense tensors")
    return _ops.allgather(tf.convert_to_tensor(tensor), name, ps)


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=None):
    return [allgather(t, None if name is None else "%s.%d" % (name, i), process_set=process_set)
            for i, t in enumerate(tensors)]


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=None):
    """root_rank's tensor on every rank."""
    ps = _set_id(process_set)
    return _ops.broadcast(tf.convert_to_tensor(tensor), _set_root(process_set, ps, root_rank),
                          name, ps)


def broadcast_(variables, root_rank, name=None, process_set=None):
    """In place on variables: each takes root_rank's value (returns the variables)."""
    ps = _set_id(process_set)
    root = _set_root(process_set, ps, root_rank)
    single = isinstance(variables, tf.Variable)
    vs = [variables] if single else list(variables)
    for i, v in enumerate(vs):
        nm = None if name is None else (name if single else "%s.%d" % (name, i))
        v.assign(_ops.broadcast(tf.convert_to_tensor(v), root, _var_name("broadcast", nm, v), ps))
    return variables


def _var_name(kind, name, var):
    if name is not None or tf.executing_eagerly():
        return name
    return _ops.engine_name(kind, None, label=getattr(var, "path", None) or var.name)


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=None):
    """Sends splits[j] rows of `tensor` to rank j (equal parts without splits); returns
    (received rows, rows received from each rank)."""
    ps = _set_id(process_set)
    return tuple(_ops.alltoall(tf.convert_to_tensor(tensor), splits, name, ps))


def reducescatter(tensor, device_dense='', compression=Compression.none, op=None, name=None,
                  process_set=None, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces over ranks (default Average) and leaves rank r the r-th block of dim 0."""
    ps = _set_id(process_set)
    rop = _op(op, None)
    return _ops.reducescatter(tf.convert_to_tensor(tensor), rop, prescale_factor,
                              postscale_factor, name, ps)


def grouped_reducescatter(tensors, device_dense='', compression=Compression.none, op=None,
                          process_set=None, prescale_factor=1.0, postscale_factor=1.0, name=None):
    return [reducescatter(t, op=op, name=None if name is None else "%s.%d" % (name, i),
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                          process_set=process_set)
            for i, t in enumerate(tensors)]


def join():
    """This rank has no more data: it takes part in the others' allreduces with zeros until all
    joined; returns the rank that joined last (an int32 tensor)."""
    return _ops.join()


def barrier(process_set=None):
    return _ops.barrier(_set_id(process_set))

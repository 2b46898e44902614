"""horovod.torch.mpi_ops: Horovod 0.28's collectives, handles and basics on Conflux.

Every collective takes `process_set` (default hvd.global_process_set) and runs on that set's own
subset context; root ranks are the job's ranks, as in Horovod. The blocking out-of-place forms
are differentiable, the grouped ones, reducescatter and alltoall too (conflux.torch_process_sets
has the gradients; reducescatter's is Horovod's, _horovod_rs_scale). allreduce of a sparse COO
tensor, and sparse_allreduce_async, allgather the indices and values over the set and return the
coalesced sum (Average: divided by the set's size); other ops reduce the dense tensor.
"""
import warnings
import weakref

import torch

from conflux import _args
from conflux import _core
from conflux._torch_broadcast import allgather_object as _allgather_object
from conflux._torch_compression import _wire_compression
from conflux.torch_process_sets import differentiable_collectives

from ..common import process_sets as _ps
from ..common import util as _util
from ..common.exceptions import HorovodInternalError, internal_error
from ..common.process_sets import (  # noqa: F401  (Horovod's names)
    ProcessSet, add_process_set, global_process_set, remove_process_set)
from .compression import Compression

# ---- reduction ops ----
Average = _core.Average
Sum = _core.Sum
Min = _core.Min
Max = _core.Max
Product = _core.Product
Adasum = _core.Adasum  # any number of ranks (Horovod's CPU Adasum needs a power of two)


def _resolve_op(op, average):
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    elif average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning)
        op = Average if average else Sum
    else:
        op = Average
    return op


def _horovod_rs_scale(op, pre, post, size):
    """Horovod's reducescatter gradient (HorovodReducescatter.backward): the allgathered gradient
    times the set's size for Sum, times 1 for Average, then times both scale factors. (Not the
    forward's factor, which conflux.torch's ProcessSet uses: Horovod's is `size` times that.)"""
    return (size if op == Sum else 1) * pre * post


def _check_rs_op(op):
    if op not in (Average, Sum):
        raise NotImplementedError("Reducescatter currently only supports AVERAGE and SUM.")
    return op


# ---- lifecycle and topology ----
def _checked(fn):
    try:
        return fn()
    except _core.NotInitializedError:
        raise ValueError("Horovod has not been initialized; use hvd.init().") from None


def init(comm=None, process_sets=None):
    """Initializes Conflux (collective over all ranks) and registers `process_sets` (a list of
    hvd.ProcessSet, in the same order on every rank; or "dynamic"). Repeated calls only register
    sets not registered yet; init after shutdown works. `comm` may be None, an mpi4py
    communicator spanning all ranks, or the list of all ranks; sub-communicators are not
    supported."""
    _core.init()
    if comm is not None:
        n = comm.Get_size() if hasattr(comm, "Get_size") else len(list(comm))
        if n != _core.size():
            raise NotImplementedError("hvd.init(comm=...) with a sub-communicator (%d of %d ranks) "
                                      "is not supported by Conflux; use process sets "
                                      "(hvd.init(process_sets=[hvd.ProcessSet(ranks)]))"
                                      % (n, _core.size()))
    _ps.init_process_sets(process_sets, lambda obj: _horovod_errors(_GLOBAL_OBJECTS, obj))


def _GLOBAL_OBJECTS(obj):
    return _allgather_object(obj, name="hvd.init.process_sets")


def shutdown():
    _ps.shutdown()
    _core.shutdown()


def is_initialized():
    return _core.is_initialized()


def size():
    return _checked(_core.size)


def rank():
    return _checked(_core.rank)


def local_rank():
    return _checked(_core.local_rank)


def local_size():
    return _checked(_core.local_size)


def cross_rank():
    return _checked(_core.cross_rank)


def cross_size():
    return _checked(_core.cross_size)


def is_homogeneous():
    """True when every host runs the same number of ranks."""
    return _checked(lambda: _core.local_size() * _core.cross_size() == _core.size())


# ---- what is built and enabled ----
mpi_built = _util.mpi_built
gloo_built = _util.gloo_built
nccl_built = _util.nccl_built
ddl_built = _util.ddl_built
ccl_built = _util.ccl_built
cuda_built = _util.cuda_built
rocm_built = _util.rocm_built


def mpi_enabled():
    """True while Conflux runs over its MPI transport (initialized, and the engine says its
    context's transport is MPI)."""
    return _core.is_initialized() and _core.transport_name() == "mpi"


def gloo_enabled():
    return False


def mpi_threads_supported():
    """True: Conflux's MPI transport runs with MPI_THREAD_MULTIPLE (it refuses to start
    without). ValueError when MPI is not enabled or Conflux is not initialized, as in Horovod."""
    if not mpi_enabled():
        if not _core.is_initialized():
            raise ValueError("Horovod has not been initialized; use hvd.init().")
        raise ValueError("Horovod MPI is not enabled; Please make sure it's installed and enabled.")
    return True


def start_timeline(file_path, mark_cycles=False):
    """Starts the timeline. Unlike Horovod (one file written by the coordinator), every rank writes
    its own file: "%r" in file_path is replaced by the rank, else ".rank<r>" goes before the
    extension. HOROVOD_TIMELINE=DYNAMIC is not needed."""
    _checked(lambda: _core.start_timeline(file_path, mark_cycles))


def stop_timeline():
    _checked(_core.stop_timeline)


# ---- process sets: the collectives each one runs ----
_GLOBAL = differentiable_collectives(_core.submit, _core.rank, _core.size, __name__,
                                    _horovod_rs_scale)
_set_collectives = weakref.WeakKeyDictionary()  # Subset -> its collectives


def _set_ops(process_set):
    """The collectives of a process set that is not the global set object."""
    if process_set is None or getattr(process_set, "process_set_id", None) == 0:
        return _GLOBAL
    subset = _ps.subset_of(process_set)
    ops = _set_collectives.get(subset)
    if ops is None:
        ops = differentiable_collectives(subset.submit, subset.rank, subset.size, __name__,
                                         _horovod_rs_scale)
        _set_collectives[subset] = ops
    return ops


def _ops_of(process_set):
    """The collectives `process_set` runs: the job's for the global set object, else the set's
    own. Every collective of this module picks its ops here."""
    return _GLOBAL if process_set is global_process_set else _set_ops(process_set)


def _set_root(process_set, root_rank):
    """The root's rank within the set, from the job's rank `root_rank` (the same rank for the
    global set)."""
    if process_set is global_process_set:
        return root_rank
    if process_set is None or getattr(process_set, "process_set_id", None) == 0:
        return root_rank
    return _ps.subset_of(process_set).set_rank(_args.check_root(root_rank))


# ---- handles ----
class _SparseHandle:
    """A sparse allreduce in flight: the allgathers of indices and values (Sum, Average), or the
    dense allreduce (the other ops). Calling it, wait() or synchronize() returns the reduced
    sparse tensor (coalesced)."""

    def __init__(self, tensor, ops, name, op, scale):
        self._shape = tensor.shape
        self._op = op
        self._scale = scale
        self._size = ops.size()
        if op in (Sum, Average):
            t = tensor.coalesce()
            self._parts = (
                ops.allgather_async(t.indices().t().contiguous(),
                                    None if name is None else name + ".indices"),
                ops.allgather_async(t.values().contiguous(),
                                    None if name is None else name + ".values"))
        else:
            self._parts = (ops.allreduce_async(tensor.to_dense(), op, name, scale, 1.0),)

    def poll(self):
        return all(h.poll() for h in self._parts)

    def wait(self):
        if len(self._parts) == 1:
            return self._parts[0].wait().to_sparse()
        values = self._parts[1].wait()
        indices = self._parts[0].wait()
        if self._op == Average:
            values = values / self._size
        if self._scale != 1.0:
            values = values * self._scale
        return torch.sparse_coo_tensor(indices.t(), values, self._shape).coalesce()

    __call__ = wait


def _sparse_allreduce(ops, tensor, name, op, prescale_factor, postscale_factor):
    return _SparseHandle(tensor, ops, name, op,
                         _args.check_scale(prescale_factor, "prescale_factor") *
                         _args.check_scale(postscale_factor, "postscale_factor"))


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Allreduce of a sparse COO tensor through allgathers of its indices and values over the
    set; returns a callable (also a handle for synchronize/poll) that waits and returns the
    reduced sparse tensor, coalesced (Average divides by the set's size)."""
    ops = _ops_of(process_set)
    if not getattr(tensor, "is_sparse", False):
        raise ValueError("sparse_allreduce_async needs a sparse COO tensor (layout %s given)"
                         % getattr(tensor, "layout", type(tensor).__name__))
    return _sparse_allreduce(ops, tensor, name, _resolve_op(op, None), 1.0, 1.0)


def poll(handle):
    if type(handle) is _SparseHandle:
        return handle.poll()
    return _core.poll(handle)


def _horovod_errors(fn, *args):
    """fn(*args); a failure decided across ranks (a ConfluxError that is no ValueError) is raised
    as HorovodInternalError."""
    try:
        return fn(*args)
    except _core.ConfluxError as exc:
        if isinstance(exc, ValueError):
            raise
        raise internal_error(exc) from exc


def synchronize(handle):
    """Waits for an async collective and returns its output; failures decided across ranks raise
    HorovodInternalError."""
    if type(handle) is _SparseHandle:
        return _horovod_errors(handle.wait)
    return _horovod_errors(_core.synchronize, handle)


def _sync(handle):
    return synchronize(handle)


def join(device=-1):
    """Declares that this rank has no more data; returns the last rank to join. While some ranks
    have joined, collectives other than allreduce fail at once (HorovodInternalError) on the
    ranks that call them."""
    return _sync(_core.join_async())


def barrier(process_set=global_process_set):
    ops = _ops_of(process_set)
    _sync(ops.barrier_async())


# ---- the collectives: conflux._ops.OPS with Horovod's parameters, on the process set's ops ----
# ---- generated by tools/gen-python-collectives from conflux._ops.OPS: do not edit ----
def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    ops = _ops_of(process_set)
    op = _resolve_op(op, average)
    if getattr(tensor, 'is_sparse', False):
        return _horovod_errors(_sparse_allreduce(ops, tensor, name, op, prescale_factor,
                                                 postscale_factor).wait)
    wire = _wire_compression(compression, tensor, op)
    if wire:
        return _horovod_errors(ops.allreduce, tensor, op, name, prescale_factor, postscale_factor,
                               wire)
    compressed, ctx = compression.compress(tensor)
    out = _horovod_errors(ops.allreduce, compressed, op, name, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    ops = _ops_of(process_set)
    op = _resolve_op(op, average)
    return _horovod_errors(ops.allreduce_, tensor, op, name, prescale_factor, postscale_factor)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    ops = _ops_of(process_set)
    op = _resolve_op(op, average)
    if getattr(tensor, 'is_sparse', False):
        return _sparse_allreduce(ops, tensor, name, op, prescale_factor, postscale_factor)
    return ops.allreduce_async(tensor, op, name, prescale_factor, postscale_factor)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    ops = _ops_of(process_set)
    op = _resolve_op(op, average)
    return ops.allreduce_async_(tensor, op, name, prescale_factor, postscale_factor)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    ops = _ops_of(process_set)
    op = _resolve_op(op, average)
    pairs = [compression.compress(t) for t in tensors]
    out = _horovod_errors(ops.grouped_allreduce, [t for t, _ in pairs], op, name, prescale_factor,
                          postscale_factor)
    return [compression.decompress(o, c) for o, (_, c) in zip(out, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    ops = _ops_of(process_set)
    op = _resolve_op(op, average)
    return _horovod_errors(ops.grouped_allreduce_, tensors, op, name, prescale_factor,
                           postscale_factor)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    ops = _ops_of(process_set)
    op = _resolve_op(op, average)
    return ops.grouped_allreduce_async(tensors, op, name, prescale_factor, postscale_factor)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    ops = _ops_of(process_set)
    op = _resolve_op(op, average)
    return ops.grouped_allreduce_async_(tensors, op, name, prescale_factor, postscale_factor)


def allgather(tensor, name=None, process_set=global_process_set):
    ops = _ops_of(process_set)
    out = _horovod_errors(ops.allgather, tensor, name)
    return out


def allgather_async(tensor, name=None, process_set=global_process_set):
    ops = _ops_of(process_set)
    return ops.allgather_async(tensor, name)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    ops = _ops_of(process_set)
    out = _horovod_errors(ops.grouped_allgather, tensors, name)
    return out


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    ops = _ops_of(process_set)
    return ops.grouped_allgather_async(tensors, name)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    ops = _ops_of(process_set)
    root_rank = _set_root(process_set, root_rank)
    out = _horovod_errors(ops.broadcast, tensor, root_rank, name)
    return out


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    ops = _ops_of(process_set)
    root_rank = _set_root(process_set, root_rank)
    return _horovod_errors(ops.broadcast_, tensor, root_rank, name)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    ops = _ops_of(process_set)
    root_rank = _set_root(process_set, root_rank)
    return ops.broadcast_async(tensor, root_rank, name)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    ops = _ops_of(process_set)
    root_rank = _set_root(process_set, root_rank)
    return ops.broadcast_async_(tensor, root_rank, name)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Returns the received tensor, or (received, received_splits) when `splits` is given."""
    ops = _ops_of(process_set)
    out = _horovod_errors(ops.alltoall, tensor, splits, name)
    return out[0] if splits is None else (out[0], out[1])


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    ops = _ops_of(process_set)
    return ops.alltoall_async(tensor, splits, name)


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    ops = _ops_of(process_set)
    op = _check_rs_op(op)
    compressed, ctx = compression.compress(tensor)
    out = _horovod_errors(ops.reducescatter, compressed, op, name, prescale_factor,
                          postscale_factor)
    return compression.decompress(out, ctx)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    ops = _ops_of(process_set)
    op = _check_rs_op(op)
    return ops.reducescatter_async(tensor, op, name, prescale_factor, postscale_factor)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    ops = _ops_of(process_set)
    op = _check_rs_op(op)
    pairs = [compression.compress(t) for t in tensors]
    out = _horovod_errors(ops.grouped_reducescatter, [t for t, _ in pairs], op, name,
                          prescale_factor, postscale_factor)
    return [compression.decompress(o, c) for o, (_, c) in zip(out, pairs)]


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    ops = _ops_of(process_set)
    op = _check_rs_op(op)
    return ops.grouped_reducescatter_async(tensors, op, name, prescale_factor, postscale_factor)

# ---- end of the generated part ----

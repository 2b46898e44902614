"""Horovod 0.28's `horovod.torch` API on Conflux: `import conflux.horovod.torch as hvd` is the only
change a Horovod training script needs. Names, arguments, defaults, return values and exception
types follow Horovod; what Conflux does not have yet (process sets, elastic, Adasum) raises
NotImplementedError naming the feature. docs/migrating-from-horovod.md lists
every difference.
"""
import warnings

import torch

import conflux.torch as _cfx
from conflux import _core
from conflux import _ops
from conflux.torch import Compression, Compressor, NoneCompressor, FP16Compressor  # noqa: F401
from conflux.torch import broadcast_optimizer_state as _bcast_opt_state
from conflux.torch import broadcast_parameters  # noqa: F401
from . import elastic  # noqa: F401

# ---- errors ----


class HorovodInternalError(RuntimeError):
    """Internal error raised when a Horovod collective operation (allreduce, allgather, etc) fails.
    Instances also belong to the matching conflux error class (e.g. conflux.MismatchError)."""


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by elastic Horovod when hosts change; never raised by Conflux (no elastic mode)."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


_internal_classes = {}


def _internal_error(exc):
    """A HorovodInternalError that is also an instance of `exc`'s conflux class."""
    cls = type(exc)
    sub = _internal_classes.get(cls)
    if sub is None:
        sub = type("HorovodInternalError", (HorovodInternalError, cls), {"__module__": __name__})
        _internal_classes[cls] = sub
    return sub(str(exc))


# ---- reduction ops ----
Average = _core.Average
Sum = _core.Sum
Min = _core.Min
Max = _core.Max
Product = _core.Product
Adasum = 1000  # accepted as a name; using it raises NotImplementedError


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
    if op == Adasum:
        raise NotImplementedError("Adasum reduction (op=hvd.Adasum) is not supported by Conflux yet")
    return op


# ---- process sets (only the global set) ----


class ProcessSet:
    """Only the global process set exists in Conflux; any other raises NotImplementedError."""

    def __init__(self, ranks_or_comm=None):
        if ranks_or_comm is not None:
            raise NotImplementedError("process sets (hvd.ProcessSet with ranks) are not supported "
                                      "by Conflux yet; only the global process set exists")
        self.process_set_id = 0

    @property
    def ranks(self):
        return list(range(size()))

    def size(self):
        return size()

    def rank(self):
        return rank()

    def included(self):
        return is_initialized()

    def __repr__(self):
        return "ProcessSet(process_set_id=0, global)"


global_process_set = ProcessSet()


def _check_process_set(process_set):
    if process_set is not None and process_set is not global_process_set and \
            getattr(process_set, "process_set_id", None) != 0:
        raise NotImplementedError("process sets other than hvd.global_process_set are not "
                                  "supported by Conflux yet")


def add_process_set(process_set):
    raise NotImplementedError("process sets (hvd.add_process_set) are not supported by Conflux yet")


def remove_process_set(process_set):
    raise NotImplementedError("process sets (hvd.remove_process_set) are not supported by "
                              "Conflux yet")


# ---- lifecycle and topology ----


def init(comm=None, process_sets=None):
    """Initializes Conflux (collective over all ranks). Repeated calls are no-ops; init after
    shutdown works. `comm` may be None, an mpi4py communicator spanning all ranks, or the list of
    all ranks; sub-communicators and process sets are not supported."""
    if process_sets is not None:
        raise NotImplementedError("process sets (hvd.init(process_sets=...)) are not supported by "
                                  "Conflux yet")
    _core.init()
    if comm is not None:
        n = comm.Get_size() if hasattr(comm, "Get_size") else len(list(comm))
        if n != _core.size():
            raise NotImplementedError("hvd.init(comm=...) with a sub-communicator (%d of %d ranks) "
                                      "is not supported by Conflux yet" % (n, _core.size()))


def shutdown():
    _core.shutdown()


def is_initialized():
    return _core.is_initialized()


def _query(fn):
    try:
        return fn()
    except _core.NotInitializedError:
        raise ValueError("Horovod has not been initialized; use hvd.init().") from None


def size():
    return _query(_core.size)


def rank():
    return _query(_core.rank)


def local_rank():
    return _query(_core.local_rank)


def local_size():
    return _query(_core.local_size)


def cross_rank():
    return _query(_core.cross_rank)


def cross_size():
    return _query(_core.cross_size)


def is_homogeneous():
    """True when every host runs the same number of ranks."""
    return _query(lambda: _core.local_size() * _core.cross_size() == _core.size())


def _feature(name):
    return _core.features()[name]


def mpi_built():
    return _feature("mpi")


def mpi_enabled():
    """True when the job runs over the MPI transport."""
    return _feature("mpi")


def mpi_threads_supported():
    """Conflux initializes MPI with MPI_THREAD_MULTIPLE when it is built with MPI."""
    return _feature("mpi")


def gloo_built():
    return False


def gloo_enabled():
    return False


def nccl_built():
    """1 when Conflux was built with its NCCL data path, else 0 (Horovod returns the NCCL version
    code; Conflux's ABI does not expose it)."""
    return 1 if _feature("nccl") else 0


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    return _feature("cuda")


def rocm_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    """Starts the timeline. Unlike Horovod (one file written by the coordinator), every rank writes
    its own file: "%r" in file_path is replaced by the rank, else ".rank<r>" goes before the
    extension. HOROVOD_TIMELINE=DYNAMIC is not needed."""
    _query(lambda: _core.start_timeline(file_path, mark_cycles))


def stop_timeline():
    _query(_core.stop_timeline)


# ---- handles ----


def poll(handle):
    return _core.poll(handle)


def _horovod_errors(fn, *args):
    """fn(*args); a failure decided across ranks (a ConfluxError that is no ValueError) is raised
    as HorovodInternalError."""
    try:
        return fn(*args)
    except _core.ConfluxError as exc:
        if isinstance(exc, ValueError):
            raise
        raise _internal_error(exc) from exc


def synchronize(handle):
    """Waits for an async collective and returns its output; failures decided across ranks raise
    HorovodInternalError."""
    return _horovod_errors(_core.synchronize, handle)


def _sync(handle):
    return synchronize(handle)


def _check_rs_op(op):
    if op not in (Average, Sum):
        raise NotImplementedError("Reducescatter currently only supports AVERAGE and SUM.")
    return op


# ---- the collectives: conflux.torch's (conflux._ops.OPS), with Horovod's parameters ----
_REDUCE = ("average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, "
           "process_set=global_process_set")
_SCATTER = ("name=None, op=Average, process_set=global_process_set, prescale_factor=1.0, "
            "postscale_factor=1.0")
# op: (Horovod's parameters after the input, what conflux.torch gets for its `op` parameter)
_HOROVOD = {
    "allreduce": (_REDUCE, "_resolve_op(op, average)"),
    "grouped_allreduce": (_REDUCE, "_resolve_op(op, average)"),
    "allgather": ("name=None, process_set=global_process_set", None),
    "grouped_allgather": ("name=None, process_set=global_process_set", None),
    "broadcast": ("root_rank, name=None, process_set=global_process_set", None),
    "alltoall": ("splits=None, name=None, process_set=global_process_set", None),
    "reducescatter": (_SCATTER, "_check_rs_op(op)"),
    "grouped_reducescatter": (_SCATTER, "_check_rs_op(op)"),
}
_DOCS = {"alltoall": "Returns the received tensor, or (received, received_splits) when `splits` "
                     "is given."}


def _blocking_body(op, x, names):
    """The body of op's blocking out-of-place form. A reduction compresses its input(s) and
    decompresses the result. A collective that conflux.torch makes differentiable goes through
    conflux.torch's blocking form, and every failure of that call (at the call too) is Horovod's;
    the others wait for the async form (_sync: failures decided across ranks)."""
    op_arg = _HOROVOD[op.name][1]
    lines, arg, result = [], x, "out"
    differentiable = op.name in _cfx._ADAPTER.autograd
    if differentiable:
        lines.append("_check_process_set(process_set)")
        if op_arg:
            lines.append("op = " + op_arg)
    if "op" in op.params and op.grouped:
        lines.append("pairs = [compression.compress(t) for t in %s]" % x)
        arg = "[t for t, _ in pairs]"
        result = "[compression.decompress(o, c) for o, (_, c) in zip(out, pairs)]"
    elif "op" in op.params:
        lines.append("compressed, ctx = compression.compress(%s)" % x)
        arg, result = "compressed", "compression.decompress(out, ctx)"
    if differentiable:
        call = "_horovod_errors(_cfx.%s, %s)" % (op.name, ", ".join((arg,) + op.params))
    else:
        call = "_sync(%s_async(%s))" % (op.name, ", ".join([arg] + names))
    lines.append("out = " + call)
    if op.result == _ops.SPLITS:
        result = "out[0] if splits is None else (out[0], out[1])"
    lines.append("return " + result)
    return "".join("    %s\n" % line for line in lines)


def _horovod_sources(op):
    """{name: source of its def} of op's Horovod functions."""
    params, op_arg = _HOROVOD[op.name]
    x = "tensors" if op.grouped else "tensor"
    names = [p.split("=")[0].strip() for p in params.split(",")]
    cfx_args = ", ".join([x] + [op_arg if p == "op" else p for p in op.params])
    sources = {}
    for name in _ops.forms(op):
        signature = params
        if name.endswith("_async") or name.endswith("_async_"):
            body = ("    _check_process_set(process_set)\n"
                    "    return _cfx.%s(%s)\n" % (name, cfx_args))
        elif name.endswith("_"):
            body = "    return _sync(%s_async_(%s))\n" % (op.name, ", ".join([x] + names))
        else:
            if "op" in op.params:
                signature = params.replace("name=None", "name=None, compression=Compression.none")
            body = _blocking_body(op, x, names)
        sources[name] = "def %s(%s, %s):\n%s" % (name, x, signature, body)
    return sources


for _op in _ops.OPS:
    _ops.define(globals(), "<%s.%s, made from _HOROVOD>" % (__name__, _op.name),
                _horovod_sources(_op), globals(), _DOCS)
del _op


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Allreduce of a sparse tensor through allgathers of its indices and values; returns a
    callable that waits and returns the reduced sparse tensor (Average or Sum)."""
    _check_process_set(process_set)
    if op not in (Average, Sum):
        raise NotImplementedError("sparse_allreduce_async supports op=Average and op=Sum only")
    t = tensor.coalesce()
    indices = t.indices().t().contiguous()
    values = t.values().contiguous()
    hi = _cfx.allgather_async(indices, name=None if name is None else name + ".indices")
    hv = _cfx.allgather_async(values, name=None if name is None else name + ".values")

    def handle():
        idx = _sync(hi).t()
        vals = _sync(hv)
        if op == Average:
            vals = vals / size()
        return torch.sparse_coo_tensor(idx, vals, size=t.size())
    return handle


def join(device=-1):
    """Declares that this rank has no more data; returns the last rank to join."""
    return _sync(_core.join_async())


def barrier(process_set=global_process_set):
    _check_process_set(process_set)
    _sync(_core.barrier_async())


# ---- training helpers ----


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Horovod's DistributedOptimizer: gradients are allreduced from backward hooks as they become
    ready and step() waits for them. `num_groups`/`groups` (grouping hints) are accepted and
    ignored: Conflux fuses ready tensors by itself."""
    _check_process_set(process_set)
    if op == Adasum:
        raise NotImplementedError("DistributedOptimizer(op=hvd.Adasum) is not supported by "
                                  "Conflux yet")
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed "
                      "in v0.23.0.", DeprecationWarning)
    return _cfx.DistributedOptimizer(optimizer, named_parameters=named_parameters,
                                      compression=compression,
                                      backward_passes_per_step=backward_passes_per_step, op=op,
                                      gradient_predivide_factor=gradient_predivide_factor)


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    return _bcast_opt_state(optimizer, root_rank, model)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    _check_process_set(process_set)
    return _cfx.broadcast_object(obj, root_rank, name)


def allgather_object(obj, name=None, process_set=global_process_set):
    _check_process_set(process_set)
    return _cfx.allgather_object(obj, name)


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Batch normalization with statistics over the whole global batch (all ranks) in training;
    plain batch norm at size 1 and in eval mode."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training or size() == 1:
            return super().forward(input)
        c = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        count = torch.tensor([input.numel() // c], dtype=input.dtype)
        stats = torch.cat([input.sum(dims), (input * input).sum(dims), count])
        stats = _cfx.allreduce(stats, op=Sum)  # differentiable: backward sums the gradients
        n = stats[-1]
        mean = stats[:c] / n
        var = stats[c:2 * c] / n - mean * mean
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = self.momentum if self.momentum is not None else \
                    1.0 / float(self.num_batches_tracked)
                unbiased = var * (n / (n - 1)) if n > 1 else var
                self.running_mean.mul_(1 - m).add_(mean.detach() * m)
                self.running_var.mul_(1 - m).add_(unbiased.detach() * m)
        shape = [1, c] + [1] * (input.dim() - 2)
        out = (input - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out

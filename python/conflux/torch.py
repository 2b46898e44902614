"""Conflux collectives on torch tensors, DistributedOptimizer and the broadcast helpers.

Nothing here is compiled against torch: a tensor crosses the ABI as (data_ptr(), dtype, shape,
device, stream), so any torch version works. Tensors are kept alive by the handle until the
collective completes. Out-of-place collectives accept non-contiguous tensors (they are made
contiguous first); in-place ones (`..._`) need contiguous tensors.

    import conflux.torch as cfx
    cfx.init()
    opt = cfx.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    cfx.broadcast_parameters(model.state_dict(), root_rank=0)

`shared_empty` / `shared_zeros` make CPU tensors in shared tensor memory (large CPU allreduces on
one host get cheaper; see conflux.shared_array).

Importing this module also registers torch.distributed's backend "conflux"
(`dist.init_process_group("conflux")`, conflux.torch_backend); `ddp_hooks` are its DDP
communication hooks.
"""
import pickle
import sys

import torch

from . import _capi
from . import _core
from . import _ops
from ._core import (  # noqa: F401  (re-exported API)
    Adasum, Average, Handle, Max, Min, Product, Sum,
    cross_rank, cross_size, features, init, is_initialized, local_rank, local_size, rank,
    shutdown, size, version, start_timeline, stop_timeline, timeline,
    reform, membership_round, member_id, membership_pending,
)
# The error classes: one per status of the C library (conflux._core.ERROR_NAMES).
globals().update((name, getattr(_core, name)) for name in _core.ERROR_NAMES)

__all__ = list(_core.BASE_NAMES) + list(_ops.NAMES) + [
    "barrier", "join", "poll", "synchronize", "Handle",
    "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
    "broadcast_object", "allgather_object", "Compression", "Compressor", "NoneCompressor",
    "FP16Compressor", "shared_empty", "shared_zeros", "ProcessSet",
] + list(_core.ERROR_NAMES)

# The tensor side of the collectives (dtypes, descriptions, results, shared tensor memory) is
# conflux._torch_adapter's, shared with the process sets' functions (conflux.torch_process_sets).
from ._torch_adapter import (  # noqa: F401, E402  (shared_empty, shared_zeros: this module's API)
    _CFX_TO_TORCH, _TORCH_TO_CFX, _allocate_host, _check_dtype, _check_tensor, _copy, _describe, _strided,
    _differentiable, _inplace, _input, _output, _output_like, shared_empty, shared_zeros,
    ADAPTER as _TENSOR_ADAPTER, DOCS as _DOCS)


def poll(handle):
    """True when `handle` completed."""
    return _core.poll(handle)


def synchronize(handle, timeout=None):
    """Waits for `handle` and returns its result (a tensor, a list of tensors or a tuple)."""
    return _core.synchronize(handle, timeout)


# ---- the collectives (conflux._ops.OPS) ----
class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, name, prescale_factor, postscale_factor, compression):
        ctx.args = (op, prescale_factor, postscale_factor, compression)
        return allreduce_async(tensor, op, name, prescale_factor, postscale_factor,
                               compression).wait()

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, compression = ctx.args
        return (allreduce_async(grad, op, None, pre, post, compression).wait(),
                None, None, None, None, None)


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):
        h = allgather_async(tensor, name)
        out = h.wait()
        ctx.rows = tensor.shape[0]
        return out

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce_async(grad, Average).wait()
        rows = allgather_async(torch.tensor([ctx.rows], dtype=torch.int64)).wait()
        offset = int(rows[:rank()].sum().item())
        return reduced.narrow(0, offset, ctx.rows), None


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank = root_rank
        return broadcast_async(tensor, root_rank, name).wait()

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce_async(grad, Average).wait()
        if rank() != ctx.root_rank:
            reduced.zero_()
        return reduced, None, None


try:  # conflux.torch's C++ (bindings/python/torch_native.cpp), where the build has it
    from . import _torch_native
except ImportError:  # not built, or built against another torch
    _torch_native = None
if _torch_native is not None:
    _torch_native.init_allreduce(_core.raise_status)
_ADAPTER = _TENSOR_ADAPTER._replace(
    autograd={"allreduce": _AllreduceFn, "allgather": _AllgatherFn, "broadcast": _BroadcastFn},
    native=_torch_native.allreduce if _torch_native is not None else None)
_ops.install(globals(), _ADAPTER, _DOCS)


def barrier():
    """Returns once every rank reached the barrier."""
    _core.barrier()


def join(device=-1):
    """Declares that this rank has no more data; returns the last rank to join. `device` is
    accepted for Horovod compatibility (Conflux picks the device from the tensors)."""
    return _core.join_async().wait()


# ---- compression ----
class Compressor:
    """Interface for compressing and decompressing a tensor around the allreduce."""

    @staticmethod
    def compress(tensor):
        """Returns (compressed tensor, context for decompress)."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (halves the bytes on the wire)."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.type(ctx)


class Compression:
    """Horovod's compressors. Passed to this module's allreduce or DistributedOptimizer, they
    name the engine's wire compression (none: conflux.Compression.none, fp16:
    conflux.Compression.fp16): no cast in Python, the engine rounds where it sends 16-bit values
    and combines in float32. compress()/decompress() are what Horovod's cast does."""
    none = NoneCompressor
    fp16 = FP16Compressor


_core.COMPRESSION_ALIASES[NoneCompressor] = _core.Compression.none
_core.COMPRESSION_ALIASES[FP16Compressor] = _core.Compression.fp16
_WIRE_DTYPES = (torch.float32, torch.float64)


def _compressible(tensor):
    """Whether the engine compresses an allreduce of `tensor` (under an op other than Adasum):
    dense float32/float64 CPU tensors."""
    return tensor.dtype in _WIRE_DTYPES and tensor.is_cpu and tensor.layout == _strided


def _wire_compression(compressor, tensor, op):
    """What a Horovod compressor given for `tensor`'s allreduce with `op` becomes: the engine's
    fp16 compression for Compression.fp16 (that class, not a subclass of one's own) where the
    engine compresses, else 0: the compressor's compress()/decompress() apply (its cast for
    float16, bfloat16 and CUDA tensors and under Adasum, nothing for integers)."""
    if compressor is FP16Compressor and op != Adasum and _compressible(tensor):
        return _core.Compression.fp16
    return 0


# ---- broadcast helpers ----
def broadcast_parameters(params, root_rank):
    """Broadcasts parameters/buffers in place from root_rank: a state_dict or dict (sorted by key),
    or a sequence of tensors or (name, tensor) pairs (model.named_parameters())."""
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    handles = []
    for name, p in params:
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise ValueError("broadcast_parameters: %s is not a tensor (%s)"
                             % (name, type(p).__name__))
        handles.append(broadcast_async_(p.data if isinstance(p, torch.nn.Parameter) else p,
                                        root_rank, None if name is None else "bcast." + name))
    for h in handles:
        h.wait()


def broadcast_object(obj, root_rank=0, name=None):
    """Returns root_rank's `obj` (pickled, its size broadcast first, then the bytes)."""
    base = name or "default"  # the same on every rank (non-root ranks may pass None)
    if rank() == root_rank:
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        length = torch.tensor([len(payload)], dtype=torch.int64)
    else:
        payload = None
        length = torch.zeros(1, dtype=torch.int64)
    broadcast_(length, root_rank, name="bcast_object.%s.size" % base)
    n = int(length.item())
    if payload is not None:
        buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if n else torch.zeros(0, dtype=torch.uint8)
    else:
        buf = torch.zeros(n, dtype=torch.uint8)
    broadcast_(buf, root_rank, name="bcast_object.%s.data" % base)
    if payload is not None:
        return obj
    return pickle.loads(buf.numpy().tobytes())


def allgather_object(obj, name=None):
    """Returns a list of every rank's `obj`, in rank order."""
    base = name or "default"
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    sizes = allgather(torch.tensor([len(payload)], dtype=torch.int64),
                      name="allgather_object.%s.size" % base)
    data = allgather(buf, name="allgather_object.%s.data" % base).numpy().tobytes()
    out, off = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(data[off:off + n]))
        off += n
    return out


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Makes every rank's optimizer state (per-parameter state and hyper-parameters) equal to
    root_rank's. Ranks whose state is still empty get it created from root's."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state = optimizer.state_dict()
    state = broadcast_object(state if rank() == root_rank else None, root_rank,
                             name="optimizer_state")
    if rank() != root_rank:
        optimizer.load_state_dict(state)


# ---- process sets ----
from .torch_process_sets import ProcessSet  # noqa: E402  (needs the module above)


# The optimizer (conflux/torch_optimizer.py) builds on the names above.
from .torch_optimizer import DistributedOptimizer  # noqa: E402


# torch.distributed's backend "conflux" (conflux/torch_backend.py), registered once.
from .torch_backend import ddp_hooks, register as _register_backend  # noqa: E402
_register_backend(sys.modules[__name__])

# Elastic training (docs/elastic.md): conflux.torch.elastic.run, TorchState, ObjectState.
from . import torch_elastic as elastic  # noqa: E402
elastic.attach(sys.modules[__name__])

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
"""
import math
import pickle

import torch

from . import _capi
from . import _core
from . import _ops
from ._core import (  # noqa: F401  (re-exported API)
    Adasum, Average, Handle, Max, Min, Product, Sum,
    cross_rank, cross_size, features, init, is_initialized, local_rank, local_size, rank,
    shutdown, size, version, start_timeline, stop_timeline, timeline,
    ConfluxError, InvalidArgumentError, NotInitializedError, ShutDownError, DuplicateNameError,
    MismatchError, UnsupportedError, OutOfMemoryError, TransportError, WaitTimeoutError,
    InProgressError, StaleHandleError, StallError, PeerLostError, ConfigError, VersionError,
    JoinedError, InternalError, CudaError, NcclError, DtypeError, MembershipChangedError,
    reform, membership_round, member_id, membership_pending,
)

__all__ = list(_core.BASE_NAMES) + list(_ops.NAMES) + [
    "barrier", "join", "poll", "synchronize", "Handle",
    "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
    "broadcast_object", "allgather_object", "Compression", "Compressor", "NoneCompressor",
    "FP16Compressor", "shared_empty", "shared_zeros", "ProcessSet",
] + list(_core.ERROR_NAMES)

# ---- torch dtypes <-> ABI dtypes ----
_TORCH_TO_CFX = {
    torch.uint8: _core.UINT8,
    torch.int8: _core.INT8,
    torch.int16: _core.INT16,
    torch.int32: _core.INT32,
    torch.int64: _core.INT64,
    torch.float16: _core.FLOAT16,
    torch.bfloat16: _core.BFLOAT16,
    torch.float32: _core.FLOAT32,
    torch.float64: _core.FLOAT64,
    torch.bool: _core.BOOL,
}
if hasattr(torch, "uint16"):  # torch >= 2.3
    _TORCH_TO_CFX[torch.uint16] = _core.UINT16
_CFX_TO_TORCH = {code: dt for dt, code in _TORCH_TO_CFX.items()}


def _check_dtype(dtype):
    if dtype not in _TORCH_TO_CFX:
        raise _core.DtypeError("Tensor type %s is not supported by Conflux; supported: %s"
                        % (dtype, ", ".join(str(d) for d in _TORCH_TO_CFX)))
    return _TORCH_TO_CFX[dtype]


_Tensor, _strided = torch.Tensor, torch.strided


def _check_tensor(t, what):
    if not isinstance(t, _Tensor):
        raise TypeError("%s needs a torch.Tensor, not %s" % (what, type(t).__name__))
    if t.layout != _strided:
        raise TypeError("%s needs a dense (strided) tensor, not %s" % (what, t.layout))
    if t.dtype not in _TORCH_TO_CFX:
        _check_dtype(t.dtype)


def _describe(t):
    """The ABI's view of a contiguous tensor: its own memory (zero copy). A CUDA tensor also
    carries its device index and the current stream of that device (the producer's stream: Conflux
    orders its reads after the work queued there, and that stream after Conflux's writes)."""
    if t.is_cpu:  # (t.device makes a new object on every call)
        return (t.data_ptr(), _TORCH_TO_CFX[t.dtype], t.shape)
    if t.is_cuda:
        stream = torch.cuda.current_stream(t.device).cuda_stream
        return (t.data_ptr(), _TORCH_TO_CFX[t.dtype], tuple(t.shape), t.device.index, stream)
    raise TypeError("Conflux supports CPU and CUDA tensors, not device %s" % t.device)


def _inplace(t, what):
    _check_tensor(t, what)
    if not t.is_contiguous():
        raise ValueError("Tensor is required to be contiguous for in-place %s." % what)
    return t  # the ABI writes its memory through data_ptr(): autograd never sees the write


def _input(t, what):
    _check_tensor(t, what)
    # Read through data_ptr() only; a copy is made detached (no autograd node for it).
    return t if t.is_contiguous() else t.detach().contiguous()


def _allocate_host(code, shape):
    out = torch.empty(tuple(shape), dtype=_CFX_TO_TORCH[code], device="cpu")
    return out, out.data_ptr(), out.numel() * out.element_size()


def _output(handle, index, like):
    """Output `index` of a completed handle as a tensor on the device of input `like`. Conflux
    allocates the outputs of allgather, alltoall and reducescatter in host memory, also for CUDA
    inputs (docs/gpu.md), and copies them with plain memcpy: they land in a CPU tensor, which then
    moves to the device."""
    out = handle.output(index, _allocate_host)
    return out if like.device.type == "cpu" else out.to(like.device)


# ---- shared tensor memory ----
def shared_empty(*size, dtype=torch.float32):
    """A new contiguous CPU tensor in shared tensor memory (cfx_alloc), contents undefined like
    torch.empty; `size` as for torch.empty (ints, or one sequence). The tensor wraps a numpy
    array over the block (torch.from_numpy, then a dtype view: bfloat16 has no numpy dtype), so the
    memory lives while the tensor, any view of it or a collective using it does
    (conflux.shared_array has the rest)."""
    code = _check_dtype(dtype)
    shape = _core.check_shape(size[0] if len(size) == 1 else size)
    raw = _core.shared_bytes(math.prod(shape) * _core.dtype_size(code))
    return torch.from_numpy(raw).view(dtype).view(shape)


def shared_zeros(*size, dtype=torch.float32):
    """shared_empty, filled with zeros (which commits its pages)."""
    return shared_empty(*size, dtype=dtype).zero_()


def _output_like(t):
    """An out-of-place result for the contiguous tensor `t` and its address: in shared tensor
    memory when `t` is (so the batch can still take the direct path), else an ordinary tensor on
    t's device."""
    if t.is_cpu and _capi.cfx_is_shared(t.data_ptr(), t.numel() * t.element_size()):
        out = shared_empty(tuple(t.shape), dtype=t.dtype)
    else:
        out = torch.empty_like(t, memory_format=torch.contiguous_format)
    return out, out.data_ptr()


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


def _differentiable(t, what):
    """True when the blocking form must go through its autograd Function: t needs a gradient."""
    if torch.is_grad_enabled() and isinstance(t, torch.Tensor) and t.requires_grad:
        _check_tensor(t, what)
        return True
    return False


def _copy(t, what):
    _check_tensor(t, what)
    return t.detach().clone(memory_format=torch.contiguous_format)


_DOCS = {
    "allreduce": "Returns a new tensor reduced over all ranks (differentiable: the gradient is "
                 "allreduced\nwith the same op and compression). `compression`: a "
                 "conflux.Compression, or Compression.none\nand Compression.fp16 of this module "
                 "(conflux.Compression.none and .fp16).",
    "allreduce_": "In-place allreduce; returns `tensor`.",
    "allreduce_async": "Starts an allreduce into a new tensor; synchronize() returns it.",
    "allreduce_async_": "Starts an in-place allreduce; synchronize() returns `tensor`.",
    "grouped_allreduce": "Allreduces a list of tensors together; returns new tensors.",
    "allgather": "Concatenates every rank's tensor along dim 0 (differentiable).",
    "broadcast": "Returns a new tensor holding root_rank's values (differentiable).",
    "broadcast_": "Overwrites `tensor` with root_rank's values; returns it.",
    "alltoall": "Sends splits[j] rows to rank j; returns (received, received_splits).",
    "reducescatter": "Reduces over ranks; returns this rank's block of dim 0.",
}
try:  # conflux.torch's C++ (bindings/python/torch_native.cpp), where the build has it
    from . import _torch_native
except ImportError:  # not built, or built against another torch
    _torch_native = None
if _torch_native is not None:
    _torch_native.init_allreduce(_core.raise_status)
_ADAPTER = _ops.Adapter(
    nouns=("tensor", "tensors"), inplace=_inplace, input=_input, copy=_copy, describe=_describe,
    output_like=_output_like, ndim=lambda t: t.dim(), output=_output,
    as_splits=lambda splits: torch.tensor(splits, dtype=torch.int32),
    autograd={"allreduce": _AllreduceFn, "allgather": _AllgatherFn, "broadcast": _BroadcastFn},
    differentiable=_differentiable,
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

# Elastic training (docs/elastic.md): conflux.torch.elastic.run, TorchState, ObjectState.
from . import torch_elastic as elastic  # noqa: E402,F401

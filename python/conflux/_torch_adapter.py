"""The tensor side of conflux.torch's collectives: torch dtypes and the ABI's, how a tensor is
checked, described, copied and allocated (shared tensor memory too), and the Adapter and
docstrings that conflux._ops.install() takes. conflux.torch and conflux.torch_process_sets build
on it (each adds its autograd Functions); it imports no module of the package that imports it.
"""
import math

import torch

from . import _args
from . import _capi
from . import _core
from . import _ops

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
    shape = _args.check_shape(size[0] if len(size) == 1 else size)
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


def _differentiable(t, what):
    """True when the blocking form must go through its autograd Function: t needs a gradient."""
    if torch.is_grad_enabled() and isinstance(t, torch.Tensor) and t.requires_grad:
        _check_tensor(t, what)
        return True
    return False


def _copy(t, what):
    _check_tensor(t, what)
    return t.detach().clone(memory_format=torch.contiguous_format)


DOCS = {
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
ADAPTER = _ops.Adapter(
    inplace=_inplace, input=_input, copy=_copy, describe=_describe,
    output_like=_output_like, ndim=lambda t: t.dim(), output=_output,
    as_splits=lambda splits: torch.tensor(splits, dtype=torch.int32), autograd={},
    differentiable=_differentiable)

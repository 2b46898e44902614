"""conflux.torch's collectives on the job's context (every rank): the functions of conflux._ops
made with the torch Adapter (conflux._torch_adapter), the autograd of the differentiable ones, the
lone allreduce in C++ where the build has conflux._torch_native, and poll, synchronize, barrier
and join. conflux.torch re-exports them; the modules under it (broadcast helpers, optimizers, the
torch.distributed backend) import them from here, so none of them needs conflux.torch itself.
"""
import torch

from . import _core
from . import _ops
from ._core import Average, rank
from ._torch_adapter import ADAPTER as _TENSOR_ADAPTER, DOCS as _DOCS


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


# Users import these from conflux.torch, which re-exports them: pickles and help() name it.
for _public in [globals()[name] for name in _ops.NAMES] + [poll, synchronize, barrier, join]:
    _public.__module__ = "conflux.torch"

"""Torch collectives on a context of one's choice, differentiable: conflux.torch.ProcessSet, and
the functions conflux.horovod.torch runs on every process set (the global one too).

Besides allreduce, allgather and broadcast (differentiable in conflux.torch too), alltoall,
reducescatter and the grouped ops are differentiable here, as in Horovod: the gradient of
- allreduce is the allreduce of the gradient (same op, scale factors and compression);
- allgather is the average over the ranks of the gradient, this rank's rows of it;
- broadcast is the average of the gradient on the root rank, zero elsewhere;
- alltoall is the alltoall of the gradient back to where its rows came from;
- reducescatter is the allgather of the gradient, scaled like the forward (Average: / size);
  conflux.horovod.torch passes Horovod's factor instead (Sum: x size, Average: x 1, times the
  scale factors);
- a grouped op is the grouped form of that, over the gradients of the group.
Ranks and sizes are those of the set the functions run on.
"""
import types

import torch

from . import _core
from ._torch_adapter import ADAPTER as _ADAPTER, DOCS as _DOCS, _differentiable
from .process_sets import ProcessSet as _ProcessSet, collectives as _collectives



def _needs_grad(x, what):
    """The adapter's `differentiable`: x, a tensor or a group of them, needs a gradient."""
    if not torch.is_grad_enabled():
        return False
    if isinstance(x, (list, tuple)):
        return any(isinstance(t, torch.Tensor) and t.requires_grad for t in x)
    return _differentiable(x, what)


class _Group:
    """Applies a Function over a group: autograd sees the group's tensors as its arguments."""

    def __init__(self, fn):
        self.fn = fn

    def apply(self, tensors, *params):
        return list(self.fn.apply(*params, *tensors))


def _rows_before(ns, rows):
    """The number of rows of each of `rows` (this rank's dim 0 of each tensor of a group) that the
    ranks before this one in the set gave."""
    per_rank = ns.allgather_async(torch.tensor(rows, dtype=torch.int64)).wait()
    return per_rank.view(ns.size(), len(rows))[:ns.rank()].sum(0).tolist()


def reducescatter_scale(op, pre, post, size):
    """The factor of reducescatter's gradient (the allgathered gradient): the forward's."""
    return pre * post / (size if op == _core.Average else 1)


def _scaled(grads, scale):
    return [g if scale == 1 else g * scale for g in grads]


def _autograd(ns, rs_scale):
    """The autograd Functions of the collectives of `ns` (a namespace with their async forms,
    rank() and size()); rs_scale(op, pre, post, size) scales reducescatter's gradient."""

    class Allreduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, tensor, op, name, pre, post, compression):
            ctx.args = (op, pre, post, compression)
            return ns.allreduce_async(tensor, op, name, pre, post, compression).wait()

        @staticmethod
        def backward(ctx, grad):
            op, pre, post, compression = ctx.args
            return (ns.allreduce_async(grad, op, None, pre, post, compression).wait(),
                    None, None, None, None, None)

    class GroupedAllreduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, op, name, pre, post, *tensors):
            ctx.args = (op, pre, post)
            return tuple(ns.grouped_allreduce_async(list(tensors), op, name, pre, post).wait())

        @staticmethod
        def backward(ctx, *grads):
            op, pre, post = ctx.args
            out = ns.grouped_allreduce_async(list(grads), op, None, pre, post).wait()
            return (None, None, None, None) + tuple(out)

    class Allgather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, tensor, name):
            ctx.rows = tensor.shape[0]
            return ns.allgather_async(tensor, name).wait()

        @staticmethod
        def backward(ctx, grad):
            reduced = ns.allreduce_async(grad, _core.Average).wait()
            return reduced.narrow(0, _rows_before(ns, [ctx.rows])[0], ctx.rows), None

    class GroupedAllgather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, name, *tensors):
            ctx.rows = [t.shape[0] for t in tensors]
            return tuple(ns.grouped_allgather_async(list(tensors), name).wait())

        @staticmethod
        def backward(ctx, *grads):
            reduced = ns.grouped_allreduce_async(list(grads), _core.Average).wait()
            offsets = _rows_before(ns, ctx.rows)
            return (None,) + tuple(g.narrow(0, o, n)
                                   for g, o, n in zip(reduced, offsets, ctx.rows))

    class Broadcast(torch.autograd.Function):
        @staticmethod
        def forward(ctx, tensor, root_rank, name):
            ctx.root_rank = root_rank
            return ns.broadcast_async(tensor, root_rank, name).wait()

        @staticmethod
        def backward(ctx, grad):
            reduced = ns.allreduce_async(grad, _core.Average).wait()
            if ns.rank() != ctx.root_rank:
                reduced.zero_()
            return reduced, None, None

    class Alltoall(torch.autograd.Function):
        @staticmethod
        def forward(ctx, tensor, splits, name):
            out, received = ns.alltoall_async(tensor, splits, name).wait()
            ctx.received = received
            ctx.mark_non_differentiable(received)
            return out, received

        @staticmethod
        def backward(ctx, grad, _):
            return ns.alltoall_async(grad, ctx.received).wait()[0], None, None

    class Reducescatter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, tensor, op, name, pre, post):
            ctx.args = (op, pre, post)
            return ns.reducescatter_async(tensor, op, name, pre, post).wait()

        @staticmethod
        def backward(ctx, grad):
            gathered = ns.allgather_async(grad).wait()
            return (_scaled([gathered], rs_scale(*ctx.args, ns.size()))[0],
                    None, None, None, None)

    class GroupedReducescatter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, op, name, pre, post, *tensors):
            ctx.args = (op, pre, post)
            return tuple(ns.grouped_reducescatter_async(list(tensors), op, name, pre, post).wait())

        @staticmethod
        def backward(ctx, *grads):
            gathered = ns.grouped_allgather_async(list(grads)).wait()
            return (None, None, None, None) + tuple(_scaled(gathered,
                                                            rs_scale(*ctx.args, ns.size())))

    return {"allreduce": Allreduce, "grouped_allreduce": _Group(GroupedAllreduce),
            "allgather": Allgather, "grouped_allgather": _Group(GroupedAllgather),
            "broadcast": Broadcast, "alltoall": Alltoall, "reducescatter": Reducescatter,
            "grouped_reducescatter": _Group(GroupedReducescatter)}


def differentiable_collectives(submit, rank, size, module, rs_scale=reducescatter_scale):
    """A namespace of every torch collective (conflux.torch's functions, with barrier(_async) and
    join(_async)) starting its collectives through `submit`, all of its blocking out-of-place
    forms differentiable; rank() and size() are those of the ranks it runs on. `rs_scale`: the
    factor of reducescatter's gradient (conflux.horovod.torch gives Horovod's)."""
    ns = types.SimpleNamespace(rank=rank, size=size)
    adapter = _ADAPTER._replace(autograd=_autograd(ns, rs_scale), differentiable=_needs_grad)
    ns.__dict__.update(_collectives(adapter, _DOCS, submit, module))
    return ns


class ProcessSet(_ProcessSet):
    """conflux.ProcessSet for torch tensors: the functions of conflux.torch over the ranks
    `ranks`, differentiable (reducescatter and the grouped ops too; see
    conflux.torch_process_sets). Collective to create, on every rank with the same ranks."""

    def _collectives(self, submit):
        ns = differentiable_collectives(submit, self.rank, self.size, "conflux.torch")
        return {k: v for k, v in vars(ns).items() if k not in ("rank", "size")}

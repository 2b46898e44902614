"""horovod.torch.functions: broadcasting parameters, optimizer state and objects, gathering
objects; each over a process set (the global one by default), with root ranks the job's ranks.
Objects travel pickled by cloudpickle, as in Horovod (lambdas and local classes too), or by
pickle where cloudpickle is not installed (Debian: python3-cloudpickle)."""
import pickle

import torch

try:
    from cloudpickle import dumps as _dumps
except ImportError:  # the standard pickle: module-level objects only
    def _dumps(obj):
        return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)

from conflux._torch_broadcast import _named_tensors

from . import mpi_ops as _mpi
from .mpi_ops import global_process_set


def _on(process_set, root_rank=None):
    """(the set's collectives, the root's rank within the set)."""
    if process_set is global_process_set:
        return _mpi._GLOBAL, root_rank
    ops = _mpi._set_ops(process_set)
    return ops, None if root_rank is None else _mpi._set_root(process_set, root_rank)


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Broadcasts the parameters from root rank to all other processes of the set, in place.
    Typical usage is to broadcast the ``model.state_dict()``, ``model.named_parameters()``, or
    ``model.parameters()``."""
    ops, root = _on(process_set, root_rank)
    handles = [ops.broadcast_async_(p.data if isinstance(p, torch.nn.Parameter) else p, root,
                                    None if name is None else "broadcast_parameters." + name)
               for name, p in _named_tensors(params)]
    for h in handles:
        _mpi.synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Broadcasts an optimizer state from root rank to all other processes of the set: the
    per-parameter state and the hyper-parameters become root's (a rank whose state is empty,
    e.g. a new optimizer, gets it made from root's; parameters without a gradient, p.grad None,
    have no state on root and so have none anywhere). `model` is accepted and not needed."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    ops, root = _on(process_set, root_rank)
    mine = ops.rank() == root
    state = _broadcast_object(ops, optimizer.state_dict() if mine else None, root,
                              "broadcast_optimizer_state")
    if not mine:
        optimizer.load_state_dict(state)


def _broadcast_object(ops, obj, root, name):
    if ops.rank() == root:
        payload = torch.frombuffer(bytearray(_dumps(obj)),
                                   dtype=torch.uint8)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        payload, length = None, torch.zeros(1, dtype=torch.int64)
    _mpi.synchronize(ops.broadcast_async_(length, root, name + ".sz"))
    if payload is None:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    _mpi.synchronize(ops.broadcast_async_(payload, root, name + ".t"))
    return obj if ops.rank() == root else pickle.loads(payload.numpy().tobytes())


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Serializes and broadcasts an object from root rank to all other processes of the set;
    returns it. `name` (the same on every rank; default "broadcast_object") names the tensors."""
    ops, root = _on(process_set, root_rank)
    return _broadcast_object(ops, obj, root, name or "broadcast_object")


def allgather_object(obj, name=None, process_set=global_process_set):
    """Serializes and allgathers an object from all other processes of the set: the list of
    every rank's object, in the order of the set's ranks."""
    ops, _ = _on(process_set)
    base = name or "allgather_object"
    payload = torch.frombuffer(bytearray(_dumps(obj)),
                               dtype=torch.uint8)
    sizes = _mpi.synchronize(ops.allgather_async(
        torch.tensor([payload.numel()], dtype=torch.int64), base + ".sz")).tolist()
    data = _mpi.synchronize(ops.allgather_async(payload, base + ".t")).numpy().tobytes()
    ends = [sum(sizes[:i + 1]) for i in range(len(sizes))]
    return [pickle.loads(data[end - n:end]) for n, end in zip(sizes, ends)]

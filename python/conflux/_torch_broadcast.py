"""conflux.torch's broadcast helpers: a model's parameters, an optimizer's state and any
picklable object from one rank to all (broadcast_parameters, broadcast_optimizer_state,
broadcast_object), and every rank's object to all (allgather_object), over the job's context.
"""
import pickle

import torch

from ._core import rank
from ._torch_collectives import allgather, broadcast_, broadcast_async_


def _named_tensors(params):
    """(name, tensor) pairs of a state_dict/dict (sorted by key) or a sequence of tensors or
    (name, tensor) pairs (model.named_parameters(), model.parameters())."""
    if isinstance(params, dict):
        pairs = sorted(params.items())
    elif isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        pairs = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    for name, p in pairs:
        if p is not None and not isinstance(p, torch.Tensor):
            raise ValueError("broadcast_parameters: %s is not a tensor (%s)"
                             % (name, type(p).__name__))
    return [(name, p) for name, p in pairs if p is not None]


def broadcast_parameters(params, root_rank):
    """Broadcasts parameters/buffers in place from root_rank: a state_dict or dict (sorted by key),
    or a sequence of tensors or (name, tensor) pairs (model.named_parameters())."""
    handles = [broadcast_async_(p.data if isinstance(p, torch.nn.Parameter) else p, root_rank,
                                None if name is None else "bcast." + name)
               for name, p in _named_tensors(params)]
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


# Users import these from conflux.torch, which re-exports them: pickles and help() name it.
for _public in (broadcast_parameters, broadcast_object, allgather_object,
                broadcast_optimizer_state):
    _public.__module__ = "conflux.torch"

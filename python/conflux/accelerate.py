"""Hugging Face Accelerate on the backend "conflux".

Accelerate on the CPU makes its process group itself only on gloo or MPI (it refuses
`InitProcessGroupKwargs(backend="conflux")`), and uses the default group it finds instead when one
exists. So the job makes that group first:

    import conflux.accelerate
    conflux.accelerate.init_process_group()
    accelerator = Accelerator(cpu=True)     # prepare() wraps the model in DDP on the conflux group

init_process_group() works under the launchers the engine knows (tested: torchrun, and cfxrun with
either transport): it meets through the rendezvous "conflux://" and exports torch's launcher
variables where the launcher set none, which is how Accelerate tells a multi-process CPU job from a
single process. Accelerate itself is not patched (and not imported here).
"""
import os

import torch.distributed as dist

from . import _core
from ._torch_broadcast import broadcast_object
from .torch_backend import BACKEND, _store_host, register


def init_process_group(timeout=None):
    """Makes torch.distributed's default group on the backend "conflux" over the job's ranks
    (collective; nothing when a default group exists already) and sets RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE and MASTER_ADDR (rank 0's host) from the engine where they are
    unset. `timeout`: a datetime.timedelta for the group's collectives (torch's default if None).
    Returns the default group."""
    register()  # as importing conflux.torch does (once per interpreter)
    _core.init()
    master = broadcast_object(_store_host() if _core.rank() == 0 else None, 0,
                              name="conflux.accelerate.master")
    for name, value in (("RANK", _core.rank()), ("WORLD_SIZE", _core.size()),
                        ("LOCAL_RANK", _core.local_rank()),
                        ("LOCAL_WORLD_SIZE", _core.local_size()), ("MASTER_ADDR", master)):
        os.environ.setdefault(name, str(value))
    if not dist.is_initialized():
        kwargs = {} if timeout is None else {"timeout": timeout}
        dist.init_process_group(BACKEND, init_method="conflux://", **kwargs)
    elif dist.get_backend() != BACKEND:
        raise RuntimeError("conflux.accelerate.init_process_group: a default group on %r exists "
                           "already; destroy it first, or make it with this function before any "
                           "other" % dist.get_backend())
    return dist.group.WORLD

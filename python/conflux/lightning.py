"""Lightning's cluster environment for a job the Conflux engine forms its world from:
`Trainer(plugins=[ConfluxEnvironment()], strategy=DDPStrategy(process_group_backend="conflux"))`
and `Fabric(plugins=[...], ...)` likewise.

Lightning finds torchrun (TorchElasticEnvironment), Slurm and mpirun (MPIEnvironment, with mpi4py)
itself, and the backend "conflux" works with its environments (tested: torchrun's and mpirun's).
This environment is for the launchers it does not know:
`cfxrun --transport gloo` (no MPI), `CFX_RANK`/`CFX_SIZE` set by hand or by another launcher, or
mpirun without mpi4py. The engine supplies the rank, size, local rank and node; rank 0 picks the
port of torch's store (env://, which Lightning always uses) and the engine tells the other ranks,
as Lightning's MPIEnvironment does over MPI (under torchrun: the store of torchrun's agent).
Lightning itself is not patched.

Importing this module imports `lightning` (the unified package, 2.x).
"""
import os
import socket

from lightning.fabric.plugins.environments import ClusterEnvironment

from . import _core
from .torch_backend import _store_host  # rank 0's address as the conflux:// rendezvous gives it
from ._torch_broadcast import broadcast_object


class ConfluxEnvironment(ClusterEnvironment):
    """The job's ranks as the engine has them (docs/launching.md): world size, global, local and
    node rank, and the store's address from rank 0. Creating it joins the job (collective: every
    rank creates one)."""

    def __init__(self):
        _core.init()
        self._main = None

    @property
    def creates_processes_externally(self):
        return True  # the launcher started every rank: Lightning must not start more

    @property
    def main_address(self):
        return self._meet()[0]

    @property
    def main_port(self):
        return self._meet()[1]

    def _meet(self):
        if self._main is not None:
            return self._main
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # torchrun's workers are all clients of the store its agent serves at MASTER_ADDR and
            # MASTER_PORT (env:// sees that variable and makes no server)
            self._main = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
        else:  # the first use is on every rank (Lightning's process group init): collective
            main = (_store_host(), _free_port()) if _core.rank() == 0 else None
            self._main = broadcast_object(main, 0, name="conflux.lightning.main")
        return self._main

    @staticmethod
    def detect():
        """Whether the engine has joined a job of more than one rank (it says so once
        conflux.init() ran: the bindings read no CFX_* variable themselves); Lightning consults
        only its own environments, so pass this one in `plugins`."""
        return _core.is_initialized() and _core.size() > 1

    def world_size(self):
        return _core.size()

    def set_world_size(self, size):
        self._check("world size", size, _core.size())

    def global_rank(self):
        return _core.rank()

    def set_global_rank(self, rank):
        self._check("global rank", rank, _core.rank())

    def local_rank(self):
        return _core.local_rank()

    def node_rank(self):
        return _core.cross_rank()

    @staticmethod
    def _check(what, lightning, engine):
        if lightning != engine:
            raise ValueError(
                "ConfluxEnvironment: Lightning computed %s %d from its devices and num_nodes, "
                "but the job's launcher made it %d: pass devices=<ranks per host> and "
                "num_nodes=<hosts> as the job was started (this rank: %d of %d, local rank %d of "
                "%d)"
                % (what, lightning, engine, _core.rank(), _core.size(), _core.local_rank(),
                   _core.local_size()))


def _free_port():
    """A port nobody listens on now (the system's pick); rank 0's store binds it moments later,
    the same window Lightning's own environments leave."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]

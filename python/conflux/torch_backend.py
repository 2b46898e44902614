"""torch.distributed's backend "conflux": `dist.init_process_group("conflux")` gives a process
group whose collectives run on the Conflux engine, so DistributedDataParallel and everything built
on torch.distributed run on it. `import conflux.torch` registers it (once per interpreter).

The backend itself is native: conflux._torch_c10d (bindings/python/torch_c10d.cpp), a c10d::Backend
subclass calling the C ABI, its Work objects and the thread that completes them. This module owns
what is Python's: the registration (torch.distributed.Backend.register_backend for device "cpu",
and "cuda" where the native backend takes CUDA tensors: `devices()`; extended API), the creator
that torch calls with each group's options (the default group: the job's context conflux._core
holds, after checking that torch's rank and size are the engine's; a dist.new_group or
split_group: a context of the group's own, made by the members only through the group's store,
cfx_init_group), the rendezvous "conflux://" (the engine hands rank 0's address to
the other ranks, so a job started by mpirun or cfxrun needs no MASTER_ADDR), and DDP's
communication hooks (`ddp_hooks`: the wire-compressed ones and the shared-memory one, which moves
DDP's buckets into shared tensor memory). torch is not patched: env:// stays torch's (it needs
MASTER_ADDR and MASTER_PORT; under mpirun without them use init_method="conflux://").
"""
import atexit
import socket
import types
import weakref

import torch
import torch.distributed as dist
from torch.distributed.rendezvous import register_rendezvous_handler

from . import _args
from . import _core
from ._torch_broadcast import broadcast_object
from ._torch_adapter import shared_empty
from ._torch_collectives import _torch_native

try:
    from . import _torch_c10d
    _NATIVE_ERROR = None
except ImportError as exc:  # a build without torch's headers: no backend, and the creator says why
    _torch_c10d = None
    _NATIVE_ERROR = exc

BACKEND = "conflux"
_CPU = torch.device("cpu")

# Every backend made here, until it goes: closed (pending work completed, a group's context shut
# down) before conflux._core frees the job's context at exit (atexit runs this module's hook first,
# as it registered later).
_LIVE = weakref.WeakSet()


@atexit.register
def _close_all():
    for backend in list(_LIVE):
        backend._close()


def _check_view(what, torch_rank, torch_size, cfx_rank, cfx_size):
    if (torch_rank, torch_size) != (cfx_rank, cfx_size):
        raise RuntimeError(
            "init_process_group(\"conflux\"): torch.distributed says this process is rank %d of "
            "%d, but the Conflux engine's %s says rank %d of %d; the engine forms its world "
            "from its launcher (mpirun, cfxrun, or one its rendezvous knows): start every "
            "process with one, so that torch's RANK/WORLD_SIZE are the engine's"
            % (torch_rank, torch_size, what, cfx_rank, cfx_size))


def _timeout_s(options):
    timeout = getattr(options, "timeout", None)
    if timeout is None:
        return dist.distributed_c10d.default_pg_timeout.total_seconds()
    return timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)


def _is_job(ranks, rank, size):
    """Whether a group over global `ranks` is the job's world as the engine's context has it."""
    return (_core.is_initialized() and dist.is_initialized() and
            ranks == list(range(dist.get_world_size())) and
            (rank, size) == (_core.rank(), _core.size()))


def _create(options, pg_options=None):
    """Backend creator (extended API), called by torch on the members of a group only: the
    native backend of the default group (the job's context) or of a new_group / split_group (a
    context of the group's own over the group's store: ranks outside it are not involved)."""
    rank, size = options.group_rank, options.group_size
    ranks = list(options.global_ranks_in_group)
    if _torch_c10d is None:
        raise RuntimeError("the conflux backend needs conflux._torch_c10d, which this build of "
                           "the package lacks (%s); build it against the torch wheel "
                           "(CONFLUX_WITH_TORCH_NATIVE)" % _NATIVE_ERROR)
    if not ranks:  # the default group: the job's context (under mpirun: MPI's)
        _core.init()
        _check_view("job", rank, size, _core.rank(), _core.size())
        backend = _torch_c10d.Backend.for_context(_core.current().address, rank, size,
                                                  _timeout_s(options))
    elif _is_job(ranks, rank, size):
        # A group of every rank in order (dist.new_group(backend="conflux") beside a gloo default
        # group) is the job's world: its context serves (MPI's under mpirun, the fast path).
        backend = _torch_c10d.Backend.for_context(_core.current().address, rank, size,
                                                  _timeout_s(options))
    else:  # the members alone make the group's context, through its store
        backend = _torch_c10d.Backend.for_group(options.store, rank, size, _timeout_s(options))
    _LIVE.add(backend)
    return backend


# ---- rendezvous "conflux://": rank 0's store address travels over the engine ----
def _store_host():
    if _core.local_size() == _core.size():
        return "127.0.0.1"
    return socket.getfqdn()


def _conflux_rendezvous(url, timeout=None, **kwargs):
    """Yields (store, rank, world size): the engine's rank and size; rank 0 runs a TCPStore on a
    port the system picks and broadcasts its address."""
    from urllib.parse import urlparse, parse_qs
    _core.init()
    rank, size = _core.rank(), _core.size()
    query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
    _check_view("job", int(query.get("rank", rank)), int(query.get("world_size", size)),
                rank, size)
    if timeout is None:
        timeout = dist.distributed_c10d.default_pg_timeout
    if rank == 0:
        host = _store_host()
        store = dist.TCPStore(host, 0, size, True, timeout, wait_for_workers=False)
        broadcast_object((host, store.port), 0, name="conflux.rendezvous")
    else:
        host, port = broadcast_object(None, 0, name="conflux.rendezvous")
        store = dist.TCPStore(host, port, size, False, timeout)
    yield (store, rank, size)
    raise RuntimeError("the conflux:// rendezvous cannot be repeated")


# ---- DDP communication hooks ----
def _compressed_hook(compression, label):
    def hook(state, bucket):
        pg = _hook_group(state, label)
        return _allreduce_future(pg, bucket.buffer(), _core.Average, compression)
    hook.__name__ = hook.__qualname__ = label
    hook.__doc__ = ("DDP communication hook: averages the bucket with the engine's %s wire "
                    "compression (the values are rounded once where they are packed and summed in "
                    "float32; within a host the shared-memory reduction stays exact). "
                    "model.register_comm_hook(None, hook), or the process group as the state."
                    % compression.name)
    return hook


def shared_memory_hook(state, bucket):
    """DDP communication hook: averages DDP's bucket in Conflux's shared tensor memory, so that the
    engine reduces it in place across the host's ranks (the direct path: no copy in or out).
    The first time it sees a bucket it moves the bucket's memory into shared tensor memory
    (conflux._torch_native.move_to_shared: the reducer's views of the bucket move with it), so from
    then on DDP copies the gradients straight into shared memory and back out, the two copies it
    makes anyway. Without the native module each bucket is copied into a shared block kept for it
    instead (one copy more). A device bucket takes the usual path. Exact like the default hook
    (float32 sums in local-rank order).
    model.register_comm_hook(None, hook), or the conflux process group as the state."""
    pg = _hook_group(state, "shared_memory_hook")
    buf = bucket.buffer()
    if not buf.is_cpu or buf.numel() == 0:  # shared tensor memory is host memory: the usual path
        return _allreduce_future(pg, buf, _core.Average, 0)
    if _torch_native is not None and _torch_native.move_to_shared(buf):
        return _allreduce_future(pg, buf, _core.Average, 0)
    blocks = _SHARED_BUCKETS.setdefault(pg, {})
    block = blocks.get(bucket.index())
    if block is None or block.numel() != buf.numel() or block.dtype != buf.dtype:  # DDP rebuilt
        block = blocks[bucket.index()] = shared_empty(buf.numel(), dtype=buf.dtype)
    block.copy_(buf.view(-1))
    return _allreduce_future(pg, block, _core.Average, 0)  # DDP copies the result into its bucket


def _hook_group(state, label):
    """The native conflux backend of `state` (a process group, or None: the default group)."""
    pg = state if state is not None else dist.group.WORLD
    backend = None
    if isinstance(pg, dist.ProcessGroup):
        try:
            backend = pg._get_backend(_CPU)
        except RuntimeError:
            backend = None
    else:
        backend = pg
    if _torch_c10d is None or not isinstance(backend, _torch_c10d.Backend):
        raise TypeError("conflux.torch.ddp_hooks.%s needs a conflux process group (state=None with "
                        "init_process_group(\"conflux\"), or the group), not %r" % (label, pg))
    return backend


def _allreduce_future(backend, tensor, op, compression):
    """A torch future of `tensor` (the tensor itself, as DDP wants from a hook) once the engine
    reduced it in place."""
    work = backend._allreduce_work(tensor, int(op), int(compression))
    return work.get_future().then(lambda fut: fut.value()[0])


_SHARED_BUCKETS = weakref.WeakKeyDictionary()  # backend -> {bucket index: shared block}


# (Not torch's hook names: DDP refuses a hook named bf16_compress_hook without CUDA and NCCL.)
ddp_hooks = types.SimpleNamespace(shared_memory_hook=shared_memory_hook, **{
    label: _compressed_hook(compression, label) for label, compression in (
        ("fp16_wire_hook", _args.Compression.fp16),
        ("bf16_wire_hook", _args.Compression.bf16),
        ("fp16_everywhere_wire_hook", _args.Compression.fp16_everywhere),
        ("bf16_everywhere_wire_hook", _args.Compression.bf16_everywhere))})


# ---- registration ----
def devices():
    """The devices the backend is registered for: "cpu", and "cuda" where the native backend was
    built against a CUDA torch and the engine has CUDA (allreduce, allreduce_coalesced and
    broadcast of CUDA tensors, on the caller's current stream; the other collectives refuse them,
    naming the op). One backend object serves both devices of a group (torch registers one
    backend for every device that maps to the same name)."""
    cuda = (_torch_c10d is not None and getattr(_torch_c10d, "CUDA", False)
            and _core.features().get("cuda", False))
    return ["cpu", "cuda"] if cuda else ["cpu"]


def register():
    """Registers the backend for `devices()` and the conflux:// rendezvous (conflux.torch calls it
    when imported); a second call does nothing (torch asserts on a second register_backend)."""
    if getattr(dist.Backend, BACKEND.upper(), None) is None:  # register_backend sets it
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=devices())
    try:
        register_rendezvous_handler(BACKEND, _conflux_rendezvous)
    except RuntimeError:  # registered by an earlier import (e.g. a reloaded module)
        pass

"""torch.distributed's backend "conflux": `dist.init_process_group("conflux")` gives a process
group whose collectives run on the Conflux engine, so DistributedDataParallel and everything built
on torch.distributed run on it. `import conflux.torch` registers it (once per interpreter).

Owns the process group class, its Work objects, the backend's creator (which joins the engine and
checks that torch's rank and size are the engine's), the rendezvous "conflux://" (the engine hands
rank 0's address to the other ranks, so a job started by mpirun or cfxrun needs no MASTER_ADDR),
dist.new_group's subset contexts, and DDP's communication hooks (`ddp_hooks`: the wire-compressed ones
and the shared-memory one, which moves DDP's buckets into shared tensor memory).

How a collective completes: the method submits it to the engine and returns a Work at once; a
thread of the process group waits for the engine's handles in submission order and completes each
Work's torch future (DDP's reducer chains on that future). The futures are completed from a small
pool, so a future callback that itself waits for another collective of the group (PowerSGD-style
hooks) does not block the thread that completes the collective it waits for.

A Python Work held only by C++ (DDP's reducer holds its allreduce of the unused-parameter map from
the end of backward to its wait) loses its Python methods when the Python object is collected, and
its wait() then waits forever in c10d's base class. The process group therefore holds every Work
until it completed, and the last _KEEP_COMPLETED completed ones besides: every C++ caller of
torch 1.13 waits before that many more collectives were issued on the group.

torch 1.13 (Debian's) is what the tests run. torch 2.x registers the same class with
register_backend(..., devices=["cpu"]) (its plugins may return a ProcessGroup subclass); that path
is written but not tested here.
"""
import collections
import concurrent.futures
import inspect
import os
import queue
import socket
import sys
import threading
import types

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup as _ProcessGroup, Work as _Work

from . import _core
from . import _torch_collectives
from ._torch_broadcast import broadcast_object
from ._torch_adapter import shared_empty
from ._torch_collectives import _torch_native
from .torch_process_sets import ProcessSet

BACKEND = "conflux"
_KEEP_COMPLETED = 64
_TORCH_MAJOR = int(torch.__version__.split(".")[0])


# ---- reduction ops ----
_RED = dist.ReduceOp.RedOpType
_OPS = {_RED.SUM: _core.Sum, _RED.PRODUCT: _core.Product, _RED.MIN: _core.Min,
        _RED.MAX: _core.Max}
if hasattr(_RED, "AVG"):
    _OPS[_RED.AVG] = _core.Average


def _reduce_op(reduce_op, what):
    """The engine's op for torch's ReduceOp (or its RedOpType); ValueError naming any other."""
    kind = getattr(reduce_op, "op", reduce_op)
    try:
        return _OPS[kind]
    except (KeyError, TypeError):
        name = str(kind).rpartition(".")[2]
        raise ValueError("the conflux backend has no reduction op %s (%s); it has %s" % (
            name, what, ", ".join(str(k).rpartition(".")[2] for k in _OPS))) from None


# ---- Work ----
class ConfluxWork(_Work):
    """One collective of a ConfluxProcessGroup: wait() returns True or raises the engine's error
    (a conflux.ConfluxError subclass with its message); get_future() is a torch.futures.Future of
    the output tensors."""

    def __init__(self, what):
        super().__init__()
        self.what = what
        self._future = torch.futures.Future()
        self._error = None

    def wait(self, timeout=None):
        self._future.wait()  # the GIL is released while it waits; raises the stored error
        return True

    def is_completed(self):
        return self._future.done()

    def is_success(self):
        return self._future.done() and self._error is None

    def exception(self):
        return self._error

    def get_future(self):
        return self._future

    def result(self):
        return self._future.wait()

    def _settle(self, result, error):
        if error is not None:
            self._error = error
            self._future.set_exception(error)
        else:
            self._future.set_result(result)


# Completes futures: their callbacks run on these threads (a new one when every thread is busy in
# a callback, up to the limit).
_SETTLERS = concurrent.futures.ThreadPoolExecutor(max_workers=32,
                                                  thread_name_prefix="conflux-pg-futures")


class _Completer:
    """The thread of one process group that waits for its handles in submission order."""

    def __init__(self, label):
        self._label = label
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()

    def add(self, handle, finish, work, release):
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, daemon=True,
                                                    name="conflux-pg-" + self._label)
                    self._thread.start()
        self._queue.put((handle, finish, work, release))

    def _run(self):
        while True:
            handle, finish, work, release = self._queue.get()
            result = error = None
            try:
                value = handle.wait() if handle is not None else None
                result = finish(value)
            except Exception as exc:  # the collective's error goes to its Work
                error = exc
            try:
                _SETTLERS.submit(_settle, work, result, error, release)
            except RuntimeError:  # interpreter exit: nobody waits on callbacks any more
                _settle(work, result, error, release)


def _settle(work, result, error, release):
    try:
        work._settle(result, error)
    finally:
        release(work)


# ---- helpers for tensors ----
def _contiguous_inplace(tensors):
    """(tensors the engine may write, a function copying them back where a copy was made)."""
    work = [t if t.is_contiguous() else t.contiguous() for t in tensors]
    pairs = [(t, w) for t, w in zip(tensors, work) if w is not t]

    def copy_back():
        for t, w in pairs:
            t.copy_(w)
    return work, copy_back


def _rows(t):
    """t as one row (1 x numel, contiguous): what allgather and alltoall move along dim 0."""
    return t.reshape(1, -1).contiguous()


def _check_same(what, name, expected, got):
    if expected != got:
        raise ValueError("%s: %s is %s on this rank but the collective gives %s"
                         % (what, name, expected, got))


class ConfluxProcessGroup(_ProcessGroup):
    """A torch.distributed process group on a Conflux context: the job's (the default group) or a
    subset context (dist.new_group). `ops` is conflux.torch's collectives or a
    conflux.torch.ProcessSet's."""

    def __init__(self, rank, size, ops, label, process_set=None):
        super().__init__(rank, size)
        self._ops = ops
        self._label = label
        self._process_set = process_set
        self._completer = _Completer(label)
        self._pending = {}
        self._completed = collections.deque(maxlen=_KEEP_COMPLETED)
        self._shared_buckets = {}  # ddp_hooks.shared_memory_hook without the native module: index -> block

    def getBackendName(self):
        return BACKEND

    def __repr__(self):
        return "<ConfluxProcessGroup %s rank %d of %d>" % (self._label, self.rank(), self.size())

    # -- the machinery every collective goes through --
    def _release(self, work):
        self._pending.pop(id(work), None)
        self._completed.append(work)

    def _start(self, what, handle, finish):
        """A Work completed by finish(handle's value) once the engine completed `handle`."""
        work = ConfluxWork(what)
        self._pending[id(work)] = work
        self._completer.add(handle, finish, work, self._release)
        return work

    def _allreduce_work(self, tensors, op, what, compression=0, lone=False):
        """`lone`: the future's value is the one tensor itself (what DDP wants from a Python
        hook), not a list."""
        ts, copy_back = _contiguous_inplace(tensors)
        if len(ts) == 1:
            h = self._ops.allreduce_async_(ts[0], op, None, 1.0, 1.0, compression)
        else:
            if compression:
                raise ValueError("%s: compression applies to one tensor at a time" % what)
            h = self._ops.grouped_allreduce_async_(ts, op)

        def finish(_):
            copy_back()
            return tensors[0] if lone else list(tensors)
        return self._start(what, h, finish)

    # -- collectives (c10d's names and arguments) --
    def allreduce(self, tensors, opts=None):
        op = _reduce_op(opts.reduceOp if opts is not None else _RED.SUM, "all_reduce")
        return self._allreduce_work(tensors, op, "all_reduce")

    def allreduce_coalesced(self, tensors, opts=None):
        op = _reduce_op(opts.reduceOp if opts is not None else _RED.SUM, "all_reduce_coalesced")
        return self._allreduce_work(tensors, op, "all_reduce_coalesced")

    def broadcast(self, tensors, opts):
        ts, copy_back = _contiguous_inplace(tensors)
        root = opts.rootRank
        if len(ts) != 1:
            raise ValueError("broadcast: the conflux backend takes one tensor per call, not %d"
                             % len(ts))
        h = self._ops.broadcast_async_(ts[0], root)

        def finish(_):
            copy_back()
            return list(tensors)
        return self._start("broadcast", h, finish)

    def _gathered(self, inputs):
        """The engine's allgather of each input as one row: a handle whose value is, per input,
        a (size x numel) tensor."""
        rows = [_rows(t) for t in inputs]
        if len(rows) == 1:
            h = self._ops.allgather_async(rows[0])
            return h, lambda value: [value]
        return self._ops.grouped_allgather_async(rows), lambda value: value

    def allgather(self, output_lists, inputs, opts=None):
        for outs, t in zip(output_lists, inputs):
            _check_same("all_gather", "the number of output tensors", self.size(), len(outs))
            for o in outs:
                _check_same("all_gather", "an output tensor's size", t.numel(), o.numel())
        h, per_input = self._gathered(inputs)

        def finish(value):
            for outs, gathered in zip(output_lists, per_input(value)):
                for r, o in enumerate(outs):
                    o.copy_(gathered[r].view_as(o))
            return [o for outs in output_lists for o in outs]
        return self._start("all_gather", h, finish)

    def _allgather_base(self, output, input, opts=None):
        _check_same("all_gather_into_tensor", "the output's number of elements",
                    input.numel() * self.size(), output.numel())
        h, per_input = self._gathered([input])

        def finish(value):
            output.copy_(per_input(value)[0].view_as(output))
            return [output]
        return self._start("all_gather_into_tensor", h, finish)

    allgather_into_tensor = _allgather_base  # torch 2.x's name

    def _scattered(self, stacked, out, op, what):
        """Reduce-scatter of `stacked` (size x n: row r goes to rank r) into `out`."""
        h = self._ops.reducescatter_async(stacked, op)

        def finish(value):
            out.copy_(value.view_as(out))
            return [out]
        return self._start(what, h, finish)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = _reduce_op(opts.reduceOp if opts is not None else _RED.SUM, "reduce_scatter")
        if len(outputs) != 1:
            raise ValueError("reduce_scatter: the conflux backend takes one output tensor, not %d"
                             % len(outputs))
        ins = input_lists[0]
        _check_same("reduce_scatter", "the number of input tensors", self.size(), len(ins))
        for t in ins:
            _check_same("reduce_scatter", "an input tensor's size", outputs[0].numel(), t.numel())
        stacked = torch.stack([t.reshape(-1) for t in ins])
        return self._scattered(stacked, outputs[0], op, "reduce_scatter")

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _reduce_op(opts.reduceOp if opts is not None else _RED.SUM, "reduce_scatter_tensor")
        _check_same("reduce_scatter_tensor", "the input's number of elements",
                    output.numel() * self.size(), input.numel())
        stacked = input.reshape(self.size(), -1).contiguous()
        return self._scattered(stacked, output, op, "reduce_scatter_tensor")

    reduce_scatter_tensor = _reduce_scatter_base  # torch 2.x's name

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        size = self.size()
        if input_split_sizes:
            splits = list(input_split_sizes)
        else:
            if input.shape[0] % size:
                raise ValueError("all_to_all_single: dim 0 of the input (%d) does not divide by "
                                 "the group's size (%d); give input_split_sizes"
                                 % (input.shape[0], size))
            splits = [input.shape[0] // size] * size
        h = self._ops.alltoall_async(input.contiguous(), splits)

        def finish(value):
            received, received_splits = value
            if output_split_sizes:
                _check_same("all_to_all_single", "output_split_sizes",
                            list(output_split_sizes), [int(s) for s in received_splits])
            _check_same("all_to_all_single", "the output's shape", tuple(output.shape),
                        tuple(received.shape))
            output.copy_(received)
            return [output]
        return self._start("all_to_all_single", h, finish)

    def alltoall(self, outputs, inputs, opts=None):
        _check_same("all_to_all", "the number of input tensors", self.size(), len(inputs))
        _check_same("all_to_all", "the number of output tensors", self.size(), len(outputs))
        flat = torch.cat([t.reshape(-1) for t in inputs])
        h = self._ops.alltoall_async(flat, [t.numel() for t in inputs])

        def finish(value):
            received, received_splits = value
            _check_same("all_to_all", "the output tensors' sizes",
                        [o.numel() for o in outputs], [int(s) for s in received_splits])
            offset = 0
            for o in outputs:
                o.copy_(received[offset:offset + o.numel()].view_as(o))
                offset += o.numel()
            return list(outputs)
        return self._start("all_to_all", h, finish)

    def barrier(self, opts=None):
        return self._start("barrier", self._ops.barrier_async(), lambda _: [])

    def reduce(self, tensors, opts):
        """The allreduce of a copy; the root writes it into its tensor."""
        op = _reduce_op(opts.reduceOp, "reduce")
        root = opts.rootRank
        copies = [t.detach().clone(memory_format=torch.contiguous_format) for t in tensors]
        h = self._ops.grouped_allreduce_async_(copies, op)

        def finish(_):
            if self.rank() == root:
                for t, c in zip(tensors, copies):
                    t.copy_(c)
            return list(tensors)
        return self._start("reduce", h, finish)

    def gather(self, output_lists, inputs, opts):
        """The allgather; the root keeps it."""
        root = opts.rootRank
        h, per_input = self._gathered(inputs)

        def finish(value):
            if self.rank() != root:
                return []
            for outs, gathered in zip(output_lists, per_input(value)):
                _check_same("gather", "the number of output tensors", self.size(), len(outs))
                for r, o in enumerate(outs):
                    o.copy_(gathered[r].view_as(o))
            return [o for outs in output_lists for o in outs]
        return self._start("gather", h, finish)

    def scatter(self, outputs, input_lists, opts):
        """A broadcast of the root's inputs (stacked); every rank keeps its row."""
        root, out = opts.rootRank, outputs[0]
        if self.rank() == root:
            _check_same("scatter", "the number of input tensors", self.size(), len(input_lists[0]))
            stacked = torch.stack([t.reshape(-1) for t in input_lists[0]])
        else:
            stacked = torch.empty((self.size(), out.numel()), dtype=out.dtype)
        h = self._ops.broadcast_async_(stacked, root)

        def finish(_):
            out.copy_(stacked[self.rank()].view_as(out))
            return [out]
        return self._start("scatter", h, finish)

    def _no_point_to_point(self, what, peer):
        raise RuntimeError("the conflux backend has no point-to-point %s (%s rank %d): the engine "
                           "runs collectives only; use a group of another backend for it, e.g. "
                           "dist.new_group(backend=\"gloo\")" % (what, "to" if what == "send"
                                                                else "from", peer))

    def send(self, tensors, dst, tag=0):
        self._no_point_to_point("send", dst)

    def recv(self, tensors, src, tag=0):
        self._no_point_to_point("recv", src)

    def recv_anysource(self, tensors, tag=0):
        self._no_point_to_point("recv", -1)

    # -- for the communication hooks --
    def _allreduce_future(self, tensor, op, compression):
        return self._allreduce_work([tensor], op, "ddp_hook", compression, True).get_future()


# ---- the creator: joins the engine, checks torch's view against it ----
_WORLD = None             # namespace of conflux.torch's collectives (the job's context)
_NEW_GROUP_SETS = {}      # ranks (tuple) -> conflux.torch.ProcessSet made by new_group's wrapper


def _world_ops():
    global _WORLD
    if _WORLD is None:
        names = ("allreduce_async_", "grouped_allreduce_async_", "broadcast_async_",
                 "allgather_async", "grouped_allgather_async", "reducescatter_async",
                 "alltoall_async")
        _WORLD = types.SimpleNamespace(barrier_async=_core.barrier_async,
                                       **{n: getattr(_torch_collectives, n) for n in names})
    return _WORLD


def _check_view(what, torch_rank, torch_size, cfx_rank, cfx_size):
    if (torch_rank, torch_size) != (cfx_rank, cfx_size):
        raise RuntimeError(
            "init_process_group(\"conflux\"): torch.distributed says this process is rank %d of "
            "%d, but the Conflux engine's %s says rank %d of %d; the engine forms its world "
            "from its launcher (mpirun, cfxrun, or one its rendezvous knows): start every "
            "process with one, so that torch's RANK/WORLD_SIZE are the engine's"
            % (torch_rank, torch_size, what, cfx_rank, cfx_size))


def _create(options, pg_options=None):
    """Backend creator (extended API): a ConfluxProcessGroup for the default group or for a
    dist.new_group."""
    rank, size = options.group_rank, options.group_size
    ranks = list(options.global_ranks_in_group)
    _core.init()
    if not ranks:  # the default group: the job's context
        _check_view("job", rank, size, _core.rank(), _core.size())
        return ConfluxProcessGroup(rank, size, _world_ops(), "world")
    process_set = _NEW_GROUP_SETS.pop(tuple(ranks), None)
    if process_set is None:
        raise RuntimeError("a conflux group over ranks %s needs torch.distributed.new_group as "
                           "conflux.torch wraps it (called on every rank); this one came another "
                           "way" % (ranks,))
    _check_view("process set %s" % (ranks,), rank, size, process_set.rank(), process_set.size())
    return ConfluxProcessGroup(rank, size, process_set, "ranks" + "-".join(map(str, ranks)),
                               process_set)


# ---- dist.new_group: the engine's subset contexts are made on every rank ----
def _wrap_new_group(original):
    signature = inspect.signature(original)

    def new_group(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        backend = bound.arguments.get("backend")
        default = dist.get_backend() if dist.is_initialized() else None
        chosen = str(backend or default or "").lower()
        if chosen != BACKEND:
            return original(*args, **kwargs)
        ranks = bound.arguments.get("ranks")
        members = tuple(sorted(ranks)) if ranks else tuple(range(dist.get_world_size()))
        # Collective over the job, like new_group itself; torch calls the creator on members only.
        _NEW_GROUP_SETS[members] = ProcessSet(list(members))
        try:
            return original(*args, **kwargs)
        finally:
            left = _NEW_GROUP_SETS.pop(members, None)
            if left is not None and not left.included():
                left.free()

    new_group.__wrapped__ = original
    new_group.__doc__ = original.__doc__
    return new_group


# ---- rendezvous "conflux://": rank 0's store address travels over the engine ----
def _launched_by_mpi():
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


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


def _env_or_conflux(original):
    """torch's env:// handler, except in a job started by mpirun/cfxrun without MASTER_ADDR,
    where env:// could not work: there the conflux:// rendezvous serves (any backend)."""
    def handler(url, **kwargs):
        if "MASTER_ADDR" not in os.environ and _launched_by_mpi():
            return _conflux_rendezvous(url, **kwargs)
        return original(url, **kwargs)
    handler.__wrapped__ = original
    return handler


# ---- DDP communication hooks ----
def _compressed_hook(compression, label):
    def hook(state, bucket):
        pg = _hook_group(state, label)
        return pg._allreduce_future(bucket.buffer(), _core.Average, compression)
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
        return pg._allreduce_future(buf, _core.Average, 0)
    if _torch_native is not None and _torch_native.move_to_shared(buf):
        return pg._allreduce_future(buf, _core.Average, 0)
    block = pg._shared_buckets.get(bucket.index())
    if block is None or block.numel() != buf.numel() or block.dtype != buf.dtype:  # DDP rebuilt
        block = pg._shared_buckets[bucket.index()] = shared_empty(buf.numel(), dtype=buf.dtype)
    block.copy_(buf.view(-1))
    return pg._allreduce_future(block, _core.Average, 0)


def _hook_group(state, label):
    pg = state if state is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ConfluxProcessGroup):
        raise TypeError("conflux.torch.ddp_hooks.%s needs a conflux process group (state=None with "
                        "init_process_group(\"conflux\"), or the group), not %r" % (label, pg))
    return pg


# (Not torch's hook names: DDP refuses a hook named bf16_compress_hook without CUDA and NCCL.)
ddp_hooks = types.SimpleNamespace(shared_memory_hook=shared_memory_hook, **{
    label: _compressed_hook(compression, label) for label, compression in (
        ("fp16_wire_hook", _core.Compression.fp16),
        ("bf16_wire_hook", _core.Compression.bf16),
        ("fp16_everywhere_wire_hook", _core.Compression.fp16_everywhere),
        ("bf16_everywhere_wire_hook", _core.Compression.bf16_everywhere))})


# ---- registration ----
def register():
    """Registers the backend, the conflux:// rendezvous and the wrappers of new_group and env://
    (conflux.torch calls it when imported); a second call does nothing (torch asserts on a second
    register_backend)."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    if _TORCH_MAJOR >= 2:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    else:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True)
    rdzv = sys.modules["torch.distributed.rendezvous"]  # (dist.rendezvous is its function)
    handlers = rdzv._rendezvous_handlers
    if BACKEND not in handlers:
        rdzv.register_rendezvous_handler(BACKEND, _conflux_rendezvous)
    if "env" in handlers and not hasattr(handlers["env"], "__wrapped__"):
        handlers["env"] = _env_or_conflux(handlers["env"])
    c10d = dist.distributed_c10d
    if not hasattr(c10d.new_group, "__wrapped__"):
        c10d.new_group = _wrap_new_group(c10d.new_group)
        dist.new_group = c10d.new_group

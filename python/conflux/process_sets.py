"""Process sets: collectives over some of the job's ranks.

    evens = conflux.ProcessSet([0, 2])       # collective over all ranks: every rank passes [0, 2]
    if evens.included():                      # ranks 0 and 2
        s = evens.allreduce(x, op=conflux.Sum)   # summed over ranks 0 and 2 only
        evens.rank(), evens.size()            # 0 or 1, and 2
    evens.free()                              # on every rank (or leave a `with` block)

Each set is a subset context of the C ABI (cfx_context_create_subset) with its own negotiation,
response cache, background thread and data path, so sets that overlap or leave ranks out run at
the same time without waiting for each other or for the job's own collectives. A set has every
collective of conflux as a function of its own (allreduce, allreduce_async, grouped_allreduce, ...
with the same parameters) plus barrier() and join(); root ranks and ranks in results are ranks
within the set (0 .. size() - 1, in the order of the job's ranks). conflux.torch.ProcessSet is the
same for torch tensors; conflux.horovod.torch's process sets are made of these.

Creating a set is collective over all ranks of the job, in the same order on every rank, from one
thread. A rank outside the set gets a set whose included() is False and whose collectives raise
ValueError. conflux.shutdown() shuts every set down with the job; a set must be created again
after a new init().
"""
import atexit
import operator
import threading
import weakref

from . import _capi
from . import _core
from . import _numpy
from . import _ops

_live = weakref.WeakSet()   # Subsets whose context is not freed yet
_create_lock = threading.Lock()


def check_ranks(ranks):
    """`ranks`, a sequence of ints, as a sorted list. Range and duplicates are left to the ABI,
    which checks every rank's list on every rank alike: a check here could fail on some ranks only
    and leave the others waiting in the collective creation."""
    if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
        raise TypeError("a process set needs a sequence of ranks (ints), not %s"
                        % type(ranks).__name__)
    out = []
    for r in ranks:
        if isinstance(r, bool):
            raise TypeError("ranks must be ints, not bool")
        try:
            out.append(operator.index(r))
        except TypeError:
            raise TypeError("ranks must be ints, not %s" % type(r).__name__) from None
    return sorted(out)


class Subset:
    """One subset context of the job's context. Members hold it in `ctx`, the other ranks None.
    `submit` is a conflux._ops submit that starts collectives on it."""

    __slots__ = ("ranks", "parent", "ctx", "_rank", "__weakref__")

    def __init__(self, ranks):
        self.ranks = check_ranks(ranks)
        with _create_lock:
            self.parent = _core.current()
            ptr = _capi.cfx_context_create_subset(self.parent.ptr, self.ranks)
        self.ctx = None if ptr is None else _core._Context(ptr)
        self._rank = None if ptr is None else _capi.cfx_rank(ptr)
        if self.ctx is not None:
            _live.add(self)

    def __repr__(self):
        return "ranks %s" % (self.ranks,)

    def included(self):
        return self.ctx is not None

    def rank(self):
        """This rank's rank within the set; ValueError outside it."""
        if self._rank is None:
            raise ValueError(self._outside())
        return self._rank

    def size(self):
        return len(self.ranks)

    def set_rank(self, rank):
        """The rank within the set of the job's rank `rank`; ValueError when it is not a member."""
        try:
            return self.ranks.index(rank)
        except ValueError:
            raise ValueError("rank %r is not in the process set (%r)" % (rank, self)) from None

    def _outside(self):
        me = _capi.cfx_rank(self.parent.ptr) if self.parent.alive else "?"
        return ("rank %s is not in the process set (%r): only its ranks call its collectives"
                % (me, self))

    def context(self):
        """The live context for a collective, or the error that says why there is none."""
        ctx = self.ctx
        if ctx is None:
            raise ValueError(self._outside())
        if not ctx.alive:
            raise ValueError("the process set (%r) was freed" % (self,))
        if not self.parent.alive:
            self.free()
            raise _core.ShutDownError("Conflux was shut down, and with it the process set (%r); "
                                      "create it again after init()" % (self,))
        return ctx

    def submit(self, fn, args, keep, finish, op, name=None):
        """conflux._core.submit on this set's context."""
        ctx = self.context()
        _core._reap_orphans()
        return _core.Handle(ctx, fn(ctx.ptr, *args), keep, finish, op, name)

    def free(self):
        """Shuts the set's context down (its pending collectives fail with ShutDownError, on the
        other members too) and frees it. Idempotent."""
        ctx = self.ctx
        if ctx is None or not ctx.alive:
            return
        _live.discard(self)
        try:
            _capi.cfx_shutdown(ctx.ptr)
        except _core.ConfluxError:
            pass
        ptr, ctx.ptr = ctx.ptr, None   # its handles see a dead context from now on
        _capi.cfx_context_free(ptr)


@atexit.register
def _free_all():
    for subset in list(_live):
        subset.free()


def collectives(adapter, docs, submit, module):
    """{name: function}: every collective of conflux._ops for `adapter`, plus barrier(_async) and
    join(_async), starting collectives through `submit`."""
    ns = {"__name__": module}
    _ops.install(ns, adapter, docs, submit)

    def barrier_async():
        return submit(_capi.cfx_barrier_async, (), None, None, "barrier")

    def join_async():
        return submit(_capi.cfx_join_async, (), None, lambda h: h.join_rank(), "join")

    ns.update(barrier_async=barrier_async, join_async=join_async,
              barrier=lambda: barrier_async().wait(), join=lambda: join_async().wait())
    del ns["__name__"]
    return ns


class ProcessSet:
    """Collectives over the job's ranks `ranks` (see conflux.process_sets). Collective to create,
    on every rank with the same ranks. Its functions (allreduce, ..., barrier, join) are those of
    conflux with ranks within the set; rank() and size() are this rank's rank in the set and its
    size; ranks lists the job's ranks in it, ascending. free() on every rank ends it."""

    def __init__(self, ranks):
        self._subset = Subset(ranks)
        self.__dict__.update(self._collectives(self._subset.submit))

    def _collectives(self, submit):
        return collectives(_numpy.ADAPTER, _numpy.DOCS, submit, "conflux")

    @property
    def ranks(self):
        return list(self._subset.ranks)

    def included(self):
        """True on the set's ranks."""
        return self._subset.included()

    def rank(self):
        """This rank's rank within the set (ValueError outside it)."""
        return self._subset.rank()

    def size(self):
        return self._subset.size()

    def free(self):
        """Ends the set on this rank (every rank calls it; members' pending collectives on it fail
        with ShutDownError). Idempotent."""
        self._subset.free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, self._subset.ranks)

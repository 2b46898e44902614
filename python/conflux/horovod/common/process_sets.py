"""horovod.common.process_sets: Horovod 0.28's process sets, each one a subset context of the
engine (conflux.process_sets.Subset): its own negotiation, response cache, background thread and
data path, so sets that overlap or leave ranks out run their collectives at the same time.

As in Horovod: a ProcessSet is made from a list of ranks (kept sorted) or an mpi4py communicator;
hvd.init(process_sets=[...]) or hvd.add_process_set() registers it (collective over all ranks, in
the same order on every rank) and gives it a process_set_id (the global set is 0; ids of removed
sets are given out again); remove_process_set() ends it (on every rank). A set with the ranks of
one already registered (the global set included) is a duplicate. Unlike Horovod, adding and
removing sets needs no HOROVOD_DYNAMIC_PROCESS_SETS=1 (accepted, not needed): a registered set
costs nothing until it is used. Sets from communicators are registered by hvd.init only.
"""
import collections

from conflux import _core
from conflux.process_sets import Subset, check_ranks

from .util import is_iterable


class ProcessSet:
    """Representation of a set of Horovod processes that will run collective operations together

    Initialize a ProcessSet with a list of process ranks or an MPI communicator. Then pass this
    instance to hvd.init() or hvd.add_process_set(). If a valid process set has been initialized,
    process_set_id will be set to a numeric value."""
    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        if is_iterable(ranks_or_comm):
            ranks = list(ranks_or_comm)
            if any(not isinstance(r, int) or isinstance(r, bool) for r in ranks):
                raise ValueError("ProcessSet should be initialized with a list of process ranks "
                                 "or an mpi4py Comm object")
            self.ranks = sorted(ranks)
        else:
            try:
                from mpi4py import MPI
            except ImportError:
                MPI = None
            if MPI is None or not isinstance(ranks_or_comm, MPI.Comm):
                raise ValueError("ProcessSet should be initialized with a list of process ranks "
                                 "or an mpi4py Comm object")
            self.mpi_comm = ranks_or_comm

    def _invalidate(self):
        self.process_set_id = None

    def size(self):
        """Return size of the process set or None if not initialized."""
        if self.process_set_id is None:
            return None
        if self.process_set_id == 0:
            return _checked(_core.size)
        return _registered(self).size()

    def rank(self):
        """Return rank relative to this process set or None if not initialized.

        This is useful, e.g., to process the result of hvd.allgather().

        Please note that, even with process sets, Horovod operations like hvd.broadcast() are not
        parameterized by this relative rank, but by the global rank as obtained from hvd.rank()."""
        if self.process_set_id is None:
            return None
        if self.process_set_id == 0:
            return _checked(_core.rank)
        subset = _registered(self)
        if not subset.included():
            raise ValueError("Process is not part of provided process set.")
        return subset.rank()

    def included(self):
        """Return whether the current process is part of this process set or None if not
        initialized."""
        if self.ranks is None:
            return None
        return _checked(_core.rank) in self.ranks

    def __str__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s, mpi_comm=%s)" % (
            self.process_set_id, self.ranks, self.mpi_comm)

    __repr__ = __str__


class _GlobalProcessSet(ProcessSet):
    """The set of all ranks (id 0); its ranks are those of the job while Conflux is initialized."""

    def __init__(self):
        self.process_set_id = 0

    @property
    def ranks(self):
        return list(range(_core.size())) if _core.is_initialized() else []

    def __repr__(self):  # the same before and after init (it stands in signatures)
        return "ProcessSet(process_set_id=0, global)"


global_process_set = _GlobalProcessSet()

_Entry = collections.namedtuple("_Entry", "process_set subset")
_table = {}        # process_set_id -> _Entry, the registered sets besides the global one
_free_ids = collections.deque()
_next_id = [1]
_parent = [None]   # the job's context the registered subsets belong to
_removal_listeners = []  # called with a set's id before its subset is freed


def on_remove(listener):
    """Has listener(process_set_id) called before a registered set's subset is freed (removed,
    or the job shut down): a framework layer that keeps the set's context forgets it there."""
    _removal_listeners.append(listener)


def _removing(ps_id):
    for listener in _removal_listeners:
        listener(ps_id)


def _checked(fn):
    try:
        return fn()
    except _core.NotInitializedError:
        raise ValueError("Horovod has not been initialized; use hvd.init().") from None


def _registered(process_set):
    """The Subset of a registered process set; ValueError for one that is not."""
    entry = _table.get(process_set.process_set_id)
    if entry is None:
        raise ValueError("%s is not registered: pass it to hvd.init(process_sets=[...]) or "
                         "hvd.add_process_set() first" % (process_set,))
    return entry.subset


def subset_of(process_set):
    """The Subset behind a registered process set other than the global one (ValueError for an
    unknown or removed one; the global set has none)."""
    if not isinstance(process_set, ProcessSet):
        raise TypeError("process_set must be a hvd.ProcessSet, not %s" % type(process_set).__name__)
    return _registered(process_set)


def _clear():
    """Frees every registered set (their ids become None)."""
    for ps_id, entry in _table.items():
        _removing(ps_id)
        entry.process_set._invalidate()
        entry.subset.free()
    _table.clear()
    _free_ids.clear()
    _next_id[0] = 1
    _parent[0] = None


def _check_current():
    """Forgets the registered sets when the job's context they belong to is gone (shut down by
    any rank, then initialized again)."""
    ctx = _core.current()
    if _parent[0] is not ctx:
        _clear()
        _parent[0] = ctx


def _duplicate_of(ranks):
    if ranks == global_process_set.ranks:
        return global_process_set
    for entry in _table.values():
        if entry.process_set.ranks == ranks:
            return entry.process_set
    return None


def _register(process_set, ranks):
    """Creates the subset (collective) and gives `process_set` its id and ranks."""
    subset = Subset(ranks)
    ps_id = _free_ids.popleft() if _free_ids else _next_id[0]
    if ps_id == _next_id[0]:
        _next_id[0] += 1
    process_set.process_set_id = ps_id
    process_set.ranks = list(subset.ranks)
    _table[ps_id] = _Entry(process_set, subset)
    return process_set


def _comm_ranks(comm):
    """The job's ranks of an mpi4py communicator's processes (Conflux's ranks are those of
    MPI_COMM_WORLD)."""
    from mpi4py import MPI
    mine, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
    try:  # a classmethod in mpi4py 3, an instance method in 4: this call suits both
        return sorted(MPI.Group.Translate_ranks(mine, list(range(comm.Get_size())), world))
    finally:
        mine.Free()
        world.Free()


def init_process_sets(process_sets, allgather_object):
    """hvd.init's part: registers `process_sets` (a list, or "dynamic": none) in order. A set
    from a communicator may have other ranks on every rank (MPI_Comm_split): every rank's list is
    gathered (allgather_object) and each distinct one registered, in the order of the ranks."""
    _check_current()
    if process_sets is None or (isinstance(process_sets, str) and
                                process_sets.lower() == "dynamic"):
        return
    process_sets = list(process_sets)
    for i, ps in enumerate(process_sets):
        if not isinstance(ps, ProcessSet):
            raise ValueError("process_sets entry number %d is not a hvd.ProcessSet: %r" % (i, ps))
    lists = []
    for ps in process_sets:
        ranks = ps.ranks if ps.ranks is not None else _comm_ranks(ps.mpi_comm)
        lists.append(check_ranks(ranks))
    for i, (ps, ranks) in enumerate(zip(process_sets, lists)):
        if ps.mpi_comm is None and (ranks in lists[:i] or _duplicate_of(ranks) is not None):
            raise ValueError("Horovod could not be initialized because process_sets entry "
                             "number %d is a duplicate: %s" % (i, ps))
    for ps, ranks in zip(process_sets, lists):
        if ps.mpi_comm is None:
            _register(ps, ranks)
            continue
        for other in _distinct(allgather_object(ranks)):
            if _duplicate_of(other) is None:
                _register(ps if other == ranks else ProcessSet(other), other)
        if ps.process_set_id is None:
            ps.process_set_id = _table_id(ranks)
            ps.ranks = list(ranks)


def _distinct(lists):
    out = []
    for ranks in lists:
        if ranks not in out:
            out.append(ranks)
    return out


def _table_id(ranks):
    found = _duplicate_of(ranks)
    return found.process_set_id


def add_process_set(process_set):
    """Add a new process_set after Horovod initialization and return it.

    Collective over all ranks. No process set containing the same ranks may exist already. The
    returned process set will be fully initialized."""
    if not _core.is_initialized():
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    _check_current()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None and process_set.mpi_comm is not None:
        raise NotImplementedError(
            "Dynamically adding process sets defined by an MPI communicator is not implemented. "
            "Please build the process set via a list of ranks.")
    if process_set.process_set_id is not None and process_set.process_set_id in _table:
        raise ValueError("Attempted to add a duplicate process set: %s" % (process_set,))
    ranks = check_ranks(process_set.ranks)
    if _duplicate_of(ranks) is not None:
        raise ValueError("Attempted to add a duplicate process set: %s" % (process_set,))
    return _register(process_set, ranks)


def remove_process_set(process_set):
    """Attempt to remove process set and return whether this attempt is successful.

    Call it on every rank. If removal is successful, the process_set object is invalidated; its
    pending collectives fail with ShutDownError."""
    ps_id = process_set.process_set_id
    if ps_id is None or ps_id == 0:
        return False
    entry = _table.pop(ps_id, None)
    process_set._invalidate()
    if entry is None:
        return False
    entry.process_set._invalidate()
    _removing(ps_id)
    entry.subset.free()
    _free_ids.append(ps_id)
    return True


def shutdown():
    """hvd.shutdown's part: every registered set ends with the job."""
    _clear()

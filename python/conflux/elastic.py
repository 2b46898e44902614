"""conflux.elastic - elastic training: a job whose workers may leave and join without ending it
(docs/elastic.md). The engine forms the world again in membership rounds (conflux.reform); this
module is the training-loop side, with Horovod's semantics (horovod/common/elastic.py):

    state = conflux.elastic.ObjectState(epoch=0, batch=0)

    @conflux.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()        # saves the state, then lets newcomers in (HostsUpdatedInterrupt)

    train(state)

When a collective fails because a worker was lost (PeerLostError, ShutDownError, TransportError,
MembershipChangedError, or Horovod's HorovodInternalError), run() restores the last commit, forms
the world again, syncs the state from the survivor with the newest commit and calls the function
again. Decisions are agreed by collectives, never assumed: whether there are newcomers (the most
any rank saw), whether to skip the sync (only when every rank may), and which commit to sync from
(the newest among the members; a newcomer has none).
"""
import copy
import functools
import pickle

import numpy as _np

from . import _core
from .horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

__all__ = ["run", "State", "ObjectState", "HorovodInternalError", "HostsUpdatedInterrupt",
           "check_host_updates", "broadcast_object"]

# What a lost or changed world raises from a collective.
_WORLD_LOST = (_core.PeerLostError, _core.ShutDownError, _core.TransportError,
               _core.MembershipChangedError, HorovodInternalError)


def _name(what):
    """A collective's name, unique to the membership round (ranks of a new world count anew)."""
    return "elastic.%s.r%d" % (what, _core.membership_round())


def broadcast_object(obj, root_rank, name="object"):
    """root_rank's `obj` on every rank (pickled; its length broadcast first)."""
    from . import broadcast
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if _core.rank() == root_rank else b""
    n = int(broadcast(_np.array([len(payload)], dtype=_np.int64), root_rank,
                      name=_name(name + ".size"))[0])
    buf = _np.frombuffer(payload, dtype=_np.uint8).copy() if payload else _np.zeros(n, _np.uint8)
    if n:
        buf = broadcast(buf, root_rank, name=_name(name + ".data"))
    return obj if _core.rank() == root_rank else pickle.loads(buf.tobytes())


def _agree_max(value, what):
    from . import allreduce, Max
    return int(allreduce(_np.array([value], dtype=_np.int64), op=Max, name=_name(what))[0])


def check_host_updates():
    """Raises HostsUpdatedInterrupt on every rank when newcomers wait for the next round (the most
    any rank saw: ranks look at the store at different moments)."""
    if _agree_max(_core.membership_pending(), "newcomers") > 0:
        raise HostsUpdatedInterrupt(False)  # newcomers need the state: no skipping the sync


class State:
    """Training state that survives a change of the world: save() at commit, restore() after a
    lost worker, sync() from the member with the newest commit after every new world."""

    def __init__(self):
        self._reset_callbacks = []
        self._commits = 0  # this process's commits; a newcomer has none

    def register_reset_callbacks(self, callbacks):
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for cb in self._reset_callbacks:
            cb()

    def on_hosts_updated(self, timestamp=None, update_res=None):
        pass  # the membership rounds find newcomers in the store; nothing to record here

    def commit(self):
        """Saves the state, then lets newcomers in at this point (HostsUpdatedInterrupt)."""
        self.save()
        self._commits += 1
        self.check_host_updates()

    def check_host_updates(self):
        check_host_updates()

    def sync(self):
        """Every rank gets the state of the member with the newest commit (lowest rank of those)."""
        from . import allgather
        counts = allgather(_np.array([self._commits], dtype=_np.int64), name=_name("commits"))
        root = int(_np.argmax(counts))  # the first of the largest: the lowest rank among them
        self._commits = int(counts[root])
        self._sync_from(root)
        self.save()

    def _sync_from(self, root):
        raise NotImplementedError

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError


class ObjectState(State):
    """Plain Python attributes (picklable), e.g. ObjectState(epoch=0, batch=0)."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._bcast_object = bcast_object or broadcast_object
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)

    def save(self):
        self._saved_state = {attr: copy.deepcopy(getattr(self, attr)) for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def _sync_from(self, root):
        if self._saved_state:
            self.save()
            self._saved_state = self._bcast_object(self._saved_state, root, name="object_state")
            self._set_attrs()


def reset():
    """Forms the world again (conflux.reform) with the job's minimum and maximum."""
    _core.reform()


def run(func):
    """Decorates `func(state, *args, **kwargs)` as Horovod's hvd.elastic.run does: it is called
    again, from the last commit, after a lost worker (the world formed again first) and after
    HostsUpdatedInterrupt (newcomers let in); its return value is returned."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync  # from an agreed collective: the same on every rank
            except _WORLD_LOST:
                state.restore()
                skip_sync = False
            reset()
            state.on_reset()

    return wrapper

"""The fast path of lone allreduce and broadcast (one call into C that submits, waits and releases):
a wait interrupted by a signal leaves the collective pending with its memory kept, and it still
completes with every rank's contribution once the late rank submits."""
import signal
import time

import numpy as np
import pytest

import conflux
from conflux import _core


class Interrupted(Exception):
    pass


def test_interrupted_blocking_allreduce_is_parked_and_completes(rank, size):
    x = np.full(4, rank + 1.0)
    if rank == 0:
        def on_alarm(signum, frame):
            raise Interrupted()
        old = signal.signal(signal.SIGALRM, on_alarm)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(Interrupted):
                conflux.allreduce_(x, op=conflux.Sum, name="fast.interrupted")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        parked = [kept for _, _, kept in _core._orphans]
        assert any(k is x for k in parked), "the pending allreduce's array is not kept"
    else:
        time.sleep(3.0)  # rank 0's wait is interrupted before this rank submits
        conflux.allreduce_(x, op=conflux.Sum, name="fast.interrupted")
    conflux.barrier()  # rank 0's parked allreduce completed with the others' (the same batch)
    assert (x == sum(r + 1.0 for r in range(size))).all()
    # the next collective's submit reaps the parked handle
    conflux.allreduce(np.zeros(1), name="fast.reap")
    assert not _core._orphans


def test_fast_forms_give_every_ranks_sum(rank, size):
    want = sum(r + 1.0 for r in range(size))
    x = np.full(3, rank + 1.0, np.float32)
    assert (conflux.allreduce(x, op=conflux.Sum, name="fast.new") == want).all()
    assert (x == rank + 1.0).all()
    assert (conflux.synchronize(conflux.allreduce_async(x, op=conflux.Sum)) == want).all()
    assert conflux.allreduce_(x, op=conflux.Sum, prescale_factor=2, postscale_factor=0.5) is x
    assert (x == want).all()
    b = np.full(2, float(rank))
    assert (conflux.broadcast(b, root_rank=size - 1) == size - 1).all()
    assert (b == rank).all()
    assert conflux.synchronize(conflux.broadcast_async_(b, 0, name="fast.bcast")) is b
    assert (b == 0).all()
    with pytest.raises(TypeError, match="name must be a str"):
        conflux.allreduce_(x, name=3)
    with pytest.raises(TypeError, match="prescale_factor must be a number"):
        conflux.allreduce(x, prescale_factor="x")

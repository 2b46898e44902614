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


# ---- conflux.torch's lone allreduce in native code (conflux._torch_native.allreduce) ----

def _torch_or_skip():
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    import conflux.torch as cfx
    if cfx._torch_native is None:
        pytest.skip("conflux._torch_native is not built (CONFLUX_WITH_TORCH_NATIVE: libtorch-dev and "
                    "pybind11-dev at build time)")
    return torch, cfx


@pytest.fixture(params=["native", "python"])
def torch_path(request, monkeypatch):
    """conflux.torch with its allreduce functions' native call as built (counting the calls it
    took), or declining every call, so that the Python path runs: both must give the same results
    and raise the same errors."""
    torch, cfx = _torch_or_skip()
    from conflux import _collectives
    real, taken = cfx._ADAPTER.native, []

    def counting(*args):
        r = real(*args)
        taken.append(r is not None)
        return r
    # conflux.torch's functions made again (conflux._collectives) with the adapter's native call
    # replaced, in the module for the test
    adapter = cfx._ADAPTER._replace(native=counting if request.param == "native" else lambda *args: None)
    for name, fn in _collectives.collectives(adapter).items():
        monkeypatch.setattr(cfx, name, fn)
    return request.param, torch, cfx, taken


def test_torch_lone_allreduce_forms_on_either_path(torch_path, rank, size):
    path, torch, cfx, taken = torch_path
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        want = torch.tensor([sum((r + 1) * (i + 1) for r in range(size)) for i in range(5)]).to(dtype)
        x = torch.tensor([(rank + 1) * (i + 1) for i in range(5)]).to(dtype)
        out = cfx.allreduce(x, op=cfx.Sum, name="tn.new.%s" % path)
        assert torch.equal(out, want) and out.dtype == dtype and out.data_ptr() != x.data_ptr()
        assert cfx.allreduce_(x, op=cfx.Sum, name="tn.inplace.%s" % path) is x
        assert torch.equal(x, want)
        x = torch.tensor([(rank + 1) * (i + 1) for i in range(5)]).to(dtype)
        h = cfx.allreduce_async_(x, op=cfx.Sum, name="tn.async.%s" % path)
        assert cfx.synchronize(h) is x and torch.equal(x, want)
    y = torch.full((2, 3), float(rank + 1))
    cfx.allreduce_(y, op=cfx.Average, prescale_factor=2, postscale_factor=0.5,
                   name="tn.scaled.%s" % path)
    assert torch.equal(y, torch.full((2, 3), sum(r + 1.0 for r in range(size)) / size))
    if path == "native":
        assert taken and all(taken), "the native path declined a plain call: %s" % taken


def test_torch_lone_allreduce_errors_on_either_path(torch_path, rank, size):
    path, torch, cfx, _ = torch_path
    x = torch.ones(3)
    with pytest.raises(TypeError, match="name must be a str"):
        cfx.allreduce_(x, name=3)
    with pytest.raises(ValueError, match="unknown reduction op"):
        cfx.allreduce(x, op=True)
    with pytest.raises(TypeError, match="prescale_factor must be a number"):
        cfx.allreduce(x, prescale_factor="x")
    with pytest.raises(ValueError, match="contiguous"):
        cfx.allreduce_(torch.ones(4, 4).t())
    t = torch.ones(2 + (rank == 0))
    with pytest.raises(cfx.MismatchError, match="tn.mismatch.%s" % path):
        cfx.allreduce_(t, name="tn.mismatch.%s" % path)
    assert torch.equal(t, torch.ones(2 + (rank == 0)))  # a failed collective leaves it as it was
    assert torch.equal(cfx.allreduce(torch.ones(2), op=cfx.Sum, name="tn.after.%s" % path),
                       torch.full((2,), float(size)))


def test_torch_native_blocking_call_waits_past_its_first_slice(rank, size):
    """The native call waits 0.25 s, then hands the pending handle to a Handle that waits for the
    rest: a late rank still completes both blocking forms with every rank's contribution."""
    torch, cfx = _torch_or_skip()
    x = torch.full((4,), float(rank + 1))
    if rank != 0:
        time.sleep(0.6)
    out = cfx.allreduce(x, op=cfx.Sum, name="tn.late.new")
    if rank != 0:
        time.sleep(0.6)
    cfx.allreduce_(x, op=cfx.Sum, name="tn.late.inplace")
    want = sum(r + 1.0 for r in range(size))
    assert torch.equal(out, torch.full((4,), want)) and torch.equal(x, torch.full((4,), want))


def test_torch_native_declines_what_the_python_path_handles(rank, size):
    torch, cfx = _torch_or_skip()
    native, address = cfx._torch_native.allreduce, _core.current().address
    plain = torch.ones(3)
    needs_grad = torch.ones(3, requires_grad=True)
    assert native(1, None, needs_grad, cfx.Sum, 1.0, 1.0, None, address) is None  # autograd
    assert native(0, None, torch.ones(4, 4).t(), cfx.Sum, 1.0, 1.0, None, address) is None
    assert native(0, None, plain, cfx.Sum, 1.0, 1.0, None, 0) is None  # no live context
    assert native(0, 7, plain, cfx.Sum, 1.0, 1.0, None, address) is None
    assert native(0, None, plain, True, 1.0, 1.0, None, address) is None
    assert native(0, None, plain, cfx.Sum, "2", 1.0, None, address) is None
    assert native(0, None, plain, cfx.Sum, 1.0, 1.0, cfx.Compression.fp16, address) is None
    assert native(0, None, np.ones(3), cfx.Sum, 1.0, 1.0, None, address) is None
    assert torch.equal(plain, torch.ones(3))  # nothing was submitted

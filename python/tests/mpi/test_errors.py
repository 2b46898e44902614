"""Errors: decided across ranks -> a ConfluxError subclass on every rank at synchronize, naming the
tensor; bad local arguments -> ValueError/TypeError at the call. After each error a correct
collective must still work."""
import time

import numpy as np
import pytest

import conflux


def assert_still_works(rank, size, name):
    out = conflux.allreduce(np.full(4, rank + 1.0, np.float32), op=conflux.Sum, name=name)
    assert np.all(out == size * (size + 1) / 2)


def test_shape_mismatch_raises_on_every_rank(rank, size):
    a = np.ones(3 if rank == 0 else 4, np.float32)
    h = conflux.allreduce_async_(a, name="err.shape_mismatch")
    with pytest.raises(conflux.MismatchError) as info:
        conflux.synchronize(h)
    assert "err.shape_mismatch" in str(info.value)
    assert isinstance(info.value, conflux.ConfluxError) and isinstance(info.value, RuntimeError)
    assert info.value.status == 5
    with pytest.raises(conflux.MismatchError):  # the error stays with the handle
        conflux.synchronize(h)
    assert_still_works(rank, size, "err.after_shape")


def test_dtype_mismatch_raises_on_every_rank(rank, size):
    a = np.ones(5, np.float32 if rank == 0 else np.float64)
    with pytest.raises(conflux.MismatchError) as info:
        conflux.allreduce(a, name="err.dtype_mismatch")
    assert "err.dtype_mismatch" in str(info.value)
    assert_still_works(rank, size, "err.after_dtype")


def test_op_mismatch(rank, size):
    with pytest.raises(conflux.MismatchError) as info:
        conflux.allreduce(np.ones(2), op=conflux.Sum if rank == 0 else conflux.Max,
                          name="err.op_mismatch")
    assert "err.op_mismatch" in str(info.value)
    assert_still_works(rank, size, "err.after_op")


def test_broadcast_root_mismatch(rank, size):
    with pytest.raises(conflux.MismatchError) as info:
        conflux.broadcast_(np.ones(2), root_rank=0 if rank == 0 else 1, name="err.root_mismatch")
    assert "err.root_mismatch" in str(info.value)
    assert_still_works(rank, size, "err.after_root")


def test_duplicate_in_flight_name_is_value_error(rank, size):
    a = np.ones(3)
    b = np.ones(3)
    if rank == 0:
        h = conflux.allreduce_async_(a, op=conflux.Sum, name="err.dup")
        with pytest.raises(ValueError) as info:  # the other ranks have not submitted yet
            conflux.allreduce_async_(b, op=conflux.Sum, name="err.dup")
        assert isinstance(info.value, conflux.DuplicateNameError)
        assert "err.dup" in str(info.value)
    else:
        time.sleep(0.5)
        h = conflux.allreduce_async_(a, op=conflux.Sum, name="err.dup")
    conflux.synchronize(h)
    assert np.all(a == size)
    # once completed, the name may be reused
    conflux.allreduce_(b, op=conflux.Sum, name="err.dup")
    assert np.all(b == size)


@pytest.mark.parametrize("dtype", [np.complex64, np.uint32, np.uint64, object, ">f4"])
def test_unsupported_dtype_is_type_error(dtype, rank, size):
    a = np.zeros(3, dtype=dtype)
    with pytest.raises(TypeError) as info:
        conflux.allreduce(a)
    assert "not supported" in str(info.value)
    with pytest.raises(TypeError):
        conflux.allreduce_async_(a)
    with pytest.raises(TypeError):
        conflux.allgather(a)
    with pytest.raises(TypeError):
        conflux.broadcast_(a, 0)
    assert_still_works(rank, size, "err.after_dtype_%s" % np.dtype(dtype).str)


def test_non_contiguous_in_place_is_value_error(rank, size):
    m = np.zeros((4, 4), np.float32)
    with pytest.raises(ValueError, match="contiguous"):
        conflux.allreduce_(m[:, 1])
    with pytest.raises(ValueError, match="contiguous"):
        conflux.broadcast_(m.T, 0)
    with pytest.raises(ValueError, match="contiguous"):
        conflux.grouped_allreduce_([np.zeros(2), m[::2]])
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        conflux.allreduce_(ro)
    with pytest.raises(TypeError):
        conflux.allreduce_([1.0, 2.0])  # in place needs an ndarray
    assert_still_works(rank, size, "err.after_noncontig")


def test_bad_local_arguments(rank, size):
    with pytest.raises(ValueError):
        conflux.allreduce(np.ones(2), op=42)
    with pytest.raises(TypeError):
        conflux.allreduce(np.ones(2), name=3)
    with pytest.raises(ValueError):
        conflux.allgather(np.array(1.0))  # a scalar has no dim 0
    with pytest.raises((ValueError, conflux.ConfluxError)):
        conflux.broadcast_(np.ones(2), root_rank=size + 5, name="err.bad_root")
    with pytest.raises((ValueError, conflux.ConfluxError)):
        conflux.alltoall(np.ones(size * 2), splits=[1] * (size + 1), name="err.bad_splits")
    with pytest.raises(TypeError):
        conflux.synchronize("not a handle")
    assert_still_works(rank, size, "err.after_bad_args")


def test_wait_timeout_leaves_handle_pending(rank, size):
    a = np.ones(2)
    if rank == 0:
        h = conflux.allreduce_async_(a, op=conflux.Sum, name="err.timeout")
        with pytest.raises(conflux.WaitTimeoutError):
            h.wait(timeout=0.05)  # the others submit 0.5 s later
        assert not conflux.poll(h)
    else:
        time.sleep(0.5)
        h = conflux.allreduce_async_(a, op=conflux.Sum, name="err.timeout")
    conflux.synchronize(h)
    assert np.all(a == size)


def test_tensor_never_submitted_everywhere_is_a_stall_error_not_a_hang(rank, size):
    conflux.shutdown()
    conflux.init(stall_timeout_s=1.0, stall_warning_s=0.5, log_level=5)
    try:
        if rank == 0:
            t0 = time.time()
            with pytest.raises(conflux.StallError) as info:
                conflux.allreduce(np.ones(2), name="err.lonely")
            assert "err.lonely" in str(info.value)
            assert time.time() - t0 < 30
        else:
            time.sleep(1.5)  # never submits err.lonely
        assert_still_works(rank, size, "err.after_stall")
    finally:
        conflux.shutdown()
        conflux.init()


def test_signal_interrupts_a_blocking_wait(rank, size):
    import signal

    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted()

    a = np.ones(2)
    if rank == 0:
        h = conflux.allreduce_async_(a, op=conflux.Sum, name="err.signal")
        old = signal.signal(signal.SIGALRM, handler)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            t0 = time.time()
            with pytest.raises(Interrupted):
                conflux.synchronize(h)  # the others submit 1 s later
            assert time.time() - t0 < 0.9
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        assert not conflux.poll(h)  # still pending; waiting again completes it
    else:
        time.sleep(1.0)
        h = conflux.allreduce_async_(a, op=conflux.Sum, name="err.signal")
    conflux.synchronize(h)
    assert np.all(a == size)

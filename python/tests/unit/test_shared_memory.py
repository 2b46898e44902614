"""Shared tensor memory in one process: conflux.shared_array and conflux.torch.shared_empty /
shared_zeros, their lifetime (freed by cfx_free once, when the last array, view, tensor or handle
using the block is gone) and the pool's errors. The multi-rank allreduces are in ../mpi."""
import gc
import os
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest

import conflux
from conflux import _capi, _core


@pytest.fixture
def blocks(monkeypatch):
    """Records (weak reference to the block, its address) of every block allocated in the test."""
    made = []
    real = _core.shared_bytes

    def recording(nbytes):
        raw = real(nbytes)
        made.append((weakref.ref(raw.base), raw.__array_interface__["data"][0]))
        return raw

    monkeypatch.setattr(_core, "shared_bytes", recording)
    return made


# A failing cfx_free in an owner's destructor can only be reported as unraisable (a freed block
# freed again, say): here that fails the test instead of being a warning.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")


def assert_freed(address):
    """cfx_free refuses a block that is already free, so a second free of `address` fails."""
    with pytest.raises(conflux.InvalidArgumentError, match="already freed"):
        _capi.cfx_free(address)


def run_python(code, **env):
    full = dict(os.environ, **env)
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint16", "int16", "int32", "int64", "float16",
                                   "float32", "float64", "bool"])
def test_allocate_write_read(dtype):
    a = conflux.shared_array((3, 5), dtype)
    assert a.shape == (3, 5) and a.dtype == np.dtype(dtype)
    assert a.flags.c_contiguous and a.flags.writeable
    assert a.__array_interface__["data"][0] % 64 == 0
    a[...] = (np.arange(15).reshape(3, 5) % 2).astype(dtype)
    np.testing.assert_array_equal(a, (np.arange(15).reshape(3, 5) % 2).astype(dtype))
    assert conflux.shared_array(7).shape == (7,)
    assert conflux.shared_array(()).shape == ()
    assert conflux.shared_array((0, 4)).size == 0
    assert conflux.shared_array([2, np.int64(3)], np.float64).shape == (2, 3)
    assert conflux.shared_array(4).dtype == np.float32


def test_bad_arguments():
    with pytest.raises(conflux.DtypeError, match="not supported"):
        conflux.shared_array(3, np.complex64)
    with pytest.raises(ValueError, match="negative"):
        conflux.shared_array((2, -1))
    with pytest.raises(TypeError, match="shape"):
        conflux.shared_array(2.5)


def test_freed_once_when_the_last_view_goes(blocks):
    a = conflux.shared_array((4, 4), np.int64)
    ref, address = blocks[0]
    views = [a[1:], a.reshape(16), a.view(np.float64), a.T, np.asarray(a)]
    del a
    gc.collect()
    for v in views:
        v[...] = 3  # still our memory
        assert ref() is not None
    row = views[0][0]
    del views, v
    gc.collect()
    assert ref() is not None
    np.testing.assert_array_equal(row, [3, 3, 3, 3])
    del row
    gc.collect()
    assert ref() is None
    assert_freed(address)


def test_a_second_free_is_reported_not_silent(monkeypatch):
    """What pytestmark watches for: had the owner freed a block already freed, it would say so."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    a = conflux.shared_array(4)
    _capi.cfx_free(a.__array_interface__["data"][0])
    del a
    gc.collect()
    assert [type(e) for e in seen] == [conflux.InvalidArgumentError]
    assert "releasing a collected array's shared tensor memory: cfx_free:" in str(seen[0])


def test_many_allocations_are_distinct_and_go_back(blocks):
    arrays = [conflux.shared_array(i % 7 + 1, np.int32) for i in range(2000)]
    for i, a in enumerate(arrays):
        a[...] = i
    assert len({address for _, address in blocks}) == len(arrays)
    assert all(int(a[0]) == i and (a == i).all() for i, a in enumerate(arrays))
    del arrays, a
    gc.collect()
    assert all(ref() is None for ref, _ in blocks)
    for _, address in blocks[::97]:
        assert_freed(address)


def test_a_collective_keeps_the_block(blocks):
    conflux.init()
    a = conflux.shared_array(1000, np.float32)
    a[...] = 2
    ref, address = blocks[0]
    h = conflux.allreduce_async_(a[500:], op=conflux.Sum, name="unit.shared.keep")
    out = conflux.allreduce_async(a[:500], op=conflux.Sum, name="unit.shared.keep_out")
    del a
    gc.collect()
    assert ref() is not None  # the handles hold the views
    np.testing.assert_array_equal(conflux.synchronize(h), np.full(500, 2, np.float32))
    np.testing.assert_array_equal(conflux.synchronize(out), np.full(500, 2, np.float32))
    del h, out
    gc.collect()
    assert ref() is None
    assert_freed(address)


def test_size_one_collectives_on_shared_arrays():
    conflux.init()
    xs = [conflux.shared_array((2, 3), np.float64) for _ in range(3)]
    for i, x in enumerate(xs):
        x[...] = np.arange(6).reshape(2, 3) + i
    want = [x.copy() for x in xs]
    np.testing.assert_array_equal(conflux.allreduce(xs[0], op=conflux.Sum), want[0])
    assert conflux.allreduce_(xs[1], op=conflux.Average) is xs[1]
    for got, w in zip(conflux.grouped_allreduce_(xs, op=conflux.Sum), want):
        np.testing.assert_array_equal(got, w)
    np.testing.assert_array_equal(conflux.broadcast(xs[2], 0), want[2])


def test_works_without_a_context_and_outlives_shutdown(blocks):
    conflux.shutdown()
    assert not conflux.is_initialized()
    a = conflux.shared_array(3)
    a[...] = 5
    conflux.init()
    b = conflux.shared_array(3)
    b[...] = conflux.allreduce(a, op=conflux.Sum)
    conflux.shutdown()
    np.testing.assert_array_equal(a + b, [10, 10, 10])
    del a, b
    gc.collect()
    for _, address in blocks:
        assert_freed(address)
    conflux.init()


def test_absurd_sizes_raise_the_library_message():
    with pytest.raises(conflux.OutOfMemoryError, match="no room for .* bytes in the shared pool"):
        conflux.shared_array(1 << 62, np.uint8)
    with pytest.raises(MemoryError, match="CFX_SHARED_POOL_BYTES"):
        conflux.shared_array((1 << 40, 1 << 20), np.float64)  # an OutOfMemoryError is a MemoryError
    with pytest.raises(conflux.OutOfMemoryError, match="more than any pool"):
        conflux.shared_array((1 << 40, 1 << 40), np.float64)  # more than size_t


def test_a_small_pool_refuses_then_reuses_freed_memory():
    out = run_python("""
        import gc, numpy as np, conflux
        keep = [conflux.shared_array(1 << 20, np.uint8) for _ in range(3)]
        try:
            conflux.shared_array(2 << 20, np.uint8)
        except conflux.OutOfMemoryError as e:
            print("refused:", e)
        for i in range(500):  # 500 MiB through a 4 MiB pool: every block comes back
            conflux.shared_array(1 << 20, np.uint8)[...] = i % 256
        del keep
        gc.collect()
        print("after:", conflux.shared_array(4 << 20, np.uint8).nbytes)
        """, CFX_SHARED_POOL_BYTES="4MiB")
    assert "refused: cfx_alloc: no room for 2097152 bytes in the shared pool" in out
    assert "CFX_SHARED_POOL_BYTES sets its size" in out
    assert "after: 4194304" in out


@pytest.mark.parametrize("value,match", [("banana", "CFX_SHARED_POOL_BYTES"),
                                         ("100", "at least 4096 bytes are needed")])
def test_malformed_pool_size_is_a_config_error(value, match):
    out = run_python("""
        import conflux
        try:
            conflux.shared_array(4)
        except conflux.ConfigError as e:
            print("config:", e)
        """, CFX_SHARED_POOL_BYTES=value)
    assert out.startswith("config: ") and match in out, out


def test_a_forked_child_frees_nothing_of_its_parent():
    """The child inherits the mapping (shared with the parent) but not the pool: collecting its
    copy of an array must neither free nor report anything; the parent's array stays its own."""
    out = run_python("""
        import gc, os, sys, numpy as np, conflux
        from conflux import _capi
        errors = []
        sys.unraisablehook = lambda u: errors.append(u.exc_value)
        a = conflux.shared_array(4, np.int32)
        a[...] = 1
        address = a.__array_interface__["data"][0]
        pid = os.fork()
        if pid == 0:
            a[...] = 2  # MAP_SHARED: the parent sees it
            del a
            gc.collect()
            conflux.shared_array(4)  # the child's own pool
            os._exit(1 if errors else 0)
        _, status = os.waitpid(pid, 0)
        print("child:", os.waitstatus_to_exitcode(status), "parent sees:", a.tolist())
        del a
        gc.collect()
        try:
            _capi.cfx_free(address)
        except conflux.InvalidArgumentError:
            print("freed by the parent; errors:", errors)
        """)
    assert "child: 0 parent sees: [2, 2, 2, 2]" in out
    assert "freed by the parent; errors: []" in out


# ---- conflux.torch ----
@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="python3-torch is not installed")


def test_torch_shared_empty_and_zeros(torch):
    import conflux.torch as cfx
    for dt in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
               torch.bfloat16, torch.float32, torch.float64, torch.bool):
        t = cfx.shared_zeros(2, 3, dtype=dt)
        assert t.dtype == dt and t.shape == (2, 3) and t.device.type == "cpu"
        assert t.is_contiguous() and t.data_ptr() % 64 == 0
        assert not t.any()
        t.fill_(1)
        assert t.all()
    for size in ((4, 5), ([4, 5],), (torch.Size([4, 5]),)):
        assert cfx.shared_empty(*size).shape == (4, 5)
    assert cfx.shared_empty(6).shape == (6,) and cfx.shared_empty(6).dtype == torch.float32
    assert cfx.shared_empty(()).shape == () and cfx.shared_empty(0, 3).numel() == 0
    with pytest.raises(conflux.DtypeError, match="not supported"):
        cfx.shared_empty(3, dtype=torch.complex64)
    with pytest.raises(conflux.OutOfMemoryError, match="shared pool"):
        cfx.shared_empty(1 << 40, 1 << 20)


def test_torch_tensor_and_its_views_keep_the_block(torch, blocks):
    import conflux.torch as cfx
    conflux.init()
    t = cfx.shared_zeros(8, 8, dtype=torch.bfloat16)
    ref, address = blocks[0]
    views = [t[2:], t.view(64), t.t(), t.view(torch.int16), t.reshape(-1)]
    del t
    gc.collect()
    assert ref() is not None
    row = views[0][0]
    h = cfx.allreduce_async_(views[1], op=cfx.Sum, name="unit.shared.torch")
    del views
    gc.collect()
    assert ref() is not None
    cfx.synchronize(h)
    del h
    gc.collect()
    assert ref() is not None
    assert not row.any()
    del row
    gc.collect()
    assert ref() is None
    assert_freed(address)


def test_is_shared_tells_shared_from_ordinary_memory():
    a = conflux.shared_array((1000,), np.float32)
    b = np.empty(1000, np.float32)
    address = a.__array_interface__["data"][0]
    assert conflux._capi.cfx_is_shared(address, a.nbytes) == 1
    assert conflux._capi.cfx_is_shared(address + 400, 400) == 1
    assert conflux._capi.cfx_is_shared(b.__array_interface__["data"][0], b.nbytes) == 0
    assert conflux._capi.cfx_is_shared(None, 0) == 0

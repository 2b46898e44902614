"""Every collective of the numpy API x dtypes x (blocking, in-place, async, async in-place), checked
against results recomputed here from every rank's known contribution."""
import time
import zlib

import numpy as np
import pytest

import conflux
from conftest import contribution, expected_reduce, tolerance

NP_DTYPES = ["uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32", "float64",
             "bool"]
FLOATS = ["float16", "float32", "float64"]
FORMS = ["allreduce", "allreduce_", "allreduce_async", "allreduce_async_"]
OPS = {"Sum": conflux.Sum, "Average": conflux.Average, "Min": conflux.Min, "Max": conflux.Max,
       "Product": conflux.Product}


def np_dtype(name):
    return np.dtype(name)


def check(got, want, dtype_name):
    assert got.dtype == np_dtype(dtype_name), (got.dtype, dtype_name)
    want = np.asarray(want)
    assert got.shape == want.shape
    tol = tolerance(dtype_name)
    if tol:
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(got.astype(np.float64), want)


def run_allreduce(form, a, **kw):
    if form == "allreduce":
        before = a.copy()
        out = conflux.allreduce(a, **kw)
        np.testing.assert_array_equal(a, before)  # input untouched
        return out
    if form == "allreduce_":
        out = conflux.allreduce_(a, **kw)
        assert out is a
        return a
    if form == "allreduce_async":
        h = conflux.allreduce_async(a, **kw)
        assert isinstance(h, conflux.Handle)
        out = conflux.synchronize(h)
        assert conflux.poll(h)
        return out
    h = conflux.allreduce_async_(a, **kw)
    out = conflux.synchronize(h)
    assert out is a
    return a


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", NP_DTYPES)
def test_allreduce_sum_forms(form, dtype, rank, size):
    shape = (3, 5)
    seed = zlib.crc32(("%s.%s" % (form, dtype)).encode()) % 10000
    a = contribution(rank, shape, dtype, seed).astype(dtype)
    out = run_allreduce(form, a, op=conflux.Sum, name="np.sum.%s.%s" % (form, dtype))
    want = expected_reduce(conflux.Sum, [contribution(r, shape, dtype, seed) for r in range(size)],
                           dtype)
    check(out, want, dtype)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", NP_DTYPES)
def test_allreduce_ops(op, dtype, rank, size):
    if op == "Average" and dtype == "bool":
        with pytest.raises(ValueError, match="bool"):  # refused locally, at the call
            conflux.allreduce(np.ones(3, bool), op=conflux.Average)
        return
    shape = (17,)
    seed = 7 + list(OPS).index(op)
    positive = op == "Product"
    xs = [contribution(r, shape, dtype, seed, positive) for r in range(size)]
    out = conflux.allreduce(xs[rank].astype(dtype), op=OPS[op], name="np.op.%s.%s" % (op, dtype))
    check(out, expected_reduce(OPS[op], xs, dtype), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_allreduce_scale_factors(dtype, rank, size):
    xs = [contribution(r, (8,), dtype, 99) for r in range(size)]
    out = conflux.allreduce(xs[rank].astype(dtype), op=conflux.Sum, prescale_factor=0.5,
                            postscale_factor=3.0)
    check(out, expected_reduce(conflux.Sum, xs, dtype, 0.5, 3.0), dtype)
    out = conflux.allreduce(xs[rank].astype(dtype), op=conflux.Average, postscale_factor=2.0)
    check(out, expected_reduce(conflux.Average, xs, dtype, 1.0, 2.0), dtype)


def test_allreduce_default_is_average_and_unnamed(rank, size):
    xs = [contribution(r, (4, 4), "float64", 5) for r in range(size)]
    out = conflux.allreduce(xs[rank])
    check(out, np.mean(xs, axis=0), "float64")


def test_allreduce_scalar_empty_and_large(rank, size):
    out = conflux.allreduce(np.array(rank + 1.0), op=conflux.Sum)
    assert out.shape == () and out == size * (size + 1) / 2
    empty = conflux.allreduce(np.zeros((0, 3), np.float32), op=conflux.Sum)
    assert empty.shape == (0, 3)
    big = np.full(3_000_000, rank + 1, np.float32)  # 12 MB: crosses the fusion buffer
    conflux.allreduce_(big, op=conflux.Sum)
    assert np.all(big == size * (size + 1) / 2)


def test_allreduce_zero_copy_views(rank, size):
    base = np.zeros(10, np.float32)
    view = base[2:6]  # contiguous view: the result lands in `base`
    view[:] = rank + 1
    conflux.allreduce_(view, op=conflux.Sum)
    assert np.all(base[2:6] == size * (size + 1) / 2) and base[0] == 0 and base[7] == 0


def test_allreduce_non_contiguous_out_of_place(rank, size):
    m = np.arange(24, dtype=np.float64).reshape(4, 6) * (rank + 1)
    t = m.T  # not C-contiguous: out-of-place copies it first
    out = conflux.allreduce(t, op=conflux.Sum)
    want = np.arange(24, dtype=np.float64).reshape(4, 6).T * (size * (size + 1) / 2)
    np.testing.assert_array_equal(out, want)


def test_many_async_in_flight_any_order(rank, size):
    arrays = [np.full(i + 1, float(rank * 100 + i)) for i in range(20)]
    order = list(range(20))
    if rank % 2:
        order.reverse()  # different submission order per rank: names match them up
    handles = {i: conflux.allreduce_async_(arrays[i], op=conflux.Sum, name="np.multi.%d" % i)
               for i in order}
    for i in range(20):
        conflux.synchronize(handles[i])
        want = sum(r * 100 + i for r in range(size))
        assert np.all(arrays[i] == want)


@pytest.mark.parametrize("form", ["grouped_allreduce", "grouped_allreduce_",
                                  "grouped_allreduce_async", "grouped_allreduce_async_"])
def test_grouped_allreduce(form, rank, size):
    specs = [((3,), "float32"), ((2, 2), "float64"), ((5,), "int32"), ((4,), "float16")]
    xs = [[contribution(r, s, d, 40 + i) for r in range(size)] for i, (s, d) in enumerate(specs)]
    arrays = [xs[i][rank].astype(d) for i, (_, d) in enumerate(specs)]
    fn = getattr(conflux, form)
    res = fn(arrays, op=conflux.Sum, name="np.%s" % form)
    if form.endswith("async") or form.endswith("async_"):
        res = conflux.synchronize(res)
    assert len(res) == len(specs)
    for i, (_, d) in enumerate(specs):
        check(res[i], expected_reduce(conflux.Sum, xs[i], d), d)
        if form.endswith("_"):
            assert res[i] is arrays[i]


@pytest.mark.parametrize("asyn", [False, True])
@pytest.mark.parametrize("dtype", NP_DTYPES)
def test_allgather(dtype, asyn, rank, size):
    # dim 0 differs per rank: rank r contributes r + 1 rows
    xs = [contribution(r, (r + 1, 3), dtype, 21) for r in range(size)]
    a = xs[rank].astype(dtype)
    if asyn:
        out = conflux.synchronize(conflux.allgather_async(a, name="np.ag.%s" % dtype))
    else:
        out = conflux.allgather(a, name="np.ag.sync.%s" % dtype)
    check(out, np.concatenate(xs), dtype)


def test_allgather_1d_and_empty_rank(rank, size):
    a = np.arange(rank * 2, dtype=np.int64) + 10 * rank  # rank 0 sends no rows
    out = conflux.allgather(a)
    want = np.concatenate([np.arange(r * 2, dtype=np.int64) + 10 * r for r in range(size)])
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("form", ["broadcast", "broadcast_", "broadcast_async", "broadcast_async_"])
@pytest.mark.parametrize("dtype", NP_DTYPES)
def test_broadcast(form, dtype, rank, size):
    for root in range(size):
        xs = [contribution(r, (2, 3), dtype, 31 + root) for r in range(size)]
        a = xs[rank].astype(dtype)
        before = a.copy()
        fn = getattr(conflux, form)
        res = fn(a, root, name="np.%s.%s.%d" % (form, dtype, root))
        if "async" in form:
            res = conflux.synchronize(res)
        check(res, xs[root], dtype)
        if form.endswith("_"):
            assert res is a
        else:
            np.testing.assert_array_equal(a, before)


@pytest.mark.parametrize("asyn", [False, True])
@pytest.mark.parametrize("dtype", ["uint8", "int32", "float16", "float32", "float64", "bool"])
def test_alltoall_equal_splits(dtype, asyn, rank, size):
    xs = [contribution(r, (2 * size, 2), dtype, 51) for r in range(size)]
    a = xs[rank].astype(dtype)
    if asyn:
        out, splits = conflux.synchronize(conflux.alltoall_async(a))
    else:
        out, splits = conflux.alltoall(a)
    want = np.concatenate([xs[r][2 * rank:2 * rank + 2] for r in range(size)])
    check(out, want, dtype)
    np.testing.assert_array_equal(splits, [2] * size)


def test_alltoall_uneven_splits(rank, size):
    # rank r sends (r + j) % 3 rows to rank j; row values encode (sender, destination, index)
    def rows(r):
        parts = []
        for j in range(size):
            n = (r + j) % 3
            parts.append(np.array([[r * 100 + j * 10 + k] for k in range(n)], np.int64).reshape(n, 1))
        return np.concatenate(parts), [(r + j) % 3 for j in range(size)]

    a, splits = rows(rank)
    out, received = conflux.alltoall(a, splits=splits, name="np.a2a.uneven")
    want = np.concatenate([rows(r)[0][sum(rows(r)[1][:rank]):sum(rows(r)[1][:rank + 1])]
                           for r in range(size)])
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(received, [(r + rank) % 3 for r in range(size)])


@pytest.mark.parametrize("op", ["Sum", "Average"])
@pytest.mark.parametrize("dtype", ["int32", "float16", "float32", "float64"])
@pytest.mark.parametrize("asyn", [False, True])
def test_reducescatter(op, dtype, asyn, rank, size):
    d0 = 2 * size + 1  # not divisible: the first d0 % size ranks get one extra row
    xs = [contribution(r, (d0, 3), dtype, 61) for r in range(size)]
    a = xs[rank].astype(dtype)
    if asyn:
        out = conflux.synchronize(conflux.reducescatter_async(a, op=OPS[op]))
    else:
        out = conflux.reducescatter(a, op=OPS[op])
    full = expected_reduce(OPS[op], xs, dtype)
    q, rem = divmod(d0, size)
    start = rank * q + min(rank, rem)
    rows = q + (1 if rank < rem else 0)
    check(out, full[start:start + rows], dtype)


def test_barrier(rank, size):
    if rank == 0:
        time.sleep(0.3)
    t0 = time.time()
    conflux.barrier()
    if rank != 0:
        assert time.time() - t0 > 0.2  # nobody leaves before rank 0 arrived


def test_join_returns_last_rank(rank, size):
    if rank == size - 1:
        time.sleep(0.5)
    last = conflux.join()
    assert last == size - 1


def test_poll_and_synchronize_twice(rank, size):
    a = np.ones(4, np.float32)
    h = conflux.allreduce_async_(a, op=conflux.Sum, name="np.poll")
    deadline = time.time() + 30
    while not conflux.poll(h):
        assert time.time() < deadline
        time.sleep(0.001)
    assert conflux.synchronize(h) is a
    assert conflux.synchronize(h) is a  # the result is kept
    assert np.all(a == size)


def test_dropped_async_handle_keeps_buffer_alive(rank, size):
    import gc
    h = conflux.allreduce_async(np.full(1000, rank, np.float64), op=conflux.Sum, name="np.dropped")
    del h
    gc.collect()
    out = conflux.allreduce(np.ones(3), op=conflux.Sum, name="np.after_dropped")
    assert np.all(out == size)


def test_topology(rank, size):
    assert 0 <= conflux.rank() < conflux.size()
    assert conflux.local_size() * conflux.cross_size() == size
    assert 0 <= conflux.local_rank() < conflux.local_size()
    assert 0 <= conflux.cross_rank() < conflux.cross_size()
    ranks = conflux.allgather(np.array([rank], np.int32))
    np.testing.assert_array_equal(ranks, np.arange(size))


def test_reinit_after_shutdown(rank, size):
    conflux.shutdown()
    assert not conflux.is_initialized()
    with pytest.raises(conflux.NotInitializedError):
        conflux.allreduce(np.ones(2))
    conflux.init()
    conflux.init()  # second call: no-op
    assert conflux.is_initialized() and conflux.size() == size
    out = conflux.allreduce(np.full(3, rank, np.float32), op=conflux.Sum)
    assert np.all(out == size * (size - 1) / 2)


def test_blocking_wait_releases_the_gil(rank, size):
    import threading
    a = np.ones(8)
    done = threading.Event()
    result = {}

    def waiter():
        result["out"] = conflux.allreduce(a, op=conflux.Sum, name="np.gil")
        done.set()

    if rank == 0:
        t = threading.Thread(target=waiter)
        t.start()
        spins = 0
        t0 = time.time()
        while not done.is_set() and time.time() - t0 < 30:
            spins += 1  # pure Python: only runs while the waiting thread has released the GIL
        t.join()
        assert spins > 10000, spins
        np.testing.assert_array_equal(result["out"], np.full(8, float(size)))
    else:
        time.sleep(0.5)
        conflux.allreduce(a, op=conflux.Sum, name="np.gil")


def test_threads_submit_concurrently(rank, size):
    import threading
    errors = []
    arrays = {}

    def worker(k):
        try:
            for i in range(10):
                a = np.full(5, float(rank + k + i))
                conflux.allreduce_(a, op=conflux.Sum, name="np.thread.%d.%d" % (k, i))
                arrays[(k, i)] = a
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for (k, i), a in arrays.items():
        assert np.all(a == sum(r + k + i for r in range(size)))
    assert len(arrays) == 40


def test_join_with_uneven_data(rank, size):
    # rank 0 runs out of data first: it joins and contributes the identity to the others' sums
    if rank == 0:
        last = conflux.join()
    else:
        for step in range(3):
            out = conflux.allreduce(np.full(3, float(rank + step)), op=conflux.Sum,
                                    name="np.join.uneven.%d" % step)
            np.testing.assert_array_equal(out, np.full(3, float(sum(r + step
                                                                    for r in range(1, size)))))
        last = conflux.join()
    assert 1 <= last < size
    after = conflux.allreduce(np.ones(2), op=conflux.Sum, name="np.after_join")
    assert np.all(after == size)


@pytest.mark.parametrize("asyn", [False, True])
def test_grouped_allgather(asyn, rank, size):
    specs = [((2, 3), "float32"), ((4,), "int64"), ((1, 2, 2), "float16"), ((3,), "bool")]
    xs = [[contribution(r, (s[0] + r,) + s[1:], d, 70 + i) for r in range(size)]
          for i, (s, d) in enumerate(specs)]
    arrays = [xs[i][rank].astype(d) for i, (_, d) in enumerate(specs)]
    if asyn:
        res = conflux.synchronize(conflux.grouped_allgather_async(arrays, name="np.gag.a"))
    else:
        res = conflux.grouped_allgather(arrays, name="np.gag")
    assert len(res) == len(specs)
    for i, (_, d) in enumerate(specs):
        check(res[i], np.concatenate(xs[i]), d)


@pytest.mark.parametrize("asyn", [False, True])
def test_grouped_reducescatter(asyn, rank, size):
    specs = [((2 * size + 1, 2), "float32"), ((size, 3), "int32"), ((3 * size - 1,), "float64")]
    xs = [[contribution(r, s, d, 80 + i) for r in range(size)] for i, (s, d) in enumerate(specs)]
    arrays = [xs[i][rank].astype(d) for i, (_, d) in enumerate(specs)]
    if asyn:
        res = conflux.synchronize(conflux.grouped_reducescatter_async(arrays, op=conflux.Sum))
    else:
        res = conflux.grouped_reducescatter(arrays, op=conflux.Sum, name="np.grs")
    for i, (s, d) in enumerate(specs):
        full = expected_reduce(conflux.Sum, xs[i], d)
        q, rem = divmod(s[0], size)
        start = rank * q + min(rank, rem)
        check(res[i], full[start:start + q + (1 if rank < rem else 0)], d)

"""conflux.GradientSet across ranks: registration in a different order on every rank, readiness in
arbitrary order (and from threads), owned and borrowed storage, accumulation, unused gradients and a
mismatched registration. Every result is checked against the reduction of what each rank put in,
recomputed here from conftest.contribution."""
import threading

import numpy as np
import pytest

import conflux
from conftest import contribution, expected_reduce

# name, shape, dtype: mixed dtypes and sizes, several buckets at bucket_bytes=256
GRADS = [
    ("conv1.weight", (4, 3, 3), "float32"),
    ("conv1.bias", (4,), "float32"),
    ("fc1.weight", (16, 8), "float64"),
    ("fc1.bias", (16,), "float64"),
    ("emb", (50,), "float32"),
    ("fc2.weight", (3, 16), "float32"),
    ("scalar", (), "float64"),
]


def rank_order(rank, n):
    """A registration order of its own for every rank: rotated by the rank, reversed on odd ranks."""
    order = [(k + rank) % n for k in range(n)]
    return order[::-1] if rank % 2 else order


def seed(step, gid, pass_=0):
    return 1000 * step + 10 * gid + pass_


def build(gs, rank, grads=GRADS):
    """Adds `grads` in this rank's order; returns gid -> index."""
    index = {}
    for gid in rank_order(rank, len(grads)):
        name, shape, dtype = grads[gid]
        index[gid] = gs.add(name, shape, np.dtype(dtype))
    return index


def check(gs, index, size, step, op=conflux.Average, passes=1, prescale=1.0, postscale=1.0,
          grads=GRADS):
    for gid, (name, shape, dtype) in enumerate(grads):
        xs = [sum(contribution(r, shape, dtype, seed(step, gid, p)) for p in range(passes))
              for r in range(size)]
        want = expected_reduce(op, xs, dtype, prescale, postscale)
        got = gs.array(index[gid])
        assert got.shape == tuple(shape) and got.dtype == np.dtype(dtype), name
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-6, atol=1e-6,
                                   err_msg="gradient %s, step %d" % (name, step))


def test_owned_orders_and_any_ready_order(rank, size):
    with conflux.GradientSet("py.orders", bucket_bytes=256) as gs:
        index = build(gs, rank)
        gs.commit()
        for gid, (name, shape, dtype) in enumerate(GRADS):  # owned storage starts zeroed
            assert not gs.array(name).any()
        rng = np.random.default_rng([rank, 7])
        for step in range(3):
            for gid in rng.permutation(len(GRADS)):
                name, shape, dtype = GRADS[gid]
                gs.array(index[gid])[...] = contribution(rank, shape, dtype, seed(step, gid))
                gs.ready(name if gid % 2 else index[gid])
            gs.wait(timeout=60)
            check(gs, index, size, step)
            assert conflux._capi.cfx_is_shared(gs.array(index[0]).__array_interface__["data"][0],
                                               gs.array(index[0]).nbytes)


def test_ready_from_threads(rank, size):
    with conflux.GradientSet("py.threads", bucket_bytes=128) as gs:
        index = build(gs, rank)
        gs.commit()
        for step in range(2):
            def produce(gids):
                for gid in gids:
                    name, shape, dtype = GRADS[gid]
                    gs.array(index[gid])[...] = contribution(rank, shape, dtype, seed(step, gid))
                    gs.ready(index[gid])
            gids = rank_order(rank, len(GRADS))
            threads = [threading.Thread(target=produce, args=(gids[k::3],)) for k in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            gs.wait(timeout=60)
            check(gs, index, size, step)


def test_borrowed_arrays_sum_with_scales(rank, size):
    gs = conflux.GradientSet("py.borrowed", op=conflux.Sum, prescale=2.0, postscale=0.25,
                             owned=False)
    try:
        arrays, index = {}, {}
        for gid in rank_order(rank, len(GRADS)):
            name, shape, dtype = GRADS[gid]
            arrays[gid] = np.zeros(shape, dtype)
            index[gid] = gs.add(name, array=arrays[gid])
        gs.commit()
        for step in range(2):
            for gid in rank_order(rank + 1, len(GRADS)):
                name, shape, dtype = GRADS[gid]
                arrays[gid][...] = contribution(rank, shape, dtype, seed(step, gid))
                gs.ready(name)
            gs.wait()
            check(gs, index, size, step, op=conflux.Sum, prescale=2.0, postscale=0.25)
            assert gs.array(index[0]) is arrays[0]
    finally:
        gs.free()
    gs.free()  # idempotent


def test_accumulation(rank, size):
    with conflux.GradientSet("py.accumulate", accumulate_steps=2, prescale=0.5) as gs:
        index = build(gs, rank)
        gs.commit()
        for step in range(2):
            for pass_ in range(2):
                for gid in reversed(range(len(GRADS))):  # backward: accumulate, then mark
                    name, shape, dtype = GRADS[gid]
                    a = gs.array(index[gid])
                    prev = a.astype(np.float64) if pass_ else 0.0
                    a[...] = prev + contribution(rank, shape, dtype, seed(step, gid, pass_))
                    gs.ready(index[gid])
            with pytest.raises(conflux.InvalidArgumentError, match="marked ready"):
                gs.ready(index[0])
            gs.wait(timeout=60)
            check(gs, index, size, step, passes=2, prescale=0.5)


def test_unused_gradients(rank, size):
    with conflux.GradientSet("py.unused", bucket_bytes=256) as gs:
        index = build(gs, rank)
        gs.commit()
        for step in range(2):
            for gid, (name, shape, dtype) in enumerate(GRADS):
                gs.array(index[gid])[...] = contribution(rank, shape, dtype, seed(step, gid))
                # each rank leaves a different gradient unmarked; step 1: only gradient 0 marked
                if (step == 0 and gid != rank % len(GRADS)) or (step == 1 and gid == 0):
                    gs.ready(name)
            gs.wait(timeout=60)  # unmarked gradients are reduced as they are
            check(gs, index, size, step)


def test_integer_gradients(rank, size):
    grads = [("count", (5,), "int32"), ("total", (3, 2), "int64")]
    with conflux.GradientSet("py.integers", op=conflux.Sum) as gs:
        index = build(gs, rank, grads)
        gs.commit()
        for gid, (name, shape, dtype) in enumerate(grads):
            gs.array(name)[...] = contribution(rank, shape, dtype, seed(0, gid))
            gs.ready(name)
        gs.wait()
        check(gs, index, size, 0, op=conflux.Sum, grads=grads)


def test_mismatched_registration_names_the_gradient(rank, size):
    gs = conflux.GradientSet("py.mismatch", owned=False)
    bias = np.zeros(3, np.float32)
    weight = np.zeros((4, 2) if rank == size - 1 else (2, 4), np.float32)
    gs.add("fc.bias", array=bias)
    gs.add("fc.weight", array=weight)
    with pytest.raises(conflux.MismatchError) as info:
        gs.commit()
    message = str(info.value)
    assert "'fc.weight' is float32 [2, 4]" in message, message
    assert "float32 [4, 2] on rank %d" % (size - 1) in message, message
    gs.free()

    # a gradient missing on one rank
    with conflux.GradientSet("py.mismatch.missing") as gs:
        gs.add("a", 4)
        if rank != 0:
            gs.add("b", 2)
        with pytest.raises(conflux.MismatchError, match="'b'"):
            gs.commit()


def test_local_errors(rank, size):
    with conflux.GradientSet("py.errors") as gs:
        with pytest.raises(ValueError, match="not an array"):
            gs.add("w", array=np.zeros(2, np.float32))
        i = gs.add("w", (2, 2))
        with pytest.raises(conflux.DuplicateNameError):
            gs.add("w", 3)
        with pytest.raises(conflux.InvalidArgumentError, match="not committed"):
            gs.array(i)
        with pytest.raises(conflux.DtypeError):
            gs.add("c", 2, np.complex64)
        gs.commit()
        with pytest.raises(conflux.InvalidArgumentError, match="commit"):
            gs.add("late", 2)
        with pytest.raises(KeyError, match="no gradient 'nope'"):
            gs.ready("nope")
        with pytest.raises(IndexError):
            gs.ready(5)
        gs.ready(i)
        gs.wait()
        np.testing.assert_array_equal(gs.array("w"), np.zeros((2, 2), np.float32))
    with pytest.raises(conflux.InvalidArgumentError, match="freed"):
        gs.ready(0)
    with pytest.raises(ValueError, match="needs array="):
        conflux.GradientSet("py.errors.borrowed", owned=False).add("x", 2)
    with pytest.raises(ValueError, match="unknown reduction op"):
        conflux.GradientSet("py.errors.op", op=42)


def test_storage_outlives_free_while_an_array_is_held(rank, size):
    gs = conflux.GradientSet("py.lifetime")
    gs.add("w", 8)
    gs.commit()
    w = gs.array("w")
    w[...] = rank + 1
    gs.ready("w")
    gs.wait()
    gs.free()
    np.testing.assert_allclose(w, np.full(8, sum(range(1, size + 1)) / size, np.float32))
    del w

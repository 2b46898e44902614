"""Adasum (conflux.Adasum in the numpy API, hvd.Adasum in conflux.horovod.torch's allreduce)
against a NumPy reference written here: the adaptive sum of every rank's array, computed
recursively in float64 over the tree the engine uses (ranks beyond the largest power of two fold
into rank r - p first; then halves of the ranks, each half first)."""
import numpy as np
import pytest

import conflux


def adasum_pair(a, b):
    ab, aa, bb = float(np.dot(a, b)), float(np.dot(a, a)), float(np.dot(b, b))
    ca = 1 - ab / (2 * aa) if aa > 0 else 1.0
    cb = 1 - ab / (2 * bb) if bb > 0 else 1.0
    return ca * a + cb * b


def adasum_reference(xs):
    xs = [np.asarray(x, dtype=np.float64).ravel() for x in xs]
    p = 1
    while p * 2 <= len(xs):
        p *= 2
    v = xs[:p]
    for i in range(len(xs) - p):
        v[i] = adasum_pair(v[i], xs[p + i])

    def halves(lo, hi):
        if hi - lo == 1:
            return v[lo]
        mid = (lo + hi) // 2
        return adasum_pair(halves(lo, mid), halves(mid, hi))

    return halves(0, p)


def contribution(r, shape, dtype, seed):
    """Rank r's array: a direction every rank shares plus its own noise, rounded to the dtype."""
    n = int(np.prod(shape))
    common = 0.6 * np.sin(0.37 * np.arange(n) + seed)
    noise = np.random.default_rng(1000 * seed + r).uniform(-0.4, 0.4, n)
    return (common + noise).astype(dtype).reshape(shape)


TOLERANCE = {"float16": 4e-3, "float32": 1e-5, "float64": 1e-12}


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_numpy_allreduce(rank, size, dtype):
    shapes = [(3, 50), (7,), (1,), (64, 33)]
    mine = [contribution(rank, s, dtype, k) for k, s in enumerate(shapes)]
    handles = [conflux.allreduce_async(a, name="adasum.np.%s.%d" % (dtype, k), op=conflux.Adasum)
               for k, a in enumerate(mine)]  # submitted together: they fuse
    for k, (s, h) in enumerate(zip(shapes, handles)):
        got = conflux.synchronize(h)
        want = adasum_reference([contribution(r, s, dtype, k) for r in range(size)]).reshape(s)
        assert got.dtype == np.dtype(dtype) and got.shape == s
        scale = max(float(np.abs(want).max()), 1e-300)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=0,
                                   atol=TOLERANCE[dtype] * scale)
    # in place, and not a sum or an average of these (non-orthogonal, non-equal) arrays
    a = contribution(rank, (3, 50), dtype, 0)
    conflux.allreduce_(a, name="adasum.np.inplace." + dtype, op=conflux.Adasum)
    total = sum(contribution(r, (3, 50), dtype, 0).astype(np.float64) for r in range(size))
    assert not np.allclose(a, total, rtol=1e-2) and not np.allclose(a, total / size, rtol=1e-2)


def test_orthogonal_is_sum_identical_is_itself(rank, size):
    n = 40
    ortho = np.where(np.arange(n) % size == rank, np.arange(n) + 1.0, 0.0).astype(np.float32)
    got = conflux.allreduce(ortho, name="adasum.orthogonal", op=conflux.Adasum)
    np.testing.assert_array_equal(got, (np.arange(n) + 1.0).astype(np.float32))
    same = contribution(0, (n,), "float64", 5)
    got = conflux.allreduce(same, name="adasum.identical", op=conflux.Adasum)
    np.testing.assert_array_equal(got, same)


def test_refused_dtype_names_the_tensor(rank, size):
    assert conflux.Adasum not in (conflux.Sum, conflux.Average, conflux.Min, conflux.Max,
                                  conflux.Product)
    with pytest.raises(conflux.UnsupportedError, match="adasum.ints.*Adasum"):
        conflux.allreduce(np.arange(4, dtype=np.int32), name="adasum.ints", op=conflux.Adasum)


def test_horovod_allreduce(rank, size):
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    import conflux.horovod.torch as hvd
    assert hvd.Adasum == conflux.Adasum
    shape = (5, 12)
    t = torch.from_numpy(contribution(rank, shape, "float32", 9))
    got = hvd.allreduce(t, name="adasum.hvd", op=hvd.Adasum)
    want = adasum_reference([contribution(r, shape, "float32", 9) for r in range(size)])
    np.testing.assert_allclose(got.numpy().astype(np.float64).ravel(), want, rtol=0,
                               atol=1e-5 * float(np.abs(want).max()))
    np.testing.assert_array_equal(t.numpy(), contribution(rank, shape, "float32", 9))  # not in place

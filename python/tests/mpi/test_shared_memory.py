"""Allreduces on shared tensor memory (conflux.shared_array, conflux.torch.shared_empty): in place
and out of place, Sum and Average, float32 and int32, one tensor above 1 MiB and many small fused
ones, and ranks that mix shared and private memory; every result checked against the reduction of
every rank's contribution recomputed here. Under ctest all ranks share one host, so every rank
is a local peer of every other."""
import gc

import numpy as np
import pytest

import conflux
from conftest import contribution, expected_reduce, tolerance

try:
    import torch
    import conflux.torch as cfx
except ImportError:  # the numpy half still runs
    torch = None

APIS = ["numpy", "torch"]
DTYPES = ["float32", "int32"]
OPS = {"Sum": conflux.Sum, "Average": conflux.Average}
BIG = (520, 1024)  # 2 MiB of float32 / int32: more than one 1 MiB chunk (CFX_CHUNK_BYTES)
SMALL = [(3,), (17,), (2, 5), (64,), (1,), (8, 8), (255,), (4, 3, 2)]


def make(api, x, dtype, shared=True):
    """Rank's contribution `x` (float64) as a `dtype` array (numpy) or tensor (torch), in shared
    tensor memory or, with shared=False, in ordinary memory."""
    if api == "torch":
        if torch is None:
            pytest.skip("python3-torch is not installed")
        src = torch.from_numpy(x.astype(dtype))
        if not shared:
            return src
        t = cfx.shared_empty(*x.shape, dtype=src.dtype)
        return t.copy_(src)
    if not shared:
        return x.astype(dtype)
    a = conflux.shared_array(x.shape, dtype)
    a[...] = x
    return a


def is_shared(x):
    """Whether x's elements lie in this process's shared tensor memory (cfx_is_shared)."""
    if torch is not None and isinstance(x, torch.Tensor):
        return conflux._capi.cfx_is_shared(x.data_ptr(), x.numel() * x.element_size()) == 1
    return conflux._capi.cfx_is_shared(x.__array_interface__["data"][0], x.nbytes) == 1


def mod(api):
    return cfx if api == "torch" else conflux


def check(got, want, dtype):
    got = got.numpy() if torch is not None and isinstance(got, torch.Tensor) else got
    assert got.dtype == np.dtype(dtype) and got.shape == np.shape(want)
    tol = tolerance(dtype)
    if tol:
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(got.astype(np.float64), want)


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_big_allreduce(api, inplace, op, dtype, rank, size):
    seed = 900 + 10 * DTYPES.index(dtype) + list(OPS).index(op) + 2 * inplace
    xs = [contribution(r, BIG, dtype, seed) for r in range(size)]
    a = make(api, xs[rank], dtype)
    name = "shm.big.%s.%s.%s.%d" % (api, op, dtype, inplace)
    m = mod(api)
    if inplace:
        got = m.allreduce_(a, op=OPS[op], name=name)
        assert got is a
    else:
        got = m.allreduce(a, op=OPS[op], name=name)
        check(a, xs[rank], dtype)  # the input is untouched
        assert is_shared(got)  # a shared input gets a shared result: the direct path still applies
    check(got, expected_reduce(OPS[op], xs, dtype), dtype)


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("op", list(OPS))
def test_small_fused_allreduces(api, inplace, op, rank, size):
    """Small tensors of both dtypes submitted back to back (the engine fuses them into one batch),
    waited on after their arrays were dropped: the handles keep the shared memory alive."""
    specs = [(shape, DTYPES[i % 2]) for i, shape in enumerate(SMALL)]
    xs = [[contribution(r, s, d, 950 + i) for r in range(size)] for i, (s, d) in enumerate(specs)]
    m = mod(api)
    start = m.allreduce_async_ if inplace else m.allreduce_async
    handles = [start(make(api, xs[i][rank], d), op=OPS[op],
                     name="shm.small.%s.%s.%d.%d" % (api, op, inplace, i))
               for i, (_, d) in enumerate(specs)]
    gc.collect()
    for i, (h, (_, d)) in enumerate(zip(handles, specs)):
        check(m.synchronize(h), expected_reduce(OPS[op], xs[i], d), d)


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "in_place"])
def test_grouped_allreduce(api, inplace, rank, size):
    specs = [(shape, DTYPES[i % 2]) for i, shape in enumerate(SMALL + [BIG])]
    xs = [[contribution(r, s, d, 980 + i) for r in range(size)] for i, (s, d) in enumerate(specs)]
    arrays = [make(api, xs[i][rank], d) for i, (_, d) in enumerate(specs)]
    m = mod(api)
    f = m.grouped_allreduce_ if inplace else m.grouped_allreduce
    got = f(arrays, op=conflux.Average, name="shm.grouped.%s.%d" % (api, inplace))
    for i, (_, d) in enumerate(specs):
        check(got[i], expected_reduce(conflux.Average, xs[i], d), d)
        assert (got[i] is arrays[i]) == inplace


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "in_place"])
def test_only_some_ranks_use_shared_memory(api, inplace, rank, size):
    """Even ranks reduce shared arrays, odd ranks ordinary ones (the engine copies for those)."""
    shared = rank % 2 == 0
    specs = [(BIG, "float32")] + [(shape, "int32") for shape in SMALL[:4]]
    xs = [[contribution(r, s, d, 1000 + i) for r in range(size)] for i, (s, d) in enumerate(specs)]
    m = mod(api)
    start = m.allreduce_async_ if inplace else m.allreduce_async
    arrays = [make(api, xs[i][rank], d, shared) for i, (_, d) in enumerate(specs)]
    handles = [start(a, op=conflux.Sum, name="shm.mixed.%s.%d.%d" % (api, inplace, i))
               for i, a in enumerate(arrays)]
    for i, (h, (_, d)) in enumerate(zip(handles, specs)):
        check(m.synchronize(h), expected_reduce(conflux.Sum, xs[i], d), d)

"""Shared fixtures for the multi-rank suites (run under mpirun with 2, 3 and 4 ranks).

Every rank runs the same tests in the same order, so collectives line up; whether a test runs or
skips never depends on the rank. Each rank's contribution is a known function of (rank, seed) so a
test recomputes every rank's input and the expected result itself, with numpy.
"""
import numpy as np
import pytest

import conflux


@pytest.fixture(scope="session", autouse=True)
def cfx_session():
    conflux.init()
    if conflux.size() < 2:
        pytest.exit("the mpi suites need at least 2 ranks (run them under mpirun -np 2 or 3)", 2)
    yield
    # conflux's atexit hook shuts down


@pytest.fixture
def rank():
    return conflux.rank()


@pytest.fixture
def size():
    return conflux.size()


INT_RANGES = {
    "uint8": (0, 6), "uint16": (0, 6), "int8": (-8, 9), "int16": (-8, 9), "int32": (-50, 51),
    "int64": (-50, 51), "float16": (-8, 9), "bfloat16": (-8, 9), "float32": (-50, 51),
    "float64": (-50, 51), "bool": (0, 2),
}


def contribution(rank, shape, dtype_name, seed, positive=False):
    """Rank `rank`'s input as float64 holding small integers (exact in every dtype)."""
    rng = np.random.default_rng([seed, rank, 12345])
    lo, hi = INT_RANGES[dtype_name]
    if positive:
        lo, hi = (1, 4) if dtype_name != "bool" else (0, 2)
    return rng.integers(lo, hi, size=shape).astype(np.float64)


def expected_reduce(op, xs, dtype_name, prescale=1.0, postscale=1.0):
    """The reduction of the float64 contributions `xs` as the ABI defines it (capi/src/kernels/reduce.h):
    Average = Sum then a postscale of postscale / size; integers scale in double and truncate toward
    zero; bool sum/max/average = or, min/product = and."""
    a = np.stack(xs)
    if dtype_name == "bool":
        a = a != 0
        if op in (conflux.Sum, conflux.Max, conflux.Average):
            return a.any(axis=0).astype(np.float64)
        return a.all(axis=0).astype(np.float64)
    integer = dtype_name not in ("float16", "bfloat16", "float32", "float64")
    a = a * prescale
    if integer:
        a = np.trunc(a)
    if op == conflux.Sum:
        r = a.sum(axis=0) * postscale
    elif op == conflux.Average:
        r = a.sum(axis=0) * (postscale / len(xs))
    elif op == conflux.Min:
        r = a.min(axis=0) * postscale
    elif op == conflux.Max:
        r = a.max(axis=0) * postscale
    elif op == conflux.Product:
        r = a.prod(axis=0) * postscale
    else:
        raise AssertionError(op)
    return np.trunc(r) if integer else r


def tolerance(dtype_name):
    return {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-6, "float64": 1e-12}.get(dtype_name, 0)

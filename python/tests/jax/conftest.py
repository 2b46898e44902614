"""Shared fixtures of the conflux.jax suites (run under mpirun, or cfxrun, with 2 and 3 ranks).

Every rank runs the same tests in the same order, so collectives line up; whether a test runs or
skips never depends on the rank. Each rank's contribution is a known function of (rank, seed), so
a test recomputes every rank's input and the expected result itself, with numpy. Without JAX or
without the FFI handlers (python/jax.cmake prints why) every test skips with the reason.
"""
import os

import numpy as np
import pytest

_SKIP = os.environ.get("CFX_JAX_SKIP_REASON")
if not _SKIP:
    try:
        import jax  # noqa: F401
        import conflux.jax as cfx
        from conflux import _jax_primitive
        _SKIP = _jax_primitive.UNAVAILABLE
    except ImportError as e:
        _SKIP = "JAX does not import: %s" % e


def pytest_collection_modifyitems(config, items):
    if _SKIP:
        mark = pytest.mark.skip(reason="conflux.jax unavailable: " + _SKIP)
        for item in items:
            item.add_marker(mark)


@pytest.fixture(scope="session", autouse=True)
def cfx_session():
    if _SKIP:
        yield
        return
    cfx.init()
    if cfx.size() < 2:
        pytest.exit("the conflux.jax suites need at least 2 ranks (mpirun -np 2 or 3)", 2)
    yield


@pytest.fixture
def rank():
    return cfx.rank()


@pytest.fixture
def size():
    return cfx.size()


def contribution(rank, shape, seed, low=-50, high=51, dtype=np.float32):
    """Rank `rank`'s input: small integers, exact in every dtype and any sum order."""
    rng = np.random.default_rng(1000 * seed + rank)
    return rng.integers(low, high, size=shape).astype(dtype)


def all_contributions(size, shape, seed, **kw):
    return [contribution(r, shape, seed, **kw) for r in range(size)]

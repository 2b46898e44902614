"""What PyTorch users run, on the backend "conflux" (issue #41 item 3): the session's process group
and the rule that every rank passes, skips or fails each test together.

Run under a launcher with 2 or 3 ranks: torchrun (`python -m torch.distributed.run --standalone
--nproc_per_node N -m pytest python/tests/torch2`) or cfxrun/mpirun (`tools/cfxrun -np N python
-m pytest python/tests/torch2`); CMake: python/tests/torch2/tests.cmake.

Every rank runs the same tests in the same order, so collectives line up; whether a test runs
never depends on the rank. After each test the ranks compare their outcomes over a gloo group
made beside the conflux one (independent of the backend under test): when one rank failed,
every rank fails with each rank's error, so the others do not go on into the next test's
collectives and hang there, and the report names what went wrong where.

CFX_TORCH2_BACKEND=gloo runs the same tests on torch's own gloo backend instead: a check of the
tests themselves (Conflux's DDP hooks skip there; what gloo lacks fails there).
"""
import datetime
import os
import traceback

import pytest
import torch
import torch.distributed as dist

import conflux.torch  # noqa: F401  (registers the backend "conflux")

BACKEND = os.environ.get("CFX_TORCH2_BACKEND", "conflux")
# A collective of the side group that waits this long for a rank fails instead of hanging.
_SIDE_TIMEOUT = datetime.timedelta(seconds=90)
_SIDE = None
# Why the conflux group can no longer be used (a collective that will never complete): later
# tests that need it fail at once, and the session ends without waiting for it at exit.
WEDGED = []


def side_group():
    """The gloo group of every rank, beside the conflux one: the ranks' agreement on outcomes,
    and the gloo runs some tests compare the conflux backend against."""
    return _SIDE


def init_method_for():
    """torchrun's env:// (its MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE: torch's default); under
    mpirun/cfxrun, which set none of them, Conflux's rendezvous "conflux://" (docs/python.md)."""
    return None if "MASTER_ADDR" in os.environ else "conflux://"


@pytest.fixture(scope="session", autouse=True)
def world():
    """The default group on "conflux", made as a user script does (init_method_for)."""
    global _SIDE
    torch.set_num_threads(1)
    dist.init_process_group(BACKEND, init_method=init_method_for(),
                            timeout=datetime.timedelta(seconds=120))
    if dist.get_world_size() < 2:
        pytest.exit("python/tests/torch2 needs 2 or more ranks (run it under torchrun or cfxrun)", 2)
    assert dist.get_backend() == BACKEND, dist.get_backend()
    _SIDE = dist.new_group(backend="gloo", timeout=_SIDE_TIMEOUT)
    yield
    _SIDE = None
    if not WEDGED:
        dist.destroy_process_group()


def pytest_configure(config):
    config.addinivalue_line("markers", "run_last: a test that can leave the group wedged when the "
                            "backend gets it wrong; run after all the others")


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.get_closest_marker("run_last") is not None)  # stable


def pytest_unconfigure(config):
    """After the summary: a wedged group would hang the exit (its pending work is waited for)."""
    if WEDGED:
        import sys
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


@pytest.fixture
def rank():
    return dist.get_rank()


@pytest.fixture
def size():
    return dist.get_world_size()


def _outcome(exc):
    if exc is None:
        return ("pass", "")
    if isinstance(exc, pytest.skip.Exception):
        return ("skip", str(exc.msg if hasattr(exc, "msg") else exc))
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return ("fail", text)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Runs the test, then all ranks agree on its outcome (see the module's docstring)."""
    exc = None
    try:
        result = yield
    except BaseException as e:  # noqa: B902  (pytest's Skipped and Failed are BaseExceptions)
        exc = e
        result = None
    side = side_group()
    if side is None or isinstance(exc, (KeyboardInterrupt, SystemExit)):
        if exc is not None:
            raise exc
        return result
    mine = _outcome(exc)
    outcomes = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, mine, group=side)
    failed = ["rank %d: %s" % (r, o[1]) for r, o in enumerate(outcomes) if o[0] == "fail"]
    kinds = {o[0] for o in outcomes}
    if failed:
        if exc is not None and mine[0] == "fail":
            # this rank's own traceback first; every rank's error in the note
            if hasattr(exc, "add_note"):
                exc.add_note("every rank's outcome:\n  " + "\n  ".join(failed))
            raise exc
        raise AssertionError("this rank passed, but other ranks failed:\n  " + "\n  ".join(failed))
    if kinds == {"skip"}:
        raise exc
    if len(kinds) > 1:
        raise AssertionError("the ranks disagree: %s" % (
            ", ".join("rank %d %s %s" % (r, o[0], o[1]) for r, o in enumerate(outcomes))))
    return result


def pytest_report_header(config):
    return "torch %s, rank %s of %s" % (torch.__version__, os.environ.get("RANK", os.environ.get(
        "OMPI_COMM_WORLD_RANK", "?")), os.environ.get("WORLD_SIZE", os.environ.get(
            "OMPI_COMM_WORLD_SIZE", "?")))

"""conflux.timeline / conflux.torch.timeline: the context manager over start_timeline and
stop_timeline (single process, size 1)."""
import json

import numpy as np
import pytest

import conflux


@pytest.fixture(autouse=True)
def initialized():
    conflux.init()
    yield


def read_events(path):
    with open(path) as f:
        return json.load(f)  # a truncated file (no closing bracket) fails here


def test_timeline_writes_a_complete_file_around_the_body(tmp_path):
    with conflux.timeline(str(tmp_path / "tl.json")) as value:
        assert value is None
        conflux.allreduce(np.ones(3, np.float32), name="unit.cm.body")
    events = read_events(tmp_path / "tl.rank0.json")
    assert "unit.cm.body" in json.dumps(events)
    # stopped: a collective after the block is not written
    conflux.allreduce(np.ones(3, np.float32), name="unit.cm.after")
    assert "unit.cm.after" not in json.dumps(read_events(tmp_path / "tl.rank0.json"))


def test_timeline_file_is_complete_when_the_body_raises(tmp_path):
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with conflux.timeline(str(tmp_path / "raised.json"), mark_cycles=True):
            conflux.allreduce(np.ones(2, np.float64), name="unit.cm.raised")
            raise Boom()
    assert "unit.cm.raised" in json.dumps(read_events(tmp_path / "raised.rank0.json"))
    # the timeline was stopped: a new one can start at once
    with conflux.timeline(str(tmp_path / "again.json")):
        pass
    read_events(tmp_path / "again.rank0.json")


def test_timeline_bad_path_raises_before_the_body_runs():
    ran = []
    with pytest.raises(ValueError, match="file_path"):
        with conflux.timeline(""):
            ran.append(1)
    assert ran == []


def test_timeline_is_exported_by_conflux_torch():
    cfx = pytest.importorskip("conflux.torch", reason="python3-torch is not installed")
    assert cfx.timeline is conflux.timeline
    assert "timeline" in cfx.__all__ and "timeline" in conflux.__all__

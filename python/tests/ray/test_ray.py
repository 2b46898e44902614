"""conflux.ray on a real Ray cluster of two nodes on this machine (conftest.py), in one pytest
session (Ray's start is most of the cost): RayExecutor at 2 and 4 workers across both nodes trains
a small torch model whose parameters equal a single-process reference; a worker that raises and an
actor that is killed each end run() with WorkerError naming the rank, its node and what happened;
Ray Train's TorchTrainer with TorchConfig(backend="conflux") at 2 workers against the reference;
elastic: a node whose worker failed leaves the world whole, a node removed shrinks the world and a
node added grows it, with the final parameters equal on every member and to the reference.

The tests run in this file's order: the last one removes the second node (and adds another)."""
import glob
import json
import os
import tempfile
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

import ray_jobs  # noqa: E402  (on sys.path and PYTHONPATH through conftest.py)
from conflux.ray import RayExecutor, RunEndedError, WorkerError  # noqa: E402

ATOL = 1e-5  # float32: the averaged gradients differ from the reference's in the last bits


def close(a, b):
    return all(np.allclose(np.array(x), np.array(y), rtol=0, atol=ATOL) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def reference():
    return ray_jobs.reference()


_EXECUTORS = {}


def executor(num_workers):
    """The module's executor of `num_workers` (started once, shared by the tests that follow;
    the test that breaks it shuts it down). 2 workers: Horovod's num_hosts=2,
    num_workers_per_host=1 (one bundle a host, STRICT_SPREAD); 4: num_workers=4 (PACK: the two
    nodes' 2 CPUs each)."""
    if num_workers not in _EXECUTORS:
        settings = RayExecutor.create_settings(timeout_s=60)
        ex = RayExecutor(settings, num_hosts=2, num_workers_per_host=1) if num_workers == 2 \
            else RayExecutor(settings, num_workers=num_workers)
        ex.start()
        _EXECUTORS[num_workers] = ex
    return _EXECUTORS[num_workers]


def done_with(num_workers):
    ex = _EXECUTORS.pop(num_workers, None)
    if ex is not None:
        ex.shutdown()


@pytest.fixture(scope="module", autouse=True)
def _shutdown_executors():
    yield
    for n in list(_EXECUTORS):
        done_with(n)


def check_training(ex, num_workers, reference):
    out = ex.run(ray_jobs.train_executor)
    assert [o["rank"] for o in out] == list(range(num_workers))  # results in rank order
    assert all(o["size"] == num_workers for o in out)
    nodes = [o["place"]["node"] for o in out]
    assert len(set(nodes)) == 2, "the workers did not span both nodes: %s" % nodes
    # Ranks grouped by node, local rank and size from the node each landed on.
    for r, o in enumerate(out):
        same = [i for i, n in enumerate(nodes) if n == nodes[r]]
        assert o["place"]["CFX_RANK"] == str(r)
        assert o["place"]["CFX_LOCAL_RANK"] == str(same.index(r))
        assert o["place"]["CFX_LOCAL_SIZE"] == str(len(same))
        assert o["place"]["HOROVOD_HOSTNAME"] == nodes[r]
    assert nodes == sorted(nodes, key=nodes.index)  # contiguous by node
    for o in out:
        assert close(o["params"], reference), "rank %d's parameters differ from the " \
            "single-process reference" % o["rank"]


def test_executor_2_workers_trains_like_one_process(ray_cluster, reference):
    check_training(executor(2), 2, reference)


def test_killed_actor_ends_run_with_its_name(ray_cluster):
    """A thread kills rank 1's actor while run() waits for the workers, which allreduce until
    their world ends: run() raises WorkerError naming rank 1, its node, and that it died."""
    ex = executor(2)
    ready = tempfile.mkdtemp(prefix="cfx-ray-ready-")
    killed = {}

    def kill_when_ready():
        deadline = time.monotonic() + 120
        while len(glob.glob(os.path.join(ready, "ready.*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        killed["at"] = time.monotonic()
        ray.kill(ex.workers[1])

    killer = threading.Thread(target=kill_when_ready, daemon=True)
    killer.start()
    try:
        with pytest.raises(WorkerError) as info:
            ex.run(ray_jobs.allreduce_forever, args=[ready])
        took = time.monotonic() - killed["at"]
        e = info.value
        assert e.rank == 1, str(e)
        assert "rank 1" in str(e) and "died" in str(e) and e.node_id[:12] in str(e), str(e)
        assert took < float(os.environ["CFX_TRANSPORT_TIMEOUT_S"]), \
            "run() ended %.1f s after the kill" % took
    finally:
        killer.join(timeout=5)
        done_with(2)  # a world with a dead member: this executor is done


def test_executor_4_workers_trains_like_one_process(ray_cluster, reference):
    check_training(executor(4), 4, reference)


def test_worker_exception_names_rank_and_message(ray_cluster):
    ex = executor(4)
    try:
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as info:
            ex.run(ray_jobs.raise_on, args=[2])
        took = time.monotonic() - t0
        e = info.value
        assert e.rank == 2 and isinstance(e.cause, ValueError)
        assert "rank 2" in str(e) and "ValueError: injected failure on rank 2" in str(e)
        assert e.node_id and ("Ray node %s" % e.node_id[:12]) in str(e)
        assert took < 30, "the error took %.1f s" % took
        # The failure ended the world on every worker at once (no stall); the executor goes on.
        assert ex.run(ray_jobs.rank_and_size) == [(r, 4) for r in range(4)]
        # Rank 1 comes to conflux.init() after the world ended (its task of the run started
        # late): it must not form a new world, which the next run's workers would join.
        with pytest.raises(WorkerError) as info:
            ex.run(ray_jobs.raise_on, args=[2, 1])
        e = info.value
        assert e.rank == 2 and isinstance(e.cause, ValueError), str(e)
        assert isinstance(getattr(e.errors.get(1), "cause", None), RunEndedError), str(e)
        assert "run" in str(e.errors[1].cause) and "failed on rank 2" in str(e.errors[1].cause)
        assert "still running" not in str(e), str(e)
        assert ex.run(ray_jobs.rank_and_size) == [(r, 4) for r in range(4)]
    finally:
        done_with(4)


def test_ray_train_torch_config_conflux(ray_cluster, reference):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    out = tempfile.mkdtemp(prefix="cfx-ray-train-")
    trainer = TorchTrainer(
        ray_jobs.train_loop_ray_train, train_loop_config={"out": out},
        scaling_config=ScalingConfig(num_workers=2, placement_strategy="SPREAD"),
        torch_config=TorchConfig(backend="conflux"),
        run_config=RunConfig(storage_path=tempfile.mkdtemp(prefix="cfx-ray-train-store-")))
    trainer.fit()
    ranks = []
    for path in sorted(glob.glob(os.path.join(out, "rank*.json"))):
        with open(path) as f:
            ranks.append(json.load(f))
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["backend"] == "conflux" and r["size"] == 2 and r["conflux"] == [r["rank"], 2]
        assert close(r["params"], reference), "Ray Train rank %d differs" % r["rank"]
    assert len({r["node"] for r in ranks}) == 2  # SPREAD: one worker on each node


def test_elastic_failed_worker_takes_its_node_out(ray_cluster):
    second = ray_cluster.second.node_id
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), min_workers=2, max_workers=4)
    ex.start()
    events = tempfile.mkdtemp(prefix="cfx-ray-elastic-")
    try:
        out = ex.run(ray_jobs.elastic_train, args=[events, {"raise": second}])
        sizes = ex.adapter.world_sizes
    finally:
        ex.shutdown()
    want = ray_jobs.elastic_reference()
    # 4 workers, one of the second node's fails: the node leaves whole (Horovod's 4, 2, 2).
    assert sizes == [4, 2], sizes
    assert len(out) == 2 and [o["rank"] for o in out] == [0, 1]
    for o in out:
        assert o["sizes"] == [4, 2]
        assert np.allclose(o["w"], want, rtol=0, atol=1e-9)


def test_elastic_node_removed_then_added(ray_cluster):
    """The second node's raylet goes away mid-training (the world shrinks to the head's two
    workers, from the last commit), then a new node joins (newcomers come in at a commit)."""
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), min_workers=2, max_workers=4)
    ex.start()
    events = tempfile.mkdtemp(prefix="cfx-ray-elastic-")
    result = {}

    def run():
        try:
            result["out"] = ex.run(ray_jobs.elastic_train, args=[events, {"remove": True,
                                                                          "grow_to": 4}])
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            result["error"] = e

    job = threading.Thread(target=run)
    job.start()
    try:
        # Ray's cluster changes only from the main thread (signal handlers).
        deadline = time.monotonic() + 180
        def state():
            job_state = getattr(ex.adapter, "job", None)
            return "%s; driver: %s" % (result, job_state.describe() if job_state else "-")
        while not os.path.exists(os.path.join(events, "remove_now")):
            assert time.monotonic() < deadline and job.is_alive(), state()
            time.sleep(0.05)
        ray_cluster.remove_node(ray_cluster.second)
        open(os.path.join(events, "removed"), "w").close()
        while not os.path.exists(os.path.join(events, "add_now")):
            assert time.monotonic() < deadline and job.is_alive(), state()
            time.sleep(0.05)
        ray_cluster.second = ray_cluster.add_node()
        job.join(timeout=max(1, deadline - time.monotonic()))
        assert not job.is_alive(), "the elastic job did not end: " + state()
    finally:
        job.join(timeout=60)
        sizes = ex.adapter.world_sizes
        ex.shutdown()
    if "error" in result:
        raise result["error"]
    want = ray_jobs.elastic_reference()
    # 4, then the head's 2 from the last commit, then 4 again: both newcomers in one round (the
    # workers wait for both hellos), or one round each where the second came late.
    assert sizes[:2] == [4, 2] and sizes[-1] == 4 and sizes[1:] == sorted(sizes[1:]), sizes
    out = result["out"]
    assert [o["rank"] for o in out] == [0, 1, 2, 3]
    for o in out:
        assert np.allclose(o["w"], want, rtol=0, atol=1e-9), o
    assert all(o["w"] == out[0]["w"] for o in out)  # equal on every member, bit for bit

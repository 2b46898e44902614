"""conflux.spark.run and PySpark's TorchDistributor on the backend "conflux", on the standalone
cluster of conftest.py (one application with four single-core executors, two per worker).

- conflux.spark.run at 2 and 4 ranks trains linear regression (numpy, conflux's allreduce) to the
  weights of the same steps run here in one process, bit for bit; every rank sees its world in
  CFX_* and in the engine, and the environment passed in.
- a rank that raises ends the run with TaskFailedError naming the rank, the exception and its
  traceback, within seconds (the other rank waits in a collective for it); so does a rank whose
  process dies;
- TorchDistributor(num_processes=2, use_gpu=False) on the cluster and in local mode trains DDP on
  the backend "conflux" to the parameters of a local model trained on the ranks' batches together;
- a lost executor (a rank SIGKILLs its own executor JVM) ends the run with TaskFailedError naming
  that rank as lost, not a hang (last: the cluster then starts a new executor).
"""
import inspect
import os
import sys
import time

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed")
from pyspark import cloudpickle  # noqa: E402  (pyspark's own, which pickles the tasks)

import conflux.spark  # noqa: E402
import spark_jobs  # noqa: E402
from conftest import JVM_FLAGS  # noqa: E402

cloudpickle.register_pickle_by_value(spark_jobs)

EXECUTORS = 4


def _executors(sc):
    return sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # without the driver


def wait_for_executors(sc, n, timeout_s=180):
    deadline = time.monotonic() + timeout_s
    while _executors(sc) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {_executors(sc)} of {n} executors registered in "
                               f"{timeout_s} s")
        time.sleep(0.25)


@pytest.fixture(scope="module")
def spark(cluster):
    from pyspark.sql import SparkSession

    os.environ.update(JAVA_HOME=cluster.env["JAVA_HOME"], SPARK_LOCAL_IP="127.0.0.1",
                      PYSPARK_PYTHON=sys.executable)
    session = (SparkSession.builder.master(cluster.url).appName("conflux.spark tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.memory", "512m")
               .config("spark.executor.cores", "1")
               .config("spark.cores.max", str(EXECUTORS))
               .config("spark.executor.memory", "512m")
               .config("spark.driver.extraJavaOptions", " ".join(JVM_FLAGS))
               .config("spark.executor.extraJavaOptions", " ".join(JVM_FLAGS))
               .config("spark.pyspark.python", sys.executable)
               .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
               .config("spark.executorEnv.OMP_NUM_THREADS", "1")
               .config("spark.executorEnv.CFX_STALL_TIMEOUT_S", "60")
               .getOrCreate())
    try:
        wait_for_executors(session.sparkContext, EXECUTORS)
        yield session
    finally:
        session.stop()


def test_horovod_signature():
    import conflux.horovod.spark as hvd_spark

    assert hvd_spark.run is conflux.spark.run
    # horovod.spark.run's parameters, in its order (horovod/spark/runner.py, 0.28)
    assert list(inspect.signature(conflux.spark.run).parameters) == [
        "fn", "args", "kwargs", "num_proc", "start_timeout", "use_mpi", "use_gloo",
        "extra_mpi_args", "env", "stdout", "stderr", "verbose", "nics",
        "prefix_output_with_timestamp", "executable"]


@pytest.mark.parametrize("num_proc", [2, 4])
def test_run_trains_like_local(spark, num_proc):
    steps = 30
    results = conflux.spark.run(spark_jobs.linreg, args=(steps,), num_proc=num_proc,
                                env={"CONFLUX_TEST_ENV": "passed in"}, start_timeout=120)
    assert [r["rank"] for r in results] == list(range(num_proc))
    hosts = [r["host"] for r in results]
    for r in results:
        local = [q for q, h in enumerate(hosts) if h == r["host"]]
        assert r["size"] == num_proc
        assert (r["local_rank"], r["local_size"]) == (local.index(r["rank"]), len(local))
        assert r["env"]["CFX_RANK"] == str(r["rank"]) and r["env"]["CFX_SIZE"] == str(num_proc)
        assert r["env"]["CFX_LOCAL_RANK"] == str(r["local_rank"])
        assert r["env"]["CFX_LOCAL_SIZE"] == str(r["local_size"])
        assert r["env"]["CONFLUX_TEST_ENV"] == "passed in"
    assert len({r["pid"] for r in results}) == num_proc          # a process per rank
    reference = spark_jobs.linreg_reference(num_proc, steps).tolist()
    for r in results:
        assert r["weights"] == reference, f"rank {r['rank']}'s weights differ from the reference"
        assert r["last_loss"] < r["first_loss"] / 10


def test_output_forwarded(spark):
    import io

    out = io.StringIO()
    results = conflux.spark.run(print, args=("hello from a task",), num_proc=2, stdout=out)
    assert results == [None, None]
    lines = sorted(out.getvalue().splitlines())
    assert lines == ["[0]<stdout>:hello from a task", "[1]<stdout>:hello from a task"]


def test_task_exception_names_rank(spark):
    start = time.monotonic()
    with pytest.raises(conflux.spark.TaskFailedError) as info:
        conflux.spark.run(spark_jobs.raise_on, args=(1, "bad shard on rank 1"), num_proc=2,
                          start_timeout=120)
    elapsed = time.monotonic() - start
    text = str(info.value)
    assert info.value.rank == 1
    assert "rank 1 (host" in text and "raised ValueError: bad shard on rank 1" in text, text
    assert "raise ValueError(message)" in text, text           # rank 1's traceback
    assert elapsed < 60, f"the run took {elapsed:.0f} s to fail"
    # the executors are fine: the next run works
    assert conflux.spark.run(os.getpid, num_proc=2) is not None


def test_rank_process_that_dies(spark):
    with pytest.raises(conflux.spark.TaskFailedError) as info:
        conflux.spark.run(spark_jobs.die_on, args=(1,), num_proc=2, start_timeout=120)
    text = str(info.value)
    assert info.value.rank == 1, text
    assert "rank 1 (host" in text and "died: its process died of signal 9 (SIGKILL)" in text, text


def test_torch_distributor_on_cluster(spark):
    from pyspark.ml.torch.distributor import TorchDistributor

    out = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        spark_jobs.ddp_train, 8, 0.1)
    _check_ddp(out)


def test_torch_distributor_local(spark):
    from pyspark.ml.torch.distributor import TorchDistributor

    out = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(
        spark_jobs.ddp_train, 8, 0.1)
    _check_ddp(out)


def _check_ddp(out):
    import torch

    # TorchDistributor returns one rank's result: rank 0's task's on the cluster; in local mode
    # whichever process wrote its output file last
    assert out["rank"] in (0, 1)
    assert (out["size"], out["backend"], out["engine_size"]) == (2, "conflux", 2)
    assert out["states"][0] == out["states"][1], "the ranks' parameters differ"
    reference = spark_jobs.ddp_reference(2, 8, 0.1)
    for name, value in reference.items():
        torch.testing.assert_close(torch.tensor(out["states"][0][name]), torch.tensor(value),
                                   rtol=1e-5, atol=1e-6, msg=f"parameter {name}")


def test_start_timeout(spark):
    """More ranks than task slots: a barrier stage cannot start; start_timeout says why."""
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"0 of 5 started.*5 free task slots"):
        conflux.spark.run(os.getpid, num_proc=EXECUTORS + 1, start_timeout=5)
    assert time.monotonic() - start < 60


def test_lost_executor_fails_run(spark):
    """Last: the killed executor is replaced by the cluster, which takes a while."""
    start = time.monotonic()
    with pytest.raises(conflux.spark.TaskFailedError) as info:
        conflux.spark.run(spark_jobs.kill_executor_on, args=(1,), num_proc=2, start_timeout=120)
    elapsed = time.monotonic() - start
    text = str(info.value)
    assert info.value.rank == 1, text
    assert "rank 1 (host" in text and "was lost" in text, text
    assert elapsed < 60, f"the run took {elapsed:.0f} s to fail"

"""conflux.spark: a Conflux job in the tasks of one Spark barrier stage (horovod.spark.run).

    import conflux.spark

    def train(lr):
        import conflux
        conflux.init()                      # rank, size and the meeting place come from the task
        ...
        return weights                      # back to the driver, in rank order

    weights = conflux.spark.run(train, args=(0.1,), num_proc=4)

`run` starts `num_proc` tasks as ONE barrier stage (`rdd.barrier().mapPartitions`), so they all
start together or none does, and serves the engine's TCP rendezvous store on the driver. Each task
learns where the others landed (`BarrierTaskContext.allGather` of host names), sets CFX_RANK,
CFX_SIZE, CFX_LOCAL_RANK, CFX_LOCAL_SIZE, CFX_RENDEZVOUS_ADDR (the driver's store),
CFX_RENDEZVOUS_EXTERNAL=1 and CFX_TRANSPORT=gloo, and calls `fn(*args, **kwargs)` in a Python
process of the rank's own, started by the task (as Horovod's tasks start theirs), so
`conflux.init()`, `conflux.horovod.torch.init()` and `dist.init_process_group("conflux",
init_method="conflux://")` join that world. Results come back in rank order. docs/spark.md has
the rest.

Failures: an exception in `fn` raises `TaskFailedError` on the driver naming the rank that failed
first, its exception and traceback (and what the other ranks raised after it); so does a rank's
process that died (a signal, os._exit). A task whose Python worker or executor died (its
connection to the driver's store ends without a result, or Spark says so) fails the run the same
way, naming the rank that was lost; so does a barrier stage that Spark had to attempt again.
Either way the driver cancels the stage after a short grace period rather than wait for the
survivors' collectives to time out. Tasks that do not all start within `start_timeout` (a barrier
stage needs `num_proc` free task slots at once) raise `TimeoutError`.
"""
import functools
import itertools
import json
import logging
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from ._store import StoreClient, StoreServer

__all__ = ["run", "TaskFailedError"]

_LOG = logging.getLogger("conflux.spark")
_KEYS = "spark/"          # the launcher's own keys in the store (the engine's are world1/, ...)
_FAILURE_GRACE_S = 3.0    # after the first failure: time for the other ranks to report theirs
_job_ids = itertools.count(1)


class TaskFailedError(RuntimeError):
    """A rank of `conflux.spark.run` raised, or its Spark task was lost.

    `rank`: the rank that failed first; `failures`: every failure in the order the driver learned
    of it, as dicts with "rank", "kind" ("raised", "died" or "lost"), "type", "message",
    "traceback" and "host".
    """

    def __init__(self, message, rank, failures):
        super().__init__(message)
        self.rank = rank
        self.failures = failures


# ---- the task side: runs in each barrier task's Python worker -----------------------------------

def _relay(src, dst, keep):
    """Copies the rank's output to the worker's stream (the executor's log) line by line, keeping
    (time, line) pairs when `keep` is a list."""
    for raw in iter(src.readline, b""):
        line = raw.decode(errors="replace")
        try:
            dst.write(line)
            dst.flush()
        except (OSError, ValueError):
            pass
        if keep is not None:
            keep.append((time.time(), line.rstrip("\n")))
    src.close()


def _how_it_ended(code):
    if code < 0:
        try:
            return f"its process died of signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"its process died of signal {-code}"
    return f"its process exited with code {code} without a result"


def _task(spec, _iterator):
    """One barrier task: meet the others, run fn as this rank in a process of its own, report.

    A process per rank, as Horovod's tasks start one: the engine gives every world a process
    joins a key space of its own (world1/, world2/, ...), so ranks in Python workers Spark reused
    for a second job would look for each other in different spaces; a fresh process also leaves
    nothing of fn behind in the worker, and a crash in fn is reported instead of killing it."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    size = spec["num_proc"]
    store_host, store_port = spec["store"]
    client = StoreClient(store_host, store_port)
    if client.check(f"{_KEYS}started/{rank}"):
        # Spark runs a failed barrier stage again; a training job is not restarted behind the
        # driver's back (the driver reports what failed the first attempt).
        client.close()
        return [(rank, "retry", None, None)]
    hostname = socket.gethostname()
    try:
        address = ctx.getTaskInfos()[rank].address
    except Exception:  # noqa: BLE001
        address = ""
    client.set(f"{_KEYS}started/{rank}",
               json.dumps({"host": hostname, "pid": os.getpid(), "executor": address}))
    hosts = ctx.allGather(hostname)
    local = [r for r, h in enumerate(hosts) if h == hostname]
    env = dict(os.environ)
    env.update(spec["env"] or {})
    env.update({
        "CFX_RANK": str(rank), "CFX_SIZE": str(size),
        "CFX_LOCAL_RANK": str(local.index(rank)), "CFX_LOCAL_SIZE": str(len(local)),
        "CFX_RENDEZVOUS_ADDR": f"{store_host}:{store_port}", "CFX_RENDEZVOUS_EXTERNAL": "1",
        "CFX_TRANSPORT": "gloo",
    })
    # what the worker imports from (files added with addPyFile are on its sys.path only)
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    kept = ([], []) if spec["capture"] else (None, None)
    try:
        with tempfile.TemporaryDirectory(prefix="conflux-spark-") as tmp:
            job, result = os.path.join(tmp, "fn.pickle"), os.path.join(tmp, "result.pickle")
            with open(job, "wb") as f:
                f.write(spec["payload"])
            proc = subprocess.Popen([sys.executable, "-m", "conflux._spark_rank", job, result,
                                     str(os.getpid())],
                                    env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
            relays = [threading.Thread(target=_relay, args=(proc.stdout, sys.stdout, kept[0]),
                                       daemon=True),
                      threading.Thread(target=_relay, args=(proc.stderr, sys.stderr, kept[1]),
                                       daemon=True)]
            for t in relays:
                t.start()
            reported = False
            while True:
                code = proc.poll()
                if not reported and os.path.exists(result):
                    # fn has returned or raised: report a failure at once, before the process
                    # has shut the engine down (the other ranks may be waiting on this one)
                    with open(result, "rb") as f:
                        status, payload = pickle.loads(f.read())
                    if status == "error":
                        failure = dict(payload, host=hostname)
                        client.set(f"{_KEYS}failed/{rank}", json.dumps(failure))
                    reported, ended_at = True, time.monotonic()
                if code is not None:
                    break
                if reported and time.monotonic() - ended_at > 60:
                    proc.kill()  # fn is done; its process hangs on the way out
                time.sleep(0.05)
            for t in relays:
                t.join(10)
            if not reported:
                failure = {"type": None, "message": _how_it_ended(code), "traceback": "",
                           "host": hostname, "kind": "died"}
                client.set(f"{_KEYS}failed/{rank}", json.dumps(failure))
                outcome = (rank, "error", failure)
            elif status == "error":
                outcome = (rank, "error", failure)
            else:
                outcome = (rank, "ok", payload)  # fn's result, pickled (the driver unpickles it)
    finally:
        try:
            client.set(f"{_KEYS}done/{rank}", b"")
        finally:
            client.close()
    return [outcome + (kept if spec["capture"] else None,)]


# ---- the driver side ----------------------------------------------------------------------------

class _Watch:
    """What the driver's store saw of the tasks: which started, finished, failed or were lost."""

    def __init__(self):
        self.lock = threading.Lock()
        self.started = {}      # rank -> info
        self.done = set()
        self.events = []       # failures in the order they arrived (dicts, as TaskFailedError's)
        self._conn_rank = {}   # store connection -> the rank whose launcher set its keys on it

    def on_set(self, key, value, conn):
        if not key.startswith(_KEYS):
            return
        kind, _, r = key[len(_KEYS):].partition("/")
        rank = int(r)
        with self.lock:
            if kind == "started":
                self.started[rank] = json.loads(value)
                self._conn_rank[conn] = rank
            elif kind == "failed":
                event = dict({"kind": "raised"}, **json.loads(value), rank=rank)
                self.events.append(event)
            elif kind == "done":
                self.done.add(rank)

    def on_close(self, conn):
        with self.lock:
            rank = self._conn_rank.pop(conn, None)
            if rank is not None and rank not in self.done:
                info = self.started.get(rank, {})
                self.events.append({
                    "rank": rank, "kind": "lost", "type": None, "traceback": "",
                    "host": info.get("host", "?"),
                    "message": "its Spark task ended without a result: its Python worker or "
                               f"executor ({info.get('executor') or 'unknown'}) died"})


def _describe(event):
    where = f"rank {event['rank']} (host {event.get('host', '?')})"
    if event["kind"] == "lost":
        return f"{where} was lost: {event['message']}"
    if event["kind"] == "died":
        return f"{where} died: {event['message']}"
    return f"{where} raised {event['type']}: {event['message']}"


# What a rank raises because another rank failed: the rank that failed is named first.
_CONSEQUENCES = {"PeerLostError", "ShutDownError", "StallError", "TransportError"}


def _failure(events):
    events = sorted(events, key=lambda e: e["kind"] == "raised" and e["type"] in _CONSEQUENCES)
    first = events[0]
    text = "conflux.spark.run: " + _describe(first)
    later = [e for e in events[1:] if e["rank"] != first["rank"]]
    if later:
        text += "; after it, " + "; ".join(_describe(e).splitlines()[0][:300] for e in later)
    if first.get("traceback"):
        text += f"\n\nrank {first['rank']}'s traceback:\n{first['traceback']}"
    return TaskFailedError(text, first["rank"], events)


def _stage_failed(sc, group):
    """A description when Spark already failed a task of the job's barrier stage, else None."""
    try:
        tracker = sc.statusTracker()
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in (job.stageIds if job else ()):
                stage = tracker.getStageInfo(stage_id)
                if stage and (stage.currentAttemptId > 0 or stage.numFailedTasks > 0):
                    return (f"Spark failed {stage.numFailedTasks} task(s) of the barrier stage "
                            f"(stage {stage_id}, attempt {stage.currentAttemptId}): a task or its "
                            "executor was lost; the executors' logs say why")
    except Exception:  # noqa: BLE001  (a status query that fails says nothing)
        return None
    return None


def _spark_failure(error):
    """The error for a Spark job that failed with no task's report: TaskFailedError when Spark's
    message names the barrier task (its partition is the rank), else RuntimeError."""
    try:
        text = error.java_exception.getMessage()   # a Py4JJavaError: the SparkException's text
    except Exception:  # noqa: BLE001
        text = str(error)
    text = (text or str(error)).split("\n\tat ")[0].strip()[:2000]
    m = re.search(r"barrier task ResultTask\(\d+, (\d+)\) finished unsuccessfully\.\s*(.+)", text)
    if m:
        rank, reason = int(m.group(1)), m.group(2).strip().splitlines()[0]
        lost = "ExecutorLost" in reason
        event = {"rank": rank, "kind": "lost" if lost else "died", "type": None, "traceback": "",
                 "host": "?", "message": f"Spark says: {reason}"}
        return TaskFailedError(f"conflux.spark.run: {_describe(event)}", rank, [event])
    return RuntimeError(f"conflux.spark.run: the Spark job failed: {text}")


def _forward_output(results, stdout, stderr, stamp):
    for rank, _, _, output in results:
        if not output:
            continue
        for stream, tag, lines in ((stdout, "stdout", output[0]), (stderr, "stderr", output[1])):
            if stream is None:
                continue
            for t, line in lines:
                when = time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(t)) if stamp else ""
                stream.write(f"{when}[{rank}]<{tag}>:{line}\n")
            stream.flush()


def run(fn, args=(), kwargs={}, num_proc=None, start_timeout=None, use_mpi=None, use_gloo=None,
        extra_mpi_args=None, env=None, stdout=None, stderr=None, verbose=1, nics=None,
        prefix_output_with_timestamp=False, executable=None):
    """Runs `fn(*args, **kwargs)` in `num_proc` tasks of one Spark barrier stage as the ranks of a
    Conflux job, and returns the list of their results in rank order (Horovod's
    `horovod.spark.run`, same signature).

    num_proc: tasks (ranks); default `spark.default.parallelism`. The cluster needs that many
    free task slots at once.
    start_timeout: seconds for every task to start (default $CONFLUX_SPARK_START_TIMEOUT, then
    $HOROVOD_SPARK_START_TIMEOUT, then 600); past it the stage is cancelled and TimeoutError raised.
    env: variables set in each task while `fn` runs (the world's CFX_* variables win).
    stdout, stderr: streams on the driver that get what `fn` printed (sys.stdout / sys.stderr in
    Python), each line prefixed "[rank]<stdout>:", once the run ended; prefix_output_with_timestamp
    adds the time it was printed. Output always goes to the executors' logs too.
    verbose: 0 quiet, 1 the driver logs the run's progress (logging, INFO), 2 also the engine
    (CFX_LOG_LEVEL=info in the tasks unless env sets it).
    use_mpi, extra_mpi_args, executable: Horovod starts processes with mpirun or an executable;
    here `fn` runs in the Spark tasks themselves over Gloo, so use_mpi=True, extra_mpi_args and
    executable are refused (ValueError). use_gloo and nics are accepted and ignored (the engine
    finds the interface from the host names).

    Raises TaskFailedError (a rank raised or was lost; the message names the rank, its exception
    and traceback), TimeoutError (tasks did not start) or RuntimeError (no active SparkContext; the
    Spark job failed otherwise).
    """
    if use_mpi:
        raise ValueError("conflux.spark.run: use_mpi=True: fn runs in the Spark tasks themselves "
                         "and the ranks meet over Gloo; there is no mpirun")
    if extra_mpi_args:
        raise ValueError("conflux.spark.run: extra_mpi_args: there is no mpirun (the ranks are "
                         "the Spark tasks)")
    if executable is not None:
        raise ValueError("conflux.spark.run: executable: fn runs in each task's Python worker "
                         "(PYSPARK_PYTHON), not in a process of its own")
    del use_gloo, nics  # the transport is Gloo; its interface follows the host names
    from pyspark import InheritableThread, SparkContext, cloudpickle

    sc = SparkContext._active_spark_context  # Horovod's check: never start a context here
    if sc is None:
        raise RuntimeError("conflux.spark.run: no active SparkContext: start a SparkSession (or "
                           "SparkContext) first")
    if num_proc is None:
        num_proc = sc.defaultParallelism
    if not isinstance(num_proc, int) or num_proc < 1:
        raise ValueError(f"conflux.spark.run: num_proc must be a positive integer, not "
                         f"{num_proc!r}")
    if start_timeout is None:
        start_timeout = float(os.environ.get("CONFLUX_SPARK_START_TIMEOUT")
                              or os.environ.get("HOROVOD_SPARK_START_TIMEOUT") or 600)
    task_env = dict(env or {})
    if verbose >= 2:
        task_env.setdefault("CFX_LOG_LEVEL", "info")

    watch = _Watch()
    server = StoreServer(int(os.environ.get("CFX_RENDEZVOUS_PORT", "0") or 0),
                         on_set=watch.on_set, on_close=watch.on_close)
    host = (os.environ.get("CFX_RENDEZVOUS_HOST") or sc.getConf().get("spark.driver.host")
            or socket.gethostname())
    spec = {"payload": cloudpickle.dumps((fn, tuple(args), dict(kwargs))), "num_proc": num_proc,
            "env": task_env, "store": (host, server.port),
            "capture": stdout is not None or stderr is not None}
    group = f"conflux.spark.run.{os.getpid()}.{next(_job_ids)}"
    box = {}

    def spark_job():
        try:
            sc.setJobGroup(group, f"conflux.spark.run: {num_proc} ranks", interruptOnCancel=True)
            rdd = sc.parallelize(range(num_proc), num_proc).barrier()
            box["results"] = rdd.mapPartitions(functools.partial(_task, spec)).collect()
        except BaseException as e:  # noqa: BLE001  (handed to the caller's thread)
            box["error"] = e

    def events():
        with watch.lock:
            return len(watch.started), len(watch.done), list(watch.events)

    if verbose >= 1:
        _LOG.info("conflux.spark.run: %d ranks, meeting at the driver's store %s:%d", num_proc,
                  host, server.port)
    job = InheritableThread(target=spark_job, name="conflux-spark-job", daemon=True)
    started_at = time.monotonic()
    job.start()
    cause = None       # why the driver cancelled the stage
    first_bad = None   # when the first failure reached the driver's store
    spark_failed = None  # (when, what) Spark failed a task of the stage itself
    last_check = started_at
    try:
        while job.is_alive():
            job.join(0.05)
            now = time.monotonic()
            n_started, n_done, seen = events()
            if seen and first_bad is None:
                first_bad = now
            if first_bad is not None and n_done < num_proc and now - first_bad > _FAILURE_GRACE_S:
                cause = _failure(seen)
                break
            if n_started < num_proc and now - started_at > start_timeout:
                cause = TimeoutError(
                    f"conflux.spark.run: timed out after {start_timeout:g} s waiting for the Spark "
                    f"tasks to start: {n_started} of {num_proc} started. A barrier stage starts "
                    f"all its tasks at once, so the cluster needs {num_proc} free task slots; "
                    "give it more executors or cores, or raise start_timeout")
                break
            if first_bad is None and spark_failed is None and now - last_check > 2.0:
                last_check = now
                failed = _stage_failed(sc, group)
                if failed:
                    spark_failed = (now, failed)
            if first_bad is None and spark_failed and now - spark_failed[0] > _FAILURE_GRACE_S:
                cause = RuntimeError(f"conflux.spark.run: {spark_failed[1]}")
                break
        if cause is None and "error" in box:
            # Spark failed the stage: what the tasks reported says more, and may still be arriving
            deadline = time.monotonic() + _FAILURE_GRACE_S
            while not events()[2] and time.monotonic() < deadline:
                time.sleep(0.05)
    except BaseException:
        sc.cancelJobGroup(group)
        raise
    finally:
        if job.is_alive():
            sc.cancelJobGroup(group)
            # Spark kills the tasks within seconds. A job that never started (a barrier stage
            # Spark keeps waiting to find slots for) is not yet cancellable: it is left to Spark.
            job.join(30)
            if job.is_alive():
                _LOG.warning("conflux.spark.run: the Spark job group %s did not end after it was "
                             "cancelled; it is left to Spark", group)
        server.close()
    if cause is not None:
        raise cause
    if "error" in box:
        seen = events()[2]
        if seen:
            raise _failure(seen) from box["error"]
        raise _spark_failure(box["error"]) from box["error"]
    results = sorted(box["results"], key=lambda r: r[0])
    _forward_output(results, stdout, stderr, bool(prefix_output_with_timestamp))
    errors = [r for r in results if r[1] == "error"]
    if errors:
        seen = events()[2]
        known = {e["rank"] for e in seen}
        seen += [dict({"kind": "raised"}, **r[2], rank=r[0]) for r in errors if r[0] not in known]
        raise _failure(seen)
    if any(r[1] == "retry" for r in results):
        raise RuntimeError("conflux.spark.run: Spark ran the barrier stage again after its first "
                           "attempt failed (a task or executor was lost); a Conflux job is not "
                           "restarted: the executors' logs say what failed")
    return [pickle.loads(r[2]) for r in results]

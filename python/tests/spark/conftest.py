"""A real Spark standalone cluster on this machine for the conflux.spark tests: one master and two
workers (pyspark's jars on Debian's JDK 17), started once per test session and stopped at its end.

Each daemon is a JVM started as `java -cp <pyspark>/jars/* org.apache.spark.deploy.master.Master`
(or `...worker.Worker`), which is what pyspark's `bin/spark-class` runs after its launcher, on
127.0.0.1 (SPARK_LOCAL_IP), with its own process group so that stopping it also stops the
executors and Python workers it started. Master and worker web UIs cannot be turned off: they get
a free port (0); the applications' UIs are off. Each worker offers 2 cores (more than the machine
has, so that 4 single-core executors fit) and 2 GiB to executors.

Environment (set by python/tests/spark/tests.cmake): JAVA_HOME (Debian's JDK 17), PYTHONPATH
(the build's conflux package), CFX_SPARK_TMP (where the cluster's logs and work folders go; kept
after a failed run), and for the JVM trainer CFX_SPARK_CONFLUX_JAR, CFX_SPARK_TRAINER_JAR,
CFX_SPARK_NATIVE_LIBS.
"""
import ctypes
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed")

SPARK_HOME = os.path.dirname(os.path.abspath(pyspark.__file__))
JAVA_HOME = os.environ.get("JAVA_HOME") or "/usr/lib/jvm/default-java"
START_TIMEOUT_S = 120
# Every JVM of the tests (daemons, drivers, executors) is short-lived on few cores: the serial
# collector and the client compiler alone start faster and leave the cores to the work.
JVM_FLAGS = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]


def _java():
    java = os.path.join(JAVA_HOME, "bin", "java")
    if not os.access(java, os.X_OK):
        pytest.skip(f"no Java at {java} (set JAVA_HOME to a JDK 17)")
    return java


def _own_group_dying_with_parent():
    """A daemon's session of its own (stop() signals the group: its executors and their Python
    workers too) that gets SIGTERM when this test process dies (a ctest timeout kills it)."""
    os.setsid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _tail(path, n=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


class Cluster:
    """The master and workers, their logs under `root`."""

    def __init__(self, root, workers=2, cores=2, memory="2g"):
        self.root = root
        self.procs = []   # (name, Popen, log path)
        self.url = None
        self.env = dict(os.environ, JAVA_HOME=JAVA_HOME, SPARK_HOME=SPARK_HOME,
                        SPARK_LOCAL_IP="127.0.0.1", SPARK_LOCAL_HOSTNAME="127.0.0.1",
                        SPARK_LOCAL_DIRS=os.path.join(root, "local"),
                        PYSPARK_PYTHON=sys.executable)
        self.env.pop("SPARK_CONF_DIR", None)
        # What bin/load-spark-env.sh sets for spark-class: the worker's launcher needs it to build
        # the executors' command line.
        scala = glob.glob(os.path.join(SPARK_HOME, "jars", "scala-library-*.jar"))
        m = re.search(r"scala-library-(\d+\.\d+)", scala[0]) if scala else None
        self.env.setdefault("SPARK_SCALA_VERSION", m.group(1) if m else "2.13")
        self.workers, self.cores, self.memory = workers, cores, memory

    def _start(self, name, main, *args):
        log = os.path.join(self.root, f"{name}.log")
        cmd = [_java(), "-cp", os.path.join(SPARK_HOME, "jars", "*"), "-Xmx256m", *JVM_FLAGS,
               "-Dspark.master.rest.enabled=false", main, *args]
        with open(log, "wb") as out:
            p = subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, preexec_fn=_own_group_dying_with_parent)
        self.procs.append((name, p, log))
        return log

    def _wait_for(self, log, pattern, what):
        deadline = time.monotonic() + START_TIMEOUT_S
        rx = re.compile(pattern)
        while time.monotonic() < deadline:
            m = rx.search(_tail(log, 400))
            if m:
                return m
            for name, p, path in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"the Spark {name} exited ({p.returncode}) before {what}:\n"
                                       + _tail(path))
            time.sleep(0.2)
        raise RuntimeError(f"{what}: not within {START_TIMEOUT_S} s; the log ends:\n{_tail(log)}")

    def start(self):
        os.makedirs(self.env["SPARK_LOCAL_DIRS"], exist_ok=True)
        log = self._start("master", "org.apache.spark.deploy.master.Master",
                          "--host", "127.0.0.1", "--port", "0", "--webui-port", "0")
        m = self._wait_for(log, r"Starting Spark master at (spark://\S+)", "the master started")
        self.url = m.group(1)
        logs = []
        for i in range(self.workers):
            work = os.path.join(self.root, f"worker{i}")
            os.makedirs(work, exist_ok=True)
            logs.append(self._start(f"worker{i}", "org.apache.spark.deploy.worker.Worker",
                                    "--host", "127.0.0.1", "--cores", str(self.cores),
                                    "--memory", self.memory, "--webui-port", "0",
                                    "--work-dir", work, self.url))
        for log in logs:
            self._wait_for(log, r"Successfully registered with master", "a worker registered")
        return self

    def stop(self):
        """Workers first (their executors and Python workers are in their process groups)."""
        for name, p, _ in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 20
        for name, p, _ in reversed(self.procs):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)  # whatever of the group is left
            except ProcessLookupError:
                pass
            p.wait()

    def executor_logs(self):
        """Every executor's stderr (the tasks' output and errors), for failure messages."""
        return sorted(glob.glob(os.path.join(self.root, "worker*", "app-*", "*", "stderr")))


@pytest.fixture(scope="session")
def cluster(request):
    parent = os.environ.get("CFX_SPARK_TMP")
    if parent:
        os.makedirs(parent, exist_ok=True)
    root = tempfile.mkdtemp(prefix="spark-cluster-", dir=parent)
    c = Cluster(root)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        if request.session.testsfailed:
            print(f"\nthe Spark cluster's logs are in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)

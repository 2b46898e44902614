"""The JVM trainer (examples/spark/SparkLinearRegression.java) submitted to the standalone cluster
of conftest.py with spark-submit: linear regression in plain Java arrays, one shard per task of a
barrier stage, gradients summed through an org.conflux.GradientSet, ranks meeting through a
TcpStore that rank 0's task serves (its port from BarrierTaskContext.allGather).

At 2 tasks the binding reaches the executors as `--jars conflux.jar` with the native libraries as
`--files` (and `spark.executor.extraLibraryPath=.`, where the executors put them); at 4 tasks as one
jar carrying the native libraries in the Maven jar's layout (org/conflux/native/linux-x86_64/, which
NativeLoader extracts). Every task's final weights must be bit-identical, and equal bit for bit to
the same steps computed in one JVM (`--local N`, no Spark, no Conflux), and the loss must fall.
"""
import os
import re
import shutil
import subprocess
import zipfile

import pytest

from conftest import JAVA_HOME, JVM_FLAGS, SPARK_HOME, _tail

CONFLUX_JAR = os.environ.get("CFX_SPARK_CONFLUX_JAR", "")
TRAINER_JAR = os.environ.get("CFX_SPARK_TRAINER_JAR", "")
NATIVE_LIBS = [p for p in os.environ.get("CFX_SPARK_NATIVE_LIBS", "").split(os.pathsep) if p]
STEPS = 40
LINE = re.compile(r"^rank (\d+) of (\d+) on (\S+): weights (\S+) loss (\S+) -> (\S+)$", re.M)

pytestmark = pytest.mark.skipif(
    not (os.path.isfile(CONFLUX_JAR) and os.path.isfile(TRAINER_JAR) and NATIVE_LIBS
         and all(os.path.isfile(p) for p in NATIVE_LIBS)),
    reason="the Java binding and the Spark trainer are not built (CONFLUX_WITH_JAVA, pyspark's "
           "jars)")


def jar_with_natives(tmp_path):
    """conflux.jar plus the native libraries where the Maven jar carries them."""
    out = tmp_path / "conflux-with-natives.jar"
    shutil.copyfile(CONFLUX_JAR, out)
    prefix = "org/conflux/native/linux-x86_64/"
    with zipfile.ZipFile(out, "a") as z:
        names = []
        for lib in NATIVE_LIBS:       # load order: libconflux first
            name = os.path.basename(lib)
            z.write(os.path.realpath(lib), prefix + name)
            names.append(name)
        z.writestr(prefix + "LIBRARIES", "".join(n + "\n" for n in names))
    return str(out)


def submit(cluster, tasks, shipping):
    cmd = [os.path.join(SPARK_HOME, "bin", "spark-submit"), "--master", cluster.url,
           "--driver-memory", "512m", "--executor-memory", "512m",
           "--conf", "spark.ui.enabled=false", "--conf", "spark.ui.showConsoleProgress=false",
           "--conf", "spark.driver.host=127.0.0.1",
           "--conf", "spark.executor.cores=1", "--conf", f"spark.cores.max={tasks}",
           "--conf", f"spark.driver.extraJavaOptions={' '.join(JVM_FLAGS)}",
           "--conf", f"spark.executor.extraJavaOptions={' '.join(JVM_FLAGS)}",
           *shipping, "--class", "SparkLinearRegression", TRAINER_JAR,
           "--tasks", str(tasks), "--steps", str(STEPS)]
    p = subprocess.run(cmd, env=cluster.env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        logs = "".join(f"\n--- {path}\n{_tail(path, 30)}" for path in cluster.executor_logs())
        pytest.fail(f"spark-submit failed ({p.returncode}):\n{p.stdout}\n{p.stderr[-6000:]}{logs}")
    return p.stdout


def local_weights(tasks):
    """The same steps in one JVM over `tasks` shards."""
    cp = os.pathsep.join([TRAINER_JAR, CONFLUX_JAR, os.path.join(SPARK_HOME, "jars", "*")])
    p = subprocess.run([os.path.join(JAVA_HOME, "bin", "java"), *JVM_FLAGS, "-cp", cp,
                        "SparkLinearRegression", "--local", str(tasks), "--steps", str(STEPS)],
                       capture_output=True, text=True, timeout=120, check=True)
    m = re.search(rf"^local {tasks} shards: weights (\S+)$", p.stdout, re.M)
    assert m, p.stdout + p.stderr
    return m.group(1)


@pytest.mark.parametrize("tasks", [2, 4])
def test_jvm_trainer(cluster, tasks, tmp_path):
    if tasks == 2:
        shipping = ["--jars", CONFLUX_JAR, "--files", ",".join(NATIVE_LIBS),
                    "--conf", "spark.executor.extraLibraryPath=."]
    else:
        shipping = ["--jars", jar_with_natives(tmp_path)]
    out = submit(cluster, tasks, shipping)
    rows = [m.groups() for m in LINE.finditer(out)]
    assert [int(r[0]) for r in rows] == list(range(tasks)), out
    assert all(int(r[1]) == tasks for r in rows), out
    assert len({r[2] for r in rows}) == tasks, f"two ranks in one executor:\n{out}"
    weights = {r[3] for r in rows}
    assert len(weights) == 1, f"the ranks' weights differ:\n{out}"
    assert weights.pop() == local_weights(tasks), "the weights differ from the one-JVM reference"
    for r in rows:
        assert float(r[5]) < float(r[4]) / 10, f"rank {r[0]}'s loss did not fall: {r[4]} -> {r[5]}"

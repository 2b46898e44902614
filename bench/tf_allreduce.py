#!/usr/bin/env python3
"""TensorFlow gradient allreduce: conflux.tensorflow vs tf.distribute's MultiWorkerMirroredStrategy.

Both time one reduction of the ResNet-50 gradient set (bench/workloads/resnet50.tsv: 161 float32
tensors, 25.6 M values, 102 MB), summed over the ranks, on the same machine, in the same run:
  conflux_tf      conflux.tensorflow.grouped_allreduce of the list (one fused submission; the TF
                  op library's kernels), inside a tf.function, under mpirun -np N
  conflux_tf_eager  the same, called eagerly
  conflux_tf_grads  the list made inside the tf.function first (x * one), as gradients are: inputs
                  no one else holds (on one host of several ranks the kernel copies them into
                  shared tensor memory and reduces them there); made_grads times making them
                  alone, and conflux_tf_grads - made_grads is the reduction
  c_gradset       the C gradient set's step on the same shapes in the same processes and rounds
                  (bench/run's conflux_gradset: owned storage, every gradient marked ready from C,
                  then wait), the reference of the grouped allreduce (target: conflux_tf <= 1.2x)
  mwms_ring       MultiWorkerMirroredStrategy with CommunicationImplementation.RING (gRPC over
                  loopback), replica_context.all_reduce(SUM, list) inside strategy.run, N workers
                  started by this script with TF_CONFIG
Each worker checks the result once (rank r contributes (r + 1) * (1 + i % 7) in tensor i), warms up,
then times `--repeats` rounds (Conflux's rows interleaved, a barrier before each step; each step's
result is read back, which waits for it), and prints each row's median; this driver prints the
medians (max over ranks) and the ratios.

    .venv/bin/python bench/tf_allreduce.py --np 2 [--repeats 10] [--build build]

Not a test: numbers depend on the machine and its load.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from model_shapes import WORKLOADS, read_tsv  # noqa: E402


def shapes():
    return [dims for _, dims in read_tsv(os.path.join(WORKLOADS, "resnet50.tsv"))]


def tensors(tf, rank):
    return [tf.fill(s, float((rank + 1) * (1 + i % 7))) for i, s in enumerate(shapes())]


def check(result, n):
    tot = n * (n + 1) / 2
    for i, t in enumerate(result):
        v = t.numpy().reshape(-1)
        want = tot * (1 + i % 7)
        if v.size and (abs(v[0] - want) > 1e-3 * want or abs(v[-1] - want) > 1e-3 * want):
            raise SystemExit("wrong result in tensor %d: %r, want %r" % (i, v[0], want))


def timed(step, repeats, warmup):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def c_gradset_step(conflux, n):
    """The C gradient set's step on the same shapes (bench/run's conflux_gradset: a committed owned
    set, every gradient marked ready last first, then wait; bench/lang's C loop with the GIL
    released), in this process: the reference of the grouped allreduce."""
    sys.path.insert(0, os.path.join(HERE, "lang"))
    import bench_loops  # bench/lang: the C loops (build/bench/lang/libcfx_bench_loops.so)
    gs = conflux.GradientSet("resnet50.c_gradset", op=conflux.Sum)
    for i, s in enumerate(shapes()):
        gs.add("g%d" % i, s)
    gs.commit()
    r = conflux.rank()
    for i, a in enumerate(gs.arrays()):
        a[...] = (r + 1) * (1 + i % 7)
    ptr, count = int(gs._native.ptr), len(gs)
    bench_loops.gradset(ptr, count, 1)
    tot = n * (n + 1) / 2
    for i, a in enumerate(gs.arrays()):  # the checked step
        want = tot * (1 + i % 7)
        if a.size and abs(float(a.reshape(-1)[-1]) - want) > 1e-3 * want:
            raise SystemExit("c_gradset: wrong result in tensor %d" % i)

    def step():
        bench_loops.gradset(ptr, count, 1)
    step.gradset = gs  # keeps the set alive with the step
    return step


def worker_conflux(args):
    import tensorflow as tf
    import conflux
    import conflux.tensorflow as cfx
    cfx.init()
    r, n = cfx.rank(), cfx.size()
    xs = tensors(tf, r)
    fn = tf.function(lambda *t: cfx.grouped_allreduce(list(t), op=cfx.Sum, name="resnet50"))
    check(fn(*xs), n)

    def step():
        out = fn(*xs)
        out[-1].numpy()

    def step_eager():
        out = cfx.grouped_allreduce(xs, op=cfx.Sum, name="resnet50.eager")
        out[-1].numpy()

    # As a training step has its gradients: intermediates of the function (here x * one, `one` an
    # argument so that nothing folds it away), which no one else holds. made_grads makes the same
    # intermediates alone: conflux_tf_grads - made_grads is the reduction's share.
    one = tf.constant(1.0)
    grads_fn = tf.function(lambda one, *t: cfx.grouped_allreduce([x * one for x in t], op=cfx.Sum,
                                                                 name="resnet50.grads"))
    made_fn = tf.function(lambda one, *t: [x * one for x in t])
    check(grads_fn(one, *xs), n)

    def step_grads():
        grads_fn(one, *xs)[-1].numpy()

    def made_grads():
        made_fn(one, *xs)[-1].numpy()
    steps = {"conflux_tf": step, "conflux_tf_eager": step_eager, "conflux_tf_grads": step_grads,
             "made_grads": made_grads}
    if not args.no_gradset:
        steps["c_gradset"] = c_gradset_step(conflux, n)
    # Interleaved rounds, each method once a round after a barrier: the machine's load moves
    # all of them alike, and the ratios are taken within the same rounds.
    times = {k: [] for k in steps}
    for k, f in steps.items():
        f()
        f()
    for _ in range(args.repeats):
        for k, f in steps.items():
            cfx.barrier()
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    res = {k: statistics.median(v) for k, v in times.items()}
    print("RESULT " + json.dumps({"rank": r, **res}), flush=True)
    cfx.shutdown()


def mwms_ring(tf):
    """MultiWorkerMirroredStrategy with RING collectives from TF_CONFIG: (strategy, rank, size)."""
    opts = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=opts)
    return strategy, strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync


def worker_mwms(args):
    import tensorflow as tf
    strategy, r, n = mwms_ring(tf)
    xs = tensors(tf, r)

    @tf.function
    def fn():
        def replica():
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, xs)
        return strategy.run(replica)
    check(fn(), n)

    def step():
        out = fn()
        out[-1].numpy()
    print("RESULT " + json.dumps({"rank": r, "mwms_ring": timed(step, args.repeats, 2)}),
          flush=True)


def free_ports(k):
    socks = [socket.socket() for _ in range(k)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def results(outputs):
    """Each rank's RESULT object, the max over ranks per row. Read wherever "RESULT " starts, not
    per line: mpirun forwards the ranks' output in chunks, and two ranks' lines can arrive joined."""
    rows = {}
    decoder = json.JSONDecoder()
    for out in outputs:
        for chunk in out.split("RESULT ")[1:]:
            d, _ = decoder.raw_decode(chunk)
            for k, v in d.items():
                if k != "rank":
                    rows[k] = max(rows.get(k, 0.0), v)
    return rows


def env_base(args):
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
               KERAS_BACKEND="tensorflow", TF_ENABLE_ONEDNN_OPTS="0",
               TF_NUM_INTEROP_THREADS=str(args.threads), TF_NUM_INTRAOP_THREADS=str(args.threads),
               PYTHONPATH=os.path.join(os.path.abspath(args.build), "python"))
    # glibc keeps freed memory in its heap (no trimming; no mmap for blocks under 32 MiB): with its
    # defaults, whether a row's 100 MB of fresh tensors fault their pages in depended on what the
    # row before it left, so made_grads varied 13-50 ms from run to run, and the reduction's share
    # (conflux_tf_grads - made_grads) with it. The same for every row and both frameworks.
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(32 << 20))
    env.setdefault("MALLOC_TRIM_THRESHOLD_", str(4 << 30))
    return env


def launch_conflux(args, script, worker_args):
    """`script --worker conflux WORKER_ARGS` under mpirun -np args.np; the RESULT rows."""
    env = env_base(args)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "-np", str(args.np), "--oversubscribe", "--bind-to", "none",
           sys.executable, script, "--worker", "conflux"] + worker_args
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        raise SystemExit("conflux workers failed:\n" + p.stdout[-3000:] + p.stderr[-3000:])
    return results([p.stdout])


def launch_mwms(args, script, worker_args):
    """args.np processes `script --worker mwms WORKER_ARGS`, each with its TF_CONFIG (a cluster
    of workers on loopback ports); the RESULT rows."""
    workers = ["127.0.0.1:%d" % p for p in free_ports(args.np)]
    procs = []
    for i in range(args.np):
        env = env_base(args)
        env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                       "task": {"type": "worker", "index": i}})
        procs.append(subprocess.Popen([sys.executable, script, "--worker", "mwms"] + worker_args,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=args.timeout)
        if p.returncode != 0:
            raise SystemExit("MWMS worker failed:\n" + out[-3000:] + err[-3000:])
        outs.append(out)
    return results(outs)


def run_conflux(args):
    return launch_conflux(args, os.path.abspath(__file__), ["--repeats", str(args.repeats)] +
                          (["--no-gradset"] if args.no_gradset else []))


def run_mwms(args):
    return launch_mwms(args, os.path.abspath(__file__), ["--repeats", str(args.repeats)])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="TF intra/inter-op threads per worker")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="the build folder whose python/ holds conflux")
    ap.add_argument("--timeout", type=float, default=500)
    ap.add_argument("--worker", choices=["conflux", "mwms"], help=argparse.SUPPRESS)
    ap.add_argument("--skip-mwms", action="store_true")
    ap.add_argument("--no-gradset", action="store_true",
                    help="no c_gradset row (needs build/bench/lang's libcfx_bench_loops.so)")
    args = ap.parse_args()
    if args.worker == "conflux":
        return worker_conflux(args)
    if args.worker == "mwms":
        return worker_mwms(args)
    nbytes = sum(4 * int(__import__("math").prod(s)) for s in shapes())
    print("ResNet-50 gradients: %d tensors, %.1f MB float32, %d ranks, median of %d"
          % (len(shapes()), nbytes / 1e6, args.np, args.repeats))
    rows = run_conflux(args)
    if not args.skip_mwms:
        rows.update(run_mwms(args))
    for k, v in rows.items():
        print("%-18s %9.2f ms  %7.2f GB/s (algorithm bytes / time)" % (k, v * 1e3, nbytes / v / 1e9))
    if "mwms_ring" in rows:
        for k in ("conflux_tf", "conflux_tf_eager"):
            print("ratio %s / mwms_ring = %.3f" % (k, rows[k] / rows["mwms_ring"]))
    if "c_gradset" in rows:
        for k in ("conflux_tf", "conflux_tf_eager"):
            print("ratio %s / c_gradset = %.3f (target <= 1.2)" % (k, rows[k] / rows["c_gradset"]))
        if "conflux_tf_grads" in rows and "made_grads" in rows:
            share = rows["conflux_tf_grads"] - rows["made_grads"]
            print("ratio (conflux_tf_grads - made_grads) / c_gradset = %.3f (%.2f ms; target <= 1.2)"
                  % (share / rows["c_gradset"], share * 1e3))


if __name__ == "__main__":
    main()

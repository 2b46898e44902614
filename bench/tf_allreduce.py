#!/usr/bin/env python3
"""TensorFlow gradient allreduce: conflux.tensorflow vs tf.distribute's MultiWorkerMirroredStrategy.

Both time one reduction of the ResNet-50 gradient set (bench/workloads/resnet50.tsv: 161 float32
tensors, 25.6 M values, 102 MB), summed over the ranks, on the same machine, in the same run:
  conflux_tf      conflux.tensorflow.grouped_allreduce of the list (one fused submission; the TF
                  op library's kernels), inside a tf.function, under mpirun -np N
  conflux_tf_eager  the same, called eagerly
  mwms_ring       MultiWorkerMirroredStrategy with CommunicationImplementation.RING (gRPC over
                  loopback), replica_context.all_reduce(SUM, list) inside strategy.run, N workers
                  started by this script with TF_CONFIG
Each worker checks the result once (rank r contributes (r + 1) * (1 + i % 7) in tensor i), warms up,
then times `--repeats` steps (a barrier-free loop: each step's result is read back, which waits for
it), and prints its median; this driver prints the medians (max over ranks) and the ratio.

    .venv/bin/python bench/tf_allreduce.py --np 2 [--repeats 10] [--build build-tf]

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


def worker_conflux(args):
    import tensorflow as tf
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
    cfx.barrier()
    res = {"conflux_tf": timed(step, args.repeats, 2)}
    cfx.barrier()
    res["conflux_tf_eager"] = timed(step_eager, args.repeats, 2)
    print("RESULT " + json.dumps({"rank": r, **res}), flush=True)
    cfx.shutdown()


def worker_mwms(args):
    import tensorflow as tf
    opts = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=opts)
    r = strategy.cluster_resolver.task_id
    n = strategy.num_replicas_in_sync
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
    rows = {}
    for out in outputs:
        for line in out.splitlines():
            if line.startswith("RESULT "):
                d = json.loads(line[7:])
                for k, v in d.items():
                    if k != "rank":
                        rows[k] = max(rows.get(k, 0.0), v)
    return rows


def env_base(args):
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
               TF_NUM_INTEROP_THREADS=str(args.threads), TF_NUM_INTRAOP_THREADS=str(args.threads),
               PYTHONPATH=os.path.join(os.path.abspath(args.build), "python"))
    return env


def run_conflux(args):
    env = env_base(args)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "-np", str(args.np), "--oversubscribe", "--bind-to", "none",
           sys.executable, os.path.abspath(__file__), "--worker", "conflux",
           "--repeats", str(args.repeats)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        raise SystemExit("conflux workers failed:\n" + p.stdout[-3000:] + p.stderr[-3000:])
    return results([p.stdout])


def run_mwms(args):
    ports = free_ports(args.np)
    workers = ["127.0.0.1:%d" % p for p in ports]
    procs = []
    for i in range(args.np):
        env = env_base(args)
        env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                       "task": {"type": "worker", "index": i}})
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", "mwms",
             "--repeats", str(args.repeats)], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=args.timeout)
        if p.returncode != 0:
            raise SystemExit("MWMS worker failed:\n" + out[-3000:] + err[-3000:])
        outs.append(out)
    return results(outs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="TF intra/inter-op threads per worker")
    ap.add_argument("--build", default=os.path.join(ROOT, "build-tf"),
                    help="the build folder whose python/ holds conflux")
    ap.add_argument("--timeout", type=float, default=500)
    ap.add_argument("--worker", choices=["conflux", "mwms"], help=argparse.SUPPRESS)
    ap.add_argument("--skip-mwms", action="store_true")
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


if __name__ == "__main__":
    main()

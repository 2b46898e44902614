#!/usr/bin/env python3
"""A Keras 3 ResNet-50 training step on synthetic data: conflux.keras vs tf.distribute's
MultiWorkerMirroredStrategy (RING), and the communication each adds to the single-process step.

Every row is Keras's train step of keras.applications.ResNet50 (weights=None, 1000 classes,
25.6 M parameters: the ResNet-50 gradient set) as one tf.function (forward, loss, GradientTape,
SGD(momentum=0.9).apply_gradients) on one fixed synthetic batch per rank (--batch images of
--image x --image pixels), each step timed until its loss is read back. (model.fit is not used:
Keras 3's fit does not take MultiWorkerMirroredStrategy's distributed batches, "unsupported type
PerReplica", so MWMS runs its documented custom-loop form, strategy.run, and every row the same
step for a like-for-like comparison.)
  local        the same model and batch in each worker without any communication (every worker
               runs it at the same time, so it sees the same load as the distributed rows)
  conflux      the optimizer wrapped in conflux.keras.DistributedOptimizer (one grouped allreduce of
               the gradients a step, the TF op library's kernels), under mpirun -np N
  mwms_ring    the model and optimizer built under MultiWorkerMirroredStrategy with
               CommunicationImplementation.RING (gRPC over loopback) and the step run by
               strategy.run (the Keras optimizer all-reduces the gradients), N workers started by
               this script with TF_CONFIG, the same per-replica batch
The conflux workers alternate rounds of local and conflux steps (--steps each, the first round
dropped as warm-up); the MWMS workers do the same with their own local model (built outside the
strategy's scope) and the strategy's. Communication = step - local, each from its own workers;
the target is conflux's <= 0.25x MWMS's. Each worker checks once that its distributed model's
weights equal the other ranks' after the timed steps.

    .venv/bin/python bench/tf_keras_step.py --np 2 [--rounds 6 --steps 5] [--build build]

Not a test: numbers depend on the machine and its load.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from tf_allreduce import launch_conflux, launch_mwms, mwms_ring  # noqa: E402  (shared)


def make_model(keras, args, seed=1):
    keras.utils.set_random_seed(seed)
    return keras.applications.ResNet50(weights=None, input_shape=(args.image, args.image, 3),
                                       classes=1000)


def data(np, args, rank, batch):
    rng = np.random.default_rng(10 + rank)
    x = rng.standard_normal((batch, args.image, args.image, 3)).astype(np.float32)
    y = rng.integers(0, 1000, size=(batch,)).astype(np.int32)
    return x, y


def train_step(tf, keras, model, opt, scale=1.0):
    """Keras's train step as a tf.function: forward, the loss (times `scale`), its gradients,
    opt.apply_gradients (which reduces them: conflux's DistributedOptimizer, or the Keras
    optimizer's own all-reduce inside a strategy's replica context)."""
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                y, model(x, training=True))) * scale
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))
        return loss
    return step


def rounds(args, runs, barrier=None):
    """runs: {row: step()}; interleaved rounds of args.steps timed steps per row (each ends with
    its loss read back), the first round dropped (tracing, the optimizer's variables)."""
    times = {row: [] for row in runs}
    for k in range(args.rounds + 1):
        for row, step in runs.items():
            if barrier is not None:
                barrier()
            for _ in range(args.steps):
                t0 = time.perf_counter()
                step()
                if k:
                    times[row].append(time.perf_counter() - t0)
    return {row: statistics.median(t) for row, t in times.items()}


def worker_conflux(args):
    import numpy as np
    import keras
    import tensorflow as tf
    import conflux.keras as ck
    ck.init()
    r = ck.rank()
    x, y = (tf.constant(a) for a in data(np, args, r, args.batch))
    local = make_model(keras, args)
    local_step = tf.function(train_step(tf, keras, local, keras.optimizers.SGD(0.01, momentum=0.9)))
    dist = make_model(keras, args)
    dopt = ck.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))
    dist_step = tf.function(train_step(tf, keras, dist, dopt))
    res = rounds(args, {"local": lambda: float(local_step(x, y)),
                        "conflux": lambda: float(dist_step(x, y))},
                 barrier=lambda: ck.barrier())
    w = dist.trainable_variables[-1].numpy()
    if not all(np.array_equal(w, o) for o in ck.allgather_object(w)):
        raise SystemExit("conflux: the ranks' weights differ")
    print("RESULT " + json.dumps({"rank": r, "local.conflux": res["local"],
                                  "conflux": res["conflux"]}), flush=True)
    ck.shutdown()


def worker_mwms(args):
    import numpy as np
    import keras
    import tensorflow as tf
    strategy, r, n = mwms_ring(tf)
    x, y = (tf.constant(a) for a in data(np, args, r, args.batch))
    local = make_model(keras, args)
    local_step = tf.function(train_step(tf, keras, local, keras.optimizers.SGD(0.01, momentum=0.9)))
    with strategy.scope():
        dist = make_model(keras, args)
        dopt = keras.optimizers.SGD(0.01, momentum=0.9)
    # Each worker's own batch; the loss of a replica scaled by 1/n, the optimizer's all-reduce
    # (SUM) makes the mean over the global batch.
    replica = train_step(tf, keras, dist, dopt, scale=1.0 / n)
    dist_step = tf.function(lambda: strategy.reduce(
        tf.distribute.ReduceOp.SUM, strategy.run(replica, args=(x, y)), axis=None))
    res = rounds(args, {"local": lambda: float(local_step(x, y)),
                        "mwms": lambda: float(dist_step())})
    print("RESULT " + json.dumps({"rank": r, "local.mwms": res["local"],
                                  "mwms_ring": res["mwms"]}), flush=True)


def worker_args(args):
    return ["--image", str(args.image), "--batch", str(args.batch), "--rounds", str(args.rounds),
            "--steps", str(args.steps)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--image", type=int, default=64, help="image side (pixels)")
    ap.add_argument("--batch", type=int, default=4, help="images per rank and step")
    ap.add_argument("--rounds", type=int, default=6, help="timed rounds (after one warm-up round)")
    ap.add_argument("--steps", type=int, default=5, help="steps per row and round")
    ap.add_argument("--threads", type=int, default=1, help="TF intra/inter-op threads per worker")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="the build folder whose python/ holds conflux")
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--worker", choices=["conflux", "mwms"], help=argparse.SUPPRESS)
    ap.add_argument("--skip-mwms", action="store_true")
    args = ap.parse_args()
    if args.worker == "conflux":
        return worker_conflux(args)
    if args.worker == "mwms":
        return worker_mwms(args)
    print("Keras ResNet-50 step, %d ranks, %d images of %dx%d per rank, median of %d steps"
          % (args.np, args.batch, args.image, args.image, args.rounds * args.steps), flush=True)
    rows = launch_conflux(args, os.path.abspath(__file__), worker_args(args))
    if not args.skip_mwms:
        rows.update(launch_mwms(args, os.path.abspath(__file__), worker_args(args)))
    for k, v in rows.items():
        print("%-14s %9.1f ms" % (k, v * 1e3))
    comm = {"conflux": rows["conflux"] - rows["local.conflux"]}
    if "mwms_ring" in rows:
        comm["mwms_ring"] = rows["mwms_ring"] - rows["local.mwms"]
    for k, v in comm.items():
        print("communication %-10s %9.1f ms (step - local)" % (k, v * 1e3))
    if "mwms_ring" in comm:
        print("ratio conflux / mwms_ring communication = %.3f (target <= 0.25)"
              % (comm["conflux"] / comm["mwms_ring"]))


if __name__ == "__main__":
    main()

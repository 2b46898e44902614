#!/usr/bin/env python3
"""A Keras 3 ResNet-50 training step on synthetic data: conflux.keras vs tf.distribute's
MultiWorkerMirroredStrategy (RING), and the communication each adds to the single-process step.

Every row is `model.fit` of keras.applications.ResNet50 (weights=None, 1000 classes, 25.6 M
parameters: the ResNet-50 gradient set) with SGD(momentum=0.9) on one fixed synthetic batch per
rank (--batch images of --image x --image pixels), each step timed by a callback from
on_train_batch_begin to on_train_batch_end (the step's loss read back):
  local        the same model and batch in each worker without any communication (every worker
               runs it at the same time, so it sees the same load as the distributed rows)
  conflux      conflux.keras.DistributedOptimizer (one grouped allreduce of the gradients a step,
               the TF op library's kernels), under mpirun -np N
  mwms_ring    the model built and fit under MultiWorkerMirroredStrategy with
               CommunicationImplementation.RING (gRPC over loopback), N workers started by this
               script with TF_CONFIG, the same per-replica batch
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


class StepTimer:
    """A keras callback recording each step's wall time (the loss read back ends it)."""

    def __init__(self, keras):
        class _CB(keras.callbacks.Callback):
            def __init__(cb):
                super().__init__()
                cb.times = []

            def on_train_batch_begin(cb, batch, logs=None):
                cb.t0 = time.perf_counter()

            def on_train_batch_end(cb, batch, logs=None):
                float(logs["loss"])
                cb.times.append(time.perf_counter() - cb.t0)
        self.cb = _CB()

    @property
    def times(self):
        return self.cb.times


def make_model(keras, args, seed=1):
    keras.utils.set_random_seed(seed)
    return keras.applications.ResNet50(weights=None, input_shape=(args.image, args.image, 3),
                                       classes=1000)


def data(np, args, rank, batch):
    rng = np.random.default_rng(10 + rank)
    x = rng.standard_normal((batch, args.image, args.image, 3)).astype(np.float32)
    y = rng.integers(0, 1000, size=(batch,)).astype(np.int32)
    return x, y


def runner(keras, model, dataset):
    """(fit(steps), its StepTimer): `steps` steps of model.fit on the dataset, each timed."""
    timer = StepTimer(keras)
    return (lambda steps: model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0,
                                    callbacks=[timer.cb])), timer


def rounds(args, runs, barrier=None):
    """runs: {row: (fit(steps), timer)}; interleaved rounds, the first dropped."""
    for k in range(args.rounds + 1):
        for row, (fit, timer) in runs.items():
            if barrier is not None:
                barrier()
            n0 = len(timer.times)
            fit(args.steps)
            if k == 0:  # warm-up: tracing, the optimizer's variables, first touches
                del timer.times[n0:]
    return {row: statistics.median(t.times) for row, (_, t) in runs.items()}


def worker_conflux(args):
    import numpy as np
    import keras
    import tensorflow as tf
    import conflux.keras as ck
    ck.init()
    r, n = ck.rank(), ck.size()
    x, y = data(np, args, r, args.batch)
    ds = tf.data.Dataset.from_tensors((x, y)).repeat()

    local = make_model(keras, args)
    local.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    dist = make_model(keras, args)
    dist.compile(optimizer=ck.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9)),
                 loss="sparse_categorical_crossentropy")
    res = rounds(args, {"local": runner(keras, local, ds), "conflux": runner(keras, dist, ds)},
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
    x, y = data(np, args, r, args.batch)
    ds = tf.data.Dataset.from_tensors((x, y)).repeat()
    # Each worker feeds its own batch: no auto-sharding; the global batch is n per-replica ones.
    gopts = tf.data.Options()
    gopts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    gds = tf.data.Dataset.from_tensors((x, y)).unbatch().batch(args.batch * n).repeat()
    gds = gds.with_options(gopts)

    local = make_model(keras, args)
    local.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    with strategy.scope():
        dist = make_model(keras, args)
        dist.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                     loss="sparse_categorical_crossentropy")
    res = rounds(args, {"local": runner(keras, local, ds), "mwms": runner(keras, dist, gds)})
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

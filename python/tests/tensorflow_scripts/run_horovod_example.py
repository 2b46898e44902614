"""Runs one of Horovod's TF2 examples (horovod_examples/, Horovod's files with the import changed
and the Keras 3 edits marked 'Conflux:') on every rank, as horovodrun would run it, and checks
its results against the other ranks':

    run_horovod_example.py synthetic mnist    (one process a rank runs both, in this order)

synthetic: tensorflow2_synthetic_benchmark.py (MobileNetV3Small, a tiny batch); mnist:
tensorflow2_keras_mnist.py on images this test makes.

Test fixtures, not changes to the examples: `tf.keras.datasets.mnist.load_data` is replaced by a
function that returns generated digit-like images (no download: each label lights its own 7x7
block of a 28x28 image, plus noise, so a model can learn them), the MNIST run happens in a
temporary folder (its rank-0 checkpoints), and keras.Model.fit is observed (wrapped to keep the
model and its History). Checked: the final weights are identical on every rank (they began from
each rank's own random initialisation: the broadcast callback or broadcast_variables made them
one), finite, and for MNIST the loss is finite, falls from the first epoch to the last, the
epoch metrics are the same on every rank (MetricAverageCallback), the warmup callback ran, and
rank 0 wrote its checkpoints. Exit status 0 when every check passed."""
import hashlib
import os
import runpy
import sys
import tempfile

import numpy as np

if os.environ.get("CFX_TF_SKIP_REASON"):  # the op library was not built: say why, skip
    print("SKIP: conflux.tensorflow: " + os.environ["CFX_TF_SKIP_REASON"])
    sys.exit(77)
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "horovod_examples")


def fake_mnist(path="mnist.npz"):
    """((x_train, y_train), (x_test, y_test)) shaped as MNIST's (uint8 28x28, uint8 labels)."""
    rng = np.random.default_rng(7)

    def make(n):
        y = rng.integers(0, 10, n).astype(np.uint8)
        x = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
        for i, label in enumerate(y):
            r, c = divmod(int(label), 4)
            x[i, 7 * r:7 * r + 7, 7 * c:7 * c + 7] = 255
        return x, y
    return make(2048), make(256)


fitted = []  # (model, History) of every fit the example ran


def observe_fit():
    fit = keras.Model.fit

    def observed(self, *args, **kwargs):
        history = fit(self, *args, **kwargs)
        fitted.append((self, history))
        return history
    keras.Model.fit = observed


def digest(model):
    """Of the trainable weights (BatchNormalization's moving statistics follow each rank's own
    batches, in Horovod as here)."""
    h = hashlib.sha256()
    for w in model.trainable_weights:
        w = w.numpy()
        if not np.all(np.isfinite(w)):
            raise AssertionError("a weight is not finite")
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def main():
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    for which in sys.argv[1:]:
        run(which)


def run(which):
    import conflux.horovod.tensorflow as hvd
    if which == "synthetic":
        path = os.path.join(EXAMPLES, "tensorflow2_synthetic_benchmark.py")
        sys.argv = [path, "--model", "MobileNetV3Small", "--batch-size", "2", "--no-cuda",
                    "--num-warmup-batches", "1", "--num-batches-per-iter", "1", "--num-iters", "2"]
        g = runpy.run_path(path, run_name="__main__")
        model = g["model"]
        digests = hvd.allgather_object(digest(model))
        check(len(set(digests)) == 1, "final weights differ across ranks: %s" % digests)
    elif which == "mnist":
        path = os.path.join(EXAMPLES, "tensorflow2_keras_mnist.py")
        tf.keras.datasets.mnist.load_data = fake_mnist
        observe_fit()
        os.chdir(tempfile.mkdtemp(prefix="cfx-hvd-mnist-"))
        sys.argv = [path]
        runpy.run_path(path, run_name="__main__")
        check(len(fitted) == 1, "the example ran fit %d times" % len(fitted))
        model, history = fitted[0]
        loss = history.history["loss"]
        check(all(np.isfinite(loss)) and loss[-1] < loss[0], "loss %s did not fall" % loss)
        everyone = hvd.allgather_object((digest(model), loss, history.history["accuracy"]))
        check(all(e == everyone[0] for e in everyone),
              "weights or averaged metrics differ across ranks: %s" % everyone)
        lrs = history.history.get("lr") or history.history.get("learning_rate")
        top = 0.001 * hvd.size()
        check(lrs is not None and lrs[0] < lrs[-1] <= top * (1 + 1e-6) and lrs[-1] > 0.9 * top,
              "the warmup did not ramp the rate up to 0.001 * size: %s" % lrs)
        if hvd.rank() == 0:
            last = "checkpoint-%d.keras" % len(loss)
            check(os.path.exists(last), "rank 0 did not write %s" % last)
        print("mnist: loss %s" % np.round(loss, 4))
    else:
        sys.exit("usage: run_horovod_example.py synthetic|mnist ...")
    print("%s example on rank %d of %d: passed" % (which, hvd.rank(), hvd.size()))


if __name__ == "__main__":
    main()

"""A Horovod elastic Keras script on Keras 3, as Horovod's elastic Keras examples are written but
for the import (conflux.horovod.tensorflow.keras), run by check_elastic_keras.py under cfxrun
--elastic. A linear model trained with model.fit, SGD with momentum (so the optimizer's state is
part of what a reset restores and syncs) and hvd.DistributedOptimizer; every step's gradient is the
mean over one global batch of GLOBAL rows (this rank's rows rank::size, averaged over ranks), so
the weights depend only on which batches were applied, never on the world's size.

Knobs (environment): ELASTIC_KILL="host:epoch:batch": the workers of that host SIGKILL themselves
before that batch in the first world; ELASTIC_OUT: every worker that finishes writes
ELASTIC_OUT.<rank>.json with its final weights, the world's size and the sizes seen at resets."""
import json
import os
import signal

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import conflux  # noqa: E402
import conflux.horovod.tensorflow.keras as hvd  # noqa: E402

EPOCHS, BATCHES, GLOBAL, DIM, LR, MOMENTUM = 3, 6, 12, 4, 0.05, 0.5


def epoch_data(epoch):
    g = np.random.default_rng(1000 + epoch)
    x = g.standard_normal((BATCHES * GLOBAL, DIM)).astype(np.float32)
    y = x @ np.arange(1, DIM + 1) + 0.1 * g.standard_normal(BATCHES * GLOBAL)
    return x, y.astype(np.float32)[:, None]


def my_shard(epoch, skip_batches):
    """This rank's rows of the epoch's batches from `skip_batches` on, batch after batch."""
    x, y = epoch_data(epoch)
    rows = [b * GLOBAL + i for b in range(skip_batches, BATCHES)
            for i in range(hvd.rank(), GLOBAL, hvd.size())]
    return x[rows], y[rows]


tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
hvd.init()
model = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(1, kernel_initializer="zeros")])
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=MOMENTUM))
model.compile(optimizer=opt, loss="mse")
state = hvd.elastic.KerasState(model, epoch=0, batch=0)
sizes = []
state.register_reset_callbacks([lambda: sizes.append(hvd.size())])
kill = os.environ.get("ELASTIC_KILL", "").split(":")


class MaybeDie(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if len(kill) == 3 and os.environ["HOROVOD_HOSTNAME"] == kill[0] and \
                (state.epoch, state.batch) == (int(kill[1]), int(kill[2])) and \
                conflux.membership_round() == 1:
            os.kill(os.getpid(), signal.SIGKILL)


@hvd.elastic.run
def train(state):
    while state.epoch < EPOCHS:
        x, y = my_shard(state.epoch, state.batch)
        model.fit(x, y, batch_size=GLOBAL // hvd.size(), initial_epoch=state.epoch,
                  epochs=state.epoch + 1, shuffle=False, verbose=0, callbacks=[
                      MaybeDie(),
                      hvd.elastic.UpdateBatchStateCallback(state),
                      hvd.elastic.UpdateEpochStateCallback(state),
                      hvd.elastic.CommitStateCallback(state, batches_per_commit=2)])


train(state)
if os.environ.get("ELASTIC_OUT"):
    with open("%s.%d.json" % (os.environ["ELASTIC_OUT"], hvd.rank()), "w") as f:
        json.dump({"weights": [w.tolist() for w in model.get_weights()], "size": hvd.size(),
                   "sizes": sizes, "epoch": state.epoch}, f)
hvd.shutdown()

"""conflux.keras with Keras 3: model.fit with DistributedOptimizer and the callbacks trains one
model (identical weights on every rank) equal, to float32 rounding, to a single-process model
trained on every rank's batches; a DistributedGradientTape loop likewise; the warmup schedule,
IndexedSlices gradients and SyncBatchNormalization against values computed here."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

B, STEPS, EPOCHS, FEATURES = 4, 5, 3, 6


def shard(r):
    rng = np.random.default_rng(100 + r)
    x = rng.standard_normal((B * STEPS, FEATURES)).astype(np.float32)
    y = (x @ np.linspace(-1, 1, FEATURES).astype(np.float32) + 0.1 * r)[:, None]
    return x, y.astype(np.float32)


def global_batches(n):
    """Batch i of the single-process run: every rank's batch i, in rank order."""
    xs, ys = zip(*[shard(k) for k in range(n)])
    X = np.concatenate([np.concatenate([x[i * B:(i + 1) * B] for x in xs]) for i in range(STEPS)])
    Y = np.concatenate([np.concatenate([y[i * B:(i + 1) * B] for y in ys]) for i in range(STEPS)])
    return X, Y


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(1)])


def same_everywhere(hvd, weights):
    everyone = hvd.allgather_object([w.tolist() for w in weights])
    return all(np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
               for other in everyone for a, b in zip(other, everyone[0]))


def lr_at(epoch):
    return 0.05 * 0.5 ** epoch


class Record(keras.callbacks.Callback):
    """The epoch's local loss, before MetricAverageCallback averages it."""

    def __init__(self):
        super().__init__()
        self.local = []

    def on_epoch_end(self, epoch, logs=None):
        self.local.append(float(logs["loss"]))


def test_fit_matches_single_process(hvd, world):
    import conflux.keras as ck
    r, n = world
    model = make_model(seed=r)  # different on every rank: the broadcast makes them one
    start = hvd.broadcast_object([w for w in model.get_weights()], root_rank=0)
    opt = ck.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.05, momentum=0.9))
    model.compile(optimizer=opt, loss="mse")
    rec = Record()
    x, y = shard(r)
    hist = model.fit(x, y, batch_size=B, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[
        ck.callbacks.BroadcastGlobalVariablesCallback(0),
        rec,
        ck.callbacks.MetricAverageCallback(),
        ck.callbacks.LearningRateScheduleCallback(0.05, multiplier=lambda e: 0.5 ** e),
    ])
    weights = model.get_weights()
    assert same_everywhere(hvd, weights)
    # metrics: the average over ranks of each rank's local epoch loss, the same on every rank
    locals_ = hvd.allgather_object(rec.local)
    np.testing.assert_allclose(hist.history["loss"], np.mean(locals_, 0), rtol=1e-6)
    assert hvd.allgather_object(hist.history["loss"]) == [hist.history["loss"]] * n
    # the single-process model on every rank's batches
    ref = make_model(seed=0)
    ref.set_weights(start)
    ref.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05, momentum=0.9), loss="mse")
    X, Y = global_batches(n)
    ref.fit(X, Y, batch_size=B * n, epochs=EPOCHS, shuffle=False, verbose=0,
            callbacks=[keras.callbacks.LearningRateScheduler(lr_at)])
    for a, b in zip(weights, ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)
    assert not np.allclose(weights[0], start[0])  # it did train


def test_backward_passes_and_warmup(hvd, world):
    import conflux.keras as ck
    r, n = world
    model = make_model(seed=0)
    start = model.get_weights()
    opt = ck.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.05),
                                  backward_passes_per_step=2, average_aggregated_gradients=True)
    model.compile(optimizer=opt, loss="mse")
    seen = []
    probe = keras.callbacks.LambdaCallback(on_train_batch_begin=lambda b, logs: seen.append(
        float(np.asarray(model.optimizer.learning_rate))))
    x, y = shard(r)
    model.fit(x[:4 * B], y[:4 * B], batch_size=B, epochs=1, shuffle=False, verbose=0, callbacks=[
        ck.callbacks.LearningRateWarmupCallback(0.05, warmup_epochs=2, steps_per_epoch=4), probe])
    want = [0.05 / n * ((b / 4) * (n - 1) / 2 + 1) for b in range(4)]
    np.testing.assert_allclose(seen, want, rtol=1e-6)
    assert same_everywhere(hvd, model.get_weights())
    # reference: 2 updates, each with the mean of 2 passes' global-batch gradients
    ref = make_model(seed=0)
    ref.set_weights(start)
    ropt = keras.optimizers.SGD(learning_rate=0.05, gradient_accumulation_steps=2)
    ref.compile(optimizer=ropt, loss="mse")
    X, Y = global_batches(n)
    ref.fit(X[:4 * B * n], Y[:4 * B * n], batch_size=B * n, epochs=1, shuffle=False, verbose=0,
            callbacks=[keras.callbacks.LambdaCallback(
                on_train_batch_begin=lambda b, logs: setattr(ropt, "learning_rate", want[b]))])
    for a, b in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_gradient_tape_loop(hvd, world, mode):
    r, n = world
    model = make_model(seed=r)
    hvd.broadcast_variables(model.variables, root_rank=0)
    start = model.get_weights()
    assert same_everywhere(hvd, start)
    opt = keras.optimizers.SGD(learning_rate=0.1)
    mse = keras.losses.MeanSquaredError()

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = mse(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    step_fn = tf.function(step) if mode == "function" else step
    x, y = shard(r)
    for i in range(STEPS):
        step_fn(tf.constant(x[i * B:(i + 1) * B]), tf.constant(y[i * B:(i + 1) * B]))
    assert same_everywhere(hvd, model.get_weights())
    ref = make_model(seed=0)
    ref.set_weights(start)
    ropt = keras.optimizers.SGD(learning_rate=0.1)
    X, Y = global_batches(n)
    for i in range(STEPS):
        xb, yb = X[i * B * n:(i + 1) * B * n], Y[i * B * n:(i + 1) * B * n]
        with tf.GradientTape() as tape:
            loss = mse(yb, ref(xb, training=True))
        ropt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables),
                                 ref.trainable_variables))
    for a, b in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_indexed_slices(hvd, world, sparse_as_dense):
    r, n = world
    table = tf.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))
    ids = [[k % 6, (2 * k + 1) % 6] for k in range(n)]
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, ids[r]) * float(r + 1))
    g = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense).gradient(loss, table)
    assert isinstance(g, tf.IndexedSlices) != sparse_as_dense
    want = np.zeros((6, 2), np.float32)
    for k in range(n):
        for i in ids[k]:
            want[i] += (k + 1) / n
    np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(), want, rtol=1e-6)


def test_sync_batch_norm(hvd, world):
    r, n = world
    xs = [np.random.default_rng(k).standard_normal((3 + k, 4)).astype(np.float32) for k in range(n)]
    layer = hvd.SyncBatchNormalization(center=False, scale=False, epsilon=1e-3)
    out = layer(tf.constant(xs[r]), training=True).numpy()
    allx = np.concatenate(xs)
    want = (xs[r] - allx.mean(0)) / np.sqrt(allx.var(0) + 1e-3)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_horovod_module_names(hvd, world):
    import conflux.horovod.tensorflow as hvd_tf
    import conflux.horovod.tensorflow.keras as hvd_keras
    from conflux.horovod.tensorflow.keras.callbacks import BroadcastGlobalVariablesCallback
    r, n = world
    assert hvd_tf.rank() == r and hvd_keras.size() == n
    assert hvd_keras.callbacks.BroadcastGlobalVariablesCallback is BroadcastGlobalVariablesCallback
    np.testing.assert_allclose(hvd_tf.allreduce(tf.ones([2]), op=hvd_tf.Sum).numpy(), [n, n])

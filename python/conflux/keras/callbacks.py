"""Horovod's Keras callbacks for Keras 3: BroadcastGlobalVariablesCallback,
MetricAverageCallback, LearningRateScheduleCallback, LearningRateWarmupCallback,
BestModelCheckpoint."""
import keras
import numpy as np
import tensorflow as tf

from conflux import _core
from conflux.tensorflow import _ops
from conflux.tensorflow.functions import broadcast_variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Gives every rank root_rank's model (all its variables) when training begins, and the
    model's and the optimizer's variables again after the first batch, as Horovod's does (Keras
    builds a model without an input shape, and the optimizer, in the first step), so every rank
    trains the same model from the same start."""

    def __init__(self, root_rank, device=''):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def _optimizer_variables(self):
        opt = getattr(self.model, "optimizer", None)
        return list(getattr(opt, "variables", [])) if opt is not None else []

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        broadcast_variables(list(self.model.variables) + self._optimizer_variables(),
                            self.root_rank)

    def on_train_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        broadcast_variables(list(self.model.variables) + self._optimizer_variables(),
                            self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of each epoch, replaces every numeric value of `logs` (the epoch's metrics,
    validation ones included) with its average over ranks, so every rank (and whatever saves or
    stops on them) sees the same numbers. Put it before the callbacks that read the metrics."""

    def __init__(self, device=''):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and
                      isinstance(float(np.asarray(v)), float))
        if not keys:
            return
        values = tf.constant([float(np.asarray(logs[k])) for k in keys], tf.float64)
        avg = _ops.allreduce(values, _core.Average, name="metric_average.%d" % epoch).numpy()
        for k, v in zip(keys, avg):
            logs[k] = float(v)


def _set_lr(optimizer, lr):
    optimizer.learning_rate = lr


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """lr = initial_lr * multiplier(epoch) for start_epoch <= epoch < end_epoch: per epoch with
    staircase, else per batch with a fractional epoch (epoch + batch / steps_per_epoch).
    `multiplier` may be a number (constant) or a function of the epoch. momentum_correction is
    accepted and ignored (Keras 3 compiles momentum into the step)."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = None
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)

    def _active(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _adjust(self, epoch):
        lr = self.initial_lr * self.multiplier(epoch)
        _set_lr(self.model.optimizer, lr)
        return lr

    def on_train_begin(self, logs=None):
        if self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if self.staircase and self._active(epoch):
            self._adjust(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if self.staircase or not self._active(self.current_epoch):
            return
        if not self.steps_per_epoch:
            raise ValueError("LearningRateScheduleCallback(staircase=False) needs steps_per_epoch")
        self._adjust(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = float(np.asarray(self.model.optimizer.learning_rate))


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's warmup: over warmup_epochs the lr goes from initial_lr / size() to initial_lr
    (per batch), lr = initial_lr / size * (epoch * (size - 1) / warmup_epochs + 1)."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        n = _core.size()

        def multiplier(epoch):
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch, verbose=verbose)
        self.warmup_epochs = warmup_epochs

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1 and self.verbose > 0 and _core.rank() == 0:
            print("\nEpoch %d: finished gradual learning rate warmup to %g."
                  % (epoch + 1, self.initial_lr))


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """ModelCheckpoint with save_best_only=True that writes on rank 0 only (the others hold the
    same model). `filepath` may be set later (attribute), as Horovod's estimators do."""

    def __init__(self, filepath=None, monitor='val_loss', verbose=0, mode='auto',
                 save_freq='epoch', save_weights_only=False):
        super().__init__(filepath=filepath or "best.keras", monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq)

    def _save_model(self, *args, **kwargs):
        if _core.rank() == 0:
            return super()._save_model(*args, **kwargs)
        return None

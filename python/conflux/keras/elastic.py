"""Elastic Keras 3 training (docs/tensorflow.md, docs/elastic.md): Horovod's
hvd.elastic.KerasState, run and the three callbacks, on conflux.tensorflow.elastic.

    state = conflux.keras.elastic.KerasState(model, epoch=0, batch=0)

    @conflux.keras.elastic.run
    def train(state):
        while state.epoch < EPOCHS:           # one fit per epoch: its data from state.batch on
            x, y = my_shard(state.epoch, skip_batches=state.batch)
            model.fit(x, y, initial_epoch=state.epoch, epochs=state.epoch + 1,
                callbacks=[conflux.keras.elastic.UpdateBatchStateCallback(state),
                           conflux.keras.elastic.UpdateEpochStateCallback(state),
                           conflux.keras.elastic.CommitStateCallback(state, batches_per_commit=2)])

`state.batch` counts the batches done in the current epoch (the next one to run after a reset;
Horovod's callback stores the last batch's index, which runs that batch twice after a reset): put
UpdateBatchStateCallback and UpdateEpochStateCallback before CommitStateCallback, and give fit the
epoch's data without its first `state.batch` batches when it starts again.
"""
import keras

from conflux.tensorflow.elastic import (  # noqa: F401
    HorovodInternalError, HostsUpdatedInterrupt, ObjectState, State, TensorFlowKerasState,
    TensorFlowState, run)


class KerasState(TensorFlowKerasState):
    """A Keras model and optimizer plus plain attributes (Horovod's hvd.elastic.KerasState)."""

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(model, optimizer=optimizer, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """Commits `state` every `batches_per_commit` batches and at the end of each epoch."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit  # the same on every rank after a reset

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps `state.batch` at the number of batches done in the current epoch (0 at its end).
    fit after a reset is given the epoch's remaining data (its first `state.batch` batches
    skipped); Horovod's callback also cut params["steps"], which Keras 3's loop does not read."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self._start = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = self.state.batch

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = self._start + batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0
        self._start = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps `state.epoch` at the next epoch to run, whether fit numbers its epochs from
    initial_epoch=state.epoch or from 0 (Horovod's assumes the latter)."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self._offset = None

    def on_train_begin(self, logs=None):
        self._offset = None

    def on_epoch_begin(self, epoch, logs=None):
        if self._offset is None:  # fit's first epoch is the state's
            self._offset = self.state.epoch - epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = epoch + (self._offset or 0) + 1

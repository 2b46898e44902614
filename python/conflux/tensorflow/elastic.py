"""Elastic training for TensorFlow 2 and Keras 3 (docs/elastic.md, docs/tensorflow.md): Horovod's
hvd.elastic for TF on Conflux's membership rounds (conflux.elastic), under cfxrun --elastic.

    state = cfx.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)

    @cfx.elastic.run
    def train(state):
        ...                     # a tf.GradientTape loop, or model.fit with the Keras callbacks
        state.commit()          # conflux.keras.elastic's CommitStateCallback does it in fit

    train(state)

A TF op that fails because the world was lost raises a tf.errors.OpError whose message carries the
engine's status in brackets ([PEER_LOST], [SHUT_DOWN], [TRANSPORT], [MEMBERSHIP_CHANGED]); run()
turns those into HorovodInternalError, which conflux.elastic.run recovers from: the last commit is
restored, the world formed again, the state synced from the member with the newest commit (the
variables broadcast with the TF ops, the plain attributes pickled), and the function called again.
"""
import contextlib
import functools

import tensorflow as tf

from .. import elastic as _elastic
from ..elastic import (  # noqa: F401  (this module's API)
    HorovodInternalError, HostsUpdatedInterrupt, ObjectState, State, check_host_updates)
from .functions import broadcast_variables

# The engine's statuses that mean the world changed under a collective (tf_ops.cpp's brackets).
_WORLD_LOST = ("[PEER_LOST]", "[SHUT_DOWN]", "[TRANSPORT]", "[MEMBERSHIP_CHANGED]")


def world_lost(error):
    """Whether a tf.errors.OpError is a collective that failed because the world changed."""
    return isinstance(error, tf.errors.OpError) and any(s in str(error) for s in _WORLD_LOST)


@contextlib.contextmanager
def _lost_as_internal():
    try:
        yield
    except tf.errors.OpError as e:
        if world_lost(e):
            raise HorovodInternalError(str(e).splitlines()[0]) from e
        raise


def run(func):
    """hvd.elastic.run for TF: calls `func(state, ...)` again from the last commit after a lost
    worker or newcomers (conflux.elastic.run), a TF op's world-lost error included."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        with _lost_as_internal():
            return func(state, *args, **kwargs)

    return _elastic.run(wrapper)


class TensorFlowState(ObjectState):
    """A list of variables (tf.Variable or Keras variables) plus plain attributes, as Horovod's
    hvd.elastic.TensorFlowState(variables, **kwargs) in TF2 (eager)."""

    def __init__(self, variables=None, session=None, **kwargs):
        if variables is None:
            raise ValueError("TensorFlowState needs the variables to track (TF2 has no global "
                             "variable collection)")
        self.variables = list(variables)
        self._save_variables()
        super().__init__(**kwargs)

    def _tracked(self):
        return self.variables

    def _save_variables(self):
        self._saved_values = [v.numpy() for v in self._tracked()]

    def _load_variables(self):
        tracked = self._tracked()
        if len(tracked) != len(self._saved_values):
            raise RuntimeError("the state tracks %d variables but saved %d: variables were "
                               "created after the state (build the model and the optimizer "
                               "first)" % (len(tracked), len(self._saved_values)))
        for v, value in zip(tracked, self._saved_values):
            v.assign(value)

    def save(self):
        self._save_variables()
        super().save()

    def restore(self):
        self._load_variables()
        super().restore()

    def _sync_from(self, root):
        with _lost_as_internal():
            broadcast_variables(self._tracked(), root)
        super()._sync_from(root)


class TensorFlowKerasState(TensorFlowState):
    """A Keras 3 model and its optimizer (`optimizer` or the model's compiled one) plus plain
    attributes, as Horovod's hvd.elastic.TensorFlowKerasState(model, optimizer, **kwargs). The
    model must be built; the optimizer's variables are built here if they are not yet, so that
    every rank tracks the same variables from the start. `backend` is TF1's and ignored."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        if not getattr(model, "built", True):
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        if self.optimizer is not None and not getattr(self.optimizer, "built", True):
            self.optimizer.build(model.trainable_variables)
        super().__init__(variables=[], **kwargs)

    def _tracked(self):
        opt = list(self.optimizer.variables) if self.optimizer is not None else []
        return list(self.model.variables) + opt

"""Conflux for Keras 3 (the `keras` package on the TensorFlow backend, which is `tf.keras` from
TF 2.16): DistributedOptimizer and Horovod's callbacks, over conflux.tensorflow's ops.

    import keras, conflux.keras as cfx
    cfx.init()
    opt = cfx.DistributedOptimizer(keras.optimizers.SGD(0.01 * cfx.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(x_shard, y_shard, callbacks=[cfx.callbacks.BroadcastGlobalVariablesCallback(0),
                                           cfx.callbacks.MetricAverageCallback()])

Keras 2 (tf-keras, TF_USE_LEGACY_KERAS=1) is not supported (docs/tensorflow.md).
"""
import keras

from conflux.tensorflow import (  # noqa: F401
    Adasum, Average, Compression, Max, Min, Product, Sum,
    allgather, allgather_object, allreduce, alltoall, barrier, broadcast, broadcast_object,
    broadcast_variables, cross_rank, cross_size, grouped_allreduce, init, is_initialized, join,
    local_rank, local_size, rank, reducescatter, shutdown, size)

from . import callbacks  # noqa: F401
from . import elastic  # noqa: F401
from .optimizer import DistributedOptimizer  # noqa: F401

if not keras.__version__.startswith("3."):
    raise ImportError("conflux.keras supports Keras 3; keras %s is installed" % keras.__version__)


def broadcast_global_variables(root_rank):
    raise NotImplementedError("broadcast_global_variables is TF1's; use "
                              "conflux.keras.callbacks.BroadcastGlobalVariablesCallback or "
                              "broadcast_variables(model.variables, root_rank)")


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none):
    """keras.models.load_model with the optimizer wrapped in DistributedOptimizer."""
    model = keras.models.load_model(filepath, custom_objects=custom_objects, compile=True)
    if getattr(model, "optimizer", None) is not None and not getattr(
            model.optimizer, "_cfx_distributed", False):
        model.optimizer = DistributedOptimizer(model.optimizer, compression=compression)
    return model

"""SyncBatchNormalization: Keras 3's BatchNormalization with the batch statistics of every rank's
batch (the sum, the sum of squares and the count allreduced in one grouped op) during training."""
import keras
import tensorflow as tf

from conflux import _core

from . import _ops


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Normalizes with the mean and variance of the global batch (all ranks' batches)."""

    def _moments(self, inputs, mask):
        if mask is not None:
            raise NotImplementedError("SyncBatchNormalization does not take a mask")
        x = tf.cast(inputs, tf.float32)
        axes = list(self._reduction_axes)
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), tf.float32)
        s = tf.reduce_sum(x, axis=axes)
        ss = tf.reduce_sum(tf.square(x), axis=axes)
        s, ss, n = _ops.grouped_allreduce([s, ss, tf.reshape(count, [1])], _core.Sum)
        mean = s / n
        var = tf.maximum(ss / n - tf.square(mean), 0.0)
        return tf.cast(mean, inputs.dtype), tf.cast(var, inputs.dtype)

"""broadcast_variables, broadcast_object, allgather_object."""
import io

import cloudpickle
import numpy as np
import tensorflow as tf

from . import _ops
from .mpi_ops import _var_name


def _broadcast_group(variables, root_rank):
    for v in variables:
        v.assign(_ops.broadcast(tf.convert_to_tensor(v), root_rank, _var_name("broadcast", None, v)))


def broadcast_variables(variables, root_rank, process_set=None, inplace=True):
    """Assigns root_rank's value to each variable on every rank. Eagerly it runs as one
    tf.function, so the broadcasts are in flight together."""
    variables = list(variables)
    if not variables:
        return None
    if tf.executing_eagerly():
        # A closure over the variables (tf.Variable or Keras 3 variables alike), traced per call.
        tf.function(lambda: _broadcast_group(variables, int(root_rank)))()
        return None
    return tf.group(*[v.assign(_ops.broadcast(tf.convert_to_tensor(v), root_rank,
                                              _var_name("broadcast", None, v)))
                      for v in variables])


def _to_bytes(obj):
    b = io.BytesIO()
    cloudpickle.dump(obj, b)
    return np.frombuffer(b.getvalue(), dtype=np.uint8)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=None):
    """root_rank's object (pickled) on every rank."""
    name = name or "broadcast_object"
    payload = _to_bytes(obj) if _ops.MPI_LIB is not None and _rank() == root_rank else np.zeros(0, np.uint8)
    n = _ops.broadcast(tf.constant([payload.size], tf.int64), root_rank, name + ".sz")
    n = int(n.numpy()[0])
    if payload.size != n:
        payload = np.zeros(n, np.uint8)
    data = _ops.broadcast(tf.constant(payload), root_rank, name + ".t").numpy()
    return cloudpickle.loads(data.tobytes())


def allgather_object(obj, session=None, name=None, process_set=None):
    """Every rank's object (pickled), as a list in rank order."""
    name = name or "allgather_object"
    payload = _to_bytes(obj)
    sizes = _ops.allgather(tf.constant([payload.size], tf.int64), name + ".sz").numpy().tolist()
    data = _ops.allgather(tf.constant(payload), name + ".t").numpy().tobytes()
    out, pos = [], 0
    for n in sizes:
        out.append(cloudpickle.loads(data[pos:pos + n]))
        pos += n
    return out


def _rank():
    from conflux import _core
    return _core.rank()

"""Conflux for TensorFlow 2: collectives as TF ops (eager and inside tf.function, with gradients)
and Horovod's TF2 surface.

    import tensorflow as tf
    import conflux.tensorflow as cfx
    cfx.init()
    s = cfx.allreduce(tf.ones([4]), op=cfx.Sum)              # a TF op: eager or in tf.function
    with tf.GradientTape() as tape:
        loss = ...
    tape = cfx.DistributedGradientTape(tape)                  # gradients averaged over ranks
    cfx.broadcast_variables(model.variables, root_rank=0)

The ops are C++ kernels (bindings/tensorflow/tf_ops.cpp) that submit to the engine through its C
ABI and complete from the op library's waiter thread: no Python in the data path. Keras 3:
conflux.keras. Horovod scripts: conflux.horovod.tensorflow (and .keras). docs/tensorflow.md.
"""
import atexit as _atexit

import tensorflow as tf

from conflux import _core
from conflux._core import (  # noqa: F401  (this module's API: the engine's topology)
    cross_rank, cross_size, is_initialized, local_rank, local_size, rank, size)
from conflux._core import Adasum, Average, Max, Min, Product, Sum  # noqa: F401
from conflux.horovod.common import process_sets as _ps
from conflux.horovod.common.exceptions import HorovodInternalError  # noqa: F401
from conflux.horovod.common.process_sets import (  # noqa: F401
    ProcessSet, add_process_set, global_process_set, remove_process_set)
from conflux.horovod.common.util import (  # noqa: F401
    ccl_built, cuda_built, ddl_built, gloo_built, mpi_built, nccl_built, rocm_built)

from . import _ops
from . import elastic  # noqa: F401  (hvd.elastic)
from ._ops import UNAVAILABLE, local_rank_op, local_size_op, rank_op, size_op  # noqa: F401
from .compression import Compression, Compressor, FP16Compressor, NoneCompressor  # noqa: F401
from .functions import allgather_object, broadcast_object, broadcast_variables  # noqa: F401
from .gradient_tape import DistributedGradientTape  # noqa: F401
from .mpi_ops import (  # noqa: F401
    allgather, allreduce, alltoall, barrier, broadcast, broadcast_, grouped_allgather,
    grouped_allreduce, join, reducescatter, grouped_reducescatter)


# ---- init / shutdown / topology ----
def init(comm=None, process_sets=None, **options):
    """Joins the job (collective; a second call does nothing) and points the TF ops at its
    context. Keyword options are cfx_init_options fields (conflux.init). `comm` is Horovod's
    argument (an MPI job is joined from the launcher's world whatever it is); `process_sets` are
    registered as Horovod's hvd.init(process_sets=[...]) does."""
    _ops.require()
    _core.init(**options)
    _ops.set_context(_core.current().address)
    _ps.init_process_sets(process_sets, allgather_object)


def shutdown():
    """Waits for the TF ops in flight (they fail with an Aborted error), then shuts Conflux down
    (and every process set with it)."""
    _ps.shutdown()
    _ops.quiesce()
    _core.shutdown()


def _at_exit():  # registered after conflux._core's: runs first
    _ops.quiesce()


_atexit.register(_at_exit)


def is_homogeneous():
    return True


def mpi_threads_supported():
    return True


def mpi_enabled():
    """Whether this job runs over MPI: the engine says its context's transport is MPI."""
    return _core.is_initialized() and _core.transport_name() == "mpi"


def gloo_enabled():
    """Whether this job runs over Gloo: the engine says its context's transport is Gloo."""
    return _core.is_initialized() and _core.transport_name() == "gloo"


def start_timeline(file_path, mark_cycles=False):
    _core.start_timeline(file_path, mark_cycles)


def stop_timeline():
    _core.stop_timeline()


# Keras 3 is conflux.keras; Horovod's `hvd.keras` is conflux.horovod.tensorflow.keras.


def __getattr__(name):  # SyncBatchNormalization imports keras: only when asked for
    if name == "SyncBatchNormalization":
        from .sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError("module 'conflux.tensorflow' has no attribute %r" % name)

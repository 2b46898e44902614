"""Horovod 0.28's `horovod.tensorflow` (TF2) API on Conflux: `import conflux.horovod.tensorflow as
hvd` is the only change a Horovod TF2 script needs. A thin re-export of conflux.tensorflow
(docs/tensorflow.md, "From Horovod", lists what differs); Keras: conflux.horovod.tensorflow.keras.
"""
from conflux.horovod.common.exceptions import HorovodInternalError  # noqa: F401
from conflux.tensorflow import *  # noqa: F401,F403
from conflux.tensorflow import (  # noqa: F401
    Adasum, Average, Compression, Compressor, DistributedGradientTape, FP16Compressor, Max, Min,
    NoneCompressor, Product, Sum, allgather, allgather_object, allreduce, alltoall, barrier,
    broadcast, broadcast_, broadcast_object, broadcast_variables, ccl_built, cross_rank,
    cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, grouped_allgather,
    grouped_allreduce, grouped_reducescatter, init, is_homogeneous, is_initialized, join,
    local_rank, local_rank_op, local_size, local_size_op, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, rank_op, reducescatter, rocm_built, shutdown, size,
    size_op, start_timeline, stop_timeline)
from . import elastic  # noqa: F401
from conflux.horovod.common.process_sets import ProcessSet, global_process_set  # noqa: F401


def __getattr__(name):
    if name == "SyncBatchNormalization":
        from conflux.tensorflow.sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError("module 'conflux.horovod.tensorflow' has no attribute %r" % name)

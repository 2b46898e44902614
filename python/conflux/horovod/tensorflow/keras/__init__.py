"""Horovod 0.28's `horovod.tensorflow.keras` API for Keras 3 on Conflux: `import
conflux.horovod.tensorflow.keras as hvd` in place of Horovod's. A thin re-export of conflux.keras
(whose DistributedOptimizer and callbacks work with Keras 3, which Horovod's do not)."""
from conflux.keras import *  # noqa: F401,F403
from conflux.keras import (  # noqa: F401
    Adasum, Average, Compression, DistributedOptimizer, Sum, allgather, allgather_object,
    allreduce, alltoall, barrier, broadcast, broadcast_global_variables, broadcast_object,
    broadcast_variables, callbacks, cross_rank, cross_size, grouped_allreduce, init,
    is_initialized, join, load_model, local_rank, local_size, rank, reducescatter, shutdown, size)
from . import elastic  # noqa: F401  (after the re-exports: elastic imports conflux.keras)

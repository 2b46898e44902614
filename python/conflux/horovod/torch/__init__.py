"""Horovod 0.28's `horovod.torch` API on Conflux: `import conflux.horovod.torch as hvd` is the only
change a Horovod training script needs. Names, arguments, defaults, return values and exception
types follow Horovod, and so do the submodules scripts import from (mpi_ops, compression,
functions, optimizer, sync_batch_norm, elastic; conflux.horovod.common.util and .exceptions).
What Conflux does not have raises NotImplementedError naming the feature; elastic training is in
docs/elastic.md. docs/migrating-from-horovod.md lists every difference.
"""
from ..common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from . import elastic  # noqa: F401
from .compression import Compression, Compressor, FP16Compressor, NoneCompressor  # noqa: F401
from .functions import (  # noqa: F401
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters)
from .mpi_ops import (  # noqa: F401
    Adasum, Average, Max, Min, Product, Sum,
    init, shutdown, is_initialized, size, rank, local_rank, local_size, cross_rank, cross_size,
    is_homogeneous, mpi_threads_supported, mpi_enabled, mpi_built, gloo_enabled, gloo_built,
    nccl_built, ddl_built, ccl_built, cuda_built, rocm_built, start_timeline, stop_timeline,
    ProcessSet, global_process_set, add_process_set, remove_process_set,
    poll, synchronize, join, barrier, sparse_allreduce_async,
    allreduce, allreduce_async, allreduce_, allreduce_async_,
    grouped_allreduce, grouped_allreduce_async, grouped_allreduce_, grouped_allreduce_async_,
    allgather, allgather_async, grouped_allgather, grouped_allgather_async,
    broadcast, broadcast_async, broadcast_, broadcast_async_,
    alltoall, alltoall_async,
    reducescatter, reducescatter_async, grouped_reducescatter, grouped_reducescatter_async)
from .optimizer import DistributedOptimizer  # noqa: F401
from .sync_batch_norm import SyncBatchNorm  # noqa: F401

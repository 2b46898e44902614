"""Conflux collectives on torch tensors, DistributedOptimizer and the broadcast helpers.

Nothing here is compiled against torch: a tensor crosses the ABI as (data_ptr(), dtype, shape,
device, stream), so any torch version works. Tensors are kept alive by the handle until the
collective completes. Out-of-place collectives accept non-contiguous tensors (they are made
contiguous first); in-place ones (`..._`) need contiguous tensors.

    import conflux.torch as cfx
    cfx.init()
    opt = cfx.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    cfx.broadcast_parameters(model.state_dict(), root_rank=0)

`shared_empty` / `shared_zeros` make CPU tensors in shared tensor memory (large CPU allreduces on
one host get cheaper; see conflux.shared_array).

Importing this module also registers torch.distributed's backend "conflux"
(`dist.init_process_group("conflux")`, conflux.torch_backend); `ddp_hooks` are its DDP
communication hooks.

This module is the public face: it owns no code of its own but the list of names, and re-exports
them from the modules that hold them, each importing only lower layers (no module imports
conflux.torch): conflux._torch_collectives (the collectives, poll, synchronize, barrier, join),
conflux._torch_compression (the compressors), conflux._torch_broadcast (the broadcast helpers),
conflux.torch_process_sets, conflux.torch_optimizer, conflux.torch_backend and
conflux.torch_elastic.
"""
from . import _capi  # noqa: F401  (conflux.torch._capi: the SWIG module, for tests and tools)
from . import _core
from . import _ops
from ._core import (  # noqa: F401  (re-exported API)
    Adasum, Average, Handle, Max, Min, Product, Sum,
    cross_rank, cross_size, features, init, is_initialized, local_rank, local_size, rank,
    shutdown, size, version, start_timeline, stop_timeline, timeline,
    reform, membership_round, member_id, membership_pending,
)
# The error classes: one per status of the C library (conflux._core.ERROR_NAMES).
globals().update((name, getattr(_core, name)) for name in _core.ERROR_NAMES)

__all__ = list(_core.BASE_NAMES) + list(_ops.NAMES) + [
    "barrier", "join", "poll", "synchronize", "Handle",
    "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
    "broadcast_object", "allgather_object", "Compression", "Compressor", "NoneCompressor",
    "FP16Compressor", "shared_empty", "shared_zeros", "ProcessSet",
] + list(_core.ERROR_NAMES)

# The tensor side of the collectives (dtypes, descriptions, results, shared tensor memory).
from ._torch_adapter import (  # noqa: F401  (shared_empty, shared_zeros: this module's API)
    _CFX_TO_TORCH, _TORCH_TO_CFX, _allocate_host, _check_dtype, _check_tensor, _copy, _describe,
    _strided, _differentiable, _inplace, _input, _output, _output_like, shared_empty, shared_zeros,
    DOCS as _DOCS)

# The collectives on the job's context (every name of conflux._ops.NAMES), barrier, join.
from . import _torch_collectives  # noqa: E402
globals().update((name, getattr(_torch_collectives, name)) for name in _ops.NAMES)
from ._torch_collectives import (  # noqa: F401, E402
    _ADAPTER, _torch_native, barrier, join, poll, synchronize)

from ._torch_compression import (  # noqa: F401, E402
    Compression, Compressor, FP16Compressor, NoneCompressor, _compressible, _wire_compression)
from ._torch_broadcast import (  # noqa: F401, E402
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters)
from .torch_process_sets import ProcessSet  # noqa: F401, E402
from .torch_optimizer import DistributedOptimizer  # noqa: F401, E402

# torch.distributed's backend "conflux" (conflux/torch_backend.py), registered once.
from .torch_backend import ddp_hooks, register as _register_backend  # noqa: F401, E402
_register_backend()

# Elastic training (docs/elastic.md): conflux.torch.elastic.run, TorchState, ObjectState.
from . import torch_elastic as elastic  # noqa: F401, E402

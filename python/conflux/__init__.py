"""Conflux: data-parallel collectives (allreduce, allgather, broadcast, alltoall, reducescatter, ...)
on NumPy arrays, zero-copy for C-contiguous arrays.

    import numpy as np, conflux
    conflux.init()
    g = conflux.allreduce(np.ones(4, np.float32))          # average over ranks, a new array
    conflux.allreduce_(g, op=conflux.Sum)                    # in place
    h = conflux.allreduce_async_(g, name="grad.w"); conflux.synchronize(h)

Every collective exists as a blocking function and an `_async` form that returns a Handle (wait with
`conflux.synchronize(handle)`, test with `conflux.poll(handle)`); names ending in `_` work in place.
Errors decided across ranks (a mismatch, a stall, a lost peer, shut down) raise ConfluxError
subclasses at synchronize on every rank; bad local arguments raise ValueError/TypeError at the call.
`shared_array` allocates arrays in shared tensor memory, which makes large CPU allreduces on one
host cheaper. `GradientSet` registers a model's gradients once and reduces them every step.
PyTorch: `conflux.torch`; Horovod scripts: `conflux.horovod.torch`.
"""
from . import _native_deps  # noqa: F401  (first: which CUDA runtime and NCCL libconflux binds to)
from . import _capi  # noqa: F401  (conflux._capi, conflux._dlpack: imported with the package)
from . import _core
from . import _dlpack  # noqa: F401
from . import _ops
from ._core import (  # noqa: F401  (re-exported API)
    Adasum, Average, Compression, Handle, Max, Min, Product, Sum,
    cross_rank, cross_size, features, init, is_initialized, local_rank, local_size, poll, rank,
    shutdown, size, synchronize, version, start_timeline, stop_timeline, timeline,
    reform, membership_round, member_id, membership_pending,
)
# The error classes: one per status of the C library (conflux._core.ERROR_NAMES).
globals().update((name, getattr(_core, name)) for name in _core.ERROR_NAMES)

__version__ = _core.version()

__all__ = list(_core.BASE_NAMES) + list(_ops.NAMES) + [
    "barrier", "barrier_async", "join", "join_async", "poll", "synchronize", "Handle",
    "shared_array", "GradientSet", "ProcessSet", "Compression",
] + list(_core.ERROR_NAMES)

# The array side of the collectives (dtypes, descriptions, results, shared tensor memory) is
# conflux._numpy's, shared with gradset and process_sets.
from ._numpy import (  # noqa: F401, E402  (shared_array: this module's API)
    _CFX_TO_NP, _NP_TO_CFX, _address, _allocate, _copy, _describe, _dtype_code, _inplace, _input,
    _output_like, shared_array, ADAPTER as _ADAPTER, DOCS as _DOCS)

_ops.install(globals(), _ADAPTER, _DOCS)


# ---- barrier, join ----
barrier_async = _core.barrier_async
join_async = _core.join_async


def barrier():
    """Returns once every rank reached the barrier."""
    _core.barrier()


def join():
    """Declares that this rank has no more data; returns the rank that joined last once all did."""
    return join_async().wait()


# ---- gradient sets, process sets ----
from .gradset import GradientSet  # noqa: E402
from .process_sets import ProcessSet  # noqa: E402

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
host cheaper. PyTorch: `conflux.torch`; Horovod scripts: `conflux.horovod.torch`.
"""
import math as _math

import numpy as _np

from . import _capi
from . import _core
from ._core import (  # noqa: F401  (re-exported API)
    Average, Handle, Max, Min, Product, Sum,
    cross_rank, cross_size, features, init, is_initialized, local_rank, local_size, poll, rank,
    shutdown, size, synchronize, version, start_timeline, stop_timeline,
    ConfluxError, InvalidArgumentError, NotInitializedError, ShutDownError, DuplicateNameError,
    MismatchError, UnsupportedError, OutOfMemoryError, TransportError, WaitTimeoutError,
    InProgressError, StaleHandleError, StallError, PeerLostError, ConfigError, VersionError,
    JoinedError, InternalError, CudaError, NcclError, DtypeError,
)

__version__ = _core.version()

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "version", "features", "start_timeline", "stop_timeline",
    "Sum", "Average", "Min", "Max", "Product",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async",
    "barrier", "barrier_async", "join", "join_async", "poll", "synchronize", "Handle",
    "shared_array",
] + list(_core.ERROR_NAMES)

# ---- numpy dtypes <-> ABI dtypes ----
_NP_TO_CFX = {
    _np.dtype(_np.uint8): _core.UINT8,
    _np.dtype(_np.int8): _core.INT8,
    _np.dtype(_np.uint16): _core.UINT16,
    _np.dtype(_np.int16): _core.INT16,
    _np.dtype(_np.int32): _core.INT32,
    _np.dtype(_np.int64): _core.INT64,
    _np.dtype(_np.float16): _core.FLOAT16,
    _np.dtype(_np.float32): _core.FLOAT32,
    _np.dtype(_np.float64): _core.FLOAT64,
    _np.dtype(_np.bool_): _core.BOOL,
}
_CFX_TO_NP = {code: dt for dt, code in _NP_TO_CFX.items()}


def _dtype_code(dtype):
    code = _NP_TO_CFX.get(dtype)
    if code is None:
        why = ""
        if dtype.byteorder not in ("=", "|") and dtype.newbyteorder("=") in _NP_TO_CFX:
            why = " (non-native byte order)"
        raise _core.DtypeError("numpy dtype %s%s is not supported by Conflux; supported: %s"
                        % (dtype, why, ", ".join(str(d) for d in _NP_TO_CFX)))
    return code


def _describe(a, what="array"):
    """(address, dtype, shape) of a C-contiguous ndarray: the ABI reads and writes its memory."""
    code = _dtype_code(a.dtype)
    if not a.flags.c_contiguous:
        raise ValueError("%s must be C-contiguous (use numpy.ascontiguousarray)" % what)
    return (a.__array_interface__["data"][0], code, a.shape)


def _inplace(a, what="array"):
    if not isinstance(a, _np.ndarray):
        raise TypeError("in-place %s needs a numpy.ndarray, not %s" % (what, type(a).__name__))
    _dtype_code(a.dtype)
    if not a.flags.c_contiguous:
        raise ValueError("in-place %s needs a C-contiguous array" % what)
    if not a.flags.writeable:
        raise ValueError("in-place %s needs a writeable array" % what)
    return a


def _input(a):
    """An ndarray for an out-of-place input: the caller's array itself when it is C-contiguous."""
    if not isinstance(a, _np.ndarray):
        a = _np.asarray(a)
    _dtype_code(a.dtype)
    if not a.flags.c_contiguous:
        a = _np.ascontiguousarray(a)
    return a


def _allocate(code, shape):
    out = _np.empty(shape, dtype=_CFX_TO_NP[code])
    return out, out.__array_interface__["data"][0], out.nbytes


def shared_array(shape, dtype=_np.float32):
    """A new C-contiguous array in shared tensor memory (cfx_alloc), contents undefined like
    numpy.empty. The other ranks on this host read and write it directly, so a CPU allreduce whose
    tensors lie in such memory on every local rank skips the copies through Conflux's buffers.
    Works before init(). The memory is freed when the array and every view of it (and every torch
    tensor made from it) have been collected, and not before a collective using it completed.
    OutOfMemoryError when the pool (CFX_SHARED_POOL_BYTES) has no room."""
    dtype = _np.dtype(dtype)
    _dtype_code(dtype)
    shape = _core.check_shape(shape)
    return _core.shared_bytes(_math.prod(shape) * dtype.itemsize).view(dtype).reshape(shape)


def _output_like(a):
    """An out-of-place result for input `a`: in shared tensor memory when `a` is (so the batch can
    still take the direct path), else an ordinary array."""
    if _capi.cfx_is_shared(a.__array_interface__["data"][0], a.nbytes):
        return shared_array(a.shape, a.dtype)
    return _np.empty_like(a, order="C")


def _scale(v, what):
    try:
        return float(v)
    except (TypeError, ValueError):
        raise TypeError("%s must be a number" % what) from None


# ---- allreduce ----
def allreduce_async_(array, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Starts an in-place allreduce of `array`; synchronize() returns `array`."""
    a = _inplace(array, "allreduce")
    return _core.submit(_capi.cfx_allreduce_async,
                        (_core.check_name(name), _describe(a), None, _core.check_op(op),
                         _scale(prescale_factor, "prescale_factor"),
                         _scale(postscale_factor, "postscale_factor")),
                        a, lambda h: a, "allreduce", name)


def allreduce_async(array, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Starts an allreduce into a new array; synchronize() returns it."""
    a = _input(array)
    out = _output_like(a)
    return _core.submit(_capi.cfx_allreduce_async,
                        (_core.check_name(name), _describe(a), out.__array_interface__["data"][0],
                         _core.check_op(op), _scale(prescale_factor, "prescale_factor"),
                         _scale(postscale_factor, "postscale_factor")),
                        (a, out), lambda h: out, "allreduce", name)


def allreduce(array, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `array` over all ranks: postscale * op(prescale * x) (Average divides by size too).
    Returns a new array."""
    return allreduce_async(array, op, name, prescale_factor, postscale_factor).wait()


def allreduce_(array, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """In-place allreduce; returns `array`."""
    return allreduce_async_(array, op, name, prescale_factor, postscale_factor).wait()


def _grouped(arrays, inplace, op, name, prescale_factor, postscale_factor):
    arrays = list(arrays)
    if inplace:
        ins = [_inplace(a, "grouped_allreduce") for a in arrays]
        outs = ins
        out_ptrs = None
    else:
        ins = [_input(a) for a in arrays]
        outs = [_output_like(a) for a in ins]
        out_ptrs = [o.__array_interface__["data"][0] for o in outs]
    return _core.submit(_capi.cfx_grouped_allreduce_async,
                        (_core.check_name(name), [_describe(a) for a in ins], out_ptrs,
                         _core.check_op(op), _scale(prescale_factor, "prescale_factor"),
                         _scale(postscale_factor, "postscale_factor")),
                        (ins, outs), lambda h: list(outs), "grouped_allreduce", name)


def grouped_allreduce_async(arrays, op=Average, name=None, prescale_factor=1.0,
                            postscale_factor=1.0):
    """Starts one allreduce of a list of arrays, negotiated and completed together."""
    return _grouped(arrays, False, op, name, prescale_factor, postscale_factor)


def grouped_allreduce_async_(arrays, op=Average, name=None, prescale_factor=1.0,
                             postscale_factor=1.0):
    return _grouped(arrays, True, op, name, prescale_factor, postscale_factor)


def grouped_allreduce(arrays, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Allreduces a list of arrays together; returns a list of new arrays."""
    return _grouped(arrays, False, op, name, prescale_factor, postscale_factor).wait()


def grouped_allreduce_(arrays, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """In-place grouped allreduce; returns the list of arrays."""
    return _grouped(arrays, True, op, name, prescale_factor, postscale_factor).wait()


# ---- allgather ----
def allgather_async(array, name=None):
    a = _input(array)
    if a.ndim == 0:
        raise ValueError("allgather needs at least one dimension (got a scalar)")
    return _core.submit(_capi.cfx_allgather_async, (_core.check_name(name), _describe(a)), a,
                        lambda h: h.output(0, _allocate), "allgather", name)


def allgather(array, name=None):
    """Concatenates every rank's array along dim 0 (dim 0 may differ per rank)."""
    return allgather_async(array, name).wait()


def grouped_allgather_async(arrays, name=None):
    ins = [_input(a) for a in arrays]
    return _core.submit(_capi.cfx_grouped_allgather_async,
                        (_core.check_name(name), [_describe(a) for a in ins]), ins,
                        lambda h: [h.output(i, _allocate) for i in range(len(ins))],
                        "grouped_allgather", name)


def grouped_allgather(arrays, name=None):
    return grouped_allgather_async(arrays, name).wait()


# ---- broadcast ----
def broadcast_async_(array, root_rank, name=None):
    a = _inplace(array, "broadcast")
    return _core.submit(_capi.cfx_broadcast_async,
                        (_core.check_name(name), _describe(a), _core.check_root(root_rank)),
                        a, lambda h: a, "broadcast", name)


def broadcast_async(array, root_rank, name=None):
    out = _np.array(_input(array), order="C", copy=True)
    return broadcast_async_(out, root_rank, name)


def broadcast(array, root_rank, name=None):
    """Returns a new array holding root_rank's values."""
    return broadcast_async(array, root_rank, name).wait()


def broadcast_(array, root_rank, name=None):
    """Overwrites `array` with root_rank's values; returns it."""
    return broadcast_async_(array, root_rank, name).wait()


# ---- alltoall ----
def alltoall_async(array, splits=None, name=None):
    a = _input(array)
    if a.ndim == 0:
        raise ValueError("alltoall needs at least one dimension (got a scalar)")

    def finish(h):
        return h.output(0, _allocate), _np.array(h.splits(0), dtype=_np.int64)

    return _core.submit(_capi.cfx_alltoall_async,
                        (_core.check_name(name), _describe(a), _core.check_splits(splits)),
                        a, finish, "alltoall", name)


def alltoall(array, splits=None, name=None):
    """Sends splits[j] rows (dim 0) to rank j (equal split when None). Returns
    (received, received_splits)."""
    return alltoall_async(array, splits, name).wait()


# ---- reducescatter ----
def reducescatter_async(array, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    a = _input(array)
    if a.ndim == 0:
        raise ValueError("reducescatter needs at least one dimension (got a scalar)")
    return _core.submit(_capi.cfx_reducescatter_async,
                        (_core.check_name(name), _describe(a), _core.check_op(op),
                         _scale(prescale_factor, "prescale_factor"),
                         _scale(postscale_factor, "postscale_factor")),
                        a, lambda h: h.output(0, _allocate), "reducescatter", name)


def reducescatter(array, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces over ranks and returns this rank's block of dim 0 (the first d0 % size ranks get one
    extra row)."""
    return reducescatter_async(array, op, name, prescale_factor, postscale_factor).wait()


def grouped_reducescatter_async(arrays, op=Average, name=None, prescale_factor=1.0,
                                postscale_factor=1.0):
    ins = [_input(a) for a in arrays]
    return _core.submit(_capi.cfx_grouped_reducescatter_async,
                        (_core.check_name(name), [_describe(a) for a in ins], _core.check_op(op),
                         _scale(prescale_factor, "prescale_factor"),
                         _scale(postscale_factor, "postscale_factor")),
                        ins, lambda h: [h.output(i, _allocate) for i in range(len(ins))],
                        "grouped_reducescatter", name)


def grouped_reducescatter(arrays, op=Average, name=None, prescale_factor=1.0,
                          postscale_factor=1.0):
    return grouped_reducescatter_async(arrays, op, name, prescale_factor, postscale_factor).wait()


# ---- barrier, join ----
barrier_async = _core.barrier_async
join_async = _core.join_async


def barrier():
    """Returns once every rank reached the barrier."""
    barrier_async().wait()


def join():
    """Declares that this rank has no more data; returns the rank that joined last once all did."""
    return join_async().wait()

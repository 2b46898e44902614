"""The array side of conflux's collectives: numpy dtypes and the ABI's, how an array (or a DLPack
tensor) is checked, described, copied and allocated (shared tensor memory too), and the Adapter and
docstrings that conflux._ops.install() takes. conflux, conflux.gradset and conflux.process_sets
build on it; it imports no module of the package that imports it.
"""
import math as _math

import numpy as _np

from . import _args
from . import _capi
from . import _core
from . import _dlpack
from . import _ops

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


# The address of a C-contiguous array's memory (the buffer protocol; __array_interface__ builds a
# dict on every call).
_address = _core.data_address


def _describe(a, what="array"):
    """(address, dtype, shape) of a C-contiguous ndarray: the ABI reads and writes its memory."""
    code = _dtype_code(a.dtype)
    if not a.flags.c_contiguous:
        raise ValueError("%s must be C-contiguous (use numpy.ascontiguousarray)" % what)
    return (_address(a), code, a.shape)


def _inplace(a, what="array"):
    if not isinstance(a, _np.ndarray):
        if not _dlpack.supports(a):
            raise TypeError("in-place %s needs a numpy.ndarray or a DLPack tensor, not %s"
                            % (what, type(a).__name__))
        a = _dlpack.as_ndarray(a, "in-place " + what)
    _dtype_code(a.dtype)
    if not a.flags.c_contiguous:
        raise ValueError("in-place %s needs a C-contiguous array" % what)
    if not a.flags.writeable:
        raise ValueError("in-place %s needs a writeable array" % what)
    return a


def _input(a, what):
    """An ndarray for an out-of-place input: the caller's array itself when it is C-contiguous.
    `what` (the op) goes unused: numpy's errors here name the dtype."""
    if not isinstance(a, _np.ndarray):
        a = _dlpack.as_ndarray(a, what) if _dlpack.supports(a) else _np.asarray(a)
    _dtype_code(a.dtype)
    if not a.flags.c_contiguous:
        a = _np.ascontiguousarray(a)
    return a


def _allocate(code, shape):
    out = _np.empty(shape, dtype=_CFX_TO_NP[code])
    return out, _address(out), out.nbytes


def shared_array(shape, dtype=_np.float32):
    """A new C-contiguous array in shared tensor memory (cfx_alloc), contents undefined like
    numpy.empty. The other ranks on this host read and write it directly, so a CPU allreduce whose
    tensors lie in such memory on every local rank skips the copies through Conflux's buffers.
    Works before init(). The memory is freed when the array and every view of it (and every torch
    tensor made from it) have been collected, and not before a collective using it completed.
    OutOfMemoryError when the pool (CFX_SHARED_POOL_BYTES) has no room."""
    dtype = _np.dtype(dtype)
    _dtype_code(dtype)
    shape = _args.check_shape(shape)
    return _core.shared_bytes(_math.prod(shape) * dtype.itemsize).view(dtype).reshape(shape)


def _output_like(a):
    """An out-of-place result for input `a` and its address: in shared tensor memory when `a` is
    (so the batch can still take the direct path), else an ordinary array."""
    if _capi.cfx_is_shared(_address(a), a.nbytes):
        out = shared_array(a.shape, a.dtype)
    else:
        out = _np.empty_like(a, order="C")
    return out, _address(out)


def _copy(a, what):
    return _np.array(_input(a, what), order="C", copy=True)


# ---- the collectives (conflux._ops.OPS) ----
DOCS = {
    "allreduce": "Reduces `array` over all ranks: postscale * op(prescale * x) (Average divides by "
                 "size too).\nReturns a new array. `compression` (a Compression) sends float32 and "
                 "float64 values as 16-bit\nfloats where it applies (docs/python.md "
                 "\"Compression\").",
    "allreduce_": "In-place allreduce; returns `array`.",
    "allreduce_async": "Starts an allreduce into a new array; synchronize() returns it.",
    "allreduce_async_": "Starts an in-place allreduce of `array`; synchronize() returns `array`.",
    "grouped_allreduce": "Allreduces a list of arrays together; returns a list of new arrays.",
    "grouped_allreduce_": "In-place grouped allreduce; returns the list of arrays.",
    "grouped_allreduce_async": "Starts one allreduce of a list of arrays, negotiated and completed "
                               "together.",
    "allgather": "Concatenates every rank's array along dim 0 (dim 0 may differ per rank).",
    "broadcast": "Returns a new array holding root_rank's values.",
    "broadcast_": "Overwrites `array` with root_rank's values; returns it.",
    "alltoall": "Sends splits[j] rows (dim 0) to rank j (equal split when None). Returns\n"
                "(received, received_splits).",
    "reducescatter": "Reduces over ranks and returns this rank's block of dim 0 (the first d0 % "
                     "size ranks get one\nextra row).",
}
ADAPTER = _ops.Adapter(
    inplace=_inplace, input=_input, copy=_copy, describe=_describe,
    output_like=_output_like, ndim=lambda a: a.ndim,
    output=lambda handle, index, like: handle.output(index, _allocate),
    as_splits=lambda splits: _np.array(splits, dtype=_np.int64), autograd={}, differentiable=None)

"""DLPack for the NumPy functions: any object with __dlpack__ / __dlpack_device__ (JAX, CuPy,
TensorFlow, torch, numpy itself, ...) becomes a writeable ndarray over the same memory, zero-copy.

numpy.from_dlpack (NumPy 1.24) returns read-only arrays, so the capsule is read here with ctypes:
the DLManagedTensor is taken over (the capsule renamed "used_dltensor", as the protocol says) and
its deleter runs once the ndarray and every view of it are collected, that is after the operation
that used it completed."""
import ctypes as _ct

import numpy as _np


class _DLDevice(_ct.Structure):
    _fields_ = [("device_type", _ct.c_int32), ("device_id", _ct.c_int32)]


class _DLDataType(_ct.Structure):
    _fields_ = [("code", _ct.c_uint8), ("bits", _ct.c_uint8), ("lanes", _ct.c_uint16)]


class _DLTensor(_ct.Structure):
    _fields_ = [("data", _ct.c_void_p), ("device", _DLDevice), ("ndim", _ct.c_int32),
                ("dtype", _DLDataType), ("shape", _ct.POINTER(_ct.c_int64)),
                ("strides", _ct.POINTER(_ct.c_int64)), ("byte_offset", _ct.c_uint64)]


class _DLManagedTensor(_ct.Structure):
    pass


_DELETER = _ct.CFUNCTYPE(None, _ct.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", _ct.c_void_p),
                             ("deleter", _DELETER)]

KDL_CPU = 1
KDL_CUDA = 2
_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host", 4: "OpenCL", 7: "Vulkan", 8: "Metal",
                 9: "VPI", 10: "ROCm", 11: "ROCm host", 13: "CUDA managed", 14: "oneAPI"}
# (DLPack type code, bits) -> numpy dtype; codes: 0 int, 1 uint, 2 float, 6 bool
_DTYPES = {(0, 8): _np.int8, (0, 16): _np.int16, (0, 32): _np.int32, (0, 64): _np.int64,
           (1, 8): _np.uint8, (1, 16): _np.uint16, (2, 16): _np.float16, (2, 32): _np.float32,
           (2, 64): _np.float64, (6, 8): _np.bool_}
_CODE_NAMES = {0: "int", 1: "uint", 2: "float", 3: "opaque handle", 4: "bfloat", 5: "complex",
               6: "bool"}

_capsule_valid = _ct.pythonapi.PyCapsule_IsValid
_capsule_valid.restype, _capsule_valid.argtypes = _ct.c_int, [_ct.py_object, _ct.c_char_p]
_capsule_pointer = _ct.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = _ct.c_void_p, [_ct.py_object, _ct.c_char_p]
_capsule_rename = _ct.pythonapi.PyCapsule_SetName
_capsule_rename.restype, _capsule_rename.argtypes = _ct.c_int, [_ct.py_object, _ct.c_char_p]
_USED = _ct.c_char_p(b"used_dltensor")   # the capsule keeps this pointer: it lives with the module


def supports(x):
    """Whether x offers DLPack (and is not an ndarray, which the NumPy functions take directly)."""
    return not isinstance(x, _np.ndarray) and hasattr(type(x), "__dlpack__")


def device(x):
    """x's (DLPack device type, device id)."""
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None:
        raise TypeError("%s has __dlpack__ but no __dlpack_device__" % type(x).__name__)
    kind, index = dev()
    return int(kind), int(index)


class _Owner:
    """Holds one DLManagedTensor taken from a capsule; numpy arrays over its memory keep it alive
    (their base), and the producer's deleter runs when it goes."""

    def __init__(self, managed):
        self._managed = managed

    def __del__(self):
        managed, self._managed = self._managed, None
        if managed and managed.contents.deleter:
            managed.contents.deleter(managed)


def as_ndarray(x, what="array"):
    """A writeable C-contiguous ndarray over the memory of x (CPU DLPack), zero-copy. A tensor on
    another device, a non-contiguous one or a dtype NumPy and Conflux do not share raise naming
    `what` and the value."""
    kind, index = device(x)
    if kind != KDL_CPU:
        raise ValueError("%s: a DLPack tensor on %s device %d; conflux's NumPy functions take CPU "
                         "memory (torch CUDA tensors: conflux.torch, e.g. via torch.from_dlpack)"
                         % (what, _DEVICE_NAMES.get(kind, "type %d" % kind), index))
    capsule = x.__dlpack__()
    if not _capsule_valid(capsule, b"dltensor"):
        raise ValueError("%s: %s.__dlpack__() did not return an unused 'dltensor' capsule"
                         % (what, type(x).__name__))
    managed = _ct.cast(_capsule_pointer(capsule, b"dltensor"), _ct.POINTER(_DLManagedTensor))
    if _capsule_rename(capsule, _USED) != 0:
        raise ValueError("%s: cannot mark the DLPack capsule used" % what)
    owner = _Owner(managed)   # from here on the deleter runs whatever happens
    t = managed.contents.dl_tensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    dt = t.dtype
    np_dtype = _DTYPES.get((dt.code, dt.bits)) if dt.lanes == 1 else None
    if np_dtype is None:
        raise _dtype_error("%s: DLPack dtype %s%d%s is not supported by Conflux's NumPy functions; "
                           "supported: %s" % (what, _CODE_NAMES.get(dt.code, "code %d" % dt.code),
                                              dt.bits, "x%d" % dt.lanes if dt.lanes != 1 else "",
                                              ", ".join(_np.dtype(d).name for d in _DTYPES.values())))
    np_dtype = _np.dtype(np_dtype)
    if t.strides:
        expected = 1
        for i in reversed(range(t.ndim)):
            if shape[i] != 1 and t.strides[i] != expected:
                raise ValueError("%s must be C-contiguous: DLPack shape %s, strides %s (elements)"
                                 % (what, shape, tuple(t.strides[j] for j in range(t.ndim))))
            expected *= shape[i]
    if 0 in shape:
        return _np.empty(shape, np_dtype)   # the owner goes now: no memory to keep
    owner.__array_interface__ = {"version": 3, "typestr": np_dtype.str, "shape": shape,
                                 "data": ((t.data or 0) + t.byte_offset, False)}
    return _np.asarray(owner)


def _dtype_error(message):
    from . import _core
    return _core.DtypeError(message)

"""DLPack objects in the NumPy functions (size 1, no mpirun): numpy's and torch's __dlpack__, an
object offering only __dlpack__/__dlpack_device__, and a producer written here with ctypes whose
deleter counts its calls, so the protocol (capsule renamed "used_dltensor", deleter called once,
after the operation) is checked, not assumed. The multi-rank sums: ../mpi/test_dlpack.py."""
import ctypes as ct
import gc

import numpy as np
import pytest

import conflux
from conflux import _dlpack

torch = pytest.importorskip("torch", reason="torch (python3-torch) is needed for its DLPack tensors")


@pytest.fixture(autouse=True)
def initialized():
    conflux.init()
    yield


class CapsuleOnly:
    """Only the two DLPack methods, over some other object's __dlpack__."""

    def __init__(self, inner, dev=None):
        self.inner, self.dev = inner, dev

    def __dlpack__(self, stream=None):
        return self.inner.__dlpack__()

    def __dlpack_device__(self):
        return self.dev or self.inner.__dlpack_device__()


_new_capsule = ct.pythonapi.PyCapsule_New
_new_capsule.restype, _new_capsule.argtypes = ct.py_object, [ct.c_void_p, ct.c_char_p, ct.c_void_p]
_capsule_name = ct.pythonapi.PyCapsule_GetName
_capsule_name.restype, _capsule_name.argtypes = ct.c_char_p, [ct.py_object]


class CtypesProducer:
    """A DLPack producer over a numpy buffer, with its own shape, strides, dtype and device; the
    deleter records each call."""

    def __init__(self, buf, shape, strides=None, code=2, bits=32, lanes=1, dev=(1, 0), offset=0):
        self.buf, self.dev, self.deleted, self.capsules = buf, dev, 0, []
        n = len(shape)
        self._shape = (ct.c_int64 * n)(*shape)
        self._strides = (ct.c_int64 * n)(*strides) if strides is not None else None
        m = _dlpack._DLManagedTensor()
        t = m.dl_tensor
        t.data = buf.ctypes.data
        t.device = _dlpack._DLDevice(*dev)
        t.ndim = n
        t.dtype = _dlpack._DLDataType(code, bits, lanes)
        t.shape = ct.cast(self._shape, ct.POINTER(ct.c_int64))
        t.strides = ct.cast(self._strides, ct.POINTER(ct.c_int64)) if strides is not None else None
        t.byte_offset = offset

        def deleter(_):
            self.deleted += 1
        self._deleter = _dlpack._DELETER(deleter)
        m.deleter = self._deleter
        self.managed = m

    def __dlpack__(self, stream=None):
        c = _new_capsule(ct.addressof(self.managed), b"dltensor", None)
        self.capsules.append(c)
        return c

    def __dlpack_device__(self):
        return self.dev


def test_numpy_dlpack_in_place_writes_the_original_memory():
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    assert conflux.allreduce_(CapsuleOnly(a), op=conflux.Sum).inner is a
    np.testing.assert_array_equal(a, np.arange(12).reshape(3, 4))   # size 1: the sum is a itself
    v = _dlpack.as_ndarray(CapsuleOnly(a))
    v[1, 2] = -5
    assert a[1, 2] == -5 and v.flags.writeable and np.shares_memory(v, a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64,
                                   torch.float16, torch.uint8, torch.int8, torch.int16])
def test_torch_dlpack_zero_copy(dtype):
    t = torch.arange(-3, 9).reshape(2, 6).to(dtype)
    want = t.clone()
    for x in (t, CapsuleOnly(t)):
        v = _dlpack.as_ndarray(x)
        assert v.shape == (2, 6) and v.dtype == torch.empty(0, dtype=dtype).numpy().dtype
        assert v.ctypes.data == t.data_ptr()
        assert conflux.allreduce_(x, op=conflux.Sum) is x
        out = conflux.allreduce(x, op=conflux.Max)
        assert isinstance(out, np.ndarray)
        np.testing.assert_array_equal(out, want.numpy())
    np.testing.assert_array_equal(t.numpy(), want.numpy())
    v[0, 0] = 7
    assert t[0, 0].item() == 7


def test_protocol_capsule_renamed_deleter_called_once_after_the_operation():
    buf = np.arange(6, dtype=np.float32)
    p = CtypesProducer(buf, (2, 3))
    h = conflux.allreduce_async_(p, op=conflux.Sum, name="dl.async")
    assert _capsule_name(p.capsules[0]) == b"used_dltensor"
    assert conflux.synchronize(h) is p
    del h
    gc.collect()
    assert p.deleted == 1
    v = _dlpack.as_ndarray(p)
    assert p.deleted == 1
    del v
    gc.collect()
    assert p.deleted == 2
    np.testing.assert_array_equal(buf, np.arange(6))


def test_protocol_strides_offset_and_size_one_dims():
    buf = np.arange(8, dtype=np.float32)
    p = CtypesProducer(buf, (1, 3), strides=(99, 1), offset=8)   # a size-1 dim's stride is free
    v = _dlpack.as_ndarray(p)
    np.testing.assert_array_equal(v, [[2, 3, 4]])
    v[0, 0] = 40
    assert buf[2] == 40
    assert np.shares_memory(v, buf)


def test_gradient_set_borrows_dlpack_memory():
    t = torch.zeros(5, dtype=torch.float64)
    with conflux.GradientSet("dl.unit", op=conflux.Sum, owned=False) as gs:
        i = gs.add("g", array=CapsuleOnly(t))
        gs.commit()
        t.copy_(torch.arange(5.0) * 3)
        gs.ready(i)
        gs.wait(timeout=30)
        assert gs.array(i).ctypes.data == t.data_ptr()
    np.testing.assert_array_equal(t.numpy(), np.arange(5.0) * 3)


def test_errors_name_what_was_wrong():
    with pytest.raises(ValueError, match="C-contiguous.*strides"):
        conflux.allreduce_(torch.zeros(3, 4).t())
    with pytest.raises(conflux.DtypeError, match="complex64"):
        conflux.allreduce_(torch.zeros(3, dtype=torch.complex64))
    buf = np.zeros(4, np.float32)
    with pytest.raises(conflux.DtypeError, match="float32x4"):
        conflux.allreduce(CtypesProducer(buf, (1,), lanes=4))
    with pytest.raises(conflux.DtypeError, match="bfloat16"):
        conflux.allreduce(CtypesProducer(buf, (4,), code=4, bits=16))
    cuda = CtypesProducer(buf, (4,), dev=(2, 1))
    with pytest.raises(ValueError, match="CUDA device 1.*CPU memory"):
        conflux.allreduce_(cuda)
    assert cuda.capsules == []             # refused before the capsule was taken
    with pytest.raises(ValueError, match="CUDA device 0"):
        conflux.allreduce_(CapsuleOnly(torch.zeros(2), dev=(2, 0)))
    refused = CtypesProducer(buf, (2, 2), strides=(1, 2))
    with pytest.raises(ValueError, match="C-contiguous"):
        conflux.allreduce_(refused)
    gc.collect()
    assert refused.deleted == 1            # a refused capsule is still handed back to its producer

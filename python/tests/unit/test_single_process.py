"""Single-process tests (size 1, no mpirun): the API surface, argument errors, handles, and
init/shutdown cycles. The multi-rank behaviour is in ../mpi."""
import gc
import os
import subprocess
import sys

import numpy as np
import pytest

import conflux

ISSUE_NAMES = """
init shutdown is_initialized rank size local_rank local_size cross_rank cross_size version features
Sum Average Min Max Product allreduce allreduce_ allreduce_async allreduce_async_ grouped_allreduce
grouped_allreduce_ grouped_allreduce_async grouped_allreduce_async_ allgather broadcast broadcast_
alltoall reducescatter barrier join allgather_async broadcast_async broadcast_async_ alltoall_async
reducescatter_async poll synchronize ConfluxError
""".split()


@pytest.fixture(autouse=True)
def initialized():
    conflux.init()
    yield


def test_names():
    missing = [n for n in ISSUE_NAMES if not hasattr(conflux, n)]
    assert not missing
    assert set(conflux.__all__) <= set(dir(conflux))
    assert [conflux.Sum, conflux.Average, conflux.Min, conflux.Max, conflux.Product] == \
        [0, 1, 2, 3, 4]


def test_version_and_features():
    v = conflux.version()
    assert v.count(".") == 2 and all(p.isdigit() for p in v.split("."))
    assert conflux.__version__ == v
    f = conflux.features()
    assert set(f) == {"mpi", "cuda", "nccl", "cuda_device", "local"}
    assert f["local"] is True
    assert all(isinstance(b, bool) for b in f.values())


def test_exception_hierarchy():
    assert issubclass(conflux.ConfluxError, RuntimeError)
    for name in ("MismatchError", "StallError", "PeerLostError", "ShutDownError",
                 "TransportError", "JoinedError", "InternalError", "WaitTimeoutError"):
        cls = getattr(conflux, name)
        assert issubclass(cls, conflux.ConfluxError), name
        assert cls.__module__ == "conflux"
    assert issubclass(conflux.DuplicateNameError, ValueError)
    assert issubclass(conflux.InvalidArgumentError, ValueError)
    assert issubclass(conflux.NotInitializedError, ValueError)
    assert issubclass(conflux.NotInitializedError, conflux.ConfluxError)
    assert issubclass(conflux.UnsupportedError, NotImplementedError)
    assert issubclass(conflux.DtypeError, TypeError) and issubclass(conflux.DtypeError, ValueError)
    assert conflux.MismatchError.status == 5 and conflux.DuplicateNameError.status == 4


def _camel_error(status_name):
    return "".join(part.capitalize() for part in status_name.split("_")) + "Error"


def test_error_classes_come_from_the_c_status_list():
    """One class per C status (cfx_status_name, counted up from 1 until NULL), named after it,
    carrying its code, exported by conflux and conflux.torch alike; TIMEOUT is WaitTimeoutError
    (Python's own TimeoutError keeps its name)."""
    import conflux.torch as ct
    names = []
    while conflux._capi.cfx_status_name(len(names) + 1) is not None:
        names.append(conflux._capi.cfx_status_name(len(names) + 1))
    assert conflux._capi.cfx_status_name(0) == "OK"
    assert len(names) + 1 == conflux._capi.CFX_STATUS_COUNT
    assert names[4] == "MISMATCH" and names[12] == "PEER_LOST"  # the header's values 5 and 13
    for code, name in enumerate(names, start=1):
        cls_name = "WaitTimeoutError" if name == "TIMEOUT" else _camel_error(name)
        cls = getattr(conflux, cls_name)
        assert cls.status == code, (name, cls.status)
        assert name in cls.__doc__ and conflux._capi.cfx_status_string(code) in cls.__doc__
        assert getattr(ct, cls_name) is cls and cls_name in conflux.__all__
        assert issubclass(cls, (conflux.ConfluxError, ValueError)), cls_name
    assert len(conflux._core.STATUS_ERRORS) == len(names)


def test_size_one_topology():
    assert conflux.is_initialized()
    assert (conflux.rank(), conflux.size()) == (0, 1)
    assert (conflux.local_rank(), conflux.local_size()) == (0, 1)
    assert (conflux.cross_rank(), conflux.cross_size()) == (0, 1)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint16", "int16", "int32", "int64", "float16",
                                   "float32", "float64", "bool"])
def test_size_one_collectives_are_identity(dtype):
    a = (np.arange(12) % 5).astype(dtype).reshape(3, 4)
    np.testing.assert_array_equal(conflux.allreduce(a, op=conflux.Sum), a)
    np.testing.assert_array_equal(conflux.allgather(a), a)
    np.testing.assert_array_equal(conflux.broadcast(a, 0), a)
    out, splits = conflux.alltoall(a)
    np.testing.assert_array_equal(out, a)
    assert splits.tolist() == [3]
    np.testing.assert_array_equal(conflux.reducescatter(a, op=conflux.Sum), a)
    b = a.copy()
    assert conflux.allreduce_(b, op=conflux.Max) is b
    np.testing.assert_array_equal(b, a)


def test_average_scale_factors_at_size_one():
    a = np.array([1.0, 2.0, 4.0])
    np.testing.assert_allclose(conflux.allreduce(a, prescale_factor=2.0, postscale_factor=0.25),
                               a * 0.5)


def test_async_handle_lifecycle():
    a = np.ones(5, np.float32)
    h = conflux.allreduce_async_(a, name="unit.h")
    assert "allreduce" in repr(h)
    assert conflux.synchronize(h) is a
    assert conflux.poll(h) is True
    assert "done" in repr(h)
    hs = [conflux.allreduce_async(np.full(3, i, np.float64), name="unit.many.%d" % i)
          for i in range(50)]
    del hs
    gc.collect()
    conflux.barrier()
    assert conflux.join() == 0


def test_argument_errors_at_the_call():
    with pytest.raises(TypeError, match="not supported"):
        conflux.allreduce(np.zeros(2, np.complex128))
    with pytest.raises(TypeError, match="non-native byte order"):
        conflux.allreduce(np.zeros(2, ">f8"))
    with pytest.raises(ValueError, match="contiguous"):
        conflux.allreduce_(np.zeros((3, 3))[:, 0])
    with pytest.raises(ValueError, match="reduction op"):
        conflux.allreduce(np.zeros(2), op=9)
    with pytest.raises(TypeError):
        conflux.allreduce(np.zeros(2), name=b"bytes")
    with pytest.raises(TypeError, match="unknown option 'no_such_option' \\(known: transport"):
        conflux.shutdown()
        conflux.init(no_such_option=1)
    with pytest.raises(conflux.InvalidArgumentError,
                       match="init option cache_capacity must be a whole number >= 0, not -3"):
        conflux.init(cache_capacity=-3)
    with pytest.raises(TypeError, match="stall_timeout_s must be a number"):
        conflux.init(stall_timeout_s="soon")
    assert not conflux.is_initialized()


def test_init_options_and_cycles():
    conflux.shutdown()
    conflux.shutdown()  # idempotent
    assert not conflux.is_initialized()
    with pytest.raises(conflux.NotInitializedError, match="init"):
        conflux.rank()
    with pytest.raises(ValueError):
        conflux.allreduce(np.ones(1))
    for _ in range(3):
        conflux.init(fusion_threshold_bytes=1 << 20, cycle_time_ms=2.0)
        assert conflux.size() == 1
        np.testing.assert_array_equal(conflux.allreduce(np.ones(2), op=conflux.Sum), np.ones(2))
        conflux.shutdown()
    conflux.init()


def test_handle_outlives_shutdown():
    h = conflux.allreduce_async(np.ones(2))
    conflux.synchronize(h)
    pending = conflux.allreduce_async(np.ones(3), name="unit.outlive")
    conflux.shutdown()
    try:
        conflux.synchronize(pending)  # completed before shutdown, or shut down: either way no crash
    except conflux.ShutDownError:
        pass
    del pending
    gc.collect()
    conflux.init()


def test_torch_bfloat16_and_float16_size_one():
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    import conflux.torch as cfx
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.int64, torch.bool):
        t = (torch.arange(6) % 3).to(dt)
        assert torch.equal(cfx.allreduce(t, op=cfx.Sum), t)
        assert torch.equal(cfx.allgather(t), t)
    with pytest.raises(TypeError, match="not supported"):
        cfx.allreduce(torch.zeros(2, dtype=torch.complex64))


def test_horovod_size_one_optimizer_is_plain():
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    import conflux.horovod.torch as hvd
    hvd.init()
    m = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=m.named_parameters())
    before = m.weight.detach().clone()
    m(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert torch.allclose(m.weight.detach(), before - 0.1)


def test_import_does_not_initialize_and_atexit_shuts_down():
    code = ("import conflux, numpy as np; assert not conflux.is_initialized(); conflux.init(); "
            "conflux.allreduce_async(np.ones(3)); print('ok')")
    env = dict(os.environ)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_timeline_start_stop(tmp_path):
    import json
    conflux.start_timeline(str(tmp_path / "tl.json"))
    conflux.allreduce(np.ones(2), name="unit.timeline")
    conflux.stop_timeline()
    conflux.stop_timeline()
    with open(tmp_path / "tl.rank0.json") as f:
        assert "unit.timeline" in json.dumps(json.load(f))
    with pytest.raises(ValueError):
        conflux.start_timeline("")


def test_cuda_tensor_crosses_the_abi_with_device_and_stream(monkeypatch):
    """No GPU needed: a CUDA tensor is described as (data_ptr, dtype, shape, device index,
    torch.cuda.current_stream(device).cuda_stream), and on this machine the engine answers with
    the error its build and machine call for."""
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    import conflux.torch as cfx
    from conflux import _args
    from conflux import _core

    class FakeCudaTensor:  # what _describe reads of a torch.Tensor on cuda:1
        is_cpu = False
        is_cuda = True
        device = torch.device("cuda", 1)
        dtype = torch.float32
        shape = torch.Size([2, 3])

        def data_ptr(self):
            return 0x7f0000001000

    streams = []

    class Stream:
        cuda_stream = 0x5a5a00

    monkeypatch.setattr(torch.cuda, "current_stream", lambda d: streams.append(d) or Stream())
    desc = cfx._describe(FakeCudaTensor())
    assert desc == (0x7f0000001000, _core.FLOAT32, (2, 3), 1, 0x5a5a00)
    assert streams == [torch.device("cuda", 1)]

    f = conflux.features()
    if f["cuda_device"]:
        pytest.skip("a CUDA device is usable here: tests/gpu covers the device path")
    want = cfx.CudaError if f["cuda"] else cfx.UnsupportedError
    with pytest.raises(want, match="CUDA device 0" if f["cuda"] else "need a build with CUDA"):
        _core.submit(_core._capi.cfx_allreduce_async,
                     ("py.dev", (0x7f0000001000, _core.FLOAT32, (2, 3), 0, None), None,
                      _args.check_op(cfx.Sum), 1.0, 1.0), None, None, "allreduce")


def test_horovod_build_queries_answer_from_features():
    pytest.importorskip("torch", reason="python3-torch is not installed")
    import conflux.horovod.torch as hvd
    f = conflux.features()
    assert hvd.cuda_built() == f["cuda"]
    nccl = hvd.nccl_built()  # Horovod's answer: NCCL's version code (e.g. 22809 for 2.28.9), or 0
    assert isinstance(nccl, int) and not isinstance(nccl, bool)
    assert (nccl >= 2000) if f["nccl"] else nccl == 0
    assert hvd.rocm_built() is False

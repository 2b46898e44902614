"""The backend "conflux" on CUDA tensors (issue #41 item 2): registered for "cuda" where the native
backend was built against a CUDA torch and the engine has CUDA; allreduce (SUM, AVG),
allreduce_coalesced and broadcast of CUDA tensors on the caller's current stream, checked against
what each rank contributed; the other collectives and non-contiguous CUDA tensors refused, naming
the op. The device tests need a GPU and skip, saying so, where torch sees none."""
import os
import warnings

import pytest
import torch
import torch.distributed as dist

import conflux
from conflux import torch_backend

BACKEND = os.environ.get("CFX_TORCH2_BACKEND", "conflux")
on_conflux = pytest.mark.skipif(BACKEND != "conflux",
                                reason="CFX_TORCH2_BACKEND=%s: Conflux's registration" % BACKEND)
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="no CUDA device here (torch.cuda.is_available() is False): "
                                      "the backend's CUDA path runs on a GPU machine only")


@on_conflux
def test_registered_devices():
    native = torch_backend._torch_c10d
    cuda_build = (native is not None and bool(getattr(native, "CUDA", False))
                  and torch.version.cuda is not None and conflux.features()["cuda"])
    want = ["cpu", "cuda"] if cuda_build else ["cpu"]
    assert dist.Backend.backend_capability["conflux"] == want
    assert torch_backend.devices() == want


def device():
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())


def contribution(rank, n=1000, dtype=torch.float32):
    return torch.arange(n, dtype=dtype) * (rank + 1) + rank


@on_conflux
@needs_gpu
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_allreduce_on_a_side_stream(op, rank, size):
    dev = device()
    stream = torch.cuda.Stream(device=dev)
    want = sum(contribution(r, dtype=torch.float64) for r in range(size))
    if op == "avg":
        want = want / size
    with torch.cuda.stream(stream):
        t = contribution(rank).to(dev)  # made on the side stream: the engine must wait for it
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.AVG)
        got = t.cpu()  # ordered after the collective on the same stream
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-4)


@on_conflux
@needs_gpu
def test_allreduce_coalesced(rank, size):
    dev = device()
    ts = [contribution(rank, n).to(dev) for n in (1, 17, 4096)]
    with warnings.catch_warnings():  # torch says it will deprecate the call; DDP still makes it
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_reduce_coalesced(ts)
    for t, n in zip(ts, (1, 17, 4096)):
        want = sum(contribution(r, n, torch.float64) for r in range(size))
        torch.testing.assert_close(t.cpu().double(), want, rtol=1e-6, atol=1e-4)


@on_conflux
@needs_gpu
def test_broadcast_from_the_last_rank(rank, size):
    t = contribution(rank).to(device())
    dist.broadcast(t, src=size - 1)
    torch.testing.assert_close(t.cpu(), contribution(size - 1))


@on_conflux
@needs_gpu
def test_refused_on_cuda_tensors_naming_the_op(rank, size):
    t = contribution(rank).to(device())
    with pytest.raises(ValueError, match="allgather.*cuda"):
        dist.all_gather([torch.empty_like(t) for _ in range(size)], t)
    with pytest.raises(ValueError, match="not contiguous"):
        dist.all_reduce(t.view(100, 10).t())
    # nothing was submitted: the group still works
    u = torch.full((4,), float(rank + 1), device=device())
    dist.all_reduce(u)
    assert u.cpu().tolist() == [size * (size + 1) / 2] * 4

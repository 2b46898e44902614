"""DDP and torch.compile on the backend "conflux": DDP around a compiled model (the compiled
backward's gradients reach DDP's hooks) and a compiled DDP model (dynamo's DDPOptimizer splits
the graph at the buckets), each against the uncompiled local reference of t2common.

The compiler backend is CFX_TORCH2_COMPILE_BACKEND, "inductor" by default: inductor compiles
here (with the system's g++), but a cold compile of even this model takes about a minute per
rank on a loaded 2-core machine, so tests.cmake runs inductor in one job (torchrun, 2 ranks) and
"aot_eager" (the same dynamo capture, DDPOptimizer and AOT autograd, without inductor's code
generation, which does not touch communication) in the others to keep the label's wall time
modest."""
import os

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from t2common import LR, assert_params, loss_of, make_model, reference_step, snapshot

BACKEND = os.environ.get("CFX_TORCH2_COMPILE_BACKEND", "inductor")
# inductor may fuse and reorder the float32 arithmetic of forward and backward
TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def train_and_check(model, module, rank, size, what, steps=3):
    ref = make_model(0)
    start = snapshot(ref)
    torch.testing.assert_close(snapshot(module), start, rtol=0, atol=0,
                               msg=lambda m: "%s: DDP's broadcast at construction: %s" % (what, m))
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for step in range(steps):
        opt.zero_grad()
        loss_of(model, rank, step).backward()
        opt.step()
        reference_step(ref, ref_opt, size, step)
    assert_params(snapshot(module), ref, start, what=what, **TOLERANCE)


def start_model(rank):
    model = make_model(0 if rank == 0 else 50 + rank)
    if rank != 0:
        model.scale.fill_(1.5)
    return model


@pytest.mark.timeout(300)  # a cold inductor compile, several ranks on few cores
def test_ddp_around_compiled_model(rank, size):
    torch._dynamo.reset()
    module = start_model(rank)
    # (dynamo's DDPOptimizer sees the DDP around the compiled module and splits its graph at
    # DDP's buckets; it needs buckets of at least its first one, 1 MiB: DDP's default 25 MiB)
    model = DDP(torch.compile(module, backend=BACKEND))
    train_and_check(model, module, rank, size, "DDP(torch.compile(model, backend=%r))" % BACKEND)


@pytest.mark.timeout(300)
def test_compiled_ddp_model(rank, size):
    torch._dynamo.reset()
    module = start_model(rank)
    model = torch.compile(DDP(module), backend=BACKEND)
    train_and_check(model, module, rank, size, "torch.compile(DDP(model), backend=%r)" % BACKEND)

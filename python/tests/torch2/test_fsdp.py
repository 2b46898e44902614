"""FSDP2 (torch.distributed.fsdp.fully_shard) on the CPU over the backend "conflux": parameters
sharded on dim 0 (10, 7 and 3 rows: uneven at 2 and 3 ranks, padded by FSDP), all-gathered for
forward and backward, gradients reduce-scattered with the op FSDP chooses: AVG at its defaults
(float32), PREMUL_SUM(1/factor) after set_gradient_divide_factor(factor). Checked against the
local reference of t2common: the first step's reduce-scattered gradient shards, each rank's
parameter shard, and the full parameters (DTensor.full_tensor, an all-gather) after training."""
import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from conftest import BACKEND
from t2common import LR, assert_params, loss_of, make_model, reference_step

EXACT = dict(rtol=1e-5, atol=1e-6)


def sharded_model(size, factor=None, reshard_after_forward=True):
    mesh = init_device_mesh("cpu", (size,))
    model = make_model(0)  # FSDP2 shards every rank's own copy: the same start on every rank
    for layer in (model.fc1, model.fc2, model.fc3):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    if factor is not None:
        for m in (model.fc1, model.fc2, model.fc3, model):
            m.set_gradient_divide_factor(factor)
    return model


def local_shard(full, rank, size):
    """FSDP2's Shard(0) of `full` on `rank` (torch.chunk's split; empty past the last chunk)."""
    chunks = torch.chunk(full, size, dim=0)
    return chunks[rank] if rank < len(chunks) else full[:0]


@pytest.mark.parametrize("factor,reshard", [(None, True), (None, False), (4.0, True)],
                         ids=["avg", "avg-no-reshard", "premul_sum"])
def test_fully_shard_matches_local_model(factor, reshard, rank, size):
    """factor None: FSDP reduce-scatters with AVG (gradients averaged over the ranks);
    factor 4: PREMUL_SUM(1/4) (gradients = sum over ranks / 4), the reference's loss likewise."""
    if factor is not None and BACKEND == "gloo":
        pytest.skip("gloo has no PREMUL_SUM")
    what = "fully_shard(%s)" % ("AVG" if factor is None else "PREMUL_SUM 1/%g" % factor)
    model = sharded_model(size, factor, reshard)
    ref = make_model(0)
    start = {n: p.detach().clone() for n, p in ref.named_parameters()}
    divide = None if factor is None else factor
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for step in range(3):
        opt.zero_grad()
        loss_of(model, rank, step).backward()  # FSDP divides the sum by size, or by factor
        if step == 0:
            # the gradients FSDP reduce-scattered, against the reference's (before its step)
            ref_opt.zero_grad()
            total = sum(loss_of(ref, r, step) for r in range(size))
            (total / (size if divide is None else divide)).backward()
            for n, p in model.named_parameters():
                assert isinstance(p.grad, DTensor), (n, type(p.grad))
                want = local_shard(dict(ref.named_parameters())[n].grad, rank, size)
                torch.testing.assert_close(
                    p.grad.to_local(), want, **EXACT,
                    msg=lambda m, n=n: "%s: reduce-scattered gradient of %s: %s" % (what, n, m))
            ref_opt.step()
        else:
            reference_step(ref, ref_opt, size, step, divide=divide)
        opt.step()
    refs = dict(ref.named_parameters())
    for n, p in model.named_parameters():
        assert isinstance(p, DTensor), (n, type(p))
        torch.testing.assert_close(
            p.to_local(), local_shard(refs[n].detach(), rank, size), **EXACT,
            msg=lambda m, n=n: "%s: rank's shard of %s: %s" % (what, n, m))
    full = {n: p.full_tensor() for n, p in model.named_parameters()}
    assert_params(full, ref, start, what=what + ", full_tensor()", **EXACT)


def test_fully_shard_forward_gathers_parameters(rank, size):
    """Forward of the sharded model (every layer's parameters all-gathered) equals the local
    model's output on the same input, before any training."""
    model = sharded_model(size)
    ref = make_model(0)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), **EXACT)

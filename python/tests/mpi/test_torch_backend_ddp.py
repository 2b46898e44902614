"""DistributedDataParallel on the backend "conflux": a small CNN trained for several steps, its
parameters equal (float32 rounding) to a local model trained in the test on every rank's batch;
DDP's options (find_unused_parameters, no_sync, gradient_as_bucket_view, static_graph), many
steps with gc.collect() (no hang on Works held by C++ only), and the compressed hooks within the
16-bit rounding bound (on one host the shared-memory reduction is exact; the CMake test
python_torch_backend_compressed_np2 runs them with CFX_SHM=0 CFX_COMPRESSION_EVERYWHERE=1, where
every leg rounds, and then they check that the rounding happened)."""
import gc
import os

import pytest
torch = pytest.importorskip("torch", reason="python3-torch is not installed")
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import conflux.torch as cfx

LR = 0.05
BATCH = 4


@pytest.fixture(autouse=True)
def world(rank, size):
    if not dist.is_initialized():
        dist.init_process_group(
            "conflux", init_method=None if "MASTER_ADDR" in os.environ else "conflux://")
    assert dist.get_backend() == "conflux"


class Net(torch.nn.Module):
    """A small CNN with a buffer (broadcast at construction) and a second head used by some
    ranks on some steps only (find_unused_parameters)."""

    def __init__(self, with_extra=False):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)
        self.extra = torch.nn.Linear(8 * 4 * 4, 10) if with_extra else None
        self.register_buffer("scale", torch.ones(1))

    def forward(self, x, use_extra=False):
        x = torch.relu(self.conv1(x * self.scale))
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = x.flatten(1)
        y = self.fc(x)
        return y + self.extra(x) if use_extra else y


def batch(rank, step, micro=0):
    g = torch.Generator().manual_seed(1000 * step + 100 * micro + rank)
    return torch.randn(BATCH, 1, 8, 8, generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def loss_of(model, rank, step, micro=0, use_extra=False):
    x, y = batch(rank, step, micro)
    return torch.nn.functional.cross_entropy(model(x, use_extra), y)


def reference_model(with_extra=False):
    torch.manual_seed(0)
    return Net(with_extra)


def ddp_model(rank, with_extra=False, **kwargs):
    torch.manual_seed(0 if rank == 0 else 100 + rank)  # other ranks start elsewhere: the
    model = Net(with_extra)                           # broadcast at construction fixes it
    if rank != 0:
        model.scale.fill_(3.0)
    return DDP(model, **kwargs)


def uses_extra(rank, step):
    return (rank + step) % 2 == 1 if step % 3 else False  # every third step nobody uses it


def reference_step(ref, opt, size, step, micros=1, extra=False):
    """Every rank's loss, as DDP averages it: (1/size) * sum over ranks (and micro-batches)."""
    opt.zero_grad()
    total = sum(loss_of(ref, r, step, m, extra and uses_extra(r, step))
                for r in range(size) for m in range(micros)) / size
    total.backward()
    opt.step()


def assert_same(model, ref):
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6,
                                   msg=lambda m, name=name: "%s: %s" % (name, m))
    for b, c in zip(model.buffers(), ref.buffers()):
        assert torch.equal(b, c)


CONFIGS = {
    "defaults": {},
    "bucket_view": {"gradient_as_bucket_view": True},
    "static_graph": {"static_graph": True},
    "small_buckets": {"bucket_cap_mb": 0.001},
}


def train_both(model, ref, rank, size, steps, backward, **reference):
    """`steps` SGD steps of the DDP model (backward(step) runs its forwards and backwards) and of
    the local reference (reference_step with `reference`); then their parameters compared."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for step in range(steps):
        opt.zero_grad()
        backward(step)
        opt.step()
        reference_step(ref, ref_opt, size, step, **reference)
    assert_same(model.module, ref)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_ddp_matches_local_model(config, rank, size):
    model = ddp_model(rank, **CONFIGS[config])
    ref = reference_model()
    assert_same(model.module, ref)  # parameters and buffers came from rank 0
    train_both(model, ref, rank, size, 5, lambda step: loss_of(model, rank, step).backward())


def test_ddp_find_unused_parameters(rank, size):
    model = ddp_model(rank, with_extra=True, find_unused_parameters=True)
    train_both(model, reference_model(with_extra=True), rank, size, 6,
               lambda step: loss_of(model, rank, step, use_extra=uses_extra(rank, step)).backward(),
               extra=True)


def test_ddp_no_sync_accumulates(rank, size):
    model = ddp_model(rank)

    def three_micro_batches(step):
        with model.no_sync():
            loss_of(model, rank, step, 0).backward()
            loss_of(model, rank, step, 1).backward()
        loss_of(model, rank, step, 2).backward()
    train_both(model, reference_model(), rank, size, 3, three_micro_batches, micros=3)


def test_ddp_many_steps_with_gc(rank, size):
    """40 steps, the garbage collector run after every one (and find_unused_parameters, whose
    Work DDP's reducer waits for at the end of backward): no hang, still the local model."""
    model = ddp_model(rank, with_extra=True, find_unused_parameters=True, bucket_cap_mb=0.002)

    def then_collect(step):
        loss_of(model, rank, step, use_extra=uses_extra(rank, step)).backward()
        gc.collect()
    train_both(model, reference_model(with_extra=True), rank, size, 40, then_collect, extra=True)


@pytest.mark.parametrize("hook,bits", [("fp16_wire_hook", 11), ("bf16_wire_hook", 8),
                                       ("fp16_everywhere_wire_hook", 11)])
def test_compressed_hook_within_rounding(hook, bits, rank, size):
    """The averaged gradient with 16-bit values on the wire: within the roundings of the exact
    average of every rank's gradient (computed here), per element."""
    model = ddp_model(rank)
    model.register_comm_hook(None, getattr(cfx.ddp_hooks, hook))
    ref = reference_model()
    rounded = False
    for step in range(2):
        model.zero_grad()
        loss_of(model, rank, step).backward()
        per_rank = []
        for r in range(size):
            ref.zero_grad()
            loss_of(ref, r, step).backward()
            per_rank.append([p.grad.clone() for p in ref.parameters()])
        for i, p in enumerate(model.parameters()):
            gs = torch.stack([g[i] for g in per_rank])
            exact = gs.mean(0)
            # as test_compression.bound: n contributions rounded once when packed and n - 1
            # combines rounded once, each by half a unit of a value <= sum |g_r| (plus fp16's
            # subnormal spacing); the average divides that by n
            rounding = 2.0 ** -bits * gs.abs().sum(0) * 1.001 + 2.0 ** -24
            bound = (2 * size - 1) * rounding / size + 1e-6 * exact.abs() + 1e-7
            err = (p.grad - exact).abs()
            assert torch.all(err <= bound), (hook, i, float((err - bound).max()))
            rounded = rounded or bool(torch.any(err > 1e-6 * exact.abs() + 1e-7))
        with torch.no_grad():  # the same step on both, from the compressed gradient
            for p, q in zip(model.parameters(), ref.parameters()):
                p -= LR * p.grad
                q.copy_(p)
    if os.environ.get("CFX_SHM") == "0" and os.environ.get("CFX_COMPRESSION_EVERYWHERE") == "1":
        assert rounded, "with every leg compressed the gradients must show the 16-bit rounding"


def test_compressed_hook_needs_conflux_group(rank, size):
    gloo = dist.new_group(backend="gloo")
    dist.barrier()  # every rank's gloo mesh is made before any tears it down (below)
    with pytest.raises(TypeError, match="fp16_wire_hook needs a conflux process group"):
        cfx.ddp_hooks.fp16_wire_hook(gloo, None)
    dist.barrier()
    dist.destroy_process_group(gloo)


def in_shared_memory(t):
    from conflux import _capi
    return bool(_capi.cfx_is_shared(t.data_ptr(), t.numel() * t.element_size()))


@pytest.mark.parametrize("config", ["defaults", "bucket_view", "small_buckets", "static_graph"])
@pytest.mark.parametrize("native", [True, False], ids=["moved", "copied"])
def test_shared_memory_hook_matches_local_model(config, native, rank, size, monkeypatch):
    """conflux.torch.ddp_hooks.shared_memory_hook: still the local model trained on every rank's
    batch. "moved": DDP's buckets themselves move into shared tensor memory (with
    gradient_as_bucket_view the .grad tensors are views of them, so they lie there too);
    "copied": without the native module each bucket is copied into a shared block of its own."""
    from conflux import torch_backend
    if native and torch_backend._torch_native is None:
        pytest.skip("conflux._torch_native is not built here (libtorch-dev, pybind11-dev): "
                    "only the copying form can run")
    if not native:
        monkeypatch.setattr(torch_backend, "_torch_native", None)
    model = ddp_model(rank, **CONFIGS[config])
    model.register_comm_hook(None, cfx.ddp_hooks.shared_memory_hook)
    train_both(model, reference_model(), rank, size, 5, lambda step: loss_of(model, rank, step).backward())
    if native and config == "bucket_view":
        grads = [p.grad for p in model.parameters()]
        assert all(in_shared_memory(g) for g in grads), [in_shared_memory(g) for g in grads]


def test_move_to_shared_moves_every_view(rank, size):
    """The storage's memory moves; a tensor and its views read and write the same bytes after."""
    from conflux import torch_backend
    native = torch_backend._torch_native
    if native is None:
        pytest.skip("conflux._torch_native is not built here (libtorch-dev, pybind11-dev)")
    t = torch.arange(1000, dtype=torch.float32)
    view = t[10:20].view(2, 5)
    assert not in_shared_memory(t)
    assert native.move_to_shared(t)
    assert in_shared_memory(t) and in_shared_memory(view)
    assert torch.equal(t, torch.arange(1000, dtype=torch.float32))
    view[1, 4] = -7.0
    assert float(t[19]) == -7.0
    assert native.move_to_shared(t)  # already there: nothing moves
    assert not native.move_to_shared(torch.empty(0))


def test_shared_memory_hook_needs_conflux_group(rank, size):
    gloo = dist.new_group(backend="gloo")
    # Every rank has its gloo pairs connected before any tears its group down (a rank that
    # destroyed it, or exited, closed a connection another rank's full mesh was still making).
    dist.barrier()
    with pytest.raises(TypeError, match="shared_memory_hook needs a conflux process group"):
        cfx.ddp_hooks.shared_memory_hook(gloo, None)
    dist.barrier()
    dist.destroy_process_group(gloo)

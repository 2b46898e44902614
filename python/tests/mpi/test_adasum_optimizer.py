"""DistributedOptimizer(op=Adasum) of conflux.horovod.torch and conflux.torch: a 2-layer MLP
trained on a fixed synthetic regression set (every rank its shard, the same seed), the loss on the
whole set falling and the parameters identical on every rank; and one step checked against a
reference written here: each rank's local SGD step computed by plain torch on its shard, the
deltas combined by the NumPy Adasum of test_adasum.py, parameter by parameter."""
import copy

import numpy as np
import pytest

import conflux
from test_adasum import adasum_reference

torch = pytest.importorskip("torch", reason="python3-torch is not installed")
import conflux.horovod.torch as hvd  # noqa: E402
import conflux.torch as cfx  # noqa: E402

N_IN, N_HIDDEN, N_ROWS = 4, 16, 96


def dataset():
    g = torch.Generator().manual_seed(1234)
    x = torch.rand(N_ROWS, N_IN, generator=g) * 4 - 2
    y = torch.sin(x @ torch.tensor([[0.8], [-0.5], [0.3], [1.1]])) + 0.1 * x[:, :1] ** 2
    return x, y


def shard(rank, size):
    x, y = dataset()
    return x[rank::size], y[rank::size]


def make_model():
    torch.manual_seed(7)  # the same initial parameters on every rank
    return torch.nn.Sequential(torch.nn.Linear(N_IN, N_HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(N_HIDDEN, 1))


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def wrap(which, opt, model, **kw):
    named = list(model.named_parameters())
    if which == "hvd":
        hvd.init()
        return hvd.DistributedOptimizer(opt, named_parameters=named, op=hvd.Adasum, **kw)
    return cfx.DistributedOptimizer(opt, named_parameters=named, op=cfx.Adasum, **kw)


def assert_identical_everywhere(model, what):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    rows = cfx.allgather(flat.unsqueeze(0), name="adasum_opt.identical." + what)
    assert all(torch.equal(rows[0], row) for row in rows[1:]), what + ": ranks differ"


@pytest.mark.parametrize("which", ["hvd", "cfx"])
def test_one_step_is_the_adasum_of_the_local_steps(rank, size, which):
    lr = 0.1
    model = make_model()
    start = copy.deepcopy(model)
    opt = wrap(which, torch.optim.SGD(model.parameters(), lr=lr), model)
    x, y = shard(rank, size)
    opt.zero_grad()
    loss_of(model, x, y).backward()
    opt.step()
    # the reference: every rank's local step by plain torch, the deltas combined per parameter
    deltas = []
    for r in range(size):
        local = copy.deepcopy(start)
        sgd = torch.optim.SGD(local.parameters(), lr=lr)
        loss_of(local, *shard(r, size)).backward()
        sgd.step()
        deltas.append([(q - p).detach().numpy() for p, q in zip(start.parameters(),
                                                                 local.parameters())])
    for k, (p0, p1) in enumerate(zip(start.parameters(), model.parameters())):
        combined = adasum_reference([d[k] for d in deltas]).reshape(p0.shape)
        want = p0.detach().numpy().astype(np.float64) + combined
        scale = float(np.abs(combined).max())
        np.testing.assert_allclose(p1.detach().numpy(), want, rtol=0, atol=1e-5 * scale + 1e-7,
                                   err_msg="%s parameter %d" % (which, k))
        # neither the sum nor the average of the local steps (they are not orthogonal)
        total = sum(d[k] for d in deltas).reshape(p0.shape)
        assert not np.allclose(p1.detach().numpy(), p0.detach().numpy() + total, rtol=1e-3)
    assert_identical_everywhere(model, which + ".one_step")


@pytest.mark.parametrize("which,compression", [("hvd", "none"), ("cfx", "none"), ("hvd", "fp16")])
def test_training_lowers_the_loss(rank, size, which, compression):
    model = make_model()
    kw = {"compression": hvd.Compression.fp16} if compression == "fp16" else {}
    opt = wrap(which, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model, **kw)
    x, y = shard(rank, size)
    everything = dataset()
    with torch.no_grad():
        first = float(loss_of(model, *everything))
    for step in range(40):
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
    with torch.no_grad():
        last = float(loss_of(model, *everything))
    assert last < 0.5 * first, (first, last)
    assert_identical_everywhere(model, "%s.%s.train" % (which, compression))


def test_what_the_adasum_optimizer_refuses(rank, size):
    model = make_model()
    opt = wrap("hvd", torch.optim.SGD(model.parameters(), lr=0.1), model)
    with pytest.raises(AssertionError, match="not supported when using Adasum"):
        opt.skip_synchronize()
    loss_of(model, *shard(rank, size)).backward()
    with pytest.raises(AssertionError, match="zero_grad"):  # deltas in flight
        opt.zero_grad()
    opt.step()
    with pytest.raises(ValueError, match="op=Adasum does not combine compressed values"):
        wrap("cfx", torch.optim.SGD(model.parameters(), lr=0.1), model,
             compression=conflux.Compression.fp16)

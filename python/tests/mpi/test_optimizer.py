"""DistributedOptimizer: N steps on R ranks (each its own shard of every batch) must equal a
single-process run on the concatenated batches, and leave identical parameters on all ranks; on
the default gradient storage (a gradient set) and on the framework's (per-call allreduces).
test_optimizer_gradset.py has the gradient set's cases."""
import copy

import pytest
torch = pytest.importorskip("torch", reason="python3-torch is not installed")

import conflux.torch as cfx

BATCH = 6      # rows per rank per step
STEPS = 5
IN, HID, OUT = 7, 16, 3


def make_model():
    torch.manual_seed(1234)  # the same initial weights on every rank and in the reference
    return torch.nn.Sequential(torch.nn.Linear(IN, HID), torch.nn.Tanh(), torch.nn.Linear(HID, HID),
                               torch.nn.ReLU(), torch.nn.Linear(HID, OUT))


def dataset(size):
    g = torch.Generator().manual_seed(99)
    x = torch.randn(STEPS, size * BATCH, IN, generator=g, dtype=torch.float64).float()
    y = torch.randn(STEPS, size * BATCH, OUT, generator=g, dtype=torch.float64).float()
    return x, y


def make_opt(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1)
    if kind == "momentum":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3)
    return torch.optim.Adam(params, lr=0.01)


def reference(kind, size, passes=1):
    """One process, no communication: the whole global batch each step."""
    model = make_model()
    opt = make_opt(kind, model.parameters())
    x, y = dataset(size)
    for s in range(STEPS):
        opt.zero_grad()
        if passes == 1:
            torch.nn.functional.mse_loss(model(x[s]), y[s]).backward()
        else:
            # each rank does `passes` backward passes on sub-batches; gradients add up
            for k in range(passes):
                rows = [r * BATCH + j for r in range(size) for j in range(BATCH)
                        if j % passes == k]
                loss = torch.nn.functional.mse_loss(model(x[s][rows]), y[s][rows])
                loss.backward()
        opt.step()
    return model


def distributed(kind, rank, size, passes=1, **kw):
    model = make_model()
    opt = cfx.DistributedOptimizer(make_opt(kind, model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, **kw)
    cfx.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = dataset(size)
    mine = slice(rank * BATCH, (rank + 1) * BATCH)
    for s in range(STEPS):
        opt.zero_grad()
        xs, ys = x[s][mine], y[s][mine]
        for k in range(passes):
            rows = [j for j in range(BATCH) if j % passes == k]
            torch.nn.functional.mse_loss(model(xs[rows]), ys[rows]).backward()
        opt.step()
    return model


def assert_identical_everywhere(model, size):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = cfx.allgather(flat.unsqueeze(0))
    for r in range(size):
        assert torch.equal(every[r], every[0]), "rank %d holds different parameters" % r


@pytest.mark.parametrize("storage", ["conflux", "framework"])
@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam"])
def test_matches_single_process_on_concatenated_data(kind, rank, size, storage):
    ref = reference(kind, size)
    got = distributed(kind, rank, size, gradient_storage=storage)
    for (name, p), q in zip(got.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-5), name
    assert_identical_everywhere(got, size)
    # and training changed the parameters
    assert not torch.allclose(next(got.parameters()), next(make_model().parameters()))


def test_gradient_predivide_factor(rank, size):
    ref = reference("sgd", size)
    got = distributed("sgd", rank, size, gradient_predivide_factor=float(size))
    for p, q in zip(got.parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-5)
    assert_identical_everywhere(got, size)


@pytest.mark.parametrize("storage", ["conflux", "framework"])
def test_backward_passes_per_step(rank, size, storage):
    # Two passes accumulate (sum) two half-batch mean gradients locally before one reduction.
    ref = reference("sgd", size, passes=2)
    got = distributed("sgd", rank, size, passes=2, gradient_storage=storage)
    for p, q in zip(got.parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-5)
    assert_identical_everywhere(got, size)


@pytest.mark.parametrize("storage", ["conflux", "framework"])
def test_fp16_compression(rank, size, storage):
    ref = reference("sgd", size)
    got = distributed("sgd", rank, size, compression=cfx.Compression.fp16, gradient_storage=storage)
    for p, q in zip(got.parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=1e-2, atol=2e-3)
    assert_identical_everywhere(got, size)


def test_sum_op(rank, size):
    # The local gradients come from a copy without the optimizer's hooks: once backward() has run
    # on the wrapped model, its .grad tensors are being reduced in place and may not be read
    # before synchronize().
    model = make_model()
    plain = copy.deepcopy(model)
    plain(torch.full((1, IN), float(rank))).sum().backward()
    local = [p.grad.clone() for p in plain.parameters()]
    opt = cfx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters(), op=cfx.Sum)
    model(torch.full((1, IN), float(rank))).sum().backward()
    opt.synchronize()
    # Named: generated names count calls per rank, and an earlier test that made a different number
    # of unnamed calls on some rank would pair up different tensors here.
    sums = [cfx.allreduce(g, op=cfx.Sum, name=f"test_sum_op.check.{i}") for i, g in enumerate(local)]
    for p, s in zip(model.parameters(), sums):
        assert torch.allclose(p.grad, s)
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()  # synchronize() then step(): allreduced again, with a warning (as Horovod)


def test_zero_grad_with_pending_allreduce_is_an_error(rank, size):
    model = make_model()
    opt = cfx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.ones(2, IN)).sum().backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.step()
    opt.zero_grad()


def test_unused_parameter_still_synchronized(rank, size):
    torch.manual_seed(5)
    a, b = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    params = [("a." + n, p) for n, p in a.named_parameters()] + \
             [("b." + n, p) for n, p in b.named_parameters()]
    opt = cfx.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=1.0),
                                   named_parameters=params)
    # rank 0 uses only `a`, the others use both: b's gradient on rank 0 counts as zeros
    out = a(torch.ones(1, 3)) + (b(torch.ones(1, 3)) if rank else 0)
    out.sum().backward()
    opt.synchronize()
    assert torch.allclose(b.bias.grad, torch.full((1,), (size - 1) / size))
    with opt.skip_synchronize():
        opt.step()


def test_named_parameters_validation(rank, size):
    model = make_model()
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="unique"):
        cfx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[("same", p) for _, p in named])
    with pytest.raises(ValueError, match="not named"):
        cfx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=named[:1])
    opt = cfx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    assert isinstance(opt, torch.optim.SGD)
    copy.deepcopy(opt.state_dict())


def test_gradients_are_marked_ready_during_backward(rank, size):
    model = make_model()
    opt = cfx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    (gset,) = opt._sets
    marked = []
    # a hook that runs before the first layer's gradient is accumulated, while backward continues
    first_layer_weight = list(model.parameters())[0]
    first_layer_weight.register_hook(lambda g: marked.append(sum(gset.fired)) or g)
    model(torch.ones(2, IN)).sum().backward()
    assert marked and marked[0] >= 1, marked  # later layers' gradients were already ready
    assert all(gset.fired) and len(gset.fired) == len(list(model.parameters()))
    opt.step()
    assert not any(gset.fired)


@pytest.mark.parametrize("set_to_none", [False, True])
def test_gradient_storage(rank, size, set_to_none):
    """The default storage: the gradients live in the gradient set's shared tensor memory (across
    zero_grad, also with set_to_none), and training gives exactly the parameters of the
    framework-memory run (per-call allreduces): both sum the ranks in the same order."""
    framework = distributed("momentum", rank, size, gradient_storage="framework")
    model = make_model()
    opt = cfx.DistributedOptimizer(make_opt("momentum", model.parameters()),
                                   named_parameters=model.named_parameters())
    cfx.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = dataset(size)
    mine = slice(rank * BATCH, (rank + 1) * BATCH)
    where = {name: p.grad.data_ptr() for name, p in model.named_parameters()}
    for s in range(STEPS):
        opt.zero_grad(set_to_none=set_to_none)
        torch.nn.functional.mse_loss(model(x[s][mine]), y[s][mine]).backward()
        opt.step()
        for name, p in model.named_parameters():
            addr, nbytes = p.grad.data_ptr(), p.grad.numel() * p.grad.element_size()
            assert cfx._capi.cfx_is_shared(addr, nbytes) == 1, name
            assert addr == where[name], name
    for (name, p), q in zip(model.named_parameters(), framework.parameters()):
        assert torch.equal(p, q), name
        assert not cfx._capi.cfx_is_shared(q.grad.data_ptr(), q.grad.numel() * q.grad.element_size())
    assert_identical_everywhere(model, size)

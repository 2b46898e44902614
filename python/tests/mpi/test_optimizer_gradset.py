"""conflux.torch.DistributedOptimizer on its gradient set, across ranks: registration in a different
order on every rank, readiness in a different order on every rank (real backward passes), the
.grad views into the set's storage (zeroed by zero_grad(set_to_none=False), None after
set_to_none=True until the hooks copy backward's gradient in), accumulation,
unused parameters, parameters added later, ops, fp16 compression on the set, the per-call paths
(gradient_storage="framework", other compressors) and a mismatched registration. Every result is
checked against the reduction of what each rank contributed, recomputed here with numpy from
conftest.contribution."""
import re
import warnings

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="python3-torch is not installed")

import conflux
import conflux.torch as cfx
from conflux import _torch_gradset_optimizer
from conftest import contribution, expected_reduce, tolerance

NATIVE_HOOKS = _torch_gradset_optimizer._torch_native


@pytest.fixture(autouse=True, params=["c++ hooks", "python hooks"])
def hooks(request, monkeypatch):
    """Every test twice: with the optimizer's hooks in C++ (conflux._torch_native, where the build
    has them) and with the same hooks in Python (the fallback)."""
    if request.param == "python hooks":
        monkeypatch.setattr(_torch_gradset_optimizer, "_torch_native", None)
    elif NATIVE_HOOKS is None:
        pytest.skip("conflux._torch_native is not built (CONFLUX_WITH_TORCH_NATIVE: libtorch-dev "
                    "and pybind11-dev): only the Python hooks run")
    return request.param

# name, shape, dtype: mixed dtypes (several buckets), a scalar, half precision
GRADS = [
    ("conv.weight", (4, 3, 3), "float32"),
    ("conv.bias", (4,), "float32"),
    ("fc.weight", (5, 8), "float64"),
    ("fc.bias", (5,), "float64"),
    ("scale", (), "float32"),
    ("emb.half", (6,), "float16"),
    ("emb.brain", (7,), "bfloat16"),
]
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64}


def rank_order(rank, n):
    """An order of its own for every rank: rotated by the rank, reversed on odd ranks."""
    order = [(k + rank) % n for k in range(n)]
    return order[::-1] if rank % 2 else order


def make_params(grads=GRADS):
    return [(name, torch.nn.Parameter(torch.zeros(shape, dtype=DTYPES[dt])))
            for name, shape, dt in grads]


def make_opt(params, rank, **kw):
    """The optimizer over `params`, registered in this rank's order (lr 0: only gradients move)."""
    mine = [params[g] for g in rank_order(rank, len(params))]
    return cfx.DistributedOptimizer(torch.optim.SGD([p for _, p in mine], lr=0.0),
                                    named_parameters=mine, **kw)


def seed(step, gid, pass_=0):
    return 1000 * step + 10 * gid + pass_


def backward(params, rank, step, pass_=0, order=None, skip=()):
    """One backward pass: gradient gid gets rank's contribution for (step, gid, pass); the loss's
    terms are built in `order` (backward runs them last first), gradients in `skip` are unused."""
    terms = []
    for gid in (order if order is not None else range(len(params))):
        if gid in skip:
            continue
        name, p = params[gid]
        shape, dt = GRADS[gid][1], GRADS[gid][2]
        c = torch.from_numpy(np.asarray(contribution(rank, shape, dt, seed(step, gid, pass_))))
        c = c.to(p.dtype)
        terms.append((p * c).sum().double())
    sum(terms).backward()


def check(params, size, step, op=cfx.Average, passes=1, unused=None, tol=1e-6, prescale=1.0,
          postscale=1.0, ranks=None):
    """unused: {gid: ranks where that gradient was not produced (they contribute zeros)};
    ranks: those reduced over (default all)."""
    unused = unused or {}
    for gid, (name, shape, dt) in enumerate(GRADS):
        xs = [sum(contribution(r, shape, dt, seed(step, gid, k)) for k in range(passes))
              if r not in unused.get(gid, ()) else np.zeros(shape)
              for r in (range(size) if ranks is None else ranks)]
        want = expected_reduce(op, xs, dt, prescale, postscale)
        got = params[gid][1].grad
        assert got is not None and got.dtype == DTYPES[dt], name
        t = max(tol, tolerance(dt))  # averages of half precision round
        np.testing.assert_allclose(got.double().numpy(), want, rtol=t, atol=t,
                                   err_msg="gradient %s, step %d" % (name, step))


def train_step(opt, params, rank, size, step, **check_kw):
    """zero_grad, one backward pass, step(), and the gradients checked."""
    opt.zero_grad()
    backward(params, rank, step)
    opt.step()
    check(params, size, step, **check_kw)


def shared(t):
    return cfx._capi.cfx_is_shared(t.data_ptr(), t.numel() * t.element_size()) == 1


def test_registration_order_differs_by_rank(rank, size):
    params = make_params()
    opt = make_opt(params, rank)
    assert len(opt._sets) == 1
    for step in range(3):
        train_step(opt, params, rank, size, step)


def test_readiness_order_differs_by_rank(rank, size):
    """The loss's terms in this rank's order: backward produces (and the hooks mark) the gradients
    in a different order on every rank."""
    params = make_params()
    opt = make_opt(params, 0)  # the same registration everywhere; only readiness differs
    seen = []
    for gid, (name, p) in enumerate(params):
        p.register_hook(lambda g, gid=gid: seen.append(gid) or g)
    for step in range(3):
        opt.zero_grad()
        seen.clear()
        backward(params, rank, step, order=rank_order(rank, len(params)))
        opt.step()
        check(params, size, step)
    orders = cfx.allgather_object(list(seen), name="test_readiness_order")
    assert len({tuple(o) for o in orders}) == size, orders  # really a different order per rank


def test_grads_are_views_into_shared_storage_across_zero_grad(rank, size):
    params = make_params()
    opt = make_opt(params, rank)
    where = {name: p.grad.data_ptr() for name, p in params}
    assert all(shared(p.grad) for _, p in params)
    for step, reset in enumerate(["optimizer", "set_to_none", "model_set_to_none", "none"]):
        if reset == "optimizer":  # zeroed in place
            opt.zero_grad(set_to_none=False)
            assert all(not p.grad.any() for _, p in params)
            assert {name: p.grad.data_ptr() for name, p in params} == where
        elif reset == "set_to_none":
            opt.zero_grad(set_to_none=True)  # None, as torch does; the hooks bring the views back
            assert all(p.grad is None for _, p in params)
        elif reset == "model_set_to_none":  # behind the optimizer's back: the hooks take it back
            for _, p in params:
                p.grad = None
        else:  # no reset: this step's gradients add to last step's averages
            last = {name: p.grad.clone() for name, p in params}
        backward(params, rank, step)
        opt.step()
        if reset == "none":
            for gid, (name, p) in enumerate(params):
                shape, dt = GRADS[gid][1], GRADS[gid][2]
                xs = [last[name].double().numpy() + contribution(r, shape, dt, seed(step, gid))
                      for r in range(size)]
                np.testing.assert_allclose(p.grad.double().numpy(),
                                           expected_reduce(cfx.Average, xs, dt),
                                           rtol=1e-2 if "half" in name or "brain" in name else 1e-5)
        else:
            check(params, size, step)
        assert {name: p.grad.data_ptr() for name, p in params} == where, reset
    opt.zero_grad(set_to_none=True)
    opt.step()  # without a backward: every view comes back, zeroed, and is reduced as it is
    assert {name: p.grad.data_ptr() for name, p in params} == where
    assert all(not p.grad.any() for _, p in params)


@pytest.mark.parametrize("bucket_bytes", [64, 1 << 30])
def test_bucket_bytes(rank, size, bucket_bytes):
    """A bucket per gradient (64 bytes) or one bucket for all: the same averages."""
    params = make_params()
    opt = make_opt(params, rank, bucket_bytes=bucket_bytes)
    for step in range(2):
        train_step(opt, params, rank, size, step)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "64"])
def test_bucket_bytes_must_be_a_natural_number(rank, size, bad):
    with pytest.raises(ValueError, match="bucket_bytes must be an int >= 0.*%s" % re.escape(repr(bad))):
        make_opt(make_params(), rank, bucket_bytes=bad)


@pytest.mark.parametrize("passes", [2, 3])
def test_accumulation(rank, size, passes):
    params = make_params()
    opt = make_opt(params, rank, backward_passes_per_step=passes, op=cfx.Sum)
    for step in range(2):
        opt.zero_grad()
        for k in range(passes):
            # the passes' orders differ too
            backward(params, rank, step, k, order=rank_order(rank + k, len(params)))
        opt.step()
        check(params, size, step, op=cfx.Sum, passes=passes)


def test_more_passes_than_backward_passes_per_step(rank, size):
    params = make_params()
    opt = make_opt(params, rank)
    backward(params, rank, 0)
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        backward(params, rank, 0, 1)
    opt.synchronize()  # the step ends everywhere; the optimizer goes on
    with opt.skip_synchronize():
        opt.step()
    train_step(opt, params, rank, size, 1)


def test_set_backward_passes_per_step_commits_again(rank, size):
    params = make_params()
    opt = make_opt(params, rank)
    first = opt._sets[0]
    opt.set_backward_passes_per_step(2)
    assert opt._sets[0] is not first and opt.backward_passes_per_step == 2
    opt.zero_grad()
    backward(params, rank, 0, 0)
    backward(params, rank, 0, 1)
    opt.step()
    check(params, size, 0, passes=2)
    assert all(shared(p.grad) for _, p in params)


@pytest.mark.parametrize("reset", ["zero_grad", "set_to_none", "behind"])
def test_unused_parameters_contribute_zeros(rank, size, reset):
    """Rank 0 never produces two gradients (the last rank one): they are reduced as they are,
    zeros after zero_grad, also when set_to_none (or the script, behind the optimizer's back)
    dropped the view."""
    params = make_params()
    opt = make_opt(params, rank)
    skip = {0: (1, 4), size - 1: (4,)}.get(rank, ())
    unused = {1: (0,), 4: (0, size - 1)}
    for step in range(3):
        if reset == "behind":
            for _, p in params:
                p.grad = None
        else:
            opt.zero_grad(set_to_none=reset == "set_to_none")
        backward(params, rank, step, skip=skip)
        opt.step()
        check(params, size, step, unused=unused)
        assert all(shared(p.grad) for _, p in params)


def test_parameters_added_later_commit_a_new_set(rank, size):
    params = make_params()
    first, later = params[:3], params[3:]
    mine = [first[g] for g in rank_order(rank, len(first))]
    opt = cfx.DistributedOptimizer(torch.optim.SGD([p for _, p in mine], lr=0.0),
                                   named_parameters=params)
    assert len(opt._sets) == 1 and all(p.grad is None for _, p in later)
    opt.add_param_group({"params": [p for _, p in later[::-1] if rank % 2] or
                         [p for _, p in later]})
    assert len(opt._sets) == 2
    assert all(shared(p.grad) for _, p in params)
    for step in range(2):
        opt.zero_grad()
        backward(params, rank, step, order=rank_order(rank, len(params)))
        opt.step()
        check(params, size, step)


@pytest.mark.parametrize("op", [cfx.Sum, cfx.Min, cfx.Max])
def test_ops(rank, size, op):
    params = make_params()
    train_step(make_opt(params, rank, op=op), params, rank, size, 0, op=op)


def test_gradient_predivide_factor(rank, size):
    params = make_params()
    train_step(make_opt(params, rank, gradient_predivide_factor=2.0), params, rank, size, 0,
               prescale=0.5, postscale=2.0, tol=1e-2)


def test_fp16_compression_stays_on_the_set(rank, size):
    """Compression.fp16 is the engine's compression of a set: the float32/float64 gradients in a
    set with fp16, the 16-bit ones in a set without (they travel as they are); every .grad is a
    view of a set's storage; unused ones count as zeros. (Within a host the shared-memory
    reduction is exact; test_compression.py checks what compression does to the values.)"""
    params = make_params()
    opt = make_opt(params, rank, compression=cfx.Compression.fp16)
    assert [s.compression for s in opt._sets] == [conflux.Compression.none,
                                                  conflux.Compression.fp16]
    assert not opt._requires_update
    wide = {id(p) for _, p in params if p.dtype in (torch.float32, torch.float64)}
    assert {id(p) for p in opt._sets[1].params} == wide
    for step in range(3):
        opt.zero_grad(set_to_none=step == 1)
        backward(params, rank, step, skip=(2,) if rank == 0 else ())
        opt.step()
        check(params, size, step, unused={2: (0,)}, tol=1e-2)
        assert all(shared(p.grad) for _, p in params)


class Doubling(cfx.Compressor):
    """A compressor of the user's own: sends 2 x the gradient, halves the result."""

    @staticmethod
    def compress(tensor):
        return tensor * 2, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor / 2


@pytest.mark.parametrize("how", ["compressor", "framework"])
def test_per_call_paths(rank, size, how):
    params = make_params()
    kw = {"compression": Doubling} if how == "compressor" else {"gradient_storage": "framework"}
    opt = make_opt(params, rank, **kw)
    assert not opt._sets and len(opt._requires_update) == len(params)
    for step in range(2):
        opt.zero_grad(set_to_none=True)
        if how == "framework":
            assert all(p.grad is None for _, p in params)  # torch's own gradient memory
        backward(params, rank, step, order=rank_order(rank, len(params)),
                 skip=(3,) if rank == 0 else ())
        opt.step()
        check(params, size, step, unused={3: (0,)})
        assert not any(shared(p.grad) for _, p in params)


@pytest.mark.parametrize("storage", ["conflux", "framework"])
@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_process_set(rank, size, kind, storage):
    """process_set= (a conflux.torch.ProcessSet or a conflux.ProcessSet of the first and the
    last rank): members reduce over the set (Average: divided by its size), in gradient sets on
    the set's own context or per call with its collectives; the other ranks keep their own
    gradients (the wrapped optimizer alone)."""
    members = [0, size - 1]
    ps = (cfx.ProcessSet if kind == "torch" else conflux.ProcessSet)(members)
    try:
        params = make_params()
        opt = make_opt(params, rank, process_set=ps, gradient_storage=storage)
        if rank not in members:
            assert not opt._sets and not opt._requires_update
        elif storage == "conflux":
            assert opt._sets and all(s.native.ctx is ps._subset.ctx for s in opt._sets)
        else:
            assert not opt._sets and len(opt._requires_update) == len(params)
        for step in range(2):
            opt.zero_grad()
            backward(params, rank, step, order=rank_order(rank, len(params)),
                     skip=(3,) if rank == 0 else ())
            opt.step()
            if rank in members:
                check(params, size, step, ranks=members, unused={3: (0,)})
                assert all(shared(p.grad) == (storage == "conflux") for _, p in params)
            else:
                check(params, size, step, ranks=[rank])
    finally:
        ps.free()


def test_shared_gradients_is_the_older_spelling(rank, size):
    params = make_params()
    with pytest.warns(DeprecationWarning, match="gradient_storage"):
        opt = make_opt(params, rank, shared_gradients=False)
    assert opt.gradient_storage == "framework" and not opt._sets
    with pytest.warns(DeprecationWarning):
        opt = make_opt(make_params(), rank, shared_gradients=True)
    assert opt.gradient_storage == "conflux" and opt._sets
    with pytest.raises(ValueError, match="gradient_storage must be one of 'conflux', 'framework'"):
        make_opt(make_params(), rank, gradient_storage="shared")


def test_mismatched_registration_names_the_gradient(rank, size):
    last = size - 1
    grads = list(GRADS)
    if rank == last:  # one gradient of another shape
        grads[2] = ("fc.weight", (8, 5), "float64")
    params = [(name, torch.nn.Parameter(torch.zeros(shape, dtype=DTYPES[dt])))
              for name, shape, dt in grads]
    with pytest.raises(cfx.MismatchError, match=r"'fc\.weight' is float64 \[5, 8\] on rank 0 but "
                                                r"float64 \[8, 5\] on rank %d" % last):
        make_opt(params, rank)
    params = make_params()
    if rank == last:  # one gradient more
        params.append(("extra.bias", torch.nn.Parameter(torch.zeros(2))))
    with pytest.raises(cfx.MismatchError, match="extra.bias"):
        make_opt(params, rank)
    params = make_params()  # the next optimizer works
    train_step(make_opt(params, rank), params, rank, size, 0)


def test_zero_grad_between_backward_and_step_is_an_error(rank, size):
    params = make_params()
    opt = make_opt(params, rank)
    backward(params, rank, 0)
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.step()
    check(params, size, 0)
    opt.zero_grad()


def test_broadcast_optimizer_state_and_parameters(rank, size):
    torch.manual_seed(rank)  # different weights and momenta on every rank
    model = torch.nn.Linear(4, 3)
    opt = cfx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    with opt.skip_synchronize():  # a local step: momentum buffers of this rank's own
        model(torch.randn(2, 4)).sum().backward()
        opt.synchronize()
        for _, p in model.named_parameters():
            p.grad.add_(float(rank))
        opt.step()
    cfx.broadcast_parameters(model.state_dict(), root_rank=0)
    cfx.broadcast_optimizer_state(opt, root_rank=0)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()] +
                     [opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()])
    every = cfx.allgather(flat.unsqueeze(0), name="test_broadcast_optimizer_state")
    assert all(torch.equal(every[r], every[0]) for r in range(size))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.zero_grad()
        model(torch.ones(1, 4)).sum().backward()
        opt.step()  # still training through the set
    assert shared(model.weight.grad)


def test_sparse_gradients_accumulate_into_the_dense_view(rank, size):
    """nn.Embedding(sparse=True): rank r looks up rows r and r + 1; the view holds the dense
    average (as sparse_as_dense would)."""
    emb = torch.nn.Embedding(size + 1, 2, sparse=True)
    opt = cfx.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.0),
                                   named_parameters=emb.named_parameters())
    want = np.zeros((size + 1, 2))
    for r in range(size):
        want[r] += 1.0 / size
        want[r + 1] += 1.0 / size
    for step in range(2):
        opt.zero_grad(set_to_none=step == 1)
        emb(torch.tensor([rank, rank + 1])).sum().backward()
        opt.step()
        assert not emb.weight.grad.is_sparse and shared(emb.weight.grad)
        np.testing.assert_allclose(emb.weight.grad.numpy(), want, rtol=1e-6)


def test_hooks_in_use(rank, hooks):
    """The sets' hooks are the C++ ones where they are built, the Python ones otherwise; both
    record what fired the same way."""
    params = make_params()
    opt = make_opt(params, rank)
    for s in opt._sets:
        assert (s.native_hooks is not None) == (hooks == "c++ hooks"), hooks
        assert len(s.hooks) == len(s.params) and not any(s.fired)
    backward(params, rank, 0, skip={1})
    fired = {p: f for s in opt._sets for p, f in zip(s.params, s.fired)}
    assert [fired[p] for _, p in params] == [gid != 1 for gid in range(len(params))]
    opt.step()
    assert not any(f for s in opt._sets for f in s.fired)

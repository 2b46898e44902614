"""hvd.DistributedOptimizer on gradient sets, across ranks: training reaches the parameters of an
independent computation (every rank's gradients recomputed here on a reference model, combined
and applied with plain torch), its dense gradients are views into the sets' shared storage,
sparse gradients mixed with dense ones (the allgather path after the first step, or dense with
sparse_as_dense; their layout kept), process sets (the sets on the set's own context; ranks
outside train alone), backward_passes_per_step=2, the ops, Compression.fp16 on the set, a
compressor of one's own (per call), parameters added later, and a mismatched registration."""
import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="python3-torch is not installed")

import conflux
import conflux.horovod.torch as hvd
import conflux.torch as cfx
from conflux.horovod.common import process_sets as hvd_sets
from conftest import contribution, expected_reduce
from test_optimizer_gradset import Doubling  # a compressor of one's own

VOCAB = 6


class Net(torch.nn.Module):
    """x (2, 3) [+ the sum of embedding rows idx] -> fc1 -> tanh -> fc2; `spare` only where the
    forward is told to use it."""

    def __init__(self, sparse=None):
        super().__init__()
        torch.manual_seed(7)  # the same start on every rank and for the reference
        self.emb = torch.nn.Embedding(VOCAB, 3, sparse=sparse) if sparse is not None else None
        self.fc1 = torch.nn.Linear(3, 4)
        self.fc2 = torch.nn.Linear(4, 2)
        self.spare = torch.nn.Linear(2, 2)
        self.double()

    def forward(self, x, idx=None, spare=False):
        if self.emb is not None and idx is not None and len(idx):
            x = x + self.emb(idx).sum(0)
        out = self.fc2(torch.tanh(self.fc1(x)))
        if spare:
            out = out + self.spare(out)
        return out


def batch(rank, step, pass_=0):
    """Rank `rank`'s input of (step, pass): x, embedding rows, whether it uses `spare` (rank 0's
    odd steps only)."""
    x = torch.from_numpy(contribution(rank, (2, 3), "float64", 100 * step + 10 * pass_ + 1) / 10)
    idx = torch.tensor([rank % VOCAB, (rank + step + pass_) % VOCAB])
    return x, idx, rank == 0 and step % 2 == 1


def loss_of(model, rank, step, pass_=0, use_emb=True):
    x, idx, spare = batch(rank, step, pass_)
    return (model(x, idx if use_emb else None, spare) ** 2).sum()


def shared(t):
    return cfx._capi.cfx_is_shared(t.data_ptr(), t.numel() * t.element_size()) == 1


def in_set_storage(opt, p):
    """p.grad is its gradient set's buffer (shared tensor memory)."""
    return any(q is p and p.grad is buf for s in opt._sets for q, buf in s.views) and shared(p.grad)


class Reference:
    """The independent computation: a plain torch model and optimizer that step with the
    combination of every member rank's own gradients, computed here."""

    def __init__(self, members, op="Average", passes=1, use_emb=True, **sgd):
        self.model = Net(sparse=False if use_emb else None)
        self.opt = torch.optim.SGD(self.model.parameters(), **sgd)
        self.members, self.op, self.passes, self.use_emb = members, op, passes, use_emb

    def step(self, step):
        params = list(self.model.parameters())
        per_rank = []
        for r in self.members:
            loss = sum(loss_of(self.model, r, step, k, self.use_emb) for k in range(self.passes))
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            per_rank.append([torch.zeros_like(p) if g is None else g
                             for p, g in zip(params, grads)])
        for i, p in enumerate(params):
            total = sum(g[i] for g in per_rank)
            p.grad = total / len(self.members) if self.op == "Average" else total
        self.opt.step()


def assert_same_parameters(model, ref, what):
    for (name, p), q in zip(model.named_parameters(), ref.model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-10,
                                   atol=1e-12, err_msg="%s: %s" % (what, name))


def train(opt, model, ref, rank, step, passes=1, set_to_none=False):
    """One step (`passes` backward passes) of `opt` and of the reference; the parameters
    compared."""
    opt.zero_grad(set_to_none=set_to_none)
    for k in range(passes):
        loss_of(model, rank, step, k, use_emb=False).backward()
    opt.step()
    ref.step(step)
    assert_same_parameters(model, ref, "step %d" % step)


def distributed(model, op=hvd.Average, **kw):
    sgd = kw.pop("sgd", {"lr": 0.1, "momentum": 0.9})
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), **sgd),
                                    named_parameters=model.named_parameters(), op=op, **kw)


@pytest.mark.parametrize("op", ["Average", "Sum"])
def test_trains_to_the_independent_parameters(op, rank, size):
    """Four steps of SGD with momentum (rank 0 alone uses `spare` on odd steps: the others
    contribute zeros for it); every dense gradient lives in the set's storage."""
    model = Net()
    opt = distributed(model, op=getattr(hvd, op))
    ref = Reference(list(range(size)), op, use_emb=False, lr=0.1, momentum=0.9)
    assert opt._sets and not opt._requires_update
    where = {name: p.grad.data_ptr() for name, p in model.named_parameters()}
    for step in range(4):
        train(opt, model, ref, rank, step, set_to_none=step == 2)
        assert all(in_set_storage(opt, p) for p in model.parameters())
        assert {name: p.grad.data_ptr() for name, p in model.named_parameters()} == where


def test_gradient_predivide_factor(rank, size):
    model = Net()
    opt = distributed(model, gradient_predivide_factor=2.0, sgd={"lr": 0.1})
    ref = Reference(list(range(size)), use_emb=False, lr=0.1)
    for step in range(2):
        train(opt, model, ref, rank, step)


@pytest.mark.parametrize("op", ["Sum", "Min", "Max", "Product"])
def test_ops_on_the_set(op, rank, size):
    """One gradient per parameter (lr 0): rank r's contribution; the set reduces it with `op`."""
    shapes = [(3, 2), (5,)]
    params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.float64)) for s in shapes]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.0), op=getattr(hvd, op),
                                   named_parameters=[("p%d" % i, p) for i, p in enumerate(params)])
    assert opt._sets and not opt._requires_update
    sum((p * torch.from_numpy(contribution(rank, s, "float64", i))).sum()
        for i, (p, s) in enumerate(zip(params, shapes))).backward()
    opt.step()
    for i, (p, s) in enumerate(zip(params, shapes)):
        want = expected_reduce(getattr(conflux, op),
                               [contribution(r, s, "float64", i) for r in range(size)], "float64")
        np.testing.assert_array_equal(p.grad.numpy(), want)
        assert in_set_storage(opt, p)


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_and_dense_gradients_mixed(sparse_as_dense, rank, size):
    """nn.Embedding(sparse=True) beside dense layers. The first step reduces the embedding in
    the set; afterwards it goes as an allgather of indices and values (or stays in the set with
    sparse_as_dense). Its gradient is sparse after every step. Rank 0 looks nothing up in the
    first step (the others tell it the gradient is sparse) and in step 3 (p.grad None after
    zero_grad(set_to_none=True): no entries of its own)."""
    model = Net(sparse=True)
    opt = distributed(model, sparse_as_dense=sparse_as_dense, sgd={"lr": 0.2})
    ref = Reference(list(range(size)), lr=0.2)
    emb = model.emb.weight
    assert emb in opt._set_params  # a sparse gradient shows only once backward makes it
    for step in range(4):
        opt.zero_grad(set_to_none=step == 3)
        x, idx, spare = batch(rank, step)
        if step in NO_LOOKUPS and rank == 0:
            idx = idx[:0]
        (model(x, idx, spare) ** 2).sum().backward()
        opt.step()
        ref_step(ref, step)
        assert_same_parameters(model, ref, "step %d" % step)
        assert emb.grad.is_sparse, step
        assert (emb in opt._set_params) == sparse_as_dense
        assert (emb in opt._requires_update) != sparse_as_dense
        dense = [p for name, p in model.named_parameters() if not name.startswith("emb")]
        assert all(in_set_storage(opt, p) for p in dense)


NO_LOOKUPS = (0, 3)  # the steps in which rank 0 looks no embedding rows up


def ref_step(ref, step):
    """Reference.step, except that rank 0 looks no embedding rows up in the steps NO_LOOKUPS."""
    if step not in NO_LOOKUPS:
        return ref.step(step)
    params = list(ref.model.parameters())
    total = [torch.zeros_like(p) for p in params]
    for r in ref.members:
        x, idx, spare = batch(r, step)
        out = ref.model(x, idx[:0] if r == 0 else idx, spare)
        grads = torch.autograd.grad((out ** 2).sum(), params, allow_unused=True)
        total = [t if g is None else t + g for t, g in zip(total, grads)]
    for p, t in zip(params, total):
        p.grad = t / len(ref.members)
    ref.opt.step()


def test_backward_passes_per_step(rank, size):
    """Two backward passes per step: the set reduces their sum once."""
    model = Net()
    opt = distributed(model, backward_passes_per_step=2)
    ref = Reference(list(range(size)), passes=2, use_emb=False, lr=0.1, momentum=0.9)
    for step in range(3):
        train(opt, model, ref, rank, step, passes=2)
        assert all(in_set_storage(opt, p) for p in model.parameters())


def test_process_set(rank, size):
    """A model on a process set (all ranks but the first) beside one on the global set, stepped
    together: members reduce over the set, on gradient sets of the set's context; rank 0 trains
    alone. (At 2 ranks the set has one rank: nothing to reduce.)"""
    members = list(range(1, size))
    ps = hvd.add_process_set(members)
    try:
        model, whole = Net(), Net()
        opt = distributed(model, process_set=ps)
        opt_whole = distributed(whole)
        ref = Reference(members if rank in members else [rank], use_emb=False, lr=0.1,
                        momentum=0.9)
        ref_whole = Reference(list(range(size)), use_emb=False, lr=0.1, momentum=0.9)
        if len(members) > 1 and rank in members:
            ctx = hvd_sets.subset_of(ps).ctx
            assert opt._sets and all(s.native.ctx is ctx for s in opt._sets)
        else:  # outside the set, or a set of one: the wrapped optimizer alone
            assert not opt._sets and not opt._requires_update
        for step in range(3):
            for o, m in ((opt, model), (opt_whole, whole)):
                # Zeros, not None (torch 2.x's default): the reference steps every parameter with
                # a gradient, zero where a rank left `spare` unused, as the sets do.
                o.zero_grad(set_to_none=False)
                loss_of(m, rank, step, use_emb=False).backward()
            opt.step()
            opt_whole.step()
            ref.step(step)
            ref_whole.step(step)
            assert_same_parameters(model, ref, "process set, step %d" % step)
            assert_same_parameters(whole, ref_whole, "global set, step %d" % step)
        if opt._sets:
            assert all(in_set_storage(opt, p) for p in model.parameters())
    finally:
        hvd.remove_process_set(ps)


def test_fp16_compression_is_the_sets(rank, size):
    """Compression.fp16: the float32 gradients in a set with the engine's fp16 compression, the
    float16 one in a set without. (Within a host the reduction is exact; test_compression.py
    checks what compression does to the values.)"""
    shapes = {"a": ((4, 3), torch.float32), "b": ((5,), torch.float32), "h": ((3,), torch.float16)}
    named = [(n, torch.nn.Parameter(torch.zeros(s, dtype=dt))) for n, (s, dt) in shapes.items()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in named], lr=0.0),
                                   named_parameters=named, compression=hvd.Compression.fp16)
    assert [s.compression for s in opt._sets] == [conflux.Compression.none,
                                                  conflux.Compression.fp16]
    assert {id(p) for p in opt._sets[1].params} == {id(named[0][1]), id(named[1][1])}
    sum((p * torch.from_numpy(contribution(rank, p.shape, "float16", i)).to(p.dtype)).sum()
        .double() for i, (_, p) in enumerate(named)).backward()
    opt.step()
    for i, (n, p) in enumerate(named):
        want = expected_reduce(conflux.Average, [contribution(r, p.shape, "float16", i)
                                                 for r in range(size)], "float16")
        np.testing.assert_allclose(p.grad.double().numpy(), want, rtol=2e-3, atol=2e-3, err_msg=n)
        assert in_set_storage(opt, p)


def test_a_compressor_of_ones_own_goes_per_call(rank, size):
    model = Net()
    opt = distributed(model, compression=Doubling)
    assert not opt._sets and len(opt._requires_update) == len(list(model.parameters()))
    ref = Reference(list(range(size)), use_emb=False, lr=0.1, momentum=0.9)
    for step in range(2):
        train(opt, model, ref, rank, step)
        assert not any(shared(p.grad) for p in model.parameters())


def test_parameters_added_later_commit_a_new_set(rank, size):
    model = Net()
    later = list(model.fc2.parameters())
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD([p for n, p in model.named_parameters() if not n.startswith("fc2")],
                        lr=0.1), named_parameters=model.named_parameters())
    assert len(opt._sets) == 1
    opt.add_param_group({"params": later})
    assert len(opt._sets) == 2 and all(in_set_storage(opt, p) for p in later)
    ref = Reference(list(range(size)), use_emb=False, lr=0.1)
    for step in range(2):
        train(opt, model, ref, rank, step)


def test_mismatched_registration_raises_mismatch_error(rank, size):
    """One rank registers a gradient of another shape, then one gradient more: construction
    fails on every rank with MismatchError naming the gradient (a HorovodInternalError too)."""
    last = size - 1

    def params(shape, extra=False):
        out = [("fc.weight", torch.nn.Parameter(torch.zeros(shape, dtype=torch.float64))),
               ("fc.bias", torch.nn.Parameter(torch.zeros(5, dtype=torch.float64)))]
        if extra:
            out.append(("extra.bias", torch.nn.Parameter(torch.zeros(2))))
        return out

    def make(named):
        return hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in named], lr=0.1),
                                        named_parameters=named)

    with pytest.raises(conflux.MismatchError, match=r"'fc\.weight' is float64 \[5, 8\] on rank 0 "
                                                    r"but float64 \[8, 5\] on rank %d" % last) as e:
        make(params((8, 5) if rank == last else (5, 8)))
    assert isinstance(e.value, hvd.HorovodInternalError)
    with pytest.raises(conflux.MismatchError, match=r"extra\.bias"):
        make(params((5, 8), extra=rank == last))
    named = params((5, 8))  # the next optimizer works
    opt = make(named)
    (named[1][1] * float(rank + 1)).sum().backward()
    opt.step()
    assert named[1][1].grad.tolist() == [(size + 1) / 2.0] * 5

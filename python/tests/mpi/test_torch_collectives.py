"""conflux.torch collectives x torch dtypes (float16 and bfloat16 included) x forms, checked against
results recomputed from every rank's known contribution; plus autograd and errors."""
import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="python3-torch is not installed")

import conflux.torch as cfx
from conftest import contribution, expected_reduce, tolerance

DTYPES = {"uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
          "int64": torch.int64, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float32": torch.float32, "float64": torch.float64, "bool": torch.bool}
FLOATS = ["float16", "bfloat16", "float32", "float64"]
OPS = {"Sum": cfx.Sum, "Average": cfx.Average, "Min": cfx.Min, "Max": cfx.Max,
       "Product": cfx.Product}


def tensor(x, dtype_name):
    return torch.from_numpy(np.array(x, copy=True)).to(DTYPES[dtype_name])  # never shares xs


def check(got, want, dtype_name):
    assert isinstance(got, torch.Tensor)
    assert got.dtype == DTYPES[dtype_name], (got.dtype, dtype_name)
    assert tuple(got.shape) == tuple(np.shape(want))
    got64 = got.to(torch.float64).numpy()
    tol = tolerance(dtype_name)
    if tol:
        np.testing.assert_allclose(got64, want, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(got64, want)


@pytest.mark.parametrize("form", ["allreduce", "allreduce_", "allreduce_async", "allreduce_async_"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_allreduce_forms(form, dtype, rank, size):
    seed = 100 + list(DTYPES).index(dtype)
    xs = [contribution(r, (4, 3), dtype, seed) for r in range(size)]
    t = tensor(xs[rank], dtype)
    before = t.clone()
    name = "t.ar.%s.%s" % (form, dtype)
    res = getattr(cfx, form)(t, op=cfx.Sum, name=name)
    if "async" in form:
        assert isinstance(res, cfx.Handle)
        res = cfx.synchronize(res)
    check(res, expected_reduce(cfx.Sum, xs, dtype), dtype)
    if form.endswith("_"):
        assert res is t
    else:
        assert torch.equal(t, before)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_allreduce_ops(op, dtype, rank, size):
    if op == "Average" and dtype == "bool":
        with pytest.raises(ValueError, match="bool"):  # refused locally, at the call
            cfx.allreduce(torch.ones(3, dtype=torch.bool), op=cfx.Average)
        return
    xs = [contribution(r, (9,), dtype, 200 + list(OPS).index(op), op == "Product")
          for r in range(size)]
    res = cfx.allreduce(tensor(xs[rank], dtype), op=OPS[op], name="t.op.%s.%s" % (op, dtype))
    check(res, expected_reduce(OPS[op], xs, dtype), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_scale_factors(dtype, rank, size):
    xs = [contribution(r, (6,), dtype, 300) for r in range(size)]
    res = cfx.allreduce(tensor(xs[rank], dtype), op=cfx.Sum, prescale_factor=0.5,
                        postscale_factor=4.0)
    check(res, expected_reduce(cfx.Sum, xs, dtype, 0.5, 4.0), dtype)


@pytest.mark.parametrize("inplace", [False, True])
def test_grouped_allreduce(inplace, rank, size):
    specs = [((3,), "float32"), ((2, 2), "bfloat16"), ((5,), "int64"), ((4,), "float16")]
    xs = [[contribution(r, s, d, 400 + i) for r in range(size)] for i, (s, d) in enumerate(specs)]
    ts = [tensor(xs[i][rank], d) for i, (_, d) in enumerate(specs)]
    if inplace:
        res = cfx.synchronize(cfx.grouped_allreduce_async_(ts, op=cfx.Sum, name="t.grp_"))
    else:
        res = cfx.grouped_allreduce(ts, op=cfx.Sum, name="t.grp")
    for i, (_, d) in enumerate(specs):
        check(res[i], expected_reduce(cfx.Sum, xs[i], d), d)
        assert (res[i] is ts[i]) == inplace


@pytest.mark.parametrize("asyn", [False, True])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_allgather(dtype, asyn, rank, size):
    xs = [contribution(r, (r + 1, 2), dtype, 500) for r in range(size)]
    t = tensor(xs[rank], dtype)
    res = cfx.synchronize(cfx.allgather_async(t)) if asyn else cfx.allgather(t)
    check(res, np.concatenate(xs), dtype)


@pytest.mark.parametrize("form", ["broadcast", "broadcast_", "broadcast_async", "broadcast_async_"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_broadcast(form, dtype, rank, size):
    root = size - 1
    xs = [contribution(r, (3, 2), dtype, 600) for r in range(size)]
    t = tensor(xs[rank], dtype)
    before = t.clone()
    res = getattr(cfx, form)(t, root, name="t.%s.%s" % (form, dtype))
    if "async" in form:
        res = cfx.synchronize(res)
    check(res, xs[root], dtype)
    if form.endswith("_"):
        assert res is t
    else:
        assert torch.equal(t, before)


@pytest.mark.parametrize("dtype", ["uint8", "int64", "float16", "bfloat16", "float32"])
def test_alltoall(dtype, rank, size):
    xs = [contribution(r, (2 * size, 3), dtype, 700) for r in range(size)]
    out, splits = cfx.alltoall(tensor(xs[rank], dtype))
    check(out, np.concatenate([xs[r][2 * rank:2 * rank + 2] for r in range(size)]), dtype)
    assert splits.tolist() == [2] * size
    sp = [(rank + j) % 2 + 1 for j in range(size)]
    rows = sum(sp)
    mine = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) + 1000 * rank
    out, received = cfx.synchronize(cfx.alltoall_async(mine, splits=torch.tensor(sp)))
    want = []
    for r in range(size):
        spr = [(r + j) % 2 + 1 for j in range(size)]
        full = np.arange(sum(spr) * 2, dtype=np.float64).reshape(-1, 2) + 1000 * r
        want.append(full[sum(spr[:rank]):sum(spr[:rank + 1])])
    check(out, np.concatenate(want), "float32")
    assert received.tolist() == [(r + rank) % 2 + 1 for r in range(size)]


@pytest.mark.parametrize("op", ["Sum", "Average"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "int32"])
def test_reducescatter(op, dtype, rank, size):
    d0 = 3 * size - 1
    xs = [contribution(r, (d0, 2), dtype, 800) for r in range(size)]
    res = cfx.reducescatter(tensor(xs[rank], dtype), op=OPS[op])
    full = expected_reduce(OPS[op], xs, dtype)
    q, rem = divmod(d0, size)
    start = rank * q + min(rank, rem)
    check(res, full[start:start + q + (1 if rank < rem else 0)], dtype)


def test_non_contiguous(rank, size):
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (rank + 1)
    res = cfx.allreduce(base.t(), op=cfx.Sum)  # out of place: made contiguous first
    assert torch.equal(res, torch.arange(12, dtype=torch.float32).reshape(3, 4).t() *
                       (size * (size + 1) / 2))
    with pytest.raises(ValueError, match="contiguous"):
        cfx.allreduce_(base.t())


def test_parameter_in_place_and_autograd(rank, size):
    p = torch.nn.Parameter(torch.full((3,), float(rank)))
    cfx.broadcast_(p, 0)
    assert torch.equal(p.detach(), torch.zeros(3))
    x = torch.full((2, 3), float(rank + 1), requires_grad=True)
    y = cfx.allreduce(x, op=cfx.Sum)
    assert y.requires_grad
    (y * (rank + 1)).sum().backward()
    # d/dx_r sum_s (s+1) * sum_q x_q = sum_s (s+1)
    assert torch.allclose(x.grad, torch.full((2, 3), size * (size + 1) / 2))
    g = torch.full((rank + 1, 2), 1.0, requires_grad=True)
    gathered = cfx.allgather(g)
    assert gathered.shape[0] == size * (size + 1) // 2
    gathered.sum().backward()
    assert torch.allclose(g.grad, torch.ones(rank + 1, 2))


def test_unsupported_dtype_is_type_error(rank, size):
    for dt in (torch.complex64, torch.quint8) if hasattr(torch, "quint8") else (torch.complex64,):
        try:
            t = torch.zeros(3, dtype=dt)
        except (RuntimeError, TypeError):
            continue
        with pytest.raises(TypeError, match="not supported"):
            cfx.allreduce(t)
        with pytest.raises(TypeError):
            cfx.allreduce_async_(t)
    with pytest.raises(TypeError):
        cfx.allreduce(np.ones(3))  # not a tensor
    res = cfx.allreduce(torch.ones(2), op=cfx.Sum)
    assert torch.equal(res, torch.full((2,), float(size)))


def test_mismatch_names_tensor_and_recovers(rank, size):
    t = torch.ones(2 + (rank == 0), dtype=torch.float32)
    with pytest.raises(cfx.MismatchError, match="t.mismatch"):
        cfx.allreduce(t, name="t.mismatch")
    res = cfx.allreduce(torch.ones(2), op=cfx.Sum, name="t.after_mismatch")
    assert torch.equal(res, torch.full((2,), float(size)))


def test_objects(rank, size):
    obj = {"rank": rank, "payload": list(range(rank * 3))}
    got = cfx.broadcast_object(obj if rank == 1 else None, root_rank=1)
    assert got == {"rank": 1, "payload": [0, 1, 2]}
    every = cfx.allgather_object(obj)
    assert every == [{"rank": r, "payload": list(range(r * 3))} for r in range(size)]


def test_broadcast_parameters_and_optimizer_state(rank, size):
    torch.manual_seed(rank)  # different init on every rank
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1))
    if rank == 0:
        model(torch.randn(5, 4)).sum().backward()
        opt.step()  # root has Adam state; the others have none yet
    cfx.broadcast_parameters(model.state_dict(), root_rank=0)
    cfx.broadcast_optimizer_state(opt, root_rank=0)
    flat = torch.cat([v.reshape(-1).to(torch.float64) for v in model.state_dict().values()])
    every = cfx.allgather(flat.unsqueeze(0))
    for r in range(size):
        assert torch.equal(every[r], every[0])
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
    states = cfx.allgather_object({k: {n: (v.tolist() if torch.is_tensor(v) else v)
                                       for n, v in s.items()}
                                   for k, s in opt.state_dict()["state"].items()})
    assert all(s == states[0] for s in states) and states[0]


def test_grouped_allgather_and_reducescatter(rank, size):
    specs = [((2, 2), "bfloat16"), ((3,), "float16"), ((1, 4), "int32")]
    xs = [[contribution(r, (s[0] + r,) + s[1:], d, 900 + i) for r in range(size)]
          for i, (s, d) in enumerate(specs)]
    res = cfx.grouped_allgather([tensor(xs[i][rank], d) for i, (_, d) in enumerate(specs)])
    for i, (_, d) in enumerate(specs):
        check(res[i], np.concatenate(xs[i]), d)
    ys = [[contribution(r, (size + 1, 2), d, 950 + i) for r in range(size)]
          for i, (_, d) in enumerate(specs)]
    res = cfx.synchronize(cfx.grouped_reducescatter_async(
        [tensor(ys[i][rank], d) for i, (_, d) in enumerate(specs)], op=cfx.Sum))
    q, rem = divmod(size + 1, size)
    start = rank * q + min(rank, rem)
    for i, (_, d) in enumerate(specs):
        full = expected_reduce(cfx.Sum, ys[i], d)
        check(res[i], full[start:start + q + (1 if rank < rem else 0)], d)

"""conflux.horovod.torch against Horovod 0.28's behaviour: grouped ops, reducescatter and alltoall
differentiable (on the global set and on a process set), sparse allreduce and sparse gradients in
DistributedOptimizer, build queries, Horovod's module paths (and a `horovod` alias package of one
line per module), and join never hanging while the other ranks call allgather. Gradients and
results are recomputed here from every rank's known contribution."""
import os
import sys

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="python3-torch is not installed")

import conflux
import conflux.horovod.torch as hvd
from conftest import contribution


def value(rank, shape, seed):
    return torch.from_numpy(contribution(rank, shape, "float64", seed))


@pytest.fixture(params=["global", "subset"])
def where(request, size):
    """(process set, its ranks): the global set, or all ranks but the first (rank 0 alone at 2
    ranks would leave rank 1 out; all but the first is [1] then)."""
    if request.param == "global":
        yield hvd.global_process_set, list(range(size))
        return
    ps = hvd.add_process_set(list(range(1, size)))
    yield ps, ps.ranks
    hvd.remove_process_set(ps)


def leaf(t):
    return t.clone().requires_grad_(True)


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_grouped_allreduce_gradient(where, op, rank, size):
    ps, members = where
    if rank not in members:
        return
    shapes = [(3,), (2, 2)]
    xs = [leaf(value(rank, s, i)) for i, s in enumerate(shapes)]
    out = hvd.grouped_allreduce(xs, op=getattr(hvd, op), process_set=ps)
    div = len(members) if op == "Average" else 1
    for i, s in enumerate(shapes):
        assert torch.allclose(out[i], sum(value(r, s, i) for r in members) / div)
    sum((value(rank, s, 10 + i) * o).sum() for i, (s, o) in enumerate(zip(shapes, out))).backward()
    for i, s in enumerate(shapes):  # the gradients, allreduced with the same op
        assert torch.allclose(xs[i].grad, sum(value(r, s, 10 + i) for r in members) / div)


def test_grouped_allgather_gradient(where, rank, size):
    ps, members = where
    if rank not in members:
        return
    rows = {r: [r % 2 + 1, 2] for r in members}  # rows of the two tensors, per rank
    xs = [leaf(value(rank, (rows[rank][0], 2), 1)), leaf(value(rank, (rows[rank][1],), 2))]
    out = hvd.grouped_allgather(xs, process_set=ps)
    assert torch.equal(out[0], torch.cat([value(r, (rows[r][0], 2), 1) for r in members]))
    assert torch.equal(out[1], torch.cat([value(r, (rows[r][1],), 2) for r in members]))
    ws = {r: [value(r, tuple(o.shape), 20 + i) for i, o in enumerate(out)] for r in members}
    sum((w * o).sum() for w, o in zip(ws[rank], out)).backward()
    for i in range(2):
        mean = sum(ws[r][i] for r in members) / len(members)
        start = sum(rows[r][i] for r in members[:members.index(rank)])
        assert torch.allclose(xs[i].grad, mean[start:start + rows[rank][i]])


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_reducescatter_gradients_single_and_grouped(where, op, rank, size):
    """The forward reduces and scatters; the gradient is Horovod's (HorovodReducescatter.backward):
    the allgathered gradient times the set's size for Sum (times 1 for Average), times the
    prescale and postscale factors."""
    ps, members = where
    if rank not in members:
        return
    n, me = len(members), members.index(rank)
    shapes = [(2 * n + 1, 2), (n,)]
    div = n if op == "Average" else 1
    horovod = n if op == "Sum" else 1
    xs = [leaf(value(rank, s, 30 + i)) for i, s in enumerate(shapes)]
    single = hvd.reducescatter(xs[0], op=getattr(hvd, op), process_set=ps, prescale_factor=2.0)
    grouped = hvd.grouped_reducescatter(xs, op=getattr(hvd, op), process_set=ps,
                                        postscale_factor=0.5)
    for i, s in enumerate(shapes):
        block = torch.tensor_split(sum(value(r, s, 30 + i) for r in members) / div, n)[me]
        assert torch.allclose(grouped[i], 0.5 * block)
    assert torch.allclose(single, 2 * torch.tensor_split(
        sum(value(r, shapes[0], 30) for r in members) / div, n)[me])

    def weights(r, i):  # rank r's weights of its block of tensor i
        return value(r, tuple(torch.tensor_split(torch.zeros(shapes[i]), n)[members.index(r)]
                              .shape), 40 + i)

    loss = (weights(rank, 0) * single).sum() + sum((weights(rank, i) * g).sum()
                                                   for i, g in enumerate(grouped))
    loss.backward()
    # x0 feeds both: single (prescale 2) and grouped (postscale 0.5)
    want0 = torch.cat([weights(r, 0) for r in members]) * horovod * (2.0 + 0.5)
    assert torch.allclose(xs[0].grad, want0)
    assert torch.allclose(xs[1].grad, torch.cat([weights(r, 1) for r in members]) * horovod * 0.5)


def test_process_set_reducescatter_gradient_is_the_forwards(rank, size):
    """conflux.torch.ProcessSet keeps the forward's factor (the mathematical gradient): only
    conflux.horovod.torch follows Horovod."""
    import conflux.torch as cfx
    with cfx.ProcessSet(list(range(size))) as ps:
        x = leaf(value(rank, (size,), 50))
        out = ps.reducescatter(x, op=cfx.Average)
        (out * (rank + 1)).sum().backward()
        assert torch.allclose(x.grad, torch.arange(1, size + 1, dtype=torch.float64) / size)


def test_alltoall_gradient(where, rank, size):
    ps, members = where
    if rank not in members:
        return
    n = len(members)
    x = leaf(torch.arange(2 * n, dtype=torch.float64) + 100 * rank)
    out = hvd.alltoall(x, process_set=ps)  # two elements to every member
    assert out.tolist() == [100 * r + 2 * members.index(rank) + k for r in members for k in (0, 1)]
    w = torch.arange(2 * n, dtype=torch.float64) * (rank + 1)
    (w * out).sum().backward()
    # x's element 2j + k went to member j, whose weight for it is w_j[2 * me + k]
    me = members.index(rank)
    want = [(members[j] + 1) * (2 * me + k) for j in range(n) for k in (0, 1)]
    assert xs_equal(x.grad, want)


def xs_equal(t, values):
    return t.tolist() == [float(v) for v in values]


def test_async_forms_take_tensors_that_require_grad(rank, size):
    xs = [leaf(torch.full((2,), float(rank))), leaf(torch.ones(3))]
    got = hvd.synchronize(hvd.grouped_allreduce_async(xs, op=hvd.Sum))
    assert got[0].tolist() == [size * (size - 1) / 2] * 2 and got[1].tolist() == [size] * 3
    got = hvd.synchronize(hvd.grouped_allgather_async(xs))
    assert got[1].tolist() == [1.0] * 3 * size
    got = hvd.synchronize(hvd.grouped_reducescatter_async([leaf(torch.ones(size, 2))], op=hvd.Sum))
    assert got[0].tolist() == [[size, size]]


# ---- sparse ----
def sparse_of(rank, size, seed, hybrid=False):
    """Rank `rank`'s sparse COO tensor (uncoalesced: an index may repeat), rank 1's empty."""
    rng = np.random.default_rng([seed, rank])
    nnz = 0 if rank == 1 else 4
    idx = torch.from_numpy(rng.integers(0, size + 2, size=(1, nnz)))
    shape = (size + 2, 3) if hybrid else (size + 2,)
    vals = torch.from_numpy(rng.integers(-5, 6, size=(nnz,) + shape[1:]).astype(np.float64))
    return torch.sparse_coo_tensor(idx, vals, shape)


@pytest.mark.parametrize("hybrid", [False, True])
@pytest.mark.parametrize("op", ["Sum", "Average", "Min"])
def test_sparse_allreduce(where, op, hybrid, rank, size):
    ps, members = where
    if rank not in members:
        return
    sp = sparse_of(rank, size, 5, hybrid)
    dense = torch.stack([sparse_of(r, size, 5, hybrid).to_dense() for r in members])
    want = {"Sum": dense.sum(0), "Average": dense.mean(0), "Min": dense.min(0).values}[op]
    results = [hvd.allreduce(sp, op=getattr(hvd, op), name="sparse.a", process_set=ps),
               hvd.synchronize(hvd.allreduce_async(sp, op=getattr(hvd, op), process_set=ps))]
    if op != "Min":
        results.append(hvd.sparse_allreduce_async(sp, name="sparse.b", op=getattr(hvd, op),
                                                  process_set=ps)())
    for got in results:
        assert got.is_sparse and got.is_coalesced()
        assert torch.allclose(got.to_dense(), want)


def test_sparse_allreduce_needs_a_sparse_tensor(rank, size):
    with pytest.raises(ValueError, match="sparse"):
        hvd.sparse_allreduce_async(torch.ones(2), name="dense", op=hvd.Sum)


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_distributed_optimizer_with_sparse_gradients(sparse_as_dense, rank, size):
    """nn.Embedding(sparse=True): rank r looks up rows r and r + 1 (mod V); the averaged
    gradient of row j is its share of lookups."""
    vocab = size + 1
    emb = torch.nn.Embedding(vocab, 2, sparse=True)
    with torch.no_grad():
        emb.weight.fill_(1.0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5),
                                   named_parameters=emb.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    for step in range(2):
        opt.zero_grad()
        emb(torch.tensor([rank, (rank + 1) % vocab])).sum().backward()
        opt.step()
        assert emb.weight.grad.is_sparse  # the gradient keeps its layout
    counts = torch.zeros(vocab)
    for r in range(size):
        counts[r] += 1
        counts[(r + 1) % vocab] += 1
    want = 1.0 - 2 * 0.5 * counts / size
    assert torch.allclose(emb.weight.detach(), want[:, None].expand(vocab, 2).float())


# ---- build queries and module paths ----
def test_build_queries_return_what_horovod_returns(rank, size):
    from conflux.horovod.common import util
    f = conflux.features()
    v = hvd.nccl_built()
    assert type(v) is int and (v == 0) == (not f["nccl"])
    if v:
        assert v >= 2000 and v == util.nccl_built(verbose=True)  # e.g. 22809 for NCCL 2.28.9
    assert hvd.mpi_built() is True and util.mpi_built() is True  # these suites run under mpirun
    assert hvd.mpi_enabled() is True and hvd.mpi_threads_supported() is True
    assert hvd.cuda_built() is f["cuda"] and util.cuda_built(verbose=False) is f["cuda"]
    for name in ("gloo_built", "ddl_built", "ccl_built", "rocm_built"):
        assert getattr(hvd, name)() is False and getattr(util, name)() is False
    assert hvd.gloo_enabled() is False
    assert util.split_list(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert util.num_rank_is_power_2(4) and not util.num_rank_is_power_2(6)


MODULES = {
    "conflux.horovod.torch.mpi_ops": "synchronize poll join barrier allreduce_async_ "
                                     "grouped_allreduce Average Sum Adasum Min Max Product size rank "
                                     "init shutdown ProcessSet global_process_set is_homogeneous "
                                     "sparse_allreduce_async nccl_built mpi_threads_supported",
    "conflux.horovod.torch.compression": "Compression Compressor NoneCompressor FP16Compressor",
    "conflux.horovod.torch.functions": "broadcast_parameters broadcast_optimizer_state "
                                       "broadcast_object allgather_object",
    "conflux.horovod.torch.optimizer": "DistributedOptimizer",
    "conflux.horovod.torch.sync_batch_norm": "SyncBatchNorm",
    "conflux.horovod.torch.elastic": "run TorchState ElasticSampler",
    "conflux.horovod.common.util": "mpi_built gloo_built nccl_built ddl_built ccl_built "
                                   "cuda_built rocm_built is_iterable split_list",
    "conflux.horovod.common.exceptions": "HorovodInternalError HostsUpdatedInterrupt",
    "conflux.horovod.common.process_sets": "ProcessSet global_process_set add_process_set "
                                           "remove_process_set",
}


def test_horovods_module_paths_and_a_one_line_alias_package(tmp_path, rank, size):
    import importlib
    for module, names in MODULES.items():
        m = importlib.import_module(module)
        missing = [n for n in names.split() if not hasattr(m, n)]
        assert not missing, (module, missing)
    # a `horovod` package made of one line per module
    for module in list(MODULES) + ["conflux.horovod.torch", "conflux.horovod.common",
                                   "conflux.horovod"]:
        rel = module.replace("conflux.", "", 1).split(".")
        path = tmp_path.joinpath(*rel[:-1])
        path.mkdir(parents=True, exist_ok=True)
        is_pkg = module in ("conflux.horovod", "conflux.horovod.torch", "conflux.horovod.common")
        target = path / rel[-1] / "__init__.py" if is_pkg else path / (rel[-1] + ".py")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("from %s import *  # noqa\n" % module)
    sys.path.insert(0, str(tmp_path))
    try:
        import horovod.torch as alias
        from horovod.torch.mpi_ops import synchronize
        from horovod.common.exceptions import HorovodInternalError
        from horovod.common.util import nccl_built
        assert alias.global_process_set is hvd.global_process_set
        assert nccl_built() == hvd.nccl_built()
        h = alias.allreduce_async(torch.tensor([rank + 1.0]), op=alias.Sum, name="alias")
        assert synchronize(h).item() == size * (size + 1) / 2
        with pytest.raises(HorovodInternalError):
            alias.allreduce(torch.ones(2 if rank else 3), name="alias.mismatch")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == "horovod" or m.startswith("horovod.")]:
            del sys.modules[name]


# ---- join ----
@pytest.mark.parametrize("named", [False, True])
def test_join_never_hangs_while_the_others_allgather(named, rank, size):
    """Each rank in turn joins first; the others' allgather fails at once (only allreduce takes
    part in join), their allreduce gets the joined rank's zeros, then they join too."""
    for round_ in range(2 * size):
        first = round_ % size
        if rank == first:
            last = hvd.join()
        else:
            name = "join.gather.%d" % (round_ % 2) if named else None
            with pytest.raises(hvd.HorovodInternalError) as info:
                hvd.allgather(torch.tensor([float(rank)]), name=name)
            assert isinstance(info.value, conflux.JoinedError), info.value
            s = hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum, name="join.sum")
            assert s.item() == size * (size + 1) / 2 - (first + 1)
            last = hvd.join()
        assert last != first and last in range(size)
        assert hvd.allgather_object(last, name="join.last") == [last] * size


def test_objects_travel_by_cloudpickle(rank, size):
    """As in Horovod: lambdas and local classes cross too (the default names are the same on
    every rank, so ranks other than root may pass None)."""
    pytest.importorskip("cloudpickle", reason="python3-cloudpickle is not installed")
    root = size - 1

    class Local:
        def __init__(self, r):
            self.r = r

    fn = hvd.broadcast_object((lambda x: x * 10 + root) if rank == root else None, root_rank=root)
    assert fn(2) == 20 + root
    got = hvd.allgather_object(Local(rank))
    assert [o.r for o in got] == list(range(size))

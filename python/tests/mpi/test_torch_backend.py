"""torch.distributed on the backend "conflux" (conflux/torch_backend.py): every collective through
dist.* checked against results recomputed from each rank's known contribution, Work and future
semantics, dist.new_group on subset contexts, the rendezvous, and the errors (an op the engine has
not, point-to-point, a tensor that differs across ranks, torch's rank against the engine's)."""
import gc

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="python3-torch is not installed")
import torch.distributed as dist

import conflux
import conflux.torch  # noqa: F401  (registers "conflux")
from conflux import torch_backend
from conftest import contribution, expected_reduce, tolerance


def ensure_group():
    """The default group on "conflux", made with no arguments (under mpirun the env:// rendezvous
    falls back to conflux://)."""
    if not dist.is_initialized():
        dist.init_process_group("conflux")
    assert dist.get_backend() == "conflux"
    return dist.group.WORLD


@pytest.fixture(autouse=True)
def world(rank, size):
    pg = ensure_group()
    assert (dist.get_rank(), dist.get_world_size()) == (rank, size)
    return pg


def mine(rank, shape, dtype, seed, positive=False):
    name = str(dtype).rpartition(".")[2]
    return torch.from_numpy(contribution(rank, shape, name, seed, positive)).to(dtype)


def everyone(size, shape, dtype, seed, positive=False):
    name = str(dtype).rpartition(".")[2]
    return [contribution(r, shape, name, seed, positive) for r in range(size)]


REDUCE_OPS = {"SUM": (dist.ReduceOp.SUM, conflux.Sum), "PRODUCT": (dist.ReduceOp.PRODUCT, conflux.Product),
              "MIN": (dist.ReduceOp.MIN, conflux.Min), "MAX": (dist.ReduceOp.MAX, conflux.Max)}
if hasattr(dist.ReduceOp, "AVG"):
    REDUCE_OPS["AVG"] = (dist.ReduceOp.AVG, conflux.Average)


@pytest.mark.parametrize("op", list(REDUCE_OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64,
                                   torch.float16, torch.bfloat16, torch.uint8])
def test_all_reduce(op, dtype, rank, size):
    torch_op, cfx_op = REDUCE_OPS[op]
    seed = 10 + list(REDUCE_OPS).index(op)
    name = str(dtype).rpartition(".")[2]
    t = mine(rank, (5, 3), dtype, seed, op == "PRODUCT")
    dist.all_reduce(t, op=torch_op)
    want = expected_reduce(cfx_op, everyone(size, (5, 3), dtype, seed, op == "PRODUCT"), name)
    np.testing.assert_allclose(t.to(torch.float64).numpy(), want, rtol=tolerance(name) or 1e-6)


def test_all_reduce_non_contiguous_and_scalar(rank, size):
    base = mine(rank, (4, 6), torch.float32, 20)
    view = base.t()  # written through the view: base changes too
    dist.all_reduce(view)
    want = np.sum(everyone(size, (4, 6), torch.float32, 20), axis=0)
    np.testing.assert_allclose(base.numpy(), want, rtol=1e-6)
    s = torch.tensor(float(rank + 1))
    dist.all_reduce(s)
    assert s.item() == size * (size + 1) / 2


def test_all_reduce_coalesced(rank, size):
    a, b = mine(rank, (3,), torch.float64, 21), mine(rank, (2, 2), torch.float64, 22)
    dist.all_reduce_coalesced([a, b])
    np.testing.assert_allclose(a.numpy(), np.sum(everyone(size, (3,), torch.float64, 21), 0))
    np.testing.assert_allclose(b.numpy(), np.sum(everyone(size, (2, 2), torch.float64, 22), 0))


@pytest.mark.parametrize("root", [0, 1, -1])
def test_broadcast(root, rank, size):
    root = root % size
    t = mine(rank, (7,), torch.float32, 30)
    dist.broadcast(t, root)
    np.testing.assert_array_equal(t.numpy(), everyone(size, (7,), torch.float32, 30)[root])


def test_all_gather(rank, size):
    outs = [torch.empty(2, 3, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(outs, mine(rank, (2, 3), torch.int64, 40))
    for r, o in enumerate(outs):
        np.testing.assert_array_equal(o.numpy(), contribution(r, (2, 3), "int64", 40))


@pytest.mark.parametrize("fn", ["_all_gather_base", "all_gather_into_tensor"])
def test_all_gather_into_tensor(fn, rank, size):
    if not hasattr(dist, fn):
        pytest.skip("torch %s has no dist.%s" % (torch.__version__, fn))
    out = torch.empty(size * 4, dtype=torch.float32)
    getattr(dist, fn)(out, mine(rank, (4,), torch.float32, 41))
    np.testing.assert_array_equal(out.numpy(),
                                  np.concatenate(everyone(size, (4,), torch.float32, 41)))


@pytest.mark.parametrize("op", ["SUM", "AVG", "MIN", "MAX"])
def test_reduce_scatter(op, rank, size):
    if op not in REDUCE_OPS:
        pytest.skip("torch %s has no ReduceOp.%s" % (torch.__version__, op))
    torch_op, cfx_op = REDUCE_OPS[op]
    seed = 50 + ["SUM", "AVG", "MIN", "MAX"].index(op)
    ins = list(mine(rank, (size, 3), torch.float32, seed).unbind(0))
    out = torch.empty(3)
    dist.reduce_scatter(out, ins, op=torch_op)
    want = expected_reduce(cfx_op, everyone(size, (size, 3), torch.float32, seed), "float32")
    np.testing.assert_allclose(out.numpy(), want[rank], rtol=1e-6)


def test_reduce_scatter_tensor(rank, size):
    fn = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
    out = torch.empty(2, 2)
    fn(out, mine(rank, (size * 2, 2), torch.float32, 55))
    want = np.sum(everyone(size, (size * 2, 2), torch.float32, 55), axis=0)
    np.testing.assert_allclose(out.numpy(), want[2 * rank:2 * rank + 2], rtol=1e-6)


def test_all_to_all_single_even(rank, size):
    out = torch.empty(size * 2, dtype=torch.int64)
    dist.all_to_all_single(out, mine(rank, (size * 2,), torch.int64, 60))
    xs = everyone(size, (size * 2,), torch.int64, 60)
    want = np.concatenate([xs[r][2 * rank:2 * rank + 2] for r in range(size)])
    np.testing.assert_array_equal(out.numpy(), want)


def test_all_to_all_single_uneven(rank, size):
    # rank r sends j + r + 1 rows to rank j
    sends = [[j + r + 1 for j in range(size)] for r in range(size)]
    rows = [sum(s) for s in sends]
    xs = [contribution(r, (rows[r], 2), "float32", 61) for r in range(size)]
    received = [sends[r][rank] for r in range(size)]
    out = torch.empty(sum(received), 2)
    dist.all_to_all_single(out, torch.from_numpy(xs[rank]).float(), received, sends[rank])
    want = np.concatenate([xs[r][sum(sends[r][:rank]):sum(sends[r][:rank + 1])]
                           for r in range(size)])
    np.testing.assert_array_equal(out.numpy(), want)


def test_all_to_all_list(rank, size):
    # rank r sends j + 1 elements to rank j, as a tensor of shape (j + 1,)
    xs = [contribution(r, (size * (size + 1) // 2,), "float32", 62) for r in range(size)]
    mine_ = torch.from_numpy(xs[rank]).float()
    ins = list(mine_.split([j + 1 for j in range(size)]))
    outs = [torch.empty(rank + 1) for _ in range(size)]
    dist.all_to_all(outs, ins)
    start = rank * (rank + 1) // 2
    for r, o in enumerate(outs):
        np.testing.assert_array_equal(o.numpy(), xs[r][start:start + rank + 1])


def test_reduce_gather_scatter(rank, size):
    root = size - 1
    t = mine(rank, (3,), torch.float32, 70)
    dist.reduce(t, root)
    if rank == root:
        np.testing.assert_array_equal(t.numpy(), np.sum(everyone(size, (3,), torch.float32, 70), 0))
    else:
        np.testing.assert_array_equal(t.numpy(), contribution(rank, (3,), "float32", 70))
    outs = [torch.empty(3) for _ in range(size)] if rank == root else None
    dist.gather(mine(rank, (3,), torch.float32, 71), outs, dst=root)
    if rank == root:
        for r, o in enumerate(outs):
            np.testing.assert_array_equal(o.numpy(), contribution(r, (3,), "float32", 71))
    out = torch.empty(2)
    ins = list(mine(root, (size, 2), torch.float32, 72).unbind(0)) if rank == root else None
    dist.scatter(out, ins, src=root)
    np.testing.assert_array_equal(out.numpy(), contribution(root, (size, 2), "float32", 72)[rank])


def test_object_collectives(rank, size):
    """torch's pickled-object collectives (all_gather and broadcast of uint8 tensors underneath)."""
    got = [None] * size
    dist.all_gather_object(got, {"rank": rank, "name": "r%d" % rank})
    assert got == [{"rank": r, "name": "r%d" % r} for r in range(size)]
    objects = [("from", rank), list(range(rank + 2))]
    dist.broadcast_object_list(objects, src=size - 1)
    assert objects == [("from", size - 1), list(range(size + 1))]


def test_barrier_and_work(rank, size):
    dist.barrier()
    t = mine(rank, (4,), torch.float32, 80)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    chained = fut.then(lambda f: f.value()[0] * 2)
    assert work.wait() is True
    assert work.is_completed() and work.is_success() and work.exception() is None
    want = np.sum(everyone(size, (4,), torch.float32, 80), 0)
    np.testing.assert_allclose(fut.wait()[0].numpy(), want)
    np.testing.assert_allclose(chained.wait().numpy(), 2 * want)


def test_many_async_works_collected(rank, size):
    """Works dropped while pending and collected: each collective still completes, in order."""
    ts = [torch.full((3,), float(rank + i)) for i in range(40)]
    futs = []
    for t in ts:
        futs.append(dist.all_reduce(t, async_op=True).get_future())
        gc.collect()
    for i, f in enumerate(futs):
        f.wait()
        assert torch.all(ts[i] == sum(r + i for r in range(size)))


def test_new_group(rank, size):
    members = [0, size - 1]
    group = dist.new_group(members)
    rest = dist.new_group(list(range(1, size)))  # overlapping sets run independently
    if rank in members:
        t = mine(rank, (3,), torch.float32, 90)
        dist.all_reduce(t, group=group)
        xs = everyone(size, (3,), torch.float32, 90)
        np.testing.assert_array_equal(t.numpy(), xs[0] + xs[size - 1])
        b = torch.full((2,), float(rank))
        dist.broadcast(b, size - 1, group=group)  # global rank as torch gives it
        assert torch.all(b == size - 1)
        assert dist.get_rank(group) == members.index(rank)
    else:
        assert group == dist.GroupMember.NON_GROUP_MEMBER
    if rank >= 1:
        t = torch.ones(2)
        dist.all_reduce(t, group=rest)
        assert torch.all(t == size - 1)
    dist.destroy_process_group(group)
    dist.destroy_process_group(rest)


def test_gloo_group_beside(rank, size):
    """A gloo group in the same job (its store came from the same rendezvous)."""
    gloo = dist.new_group(backend="gloo")
    t = torch.full((2,), float(rank))
    dist.all_reduce(t, group=gloo)
    assert torch.all(t == size * (size - 1) / 2)
    dist.destroy_process_group(gloo)


def test_rendezvous_store(rank, size):
    store, r, n = next(torch_backend._conflux_rendezvous("conflux://"))
    assert (r, n) == (rank, size)
    store.set("from%d" % rank, str(rank * 7))
    for peer in range(size):
        assert store.get("from%d" % peer) == str(peer * 7).encode()
    dist.barrier()  # rank 0's store serves until every rank has read


def test_unsupported_op_names_it(rank, size):
    with pytest.raises(ValueError, match="no reduction op BAND"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND)
    with pytest.raises(ValueError, match="no reduction op BXOR .*reduce_scatter"):
        dist.reduce_scatter(torch.ones(1), [torch.ones(1)] * size, op=dist.ReduceOp.BXOR)


def test_point_to_point_refused(rank, size):
    peer = (rank + 1) % size
    with pytest.raises(RuntimeError, match=r"no point-to-point send \(to rank %d\)" % peer):
        dist.send(torch.ones(1), peer)
    with pytest.raises(RuntimeError, match="no point-to-point recv"):
        dist.recv(torch.ones(1), (rank + 1) % size)


def test_mismatch_across_ranks_raises_with_name(rank, size):
    """Rank 0 reduces 3 values, the others 4: every rank gets the engine's error naming the
    collective's tensor and both shapes."""
    t = torch.ones(3 if rank == 0 else 4)
    with pytest.raises(conflux.MismatchError) as info:
        dist.all_reduce(t)
    message = str(info.value)
    assert "[3]" in message and "[4]" in message, message
    assert "allreduce" in message.lower(), message
    dist.barrier()  # the group still works
    t = torch.ones(2)
    dist.all_reduce(t)
    assert torch.all(t == size)


def test_creator_checks_rank_and_size(rank, size):
    from types import SimpleNamespace
    wrong = SimpleNamespace(group_rank=(rank + 1) % size, group_size=size,
                            global_ranks_in_group=[])
    with pytest.raises(RuntimeError, match="rank %d of %d, but the Conflux engine's job says "
                       "rank %d of %d" % ((rank + 1) % size, size, rank, size)):
        torch_backend._create(wrong)
    wrong = SimpleNamespace(group_rank=rank, group_size=size + 1, global_ranks_in_group=[])
    with pytest.raises(RuntimeError, match="of %d, but .* of %d" % (size + 1, size)):
        torch_backend._create(wrong)


def test_registered_once():
    torch_backend.register()  # a second one (conflux.torch made the first): no assertion by torch
    assert "CONFLUX" in dist.Backend._plugins

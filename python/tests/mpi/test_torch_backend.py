"""torch.distributed on the backend "conflux" (conflux/torch_backend.py): every collective through
dist.* checked against results recomputed from each rank's known contribution, Work and future
semantics, dist.new_group on subset contexts, the rendezvous, and the errors (an op the engine has
not, point-to-point, a tensor that differs across ranks, torch's rank against the engine's)."""
import gc
import os

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
        dist.init_process_group(
            "conflux", init_method=None if "MASTER_ADDR" in os.environ else "conflux://")
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


@pytest.mark.parametrize("dtype,count", [(torch.float32, 5), (torch.float16, 3), (torch.int8, 7),
                                         (torch.float64, 1), (torch.bool, 3)])
def test_all_gather_into_tensor_keeps_every_bit(dtype, count, rank, size):
    """Every rank's bytes arrive unchanged, whatever the dtype and row size (rows of an odd number
    of bytes too): -0.0, NaN and infinities included, into a non-contiguous output as well."""
    if dtype == torch.bool:
        mine_ = torch.tensor([(rank + j) % 2 == 0 for j in range(count)])
    elif dtype.is_floating_point:
        specials = [-0.0, float("nan"), float("inf"), -float("inf"), rank + 0.5]
        mine_ = torch.tensor([specials[(rank + j) % len(specials)] for j in range(count)], dtype=dtype)
    else:
        mine_ = torch.tensor([(-1) ** j * (rank * 10 + j) for j in range(count)], dtype=dtype)
    rows = [torch.zeros(count, dtype=dtype) for _ in range(size)]
    dist.all_gather(rows, mine_)  # the reference: each rank's tensor, through the plain allgather
    out = torch.empty(size * count, dtype=dtype)
    dist.all_gather_into_tensor(out, mine_)
    strided = torch.empty(count, size, dtype=dtype).t()  # (size, count), not contiguous
    dist.all_gather_into_tensor(strided, mine_)
    want = torch.cat(rows)
    for got in (out, strided.reshape(-1)):
        assert got.view(torch.uint8).tolist() == want.view(torch.uint8).tolist()
    signs = [torch.signbit(r).tolist() for r in rows] if dtype.is_floating_point else None
    if signs is not None:  # -0.0 kept its sign
        assert torch.signbit(out).tolist() == [b for r in signs for b in r]


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
    with pytest.raises(RuntimeError, match=r"no point-to-point recv \(from rank %d\)" % peer):
        dist.recv(torch.ones(1), peer)
    with pytest.raises(RuntimeError, match=r"no point-to-point recv \(from rank -1\)"):
        dist.recv(torch.ones(1))  # from any source


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


# ---- the native backend (conflux._torch_c10d): every c10d entry point and group kind ----
def backend_of(group=None):
    pg = group if group is not None else dist.group.WORLD
    return pg._get_backend(torch.device("cpu"))


def test_backend_is_native(rank, size):
    from conflux import _torch_c10d
    b = backend_of()
    assert isinstance(b, _torch_c10d.Backend)
    assert b.name() == "conflux" and (b.rank(), b.size()) == (rank, size)
    assert b.supports_splitting
    # the job's context, the one conflux.torch's own collectives use
    assert b._context_address == conflux._core.current().address


@pytest.mark.parametrize("factor", ["scalar", "tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_all_reduce_premul_sum(factor, dtype, rank, size):
    """PREMUL_SUM: each rank's tensor times the factor, summed (the engine's prescale)."""
    f = 2.5
    op = dist._make_nccl_premul_sum(f if factor == "scalar" else torch.tensor(f, dtype=dtype))
    t = mine(rank, (4, 2), dtype, 23)
    dist.all_reduce(t, op=op)
    want = sum(f * x for x in everyone(size, (4, 2), dtype, 23))
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-6)
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, mine(rank, (size * 2,), dtype, 24).float(), op=op)
    want = sum(f * x for x in everyone(size, (size * 2,), dtype, 24))
    np.testing.assert_allclose(out.numpy(), want[2 * rank:2 * rank + 2], rtol=1e-6)


@pytest.mark.parametrize("op", ["BAND", "BOR", "BXOR"])
def test_unsupported_ops_name_the_op(op, rank, size):
    with pytest.raises(ValueError, match="no reduction op %s \\(allreduce\\)" % op):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=getattr(dist.ReduceOp, op))
    dist.barrier()  # nothing was submitted: the group goes on


def test_all_gather_and_reduce_scatter_coalesced(rank, size):
    b = backend_of()
    ins = [mine(rank, (3,), torch.float32, 42), mine(rank, (2, 2), torch.float64, 43)]
    outs = [torch.empty(size * 3), torch.empty(size * 2, 2, dtype=torch.float64)]
    b.all_gather_single_coalesced(outs, ins).wait()  # torch's name for allgather_into_tensor_coalesced
    np.testing.assert_array_equal(outs[0].numpy(), np.concatenate(everyone(size, (3,), torch.float32, 42)))
    np.testing.assert_array_equal(outs[1].numpy(), np.concatenate(everyone(size, (2, 2), torch.float64, 43)))
    ins = [mine(rank, (size * 2,), torch.float32, 56), mine(rank, (size, 3), torch.float64, 57)]
    outs = [torch.empty(2), torch.empty(1, 3, dtype=torch.float64)]
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    b.reduce_scatter_single_coalesced(outs, ins, opts).wait()
    want0 = np.max(everyone(size, (size * 2,), torch.float32, 56), axis=0)
    want1 = np.max(everyone(size, (size, 3), torch.float64, 57), axis=0)
    np.testing.assert_array_equal(outs[0].numpy(), want0[2 * rank:2 * rank + 2])
    np.testing.assert_array_equal(outs[1].numpy(), want1[rank:rank + 1])


def test_non_contiguous_everywhere(rank, size):
    """Strided inputs and outputs: copied in and out by the backend."""
    src = mine(rank, (3, 4), torch.float32, 63)
    out = torch.zeros(4, size * 3).t()  # (size * 3, 4), not contiguous
    dist.all_gather_into_tensor(out, src.t().contiguous().t())
    np.testing.assert_array_equal(out.numpy(), np.concatenate(everyone(size, (3, 4), torch.float32, 63)))
    b = torch.zeros(4, 3).t()
    if rank == 0:
        b.copy_(src)
    dist.broadcast(b, 0)
    np.testing.assert_array_equal(b.numpy(), everyone(size, (3, 4), torch.float32, 63)[0])


def test_shape_errors_name_both_values(rank, size):
    with pytest.raises(ValueError, match="all_gather_into_tensor: the output's number of elements "
                       "is 5 on this rank, but %d is needed" % (3 * size)):
        dist.all_gather_into_tensor(torch.empty(5), torch.ones(3))
    with pytest.raises(ValueError, match="dtype"):
        dist.all_gather_into_tensor(torch.empty(3 * size, dtype=torch.float64), torch.ones(3))
    with pytest.raises(ValueError, match="root rank %d is not in the group of %d" % (size, size)):
        backend_of().broadcast([torch.ones(1)], _root(size))
    dist.barrier()


def _root(r):
    o = dist.BroadcastOptions()
    o.rootRank = r
    return o


def test_work_future_and_error(rank, size):
    """get_future() completes with the output tensors; a failed collective's Work and future
    raise the engine's error (its class and message)."""
    t = torch.full((3,), float(rank))
    work = dist.all_reduce(t, async_op=True)
    got = work.get_future().wait()
    assert isinstance(got, list) and got[0] is not None
    assert torch.all(got[0] == size * (size - 1) / 2) and torch.equal(got[0], t)
    assert work.result()[0].data_ptr() == t.data_ptr()
    bad = torch.ones(3 if rank == 0 else 4)
    work = dist.all_reduce(bad, async_op=True)
    fut = work.get_future()
    with pytest.raises(conflux.MismatchError, match="allreduce"):
        work.wait()
    with pytest.raises(Exception, match=r"\[3\].*\[4\]|\[4\].*\[3\]"):
        fut.wait()
    assert work.is_completed() and not work.is_success()
    dist.barrier()


def test_sequence_numbers(rank, size):
    b = backend_of()
    b._set_sequence_number_for_group()  # a no-op: they start at 0
    before = b._get_sequence_number_for_group()
    dist.all_reduce(torch.ones(1))
    dist.barrier()
    assert b._get_sequence_number_for_group() == before + 2
    got = [None] * size
    dist.all_gather_object(got, b._get_sequence_number_for_group())
    assert len(set(got)) == 1, got


def test_new_group_local_synchronization(rank, size):
    """use_local_synchronization=True: only the members call new_group (rank 0 does not) and meet
    through the group's store; rank 0 carries on meanwhile (its allreduce with nobody, a group of
    one, completes before the members' group exists)."""
    members = list(range(1, size))
    if rank == 0:
        alone = dist.new_group([0], use_local_synchronization=True)
        t = torch.full((2,), 7.0)
        dist.all_reduce(t, group=alone)
        assert torch.all(t == 7.0)
    else:
        group = dist.new_group(members, use_local_synchronization=True)
        t = mine(rank, (3,), torch.float32, 91)
        dist.all_reduce(t, group=group)
        xs = everyone(size, (3,), torch.float32, 91)
        np.testing.assert_array_equal(t.numpy(), sum(xs[r] for r in members))
        outs = [torch.empty(3) for _ in members]
        dist.all_gather(outs, mine(rank, (3,), torch.float32, 92), group=group)
        for r, o in zip(members, outs):
            np.testing.assert_array_equal(o.numpy(), contribution(r, (3,), "float32", 92))
        assert dist.get_rank(group) == rank - 1
        dist.destroy_process_group(group)
    dist.barrier()


def test_split_group(rank, size):
    """dist.split_group: the parent's backend splits (Backend.split): even and odd ranks form a
    group each, in the order given; a split that leaves ranks out gives them no group."""
    evens, odds = list(range(0, size, 2)), list(range(1, size, 2))
    group = dist.split_group(split_ranks=[evens, odds])
    mine_ = evens if rank % 2 == 0 else odds
    assert dist.get_rank(group) == mine_.index(rank)
    assert backend_of(group).name() == "conflux"
    t = mine(rank, (4,), torch.float64, 93)
    dist.all_reduce(t, group=group)
    xs = everyone(size, (4,), torch.float64, 93)
    np.testing.assert_array_equal(t.numpy(), sum(xs[r] for r in mine_))
    # the parent still works beside it
    w = torch.ones(1)
    dist.all_reduce(w)
    assert w.item() == size
    dist.destroy_process_group(group)
    ends = dist.split_group(split_ranks=[[0, size - 1]])
    if rank in (0, size - 1):
        t = torch.full((1,), float(rank))
        dist.all_reduce(t, group=ends)
        assert t.item() == size - 1
        dist.destroy_process_group(ends)
    else:
        assert ends == dist.GroupMember.NON_GROUP_MEMBER
    dist.barrier()


def test_group_collectives_all_kinds(rank, size):
    """A new_group of its own context (cfx_init_group: every rank, in reverse order, so not the
    job's world) takes every kind of collective; group ranks are positions in the list."""
    members = list(reversed(range(size)))
    group = dist.new_group(members, sort_ranks=False)
    g = members.index(rank)
    assert dist.get_rank(group) == g
    assert backend_of(group)._context_address != conflux._core.current().address
    t = mine(rank, (5,), torch.float32, 94)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    np.testing.assert_array_equal(t.numpy(), np.min(everyone(size, (5,), torch.float32, 94), 0))
    out = torch.empty(size * 2, dtype=torch.int64)
    dist.all_to_all_single(out, mine(rank, (size * 2,), torch.int64, 95), group=group)
    xs = everyone(size, (size * 2,), torch.int64, 95)
    want = np.concatenate([xs[members[j]][2 * g:2 * g + 2] for j in range(size)])
    np.testing.assert_array_equal(out.numpy(), want)
    b = mine(rank, (3,), torch.float32, 96)
    dist.broadcast(b, group_src=0, group=group)  # group rank 0: global rank size - 1
    np.testing.assert_array_equal(b.numpy(), contribution(size - 1, (3,), "float32", 96))
    dist.barrier(group=group)
    dist.destroy_process_group(group)


def test_whole_world_group_uses_the_job_context(rank, size):
    group = dist.new_group(list(range(size)))
    assert backend_of(group)._context_address == conflux._core.current().address
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t, group=group)
    assert torch.all(t == size * (size + 1) / 2)
    dist.destroy_process_group(group)

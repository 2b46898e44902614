"""conflux.horovod.torch process sets (Horovod 0.28's API) on subset contexts: registration,
numbering, every collective on sets that overlap and leave ranks out (also at the same time),
repeated adding and removing, sets from init and from mpi4py communicators, the object and state
helpers, and a DistributedOptimizer per set. Expected values are recomputed here from every
rank's known contribution."""
import time
import warnings

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="python3-torch is not installed")

import conflux
import conflux.horovod.torch as hvd
from conftest import contribution


def candidate_sets(size):
    """Rank lists that are not the whole job: all but the last, all but the first, the even
    ranks, the first and the last (those that repeat dropped)."""
    out = []
    for ranks in (list(range(size - 1)), list(range(1, size)), list(range(0, size, 2)),
                  [0, size - 1]):
        if ranks != list(range(size)) and ranks not in out:
            out.append(ranks)
    return out


def value(rank, shape, seed):
    return torch.from_numpy(contribution(rank, shape, "float64", seed))


@pytest.fixture
def sets(size):
    """The candidate sets, registered; removed afterwards."""
    made = [hvd.add_process_set(ranks) for ranks in candidate_sets(size)]
    yield made
    for ps in made:
        hvd.remove_process_set(ps)


def test_process_set_objects_and_numbering(rank, size):
    assert hvd.global_process_set.process_set_id == 0
    assert hvd.global_process_set.ranks == list(range(size))
    assert hvd.global_process_set.size() == size and hvd.global_process_set.rank() == rank
    ps = hvd.ProcessSet([size - 1, 0])
    assert ps.ranks == [0, size - 1]  # kept sorted, as in Horovod
    assert ps.process_set_id is None and ps.size() is None and ps.rank() is None
    assert ps.included() == (rank in (0, size - 1))
    with pytest.raises(ValueError, match="list of process ranks"):
        hvd.ProcessSet([0, "1"])
    if size == 2:
        with pytest.raises(ValueError, match="duplicate"):
            hvd.add_process_set(ps)  # [0, 1] is the global set
        ps = hvd.ProcessSet([1])
    assert hvd.add_process_set(ps) is ps
    try:
        assert ps.process_set_id >= 1 and str(ps) == \
            "ProcessSet(process_set_id=%d, ranks=%s, mpi_comm=None)" % (ps.process_set_id, ps.ranks)
        assert ps.size() == len(ps.ranks)
        if rank in ps.ranks:
            assert ps.rank() == ps.ranks.index(rank) and ps.included()
        else:
            assert not ps.included()
            with pytest.raises(ValueError, match="not part of provided process set"):
                ps.rank()
            with pytest.raises(ValueError, match="not in the process set"):
                hvd.allreduce(torch.ones(1), process_set=ps)  # at the call, no waiting
        with pytest.raises(ValueError, match="duplicate"):
            hvd.add_process_set(list(ps.ranks))
    finally:
        assert hvd.remove_process_set(ps) is True
    assert ps.process_set_id is None
    assert hvd.remove_process_set(ps) is False
    assert hvd.remove_process_set(hvd.global_process_set) is False
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(torch.ones(1), process_set=ps)


def test_bad_rank_lists_fail_on_every_rank(rank, size):
    with pytest.raises(ValueError, match="outside"):
        hvd.add_process_set([0, size + 3])
    with pytest.raises(ValueError, match="twice|duplicate"):
        hvd.add_process_set([0, 0])
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size  # the job goes on


def check_set_collectives(ps, rank, seed):
    """Every collective on `ps` (on its members), checked; returns nothing on other ranks."""
    members = ps.ranks
    n = len(members)
    me = members.index(rank)
    xs = {r: value(r, (3, 2), seed) for r in members}
    got = hvd.allreduce(xs[rank], op=hvd.Sum, process_set=ps)
    assert torch.equal(got, sum(xs.values()))
    got = hvd.allreduce(xs[rank], process_set=ps, name="ps.avg.%d" % ps.process_set_id)
    assert torch.allclose(got, sum(xs.values()) / n)
    got = hvd.allreduce(xs[rank], op=hvd.Max, process_set=ps)
    assert torch.equal(got, torch.stack(list(xs.values())).max(0).values)
    # allgather: rank r gives r % 3 + 1 rows, in the order of the set's ranks
    rows = {r: value(r, (r % 3 + 1, 2), seed + 1) for r in members}
    assert torch.equal(hvd.allgather(rows[rank], process_set=ps),
                       torch.cat([rows[r] for r in members]))
    # broadcast from the set's last rank (a rank of the job, as in Horovod)
    root = members[-1]
    t = xs[rank].clone()
    hvd.broadcast_(t, root, process_set=ps)
    assert torch.equal(t, xs[root])
    assert torch.equal(hvd.broadcast(xs[rank], root, process_set=ps), xs[root])
    # alltoall: one row to each member of the set
    sent = {r: torch.arange(n, dtype=torch.float64) + 10 * r for r in members}
    out, splits = hvd.alltoall(sent[rank], splits=[1] * n, process_set=ps)
    assert out.tolist() == [10 * r + me for r in members] and splits.tolist() == [1] * n
    # reducescatter: this member's block of dim 0 of the sum
    big = {r: value(r, (2 * n + 1, 2), seed + 2) for r in members}
    block = torch.tensor_split(sum(big.values()), n)[me]  # the first d0 % n get one more row
    assert torch.equal(hvd.reducescatter(big[rank], op=hvd.Sum, process_set=ps), block)
    got = hvd.grouped_allreduce([xs[rank], 2 * xs[rank]], op=hvd.Sum, process_set=ps)
    assert torch.equal(got[0], sum(xs.values())) and torch.equal(got[1], 2 * sum(xs.values()))
    hvd.barrier(process_set=ps)


def test_collectives_on_each_set(sets, rank, size):
    for i, ps in enumerate(sets):
        if ps.included():
            check_set_collectives(ps, rank, seed=100 + i)
        else:
            with pytest.raises(ValueError, match="not in the process set"):
                hvd.allgather(torch.ones(1), process_set=ps)
    # the global set is unaffected
    assert hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum).item() == size * (size - 1) / 2


def test_overlapping_sets_at_the_same_time(sets, rank, size):
    """Every rank starts an allreduce on each set it is in and on the global set, then waits:
    the sets run independently, in any order."""
    x = {r: value(r, (5,), 7) for r in range(size)}
    handles = [(None, hvd.allreduce_async(x[rank], op=hvd.Sum, name="both.global"))]
    for ps in sets:
        if ps.included():
            handles.append((ps, hvd.allreduce_async(x[rank], op=hvd.Sum, name="both",
                                                    process_set=ps)))
    for ps, h in reversed(handles):
        members = range(size) if ps is None else ps.ranks
        assert torch.equal(hvd.synchronize(h), sum(x[r] for r in members))


def test_added_and_removed_repeatedly(rank, size):
    ids = []
    for i in range(6):
        ranks = candidate_sets(size)[i % len(candidate_sets(size))]
        ps = hvd.add_process_set(ranks)
        ids.append(ps.process_set_id)
        if ps.included():
            got = hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum, name="again",
                                process_set=ps)
            assert got.item() == sum(r + 1 for r in ranks)
        assert hvd.remove_process_set(ps)
        with pytest.raises(ValueError):
            hvd.allreduce(torch.ones(1), process_set=ps)
    assert len(set(ids)) < len(ids)  # removed sets' ids are given out again


def test_removed_set_fails_pending_collectives_on_its_members(rank, size):
    ps = hvd.add_process_set(candidate_sets(size)[0])
    handle = None
    if ps.included() and ps.rank() == 0:
        handle = hvd.allreduce_async(torch.ones(2), name="never.completed", process_set=ps)
    hvd.barrier()  # every rank past its submission
    hvd.remove_process_set(ps)
    if handle is not None:
        with pytest.raises(hvd.HorovodInternalError) as info:
            hvd.synchronize(handle)
        assert isinstance(info.value, conflux.ShutDownError)


def test_init_with_process_sets_and_duplicates(rank, size):
    lists = candidate_sets(size)
    with pytest.raises(ValueError, match="entry number 1 is a duplicate"):
        hvd.init(process_sets=[hvd.ProcessSet(lists[0]), hvd.ProcessSet(lists[0])])
    hvd.barrier()  # see test_init_repeated_and_after_shutdown
    hvd.shutdown()
    made = [hvd.ProcessSet(ranks) for ranks in lists]
    hvd.init(process_sets=made)
    try:
        assert [ps.process_set_id for ps in made] == list(range(1, len(made) + 1))
        for i, ps in enumerate(made):
            if ps.included():
                check_set_collectives(ps, rank, seed=200 + i)
        hvd.init(process_sets="dynamic")  # accepted; registers nothing
    finally:
        for ps in made:
            hvd.remove_process_set(ps)


def test_sets_end_with_shutdown(rank, size):
    ps = hvd.add_process_set(candidate_sets(size)[-1])
    hvd.barrier()
    hvd.shutdown()
    hvd.init()
    assert ps.process_set_id is None
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(torch.ones(1), process_set=ps)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size


def test_process_sets_from_mpi_communicators(rank, size):
    MPI = pytest.importorskip("mpi4py.MPI", reason="python3-mpi4py is not installed")
    sub = MPI.COMM_WORLD.Split(color=rank % 2, key=rank)
    ps = hvd.ProcessSet(sub)
    assert ps.ranks is None and ps.mpi_comm is sub
    hvd.init(process_sets=[ps])
    try:
        mine = [r for r in range(size) if r % 2 == rank % 2]
        assert ps.ranks == mine and ps.process_set_id >= 1 and ps.included()
        got = hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum, process_set=ps)
        assert got.item() == sum(r + 1 for r in mine)
        with pytest.raises(NotImplementedError, match="MPI communicator"):
            hvd.add_process_set(hvd.ProcessSet(sub))
        ids = hvd.allgather_object(ps.process_set_id)
        assert len(set(ids)) == min(2, size)  # one set per parity, registered on every rank
    finally:
        for ps_id in sorted(set(hvd.allgather_object(ps.process_set_id))):
            other = hvd.ProcessSet([])  # removal goes by id, as in Horovod
            other.process_set_id = ps_id
            assert hvd.remove_process_set(other)
        sub.Free()


def test_object_and_state_helpers_on_a_set(sets, rank, size):
    ps = sets[1 % len(sets)]  # all but the first rank (at 2 ranks: rank 1 alone)
    if not ps.included():
        with pytest.raises(ValueError):
            hvd.broadcast_object(1, root_rank=ps.ranks[0], process_set=ps)
        return
    root = ps.ranks[-1]
    assert hvd.broadcast_object({"from": rank}, root_rank=root, process_set=ps) == {"from": root}
    assert hvd.allgather_object(rank * 10, process_set=ps) == [r * 10 for r in ps.ranks]
    torch.manual_seed(rank)
    model = torch.nn.Linear(3, 2)
    hvd.broadcast_parameters(model.state_dict(), root_rank=root, process_set=ps)
    torch.manual_seed(root)
    want = torch.nn.Linear(3, 2)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 want.state_dict().values()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.9)
    hvd.broadcast_optimizer_state(opt, root_rank=root, process_set=ps)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * (root + 1))


def train_step(opt, model, rank, lr):
    """One step of loss = sum(w . x_rank) + b: its gradient is (x_rank, 1) on every rank."""
    opt.zero_grad()
    x = value(rank, (4,), 11).float()
    (model(x).sum()).backward()
    opt.step()


@pytest.mark.parametrize("op", ["Average", "Sum"])
def test_distributed_optimizer_per_process_set(sets, op, rank, size):
    """One model and optimizer per set, all stepped by each rank in the same step: members
    reduce over their set, other ranks update from their own gradient."""
    lr = 0.5
    models, opts = [], []
    for i, ps in enumerate(sets):
        model = torch.nn.Linear(4, 1)
        with torch.no_grad():
            model.weight.fill_(1.0)
            model.bias.fill_(0.5)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                       named_parameters=model.named_parameters(prefix="m%d" % i),
                                       op=getattr(hvd, op), process_set=ps)
        models.append(model)
        opts.append(opt)
    for model, opt in zip(models, opts):
        train_step(opt, model, rank, lr)
    for ps, model in zip(sets, models):
        members = ps.ranks if ps.included() else [rank]
        grads = [value(r, (4,), 11).float() for r in members]
        g = sum(grads) / (len(members) if op == "Average" or not ps.included() else 1)
        assert torch.allclose(model.weight.detach()[0], 1.0 - lr * g, atol=1e-6)
        nb = 1.0 if op == "Average" or not ps.included() else len(members)
        assert model.bias.item() == pytest.approx(0.5 - lr * nb)


def test_step_after_synchronize_warns_with_horovods_text(rank, size):
    model = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match=r"optimizer.step\(\) called without "
                      r"optimizer.skip_synchronize\(\) context after optimizer.synchronize\(\)"):
        opt.step()
    model(torch.ones(1, 2)).sum().backward()
    opt.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with opt.skip_synchronize():
            opt.step()
    opt.zero_grad()
    model(torch.ones(1, 2)).sum().backward()
    with pytest.raises(AssertionError, match="zero_grad\\(\\) was called after loss.backward"):
        opt.zero_grad()
    opt.step()


def test_broadcast_optimizer_state_with_parameters_without_gradients(rank, size):
    """Layer `unused` never gets a gradient (p.grad None). Root has stepped Adam on its own data,
    the other ranks have a fresh optimizer: afterwards every rank holds the state root computed,
    recomputed here by running root's steps locally."""
    root = size - 1

    def make():
        torch.manual_seed(3)
        used, unused = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
        return used, unused, torch.optim.Adam(list(used.parameters()) +
                                              list(unused.parameters()), lr=0.01)

    def steps(used, opt, r):
        for k in range(2):
            opt.zero_grad()
            used(value(r, (3,), 20 + k).float()).sum().backward()
            opt.step()

    used, unused, opt = make()
    if rank == root:
        steps(used, opt, root)
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    ref_used, ref_unused, ref = make()
    steps(ref_used, ref, root)
    got, want = opt.state_dict(), ref.state_dict()
    assert sorted(got["state"]) == sorted(want["state"]) == [0, 1]  # unused's params: no state
    for k in want["state"]:
        for name, t in want["state"][k].items():
            assert torch.equal(torch.as_tensor(got["state"][k][name]), torch.as_tensor(t)), name
    assert all(p.grad is None for p in unused.parameters())



def test_a_sets_barrier_holds_its_members_only(rank, size):
    """Rank 0 arrives late at the even ranks' barrier. Every even rank leaves it after rank 0
    arrived, and the odd ranks' barrier, which rank 0 is not in, lets them go before. Told by the
    host's monotonic clock, which all ranks of this job share (one host): a causal check, no
    margin. (Horovod's own test of this times each rank and wants >= 5 s with no margin.)"""
    evens = hvd.add_process_set(list(range(0, size, 2)))
    odds = hvd.add_process_set(list(range(1, size, 2))) if size > 2 else None
    try:
        hvd.barrier()
        arrived = None
        if rank == 0:
            time.sleep(1.0)
            arrived = time.monotonic()
        if rank % 2 == 0:
            hvd.barrier(process_set=evens)
        elif odds is not None:
            hvd.barrier(process_set=odds)
        left = time.monotonic()
        times = hvd.allgather_object((arrived, left))
        rank0_arrived = times[0][0]
        for r, (_, r_left) in enumerate(times):
            if r % 2 == 0:
                assert r_left >= rank0_arrived, "rank %d left the even ranks' barrier first" % r
            elif odds is not None:
                assert r_left < rank0_arrived, "rank %d waited for rank 0, outside its set" % r
    finally:
        hvd.remove_process_set(evens)
        if odds is not None:
            hvd.remove_process_set(odds)

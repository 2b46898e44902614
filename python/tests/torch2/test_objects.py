"""torch.distributed's object collectives on the backend "conflux" (pickled objects of different
sizes on each rank: all_gather_object, broadcast_object_list, gather_object,
scatter_object_list), and monitored_barrier."""
import datetime
import time

import pytest
import torch
import torch.distributed as dist

from conftest import side_group


def obj(rank, tag=""):
    """Rank `rank`'s object: its pickle's size grows with the rank."""
    return {"rank": rank, "tag": tag, "values": list(range(rank * 37)), "text": "r%d" % rank * rank,
            "tensor": torch.arange(rank + 2, dtype=torch.float64) * (rank + 1)}


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b


def test_all_gather_object(rank, size):
    out = [None] * size
    dist.all_gather_object(out, obj(rank, "ag"))
    for r in range(size):
        assert same(out[r], obj(r, "ag")), (r, out[r])


@pytest.mark.parametrize("src", ["first", "last"])
def test_broadcast_object_list(src, rank, size):
    root = 0 if src == "first" else size - 1
    objects = [obj(root, "bc"), "two", 3.5, None] if rank == root else [None, 0, 0, 0]
    dist.broadcast_object_list(objects, src=root)
    assert same(objects, [obj(root, "bc"), "two", 3.5, None]), objects


def test_gather_object(rank, size):
    dst = size - 1
    out = [None] * size if rank == dst else None
    dist.gather_object(obj(rank, "g"), out, dst=dst)
    if rank == dst:
        for r in range(size):
            assert same(out[r], obj(r, "g")), (r, out[r])
    else:
        assert out is None


def test_scatter_object_list(rank, size):
    src = 0
    out = [None]
    inputs = [obj(r, "s") for r in range(size)] if rank == src else None
    dist.scatter_object_list(out, inputs, src=src)
    assert same(out[0], obj(rank, "s")), out[0]


def test_object_collectives_on_a_subgroup(rank, size):
    """all_gather_object and broadcast_object_list on a conflux dist.new_group leaving rank 0
    out (group ranks differ from global ranks)."""
    members = list(range(1, size))
    group = dist.new_group(members)
    if rank not in members:
        return
    out = [None] * len(members)
    dist.all_gather_object(out, obj(rank, "sub"), group=group)
    for i, r in enumerate(members):
        assert same(out[i], obj(r, "sub")), (r, out[i])
    root = members[-1]
    objects = [obj(root, "subbc")] if rank == root else [None]
    dist.broadcast_object_list(objects, src=root, group=group)
    assert same(objects[0], obj(root, "subbc"))


def check_monitored_barrier(group, rank, size):
    """The last rank arrives a second late: monitored_barrier returns on every rank only after
    it arrived; twice (the barrier can be repeated)."""
    timeout = datetime.timedelta(seconds=30)
    for _ in range(2):
        if rank == size - 1:
            time.sleep(1.0)
        start = time.monotonic()
        dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=True)
        waited = time.monotonic() - start
        if rank != size - 1:
            assert waited > 0.5, "monitored_barrier returned after %.3f s, before the last rank " \
                                 "arrived" % waited
        dist.barrier(group=side_group())


def test_monitored_barrier_on_conflux(rank, size):
    """monitored_barrier on the conflux default group (the backend overrides c10d's
    Backend::monitoredBarrier, which torch implements for Gloo only): it waits for the late rank,
    twice."""
    check_monitored_barrier(None, rank, size)


def test_monitored_barrier_on_gloo_beside(rank, size):
    """monitored_barrier on a gloo group made beside the conflux default group (torch's
    monitored_barrier is gloo's)."""
    check_monitored_barrier(side_group(), rank, size)

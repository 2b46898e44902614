"""DTensor and functional collectives on the backend "conflux": a 1-D device mesh of every rank
and 2-D meshes of (size x 1) and (1 x size) (the 2-D shapes that exist at 2 and 3 ranks; each
makes one dimension a group of every rank and the other groups of one rank), made with
init_device_mesh("cpu", ...). Redistributions (Shard -> Replicate, Shard(0) -> Shard(1),
Partial -> Replicate and -> Shard), matmuls on sharded operands, and
torch.distributed._functional_collectives (all_reduce, all_gather_tensor,
reduce_scatter_tensor, their coalesced forms, all_to_all_single, broadcast), each checked against
values computed here from every rank's known contribution."""
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from conftest import BACKEND

CLOSE = dict(rtol=1e-6, atol=1e-5)


def contribution(rank, shape, seed):
    """Rank `rank`'s values: small integers (sums exact in float32) plus a fraction."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randint(-20, 21, shape, generator=g).to(torch.float32) + 0.25


def base(shape, seed):
    """The same tensor on every rank."""
    return contribution(10_000, shape, seed)


def chunk(t, index, parts, dim=0):
    chunks = torch.chunk(t, parts, dim=dim)
    return chunks[index] if index < len(chunks) else t.narrow(dim, 0, 0)


@pytest.fixture(scope="module")
def mesh1d():
    return init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("x",))


MESH2D_SHAPES = ["size_by_1", "1_by_size"]


@pytest.fixture(scope="module", params=MESH2D_SHAPES)
def mesh2d(request):
    size = dist.get_world_size()
    shape = (size, 1) if request.param == "size_by_1" else (1, size)
    return init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))


def mesh_groups(mesh):
    """For each mesh dimension: the global ranks of this rank's group along it, in group order."""
    coord = mesh.get_coordinate()
    ranks = mesh.mesh
    groups = []
    for dim in range(mesh.ndim):
        index = list(coord)
        index[dim] = slice(None)
        groups.append([int(r) for r in ranks[tuple(index)].reshape(-1)])
    return groups


# ---- 1-D mesh: redistributions ----
def test_shard_to_replicate(mesh1d, rank, size):
    full = base((7, 4), 1)
    # distribute_tensor scatters rank 0's tensor: the other ranks' must not matter
    dt = distribute_tensor(full + 1000.0 * rank, mesh1d, [Shard(0)])
    torch.testing.assert_close(dt.to_local(), chunk(full, rank, size), **CLOSE)
    rep = dt.redistribute(mesh1d, [Replicate()])
    torch.testing.assert_close(rep.to_local(), full, **CLOSE)
    # the same from each rank's own shard (no scatter): all-gather of uneven shards
    own = DTensor.from_local(chunk(full, rank, size), mesh1d, [Shard(0)], shape=full.shape,
                             stride=full.stride())
    torch.testing.assert_close(own.full_tensor(), full, **CLOSE)


def test_shard_dim0_to_dim1(mesh1d, rank, size):
    full = base((6, 6), 2)
    dt = DTensor.from_local(chunk(full, rank, size), mesh1d, [Shard(0)], shape=full.shape,
                            stride=full.stride())
    moved = dt.redistribute(mesh1d, [Shard(1)])
    torch.testing.assert_close(moved.to_local(), chunk(full, rank, size, dim=1), **CLOSE)


@pytest.mark.parametrize("reduce_op", ["sum", "avg", "max"])
def test_partial_to_replicate(reduce_op, mesh1d, rank, size):
    parts = [contribution(r, (3, 4), 3) for r in range(size)]
    dt = DTensor.from_local(parts[rank], mesh1d, [Partial(reduce_op)])
    want = {"sum": lambda s: s.sum(0), "avg": lambda s: s.mean(0),
            "max": lambda s: s.max(0).values}[reduce_op](torch.stack(parts))
    torch.testing.assert_close(dt.redistribute(mesh1d, [Replicate()]).to_local(), want, **CLOSE)


def test_partial_to_shard(mesh1d, rank, size):
    parts = [contribution(r, (6, 2), 4) for r in range(size)]
    dt = DTensor.from_local(parts[rank], mesh1d, [Partial()])
    got = dt.redistribute(mesh1d, [Shard(0)]).to_local()
    torch.testing.assert_close(got, chunk(torch.stack(parts).sum(0), rank, size), **CLOSE)


def test_sharded_matmul(mesh1d, rank, size):
    a, b = base((6, 5), 5), base((5, 4), 6)
    want = a @ b
    # rows of A sharded, B replicated: C sharded by rows
    c = distribute_tensor(a, mesh1d, [Shard(0)]) @ distribute_tensor(b, mesh1d, [Replicate()])
    assert c.placements == (Shard(0),), c.placements
    torch.testing.assert_close(c.full_tensor(), want, **CLOSE)
    # the inner dimension sharded: partial sums, summed by full_tensor (an all-reduce)
    c = distribute_tensor(a, mesh1d, [Shard(1)]) @ distribute_tensor(b, mesh1d, [Shard(0)])
    assert c.placements[0].is_partial(), c.placements
    torch.testing.assert_close(c.full_tensor(), want, **CLOSE)
    # and its gradient: d(sum(A @ B))/dA = ones @ B^T, sharded like A
    ad = distribute_tensor(a, mesh1d, [Shard(1)]).requires_grad_()
    (ad @ distribute_tensor(b, mesh1d, [Shard(0)])).sum().backward()
    torch.testing.assert_close(ad.grad.full_tensor(), torch.ones(6, 4) @ b.T, **CLOSE)


# ---- 1-D mesh: functional collectives ----
def test_funcol_all_reduce(mesh1d, rank, size):
    parts = torch.stack([contribution(r, (5, 3), 7) for r in range(size)])
    for op, want in (("sum", parts.sum(0)), ("avg", parts.mean(0)), ("max", parts.max(0).values),
                     ("min", parts.min(0).values)):
        got = funcol.all_reduce(parts[rank].clone(), op, mesh1d)
        torch.testing.assert_close(funcol.wait_tensor(got), want, **CLOSE,
                                   msg=lambda m, op=op: "all_reduce %s: %s" % (op, m))
    # over a group given as a ProcessGroup and by its name
    got = funcol.all_reduce(parts[rank].clone(), "sum", dist.group.WORLD)
    torch.testing.assert_close(funcol.wait_tensor(got), parts.sum(0), **CLOSE)
    got = funcol.all_reduce(parts[rank].clone(), "sum", dist.group.WORLD.group_name)
    torch.testing.assert_close(funcol.wait_tensor(got), parts.sum(0), **CLOSE)


# torch 2.15 renamed all_gather_tensor, reduce_scatter_tensor and their coalesced forms to
# *_single (the old names warn); both, as users' code has either
API = {"tensor": dict(all_gather=funcol.all_gather_tensor,
                      reduce_scatter=funcol.reduce_scatter_tensor,
                      all_gather_coalesced=funcol.all_gather_into_tensor_coalesced,
                      reduce_scatter_coalesced=funcol.reduce_scatter_tensor_coalesced)}
if hasattr(funcol, "all_gather_single"):
    API["single"] = dict(all_gather=funcol.all_gather_single,
                         reduce_scatter=funcol.reduce_scatter_single,
                         all_gather_coalesced=funcol.all_gather_single_coalesced,
                         reduce_scatter_coalesced=funcol.reduce_scatter_single_coalesced)
api_names = pytest.mark.parametrize("api", list(API))


@api_names
@pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")
def test_funcol_all_gather_and_reduce_scatter(api, mesh1d, rank, size):
    f = API[api]
    parts = [contribution(r, (6, 2), 8) for r in range(size)]
    got = funcol.wait_tensor(f["all_gather"](parts[rank], 0, mesh1d))
    torch.testing.assert_close(got, torch.cat(parts, 0), **CLOSE)
    got = funcol.wait_tensor(f["all_gather"](parts[rank], 1, mesh1d))
    torch.testing.assert_close(got, torch.cat(parts, 1), **CLOSE)
    total = torch.stack(parts).sum(0)
    got = funcol.wait_tensor(f["reduce_scatter"](parts[rank], "sum", 0, mesh1d))
    torch.testing.assert_close(got, chunk(total, rank, size), **CLOSE)
    wide = [contribution(r, (2, 3 * size), 9) for r in range(size)]
    got = funcol.wait_tensor(f["reduce_scatter"](wide[rank], "avg", 1, mesh1d))
    torch.testing.assert_close(got, chunk(torch.stack(wide).mean(0), rank, size, dim=1), **CLOSE)


@api_names
@pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")
def test_funcol_coalesced(api, mesh1d, rank, size):
    f = API[api]
    a = [contribution(r, (4, 3), 10) for r in range(size)]
    b = [contribution(r, (2 * size,), 11) for r in range(size)]
    got = funcol.all_reduce_coalesced([a[rank].clone(), b[rank].clone()], "sum", mesh1d)
    torch.testing.assert_close([funcol.wait_tensor(t) for t in got],
                               [torch.stack(a).sum(0), torch.stack(b).sum(0)], **CLOSE)
    got = funcol.all_reduce_coalesced([a[rank].clone(), b[rank].clone()], "avg", mesh1d)
    torch.testing.assert_close([funcol.wait_tensor(t) for t in got],
                               [torch.stack(a).mean(0), torch.stack(b).mean(0)], **CLOSE)
    got = f["all_gather_coalesced"]([a[rank], b[rank]], mesh1d)
    torch.testing.assert_close([funcol.wait_tensor(t) for t in got],
                               [torch.cat(a, 0), torch.cat(b, 0)], **CLOSE)
    c = [contribution(r, (3 * size, 2), 12) for r in range(size)]
    got = f["reduce_scatter_coalesced"]([c[rank], b[rank]], "sum", [0, 0], mesh1d)
    torch.testing.assert_close([funcol.wait_tensor(t) for t in got],
                               [chunk(torch.stack(c).sum(0), rank, size),
                                chunk(torch.stack(b).sum(0), rank, size)], **CLOSE)


@pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")
def test_funcol_coalesced_mixed_dtypes(mesh1d, rank, size):
    """float32 and float64 (and an int64) in one coalesced call, as NCCL takes them."""
    if BACKEND == "gloo":
        pytest.skip("gloo's allreduce_coalesced takes tensors of one dtype only")
    a = [contribution(r, (4, 3), 14) for r in range(size)]
    b = [contribution(r, (2 * size,), 15).to(torch.float64) for r in range(size)]
    c = [contribution(r, (5,), 16).floor().to(torch.int64) for r in range(size)]
    got = funcol.all_reduce_coalesced([a[rank].clone(), b[rank].clone(), c[rank].clone()], "sum",
                                      mesh1d)
    torch.testing.assert_close([funcol.wait_tensor(t) for t in got],
                               [torch.stack(x).sum(0) for x in (a, b, c)], **CLOSE)
    got = funcol.all_gather_into_tensor_coalesced([a[rank], b[rank], c[rank]], mesh1d)
    torch.testing.assert_close([funcol.wait_tensor(t) for t in got],
                               [torch.cat(x, 0) for x in (a, b, c)], **CLOSE)


def test_funcol_all_to_all_single_and_broadcast(mesh1d, rank, size):
    def rows(src, dst):
        return 1 + (src + 2 * dst) % 3

    def block(src, dst):
        n = rows(src, dst)
        return torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) + 100 * src + 10 * dst

    send = torch.cat([block(rank, j) for j in range(size)])
    got = funcol.all_to_all_single(send, [rows(j, rank) for j in range(size)],
                                   [rows(rank, j) for j in range(size)], mesh1d)
    torch.testing.assert_close(funcol.wait_tensor(got),
                               torch.cat([block(j, rank) for j in range(size)]), **CLOSE)
    root = size - 1
    got = funcol.broadcast(contribution(rank, (3, 3), 13), root, mesh1d)
    torch.testing.assert_close(funcol.wait_tensor(got), contribution(root, (3, 3), 13), **CLOSE)


# ---- 2-D meshes ----
def test_2d_shard_shard_to_replicate(mesh2d, rank, size):
    full = base((7, 5), 20)
    placements = [Shard(0), Shard(1)]
    dt = distribute_tensor(full + 1000.0 * rank, mesh2d, placements)  # rank 0's is scattered
    i, j = mesh2d.get_coordinate()
    rows, cols = mesh2d.shape
    torch.testing.assert_close(dt.to_local(), chunk(chunk(full, i, rows), j, cols, dim=1), **CLOSE)
    rep = dt.redistribute(mesh2d, [Replicate(), Replicate()])
    torch.testing.assert_close(rep.to_local(), full, **CLOSE)


@pytest.mark.parametrize("partial_dim", [0, 1])
def test_2d_partial_to_replicate(partial_dim, mesh2d, rank, size):
    group = mesh_groups(mesh2d)[partial_dim]
    parts = {r: contribution(r, (4, 3), 21) for r in range(size)}
    placements = [Replicate(), Replicate()]
    placements[partial_dim] = Partial()
    dt = DTensor.from_local(parts[rank], mesh2d, placements)
    want = torch.stack([parts[r] for r in group]).sum(0)
    got = dt.redistribute(mesh2d, [Replicate(), Replicate()]).to_local()
    torch.testing.assert_close(got, want, **CLOSE)


def test_2d_sharded_matmul(mesh2d, rank, size):
    a, b = base((6, 5), 22), base((5, 4), 23)
    da = distribute_tensor(a, mesh2d, [Shard(0), Replicate()])
    db = distribute_tensor(b, mesh2d, [Replicate(), Shard(1)])
    c = da @ db
    assert tuple(c.placements) == (Shard(0), Shard(1)), c.placements
    torch.testing.assert_close(c.full_tensor(), a @ b, **CLOSE)


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")
def test_2d_funcol_on_mesh_dimension(dim, mesh2d, rank, size):
    """Functional collectives on one dimension of the mesh, (mesh, dim): the group of the ranks
    that differ only in that coordinate."""
    group = mesh_groups(mesh2d)[dim]
    parts = {r: contribution(r, (2 * len(group), 3), 24 + dim) for r in range(size)}
    mine = parts[rank]
    got = funcol.wait_tensor(funcol.all_reduce(mine.clone(), "sum", (mesh2d, dim)))
    torch.testing.assert_close(got, torch.stack([parts[r] for r in group]).sum(0), **CLOSE)
    got = funcol.wait_tensor(funcol.all_gather_tensor(mine, 0, (mesh2d, dim)))
    torch.testing.assert_close(got, torch.cat([parts[r] for r in group]), **CLOSE)
    got = funcol.wait_tensor(funcol.reduce_scatter_tensor(mine, "sum", 0, (mesh2d, dim)))
    total = torch.stack([parts[r] for r in group]).sum(0)
    torch.testing.assert_close(got, chunk(total, group.index(rank), len(group)), **CLOSE)
    got = funcol.all_reduce_coalesced([mine.clone(), 2 * mine], "sum", (mesh2d, dim))
    torch.testing.assert_close([funcol.wait_tensor(t) for t in got], [total, 2 * total], **CLOSE)

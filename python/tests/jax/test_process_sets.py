"""conflux.jax.ProcessSet: the collectives over a set of 2 of the job's 3 ranks (ranks 0 and 2:
rank 1 is outside), eagerly and inside jit, against numpy computations of what each member
contributed; a jitted function that mixes the set's and the job's collectives; a gradient;
optax training over the set; a rank outside gets ValueError; a freed set's compiled program
fails saying so. Skipped at 2 ranks (a 2-rank set there is the whole job)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (tools/install-python installs the pinned jax)")
import jax.numpy as jnp  # noqa: E402

import conflux.jax as cfx
from conftest import all_contributions, contribution

MEMBERS = [0, 2]
JIT = [False, True]


@pytest.fixture(scope="module")
def ps():
    if cfx.size() != 3:
        pytest.skip("the process-set tests run at 3 ranks: a 2-rank set beside a rank outside it")
    s = cfx.ProcessSet(MEMBERS)
    yield s
    s.free()


@pytest.fixture
def member(ps, rank):
    """This rank's rank within the set, or None outside it."""
    return MEMBERS.index(rank) if rank in MEMBERS else None


def run(fn, jit, *args):
    return jax.jit(fn)(*args) if jit else fn(*args)


def set_contributions(shape, seed, **kw):
    """The members' inputs, in set-rank order (a member's input is contribution(its job rank))."""
    return [contribution(r, shape, seed, **kw) for r in MEMBERS]


def test_membership(ps, rank, member):
    assert ps.ranks == MEMBERS and ps.size() == 2
    assert ps.included() == (member is not None)
    if member is not None:
        assert ps.rank() == member
    else:
        with pytest.raises(ValueError, match="not in the process set"):
            ps.rank()


def test_outside_the_set_is_an_error(ps, member):
    if member is not None:
        pytest.skip("rank 1 only")
    with pytest.raises(ValueError, match="not in the process set"):
        ps.allreduce(jnp.ones(3))
    with pytest.raises(ValueError, match="not in the process set"):
        jax.jit(lambda a: ps.grouped_allreduce([a]))(jnp.ones(3))
    with pytest.raises(ValueError, match="not in the process set"):
        ps.barrier()


@pytest.mark.parametrize("jit", JIT)
@pytest.mark.parametrize("op", [cfx.Sum, cfx.Average, cfx.Max], ids=["Sum", "Average", "Max"])
def test_allreduce(ps, rank, member, op, jit):
    if member is None:
        return
    xs = set_contributions((3, 4), seed=300 + op)
    got = run(lambda a: ps.allreduce(a, op=op), jit, jnp.asarray(xs[member]))
    want = {cfx.Sum: np.sum, cfx.Average: np.mean, cfx.Max: np.max}[op](np.stack(xs), axis=0)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


@pytest.mark.parametrize("jit", JIT)
def test_grouped_allreduce(ps, member, jit):
    if member is None:
        return
    shapes = [(2, 3), (5,), ()]
    per = [set_contributions(s, seed=310 + i) for i, s in enumerate(shapes)]
    tree = {"a": jnp.asarray(per[0][member]), "b": [jnp.asarray(per[1][member]),
                                                    jnp.asarray(per[2][member])]}
    got = run(lambda t: ps.grouped_allreduce(t, op=cfx.Sum, postscale_factor=0.5), jit, tree)
    want = [0.5 * np.sum(np.stack(p), axis=0) for p in per]
    for g, w in zip(jax.tree_util.tree_leaves(got), want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6)


@pytest.mark.parametrize("jit", JIT)
def test_allgather(ps, member, jit):
    if member is None:
        return
    xs = set_contributions((2, 3), seed=320)
    got = run(ps.allgather, jit, jnp.asarray(xs[member]))
    np.testing.assert_array_equal(np.asarray(got), np.concatenate(xs))


def test_allgather_ragged_outside_jit(ps, rank, member):
    if member is None:
        return
    xs = [contribution(r, (MEMBERS.index(r) + 1, 2), seed=321) for r in MEMBERS]
    got = ps.allgather(jnp.asarray(xs[member]))
    np.testing.assert_array_equal(np.asarray(got), np.concatenate(xs))


@pytest.mark.parametrize("jit", JIT)
def test_broadcast(ps, member, jit):
    if member is None:
        return
    xs = set_contributions((4,), seed=330, dtype=np.int32)
    got = run(lambda a: ps.broadcast(a, root_rank=1), jit, jnp.asarray(xs[member]))
    np.testing.assert_array_equal(np.asarray(got), xs[1])   # set rank 1: job rank 2
    with pytest.raises(ValueError, match="root_rank 2 is not a rank of the set"):
        ps.broadcast(jnp.ones(2), root_rank=2)


def test_broadcast_parameters(ps, member):
    if member is None:
        return
    tree = {"w": jnp.asarray(set_contributions((3,), seed=335)[member]), "step": 4}
    got = ps.broadcast_parameters(tree, root_rank=1)
    np.testing.assert_array_equal(np.asarray(got["w"]), set_contributions((3,), seed=335)[1])
    assert got["step"] == 4


@pytest.mark.parametrize("jit", JIT)
def test_alltoall(ps, member, jit):
    if member is None:
        return
    xs = set_contributions((4, 2), seed=340)
    got = run(ps.alltoall, jit, jnp.asarray(xs[member]))
    want = np.concatenate([xs[src][2 * member:2 * member + 2] for src in range(2)])
    np.testing.assert_array_equal(np.asarray(got), want)


def test_alltoall_ragged_outside_jit(ps, member):
    if member is None:
        return
    splits = [[1, 2], [3, 1]]   # set rank s sends splits[s][j] rows to set rank j
    xs = [contribution(r, (sum(splits[i]), 2), seed=341) for i, r in enumerate(MEMBERS)]
    got, received = ps.alltoall(jnp.asarray(xs[member]), splits=splits[member],
                                return_splits=True)
    parts = [xs[s][sum(splits[s][:member]):sum(splits[s][:member + 1])] for s in range(2)]
    np.testing.assert_array_equal(np.asarray(got), np.concatenate(parts))
    assert list(received) == [splits[s][member] for s in range(2)]


@pytest.mark.parametrize("jit", JIT)
def test_reducescatter(ps, member, jit):
    if member is None:
        return
    xs = set_contributions((5, 2), seed=350)
    got = run(lambda a: ps.reducescatter(a, op=cfx.Sum), jit, jnp.asarray(xs[member]))
    total = np.sum(np.stack(xs), axis=0)
    np.testing.assert_array_equal(np.asarray(got), total[:3] if member == 0 else total[3:])


def test_barrier(ps, member):
    if member is None:
        return
    ps.barrier()


def test_set_and_job_collectives_in_one_jit(ps, rank, size, member):
    """The members run the set's collectives between the job's, in one jitted function; rank 1
    runs only the job's: the job's collectives still pair up across all three."""
    xs = all_contributions(size, (4,), seed=360)
    if member is not None:
        def step(x):
            a = cfx.allreduce(x, op=cfx.Sum)                    # job
            b = ps.allreduce(x * 2.0, op=cfx.Sum)               # set
            c = cfx.allgather(x[None])                          # job
            d = ps.broadcast(x + a, root_rank=0)                # set
            return a, b, c, d
        a, b, c, d = jax.jit(step)(jnp.asarray(xs[rank]))
        np.testing.assert_array_equal(np.asarray(b), 2.0 * (xs[0] + xs[2]))
        np.testing.assert_array_equal(np.asarray(d), xs[0] + np.sum(xs, axis=0))
    else:
        a, c = jax.jit(lambda x: (cfx.allreduce(x, op=cfx.Sum), cfx.allgather(x[None])))(
            jnp.asarray(xs[rank]))
    np.testing.assert_array_equal(np.asarray(a), np.sum(xs, axis=0))
    np.testing.assert_array_equal(np.asarray(c), np.stack(xs))


def test_gradient_over_the_set(ps, rank, member):
    if member is None:
        return
    x = jnp.asarray(contribution(rank, (3,), seed=370))
    g = jax.jit(jax.grad(lambda v: jnp.sum(ps.allreduce(v, op=cfx.Sum) * (rank + 1))))(x)
    # d/dx of the set's objective sum_s (s + 1) * sum_q x_q: the members' weights, 1 + 3.
    np.testing.assert_allclose(np.asarray(g), np.full(3, 4.0))


def test_optax_training_over_the_set(ps, rank, member):
    optax = pytest.importorskip("optax")
    from test_train import batch, init_params, loss, train
    if member is None:
        return
    tx = cfx.DistributedOptimizer(optax.sgd(0.1), process_set=ps)
    params = ps.broadcast_parameters(init_params(seed=rank), root_rank=0)
    steps = 3
    got = train(tx, params, [batch(rank, s) for s in range(steps)], True)
    ref = []
    for s in range(steps):
        parts = [batch(r, s) for r in MEMBERS]
        ref.append((np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])))
    want = train(optax.sgd(0.1), init_params(seed=0), ref, False)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=2e-5,
                                   atol=2e-6, err_msg=k)


def test_a_freed_sets_program_fails_saying_so(rank, size):
    if size != 3:
        pytest.skip("3 ranks")
    s = cfx.ProcessSet([1, 2])
    if not s.included():
        s.free()
        return
    f = jax.jit(lambda a: s.allreduce(a, op=cfx.Sum))
    np.testing.assert_array_equal(np.asarray(f(jnp.ones(2))), np.full(2, 2.0))
    s.free()
    with pytest.raises(Exception, match="process set was freed"):
        jax.block_until_ready(f(jnp.ones(2)))   # compiled before: runs without tracing
    with pytest.raises(ValueError, match="freed"):
        s.allreduce(jnp.ones(2))

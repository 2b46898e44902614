"""conflux.jax's collectives, eagerly and inside jit, against numpy computations of what every
rank contributed."""
import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (tools/install-python installs the pinned jax)")
import jax.numpy as jnp  # noqa: E402

import conflux.jax as cfx
from conftest import all_contributions, contribution

JIT = [False, True]


def run(fn, jit, *args):
    return jax.jit(fn)(*args) if jit else fn(*args)


REDUCTIONS = {
    cfx.Sum: lambda xs: np.sum(xs, axis=0),
    cfx.Average: lambda xs: np.mean(xs, axis=0),
    cfx.Min: lambda xs: np.min(xs, axis=0),
    cfx.Max: lambda xs: np.max(xs, axis=0),
    cfx.Product: lambda xs: np.prod(xs, axis=0),
}


@pytest.mark.parametrize("jit", JIT)
@pytest.mark.parametrize("op", list(REDUCTIONS), ids=["Sum", "Average", "Min", "Max", "Product"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "bfloat16"])
def test_allreduce_ops(rank, size, op, dtype, jit):
    if op == cfx.Average and dtype == "int32":
        pytest.skip("integer average rounds (docs/c-api.md); covered by the float dtypes")
    low, high = (-2, 3) if op == cfx.Product else (-50, 51)
    xs = all_contributions(size, (3, 5), seed=op, low=low, high=high, dtype=np.float64)
    x = jnp.asarray(xs[rank], dtype=dtype)
    got = run(lambda a: cfx.allreduce(a, op=op), jit, x)
    assert got.dtype == x.dtype and got.shape == x.shape
    want = REDUCTIONS[op](np.stack(xs))
    tol = 1e-2 if dtype == "bfloat16" else 1e-6
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("jit", JIT)
def test_allreduce_scales(rank, size, jit):
    xs = all_contributions(size, (7,), seed=11)
    got = run(lambda a: cfx.allreduce(a, op=cfx.Sum, prescale_factor=0.5, postscale_factor=3.0),
              jit, jnp.asarray(xs[rank]))
    np.testing.assert_allclose(np.asarray(got), 3.0 * np.sum(0.5 * np.stack(xs), axis=0),
                               rtol=1e-6)


@pytest.mark.parametrize("jit", JIT)
@pytest.mark.parametrize("compression", ["fp16", cfx.Compression.bf16_everywhere])
def test_allreduce_compression(rank, size, jit, compression):
    # Small integers are exact in both 16-bit formats, so the compressed sum is exact too.
    xs = all_contributions(size, (1000,), seed=12, low=-8, high=9)
    got = run(lambda a: cfx.allreduce(a, op=cfx.Sum, compression=compression), jit,
              jnp.asarray(xs[rank]))
    np.testing.assert_array_equal(np.asarray(got), np.sum(np.stack(xs), axis=0))


@pytest.mark.parametrize("jit", JIT)
def test_allreduce_adasum_of_equal_vectors(rank, size, jit):
    # Adasum(a, a) = a whatever the combination order: every rank's equal vector comes back.
    a = contribution(0, (16,), seed=13)
    got = run(lambda v: cfx.allreduce(v, op=cfx.Adasum), jit, jnp.asarray(a))
    np.testing.assert_allclose(np.asarray(got), a, rtol=1e-5)


def test_allreduce_adasum_two_ranks(rank, size):
    if size != 2:
        pytest.skip("the closed form below is Adasum's pairwise combination (2 ranks)")
    a, b = all_contributions(size, (16,), seed=14, dtype=np.float64)
    dot = a @ b
    want = (1 - dot / (2 * (a @ a))) * a + (1 - dot / (2 * (b @ b))) * b
    got = cfx.allreduce(jnp.asarray((a, b)[rank], dtype=jnp.float32), op=cfx.Adasum)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("jit", JIT)
def test_grouped_allreduce_pytree(rank, size, jit):
    shapes = {"w": (4, 3), "b": (3,), "layers": [(2,), (5, 1)], "s": ()}
    flat, tree = jax.tree_util.tree_flatten(shapes, is_leaf=lambda s: isinstance(s, tuple))
    per_rank = [[contribution(r, s, seed=20 + i) for i, s in enumerate(flat)]
                for r in range(size)]
    mine = jax.tree_util.tree_unflatten(tree, [jnp.asarray(a) for a in per_rank[rank]])
    got = run(lambda t: cfx.grouped_allreduce(t, op=cfx.Sum), jit, mine)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(mine)
    for i, leaf in enumerate(jax.tree_util.tree_leaves(got)):
        np.testing.assert_array_equal(np.asarray(leaf),
                                      np.sum([per_rank[r][i] for r in range(size)], axis=0))


def test_grouped_allreduce_compressed_average(rank, size):
    xs = [all_contributions(size, s, seed=30 + i, low=-8, high=9) for i, s in
          enumerate([(5,), (2, 2)])]
    got = cfx.grouped_allreduce([jnp.asarray(x[rank]) for x in xs], op=cfx.Average,
                                compression="fp16", name="grp")
    for g, x in zip(got, xs):
        np.testing.assert_allclose(np.asarray(g), np.mean(np.stack(x), axis=0), rtol=1e-3)


@pytest.mark.parametrize("jit", JIT)
def test_allgather_equal(rank, size, jit):
    xs = all_contributions(size, (2, 3), seed=40)
    got = run(cfx.allgather, jit, jnp.asarray(xs[rank]))
    np.testing.assert_array_equal(np.asarray(got), np.concatenate(xs))


def test_allgather_ragged_outside_jit(rank, size):
    xs = [contribution(r, (r + 1, 2), seed=41) for r in range(size)]
    got = cfx.allgather(jnp.asarray(xs[rank]))
    np.testing.assert_array_equal(np.asarray(got), np.concatenate(xs))


def test_allgather_ragged_inside_jit_is_an_error(rank, size):
    # Rank 0 sends 2 rows, the others 1: no rank's static size x dim 0 equals the total.
    x = jnp.ones((2 if rank == 0 else 1, 2), jnp.float32)
    with pytest.raises(Exception, match="same dim 0"):
        jax.block_until_ready(jax.jit(cfx.allgather)(x))


@pytest.mark.parametrize("jit", JIT)
def test_broadcast(rank, size, jit):
    for root in range(size):
        xs = all_contributions(size, (4,), seed=50 + root, dtype=np.int32)
        got = run(lambda a: cfx.broadcast(a, root), jit, jnp.asarray(xs[rank]))
        np.testing.assert_array_equal(np.asarray(got), xs[root])


def test_broadcast_parameters(rank, size):
    tree = {"w": jnp.asarray(contribution(rank, (3, 2), seed=55)),
            "opt": (jnp.asarray(contribution(rank, (4,), seed=56)), 7)}
    got = cfx.broadcast_parameters(tree, root_rank=size - 1)
    np.testing.assert_array_equal(np.asarray(got["w"]), contribution(size - 1, (3, 2), seed=55))
    np.testing.assert_array_equal(np.asarray(got["opt"][0]),
                                  contribution(size - 1, (4,), seed=56))
    assert got["opt"][1] == 7


@pytest.mark.parametrize("jit", JIT)
def test_alltoall_equal(rank, size, jit):
    xs = all_contributions(size, (2 * size, 3), seed=60)
    got = run(cfx.alltoall, jit, jnp.asarray(xs[rank]))
    want = np.concatenate([xs[src][2 * rank:2 * rank + 2] for src in range(size)])
    np.testing.assert_array_equal(np.asarray(got), want)


def test_alltoall_ragged_outside_jit(rank, size):
    # Rank r sends (r + j) % 3 + 1 rows to rank j.
    splits = [[(r + j) % 3 + 1 for j in range(size)] for r in range(size)]
    xs = [contribution(r, (sum(splits[r]), 2), seed=61) for r in range(size)]
    got, received = cfx.alltoall(jnp.asarray(xs[rank]), splits=splits[rank], return_splits=True)
    parts = []
    for src in range(size):
        off = sum(splits[src][:rank])
        parts.append(xs[src][off:off + splits[src][rank]])
    np.testing.assert_array_equal(np.asarray(got), np.concatenate(parts))
    assert list(received) == [splits[src][rank] for src in range(size)]


@pytest.mark.parametrize("jit", JIT)
def test_reducescatter(rank, size, jit):
    d0 = 2 * size + 1
    xs = all_contributions(size, (d0, 2), seed=70)
    got = run(lambda a: cfx.reducescatter(a, op=cfx.Sum), jit, jnp.asarray(xs[rank]))
    total = np.sum(np.stack(xs), axis=0)
    rows = [d0 // size + (1 if r < d0 % size else 0) for r in range(size)]
    off = sum(rows[:rank])
    np.testing.assert_array_equal(np.asarray(got), total[off:off + rows[rank]])


def test_barrier(rank, size):
    cfx.barrier()
    jax.jit(lambda: cfx.barrier())()


@pytest.mark.parametrize("named", [False, True])
def test_many_collectives_in_one_jit_out_of_creation_order(rank, size, named):
    """Arrays created in one order, reduced in another; each collective's inputs depend on the
    previous ones' results only partly, so the order is the effect's, not the data's."""
    xs = all_contributions(size, (6,), seed=80)
    ys = all_contributions(size, (size * 2,), seed=81)
    n = (lambda s: s) if named else (lambda s: None)

    def step(x, y):
        a = x * 2.0          # created first
        b = y + 1.0          # created second
        c = x - 3.0          # created third
        g = cfx.allgather(b, name=n("g"))              # collectives: b, c, a, then b again
        m = cfx.allreduce(c, op=cfx.Max, name=n("m"))
        s = cfx.allreduce(a, op=cfx.Sum, name=n("s"))
        t = cfx.alltoall(b, name=n("t"))
        r = cfx.broadcast(a + s[0], root_rank=size - 1, name=n("r"))
        return g, m, s, t, r

    for _ in range(2):  # twice: the same compiled program again
        g, m, s, t, r = jax.jit(step)(jnp.asarray(xs[rank]), jnp.asarray(ys[rank]))
        X, Y = np.stack(xs), np.stack(ys)
        np.testing.assert_array_equal(np.asarray(g), np.concatenate(Y + 1.0))
        np.testing.assert_array_equal(np.asarray(m), np.max(X - 3.0, axis=0))
        np.testing.assert_array_equal(np.asarray(s), np.sum(X * 2.0, axis=0))
        np.testing.assert_array_equal(
            np.asarray(t), np.concatenate([Y[src][2 * rank:2 * rank + 2] + 1.0
                                           for src in range(size)]))
        np.testing.assert_array_equal(np.asarray(r), X[size - 1] * 2.0 + np.sum(X[:, 0] * 2.0))


def test_eager_and_jit_interleaved(rank, size):
    xs = all_contributions(size, (5,), seed=90)
    x = jnp.asarray(xs[rank])
    f = jax.jit(lambda a: cfx.allreduce(a, op=cfx.Sum))
    outs = [f(x), cfx.allreduce(x, op=cfx.Max), f(x * 2), cfx.allgather(x[: rank + 1])]
    np.testing.assert_array_equal(np.asarray(outs[0]), np.sum(xs, axis=0))
    np.testing.assert_array_equal(np.asarray(outs[1]), np.max(xs, axis=0))
    np.testing.assert_array_equal(np.asarray(outs[2]), 2 * np.sum(xs, axis=0))
    np.testing.assert_array_equal(np.asarray(outs[3]),
                                  np.concatenate([xs[r][: r + 1] for r in range(size)]))


def test_collectives_in_a_scan(rank, size):
    xs = all_contributions(size, (3,), seed=95)

    def body(c, _):
        return cfx.allreduce(c, op=cfx.Average) + 1.0, None

    got, _ = jax.jit(lambda a: jax.lax.scan(body, a, None, length=3))(jnp.asarray(xs[rank]))
    # After the first step every rank holds the same value: later averages keep it.
    np.testing.assert_allclose(np.asarray(got), np.mean(xs, axis=0) + 3.0, rtol=1e-6)


def test_vmap_allreduce(rank, size):
    xs = all_contributions(size, (4, 3), seed=100)
    got = jax.jit(jax.vmap(lambda a: cfx.allreduce(a, op=cfx.Sum), in_axes=1, out_axes=1))(
        jnp.asarray(xs[rank]))
    np.testing.assert_array_equal(np.asarray(got), np.sum(xs, axis=0))


# ---- bad input: errors name the op and the array ----
def test_unsupported_dtype_names_op_and_array(rank, size):
    with pytest.raises(cfx.DtypeError, match=r"allreduce of 'w'.*complex64"):
        cfx.allreduce(jnp.ones(3, jnp.complex64), name="w")
    with pytest.raises(cfx.DtypeError, match=r"allgather of .*uint32"):
        jax.jit(cfx.allgather)(jnp.ones(3, jnp.uint32))
    with pytest.raises(cfx.DtypeError, match=r"grouped_allreduce of 'g\[1\]'.*complex"):
        cfx.grouped_allreduce([jnp.ones(2), jnp.ones(2, jnp.complex64)], name="g")


def test_bad_arguments(rank, size):
    with pytest.raises(ValueError, match="unknown reduction op"):
        cfx.allreduce(jnp.ones(2), op=99)
    with pytest.raises(ValueError, match="divide"):
        jax.jit(cfx.alltoall)(jnp.ones(size * 2 + 1))
    with pytest.raises(ValueError, match="outside jit"):
        jax.jit(lambda a: cfx.alltoall(a, splits=[1] + [0] * (size - 1)))(jnp.ones(1))
    with pytest.raises(TypeError, match="compression"):
        cfx.allreduce(jnp.ones(2), compression=object())


def test_rank_mismatch_is_an_error_on_every_rank(rank, size):
    # Different shapes under one name: the engine's mismatch error, raised where JAX returns.
    x = jnp.ones((rank + 2,), jnp.float32)
    with pytest.raises(Exception, match="conflux.jax.allreduce of 'mm'") as info:
        jax.block_until_ready(cfx.allreduce(x, name="mm"))
    # ...which conflux.jax maps back onto the engine's error class.
    assert isinstance(cfx.engine_error(info.value), cfx.ConfluxError)
    assert type(cfx.engine_error(info.value)).__name__ == "MismatchError"
    assert cfx.engine_error(ValueError("unrelated")) is None


def test_in_place_results_leave_live_inputs_alone(rank, size):
    """Inside jit allreduce, grouped_allreduce and broadcast write their results into their
    inputs' buffers (XLA input_output_aliases): XLA must copy an input that is used again or
    that the caller keeps, and may hand over a donated one."""
    xs = all_contributions(size, (6,), seed=110)
    x = jnp.asarray(xs[rank])
    total = np.sum(xs, axis=0)

    def uses_input_again(a):
        s = cfx.allreduce(a, op=cfx.Sum)
        g = cfx.grouped_allreduce([a * 1.0, a], op=cfx.Sum)
        b = cfx.broadcast(a, root_rank=0)
        return a + s, g, b, a
    again, g, b, same = jax.jit(uses_input_again)(x)
    np.testing.assert_array_equal(np.asarray(again), xs[rank] + total)
    np.testing.assert_array_equal(np.asarray(g[0]), total)
    np.testing.assert_array_equal(np.asarray(g[1]), total)
    np.testing.assert_array_equal(np.asarray(b), xs[0])
    np.testing.assert_array_equal(np.asarray(same), xs[rank])
    np.testing.assert_array_equal(np.asarray(x), xs[rank])     # the jit argument, kept
    donated = jax.jit(lambda a: cfx.allreduce(a, op=cfx.Sum), donate_argnums=0)
    np.testing.assert_array_equal(np.asarray(donated(jnp.asarray(xs[rank]))), total)
    np.testing.assert_array_equal(np.asarray(x), xs[rank])

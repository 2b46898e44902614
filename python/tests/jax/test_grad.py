"""Gradients through conflux.jax's allreduce against central finite differences of the global
objective F = sum over ranks of each rank's loss (the gradient conflux.torch and Horovod define)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (tools/install-python installs the pinned jax)")
import jax.numpy as jnp  # noqa: E402

import conflux.jax as cfx
from conftest import all_contributions

jax.config.update("jax_enable_x64", True)


def local_loss(op, w, rank):
    def f(x):
        y = cfx.allreduce(x, op=op, prescale_factor=0.5, postscale_factor=2.0)
        return jnp.sum(jnp.sin(y) * w) + 0.1 * rank * jnp.sum(y ** 2)
    return f


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("op", [cfx.Sum, cfx.Average], ids=["Sum", "Average"])
def test_grad_matches_finite_differences(rank, size, op, jit):
    xs = [x / 10.0 for x in all_contributions(size, (3,), seed=7, dtype=np.float64)]
    w = jnp.asarray(np.arange(1.0, 4.0) * (rank + 1))
    f = local_loss(op, w, rank)
    grad = jax.grad(f)
    if jit:
        grad = jax.jit(grad)
    g = np.asarray(grad(jnp.asarray(xs[rank])))

    def F(x_mine):  # the global objective, every rank taking part
        return float(cfx.allreduce(f(x_mine), op=cfx.Sum))

    eps = 1e-6
    fd = np.zeros((size, 3))
    for s in range(size):       # rank s perturbs coordinate i; everyone evaluates F
        for i in range(3):
            d = np.zeros(3)
            if rank == s:
                d[i] = eps
            plus = F(jnp.asarray(xs[rank] + d))
            minus = F(jnp.asarray(xs[rank] - d))
            fd[s, i] = (plus - minus) / (2 * eps)
    np.testing.assert_allclose(g, fd[rank], rtol=1e-5, atol=1e-7)


def test_grad_of_grouped_allreduce(rank, size):
    xs = all_contributions(size, (2,), seed=8, dtype=np.float64)
    t = {"a": jnp.asarray(xs[rank]), "b": jnp.asarray(xs[rank] * 2)}
    g = jax.jit(jax.grad(lambda t: jnp.sum(
        cfx.grouped_allreduce(t, op=cfx.Sum)["a"] * (rank + 1))))(t)
    # d/dx_r of sum_s (s + 1) * sum_q a_q = sum_s (s + 1) for every rank's a; b gets 0.
    np.testing.assert_allclose(np.asarray(g["a"]), np.full(2, size * (size + 1) / 2))
    np.testing.assert_allclose(np.asarray(g["b"]), np.zeros(2))


def test_min_has_no_gradient(rank, size):
    with pytest.raises(Exception):
        jax.grad(lambda x: jnp.sum(cfx.allreduce(x, op=cfx.Min)))(jnp.ones(2))


@pytest.mark.parametrize("jit", [False, True])
def test_grad_of_broadcast(rank, size, jit):
    # Each rank's loss is (rank + 1) * sum(broadcast(x, root)): the global objective's gradient
    # is sum_r (r + 1) on the root's x and 0 on every other rank's.
    root = size - 1
    g = jax.grad(lambda x: (rank + 1) * jnp.sum(cfx.broadcast(x, root_rank=root)))
    if jit:
        g = jax.jit(g)
    got = np.asarray(g(jnp.ones(3, jnp.float64)))
    want = size * (size + 1) / 2 if rank == root else 0.0
    np.testing.assert_allclose(got, np.full(3, want))

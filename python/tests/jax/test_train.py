"""A small MLP trained with optax through conflux.jax for several steps: its parameters equal
(float32 rounding) those of the same model trained in this process alone on every rank's batches
concatenated. Each rank computes that single-process reference itself."""
import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (tools/install-python installs the pinned jax)")
import jax.numpy as jnp  # noqa: E402
optax = pytest.importorskip("optax", reason="optax is not installed (tools/install-python installs it)")

import conflux.jax as cfx

BATCH, IN, HIDDEN, OUT, STEPS = 8, 5, 16, 3, 6


def init_params(seed):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {"w1": jax.random.normal(k1, (IN, HIDDEN), jnp.float32) * 0.3,
            "b1": jnp.zeros((HIDDEN,), jnp.float32),
            "w2": jax.random.normal(k2, (HIDDEN, OUT), jnp.float32) * 0.3,
            "b2": jnp.zeros((OUT,), jnp.float32)}


def loss(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def batch(rank, step):
    rng = np.random.default_rng(10_000 + 100 * step + rank)
    return (rng.standard_normal((BATCH, IN)).astype(np.float32),
            rng.standard_normal((BATCH, OUT)).astype(np.float32))


def train(tx, params, batches, distributed):
    state = tx.init(params)

    @jax.jit
    def step(params, state, x, y):
        g = jax.grad(loss)(params, x, y)
        updates, state = tx.update(g, state, params)
        return optax.apply_updates(params, updates), state

    for x, y in batches:
        params, state = step(params, state, jnp.asarray(x), jnp.asarray(y))
    return params


@pytest.mark.parametrize("make", ["DistributedOptimizer(sgd)", "chain(allreduce_gradients, adam)"])
def test_training_matches_single_process(rank, size, make):
    if make.startswith("Distributed"):
        tx, ref_tx = cfx.DistributedOptimizer(optax.sgd(0.1, momentum=0.9)), \
            optax.sgd(0.1, momentum=0.9)
    else:
        tx, ref_tx = optax.chain(cfx.allreduce_gradients(), optax.adam(1e-2)), optax.adam(1e-2)
    # Different starting points on each rank: broadcast_parameters makes them rank 0's.
    params = cfx.broadcast_parameters(init_params(seed=rank), root_rank=0)
    got = train(tx, params, [batch(rank, s) for s in range(STEPS)], True)

    # The reference: rank 0's initial parameters, each step on all ranks' batches concatenated
    # (equal batch sizes: the mean of the ranks' mean losses is the mean over the concatenation).
    ref_batches = []
    for s in range(STEPS):
        parts = [batch(r, s) for r in range(size)]
        ref_batches.append((np.concatenate([p[0] for p in parts]),
                            np.concatenate([p[1] for p in parts])))
    want = train(ref_tx, init_params(seed=0), ref_batches, False)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=2e-5, atol=2e-6,
                                   err_msg=k)
    # ...and every rank holds the same parameters, bit for bit.
    for k, v in got.items():
        gathered = np.asarray(cfx.allgather(v[None]))
        assert (gathered == gathered[0]).all(), k
    assert float(loss(got, *map(jnp.asarray, ref_batches[0]))) < \
        float(loss(init_params(seed=0), *map(jnp.asarray, ref_batches[0])))

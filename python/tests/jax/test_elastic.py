"""conflux.jax.JaxState without a change of membership: sync() gives every rank the pytrees and
attributes of the member with the newest commit, restore() goes back to the last save. A run
that loses a rank under cfxrun --elastic is elastic_driver.py (ctest python_jax_elastic)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (tools/install-python installs the pinned jax)")

import jax.numpy as jnp  # noqa: E402

import conflux.jax as cfx
from conftest import contribution


def tree(rank):
    return {"w": jnp.asarray(contribution(rank, (3, 2), seed=200)),
            "b": [jnp.asarray(contribution(rank, (4,), seed=201)), jnp.int32(rank)]}


def assert_tree_equal(a, b):
    np.testing.assert_array_equal(np.asarray(a["w"]), np.asarray(b["w"]))
    np.testing.assert_array_equal(np.asarray(a["b"][0]), np.asarray(b["b"][0]))
    assert int(a["b"][1]) == int(b["b"][1])


def test_sync_and_restore(rank, size):
    state = cfx.JaxState(params=tree(rank), opt_state=(tree(rank + 10),), epoch=rank, note="r%d" % rank)
    state.sync()  # nobody committed: the lowest rank's state
    assert_tree_equal(state.params, tree(0))
    assert_tree_equal(state.opt_state[0], tree(10))
    assert state.epoch == 0 and state.note == "r0"
    state.params = tree(rank + 5)
    state.epoch = 99
    state.restore()
    assert_tree_equal(state.params, tree(0))
    assert state.epoch == 0


def test_engine_error_maps_status_names(rank, size):
    e = RuntimeError("conflux.jax.allreduce of 'w': the collective failed: [PEER_LOST] peer rank lost")
    assert type(cfx.engine_error(e)).__name__ == "PeerLostError"

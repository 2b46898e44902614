"""A JAX elastic training script, run by elastic_driver.py under cfxrun --elastic: linear
regression trained with optax SGD with momentum (so the optimizer state matters) through
conflux.jax.DistributedOptimizer inside jit, its parameters and optimizer state in a
conflux.jax.JaxState, the loop under conflux.jax.run. Every step's gradient is the mean over one
global batch of GLOBAL rows: each rank takes rows rank::size, sums its rows' gradients divided by
GLOBAL, and the optimizer's allreduce (op Sum) adds them up, so the parameters depend only on
which batches were applied, never on the world's size; the driver's reference is one process
over the same batches.

ELASTIC_KILL="host:epoch:batch": the worker on that host kills itself (SIGKILL) there, in the
first world. ELASTIC_OUT: each worker that ends writes OUT.<member id>.json with its final
parameters and optimizer state's arrays (as float64 lists), the world sizes it saw after each
reset, its rank and size."""
import json
import os
import signal

import numpy as np

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import conflux  # noqa: E402
import conflux.jax as cfx  # noqa: E402

EPOCHS, BATCHES, GLOBAL, DIM, LR, MOMENTUM = 3, 6, 12, 4, 0.05, 0.9


def batch(epoch, b):
    g = np.random.default_rng(1000 * epoch + b)
    x = g.standard_normal((GLOBAL, DIM))
    y = x @ np.arange(1, DIM + 1) + 0.5 + 0.1 * g.standard_normal(GLOBAL)
    return x, y


def loss(params, x, y):
    # This rank's share of the global mean: its rows' squared errors over GLOBAL.
    return jnp.sum((x @ params["w"] + params["b"] - y) ** 2) / GLOBAL


cfx.init()
tx = cfx.DistributedOptimizer(optax.sgd(LR, momentum=MOMENTUM), op=cfx.Sum)


@jax.jit
def step(params, opt_state, x, y):
    g = jax.grad(loss)(params, x, y)
    updates, opt_state = tx.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


gather = jax.jit(cfx.allgather)


# Every rank starts from its own (wrong) parameters: the first sync gives them rank 0's zeros.
params = {"w": jnp.full((DIM,), float(cfx.rank()), jnp.float64),
          "b": jnp.asarray(float(cfx.rank()), jnp.float64)}
if cfx.rank() == 0:
    params = jax.tree_util.tree_map(jnp.zeros_like, params)
state = cfx.JaxState(params=params, opt_state=tx.init(params), epoch=0, batch=0)
sizes = []
state.register_reset_callbacks([lambda: sizes.append(cfx.size())])
kill = os.environ.get("ELASTIC_KILL", "").split(":")


def maybe_die(epoch, b):
    if len(kill) == 3 and os.environ["HOROVOD_HOSTNAME"] == kill[0] and \
            (epoch, b) == (int(kill[1]), int(kill[2])) and conflux.membership_round() == 1:
        os.kill(os.getpid(), signal.SIGKILL)


@cfx.run
def train(state):
    for state.epoch in range(state.epoch, EPOCHS):
        while state.batch < BATCHES:   # a commit records the next batch to run
            b = state.batch
            maybe_die(state.epoch, b)
            x, y = batch(state.epoch, b)
            mine = slice(cfx.rank(), None, cfx.size())
            state.params, state.opt_state = step(state.params, state.opt_state,
                                                 jnp.asarray(x[mine]), jnp.asarray(y[mine]))
            # As a loop that logs its loss would: the step's failure surfaces here, from XLA.
            jax.block_until_ready(state.params)
            state.batch = b + 1
            if state.batch % 2 == 0:
                state.commit()
                # A jitted allgather's static shape is size() times dim 0: compiled in the first
                # world, called again in the new one (conflux.jax drops JAX's compiled programs
                # at a membership change).
                ranks = gather(jnp.asarray([cfx.rank()], jnp.int32))
                assert list(np.asarray(ranks)) == list(range(cfx.size())), ranks
        state.batch = 0


train(state)
out = os.environ.get("ELASTIC_OUT")
if out:
    p = jax.device_get(state.params)
    with open("%s.%d.json" % (out, conflux.member_id()), "w") as f:
        json.dump({"w": np.asarray(p["w"]).tolist(), "b": float(p["b"]), "sizes": sizes,
                   "rank": cfx.rank(), "size": cfx.size(),
                   "opt_state": [np.asarray(v).tolist()
                                 for v in jax.tree_util.tree_leaves(state.opt_state)]}, f)
cfx.shutdown()

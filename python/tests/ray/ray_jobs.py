"""What the Ray tests run in the workers (test_ray.py): importable there because the cluster's
processes get this folder on PYTHONPATH (conftest.py), so cloudpickle sends these by reference.

The model and data are the same in every process: a small MLP trained with SGD on global batches
drawn from seeds, each rank on its equal share of the rows, so a run on any number of workers
must end with the parameters of one process trained on the whole batches (float32 tolerance)."""
import json
import os
import time

import numpy as np

GLOBAL, DIM, STEPS, LR = 24, 8, 5, 0.1


def _model():
    import torch
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(DIM, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _batch(step):
    import torch
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(GLOBAL, DIM, generator=g)
    y = x.sum(dim=1, keepdim=True).sin() + 0.1 * torch.randn(GLOBAL, 1, generator=g)
    return x, y


def _params(model):
    return [p.detach().double().flatten().tolist() for p in model.parameters()]


def reference():
    """One process, every row of every batch."""
    import torch
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = _batch(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return _params(model)


def train_executor():
    """RayExecutor's workers: conflux.torch's DistributedOptimizer (the Horovod way)."""
    import torch
    import conflux.torch as cfx
    cfx.init()
    rank, size = cfx.rank(), cfx.size()
    model = _model()
    opt = cfx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters())
    cfx.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(STEPS):
        x, y = _batch(step)
        rows = slice(rank, None, size)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        opt.step()
    place = {k: os.environ[k] for k in ("CFX_RANK", "CFX_SIZE", "CFX_LOCAL_RANK",
                                        "CFX_LOCAL_SIZE", "HOROVOD_HOSTNAME",
                                        "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")}
    import ray
    place["node"] = ray.get_runtime_context().get_node_id()
    return {"rank": rank, "size": size, "params": _params(model), "place": place}


def raise_on(bad_rank, late_rank=None):
    """Every rank joins; `bad_rank` raises while the others wait for it in an allreduce.
    `late_rank` comes to conflux.init() only once the world it was in has ended (a task of the
    run that starts after the failure): its init must refuse to form a new world in this run."""
    import conflux
    if late_rank is not None and conflux.is_initialized() and conflux.rank() == late_rank:
        deadline = time.monotonic() + 30
        while conflux.is_initialized() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not conflux.is_initialized(), "the world did not end after the failure"
    conflux.init()
    if conflux.rank() == bad_rank:
        raise ValueError("injected failure on rank %d" % bad_rank)
    conflux.allreduce(np.ones(4, np.float32), name="waits.for.the.bad.rank")
    return conflux.rank()


def allreduce_forever(ready_dir):
    """Allreduces until the world ends (a killed peer); marks the first round done."""
    import conflux
    conflux.init()
    n = 0
    while True:
        conflux.allreduce(np.ones(1024, np.float32), name="forever")
        n += 1
        if n == 3:
            open(os.path.join(ready_dir, "ready.%d" % conflux.rank()), "w").close()
        time.sleep(0.01)


def rank_and_size():
    import conflux
    conflux.init()
    return conflux.rank(), conflux.size()


# ---- Ray Train: TorchTrainer on the conflux backend ----
def train_loop_ray_train(config):
    import torch
    import torch.distributed as dist
    import ray.train
    import ray.train.torch
    import conflux
    model = ray.train.torch.prepare_model(_model())  # DDP on the default group: backend conflux
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    rank, size = dist.get_rank(), dist.get_world_size()
    for step in range(STEPS):
        x, y = _batch(step)
        rows = slice(rank, None, size)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        opt.step()
    out = {"rank": rank, "size": size, "backend": dist.get_backend(),
           "conflux": [conflux.rank(), conflux.size()],
           "node": ray.get_runtime_context().get_node_id(),
           "params": _params(model.module if hasattr(model, "module") else model)}
    with open(os.path.join(config["out"], "rank%d.json" % rank), "w") as f:
        json.dump(out, f)


# ---- elastic: conflux.elastic with a commit every batch ----
EPOCHS, BATCHES, EGLOBAL, EDIM, ELR = 3, 6, 12, 4, 0.05


def _ebatch(epoch, b):
    g = np.random.default_rng(1000 * epoch + b)
    x = g.standard_normal((EGLOBAL, EDIM))
    y = x @ np.arange(1, EDIM + 1) + 0.1 * g.standard_normal(EGLOBAL)
    return x, y


def elastic_reference():
    w = np.zeros(EDIM)
    for e in range(EPOCHS):
        for b in range(BATCHES):
            x, y = _ebatch(e, b)
            w = w - ELR * 2 * x.T @ (x @ w - y) / EGLOBAL
    return w.tolist()


def elastic_train(events, plan):
    """Linear regression with SGD, each rank adding its rows' share of the batch's gradient (one
    allreduce SUM), so the weights depend only on the batches applied, never on the world's size.
    plan: {"raise": node id} makes that node's worker of local rank 1 raise at epoch 1, batch 3
    of the first world; {"remove": True} makes rank 0 ask the test to remove the second node
    (file remove_now in `events`) at epoch 1, batch 2, and wait until it is gone;
    {"grow_to": N} makes rank 0, in a smaller world after the removal, ask for a node
    (add_now) and the ranks wait at their commit until all N - size newcomers said hello (so
    they come in together, at one round)."""
    import conflux
    import conflux.elastic as el
    conflux.init()

    def mark(name):
        open(os.path.join(events, name), "w").close()

    def seen(name):
        return os.path.exists(os.path.join(events, name))

    state = el.ObjectState(epoch=0, batch=0, w=np.zeros(EDIM), sizes=[])

    @el.run
    def loop(state):
        while state.epoch < EPOCHS:
            while state.batch < BATCHES:
                rank, size = conflux.rank(), conflux.size()
                if not state.sizes or state.sizes[-1] != size:
                    state.sizes.append(size)
                x, y = _ebatch(state.epoch, state.batch)
                rows = np.array_split(np.arange(EGLOBAL), size)[rank]
                g = 2 * x[rows].T @ (x[rows] @ state.w - y[rows]) / EGLOBAL
                state.w = state.w - ELR * conflux.allreduce(g, op=conflux.Sum, name="grad")
                state.batch += 1
                first_world = conflux.membership_round() == 1
                if plan.get("raise") and first_world and (state.epoch, state.batch) == (1, 3) \
                        and os.environ["HOROVOD_HOSTNAME"] == plan["raise"] \
                        and os.environ["HOROVOD_LOCAL_RANK"] == "1":
                    raise RuntimeError("injected failure on Ray node %s" % plan["raise"][:12])
                if plan.get("remove") and first_world and rank == 0 and \
                        (state.epoch, state.batch) == (1, 2):
                    mark("remove_now")
                    deadline = time.monotonic() + 60
                    while not seen("removed") and time.monotonic() < deadline:
                        time.sleep(0.05)
                # a smaller world after the removal (every rank agrees on the round; a file the
                # test writes could be seen by some ranks and not yet by others)
                if plan.get("grow_to") and conflux.membership_round() > 1 \
                        and size < plan["grow_to"]:
                    if rank == 0 and not seen("add_now"):
                        mark("add_now")
                    deadline = time.monotonic() + 120
                    while time.monotonic() < deadline:  # every rank agrees: no one runs ahead
                        pending = conflux.allreduce(
                            np.array([conflux.membership_pending()], np.int64), op=conflux.Max,
                            name="newcomers.seen")
                        if pending[0] >= plan["grow_to"] - size:  # all in one round
                            break
                        time.sleep(0.2)
                state.commit()
            state.epoch += 1
            state.batch = 0
        return {"w": state.w.tolist(), "sizes": state.sizes, "rank": conflux.rank()}

    return loop(state)

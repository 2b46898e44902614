"""The functions the conflux.spark tests run in Spark tasks, and their local references.

test_spark.py registers this module with cloudpickle by value, so the executors (and the processes
TorchDistributor starts) need only conflux, numpy and torch, not this file.
"""
import os
import signal
import socket

import numpy as np

FEATURES = 4
SAMPLES = 64
LEARNING_RATE = 0.1
QUANTUM = 2.0 ** -30


# ---- linear regression with numpy, over conflux's allreduce (conflux.spark.run) ------------------

def shard(index):
    """Shard `index`'s samples: x in [-1, 1]^FEATURES, y a noisy linear function of x."""
    rng = np.random.default_rng(1000 + index)
    x = rng.uniform(-1.0, 1.0, (SAMPLES, FEATURES))
    y = x @ np.array([0.5, -1.25, 2.0, 0.75]) + 0.3 + 0.01 * rng.uniform(-1.0, 1.0, SAMPLES)
    return x, y


def initial_weights():
    return np.random.default_rng(7).uniform(-1.0, 1.0, FEATURES + 1)


def gradient(x, y, w):
    """The shard's mean-squared-error gradient (bias last), each element rounded to a multiple of
    QUANTUM: sums of up to 2^22 of them are exact in float64, so the ranks' sum does not depend on
    the order the engine adds them in and the result can equal the reference bit for bit."""
    err = x @ w[:FEATURES] + w[FEATURES] - y
    g = np.concatenate([2.0 * (x.T @ err), [2.0 * err.sum()]]) / len(y)
    return np.rint(g / QUANTUM) * QUANTUM, float(np.mean(err * err))


def linreg_reference(shards, steps):
    """The same steps in one process over `shards` shards."""
    data = [shard(i) for i in range(shards)]
    w = initial_weights()
    for _ in range(steps):
        total = np.zeros(FEATURES + 1)
        for x, y in data:
            total += gradient(x, y, w)[0]
        w = w - LEARNING_RATE * (total / shards)
    return w


def linreg(steps):
    """One rank: its shard, the initial weights from rank 0, SGD on the summed gradients."""
    import conflux

    conflux.init()
    rank, size = conflux.rank(), conflux.size()
    x, y = shard(rank)
    w = conflux.broadcast(initial_weights() if rank == 0 else np.zeros(FEATURES + 1), root_rank=0)
    losses = []
    for step in range(steps):
        g, loss = gradient(x, y, w)
        total = conflux.allreduce(g, op=conflux.Sum, name="grad")
        w = w - LEARNING_RATE * (total / size)
        losses.append(float(conflux.allreduce(np.array([loss]), name="loss")[0]))
    return {
        "rank": rank, "size": size, "local_rank": conflux.local_rank(),
        "local_size": conflux.local_size(), "host": socket.gethostname(), "pid": os.getpid(),
        "env": {k: os.environ.get(k) for k in ("CFX_RANK", "CFX_SIZE", "CFX_LOCAL_RANK",
                                              "CFX_LOCAL_SIZE", "CFX_RENDEZVOUS_ADDR",
                                              "CONFLUX_TEST_ENV")},
        "weights": w.tolist(), "first_loss": losses[0], "last_loss": losses[-1],
    }


# ---- failures --------------------------------------------------------------------------------

def raise_on(failing_rank, message):
    """Every rank meets and sums once; `failing_rank` then raises while the others wait in the
    next allreduce (for a rank that never comes)."""
    import conflux

    conflux.init()
    conflux.allreduce(np.ones(4), name="first")
    if conflux.rank() == failing_rank:
        raise ValueError(message)
    conflux.allreduce(np.ones(4), name="second")
    return conflux.rank()


def die_on(dying_rank):
    """Every rank meets and sums once; `dying_rank`'s process then dies (SIGKILL)."""
    import conflux

    conflux.init()
    conflux.allreduce(np.ones(4), name="first")
    if conflux.rank() == dying_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    conflux.allreduce(np.ones(4), name="second")
    return conflux.rank()


def _executor_pid():
    """The executor JVM this Python worker runs under (the first java ancestor)."""
    pid = os.getppid()
    while pid > 1:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() == "java":
                return pid
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("no java ancestor: not in a Spark executor")


def kill_executor_on(lost_rank):
    """Every rank meets and sums once; `lost_rank` then SIGKILLs its own executor JVM (a lost
    executor: its Python worker goes with it) while the others wait in the next allreduce."""
    import conflux

    conflux.init()
    conflux.allreduce(np.ones(4), name="first")
    if conflux.rank() == lost_rank:
        os.kill(_executor_pid(), signal.SIGKILL)
    conflux.allreduce(np.ones(4), name="second")
    return conflux.rank()


# ---- DDP on the backend "conflux" (TorchDistributor) -----------------------------------------

TORCH_BATCH = 16


def torch_model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def torch_batch(rank, step):
    import torch

    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(TORCH_BATCH, FEATURES, generator=g)
    noise = 0.1 * torch.randn(TORCH_BATCH, 1, generator=g)
    y = x @ torch.tensor([[0.5], [-1.25], [2.0], [0.75]]) + noise
    return x, y


def ddp_train(steps, lr):
    """TorchDistributor's train function: DDP over the backend "conflux" from torch's env://
    variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, set by the torchrun it starts).
    Returns every rank's parameters (gathered to each rank), the world and the backend."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import conflux.torch  # noqa: F401  (registers the backend "conflux")

    dist.init_process_group("conflux")
    rank, size = dist.get_rank(), dist.get_world_size()
    model = torch_model()
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    for step in range(steps):
        x, y = torch_batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    state = {k: v.detach().tolist() for k, v in model.state_dict().items()}
    states = [None] * size
    dist.all_gather_object(states, state)
    out = {"rank": rank, "size": size, "backend": dist.get_backend(), "states": states,
           "engine_size": conflux.torch.size()}
    dist.destroy_process_group()
    return out


def ddp_reference(size, steps, lr):
    """One process: every step on the ranks' batches concatenated (DDP's average of per-rank mean
    gradients over equal batches is the mean gradient over all of them)."""
    import torch

    model = torch_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        batches = [torch_batch(r, step) for r in range(size)]
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach().tolist() for k, v in model.state_dict().items()}

"""A Horovod elastic training script, unchanged but for the import (conflux.horovod.torch), run by
test_elastic_train.py under cfxrun --elastic. Linear regression with SGD; every step's gradient is
the mean over one global batch of GLOBAL rows (its shard by hvd.rank()/hvd.size(), averaged), so
the parameters depend only on which batches were applied, never on the world's size: the test's
reference is a single process over the same batches.

Test knobs (environment): ELASTIC_KILL="host:how:epoch:batch" makes the workers of that host end
there in the first world (how: sigkill or raise; raise_one: only its worker of local rank 1 raises,
and the driver stops the others as the host leaves the world whole), or go silent (how: silent, on tests/hosts/cfxhosts:
the host's first worker pulls its link out with the agent, and its workers go on into a collective
nobody answers); ELASTIC_ADD_HOST="path:line" makes rank 0 append `line` to the discovery script's
hosts file at epoch 1, batch 0 (and the ranks wait for the newcomer's hello at batch 1);
ELASTIC_OUT: rank 0 writes the final parameters and sizes seen there, the times (time.time()) of
each reset and of the first step after it; with ELASTIC_OUT, the failing host writes when it
failed to ELASTIC_OUT.lost, rank 0 when it added the host to ELASTIC_OUT.added, and a newcomer
when it finished its first step to ELASTIC_OUT.joined. ELASTIC_OPTIMIZER=distributed trains with
hvd.DistributedOptimizer (its gradient sets formed again with each world) instead of an allreduce of
the gradient in the loop."""
import json
import os
import signal
import subprocess
import time

import numpy as np
import torch

import conflux
import conflux.horovod.torch as hvd

EPOCHS, BATCHES, GLOBAL, DIM, LR = 3, 6, 12, 4, 0.05


def batch(epoch, b):
    g = np.random.default_rng(1000 * epoch + b)
    x = g.standard_normal((GLOBAL, DIM))
    y = x @ np.arange(1, DIM + 1) + 0.1 * g.standard_normal(GLOBAL)
    return torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)


hvd.init()
model = torch.nn.Linear(DIM, 1, bias=False).double()
with torch.no_grad():
    model.weight.zero_()
optimizer = torch.optim.SGD(model.parameters(), lr=LR)
distributed = os.environ.get("ELASTIC_OPTIMIZER") == "distributed"
if distributed:
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
sizes = []
reset_times = []
trained_times = []  # the first step after each reset: training again
state.register_reset_callbacks([lambda: (sizes.append(hvd.size()), reset_times.append(time.time()))])
newcomer = conflux.member_id() >= int(os.environ["HOROVOD_SIZE"])


def mark_time(suffix):
    if os.environ.get("ELASTIC_OUT"):
        with open(os.environ["ELASTIC_OUT"] + suffix, "w") as f:
            f.write(repr(time.time()))
kill = os.environ.get("ELASTIC_KILL", "").split(":")
add = os.environ.get("ELASTIC_ADD_HOST", "").split(":", 1)


def maybe_fail(epoch, b):
    if len(kill) == 4 and os.environ["HOROVOD_HOSTNAME"] == kill[0] and \
            (epoch, b) == (int(kill[2]), int(kill[3])) and conflux.membership_round() == 1:
        if kill[1] == "silent":
            if os.environ["HOROVOD_LOCAL_RANK"] == "0":
                mark_time(".lost")  # when it failed, for the test's recovery time
                subprocess.run([os.environ["CFXHOSTS_AGENT"], "--link", kill[0], "down"], check=True)
            return
        if kill[1] == "raise_one" and os.environ["HOROVOD_LOCAL_RANK"] != "1":
            return  # one worker of the host fails; the driver stops the host's others
        mark_time(".lost")
        if kill[1] == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("injected failure on host %s" % kill[0])


def wait_for_newcomer():
    """Test pacing: the newcomer's start (Python, torch) takes longer than this whole training, so
    the ranks wait, agreeing every 0.2 s, until it said hello; it then joins at the next commit."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        seen = hvd.allreduce(torch.tensor([conflux.membership_pending()]), op=hvd.Max,
                             name="newcomer_seen")
        if int(seen.item()) > 0:
            return
        time.sleep(0.2)


@hvd.elastic.run
def train(state):
    global newcomer
    for state.epoch in range(state.epoch, EPOCHS):
        while state.batch < BATCHES:  # a commit records the next batch to run
            b = state.batch
            maybe_fail(state.epoch, b)
            if len(add) == 2 and hvd.rank() == 0 and (state.epoch, b) == (1, 0) and hvd.size() < 3:
                mark_time(".added")
                with open(add[0], "a") as f:
                    f.write(add[1] + "\n")
            if len(add) == 2 and (state.epoch, b) == (1, 1) and hvd.size() < 3:
                wait_for_newcomer()
            x, y = batch(state.epoch, b)
            mine = slice(hvd.rank(), None, hvd.size())
            optimizer.zero_grad()
            loss = ((model(x[mine]).squeeze(1) - y[mine]) ** 2).mean()
            loss.backward()
            if not distributed:
                hvd.allreduce_(model.weight.grad, op=hvd.Average, name="grad")
            optimizer.step()
            if len(trained_times) < len(reset_times):
                trained_times.append(time.time())
            if newcomer:
                mark_time(".joined")
                newcomer = False
            state.batch = b + 1
            if state.batch % 2 == 0:
                state.commit()
        state.batch = 0


train(state)
if hvd.rank() == 0 and os.environ.get("ELASTIC_OUT"):
    with open(os.environ["ELASTIC_OUT"], "w") as f:
        json.dump({"weight": model.weight.detach().flatten().tolist(), "size": hvd.size(),
                   "sizes": sizes, "reset_times": reset_times, "trained_times": trained_times}, f)
hvd.shutdown()

"""Lightning's Trainer and Fabric, and Hugging Face Accelerate, training with DDP on the backend
"conflux": a few SGD steps (with momentum, so every step's gradient counts) of a small model whose
parameters start elsewhere on every rank but 0 (DDP's broadcast must make them rank 0's), fed by
each trainer's own distributed sampler. The parameters must be equal on every rank and equal a
local model trained in the test on each step's batches of all the ranks concatenated (the
samplers give the ranks disjoint rows whose union is the next chunk of the data, in the Trainer's
shuffled order or as it is, per step).

Each trainer makes its own process group: the Trainer through the cluster environment Lightning
finds for the launcher (torchrun's, mpirun's) or, where it has none (cfxrun --transport gloo),
conflux.lightning.ConfluxEnvironment; Fabric through ConfluxEnvironment under every launcher;
Accelerate on the group conflux.accelerate.init_process_group() makes before the Accelerator.
"""
import os

import lightning as L
import pytest
import lightning.fabric.strategies as fabric_strategies
import lightning.pytorch.strategies as trainer_strategies
import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import conflux.accelerate
from conflux.lightning import ConfluxEnvironment
from conftest import launcher_rank, launcher_size

IN, HIDDEN, OUT = 6, 8, 3
BATCH = 4          # rows per rank and step
STEPS = 3
LR, MOMENTUM = 0.1, 0.9
EXACT = dict(rtol=1e-5, atol=1e-6)
RANK, SIZE = launcher_rank(), launcher_size()
# The environment Lightning finds itself: torchrun's (it sets TORCHELASTIC_RUN_ID) or mpirun's
# (cfxrun's default transport); none under cfxrun --transport gloo.
LIGHTNINGS_OWN = ("TorchElasticEnvironment" if "TORCHELASTIC_RUN_ID" in os.environ else
                  "MPIEnvironment" if "OMPI_COMM_WORLD_SIZE" in os.environ else None)


def dataset():
    g = torch.Generator().manual_seed(7)
    rows = STEPS * SIZE * BATCH
    return torch.randn(rows, IN, generator=g), torch.randn(rows, OUT, generator=g)


def loader():
    """The whole data set in order: each trainer shards it over the ranks itself."""
    return DataLoader(TensorDataset(*dataset()), batch_size=BATCH)


def make_net(rank):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(),
                              torch.nn.Linear(HIDDEN, OUT))
    if rank != 0:
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.5 * rank)
    return net


def optimizer(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def loss_fn(net, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(net(x), y)


def flat(net):
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def reference(order=None):
    """The local model: each step on the SIZE * BATCH rows all ranks took at that step, the next
    chunk of the data set in `order` (default: as it is)."""
    x, y = dataset()
    if order is not None:
        x, y = x[order], y[order]
    net = make_net(0)
    opt = optimizer(net.parameters())
    rows = SIZE * BATCH
    for step in range(STEPS):
        chunk = slice(step * rows, (step + 1) * rows)
        opt.zero_grad()
        loss_fn(net, (x[chunk], y[chunk])).backward()
        opt.step()
    return flat(net)


def check(net, what, order=None):
    """Every rank's parameters (gathered over the group they trained on, before any assertion, so
    that no rank is left waiting) equal this rank's, and the reference's (reference(order))."""
    assert dist.is_initialized() and dist.get_backend() == "conflux", \
        "%s: the default group's backend is %s" % (what, dist.get_backend())
    mine = flat(net)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    for rank, theirs in enumerate(everyone):
        assert torch.equal(theirs, mine), "%s: rank %d's parameters differ from rank %d's" % (
            what, rank, dist.get_rank())
    start = flat(make_net(0))
    assert not torch.allclose(mine, start), "%s: the parameters did not move" % what
    torch.testing.assert_close(mine, reference(order), **EXACT,
                               msg=lambda m: "%s against the local reference: %s" % (what, m))


def train(model, opt, data, backward, what):
    """A loop over the trainer's sharded loader: one step per batch, `backward` the trainer's."""
    steps = 0
    for batch in data:
        opt.zero_grad()
        backward(loss_fn(model, batch))
        opt.step()
        steps += 1
    assert steps == STEPS, "%s's sampler gave this rank %d batches, not %d" % (what, steps, STEPS)


def quiet_trainer_args():
    return dict(enable_progress_bar=False, logger=False, enable_checkpointing=False,
                enable_model_summary=False)


def environment(own):
    """(Lightning's plugins, the name of the cluster environment it must then use): its own when
    `own` and it has one for this launcher, else Conflux's."""
    if own and LIGHTNINGS_OWN:
        return [], LIGHTNINGS_OWN
    return [ConfluxEnvironment()], "ConfluxEnvironment"


def test_trainer():
    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = make_net(RANK)

        def training_step(self, batch, batch_idx):
            wrappers.add(type(self.trainer.strategy.model))
            return loss_fn(self.net, batch)

        def configure_optimizers(self):
            return optimizer(self.parameters())

    wrappers = set()
    module = Regression()
    plugins, expected = environment(own=True)
    trainer = L.Trainer(plugins=plugins,
                        strategy=trainer_strategies.DDPStrategy(process_group_backend="conflux"),
                        accelerator="cpu", devices=SIZE, num_nodes=1, max_steps=STEPS,
                        **quiet_trainer_args())
    trainer.fit(module, train_dataloaders=loader())
    assert type(trainer.strategy.cluster_environment).__name__ == expected
    assert wrappers == {DDP}, "the Trainer trained %s, not DDP" % wrappers
    assert (trainer.world_size, trainer.global_rank, trainer.global_step) == (SIZE, RANK, STEPS)
    # The Trainer shuffles the training data: torch's DistributedSampler, seed 0 (no
    # seed_everything), epoch 0; rank r takes every SIZE-th row of one permutation from r on.
    order = list(DistributedSampler(dataset()[0], num_replicas=1, rank=0, shuffle=True, seed=0))
    check(module.net, "Trainer", order)


def test_fabric():
    plugins, expected = environment(own=False)
    fabric = L.Fabric(plugins=plugins,
                      strategy=fabric_strategies.DDPStrategy(process_group_backend="conflux"),
                      accelerator="cpu", devices=SIZE, num_nodes=1)
    fabric.launch()
    assert type(fabric.strategy.cluster_environment).__name__ == expected
    net = make_net(fabric.global_rank)
    model, opt = fabric.setup(net, optimizer(net.parameters()))
    data = fabric.setup_dataloaders(loader())
    assert any(isinstance(m, DDP) for m in model.modules()), model
    train(model, opt, data, fabric.backward, "Fabric")
    check(net, "Fabric")


def test_accelerate():
    # The group made before the Accelerator: Accelerate on the CPU makes one only on gloo or MPI.
    conflux.accelerate.init_process_group()
    accelerator = Accelerator(cpu=True)
    assert accelerator.distributed_type == DistributedType.MULTI_CPU, accelerator.distributed_type
    assert (accelerator.num_processes, accelerator.process_index) == (SIZE, RANK)
    net = make_net(accelerator.process_index)
    model, opt, data = accelerator.prepare(net, optimizer(net.parameters()), loader())
    assert isinstance(model, DDP), type(model)
    assert dist.get_backend(model.process_group) == "conflux"
    train(model, opt, data, accelerator.backward, "Accelerate")
    check(net, "Accelerate")


def test_conflux_environment_is_the_launchers():
    """ConfluxEnvironment's view is the launcher's; a rank or size Lightning computed otherwise
    (devices or num_nodes not as the job was started) is refused naming both."""
    env = ConfluxEnvironment()
    assert (env.world_size(), env.global_rank(), env.node_rank()) == (SIZE, RANK, 0)
    assert env.local_rank() == RANK and env.creates_processes_externally and env.detect()
    env.set_global_rank(RANK)
    env.set_world_size(SIZE)
    with pytest.raises(ValueError, match=r"global rank %d .* made it %d" % (RANK + 1, RANK)):
        env.set_global_rank(RANK + 1)
    with pytest.raises(ValueError, match=r"world size %d .* made it %d" % (2 * SIZE, SIZE)):
        env.set_world_size(2 * SIZE)

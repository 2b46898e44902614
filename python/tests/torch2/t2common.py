"""The model, the data and the local reference the torch2 tests share.

Each rank's batch is a function of (seed, step, micro-batch, rank) only, so every rank can make
every other rank's batch. The reference is a local model, started from the same parameters,
trained on every rank's batch concatenated: the loss of rank r's batch is a mean over its rows,
and data parallelism averages the ranks' gradients, so the reference loss is the average over
ranks of each rank's loss (the mean over the concatenated batch, as the batches are of one size).
"""
import torch

IN, HIDDEN, MID, OUT = 6, 10, 7, 3   # 10, 7, 3 rows: uneven shards at 2 and 3 ranks
BATCH = 5
LR = 0.1


class MLP(torch.nn.Module):
    """Three linear layers (171 parameters), a second head that only some ranks use on some
    steps (find_unused_parameters), and a buffer (DDP broadcasts it at construction)."""

    def __init__(self, extra_head=False, never_used=False):
        super().__init__()
        self.fc1 = torch.nn.Linear(IN, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, MID)
        self.fc3 = torch.nn.Linear(MID, OUT)
        self.extra = torch.nn.Linear(MID, OUT) if extra_head else None
        # a parameter no forward ever uses (static_graph tolerates it)
        self.unused = torch.nn.Linear(2, 2) if never_used else None
        self.register_buffer("scale", torch.ones(1))

    def forward(self, x, use_extra=False):
        h = torch.tanh(self.fc1(x * self.scale))
        h = torch.tanh(self.fc2(h))
        y = self.fc3(h)
        if use_extra:
            y = y + self.extra(h)
        return y


def make_model(seed=0, **kwargs):
    torch.manual_seed(seed)
    return MLP(**kwargs)


def batch(rank, step, micro=0, seed=0):
    g = torch.Generator().manual_seed(100_000 * seed + 1000 * step + 10 * micro + rank)
    return torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)


def loss_of(model, rank, step, micro=0, seed=0, use_extra=False):
    x, y = batch(rank, step, micro, seed)
    out = model(x, use_extra) if use_extra else model(x)
    return torch.nn.functional.mse_loss(out, y)


def reference_step(ref, opt, size, step, micros=1, seed=0, uses_extra=None, divide=None):
    """One step of the local model on every rank's batches: the loss summed over ranks and
    micro-batches and divided by `divide` (default: the number of ranks, DDP's average)."""
    opt.zero_grad()
    total = sum(loss_of(ref, r, step, m, seed, bool(uses_extra and uses_extra(r, step)))
                for r in range(size) for m in range(micros))
    (total / (size if divide is None else divide)).backward()
    opt.step()


def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_params(params, ref, start, rtol, atol, what, moved_factor=10.0):
    """`params` (name -> tensor) equal the reference model's within the tolerances, and the
    training moved the reference by much more than the tolerance (else the check says nothing)."""
    names = list(params)
    ref_params = dict(ref.named_parameters())
    assert set(names) <= set(ref_params), (names, list(ref_params))
    for n in names:
        torch.testing.assert_close(params[n].detach(), ref_params[n].detach(), rtol=rtol, atol=atol,
                                   msg=lambda m, n=n: "%s: parameter %s: %s" % (what, n, m))
    moved = max(float((ref_params[n].detach() - start[n]).abs().max()) for n in names)
    assert moved > moved_factor * atol, (
        "%s: the reference moved only %g, not enough to tell a wrong result from rounding (atol %g)"
        % (what, moved, atol))

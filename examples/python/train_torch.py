#!/usr/bin/env python3
"""Data-parallel PyTorch training with Conflux: the project's main demo.

    tools/cfxrun -np 2 /usr/bin/python3 examples/python/train_torch.py      # in-tree:
    PYTHONPATH=build/python  (cfxrun / the README's command set it)

A small MLP learns a synthetic classification task (inputs from a fixed seed, labels from a fixed
random "teacher" network). Every rank trains on its own shard; conflux.torch.DistributedOptimizer
averages the gradients through a gradient set: every .grad is a view into the set's shared
storage, backward hooks mark each gradient ready as backward produces it (its bucket goes out when
complete) and step() waits for the set. Rank 0 prints the loss and accuracy per epoch. At the end every rank's parameters
are gathered and compared bitwise: the script prints PASS or FAIL and exits non-zero on failure.
"""
import argparse
import sys
import time

import torch
import torch.nn.functional as F

import conflux.torch as cfx

FEATURES, CLASSES = 20, 4


def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    w1 = torch.randn(FEATURES, 32, generator=g)
    w2 = torch.randn(32, CLASSES, generator=g)
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return x, y


def make_model():
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, CLASSES))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8192, help="size of the whole data set")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by the size")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--fp16-allreduce", action="store_true", help="Compression.fp16")
    parser.add_argument("--gradient-storage", choices=["conflux", "framework"], default="conflux",
                        help="conflux: .grad views into the gradient set (default); framework: "
                             "torch's own gradient memory, one allreduce per gradient")
    parser.add_argument("--corrupt-rank", type=int, default=-1, metavar="R",
                        help="testing the check: nudge one parameter on rank R before comparing")
    args = parser.parse_args()

    cfx.init()
    rank, size = cfx.rank(), cfx.size()
    torch.set_num_threads(1)  # ranks share the machine's cores
    torch.manual_seed(args.seed + rank)  # a different init per rank: broadcast_parameters fixes it

    x, y = make_dataset(args.samples, args.seed)
    shard = slice(rank, None, size)  # each rank its own shard
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[shard], y[shard]),
                                         batch_size=args.batch_size, shuffle=True,
                                         generator=torch.Generator().manual_seed(args.seed + rank))

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)
    cfx.broadcast_parameters(model.state_dict(), root_rank=0)
    cfx.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = cfx.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=cfx.Compression.fp16 if args.fp16_allreduce else cfx.Compression.none,
        gradient_storage=args.gradient_storage)

    if rank == 0:
        print("conflux %s: %d ranks, %d samples (%d per rank), %d epochs, gradient storage %s"
              % (cfx.version(), size, args.samples, len(loader.dataset), args.epochs,
                 args.gradient_storage), flush=True)
    losses = []
    start = time.time()
    for epoch in range(args.epochs):
        model.train()
        total, batches = 0.0, 0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += loss.item()
            batches += 1
        model.eval()
        with torch.no_grad():
            correct = (model(x[shard]).argmax(1) == y[shard]).float().mean()
        # Metrics averaged over all ranks.
        metrics = cfx.allreduce(torch.tensor([total / batches, correct.item()], dtype=torch.float64),
                                name="metrics")
        losses.append(metrics[0].item())
        if rank == 0:
            print("epoch %2d  loss %.4f  accuracy %.3f" % (epoch + 1, metrics[0], metrics[1]),
                  flush=True)
    elapsed = time.time() - start

    if rank == args.corrupt_rank:
        with torch.no_grad():
            next(model.parameters()).view(-1)[0] += 1e-6
    # Every rank must hold bitwise identical parameters.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = cfx.allgather(flat.unsqueeze(0), name="final_params")
    differing = [r for r in range(size) if not torch.equal(every[r], every[0])]
    falling = len(losses) < 2 or losses[-1] < losses[0]
    ok = not differing and falling
    if rank == 0:
        if ok:
            print("PASS: parameters identical on all %d ranks (%d values); loss %.4f -> %.4f in "
                  "%.1f s" % (size, flat.numel(), losses[0], losses[-1], elapsed), flush=True)
        else:
            why = []
            if differing:
                why.append("ranks %s hold parameters different from rank 0" % differing)
            if not falling:
                why.append("loss did not fall (%.4f -> %.4f)" % (losses[0], losses[-1]))
            print("FAIL: " + "; ".join(why), flush=True)
    cfx.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

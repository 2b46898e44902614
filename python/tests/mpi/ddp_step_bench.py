"""DDP step on the backend "conflux" beside DDP on "gloo", in one job (not a test: a measurement).

    mpirun -np 2 python3 ddp_step_bench.py [--shapes bench/workloads/resnet50.tsv] [--rounds 5]
        [--steps 5] [--resnet18]

A model with the parameters of --shapes (ResNet-50's 161 tensors, 25.6 M float32 values) whose
loss touches every parameter, so backward makes every gradient; --resnet18 also times
torchvision's ResNet-18 (batch 8, 3x112x112) where torchvision is installed. Per round each
variant runs --steps steps (forward, backward, SGD step): DDP on the conflux default group, DDP
on a gloo group of the same ranks, the model alone (local), and DDP with a hook that
communicates nothing (DDP's own bucket copies), in an order that rotates from round to round. Rank 0 prints the medians and the
minimums over the rounds of the per-step time, step - local (the communication that the step
does not hide, with DDP's own copies) and step - DDP without communication (the backend's part).
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import conflux.torch  # noqa: F401  (registers "conflux")


class Shaped(torch.nn.Module):
    def __init__(self, shapes):
        super().__init__()
        self.params = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(*s) * 0.01) for s in shapes)

    def forward(self, x):
        return sum((p * x).sum() for p in self.params)


def read_shapes(path):
    shapes = []
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            dims = line.split("\t")[1].strip()
            shapes.append(tuple(int(d) for d in dims.split("x")))
    return shapes


def timed(model, make_input, steps):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        model(make_input()).sum().backward()
        opt.step()
    return (time.perf_counter() - start) / steps


def no_communication(state, bucket):
    """A DDP hook that communicates nothing: what DDP itself costs (its bucket copies)."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def compare(label, build, make_input, groups, rounds, steps):
    variants = {"conflux": DDP(build(), process_group=groups["conflux"]),
                "gloo": DDP(build(), process_group=groups["gloo"]), "local": build(),
                "ddp_alone": DDP(build(), process_group=groups["conflux"])}
    variants["ddp_alone"].register_comm_hook(None, no_communication)
    times = {k: [] for k in variants}
    for name, model in variants.items():  # warm-up (bucket rebuild after the first step)
        timed(model, make_input, 2)
    order = list(variants)
    for i in range(rounds):  # each round in another order: no variant always follows the same
        for name in order[i % len(order):] + order[:i % len(order)]:
            dist.barrier(groups["gloo"])
            times[name].append(timed(variants[name], make_input, steps))
    if dist.get_rank() == 0:
        # medians, and minimums (on a loaded machine the least disturbed round)
        for what, pick in (("median", statistics.median), ("min", min)):
            t = {k: pick(v) for k, v in times.items()}
            comm = {k: t[k] - t["local"] for k in ("conflux", "gloo")}
            wire = {k: t[k] - t["ddp_alone"] for k in ("conflux", "gloo")}
            print("%s, %d ranks, %s of %d rounds: step ms: conflux %.1f, gloo %.1f, local %.1f, "
                  "DDP without communication %.1f; step - local: conflux %.1f, gloo %.1f (ratio "
                  "%s); step - DDP without communication: conflux %.1f, gloo %.1f (ratio %s)"
                  % (label, dist.get_world_size(), what, rounds, 1e3 * t["conflux"],
                     1e3 * t["gloo"], 1e3 * t["local"], 1e3 * t["ddp_alone"],
                     1e3 * comm["conflux"], 1e3 * comm["gloo"], ratio(comm),
                     1e3 * wire["conflux"], 1e3 * wire["gloo"], ratio(wire)), flush=True)


def ratio(times):
    return "%.3f" % (times["conflux"] / times["gloo"]) if times["gloo"] > 0 else "n/a"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=os.path.join(here, "..", "..", "..", "bench", "workloads",
                                                     "resnet50.tsv"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--resnet18", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    # Under mpirun/cfxrun without MASTER_ADDR the rendezvous is the engine's (conflux://).
    dist.init_process_group("conflux", init_method=None if "MASTER_ADDR" in os.environ
                            else "conflux://")
    groups = {"conflux": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    shapes = read_shapes(args.shapes)
    compare("ResNet-50 shapes (%d tensors)" % len(shapes), lambda: Shaped(shapes),
            lambda: torch.tensor(1.0), groups, args.rounds, args.steps)
    if args.resnet18:
        try:
            import torchvision
        except ImportError:
            if dist.get_rank() == 0:
                print("ResNet-18: not measured (torchvision is not installed)")
            return
        torch.manual_seed(0)
        data = torch.randn(8, 3, 112, 112)
        compare("ResNet-18 (batch 8, 3x112x112)",
                lambda: torchvision.models.resnet18(num_classes=10),
                lambda: data, groups, args.rounds, args.steps)


if __name__ == "__main__":
    main()

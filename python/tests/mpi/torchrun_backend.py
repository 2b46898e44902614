"""The backend "conflux" under torchrun (CMake: python_torch_backend_torchrun_np2).

torchrun gives torch.distributed its store, RANK and WORLD_SIZE; the engine forms its world from
the launcher. Where the engine formed the same world, the script checks an all_reduce, an
all_gather and two DDP steps against values computed here from each rank's contribution; where
it could not (the engine alone, a world of one), it checks that init_process_group("conflux")
refuses with both views named. Either way the last line says which, PASS or FAIL.
"""
import os
import sys

import torch
import torch.distributed as dist

import conflux
import conflux.torch  # noqa: F401  (registers "conflux")


def fail(message):
    print("FAIL: rank %s: %s" % (os.environ.get("RANK"), message), flush=True)
    sys.exit(1)


def main():
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        dist.init_process_group("conflux")
    except RuntimeError as e:
        if conflux.size() == size:
            fail("refused although the engine formed torch's world: %s" % e)
        want = "rank %d of %d, but the Conflux engine's job says rank %d of %d" % (
            rank, size, conflux.rank(), conflux.size())
        if want not in str(e):
            fail("the refusal does not name both views (%r): %s" % (want, e))
        print("PASS: the engine formed a world of %d under torchrun (torch's: %d); "
              "init_process_group refused naming both: %s" % (conflux.size(), size, e), flush=True)
        return
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    if not torch.all(t == size * (size + 1) / 2):
        fail("all_reduce gave %s" % t.tolist())
    outs = [torch.empty(2) for _ in range(size)]
    dist.all_gather(outs, torch.full((2,), float(rank)))
    if [o[0].item() for o in outs] != [float(r) for r in range(size)]:
        fail("all_gather gave %s" % [o.tolist() for o in outs])
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 2)
    torch.manual_seed(rank)  # DDP's broadcast at construction makes it rank 0's
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    xs = [torch.Generator().manual_seed(r) for r in range(size)]
    batches = [torch.randn(3, 4, generator=g) for g in xs]
    for m, loss in ((model, lambda: model(batches[rank]).square().mean()),
                    (ref, lambda: sum(ref(b).square().mean() for b in batches) / size)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            loss().backward()
            opt.step()
    for p, q in zip(model.module.parameters(), ref.parameters()):
        if not torch.allclose(p, q, rtol=1e-5, atol=1e-6):
            fail("DDP's parameters differ from the local model's: %s vs %s" % (p, q))
    print("PASS: rank %d of %d on the engine under torchrun: all_reduce, all_gather, DDP"
          % (rank, size), flush=True)


if __name__ == "__main__":
    main()

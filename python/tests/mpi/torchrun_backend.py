"""The backend "conflux" under torchrun (CMake: python_torch_backend_torchrun_np2/np3).

torchrun gives torch.distributed its store, RANK and WORLD_SIZE; the engine forms the same world
from torchrun's variables (over Gloo and shared memory, docs/launching.md). The script checks an
all_reduce, an all_gather and two DDP steps against values computed here from each rank's
contribution; the last line says PASS or FAIL. (A world the engine cannot join fails cfx_init,
naming torchrun: tests/rendezvous; a mismatch of views is refused naming both:
test_torch_backend.py.)
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
    dist.init_process_group("conflux")
    if (conflux.rank(), conflux.size()) != (rank, size):
        fail("the engine's world is rank %d of %d, torchrun's rank %d of %d"
             % (conflux.rank(), conflux.size(), rank, size))
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    if not torch.all(t == size * (size + 1) / 2):
        fail("all_reduce gave %s" % t.tolist())
    outs = [torch.empty(2) for _ in range(size)]
    dist.all_gather(outs, torch.full((2,), float(rank)))
    if [o[0].item() for o in outs] != [float(r) for r in range(size)]:
        fail("all_gather gave %s" % [o.tolist() for o in outs])
    # A group of its own (cfx_init_group through torch's store): every rank but 0, members only.
    if rank > 0:
        group = dist.new_group(list(range(1, size)), use_local_synchronization=True)
        t = torch.full((2,), float(rank))
        dist.all_reduce(t, group=group)
        if not torch.all(t == sum(range(1, size))):
            fail("all_reduce on the group of ranks 1..%d gave %s" % (size - 1, t.tolist()))
        dist.destroy_process_group(group)
    dist.barrier()
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
    print("PASS: rank %d of %d on the engine under torchrun: all_reduce, all_gather, a group, DDP"
          % (rank, size), flush=True)


if __name__ == "__main__":
    main()

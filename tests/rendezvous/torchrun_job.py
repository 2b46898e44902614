#!/usr/bin/python3
"""torchrun_job: conflux.torch under torchrun, as a PyTorch user would launch it. Every result is
checked against what each rank contributed (a formula of the rank, so every rank can compute it).
Prints "torchrun_job: rank R of N ok" (or the failures) and exits 0 only when every check passed.

    python3 -m torch.distributed.run --standalone --nproc_per_node=N --redirects 1 --tee 1 \\
        torchrun_job.py N
"""
import os
import socket
import sys

import torch

import conflux.torch as cfx


def main():
    want = int(sys.argv[1])
    cfx.init()
    r, n = cfx.rank(), cfx.size()
    # Where torchrun put this rank, for a driver that checks placement across hosts.
    print(f"torchrun_job: rank {r} on {socket.gethostname()} group {os.environ.get('GROUP_RANK')} "
          f"local {cfx.local_rank()}/{cfx.local_size()}", flush=True)
    failures = []
    if n != want or r != int(os.environ["RANK"]):
        failures.append(f"world rank {r} of {n}; torchrun says {os.environ['RANK']} of {want}")
    x = torch.arange(1000, dtype=torch.float32) * (r + 1)
    got = cfx.allreduce(x, op=cfx.Sum, name="sum")
    expect = torch.arange(1000, dtype=torch.float32) * (n * (n + 1) / 2)
    if not torch.equal(got, expect):
        failures.append(f"sum: {got[:4].tolist()}..., expected {expect[:4].tolist()}...")
    avg = cfx.allreduce(torch.full((7,), float(r), dtype=torch.float64), name="avg")
    if not torch.allclose(avg, torch.full((7,), (n - 1) / 2, dtype=torch.float64)):
        failures.append(f"average: {avg.tolist()}")
    rows = cfx.allgather(torch.full((r + 1, 2), r, dtype=torch.int64), name="gather")
    expect_rows = torch.cat([torch.full((q + 1, 2), q, dtype=torch.int64) for q in range(n)])
    if not torch.equal(rows, expect_rows):
        failures.append(f"allgather: {rows.tolist()}")
    b = cfx.broadcast(torch.tensor([r * 10 + 1, r * 10 + 2]), root_rank=n - 1, name="bcast")
    if b.tolist() != [(n - 1) * 10 + 1, (n - 1) * 10 + 2]:
        failures.append(f"broadcast: {b.tolist()}")
    cfx.shutdown()
    for f in failures:
        print(f"torchrun_job: rank {r}: FAILED {f}", flush=True)
    print(f"torchrun_job: rank {r} of {n} {'FAILED' if failures else 'ok'}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

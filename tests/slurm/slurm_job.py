#!/usr/bin/python3
"""slurm_job: a Conflux job in Python (NumPy arrays) for launchers that give no MPI, as a user runs
it under `srun -N2 -n4 python3 slurm_job.py 4`. Rank r's values are a formula of r, so every rank
computes what the others contributed and checks every result against it. Also checks the world
Conflux joined against the launcher's own variables (SLURM_PROCID/SLURM_NTASKS, or RANK/WORLD_SIZE
under torchrun) and the host split against the ranks' host names (gathered through Conflux and
compared with what each rank reports of itself). Prints "slurm_job: rank R of N ok" (or each
failure) and exits 0 only when every check passed.
"""
import os
import socket
import sys

import numpy as np

import conflux


def launcher_rank():
    for rank, size in (("SLURM_PROCID", "SLURM_NTASKS"), ("RANK", "WORLD_SIZE"),
                       ("CFX_RANK", "CFX_SIZE")):
        if rank in os.environ:
            return int(os.environ[rank]), int(os.environ[size]), rank
    return None, None, "no launcher variables"


def main():
    want = int(sys.argv[1])
    conflux.init()
    r, n = conflux.rank(), conflux.size()
    failures = []
    lr, ln, source = launcher_rank()
    if (r, n) != (lr, ln) or n != want:
        failures.append(f"world rank {r} of {n}; the launcher ({source}) says {lr} of {ln}, "
                        f"the test {want}")
    # Host names, 64 bytes each, gathered: the local split must be the ranks of this host.
    name = socket.gethostname().encode()[:64].ljust(64, b"\0")
    hosts = [bytes(row).rstrip(b"\0").decode()
             for row in conflux.allgather(np.frombuffer(name, dtype=np.uint8).reshape(1, 64).copy(),
                                          name="hosts")]
    mine = [q for q in range(n) if hosts[q] == hosts[r]]
    if (conflux.local_size(), conflux.local_rank()) != (len(mine), mine.index(r)):
        failures.append(f"local rank {conflux.local_rank()} of {conflux.local_size()}; the host "
                        f"names {hosts} give {mine.index(r)} of {len(mine)}")

    # (what, result, expected): every expected value from what each rank q contributed.
    size = 100003   # odd, and above the shared-memory chunk thresholds of small runs
    checks = [
        ("sum.f32", conflux.allreduce(np.arange(size, dtype=np.float32) % 7 * (r + 1),
                                      op=conflux.Sum, name="sum.f32"),
         np.arange(size, dtype=np.float32) % 7 * sum(q + 1 for q in range(n))),
        ("average.f64", conflux.allreduce(np.full(9, 2.0 * r), op=conflux.Average, name="avg"),
         np.full(9, sum(2.0 * q for q in range(n)) / n)),
        ("max.i64", conflux.allreduce(np.array([3 * r - 1, -r], dtype=np.int64), op=conflux.Max,
                                      name="max"),
         np.array([max(3 * q - 1 for q in range(n)), max(-q for q in range(n))])),
        ("allgather.i32", conflux.allgather(np.full((r + 1, 3), r, dtype=np.int32), name="rows"),
         np.concatenate([np.full((q + 1, 3), q, dtype=np.int32) for q in range(n)])),
        ("broadcast.f64", conflux.broadcast(np.array([10.0 * r + 1.5, 10.0 * r + 2.5]),
                                            root_rank=n - 1, name="bcast"),
         np.array([10.0 * (n - 1) + 1.5, 10.0 * (n - 1) + 2.5])),
    ]
    for what, got, want in checks:
        if got.shape != want.shape or not np.array_equal(got, want):
            same_shape = got.shape == want.shape
            wrong = np.flatnonzero(got.ravel() != want.ravel())[:1] if same_shape else []
            failures.append(f"{what}: shape {got.shape}, expected {want.shape}" if not len(wrong)
                            else f"{what}[{wrong[0]}] = {got.ravel()[wrong[0]]}, expected "
                                 f"{want.ravel()[wrong[0]]}")
    conflux.shutdown()
    verdict = "FAILED" if failures else "ok"
    print("".join(f"slurm_job: rank {r}: FAILED {f}\n" for f in failures)
          + f"slurm_job: rank {r} of {n} {verdict} on {hosts[r]}", flush=True)
    return 1 if failures else 0

if __name__ == "__main__":
    sys.exit(main())

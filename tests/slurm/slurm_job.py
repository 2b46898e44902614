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
    for rank, size in (("SLURM_PROCID", "SLURM_NTASKS"), ("RANK", "WORLD_SIZE")):
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

    x = np.arange(100003, dtype=np.float32) % 7 * (r + 1)
    got = conflux.allreduce(x, op=conflux.Sum, name="sum.f32")
    expect = np.arange(100003, dtype=np.float32) % 7 * sum(q + 1 for q in range(n))
    if not np.array_equal(got, expect):
        bad = int(np.flatnonzero(got != expect)[0])
        failures.append(f"sum.f32[{bad}] = {got[bad]}, expected {expect[bad]}")
    avg = conflux.allreduce(np.full(9, float(r) * 2.0), op=conflux.Average, name="avg.f64")
    if not np.allclose(avg, np.full(9, float(n - 1))):
        failures.append(f"average: {avg.tolist()}, expected {float(n - 1)}")
    top = conflux.allreduce(np.array([r * 3 - 1, -r], dtype=np.int64), op=conflux.Max, name="max")
    if top.tolist() != [(n - 1) * 3 - 1, 0]:
        failures.append(f"max: {top.tolist()}, expected {[(n - 1) * 3 - 1, 0]}")
    rows = conflux.allgather(np.full((r + 1, 3), r, dtype=np.int32), name="rows")
    expect_rows = np.concatenate([np.full((q + 1, 3), q, dtype=np.int32) for q in range(n)])
    if not np.array_equal(rows, expect_rows):
        failures.append(f"allgather: {rows.tolist()}")
    b = conflux.broadcast(np.array([r * 10 + 1.5, r * 10 + 2.5]), root_rank=n - 1, name="bcast")
    if b.tolist() != [(n - 1) * 10 + 1.5, (n - 1) * 10 + 2.5]:
        failures.append(f"broadcast: {b.tolist()}")
    conflux.shutdown()
    for f in failures:
        print(f"slurm_job: rank {r}: FAILED {f}", flush=True)
    print(f"slurm_job: rank {r} of {n} {'FAILED' if failures else 'ok'} on {hosts[r]}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

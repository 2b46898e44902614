"""CFX_RENDEZVOUS_SCOPE: two processes (CFX_RANK 0 and 1 of 2, a file store) form worlds under a
scope a launcher names for each run. Rank 0 also tries to form a world in a run rank 1 never
joins (a late task of a failed run): that join fails at its deadline, and in the next run the two
still meet, each in "<scope>/world1" (without the scope rank 0 would be one world ahead and wait
for a key rank 1 never sets). Each world allreduces the ranks' contributions, checked against
their sum."""
import os
import subprocess
import sys

import pytest


PROGRAM = r"""
import os, sys
import numpy as np
import conflux
rank = int(os.environ["CFX_RANK"])

def world(scope):
    os.environ["CFX_RENDEZVOUS_SCOPE"] = scope
    conflux.init()
    got = conflux.allreduce(np.full(3, rank + 1.0, np.float32), op=conflux.Sum, name=scope)
    print("SUM", scope, got.tolist(), flush=True)
    conflux.shutdown()

world("run1")
if rank == 0:  # a world of run2 that rank 1 never joins
    os.environ["CFX_RENDEZVOUS_SCOPE"] = "run2"
    os.environ["CFX_RENDEZVOUS_TIMEOUT_S"] = "1"
    try:
        conflux.init()
    except conflux.ConfluxError as e:
        print("ALONE", type(e).__name__, flush=True)
    else:
        print("JOINED run2 of size", conflux.size(), flush=True)
        sys.exit(1)
    os.environ["CFX_RENDEZVOUS_TIMEOUT_S"] = "30"
world("run3")
"""


def test_worlds_of_a_scope_are_counted_from_one(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CFX_", "OMPI_", "PMIX_", "SLURM_", "HOROVOD_"))}
    env.update({"CFX_SIZE": "2", "CFX_RENDEZVOUS_DIR": str(store), "CFX_TRANSPORT": "gloo",
                "CFX_RENDEZVOUS_TIMEOUT_S": "30"})
    procs = [subprocess.Popen([sys.executable, "-c", PROGRAM], env=dict(env, CFX_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    if any("has no gloo transport" in out for out in outs):
        pytest.skip("this build has no Gloo transport, the one that meets through a store")
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, "rank %d:\n%s" % (r, out)
    want = [float(sum(r + 1 for r in range(2)))] * 3
    for r, out in enumerate(outs):
        for scope in ("run1", "run3"):
            assert "SUM %s %s" % (scope, want) in out, "rank %d:\n%s" % (r, out)
    assert "ALONE" in outs[0], outs[0]
    names = os.listdir(store)
    for space in ("run1%2Fworld1%2F", "run2%2Fworld1%2F", "run3%2Fworld1%2F"):
        assert any(n.startswith(space) for n in names), (space, sorted(names))
    assert not any(n.startswith("world") for n in names), sorted(names)

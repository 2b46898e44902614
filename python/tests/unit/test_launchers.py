"""Never a silent world of one: conflux.init() in a process whose environment shows torchrun's
world of two must join it or raise naming torchrun (each case in a fresh interpreter, with the
variables torchrun would set put there by hand)."""
import os
import subprocess
import sys

import pytest

LAUNCHER_PREFIXES = ("CFX_", "OMPI_", "PMIX_", "SLURM_", "HOROVOD_")
TORCHRUN_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                  "MASTER_PORT", "GROUP_RANK", "TORCHELASTIC_RUN_ID")

PROGRAM = """
import conflux
try:
    conflux.init()
except conflux.ConfluxError as e:
    print("RAISED", type(e).__name__, e)
else:
    print("JOINED size", conflux.size())
"""


def run_with(extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(LAUNCHER_PREFIXES) and k not in TORCHRUN_NAMES}
    env.update(extra)
    res = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True,
                         timeout=120)
    return res.stdout + res.stderr


def test_torchrun_without_master_addr_raises_naming_torchrun():
    out = run_with({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert "RAISED ConfigError" in out, out
    assert "torchrun" in out and "MASTER_ADDR" in out, out
    assert "JOINED" not in out


def test_torchrun_whose_peer_never_comes_raises_naming_torchrun():
    # Rank 1 of 2; nothing serves the store (MASTER_PORT + 1 = 2): a Gloo build gives up at the
    # rendezvous deadline, a build without Gloo refuses at once. Either way: never size 1.
    out = run_with({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
                    "CFX_RENDEZVOUS_TIMEOUT_S": "1"})
    assert "RAISED" in out and "torchrun" in out and "rank 1 of 2" in out, out
    assert "JOINED" not in out


def test_mpi_asked_for_under_torchrun_raises():
    import conflux
    if not conflux.features()["mpi"]:
        pytest.skip("this build has no MPI transport: the case needs one")
    out = run_with({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": "29500", "CFX_TRANSPORT": "mpi"})
    assert "RAISED ConfigError" in out and "torchrun" in out and "mpirun" in out, out

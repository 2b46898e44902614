"""The output checks of the launcher drivers (tests/slurm/slurmtest,
tests/rendezvous/torchrun_hosts) on made-up output: a correct run passes, and each kind of wrong
run is caught and named. Needs no root, Slurm or torch: the drivers run only their checks here."""
import importlib.machinery
import importlib.util
import os

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(name, path):
    loader = importlib.machinery.SourceFileLoader(name, os.path.join(TESTS, path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    loader.exec_module(module)
    return module


slurmtest = load("slurmtest", "slurm/slurmtest")
torchrun_hosts = load("torchrun_hosts", "rendezvous/torchrun_hosts")


def slurm_output(transport="gloo", hosts="aabb", nodes=None, ok=range(4), world=range(4)):
    """What a correct 2x2 job prints under srun (gloo) or salloc + mpirun (mpi)."""
    lines = [f"slurmtest: rank {r} on {h}" + (f" node {(nodes or hosts)[r]}" if transport == "gloo"
                                                else "") for r, h in enumerate(hosts)]
    lines += [f"[t conflux rank {r} context info] rank {r} of 4 over {transport} (local {r % 2}/2, "
              f"cross {r // 2}/2); fusion 1 B, allreduce path shared memory + "
              f"{transport.upper()} across hosts" for r in range(4)]
    return lines + world_and_results(4, world, ok)


def world_and_results(n, world, ok):
    return ([f"[t conflux rank {r} world info] rank {r} of {n} from Slurm (srun); meeting through "
             "the TCP store at a:20031 (from ...)" for r in world]
            + [f"gloo_job: rank {r} of {n} ok" for r in ok])


def unequal_output(said_so=True):
    """A correct srun -N2 -n3: ranks 0, 1 on a, 2 on b; Gloo carries everything."""
    split = [(0, 2, 0, 2), (1, 2, 0, 1), (0, 1, 1, 2)]   # local, local size, cross, cross size
    lines = [f"slurmtest: rank {r} on {h} node {h}" for r, h in enumerate("aab")]
    lines += [f"[t conflux rank {r} context info] rank {r} of 3 over gloo (local {lr}/{ls}, cross "
              f"{cr}/{cs}); allreduce path gloo" for r, (lr, ls, cr, cs) in enumerate(split)]
    if said_so:
        lines.append("[t conflux rank 0 context warn] the hosts have different numbers of ranks")
    return lines + world_and_results(3, range(3), range(3))


SRUN = {"launch": "srun", "tasks": 4}
SALLOC = {"launch": "salloc-mpirun", "tasks": 4}


def test_slurm_correct_runs_pass():
    assert slurmtest.check(slurm_output("gloo"), SRUN) == []
    assert slurmtest.check(slurm_output("mpi"), SALLOC) == []
    assert slurmtest.check(unequal_output(), dict(SRUN, tasks=3)) == []


@pytest.mark.parametrize("output, opts, problem", [
    (slurm_output(hosts="abab"), SRUN, "rank 1 ran on b, not on a"),
    (slurm_output(nodes="aaba"), SRUN, "rank 3 ran on b, but Slurm launched it on node a"),
    (slurm_output(ok=[0, 1, 3]), SRUN, "no 'rank R of 4 ok' from rank(s) [2]"),
    (slurm_output(world=[1, 2, 3]), SRUN, "from rank(s) [0]"),
    (slurm_output("gloo"), SALLOC, "rank 0: transport gloo, expected mpi"),
    (slurm_output("mpi"), SRUN, "rank 2: transport mpi, expected gloo"),
    (unequal_output(said_so=False), dict(SRUN, tasks=3), "hosts have different numbers of ranks"),
    (slurm_output(), dict(SRUN, tasks=3), "a context line names rank 3 of a 3-rank job"),
])
def test_slurm_wrong_runs_fail(output, opts, problem):
    problems = slurmtest.check(output, opts)
    assert any(problem in p for p in problems), problems


def torchrun_output(placed=None, cross=None, ok=range(4), rc=0):
    """Each host's torchrun output of a correct 2x2 run (group 0 on b: the rendezvous' choice)."""
    placed = placed or {0: "b", 1: "b", 2: "a", 3: "a"}
    out = {"a": (rc, []), "b": (0, [])}
    for r, host in placed.items():
        lines = out[host][1]
        lines.append(f"[default{r % 2}]:torchrun_job: rank {r} on {host} group {r // 2} "
                     f"local {r % 2}/2")
        lines.append(f"[t conflux rank {r} context info] rank {r} of 4 over gloo (local {r % 2}/2, "
                     f"cross {(cross or {}).get(r, r // 2)}/2); allreduce path ...")
        if r in ok:
            lines.append(f"[default{r % 2}]:torchrun_job: rank {r} of 4 ok")
    return out


TORCHRUN = {"nproc_per_node": 2}


def test_torchrun_correct_run_passes():
    assert torchrun_hosts.check(torchrun_output(), TORCHRUN) == []


@pytest.mark.parametrize("output, problem", [
    (torchrun_output(placed={0: "b", 1: "a", 2: "b", 3: "a"}), "ran ranks [1, 3], not one group's"),
    (torchrun_output(cross={3: 0}), "rank 3's engine context"),
    (torchrun_output(ok=[0, 1, 2]), "no 'rank R of 4 ok' from rank(s) [3]"),
    (torchrun_output(rc=1), "the torchrun on a failed (exit status 1)"),
])
def test_torchrun_wrong_runs_fail(output, problem):
    problems = torchrun_hosts.check(output, TORCHRUN)
    assert any(problem in p for p in problems), problems


def test_slurm_skips_naming_what_is_missing(monkeypatch, tmp_path, capsys):
    """No Slurm programs on the path: exit 77 naming each missing one and its package."""
    monkeypatch.setattr(slurmtest, "LOGIN_PATH", str(tmp_path))
    monkeypatch.delenv("CFXHOSTS_AGENT", raising=False)
    assert slurmtest.main(["--launch", "srun", "--", "/bin/true"]) == slurmtest.SKIP
    out = capsys.readouterr().out
    assert "SKIP: not installed: munged (munge), mungekey (munge), slurmctld (slurmctld)" in out

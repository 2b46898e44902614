"""Failures across pretend hosts: a host whose ranks die (or that dies whole) while a job runs, and
hosts that cfxrun cannot start ranks on. Every survivor must be gone within 30 s (no hang), and
cfxrun's last line must name the host and what happened."""

import os
import re
import signal

import pytest

from conftest import CFXRUN, Running, alive, harness, wait_gone

HOST_LOSS = os.environ.get("CFX_HOST_LOSS")
needs_host_loss = pytest.mark.skipif(not HOST_LOSS, reason="CFX_HOST_LOSS (the cfx_host_loss "
                                     "program; ctest sets it) is not set")
SURVIVORS_DEADLINE_S = 30


def last_cfxrun_line(output):
    lines = [line for line in output.splitlines() if line.startswith("cfxrun: ")]
    assert lines, f"cfxrun said nothing:\n{output}"
    return lines[-1]


def lose_host_b(which, *mode):
    """Runs cfx_host_loss on a:2,b:2 (`mode`: "gradset" for gradient-set steps), kills `which` of
    host b's processes (the ranks, or every process there) once every rank has completed a checked
    step, and returns what happened."""
    run = Running(command=[CFXRUN, "--timeout", "150", "-np", "4", "-H", "a:2,b:2", "--",
                           HOST_LOSS, "120", *mode])
    run.wait_for(r"^host_loss: rank \d of 4 on [ab] ready$", count=4)
    comm = os.path.basename(HOST_LOSS)[:15]
    survivors = run.pids_on("a", comm)
    victims = run.pids_on("b", comm if which == "ranks" else None)
    assert len(survivors) == 2 and len(victims) >= 2, run.output()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    left = wait_gone(survivors, SURVIVORS_DEADLINE_S)
    status = run.wait(60)
    assert left == [], (f"survivors {left} still running {SURVIVORS_DEADLINE_S} s after host b's "
                        f"{which} were killed:\n{run.output()}")
    assert status != 0, run.output()
    # Nobody computed a wrong sum before the loss was noticed.
    assert not re.search(r"host_loss: .* element \d+ is", run.output()), run.output()
    return run.output()


@needs_host_loss
def test_host_ranks_die():
    out = lose_host_b("ranks")
    line = last_cfxrun_line(out)
    assert re.fullmatch(r"cfxrun: job failed with exit status \d+: rank [23] on b died of signal 9 "
                        r"\(Killed\)", line), out


@needs_host_loss
def test_host_ranks_die_during_gradient_set_steps():
    # The survivors are inside cfx_gradset_wait (or between steps) when the peers go.
    out = lose_host_b("ranks", "gradset")
    line = last_cfxrun_line(out)
    assert re.fullmatch(r"cfxrun: job failed with exit status \d+: rank [23] on b died of signal 9 "
                        r"\(Killed\)", line), out


@needs_host_loss
def test_whole_host_dies():
    out = lose_host_b("every process")
    line = last_cfxrun_line(out)
    # Whichever mpirun notices first: the daemon's connection, or the agent's session, ending.
    assert (line.endswith("lost contact with host b (mpirun's daemon there)") or
            line.endswith("mpirun could not start, or lost, its daemon on host b: the launch "
                          "agent's session (ssh) to it ended")), out


def test_unknown_host():
    r = harness(command=[CFXRUN, "-np", "2", "-H", "a:1,nohost:1", "--", "hostname"])
    assert r.returncode != 0
    assert last_cfxrun_line(r.stdout).endswith(
        "cannot start ranks on host nohost: its name does not resolve (no such host (hosts here: "
        "a b))"), r.stdout


def test_host_cable_pulled():
    # b's daemon starts (the agent does not need the network) but cannot call mpirun back.
    cmd = ['sh', '-c', f'"$CFXHOSTS_AGENT" --link b down && exec {CFXRUN} --timeout 100 -np 2 '
           '-H a:1,b:1 -- hostname']
    r = harness(command=cmd)
    assert r.returncode != 0
    assert last_cfxrun_line(r.stdout).endswith(
        "host b cannot open a TCP connection to host a (is the network between them up, and do "
        "btl_tcp_if_include / oob_tcp_if_include name it?)"), r.stdout


def test_no_such_interface():
    cmd = ["sh", "-c", f"OMPI_MCA_oob_tcp_if_include=eth9 exec {CFXRUN} -np 2 -H a:1,b:1 -- hostname"]
    r = harness(command=cmd)
    assert r.returncode != 0
    assert last_cfxrun_line(r.stdout).endswith(
        "a host has no network interface matching oob_tcp_if_include=eth9"), r.stdout

"""Tests of cfxhosts, the pretend-hosts harness: each host has its own hostname, network, /dev/shm
and /etc/hosts; the link is shaped as asked; the agent behaves like ssh; and nothing is left behind,
whether the command succeeds, fails, is stopped by a signal, or the harness itself is killed. Also
hostrun's checks of placement, local/cross ranks and path, on made-up output."""

import os
import re
import signal
import subprocess

import pytest

from conftest import CFXHOSTS, Running, alive, harness, netns_of, state_dir, wait_gone

# On each host: its name, its network namespace, its cfx0 address, a marker in its /dev/shm, and
# what its /dev/shm then holds (after every host wrote its marker).
PROBE = r'''
for h in a b c; do
  $CFXHOSTS_AGENT $h 'echo "host $(hostname) net $(stat -L -c %i /proc/self/ns/net)" \
      "addr $(ip -o -4 addr show cfx0 | awk "{print \$4}")"; touch /dev/shm/cfxhosts-marker-$(hostname)'
done
for h in a b c; do
  $CFXHOSTS_AGENT $h 'echo "shm $(hostname): $(ls /dev/shm | tr "\n" " ")"; \
      echo "etc-hosts $(hostname): $(grep -v localhost /etc/hosts | tr "\t\n" ": ")"'
done
'''


def test_hosts_are_separate_machines():
    root_net = os.stat("/proc/self/ns/net").st_ino
    r = harness("--hosts", "a,b,c", command=["sh", "-c", PROBE])
    assert r.returncode == 0, r.stdout
    hosts = {h: (int(n), a) for h, n, a in
             re.findall(r"^host (\w+) net (\d+) addr (\S+)$", r.stdout, re.M)}
    assert sorted(hosts) == ["a", "b", "c"], r.stdout
    nets = {n for n, _ in hosts.values()}
    assert len(nets) == 3 and root_net not in nets, r.stdout
    assert {a for _, a in hosts.values()} == {"10.213.0.1/24", "10.213.0.2/24", "10.213.0.3/24"}
    for h in "abc":
        # Each /dev/shm holds its own host's marker only; the machine's holds none of them.
        shm = re.search(rf"^shm {h}: (.*)$", r.stdout, re.M).group(1).split()
        assert [f for f in shm if f.startswith("cfxhosts-marker")] == [f"cfxhosts-marker-{h}"], r.stdout
        names = re.search(rf"^etc-hosts {h}: (.*)$", r.stdout, re.M).group(1)
        for other, (_, addr) in hosts.items():
            assert f"{addr.split('/')[0]}:{other}" in names.split(), r.stdout
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("cfxhosts-marker")]


def test_link_is_shaped_as_asked():
    show = '$CFXHOSTS_AGENT b tc qdisc show dev cfx0; echo "link: $CFXHOSTS_LINK"'
    r = harness("--rate", "200mbit", "--delay", "2ms", command=["sh", "-c", show])
    assert r.returncode == 0, r.stdout
    link = re.search(r"^link: (.*)$", r.stdout, re.M).group(1)
    if link.endswith("(netem)"):
        assert re.search(r"qdisc netem .*delay 2ms.*rate 200Mbit", r.stdout), r.stdout
        assert link == "rate 200mbit, delay 2ms each way (netem)"
    else:  # a kernel without netem: the rate alone, and the harness says so
        assert re.search(r"qdisc tbf .*rate 200Mbit", r.stdout), r.stdout
        assert link == "rate 200mbit (tbf), no added delay (this kernel has no netem)"
        assert "no netem qdisc" in r.stdout


def test_agent_runs_like_ssh():
    cmd = r'''
$CFXHOSTS_AGENT b 'echo "env: $(env | cut -d= -f1 | sort | tr "\n" " ")"; echo "on $(hostname)"'
$CFXHOSTS_AGENT b 'exit 7'; echo "status $?"
$CFXHOSTS_AGENT zz true; echo "status $?"
'''
    env = dict(os.environ, CFX_SECRET_SETTING="1")
    r = harness(command=["sh", "-c", cmd], env=env)
    assert r.returncode == 0, r.stdout
    # A clean login environment: nothing of the caller's leaks (cfxrun must forward what ranks need).
    assert "CFX_SECRET_SETTING" not in re.search(r"^env: (.*)$", r.stdout, re.M).group(1)
    assert "on b" in r.stdout
    assert re.findall(r"^status (\d+)$", r.stdout, re.M) == ["7", "255"], r.stdout
    assert "ssh: Could not resolve hostname zz: no such host (hosts here: a b)" in r.stdout


def test_command_status_and_environment():
    r = harness(command=["sh", "-c", 'echo "$OMPI_MCA_btl_tcp_if_include $OMPI_MCA_plm_rsh_agent"; '
                                     'echo "$(hostname) in $(pwd)"; exit 3'])
    assert r.returncode == 3, r.stdout
    assert re.search(r"^cfx0 /run/cfxhosts/cfxh\d+/agent$", r.stdout, re.M), r.stdout
    assert f"a in {os.getcwd()}" in r.stdout


def _run_until_signal(sig):
    """A run with a process on every host (one ignoring SIGTERM), stopped by `sig`."""
    cmd = r'''
$CFXHOSTS_AGENT b 'trap "" TERM; echo "b pid $$"; exec sleep 300' &
echo "a pid $$"
wait
'''
    run = Running(command=["sh", "-c", cmd])
    run.wait_for(r"^b pid \d+$")
    run.wait_for(r"^a pid \d+$")
    pids = [int(p) for p in re.findall(r"^[ab] pid (\d+)$", run.output(), re.M)]
    nets = netns_of(run.proc.pid)
    assert len(nets) == 3, nets  # a, b and the switch
    run.proc.send_signal(sig)
    return run, pids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_tears_everything_down(sig):
    run, pids = _run_until_signal(sig)
    assert run.wait(60) == 128 + sig
    assert "tearing down" in run.output()
    assert "left behind" not in run.output(), run.output()
    assert alive(pids) == [], run.output()
    assert netns_of(run.proc.pid) == []
    assert not os.path.exists(state_dir(run.proc.pid))


def test_leftovers_of_a_killed_run_are_removed():
    run, pids = _run_until_signal(signal.SIGKILL)
    run.wait(30)
    # Killed before it could tear down: its namespaces and processes are still there...
    assert len(netns_of(run.proc.pid)) == 3
    assert len(alive(pids)) == 2
    # ... until the next run removes them.
    r = harness(command=["true"])
    assert r.returncode == 0, r.stdout
    assert f"removing the leftovers of an earlier run (cfxh{run.proc.pid})" in r.stdout
    assert wait_gone(pids, 10) == []
    assert netns_of(run.proc.pid) == []
    assert not os.path.exists(state_dir(run.proc.pid))


def test_timeout_stops_the_command():
    r = harness("--timeout", "1", command=["sleep", "60"], timeout=50)
    assert r.returncode == 124, r.stdout
    assert "ran past --timeout 1 s" in r.stdout


def test_not_root_skips_with_the_reason():
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", CFXHOSTS,
                        "--", "true"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 77, r.stdout
    assert "cfxhosts: SKIP: needs root" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--hosts", "a"], "--hosts needs 2 to 16 distinct names"),
    (["--hosts", "a,a"], "--hosts needs 2 to 16 distinct names"),
    (["--hosts", "a,B_1"], "bad host name 'B_1'"),
    (["--rate", "fast"], "bad rate 'fast'"),
    (["--delay", "soon"], "bad delay 'soon'"),
])
def test_bad_arguments(args, message):
    r = harness(*args, command=["true"])
    assert r.returncode != 0
    assert message in r.stdout


# ---- hostrun's checks ---------------------------------------------------------------------------

def load_hostrun():
    import importlib.machinery
    import importlib.util
    path = os.path.join(os.path.dirname(CFXHOSTS), "hostrun")
    loader = importlib.machinery.SourceFileLoader("hostrun", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("hostrun", loader))
    loader.exec_module(module)
    return module


def context_line(r, n, local, lsize, cross, csize, path):
    return (f"[2026-12-01T19:35:20.795442Z conflux rank {r} context info] rank {r} of {n} over mpi "
            f"(local {local}/{lsize}, cross {cross}/{csize}); fusion 134217728 B, chunk 1048576 B, "
            f"cache 16384, cycle 1 ms, deterministic 0, allreduce path {path}")


def test_hostrun_placement():
    hostrun = load_hostrun()
    assert hostrun.placement("a:2,b:2") == [("a", 0, 2, 0, 2), ("a", 1, 2, 0, 2),
                                            ("b", 0, 2, 1, 2), ("b", 1, 2, 1, 2)]
    # Unequal hosts: local rank 1 exists on b alone, so its cross communicator has one member.
    assert hostrun.placement("a:1,b:2") == [("a", 0, 1, 0, 2), ("b", 0, 2, 1, 2), ("b", 1, 2, 0, 1)]
    assert hostrun.placement("a,b") == [("a", 0, 1, 0, 2), ("b", 0, 1, 1, 2)]


def test_hostrun_finds_what_is_wrong():
    hostrun = load_hostrun()
    expected = hostrun.placement("a:2,b:2")
    opts = {"path": "hierarchical", "expect": []}
    hier = "shared memory + MPI across hosts"
    good = ([f"hostrun: rank {r} on {h}" for r, (h, *_) in enumerate(expected)] +
            [context_line(r, 4, l, ls, c, cs, hier) for r, (_, l, ls, c, cs) in enumerate(expected)])
    assert hostrun.check(good, expected, opts) == []
    swapped = [line.replace("rank 3 on b", "rank 3 on a") for line in good]
    assert hostrun.check(swapped, expected, opts) == ["rank 3 ran on a, not on b"]
    wrong_split = good[:4] + [context_line(r, 4, 0, 1, r, 4, hier) for r in range(4)]
    assert len(hostrun.check(wrong_split, expected, opts)) == 4
    assert "local 0/1, cross 1/4" in hostrun.check(wrong_split, expected, opts)[1]
    flat = [line.replace(hier, "mpi") for line in good]
    assert hostrun.check(flat, expected, opts)[0] == \
        "rank 0: allreduce path 'mpi', expected 'shared memory + MPI across hosts'"
    assert hostrun.check(good[:-1], expected, opts) == \
        ["no engine context line (CFX_LOG_LEVEL=info) from rank(s) [3]"]
    assert hostrun.check(good, expected, dict(opts, expect=["allreduce path direct"])) == \
        ["no output line matched 'allreduce path direct'"]

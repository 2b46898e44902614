"""cfxrun --transport gloo without starting anything: where each rank goes and what it is told
(--dry-run), the store cfxrun serves (its protocol, as capi/src/rendezvous/store_tcp.c speaks it),
and the usage errors. The real runs are the gloo.cfxrun.* and gloo.hosts.* tests."""
import importlib.machinery
import importlib.util
import os
import socket
import subprocess
import sys

import pytest

CFXRUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "cfxrun")


def load_cfxrun():
    loader = importlib.machinery.SourceFileLoader("cfxrun_under_test", CFXRUN)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def run(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CFX_")}
    return subprocess.run([sys.executable, CFXRUN] + list(args), capture_output=True, text=True,
                          env=env, timeout=60)


def test_dry_run_places_ranks_by_slot_and_tells_each_its_place():
    res = run("--transport", "gloo", "--dry-run", "-np", "5", "-H", "a:2,b:1", "--", "prog", "x")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 5
    # By slot, then round again: a a b | a a
    hosts = [line.split(":", 1)[0] for line in lines]
    assert hosts == ["a", "a", "b", "a", "a"]
    for rank, line in enumerate(lines):
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        on_host = [r for r, h in enumerate(hosts) if h == hosts[rank]]
        assert fields["CFX_RANK"] == str(rank)
        assert fields["CFX_SIZE"] == "5"
        assert fields["CFX_LOCAL_RANK"] == str(on_host.index(rank))
        assert fields["CFX_LOCAL_SIZE"] == str(len(on_host))
        assert fields["CFX_TRANSPORT"] == "gloo"
        assert fields["CFX_RENDEZVOUS_EXTERNAL"] == "1"
        assert line.endswith(" prog x")


@pytest.mark.parametrize("args, message", [
    (["--transport", "tcp", "-np", "2", "prog"], "--transport takes mpi or gloo"),
    (["--transport", "gloo", "prog"], "missing -np"),
    (["--transport", "gloo", "-np", "2"], "missing the command"),
    (["--transport", "gloo", "-np", "2", "--hostfile", "/dev/null", "prog"], "not --hostfile"),
])
def test_usage_errors(args, message):
    res = run(*args)
    assert res.returncode == 2
    assert message in res.stderr


def test_store_speaks_the_engines_protocol():
    store = load_cfxrun().RendezvousStore(0)
    with socket.create_connection(("127.0.0.1", store.port), timeout=10) as c:
        hello = c.recv(14, socket.MSG_WAITALL)
        assert hello == b"CFXSTORE1\n" + (0).to_bytes(4, "big")  # generation 0: every world

        def blob(b):
            return len(b).to_bytes(4, "big") + b

        c.sendall(b"C" + blob(b"k"))
        assert c.recv(1) == b"\x00"
        c.sendall(b"S" + blob(b"k") + blob(b"value\x00bytes"))
        assert c.recv(1) == b"\x01"
        c.sendall(b"C" + blob(b"k"))
        assert c.recv(1) == b"\x01"
        c.sendall(b"G" + blob(b"k"))
        assert c.recv(1) == b"\x01"
        n = int.from_bytes(c.recv(4, socket.MSG_WAITALL), "big")
        assert c.recv(n, socket.MSG_WAITALL) == b"value\x00bytes"
        c.sendall(b"G" + blob(b"missing"))
        assert c.recv(1) == b"\x00"

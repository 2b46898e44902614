"""Tests of tools/cfxrun, the mpirun launcher: the command line it builds (root and non-root), the
variables it forwards, exit-status propagation, a real 2-rank run and its error messages."""

import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CFXRUN = os.path.join(ROOT, "tools", "cfxrun")
HAVE_MPIRUN = shutil.which("mpirun") is not None
needs_mpirun = pytest.mark.skipif(not HAVE_MPIRUN, reason="mpirun not installed (openmpi-bin)")


def load_cfxrun():
    loader = importlib.machinery.SourceFileLoader("cfxrun", CFXRUN)
    spec = importlib.util.spec_from_loader("cfxrun", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cfxrun():
    return load_cfxrun()


def clean_env(**extra):
    """The environment minus anything cfxrun would forward or that makes mpirun accept root."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CFX_", "OMPI_", "PMIX_")) and k not in
           ("PYTHONPATH", "LD_LIBRARY_PATH", "LUA_CPATH_5_4", "LUA_PATH_5_4", "CLASSPATH")}
    env.update(extra)
    return env


def run_cfxrun(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, CFXRUN, *args], env=env if env is not None else clean_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def build(cfxrun, argv, env=None, euid=1000, cores=2):
    opts = cfxrun.parse_args(argv)
    return cfxrun.build_command(opts, env if env is not None else {}, euid, "mpirun", cores=cores)


# ---- the command line ---------------------------------------------------------------------------

def test_non_root_has_no_root_flags(cfxrun):
    argv, extra = build(cfxrun, ["-np", "2", "--", "./train", "--lr", "0.1"], euid=1000)
    assert argv[:3] == ["mpirun", "-np", "2"]
    assert "--allow-run-as-root" not in argv
    assert extra == {}
    assert argv[argv.index("--bind-to") + 1] == "none"
    assert argv[-3:] == ["./train", "--lr", "0.1"]


def test_root_adds_flag_and_env(cfxrun):
    argv, extra = build(cfxrun, ["-np", "2", "./train"], euid=0)
    assert "--allow-run-as-root" in argv
    assert extra == {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    assert argv.index("--allow-run-as-root") < argv.index("./train")


def test_root_detection_uses_geteuid(cfxrun, monkeypatch, capsys):
    monkeypatch.setattr(cfxrun.os, "environ", clean_env())
    for euid, expect in ((0, True), (1000, False)):
        monkeypatch.setattr(cfxrun.os, "geteuid", lambda e=euid: e)
        assert cfxrun.main(["--dry-run", "-np", "2", "true"]) == 0
        out = capsys.readouterr().out
        assert ("--allow-run-as-root" in out) is expect
        assert ("OMPI_ALLOW_RUN_AS_ROOT=1" in out) is expect


def test_oversubscribe_only_beyond_slots(cfxrun):
    assert "--oversubscribe" not in build(cfxrun, ["-np", "2", "x"], cores=2)[0]
    assert "--oversubscribe" in build(cfxrun, ["-np", "3", "x"], cores=2)[0]
    argv = build(cfxrun, ["-np", "4", "-H", "a:2,b:2", "x"], cores=1)[0]
    assert argv[argv.index("-H") + 1] == "a:2,b:2"
    assert "--oversubscribe" not in argv
    assert "--oversubscribe" in build(cfxrun, ["-np", "5", "-H", "a:2,b:2", "x"], cores=64)[0]
    # "a,b:1" is 2 slots (a host without :slots counts one): exactly enough for 2, not for 3.
    assert "--oversubscribe" in build(cfxrun, ["-np", "3", "-H", "a,b:1", "x"], cores=64)[0]
    assert "--oversubscribe" not in build(cfxrun, ["-np", "2", "-H", "a,b:1", "x"], cores=64)[0]


def test_hostfile_slots(cfxrun, tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("# cluster\nnode1 slots=2\nnode2 slots=2 max_slots=4\n\n")
    argv = build(cfxrun, ["-np", "4", "--hostfile", str(hf), "x"], cores=1)[0]
    assert argv[argv.index("--hostfile") + 1] == str(hf)
    assert "--oversubscribe" not in argv
    assert "--oversubscribe" in build(cfxrun, ["-np", "5", "--hostfile", str(hf), "x"], cores=64)[0]


def test_forwards_cfx_and_listed_variables(cfxrun):
    env = {"CFX_LOG_LEVEL": "1", "CFX_FUSION_THRESHOLD": "0", "PYTHONPATH": "build/python",
           "LUA_CPATH_5_4": "build/lua/?.so;;", "HOME": "/root", "XCFX_NOT": "1", "cfx_lower": "1"}
    argv, _ = build(cfxrun, ["-np", "2", "x"], env=env)
    exported = {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}
    assert exported == {"CFX_LOG_LEVEL", "CFX_FUSION_THRESHOLD", "PYTHONPATH", "LUA_CPATH_5_4"}


def test_timeout_flag(cfxrun):
    argv, _ = build(cfxrun, ["--timeout", "30", "-np", "2", "x"])
    assert argv[argv.index("--timeout") + 1] == "30"
    assert "--timeout" not in build(cfxrun, ["-np", "2", "x"])[0]


def test_dry_run_subprocess_forwards_env():
    r = run_cfxrun("--dry-run", "-np", "3", "--", "prog", "a b",
                   env=clean_env(CFX_CYCLE_TIME="2", PYTHONPATH="/p"))
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert " -np 3 " in line and "--bind-to none" in line
    assert "-x CFX_CYCLE_TIME" in line and "-x PYTHONPATH" in line
    assert line.endswith("prog 'a b'")
    assert ("--allow-run-as-root" in line) == (os.geteuid() == 0)


# ---- usage errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["-np", "0", "true"], "-np needs a positive integer"),
    (["-np", "two", "true"], "-np needs a positive integer"),
    (["-np"], "-np needs a value"),
    (["true"], "missing -np"),
    (["-np", "2"], "missing the command"),
    (["-np", "2", "--bogus", "true"], "unknown option"),
    (["-np", "2", "--timeout", "-1", "true"], "--timeout needs a positive integer"),
])
def test_usage_errors(args, message):
    r = run_cfxrun(*args)
    assert r.returncode == 2
    assert message in r.stderr


def test_help():
    r = run_cfxrun("--help")
    assert r.returncode == 0
    assert "usage: cfxrun -np N" in r.stdout and "--dry-run" in r.stdout
    # --elastic and the elastic driver's flags (horovodrun's), also from cfxrun --elastic --help
    for flag in ("--elastic", "--min-np", "--max-np", "--host-discovery-script", "--reset-limit",
                 "--blacklist-cooldown-range", "--elastic-timeout"):
        assert flag in r.stdout, flag
    r = run_cfxrun("--elastic", "--help")
    assert r.returncode == 0 and "--blacklist-cooldown-range" in r.stdout


def test_mpirun_missing(tmp_path):
    # A PATH with sh but without mpirun.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    os.symlink("/bin/sh", bindir / "sh")
    r = run_cfxrun("-np", "2", "sh", "-c", "true", env=clean_env(PATH=str(bindir)))
    assert r.returncode == 127
    assert "cfxrun: mpirun not found: install openmpi-bin (tools/install-deps)" in r.stderr


def test_command_missing():
    r = run_cfxrun("-np", "2", "cfx-no-such-command")
    assert r.returncode == 127
    assert "command not found" in r.stderr


# ---- real runs ----------------------------------------------------------------------------------

@needs_mpirun
def test_two_ranks_see_rank_numbers():
    r = run_cfxrun("-np", "2", "printenv", "OMPI_COMM_WORLD_RANK")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == ["0", "1"]


@needs_mpirun
def test_cfx_variables_reach_ranks():
    r = run_cfxrun("-np", "2", "printenv", "CFX_TEST_TOKEN", env=clean_env(CFX_TEST_TOKEN="tok42"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["tok42", "tok42"]


@needs_mpirun
def test_exit_status_propagates():
    r = run_cfxrun("-np", "2", "--", "sh", "-c", "exit 3")
    assert r.returncode == 3
    assert r.stderr.splitlines()[-1].startswith("cfxrun: job failed with exit status 3")


@needs_mpirun
def test_failing_rank_is_named():
    r = run_cfxrun("-np", "2", "--", "sh", "-c", 'test "$OMPI_COMM_WORLD_RANK" = 1 && exit 5; exit 0')
    assert r.returncode == 5
    # mpirun names the rank only in some of its report formats (it depends on whether its own
    # output is a terminal); when it does, cfxrun repeats it.
    last = r.stderr.splitlines()[-1]
    assert last in ("cfxrun: job failed with exit status 5",
                    "cfxrun: job failed with exit status 5: rank 1 exited first, with code 5"), last


@needs_mpirun
def test_success_is_quiet():
    r = run_cfxrun("-np", "2", "/bin/true")
    assert r.returncode == 0
    assert r.stderr == ""


@needs_mpirun
def test_timeout_is_reported():
    r = run_cfxrun("--timeout", "1", "-np", "2", "sleep", "30")
    assert r.returncode == 110
    assert "timed out after 1 s" in r.stderr


# ---- failures on other hosts (mpirun's reports as Open MPI 4.1 prints them) ---------------------

DAEMONS = """--------------------------------------------------------------------------
ORTE was unable to reliably start one or more daemons.
This usually is caused by:
--------------------------------------------------------------------------"""


@pytest.mark.parametrize("report, detail", [
    ("ssh: Could not resolve hostname nodex: Name or service not known\n" + DAEMONS,
     "cannot start ranks on host nodex: its name does not resolve (Name or service not known)"),
    ("ssh: connect to host node2 port 22: No route to host\n" + DAEMONS,
     "cannot reach host node2: No route to host"),
    ("root@node2: Permission denied (publickey,password).\n" + DAEMONS,
     "host node2 refused the login (publickey,password): set up passwordless ssh to it"),
    ("A process or daemon was unable to complete a TCP connection\nto another process:\n"
     "  Local host:    node2\n  Remote host:   node1\nThis is usually caused by a firewall\n" + DAEMONS,
     "host node2 cannot open a TCP connection to host node1 (is the network between them up, and do "
     "btl_tcp_if_include / oob_tcp_if_include name it?)"),
    ("None of the TCP networks specified to be included for out-of-band communications\n"
     "could be found:\n\n  Value given: ib0\n\nPlease revise the specification and try again.\n",
     "a host has no network interface matching oob_tcp_if_include=ib0"),
    ("ORTE has lost communication with a remote daemon.\n\n"
     "  HNP daemon   : [[25368,0],0] on node node1\n  Remote daemon: [[25368,0],1] on node node2\n",
     "lost contact with host node2 (mpirun's daemon there)"),
    (DAEMONS, "mpirun could not start, or lost, its daemon on host node2: the launch agent's session "
              "(ssh) to it ended"),
])
def test_failures_on_other_hosts_are_named(cfxrun, report, detail, monkeypatch):
    monkeypatch.setattr(cfxrun.socket, "gethostname", lambda: "node1")
    line = cfxrun.describe_failure(1, report.splitlines(), None, ["node1", "node2"])
    assert line == f"job failed with exit status 1: {detail}"


def test_a_dead_rank_is_named_before_its_lost_daemon(cfxrun):
    report = ("mpirun noticed that process rank 2 with PID 77 on node b exited on signal 9 (Killed).\n"
              + DAEMONS)
    assert cfxrun.describe_failure(137, report.splitlines(), None, ["a", "b"]) == \
        "job failed with exit status 137: rank 2 on b died of signal 9 (Killed)"


def test_remote_hosts(cfxrun, monkeypatch, tmp_path):
    monkeypatch.setattr(cfxrun.socket, "gethostname", lambda: "n1.cluster")
    opts = cfxrun.parse_args(["-np", "4", "-H", "n1:2,n2:1,n3", "x"])
    assert cfxrun.remote_hosts(cfxrun.job_hosts(opts)) == ["n2", "n3"]
    hf = tmp_path / "hosts"
    hf.write_text("# cluster\nlocalhost slots=2\nn1 slots=2\nn4 slots=2 max_slots=4\n")
    opts = cfxrun.parse_args(["-np", "4", "--hostfile", str(hf), "x"])
    assert cfxrun.remote_hosts(cfxrun.job_hosts(opts)) == ["n4"]
    # Several candidates are all named when mpirun does not say which daemon it lost.
    line = cfxrun.describe_failure(1, DAEMONS.splitlines(), None, ["n1", "n2", "n3"])
    assert line.endswith("its daemon on one of the hosts n2, n3: the launch agent's session (ssh) "
                         "to it ended")


@needs_mpirun
def test_output_passes_through_unchanged():
    # mpirun's stdout goes through cfxrun (it reads Open MPI's reports there): a line without its
    # newline, and the bytes of every rank, arrive as the ranks wrote them.
    r = run_cfxrun("-np", "2", "--", "sh", "-c", 'printf "r$OMPI_COMM_WORLD_RANK."; printf "e" >&2')
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split(".")) == ["", "r0", "r1"]
    assert r.stderr == "ee"

"""Support for the pytest suites over pretend hosts (test_harness.py, test_failures.py): running
cfxhosts, finding a run's state and agent, and skipping (exit status 77, with the reason) when this
machine cannot make namespaces."""

import os
import re
import subprocess
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CFXHOSTS = os.path.join(HERE, "cfxhosts")
CFXRUN = os.path.join(ROOT, "tools", "cfxrun")
STATE_ROOT = "/run/cfxhosts"


def pytest_sessionstart(session):
    r = subprocess.run([CFXHOSTS, "--", "true"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, stdin=subprocess.DEVNULL)
    if r.returncode == 77:
        reason = re.search(r"SKIP: (.*)", r.stdout)
        pytest.exit(f"SKIP: {reason.group(1) if reason else r.stdout.strip()}", returncode=77)
    if r.returncode != 0:
        pytest.exit(f"cfxhosts cannot make hosts on this machine (exit {r.returncode}):\n{r.stdout}",
                    returncode=1)


def state_dir(pid):
    """The state folder of the cfxhosts process `pid`."""
    return os.path.join(STATE_ROOT, f"cfxh{pid}")


def agent(pid):
    return os.path.join(state_dir(pid), "agent")


def netns_of(pid):
    """Network namespaces of the cfxhosts process `pid` that exist now."""
    out = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"cfxh{pid}-")]


def harness(*args, command, env=None, timeout=120):
    """Runs cfxhosts ARGS -- COMMAND; returns the CompletedProcess (stdout and stderr together)."""
    return subprocess.run([CFXHOSTS, *args, "--", *command], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


class Running:
    """cfxhosts ARGS -- COMMAND in the background, its output lines collected as they come."""

    def __init__(self, *args, command, env=None):
        self.proc = subprocess.Popen([CFXHOSTS, *args, "--", *command], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     stdin=subprocess.DEVNULL)
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self):
        return "\n".join(self.lines)

    def wait_for(self, pattern, count=1, timeout=60):
        """Waits until `count` lines match `pattern`; fails the test with the output if not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(1 for line in list(self.lines) if re.search(pattern, line)) >= count:
                return
            if self.proc.poll() is not None:
                self.reader.join(5)
                break
            time.sleep(0.05)
        pytest.fail(f"{count} line(s) matching {pattern!r} did not come:\n{self.output()}")

    def agent(self, *args):
        return subprocess.run([agent(self.proc.pid), *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, check=True).stdout

    def pids_on(self, host, comm=None):
        """Pids of processes on `host` (all, or those whose command name is `comm`)."""
        pids = [int(p) for p in self.agent("--pids", host).split()]
        if comm is None:
            return pids
        return [p for p in pids if read_comm(p) == comm]

    def wait(self, timeout):
        try:
            status = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(30)
            pytest.fail(f"cfxhosts still running after {timeout} s:\n{self.output()}")
        self.reader.join(5)
        return status


def read_comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def alive(pids):
    return [p for p in pids if read_comm(p) is not None and not zombie(p)]


def zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def wait_gone(pids, timeout):
    """Waits until none of `pids` runs; returns those still running after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    left = alive(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = alive(left)
    return left

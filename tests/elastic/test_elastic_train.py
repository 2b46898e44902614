"""Elastic training end to end: tools/cfxrun --elastic runs tests/elastic/elastic_train.py (a
Horovod elastic script) on two hosts: by default two host names of this machine (localhost and
127.0.0.1, as Horovod's own elastic tests do), with --hosts a,b the pretend hosts of
tests/hosts/cfxhosts (run inside it: workers on b start through its launch agent). The final
parameters are compared with a single-process reference over the same batches, computed here.
The second host is the one that fails, goes silent (its link pulled: cfxhosts only) or is added.

    test_elastic_train.py [--hosts FIRST,SECOND] kill|raise|raise_one|silent|grow|below_min|silent_below_min|all_fail

MODE_optimizer (kill_optimizer, grow_optimizer, ...) trains with hvd.DistributedOptimizer, as most
Horovod elastic scripts do (ELASTIC_OPTIMIZER=distributed), instead of an allreduce in the loop.

Lines "elastic-time: NAME SECONDS" give what was measured (bench/elastic_hosts.py reads them).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CFXRUN = os.path.join(ROOT, "tools", "cfxrun")
SCRIPT = os.path.join(HERE, "elastic_train.py")
EPOCHS, BATCHES, GLOBAL, DIM, LR = 3, 6, 12, 4, 0.05


def reference():
    """SGD over every batch once, in one process (the fixed-world run the elastic one must equal)."""
    w = np.zeros(DIM)
    for epoch in range(EPOCHS):
        for b in range(BATCHES):
            g = np.random.default_rng(1000 * epoch + b)
            x = g.standard_normal((GLOBAL, DIM))
            y = x @ np.arange(1, DIM + 1) + 0.1 * g.standard_normal(GLOBAL)
            grad = 2 * x.T @ (x @ w - y) / GLOBAL
            w = w - LR * grad
    return w


EXTRA_ENV = {}  # what the mode adds to every run's environment


def run(args, env_extra, timeout=float(os.environ.get("ELASTIC_TEST_TIMEOUT", "240"))):
    env = dict(os.environ)
    env.update(EXTRA_ENV)
    env["CFX_TRANSPORT_TIMEOUT_S"] = "20"
    env.update(env_extra)
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, CFXRUN, "--elastic"] + args + [sys.executable, SCRIPT],
                           env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:  # what the job said before it hung
        for part in (e.stdout, e.stderr):
            sys.stdout.write((part or b"")[-4000:].decode("utf-8", "replace"))
        check(False, "the job did not end within %g s" % timeout)
    elapsed = time.monotonic() - t0
    sys.stdout.write(p.stdout[-4000:])
    sys.stdout.write(p.stderr[-4000:])
    return p, elapsed


def check(cond, msg):
    if not cond:
        print("FAIL: " + msg)
        sys.exit(1)


def final(out):
    with open(out) as f:
        return json.load(f)


def since(out, suffix, until):
    """Seconds from the time a worker wrote to OUT.suffix to `until` (both time.time())."""
    with open(out + suffix) as f:
        return until - float(f.read())


def lose_second_host(how, first, second, out, want):
    """The second host's workers fail (or go silent) at epoch 1, batch 3 of the first world; the
    first host's two go on from the last commit (batch 2) and finish."""
    env = {"ELASTIC_KILL": "%s:%s:1:3" % (second, how), "ELASTIC_OUT": out}
    if how == "silent":
        # Nobody reports a silent host: the survivors' collective ends at the transport's
        # deadline, the round leaves the host out after its settle time.
        env.update({"CFX_TRANSPORT_TIMEOUT_S": "10", "CFX_ELASTIC_SETTLE_S": "5"})
    p, _ = run(["-np", "4", "--min-np", "2", "-H", "%s:2,%s:2" % (first, second)], env)
    check(p.returncode == 0, "the job failed (status %d)" % p.returncode)
    r = final(out)
    check(r["size"] == 2 and r["sizes"] == [2],
          "the survivors' worlds have %s ranks, not [2]" % r["sizes"])
    check(np.allclose(r["weight"], want, rtol=0, atol=1e-9),
          "final parameters %s differ from the fixed-world reference %s" % (r["weight"], want))
    print("elastic-time: lost-to-new-world %.2f" % since(out, ".lost", r["reset_times"][0]))
    print("elastic-time: lost-to-training %.2f" % since(out, ".lost", r["trained_times"][0]))
    if how == "silent":
        check("not a member of the final world" in p.stderr,
              "the driver did not stop the silent host's workers at the end")


def main():
    argv = sys.argv[1:]
    first, second = "localhost", "127.0.0.1"
    if argv[:1] == ["--hosts"] and len(argv) > 1:
        first, second = argv[1].split(",")
        argv = argv[2:]
    mode = argv[0] if argv else "(none)"
    if mode.endswith("_optimizer"):
        mode = mode[:-len("_optimizer")]
        EXTRA_ENV["ELASTIC_OPTIMIZER"] = "distributed"
    tmp = tempfile.mkdtemp(prefix="cfx-elastic-test-")
    out = os.path.join(tmp, "final.json")
    want = reference()
    if mode.startswith("silent") and "CFXHOSTS_AGENT" not in os.environ:
        print("FAIL: mode %s pulls a host's link: run it inside tests/hosts/cfxhosts" % mode)
        sys.exit(1)
    if mode in ("kill", "raise", "raise_one", "silent"):
        # raise_one: one of the second host's two workers fails; the host leaves the world whole
        # at the next round (its other worker stopped by the driver), as Horovod's driver has it.
        lose_second_host({"kill": "sigkill"}.get(mode, mode), first, second, out, want)
    elif mode == "grow":
        hosts = os.path.join(tmp, "hosts")
        with open(hosts, "w") as f:
            f.write("%s:2\n" % first)
        script = os.path.join(tmp, "discover.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\ncat %s\n" % hosts)
        os.chmod(script, 0o755)
        p, _ = run(["-np", "2", "--min-np", "2", "--max-np", "3", "--host-discovery-script", script],
                   {"ELASTIC_ADD_HOST": "%s:%s:1" % (hosts, second), "ELASTIC_OUT": out})
        check(p.returncode == 0, "the job failed (status %d)" % p.returncode)
        r = final(out)
        check(r["size"] == 3, "the newcomer never joined (size %d)" % r["size"])
        check(np.allclose(r["weight"], want, rtol=0, atol=1e-9),
              "final parameters %s differ from the fixed-world reference %s" % (r["weight"], want))
        with open(out + ".joined") as f:
            joined = float(f.read())
        print("elastic-time: new-host-to-training %.2f" % since(out, ".added", joined))
    elif mode == "below_min":
        p, elapsed = run(["-np", "3", "--min-np", "3", "-H", "%s:2,%s:1" % (first, second),
                          "--elastic-timeout", "10"],
                         {"ELASTIC_KILL": "%s:sigkill:1:3" % second})
        last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        check(p.returncode != 0 and "fewer than the minimum 3" in last,
              "below the minimum: status %d, last line %r" % (p.returncode, last))
        print("below the minimum: ended after %.1f s with: %s" % (elapsed, last))
    elif mode == "silent_below_min":
        # Nobody reports the silent host and its workers never end: the survivors' round fails
        # at its deadline, and the driver ends the job on that decision.
        p, elapsed = run(["-np", "4", "--min-np", "3", "-H", "%s:2,%s:2" % (first, second),
                          "--elastic-timeout", "10"],
                         {"ELASTIC_KILL": "%s:silent:1:3" % second, "ELASTIC_OUT": out,
                          "CFX_TRANSPORT_TIMEOUT_S": "10", "CFX_ELASTIC_SETTLE_S": "5"})
        ended = time.time()
        last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        check(p.returncode != 0 and "fewer than the minimum 3" in last and "id 2" in last and
              "id 3" in last, "below the minimum after a silent host: status %d, last line %r"
              % (p.returncode, last))
        print("below the minimum after a silent host: ended %.1f s after the link went down "
              "(transport deadline 10 s, round deadline 10 s) with: %s"
              % (since(out, ".lost", ended), last))
    elif mode == "all_fail":
        p, _ = run(["-np", "2", "-H", "%s:1,%s:1" % (first, second)],
                   {"ELASTIC_KILL": "%s:raise:0:0" % first})
        # Every worker fails: none can import the package.
        p2, _ = run(["-np", "2", "--min-np", "1", "-H", "%s:1,%s:1" % (first, second)],
                    {"PYTHONPATH": "/nonexistent-so-import-fails"})
        last = p2.stderr.strip().splitlines()[-1] if p2.stderr.strip() else ""
        check(p2.returncode != 0 and "every worker failed" in last and
              "id 0 on %s" % first in last and "id 1 on %s" % second in last,
              "every rank failing: status %d, last line %r" % (p2.returncode, last))
        check(p.returncode != 0, "a job below its minimum (-np 2 = --min-np) went on")
    else:
        sys.exit("usage: test_elastic_train.py [--hosts FIRST,SECOND] "
                 "kill|raise|raise_one|silent|grow|below_min|silent_below_min|all_fail (not %s)" % mode)
    print("%s: passed" % mode)


if __name__ == "__main__":
    main()

"""Elastic training end to end: tools/cfxrun --elastic runs tests/elastic/elastic_train.py (a
Horovod elastic script) with two host names on this machine (localhost and 127.0.0.1, as Horovod's
own elastic tests do). The final parameters are compared with a single-process reference over the
same batches, computed here.

    test_elastic_train.py kill|raise|grow|below_min|all_fail
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


def run(args, env_extra, timeout=240):
    env = dict(os.environ)
    env.update(env_extra)
    env["CFX_TRANSPORT_TIMEOUT_S"] = "20"
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, CFXRUN, "--elastic"] + args + [sys.executable, SCRIPT],
                       env=env, capture_output=True, text=True, timeout=timeout)
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


def main():
    mode = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="cfx-elastic-test-")
    out = os.path.join(tmp, "final.json")
    want = reference()
    if mode in ("kill", "raise"):
        how = "sigkill" if mode == "kill" else "raise"
        p, _ = run(["-np", "4", "--min-np", "2", "-H", "localhost:2,127.0.0.1:2"],
                   {"ELASTIC_KILL": "127.0.0.1:%s:1:3" % how, "ELASTIC_OUT": out})
        check(p.returncode == 0, "the job failed (status %d)" % p.returncode)
        r = final(out)
        check(r["size"] == 2, "the survivors' world has %d ranks, not 2" % r["size"])
        with open(out + ".lost") as f:
            lost = float(f.read())
        print("from the lost workers to the new world (reset callback on rank 0): %.2f s"
              % (r["reset_times"][0] - lost))
        check(np.allclose(r["weight"], want, rtol=0, atol=1e-9),
              "final parameters %s differ from the fixed-world reference %s" % (r["weight"], want))
    elif mode == "grow":
        hosts = os.path.join(tmp, "hosts")
        with open(hosts, "w") as f:
            f.write("localhost:2\n")
        script = os.path.join(tmp, "discover.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\ncat %s\n" % hosts)
        os.chmod(script, 0o755)
        p, _ = run(["-np", "2", "--min-np", "2", "--max-np", "3", "--host-discovery-script", script],
                   {"ELASTIC_ADD_HOST": "%s:127.0.0.1:1" % hosts, "ELASTIC_OUT": out})
        check(p.returncode == 0, "the job failed (status %d)" % p.returncode)
        r = final(out)
        check(r["size"] == 3, "the newcomer never joined (size %d)" % r["size"])
        check(np.allclose(r["weight"], want, rtol=0, atol=1e-9),
              "final parameters %s differ from the fixed-world reference %s" % (r["weight"], want))
    elif mode == "below_min":
        p, elapsed = run(["-np", "3", "--min-np", "3", "-H", "localhost:2,127.0.0.1:1",
                          "--elastic-timeout", "10"],
                         {"ELASTIC_KILL": "127.0.0.1:sigkill:1:3"})
        last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        check(p.returncode != 0 and "fewer than the minimum 3" in last,
              "below the minimum: status %d, last line %r" % (p.returncode, last))
        print("below the minimum: ended after %.1f s with: %s" % (elapsed, last))
    elif mode == "all_fail":
        p, _ = run(["-np", "2", "-H", "localhost:1,127.0.0.1:1"],
                   {"ELASTIC_KILL": "localhost:raise:0:0"})
        # Both hosts' workers: localhost's raises; make 127.0.0.1's fail too.
        p2, _ = run(["-np", "2", "--min-np", "1", "-H", "localhost:1,127.0.0.1:1"],
                    {"ELASTIC_KILL": "x:raise:0:0", "PYTHONPATH": "/nonexistent-so-import-fails"})
        last = p2.stderr.strip().splitlines()[-1] if p2.stderr.strip() else ""
        check(p2.returncode != 0 and "every worker failed" in last and "id 0" in last and
              "id 1" in last, "every rank failing: status %d, last line %r" % (p2.returncode, last))
        check(p.returncode != 0, "a job below its minimum (-np 2 = --min-np) went on")
    else:
        sys.exit("unknown mode %s" % mode)
    print("%s: passed" % mode)


if __name__ == "__main__":
    main()

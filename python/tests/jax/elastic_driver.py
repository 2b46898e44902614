"""An elastic JAX job that loses a rank and goes on: tools/cfxrun --elastic runs elastic_worker.py
on two host names of this machine (localhost with 2 workers, 127.0.0.1 with 1, as Horovod's own
elastic tests do); the worker on 127.0.0.1 kills itself (SIGKILL) at epoch 1, batch 3 (after the
commit at batch 2). The two survivors' collective inside the jitted step fails, conflux.jax.run
restores their last commit, the world forms again with 2 ranks, JaxState broadcasts parameters
and optimizer state, and training goes on. Checked: the job ends well, both survivors saw one
new world of 2 ranks, their final parameters and momentum are bitwise equal, and equal (float64
rounding) to one process trained on every batch once. Not a pytest file: ctest runs it.

    python elastic_driver.py
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
CFXRUN = os.path.join(ROOT, "tools", "cfxrun")
WORKER = os.path.join(HERE, "elastic_worker.py")
EPOCHS, BATCHES, GLOBAL, DIM, LR, MOMENTUM = 3, 6, 12, 4, 0.05, 0.9  # elastic_worker.py's


def reference():
    """Momentum SGD over every batch once, in one process: parameters and the momentum trace."""
    w, b, tw, tb = np.zeros(DIM), 0.0, np.zeros(DIM), 0.0
    for epoch in range(EPOCHS):
        for k in range(BATCHES):
            g = np.random.default_rng(1000 * epoch + k)
            x = g.standard_normal((GLOBAL, DIM))
            y = x @ np.arange(1, DIM + 1) + 0.5 + 0.1 * g.standard_normal(GLOBAL)
            r = x @ w + b - y
            gw, gb = 2 * x.T @ r / GLOBAL, 2 * r.sum() / GLOBAL
            tw, tb = gw + MOMENTUM * tw, gb + MOMENTUM * tb
            w, b = w - LR * tw, b - LR * tb
    return w, b, tw, tb


def check(cond, msg):
    if not cond:
        print("FAIL: " + msg)
        sys.exit(1)


def main():
    if os.environ.get("CFX_JAX_SKIP_REASON"):
        print("SKIP: conflux.jax unavailable: " + os.environ["CFX_JAX_SKIP_REASON"])
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="cfx-jax-elastic-")
    out = os.path.join(tmp, "final")
    env = dict(os.environ, ELASTIC_KILL="127.0.0.1:1:3", ELASTIC_OUT=out,
               CFX_TRANSPORT_TIMEOUT_S="20")
    cmd = [sys.executable, CFXRUN, "--elastic", "-np", "3", "--min-np", "2",
           "-H", "localhost:2,127.0.0.1:1", sys.executable, WORKER]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                           timeout=float(os.environ.get("ELASTIC_TEST_TIMEOUT", "200")))
    except subprocess.TimeoutExpired as e:
        for part in (e.stdout, e.stderr):
            sys.stdout.write((part or b"")[-4000:].decode("utf-8", "replace"))
        check(False, "the job did not end in time")
    sys.stdout.write(p.stdout[-4000:])
    sys.stdout.write(p.stderr[-4000:])
    check(p.returncode == 0, "the job failed (status %d)" % p.returncode)
    results = []
    for path in sorted(glob.glob(out + ".*.json")):
        with open(path) as f:
            results.append(json.load(f))
    check(len(results) == 2, "%d workers finished, not the 2 survivors" % len(results))
    for r in results:
        check(r["size"] == 2 and r["sizes"] == [2],
              "a survivor ended in a world of %d ranks after worlds %s, not [2]"
              % (r["size"], r["sizes"]))
    a, b = results
    check(sorted([a["rank"], b["rank"]]) == [0, 1], "the survivors' ranks are %s and %s"
          % (a["rank"], b["rank"]))
    check(a["w"] == b["w"] and a["b"] == b["b"] and a["opt_state"] == b["opt_state"],
          "the survivors' final states differ: %s / %s" % (a, b))
    w, bias, tw, tb = reference()
    got_w, got_b = np.asarray(a["w"]), a["b"]
    check(np.allclose(got_w, w, rtol=0, atol=1e-9) and abs(got_b - bias) < 1e-9,
          "final parameters w=%s b=%r differ from the fixed-world reference w=%s b=%r"
          % (got_w, got_b, w, bias))
    # The optimizer state's leaves, in pytree order: the momentum traces of b, then w.
    traces = [np.asarray(v) for v in a["opt_state"]]
    check(len(traces) == 2 and np.allclose(traces[0], tb, atol=1e-9) and
          np.allclose(traces[1], tw, atol=1e-9),
          "final momentum %s differs from the reference b=%r w=%s" % (traces, tb, tw))
    print("elastic JAX job: lost 1 of 3 workers at epoch 1 batch 3, 2 survivors went on; final "
          "parameters w=%s b=%.12f equal on both and to the reference" % (got_w, got_b))
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()

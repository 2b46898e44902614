"""Elastic Keras 3 end to end: tools/cfxrun --elastic runs elastic_keras_train.py (a Horovod
elastic Keras script) with 3 workers on two host names of this machine (localhost:2,
127.0.0.1:1); the worker on 127.0.0.1 dies (SIGKILL) in epoch 1, after the batch that followed a
commit, so the survivors must restore the commit (weights and the optimizer's momentum), form a
world of 2 and go on with 6-row shards. Checked: the job ends well; both survivors finish in a
world of 2 with bit-identical weights; those weights equal (float32 rounding) SGD with momentum
over every global batch once, computed here in float64.

    check_elastic_keras.py          (PYTHONPATH: the build's python/; exit 0 passed, 1 failed)
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
SCRIPT = os.path.join(HERE, "elastic_keras_train.py")
EPOCHS, BATCHES, GLOBAL, DIM, LR, MOMENTUM = 3, 6, 12, 4, 0.05, 0.5


def reference():
    """Keras's SGD with momentum (m = momentum m - lr g; w += m) on MSE, every global batch once."""
    w, b = np.zeros(DIM), 0.0
    mw, mb = np.zeros(DIM), 0.0
    for epoch in range(EPOCHS):
        g = np.random.default_rng(1000 + epoch)
        x = g.standard_normal((BATCHES * GLOBAL, DIM)).astype(np.float32).astype(np.float64)
        y = x @ np.arange(1, DIM + 1) + 0.1 * g.standard_normal(BATCHES * GLOBAL)
        y = y.astype(np.float32).astype(np.float64)
        for k in range(BATCHES):
            xb, yb = x[k * GLOBAL:(k + 1) * GLOBAL], y[k * GLOBAL:(k + 1) * GLOBAL]
            err = xb @ w + b - yb
            gw, gb = 2 * xb.T @ err / GLOBAL, 2 * err.mean()
            mw, mb = MOMENTUM * mw - LR * gw, MOMENTUM * mb - LR * gb
            w, b = w + mw, b + mb
    return w, b


def fail(msg, p=None):
    if p is not None:
        sys.stdout.write(p.stdout[-6000:] + p.stderr[-6000:])
    print("FAIL: " + msg)
    sys.exit(1)


def main():
    if os.environ.get("CFX_TF_SKIP_REASON"):
        print("SKIP: conflux.tensorflow: " + os.environ["CFX_TF_SKIP_REASON"])
        sys.exit(77)
    out = os.path.join(tempfile.mkdtemp(prefix="cfx-elastic-keras-"), "final")
    env = dict(os.environ, ELASTIC_KILL="127.0.0.1:1:3", ELASTIC_OUT=out,
               CFX_TRANSPORT_TIMEOUT_S="20")
    cmd = [sys.executable, CFXRUN, "--elastic", "-np", "3", "--min-np", "2",
           "-H", "localhost:2,127.0.0.1:1", sys.executable, SCRIPT]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=260)
    except subprocess.TimeoutExpired as e:
        for part in (e.stdout, e.stderr):
            sys.stdout.write((part or b"")[-4000:].decode("utf-8", "replace"))
        fail("the job did not end within 260 s")
    if p.returncode != 0:
        fail("the job failed (status %d)" % p.returncode, p)
    files = sorted(glob.glob(out + ".*.json"))
    results = [json.load(open(f)) for f in files]
    if len(results) != 2 or any(r["size"] != 2 or r["sizes"] != [2] for r in results):
        fail("survivors: %s, not two in one reset to a world of 2"
             % [(r["size"], r["sizes"]) for r in results], p)
    weights = [[np.asarray(w, np.float32) for w in r["weights"]] for r in results]
    if not all(np.array_equal(a, b) for a, b in zip(weights[0], weights[1])):
        fail("the survivors' weights differ: %s vs %s" % (weights[0], weights[1]))
    w, b = reference()
    got_w, got_b = weights[0][0].reshape(-1), float(weights[0][1][0])
    if not (np.allclose(got_w, w, rtol=1e-4, atol=1e-5) and abs(got_b - b) <= 1e-4 + 1e-4 * abs(b)):
        fail("final weights %s, %r differ from the fixed-world reference %s, %r"
             % (got_w, got_b, w, b))
    print("elastic Keras: a rank lost in epoch 1, the survivors finished in a world of 2 with "
          "the reference's weights %s: passed" % np.round(got_w, 5))


if __name__ == "__main__":
    main()

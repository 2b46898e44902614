"""The elastic trainer examples of Java and Lua (examples/java/ElasticTrainer.java,
examples/lua/elastic_trainer.lua) under tools/cfxrun --elastic with two host names on this machine
(localhost and 127.0.0.1): one worker SIGKILLs itself mid-epoch (the example's ELASTIC_KILL knob),
the survivors must re-form the world, roll back to their last commit, and finish; every survivor's
final weights must equal the fixed-world reference computed here over the same batches (float
rounding apart), and the member killed must have written none.

    test_elastic_examples.py NP KILL_RANK -- command args...

NP workers start (-np NP --min-np NP-1); the worker of rank KILL_RANK dies at epoch 1, batch 3,
after a commit at batch 2 (so a survivor that did not roll back would apply batch 2 twice).
"""
import glob
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CFXRUN = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools", "cfxrun")
# The examples' constants (ElasticTrainer.java, elastic_trainer.lua).
EPOCHS, BATCHES, ROWS, DIM, LR = 3, 8, 12, 4, 0.5
TRUE_W, NOISE = (1.0, -2.0, 3.0, -4.0), 0.5
KILL_EPOCH, KILL_BATCH = 1, 3
MASK = (1 << 64) - 1


def splitmix64(seed):
    """Uniform doubles in [0, 1) with 53 random bits: the examples' generator."""
    s = seed & MASK
    while True:
        s = (s + 0x9E3779B97F4A7C15) & MASK
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        yield (z >> 11) * 2.0 ** -53


def batch(epoch, b):
    r = splitmix64(1000 * epoch + b)
    xs, ys = [], []
    for _ in range(ROWS):
        x, z = [], 0.0
        for j in range(DIM):
            x.append(2 * next(r) - 1)
            z += x[j] * TRUE_W[j]
        z += NOISE * (2 * next(r) - 1)
        xs.append(x)
        ys.append(1.0 if z > 0 else 0.0)
    return xs, ys


def reference():
    """SGD over every batch once, in one process: what a fixed world computes."""
    w = [0.0] * (DIM + 1)
    for epoch in range(EPOCHS):
        for b in range(BATCHES):
            xs, ys = batch(epoch, b)
            g = [0.0] * (DIM + 1)
            for x, y in zip(xs, ys):
                z = w[DIM] + sum(w[j] * x[j] for j in range(DIM))
                err = 1.0 / (1.0 + math.exp(-z)) - y
                for j in range(DIM):
                    g[j] += err * x[j] / ROWS
                g[DIM] += err / ROWS
            w = [w[j] - LR * g[j] for j in range(DIM + 1)]
    return w


def check(cond, msg):
    if not cond:
        print("FAIL: " + msg)
        sys.exit(1)


def read_result(path):
    fields = {}
    with open(path) as f:
        for line in f:
            key, *values = line.split()
            fields[key] = values
    return fields


def main():
    if len(sys.argv) < 5 or sys.argv[3] != "--":
        sys.exit(__doc__)
    np_, kill_rank, command = int(sys.argv[1]), int(sys.argv[2]), sys.argv[4:]
    hosts = "localhost:%d,127.0.0.1:1" % (np_ - 1)
    tmp = tempfile.mkdtemp(prefix="cfx-elastic-examples-")
    out = os.path.join(tmp, "result")
    env = dict(os.environ, ELASTIC_KILL="%d:%d:%d" % (kill_rank, KILL_EPOCH, KILL_BATCH),
               ELASTIC_OUT=out, CFX_TRANSPORT_TIMEOUT_S="20")
    args = [sys.executable, CFXRUN, "--elastic", "-np", str(np_), "--min-np", str(np_ - 1),
            "-H", hosts, "--elastic-timeout", "60"] + command
    print("running: " + " ".join(args))
    t0 = time.monotonic()
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=240)
    print("the job took %.1f s" % (time.monotonic() - t0))
    sys.stdout.write(p.stdout[-6000:])
    sys.stdout.write(p.stderr[-6000:])
    check(p.returncode == 0, "the job failed (status %d)" % p.returncode)
    check(os.path.exists(out + ".lost"), "rank %d never reached its failure" % kill_rank)
    with open(out + ".lost") as f:
        lost_ms = int(f.read())
    # In the first world member ids are the ranks: the one killed is member kill_rank.
    survivors = sorted(int(path.rsplit(".", 1)[1]) for path in glob.glob(out + ".[0-9]*"))
    want_ids = [m for m in range(np_) if m != kill_rank]
    check(survivors == want_ids, "results from members %s, expected the survivors %s"
          % (survivors, want_ids))
    want = reference()
    for m in survivors:
        r = read_result("%s.%d" % (out, m))
        size, rnd, resumed = int(r["size"][0]), int(r["round"][0]), int(r["resumed"][0])
        w = [float(v) for v in r["weights"]]
        check(size == np_ - 1, "member %d finished in a world of %d ranks, not %d" % (m, size, np_ - 1))
        check(rnd >= 2, "member %d finished in round %d: the world was never formed again" % (m, rnd))
        check(len(w) == DIM + 1 and all(abs(a - b) <= 1e-9 for a, b in zip(w, want)),
              "member %d's final weights %s differ from the fixed-world reference %s" % (m, w, want))
        print("member %d: weights equal the reference (largest difference %.2g); training again "
              "%.2f s after the lost worker died" % (m, max(abs(a - b) for a, b in zip(w, want)),
                                                     (resumed - lost_ms) / 1000.0))
    print("passed")


if __name__ == "__main__":
    main()

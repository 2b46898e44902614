"""The elastic trainer examples of Java and Lua (examples/java/ElasticTrainer.java,
examples/lua/elastic_trainer.lua) under tools/cfxrun --elastic with two host names on this machine
(localhost and 127.0.0.1): one worker SIGKILLs itself mid-epoch (the example's ELASTIC_KILL knob),
the survivors must re-form the world, roll back to their last commit, and finish; every survivor's
final weights must equal the fixed-world reference computed here over the same batches (float
rounding apart), and the member killed must have written none.

    test_elastic_examples.py kill NP KILL_RANK -- command args...
    test_elastic_examples.py below_min NP -- command args...
    test_elastic_examples.py grow NP -- command args...

kill: NP workers start (-np NP --min-np NP-1), the rank killed alone on its host (the first or
the last rank); the worker of rank KILL_RANK dies at epoch 1,
batch 3, after a commit at batch 2 (so a survivor that did not roll back would apply batch 2
twice).
below_min: NP workers start with a minimum of NP, as cfxrun --elastic would start them (its
documented worker environment, docs/elastic.md) but without its driver, which would end the job
itself; the last rank dies, and the survivors' reform must fail within the round's deadline with
the language's membership-change error naming the member missing, and no survivor may finish.
grow: NP workers start on localhost (-np NP --max-np NP+1, a host discovery script reading a hosts
file); at epoch 1 rank 0 adds 127.0.0.1:1 to the file (the example's ELASTIC_GROW knob), the
driver starts a newcomer there, the ranks let it in at a commit and sync it; all NP+1 must finish
with the reference weights, the newcomer's from the state it was sent.
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


def run_job(args, env):
    """Runs one elastic job (cfxrun --elastic), shows its output's end, and fails unless it
    succeeded."""
    print("running: " + " ".join(args))
    t0 = time.monotonic()
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=240)
    print("the job took %.1f s" % (time.monotonic() - t0))
    sys.stdout.write(p.stdout[-6000:])
    sys.stdout.write(p.stderr[-6000:])
    check(p.returncode == 0, "the job failed (status %d)" % p.returncode)
    return p


def run_kill(np_, kill_rank, command):
    # The rank killed has a host of its own: a host whose worker failed leaves the world whole
    # (docs/elastic.md), and the others must go on. cfxrun gives ranks in -H's order.
    if kill_rank == 0:
        hosts = "127.0.0.1:1,localhost:%d" % (np_ - 1)
    elif kill_rank == np_ - 1:
        hosts = "localhost:%d,127.0.0.1:1" % (np_ - 1)
    else:
        raise SystemExit("kill: the rank killed must be the first or the last (its own host)")
    tmp = tempfile.mkdtemp(prefix="cfx-elastic-examples-")
    out = os.path.join(tmp, "result")
    env = dict(os.environ, ELASTIC_KILL="%d:%d:%d" % (kill_rank, KILL_EPOCH, KILL_BATCH),
               ELASTIC_OUT=out, CFX_TRANSPORT_TIMEOUT_S="20")
    args = [sys.executable, CFXRUN, "--elastic", "-np", str(np_), "--min-np", str(np_ - 1),
            "-H", hosts, "--elastic-timeout", "60"] + command
    run_job(args, env)
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


# The membership-change error as each language reports an uncaught one.
MEMBERSHIP_ERRORS = ("org.conflux.MembershipChangedException", "conflux: membership_changed:")
ROUND_TIMEOUT_S, SETTLE_S = 10, 2


def run_below_min(np_, command):
    tmp = tempfile.mkdtemp(prefix="cfx-elastic-examples-")
    out = os.path.join(tmp, "result")
    store = os.path.join(tmp, "store")
    os.mkdir(store)
    dead = np_ - 1
    procs = []
    t0 = time.monotonic()
    for wid in range(np_):
        env = dict(os.environ, CFX_ELASTIC="1", CFX_ELASTIC_ID=str(wid), CFX_TRANSPORT="gloo",
                   CFX_RANK=str(wid), CFX_SIZE=str(np_), CFX_RENDEZVOUS_DIR=store,
                   CFX_ELASTIC_MIN_SIZE=str(np_), CFX_ELASTIC_TIMEOUT_S=str(ROUND_TIMEOUT_S),
                   CFX_ELASTIC_SETTLE_S=str(SETTLE_S), CFX_TRANSPORT_TIMEOUT_S="20",
                   ELASTIC_KILL="%d:%d:%d" % (dead, KILL_EPOCH, KILL_BATCH), ELASTIC_OUT=out)
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        check(False, "below the minimum, a member still ran after 240 s (a hang)")
    elapsed = time.monotonic() - t0
    for wid, (p, text) in enumerate(zip(procs, outputs)):
        print("---- member %d (status %s)\n%s" % (wid, p.returncode, text[-3000:]))
    check(procs[dead].returncode == -9, "member %d was to SIGKILL itself; it ended with %s"
          % (dead, procs[dead].returncode))
    for wid in range(dead):
        text = outputs[wid]
        check(procs[wid].returncode not in (0, None), "member %d went on below the minimum %d"
              % (wid, np_))
        lines = [l for l in text.splitlines() if any(m in l for m in MEMBERSHIP_ERRORS)]
        check(lines, "member %d did not end with the membership-change error" % wid)
        missing = "id %d (rank %d)" % (dead, dead)  # the engine's text: member id, its old rank
        check(missing in lines[0], "member %d's error does not name the member missing (%s): %s"
              % (wid, missing, lines[0]))
        print("member %d ended with: %s" % (wid, lines[0].strip()))
    check(not glob.glob(out + ".[0-9]*"), "a member below the minimum wrote a result")
    print("below the minimum: every survivor failed after %.1f s in all" % elapsed)


def run_grow(np_, command):
    tmp = tempfile.mkdtemp(prefix="cfx-elastic-examples-")
    out = os.path.join(tmp, "result")
    hosts = os.path.join(tmp, "hosts")
    with open(hosts, "w") as f:
        f.write("localhost:%d\n" % np_)
    script = os.path.join(tmp, "discover.sh")
    with open(script, "w") as f:
        f.write("#!/bin/sh\ncat %s\n" % hosts)
    os.chmod(script, 0o755)
    env = dict(os.environ, ELASTIC_GROW="%s:127.0.0.1:1" % hosts, ELASTIC_OUT=out,
               CFX_TRANSPORT_TIMEOUT_S="20")
    args = [sys.executable, CFXRUN, "--elastic", "-np", str(np_), "--min-np", str(np_),
            "--max-np", str(np_ + 1), "--host-discovery-script", script] + command
    run_job(args, env)
    members = sorted(int(path.rsplit(".", 1)[1]) for path in glob.glob(out + ".[0-9]*"))
    check(members == list(range(np_ + 1)), "results from members %s, expected %s (the newcomer is "
          "member %d)" % (members, list(range(np_ + 1)), np_))
    want = reference()
    for m in members:
        r = read_result("%s.%d" % (out, m))
        w = [float(v) for v in r["weights"]]
        check(int(r["size"][0]) == np_ + 1, "member %d finished in a world of %s ranks, not %d"
              % (m, r["size"][0], np_ + 1))
        check(len(w) == DIM + 1 and all(abs(a - b) <= 1e-9 for a, b in zip(w, want)),
              "member %d's final weights %s differ from the fixed-world reference %s" % (m, w, want))
    print("members %s finished in a world of %d with the reference weights" % (members, np_ + 1))


def main():
    argv = sys.argv[1:]
    if "--" not in argv or argv[0] not in ("kill", "below_min", "grow"):
        sys.exit(__doc__)
    sep = argv.index("--")
    head, command = argv[1:sep], argv[sep + 1:]
    if argv[0] == "kill" and len(head) == 2:
        run_kill(int(head[0]), int(head[1]), command)
    elif argv[0] == "below_min" and len(head) == 1:
        run_below_min(int(head[0]), command)
    elif argv[0] == "grow" and len(head) == 1:
        run_grow(int(head[0]), command)
    else:
        sys.exit(__doc__)
    print("passed")


if __name__ == "__main__":
    main()

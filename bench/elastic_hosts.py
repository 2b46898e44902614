#!/usr/bin/python3
"""bench/elastic_hosts.py - how long an elastic job on the two pretend hosts (tests/hosts/cfxhosts)
takes to train again after losing a host's workers, and to train on a host the discovery script
adds; a markdown table of two rows on stdout (the elastic rows of the bench/hosts table).

    bench/elastic_hosts.py [--build-dir DIR] [--repeats N] [--out DIR]

Each repeat runs tests/elastic/test_elastic_train.py inside cfxhosts (hosts a and b), which runs
cfxrun --elastic with a Horovod elastic script (torch) and checks the final parameters against a
single-process reference, so a timing comes only from a run that trained correctly:
  - kill: 4 workers (a:2, b:2); both of b's are SIGKILLed at epoch 1, batch 3. The time from
    their death to the first step the survivors complete in their new world (rank 0's clock).
  - grow: 2 workers on a; rank 0 adds b:1 to the discovery script's hosts at epoch 1, batch 0.
    The time from that line being written to the newcomer's first completed step on b: the
    discovery period (1 s), the start through the agent, Python and torch loading, its hello,
    the next commit, the membership round and the state's broadcast.
Repeats alternate the two (N of each, default 3); the table gives the median and the range.
The logs go to OUT (default: a new folder under /tmp). Needs root (namespaces): without it,
says so and exits 77. Python 3 standard library only.
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CFXHOSTS = os.path.join(ROOT, "tests", "hosts", "cfxhosts")
TEST = os.path.join(ROOT, "tests", "elastic", "test_elastic_train.py")
PYTHON = os.path.join(ROOT, ".venv", "bin", "python")  # the project's Python environment
SKIP = 77
ROWS = (("kill", "lost-to-training",
         "lost worker → training again (b's 2 of 4 workers SIGKILLed mid-epoch)"),
        ("grow", "new-host-to-training",
         "new host → its worker training (b:1 added by the discovery script to a:2)"))


def parse_args(argv):
    opts = {"build": os.path.join(ROOT, "build"), "repeats": 3, "out": None}
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag in ("-h", "--help"):
            sys.stdout.write(__doc__)
            sys.exit(0)
        if flag not in ("--build-dir", "--repeats", "--out") or i + 1 >= len(argv):
            sys.exit("bench/elastic_hosts.py: unknown option or missing value: %s (see --help)" % flag)
        value = argv[i + 1]
        if flag == "--repeats":
            if not value.isdigit() or int(value) < 1:
                sys.exit("bench/elastic_hosts.py: --repeats needs a positive integer, not %r" % value)
            opts["repeats"] = int(value)
        else:
            opts["build" if flag == "--build-dir" else "out"] = value
        i += 2
    package = os.path.join(opts["build"], "python", "conflux")
    if not os.path.isdir(package):
        sys.exit("bench/elastic_hosts.py: no Python package in %s (build with the Python binding, "
                 "or give --build-dir)" % package)
    return opts


def one_run(mode, opts, log):
    """Runs the test `mode` once on the hosts; its measured seconds, by name."""
    env = dict(os.environ, PYTHONPATH=os.path.join(opts["build"], "python"),
               PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([PYTHON, CFXHOSTS, "--hosts", "a,b", "--timeout", "280", "--",
                        PYTHON, TEST, "--hosts", "a,b", mode], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    with open(log, "w") as f:
        f.write(r.stdout)
    if r.returncode == SKIP:
        reason = re.search(r"SKIP: (.*)", r.stdout)
        print("bench/elastic_hosts.py: SKIP: %s" % (reason.group(1) if reason else r.stdout.strip()))
        sys.exit(SKIP)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-3000:])
        sys.exit("bench/elastic_hosts.py: the %s run failed (exit %d); log: %s"
                 % (mode, r.returncode, log))
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^elastic-time: (\S+) ([0-9.]+)$", r.stdout, re.M)}


def main():
    opts = parse_args(sys.argv[1:])
    out = opts["out"] or tempfile.mkdtemp(prefix="cfx-elastic-bench-")
    os.makedirs(out, exist_ok=True)
    seconds = {name: [] for _, name, _ in ROWS}
    for rep in range(opts["repeats"]):
        for mode, name, _ in ROWS:
            got = one_run(mode, opts, os.path.join(out, "%s%d.log" % (mode, rep + 1)))
            if name not in got:
                sys.exit("bench/elastic_hosts.py: the %s run printed no %s time; log in %s"
                         % (mode, name, out))
            seconds[name].append(got[name])
    print("| elastic job on hosts a,b (cfxrun --elastic, torch) | median s | range s | runs |")
    print("|---|---|---|---|")
    for _, name, label in ROWS:
        v = seconds[name]
        print("| %s | %.2f | %.2f-%.2f | %d |" % (label, statistics.median(v), min(v), max(v), len(v)))
    sys.stderr.write("bench/elastic_hosts.py: logs in %s\n" % out)


if __name__ == "__main__":
    main()

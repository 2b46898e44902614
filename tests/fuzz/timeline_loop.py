#!/usr/bin/python3
"""A Python-level fuzz loop over the timeline summariser (tools/cfx-timeline), by hand:

    /usr/bin/python3 tests/fuzz/timeline_loop.py [--iterations N] [--seed S] [--out DIR]

Seeds are synthetic per-rank timelines (tests/observe/synth.py); each iteration mutates one, at
the event level (a field deleted or given a value of another type, an event dropped or repeated)
or the byte level (bytes changed, cut, inserted), and runs the summariser on it (--json). The
tool may refuse an input (a message and exit status 1, or argparse's exit); any other exception,
or a run longer than --limit seconds, is a finding. Findings are grouped by exception and place,
with one input each written to DIR.
Exit status 1 when there are findings. ctest runs 400 inputs of seed 1 (fuzz.timeline_loop)."""
import argparse
import collections
import contextlib
import io
import json
import os
import random
import signal
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "tests", "observe"))
import synth  # noqa: E402
from cfx_timeline import main as summarise  # noqa: E402

VALUES = [None, "x", "", -1, 0, 1e308, -1e308, float("nan"), float("inf"), [], {}, True, 2**70,
          "ALLREDUCE"]
KEYS = ["ts", "dur", "ph", "pid", "tid", "name", "args", "cat"]


def seeds():
    out = []
    for kw in (dict(nranks=2, steps=12), dict(nranks=3, steps=10, metrics_every=3),
               dict(nranks=2, steps=10, stall=(5, 1, 5000.0))):
        out.extend(synth.training(**kw).events.values())
    return out


def mutate_events(rng, events):
    events = json.loads(json.dumps(events))
    for _ in range(rng.randint(1, 4)):
        e = rng.choice(events)
        key = rng.choice(list(e) + KEYS)
        op = rng.random()
        if op < 0.2 and key in e:
            del e[key]
        elif op < 0.3 and len(events) > 1:
            events.remove(e)
        elif op < 0.4:
            events.append(json.loads(json.dumps(e)))
        else:
            e[key] = rng.choice(VALUES)
    return json.dumps(events)


def mutate_bytes(rng, text):
    b = bytearray(text.encode())
    for _ in range(rng.randint(1, 8)):
        if not b:
            break
        i, op = rng.randrange(len(b)), rng.random()
        if op < 0.4:
            b[i] = rng.randrange(256)
        elif op < 0.6:
            del b[i:i + rng.randint(1, 20)]
        elif op < 0.8:
            b[i:i] = rng.choice([b"[", b"]", b",", b"{", b"}", b'"', b"\n", b"-1", b"1e999"])
        else:
            del b[i:]
    return bytes(b).decode("utf-8", errors="replace")


class TooSlow(Exception):
    pass


def too_slow(signum, frame):
    raise TooSlow()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="where findings go (default: a new temporary folder, removed "
                    "when there are none)")
    ap.add_argument("--limit", type=float, default=10.0, help="seconds one input may take")
    a = ap.parse_args()
    made_out = a.out is None
    if made_out:
        a.out = tempfile.mkdtemp(prefix="cfx-timeline-fuzz-")
    signal.signal(signal.SIGALRM, too_slow)
    rng = random.Random(a.seed)
    pool = seeds()
    found, example = collections.Counter(), {}
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "input.json")
    for _ in range(a.iterations):
        events = rng.choice(pool)
        text = mutate_events(rng, events) if rng.random() < 0.6 else mutate_bytes(rng, json.dumps(events))
        with open(path, "w") as f:
            f.write(text)
        signal.setitimer(signal.ITIMER_REAL, a.limit)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                summarise([path, "--json"])
        except SystemExit:
            pass
        except Exception as e:  # noqa: BLE001: any other exception is what this loop looks for
            frames = traceback.extract_tb(e.__traceback__)
            slow = isinstance(e, TooSlow)
            last = frames[-2] if slow and len(frames) > 1 else frames[-1]  # not the handler
            what = "over %gs" % a.limit if slow else type(e).__name__
            key = "%s at %s:%d" % (what, os.path.basename(last.filename), last.lineno)
            found[key] += 1
            example.setdefault(key, (str(e)[:100], text))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    os.remove(path)
    if made_out and not found:
        os.rmdir(a.out)
    print("timeline_loop: %d inputs, %d findings in %d places" % (a.iterations, sum(found.values()),
                                                                 len(found)))
    for i, (key, n) in enumerate(found.most_common()):
        name = os.path.join(a.out, "finding-%d.json" % i)
        with open(name, "w") as f:
            f.write(example[key][1])
        print("%6d  %s: %s  (input: %s)" % (n, key, example[key][0], name))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Checks Conflux timeline files with tools/cfx-timeline's own loader (used by the unit and mpirun
tests): every tensor has every phase, the coordinator marked every rank ready, counts match.

    tlcheck.py --ranks N [--tensors K] [--occurrences M] [--allow-open] FILE...

--allow-open: files may lack the closing bracket (a killed job); without it they must have it.
Exit status 0 when every check holds; the failures are printed otherwise."""
import argparse
import importlib.machinery
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.normpath(os.path.join(HERE, "..", "..", "tools"))
TOOL = os.path.join(TOOLS, "cfx-timeline")
# The tool as the tests run it: under the interpreter running the test (the project's environment,
# where matplotlib is pinned for --png), not its shebang's /usr/bin/python3, which may lack it.
COMMAND = [sys.executable, TOOL]


def load_package():
    """tools/cfx_timeline, the library behind the command."""
    if TOOLS not in sys.path:
        sys.path.insert(0, TOOLS)
    import cfx_timeline
    return cfx_timeline


def load_tool():
    """The command's file loaded as a module (it re-exports the library)."""
    loader = importlib.machinery.SourceFileLoader("cfx_timeline", TOOL)
    spec = importlib.util.spec_from_loader("cfx_timeline", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--tensors", type=int)
    ap.add_argument("--occurrences", type=int, help="submissions per tensor, summed over ranks")
    ap.add_argument("--min-occurrences", type=int, default=1)
    ap.add_argument("--allow-open", action="store_true")
    ap.add_argument("--no-ready", action="store_true", help="do not require the ready marks")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    t = load_tool()
    bad = []
    events = []
    for f in a.files:
        got = t.load(f)
        events += got.events
        if not got.had_bracket and not a.allow_open:
            bad.append("%s: no closing bracket" % f)
    s = t.analyze(events)
    if s["ranks"] != list(range(a.ranks)):
        bad.append("ranks %s, expected 0..%d" % (s["ranks"], a.ranks - 1))
    if a.tensors is not None and len(s["tensors"]) != a.tensors:
        bad.append("%d tensors, expected %d: %s" % (len(s["tensors"]), a.tensors,
                                                     [x["name"] for x in s["tensors"]]))
    for x in s["tensors"]:
        if x["phases"] != t.PHASES:
            bad.append("tensor %r has phases %s" % (x["name"], x["phases"]))
        if not a.no_ready and x["ready_ranks"] != list(range(a.ranks)):
            bad.append("tensor %r has ready marks for ranks %s" % (x["name"], x["ready_ranks"]))
        if a.occurrences is not None and x["occurrences"] != a.occurrences:
            bad.append("tensor %r: %d occurrences, expected %d" % (x["name"], x["occurrences"],
                                                                   a.occurrences))
        if x["occurrences"] < a.min_occurrences:
            bad.append("tensor %r: %d occurrences" % (x["name"], x["occurrences"]))
    for b in bad[:20]:
        print("tlcheck: " + b)
    print("tlcheck: %d events, %d tensors, %d steps: %s" % (s["events"], len(s["tensors"]),
                                                         len(s["steps"]), "FAIL" if bad else "ok"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""cfx-timeline: load, merge, summarise and picture Conflux timelines (docs/timeline.md).

    cfx-timeline FILE...                   summary: steps, where a step's time goes, other tensors
    cfx-timeline FILE... --png out.png     the picture: the median steady-state step as a Gantt
                                           chart (a band per rank), the step time over the run,
                                           where an iteration's time goes
    cfx-timeline FILE... --merge out.json  one valid JSON file of all ranks (Perfetto,
                                           chrome://tracing)
    cfx-timeline FILE... --json            the summary as JSON

FILE is a per-rank timeline (tl.rank0.json, ...) or a merged one. A file may lack its closing
bracket (the job was killed, or is still running) and its last record may be cut short (killed in
the middle of a write): the loader accepts both, drops the cut record and says so.
"""
import argparse
import json
import os
import re
import sys

from .load import load_all, merge
from .steps import GRADSET_LANES
from .summary import Analysis, print_summary, summarize


def parse(argv):
    ap = argparse.ArgumentParser(prog="cfx-timeline", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    ap.add_argument("files", nargs="+", help="timeline files (one per rank, or merged)")
    ap.add_argument("--png", metavar="OUT", help="write the picture of a typical step (PNG)")
    ap.add_argument("--step", type=int, metavar="K",
                    help="picture step K instead of the median steady-state step")
    ap.add_argument("--merge", metavar="OUT", help="write all files as one valid JSON array")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    ap.add_argument("--top", type=int, default=10, help="tensors listed (default 10)")
    ap.add_argument("--steps", action="store_true", help="list every step (default: a selection)")
    ap.add_argument("--step-tensors", metavar="NAME,...",
                    help="the tensors that make a step (default: found from the data)")
    ap.add_argument("--gradset-lanes", metavar="REGEX", default=GRADSET_LANES,
                    help="the lanes of a gradient set's buckets match REGEX (default %s; '' for "
                         "none)" % GRADSET_LANES.replace("%", "%%"))
    a = ap.parse_args(argv)
    if a.top < 0:
        ap.error("--top must be >= 0")
    try:
        re.compile(a.gradset_lanes)
    except re.error as e:
        ap.error("--gradset-lanes %r is not a regular expression: %s" % (a.gradset_lanes, e))
    return a


def main(argv=None):
    a = parse(argv)
    try:
        events, notes = load_all(a.files)
    except (OSError, ValueError) as e:
        sys.stderr.write("cfx-timeline: %s\n" % e)
        return 1
    for n in notes:
        sys.stderr.write("cfx-timeline: %s\n" % n)
    if a.merge:
        merge(a.files, a.merge)
    names = [n.strip() for n in a.step_tensors.split(",") if n.strip()] if a.step_tensors else None
    try:
        an = Analysis(events, a.gradset_lanes or None, names)
    except ValueError as e:
        sys.stderr.write("cfx-timeline: %s\n" % e)
        return 1
    s = summarize(an)
    if a.png:
        if a.step is not None and not 0 <= a.step < len(an.steps.steps):
            sys.stderr.write("cfx-timeline: --step %d: the timeline has steps 0..%d\n"
                             % (a.step, len(an.steps.steps) - 1))
            return 1
        from .picture import render
        try:
            render(an, a.png, a.step)
        except ValueError as e:
            sys.stderr.write("cfx-timeline: --png: %s\n" % e)
            return 1
    try:
        if a.json:
            json.dump(s, sys.stdout, indent=1)
            sys.stdout.write("\n")
        else:
            print_summary(s, a.top, a.steps)
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. piped into head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0

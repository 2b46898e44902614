"""The summary: steps (from the step finder), where a steady-state step's time goes (critical path),
the slowest rank, the tensors outside the step, phase totals and the top tensors. Times in µs."""
import sys
from collections import defaultdict

from . import critical
from .model import OVERFLOW_LANE, PHASES, build
from .steps import GRADSET_LANES, find_steps, median, quantile, union_length

PATH_SAMPLE = 64  # steady-state steps whose critical path is traced for the shares (spread out)


def sample(indices, n=PATH_SAMPLE):
    if len(indices) <= n:
        return list(indices)
    return [indices[(i * (len(indices) - 1)) // (n - 1)] for i in range(n)]


class Analysis:
    """The timeline, its steps and the critical paths: what the text, JSON and picture share."""

    def __init__(self, events, gradset_lanes=GRADSET_LANES, step_names=None):
        self.tl = build(events)
        self.steps = find_steps(self.tl, gradset_lanes, step_names)
        self._paths = {}
        self.path_steps = sample(self.steps.steady)

    def path(self, k):
        if k not in self._paths:
            self._paths[k] = critical.critical_path(self.tl, self.steps.step(k))
        return self._paths[k]

    def shares(self):
        """kind -> µs over the sampled steady-state steps, and their total time: each step's
        critical path, plus "between" (from its last completion to the next step's first
        submission: the framework's forward pass, optimizer, ...) when a step follows it."""
        ks = self.path_steps
        tot = critical.shares([self.path(k) for k in ks])
        total = 0.0
        for k in ks:
            wall = self.steps.step(k).wall
            period = self.steps.period(k)
            between = max(0.0, period - wall) if period is not None else 0.0
            tot["between"] += between
            total += wall + between
        return tot, total


def _phase_union(occs, ranks):
    """phase -> the union of its slices on a rank, averaged over `ranks`."""
    per = defaultdict(list)
    for o in occs:
        for ph, s in o.slices.items():
            per[(o.rank, ph)].append((s.t0, s.t1))
    n = max(len(ranks), 1)
    return {ph: sum(union_length(per.get((r, ph), [])) for r in ranks) / n for ph in PHASES}


def summarize(an):
    """The summary as a dict (times in µs); the --json output."""
    tl, st = an.tl, an.steps
    every = [o for occs in tl.occurrences.values() for o in occs]
    tensors = []
    by_name = defaultdict(list)
    for o in every:
        by_name[o.tensor].append(o)
    step_set = set(st.names)
    for n, occs in by_name.items():
        ph_us = {ph: sum(o.slices[ph].t1 - o.slices[ph].t0 for o in occs if ph in o.slices)
                 for ph in PHASES}
        seen = set(ph for o in occs for ph in o.slices)
        tensors.append({
            "name": n, "occurrences": len(occs),
            "total_us": sum(o.end - o.submit for o in occs), "phase_us": ph_us,
            "phases": [ph for ph in PHASES if ph in seen],
            "ready_ranks": sorted(r for r in tl.ready_marks.get(n, ()) if r is not None),
            "role": "step" if n in step_set else ("overflow" if n == OVERFLOW_LANE else "other"),
            "failures": sum(len(o.marks) for o in occs)})
    tensors.sort(key=lambda x: (-x["total_us"], x["name"]))
    steps = []
    for s in st.steps:
        steps.append({"step": s.index, "wall_us": s.wall, "start_us": s.start,
                      "period_us": st.period(s.index),
                      "complete": s.complete, "warmup": s.index < st.warmup,
                      "ranks": s.ranks, "missing": {str(r): v for r, v in s.missing.items()},
                      "slowest_rank": s.slowest_rank(),
                      "phase_us": _phase_union([o for per in s.occ.values() for o in per.values()],
                                               s.ranks)})
    walls = st.steady_walls()
    periods = [p for p in (st.period(k) for k in st.steady) if p is not None]
    out = {
        "ranks": tl.ranks, "events": tl.events, "duplicates_dropped": tl.duplicates,
        "malformed_dropped": tl.malformed,
        "cycles": tl.cycles, "capped": tl.capped,
        "phase_totals_us": _phase_union(every, tl.ranks),
        "step_finder": {"source": st.source, "names": st.names, "count": len(st.steps),
                        "per_rank_steps": {str(r): n for r, n in st.per_rank_steps.items()},
                        "warmup_steps": st.warmup, "steady_steps": len(st.steady),
                        "partial_steps": [s.index for s in st.steps if not s.complete]},
        "steps": steps,
        "others": [{"name": o.name, "count": o.count, "period_steps": o.period(),
                    "after_steps": o.after_steps, "where": o.describe()} for o in st.others],
        "tensors": tensors,
    }
    if walls:
        out["steady_wall_us"] = {"median": median(walls), "p10": quantile(walls, 0.1),
                                 "p90": quantile(walls, 0.9), "min": min(walls), "max": max(walls)}
    if periods:
        out["steady_period_us"] = {"median": median(periods), "p10": quantile(periods, 0.1),
                                   "p90": quantile(periods, 0.9)}
    if st.median is not None:
        m = st.step(st.median)
        path = an.path(st.median)
        slow = m.slowest_rank()
        out["median_step"] = {
            "step": m.index, "wall_us": m.wall, "slowest_rank": slow,
            "slowest_lateness_us": m.mean_lateness(slow),
            "waited_for_slowest_us": {str(r): m.waited_for(r) for r in m.ranks if r != slow},
            "critical_path": [{"rank": s.rank, "t0_us": s.t0 - m.start, "t1_us": s.t1 - m.start,
                               "kind": s.kind, "tensor": s.tensor} for s in path],
            "critical_path_by_rank_us": {str(r): v for r, v in critical.time_by_rank(path).items()}}
        tot, wall = an.shares()
        out["critical_path_shares"] = {"steps": len(an.path_steps), "total_us": wall, "us": tot}
        slow_count = defaultdict(int)
        for k in st.steady:
            slow_count[st.step(k).slowest_rank()] += 1
        out["slowest_rank_counts"] = {str(r): c for r, c in sorted(slow_count.items())}
    return out


def analyze(events, gradset_lanes=GRADSET_LANES, step_names=None):
    """The summary dict of a list of trace events."""
    return summarize(Analysis(events, gradset_lanes, step_names))


def _ms(us):
    return us / 1000.0


def print_summary(s, top=10, all_steps=False, out=sys.stdout):
    w = out.write
    sf = s["step_finder"]
    w("ranks %s, %d events, %d cycle marks\n" % (s["ranks"], s["events"], s["cycles"]))
    if s["malformed_dropped"]:
        w("(%d malformed events set aside: fields missing or of the wrong type)\n"
          % s["malformed_dropped"])
    if s["duplicates_dropped"]:
        w("(%d duplicate events dropped: a merged file given with its parts?)\n"
          % s["duplicates_dropped"])
    if s["capped"]:
        w("(a file reached its size cap: later events were dropped)\n")
    names = sf["names"]
    shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    if names:
        w("\nsteps: %d, found from %s: %d tensor(s) (%s)\n" % (sf["count"], sf["source"],
                                                                len(names), shown))
    else:
        w("\nsteps: none (no tensor events)\n")
    prs = sf["per_rank_steps"]
    if len(set(prs.values())) > 1:
        w("  uneven ranks: steps per rank %s\n"
          % ", ".join("rank %s %d" % kv for kv in prs.items()))
    if sf["partial_steps"]:
        p = sf["partial_steps"]
        w("  partial steps (some rank missing): %d (%s%s)\n"
          % (len(p), ", ".join(map(str, p[:8])), ", ..." if len(p) > 8 else ""))
    if sf["warmup_steps"]:
        w("  warm-up: %s\n" % ("step 0" if sf["warmup_steps"] == 1 else
                               "steps 0-%d" % (sf["warmup_steps"] - 1)))
    if "steady_wall_us" in s:
        v = s["steady_wall_us"]
        w("  steady state: %d steps; first submission to last completion (ms): median %.3f, "
          "p10 %.3f, p90 %.3f, max %.3f\n" % (sf["steady_steps"], _ms(v["median"]), _ms(v["p10"]),
                                             _ms(v["p90"]), _ms(v["max"])))
    if "steady_period_us" in s:
        v = s["steady_period_us"]
        w("  iteration (one step's first submission to the next's, ms): median %.3f, p10 %.3f, "
          "p90 %.3f\n" % (_ms(v["median"]), _ms(v["p10"]), _ms(v["p90"])))
    if "median_step" in s:
        m = s["median_step"]
        w("\nmedian step: step %d, %.3f ms\n" % (m["step"], _ms(m["wall_us"])))
        if len(s["ranks"]) > 1:
            waits = ", ".join("rank %s %.3f ms" % (r, _ms(v))
                              for r, v in m["waited_for_slowest_us"].items())
            w("  slowest rank %s: submitted %.3f ms after the first rank (mean over tensors); "
              "waiting for it: %s\n" % (m["slowest_rank"], _ms(m["slowest_lateness_us"]), waits))
            w("  slowest rank over the steady state: %s\n" % ", ".join(
                "rank %s in %d steps" % kv for kv in s["slowest_rank_counts"].items()))
        sh = s["critical_path_shares"]
        w("  where an iteration's time goes (critical path, %d steady-state steps):\n"
          % sh["steps"])
        for k in critical.KINDS:
            if sh["total_us"] > 0:
                w("    %-28s %5.1f %%\n" % (critical.KIND_LABEL[k],
                                           100.0 * sh["us"][k] / sh["total_us"]))
    if s["others"]:
        w("\ntensors outside the step:\n")
        groups = {}  # tensors that recur alike are listed once
        for o in s["others"]:
            groups.setdefault(o["where"], []).append(o["name"])
        for where, names in groups.items():
            more = "" if len(names) == 1 else " and %d more" % (len(names) - 1)
            w("  %-40s %s\n" % (names[0][:40 - len(more)] + more, where))
    w("\nphase totals (ms, union over tensors, mean over ranks):\n")
    for ph in PHASES:
        w("  %-10s %12.3f\n" % (ph, _ms(s["phase_totals_us"][ph])))
    rows = s["steps"]
    if not all_steps and len(rows) > 12:
        keep = set(r["step"] for r in rows if r["warmup"])
        keep |= set(r["step"] for r in sorted((r for r in rows if not r["warmup"]),
                                              key=lambda r: -r["wall_us"])[:5])
        if "median_step" in s:
            keep.add(s["median_step"]["step"])
        keep.add(rows[-1]["step"])
        rows = [r for r in rows if r["step"] in keep]
        title = "steps (ms): warm-up, the 5 slowest, the median, the last; --steps lists all"
    else:
        title = "steps (ms)"
    w("\n%s:\n  %5s %10s" % (title, "step", "wall") + "".join(" %10s" % p for p in PHASES) +
      "  slowest note\n")
    for r in rows:
        note = "warm-up" if r["warmup"] else ("partial" if not r["complete"] else "")
        if "median_step" in s and r["step"] == s["median_step"]["step"]:
            note = "median"
        w("  %5d %10.3f" % (r["step"], _ms(r["wall_us"])) +
          "".join(" %10.3f" % _ms(r["phase_us"][p]) for p in PHASES) +
          "  %7s %s\n" % (r["slowest_rank"], note))
    w("\ntop %d tensors by time (ms, summed over ranks and submissions):\n" % top)
    w("  %-40s %5s %6s %10s" % ("tensor", "n", "role", "total") +
      "".join(" %10s" % p for p in PHASES) + "\n")
    for t in s["tensors"][:top]:
        w("  %-40s %5d %6s %10.3f" % (t["name"][:40], t["occurrences"], t["role"][:6],
                                       _ms(t["total_us"])) +
          "".join(" %10.3f" % _ms(t["phase_us"][p]) for p in PHASES) + "\n")

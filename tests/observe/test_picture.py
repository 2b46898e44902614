#!/usr/bin/python3
"""The picture of tools/cfx-timeline --png: its Gantt chart shows the events' own intervals.

    test_picture.py                 synthetic timelines (synth.py), and the command end to end
    test_picture.py FILE...         the same checks on real timeline files (the mpirun test)

Checked against the events as written in the files (read here with json, not with the tool's
model): every row of every rank band holds exactly that tensor's slices of the pictured step, in
ms from the step's start; the drawn rectangles (the figure's collections, read back from
matplotlib) are those intervals, on that row; grouped rows (more tensors than rows) hold the union
of their tensors' intervals; the critical-path strips tile the step. Exit status 77 (ctest: skipped)
with the reason when matplotlib is missing."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synth  # noqa: E402
import tlcheck  # noqa: E402

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:
    print("skipped: matplotlib is missing (Debian: python3-matplotlib; tools/install-deps): %s" % e)
    sys.exit(77)

cfx = tlcheck.load_package()
from cfx_timeline import picture  # noqa: E402

MS = 1e-3
TOL = 1e-6  # ms


def raw_slices(events):
    """(rank, tensor) -> [(phase, t0, t1) in file order], straight from the events."""
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    out = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in cfx.PHASES:
            key = (e["pid"], lanes[(e["pid"], e["tid"])])
            t0 = float(e["ts"])
            out.setdefault(key, []).append((e["cat"], t0, t0 + float(e["dur"])))
    return out


def raw_occurrence(raw, rank, tensor, index):
    """{phase: (t0, t1)} of the index-th submission: the index-th QUEUED slice and what follows
    it on the lane (these files start every submission with QUEUED)."""
    seq = raw[(rank, tensor)]
    starts = [i for i, (ph, _, _) in enumerate(seq) if ph == "queued"]
    a = starts[index]
    b = starts[index + 1] if index + 1 < len(starts) else len(seq)
    return {ph: (t0, t1) for ph, t0, t1 in seq[a:b]}


def union(iv):
    """Disjoint intervals covering `iv`, by a sweep over the end points (a count of the intervals
    open at each point)."""
    points = sorted([(a, 0) for a, _ in iv] + [(b, 1) for _, b in iv])  # starts before ends
    out, depth, start = [], 0, None
    for x, kind in points:
        if kind == 0:
            if depth == 0:
                start = x
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                out.append((start, x))
    return out


def drawn(fig):
    """gid -> [(x0, x1, y0, y1)] of every PolyCollection the picture drew."""
    from matplotlib.collections import PolyCollection
    out = {}
    for ax in fig.axes:
        for c in ax.collections:
            if isinstance(c, PolyCollection) and c.get_gid():
                rects = []
                for p in c.get_paths():
                    v = p.vertices
                    rects.append((v[:, 0].min(), v[:, 0].max(), v[:, 1].min(), v[:, 1].max()))
                out[c.get_gid()] = rects
    return out


class Checks:
    """The checks, on any events (synthetic or real)."""

    def check(self, events, max_rows=picture.MAX_ROWS, k=None):
        an = cfx.Analysis(events)
        st = an.steps
        k = st.median if k is None else k
        self.assertIsNotNone(k, "no steady-state step")
        step = st.step(k)
        raw = raw_slices(events)
        rows = picture.gantt_rows(step, max_rows)
        self.assertEqual(sorted(rows), sorted(step.ranks))
        for r, rr in rows.items():
            names = [n for row in rr for n in row.names]
            self.assertEqual(sorted(names), sorted(st.names))  # every step tensor once
            subs = {n: raw_occurrence(raw, r, n, k)["queued"][0] for n in names}
            self.assertEqual(names, sorted(names, key=lambda n: (subs[n], n)))  # submission order
            for row in rr:
                want = {}
                for n in row.names:
                    for ph, iv in raw_occurrence(raw, r, n, k).items():
                        want.setdefault(ph, []).append(iv)
                if len(row.names) > 1:
                    want = {ph: union(iv) for ph, iv in want.items()}
                self.assertEqual({ph: sorted(v) for ph, v in row.bars.items()},
                                 {ph: sorted(v) for ph, v in want.items()},
                                 "rank %s row %s" % (r, row.label))
        # the figure: rectangles drawn = the rows' intervals, at the rows' heights
        fig = plt.figure(figsize=(12, 6))
        ax = fig.add_subplot(111)
        picture.draw_gantt(ax, an, k, max_rows)
        pos, _ = picture._layout(step.ranks, rows)
        got = drawn(fig)
        origin = step.start
        for r, rr in rows.items():
            for ph in cfx.PHASES:
                want = []
                for row, (y, h) in zip(rr, pos[r]["rows"]):
                    want += [((a - origin) * MS, (b - origin) * MS, y, y + h)
                             for a, b in row.bars.get(ph, [])]
                have = got.get("gantt rank=%s phase=%s" % (r, ph), [])
                self.assertEqual(len(have), len(want), "rank %s %s" % (r, ph))
                for (x0, x1, y0, y1), (a, b, ya, yb) in zip(sorted(have), sorted(want)):
                    self.assertAlmostEqual(x0, a, delta=TOL)
                    self.assertAlmostEqual(x1, b, delta=TOL)
                    self.assertTrue(ya - TOL <= y0 < y1 <= yb + TOL, "rank %s %s: row" % (r, ph))
        # the critical-path strips: the path's segments, tiling the step
        path = an.path(k)
        strip = []
        for gid, rects in got.items():
            if gid.startswith("path "):
                strip += [(x0, x1) for x0, x1, _, _ in rects]
        strip.sort()
        self.assertAlmostEqual(strip[0][0], 0.0, delta=TOL)
        self.assertAlmostEqual(strip[-1][1], step.wall * MS, delta=TOL)
        for (a0, a1), (b0, b1) in zip(strip, strip[1:]):
            self.assertAlmostEqual(a1, b0, delta=TOL)
        self.assertEqual(len(strip), len(path))
        plt.close(fig)
        return an


class Picture(unittest.TestCase, Checks):
    def test_gantt_equals_events(self):
        job = synth.training(nranks=3, steps=30, metrics_every=5, offsets={1: 40.0, 2: 15.0})
        an = self.check(job.all_events())
        # and the independent truth of the generator agrees with the file's events
        k = an.steps.median
        for r, n, i, ph, a, b in job.truth:
            if i == k and n in an.steps.names:
                o = an.steps.step(k).occ[r][n]
                self.assertEqual((o.slices[ph].t0, o.slices[ph].t1), (a, b))

    def test_grouped_rows(self):
        grads = tuple("w%02d" % i for i in range(23))
        job = synth.training(nranks=2, steps=8, grads=grads)
        self.check(job.all_events(), max_rows=5)  # 23 tensors in 5 rows of 5

    def test_a_stalled_step(self):
        job = synth.training(nranks=2, steps=12, stall=(6, 1, 8000.0))
        an = self.check(job.all_events(), k=6)
        self.assertEqual(an.steps.step(6).slowest_rank(), 1)

    def test_robust_scale(self):
        walls = [10.0] * 50 + [11.0] * 50 + [5000.0]
        top = picture.robust_top(walls)
        self.assertLess(top, 100.0)  # the one stall does not flatten the rest
        self.assertGreater(top, 11.0)

    def test_command(self):
        job = synth.training(nranks=2, steps=20, metrics_every=5)
        with tempfile.TemporaryDirectory() as d:
            files = job.files(d)
            png = os.path.join(d, "steps.png")
            r = subprocess.run(tlcheck.COMMAND + files + ["--png", png], capture_output=True,
                               text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            self.assertIn("steps: 20, found from the tensor set that repeats most", r.stdout)
            self.assertIn("4 times, every 5 steps", r.stdout)
            r = subprocess.run(tlcheck.COMMAND + files + ["--png", png, "--step", "20"],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 1)
            self.assertIn("--step 20: the timeline has steps 0..19", r.stderr)
            r = subprocess.run(tlcheck.COMMAND + [os.path.join(d, "missing.json")],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 1)
            self.assertIn("missing.json", r.stderr)
            r = subprocess.run(tlcheck.COMMAND + files + ["--json"], capture_output=True, text=True)
            s = json.loads(r.stdout)
            self.assertEqual(s["step_finder"]["count"], 20)


def check_files(paths):
    """The checks on real timeline files; True when they hold."""
    class Files(unittest.TestCase, Checks):
        def test_files(self):
            events = []
            for p in paths:
                events += cfx.load(p).events
            an = self.check(events)
            print("picture of step %d of %d, %d ranks, %d tensors per step: ok"
                  % (an.steps.median, len(an.steps.steps), len(an.tl.ranks), len(an.steps.names)))
    suite = unittest.TestLoader().loadTestsFromTestCase(Files)
    return unittest.TextTestRunner(verbosity=1).run(suite).wasSuccessful()


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        sys.exit(0 if check_files(sys.argv[1:]) else 1)
    unittest.main(verbosity=1)

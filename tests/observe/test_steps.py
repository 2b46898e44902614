#!/usr/bin/python3
"""The step finder of tools/cfx-timeline on synthetic timelines (synth.py): metrics every N steps,
broadcasts before the first step and a tensor after the last, uneven ranks, a stalled rank, a
rank that stops inside the last step, warm-up, a gradient set's lanes, the engine's NEGOTIATE that
starts before QUEUED ends; and the critical path, which must cover each step exactly once.
Expected values come from how the synthetic job was built, never from the tool."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synth  # noqa: E402
import tlcheck  # noqa: E402

cfx = tlcheck.load_package()
GRADS = ("g3", "g2", "g1", "g0")


def analysis(job, **kw):
    return cfx.Analysis(job.all_events(), **kw)


def truth_occurrence(job, rank, name, index):
    """{phase: (t0, t1)} of one submission, from the job's own record."""
    return {ph: (a, b) for r, n, i, ph, a, b in job.truth if (r, n, i) == (rank, name, index)}


class StepFinder(unittest.TestCase):
    def test_metrics_every_n_steps(self):
        job = synth.training(nranks=2, steps=40, metrics_every=8)
        an = analysis(job)
        st = an.steps
        self.assertEqual(sorted(st.names), sorted(GRADS))
        self.assertEqual(st.names, list(GRADS))  # submission order
        self.assertEqual(len(st.steps), 40)
        self.assertTrue(all(s.complete for s in st.steps))
        others = {o.name: o for o in st.others}
        self.assertEqual(sorted(others), ["bcast.b", "bcast.w", "final", "metrics"])
        m = others["metrics"]
        self.assertEqual(m.count, 5)
        self.assertEqual(m.period(), 8)
        self.assertEqual(m.after_steps, [8, 16, 24, 32, 40])  # after steps 7, 15, ...
        self.assertIn("every 8 steps", m.describe())
        self.assertEqual(others["bcast.w"].after_steps, [0])
        self.assertEqual(others["bcast.w"].describe(), "once, before step 0")
        self.assertEqual(others["final"].describe(), "once, after step 39")
        # step k on each rank is that rank's k-th submission of each gradient
        for k in (0, 17, 39):
            for r in (0, 1):
                for g in GRADS:
                    o = st.step(k).occ[r][g]
                    want = truth_occurrence(job, r, g, k)
                    self.assertEqual({p: (s.t0, s.t1) for p, s in o.slices.items()}, want)

    def test_metrics_as_often_as_half_the_steps(self):
        # every 2nd step: still far below the step count, still not part of the step
        job = synth.training(nranks=2, steps=20, metrics_every=2)
        st = analysis(job).steps
        self.assertEqual(sorted(st.names), sorted(GRADS))
        self.assertEqual({o.name: o.count for o in st.others}["metrics"], 10)

    def test_uneven_ranks(self):
        # rank 2 stops after 27 of 30 steps; ranks submit with different offsets
        job = synth.training(nranks=3, steps=30, uneven={2: 27}, offsets={0: 0.0, 1: 7.0, 2: 3.0})
        an = analysis(job)
        st = an.steps
        self.assertEqual(len(st.steps), 30)
        self.assertEqual(st.per_rank_steps, {0: 30, 1: 30, 2: 27})
        partial = [s.index for s in st.steps if not s.complete]
        self.assertEqual(partial, [27, 28, 29])
        self.assertEqual(st.step(28).missing, {2: list(st.names)})
        self.assertTrue(set(st.steady).isdisjoint(partial))
        self.assertNotIn(st.median, partial)
        # rank 1 submits 7 µs after rank 0 and 4 after rank 2: the slowest in every full step
        for k in st.steady:
            self.assertEqual(st.step(k).slowest_rank(), 1)
            self.assertAlmostEqual(st.step(k).mean_lateness(1), 7.0, places=6)
        s = cfx.summarize(an)
        self.assertEqual(s["step_finder"]["partial_steps"], [27, 28, 29])

    def test_stalled_rank(self):
        # rank 1 stalls 50 ms before its first gradient of step 20; everyone waits for it
        job = synth.training(nranks=3, steps=40, stall=(20, 1, 50000.0))
        an = analysis(job)
        st = an.steps
        self.assertEqual(len(st.steps), 40)
        s20 = st.step(20)
        self.assertEqual(s20.slowest_rank(), 1)
        self.assertAlmostEqual(s20.mean_lateness(1), 50000.0, places=3)
        # ranks 0 and 2 each had a gradient waiting for rank 1 during the whole stall and more
        for r in (0, 2):
            self.assertGreaterEqual(s20.waited_for(r), 50000.0)
        self.assertEqual(s20.waited_for(1), 0.0)
        self.assertNotEqual(st.median, 20)
        self.assertIn(20, st.steady)  # a stall in the middle is not warm-up
        path = an.path(20)
        on_rank1_outside = sum(p.length for p in path if p.rank == 1 and p.kind == "outside")
        self.assertGreaterEqual(on_rank1_outside, 50000.0)  # the path waits on rank 1
        self.assertEqual(path[0].rank, 1)

    def test_rank_stops_inside_the_last_step(self):
        # a killed job: rank 1 never submitted g1, g0 of the last step; the set stays whole
        job = synth.Job(2)
        t = 0.0
        for k in range(10):
            skip = {1: ("g1", "g0")} if k == 9 else None
            t = job.step(t, GRADS, skip=skip) + 300.0
        st = analysis(job).steps
        self.assertEqual(sorted(st.names), sorted(GRADS))
        self.assertEqual(len(st.steps), 10)
        self.assertEqual(st.step(9).missing, {1: ["g1", "g0"]})
        self.assertFalse(st.step(9).complete)
        self.assertEqual(st.others, [])
        # every rank killed inside the last step: g1 and g0 have a submission fewer everywhere
        job = synth.Job(2)
        t = 0.0
        for k in range(10):
            skip = {0: ("g1", "g0"), 1: ("g1", "g0")} if k == 9 else None
            t = job.step(t, GRADS, skip=skip) + 300.0
        st = analysis(job).steps
        self.assertEqual(sorted(st.names), sorted(GRADS))
        self.assertEqual(len(st.steps), 10)
        self.assertEqual(st.step(9).missing, {0: ["g1", "g0"], 1: ["g1", "g0"]})
        self.assertEqual(st.step(8).missing, {})

    def test_warmup(self):
        job = synth.training(nranks=2, steps=30, slow_steps=3)
        st = analysis(job).steps
        self.assertEqual(st.warmup, 3)
        self.assertEqual(st.steady, list(range(3, 30)))
        job = synth.training(nranks=2, steps=30)
        self.assertEqual(analysis(job).steps.warmup, 1)  # step 0 always

    def test_gradient_set_lanes(self):
        # a gradient set's buckets (collective slices on "<set>.bucket<k>" lanes, as the engine
        # writes them) repeat less often than a loss allreduced twice a step: still the step
        job = synth.Job(2)
        t = 0.0
        buckets = ["model.bucket0", "model.bucket1", "model.bucket2"]
        for k in range(12):
            t = job.step(t, ("loss",)) + 10.0
            t = job.step(t, ("loss",)) + 10.0
            t = job.buckets(t, "model", 3) + 200.0
        an = analysis(job)
        self.assertEqual(an.steps.names, buckets)
        self.assertIn("gradient sets", an.steps.source)
        self.assertEqual(len(an.steps.steps), 12)
        self.assertTrue(all(s.complete for s in an.steps.steps))
        self.assertEqual([o.name for o in an.steps.others], ["loss"])
        self.assertEqual(an.steps.others[0].count, 24)
        self.assertEqual(an.steps.others[0].describe(),
                         "24 times at 12 places, every 1 steps (before step 0, 0, 1, 2, ...)")
        path = an.path(an.steps.median)  # the buckets' collectives, one after the other
        self.assertEqual([(p.kind, p.tensor) for p in path],
                         [("collective", b) for b in buckets])
        self.assertAlmostEqual(sum(p.length for p in path), 3 * synth.COLL_US, places=6)
        # with no gradient-set lanes looked for, the most repeated set (loss) is the step
        self.assertEqual(cfx.Analysis(job.all_events(), gradset_lanes=None).steps.names, ["loss"])
        st = cfx.Analysis(job.all_events(), gradset_lanes=r"^model\.bucket[02]$").steps
        self.assertEqual(st.names, ["model.bucket0", "model.bucket2"])

    def test_forced_step_tensors(self):
        job = synth.training(nranks=2, steps=10, metrics_every=2)
        st = analysis(job, step_names=["metrics"]).steps
        self.assertEqual((st.names, len(st.steps)), (["metrics"], 5))
        with self.assertRaisesRegex(ValueError, "nope"):
            analysis(job, step_names=["nope"])

    def test_negotiate_before_queued_ends(self):
        # the engine gives a tensor that arrives during a cycle the cycle's start as its NEGOTIATE
        # start: earlier than QUEUED's end, and NEGOTIATE may come first in time order
        events = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "x"}}]
        for k in range(3):
            b = 1000.0 * k
            events += [
                {"name": "QUEUED", "cat": "queued", "ph": "X", "pid": 0, "tid": 1, "ts": b + 10,
                 "dur": 0.0},
                {"name": "NEGOTIATE", "cat": "negotiate", "ph": "X", "pid": 0, "tid": 1,
                 "ts": b + 9.5, "dur": 20},
                {"name": "ALLREDUCE", "cat": "collective", "ph": "X", "pid": 0, "tid": 1,
                 "ts": b + 30, "dur": 40}]
        for evs in (events, sorted(events, key=lambda e: e.get("ts", -1))):
            tl = cfx.build(evs)
            self.assertEqual(tl.count(0, "x"), 3)
            self.assertTrue(all(sorted(o.slices) == ["collective", "negotiate", "queued"]
                                for o in tl.occurrences[(0, "x")]))

    def test_duplicates_dropped(self):
        job = synth.training(nranks=2, steps=6)
        ev = job.all_events()
        an = cfx.Analysis(ev + ev)  # a merged file given with its parts
        self.assertEqual(len(an.steps.steps), 6)
        self.assertEqual(an.tl.duplicates, sum(1 for e in ev if e["ph"] != "M"))

    def test_malformed_events_set_aside(self):
        """Events of the wrong shape (as a damaged or hand-edited file has them) are counted and
        left out; the steps come out as from the clean events (inputs the fuzz loop crashed on)."""
        job = synth.training(nranks=2, steps=6)
        ev = job.all_events()
        bad = [None, [], {"ph": "X"}, {"ph": "X", "pid": 0, "tid": [1], "ts": 1.0},
               {"ph": "X", "pid": "0", "tid": 1, "ts": 1.0, "cat": "collective"},
               {"ph": "X", "pid": 0, "tid": 1, "ts": float("nan"), "cat": "collective"},
               {"ph": "X", "pid": 0, "tid": 1, "ts": 1.0, "dur": None, "cat": "queued"},
               {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": None}]
        an = cfx.Analysis(bad[:4] + ev + bad[4:])
        self.assertEqual(an.tl.malformed, len(bad))
        self.assertEqual(len(an.steps.steps), 6)
        self.assertEqual(len(an.steps.steps), len(cfx.Analysis(ev).steps.steps))

    def test_critical_path_covers_every_step_once(self):
        job = synth.training(nranks=3, steps=25, metrics_every=5, offsets={1: 30.0},
                             stall=(12, 2, 3000.0))
        an = analysis(job)
        for step in an.steps.steps:
            path = an.path(step.index)
            self.assertAlmostEqual(path[0].t0, step.start, places=6)
            self.assertAlmostEqual(path[-1].t1, step.end, places=6)
            for a, b in zip(path, path[1:]):
                self.assertAlmostEqual(a.t1, b.t0, places=6)
                self.assertLess(a.t0, a.t1)
            self.assertAlmostEqual(sum(p.length for p in path), step.wall, places=6)
        tot, total = an.shares()
        self.assertAlmostEqual(sum(tot.values()), total, places=3)
        # in a step without a stall the last gradient's data path ends it
        path = an.path(5)
        self.assertEqual([p.kind for p in path[-3:]], ["pack", "collective", "unpack"])
        self.assertEqual(path[-1].tensor, "g0")

    def test_critical_path_through_a_long_batch(self):
        # g3's collective runs 5 ms; g2..g0 are submitted meanwhile and wait in the queue for the
        # background thread: the path goes through the long collective, not through that queueing
        job = synth.Job(2)
        t = 0.0
        for k in range(6):
            t = job.step(t, GRADS, coll_us={"g3": 5000.0}) + 300.0
        an = analysis(job)
        path = an.path(3)
        kinds = {}
        for p in path:
            kinds[p.kind] = kinds.get(p.kind, 0.0) + p.length
        self.assertGreaterEqual(kinds["collective"], 5000.0)
        self.assertLess(kinds.get("queued", 0.0), 100.0)
        self.assertIn(("collective", "g3"), [(p.kind, p.tensor) for p in path])
        # g2's QUEUED slice does last most of the long collective
        g2 = an.steps.step(3).occ[0]["g2"].slices["queued"]
        self.assertGreater(g2.t1 - g2.t0, 4000.0)

    def test_critical_path_follows_the_slower_rank(self):
        # batches of one cycle, the next starting on every rank once the slowest is done (rank 0
        # ends the first batch 400 µs after rank 1; rank 1 has no slice of its own meanwhile)
        job = synth.Job(2)
        t = 0.0
        for k in range(5):
            t = job.cycle(t, [["g3", "g2"], ["g1", "g0"]],
                          coll_us=[{0: 3000.0, 1: 2600.0}, {0: 500.0, 1: 520.0}]) + 300.0
        an = analysis(job)
        path = an.path(2)
        self.assertEqual((path[-1].rank, path[-1].kind), (1, "unpack"))  # rank 1 ends the step
        self.assertIn((0, "collective"), [(p.rank, p.kind) for p in path if p.length > 2000.0])
        self.assertEqual([p for p in path if p.kind in ("gap", "outside") and p.length > 100.0],
                         [])
        # a tensor taken from the queue late on one rank: the others' negotiation waits for it
        job = synth.Job(2)
        t = 0.0
        for k in range(5):
            job.busy[1] = t + 1500.0  # rank 1's thread busy (a batch of another job) till then
            t = job.step(t, ("g0",)) + 300.0
        an = analysis(job)
        path = an.path(2)
        # g0 waited in rank 1's queue, then the negotiation, then the data path
        self.assertEqual([(p.rank, p.kind) for p in path[-5:]],
                         [(1, "queued"), (0, "negotiate"), (0, "pack"), (0, "collective"),
                          (0, "unpack")])
        self.assertGreater(path[-5].length, 1400.0)

    def test_summary_text(self):
        job = synth.training(nranks=2, steps=16, metrics_every=4)
        s = cfx.analyze(job.all_events())
        import io
        out = io.StringIO()
        cfx.print_summary(s, 5, out=out)
        text = out.getvalue()
        self.assertIn("steps: 16, found from the tensor set that repeats most: 4 tensor(s)", text)
        self.assertIn("metrics", text)
        self.assertIn("4 times, every 4 steps", text)
        self.assertEqual(s["step_finder"]["count"], 16)
        self.assertEqual([t["role"] for t in s["tensors"] if t["name"] == "metrics"], ["other"])


if __name__ == "__main__":
    unittest.main(verbosity=1)

"""Synthetic Conflux timelines for the step finder's and the picture's tests.

Job plays a data-parallel training job the way the engine records it: per rank, a lane per tensor
name (thread_name metadata), and per submission the slices QUEUED, NEGOTIATE, PACK, ALLREDUCE,
UNPACK in the order the engine writes them. Times are µs, chosen by the test, never measured.

A step: every rank submits the gradients one after another (rank offset + dt apart, plus a stall
where the test puts one). As in the engine, each rank's background thread does one thing at a
time: it takes a submitted tensor from the queue once it is free (QUEUED lasts while it runs an
earlier batch), the negotiation ends once every rank has taken the tensor, and then the batch
runs (PACK, ALLREDUCE, UNPACK) on every rank at once. `truth` keeps every slice as
(rank, tensor, occurrence index on that rank, phase, t0, t1): what the tests compare with."""
import json

QUEUE_US, NEGOTIATE_US, PACK_US, COLL_US, UNPACK_US = 15.0, 20.0, 2.0, 40.0, 2.0


class Job:
    def __init__(self, nranks):
        self.nranks = nranks
        self.events = {r: [{"name": "process_name", "ph": "M", "pid": r,
                            "args": {"name": "rank %d" % r}},
                           {"name": "thread_name", "ph": "M", "pid": r, "tid": 0,
                            "args": {"name": "cycles"}},
                           {"name": "thread_name", "ph": "M", "pid": r, "tid": 100001,
                            "args": {"name": "(more tensors)"}}] for r in range(nranks)}
        self.tids = {r: {} for r in range(nranks)}
        self.count = {}          # (rank, tensor) -> submissions so far
        self.truth = []          # (rank, tensor, index, phase, t0, t1)
        self.busy = {r: 0.0 for r in range(nranks)}  # background thread free from

    def _tid(self, r, name):
        t = self.tids[r].get(name)
        if t is None:
            t = self.tids[r][name] = len(self.tids[r]) + 1
            self.events[r].append({"name": "thread_name", "ph": "M", "pid": r, "tid": t,
                                   "args": {"name": name}})
        return t

    def _slice(self, r, name, index, cat, label, t0, t1, args=None):
        e = {"name": label, "cat": cat, "ph": "X", "pid": r, "tid": self._tid(r, name),
             "ts": round(t0, 3), "dur": round(t1 - t0, 3)}
        if args:
            e["args"] = args
        self.events[r].append(e)
        self.truth.append((r, name, index, cat, round(t0, 3), round(t0, 3) + round(t1 - t0, 3)))

    def collective(self, name, submits, negotiate_us=NEGOTIATE_US, coll_us=COLL_US):
        """One allreduce of `name`: submits = {rank: submit time}. Returns {rank: end time}."""
        seen_at = {r: max(t, self.busy[r]) + QUEUE_US for r, t in submits.items()}
        neg_end = max(seen_at.values()) + negotiate_us
        ends = {}
        start = neg_end
        for r, t in sorted(submits.items()):
            index = self.count.get((r, name), 0)
            self.count[(r, name)] = index + 1
            seen = seen_at[r]
            self._slice(r, name, index, "queued", "QUEUED", t, seen)
            self._slice(r, name, index, "negotiate", "NEGOTIATE", seen, neg_end)
            a = start
            self._slice(r, name, index, "pack", "PACK", a, a + PACK_US)
            self._slice(r, name, index, "collective", "ALLREDUCE", a + PACK_US,
                        a + PACK_US + coll_us, {"bytes": 1024, "fused": 1})
            e = a + PACK_US + coll_us
            self._slice(r, name, index, "unpack", "UNPACK", e, e + UNPACK_US)
            ends[r] = self.busy[r] = e + UNPACK_US
        return ends

    def cycle(self, t, batches, coll_us):
        """Every rank submits every tensor of `batches` (lists of names) at t; one cycle negotiates
        them all, then the batches run one after the other, each starting on every rank once every
        rank has finished the one before (as on the shared-memory path); coll_us[b][rank] is batch
        b's collective on that rank. Returns the end."""
        ranks = range(self.nranks)
        neg_end = max(max(t, self.busy[r]) for r in ranks) + QUEUE_US + NEGOTIATE_US
        start = neg_end
        for b, names in enumerate(batches):
            ends = {}
            for r in ranks:
                e = start + PACK_US + coll_us[b][r]
                for name in names:
                    index = self.count.get((r, name), 0)
                    self.count[(r, name)] = index + 1
                    self._slice(r, name, index, "queued", "QUEUED", t, t + QUEUE_US)
                    self._slice(r, name, index, "negotiate", "NEGOTIATE", t + QUEUE_US, neg_end)
                    self._slice(r, name, index, "pack", "PACK", start, start + PACK_US)
                    self._slice(r, name, index, "collective", "ALLREDUCE", start + PACK_US, e,
                                {"bytes": 1024 * len(names), "fused": len(names)})
                    self._slice(r, name, index, "unpack", "UNPACK", e, e + UNPACK_US)
                ends[r] = self.busy[r] = e + UNPACK_US
            start = max(ends.values())
        return start

    def buckets(self, t, name, nbuckets, coll_us=COLL_US):
        """One step of gradient set `name` as the engine records it: on each bucket's lane
        "<name>.bucket<k>" an ALLREDUCE slice only, the buckets one after the other on every rank.
        Returns the end."""
        for b in range(nbuckets):
            lane = "%s.bucket%d" % (name, b)
            for r in range(self.nranks):
                index = self.count.get((r, lane), 0)
                self.count[(r, lane)] = index + 1
                self._slice(r, lane, index, "collective", "ALLREDUCE", t, t + coll_us,
                            {"bytes": 4096 * nbuckets, "fused": nbuckets})
            t += coll_us
        return t

    def step(self, t, grads, ranks=None, offset_us=None, dt=100.0, stall=None, skip=None,
             coll_us=None):
        """One training step from time t: every rank in `ranks` submits `grads` in order (rank r
        at t + offset_us[r] + i*dt; stall = {rank: extra µs before its first submission}; skip =
        {rank: names it does not submit}; coll_us = {name: its collective's length}). Returns the
        step's end."""
        ranks = list(range(self.nranks)) if ranks is None else ranks
        offset_us = offset_us or {}
        stall = stall or {}
        skip = skip or {}
        end = t
        for i, g in enumerate(grads):
            subs = {r: t + offset_us.get(r, 0.0) + stall.get(r, 0.0) + i * dt for r in ranks
                    if g not in skip.get(r, ())}
            if subs:
                c = (coll_us or {}).get(g, COLL_US)
                end = max([end] + list(self.collective(g, subs, coll_us=c).values()))
        return end

    def files(self, directory):
        """Writes tl.rank<r>.json like the engine (one event a line, closing bracket) and returns
        the paths."""
        import os
        paths = []
        for r in range(self.nranks):
            p = os.path.join(directory, "tl.rank%d.json" % r)
            with open(p, "w") as f:
                f.write("[\n" + "\n,".join(json.dumps(e, separators=(",", ":"))
                                           for e in self.events[r]) + "\n]\n")
            paths.append(p)
        return paths

    def all_events(self):
        return [e for r in range(self.nranks) for e in self.events[r]]


def training(nranks=2, steps=40, grads=("g3", "g2", "g1", "g0"), metrics_every=None,
             offsets=None, gap=500.0, stall=None, uneven=None, slow_steps=0):
    """A whole job: broadcasts before step 0, `steps` steps, metrics after every metrics_every-th
    step, one final allgather-like tensor. stall = (step, rank, µs); uneven = {rank: steps it
    takes}; the first slow_steps steps have a 10x longer negotiation (warm-up)."""
    job = Job(nranks)
    t = 1000.0
    for name in ("bcast.w", "bcast.b"):
        t = max(job.collective(name, {r: t for r in range(nranks)}).values()) + 50.0
    for k in range(steps):
        ranks = [r for r in range(nranks) if uneven is None or k < uneven.get(r, steps)]
        st = {stall[1]: stall[2]} if stall and stall[0] == k else None
        if k < slow_steps:
            end = t
            for i, g in enumerate(grads):
                subs = {r: t + i * 100.0 + (offsets or {}).get(r, 0.0) for r in ranks}
                end = max([end] + list(job.collective(g, subs, negotiate_us=2000.0).values()))
        else:
            end = job.step(t, grads, ranks, offsets, stall=st)
        t = end + gap
        if metrics_every and (k + 1) % metrics_every == 0:
            t = max(job.collective("metrics", {r: t for r in ranks}).values()) + gap
    job.collective("final", {r: t for r in range(nranks)})
    return job

"""The critical path of a step: the chain of intervals that decided when the step ended.

Walking back in time from the step's end (the last slice to finish, on its rank), at each moment
t on rank r the path takes what r was doing that t waited for:

- a data-path slice (pack, collective, unpack) running at t: the background thread was busy with
  that batch (the rank's background thread runs one batch at a time);
- else a negotiation that ended at t: the batch could start only once every rank had submitted
  the tensor, and once r's background thread was free to run the negotiating cycle. If r's thread
  ran a batch during the negotiation, the wait is the time after that batch, and the path goes on
  into the batch; if another rank's request for the tensor came after that (its thread took the
  tensor from its queue later: it submitted late, or its thread was busy), the negotiation proper
  ran from that request on, and before it the path moves to that rank, at its request;
- else a QUEUED slice that ended at t (the tensor waited for the background thread): as for a
  negotiation, the part after a batch the thread ran meanwhile, then that batch;
- else nothing of r's ended at t. If r had a tensor in flight then (submitted, not done: it waits
  inside Conflux between two of its slices, e.g. for the next batch) and another rank was running
  a batch at t, the path moves to that rank (collectives run in step on every rank); with no such
  rank the time back to r's last slice is a "gap" (inside Conflux, between phases). With nothing
  in flight it is "outside" time (the framework computing: forward, backward, the optimizer), and
  so is the time before the rank's first slice of the step, back to the step's start.

Moments closer than EPS_US count as the same moment. The path covers the step's wall time
exactly once, so its segments' shares add up to 100 %.
"""
from bisect import bisect_left, bisect_right
from itertools import accumulate

from .model import DATA_PHASES

EPS_US = 5.0
KINDS = ["between", "outside", "queued", "negotiate", "pack", "collective", "unpack", "gap"]
KIND_LABEL = {"between": "framework, between steps", "outside": "framework, during the step",
              "gap": "in Conflux, between phases", "queued": "queued",
              "negotiate": "negotiate", "pack": "pack", "collective": "collective",
              "unpack": "unpack"}


class Segment:
    __slots__ = ("rank", "t0", "t1", "kind", "tensor")

    def __init__(self, rank, t0, t1, kind, tensor):
        self.rank, self.t0, self.t1, self.kind, self.tensor = rank, t0, t1, kind, tensor

    @property
    def length(self):
        return self.t1 - self.t0

    def __repr__(self):
        return "Segment(rank %s, %.1f..%.1f, %s, %r)" % (self.rank, self.t0, self.t1, self.kind,
                                                        self.tensor)


class RankIndex:
    """One rank's slices, indexed for the questions the walk asks about a moment t."""

    def __init__(self, slices):
        batches = {}
        for s in slices:  # fused tensors share their data-path slices: one per batch is enough
            if s.phase in DATA_PHASES:
                batches.setdefault((s.t0, s.t1, s.phase), s)
        self.data = sorted(batches.values(), key=lambda s: (s.t0, s.t1))
        self.data_t0 = [s.t0 for s in self.data]
        self.data_reach = list(accumulate((s.t1 for s in self.data), max))
        self.data_t1 = sorted(s.t1 for s in self.data)
        self.waits = {}
        for ph in ("queued", "negotiate"):
            lst = sorted((s for s in slices if s.phase == ph), key=lambda s: s.t1)
            self.waits[ph] = (lst, [s.t1 for s in lst])
        self.all_t1 = sorted(s.t1 for s in slices)
        occs = sorted({id(s.occ): s.occ for s in slices}.values(), key=lambda o: o.submit)
        self.submits = [o.submit for o in occs]
        self.reach = list(accumulate((o.end for o in occs), max))

    def data_at(self, t, eps):
        """The data-path slice running at t (t0 < t <= t1 + eps), the latest ending; or None."""
        best = None
        j = bisect_left(self.data_t0, t) - 1
        while j >= 0 and self.data_reach[j] >= t - eps:
            s = self.data[j]
            if s.t1 >= t - eps and (best is None or (s.t1, s.t0) > (best.t1, best.t0)):
                best = s
            j -= 1
        return best

    def waits_ending_at(self, phase, t, eps):
        """The `phase` slices (queued, negotiate) that began before t and ended within eps of it."""
        lst, t1s = self.waits[phase]
        return [s for s in lst[bisect_left(t1s, t - eps):bisect_right(t1s, t + eps)] if s.t0 < t]

    def busy_until(self, a, t, eps):
        """The latest end of a data-path slice within (a, t - eps], or None: until then the rank's
        background thread ran a batch, and could not take or negotiate anything else."""
        i = bisect_right(self.data_t1, t - eps) - 1
        return self.data_t1[i] if i >= 0 and self.data_t1[i] > a else None

    def last_end_before(self, x):
        i = bisect_left(self.all_t1, x) - 1
        return self.all_t1[i] if i >= 0 else None

    def in_flight(self, t):
        """Whether some submission began before t and ends after it."""
        k = bisect_left(self.submits, t)
        return k > 0 and self.reach[k - 1] > t


def rank_index(tl, rank):
    cache = tl.__dict__.setdefault("_rank_index", {})
    if rank not in cache:
        cache[rank] = RankIndex(tl.slices_on(rank))
    return cache[rank]


def critical_path(tl, step, eps=EPS_US):
    """[Segment] from step.start to step.end, in time order."""
    idx = {r: rank_index(tl, r) for r in step.occ}
    rank = max(step.occ, key=lambda r: (step.rank_span[r][1], -r))
    t = step.end
    segs = []
    for _ in range(1000000):  # bounded: every turn moves t back or moves to a busier rank
        if t <= step.start + 1e-9:
            break
        ix = idx[rank]
        s = ix.data_at(t, eps)
        if s is not None:
            segs.append(Segment(rank, s.t0, t, s.phase, s.tensor))
            t = s.t0
            continue
        neg = ix.waits_ending_at("negotiate", t, eps)
        if neg:
            s = min(neg, key=lambda x: x.t0)
            gate = _last_arrival(tl, neg, rank, t, idx)
            busy = ix.busy_until(s.t0, t, eps)
            if gate is not None and gate.rank != rank and \
                    gate.t0 > max(s.t0, busy if busy is not None else s.t0) + eps:
                # `rank` waited for gate.rank's request: the negotiation proper ran from then
                segs.append(Segment(rank, gate.t0, t, "negotiate", s.tensor))
                rank, t = gate.rank, gate.t0
                continue
            t = _wait(segs, ix, s, t, eps)
            continue
        queued = ix.waits_ending_at("queued", t, eps)
        if queued:
            t = _wait(segs, ix, min(queued, key=lambda x: x.t0), t, eps)
            continue
        inflight = ix.in_flight(t)
        if inflight:  # r waits inside Conflux with no slice of its own: for a batch elsewhere?
            other = [o for o in (idx[g].data_at(t, eps) for g in idx if g != rank) if o is not None]
            if other:
                rank = max(other, key=lambda x: (x.t1, -x.rank)).rank
                continue
        kind = "gap" if inflight else "outside"
        prev = ix.last_end_before(t - eps)
        if prev is None or prev <= step.start:
            segs.append(Segment(rank, step.start, t, kind, None))
            break
        segs.append(Segment(rank, prev, t, kind, None))
        t = prev
    segs.reverse()
    for s in segs:
        s.t0 = max(s.t0, step.start)
    return _merge([s for s in segs if s.t1 > s.t0])


def _wait(segs, ix, s, t, eps):
    """Adds the part of waiting slice `s` (queued or negotiate) that ends at t and returns where
    the path goes on: at the end of a batch the rank's thread ran meanwhile (what the wait waited
    for), else at the slice's start."""
    busy = ix.busy_until(s.t0, t, eps)
    a = busy if busy is not None else s.t0  # < t: callers pass slices that start before t
    segs.append(Segment(s.rank, a, t, s.phase, s.tensor))
    return a


def _last_arrival(tl, negs, rank, t, idx):
    """Of the tensors whose negotiation on `rank` ended at t, the one whose request some rank sent
    last (its NEGOTIATE began last: the rank's thread took it from the queue then): that rank's
    NEGOTIATE slice of it (on `rank` itself on a tie)."""
    best = None
    for s in negs:
        o = s.occ
        for r in idx:
            peer = o if r == rank else tl.occ(r, o.tensor, o.index)
            ps = peer.slices.get("negotiate") if peer is not None else None
            if ps is None or ps.t0 >= t:
                continue
            if best is None or ps.t0 > best.t0 or (ps.t0 == best.t0 and r == rank):
                best = ps
    return best


def _merge(segs):
    out = []
    for s in segs:
        p = out[-1] if out else None
        if p and p.rank == s.rank and p.kind == s.kind and p.tensor == s.tensor and \
                abs(p.t1 - s.t0) < 1e-9:
            p.t1 = s.t1
        else:
            out.append(s)
    return out


def shares(paths):
    """kind -> total µs over the given paths (lists of Segments)."""
    tot = {k: 0.0 for k in KINDS}
    for segs in paths:
        for s in segs:
            tot[s.kind] += s.length
    return tot


def time_by_rank(segs):
    """rank -> µs of the path spent on that rank."""
    out = {}
    for s in segs:
        out[s.rank] = out.get(s.rank, 0.0) + s.length
    return out

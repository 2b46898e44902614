"""Finding the training step in a timeline.

A training loop submits its gradients once per step under the same names, and other tensors less
often: metrics every N steps, epoch averages, a broadcast of the parameters at the start, a final
check. So the step is found from the data:

- the candidates are the gradient sets' bucket lanes when the timeline has any (names that match
  GRADSET_LANES: the engine names a gradient set's buckets "<set>.bucket<k>", and records their
  collectives on those lanes), else every tensor name (the shared overflow lane "(more tensors)"
  never counts);
- a name's count is its number of submissions on the rank that submitted it most;
- the step set is the names whose count is within step_slack() of the largest count (so a last step
  cut short by a kill, or one tensor missing once, does not split the set); every other name is an
  "other" tensor, reported with how often it recurs (RecurringTensor);
- step k is the k-th submission of every step-set name on each rank (the engine pairs the k-th
  submission of a name on every rank, so this is also how the ranks line up); a rank that submitted
  fewer steps (uneven data, a rank that stopped) is missing from the later steps, which are then
  "partial";
- warm-up: step 0 (every tensor goes through the coordinator the first time), then the steps after
  it while they stay slower than the run's typical step (median + max(3 robust sigma, 25 %) of the
  complete steps), at most half the run;
- steady state: the complete steps after the warm-up; the median step is the steady-state step of
  median wall time (the lower one of an even count).
"""
import bisect
import re
from collections import defaultdict

from .model import OVERFLOW_LANE

GRADSET_LANES = r"\.bucket[0-9]+$"  # capi/src/api/gradset_plan.c: "<set>.bucket<k>"


def step_slack(cmax):
    """How many submissions fewer than the most-submitted name a step-set name may have."""
    return max(1, cmax // 20)


def median(xs):
    s = sorted(xs)
    n = len(s)
    if not n:
        return None
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def quantile(xs, q):
    s = sorted(xs)
    if not s:
        return None
    i = q * (len(s) - 1)
    lo = int(i)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (i - lo)


class Step:
    """Step `index`: occ[rank][name] is that rank's index-th submission of each step-set name."""

    def __init__(self, index, occ, names, ranks):
        self.index = index
        self.occ = occ
        present = sorted(occ)
        self.ranks = present
        self.missing = {}  # rank -> step-set names it did not submit in this step
        for r in ranks:
            lack = [n for n in names if n not in occ.get(r, {})]
            if lack:
                self.missing[r] = lack
        self.complete = not self.missing
        everything = [o for per in occ.values() for o in per.values()]
        self.start = min(o.submit for o in everything)
        self.end = max(o.end for o in everything)
        self.wall = self.end - self.start
        self.rank_span = {r: (min(o.submit for o in per.values()), max(o.end for o in per.values()))
                          for r, per in occ.items()}
        self._lateness = None

    def last_submitter(self, name):
        """(rank, submit time) of the rank that submitted `name` last in this step."""
        best = None
        for r, per in self.occ.items():
            o = per.get(name)
            if o is not None and (best is None or o.submit > best[1]):
                best = (r, o.submit)
        return best

    def lateness(self):
        """rank -> total over the step's names of (its submit - the first rank's submit), µs."""
        if self._lateness is None:
            late = defaultdict(float)
            names = set(n for per in self.occ.values() for n in per)
            for n in names:
                subs = {r: per[n].submit for r, per in self.occ.items() if n in per}
                if len(subs) < 2:
                    continue
                first = min(subs.values())
                for r, t in subs.items():
                    late[r] += t - first
            for r in self.occ:
                late.setdefault(r, 0.0)
            self._lateness = dict(late)
        return self._lateness

    def mean_lateness(self, rank):
        """`rank`'s lateness per tensor submitted by more than one rank (µs)."""
        shared = [n for n in set(n for per in self.occ.values() for n in per)
                  if sum(1 for per in self.occ.values() if n in per) > 1]
        return self.lateness().get(rank, 0.0) / len(shared) if shared else 0.0

    def slowest_rank(self):
        """The rank the others waited for most: the largest total lateness (ties: lowest rank)."""
        late = self.lateness()
        return min(late, key=lambda r: (-late[r], r)) if late else None

    def waited_for(self, rank):
        """µs during which `rank` had a step tensor submitted and still waiting for a later rank
        to submit it (union over tensors)."""
        intervals = []
        for n, o in self.occ.get(rank, {}).items():
            last = self.last_submitter(n)
            if last and last[1] > o.submit:
                intervals.append((o.submit, last[1]))
        return union_length(intervals)


def union(intervals):
    """[(a, b)] merged into disjoint intervals, in order."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def union_length(intervals):
    return sum(b - a for a, b in union(intervals))


class RecurringTensor:
    """A tensor that is not part of the step: how often, and where between the steps."""

    def __init__(self, name, counts, after_steps):
        self.name = name
        self.counts = counts          # rank -> submissions
        self.after_steps = after_steps  # on its first rank: steps begun before each submission

    @property
    def count(self):
        return max(self.counts.values()) if self.counts else 0

    def places(self):
        """The distinct places between steps where it was submitted, in order."""
        return sorted(set(self.after_steps))

    def period(self):
        """Median number of steps between consecutive places, or None."""
        p = self.places()
        d = [b - a for a, b in zip(p, p[1:])]
        return median(d) if d else None

    def describe(self):
        """In words: "once, before step 0", "8 times, every 64 steps (after step 63, 127, ...)",
        "26 times at 13 places, every 1 steps (before step 0, 0, 1, ...)"."""
        def where(k):
            return "before step 0" if k == 0 else "after step %d" % (k - 1)
        n = self.count
        places = self.places()
        if n == 1:
            return "once, %s" % where(places[0]) if places else "once"
        text = "%d times" % n
        if places and len(places) < len(self.after_steps):
            text += " at %d places" % len(places)
        p = self.period()
        if p:
            text += ", every %g steps" % p
        shown = [where(k) if i == 0 else ("%d" % (k - 1)) for i, k in enumerate(places[:4])]
        return "%s (%s%s)" % (text, ", ".join(shown), ", ..." if len(places) > 4 else "")


class Steps:
    """The step finder's answer (see the module's docstring)."""

    def __init__(self):
        self.source = ""      # how the step set was chosen, in words
        self.names = []       # the step-set names, in their usual submission order
        self.steps = []       # [Step]
        self.others = []      # [RecurringTensor], most frequent first
        self.warmup = 0       # steps 0 .. warmup-1 are warm-up
        self.steady = []      # indices of the steady-state steps
        self.median = None    # index of the median steady-state step
        self.per_rank_steps = {}  # rank -> number of steps it took part in

    def step(self, index):
        return self.steps[index]

    def period(self, index):
        """Start of step index+1 minus start of step index (µs): the whole iteration, framework
        compute included; None for the last step."""
        if index + 1 >= len(self.steps):
            return None
        return self.steps[index + 1].start - self.steps[index].start

    def steady_walls(self):
        return [self.steps[k].wall for k in self.steady]


def _candidates(tl, pattern):
    names = [n for n in tl.names if n != OVERFLOW_LANE]
    match = re.compile(pattern).search if pattern else None
    grad = [n for n in names if match and match(n)]
    if grad:
        return grad, "the gradient sets' bucket lanes"
    return names, "the tensor set that repeats most"


def _warmup(walls):
    """Warm-up length from the per-step walls (None for a partial step)."""
    full = [w for w in walls if w is not None]
    if len(walls) < 3 or len(full) < 3:
        return 0
    med = median(full)
    mad = median([abs(w - med) for w in full])
    threshold = med + max(3 * 1.4826 * mad, 0.25 * med)
    w = 1
    while w < len(walls) // 2 and (walls[w] is None or walls[w] > threshold):
        w += 1
    return w


def find_steps(tl, gradset_lanes=GRADSET_LANES, step_names=None):
    """The steps of Timeline `tl`. gradset_lanes: the regular expression that a gradient set's
    bucket lanes match (None: no gradient sets); step_names: force the step set (a list of
    names)."""
    st = Steps()
    counts = {n: max(tl.count(r, n) for r in tl.ranks) for n in tl.names}
    if step_names:
        unknown = [n for n in step_names if n not in counts]
        if unknown:
            raise ValueError("step tensor(s) %s are not in the timeline" % unknown)
        chosen = list(step_names)
        st.source = "the names given"
    else:
        pool, st.source = _candidates(tl, gradset_lanes)
        cmax = max((counts[n] for n in pool), default=0)
        chosen = [n for n in pool if counts[n] >= cmax - step_slack(cmax)] if cmax else []
    chosen_set = set(chosen)
    nsteps = max((counts[n] for n in chosen), default=0)
    ranks = [r for r in tl.ranks if any(tl.count(r, n) for n in chosen)]
    for k in range(nsteps):
        occ = {}
        for r in ranks:
            per = {}
            for n in chosen:
                o = tl.occ(r, n, k)
                if o is not None:
                    per[n] = o
            if per:
                occ[r] = per
        if occ:
            st.steps.append(Step(len(st.steps), occ, chosen, ranks))
    st.per_rank_steps = {r: sum(1 for s in st.steps if r in s.occ) for r in ranks}
    st.names = _submission_order(st, chosen)
    st.warmup = _warmup([s.wall if s.complete else None for s in st.steps])
    st.steady = [s.index for s in st.steps[st.warmup:] if s.complete]
    if st.steady:
        by_wall = sorted(st.steady, key=lambda k: (st.steps[k].wall, k))
        st.median = by_wall[(len(by_wall) - 1) // 2]
    st.others = _others(tl, st, [n for n in tl.names if n not in chosen_set])
    return st


def _submission_order(st, names):
    """Names by their median submit offset from the step's start on its rank (first submitted
    first), over up to 64 steps spread over the run."""
    if not st.steps:
        return list(names)
    stride = max(1, len(st.steps) // 64)
    offsets = defaultdict(list)
    for s in st.steps[::stride]:
        for r, per in s.occ.items():
            r0 = s.rank_span[r][0]
            for n, o in per.items():
                offsets[n].append(o.submit - r0)
    pos = {n: i for i, n in enumerate(names)}
    return sorted(names, key=lambda n: (median(offsets[n]) if offsets[n] else 0.0, pos[n]))


def _others(tl, st, names):
    starts = defaultdict(list)  # rank -> step starts on that rank, in order
    for s in st.steps:
        for r, (a, _) in s.rank_span.items():
            starts[r].append(a)
    out = []
    for n in names:
        cnt = {r: tl.count(r, n) for r in tl.ranks if tl.count(r, n)}
        if not cnt:
            continue
        r = min(cnt)
        after = [bisect.bisect_right(starts.get(r, []), o.submit)
                 for o in tl.occurrences.get((r, n), [])]
        out.append(RecurringTensor(n, cnt, after))
    out.sort(key=lambda x: (-x.count, x.name))
    return out

"""The timeline as slices and occurrences.

A slice is one phase of one tensor on one rank (a trace event with ph "X" and a phase "cat"). An
occurrence is one submission of a tensor on a rank: its consecutive slices on the tensor's lane,
queued → negotiate → pack → collective → unpack (collectives other than allreduce have no pack and
unpack), taken in the order of the file: the engine writes a lane's slices in that order, while
their timestamps need not be (a tensor that arrives during a cycle gets the cycle's start as its
NEGOTIATE start, a little before its QUEUED slice ends). A new occurrence starts at a phase the
current one already has, or at one that comes before the current one's last phase (a timeline
started in the middle of a submission); QUEUED after a lone NEGOTIATE stays in the occurrence
(the two swapped by a tool that sorted the events by time)."""
import math
from collections import defaultdict

PHASES = ["queued", "negotiate", "pack", "collective", "unpack"]
PHASE_INDEX = {p: i for i, p in enumerate(PHASES)}
DATA_PHASES = ("pack", "collective", "unpack")
OVERFLOW_LANE = "(more tensors)"  # the lane shared by names past the engine's lane limit


class Slice:
    __slots__ = ("rank", "tensor", "phase", "label", "t0", "t1", "args", "occ")

    def __init__(self, rank, tensor, phase, label, t0, t1, args):
        self.rank, self.tensor, self.phase, self.label = rank, tensor, phase, label
        self.t0, self.t1, self.args = t0, t1, args
        self.occ = None

    def __repr__(self):
        return "Slice(%s, %r, %s, %.3f..%.3f)" % (self.rank, self.tensor, self.phase, self.t0,
                                                   self.t1)


class Occurrence:
    """One submission of `tensor` on `rank`: the index-th on that rank (from 0)."""
    __slots__ = ("rank", "tensor", "index", "slices", "marks", "last")

    def __init__(self, rank, tensor, index):
        self.rank, self.tensor, self.index = rank, tensor, index
        self.slices = {}  # phase -> Slice
        self.marks = []   # failure marks (instant events named by a status)
        self.last = -1    # PHASE_INDEX of its latest phase

    @property
    def submit(self):
        """When the framework submitted it (QUEUED start), else its first slice's start."""
        q = self.slices.get("queued")
        return q.t0 if q else min(s.t0 for s in self.slices.values())

    @property
    def end(self):
        return max(s.t1 for s in self.slices.values())


class Timeline:
    """Everything the summary and the picture need, built once from the events."""

    def __init__(self):
        self.ranks = []
        self.events = 0
        self.duplicates = 0      # identical events seen twice (a merged file given with its parts)
        self.malformed = 0       # events without the fields (or types) the engine writes: set aside
        self.cycles = 0
        self.capped = False      # the size cap was reached on some rank
        self.names = []          # tensor names in order of first sight
        self.occurrences = {}    # (rank, name) -> [Occurrence] in time order
        self.ready_marks = defaultdict(set)  # name -> ranks marked ready by the coordinator
        self._by_rank = None

    def occ(self, rank, name, index):
        lst = self.occurrences.get((rank, name))
        return lst[index] if lst is not None and 0 <= index < len(lst) else None

    def count(self, rank, name):
        return len(self.occurrences.get((rank, name), ()))

    def slices_on(self, rank):
        """Every slice of rank `rank`, sorted by start."""
        if self._by_rank is None:
            self._by_rank = defaultdict(list)
            for occs in self.occurrences.values():
                for o in occs:
                    self._by_rank[o.rank].extend(o.slices.values())
            for lst in self._by_rank.values():
                lst.sort(key=lambda s: s.t0)
        return self._by_rank.get(rank, [])


def _starts_new(o, cat):
    if cat in o.slices:
        return True
    if cat == "queued" and list(o.slices) == ["negotiate"]:
        return False
    return PHASE_INDEX[cat] < o.last


def _key(e):
    return (e.get("ph"), e.get("pid"), e.get("tid"), e.get("cat"), e.get("name"), e.get("ts"),
            e.get("dur"))


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _well_formed(e):
    """Whether a trace event has the fields the summary reads, of the types the engine writes:
    anything else (a hand-edited or damaged file) is counted in Timeline.malformed and set aside,
    never a crash."""
    if not isinstance(e, dict) or not isinstance(e.get("ph"), str):
        return False
    args = e.get("args", {})
    if not isinstance(args, dict):
        return False
    if e["ph"] == "M":  # metadata: a lane's name needs its pid and tid
        lane = e.get("name") == "thread_name"
        return isinstance(e.get("name"), str) and isinstance(args.get("name", ""), str) and \
            (not lane or (isinstance(e.get("tid"), (int, str)) and
                          isinstance(e.get("pid"), (int, str))))
    if not (isinstance(e.get("pid"), int) and not isinstance(e.get("pid"), bool)):
        return False
    if not isinstance(e.get("tid"), (int, str)) or isinstance(e.get("tid"), bool):
        return False
    if not isinstance(e.get("name", ""), str) or not isinstance(e.get("cat", ""), str):
        return False
    if not _number(e.get("ts")) or ("dur" in e and not (_number(e["dur"]) and e["dur"] >= 0)):
        return False
    return not any(isinstance(v, (list, dict)) for k, v in e.items() if k != "args")


def build(events):
    """A Timeline from trace events, in the files' order (per lane, the order they were written)."""
    tl = Timeline()
    tl.events = len(events)
    lanes = {}
    seen = set()
    timed = []
    for i, e in enumerate(events):
        if not _well_formed(e):
            tl.malformed += 1
            continue
        ph = e.get("ph")
        if ph == "M":
            if e.get("name") == "thread_name":
                lanes[(e.get("pid"), e.get("tid"))] = e.get("args", {}).get("name", "?")
            continue
        if ph not in ("X", "i", "I"):
            continue
        k = _key(e)
        if k in seen:
            tl.duplicates += 1
            continue
        seen.add(k)
        timed.append(e)
    current = {}  # (rank, name) -> Occurrence being filled
    ranks = set()
    names = {}
    for e in timed:
        rank = e.get("pid")
        if rank is None:
            continue
        ranks.add(rank)
        cat = e.get("cat")
        if cat == "cycle":
            tl.cycles += 1
            continue
        name = lanes.get((rank, e.get("tid")), "tid %s" % e.get("tid"))
        if "size cap reached" in str(e.get("name", "")):
            tl.capped = True
            continue
        if cat == "ready":
            tl.ready_marks[name].add(e.get("args", {}).get("rank"))
            continue
        key = (rank, name)
        if cat not in PHASE_INDEX:
            if e.get("ph") in ("i", "I") and key in current:  # a failure, named by its status
                current[key].marks.append(str(e.get("name")))
            continue
        names.setdefault(name, None)
        t0 = float(e.get("ts", 0))
        s = Slice(rank, name, cat, e.get("name"), t0, t0 + float(e.get("dur", 0)), e.get("args"))
        o = current.get(key)
        if o is None or _starts_new(o, cat):
            lst = tl.occurrences.setdefault(key, [])
            o = Occurrence(rank, name, len(lst))
            lst.append(o)
            current[key] = o
        o.slices[cat] = s
        o.last = max(o.last, PHASE_INDEX[cat])
        s.occ = o
    tl.ranks = sorted(ranks)
    tl.names = list(names)
    return tl

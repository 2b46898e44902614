"""The --png picture: one typical step, and the run around it.

Left: the median steady-state step (or --step K) as a Gantt chart on one time axis (ms from the
step's first submission on any rank). One band per rank; in a band, one row per tensor in the
order that rank submitted them (or per group of consecutive tensors when there are more than
MAX_ROWS), each with its queued / negotiate / pack / collective / unpack intervals; above the rows,
the band's strip shows the critical path where it runs on that rank, coloured by what it is, with a
black line through it that jumps between bands where the path moves to the rank that was waited
for. The slowest rank's band is tinted and labelled.
Top right: the step time over the run: from first submission to last completion, and the whole
iteration (one step's first submission to the next's); robust y-scale (steps above it are drawn
at the top edge and counted), warm-up shaded, partial steps marked.
Bottom right: where an iteration's time goes, in shares of the sampled steady-state steps'
critical paths (critical.KINDS).

gantt_rows() and path_strips() return exactly what is drawn (so tests compare them with the
events, and the drawn collections with them); render() draws. Matplotlib's Agg backend only.
"""
import math

from . import critical
from .model import PHASES
from .steps import union

MAX_ROWS = 200  # rows per rank band before tensors are grouped
PHASE_COLOR = {"queued": "#c9c9c9", "negotiate": "#f28e2b", "pack": "#8cd17d",
               "collective": "#4e79a7", "unpack": "#59a14f"}
KIND_COLOR = dict(PHASE_COLOR, outside="#ffffff", between="#eeeeee", gap="#b07aa1")
SLOW_COLOR = "#d62728"


class GanttRow:
    """One row of a rank's band: `names` (one tensor, or a group), bars[phase] = [(t0, t1)] in µs
    on the timeline's clock (for a group: the union of its tensors' intervals)."""

    def __init__(self, rank, names, bars):
        self.rank, self.names, self.bars = rank, names, bars

    @property
    def label(self):
        if len(self.names) == 1:
            return self.names[0]
        return "%s .. %s (%d)" % (self.names[0], self.names[-1], len(self.names))


def gantt_rows(step, max_rows=None):
    """rank -> [GanttRow] for Step `step`, tensors in the order the rank submitted them."""
    max_rows = max_rows or MAX_ROWS
    out = {}
    for r in step.ranks:
        per = step.occ[r]
        names = sorted(per, key=lambda n: (per[n].submit, n))
        g = max(1, math.ceil(len(names) / max_rows))
        rows = []
        for i in range(0, len(names), g):
            group = names[i:i + g]
            bars = {}
            for ph in PHASES:
                iv = [(per[n].slices[ph].t0, per[n].slices[ph].t1) for n in group
                      if ph in per[n].slices]
                if iv:
                    bars[ph] = iv if g == 1 else union(iv)
            rows.append(GanttRow(r, group, bars))
        out[r] = rows
    return out


def path_strips(path):
    """rank -> {kind: [(t0, t1)]} of the critical path's segments on that rank."""
    out = {}
    for s in path:
        out.setdefault(s.rank, {}).setdefault(s.kind, []).append((s.t0, s.t1))
    return out


def _layout(ranks, rows):
    """y positions (data units, growing downwards) of each band: its top (the rank's label),
    its critical-path strip (y, h), each row (y, h), its bottom."""
    pos = {}
    y = 0.0
    for r in ranks:
        n = max(len(rows[r]), 1)
        row_h = min(1.0, 14.0 / n)
        strip = (y + 0.8, 0.7)
        first = strip[0] + strip[1] + 0.25
        pos[r] = {"top": y, "strip": strip,
                  "rows": [(first + i * row_h, row_h) for i in range(n)],
                  "bottom": first + n * row_h}
        y = pos[r]["bottom"] + 0.5
    return pos, y


def _rects(intervals, y, h, origin):
    """Rectangles (PolyCollection vertices) of [(t0, t1)] µs intervals, in ms from `origin`."""
    out = []
    for a, b in intervals:
        x0, x1 = (a - origin) / 1e3, (b - origin) / 1e3
        out.append([(x0, y), (x1, y), (x1, y + h), (x0, y + h)])
    return out


def draw_gantt(ax, an, k, max_rows=None):
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch
    st = an.steps
    step = st.step(k)
    rows = gantt_rows(step, max_rows)
    path = an.path(k)
    strips = path_strips(path)
    ranks = step.ranks
    pos, height = _layout(ranks, rows)
    slow = step.slowest_rank() if len(ranks) > 1 else None
    origin = step.start
    noun = "buckets" if "bucket" in st.source else "tensors"
    ticks, labels, colors = [], [], []
    band = ax.get_yaxis_transform()  # x in axes fraction, y in data
    fill = 0.8 if max(len(v) for v in rows.values()) <= 40 else 1.0  # thin rows: no gaps (moire)
    for r in ranks:
        p = pos[r]
        if r == slow:
            ax.axhspan(p["top"], p["bottom"] + 0.25, color=SLOW_COLOR, alpha=0.07, lw=0)
        head = "rank %s" % r
        if r == slow:
            head += ": the slowest, submits %.3f ms after the first rank (mean over tensors)" \
                % (step.mean_lateness(r) / 1e3)
        ax.text(0.005, p["top"] + 0.1, head, transform=band, va="top", ha="left", fontsize=8,
                weight="bold", color=SLOW_COLOR if r == slow else "black")
        for ph in PHASES:
            verts = []
            for row, (y, h) in zip(rows[r], p["rows"]):
                verts += _rects(row.bars.get(ph, []), y + (1 - fill) / 2 * h, fill * h, origin)
            if verts:
                ax.add_collection(PolyCollection(verts, facecolors=PHASE_COLOR[ph], linewidths=0,
                                                 gid="gantt rank=%s phase=%s" % (r, ph)))
        y, h = p["strip"]
        for kind in critical.KINDS:
            iv = strips.get(r, {}).get(kind)
            if iv:
                ax.add_collection(PolyCollection(_rects(iv, y, h, origin),
                                                 facecolors=KIND_COLOR[kind], edgecolors="#555555",
                                                 linewidths=0.3,
                                                 gid="path rank=%s kind=%s" % (r, kind)))
        ticks.append(y + h / 2)
        labels.append("critical path")
        colors.append("black")
        if len(rows[r]) <= 16:
            for row, (ry, rh) in zip(rows[r], p["rows"]):
                ticks.append(ry + rh / 2)
                labels.append(row.label)
                colors.append("#444444")
        else:
            per_row = math.ceil(len(step.occ[r]) / len(rows[r]))
            ax.text(0.995, p["top"] + 0.1, "%d %s, in submission order (top first)%s"
                    % (len(step.occ[r]), noun, "; %d per row" % per_row if per_row > 1 else ""),
                    transform=band, ha="right", va="top", fontsize=7, color="#444444")
    # the path as one line: through the strips, jumping between bands
    xs, ys = [], []
    for s in path:
        y, h = pos[s.rank]["strip"]
        yc = y + h / 2
        xs += [(s.t0 - origin) / 1e3, (s.t1 - origin) / 1e3]
        ys += [yc, yc]
    ax.plot(xs, ys, color="black", lw=1.2, solid_capstyle="butt", gid="path line")
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=7)
    for t, c in zip(ax.get_yticklabels(), colors):
        t.set_color(c)
    ax.tick_params(axis="y", length=0)
    ax.set_ylim(height, -0.2)
    ax.set_xlim(0, step.wall / 1e3 * 1.01 if step.wall > 0 else 1)
    ax.set_xlabel("ms since the step's first submission")
    ax.grid(axis="x", color="#dddddd", lw=0.5)
    ax.set_axisbelow(True)
    handles = [Patch(color=PHASE_COLOR[p], label=p) for p in PHASES]
    from matplotlib.lines import Line2D
    handles.append(Patch(facecolor="white", edgecolor="#555555", label="path: framework"))
    handles.append(Patch(facecolor=KIND_COLOR["gap"], edgecolor="#555555",
                         label="path: in Conflux, between phases"))
    handles.append(Line2D([], [], color="black", lw=1.2, label="critical path"))
    ax.legend(handles=handles, fontsize=7, ncol=9, loc="upper center", bbox_to_anchor=(0.5, -0.07),
              frameon=False)
    return rows, strips


def robust_top(values):
    """An upper y limit that a few huge values (warm-up, a stall) do not flatten the rest under."""
    from .steps import quantile
    if not values:
        return 1.0
    q1, q3 = quantile(values, 0.25), quantile(values, 0.75)
    top = min(max(values), q3 + 3 * (q3 - q1))
    return max(top, quantile(values, 0.5) * 1.5, 1e-3) * 1.1


def draw_step_times(ax, an, k):
    st = an.steps
    idx = [s.index for s in st.steps]
    span = [s.wall / 1e3 for s in st.steps]
    period = [st.period(i) for i in idx]
    steady = set(st.steady)
    ref = [span[i] for i in steady] + [period[i] / 1e3 for i in steady if period[i] is not None]
    top = robust_top(ref or span)
    if st.warmup:
        ax.axvspan(-0.5, st.warmup - 0.5, color="#ffd8a8", alpha=0.6, lw=0, label="warm-up")
    pi = [i for i in idx if period[i] is not None]
    ms = 2 if len(idx) > 200 else 3
    ax.plot(pi, [min(period[i] / 1e3, top) for i in pi], ".", ms=ms, color="#9c9c9c",
            label="iteration (to the next step)")
    ax.plot(idx, [min(v, top) for v in span], ".", ms=ms, color="#4e79a7",
            label="first submission to last completion")
    part = [i for i in idx if not st.steps[i].complete]
    if part:
        ax.plot(part, [min(span[i], top) for i in part], "x", ms=4, color=SLOW_COLOR,
                label="partial (a rank missing)")
    over = [i for i in idx if span[i] > top or (period[i] is not None and period[i] / 1e3 > top)]
    if over:
        ax.plot(over, [top] * len(over), "^", ms=4, color="black", clip_on=False)
        worst = max(max(span[i], (period[i] or 0) / 1e3) for i in over)
        ax.text(0.99, 0.97, "%d step(s) above, up to %.1f ms" % (len(over), worst),
                transform=ax.transAxes, ha="right", va="top", fontsize=7)
    ax.plot([k], [min(span[k], top)], "o", ms=7, mfc="none", mec=SLOW_COLOR, mew=1.5,
            label="pictured step %d" % k)
    ax.set_ylim(0, top)
    ax.set_xlim(-0.5, max(idx) + 0.5 if idx else 0.5)
    ax.set_xlabel("step")
    ax.set_ylabel("ms")
    ax.set_title("step time over the run", fontsize=9)
    ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2,
              frameon=False)
    ax.tick_params(labelsize=7)


def draw_shares(ax, an):
    tot, total = an.shares()
    kinds = list(critical.KINDS)
    vals = [100.0 * tot[kd] / total if total > 0 else 0.0 for kd in kinds]
    y = list(range(len(kinds)))
    ax.barh(y, vals, color=[KIND_COLOR[kd] for kd in kinds], edgecolor="#555555", lw=0.5)
    for yi, v in zip(y, vals):
        ax.text(v + 1, yi, "%.1f %%" % v, va="center", fontsize=7)
    ax.set_yticks(y)
    ax.set_yticklabels([critical.KIND_LABEL[kd] for kd in kinds], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, max(vals + [1]) * 1.25)
    ax.set_xlabel("% of the iteration (critical path)", fontsize=8)
    ax.set_title("where an iteration's time goes (%d steady-state steps)" % len(an.path_steps),
                 fontsize=9)
    ax.tick_params(axis="x", labelsize=7)


def render(an, out, k=None, dpi=90):
    """Draws the picture of step k (default: the median steady-state step) into file `out`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    st = an.steps
    if not st.steps:
        raise ValueError("no steps in the timeline (no tensor events)")
    if k is None:
        k = st.median if st.median is not None else max(range(len(st.steps)),
                                                        key=lambda i: st.steps[i].complete)
    fig = figure(an, k, plt, dpi)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return k


def figure(an, k, plt, dpi=90):
    st = an.steps
    step = st.step(k)
    nrows = sum(min(len(step.occ[r]), MAX_ROWS) for r in step.ranks)
    h = min(11.0, 5.0 + 0.12 * min(nrows, 40) + 0.4 * len(step.ranks))
    fig = plt.figure(figsize=(15, h), dpi=dpi)
    gs = fig.add_gridspec(2, 2, width_ratios=[2.3, 1], height_ratios=[1.15, 1], wspace=0.42,
                          hspace=0.75, left=0.13, right=0.98, top=0.86, bottom=0.1)
    axg = fig.add_subplot(gs[:, 0])
    draw_gantt(axg, an, k)
    what = "the median of %d steady-state steps" % len(st.steady) if k == st.median else \
        "chosen with --step"
    axg.set_title("step %d (%s): %.2f ms from first submission to last completion"
                  % (k, what, step.wall / 1e3), fontsize=9)
    draw_step_times(fig.add_subplot(gs[0, 1]), an, k)
    draw_shares(fig.add_subplot(gs[1, 1]), an)
    fig.suptitle(headline(an, k), fontsize=10, x=0.02, ha="left")
    return fig


def headline(an, k):
    st = an.steps
    step = st.step(k)
    tot, total = an.shares()
    lines = ["Conflux timeline: %d ranks, %d steps found from %s (%d tensors), %d warm-up"
             % (len(an.tl.ranks), len(st.steps), st.source, len(st.names), st.warmup)]
    parts = []
    if total > 0:
        big = sorted((kd for kd in critical.KINDS if tot[kd] >= 0.005 * total),
                     key=lambda kd: -tot[kd])
        parts.append("where an iteration goes (critical path): " + ", ".join(
            "%s %.0f %%" % (critical.KIND_LABEL[kd], 100.0 * tot[kd] / total) for kd in big))
    if len(step.ranks) > 1:
        parts.append("slowest rank of step %d: %s" % (k, step.slowest_rank()))
    if parts:
        lines.append("; ".join(parts))
    return "\n".join(lines)

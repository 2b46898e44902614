"""Reading timeline files: per-rank files, merged files, files without their closing bracket
(a job still running, or killed) and files whose last record was cut short (killed mid-write)."""
import json


class Loaded:
    def __init__(self, events, dropped_tail, had_bracket):
        self.events = events
        self.dropped_tail = dropped_tail  # records cut short at the end (0 or 1)
        self.had_bracket = had_bracket


def _events_of(obj):
    if isinstance(obj, dict):
        return list(obj.get("traceEvents", []))
    return list(obj)


def load_text(text):
    """Parses a timeline's text. Python's json needs the closing bracket that Chrome's format makes
    optional, so: whole text first; then with ']' appended; then record by record, one per line (as
    Conflux writes them), dropping a cut-short last record."""
    stripped = text.rstrip()
    try:
        return Loaded(_events_of(json.loads(stripped)), 0, True)
    except ValueError:
        pass
    try:
        return Loaded(_events_of(json.loads(stripped.rstrip(",") + "]")), 0, False)
    except ValueError:
        pass
    events, dropped = [], 0
    lines = text.split("\n")
    last = max((i for i, l in enumerate(lines) if l.strip()), default=-1)
    for i, line in enumerate(lines):
        s = line.strip().lstrip(",").rstrip(",").strip()
        if s in ("", "[", "]"):
            continue
        if s.startswith("["):
            s = s[1:].lstrip(",").strip()
        if s.endswith("]"):
            s = s[:-1].rstrip(",").strip()
        if not s:
            continue
        try:
            events.append(json.loads(s))
        except ValueError:
            if i == last:
                dropped += 1
                continue
            raise ValueError("line %d is not a trace event: %.80s" % (i + 1, line))
    return Loaded(events, dropped, stripped.endswith("]"))


def load(path):
    with open(path, "rb") as f:
        return load_text(f.read().decode("utf-8", errors="replace"))


def load_all(paths):
    """Events of every file, in one list, plus per-file notes."""
    events, notes = [], []
    for p in paths:
        got = load(p)
        events.extend(got.events)
        if got.dropped_tail:
            notes.append("%s: last record cut short (killed mid-write?); dropped" % p)
        if not got.had_bracket:
            notes.append("%s: no closing bracket (still running, or killed); loaded anyway" % p)
    return events, notes


def merge(paths, out):
    """Writes the events of every file as one valid JSON array (Perfetto, chrome://tracing)."""
    events, notes = load_all(paths)
    with open(out, "w") as f:
        f.write("[\n")
        for i, e in enumerate(events):
            f.write(("," if i else "") + json.dumps(e, separators=(",", ":")) + "\n")
        f.write("]\n")
    return notes

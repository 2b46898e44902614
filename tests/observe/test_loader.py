#!/usr/bin/python3
"""tools/cfx-timeline's loader: a complete file, one without the closing bracket (what a killed
job leaves; Python's json refuses it), one whose last record is cut short, a merged file, and the
summary and plot on them."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402

t = tlcheck.load_tool()
HEAD = ('[\n{"name":"process_name","ph":"M","pid":0,"args":{"name":"rank 0"}}\n'
        ',{"name":"thread_name","ph":"M","pid":0,"tid":1,"args":{"name":"g"}}\n')
EVENTS = [',{"name":"%s","cat":"%s","ph":"X","pid":0,"tid":1,"ts":%d,"dur":10}\n' % (n, c, 10 * i)
          for i, (n, c) in enumerate([("QUEUED", "queued"), ("NEGOTIATE", "negotiate"),
                                      ("PACK", "pack"), ("ALLREDUCE", "collective"),
                                      ("UNPACK", "unpack")])]
EVENTS.append(',{"name":"rank 0 ready","cat":"ready","ph":"i","s":"t","pid":0,"tid":1,"ts":12,'
              '"args":{"rank":0}}\n')
body = HEAD + "".join(EVENTS)

full = t.load_text(body + "]\n")
assert full.had_bracket and len(full.events) == 8 and full.dropped_tail == 0
try:
    json.loads(body)
    raise AssertionError("Python's json accepted a file without its closing bracket")
except ValueError:
    pass
open_ = t.load_text(body)
assert not open_.had_bracket and len(open_.events) == 8 and open_.dropped_tail == 0
cut = t.load_text(body + ',{"name":"QUEUED","cat":"que')
assert len(cut.events) == 8 and cut.dropped_tail == 1, (len(cut.events), cut.dropped_tail)
s = t.analyze(cut.events)
assert s["tensors"][0]["phases"] == t.PHASES and s["tensors"][0]["ready_ranks"] == [0], s
assert abs(s["phase_totals_us"]["collective"] - 10) < 1e-9
try:
    t.load_text(HEAD + ',{"broken\n' + "".join(EVENTS))
    raise AssertionError("a broken record in the middle was accepted")
except ValueError:
    pass

with tempfile.TemporaryDirectory() as d:
    a, m, png = os.path.join(d, "a.json"), os.path.join(d, "m.json"), os.path.join(d, "p.png")
    open(a, "w").write(body + ',{"name":"QUEUED","cat":"que')
    r = subprocess.run(tlcheck.COMMAND + [a, "--merge", m, "--png", png], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert "cut short" in r.stderr and "no closing bracket" in r.stderr, r.stderr
    assert len(json.load(open(m))) == 8  # the merged file is plain, valid JSON
    assert os.path.getsize(png) > 1000
print("loader ok")

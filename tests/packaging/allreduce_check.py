"""allreduce_check.py PREFIX NP, under mpirun: the conflux package imports from under PREFIX and
maps libconflux from there too, the job has NP ranks, and a float32 allreduce gives on every rank the sum of what each rank contributed
((rank + 1) * (i + 1) at element i), computed here from the ranks' formula."""
import os
import sys

import numpy as np

import conflux

prefix, np_want = os.path.realpath(sys.argv[1]), int(sys.argv[2])
where = os.path.realpath(conflux.__file__)
if not where.startswith(prefix + os.sep):
    sys.exit("FAIL: conflux imported from %s, not from under %s" % (where, prefix))
with open("/proc/self/maps") as f:
    libs = {line.split(None, 5)[5].strip() for line in f if "libconflux.so" in line}
if not libs or any(not os.path.realpath(p).startswith(prefix + os.sep) for p in libs):
    sys.exit("FAIL: libconflux mapped from %s, not from under %s" % (sorted(libs), prefix))
conflux.init()
rank, size = conflux.rank(), conflux.size()
if size != np_want:
    sys.exit("FAIL: rank %d sees a job of %d ranks, not %d" % (rank, size, np_want))
n = 1000
x = (rank + 1) * np.arange(1, n + 1, dtype=np.float32)
x = conflux.allreduce(x, op=conflux.Sum, name="packaging.check")
want = sum(r + 1 for r in range(size)) * np.arange(1, n + 1, dtype=np.float32)
if not np.array_equal(x, want):
    bad = int(np.flatnonzero(x != want)[0])
    sys.exit("FAIL: rank %d: element %d is %g, the ranks' sum is %g" % (rank, bad, x[bad], want[bad]))
# one write per line: the ranks' lines must not interleave
sys.stdout.write("rank %d of %d: allreduce ok, conflux %s from %s\n"
                 % (rank, size, conflux.version(), os.path.dirname(where)))
sys.stdout.flush()
conflux.shutdown()

"""The Python side of the cross-language test (see crosslang.c): the same input and collectives
through the conflux package. Usage: PYTHONPATH=build/python python3 crosslang.py [gradset] OUT_PREFIX
(gradset: the mixed job's gradient set, see crosslang.c; registered here in canonical order rotated by
3 + rank, ready in registration order)"""
import math
import sys

import numpy as np

import conflux

N = 1000


def gradset(prefix):
    grads = [("xg.w", np.float32, (3, 4)), ("xg.b", np.float64, (5,)), ("xg.n", np.int32, (6,)),
             ("xg.v", np.float32, (2, 3, 2))]
    conflux.init()
    rank, size = conflux.rank(), conflux.size()
    ranksum = sum(q + 1 for q in range(size))
    order = [(j + 3 + rank) % 4 for j in range(4)]
    out = []
    with conflux.GradientSet("xl.gs", op=conflux.Sum, bucket_bytes=64) as gs:
        index = {k: gs.add(grads[k][0], grads[k][2], grads[k][1]) for k in order}
        gs.commit()
        arrays = {k: gs.array(index[k]) for k in range(4)}
        for s in range(3):
            for k, (name, dt, shape) in enumerate(grads):
                v = (rank + 1) * (k + 1) + 3 * np.arange(arrays[k].size) + 7 * s - 20
                arrays[k][...] = (v if dt == np.int32 else v / 4).reshape(shape)
            for k in order:
                if k != s:
                    gs.ready(index[k])
            gs.wait(timeout=60)
            for k, (name, dt, shape) in enumerate(grads):
                want = ranksum * (k + 1) + size * (3 * np.arange(arrays[k].size) + 7 * s - 20)
                got = arrays[k].reshape(-1).astype(np.float64) * (1 if dt == np.int32 else 4)
                if arrays[k].dtype != dt or arrays[k].shape != shape or not np.array_equal(got, want):
                    sys.exit(f"crosslang.py: rank {rank} step {s} {name}: {arrays[k]} != sum {want}")
                out.append(arrays[k].tobytes())
    with open(f"{prefix}.{rank}.bin", "wb") as f:
        f.write(b"".join(out))
    conflux.shutdown()


if sys.argv[1] == "gradset":
    gradset(sys.argv[2])
    sys.exit(0)
conflux.init()
rank = conflux.rank()
x = np.array([math.sin(i * 0.1 + rank) for i in range(N)], dtype=np.float32)
s = conflux.allreduce(x, op=conflux.Sum, name="xl.sum")
a = conflux.allreduce(x, op=conflux.Average, name="xl.avg")
with open(f"{sys.argv[1]}.{rank}.bin", "wb") as f:
    f.write(x.astype(np.float32).tobytes() + s.astype(np.float32).tobytes() + a.astype(np.float32).tobytes())
conflux.shutdown()

"""The Python side of the cross-language test (see crosslang.c): the same input and collectives
through the conflux package. Usage: PYTHONPATH=build/python python3 crosslang.py OUT_PREFIX"""
import math
import sys

import numpy as np

import conflux

N = 1000
conflux.init()
rank = conflux.rank()
x = np.array([math.sin(i * 0.1 + rank) for i in range(N)], dtype=np.float32)
s = conflux.allreduce(x, op=conflux.Sum, name="xl.sum")
a = conflux.allreduce(x, op=conflux.Average, name="xl.avg")
with open(f"{sys.argv[1]}.{rank}.bin", "wb") as f:
    f.write(x.astype(np.float32).tobytes() + s.astype(np.float32).tobytes() + a.astype(np.float32).tobytes())
conflux.shutdown()

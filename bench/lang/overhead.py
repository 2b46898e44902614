"""bench/lang/overhead.py ITERS [BLOCKS]: per-call overhead of the Python package, at any number of
ranks under mpirun. Times a blocking 1-element float32 SUM allreduce named "ovh" from
- c-in-python: the C loop of overhead.c run inside this process (bench_loops.allreduce: loops.c
  through ctypes, GIL released): the baseline, same process, context and load;
- py-numpy: conflux.allreduce_(array, op=Sum, name="ovh");
- py-torch: conflux.torch.allreduce_(tensor, ...), in place;
- py-torch-new: conflux.torch.allreduce(tensor, ...), a new tensor;
- py-torch-async: conflux.torch.synchronize(conflux.torch.allreduce_async_(tensor, ...));
- py-horovod: conflux.horovod.torch.allreduce_(tensor, op=Sum, name="ovh"),
interleaved in BLOCKS blocks (block -1 warms up and is not counted). Rank 0 prints
"<path> <median_us> <p10> <p90>" per path, as Overhead.java and overhead.lua do."""
import sys
import time

import numpy as np

import conflux
from conflux import _core

import bench_loops  # bench/lang: the C loop, bench-only


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    blocks = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    per = max(iters // blocks, 1)
    conflux.init()
    paths = {}
    a = np.ones(1, np.float32)
    paths["py-numpy"] = lambda: conflux.allreduce_(a, op=conflux.Sum, name="ovh")
    try:
        import torch
        import conflux.torch as cfx
        import conflux.horovod.torch as hvd
    except ImportError as e:  # say why the torch rows are missing, never fake them
        print("overhead.py: no torch rows (%s)" % e, file=sys.stderr)
    else:
        torch.set_num_threads(1)
        hvd.init()
        t = torch.ones(1)
        paths["py-torch"] = lambda: cfx.allreduce_(t, op=cfx.Sum, name="ovh")
        paths["py-torch-new"] = lambda: cfx.allreduce(t, op=cfx.Sum, name="ovh")
        paths["py-torch-async"] = lambda: cfx.synchronize(cfx.allreduce_async_(t, op=cfx.Sum, name="ovh"))
        paths["py-horovod"] = lambda: hvd.allreduce_(t, op=hvd.Sum, name="ovh")
    c_loop = bench_loops.allreduce
    ptr = _core.current().address
    times = {"c-in-python": []}
    times.update((k, []) for k in paths)
    clock = time.perf_counter_ns
    for k in range(-1, blocks):
        tc = c_loop(ptr, per)
        if k >= 0:
            times["c-in-python"] += tc
        for name, call in paths.items():
            out = times[name]
            for _ in range(per):
                t0 = clock()
                call()
                t1 = clock()
                if k >= 0:
                    out.append((t1 - t0) / 1e3)
    # the values are checked once: every rank contributed 1, so each sum is the rank count
    n = conflux.size()
    a[0] = 1.0
    conflux.allreduce_(a, op=conflux.Sum, name="ovh")
    if a[0] != n:
        sys.exit("overhead.py: wrong sum %r (expected %d)" % (a[0], n))
    if conflux.rank() == 0:
        for name, ts in times.items():
            ts.sort()
            print("%s %.2f %.2f %.2f" % (name, ts[len(ts) // 2], ts[len(ts) // 10], ts[len(ts) * 9 // 10]),
                  flush=True)
    conflux.shutdown()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Python side of the Conflux benchmark: torch.distributed (Gloo) and conflux.torch on the same tensors.

Launched by bench/run under mpirun with the same number of ranks as the C benchmark. It reads the
workload spec the C benchmark wrote (--spec), so both sides time exactly the same tensors, and writes raw
rows in the C benchmark's CSV format (--raw) with methods:
  torch_gloo     torch.distributed Gloo: async all_reduce of every tensor (reverse order), then wait all
  torch_conflux  conflux.torch: allreduce_async_ of every tensor (reverse order), then synchronize all
                 (only when the package imports; otherwise one 'n/a' row says why)
  torch_conflux_shared  the same on tensors from conflux.torch.shared_zeros (shared tensor memory)
  torch_conflux_optimizer  model and many-tensor workloads: conflux.torch.DistributedOptimizer (op Sum,
                 default gradient storage: each .grad a view into its gradient set) over parameters of the
                 workload's shapes; a step calls the optimizer's hooks as backward does once it accumulated
                 each gradient, in reverse registration order, then synchronize() (the C row: conflux_gradset).
                 Hooks in C++ (conflux._torch_native) are called from C++ as autograd calls them, Python
                 hooks from Python as autograd calls those (the set's fire_all)
  torch_c_gradset  the C gradient-set step (conflux_gradset's) on such an optimizer's set, from C in
                 this process, timed in the same rounds: the reference of the optimizer rows
  torch_hvd_optimizer  the same step through conflux.horovod.torch's DistributedOptimizer (its gradient
                 sets), timed in the same rounds as torch_conflux_optimizer, alternating which goes first;
                 a line per workload prints the ratio of their medians (hvd / conflux.torch)
Timing as in C: a barrier before each repeat (the library's own: Gloo's for Gloo, Conflux's for
Conflux), perf_counter around the step, the max over ranks of
each repeat, median/min/max after warm-up. Every workload's results are checked once per run against the
known per-rank pattern (rank r puts (r + 1) + ((7 i + j) mod 13) into element j of tensor i).
Repeat counts are the spec's, capped (not for the optimizer rows), and cut short by a time budget per row
(8 s full, 3 s quick): Gloo is ~100x slower than MPI on small tensors. The checked step before timing
doubles as a warm-up.
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

CAPS = {  # (warm-up cap, repeats cap) per group for the full/quick modes
    "latency": (20, 500),
    "sweep": (1, 20),
    "model": (1, 5),
    "many": (1, 5),
}


def read_spec(path):
    workloads = []
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            parts = line.split()
            if parts[0] == "W":
                workloads.append(dict(group=parts[1], name=parts[2], warmup=int(parts[3]), reps=int(parts[4]),
                                      inner=int(parts[5]), tensors=[]))
            elif parts[0] == "T":
                dims = [int(d) for d in parts[2].split("x")]
                workloads[-1]["tensors"].append((parts[1], dims))
    return workloads


def pattern(rank, i, count):
    return ((7 * i + np.arange(count, dtype=np.int64)) % 13).astype(np.float32) + np.float32(rank + 1)


def fill(tensors, rank):
    for i, t in enumerate(tensors):
        t.view(-1).copy_(torch.from_numpy(pattern(rank, i, t.numel())))


def check(tensors, size):
    base = size * (size + 1) // 2
    for i, t in enumerate(tensors):
        want = (pattern(0, i, t.numel()) - np.float32(1)) * np.float32(size) + np.float32(base)
        got = t.view(-1).numpy()
        if not np.array_equal(got, want):
            j = int(np.argmax(got != want))
            return "tensor %d element %d = %g, want %g" % (i, j, got[j], want[j])
    return None


class Timer:
    """Repeats until `reps` samples or `budget_s` of measured time, whichever comes first (at least one):
    Gloo needs seconds per step where MPI needs milliseconds. Each repeat starts at the barrier of the
    library under test (Gloo's for Gloo, Conflux's for Conflux: another library's traffic right before
    a lone small collective, and Gloo's I/O threads after it, would be measured with it). Samples are
    kept per rank and maxed over the ranks at the end; the budget is agreed every BUDGET_EVERY rounds
    (max over ranks, so every rank takes the same decision)."""
    BUDGET_EVERY = 16

    def __init__(self, budget_s):
        self.budget_s = budget_s

    def run(self, steps, warmup, reps, inner, barriers=None):
        """Times `steps` in the same rounds (each round times every step once, which goes first rotating
        from round to round; the budget is per step); `barriers[i]` starts step i's repeats (default
        dist.barrier); returns their (median, min, max, count) in order."""
        barriers = barriers or [dist.barrier] * len(steps)
        samples, spent = [[] for _ in steps], 0.0
        for r in range(warmup + reps):
            for k in range(len(steps)):
                i = (k + r) % len(steps)
                barriers[i]()
                t0 = time.perf_counter()
                for _ in range(inner):
                    steps[i]()
                dt = (time.perf_counter() - t0) / inner
                if r >= warmup:
                    samples[i].append(dt)
                spent += dt * inner
            last = r == warmup + reps - 1
            if samples[0] and not last and (r + 1) % self.BUDGET_EVERY == 0:
                most = torch.tensor([spent], dtype=torch.float64)
                dist.all_reduce(most, op=dist.ReduceOp.MAX)
                if float(most[0]) > self.budget_s * len(steps):
                    break
        out = []
        for s in samples:  # every rank has the same number of samples: the decisions were agreed
            t = torch.tensor(s, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            out.append(summary(t.tolist()))
        return out


def summary(samples):
    """(median, min, max, count) of timing samples."""
    samples = sorted(samples)
    n = len(samples)
    med = samples[n // 2] if n % 2 else 0.5 * (samples[n // 2 - 1] + samples[n // 2])
    return med, samples[0], samples[-1], n


def gloo_step(tensors):
    works = [dist.all_reduce(t, async_op=True) for t in reversed(tensors)]
    for w in works:
        w.wait()


def make_conflux_step(cfx, tensors, names):
    def step():
        hs = [cfx.allreduce_async_(tensors[i], name=names[i], op=cfx.Sum) for i in range(len(tensors) - 1, -1, -1)]
        for h in hs:
            cfx.synchronize(h)
    return step


def make_optimizer(module, w):
    """torch_conflux_optimizer (module conflux.torch) and torch_hvd_optimizer (conflux.horovod.torch):
    the gradients (the .grad views into the optimizer's gradient set) and a step that runs the hooks
    autograd runs after accumulating each gradient, last parameter first (C++ hooks from C++, Python
    ones from Python, as autograd calls each), then synchronize(). One real
    backward pass first (hvd's optimizer learns from it which gradients are sparse: none). The optimizer
    goes with the step (its sets are freed with the views)."""
    params = [torch.nn.Parameter(torch.zeros(*d, dtype=torch.float32)) for _, d in w["tensors"]]
    opt = module.DistributedOptimizer(torch.optim.SGD(params, lr=0.0), op=module.Sum,
                                      named_parameters=[(n, p) for (n, _), p in zip(w["tensors"], params)])
    sum(p.sum() for p in params).backward()
    opt.synchronize()
    opt.zero_grad(set_to_none=False)  # the views stay, zeroed: the step fills them
    hooked = sum(len(s.hooks) for s in opt._sets)
    if hooked != len(params):
        raise AssertionError("%s: %d of %d gradients in gradient sets" % (module.__name__, hooked, len(params)))
    sets = opt._sets[::-1]

    def step():
        for s in sets:  # C++ hooks from C++, Python ones from Python, as autograd calls each
            s.fire_all()
        opt.synchronize()
    step.optimizer = opt
    return [p.grad for p in params], step


def make_c_gradset_step(module, w):
    """torch_c_gradset: the C gradient-set step of bench/run's conflux_gradset row (every gradient
    marked ready, last first, then wait; bench/lang/bench_loops.gradset with the GIL released) on the
    gradient set of an optimizer made as make_optimizer makes it: the optimizer row's C reference,
    in the same process and the same rounds."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lang"))
    import bench_loops  # bench/lang: the C loops, bench-only
    grads, hooked = make_optimizer(module, w)
    opt = hooked.optimizer
    if len(opt._sets) != 1:
        raise AssertionError("%d gradient sets, expected one" % len(opt._sets))
    ptr, count = int(opt._sets[0].native.ptr), len(grads)
    run = bench_loops.gradset

    def step():
        run(ptr, count, 1)
    step.optimizer = opt  # keeps the set alive with the step
    return grads, step


def init_gloo():
    """torch.distributed's default group on Gloo over env:// with mpirun's rank and size (also used
    by torch_autograd.py); returns (rank, size)."""
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if "MASTER_PORT" not in os.environ and os.environ.get("PMIX_NAMESPACE", "").isdigit():
        # Without bench/run's free port (ctest): one every rank derives alike from mpirun's job id,
        # so that concurrent jobs pick different ones.
        os.environ["MASTER_PORT"] = str(20000 + int(os.environ["PMIX_NAMESPACE"]) % 30000)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=size)
    return rank, size


def finish(out, failures):
    """Leaves the group together, closes rank 0's raw file; the exit status (1 if a check failed)."""
    dist.barrier()
    dist.destroy_process_group()
    if out:
        out.close()
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--raw", required=True)
    ap.add_argument("--mode", choices=["full", "quick", "smoke"], default="full")
    ap.add_argument("--conflux", choices=["auto", "off"], default="auto",
                    help="auto: also time conflux.torch when it imports")
    args = ap.parse_args()

    rank, size = init_gloo()
    torch.set_num_threads(1)

    workloads = read_spec(args.spec)
    timer = Timer({"full": 8.0, "quick": 3.0, "smoke": 0.0}[args.mode])
    out = open(args.raw, "w") if rank == 0 else None
    failures = 0

    def emit(w, method, res, chk):
        if rank != 0:
            return
        nbytes = sum(int(np.prod(d)) for _, d in w["tensors"]) * 4
        med, mn, mx, n = res
        out.write("%s,%s,%d,%d,%s,%d,%.9g,%.9g,%.9g,%s\n" % (w["group"], w["name"], len(w["tensors"]), nbytes,
                                                            method, n, med, mn, mx, chk))
        out.flush()
        print("  %-9s %-16s %-16s median %12.3f us  (min %.3f, max %.3f)  %s" % (
            w["group"], w["name"], method, med * 1e6, mn * 1e6, mx * 1e6, chk), flush=True)

    def reps_for(w, capped=True):
        """(warm-up, repeats) of workload w: the spec's, capped for the Gloo-paced rows (CAPS)."""
        if args.mode == "smoke":
            return 0, 1
        if not capped:
            return w["warmup"], w["reps"]
        cw, cr = CAPS[w["group"]]
        return min(w["warmup"], cw), min(w["reps"], cr)

    def all_ok(msg):
        flag = torch.tensor([0 if msg else 1], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag[0])

    if rank == 0:
        out.write("group,workload,tensors,bytes,method,reps,median_s,min_s,max_s,check\n")
        print("torch_gloo.py: %d ranks, torch %s, mode %s" % (size, torch.__version__, args.mode), flush=True)

    def per_tensor(make_step, zeros=torch.zeros):
        """make(w) for a step over tensors allocated here."""
        def make(w):
            tensors = [zeros(*d, dtype=torch.float32) for _, d in w["tensors"]]
            return tensors, make_step(tensors, [n for n, _ in w["tensors"]])
        return make

    def checked_step(method, make, w):
        """make(w) -> (tensors, step): the step, its result checked once; (step, "ok" or "FAIL")."""
        nonlocal failures
        tensors, step = make(w)
        fill(tensors, rank)
        step()
        msg = check(tensors, size)
        if msg:
            print("[rank %d] CHECK FAILED %s %s: %s" % (rank, method, w["name"], msg), file=sys.stderr, flush=True)
        ok = all_ok(msg)
        failures += not ok
        for t in tensors:
            t.zero_()
        return step, "ok" if ok else "FAIL"

    def run_backend(method, make, groups=None):
        """make(w) -> (tensors, step) for each workload (of `groups`, None: all)."""
        run_together([(method, make)], groups)

    def run_together(methods, groups=None, capped=True):
        """run_backend for several (method, make) timed in the same rounds, alternating (Timer.run);
        with more, a line per method with the ratio of its median to the first's. capped=False: the spec's
        repeat counts (rows without Gloo's pace), still within the time budget."""
        for w in workloads:
            if groups and w["group"] not in groups:
                continue
            steps = [checked_step(method, make, w) for method, make in methods]
            warm, reps = reps_for(w, capped)
            barriers = [dist.barrier if method == "torch_gloo" else conflux_barrier for method, _ in methods]
            results = timer.run([step for step, _ in steps], warm, reps,
                                w["inner"] if args.mode != "smoke" else 1, barriers)
            for (method, _), (_, chk), res in zip(methods, steps, results):
                emit(w, method, res, chk)
            for (method, _), res in list(zip(methods, results))[1:]:
                if rank == 0:
                    print("  %-9s %-16s %s / %s (medians) = %.3f" % (w["group"], w["name"], method, methods[0][0],
                                                                    res[0] / results[0][0]), flush=True)
            del steps  # a gradient set goes with its views before the next one is made

    cfx, why, conflux_barrier = None, None, None
    if args.conflux == "auto":
        try:
            import conflux.torch as cfx
            cfx.init()
        except Exception as e:  # the package is optional; say why it is missing, never fake a row
            cfx = None
            why = "n/a (python package not importable: %s)" % str(e).replace(",", ";").splitlines()[0][:120]
        else:
            conflux_barrier = cfx.barrier  # the repeats of Conflux's rows start at it (Timer)

    run_backend("torch_gloo", per_tensor(lambda tensors, names: (lambda: gloo_step(tensors))))

    if args.conflux == "auto":
        if cfx is None:
            if rank == 0:
                out.write("python,torch_conflux,0,0,torch_conflux,0,,,,%s\n" % why)
                print("  torch_conflux: " + why, flush=True)
        else:
            run_backend("torch_conflux", per_tensor(lambda tensors, names: make_conflux_step(cfx, tensors, names)))
            run_backend("torch_conflux_shared", per_tensor(lambda tensors, names: make_conflux_step(cfx, tensors, names),
                                                           cfx.shared_zeros))
            optimizers = [("torch_conflux_optimizer", lambda w: make_optimizer(cfx, w)),
                          ("torch_c_gradset", lambda w: make_c_gradset_step(cfx, w))]
            try:
                import conflux.horovod.torch as hvd
                hvd.init()
            except Exception as e:
                if rank == 0:
                    why = "n/a (conflux.horovod.torch not importable: %s)" % str(e).replace(",", ";")[:120]
                    out.write("python,torch_hvd_optimizer,0,0,torch_hvd_optimizer,0,,,,%s\n" % why)
                    print("  torch_hvd_optimizer: " + why, flush=True)
            else:
                optimizers.append(("torch_hvd_optimizer", lambda w: make_optimizer(hvd, w)))
            run_together(optimizers, groups=("model", "many"), capped=False)
            if hasattr(cfx, "shutdown"):
                cfx.shutdown()

    return finish(out, failures)


if __name__ == "__main__":
    sys.exit(main())

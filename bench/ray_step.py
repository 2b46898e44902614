#!/usr/bin/python3
"""The ResNet-50-shaped training step where Ray runs the workers: Conflux's RayExecutor beside Ray
Train's DDP on Gloo (issue #44's bar: communication <= 0.3x Ray Train's).

    .venv/bin/python bench/ray_step.py [--workers 2] [--mode full|quick|smoke] [--nodes 1|2]

Starts its own Ray (one node of --workers CPUs; --nodes 2: Ray's multi-node test cluster, two
nodes on this machine, the workers spread over them), then times in the workers:
  ray_executor_conflux     RayExecutor(num_workers=N): conflux.torch.DistributedOptimizer at its
                           defaults on bench/torch_autograd.py's ResNet50Shaped (the 161
                           parameters of bench/workloads/resnet50.tsv, 102 MB, a cheap elementwise
                           loss: communication has little compute to hide behind)
  ray_train_ddp_gloo       Ray Train's TorchTrainer at its defaults on the CPU (TorchConfig():
                           backend gloo), DistributedDataParallel at its defaults on the same model
  ray_train_ddp_conflux    the same with TorchConfig(backend="conflux") (the backend registered in
                           every worker by conflux.ray.setup_hook, Ray's worker_process_setup_hook)
In each job every step is timed from a barrier to the step's return, the max over ranks; the job
also times the step of the same model with the plain optimizer (no communication) in the same
rounds, the order alternating ("local"), so communication = step - local of the same job.
Checks (the run fails on any): the first step leaves every parameter at the mean over ranks of
its target (bench/torch_autograd.py's check) and the parameters end bitwise equal on every rank.
Output: one CSV row per job (median/min/p90 of the step and of its local step, communication),
then the ratio of Conflux's communication to Ray Train on Gloo's, against the bar.
"""
import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPS = {"full": (5, 40), "quick": (3, 15), "smoke": (1, 3)}  # warm-up, timed steps
BAR = 0.3


# ---- what runs in the workers (this file is importable there: bench/ is on their PYTHONPATH) ----
def _setup(threads):
    import torch
    from torch_autograd import keep_freed_memory
    keep_freed_memory()
    torch.set_num_threads(threads)


def _first_step_ok(model, shapes, size):
    import torch
    from torch_autograd import expected_after_first_step
    want = expected_after_first_step(shapes, size)
    for i, p in enumerate(model.parameters()):
        got = p.detach().view(-1)
        if not torch.allclose(got, torch.full_like(got, want[i]), rtol=1e-6, atol=0):
            return "parameter %d (%s): %r, want %r" % (i, shapes[i][0], float(got[0]), want[i])
    return None


def time_job(kind, rank, size, reps, threads):
    """Times `kind` (conflux_optimizer, ddp) beside the plain step in this worker; rank 0's
    return value is the job's: {method: samples}, the check."""
    import torch
    import torch.distributed as dist
    from model_shapes import read_tsv
    from torch_autograd import ResNet50Shaped, digest
    _setup(threads)
    shapes = read_tsv(os.path.join(HERE, "workloads", "resnet50.tsv"))
    if kind == "conflux_optimizer":
        import conflux.torch as cfx
        barrier = cfx.barrier

        def max_over_ranks(values):
            return cfx.allreduce(torch.tensor(values, dtype=torch.float64), op=cfx.Max,
                                 name="bench.max").tolist()

        def same_everywhere(value):
            t = cfx.allreduce(torch.tensor([value, -value], dtype=torch.int64), op=cfx.Max,
                              name="bench.digest")
            return int(t[0]) == value and int(t[1]) == -value
        m = ResNet50Shaped(shapes, rank)
        opt = cfx.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1.0),
                                       named_parameters=m.named_parameters())
        method, inner = (m, opt), m
    else:
        barrier = dist.barrier

        def max_over_ranks(values):
            t = torch.tensor(values, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return t.tolist()

        def same_everywhere(value):
            t = torch.tensor([value, -value], dtype=torch.int64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return int(t[0]) == value and int(t[1]) == -value
        inner = ResNet50Shaped(shapes, rank)
        ddp = torch.nn.parallel.DistributedDataParallel(inner)
        method = (ddp, torch.optim.SGD(ddp.parameters(), lr=1.0))
    local_model = ResNet50Shaped(shapes, rank)
    local = (local_model, torch.optim.SGD(local_model.parameters(), lr=1.0))

    def step(pair):
        model, opt = pair
        opt.zero_grad()
        model(None).backward()
        opt.step()

    step(method)  # the checked first step (also a warm-up)
    bad = _first_step_ok(inner, shapes, size)
    step(local)
    warm, timed = reps
    samples = {"step": [], "local": []}
    for r in range(warm + timed):
        order = (("step", method), ("local", local)) if r % 2 == 0 else \
            (("local", local), ("step", method))
        for name, pair in order:
            barrier()
            t0 = time.perf_counter()
            step(pair)
            dt = max_over_ranks([time.perf_counter() - t0])[0]
            if r >= warm:
                samples[name].append(dt)
    same = same_everywhere(digest(inner))
    return {"rank": rank, "size": size, "samples": samples, "first_step": bad, "same": same}


def executor_job(reps, threads):
    import conflux.torch as cfx
    cfx.init()
    return time_job("conflux_optimizer", cfx.rank(), cfx.size(), reps, threads)


def train_loop(config):
    import torch.distributed as dist
    out = time_job("ddp", dist.get_rank(), dist.get_world_size(), config["reps"],
                   config["threads"])
    with open(os.path.join(config["out"], "rank%d.json" % out["rank"]), "w") as f:
        json.dump(out, f)


# ---- the driver ----
def summary(samples):
    s = sorted(samples)
    n = len(s)
    med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    return med, s[0], s[min(n - 1, max(0, -(-9 * n // 10) - 1))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--mode", choices=sorted(REPS), default="quick")
    ap.add_argument("--nodes", type=int, choices=[1, 2], default=1,
                    help="2: Ray's multi-node test cluster (two nodes on this machine)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads per worker (0: cores / workers, at least 1)")
    ap.add_argument("--skip", default="", help="comma list of jobs to leave out")
    args = ap.parse_args()
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    reps = REPS[args.mode]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    sys.path.insert(0, HERE)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import ray
    cluster = None
    hook = {"worker_process_setup_hook": "conflux.ray.setup_hook"}
    if args.nodes == 2:
        from ray.cluster_utils import Cluster
        per = -(-args.workers // 2)
        cluster = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=per, include_dashboard=False, object_store_memory=200 << 20))
        cluster.add_node(num_cpus=per, object_store_memory=200 << 20)
        ray.init(address=cluster.address, runtime_env=hook, log_to_driver=False)
    else:
        ray.init(num_cpus=args.workers, include_dashboard=False, runtime_env=hook,
                 log_to_driver=False, object_store_memory=200 << 20)
    rows, failures = [], 0
    skip = set(filter(None, args.skip.split(",")))
    try:
        if "ray_executor_conflux" not in skip:
            from conflux.ray import RayExecutor
            ex = RayExecutor(RayExecutor.create_settings(timeout_s=120),
                             num_workers=args.workers)
            ex.start()
            try:
                rows.append(("ray_executor_conflux", ex.run(executor_job, args=[reps, threads])))
            finally:
                ex.shutdown()
        for backend in ("gloo", "conflux"):
            name = "ray_train_ddp_" + backend
            if name in skip:
                continue
            from ray.train import RunConfig, ScalingConfig
            from ray.train.torch import TorchConfig, TorchTrainer
            out = tempfile.mkdtemp(prefix="cfx-ray-bench-")
            TorchTrainer(
                train_loop, train_loop_config={"out": out, "reps": reps, "threads": threads},
                scaling_config=ScalingConfig(num_workers=args.workers,
                                             placement_strategy="SPREAD"),
                torch_config=TorchConfig() if backend == "gloo" else TorchConfig(backend=backend),
                run_config=RunConfig(storage_path=tempfile.mkdtemp(prefix="cfx-ray-bench-run-"))
            ).fit()
            results = []
            for r in range(args.workers):
                with open(os.path.join(out, "rank%d.json" % r)) as f:
                    results.append(json.load(f))
            rows.append((name, results))
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    print("# bench/ray_step.py: ResNet-50-shaped step (161 tensors, 102 MB), %d workers on %d Ray "
          "node(s), %d torch threads each, mode %s (%d timed steps)"
          % (args.workers, args.nodes, threads, args.mode, reps[1]))
    print("method,workers,step_median_ms,step_min_ms,step_p90_ms,local_median_ms,"
          "communication_ms,check")
    comm = {}
    for name, results in rows:
        r0 = results[0]
        ok = all(r["first_step"] is None and r["same"] for r in results)
        failures += not ok
        step = summary(r0["samples"]["step"])
        local = summary(r0["samples"]["local"])
        comm[name] = step[0] - local[0]
        why = "ok" if ok else "FAIL (%s)" % "; ".join(
            "rank %d: %s" % (r["rank"], r["first_step"] or "parameters differ across ranks")
            for r in results if r["first_step"] or not r["same"])
        print("%s,%d,%.2f,%.2f,%.2f,%.2f,%.2f,%s" % (name, args.workers, step[0] * 1e3,
                                                     step[1] * 1e3, step[2] * 1e3,
                                                     local[0] * 1e3, comm[name] * 1e3, why))
    if "ray_executor_conflux" in comm and "ray_train_ddp_gloo" in comm:
        ratio = comm["ray_executor_conflux"] / comm["ray_train_ddp_gloo"] \
            if comm["ray_train_ddp_gloo"] > 0 else float("inf")
        print("ratio,communication ray_executor_conflux / ray_train_ddp_gloo,%.3f,bar %.1f,%s"
              % (ratio, BAR, "met" if ratio <= BAR else "NOT met"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

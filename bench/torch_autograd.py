#!/usr/bin/python3
"""The training step as a user runs it: forward, backward through autograd, optimizer step.

Launched by bench/run under mpirun with the same ranks as the other rows. Models:
  resnet50_shaped  the 161 parameters of bench/workloads/resnet50.tsv (102 MB) and a cheap elementwise
                   loss, 0.5 * sum_i ((p_i - c_i)^2).sum() with c_i = rank + 1 + i mod 3, so that backward
                   is short (a few elementwise passes) and produces the gradients last parameter first,
                   as a real network does: communication has little compute to hide behind
  resnet18         torchvision's ResNet-18 (random initial weights, nothing downloaded) on a small batch
                   of random images per rank: real compute (when python3-torchvision is installed; else
                   one row says why)
Methods, each on its own copy of the model (same initial values), timed in the same rounds, the order
rotating from round to round:
  local                    the step with the wrapped optimizer alone (no communication)
  ddp_<backend>            torch.nn.parallel.DistributedDataParallel at its defaults over a process
                           group of that backend (DDP_BACKENDS: "gloo", and "conflux", the backend
                           `import conflux.torch` registers; a row says why when it cannot run)
  ddp_conflux_shm_hook     DDP on "conflux" with conflux.torch.ddp_hooks.shared_memory_hook (its buckets
                           moved into shared tensor memory, reduced there in place); _view: and DDP's
                           gradient_as_bucket_view=True (the gradients are views of the buckets: no copies),
                           beside ddp_gloo_view: DDP on Gloo with that option too
  fsdp_<backend>           FSDP2 (torch.distributed.fsdp.fully_shard) of the whole model on a 1-D CPU
                           mesh over a group of that backend: parameters all-gathered before forward,
                           gradients reduce-scattered (AVG) in backward; the optimizer steps each
                           rank's shard (FSDP_BACKENDS, like DDP_BACKENDS)
  torch_conflux_optimizer  conflux.torch.DistributedOptimizer at its defaults
  torch_hvd_optimizer      conflux.horovod.torch.DistributedOptimizer at its defaults
Each step: zero_grad, forward, backward, step (SGD); timed from a barrier to the step's return on every
rank, the max over ranks per step (glibc keeps the memory a step frees, --allocator: see
keep_freed_memory); rows give the median, min and p90 (max_s column: the p90).
METHOD.after_backward rows: the time from backward's return to the step's return (the communication
backward did not hide; DDP waits for its buckets inside backward, so its row is the SGD update alone).
communication = step - local (bench/run's table). Checks (the bench fails on any): the first step of
resnet50_shaped must leave every parameter at the mean over ranks of c_i (lr 1, initial values 0: the
gradient averaged over the ranks is p - mean c), computed here; after the timed steps every method's
parameters must be bitwise the same on every rank (a digest of their bytes compared across ranks).
"""
import argparse
import ctypes
import hashlib
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from model_shapes import read_tsv  # bench/ is the script's folder, first on sys.path
from torch_gloo import finish, init_gloo

DDP_BACKENDS = ["gloo", "conflux"]  # DDP rows: one per torch.distributed backend named here
FSDP_BACKENDS = ["gloo", "conflux"]  # FSDP2 rows likewise
REPS = {  # model -> mode -> (warm-up steps, timed steps)
    "resnet50_shaped": {"full": (5, 40), "quick": (3, 15), "smoke": (0, 1)},  # smoke: after the checked step
    "resnet18": {"full": (3, 20), "quick": (2, 8), "smoke": (1, 1)},
}
RESNET18_BATCH, RESNET18_IMAGE = 8, 64  # per rank: a small batch, so a step takes ~0.1-0.3 s per core


def keep_freed_memory():
    """glibc keeps what the step frees instead of handing it back to the kernel (mallopt: blocks up
    to 32 MiB from the heap, no trimming). Why: on this VM a page handed back is handed on to the
    host, and touching it again costs a fault at both levels; the step's temporaries (forward and
    backward allocate ~100 MB of them on the ResNet-50 shape) then cost 20 to 325 ms a step at
    random instead of a steady 44 ms, in the local step as much as in any other. Every method
    runs in this one process, so all get the same allocator."""
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3  # malloc.h
    return all(libc.mallopt(k, v) == 1 for k, v in ((m_mmap_threshold, 32 << 20), (m_trim_threshold, 1 << 30),
                                                   (m_top_pad, 64 << 20)))


class ResNet50Shaped(torch.nn.Module):
    """ResNet-50's parameters (registration order from the tsv), zero-initialised, and a loss whose
    gradient for parameter i is p_i - c_i (c_i = rank + 1 + i mod 3)."""

    def __init__(self, shapes, rank):
        super().__init__()
        self.names = [n.replace(".", "_") for n, _ in shapes]
        for n, dims in zip(self.names, shapes):
            self.register_parameter(n, torch.nn.Parameter(torch.zeros(*dims[1], dtype=torch.float32)))
        self.targets = [float(rank + 1 + i % 3) for i in range(len(shapes))]

    def forward(self, _x):
        loss = None
        for n, c in zip(self.names, self.targets):
            term = (getattr(self, n) - c).pow(2).sum()
            loss = term if loss is None else loss + term
        return 0.5 * loss


def expected_after_first_step(shapes, size):
    """Per parameter, its value after one step from zeros with lr 1: the mean over ranks of c_i."""
    return [sum(float(r + 1 + i % 3) for r in range(size)) / size for i in range(len(shapes))]


def full_parameters(model):
    """The model's parameters as whole tensors: an FSDP2 model's are DTensor shards, gathered here
    (a collective over the model's mesh: every rank calls it in the same order)."""
    return [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]


def digest(model):
    h = hashlib.sha1()
    for p in full_parameters(model):
        h.update(p.detach().contiguous().numpy().tobytes())
    return int.from_bytes(h.digest()[:7], "little")  # fits an int64 tensor


def same_on_every_rank(value):
    t = torch.tensor([value, -value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t[0]) == value and int(t[1]) == -value


def summary(samples):
    s = sorted(samples)
    n = len(s)
    med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    return med, s[0], s[min(n - 1, int(np.ceil(0.9 * n)) - 1)], n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--mode", choices=["full", "quick", "smoke"], default="full")
    ap.add_argument("--workloads", required=True, help="bench/workloads (resnet50.tsv)")
    ap.add_argument("--models", default="resnet50_shaped,resnet18")
    ap.add_argument("--conflux", choices=["auto", "off"], default="auto")
    ap.add_argument("--bucket-bytes", default="",
                    help="comma list: also conflux.torch.DistributedOptimizer rows with these bucket sizes "
                         "(its bucket_bytes), in the same rounds: A/B of the plan")
    ap.add_argument("--timeline", default="",
                    help="the engine's timeline of the timed steps of each model into PATH (docs/timeline.md: "
                         "when each bucket went out; %%r is the rank), e.g. /tmp/ag-%%r.json")
    ap.add_argument("--perturb-rank", type=int, default=-1,
                    help="tests only: this rank nudges one parameter of every method before the check, which "
                         "must then fail (the check can fail)")
    ap.add_argument("--allocator", choices=["keep", "glibc"], default="keep",
                    help="keep: glibc keeps freed memory (keep_freed_memory; what the tables use); glibc: its "
                         "defaults, to see what they cost")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads per rank (0: cores / ranks, at least 1)")
    args = ap.parse_args()
    kept = args.allocator == "keep" and keep_freed_memory()
    rank, size = init_gloo()
    # Intra-op threads: the ranks share the cores; more threads than cores per rank oversubscribe
    # (torch's default is every core in every rank).
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // size))
    out = open(args.raw, "w") if rank == 0 else None
    if out:
        out.write("group,workload,tensors,bytes,method,reps,median_s,min_s,max_s,check\n")
        print("torch_autograd.py: %d ranks, torch %s, %d intra-op threads per rank, mode %s, allocator %s"
              % (size, torch.__version__, torch.get_num_threads(), args.mode,
                 "keeps freed memory" if kept else "glibc's defaults"), flush=True)
    failures = 0

    def emit(model, nparams, nbytes, method, res, chk):
        if out:
            med, mn, p90, n = res
            out.write("autograd,%s,%d,%d,%s,%d,%.9g,%.9g,%.9g,%s\n" % (model, nparams, nbytes, method, n, med, mn,
                                                                     p90, chk))
            out.flush()
            print("  autograd  %-16s %-24s median %9.2f ms  min %8.2f  p90 %8.2f  %s"
                  % (model, method, med * 1e3, mn * 1e3, p90 * 1e3, chk), flush=True)

    def na(model, method, why):
        if out:
            out.write("autograd,%s,0,0,%s,0,,,,%s\n" % (model, method, why.replace(",", ";")))
            print("  autograd  %-16s %-24s %s" % (model, method, why), flush=True)

    cfx = hvd = None
    cfx_why = hvd_why = None
    if args.conflux == "auto":
        try:
            import conflux.torch as cfx
            cfx.init()
        except Exception as e:
            cfx, cfx_why = None, "n/a (conflux.torch not importable: %s)" % str(e).splitlines()[0][:100]
        try:
            import conflux.horovod.torch as hvd
            hvd.init()
        except Exception as e:
            hvd, hvd_why = None, "n/a (conflux.horovod.torch not importable: %s)" % str(e).splitlines()[0][:100]
    else:
        cfx_why = hvd_why = "n/a (--conflux off)"
    # "conflux" is registered by `import conflux.torch` above; without it there is no such row.
    backends = [b for b in DDP_BACKENDS if b != "conflux" or cfx is not None]
    groups = {b: (None if b == "gloo" else dist.new_group(backend=b)) for b in backends}
    fsdp_meshes = {}
    try:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard
        for b in FSDP_BACKENDS:
            if b in backends:
                fsdp_meshes[b] = DeviceMesh.from_group(groups[b] or dist.group.WORLD, "cpu")
    except Exception as e:  # torch without FSDP2: one row each says why
        fsdp_why = "n/a (FSDP2 unavailable: %s)" % str(e).splitlines()[0][:100]
    else:
        fsdp_why = None

    shapes = read_tsv(os.path.join(args.workloads, "resnet50.tsv"))
    for model_name in args.models.split(","):
        if model_name == "resnet50_shaped":
            def build():
                return ResNet50Shaped(shapes, rank)
            lr, batch = 1.0, (lambda: None)
            labels = None
        elif model_name == "resnet18":
            try:
                import torchvision
            except Exception as e:
                for m in ["local"] + ["ddp_" + b for b in DDP_BACKENDS] + ["fsdp_" + b for b in FSDP_BACKENDS] + ["torch_conflux_optimizer",
                                                                         "torch_hvd_optimizer"]:
                    na(model_name, m, "n/a (torchvision not importable: %s; Debian: python3-torchvision)" % e)
                continue

            def build():
                torch.manual_seed(1234)  # the same initial weights on every rank and in every copy
                return torchvision.models.resnet18(weights=None, num_classes=100)
            gen = torch.Generator().manual_seed(4321 + rank)  # each rank its own data
            images = torch.randn(RESNET18_BATCH, 3, RESNET18_IMAGE, RESNET18_IMAGE, generator=gen)
            labels = torch.randint(0, 100, (RESNET18_BATCH,), generator=gen)
            lr, batch = 0.01, (lambda: images)
        else:
            sys.exit("torch_autograd.py: unknown model %r" % model_name)

        methods = []  # (name, model, optimizer or None, barrier)

        def loss_of(m):
            y = m(batch())
            return y if labels is None else torch.nn.functional.cross_entropy(y, labels)

        local = build()
        methods.append(("local", local, torch.optim.SGD(local.parameters(), lr=lr), dist.barrier))
        for b in backends:
            m = build()
            ddp = torch.nn.parallel.DistributedDataParallel(m, process_group=groups[b])
            methods.append(("ddp_" + b, ddp, torch.optim.SGD(ddp.parameters(), lr=lr), dist.barrier))
        if "gloo" in backends:  # the base of the _view row below: Gloo with the same DDP option
            m = build()
            ddp = torch.nn.parallel.DistributedDataParallel(m, gradient_as_bucket_view=True)
            methods.append(("ddp_gloo_view", ddp, torch.optim.SGD(ddp.parameters(), lr=lr), dist.barrier))
        hooked = (("ddp_conflux_shm_hook", {}), ("ddp_conflux_shm_hook_view", {"gradient_as_bucket_view": True}))
        for name, options in hooked if "conflux" in backends else ():  # DDP's buckets in shared memory
            m = build()
            ddp = torch.nn.parallel.DistributedDataParallel(m, process_group=groups["conflux"], **options)
            ddp.register_comm_hook(groups["conflux"], cfx.ddp_hooks.shared_memory_hook)
            methods.append((name, ddp, torch.optim.SGD(ddp.parameters(), lr=lr), dist.barrier))
        for b in FSDP_BACKENDS:
            if b not in fsdp_meshes:
                na(model_name, "fsdp_" + b, fsdp_why or "n/a (no %s process group)" % b)
                continue
            m = fully_shard(build(), mesh=fsdp_meshes[b])
            methods.append(("fsdp_" + b, m, torch.optim.SGD(m.parameters(), lr=lr), dist.barrier))
        for name, mod, why in (("torch_conflux_optimizer", cfx, cfx_why), ("torch_hvd_optimizer", hvd, hvd_why)):
            if mod is None:
                na(model_name, name, why)
                continue
            m = build()
            opt = mod.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=lr),
                                           named_parameters=m.named_parameters())
            methods.append((name, m, opt, cfx.barrier if cfx else dist.barrier))
        for b in [int(v) for v in args.bucket_bytes.split(",") if v] if cfx else []:
            m = build()
            opt = cfx.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=lr),
                                           named_parameters=m.named_parameters(), bucket_bytes=b)
            methods.append(("torch_conflux_optimizer_b%dK" % (b >> 10), m, opt, cfx.barrier))
        nparams = sum(1 for _ in local.parameters())
        nbytes = sum(p.numel() * 4 for p in local.parameters())

        def step(m, opt):
            """The step; returns when backward returned (perf_counter): what follows is the optimizer's
            step, i.e. the communication that backward did not hide (DDP waits in backward itself)."""
            opt.zero_grad()
            loss_of(m).backward()
            t = time.perf_counter()
            opt.step()
            return t

        checks = {}
        if model_name == "resnet50_shaped":  # the first step's result, computed here
            want = expected_after_first_step(shapes, size)
            for name, m, opt, _ in methods:
                step(m, opt)
                if name == "local":
                    continue
                bad = None
                for i, p in enumerate(full_parameters(m.module if hasattr(m, "module") else m)):
                    got = p.detach().view(-1)
                    if not torch.allclose(got, torch.full_like(got, want[i]), rtol=1e-6, atol=0):
                        j = int(torch.argmax((got - want[i]).abs()))
                        bad = "parameter %d (%s) element %d = %r, want %r" % (i, shapes[i][0], j, float(got[j]),
                                                                             want[i])
                        break
                if bad:
                    print("[rank %d] CHECK FAILED %s %s: %s" % (rank, model_name, name, bad), file=sys.stderr,
                          flush=True)
                checks[name] = bad is None
        warm, reps = REPS[model_name][args.mode]
        samples = {name: [] for name, *_ in methods}
        tails = {name: [] for name, *_ in methods}
        if args.timeline and cfx is not None:
            cfx.start_timeline(args.timeline.replace(".json", "." + model_name + ".json"))
        for r in range(warm + reps):
            for k in range(len(methods)):
                name, m, opt, barrier = methods[(k + r) % len(methods)]
                barrier()
                t0 = time.perf_counter()
                t_bw = step(m, opt)
                t1 = time.perf_counter()
                dt = torch.tensor([t1 - t0, t1 - t_bw], dtype=torch.float64)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                if r >= warm:
                    samples[name].append(float(dt[0]))
                    tails[name].append(float(dt[1]))
        if args.timeline and cfx is not None:
            cfx.stop_timeline()
        for name, m, opt, _ in methods:
            ok = checks.get(name, True)
            if rank == args.perturb_rank:
                with torch.no_grad():
                    first = next(iter(m.parameters()))
                    getattr(first, "_local_tensor", first).view(-1)[0] += 1.0
            if name != "local":
                ok = all_ok = same_on_every_rank(digest(m.module if hasattr(m, "module") else m)) and ok
                flag = torch.tensor([1 if all_ok else 0], dtype=torch.int32)
                dist.all_reduce(flag, op=dist.ReduceOp.MIN)
                ok = bool(flag[0])
                if not ok and rank == 0:
                    print("  CHECK FAILED %s %s: parameters differ across ranks or the first step's values "
                          "were wrong" % (model_name, name), file=sys.stderr, flush=True)
            failures += not ok
            emit(model_name, nparams, nbytes, name, summary(samples[name]),
                 ("ok" if ok else "FAIL") if name != "local" else "-")
            emit(model_name, nparams, nbytes, name + ".after_backward", summary(tails[name]), "-")
        if out:
            meds = {name: summary(s)[0] for name, s in samples.items()}
            print("  autograd  %-16s communication (step - local): %s" % (model_name, ", ".join(
                "%s %.2f ms" % (n, (v - meds["local"]) * 1e3) for n, v in meds.items() if n != "local")), flush=True)
        del methods, local

    if cfx is not None and hasattr(cfx, "shutdown"):
        cfx.shutdown()
    return finish(out, failures)


if __name__ == "__main__":
    sys.exit(main())

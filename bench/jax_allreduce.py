#!/usr/bin/env python3
"""Allreduce of ResNet-50's gradient shapes (bench/workloads/resnet50.tsv: 161 float32 arrays, 102 MB)
as a JAX pytree inside jax.jit, and of a lone 4-byte array inside jit: conflux.jax beside mpi4jax
(the same Open MPI) and beside jax.distributed's own Gloo CPU collectives (a psum under shard_map
over one CPU device per process), all in the same processes. Prints medians and ratios (conflux's
time / the other's: below 1 is faster). A benchmark, never a test.

    mpirun -np 2 --oversubscribe --bind-to none .venv/bin/python bench/jax_allreduce.py
    (options: --reps 25, --raw out.csv; docs/jax.md gives the environment it ran with)

Two ways the tree reaches the jitted allreduce, each timed for every method:
  grads  the tree is donated (jax.jit(..., donate_argnums=0)), as gradients computed inside a
         training step are dead once reduced: XLA may reuse their buffers for the results. Each
         timed call gets a fresh copy of the tree made before the timer starts (its pages
         already touched, as a backward pass leaves them). This is the row that stands for
         training.
  arg    the same tree passed as a jit argument that lives on (not donated): every method must
         leave it intact and put its results in new buffers.
Methods (each jitted once, warmed up, its result checked, then timed per call to
block_until_ready, ranks lined up by an MPI barrier before each call, the methods taking turns call
by call so that a machine whose load changes weighs on all of them alike, each round starting with
the next method; the median over calls of the slowest rank's time):
  conflux_grouped   conflux.jax.grouped_allreduce(tree, op=Sum): one FFI call, one fused submission
  conflux_leaves    conflux.jax.allreduce per leaf (161 FFI calls in program order)
  mpi4jax           mpi4jax.allreduce(leaf, op=MPI.SUM) per leaf (MPI_Allreduce each)
  jax_gloo          jax.lax.psum of the tree under shard_map over the processes' CPU devices,
                    jax.distributed.initialize with jax_cpu_collectives_implementation="gloo"
The lone 4-byte float32 allreduce is timed as an argument (nothing to reuse at that size).
--raw writes bench/run's row format (group jax; workloads resnet50_grads, resnet50_arg, lat_4B).
The machine's load average is printed before and after: the ranks share 2 cores with whatever
else runs, which weighs most on methods that poll (MPI's shared-memory transport spins).
"""
import argparse
import os
import statistics
import sys
import time
import warnings

from model_shapes import read_tsv  # bench/ is the script's folder, first on sys.path


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default=os.path.join(here, "workloads"))
    ap.add_argument("--reps", type=int, default=25,
                    help="timed calls of the ResNet-50 tree, each way")
    ap.add_argument("--small-reps", type=int, default=300, help="timed calls of the 4-byte array")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ways", default="grads,arg", help="grads, arg or both (comma-separated)")
    ap.add_argument("--no-gloo", action="store_true", help="leave jax.distributed out")
    ap.add_argument("--raw", help="rank 0 writes bench/run's CSV rows here")
    ap.add_argument("--port", type=int, default=int(os.environ.get("CFX_BENCH_JAX_PORT", "29517")))
    args = ap.parse_args()
    ways = [w for w in args.ways.split(",") if w]

    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("CFX_RANK", "0")))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("CFX_SIZE", "1")))

    import jax
    gloo_error = None
    if not args.no_gloo and size > 1:
        # Before anything touches a JAX backend.
        try:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
            jax.distributed.initialize(coordinator_address="127.0.0.1:%d" % args.port,
                                       num_processes=size, process_id=rank)
        except Exception as e:  # noqa: BLE001  (reported, the other rows still run)
            gloo_error = "%s: %s" % (type(e).__name__, e)
    elif args.no_gloo:
        gloo_error = "left out (--no-gloo)"
    # mpi4jax and psum cannot reuse donated buffers; XLA says so once per program.
    warnings.filterwarnings("ignore", message=".*donated buffers were not usable.*")

    import numpy as np
    import jax.numpy as jnp
    from mpi4py import MPI
    import conflux.jax as cfx

    comm = MPI.COMM_WORLD
    cfx.init()
    assert cfx.size() == size and cfx.rank() == rank
    load_before = os.getloadavg()

    shapes = read_tsv(os.path.join(args.workloads, "resnet50.tsv"))
    local = jax.local_devices()[0]
    tree = {name: jax.device_put(jnp.full(shape, float(rank + 1), jnp.float32), local)
            for name, shape in shapes}
    nbytes = sum(int(np.prod(s)) * 4 for _, s in shapes)
    small = jax.device_put(jnp.full((1,), float(rank + 1), jnp.float32), local)
    want = float(size * (size + 1) / 2)
    fresh_copy = jax.jit(lambda t: jax.tree_util.tree_map(jnp.copy, t))

    def check(out):
        leaves = jax.tree_util.tree_leaves(out)
        return all(bool(np.all(np.asarray(leaf) == want)) for leaf in leaves[:3] + leaves[-3:])

    def timed_round_robin(fns, reps, warm):
        """{method: (median, min, p90 seconds, result checked)}. fns: {method: (fn, make_input)}:
        make_input() runs before the barrier, outside the time."""
        ok, times = {}, {m: [] for m in fns}
        for m, (fn, make) in fns.items():
            out = jax.block_until_ready(fn(make()))   # compiles
            ok[m] = check(out)
            del out
            for _ in range(warm):
                jax.block_until_ready(fn(make()))
        order = list(fns)
        for i in range(reps):
            # Each round starts with the next method: none always runs right after another.
            for m in order[i % len(order):] + order[:i % len(order)]:
                fn, make = fns[m]
                x = make()
                comm.Barrier()
                t0 = time.perf_counter()
                jax.block_until_ready(fn(x))
                times[m].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
                del x
        out = {}
        for m, ts in times.items():
            ts = sorted(ts)
            out[m] = (statistics.median(ts), ts[0], ts[min(len(ts) - 1, int(0.9 * len(ts)))], ok[m])
        return out

    def tree_methods(donate):
        jit = (lambda f: jax.jit(f, donate_argnums=0)) if donate else jax.jit
        return {
            "conflux_grouped": jit(lambda t: cfx.grouped_allreduce(t, op=cfx.Sum)),
            "conflux_leaves": jit(lambda t: jax.tree_util.tree_map(
                lambda x: cfx.allreduce(x, op=cfx.Sum), t)),
        }

    errors = {}
    try:
        import mpi4jax
    except ImportError as e:
        mpi4jax = None
        errors["mpi4jax"] = "does not import: %s" % e

    gloo = None
    if gloo_error is None:
        try:
            from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
            try:
                from jax import shard_map
            except ImportError:
                from jax.experimental.shard_map import shard_map
            mesh = Mesh(np.array(jax.devices()), ("p",))
            spec = NamedSharding(mesh, P("p"))

            def global_array(x):  # this process's x as row `rank` of a (size, ...) global array
                return jax.make_array_from_single_device_arrays(
                    (size,) + x.shape, spec, [jax.device_put(x[None], local)])

            psum = shard_map(lambda t: jax.tree_util.tree_map(lambda v: jax.lax.psum(v, "p"), t),
                             mesh=mesh, in_specs=P("p"), out_specs=P("p"))
            gloo = (psum, global_array)
        except Exception as e:  # noqa: BLE001
            gloo_error = "%s: %s" % (type(e).__name__, e)
    if gloo_error is not None:
        errors["jax_gloo"] = gloo_error

    def local_shards(f):
        # The gloo rows hand back global arrays: this process's shards (waited for, checked).
        return lambda t: [s.data for leaf in jax.tree_util.tree_leaves(f(t))
                          for s in leaf.addressable_shards]

    tables = {}
    for way in ways:
        donate = way == "grads"
        # The copy is waited for: before the barrier, never inside the timed call.
        make = (lambda: jax.block_until_ready(fresh_copy(tree))) if donate else (lambda: tree)
        fns = {m: (f, make) for m, f in tree_methods(donate).items()}
        if mpi4jax is not None:
            f = lambda t: jax.tree_util.tree_map(lambda x: mpi4jax.allreduce(x, op=MPI.SUM), t)
            fns["mpi4jax"] = (jax.jit(f, donate_argnums=0) if donate else jax.jit(f), make)
        if gloo is not None:
            psum, global_array = gloo
            g = jax.jit(psum, donate_argnums=0) if donate else jax.jit(psum)
            if donate:
                gmake = lambda: jax.block_until_ready(
                    jax.tree_util.tree_map(global_array, make()))
            else:
                gtree = jax.tree_util.tree_map(global_array, tree)
                gmake = lambda: gtree
            fns["jax_gloo"] = (local_shards(g), gmake)
        try:
            tables["resnet50_" + way] = timed_round_robin(fns, args.reps, args.warmup)
        except Exception as e:  # noqa: BLE001
            errors[way] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0])

    fns = {"conflux": (jax.jit(lambda x: cfx.allreduce(x, op=cfx.Sum)), lambda: small)}
    if mpi4jax is not None:
        fns["mpi4jax"] = (jax.jit(lambda x: mpi4jax.allreduce(x, op=MPI.SUM)), lambda: small)
    if gloo is not None:
        gsmall = gloo[1](small)
        fns["jax_gloo"] = (local_shards(jax.jit(gloo[0])), lambda: gsmall)
    try:
        tables["lat_4B"] = timed_round_robin(fns, args.small_reps, 20)
    except Exception as e:  # noqa: BLE001
        errors["lat_4B"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0])
    load_after = os.getloadavg()

    if rank == 0:
        print("conflux.jax allreduce inside jit, %d ranks, jax %s, conflux %s, %s; load average "
              "%.1f before, %.1f after (1-minute; %d cores)"
              % (size, jax.__version__, cfx._core.version(), jax.devices()[0].platform,
                 load_before[0], load_after[0], os.cpu_count()))
        print("ResNet-50 gradient pytree: %d arrays, %.1f MB float32, op Sum, %d reps each way"
              % (len(shapes), nbytes / 1e6, args.reps))
        for key, table in tables.items():
            small_row = key == "lat_4B"
            if small_row:
                print("lone 4-byte float32 allreduce inside jit, %d reps" % args.small_reps)
            else:
                print(" %s (%s)" % (key, "donated, as gradients inside a step" if
                                    key.endswith("grads") else "a jit argument that lives on"))
            base_m = "conflux" if small_row else "conflux_grouped"
            base = table.get(base_m, (None,))[0]
            for m, (t, tmin, p90, ok) in table.items():
                ratio = "" if m == base_m or not base else "  %s/%s = %.2fx" % (base_m, m, base / t)
                if small_row:
                    print("  %-16s median %8.1f us  min %8.1f  p90 %8.1f  check %s%s"
                          % (m, t * 1e6, tmin * 1e6, p90 * 1e6, "ok" if ok else "WRONG", ratio))
                else:
                    print("  %-16s median %8.2f ms  min %8.2f  p90 %8.2f  %5.2f GB/s  check %s%s"
                          % (m, t * 1e3, tmin * 1e3, p90 * 1e3, nbytes / t / 1e9,
                             "ok" if ok else "WRONG", ratio))
        for m, e in errors.items():
            print("  %-16s not run: %s" % (m, e))
        sys.stdout.flush()
        if args.raw:
            with open(args.raw, "w") as f:
                f.write("group,workload,tensors,bytes,method,reps,median_s,min_s,max_s,check\n")
                for key, table in tables.items():
                    n, b = (1, 4) if key == "lat_4B" else (len(shapes), nbytes)
                    reps = args.small_reps if key == "lat_4B" else args.reps
                    for m, (t, tmin, p90, ok) in table.items():
                        f.write("jax,%s,%d,%d,jax_%s,%d,%.9g,%.9g,%.9g,%s\n"
                                % (key, n, b, m, reps, t, tmin, p90, "ok" if ok else "FAIL"))
                for m, e in errors.items():
                    f.write("jax,%s,0,0,%s,0,,,,%s\n"
                            % (m, m if m.startswith("jax_") else "jax_" + m,
                               ("n/a (%s)" % e).replace(",", ";")))
    comm.Barrier()
    cfx.shutdown()


if __name__ == "__main__":
    main()

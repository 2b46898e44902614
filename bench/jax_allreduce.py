#!/usr/bin/env python3
"""Allreduce of ResNet-50's gradient shapes (bench/workloads/resnet50.tsv: 161 float32 arrays, 102 MB)
as a JAX pytree inside jax.jit, and of a lone 4-byte array inside jit: conflux.jax beside mpi4jax
(the same Open MPI) and beside jax.distributed's own Gloo CPU collectives (a psum under shard_map
over one CPU device per process), all in the same processes. Prints medians and ratios (conflux's
time / the other's: below 1 is faster). A benchmark, never a test.

    mpirun -np 2 --oversubscribe --bind-to none .venv/bin/python bench/jax_allreduce.py

Methods (each jitted once, warmed up, then timed per call to block_until_ready, ranks lined up by
an MPI barrier before each call, the methods taking turns call by call; the median over calls of
the slowest rank's time):
  conflux_grouped   conflux.jax.grouped_allreduce(tree, op=Sum): one FFI call, one fused submission
  conflux_leaves    conflux.jax.allreduce per leaf (161 FFI calls in program order)
  mpi4jax           mpi4jax.allreduce(leaf, op=MPI.SUM) per leaf (MPI_Allreduce each)
  jax_gloo          jax.lax.psum of the tree under shard_map over the processes' CPU devices,
                    jax.distributed.initialize with jax_cpu_collectives_implementation="gloo"
"""
import argparse
import os
import statistics
import sys
import time

from model_shapes import read_tsv  # bench/ is the script's folder, first on sys.path


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default=os.path.join(here, "workloads"))
    ap.add_argument("--reps", type=int, default=10, help="timed calls of the ResNet-50 tree")
    ap.add_argument("--small-reps", type=int, default=300, help="timed calls of the 4-byte array")
    ap.add_argument("--no-gloo", action="store_true", help="leave jax.distributed out")
    ap.add_argument("--port", type=int, default=int(os.environ.get("CFX_BENCH_JAX_PORT", "29517")))
    args = ap.parse_args()

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

    import numpy as np
    import jax.numpy as jnp
    from mpi4py import MPI
    import conflux.jax as cfx

    comm = MPI.COMM_WORLD
    cfx.init()
    assert cfx.size() == size and cfx.rank() == rank

    shapes = read_tsv(os.path.join(args.workloads, "resnet50.tsv"))
    local = jax.local_devices()[0]
    tree = {name: jax.device_put(jnp.full(shape, float(rank + 1), jnp.float32), local)
            for name, shape in shapes}
    nbytes = sum(int(np.prod(s)) * 4 for _, s in shapes)
    small = jax.device_put(jnp.full((1,), float(rank + 1), jnp.float32), local)
    want = float(size * (size + 1) / 2)

    def check(out):
        leaf = jax.tree_util.tree_leaves(out)[0]
        return bool(np.allclose(np.asarray(leaf).ravel()[:4], want))

    def timed_round_robin(fns, reps, warm=3):
        """{method: (median seconds, result checked)}: the methods take turns call by call, so
        a machine whose load changes (shared cores) weighs on all of them alike."""
        ok, times = {}, {m: [] for m in fns}
        for m, (fn, x) in fns.items():
            for _ in range(warm):
                out = jax.block_until_ready(fn(x))
            ok[m] = check(out)
        for _ in range(reps):
            for m, (fn, x) in fns.items():
                comm.Barrier()
                t0 = time.perf_counter()
                jax.block_until_ready(fn(x))
                times[m].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        return {m: (statistics.median(times[m]), ok[m]) for m in fns}

    methods = {
        "conflux_grouped": jax.jit(lambda t: cfx.grouped_allreduce(t, op=cfx.Sum)),
        "conflux_leaves": jax.jit(lambda t: jax.tree_util.tree_map(
            lambda x: cfx.allreduce(x, op=cfx.Sum), t)),
    }
    small_methods = {"conflux": jax.jit(lambda x: cfx.allreduce(x, op=cfx.Sum))}
    errors = {}
    try:
        import mpi4jax
        methods["mpi4jax"] = jax.jit(lambda t: jax.tree_util.tree_map(
            lambda x: mpi4jax.allreduce(x, op=MPI.SUM), t))
        small_methods["mpi4jax"] = jax.jit(lambda x: mpi4jax.allreduce(x, op=MPI.SUM))
    except ImportError as e:
        errors["mpi4jax"] = "does not import: %s" % e

    gloo_inputs = None
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
            methods["jax_gloo"] = jax.jit(psum)
            small_methods["jax_gloo"] = jax.jit(psum)
            gloo_inputs = (jax.tree_util.tree_map(global_array, tree), global_array(small))
        except Exception as e:  # noqa: BLE001
            gloo_error = "%s: %s" % (type(e).__name__, e)
    if gloo_error is not None:
        errors["jax_gloo"] = gloo_error

    def shards(f, tree_out):
        # The gloo rows hand back global arrays: wait for (and check) this process's shard.
        if tree_out:
            return lambda t: [s.data for s in jax.tree_util.tree_leaves(f(t))[0].addressable_shards]
        return lambda t: [s.data for s in f(t).addressable_shards]

    results, small_results = {}, {}
    for table, fns, inputs, reps, small_input, label in (
            (results, methods, tree, args.reps, 0, ""),
            (small_results, small_methods, small, args.small_reps, 1, "small ")):
        runnable = {}
        for m, fn in fns.items():
            if m == "jax_gloo":
                runnable[m] = (shards(fn, not small_input), gloo_inputs[small_input])
            else:
                runnable[m] = (fn, inputs)
        try:
            table.update(timed_round_robin(runnable, reps))
        except Exception as e:  # noqa: BLE001
            errors[label + "all"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0])

    if rank == 0:
        print("conflux.jax allreduce inside jit, %d ranks, jax %s, conflux %s, %s"
              % (size, jax.__version__, cfx._core.version(), jax.devices()[0].platform))
        print("ResNet-50 gradient pytree: %d arrays, %.1f MB float32, op Sum, %d reps"
              % (len(shapes), nbytes / 1e6, args.reps))
        base = results.get("conflux_grouped", (None,))[0]
        for m, (t, ok) in results.items():
            ratio = "" if m == "conflux_grouped" or not base else \
                "  conflux_grouped/%s = %.2fx" % (m, base / t)
            print("  %-16s %9.2f ms  %5.2f GB/s algbw  check %s%s"
                  % (m, t * 1e3, nbytes / t / 1e9, "ok" if ok else "WRONG", ratio))
        print("lone 4-byte float32 allreduce inside jit, %d reps" % args.small_reps)
        base = small_results.get("conflux", (None,))[0]
        for m, (t, ok) in small_results.items():
            ratio = "" if m == "conflux" or not base else "  conflux/%s = %.2fx" % (m, base / t)
            print("  %-16s %9.1f us  check %s%s" % (m, t * 1e6, "ok" if ok else "WRONG", ratio))
        for m, e in errors.items():
            print("  %-16s not run: %s" % (m, e))
        sys.stdout.flush()
    comm.Barrier()
    cfx.shutdown()


if __name__ == "__main__":
    main()

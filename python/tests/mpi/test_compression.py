"""Wire compression from Python (conflux.Compression; docs/python.md "Compression"): allreduce in
every form, gradient sets with and without error feedback, conflux.torch and
conflux.horovod.torch's Compression.fp16, and the errors. Each result is checked against what
every rank contributed, recomputed here: within the 16-bit roundings of the exact sum, values of
the 16-bit form, bitwise identical on every rank (allgathered), bitwise what numpy computes for
two ranks (one combine), and different from the exact sum (so the values did travel compressed).

Compression applies where bytes cross a wire: on one host the shared-memory reduction stays
exact (the first test shows it), so the others run on a context made again under one of two
environments: every rank a pretend host of its own (CFX_TEST_LOCAL_SIZE=1: fp16 and bf16
compress the cross-host leg, the MPI path), and one host without shared memory with
CFX_COMPRESSION_EVERYWHERE=1 (fp16 and bf16 mean their _everywhere forms on the MPI path).
"""
import os

import numpy as np
import pytest

import conflux

C = conflux.Compression
ALL = [C.fp16, C.bf16, C.fp16_everywhere, C.bf16_everywhere]
ENVIRONMENTS = {
    "hosts": {"CFX_TEST_LOCAL_SIZE": "1"},
    "everywhere": {"CFX_SHM": "0", "CFX_COMPRESSION_EVERYWHERE": "1"},
}


@pytest.fixture(scope="module", params=sorted(ENVIRONMENTS))
def compressing(request):
    """Conflux initialized again under one of ENVIRONMENTS, then as before."""
    env = ENVIRONMENTS[request.param]
    saved = {k: os.environ.get(k) for k in env}
    conflux.shutdown()
    os.environ.update(env)
    try:
        conflux.init()
        yield request.param
    finally:
        conflux.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        conflux.init()


def is_bf16(c):
    return C(c) in (C.bf16, C.bf16_everywhere)


def round16(x, c):
    """x (float32) rounded to nearest even in c's 16-bit format, as float32."""
    x = np.asarray(x, np.float32)
    if not is_bf16(c):
        return x.astype(np.float16).astype(np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32)


def contribution(rank, n, dtype, seed):
    """Rank `rank`'s values: magnitudes 0.1 to 8, both signs, none of them 16-bit values."""
    rng = np.random.default_rng([seed, rank, 777])
    v = rng.uniform(0.1, 8.0, n) * rng.choice([-1.0, 1.0], n)
    return v.astype(dtype)


def bound(xs, c):
    """How far a compressed sum of `xs` may be from the exact one: each of the n contributions is
    rounded once when packed and each of the n - 1 combines once, every rounding by at most
    half a unit in the last place of a value no larger than sum |x_r| (plus fp16's subnormal
    spacing)."""
    u = 2.0 ** -8 if is_bf16(c) else 2.0 ** -11
    total = np.sum(np.abs(np.stack(xs).astype(np.float64)), axis=0)
    return (2 * len(xs) - 1) * (u * total * 1.001 + 2.0 ** -24)


def gathered_identical(result, name):
    """Every rank's result allgathered: each must be bitwise the same."""
    rows = conflux.allgather(np.ascontiguousarray(result).view(np.uint8).reshape(1, -1),
                             name="compression.identical." + name)
    assert all(np.array_equal(rows[0], row) for row in rows[1:]), name + " differs across ranks"


def check_compressed(got, xs, c, op=conflux.Sum, name=""):
    """`got`: the compressed allreduce of `xs` (one per rank) with op Sum or Average."""
    n = len(xs)
    exact = np.sum(np.stack(xs).astype(np.float64), axis=0)
    scale = 1.0 / n if op == conflux.Average else 1.0
    err = np.abs(got.astype(np.float64) - exact * scale)
    assert np.all(err <= bound(xs, c) * scale), "%s: max error %g" % (name, err.max())
    assert np.mean(err > 0) > 0.5, name + ": the result is the exact sum: nothing was compressed"
    if op == conflux.Sum:
        as32 = got.astype(np.float32)
        assert np.array_equal(round16(as32, c), as32), name + ": not values of the 16-bit form"
        assert np.array_equal(as32.astype(got.dtype), got), name
        if n == 2 and got.dtype == np.float32:  # one combine: widen, add in float32, round
            want = round16(round16(xs[0], c) + round16(xs[1], c), c)
            np.testing.assert_array_equal(got, want, err_msg=name)
    gathered_identical(got, name)


def test_fp16_leaves_the_one_host_reduction_exact(rank, size):
    """The default context, one host: shared memory reduces within the host and nothing crosses
    one, so fp16 changes nothing (the _everywhere forms do not compress shared memory either)."""
    xs = [contribution(r, 300, np.float32, 1) for r in range(size)]
    plain = conflux.allreduce(xs[rank], op=conflux.Sum, name="compression.one_host.none")
    for c in ALL:
        got = conflux.allreduce(xs[rank], op=conflux.Sum, name="compression.one_host.%s" % c.name,
                                compression=c)
        np.testing.assert_array_equal(got, plain)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("c", ALL, ids=lambda c: c.name)
def test_allreduce_forms(compressing, rank, size, c, dtype):
    n = 1000
    name = "compression.%s.%s.%s" % (compressing, c.name, np.dtype(dtype).name)
    xs = [contribution(r, n, dtype, 2) for r in range(size)]
    got = conflux.allreduce(xs[rank], op=conflux.Sum, name=name + ".new", compression=c)
    assert got.dtype == dtype
    check_compressed(got, xs, c, name=name + ".new")
    a = xs[rank].copy()
    assert conflux.allreduce_(a, op=conflux.Sum, name=name + ".inplace", compression=int(c)) is a
    np.testing.assert_array_equal(a, got)  # the engine's int too; the same rounding every call
    h = conflux.allreduce_async(xs[rank], op=conflux.Average, name=name + ".async",
                                compression=c)
    check_compressed(conflux.synchronize(h), xs, c, op=conflux.Average, name=name + ".async")
    a = xs[rank].copy()
    conflux.synchronize(conflux.allreduce_async_(a, op=conflux.Sum, name=name + ".async_",
                                                 compression=c))
    np.testing.assert_array_equal(a, got)


def test_scale_factors_and_the_uncompressed_neighbour(compressing, rank, size):
    """Prescale and postscale around the rounding; a tensor without compression in the same
    cycle stays exact (tensors of different compressions never fuse)."""
    xs = [contribution(r, 400, np.float32, 3) for r in range(size)]
    ys = [contribution(r, 400, np.float32, 4) for r in range(size)]
    h1 = conflux.allreduce_async(xs[rank], op=conflux.Sum, name="compression.scaled",
                                 prescale_factor=0.5, postscale_factor=4.0, compression=C.fp16)
    h2 = conflux.allreduce_async(ys[rank], op=conflux.Sum, name="compression.exact")
    got = conflux.synchronize(h1)
    check_compressed(got / 4, [x * 0.5 for x in xs], C.fp16, name="compression.scaled")
    exact = conflux.synchronize(h2)
    want = np.sum(np.stack(ys).astype(np.float64), axis=0)
    np.testing.assert_allclose(exact, want, rtol=1e-6, atol=1e-6)
    assert not np.array_equal(round16(exact, C.fp16), exact)


def test_torch_collectives(compressing, rank, size):
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    import conflux.torch as cfx
    xs = [contribution(r, 500, np.float32, 5) for r in range(size)]
    t = torch.from_numpy(xs[rank].copy())
    # Horovod's Compression.fp16 of conflux.torch names the engine's fp16
    got = cfx.allreduce(t, op=cfx.Sum, name="compression.torch.fp16",
                        compression=cfx.Compression.fp16)
    assert got.dtype == torch.float32
    check_compressed(got.numpy(), xs, C.fp16, name="compression.torch.fp16")
    got = cfx.allreduce(t, op=cfx.Sum, name="compression.torch.bf16", compression=C.bf16)
    check_compressed(got.numpy(), xs, C.bf16, name="compression.torch.bf16")
    # differentiable: the gradient is allreduced with the same compression
    w = torch.from_numpy(xs[rank].copy()).requires_grad_()
    out = cfx.allreduce(w, op=cfx.Sum, name="compression.torch.grad", compression=C.fp16)
    check_compressed(out.detach().numpy(), xs, C.fp16, name="compression.torch.fwd")
    out.backward(torch.from_numpy(xs[rank].copy()))
    check_compressed(w.grad.numpy(), xs, C.fp16, name="compression.torch.bwd")
    # a process set of every rank: its context compresses the same way
    ps = cfx.ProcessSet(list(range(size)))
    got = ps.allreduce(t, op=cfx.Sum, name="compression.torch.set", compression=C.fp16)
    check_compressed(got.numpy(), xs, C.fp16, name="compression.torch.set")
    with pytest.raises(TypeError, match="compression must be a conflux.Compression"):
        cfx.allreduce(t, compression=cfx.Compressor)  # a compressor of one's own is no wire format


def test_horovod_compression_fp16(compressing, rank, size):
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    import conflux.horovod.torch as hvd
    xs = [contribution(r, 500, np.float64, 6) for r in range(size)]
    t = torch.from_numpy(xs[rank].copy())
    got = hvd.allreduce(t, op=hvd.Sum, name="compression.hvd", compression=hvd.Compression.fp16)
    assert got.dtype == torch.float64  # not cast: the engine rounds on the wire
    check_compressed(got.numpy(), xs, C.fp16, name="compression.hvd")
    # integers pass as they are (Horovod's FP16Compressor leaves them), exact
    ints = torch.arange(10, dtype=torch.int32) * (rank + 1)
    got = hvd.allreduce(ints, op=hvd.Sum, name="compression.hvd.ints",
                        compression=hvd.Compression.fp16)
    assert torch.equal(got, torch.arange(10, dtype=torch.int32) * (size * (size + 1) // 2))
    # float16 tensors: Horovod's cast (none needed), reduced as float16
    half = torch.from_numpy(xs[rank].astype(np.float16))
    got = hvd.allreduce(half, op=hvd.Sum, name="compression.hvd.half",
                        compression=hvd.Compression.fp16)
    assert got.dtype == torch.float16
    want = np.sum(np.stack([x.astype(np.float16).astype(np.float64) for x in xs]), axis=0)
    np.testing.assert_allclose(got.double().numpy(), want, rtol=4e-3, atol=4e-3)


def grads_of(rank, step, shapes):
    """The gradients rank `rank` produces at `step`, one per shape (float32)."""
    return [contribution(rank, int(np.prod(s)), np.float32, 100 * step + k).reshape(s)
            for k, s in enumerate(shapes)]


def test_gradient_set(compressing, rank, size):
    shapes = [(20, 30), (7,), (64,)]
    for c in (C.fp16, C.bf16_everywhere):
        with conflux.GradientSet("compression.set.%s.%s" % (compressing, c.name), op=conflux.Sum,
                                 compression=c) as gs:
            idx = [gs.add("g%d" % k, s) for k, s in enumerate(shapes)]
            gs.commit()
            for step in range(2):
                mine = grads_of(rank, step, shapes)
                for i in reversed(idx):
                    gs.array(i)[...] = mine[i]
                    gs.ready(i)
                gs.wait()
                for i, s in zip(idx, shapes):
                    xs = [grads_of(r, step, shapes)[i].ravel() for r in range(size)]
                    check_compressed(gs.array(i).ravel(), xs, c,
                                     name="set.%s.%d.%d" % (c.name, step, i))


def test_torch_optimizers_compress(compressing, rank, size):
    """conflux.torch.DistributedOptimizer (its gradient set, with and without error feedback, and
    per call) and hvd.DistributedOptimizer (per call) with Compression.fp16 or a
    conflux.Compression: the float32 gradients are the compressed averages."""
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    import conflux.torch as cfx
    import conflux.horovod.torch as hvd
    shapes = [(6, 5), (9,)]
    makers = {  # name: (compression the results show, keywords, DistributedOptimizer)
        "cfx": (C.fp16, {"compression": cfx.Compression.fp16}, cfx.DistributedOptimizer),
        "cfx.ef": (C.bf16, {"compression": C.bf16, "error_feedback": True},
                   cfx.DistributedOptimizer),
        "cfx.framework": (C.fp16, {"compression": C.fp16, "gradient_storage": "framework"},
                          cfx.DistributedOptimizer),
        "hvd": (C.fp16, {"compression": hvd.Compression.fp16}, hvd.DistributedOptimizer),
    }
    for which, (c, kw, make) in makers.items():
        params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
        named = [("%s.p%d" % (which, k), p) for k, p in enumerate(params)]
        opt = make(torch.optim.SGD(params, lr=0.0), named_parameters=named, **kw)
        if which.startswith("cfx"):
            want_sets = [] if which == "cfx.framework" else [c]
            assert [s.compression for s in opt._sets] == want_sets
        mine = grads_of(rank, 7, shapes)
        sum((p * torch.from_numpy(g)).sum() for p, g in zip(params, mine)).backward()
        opt.synchronize()
        for k, p in enumerate(params):
            xs = [grads_of(r, 7, shapes)[k].ravel() for r in range(size)]
            check_compressed(p.grad.numpy().ravel(), xs, c, op=conflux.Average,
                             name="%s.p%d" % (which, k))


def spacing16(v, c):
    """The distance between c's 16-bit values around |v| (normal range)."""
    return 2.0 ** (np.floor(np.log2(abs(v))) - (7 if is_bf16(c) else 10))


def offsets(size, c):
    """Each rank's gradient offset in quadratic(): large, cancelling over the ranks."""
    big = 200.0 if is_bf16(c) else 1000.0
    return np.array([big] * (size - 1) + [-big * (size - 1)])


def quadratic(rank, size, c, feedback, steps=400, n=256):
    """SGD on sum_i (x_i - t_i)^2 / 2 through a gradient set with compression c: each rank's
    gradient is x - t plus an offset so large that its rounding swamps x - t, the offsets
    cancelling over the ranks, so the exact average is x - t. Returns the final mean |x - t| and
    the largest mean |sum over the steps of (reduced - exact average)| seen."""
    every = offsets(size, c)
    offset = every[rank]
    t = np.random.default_rng(99).uniform(-1, 1, n)
    x = np.zeros(n)
    drift = np.zeros(n)
    worst = 0.0
    name = "compression.quadratic.%s.%d" % (c.name, feedback)
    with conflux.GradientSet(name, compression=c, error_feedback=feedback) as gs:
        i = gs.add("x", n)
        gs.commit()
        g = gs.array(i)
        for k in range(steps):
            g[...] = (x - t + offset).astype(np.float32)
            gs.ready(i)
            gs.wait()
            exact = np.mean([(x - t + o).astype(np.float32).astype(np.float64) for o in every],
                            axis=0)
            drift += g - exact
            worst = max(worst, float(np.mean(np.abs(drift))))
            x -= 0.5 / (1.0 + k / 20.0) * g  # the average: the same step on every rank
    gathered_identical(x, name)
    return float(np.mean(np.abs(x - t))), worst


@pytest.mark.parametrize("c", [C.fp16, C.bf16], ids=lambda c: c.name)
def test_error_feedback_converges_on_a_quadratic(compressing, rank, size, c):
    plain, plain_drift = quadratic(rank, size, c, False)
    fed, fed_drift = quadratic(rank, size, c, True)
    assert plain > 0.05, "without error feedback x came within %.4g of t: nothing to show" % plain
    assert fed < 0.02 and fed < plain / 3, (fed, plain)
    # What the rounding took is given back: the accumulated error stays within what the ranks
    # hold back (each at most half the 16-bit spacing at its gradient, about its offset),
    # doubled for the combines' roundings, which are not fed back; without feedback it grows.
    held = np.mean([spacing16(o, c) / 2 for o in offsets(size, c)])
    assert fed_drift <= 2 * held, (fed_drift, held)
    assert plain_drift > 10 * fed_drift, (plain_drift, fed_drift)


def test_refusals_name_what_is_wrong(rank, size):
    """Local refusals, at the call: compression on integers, under Adasum, an unknown value."""
    with pytest.raises(conflux.InvalidArgumentError,
                       match="tensor 'compression.ints': fp16 compression takes float32 and "
                             "float64 tensors, not int32"):
        conflux.allreduce(np.arange(4, dtype=np.int32), name="compression.ints",
                          compression=C.fp16)
    with pytest.raises(conflux.InvalidArgumentError,
                       match="compression.adasum.: op adasum does not combine compressed values"):
        conflux.allreduce(np.ones(4), op=conflux.Adasum, name="compression.adasum",
                          compression=C.bf16)
    with pytest.raises(conflux.InvalidArgumentError, match="compression 9 is not a "
                                                           "cfx_compression"):
        conflux.allreduce(np.ones(4), name="compression.nine", compression=9)
    with pytest.raises(ValueError, match="unknown compression 'fp8'; use one of: none, fp16, bf16"):
        conflux.allreduce(np.ones(4), name="compression.str", compression="fp8")
    with pytest.raises(TypeError, match="compression must be a conflux.Compression"):
        conflux.allreduce(np.ones(4), name="compression.bool", compression=True)
    with pytest.raises(conflux.InvalidArgumentError, match="error_feedback"):
        conflux.GradientSet("compression.ef.none", error_feedback=True)
    with conflux.GradientSet("compression.set.ints", compression=C.fp16) as gs:
        with pytest.raises(conflux.InvalidArgumentError, match="counts"):
            gs.add("counts", 4, np.int64)
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    import conflux.torch as cfx
    with pytest.raises(conflux.InvalidArgumentError, match="compression.torch.ints"):
        cfx.allreduce(torch.ones(3, dtype=torch.int64), name="compression.torch.ints",
                      compression=cfx.Compression.fp16)
    with pytest.raises(ValueError, match="error_feedback needs a compression"):
        cfx.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1),
                                 error_feedback=True)


def test_mismatched_compression_fails_on_every_rank(rank, size):
    mine = C.fp16 if rank == 0 else C.none
    with pytest.raises(conflux.MismatchError,
                       match="compression.mismatch.*mismatched compression.*rank 0 asked for "
                             "fp16 but rank 1 for none"):
        conflux.allreduce(np.ones(8, np.float32), name="compression.mismatch", compression=mine)
    with conflux.GradientSet("compression.set.mismatch", compression=mine) as gs:
        gs.add("g", 8)
        with pytest.raises(conflux.MismatchError, match="compression.set.mismatch"):
            gs.commit()
    got = conflux.allreduce(np.ones(8, np.float32), op=conflux.Sum, name="compression.after")
    np.testing.assert_array_equal(got, np.full(8, size, np.float32))

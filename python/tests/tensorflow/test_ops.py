"""Every op of conflux.tensorflow against values computed here from what each rank contributed,
eagerly and inside tf.function; gradients against finite differences of the total loss."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")


def contrib(r, shape=(3, 2), dtype=np.float32):
    """What rank r contributes: distinct per rank and element."""
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) * (r + 1) + 10 * r + 1).astype(dtype)


MODES = ["eager", "function"]


def run(mode, fn, *args):
    if mode == "eager":
        return fn(*args)
    return tf.function(fn)(*args)


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_ops(hvd, world, mode):
    r, n = world
    all_x = [contrib(k) for k in range(n)]
    expect = {hvd.Sum: np.sum(all_x, 0), hvd.Average: np.mean(all_x, 0),
              hvd.Min: np.min(all_x, 0), hvd.Max: np.max(all_x, 0), hvd.Product: np.prod(all_x, 0)}
    for op, want in expect.items():
        got = run(mode, lambda x: hvd.allreduce(x, op=op), tf.constant(all_x[r]))
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    # ints, float64, prescale/postscale
    xi = [contrib(k, (5,), np.int32) for k in range(n)]
    got = run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum), tf.constant(xi[r]))
    np.testing.assert_array_equal(got.numpy(), np.sum(xi, 0))
    xd = [contrib(k, (4,), np.float64) for k in range(n)]
    got = run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5,
                                            postscale_factor=3.0), tf.constant(xd[r]))
    np.testing.assert_allclose(got.numpy(), 3.0 * np.sum([0.5 * x for x in xd], 0), rtol=1e-12)
    # Horovod's average= argument
    got = run(mode, lambda x: hvd.allreduce(x, average=False), tf.constant(xd[r]))
    np.testing.assert_allclose(got.numpy(), np.sum(xd, 0), rtol=1e-12)
    # wire compression: within float16 rounding of the sum
    for comp in (hvd.Compression.fp16, "bf16_everywhere"):
        got = run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum, compression=comp),
                  tf.constant(all_x[r]))
        np.testing.assert_allclose(got.numpy(), np.sum(all_x, 0), rtol=1e-2)
    # named (the same name eagerly twice: reusable once complete)
    for _ in range(2):
        got = run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum, name="named.x"),
                  tf.constant(all_x[r]))
        np.testing.assert_allclose(got.numpy(), np.sum(all_x, 0))


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_results_held_across_steps(hvd, world, mode):
    """Results of several steps held at once keep their values (no buffer of one is reused by the
    next; the grouped allreduce's outputs are views of a block of shared tensor memory, above 1 MiB
    with several local ranks, which goes back to a cache only when all are released), tensors of
    odd byte sizes beside large ones, and the inputs are never written."""
    r, n = world
    big = [contrib(k, (600, 520)) for k in range(n)]               # 1.2 MiB: in shared memory
    small = [contrib(k, (3,), np.float64) for k in range(n)]
    odd = [contrib(k, (17,), np.int32) for k in range(n)]         # not a multiple of 64 bytes
    x, y, z = tf.constant(big[r]), tf.constant(small[r]), tf.constant(odd[r])
    grouped = lambda a, b, c: hvd.grouped_allreduce([a, b, c], op=hvd.Sum)
    single = lambda a: hvd.allreduce(a, op=hvd.Average)
    held = []
    for step in range(3):
        held.append(run(mode, grouped, x * (step + 1), y, z))
        held.append([run(mode, single, x * (step + 1))])
    for step in range(3):
        g, s = held[2 * step], held[2 * step + 1][0]
        np.testing.assert_allclose(g[0].numpy(), np.sum(big, 0) * (step + 1), rtol=1e-6)
        np.testing.assert_allclose(g[1].numpy(), np.sum(small, 0))
        np.testing.assert_array_equal(g[2].numpy(), np.sum(odd, 0))
        np.testing.assert_allclose(s.numpy(), np.mean(big, 0) * (step + 1), rtol=1e-6)
    np.testing.assert_array_equal(x.numpy(), big[r])
    # released results: their block is taken again by the next steps, which must not see its
    # old values (each step's result is its own inputs' sum)
    del held, g, s
    for step in range(3):
        g = run(mode, grouped, x * (step + 2), y, z)
        np.testing.assert_allclose(g[0].numpy(), np.sum(big, 0) * (step + 2), rtol=1e-6)
        np.testing.assert_array_equal(g[2].numpy(), np.sum(odd, 0))
        del g
    # a result used as the next input (TF may forward it): still right
    out = x
    for _ in range(2):
        out = run(mode, single, out)
    np.testing.assert_allclose(out.numpy(), np.mean(big, 0), rtol=1e-6)


def test_adasum(hvd, world):
    r, n = world
    if n & (n - 1):
        pytest.skip("Adasum's check needs a power-of-2 world")
    xs = [contrib(k, (6,), np.float64) for k in range(n)]

    def combine(a, b):
        dot = a @ b
        return (1 - dot / (2 * (a @ a))) * a + (1 - dot / (2 * (b @ b))) * b
    want = combine(xs[0], xs[1]) if n == 2 else None
    got = hvd.allreduce(tf.constant(xs[r]), op=hvd.Adasum).numpy()
    if want is not None:
        np.testing.assert_allclose(got, want, rtol=1e-10)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce(hvd, world, mode):
    r, n = world
    a = [contrib(k, (3,)) for k in range(n)]
    b = [contrib(k, (2, 2), np.float64) for k in range(n)]
    c = [contrib(k, (4,), np.int64) for k in range(n)]
    got = run(mode, lambda x, y, z: hvd.grouped_allreduce([x, y, z], op=hvd.Sum),
              tf.constant(a[r]), tf.constant(b[r]), tf.constant(c[r]))
    for g, all_v in zip(got, (a, b, c)):
        np.testing.assert_allclose(g.numpy(), np.sum(all_v, 0))
    got = run(mode, lambda x, y: hvd.grouped_allreduce([x, y], compression=hvd.Compression.fp16),
              tf.constant(a[r]), tf.constant(b[r]))
    np.testing.assert_allclose(got[0].numpy(), np.mean(a, 0), rtol=1e-2)
    np.testing.assert_allclose(got[1].numpy(), np.mean(b, 0), rtol=1e-2)


@pytest.mark.parametrize("mode", MODES)
def test_allgather_broadcast(hvd, world, mode):
    r, n = world
    rows = [contrib(k, (k + 1, 3)) for k in range(n)]  # dim 0 differs by rank
    got = run(mode, hvd.allgather, tf.constant(rows[r]))
    np.testing.assert_array_equal(got.numpy(), np.concatenate(rows))
    xi = [contrib(k, (2,), np.int32) for k in range(n)]
    got = run(mode, hvd.allgather, tf.constant(xi[r]))
    np.testing.assert_array_equal(got.numpy(), np.concatenate(xi))
    for root in {0, n - 1}:
        got = run(mode, lambda x: hvd.broadcast(x, root), tf.constant(rows[r][:1]))
        np.testing.assert_array_equal(got.numpy(), rows[root][:1])
    objs = hvd.allgather_object({"rank": r, "pad": "x" * r})
    assert objs == [{"rank": k, "pad": "x" * k} for k in range(n)]
    assert hvd.broadcast_object(("from", r), root_rank=n - 1) == ("from", n - 1)


def test_broadcast_variables(hvd, world):
    r, n = world
    vs = [tf.Variable(contrib(r, (3,))), tf.Variable(contrib(r, (2, 2), np.float64))]
    hvd.broadcast_variables(vs, root_rank=n - 1)
    np.testing.assert_array_equal(vs[0].numpy(), contrib(n - 1, (3,)))
    np.testing.assert_array_equal(vs[1].numpy(), contrib(n - 1, (2, 2), np.float64))
    v = tf.Variable(contrib(r, (4,)))
    hvd.broadcast_(v, 0, name="inplace.v")
    np.testing.assert_array_equal(v.numpy(), contrib(0, (4,)))

    @tf.function
    def f():
        hvd.broadcast_variables(vs, root_rank=0)
    vs[0].assign(contrib(r, (3,)))
    f()
    np.testing.assert_array_equal(vs[0].numpy(), contrib(0, (3,)))


def _a2a_send(src, n):
    """Rank src sends (src + j) % 2 + 1 rows to rank j; row values name (src, j, row)."""
    splits = [(src + j) % 2 + 1 for j in range(n)]
    rows = [np.full((2,), 100 * src + 10 * j + k, np.float32)
            for j in range(n) for k in range(splits[j])]
    return np.stack(rows), splits


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_reducescatter(hvd, world, mode):
    r, n = world
    x, splits = _a2a_send(r, n)
    got, recv = run(mode, lambda t, s: hvd.alltoall(t, splits=s), tf.constant(x),
                    tf.constant(splits, tf.int32))
    want = [_a2a_send(s, n)[0][sum(_a2a_send(s, n)[1][:r]):][:_a2a_send(s, n)[1][r]]
            for s in range(n)]
    np.testing.assert_array_equal(got.numpy(), np.concatenate(want))
    np.testing.assert_array_equal(recv.numpy(), [_a2a_send(s, n)[1][r] for s in range(n)])
    # equal splits
    eq = [np.arange(2 * n, dtype=np.int64) + 100 * k for k in range(n)]
    got, recv = run(mode, hvd.alltoall, tf.constant(eq[r]))
    np.testing.assert_array_equal(got.numpy(), np.concatenate([e[2 * r:2 * r + 2] for e in eq]))
    # reducescatter: 2n + 1 rows; the first (2n + 1) % n ranks get one more
    d0 = 2 * n + 1
    xs = [contrib(k, (d0, 2)) for k in range(n)]
    sizes = [d0 // n + (1 if k < d0 % n else 0) for k in range(n)]
    lo = sum(sizes[:r])
    for op, red in ((hvd.Sum, np.sum), (hvd.Average, np.mean)):
        got = run(mode, lambda t: hvd.reducescatter(t, op=op), tf.constant(xs[r]))
        np.testing.assert_allclose(got.numpy(), red(xs, 0)[lo:lo + sizes[r]], rtol=1e-6)


def test_topology_join_barrier(hvd, world):
    r, n = world
    assert int(hvd.rank_op()) == r and int(hvd.size_op()) == n
    assert 0 <= int(hvd.local_rank_op()) < int(hvd.local_size_op())
    assert tf.function(lambda: hvd.size_op())().numpy() == n
    hvd.barrier()

    @tf.function
    def in_function():
        hvd.barrier()
    in_function()
    # Rank 0 joins first: the others' allreduce counts it as zeros (Average divides by n).
    xs = [contrib(k, (3,), np.float64) for k in range(n)]
    if r == 0:
        last = int(hvd.join())
    else:
        got = hvd.allreduce(tf.constant(xs[r]), op=hvd.Sum, name="join.sum").numpy()
        np.testing.assert_allclose(got, np.sum(xs[1:], 0))
        last = int(hvd.join())
    assert 0 <= last < n
    assert hvd.allgather_object(last) == [last] * n


def test_errors(hvd, world):
    r, n = world
    with pytest.raises((TypeError, tf.errors.InvalidArgumentError), match="string"):
        hvd.allreduce(tf.constant(["strings"]))
    # shapes that differ across ranks under one name: an error on every rank
    with pytest.raises(tf.errors.OpError, match="MISMATCH|mismatch"):
        hvd.allreduce(tf.ones([r + 1]), op=hvd.Sum, name="bad.shape")
    # splits that do not add up to dim 0: refused here, at submission
    with pytest.raises(tf.errors.InvalidArgumentError):
        hvd.alltoall(tf.ones([n]), splits=[n + 1] + [0] * (n - 1))
    # still healthy afterwards
    np.testing.assert_allclose(hvd.allreduce(tf.ones([2]), op=hvd.Sum).numpy(), [n, n])


# ---- gradients: tape (eager and tf.function) vs finite differences of the total loss ----
def _fd(total, xs, r, eps=1e-3):
    """d total(xs) / d xs[r], by central differences (numpy only)."""
    g = np.zeros_like(xs[r])
    for i in np.ndindex(xs[r].shape):
        up = [x.copy() for x in xs]
        dn = [x.copy() for x in xs]
        up[r][i] += eps
        dn[r][i] -= eps
        g[i] = (total(up) - total(dn)) / (2 * eps)
    return g


def _weights(k, shape):
    return np.cos(np.arange(int(np.prod(shape))).reshape(shape) + 3.0 * k)


CASES = {
    # name: (tf op on this rank's x, numpy of the op's result on rank k from all xs, x shape)
    "allreduce_sum": (lambda h, x: h.allreduce(x, op=h.Sum), lambda xs, k: np.sum(xs, 0), None),
    "allreduce_avg_scaled": (lambda h, x: h.allreduce(x, prescale_factor=2.0, postscale_factor=0.5),
                             lambda xs, k: np.mean(xs, 0), None),
    "grouped": (lambda h, x: h.grouped_allreduce([x, 2 * x], op=h.Sum)[1],
                lambda xs, k: 2 * np.sum(xs, 0), None),
    "allgather": (lambda h, x: h.allgather(x), lambda xs, k: np.concatenate(xs), "ragged"),
    "broadcast": (lambda h, x: h.broadcast(x, 1), lambda xs, k: xs[1], None),
    "alltoall": (lambda h, x: h.alltoall(x)[0],
                 lambda xs, k: np.concatenate([x[2 * k:2 * k + 2] for x in xs]), "a2a"),
    "reducescatter": (lambda h, x: h.reducescatter(x, op=h.Sum),
                      lambda xs, k: np.sum(xs, 0)[2 * k:2 * k + 2], "a2a"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode", MODES)
def test_gradients(hvd, world, case, mode):
    r, n = world
    op, ref, kind = CASES[case]
    shape = lambda k: (k + 1, 2) if kind == "ragged" else ((2 * n, 2) if kind == "a2a" else (3, 2))
    xs = [np.sin(np.arange(int(np.prod(shape(k)))).reshape(shape(k)) + k) for k in range(n)]
    out_shape = [ref(xs, k).shape for k in range(n)]
    ws = [_weights(k, out_shape[k]) for k in range(n)]

    def total(xs_):  # every rank's loss, summed
        return sum(float(np.sum(ws[k] * ref(xs_, k))) for k in range(n))

    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.constant(ws[r]) * op(hvd, x))
        return tape.gradient(loss, x)
    g = run(mode, grad, tf.constant(xs[r]))
    np.testing.assert_allclose(g.numpy(), _fd(total, xs, r), rtol=1e-6, atol=1e-8)


def test_other_tensorflow_version_is_a_clear_error(hvd, tmp_path, monkeypatch):
    """A library built for another tensorflow: an ImportError naming both versions, no load."""
    from conflux.tensorflow import _ops
    (tmp_path / "_tf_ops.tf9.9.9.so").write_bytes(b"not a library")
    monkeypatch.setattr(_ops, "_PKG", str(tmp_path))
    with pytest.raises(ImportError, match=r"built against tensorflow 9\.9\.9 but tensorflow %s"
                       % tf.__version__.replace(".", r"\.")):
        _ops._load()

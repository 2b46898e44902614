"""Process sets in the TF ops (Horovod's process_set=): every collective among a set's ranks only,
eagerly and in tf.function, against values computed here; a 2-rank set at 3 ranks (a 1-rank set
at 2), ranks outside the set refused, the set's traced graph failing once the set is removed."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

MODES = ["eager", "function"]


def contrib(r, shape=(3, 2), dtype=np.float32):
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) * (r + 1) + 10 * r + 1).astype(dtype)


def run(mode, fn, *args):
    return fn(*args) if mode == "eager" else tf.function(fn)(*args)


@pytest.fixture
def pset(hvd, world):
    r, n = world
    ranks = [0, n - 1] if n >= 3 else [n - 1]
    ps = hvd.add_process_set(ranks)   # collective over every rank
    yield ps
    hvd.remove_process_set(ps)


@pytest.mark.parametrize("mode", MODES)
def test_collectives_in_a_set(hvd, world, pset, mode):
    r, n = world
    members = pset.ranks
    if r not in members:
        with pytest.raises(ValueError, match="not in"):
            hvd.allreduce(tf.ones([2]), process_set=pset)
        return
    assert pset.size() == len(members) and pset.rank() == members.index(r)
    x = tf.constant(contrib(r))
    got = run(mode, lambda t: hvd.allreduce(t, op=hvd.Sum, process_set=pset), x)
    np.testing.assert_allclose(got.numpy(), np.sum([contrib(k) for k in members], 0))
    got = run(mode, lambda t: hvd.allreduce(t, process_set=pset), x)   # Average over the set
    np.testing.assert_allclose(got.numpy(), np.mean([contrib(k) for k in members], 0), rtol=1e-6)
    a, b = tf.constant(contrib(r, (4,))), tf.constant(contrib(r, (2, 2), np.float64))
    got = run(mode, lambda u, v: hvd.grouped_allreduce([u, v], op=hvd.Sum, process_set=pset),
              a, b)
    np.testing.assert_allclose(got[0].numpy(), np.sum([contrib(k, (4,)) for k in members], 0))
    np.testing.assert_allclose(got[1].numpy(),
                               np.sum([contrib(k, (2, 2), np.float64) for k in members], 0))
    # allgather: dim 0 differs by rank; the set's ranks in order
    rows = tf.constant(contrib(r, (r + 1, 2)))
    got = run(mode, lambda t: hvd.allgather(t, process_set=pset), rows)
    np.testing.assert_array_equal(got.numpy(),
                                  np.concatenate([contrib(k, (k + 1, 2)) for k in members]))
    # broadcast: root_rank is the job's rank of the root
    root = members[-1]
    got = run(mode, lambda t: hvd.broadcast(t, root_rank=root, process_set=pset), x)
    np.testing.assert_array_equal(got.numpy(), contrib(root))
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast(x, root_rank=[k for k in range(n) if k not in members][0]
                      if n > len(members) else n + 5, process_set=pset)
    # alltoall: splits over the set's ranks
    m = len(members)
    me = members.index(r)
    send = tf.constant(np.arange(2 * m, dtype=np.float32) + 100 * r)
    got, recv_splits = run(mode, lambda t: hvd.alltoall(t, splits=[2] * m, process_set=pset), send)
    want = np.concatenate([np.arange(2 * m, dtype=np.float32)[2 * me:2 * me + 2] + 100 * k
                           for k in members])
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(recv_splits.numpy(), [2] * m)
    # reducescatter: rank i of the set keeps block i of the sum
    big = tf.constant(contrib(r, (2 * m, 2)))
    got = run(mode, lambda t: hvd.reducescatter(t, op=hvd.Sum, process_set=pset), big)
    total = np.sum([contrib(k, (2 * m, 2)) for k in members], 0)
    np.testing.assert_allclose(got.numpy(), total[2 * me:2 * me + 2])
    hvd.barrier(process_set=pset)


def test_gradient_tape_in_a_set(hvd, world, pset):
    r, n = world
    if r not in pset.ranks:
        return
    v = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v * float(r + 1))
    g = hvd.DistributedGradientTape(tape, process_set=pset).gradient(loss, v)
    want = np.mean([k + 1 for k in pset.ranks])
    np.testing.assert_allclose(g.numpy(), [want, want])
    # the gradient of an allreduce over the set: the set's sum of the upstream gradients
    x = tf.Variable([3.0])
    with tf.GradientTape() as tape:
        y = hvd.allreduce(x * float(r + 1), op=hvd.Sum, process_set=pset)
        loss = tf.reduce_sum(y)
    np.testing.assert_allclose(tape.gradient(loss, x).numpy(), [len(pset.ranks) * (r + 1)])


def test_removed_set(hvd, world):
    r, n = world
    ps = hvd.add_process_set([n - 1] if n < 3 else [1, 2])
    inside = r in ps.ranks
    fn = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, process_set=ps))
    if inside:
        np.testing.assert_allclose(fn(tf.ones([1])).numpy(), [len(ps.ranks)])
    assert hvd.remove_process_set(ps)
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(tf.ones([1]), process_set=ps)
    if inside:  # the traced graph keeps the id; its context is gone
        with pytest.raises(tf.errors.FailedPreconditionError, match="process set"):
            fn(tf.ones([1]))
    hvd.barrier()

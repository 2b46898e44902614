"""DistributedGradientTape: a tf.GradientTape whose gradient() averages the gradients over ranks
(one grouped allreduce of the dense ones, IndexedSlices allgathered or densified)."""
import tensorflow as tf

from conflux import _core

from . import _ops
from .compression import Compression
from .mpi_ops import _op, grouped_allreduce


def reduce_gradients(grads, op=None, compression=Compression.none, sparse_as_dense=False,
                     gradient_predivide_factor=1.0, num_groups=0, name=None, process_set=None):
    """Averages (op) a flat list of gradients over ranks; None entries stay None. Shared by
    DistributedGradientTape and conflux.keras.DistributedOptimizer."""
    rop = _op(op, None)
    if gradient_predivide_factor != 1.0 and rop != _core.Average:
        raise ValueError("gradient_predivide_factor needs op=Average")
    pre, post = 1.0, 1.0
    if gradient_predivide_factor != 1.0:
        pre, post = 1.0 / gradient_predivide_factor, gradient_predivide_factor
    grads = list(grads)
    if sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    idx = [i for i, g in enumerate(grads) if g is not None]
    todo = [grads[i] for i in idx]
    groups = [todo]
    if num_groups and num_groups > 1 and len(todo) > 1:
        k = min(num_groups, len(todo))
        step = -(-len(todo) // k)
        groups = [todo[j:j + step] for j in range(0, len(todo), step)]
    reduced = []
    for j, grp in enumerate(groups):
        nm = None if name is None else (name if len(groups) == 1 else "%s.g%d" % (name, j))
        reduced += grouped_allreduce(grp, op=rop, compression=compression, prescale_factor=pre,
                                     postscale_factor=post, name=nm, process_set=process_set)
    out = list(grads)
    for i, r in zip(idx, reduced):
        out[i] = r
    return out


class _DistributedGradientTape(tf.GradientTape):
    def gradient(self, target, sources, output_gradients=None, *args, **kwargs):
        grads = super().gradient(target, sources, output_gradients, *args, **kwargs)
        flat = tf.nest.flatten(grads, expand_composites=False)
        reduced = reduce_gradients(flat, **self._cfx_args)
        return tf.nest.pack_sequence_as(grads, reduced, expand_composites=False)


def DistributedGradientTape(gradtape, device_dense='', device_sparse='',
                            compression=Compression.none, sparse_as_dense=False, op=None,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=None, scale_local_gradients=True):
    """Wraps a tf.GradientTape (before or after its `with` block): gradient() returns the
    gradients averaged over every rank (op=Sum sums, op=Adasum combines adaptively)."""
    _ops.require()
    if groups is not None:
        raise NotImplementedError("conflux.tensorflow: explicit gradient groups are not supported; "
                                  "use num_groups")
    cls = type(gradtape.__class__.__name__, (_DistributedGradientTape, gradtape.__class__), {})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._cfx_args = dict(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                          gradient_predivide_factor=gradient_predivide_factor,
                          num_groups=num_groups, process_set=process_set)
    return tape

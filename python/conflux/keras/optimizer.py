"""DistributedOptimizer for Keras 3: the wrapped optimizer's gradients are averaged over ranks
(one grouped allreduce per update) right before clipping and the update step, i.e. in
BaseOptimizer._clip_gradients, which Keras calls once per real update with the final gradients:
after gradient accumulation (backward_passes_per_step = Keras's gradient_accumulation_steps, so
accumulating passes send nothing), before clipnorm/clipvalue and weight decay, as Horovod's
wrapper averaged before its optimizer saw the gradients."""
from conflux import _args
from conflux import _core
from conflux.tensorflow import _ops
from conflux.tensorflow.compression import Compression
from conflux.tensorflow.gradient_tape import reduce_gradients


def _clip_gradients(self, grads):
    args = type(self)._cfx_args
    grads = list(grads)
    idx = [i for i, g in enumerate(grads) if g is not None]
    reduced = reduce_gradients([grads[i] for i in idx], **args)
    if type(self)._cfx_sum_passes > 1:  # Horovod's average_aggregated_gradients=False: a sum
        reduced = [g * type(self)._cfx_sum_passes for g in reduced]
    for i, g in zip(idx, reduced):
        grads[i] = g
    return type(self).__mro__[1]._clip_gradients(self, grads)


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=None, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=None, scale_local_gradients=True):
    """A new optimizer of `optimizer`'s class and config whose gradients are averaged (op) over
    every rank before each update. backward_passes_per_step > 1 accumulates that many local
    passes (Keras's gradient_accumulation_steps) before one reduction; their sum is reduced
    unless average_aggregated_gradients (then their mean)."""
    _ops.require()
    if groups is not None:
        raise NotImplementedError("conflux.keras: explicit gradient groups are not supported; "
                              "use num_groups")
    if op is not None and _args.check_op(op) == _core.Adasum and backward_passes_per_step > 1:
        raise NotImplementedError("Adasum with backward_passes_per_step > 1")
    base = type(optimizer)
    if getattr(optimizer, "_cfx_distributed", False):
        return optimizer
    args = dict(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
                name=None, process_set=process_set)
    k = int(backward_passes_per_step)
    cls = type(base.__name__, (base,), {
        "_clip_gradients": _clip_gradients, "_cfx_args": args, "_cfx_distributed": True,
        "_cfx_sum_passes": 1 if average_aggregated_gradients else k,
        "__module__": base.__module__,
    })
    config = optimizer.get_config()
    if k > 1:
        config["gradient_accumulation_steps"] = k
    return cls.from_config(config)

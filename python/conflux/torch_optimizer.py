"""conflux.torch.DistributedOptimizer: wraps a torch optimizer so that its gradients are reduced
over the ranks as backward produces them. The function chooses the form and checks what the forms
share; the forms live in their own modules:

- conflux._torch_gradset_optimizer: the gradients in gradient sets (docs/c-api.md "Gradient
  sets"), what the sets cannot carry per call;
- conflux._torch_optimizer_hooks: the per-tensor hooks and the per-call path (one allreduce per
  gradient from its hook);
- conflux._torch_adasum_optimizer: op=Adasum with more than one rank, Horovod's Adasum optimizer;
- conflux._torch_optimizer_args: the arguments every form checks alike.

conflux.horovod.torch's DistributedOptimizer is the gradient-set optimizer with Horovod's
differences (sparse gradients, Horovod's process sets, errors and warning texts).
"""
import warnings

from ._core import Adasum, Average, size
from ._torch_adasum_optimizer import _adasum_optimizer
from ._torch_compression import NoneCompressor
from ._torch_gradset_optimizer import STORAGES, _DistributedOptimizer  # noqa: F401  (STORAGES: API)


def DistributedOptimizer(optimizer, named_parameters=None, compression=NoneCompressor,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         gradient_storage="conflux", shared_gradients=None, error_feedback=False,
                         process_set=None, bucket_bytes=0):
    """Wraps a torch optimizer: its gradients are reduced over the ranks (op, Average by
    default) as backward produces them, and step() waits for them before updating. Returns an
    instance of a subclass of the optimizer's class. Construction is collective: the parameters
    are registered in a gradient set (named after named_parameters; ranks may list them in any
    order, but must register the same names, dtypes and shapes, else MismatchError naming the
    gradient), and so is a later add_param_group().
    gradient_storage="conflux" (the default): every CPU parameter's .grad is a view into the
    set's storage in shared tensor memory, so the reductions run in place without copies;
    zero_grad(set_to_none=True) sets .grad to None as torch does, and backward's next gradient is
    copied into the view. "framework": the gradients stay in
    torch's own memory, each reduced by its own allreduce (as are CUDA parameters, and every
    gradient under a compressor of one's own).
    compression: Compression.none, Compression.fp16 or a conflux.Compression value is the
    engine's wire compression of the float32/float64 gradients (their gradient set's, or their
    allreduces'); error_feedback=True (with one) keeps what the rounding took on each rank and
    adds it to the next step's gradients. A Compressor of one's own casts around per-call
    allreduces.
    op=Adasum (more than one rank): Adasum combines each rank's optimizer update, not the
    gradients, as in Horovod (the local step runs in the hooks, step() applies the combined
    deltas; gradient_storage does not apply).
    process_set (a conflux.torch.ProcessSet or conflux.ProcessSet): the gradients are reduced
    over its ranks (Average: divided by its size), in gradient sets on its context; construction
    is collective over its ranks; a rank outside it reduces nothing (step() is the wrapped
    optimizer's).
    bucket_bytes: the gradient sets' bucket size (0: the engine's, CFX_GRADSET_BUCKET_BYTES or
    25 MiB); a bucket goes out once backward produced all of its gradients, like DDP's
    bucket_cap_mb.
    shared_gradients is the older spelling (True: "conflux", False: "framework")."""
    if shared_gradients is not None:
        warnings.warn("DistributedOptimizer(shared_gradients=...) is now gradient_storage="
                      "'conflux' (the default) or 'framework'", DeprecationWarning)
        gradient_storage = "conflux" if shared_gradients else "framework"
    if op == Adasum and size() > 1:
        if process_set is not None:
            raise NotImplementedError("op=Adasum does not support process sets yet")
        if gradient_predivide_factor != 1.0:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        if error_feedback:
            raise ValueError("error_feedback needs compression, which op=Adasum does not take")
        return _adasum_optimizer(optimizer, named_parameters, compression,
                                backward_passes_per_step)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    wrapped = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
                  gradient_predivide_factor, gradient_storage, error_feedback, process_set,
                  bucket_bytes)
    wrapped.defaults = optimizer.defaults  # for add_param_group (the class's own are placeholders)
    return wrapped

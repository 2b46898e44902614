"""horovod.torch.optimizer: Horovod's DistributedOptimizer, gradient by gradient as Horovod does
it: a hook per parameter starts the gradient's allreduce over the process set once backward
produced it (after backward_passes_per_step passes), step() waits for them. Sparse gradients
(nn.Embedding(sparse=True)) are allreduced as allgathers of indices and values, or as dense
tensors with sparse_as_dense=True. conflux.torch.DistributedOptimizer (gradient sets) is the
faster path for dense gradients on the global set."""
import contextlib
import warnings

import torch

from conflux.torch import _wire_compression
from conflux.torch_optimizer import (_DistributedOptimizer as _PerCall, _adasum_optimizer,
                                     _after_accumulation, _checked_names, _idle_zero_grad)

from . import mpi_ops as _mpi
from .compression import Compression
from .mpi_ops import Adasum, Average, Max, Min, Product, Sum, global_process_set, size


def _check_groups(groups):
    if groups is None:
        return
    if not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of "
                         "torch.Tensor.")
    if isinstance(groups, list):
        seen = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                seen.add(id(p))


class _DistributedOptimizer(torch.optim.Optimizer):
    # The hooks, and the start of the allreduces whose hooks did not fire, are conflux.torch's
    # per-call path's (the same fields; _allreduce_grad_async is this class's).
    _make_hook = _PerCall._make_hook
    _start_missing = _PerCall._start_missing

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, sparse_as_dense, process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        named_parameters = _checked_names(self, named_parameters)
        self._parameter_names = {v: k for k, v in named_parameters}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in named_parameters}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._ops = _mpi._GLOBAL if process_set is global_process_set else \
            _mpi._set_ops(process_set)
        # A rank outside the set reduces nothing: its optimizer is the one it wraps.
        self._included = bool(process_set.included())
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        if size() > 1 and self._included:
            self._register_hooks()

    def load_state_dict(self, *args, **kwargs):
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        self.set_backward_passes_per_step(self.backward_passes_per_step)
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:  # the hook runs once p.grad holds this pass's gradient
                    self._requires_update.add(p)
                    _after_accumulation(p, self._make_hook(p), self._grad_accs)

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            # Not produced on this rank (dynamic graphs); other ranks may have it: send zeros.
            p.grad = torch.zeros_like(p)
        name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor.is_sparse:
            if not self.sparse_as_dense:
                return _mpi._sparse_allreduce(self._ops, tensor, name, self.op, 1.0, 1.0), None
            tensor = tensor.to_dense()
        if self.op == Average:
            # The engine divides by the set's size on top of the postscale.
            prescale = 1.0 / self.gradient_predivide_factor
            postscale = self.gradient_predivide_factor
        else:
            prescale = postscale = 1.0
        wire = _wire_compression(self._compression, tensor, self.op)
        if wire and tensor.is_contiguous():  # Compression.fp16: the engine's, in place
            return self._ops.allreduce_async_(tensor, self.op, name, prescale, postscale,
                                              wire), None
        compressed, ctx = self._compression.compress(tensor)
        handle = self._ops.allreduce_async_(compressed, self.op, name, prescale, postscale)
        return handle, ctx

    def synchronize(self):
        """Waits for every gradient's allreduce (starting those whose hooks did not fire)."""
        if not self._included or size() <= 1:
            self._synchronized = True
            return
        self._start_missing()
        errors = []
        for p, (handle, ctx) in self._handles.items():
            try:
                output = _mpi.synchronize(handle)
            except Exception as exc:  # wait for the rest before raising
                errors.append(exc)
                continue
            self._allreduce_delay[p] = self.backward_passes_per_step
            aggregated = self._compression.decompress(output, ctx)
            if p.grad.is_sparse:
                if not aggregated.is_sparse:  # sparse_as_dense: back to the gradient's layout
                    aggregated = aggregated.to_sparse()
                p.grad.zero_().add_(aggregated)
            elif aggregated is not p.grad:
                p.grad.set_(aggregated)
        self._handles.clear()
        self._synchronized = True
        if errors:
            self.set_backward_passes_per_step(self.backward_passes_per_step)
            raise errors[0]

    @contextlib.contextmanager
    def skip_synchronize(self):
        """
        A context manager used to specify that optimizer.step() should
        not perform synchronization.

        It's typically used in a following pattern:

        .. code-block:: python

            optimizer.synchronize()
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without "
                              "optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    zero_grad = _idle_zero_grad


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Horovod's DistributedOptimizer: gradients are allreduced over `process_set` from backward
    hooks as they become ready and step() waits for them (a rank outside the set reduces nothing).
    Sparse gradients go as allgathers of indices and values, or as dense tensors with
    sparse_as_dense=True. `num_groups`/`groups` (grouping hints) are checked and otherwise
    ignored: Conflux fuses ready tensors by itself. compression=Compression.fp16 is the engine's
    wire compression for float32/float64 CPU gradients (rounded once where they are packed,
    combined in float32; Horovod's cast elsewhere). op=Adasum (more than one rank, the global
    set): Adasum combines each rank's optimizer update, as Horovod's Adasum optimizer does."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed "
                      "in v0.23.0.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    _check_groups(groups)
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if op == Adasum and size() > 1:
        if process_set is not global_process_set:
            raise NotImplementedError("Adasum does not support non-global process sets yet.")
        return _adasum_optimizer(optimizer, named_parameters, compression,
                                 backward_passes_per_step,
                                 {"_wait_handle": staticmethod(_mpi.synchronize)})
    if op not in (Sum, Average, Min, Max, Product, Adasum):
        raise ValueError("unknown reduction op %r" % (op,))
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, sparse_as_dense, process_set)

"""conflux.torch's DistributedOptimizer(op=Adasum) with more than one rank, Horovod's Adasum
optimizer: each rank's local optimizer update, not its gradients, is what Adasum combines. The
hooks and their pass counting are the per-call path's (conflux._torch_optimizer_hooks), with this
optimizer's _allreduce_grad_async: the local step on one parameter and its delta's allreduce.
"""
import weakref

import torch

from . import _core
from ._core import Adasum
from ._torch_collectives import allreduce_async_
from ._torch_compression import NoneCompressor
from ._torch_optimizer_args import _checked_names, _checked_passes, _compression_plan
from ._torch_optimizer_hooks import _after_accumulation, _make_hook, _remove_hooks


def _idle_zero_grad(self, *args, **kwargs):
    """zero_grad() of an optimizer whose started allreduces are self._handles: refused while
    there are some, as Horovod does."""
    if self._handles:
        raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                             "optimizer.step() or optimizer.synchronize(). This is prohibited as "
                             "it can cause a race condition.")
    return super(self.__class__, self).zero_grad(*args, **kwargs)


class _AdasumOptimizer(torch.optim.Optimizer):
    """DistributedOptimizer(op=Adasum), as Horovod's: Adasum combines what the optimizer would do
    on each rank, not the gradients. Once backward produced p's gradient (after
    backward_passes_per_step passes), the hook applies the wrapped optimizer's step to p alone,
    turns p into that step's delta (new - start) and starts its Adasum allreduce in place; step()
    waits and sets p to start + the combined delta. The engine's Adasum keeps each tensor's dot
    products and norms apart, so every parameter is combined on its own as in Horovod. A
    compressor's cast applies around the allreduce (the engine does not combine compressed values
    under Adasum). `_wait_handle` waits for a handle (the Horovod layer's raises its errors)."""

    _wait_handle = staticmethod(_core.Handle.wait)

    def __init__(self, params, named_parameters, compression, backward_passes_per_step):
        super(self.__class__, self).__init__(params)
        wire, compressor = _compression_plan(compression)
        if wire and compressor is NoneCompressor:  # a conflux.Compression value
            raise ValueError("op=Adasum does not combine compressed values: compression %r is "
                             "not taken (Compression.fp16 of conflux.torch casts the deltas to "
                             "float16 instead)" % (compression,))
        self._compression = compressor
        self._parameter_names = {v: k for k, v in _checked_names(self, named_parameters)}
        self.backward_passes_per_step = _checked_passes(backward_passes_per_step)
        self._allreduce_delay = {}
        self._handles = {}         # p -> (handle, (sent tensor, ctx)) of this step
        self._requires_update = set()
        self._starts = {}          # p -> its value before this step's local update
        self._hook_handles = []
        self._grad_accs = []
        weakref.finalize(self, _remove_hooks, self._hook_handles)
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    self._requires_update.add(p)
                    self._allreduce_delay[p] = self.backward_passes_per_step
                    self._starts[p] = torch.zeros_like(p, requires_grad=False)
                    self._hook_handles.append(_after_accumulation(p, self._make_hook(p),
                                                                  self._grad_accs))

    def set_backward_passes_per_step(self, passes):
        passes = _checked_passes(passes)
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    _make_hook = _make_hook  # the per-call path's: the delays and handles work the same

    def _allreduce_grad_async(self, p):
        """The wrapped optimizer's step on p alone, p turned into its delta, and the delta's
        Adasum allreduce started."""
        start = self._starts[p]
        start.copy_(p.data)
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is q for q in group["params"]) else []
        try:
            super(self.__class__, self).step()
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        p.data.sub_(start)
        sent, ctx = self._compression.compress(p.data)
        handle = allreduce_async_(sent, op=Adasum, name=self._parameter_names.get(p))
        return handle, (sent, ctx)

    def synchronize(self):
        """Nothing to do before step(), as in Horovod: the deltas exist only once the local
        updates ran, which the hooks and step() do."""

    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum "
                             "optimizer.")

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for p in sorted(self._requires_update - set(self._handles),
                        key=lambda q: self._parameter_names.get(q, "")):
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, _) in list(self._handles.items()):
            if handle is None:  # fewer passes than backward_passes_per_step: this step anyway
                self._handles[p] = self._allreduce_grad_async(p)
        errors = []
        for p, (handle, (sent, ctx)) in self._handles.items():
            try:
                delta = self._compression.decompress(self._wait_handle(handle), ctx)
            except Exception as exc:  # wait for the rest before raising
                errors.append(exc)
                delta = torch.zeros_like(p)
            start = self._starts[p]
            start.add_(delta)
            p.data.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        if errors:
            raise errors[0]
        return loss

    zero_grad = _idle_zero_grad


def _adasum_optimizer(optimizer, named_parameters, compression, backward_passes_per_step,
                     attributes=None):
    """The Adasum form of DistributedOptimizer (_AdasumOptimizer) over `optimizer`; `attributes`
    replace the class's (the Horovod layer's _wait_handle)."""
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_AdasumOptimizer.__dict__, **(attributes or {})))
    wrapped = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step)
    wrapped.defaults = optimizer.defaults
    return wrapped


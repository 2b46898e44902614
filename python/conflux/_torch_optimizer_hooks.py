"""The per-tensor hooks of conflux.torch's optimizers and the per-call path they drive.

A hook runs each time backward has accumulated a parameter's gradient into p.grad
(_after_accumulation). On the per-call path it counts the backward passes of its gradient and,
at the last one of a step, starts that gradient's own allreduce (an allreduce_async_ of the
optimizer's collectives: the job's, or a process set's); synchronize() starts those whose hooks
did not fire and waits for them all. The path carries what a gradient set cannot: every gradient
under gradient_storage="framework", CUDA gradients, gradients under a compressor of one's own,
and (conflux.horovod.torch) sparse ones. Adasum's optimizer uses the same hooks with its own
_allreduce_grad_async.

The per-call path's functions take the optimizer as `self`: each optimizer class binds them in
its own body, because DistributedOptimizer makes a subclass of the wrapped optimizer's class from
that body's dict alone (a base class's methods would not come along).
"""
import torch

from ._torch_compression import NoneCompressor, _compressible


def _too_many_passes(exc):
    return AssertionError("Gradients were computed more than backward_passes_per_step times before "
                          "call to step(). Increase backward_passes_per_step to accumulate "
                          "gradients locally. (%s)" % exc)


def _after_accumulation(p, hook, nodes):
    """Registers hook() to run each time backward has accumulated p's gradient into p.grad;
    returns the handle that removes it. torch >= 2.1: a post-accumulate-grad hook; before, a hook
    on p's AccumulateGrad node, which `nodes` keeps alive (the graph reuses it while it lives)."""
    if hasattr(p, "register_post_accumulate_grad_hook"):
        return p.register_post_accumulate_grad_hook(hook)
    with torch.enable_grad():
        node = p.expand_as(p).grad_fn.next_functions[0][0]
    nodes.append(node)
    return node.register_hook(hook)


def _remove_hooks(handles):
    for h in handles:
        h.remove()
    del handles[:]


# ---- the per-call path: bound as methods of the optimizer classes ----
def _add_per_call(self, p):
    """p's gradient goes through the per-call path: an allreduce from its hook."""
    self._requires_update.add(p)
    self._allreduce_delay[p] = self.backward_passes_per_step
    self._hook_handles.append(_after_accumulation(p, self._make_hook(p), self._grad_accs))


def _allreduce_grad_async(self, p):
    if p.grad is None:
        # Not produced on this rank (dynamic graphs); other ranks may have it: send zeros.
        p.grad = torch.zeros_like(p)
    return self._dense_allreduce(p.grad, self._parameter_names.get(p))


def _dense_allreduce(self, grad, name):
    """Starts the allreduce of a dense gradient: (handle, (sent tensor, ctx, compressor)).
    The engine's wire compression where it applies, else the compressor's cast around it."""
    prescale, postscale = self._scales()
    if self._wire and _compressible(grad) and grad.is_contiguous():
        handle = self._ops.allreduce_async_(grad, op=self.op, name=name,
                                            prescale_factor=prescale,
                                            postscale_factor=postscale, compression=self._wire)
        return handle, (grad, None, NoneCompressor)
    compressed, ctx = self._compression.compress(grad)
    if not compressed.is_contiguous():
        compressed = compressed.contiguous()
    handle = self._ops.allreduce_async_(compressed, op=self.op, name=name,
                                        prescale_factor=prescale, postscale_factor=postscale)
    return handle, (compressed, ctx, self._compression)


def _take(p, result):
    """Puts a per-call allreduce's result into p.grad."""
    if result.data_ptr() != p.grad.data_ptr():
        p.grad.copy_(result)


def _make_hook(self, p):
    def hook(*ignore):
        if p in self._handles and self._handles[p][0] is not None:
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before "
                    "call to step(). Increase backward_passes_per_step to accumulate gradients "
                    "locally.")
        assert not p.grad.requires_grad
        assert self._allreduce_delay[p] > 0
        handle, ctx = None, None
        self._allreduce_delay[p] -= 1
        if self._allreduce_delay[p] == 0:
            handle, ctx = self._allreduce_grad_async(p)
        self._handles[p] = (handle, ctx)
    return hook


def _start_missing(self):
    """Starts the per-call allreduces whose hooks did not fire (or not often enough)."""
    missing = self._requires_update - set(self._handles)
    for p in sorted(missing, key=lambda q: self._parameter_names.get(q, "")):
        self._handles[p] = self._allreduce_grad_async(p)
    for p, (handle, ctx) in list(self._handles.items()):
        if handle is None:
            self._handles[p] = self._allreduce_grad_async(p)


def _wait_per_call(self, errors):
    for p, (handle, (compressed, cctx, compressor)) in self._handles.items():
        try:
            output = self._wait_handle(handle)
        except Exception as exc:  # wait for the rest before raising
            errors.append(exc)
            continue
        self._allreduce_delay[p] = self.backward_passes_per_step
        self._take(p, compressor.decompress(output, cctx))
    self._handles.clear()

"""conflux.torch.DistributedOptimizer over gradient sets (docs/c-api.md "Gradient sets").

Construction registers every parameter that needs a gradient in a gradient set, named after
named_parameters (ranks may register in different orders), and commits it: collective, every
rank's names, dtypes and shapes checked. With the default storage ("conflux") each CPU parameter's
.grad becomes a view into the set's owned storage (shared tensor memory laid out by bucket), so
backward accumulates straight into the buffers the engine reduces in place. A hook that runs once
backward accumulated a gradient marks it ready (the SWIG entry itself, no Python layer between);
a bucket goes out when its last gradient is ready, while backward goes on; step() and
synchronize() wait for the set. The views stay across zero_grad(), also with set_to_none=True.

What a gradient set cannot carry goes through the per-call path (an allreduce_async_ per
gradient from the same hooks, as before gradient sets): every parameter with
gradient_storage="framework", CUDA parameters (owned storage is host memory), and compressors
other than Compression.none and Compression.fp16. Compression.fp16 stays on the set: float16
buffers in the owned storage, the hook casts the gradient into its buffer, step() casts back.
"""
import contextlib
import itertools
import math
import warnings
import weakref

import numpy as np
import torch

from . import _capi
from . import _core
from .gradset import _Native, _View
from .torch import (FP16Compressor, NoneCompressor, Average, Max, Min, Product, Sum,
                    _check_dtype, allreduce_async_, size)

STORAGES = ("conflux", "framework")
_set_names = itertools.count()  # every rank makes its optimizers' sets in the same order
_ready = _capi._capi_native.cfx_gradset_ready  # the C wrapper itself: the hooks' only call
_wait = _capi.cfx_py_gradset_wait


def _too_many_passes(exc):
    return AssertionError("Gradients were computed more than backward_passes_per_step times before "
                          "call to step(). Increase backward_passes_per_step to accumulate "
                          "gradients locally. (%s)" % exc)


def _adopt(p, view):
    """Makes `view` p's gradient again, holding what p.grad held (zeros for None)."""
    g = p.grad
    if g is None:
        view.zero_()
    else:
        view.copy_(g)
    p.grad = view


def _view_hook(ptr, i, fired, p, view):
    """The hook of gradient i of a set whose buffer is p's .grad: backward accumulated into it
    (or, when the user replaced p.grad, the buffer takes it back first); then i is ready."""
    def hook(*_):
        fired[i] = True
        if p.grad is not view:
            _adopt(p, view)
        try:
            _ready(ptr, i)
        except _core.InvalidArgumentError as exc:
            raise _too_many_passes(exc) from exc
    return hook


def _staged_hook(ptr, i, fired, p, stage):
    """The hook of gradient i kept in a buffer of another dtype (fp16 compression): the
    gradient is cast into it (every pass; the last pass holds the sum), then i is ready."""
    def hook(*_):
        fired[i] = True
        stage.copy_(p.grad)
        try:
            _ready(ptr, i)
        except _core.InvalidArgumentError as exc:
            raise _too_many_passes(exc) from exc
    return hook


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


def _owned_tensor(native, index, dtype, shape):
    """The owned storage of gradient `index` as a torch tensor (its memory lives while the tensor
    does: numpy base -> _View -> the set)."""
    nbytes = math.prod(shape) * _core.dtype_size(_check_dtype(dtype))
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    address = _capi.cfx_gradset_data(native.ptr, index)
    raw = np.asarray(_View(native, address, np.dtype(np.uint8), (nbytes,)))
    return torch.from_numpy(raw).view(dtype).view(shape)


class _GradSet:
    """One committed gradient set of an optimizer. entries: (name, parameter, buffer dtype); a
    buffer of the parameter's dtype becomes p.grad, another dtype is a cast copy (staged)."""

    def __init__(self, name, entries, op, prescale, postscale, passes, handles, nodes):
        opts = _capi.cfx_gradset_options()
        _capi.cfx_gradset_options_init(opts, _capi.CFX_GRADSET_OPTIONS_VERSION)
        opts.op = op
        opts.prescale = prescale
        opts.postscale = postscale
        opts.accumulate_steps = passes
        ctx = _core.current()
        self.name = name
        self.native = native = _Native(_capi.cfx_gradset_create(ctx.ptr, name, opts), ctx)
        for i, (gname, p, dtype) in enumerate(entries):
            index = _capi.cfx_gradset_add(native.ptr, gname, (None, _check_dtype(dtype),
                                                               tuple(p.shape)))
            assert index == i
        _capi.cfx_gradset_commit(native.ptr)  # MismatchError on every rank names the gradient
        self.fired = [False] * len(entries)
        self._clear = [False] * len(entries)
        self.views = []   # (p, buffer) where the buffer is p.grad
        self.staged = []  # (i, p, buffer) where the buffer is a cast copy of p.grad
        self.hooks = []   # per gradient, what backward calls once it accumulated it
        ptr = native.ptr
        for i, (gname, p, dtype) in enumerate(entries):
            buf = _owned_tensor(native, i, dtype, tuple(p.shape))
            if dtype == p.dtype:
                if p.grad is not None:
                    buf.copy_(p.grad)
                p.grad = buf
                self.views.append((p, buf))
                hook = _view_hook(ptr, i, self.fired, p, buf)
            else:
                self.staged.append((i, p, buf))
                hook = _staged_hook(ptr, i, self.fired, p, buf)
            self.hooks.append(hook)
            handles.append(_after_accumulation(p, hook, nodes))
        self.params = [p for _, p, _ in entries]

    def pending(self):
        return any(self.fired)

    def readopt(self):
        """Gives every parameter whose .grad was replaced (zero_grad(set_to_none=True), ...) its
        buffer back."""
        for p, view in self.views:
            if p.grad is not view:
                _adopt(p, view)

    def wait(self):
        """Ends the step: what the hooks did not mark goes out as it is (zeros after zero_grad),
        then the results are in place."""
        fired = self.fired
        if not all(fired):
            self.readopt()
            for i, p, stage in self.staged:
                if not fired[i]:
                    if p.grad is None:
                        stage.zero_()
                    else:
                        stage.copy_(p.grad)
        fired[:] = self._clear
        _wait(self.native.ptr, -1.0)
        for i, p, stage in self.staged:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.copy_(stage)


def _checked_names(optimizer, named_parameters):
    """named_parameters as a list of (name, parameter), checked as Horovod checks them."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [("allreduce.noname.%s.%s" % (g, i), v)
                            for g, group in enumerate(optimizer.param_groups)
                            for i, v in enumerate(group["params"])]
    if any(not isinstance(p, tuple) for p in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    names = [k for k, _ in named_parameters]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: "
                         "%s" % ", ".join(dups))
    all_ids = {id(v) for group in optimizer.param_groups for v in group["params"]}
    unnamed = all_ids - {id(v) for _, v in named_parameters}
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were "
                         "not named. Python object ids: %s" % ", ".join(str(i) for i in unnamed))
    return named_parameters


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, gradient_storage):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        if op not in (Sum, Average, Min, Max, Product):
            raise ValueError("unknown reduction op %r" % (op,))
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        if gradient_storage not in STORAGES:
            raise ValueError("gradient_storage must be one of %s, not %r"
                             % (", ".join(repr(s) for s in STORAGES), gradient_storage))
        self.op = op
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.gradient_storage = gradient_storage

        named_parameters = _checked_names(self, named_parameters)
        self._parameter_names = {v: k for k, v in named_parameters}
        self.backward_passes_per_step = int(backward_passes_per_step)
        if self.backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1, not %d"
                             % self.backward_passes_per_step)
        self._sets = []            # committed gradient sets (_GradSet)
        self._set_params = set()   # the parameters they hold
        self._hook_handles = []    # every hook registered, to remove them with the optimizer
        self._grad_accs = []       # torch < 2.1: the AccumulateGrad nodes the hooks hang on
        # The per-call path: p -> (handle, (compressed, ctx)) of this step, passes left per p.
        self._handles = {}
        self._allreduce_delay = {}
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        weakref.finalize(self, _remove_hooks, self._hook_handles)
        self._distributed = size() > 1
        if self._distributed:
            self._register([p for group in self.param_groups for p in group["params"]])

    # ---- registration ----
    def _scales(self):
        if self.op == Average:  # the engine divides by size() on top of the postscale
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _set_dtype(self, p):
        """The dtype of p's buffer in a gradient set, or None for the per-call path."""
        if self.gradient_storage != "conflux" or p.device.type != "cpu" or \
                p.layout != torch.strided:
            return None
        if self._compression is NoneCompressor:
            return p.dtype
        if self._compression is FP16Compressor:
            return torch.float16 if p.dtype.is_floating_point else p.dtype
        return None

    def _register(self, params):
        """Registers `params` (those that need a gradient and are not registered yet): one new
        gradient set, committed (collective), for those it can hold; hooks for the others."""
        todo = [p for p in params if p.requires_grad and p not in self._set_params
                and p not in self._requires_update]
        entries = []
        for p in todo:
            dtype = self._set_dtype(p)
            if dtype is None:
                self._requires_update.add(p)
                self._allreduce_delay[p] = self.backward_passes_per_step
                self._hook_handles.append(_after_accumulation(p, self._make_hook(p),
                                                              self._grad_accs))
            else:
                entries.append((self._parameter_names[p], p, dtype))
        if entries:
            pre, post = self._scales()
            name = "conflux.torch.DistributedOptimizer.%d" % next(_set_names)
            s = _GradSet(name, entries, self.op, pre, post, self.backward_passes_per_step,
                         self._hook_handles, self._grad_accs)
            self._sets.append(s)
            self._set_params.update(s.params)

    def add_param_group(self, param_group):
        super(self.__class__, self).add_param_group(param_group)
        if getattr(self, "_distributed", False):  # not while the base class's __init__ runs
            g = len(self.param_groups) - 1
            for i, p in enumerate(self.param_groups[g]["params"]):
                self._parameter_names.setdefault(p, "allreduce.noname.%s.%s" % (g, i))
            self._register(self.param_groups[g]["params"])

    def set_backward_passes_per_step(self, passes):
        """Changes backward_passes_per_step. The gradient sets are committed anew (collective:
        every rank calls it), with the gradients they hold."""
        passes = int(passes)
        if passes < 1:
            raise ValueError("backward_passes_per_step must be at least 1, not %d" % passes)
        self._check_idle("set_backward_passes_per_step()")
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes
        if self._sets:
            params = [p for s in self._sets for p in s.params]
            for s in self._sets:
                s.readopt()
            _remove_hooks(self._hook_handles)
            del self._grad_accs[:]
            self._sets, self._set_params = [], set()
            percall = self._requires_update
            self._requires_update = set()
            self._register(params)
            for p in percall:  # their hooks went with the others'
                self._requires_update.add(p)
                self._hook_handles.append(_after_accumulation(p, self._make_hook(p),
                                                              self._grad_accs))

    # ---- the per-call path ----
    def _allreduce_grad_async(self, p):
        if p.grad is None:
            # Not produced on this rank (dynamic graphs); other ranks may have it: send zeros.
            p.grad = torch.zeros_like(p)
        name = self._parameter_names.get(p)
        prescale, postscale = self._scales()
        compressed, ctx = self._compression.compress(p.grad)
        if not compressed.is_contiguous():
            compressed = compressed.contiguous()
        handle = allreduce_async_(compressed, op=self.op, name=name, prescale_factor=prescale,
                                  postscale_factor=postscale)
        return handle, (compressed, ctx)

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
        for p, (handle, (compressed, cctx)) in self._handles.items():
            try:
                output = handle.wait()
            except Exception as exc:  # wait for the rest before raising
                errors.append(exc)
                continue
            self._allreduce_delay[p] = self.backward_passes_per_step
            result = self._compression.decompress(output, cctx)
            if result.data_ptr() != p.grad.data_ptr():
                p.grad.copy_(result)
        self._handles.clear()

    # ---- the step ----
    def synchronize(self):
        """Waits until every gradient is reduced (the gradient sets' waits; per-call allreduces,
        starting those whose hooks did not fire)."""
        if not self._distributed:
            self._synchronized = True
            return
        self._start_missing()
        errors = []
        for s in self._sets:
            try:
                s.wait()
            except Exception as exc:  # wait for the rest before raising
                errors.append(exc)
        self._wait_per_call(errors)
        self._synchronized = True
        if errors:
            for p in self._allreduce_delay:
                self._allreduce_delay[p] = self.backward_passes_per_step
            raise errors[0]

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside this block step() does not synchronize (call synchronize() yourself first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called after optimizer.synchronize() without a new "
                              "backward pass: the gradients are allreduced again. Use `with "
                              "optimizer.skip_synchronize(): optimizer.step()` after synchronize().")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def _check_idle(self, what):
        if self._handles or any(s.pending() for s in self._sets):
            raise AssertionError("optimizer.%s was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited as "
                                 "it can cause a race condition." % what)

    def zero_grad(self, *args, **kwargs):
        self._check_idle("zero_grad()")
        result = super(self.__class__, self).zero_grad(*args, **kwargs)
        for s in self._sets:  # set_to_none dropped the views: they come back, zeroed
            s.readopt()
        return result


def DistributedOptimizer(optimizer, named_parameters=None, compression=NoneCompressor,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         gradient_storage="conflux", shared_gradients=None):
    """Wraps a torch optimizer: its gradients are reduced over the ranks (op, Average by
    default) as backward produces them, and step() waits for them before updating. Returns an
    instance of a subclass of the optimizer's class. Construction is collective: the parameters
    are registered in a gradient set (named after named_parameters; ranks may list them in any
    order, but must register the same names, dtypes and shapes, else MismatchError naming the
    gradient), and so is a later add_param_group().
    gradient_storage="conflux" (the default): every CPU parameter's .grad is a view into the
    set's storage in shared tensor memory, kept across zero_grad() (set_to_none=True puts it back
    zeroed), so the reductions run in place without copies. "framework": the gradients stay in
    torch's own memory, each reduced by its own allreduce (as are CUDA parameters, and every
    gradient under a compressor other than Compression.none or Compression.fp16).
    shared_gradients is the older spelling (True: "conflux", False: "framework")."""
    if shared_gradients is not None:
        warnings.warn("DistributedOptimizer(shared_gradients=...) is now gradient_storage="
                      "'conflux' (the default) or 'framework'", DeprecationWarning)
        gradient_storage = "conflux" if shared_gradients else "framework"
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    wrapped = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
                  gradient_predivide_factor, gradient_storage)
    wrapped.defaults = optimizer.defaults  # for add_param_group (the class's own are placeholders)
    return wrapped

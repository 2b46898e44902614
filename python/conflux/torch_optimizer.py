"""conflux.torch.DistributedOptimizer over gradient sets (docs/c-api.md "Gradient sets").

Construction registers every parameter that needs a gradient in a gradient set, named after
named_parameters (ranks may register in different orders), and commits it: collective, every
rank's names, dtypes and shapes checked. With the default storage ("conflux") each CPU parameter's
.grad becomes a view into the set's owned storage (shared tensor memory laid out by bucket), so
backward accumulates straight into the buffers the engine reduces in place. A hook that runs once
backward accumulated a gradient marks it ready: in C++ where the build has conflux._torch_native
(bindings/python/torch_native.cpp, no Python per gradient), else a Python hook calling the SWIG
entry itself; a bucket goes out when its last gradient is ready, while backward goes on; step() and
synchronize() wait for the set. The views stay across zero_grad(), also with set_to_none=True.

What a gradient set cannot carry goes through the per-call path (an allreduce_async_ per
gradient from the same hooks, as before gradient sets): every parameter with
gradient_storage="framework", CUDA parameters (owned storage is host memory), and compressors
of one's own. Compression.fp16 (or a conflux.Compression) is the sets' wire compression: the
float32/float64 gradients in a set with it, the others in a set without.

process_set= reduces over a process set's ranks: the sets live on its subset context and the
per-call allreduces are its collectives; a rank outside the set reduces nothing (the optimizer
is the one it wraps). conflux.horovod.torch's DistributedOptimizer is this class with Horovod's
differences (sparse gradients, Horovod's process sets, errors and warning texts).

op=Adasum with more than one rank is _AdasumOptimizer instead, Horovod's Adasum optimizer: the
local update's delta of each parameter is what Adasum combines.
"""
import contextlib
import functools
import itertools
import math
import warnings
import weakref

import numpy as np
import torch

from . import _capi
from . import _core
from . import torch as _cfx
from .gradset import _Native, _View
from .torch import (FP16Compressor, NoneCompressor, Adasum, Average, Max, Min, Product, Sum,
                    _check_dtype, _compressible, allreduce_async_, size)

from .torch import _torch_native  # the hooks in C++ where the build has them, else None

STORAGES = ("conflux", "framework")
_set_serials = weakref.WeakKeyDictionary()  # context -> the numbers of its optimizers' sets
_ready = _capi._capi_native.cfx_gradset_ready  # the C wrapper itself: the hooks' only call
_wait = _capi.cfx_py_gradset_wait


def _too_many_passes(exc):
    return AssertionError("Gradients were computed more than backward_passes_per_step times before "
                          "call to step(). Increase backward_passes_per_step to accumulate "
                          "gradients locally. (%s)" % exc)


def _set_name(prefix, ctx):
    """The next gradient-set name on `ctx`. Every rank of a context makes its optimizers' sets in
    the same order, so the names agree; a process set's ranks count their own."""
    serial = _set_serials.get(ctx)
    if serial is None:
        serial = _set_serials[ctx] = itertools.count()
    return "%s.%d" % (prefix, next(serial))


def _adopt(p, view):
    """Makes `view` p's gradient again, holding what p.grad held (zeros for None; a sparse
    gradient, backward's own when p.grad was None, is added to zeros)."""
    g = p.grad
    if g is None:
        view.zero_()
    elif g.is_sparse:
        view.zero_().add_(g)
    else:
        view.copy_(g)
    p.grad = view


def _refused(status, message):
    """What a gradient set's hook raises when cfx_gradset_ready refuses: the engine's error, and
    Horovod's AssertionError for a pass too many (InvalidArgumentError). The C++ hooks call it too,
    so both kinds raise the same from backward()."""
    try:
        _core.raise_status(status, message)
    except _core.InvalidArgumentError as exc:
        raise _too_many_passes(exc) from exc


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


class _PythonHooks:
    """A set's hooks in Python, where conflux._torch_native is not built, with its Hooks' interface:
    fire(i) / fire_all() (last first) run them as backward does, fired() / fired_any() /
    fired_all() / clear() tell and reset which ran this step, remove() takes them off."""

    def __init__(self, ptr, params, views, nodes):
        self._fired = [False] * len(params)
        self._clear = [False] * len(params)  # reset without allocating per step
        self._hooks = [_view_hook(ptr, i, self._fired, p, view)
                       for i, (p, view) in enumerate(zip(params, views))]
        self._handles = [_after_accumulation(p, hook, nodes) for p, hook in zip(params, self._hooks)]

    def fire(self, i):
        self._hooks[i]()

    def fire_all(self):
        for hook in reversed(self._hooks):
            hook()

    def fired(self):
        return list(self._fired)

    def fired_any(self):
        return any(self._fired)

    def fired_all(self):
        return all(self._fired)

    def clear(self):
        self._fired[:] = self._clear

    def remove(self):
        _remove_hooks(self._handles)


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
    """One committed gradient set of an optimizer. entries: (name, parameter); each parameter's
    buffer in the set's storage becomes its .grad."""

    def __init__(self, ctx, name, entries, op, prescale, postscale, passes, compression,
                 error_feedback, handles, nodes):
        opts = _capi.cfx_gradset_options()
        _capi.cfx_gradset_options_init(opts, _capi.CFX_GRADSET_OPTIONS_VERSION)
        opts.op = op
        opts.prescale = prescale
        opts.postscale = postscale
        opts.accumulate_steps = passes
        opts.compression = compression
        opts.error_feedback = error_feedback
        self.name = name
        self.compression = compression
        self.native = native = _Native(_capi.cfx_gradset_create(ctx.ptr, name, opts), ctx)
        for i, (gname, p) in enumerate(entries):
            index = _capi.cfx_gradset_add(native.ptr, gname, (None, _check_dtype(p.dtype),
                                                               tuple(p.shape)))
            assert index == i
        _capi.cfx_gradset_commit(native.ptr)  # MismatchError on every rank names the gradient
        self.views = []   # (p, buffer): the buffer is p.grad
        ptr = native.ptr
        for i, (gname, p) in enumerate(entries):
            buf = _owned_tensor(native, i, p.dtype, tuple(p.shape))
            if p.grad is not None:
                buf.copy_(p.grad)
            p.grad = buf
            self.views.append((p, buf))
        self.params = [p for _, p in entries]
        # C++ hooks where the build has them: what the Python hooks do, without the interpreter.
        views = [buf for _, buf in self.views]
        self._hooks = (_torch_native.Hooks(int(ptr), self.params, views, _refused)
                       if _torch_native is not None else
                       _PythonHooks(ptr, self.params, views, nodes))
        handles.append(self._hooks)  # .remove() takes them off
        # per gradient, what backward calls once it accumulated it
        self.hooks = [functools.partial(self._hooks.fire, i) for i in range(len(entries))]

    @property
    def native_hooks(self):
        """The C++ hooks, or None where the set's hooks are Python ones."""
        return None if isinstance(self._hooks, _PythonHooks) else self._hooks

    @property
    def fired(self):
        """Per gradient, whether its hook ran this step."""
        return self._hooks.fired()

    def fire_all(self):
        """Every hook once, last gradient first, as backward runs them (benchmarks)."""
        self._hooks.fire_all()

    def pending(self):
        return self._hooks.fired_any()

    def readopt(self):
        """Gives every parameter whose .grad was replaced (zero_grad(set_to_none=True), ...) its
        buffer back."""
        for p, view in self.views:
            if p.grad is not view:
                _adopt(p, view)

    def wait(self):
        """Ends the step: what the hooks did not mark goes out as it is (zeros after zero_grad),
        then the results are in place."""
        if not self._hooks.fired_all():
            self.readopt()
        self._hooks.clear()
        _wait(self.native.ptr, -1.0)


def _compression_plan(compression):
    """(wire, compressor) for an optimizer's `compression`: `wire` is the cfx_compression it names
    (Compression.none and Compression.fp16 of conflux.torch: none and fp16; a conflux.Compression
    value or the engine's int: itself), None for a compressor of one's own; `compressor` is what
    applies where the engine does not compress (Compression.fp16: Horovod's cast to float16; a
    conflux.Compression value: nothing; one's own: itself, everywhere)."""
    try:
        wire = _core.check_compression(compression)
    except TypeError:
        if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
            raise TypeError("compression must be a conflux.Compression, Compression.none, "
                            "Compression.fp16 or a Compressor (compress() and decompress()), "
                            "not %r" % (compression,)) from None
        return None, compression
    try:
        wire = _core.Compression(wire)
    except ValueError:
        raise ValueError("compression %r is not a conflux.Compression (none, fp16, bf16, "
                         "fp16_everywhere, bf16_everywhere)" % (compression,)) from None
    return wire, (FP16Compressor if compression is FP16Compressor else NoneCompressor)


def _checked_passes(passes):
    """backward_passes_per_step as an int >= 1."""
    passes = int(passes)
    if passes < 1:
        raise ValueError("backward_passes_per_step must be at least 1, not %d" % passes)
    return passes


def _idle_zero_grad(self, *args, **kwargs):
    """zero_grad() of an optimizer whose started allreduces are self._handles: refused while
    there are some, as Horovod does."""
    if self._handles:
        raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                             "optimizer.step() or optimizer.synchronize(). This is prohibited as "
                             "it can cause a race condition.")
    return super(self.__class__, self).zero_grad(*args, **kwargs)


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


def _place(process_set):
    """(context, torch collectives, included, number of ranks) of the ranks an optimizer reduces
    over: the job's (process_set None), or a conflux.ProcessSet's (conflux.torch.ProcessSet or
    the NumPy one; outside it: (None, None, False, its size))."""
    if process_set is None:
        return _core.current(), _cfx, True, size()
    subset = getattr(process_set, "_subset", None)
    if subset is None:
        raise TypeError("process_set must be a conflux.torch.ProcessSet or a conflux.ProcessSet, "
                        "not %s" % type(process_set).__name__)
    if not subset.included():
        return None, None, False, subset.size()
    from .torch_process_sets import ProcessSet, differentiable_collectives
    ops = process_set if isinstance(process_set, ProcessSet) else \
        differentiable_collectives(subset.submit, subset.rank, subset.size, "conflux.torch")
    return subset.context(), ops, True, subset.size()


class _DistributedOptimizer(torch.optim.Optimizer):
    # What conflux.horovod.torch's optimizer replaces: its sets' names, how it finds its ranks,
    # waits (its errors), takes a per-call result, and the warning of step() after synchronize().
    _SET_PREFIX = "conflux.torch.DistributedOptimizer"
    _place = staticmethod(_place)
    _wait_handle = staticmethod(_core.Handle.wait)
    _wait_set = staticmethod(_GradSet.wait)
    _AFTER_SYNC = ("optimizer.step() called after optimizer.synchronize() without a new backward "
                   "pass: the gradients are allreduced again. Use `with "
                   "optimizer.skip_synchronize(): optimizer.step()` after synchronize().")

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, gradient_storage, error_feedback=False,
                 process_set=None):
        super(self.__class__, self).__init__(params)
        self._wire, self._compression = _compression_plan(compression)
        self._error_feedback = 1 if error_feedback else 0
        if error_feedback and not self._wire:
            raise ValueError("error_feedback needs a compression that the engine applies "
                             "(Compression.fp16 or a conflux.Compression other than none), "
                             "not %r" % (compression,))
        # Adasum only without ranks to combine (DistributedOptimizer takes _AdasumOptimizer else).
        if op not in (Sum, Average, Min, Max, Product, Adasum):
            raise ValueError("unknown reduction op %r" % (op,))
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        if gradient_storage not in STORAGES:
            raise ValueError("gradient_storage must be one of %s, not %r"
                             % (", ".join(repr(s) for s in STORAGES), gradient_storage))
        self.op = op
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.gradient_storage = gradient_storage
        self.process_set = process_set

        self._parameter_names = {v: k for k, v in _checked_names(self, named_parameters)}
        self.backward_passes_per_step = _checked_passes(backward_passes_per_step)
        self._sets = []            # committed gradient sets (_GradSet)
        self._set_params = set()   # the parameters they hold
        self._hook_handles = []    # every hook registered, to remove them with the optimizer
        self._grad_accs = []       # torch < 2.1: the AccumulateGrad nodes the hooks hang on
        # The per-call path: p -> (handle, (sent tensor, ctx, compressor)) of this step, passes
        # left per p.
        self._handles = {}
        self._allreduce_delay = {}
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        weakref.finalize(self, _remove_hooks, self._hook_handles)
        # A rank outside the process set reduces nothing: its optimizer is the one it wraps.
        self._ctx, self._ops, self._included, nranks = self._place(process_set)
        self._distributed = self._included and nranks > 1
        if self._distributed:
            self._register([p for group in self.param_groups for p in group["params"]])

    # ---- registration ----
    def _scales(self):
        if self.op == Average:  # the engine divides by the number of ranks on top of the postscale
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _set_compression(self, p):
        """The compression of the gradient set that holds p's gradient, or None for the per-call
        path. A set with compression holds float32 and float64 gradients only: the others go in
        a set without (16-bit gradients travel as they are)."""
        if self.gradient_storage != "conflux" or self._wire is None or p.device.type != "cpu" \
                or p.layout != torch.strided:
            return None
        return self._wire if _compressible(p) else _core.Compression.none

    def _add_per_call(self, p):
        """p's gradient goes through the per-call path: an allreduce from its hook."""
        self._requires_update.add(p)
        self._allreduce_delay[p] = self.backward_passes_per_step
        self._hook_handles.append(_after_accumulation(p, self._make_hook(p), self._grad_accs))

    def _register(self, params):
        """Registers `params` (those that need a gradient and are not registered yet): a new
        gradient set per compression, committed (collective), for those sets can hold; hooks for
        the others."""
        todo = [p for p in params if p.requires_grad and p not in self._set_params
                and p not in self._requires_update]
        entries = {}  # compression -> [(name, p)]
        for p in todo:
            compression = self._set_compression(p)
            if compression is None:
                self._add_per_call(p)
            else:
                entries.setdefault(compression, []).append((self._parameter_names[p], p))
        pre, post = self._scales()
        for compression in sorted(entries):  # the same sets in the same order on every rank
            s = _GradSet(self._ctx, _set_name(self._SET_PREFIX, self._ctx), entries[compression],
                         self.op, pre, post, self.backward_passes_per_step, compression,
                         self._error_feedback if compression else 0, self._hook_handles,
                         self._grad_accs)
            self._sets.append(s)
            self._set_params.update(s.params)

    def _rebuild(self, leave=()):
        """Commits the gradient sets anew (collective: every rank calls it alike) with the
        gradients they hold but those in `leave`, which go through the per-call path from now on
        (their .grad becomes a copy of what their buffer holds)."""
        leave = set(leave)
        params = [p for s in self._sets for p in s.params if p not in leave]
        for s in self._sets:
            s.readopt()
        for s in self._sets:
            for p in s.params:
                if p in leave:
                    p.grad = p.grad.clone()
        _remove_hooks(self._hook_handles)
        del self._grad_accs[:]
        self._sets, self._set_params = [], set()
        per_call = [p for p in self._parameter_names if p in self._requires_update or p in leave]
        self._requires_update = set()
        self._register(params)
        for p in per_call:  # their hooks went with the others'
            self._add_per_call(p)

    def add_param_group(self, param_group):
        super(self.__class__, self).add_param_group(param_group)
        if getattr(self, "_distributed", False):  # not while the base class's __init__ runs
            g = len(self.param_groups) - 1
            for i, p in enumerate(self.param_groups[g]["params"]):
                self._parameter_names.setdefault(p, "allreduce.noname.%s.%s" % (g, i))
            self._register(self.param_groups[g]["params"])

    def set_backward_passes_per_step(self, passes):
        """Changes backward_passes_per_step. A new value commits the gradient sets anew
        (collective: every rank calls it), with the gradients they hold."""
        passes = _checked_passes(passes)
        if passes != self.backward_passes_per_step and self._sets:
            self._check_idle("set_backward_passes_per_step()")
            self.backward_passes_per_step = passes
            self._rebuild()
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    # ---- the per-call path ----
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

    @staticmethod
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
                self._wait_set(s)
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
                warnings.warn(self._AFTER_SYNC)
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

    _make_hook = _DistributedOptimizer._make_hook  # the delays and handles work the same

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


def DistributedOptimizer(optimizer, named_parameters=None, compression=NoneCompressor,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         gradient_storage="conflux", shared_gradients=None, error_feedback=False,
                         process_set=None):
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
                  gradient_predivide_factor, gradient_storage, error_feedback, process_set)
    wrapped.defaults = optimizer.defaults  # for add_param_group (the class's own are placeholders)
    return wrapped

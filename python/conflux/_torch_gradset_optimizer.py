"""conflux.torch's DistributedOptimizer over gradient sets (docs/c-api.md "Gradient sets"): the
sets (_GradSet), their readiness hooks, and the optimizer class (_DistributedOptimizer) that
registers the gradients, commits the sets, and waits for them and for the per-call path in
synchronize() and step(). conflux.torch_optimizer.DistributedOptimizer makes it;
conflux.horovod.torch's optimizer is it with Horovod's differences.

Construction registers every parameter that needs a gradient in a gradient set, named after
named_parameters (ranks may register in different orders), and commits it: collective, every
rank's names, dtypes and shapes checked. With the default storage ("conflux") each CPU parameter's
.grad becomes a view into the set's owned storage (shared tensor memory laid out by bucket), so
backward accumulates straight into the buffers the engine reduces in place. A hook that runs once
backward accumulated a gradient marks it ready: in C++ where the build has conflux._torch_native
(bindings/python/torch_native.cpp, no Python per gradient), else a Python hook calling the SWIG
entry itself; a bucket goes out when its last gradient is ready, while backward goes on; step() and
synchronize() wait for the set. zero_grad(set_to_none=False) zeroes the views in place;
zero_grad() (set_to_none=True, torch's default) sets .grad to None as torch does, and the hook
copies backward's gradient into the view (one pass over the bytes, where zeroing the view and
adding to it would take two).

What a gradient set cannot carry goes through the per-call path (conflux._torch_optimizer_hooks):
every parameter with gradient_storage="framework", CUDA parameters (owned storage is host memory),
and compressors of one's own. Compression.fp16 (or a conflux.Compression) is the sets' wire
compression: the float32/float64 gradients in a set with it, the others in a set without.

process_set= reduces over a process set's ranks: the sets live on its subset context and the
per-call allreduces are its collectives; a rank outside the set reduces nothing (the optimizer
is the one it wraps).
"""
import contextlib
import functools
import itertools
import math
import warnings
import weakref

import numpy as np
import torch

from . import _args
from . import _capi
from . import _core
from . import _torch_collectives
from ._core import Adasum, Average, Max, Min, Product, Sum, size
from ._torch_adapter import _check_dtype
from ._torch_collectives import _torch_native  # the hooks in C++ where built, else None
from ._torch_compression import _compressible
from ._torch_optimizer_args import _checked_names, _checked_passes, _compression_plan
from ._torch_optimizer_hooks import (
    _add_per_call, _after_accumulation, _allreduce_grad_async, _dense_allreduce, _make_hook,
    _remove_hooks, _start_missing, _take, _too_many_passes, _wait_per_call)
from .gradset import _Native, _View
from .torch_process_sets import ProcessSet, differentiable_collectives

STORAGES = ("conflux", "framework")
_set_serials = weakref.WeakKeyDictionary()  # context -> (its world, the numbers of its sets)
_ready = _capi._capi_native.cfx_gradset_ready  # the C wrapper itself: the hooks' only call
_wait = _capi.cfx_py_gradset_wait


def _set_name(prefix, ctx):
    """The next gradient-set name on `ctx`. Every rank of a context makes its optimizers' sets in
    the same order, so the names agree; a process set's ranks count their own. Every world of an
    elastic context counts from 0, as a newcomer's first does."""
    world, serial = _set_serials.get(ctx, (None, None))
    if world != getattr(ctx, "world", 0):
        world, serial = _set_serials[ctx] = (getattr(ctx, "world", 0), itertools.count())
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
                 error_feedback, handles, nodes, bucket_bytes=0):
        opts = _capi.cfx_gradset_options()
        _capi.cfx_gradset_options_init(opts, _capi.CFX_GRADSET_OPTIONS_VERSION)
        opts.op = op
        opts.prescale = prescale
        opts.postscale = postscale
        opts.accumulate_steps = passes
        opts.compression = compression
        opts.error_feedback = error_feedback
        opts.bucket_bytes = bucket_bytes
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


def _place(process_set):
    """(context, torch collectives, included, number of ranks) of the ranks an optimizer reduces
    over: the job's (process_set None), or a conflux.ProcessSet's (conflux.torch.ProcessSet or
    the NumPy one; outside it: (None, None, False, its size))."""
    if process_set is None:
        return _core.current(), _torch_collectives, True, size()
    subset = getattr(process_set, "_subset", None)
    if subset is None:
        raise TypeError("process_set must be a conflux.torch.ProcessSet or a conflux.ProcessSet, "
                        "not %s" % type(process_set).__name__)
    if not subset.included():
        return None, None, False, subset.size()
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
                 process_set=None, bucket_bytes=0):
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
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 0:
            raise ValueError("bucket_bytes must be an int >= 0 (0: the engine's bucket size), not %r"
                             % (bucket_bytes,))
        self._bucket_bytes = bucket_bytes

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
        _core.on_reform(self)

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
        return self._wire if _compressible(p) else _args.Compression.none

    # ---- the per-call path (conflux._torch_optimizer_hooks) ----
    _add_per_call = _add_per_call
    _allreduce_grad_async = _allreduce_grad_async
    _dense_allreduce = _dense_allreduce
    _take = staticmethod(_take)
    _make_hook = _make_hook
    _start_missing = _start_missing
    _wait_per_call = _wait_per_call

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
                         self._grad_accs, self._bucket_bytes)
            self._sets.append(s)
            self._set_params.update(s.params)

    def _rebuild(self, leave=()):
        """Commits the gradient sets anew (collective: every rank calls it alike) with the
        gradients they hold but those in `leave`, which go through the per-call path from now on
        (their .grad becomes a copy of what their buffer holds)."""
        leave = set(leave)
        params = [p for s in self._sets for p in s.params if p not in leave]
        per_call = [p for p in self._parameter_names if p in self._requires_update or p in leave]
        self._drop_sets(leave)
        self._register(params)
        for p in per_call:  # their hooks went with the others'
            self._add_per_call(p)

    def _drop_sets(self, copied):
        """Ends the gradient sets and every hook: each parameter gets its buffer back as .grad,
        those in `copied` a copy of it (their set's storage goes with the set)."""
        for s in self._sets:
            s.readopt()
            for p in s.params:
                if p in copied:
                    p.grad = p.grad.clone()
        _remove_hooks(self._hook_handles)
        del self._grad_accs[:]
        self._sets, self._set_params, self._requires_update = [], set(), set()

    def _world_reformed(self):
        """The elastic world was formed again (conflux.reform, hvd.elastic's reset): this step's
        work died with the old world, and the gradient sets belonged to it. The optimizer starts
        over in the new world as a newcomer's does at construction: every parameter registered
        afresh, its sets committed (collective: every survivor does this in the same place, right
        after the round, where a newcomer commits its first)."""
        self._drop_sets(self._set_params)  # the .grads leave the old sets' storage
        self._handles.clear()
        self._allreduce_delay.clear()
        self._synchronized = False
        self._ctx, self._ops, self._included, nranks = self._place(self.process_set)
        self._distributed = self._included and nranks > 1
        if self._distributed:
            self._register([p for group in self.param_groups for p in group["params"]])

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
        # set_to_none leaves .grad None, as torch does: the hook then copies backward's gradient
        # into the view (or step() zeroes the view of one backward did not produce).
        return super(self.__class__, self).zero_grad(*args, **kwargs)


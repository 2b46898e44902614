"""Conflux for JAX: collectives on jax.Arrays that work eagerly and inside jax.jit, through XLA FFI
handlers that call Conflux's C ABI (bindings/jax/jax_ffi.cpp), and an optax transformation that
averages gradients.

    import jax, optax, conflux.jax as cfx
    cfx.init()
    params = cfx.broadcast_parameters(params, root_rank=0)
    tx = cfx.DistributedOptimizer(optax.sgd(0.1))          # allreduce_gradients(), then sgd
    @jax.jit
    def step(params, opt_state, batch):
        grads = jax.grad(loss)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

Every collective carries one ordered effect: calls run in program order, inside a jitted function
and across calls, so unnamed collectives pair up across ranks as they do in the NumPy API. Static
shapes inside jit: allgather wants the same dim 0 on every rank and alltoall equal splits there;
outside jit both take ragged inputs (through conflux's NumPy path). Inside jit allreduce,
grouped_allreduce and broadcast put their results in their inputs' buffers (a gradient is reduced
in place; XLA copies an input that lives on). ProcessSet(ranks) runs the same collectives over
some of the job's ranks. CPU arrays only. docs/jax.md.
"""
import numpy as _np

import jax
import jax.numpy as jnp
from jax.core import ShapedArray

from . import _args
from . import _core
from . import _numpy
from . import _jax_primitive as _jax_ffi
from ._jax_args import (
    _aval, _check, _elementwise_batch, _in_place, _is_tracer, _label, _name_attrs)
from . import process_sets as _process_sets
from ._core import (  # noqa: F401  (re-exported)
    Adasum, Average, Compression, Max, Min, Product, Sum, DtypeError, ConfluxError,
    is_initialized, rank, size, local_rank, local_size, cross_rank, cross_size,
)

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
    "barrier", "broadcast_parameters", "allreduce_gradients", "DistributedOptimizer",
    "ProcessSet", "JaxState", "run", "engine_error",
    "Sum", "Average", "Min", "Max", "Product", "Adasum", "Compression", "DtypeError",
    "ConfluxError",
]

_REDUCE_LINEAR = (Sum, Average)


# ---- the job ----
def init(**options):
    """Joins the job (conflux.init, same options) and points the FFI handlers at its context.
    Raises ImportError naming the reason when the handlers were not built."""
    if _jax_ffi.UNAVAILABLE:
        raise ImportError("conflux.jax: " + _jax_ffi.UNAVAILABLE)
    _core.init(**options)
    _jax_ffi.set_context(_core.current().address)


def shutdown():
    """Waits for the collectives JAX has in flight, then shuts Conflux down."""
    try:
        jax.effects_barrier()
    finally:
        _jax_ffi.set_context(0)
        _core.shutdown()


class _Reformed:
    """After a membership change (conflux.reform), JAX's compiled programs go: their collectives'
    static shapes were traced at the old size() (an allgather's result is size() times dim 0, a
    reducescatter's rows and a broadcast's gradient depend on rank() and size()). Every jitted
    function traces again in the new world, once."""

    def _world_reformed(self):
        jax.clear_caches()


_REFORMED = _Reformed()  # conflux._core holds its listeners weakly
_core.on_reform(_REFORMED)


def _at_exit():
    # Before conflux._core's own atexit frees the context (atexit runs in reverse order).
    _jax_ffi.set_context(0)


import atexit as _atexit  # noqa: E402
_atexit.register(_at_exit)


# ---- the ranks a collective runs over: the job's, or a process set's ----
class _Group:
    """Where a collective runs: `number` is the handlers' attribute "set" (0: the job's context,
    else a conflux.jax.ProcessSet's, which the library maps to its subset context); rank() and
    size() are this rank's within it (static shapes and gradients inside jit depend on them);
    `numpy` has the NumPy path's allgather and alltoall for ragged arrays outside jit; `what`
    starts messages ("conflux.jax", "conflux.jax.ProcessSet([0, 2])")."""

    def __init__(self, number, rank_fn, size_fn, numpy_fn, what, check=None):
        self.number, self.rank, self.size = number, rank_fn, size_fn
        self._numpy, self.what, self._check = numpy_fn, what, check

    def numpy(self):
        return self._numpy()

    def attrs(self):
        """The attribute that says where to run, after checking that this rank may."""
        if self._check is not None:
            self._check()
        return (("set", self.number),)


def _numpy_world():
    import conflux
    return conflux


_WORLD = _Group(0, rank, size, _numpy_world, "conflux.jax")


# ---- allreduce / grouped allreduce ----
def _allreduce_raw(xs, op, name, pre, post, compression, labels, grp):
    attrs = (("op", int(op)), ("prescale", float(pre)), ("postscale", float(post)),
             ("compression", int(compression))) + _name_attrs(name, labels) + grp.attrs()
    return _jax_ffi.bind("allreduce", xs, [_aval(x) for x in xs], attrs, _elementwise_batch,
                         _in_place(len(xs)))


def _make_allreduce(op, name, pre, post, compression, labels, grp):
    """The allreduce of a list of arrays, differentiable for Sum and Average: its cotangent is
    the same allreduce of the cotangents (the gradient of the sum over ranks of each rank's loss,
    as conflux.torch and Horovod define it)."""
    def raw(xs):
        return _allreduce_raw(xs, op, name, pre, post, compression, labels, grp)

    if op not in _REDUCE_LINEAR:
        return raw

    @jax.custom_vjp
    def f(xs):
        return raw(xs)

    def fwd(xs):
        return raw(xs), None

    def bwd(_, cts):
        cts = [jnp.zeros(c.shape, c.dtype) if c is None else c for c in cts]
        return (_allreduce_raw(cts, op, None, pre, post, compression, labels + " (gradient)",
                               grp),)

    f.defvjp(fwd, bwd)
    return f


def _allreduce(grp, x, op, name, prescale_factor, postscale_factor, compression):
    op = _args.check_op(op)
    x = _check(x, "allreduce", name)
    pre = _args.check_scale(prescale_factor, "prescale_factor")
    post = _args.check_scale(postscale_factor, "postscale_factor")
    comp = _args.check_compression(compression)
    return _make_allreduce(op, name, pre, post, comp, _label(x, name), grp)([x])[0]


def allreduce(x, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
              compression=None):
    """The reduction of `x` over ranks (Average by default): postscale * op(prescale * x_r).
    Differentiable for Sum and Average; vmap-able. `compression` is a conflux.Compression (or its
    name) for float32/float64 arrays."""
    return _allreduce(_WORLD, x, op, name, prescale_factor, postscale_factor, compression)


def _grouped_allreduce(grp, tree, op, name, prescale_factor, postscale_factor, compression):
    op = _args.check_op(op)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if not leaves:
        return tree
    leaves = [_check(x, "grouped_allreduce", "%s[%d]" % (name or "tree", i))
              for i, x in enumerate(leaves)]
    pre = _args.check_scale(prescale_factor, "prescale_factor")
    post = _args.check_scale(postscale_factor, "postscale_factor")
    comp = _args.check_compression(compression)
    label = "%s (%d arrays)" % (repr(name) if name else "a pytree", len(leaves))
    out = _make_allreduce(op, name, pre, post, comp, label, grp)(leaves)
    return jax.tree_util.tree_unflatten(treedef, list(out))


def grouped_allreduce(tree, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                      compression=None):
    """allreduce of every array of a pytree (or list) in one submission (cfx_grouped_allreduce:
    negotiated, fused and completed together). Returns the same structure."""
    return _grouped_allreduce(_WORLD, tree, op, name, prescale_factor, postscale_factor,
                              compression)


# ---- broadcast ----
def _broadcast_raw(x, root, name, label, grp):
    attrs = (("root", int(root)),) + _name_attrs(name, label) + grp.attrs()
    return _jax_ffi.bind("broadcast", [x], [_aval(x)], attrs, _elementwise_batch,
                         _in_place(1))[0]


def _check_root(grp, root_rank):
    root = _args.check_root(root_rank)
    if grp is not _WORLD and not 0 <= root < grp.size():
        raise ValueError("%s: root_rank %d is not a rank of the set (0 .. %d)"
                         % (grp.what, root, grp.size() - 1))
    return root


def _broadcast(grp, x, root_rank, name):
    root = _check_root(grp, root_rank)
    x = _check(x, "broadcast", name)
    label = _label(x, name)

    @jax.custom_vjp
    def f(v):
        return _broadcast_raw(v, root, name, label, grp)

    def fwd(v):
        return f(v), None

    def bwd(_, ct):
        s = _allreduce_raw([ct], Sum, None, 1.0, 1.0, 0, label + " (gradient)", grp)[0]
        return (jnp.where(grp.rank() == root, s, jnp.zeros_like(s)),)

    f.defvjp(fwd, bwd)
    return f(x)


def broadcast(x, root_rank, name=None):
    """root_rank's `x` on every rank. Differentiable: the cotangent is the sum of every rank's
    cotangent on the root and zero elsewhere."""
    return _broadcast(_WORLD, x, root_rank, name)


def _broadcast_parameters(grp, tree, root_rank, name):
    root = _check_root(grp, root_rank)
    _args.check_name(name)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    idx = [i for i, v in enumerate(leaves) if isinstance(v, (jax.Array, _np.ndarray, _np.generic))]
    if not idx:
        return tree
    arrays = [_check(leaves[i], "broadcast_parameters", "leaf %d" % i) for i in idx]
    grp.attrs()  # a rank outside the set fails here, before anything is compiled
    out = _broadcast_tree(tuple(arrays), root, name, grp)
    for i, v in zip(idx, out):
        leaves[i] = v
    return jax.tree_util.tree_unflatten(treedef, leaves)


def broadcast_parameters(tree, root_rank=0, name=None):
    """Every array of a pytree (parameters, optimizer state) set to root_rank's, in one jitted
    program. Returns the same structure; non-array leaves are left alone. With `name`, leaf i is
    broadcast under the name "<name>.<i>"."""
    return _broadcast_parameters(_WORLD, tree, root_rank, name)


def _broadcast_tree_fn(arrays, root, name, grp):
    return [_broadcast_raw(a, root, None if name is None else "%s.%d" % (name, i),
                           "leaf %d of the pytree" % i, grp)
            for i, a in enumerate(arrays)]


_broadcast_tree = jax.jit(_broadcast_tree_fn, static_argnums=(1, 2, 3))


# ---- allgather, alltoall: static shapes inside jit, ragged outside ----
def _allgather(grp, x, name):
    x = _check(x, "allgather", name)
    if x.ndim == 0:
        raise ValueError("conflux.jax.allgather of %s: needs at least one dimension"
                         % _label(x, name))
    attrs = _name_attrs(name, _label(x, name)) + grp.attrs()
    if not _is_tracer(x):
        # The NumPy path, after every JAX collective in flight finished (so the engine sees
        # the same order on every rank).
        jax.effects_barrier()
        return jnp.asarray(grp.numpy().allgather(_np.asarray(x), name=name))
    out = ShapedArray((x.shape[0] * grp.size(),) + tuple(x.shape[1:]), x.dtype)
    return _jax_ffi.bind("allgather", [x], [out], attrs)[0]


def allgather(x, name=None):
    """Every rank's `x` concatenated along dim 0. Inside jit every rank must contribute the same
    dim 0 (the result has size() times it); outside jit dim 0 may differ by rank."""
    return _allgather(_WORLD, x, name)


def _alltoall(grp, x, splits, name, return_splits):
    x = _check(x, "alltoall", name)
    n = grp.size()
    if x.ndim == 0:
        raise ValueError("conflux.jax.alltoall of %s: needs at least one dimension"
                         % _label(x, name))
    attrs = _name_attrs(name, _label(x, name)) + grp.attrs()
    if not _is_tracer(x) and splits is not None:
        jax.effects_barrier()
        out, received = grp.numpy().alltoall(_np.asarray(x), splits=[int(s) for s in splits],
                                             name=name)
        out = jnp.asarray(out)
        return (out, _np.asarray(received)) if return_splits else out
    if splits is not None and len(set(int(s) for s in splits)) > 1:
        raise ValueError("conflux.jax.alltoall of %s: unequal splits need static shapes that "
                         "differ by rank; call it outside jit" % _label(x, name))
    if x.shape[0] % n:
        raise ValueError("conflux.jax.alltoall of %s: dim 0 (%d) does not divide by size() (%d)"
                         % (_label(x, name), x.shape[0], n))
    out = _jax_ffi.bind("alltoall", [x], [_aval(x)], attrs)[0]
    if return_splits:
        return out, _np.full(n, x.shape[0] // n, dtype=_np.int64)
    return out


def alltoall(x, splits=None, name=None, return_splits=False):
    """Sends splits[j] rows of `x` (dim 0) to rank j and returns the rows received, in rank
    order (with return_splits=True, also the rows received from each rank, a numpy array).
    Inside jit the splits are equal (dim 0 divisible by size(); `splits` must be None or equal);
    outside jit any splits (the received rows differ by rank)."""
    return _alltoall(_WORLD, x, splits, name, return_splits)


def _reducescatter(grp, x, op, name, prescale_factor, postscale_factor):
    op = _args.check_op(op)
    x = _check(x, "reducescatter", name)
    if x.ndim == 0:
        raise ValueError("conflux.jax.reducescatter of %s: needs at least one dimension"
                         % _label(x, name))
    attrs = (("op", op), ("prescale", _args.check_scale(prescale_factor, "prescale_factor")),
             ("postscale", _args.check_scale(postscale_factor, "postscale_factor"))) \
        + _name_attrs(name, _label(x, name)) + grp.attrs()
    n, r = grp.size(), grp.rank()
    rows = x.shape[0] // n + (1 if r < x.shape[0] % n else 0)
    out = ShapedArray((rows,) + tuple(x.shape[1:]), x.dtype)
    return _jax_ffi.bind("reducescatter", [x], [out], attrs)[0]


def reducescatter(x, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """The reduction of `x` over ranks, of which this rank keeps its block of dim 0: with d0 rows
    and n ranks the first d0 % n ranks get d0 // n + 1 rows, the others d0 // n."""
    return _reducescatter(_WORLD, x, op, name, prescale_factor, postscale_factor)


def _barrier(grp):
    _jax_ffi.bind("barrier", [], [], grp.attrs())
    jax.effects_barrier()


def barrier():
    """Returns once every rank reached it (in program order with the other collectives)."""
    _barrier(_WORLD)


# ---- process sets ----
_set_numbers = __import__("itertools").count(1)  # never reused: a stale program finds no set


class ProcessSet(_process_sets.ProcessSet):
    """conflux.ProcessSet for jax.Arrays: conflux.jax's collectives over the job's ranks `ranks`,
    eagerly and inside jit, with their gradients and vmap rules; ranks, root ranks and sizes are
    those within the set. Collective to create, on every rank with the same ranks (a rank outside
    gets a set whose included() is False and whose collectives raise ValueError); free() on every
    rank ends it (a compiled program that still runs its collectives then fails saying so).

        evens = cfx.ProcessSet([0, 2])
        if evens.included():
            g = jax.jit(lambda t: evens.grouped_allreduce(t))(grads)
        tx = cfx.DistributedOptimizer(optax.sgd(0.1), process_set=evens)

    Functions: allreduce, grouped_allreduce, allgather, broadcast, broadcast_parameters,
    alltoall, reducescatter, barrier, with conflux.jax's parameters."""

    def _collectives(self, submit):
        subset = self._subset
        self._number = next(_set_numbers)
        if subset.included():
            _jax_ffi.follow_context()
            _jax_ffi.set_subset(self._number, subset.ctx.address)
        numpy_ns = _process_sets.collectives(_numpy.ADAPTER, _numpy.DOCS, submit, "conflux")
        what = "conflux.jax.ProcessSet(%s)" % (subset.ranks,)

        def check():
            subset.context()   # ValueError outside the set or once freed, as conflux's sets
            _jax_ffi.follow_context()

        grp = _Group(self._number, subset.rank, subset.size,
                     lambda: __import__("types").SimpleNamespace(**numpy_ns), what, check)
        self._group = grp
        return {
            "allreduce": lambda x, op=Average, name=None, prescale_factor=1.0,
            postscale_factor=1.0, compression=None: _allreduce(
                grp, x, op, name, prescale_factor, postscale_factor, compression),
            "grouped_allreduce": lambda tree, op=Average, name=None, prescale_factor=1.0,
            postscale_factor=1.0, compression=None: _grouped_allreduce(
                grp, tree, op, name, prescale_factor, postscale_factor, compression),
            "allgather": lambda x, name=None: _allgather(grp, x, name),
            "broadcast": lambda x, root_rank, name=None: _broadcast(grp, x, root_rank, name),
            "broadcast_parameters": lambda tree, root_rank=0, name=None: _broadcast_parameters(
                grp, tree, root_rank, name),
            "alltoall": lambda x, splits=None, name=None, return_splits=False: _alltoall(
                grp, x, splits, name, return_splits),
            "reducescatter": lambda x, op=Average, name=None, prescale_factor=1.0,
            postscale_factor=1.0: _reducescatter(grp, x, op, name, prescale_factor,
                                                 postscale_factor),
            "barrier": lambda: _barrier(grp),
        }

    def free(self):
        """Ends the set on this rank (every rank calls it), once the JAX collectives in flight
        finished. Idempotent."""
        if self.included():
            jax.effects_barrier()
        _jax_ffi.set_subset(self._number, 0)
        super().free()


def _group_of(process_set):
    if process_set is None:
        return _WORLD
    if not isinstance(process_set, ProcessSet):
        raise TypeError("process_set must be a conflux.jax.ProcessSet, not %s"
                        % type(process_set).__name__)
    return process_set._group


# ---- optax ----
def allreduce_gradients(op=Average, compression=None, prescale_factor=1.0,
                        postscale_factor=1.0, name=None, process_set=None):
    """An optax GradientTransformation that replaces the updates (gradients) by their allreduce
    over ranks (or over a conflux.jax.ProcessSet's), the whole pytree in one grouped submission.
    Chain it before the optimizer: optax.chain(allreduce_gradients(), optax.adam(1e-3))
    (DistributedOptimizer does that)."""
    import optax
    op = _args.check_op(op)
    _args.check_compression(compression)
    grp = _group_of(process_set)

    def init_fn(params):
        del params
        return optax.EmptyState()

    def update_fn(updates, state, params=None):
        del params
        return _grouped_allreduce(grp, updates, op, name, prescale_factor, postscale_factor,
                                  compression), state

    return optax.GradientTransformation(init_fn, update_fn)


def DistributedOptimizer(tx, op=Average, compression=None, prescale_factor=1.0,
                         postscale_factor=1.0, name=None, process_set=None):
    """`tx` applied to the gradients averaged over ranks (op; over a conflux.jax.ProcessSet's
    ranks with process_set=), as Horovod's DistributedOptimizer:
    optax.chain(allreduce_gradients(...), tx)."""
    import optax
    return optax.chain(allreduce_gradients(op=op, compression=compression,
                                           prescale_factor=prescale_factor,
                                           postscale_factor=postscale_factor, name=name,
                                           process_set=process_set), tx)


# ---- errors: JAX's runtime error of a failed collective as the engine's error class ----
def _status_classes():
    from . import _capi
    return {_capi.cfx_status_name(i + 1): cls for i, cls in enumerate(_core.STATUS_ERRORS)}


def engine_error(exc):
    """The conflux error (PeerLostError, MismatchError, ...) that a JAX runtime error of a failed
    conflux.jax collective carries, or None for any other exception. A collective that fails
    inside XLA surfaces as jax.errors.JaxRuntimeError whose message names the op, the array and
    the status ("conflux.jax.allreduce of 'w': the collective failed: [PEER_LOST] ...")."""
    import re
    if isinstance(exc, ConfluxError):
        return exc
    m = re.search(r"conflux\.jax\.\w+.*?failed: \[([A-Z_]+)\]", str(exc))
    if m is None:
        return None
    cls = _status_classes().get(m.group(1))
    return cls(str(exc)) if cls is not None else None


# ---- elastic training (docs/elastic.md) ----
from . import elastic as _elastic  # noqa: E402


class JaxState(_elastic.ObjectState):
    """Elastic training state of a JAX job: pytrees of arrays (parameters, optimizer state) and
    plain attributes, e.g. JaxState(params=params, opt_state=opt_state, epoch=0). commit() saves
    it; after a lost worker run() restores the last commit; after every new world the pytrees
    are broadcast from the member with the newest commit (broadcast_parameters, array by array,
    under names of the membership round), the other attributes pickled."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)

    def save(self):
        # JAX arrays are immutable: keeping the references is the copy (deepcopy for the rest).
        # Waited for first: a step whose collective failed (dispatched asynchronously) raises
        # here, inside run()'s loop, and the last good commit stays the one to restore.
        jax.block_until_ready([getattr(self, attr) for attr in self._saved_state
                               if _has_arrays(getattr(self, attr))])
        saved = {}
        for attr in self._saved_state:
            value = getattr(self, attr)
            saved[attr] = value if _has_arrays(value) else __import__("copy").deepcopy(value)
        self._saved_state = saved

    def _sync_from(self, root):
        self.save()
        trees = {k: v for k, v in self._saved_state.items() if _has_arrays(v)}
        rest = {k: v for k, v in self._saved_state.items() if k not in trees}
        for k in sorted(trees):
            trees[k] = broadcast_parameters(trees[k], root, name=_elastic._name("jax." + k))
        if rest:
            rest = self._bcast_object(rest, root, name="object_state")
        self._saved_state = {k: trees[k] if k in trees else rest[k] for k in self._saved_state}
        self._set_attrs()


def _has_arrays(value):
    return any(isinstance(v, (jax.Array, _np.ndarray)) for v in jax.tree_util.tree_leaves(value))


def run(func):
    """conflux.elastic.run for JAX: the same retry loop, with a failed conflux.jax collective's
    JAX runtime error turned back into the engine's error (PeerLostError, ...) so that a lost
    worker restores the last commit and goes on in the new world."""
    import functools

    @functools.wraps(func)
    def translated(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except Exception as e:  # noqa: BLE001  (re-raised as it was unless it carries a status)
            err = engine_error(e)
            if err is None or err is e:
                raise
            raise err from e

    return _elastic.run(translated)
